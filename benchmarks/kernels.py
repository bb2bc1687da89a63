"""The fifteen benchmark kernels, each defined once as data.

Every kernel computes a scalar loss and its gradients with respect to the
inputs named in ``wrt``.  A kernel with an output tensor (``head=True``) uses
``loss = Σ(output · H)`` for a fixed random ``H``, so its gradients are the
vector-Jacobian product with head ``H``; the others (softmax cross-entropy,
the f64 seed program, the MLP step) define the scalar loss directly.

One :class:`Kernel` holds, for one program:

- ``names``/``shapes``: the arrays it takes, in call order: the
  differentiated inputs (``wrt``) first, then the constants (``H``, labels);
- ``make(rng)``: float64 (or integer) data; the runner casts float arrays to
  the kernel's dtype and the reference sees exactly those values in float64;
- ``numpy(*arrays) -> (loss, [grads])`` (plus the output for ``head=True``):
  forward and hand-written backward with numpy ops.  Run on float64 arrays it is the *reference*; run on the
  kernel's dtype it is the "numpy" peer;
- ``te(te, P) -> Tensor``: the te-autodiff program (``P`` maps names to
  placeholders); it returns the output tensor (``head=True``) or the
  ``(1,)``-shaped loss tensor.  The runner differentiates it with
  ``te.gradient(out, wrt, head=H)`` (or ``head=None`` for a loss);
- ``jax(m)``/``torch(m)``: factories returning ``loss(*arrays)`` written with
  the framework's ops (``m`` holds ``np``: ``jax.numpy``/``torch``, ``nn``:
  ``jax.nn``/``torch.nn.functional``, ``lax``: ``jax.lax``);
- ``flops`` (forward + backward GEMM flops, multiply-add = 2) or ``bytes``
  (the least memory traffic a loss + gradients pass needs); ``limit`` says
  which machine limit the kernel is compared with: ``"fma"`` the FMA peak
  for its dtype, ``"bandwidth"`` the copy bandwidth;
- ``products``: the stages of the te program as lowered that hold those
  flops (their multiply-adds, ``te.cost``'s ``stage_iterations``, are the
  flops above: a test checks it), for the products' own rate
  (``stage_rates.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Kernel:
    id: int
    key: str
    title: str
    shapes: dict
    wrt: tuple
    make: Callable
    numpy: Callable
    te: Callable
    jax: Callable
    torch: Callable
    dtype: str = "float32"
    head: bool = True              # loss = Σ(output · H) with H the last float input
    flops: float = 0.0             # GEMM flops of forward + backward
    bytes: float = 0.0             # minimal bytes moved by loss + gradients
    limit: str = ""                # "fma", "bandwidth" or "" (none)
    int_inputs: tuple = field(default=())
    products: tuple = ()           # lowered stages holding the GEMM flops

    @property
    def names(self) -> tuple:
        return tuple(self.shapes)

    def te_program(self, te) -> tuple:
        """``(placeholders, [loss, *gradients])``: the te-autodiff program the
        runner builds (``loss = Σ(out·H)`` and its VJP for ``head=True``)."""
        P = {n: te.placeholder(self.shapes[n], "int32" if n in self.int_inputs else self.dtype, n)
             for n in self.names}
        out = self.te(te, P)
        wrt = [P[n] for n in self.wrt]
        if self.head:
            H = P["H"]
            axes = [te.reduce_axis(s, f"r{d}") for d, s in enumerate(out.shape)]
            loss = te.compute((1,), lambda _: te.sum(out[tuple(axes)] * H[tuple(axes)], axis=axes), name="loss")
            grads = te.gradient(out, wrt, head=H)
        else:
            loss, grads = out, te.gradient(out, wrt)
        return [P[n] for n in self.names], [loss, *grads]

    def arrays(self, rng) -> list:
        """The kernel's inputs in call order: floats in ``dtype``, integers as int32."""
        data = self.make(rng)
        out = []
        for name in self.names:
            a = np.asarray(data[name])
            assert a.shape == tuple(self.shapes[name]), (name, a.shape)
            out.append(a.astype(np.int32) if name in self.int_inputs else a.astype(self.dtype))
        return out

    def reference(self, arrays) -> tuple:
        """float64 ``(loss, grads, loss_scale)`` from the hand-written numpy code on float64 copies.

        ``loss_scale`` is what the loss error is measured against: ``|loss|``,
        or for ``loss = Σ(out·H)`` the 2-norm of the terms ``out·H`` when that
        is larger (the terms cancel; a float32 sum is judged by their size)."""
        res = self.numpy(*[a if a.dtype.kind in "iu" else a.astype(np.float64) for a in arrays])
        loss, grads = res[0], res[1]
        scale = abs(float(loss))
        if self.head:
            H = arrays[self.names.index("H")].astype(np.float64)
            scale = max(scale, float(np.sqrt(np.sum((res[2] * H) ** 2))))
        return loss, grads, scale


def _normal(rng, shape, scale=1.0):
    return rng.standard_normal(shape) * scale


# ---------------------------------------------------------------- 1. matmul 256³


def _matmul_np(A, B, H):
    C = A @ B
    return np.vdot(C, H), [H @ B.T, A.T @ H], C


def _matmul_te(te, P):
    A, B = P["A"], P["B"]
    n, m = A.shape
    k = te.reduce_axis(m, "k")
    return te.compute((n, B.shape[1]), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")


def matmul_kernel(n: int = 256, dtype: str = "float32") -> Kernel:
    """Kernel 1 at ``n``³ in ``dtype`` (the size sweep varies both)."""
    return Kernel(
        1, "matmul", f"matmul {n}³", dict(A=(n, n), B=(n, n), H=(n, n)), ("A", "B"),
        make=lambda r: dict(A=_normal(r, (n, n)), B=_normal(r, (n, n)), H=_normal(r, (n, n))),
        numpy=_matmul_np, te=_matmul_te,
        jax=lambda m: lambda A, B, H: m.np.sum((A @ B) * H),
        torch=lambda m: lambda A, B, H: ((A @ B) * H).sum(),
        dtype=dtype, flops=3 * 2 * n ** 3, limit="fma", products=("C", "dA", "dB"))


# ---------------------------------------------------------------- 2. dense + bias + relu


def _dense_np(X, W, b, H):
    Z = X @ W.T + b
    Y = np.maximum(Z, 0)
    G = H * (Z > 0)
    return np.vdot(Y, H), [G @ W, G.T @ X, G.sum(0)], Y


def _dense_te(te, P):
    X, W, b = P["X"], P["W"], P["b"]
    (n, d), m = X.shape, W.shape[0]
    k = te.reduce_axis(d, "k")
    return te.compute((n, m), lambda i, j: te.maximum(te.sum(X[i, k] * W[j, k], axis=k) + b[j], 0.0), name="Y")


DN, DI, DO = 64, 512, 256
DENSE = Kernel(
    2, "dense", "dense+bias+relu 64×512→256", dict(X=(DN, DI), W=(DO, DI), b=(DO,), H=(DN, DO)), ("X", "W", "b"),
    make=lambda r: dict(X=_normal(r, (DN, DI)), W=_normal(r, (DO, DI), DI ** -0.5), b=_normal(r, DO, 0.1),
                        H=_normal(r, (DN, DO))),
    numpy=_dense_np, te=_dense_te,
    jax=lambda m: lambda X, W, b, H: m.np.sum(m.nn.relu(X @ W.T + b) * H),
    torch=lambda m: lambda X, W, b, H: (m.nn.relu(m.nn.linear(X, W, b)) * H).sum(),
    flops=3 * 2 * DN * DI * DO, limit="fma")


# ---------------------------------------------------------------- 3. conv2d NCHW, pad 1


def _im2col(xp, K, OH, OW):
    """(C·K·K, N·OH·OW) columns of the padded input ``xp``."""
    N, C = xp.shape[:2]
    cols = np.empty((C, K, K, N, OH, OW), xp.dtype)
    for kh in range(K):
        for kw in range(K):
            cols[:, kh, kw] = xp[:, :, kh:kh + OH, kw:kw + OW].transpose(1, 0, 2, 3)
    return cols.reshape(C * K * K, N * OH * OW)


def _conv_np(X, Wt, H):
    N, C, Hh, Ww = X.shape
    F, _, K, _ = Wt.shape
    OH, OW = H.shape[2:]
    xp = np.pad(X, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = _im2col(xp, K, OH, OW)
    W2 = Wt.reshape(F, C * K * K)
    out = (W2 @ cols).reshape(F, N, OH, OW)
    Hf = np.ascontiguousarray(H.transpose(1, 0, 2, 3)).reshape(F, N * OH * OW)
    loss = np.vdot(out, Hf.reshape(F, N, OH, OW))
    dW = (Hf @ cols.T).reshape(Wt.shape)
    dcols = (W2.T @ Hf).reshape(C, K, K, N, OH, OW)
    dxp = np.zeros((C, N) + xp.shape[2:], X.dtype)
    for kh in range(K):
        for kw in range(K):
            dxp[:, :, kh:kh + OH, kw:kw + OW] += dcols[:, kh, kw]
    return loss, [dxp[:, :, 1:1 + Hh, 1:1 + Ww].transpose(1, 0, 2, 3), dW], out.transpose(1, 0, 2, 3)


def padded_te(te, X, pad: int):
    """The NCHW tensor ``X`` with ``pad`` zeros around each image."""
    N, C, H, W = X.shape
    return te.compute((N, C, H + 2 * pad, W + 2 * pad),
                      lambda n, c, h, w: te.if_then_else(te.all(h >= pad, h < H + pad, w >= pad, w < W + pad),
                                                         X[n, c, h - pad, w - pad], 0.0), name="Xp")


def _conv_te(te, P):
    X, Wt = P["X"], P["Wt"]
    N, C, H, W = X.shape
    F, _, K, _ = Wt.shape
    Xp = padded_te(te, X, 1)
    c, kh, kw = te.reduce_axis(C, "c"), te.reduce_axis(K, "kh"), te.reduce_axis(K, "kw")
    return te.compute((N, F, H, W), lambda n, f, y, x: te.sum(Xp[n, c, y + kh, x + kw] * Wt[f, c, kh, kw],
                                                              axis=[c, kh, kw]), name="conv")


def _conv_jax(m):
    def loss(X, Wt, H):
        y = m.lax.conv_general_dilated(X, Wt, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return m.np.sum(y * H)
    return loss


def conv_kernel(n: int = 8, c: int = 32, h: int = 28) -> Kernel:
    """Kernel 3 on ``n``×``c``×``h``×``h`` data with ``c`` 3×3 filters."""
    k = 3
    return Kernel(
        3, "conv2d", f"conv2d {n}×{c}×{h}×{h} ∗ {c}×{c}×3×3, pad 1",
        dict(X=(n, c, h, h), Wt=(c, c, k, k), H=(n, c, h, h)), ("X", "Wt"),
        make=lambda r: dict(X=_normal(r, (n, c, h, h)), Wt=_normal(r, (c, c, k, k), (c * k * k) ** -0.5),
                            H=_normal(r, (n, c, h, h))),
        numpy=_conv_np, te=_conv_te, jax=_conv_jax,
        torch=lambda m: lambda X, Wt, H: (m.nn.conv2d(X, Wt, padding=1) * H).sum(),
        flops=3 * 2 * n * c * h * h * c * k * k, limit="fma", products=("conv", "dXp", "dWt"))


# ---------------------------------------------------------------- 4. maxpool 2×2 / 2


PN, PC, PH = 8, 32, 28
PO = PH // 2


def _maxpool_np(X, H):
    N, C, Hh, Ww = X.shape
    OH, OW = Hh // 2, Ww // 2
    win = X.reshape(N, C, OH, 2, OW, 2).transpose(0, 1, 2, 4, 3, 5).reshape(N, C, OH, OW, 4)
    first = win.argmax(-1)[..., None]                    # the first maximum in window order gets the head
    out = np.take_along_axis(win, first, -1)[..., 0]
    dwin = np.zeros_like(win)
    np.put_along_axis(dwin, first, H[..., None], -1)
    dX = dwin.reshape(N, C, OH, OW, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(X.shape)
    return np.vdot(out, H), [dX], out


def _maxpool_te(te, P):
    X = P["X"]
    N, C, Hh, W = X.shape
    kh, kw = te.reduce_axis(2, "kh"), te.reduce_axis(2, "kw")
    return te.compute((N, C, Hh // 2, W // 2),
                      lambda n, c, y, x: te.max(X[n, c, y * 2 + kh, x * 2 + kw], axis=[kh, kw]), name="pool")


def _maxpool_jax(m):
    def loss(X, H):
        y = m.lax.reduce_window(X, -m.np.inf, m.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        return m.np.sum(y * H)
    return loss


MAXPOOL = Kernel(
    4, "maxpool", "maxpool 2×2/2 on 8×32×28×28", dict(X=(PN, PC, PH, PH), H=(PN, PC, PO, PO)), ("X",),
    make=lambda r: dict(X=_normal(r, (PN, PC, PH, PH)), H=_normal(r, (PN, PC, PO, PO))),
    numpy=_maxpool_np, te=_maxpool_te, jax=_maxpool_jax,
    torch=lambda m: lambda X, H: (m.nn.max_pool2d(X, 2, 2) * H).sum(),
    bytes=4 * (2 * PN * PC * PH * PH + PN * PC * PO * PO), limit="bandwidth")


# ---------------------------------------------------------------- 5. softmax cross-entropy


def _softmax_ce_np(Z, L):
    N = Z.shape[0]
    rows = np.arange(N)
    m = Z.max(1, keepdims=True)
    e = np.exp(Z - m)
    s = e.sum(1, keepdims=True)
    loss = np.mean(m[:, 0] + np.log(s[:, 0]) - Z[rows, L])
    g = e / s
    g[rows, L] -= 1
    g /= N
    return loss, [g]


def _lse_minus_picked_te(te, z, L, name):
    """Mean over rows of logsumexp(z[i, :]) - z[i, L[i]] (max-shifted), as a (1,) tensor."""
    N, C = z.shape
    c1, c2 = te.reduce_axis(C, "c"), te.reduce_axis(C, "c")
    m = te.compute((N,), lambda i: te.max(z[i, c1], axis=c1), name=name + "_max")
    lse = te.compute((N,), lambda i: m[i] + te.log(te.sum(te.exp(z[i, c2] - m[i]), axis=c2)), name=name + "_lse")
    picked = te.compute((N,), lambda i: z[i, L[i]], name=name + "_picked")
    r = te.reduce_axis(N, "r")
    return te.compute((1,), lambda _: te.sum(lse[r] - picked[r], axis=r) / float(N), name=name)


def _softmax_ce_jax(m):
    def loss(Z, L):
        picked = m.np.take_along_axis(Z, L[:, None], axis=1)[:, 0]
        return m.np.mean(m.nn.logsumexp(Z, axis=1) - picked)
    return loss


def softmax_ce_kernel(n: int = 256, c: int = 1000) -> Kernel:
    """Kernel 5 on ``n`` rows of ``c`` classes."""
    return Kernel(
        5, "softmax_ce", f"softmax cross-entropy {n}×{c}, int labels, mean", dict(Z=(n, c), L=(n,)), ("Z",),
        make=lambda r: dict(Z=_normal(r, (n, c), 2.0), L=r.integers(0, c, n)),
        numpy=_softmax_ce_np, te=lambda te, P: _lse_minus_picked_te(te, P["Z"], P["L"], "loss"),
        jax=_softmax_ce_jax,
        torch=lambda m: lambda Z, L: m.nn.cross_entropy(Z, L),
        head=False, bytes=4 * 2 * n * c + 4 * n, limit="bandwidth", int_inputs=("L",))


# ---------------------------------------------------------------- 6. elementwise


EN = 1 << 20


def _elementwise_np(x, H):
    s = 1 / (1 + np.exp(-x))
    u = s * np.exp(-x * x)
    y = np.tanh(u)
    return np.vdot(y, H), [H * (1 - y * y) * u * ((1 - s) - 2 * x)], y


def _power_of_two(n: int) -> str:
    """``n`` as 2 with a superscript exponent when it is a power of two."""
    if n & (n - 1):
        return str(n)
    return "2" + str(n.bit_length() - 1).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))


def elementwise_kernel(n: int = EN, dtype: str = "float32") -> Kernel:
    """Kernel 6 on ``n`` values of ``dtype``."""
    return Kernel(
        6, "elementwise", f"tanh(sigmoid(x)·exp(-x²)) on {_power_of_two(n)}", dict(x=(n,), H=(n,)), ("x",),
        make=lambda r: dict(x=_normal(r, n), H=_normal(r, n)),
        numpy=_elementwise_np,
        te=lambda te, P: te.compute((n,), lambda i: te.tanh(te.sigmoid(P["x"][i]) * te.exp(-P["x"][i] * P["x"][i])),
                                    name="y"),
        jax=lambda m: lambda x, H: m.np.sum(m.np.tanh(m.nn.sigmoid(x) * m.np.exp(-x * x)) * H),
        torch=lambda m: lambda x, H: (m.np.tanh(m.np.sigmoid(x) * m.np.exp(-x * x)) * H).sum(),
        dtype=dtype, bytes=np.dtype(dtype).itemsize * 3 * n, limit="bandwidth")


# ---------------------------------------------------------------- 7. the f64 seed program


SD = 72            # uniform [0, 1) entries: (A·B)[i, j] ≈ 72 / 4 = 18


def _seed_np(A, B):
    D = A @ B - 18
    loss = -2.5 * np.sum(np.log1p(0.25 * D * D))
    G = -1.25 * D / (1 + 0.25 * D * D)
    return loss, [G @ B.T, A.T @ G]


def _seed_te(te, P):
    A, B = P["A"], P["B"]
    n = A.shape[0]
    k = te.reduce_axis(n, "k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    i, j = te.reduce_axis(n, "i"), te.reduce_axis(n, "j")
    return te.compute((1,), lambda _: -2.5 * te.sum(te.log1p(0.25 * (C[i, j] - 18.0) * (C[i, j] - 18.0)),
                                                    axis=[i, j]), name="loss")


SEED = Kernel(
    7, "seed_f64", "-2.5·Σ log1p(0.25(A·B-18)²), 72×72 f64", dict(A=(SD, SD), B=(SD, SD)), ("A", "B"),
    make=lambda r: dict(A=r.random((SD, SD)), B=r.random((SD, SD))),
    numpy=_seed_np, te=_seed_te,
    jax=lambda m: lambda A, B: -2.5 * m.np.sum(m.np.log1p(0.25 * (A @ B - 18) ** 2)),
    torch=lambda m: lambda A, B: -2.5 * m.np.log1p(0.25 * (A @ B - 18) ** 2).sum(),
    dtype="float64", head=False, flops=3 * 2 * SD ** 3, limit="fma")


# ---------------------------------------------------------------- 8. 3-point stencil


def _stencil_np(x, H):
    y = 0.25 * x[:-2] + 0.5 * x[1:-1] + 0.25 * x[2:]
    dx = np.zeros_like(x)
    dx[:-2] = 0.25 * H
    dx[1:-1] += 0.5 * H
    dx[2:] += 0.25 * H
    return np.vdot(y, H), [dx], y


def _stencil_te(te, P):
    x = P["x"]
    return te.compute((EN - 2,), lambda i: 0.25 * x[i] + 0.5 * x[i + 1] + 0.25 * x[i + 2], name="y")


STENCIL = Kernel(
    8, "stencil", "3-point 1-D stencil on 2²⁰", dict(x=(EN,), H=(EN - 2,)), ("x",),
    make=lambda r: dict(x=_normal(r, EN), H=_normal(r, EN - 2)),
    numpy=_stencil_np, te=_stencil_te,
    jax=lambda m: lambda x, H: m.np.sum((0.25 * x[:-2] + 0.5 * x[1:-1] + 0.25 * x[2:]) * H),
    torch=lambda m: lambda x, H: ((0.25 * x[:-2] + 0.5 * x[1:-1] + 0.25 * x[2:]) * H).sum(),
    bytes=4 * (3 * EN - 2), limit="bandwidth")


# ---------------------------------------------------------------- 9. strided transpose


TN = 1024


def _strided_np(A, H):
    dA = np.zeros_like(A)
    dA[1::2] = H.T
    return np.sum(A[1::2] * H.T), [dA], A[1::2].T


STRIDED = Kernel(
    9, "strided", "B[i,j] = A[2j+1, i], B 1024×1024", dict(A=(2 * TN, TN), H=(TN, TN)), ("A",),
    make=lambda r: dict(A=_normal(r, (2 * TN, TN)), H=_normal(r, (TN, TN))),
    numpy=_strided_np,
    te=lambda te, P: te.compute((TN, TN), lambda i, j: P["A"][2 * j + 1, i], name="B"),
    jax=lambda m: lambda A, H: m.np.sum(A[1::2].T * H),
    torch=lambda m: lambda A, H: (A[1::2].T * H).sum(),
    bytes=4 * (TN * TN + TN * TN + 2 * TN * TN), limit="bandwidth")


# ---------------------------------------------------------------- 10. MLP step


MI, MH, MO = 784, 512, 10


def _mlp_np(W1, b1, W2, b2, X, L):
    N = X.shape[0]
    rows = np.arange(N)
    h = np.tanh(X @ W1.T + b1)
    z = h @ W2.T + b2
    m = z.max(1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(1, keepdims=True)
    loss = np.mean(m[:, 0] + np.log(s[:, 0]) - z[rows, L])
    gz = e / s
    gz[rows, L] -= 1
    gz /= N
    gh = (gz @ W2) * (1 - h * h)
    return loss, [gh.T @ X, gh.sum(0), gz.T @ h, gz.sum(0)]


def _mlp_te(te, P):
    W1, b1, W2, b2, X, L = (P[n] for n in ("W1", "b1", "W2", "b2", "X", "L"))
    N, D = X.shape
    Hd, C = W1.shape[0], W2.shape[0]
    k1, k2 = te.reduce_axis(D, "k"), te.reduce_axis(Hd, "k")
    h = te.compute((N, Hd), lambda i, j: te.tanh(te.sum(X[i, k1] * W1[j, k1], axis=k1) + b1[j]), name="h")
    z = te.compute((N, C), lambda i, j: te.sum(h[i, k2] * W2[j, k2], axis=k2) + b2[j], name="logits")
    return _lse_minus_picked_te(te, z, L, "loss")


def _mlp_jax(m):
    def loss(W1, b1, W2, b2, X, L):
        z = m.np.tanh(X @ W1.T + b1) @ W2.T + b2
        picked = m.np.take_along_axis(z, L[:, None], axis=1)[:, 0]
        return m.np.mean(m.nn.logsumexp(z, axis=1) - picked)
    return loss


def _mlp_torch(m):
    def loss(W1, b1, W2, b2, X, L):
        return m.nn.cross_entropy(m.nn.linear(m.np.tanh(m.nn.linear(X, W1, b1)), W2, b2), L)
    return loss


def mlp_kernel(batch: int = 128) -> Kernel:
    """Kernel 10 on a batch of ``batch`` examples."""
    return Kernel(
        10, "mlp", f"MLP 784→512→10 tanh + softmax-CE, batch {batch}",
        dict(W1=(MH, MI), b1=(MH,), W2=(MO, MH), b2=(MO,), X=(batch, MI), L=(batch,)), ("W1", "b1", "W2", "b2"),
        make=lambda r: dict(W1=_normal(r, (MH, MI), MI ** -0.5), b1=_normal(r, MH, 0.1),
                            W2=_normal(r, (MO, MH), MH ** -0.5), b2=_normal(r, MO, 0.1), X=_normal(r, (batch, MI)),
                            L=r.integers(0, MO, batch)),
        numpy=_mlp_np, te=_mlp_te, jax=_mlp_jax, torch=_mlp_torch,
        head=False, flops=2 * 2 * batch * MI * MH + 3 * 2 * batch * MH * MO, limit="fma", int_inputs=("L",),
        products=("h", "logits.r1", "dh", "dW1", "dW2"))


# ---------------------------------------------------------------- 11. embedding


def _rows_add(shape, ids, values):
    """``out[ids[n]] += values[n]`` written for speed in numpy: a stable sort
    of the ids, then one ``add.reduceat`` per run of equal ids."""
    out = np.zeros(shape, values.dtype)
    order = np.argsort(ids, kind="stable")
    run_ids, starts = np.unique(ids[order], return_index=True)
    out[run_ids] = np.add.reduceat(values[order], starts, axis=0)
    return out


def _embedding_np(E, I, H):
    Y = E[I]
    return np.vdot(Y, H), [_rows_add(E.shape, I, H)], Y


EV, ED, EI = 10000, 64, 2048
EMBEDDING = Kernel(
    11, "embedding", "embedding Y[n,d] = E[I[n],d], E 10000×64, 2048 ids", dict(E=(EV, ED), I=(EI,), H=(EI, ED)),
    ("E",),
    make=lambda r: dict(E=_normal(r, (EV, ED)), I=r.integers(0, EV, EI), H=_normal(r, (EI, ED))),
    numpy=_embedding_np,
    te=lambda te, P: te.compute((EI, ED), lambda n, d: P["E"][P["I"][n], d], name="Y"),
    jax=lambda m: lambda E, I, H: m.np.sum(m.np.take(E, I, axis=0) * H),
    torch=lambda m: lambda E, I, H: (m.nn.embedding(I, E) * H).sum(),
    bytes=4 * (2 * EI * ED + EV * ED + EI), limit="bandwidth", int_inputs=("I",))


# ---------------------------------------------------------------- 12. gather along an axis


def _gather_np(X, I, H):
    A, C = X.shape
    Y = np.take_along_axis(X, I, axis=1)
    flat = (np.arange(A)[:, None] * C + I).reshape(-1)
    return np.vdot(Y, H), [_rows_add((A * C,), flat, H.reshape(-1)).reshape(A, C)], Y


GA, GC, GJ = 1024, 512, 64
GATHER = Kernel(
    12, "gather", "gather along an axis Y[i,j] = X[i, I[i,j]], X 1024×512, 64 per row",
    dict(X=(GA, GC), I=(GA, GJ), H=(GA, GJ)), ("X",),
    make=lambda r: dict(X=_normal(r, (GA, GC)), I=r.integers(0, GC, (GA, GJ)), H=_normal(r, (GA, GJ))),
    numpy=_gather_np,
    te=lambda te, P: te.compute((GA, GJ), lambda i, j: P["X"][i, P["I"][i, j]], name="Y"),
    jax=lambda m: lambda X, I, H: m.np.sum(m.np.take_along_axis(X, I, axis=1) * H),
    torch=lambda m: lambda X, I, H: (m.np.gather(X, 1, I) * H).sum(),
    bytes=4 * (3 * GA * GJ + GA * GC), limit="bandwidth", int_inputs=("I",))


# ---------------------------------------------------------------- 13. Elman RNN, 14. LSTM (te.scan)
#
# h_0 = 0 (and c_0 = 0); T steps over the sequence X; loss Σ h_T·H.  te
# writes the recurrence with te.scan (its state holds h_0 ... h_T, step t
# reads X[t - 1]) and differentiates it as a reverse scan; JAX with lax.scan;
# numpy's backward is backpropagation through time by hand.

RT, RB, RH, RI = 16, 32, 128, 64


def _rnn_np(X, W, U, H):
    hs = [np.zeros((X.shape[1], W.shape[0]), X.dtype)]
    for x in X:
        hs.append(np.tanh(hs[-1] @ W.T + x @ U.T))
    dX, dW, dU, dh = np.zeros_like(X), np.zeros_like(W), np.zeros_like(U), H
    for t in range(len(X), 0, -1):
        da = dh * (1 - hs[t] ** 2)
        dW += da.T @ hs[t - 1]
        dU += da.T @ X[t - 1]
        dX[t - 1] = da @ U
        dh = da @ W
    return np.vdot(hs[-1], H), [dX, dW, dU], hs[-1]


def _rnn_te(te, P):
    X, W, U = P["X"], P["W"], P["U"]
    (T, B, I), Hd = X.shape, W.shape[0]
    S = te.placeholder((T + 1, B, Hd), X.dtype, "S")
    j, q = te.reduce_axis(Hd, "j"), te.reduce_axis(I, "q")
    h0 = te.compute((1, B, Hd), lambda _, b, i: te.const(0.0, X.dtype), name="h0")
    h = te.compute((T + 1, B, Hd), lambda t, b, i: te.tanh(te.sum(S[t - 1, b, j] * W[i, j], axis=j)
                                                           + te.sum(X[t - 1, b, q] * U[i, q], axis=q)), name="h")
    hs = te.scan(h0, h, S, inputs=[X], name="hs")
    return te.compute((B, Hd), lambda b, i: hs[T, b, i], name="hT")


def _rnn_jax(m):
    def loss(X, W, U, H):
        def step(h, x):
            return m.np.tanh(h @ W.T + x @ U.T), None
        h, _ = m.lax.scan(step, m.np.zeros((X.shape[1], W.shape[0]), X.dtype), X)
        return m.np.sum(h * H)
    return loss


def _rnn_torch(m):
    def loss(X, W, U, H):
        h = m.np.zeros((X.shape[1], W.shape[0]), dtype=X.dtype)
        for x in X:
            h = m.np.tanh(h @ W.T + x @ U.T)
        return (h * H).sum()
    return loss


def rnn_kernel(T: int = RT) -> Kernel:
    """Kernel 13 over ``T`` steps (``python -m benchmarks.scan_steps`` varies it)."""
    return Kernel(
        13, "rnn", f"Elman RNN h_t = tanh(h_(t-1)Wᵀ + x_tUᵀ), T {T}, batch {RB}, hidden {RH}, input {RI}",
        dict(X=(T, RB, RI), W=(RH, RH), U=(RH, RI), H=(RB, RH)), ("X", "W", "U"),
        make=lambda r: dict(X=_normal(r, (T, RB, RI)), W=_normal(r, (RH, RH), RH ** -0.5),
                            U=_normal(r, (RH, RI), RI ** -0.5), H=_normal(r, (RB, RH))),
        numpy=_rnn_np, te=_rnn_te, jax=_rnn_jax, torch=_rnn_torch,
        flops=3 * 2 * T * RB * RH * (RH + RI), limit="fma")


def _sig(z):
    return 1 / (1 + np.exp(-z))


def _lstm_np(X, W, R, H):
    Hd = R.shape[1]
    zeros = np.zeros((X.shape[1], Hd), X.dtype)
    hs, cs, gates = [zeros], [zeros], []
    for x in X:
        g = x @ W.T + hs[-1] @ R.T
        i, f, gg, o = _sig(g[:, :Hd]), _sig(g[:, Hd:2 * Hd]), np.tanh(g[:, 2 * Hd:3 * Hd]), _sig(g[:, 3 * Hd:])
        gates.append((i, f, gg, o))
        cs.append(f * cs[-1] + i * gg)
        hs.append(o * np.tanh(cs[-1]))
    dX, dW, dR = np.zeros_like(X), np.zeros_like(W), np.zeros_like(R)
    dh, dc = H, np.zeros_like(zeros)
    for t in range(len(X), 0, -1):
        i, f, gg, o = gates[t - 1]
        tc = np.tanh(cs[t])
        dc = dc + dh * o * (1 - tc ** 2)
        dg = np.concatenate([dc * gg * i * (1 - i), dc * cs[t - 1] * f * (1 - f),
                             dc * i * (1 - gg ** 2), dh * tc * o * (1 - o)], axis=1)
        dW += dg.T @ X[t - 1]
        dR += dg.T @ hs[t - 1]
        dX[t - 1] = dg @ W
        dh, dc = dg @ R, dc * f
    return np.vdot(hs[-1], H), [dX, dW, dR], hs[-1]


def _lstm_te(te, P):
    X, W, R = P["X"], P["W"], P["R"]
    (T, B, I), Hd = X.shape, R.shape[1]
    Sh, Sc = (te.placeholder((T + 1, B, Hd), X.dtype, n) for n in ("Sh", "Sc"))
    q, j = te.reduce_axis(I, "q"), te.reduce_axis(Hd, "j")
    zero = te.compute((1, B, Hd), lambda _, b, i: te.const(0.0, X.dtype), name="zero")
    g = te.compute((T + 1, B, 4 * Hd), lambda t, b, k: te.sum(X[t - 1, b, q] * W[k, q], axis=q)
                   + te.sum(Sh[t - 1, b, j] * R[k, j], axis=j), name="gates")
    c = te.compute((T + 1, B, Hd), lambda t, b, i: te.sigmoid(g[t, b, Hd + i]) * Sc[t - 1, b, i]
                   + te.sigmoid(g[t, b, i]) * te.tanh(g[t, b, 2 * Hd + i]), name="c")
    h = te.compute((T + 1, B, Hd), lambda t, b, i: te.sigmoid(g[t, b, 3 * Hd + i]) * te.tanh(c[t, b, i]), name="h")
    hs, _ = te.scan([zero, zero], [h, c], [Sh, Sc], inputs=[X], name="lstm")
    return te.compute((B, Hd), lambda b, i: hs[T, b, i], name="hT")


def _lstm_step(m, X, W, R):
    Hd = R.shape[1]

    def step(carry, x):
        h, c = carry
        g = x @ W.T + h @ R.T
        s = m.nn.sigmoid
        c = s(g[:, Hd:2 * Hd]) * c + s(g[:, :Hd]) * m.np.tanh(g[:, 2 * Hd:3 * Hd])
        return (s(g[:, 3 * Hd:]) * m.np.tanh(c), c)
    return step, m.np.zeros((X.shape[1], Hd), dtype=X.dtype)


def _lstm_jax(m):
    def loss(X, W, R, H):
        step, zero = _lstm_step(m, X, W, R)
        (h, _), _ = m.lax.scan(lambda carry, x: (step(carry, x), None), (zero, zero), X)
        return m.np.sum(h * H)
    return loss


def _lstm_torch(m):
    def loss(X, W, R, H):
        step, zero = _lstm_step(m, X, W, R)
        carry = (zero, zero)
        for x in X:
            carry = step(carry, x)
        return (carry[0] * H).sum()
    return loss


def lstm_kernel(T: int = RT) -> Kernel:
    """Kernel 14 over ``T`` steps."""
    return Kernel(
        14, "lstm", f"LSTM, T {T}, batch {RB}, hidden {RH}, input {RI}",
        dict(X=(T, RB, RI), W=(4 * RH, RI), R=(4 * RH, RH), H=(RB, RH)), ("X", "W", "R"),
        make=lambda r: dict(X=_normal(r, (T, RB, RI)), W=_normal(r, (4 * RH, RI), RI ** -0.5),
                            R=_normal(r, (4 * RH, RH), RH ** -0.5), H=_normal(r, (RB, RH))),
        numpy=_lstm_np, te=_lstm_te, jax=_lstm_jax, torch=_lstm_torch,
        flops=3 * 2 * T * RB * 4 * RH * (RH + RI), limit="fma")


# ---------------------------------------------------------------- 15. dense + bias + GELU (exact, erf)

_ERF = np.vectorize(math.erf, otypes=[float])


def _gelu_np(X, W, b, H):
    Z = X @ W.T + b
    cdf = 0.5 * (1 + _ERF(Z / math.sqrt(2)).astype(Z.dtype))
    Y = Z * cdf
    G = H * (cdf + Z * np.exp(-0.5 * Z * Z) / math.sqrt(2 * math.pi))
    return np.vdot(Y, H), [G @ W, G.T @ X, G.sum(0)], Y


def _gelu_te(te, P):
    X, W, b = P["X"], P["W"], P["b"]
    (n, d), m = X.shape, W.shape[0]
    k = te.reduce_axis(d, "k")
    Z = te.compute((n, m), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k) + b[j], name="Z")
    return te.compute((n, m), lambda i, j: 0.5 * Z[i, j] * (1.0 + te.erf(Z[i, j] * math.sqrt(0.5))), name="Y")


GELU = Kernel(
    15, "gelu", "dense+bias+GELU (erf) 64×512→256", dict(X=(DN, DI), W=(DO, DI), b=(DO,), H=(DN, DO)),
    ("X", "W", "b"),
    make=DENSE.make, numpy=_gelu_np, te=_gelu_te,
    jax=lambda m: lambda X, W, b, H: m.np.sum(m.nn.gelu(X @ W.T + b, approximate=False) * H),
    torch=lambda m: lambda X, W, b, H: (m.nn.gelu(m.nn.linear(X, W, b)) * H).sum(),
    flops=3 * 2 * DN * DI * DO, limit="fma")


KERNELS = {k.id: k for k in (matmul_kernel(), DENSE, conv_kernel(), MAXPOOL, softmax_ce_kernel(), elementwise_kernel(),
                             SEED, STENCIL, STRIDED, mlp_kernel(), EMBEDDING, GATHER, rnn_kernel(), lstm_kernel(),
                             GELU)}
STEPPED = {13: rnn_kernel, 14: lstm_kernel}      # the kernels over a number of time steps
