"""Gather blocks: when the vector loop gathers (a transposed read), the loop
outside it is visited ``GATHER_BLOCK`` rows at a time inside each column
tile, so the cache lines a gather touches are reused by the neighbouring
rows.

When every gather reads contiguously along that loop (a transposing copy,
packed operands included), the block's loop runs inside the vector loop as
a loop of kind ``transpose`` in lanes covering a cache line
(:func:`~lowering.schedule.vector_width.transposed_lanes`): the code
generator loads rows and transposes them in registers.  A partial last
block is a loop of its own (every whole block keeps a constant extent, so
only the last gathers).  Where a column sweep reads more lines than L1
holds, neighbouring blocks are visited together (:func:`blocks_together`)
and, with ``ALIGN_MIN_VECTORS`` blocks or more, start where the source's
lines start (the last block wraps around and gathers; ``aligned_grid.py``).
"""
from __future__ import annotations

from dataclasses import replace
from itertools import count

from te_autodiff.expr import Var, add, compare, minimum, mod, mul, sub, var

from ..loop_ir import Block, For, If, rename, stride
from .aligned_grid import ALIGN_MIN_VECTORS, grid_shift
from .blocking import Blocking
from .constructors import idx, lt
from .nest import Nest
from .packing import copied
from .tile_loops import columns
from .tile_plan import TilePlan
from .vector_width import transposed_lanes

GATHER_BLOCK = 16            # rows visited per column tile when the vector loop gathers
TRANSPOSE_BLOCKS = 2         # gather blocks a transposing copy visits together per column tile


def _gather_loop(nest: Nest, j: Var, accesses, copied: set):
    """``(b, extent)``: the output loop just outside ``j`` to visit in blocks;
    None when the gathers are a small part of the accesses or there is no
    such loop.  Loads in ``copied`` (``(buffer, index)``) read a transposed
    copy with unit stride instead."""
    k = nest.vars.index(j)
    if k == 0:
        return None
    total = sum(a.weight for a in accesses)
    gathered = sum(a.weight for a in accesses
                   if stride(a.index, j) not in (0, 1) and (a.buffer, a.index) not in copied)
    b, n = nest.vars[k - 1], nest.extents[k - 1]
    if gathered * 4 < total or n <= GATHER_BLOCK // 2:
        return None
    return b, n


def blocks_together(rows: int, extent: int, bl: Blocking) -> int:
    """The blocks a transposing copy visits together in each column tile:
    ``TRANSPOSE_BLOCKS`` when a column sweep over its ``rows`` source rows
    (a line each per block) reads more than L1 holds and there are at least
    twice that many blocks, else 1.  Its row loads are a cache line wide; on
    rows that do not start on a line (numpy's large arrays are 16 bytes past
    one) each load touches two lines, the second one the next block's first,
    which the sweep has evicted by the time that block comes: visited next,
    the block finds it in L1 (three lines read for two, not four)."""
    blocks = -(-extent // GATHER_BLOCK)
    sweep = rows * bl.target.cache_line
    return TRANSPOSE_BLOCKS if sweep > bl.target.l1_bytes and blocks >= 2 * TRANSPOSE_BLOCKS else 1


def decide(plan: TilePlan, nest: Nest, bl: Blocking) -> TilePlan:
    """``plan`` with the loop to visit in blocks when its vector loop gathers
    and it has no register tile, in ``transpose`` rows when every gather
    reads contiguously along it (lanes covering a line, blocks together,
    shifted onto the source's lines); unchanged otherwise, and when the
    gathers cannot be transposed and the loop is one block at most (its rows
    would share no more lines than unblocked, and the column tiles outside
    them would make the stores jump)."""
    if plan.i is not None:
        return plan
    gather = _gather_loop(nest, plan.j, plan.accesses, copied(plan.copies))
    if gather is None:
        return plan
    body, accesses = plan.body, plan.accesses
    wide = transposed_lanes(plan.lanes, accesses, plan.j, For(gather[0], idx(0), idx(GATHER_BLOCK), body), body, bl)
    if wide is None:                # gathered: blocks only where rows are left to share a block's lines
        return plan if gather[1] <= GATHER_BLOCK else replace(plan, gather=gather)
    together = blocks_together(plan.j_extent, gather[1], bl)
    # rows evicted before the next block comes back for a shared line: start the blocks on lines
    shift = None if together == 1 or gather[1] % GATHER_BLOCK or gather[1] < ALIGN_MIN_VECTORS * GATHER_BLOCK \
        else grid_shift(accesses, gather[0], 0, wide, bl.target.cache_line)
    return replace(plan, lanes=wide, gather=gather, transpose=True, together=together, shift=shift)


def build(plan: TilePlan, body) -> For:
    """The tile loops of ``plan`` around the (packed) element ``body``: blocks
    of ``GATHER_BLOCK`` rows of ``b``, each visited inside every column tile,
    ``plan.together`` neighbouring blocks one after the other: around the
    vector loop, or inside it as a loop of kind ``transpose``
    (``plan.transpose``), where a partial last block is a loop of its own so
    that every whole one has a constant extent (transposed in registers;
    only the last gathers)."""
    tags = count()
    b, b_extent = plan.gather
    blocks, (full, rest) = -(-b_extent // GATHER_BLOCK), divmod(b_extent, GATHER_BLOCK)
    b_in, together = var(f"{b.name}.i"), plan.together
    if together > 1:
        outer, b_sub = var(f"{b.name}.g"), var(f"{b.name}.s")
        block = add(mul(outer, idx(together)), b_sub)
        subs = idx(together) if blocks % together == 0 else minimum(
            idx(together), sub(idx(blocks), mul(outer, idx(together))))

        def wrap(blk):
            return Block((For(b_sub, idx(0), subs, blk),))
    else:
        outer = block = var(f"{b.name}.b")

        def wrap(blk):
            return blk
    first = mul(block, idx(GATHER_BLOCK)) if plan.shift is None else add(plan.shift, mul(block, idx(GATHER_BLOCK)))
    row = {b: add(first, b_in)}
    if plan.transpose and plan.shift is not None:
        def inside(blk):
            # the last block wraps around: its rows from first to the end, then those before shift
            wrapped = rename(blk, {b_in: sub(mod(add(first, b_in), idx(b_extent)), first)})
            return Block((If(compare("le", first, idx(b_extent - GATHER_BLOCK)),
                             Block((For(b_in, idx(0), idx(GATHER_BLOCK), blk, "transpose"),)),
                             Block((For(b_in, idx(0), idx(GATHER_BLOCK), wrapped),))),))
        tiles = columns(plan, [row], body, tags, wrap, inside)
    elif plan.transpose:
        def inside(blk):
            def rows(n):
                return Block((For(b_in, idx(0), idx(n), blk, "transpose"),))
            return rows(GATHER_BLOCK) if rest == 0 else Block((If(lt(block, full), rows(GATHER_BLOCK), rows(rest)),))
        tiles = columns(plan, [row], body, tags, wrap, inside)
    else:
        n_rows = idx(GATHER_BLOCK) if rest == 0 else minimum(
            idx(GATHER_BLOCK), sub(idx(b_extent), mul(block, idx(GATHER_BLOCK))))
        tiles = columns(plan, [row], body, tags, lambda blk: wrap(Block((For(b_in, idx(0), n_rows, blk),))))
    return For(outer, idx(0), idx(-(-blocks // together)), Block((tiles,)))
