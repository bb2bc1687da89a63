"""Shared helpers for the te-autodiff tests: build-and-run wrappers and numeric references."""
import contextlib
import signal
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

import te_autodiff as te


@pytest.fixture
def rng(request):
    """A generator seeded from the test's own id (parameters included): each
    test draws the same data whichever tests ran before it, in any order."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def run(inputs, outputs, arrays):
    """Build ``outputs`` over the placeholders ``inputs``, run on ``arrays``; always a list."""
    res = te.build(list(inputs), list(outputs))(*arrays)
    return list(res) if isinstance(res, tuple) else [res]


def build_grad(out, inputs, values, wrt=None, head=None, naive=True):
    """Forward value and gradients of ``out`` from one kernel.

    ``wrt`` (default: ``inputs``) are the tensors differentiated, ``head`` a
    numpy array of ``out``'s shape or None.  Returns a namespace with ``fwd``,
    ``grads`` (default ``te.gradient``) and ``naive`` (``optimize=False``,
    when ``naive`` is true) as lists of arrays.
    """
    wrt = list(inputs) if wrt is None else list(wrt)
    H = te.placeholder(out.shape, dtype=out.dtype, name="H") if head is not None else None
    grads = te.gradient(out, wrt, head=H)
    slow = te.gradient(out, wrt, head=H, optimize=False) if naive else []
    ins = list(inputs) + ([H] if H is not None else [])
    arrays = [np.asarray(v, dtype=t.dtype) for v, t in zip(values, inputs)]
    arrays += [np.asarray(head, dtype=out.dtype)] if H is not None else []
    res = run(ins, [out] + grads + slow, arrays)
    n = len(wrt)
    return SimpleNamespace(fwd=res[0], grads=res[1:1 + n], naive=res[1 + n:] if naive else None)


def numeric_vjp(f, values, head, eps=1e-6):
    """Central differences of ``sum(f(*values) * head)`` wrt each array of ``values`` (float64)."""
    values = [np.array(v, dtype=np.float64) for v in values]
    out = []
    for v in values:
        g = np.zeros_like(v)
        flat, gflat = v.reshape(-1), g.reshape(-1)
        for n in range(flat.size):
            keep = flat[n]
            flat[n] = keep + eps
            up = np.sum(f(*values) * head)
            flat[n] = keep - eps
            down = np.sum(f(*values) * head)
            flat[n] = keep
            gflat[n] = (up - down) / (2 * eps)
        out.append(g)
    return out


def assert_close(actual, expected, rtol=1e-6, atol=1e-9, what=""):
    """``np.testing.assert_allclose`` over two lists (or two arrays)."""
    if not isinstance(actual, (list, tuple)):
        actual, expected = [actual], [expected]
    assert len(actual) == len(expected)
    for n, (a, e) in enumerate(zip(actual, expected)):
        np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(e, dtype=np.float64),
                                   rtol=rtol, atol=atol, err_msg=f"{what} [{n}]")


@contextlib.contextmanager
def time_limit(seconds):
    """Raise ``TimeoutError`` in the body after ``seconds`` (guards tests of calls that may hang)."""
    def expire(signum, frame):
        raise TimeoutError(f"took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def conv2d(N=1, C=4, F=4, size=12, K=3, stride=1, dilation=1, pad=1, dtype="float32"):
    """NCHW conv2d with zero padding (a guard), stride and dilation: ``(X, W), Y``."""
    X = te.placeholder((N, C, size, size), dtype=dtype, name="X")
    W = te.placeholder((F, C, K, K), dtype=dtype, name="W")
    out = (size + 2 * pad - dilation * (K - 1) - 1) // stride + 1
    c, ky, kx = te.reduce_axis(C, "c"), te.reduce_axis(K, "ky"), te.reduce_axis(K, "kx")

    def body(n, f, y, x):
        iy = y * stride + ky * dilation - pad
        ix = x * stride + kx * dilation - pad
        inside = te.all(iy >= 0, iy < size, ix >= 0, ix < size)
        return te.sum(te.if_then_else(inside, X[n, c, iy, ix], 0.0) * W[f, c, ky, kx], axis=[c, ky, kx])

    return (X, W), te.compute((N, F, out, out), body, name="Y")


def cross_entropy(N, C):
    """Mean softmax cross-entropy of ``N`` rows of ``C`` logits against int
    labels, logsumexp shifted by each row's maximum: ``(Z, L), loss``."""
    Z, L = te.placeholder((N, C), "float32", "Z"), te.placeholder((N,), "int32", "L")
    c1, c2, r = te.reduce_axis(C, "c"), te.reduce_axis(C, "c"), te.reduce_axis(N, "r")
    m = te.compute((N,), lambda i: te.max(Z[i, c1], axis=c1), name="m")
    lse = te.compute((N,), lambda i: m[i] + te.log(te.sum(te.exp(Z[i, c2] - m[i]), axis=c2)), name="lse")
    return (Z, L), te.compute((1,), lambda _: te.sum(lse[r] - Z[r, L[r]], axis=r) / float(N), name="loss")
