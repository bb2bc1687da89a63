"""Column groups (BLIS's NC): a register-tiled GEMM in blocks of rows
(``row_blocks.py``) reads its whole column operand once per block of
rows.  When that operand is larger than the threads' share of the L3
(``Blocking.panel_group_bytes``) each pass comes from memory again, at a
rate the FMA units outrun (for float32 on AVX2 and 2048 steps, a quarter
of a byte per multiply-add from a 16-row block).  The column tiles are
then split into equal groups whose slice of the column operand fits that
share, one stage each: every block of rows passes over one group's slice,
which stays in L3, before the next group starts; the row operand is read
once per group instead, from memory, and the copies (panels) are made
once for all groups.  Each element keeps its operations; only the order
in which elements are computed changes."""
from __future__ import annotations

from dataclasses import replace

from .blocking import Blocking
from .nest import operand_bytes


def decide(plan, bl: Blocking):
    """``plan`` (a :class:`~lowering.schedule.tile_plan.TilePlan`) with
    ``column_group``, the column tiles per group, when its rows run in
    blocks over whole reductions (no K blocks) and the column operand is
    larger than ``bl.panel_group_bytes``; unchanged otherwise."""
    if plan.i is None or plan.row_blocks is None or plan.k_blocks is not None or bl.panel_group_bytes <= 0:
        return plan
    size = operand_bytes(plan.accesses, plan.j, plan.i, plan.j_extent)
    if size <= bl.panel_group_bytes:
        return plan
    tiles = -(-plan.j_extent // (plan.nr * plan.lanes))
    groups = -(-size // bl.panel_group_bytes)
    per = -(-tiles // groups)
    return replace(plan, column_group=per) if per < tiles else plan


def parts(plan, name: str) -> list:
    """``(stage name, (first column tile, column tiles))`` of each group of
    ``plan``, or ``[(name, None)]`` without groups."""
    if plan.column_group is None:
        return [(name, None)]
    tiles, per = -(-plan.j_extent // (plan.nr * plan.lanes)), plan.column_group
    return [(f"{name}.cols{g}", (first, min(per, tiles - first))) for g, first in enumerate(range(0, tiles, per))]
