"""Sharing across tensors: one computation for every value the program needs twice.

Inside one formula, hash-consing already shares equal sub-expressions (and
``te.pretty`` and the loop IR let-bind them).  Across tensors,
:func:`share` finds compute ops that define the same values — the same body
up to the names of their axes and reduce variables, reading the same tensors —
and keeps one of each, so that a program built from forward outputs and
their gradients computes every common value (a lifted reduction, a
max-pool's argmax, an activation) once.  It also rewrites every tensor into
the lifted normal form (``lift.py``) which both the forward and the
derivative read.  ``lowering/lower.py`` lowers the representatives; which of
them get a buffer and which are recomputed where they are read is its
store-or-recompute rule.
"""
from __future__ import annotations

from .expr import Load, Reduce, ScanState, var
from .graph import tensors_in_order
from .lift import lifted
from .tensor import Tensor
from .visit import rewrite, substitute

_CANON_AXES: dict = {}


def canonical_var(kind: str, n: int, dom):
    """The canonical variable for position ``n`` (fixed objects, so bodies that
    differ only in their variables' names become the same hash-consed node)."""
    key = (kind, n, dom)
    v = _CANON_AXES.get(key)
    if v is None:
        v = _CANON_AXES[key] = var(f"{kind}{n}", dom)
    return v


def canonical_body(t: Tensor):
    """``t``'s body with its axes and reduce variables renamed canonically."""
    rename = {a: canonical_var("a", d, a.dom) for d, a in enumerate(t.axes)}
    body = substitute(t.body, rename)
    count = iter(range(1 << 30))

    def rebind(node, new):
        if isinstance(new, Reduce):
            inner = {ax: canonical_var("r", next(count), ax.dom) for ax in new.axes}
            return Reduce(new.op, substitute(new.body, inner), tuple(inner[a] for a in new.axes),
                          tuple(tuple(substitute(x, inner) for x in dom) for dom in new.doms))
        return None
    return rewrite([body], rebind)[0]


def normal_form(t: Tensor) -> Tensor:
    """``t`` with its nested reductions lifted (``lift.py``), or ``t`` itself when
    they cannot be (a reduction over a variable without a fixed range)."""
    try:
        return lifted(t)
    except ValueError:
        return t


def _copies(body, t) -> bool:
    """Whether ``body`` reads, at ``t``'s own position, a tensor of ``t``'s
    shape and dtype (``t`` is a copy of it)."""
    return (isinstance(body, Load) and body.indices == tuple(t.axes) and body.tensor.shape == t.shape
            and body.tensor.dtype == t.dtype)


def share(outputs, form=normal_form) -> dict:
    """``{tensor: representative}`` for every tensor below ``outputs``: each
    compute tensor is replaced by its normal form ``form(t)`` (by default the
    lifted form), reading representatives, and tensors that compute the same
    values map to one representative.  Representatives keep the name of the
    first tensor of their kind, so printed programs show the user's names.
    Linear in the size of the program: one memoised pass over each body."""
    rep, by_key, scans = {}, {}, {}
    for t in tensors_in_order(outputs, lambda t: form(t).inputs):
        if t.is_placeholder:
            rep[t] = t
            continue
        if isinstance(t.body, ScanState):       # the scan reading representatives
            op = t.body.scan
            if op not in scans:
                scans[op] = op.reading(lambda x: rep.get(x, x))
            rep[t] = scans[op].output(t.body.which)
            continue
        lt = form(t)
        body = rewrite([lt.body], lambda node, new: Load(rep[new.tensor], new.indices)
                       if isinstance(new, Load) and rep.get(new.tensor, new.tensor) is not new.tensor
                       else None)[0]
        if _copies(body, lt):               # t[i] = p[i]: p itself
            rep[t] = body.tensor
            continue
        key = (lt.shape, lt.dtype, canonical_body(Tensor(t.name, lt.shape, lt.dtype, lt.axes, body)))
        if key in by_key:
            rep[t] = by_key[key]
        else:
            new = lt if body is lt.body else Tensor(t.name, lt.shape, lt.dtype, lt.axes, body)
            rep[t] = by_key[key] = new
    return rep
