"""Triangles: a reduction whose range moves with an output row ``i`` (zero
elimination's ``for j in 0..i + 1`` behind a causal mask, ``i..n`` in its
transpose, ``max(0, i - w)..i + 1`` for a window) cannot be register-tiled
as it is: the rows of a tile would run different ranges.  Cut into blocks
of ``B`` rows (the register tile's rows), the rows of a block share one
range, from the largest first of theirs to the smallest end (each bound is
monotone in ``i``, so these are the block's first or last row's): a
rectangle the tile rules treat as any product.  What a row runs beyond it
(at most ``(B - 1) |a|`` steps for a bound of slope ``a``) a second stage
adds to the stored sums: where the rows' ranges do not overlap, the whole
range.

The stage becomes ``.rectangles`` (storing the sums over the shared
ranges) and ``.diagonal`` (loading them and adding each row's rest), each
scheduled from the first rule; rows after the last whole pair of blocks
run as one smaller block (``.rectangles.last``, ``.diagonal.last``).
Blocks run in pairs from both ends, block ``p`` with block ``2 P - 1 - p``:
their rectangles add to the same work for every ``p`` under bounds of
constant slope, so the runtime's equal chunks of the pair loop give the
threads equal work (in row order the first half of a triangle is a
quarter of its work).  The blocks' bounds read the pair and its side
together, in no monotone way, so the rule does not cut its own stages
again.  Each element adds the same terms in another fixed order, which
depends on the target's tile rows only.

The rule applies to an element body that is one accumulator, its loop and
the store of its value (or that under a guard which only skips empty
ranges, ``_unguarded``); the loop may be a nest, each loop the only
statement of the one around it (grouped heads' keys: a sum over the
group's heads, then over rows), the innermost's bounds monotone in one
output loop the others do not read, which is not the innermost output
loop (its rows then stay contiguous) and has two blocks or more.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from te_autodiff.expr import BinOp, Cmp, Const, Var, add, maximum, minimum, mul, sub, var

from ..bounds_check import Scope
from ..bounds_exact import reach
from ..loop_ir import (Alloc, Assign, Block, BufLoad, For, If, Stage, Store, free_leaves, linear_form, map_stmt,
                       nodes_in, simplify_index, stmt_exprs, substitute, substituter, walk)
from .blocking import Blocking
from .constructors import idx
from .interior import drop_tests
from .nest import Nest, accumulation, outer_writes


@dataclass(frozen=True)
class Triangle:
    """In the element ``body`` (``acc = init; for ...; out[...] = acc``) the
    loop runs ``[first, end)``, each bound monotone in the output loop ``i``
    (``slopes``: +1 growing, -1 shrinking, 0 not reading it); ``rows`` rows
    to a block."""

    body: Block
    i: Var
    first: object
    end: object
    slopes: tuple
    rows: int


def _combined(a, b):
    """The direction of a sum (or a max, a min) of terms moving ``a`` and ``b``."""
    if a is None or b is None:
        return None
    return a or b if not (a and b) or a == b else None


def _direction(e, i: Var):
    """+1 when ``e`` never decreases as ``i`` grows, -1 when it never
    increases, 0 when it does not read ``i``; None when it may do both or
    reads another variable: sums of multiples of terms, each ``i``, a
    constant, or a max, a min or a floor division by a positive constant of
    such terms."""
    if free_leaves(e) - {i}:
        return None
    form = linear_form(e)
    if form is None:
        return None
    out = 0
    for atom, k in form[0].items():
        if atom is i:
            d = 1
        elif isinstance(atom, BinOp) and atom.op in ("max", "min"):
            d = _combined(_direction(atom.a, i), _direction(atom.b, i))
        elif isinstance(atom, BinOp) and atom.op == "floordiv" and isinstance(atom.b, Const) and atom.b.value > 0:
            d = _direction(atom.a, i)
        else:
            return None
        out = _combined(out, None if d is None else d * (1 if k > 0 else -1))
    return out


def _chain(loop: For) -> list:
    """``loop`` and the loops nested in it, each the only statement of the one around it."""
    chain = [loop]
    while True:
        body = chain[-1].body
        inner = body.stmts[0] if isinstance(body, Block) and len(body.stmts) == 1 else body
        if not isinstance(inner, For):
            return chain
        chain.append(inner)


def _reduction(body: Block):
    """``(Alloc, loop, Store)`` when ``body`` is ``acc = init; for ...: acc =
    acc op e; out[...] = acc``, the loop a nest of loops each holding only
    the next (a sum over a group of heads, then over rows); None otherwise."""
    stmts = body.stmts
    if len(stmts) != 3 or not (isinstance(stmts[0], Alloc) and isinstance(stmts[1], For)
                               and isinstance(stmts[2], Store)):
        return None
    acc, loop, store = stmts[0].local, stmts[1], stmts[2]
    if store.value is not acc or any(isinstance(s, Alloc) and s.local is acc for s in walk(loop)):
        return None
    writes = outer_writes(loop)
    if not writes or any(w.local is not acc or accumulation(w) is None for w in writes):
        return None
    return stmts


def _nested(chain: list, inner) -> For:
    """The loops of ``chain`` but its innermost around ``inner`` (a loop or a block)."""
    for lp in reversed(chain[:-1]):
        inner = For(lp.var, lp.lo, lp.extent, inner if isinstance(inner, Block) else Block((inner,)), lp.kind)
    return inner


def _unguarded(nest: Nest):
    """The element body without a guard that only skips empty reductions:
    zero elimination writes ``v = c ? (acc = init; for ...) : init`` when
    some rows sum over nothing (a strict mask's first row); where CP-SAT
    proves the loop empty on every output point failing ``c``, the guard
    adds nothing (and hides the bounds from this rule)."""
    stmts = nest.body.stmts
    if len(stmts) != 3 or not (isinstance(stmts[0], Alloc) and stmts[0].init is None and isinstance(stmts[1], If)
                               and isinstance(stmts[2], Store) and stmts[2].value is stmts[0].local):
        return None
    guard, v = stmts[1], stmts[0].local
    then, other = guard.then.stmts, guard.else_.stmts if guard.else_ is not None else ()
    if not (len(then) == 3 and len(other) == 1 and isinstance(then[2], Assign) and isinstance(other[0], Assign)
            and then[2].local is v and other[0].local is v and isinstance(then[0], Alloc)
            and then[2].value is then[0].local and isinstance(then[1], For)):
        return None
    init, skipped = then[0].init, other[0].value
    if not (isinstance(init, Const) and isinstance(skipped, Const) and init.value == skipped.value):
        return None
    doms = {lp.var: (lp.lo, lp.extent) for lp in nest.loops}
    runs = reach(then[1].extent, Scope(doms, conds=((guard.cond, False),)))
    if runs is not None and (runs == "unknown" or runs.hi > 0):
        return None
    body = Block((then[0], then[1], Store(stmts[2].buffer, stmts[2].index, then[0].local)))
    return body if _reduction(body) is not None else None


def decide(nest: Nest, bl: Blocking):
    """The :class:`Triangle` of ``nest``, or None: its element body is
    ``acc = init; for ...: acc = acc op e; out[...] = acc`` (or one under a
    guard ``_unguarded`` drops) with the loop's bounds monotone in an output
    loop ``i`` that is not the innermost and has at least two blocks of the
    target's tile rows."""
    rows = bl.tile_rows
    body = nest.body if _reduction(nest.body) is not None else _unguarded(nest)
    if body is None:
        return None
    chain = _chain(body.stmts[1])
    loop = chain[-1]
    first, end = loop.lo, simplify_index(add(loop.lo, loop.extent))
    for i, n in zip(nest.vars[:-1], nest.extents[:-1]):
        slopes = (_direction(first, i), _direction(end, i))
        if None not in slopes and slopes != (0, 0) and n >= 2 * rows and \
                not any(i in free_leaves(e) for lp in chain[:-1] for e in (lp.lo, lp.extent)):
            return Triangle(body, i, first, end, slopes, rows)
    return None


def _at(e, i: Var, at):
    """The bound ``e`` at ``i = at``."""
    return simplify_index(substitute(e, {i: at}))


def _blocks(nest: Nest, stage: Stage, plan: Triangle, offset: int, rows: int, pairs: int, suffix: str) -> list:
    """``.rectangles`` and ``.diagonal`` stages for blocks of ``rows`` rows
    from row ``offset``: ``2 pairs`` blocks taken in pairs from both ends
    (pair ``p`` is blocks ``p`` and ``2 pairs - 1 - p``), or one block when
    ``pairs`` is 0."""
    i = plan.i
    init, outer, store = plan.body.stmts
    chain = _chain(outer)
    loop = chain[-1]
    pair, side, row = (var(f"{i.name}.{x}{suffix}") for x in "psr")
    block = add(pair, mul(side, sub(idx(2 * pairs - 1), mul(idx(2), pair))))
    start = add(mul(block, idx(rows)), idx(offset)) if pairs else idx(offset)
    here = add(start, row)
    slope_first, slope_end = plan.slopes
    # the range every row of the block runs
    shared_first = _at(plan.first, i, add(start, idx(rows - 1 if slope_first > 0 else 0)))
    shared_end = _at(plan.end, i, add(start, idx(0 if slope_end > 0 else rows - 1)))
    first, end = _at(plan.first, i, here), _at(plan.end, i, here)
    rectangle = For(loop.var, shared_first, sub(shared_end, shared_first), loop.body, loop.kind)
    rest = []
    if slope_first:                       # the row's steps before the shared range
        rest.append(For(loop.var, first, sub(minimum(shared_first, end), first), loop.body, loop.kind))
    if slope_end:                         # and after it
        after = maximum(shared_first, shared_end)
        rest.append(For(loop.var, after, sub(end, after), loop.body, loop.kind))
    loaded = Alloc(init.local, BufLoad(store.buffer, store.index))
    blocks = (For(pair, idx(0), idx(pairs), None), For(side, idx(0), idx(2), None)) if pairs else ()
    loops = [x for lp in nest.loops
             for x in ((*blocks, For(row, idx(0), idx(rows), None)) if lp.var is i else (lp,))]
    out = []
    at_row = substituter({i: here})             # the loops around the pieces do not read the row
    for name, start_with, pieces in (("rectangles", init, (rectangle,)), ("diagonal", loaded, tuple(rest))):
        pieces = tuple(_decided(map_stmt(lp, at_row), loops + chain[:-1]) for lp in pieces)
        inner = _nested(chain, pieces[0] if len(pieces) == 1 else Block(pieces))
        body = Block((map_stmt(start_with, at_row), inner, map_stmt(store, at_row)))
        out.append(replace(stage, name=f"{stage.name}.{name}{suffix}", body=Nest(loops, body).around(body)))
    return out


def _decided(loop: For, outer: list) -> For:
    """``loop`` with the tests in its body that its range decides folded
    away (a mask ``j <= i`` inlined in the summand, true on every step a
    row runs; the guard ``_unguarded`` dropped, repeated inside): each
    order comparison that CP-SAT finds never false (or never true) over
    the output loops ``outer`` and the loop's range."""
    doms = {**{lp.var: (lp.lo, lp.extent) for lp in outer}, loop.var: (loop.lo, loop.extent)}
    tests = []
    for t in dict.fromkeys(nodes_in([x for s in walk(loop.body) for x in stmt_exprs(s)], set(), Cmp)):
        if t.op not in ("lt", "le", "gt", "ge"):
            continue
        for value in (True, False):
            if reach(idx(0), Scope(doms, conds=((t, not value),))) is None:       # no step where it differs
                tests.append((t, value))
                break
    return drop_tests(loop, tests) if tests else loop


def build(nest: Nest, stage: Stage, plan: Triangle) -> list:
    """The stages ``.rectangles`` and ``.diagonal`` of ``stage`` over its
    whole blocks, then over the rows left (one smaller block, ``.last``)."""
    n, rows = nest.extent(plan.i), plan.rows
    pairs = n // (2 * rows)
    out = _blocks(nest, stage, plan, 0, rows, pairs, "")
    left = n - 2 * pairs * rows
    return out + (_blocks(nest, stage, plan, n - left, left, 0, ".last") if left else [])
