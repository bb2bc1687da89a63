"""The operator table (te_autodiff/ops.py): every operator of SPEC in float32
and float64 against numpy/scipy, its constant folding, its derivative
against finite differences and closed forms, clip's and the rounding
functions' derivatives, the fuzzer's operator lists, and an operator added
by one table entry."""
import math

import numpy as np
import pytest

import te_autodiff as te
from te_autodiff import ops
from te_autodiff.ops import OPS

# the reference of each public function of one operand, in float64
REFERENCE = {
    "abs": np.abs, "exp": np.exp, "expm1": np.expm1, "exp2": np.exp2, "log": np.log, "log1p": np.log1p,
    "log2": np.log2, "log10": np.log10, "sqrt": np.sqrt, "rsqrt": lambda v: 1 / np.sqrt(v), "tanh": np.tanh,
    "sigmoid": lambda v: np.where(v >= 0, 1, np.exp(-np.abs(v))) / (1 + np.exp(-np.abs(v))), "sinh": np.sinh, "cosh": np.cosh, "erf": np.vectorize(math.erf), "erfc": np.vectorize(math.erfc), "sin": np.sin,
    "cos": np.cos, "tan": np.tan, "atan": np.arctan, "asin": np.arcsin, "acos": np.arccos, "floor": np.floor,
    "ceil": np.ceil, "trunc": np.trunc, "round": np.round, "sign": np.sign,
}
UNARY = sorted(op.public for op in OPS.values() if op.arity == 1 and op.public)
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0, 1e-40, -1e-40, 1e30, -1e30]


def test_every_public_operator_is_exported_and_has_a_reference():
    assert set(UNARY) == set(REFERENCE)
    spec = {"exp", "log", "log1p", "sqrt", "tanh", "sigmoid", "sin", "cos", "abs", "power", "erf", "erfc",
            "expm1", "exp2", "log2", "log10", "rsqrt", "tan", "atan", "asin", "acos", "sinh", "cosh", "floor",
            "ceil", "round", "trunc", "sign", "atan2", "clip", "maximum", "minimum"}
    assert spec <= set(te.__all__) and all(callable(getattr(te, name)) for name in spec)
    assert te.erf.__doc__ == OPS["erf"].doc


def _apply(name, dtype, *arrays):
    ps = [te.placeholder(a.shape, dtype, f"a{k}") for k, a in enumerate(arrays)]
    y = te.compute(arrays[0].shape, lambda i: getattr(te, name)(*[p[i] for p in ps]), name="y")
    return te.build(ps, [y])(*arrays)


def _same(got, want, ulps):
    """Equal as numpy's (zeros' signs and NaN included) or within ``ulps`` of it."""
    dtype = got.dtype
    with np.errstate(all="ignore"):
        got, want = got.astype(np.float64), want.astype(dtype).astype(np.float64)
        exact = (got == want) & (np.signbit(got) == np.signbit(want)) | (np.isnan(got) & np.isnan(want))
        near = np.abs(got - want) <= ulps * np.spacing(np.abs(want).astype(dtype)).astype(np.float64)
    return exact | np.isfinite(want) & (want != 0) & near


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", UNARY)
def test_every_function_agrees_with_numpy(name, dtype):
    """Random arguments of three scales and the special values: within 4 ulp
    of numpy/scipy (the tests of test_math_bodies.py bound each one tighter),
    zeros, infinities and NaN as numpy's."""
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.standard_normal(2000) * s for s in (0.5, 3, 300)] + [SPECIAL]).astype(dtype)
    with np.errstate(all="ignore"):
        want = REFERENCE[name](x.astype(np.float64))
    ok = _same(_apply(name, dtype, x), want, 4)
    assert ok.all(), list(zip(x[~ok], _apply(name, dtype, x)[~ok], want[~ok]))[:4]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_atan2_power_and_clip_agree_with_numpy(dtype):
    """Every pair of special values and random pairs; clip's bounds in either order.
    atan2 counts a zero as +0 (te's arithmetic may drop a zero's sign)."""
    rng = np.random.default_rng(12)
    grid = np.array(SPECIAL + [2.0, -3.0, 3.0])
    y, x = (a.ravel() for a in np.meshgrid(grid, grid))
    y = np.concatenate([y, rng.standard_normal(3000) * 3])
    x = np.concatenate([x, rng.standard_normal(3000) * 3])
    y, x = y.astype(dtype), x.astype(dtype)
    with np.errstate(all="ignore"):
        for name, ref in (("atan2", lambda a, b: np.arctan2(a + 0.0, b + 0.0)), ("power", np.power)):
            ok = _same(_apply(name, dtype, y, x), ref(y.astype(np.float64), x.astype(np.float64)), 3)
            assert ok.all(), (name, list(zip(y[~ok], x[~ok]))[:4])
    lo, hi = rng.standard_normal((2, x.size)).astype(dtype)
    np.testing.assert_array_equal(_apply("clip", dtype, x, lo, hi), np.clip(x, lo, hi))


@pytest.mark.parametrize("name", UNARY + ["atan2", "power"])
def test_constants_fold_to_the_python_value(name):
    """``te.erf(0.5)`` folds (the table's fold) to the float64 value numpy gives;
    a pole or an overflow is left to run time."""
    args = (0.75, 1.25) if name in ("atan2", "power") else (0.5,)
    e = getattr(te, name)(*[te.const(a, "float64") for a in args])
    assert isinstance(e, te.Expr) and type(e).__name__ == "Const"
    ref = {"atan2": np.arctan2, "power": np.power}.get(name) or REFERENCE[name]
    assert e.value == pytest.approx(float(ref(*args)), rel=1e-15)
    assert type(te.log(te.const(0.0, "float64"))).__name__ == "Unary"
    assert type(te.exp2(te.const(2000.0, "float64"))).__name__ == "Unary"


# derivative of each function of one operand in closed form, and arguments inside its domain
CLOSED_FORM = {
    "erf": lambda x: 2 / np.sqrt(np.pi) * np.exp(-x * x), "erfc": lambda x: -2 / np.sqrt(np.pi) * np.exp(-x * x),
    "expm1": np.exp, "exp2": lambda x: np.exp2(x) * np.log(2), "log2": lambda x: 1 / (x * np.log(2)),
    "log10": lambda x: 1 / (x * np.log(10)), "rsqrt": lambda x: -0.5 * x ** -1.5,
    "tan": lambda x: 1 / np.cos(x) ** 2, "atan": lambda x: 1 / (1 + x * x),
    "asin": lambda x: 1 / np.sqrt(1 - x * x), "acos": lambda x: -1 / np.sqrt(1 - x * x),
    "sinh": np.cosh, "cosh": np.sinh,
}


@pytest.mark.parametrize("name", sorted(CLOSED_FORM))
def test_derivatives_match_closed_forms_and_finite_differences(name):
    rng = np.random.default_rng(13)
    lo, hi = OPS[name].domain
    x = rng.uniform(max(lo, -3.0), min(hi, 3.0), 64)
    X = te.placeholder((64,), "float64", "x")
    Y = te.compute((64,), lambda i: getattr(te, name)(X[i]), name="y")
    grad, = te.check_gradient(Y, [X], [x], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(grad, CLOSED_FORM[name](x), rtol=1e-13)


def test_atan2_derivative_is_x_and_minus_y_over_the_squared_radius():
    """And 0 at the origin (PyTorch's choice; the formula gives 0/0)."""
    rng = np.random.default_rng(14)
    y, x = rng.standard_normal((2, 50))
    Y, X = te.placeholder((50,), "float64", "y"), te.placeholder((50,), "float64", "x")
    A = te.compute((50,), lambda i: te.atan2(Y[i], X[i]), name="a")
    dy, dx = te.check_gradient(A, [Y, X], [y, x], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(dy, x / (x * x + y * y), rtol=1e-14)
    np.testing.assert_allclose(dx, -y / (x * x + y * y), rtol=1e-14)
    at_origin = te.build([Y, X], te.gradient(A, [Y, X]))(np.zeros(50), np.zeros(50))
    np.testing.assert_array_equal(at_origin, 0.0)                  # PyTorch's subgradient, not 0/0


@pytest.mark.parametrize("name", ["floor", "ceil", "trunc", "round", "sign"])
def test_rounding_functions_and_sign_have_derivative_zero(name):
    x = np.random.default_rng(15).standard_normal(40) * 3
    X = te.placeholder((40,), "float64", "x")
    Y = te.compute((40,), lambda i: getattr(te, name)(X[i]) * X[i], name="y")
    dx, = te.build([X], te.gradient(Y, [X]))(x),
    np.testing.assert_array_equal(dx, REFERENCE[name](x))       # d(f(x) x) = f(x) where f' = 0


def test_clip_passes_the_gradient_inside_and_to_the_bound_taken():
    """x's gradient where lo < x < hi; lo's where x <= lo, hi's where x >= hi
    (numpy's value: hi wherever lo > hi), against numpy masks."""
    rng = np.random.default_rng(16)
    x, lo = rng.standard_normal((2, 200))
    hi = lo + rng.uniform(-0.5, 2, 200)
    x[:3], lo[:3], hi[:3] = [0.5, 1.0, 2.0], [0.5, 0.0, 0.0], [1.0, 1.0, 1.0]     # ties
    P = [te.placeholder((200,), "float64", n) for n in ("x", "lo", "hi")]
    C = te.compute((200,), lambda i: te.clip(*[p[i] for p in P]), name="c")
    h = rng.standard_normal(200)
    H = te.placeholder((200,), "float64", "h")
    value, *grads = te.build(P + [H], [C] + te.gradient(C, P, head=H))(x, lo, hi, h)
    np.testing.assert_array_equal(value, np.clip(x, lo, hi))
    inside = (lo < x) & (x < hi)
    to_hi = np.maximum(lo, x) >= hi
    np.testing.assert_array_equal(grads[0], np.where(inside, h, 0))
    np.testing.assert_array_equal(grads[1], np.where(~inside & ~to_hi, h, 0))
    np.testing.assert_array_equal(grads[2], np.where(to_hi, h, 0))
    assert grads[0][0] == grads[0][1] == grads[0][2] == 0         # a tie passes nothing to x


def test_the_fuzzer_draws_every_operator_of_the_table():
    """fuzz/ reads its operator lists from the table: 300 programs use every
    operator (an operator added to the table is fuzzed without an edit there)."""
    from fuzz.programs import BINARY_OPS, generate
    assert set(BINARY_OPS) == {op.name for op in OPS.values() if op.arity >= 2}
    spelled = {"fdiv": "floordiv", "fmod": "mod"}
    seen = set()
    for seed in range(300):
        for feature in generate(seed).features:
            kind, _, op = feature.partition(":")
            if kind in ("unary", "binary", "call"):
                seen.add(spelled.get(op, op))
            elif kind == "pow":
                seen.add("pow")
    assert seen == set(OPS)


def test_an_operator_is_one_table_entry():
    """A newcomer's operator, cbrt (libm's cbrt per lane, no body): the entry
    alone gives te.<name>, folding, the derivative, printing and lowering in
    both dtypes."""
    ops._unary("cbrt", lambda v: math.copysign(abs(v) ** (1 / 3), v), lambda e, g: g / (3 * e * e),
               "The cube root.", work=ops.TRANSCENDENTAL, libm=("cbrtf", "cbrt"))
    try:
        cbrt = ops.public_function(OPS["cbrt"])
        assert cbrt(te.const(8.0, "float64")).value == pytest.approx(2.0)
        x = np.random.default_rng(17).uniform(0.5, 3, 30)
        X = te.placeholder((30,), "float64", "x")
        Y = te.compute((30,), lambda i: cbrt(X[i]), name="y")
        assert "cbrt(x[i])" in te.pretty(Y)
        grad, = te.check_gradient(Y, [X], [x])
        np.testing.assert_allclose(grad, x ** (-2 / 3) / 3, rtol=1e-12)
        X32 = te.placeholder((30,), "float32", "x")
        np.testing.assert_allclose(te.build([X32], [te.compute((30,), lambda i: cbrt(X32[i]))])(
            x.astype(np.float32)), np.cbrt(x), rtol=1e-6)
    finally:
        del OPS["cbrt"]


def test_the_runtime_and_the_inliner_read_the_work_of_the_table():
    from lowering import lower as lowering_lower
    X = te.placeholder((8,), "float32", "x")
    for name, expected in (("erf", math.inf), ("floor", 1), ("rsqrt", 2)):
        y = te.compute((8,), lambda i: getattr(te, name)(X[i]))
        assert lowering_lower._op_work(y.body) == expected == OPS[name].work
    assert ops.is_transcendental("atan2") and not ops.is_transcendental("sign")
    assert not ops.is_transcendental("lt")
