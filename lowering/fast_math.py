"""Inline, vectorisable float32 implementations of exp, log, log1p and tanh.

libm calls are opaque to LLVM: a loop that calls ``tanhf`` is not
vectorised, and a ``<16 x float>`` call to ``llvm.exp`` becomes sixteen
scalar calls.  These implementations are plain LLVM IR arithmetic on a
float32 scalar or a ``<N x float>`` vector, so the same code serves scalar
loops, the loop vectoriser and the explicit vector loops of ``schedule.py``
(and a value computes to the same bits on every path).

Algorithms (Cephes single precision, Moshier): exp reduces ``x = n ln2 + r``
with a two-part ln2 (Cody-Waite), a degree-6 polynomial for ``e^r`` and a
two-step power-of-two scaling (so results in the subnormal range round
once); log splits ``x = m 2^e`` with ``m`` in ``[sqrt(1/2), sqrt(2))`` and
uses a degree-9 polynomial; log1p corrects ``log(1 + x)`` for the rounding
of ``1 + x``; tanh uses an odd polynomial below 0.625 and
``1 - 2 / (e^{2|x|} + 1)`` above.  Measured against float64 numpy over
±1e38 (tests/test_schedule.py): at most 2 ulp (exp, log, tanh) and 3 ulp
(log1p); 0, ±inf, nan and subnormal arguments follow C99/numpy.

No fast-math flags other than ``contract`` are used: reassociation would
undo the Cody-Waite reduction.  float64 keeps libm (``llvm.exp.f64``...).
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

_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)


def exp_f32(fe, x):
    o = _Ops(fe, x)
    xc = o.call("llvm.minnum", o.call("llvm.maxnum", x, o.f(-104.0)), o.f(88.8))
    n = o.call("llvm.rint", o.mul(xc, o.f(1.44269504088896341)))
    r = o.sub(xc, o.mul(n, o.f(0.693359375)))
    r = o.sub(r, o.mul(n, o.f(-2.12194440e-4)))
    z = o.mul(r, r)
    p = o.add(o.add(o.mul(o.horner(r, _EXP_POLY), z), r), o.f(1.0))
    if o.n == 16 and getattr(fe, "avx512", False):     # p * 2^n in one instruction, rounded once
        vt = o.t(F32)
        fn = fe.intrinsic("llvm.x86.avx512.mask.scalef.ps.512", vt, [vt, vt, vt, ir.IntType(16), I32])
        y = o.b.call(fn, [p, n, ir.Constant(vt, None), ir.Constant(ir.IntType(16), -1), ir.Constant(I32, 4)])
        return o.b.select(o.isnan(x), x, y)
    ni = o.b.fptosi(n, o.t(I32))                       # in [-150, 128]
    half = o.b.ashr(ni, o.i(1))
    y = o.mul(o.mul(p, o.pow2(half)), o.pow2(o.b.sub(ni, half)))
    return o.b.select(o.isnan(x), x, y)


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


def tanh_f32(fe, x):
    o = _Ops(fe, x)
    a = o.call("llvm.fabs", x)
    z = o.mul(x, x)
    small = o.add(o.mul(o.mul(o.horner(z, _TANH_POLY), z), x), x)
    e = exp_f32(fe, o.add(a, a))
    large = o.sub(o.f(1.0), o.div(o.f(2.0), o.add(e, o.f(1.0))))
    large = o.call("llvm.copysign", large, x)
    return o.b.select(o.lt(a, o.f(0.625)), small, large)


FAST_MATH = {"exp": exp_f32, "log": log_f32, "log1p": log1p_f32, "tanh": tanh_f32}


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


FAST_MATH_F64 = {"exp": exp_f64, "log": log_f64, "log1p": log1p_f64}
