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

from .expr import Expr, all_, const, equal, reduce, select, var


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
    """The sum of ``term`` over its whole domain, zeros included."""
    hit = all_(*(equal(v, ix) for v, ix in zip(term.eq_vars, term.indices)))
    return reduce("sum", select(hit, term.value, const(0, term.dtype)), term.sum_axes, term.sum_doms)


def fresh_copy(axes: tuple, prefix: str = "") -> dict:
    """New variables with the same names and ranges, to rebind ``axes`` in a new scope."""
    return {a: var(prefix + a.name, a.dom) for a in axes}
