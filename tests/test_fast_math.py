"""The inline float32 math of lowering/fast_math.py: accuracy against float64
numpy on dense sweeps of arguments, special values, and the same bits on the
AVX-512, narrower vector and scalar paths."""
import numpy as np
import pytest

import te_autodiff as te
from lowering import runtime
from lowering.lower import lower

pytestmark = pytest.mark.aarch64          # all of it runs in .ci/aarch64 (emulated AArch64)



def sigmoid64(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


# name: (te function, float64 reference, max ulp over the sweep); sigmoid divides
# (fast_math's doc: 2.4 ulp, where numpy's float32 1 / (1 + exp(-x)) reaches 2.97)
FUNCTIONS = {"exp": (te.exp, np.exp, 1.0), "tanh": (te.tanh, np.tanh, 1.5),
             "sigmoid": (te.sigmoid, sigmoid64, 2.5), "log": (te.log, np.log, 2.0),
             "log1p": (te.log1p, np.log1p, 3.0)}
NO_FMA_LIMIT = {"exp": 1.1}      # separate roundings in exp's reduction (fast_math's doc)


def floats_between(lo, hi, count):
    """``count`` float32 evenly spaced in bit pattern between ``lo`` and ``hi`` (same sign)."""
    a, b = sorted(int(np.float32(v).view(np.int32)) for v in (abs(lo), abs(hi)))
    bits = np.linspace(a, b, count).astype(np.int32)
    return np.copysign(bits.view(np.float32), np.float32(lo))


_SWEEP_RNG = np.random.default_rng(31)     # import-time data: the same sweep in any test order
SWEEP = np.concatenate([
    floats_between(2.0 ** -30, 128.0, 1 << 20), floats_between(-(2.0 ** -30), -128.0, 1 << 20),
    floats_between(0.5, 1.0, 1 << 16), floats_between(-0.5, -1.0, 1 << 16),         # tanh, sigmoid near 0.625
    floats_between(-1e-38, -1e-45, 4096), floats_between(1e-45, 1e-38, 4096),         # subnormals
    _SWEEP_RNG.integers(0, 2 ** 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32),
    np.float32([0.6298048, 5.2019291, -0.2997174, -4.1572938, -0.0030729, -16.960871])])
SPECIAL = np.float32([
    0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, -1e-40, 1.1754942e-38, -1.1754942e-38,
    3.4028235e38, -3.4028235e38, 1e30, -1e30, 1e10, -1e10, 88.72, 88.73, 89.0, -87.3, -103.9, -103.97,
    -104.0, -150.0, 0.625, np.nextafter(np.float32(0.625), np.float32(0)), -0.625, 9.01, 9.02, 9.1, 9.2,
    17.0, -17.0, 2.0 ** -12, -(2.0 ** -12), 1.0, -1.0, -0.99999994, -1.0000001])


def build(name, n):
    x = te.placeholder((n,), "float32", "x")
    return x, te.compute((n,), lambda i: FUNCTIONS[name][0](x[i]), name="y")


def unscheduled(inputs, outputs, arrays):
    """Run the program as lowered: scalar loops (which LLVM may vectorise itself)."""
    program = lower(inputs, outputs)
    compiled = runtime.compile_program(program, te.target())
    storage = runtime.execute(program, compiled, arrays)
    return [storage[b] for b in program.results]


def ulps(got, exact):
    """|got - exact| in units of the last place of ``exact`` rounded to float32."""
    spacing = np.spacing(np.abs(exact.astype(np.float32))).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / spacing


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_accuracy_on_a_dense_sweep(name):
    _, ref, limit = FUNCTIONS[name]
    if not te.target().fma:
        limit = NO_FMA_LIMIT.get(name, limit)
    x, y = build(name, SWEEP.size)
    got = te.build([x], [y])(SWEEP)
    with np.errstate(all="ignore"):
        exact = ref(SWEEP.astype(np.float64))
        rounded = exact.astype(np.float32)
    finite = np.isfinite(rounded) & (rounded != 0)
    err = ulps(got[finite], exact[finite])
    worst = int(np.argmax(err))
    assert err[worst] <= limit, (float(SWEEP[finite][worst]), float(err[worst]))
    same = (got[~finite] == rounded[~finite]) | (np.isnan(got[~finite]) & np.isnan(rounded[~finite]))
    assert same.all(), list(zip(SWEEP[~finite][~same], got[~finite][~same]))[:5]


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_special_values_follow_numpy_bit_for_bit(name):
    """Zeros keep their sign, infinities, NaN, subnormal and huge arguments."""
    x, y = build(name, SPECIAL.size)
    got = te.build([x], [y])(SPECIAL)
    with np.errstate(all="ignore"):
        exact = FUNCTIONS[name][1](SPECIAL.astype(np.float64))
        rounded = exact.astype(np.float32)
    exact_cases = ~np.isfinite(rounded) | (rounded == 0) | (np.abs(rounded) == 1)
    same = (got.view(np.int32) == rounded.view(np.int32)) | (np.isnan(got) & np.isnan(rounded))
    assert same[exact_cases].all(), list(zip(SPECIAL[exact_cases & ~same], got[exact_cases & ~same]))
    assert (ulps(got[~exact_cases], exact[~exact_cases]) <= FUNCTIONS[name][2]).all()


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_every_path_computes_the_same_bits(rng, name):
    """Full native vectors (vscalefps on AVX-512), short vectors with masked
    tails and scalar code agree."""
    args = np.concatenate([SPECIAL, rng.standard_normal(3000).astype(np.float32) * 20,
                           SWEEP[::997]]).astype(np.float32)
    for n in (args.size, 7, 3):
        x, y = build(name, n)
        a = args[:n]
        got, scalar = te.build([x], [y])(a), unscheduled([x], [y], [a])[0]
        same = (got.view(np.int32) == scalar.view(np.int32)) | (np.isnan(got) & np.isnan(scalar))
        assert same.all(), list(zip(a[~same], got[~same], scalar[~same]))[:5]


# name: (a bound below which every lane takes the common path, arguments that do not)
COMMON_PATH = {"tanh": (0.62, lambda rng, n: rng.uniform(-5, 5, n)),
               "exp": (80.0, lambda rng, n: rng.choice([-100.0, -87.0, -86.6, 88.4, 88.6, np.nan], n)),
               "sigmoid": (80.0, lambda rng, n: rng.choice([-100.0, -86.0, 85.5, 90.0, np.nan], n))}


@pytest.mark.parametrize("name", sorted(COMMON_PATH))
def test_a_value_does_not_depend_on_its_vector(rng, name):
    """tanh skips its large-argument formula, and exp and sigmoid their
    subnormal-safe scaling, for vectors whose lanes all allow it: a value
    gives the same bits among common ones or mixed ones."""
    bound, uncommon = COMMON_PATH[name]
    common = rng.uniform(-bound, bound, 4096).astype(np.float32)
    mixed = common.copy()
    mixed[::37] = uncommon(rng, mixed[::37].size)                   # in some vectors only
    x, y = build(name, 4096)
    f = te.build([x], [y])
    got = f(mixed)
    keep = np.ones(4096, bool)
    keep[::37] = False
    np.testing.assert_array_equal(f(common)[keep], got[keep])
    order = rng.permutation(4096)
    np.testing.assert_array_equal(f(mixed[order]), got[order])
    np.testing.assert_array_equal(got, unscheduled([x], [y], [mixed])[0])


def test_a_stage_applying_a_function_often_calls_one_copy_of_it(rng):
    """A stage applying tanh to more than ``INLINE_MATH_USES`` vectors (an RNN
    step's register tile) calls one copy of its code per vector width (a
    partial last vector may run narrower), a function of the module; a
    stage applying it once keeps it inline.  Both agree with the
    scalar path to 1 ulp: on AVX-512 a few lanes differ by 1 ulp (LLVM may
    fuse a multiply and an add into one fma, ``contract``, and does not fuse
    the same ones in the vector and the scalar loop)."""
    import functools
    import operator
    import re

    from lowering.codegen_llvm import INLINE_MATH_USES
    n = 1000
    a = np.concatenate([SPECIAL, rng.standard_normal(n - SPECIAL.size).astype(np.float32) * 3])
    x = te.placeholder((n,), "float32", "x")
    copy = re.compile(r"define internal fastcc <\d+ x float> @\"?te\.tanh\.v\d+f32")
    for uses in (1, INLINE_MATH_USES + 1):
        y = te.compute((n,), lambda i: functools.reduce(operator.add, [te.tanh(x[i] * float(k))
                                                                       for k in range(1, uses + 1)]), name="y")
        kernel = te.build([x], [y])
        assert bool(copy.findall(kernel.llvm_ir)) == (uses > INLINE_MATH_USES)
        got, scalar = kernel(a), unscheduled([x], [y], [a])[0]
        close = (np.abs(got.astype(np.float64) - scalar) <= np.spacing(np.abs(scalar))) \
            | (np.isnan(got) & np.isnan(scalar))
        assert close.all(), list(zip(a[~close], got[~close], scalar[~close]))[:5]
