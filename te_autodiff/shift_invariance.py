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

``b_c`` and ``a`` may depend on anything, ``a`` itself included: only the
two cancelling edges are cut, every other route is differentiated as
written.
"""
from __future__ import annotations

from .expr import BinOp, Load, MatchSum, Reduce, ScanState, Unary
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


def _shifted_sum(r):
    """The node ``b_c - a_R`` when ``r`` is ``sum_c exp(b_c - a_R)``; None otherwise."""
    body = lifted(r).body
    if not (isinstance(body, Reduce) and body.op == "sum" and isinstance(body.body, Unary)
            and body.body.op == "exp" and isinstance(body.body.a, BinOp) and body.body.a.op == "sub"):
        return None
    return body.body.a


def cut_edges(tensors, users) -> dict:
    """``{tensor: {(node, k), ...}}``: the edges (``node``'s child ``k``) of
    each tensor's element body along which reverse mode sends nothing, for
    the sums of ``tensors`` with the shape above; ``users`` maps a tensor to
    the tensors reading it."""
    cuts = {}
    for t in tensors:
        body = None if t.is_placeholder else _element(t)
        if body is None:
            continue
        parents = None
        for node in topo_order([body]):
            if not (isinstance(node, BinOp) and node.op == "add"):
                continue
            for k in (0, 1):
                log, a = children(node)[1 - k], children(node)[k]
                if not (isinstance(log, Unary) and log.op == "log" and isinstance(log.a, Load)):
                    continue
                r = log.a.tensor
                d = None if r.is_placeholder or set(users.get(r, ())) != {t} else _shifted_sum(r)
                if d is None or substitute(d.b, dict(zip(lifted(r).axes, log.a.indices))) is not a:
                    continue
                parents = _parents(body) if parents is None else parents
                reads = [x for x in parents if isinstance(x, Load) and x.tensor is r]
                if reads != [log.a] or parents[log.a] != [log] or parents[log] != [node]:
                    continue
                cuts.setdefault(t, set()).add((node, k))
                cuts.setdefault(r, set()).add((d, 1))
    return cuts
