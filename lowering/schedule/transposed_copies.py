"""Transposed copies: a load in a reduction that is a gather along the vector
axis ``j`` but reads only ``j`` and reduction variables (``B[j, k]`` in ``A @
B.T``) is copied, transposed, into a temporary by a new stage, so the lanes
read it with unit stride.  The vector axis rule weighs the copies of each
candidate axis with its accesses and decides them with the axis, at any
size: the copy moves the operand once and the reduction re-reads it at least
``PACK_MIN_REUSE`` times from a layout the register tiles and cache blocks
read well (reading ``B[j, k]`` in place along ``k`` instead, as dot-product
tiles, was up to 2.5 times as slow at every size tried).  With a register
tile the copies take the panel layout (``panels.py``); ``packing.py`` builds
them."""
from __future__ import annotations

from math import prod

from te_autodiff.expr import Var

from ..loop_ir import free_leaves, stride
from .nest import Nest, trips
from .packing import PACK_MIN_REUSE, Copy, box, rereads


def decide(nest: Nest, j: Var, accesses, batch: bool) -> list:
    """The loads worth copying into a transposed temporary ``P[b..., r...,
    j]``: gathers along ``j`` inside a reduction whose index reads only
    ``j``, reduction variables with constant bounds and, if ``batch``, other
    output loops ``b`` (copied whole), in bounds over the whole box, and
    re-read at least ``PACK_MIN_REUSE`` times by the loops that leave them
    in place (the output loops the index does not read, and the reduction
    loops around them that it does not read: ``P[i, e]`` in ``min_j Σ_e``)
    (a list of :class:`~lowering.schedule.packing.Copy`)."""
    j_extent = nest.extent(j)
    plan, seen = [], set()
    for a in accesses:
        if stride(a.index, j) in (0, 1, None) or (a.buffer, a.index) in seen:
            continue
        named = free_leaves(a.index)
        if rereads(a, nest) * prod(trips(lp) for lp in a.loops if lp.var not in named) < PACK_MIN_REUSE:
            continue
        found = box(a, j, j_extent, nest, batch)
        if found is not None:
            seen.add((a.buffer, a.index))
            plan.append(Copy(a, found))
    return plan
