"""Short rows: a stage whose rows are shorter than a vector computes a
row's elements one after another, and a temporary with such rows keeps
each column in a buffer of its own.

Geometry is written over short rows: a point is ``X[i, 0:3]``, a camera's
parameters ``cams[i, 0:11]``, a rotation ``Xcam[i, j]`` reads
``(j + 1) % 3`` and ``(j + 2) % 3`` (a cross product), a projection
``proj[i, 0:2]``, a squared norm a reduction over 3.  As lowered, a row
runs in ``c`` of a vector's lanes, the rest idle, its modular indices
shuffles or gathers, and every stage makes one more pass over the rows.
With the loops inside a row unrolled, each element is an expression of its
own with constant indices; a temporary's columns, each a buffer ``(N,)``,
are written and read as contiguous vectors over the rows; and fusion
(``fuse.py``, which runs next) joins the chain's stages into fewer loops
over the rows, a column often read where it was computed.  The vector
lanes then go to the rows.

A temporary is short when its rows have 2 to ``lanes - 1`` elements
(``lanes``: a vector of its dtype on the target) and there are ``lanes``
rows or more.  The stages touching one, and those writing a temporary
such a stage reads, unroll when they qualify: as lowered (loops from
zero over the buffer's leading axes), a row of one element or of a
short temporary's, the rows filling a vector, and inside a row only
loops of constant bounds, each under ``lanes`` iterations, ``lanes``
innermost bodies in all (short reductions, never a long one).  Unrolled,
what a row's loop computes the same way at every iteration runs once
before it (:func:`_hoisted`).  A short temporary then splits into a
buffer per column when every access names its column: a constant
(``c * (...) + k``), or for a read, a stage's element loop over part of
``[0, c)`` (a select among the row's columns; a reduction's variable
never does, so a product never reads through selects); otherwise the
temporary keeps its layout, and the stages are decided again without
it.  A row of as many elements as a vector or more gains nothing:
its lanes are full.  Each element keeps its operations and the order of
its reductions."""
from __future__ import annotations

from dataclasses import replace
from math import prod

from te_autodiff.expr import Const, Expr, const, equal, select
from te_autodiff.ops import is_transcendental

from .loop_ir import (AlignGap, Alloc, Assign, Block, BufLoad, Buffer, For, GuardedLoad, If, Local, Prefetch, Program,
                      Simd, Stage, Store, free_leaves, from_linear, linear_form, loads_in, map_stmt, nodes_in, rename,
                      stage_buffers, stmt_exprs, substituter, walk)
from .target import Target


def short_rows(program: Program, target: Target) -> Program:
    """``program`` with short-row stages unrolled and short-row temporaries split (module doc)."""
    split = {b for b in program.buffers if b.kind == "temp" and _short(b, target)}
    while True:
        chain = _chain(program.stages, split)
        stages = tuple((_unrolled(s, target, split) if s in chain else None) or s for s in program.stages)
        kept = {b for b in split if _splits(b, stages)}
        if kept == split:
            break
        split = kept
    if stages == program.stages:
        return program
    columns = {b: _columns(b) for b in split}
    buffers = tuple(c for b in program.buffers for c in columns.get(b, (b,)))
    return replace(program, buffers=buffers, stages=tuple(_split_stage(s, columns) for s in stages))


def _chain(stages, split: set) -> set:
    """The stages that unroll if they qualify: those touching a temporary
    in ``split``, and those writing a temporary such a stage reads (a
    squared norm a rotation reads: fused into the rows as a value)."""
    touching = {s for s in stages if split & set(stage_buffers(s)[0])}
    read = set().union(*(stage_buffers(s)[1] for s in touching))
    return touching | {s for s in stages if s.buffer.kind == "temp" and s.buffer in read}


def _short(buffer: Buffer, target: Target) -> bool:
    """Rows of 2 to ``lanes - 1`` elements, and enough of them to fill a vector."""
    lanes = _lanes(buffer, target)
    return len(buffer.shape) >= 2 and 2 <= buffer.shape[-1] < lanes <= buffer.shape[-2]


def _lanes(buffer: Buffer, target: Target) -> int:
    return target.lanes(buffer.itemsize)


def _row_axes(buffer: Buffer, lanes: int) -> int:
    """How many trailing axes of ``buffer`` make its short row: those after
    the last axis of ``lanes`` or more elements (0 when the last one is)."""
    n = 0
    shape = buffer.shape
    while n < len(shape) and shape[-1 - n] < lanes and prod(shape[len(shape) - 1 - n:]) < lanes:
        n += 1
    return n


def _unrolled(stage: Stage, target: Target, split: set) -> Stage | None:
    """``stage`` with the loops inside its rows unrolled, or None when it
    does not qualify or its stores would not be contiguous along the rows
    (a row of one element, or a temporary that splits)."""
    if stage.fixed or stage.step is not None or stage.sort is not None or stage.apart:
        return None
    lanes = _lanes(stage.buffer, target)
    keep = len(stage.buffer.shape) - _row_axes(stage.buffer, lanes)
    short_row = keep < len(stage.buffer.shape)
    if keep == 0 or stage.buffer.shape[keep - 1] < lanes or (short_row and stage.buffer not in split):
        return None
    outer, s = [], stage.body
    for axis in range(keep):
        if not (isinstance(s, For) and isinstance(s.lo, Const) and s.lo.value == 0
                and isinstance(s.extent, Const) and s.extent.value == stage.buffer.shape[axis]):
            return None
        outer.append(s)
        s = s.body
    inner = [x for x in walk(s) if isinstance(x, (For, Simd))]
    if not inner or not all(isinstance(x, For) and isinstance(x.lo, Const) and isinstance(x.extent, Const)
                            and x.extent.value < lanes for x in inner) or _copies(s) > lanes:
        return None
    fresh = _Fresh(stage)
    body = _unroll(s, fresh)
    for loop in reversed(outer):
        body = For(loop.var, loop.lo, loop.extent, body, loop.kind)
    return replace(stage, body=body)


def _copies(s) -> int:
    """How many times the innermost bodies of ``s`` run with its loops unrolled."""
    if isinstance(s, For):
        return s.extent.value * max(1, _copies(s.body))
    if isinstance(s, Block):
        return sum(_copies(x) for x in s.stmts)
    if hasattr(s, "then"):
        return _copies(s.then) + (0 if s.else_ is None else _copies(s.else_))
    return 0


class _Fresh:
    """Names for the locals of unrolled copies, unique in the stage."""

    def __init__(self, stage: Stage):
        self.taken = {x.local.name for x in walk(stage.body) if isinstance(x, Alloc)}

    def local(self, old: Local) -> Local:
        k = 1
        while f"{old.name}.{k}" in self.taken:
            k += 1
        self.taken.add(f"{old.name}.{k}")
        return Local(f"{old.name}.{k}", old.dtype)


def _unroll(s, fresh: _Fresh):
    """``s`` with every loop in it replaced by its iterations, in order."""
    if isinstance(s, Block):
        return Block(tuple(_unroll(x, fresh) for x in s.stmts))
    if isinstance(s, For):
        hoisted, body = _hoisted(s, fresh)
        s = replace(s, body=body)
        copies = list(hoisted)
        for k in range(s.lo.value, s.lo.value + s.extent.value):
            mapping = {s.var: const(k, s.var.dtype)}
            mapping.update({x.local: fresh.local(x.local) for x in walk(s.body) if isinstance(x, Alloc)})
            copies.append(_unroll(rename(s.body, mapping), fresh))
        return Block(tuple(copies))
    if hasattr(s, "then"):
        return replace(s, then=_unroll(s.then, fresh), else_=None if s.else_ is None else _unroll(s.else_, fresh))
    return s


def _hoisted(loop: For, fresh: _Fresh):
    """``(statements, body)``: what ``loop``'s body computes the same way at
    every iteration, to run once before it, and the body without it: the
    let-bindings that do not depend on its variable, and transcendental
    sub-expressions that do not either (made let-bindings); under a test
    that does not depend on it, both move under that test (locals assigned
    there).  Unrolled, each copy would compute them again: a rotation's
    ``cos θ`` and ``sin θ`` once per coordinate."""
    body = loop.body if isinstance(loop.body, Block) else Block((loop.body,))
    inner = {x.local for x in walk(body) if isinstance(x, (Alloc, Assign))}
    written = {x.buffer for x in walk(body) if isinstance(x, Store)}
    known = set()

    def invariant(e):
        leaves = free_leaves(e)
        return loop.var not in leaves and not (leaves & inner) - known \
            and not any(x.buffer in written for x in loads_in([e], set()))

    def lift(stmts):
        """``(lets, stmts)``: the invariant lets among ``stmts`` and their invariant transcendentals."""
        lets, stay, named = [], [], {}
        for x in stmts:
            if isinstance(x, Alloc) and x.let and invariant(x.init):
                lets.append(x)
                known.add(x.local)
                continue
            if isinstance(x, (For, If, Block)):         # their statements are lifted where they are unrolled
                stay.append(x)
                continue
            for node in nodes_in(stmt_exprs(x), set(), Expr):
                if node not in named and is_transcendental(getattr(node, "op", None)) and invariant(node):
                    named[node] = fresh.local(Local("u", node.dtype))
                    lets.append(Alloc(named[node], node, True))
            stay.append(map_stmt(x, substituter(named)) if named else x)
        known.update(named.values())
        return lets, stay

    out, kept = [], []
    for st in body.stmts:
        if isinstance(st, If) and invariant(st.cond):
            lets, stay = lift(st.then.stmts)
            if lets:
                out += [Alloc(m.local, None) for m in lets]
                out.append(If(st.cond, Block(tuple(Assign(m.local, m.init) for m in lets))))
                st = replace(st, then=Block(tuple(stay)))
            kept.append(st)
        else:
            lets, stay = lift([st])
            out += lets
            kept += stay
    return out, Block(tuple(kept))


def _columns(buffer: Buffer) -> tuple:
    c = buffer.shape[-1]
    return tuple(Buffer(f"{buffer.name}.{k}", buffer.shape[:-1], buffer.dtype, buffer.kind) for k in range(c))


def _column(buffer: Buffer, index, ranges: dict):
    """``(column, index of row)`` when ``index`` into ``buffer`` is ``c * (...) + k``
    (``column`` the constant ``k``) or ``c * (...) + j`` for a loop variable
    ``j`` whose range (``ranges``) lies in ``[0, c)`` (``column`` is ``j``); else None."""
    c = buffer.shape[-1]
    form = linear_form(index)
    if form is None:
        return None
    terms, constant = form
    inside = [a for a, k in terms.items() if k % c]
    row = from_linear({a: k // c for a, k in terms.items() if a not in inside}, constant // c, index.dtype)
    if not inside:
        return constant % c, row
    j = inside[0]
    lo, extent = ranges.get(j, (-1, 0))
    if len(inside) > 1 or terms[j] != 1 or constant or lo < 0 or lo + extent > c:
        return None
    return j, row


def _ranges(stage: Stage) -> dict:
    """The element loops of ``stage`` (a row's ``vectorize`` loop as lowered)
    with constant bounds: ``(lo, extent)``.  A reduction's variable never
    names a column: a product over a split temporary's columns would read
    each operand through a select."""
    return {x.var: (x.lo.value, x.extent.value) for x in walk(stage.body)
            if isinstance(x, For) and x.kind == "vectorize" and isinstance(x.lo, Const) and isinstance(x.extent, Const)}


def _splits(buffer: Buffer, stages) -> bool:
    """Whether every access to ``buffer`` names its column (:func:`_column`),
    a constant one for every store."""
    for stage in stages:
        ranges = _ranges(stage)
        for s in walk(stage.body):
            if isinstance(s, (Store, Prefetch)) and s.buffer is buffer \
                    and not isinstance((_column(buffer, s.index, {}) or (None,))[0], int):
                return False
            for x in loads_in(stmt_exprs(s), set(), (BufLoad, GuardedLoad, AlignGap)):
                if x.buffer is buffer and (isinstance(x, AlignGap) or _column(buffer, x.index, ranges) is None):
                    return False
    return True


def _split_stage(stage: Stage, columns: dict) -> Stage:
    """``stage`` reading and writing the columns of the split temporaries; a
    column a loop variable names is a select among the row's columns."""
    ranges = _ranges(stage)

    def load(x):
        if x.buffer not in columns:
            return x
        k, row = _column(x.buffer, x.index, ranges)
        cols = columns[x.buffer]

        def read(col):
            return BufLoad(col, row) if isinstance(x, BufLoad) else GuardedLoad(col, row, x.cond)
        if isinstance(k, int):
            return read(cols[k])
        out = read(cols[-1])
        for n in range(len(cols) - 2, -1, -1):
            out = select(equal(k, const(n, k.dtype)), read(cols[n]), out)
        return out

    sub = substituter({}, load=load)

    def store(s, expr):
        if s.buffer not in columns:
            return Store(s.buffer, expr(s.index), expr(s.value))
        k, row = _column(s.buffer, s.index, {})
        return Store(columns[s.buffer][k], row, expr(s.value))
    own = columns[stage.buffer][0] if stage.buffer in columns else stage.buffer
    return replace(stage, buffer=own, body=map_stmt(stage.body, sub, store=store))
