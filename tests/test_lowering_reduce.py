"""Reductions: every op, nested in expressions and selects, expression domains, argmax."""
import numpy as np
import pytest

import te_autodiff as te
from te_autodiff.expr import const, reduce, var

pytestmark = pytest.mark.aarch64          # all of it runs in .ci/aarch64 (emulated AArch64)

I64 = "int64"


def build_run(inputs, outputs, *arrays):
    return te.build(inputs, outputs)(*arrays)


OPS = {"sum": (te.sum, np.sum), "max": (te.max, np.max), "min": (te.min, np.min), "prod": (te.prod, np.prod)}


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("op", OPS)
def test_row_reductions(op, dtype):
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 1.5, (6, 9)) if dtype.startswith("float") else rng.integers(-3, 4, (6, 9))
    x = x.astype(dtype)
    X = te.placeholder(x.shape, dtype, "X")
    k = te.reduce_axis(9, "k")
    ours, ref = OPS[op]
    out = te.compute((6,), lambda i: ours(X[i, k], axis=k), name="out")
    np.testing.assert_allclose(build_run([X], [out], x), ref(x, axis=1).astype(dtype), rtol=1e-6)


@pytest.mark.parametrize("op", OPS)
def test_reduction_over_two_axes_and_a_sub_range(op):
    x = np.random.default_rng(1).uniform(0.5, 1.5, (4, 5, 6))
    X = te.placeholder(x.shape, "float64", "X")
    j, k = te.reduce_axis((1, 4), "j"), te.reduce_axis(6, "k")
    ours, ref = OPS[op]
    out = te.compute((4,), lambda i: ours(X[i, j, k], axis=[j, k]), name="out")
    np.testing.assert_allclose(build_run([X], [out], x), ref(x[:, 1:4, :], axis=(1, 2)), rtol=1e-12)


def test_reductions_inside_arithmetic():
    x = np.random.default_rng(2).standard_normal((5, 7))
    X = te.placeholder(x.shape, "float64", "X")
    k, m = te.reduce_axis(7, "k"), te.reduce_axis(7, "m")
    mean = te.compute((5,), lambda i: te.sum(X[i, k], axis=k) / 7.0, name="mean")
    shifted = te.compute((5, 7), lambda i, j: 1.0 + te.max(X[i, m], axis=m) - X[i, j], name="shifted")
    a, b = build_run([X], [mean, shifted], x)
    np.testing.assert_allclose(a, x.mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(b, 1 + x.max(axis=1, keepdims=True) - x, rtol=1e-12)


def test_fused_softmax_with_a_reduction_inside_a_reduction():
    x = np.random.default_rng(3).standard_normal((4, 6))
    X = te.placeholder(x.shape, "float64", "X")

    def rowmax(i):
        k = te.reduce_axis(6, "k")
        return te.max(X[i, k], axis=k)

    def denom(i):
        k = te.reduce_axis(6, "k2")
        return te.sum(te.exp(X[i, k] - rowmax(i)), axis=k)

    sm = te.compute(x.shape, lambda i, j: te.exp(X[i, j] - rowmax(i)) / denom(i), name="softmax")
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(build_run([X], [sm], x), e / e.sum(axis=1, keepdims=True), rtol=1e-12)


def test_reductions_inside_select_branches_run_only_when_taken():
    x = np.random.default_rng(4).standard_normal((6, 5))
    X = te.placeholder(x.shape, "float64", "X")
    k, m = te.reduce_axis(5, "k"), te.reduce_axis(5, "m")
    out = te.compute((6,), lambda i: te.if_then_else(te.equal(i % 2, 0), te.sum(X[i, k], axis=k),
                                                     te.min(X[i, m], axis=m) * 10.0), name="out")
    expected = np.where(np.arange(6) % 2 == 0, x.sum(axis=1), x.min(axis=1) * 10)
    np.testing.assert_allclose(build_run([X], [out], x), expected, rtol=1e-12)
    assert te.cost([X], [out])["iterations"] == 6 * 5


def test_where_argument():
    x = np.random.default_rng(5).standard_normal((3, 8))
    X = te.placeholder(x.shape, "float64", "X")
    k = te.reduce_axis(8, "k")
    out = te.compute((3,), lambda i: te.sum(X[i, k], axis=k, where=X[i, k] > 0), name="out")
    np.testing.assert_allclose(build_run([X], [out], x), np.where(x > 0, x, 0).sum(axis=1), rtol=1e-12)


def test_triangular_domain_depending_on_the_outer_variable():
    n = 9
    x = np.random.default_rng(6).standard_normal(n)
    X = te.placeholder((n,), "float64", "X")

    def prefix(i):
        k = var("k")
        return reduce("sum", X[k], [k], [(const(0, I64), i + 1)])

    out = te.compute((n,), prefix, name="prefix")
    np.testing.assert_allclose(build_run([X], [out], x), np.cumsum(x), rtol=1e-12)
    assert te.cost([X], [out])["iterations"] == n * (n + 1) // 2


def test_window_domain_with_max_min_bounds_and_empty_ranges():
    """out[i] = sum of X[k] for k in [max(0, i - 2), min(i, n - 1) - 1]; empty for i = 0."""
    n = 7
    x = np.arange(1.0, n + 1)
    X = te.placeholder((n,), "float64", "X")

    def window(i):
        k = var("k")
        lo = te.maximum(i - 2, 0)
        return reduce("sum", X[k], [k], [(lo, te.minimum(i, n - 1) - lo)])

    def window_max(i):
        k = var("k")
        lo = te.maximum(i - 2, 0)
        return reduce("max", X[k], [k], [(lo, te.minimum(i, n - 1) - lo)])

    s = te.compute((n,), window, name="s")
    m = te.compute((n,), window_max, name="m")
    got_s, got_m = build_run([X], [s, m], x)
    exp_s = [x[max(0, i - 2):min(i, n - 1)].sum() for i in range(n)]
    exp_m = [x[max(0, i - 2):min(i, n - 1)].max(initial=-np.inf) for i in range(n)]
    np.testing.assert_allclose(got_s, exp_s)
    np.testing.assert_array_equal(got_m, exp_m)
    assert te.cost([X], [s])["iterations"] == sum(min(i, n - 1) - max(0, i - 2) for i in range(n))


def argmax_of(X, doms):
    """out[i] = argmax over the axes of X[i, ...] restricted to doms."""
    def body(i):
        axes = [var(f"k{n}") for n in range(len(doms))]
        return reduce("argmax", X[(i, *axes)], axes, [(const(lo, I64), const(ext, I64)) for lo, ext in doms])
    return te.compute((X.shape[0],), body, name="argmax")


def test_argmax_first_maximum_wins():
    x = np.array([[1, 3, 3, 0, 2], [5, 5, 5, 5, 5], [0, 1, 2, 3, 9], [-np.inf] * 5], "float32")
    X = te.placeholder(x.shape, "float32", "X")
    out = build_run([X], [argmax_of(X, [(0, 5)])], x)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, np.argmax(x, axis=1))


def test_argmax_over_two_axes_is_row_major_relative_to_lo():
    x = np.random.default_rng(7).integers(0, 3, (4, 5, 6)).astype("int32")
    X = te.placeholder(x.shape, "int32", "X")
    out = build_run([X], [argmax_of(X, [(1, 3), (2, 4)])], x)
    expected = [np.argmax(x[i, 1:4, 2:6].reshape(-1)) for i in range(4)]
    np.testing.assert_array_equal(out, expected)


def test_bool_body_is_summed_as_int32():
    x = np.random.default_rng(8).standard_normal((3, 10))
    X = te.placeholder(x.shape, "float64", "X")
    k = te.reduce_axis(10, "k")
    out = te.compute((3,), lambda i: te.sum(X[i, k] > 0, axis=k), name="count")
    got = build_run([X], [out], x)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, (x > 0).sum(axis=1))


def test_reduction_on_the_right_of_a_short_circuit_and():
    x = np.random.default_rng(9).standard_normal((5, 4))
    X = te.placeholder(x.shape, "float64", "X")
    k = te.reduce_axis(4, "k")
    out = te.compute((5,), lambda i: te.all(i > 1, te.sum(X[i, k], axis=k) > 0.0).astype("int32"), name="out")
    np.testing.assert_array_equal(build_run([X], [out], x), ((np.arange(5) > 1) & (x.sum(axis=1) > 0)))
    assert te.cost([X], [out])["iterations"] == 3 * 4


def test_max_and_min_propagate_nan_like_numpy():
    x = np.array([[1.0, np.nan, 3.0], [1.0, 2.0, 3.0]])
    X = te.placeholder(x.shape, "float64", "X")
    k, m = te.reduce_axis(3, "k"), te.reduce_axis(3, "m")
    mx = te.compute((2,), lambda i: te.max(X[i, k], axis=k), name="mx")
    mn = te.compute((2,), lambda i: te.min(X[i, m], axis=m), name="mn")
    pair = te.compute((2, 3), lambda i, j: te.maximum(X[i, j], 2.0) + te.minimum(X[i, j], 2.0), name="pair")
    a, b, c = build_run([X], [mx, mn, pair], x)
    np.testing.assert_array_equal(a, x.max(axis=1))
    np.testing.assert_array_equal(b, x.min(axis=1))
    np.testing.assert_array_equal(c, np.maximum(x, 2.0) + np.minimum(x, 2.0))


@pytest.mark.parametrize("target", ["haswell", "skylake-avx512", "x86-64-v2"])
def test_a_max_gradient_finds_its_maximum_where_candidates_fuse_a_product(rng, target):
    """The gradient of a max recomputes its candidates and sends the adjoint
    to the first one equal to the stored maximum.  A candidate ``g / (g g +
    1) * w`` holds a product plus a term: where LLVM chose to fuse it into
    an fma in one stage and not in the other (padded rows peeled from
    interior ones), the recomputed value missed the maximum by a rounding
    and the adjoint went to another candidate (found by ``python -m fuzz``,
    seed 53000318).  Values against numpy by hand, on every target."""
    from lowering.target import Target
    X0 = te.placeholder((3, 13, 8), "float64", "X0")
    X1 = te.placeholder((5, 8, 16), "float64", "X1")
    r1, r2 = te.reduce_axis((0, 5), "r1"), te.reduce_axis((0, 8), "r2")

    def g(o0, o1):
        inside = te.all(o1 + r1 - 2 >= 0, o1 + r1 - 2 < 13)
        return te.if_then_else(inside, X0[o0, o1 + r1 - 2, r2], 0.0)
    Y = te.compute((3, 13, 16), lambda o0, o1, o2: te.max(g(o0, o1) / (g(o0, o1) * g(o0, o1) + 1.0)
                                                          * X1[r1, r2, o2], axis=[r1, r2]), name="Y")
    H = te.placeholder(Y.shape, "float64", "H")
    dX0, = te.gradient(Y, [X0], head=H)
    kernel = te.build([X0, X1, H], [dX0], target=target)
    if kernel.target.missing_on_host() is not None:
        pytest.skip(f"{target} does not run here")
    x0, x1, h = rng.standard_normal((3, 13, 8)), rng.standard_normal((5, 8, 16)), rng.standard_normal((3, 13, 16))
    want = np.zeros_like(x0)
    for o0 in range(3):
        for o1 in range(13):
            rows = np.arange(5) + o1 - 2
            inside = (rows >= 0) & (rows < 13)
            gv = np.where(inside[:, None], x0[o0, np.clip(rows, 0, 12)], 0.0)          # (r1, r2)
            for o2 in range(16):
                cand = gv / (gv * gv + 1.0) * x1[:, :, o2]
                a1, a2 = np.unravel_index(np.argmax(cand), cand.shape)
                if inside[a1]:
                    v = gv[a1, a2]
                    want[o0, rows[a1], a2] += h[o0, o1, o2] * (1 - v * v) / (v * v + 1) ** 2 * x1[a1, a2, o2]
    np.testing.assert_allclose(kernel(x0, x1, h), want, rtol=1e-12, atol=1e-12)


def test_a_sum_multiplies_by_the_factors_its_loop_does_not_change_once(rng):
    """``Σ_k s_i·A_ik·0.3·B_kj / t_j``: the loop accumulates ``A·B`` alone
    and the factors scale the sum after it (a scaled contraction keeps one
    multiply-add per step)."""
    A, B = te.placeholder((5, 7), "float64", "A"), te.placeholder((7, 6), "float64", "B")
    S, T = te.placeholder((5,), "float64", "S"), te.placeholder((6,), "float64", "T")
    k = te.reduce_axis(7, "k")
    C = te.compute((5, 6), lambda i, j: te.sum(S[i] * A[i, k] * 0.3 * B[k, j] / T[j], axis=k), name="C")
    kernel = te.build([A, B, S, T], [C])
    update, = [line for line in kernel.loop_ir.splitlines() if "acc" in line and "A[" in line]
    assert "S[" not in update and "T[" not in update and "0.3" not in update
    a, b, s = rng.standard_normal((5, 7)), rng.standard_normal((7, 6)), rng.standard_normal(5)
    t = rng.uniform(1, 2, 6)
    np.testing.assert_allclose(kernel(a, b, s, t), 0.3 * s[:, None] * (a @ b) / t, rtol=1e-13)


def test_factors_stay_inside_a_sum_whose_domain_may_be_empty():
    """An empty sum is 0 whatever its factors: ``Σ_{k<i} X_k·Y_i`` at
    ``i = 0`` with ``Y_0 = inf`` is 0, not ``inf·0``."""
    n = 4
    X, Y = te.placeholder((n,), "float64", "X"), te.placeholder((n,), "float64", "Y")

    def prefix(i):
        k = var("k")
        return reduce("sum", X[k] * Y[i], [k], [(const(0, I64), i)])

    out = te.compute((n,), prefix, name="prefix")
    y = np.array([np.inf, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(build_run([X, Y], [out], np.ones(n), y), [0.0, 1.0, 4.0, 9.0])


def test_a_factor_read_at_a_data_index_is_checked_before_it_is_read():
    X, Y = te.placeholder((6,), "float32", "X"), te.placeholder((3,), "float32", "Y")
    I = te.placeholder((2,), "int32", "I")
    k = te.reduce_axis(6, "k")
    out = te.compute((2,), lambda i: te.sum(X[k] * Y[I[i]], axis=k), name="out")
    kernel = te.build([X, Y, I], [out])
    x, y = np.ones(6, np.float32), np.float32([1, 2, 3])
    np.testing.assert_array_equal(kernel(x, y, np.int32([2, 0])), [18, 6])
    with pytest.raises(IndexError, match="tensor 'Y'"):
        kernel(x, y, np.int32([1, 1 << 20]))
