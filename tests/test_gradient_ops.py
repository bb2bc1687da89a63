"""Every scalar operator, intrinsic, cast and reduction: gradient vs finite differences,
vs a hand-written numpy derivative, vs the optimize=False oracle, and in float32."""
import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import te_autodiff as te
from conftest import assert_close, build_grad, run, time_limit

pytestmark = pytest.mark.aarch64          # all of it runs in .ci/aarch64 (emulated AArch64)

SHAPE = (3, 4)


def sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def away_from_zero(rng, shape, lo=0.3, hi=2.0):
    """Values with |v| in [lo, hi] and random signs."""
    return rng.uniform(lo, hi, shape) * rng.choice([-1.0, 1.0], shape)


@dataclass
class Case:
    """A program ``make(dtype) -> (inputs, out)`` with numpy forward and backward references."""
    name: str
    make: Callable              # dtype -> (list of placeholders, output tensor)
    sample: Callable            # rng -> list of float64 arrays for the inputs
    forward: Callable           # *values -> numpy output
    backward: Callable          # head, *values -> list of numpy gradients
    rtol: float = 1e-6


def elementwise(name, fn, np_fn, np_grads, sample, n_in=1, **kw):
    """``out[i, j] = fn(x[i, j], y[i, j], ...)``; ``np_grads(*values)`` are the partials."""
    def make(dtype):
        xs = [te.placeholder(SHAPE, dtype, name) for name in "xyz"[:n_in]]
        return xs, te.compute(SHAPE, lambda i, j: fn(*(x[i, j] for x in xs)), name="out")

    def backward(h, *v):
        return [h * d for d in np_grads(*v)]

    return Case(name, make, sample, np_fn, backward, **kw)


def unary(name, fn, np_fn, np_grad, lo=-2.0, hi=2.0, **kw):
    return elementwise(name, fn, np_fn, lambda x: [np_grad(x) * np.ones_like(x)],
                       lambda rng: [rng.uniform(lo, hi, SHAPE)], **kw)


def binary(name, fn, np_fn, np_grads, sample=None, **kw):
    sample = sample or (lambda rng: [rng.uniform(-2, 2, SHAPE), away_from_zero(rng, SHAPE)])
    return elementwise(name, fn, np_fn, np_grads, sample, n_in=2, **kw)


def floor_samples(rng):
    """x, y with x / y at least 0.2 away from an integer, both signs."""
    y = away_from_zero(rng, SHAPE, 0.5, 2.0)
    x = y * (rng.integers(-3, 4, SHAPE) + rng.uniform(0.2, 0.8, SHAPE))
    return [x, y]


def distinct_pair(rng):
    x = rng.uniform(-2, 2, SHAPE)
    return [x, x + away_from_zero(rng, SHAPE, 0.1, 1.0)]


UNARY_CASES = [
    unary("neg", lambda a: -a, np.negative, lambda x: -1.0),
    unary("exp", te.exp, np.exp, np.exp),
    unary("log", te.log, np.log, lambda x: 1 / x, 0.3, 3.0),
    unary("log1p", te.log1p, np.log1p, lambda x: 1 / (1 + x), -0.5, 2.0),
    unary("sqrt", te.sqrt, np.sqrt, lambda x: 0.5 / np.sqrt(x), 0.3, 3.0),
    unary("tanh", te.tanh, np.tanh, lambda x: 1 - np.tanh(x) ** 2),
    unary("sigmoid", te.sigmoid, sig, lambda x: sig(x) * (1 - sig(x)), -4.0, 4.0),
    unary("sin", te.sin, np.sin, np.cos, -3.0, 3.0),
    unary("cos", te.cos, np.cos, lambda x: -np.sin(x), -3.0, 3.0),
    elementwise("abs", te.abs, np.abs, lambda x: [np.sign(x)], lambda rng: [away_from_zero(rng, SHAPE)]),
    unary("square", lambda a: a ** 2, np.square, lambda x: 2 * x),
    unary("cube_mixed_sign", lambda a: te.power(a, 3), lambda x: x ** 3, lambda x: 3 * x ** 2),
    unary("power_const", lambda a: te.power(a, 2.5), lambda x: x ** 2.5, lambda x: 2.5 * x ** 1.5, 0.3, 2.0),
    unary("const_pow_x", lambda a: 2.0 ** a, lambda x: 2.0 ** x, lambda x: np.log(2.0) * 2.0 ** x),
    unary("reciprocal", lambda a: 1.0 / a, lambda x: 1 / x, lambda x: -1 / x ** 2, 0.5, 2.0),
    unary("polynomial", lambda a: 3.0 * a * a - a / 2.0 + 1.0 - (4.0 - a),
          lambda x: 3 * x * x - x / 2 + 1 - (4 - x), lambda x: 6 * x - 0.5 + 1),
    unary("composite", lambda a: te.exp(te.sin(a)) * te.tanh(a), lambda x: np.exp(np.sin(x)) * np.tanh(x),
          lambda x: np.exp(np.sin(x)) * (np.cos(x) * np.tanh(x) + 1 - np.tanh(x) ** 2)),
]

BINARY_CASES = [
    binary("add", lambda a, b: a + b, np.add, lambda x, y: [1.0 + 0 * x, 1.0 + 0 * y]),
    binary("sub", lambda a, b: a - b, np.subtract, lambda x, y: [1.0 + 0 * x, -1.0 + 0 * y]),
    binary("mul", lambda a, b: a * b, np.multiply, lambda x, y: [y, x]),
    binary("div", lambda a, b: a / b, np.divide, lambda x, y: [1 / y, -x / y ** 2]),
    binary("floordiv", lambda a, b: a // b, np.floor_divide, lambda x, y: [0 * x, 0 * y], floor_samples),
    binary("mod", lambda a, b: a % b, np.mod, lambda x, y: [1.0 + 0 * x, -np.floor(x / y)], floor_samples),
    binary("maximum", te.maximum, np.maximum, lambda x, y: [1.0 * (x > y), 1.0 * (x < y)], distinct_pair),
    binary("minimum", te.minimum, np.minimum, lambda x, y: [1.0 * (x < y), 1.0 * (x > y)], distinct_pair),
    binary("power", te.power, np.power, lambda x, y: [y * x ** (y - 1), x ** y * np.log(x)],
           lambda rng: [rng.uniform(0.3, 2.0, SHAPE), rng.uniform(-2, 2, SHAPE)]),
    binary("if_then_else", lambda a, b: te.if_then_else(a > b, a * b, a - b),
           lambda x, y: np.where(x > y, x * y, x - y),
           lambda x, y: [np.where(x > y, y, 1.0), np.where(x > y, x, -1.0)], distinct_pair),
    binary("select_alias_const_branch", lambda a, b: te.select(te.any(a < -1.0, b > 1.0), te.sin(a), 2.0),
           lambda x, y: np.where((x < -1) | (y > 1), np.sin(x), 2.0),
           lambda x, y: [np.where((x < -1) | (y > 1), np.cos(x), 0.0), 0 * y],
           lambda rng: [rng.choice([-1.5, -0.5, 0.5], SHAPE) + rng.uniform(-0.2, 0.2, SHAPE),
                        rng.choice([-0.5, 1.5], SHAPE) + rng.uniform(-0.2, 0.2, SHAPE)]),
    binary("maximum_relu_const", lambda a, b: te.maximum(a * b, 0.0), lambda x, y: np.maximum(x * y, 0),
           lambda x, y: [y * (x * y > 0), x * (x * y > 0)],
           lambda rng: [away_from_zero(rng, SHAPE), away_from_zero(rng, SHAPE)]),
]


def _astype_make(src, mid):
    """``out = (x.astype(mid) * 2 + y.astype(mid)) ** 2`` cast back to ``src``."""
    def make(dtype):
        x = te.placeholder(SHAPE, dtype, "x")
        y = te.placeholder(SHAPE, dtype, "y")
        other = mid if dtype == src else src
        out = te.compute(SHAPE, lambda i, j: ((x[i, j].astype(other) * 2.0 + y[i, j].astype(other)) ** 2)
                         .astype(dtype), name="out")
        return [x, y], out
    return make


CAST_CASES = [
    Case("astype_f64_f32_f64", _astype_make("float64", "float32"),
         lambda rng: [rng.uniform(-1, 1, SHAPE), rng.uniform(-1, 1, SHAPE)],
         lambda x, y: (2 * x + y) ** 2,
         lambda h, x, y: [h * 4 * (2 * x + y), h * 2 * (2 * x + y)], rtol=1e-5),
    Case("int_cast_is_constant", lambda dtype: _int_cast_make(dtype),
         lambda rng: [rng.uniform(-3, 3, SHAPE)],
         lambda x: x * np.trunc(x),
         lambda h, x: [h * np.trunc(x)]),
]


def _int_cast_make(dtype):
    x = te.placeholder(SHAPE, dtype, "x")
    return [x], te.compute(SHAPE, lambda i, j: x[i, j] * x[i, j].astype("int32"), name="out")


R = (3, 5)


def reduction(name, op, np_fwd, np_grad, sample, **kw):
    """``out[i] = op_k x[i, k]``; ``np_grad(x)`` is d out[i] / d x[i, k]."""
    def make(dtype):
        x = te.placeholder(R, dtype, "x")
        k = te.reduce_axis(R[1], name="k")
        return [x], te.compute((R[0],), lambda i: op(x, i, k), name="out")

    return Case(name, make, lambda rng: [sample(rng)], np_fwd, lambda h, x: [h[:, None] * np_grad(x)], **kw)


def first_argmax_onehot(x):
    hot = np.zeros_like(x)
    hot[np.arange(x.shape[0]), np.argmax(x, axis=1)] = 1.0
    return hot


def prod_grad(x):
    """d prod_k x[i, k] / d x[i, k] by explicit products of the other factors."""
    g = np.zeros_like(x)
    for i in range(x.shape[0]):
        for k in range(x.shape[1]):
            g[i, k] = np.prod(np.delete(x[i], k))
    return g


def prod_samples(rng):
    """Row 0 has no zero, row 1 one zero, row 2 two adjacent zeros."""
    x = away_from_zero(rng, R, 0.5, 1.5)
    x[1, 3] = 0.0
    x[2, 1] = x[2, 2] = 0.0
    return x


REDUCE_CASES = [
    reduction("sum", lambda x, i, k: te.sum(x[i, k] * x[i, k], axis=k), lambda x: (x * x).sum(1),
              lambda x: 2 * x, lambda rng: rng.uniform(-2, 2, R)),
    reduction("mean_nested", lambda x, i, k: te.sum(te.sin(x[i, k]), axis=k) / float(R[1]),
              lambda x: np.sin(x).mean(1), lambda x: np.cos(x) / R[1], lambda rng: rng.uniform(-2, 2, R)),
    reduction("max", lambda x, i, k: te.max(x[i, k], axis=k), lambda x: x.max(1), first_argmax_onehot,
              lambda rng: rng.permutation(np.linspace(-2, 2, 15)).reshape(R)),
    reduction("one_plus_max_times_x", lambda x, i, k: 1.0 + te.max(x[i, k], axis=k) * x[i, 0],
              lambda x: 1 + x.max(1) * x[:, 0],
              lambda x: first_argmax_onehot(x) * x[:, :1] + np.eye(1, R[1], 0) * x.max(1)[:, None],
              lambda rng: rng.permutation(np.linspace(-2, 2, 15)).reshape(R)),
    reduction("min", lambda x, i, k: te.min(x[i, k], axis=k), lambda x: x.min(1),
              lambda x: first_argmax_onehot(-x), lambda rng: rng.permutation(np.linspace(-2, 2, 15)).reshape(R)),
    reduction("prod", lambda x, i, k: te.prod(x[i, k], axis=k), lambda x: x.prod(1), prod_grad,
              lambda rng: away_from_zero(rng, R, 0.5, 1.5)),
    reduction("prod_with_zeros", lambda x, i, k: te.prod(x[i, k], axis=k), lambda x: x.prod(1), prod_grad,
              prod_samples),
    reduction("prod_of_squares_with_zeros", lambda x, i, k: te.prod(x[i, k] * x[i, k] + x[i, k], axis=k),
              lambda x: (x * x + x).prod(1), lambda x: prod_grad(x * x + x) * (2 * x + 1), prod_samples),
]


def _sum2_make(dtype):
    x = te.placeholder((2, 3, 4), dtype, "x")
    k, l = te.reduce_axis(3, "k"), te.reduce_axis(4, "l")
    return [x], te.compute((2,), lambda i: te.sum(te.exp(x[i, k, l]) * (l + 1).astype(dtype), axis=[k, l]),
                           name="out")


REDUCE_CASES.append(Case(
    "sum_two_axes", _sum2_make, lambda rng: [rng.uniform(-1, 1, (2, 3, 4))],
    lambda x: (np.exp(x) * np.arange(1, 5)).sum((1, 2)),
    lambda h, x: [h[:, None, None] * np.exp(x) * np.arange(1, 5)]))



def ranged(name, op, lo, hi, np_fwd, np_grad, sample):
    """``out[i] = op_k x[i, k]`` with ``k`` over ``range(lo, hi)`` only."""
    def make(dtype):
        x = te.placeholder(R, dtype, "x")
        k = te.reduce_axis((lo, hi), name="k")
        return [x], te.compute((R[0],), lambda i: op(x, i, k), name="out")

    def backward(h, x):
        g = np.zeros_like(x)
        g[:, lo:hi] = h[:, None] * np_grad(x[:, lo:hi])
        return [g]

    return Case(name, make, lambda rng: [sample(rng)], lambda x: np_fwd(x[:, lo:hi]), backward)


def _cumsum_make(dtype):
    x = te.placeholder(R, dtype, "x")
    k = te.reduce_axis(R[1], name="k")
    return [x], te.compute(R, lambda i, j: te.sum(te.if_then_else(k <= j, x[i, k] * x[i, k], 0.0), axis=k),
                           name="out")


def _triangle_make(dtype):
    x = te.placeholder(SHAPE, dtype, "x")
    return [x], te.compute(SHAPE, lambda i, j: te.if_then_else(j <= i, x[i, j] * x[i, j], -x[i, j]), name="out")


TRIANGLE = np.tril(np.ones(SHAPE, bool))
GUARD_CASES = [
    ranged("sum_offset_range", lambda x, i, k: te.sum(x[i, k] * x[i, k], axis=k), 1, 4,
           lambda x: (x * x).sum(1), lambda x: 2 * x, lambda rng: rng.uniform(-2, 2, R)),
    ranged("max_offset_range", lambda x, i, k: te.max(x[i, k], axis=k), 2, 5, lambda x: x.max(1),
           first_argmax_onehot, lambda rng: rng.permutation(np.linspace(-2, 2, 15)).reshape(R)),
    ranged("prod_offset_range_with_zeros", lambda x, i, k: te.prod(x[i, k], axis=k), 1, 4, lambda x: x.prod(1),
           prod_grad, prod_samples),
    reduction("prod_nested_with_zeros", lambda x, i, k: te.prod(x[i, k], axis=k) * x[i, 0] + 1.0,
              lambda x: x.prod(1) * x[:, 0] + 1,
              lambda x: prod_grad(x) * x[:, :1] + np.eye(1, R[1], 0) * x.prod(1)[:, None], prod_samples),
    reduction("min_nested", lambda x, i, k: x[i, 1] - te.min(x[i, k] * 2.0, axis=k),
              lambda x: x[:, 1] - 2 * x.min(1), lambda x: np.eye(1, R[1], 1) - 2 * first_argmax_onehot(-x),
              lambda rng: rng.permutation(np.linspace(-2, 2, 15)).reshape(R)),
    Case("cumsum_guarded", _cumsum_make, lambda rng: [rng.uniform(-2, 2, R)], lambda x: np.cumsum(x * x, 1),
         lambda h, x: [2 * x * np.cumsum(h[:, ::-1], 1)[:, ::-1]]),
    Case("triangular_select", _triangle_make, lambda rng: [rng.uniform(-2, 2, SHAPE)],
         lambda x: np.where(TRIANGLE, x * x, -x), lambda h, x: [h * np.where(TRIANGLE, 2 * x, -1.0)]),
]

ALL_CASES = UNARY_CASES + BINARY_CASES + CAST_CASES + REDUCE_CASES + GUARD_CASES


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.name)
def test_gradient_matches_numpy_and_naive(case):
    rng = np.random.default_rng(sum(map(ord, case.name)))
    values = case.sample(rng)
    xs, out = case.make("float64")
    head = rng.standard_normal(out.shape)
    r = build_grad(out, xs, values, head=head)
    assert r.fwd.dtype == np.float64
    assert_close(r.fwd, case.forward(*values), rtol=case.rtol, what="forward")
    expected = case.backward(head, *values)
    for g, x in zip(r.grads, xs):
        assert g.shape == x.shape and g.dtype == np.float64
    assert_close(r.grads, expected, rtol=case.rtol, atol=1e-9, what="te.gradient vs numpy")
    assert_close(r.naive, expected, rtol=case.rtol, atol=1e-9, what="optimize=False vs numpy")
    assert_close(r.grads, r.naive, rtol=1e-12, atol=1e-12, what="optimized vs naive")


def _check_gradient_params():
    for c in ALL_CASES:
        yield pytest.param(c, id=c.name)


@pytest.mark.parametrize("case", list(_check_gradient_params()))
def test_check_gradient(case):
    rng = np.random.default_rng(1 + sum(map(ord, case.name)))
    values = case.sample(rng)
    xs, out = case.make("float64")
    head = rng.standard_normal(out.shape)
    analytic = te.check_gradient(out, xs, values, head=head)
    assert_close(analytic, case.backward(head, *values), rtol=case.rtol, what="check_gradient result")


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.name)
def test_float32_close_to_float64_reference(case):
    rng = np.random.default_rng(2 + sum(map(ord, case.name)))
    values = case.sample(rng)
    xs, out = case.make("float32")
    assert all(x.dtype == "float32" for x in xs)
    head = rng.standard_normal(out.shape)
    r = build_grad(out, xs, values, head=head, naive=False)
    assert r.fwd.dtype == np.float32
    assert all(g.dtype == np.float32 for g in r.grads)
    v32 = [np.asarray(v, np.float32).astype(np.float64) for v in values]
    h32 = np.asarray(head, np.float32).astype(np.float64)
    scale = max(1.0, max(float(np.abs(e).max()) for e in case.backward(h32, *v32)))
    assert_close(r.fwd, case.forward(*v32), rtol=1e-4, atol=1e-4 * scale, what="float32 forward")
    assert_close(r.grads, case.backward(h32, *v32), rtol=1e-4, atol=1e-4 * scale, what="float32 gradient")


def test_check_gradient_without_head_is_gradient_of_sum():
    x = te.placeholder((5,), "float64", "x")
    out = te.compute((5,), lambda i: te.tanh(x[i]) * x[i], name="out")
    v = np.linspace(-1, 1, 5)
    g, = te.check_gradient(out, [x], [v])
    assert_close(g, np.tanh(v) + v * (1 - np.tanh(v) ** 2))


def test_float32_input_through_float64_cast():
    """A float32 placeholder used in float64 arithmetic gets a float32 gradient."""
    x = te.placeholder((4,), "float32", "x")
    out = te.compute((4,), lambda i: x[i].astype("float64") ** 2 * 0.5, name="out")
    assert out.dtype == "float64"
    v = np.array([0.5, -1.5, 2.0, 3.25], np.float32)
    head = np.array([1.0, 2.0, -1.0, 0.5])
    r = build_grad(out, [x], [v], head=head)
    assert r.grads[0].dtype == np.float32
    assert_close(r.grads, [head * v], rtol=1e-6)
    assert_close(r.naive, [head * v], rtol=1e-6)


def test_broadcast_read_accumulates_over_the_broadcast_axis():
    x = te.placeholder((3, 4), "float64", "x")
    y = te.placeholder((4,), "float64", "y")
    out = te.compute((3, 4), lambda i, j: x[i, j] * y[j] + y[j] * y[j], name="out")
    rng = np.random.default_rng(5)
    xv, yv, h = rng.standard_normal((3, 4)), rng.standard_normal(4), rng.standard_normal((3, 4))
    r = build_grad(out, [x, y], [xv, yv], head=h)
    expected = [h * yv, (h * xv).sum(0) + 2 * yv * h.sum(0)]
    assert_close(r.grads, expected)
    assert_close(r.naive, expected)
    te.check_gradient(out, [x, y], [xv, yv], head=h)


def test_same_tensor_read_at_two_offsets():
    """out[i] = x[i] * x[i + 1]: two reads of one input, gradients add up."""
    x = te.placeholder((6,), "float64", "x")
    out = te.compute((5,), lambda i: x[i] * x[i + 1], name="out")
    rng = np.random.default_rng(6)
    xv, h = rng.standard_normal(6), rng.standard_normal(5)
    expected = np.zeros(6)
    expected[:-1] += h * xv[1:]
    expected[1:] += h * xv[:-1]
    r = build_grad(out, [x], [xv], head=h)
    assert_close(r.grads, [expected])
    assert_close(r.naive, [expected])


def test_gradient_through_a_chain_of_tensors():
    """Adjoints compose over several compute tensors, each read more than once."""
    x = te.placeholder((4,), "float64", "x")
    a = te.compute((4,), lambda i: te.sin(x[i]), name="a")
    b = te.compute((4,), lambda i: a[i] * a[i] + x[i], name="b")
    c = te.compute((4,), lambda i: te.exp(b[i]) - a[i], name="c")
    xv = np.array([0.1, -0.7, 1.2, 0.4])
    h = np.array([1.0, -2.0, 0.5, 3.0])
    av = np.sin(xv)
    bv = av * av + xv
    gb = h * np.exp(bv)
    ga = gb * 2 * av - h
    expected = ga * np.cos(xv) + gb
    r = build_grad(c, [x], [xv], head=h)
    assert_close(r.grads, [expected])
    assert_close(r.naive, [expected])


@pytest.mark.parametrize("op,pick", [(te.max, 0), (te.min, 0)])
def test_extremum_ties_send_the_gradient_to_the_first(op, pick):
    x = te.placeholder((3, 4), "float64", "x")
    k = te.reduce_axis(4, "k")
    out = te.compute((3,), lambda i: op(x[i, k], axis=k), name="out")
    xv = np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 2.0, -1.0, 2.0], [-3.0, 5.0, -3.0, -3.0]])
    h = np.array([2.0, 3.0, 5.0])
    first = np.argmax(xv, 1) if op is te.max else np.argmin(xv, 1)
    expected = np.zeros((3, 4))
    expected[np.arange(3), first] = h
    r = build_grad(out, [x], [xv], head=h)
    assert_close(r.grads, [expected])
    assert_close(r.naive, [expected])


def _register_tile():
    """Rows and vectors of the target's register tile."""
    from lowering.schedule.blocking import TILE_VECTORS, blocking
    return blocking(te.target()).tile_rows, TILE_VECTORS


@pytest.mark.parametrize("form", ["product", "sum"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("extra", [-1, 0, 1, "2t+1"])
def test_min_finds_its_position_in_every_row_of_a_register_tile(rng, dtype, extra, form):
    """``Y[i, j] = min_r (X0[r, i] * (j + 1)) * X1[j, r]`` (or the same with
    ``+``), a GEMM-like min that the schedule register-tiles, with rows on
    both sides of a whole tile: the derivative's ``Y.argmax`` recomputes the
    body and looks for the first position equal to the stored ``Y``, so
    every code path computing it (the tile, its remainder rows, the argmax
    stage) must round it the same; a remainder row once found no match and
    lost its gradient.  The minimum is unique by a margin, so the reference
    is the plain argmin."""
    rows, vectors = _register_tile()
    I = 2 * rows + 1 if extra == "2t+1" else rows + extra
    K, J = 8, vectors * te.target().lanes(np.dtype(dtype).itemsize)        # J: one tile's columns
    X0 = te.placeholder((K, I), dtype, "X0")
    X1 = te.placeholder((J, K), dtype, "X1")
    r = te.reduce_axis((0, K), "r")
    op = (lambda a, b: a * b) if form == "product" else (lambda a, b: a + b)
    Y = te.compute((I, J), lambda i, j: te.min(op(op(X0[r, i], (j + 1).astype(dtype)), X1[j, r]), axis=r), name="Y")
    dX0, = te.gradient(Y, [X0])
    # X1[j, r] over r: a permutation of the levels 1..K (times [1, 1.01]),
    # which set the order of the candidates; X0 moves them a little (product:
    # a factor in [1, 1.05] with random signs; sum: a term in [0, 0.05]).
    levels = np.stack([rng.permutation(K) + 1.0 for _ in range(J)]) * rng.uniform(1.0, 1.01, (J, K))
    if form == "product":
        x0 = rng.uniform(1.0, 1.05, (K, I)) * rng.choice([-1.0, 1.0], (K, I))
        x1 = levels * rng.choice([-1.0, 1.0], (J, K))
    else:
        x0, x1 = rng.uniform(0.0, 0.05, (K, I)), levels
    x0, x1 = x0.astype(dtype), x1.astype(dtype)
    c = np.arange(J) + 1.0
    body = op(op(x0.astype(np.float64)[:, :, None], c), x1.T.astype(np.float64)[:, None, :])     # [r, i, j]
    low = np.sort(body, axis=0)
    assert (low[1] - low[0] > 0.01 * np.maximum(np.abs(low[0]), np.abs(low[1]))).all()     # a unique minimum
    first = body.argmin(0)
    want = np.zeros((K, I))
    for i in range(I):
        for j in range(J):
            want[first[i, j], i] += c[j] * x1[j, first[i, j]] if form == "product" else 1.0
    y, dx0 = run([X0, X1], [Y, dX0], [x0, x1])
    rtol = 1e-5 if dtype == "float32" else 1e-12
    assert_close(y, body.min(0), rtol=rtol)
    assert_close(dx0, want, rtol=rtol)


def test_check_gradient_of_a_float32_program():
    x = te.placeholder((2, 3), "float32", "x")
    k = te.reduce_axis(3, "k")
    out = te.compute((2,), lambda i: te.log(te.sum(te.exp(x[i, k] * 0.5), axis=k)), name="out")
    xv = np.array([[0.1, -0.4, 1.3], [2.0, 0.0, -1.0]], np.float32)
    g, = te.check_gradient(out, [x], [xv], head=np.array([1.0, -2.0]))
    p = np.exp(0.5 * xv.astype(np.float64))
    p /= p.sum(1, keepdims=True)
    assert_close(g, 0.5 * p * np.array([[1.0], [-2.0]]), rtol=1e-6)


def test_gradient_wrt_intermediate_and_output_tensors():
    x = te.placeholder((4,), "float64", "x")
    a = te.compute((4,), lambda i: te.sin(x[i]), name="a")
    b = te.compute((4,), lambda i: a[i] * a[i] + x[i], name="b")
    H = te.placeholder((4,), "float64", "H")
    da, db, dx = te.gradient(b, [a, b, x], head=H)
    assert da.shape == db.shape == dx.shape == (4,)
    xv, h = np.array([0.3, -1.0, 2.0, 0.5]), np.array([1.0, 2.0, -1.0, 0.5])
    outs = run([x, H], [da, db, dx], [xv, h])
    assert_close(outs, [2 * np.sin(xv) * h, h, h * (2 * np.sin(xv) * np.cos(xv) + 1)])


def test_gradient_wrt_the_same_input_twice():
    x = te.placeholder((3,), "float64", "x")
    y = te.compute((3,), lambda i: x[i] * x[i] * x[i], name="y")
    g1, g2 = te.gradient(y, [x, x])
    xv = np.array([1.0, -2.0, 0.5])
    assert_close(run([x], [g1, g2], [xv]), [3 * xv ** 2, 3 * xv ** 2])


def test_reduction_inside_a_select_branch():
    x = te.placeholder((4, 3), "float64", "x")
    k = te.reduce_axis(3, "k")
    out = te.compute((4,), lambda i: te.if_then_else(i > 0, te.sum(x[i - 1, k] * x[i - 1, k], axis=k),
                                                     x[0, 0] * 5.0), name="out")
    xv, h = np.arange(12.0).reshape(4, 3) / 5, np.array([1.0, 2.0, 3.0, 4.0])
    expected = np.zeros((4, 3))
    expected[:3] = 2 * xv[:3] * h[1:, None]
    expected[0, 0] += 5 * h[0]
    with time_limit(3):
        r = build_grad(out, [x], [xv], head=h)
    assert_close(r.fwd, np.r_[5 * xv[0, 0], (xv[:3] ** 2).sum(1)])
    assert_close(r.grads, [expected])
    assert_close(r.naive, [expected])


def build_grad_or_fail(*args, **kw):
    """``build_grad`` where an in-range program rejected by te.build's bounds check is a test failure."""
    try:
        return build_grad(*args, **kw)
    except IndexError as e:
        raise AssertionError(f"gradient program rejected at build: {e}") from e


LATTICE_ELIM_BUG = ("zero elimination treats X[3*i + 2*j] (coprime coefficients > 1) as reaching every "
                    "element between its extremes: a wrong gradient at the unreachable positions (1 and 6), or, "
                    "with a head, reads out of range that te.build rejects")
INDEX_PATTERNS = {
    "stride2": ((4,), lambda j: 2 * j),
    "stride2_offset": ((4,), lambda j: 2 * j + 1),
    "reverse": ((9,), lambda j: 8 - j),
    "upsample": ((9,), lambda j: j // 2),
    "stride3_div2": ((3,), lambda j: (3 * j) // 2),
    "stride3_plus3_div2": ((3,), lambda j: (3 * j + 3) // 2),
    "stride3_plus1_div2": ((3,), lambda j: (3 * j + 1) // 2),
    "rotate_mod": ((9,), lambda j: (j + 1) % 9),
    "mod_then_div": ((6,), lambda j: (j % 3) * 2 + j // 3),
    "window_i_plus_j": ((2, 3), lambda i, j: i + j),
    "rows_3i_plus_j": ((2, 3), lambda i, j: 3 * i + j),
    "overlap_2i_2j": ((3, 3), lambda i, j: 2 * i + 2 * j),
    "anti_diagonal": ((3, 3), lambda i, j: i - j + 2),
    "lattice_3i_2j": ((2, 3), lambda i, j: 3 * i + 2 * j),
    "lattice_3i_minus_2j": ((2, 2), lambda i, j: 3 * i - 2 * j + 2),
}


def _pattern_params():
    for name in INDEX_PATTERNS:
        yield pytest.param(name, id=name)


@pytest.mark.parametrize("pattern", list(_pattern_params()))
def test_index_pattern_gradient(pattern):
    """Y[j...] = X[idx(j...)]^2: the gradient scatters 2 X[idx] H[j...] to idx (repeats add up)."""
    shape, idx = INDEX_PATTERNS[pattern][:2]
    X = te.placeholder((9,), "float64", "X")
    Y = te.compute(shape, lambda *j: X[idx(*j)] * X[idx(*j)], name="Y")
    rng = np.random.default_rng(len(pattern))
    xv, h = rng.standard_normal(9), rng.standard_normal(shape)
    where = np.array([idx(*j) for j in np.ndindex(*shape)]).reshape(shape)
    expected = np.zeros(9)
    np.add.at(expected, where, 2 * xv[where] * h)
    r = build_grad_or_fail(Y, [X], [xv], head=h)
    assert_close(r.fwd, xv[where] ** 2)
    assert_close(r.naive, [expected], what="optimize=False")
    assert_close(r.grads, [expected], what="te.gradient")


def test_never_taken_guarded_read_has_zero_gradient():
    X = te.placeholder((7,), "float64", "X")

    def body(i, j):
        ix = -2 * j - 1                                   # always negative: the read never happens
        return te.if_then_else(te.all(ix >= 0, ix < 7), X[ix] * X[ix], 0.0)

    Y = te.compute((4, 3), body, name="Y")
    r = build_grad(Y, [X], [np.ones(7)])
    assert_close(r.fwd, np.zeros((4, 3)))
    assert_close(r.grads + r.naive, [np.zeros(7), np.zeros(7)])


@pytest.mark.parametrize("stride,dilation,n", [
    (1, 1, 7), (2, 1, 8), (1, 2, 9), (2, 2, 7), (3, 1, 9), (3, 3, 9),
    (1, 3, 7),
    (2, 3, 9),
    (3, 2, 8),
])
def test_conv1d_strided_dilated(stride, dilation, n):
    """Y[i] = sum_k X[s*i + d*k] W[k]: the core index pattern of strided and dilated convolutions."""
    K = 3
    m = (n - dilation * (K - 1) - 1) // stride + 1
    X, W = te.placeholder((n,), "float64", "X"), te.placeholder((K,), "float64", "W")
    k = te.reduce_axis(K, "k")
    Y = te.compute((m,), lambda i: te.sum(X[stride * i + dilation * k] * W[k], axis=k), name="Y")
    rng = np.random.default_rng(n)
    x, w, h = rng.standard_normal(n), rng.standard_normal(K), rng.standard_normal(m)
    dx, dw = np.zeros(n), np.zeros(K)
    for i, kk in itertools.product(range(m), range(K)):
        dx[stride * i + dilation * kk] += h[i] * w[kk]
        dw[kk] += h[i] * x[stride * i + dilation * kk]
    r = build_grad_or_fail(Y, [X, W], [x, w], head=h)
    assert_close(r.naive, [dx, dw], what="optimize=False")
    assert_close(r.grads, [dx, dw], what="te.gradient")


def test_dilated_read_with_a_single_output():
    W, X = te.placeholder((3,), "float64", "W"), te.placeholder((7,), "float64", "X")
    k = te.reduce_axis(3, "k")
    Y = te.compute((1,), lambda i: te.sum(X[i + 3 * k] * W[k], axis=k), name="Y")
    r = build_grad(Y, [X, W], [np.zeros(7), np.array([1.0, 2.0, 3.0])], wrt=[X])
    expected = np.array([1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 3.0])
    assert_close(r.naive, [expected])
    assert_close(r.grads, [expected])


def test_the_untaken_branch_of_a_select_adds_zero_even_where_its_derivative_is_infinite():
    """y = select(|r|² != 0, sin(θ), r₀) with θ = sqrt(|r|²) a tensor of its
    own (Rodrigues' rotation, GradBench's ba): at r = 0 the adjoint of θ is
    the zero branch, and the gradient through sqrt' = ∞ there stays 0 (the
    plain product 0·∞ would be NaN), as when sqrt is written inside the branch."""
    r = te.placeholder((1, 3), "float64", "r")
    sq = te.compute((1,), lambda i: r[i, 0] * r[i, 0] + r[i, 1] * r[i, 1] + r[i, 2] * r[i, 2], name="sq")
    theta = te.compute((1,), lambda i: te.sqrt(sq[i]), name="theta")
    y = te.compute((1,), lambda i: te.if_then_else(te.not_equal(sq[i], 0.0), te.sin(theta[i]), r[i, 0]), name="y")
    dr, = te.gradient(y, [r])
    kernel = te.build([r], [dr])
    np.testing.assert_array_equal(kernel(np.zeros((1, 3))), [[1.0, 0.0, 0.0]])
    x = np.array([[0.3, -0.4, 1.2]])
    n = np.sqrt((x * x).sum())
    np.testing.assert_allclose(kernel(x), np.cos(n) * x / n, rtol=4 * np.finfo(float).eps)


def test_a_second_gradient_sums_a_data_range_inside_the_guard_that_keeps_it_in_range():
    """The first gradient sums over ``q in .. I[c]`` under ``c < 3`` (``c`` spans
    5, ``I`` has 3 elements); differentiating it again must keep that guard
    outside the sum over ``q``, whose range reads ``I[c]``."""
    rng = np.random.default_rng(11)
    X = te.placeholder((5, 3), "float64", "X")
    I = te.placeholder((3,), "int64", "I")
    T = te.compute((2, 5, 5), lambda a, b, c: te.if_then_else(b <= a + 1, te.sin(X[c, (a - b) * (a - b)]), 0.0),
                   name="T")
    Y = te.compute((4, 3), lambda a, b: te.if_then_else(te.any(2 * a + b - 1 < 0, 2 * a + b - 1 >= 5), 0.0,
                                                        T[I[b], 2 * a + b - 1, b]), name="Y")
    dX, = te.gradient(Y, [X])
    S = te.compute(dX.shape, lambda a, b: dX[a, b] * dX[a, b], name="S")
    ddX, = te.gradient(S, [X])
    x, idx = rng.normal(size=(5, 3)), rng.integers(0, 2, size=3)
    # by hand: Y's element (a, b) is sin(X[b, (I[b] - r)^2]) for r = 2a + b - 1 in T's range
    n = np.zeros((5, 3))
    for a, b in itertools.product(range(4), range(3)):
        r = 2 * a + b - 1
        if 0 <= r < 5 and r <= idx[b] + 1:
            n[b, (idx[b] - r) ** 2] += 1
    got_dx, got_ddx = run([X, I], [dX, ddX], [x, idx])
    assert_close(got_dx, n * np.cos(x), rtol=1e-12, atol=1e-12)
    assert_close(got_ddx, -2 * n * n * np.cos(x) * np.sin(x), rtol=1e-12, atol=1e-12)
