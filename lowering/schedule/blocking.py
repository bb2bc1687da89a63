"""The schedule's figures for one target: :class:`Blocking`, derived from the
:class:`~lowering.target.Target` (never tuned to one CPU).  The fixed
thresholds of the rules (the same on every CPU) live in the rules' modules."""
from __future__ import annotations

from dataclasses import dataclass
from math import isqrt

from ..target import PAGE_BYTES, Target

TILE_VECTORS = 2             # NR: vectors of a register tile (one row of a tile is two vectors)
MAX_TILE_ROWS = 8            # MR at most: more rows add remainder code more than they save loads
CHAIN_REGISTERS = 4          # vector registers one chain of a fast_math function keeps live (chained_lanes)


def pow2_floor(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


@dataclass(frozen=True)
class Blocking:
    """The schedule's figures for one :class:`~lowering.target.Target`, each
    derived from the target's description (never tuned to one CPU):

    * ``lanes(itemsize)``: one native vector of elements (16 float32 on
      AVX-512, 8 on AVX2, 4 on SSE and NEON);
    * register tile ``tile_rows x TILE_VECTORS`` vectors: the accumulators
      plus the ``TILE_VECTORS`` vector loads and one broadcast of a
      reduction step fill the register file (16 registers: 6 x 2, BLIS's
      haswell 6x16; 32 registers: 8 x 2, capped by ``MAX_TILE_ROWS``);
    * ``k_block``: reduction steps per block, the largest power of two whose
      ``k_block x TILE_VECTORS`` vector slice of the column operand fills at
      most two thirds of L1 (the rest holds a row tile's operands and the
      output tile), for an operand read in place;
    * ``k_block_panel``: the same from a column panel, whose slice may fill
      half of L2: a panel is read in address order, which the prefetcher
      streams from L2 ahead of the multiply-adds, while each block costs a
      reload and a store of every output tile; a reduction longer than 1.5
      blocks is blocked (:meth:`k_block_min`);
    * ``panel_min_bytes``: operands larger than L1 (the power of two at or
      above it) are read from panels;
    * ``row_block_bytes``: half of L2 (a power of two), the row operand's
      share while the column panels pass;
    * ``panel_group_bytes``: the threads' share of L3, the most of a column
      operand that blocks of rows re-read from L3 rather than from memory
      (``column_groups.py``; 0 without an L3);
    * ``prefetch_bytes``: how far ahead a register tile asks for a column
      panel streaming from beyond L2 (``prefetch.py``): one page, the
      reach of the hardware's stream prefetchers, which stop at its end;
    * ``math_chains``: the vectors a body applying exp, tanh... runs side
      by side (:func:`~lowering.schedule.vector_width.chained_lanes`): as many
      chains as the register file holds at ``CHAIN_REGISTERS`` live vectors
      each (the value, the polynomial's sum, the reduced argument and its
      scale): 8 with 32 registers, 4 with 16; 1 for the stages of a scan's
      step."""

    target: Target
    tile_rows: int
    k_block: int
    k_block_panel: int
    panel_min_bytes: int
    row_block_bytes: int
    panel_group_bytes: int
    prefetch_bytes: int
    math_chains: int

    def k_block_l1(self, step_bytes: int) -> int:
        """``k_block``'s rule for ``step_bytes`` a step."""
        return _l1_steps(self.target, step_bytes)

    @staticmethod
    def k_block_min(size: int) -> int:
        """The shortest reduction cut into blocks of ``size``."""
        return size * 3 // 2

    def k_block_rows(self, itemsize: int) -> int:
        """Steps per K block of a reduction already cut into blocks whose
        partial sums stay in the output, so that blocks of rows take them
        (BLIS's KC, ``row_blocks.py``).  Per multiply-add a column panel
        costs ``s / MC`` bytes from L3 (re-read per block of ``MC`` rows,
        ``MC * KC * s`` = ``row_block_bytes``) and the output tile ``2s /
        KC`` (reloaded and stored per block): least at ``KC = sqrt(2 *
        row_block_bytes / s)``, a power of two at or below it."""
        return pow2_floor(isqrt(2 * self.row_block_bytes // itemsize))

    def lanes(self, itemsize: int) -> int:
        return self.target.lanes(itemsize)


def _l1_steps(target: Target, step_bytes: int) -> int:
    """The most reduction steps, a power of two, whose ``step_bytes`` each
    fill at most two thirds of L1 (the rest holds a row tile's operands and
    the output tile)."""
    return pow2_floor(target.l1_bytes * 2 // 3 // step_bytes)


def blocking(target: Target) -> Blocking:
    """The :class:`Blocking` of ``target`` (see there for each derivation)."""
    regs = target.vector_registers
    rows = min(MAX_TILE_ROWS, (regs - TILE_VECTORS - 1) // TILE_VECTORS)
    slice_row = TILE_VECTORS * target.vector_bytes
    return Blocking(target, rows, _l1_steps(target, slice_row), pow2_floor(target.l2_bytes // 2 // slice_row),
                    1 << (target.l1_bytes - 1).bit_length(),
                    pow2_floor(target.l2_bytes // 2), target.l3_bytes * target.threads, PAGE_BYTES,
                    max(1, regs // CHAIN_REGISTERS))
