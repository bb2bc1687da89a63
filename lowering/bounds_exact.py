"""Exact index bounds by integer programming: the fallback of ``bounds_check``.

A read's context (loop variables with their domains, the guards around it)
and its index are encoded as an ``arith.LinearSystem``; ``//`` and ``%`` by
constants get a quotient variable, ``max``/``min`` a binary choice.  The
CP-SAT bounder (``arith.numeric_bounds``) then gives the exact range of the
index over the integer points where the read executes.  Guards that cannot be
encoded (``or``, ``!=``, non-linear terms) are dropped, which only enlarges
the set of points, so a proof stays a proof.
"""
from __future__ import annotations

from arith import LinearExpr, LinearSystem, Var as Unknown, numeric_bounds

from te_autodiff import dtype as dt
from te_autodiff.expr import BinOp, Cast, Cmp, Const, Logic, Unary, Var

_BIG = 1 << 32          # big-M of the max/min encodings; indices are far smaller


class _Unsupported(Exception):
    """The expression has no linear encoding."""


class _Encoding:
    """Linear forms of index expressions plus the constraints of their helpers."""

    def __init__(self):
        self.ranges, self.equalities, self.inequalities, self.memo = {}, [], [], {}
        self.seen = set()           # (condition, truth) pairs already encoded

    def lin(self, e) -> LinearExpr:
        if e not in self.memo:
            rule = _ENCODE.get(type(e))
            if rule is None or not (dt.is_int(e.dtype) or isinstance(e, Const)):
                raise _Unsupported(e)
            self.memo[e] = rule(self, e)
        return self.memo[e]

    def fresh(self, name, lo=None, hi=None) -> LinearExpr:
        v = Unknown(name)
        if lo is not None:
            self.ranges[v] = (lo, hi)
        return LinearExpr.var(v)

    def binop(self, e) -> LinearExpr:
        if e.op in ("add", "sub"):
            a, b = self.lin(e.a), self.lin(e.b)
            return a + b if e.op == "add" else a - b
        if e.op == "mul":
            a, b = self.lin(e.a), self.lin(e.b)
            if a.is_const or b.is_const:
                return a * b
            raise _Unsupported(e)
        if e.op in ("floordiv", "mod") and isinstance(e.b, Const) and e.b.value != 0:
            d, x = e.b.value, self.lin(e.a)
            q = self.fresh("q")
            r = x - q * d                           # floor semantics: r has the sign of d
            self.inequalities += [r, (d - 1) - r] if d > 0 else [-r, r - (d + 1)]
            return q if e.op == "floordiv" else r
        if e.op in ("max", "min"):
            a, b = self.lin(e.a), self.lin(e.b)
            m, z = self.fresh(e.op), self.fresh("z", 0, 1)
            s = 1 if e.op == "max" else -1          # max: m >= a, b and m <= the chosen one
            self.inequalities += [(m - a) * s, (m - b) * s,
                                  (a - m) * s + z * _BIG, (b - m) * s + (1 - z) * _BIG]
            return m
        raise _Unsupported(e)

    def condition(self, cond, truth: bool) -> None:
        """Add the constraints implied by ``cond == truth`` (those it can encode),
        each sub-condition once."""
        if (cond, truth) in self.seen:
            return
        self.seen.add((cond, truth))
        if isinstance(cond, Logic):
            if cond.op == "not":
                self.condition(cond.a, not truth)
            elif (cond.op == "and") == truth:
                self.condition(cond.a, truth)
                self.condition(cond.b, truth)
            return
        if not isinstance(cond, Cmp) or not dt.is_int(cond.a.dtype):
            return
        op = cond.op if truth else NEGATED[cond.op]
        try:
            d = self.lin(cond.a) - self.lin(cond.b)
        except _Unsupported:
            return
        if op == "eq":
            self.equalities.append(d)
        elif op != "ne":
            self.inequalities.append({"lt": -d - 1, "le": -d, "gt": d - 1, "ge": d}[op])


NEGATED = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}

_ENCODE = {
    Const: lambda enc, e: LinearExpr.const(int(e.value)) if not dt.is_float(e.dtype) else _fail(e),
    Var: lambda enc, e: LinearExpr.var(e),
    BinOp: _Encoding.binop,
    Unary: lambda enc, e: -enc.lin(e.a) if e.op == "neg" else _fail(e),
    Cast: lambda enc, e: enc.lin(e.a) if dt.is_int(e.a.dtype) else _fail(e),
}


def _fail(e):
    raise _Unsupported(e)


def proves_in_range(index, extent: int, scope) -> bool:
    """Whether ``0 <= index < extent`` wherever ``scope`` (a bounds_check.Scope) holds."""
    enc = _Encoding()
    try:
        for v, (lo, ext) in scope.doms.items():
            if isinstance(lo, Const) and isinstance(ext, Const):
                enc.ranges[v] = (lo.value, lo.value + ext.value - 1)
            else:
                try:
                    x, first = LinearExpr.var(v), enc.lin(lo)
                    enc.inequalities += [x - first, first + enc.lin(ext) - 1 - x]
                except _Unsupported:        # a range read from data: the variable's fixed range, if any
                    if v.dom is not None:
                        enc.ranges[v] = (v.dom[0], v.dom[0] + v.dom[1] - 1)
        for cond, truth in scope.conds:
            enc.condition(cond, truth)
        target = enc.lin(index)
        system = LinearSystem(ranges=enc.ranges, equalities=enc.equalities,
                              inequalities=enc.inequalities)
        found = numeric_bounds(target, system)
    except (_Unsupported, ValueError):
        return False
    return found is None or (0 <= found[0] and found[1] < extent)
