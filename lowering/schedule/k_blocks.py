"""Rule 7, K blocks and row blocks: a long GEMM reduction is cut into equal
blocks, each resuming from the partial sums the one before left, so a
block x tile-width slice of the packed operand stays in L1 while the row
tiles pass; with a large row operand the row tiles are visited in blocks
that stay in L2 while the column panels pass."""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from te_autodiff.expr import Const, Var, add, compare, minimum, mul, sub, var

from ..loop_ir import Alloc, Assign, Block, BufLoad, Buffer, For, If, Local, Store, stride, substitute, walk
from .blocking import Blocking
from .ir import idx, linear, temporary
from .nest import Nest, trips


@dataclass(frozen=True)
class KBlocks:
    """Rule 7's plan for a reduction of ``steps`` iterations into ``acc``:
    ``count`` blocks of ``size``, numbered by ``var``; ``in_place``: the
    partial sums stay in the output (contiguous along ``j``, same dtype),
    else in a temporary read by a separate epilogue."""

    acc: Local
    steps: int
    count: int
    size: int
    in_place: bool
    var: Var


def k_blocks(body: Block, out: Buffer, j: Var, bl: Blocking):
    """The :class:`KBlocks` of a GEMM-like element body ``acc = init; for k:
    acc = acc + ...; out[idx] = f(acc)`` whose loop is longer than
    ``bl.k_block_min``: equal blocks of at most ``bl.k_block`` iterations
    (784 = 4 x 196: no short last block paying a whole block's loads and
    stores of the accumulators).  None for any other body."""
    stmts = body.stmts
    if len(stmts) < 3 or not isinstance(stmts[-1], Store) or stmts[-1].buffer is not out:
        return None
    loops = [k for k, x in enumerate(stmts) if isinstance(x, For)]
    if len(loops) != 1 or loops[0] != len(stmts) - 2:
        return None
    loop = stmts[-2]
    if not (isinstance(loop.lo, Const) and isinstance(loop.extent, Const)) \
            or loop.extent.value <= bl.k_block_min:
        return None
    writes = {x.local for x in walk(loop) if isinstance(x, Assign)}
    declared = {x.local for x in walk(loop) if isinstance(x, Alloc)}
    (acc,) = writes - declared if len(writes - declared) == 1 else (None,)
    if acc is None or not all(
            isinstance(x, Alloc) and x.local is acc and isinstance(x.init, Const) for x in stmts[:-2]):
        return None
    n = loop.extent.value
    count = -(-n // bl.k_block)
    in_place = stride(stmts[-1].index, j) == 1 and acc.dtype == out.dtype
    return KBlocks(acc, n, count, -(-n // count), in_place, var("k.b"))


def partial_sums(nest: Nest, j: Var, name: str, dtype, taken: set, new_buffers: list):
    """``(buffer, index)``: a temporary for the partial sums of K blocks, the
    output's shape with ``j`` last, and the element's index into it."""
    order = [v for v in nest.vars if v is not j] + [j]
    shape = tuple(nest.extent(v) for v in order)
    return temporary(f"{name}.sums", shape, dtype, taken, new_buffers), linear(order, shape)


def k_blocked(body: Block, plan: KBlocks, out: Buffer, sums=None):
    """Build rule 7 on ``body``: block ``plan.var`` runs its share of the
    reduction, resuming from the partial sum left by the block before (the
    epilogue runs after the last block).  Each element still adds its terms
    in the same order, so the result is bit-identical.  In place the partial
    sums go back into the output as whole vectors; otherwise every block
    stores them into ``sums`` (``(buffer, index)``, :func:`partial_sums`)
    and a separate epilogue ``out[idx] = f(sum)`` reads them (one
    transposing pass instead of a scatter per tile).  Returns ``(body,
    epilogue)`` with ``epilogue`` None or ``(buffer, store)``."""
    *head, loop, store = body.stmts
    acc, kb, size = plan.acc, plan.var, plan.size
    sums, at = (out, store.index) if sums is None else sums
    lo = add(loop.lo, mul(kb, idx(size)))
    extent = idx(size) if plan.steps % size == 0 else minimum(idx(size), sub(idx(plan.steps), mul(kb, idx(size))))
    first, last = compare("eq", kb, idx(0)), compare("eq", kb, idx(plan.count - 1))
    keep = Store(sums, at, acc)
    epilogue = None if plan.in_place else \
        (sums, Store(out, store.index, substitute(store.value, {acc: BufLoad(sums, at)})))
    return Block((
        Alloc(acc, None),
        If(first, Block((Assign(acc, head[0].init),)), Block((Assign(acc, BufLoad(sums, at)),))),
        For(loop.var, lo, extent, loop.body, loop.kind),
        If(last, Block((store,)), Block((keep,))) if plan.in_place else keep,
    )), epilogue


def row_blocks(accesses, i: Var, j: Var, i_extent: int, bl: Blocking) -> int:
    """Blocks of row tiles for a GEMM with several column tiles whose row
    operand (the loads that move with ``i``, not with ``j``) is larger than
    ``bl.row_block_bytes``: a power of two, so that the blocks of rows (the
    parallel root) split evenly, each block small enough to stay in L2 while
    the column panels pass."""
    size = max((i_extent * prod(trips(lp) for lp in a.loops) * np.dtype(a.buffer.dtype).itemsize
                for a in accesses if a.loops and not a.store and stride(a.index, j) == 0
                and stride(a.index, i) != 0), default=0)
    blocks = 1
    while size > blocks * bl.row_block_bytes:
        blocks *= 2
    return blocks
