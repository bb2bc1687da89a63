"""Tests to selects: once the vector axis ``j`` is known, an ``If`` whose
condition differs between the lanes and whose branches assign one value to
one local (a padding test) becomes a ``select`` whose reads are
:class:`~lowering.loop_ir.GuardedLoad` (masked loads), unless the read is
provably in bounds: straight-line code the vector loop runs without
branches.  A test that is the same for all lanes stays a branch: it skips
work.  The rule rewrites the element body statement by statement."""
from __future__ import annotations

from te_autodiff.expr import Const, Select, logic_and, logic_not, select

from ..loop_ir import Assign, Block, For, GuardedLoad, If, free_leaves, linear_form, map_loads
from .nest import Nest, loop_ranges


def _in_bounds(index, size: int, ranges: dict) -> bool:
    """Whether an affine ``index`` provably stays in ``[0, size)`` when every
    variable stays in its ``ranges`` entry ``(first, last)``."""
    form = linear_form(index)
    if form is None or any(atom not in ranges for atom in form[0]):
        return False
    lo = hi = form[1]
    for atom, k in form[0].items():
        a, b = ranges[atom]
        lo, hi = lo + min(k * a, k * b), hi + max(k * a, k * b)
    return 0 <= lo and hi < size


def _guard(e, cond, ranges: dict):
    """``e`` with every load made a :class:`GuardedLoad` under ``cond`` (loads
    inside its index too), but for loads whose index provably stays in
    bounds (``ranges``)."""
    def guard(x):
        if isinstance(x, GuardedLoad):
            return GuardedLoad(x.buffer, _guard(x.index, cond, ranges), logic_and(x.cond, cond))
        if _in_bounds(x.index, x.buffer.size, ranges):
            return None
        return GuardedLoad(x.buffer, _guard(x.index, cond, ranges), cond)
    return map_loads(e, guard)


def _single_assign(block):
    stmts = block.stmts if isinstance(block, Block) else (block,)
    return stmts[0] if len(stmts) == 1 and isinstance(stmts[0], Assign) else None


def _if_to_select(s, lane_var, ranges: dict):
    """Turn every ``If`` whose condition differs between the lanes of
    ``lane_var`` and whose branches each assign one value to the same local
    (a guarded read, the padding test of a convolution) into one assignment
    of a ``select`` whose loads are :class:`GuardedLoad` under the branch
    condition: straight-line code the vector loop runs without branches.
    (A test that is the same for all lanes stays a branch: it skips work.)
    Loads whose index provably stays in bounds (``ranges``: ``{variable:
    (first, last)}``) stay plain."""
    if isinstance(s, Block):
        return Block(tuple(_if_to_select(x, lane_var, ranges) for x in s.stmts))
    if isinstance(s, For):
        return For(s.var, s.lo, s.extent, _if_to_select(s.body, lane_var, ranges), s.kind)
    if not isinstance(s, If):
        return s
    then = _if_to_select(s.then, lane_var, ranges)
    other = None if s.else_ is None else _if_to_select(s.else_, lane_var, ranges)
    a, b = _single_assign(then), None if other is None else _single_assign(other)
    if lane_var in free_leaves(s.cond) and a is not None and (
            other is None or (b is not None and b.local is a.local)):
        no = a.local if other is None else _guard(b.value, logic_not(s.cond), ranges)
        yes = _guard(a.value, s.cond, ranges)
        if isinstance(yes, GuardedLoad) and yes.cond is s.cond and isinstance(no, Const) and no.value == 0:
            return Assign(a.local, yes)          # GuardedLoad is already zero where cond fails
        return Assign(a.local, Select(s.cond, yes, no) if yes.dtype == no.dtype else select(s.cond, yes, no))
    return If(s.cond, then, other)


def build(nest: Nest, j) -> Nest:
    """``nest`` with the tests of its element body that differ between the
    lanes of ``j`` as selects (:func:`_if_to_select`, bounds from the loops)."""
    return Nest(nest.loops, _if_to_select(nest.body, j, loop_ranges(nest)))
