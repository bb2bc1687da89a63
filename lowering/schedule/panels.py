"""Panels: the operands of a register-tiled GEMM copied by new stages into
blocks laid out as the tiles read them.  The operand read in vector lanes
(moves with ``j``, not with ``i``) becomes column panels ``P[j tile][b...][r...][NR
vectors]`` and a broadcast operand whose tile rows are adjacent but whose
reduction steps are not (``A[k, i]``) row panels ``P[i tile][b...][r...][MR]``
(``b``: the other output loops the operand reads, a batch of matrices copied
whole; not from a temporary whose rows ``row_padding.py`` padded, which a
column walk reads without set conflicts), when it is larger than L1 (``Blocking.panel_min_bytes``) and each
element is re-read ``PACK_MIN_REUSE`` times by the output loops its index
does not read (per tile of the other operand's axis), and the box holds
each element once: a convolution's input read at ``x + kw`` as the vector
axis would be copied once per tap (an im2col, nine times the input for a
3x3 filter, to write and read back on every call), so it is read in place.
A tile's reduction then reads one contiguous, aligned block per operand: no cache-set conflicts between rows
a power of two apart, no split loads from unaligned inputs.  Transposed
copies (``transposed_copies.py``) take the panel layout.  With column
panels the loops are ordered column tiles, then row tiles
(:attr:`~lowering.schedule.tile_plan.TilePlan.columns_first`), so a column
panel stays in cache while the rows pass.  ``packing.py`` builds them."""
from __future__ import annotations

from dataclasses import replace
from math import prod

import numpy as np

from ..loop_ir import linear_form, stride, substitute
from ..row_padding import padded
from .blocking import Blocking
from .constructors import idx
from .nest import Nest
from .packing import PACK_MIN_REUSE, Copy, box, panel_index, rereads


def _panel_copies(nest: Nest, plan, bl: Blocking) -> list:
    """The copies of ``plan``'s register tile: its transposed copies in the
    panel layout, then each operand that qualifies (a temporary already laid
    out as the panel is read in place).  Panel indices use the tile
    variables ``plan.jt`` and ``plan.it``."""
    i, j, mr, width = plan.i, plan.j, plan.mr, plan.nr * plan.lanes
    extents = dict(zip(nest.vars, nest.extents))
    copies = [Copy(c.access, c.box, (width, plan.jt)) for c in plan.copies]
    seen = {(c.access.buffer, c.access.index) for c in plan.copies}
    for a in plan.accesses:
        if (a.buffer, a.index) in seen or a.store or not a.loops:
            continue
        sj, si = stride(a.index, j), stride(a.index, i)
        reuse = rereads(a, nest)
        if sj == 1 and si == 0 and reuse // mr >= PACK_MIN_REUSE:
            axis, size, tile = j, width, plan.jt
        elif sj == 0 and si == 1 and stride(a.index, a.loops[-1].var) != 1 and reuse // width >= PACK_MIN_REUSE \
                and not padded(a.buffer, bl.target):
            axis, size, tile = i, mr, plan.it
        else:
            continue
        found = box(a, axis, extents[axis], nest)
        points = 0 if found is None else prod(n for _, _, n in found)
        if points * np.dtype(a.buffer.dtype).itemsize < bl.panel_min_bytes or points > prod(a.buffer.shape):
            continue
        in_place = substitute(panel_index(found, size, tile), {tile: idx(0)})
        if a.buffer.kind == "temp" and extents[axis] <= size and \
                linear_form(in_place) == linear_form(a.index):
            continue                        # already a panel
        seen.add((a.buffer, a.index))
        copies.append(Copy(a, found, (size, tile)))
    return copies


def decide(plan, nest: Nest, bl: Blocking):
    """``plan`` (a :class:`~lowering.schedule.tile_plan.TilePlan`) with the
    panels of its register tile among its copies; unchanged without one."""
    if plan.i is None:
        return plan
    return replace(plan, copies=tuple(_panel_copies(nest, plan, bl)))
