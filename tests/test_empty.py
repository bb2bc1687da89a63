"""Empty tensors (SPEC: shapes may contain 0): kernels return empty arrays, a
reduction over an empty range gives its identity, and gradients follow
(an empty batch contributes nothing to a weight's gradient)."""
import numpy as np
import pytest

import te_autodiff as te
from conftest import assert_close, build_grad

pytestmark = pytest.mark.aarch64          # all of it runs in .ci/aarch64 (emulated AArch64)


def test_elementwise_on_an_empty_batch():
    X = te.placeholder((0, 4), name="X")
    Y = te.compute((0, 4), lambda i, j: te.exp(X[i, j]) * 2.0 + X[i, j], name="Y")
    (dX,) = te.gradient(Y, [X])
    y, dx = te.build([X], [Y, dX])(np.zeros((0, 4), "float32"))
    assert y.shape == (0, 4) and dx.shape == (0, 4) and y.dtype == np.float32
    assert te.cost([X], [Y, dX])["iterations"] == 0


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_reductions_over_an_empty_range_give_their_identity(dtype):
    X = te.placeholder((3, 0), dtype=dtype, name="X")
    outs = []
    for op in ("sum", "prod", "max", "min"):
        k = te.reduce_axis(0, "k")
        outs.append(te.compute((3,), lambda i, op=op, k=k: getattr(te, op)(X[i, k], axis=k), name=op))
    got = te.build([X], outs)(np.zeros((3, 0), dtype))
    info = np.finfo(dtype) if dtype.startswith("float") else np.iinfo(dtype)
    lowest, highest = (-np.inf, np.inf) if dtype.startswith("float") else (info.min, info.max)
    for value, want in zip(got, (0, 1, lowest, highest)):
        assert value.dtype == np.dtype(dtype) and np.all(value == want), (value, want)


def test_dense_layer_on_an_empty_batch():
    """Y = X·Wᵀ + b with no rows: Y is empty, dW and db are zeros, dX empty."""
    N, D, M = 0, 5, 3
    X = te.placeholder((N, D), dtype="float64", name="X")
    W = te.placeholder((M, D), dtype="float64", name="W")
    b = te.placeholder((M,), dtype="float64", name="b")
    k = te.reduce_axis(D, "k")
    Y = te.compute((N, M), lambda i, j: te.tanh(te.sum(X[i, k] * W[j, k], axis=k) + b[j]), name="Y")
    w, bb = np.random.default_rng(0).standard_normal((M, D)), np.ones(M)
    r = build_grad(Y, [X, W, b], [np.zeros((N, D)), w, bb], head=np.zeros((N, M)))
    assert r.fwd.shape == (0, M)
    assert_close(r.grads, [np.zeros((0, D)), np.zeros((M, D)), np.zeros(M)])
    assert_close(r.naive, r.grads)


def test_embedding_with_no_ids():
    E = te.placeholder((6, 3), dtype="float64", name="E")
    I = te.placeholder((0,), dtype="int32", name="I")
    H = te.placeholder((0, 3), dtype="float64", name="H")
    Y = te.compute((0, 3), lambda n, d: E[I[n], d], name="Y")
    (dE,) = te.gradient(Y, [E], head=H)
    y, de = te.build([E, I, H], [Y, dE])(np.ones((6, 3)), np.zeros(0, "int32"), np.zeros((0, 3)))
    assert y.shape == (0, 3) and np.array_equal(de, np.zeros((6, 3)))


def test_wrong_shapes_are_still_refused():
    X = te.placeholder((0, 4), name="X")
    f = te.build([X], [te.compute((0, 4), lambda i, j: X[i, j] + 1.0, name="Y")])
    with pytest.raises(ValueError, match="'X'"):
        f(np.zeros((1, 4), "float32"))
    with pytest.raises(ValueError, match="non-negative"):
        te.placeholder((2, -1), name="Z")


def test_convolution_and_pooling_on_an_empty_batch():
    from conftest import conv2d
    (X, W), Y = conv2d(N=0, C=3, F=2, size=6)
    dX, dW = te.gradient(Y, [X, W])
    y, dx, dw = te.build([X, W], [Y, dX, dW])(np.zeros((0, 3, 6, 6), "float32"), np.ones((2, 3, 3, 3), "float32"))
    assert y.shape == (0, 2, 6, 6) and dx.shape == (0, 3, 6, 6) and np.array_equal(dw, np.zeros((2, 3, 3, 3)))
    P = te.placeholder((0, 2, 4, 4), name="P")
    a, b = te.reduce_axis(2, "a"), te.reduce_axis(2, "b")
    M = te.compute((0, 2, 2, 2), lambda n, c, i, j: te.max(P[n, c, 2 * i + a, 2 * j + b], axis=[a, b]), name="M")
    (dP,) = te.gradient(M, [P])
    m, dp = te.build([P], [M, dP])(np.zeros((0, 2, 4, 4), "float32"))
    assert m.shape == (0, 2, 2, 2) and dp.shape == (0, 2, 4, 4)


def test_a_loss_over_an_empty_batch_is_zero_and_so_is_its_gradient():
    X = te.placeholder((0, 3), name="X")
    Wt = te.placeholder((3,), name="Wt")
    i, k = te.reduce_axis(0, "i"), te.reduce_axis(3, "k")
    L = te.compute((1,), lambda _: te.sum(te.exp(X[i, k] * Wt[k]), axis=[i, k]), name="L")
    (dWt,) = te.gradient(L, [Wt])
    loss, dw = te.build([X, Wt], [L, dWt])(np.zeros((0, 3), "float32"), np.ones(3, "float32"))
    assert loss[0] == 0 and np.array_equal(dw, np.zeros(3))
    assert te.cost([X, Wt], [L, dWt])["iterations"] == 1 + 3     # one store per element of L and dWt
