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
  a buffer ``P`` touches, and no stage among them keeps to itself; ``P``
  is not a copy (a packed panel: the product after it reads each element
  once a row tile, and joined to its copy could not join its own rows);
- ``P``'s scheduled nest opens with constant loops, the first parallel;
  the first of them (its *outer* loops) have the ranges of the first loops
  of every ``R``, whose next loop, the *row* loop, walks ``P``'s rows.  A
  product with no such loops (its parallel root a column loop: one head,
  two or three, or none; or heads the threads do not share evenly, which
  the root collapses with the columns; or a batch of heads the row stages
  walk in other loops) has none: its whole nest runs for each block, a
  block being a run of one head's rows.  A head is an element of the
  buffer's leading axes (batch, heads); the store's terms in their strides
  name it (a loop's variable, ``x // c`` or ``x % c`` of a collapsed loop
  ``x``), and each loop behind them runs only its digit of the block's
  head.  The ``R`` may walk the rows in up to three loops that lay them
  row after row (a head's rows, heads merged with rows, the batch): each
  runs its digit of the row.  The chain's parallel root is then
  ``Target.threads`` groups of blocks, a slot each (a group runs on one
  thread at a time whatever the threads of a call);
- every store of ``P`` below the outer loops (and its head) is in a *row
  tile* loop, the innermost stepping whole rows, and writes ``MR`` rows
  of a tile, numbered by that loop's variable plus multiples of loops
  around it (blocks of tiles, ``row_blocks.py``: a loop of blocks, or a
  block's first tile), so restricting the tile loop to a block's tiles
  runs exactly the block's part of ``P``; remainder tiles and columns,
  tests and all, run as scheduled;
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
from math import gcd, prod

from te_autodiff.expr import BinOp, add, floordiv, maximum, minimum, mod, mul, sub, var

from .loop_ir import (Block, BufLoad, Buffer, For, GuardedLoad, Program, Stage, Store, free_leaves, from_linear,
                      linear_form, map_loops, map_stmt, stage_buffers, substituter, walk)
from .row_chains import (accesses, atom_range, is_copy, keeps_to_itself, matching_loops, one_row, opening_loops,
                         row_body, row_form, worth_joining)
from .schedule.constructors import idx
from .target import Target


@dataclass(frozen=True)
class _Heads:
    """The heads a product with no outer loops computes in one nest (the
    buffer's leading axes: batch and heads): ``count`` of them, ``rows``
    rows each; ``atoms`` pairs each term of a store's index in a leading
    axis (a loop's variable, or ``x // c`` or ``x % c`` of a loop ``x``
    that walks heads and columns together) with how many heads one step of
    it moves and how many values it takes; none for one head."""

    count: int
    rows: int
    atoms: tuple


@dataclass(frozen=True)
class _Plan:
    """How a product joins its row stages: its outer loops and the members'
    row loop are the ``rows`` (with no outer loops, the members' one or two
    row loops: rows, or rows and heads); a row steps ``width`` elements of
    its buffer, a tile ``mr`` rows; ``tiles`` maps the variable of each row
    tile loop to the pairs ``(atom, multiple)`` added to it to number its
    tile (blocks of rows around it: ``(i.b * 171 // 2, 1)``, ``(i.b, 94)``);
    ``steps`` are the members' steps in the buffer along the ``rows``;
    ``heads`` with no outer loops."""

    rows: list
    steps: tuple
    width: int
    mr: int
    tiles: dict
    heads: _Heads | None = None


def _row_tile(terms: dict, lo: int, ranges: dict, loops: dict, width: int):
    """``(variable, base, mr)`` of a store of the product whose index, its
    outer loops' and heads' terms taken out, is ``terms`` plus ``lo``,
    inside the loops of ``ranges`` (outermost first; ``loops`` names the
    serial ones by variable): ``mr * width`` times the tile number (the
    ``variable`` of a loop around the store, plus ``base``, pairs of an
    atom fixed inside that loop and its multiple: blocks of tiles around
    it) plus the rest, loops of known range within one tile's rows; None
    otherwise.  The tile loop is the innermost that steps whole rows; a
    loop that only takes the value 0 (a head's, with one head) numbers
    nothing."""
    terms = dict(terms)
    around = [v for v in ranges if v in loops and terms.get(v, 0) > 0 and terms[v] % width == 0
              and ranges[v] != (0, 0)]
    if not around:
        return None
    tile = around[-1]
    step = terms.pop(tile)
    inside = set(list(ranges)[list(ranges).index(tile):])
    base = tuple((a, k // step) for a, k in terms.items() if k % step == 0 and not free_leaves(a) & inside)
    hi = lo
    for a, k in terms.items():
        if any(a is b for b, _ in base):
            continue
        span = atom_range(a, ranges)
        if span is None:
            return None
        lo, hi = lo + min(k * span[0], k * span[1]), hi + max(k * span[0], k * span[1])
    return (tile, base, step // width) if 0 <= lo and hi < step else None


def _head_atoms(terms: dict, ranges: dict, loops: dict, shape: tuple, width: int):
    """``(atoms, rest)``: the terms of a store's index in the buffer's leading
    axes (``shape[:-2]``; each row of ``width`` elements), as
    ``(atom, heads a step, values)`` (outermost axis first), and the other
    terms; None if such a term is not a loop's variable, ``x // c`` or
    ``x % c`` of one, within its axis, or two name one loop."""
    if len(shape) < 3 or shape[-1] != width:
        return (), terms
    unit = shape[-2] * width
    axes = {prod(shape[k + 1:]): shape[k] for k in range(len(shape) - 2) if shape[k] > 1}   # one head: 0 only
    atoms, rest = [], dict(terms)
    for a, k in terms.items():
        span = atom_range(a, ranges)
        if k % unit or span == (0, 0):
            continue
        v = a if a in loops else a.a if isinstance(a, BinOp) and a.op in ("floordiv", "mod") and a.a in loops \
            else None
        if v is None or k not in axes or span is None or span[0] < 0 or span[1] >= axes[k]:
            return None
        atoms.append((a, k // unit, axes[k], v))
        del rest[a]
    if len({v for *_, v in atoms}) < len(atoms):
        return None
    return tuple(sorted((x[:3] for x in atoms), key=lambda x: -x[1])), rest


def _tile_loops(p: Stage, outer: list, steps: tuple, width: int, rows: int = 0):
    """``(tiles, mr, heads)`` of product ``p`` (see :class:`_Plan`): every
    store in its nest below the ``outer`` loops goes to its own buffer, in
    a row tile loop, every tile ``mr`` rows; with no outer loops, the heads
    (:class:`_Heads`) among the ``rows`` the members walk; None otherwise."""
    found, inner = [], _below(p, outer)
    accesses(inner, {}, found)
    loops = {s.var: s for s in walk(inner) if isinstance(s, For)}
    heads, tiles, mrs = set(), {}, set()
    for b, index, ranges, store in found:
        if not store:
            continue
        form = linear_form(index) if b is p.buffer else None
        if form is None:
            return None
        terms, lo = dict(form[0]), form[1]
        if any(terms.pop(lp.var, 0) != k for lp, k in zip(outer, steps)):
            return None
        if not outer:
            split = _head_atoms(terms, ranges, loops, p.buffer.shape, width)
            if split is None:
                return None
            heads.add(split[0])
            terms = split[1]
        row = _row_tile(terms, lo, ranges, loops, width)
        if row is None or tiles.setdefault(row[0], row[1]) != row[1]:
            return None
        mrs.add(row[2])
    if len(mrs) != 1 or len(heads) > 1:
        return None
    (mr,) = mrs
    if outer:
        return tiles, mr, None
    (atoms,) = heads
    per = p.buffer.shape[-2] if atoms else rows
    if rows % per or (atoms and rows != prod(p.buffer.shape[:-1])):
        return None
    return tiles, mr, _Heads(rows // per, per, atoms)


def _below(p: Stage, outer: list):
    """``p``'s nest below its ``outer`` loops; with none, its whole nest,
    the parallel root made serial (the chain's groups are parallel)."""
    return outer[-1].body if outer else replace(p.body, kind="serial")


def _rows_of(p: Stage, members: list, outer: int, depth: int = 1):
    """The rows ``members`` run over: ``p``'s first ``outer`` loops and the
    ``depth`` loops of the first member left after them; None if the
    members do not open with those ranges."""
    loops = opening_loops(p)[:outer]
    first = opening_loops(members[0])[:outer + depth]
    matched = matching_loops(loops, members[0])
    if len(first) < outer + depth or matched is None:
        return None
    row = [lp for lp in first if all(lp is not m for m in matched)]
    rows = loops + row
    return rows if len(row) == depth and all(matching_loops(rows, st) is not None for st in members) else None


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
    for outer, depth in [(n, 1) for n in range(len(opening_loops(p)), 0, -1)] + [(0, 1), (0, 2), (0, 3)]:
        rows = _rows_of(p, members, outer, depth)
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
        if outer:
            found = _tile_loops(p, rows[:-1], steps[:-1], steps[-1])
        else:                                   # the rows lie row after row: one flat run of them
            radix = sorted(zip(steps, [r.extent.value for r in rows]))
            flat = all(big == small * n for (small, n), (big, _) in zip(radix, radix[1:]))
            found = _tile_loops(p, [], (), radix[0][0], prod(r.extent.value for r in rows)) if flat else None
        if found is not None:
            return _Plan(rows, steps, min(steps) if not outer else steps[-1], found[1], found[0], found[2])
    return None


def _block_bytes(target: Target) -> int:
    """The most of the product's buffer a block holds (see :func:`_blocks`)."""
    return max(target.l2_bytes, target.l3_bytes) // 4


def _blocks(tiles: int, tile_bytes: int, target: Target, groups: int, heads: int = 1) -> tuple:
    """``(tiles a block, blocks a head)``: a block's part of the product's
    buffer in a quarter of a thread's share of the last cache (L2 without
    an L3): it must stay cached from the product's write to the row
    stages' read, the product's column operand and the rows the row stages
    stream share the rest, and the product reads its column operand again
    for every block, so the blocks are as tall as that allows; as equal as
    whole tiles allow, and as many over the ``heads`` as a multiple of the
    ``groups`` that share them out."""
    count = max(1, -(-tiles * tile_bytes // _block_bytes(target)))
    step = groups // gcd(groups, heads)
    count = -(-count // step) * step
    per = -(-tiles // count)
    return per, -(-tiles // per)


def _clipped(s, tiles: dict, first, per: int):
    """``s`` with each row tile loop of ``tiles`` running only the tiles
    ``[first, first + per)``."""
    def clip(loop):
        if loop.var not in tiles:
            return replace(loop, body=map_loops(loop.body, clip))
        base = from_linear(dict(tiles[loop.var]), 0)
        lo = maximum(loop.lo, sub(first, base))
        hi = minimum(add(loop.lo, loop.extent), sub(add(first, idx(per)), base))
        return For(loop.var, lo, sub(hi, lo), loop.body, loop.kind)
    return map_loops(s, clip)


def _one_head(s, atom, head):
    """``s`` with the loop that numbers heads by ``atom`` running only over
    ``head``'s iterations: its variable, or ``x // c`` (``x`` clipped to
    ``c`` iterations), or ``x % c`` (every ``c``-th iteration of ``x``
    from ``head``: the loop walks ``x = c * x' + head``)."""
    v, c = (atom, 1) if not isinstance(atom, BinOp) else (atom.a, atom.b.value)

    def clip(loop):
        if loop.var is not v:
            return replace(loop, body=map_loops(loop.body, clip))
        if isinstance(atom, BinOp) and atom.op == "mod":
            every = var(f"{v.name}.h")
            start = add(loop.lo, mod(sub(head, loop.lo), idx(c)))
            count = floordiv(sub(add(loop.lo, loop.extent), add(start, idx(1 - c))), idx(c))
            return For(every, idx(0), count, map_stmt(loop.body, substituter({v: add(mul(every, idx(c)), start)})),
                       loop.kind)
        lo = maximum(loop.lo, mul(head, idx(c)))
        hi = minimum(add(loop.lo, loop.extent), mul(add(head, idx(1)), idx(c)))
        return For(loop.var, lo, sub(hi, lo), loop.body, loop.kind)
    return map_loops(s, clip)


def _join(p: Stage, members: list, plan: _Plan, target: Target) -> tuple:
    """``(stage, buffer)``: ``p`` and ``members`` as one stage, the product's
    buffer shrunk to a block a slot."""
    if plan.heads is not None:
        return _join_groups(p, members, plan, target)
    outer, row = plan.rows[:-1], plan.rows[-1]
    rows, tiles = row.extent.value, -(-row.extent.value // plan.mr)
    per, count = _blocks(tiles, plan.mr * plan.width * p.buffer.itemsize, target, 1)
    span = per * plan.mr
    block, local = var(f"{row.var.name}.B"), var(f"{row.var.name}.b")
    product = _clipped(_below(p, outer), plan.tiles, mul(block, idx(per)), per)
    at_row = substituter({row.var: add(mul(block, idx(span)), local)})
    bodies = [map_stmt(row_body(st, plan.rows), at_row) for st in members]
    extent = idx(span) if rows % span == 0 else minimum(idx(span), sub(idx(rows), mul(block, idx(span))))
    nest = For(block, idx(0), idx(count), Block((product, For(local, idx(0), extent, _flat(bodies)))))
    slots = [lp.extent.value for lp in outer]
    size = span * plan.width
    buffer = Buffer(p.buffer.name, (prod(slots), span, plan.width), p.buffer.dtype, p.buffer.kind)
    strides = [prod(slots[k + 1:]) * size for k in range(len(slots))]
    offset = from_linear({lp.var: k for lp, k in zip(outer, plan.steps)} | {block: size}, 0)
    slot = from_linear({lp.var: k for lp, k in zip(outer, strides)},
                       -sum(k * lp.lo.value for lp, k in zip(outer, strides)))
    nest = _shrunk(nest, p.buffer, buffer, offset, slot)
    for lp in reversed(outer):
        nest = replace(lp, body=nest)
    return Stage("+".join(st.name for st in [p] + members), buffer, nest), buffer


def _join_groups(p: Stage, members: list, plan: _Plan, target: Target) -> tuple:
    """:func:`_join` for a product with no outer loops: ``Target.threads``
    groups share its blocks, a slot each; a block is a run of one head's
    rows, the product's nest run for that head (each leading axis's loop
    for its digit of the head) and those tiles; the members walk the
    block's rows of their flat run, each row loop its digit of the row."""
    heads, groups = plan.heads, target.threads
    tiles = -(-heads.rows // plan.mr)
    per, nb = _blocks(tiles, plan.mr * plan.width * p.buffer.itemsize, target, groups, heads.count)
    span, count = per * plan.mr, nb * heads.count
    radix = sorted(zip(plan.steps, plan.rows), key=lambda x: x[0])
    block, local, group = (var(f"{radix[0][1].var.name}.{x}") for x in "BbG")
    head, first = (idx(0), block) if heads.count == 1 else (floordiv(block, idx(nb)), mod(block, idx(nb)))
    first_row = mul(first, idx(span))
    row = add(first_row, local) if heads.count == 1 else add(add(mul(head, idx(heads.rows)), first_row), local)
    at = {}
    for k, (_, lp) in enumerate(radix):         # a row loop's digit of the row: (row // below) % extent
        at[lp.var] = row if k == len(radix) - 1 else mod(row, lp.extent)
        row = floordiv(row, lp.extent)
    bodies = [map_stmt(row_body(st, plan.rows), substituter(at)) for st in members]
    extent = idx(span) if heads.rows % span == 0 else minimum(idx(span), sub(idx(heads.rows), first_row))
    members_nest = For(local, idx(0), extent, _flat(bodies))
    unit = heads.rows * plan.width
    buffer = Buffer(p.buffer.name, (groups, span, plan.width), p.buffer.dtype, p.buffer.kind)
    slot = mul(group, idx(span * plan.width))
    shift = mul(first_row, idx(plan.width))
    offset = shift
    for atom, step, _ in heads.atoms:
        offset = add(offset, mul(atom, idx(step * unit)))
    product = _shrunk(_clipped(_below(p, []), plan.tiles, mul(first, idx(per)), per), p.buffer, buffer, offset, slot)
    for atom, step, values in heads.atoms:      # after the shrink: the product's index names a head by its atoms
        product = _one_head(product, atom, mod(floordiv(head, idx(step)), idx(values)))
    members_nest = _shrunk(members_nest, p.buffer, buffer, add(mul(head, idx(unit)), shift), slot)
    lo = floordiv(mul(group, idx(count)), idx(groups))
    nest = For(block, lo, sub(floordiv(mul(add(group, idx(1)), idx(count)), idx(groups)), lo),
               Block((product, members_nest)))
    stage = Stage("+".join(st.name for st in [p] + members), buffer, For(group, idx(0), idx(groups), nest, "parallel"))
    return stage, buffer


def _flat(bodies: list) -> Block:
    return Block(tuple(s for b in bodies for s in (b.stmts if isinstance(b, Block) else (b,))))


def _shrunk(nest, old: Buffer, new: Buffer, offset, slot):
    """``nest`` with ``old`` replaced by ``new``: each index less ``offset``
    (where the block's first element lies in ``old``) plus ``slot`` (where
    its slot begins in ``new``)."""
    (less, c_less), (more, c_more) = linear_form(offset), linear_form(slot)

    def index(e):                       # the index's own terms keep their order, new ones go last
        terms, c = linear_form(e)
        terms = dict(terms)
        for atom, k in [(a, -k) for a, k in less.items()] + list(more.items()):
            terms[atom] = terms.get(atom, 0) + k
        return from_linear({a: k for a, k in terms.items() if k}, c - c_less + c_more)

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
        if p.buffer.kind == "temp" and last > n and not keeps_to_itself(p) and not is_copy(p) and \
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
