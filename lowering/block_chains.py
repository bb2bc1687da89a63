"""Block chains: a stage whose buffer only the row stages right after it
read runs with them a block of its rows at a time, and its buffer shrinks
to a block.

Attention's scores ``S = Q Kᵀ`` are ``T x T`` a head; the softmax after
them reads each row of ``S`` once (``row_chains.py`` runs its stages row
by row), and nothing else reads ``S``; the same holds for the gradient's
``dP = H Vᵀ``.  Apart, the product writes the whole matrix and the row
stages read it back: a ``T x T`` temporary, beyond the caches from ``T``
of a few hundred.  Run as one stage, ``for each block of rows: the
product's tiles of the block (all its column tiles); for each row of the
block: the row stages``, a block is read from the caches right after the
product wrote it, and the buffer holds one block for each iteration of
the loops outside the blocks (a slot each: the threads running the
parallel root's iterations never share one).

A product ``P`` joins the stages ``R1, R2...`` after it up to the last
that touches its buffer when

- the buffer is a temporary, ``P`` does not read it, no ``R`` writes it or
  a buffer ``P`` touches, and no stage among them keeps to itself;
- ``P``'s scheduled nest opens with constant loops, the first parallel;
  the first of them (its *outer* loops) have the ranges of the first loops
  of every ``R``, whose next loop, the *row* loop, walks ``P``'s rows.  A
  product with no such loops (its parallel root a column loop: one head,
  or none) has none: its whole nest runs for each block, and the chain's
  parallel root is ``Target.threads`` groups of blocks, a slot each (a
  group runs on one thread at a time whatever the threads of a call);
  two or three heads, or heads the threads share unevenly (their root
  collapses the heads with the columns), stay apart;
- every store of ``P`` below the outer loops is in a *row tile* loop and
  writes ``MR`` rows of a tile, numbered by that loop's variable (plus a
  row block's first tile, ``tile_loops.py``), so restricting those loops
  to a block's tiles runs exactly the block's part of ``P``; remainder
  tiles and columns, tests and all, run as scheduled;
- every ``R`` touches ``P``'s buffer or one an earlier ``R`` wrote; each
  such buffer, and every buffer one ``R`` writes and another touches, is
  touched by each ``R`` at its own row only (``row_chains.py``'s test), so
  a row reads only what ``P`` and the ``R`` before it wrote for that row;
- it gains, as ``row_chains.py`` asks: ``P``'s buffer, a thread's share,
  would leave L2 between the stages run apart, and its row is a cache line
  at least; and a tile of ``P`` fits a block (below).

A block holds as many row tiles as keep its part of ``P``'s buffer in a
quarter of a thread's share of the last cache (``_blocks``).  Each element
keeps its operations and their order.  A buffer a later stage reads stays
whole and its stages apart: joined, the block would only save reading it
back, which measured no faster than the stages' own streams."""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from te_autodiff.expr import add, floordiv, maximum, minimum, mul, sub, var

from .loop_ir import (Block, BufLoad, Buffer, For, GuardedLoad, Program, Stage, Store, free_leaves, from_linear,
                      linear_form, map_loops, map_stmt, stage_buffers, substituter, walk)
from .row_chains import (accesses, keeps_to_itself, matching_loops, one_row, opening_loops, row_body, row_form,
                         worth_joining)
from .schedule.constructors import idx
from .target import Target


@dataclass(frozen=True)
class _Plan:
    """How a product joins its row stages: its outer loops and the members'
    row loop are the ``rows``; a row steps ``width`` elements of its
    buffer, a tile ``mr`` rows; ``tiles`` maps the variable of each row
    tile loop to the atoms added to it to number its tile (a block of rows
    around it: ``i.b * 171 // 2``), if any."""

    rows: list
    width: int
    mr: int
    tiles: dict


def _row_tile(index, ranges: dict, loops: dict, outer: list, steps: tuple, width: int):
    """``(variable, base, mr)`` of a store of the product at ``index``,
    inside the loops of ``ranges`` (outermost first; ``loops`` names the
    serial ones by variable): the index is the ``outer`` loops' ``steps``
    plus ``mr * width`` times the tile number (the ``variable`` of a loop
    around the store, plus the atoms ``base`` fixed inside it) plus the
    rest, loops of known range within one tile's rows; None otherwise.
    The tile loop is the one of the largest step; a loop that only takes
    the value 0 (a head's, with one head) numbers nothing."""
    form = linear_form(index)
    if form is None:
        return None
    terms, lo = form
    if any(terms.pop(lp.var, 0) != k for lp, k in zip(outer, steps)):
        return None
    around = [v for v in ranges if v in loops and v in terms and ranges[v] != (0, 0)]
    if not around:
        return None
    tile = max(around, key=lambda v: abs(terms[v]))
    step = terms.pop(tile)
    mr, rem = divmod(step, width)
    inside = set(list(ranges)[list(ranges).index(tile):])
    base = tuple(a for a, k in terms.items() if k == step)
    if rem or mr < 1 or any(free_leaves(a) & inside for a in base):
        return None
    hi = lo
    for a, k in terms.items():
        if a in base:
            continue
        span = ranges.get(a)
        if span is None:
            return None
        lo, hi = lo + min(k * span[0], k * span[1]), hi + max(k * span[0], k * span[1])
    return (tile, base, mr) if 0 <= lo and hi < step else None


def _tile_loops(p: Stage, outer: list, steps: tuple, width: int):
    """``(tiles, mr)`` of product ``p`` (see :class:`_Plan`): every store in
    its nest below the ``outer`` loops goes to its own buffer, in a row tile
    loop, every tile ``mr`` rows; None otherwise."""
    found, inner = [], _below(p, outer)
    accesses(inner, {}, found)
    loops = {s.var: s for s in walk(inner) if isinstance(s, For)}
    rows = [_row_tile(index, ranges, loops, outer, steps, width) if b is p.buffer else None
            for b, index, ranges, store in found if store]
    tiles = {}
    if not rows or None in rows or len({mr for _, _, mr in rows}) > 1 or \
            any(tiles.setdefault(tile, base) != base for tile, base, _ in rows):
        return None
    return tiles, rows[0][2]


def _below(p: Stage, outer: list):
    """``p``'s nest below its ``outer`` loops; with none, its whole nest,
    the parallel root made serial (the chain's groups are parallel)."""
    return outer[-1].body if outer else replace(p.body, kind="serial")


def _rows_of(p: Stage, members: list, outer: int):
    """The rows ``members`` run over: ``p``'s first ``outer`` loops and the
    one loop of the first member left after them; None if the members do
    not open with those ranges."""
    loops = opening_loops(p)[:outer]
    first = opening_loops(members[0])[:outer + 1]
    matched = matching_loops(loops, members[0])
    if len(first) <= outer or matched is None:
        return None
    row = [lp for lp in first if all(lp is not m for m in matched)]
    rows = loops + row
    return rows if len(row) == 1 and all(matching_loops(rows, st) is not None for st in members) else None


def _member_accesses(members: list, rows: list) -> dict:
    """``{buffer: [(index, ranges, store, member)]}`` of the members' row bodies."""
    out = {}
    for k, st in enumerate(members):
        found = []
        accesses(row_body(st, rows), {}, found)
        for b, index, ranges, store in found:
            out.setdefault(b, []).append((index, ranges, store, k))
    return out


def _plan(p: Stage, members: list) -> _Plan | None:
    """How ``p`` joins ``members`` (see the module doc), or None."""
    if p.buffer in stage_buffers(p)[1]:
        return None
    for outer in range(len(opening_loops(p)), -1, -1):
        rows = _rows_of(p, members, outer)
        if rows is None:
            continue
        acc = _member_accesses(members, rows)
        written = {b for b, xs in acc.items() if any(x[2] for x in xs)}
        if p.buffer in written or written & set(stage_buffers(p)[0]):
            return None
        shared = {p.buffer} | {b for b in written if len({x[3] for x in acc[b]}) > 1}
        forms = {b: [row_form(x[0], rows, x[1]) for x in acc.get(b, ())] for b in shared}
        if not forms[p.buffer] or not all(one_row(f, [r.extent.value for r in rows]) for f in forms.values()) \
                or not all(any(k in {x[3] for x in acc[b]} for b in shared) for k in range(len(members))):
            continue
        steps = forms[p.buffer][0][0]
        found = _tile_loops(p, rows[:-1], steps[:-1], steps[-1])
        if found is not None:
            return _Plan(rows, steps[-1], found[1], found[0])
    return None


def _block_bytes(target: Target) -> int:
    """The most of the product's buffer a block holds (see :func:`_blocks`)."""
    return max(target.l2_bytes, target.l3_bytes) // 4


def _blocks(tiles: int, tile_bytes: int, target: Target, groups: int) -> tuple:
    """``(tiles a block, blocks)``: a block's part of the product's buffer in
    a quarter of a thread's share of the last cache (L2 without an L3): it
    must stay cached from the product's write to the row stages' read, the
    product's column operand and the rows the row stages stream share the
    rest, and the product reads its column operand again for every block,
    so the blocks are as tall as that allows; as equal as whole tiles allow,
    and as many as a multiple of the ``groups`` that share them out."""
    count = -(-tiles * tile_bytes // _block_bytes(target))
    count = -(-max(1, count) // groups) * groups
    per = -(-tiles // count)
    return per, -(-tiles // per)


def _clipped(s, tiles: dict, first, per: int):
    """``s`` with each row tile loop of ``tiles`` running only the tiles
    ``[first, first + per)``."""
    def clip(loop):
        if loop.var not in tiles:
            return replace(loop, body=map_loops(loop.body, clip))
        base = from_linear({a: 1 for a in tiles[loop.var]}, 0)
        lo = maximum(loop.lo, sub(first, base))
        hi = minimum(add(loop.lo, loop.extent), sub(add(first, idx(per)), base))
        return For(loop.var, lo, sub(hi, lo), loop.body, loop.kind)
    return map_loops(s, clip)


def _join(p: Stage, members: list, plan: _Plan, target: Target) -> tuple:
    """``(stage, buffer)``: ``p`` and ``members`` as one stage, the product's
    buffer shrunk to a block a slot."""
    outer, row = plan.rows[:-1], plan.rows[-1]
    rows, tiles = row.extent.value, -(-row.extent.value // plan.mr)
    groups = 1 if outer else target.threads
    per, count = _blocks(tiles, plan.mr * plan.width * p.buffer.itemsize, target, groups)
    span = per * plan.mr
    block, local = var(f"{row.var.name}.B"), var(f"{row.var.name}.b")
    product = _clipped(_below(p, outer), plan.tiles, mul(block, idx(per)), per)
    at_row = substituter({row.var: add(mul(block, idx(span)), local)})
    bodies = [map_stmt(row_body(st, plan.rows), at_row) for st in members]
    extent = idx(span) if rows % span == 0 else minimum(idx(span), sub(idx(rows), mul(block, idx(span))))
    row_loop = For(local, idx(0), extent,
                   Block(tuple(s for b in bodies for s in (b.stmts if isinstance(b, Block) else (b,)))))
    nest = Block((product, row_loop))
    if outer:
        nest = For(block, idx(0), idx(count), nest)
    else:                                   # no outer loops: the threads' groups of blocks are the slots
        group = var(f"{row.var.name}.G")
        first = floordiv(mul(group, idx(count)), idx(groups))
        nest = For(block, first, sub(floordiv(mul(add(group, idx(1)), idx(count)), idx(groups)), first), nest)
        outer = [For(group, idx(0), idx(groups), nest, "parallel")]
    slots = [lp.extent.value for lp in outer]
    buffer = Buffer(p.buffer.name, (prod(slots), span, plan.width), p.buffer.dtype, p.buffer.kind)
    nest = _shrunk(nest, p.buffer, buffer, outer, slots, block, span * plan.width)
    for lp in reversed(outer):
        nest = replace(lp, body=nest)
    return Stage("+".join(st.name for st in [p] + members), buffer, nest), buffer


def _shrunk(nest, old: Buffer, new: Buffer, outer: list, slots: list, block, size: int):
    """``nest`` with ``old`` replaced by ``new``: a block of ``size``
    elements a slot, one slot per iteration of the ``outer`` loops."""
    strides = [prod(slots[k + 1:]) * size for k in range(len(slots))]

    def index(e):
        terms, c = linear_form(e)
        k = terms.pop(block, 0) - size      # the members number rows from the block's first, the product from 0
        if k:
            terms[block] = k
        for lp, s in zip(outer, strides):
            terms[lp.var] = s
            c -= s * lp.lo.value
        return from_linear(terms, c)

    def load(x):
        if x.buffer is not old:
            return x
        return BufLoad(new, index(x.index)) if isinstance(x, BufLoad) else GuardedLoad(new, index(x.index), x.cond)

    sub_ = substituter({}, load=load)

    def store(s, expr):
        return Store(new, index(expr(s.index)), expr(s.value)) if s.buffer is old else \
            Store(s.buffer, expr(s.index), expr(s.value))
    return map_stmt(nest, sub_, store=store)


def join_blocks(program: Program, target: Target) -> Program:
    """``program`` with each product joined to the row stages after it
    that read its rows, when they are all that touch its buffer (see the
    module doc)."""
    stages, out, n, swap = list(program.stages), [], 0, {}
    users = {}
    for k, st in enumerate(stages):
        for b in stage_buffers(st)[0]:
            users.setdefault(b, set()).add(k)
    while n < len(stages):
        p, plan = stages[n], None
        last = max(users[p.buffer])
        if p.buffer.kind == "temp" and last > n and not keeps_to_itself(p) and \
                not any(keeps_to_itself(st) for st in stages[n + 1:last + 1]):
            plan = _plan(p, stages[n + 1:last + 1])
        if plan is None or plan.mr * plan.width * p.buffer.itemsize > _block_bytes(target) or \
                not worth_joining((plan.width * p.buffer.itemsize, p.buffer.nbytes), target):
            out.append(p)
            n += 1
            continue
        stage, swap[p.buffer] = _join(p, stages[n + 1:last + 1], plan, target)
        out.append(stage)
        n = last + 1
    return replace(program, stages=tuple(out), buffers=tuple(swap.get(b, b) for b in program.buffers))
