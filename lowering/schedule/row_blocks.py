"""Row blocks: a register-tiled GEMM whose column tiles run outside its row
tiles (K blocks or column panels) reads its whole row operand once per
column tile.  With several column tiles and a row operand larger than
``Blocking.row_block_bytes`` (half of L2), the row tiles are visited in
blocks outside the column tiles, each block staying in L2 while the
column panels pass; the blocks, as many as a multiple of the threads and
a tile apart in size at most, share out evenly as the parallel root.
With K blocks whose partial sums stay in the output, the K blocks run
between the row blocks and the column tiles (``tile_loops.py``), so a
block need hold one K block of its rows."""
from __future__ import annotations

from dataclasses import replace

from te_autodiff.expr import Var

from .blocking import Blocking
from .nest import operand_bytes


def blocks(accesses, i: Var, j: Var, i_extent: int, k_blocks: int, bl: Blocking) -> int:
    """The number of blocks of rows: a power of two, so that each block of the
    row operand (the loads that move with ``i``, not with ``j``) is at most
    ``bl.row_block_bytes``, over one of ``k_blocks`` K blocks kept in place
    (they then run outside the column tiles, ``tile_loops.py``)."""
    size = operand_bytes(accesses, i, j, i_extent) // k_blocks
    blocks = 1
    while size > blocks * bl.row_block_bytes:
        blocks *= 2
    return blocks


def block_tiles(plan, k_blocks: int, bl: Blocking) -> tuple:
    """``(tiles, most)``: ``plan``'s row tiles and the most of them a block
    may hold (:func:`blocks`, over one of ``k_blocks`` K blocks)."""
    tiles = -(-plan.i_extent // plan.mr)
    return tiles, -(-tiles // blocks(plan.accesses, plan.i, plan.j, plan.i_extent, k_blocks, bl))


def decide(plan, bl: Blocking):
    """``plan`` (a :class:`~lowering.schedule.tile_plan.TilePlan`) with
    ``row_blocks``, how many blocks of rows, when its column tiles run
    first, there are several and the rows take more than one block;
    unchanged otherwise.  The fewest blocks no larger than the L2 budget
    allows (:func:`blocks`), rounded up to a multiple of the threads: the
    blocks differ by at most a tile (``tile_loops.block_of``), so the
    threads' equal shares of them do too."""
    if plan.i is None or not plan.columns_first or plan.j_extent <= plan.nr * plan.lanes:
        return plan
    kb = plan.k_blocks.count if plan.k_blocks is not None and plan.k_blocks.in_place else 1
    tiles, most = block_tiles(plan, kb, bl)
    if most == tiles:
        return plan
    threads = bl.target.threads
    return replace(plan, row_blocks=min(-(-tiles // (most * threads)) * threads, tiles))
