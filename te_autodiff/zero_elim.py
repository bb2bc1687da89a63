"""Zero elimination: rewrite an adjoint term as a sum over its non-zero region.

A :class:`~te_autodiff.term.Term` is ``Σ_{s ∈ D} value(s, o) · [j == idx(s, o)]``.
Most of its summands are zero: for a strided copy exactly one ``s`` matches
each ``j``.  :func:`gather` turns the term into

    select(guards(o), Σ_{z ∈ bounds(o)} value(s(o, z), o), 0)

1. The indices and the value's guard conditions are made linear in integer
   variables; ``x // c`` and ``x % c`` get a quotient variable ``q`` with
   ``0 <= x - c·q <= c - 1`` (flatten, pooling, strides).
2. The equalities ``j - idx(s) = 0`` (and equality guards) are solved over
   the integers by ``arith.solve_equations`` (Smith normal form): each
   summation variable becomes an affine function of the outer variables and of
   new free variables ``z``, under divisibility conditions.
3. The domain of ``s`` and the linear guards, rewritten in ``z``, give each
   ``z`` affine bounds by Fourier–Motzkin (``arith.fourier_motzkin``), with
   constraints implied by the outer variables' ranges pruned by OR-tools.
4. Equalities the solver cannot use because they read tensor data are
   solved by substitution or, for ``v == I[n]`` with ``n`` summed, by an
   inverse index computed at run time (``inverse_index.py``).
5. Whatever is left on the outer variables alone becomes the outer guard;
   other conditions the solver cannot use stay as selects.

Every step preserves the value exactly; ``term.naive`` is the oracle.
"""
from __future__ import annotations

import logging

from arith import LinearExpr, LinearSystem, fourier_motzkin, is_feasible, is_implied, solve_equations
from arith import Var as ArithVar

from . import dtype as dt
from .expr import (BinOp, Cast, Cmp, Const, Logic, Reduce, Select, Unary, Var, all_, compare, const,
                   floordiv, is_const, logic_not, maximum, minimum, mod, mul, neg, reduce, select, var)
from .inverse_index import solve_data_equalities
from .pretty import expr_str
from .term import Term, naive, read_guards
from .visit import children, conjuncts, free_vars, rebuild, substitute

log = logging.getLogger("te_autodiff.zero_elim")


def gather(term: Term):
    """``term`` summed over its non-zero region only (equal to ``naive(term)``)."""
    parts = _additive_parts(term.value)
    if len(parts) > 1 and any(_split(p)[0] for _, p in parts):
        return _rejoined([(sign, _Gather(Term(term.eq_vars, term.indices, p, term.sum_axes, term.sum_doms)).run())
                          for sign, p in parts], term.dtype)
    return _Gather(term).run()


def _rejoined(pieces, dtype):
    """The signed ``pieces`` added up, those that are sums over one domain
    (``Σ body`` or ``select(c, Σ body, 0)``, ``c`` on outer variables) as one
    sum again: where gathering a part apart narrowed none of its sums (a
    guard on the result's own variables), its own sum would only be another
    stage reading the same data."""
    groups, total = {}, const(0, dtype)
    for sign, x in pieces:
        r = x.a if isinstance(x, Select) and is_const(x.b, 0) else x
        if isinstance(r, Reduce) and r.op == "sum":
            groups.setdefault(r.doms, []).append((sign, x, r))
        else:
            total = total + x if sign > 0 else total - x
    for doms, group in groups.items():
        if len(group) == 1:
            (sign, x, _), = group
            total = total + x if sign > 0 else total - x
            continue
        axes, body = group[0][2].axes, const(0, dtype)
        for sign, x, r in group:
            own = substitute(r.body, dict(zip(r.axes, axes)))
            own = select(x.cond, own, const(0, dtype)) if x is not r else own
            body = body + own if sign > 0 else body - own
        total = total + reduce("sum", body, axes, doms)
    return total


_MAX_PARTS = 8


def _additive_parts(e):
    """``e`` as signed summands ``[(±1, part)]`` of its top-level + and -,
    and of the sums a product multiplies when one of their summands is
    guarded (``k · (select(c, a, 0) + b)`` gives ``k · select(c, a, 0)`` and
    ``k · b``): reverse mode takes the factor two contributions share out of
    their sum (``derivative.factored_sum``), which hides their guards from
    :func:`_split`; summed as one, the term would run over its whole domain,
    where a non-finite factor times a guard's 0 is NaN.  At most
    ``_MAX_PARTS``: a shared sum is not unfolded into a tree."""
    parts, stack = [], [(1, e)]
    while stack:
        sign, x = stack.pop()
        room = len(parts) + len(stack) < _MAX_PARTS
        if room and isinstance(x, BinOp) and x.op in ("add", "sub"):
            stack += [(sign, x.a), (-sign if x.op == "sub" else sign, x.b)]
        elif room and _guarded_sum_factor(x) is not None:
            s = _guarded_sum_factor(x)
            times = (lambda y: mul(x.a, y)) if s is x.b else (lambda y: mul(y, x.b))
            stack += [(sign, times(s.a)), (-sign if s.op == "sub" else sign, times(s.b))]
        else:
            parts.append((sign, x))
    return parts


def _guarded_sum_factor(x):
    """The operand of the product ``x`` that is a sum with a guarded summand, or None."""
    if not (isinstance(x, BinOp) and x.op == "mul" and x.a.dtype == x.b.dtype == x.dtype):
        return None
    for s in (x.b, x.a):
        if isinstance(s, BinOp) and s.op in ("add", "sub") and (_split(s.a)[0] or _split(s.b)[0]):
            return s
    return None


def _split(e, memo=None):
    """``e == select(all(conds), core, 0)``: returns ``(conds, core)``, memoised
    per node so shared products are visited once."""
    memo = {} if memo is None else memo
    if e in memo:
        return memo[e]
    conds, core = [], e
    if isinstance(e, Select) and (is_const(e.b, 0) or is_const(e.a, 0)):
        taken, cond = (e.a, e.cond) if is_const(e.b, 0) else (e.b, logic_not(e.cond))
        inner, core = _split(taken, memo)
        conds = [cond] + inner
    elif isinstance(e, BinOp) and e.op == "mul":
        ca, a = _split(e.a, memo)
        cb, b = _split(e.b, memo)
        if ca or cb:
            conds, core = ca + [c for c in cb if c not in ca], a * b
    elif (isinstance(e, BinOp) and e.op == "div") or isinstance(e, (Unary, Cast)) and _linear_unary(e):
        ca, a = _split(e.a, memo)
        if ca:
            conds, core = ca, rebuild(e, [a] + list(children(e))[1:])
    memo[e] = (conds, core)
    return conds, core


def _linear_unary(e) -> bool:
    """Unary nodes with f(0) == 0 that a zero factor passes through."""
    return isinstance(e, Cast) or e.op == "neg"


_FLIP_SIDES = {"ge": "le", "eq": "eq"}
_FLIP = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}


class _Linear:
    """te index expressions -> ``LinearExpr`` over te variables and quotients."""

    def __init__(self):
        self.quotients = {}     # (dividend LinearExpr, divisor) -> quotient te Var
        self.constraints = []   # 0 <= x - c*q <= c - 1 for each quotient

    def __call__(self, e):
        """The linear form of integer expression ``e``, or None."""
        if not dt.is_int(e.dtype):
            return None
        if isinstance(e, Const):
            return LinearExpr.const(e.value)
        if isinstance(e, Var):
            return LinearExpr.var(e)
        if isinstance(e, Cast):
            return self(e.a)
        if isinstance(e, Unary) and e.op == "neg":
            a = self(e.a)
            return None if a is None else -a
        if not isinstance(e, BinOp):
            return None
        a, b = self(e.a), self(e.b)
        if a is None or b is None:
            return None
        if e.op == "add":
            return a + b
        if e.op == "sub":
            return a - b
        if e.op == "mul":
            if a.is_const:
                return b * a.const
            return a * b.const if b.is_const else None
        if e.op in ("floordiv", "mod") and b.is_const and b.const > 0:
            c = b.const
            q = self._quotient(a, c)
            return LinearExpr.var(q) if e.op == "floordiv" else a - LinearExpr.var(q, c)
        return None

    def _quotient(self, x, c):
        key = (x, c)
        q = self.quotients.get(key)
        if q is None:
            q = var("q")
            self.quotients[key] = q
            # floor division as constraints: c*q <= x <= c*q + c - 1
            self.constraints += [x - LinearExpr.var(q, c), LinearExpr.var(q, c) + (c - 1) - x]
        return q

    def condition(self, c):
        """``c`` as ``(equalities, inequalities)`` (each ``LinearExpr``), or None."""
        if isinstance(c, Logic) and c.op == "not" and isinstance(c.a, Cmp):
            c = compare(_FLIP[c.a.op], c.a.a, c.a.b)
        if not isinstance(c, Cmp) or c.op == "ne":
            return None
        a, b = self(c.a), self(c.b)
        if a is None or b is None:
            return None
        d = b - a
        return {"lt": ([], [d - 1]), "le": ([], [d]), "gt": ([], [-d - 1]),
                "ge": ([], [-d]), "eq": ([d], [])}[c.op]


class _Gather:
    def __init__(self, term: Term):
        self.term = term
        self.lin = _Linear()
        self.te_of = {}         # arith variable -> te expression

    def run(self):
        t = self.term = _data_ranges_inside(self.term, self.lin)
        zero = const(0, t.dtype)
        eqs, ineqs, residual = [], [], []
        for s, (lo, ext) in zip(t.sum_axes, t.sum_doms):
            lo_l, hi_l = self.lin(lo), self.lin(lo + ext - 1)
            if lo_l is None or hi_l is None:
                if s.dom is None:       # a range neither affine nor fixed: nothing to bound it by
                    log.info("zero elimination keeps a sum over %s in %s as written", s.name,
                             expr_str(lo))
                    return naive(t)
                residual.append(all_(s >= lo, s < lo + ext))
                lo_l, hi_l = (LinearExpr.const(s.dom[0]), LinearExpr.const(s.dom[0] + s.dom[1] - 1))
            ineqs += [LinearExpr.var(s) - lo_l, hi_l - LinearExpr.var(s)]
        data_eqs = []
        for v, ix in zip(t.eq_vars, t.indices):
            ix_l = self.lin(ix)
            if ix_l is None:
                # not affine (e.g. read from a tensor): left to solve_data_equalities
                log.info("zero elimination cannot solve index %s (not affine) over the integers",
                         expr_str(ix))
                data_eqs.append(compare("eq", v, ix))
            else:
                eqs.append(LinearExpr.var(v) - ix_l)
        conds, core = _split(t.value)
        for c in conjuncts(conds):
            form = self.lin.condition(c)
            if form is None:
                residual.append(c)
            else:
                eqs += form[0]
                ineqs += form[1]
        residual += data_eqs        # after the value's guards, which may keep their reads in range
        ineqs += self.lin.constraints
        unknowns = list(t.sum_axes) + list(self.lin.quotients.values())
        sol = solve_equations(eqs, unknowns)
        if sol.infeasible:
            return zero
        self._name_free(sol)
        guards = [self.relation("eq", c) for c in sol.conditions]
        for q, num, d in sol.quotients:
            n_te = self.to_te(num)
            guards.append(compare("eq", mod(n_te, d), 0))
            self.te_of[q] = floordiv(n_te, d)
        ineqs = [e.substitute(sol.values) for e in ineqs]
        context = self._context(ineqs, sol)
        fm = fourier_motzkin(ineqs, sol.free, context=context)
        if fm.infeasible or not all(b.lower and b.upper for b in fm.bounds):
            # every summation variable was bounded, so a variable left without
            # bounds means pruning found the constraints contradictory
            if is_feasible(LinearSystem(ranges=context.ranges, equalities=context.equalities,
                                        inequalities=ineqs)):
                raise RuntimeError(f"zero elimination lost the bounds of a summation variable:\n{fm}")
            return zero
        kept = [r for r in fm.remaining if not is_implied(r, context)]
        if kept and all(v in context.ranges for r in kept for v in r.vars) and not is_feasible(
                LinearSystem(ranges=context.ranges, equalities=context.equalities, inequalities=kept)):
            return zero         # no point of the outer ranges meets the guards (a dead select branch)
        guards += [self.nonneg(r) for r in kept]
        values = {u: self.to_te(e) for u, e in sol.values.items() if isinstance(u, Var)}
        # the points' own conditions first: the residual conditions may read at
        # indices that are in range only where they hold
        conds, residual = [], [substitute(c, values) for c in residual]
        outer = context         # what holds of the variables outside the current one
        axes, doms, point = [], [], {}
        for b in fm.bounds:
            lo = _combine(maximum, [_ceil_div(self.to_te(e), a) for e, a in b.lower])
            hi = _combine(minimum, [floordiv(self.to_te(e), a) for e, a in b.upper])
            z = self.te_of[b.var]
            at, needs_guard = (0, False) if lo is hi else _single_point(b, outer)
            for e, a in b.lower:
                outer = outer.with_inequality(LinearExpr.var(b.var, a) - e)
            for e, a in b.upper:
                outer = outer.with_inequality(e - LinearExpr.var(b.var, a))
            if at is not None:      # one point: substitute instead of summing
                e, c = b.upper[at]
                point[z] = substitute(floordiv(self.to_te(e), c), point)
                if needs_guard and b.lower == ((e, c),):   # ceil(e/c) <= floor(e/c)
                    conds.append(compare("eq", mod(self.to_te(e), c), 0))
                elif needs_guard:
                    conds.append(compare("le", lo, hi))
                continue
            axes.append(z)
            doms.append((substitute(lo, point), substitute(hi - lo + 1, point)))
        axes, doms, core, conds = solve_data_equalities(
            axes, doms, substitute(substitute(core, values), point), [substitute(c, point) for c in conds + residual],
            guards)
        # the conditions on the outer variables alone move out of the sum, except
        # one after a condition on the summed variables whose reads that one may
        # keep in range (``I[o - 1]`` read where the sum's range of ``o`` holds)
        inner = []
        for c in conds:
            (inner if free_vars(c) & set(axes) or inner and read_guards([c]) else guards).append(c)
        # a factor of the summand that reads none of the summed variables moves
        # out of the sum, unless conditions inside the sum guard it (outside, it
        # would read wherever the guards hold, though the sum may be empty there)
        invariant, body = _factor_out(core, set(axes)) if not inner else (None, core)
        if invariant is not None:
            # k·Σ_r f(r) equals Σ_r k·f(r) only where the sum has a term: where it
            # has none (a key no position holds) the sum is 0 and k·0 is NaN for
            # a non-finite k, which the program never multiplied by anything
            nonempty = _nonempty(axes, doms)
            if nonempty is None:
                invariant, body = None, core
            else:
                guards.append(nonempty)
        if inner:
            body = select(all_(*inner), body, zero)
        result = mul(invariant, reduce("sum", body, axes, doms)) if invariant is not None else \
            reduce("sum", body, axes, doms)
        log.debug("gather: %d summed variable(s), %d guard(s), %d inner condition(s)",
                  len(axes), len(guards), len(inner))
        return select(all_(*guards), result, zero) if guards else result

    def _name_free(self, sol):
        """A te variable per free variable, named after the unknown it stands for
        (whose range is then its static box, used when the result is lifted)."""
        stands_for = {}
        for u, e in sol.values.items():
            if isinstance(u, Var) and len(e.terms) == 1 and not e.const and e.coeff(e.vars[0]) == 1:
                stands_for.setdefault(e.vars[0], u)
        for z in sol.free:
            u = stands_for.get(z)
            if isinstance(z, Var):          # the solver kept an unknown as a free variable
                self.te_of[z] = z
            else:
                self.te_of[z] = var(u.name, u.dom) if u is not None else var("z")

    def _context(self, ineqs, sol):
        """What holds of the outer variables wherever the result is used: their
        ranges, and ``num == d·q`` for each quotient (so ``q``'s range follows)."""
        ranges, eqs = {}, []
        exprs = ineqs + [num for _, num, _ in sol.quotients]
        for v in {v for e in exprs for v in e.vars}:
            if isinstance(v, Var) and v.dom is not None and v not in sol.free:
                ranges[v] = (v.dom[0], v.dom[0] + v.dom[1] - 1)
        for q, num, d in sol.quotients:
            if all(v in ranges for v in num.vars):
                lo, hi = _interval(num, ranges)
                ranges[q] = (-(-lo // d), hi // d)
                eqs.append(num - LinearExpr.var(q, d))
        return LinearSystem(ranges=ranges, equalities=eqs)

    def nonneg(self, e: LinearExpr):
        """``e >= 0`` as a readable te condition."""
        return self.relation("ge", e)

    def relation(self, op: str, e: LinearExpr):
        """``e op 0`` as a readable te condition: positive terms left, the rest right."""
        pos = LinearExpr({v: e.coeff(v) for v in e.vars if e.coeff(v) > 0})
        neg = pos - e + e.const                      # e = pos - neg + const
        if pos.is_const:
            return compare(_FLIP_SIDES[op], self.to_te(neg), e.const)
        if neg.is_const:
            return compare(op, self.to_te(pos), -e.const)
        return compare(op, self.to_te(pos + e.const), self.to_te(neg))

    def to_te(self, e: LinearExpr):
        """A ``LinearExpr`` as a te index expression."""
        pos = [v for v in e.vars if e.coeff(v) > 0]
        neg = [v for v in e.vars if e.coeff(v) < 0]
        out = None
        for v in pos + neg:
            term = self.te_of.get(v, v)
            c = e.coeff(v)
            if out is None:
                out = c * term if c != -1 else -term
            else:
                out = out + c * term if c > 0 else out - (-c) * term
        if out is None:
            return const(e.const, dt.INDEX)
        return out + e.const if e.const >= 0 else out - (-e.const)


def _data_ranges_inside(term: Term, lin) -> Term:
    """``term`` with its innermost summation variables whose ranges are not
    affine (the matches of a key, ``r in starts[v] .. starts[v + 1]``), and
    which no index reads and no other range depends on, summed inside the
    value over their own ranges; the guards that do not read them stay
    outside.  The solver has nothing to say about such a variable, and
    summed over its fixed box under a guard it would visit every position
    for every element, not only its matches."""
    axes, doms = list(term.sum_axes), list(term.sum_doms)
    used = set().union(*(free_vars(ix) for ix in term.indices)) if term.indices else set()
    inner = []
    while axes:
        s, (lo, ext) = axes[-1], doms[-1]
        others = set().union(*(free_vars(x) for d in doms[:-1] for x in d)) if doms[:-1] else set()
        if (lin(lo) is not None and lin(lo + ext - 1) is not None) or s in used or s in others:
            break
        inner.insert(0, (axes.pop(), doms.pop()))
    if not inner:
        return term
    names = {s for s, _ in inner}
    conds, core = _split(term.value)
    mine = [c for c in conjuncts(conds) if free_vars(c) & names]
    rest = [c for c in conjuncts(conds) if not free_vars(c) & names]
    zero = const(0, term.dtype)
    summed = reduce("sum", select(all_(*mine), core, zero) if mine else core,
                    [s for s, _ in inner], [d for _, d in inner])
    value = select(all_(*rest), summed, zero) if rest else summed
    return Term(term.eq_vars, term.indices, value, tuple(axes), tuple(doms))


def _single_point(b, outer):
    """Whether the bounds ``max_k ceil(L_k/a_k) <= z <= min_m floor(R_m/c_m)`` of ``b``
    hold at most one integer, ``floor(R/c)``; returns ``(that upper bound's index
    or None, whether the point may be missing so a guard is needed)``.

    A pair ``L/a``, ``R/c`` leaves at most one integer when ``R/c - L/a < 1``,
    i.e. ``a·R - c·L <= a·c - 1`` (mixed-radix splits such as
    ``j = 8c + 4y + z`` give exactly this).  The point ``q = floor(R/c)``
    (``0 <= R - c·q <= c - 1``) is always present when every bound admits it:
    ``a_k·q >= L_k`` and ``c_m·q <= R_m``.
    """
    for n, (e2, c) in enumerate(b.upper):
        if not any(is_implied(LinearExpr.const(a * c - 1) - (e2 * a - e1 * c), outer)
                   for e1, a in b.lower):
            continue
        q = ArithVar("q")
        qv = LinearExpr.var(q, c)
        with_q = outer.with_inequality(e2 - qv).with_inequality(qv + (c - 1) - e2)
        present = (all(is_implied(LinearExpr.var(q, a) - e1, with_q) for e1, a in b.lower)
                   and all(is_implied(r - LinearExpr.var(q, d), with_q) for r, d in b.upper))
        return n, not present
    return None, False


def _interval(e: LinearExpr, ranges) -> tuple:
    """Min and max of ``e`` over the box ``ranges``."""
    lo = hi = e.const
    for v in e.vars:
        c, (a, b) = e.coeff(v), ranges[v]
        lo, hi = lo + min(c * a, c * b), hi + max(c * a, c * b)
    return lo, hi


def _ceil_div(x, a: int):
    """ceil(x / a) for a > 0, as -((-x) // a)."""
    return x if a == 1 else -floordiv(-x, a)


def _combine(fn, items):
    out = items[0]
    for x in items[1:]:
        out = fn(out, x)
    return out


def _nonempty(axes, doms):
    """A condition on the outer variables under which the sum over ``axes`` in
    ``doms`` has a term, or None when a range depends on another summed axis."""
    conds = []
    for _, ext in doms:
        if free_vars(ext) & set(axes):
            return None
        conds.append(compare("gt", ext, 0))
    return all_(*conds)


def _factor_out(body, axes: set):
    """``(k, rest)`` with ``body = k * rest`` and ``k`` the factors of the
    product ``body`` that read none of ``axes`` (None when there is none):
    ``Σ_r k·f(r) = k·Σ_r f(r)`` saves a multiply per term and leaves a sum
    that may equal one the program computes already (the softmax
    denominator in the gradient of its shift), which sharing then reuses."""
    if not dt.is_float(body.dtype) or not axes:
        return None, body
    invariant, rest, negate, stack = [], [], False, [body]
    while stack:
        e = stack.pop()
        if e.dtype != body.dtype:
            return None, body
        if isinstance(e, BinOp) and e.op == "mul":
            stack += [e.b, e.a]
        elif isinstance(e, Unary) and e.op == "neg":
            negate = not negate
            stack.append(e.a)
        else:
            (rest if free_vars(e) & axes else invariant).append(e)
    if not invariant or not rest:
        return None, body
    k = invariant[0]
    for e in invariant[1:]:
        k = mul(k, e)
    f = rest[0]
    for e in rest[1:]:
        f = mul(f, e)
    return (neg(k) if negate else k), f
