"""The schedule's thresholds, read from the schedule and the target at run time.

The large programs (``large.py``) take extents on both sides of every
threshold at which a schedule rule (``lowering/schedule/__init__.py``)
changes its decision; the figures come from the schedule's own constants and
from :func:`~lowering.schedule.blocking.blocking` of ``te.target()`` (the
target the fuzzer's kernels are built for: ``TE_TARGET`` or this machine),
never copied, so the programs follow the schedule when it is retuned.  This
is the one place the fuzzer imports the schedule: re-point it here when the
schedule's modules move.  Sizes are in float64 elements, the fuzzer's dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

ITEMSIZE = 8            # float64


@dataclass(frozen=True)
class Thresholds:
    """The figures, each named after the rule that decides on it."""
    lanes: int                  # elements per native vector: the vector axis (rule 3)
    line: int                   # elements per cache line: interior split ends (rule 0b)
    max_residues: int           # largest modulus split into residue classes (rule 0)
    split_min_work: int         # reductions to one element this long are split (rule 1) ...
    split_parts: tuple          # ... when their outer extent is a multiple of one of these
    align_min_vectors: int      # vectors of a reduction in lanes from which it starts on lines (rule 3)
    sum_run: int                # vectors a lane adds before its running total, from 8 runs (rule 3)
    pack_min_reuse: int         # re-reads of an operand worth a packed copy (rules 5, 6a)
    pack_max_elements: int      # larger transposed operands get dot-product tiles (rule 5)
    gemm_min_trips: int         # reduction length worth a register tile (rule 6)
    tile_rows: int              # rows of a register tile (rule 6)
    tile_vectors: int           # vectors of a register tile's row (rule 6)
    panel_elements: int         # operands at least this large are read from panels (rule 6a)
    k_block: int                # reduction steps per K block (rule 7) ...
    k_block_min: int            # ... for reductions longer than this
    row_block_elements: int     # row operands larger than this are visited in row blocks (rule 7)
    gather_block: int           # rows per gather block (rule 8)
    transpose_blocks: int       # gather blocks visited together when a column sweep exceeds L1 (rule 8)
    l1_lines: int               # cache lines L1 holds (rule 8's column sweep)
    way_elements: int           # elements between rows that fall in one L1 set (rule 3's uncrowded lanes)
    min_root: int               # fewest iterations of the parallel root (rule 9)
    weighed_root: int           # root iterations weighed one by one at most (rule 9)


@lru_cache(maxsize=None)
def thresholds() -> Thresholds:
    """The :class:`Thresholds` of the schedule for ``te.target()``."""
    import te_autodiff as te
    from lowering.schedule.aligned_grid import ALIGN_MIN_VECTORS
    from lowering.schedule.blocking import TILE_VECTORS, blocking
    from lowering.schedule.gather_blocks import GATHER_BLOCK, TRANSPOSE_BLOCKS
    from lowering.schedule.lane_reduction import SUM_RUN
    from lowering.schedule.packing import PACK_MIN_REUSE
    from lowering.schedule.parallel_root import MIN_ROOT, WEIGHED_ROOT
    from lowering.schedule.register_tile import GEMM_MIN_TRIPS
    from lowering.schedule.residue_classes import MAX_RESIDUES
    from lowering.schedule.split_reduction import SPLIT_MIN_WORK, SPLIT_PARTS
    from lowering.schedule.vector_axis import PACK_MAX_BYTES
    target = te.target()
    bl = blocking(target)
    return Thresholds(
        lanes=bl.lanes(ITEMSIZE), line=target.cache_line // ITEMSIZE, max_residues=MAX_RESIDUES,
        split_min_work=SPLIT_MIN_WORK, split_parts=tuple(SPLIT_PARTS), align_min_vectors=ALIGN_MIN_VECTORS,
        sum_run=SUM_RUN, pack_min_reuse=PACK_MIN_REUSE, pack_max_elements=PACK_MAX_BYTES // ITEMSIZE,
        gemm_min_trips=GEMM_MIN_TRIPS, tile_rows=bl.tile_rows, tile_vectors=TILE_VECTORS,
        panel_elements=bl.panel_min_bytes // ITEMSIZE, k_block=bl.k_block, k_block_min=bl.k_block_min,
        row_block_elements=bl.row_block_bytes // ITEMSIZE, gather_block=GATHER_BLOCK,
        transpose_blocks=TRANSPOSE_BLOCKS, l1_lines=target.l1_bytes // target.cache_line,
        way_elements=target.l1_bytes // target.l1_ways // ITEMSIZE, min_root=MIN_ROOT, weighed_root=WEIGHED_ROOT)
