"""The size sweep: kernel families at sizes from cache-resident to far beyond the last cache.

One size of a kernel says little about how close to the machine a compiler
gets: a small GEMM lives in L1 and L2 and pays for its calls, a large one
streams from memory.  ``python -m benchmarks --sizes`` runs each family below
at each of its sizes against the peers, every (case, peer) in its own
process like the fourteen kernels (``runner.py``, ``worker.py``).

A *case* is one family at one size, written ``family:size`` with the size's
numbers joined by ``x``: ``matmul:512``, ``conv2d:8x32x28``,
``softmax_ce:512x32000``.  ``--sizes matmul,attention:128`` picks families
(at every size of the sweep) and single cases (any size).

The families reuse the fourteen kernels' definitions where there is one
(``kernels.py``: matmul, conv2d, softmax cross-entropy, the elementwise
chain, the MLP) and add two: attention (4 heads, head size 64, written in te
as scores, softmax and weighted sum) and a depthwise 3×3 convolution.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .kernels import (Kernel, conv_kernel, elementwise_kernel, matmul_kernel, mlp_kernel, padded_te,
                      softmax_ce_kernel)

# ---------------------------------------------------------------- attention


HEADS, HEAD_SIZE = 4, 64


def _attention_np(Q, K, V, H):
    scale = Q.shape[-1] ** -0.5
    S = Q @ K.transpose(0, 2, 1) * scale
    P = np.exp(S - S.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    O = P @ V
    dP = H @ V.transpose(0, 2, 1)
    dS = P * (dP - np.sum(dP * P, -1, keepdims=True)) * scale
    return np.vdot(O, H), [dS @ K, dS.transpose(0, 2, 1) @ Q, P.transpose(0, 2, 1) @ H], O


def _attention_te(te, P):
    Q, K, V = P["Q"], P["K"], P["V"]
    h, T, d = Q.shape
    k, j1, j2, j3 = te.reduce_axis(d, "k"), te.reduce_axis(T, "j"), te.reduce_axis(T, "j"), te.reduce_axis(T, "j")
    S = te.compute((h, T, T), lambda a, i, j: te.sum(Q[a, i, k] * K[a, j, k], axis=k) * d ** -0.5, name="scores")
    M = te.compute((h, T), lambda a, i: te.max(S[a, i, j1], axis=j1), name="row_max")
    E = te.compute((h, T, T), lambda a, i, j: te.exp(S[a, i, j] - M[a, i]), name="exp")
    Z = te.compute((h, T), lambda a, i: te.sum(E[a, i, j2], axis=j2), name="row_sum")
    Pr = te.compute((h, T, T), lambda a, i, j: E[a, i, j] / Z[a, i], name="softmax")
    return te.compute((h, T, d), lambda a, i, c: te.sum(Pr[a, i, j3] * V[a, j3, c], axis=j3), name="out")


def _attention_jax(m):
    def loss(Q, K, V, H):                 # jax.nn's attention takes (T, heads, d)
        out = m.nn.dot_product_attention(*(x.swapaxes(0, 1) for x in (Q, K, V)))
        return m.np.sum(out.swapaxes(0, 1) * H)
    return loss


def attention_kernel(T: int) -> Kernel:
    """Self-attention over ``T`` positions, ``HEADS`` heads of ``HEAD_SIZE``;
    PyTorch runs ``scaled_dot_product_attention``, JAX ``jax.nn.dot_product_attention``."""
    shape = (HEADS, T, HEAD_SIZE)
    return Kernel(
        0, "attention", f"attention, {HEADS} heads, d {HEAD_SIZE}, T {T}", dict(Q=shape, K=shape, V=shape, H=shape),
        ("Q", "K", "V"),
        make=lambda r: {n: r.standard_normal(shape) for n in ("Q", "K", "V", "H")},
        numpy=_attention_np, te=_attention_te, jax=_attention_jax,
        torch=lambda m: lambda Q, K, V, H: (m.nn.scaled_dot_product_attention(Q[None], K[None], V[None])[0] * H).sum(),
        flops=6 * 2 * HEADS * T * T * HEAD_SIZE, limit="fma",
        products=("scores.r1", "out", "dsoftmax", "dQ", "dK", "dV"))


# ---------------------------------------------------------------- depthwise 3×3 convolution


def _depthwise_np(X, W, H):
    N, C, Hh, Ww = X.shape
    xp = np.pad(X, ((0, 0), (0, 0), (1, 1), (1, 1)))
    hp = np.pad(H, ((0, 0), (0, 0), (1, 1), (1, 1)))
    Y, dX, dW = np.zeros_like(X), np.zeros_like(X), np.empty_like(W)
    for kh in range(3):
        for kw in range(3):
            w = W[:, kh, kw][:, None, None]
            window = xp[:, :, kh:kh + Hh, kw:kw + Ww]
            Y += window * w
            dX += hp[:, :, 2 - kh:2 - kh + Hh, 2 - kw:2 - kw + Ww] * w
            dW[:, kh, kw] = np.einsum("nchw,nchw->c", window, H)
    return np.vdot(Y, H), [dX, dW], Y


def _depthwise_te(te, P):
    X, W = P["X"], P["W"]
    N, C, H, Wd = X.shape
    Xp = padded_te(te, X, 1)
    kh, kw = te.reduce_axis(3, "kh"), te.reduce_axis(3, "kw")
    return te.compute((N, C, H, Wd), lambda n, c, y, x: te.sum(Xp[n, c, y + kh, x + kw] * W[c, kh, kw],
                                                               axis=[kh, kw]), name="dwconv")


def _depthwise_jax(m):
    def loss(X, W, H):
        y = m.lax.conv_general_dilated(X, W[:, None], (1, 1), ((1, 1), (1, 1)),
                                       dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=X.shape[1])
        return m.np.sum(y * H)
    return loss


def depthwise_kernel(n: int, c: int, h: int) -> Kernel:
    """A 3×3 depthwise convolution, pad 1, on ``n``×``c``×``h``×``h``: one
    filter per channel, 18 flops per output, so it moves as many bytes as it
    computes flops (both are counted)."""
    return Kernel(
        0, "depthwise", f"depthwise conv 3×3 {n}×{c}×{h}×{h}, pad 1",
        dict(X=(n, c, h, h), W=(c, 3, 3), H=(n, c, h, h)), ("X", "W"),
        make=lambda r: dict(X=r.standard_normal((n, c, h, h)), W=r.standard_normal((c, 3, 3)) / 3,
                            H=r.standard_normal((n, c, h, h))),
        numpy=_depthwise_np, te=_depthwise_te, jax=_depthwise_jax,
        torch=lambda m: lambda X, W, H: (m.nn.conv2d(X, W[:, None], padding=1, groups=X.shape[1]) * H).sum(),
        flops=3 * 2 * n * c * h * h * 9, bytes=4 * (3 * n * c * h * h + 2 * c * 9), limit="bandwidth")


# ---------------------------------------------------------------- the sweep


@dataclass(frozen=True)
class Family:
    """A kernel at any size: ``make(*size)``; ``sizes``: the sweep's;
    ``matrix``: JAX runs it through its matrix-product or convolution
    libraries, which keep their own instruction set under ``TE_TARGET``
    (``peer_isa.UNCAPPED``)."""
    make: Callable[..., Kernel]
    sizes: tuple
    matrix: bool


FAMILIES = {
    "matmul": Family(matmul_kernel, ((64,), (128,), (512,), (1024,), (2048,)), True),
    "matmul_f64": Family(lambda n: matmul_kernel(n, "float64"), ((128,), (512,), (1024,)), True),
    "mlp": Family(mlp_kernel, ((128,), (1024,), (8192,)), True),
    "conv2d": Family(conv_kernel, ((8, 32, 28), (32, 64, 56), (8, 256, 14)), True),
    "attention": Family(attention_kernel, ((128,), (512,), (1024,), (2048,)), True),
    "depthwise": Family(depthwise_kernel, ((1, 32, 28), (8, 64, 56), (32, 128, 56)), True),
    "elementwise": Family(elementwise_kernel, ((1 << 12,), (1 << 16,), (1 << 20,), (1 << 24,)), False),
    "elementwise_f64": Family(lambda n: elementwise_kernel(n, "float64"), ((1 << 16,), (1 << 20,), (1 << 24,)),
                              False),
    "softmax_ce": Family(softmax_ce_kernel, ((32, 1000), (256, 1000), (4096, 1000), (512, 32000)), False),
}


def case_name(family: str, size: tuple) -> str:
    return family + ":" + "x".join(str(s) for s in size)


def parse_case(case: str) -> tuple:
    """``(family, size)`` of ``"family:size"``; ``ValueError`` if either is unknown or malformed."""
    family, _, size = case.partition(":")
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    try:
        numbers = tuple(int(s) for s in size.split("x"))
    except ValueError:
        raise ValueError(f"case {case!r}: the size is numbers joined by 'x', e.g. "
                         f"{case_name(family, FAMILIES[family].sizes[0])}") from None
    if len(numbers) != len(FAMILIES[family].sizes[0]) or min(numbers) < 1:
        raise ValueError(f"case {case!r}: {family} takes {len(FAMILIES[family].sizes[0])} positive number(s)")
    return family, numbers


def kernel_for(case: str) -> Kernel:
    family, size = parse_case(case)
    return FAMILIES[family].make(*size)


def cases(spec: str) -> list:
    """The cases ``spec`` names: ``"all"``, or families and cases separated by commas."""
    if spec == "all":
        spec = ",".join(FAMILIES)
    out = []
    for token in (t.strip() for t in spec.split(",") if t.strip()):
        if ":" in token:
            parse_case(token)
            out.append(token)
        elif token in FAMILIES:
            out += [case_name(token, size) for size in FAMILIES[token].sizes]
        else:
            raise ValueError(f"unknown family {token!r}; known: {', '.join(FAMILIES)}")
    return list(dict.fromkeys(out))
