"""Exact index ranges by constraint programming: the fallback of ``bounds_check``.

A read's context and its index become one CP-SAT model:

* each loop variable ranges over its domain, whose ends may be expressions of
  outer variables (a zero-eliminated, triangular domain);
* each guard around the read (``if_then_else`` conditions and the negation
  in the other branch, ``te.all``/``te.any``, ``te.equal``/``te.not_equal``,
  comparisons) is a boolean tied both ways to what it tests, so ``or``, ``!=``
  and negations are exact;
* integer arithmetic is encoded exactly: products of variables, ``//`` and
  ``%`` by constants (floor semantics through a quotient variable), ``max`` and
  ``min``, integer selects.

Minimising and maximising the index gives its reachable range over the
integer points where the read executes, and the optimal assignments are
example points.  What no encoding covers (a test of float data) becomes a
free boolean, which only enlarges the set of points: a proof stays a proof.
Answers are cached per index and context.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from arith.cpsat import OPEN, Model
from arith.linear import LinearExpr
from te_autodiff import dtype as dt
from te_autodiff.expr import BinOp, Cast, Cmp, Const, Logic, Select, Unary, Var

SOLVE_SECONDS = 20.0        # per optimisation; the models of index reads are small
RANGES = 1 << 12            # index ranges remembered across builds


class _Unsupported(Exception):
    """An integer expression with no exact encoding (the index cannot be bounded)."""


@dataclass(frozen=True)
class Reach:
    """The range ``[lo, hi]`` an index takes where its read executes, and one
    point (``{variable name: value}``) at each end."""

    lo: int
    hi: int
    at_lo: tuple
    at_hi: tuple


class _Model:
    """A CP-SAT model of one read's context (``arith.cpsat.Model``); integer nodes
    map to ``(linear expression, lo, hi)``, conditions to literals."""

    def __init__(self):
        self.m = Model()
        self.ints, self.bools = {}, {}
        self.loop_vars = {}

    def fresh(self, lo, hi, name="t") -> LinearExpr:
        return self.m.int_var(lo, hi, name)

    # ---------------------------------------------------------------- integers

    def value(self, e):
        if e not in self.ints:
            if e.dtype == "bool":
                self.ints[e] = (LinearExpr({self.literal(e): 1}), 0, 1)
            else:
                rule = _INT_RULES.get(type(e))
                if rule is None or not dt.is_int(e.dtype):
                    raise _Unsupported(e)
                self.ints[e] = rule(self, e)
        return self.ints[e]

    def const(self, e):
        if dt.is_float(e.dtype):
            raise _Unsupported(e)
        c = int(e.value)
        return LinearExpr(const=c), c, c

    def var(self, e):
        if e not in self.loop_vars:       # a variable without a loop here: its fixed range, if any
            if e.dom is None:
                raise _Unsupported(e)
            lo, n = e.dom
            if n <= 0:
                raise _Unsupported(e)
            self.loop_vars[e] = (self.fresh(lo, lo + n - 1, e.name), lo, lo + n - 1)
        return self.loop_vars[e]

    def binop(self, e):
        if e.op in ("add", "sub"):
            (a, alo, ahi), (b, blo, bhi) = self.value(e.a), self.value(e.b)
            return (a + b, alo + blo, ahi + bhi) if e.op == "add" else (a - b, alo - bhi, ahi - blo)
        if e.op == "mul":
            (a, alo, ahi), (b, blo, bhi) = self.value(e.a), self.value(e.b)
            ends = [x * y for x in (alo, ahi) for y in (blo, bhi)]
            if alo == ahi:
                return b * alo, min(ends), max(ends)
            if blo == bhi:
                return a * blo, min(ends), max(ends)
            p = self.fresh(min(ends), max(ends))
            self.m.product(p, a, b)
            return p, min(ends), max(ends)
        if e.op in ("floordiv", "mod") and isinstance(e.b, Const) and e.b.value != 0:
            d = int(e.b.value)
            x, lo, hi = self.value(e.a)
            qs = sorted((lo // d, hi // d))
            q = self.fresh(*qs)
            r = x - q * d                                   # floor semantics: r has the sign of d
            rlo, rhi = (0, d - 1) if d > 0 else (d + 1, 0)
            self.m.within(r, (rlo, rhi))
            return (q, qs[0], qs[1]) if e.op == "floordiv" else (r, rlo, rhi)
        if e.op in ("max", "min"):
            va, vb = self.value(e.a), self.value(e.b)
            pick = max if e.op == "max" else min
            lo, hi = pick(va[1], vb[1]), pick(va[2], vb[2])
            y = self.fresh(lo, hi)
            sign = 1 if e.op == "max" else -1              # min(a, b) = -max(-a, -b)
            self.m.maximum(y * sign, [va[0] * sign, vb[0] * sign])
            return y, lo, hi
        raise _Unsupported(e)

    def unary(self, e):
        if e.op != "neg":
            raise _Unsupported(e)
        x, lo, hi = self.value(e.a)
        return x * -1, -hi, -lo

    def cast(self, e):
        if e.a.dtype == "bool":
            return LinearExpr({self.literal(e.a): 1}), 0, 1
        if dt.is_int(e.a.dtype):
            return self.value(e.a)
        raise _Unsupported(e)

    def select(self, e):
        c = self.literal(e.cond)
        va, vb = self.value(e.a), self.value(e.b)
        lo, hi = min(va[1], vb[1]), max(va[2], vb[2])
        y = self.fresh(lo, hi)
        self.m.within(y - va[0], (0, 0), enforced=[c])
        self.m.within(y - vb[0], (0, 0), enforced=[-c - 1])
        return y, lo, hi

    # -------------------------------------------------------------- conditions

    def literal(self, c) -> int:
        """A boolean equal to condition ``c`` (free where ``c`` cannot be encoded)."""
        if c not in self.bools:
            b = self.m.bool_var()
            self.bools[c] = b
            try:
                self.tie(b, c)
            except _Unsupported:
                pass
        return self.bools[c]

    def tie(self, b: int, c):
        m, nb = self.m, -b - 1
        if isinstance(c, Const):
            m.clause([b if c.value else nb])
        elif isinstance(c, Logic) and c.op == "not":
            m.within(LinearExpr({b: 1, self.literal(c.a): 1}), (1, 1))
        elif isinstance(c, Logic):
            x, y = self.literal(c.a), self.literal(c.b)
            both, either = ("bool_and", "bool_or") if c.op == "and" else ("bool_or", "bool_and")
            m.clause([x, y], both, enforced=[b])
            m.clause([-x - 1, -y - 1], either, enforced=[nb])
        elif isinstance(c, Cmp) and (dt.is_int(c.a.dtype) or c.a.dtype == "bool"):
            (x, xlo, xhi), (y, ylo, yhi) = self.value(c.a), self.value(c.b)
            d, lo, hi = x - y, xlo - yhi, xhi - ylo
            true, false = _CMP[c.op]
            m.within(d, *_clip(true, lo, hi), enforced=[b])
            m.within(d, *_clip(false, lo, hi), enforced=[nb])
        elif isinstance(c, Cast) and dt.is_int(c.a.dtype):
            x, lo, hi = self.value(c.a)
            m.within(x, *_clip(_CMP["ne"][0], lo, hi), enforced=[b])
            m.within(x, (0, 0), enforced=[nb])
        else:
            raise _Unsupported(c)

    # ------------------------------------------------------------------ scope

    def loops(self, doms):
        """Each loop variable within its domain, outermost first."""
        for v, (lo, ext) in doms.items():
            if isinstance(lo, Const) and isinstance(ext, Const):
                first, n = int(lo.value), int(ext.value)
                if n <= 0:
                    self.m.clause([])               # an empty loop: the read never runs
                    continue
                self.loop_vars[v] = (self.fresh(first, first + n - 1, v.name), first, first + n - 1)
                continue
            try:
                (a, alo, ahi), (n, _, nhi) = self.value(lo), self.value(ext)
            except _Unsupported:                    # a range read from data: the variable's fixed range
                if v.dom is not None and v.dom[1] > 0:
                    self.var(v)
                continue
            if nhi <= 0:
                self.m.clause([])
                continue
            x = self.fresh(alo, ahi + nhi - 1, v.name)
            self.m.within(x - a, (0, OPEN))                 # a <= x <= a + n - 1
            self.m.within(x - a - n, (-OPEN, -1))
            self.loop_vars[v] = (x, alo, ahi + nhi - 1)

    def optimum(self, target: LinearExpr, maximize: bool):
        """``(status, value, point)`` of the extreme of ``target``."""
        result = self.m.solve(target, maximize, SOLVE_SECONDS)
        if result.status == "infeasible":
            return "empty", None, ()
        if result.status == "optimal":
            point = tuple((v.name, x.evaluate(result.values)) for v, (x, _, _) in self.loop_vars.items())
            return "exact", int(round(result.value)), point
        if result.status == "feasible":            # out of time: the proven bound still holds
            bound = result.bound
            return "bound", int(bound // 1 if maximize else -(-bound // 1)), ()
        return "unknown", None, ()


def _clip(test, lo: int, hi: int) -> list:
    """The ranges of ``[lo, hi]`` where ``test`` (a ``_CMP`` entry: ranges of
    a difference) holds; an empty list when it never does."""
    out = []
    for a, b in test:
        a, b = max(a, lo), min(b, hi)
        if a <= b:
            out.append((a, b))
    return out


_CMP = {"lt": (((-OPEN, -1),), ((0, OPEN),)), "le": (((-OPEN, 0),), ((1, OPEN),)),      # ranges of a - b
        "gt": (((1, OPEN),), ((-OPEN, 0),)), "ge": (((0, OPEN),), ((-OPEN, -1),)),      # where a op b holds,
        "eq": (((0, 0),), ((-OPEN, -1), (1, OPEN))), "ne": (((-OPEN, -1), (1, OPEN)), ((0, 0),))}  # and fails

_INT_RULES = {Const: _Model.const, Var: _Model.var, BinOp: _Model.binop, Unary: _Model.unary,
              Cast: _Model.cast, Select: _Model.select}


@functools.lru_cache(maxsize=RANGES)
def _reach(index, doms: tuple, conds: frozenset):
    """``Reach``; None when no point runs the read; ``"unknown"`` when the index
    has no exact encoding or the solver ran out of time on both ends."""
    ends = []
    for maximize in (False, True):
        model = _Model()
        try:
            model.loops(dict(doms))
            for cond, truth in conds:
                lit = model.literal(cond)
                model.m.clause([lit if truth else -lit - 1])
            target = model.value(index)[0]
        except _Unsupported:
            return "unknown"
        status, value, point = model.optimum(target, maximize)
        if status == "empty":
            return None
        if status == "unknown":
            return "unknown"
        ends.append((value, point))
    (lo, at_lo), (hi, at_hi) = ends
    return Reach(lo, hi, at_lo, at_hi)


def reach(index, scope):
    """The range of the integer ``index`` over the points of ``scope`` (a
    ``bounds_check.Scope``): a :class:`Reach`, None if the read never runs
    there, ``"unknown"`` if it cannot be bounded."""
    return _reach(index, tuple(scope.doms.items()), frozenset(scope.conds))
