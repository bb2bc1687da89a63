"""Row chains: consecutive scheduled stages that walk the same rows run as
one stage, a row's work of each in turn.

A softmax is four stages over the rows of one ``T x T`` matrix: the row's
maximum, ``exp``, the row's sum, the quotient; its gradient four more.  Run
apart, each streams the whole matrix through memory (16 MB per head at
``T`` 2048, far beyond L2), so a row written by one stage has left the
caches when the next reads it.  Run as one stage, ``for row: max; exp;
sum; quotient``, the row a stage writes is in L1 when the next reads it:
each matrix crosses memory once.

Stages join when their scheduled nests open with the same loops (the same
ranges in any order; the first stage's order is kept), each shares a
buffer with another (one writes it, the other touches it: stages that
share nothing gain nothing), and every such buffer is touched at one row
only: an affine index whose terms in those loops are the same in every
access, rows disjoint (each loop's step at least the span of the loops
inside it), the rest inside one row (checked over the loops' ranges, a
tile's remainder branch narrowing them).  A row then reads only what the
stages before it wrote for that row, as they ran in turn before.  The rows
are the most loops that holds for; a row of the shared buffers must fit in
half of L2 (whole heads would gain nothing).

A chain joins only where it gains: its shared buffers, a thread's share of
them, would leave L2 between the stages run apart (smaller ones stay there
anyway, and one loop over several bodies ran slower than the stages), and
a row of them is a cache line at least (a value per row is cheap to read
back; rows joined would only read one input twice, and the second stage's
stream through memory, ramped up over the whole input when apart, would
start afresh each row).

Each element keeps its operations and the order of its reductions (LLVM
may still round a last bit differently in the new surroundings: a
reciprocal one body computes can stand for another's division).  Stages
with index checks, a scan's step, a counting sort or a hand-written body
keep to themselves (a failed check is reported by the stage that ran it
first), as do stages the schedule split to run ``apart`` (column groups,
``schedule/column_groups.py``: joined, each block of rows would read every
group's slice of the column operand again)."""
from __future__ import annotations

from dataclasses import replace

from te_autodiff.expr import BinOp, Cmp, Const

from .loop_ir import (Block, BufLoad, Check, For, GuardedLoad, If, Program, Simd, Stage, Store, linear_form, loads_in,
                      map_stmt, stage_buffers, stmt_exprs, substituter, walk)
from .target import Target


def opening_loops(stage: Stage) -> list:
    """The perfectly nested loops ``stage`` opens with (constant ranges, the
    first parallel, the others serial)."""
    loops, s = [], stage.body
    while isinstance(s, For) and isinstance(s.lo, Const) and isinstance(s.extent, Const) \
            and s.kind == ("parallel" if not loops else "serial"):
        loops.append(s)
        s = s.body.stmts[0] if isinstance(s.body, Block) and len(s.body.stmts) == 1 else s.body
    return loops


def matching_loops(rows: list, stage: Stage):
    """``stage``'s first ``len(rows)`` loops in the order of ``rows``, the
    same ranges in any order (ties in their own order); None if they differ.
    Rows are independent, so the chain may walk them in its own order."""
    mine = opening_loops(stage)[:len(rows)]
    if len(mine) < len(rows):
        return None
    left, out = list(mine), []
    for r in rows:
        same = next((x for x in left if (x.lo.value, x.extent.value) == (r.lo.value, r.extent.value)), None)
        if same is None:
            return None
        left.remove(same)
        out.append(same)
    return out


def _common(first: Stage, stage: Stage) -> int:
    """How many of ``first``'s opening loops ``stage`` opens with too."""
    rows = opening_loops(first)
    return max((d for d in range(len(rows) + 1) if matching_loops(rows[:d], stage) is not None), default=0)


def row_body(stage: Stage, rows: list):
    """What ``stage`` runs for one row: the body inside its first
    ``len(rows)`` loops, their variables renamed to those of ``rows``."""
    body = opening_loops(stage)[len(rows) - 1].body
    mapping = {a.var: b.var for a, b in zip(matching_loops(rows, stage), rows) if a.var is not b.var}
    return map_stmt(body, substituter(mapping)) if mapping else body


def accesses(stmt, ranges: dict, out: list, visited=None):
    """``(buffer, index, ranges, store)`` of every load and store in
    ``stmt``, with the ranges of the loops around it (``None`` for a loop
    whose range is not constant); a load met again under the same ranges
    (``visited``) is listed once."""
    visited = set() if visited is None else visited
    if isinstance(stmt, Block):
        for s in stmt.stmts:
            accesses(s, ranges, out, visited)
        return
    out += [(x.buffer, x.index, ranges, False) for x in loads_in(stmt_exprs(stmt), visited)]
    if isinstance(stmt, Store):
        out.append((stmt.buffer, stmt.index, ranges, True))
    elif isinstance(stmt, (For, Simd)):
        lo, n = stmt.lo, stmt.extent if isinstance(stmt, For) else stmt.count
        span = (lo.value, lo.value + max(n.value, 1) - 1) if isinstance(lo, Const) and isinstance(n, Const) else None
        accesses(stmt.body, {**ranges, stmt.var: span}, out)
    elif isinstance(stmt, If):
        then, else_ = narrowed(stmt.cond, ranges)
        accesses(stmt.then, then, out)
        if stmt.else_ is not None:
            accesses(stmt.else_, else_, out)


def narrowed(cond, ranges: dict):
    """The loop ranges in the two branches of ``if cond`` (a tile's remainder:
    ``if j.o < n``, or ``if a.j.o % 25 < 24`` where heads and columns share
    a loop: then the range of that atom); unchanged for any other condition."""
    span = atom_range(cond.a, ranges) if isinstance(cond, Cmp) and cond.op == "lt" and \
        isinstance(cond.b, Const) else None
    if span is None:
        return ranges, ranges
    (lo, hi), n = span, cond.b.value
    return {**ranges, cond.a: (lo, min(hi, n - 1))}, {**ranges, cond.a: (max(lo, n), hi)}


def atom_range(atom, ranges: dict):
    """``(lo, hi)`` of a loop variable, or of ``x % c`` / ``x // c`` of one
    (``c`` a positive constant), inside loops of ``ranges``; None otherwise."""
    if atom in ranges:
        return ranges[atom]
    if not (isinstance(atom, BinOp) and atom.op in ("mod", "floordiv") and isinstance(atom.b, Const)
            and atom.b.value > 0 and ranges.get(atom.a) is not None):
        return None
    c, (lo, hi) = atom.b.value, ranges[atom.a]
    return (0, c - 1) if atom.op == "mod" else (lo // c, hi // c)


def row_form(index, rows: list, ranges: dict):
    """``(steps, first, last)`` of an access at ``index``: its term in each of
    the ``rows`` loops (its stage's own) and the range of the rest; None
    unless affine with every other term a loop of known range (or ``x % c``,
    ``x // c`` of one)."""
    form = linear_form(index)
    if form is None:
        return None
    terms, lo = form
    hi = lo
    for v, k in terms.items():
        if any(v is r.var for r in rows):
            continue
        span = atom_range(v, ranges)
        if span is None:
            return None
        lo, hi = lo + min(k * span[0], k * span[1]), hi + max(k * span[0], k * span[1])
    return tuple(terms.get(r.var, 0) for r in rows), lo, hi


def one_row(found: list, extents: list) -> bool:
    """Whether accesses ``found`` (``row_form`` of each) each stay in the row
    their loops (of ``extents`` iterations) name: the same step per loop in
    all, every step positive and at least the span of the loops inside it,
    the rest in ``[0, least step)``."""
    if any(f is None for f in found) or len({f[0] for f in found}) != 1:
        return False
    order = sorted(zip(found[0][0], extents))
    if order[0][0] <= 0 or any(big < small * n for (small, n), (big, _) in zip(order, order[1:])):
        return False
    return all(0 <= lo and hi < order[0][0] for _, lo, hi in found)


def _shared_bytes(members: list, depth: int, seen: dict):
    """The bytes of one row, and of the whole, of every buffer that one of
    ``members`` writes and another touches, if all open with the loops of
    the first ``depth``, each shares such a buffer (stages that share
    nothing gain nothing), and each such buffer is touched at one row only
    (see the module doc), else None.  A stage's own rows are independent
    (it writes each element once, from other buffers), so only the buffers
    members share are checked.  ``seen`` keeps each stage's accesses per
    depth."""
    rows = opening_loops(members[0])[:depth]
    found, users, written = {}, {}, set()
    for k, st in enumerate(members):
        loops = matching_loops(rows, st)
        if loops is None:
            return None
        key = (id(st), depth)
        if key not in seen:
            seen[key] = []
            accesses(opening_loops(st)[depth - 1].body, {}, seen[key])
        for buffer, index, ranges, store in seen[key]:
            found.setdefault(buffer, []).append(row_form(index, loops, ranges))
            users.setdefault(buffer, set()).add(k)
            if store:
                written.add(buffer)
    extents = [r.extent.value for r in rows]
    shared = [b for b in written if len(users[b]) > 1]
    if not all(one_row(found[b], extents) for b in shared) or \
            not all(any(k in users[b] for b in shared) for k in range(len(members))):
        return None
    row = sum(b.itemsize * (max(f[2] for f in found[b]) - min(f[1] for f in found[b]) + 1) for b in shared)
    return row, sum(b.nbytes for b in shared)


def _rows_for(members: list, target: Target, seen: dict) -> int:
    """The most loops ``members`` can run row by row over with a row of
    their shared data in half of L2 (it would not stay there while a row of
    what they read beside it passes); 0 if none."""
    most = min(_common(members[0], st) for st in members[1:])
    for depth in range(most, 0, -1):
        shared = _shared_bytes(members, depth, seen)
        if shared is not None:
            return depth if shared[0] <= target.l2_bytes // 2 else 0
    return 0


def worth_joining(shared: tuple, target: Target) -> bool:
    """Whether a chain sharing ``(row, whole)`` bytes gains by running row by
    row: its shared data, a thread's share of it, would leave L2 between
    the stages run apart, and a row of it is a cache line at least (a value
    per row is cheap to read back)."""
    row, whole = shared
    return row >= target.cache_line and whole > target.l2_bytes * target.threads


def _join(chain: list, depth: int) -> Stage:
    """One stage running, for each row, the bodies of ``chain`` in turn."""
    rows = opening_loops(chain[0])[:depth]
    stmts = []
    for st in chain:
        body = row_body(st, rows)
        stmts += list(body.stmts) if isinstance(body, Block) else [body]
    nest = Block(tuple(stmts))
    for loop in reversed(rows):
        nest = replace(loop, body=nest)
    return Stage("+".join(st.name for st in chain), chain[0].buffer, nest)


def _touches_written(chain: list, stage: Stage, seen: dict) -> bool:
    """Whether ``stage`` touches a buffer ``chain`` writes or writes one it
    touches (a cheap test before the row by row one)."""
    mine, mine_written = _buffers(stage, seen)
    return any(mine_written & theirs or mine & written for theirs, written in (_buffers(st, seen) for st in chain))


def _buffers(stage: Stage, seen: dict) -> tuple:
    """``(touched, written)``: the buffers ``stage`` reads or writes, and those it writes."""
    key = ("buffers", id(stage))
    if key not in seen:
        seen[key] = set(stage_buffers(stage)[0]), {s.buffer for s in walk(stage.body) if isinstance(s, Store)}
    return seen[key]


def is_copy(stage: Stage) -> bool:
    """Whether every store of ``stage`` writes a value it loads: a copy (a
    product's packed panel, a padded input)."""
    return all(isinstance(s.value, (BufLoad, GuardedLoad)) for s in walk(stage.body) if isinstance(s, Store))


def _copies_into(chain: list, stage: Stage) -> bool:
    """Whether ``chain`` only copies and ``stage`` does not: the reader of a
    copy reads each element many times (a panel once a row tile), so a row
    of the copy still in L1 saves it little, and joined to its copy a
    product could no longer run with its own row stages
    (``block_chains.py``)."""
    return all(is_copy(c) for c in chain) and not is_copy(stage)


def keeps_to_itself(stage: Stage) -> bool:
    """A stage that keeps to itself (see the module doc)."""
    return stage.fixed or stage.apart or stage.sort is not None or stage.step is not None or \
        any(isinstance(s, Check) for s in walk(stage.body))


def join_rows(program: Program, target: Target) -> Program:
    """``program`` with each run of consecutive stages that walk the same
    rows (see the module doc) joined into one stage."""
    out, chain, depth, seen = [], [], 0, {}

    def close():
        out.extend([_join(chain, depth)] if len(chain) > 1 and worth_joining(_shared_bytes(chain, depth, seen), target)
                   else chain)
        chain.clear()

    for st in program.stages:
        if not keeps_to_itself(st) and chain and _touches_written(chain, st, seen) and not _copies_into(chain, st):
            d = _rows_for(chain + [st], target, seen)
            if d and (len(chain) == 1 or d == depth):
                chain.append(st)
                depth = d
                continue
        close()
        if keeps_to_itself(st):
            out.append(st)
        else:
            chain.append(st)
    close()
    return replace(program, stages=tuple(out))
