"""Row peeling: tests that read the row variable ``i`` of a register tile
(padding, ``0 <= i + d - 2 < H`` for every tap ``d``) are decided on an
interior range of ``i`` (``interior.py``): the row tiles entirely inside it
run without those tests, the tiles at either end with them.  A test on the
row would otherwise be repeated for each row of a tile.  The cuts fall on
the tiles' own boundaries, so peeling never makes a tile smaller: a border
of one row as a tile of its own would hold too few accumulators to hide the
multiply-add latency (a 3x3 convolution's gradient, rows 0 and H - 1), a
cost far above the tests it saves.  The peeled row ranges
are sibling loops, so another output loop must be the parallel root: the
rule needs a third output loop, and neither row panels nor row blocks."""
from __future__ import annotations

from dataclasses import dataclass, replace

from te_autodiff.expr import Var

from .interior import drop_tests, interior
from .nest import Nest


@dataclass(frozen=True)
class Peel:
    """On rows ``lo <= i < hi`` (whole tiles) each test term of ``tests``
    (pairs ``(term, value)``) always has its value."""

    lo: int
    hi: int
    tests: tuple


def whole_tiles(lo: int, hi: int, extent: int, mr: int):
    """``(first, end)``: the rows of the tiles of ``extent`` rows in tiles of
    ``mr`` (the last one partial) that lie within ``lo <= i < hi``; None
    when none does."""
    first = -(-max(lo, 0) // mr) * mr
    end = extent if hi >= extent else hi // mr * mr
    return (first, end) if first < end else None


def _peel(extent: int, mr: int, body, i: Var, inner: dict):
    """The :class:`Peel` of ``extent`` rows in tiles of ``mr`` whose tests in
    ``body`` read ``i`` (``inner``: the ranges of the loops inside): the
    tiles inside the interior; None when no tile is."""
    found = interior(body, i, extent, inner)
    if found is None or not found[2]:
        return None
    rows = whole_tiles(found[0], found[1], extent, mr)
    return None if rows is None else Peel(*rows, found[2])


def decide(plan, nest: Nest):
    """``plan`` (a :class:`~lowering.schedule.tile_plan.TilePlan`) with the
    :class:`Peel` of its register tile's rows; unchanged when there is none."""
    if plan.i is None or len(nest.vars) < 3 or plan.row_blocks is not None or \
            any(c.panel is not None and c.panel[1] is plan.it for c in plan.copies):
        return plan
    return replace(plan, peel=_peel(plan.i_extent, plan.mr, plan.body, plan.i, plan.inner))


def build(peel: Peel, extent: int, body) -> list:
    """The row range ``0..extent`` as ``[(first, length, element body)]``:
    border, interior (``body`` without the tests), border."""
    segments = [(0, peel.lo, body), (peel.lo, peel.hi - peel.lo, drop_tests(body, peel.tests)),
                (peel.hi, extent - peel.hi, body)]
    return [seg for seg in segments if seg[1] > 0]
