"""The tile loops of a :class:`~lowering.schedule.tile_plan.TilePlan`: column
tiles of ``NR`` vectors along ``j``, each vector loop running the element
body jammed over the tile's rows and vectors (``jam.py``: full vectors
together, then a partial last vector), and with a register tile the row tiles of
``MR`` rows of ``i``, in the order the plan says: (row blocks, from
``row_blocks.py``,) column tiles, K blocks (``k_blocks.py``), row tiles
when the column tiles run first (row blocks and K blocks: BLIS's order,
K blocks outside the column tiles), else row tiles around column tiles; the
row tiles in peeled segments (``row_peeling.py``).  A partial last tile gets
its own code behind a test that is the same for every lane, and so does a
register tile's version for a mask it decides (``tile_tests.py``)."""
from __future__ import annotations

from itertools import count

from te_autodiff.expr import Var, add, floordiv, mul, sub, var

from ..loop_ir import Block, For, If, Simd, walk
from . import row_peeling, tile_tests
from .constructors import as_block, idx, lt
from .jam import jam
from .tile_plan import TilePlan
from .vector_width import math_depth


def tiled(extent: int, size: int, var_: Var, make, block=None) -> For:
    """A loop over tiles of ``size`` along an axis of ``extent``: ``make(base,
    n, tile)`` builds the code for the ``n`` positions from ``base`` in tile
    number ``tile``; a partial last tile gets its own code behind a (uniform)
    test.  ``block = (b, blocks)``: only the tiles of block ``b`` of ``blocks``
    (a loop outside, :func:`block_of`)."""
    full, rest = divmod(extent, size)
    if block is not None:
        first, n_tiles = block_of(full + (rest > 0), *block)
        tile = add(first, var_)
        base = mul(tile, idx(size))
        if rest == 0:
            return For(var_, idx(0), n_tiles, make(base, size, tile))
        test = If(lt(tile, full), Block((make(base, size, tile),)), Block((make(base, rest, tile),)))
        return For(var_, idx(0), n_tiles, Block((test,)))
    base = mul(var_, idx(size))
    if rest == 0:
        return For(var_, idx(0), idx(full), make(base, size, var_))
    if full == 0:
        return For(var_, idx(0), idx(1), make(idx(0), rest, idx(0)))
    test = If(lt(var_, full), Block((make(base, size, var_),)), Block((make(base, rest, var_),)))
    return For(var_, idx(0), idx(full + 1), Block((test,)))


def block_of(tiles: int, b: Var, blocks: int):
    """The first tile and the tile count of block ``b`` of ``blocks`` blocks
    of ``tiles`` tiles: ``floor(b tiles / blocks)`` onwards, so the blocks
    differ by at most one tile and so do any equal runs of them (a thread's
    share of the root: 86 tiles in 8 blocks give two threads 43 each, where
    blocks of 11 and a last of 9 gave 44 and 42)."""
    if tiles % blocks == 0:
        return mul(b, idx(tiles // blocks)), idx(tiles // blocks)
    first = floordiv(mul(b, idx(tiles)), idx(blocks))
    return first, sub(floordiv(mul(add(b, idx(1)), idx(tiles)), idx(blocks)), first)


def _vectors(plan: TilePlan, row_subs, base, n_cols, tile, src, tags, inside=as_block) -> Block:
    """One tile of the element body ``src``: the rows ``row_subs`` by the
    columns ``base .. base + n_cols`` of ``j`` (column tile number ``tile``),
    as full vectors jammed together and a partial last vector (masked, or
    pieces: ``TilePlan.masked_rest``), each vector loop's body made
    ``inside(body)``; a register tile in versions for the tests the whole
    tile decides (``tile_tests.py``)."""
    def make(body):
        return _tile(plan, row_subs, base, n_cols, tile, body, tags, inside)
    if plan.i is None:
        return make(src)
    ranges = {plan.i: (row_subs[0][plan.i], row_subs[-1][plan.i]), plan.j: (base, add(base, idx(n_cols - 1)))}
    return tile_tests.decided(src, ranges, make)


def _tile(plan: TilePlan, row_subs, base, n_cols, tile, src, tags, inside) -> Block:
    """:func:`_vectors` without the versions."""
    j, lane, jt, lanes = plan.j, plan.lane, plan.jt, plan.lanes
    full, rest = divmod(n_cols, lanes)
    out = []
    if full:
        # row by row, the vectors of a row together: a row's broadcast is used by its ``full``
        # multiply-adds and dies, so the tile needs its accumulators, ``full`` vectors and one
        # broadcast in registers (all rows' broadcasts stay live in the other order)
        reps = [{**rs, j: add(add(base, idx(c * lanes)), lane), jt: tile} for rs in row_subs for c in range(full)]
        out.append(Simd(lane, idx(0), lanes, idx(lanes), inside(jam(src, reps, tags))))
    if rest and (plan.masked_rest or not _pieces_pay(src, rest)):
        reps = [{**rs, j: add(add(base, idx(full * lanes)), lane), jt: tile} for rs in row_subs]
        out.append(Simd(lane, idx(0), lanes, idx(rest), inside(jam(src, reps, tags))))
    elif rest:
        first = full * lanes
        for width in _pieces(rest):                  # the last lane alone is a scalar
            at = add(base, idx(first)) if width == 1 else add(add(base, idx(first)), lane)
            body = inside(jam(src, [{**rs, j: at, jt: tile} for rs in row_subs], tags))
            out.append(body if width == 1 else Simd(lane, idx(0), width, idx(width), body))
            first += width
    return Block(tuple(out))


def _pieces(n: int) -> list:
    """``n`` as decreasing powers of two."""
    return [1 << b for b in reversed(range(n.bit_length())) if n >> b & 1]


def _pieces_pay(src, rest: int) -> bool:
    """Whether the last ``rest`` lanes of ``src`` run as :func:`_pieces`
    (full narrower vectors) rather than one masked vector, whose masked
    stores are microcoded on AVX2 and a branch per lane on SSE: when one
    piece does it (the same work, narrower), or when the body is light
    enough to repeat (no loop, branch or math function: a copy, a map).
    Otherwise each piece would run the loop or the function again, for
    masked loads that cost little."""
    if rest & (rest - 1) == 0:
        return True
    return not any(isinstance(x, (For, If)) for x in walk(src)) and math_depth(src) == 0


def columns(plan: TilePlan, row_subs, src, tags, wrap=lambda b: b, inside=as_block) -> For:
    """The column tiles of ``nr`` vectors along ``j`` for the rows ``row_subs``
    (each tile made ``wrap(tile)``, each vector loop's body ``inside(body)``)."""
    return tiled(plan.j_extent, plan.nr * plan.lanes, var(f"{plan.j.name}.o"),
                 lambda base, n_cols, tile: wrap(_vectors(plan, row_subs, base, n_cols, tile, src, tags, inside)))


def _row_subs(plan: TilePlan, base, n_rows: int, tile) -> list:
    return [{plan.i: add(base, idx(r)), plan.it: tile} for r in range(n_rows)]


def _rows(plan: TilePlan, body, segments, tile_of, block=None):
    """The row tiles, ``tile_of(row_subs, element body)`` making one; in
    ``segments`` when the row range is peeled, in blocks ``block = (b,
    blocks)`` when blocked."""
    name = f"{plan.i.name}.o"
    if segments is None:
        return tiled(plan.i_extent, plan.mr, var(name),
                     lambda base, n, tile: tile_of(_row_subs(plan, base, n, tile), body), block)
    return Block(tuple(
        tiled(n_rows, plan.mr, var(name), lambda base, n, tile, first=first, src=src:
              tile_of(_row_subs(plan, add(base, idx(first)), n, tile), src))
        for first, n_rows, src in segments))


def _column_tile(plan: TilePlan, body, segments, block, tags, base, n_cols, tile, k_inside: bool):
    """One column tile of a columns-first plan: (K blocks,) row tiles."""
    row_tiles = _rows(plan, body, segments, lambda rs, src: _vectors(plan, rs, base, n_cols, tile, src, tags), block)
    kb = plan.k_blocks
    return as_block(row_tiles if kb is None or not k_inside else
                    For(kb.var, idx(0), idx(kb.count), as_block(row_tiles)))


def _columns_first(plan: TilePlan, body, segments, tags, group=None) -> For:
    """(Row blocks,) column tiles, (K blocks,) row tiles; with row blocks
    and K blocks, BLIS's order: row blocks, K blocks, column tiles, row
    tiles, so a block of rows' slice of one K block stays in L2 while every
    column panel's slice passes once, instead of the rows' whole reduction
    re-read per column tile (the parallel root moves the K blocks out of
    the untiled output loops around them too, ``parallel_root.py``).
    ``group = (first, n)``: only column tiles ``first .. first + n``."""
    block = None if plan.row_blocks is None else (var(f"{plan.i.name}.b"), plan.row_blocks)
    kb = plan.k_blocks
    k_inside = block is None or kb is None
    width = plan.nr * plan.lanes
    first, extent = (0, plan.j_extent) if group is None else \
        (group[0], min(group[1] * width, plan.j_extent - group[0] * width))
    loop = tiled(extent, width, var(f"{plan.j.name}.o"),
                 lambda base, n_cols, tile: _column_tile(plan, body, segments, block, tags,
                                                         add(base, idx(first * width)), n_cols,
                                                         add(tile, idx(first)), k_inside))
    if block is None:
        return loop
    if not k_inside:
        loop = For(kb.var, idx(0), idx(kb.count), Block((loop,)))
    return For(block[0], idx(0), idx(plan.row_blocks), Block((loop,)))


def build(plan: TilePlan, body, group=None):
    """The tile loops of ``plan`` (without gather blocks) around the (packed,
    K-blocked) element ``body``: column tiles of vector loops, or with a
    register tile (row blocks,) column tiles, (K blocks,) row tiles, or row
    tiles, column tiles; the row tiles in peeled segments; only the column
    tiles of ``group`` (``column_groups.parts``) when given."""
    tags = count()
    if plan.i is None:
        return columns(plan, [{}], body, tags)
    segments = None if plan.peel is None else row_peeling.build(plan.peel, plan.i_extent, body)
    if plan.columns_first:
        return _columns_first(plan, body, segments, tags, group)
    return _rows(plan, body, segments, lambda rs, src: Block((columns(plan, rs, src, tags),)))
