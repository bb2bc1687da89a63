"""Smith normal form and the integer solver for systems of linear equalities.

``solve_equations`` finds every integer solution of ``A v = b(p)`` for the
unknowns ``v`` as an affine function of the parameters ``p`` and of fresh
free variables, the form zero elimination needs to turn ``sum_v [j == idx(v)]``
into a gather.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from numbers import Integral
from typing import Hashable, Iterable, Mapping

from .linear import LinearExpr, Transform, Var, as_linear

__all__ = ["smith_normal_form", "solve_equations", "Solution"]


def _int_matrix(A) -> list[list[int]]:
    rows = A.tolist() if hasattr(A, "tolist") else [list(r) for r in A]      # a sympy or numpy matrix
    width = len(rows[0]) if rows else 0
    out = []
    for r in rows:
        if len(r) != width:
            raise ValueError(f"matrix rows have different lengths ({len(r)} vs {width})")
        for x in r:
            if not (isinstance(x, Integral) or getattr(x, "is_Integer", False)) or isinstance(x, bool):
                raise TypeError(f"matrix entries must be integers, got {x!r}")
        out.append([int(x) for x in r])
    return out


def _identity(n: int) -> list[list[int]]:
    return [[int(i == j) for j in range(n)] for i in range(n)]


def _unimodular_inverse(V: list[list[int]]) -> list[list[int]]:
    """The inverse of a unimodular integer matrix (integral), by Gauss-Jordan
    elimination over the rationals."""
    n = len(V)
    M = [[Fraction(x) for x in row] + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(V)]
    for c in range(n):
        p = next(r for r in range(c, n) if M[r][c])
        M[c], M[p] = M[p], M[c]
        M[c] = [x / M[c][c] for x in M[c]]
        for r in range(n):
            if r != c and M[r][c]:
                f = M[r][c]
                M[r] = [x - f * y for x, y in zip(M[r], M[c])]
    inverse = [row[n:] for row in M]
    if any(x.denominator != 1 for row in inverse for x in row):
        raise ValueError("matrix is not unimodular")
    return [[x.numerator for x in row] for row in inverse]


def smith_normal_form(A) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """Return ``(U, S, V)`` with ``U * A * V == S`` as lists of lists of ``int``.

    ``A`` is an m x n integer matrix (nested lists, a numpy array or a sympy Matrix). ``U``
    (m x m) and ``V`` (n x n) are unimodular; ``S`` is diagonal with
    ``S[0][0] | S[1][1] | ...``, all nonnegative, zeros last.

    Classical elimination: bring the smallest nonzero entry to the pivot,
    reduce its row and column by integer division, and repeat while a
    remainder is left; a remaining entry not divisible by the pivot is added
    into the pivot row, which lowers the pivot at the next round.
    """
    S = _int_matrix(A)
    m = len(S)
    n = len(S[0]) if m else 0
    U, V = _identity(m), _identity(n)

    # Row operations act on S and U (S = E U A V), column operations on S and V.
    def swap_rows(a, b):
        S[a], S[b] = S[b], S[a]
        U[a], U[b] = U[b], U[a]

    def swap_cols(a, b):
        for M in (S, V):
            for row in M:
                row[a], row[b] = row[b], row[a]

    def add_row(dst, src, k):  # row_dst += k * row_src
        for M in (S, U):
            M[dst] = [x + k * y for x, y in zip(M[dst], M[src])]

    def add_col(dst, src, k):  # col_dst += k * col_src
        for M in (S, V):
            for row in M:
                row[dst] += k * row[src]

    for t in range(min(m, n)):
        entries = [(abs(S[i][j]), i, j) for i in range(t, m) for j in range(t, n) if S[i][j]]
        if not entries:
            break
        _, i, j = min(entries)
        swap_rows(t, i)
        swap_cols(t, j)
        while True:
            p = S[t][t]
            for i in range(t + 1, m):
                if S[i][t]:
                    add_row(i, t, -(S[i][t] // p))
            for j in range(t + 1, n):
                if S[t][j]:
                    add_col(j, t, -(S[t][j] // p))
            # Remainders (|r| < |p|) left in row/column t become the new pivot.
            rest = [(abs(S[i][t]), "row", i) for i in range(t + 1, m) if S[i][t]]
            rest += [(abs(S[t][j]), "col", j) for j in range(t + 1, n) if S[t][j]]
            if rest:
                _, kind, k = min(rest)
                (swap_rows if kind == "row" else swap_cols)(t, k)
                continue
            bad = next(((i, j) for i in range(t + 1, m) for j in range(t + 1, n) if S[i][j] % p), None)
            if bad is None:
                break
            add_row(t, bad[0], 1)
        if S[t][t] < 0:
            S[t], U[t] = [-x for x in S[t]], [-x for x in U[t]]
    return U, S, V


@dataclass
class Solution:
    """All integer solutions of a system of equalities, parametrised.

    For parameter values satisfying ``conditions`` (each ``== 0``) and every
    quotient's divisibility (``numerator % divisor == 0``, then
    ``qvar = numerator // divisor``), the solutions are exactly
    ``{unknown: values[unknown]}`` for all integer values of the ``free``
    variables. ``inverse`` gives each free and quotient variable as an integer
    expression of the unknowns (and parameters), so the change of variables is
    a bijection; ``transform()`` packages both directions.
    """

    infeasible: bool
    unknowns: tuple
    params: tuple
    values: dict = field(default_factory=dict)
    quotients: list = field(default_factory=list)
    free: list = field(default_factory=list)
    conditions: list = field(default_factory=list)
    inverse: dict = field(default_factory=dict)

    def transform(self) -> Transform:
        """Old variables (unknowns) to new ones (free and quotient variables)."""
        if self.infeasible:
            raise ValueError("an infeasible system has no change of variables")
        new_vars = list(self.free) + [q for q, _, _ in self.quotients]
        return Transform(self.values, self.inverse, new_vars)

    def evaluate(self, env: Mapping[Hashable, int]) -> dict | None:
        """The unknowns' values for ``env`` (parameters and free variables),
        or None where the conditions or a divisibility fail."""
        if self.infeasible or any(c.evaluate(env) for c in self.conditions):
            return None
        env = dict(env)
        for q, num, d in self.quotients:
            value = num.evaluate(env)
            if value % d:
                return None
            env[q] = value // d
        return {u: e.evaluate(env) for u, e in self.values.items()}

    def __str__(self) -> str:
        if self.infeasible:
            return "infeasible"
        lines = [f"{u} = {e}" for u, e in self.values.items()]
        for q, num, d in self.quotients:
            text = str(num) if len(num.vars) == 1 and not num.const else f"({num})"
            lines.append(f"{q} = {text} / {d}")
        if self.free:
            lines.append("free: " + ", ".join(map(str, self.free)))
        lines += [f"{c} == 0" for c in self.conditions]
        return "\n".join(lines)


def _positive_lead(e: LinearExpr) -> tuple[LinearExpr, int]:
    """``(s * e, s)`` with ``s = ±1`` so that the first coefficient is positive."""
    return (-e, -1) if e.vars and e.coeff(e.vars[0]) < 0 else (e, 1)


class _Infeasible(Exception):
    """Raised inside the solver when no integer solution exists for any parameters."""


def _add_condition(conditions: list, expr: LinearExpr) -> None:
    """Record ``expr == 0`` on the parameters, normalised; raise _Infeasible if never true."""
    if expr.is_const:
        if expr.const:
            raise _Infeasible
        return
    g = expr.gcd_of_coeffs()
    if expr.const % g:  # g | every term, so expr is never 0
        raise _Infeasible
    expr, _ = _positive_lead(expr.exact_div(g))
    if expr not in conditions:
        conditions.append(expr)


def solve_equations(equalities: Iterable, unknowns: Iterable[Hashable]) -> Solution:
    """Solve ``e == 0`` for every ``e`` in ``equalities`` over the integers.

    Variables of the equalities that are not in ``unknowns`` are parameters.
    First, equations with a ``±1`` coefficient are solved for that unknown
    directly (fewest unknowns first, so ``j == i`` gives ``i = j``; the last
    such unknown in ``unknowns`` is eliminated, the others stay free under
    their own names). What is left, ``A v = b(p)`` with no unit
    coefficient, goes through the Smith normal form ``U A V = S``:
    with ``v = V y`` (so ``y = V^-1 v``) it becomes ``S y = U b``, i.e.
    ``s_i y_i = (U b)_i`` for ``i < rank``, consistency ``(U b)_i = 0``
    below, and ``y_i`` free for the zero columns.
    """
    eqs = [as_linear(e, "equality") for e in equalities]
    unknowns = tuple(unknowns)
    if len(set(unknowns)) != len(unknowns):
        raise ValueError(f"unknowns listed twice in {[str(u) for u in unknowns]}")
    unknown_set = set(unknowns)
    seen = {}
    for e in eqs:
        for v in e.vars:
            if v not in unknown_set:
                seen.setdefault(v, None)
    params = tuple(seen)
    try:
        return _solve(eqs, unknowns, params)
    except _Infeasible:
        return Solution(infeasible=True, unknowns=unknowns, params=params)


def _solve(eqs: list[LinearExpr], unknowns: tuple, params: tuple) -> Solution:
    rank_of = {u: k for k, u in enumerate(unknowns)}
    conditions: list[LinearExpr] = []
    solved: dict = {}  # pivot unknown -> expression over params and unsolved unknowns

    # Phase 1: a u + r == 0 with a = ±1 gives u = -a r, an integer for every r.
    pending = list(eqs)
    while True:
        still = []
        for e in pending:
            if any(v in rank_of for v in e.vars):
                still.append(e)
            else:
                _add_condition(conditions, e)
        pending = still
        best = None
        for idx, e in enumerate(pending):
            units = [v for v in e.vars if v in rank_of and abs(e.coeff(v)) == 1]
            if units:
                count = sum(v in rank_of for v in e.vars)
                if best is None or count < best[0]:
                    best = (count, idx, max(units, key=rank_of.get))
        if best is None:
            break
        _, idx, u = best
        e = pending.pop(idx)
        a = e.coeff(u)
        value = (e - LinearExpr.var(u, a)) * -a
        sub = {u: value}
        solved = {w: x.substitute(sub) for w, x in solved.items()}
        solved[u] = value
        pending = [x.substitute(sub) for x in pending]

    values: dict = {}
    inverse: dict = {}
    free: list = []
    quotients: list = []

    # Phase 2: remaining equations A v + c(p) == 0, i.e. A v = b with b = -c(p).
    rest = [u for u in unknowns if u not in solved and any(e.coeff(u) for e in pending)]
    if pending:
        A = [[e.coeff(u) for u in rest] for e in pending]
        b = [-e.substitute({u: 0 for u in rest}) for e in pending]
        U, S, V = smith_normal_form(A)
        V_inv = _unimodular_inverse(V)
        Ub = [sum((b[k] * U[i][k] for k in range(len(b))), LinearExpr.const(0))
              for i in range(len(b))]
        rank = sum(1 for i in range(min(len(S), len(rest))) if S[i][i])
        for i in range(rank, len(Ub)):
            _add_condition(conditions, Ub[i])  # 0 * y_i = (U b)_i
        y = []
        for i, old_expr in enumerate(_row_exprs(V_inv, rest)):
            if i < rank:
                y.append(_divide(Ub[i], S[i][i], old_expr, quotients, inverse))
            else:
                owner = next((u for k, u in enumerate(rest)
                              if V[k] == [int(c == i) for c in range(len(rest))]), None)
                f = Var(str(owner) if owner is not None else f"f{len(free)}")
                free.append(f)
                inverse[f] = old_expr
                y.append(LinearExpr.var(f))
        for k, u in enumerate(rest):  # v = V y
            values[u] = sum((y[i] * V[k][i] for i in range(len(rest))), LinearExpr.const(0))

    for u in unknowns:
        if u not in solved and u not in values:
            f = Var(str(u))
            free.append(f)
            inverse[f] = LinearExpr.var(u)
            values[u] = LinearExpr.var(f)
    ordered = {u: (solved[u].substitute(values) if u in solved else values[u]) for u in unknowns}
    return Solution(infeasible=False, unknowns=unknowns, params=params, values=ordered,
                    quotients=quotients, free=free, conditions=conditions, inverse=inverse)


def _row_exprs(M: list[list[int]], variables: list) -> list[LinearExpr]:
    """Row ``i`` of ``M`` as the expression ``sum_k M[i][k] * variables[k]``."""
    return [LinearExpr({v: c for v, c in zip(variables, row)}) for row in M]


def _divide(num: LinearExpr, d: int, old_expr: LinearExpr, quotients: list,
            inverse: dict) -> LinearExpr:
    """Solve ``d * y = num`` for integer ``y``; ``old_expr`` is ``y`` over the unknowns."""
    g = math.gcd(*num.terms.values(), num.const, d)
    num, d = num.exact_div(g), d // g
    if d == 1:
        return num
    # Now gcd(coefficients, constant, d) == 1: num is divisible by d for some
    # parameter values only if gcd(coefficients, d) == 1.
    if num.is_const or math.gcd(num.gcd_of_coeffs(), d) > 1:
        raise _Infeasible
    num, sign = _positive_lead(num)
    q = Var(f"q{len(quotients)}")
    quotients.append((q, num, d))
    inverse[q] = old_expr * sign  # y = sign * q
    return LinearExpr.var(q, sign)
