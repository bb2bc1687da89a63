"""Vector axis: which iterations of a stage run in vector lanes.  Each output
axis is scored by the element body's memory accesses, weighted by how often
they run (:func:`vector_cost`): an index that does not move with the axis is
a broadcast (nearly free), one that moves by one element a vector access
(1), any other a gather (one per lane) or a scatter (two per lane: a
transposing copy gathers, in blocks, ``gather_blocks.py``); one more when a
test around the access differs between lanes (masked work); plus the cost
of copying the loads worth a transposed copy along it
(``transposed_copies.py``), decided with the axis.  The innermost reduction
loop is scored the same way.  Copies of a whole batch (one matrix per value
of an output loop the load reads: attention's ``K[a, j, k]`` per head ``a``)
are weighed only when without them the reduction would run in lanes, as dot
products: the scores count accesses, not the register tile an axis feeds,
and a small batched operand (GMM's 10 x 10 matrix per component) copied to
run its 10 rows in lanes loses to the long axis of the samples it is
applied to.

The decision (:class:`VectorAxis`) leads to one of two builds: when the
reduction wins (a row reduction such as a softmax denominator, or a stage
storing one element) each element's reduction runs in vector lanes
(``lane_reduction.py``); otherwise the best output axis ``j`` becomes a
:class:`~lowering.loop_ir.Simd` loop, tiled by the tile rules
(``tile_plan.py``)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from te_autodiff.expr import Const, Var

from ..loop_ir import Alloc, Assign, Block, For, free_leaves, stride
from . import transposed_copies
from .blocking import Blocking
from .nest import Nest, accesses_of, accumulation, innermost_reduction
from .vector_width import lanes_for

@dataclass(frozen=True)
class VectorAxis:
    """The vector axis rule's decision.  ``j``: the output axis whose
    iterations become vector lanes, or None when each element's reduction
    runs in lanes (a stage storing one element, a row reduction such as a
    softmax denominator).  ``copies``: the transposed copies along ``j``."""

    j: Var | None
    copies: tuple = ()


def vector_cost(accesses, v, lanes, extent) -> float:
    """Estimated cost per element of running ``v``'s iterations in vector
    lanes: an index that does not move with ``v`` is a broadcast (nearly
    free), one that moves by one element a vector access (1), any other a
    gather (one per lane, on every target: a gather instruction, rows
    transposed in registers, ``gather_blocks.py``, or a load per lane) or a
    scatter (two per lane); one more when a test
    around the access differs between lanes (masked work).  Inside a loop
    whose range differs between lanes (the matches of an inverse index)
    every access is a masked gather or scatter."""
    if extent < 2:
        return float("inf")
    used = extent / (-(-extent // lanes) * lanes)
    total = 0.0
    for a in accesses:
        s = None if any(v in free_leaves(lp.lo) | free_leaves(lp.extent) for lp in a.loops) \
            else stride(a.index, v)
        total += a.weight * (0.1 if s == 0 else 1.0 if s == 1 else 2 * lanes if a.store else lanes)
        total += a.weight if s is None else 0
        total += a.weight if v in a.tested else 0     # a test that differs between lanes: masked work
    return total / (lanes * used)


def _plain(loop: For) -> bool:
    """Whether ``loop`` can run in lanes: its body only combines accumulators
    (``acc = acc + e``, each its own: no tests, no other local)."""
    stmts = loop.body.stmts if isinstance(loop.body, Block) else (loop.body,)
    assigned = [x.local for x in stmts if isinstance(x, Assign)]
    return all(isinstance(x, Alloc) or (isinstance(x, Assign) and accumulation(x) is not None) for x in stmts) \
        and len(assigned) >= 1 and len(set(assigned)) == len(assigned)


def _axis_cost(nest: Nest, accesses, v: Var, extent: int, lanes: int, copies) -> float:
    """:func:`vector_cost` of output axis ``v`` when ``copies`` are made: a
    copied load reads its copy with unit stride, and the copy moves each
    element once (about one gather lane each), per output element."""
    packed = {id(c.access) for c in copies}
    cost = vector_cost([a if id(a) not in packed else replace(a, index=v, store=False) for a in accesses],
                       v, lanes, extent)
    return cost + sum(prod(n for _, _, n in c.box) for c in copies) / prod(nest.extents)


def _row_reduction(body, accesses, lanes: int, best: float) -> bool:
    """Whether the innermost reduction, in vector lanes, costs less than half
    the best output axis ``best`` (a reduction LLVM could vectorise, as a
    row reduction)."""
    red = innermost_reduction(body)
    if red is None or red.kind != "serial" or not isinstance(red.extent, Const) or not _plain(red):
        return False
    inner = [a for a in accesses if red in a.loops]
    return vector_cost(inner, red.var, lanes, red.extent.value) < best * 0.5


def decide(nest: Nest, bl: Blocking) -> VectorAxis | None:
    """The :class:`VectorAxis` of ``nest``; None when no iteration can use the
    lanes (a stage without elements)."""
    accesses = accesses_of(nest.body)
    lanes = lanes_for(accesses, bl)
    for batch in (False, True):
        copies = {v: transposed_copies.decide(nest, v, accesses, batch) for v in nest.vars}
        costs = {v: _axis_cost(nest, accesses, v, n, lanes, copies[v]) for v, n in zip(nest.vars, nest.extents)}
        j = min(reversed(nest.vars), key=lambda v: costs[v])
        if costs[j] == float("inf"):          # a stage storing one element
            return None if any(n != 1 for n in nest.extents) else VectorAxis(None)
        if not _row_reduction(nest.body, accesses, lanes, costs[j]):
            return VectorAxis(j, tuple(copies[j]))
    return VectorAxis(None)
