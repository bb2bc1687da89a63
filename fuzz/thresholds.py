"""The schedule's thresholds, read from the schedule and the target at run time.

The large programs (``large.py``) take extents on both sides of every
threshold at which a schedule rule (``lowering/schedule/__init__.py`` lists
them, one module each) changes its decision; the figures come from the rule
modules' own constants and from :func:`~lowering.schedule.blocking.blocking` of ``te.target()`` (the
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
    lanes: int                  # elements per native vector (vector_axis, vector_width)
    line: int                   # elements per aligned block: interior split ends (interior_split)
    max_residues: int           # largest modulus split into residue classes (residue_classes)
    split_min_work: int         # reductions to one element this long are split (split_reduction) ...
    split_parts: tuple          # ... when their outer extent is a multiple of one of these
    align_min_vectors: int      # vectors of a reduction in lanes from which it starts on lines (aligned_grid)
    sum_run: int                # vectors a lane adds before its running total, from 8 runs (lane_reduction)
    pack_min_reuse: int         # re-reads of an operand worth a packed copy (packing, panels)
    gemm_min_trips: int         # reduction length worth a register tile (register_tile)
    tile_rows: int              # rows of a register tile (register_tile, row_peeling)
    tile_vectors: int           # vectors of a register tile's row (register_tile)
    math_chains: int            # vectors a step of a body of chained math functions takes (vector_width)
    panel_elements: int         # operands at least this large are read from panels (panels)
    k_block: int                # reduction steps per K block (k_blocks) ...
    k_block_min: int            # ... for reductions longer than this
    k_block_panel_min: int      # the same when the column operand is a panel (k_block_panel)
    row_block_elements: int     # row operands larger than this are visited in row blocks (row_blocks)
    gather_block: int           # rows per gather block (gather_blocks)
    transpose_blocks: int       # gather blocks visited together when a column sweep exceeds L1 (gather_blocks)
    l1_lines: int               # cache lines L1 holds (gather_blocks' column sweep)
    way_elements: int           # elements between rows that fall in one L1 set (vector_width's uncrowded lanes)
    min_root: int               # fewest iterations of the parallel root (parallel_root)
    weighed_root: int           # root iterations weighed one by one at most (parallel_root)
    math_functions: tuple       # operators with an inline vector body: the chains of vector_width
    accumulators: int           # sums a tile keeps in flight, else its reductions feed partial sums (sum_chains)


@lru_cache(maxsize=None)
def thresholds() -> Thresholds:
    """The :class:`Thresholds` of the schedule for ``te.target()``."""
    import te_autodiff as te
    from lowering.fast_math import BODIES
    from te_autodiff.ops import unary_names
    from lowering.schedule.aligned_grid import ALIGN_MIN_VECTORS
    from lowering.schedule.blocking import TILE_VECTORS, Blocking, blocking
    from lowering.schedule.gather_blocks import GATHER_BLOCK, TRANSPOSE_BLOCKS
    from lowering.schedule.lane_reduction import SUM_RUN
    from lowering.schedule.packing import PACK_MIN_REUSE
    from lowering.schedule.parallel_root import MIN_ROOT, WEIGHED_ROOT
    from lowering.schedule.register_tile import GEMM_MIN_TRIPS
    from lowering.schedule.residue_classes import MAX_RESIDUES
    from lowering.schedule.split_reduction import SPLIT_MIN_WORK, SPLIT_PARTS
    from lowering.throughput import ACCUMULATORS
    target = te.target()
    bl = blocking(target)
    return Thresholds(
        lanes=bl.lanes(ITEMSIZE), line=target.alignment // ITEMSIZE, max_residues=MAX_RESIDUES,
        split_min_work=SPLIT_MIN_WORK, split_parts=tuple(SPLIT_PARTS), align_min_vectors=ALIGN_MIN_VECTORS,
        sum_run=SUM_RUN, pack_min_reuse=PACK_MIN_REUSE,
        gemm_min_trips=GEMM_MIN_TRIPS, tile_rows=bl.tile_rows, tile_vectors=TILE_VECTORS,
        math_chains=bl.math_chains,
        panel_elements=bl.panel_min_bytes // ITEMSIZE, k_block=bl.k_block,
        k_block_min=Blocking.k_block_min(bl.k_block), k_block_panel_min=Blocking.k_block_min(bl.k_block_panel),
        row_block_elements=bl.row_block_bytes // ITEMSIZE, gather_block=GATHER_BLOCK,
        transpose_blocks=TRANSPOSE_BLOCKS, l1_lines=target.l1_bytes // target.cache_line,
        way_elements=target.l1_bytes // target.l1_ways // ITEMSIZE, min_root=MIN_ROOT, weighed_root=WEIGHED_ROOT,
        math_functions=tuple(sorted(op for op, dtype in BODIES if dtype == "float64" and op in unary_names()
                                    and op != "sign")), accumulators=ACCUMULATORS)
