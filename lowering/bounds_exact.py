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
    """A CP-SAT model of one read's context; integer nodes map to
    ``(linear expression, lo, hi)``, conditions to literals."""

    def __init__(self):
        from ortools.sat.python import cp_model
        self.cp = cp_model
        self.m = cp_model.CpModel()
        self.ints, self.bools = {}, {}
        self.loop_vars = {}

    # ---------------------------------------------------------------- integers

    def value(self, e):
        if e not in self.ints:
            if e.dtype == "bool":
                self.ints[e] = (self.literal(e), 0, 1)
            else:
                rule = _INT_RULES.get(type(e))
                if rule is None or not dt.is_int(e.dtype):
                    raise _Unsupported(e)
                self.ints[e] = rule(self, e)
        return self.ints[e]

    def fresh(self, lo, hi, name="t"):
        return self.m.new_int_var(int(lo), int(hi), name)

    def as_var(self, v):
        """``v`` (a ``value`` triple) as a single CP-SAT variable (products need one)."""
        x, lo, hi = v
        if not isinstance(x, self.cp.IntVar):
            y = self.fresh(lo, hi)
            self.m.add(y == x)
            return y
        return x

    def const(self, e):
        if dt.is_float(e.dtype):
            raise _Unsupported(e)
        c = int(e.value)
        return c, c, c

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
            (a, alo, ahi), (b, blo, bhi) = va, vb = self.value(e.a), self.value(e.b)
            ends = [x * y for x in (alo, ahi) for y in (blo, bhi)]
            if alo == ahi:
                return alo * b, min(ends), max(ends)
            if blo == bhi:
                return blo * a, min(ends), max(ends)
            p = self.fresh(min(ends), max(ends))
            self.m.add_multiplication_equality(p, [self.as_var(va), self.as_var(vb)])
            return p, min(ends), max(ends)
        if e.op in ("floordiv", "mod") and isinstance(e.b, Const) and e.b.value != 0:
            d = int(e.b.value)
            x, lo, hi = self.value(e.a)
            qs = sorted((lo // d, hi // d))
            q = self.fresh(*qs)
            r = x - d * q                                   # floor semantics: r has the sign of d
            rlo, rhi = (0, d - 1) if d > 0 else (d + 1, 0)
            self.m.add(r >= rlo)
            self.m.add(r <= rhi)
            return (q, qs[0], qs[1]) if e.op == "floordiv" else (r, rlo, rhi)
        if e.op in ("max", "min"):
            va, vb = self.value(e.a), self.value(e.b)
            pick = max if e.op == "max" else min
            lo, hi = pick(va[1], vb[1]), pick(va[2], vb[2])
            y = self.fresh(lo, hi)
            add = self.m.add_max_equality if e.op == "max" else self.m.add_min_equality
            add(y, [va[0], vb[0]])
            return y, lo, hi
        raise _Unsupported(e)

    def unary(self, e):
        if e.op != "neg":
            raise _Unsupported(e)
        x, lo, hi = self.value(e.a)
        return -x, -hi, -lo

    def cast(self, e):
        if e.a.dtype == "bool":
            return self.literal(e.a), 0, 1
        if dt.is_int(e.a.dtype):
            return self.value(e.a)
        raise _Unsupported(e)

    def select(self, e):
        c = self.literal(e.cond)
        va, vb = self.value(e.a), self.value(e.b)
        lo, hi = min(va[1], vb[1]), max(va[2], vb[2])
        y = self.fresh(lo, hi)
        self.m.add(y == va[0]).only_enforce_if(c)
        self.m.add(y == vb[0]).only_enforce_if(~c)
        return y, lo, hi

    # -------------------------------------------------------------- conditions

    def literal(self, c):
        """A boolean equal to condition ``c`` (free where ``c`` cannot be encoded)."""
        if c not in self.bools:
            b = self.m.new_bool_var("c")
            self.bools[c] = b
            try:
                self.tie(b, c)
            except _Unsupported:
                pass
        return self.bools[c]

    def tie(self, b, c):
        m = self.m
        if isinstance(c, Const):
            m.add_bool_or([b if c.value else ~b])
        elif isinstance(c, Logic) and c.op == "not":
            x = self.literal(c.a)
            m.add(b == 1 - x)
        elif isinstance(c, Logic):
            x, y = self.literal(c.a), self.literal(c.b)
            if c.op == "and":
                m.add_bool_and([x, y]).only_enforce_if(b)
                m.add_bool_or([~x, ~y]).only_enforce_if(~b)
            else:
                m.add_bool_or([x, y]).only_enforce_if(b)
                m.add_bool_and([~x, ~y]).only_enforce_if(~b)
        elif isinstance(c, Cmp) and (dt.is_int(c.a.dtype) or c.a.dtype == "bool"):
            d = self.value(c.a)[0] - self.value(c.b)[0]
            true, false = _CMP[c.op]
            m.add(true(d)).only_enforce_if(b)
            m.add(false(d)).only_enforce_if(~b)
        elif isinstance(c, Cast) and dt.is_int(c.a.dtype):
            x = self.value(c.a)[0]
            m.add(x != 0).only_enforce_if(b)
            m.add(x == 0).only_enforce_if(~b)
        else:
            raise _Unsupported(c)

    # ------------------------------------------------------------------ scope

    def loops(self, doms):
        """Each loop variable within its domain, outermost first."""
        for v, (lo, ext) in doms.items():
            if isinstance(lo, Const) and isinstance(ext, Const):
                first, n = int(lo.value), int(ext.value)
                if n <= 0:
                    self.m.add_bool_or([])          # an empty loop: the read never runs
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
                self.m.add_bool_or([])
                continue
            x = self.fresh(alo, ahi + nhi - 1, v.name)
            self.m.add(x >= a)
            self.m.add(x <= a + n - 1)
            self.loop_vars[v] = (x, alo, ahi + nhi - 1)

    def optimum(self, target, maximize: bool):
        """``(status, value, point)`` of the extreme of ``target``."""
        cp = self.cp
        (self.m.maximize if maximize else self.m.minimize)(target)
        solver = cp.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.max_time_in_seconds = SOLVE_SECONDS
        status = solver.solve(self.m)
        if status == cp.INFEASIBLE:
            return "empty", None, ()
        if status == cp.OPTIMAL:
            point = tuple((v.name, solver.value(x)) for v, (x, _, _) in self.loop_vars.items())
            return "exact", int(round(solver.objective_value)), point
        if status == cp.FEASIBLE:                   # out of time: the proven bound still holds
            bound = solver.best_objective_bound
            return "bound", int(bound // 1 if maximize else -(-bound // 1)), ()
        return "unknown", None, ()


_CMP = {"lt": (lambda d: d <= -1, lambda d: d >= 0), "le": (lambda d: d <= 0, lambda d: d >= 1),
        "gt": (lambda d: d >= 1, lambda d: d <= 0), "ge": (lambda d: d >= 0, lambda d: d <= -1),
        "eq": (lambda d: d == 0, lambda d: d != 0), "ne": (lambda d: d != 0, lambda d: d == 0)}

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
                model.m.add_bool_or([lit if truth else ~lit])
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
