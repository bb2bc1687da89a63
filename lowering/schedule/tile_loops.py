"""Builds a :class:`~lowering.schedule.tile_plan.TilePlan`: the copies, the
K blocks, then the tile loops around vector loops of jammed element bodies,
in the plan's order, under a parallel root (rule 9)."""
from __future__ import annotations

from itertools import count

from te_autodiff.expr import Var, add, compare, minimum, mod, mul, sub, var

from ..loop_ir import Block, For, If, Simd, Stage, rename
from .blocking import GATHER_BLOCK
from .ir import as_block, idx, lt
from .jam import jam
from .k_blocks import k_blocked, partial_sums
from .nest import Nest
from .packing import pack
from .parallel_root import loop_chain, with_root
from .tile_plan import TilePlan


def tiled(extent: int, size: int, var_: Var, make, block=None) -> For:
    """A loop over tiles of ``size`` along an axis of ``extent``: ``make(base,
    n, tile)`` builds the code for the ``n`` positions from ``base`` in tile
    number ``tile``; a partial last tile gets its own code behind a (uniform)
    test.  ``block = (b, per)``: only the ``per`` tiles of block ``b`` (a loop
    outside)."""
    full, rest = divmod(extent, size)
    if block is not None:
        b, per = block
        tiles = full + (rest > 0)
        tile = add(mul(b, idx(per)), var_)
        n_tiles = idx(per) if tiles % per == 0 else minimum(idx(per), sub(idx(tiles), mul(b, idx(per))))
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


def _vectors(plan: TilePlan, row_subs, base, n_cols, tile, src, tags, inside=as_block) -> Block:
    """One tile of the element body ``src``: the rows ``row_subs`` by the
    columns ``base .. base + n_cols`` of ``j`` (column tile number ``tile``),
    as full vectors jammed together and a masked last vector, each vector
    loop's body made ``inside(body)``."""
    j, lane, jt, lanes = plan.j, plan.lane, plan.tiles[0], plan.lanes
    full, rest = divmod(n_cols, lanes)
    out = []
    if full:
        # row by row, the vectors of a row together: a row's broadcast is used by its ``full``
        # multiply-adds and dies, so the tile needs its accumulators, ``full`` vectors and one
        # broadcast in registers (all rows' broadcasts stay live in the other order)
        reps = [{**rs, j: add(add(base, idx(c * lanes)), lane), jt: tile} for rs in row_subs for c in range(full)]
        out.append(Simd(lane, idx(0), lanes, idx(lanes), inside(jam(src, reps, tags))))
    if rest:
        reps = [{**rs, j: add(add(base, idx(full * lanes)), lane), jt: tile} for rs in row_subs]
        out.append(Simd(lane, idx(0), lanes, idx(rest), inside(jam(src, reps, tags))))
    return Block(tuple(out))


def _columns(plan: TilePlan, row_subs, src, tags, wrap=lambda b: b, inside=as_block) -> For:
    """The column tiles of ``nr`` vectors along ``j`` for the rows ``row_subs``
    (each tile made ``wrap(tile)``, each vector loop's body ``inside(body)``)."""
    return tiled(plan.j_extent, plan.nr * plan.lanes, var(f"{plan.j.name}.o"),
                 lambda base, n_cols, tile: wrap(_vectors(plan, row_subs, base, n_cols, tile, src, tags, inside)))


def _row_subs(plan: TilePlan, base, n_rows: int, tile) -> list:
    return [{plan.i: add(base, idx(r)), plan.tiles[1]: tile} for r in range(n_rows)]


def _rows(plan: TilePlan, body, segments, tile_of, block=None):
    """The row tiles, ``tile_of(row_subs, element body)`` making one; in
    ``segments`` when the row range is peeled, in blocks ``block = (b, per)``
    when blocked."""
    name = f"{plan.i.name}.o"
    if segments is None:
        return tiled(plan.i_extent, plan.mr, var(name),
                     lambda base, n, tile: tile_of(_row_subs(plan, base, n, tile), body), block)
    return Block(tuple(
        tiled(n_rows, plan.mr, var(name), lambda base, n, tile, first=first, src=src:
              tile_of(_row_subs(plan, add(base, idx(first)), n, tile), src))
        for first, n_rows, src in segments))


def _column_tile(plan: TilePlan, body, segments, block, tags, base, n_cols, tile):
    """One column tile of a columns-first plan: (K blocks,) row tiles."""
    row_tiles = _rows(plan, body, segments, lambda rs, src: _vectors(plan, rs, base, n_cols, tile, src, tags), block)
    kb = plan.k_blocks
    return as_block(row_tiles if kb is None else For(kb.var, idx(0), idx(kb.count), as_block(row_tiles)))


def _columns_first(plan: TilePlan, body, segments, tags) -> For:
    """(Row blocks,) column tiles, (K blocks,) row tiles."""
    block = None if plan.row_block is None else (var(f"{plan.i.name}.b"), plan.row_block)
    loop = tiled(plan.j_extent, plan.nr * plan.lanes, var(f"{plan.j.name}.o"),
                 lambda base, n_cols, tile: _column_tile(plan, body, segments, block, tags, base, n_cols, tile))
    if block is None:
        return loop
    tiles = -(-plan.i_extent // plan.mr)
    return For(block[0], idx(0), idx(-(-tiles // plan.row_block)), Block((loop,)))


def _gather_blocks(plan: TilePlan, body, tags) -> For:
    """Rule 8: blocks of ``GATHER_BLOCK`` rows of ``b``, each visited inside
    every column tile, ``plan.together`` neighbouring blocks one after the
    other (``tile_plan.blocks_together``): around the vector loop, or inside
    it as a loop of kind ``transpose`` (``plan.transpose``), where a partial
    last block is a loop of its own so that every whole one has a constant
    extent (transposed in registers; only the last gathers)."""
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
        tiles = _columns(plan, [row], body, tags, wrap, inside)
    elif plan.transpose:
        def inside(blk):
            def rows(n):
                return Block((For(b_in, idx(0), idx(n), blk, "transpose"),))
            return rows(GATHER_BLOCK) if rest == 0 else Block((If(lt(block, full), rows(GATHER_BLOCK), rows(rest)),))
        tiles = _columns(plan, [row], body, tags, wrap, inside)
    else:
        n_rows = idx(GATHER_BLOCK) if rest == 0 else minimum(
            idx(GATHER_BLOCK), sub(idx(b_extent), mul(block, idx(GATHER_BLOCK))))
        tiles = _columns(plan, [row], body, tags, lambda blk: wrap(Block((For(b_in, idx(0), n_rows, blk),))))
    return For(outer, idx(0), idx(-(-blocks // together)), Block((tiles,)))


def _tile_loops(plan: TilePlan, body):
    """The tile loops of ``plan`` around the (packed, K-blocked) element body."""
    tags = count()
    if plan.gather is not None:
        return _gather_blocks(plan, body, tags)
    if plan.i is None:
        return _columns(plan, [{}], body, tags)
    segments = None if plan.peel is None else plan.peel.segments(plan.i_extent, body)
    if plan.columns_first:
        return _columns_first(plan, body, segments, tags)
    return _rows(plan, body, segments, lambda rs, src: Block((_columns(plan, rs, src, tags),)))


def build_tiles(plan: TilePlan, nest: Nest, stage: Stage, taken: set, new_stages: list, new_buffers: list,
                threads: int):
    """``(stages, tail)``: ``stage`` scheduled by ``plan`` (its copies join
    ``new_stages``; the parallel root balanced over ``threads``), and the
    K-block epilogue stage still to schedule (None without one)."""
    body = pack(plan.body, plan.copies, taken, new_stages, new_buffers)
    epilogue, kb = None, plan.k_blocks
    if kb is not None:
        sums = None if kb.in_place else partial_sums(nest, plan.j, stage.name, kb.acc.dtype, taken, new_buffers)
        body, epilogue = k_blocked(body, kb, stage.buffer, sums)
    loops = _tile_loops(plan, body)
    rows = plan.gather[0] if plan.gather is not None else plan.i
    chain = [lp for lp in nest.loops if lp.var is not rows and lp.var is not plan.j]
    chain += loop_chain(loops) if isinstance(loops, For) else []
    movable = {lp.var for lp in chain} - ({kb.var} if kb is not None else set())
    nest_ir = with_root(chain, chain[-1].body if isinstance(loops, For) else loops, threads, movable)
    if epilogue is None:
        return [Stage(stage.name, stage.buffer, nest_ir)], None
    sums, store = epilogue
    return [Stage(sums.name, sums, nest_ir)], Stage(stage.name, stage.buffer, nest.around(Block((store,))))
