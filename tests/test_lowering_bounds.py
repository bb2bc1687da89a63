"""Bounds: build-time proofs (and refusals) of reads, run-time checks of data-dependent reads."""
import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import te_autodiff as te
from te_autodiff.expr import Const, const, reduce, var
from lowering.bounds_check import Scope, bounds
from lowering.bounds_exact import Reach, reach

I64 = "int64"


def axis(name, n):
    return var(name, (0, n))


def scope_of(*axes):
    return Scope.of_axes(axes, [a.dom[1] for a in axes])


# ------------------------------------------------------------ the analysis


def test_affine_bounds_over_loop_ranges():
    i, k = axis("i", 8), axis("k", 3)
    assert bounds(i * 2 + k - 1, scope_of(i, k)) == (-1, 15)
    assert bounds(i - k, scope_of(i, k)) == (-2, 7)


def test_guards_narrow_single_variables_and_matching_affine_forms():
    i, k = axis("i", 8), axis("k", 3)
    h = i * 2 + k - 1
    s = scope_of(i, k).guarded(te.all(h >= 0, h < 10), True)
    assert bounds(h, s) == (0, 9)
    assert bounds(i, scope_of(i).guarded(i < 5, True)) == (0, 4)
    assert bounds(i - 5, scope_of(i).guarded(i < 5, False)) == (0, 2)


def test_floor_division_and_modulo_by_constants():
    i, j = axis("i", 6), axis("j", 4)
    q = i * 4 + j
    assert bounds(q // 3, scope_of(i, j)) == (0, 7)
    assert bounds(q % 3, scope_of(i, j)) == (0, 2)
    assert bounds((i + 1) % 3, scope_of(i)) == (0, 2)
    assert bounds(i // 4 % 2, scope_of(i)) == (0, 1)


def test_domains_that_depend_on_outer_variables():
    """k in [ceil((i - 2) / 3), floor(i / 3)]: the zero-eliminated shape of a strided read."""
    i, k = axis("i", 9), var("k")
    lo = -((2 - i) // 3)
    s = scope_of(i).with_vars([k], [(lo, i // 3 - lo + 1)])
    assert bounds(i - k * 3, s) == (0, 2)
    assert bounds(k, s) == (0, 2)


def test_max_min_domains_are_split():
    i, k = axis("i", 10), var("k")
    lo = te.maximum(i - 2, 0)
    s = scope_of(i).with_vars([k], [(lo, te.minimum(i, 4) - lo + 1)])
    assert bounds(i - k, s) == (0, 2)
    assert bounds(k, s) == (0, 4)


def test_exact_fallback_uses_divisibility_guards():
    i, kh = axis("i", 5), var("kh")
    t0 = (i + 1) // 2
    s = scope_of(i).guarded(te.equal((i + 1) % 2, 0), True).with_vars([kh], [(t0 - 1, const(2, I64))])
    assert (reach(kh, s).lo, reach(kh, s).hi) == (0, 2)
    r = reach(kh, scope_of(i).with_vars([kh], [(t0 - 1, const(2, I64))]))
    assert (r.lo, r.hi) == (-1, 2)


def test_exact_range_of_a_quadratic_index_under_its_guard():
    """A strictly lower triangle packed column by column (GMM): c*(2D-c-1)//2 + r-c-1 under c < r."""
    D = 4
    r, c = axis("r", D), axis("c", D)
    packed = c * (2 * D - c - 1) // 2 + r - c - 1
    assert reach(packed, scope_of(r, c).guarded(c < r, True)) == Reach(0, 5, (("r", 1), ("c", 0)),
                                                                       (("r", 3), ("c", 2)))
    unguarded = reach(packed, scope_of(r, c))
    assert (unguarded.lo, unguarded.hi) == (-1, 5)            # at r = 0, c = 0: one read before the start


@pytest.mark.parametrize("make,truth,expected", [
    (lambda i: te.equal(i, 0), False, (0, 8)), (lambda i: te.not_equal(i, 0), True, (0, 8)),
    (lambda i: te.any(i < 1, i > 8), False, (0, 7)), (lambda i: te.all(i >= 1, i <= 8), True, (0, 7)),
    (lambda i: te.not_(i < 1), True, (0, 8)), (lambda i: i * i >= 4, True, (1, 8)),
    (lambda i: te.any(te.equal(i, 3), te.equal(i, 7)), True, (2, 6))])
def test_every_condition_narrows_the_branch_it_guards(make, truth, expected):
    """i - 1 over i in [0, 10) where the condition has the given truth."""
    i = axis("i", 10)
    got = reach(i - 1, scope_of(i).guarded(make(i), truth))
    assert (got.lo, got.hi) == expected


def test_a_read_that_never_runs_has_no_range():
    i = axis("i", 10)
    assert reach(i, scope_of(i).guarded(te.all(i > 5, i < 3), True)) is None


_OPS = ("add", "sub", "mul", "floordiv", "mod", "max", "min")


def _index_exprs(depth):
    """Integer expressions over variables a, b (ranges 0..4 and 0..5) and small constants."""
    leaf = st.one_of(st.sampled_from(["a", "b"]), st.integers(-3, 3))
    if depth == 0:
        return leaf
    sub_ = _index_exprs(depth - 1)
    return st.one_of(leaf, st.tuples(st.sampled_from(_OPS), sub_, sub_))


def _build(tree, env):
    if isinstance(tree, str):
        return env[tree]
    if isinstance(tree, int):
        return const(tree, I64)
    op, x, y = tree
    if op in ("floordiv", "mod"):           # by a positive constant: the divisor the tree names
        x, y = _build(x, env), const(abs(y) + 1 if isinstance(y, int) else 3, I64)
    else:
        x, y = _build(x, env), _build(y, env)
    return {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y, "floordiv": lambda: x // y,
            "mod": lambda: x % y, "max": lambda: te.maximum(x, y), "min": lambda: te.minimum(x, y)}[op]()


def _value(tree, env):
    if isinstance(tree, str):
        return env[tree]
    if isinstance(tree, int):
        return tree
    op, x, y = tree
    x, yv = _value(x, env), _value(y, env)
    if op in ("floordiv", "mod"):
        yv = abs(y) + 1 if isinstance(y, int) else 3
    return {"add": x + yv, "sub": x - yv, "mul": x * yv, "floordiv": x // yv if op == "floordiv" else 0,
            "mod": x % yv if op == "mod" else 0, "max": max(x, yv), "min": min(x, yv)}[op]


@settings(max_examples=60, deadline=None)
@given(index=_index_exprs(3), guard=_index_exprs(2), cmp=st.sampled_from(["lt", "le", "eq", "ne"]),
       bound=st.integers(-2, 6), truth=st.booleans())
def test_exact_range_equals_enumeration(index, guard, cmp, bound, truth):
    """The exact range over a guarded 5 x 6 grid is the minimum and maximum of
    the index over the grid points where the guard holds (or None)."""
    a, b = axis("a", 5), axis("b", 6)
    env = {"a": a, "b": b}
    g = _build(guard, env)
    cond = {"lt": g < bound, "le": g <= bound, "eq": te.equal(g, bound), "ne": te.not_equal(g, bound)}[cmp]
    assume(not isinstance(cond, Const))        # te folds a select on a constant condition away
    test = {"lt": lambda v: v < bound, "le": lambda v: v <= bound, "eq": lambda v: v == bound,
            "ne": lambda v: v != bound}[cmp]
    values = [_value(index, {"a": x, "b": y}) for x, y in itertools.product(range(5), range(6))
              if test(_value(guard, {"a": x, "b": y})) == truth]
    got = reach(_build(index, env), scope_of(a, b).guarded(cond, truth))
    if not values:
        assert got is None
    else:
        assert (got.lo, got.hi) == (min(values), max(values))
        for end, point in ((got.lo, got.at_lo), (got.hi, got.at_hi)):
            assert _value(index, dict(point)) == end and test(_value(guard, dict(point))) == truth


# ------------------------------------------------------------ te.build


def test_build_refuses_a_read_past_the_end():
    A = te.placeholder((10,), "float32", "A")
    B = te.compute((10,), lambda i: A[i + 1], name="B")
    with pytest.raises(IndexError, match=r"'B' reads 'A'.*dimension 0.*i \+ 1.*\[1, 10\]"):
        te.build([A], [B])


def test_a_packed_triangle_read_through_its_quadratic_index():
    """GMM's strictly lower triangle, packed column by column and unpacked
    under ``c < r`` as its README states it; the error for the unguarded
    read names its reachable range and a point that leaves the tensor."""
    K, D = 3, 5
    n = D * (D - 1) // 2
    l = te.placeholder((K, n), "float64", "l")
    L = te.compute((K, D, D), lambda k, r, c: te.if_then_else(c < r, l[k, c * (2 * D - c - 1) // 2 + r - c - 1],
                                                                  0.0), name="L")
    lv = np.random.default_rng(5).standard_normal((K, n))
    want = np.zeros((K, D, D))
    rows, cols = np.tril_indices(D, -1)
    order = np.lexsort((rows, cols))                    # column by column
    want[:, rows[order], cols[order]] = lv
    np.testing.assert_array_equal(te.build([l], [L])(lv), want)
    bad = te.compute((K, D, D), lambda k, r, c: l[k, c * (2 * D - c - 1) // 2 + r - c - 1], name="bad")
    with pytest.raises(IndexError, match=r"'bad' reads 'l'.*dimension 1.*reaches \[-1, 9\].*"
                                         r"\(it is -1 at k = 0, r = 0, c = 0\)"):
        te.build([l], [bad])


@pytest.mark.parametrize("name,make", [
    ("equal", lambda x, i: te.if_then_else(te.equal(i, 0), x[0], x[i - 1])),
    ("not_equal", lambda x, i: te.if_then_else(te.not_equal(i, 0), x[i - 1], x[0])),
    ("any", lambda x, i: te.if_then_else(te.any(te.equal(i, 0), i > 8), x[0], x[i - 1])),
    ("not", lambda x, i: te.if_then_else(te.not_(te.equal(i, 0)), x[i - 1], x[0])),
    ("product", lambda x, i: te.if_then_else(i * i > 0, x[i - 1], x[0]))])
def test_equality_and_other_conditions_keep_their_branches_in_range(name, make):
    """A shift right by one with the first element repeated, guarded each way a user writes it."""
    X = te.placeholder((9,), "float64", "X")
    Y = te.compute((9,), lambda i: make(X, i), name="Y")
    x = np.random.default_rng(3).standard_normal(9)
    np.testing.assert_array_equal(te.build([X], [Y])(x), np.r_[x[0], x[:-1]])


def test_build_refuses_a_read_through_an_inlined_tensor():
    A = te.placeholder((10,), "float32", "A")
    T = te.compute((10,), lambda i: A[i] * 2.0, name="T")
    B = te.compute((10,), lambda i: T[9 - i + 1], name="B")
    with pytest.raises(IndexError, match="'B' reads 'T'"):
        te.build([A], [B])


def test_build_refuses_an_unguarded_padding_read():
    X = te.placeholder((8,), "float32", "X")
    k = te.reduce_axis(3, "k")
    out = te.compute((8,), lambda i: te.sum(X[i + k - 1], axis=k), name="out")
    with pytest.raises(IndexError, match="dimension 0"):
        te.build([X], [out])


def test_padding_guard_with_te_all():
    H, P, K, S, D = 9, 2, 3, 2, 2
    OH = (H + 2 * P - D * (K - 1) - 1) // S + 1
    X = te.placeholder((H,), "float64", "X")
    k = te.reduce_axis(K, "k")

    def body(i):
        h = i * S + k * D - P
        return te.sum(te.if_then_else(te.all(h >= 0, h < H), X[h], 0.0), axis=k)

    out = te.compute((OH,), body, name="out")
    x = np.arange(1.0, H + 1)
    xp = np.pad(x, P)
    expected = [sum(xp[i * S + kk * D] for kk in range(K)) for i in range(OH)]
    np.testing.assert_allclose(te.build([X], [out])(x), expected)


def test_concatenation_never_evaluates_the_other_branch():
    """The B index is ~1e12 elements away whenever the A branch is taken: reading it would crash."""
    n, m = 5, 4
    A, B = te.placeholder((n,), "float64", "A"), te.placeholder((m,), "float64", "B")
    far = te.const(10 ** 12, I64)
    cat = te.compute((n + m,), lambda i: te.if_then_else(
        i < n, A[i], B[i - n + far * te.maximum(n - i, 0)]), name="cat")
    kernel = te.build([A, B], [cat])
    assert "if i < 5" in kernel.loop_ir
    a, b = np.arange(n, dtype="float64"), np.arange(10.0, 10 + m)
    np.testing.assert_array_equal(kernel(a, b), np.concatenate([a, b]))


def test_flatten_and_unflatten_with_floor_division_and_modulo():
    x = np.random.default_rng(0).standard_normal((3, 4, 5))
    X = te.placeholder(x.shape, "float64", "X")
    flat = te.compute((60,), lambda q: X[q // 20, q // 5 % 4, q % 5], name="flat")
    back = te.compute((3, 4, 5), lambda a, b, c: flat[a * 20 + b * 5 + c], name="back")
    f, b = te.build([X], [flat, back])(x)
    np.testing.assert_array_equal(f, x.reshape(-1))
    np.testing.assert_array_equal(b, x)


def test_strided_dilated_conv_window_without_padding():
    H, K, S, D = 11, 3, 2, 3
    OH = (H - D * (K - 1) - 1) // S + 1
    X = te.placeholder((H,), "float64", "X")
    k = te.reduce_axis(K, "k")
    out = te.compute((OH,), lambda i: te.sum(X[i * S + k * D], axis=k), name="out")
    x = np.arange(1.0, H + 1)
    np.testing.assert_allclose(te.build([X], [out])(x), [sum(x[i * S + kk * D] for kk in range(K))
                                                         for i in range(OH)])


def test_reduction_domain_from_outer_variables_is_in_bounds():
    """Full correlation: out[i] = sum over k in [max(0, i - 2), min(i, n - 1)] of X[i - k] * W[k - i + 2]."""
    n = 6
    X, W = te.placeholder((n,), "float64", "X"), te.placeholder((3,), "float64", "W")

    def body(i):
        k = var("k")
        lo = te.maximum(i - 2, 0)
        return reduce("sum", X[i - k] * W[k - i + 2], [k], [(lo, te.minimum(i, n - 1) - lo + 1)])

    out = te.compute((n,), body, name="out")
    x, w = np.arange(1.0, n + 1), np.array([1.0, 10.0, 100.0])
    expected = [sum(x[i - k] * w[k - i + 2] for k in range(max(0, i - 2), i + 1)) for i in range(n)]
    np.testing.assert_allclose(te.build([X, W], [out])(x, w), expected)


# ------------------------------------------------------------ run time


def test_gather_and_run_time_index_error():
    X = te.placeholder((10, 3), "float32", "X")
    idx = te.placeholder((4,), "int32", "idx")
    G = te.compute((4, 3), lambda t, c: X[idx[t], c], name="G")
    kernel = te.build([X, idx], [G])
    assert "X dim 0" in kernel.loop_ir and "X dim 1" not in kernel.loop_ir    # c is proven at build
    x = np.arange(30, dtype="float32").reshape(10, 3)
    np.testing.assert_array_equal(kernel(x, np.array([3, 1, 9, 3], "int32")), x[[3, 1, 9, 3]])
    with pytest.raises(IndexError, match=r"index 10 .*dimension 0 of tensor 'X'"):
        kernel(x, np.array([3, 10, 0, 0], "int32"))
    with pytest.raises(IndexError, match=r"index -1 .*'X'"):
        kernel(x, np.array([0, 0, -1, 0], "int32"))


def test_guarded_data_dependent_read_is_checked_only_when_taken():
    X = te.placeholder((5,), "float64", "X")
    idx = te.placeholder((6,), "int64", "idx")
    G = te.compute((6,), lambda t: te.if_then_else(te.all(idx[t] >= 0, idx[t] < 5), X[idx[t]], -1.0),
                   name="G")
    x = np.arange(5.0)
    ids = np.array([0, -3, 4, 5, 100, 2])
    np.testing.assert_array_equal(te.build([X, idx], [G])(x, ids), np.where((ids >= 0) & (ids < 5),
                                                                             x[np.clip(ids, 0, 4)], -1))


def test_gather_through_an_inlined_tensor_checks_its_extent():
    X = te.placeholder((6,), "float64", "X")
    idx = te.placeholder((3,), "int32", "idx")
    Y = te.compute((4,), lambda i: X[i] + 1.0, name="Y")          # inlined, smaller than X
    G = te.compute((3,), lambda t: Y[idx[t]], name="G")
    kernel = te.build([X, idx], [G])
    np.testing.assert_array_equal(kernel(np.arange(6.0), np.array([0, 3, 1], "int32")), [1.0, 4.0, 2.0])
    with pytest.raises(IndexError, match="tensor 'Y'"):
        kernel(np.arange(6.0), np.array([0, 4, 1], "int32"))


def test_nested_guards_through_an_inlined_tensor():
    """The inner guard equals the outer one: the inner read must stay behind a branch."""
    n = 6
    X = te.placeholder((n - 1,), "float64", "X")
    T = te.compute((n,), lambda a: te.if_then_else(a >= 1, X[a - 1], 0.0), name="T")
    out = te.compute((n,), lambda i: te.if_then_else(i >= 1, T[i] * 2.0, -1.0), name="out")
    x = np.arange(1.0, n)
    np.testing.assert_array_equal(te.build([X], [out])(x), np.r_[-1.0, 2 * x])
