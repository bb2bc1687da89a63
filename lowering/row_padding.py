"""Row padding: a temporary whose rows are a multiple of the L1 way apart
gets rows one cache line longer.

A cache set is picked by the address modulo the way size (``l1_bytes /
l1_ways``: 4 KiB on x86), so rows a multiple of it apart (1024 float32, 512
float64) all fall in one set (the L2 picks its sets the same way, among
more).  A loop that walks down a column of such a temporary (a GEMM's
transposed operand ``dS[i, j]`` summed over ``i``; a register tile's rows
side by side) then keeps only ``ways`` lines of it in L1.  One more line
per row makes the row stride an odd number of lines, which reaches every
set.  Other
strides are left alone: a column walk down rows 6 KiB apart (two L1 sets)
measured faster unpadded (benchmarks/README.md).

Temporaries are ours to lay out; inputs, outputs and results keep the
caller's layout.  The extra line is never read, so padding costs footprint,
at most one line in ``way / line`` (1/64 on x86), and no bandwidth.  Every
access must be an affine index whose terms move whole rows or stay within
one row (checked over the loops' ranges); the padded index is the same
form with a row step of ``n + pad`` elements.  A temporary read or written
any other way keeps its layout."""
from __future__ import annotations

from dataclasses import replace
from math import prod

from te_autodiff.expr import Const, Var

from .loop_ir import (AlignGap, For, Program, Stage, Store, from_linear, linear_form, loads_in, map_loads, map_stmt,
                      stage_buffers, stmt_exprs, walk, with_load)
from .target import Target


def _way(t: Target) -> int:
    """Bytes one way of ``t``'s L1 data cache holds."""
    return t.l1_bytes // t.l1_ways


def crowded(row_bytes: int, rows: int, t: Target) -> bool:
    """Whether ``rows`` rows ``row_bytes`` apart all fall in one L1 set of
    ``t`` (a multiple of the way size apart), more of them than its ways."""
    return row_bytes % _way(t) == 0 and rows > t.l1_ways


def padded(buffer, t: Target) -> bool:
    """Whether ``buffer`` is a temporary with rows a cache line longer than a
    multiple of the way, as :func:`pad_rows` makes them: a column walk down
    them reaches every set, so nothing need copy them for the walk's sake."""
    row = buffer.shape[-1] * buffer.itemsize - t.cache_line
    return buffer.kind == "temp" and len(buffer.shape) >= 2 and row > 0 and row % _way(t) == 0


class _Unpadded(Exception):
    """An access to the candidate that padding cannot rewrite."""


def _ranges(stage: Stage) -> dict:
    """``{loop variable: (first, last)}`` of the stage's constant loops."""
    return {s.var: (s.lo.value, s.lo.value + max(s.extent.value, 1) - 1) for s in walk(stage.body)
            if isinstance(s, For) and isinstance(s.lo, Const) and isinstance(s.extent, Const)}


def padded_index(index, n: int, pad: int, ranges: dict):
    """``index`` into rows of ``n`` elements as the index of the same element
    in rows of ``n + pad``; None unless each term moves whole rows (a
    coefficient that ``n`` divides) or, with the constant's remainder, stays
    in ``0..n-1`` over ``ranges`` (variables outside them: their fixed
    range)."""
    form = linear_form(index)
    if form is None:
        return None
    terms, c0 = form
    row, lo = divmod(c0, n)
    hi, new = lo, {}
    for atom, k in terms.items():
        if k % n == 0:
            new[atom] = k // n * (n + pad)
            continue
        span = ranges.get(atom, _dom(atom)) if isinstance(atom, Var) else None
        if span is None:
            return None
        lo, hi = lo + min(k * span[0], k * span[1]), hi + max(k * span[0], k * span[1])
        new[atom] = k
    if lo < 0 or hi >= n:
        return None
    return from_linear(new, row * (n + pad) + c0 % n, index.dtype)


def _dom(v: Var):
    """``(first, last)`` of a variable with a fixed range, else None."""
    return None if v.dom is None else (v.dom[0], v.dom[0] + max(v.dom[1], 1) - 1)


def _repad(stage: Stage, old, new) -> Stage:
    """``stage`` with every access to buffer ``old`` made to ``new``."""
    n, pad, ranges = old.shape[-1], new.shape[-1] - old.shape[-1], _ranges(stage)

    def index(ix):
        out = padded_index(ix, n, pad, ranges)
        if out is None:
            raise _Unpadded
        return out

    def store(s, expr):
        mine = s.buffer is old
        return Store(new if mine else s.buffer, index(s.index) if mine else expr(s.index), expr(s.value))
    body = map_stmt(stage.body, lambda e: map_loads(e, lambda x: with_load(x, new, index(x.index))
                                                    if x.buffer is old else None), store=store)
    return replace(stage, body=body, buffer=new if stage.buffer is old else stage.buffer)


def _fixed_layout(program: Program) -> set:
    """Buffers whose layout is not ours to change: results, a counting sort's
    arrays, buffers named by anything but a load or a store."""
    out = set(program.results)
    visited = set()
    for st in program.stages:
        if st.sort is not None:
            out.update(st.sort)
        for s in walk(st.body):
            out.update(g.buffer for g in loads_in(stmt_exprs(s), visited, (AlignGap,)))
    return out


def pad_rows(program: Program, target: Target) -> Program:
    """``program`` with each crowded temporary (:func:`crowded`) padded by a
    cache line per row where all its accesses allow it."""
    fixed = _fixed_layout(program)
    stages, renamed = program.stages, {}
    for b in program.buffers:
        if b.kind != "temp" or len(b.shape) < 2 or b in fixed or \
                not crowded(b.shape[-1] * b.itemsize, prod(b.shape[:-1]), target):
            continue
        wide = replace(b, shape=b.shape[:-1] + (b.shape[-1] + target.cache_line // b.itemsize,))
        try:
            stages = tuple(_repad(st, b, wide) if b in stage_buffers(st)[0] else st for st in stages)
        except _Unpadded:
            continue
        renamed[b] = wide
    if not renamed:
        return program
    return replace(program, stages=stages, buffers=tuple(renamed.get(b, b) for b in program.buffers))
