"""Bounds on integer variables: Fourier-Motzkin loop bounds and exact OR-tools queries.

``fourier_motzkin`` turns a polytope into nested loop bounds (each variable
between a max of ceilings and a min of floors of affine functions of the
outer variables). ``numeric_bounds``, ``is_feasible`` and ``is_implied``
answer exact questions about the integer points of a ``LinearSystem`` with
CP-SAT (models written by ``cpsat``: OR-tools is imported when a solver is
first called), unless bound propagation proves a system empty or a point of
its box satisfies it; their answers are cached on a canonical form of the query.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Hashable, Iterable, Iterator, Mapping, NamedTuple

from . import cpsat
from .linear import LinearExpr, LinearSystem, as_linear

__all__ = ["VarBounds", "FMResult", "fourier_motzkin", "normalize_inequality",
           "numeric_bounds", "is_feasible", "is_implied", "clear_caches"]

TIME_LIMIT_SECONDS = 5.0
CACHE_SIZE = 4096


def normalize_inequality(e: LinearExpr) -> LinearExpr:
    """The tightest form of ``e >= 0`` on integer points.

    ``g * (a . x) + c >= 0`` with ``g`` the coefficient gcd is equivalent,
    for integer ``x``, to ``a . x + floor(c / g) >= 0``.
    """
    g = e.gcd_of_coeffs()
    if g <= 1:
        return e
    return LinearExpr({v: c // g for v, c in e.terms.items()}, e.const // g)


class _Empty(Exception):
    """The constraints have no integer point."""


def _dedupe(constraints: Iterable[LinearExpr]) -> list[LinearExpr]:
    """Normalise, drop true constants and keep the tightest of parallel constraints.

    Raises _Empty on a false constant or on opposite constraints
    ``a.x + c1 >= 0``, ``-a.x + c2 >= 0`` with ``c1 + c2 < 0``.
    """
    best: dict = {}
    for e in constraints:
        e = normalize_inequality(e)
        if e.is_const:
            if e.const < 0:
                raise _Empty
            continue
        key = frozenset(e.terms.items())
        if key not in best or e.const < best[key].const:
            best[key] = e
    for key, e in best.items():
        opposite = best.get(frozenset((v, -c) for v, c in key))
        if opposite is not None and e.const + opposite.const < 0:
            raise _Empty
    return list(best.values())


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _format_bound(expr: LinearExpr, coef: int, rounding: str) -> str:
    if coef == 1:
        return str(expr)
    simple = len(expr.vars) + bool(expr.const) <= 1
    return f"{rounding}({expr if simple else f'({expr})'} / {coef})"


@dataclass(frozen=True)
class VarBounds:
    """``max(ceil(L / a) for L, a in lower) <= var <= min(floor(R / b) for R, b in upper)``.

    An empty ``lower`` (``upper``) means no lower (upper) bound.
    """

    var: Hashable
    lower: tuple
    upper: tuple

    def lower_value(self, env: Mapping[Hashable, int]) -> int | None:
        if not self.lower:
            return None
        return max(_ceil_div(e.evaluate(env), a) for e, a in self.lower)

    def upper_value(self, env: Mapping[Hashable, int]) -> int | None:
        if not self.upper:
            return None
        return min(e.evaluate(env) // b for e, b in self.upper)

    def __str__(self) -> str:
        def side(items, rounding, combine, none):
            parts = [_format_bound(e, c, rounding) for e, c in items]
            if not parts:
                return none
            return parts[0] if len(parts) == 1 else f"{combine}({', '.join(parts)})"
        return (f"{side(self.lower, 'ceil', 'max', '-inf')} <= {self.var} <= "
                f"{side(self.upper, 'floor', 'min', 'inf')}")


class FMResult(NamedTuple):
    """Nested loop bounds, outermost first, and the constraints left on the parameters."""

    bounds: list
    remaining: list

    @property
    def infeasible(self) -> bool:
        """True when elimination proved that there is no integer point at all."""
        return any(e.is_const and e.const < 0 for e in self.remaining)

    def points(self, env: Mapping[Hashable, int] | None = None) -> Iterator[dict]:
        """Enumerate the integer points by running the loop nest for parameters ``env``."""
        env = dict(env or {})
        if any(e.evaluate(env) < 0 for e in self.remaining):
            return iter(())
        return _nest(self.bounds, 0, env)

    def contains(self, env: Mapping[Hashable, int]) -> bool:
        """Whether the loop nest visits the point ``env`` (all bounds and remaining hold)."""
        if any(e.evaluate(env) < 0 for e in self.remaining):
            return False
        for b in self.bounds:
            if b.var not in env:
                raise ValueError(f"no value for variable {b.var} in the point")
            lo, hi = b.lower_value(env), b.upper_value(env)
            if (lo is not None and env[b.var] < lo) or (hi is not None and env[b.var] > hi):
                return False
        return True

    def __str__(self) -> str:
        lines = [str(b) for b in self.bounds] + [f"{e} >= 0" for e in self.remaining]
        return "\n".join(lines)


def _nest(bounds: list, t: int, env: dict) -> Iterator[dict]:
    if t == len(bounds):
        yield dict(env)
        return
    b = bounds[t]
    lo, hi = b.lower_value(env), b.upper_value(env)
    if lo is None or hi is None:
        raise ValueError(f"{b.var} has no {'lower' if lo is None else 'upper'} bound; cannot enumerate")
    for x in range(lo, hi + 1):
        env[b.var] = x
        yield from _nest(bounds, t + 1, env)
    env.pop(b.var, None)


def fourier_motzkin(inequalities: Iterable, order: Iterable[Hashable],
                    context: LinearSystem | None = None, prune: bool = True) -> FMResult:
    """Loop bounds for the integer points of ``{x : e(x) >= 0 for e in inequalities}``.

    ``order`` lists the variables to bound, outermost first; the bounds of
    ``order[t]`` use only ``order[:t]`` and the parameters (all other
    variables). ``remaining`` holds the constraints left on the parameters.
    Running the loops (``FMResult.points``) visits exactly the integer points:
    each constraint becomes a bound of its innermost variable, and each
    eliminated variable leaves the rational shadow ``a R - b L >= 0`` of each
    pair ``x >= L / a``, ``x <= R / b``, a necessary condition on the outer ones.

    ``context`` states facts about the parameters that hold wherever the
    result is used (e.g. their loop ranges); it must not mention ``order``.
    With ``prune``, a constraint is dropped when CP-SAT proves it implied by
    the others and the context (only when every variable is bounded).
    """
    order = tuple(order)
    if len(set(order)) != len(order):
        raise ValueError(f"variables listed twice in order {[str(v) for v in order]}")
    context = context if context is not None else LinearSystem()
    clash = next((v for v in context.variables if v in set(order)), None)
    if clash is not None:
        raise ValueError(f"context constrains {clash}, which is being bounded; pass its constraints as inequalities")
    try:
        current = _dedupe(as_linear(e, "inequality") for e in inequalities)
        bounds = []
        for x in reversed(order):
            involving = [c for c in current if c.coeff(x)]
            others = [c for c in current if not c.coeff(x)]
            if prune:
                involving = _prune(involving, others, context)
            lower = tuple((LinearExpr.var(x, c.coeff(x)) - c, c.coeff(x))
                          for c in involving if c.coeff(x) > 0)
            upper = tuple((c - LinearExpr.var(x, c.coeff(x)), -c.coeff(x))
                          for c in involving if c.coeff(x) < 0)
            bounds.append(VarBounds(x, lower, upper))
            # L / a <= x <= R / b has a rational solution x iff a R - b L >= 0.
            current = _dedupe(others + [r * a - l * b for l, a in lower for r, b in upper])
        if prune:
            current = _prune(current, [], context)
    except _Empty:
        return FMResult([VarBounds(v, (), ()) for v in order], [LinearExpr.const(-1)])
    return FMResult(bounds[::-1], current)


def _prune(candidates: list, others: list, context: LinearSystem) -> list:
    """Drop candidates implied (on integer points) by the remaining constraints and the context.

    The most complex constraints are tried first, so simple ones survive.
    """
    kept = list(candidates)
    for c in sorted(candidates, key=lambda e: (len(e.vars), sum(map(abs, e.terms.values()))),
                    reverse=True):
        rest = [d for d in kept if d is not c] + others
        system = LinearSystem(ranges=context.ranges, equalities=context.equalities,
                              inequalities=list(context.inequalities) + rest)
        try:
            if is_implied(c, system):
                kept.remove(c)
        except ValueError:  # an unbounded variable: CP-SAT cannot decide, keep c
            continue
    return kept


# -- exact queries -----------------------------------------------------------

def _canonical(system: LinearSystem) -> tuple:
    """A hashable key equal for systems with the same constraints in any order."""
    if not isinstance(system, LinearSystem):
        raise TypeError(f"expected a LinearSystem, got {type(system).__name__}")
    eqs = frozenset(frozenset((e, -e)) for e in system.equalities
                    if not (e.is_const and e.const == 0))
    ineqs = frozenset(e for e in map(normalize_inequality, system.inequalities)
                      if not (e.is_const and e.const >= 0))
    return frozenset(system.ranges.items()), eqs, ineqs


def _key_inequalities(key: tuple) -> list[LinearExpr]:
    _, eqs, ineqs = key
    out = list(ineqs)
    for pair in eqs:
        e = next(iter(pair))
        out += [e, -e]
    return out


def _key_vars(key: tuple) -> dict:
    seen = {v: None for v, _ in key[0]}
    for e in _key_inequalities(key):
        seen.update(dict.fromkeys(e.vars))
    return seen


def _propagate(ineqs: list[LinearExpr], box: dict) -> bool:
    """Tighten ``box`` (var -> [lo, hi], None = infinite) by interval reasoning.

    From ``a x + rest >= 0`` and ``rest <= rest_max``: ``a x >= -rest_max``.
    Returns False when some interval becomes empty.
    """
    for _ in range(2 * len(box) + 4):
        changed = False
        for e in ineqs:
            tops = {}
            for v, a in e.terms.items():
                end = box[v][1] if a > 0 else box[v][0]
                tops[v] = None if end is None else a * end
            unknown = [v for v, t in tops.items() if t is None]
            finite = e.const + sum(t for t in tops.values() if t is not None)
            if not unknown and finite < 0:
                return False
            for v, a in e.terms.items():
                if unknown and unknown != [v]:
                    continue
                rest_max = finite if tops[v] is None else finite - tops[v]
                lo, hi = box[v]
                if a > 0:
                    new = _ceil_div(-rest_max, a)
                    if lo is None or new > lo:
                        box[v][0] = lo = new
                        changed = True
                else:
                    new = rest_max // -a
                    if hi is None or new < hi:
                        box[v][1] = hi = new
                        changed = True
                if lo is not None and hi is not None and lo > hi:
                    return False
        if not changed:
            break
    return True


def _lp_bounds(ineqs: list[LinearExpr], box: dict, targets: list) -> bool:
    """Bound each target variable by the LP relaxation (GLOP), with slack for rounding.

    Returns False when the relaxation is infeasible; raises ValueError naming a
    variable whose relaxation is unbounded.
    """
    from ortools.linear_solver import pywraplp
    lp = pywraplp.Solver.CreateSolver("GLOP")
    inf = lp.infinity()
    xs = {v: lp.NumVar(-inf if lo is None else lo, inf if hi is None else hi, f"x{n}")
          for n, (v, (lo, hi)) in enumerate(box.items())}
    for e in ineqs:
        lp.Add(sum(a * xs[v] for v, a in e.terms.items()) + e.const >= 0)
    # GLOP may report an unbounded objective as INFEASIBLE, so decide
    # feasibility first, with no objective.
    if lp.Solve() != pywraplp.Solver.OPTIMAL:
        return False
    for v in targets:
        for side, sense in ((0, lp.Minimize), (1, lp.Maximize)):
            if box[v][side] is not None:
                continue
            sense(xs[v])
            if lp.Solve() != pywraplp.Solver.OPTIMAL:
                raise ValueError(f"variable {v} is unbounded: give it a range or constraints that bound it")
            value = xs[v].solution_value()
            box[v][side] = math.floor(value) - 1 if side == 0 else math.ceil(value) + 1
    return True


@lru_cache(maxsize=CACHE_SIZE)
def _box(key: tuple) -> dict | None:
    """Finite integer bounds for every variable of ``key``, or None if infeasible."""
    ranges = dict(key[0])
    box = {v: list(ranges.get(v, (None, None))) for v in _key_vars(key)}
    if any(lo > hi for lo, hi in ranges.values()):
        return None
    ineqs = _key_inequalities(key)
    if not _propagate(ineqs, box):
        return None
    open_vars = [v for v, (lo, hi) in box.items() if lo is None or hi is None]
    if open_vars and not (_lp_bounds(ineqs, box, open_vars) and _propagate(ineqs, box)):
        return None
    return {v: (lo, hi) for v, (lo, hi) in box.items()}


def _box_with(key: tuple, extra: Iterable[Hashable]) -> dict | None:
    box = _box(key)
    if box is not None:
        for v in extra:
            if v not in box:
                raise ValueError(f"variable {v} is unbounded: give it a range or constraints that bound it")
    return box


def _interval(expr: LinearExpr, box: dict) -> tuple[int, int]:
    lo = hi = expr.const
    for v, a in expr.terms.items():
        ends = (a * box[v][0], a * box[v][1])
        lo, hi = lo + min(ends), hi + max(ends)
    return lo, hi


def _model(key: tuple, box: dict):
    """The CP-SAT model of ``key``'s system (``arith.cpsat``), its variables
    ``xs`` within ``box``, and ``lin``: a linear expression as the model's."""
    model = cpsat.Model()
    xs = {v: model.int_var(lo, hi, f"x{n}") for n, (v, (lo, hi)) in enumerate(box.items())}

    def lin(e: LinearExpr) -> LinearExpr:
        return sum((xs[v] * a for v, a in e.terms.items()), LinearExpr(const=e.const))

    # Constant constraints were already checked by _box's propagation.
    for pair in key[1]:
        e = next(iter(pair))
        if e.terms:
            model.within(lin(e), (0, 0))
    for e in key[2]:
        if e.terms:
            model.within(lin(e), (0, cpsat.OPEN))
    return model, xs, lin


WITNESS_CORNERS = 64       # corners of the box tried as integer points before a solver is asked


def _witness(key: tuple, box: dict) -> bool:
    """Whether the box's centre or one of its first ``WITNESS_CORNERS``
    corners is an integer point of ``key``'s system: a proof of feasibility
    that needs no solver.  The systems zero elimination asks about (is a
    bound implied by the others?) are mostly satisfied by such a point, so
    most builds neither load CP-SAT nor solve a model."""
    names, ranges = list(box), dict(key[0])
    ineqs = _key_inequalities(key)
    centre = tuple((box[v][0] + box[v][1]) // 2 for v in names)
    corners = itertools.islice(itertools.product(*(box[v] for v in names)), WITNESS_CORNERS)
    for point in itertools.chain([centre], corners):
        x = dict(zip(names, point))
        if (all(lo <= x[v] <= hi for v, (lo, hi) in ranges.items())
                and all(e.evaluate(x) >= 0 for e in ineqs)):
            return True
    return False


@lru_cache(maxsize=CACHE_SIZE)
def _feasible(key: tuple) -> bool:
    box = _box(key)
    if box is None:
        return False
    if _witness(key, box):
        return True
    result = _model(key, box)[0].solve(seconds=TIME_LIMIT_SECONDS)
    return result.status != "infeasible"  # a timeout counts as feasible (safe side)


@lru_cache(maxsize=CACHE_SIZE)
def _numeric_bounds(expr: LinearExpr, key: tuple) -> tuple[int, int] | None:
    box = _box_with(key, expr.vars)
    if box is None:
        return None
    if expr.is_const:
        return (expr.const, expr.const) if _feasible(key) else None
    interval = _interval(expr, box)
    result = []
    for maximize in (False, True):
        model, xs, lin = _model(key, box)
        solved = model.solve(lin(expr), maximize, TIME_LIMIT_SECONDS)
        if solved.status == "infeasible":
            return None
        if solved.status == "optimal":
            result.append(expr.evaluate({v: x.evaluate(solved.values) for v, x in xs.items()}))
        elif solved.status == "feasible":  # timeout: the proven bound is still valid
            result.append(math.ceil(solved.bound) if maximize else math.floor(solved.bound))
        else:
            result.append(interval[maximize])
    return result[0], result[1]


def numeric_bounds(expr, system: LinearSystem) -> tuple[int, int] | None:
    """``(min, max)`` of ``expr`` over the integer points of ``system``; None if it has none.

    Every variable must be bounded by the system's ranges or constraints;
    ValueError names one that is not.
    """
    return _numeric_bounds(as_linear(expr, "expression"), _canonical(system))


def is_feasible(system: LinearSystem) -> bool:
    """Whether ``system`` has an integer point (ValueError for an unbounded variable)."""
    return _feasible(_canonical(system))


def is_implied(ineq, system: LinearSystem) -> bool:
    """Whether ``ineq >= 0`` holds at every integer point of ``system``.

    Decided as infeasibility of ``system`` plus ``ineq <= -1``; a solver
    timeout answers False (not proven). ValueError for an unbounded variable.
    """
    ineq = normalize_inequality(as_linear(ineq, "inequality"))
    key = _canonical(system)
    box = _box_with(key, ineq.vars)
    if box is None or _interval(ineq, box)[0] >= 0:
        return True
    ranges, eqs, ineqs = key
    return not _feasible((ranges, eqs, ineqs | {normalize_inequality(-ineq - 1)}))


def clear_caches() -> None:
    """Forget all cached query answers."""
    for fn in (_box, _feasible, _numeric_bounds):
        fn.cache_clear()
