"""Packing: loads read from copies laid out for the vector loop.  Two rules
decide the copies (:class:`Copy`): transposed copies
(``transposed_copies.py``: a gather along the vector axis read with unit
stride) and panels (``panels.py``: one contiguous, aligned block per tile of
a register-tiled GEMM); :func:`build` makes one copy stage and temporary
per load, a panel of at most two cache lines copied in blocks of rows
(:func:`_panel_rows`).  A copy stage is scheduled like any other stage
(:func:`unrolled_partially` then marks its loops)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import prod

from te_autodiff.expr import Const, Var, add, mul, var

from ..loop_ir import (Alloc, Assign, Block, BufLoad, Check, For, GuardedLoad, If, Simd, Stage, Store, free_leaves,
                       linear_form, loads_in, map_loads, map_stmt, simplify_index, stmt_exprs, stride, substitute,
                       walk, with_load)
from .constructors import Temporaries, idx, linear, lt
from .nest import Access, Nest

PACK_MIN_REUSE = 4           # an operand is copied only if each element is re-read at least this often


@dataclass(frozen=True)
class Copy:
    """One load to read from a copy: ``access``, the ``(variable, first,
    extent)`` of each copied dimension (:func:`box`, the copied axis last)
    and, for panels, ``(size, tile)``: panels of ``size`` elements numbered
    by the tile variable ``tile``."""

    access: Access
    box: tuple
    panel: tuple | None = None


def box(a: Access, axis: Var, extent: int, nest: Nest, batch: bool = True):
    """The ``(variable, first, extent)`` of each dimension a copy of load ``a``
    needs: the output loops of ``nest`` its index reads (a batch: attention's
    head ``a`` in ``K[a, j, k]``, whole; only if ``batch``), the reduction
    loops it reads (constant bounds), then ``axis`` over ``0..extent``; None
    when the index reads anything else or may leave the buffer.  The time of
    a scan's step (a variable outside the nest, with a fixed range) is an
    offset of the whole box: the copy stage runs at every step, inside the
    time loop."""
    form = linear_form(a.index)
    if a.store or not a.loops or form is None:
        return None
    terms, c0 = form
    red = [lp for lp in a.loops if lp.var in terms]
    names = {lp.var for lp in red}
    batched = [(v, 0, n) for v, n in zip(nest.vars, nest.extents) if v in terms and v is not axis]
    if batched and not batch:
        return None
    outer = [v for v in terms if isinstance(v, Var) and v is not axis and v not in names and v.dom is not None
             and v not in nest.vars]
    if (any(atom is not axis and atom not in names and atom not in outer and atom not in nest.vars for atom in terms)
            or len(names) != len(red)
            or not all(isinstance(lp.lo, Const) and isinstance(lp.extent, Const) for lp in red)):
        return None
    box = tuple(batched) + tuple((lp.var, lp.lo.value, lp.extent.value) for lp in red) + ((axis, 0, extent),)
    if any(n <= 0 for _, _, n in box):
        return None
    ranges = box + tuple((v, v.dom[0], v.dom[1]) for v in outer)
    lo = c0 + sum(min(terms.get(v, 0) * a0, terms.get(v, 0) * (a0 + n - 1)) for v, a0, n in ranges)
    hi = c0 + sum(max(terms.get(v, 0) * a0, terms.get(v, 0) * (a0 + n - 1)) for v, a0, n in ranges)
    return box if 0 <= lo and hi < a.buffer.size else None


def rereads(a: Access, nest: Nest) -> int:
    """How often each element of load ``a`` is read by the output loops of
    ``nest`` that its index does not read (a batch loop it reads re-reads
    nothing)."""
    named = free_leaves(a.index)
    return prod(n for v, n in zip(nest.vars, nest.extents) if v not in named)


def panel_index(box, size: int, tile: Var):
    """Index of element ``(r..., t)`` of a box in panels ``P[tile][r...][size]``
    with ``t = tile * size + (t mod size)``: ``t + r_lin * size + tile * (R - 1) * size``
    (affine, as the tile variable is a loop of the schedule)."""
    rest = prod(n for _, _, n in box[:-1])
    out, step = add(box[-1][0], mul(tile, idx((rest - 1) * size))), size
    for v, a0, n in reversed(box[:-1]):
        out = add(out, mul(add(v, idx(-a0)), idx(step)))
        step *= n
    return simplify_index(out)


def copied(copies) -> set:
    """The ``(buffer, index)`` of the loads ``copies`` replace."""
    return {(c.access.buffer, c.access.index) for c in copies}


def _panel_rows(shape, itemsize: int, line: int, ways: int, contiguous: bool) -> int:
    """Rows of a panel's copy taken together, 0 for tile by tile.  A panel
    row of at most two lines copied tile by tile reads a piece of every
    source row in each tile: a page apart when rows are long (a TLB miss and
    no prefetch per row), and, when the rows do not start on a line (numpy
    places a large array 16 bytes into a page), the line two neighbouring
    tiles share is fetched once for each.  Blocks of rows with the tiles
    inside read the source rows in whole lines while they are in L1: as many
    rows as L1 has ways (the pieces of one tile may all fall in one set
    when the row length is a multiple of a page), the largest such divisor
    of the panel's row axis, so the blocks stay a nest of constant loops.
    A panel row narrower than a line takes the rows in turn, the tiles
    inside, when no divisor is found (1); a wider one, read along the panel
    (``contiguous``; a transposed read has its own blocks), keeps its tiles.
    A wider panel shares one line in three or more with its neighbour, and
    is copied faster tile by tile from rows that start on a line."""
    size = shape[-1]
    width = size * itemsize
    if len(shape) < 3 or width > 2 * line or (width >= line and not contiguous):
        return 0
    rows = max(d for d in range(1, min(ways, shape[-2]) + 1) if shape[-2] % d == 0)
    return 0 if rows == 1 and width >= line else rows


def build(body, copies, temps: Temporaries, new_stages: list, target):
    """``body`` with the loads of ``copies`` reading their copies: one copy
    stage (into ``new_stages``) and temporary per load, a panel of at most
    two lines copied in blocks of rows (:func:`_panel_rows`, from the
    ``target``'s cache line and L1 ways).  A panel's last panel is padded
    with zeros."""
    replace = {}
    for c in copies:
        a, box = c.access, c.box
        *red, (t, _, t_extent) = box
        if c.panel is None:
            shape = tuple(n for _, _, n in box)
            axes = [var(f"p{d}") for d in range(len(box))]
            at = {v: add(ax, idx(a0)) for (v, a0, _), ax in zip(box, axes)}
            index = simplify_index(linear([add(v, idx(-a0)) for v, a0, _ in box], shape))
            cond = None
        else:
            size, tile = c.panel
            shape = (-(-t_extent // size),) + tuple(n for _, _, n in red) + (size,)
            axes = [var(f"p{d}") for d in range(len(shape))]
            at = {v: add(ax, idx(a0)) for (v, a0, _), ax in zip(red, axes[1:-1])}
            at[t] = add(mul(axes[0], idx(size)), axes[-1])
            index = panel_index(box, size, tile)
            cond = None if t_extent % size == 0 else lt(at[t], t_extent)
        packed = temps.new(f"{a.buffer.name}.packed", shape, a.buffer.dtype)
        src = simplify_index(substitute(a.index, at))
        value = BufLoad(a.buffer, src) if cond is None else GuardedLoad(a.buffer, src, cond)
        stmt = Store(packed, linear(axes, shape), value)
        rows = 0 if c.panel is None else _panel_rows(shape, a.buffer.itemsize, target.cache_line, target.l1_ways,
                                                    stride(src, axes[-1]) == 1)
        loops = list(zip(axes, shape))
        if rows == 1:                        # (batch, reduction..., tiles, panel)
            loops = loops[1:-1] + [loops[0], loops[-1]]
        elif rows:                           # (batch, reduction..., blocks, tiles, rows, panel)
            outer, inner = var(f"{axes[-2].name}.b"), var(f"{axes[-2].name}.r")
            stmt = map_stmt(stmt, lambda e: substitute(e, {axes[-2]: add(mul(outer, idx(rows)), inner)}))
            loops = loops[1:-2] + [(outer, shape[-2] // rows), loops[0], (inner, rows), loops[-1]]
        for d in reversed(range(len(loops))):
            v, n = loops[d]
            stmt = For(v, idx(0), idx(n), stmt if d == len(loops) - 1 else Block((stmt,)),
                       "parallel" if d == 0 else "serial")
        new_stages.append(Stage(packed.name, packed, stmt))
        replace[(a.buffer, a.index)] = (packed, index)
    return _replace_loads(body, replace) if replace else body


def unrolled_partially(copy: Stage) -> Stage:
    """A scheduled copy stage that reads its source in contiguous vectors,
    with its serial loops that hold other loops of kind ``partial``.  LLVM's
    unroller would flatten such a loop when it is short (a panel row of 32 x
    2 vectors into 64 loads and stores: a tenth of an RNN gradient's LLVM
    time), which saves nothing on a copy; a few copies of the body still
    hide the loop's own instructions.  A gather (a transposed copy) keeps
    its loops as they are: unrolled, its strided address arithmetic folds."""
    lanes = [s.var for s in walk(copy.body) if isinstance(s, Simd)]
    loads = loads_in([e for s in walk(copy.body) for e in stmt_exprs(s)], set())
    if not lanes or any(stride(x.index, v) not in (0, 1) for x in loads for v in lanes):
        return copy

    def kind(lp):
        inner = any(isinstance(x, For) for x in walk(lp.body))
        return "partial" if lp.kind == "serial" and inner else lp.kind
    return dataclasses.replace(copy, body=map_stmt(copy.body, lambda e: e, kind=kind))


def _replace_loads(body, replace):
    def fix(e):
        return map_loads(e, lambda x: with_load(x, *replace[(x.buffer, x.index)])
                          if (x.buffer, x.index) in replace else None)

    def go(s):
        if isinstance(s, Block):
            return Block(tuple(go(x) for x in s.stmts))
        if isinstance(s, For):
            return For(s.var, fix(s.lo), fix(s.extent), go(s.body), s.kind)
        if isinstance(s, If):
            return If(fix(s.cond), go(s.then), None if s.else_ is None else go(s.else_))
        if isinstance(s, Store):
            return Store(s.buffer, fix(s.index), fix(s.value))
        if isinstance(s, Alloc):
            return Alloc(s.local, None if s.init is None else fix(s.init))
        if isinstance(s, Assign):
            return Assign(s.local, fix(s.value))
        if isinstance(s, Check):
            return Check(fix(s.index), s.extent, s.code, s.tensor, s.dim)
        return s

    return go(body)
