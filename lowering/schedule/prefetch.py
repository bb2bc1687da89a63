"""Prefetch: a register tile's reduction that reads its column operand as one
contiguous stream (a column panel, ``panels.py``: step ``k``'s row of the
tile's columns right after step ``k - 1``'s) asks for that stream
``Blocking.prefetch_bytes`` ahead, one hint per cache line of a step, when
the panel (the reduction's steps times the output's columns) is larger than
L2.  Such a panel comes from L3 or memory again for each block of rows, and
the hardware's stream prefetchers stop at every page boundary: without the
hints each page of the stream begins with misses the multiply-adds wait
for, which costs most when other cores crowd the L3.  A panel that stays in
L2 gets no hints (they would only take issue slots).

A row operand read in place down its columns (``P[k, i]``, a step a line
or more apart, the tile's rows side by side within lines: attention's
``softmaxᵀ``) is a walk, not a stream: each step reads part of one row's
line, and the row tiles after it read the rest of that line and then the
next ones, one per row of each K block, as many streams as steps, more
than the hardware tracks.  Such a walk asks, each step, for the line after
the one its first row reads, which the next tiles read next, when the
rows it reads over the reduction are larger than L2.  Those rows are the
tile's rows and those of the output loops outside the tiles that move the
walk by less than its steps span (blocks of rows, as ``triangles.py``
cuts them; a head moves to another matrix and is not counted); a step
loop whose extent is not a constant counts its largest, as bounded over
the loops around it.  A hint never faults, past the operand's end
included (``llvm.prefetch``)."""
from __future__ import annotations

import numpy as np

from te_autodiff.expr import Const, add, mul

from ..bounds_check import Scope, bounds
from ..loop_ir import Block, For, Prefetch, loads_in, map_loops, stmt_exprs, stride, substitute, walk
from .blocking import Blocking
from .constructors import idx
from .nest import Nest, trips


def _streams(loop: For, plan) -> list:
    """``(buffer, index at the tile's first column)`` of each load in ``loop``
    (a reduction loop of the tile) that reads a column stream: one element
    further per column, none per row, a row of the tile further per step."""
    width = plan.nr * plan.lanes
    out, seen, visited = [], set(), set()
    for s in walk(loop.body):
        for x in loads_in(stmt_exprs(s), visited):
            if x.buffer not in seen and stride(x.index, plan.j) == 1 and stride(x.index, plan.i) == 0 \
                    and stride(x.index, loop.var) == width:
                seen.add(x.buffer)
                out.append((x.buffer, substitute(x.index, {plan.j: mul(plan.jt, idx(width))})))
    return out


def _walks(loop: For, plan, line: int) -> list:
    """``(buffer, index at the tile's first row)`` of each load in ``loop``
    (a reduction loop of the tile) that walks down a row operand's columns:
    none per column, the tile's rows within a line, a line or more per step."""
    out, seen, visited = [], set(), set()
    for s in walk(loop.body):
        for x in loads_in(stmt_exprs(s), visited):
            item = np.dtype(x.buffer.dtype).itemsize
            if x.buffer not in seen and plan.walks_down_columns(x.index, loop.var, item, line) \
                    and abs(stride(x.index, plan.i)) * item * plan.mr <= line:
                seen.add(x.buffer)
                out.append((x.buffer, substitute(x.index, {plan.i: mul(plan.it, idx(plan.mr))})))
    return out


def _walk_rows(first, plan, outer: list, span: int) -> int:
    """Rows of its operand a walk at ``first`` sweeps over the stage: the
    tile plan's rows times the trips of each loop of ``outer`` that moves it
    by less than ``span`` elements (by a form that is not affine: a block's
    pair and side)."""
    rows = plan.i_extent
    for lp in outer:
        s = stride(first, lp.var)
        if s != 0 and (s is None or abs(s) < span):
            rows *= trips(lp)
    return rows


def _hinted(loop: For, plan, steps: int, bl: Blocking, outer: list) -> For:
    """``loop`` prefetching each column stream it reads whose panel exceeds
    L2, and the next line of each walk whose rows exceed L2 (``outer``: the
    output loops outside the tiles)."""
    width, line, l2 = plan.nr * plan.lanes, bl.target.cache_line, bl.target.l2_bytes
    hints = []
    for buf, first in _streams(loop, plan):
        itemsize = np.dtype(buf.dtype).itemsize
        if steps * plan.j_extent * itemsize <= l2:
            continue
        ahead = substitute(first, {loop.var: add(loop.var, idx(-(-bl.prefetch_bytes // (width * itemsize))))})
        hints += [Prefetch(buf, add(ahead, idx(k))) for k in range(0, width, line // itemsize)]
    for buf, first in _walks(loop, plan, line):
        itemsize = np.dtype(buf.dtype).itemsize
        if steps * _walk_rows(first, plan, outer, steps * abs(stride(first, loop.var))) * itemsize > l2:
            hints.append(Prefetch(buf, add(first, idx(line // itemsize))))
    return loop if not hints else For(loop.var, loop.lo, loop.extent, Block((*hints, loop.body)), loop.kind)


def build(plan, nest: Nest, body, bl: Blocking):
    """``body`` (``plan``'s element body in ``nest``) with its innermost
    reduction loops prefetching their column streams, each panel sized by
    the steps of the loops around it; unchanged without a register tile."""
    if plan.i is None:
        return body
    outer = plan.untiled(nest)

    def loop(lp: For, steps: int, scope: Scope):
        steps *= _most_trips(lp, scope)
        if any(isinstance(x, For) for x in walk(lp.body)):
            inner = scope.with_vars([lp.var], [(lp.lo, lp.extent)])
            return For(lp.var, lp.lo, lp.extent, map_loops(lp.body, lambda x: loop(x, steps, inner)), lp.kind)
        return _hinted(lp, plan, steps, bl, outer)
    scope = Scope({lp.var: (lp.lo, lp.extent) for lp in nest.loops})
    return map_loops(body, lambda lp: loop(lp, 1, scope))


def _most_trips(lp: For, scope: Scope) -> int:
    """The iterations of ``lp``: its extent, or the largest its extent takes
    where ``scope`` holds (``trips``'s guess when it has no bound)."""
    if isinstance(lp.extent, Const):
        return trips(lp)
    hi = bounds(lp.extent, scope)[1]
    return max(hi, 0) if hi is not None else trips(lp)
