"""The vector bodies of lowering/fast_math.py beyond float32 exp, log, log1p,
tanh and sigmoid (tests/test_fast_math.py): accuracy against a
higher-precision reference with the measured bound stated per function and
dtype, C99/numpy's special values, and the same value on the scalar, short
vector and full vector paths.

float32 results are compared with float64 numpy/libm on a dense sweep of
bit patterns; float64 results with mpmath at 40 digits on samples of four
scales.  The bounds are the maxima measured on this data (AMD EPYC Zen 4,
AVX-512 and built for AVX2; :data:`NO_FMA` for x86-64-v2, on Zen 4 and
Zen 3), rounded up to the next 0.05 ulp."""
import math

import mpmath as mp
import numpy as np
import pytest

import te_autodiff as te
from te_autodiff.ops import OPS
from lowering import runtime
from lowering.fast_math import BODIES
from lowering.lower import lower

mp.mp.dps = 40

# name: (float64 numpy reference, mpmath reference, ulp bound float32, ulp bound float64, domain)
FUNCTIONS = {
    "exp": (np.exp, mp.exp, None, 0.9, None),                           # float32: test_fast_math.py
    "erf": (np.vectorize(math.erf), mp.erf, 1.0, 0.8, None),
    "erfc": (np.vectorize(math.erfc), mp.erfc, 0.55, 2.45, None),
    "exp2": (np.exp2, lambda v: mp.power(2, v), 0.9, 0.75, None),
    "expm1": (np.expm1, mp.expm1, 1.8, 1.4, None),
    "log2": (np.log2, lambda v: mp.log(v, 2), 0.95, 0.55, (0, None)),
    "log10": (np.log10, mp.log10, 1.05, 0.65, (0, None)),
    "sin": (np.sin, mp.sin, 0.6, 1.2, None),
    "cos": (np.cos, mp.cos, 0.6, 1.2, None),
    "tan": (np.tan, mp.tan, 0.9, 2.1, None),
    "tanh": (np.tanh, mp.tanh, None, 1.1, None),                        # float32: test_fast_math.py
    "atan": (np.arctan, mp.atan, 0.55, 1.6, None),
    "asin": (np.arcsin, mp.asin, 0.55, 1.85, (-1, 1)),
    "acos": (np.arccos, mp.acos, 0.55, 1.1, (-1, 1)),
    "sinh": (np.sinh, mp.sinh, 0.55, 1.55, None),
    "cosh": (np.cosh, mp.cosh, 0.55, 1.15, None),
}

# where a target without FMA (x86-64-v2) rounds the products of a reduction or
# a sum separately: its measured bounds
NO_FMA = {("exp", "float64"): 1.15, ("erf", "float32"): 1.2, ("erf", "float64"): 1.1, ("exp2", "float32"): 1.1,
          ("exp2", "float64"): 1.0, ("expm1", "float32"): 1.96, ("log2", "float32"): 1.96, ("log2", "float64"): 0.6,
          ("log10", "float32"): 1.95, ("sin", "float64"): 1.4, ("cos", "float64"): 1.3, ("tan", "float64"): 2.1,
          ("cosh", "float64"): 1.45, ("power", "float64"): 1.4}


def bound_for(name, dtype, bound):
    return bound if te.target().fma else NO_FMA.get((name, dtype), bound)


def floats_between(lo, hi, count):
    """``count`` float32 evenly spaced in bit pattern between ``lo`` and ``hi`` (same sign)."""
    a, b = sorted(int(np.float32(v).view(np.int32)) for v in (abs(lo), abs(hi)))
    return np.copysign(np.linspace(a, b, count).astype(np.int32).view(np.float32), np.float32(lo))


def apply(name, dtype, *arrays):
    ps = [te.placeholder(a.shape, dtype, f"a{k}") for k, a in enumerate(arrays)]
    y = te.compute(arrays[0].shape, lambda i: getattr(te, name)(*[p[i] for p in ps]), name="y")
    return te.build(ps, [y])(*arrays)


def in_domain(x, domain):
    if domain is None:
        return x
    lo, hi = domain
    x = np.abs(x) if lo == 0 else x
    return x[(x >= lo) & (x <= (np.inf if hi is None else hi))]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", sorted(n for n, f in FUNCTIONS.items() if f[2] is not None))
def test_float32_accuracy_on_a_dense_sweep(name):
    ref, _, bound, _, domain = FUNCTIONS[name]
    bound = bound_for(name, "float32", bound)
    rng = np.random.default_rng(21)
    x = np.concatenate([floats_between(2.0 ** -30, 1e5, 1 << 18), floats_between(-(2.0 ** -30), -1e5, 1 << 18),
                        floats_between(1e-45, 1e-38, 2048),
                        rng.integers(0, 2 ** 32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    x = in_domain(x[np.isfinite(x)], domain)
    got = apply(name, "float32", x)
    with np.errstate(all="ignore"):
        exact = ref(x.astype(np.float64))
    rounded = exact.astype(np.float32)
    finite = np.isfinite(rounded) & (rounded != 0)
    err = np.abs(got[finite] - exact[finite]) / np.spacing(np.abs(rounded[finite])).astype(np.float64)
    worst = int(np.argmax(err))
    assert err[worst] <= bound, (float(x[finite][worst]), float(err[worst]))
    same = (got[~finite] == rounded[~finite]) | (np.isnan(got[~finite]) & np.isnan(rounded[~finite]))
    assert same.all(), list(zip(x[~finite][~same], got[~finite][~same]))[:5]


def float64_samples(seed, n, domain):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.standard_normal(n) * 3, rng.standard_normal(n) * 30, rng.uniform(-1, 1, n),
                        np.exp(rng.uniform(-40, 6, n)) * rng.choice([-1, 1], n)])
    return in_domain(x, domain)


def ulps64(got, x, reference):
    """The error of each of ``got`` in ulps of the correctly rounded ``reference(x)``
    (nonzero finite ones)."""
    out = []
    for xi, gi in zip(x, got):
        exact = reference(mp.mpf(float(xi)))
        rounded = float(exact)
        if rounded != 0 and math.isfinite(rounded):
            out.append(float(abs(mp.mpf(float(gi)) - exact) / mp.mpf(np.spacing(abs(rounded)))))
    return np.array(out)


@pytest.mark.parametrize("name", sorted(n for n, f in FUNCTIONS.items() if f[3] is not None))
def test_float64_accuracy_against_mpmath(name):
    _, reference, _, bound, domain = FUNCTIONS[name]
    bound = bound_for(name, "float64", bound)
    x = float64_samples(22, 500, domain)
    err = ulps64(apply(name, "float64", x), x, reference)
    assert err.max() <= bound, (float(x[np.argmax(err)]), err.max())


@pytest.mark.parametrize("target", [None, "haswell", "x86-64-v2"])
def test_float64_exp_at_its_edges_on_every_path(target):
    """float64 e^x where it is subnormal, rounds to 0, overflows, and beside
    those edges: against mpmath, C99's special values bit for bit, and each
    lane's bits the same in a vector of common lanes (the exponent-field
    scaling), in one with an edge lane (the two-factor or vscalefpd scaling),
    in short vectors and in scalar code."""
    rng = np.random.default_rng(41)
    edges = np.concatenate([rng.uniform(-746.0, -700.0, 300), rng.uniform(700.0, 710.0, 100),
                            [-745.13321910194122, -745.1332191019412, -708.3964185322641, 709.782712893384,
                             709.7827128933841, -708.0, 708.0, 0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, -1e-300]])
    common = rng.uniform(-700.0, 700.0, 4000)
    mixed = common.copy()
    mixed[::29] = edges[rng.integers(0, edges.size, mixed[::29].size)]
    x = te.placeholder((mixed.size,), "float64", "x")
    y = te.compute(x.shape, lambda i: te.exp(x[i]), name="y")
    kernel = te.build([x], [y], target=target)
    got = kernel(mixed)
    keep = np.ones(mixed.size, bool)
    keep[::29] = False
    np.testing.assert_array_equal(kernel(common)[keep], got[keep])
    np.testing.assert_array_equal(got, unscheduled([x], [y], [mixed], target)[0])
    with np.errstate(all="ignore"):
        exact = np.exp(mixed)
    special = ~np.isfinite(exact) | (exact == 0) | (mixed == 0)
    np.testing.assert_array_equal(got[special], exact[special])
    finite = ~special & ~np.isnan(mixed)
    err = ulps64(got[finite], mixed[finite], mp.exp)
    bound = FUNCTIONS["exp"][3] if te.target(target).fma else NO_FMA["exp", "float64"]
    assert err.max() <= bound, err.max()


def test_power_accuracy_against_mpmath():
    """Bases of both signs over e^[-5, 5], exponents in [-40, 40], a third of
    them integers: float64 within 1.2 ulp (1.4 without FMA), float32 0.55."""
    rng = np.random.default_rng(23)
    n = 1500
    x = np.exp(rng.uniform(-5, 5, n)) * rng.choice([1, 1, -1], n)
    y = rng.uniform(-40, 40, n)
    y[::3] = np.round(y[::3])
    for dtype, bound in (("float64", 1.2), ("float32", 0.55)):
        bound = bound_for("power", dtype, bound)
        xs, ys = x.astype(dtype), y.astype(dtype)
        got = apply("power", dtype, xs, ys)
        negative = (xs < 0) & (ys != np.round(ys))
        assert np.isnan(got[negative]).all()
        worst = 0.0
        for a, b, g in zip(xs[~negative], ys[~negative], got[~negative]):
            exact = mp.power(mp.mpf(float(a)), mp.mpf(float(b)))
            rounded = np.array(float(exact)).astype(dtype)
            if rounded != 0 and np.isfinite(rounded):
                worst = max(worst, float(abs(mp.mpf(float(g)) - exact) / mp.mpf(float(np.spacing(abs(rounded))))))
        assert worst <= bound, (dtype, worst)


def no_pow(kernel) -> bool:
    """No pow body in ``kernel``: no log's split point sqrt(1/2) (float64 bits,
    the pow body of either dtype takes log|x| in float64) and no libm pow."""
    return "0x3FE6A09E667F3BCD" not in kernel.llvm_ir and "@pow" not in kernel.llvm_ir


def test_integer_powers_by_multiplication():
    """Constant integer exponents (square-and-multiply) and an index exponent
    (branch-free square-and-multiply over the bits its range needs:
    lowering/powers.py) against numpy, and no pow call left; float32
    multiplies in float64, so its powers round once (within 0.5 ulp)."""
    rng = np.random.default_rng(24)
    x = np.concatenate([rng.standard_normal(500) * 2, [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e30]])
    for dtype in ("float32", "float64"):
        xs = x.astype(dtype)
        X = te.placeholder(xs.shape, dtype, "x")
        for n in (2, 3, -1, -2, 5, -3, 16):
            kernel = te.build([X], [te.compute(xs.shape, lambda i: X[i] ** n)])
            assert no_pow(kernel)
            with np.errstate(all="ignore"):
                want = np.power(xs.astype(np.float64), n)
            ulps = 0.5 if dtype == "float32" else abs(n)
            got = kernel(xs).astype(np.float64)
            close = np.abs(got - want) <= ulps * np.spacing(np.abs(want).astype(dtype)).astype(np.float64)
            same = (got == want.astype(dtype)) | np.isnan(got) & np.isnan(want) | close
            assert same.all(), (dtype, n, list(zip(xs[~same], got[~same], want[~same]))[:3])
        m = 40
        T = te.placeholder((m,), dtype, "t")
        P = te.compute((m, m), lambda i, j: te.power(T[i], j - 10), name="p")
        kernel = te.build([T], [P])
        assert no_pow(kernel)
        t = np.concatenate([rng.uniform(-1.5, 1.5, m - 4), [0.0, -0.0, np.inf, np.nan]]).astype(dtype)
        with np.errstate(all="ignore"):
            want = np.power(t.astype(np.float64)[:, None], np.arange(-10, m - 10, dtype=np.float64))
        np.testing.assert_allclose(kernel(t), want.astype(dtype), rtol=32 * np.finfo(dtype).eps)


def test_the_gradient_of_an_index_power_multiplies_too():
    """d/dt sum_j X_j t^j = sum_j j X_j t^(j-1): the exponent stays an integer."""
    rng = np.random.default_rng(25)
    m, n = 30, 12
    T, X = te.placeholder((m,), "float64", "t"), te.placeholder((n,), "float64", "x")
    j = te.reduce_axis((0, n), "j")
    Y = te.compute((m,), lambda i: te.sum(X[j] * te.power(T[i], j), axis=j), name="y")
    dT, = te.gradient(Y, [T])
    kernel = te.build([T, X], [dT])
    assert no_pow(kernel)
    t, x = rng.uniform(-1, 1, m), rng.standard_normal(n)
    want = (np.arange(1, n) * x[1:] * t[:, None] ** np.arange(n - 1)).sum(1)
    np.testing.assert_allclose(kernel(t, x), want, rtol=1e-13)


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 1e-300, -1e-300, 5e-324, 1e300,
                    -1e300, 2.0, 1024.0, -1075.0, 709.5, 710.0, -745.0, 6.0, -6.0, 27.0, 19.0, 1e6, -1e7])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_special_values_follow_numpy(name, dtype):
    """Zeros (with their sign), infinities, NaN, huge and subnormal arguments:
    where numpy's result is 0 or not finite, the same bits; elsewhere within
    2.5 ulp (numpy's tanh(19) is 1, the correctly rounded 1 - 2^-53 here)."""
    x = SPECIAL.astype(dtype)
    got = apply(name, dtype, x).astype(np.float64)
    with np.errstate(all="ignore"):
        want = FUNCTIONS[name][0](x.astype(np.float64)).astype(dtype).astype(np.float64)
    exact = ~np.isfinite(want) | (want == 0)
    same = ((got == want) & (np.signbit(got) == np.signbit(want))) | (np.isnan(got) & np.isnan(want))
    assert same[exact].all(), list(zip(x[exact & ~same], got[exact & ~same], want[exact & ~same]))
    close = np.abs(got - want) <= 2.5 * np.spacing(np.abs(want).astype(dtype)).astype(np.float64)
    assert close[~exact].all(), list(zip(x[~exact & ~close], got[~exact & ~close], want[~exact & ~close]))


def test_atan2_special_values_follow_numpy_with_zeros_as_plus_zero():
    """numpy's atan2 where a zero operand is +0: te's arithmetic may drop the
    sign of a zero, so atan2 never reads it (``atan2(-0.0, -1)`` is pi)."""
    grid = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-300, -2.5])
    y, x = (a.ravel() for a in np.meshgrid(grid, grid))
    for dtype in ("float32", "float64"):
        ys, xs = y.astype(dtype), x.astype(dtype)
        got = apply("atan2", dtype, ys, xs)
        want = np.arctan2(ys.astype(np.float64) + 0.0, xs.astype(np.float64) + 0.0).astype(dtype)
        same = (got == want) & (np.signbit(got) == np.signbit(want)) | np.isnan(got) & np.isnan(want)
        close = np.abs(got - want) <= np.spacing(np.abs(want))
        assert (same | close).all(), list(zip(y[~(same | close)], x[~(same | close)], got[~(same | close)]))


def unscheduled(inputs, outputs, arrays, target=None):
    """The program as lowered: scalar loops (which LLVM may vectorise itself)."""
    program = lower(inputs, outputs)
    storage = runtime.execute(program, runtime.compile_program(program, te.target(target)), arrays)
    return [storage[b] for b in program.results]


NEW_BODIES = sorted({op for op, _ in BODIES if OPS[op].arity == 1} - {"exp", "log", "log1p", "sigmoid"})


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", NEW_BODIES)
def test_every_path_computes_the_same_value(name, dtype):
    """Full native vectors, short vectors with masked tails and scalar code
    agree to 1 ulp (LLVM may contract a multiply and an add into an fma in
    one loop and not in the other)."""
    if (name, dtype) not in BODIES:
        pytest.skip("libm")
    rng = np.random.default_rng(26)
    args = np.concatenate([SPECIAL, rng.standard_normal(3000) * 20, rng.standard_normal(500)]).astype(dtype)
    for n in (args.size, 7, 3):
        x = te.placeholder((n,), dtype, "x")
        y = te.compute((n,), lambda i: getattr(te, name)(x[i]), name="y")
        a = args[:n]
        got, scalar = te.build([x], [y])(a), unscheduled([x], [y], [a])[0]
        with np.errstate(all="ignore"):
            close = (got == scalar) | np.isnan(got) & np.isnan(scalar) | \
                (np.abs(got - scalar) <= np.spacing(np.abs(scalar)))
        assert close.all(), list(zip(a[~close], got[~close], scalar[~close]))[:5]


@pytest.mark.parametrize("name,bound", [("pow", 1.35), ("erfc", 2.45)])
def test_exact_products_without_an_fma_instruction(name, bound):
    """pow's and erfc's float64 bodies need the exact error of a product: an
    fma where the target has one, else Dekker's product (x86-64-v2 has no
    fma, and llvm.fma there would be a libm call per lane).  Built for
    x86-64-v2: no fma call in the code, the same accuracy against mpmath."""
    rng = np.random.default_rng(5)
    x = np.abs(float64_samples(9, 64, None)) if name == "pow" else float64_samples(9, 64, None)
    y = rng.uniform(-30, 30, x.size)
    arrays = [x, y][:2 if name == "pow" else 1]
    ps = [te.placeholder(a.shape, "float64", f"a{k}") for k, a in enumerate(arrays)]
    out = te.compute(x.shape, lambda i: getattr(te, "power" if name == "pow" else name)(*[p[i] for p in ps]), name="y")
    kernel = te.build(ps, [out], target="x86-64-v2")
    assert "fma" not in kernel.asm
    got = kernel(*arrays)
    reference = (lambda a: mp.power(a[0], a[1])) if name == "pow" else (lambda a: mp.erfc(a[0]))
    errs = []
    for point, g in zip(zip(*arrays), got):
        exact = reference([mp.mpf(float(v)) for v in point])
        rounded = float(exact)
        if rounded != 0 and math.isfinite(rounded):
            errs.append(float(abs(mp.mpf(float(g)) - exact) / mp.mpf(np.spacing(abs(rounded)))))
    assert max(errs) <= bound, max(errs)
