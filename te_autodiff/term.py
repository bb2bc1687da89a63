"""One summand of an adjoint or Jacobian: the interface of zero elimination.

Differentiating ``T[i] = body(i, k)`` (``k`` the axes of a top-level
reduction) with respect to one read ``X[idx(i, k)]`` gives, for the element
``X[j]`` of the result, the sum

    Σ_{s in sum domain}  value(s, o) · [j_0 == idx_0(s, o)] · ... · [j_m == idx_m(s, o)]

where ``s`` are the summation variables (``i`` and ``k`` for a gradient,
only ``k`` for a Jacobian) and ``o`` the outer variables (``j``, plus ``i``
for a Jacobian).  :func:`naive` writes that sum literally, as the Jacobian
composition of the textbook: correct, and the oracle that zero elimination
(``zero_elim.gather``) is tested against.
"""
from __future__ import annotations

from dataclasses import dataclass

from .expr import BinOp, Cast, Const, Expr, Load, Select, Var, all_, const, equal, is_const, reduce, select, var
from .visit import conjuncts, free_vars, topo_order


@dataclass(frozen=True)
class Term:
    """``Σ_{sum_axes in sum_doms} value · [eq_vars == indices]`` (see module doc)."""

    eq_vars: tuple      # the result's variables equated to the read's indices (j)
    indices: tuple      # the read's index expressions, one per eq_var
    value: Expr         # head · ∂body/∂read, over summation and outer variables
    sum_axes: tuple     # summation variables (fresh for this term)
    sum_doms: tuple     # (lo, extent) of each summation variable

    @property
    def dtype(self) -> str:
        return self.value.dtype


def naive(term: Term) -> Expr:
    """The sum of ``term`` over its whole domain, zeros included.  A guarded
    value's condition is tested before the indices, which may read data
    defined only where it holds.  The summation variables from the first
    whose range reads data (``q in 0 .. I[s]``) on are summed inside the
    conditions on the variables before them, which may be what keeps that
    read in range (``s < 3`` where ``s`` spans 5 and ``I`` has 3 elements)."""
    hit = [equal(v, ix) for v, ix in zip(term.eq_vars, term.indices)]
    if isinstance(term.value, Select) and is_const(term.value.b, 0):
        hit = conjuncts([term.value.cond]) + hit
    zero = const(0, term.dtype)
    k = next((n for n, dom in enumerate(term.sum_doms) if _reads_data(dom)), len(term.sum_doms))
    inner = set(term.sum_axes[k:])
    before = [c for c in hit if not free_vars(c) & inner]
    within = [c for c in hit if free_vars(c) & inner]
    body = select(all_(*within), term.value, zero) if within else term.value
    body = reduce("sum", body, term.sum_axes[k:], term.sum_doms[k:])
    body = select(all_(*before), body, zero) if before else body
    return reduce("sum", body, term.sum_axes[:k], term.sum_doms[:k])


def _reads_data(exprs) -> bool:
    """Whether any of ``exprs`` reads a tensor."""
    return any(isinstance(node, Load) for node in topo_order(list(exprs)))


def read_guards(indices, kids=None) -> list:
    """Conditions keeping in range the tensor reads inside ``indices`` (a key
    read from data, ``J[k - 1]``) whose indices may leave their tensor over
    their variables' ranges, inner reads first.  A term's summand is zero
    where they fail (the program never read there); as its guard they keep
    zero elimination and the naive sum from reading there.  ``kids`` (as for
    ``topo_order``) limits the reads looked at."""
    conds = []
    for node in topo_order(list(indices), kids):
        if isinstance(node, Load):
            for e, n in zip(node.indices, node.tensor.shape):
                lo, hi = _range(e)
                if lo is None or lo < 0:
                    conds.append(e >= 0)
                if hi is None or hi >= n:
                    conds.append(e < n)
    return conds


def _range(e) -> tuple:
    """``(lo, hi)`` of an integer index expression over its variables' ranges (None: unknown)."""
    if isinstance(e, Const):
        return e.value, e.value
    if isinstance(e, Var):
        return (None, None) if e.dom is None else (e.dom[0], e.dom[0] + e.dom[1] - 1)
    if isinstance(e, Cast):
        return _range(e.a)
    if not isinstance(e, BinOp):
        return None, None
    (a0, a1), (b0, b1) = _range(e.a), _range(e.b)
    if None in (a0, a1, b0, b1):
        return None, None
    if e.op == "add":
        return a0 + b0, a1 + b1
    if e.op == "sub":
        return a0 - b1, a1 - b0
    if e.op == "mul":
        corners = (a0 * b0, a0 * b1, a1 * b0, a1 * b1)
        return min(corners), max(corners)
    if e.op in ("floordiv", "mod") and b0 == b1 and b0 > 0:
        return (a0 // b0, a1 // b0) if e.op == "floordiv" else (0, b0 - 1)
    return None, None


def fresh_copy(axes: tuple, prefix: str = "") -> dict:
    """New variables with the same names and ranges, to rebind ``axes`` in a new scope."""
    return {a: var(prefix + a.name, a.dom) for a in axes}
