"""The plan of a stage whose output axis ``j`` runs in vector lanes: every
decision of rules 4 to 8 taken from the nest and the target
(:class:`TilePlan`), before :mod:`~lowering.schedule.tile_loops` builds it."""
from __future__ import annotations

from dataclasses import dataclass, replace

from te_autodiff.expr import Var, var

from ..loop_ir import Block, Buffer, For, stride
from .aligned_grid import grid_shift
from .blocking import ALIGN_MIN_VECTORS, GATHER_BLOCK, TILE_VECTORS, TRANSPOSE_BLOCKS, Blocking
from .gather_block import gather_block
from .ir import idx
from .k_blocks import KBlocks, k_blocks, row_blocks
from .nest import Nest, accesses_of, loop_ranges
from .packing import copied, panel_copies
from .peeling import Peel, peel
from .register_tile import gemm_rows, roll_shared_broadcasts
from .selects import if_to_select
from .vector_axis import VectorAxis, chained_lanes, lanes_for, transposed_lanes, uncrowded_lanes


@dataclass(frozen=True)
class TilePlan:
    """How the output loops of a stage become tiles of vector loops.

    ``body``: the element body, tests that differ between lanes as selects
    (rule 4).  ``j`` (``j_extent`` iterations) runs in vector loops of
    ``lanes`` lanes over ``lane``; ``tiles``: the tile variables ``(j tile,
    i tile)``.  ``copies``: the loads read from copies (rules 5, 6a).  A
    register tile (rule 6) is ``mr`` rows of ``i`` (``i_extent``) by ``nr``
    vectors; with it come ``k_blocks`` (rule 7), ``row_block`` (row tiles
    per block of rows, rule 7), ``columns_first`` (column tiles outside the
    row tiles) and ``peel`` (rule 6b).  Without one, ``gather`` is ``(b,
    extent)``: the loop visited in blocks (rule 8), inside the vector loop
    as a loop of kind ``transpose`` when ``transpose`` (every gather reads
    contiguously along ``b``: rows transposed in registers), ``together``
    neighbouring blocks in each column tile, the blocks starting ``shift``
    (a run-time expression) into ``b`` so that the rows are read from the
    starts of the source's lines (:mod:`~lowering.schedule.aligned_grid`)."""

    body: Block
    j: Var
    j_extent: int
    lanes: int
    lane: Var
    tiles: tuple
    copies: tuple
    i: Var | None = None
    i_extent: int = 1
    mr: int = 1
    nr: int = 1
    k_blocks: KBlocks | None = None
    row_block: int | None = None
    columns_first: bool = False
    peel: Peel | None = None
    gather: tuple | None = None
    transpose: bool = False
    together: int = 1
    shift: object = None


def plan_tiles(nest: Nest, axis: VectorAxis, out: Buffer, bl: Blocking) -> TilePlan:
    """The :class:`TilePlan` of ``nest`` (storing into ``out``) for the vector
    axis ``axis.j`` of rule 3."""
    j = axis.j
    ranges = loop_ranges(nest)
    inner = {v: r for v, r in ranges.items() if v not in set(nest.vars)}
    body = if_to_select(nest.body, j, ranges)
    accesses = accesses_of(body)
    j_extent = nest.extent(j)
    lanes = min(lanes_for([a for a in accesses if stride(a.index, j) != 0], bl),
                max(4, 1 << (j_extent - 1).bit_length()))
    i = gemm_rows(nest, body, j, accesses, inner, bl)
    tiles = (var(f"{j.name}.t"), var(f"{i.name if i is not None else j.name}.t"))
    plan = TilePlan(body, j, j_extent, lanes, var(f"{j.name}.l"), tiles, axis.copies)
    if i is None:
        gather = gather_block(nest, j, accesses, copied(plan.copies))
        wide = None if gather is None else transposed_lanes(
            lanes, accesses, j, For(gather[0], idx(0), idx(GATHER_BLOCK), body), body, bl)
        if wide is not None:
            together = blocks_together(j_extent, gather[1], bl)
            # rows evicted before the next block comes back for a shared line: start the blocks on lines
            shift = None if together == 1 or gather[1] % GATHER_BLOCK or gather[1] < ALIGN_MIN_VECTORS * GATHER_BLOCK \
                else grid_shift(accesses, gather[0], 0, wide, bl.target.cache_line)
            return replace(plan, lanes=wide, gather=gather, transpose=True, together=together, shift=shift)
        return replace(plan, lanes=chained_lanes(uncrowded_lanes(lanes, accesses, j, bl), body, j_extent, bl),
                       gather=gather)
    return _register_tile(plan, nest, i, accesses, inner, out, bl)


def blocks_together(rows: int, extent: int, bl: Blocking) -> int:
    """Rule 8's blocks a transposing copy visits together in each column
    tile: ``TRANSPOSE_BLOCKS`` when a column sweep over its ``rows`` source
    rows (a line each per block) reads more than L1 holds and there are at
    least twice that many blocks, else 1.  Its row loads are a cache line
    wide; on rows that do not start on a line (numpy's large arrays are 16
    bytes past one) each load touches two lines, the second one the next
    block's first, which the sweep has evicted by the time that block comes:
    visited next, the block finds it in L1 (three lines read for two, not
    four).  1024 x 1024 float32 transpose from a numpy array, AMD EPYC Zen
    5: 0.165 -> 0.131 ms with AVX-512, 0.125 -> 0.121 built for AVX2; rows
    starting on a line 0.111 -> 0.106 and 0.122 -> 0.111; rows of 1008
    elements unchanged."""
    blocks = -(-extent // GATHER_BLOCK)
    sweep = rows * bl.target.cache_line
    return TRANSPOSE_BLOCKS if sweep > bl.target.l1_bytes and blocks >= 2 * TRANSPOSE_BLOCKS else 1


def _register_tile(plan: TilePlan, nest: Nest, i: Var, accesses, inner: dict, out: Buffer,
                   bl: Blocking) -> TilePlan:
    """``plan`` with a register tile over rows ``i``: its panels, K blocks,
    row blocks, loop order and peeling."""
    j, j_extent, lanes, (jt, it) = plan.j, plan.j_extent, plan.lanes, plan.tiles
    i_extent = nest.extent(i)
    mr, nr = min(bl.tile_rows, i_extent), min(TILE_VECTORS, -(-j_extent // lanes))
    plan = replace(plan, body=roll_shared_broadcasts(plan.body, i, j, mr, nr, bl))
    copies = tuple(panel_copies(nest, accesses, i, j, plan.copies, mr, nr * lanes, plan.tiles, bl))
    kb = k_blocks(plan.body, out, j, bl)
    columns_first = kb is not None or any(c.panel is not None and c.panel[1] is jt for c in copies)
    tiles = -(-i_extent // mr)
    per_block = tiles if not columns_first or j_extent <= nr * lanes else \
        -(-tiles // row_blocks(accesses, i, j, i_extent, bl))
    row_panels = any(c.panel is not None and c.panel[1] is it for c in copies)
    # peeled rows are sibling loops: another output loop must be the parallel root
    peeled = None if row_panels or per_block < tiles or len(nest.vars) < 3 else \
        peel(i_extent, mr, plan.body, i, inner)
    return replace(plan, copies=copies, i=i, i_extent=i_extent, mr=mr, nr=nr, k_blocks=kb,
                   row_block=per_block if per_block < tiles else None, columns_first=columns_first, peel=peeled)
