"""Inline, vectorisable float32 implementations of exp, log, log1p, tanh and sigmoid.

libm calls are opaque to LLVM: a loop that calls ``tanhf`` is not
vectorised, and a ``<16 x float>`` call to ``llvm.exp`` becomes sixteen
scalar calls.  These implementations are plain LLVM IR arithmetic on a
float32 scalar or a ``<N x float>`` vector, so the same code serves scalar
loops, the loop vectoriser and the explicit vector loops of ``schedule/``
(and a value computes to the same bits on every path).

Algorithms: exp reduces ``x = n ln2 + r`` (``n = rint(x / ln2)`` from one fma,
a two-part ln2 as in Cody-Waite), takes ``e^r = 1 + r H(r)`` from a degree-6
minimax polynomial and scales by ``2^n`` with one rounding: vscalefps on
AVX-512 vectors of a multiple of 16 lanes; elsewhere, where every lane's result
is a normal float, ``n`` added to the exponent field (two integer operations,
and ``x`` needs no clamp), else two power-of-two factors, so subnormal results
round once, in a branch taken only by vectors with a lane out of that range.
log (Cephes, Moshier) splits ``x = m 2^e`` with ``m`` in
``[sqrt(1/2), sqrt(2))`` and uses a degree-9 polynomial; log1p corrects
``log(1 + x)`` for the rounding of ``1 + x``.  tanh uses an odd polynomial
below 0.625 and ``1 - 2e / (1 + e)``, ``e = e^{-2|x|}``, above, with
``2 / (1 + e)`` a polynomial in ``e`` (no division).  sigmoid divides once:
``1 / (1 + e)`` or ``e / (1 + e)``, ``e = e^{-|x|}``.  Measured against float64
numpy on all 2^32 float32 (tests/test_fast_math.py samples them) on a target
with FMA (x86-64-v3 and later, every AArch64): exp 0.90 ulp, tanh 1.17,
sigmoid 2.40 (at x = -4.157: the rounding of ``e`` counts twice where the
result falls a binade below it); log at most 2 and log1p 3 ulp over ±1e38.
numpy's float32 ``1 / (1 + exp(-x))`` reaches 2.97 ulp and PyTorch's and JAX's
sigmoid 2.3 on the test's sweep where |x| < 80, and all three lose the result below -88.7, where
``exp(-x)`` overflows.  One division costs less than the ten instructions of
a division-free form (a polynomial for ``1 / (1 + e)`` refined by a Newton step,
1.41 ulp): with it the elementwise benchmark kernel runs 0.66 ms against 0.78
built for AVX2 and 0.43 against 0.49 for AVX-512 (both on an AMD EPYC Zen 4).  Without FMA
(SSE targets such as x86-64-v2) the reduction's products round separately: exp
reaches 1.09 ulp.
0, -0, ±inf, nan, subnormal and huge arguments follow C99/numpy.

No fast-math flags other than ``contract`` are used: reassociation would
undo the Cody-Waite reduction.  float64 exp, log and log1p (fdlibm) are at
the end (their divisions stay: rcp14 and two Newton steps measured slower);
float64 tanh calls libm and float64 sigmoid divides (``codegen_llvm._sigmoid``).
"""
from __future__ import annotations

from llvmlite import ir

F32 = ir.FloatType()
I32 = ir.IntType(32)
FLAGS = ("contract",)


class _Ops:
    """Scalar-or-vector arithmetic on one IR builder, constants splatted to the operand shape."""

    def __init__(self, fe, like):
        self.fe, self.b = fe, fe.b
        self.n = like.type.count if isinstance(like.type, ir.VectorType) else None
        self.scalef = fe.target.scale_intrinsic if self.n and self.n % 16 == 0 else None   # vscalefps, 16 lanes at a time

    def t(self, scalar):
        return scalar if self.n is None else ir.VectorType(scalar, self.n)

    def f(self, v):
        return ir.Constant(self.t(F32), float(v))

    def i(self, v):
        return ir.Constant(self.t(I32), int(v))

    def add(self, a, b):
        return self.b.fadd(a, b, flags=FLAGS)

    def sub(self, a, b):
        return self.b.fsub(a, b, flags=FLAGS)

    def mul(self, a, b):
        return self.b.fmul(a, b, flags=FLAGS)

    def div(self, a, b):
        return self.b.fdiv(a, b, flags=FLAGS)

    def horner(self, x, coefficients):
        """``c0 x^(n-1) + ... + c_{n-1}`` (highest power first)."""
        acc = self.f(coefficients[0])
        for c in coefficients[1:]:
            acc = self.add(self.mul(acc, x), self.f(c))
        return acc

    def call(self, name, *args):
        return self.fe.call_intrinsic(name, args)

    def lt(self, a, b):
        return self.b.fcmp_ordered("<", a, b)

    def eq(self, a, b):
        return self.b.fcmp_ordered("==", a, b)

    def isnan(self, a):
        return self.b.fcmp_unordered("uno", a, a)

    def pow2(self, n):
        """``2.0 ** n`` for an int32 ``n`` in [-126, 127]."""
        return self.b.bitcast(self.b.shl(self.b.add(n, self.i(127)), self.i(23)), self.t(F32))


# ------------------------------------------------------------------------ exp

# e^r - 1 = r H(r) on |r| <= ln2/2, H of degree 5 (minimax for e^r: relative error 2^-28)
_EXPM1_POLY = (1.3814583654e-3, 8.3687240258e-3, 4.1668388993e-2, 1.6666521132e-1, 4.9999994040e-1, 1.0)
_ROUND = 12582912.0                 # 1.5 * 2^23: x + _ROUND - _ROUND rounds x to an integer


def _exp_reduce(o, x):
    """``x = n ln2 + r``, ``|r| <= ln2/2``: ``n = rint(x / ln2)`` (one fma against
    1.5 2^23 rounds the exact product into ``t = n + 1.5 2^23``), ``r`` with a
    two-part ln2 (Cody-Waite: ``n ln2_hi`` is exact).  Meant for ``x`` in
    [-104, 88.8]: :func:`_exp` clamps ``x`` to that, or keeps a result only
    where ``e^x`` is normal.  Returns ``(t, n, r, H(r))``."""
    t = o.add(o.mul(x, o.f(1.44269504088896341)), o.f(_ROUND))
    n = o.sub(t, o.f(_ROUND))
    r = o.sub(x, o.mul(n, o.f(0.693359375)))
    r = o.sub(r, o.mul(n, o.f(-2.12194440e-4)))
    return t, n, r, o.horner(r, _EXPM1_POLY)


def _ldexp(o, p, n):
    """``p 2^n`` rounded once (``n`` an integral float in [-150, 128]):
    vscalefps on AVX-512 vectors of a multiple of 16 lanes (16 at a time; NaN stays
    NaN), else two power-of-two factors (``n = NaN`` is poison there: callers
    select NaN lanes afterwards)."""
    if o.scalef:
        vt = ir.VectorType(F32, 16)
        fn = o.fe.intrinsic(o.scalef, vt, [vt, vt, vt, ir.IntType(16), I32])
        flags = [ir.Constant(vt, None), ir.Constant(ir.IntType(16), -1), ir.Constant(I32, 4)]
        return o.fe.joined([o.b.call(fn, [o.fe.lanes_of(p, k, 16), o.fe.lanes_of(n, k, 16)] + flags)
                            for k in range(0, o.n, 16)])
    ni = o.b.fptosi(n, o.t(I32))
    half = o.b.ashr(ni, o.i(1))
    return o.mul(o.mul(p, o.pow2(half)), o.pow2(o.b.sub(ni, half)))


def _ldexp_normal(o, p, t):
    """``p 2^n`` for ``t = n + 1.5 2^23`` (from :func:`_exp_reduce`) where ``p``
    and ``p 2^n`` are normal floats: ``n`` is the low bits of ``t``'s
    mantissa, so ``t``'s bits shifted left by 23 are ``n`` in the exponent
    field (1.5 2^23's own bits shift out), added to ``p``'s.  Two integer
    operations against :func:`_ldexp`'s nine, the same bits."""
    b = o.b
    bits = b.add(b.bitcast(p, o.t(I32)), b.shl(b.bitcast(t, o.t(I32)), o.i(23)))
    return b.bitcast(bits, o.t(F32))


def _exp(o, x, normal, clamp):
    """``e^x``, ``x`` clamped by ``clamp`` where that leaves the result unchanged.
    Vectors without vscalefps whose lanes all satisfy ``normal()`` (``e^x`` a
    normal float) skip the clamp and scale by :func:`_ldexp_normal`; other
    vectors (a branch), scalars and vscalefps clamp and scale by
    :func:`_ldexp`, NaN passing through.  Both give the same bits where
    ``normal()`` holds."""
    def scaled():
        _, n, r, h = _exp_reduce(o, clamp(x))
        return _nan_through(o, x, _ldexp(o, o.add(o.mul(r, h), o.f(1.0)), n))
    if o.n is None or o.scalef:
        return scaled()
    t, _, r, h = _exp_reduce(o, x)
    return _unless_all(o, normal(), _ldexp_normal(o, o.add(o.mul(r, h), o.f(1.0)), t), scaled)


def _nan_through(o, x, y):
    """``y``, or ``x`` where ``x`` is NaN (needed where :func:`_ldexp` is not vscalefps)."""
    return y if o.scalef else o.b.select(o.isnan(x), x, y)


def exp_f32(fe, x):
    o = _Ops(fe, x)
    # |x| < 86.5: n in [-125, 125], p in [0.70, 1.42] and p 2^n normal (NaN fails the test)
    return _exp(o, x, lambda: o.lt(o.call("llvm.fabs", x), o.f(86.5)),
                lambda v: o.call("llvm.minimum", o.call("llvm.maximum", v, o.f(-104.0)), o.f(88.8)))


# ------------------------------------------------------------------------ log

_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
             1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
             3.3333331174e-1)


def log_f32(fe, x):
    o = _Ops(fe, x)
    b = o.b
    tiny = o.lt(x, o.f(1.17549435e-38))                 # subnormal (or <= 0): scale up by 2^23
    xs = b.select(tiny, o.mul(x, o.f(8388608.0)), x)
    bits = b.bitcast(xs, o.t(I32))
    e = b.sub(b.and_(b.lshr(bits, o.i(23)), o.i(0xFF)), o.i(126))
    e = b.sub(e, b.select(tiny, o.i(23), o.i(0)))
    m = b.bitcast(b.or_(b.and_(bits, o.i(0x007FFFFF)), o.i(0x3F000000)), o.t(F32))   # [0.5, 1)
    low = o.lt(m, o.f(0.707106781186547524))
    e = b.sub(e, b.select(low, o.i(1), o.i(0)))
    f = o.sub(b.select(low, o.add(m, m), m), o.f(1.0))
    z = o.mul(f, f)
    y = o.mul(o.mul(o.horner(f, _LOG_POLY), f), z)
    fe_ = b.sitofp(e, o.t(F32))
    y = o.add(y, o.mul(fe_, o.f(-2.12194440e-4)))
    y = o.sub(y, o.mul(z, o.f(0.5)))
    r = o.add(o.add(f, y), o.mul(fe_, o.f(0.693359375)))
    inf = o.f(float("inf"))
    r = b.select(o.eq(x, inf), inf, r)
    r = b.select(o.eq(x, o.f(0.0)), o.f(float("-inf")), r)
    return b.select(b.fcmp_unordered("<", x, o.f(0.0)), o.f(float("nan")), r)   # x < 0 or nan


def log1p_f32(fe, x):
    o = _Ops(fe, x)
    u = o.add(x, o.f(1.0))
    r = o.add(log_f32(fe, u), o.div(o.sub(x, o.sub(u, o.f(1.0))), u))
    r = o.b.select(o.eq(u, o.f(1.0)), x, r)            # |x| < 2^-24: log1p(x) = x (keeps -0.0)
    inf = o.f(float("inf"))
    r = o.b.select(o.eq(x, inf), inf, r)
    return o.b.select(o.eq(x, o.f(-1.0)), o.f(float("-inf")), r)


# ----------------------------------------------------------------------- tanh

_TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
              -3.33332819422e-1)
# -2 / (1 + e) on [0, e^-1.25], minimax degree 6: e times the error is below 2^-29
_TANH_RCP = (-0.71962589025, 1.53078544140, -1.90064382553, 1.98790407181, -1.99919509888,
             1.99997437000, -1.99999976158)


def tanh_f32(fe, x):
    """An odd polynomial in ``x`` below ``|x| = 0.625``; above, ``1 - 2e / (1 + e)``
    with ``e = e^{-2|x|}`` in (0, e^-1.25] and ``-2 / (1 + e)`` a polynomial in
    ``e`` (no division).  Both take the sign bit of ``x`` (one ``or``: the
    polynomial ``x + x (z P(z))`` has it already except at x = -0, where
    ``z P(z) = -0`` and the sum rounds to +0).  ``|x|``
    is clamped at 9.1, where tanh rounds to 1.  A vector whose lanes are all
    below 0.625 skips the second formula (a branch)."""
    o = _Ops(fe, x)
    b = o.b
    sign = b.and_(b.bitcast(x, o.t(I32)), o.i(-0x80000000))

    def signed(y):
        return b.bitcast(b.or_(b.bitcast(y, o.t(I32)), sign), o.t(F32))
    a = o.call("llvm.fabs", x)
    z = o.mul(x, x)
    small = signed(o.add(o.mul(o.mul(o.horner(z, _TANH_POLY), z), x), x))
    is_small = b.fcmp_unordered("<", a, o.f(0.625))                     # NaN: small

    def either():
        t, _, r, h = _exp_reduce(o, o.mul(o.call("llvm.minimum", a, o.f(9.1)), o.f(-2.0)))
        e = _ldexp_normal(o, o.add(o.mul(r, h), o.f(1.0)), t)          # n in [-27, 0]
        return b.select(is_small, small, signed(o.add(o.mul(e, o.horner(e, _TANH_RCP)), o.f(1.0))))
    return either() if o.n is None else _unless_all(o, is_small, small, either)


def _unless_all(o, cond, value, compute):
    """``value`` if ``cond`` holds in every lane, else ``compute()``, emitted in a
    block that runs only then."""
    b, fn = o.b, o.fe.fn
    entry = b.block
    run, done = fn.append_basic_block("fast_math.run"), fn.append_basic_block("fast_math.done")
    reduce_and = o.fe.intrinsic(f"llvm.vector.reduce.and.v{o.n}i1", ir.IntType(1), [cond.type])
    b.cbranch(b.call(reduce_and, [cond]), done, run)
    b.position_at_end(run)
    computed = compute()
    run_end = b.block
    b.branch(done)
    b.position_at_end(done)
    result = b.phi(value.type)
    result.add_incoming(value, entry)
    result.add_incoming(computed, run_end)
    return result


# -------------------------------------------------------------------- sigmoid


def sigmoid_f32(fe, x):
    """``1 / (1 + e)`` for x >= 0 and ``e / (1 + e)`` below, ``e = e^-|x|`` in (0, 1]:
    no overflow, and tiny results keep their precision down to the subnormals
    (the module's doc: why one division)."""
    o = _Ops(fe, x)
    a = o.call("llvm.fabs", x)
    # |x| < 86.5: e normal (NaN fails the test)
    e = _exp(o, o.b.fneg(a), lambda: o.lt(a, o.f(86.5)), lambda v: o.call("llvm.maximum", v, o.f(-104.0)))
    below = o.b.icmp_signed("<", o.b.bitcast(x, o.t(I32)), o.i(0))      # the sign bit: -0 gives e^0 / 2 too
    return o.div(o.b.select(below, e, o.f(1.0)), o.add(e, o.f(1.0)))




# ------------------------------------------------------------------ float64

F64 = ir.DoubleType()
I64 = ir.IntType(64)


class _Ops64(_Ops):
    def f(self, v):
        return ir.Constant(self.t(F64), float(v))

    def i(self, v):
        return ir.Constant(self.t(I64), int(v))


# fdlibm e_log.c: log(1 + f) = f - f^2/2 + s (f^2/2 + R(s^2)), s = f / (2 + f)
_LG = (1.479819860511658591e-01, 1.531383769920937332e-01, 1.818357216161805012e-01,
       2.222219843214978396e-01, 2.857142874366239149e-01, 3.999999999940941908e-01,
       6.666666666666735130e-01)
_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10


def log_f64(fe, x):
    o = _Ops64(fe, x)
    b = o.b
    tiny = o.lt(x, o.f(2.2250738585072014e-308))          # subnormal (or <= 0): scale by 2^54
    xs = b.select(tiny, o.mul(x, o.f(18014398509481984.0)), x)
    bits = b.bitcast(xs, o.t(I64))
    e = b.sub(b.and_(b.lshr(bits, o.i(52)), o.i(0x7FF)), o.i(1022))
    e = b.sub(e, b.select(tiny, o.i(54), o.i(0)))
    m = b.bitcast(b.or_(b.and_(bits, o.i(0x000FFFFFFFFFFFFF)), o.i(0x3FE0000000000000)), o.t(F64))
    low = o.lt(m, o.f(0.70710678118654752440))
    e = b.sub(e, b.select(low, o.i(1), o.i(0)))
    f = o.sub(b.select(low, o.add(m, m), m), o.f(1.0))      # f in [sqrt(1/2) - 1, sqrt(2) - 1)
    s = o.div(f, o.add(o.f(2.0), f))
    z = o.mul(s, s)
    r = o.mul(z, o.horner(z, _LG))
    hfsq = o.mul(o.mul(o.f(0.5), f), f)
    k = b.sitofp(e, o.t(F64))
    y = o.sub(o.sub(hfsq, o.add(o.mul(s, o.add(hfsq, r)), o.mul(k, o.f(_LN2_LO)))), f)
    y = o.sub(o.mul(k, o.f(_LN2_HI)), y)
    inf = o.f(float("inf"))
    y = b.select(o.eq(x, inf), inf, y)
    y = b.select(o.eq(x, o.f(0.0)), o.f(float("-inf")), y)
    return b.select(b.fcmp_unordered("<", x, o.f(0.0)), o.f(float("nan")), y)


def log1p_f64(fe, x):
    o = _Ops64(fe, x)
    u = o.add(x, o.f(1.0))
    r = o.add(log_f64(fe, u), o.div(o.sub(x, o.sub(u, o.f(1.0))), u))
    r = o.b.select(o.eq(u, o.f(1.0)), x, r)
    inf = o.f(float("inf"))
    r = o.b.select(o.eq(x, inf), inf, r)
    return o.b.select(o.eq(x, o.f(-1.0)), o.f(float("-inf")), r)


# fdlibm e_exp.c: exp(r) = 1 + r + r c / (2 - c), c = r - r^2 P(r^2)
_EXP_P = (4.13813679705723846039e-08, -1.65339022054652515390e-06, 6.61375632143793436117e-05,
          -2.77777777770155933842e-03, 1.66666666666666019037e-01)


def exp_f64(fe, x):
    o = _Ops64(fe, x)
    b = o.b
    xc = o.call("llvm.minnum", o.call("llvm.maxnum", x, o.f(-746.0)), o.f(710.0))
    n = o.call("llvm.rint", o.mul(xc, o.f(1.44269504088896338700e+00)))
    hi = o.sub(xc, o.mul(n, o.f(6.93147180369123816490e-01)))
    lo = o.mul(n, o.f(1.90821492927058770002e-10))
    r = o.sub(hi, lo)
    z = o.mul(r, r)
    c = o.sub(r, o.mul(z, o.horner(z, _EXP_P)))
    y = o.sub(o.f(1.0), o.sub(o.sub(lo, o.div(o.mul(r, c), o.sub(o.f(2.0), c))), hi))
    ni = b.fptosi(n, o.t(I64))                          # in [-1077, 1025]
    third = b.sdiv(ni, o.i(3))
    pow2 = [third, third, b.sub(ni, b.mul(third, o.i(2)))]
    for p in pow2:                                      # three steps keep every factor normal
        y = o.mul(y, b.bitcast(b.shl(b.add(p, o.i(1023)), o.i(52)), o.t(F64)))
    return b.select(o.isnan(x), x, y)


def sigmoid_f64(fe, x):
    """``1 / (1 + e^-x)`` for x >= 0 and ``e^x / (1 + e^x)`` below (no overflow:
    tiny results keep their precision down to the subnormals)."""
    o = _Ops64(fe, x)
    one = o.f(1.0)
    e = exp_f64(fe, o.b.fneg(o.call("llvm.fabs", x)))
    top = o.b.select(o.b.fcmp_ordered(">=", x, o.f(0.0)), one, e)
    return o.div(top, o.add(one, e))


# ------------------------------------------------------ either float dtype


def _ops_of(fe, x):
    return (_Ops if _element_type(x) == F32 else _Ops64)(fe, x)


def _element_type(x):
    return x.type.element if isinstance(x.type, ir.VectorType) else x.type


def rsqrt(fe, x):
    """``1 / sqrt(x)``, two correctly rounded steps (within one ulp; no
    approximate reciprocal)."""
    o = _ops_of(fe, x)
    return o.b.fdiv(o.f(1.0), o.call("llvm.sqrt", x))


def sign(fe, x):
    """-1, 1, or ``x + 0`` (+0 for either zero, as numpy; NaN stays NaN)."""
    o = _ops_of(fe, x)
    b = o.b
    return b.select(b.fcmp_ordered(">", x, o.f(0.0)), o.f(1.0),
                    b.select(b.fcmp_ordered("<", x, o.f(0.0)), o.f(-1.0), o.add(x, o.f(0.0))))


# The bodies by (operator of te_autodiff/ops.py, dtype): codegen_llvm uses
# them in place of the operator's LLVM intrinsic or libm function.
BODIES = {
    ("exp", "float32"): exp_f32, ("log", "float32"): log_f32, ("log1p", "float32"): log1p_f32,
    ("tanh", "float32"): tanh_f32, ("sigmoid", "float32"): sigmoid_f32,
    ("exp", "float64"): exp_f64, ("log", "float64"): log_f64, ("log1p", "float64"): log1p_f64,
    ("sigmoid", "float64"): sigmoid_f64,
    **{(op, dtype): body for op, body in (("rsqrt", rsqrt), ("sign", sign)) for dtype in ("float32", "float64")},
}
