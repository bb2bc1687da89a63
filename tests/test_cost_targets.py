"""The issue's cost targets for zero elimination, checked with exact ``te.cost`` counts.

``iterations`` is the exact number of innermost loop-body executions of the
lowered program, so every bound here is deterministic.  Forward cost is
``te.cost(inputs, [output])``, gradient cost ``te.cost(inputs + [H],
te.gradient(output, inputs, head=H))``, and a hand-written VJP is the same
computation written directly in TE, as a person would.

Run ``python tests/test_cost_targets.py`` to print the measured table
(naive = ``optimize=False``, the literal Jacobian-composition sum).
"""
from __future__ import annotations

import time

import numpy as np
import pytest

import te_autodiff as te
from conftest import conv2d, cross_entropy


def iters(inputs, outputs) -> int:
    return te.cost(list(inputs), list(outputs))["iterations"]


def grad_cost(inputs, out, optimize=True):
    """(iterations, cost dict) of the VJP of ``out`` for ``inputs`` with a head placeholder."""
    H = te.placeholder(out.shape, dtype=out.dtype, name="H")
    grads = te.gradient(out, list(inputs), head=H, optimize=optimize)
    c = te.cost(list(inputs) + [H], grads)
    return c["iterations"], c


def nbytes(t) -> int:
    return int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize


# --------------------------------------------------------------------------- programs


def dense(n=32, m=64, p=16):
    """Y = X·Wᵀ and the hand-written VJP dX = H·W, dW = Hᵀ·X."""
    X = te.placeholder((n, m), name="X")
    W = te.placeholder((p, m), name="W")
    k = te.reduce_axis(m, "k")
    Y = te.compute((n, p), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="Y")
    H = te.placeholder((n, p), name="H")
    jj, ii = te.reduce_axis(p, "jj"), te.reduce_axis(n, "ii")
    dX = te.compute((n, m), lambda i, c: te.sum(H[i, jj] * W[jj, c], axis=jj), name="dX_hand")
    dW = te.compute((p, m), lambda j, c: te.sum(H[ii, j] * X[ii, c], axis=ii), name="dW_hand")
    return (X, W), Y, H, (dX, dW)


def maxpool(N=2, C=3, size=16):
    X = te.placeholder((N, C, size, size), name="X")
    di, dj = te.reduce_axis(2, "di"), te.reduce_axis(2, "dj")
    Y = te.compute((N, C, size // 2, size // 2),
                   lambda n, c, i, j: te.max(X[n, c, 2 * i + di, 2 * j + dj], axis=[di, dj]), name="Y")
    return (X,), Y


def log_softmax_dense(b=16, m=32, p=24):
    X = te.placeholder((b, m), name="X")
    W = te.placeholder((p, m), name="W")
    k = te.reduce_axis(m, "k")
    Z = te.compute((b, p), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="Z")
    k1, k2 = te.reduce_axis(p, "k1"), te.reduce_axis(p, "k2")
    M = te.compute((b,), lambda i: te.max(Z[i, k1], axis=k1), name="M")
    S = te.compute((b,), lambda i: te.sum(te.exp(Z[i, k2] - M[i]), axis=k2), name="S")
    L = te.compute((b, p), lambda i, j: Z[i, j] - M[i] - te.log(S[i]), name="L")
    return (X, W), L


def tanh_transpose(n):
    A = te.placeholder((n, n), name="A")
    return (A,), te.compute((n, n), lambda i, j: te.tanh(A[i, j] * A[j, i]), name="B")


def trace_like(n):
    """B[i] = Σ_k A[i,k]·A[k,i]."""
    A = te.placeholder((n, n), name="A")
    k = te.reduce_axis(n, "k")
    return (A,), te.compute((n,), lambda i: te.sum(A[i, k] * A[k, i], axis=k), name="B")


def max_product(n):
    """B[i,j] = max_k A[i,k]·A[k,j]."""
    A = te.placeholder((n, n), name="A")
    k = te.reduce_axis(n, "k")
    return (A,), te.compute((n, n), lambda i, j: te.max(A[i, k] * A[k, j], axis=k), name="B")


def strided_transpose(n):
    """B[i,j] = A[2j+1, i]."""
    A = te.placeholder((2 * n + 1, n), name="A")
    return (A,), te.compute((n, n), lambda i, j: A[2 * j + 1, i], name="B")


def stencil3(n):
    """B[i] = A[i-1] - 2·A[i] + A[i+1], zero outside."""
    A = te.placeholder((n,), name="A")

    def body(i):
        left = te.if_then_else(i >= 1, A[i - 1], 0.0)
        right = te.if_then_else(i < n - 1, A[i + 1], 0.0)
        return left - 2.0 * A[i] + right
    return (A,), te.compute((n,), body, name="B")


def stencil2d(n):
    """5-point stencil on the interior: B[i,j] = Σ of A at (i+1±1, j+1) and (i+1, j+1±1)."""
    A = te.placeholder((n + 2, n + 2), name="A")
    return (A,), te.compute((n, n), lambda i, j: A[i, j + 1] + A[i + 2, j + 1] + A[i + 1, j]
                            + A[i + 1, j + 2] - 4.0 * A[i + 1, j + 1], name="B")


def strided_window(n):
    """B[i] = Σ_{k<3} A[3i + k] (non-overlapping windows, stride = size)."""
    A = te.placeholder((3 * n,), name="A")
    k = te.reduce_axis(3, "k")
    return (A,), te.compute((n,), lambda i: te.sum(A[3 * i + k], axis=k), name="B")


def flatten(n):
    """B[t] = A[t // 8, t % 8]."""
    A = te.placeholder((n, 8), name="A")
    return (A,), te.compute((8 * n,), lambda t: A[t // 8, t % 8], name="B")


def unflatten(n):
    """B[i, j] = A[8i + j]."""
    A = te.placeholder((8 * n,), name="A")
    return (A,), te.compute((n, 8), lambda i, j: A[i * 8 + j], name="B")


# --------------------------------------------------------------------------- targets


def test_dense_vjp_matches_hand_written():
    (X, W), Y, H, hand = dense()
    grads = te.gradient(Y, [X, W], head=H)
    got = iters([X, W, H], grads)
    want = iters([X, W, H], hand)
    assert got <= 1.1 * want, f"dense VJP: {got} iterations, hand-written {want}"
    for g, hw in zip(grads, hand):   # each adjoint on its own, too
        assert iters([X, W, H], [g]) <= 1.1 * iters([X, W, H], [hw])


CONV_CASES = [  # (stride, dilation, pad)
    (1, 1, 1), (2, 1, 1), (3, 1, 0), (1, 2, 2), (2, 2, 2), (3, 3, 1), (2, 3, 3),
]


@pytest.mark.parametrize("stride,dilation,pad", CONV_CASES)
def test_conv2d_vjp_within_2_3x_forward(stride, dilation, pad):
    (X, W), Y = conv2d(stride=stride, dilation=dilation, pad=pad)
    fwd = iters([X, W], [Y])
    got, _ = grad_cost([X, W], Y)
    assert got <= 2.3 * fwd, f"conv s={stride} d={dilation} p={pad}: VJP {got} vs forward {fwd}"


def test_maxpool_vjp_within_3x_forward():
    (X,), Y = maxpool()
    fwd = iters([X], [Y])
    got, _ = grad_cost([X], Y)
    assert got <= 3 * fwd, f"maxpool: VJP {got} vs forward {fwd}"


def test_log_softmax_dense_vjp_within_3x_forward():
    (X, W), L = log_softmax_dense()
    fwd = iters([X, W], [L])
    got, _ = grad_cost([X, W], L)
    assert got <= 3 * fwd, f"log_softmax(dense): VJP {got} vs forward {fwd}"


def test_softmax_cross_entropy_gradient_passes_over_the_logits_three_times():
    """The shift's two adjoints cancel (``shift_invariance.py``): no argmax
    pass for the max's derivative, and the forward's denominator is read
    back: loss and gradient pass over the logits three times (max, Σ exp,
    dZ)."""
    N, C = 16, 40
    (Z, L), loss = cross_entropy(N, C)
    (dZ,) = te.gradient(loss, [Z])
    assert iters([Z, L], [loss, dZ]) <= 3 * N * C + 4 * N


def _growth(make, sizes, degree, const):
    """Gradient iterations at each size; checks ≤ const·n^degree and the growth ratio."""
    counts = []
    for n in sizes:
        ins, out = make(n)
        got, _ = grad_cost(ins, out)
        assert got <= const * n ** degree, f"{make.__name__}({n}): {got} > {const}·n^{degree}"
        counts.append(got)
    ratio = counts[1] / counts[0]
    bound = (sizes[1] / sizes[0]) ** degree * 1.125
    assert ratio <= bound, f"{make.__name__}: iterations {counts} grow by {ratio:.2f} > {bound:.2f}"
    return counts


def test_tanh_of_transpose_product_gradient_is_quadratic():
    _growth(tanh_transpose, (16, 32), 2, 4)


def test_sum_of_transpose_product_gradient_is_quadratic():
    _growth(trace_like, (16, 32), 2, 4)


def test_max_product_gradient_is_cubic():
    _growth(max_product, (8, 16), 3, 4)


LINEAR_CASES = [strided_transpose, stencil3, stencil2d, strided_window, flatten, unflatten]


@pytest.mark.parametrize("make", LINEAR_CASES, ids=lambda f: f.__name__)
def test_copies_and_stencils_gradient_is_linear(make):
    for n in (16, 32):
        ins, out = make(n)
        got, c = grad_cost(ins, out)
        size = max(int(np.prod(out.shape)), max(int(np.prod(x.shape)) for x in ins))
        assert got <= 2 * size, f"{make.__name__}({n}): {got} iterations for {size} elements"
        largest = max([nbytes(out)] + [nbytes(x) for x in ins])
        assert c["temp_bytes"] <= largest, (
            f"{make.__name__}({n}): {c['temp_bytes']} temporary bytes > largest tensor {largest}")


def test_copies_and_stencils_gradient_has_no_reduction_left():
    """The cost above follows from the formula: every summation was solved away."""
    for make in (strided_transpose, stencil3, stencil2d, strided_window, flatten):
        ins, out = make(8)
        text = te.pretty(te.gradient(out, list(ins)))
        assert "sum[" not in text, f"{make.__name__}: a reduction is left:\n{text}"


def test_gradient_of_64_channel_conv2d_is_fast():
    (X, W), Y = conv2d(N=1, C=64, F=64, size=16, K=3, stride=1, dilation=1, pad=1)
    H = te.placeholder(Y.shape, name="H")
    t0 = time.perf_counter()
    grads = te.gradient(Y, [X, W], head=H)
    elapsed = time.perf_counter() - t0
    assert [g.shape for g in grads] == [X.shape, W.shape]
    assert elapsed < 1.0, f"te.gradient of a 64-channel conv2d took {elapsed:.2f} s"


# --------------------------------------------------------------------------- report


def _table():
    rows = []

    def attempt(fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - the table reports failures
            return f"{type(e).__name__}"

    def row(name, ins, out, hand=None, naive=True):
        fwd = iters(ins, [out])
        opt = attempt(lambda: grad_cost(ins, out))
        opt, tb = (opt, "-") if isinstance(opt, str) else (opt[0], opt[1]["temp_bytes"])
        nv = attempt(lambda: grad_cost(ins, out, optimize=False)[0]) if naive else "-"
        hw = "-"
        if hand is not None:
            H, hand_outs = hand
            hw = iters(list(ins) + [H], hand_outs)
        rows.append((name, fwd, nv, opt, hw, tb))

    (X, W), Y, H, hand = dense()
    row("dense 32x64 @ 16x64", (X, W), Y, (H, hand))
    for s, d, p in CONV_CASES:
        ins, Y = conv2d(stride=s, dilation=d, pad=p)
        row(f"conv2d 1x4x12x12 F4 K3 s{s} d{d} p{p}", ins, Y)
    row("maxpool 2x3x16x16 2x2/2", *maxpool())
    row("log_softmax(dense) 16x32 @ 24x32", *log_softmax_dense())
    for n in (16, 32):
        row(f"tanh(A[i,j]A[j,i]) n={n}", *tanh_transpose(n))
        row(f"sum_k A[i,k]A[k,i] n={n}", *trace_like(n))
    for n in (8, 16):
        row(f"max_k A[i,k]A[k,j] n={n}", *max_product(n))
    for make in LINEAR_CASES:
        for n in (16, 32):
            row(f"{make.__name__} n={n}", *make(n))
    print(f"{'program':40s} {'forward':>10s} {'naive':>12s} {'optimized':>10s} {'hand':>8s} {'temp_B':>7s}")
    for name, fwd, nv, opt, hw, tb in rows:
        print(f"{name:40s} {fwd:>10} {nv:>12} {opt:>10} {hw:>8} {tb:>7}")


if __name__ == "__main__":
    _table()
