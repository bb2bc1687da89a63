"""The operator table: every arithmetic operator and intrinsic, declared once.

An :class:`Op` holds what each pass needs to know of one operator: its
arity, its dtype rule, its constant folding, its derivative, its work (what
inlining and the runtime's work estimate weigh), whether it is
transcendental, how LLVM computes it when no inline body does (an
intrinsic, or a libm function per dtype), its infix spelling for
``te.pretty``, and the arguments the fuzzer draws for it.  The derivative
rules, folding, lowering, codegen, the runtime's estimate, the printer, the
fuzzer and the public functions (``te.erf`` ...) all read :data:`OPS`.

Inline vector bodies are LLVM IR and live in ``lowering/fast_math.py``,
registered there under the operator's name and dtype; an operator without
one is computed by its ``llvm`` intrinsic or its ``libm`` function.

Adding an operator is one :func:`_op` (or :func:`_unary`) call below (and a
vector body in ``lowering/fast_math.py`` where the libm call would be slow).  A derivative
rule ``derivative(e, g)`` returns one adjoint per operand (``None``: none)
for the adjoint ``g`` of the node ``e``; rules that refer to ``e`` itself
reuse the primal value (hash-consing shares it).  A composite operator
(``expand``) has no node of its own: it is built from others (``clip``).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable

from . import dtype as dt
from . import expr as E

TRANSCENDENTAL = math.inf       # the work of a function computed by a polynomial body or libm
ANY = (-math.inf, math.inf)


@dataclass(frozen=True)
class Op:
    """One operator.

    * ``fold``: the value on Python numbers (``None`` or an exception: not folded);
    * ``derivative(e, g)``: the adjoint of each operand (see the module doc);
    * ``work``: operations of one element: 1, 2 (a division, a square
      root), :data:`TRANSCENDENTAL`;
    * ``keeps_dtype``: the result has the operand's dtype (``abs`` of an
      int is an int); otherwise an int operand is computed in float;
    * ``llvm``: an overloaded LLVM intrinsic returning its operand's type
      (``llvm.floor``); ``libm``: the (float32, float64) C functions, one
      call per lane; either is used only where ``lowering`` has no body;
    * ``public``: the name of the ``te`` function (None: not a function, an
      operator such as ``+``); ``infix``: ``(symbol, precedence)`` for printing;
    * ``domain``: the operand interval the fuzzer draws from (the function
      smooth and moderate there);
    * ``expand``: a composite's definition in other operators.
    """
    name: str
    arity: int
    fold: Callable | None
    derivative: Callable | None
    doc: str
    work: float = 1
    keeps_dtype: bool = False
    llvm: str | None = None
    libm: tuple | None = None
    public: str | None = None
    infix: tuple | None = None
    domain: tuple = ANY
    expand: Callable | None = None

    @property
    def transcendental(self) -> bool:
        return self.work == TRANSCENDENTAL


OPS: dict = {}


def _op(name, arity, fold, derivative, doc, **kw):
    kw.setdefault("public", name if "infix" not in kw else None)
    OPS[name] = Op(name, arity, fold, derivative, doc, **kw)


def _libm(name):
    return (name + "f", name)


def _pick(cond, g):
    """``g`` where ``cond`` holds, else 0."""
    return E.select(cond, g, E.const(0, g.dtype))


def _safe(f):
    """``f`` made to return None where Python raises (a pole, an overflow)."""
    def fold(*args):
        try:
            return f(*args)
        except (ValueError, OverflowError, ZeroDivisionError):
            return None
    return fold


def _sign(v):
    if isinstance(v, int):
        return (v > 0) - (v < 0)
    return 0.0 if v == 0 else v if v != v else math.copysign(1.0, v)


def _pow(x, y):
    return None if x == 0 and y < 0 else x ** y


def _round_half_even(v):
    return float(round(v))


# --------------------------------------------------------------- arithmetic

_op("add", 2, operator.add, lambda e, g: (g, g), "a + b", infix=("+", 1))
_op("sub", 2, operator.sub, lambda e, g: (g, -g), "a - b", infix=("-", 1))
_op("mul", 2, operator.mul, lambda e, g: (g * e.b, g * e.a), "a * b", infix=("*", 2))
_op("div", 2, operator.truediv, lambda e, g: (g / e.b, -g * e / e.b), "a / b (true division)",
    work=2, infix=("/", 2))
_op("floordiv", 2, operator.floordiv, lambda e, g: (None, None), "a // b (floor, as numpy)",
    work=2, infix=("//", 2))
# a mod b = a - floor(a / b) * b, so d/db = -floor(a / b)
_op("mod", 2, operator.mod, lambda e, g: (g, -g * E.floordiv(e.a, e.b)), "a % b (floor, as numpy)",
    work=2, infix=("%", 2))
# the derivative goes to the first operand on ties
_op("max", 2, max, lambda e, g: (_pick(E.compare("ge", e.a, e.b), g), _pick(E.compare("lt", e.a, e.b), g)),
    "The larger of a and b (NaN if either is).", llvm="llvm.maximum", public="maximum")
_op("min", 2, min, lambda e, g: (_pick(E.compare("le", e.a, e.b), g), _pick(E.compare("gt", e.a, e.b), g)),
    "The smaller of a and b (NaN if either is).", llvm="llvm.minimum", public="minimum")


def _minus_one(b):
    """``b - 1``, still an integer converted to float when ``b`` is one (the
    power then lowers to multiplications)."""
    if isinstance(b, E.Cast) and dt.is_int(b.a.dtype):
        return E.cast(b.dtype, b.a - 1)
    return b - 1


def _pow_derivative(e, g):
    # da: b a^(b-1), and 0 where b == 0 (a^0 is constant; at a == 0 the
    # formula gives 0 * inf): a constant b folds the condition away.
    # db: a^b log(a), and 0 where a == 0 and b >= 0 (0^b is constant there;
    # the formula gives 0 * -inf)
    da = _pick(E.compare("ne", e.b, 0), g * e.b * E.power(e.a, _minus_one(e.b)))
    db = _pick(E.logic_or(E.compare("ne", e.a, 0), E.compare("lt", e.b, 0)), g * e * E.unary("log", e.a))
    return da, db


_op("pow", 2, _pow, _pow_derivative, "a ** b (float; C99's pow for the special cases).",
    work=TRANSCENDENTAL, llvm="llvm.pow", public="power")


def _atan2_derivative(e, g):
    # d/dy = x / (x² + y²), d/dx = -y / (x² + y²); 0 at the origin, as PyTorch's
    r = e.a * e.a + e.b * e.b
    away = E.compare("ne", r, 0)
    return _pick(away, g * e.b / r), _pick(away, -g * e.a / r)


def _atan2(y, x):
    # a zero counts as +0 (see fast_math.atan2_f64): -0.0 + 0.0 is +0.0
    return math.atan2(y + 0.0, x + 0.0)


_op("atan2", 2, _atan2, _atan2_derivative,
    "The angle of the point (x, y), in [-pi, pi]: atan2(y, x); a zero operand counts as +0 "
    "(te's arithmetic does not keep the sign of a zero), so atan2(0, x < 0) is pi.",
    work=TRANSCENDENTAL, libm=_libm("atan2"))

_op("neg", 1, operator.neg, lambda e, g: (-g,), "-a", keeps_dtype=True, public=None)
_op("abs", 1, abs, lambda e, g: (E.select(E.compare("gt", e.a, 0), g,
                                           E.select(E.compare("lt", e.a, 0), -g, E.const(0, g.dtype))),),
    "Absolute value (keeps the dtype).", keeps_dtype=True, llvm="llvm.fabs")


# ------------------------------------------------------------ intrinsics

def _unary(name, fold, derivative, doc, **kw):
    """An operator of one operand; ``derivative(e, g)`` returns its one adjoint
    (None: derivative 0)."""
    _op(name, 1, _safe(fold), (lambda e, g: (derivative(e, g),)) if derivative else lambda e, g: (None,), doc,
        **kw)


def _sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v))


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)

_unary("exp", math.exp, lambda e, g: g * e, "e ** x.", work=TRANSCENDENTAL, llvm="llvm.exp", domain=(-4, 4))
_unary("expm1", math.expm1, lambda e, g: g * (e + 1), "e ** x - 1, accurate for small x.",
       work=TRANSCENDENTAL, libm=_libm("expm1"), domain=(-4, 4))
_unary("exp2", lambda v: 2.0 ** v, lambda e, g: g * e * math.log(2), "2 ** x.", work=TRANSCENDENTAL,
       llvm="llvm.exp2", domain=(-6, 6))
_unary("log", math.log, lambda e, g: g / e.a, "Natural logarithm.", work=TRANSCENDENTAL, llvm="llvm.log",
       domain=(0.25, math.inf))
_unary("log1p", math.log1p, lambda e, g: g / (e.a + 1), "log(1 + x), accurate for small x.",
       work=TRANSCENDENTAL, libm=_libm("log1p"), domain=(0.25, math.inf))
_unary("log2", math.log2, lambda e, g: g / (e.a * math.log(2)), "Base-2 logarithm.", work=TRANSCENDENTAL,
       llvm="llvm.log2", domain=(0.25, math.inf))
_unary("log10", math.log10, lambda e, g: g / (e.a * math.log(10)), "Base-10 logarithm.", work=TRANSCENDENTAL,
       llvm="llvm.log10", domain=(0.25, math.inf))
_unary("sqrt", math.sqrt, lambda e, g: g / (e * 2), "Square root.", work=2, llvm="llvm.sqrt",
       domain=(0.25, math.inf))
_unary("rsqrt", lambda v: 1.0 / math.sqrt(v), lambda e, g: g * (e * e * e * -0.5), "1 / sqrt(x).", work=2,
       domain=(0.25, math.inf))
_unary("tanh", math.tanh, lambda e, g: g * (1 - e * e), "Hyperbolic tangent.", work=TRANSCENDENTAL,
       libm=_libm("tanh"))
_unary("sigmoid", _sigmoid, lambda e, g: g * (e * (1 - e)), "1 / (1 + exp(-x)).", work=TRANSCENDENTAL)
_unary("sinh", math.sinh, lambda e, g: g * E.unary("cosh", e.a), "Hyperbolic sine.", work=TRANSCENDENTAL,
       libm=_libm("sinh"), domain=(-4, 4))
_unary("cosh", math.cosh, lambda e, g: g * E.unary("sinh", e.a), "Hyperbolic cosine.", work=TRANSCENDENTAL,
       libm=_libm("cosh"), domain=(-4, 4))
_unary("erf", math.erf, lambda e, g: g * (_TWO_OVER_SQRT_PI * E.unary("exp", -(e.a * e.a))),
       "The error function, 2/sqrt(pi) times the integral of exp(-t²) from 0 to x.", work=TRANSCENDENTAL,
       libm=_libm("erf"))
_unary("erfc", math.erfc, lambda e, g: g * (-_TWO_OVER_SQRT_PI * E.unary("exp", -(e.a * e.a))),
       "1 - erf(x), accurate where erf(x) is near 1.", work=TRANSCENDENTAL, libm=_libm("erfc"))
_unary("sin", math.sin, lambda e, g: g * E.unary("cos", e.a), "Sine.", work=TRANSCENDENTAL, libm=_libm("sin"))
_unary("cos", math.cos, lambda e, g: -g * E.unary("sin", e.a), "Cosine.", work=TRANSCENDENTAL,
       libm=_libm("cos"))
_unary("tan", math.tan, lambda e, g: g * (1 + e * e), "Tangent.", work=TRANSCENDENTAL, libm=_libm("tan"),
       domain=(-1.2, 1.2))
_unary("atan", math.atan, lambda e, g: g / (1 + e.a * e.a), "Arctangent, in [-pi/2, pi/2].",
       work=TRANSCENDENTAL, libm=_libm("atan"))
_unary("asin", math.asin, lambda e, g: g / E.unary("sqrt", 1 - e.a * e.a), "Arcsine, in [-pi/2, pi/2].",
       work=TRANSCENDENTAL, libm=_libm("asin"), domain=(-0.9, 0.9))
_unary("acos", math.acos, lambda e, g: -g / E.unary("sqrt", 1 - e.a * e.a), "Arccosine, in [0, pi].",
       work=TRANSCENDENTAL, libm=_libm("acos"), domain=(-0.9, 0.9))
# the rounding functions and sign: derivative 0 (no rule)
_unary("floor", lambda v: float(math.floor(v)), None, "The largest integer not above x.", llvm="llvm.floor")
_unary("ceil", lambda v: float(math.ceil(v)), None, "The smallest integer not below x.", llvm="llvm.ceil")
_unary("trunc", lambda v: float(math.trunc(v)), None, "x rounded toward zero.", llvm="llvm.trunc")
_unary("round", _round_half_even, None, "x rounded to the nearest integer, halves to even (as numpy).",
       llvm="llvm.roundeven")
_unary("sign", _sign, None, "-1, 0 or 1 by the sign of x (+0 for both zeros, NaN for NaN, as numpy; keeps "
       "the dtype).", keeps_dtype=True)


def _clip(x, lo, hi):
    # numpy's min(max(x, lo), hi) with the operands ordered so that the
    # tie rules of max and min (the first operand) send the derivative to
    # x only where lo < x < hi, to lo where x <= lo, to hi where x >= hi
    return E.minimum(hi, E.maximum(lo, x))


_op("clip", 3, None, None, "x limited to [lo, hi] (hi where lo > hi, as numpy); the derivative passes to x "
    "where lo < x < hi, else to the bound taken.", expand=_clip)


# -------------------------------------------------------------- queries


def unary_names() -> list:
    """The operators of one operand that are nodes (not composites)."""
    return [op.name for op in OPS.values() if op.arity == 1]


def is_transcendental(name) -> bool:
    """Whether the operator ``name`` is computed by a polynomial body or libm
    (False for names that are no operator: comparisons, reductions)."""
    op = OPS.get(name)
    return op is not None and op.transcendental


def apply(name: str, *args):
    """``te.<name>(*args)``: the operator applied to expressions or numbers."""
    op = OPS[name]
    if op.expand is not None:
        return op.expand(*args)
    return E.unary(name, *args) if op.arity == 1 else E.binop(name, *args)


def public_function(op: Op):
    """The ``te`` function of ``op``."""
    def function(*args):
        if len(args) != op.arity:
            raise TypeError(f"te.{op.public} takes {op.arity} argument{'s' * (op.arity > 1)}, got {len(args)}")
        return apply(op.name, *args)
    function.__name__ = function.__qualname__ = op.public
    function.__doc__ = op.doc
    return function
