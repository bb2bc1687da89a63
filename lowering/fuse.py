"""Stage fusion: fewer passes over memory.  A loop IR to loop IR pass that
runs before the per-stage schedule (``schedule/``).

``lower.py`` gives every stored tensor a stage of its own.  A gradient
program often holds several stages over one domain: the forward value
``y = f(x)``, stored because two stages read it; the loss ``Σ y·H``; the
gradient ``dx = g(x, y, H)``.  Run apart they cross memory four times (write
``y``, read it twice, read ``x`` and ``H`` twice) and evaluate the parts of
``f`` that ``g`` shares twice; fused, one pass reads ``x`` and ``H`` once,
writes ``dx`` and keeps ``y`` in registers.

Two rules, applied until neither applies:

1. **Siblings.**  Two stages over the same extents that read one buffer at
   the same point become one stage: the second one's element body, with its
   loop variables renamed to the first one's, runs right after the first's.
   The first may be a reduction to one element (a loss: ``acc = 0; for
   r...: acc += e; out[0] = acc``), then the second (a map) runs inside the
   reduction loop, ``r`` standing for its loop variables, provided the
   schedule will still spread the reduction over threads (``splits``).
   Two row reductions (``acc = init; for r...: acc = acc op e; out[i] =
   acc``, the loops ``r`` alike) join into one loop over ``r`` with both
   accumulators: a softmax's normaliser and the first index of its row's
   maximum (the maximum's derivative) read each row once, not twice.  Not
   when a load reads only some of the output variables (an outer product,
   register-tiled: the tile would hold both stages' accumulators).
2. **Producer into its consumer.**  A temporary read by one stage only, and
   there at one index in one loop nest (a sum lowered both in a select's
   branch and outside it reads it in two loops over one variable): its own
   store index with each loop variable standing for a loop of the reader
   plus a constant offset (a window inside its domain, such as the gradient
   of a padded input read without its border), is computed in the reader
   instead: its element body becomes let-bound
   locals at the top of the innermost of those loops, and its buffer
   disappears.  Only when that computes each element at most once (the
   loops around that point are those loops) and, for a producer whose
   element is a reduction, only into a reader that copies it (a crop),
   into a reduction loop of a reader of several elements when the producer
   is no contraction (``min_j Σ_e (C[j, e] - P[i, e])²``: no ``n x k``
   temporary), or into the element loop of a map over its elements, again
   no contraction (``y[i] = -r[i] / z[i]²`` of a row sum ``r``: one row
   reduction with an epilogue, which ``row_chains.py`` joins with the
   stages over the same rows; a contraction's epilogue stays a stage of its
   own, so the schedule can still tile and block it).  Elements nobody
   reads are not computed at all.

Stages inside a scan's time loop (``Stage.step``) take part in neither.

Both keep the operations of every element and the order of every
reduction (LLVM may still contract a multiply and an add differently in
the new surroundings: a last-bit difference), a value that the joined
bodies both compute is computed once (:func:`_computed_once`), and neither makes a stage
larger than ``STAGE_BUDGET`` expression nodes (the bound ``lower.py`` keeps
to, so a long chain it cut into stages for compile time stays cut).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from te_autodiff.expr import BinOp, Cast, Const, Var, add
from te_autodiff.visit import topo_order

from .loop_ir import (STAGE_BUDGET, Alloc, Assign, Block, BufLoad, For, GuardedLoad, If, Local, Program, free_leaves,
                      Simd, Stage, Store, children, linear_form, loads_in, map_stmt, rename, simplify_index,
                      stmt_exprs, substitute, walk)
from .schedule.nest import accumulation


@dataclass
class _Shape:
    """A stage as lowered: output loops (constant extents from 0) around an
    element body; ``reduction`` holds the loops of a reduction to one element
    (a loss), whose innermost body takes sibling maps; ``rows`` the loops of
    each element's own reduction (a row reduction), whose innermost body
    takes a sibling row reduction's."""

    stage: Stage
    loops: list
    body: Block
    reduction: list | None = None
    rows: list | None = None

    @property
    def extents(self) -> list:
        return [lp.extent.value for lp in (self.reduction or self.loops)]

    @property
    def vars(self) -> list:
        return [lp.var for lp in (self.reduction or self.loops)]


def _const_loop(s) -> bool:
    return isinstance(s, For) and isinstance(s.lo, Const) and isinstance(s.extent, Const)


def _stmts(s) -> tuple:
    return s.stmts if isinstance(s, Block) else (s,)


def _chain(loop: For) -> list:
    """``loop`` and the loops nested in it, each the only statement of the one outside."""
    loops = [loop]
    while len(_stmts(loops[-1].body)) == 1 and isinstance(_stmts(loops[-1].body)[0], For):
        loops.append(_stmts(loops[-1].body)[0])
    return loops


def _from_zero(loops) -> bool:
    return all(_const_loop(lp) and lp.lo.value == 0 for lp in loops)


def _straight(body) -> bool:
    """No loop anywhere in ``body`` (element by element, one pass)."""
    return not any(isinstance(x, (For, Simd)) for x in walk(body))


def _shape(stage: Stage):
    """The :class:`_Shape` of ``stage``, or None when it is not as lowered."""
    loops = _chain(stage.body)
    if stage.fixed or stage.step is not None or not _from_zero(loops):
        return None
    shape = _Shape(stage, loops, Block(_stmts(loops[-1].body)))
    if _straight(shape.body):
        return shape
    if all(n == 1 for n in shape.extents):
        shape.reduction = _reduction(shape.body)
        return shape if shape.reduction else None
    shape.rows = _reduction(shape.body)
    return shape if shape.rows else None


def _reduction(body: Block):
    """The loops of ``acc = init; for r...: <straight body>; out[.] = acc``, or None."""
    stmts = body.stmts
    if len(stmts) != 3 or not (isinstance(stmts[0], Alloc) and isinstance(stmts[1], For)
                               and isinstance(stmts[2], Store)):
        return None
    loops = _chain(stmts[1])
    return loops if _from_zero(loops) and _straight(loops[-1].body) else None


# ----------------------------------------------------------------- queries


def _nodes(s) -> set:
    """Every distinct expression node statement ``s`` evaluates (its size)."""
    seen = set()
    stack = [e for x in walk(s) for e in stmt_exprs(x)]
    while stack:
        e = stack.pop()
        if e not in seen:
            seen.add(e)
            stack += children(e)
    return seen


def _loads(s) -> list:
    """Every distinct buffer load in statement ``s``."""
    return [e for e in _nodes(s) if isinstance(e, (BufLoad, GuardedLoad))]


def _locals(s) -> set:
    return {x.local for x in walk(s) if isinstance(x, (Alloc, Assign))}


def _point_reads(shape: _Shape) -> set:
    """``(buffer, index)`` of the plain loads of ``shape``'s element (innermost) body."""
    inner = (shape.reduction or shape.rows or [shape])[-1].body
    return {(ld.buffer, ld.index) for ld in _loads(inner) if isinstance(ld, BufLoad)}


# ------------------------------------------------------------ rewriting


def _replace(s, old, new):
    """Statement ``s`` with the statement ``old`` (by identity) replaced by ``new``."""
    if s is old:
        return new
    if isinstance(s, Block):
        return Block(tuple(_replace(x, old, new) for x in s.stmts))
    if isinstance(s, For):
        return For(s.var, s.lo, s.extent, _replace(s.body, old, new), s.kind)
    if isinstance(s, If):
        return If(s.cond, _replace(s.then, old, new), None if s.else_ is None else _replace(s.else_, old, new))
    return s


def _with_body(loop: For, stmts: tuple) -> For:
    return For(loop.var, loop.lo, loop.extent, Block(stmts), loop.kind)


def _fresh(body, taken: set):
    """``body`` with every local whose name is in ``taken`` renamed (``t1`` -> ``t1.1``)."""
    names, rename = set(taken), {}
    for x in sorted(_locals(body), key=lambda x: x.name):
        if x.name in names:
            k = 1
            while f"{x.name}.{k}" in names:
                k += 1
            rename[x] = Local(f"{x.name}.{k}", x.dtype)
            names.add(rename[x].name)
    if not rename:
        return body
    return map_stmt(body, lambda e: substitute(e, rename), lambda x: rename.get(x, x))


def _names(s) -> set:
    return {x.name for x in _locals(s)}


# ----------------------------------------------------------------- rules


class _Fuser:
    """The stage list being fused, with each stage's reads and writes cached."""

    def __init__(self, program: Program, splits):
        self.stages = list(program.stages)
        self.results = set(program.results)
        self.splits = splits
        self._cache = {}

    def info(self, stage: Stage):
        """``(shape, reads, writes, point reads, size)`` of ``stage``."""
        if stage not in self._cache:
            shape, nodes = _shape(stage), _nodes(stage.body)
            reads = {e.buffer for e in nodes if isinstance(e, (BufLoad, GuardedLoad))}
            writes = {x.buffer for x in walk(stage.body) if isinstance(x, Store)}
            self._cache[stage] = (shape, reads, writes, _point_reads(shape) if shape else set(), len(nodes))
        return self._cache[stage]

    def small(self, *stages) -> bool:
        """Whether one stage doing the work of ``stages`` stays within ``STAGE_BUDGET``."""
        return sum(self.info(s)[4] for s in stages) <= STAGE_BUDGET

    def run(self) -> list:
        while self.siblings() or self.inline():
            pass
        return self.stages

    # rule 1 ------------------------------------------------------------

    def siblings(self) -> bool:
        """Fuse the first pair of sibling stages found (rule 1)."""
        readers = {}
        for k, st in enumerate(self.stages):
            for buf, _ in self.info(st)[3]:
                readers.setdefault(buf, []).append(k)
        for i, a in enumerate(self.stages):
            candidates = sorted({j for buf, _ in self.info(a)[3] for j in readers[buf] if j > i})
            for j in candidates:
                place = self.placement(i, j)
                if place is None:
                    continue
                for first, second in ((i, j), (j, i)):
                    if self.fits(self.stages[first], self.stages[second]):
                        merged = _merge(self.info(self.stages[first])[0], self.info(self.stages[second])[0])
                        between = self.stages[i + 1:j]
                        middle = between + [merged] if place == j else [merged] + between
                        self.stages = self.stages[:i] + middle + self.stages[j + 1:]
                        return True
        return False

    def placement(self, i: int, j: int):
        """Where stages ``i < j`` can run as one: at ``j`` when no stage between
        reads what ``i`` writes, else at ``i`` when ``j`` reads nothing a stage
        between writes, else None."""
        between = self.stages[i + 1:j]
        if not any(self.info(s)[1] & self.info(self.stages[i])[2] for s in between):
            return j
        if not any(self.info(self.stages[j])[1] & self.info(s)[2] for s in between):
            return i
        return None

    def fits(self, first: Stage, second: Stage) -> bool:
        """Whether ``second``'s element body may run inside ``first``'s loops."""
        a, ra, wa, pa, _ = self.info(first)
        b, rb, wb, pb, _ = self.info(second)
        if a is None or b is None or b.reduction is not None or not self.small(first, second):
            return False
        if a.extents != b.extents or prod(a.extents) <= 1 or ra & wb or rb & wa:
            return False
        if a.reduction is not None and not self.splits(a.extents):
            return False
        if (a.rows is None) != (b.rows is None) or a.rows is not None and \
                [lp.extent.value for lp in a.rows] != [lp.extent.value for lp in b.rows]:
            return False
        mapping = _mapping(a, b)
        moved = {(buf, simplify_index(substitute(ix, mapping))) for buf, ix in pb}
        if a.rows is not None and len({frozenset(free_leaves(ix)) & set(a.vars) for _, ix in pa | moved}
                                      - {frozenset()}) > 1:
            return False            # an outer product (A[r, i] B[j, r]): two register tiles' accumulators
        return bool(moved & pa)

    # rule 2 ------------------------------------------------------------

    def inline(self) -> bool:
        """Compute the first temporary that qualifies inside its reader (rule 2)."""
        for st in self.stages:
            buf, loops = st.buffer, _chain(st.body)
            if (st.fixed or st.step is not None or buf.kind != "temp" or buf in self.results or self.info(st)[2] != {buf}
                    or not _from_zero(loops)):
                continue
            readers = [r for r in self.stages if buf in self.info(r)[1]]
            if len(readers) != 1 or readers[0].step is not None or not self.small(st, readers[0]):
                continue
            producer = _Shape(st, loops, Block(_stmts(loops[-1].body)))
            plan = _inline_plan(producer, readers[0])
            if plan is None:
                continue
            reader = _inlined(producer, readers[0], *plan)
            self.stages = [reader if s is readers[0] else s for s in self.stages if s is not st]
            return True
        return False


def _mapping(first: _Shape, second: _Shape) -> dict:
    """``second``'s loop variables to ``first``'s (its rows' loops included)."""
    pairs = list(zip(second.vars, first.vars))
    if first.rows is not None:
        pairs += [(b.var, a.var) for a, b in zip(first.rows, second.rows)]
    return dict(pairs)


def _merge(first: _Shape, second: _Shape) -> Stage:
    """``second``'s element body after ``first``'s, under ``first``'s loops,
    the values both compute computed once (:func:`_computed_once`); two row
    reductions as one: both accumulators declared, one loop nest running
    both bodies, both stores."""
    moved = _fresh(rename(second.body, _mapping(first, second)), _names(first.stage.body))
    if first.rows is not None:
        (alloc, loop, store), (alloc2, loop2, store2) = first.body.stmts, moved.stmts
        last = first.rows[-1]
        stmts = _computed_once(_stmts(last.body) + _stmts(_chain(loop2)[-1].body),
                               _names(first.stage.body) | _names(moved))
        element = (alloc, alloc2, _replace(loop, last, _with_body(last, stmts)), store, store2)
        body = _replace(first.stage.body, first.loops[-1], _with_body(first.loops[-1], element))
    else:
        last = first.reduction[-1] if first.reduction else first.loops[-1]
        stmts = _computed_once(_stmts(last.body) + _stmts(moved), _names(first.stage.body) | _names(moved))
        body = _replace(first.stage.body, last, _with_body(last, stmts))
    return Stage(f"{first.stage.name}+{second.stage.name}", first.stage.buffer, body)


def _computed_once(stmts: tuple, taken: set) -> tuple:
    """Straight-line ``stmts`` with each non-trivial value that several of
    them compute (the ``sigmoid(x)`` inside a fused loss's ``y`` and in the
    gradient's ``s·(1 - s)``) bound to a let-bound local before the first of
    them, which the others read.  Each element gets the same operations in
    the same order, once: LLVM merges the copies of a fast-math function
    (branches around a slow path) into code that spills more.  A value is
    shared only when nothing it reads changes in between (no load of a
    buffer ``stmts`` store to, no local they assign), and only where more
    than one expression uses it (``exp(-x·x)``, not also ``x·x``).  An index
    converted to a float is no value worth a local: ``pow(t, float(j))``
    must stay recognisable as an integer power (``powers.py``)."""
    if not all(isinstance(x, (Alloc, Assign, Store)) for x in stmts):
        return stmts
    stored = {x.buffer for x in stmts if isinstance(x, Store)}
    mutable = {x.local for x in stmts if isinstance(x, Assign) or isinstance(x, Alloc) and not x.let}
    users, owners = {}, {}                  # node -> statements computing it; -> distinct users
    for k, x in enumerate(stmts):
        for e in topo_order(stmt_exprs(x), children):
            users.setdefault(e, set()).add(k)
            for c in children(e):
                owners.setdefault(c, set()).add(e)
        for e in stmt_exprs(x):
            owners.setdefault(e, set()).add(k)
    order = topo_order([e for x in stmts for e in stmt_exprs(x)], children)
    shared = [e for e in order if len(users[e]) > 1 and len(owners[e]) > 1 and e.dtype.startswith("float")
              and not isinstance(e, (Const, Var, Local, BufLoad, GuardedLoad))
              and not (isinstance(e, Cast) and not e.a.dtype.startswith("float"))
              and not any(isinstance(v, Local) and v in mutable
                          or isinstance(v, (BufLoad, GuardedLoad)) and v.buffer in stored
                          for v in topo_order([e], children))]
    if not shared:
        return stmts
    named = {x.init: x for x in stmts if isinstance(x, Alloc) and x.let and x.init in users}
    lets, k = {}, 0
    for e in shared:                        # children first: a let reads the lets inside it
        while e not in named and f"t{k}" in taken:
            k += 1
        local = named[e].local if e in named else Local(f"t{k}", e.dtype)   # a let of it moves up
        taken = taken | {local.name}
        lets[e] = (local, substitute(e, {c: lets[c][0] for c in lets}))
    moved = {named[e] for e in shared if e in named}
    read = {c: local for c, (local, _) in lets.items()}
    out = []
    for i, x in enumerate(stmts):
        out += [Alloc(*lets[e], True) for e in shared if min(users[e]) == i]
        if x not in moved:
            out.append(map_stmt(x, lambda v: substitute(v, read)))
    return tuple(out)


def _enclosing(body, target) -> list:
    """The loops around statement ``target`` inside ``body``, outermost first."""
    stack = [(body, [])]
    while stack:
        s, loops = stack.pop()
        if s is target:
            return loops
        if isinstance(s, Block):
            stack += [(x, loops) for x in s.stmts]
        elif isinstance(s, For):
            stack.append((s.body, loops + [s]))
        elif isinstance(s, If):
            stack += [(x, loops) for x in (s.then, s.else_) if x is not None]
    return []


def _inline_plan(p: _Shape, reader: Stage):
    """``(loop, mapping, load)``: the loop of ``reader`` whose body computes
    the producer ``p``, the renaming of ``p``'s loop variables (each a loop
    variable of the reader plus a constant offset) and the load it replaces,
    or None."""
    loads = [ld for ld in _loads(reader.body) if ld.buffer is p.stage.buffer]
    store = p.body.stmts[-1]
    if len({ld.index for ld in loads}) != 1 or not all(isinstance(ld, BufLoad) for ld in loads) or \
            not isinstance(store, Store) or store.buffer is not p.stage.buffer:
        return None
    own, read = linear_form(store.index), linear_form(loads[0].index)
    if own is None or read is None:
        return None
    units = [lp for lp in p.loops if lp.extent.value == 1]
    mapping = {lp.var: Const(0, lp.var.dtype) for lp in units}
    # the loops the read's variables name: a variable may name several loops
    # of one stage (a reduction lowered both inside a select's branch and
    # outside it runs two loops over its axis), so each read site resolves
    # its variables to the loops around it, and all must agree
    sites = [{lp.var: lp for lp in around} for around in _read_sites(reader.body, p.stage.buffer)]
    loops = sites[0]
    if any(site.get(v) is not loops.get(v) for site in sites[1:] for v in read[0]):
        return None                                  # reads in different loops: no one place computes it
    terms = {v: k for v, k in read[0].items()       # a reader's loop of one iteration adds 0
             if not (v in loops and _const_loop(loops[v]) and loops[v].extent.value == 1)}
    by_stride = {k: v for v, k in terms.items()}
    rest = read[1] - own[1]            # split over the axes: read = own(i + offset), 0 <= offset
    for lp in sorted((lp for lp in p.loops if lp not in units), key=lambda lp: -own[0].get(lp.var, 0)):
        k = own[0].get(lp.var, 0)
        target = loops.get(by_stride.get(k))
        if k <= 0 or target is None or not _const_loop(target) or target.lo.value != 0:
            return None
        offset = rest // k
        if not 0 <= offset <= lp.extent.value - target.extent.value:
            return None
        rest -= offset * k
        mapping[lp.var] = target.var if offset == 0 else add(target.var, Const(offset, target.var.dtype))
    if rest or len(terms) != len(mapping) - len(units):
        return None
    element = _chain(reader.body)[-1]
    mapped = {loops[by_stride[own[0][lp.var]]] for lp in p.loops if lp not in units}
    inner = max(mapped | {element}, key=lambda lp: len(_enclosing(reader.body, lp)))   # in the element body
    around = _enclosing(reader.body, inner) + [inner]
    if any(lp not in mapped and not (_const_loop(lp) and lp.extent.value == 1) for lp in around):
        return None                                  # it would compute elements more than once
    if not _straight(p.body) and not _copies(element, loads[0]) and not _into_reduction(p, reader, inner, element) \
            and not _into_map(p, inner, element):
        return None                                  # a reduction: into a copy, another reduction or a map
    return inner, mapping, loads[0]


def _into_map(p: _Shape, inner: For, element: For) -> bool:
    """Whether the reduction ``p`` may be computed in the element loop of a
    map over its elements (``r = Σ_j x[i, j]; y[i] = -r / (z[i] z[i])``):
    the map becomes a row reduction with that epilogue, which row chains
    join with the stages over the same rows; ``p`` no contraction (its
    register tile stores the sums alone)."""
    return inner is element and _straight(element.body) and not _contraction(p.body, {lp.var for lp in p.loops})


def _into_reduction(p: _Shape, reader: Stage, inner: For, element: For) -> bool:
    """Whether the reduction ``p`` may be computed in the reader's reduction
    loop ``inner`` (``min_j Σ_e (C[j, e] - P[i, e])²``): the reader keeps
    more than one element, so its lanes and threads still run independent
    chains, and ``p`` is no contraction, which as a stage of its own the
    register tile runs near the FMA peak (computed one element at a time
    inside a reduction it would not be)."""
    if inner is element or prod(lp.extent.value for lp in _chain(reader.body)) <= 1:
        return False
    return not _contraction(p.body, {lp.var for lp in p.loops})


def _contraction(body, outputs: set) -> bool:
    """Whether a reduction in ``body`` accumulates products whose two factors
    each miss an output variable the other reads (``A[i, k] B[k, j]``,
    ``Q[k, d, c] (x[i, c] - mu[k, c])``): an outer product of operands, each
    load of one reused across the other's variable in a register tile.
    Factors are followed through let-bound locals."""
    lets = {x.local: x.init for x in walk(body) if isinstance(x, Alloc) and x.let}

    def reads(e) -> set:
        out = set()
        for leaf in free_leaves(e):
            out |= reads(lets[leaf]) if leaf in lets else {leaf} & outputs
        return out

    for x in walk(body):
        combined = accumulation(x) if isinstance(x, Assign) else None
        if combined is None or combined[0] != "add":
            continue
        term = lets.get(combined[1], combined[1])
        if isinstance(term, BinOp) and term.op == "mul":
            a, b = reads(term.a), reads(term.b)
            if not a <= b and not b <= a:
                return True
    return False


def _read_sites(body, buffer) -> list:
    """For each statement in ``body`` that reads ``buffer``, the loops
    around it, outermost first (a loop's bounds are read outside it)."""
    out, stack = [], [(body, [])]
    while stack:
        s, loops = stack.pop()
        if any(ld.buffer is buffer for ld in loads_in(stmt_exprs(s), set())):
            out.append(loops)
        if isinstance(s, Block):
            stack += [(x, loops) for x in reversed(s.stmts)]
        elif isinstance(s, For):
            stack.append((s.body, loops + [s]))
        elif isinstance(s, If):
            stack += [(x, loops) for x in (s.else_, s.then) if x is not None]
    return out


def _copies(loop: For, load: BufLoad) -> bool:
    """Whether ``loop``'s body only stores ``load`` (a crop or shift: the reduction
    then keeps its schedule, K blocks included, in the reader's loops)."""
    stmts = _stmts(loop.body)
    return len(stmts) == 1 and isinstance(stmts[0], Store) and stmts[0].value is load


def _inlined(p: _Shape, reader: Stage, loop: For, mapping: dict, load: BufLoad) -> Stage:
    """``reader`` computing ``p``'s element at the top of ``loop`` instead of
    loading it; named after both (``dXp+dX``), as stages fused side by side are."""
    *lets, store = p.body.stmts
    code = rename(Block(tuple(lets) + (Alloc(Local(p.stage.name, store.value.dtype), store.value, True),)),
                    mapping)
    code = _fresh(code, _names(reader.body))
    local = code.stmts[-1].local
    inside = map_stmt(loop.body, lambda e: substitute(e, {load: local}))
    stmts = _computed_once(code.stmts + _stmts(inside), _names(reader.body) | _names(code))
    return Stage(f"{p.stage.name}+{reader.name}", reader.buffer, _replace(reader.body, loop, _with_body(loop, stmts)))


def fuse(program: Program, splits=lambda extents: True) -> Program:
    """``program`` with its stages fused by rules 1 and 2 (module doc) and the
    temporaries no stage uses any more dropped.  ``splits(extents)``: whether
    the schedule spreads a reduction to one element over these extents
    across threads (only then does a parallel map join it)."""
    fuser = _Fuser(program, splits)
    stages = fuser.run()
    used = {b for st in stages for b in fuser.info(st)[1] | fuser.info(st)[2]}
    used |= {st.step.counter for st in stages if st.step is not None}
    buffers = tuple(b for b in program.buffers if b.kind != "temp" or b in used)
    return Program(program.name, buffers, tuple(stages), program.results, program.checks)

