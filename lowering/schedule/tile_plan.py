"""The plan of a stage whose output axis ``j`` runs in vector lanes: the tile
rules, from ``register_tile.py`` to ``vector_width.py``, each add their
decision to one :class:`TilePlan`, which ``tile_loops.py`` (and
``gather_blocks.py``) then build."""
from __future__ import annotations

from dataclasses import dataclass

from te_autodiff.expr import Var, var

from ..loop_ir import Block, Buffer, stride
from .blocking import Blocking
from .k_blocks import KBlocks
from .nest import Nest, accesses_of, loop_ranges
from .row_peeling import Peel
from .vector_axis import VectorAxis
from .vector_width import lanes_for


@dataclass(frozen=True)
class TilePlan:
    """How the output loops of a stage become tiles of vector loops.

    ``body``: the element body (its tests that differ between lanes as
    selects), storing into ``out``; ``accesses`` and ``inner`` (the ranges of
    the loops inside it) as the vector axis left it.  ``j`` (``j_extent``
    iterations) runs in vector loops of ``lanes`` lanes over ``lane``, in
    column tiles numbered ``jt``.  ``copies``: the loads read from copies
    (``transposed_copies.py``, ``panels.py``).  A register tile
    (``register_tile.py``) is ``mr`` rows of ``i`` (``i_extent``, row tiles
    numbered ``it``) by ``nr`` vectors; with it come ``k_blocks``,
    ``row_blocks`` (how many blocks of rows, ``row_blocks.py``),
    ``column_group`` (column tiles per stage, ``column_groups.py``) and
    ``peel`` (``row_peeling.py``).  Without one, ``gather`` is ``(b,
    extent)``: the loop visited in blocks (``gather_blocks.py``), inside
    the vector loop as a loop of kind ``transpose`` when ``transpose``,
    ``together`` neighbouring blocks in each column tile, the blocks
    starting ``shift`` (a run-time expression) into ``b``.
    ``masked_rest``: a partial last vector is one masked vector (a target
    with mask registers), else, for a body without loops, vectors of
    decreasing powers of two (``tile_loops._pieces``)."""

    body: Block
    out: Buffer
    accesses: list
    inner: dict
    j: Var
    j_extent: int
    lanes: int
    lane: Var
    jt: Var
    copies: tuple
    i: Var | None = None
    it: Var | None = None
    i_extent: int = 1
    mr: int = 1
    nr: int = 1
    k_blocks: KBlocks | None = None
    row_blocks: int | None = None
    column_group: int | None = None
    peel: Peel | None = None
    gather: tuple | None = None
    transpose: bool = False
    together: int = 1
    shift: object = None
    masked_rest: bool = True

    @property
    def columns_first(self) -> bool:
        """Column tiles outside the row tiles: with K blocks or column panels
        (a column panel stays in cache while the row tiles pass)."""
        return self.k_blocks is not None or any(c.panel is not None and c.panel[1] is self.jt for c in self.copies)

    def walks_down_columns(self, index, step: Var, itemsize: int, line: int) -> bool:
        """Whether a load at ``index`` walks down a row operand's columns: it
        moves with the tile's rows, not with its columns, and a line or more
        per reduction ``step`` (``k_blocks._walk_steps``, ``prefetch._walks``);
        False where a stride is not constant (an index read from data)."""
        rows, steps = stride(index, self.i), stride(index, step)
        return stride(index, self.j) == 0 and rows not in (0, None) and steps is not None and abs(steps) * itemsize >= line

    @property
    def pinned(self) -> tuple:
        """The loops the parallel root must not move: the K blocks (each
        combines its partial result with the blocks' before it)."""
        return () if self.k_blocks is None else (self.k_blocks.var,)

    @property
    def shared(self) -> tuple:
        """The loops whose inner loops share a block of the rows: K blocks
        taken by row blocks (BLIS's order, ``tile_loops.py``)."""
        kb = self.k_blocks
        return (kb.var,) if kb is not None and self.row_blocks is not None else ()

    def untiled(self, nest: Nest) -> list:
        """The output loops neither the vector loop nor the row tiles (or gather blocks) replace."""
        rows = self.gather[0] if self.gather is not None else self.i
        return [lp for lp in nest.loops if lp.var is not rows and lp.var is not self.j]


def start(nest: Nest, axis: VectorAxis, out: Buffer, bl: Blocking) -> TilePlan:
    """The :class:`TilePlan` of ``nest`` (storing into ``out``, its tests
    already selects) for the vector axis ``axis.j``, with its transposed
    copies: one native vector of the widest element read or written along
    ``j``, no wider than ``j`` rounded up to a power of two."""
    j = axis.j
    accesses = accesses_of(nest.body)
    j_extent = nest.extent(j)
    lanes = min(lanes_for([a for a in accesses if stride(a.index, j) != 0], bl),
                max(4, 1 << (j_extent - 1).bit_length()))
    inner = {v: r for v, r in loop_ranges(nest).items() if v not in set(nest.vars)}
    return TilePlan(nest.body, out, accesses, inner, j, j_extent, lanes, var(f"{j.name}.l"), var(f"{j.name}.t"),
                    axis.copies, masked_rest=bl.target.mask_registers)
