"""Scaled reads: a tensor that is a stored tensor times broadcast factors is
not stored again for the sums that read it.

Softmax written as ``P = E / Z`` (``E = exp(S - M)``, ``Z = Σ_j E``) keeps
``E`` in a buffer, because the gradient reads it (``d exp = exp``), and
would keep ``P`` in a second one, because ``O = Σ_j P V`` and ``dV = Σ_i P
dO`` read it inside their sums: two passes over the ``T x T`` scores where
one holds the values.  ``P`` is a *scaled view* of ``E``: its body is one
read of a stored tensor at its own position (``E[a, i, j]``) times or over
factors that read fewer of its axes (``Z[a, i]``, a constant).  Each read of
``P`` that is a factor of a sum's summand becomes a read of ``E``, and each
factor goes where the sum pays nothing for it:

- one that reads none of the summed variables stays a factor of the
  summand, which ``lower.py`` applies once after the loop
  (``Σ_j E[i, j] V[j, c] / Z[i]``);
- one that does goes onto another factor of the summand, a load whose
  index is distinct variables covering the factor's: a new elementwise
  tensor with that operand's elements (``dO'[a, i, c] = dO[a, i, c] /
  Z[a, i]``), so the sum stays a product of two loads the schedule tiles.

A view is rewritten only when every read of it inside a sum can be, the
tensors it adds have fewer elements together than it has, and the sums'
domains are constant (the factors applied after a loop need it to have
run).  Reads outside sums are left to the store-or-recompute rule, which
inlines a view (a load and a few operations).  The values are those of the
written program up to rounding: ``(E / Z) · V`` and ``(E · V) / Z`` round
differently.
"""
from __future__ import annotations

from math import prod

from te_autodiff import dtype as dt
from te_autodiff.expr import Const, Load, Reduce, ScanState, Var, factors, product, reduce, var
from te_autodiff.tensor import Tensor
from te_autodiff.visit import children, free_vars, rewrite, substitute, topo_order

from .bounds_check import check_tensor


def _view(t: Tensor, stored: set):
    """``(load, scale)`` when ``t`` is a scaled view: ``load`` reads a stored
    tensor (or an input) at ``t``'s own position, ``scale`` the other
    ``(op, factor)`` pairs, each reading a strict subset of ``t``'s axes."""
    if t.axes is None or not dt.is_float(t.dtype) or isinstance(t.body, ScanState):
        return None
    pairs = factors(t.body)
    axes = tuple(t.axes)
    own = [f for op, f in pairs if op == "mul" and isinstance(f, Load) and f.indices == axes
           and f.tensor is not t and (f.tensor.is_placeholder or f.tensor in stored)]
    if len(own) != 1 or len(pairs) < 2:
        return None
    scale = [(op, f) for op, f in pairs if f is not own[0]]
    if any(not free_vars(f) < set(axes) or any(isinstance(n, Reduce) for n in topo_order([f]))
           for _, f in scale):
        return None
    return own[0], scale


def _operand_vars(load) -> set | None:
    """The variables of ``load``'s index when it is distinct variables."""
    ix = load.indices
    return set(ix) if all(isinstance(v, Var) for v in ix) and len(set(ix)) == len(ix) else None


class _Rewrite:
    """The sums a view's reads are rewritten in: for each ``Reduce`` node, its
    new summand; the operands scaled, shared by key."""

    def __init__(self):
        self.summands = {}
        self.operands = {}

    def operand(self, load, pairs) -> Load:
        """``load`` of a new tensor: ``load``'s tensor times ``pairs`` (whose
        variables its index covers), over that tensor's elements."""
        src = load.tensor
        key = (src, load.indices, tuple(pairs))
        if key not in self.operands:
            axes = tuple(var(f"s{k}", (0, n)) for k, n in enumerate(src.shape))
            to_axes = dict(zip(load.indices, axes))
            body = product([("mul", Load(src, axes)), *((op, substitute(f, to_axes)) for op, f in pairs)], src.dtype)
            self.operands[key] = Tensor(f"{src.name}.scaled", src.shape, src.dtype, axes, body)
        return Load(self.operands[key], load.indices)


def _sites(t: Tensor, view: Tensor) -> list | None:
    """The sums of ``t``'s body whose summand has a read of ``view`` as a
    factor; None when ``view`` is read inside a reduction any other way."""
    out, stack, seen = [], [(t.body, None)], set()
    while stack:
        e, red = stack.pop()
        if (e, red) in seen:
            continue
        seen.add((e, red))
        if isinstance(e, Load) and e.tensor is view and red is not None:
            if red.op != "sum" or not dt.is_float(red.dtype):
                return None
            reads = [f for op, f in factors(red.body) if isinstance(f, Load) and f.tensor is view]
            if reads != [e] or ("mul", e) not in factors(red.body):
                return None
            out.append(red)
        if isinstance(e, Reduce):
            stack += [(x, red) for dom in e.doms for x in dom] + [(e.body, e)]
        elif not isinstance(e, Load) or e.tensor is not view:
            stack += [(c, red) for c in children(e)]
    return list(dict.fromkeys(out))


def _summand(red: Reduce, view: Tensor, own: Load, scale: list, rw: _Rewrite):
    """``red``'s summand with its read of ``view`` made a read of ``own``'s
    tensor: the factors that read none of the summed variables kept in it,
    the others moved onto the smallest operand covering them; None if none does."""
    pairs = factors(red.body)
    read = next(f for op, f in pairs if isinstance(f, Load) and f.tensor is view)
    at = dict(zip(view.axes, read.indices))
    summed = set(red.axes)
    moved = [(op, substitute(f, at)) for op, f in scale]
    outside = [(op, f) for op, f in moved if not free_vars(f) & summed]
    inside = [(op, f) for op, f in moved if free_vars(f) & summed]
    if outside and not all(isinstance(lo, Const) and isinstance(n, Const) and n.value > 0 for lo, n in red.doms):
        return None
    new = [(op, Load(own.tensor, read.indices)) if f is read else (op, f) for op, f in pairs]
    if inside:
        need = set().union(*(free_vars(f) for _, f in inside))
        operands = [(prod(f.tensor.shape), k) for k, (op, f) in enumerate(pairs)
                    if op == "mul" and f is not read and isinstance(f, Load)
                    and (ix := _operand_vars(f)) is not None and need <= ix]
        if not operands:
            return None
        k = min(operands)[1]
        new[k] = ("mul", rw.operand(pairs[k][1], inside))
    return product(new + outside, red.dtype)


def scale_reads(graph: list, stored: set, keep: set) -> dict:
    """``{tensor: rewritten tensor}`` for the readers of every scaled view in
    ``graph`` that the module doc's rule rewrites (the tensors in ``keep``,
    outputs and those the user stores, are not rewritten views); every
    tensor reading a rewritten one directly or not is rebuilt too.  Empty
    when nothing changes.  ``stored``: the tensors the plan of ``graph``
    keeps in buffers."""
    if any(isinstance(t.body, ScanState) for t in graph):
        return {}
    readers = {}
    for t in graph:
        for p in t.inputs:
            readers.setdefault(p, []).append(t)
    rw, views = _Rewrite(), set()
    for view in graph:
        if view.is_placeholder or view in keep or view not in stored or not (found := _view(view, stored)):
            continue
        own, scale = found
        if own.tensor in views:                     # a view of a view: the first is no longer stored
            continue
        trial, before = {}, dict(rw.operands)
        for t in readers.get(view, []):
            sums = _sites(t, view)
            if sums is None or any(s in rw.summands for s in sums):
                trial = None
                break
            for s in sums:
                body = _summand(s, view, own, scale, rw)
                if body is None:
                    trial = None
                    break
                trial[s] = body
            if trial is None:
                break
        added = [x for k, x in rw.operands.items() if k not in before]
        if not trial or sum(prod(x.shape) for x in added) >= prod(view.shape) or not _in_bounds(added):
            rw.operands = before
            continue
        rw.summands.update(trial)
        views.add(view)
    if not rw.summands:
        return {}
    return _rebuild(graph, rw)


def _in_bounds(tensors) -> bool:
    try:
        for t in tensors:
            check_tensor(t)
    except IndexError:
        return False
    return True


def _rebuild(graph: list, rw: _Rewrite) -> dict:
    """Every tensor of ``graph`` holding a rewritten sum, or reading a rebuilt
    tensor, rebuilt (same name, shape and axes)."""
    new = {}
    made = {x: x for x in rw.operands.values()}

    def fn(node, rebuilt):
        if isinstance(node, Reduce) and node in rw.summands:
            body = rewrite([rw.summands[node]], fn, memo)[0]
            return reduce(node.op, body, rebuilt.axes, rebuilt.doms)
        if isinstance(node, Load) and node.tensor in new:
            return Load(new[node.tensor], rebuilt.indices)
        if isinstance(node, Load) and node.tensor in made and any(p in new for p in node.tensor.inputs):
            return Load(_relinked(node.tensor), rebuilt.indices)
        return None

    def _relinked(x):
        if made[x] is x:
            made[x] = Tensor(x.name, x.shape, x.dtype, x.axes, rewrite([x.body], fn, {})[0])
        return made[x]

    for t in graph:
        if t.body is None:
            continue
        memo = {}
        body = rewrite([t.body], fn, memo)[0]
        if body is not t.body:
            new[t] = Tensor(t.name, t.shape, t.dtype, t.axes, body)
    return new
