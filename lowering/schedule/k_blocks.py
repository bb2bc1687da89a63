"""K blocks: a GEMM reduction longer than ``Blocking.k_block_min`` is cut into
equal blocks of at most ``Blocking.k_block`` steps (``k_block_panel`` when
the column operand is read from a panel; a reduction over a perfect nest of
loops, a convolution's weight gradient over images, rows and columns, is
cut along its outer loop, at least one of its iterations a block), and the
loops are ordered column tiles, K blocks, row tiles: a block x tile-width
slice of the column operand stays in L1 (in L2 for a panel, streamed in
address order) while the row tiles pass.  A reduction so cut from a panel
whose partial sums stay in the output takes blocks of ``k_block_rows``
instead (BLIS's KC): blocks of rows take its K blocks (``row_blocks.py``),
and the shorter the blocks the more rows a block holds, so the panel is
re-read from L3 for fewer of them.  So is a reduction too short to cut
for its panel whose row operand, read in place down its columns, would
give a block of rows more lines than ``row_block_bytes``, in blocks short
enough for a row tile's walk down those columns to stay in L1 until the
next tiles read the rest of its lines (:func:`decide`).

Each block sums its own steps from the reduction's identity, in order, and
then combines the partial sum the blocks before left: the output tile's
reload (from L3 once a block of rows' outputs has left L2) is issued with
the multiply-adds it no longer delays.  An element's value is the sum of
its blocks' sums, each in step order: a reassociation within the error
bound of the unblocked sum, the same on every call and thread count."""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

import numpy as np

from te_autodiff.expr import BinOp, Const, Var, add, binop, compare, identity_of, minimum, mul, sub, var

from ..loop_ir import Alloc, Assign, Block, BufLoad, Buffer, For, If, Local, Stage, Store, stride, substitute, walk
from . import row_blocks
from .blocking import Blocking
from .constructors import Temporaries, idx, linear
from .nest import Nest, trips


@dataclass(frozen=True)
class KBlocks:
    """The plan for a reduction of ``steps`` iterations into ``acc``, each
    step ``acc = combine(acc, term)``: ``count`` blocks of ``size``,
    numbered by ``var``; ``in_place``: the partial sums stay in the output
    (contiguous along ``j``, same dtype), else in a temporary read by a
    separate epilogue."""

    acc: Local
    combine: str
    steps: int
    count: int
    size: int
    in_place: bool
    var: Var


def _k_blocks(body: Block, out: Buffer, j: Var, size: int):
    """The :class:`KBlocks` of a GEMM-like element body ``acc = identity;
    for k: acc = acc op ...; out[idx] = f(acc)`` (``op`` a reduction's
    operator, ``identity`` its neutral element) whose loop is longer than
    ``Blocking.k_block_min(size)``: equal blocks of at most ``size``
    iterations (784 = 4 x 196: no short last block paying a whole block's
    loads and stores of the accumulators).  None for any other body."""
    stmts = body.stmts
    if len(stmts) < 3 or not isinstance(stmts[-1], Store) or stmts[-1].buffer is not out:
        return None
    loops = [k for k, x in enumerate(stmts) if isinstance(x, For)]
    if len(loops) != 1 or loops[0] != len(stmts) - 2:
        return None
    loop = stmts[-2]
    inner = _inner_steps(loop)
    if inner is None or not (isinstance(loop.lo, Const) and isinstance(loop.extent, Const)) \
            or loop.extent.value < 2 or loop.extent.value * inner <= Blocking.k_block_min(size):
        return None
    writes = {x.local for x in walk(loop) if isinstance(x, Assign)}
    declared = {x.local for x in walk(loop) if isinstance(x, Alloc)}
    (acc,) = writes - declared if len(writes - declared) == 1 else (None,)
    combine = _combine(loop, acc)
    if combine is None or not all(
            isinstance(x, Alloc) and x.local is acc and isinstance(x.init, Const)
            and x.init.value == identity_of(COMBINING[combine], acc.dtype) for x in stmts[:-2]):
        return None
    n, size = loop.extent.value, max(1, size // inner)
    count = -(-n // size)
    in_place = stride(stmts[-1].index, j) == 1 and acc.dtype == out.dtype
    return KBlocks(acc, combine, n, count, -(-n // count), in_place, var("k.b"))


COMBINING = {"add": "sum", "mul": "prod", "max": "max", "min": "min"}   # operator -> reduction (``lower._COMBINE``)


def _combine(loop: For, acc: Local):
    """The operator of every update of ``acc`` in ``loop`` (``acc = acc op
    term``), None if they are anything else."""
    ops = {x.value.op if isinstance(x.value, BinOp) and x.value.a is acc else None
           for x in walk(loop) if isinstance(x, Assign) and x.local is acc}
    (op,) = ops if len(ops) == 1 else (None,)
    return op if op in COMBINING else None


def _inner_steps(loop: For):
    """The steps one iteration of ``loop`` makes: the product of the trips of
    the constant loops it holds when they nest perfectly (a convolution's
    weight gradient sums over images, rows and columns), 1 without loops;
    None for any other body."""
    steps, body = 1, loop.body
    while True:
        stmts = body.stmts if isinstance(body, Block) else (body,)
        loops = [x for x in stmts if isinstance(x, For)]
        if not loops:
            return steps
        if len(loops) != 1 or len(stmts) != 1 or not isinstance(loops[0].extent, Const):
            return None
        steps, body = steps * loops[0].extent.value, loops[0].body


def _partial_sums(nest: Nest, j: Var, name: str, dtype, temps: Temporaries):
    """``(buffer, index)``: a temporary for the partial sums of K blocks, the
    output's shape with ``j`` last, and the element's index into it."""
    order = [v for v in nest.vars if v is not j] + [j]
    shape = tuple(nest.extent(v) for v in order)
    return temps.new(f"{name}.sums", shape, dtype), linear(order, shape)


def _k_blocked(body: Block, plan: KBlocks, out: Buffer, sums=None):
    """``body`` in K blocks: block ``plan.var`` sums its share of the
    reduction from the identity, then combines the partial sum the blocks
    before left (the epilogue runs after the last block).  In place the
    partial sums go back into the output as whole vectors; otherwise every
    block stores them into ``sums`` (``(buffer, index)``,
    :func:`_partial_sums`) and a separate epilogue ``out[idx] = f(sum)``
    reads them (one transposing pass instead of a scatter per tile).
    Returns ``(body, epilogue)`` with ``epilogue`` None or ``(buffer, store)``."""
    *head, loop, store = body.stmts
    acc, kb, size = plan.acc, plan.var, plan.size
    sums, at = (out, store.index) if sums is None else sums
    lo = add(loop.lo, mul(kb, idx(size)))
    extent = idx(size) if plan.steps % size == 0 else minimum(idx(size), sub(idx(plan.steps), mul(kb, idx(size))))
    later, last = compare("gt", kb, idx(0)), compare("eq", kb, idx(plan.count - 1))
    keep = Store(sums, at, acc)
    epilogue = None if plan.in_place else \
        (sums, Store(out, store.index, substitute(store.value, {acc: BufLoad(sums, at)})))
    return Block((
        *head,
        For(loop.var, lo, extent, loop.body, loop.kind),
        If(later, Block((Assign(acc, binop(plan.combine, BufLoad(sums, at), acc)),))),
        If(last, Block((store,)), Block((keep,))) if plan.in_place else keep,
    )), epilogue


def _read_down_columns(plan, bl: Blocking) -> list:
    """``(access, bytes)`` of each row operand read in place (not from a
    copy) whose reduction steps are a line or more apart, with the bytes
    its index moves per row."""
    line = bl.target.cache_line
    copied = {(c.access.buffer, c.access.index) for c in plan.copies}
    out = []
    for a in plan.accesses:
        item = np.dtype(a.buffer.dtype).itemsize
        if a.store or not a.loops or (a.buffer, a.index) in copied or \
                not plan.walks_down_columns(a.index, a.loops[-1].var, item, line):
            continue
        out.append((a, abs(stride(a.index, plan.i)) * item))
    return out


def _lines(span: int, line: int) -> int:
    """Lines a span of ``span`` bytes touches at most: one more than it fills
    when not a whole number of lines (18 float32, 72 bytes: three lines;
    6 float32, 24 bytes: two)."""
    return -(-span // line) + (span % line != 0)


def _strided_slice(plan, bl: Blocking) -> int:
    """Bytes of whole cache lines a block of rows, sized by ``row_blocks.py``
    for the whole reduction, reads of the row operands read down their
    columns (:func:`_read_down_columns`): each step reads the lines its
    rows touch.  0 without such an operand."""
    line = bl.target.cache_line
    most = row_blocks.block_tiles(plan, 1, bl)[1]
    return max((prod(trips(lp) for lp in a.loops) * _lines(most * plan.mr * row, line) * line
                for a, row in _read_down_columns(plan, bl)), default=0)


def _walk_steps(plan, bl: Blocking):
    """The most steps of a K block for which a row tile's walk down the
    columns of the row operands read so (:func:`_read_down_columns`) stays
    in L1 beside the column operand's slice, until the next row tiles read
    the rest of those lines: each step holds the lines the tile's rows
    touch and a row of the slice (``Blocking.k_block_l1``)."""
    walks = _read_down_columns(plan, bl)
    line = bl.target.cache_line
    lines = sum(_lines(plan.mr * row, line) for _, row in walks)
    return bl.k_block_l1(lines * line + plan.nr * plan.lanes * np.dtype(plan.out.dtype).itemsize)


def decide(plan, bl: Blocking):
    """``plan`` (a :class:`~lowering.schedule.tile_plan.TilePlan`) with the
    :class:`KBlocks` of its register tile's reduction; unchanged without a
    register tile.  A reduction from a column panel whose row operand is read
    in place a line or more apart per step (a padded temporary read down its
    columns: attention's ``dscoresᵀ``) takes blocks of ``k_block_rows`` even
    when the panel alone would not be cut, if a block of rows' slice in
    whole lines (:func:`_strided_slice`) outgrows ``row_block_bytes``: rows
    blocked for the whole reduction can be a few rows wide (18 float32 over
    2048 steps: 384 KB of lines against 128 KB), and neighbouring blocks
    fetch the lines they share twice; blocked for one K block they span
    whole lines (512 rows, 32 lines a step) and the slice fits.  Such a
    block is at most :func:`_walk_steps` long: a row tile reads a part of
    each line it walks down (6 float32 of 16), the row tiles after it the
    rest, and lines evicted from L1 in between come back from L2 (64 steps
    with AVX2's tiles, not 256: each step holds two lines and a 64-byte row
    of the column panel's slice)."""
    if plan.i is None:
        return plan
    panel = any(c.panel is not None and c.panel[1] is plan.jt for c in plan.copies)
    rows = bl.k_block_rows(np.dtype(plan.out.dtype).itemsize)
    kb = _k_blocks(plan.body, plan.out, plan.j, bl.k_block_panel if panel else bl.k_block)
    if panel and kb is not None and kb.in_place:
        kb = _k_blocks(plan.body, plan.out, plan.j, rows)
    elif panel and kb is None and _strided_slice(plan, bl) > bl.row_block_bytes:
        kb = _k_blocks(plan.body, plan.out, plan.j, min(rows, _walk_steps(plan, bl)))
        kb = kb if kb is not None and kb.in_place else None
    return replace(plan, k_blocks=kb)


def build(plan, nest: Nest, stage: Stage, body: Block, temps: Temporaries):
    """``(body, into, epilogue)``: the element ``body`` of ``plan`` in K blocks,
    ``(name, buffer)`` of the stage its tile loops make, and the stages
    still to schedule after it: the epilogue that reads partial sums kept in
    a temporary (``[]`` when they stay in the output, or without K blocks)."""
    kb = plan.k_blocks
    if kb is None:
        return body, (stage.name, stage.buffer), []
    sums = None if kb.in_place else _partial_sums(nest, plan.j, stage.name, kb.acc.dtype, temps)
    body, epilogue = _k_blocked(body, kb, stage.buffer, sums)
    if epilogue is None:
        return body, (stage.name, stage.buffer), []
    sums, store = epilogue
    return body, (sums.name, sums), [Stage(stage.name, stage.buffer, nest.around(Block((store,))))]
