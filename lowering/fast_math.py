"""Inline, vectorisable bodies of the math functions of te's operator table.

libm calls are opaque to LLVM: a loop that calls ``tanhf`` is not
vectorised, and a ``<16 x float>`` call to ``llvm.exp`` becomes sixteen
scalar calls.  These bodies are plain LLVM IR arithmetic on a float scalar
or a ``<N x T>`` vector, so the same code serves scalar loops, the loop
vectoriser and the explicit vector loops of ``schedule/`` (and a value
computes to the same bits on every path).  :data:`BODIES` registers them by
(operator of ``te_autodiff/ops.py``, dtype); codegen_llvm uses one where it
exists, else the operator's LLVM intrinsic or libm function.

float32 algorithms: exp reduces ``x = n ln2 + r`` (``n = rint(x / ln2)`` from
one fma, a two-part ln2 as in Cody-Waite), takes ``e^r = 1 + r H(r)`` from a
degree-6 minimax polynomial and scales by ``2^n`` with one rounding:
vscalefps on AVX-512 vectors of a multiple of 16 lanes (vscalefpd: 8); elsewhere, where
every lane's result is a normal float, ``n`` added to the exponent field
(two integer operations, and ``x`` needs no clamp), else two power-of-two
factors, so subnormal results round once, in a branch taken only by vectors
with a lane out of that range; exp2 and expm1 share the reduction.  log
(Cephes, Moshier) splits ``x = m 2^e`` with ``m`` in ``[sqrt(1/2),
sqrt(2))`` and uses a degree-9 polynomial; log2, log10 and log1p build on
it.  tanh uses an odd polynomial below 0.625 and ``1 - 2e / (1 + e)``, ``e =
e^{-2|x|}``, above, with ``2 / (1 + e)`` a polynomial in ``e`` (no
division).  sigmoid divides once: ``1 / (1 + e)`` or ``e / (1 + e)``, ``e =
e^{-|x|}`` (one division costs less than a division-free form's Newton
step).  erf is an odd polynomial below 1 and ``1 - e^(R - x²)`` above.
sin, cos and tan reduce by pi/2 and evaluate their polynomials in float64
(float32 needs no more), calling libm past 2^19.

float64: exp is float32's algorithm with a degree-10 ``H`` (the float
type's constants are attributes of its ``_Ops`` class; no division); expm1,
log and log1p follow fdlibm (their divisions stay: rcp14 and two Newton
steps measured slower), log2 and log10 fdlibm's split of
``log(1 + f)`` into a 32-bit head and a tail; exp2 is a polynomial in the
fraction; tanh, erf, sin, cos and tan follow their float32 forms with longer
polynomials.

Polynomials not from fdlibm or Cephes were fitted to the relative error
(weighted least squares at Chebyshev nodes in mpmath, reweighted toward the
minimax).  tests/test_fast_math.py and tests/test_ops.py state the bound of
each function.  0, -0, ±inf, nan, subnormal and huge arguments follow
C99/numpy.

No fast-math flags other than ``contract`` are used: reassociation would
undo the Cody-Waite reductions.
"""
from __future__ import annotations

from llvmlite import ir

from te_autodiff.ops import OPS

F32 = ir.FloatType()
I32 = ir.IntType(32)
FLAGS = ("contract",)


# e^r - 1 = r H(r) on |r| <= ln2/2, H of degree 5 (minimax for e^r: relative error 2^-28)
_EXPM1_POLY = (1.3814583654e-3, 8.3687240258e-3, 4.1668388993e-2, 1.6666521132e-1, 4.9999994040e-1, 1.0)
# the same of degree 10 for float64 (relative error of e^r 2^-56.2)
_EXPM1_POLY_F64 = (2.4991424057761177e-08, 2.763103457023136e-07, 2.755762672715492e-06, 2.480149063483508e-05,
                   0.00019841269436758974, 0.0013888888946354536, 0.008333333333549714, 0.04166666666651782,
                   0.16666666666666216, 0.5000000000000012, 1.0)


class _Ops:
    """Scalar-or-vector arithmetic on one IR builder, constants splatted to
    the operand shape; the float type's layout and the constants of the
    algorithms that depend on its precision are class attributes."""

    float_type, int_type = F32, I32      # the float and the integers of its width
    mantissa_bits, bias = 23, 127
    exp_ln2 = (0.693359375, -2.12194440e-4)     # ln2 = hi + lo, n hi exact for the n of exp
    expm1_poly = _EXPM1_POLY
    exp_normal = 86.5                    # |x| below it: e^x normal, n in [-125, 125]
    exp_clamp = (-104.0, 88.8)           # e^x rounds to 0 / inf beyond (n stays in [-150, 128])

    def __init__(self, fe, like):
        self.fe, self.b = fe, fe.b
        self.n = like.type.count if isinstance(like.type, ir.VectorType) else None
        scale = fe.target.scale_intrinsic(self.float_type == F32)       # (name, lanes a call scales)
        self.scalef, self.scalef_lanes = scale if scale and self.n and self.n % scale[1] == 0 else (None, None)

    def t(self, scalar):
        return scalar if self.n is None else ir.VectorType(scalar, self.n)

    def f(self, v):
        return ir.Constant(self.t(self.float_type), float(v))

    def i(self, v):
        return ir.Constant(self.t(self.int_type), int(v))

    @property
    def round_bias(self):
        """1.5 2^m (m the mantissa bits): ``y + it - it`` rounds ``y`` (|y| < 2^(m-1)) to an integer."""
        return self.f(1.5 * 2.0 ** self.mantissa_bits)

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

    SPLIT = 4097.0                  # 2^12 + 1: Veltkamp's splitter for 24-bit significands

    def fma(self, a, b, c):
        """``a·b + c`` rounded once where the target has an fma instruction;
        elsewhere (``llvm.fma`` would be a libm call per lane) rounded twice,
        for the corrections whose own error is negligible."""
        if self.fe.target.fma:
            return self.call("llvm.fma", a, b, c)
        return self.b.fadd(self.b.fmul(a, b), c)

    def product_error(self, a, b, p):
        """``a·b - p`` exactly, ``p`` the rounded ``a·b``: one fma, or without
        one Dekker's product of Veltkamp halves (no contraction: every
        rounding is the one the algorithm counts on)."""
        if self.fe.target.fma:
            return self.call("llvm.fma", a, b, self.b.fneg(p))
        b_ = self.b

        def halves(x):
            c = b_.fmul(self.f(self.SPLIT), x)
            hi = b_.fsub(c, b_.fsub(c, x))
            return hi, b_.fsub(x, hi)

        (ah, al), (bh, bl) = halves(a), halves(b)
        err = b_.fsub(b_.fmul(ah, bh), p)
        err = b_.fadd(b_.fadd(err, b_.fmul(ah, bl)), b_.fmul(al, bh))
        return b_.fadd(err, b_.fmul(al, bl))

    def residual(self, f, a, b):
        """``f - a·b`` rounded once, for ``a·b`` within an ulp or so of ``f``
        (a quotient's remainder): one fma, or ``(f - p) - (a·b - p)``, whose
        first difference is exact (Sterbenz) and second :meth:`product_error`."""
        if self.fe.target.fma:
            return self.call("llvm.fma", self.b.fneg(a), b, f)
        p = self.b.fmul(a, b)
        return self.b.fsub(self.b.fsub(f, p), self.product_error(a, b, p))

    def lt(self, a, b):
        return self.b.fcmp_ordered("<", a, b)

    def eq(self, a, b):
        return self.b.fcmp_ordered("==", a, b)

    def isnan(self, a):
        return self.b.fcmp_unordered("uno", a, a)

    def pow2(self, n):
        """``2.0 ** n`` for an integer ``n`` of the float's width, 2^n a normal float."""
        return self.b.bitcast(self.b.shl(self.b.add(n, self.i(self.bias)), self.i(self.mantissa_bits)),
                              self.t(self.float_type))


# ------------------------------------------------------------------------ exp


def _exp_reduce(o, x):
    """``x = n ln2 + r``, ``|r| <= ln2/2``: ``n = rint(x / ln2)`` (one fma against
    1.5 2^m rounds the exact product into ``t = n + 1.5 2^m``), ``r`` with a
    two-part ln2 (Cody-Waite: ``n ln2_hi`` is exact).  Meant for ``x`` within
    the float's ``exp_clamp``: :func:`_exp` clamps ``x`` to that, or keeps a
    result only where ``e^x`` is normal.  Returns ``(t, n, r, H(r))``."""
    t = o.add(o.mul(x, o.f(1.44269504088896341)), o.round_bias)
    n = o.sub(t, o.round_bias)
    hi, lo = o.exp_ln2
    r = o.sub(x, o.mul(n, o.f(hi)))
    r = o.sub(r, o.mul(n, o.f(lo)))
    return t, n, r, o.horner(r, o.expm1_poly)


def _ldexp(o, p, n):
    """``p 2^n`` rounded once (``n`` an integral float within the range
    :func:`_exp_reduce` is meant for): vscalefps / vscalefpd on AVX-512
    vectors of whole 512-bit vectors (NaN stays NaN), else two power-of-two
    factors, each normal (``n = NaN`` is poison there: callers select NaN
    lanes afterwards)."""
    if o.scalef:
        k = o.scalef_lanes
        vt, mask = ir.VectorType(o.float_type, k), ir.IntType(k)
        fn = o.fe.intrinsic(o.scalef, vt, [vt, vt, vt, mask, I32])
        flags = [ir.Constant(vt, None), ir.Constant(mask, -1), ir.Constant(I32, 4)]
        return o.fe.joined([o.b.call(fn, [o.fe.lanes_of(p, j, k), o.fe.lanes_of(n, j, k)] + flags)
                            for j in range(0, o.n, k)])
    ni = o.b.fptosi(n, o.t(o.int_type))
    half = o.b.ashr(ni, o.i(1))
    return o.mul(o.mul(p, o.pow2(half)), o.pow2(o.b.sub(ni, half)))


def _ldexp_normal(o, p, t):
    """``p 2^n`` for ``t = n + 1.5 2^m`` (from :func:`_exp_reduce`) where ``p``
    and ``p 2^n`` are normal floats: ``n`` is the low bits of ``t``'s
    mantissa, so ``t``'s bits shifted left by m are ``n`` in the exponent
    field (1.5 2^m's own bits shift out), added to ``p``'s.  Two integer
    operations against :func:`_ldexp`'s nine, the same bits."""
    b, it = o.b, o.t(o.int_type)
    bits = b.add(b.bitcast(p, it), b.shl(b.bitcast(t, it), o.i(o.mantissa_bits)))
    return b.bitcast(bits, o.t(o.float_type))


def _exp2_reduce(o, x):
    """``x = n + f``, ``|f| <= 1/2`` (``t = n + 1.5 2^m`` as in
    :func:`_exp_reduce`), ``2^x = 2^n e^r`` with ``r = f ln2``."""
    t = o.add(x, o.round_bias)
    n = o.sub(t, o.round_bias)
    r = o.mul(o.sub(x, n), o.f(0.6931471805599453))
    return t, n, r, o.horner(r, o.expm1_poly)


def _exp(o, x, normal, clamp, reduce=_exp_reduce):
    """``e^x``, ``x`` clamped by ``clamp`` where that leaves the result unchanged.
    Vectors without vscalef whose lanes all satisfy ``normal()`` (``e^x`` a
    normal float) skip the clamp and scale by :func:`_ldexp_normal`; other
    vectors (a branch), scalars and vscalef clamp and scale by
    :func:`_ldexp`, NaN passing through.  Both give the same bits where
    ``normal()`` holds."""
    def scaled():
        _, n, r, h = reduce(o, clamp(x))
        return _nan_through(o, x, _ldexp(o, o.add(o.mul(r, h), o.f(1.0)), n))
    if o.n is None or o.scalef:
        return scaled()
    t, _, r, h = reduce(o, x)
    return _unless_all(o, normal(), _ldexp_normal(o, o.add(o.mul(r, h), o.f(1.0)), t), scaled)


def _nan_through(o, x, y):
    """``y``, or ``x`` where ``x`` is NaN (needed where :func:`_ldexp` is not vscalefps)."""
    return y if o.scalef else o.b.select(o.isnan(x), x, y)


def exp(fe, x):
    """e^x in either float type (NaN fails the ``normal`` test)."""
    o = _ops_of(fe, x)
    lo, hi = o.exp_clamp
    return _exp(o, x, lambda: o.lt(o.call("llvm.fabs", x), o.f(o.exp_normal)),
                lambda v: o.call("llvm.minimum", o.call("llvm.maximum", v, o.f(lo)), o.f(hi)))


def exp2_f32(fe, x):
    o = _Ops(fe, x)
    # |x| < 125: n in [-125, 125], p in [0.70, 1.42] and p 2^n normal (NaN fails the test)
    return _exp(o, x, lambda: o.lt(o.call("llvm.fabs", x), o.f(125.0)),
                lambda v: o.call("llvm.minimum", o.call("llvm.maximum", v, o.f(-150.0)), o.f(128.0)),
                _exp2_reduce)


# ------------------------------------------------------------------------ log

_LOG2E, _LOG10E = 1.4426950408889634, 0.4342944819032518
_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
             1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
             3.3333331174e-1)


def _log_parts(o, x):
    """``x = 2^e (1 + f)`` with ``1 + f`` in ``[sqrt(1/2), sqrt(2))`` (subnormals
    scaled up first): ``(e, f, f², y)``, ``log(1 + f) = f - f²/2 + y``."""
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
    return b.sitofp(e, o.t(F32)), f, z, y


def _log_specials(o, x, r):
    """``r`` (a logarithm of ``x``), with C99's values at +inf, ±0 and below 0 (NaN)."""
    b = o.b
    inf = o.f(float("inf"))
    r = b.select(o.eq(x, inf), inf, r)
    r = b.select(o.eq(x, o.f(0.0)), o.f(float("-inf")), r)
    return b.select(b.fcmp_unordered("<", x, o.f(0.0)), o.f(float("nan")), r)   # x < 0 or nan


def log_f32(fe, x):
    o = _Ops(fe, x)
    fe_, f, z, y = _log_parts(o, x)
    y = o.add(y, o.mul(fe_, o.f(-2.12194440e-4)))
    y = o.sub(y, o.mul(z, o.f(0.5)))
    r = o.add(o.add(f, y), o.mul(fe_, o.f(0.693359375)))
    return _log_specials(o, x, r)


def log2_f32(fe, x):
    """``e + log(1 + f) / ln 2``: exact at powers of two."""
    o = _Ops(fe, x)
    fe_, f, z, y = _log_parts(o, x)
    y = o.sub(y, o.mul(z, o.f(0.5)))
    return _log_specials(o, x, o.add(fe_, o.add(o.mul(f, o.f(_LOG2E)), o.mul(y, o.f(_LOG2E)))))


def expm1_f32(fe, x):
    """``2^n (1 + p) - 1`` (:func:`_expm1_scaled`), ``p = r H(r) = e^r - 1``
    from :func:`_exp_reduce`; below -17.5 it rounds to -1."""
    o = _Ops(fe, x)
    _, n, r, h = _exp_reduce(o, o.call("llvm.minimum", o.call("llvm.maximum", x, o.f(-17.5)), o.f(88.8)))
    return _expm1_scaled(o, x, n, o.mul(r, h))


def log10_f32(fe, x):
    """``e log10(2) + log(1 + f) / ln 10``, ``log10(2)`` in two parts (the
    first of 12 bits: ``e`` times it is exact)."""
    o = _Ops(fe, x)
    fe_, f, z, y = _log_parts(o, x)
    y = o.sub(y, o.mul(z, o.f(0.5)))
    low = o.add(o.mul(fe_, o.f(4.605038981195214e-06)), o.add(o.mul(f, o.f(_LOG10E)), o.mul(y, o.f(_LOG10E))))
    return _log_specials(o, x, o.add(o.mul(fe_, o.f(0.301025390625)), low))


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
    """``value`` if ``cond`` holds in every lane (or for a scalar), else
    ``compute()``, emitted in a block that runs only then."""
    b, fn = o.b, o.fe.fn
    entry = b.block
    run, done = fn.append_basic_block("fast_math.run"), fn.append_basic_block("fast_math.done")
    if o.n is not None:
        reduce_and = o.fe.intrinsic(f"llvm.vector.reduce.and.v{o.n}i1", ir.IntType(1), [cond.type])
        cond = b.call(reduce_and, [cond])
    b.cbranch(cond, done, run)
    b.position_at_end(run)
    computed = compute()
    run_end = b.block
    b.branch(done)
    b.position_at_end(done)
    result = b.phi(value.type)
    result.add_incoming(value, entry)
    result.add_incoming(computed, run_end)
    return result


# ------------------------------------------------------------------------ erf

# erf(x) = x + x S(x²) on |x| < 1, S fitted to erf(x)/x - 1 (0.13 ulp)
_ERF_SMALL_F32 = (7.88876204751432e-05, -0.0008020732784643769, 0.005189523100852966, -0.026854438707232475,
                  0.11283600330352783, -0.3761262595653534, 0.12837916612625122)
# erf(x) = 1 - e^(R(|x| - 2.5) - x²) on [1, 4], R fitted to log(erfc(x)) + x² weighted by
# erfc / erf (0.04 ulp of erf); from 3.92 on it rounds to 1
_ERF_LARGE_F32 = (0.0001863299257820472, -0.00015227720723487437, 0.002464613178744912, -0.010712232440710068,
                  0.05611623823642731, -0.3526941239833832, -1.556817889213562)


def _erf(o, x, small_poly, clamp, exponent, exp_of):
    """``x + x S(x²)`` below ``|x| = 1``, ``±(1 - exp(exponent(|x|)))`` above
    (``|x|`` clamped at ``clamp``, where that rounds to 1); a vector whose
    lanes are all below 1 skips the second formula."""
    b = o.b
    a = o.call("llvm.fabs", x)
    small = o.add(o.mul(x, o.horner(o.mul(x, x), small_poly)), x)
    is_small = b.fcmp_unordered("<", a, o.f(1.0))                       # NaN: small

    def either():
        large = o.sub(o.f(1.0), exp_of(exponent(o.call("llvm.minimum", a, o.f(clamp)))))
        return b.select(is_small, small, o.call("llvm.copysign", large, x))
    return either() if o.n is None else _unless_all(o, is_small, small, either)


def erf_f32(fe, x):
    """:func:`_erf` with the exponent ``R(|x| - 2.5) - x²`` (``x²`` in the fma)."""
    o = _Ops(fe, x)

    def exp_normal(q):                  # q in [-18, -1.8]: e^q normal
        t, _, r, h = _exp_reduce(o, q)
        return _ldexp_normal(o, o.add(o.mul(r, h), o.f(1.0)), t)
    return _erf(o, x, _ERF_SMALL_F32, 4.0,
                lambda c: o.sub(o.horner(o.sub(c, o.f(2.5)), _ERF_LARGE_F32), o.mul(c, c)), exp_normal)


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
    float_type, int_type = F64, I64
    mantissa_bits, bias = 52, 1023
    SPLIT = 134217729.0             # 2^27 + 1, for 53-bit significands
    exp_ln2 = (6.93147180369123816490e-01, 1.90821492927058770002e-10)   # fdlibm's: hi has 32 bits
    expm1_poly = _EXPM1_POLY_F64
    exp_normal = 708.0              # n in [-1021, 1021]
    exp_clamp = (-746.0, 710.0)     # n in [-1077, 1025]


# fdlibm e_log.c: log(1 + f) = f - f^2/2 + s (f^2/2 + R(s^2)), s = f / (2 + f)
_LG = (1.479819860511658591e-01, 1.531383769920937332e-01, 1.818357216161805012e-01,
       2.222219843214978396e-01, 2.857142874366239149e-01, 3.999999999940941908e-01,
       6.666666666666735130e-01)
_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10


def _log_parts_f64(o, x):
    """``x = 2^k (1 + f)`` with ``1 + f`` in ``[sqrt(1/2), sqrt(2))`` (subnormals
    scaled up first): ``(k, f, s, R, f²/2)``, ``s = f / (2 + f)``, where
    ``log(1 + f) = f - (f²/2 - s (f²/2 + R))`` (fdlibm)."""
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
    return b.sitofp(e, o.t(F64)), f, s, r, hfsq


def log_f64(fe, x):
    o = _Ops64(fe, x)
    k, f, s, r, hfsq = _log_parts_f64(o, x)
    y = o.sub(o.sub(hfsq, o.add(o.mul(s, o.add(hfsq, r)), o.mul(k, o.f(_LN2_LO)))), f)
    return _log_specials(o, x, o.sub(o.mul(k, o.f(_LN2_HI)), y))


# 1/ln2, 1/ln10 and log10(2) in two parts, the first of 32 bits
_IVLN2 = (1.4426950407214463, 1.6751713164886512e-10)
_IVLN10 = (0.4342944818781689, 2.5082946711645275e-11)
_LOG10_2 = (0.3010299955494702, 1.1451100898021838e-10)


def _log_base_f64(fe, x, inverse, k_part):
    """``log(x) / log(base)`` as fdlibm's e_log2.c and e_log10.c: ``log(1 + f)
    = hi + lo`` with ``hi`` of 32 bits, each part times ``inverse`` (1/log
    base in two parts) and ``k_part(k) = (k log_base(2)`` in two parts)``
    summed with the rounding of the largest sum carried."""
    o = _Ops64(fe, x)
    b = o.b
    k, f, s, r, hfsq = _log_parts_f64(o, x)
    hi = o.sub(f, hfsq)
    hi = b.bitcast(b.and_(b.bitcast(hi, o.t(I64)), o.i(-(1 << 32))), o.t(F64))
    lo = o.add(o.sub(o.sub(f, hi), hfsq), o.mul(s, o.add(hfsq, r)))
    val_hi = o.mul(hi, o.f(inverse[0]))
    kh, kl = k_part(o, k)
    val_lo = o.add(kl, o.add(o.mul(o.add(lo, hi), o.f(inverse[1])), o.mul(lo, o.f(inverse[0]))))
    w = o.add(kh, val_hi)
    val_lo = o.add(val_lo, o.add(o.sub(kh, w), val_hi))
    return _log_specials(o, x, o.add(val_lo, w))


def log2_f64(fe, x):
    return _log_base_f64(fe, x, _IVLN2, lambda o, k: (k, o.f(0.0)))


def log10_f64(fe, x):
    return _log_base_f64(fe, x, _IVLN10, lambda o, k: (o.mul(k, o.f(_LOG10_2[0])), o.mul(k, o.f(_LOG10_2[1]))))


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


def _exp_parts_f64(o, x, lo_clamp, hi_clamp):
    """``x`` clamped, ``= n ln2 + r``, ``r = hi - lo`` (Cody-Waite), and
    ``(n, e^r - 1 - r)``'s parts of fdlibm's ``e^r = 1 - ((lo - r c / (2 - c)) - hi)``:
    returns ``(n, hi, lo - r c / (2 - c))``."""
    xc = o.call("llvm.minnum", o.call("llvm.maxnum", x, o.f(lo_clamp)), o.f(hi_clamp))
    n = o.call("llvm.rint", o.mul(xc, o.f(1.44269504088896338700e+00)))
    hi = o.sub(xc, o.mul(n, o.f(6.93147180369123816490e-01)))
    lo = o.mul(n, o.f(1.90821492927058770002e-10))
    r = o.sub(hi, lo)
    z = o.mul(r, r)
    c = o.sub(r, o.mul(z, o.horner(z, _EXP_P)))
    return n, hi, o.sub(lo, o.div(o.mul(r, c), o.sub(o.f(2.0), c)))


def _expm1_scaled(o, x, n, p):
    """``e^x - 1 = 2^n (1 + p) - 1 = 2 (h p + (h - 1/2))``, ``h = 2^(n-1)``
    (a normal float): one rounding but ``h - 1/2``'s, exact below
    ``n = 25`` (float32) or 54 (float64), and no overflow before the result's.
    Zeros keep their sign and NaN passes."""
    h = o.pow2(o.b.sub(o.b.fptosi(n, o.t(o.int_type)), o.i(1)))
    y = o.mul(o.add(o.mul(h, p), o.sub(h, o.f(0.5))), o.f(2.0))
    y = o.b.select(o.eq(x, o.f(0.0)), x, y)
    return o.b.select(o.isnan(x), x, y)


def expm1_f64(fe, x):
    """``2^n (1 + p) - 1`` (:func:`_expm1_scaled`), ``p = e^r - 1`` from
    :func:`_exp_parts_f64`; below -40 it rounds to -1."""
    o = _Ops64(fe, x)
    n, hi, low = _exp_parts_f64(o, x, -40.0, 710.0)
    return _expm1_scaled(o, x, n, o.sub(hi, low))


# 2^f = 1 + f P(f) on |f| <= 1/2, P fitted to (2^f - 1) / f (0.16 ulp)
_EXP2_POLY_F64 = (2.562558308367793e-11, 4.456572031563515e-10, 7.054974357519296e-09, 1.0178051930741918e-07,
                  1.3215486595250166e-06, 1.5252733854349019e-05, 0.00015403530393640272, 0.0013333558146392652,
                  0.00961812910762833, 0.05550410866482169, 0.24022650695910072, 0.6931471805599453)


def exp2_f64(fe, x):
    """``2^n (1 + f P(f))``, ``n = rint(x)``, ``f = x - n`` exact."""
    o = _Ops64(fe, x)
    xc = o.call("llvm.minnum", o.call("llvm.maxnum", x, o.f(-1077.0)), o.f(1025.0))
    n = o.call("llvm.rint", xc)
    f = o.sub(xc, n)
    y = o.add(o.mul(f, o.horner(f, _EXP2_POLY_F64)), o.f(1.0))
    return o.b.select(o.isnan(x), x, _ldexp(o, y, n))


# tanh(x) = x + x z P(z), z = x², on |x| < 0.625: P fitted to (tanh(x)/x - 1) / z (0.1 ulp)
_TANH_POLY_F64 = (-1.6072146196903783e-05, 7.7143442688397e-05, -0.00022856333763184513, 0.000586316071513646,
                  -0.00145495872071445, 0.0035919891395966032, -0.008863220997778311, 0.021869487575655305,
                  -0.05396825393124354, 0.13333333333262018, -0.33333333333332854)


def tanh_f64(fe, x):
    """An odd polynomial below ``|x| = 0.625``; above, ``±(1 - 2e / (1 + e))``
    with ``e = e^{-2|x|}`` (:func:`exp`; ``|x|`` clamped at 19.1, where
    tanh rounds to 1).  A vector whose lanes are all below 0.625 skips the
    second formula."""
    o = _Ops64(fe, x)
    b = o.b
    a = o.call("llvm.fabs", x)
    z = o.mul(x, x)
    small = o.call("llvm.copysign", o.add(o.mul(o.mul(o.horner(z, _TANH_POLY_F64), z), x), x), x)   # -0
    is_small = b.fcmp_unordered("<", a, o.f(0.625))                     # NaN: small

    def either():
        e = exp(fe, o.mul(o.call("llvm.minnum", a, o.f(19.1)), o.f(-2.0)))
        large = o.sub(o.f(1.0), o.div(o.add(e, e), o.add(e, o.f(1.0))))
        return b.select(is_small, small, o.call("llvm.copysign", large, x))
    return either() if o.n is None else _unless_all(o, is_small, small, either)


def sigmoid_f64(fe, x):
    """``1 / (1 + e^-x)`` for x >= 0 and ``e^x / (1 + e^x)`` below (no overflow:
    tiny results keep their precision down to the subnormals)."""
    o = _Ops64(fe, x)
    one = o.f(1.0)
    e = exp(fe, o.b.fneg(o.call("llvm.fabs", x)))
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


# erf(x) = x + x S(x²) on |x| < 1, S fitted to erf(x)/x - 1 (0.14 ulp)
_ERF_SMALL_F64 = (5.945465799045802e-11, -1.1365786815205475e-09, 1.465791111694408e-08, -1.6350029864833244e-07,
                  1.646097325319762e-06, -1.4925593533899482e-05, 0.00012055331038012314, -0.0008548326978772278,
                  0.00522397762478138, -0.026866170645072945, 0.11283791670954858, -0.3761263890318375,
                  0.1283791670955126)
# erf(x) = 1 - e^(R(|x| - c) - x²), R fitted to log(erfc(x)) + x² weighted by erfc / erf
# on [1, 2.5] (c = 1.75, 0.2 ulp of erf) and [2.5, 6] (c = 4.25); from 5.92 on it rounds to 1
_ERF_LARGE_F64 = (
    (1.0, 1.75, (9.814853039357577e-10, 2.4591566839285948e-09, -2.413196959403e-08, 1.1317758221838018e-07,
            -4.0129696716418673e-07, 8.909405370347172e-07, 8.273367777019909e-07, -2.3741504503493816e-05,
            0.00017452308956919052, -0.0009640986419330532, 0.004624930497494406, -0.020538840382078958,
            0.09005983350328156, -0.4596109008134086, -1.2553635254332227)),
    (2.5, 4.25, (-1.724750255118313e-11, -1.4660774247018357e-10, -5.422852428689726e-10, -1.858301493741646e-09,
            2.07476445461219e-09, -3.302966059728661e-08, 2.3017364530679667e-07, -1.6056251159612548e-06,
            1.088031335393668e-05, -7.237942812596361e-05, 0.00048052875024174495, -0.0032637443399698247,
            0.023915423584266876, -0.22377571552352404, -2.0452699014696445)))


def erf_f64(fe, x):
    """:func:`_erf` with the exponent's polynomial on two intervals."""
    o = _Ops64(fe, x)

    return _erf(o, x, _ERF_SMALL_F64, 6.0, lambda c: o.sub(_intervals(o, c, _ERF_LARGE_F64), o.mul(c, c)),
                lambda q: exp(fe, q))


# erfc(x) = e^(R(x - c) - x²) on [0.5, 2.5] (c = 1.5) and [2.5, 10.1] (c = 6.3), R fitted
# to log(erfc(x)) + x² (absolute errors 2^-32, 2^-33: float32 results)
_ERFC_F32 = (
    (0.5, 1.5, (0.0,) * 4 + (-8.905421328106819e-07, 2.8874755651117805e-06, -2.566824067748971e-06,
                        -2.298433425711285e-05, 0.00021591985336194027, -0.0012569949414077332,
                        0.006006757443656125, -0.025824180001790636, 0.1073596683217895, -0.5088007998216155,
                        -1.1344920895343586)),
    (2.5, 6.3, (4.6642519782585755e-14, -5.490927334138534e-13, 3.3094391761300996e-12, -2.832456346081243e-11,
           2.917479100426007e-10, -2.6023906038709008e-09, 2.226794020961034e-08, -1.9183295824578104e-07,
           1.6517363737945755e-06, -1.4286955007982695e-05, 0.00012593096285633758, -0.0011586510062997846,
           0.011734062255472645, -0.1549618031478845, -2.4251381192721686)))


def _intervals(o, x, table, parts=False):
    """``R(x - c)`` with the ``(start, c, coefficients)`` of the last entry of
    ``table`` whose start ``x`` reaches (the first's from below): the
    coefficients selected per lane, one evaluation.  With ``parts``, ``(R's
    constant coefficient, the rest)``."""
    b = o.b
    picks = [o.b.fcmp_ordered(">=", x, o.f(start)) for start, _, _ in table[1:]]

    def pick(values):
        out = o.f(values[0])
        for reached, v in zip(picks, values[1:]):
            out = b.select(reached, o.f(v), out)
        return out
    u = o.sub(x, pick([c for _, c, _ in table]))
    *rest, last = zip(*(cs for _, _, cs in table))
    acc = pick(rest[0])
    for values in rest[1:]:
        acc = o.add(o.mul(acc, u), pick(values))
    return (pick(last), o.mul(acc, u)) if parts else o.add(o.mul(acc, u), pick(last))


def erfc_f32(fe, x):
    """In float64: ``1 - erf(x)`` below 0.5, ``e^(R(x - c) - x²)`` above (``x``
    clamped at 10.1, where erfc rounds to 0)."""
    o = _Ops64(fe, x)
    xd = fe.b.fpext(x, o.t(F64))
    c = o.call("llvm.minimum", xd, o.f(10.1))
    large = exp(fe, o.sub(_intervals(o, c, _ERFC_F32), o.mul(c, c)))
    small = o.sub(o.f(1.0), erf_f64(fe, xd))
    y = fe.b.select(fe.b.fcmp_unordered("<", xd, o.f(0.5)), small, large)
    return fe.b.fptrunc(y, _Ops(fe, x).t(F32))


# erfc(x) = e^(R(x - c) - x²) on six intervals from 0.5 to 26.6, R fitted to log(erfc(x))
# + x² (absolute errors 2^-52 or less)
_ERFC_F64 = (
    (0.5, 1.0, (0.0, 0.0, 0.0, 0.0, 1.8386333254269507e-08, -6.823055979447168e-08, 1.2569326752358008e-07,
        1.0430533128746076e-07, -2.018905780565775e-06, 9.577175091452303e-06, -2.7141085419860892e-05,
        2.6270385611187598e-05, 0.0002373247072034665, -0.001977903021902414, 0.01003382543431334,
        -0.04156109804650488, 0.1568927436415144, -0.6389675142347914, -0.8496055099332482)),
    (1.5, 2.25, (0.0, 0.0, 7.0356519874973974e-12, 1.3691324310363509e-11, -2.5616819573022505e-10,
        1.5765974132992133e-09, -7.33973074161761e-09, 2.661979319796801e-08, -6.162890213485552e-08,
        -7.20956764527283e-08, 2.048289660082095e-06, -1.6603895426879752e-05, 0.00010263778796061326,
        -0.0005548409098075123, 0.0027713368321871396, -0.013312548394200843, 0.06513243312188326,
        -0.38291381054455204, -1.4649598963658184)),
    (3.0, 4.5, (0.0, 0.0, -2.4496650833357952e-14, 9.766076767433966e-14, 4.4548808055618055e-14,
        -2.948129485456878e-12, 3.6051069864115426e-11, -3.4745888545505656e-10, 2.9332887836571163e-09,
        -2.2884899363457394e-08, 1.6948748138168706e-07, -1.2102890530465134e-06, 8.432034650145397e-06,
        -5.7982950547801415e-05, 0.00039943384120126515, -0.0028252608534223606, 0.021637110340679968,
        -0.2124012752861624, -2.099768303435941)),
    (6.0, 9.0, (5.615596984063397e-20, -6.957757425978295e-19, 6.173708093784763e-18, -7.347393448249916e-17,
        8.973877711313614e-16, -1.0351613964359374e-14, 1.1791334127926582e-13, -1.3371179416395348e-12,
        1.5082669169815624e-11, -1.6961291299931397e-10, 1.907394451338805e-09, -2.1530070154010572e-08,
        2.4519561522040843e-07, -2.8392561654770458e-06, 3.3857955174467215e-05, -0.00042578690320134894,
        0.005955276630672677, -0.1097798791594661, -2.7756698795290835)),
    (12.0, 15.0, (0.0, 0.0, 6.053220757099821e-21, -1.0255092036455803e-19, 1.5310684049918325e-18,
        -2.6368466923160568e-17, 4.573547304264217e-16, -7.887122925004615e-15, 1.3650839317413194e-13,
        -2.3763870478721627e-12, 4.1701235747386115e-11, -7.401441676977066e-10, 1.3352129766366093e-08,
        -2.4668383626957493e-07, 4.72700472427358e-06, -9.620267484461248e-05, 0.0021931289911119515,
        -0.06637360953251338, -3.282625153806386)),
    (18.0, 22.3, (0.0, 0.0, 1.4761328243087498e-23, -3.569670699778188e-22, 7.625978903021013e-21,
        -1.8877711598564862e-19, 4.718582007609103e-18, -1.1756075208008541e-16, 2.947047222751387e-15,
        -7.449024609000991e-14, 1.90255153368251e-12, -4.926567693065338e-11, 1.2997001816498654e-09,
        -3.5197682618330054e-08, 9.909514358440618e-07, -2.9700112749923378e-05, 0.0009994342628120653,
        -0.04475332447137076, -3.677954556052042)))


def _two_sum(b, x, y):
    """``(x + y, its rounding error)`` (Knuth's TwoSum; no contract)."""
    s = b.fadd(x, y)
    back = b.fsub(s, x)
    return s, b.fadd(b.fsub(x, b.fsub(s, back)), b.fsub(y, back))


def erfc_f64(fe, x):
    """``1 - erf(x)`` below 0.5, ``e^(R(x - c) - x²)`` above (``x`` clamped at
    27.5, where erfc rounds to 0).  The exponent, ``R``'s constant ``- x² +``
    the rest of ``R``, is summed exactly (TwoSum, ``x²`` in two parts from an
    fma) into ``s + dz``, and ``e^(s + dz) = e^s (1 + dz)``."""
    o = _Ops64(fe, x)
    b = o.b
    c = o.call("llvm.minimum", x, o.f(27.5))
    head, rest = _intervals(o, c, _ERFC_F64, parts=True)
    square = b.fmul(c, c)                               # no contract: the fma below is its exact error
    tail = o.product_error(c, c, square)
    s, e1 = _two_sum(b, head, b.fneg(square))
    s, e2 = _two_sum(b, s, rest)
    e = exp(fe, s)
    large = o.fma(e, b.fsub(b.fadd(e1, e2), tail), e)
    small = o.sub(o.f(1.0), erf_f64(fe, x))
    return b.select(b.fcmp_unordered("<", x, o.f(0.5)), small, large)


# -------------------------------------------------------------- sin, cos, tan

# pi/2 in three parts of 33 bits (the last rounded): n times either of the
# first two is exact for |n| < 2^20, so x - n pi/2 loses nothing to cancellation
_PIO2 = (1.5707963267341256, 6.077100506303966e-11, 2.0222662487959506e-21)
_TRIG_LIMIT = 2.0 ** 19          # past it, libm (its reduction by many bits of 2/pi)
# sin r = r + r z S(z), cos r = 1 + z C(z), tan r = r + r z T(z), z = r², |r| <= pi/4;
# fitted to relative errors of 5e-12, 7e-11, 1.3e-9 (float32 results) and 6e-18,
# 4e-18, 3e-17 (float64)
_TRIG_POLY = {
    F32: {"S": (2.7181623936550795e-06, -0.0001983931657486431, 0.008333329317622895, -0.1666666664088714),
          "C": (2.4383695976845793e-05, -0.001388668251648748, 0.041666620359237, -0.49999999694136565),
          "T": (0.00437595115079932, 9.022668370732529e-05, 0.010835230527496962, 0.021282430754880264,
                0.05405986517349146, 0.13332663835613115, 0.33333349736158685)},
    F64: {"S": (-7.578541257606395e-13, 1.6058363186840588e-10, -2.5052104882056587e-08, 2.755731921406581e-06,
                -0.000198412698412548, 0.008333333333333323, -0.16666666666666666),
          "C": (-1.135328461351316e-11, 2.0875582190667113e-09, -2.755731311777162e-07, 2.4801587284096464e-05,
                -0.0013888888888862003, 0.04166666666666647, -0.5),
          "T": (2.085032700424552e-05, -4.482289483416383e-05, 8.93531168707497e-05, -2.6278382588656117e-05,
                0.0001364491519033771, 0.00022241689984179498, 0.0005950521441688308, 0.0014547609657035675,
                0.003592288586364297, 0.00886321921830106, 0.02186948960525005, 0.05396825392681744,
                0.13333333333414338, 0.3333333333333278)},
}


def _trig(kind, fe, x):
    """sin, cos or tan of ``x``: ``x = n pi/2 + r`` (:data:`_PIO2`, in float64
    for either dtype: float32 needs no more than its polynomials in float64),
    a polynomial in ``r`` chosen by the quadrant ``n mod 4``; lanes past
    :data:`_TRIG_LIMIT` (and inf, NaN) call libm, in a branch only vectors
    holding one take."""
    scalar = _element_type(x)
    poly = _TRIG_POLY[scalar]
    xd = x if scalar == F64 else fe.b.fpext(x, _Ops64(fe, x).t(F64))
    o = _Ops64(fe, xd)
    b = o.b
    n = o.call("llvm.rint", o.mul(xd, o.f(0.6366197723675814)))
    r = o.sub(o.sub(o.sub(xd, o.mul(n, o.f(_PIO2[0]))), o.mul(n, o.f(_PIO2[1]))), o.mul(n, o.f(_PIO2[2])))
    z = o.mul(r, r)
    q = o.sub(n, o.mul(o.f(4.0), o.call("llvm.floor", o.mul(n, o.f(0.25)))))     # n mod 4, exact
    odd = b.or_(o.eq(q, o.f(1.0)), o.eq(q, o.f(3.0)))
    if kind == "tan":
        t = o.add(o.mul(o.mul(r, z), o.horner(z, poly["T"])), r)
        y = b.select(odd, o.div(o.f(-1.0), t), t)
    else:
        s = o.add(o.mul(o.mul(r, z), o.horner(z, poly["S"])), r)
        c = o.add(o.mul(z, o.horner(z, poly["C"])), o.f(1.0))
        second_half = b.fcmp_ordered(">=", q, o.f(2.0))
        if kind == "sin":
            y, flip = b.select(odd, c, s), second_half
        else:
            y, flip = b.select(odd, s, c), b.xor(odd, second_half)
        y = b.select(flip, b.fneg(y), y)
    y = y if scalar == F64 else b.fptrunc(y, _Ops(fe, x).t(F32))
    if kind != "cos":           # x - n pi/2 is +0 at x = -0
        y = b.select(b.fcmp_ordered("==", x, ir.Constant(x.type, None)), x, y)
    ok = b.fcmp_ordered("<", fe.call_intrinsic("llvm.fabs", [x]), ir.Constant(x.type, _TRIG_LIMIT))
    o = _ops_of(fe, x)
    return _unless_all(o, ok, y, lambda: b.select(ok, y, fe.libm(OPS[kind].libm[scalar == F64], [x])))


def sin(fe, x):
    return _trig("sin", fe, x)


def cos(fe, x):
    return _trig("cos", fe, x)


def tan(fe, x):
    return _trig("tan", fe, x)


# ------------------------------------------------------------------------ pow

# log(1 + f) = 2 atanh(s) = 2s + s³ Q(s²), s = f / (2 + f), |s| <= 0.1716: Q fitted (0.5 ulp)
_ATANH_POLY = (0.11882360307572185, 0.11688080910447018, 0.13335640712711014, 0.15384575081481836,
               0.1818181859435781, 0.22222222219853488, 0.2857142857143538, 0.3999999999999999, 0.6666666666666666)


def _log_dd_f64(o, a):
    """``log(a)`` as a double-double ``(hi, lo)``, ``|lo| <= ulp(hi) / 2``, for
    ``a >= 0`` (relative error near 2^-60; C99's logs of 0, inf, NaN with
    ``lo = 0``): ``s`` and its
    rounding error from an fma, ``k ln2`` exact in its head, sums of heads
    exact (Fast2Sum)."""
    k, f, s, _, _ = _log_parts_f64(o, a)
    t_hi = o.add(o.f(2.0), f)
    t_lo = o.sub(f, o.sub(t_hi, o.f(2.0)))
    s_lo = o.div(o.sub(o.residual(f, s, t_hi), o.mul(s, t_lo)), t_hi)
    z = o.mul(s, s)
    tail = o.mul(o.mul(s, z), o.horner(z, _ATANH_POLY))
    head = o.mul(k, o.f(_LN2_HI))
    hi = o.b.fadd(head, o.add(s, s))                   # no contract: hi - head is its exact head
    lo = o.add(o.sub(o.add(s, s), o.sub(hi, head)),
               o.add(o.mul(k, o.f(_LN2_LO)), o.add(o.add(s_lo, s_lo), tail)))
    total = o.b.fadd(hi, lo)                            # the tail (up to 2^-8 hi) moved into the head
    lo = o.sub(lo, o.sub(total, hi))
    finite = o.b.and_(o.lt(o.f(0.0), a), o.lt(a, o.f(float("inf"))))
    return _log_specials(o, a, total), o.b.select(finite, lo, o.f(0.0))


def _pow_specials(o, x, y, r):
    """C99's pow from ``r = |x|^y`` computed as ``e^(y log|x|)``: the sign for
    a negative ``x`` and an odd integer ``y``, NaN for a negative finite
    ``x`` and a non-integer ``y``, 1 for ``y = ±0``, ``x = 1`` and ``x = -1``,
    ``y = ±inf`` (the rest, zeros and infinities, follow from ``r``)."""
    b = o.b
    floor = o.call("llvm.floor", y)
    is_int = o.eq(floor, y)                                            # ±inf: even integers
    half = o.mul(y, o.f(0.5))
    odd = b.and_(is_int, b.fcmp_ordered("!=", o.call("llvm.floor", half), half))
    negative = b.icmp_signed("<", b.bitcast(x, o.t(o.int_type)), o.i(0))
    r = b.select(b.and_(negative, odd), b.fneg(r), r)
    finite_negative = b.and_(o.lt(x, o.f(0.0)), b.fcmp_ordered("!=", x, o.f(float("-inf"))))
    r = b.select(b.and_(finite_negative, b.not_(is_int)), o.f(float("nan")), r)
    one = b.or_(b.or_(o.eq(y, o.f(0.0)), o.eq(x, o.f(1.0))),
                b.and_(o.eq(x, o.f(-1.0)), o.eq(o.call("llvm.fabs", y), o.f(float("inf")))))
    return b.select(one, o.f(1.0), r)


def pow_f64(fe, x, y):
    """``e^(y log|x|)`` with ``log|x|`` a double-double (:func:`_log_dd_f64`) and
    ``y log|x| = z + dz`` exact to its rounding (an fma): ``e^z (1 + dz)``."""
    o = _Ops64(fe, x)
    hi, lo = _log_dd_f64(o, o.call("llvm.fabs", x))
    z = o.mul(y, hi)
    dz = o.add(o.product_error(y, hi, z), o.mul(y, lo))
    r = exp(fe, z)
    finite = o.lt(o.call("llvm.fabs", z), o.f(746.0))                 # inf, NaN: no correction
    return _pow_specials(o, x, y, o.b.select(finite, o.fma(r, dz, r), r))


def pow_f32(fe, x, y):
    """``e^(y log|x|)`` in float64 (its rounding is far below float32's)."""
    o64 = _Ops64(fe, x)
    xd, yd = (fe.b.fpext(v, o64.t(F64)) for v in (x, y))
    r = exp(fe, o64.mul(yd, log_f64(fe, o64.call("llvm.fabs", xd))))
    o = _Ops(fe, x)
    return _pow_specials(o, x, y, fe.b.fptrunc(r, o.t(F32)))


# --------------------------------------------------- atan, asin, acos, atan2

# atan(u) = u + u z P(z), z = u², |u| <= tan(pi/8), and asin(t) = t + t z Q(z), |t| <= 1/2:
# P, Q fitted (0.03, 0.02 ulp)
_ATAN_POLY = (0.015194122520062218, -0.033472801452431596, 0.04503448233620992, -0.05218371371395289,
              0.0587701527294822, -0.06666225932486654, 0.0769228269077093, -0.09090908140923966,
              0.11111111088058731, -0.14285714285385737, 0.19999999999997647, -0.33333333333333326)
_ASIN_POLY = (0.03262806507849634, -0.020998241091760676, 0.021706930383372264, 0.0037065878306725055,
              0.01078021674805994, 0.011398915983837965, 0.0139808205254759, 0.017351611965775192,
              0.022372214994165474, 0.03038194270735508, 0.04464285717462697, 0.07499999999970774,
              0.1666666666666676)
# pi, pi/2, pi/4 and 3pi/4 as a double and its rounding error
_PI = (3.141592653589793, 1.2246467991473532e-16)
_PI_2 = (1.5707963267948966, 6.123233995736766e-17)
_PI_4 = (0.7853981633974483, 3.061616997868383e-17)


def _odd(o, t, poly):
    """``t + t z P(z)``, ``z = t²``."""
    z = o.mul(t, t)
    return o.add(o.mul(o.mul(t, z), o.horner(z, poly)), t)


def _minus(o, c, v):
    """``c - v`` for a constant ``c`` in two parts (:data:`_PI` ...)."""
    return o.add(o.sub(o.f(c[0]), v), o.f(c[1]))


def _atan_abs(o, a):
    """``atan(a)`` for ``a >= 0`` or NaN: ``a`` past tan(3pi/8) as ``pi/2 +
    atan(-1/a)``, past tan(pi/8) as ``pi/4 + atan((a - 1) / (a + 1))`` (fdlibm's
    reduction, one division)."""
    b = o.b
    big = b.fcmp_ordered(">", a, o.f(2.414213562373095))
    mid = b.fcmp_ordered(">", a, o.f(0.41421356237309503))
    num = b.select(big, o.f(-1.0), b.select(mid, o.sub(a, o.f(1.0)), a))
    den = b.select(big, a, b.select(mid, o.add(a, o.f(1.0)), o.f(1.0)))
    t = _odd(o, o.div(num, den), _ATAN_POLY)
    hi, lo = ((b.select(big, o.f(h), b.select(mid, o.f(q), o.f(0.0))))
              for h, q in zip(_PI_2, _PI_4))
    return o.add(hi, o.add(lo, t))


def atan_f64(fe, x):
    o = _Ops64(fe, x)
    return o.call("llvm.copysign", _atan_abs(o, o.call("llvm.fabs", x)), x)


def atan2_f64(fe, y, x):
    """``atan(|y| / |x|)`` placed in its quadrant (``pi -`` it where ``x < 0``,
    negated where ``y < 0``); C99's values where both are zeros or both
    infinities (the quotient's NaN).  A zero counts as +0 whatever its sign
    bit: the arithmetic before may drop the sign of a zero (``nsz``, and
    zero elimination), so testing it would make the angle depend on how the
    program was rewritten (``pi`` or ``-pi`` for ``0 - 0``)."""
    o = _Ops64(fe, x)
    b = o.b
    ax, ay = o.call("llvm.fabs", x), o.call("llvm.fabs", y)
    t = _atan_abs(o, o.div(ay, ax))
    left = b.fcmp_ordered("<", x, o.f(0.0))
    r = b.select(left, _minus(o, _PI, t), t)
    zeros = b.and_(o.eq(ax, o.f(0.0)), o.eq(ay, o.f(0.0)))
    infinities = b.and_(o.eq(ax, o.f(float("inf"))), o.eq(ay, o.f(float("inf"))))
    r = b.select(zeros, b.select(left, o.f(_PI[0]), o.f(0.0)), r)
    r = b.select(infinities, b.select(left, o.f(3 * _PI_4[0]), o.f(_PI_4[0])), r)
    return b.select(b.fcmp_ordered("<", y, o.f(0.0)), b.fneg(r), r)


def asin_f64(fe, x):
    """fdlibm's: the polynomial up to ``|x| = 1/2``, past it ``pi/2 - 2
    asin(sqrt((1 - |x|) / 2))``."""
    o = _Ops64(fe, x)
    b = o.b
    a = o.call("llvm.fabs", x)
    big = b.fcmp_ordered(">", a, o.f(0.5))
    p = _odd(o, b.select(big, o.call("llvm.sqrt", o.mul(o.sub(o.f(1.0), a), o.f(0.5))), a), _ASIN_POLY)
    return o.call("llvm.copysign", b.select(big, _minus(o, _PI_2, o.add(p, p)), p), x)


def acos_f64(fe, x):
    """fdlibm's: ``pi/2 - asin(x)`` up to ``|x| = 1/2``, past it ``2 asin(s)``
    or ``pi - 2 asin(s)``, ``s = sqrt((1 - |x|) / 2)``."""
    o = _Ops64(fe, x)
    b = o.b
    a = o.call("llvm.fabs", x)
    big = b.fcmp_ordered(">", a, o.f(0.5))
    p = _odd(o, b.select(big, o.call("llvm.sqrt", o.mul(o.sub(o.f(1.0), a), o.f(0.5))), x), _ASIN_POLY)
    twice = o.add(p, p)
    far = b.select(o.lt(o.f(0.0), x), twice, _minus(o, _PI, twice))
    return b.select(big, far, _minus(o, _PI_2, p))


# ---------------------------------------------------------------- sinh, cosh

# sinh(x) = x + x z P(z), z = x², on |x| < 1: P fitted (0.09 ulp)
_SINH_POLY = (7.758748061919448e-13, 1.6057259797172566e-10, 2.505212313629696e-08, 2.755731915707498e-06,
              0.00019841269841431862, 0.008333333333333148, 0.16666666666666669)


def _hyperbolic(fe, x, combine):
    """``combine(e^|x| / 2, e^-|x| / 2)`` where ``e^|x|`` is finite; past 709,
    ``(e^(|x|/2) / 2) e^(|x|/2)`` (no overflow before the result's), in a
    branch only vectors holding such a lane take."""
    o = _Ops64(fe, x)
    a = o.call("llvm.fabs", x)
    half = o.mul(exp(fe, a), o.f(0.5))
    value = combine(o, half, o.div(o.f(0.25), half))
    ok = o.b.fcmp_unordered("<", a, o.f(709.0))

    def large():
        h = exp(fe, o.mul(a, o.f(0.5)))
        return o.b.select(ok, value, o.mul(o.mul(h, o.f(0.5)), h))
    return o, a, _unless_all(o, ok, value, large) if o.n is not None else large()


def cosh_f64(fe, x):
    return _hyperbolic(fe, x, lambda o, u, v: o.add(u, v))[2]


def sinh_f64(fe, x):
    """The polynomial below ``|x| = 1``, ``(e^|x| - e^-|x|) / 2`` above; ``x``'s sign."""
    o, a, large = _hyperbolic(fe, x, lambda o, u, v: o.sub(u, v))
    small = o.b.fcmp_unordered("<", a, o.f(1.0))
    return o.call("llvm.copysign", o.b.select(small, _odd(o, a, _SINH_POLY), large), x)


def _in_float64(body):
    """A float32 body: ``body`` (a float64 one) on its arguments widened,
    rounded once at the end."""
    def narrow(fe, *args):
        wide = [fe.b.fpext(a, _Ops64(fe, a).t(F64)) for a in args]
        return fe.b.fptrunc(body(fe, *wide), _Ops(fe, args[0]).t(F32))
    return narrow


# The bodies by (operator of te_autodiff/ops.py, dtype): codegen_llvm uses
# them in place of the operator's LLVM intrinsic or libm function.
BODIES = {
    ("exp", "float32"): exp, ("exp", "float64"): exp, ("expm1", "float32"): expm1_f32, ("expm1", "float64"): expm1_f64,
    ("log", "float32"): log_f32, ("log1p", "float32"): log1p_f32,
    ("tanh", "float32"): tanh_f32, ("sigmoid", "float32"): sigmoid_f32,
    ("log", "float64"): log_f64, ("log1p", "float64"): log1p_f64,
    ("sigmoid", "float64"): sigmoid_f64, ("tanh", "float64"): tanh_f64, ("erf", "float32"): erf_f32, ("erf", "float64"): erf_f64, ("erfc", "float32"): erfc_f32, ("erfc", "float64"): erfc_f64, ("exp2", "float32"): exp2_f32,
    ("log2", "float32"): log2_f32, ("log10", "float32"): log10_f32, ("exp2", "float64"): exp2_f64,
    ("log2", "float64"): log2_f64, ("log10", "float64"): log10_f64, ("pow", "float32"): pow_f32,
    ("pow", "float64"): pow_f64,
    **{(op, dtype): body if dtype == "float64" else _in_float64(body)
       for op, body in (("atan", atan_f64), ("atan2", atan2_f64), ("asin", asin_f64), ("acos", acos_f64),
                        ("sinh", sinh_f64), ("cosh", cosh_f64)) for dtype in ("float32", "float64")},
    **{(op, dtype): body for op, body in (("sin", sin), ("cos", cos), ("tan", tan))
       for dtype in ("float32", "float64")},
    **{(op, dtype): body for op, body in (("rsqrt", rsqrt), ("sign", sign)) for dtype in ("float32", "float64")},
}
