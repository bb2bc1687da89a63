"""Scalar expression nodes: immutable and hash-consed.

Every node is built through its class call, which returns the existing node
when one with equal fields is alive (a weak intern table).  Structural
equality is therefore identity, ``hash`` is ``id``, and passes memoise on
nodes directly.  Python's ``==`` keeps that identity meaning; element
equality is spelled ``te.equal(a, b)``.

The smart constructors at the bottom (``add``, ``mul``, ``select``...) fold
constants and the obvious identities (``x*1``, ``x+0``, ``x*0``) so that
derivatives stay small, and contradictory conditions to false
(``conditions.py``: ``c and not c``, a select nested under a condition
that rules out its own).
"""
from __future__ import annotations

import itertools
import math
import weakref

import numpy as np

from . import dtype as dt

_INTERN: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()
_UIDS = itertools.count()


class Node:
    """Base of hash-consed immutable nodes; subclasses list their ``fields``."""

    __slots__ = ("__weakref__",)
    fields: tuple = ()

    def __new__(cls, *args):
        key = (cls,) + tuple(_key(a) for a in args)
        node = _INTERN.get(key)
        if node is None:
            node = object.__new__(cls)
            for name, value in zip(cls.fields, args):
                object.__setattr__(node, name, value)
            node._init()
            _INTERN[key] = node
        return node

    def _init(self):
        """Compute derived slots (dtype) once, at interning time."""

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} nodes are immutable")

    def __reduce__(self):
        return (type(self), tuple(getattr(self, f) for f in self.fields))

    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other


def _key(value):
    """Intern key of one field: nodes by identity, floats by bits (so -0.0 != 0.0)."""
    if isinstance(value, Node):
        return ("n", id(value))
    if isinstance(value, float):
        return ("f", float(value).hex())
    if isinstance(value, tuple):
        return tuple(_key(v) for v in value)
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int):
        return ("i", value)
    return ("o", id(value)) if not isinstance(value, str) else value


class Expr(Node):
    """A scalar expression; carries ``dtype``.  Operators build new nodes."""

    __slots__ = ("dtype",)

    def __add__(self, other):
        return add(self, other)

    def __radd__(self, other):
        return add(other, self)

    def __sub__(self, other):
        return sub(self, other)

    def __rsub__(self, other):
        return sub(other, self)

    def __mul__(self, other):
        return mul(self, other)

    def __rmul__(self, other):
        return mul(other, self)

    def __truediv__(self, other):
        return div(self, other)

    def __rtruediv__(self, other):
        return div(other, self)

    def __floordiv__(self, other):
        return floordiv(self, other)

    def __rfloordiv__(self, other):
        return floordiv(other, self)

    def __mod__(self, other):
        return mod(self, other)

    def __rmod__(self, other):
        return mod(other, self)

    def __pow__(self, other):
        return power(self, other)

    def __rpow__(self, other):
        return power(other, self)

    def __neg__(self):
        return neg(self)

    def __lt__(self, other):
        return compare("lt", self, other)

    def __le__(self, other):
        return compare("le", self, other)

    def __gt__(self, other):
        return compare("gt", self, other)

    def __ge__(self, other):
        return compare("ge", self, other)

    def __bool__(self):
        raise TypeError(
            "a tensor expression has no Python truth value; use te.if_then_else, "
            "te.all or te.any for conditions, and te.equal(a, b) for element equality")

    def astype(self, dtype) -> "Expr":
        return cast(dt.canonical(dtype), self)

    def __repr__(self):
        from .pretty import expr_str
        return f"<{type(self).__name__} {expr_str(self)}>"


class Const(Expr):
    """A literal ``value`` of ``dtype``."""

    __slots__ = ("value", "dtype_")
    fields = ("value", "dtype_")

    def _init(self):
        object.__setattr__(self, "dtype", self.dtype_)


class Var(Expr):
    """An index variable (int64).  ``dom`` is ``(lo, extent)`` when the variable
    is a compute or reduce axis with a fixed range, else ``None``.  Each call of
    :func:`var` makes a distinct variable (``uid``)."""

    __slots__ = ("name", "uid", "dom")
    fields = ("name", "uid", "dom")

    def _init(self):
        object.__setattr__(self, "dtype", dt.INDEX)


class BinOp(Expr):
    """``a op b`` for the operators of two operands of ``ops.py`` (add sub mul div ... atan2)."""

    __slots__ = ("op", "a", "b")
    fields = ("op", "a", "b")

    def _init(self):
        object.__setattr__(self, "dtype", dt.promote(self.a.dtype, self.b.dtype))


class Cmp(Expr):
    """Comparison ``a op b`` (op in lt le gt ge eq ne), of dtype bool."""

    __slots__ = ("op", "a", "b")
    fields = ("op", "a", "b")

    def _init(self):
        object.__setattr__(self, "dtype", "bool")


class Logic(Expr):
    """Boolean ``and``/``or`` of two conditions, or ``not`` of one (``b`` None)."""

    __slots__ = ("op", "a", "b")
    fields = ("op", "a", "b")

    def _init(self):
        object.__setattr__(self, "dtype", "bool")


class Unary(Expr):
    """``op(a)`` for negation and the intrinsics of one operand of ``ops.py`` (exp, log, tanh, ...)."""

    __slots__ = ("op", "a")
    fields = ("op", "a")

    def _init(self):
        keep = _ops.OPS[self.op].keeps_dtype
        object.__setattr__(self, "dtype", self.a.dtype if keep else dt.float_of(self.a.dtype))


class Select(Expr):
    """``cond ? a : b``; only the chosen branch is evaluated."""

    __slots__ = ("cond", "a", "b")
    fields = ("cond", "a", "b")

    def _init(self):
        object.__setattr__(self, "dtype", self.a.dtype)


class Cast(Expr):
    """``a`` converted to ``to``."""

    __slots__ = ("to", "a")
    fields = ("to", "a")

    def _init(self):
        object.__setattr__(self, "dtype", self.to)


class Load(Expr):
    """``tensor[indices]``."""

    __slots__ = ("tensor", "indices")
    fields = ("tensor", "indices")

    def _init(self):
        object.__setattr__(self, "dtype", self.tensor.dtype)


class Reduce(Expr):
    """``op`` over ``axes`` of ``body``; axis ``t`` runs over
    ``doms[t] = (lo, extent)`` (expressions of outer variables).  op is one of
    sum prod max min, or argmax (the row-major position, from 0, of the first
    maximum; used by the derivative of max)."""

    __slots__ = ("op", "body", "axes", "doms")
    fields = ("op", "body", "axes", "doms")

    def _init(self):
        object.__setattr__(self, "dtype", dt.INDEX if self.op == "argmax" else self.body.dtype)


class InverseIndex(Expr):
    """Element ``at`` of the run-time inverse of the integer index ``key``.

    ``key`` is a function of the positions ``axes`` (ranges ``doms``, pairs of
    ints ``(lo, extent)``); its values of interest are ``lo .. lo + count - 1``.
    Elements ``0 .. count`` are where each value's matches start (``at = v - lo``
    and ``v - lo + 1`` bound the matches of ``v``; element ``count`` is the
    number of keys in range); elements ``count + 1 + r`` list the matching
    positions (row-major over ``axes``, from 0) grouped by value, in
    increasing order within a value, then those of keys out of range.  Built
    by ``inverse_index.py``, computed by a counting sort
    (``lowering/key_stages.py``)."""

    __slots__ = ("key", "axes", "doms", "lo", "count", "at")
    fields = ("key", "axes", "doms", "lo", "count", "at")

    def _init(self):
        object.__setattr__(self, "dtype", dt.INDEX)


class MatchSum(Expr):
    """Element ``at`` of a sum over the positions whose key takes each value:
    ``value`` summed over the positions ``axes`` (ranges ``doms``, pairs of
    ints) where ``key == lo + at``, in increasing (row-major) position order,
    for ``at`` in ``0 .. count - 1``.  The adjoint of a read whose index comes
    from data when each batch row of keys owns a whole row of the result
    (torch.gather's); built by ``inverse_index.py``, computed by a scatter
    (``lowering/key_stages.py``)."""

    __slots__ = ("value", "key", "axes", "doms", "lo", "count", "at")
    fields = ("value", "key", "axes", "doms", "lo", "count", "at")

    def _init(self):
        object.__setattr__(self, "dtype", self.value.dtype)

    def as_reduce(self) -> "Expr":
        """The same sum, written as a reduction with a condition (what the
        derivative rules read)."""
        hit = compare("eq", self.key, self.at + self.lo)
        doms = tuple((const(lo, dt.INDEX), const(n, dt.INDEX)) for lo, n in self.doms)
        return reduce("sum", select(hit, self.value, const(0, self.dtype)), self.axes, doms)


class ScanState(Expr):
    """The body of a tensor a scan computes: output ``which`` of ``scan`` (a
    :class:`~te_autodiff.scan.ScanOp`: a state, or past them a tensor of its
    step kept for a gradient) at the tensor's own position.  A leaf: what a
    scan reads is listed by the op, not by sub-expressions."""

    __slots__ = ("scan", "which")
    fields = ("scan", "which")

    def _init(self):
        object.__setattr__(self, "dtype", self.scan.outputs[self.which].dtype)


REDUCE_OPS = ("sum", "prod", "max", "min")


# ---------------------------------------------------------------- constructors


def var(name: str, dom=None) -> Var:
    """A fresh index variable named ``name`` with optional ``(lo, extent)``."""
    return Var(name, next(_UIDS), dom)


def const(value, dtype=None) -> Const:
    """``te.const``: a literal, of ``dtype`` or the literal's own dtype."""
    dtype = dt.literal_dtype(value) if dtype is None else dt.canonical(dtype)
    if dtype == "bool":
        value = bool(value)
    elif dt.is_int(dtype):
        if isinstance(value, (float, np.floating)) and not float(value).is_integer():
            raise TypeError(f"constant {value!r} is not an integer but dtype is {dtype}")
        value = int(value)
    else:
        value = float(value)
    return Const(value, dtype)


def literal(value, dtype=None) -> Const:
    """``te.const`` and the Python numbers in expressions: :func:`const`,
    checking that it is a number or a bool and that an int fits its dtype
    (passes may make wider constants)."""
    own = dt.literal_dtype(value)                   # a TypeError for anything else
    c = const(value, own if dtype is None else dtype)
    half = 2 ** (31 if c.dtype == "int32" else 63)
    if dt.is_int(c.dtype) and not -half <= c.value < half:
        raise ValueError(f"constant {c.value} does not fit {c.dtype}")
    return c


def as_expr(value, like: str | None = None) -> Expr:
    """Wrap a Python literal as a :class:`Const` (weakly typed next to ``like``)."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, Node) or not isinstance(value, (bool, int, float, np.number, np.bool_)):
        raise TypeError(f"cannot use {value!r} of type {type(value).__name__} in a tensor expression"
                        + ("; index a tensor with t[i, j] to read an element"
                           if hasattr(value, "shape") else ""))
    dtype = dt.literal_dtype(value) if like is None else dt.weak_literal_dtype(value, like)
    return literal(value, dtype)


def _pair(a, b):
    """Two operands as expressions; literals take the other side's dtype."""
    if isinstance(a, Expr) and not isinstance(b, Expr):
        return a, as_expr(b, a.dtype)
    if isinstance(b, Expr) and not isinstance(a, Expr):
        return as_expr(a, b.dtype), b
    return as_expr(a), as_expr(b)


def _unify(a: Expr, b: Expr):
    """Cast both operands to their promoted dtype."""
    target = dt.promote(a.dtype, b.dtype)
    return cast(target, a), cast(target, b)


def is_const(e, value=None) -> bool:
    return isinstance(e, Const) and (value is None or e.value == value)


def open_affine(stack: list, terms: dict, limit=None, casts: bool = False):
    """Add the ``(expression, coefficient)`` pairs of ``stack`` into
    ``terms`` (``{atom: coefficient}``), emptying it, and return their
    constant part: sums, differences, negations and products by constants
    are opened, with ``casts`` widening integer casts too; anything else is
    an atom.  None (``stack`` not empty) when ``limit`` pairs do not finish."""
    k, steps = 0, 0
    while stack:
        if limit is not None and steps == limit:
            return None
        steps += 1
        x, c = stack.pop()
        if c == 0:
            continue
        if isinstance(x, Const):
            k += c * x.value
        elif isinstance(x, BinOp) and x.op in ("add", "sub"):
            stack += [(x.a, c), (x.b, -c if x.op == "sub" else c)]
        elif isinstance(x, BinOp) and x.op == "mul" and isinstance(x.a, Const):
            stack.append((x.b, c * x.a.value))
        elif isinstance(x, BinOp) and x.op == "mul" and isinstance(x.b, Const):
            stack.append((x.a, c * x.b.value))
        elif isinstance(x, Unary) and x.op == "neg":
            stack.append((x.a, -c))
        elif casts and isinstance(x, Cast) and x.a.dtype.startswith("int") and x.to == "int64":
            stack.append((x.a, c))
        else:
            terms[x] = terms.get(x, 0) + c
    return k


def _fold(op, x, y):
    try:
        return _ops.OPS[op].fold(x, y)
    except (ValueError, OverflowError, ZeroDivisionError):
        return None


def binop(op: str, a, b) -> Expr:
    """Build ``a op b`` with promotion, constant folding and unit identities."""
    a, b = _pair(a, b)
    if op == "div" and not (dt.is_float(a.dtype) or dt.is_float(b.dtype)):
        raise TypeError(f"'/' is true division and needs a float operand (got {a.dtype} and {b.dtype}); "
                        "use '//' for integer division or .astype('float32')")
    if op in ("pow", "atan2") and not (dt.is_float(a.dtype) or dt.is_float(b.dtype)):
        a = cast(dt.DEFAULT_FLOAT, a)
    a, b = _unify(a, b)
    if isinstance(a, Const) and isinstance(b, Const):
        value = _fold(op, a.value, b.value)
        if value is not None:
            return const(value, a.dtype)
    if op == "add":
        if is_const(a, 0):
            return b
        if is_const(b, 0):
            return a
    elif op == "sub":
        if is_const(b, 0):
            return a
        if a is b and not dt.is_float(a.dtype):
            return const(0, a.dtype)
        c = _floor_multiple(b, a)
        if c is not None:                       # x - c * (x // c) == x % c
            return binop("mod", a, c)
    elif op == "mul":
        if is_const(a, 1):
            return b
        if is_const(b, 1):
            return a
        if is_const(a, 0) or is_const(b, 0):
            return const(0, a.dtype)
    elif op in ("div", "floordiv"):
        if is_const(b, 1) and (op == "div" or not dt.is_float(a.dtype)):
            return a
        if is_const(a, 0) and not is_const(b, 0):
            return const(0, a.dtype)
    elif op == "pow":
        if is_const(b, 1):
            return a
        if is_const(b, 0):
            return const(1, a.dtype)
    elif op in ("max", "min") and a is b:
        return a
    return BinOp(op, a, b)


def factors(e) -> list:
    """``e`` as a float product: ``(op, factor)`` pairs, ``op`` "mul" or
    "div", left to right (the factors of a divisor stay one factor)."""
    out, stack = [], [("mul", e)]
    while stack:
        op, f = stack.pop()
        if op == "mul" and isinstance(f, BinOp) and f.op in ("mul", "div") and dt.is_float(f.dtype):
            stack += [(f.op, f.b), ("mul", f.a)]
        else:
            out.append((op, f))
    return out


def product(pairs, dtype: str) -> Expr:
    """The product of ``(op, factor)`` pairs (:func:`factors`), left to right from 1."""
    out = const(1, dtype)
    for op, f in pairs:
        out = binop(op, out, f)
    return out


def _floor_multiple(b, x):
    """``c`` when ``b`` is ``c * (x // c)`` (either order) for an integer constant ``c``."""
    if not (isinstance(b, BinOp) and b.op == "mul" and dt.is_int(b.dtype)):
        return None
    for c, q in ((b.a, b.b), (b.b, b.a)):
        if (isinstance(c, Const) and isinstance(q, BinOp) and q.op == "floordiv"
                and q.a is x and q.b is c):
            return c
    return None


def add(a, b):
    return binop("add", a, b)


def sub(a, b):
    return binop("sub", a, b)


def mul(a, b):
    return binop("mul", a, b)


def div(a, b):
    return binop("div", a, b)


def floordiv(a, b):
    return binop("floordiv", a, b)


def mod(a, b):
    return binop("mod", a, b)


def maximum(a, b):
    """``te.maximum``: elementwise max of two expressions."""
    return binop("max", a, b)


def minimum(a, b):
    """``te.minimum``: elementwise min of two expressions."""
    return binop("min", a, b)


def power(a, b):
    """``te.power(a, b)`` = a ** b (float)."""
    return binop("pow", a, b)


def neg(a):
    a = as_expr(a)
    if a.dtype == "bool":
        raise TypeError("cannot negate a bool expression; use te.not_ (logical not) or astype")
    if isinstance(a, Const):
        return const(-a.value, a.dtype)
    if isinstance(a, Unary) and a.op == "neg":
        return a.a
    return Unary("neg", a)


def unary(op: str, a) -> Expr:
    """An intrinsic ``op(a)``; ints are computed in float32 unless the
    operator keeps its operand's dtype (``ops.py``)."""
    a = as_expr(a)
    if op == "neg":
        return neg(a)
    if a.dtype == "bool":
        raise TypeError(f"te.{op} needs a numeric argument, got a bool expression")
    if not _ops.OPS[op].keeps_dtype:
        a = cast(dt.float_of(a.dtype), a)
    if isinstance(a, Const):
        value = _ops.OPS[op].fold(a.value)
        if value is not None:
            return const(value, a.dtype)
    return Unary(op, a)


def compare(op: str, a, b) -> Expr:
    """``a op b`` as a bool expression."""
    a, b = _pair(a, b)
    a, b = _unify(a, b)
    if isinstance(a, Const) and isinstance(b, Const):
        return const({"lt": a.value < b.value, "le": a.value <= b.value, "gt": a.value > b.value,
                      "ge": a.value >= b.value, "eq": a.value == b.value,
                      "ne": a.value != b.value}[op], "bool")
    if a is b and not dt.is_float(a.dtype):
        return const(op in ("le", "ge", "eq"), "bool")
    return Cmp(op, a, b)


def equal(a, b):
    """``te.equal``: element equality as a bool expression."""
    return compare("eq", a, b)


def not_equal(a, b):
    """``te.not_equal``: element inequality as a bool expression."""
    return compare("ne", a, b)


def _cond(c, what: str) -> Expr:
    if isinstance(c, (bool, np.bool_)):
        if what == "if_then_else":
            raise TypeError("te.if_then_else got a Python bool as condition; "
                            "use te.equal(a, b) instead of a == b to compare expressions")
        return const(bool(c), "bool")
    c = as_expr(c)
    if c.dtype != "bool":
        raise TypeError(f"{what} needs bool conditions, got {c.dtype} "
                        "(compare with <, >=, te.equal ... to make one)")
    return c


def logic_and(a, b) -> Expr:
    a, b = _cond(a, "te.all"), _cond(b, "te.all")
    if is_const(a):
        return b if a.value else a
    if is_const(b):
        return a if b.value else b
    if a is b:
        return a
    if _conditions.contradict(a, b):      # c and not c, i == 0 and i >= 1 ...
        return const(False, "bool")
    return Logic("and", a, b)


def logic_or(a, b) -> Expr:
    a, b = _cond(a, "te.any"), _cond(b, "te.any")
    if is_const(a):
        return a if a.value else b
    if is_const(b):
        return b if b.value else a
    return a if a is b else Logic("or", a, b)


def logic_not(a) -> Expr:
    """``te.not_``: logical negation of a condition."""
    a = _cond(a, "te.not_")
    if is_const(a):
        return const(not a.value, "bool")
    if isinstance(a, Logic) and a.op == "not":
        return a.a
    return Logic("not", a, None)


def all_(*conds) -> Expr:
    """``te.all``: conjunction of conditions (true when empty)."""
    out = const(True, "bool")
    for c in conds:
        out = logic_and(out, c)
    return out


def any_(*conds) -> Expr:
    """``te.any``: disjunction of conditions (false when empty)."""
    out = const(False, "bool")
    for c in conds:
        out = logic_or(out, c)
    return out


def select(cond, a, b) -> Expr:
    """``te.if_then_else(cond, a, b)``: ``a`` where ``cond`` holds, else ``b``."""
    cond = _cond(cond, "if_then_else")
    a, b = _pair(a, b)
    a, b = _unify(a, b)
    if is_const(cond):
        return a if cond.value else b
    # a branch that is itself a select whose condition the outer one decides
    # against takes its other branch (the adjoint of an else branch,
    # select(not t, g, 0), under a consumer's guard select(t, ..., 0) is 0)
    while isinstance(a, Select) and _conditions.contradict(cond, a.cond):
        a = a.b
    if isinstance(b, Select):
        otherwise = logic_not(cond)
        while isinstance(b, Select) and _conditions.contradict(otherwise, b.cond):
            b = b.b
    if a is b:
        return a
    return Select(cond, a, b)


def cast(to: str, a) -> Expr:
    """``a.astype(to)``."""
    a = as_expr(a)
    if a.dtype == to:
        return a
    if isinstance(a, Const):
        if to == "bool":
            return const(bool(a.value), to)
        if dt.is_int(to):
            return const(int(a.value), to) if math.isfinite(a.value) else Cast(to, a)
        return const(float(a.value), to)
    return Cast(to, a)


def load(tensor, indices) -> Load:
    return Load(tensor, tuple(indices))


def reduce(op: str, body: Expr, axes, doms) -> Expr:
    """A reduction node; an empty axis list returns ``body`` itself, and a
    domain with no point, or a sum of zeros or product of ones, the
    reduction's identity (argmax: position 0)."""
    if not axes:
        return body
    if any(isinstance(ext, Const) and ext.value <= 0 for _, ext in doms) or (
            op in ("sum", "prod") and is_const(body, identity_of(op, body.dtype))):
        return const(0, dt.INDEX) if op == "argmax" else const(identity_of(op, body.dtype), body.dtype)
    return Reduce(op, body, tuple(axes), tuple(doms))


def identity_of(op: str, dtype: str):
    """The neutral element of reduction ``op`` in ``dtype``."""
    if op == "sum":
        return 0
    if op == "prod":
        return 1
    if op in ("max", "argmax"):
        return -math.inf if dt.is_float(dtype) else (-2**31 if dtype == "int32" else -2**63)
    if op == "min":
        return math.inf if dt.is_float(dtype) else (2**31 - 1 if dtype == "int32" else 2**63 - 1)
    raise ValueError(f"unknown reduction {op!r}")


from . import conditions as _conditions   # noqa: E402  (it reads this module's node classes)
from . import ops as _ops      # noqa: E402  (the table reads this module's constructors)
