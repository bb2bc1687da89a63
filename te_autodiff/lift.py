"""Lift reductions into tensors of their own.

Differentiation works on a normal form where every compute body is either
reduction-free or one top-level reduction whose body is reduction-free.  A
reduction nested anywhere else (``te.sum(x[i, k], axis=k) / n``, a reduction
inside a select branch or inside another reduction) becomes a tensor indexed
by the reduction's free variables, and the body reads it.  The derivative can
then *read* a reduction's value (``1 / R[i]``) instead of recomputing it for
every element, which would multiply the cost by the reduction's size.

A lifted reduction keeps the conditions that guarded it (enclosing select
conditions and enclosing reduce domains on its free variables), so the new
tensor never evaluates an access the original program would have skipped.
Lifting is memoised per tensor: forward and backward share the lifted tensors.
"""
from __future__ import annotations

import weakref

from .expr import Reduce, Select, all_, const, identity_of, logic_not, select, var
from .tensor import Tensor
from .visit import children, conjuncts, free_vars, rebuild, substitute, topo_order, trampoline

_LIFTED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_SELF = object()                # the value of a tensor that is its own normal form
_PARTS: "weakref.WeakSet" = weakref.WeakSet()


def is_lifted_part(t: Tensor) -> bool:
    """Whether ``t`` is a reduction lifted out of another tensor's formula."""
    return t in _PARTS


def lifted(t: Tensor) -> Tensor:
    """``t`` in normal form (``t`` itself when it already is)."""
    if t.is_placeholder:
        return t
    out = _LIFTED.get(t)
    if out is None:
        out = _Lifter(t).run()
        # a tensor already in normal form is not stored as its own value: the
        # table would keep every tensor alive through its entry
        _LIFTED[t] = _SELF if out is t else out
    return t if out is _SELF else out


class _Lifter:
    def __init__(self, t: Tensor):
        self.t = t
        self.memo = {}
        self.count = 0
        # the nodes with a reduction below them: the others stay as they are
        # (the walk would otherwise visit a body of nested selects once per path)
        self.reducing = set()
        for node in topo_order([t.body]):
            if isinstance(node, Reduce) or any(c in self.reducing for c in children(node)):
                self.reducing.add(node)

    def run(self) -> Tensor:
        new_body = trampoline(self._walk, self.t.body, (), True)
        if new_body is self.t.body:
            return self.t
        return Tensor(self.t.name, self.t.shape, self.t.dtype, self.t.axes, new_body)

    def _walk(self, e, guards, top=False):
        """``e`` with every reduction in it replaced by a read of a lifted
        tensor; a reduction at the ``top`` of the body stays, with those
        inside its body lifted (a generator for :func:`trampoline`)."""
        if e not in self.reducing:
            return e
        key = (e, guards)
        if key in self.memo and not top:
            return self.memo[key]
        if isinstance(e, Reduce):
            inner = guards + tuple(_in_dom(ax, dom) for ax, dom in zip(e.axes, e.doms))
            body = yield e.body, inner
            out = rebuild(e, [x for dom in e.doms for x in dom] + [body])
            if top:
                return out
            out = self.lift(out, guards)
        elif isinstance(e, Select):
            cond = yield e.cond, guards
            a = yield e.a, guards + (cond,)
            b = yield e.b, guards + (logic_not(cond),)
            out = select(cond, a, b)
        else:
            kids = []
            for c in children(e):
                kids.append((yield c, guards))
            out = rebuild(e, kids) if kids else e
        self.memo[key] = out
        return out

    def lift(self, r: Reduce, guards):
        """A new tensor ``L[v...] = guard ? r : 0`` over the free variables of
        ``r`` and those of the guards' conjuncts that bound them."""
        conds = conjuncts(guards)
        fv = _bounding(free_vars(r), conds)
        axes_old = [v for v in self.t.axes if v in fv]
        axes_old += sorted((v for v in fv if v not in self.t.axes), key=lambda v: v.uid)
        shape, axes_new, rename, reads = [], [], {}, []
        for v in axes_old:
            if v.dom is None:
                raise ValueError(f"tensor '{self.t.name}': cannot lift a reduction over variable "
                                 f"'{v.name}', which has no fixed range")
            lo, ext = v.dom
            nv = var(v.name, (0, ext))
            shape.append(ext)
            axes_new.append(nv)
            rename[v] = nv + lo
            reads.append(v - lo)
        # the guards move into the reduction's body (where they do not hold the
        # value is never read), so the lifted tensor stays in normal form
        keep = [g for g in conds if free_vars(g) <= fv]
        if keep:
            idle = const(identity_of(r.op, r.body.dtype), r.body.dtype)
            r = Reduce(r.op, select(all_(*keep), r.body, idle), r.axes, r.doms)
        body = substitute(r, rename)
        self.count += 1
        lt = Tensor(f"{self.t.name}.r{self.count}", tuple(shape), body.dtype, tuple(axes_new), body)
        _PARTS.add(lt)
        return lt[tuple(reads)]


def _bounding(fv: set, conds) -> set:
    """``fv`` and the variables of the conditions that bound them: a condition
    on ``i`` and ``j`` (``j <= i``, with ``i <= 0`` elsewhere) bounds ``j`` only
    together with ``i``, so a tensor over ``j`` alone would compute points
    the program never reads (and read out of range there).  Variables
    without a fixed range cannot be axes and are left out."""
    fv, grew = set(fv), True
    while grew:
        grew = False
        for c in conds:
            cv = free_vars(c)
            if cv & fv and not cv <= fv and all(v.dom is not None for v in cv):
                fv |= cv
                grew = True
    return fv


def _in_dom(ax, dom):
    lo, ext = dom
    return all_(ax >= lo, ax < lo + ext)
