"""Every scalar operator, intrinsic, cast and condition, compiled and compared with numpy."""
import numpy as np
import pytest

import te_autodiff as te

N = 37                                   # odd: exercises vector bodies and remainders
DTYPES = ["float32", "float64", "int32", "int64"]
FLOATS = ["float32", "float64"]
RTOL = {"float32": 2e-6, "float64": 1e-13}


def samples(dtype, rng, positive=False, nonzero=False):
    if dtype == "bool":
        return rng.random(N) < 0.5
    if dtype.startswith("int"):
        v = rng.integers(1 if positive else -20, 21, N).astype(dtype)
        return np.where(v == 0, 3, v).astype(dtype) if nonzero else v
    v = rng.uniform(0.1 if positive else -4.0, 4.0, N).astype(dtype)
    return np.where(np.abs(v) < 0.05, 0.5, v).astype(dtype) if nonzero else v


def run1(fn, dtypes, arrays):
    """Build ``out[i] = fn(x0[i], x1[i], ...)`` and run it."""
    xs = [te.placeholder((N,), d, f"x{n}") for n, d in enumerate(dtypes)]
    out = te.compute((N,), lambda i: fn(*[x[i] for x in xs]), name="out")
    return te.build(xs, [out])(*arrays)


def check(actual, expected):
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    if actual.dtype.kind == "f":
        np.testing.assert_allclose(actual, expected, rtol=RTOL[actual.dtype.name], atol=0)
    else:
        np.testing.assert_array_equal(actual, expected)


BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "maximum": (te.maximum, np.maximum),
    "minimum": (te.minimum, np.minimum),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", BINARY)
def test_binary_arithmetic(op, dtype):
    rng = np.random.default_rng(0)
    a, b = samples(dtype, rng), samples(dtype, rng)
    ours, ref = BINARY[op]
    check(run1(ours, [dtype, dtype], [a, b]), ref(a, b))


@pytest.mark.parametrize("dtype", DTYPES)
def test_floor_division_and_modulo_follow_numpy(dtype):
    rng = np.random.default_rng(1)
    a, b = samples(dtype, rng), samples(dtype, rng, nonzero=True)
    a[:4] = np.array([-7, 7, -7, 7], dtype)
    b[:4] = np.array([2, -2, -2, 2], dtype)
    q, r = run1(lambda x, y: x // y, [dtype, dtype], [a, b]), run1(lambda x, y: x % y, [dtype, dtype], [a, b])
    np.testing.assert_array_equal(q, np.floor_divide(a, b))
    np.testing.assert_array_equal(r, np.mod(a, b))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_division_by_zero_and_overflow_do_not_trap(dtype):
    low = np.iinfo(dtype).min
    a = np.array([5, -5, low, low, 7], dtype)
    b = np.array([0, 0, -1, 1, -1], dtype)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(run_pair(lambda x, y: x // y, a, b), np.floor_divide(a, b))
        np.testing.assert_array_equal(run_pair(lambda x, y: x % y, a, b), np.mod(a, b))


def run_pair(fn, a, b):
    x, y = te.placeholder(a.shape, a.dtype.name, "x"), te.placeholder(b.shape, b.dtype.name, "y")
    out = te.compute(a.shape, lambda i: fn(x[i], y[i]), name="out")
    return te.build([x, y], [out])(a, b)


def test_float_floor_division_by_zero_matches_numpy():
    a = np.array([1.0, -1.0, 0.0, 5.5], "float64")
    b = np.zeros(4)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(run_pair(lambda x, y: x // y, a, b), np.floor_divide(a, b))
        np.testing.assert_array_equal(run_pair(lambda x, y: x % y, a, b), np.mod(a, b))


def test_floor_division_by_constants_on_index_variables():
    out = te.compute((12,), lambda i: (i - 6) // 4 * 100 + (i - 6) % 4 + (i - 6) // -4 * 10000
                     + (i - 6) % -4 * 1000000, name="out")
    i = np.arange(12) - 6
    np.testing.assert_array_equal(te.build([], [out])(),
                                  i // 4 * 100 + i % 4 + i // -4 * 10000 + i % -4 * 1000000)


@pytest.mark.parametrize("dtype", FLOATS)
def test_true_division_and_power(dtype):
    rng = np.random.default_rng(2)
    a, b = samples(dtype, rng, positive=True), samples(dtype, rng, nonzero=True)
    check(run1(lambda x, y: x / y, [dtype, dtype], [a, b]), a / b)
    check(run1(te.power, [dtype, dtype], [a, b]), np.power(a, b))


UNARY = {
    "exp": (te.exp, np.exp, False),
    "log": (te.log, np.log, True),
    "log1p": (te.log1p, np.log1p, True),
    "sqrt": (te.sqrt, np.sqrt, True),
    "tanh": (te.tanh, np.tanh, False),
    "sigmoid": (te.sigmoid, lambda v: 1 / (1 + np.exp(-v)), False),
    "sin": (te.sin, np.sin, False),
    "cos": (te.cos, np.cos, False),
    "abs": (te.abs, np.abs, False),
    "neg": (lambda v: -v, np.negative, False),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", UNARY)
def test_unary_intrinsics(op, dtype):
    ours, ref, positive = UNARY[op]
    a = samples(dtype, np.random.default_rng(3), positive=positive)
    check(run1(ours, [dtype], [a]), ref(a).astype(dtype))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_abs_neg_and_intrinsic_promotion(dtype):
    a = samples(dtype, np.random.default_rng(4))
    check(run1(te.abs, [dtype], [a]), np.abs(a))
    check(run1(lambda v: -v, [dtype], [a]), -a)
    check(run1(te.exp, [dtype], [a]), np.exp(a.astype("float32")))


CMP = {
    "lt": (lambda a, b: a < b, np.less),
    "le": (lambda a, b: a <= b, np.less_equal),
    "gt": (lambda a, b: a > b, np.greater),
    "ge": (lambda a, b: a >= b, np.greater_equal),
    "eq": (te.equal, np.equal),
    "ne": (te.not_equal, np.not_equal),
}


@pytest.mark.parametrize("dtype", DTYPES + ["bool"])
@pytest.mark.parametrize("op", CMP)
def test_comparisons(op, dtype):
    rng = np.random.default_rng(5)
    a, b = samples(dtype, rng), samples(dtype, rng)
    b[:5] = a[:5]                                           # equal pairs too
    ours, ref = CMP[op]
    check(run1(ours, [dtype, dtype], [a, b]), ref(a, b))


def test_float_comparisons_with_nan_follow_numpy():
    a = np.array([np.nan, 1.0, np.nan, 2.0])
    b = np.array([1.0, np.nan, np.nan, 2.0])
    for op, (ours, ref) in CMP.items():
        np.testing.assert_array_equal(run_pair(ours, a, b), ref(a, b), err_msg=op)


@pytest.mark.parametrize("src", DTYPES + ["bool"])
@pytest.mark.parametrize("dst", DTYPES + ["bool"])
def test_casts_match_numpy_astype(src, dst):
    a = samples(src, np.random.default_rng(6))
    if src.startswith("float"):
        a[:4] = np.array([-2.7, 2.7, -0.5, 0.0], src)       # truncation toward zero
    check(run1(lambda v: v.astype(dst), [src], [a]), a.astype(dst))


def test_bool_arithmetic_promotes_to_int32():
    rng = np.random.default_rng(7)
    a, b = samples("bool", rng), samples("bool", rng)
    check(run1(lambda x, y: x + y, ["bool", "bool"], [a, b]), a.astype("int32") + b.astype("int32"))


def test_logic_all_any_not_and_select():
    rng = np.random.default_rng(8)
    a, b = samples("float64", rng), samples("float64", rng)
    check(run1(lambda x, y: te.all(x > 0, y > 0, x < y), ["float64"] * 2, [a, b]),
          (a > 0) & (b > 0) & (a < b))
    check(run1(lambda x, y: te.any(x > 1, y > 1), ["float64"] * 2, [a, b]), (a > 1) | (b > 1))
    check(run1(lambda x, y: te.not_(x > y), ["float64"] * 2, [a, b]), ~(a > b))
    check(run1(lambda x, y: te.if_then_else(x > y, x * 2.0, te.exp(y)), ["float64"] * 2, [a, b]),
          np.where(a > b, a * 2, np.exp(b)))


def test_select_on_bool_and_int_values():
    rng = np.random.default_rng(9)
    a, b, c = samples("bool", rng), samples("int32", rng), samples("int32", rng)
    check(run1(lambda p, x, y: te.if_then_else(p, x, y), ["bool", "int32", "int32"], [a, b, c]),
          np.where(a, b, c))
    out = run1(lambda p, x: te.if_then_else(p, x > 0, p), ["bool", "int32"], [a, b])
    np.testing.assert_array_equal(out, np.where(a, b > 0, a))      # bool branches promote to int32


def test_logic_short_circuits_guarded_reads():
    """``te.all(i < n, X[i] > 0)`` must not read X past its end."""
    n = 5
    X = te.placeholder((n,), "float32", "X")
    out = te.compute((n + 3,), lambda i: te.all(i < n, X[i] > 0.0).astype("int32")
                     + 2 * te.any(i >= n, X[i] < 0.0).astype("int32"), name="out")
    x = np.array([1, -1, 2, -2, 0], "float32")
    expected = np.array([1, 2, 1, 2, 0, 2, 2, 2], "int32")
    np.testing.assert_array_equal(te.build([X], [out])(x), expected)


def test_constants_index_arithmetic_and_zero_dim_tensors():
    X = te.placeholder((), "float64", "X")
    s = te.compute((), lambda: X[()] * 2.0 + 1.0, name="s")
    np.testing.assert_array_equal(te.build([X], [s])(np.array(3.0)), np.array(7.0))
    idx = te.compute((3, 4), lambda i, j: i * 10 + j - te.const(1, "int64"), name="idx")
    np.testing.assert_array_equal(te.build([], [idx])(), np.arange(3)[:, None] * 10 + np.arange(4) - 1)
