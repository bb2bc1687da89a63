"""Rules 5 and 6a, packing: loads copied by a new stage into a temporary
laid out for the vector loop, either transposed (a gather along the vector
axis, ``B[j, k]`` in ``A @ B.T``, read with unit stride) or as the panels
of a register-tiled GEMM (one contiguous, aligned block per tile).  The
plan is a list of :class:`Copy`; :func:`pack` builds it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import prod

import numpy as np

from te_autodiff.expr import Const, Var, add, mul, var

from ..loop_ir import (Alloc, Assign, Block, BufLoad, Check, For, GuardedLoad, If, Simd, Stage, Store, linear_form,
                       loads_in, map_loads, map_stmt, simplify_index, stmt_exprs, stride, substitute, walk,
                       with_load)
from .blocking import PACK_MIN_REUSE, Blocking
from .ir import idx, linear, lt, temporary
from .nest import Access, Nest


@dataclass(frozen=True)
class Copy:
    """One load to read from a copy: ``access``, the ``(variable, first,
    extent)`` of each copied dimension (:func:`_box`, the copied axis last)
    and, for panels, ``(size, tile)``: panels of ``size`` elements numbered
    by the tile variable ``tile``."""

    access: Access
    box: tuple
    panel: tuple | None = None


def _box(a: Access, axis: Var, extent: int, nest: Nest):
    """The ``(variable, first, extent)`` of each dimension a copy of load ``a``
    needs: the reduction loops its index reads (constant bounds), then
    ``axis`` over ``0..extent``; None when the index reads anything else or
    may leave the buffer.  The time of a scan's step (a variable outside the
    nest, with a fixed range) is an offset of the whole box: the copy stage
    runs at every step, inside the time loop."""
    form = linear_form(a.index)
    if a.store or not a.loops or form is None:
        return None
    terms, c0 = form
    red = [lp for lp in a.loops if lp.var in terms]
    names = {lp.var for lp in red}
    outer = [v for v in terms if isinstance(v, Var) and v is not axis and v not in names and v.dom is not None
             and v not in nest.vars]
    if (any(atom is not axis and atom not in names and atom not in outer for atom in terms) or len(names) != len(red)
            or not all(isinstance(lp.lo, Const) and isinstance(lp.extent, Const) for lp in red)):
        return None
    box = tuple((lp.var, lp.lo.value, lp.extent.value) for lp in red) + ((axis, 0, extent),)
    if any(n <= 0 for _, _, n in box):
        return None
    ranges = box + tuple((v, v.dom[0], v.dom[1]) for v in outer)
    lo = c0 + sum(min(terms.get(v, 0) * a0, terms.get(v, 0) * (a0 + n - 1)) for v, a0, n in ranges)
    hi = c0 + sum(max(terms.get(v, 0) * a0, terms.get(v, 0) * (a0 + n - 1)) for v, a0, n in ranges)
    return box if 0 <= lo and hi < a.buffer.size else None


def transposed_copies(nest: Nest, j: Var, accesses) -> list:
    """Rule 5: the loads worth copying into a transposed temporary ``P[r..., j]``:
    gathers along ``j`` inside a reduction whose index reads only ``j`` and
    reduction variables with constant bounds (``B[j, k]`` in ``A @ B.T``),
    in bounds over the whole box, and re-read by the other output loops at
    least ``PACK_MIN_REUSE`` times."""
    j_extent = nest.extent(j)
    if prod(nest.extents) // max(j_extent, 1) < PACK_MIN_REUSE:
        return []
    plan, seen = [], set()
    for a in accesses:
        if stride(a.index, j) in (0, 1, None) or (a.buffer, a.index) in seen:
            continue
        box = _box(a, j, j_extent, nest)
        if box is not None:
            seen.add((a.buffer, a.index))
            plan.append(Copy(a, box))
    return plan


def panel_copies(nest: Nest, accesses, i: Var, j: Var, gathers, mr: int, width: int, tiles,
                 bl: Blocking) -> list:
    """Rule 6a: the copies that give a register-tiled GEMM contiguous operands:
    the operand read in vector lanes (moves with ``j``, not with ``i``) as
    column panels ``P[j tile][r...][width]`` and a broadcast operand whose
    tile rows are adjacent but whose reduction steps are not (``A[k, i]``)
    as row panels ``P[i tile][r...][mr]``.  A tile's reduction then reads one
    contiguous, aligned block per operand (no cache-set conflicts between
    rows a large stride apart, no split loads from unaligned inputs), and
    a column panel stays in L1 while the row tiles run.  Copied only when
    the operand does not fit in L1 (``bl.panel_min_bytes``) and each element is
    re-read ``PACK_MIN_REUSE`` times; a temporary already laid out as the
    panel is read in place.  ``gathers`` (the transposed copies of
    :func:`transposed_copies`) take the panel layout.  ``tiles`` are the tile
    variables ``(j tile, i tile)`` the panel indices use."""
    extents = dict(zip(nest.vars, nest.extents))
    total = prod(nest.extents)
    plan = [Copy(c.access, c.box, (width, tiles[0])) for c in gathers]
    seen = {(c.access.buffer, c.access.index) for c in gathers}
    for a in accesses:
        if (a.buffer, a.index) in seen or a.store or not a.loops:
            continue
        sj, si = stride(a.index, j), stride(a.index, i)
        if sj == 1 and si == 0 and total // extents[j] // mr >= PACK_MIN_REUSE:
            axis, size, tile = j, width, tiles[0]
        elif sj == 0 and si == 1 and stride(a.index, a.loops[-1].var) != 1 \
                and total // extents[i] // width >= PACK_MIN_REUSE:
            axis, size, tile = i, mr, tiles[1]
        else:
            continue
        box = _box(a, axis, extents[axis], nest)
        if box is None or prod(n for _, _, n in box) * np.dtype(a.buffer.dtype).itemsize < bl.panel_min_bytes:
            continue
        in_place = substitute(_panel_index(box, size, tile), {tile: idx(0)})
        if a.buffer.kind == "temp" and extents[axis] <= size and \
                linear_form(in_place) == linear_form(a.index):
            continue                        # already a panel
        seen.add((a.buffer, a.index))
        plan.append(Copy(a, box, (size, tile)))
    return plan


def _panel_index(box, size: int, tile: Var):
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


def pack(body, copies, taken: set, new_stages, new_buffers):
    """Build ``copies``: one copy stage (into ``new_stages``) and temporary
    per load; returns the body with those loads reading the copies.  A
    panel's last panel is padded with zeros."""
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
            index = _panel_index(box, size, tile)
            cond = None if t_extent % size == 0 else lt(at[t], t_extent)
        packed = temporary(f"{a.buffer.name}.packed", shape, a.buffer.dtype, taken, new_buffers)
        src = simplify_index(substitute(a.index, at))
        value = BufLoad(a.buffer, src) if cond is None else GuardedLoad(a.buffer, src, cond)
        stmt = Store(packed, linear(axes, shape), value)
        for d in reversed(range(len(axes))):
            inner = stmt if d == len(axes) - 1 else Block((stmt,))
            stmt = For(axes[d], idx(0), idx(shape[d]), inner, "parallel" if d == 0 else "serial")
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
