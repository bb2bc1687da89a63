"""Shift invariance of log-sum-exp: ``a + log(sum_c exp(b_c - a))`` equals
``log(sum_c exp(b_c))`` whatever ``a`` is, so its derivative does not reach
``a`` through the shift.

Written with the max trick (``a = max_c b_c``, as every stable softmax,
cross-entropy or mixture likelihood is), reverse mode sends ``a`` the
adjoint ``g`` through the sum and ``-g / S * S`` through the exponentials
(``S`` the sum): zero in exact arithmetic, a rounding residue in floating
point, whose route on to the inputs (a max's derivative) costs a pass of
its own finding each row's argmax.  Both routes are cut where a formula has
that shape: in the tensor ``T`` reading the sum ``R``, the edge from ``a +
log(R[idx])`` to ``a``; in ``R``'s reduction, the edge from ``b_c - a`` to
``a``.  For every adjoint ``g`` of the sum node the two carry ``g`` and
``-g`` (``R``'s adjoint is ``g / S``, its reduction gives ``a`` that times
``-S``), so the cut is exact when:

* ``R`` is a sum of ``exp(b_c - a_R)`` and no other tensor reads it;
* in ``T``, ``R`` is read only as the argument of that ``log``, and the
  ``log`` is used only in that sum;
* ``a_R`` at ``R[idx]`` is ``a``, the same expression (so it does not
  vary along the sum: ``a`` is outside it).

The normalised exponential (a softmax) is shift invariant too:
``exp(b_j - a) / sum_c exp(b_c - a)`` does not depend on ``a``.  Reverse
mode sends ``a`` ``-E_j (g_j / Z + g_Z)`` from each exponential ``E_j``
(``g_j`` its ratio's adjoint, ``Z`` the sum) with ``g_Z = -sum_j g_j E_j /
Z^2``: again zero up to rounding, and again a max's argmax pass.  In a
tensor ``T`` reading ``E[idx] / Z[idx']`` (or ``exp(b - a) / Z[idx']``)
with ``Z`` a sum of ``E`` (of ``exp(b_c - a_Z)``), the edges from each ``b
- a`` to ``a`` are cut when:

* ``Z`` is read by ``T`` alone, once, as that denominator; ``E`` (a tensor
  ``exp(b - a)``) by ``Z`` and ``T`` alone, in ``T`` once, as that
  numerator (an inline ``exp(b - a)`` numerator used only there);
* the shift at the numerator's index is the shift at ``Z[idx']``, the same
  expression (``a`` does not vary along the sum).

The cancellation holds whichever elements of ``E`` the ratios read and the
sum adds (a causal mask, ``cond ? E[i, c] : 0``): ``g_Z`` gathers exactly
the ratios' terms, and the exponentials the sum adds make ``Z``.

``b_c`` and ``a`` may depend on anything, ``a`` itself included: only the
cancelling edges are cut, every other route is differentiated as written.
"""
from __future__ import annotations

from functools import cache, partial

from .expr import BinOp, Load, MatchSum, Reduce, ScanState, Select, Unary, is_const
from .lift import lifted
from .visit import children, substitute, topo_order


def _element(t):
    """The reduction-free body of ``t``'s normal form (a top-level reduction's
    body), the nodes reverse mode visits (``gradient.tensor_terms``); None for
    a sum over matches or a scan's state, differentiated from other nodes."""
    body = lifted(t).body
    if isinstance(body, (MatchSum, ScanState)):
        return None
    return body.body if isinstance(body, Reduce) else body


def _parents(root) -> dict:
    """``{node: [parent, ...]}`` over the DAG ``root`` (a parent once per edge)."""
    out = {}
    for node in topo_order([root]):
        for c in children(node):
            out.setdefault(c, []).append(node)
    return out


def _exp_shift(node):
    """The node ``b - a`` when ``node`` is ``exp(b - a)``; None otherwise."""
    if isinstance(node, Unary) and node.op == "exp" and isinstance(node.a, BinOp) and node.a.op == "sub":
        return node.a
    return None


def _shifted_sum(r):
    """The node ``b_c - a_R`` when ``r`` is ``sum_c exp(b_c - a_R)``; None otherwise."""
    body = lifted(r).body
    return _exp_shift(body.body) if isinstance(body, Reduce) and body.op == "sum" else None


def _shift_at(d, t, indices):
    """The shift ``a`` of ``d`` (``b - a`` in ``t``'s body) at ``t[indices]``."""
    return substitute(d.b, dict(zip(lifted(t).axes, indices)))


def _logsumexp(t, body, parents, users):
    """``(tensor, edge)`` cuts for each ``a + log(R[idx])`` in ``t``'s ``body``."""
    for node in topo_order([body]):
        if not (isinstance(node, BinOp) and node.op == "add"):
            continue
        for k in (0, 1):
            log, a = children(node)[1 - k], children(node)[k]
            if not (isinstance(log, Unary) and log.op == "log" and isinstance(log.a, Load)):
                continue
            r = log.a.tensor
            d = None if r.is_placeholder or set(users.get(r, ())) != {t} else _shifted_sum(r)
            if d is None or _shift_at(d, r, log.a.indices) is not a:
                continue
            if _reads(parents(), r) != [log.a] or parents()[log.a] != [log] or parents()[log] != [node]:
                continue
            yield t, (node, k)
            yield r, (d, 1)


def _normalised(t, body, parents, users):
    """``(tensor, edge)`` cuts for each ``E[idx] / Z[idx']`` or ``exp(b - a) /
    Z[idx']`` in ``t``'s ``body``."""
    for node in topo_order([body]):
        if not (isinstance(node, BinOp) and node.op == "div" and isinstance(node.b, Load)):
            continue
        z, num = node.b.tensor, node.a
        zbody = None if z.is_placeholder or set(users.get(z, ())) != {t} else lifted(z).body
        if not (isinstance(zbody, Reduce) and zbody.op == "sum") or _reads(parents(), z) != [node.b] \
                or parents()[node.b] != [node] or parents().get(num) != [node]:
            continue
        term = _summand(zbody.body)
        if isinstance(num, Load) and isinstance(term, Load) and num.tensor is term.tensor:
            e = num.tensor
            d = None if e.is_placeholder or set(users.get(e, ())) != {t, z} else _exp_shift(lifted(e).body)
            if d is None or _reads(parents(), e) != [num]:
                continue
            at_sum = substitute(_shift_at(d, e, term.indices), dict(zip(lifted(z).axes, node.b.indices)))
            if _shift_at(d, e, num.indices) is at_sum:
                yield e, (d, 1)
        else:
            dn, dz = _exp_shift(num), _exp_shift(term)
            if dn is None or dz is None or parents().get(dn) != [num] or _shift_at(dz, z, node.b.indices) is not dn.b:
                continue
            yield t, (dn, 1)
            yield z, (dz, 1)


def _summand(term):
    """The term a sum adds where it adds anything: ``x`` of ``cond ? x : 0``
    (a masked sum, over a subset of the axis), else ``term``."""
    return term.a if isinstance(term, Select) and is_const(term.b, 0) else term


def _reads(parents: dict, r) -> list:
    """The loads of tensor ``r`` among the nodes of ``parents``."""
    return [x for x in parents if isinstance(x, Load) and x.tensor is r]


def cut_edges(tensors, users) -> dict:
    """``{tensor: {(node, k), ...}}``: the edges (``node``'s child ``k``) of
    each tensor's element body along which reverse mode sends nothing, for
    the log-sum-exps and normalised exponentials of ``tensors`` with the
    shapes above; ``users`` maps a tensor to the tensors reading it."""
    cuts = {}
    for t in tensors:
        body = None if t.is_placeholder else _element(t)
        if body is None:
            continue
        parents = cache(partial(_parents, body))      # walked only when a pattern asks
        for pattern in (_logsumexp, _normalised):
            for tensor, edge in pattern(t, body, parents, users):
                cuts.setdefault(tensor, set()).add(edge)
    return cuts
