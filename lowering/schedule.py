"""The automatic schedule: a loop IR to loop IR pass, one rule-based plan per stage.

Every figure that depends on the CPU (lanes, register tile, K block, panel
and row-block sizes) comes from :func:`blocking` of the
:class:`~lowering.target.Target` the pipeline passes in.

``lower.py`` gives every stage the same shape: a row-major nest of *output
loops* (one per axis of the stored tensor, the outermost ``parallel``) around
an *element body* that computes one element (reductions as accumulator
loops) and stores it.  Output elements are independent, so the output loops
may be reordered, tiled and vectorised freely.  :func:`schedule` is a pure
function of the program; nothing is tuned by hand or by timing.

Determinism: every rule below either keeps each element's sequence of
operations (vector lanes, tiles, K blocks, loop order) or reassociates a
reduction in one fixed way that depends on the shapes only (lanes, parts).
The thread count only decides which thread runs which root iterations, so
every run and every thread count gives the same bits.

Rules, in the order they are tried for a stage:

1. **Split reductions to one element.**  A stage storing one value reduced
   over a large domain (a loss) would run on one thread: its outermost
   reduction loop is cut into a fixed number of parts (``SPLIT_PARTS``); a
   new stage computes the partial results in parallel, the stage itself
   adds them in order (:func:`_split_reduction`).
2. **Offset loops.**  A reduction loop ``for x in max(L, e)..min(U, e+D-1)+1``
   whose bounds read output variables (zero elimination leaves them on the
   gradients of convolutions) becomes ``for d in 0..D`` with a test
   ``L <= e + d <= U``: bounds independent of the element (:func:`offset_loops`).
3. **Vector axis.**  Each output axis is scored by the element body's memory
   accesses, weighted by how often they run: an index that does not move
   with the axis is a broadcast (nearly free), one that moves by one element
   a vector access (1), any other a gather (one per lane) or a scatter (two
   per lane: a transposing copy gathers, in blocks, rule 8); one more when
   a test around the access differs between lanes (masked work); plus the
   cost of copying packed operands (rule 5).  The innermost reduction
   loop is scored the same way: when it wins (a row reduction such as a
   softmax denominator) each element's reduction runs in vector lanes
   (:func:`reduce_in_lanes`).  Otherwise the best output axis ``j`` becomes
   a :class:`~lowering.loop_ir.Simd` loop of one native vector of lanes
   (``Blocking.lanes``: 16 float32 on AVX-512, 8 on AVX2), the last
   vector masked.  A stage that stores one
   element gets its reduction in lanes as well.
4. **Tests to selects.**  An ``If`` whose condition differs between lanes
   and whose branches assign one value to one local (a padding test) becomes
   a ``select`` whose reads are :class:`~lowering.loop_ir.GuardedLoad`
   (masked loads), unless the read is provably in bounds (:func:`if_to_select`).
5. **Packing.**  A load in a reduction that is a gather along ``j`` but reads
   only ``j`` and reduction variables (``B[j, k]`` in ``A @ B.T``) is copied,
   transposed, into a temporary by a new stage, so the lanes read it with
   unit stride (:func:`_pack_plan`).  Above ``PACK_MAX_BYTES`` the stage
   uses dot-product tiles instead (vector lanes along ``k``, :func:`_dot_tiles`).
6. **Register tiles (unroll and jam).**  When the element body runs a
   reduction whose bounds read neither ``j`` nor a second output axis ``i``,
   and the reduction reads an operand that does not move with ``j`` (a
   broadcast) and one that does not move with ``i``, a tile of ``MR`` values
   of ``i`` by ``NR`` vectors of ``j`` is computed together: the reduction
   loop is shared and its body repeated per tile element, so the ``MR x NR``
   accumulators stay in vector registers, each vector load serves ``MR``
   rows and each broadcast ``NR`` vectors.  A statement is repeated only
   over the tile positions it depends on (:class:`_Jam`); remainder rows and
   columns get their own, smaller tiles.  Among the candidates for ``i``,
   one whose tests can be peeled (6b) is preferred, then one along which the
   broadcast loads move least: neighbouring rows share cache lines (the
   output columns of a convolution, not its batch) (:func:`_gemm_rows`).

   a. **Panels.**  The operand read in vector lanes is copied into column
      panels ``P[j tile][k...][NR vectors]`` and a broadcast operand whose
      rows are adjacent but whose reduction steps are not (``A[k, i]``) into
      row panels ``P[i tile][k...][MR]``, when it is larger than L1
      (``Blocking.panel_min_bytes``) and re-read ``PACK_MIN_REUSE`` times: each tile
      then reads one contiguous, aligned block per operand (no cache-set
      conflicts between rows a power of two apart, no split loads from
      unaligned inputs).  Transposed copies (rule 5) take the panel layout.
      The loops are ordered column tiles, then row tiles, so a column
      panel stays in cache while the rows pass (:func:`_panel_plan`).
   b. **Peeling.**  Tests that read ``i`` (padding, ``0 <= i + d - 2 < H``
      for every tap ``d``) hold on an interior range of ``i``: the row range
      is cut into border, interior (whole tiles, without those tests) and
      border (:func:`_peeled`).
7. **K blocks and row blocks.**  A GEMM reduction longer than ``k_block_min``
   is cut into equal blocks of at most ``k_block``, each resuming from the
   partial sums left in the output, and the loops are ordered column tiles,
   K blocks, row tiles: a block x tile-width slice of the packed operand
   stays in L1 (:func:`_k_blocked`; the same additions in the same order).
   With several column tiles and a row operand larger than
   ``row_block_bytes``, the row tiles are visited in a power-of-two number
   of blocks outside the column tiles, each block staying in L2 while the
   column panels pass (:func:`_row_blocks`).
8. **Gather blocks.**  When the vector loop gathers (a transposed read), the
   loop outside it is visited ``GATHER_BLOCK`` rows at a time inside each
   column tile, so the lines a gather touches are reused (:func:`_gather_block`).
9. **Parallel root.**  The outermost tile loop is the ``parallel`` root the
   runtime splits across threads; when it has fewer than ``MIN_ROOT``
   iterations an output tile loop with more is moved out (:func:`_choose_root`).

A stage that already holds a ``Simd`` loop is left alone, so the pass is
idempotent.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from te_autodiff import dtype as dt
from te_autodiff.expr import (BinOp, Cast, Cmp, Const, Logic, Select, Var, add, compare, const, logic_and,
                              logic_not, maximum, minimum, mul, select, sub, var)

from .target import Target
from .loop_ir import (Alloc, Assign, Block, Buffer, BufLoad, Check, For, GuardedLoad,
                      If, LaneReduce, Local, Program, Simd, Stage, Store, children, free_leaves, linear_form,
                      map_loads, rename, simplify_index, stmt_exprs, stride, substitute, with_load)

UNKNOWN_TRIPS = 16           # assumed iterations of a loop whose extent is not a constant
MIN_ROOT = 4                 # fewer root iterations than this: look for a longer parallel loop
GEMM_MIN_TRIPS = 8           # a reduction this long is worth register tiling
TILE_VECTORS = 2             # NR: vectors of a register tile (one row of a tile is two vectors)
MAX_TILE_ROWS = 8            # MR at most: more rows add remainder code more than they save loads
PACK_MIN_REUSE = 4           # pack an operand only if it is re-read at least this often
SUM_RUN = 64                 # a lane adds this many terms on their own before its running total
SPLIT_PARTS = (16, 12, 8, 6, 4, 2)   # parts of a large reduction to one element (a fixed number)
SPLIT_MIN_WORK = 1 << 16     # reductions to one element at least this long are split
PACK_MAX_BYTES = 1 << 23      # larger operands are not copied: dot-product tiles instead
GATHER_BLOCK = 16            # rows visited per column tile when the vector loop gathers


def _pow2_floor(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


@dataclass(frozen=True)
class Blocking:
    """The schedule's figures for one :class:`~lowering.target.Target`, each
    derived from the target's description (never tuned to one CPU):

    * ``lanes(itemsize)``: one native vector of elements (16 float32 on
      AVX-512, 8 on AVX2, 4 on SSE and NEON);
    * register tile ``tile_rows x TILE_VECTORS`` vectors: the accumulators
      plus the ``TILE_VECTORS`` vector loads and one broadcast of a
      reduction step fill the register file (16 registers: 6 x 2, BLIS's
      haswell 6x16; 32 registers: 8 x 2, capped by ``MAX_TILE_ROWS``);
    * ``dot_tile``: the largest ``t`` with ``t*t`` accumulators and ``2t``
      operand vectors in the registers (4 with 32, 3 with 16);
    * ``k_block``: reduction steps per block, the largest power of two whose
      packed ``k_block x TILE_VECTORS`` vector slice fills at most two thirds
      of L1 (the rest holds a row tile's operands and the output tile);
      longer reductions than ``1.5 k_block`` are blocked;
    * ``panel_min_bytes``: operands larger than L1 (the power of two at or
      above it) are read from panels;
    * ``row_block_bytes``: half of L2 (a power of two), the row operand's
      share while the column panels pass."""

    target: Target
    tile_rows: int
    dot_tile: int
    k_block: int
    panel_min_bytes: int
    row_block_bytes: int

    @property
    def k_block_min(self) -> int:
        return self.k_block * 3 // 2

    def lanes(self, itemsize: int) -> int:
        return self.target.lanes(itemsize)


def blocking(target: Target) -> Blocking:
    """The :class:`Blocking` of ``target`` (see there for each derivation)."""
    regs = target.vector_registers
    rows = min(MAX_TILE_ROWS, (regs - TILE_VECTORS - 1) // TILE_VECTORS)
    dot = max(t for t in range(1, 9) if t * t + 2 * t <= regs)
    k_block = _pow2_floor(target.l1_bytes * 2 // 3 // (TILE_VECTORS * target.vector_bytes))
    return Blocking(target, rows, dot, k_block, 1 << (target.l1_bytes - 1).bit_length(),
                    _pow2_floor(target.l2_bytes // 2))


_COMBINE = {"add": add, "mul": mul, "max": maximum, "min": minimum}


def _idx(value) -> Const:
    return const(value, dt.INDEX)


# ------------------------------------------------------------------ the nest


@dataclass
class _Nest:
    """A stage as output loops (outermost first) around an element body."""

    loops: list
    body: Block

    @property
    def vars(self):
        return [lp.var for lp in self.loops]

    @property
    def extents(self):
        return [lp.extent.value for lp in self.loops]


def _nest(stage: Stage):
    """The output loops and element body of ``stage``, or None when it does not
    have the shape ``lower.py`` gives (constant extents from zero)."""
    loops, s = [], stage.body
    while True:
        if not (isinstance(s, For) and isinstance(s.lo, Const) and s.lo.value == 0
                and isinstance(s.extent, Const)):
            return None
        loops.append(s)
        body = s.body
        if isinstance(body, Block) and len(body.stmts) == 1 and isinstance(body.stmts[0], For):
            s = body.stmts[0]
        elif isinstance(body, For):
            s = body
        else:
            body = body if isinstance(body, Block) else Block((body,))
            return _Nest(loops, body)


def _trips(loop: For) -> int:
    return max(loop.extent.value, 0) if isinstance(loop.extent, Const) else UNKNOWN_TRIPS


@dataclass
class _Access:
    buffer: Buffer
    index: object
    weight: int               # times it runs per element
    store: bool
    loops: tuple              # reduction loops around it, outermost first
    tested: frozenset = frozenset()   # the variables the tests around it read


def _accesses(body) -> list:
    """Every load and store of an element body with its run count per element."""
    out = []

    def exprs(es, weight, loops, tested):
        seen, stack = set(), list(es)
        while stack:
            e = stack.pop()
            if e in seen:
                continue
            seen.add(e)
            if isinstance(e, (BufLoad, GuardedLoad)):
                out.append(_Access(e.buffer, e.index, weight, False, loops, tested))
            stack += children(e)

    def visit(s, weight, loops, tested):
        if isinstance(s, Block):
            for x in s.stmts:
                visit(x, weight, loops, tested)
        elif isinstance(s, For):
            exprs(stmt_exprs(s), weight, loops, tested)
            visit(s.body, weight * _trips(s), loops + (s,), tested)
        elif isinstance(s, If):
            exprs(stmt_exprs(s), weight, loops, tested)
            inside = tested | frozenset(free_leaves(s.cond))
            visit(s.then, weight, loops, inside)
            if s.else_ is not None:
                visit(s.else_, weight, loops, inside)
        else:
            if isinstance(s, Store):
                out.append(_Access(s.buffer, s.index, weight, True, loops, tested))
            exprs(stmt_exprs(s), weight, loops, tested)

    visit(body, 1, (), frozenset())
    return out


def _lanes(accesses, bl: Blocking) -> int:
    """Lanes of a vector register for the widest element ``accesses`` read or write."""
    return bl.lanes(max([np.dtype(a.buffer.dtype).itemsize for a in accesses] + [4]))


def _vector_cost(accesses, v, lanes, extent) -> float:
    """Estimated cost per element of running ``v``'s iterations in vector lanes."""
    if extent < 2:
        return float("inf")
    used = extent / (-(-extent // lanes) * lanes)
    total = 0.0
    for a in accesses:
        s = stride(a.index, v)
        total += a.weight * (0.1 if s == 0 else 1.0 if s == 1 else 2 * lanes if a.store else lanes)
        total += a.weight if v in a.tested else 0     # a test that differs between lanes: masked work
    return total / (lanes * used)


def _innermost_reduction(body):
    """The innermost loop of the element body when all the body's loops form
    one chain (the usual single reduction), else None."""
    loops = [s for s in _walk(body) if isinstance(s, For)]
    if not loops:
        return None
    inner = loops[-1]
    if any(isinstance(x, For) for x in _walk(inner.body)):
        return None
    return inner


def _plain(loop: For) -> bool:
    """Whether LLVM's loop vectoriser can take ``loop``: its body only
    combines one accumulator (``acc = acc + e``: no tests, no second local)."""
    stmts = loop.body.stmts if isinstance(loop.body, Block) else (loop.body,)
    return all(isinstance(x, Alloc) or (isinstance(x, Assign) and _combine(x) is not None) for x in stmts) \
        and sum(isinstance(x, Assign) for x in stmts) == 1


def _walk(s):
    yield s
    if isinstance(s, Block):
        for x in s.stmts:
            yield from _walk(x)
    elif isinstance(s, (For, Simd)):
        yield from _walk(s.body)
    elif isinstance(s, If):
        yield from _walk(s.then)
        if s.else_ is not None:
            yield from _walk(s.else_)


# ------------------------------------------------------- element-body rewrites


def _in_bounds(index, size: int, ranges: dict) -> bool:
    """Whether an affine ``index`` provably stays in ``[0, size)`` when every
    variable stays in its ``ranges`` entry ``(first, last)``."""
    form = linear_form(index)
    if form is None or any(atom not in ranges for atom in form[0]):
        return False
    lo = hi = form[1]
    for atom, k in form[0].items():
        a, b = ranges[atom]
        lo, hi = lo + min(k * a, k * b), hi + max(k * a, k * b)
    return 0 <= lo and hi < size


def _loop_ranges(nest: _Nest) -> dict:
    """``{variable: (first, last)}`` of the output loops and of the constant-bound loops inside."""
    out = {v: (0, n - 1) for v, n in zip(nest.vars, nest.extents)}
    for x in _walk(nest.body):
        if isinstance(x, For) and isinstance(x.lo, Const) and isinstance(x.extent, Const):
            out[x.var] = (x.lo.value, x.lo.value + x.extent.value - 1)
    return out


def _guard(e, cond, ranges=None):
    """``e`` with every load made a :class:`GuardedLoad` under ``cond`` (loads
    inside its index too), but for loads whose index provably stays in
    bounds (``ranges``)."""
    def guard(x):
        if isinstance(x, GuardedLoad):
            return GuardedLoad(x.buffer, _guard(x.index, cond, ranges), logic_and(x.cond, cond))
        if ranges is not None and _in_bounds(x.index, x.buffer.size, ranges):
            return None
        return GuardedLoad(x.buffer, _guard(x.index, cond, ranges), cond)
    return map_loads(e, guard)


def _single_assign(block):
    stmts = block.stmts if isinstance(block, Block) else (block,)
    return stmts[0] if len(stmts) == 1 and isinstance(stmts[0], Assign) else None


def if_to_select(s, lane_var, ranges=None):
    """Turn every ``If`` whose condition differs between the lanes of
    ``lane_var`` and whose branches each assign one value to the same local
    (a guarded read, the padding test of a convolution) into one assignment
    of a ``select`` whose loads are :class:`GuardedLoad` under the branch
    condition: straight-line code the vector loop runs without branches.
    (A test that is the same for all lanes stays a branch: it skips work.)"""
    if isinstance(s, Block):
        return Block(tuple(if_to_select(x, lane_var, ranges) for x in s.stmts))
    if isinstance(s, For):
        return For(s.var, s.lo, s.extent, if_to_select(s.body, lane_var, ranges), s.kind)
    if not isinstance(s, If):
        return s
    then = if_to_select(s.then, lane_var, ranges)
    other = None if s.else_ is None else if_to_select(s.else_, lane_var, ranges)
    a, b = _single_assign(then), None if other is None else _single_assign(other)
    if lane_var in free_leaves(s.cond) and a is not None and (
            other is None or (b is not None and b.local is a.local)):
        no = a.local if other is None else _guard(b.value, logic_not(s.cond), ranges)
        yes = _guard(a.value, s.cond, ranges)
        if isinstance(yes, GuardedLoad) and yes.cond is s.cond and isinstance(no, Const) and no.value == 0:
            return Assign(a.local, yes)          # GuardedLoad is already zero where cond fails
        return Assign(a.local, Select(s.cond, yes, no) if yes.dtype == no.dtype else select(s.cond, yes, no))
    return If(s.cond, then, other)


def _bound_terms(e, op):
    """``e`` as the ``op`` (max or min) of its operands: (constants, others)."""
    stack, consts, others = [e], [], []
    while stack:
        x = stack.pop()
        if isinstance(x, BinOp) and x.op == op:
            stack += [x.a, x.b]
        elif isinstance(x, Const):
            consts.append(x.value)
        else:
            others.append(x)
    return consts, others


def offset_loops(s, outer: set):
    """Rewrite a loop ``for x in max(L, e)..min(U, e + D - 1) + 1`` whose bounds
    read output variables (zero elimination leaves such bounds on transposed
    convolutions) as ``for d in 0..D: x = e + d; if L <= x <= U: ...``: the
    bounds no longer depend on the output position, so the loop can be
    vectorised and jammed across outputs, and the test becomes a guard."""
    if isinstance(s, Block):
        return Block(tuple(offset_loops(x, outer) for x in s.stmts))
    if isinstance(s, If):
        return If(s.cond, offset_loops(s.then, outer),
                  None if s.else_ is None else offset_loops(s.else_, outer))
    if not isinstance(s, For):
        return s
    body = offset_loops(s.body, outer)
    if not _depends((s.lo, s.extent), outer):
        return For(s.var, s.lo, s.extent, body, s.kind)
    lows, lo_rest = _bound_terms(s.lo, "max")
    hi_form = linear_form(add(s.lo, s.extent))
    if len(lo_rest) != 1 or hi_form is None or len(hi_form[0]) != 1:
        return For(s.var, s.lo, s.extent, body, s.kind)
    (hi_atom, k), = hi_form[0].items()
    highs, hi_rest = _bound_terms(hi_atom, "min")
    if k != 1 or len(hi_rest) != 1:
        return For(s.var, s.lo, s.extent, body, s.kind)
    first, last = lo_rest[0], add(hi_rest[0], _idx(hi_form[1]))       # x in [first, last)
    span = linear_form(sub(last, first))
    if span is None or span[0] or span[1] <= 0 or linear_form(first) is None:
        return For(s.var, s.lo, s.extent, body, s.kind)
    d = var(f"{s.var.name}.d")
    x = simplify_index(add(first, d))
    conds = [compare("ge", x, _idx(v)) for v in lows] + \
            [compare("lt", x, _idx(v + hi_form[1])) for v in highs]
    body = rename(body, {s.var: x})
    if conds:
        cond = conds[0]
        for c in conds[1:]:
            cond = logic_and(cond, c)
        body = Block((If(cond, body if isinstance(body, Block) else Block((body,))),))
    return For(d, _idx(0), _idx(span[1]), body, s.kind)


# ----------------------------------------------------------------- jamming


def _depends(exprs, names) -> bool:
    return any(free_leaves(e) & names for e in exprs)


def _local_deps(body, jammed: set) -> dict:
    """For every local written in ``body``: the jammed variables its value
    depends on, through its values, conditions and loop bounds (a fixed point)."""
    deps = {}

    def of(exprs):
        out = set()
        for e in exprs:
            for leaf in free_leaves(e):
                out |= {leaf} & jammed if leaf in jammed else deps.get(leaf, set())
        return out

    while True:
        before = {k: len(v) for k, v in deps.items()}

        def visit(s, ctrl):
            if isinstance(s, Block):
                for x in s.stmts:
                    visit(x, ctrl)
            elif isinstance(s, For):
                visit(s.body, ctrl | of(stmt_exprs(s)))
            elif isinstance(s, If):
                c = ctrl | of((s.cond,))
                visit(s.then, c)
                if s.else_ is not None:
                    visit(s.else_, c)
            elif isinstance(s, (Alloc, Assign)):
                deps[s.local] = deps.get(s.local, set()) | ctrl | of(stmt_exprs(s))

        visit(body, set())
        if {k: len(v) for k, v in deps.items()} == before:
            return deps, of


class _Jam:
    """Unroll-and-jam of an element body over tile positions.  ``replicas`` are
    substitutions ``{var: expr}`` of the jammed variables, one per tile
    element.  A loop or test that reads no jammed variable stays one loop or
    test around the jammed body; any other statement is repeated once per
    distinct value of the jammed variables it depends on (a padding test
    that reads only the row runs once per row, not once per tile element),
    its locals renamed per copy."""

    def __init__(self, body, replicas, jammed: set, tag: str):
        self.replicas = replicas
        self.jammed = jammed
        self.deps, self.of = _local_deps(body, jammed)
        self.tag = tag
        self.names = {}
        self.out = self.stmt(body)

    def _stmt_deps(self, s) -> set:
        out = set()
        for x in _walk(s):
            out |= self.of(stmt_exprs(x))
            if isinstance(x, (Alloc, Assign)):
                out |= self.deps.get(x.local, set())
        return out

    def _rename(self, local, rep):
        d = self.deps.get(local, set())
        if not d:
            return local
        key = (local,) + tuple(rep[v] for v in sorted(d, key=lambda v: v.name))
        if key not in self.names:
            n = sum(1 for k in self.names if k[0] is local)
            self.names[key] = Local(f"{local.name}.{self.tag}{n}", local.dtype)
        return self.names[key]

    def _copies(self, s, d):
        out, seen = [], set()
        locals_ = {x.local for x in _walk(s) if isinstance(x, (Alloc, Assign))}
        for e in (e for x in _walk(s) for e in stmt_exprs(x)):
            locals_ |= {leaf for leaf in free_leaves(e) if isinstance(leaf, Local)}
        order = sorted(d, key=lambda v: v.name)
        for rep in self.replicas:
            key = tuple(rep[v] for v in order)
            if key in seen:
                continue
            seen.add(key)
            mapping = {v: rep[v] for v in d}
            mapping.update({x: self._rename(x, rep) for x in locals_})
            out.append(rename(s, mapping))
        return out[0] if len(out) == 1 else Block(tuple(out))

    def stmt(self, s):
        if isinstance(s, Block):
            return _flat(self.stmt(x) for x in s.stmts)
        if isinstance(s, For) and not self.of(stmt_exprs(s)):
            return For(s.var, s.lo, s.extent, self.stmt(s.body), s.kind)
        if isinstance(s, If) and not self.of(stmt_exprs(s)):
            return If(s.cond, self.stmt(s.then), None if s.else_ is None else self.stmt(s.else_))
        return self._copies(s, self._stmt_deps(s))


# ------------------------------------------------------------------ packing


def _box(a: _Access, axis: Var, extent: int):
    """The ``(variable, first, extent)`` of each dimension a copy of load ``a``
    needs: the reduction loops its index reads (constant bounds), then
    ``axis`` over ``0..extent``; None when the index reads anything else or
    may leave the buffer."""
    form = linear_form(a.index)
    if a.store or not a.loops or form is None:
        return None
    terms, c0 = form
    red = [lp for lp in a.loops if lp.var in terms]
    names = {lp.var for lp in red}
    if (any(atom is not axis and atom not in names for atom in terms) or len(names) != len(red)
            or not all(isinstance(lp.lo, Const) and isinstance(lp.extent, Const) for lp in red)):
        return None
    box = [(lp.var, lp.lo.value, lp.extent.value) for lp in red] + [(axis, 0, extent)]
    if any(n <= 0 for _, _, n in box):
        return None
    lo = c0 + sum(min(terms.get(v, 0) * a0, terms.get(v, 0) * (a0 + n - 1)) for v, a0, n in box)
    hi = c0 + sum(max(terms.get(v, 0) * a0, terms.get(v, 0) * (a0 + n - 1)) for v, a0, n in box)
    return box if 0 <= lo and hi < a.buffer.size else None


def _pack_plan(nest: _Nest, j: Var, accesses) -> list:
    """The loads worth copying into a transposed temporary ``P[r..., j]``:
    gathers along ``j`` inside a reduction whose index reads only ``j`` and
    reduction variables with constant bounds (``B[j, k]`` in ``A @ B.T``),
    in bounds over the whole box, and re-read by the other output loops at
    least ``PACK_MIN_REUSE`` times.  Returns ``[(access, box, None)]`` with
    ``box`` the ``(variable, first, extent)`` of each packed dimension, ``j``
    last (:func:`_box`), and no panel (see :func:`_panel_plan`)."""
    j_extent = nest.extents[nest.vars.index(j)]
    if prod(nest.extents) // max(j_extent, 1) < PACK_MIN_REUSE:
        return []
    plan, seen = [], set()
    for a in accesses:
        if stride(a.index, j) in (0, 1, None) or (a.buffer, a.index) in seen:
            continue
        box = _box(a, j, j_extent)
        if box is not None:
            seen.add((a.buffer, a.index))
            plan.append((a, box, None))
    return plan


def _panel_plan(nest: _Nest, accesses, i: Var, j: Var, gathers, mr: int, width: int, tiles,
                bl: Blocking) -> list:
    """The copies that give a register-tiled GEMM contiguous operands (rule 6a):
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
    :func:`_pack_plan`) take the panel layout.  ``tiles`` are the tile
    variables ``(j tile, i tile)`` the panel indices use.  Returns
    ``[(access, box, (width, tile))]``."""
    extents = dict(zip(nest.vars, nest.extents))
    total = prod(nest.extents)
    plan = [(a, box, (width, tiles[0])) for a, box, _ in gathers]
    seen = {(a.buffer, a.index) for a, _, _ in gathers}
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
        box = _box(a, axis, extents[axis])
        if box is None or prod(n for _, _, n in box) * np.dtype(a.buffer.dtype).itemsize < bl.panel_min_bytes:
            continue
        in_place = substitute(_panel_index(box, size, tile), {tile: _idx(0)})
        if a.buffer.kind == "temp" and extents[axis] <= size and \
                linear_form(in_place) == linear_form(a.index):
            continue                        # already a panel
        seen.add((a.buffer, a.index))
        plan.append((a, box, (size, tile)))
    return plan


def _panel_index(box, size: int, tile: Var):
    """Index of element ``(r..., t)`` of a box in panels ``P[tile][r...][size]``
    with ``t = tile * size + (t mod size)``: ``t + r_lin * size + tile * (R - 1) * size``
    (affine, as the tile variable is a loop of the schedule)."""
    rest = prod(n for _, _, n in box[:-1])
    out, step = add(box[-1][0], mul(tile, _idx((rest - 1) * size))), size
    for v, a0, n in reversed(box[:-1]):
        out = add(out, mul(add(v, _idx(-a0)), _idx(step)))
        step *= n
    return simplify_index(out)


def _pack(body, plan, taken: set, new_stages, new_buffers):
    """Apply a :func:`_pack_plan` or :func:`_panel_plan`: one copy stage and
    temporary per load; the body with those loads reading the copies.  A
    panel's last panel is padded with zeros."""
    replace = {}
    for a, box, panel in plan:
        name, k = f"{a.buffer.name}.packed", 1
        while name in taken:
            name, k = f"{a.buffer.name}.packed{k}", k + 1
        taken.add(name)
        *red, (t, _, t_extent) = box
        if panel is None:
            shape = tuple(n for _, _, n in box)
            axes = [var(f"p{d}") for d in range(len(box))]
            at = {v: add(ax, _idx(a0)) for (v, a0, _), ax in zip(box, axes)}
            index = simplify_index(_linear([add(v, _idx(-a0)) for v, a0, _ in box], shape))
            cond = None
        else:
            size, tile = panel
            shape = (-(-t_extent // size),) + tuple(n for _, _, n in red) + (size,)
            axes = [var(f"p{d}") for d in range(len(shape))]
            at = {v: add(ax, _idx(a0)) for (v, a0, _), ax in zip(red, axes[1:-1])}
            at[t] = add(mul(axes[0], _idx(size)), axes[-1])
            index = _panel_index(box, size, tile)
            cond = None if t_extent % size == 0 else _lt(at[t], t_extent)
        packed = Buffer(name, shape, a.buffer.dtype, "temp")
        new_buffers.append(packed)
        src = simplify_index(substitute(a.index, at))
        value = BufLoad(a.buffer, src) if cond is None else GuardedLoad(a.buffer, src, cond)
        stmt = Store(packed, _linear(axes, shape), value)
        for d in reversed(range(len(axes))):
            inner = stmt if d == len(axes) - 1 else Block((stmt,))
            stmt = For(axes[d], _idx(0), _idx(shape[d]), inner, "parallel" if d == 0 else "serial")
        new_stages.append(Stage(name, packed, stmt))
        replace[(a.buffer, a.index)] = (packed, index)
    return _replace_loads(body, replace) if replace else body


def _linear(indices, shape):
    out, step = _idx(0), 1
    for ix, n in reversed(list(zip(indices, shape))):
        out = add(out, mul(ix, _idx(step)))
        step *= n
    return out


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


# ------------------------------------------------------------------ peeling


def _conjuncts(cond) -> list:
    """The terms of a condition that is a tree of ``and``."""
    if isinstance(cond, Logic) and cond.op == "and":
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


def _holds_from(test, i: Var, inner: dict):
    """``(lo, hi)``: the test holds for every value of the inner loops
    (``inner``: ``{variable: (first, last)}``) whenever ``lo <= i < hi``; None
    unless it is an order comparison, affine in ``i`` and those variables."""
    if not isinstance(test, Cmp) or test.op not in ("lt", "le", "gt", "ge"):
        return None
    # as ``form >= 0``
    a, b = (test.a, test.b) if test.op in ("gt", "ge") else (test.b, test.a)
    form = linear_form(sub(a, b))
    if form is None or i not in form[0] or any(v is not i and v not in inner for v in form[0]):
        return None
    terms, c = form
    c -= test.op in ("gt", "lt")
    k = terms[i]
    c += sum(min(m * inner[v][0], m * inner[v][1]) for v, m in terms.items() if v is not i)
    return (-(c // k), 1 << 62) if k > 0 else (-(1 << 62), c // -k + 1)      # k i + c >= 0


def _interior(body, i: Var, inner: dict):
    """``(lo, hi, tests)`` for a row variable ``i`` that tests in ``body``
    read: on ``lo <= i < hi`` every test term that reads ``i`` holds for all
    values of the inner loops (a convolution's padding tests on the output
    column: true away from the borders).  ``(0, 0, ())`` when no test reads
    ``i``; None when some test term that reads it cannot be bounded."""
    lo, hi, tests = -(1 << 62), 1 << 62, []
    for x in _walk(body):
        if isinstance(x, If) and i in free_leaves(x.cond):
            for t in _conjuncts(x.cond):
                if i not in free_leaves(t):
                    continue
                span = _holds_from(t, i, inner)
                if span is None:
                    return None
                lo, hi = max(lo, span[0]), min(hi, span[1])
                tests.append(t)
    return (lo, hi, tuple(tests)) if tests else (0, 0, ())


def _drop_tests(s, tests):
    """``s`` with the test terms ``tests`` (known to hold) left out of its
    conditions; a test left with no term is replaced by its branch."""
    if isinstance(s, Block):
        return _flat(_drop_tests(x, tests) for x in s.stmts)
    if isinstance(s, For):
        return For(s.var, s.lo, s.extent, _drop_tests(s.body, tests), s.kind)
    if not isinstance(s, If):
        return s
    then = _drop_tests(s.then, tests)
    other = None if s.else_ is None else _drop_tests(s.else_, tests)
    terms = [t for t in _conjuncts(s.cond) if t not in tests]
    if not terms:
        return then
    cond = terms[0]
    for t in terms[1:]:
        cond = logic_and(cond, t)
    return If(cond, then, other)


def _peeled(extent: int, mr: int, body, i: Var, inner: dict):
    """Rule 6b: the row range of a register-tiled stage in segments
    ``[(first, length, body)]``: the interior, where the tests on the row
    variable (padding) always hold, runs without them; the borders keep them
    (a test on the row would otherwise be repeated for each row of a tile).
    The interior is a whole number of tiles of ``mr`` rows.  None when there
    is no interior of a full tile."""
    found = _interior(body, i, inner)
    if found is None or not found[2]:
        return None
    lo, hi = max(found[0], 0), min(found[1], extent)
    if hi - lo < mr:
        return None
    hi = lo + (hi - lo) // mr * mr         # whole tiles; the rest joins the border
    segments = [(0, lo, body), (lo, hi - lo, _drop_tests(body, found[2])), (hi, extent - hi, body)]
    return [seg for seg in segments if seg[1] > 0]


# ------------------------------------------------------------------- tiling


def _gemm_rows(nest: _Nest, body, j: Var, accesses, inner: dict, bl: Blocking):
    """The output variable to register-tile with ``j``, or None: the body must
    run a reduction whose bounds read neither, in which some load does not
    move with ``j`` (a broadcast) and some load does not move with it.
    Among the variables whose rows share the most vector loads, the first
    whose tests can be peeled off (:func:`_peeled`; a test on the row would
    be repeated for each row of a tile), then one with a full tile of rows,
    then the one along which the broadcast loads move least (adjacent rows
    read the same cache lines: the output columns of a convolution rather
    than its batch).  ``inner``: the ranges of the loops inside the body."""
    loops = [s for s in _walk(body) if isinstance(s, For)]
    if not loops:
        return None
    trips = prod(_trips(lp) for lp in loops if not _depends(stmt_exprs(lp), {j}))
    if trips < GEMM_MIN_TRIPS:
        return None
    reads = [a for a in accesses if a.loops and not a.store]
    if not any(stride(a.index, j) == 0 for a in reads):
        return None
    best, best_key = None, None
    for v, n in zip(nest.vars, nest.extents):
        if v is j or n < 2 or any(_depends(stmt_exprs(lp), {v, j}) for lp in loops):
            continue
        score = sum(a.weight for a in reads if stride(a.index, v) == 0 and stride(a.index, j) != 0)
        moves = [stride(a.index, v) for a in reads if stride(a.index, j) == 0 and stride(a.index, v) != 0]
        spread = max((float("inf") if m is None else abs(m) for m in moves), default=0)
        key = (score, _interior(body, v, inner) is not None, min(n, bl.tile_rows), -spread)
        if score > 0 and (best_key is None or key > best_key):
            best, best_key = v, key
    return best


def _tiled(extent: int, size: int, var_: Var, make, block=None) -> object:
    """A loop over tiles of ``size`` along an axis of ``extent``: ``make(base,
    n, tile)`` builds the code for the ``n`` positions from ``base`` in tile
    number ``tile``; a partial last tile gets its own code behind a (uniform)
    test.  ``block = (b, per)``: only the ``per`` tiles of block ``b`` (a loop
    outside)."""
    full, rest = divmod(extent, size)
    if block is not None:
        b, per = block
        tiles = full + (rest > 0)
        tile = add(mul(b, _idx(per)), var_)
        count = _idx(per) if tiles % per == 0 else minimum(_idx(per), sub(_idx(tiles), mul(b, _idx(per))))
        base = mul(tile, _idx(size))
        if rest == 0:
            return For(var_, _idx(0), count, make(base, size, tile))
        test = If(_lt(tile, full), Block((make(base, size, tile),)), Block((make(base, rest, tile),)))
        return For(var_, _idx(0), count, Block((test,)))
    base = mul(var_, _idx(size))
    if rest == 0:
        return For(var_, _idx(0), _idx(full), make(base, size, var_))
    if full == 0:
        return For(var_, _idx(0), _idx(1), make(_idx(0), rest, _idx(0)))
    test = If(_lt(var_, full), Block((make(base, size, var_),)), Block((make(base, rest, var_),)))
    return For(var_, _idx(0), _idx(full + 1), Block((test,)))


def _row_blocks(accesses, i: Var, j: Var, i_extent: int, bl: Blocking) -> int:
    """Blocks of row tiles for a GEMM with several column tiles whose row
    operand (the loads that move with ``i``, not with ``j``) is larger than
    ``bl.row_block_bytes``: a power of two, so that the blocks of rows (the
    parallel root) split evenly, each block small enough to stay in L2 while
    the column panels pass."""
    size = max((i_extent * prod(_trips(lp) for lp in a.loops) * np.dtype(a.buffer.dtype).itemsize
                for a in accesses if a.loops and not a.store and stride(a.index, j) == 0
                and stride(a.index, i) != 0), default=0)
    blocks = 1
    while size > blocks * bl.row_block_bytes:
        blocks *= 2
    return blocks


def _lt(v, n):
    from te_autodiff.expr import compare
    return compare("lt", v, _idx(n))


def _schedule_nest(nest: _Nest, stage: Stage, taken, new_stages, new_buffers, bl: Blocking):
    nest = _Nest(nest.loops, offset_loops(nest.body, set(nest.vars)))
    accesses = _accesses(nest.body)
    lanes = _lanes(accesses, bl)
    plans = {v: _pack_plan(nest, v, accesses) for v in nest.vars}
    costs = {}
    for v, n in zip(nest.vars, nest.extents):
        packed = {id(a) for a, _, _ in plans[v]}
        costs[v] = _vector_cost([a if id(a) not in packed else _Access(a.buffer, v, a.weight, False, a.loops,
                                                                       a.tested)
                                 for a in accesses], v, lanes, n)
        # a copy moves each packed element once (about one gather lane each), per output element
        costs[v] += sum(prod(n for _, _, n in box) for _, box, _ in plans[v]) / prod(nest.extents)
    j = min(reversed(nest.vars), key=lambda v: costs[v])
    if costs[j] == float("inf"):
        body = _lane_reduction(nest, bl)
        if body is None:
            return [stage]
        return [Stage(stage.name, stage.buffer, _assemble(nest.loops[:-1] + [
            For(nest.loops[-1].var, nest.loops[-1].lo, nest.loops[-1].extent, body)]))]
    red = _innermost_reduction(nest.body)
    if red is not None and red.kind == "serial" and isinstance(red.extent, Const) and _plain(red):
        inner = [a for a in accesses if red in a.loops]
        if _vector_cost(inner, red.var, lanes, red.extent.value) < costs[j] * 0.5:
            # a row reduction: each element's reduction runs in vector lanes
            body = reduce_in_lanes(nest.body, bl)
            if body is None:
                return [stage]
            return [Stage(stage.name, stage.buffer, _assemble(nest.loops[:-1] + [
                For(nest.loops[-1].var, nest.loops[-1].lo, nest.loops[-1].extent, body)]))]
    if plans[j] and sum(a.buffer.nbytes for a, _, _ in plans[j]) > PACK_MAX_BYTES:
        dot = _dot_tiles(nest, j, bl)          # a large copy costs more than horizontal sums
        if dot is not None:
            return [Stage(stage.name, stage.buffer, dot)]
    ranges = _loop_ranges(nest)
    inner = {v: r for v, r in ranges.items() if v not in set(nest.vars)}
    body = if_to_select(nest.body, j, ranges)
    accesses = _accesses(body)
    j_extent = nest.extents[nest.vars.index(j)]
    lanes = _lanes([a for a in accesses if stride(a.index, j) != 0], bl)
    lanes = min(lanes, max(4, 1 << (j_extent - 1).bit_length()))
    i = _gemm_rows(nest, body, j, accesses, inner, bl)
    mr = min(bl.tile_rows, nest.extents[nest.vars.index(i)]) if i is not None else 1
    nr = min(TILE_VECTORS, -(-j_extent // lanes)) if i is not None else 1
    jt, it = var(f"{j.name}.t"), var(f"{i.name if i is not None else j.name}.t")    # tile numbers
    plan = plans[j] if i is None else _panel_plan(nest, accesses, i, j, plans[j], mr, nr * lanes, (jt, it), bl)
    body = _pack(body, plan, taken, new_stages, new_buffers)
    accesses = _accesses(body)
    column_panels = any(p is not None and p[1] is jt for _, _, p in plan)
    kb = var("k.b")

    def partial_sums(dtype):
        """A temporary for the partial sums of K blocks: the output's shape, ``j`` last."""
        order = [v for v in nest.vars if v is not j] + [j]
        shape = tuple(nest.extents[nest.vars.index(v)] for v in order)
        name, k = f"{stage.name}.sums", 1
        while name in taken:
            name, k = f"{stage.name}.sums{k}", k + 1
        taken.add(name)
        buf = Buffer(name, shape, dtype, "temp")
        new_buffers.append(buf)
        return buf, _linear(order, shape)

    k_blocked = _k_blocked(body, stage.buffer, kb, j, partial_sums, bl) if i is not None else None
    epilogue = None
    if k_blocked is not None:
        body, n_kb, epilogue = k_blocked
    jl = var(f"{j.name}.l")

    tags = iter(range(1 << 30))

    def jam(reps, src):
        return _Jam(src, reps, set(reps[0]), f"{next(tags)}.").out

    def simds(row_subs, base, n_cols, tile, src=body):
        """One tile of ``src`` (default: the element body): the rows
        ``row_subs`` by the columns ``base .. base + n_cols`` of ``j`` (column
        tile number ``tile``), as full vectors jammed together and a masked
        last vector."""
        full, rest = divmod(n_cols, lanes)
        out = []
        if full:
            reps = [{**rs, j: add(add(base, _idx(c * lanes)), jl), jt: tile}
                    for c in range(full) for rs in row_subs]
            out.append(Simd(jl, _idx(0), lanes, _idx(lanes), jam(reps, src)))
        if rest:
            reps = [{**rs, j: add(add(base, _idx(full * lanes)), jl), jt: tile} for rs in row_subs]
            out.append(Simd(jl, _idx(0), lanes, _idx(rest), jam(reps, src)))
        return Block(tuple(out))

    def columns(row_subs, wrap=lambda b: b, src=body):
        """The column tiles of ``nr`` vectors along ``j`` for the rows ``row_subs``."""
        return _tiled(j_extent, nr * lanes, var(f"{j.name}.o"),
                      lambda base, n_cols, tile: wrap(simds(row_subs, base, n_cols, tile, src)))

    def row_subs(base, n_rows, tile):
        return [{i: add(base, _idx(r)), it: tile} for r in range(n_rows)]

    blocked = _gather_block(nest, j, accesses) if i is None else None
    if blocked is not None:               # gathers along j: visit a block of rows per column tile
        b, b_extent = blocked
        b_out, b_in = var(f"{b.name}.b"), var(f"{b.name}.i")
        inner = _idx(GATHER_BLOCK) if b_extent % GATHER_BLOCK == 0 else minimum(
            _idx(GATHER_BLOCK), sub(_idx(b_extent), mul(b_out, _idx(GATHER_BLOCK))))
        row = {b: add(mul(b_out, _idx(GATHER_BLOCK)), b_in)}
        tiles = columns([row], lambda blk: Block((For(b_in, _idx(0), inner, blk),)))
        inner_loop = For(b_out, _idx(0), _idx(-(-b_extent // GATHER_BLOCK)), Block((tiles,)))
        i = b
    elif i is None:
        inner_loop = columns([{}])
    else:
        i_extent = nest.extents[nest.vars.index(i)]
        tiles = -(-i_extent // mr)
        columns_first = k_blocked is not None or column_panels
        per_block = tiles if not columns_first or j_extent <= nr * lanes else \
            -(-tiles // _row_blocks(accesses, i, j, i_extent, bl))
        row_panels = any(p is not None and p[1] is it for _, _, p in plan)
        # peeled rows are sibling loops: another output loop must be the parallel root
        segments = None if row_panels or per_block < tiles or len(nest.vars) < 3 \
            else _peeled(i_extent, mr, body, i, inner)
        rb = var(f"{i.name}.b")

        def rows(tile_of):
            """The row tiles, ``tile_of(row_subs, element body)`` making one; in
            segments when the row range is peeled, in blocks when blocked."""
            if segments is None:
                return _tiled(i_extent, mr, var(f"{i.name}.o"),
                              lambda base, n, tile: tile_of(row_subs(base, n, tile), body),
                              None if per_block == tiles else (rb, per_block))
            return Block(tuple(
                _tiled(n_rows, mr, var(f"{i.name}.o"), lambda base, n, tile, first=first, src=src:
                       tile_of(row_subs(add(base, _idx(first)), n, tile), src))
                for first, n_rows, src in segments))

        if columns_first:               # (row blocks,) column tiles, (K blocks,) row tiles
            def column(jb, nc, jtile):
                row_tiles = rows(lambda rs, src: simds(rs, jb, nc, jtile, src))
                return _as_block(row_tiles if k_blocked is None else
                                 For(kb, _idx(0), _idx(n_kb), _as_block(row_tiles)))

            inner_loop = _tiled(j_extent, nr * lanes, var(f"{j.name}.o"), column)
            if per_block < tiles:
                inner_loop = For(rb, _idx(0), _idx(-(-tiles // per_block)), Block((inner_loop,)))
        else:                           # row tiles, column tiles
            inner_loop = rows(lambda rs, src: Block((columns(rs, src=src),)))
    # outer loops: the output loops other than i and j, then the tile loops
    outer = [lp for lp in nest.loops if lp.var is not i and lp.var is not j]
    chain = outer + (_loop_chain(inner_loop) if isinstance(inner_loop, For) else [])
    movable = {lp.var for lp in chain} - {kb}
    body = chain[-1].body if isinstance(inner_loop, For) else inner_loop
    nest_ir = _assemble(_choose_root(chain, movable), body)
    if epilogue is None:
        return [Stage(stage.name, stage.buffer, nest_ir)]
    sums, store = epilogue
    tail = Stage(stage.name, stage.buffer, _assemble(nest.loops, Block((store,))))
    return [Stage(sums.name, sums, nest_ir)] + schedule_stage(tail, taken, new_buffers, bl)


_COMBINE_OPS = ("add", "mul", "max", "min")


def _combine(assign: Assign):
    """``(op, e)`` when ``assign`` is ``acc = acc op e`` with ``e`` not reading ``acc``."""
    v = assign.value
    while isinstance(v, Cast) and v.to == assign.local.dtype:
        v = v.a
    if not (isinstance(v, BinOp) and v.op in _COMBINE_OPS):
        return None
    for a, e in ((v.a, v.b), (v.b, v.a)):
        if a is assign.local and assign.local not in free_leaves(e):
            return v.op, e
    return None


def _perfect_nest(s):
    """``(loops, innermost body)`` of a nest of constant-bound loops, each
    holding only the next; None otherwise."""
    loops = []
    while isinstance(s, For) and isinstance(s.lo, Const) and isinstance(s.extent, Const):
        loops.append(s)
        body = s.body
        inner = body.stmts[0] if isinstance(body, Block) and len(body.stmts) == 1 else body
        if not isinstance(inner, For):
            return loops, body
        s = inner
    return None


def _lane_reduction(nest: _Nest, bl: Blocking):
    """A stage that stores one element computed by a reduction (a loss): see
    :func:`reduce_in_lanes`.  Returns the new element body or None."""
    if any(n != 1 for n in nest.extents):
        return None
    return reduce_in_lanes(nest.body, bl)


def reduce_in_lanes(body: Block, bl: Blocking, min_trips: int = 0):
    """Spread the iterations of the first reduction loop nest of ``body`` over
    vector lanes: each lane combines its own share in order into its own
    partial value per accumulator, the lanes are combined pairwise at the
    end and the leftover iterations after that.  This reassociates the
    reduction in a fixed way (the same for every run and thread count).  The
    lanes run over the reduction loop along which the reads are most
    contiguous; the loop along which the remaining gathers move least is put
    innermost, so the lines a gather touches are reused; a long sum is added
    up in blocks (the rounding error grows with the block, not the total).
    Returns the new body or None when no loop nest qualifies."""
    stmts = body.stmts
    for k, s in enumerate(stmts):
        found = _perfect_nest(s)
        if found is None:
            continue
        loops, inner = found
        inner_stmts = inner.stmts if isinstance(inner, Block) else (inner,)
        declared = {x.local for x in _walk(inner) if isinstance(x, Alloc)}
        writes = [x for x in _walk(inner) if isinstance(x, Assign) and x.local not in declared]
        if not writes or any(x not in inner_stmts for x in writes) or \
                len({x.local for x in writes}) != len(writes):
            continue
        accs = []
        for w in writes:
            comb = _combine(w)
            init = [x for x in stmts[:k] if isinstance(x, Alloc) and x.local is w.local]
            if comb is None or not init or not isinstance(init[0].init, Const):
                break
            accs.append((w.local, comb[0], init[0].init))
        if len(accs) != len(writes) or any(isinstance(x, (For, Simd)) for x in _walk(inner)):
            continue
        accesses = _accesses(inner)
        lanes = _lanes(accesses, bl)
        costs = {lp.var: _vector_cost(accesses, lp.var, lanes, lp.extent.value) for lp in loops}
        v_loop = min(reversed(loops), key=lambda lp: costs[lp.var])
        n = v_loop.extent.value
        if costs[v_loop.var] == float("inf") or n < max(lanes, min_trips):
            return None
        rest = [lp for lp in loops if lp is not v_loop]
        gathers = [a for a in accesses if stride(a.index, v_loop.var) not in (0, 1)]

        def reuse(lp):
            return sum(abs(stride(a.index, lp.var) or 1 << 20) * a.weight for a in gathers)

        rest.sort(key=lambda lp: -reuse(lp))              # the gathers move least innermost
        lane, block = var(f"{v_loop.var.name}.l"), var(f"{v_loop.var.name}.b")
        full = n // lanes
        parts = {acc: Local(f"{acc.name}.lanes", acc.dtype) for acc, _, _ in accs}
        first = add(v_loop.lo, add(mul(block, _idx(lanes)), lane))
        chain = [For(block, _idx(0), _idx(full), None)] + rest
        if not rest and full >= 8 * SUM_RUN and full % SUM_RUN == 0:   # runs to add up in blocks
            outer_b, inner_b = var(f"{v_loop.var.name}.bo"), var(f"{v_loop.var.name}.bi")
            first = add(v_loop.lo, add(mul(add(mul(outer_b, _idx(SUM_RUN)), inner_b), _idx(lanes)), lane))
            chain = [For(outer_b, _idx(0), _idx(full // SUM_RUN), None),
                     For(inner_b, _idx(0), _idx(SUM_RUN), None)]
        if all(op == "add" for _, op, _ in accs) and len(chain) > 1 and _trips(chain[-1]) >= 16:
            runs = {acc: Local(f"{acc.name}.run", acc.dtype) for acc, _, _ in accs}
            inner_body = rename(inner, {v_loop.var: first, **runs})
            last = chain[-1]
            inner_body = Block(tuple(Alloc(runs[acc], ident) for acc, _, ident in accs) + (
                For(last.var, last.lo, last.extent, _as_block(inner_body)),) + tuple(
                Assign(parts[acc], add(parts[acc], runs[acc])) for acc, _, _ in accs))
            chain = chain[:-1]
        else:
            inner_body = rename(inner, {v_loop.var: first, **parts})
        for lp in reversed(chain):
            inner_body = For(lp.var, lp.lo, lp.extent, _as_block(inner_body))
        vector = Simd(lane, _idx(0), lanes, _idx(lanes), Block(
            tuple(Alloc(parts[acc], ident) for acc, _, ident in accs) + (inner_body,) + tuple(
                Assign(acc, _COMBINE[op](acc, LaneReduce(op, parts[acc], ident)))
                for acc, op, ident in accs)))
        out = [vector]
        if n % lanes:                      # the leftover iterations, in masked lanes, after the rest
            tail_body = rename(inner, {v_loop.var: add(v_loop.lo, add(_idx(full * lanes), lane)), **parts})
            for lp in reversed(rest):
                tail_body = For(lp.var, lp.lo, lp.extent, _as_block(tail_body))
            out.append(Simd(lane, _idx(0), lanes, _idx(n % lanes), Block(
                tuple(Alloc(parts[acc], ident) for acc, _, ident in accs) + (tail_body,) + tuple(
                    Assign(acc, _COMBINE[op](acc, LaneReduce(op, parts[acc], ident)))
                    for acc, op, ident in accs))))
        return Block(tuple(stmts[:k]) + tuple(out) + tuple(stmts[k + 1:]))
    return None


def _flat(stmts) -> Block:
    """A block of ``stmts`` with nested blocks spliced in."""
    out = []
    for x in stmts:
        out += x.stmts if isinstance(x, Block) else [x]
    return Block(tuple(out))


def _as_block(s):
    return s if isinstance(s, Block) else Block((s,))


def _dot_tiles(nest: _Nest, j: Var, bl: Blocking):
    """Register tiles for ``C[i, j] = sum_k A[i, k] B[j, k]`` without copying
    ``B``: a tile of ``bl.dot_tile x bl.dot_tile`` elements shares one reduction loop
    (unroll and jam, as scalars), and that loop runs in vector lanes along
    ``k``, where both operands are contiguous (:func:`reduce_in_lanes`);
    each element's lanes are added pairwise at the end.  Returns the stage
    body or None when the nest does not have that shape."""
    k = nest.vars.index(j)
    if k == 0 or any(isinstance(x, If) for x in _walk(nest.body)):
        return None
    i = nest.vars[k - 1]
    i_extent, j_extent = nest.extents[k - 1], nest.extents[k]
    tags = iter(range(1 << 30))
    failed = []

    def tile(ib, n_rows, jb, n_cols):
        reps = [{i: add(ib, _idx(r)), j: add(jb, _idx(c))} for r in range(n_rows) for c in range(n_cols)]
        jammed = _Jam(nest.body, reps, {i, j}, f"{next(tags)}.").out
        out = reduce_in_lanes(jammed, bl, min_trips=2 * bl.lanes(4))
        if out is None:
            failed.append(True)
            return jammed
        return out

    inner = _tiled(j_extent, bl.dot_tile, var(f"{j.name}.o"), lambda jb, nc, _: Block((
        _tiled(i_extent, bl.dot_tile, var(f"{i.name}.o"), lambda ib, nr_, _: tile(ib, nr_, jb, nc)),)))
    if failed:
        return None
    outer = [lp for lp in nest.loops if lp.var is not i and lp.var is not j]
    chain = outer + _loop_chain(inner)
    return _assemble(_choose_root(chain), chain[-1].body)


def _k_blocked(body: Block, out: Buffer, kb: Var, j: Var, partial_sums, bl: Blocking):
    """Split the reduction loop of a GEMM-like element body into equal blocks
    of at most ``bl.k_block`` iterations (784 = 4 x 196: no short last block
    paying a whole block's loads and stores of the accumulators), block
    ``kb`` resuming from the partial sum left in the output element by block
    ``kb - 1`` (the epilogue runs after the last block).  Each element still
    adds its terms in the same order, so the result is bit-identical; the
    tile loops can then run all row tiles of one block while a block x
    tile-width slice of the other operand stays in L1.  The partial sums go
    back into the output as whole vectors.  When the output is not contiguous
    along ``j`` (or has another dtype) every block stores them into the
    temporary ``partial_sums(dtype)`` returns as ``(buffer, index)``, laid out
    with ``j`` last, and a separate epilogue ``out[idx] = f(sum)`` reads them
    (one transposing pass instead of a scatter per tile).  Returns ``(body,
    blocks, epilogue)`` with ``epilogue`` None or ``(buffer, store)``; None when
    the body is not ``acc = init; for k: acc = acc + ...; out[idx] = f(acc)``
    with a long loop."""
    stmts = body.stmts
    if len(stmts) < 3 or not isinstance(stmts[-1], Store) or stmts[-1].buffer is not out:
        return None
    loops = [k for k, x in enumerate(stmts) if isinstance(x, For)]
    if len(loops) != 1 or loops[0] != len(stmts) - 2:
        return None
    loop = stmts[-2]
    if not (isinstance(loop.lo, Const) and isinstance(loop.extent, Const)) \
            or loop.extent.value <= bl.k_block_min:
        return None
    writes = {x.local for x in _walk(loop) if isinstance(x, Assign)}
    declared = {x.local for x in _walk(loop) if isinstance(x, Alloc)}
    (acc,) = writes - declared if len(writes - declared) == 1 else (None,)
    head = stmts[:-2]
    if acc is None or not all(
            isinstance(x, Alloc) and x.local is acc and isinstance(x.init, Const) for x in head):
        return None
    store = stmts[-1]
    in_place = stride(store.index, j) == 1 and acc.dtype == out.dtype
    sums, at = (out, store.index) if in_place else partial_sums(acc.dtype)
    n = loop.extent.value
    blocks = -(-n // bl.k_block)
    size = -(-n // blocks)
    lo = add(loop.lo, mul(kb, _idx(size)))
    extent = _idx(size) if n % size == 0 else minimum(_idx(size), sub(_idx(n), mul(kb, _idx(size))))
    first, last = compare("eq", kb, _idx(0)), compare("eq", kb, _idx(blocks - 1))
    keep = Store(sums, at, acc)
    epilogue = None if in_place else \
        (sums, Store(out, store.index, substitute(store.value, {acc: BufLoad(sums, at)})))
    return Block((
        Alloc(acc, None),
        If(first, Block((Assign(acc, head[0].init),)), Block((Assign(acc, BufLoad(sums, at)),))),
        For(loop.var, lo, extent, loop.body, loop.kind),
        If(last, Block((store,)), Block((keep,))) if in_place else keep,
    )), blocks, epilogue


def _gather_block(nest: _Nest, j: Var, accesses):
    """The output loop to block when the element body gathers along ``j``:
    the loop just outside ``j``, visited ``GATHER_BLOCK`` values at a time
    inside each column tile, so the cache lines a gather touches (a
    transposed read) are reused by the neighbouring rows.  None when the
    gathers are a small part of the accesses or there is no such loop."""
    k = nest.vars.index(j)
    if k == 0:
        return None
    total = sum(a.weight for a in accesses)
    gathered = sum(a.weight for a in accesses if stride(a.index, j) not in (0, 1))
    b, n = nest.vars[k - 1], nest.extents[k - 1]
    if gathered * 4 < total or n <= GATHER_BLOCK // 2:
        return None
    return b, n


def _loop_chain(loop):
    """A tile loop nest as a list of loops whose innermost carries the body."""
    out = [loop]
    while True:
        body = out[-1].body
        if isinstance(body, Block) and len(body.stmts) == 1 and isinstance(body.stmts[0], For):
            out.append(body.stmts[0])
        else:
            return out


def _choose_root(chain, movable=None):
    """Move a loop with at least MIN_ROOT iterations outermost when the
    outermost has fewer (loops over independent outputs, ``movable``, may be
    reordered freely).  Returns the loop order; the body stays the innermost's."""
    first = chain[0]
    if _trips(first) >= MIN_ROOT:
        return chain
    for k, lp in enumerate(chain[1:], 1):
        if (movable is None or lp.var in movable) and _trips(lp) >= MIN_ROOT and \
                not _depends(stmt_exprs(lp), {x.var for x in chain[:k]}):
            return [lp] + chain[:k] + chain[k + 1:]
    return chain


def _assemble(chain, body=None):
    """Nest ``chain`` (outermost first), the outermost parallel, around
    ``body`` (default: the body of the last loop of ``chain``)."""
    body = chain[-1].body if body is None else body
    for d in reversed(range(len(chain))):
        lp = chain[d]
        loop = For(lp.var, lp.lo, lp.extent, body, "parallel" if d == 0 else "serial")
        body = loop if d == 0 else Block((loop,))
    return body


# --------------------------------------------------------------------- pass


def schedule_stage(stage: Stage, taken: set, new_buffers: list, bl: Blocking) -> list:
    """The scheduled form of one stage: a list of stages (packing copies first).
    ``taken`` holds the buffer names in use; new temporaries join ``new_buffers``."""
    nest = _nest(stage)
    if nest is None or any(isinstance(s, Simd) for s in _walk(stage.body)):
        return [stage]                   # not as lowered, or scheduled already
    split = _split_reduction(nest, stage, taken, new_buffers, bl)
    if split is not None:
        return split
    new_stages = []
    out = _schedule_nest(nest, stage, taken, new_stages, new_buffers, bl)
    packed = [s for st in new_stages for s in schedule_stage(st, taken, new_buffers, bl)]
    return packed + out


def _split_reduction(nest: _Nest, stage: Stage, taken: set, new_buffers: list, bl: Blocking):
    """A stage that reduces a large domain to one element (a loss) would run on
    one thread.  Its outermost reduction loop is cut into ``P`` equal parts,
    a fixed number that does not depend on the thread count: a first stage
    computes the ``P`` partial results in parallel (each in vector lanes,
    :func:`reduce_in_lanes`) into a temporary, a second combines them in
    order.  Every run and thread count adds the same numbers in the same
    order.  Returns the two stages or None."""
    if any(n != 1 for n in nest.extents):
        return None
    stmts = nest.body.stmts
    for k, s in enumerate(stmts):
        found = _perfect_nest(s)
        if found is None:
            continue
        loops, inner = found
        outer = loops[0]
        total = prod(lp.extent.value for lp in loops)
        parts = next((p for p in SPLIT_PARTS if outer.extent.value % p == 0), None)
        if parts is None or total < SPLIT_MIN_WORK:
            return None
        declared = {x.local for x in _walk(inner) if isinstance(x, Alloc)}
        writes = [x for x in _walk(inner) if isinstance(x, Assign) and x.local not in declared]
        if len(writes) != 1 or _combine(writes[0]) is None:
            return None
        acc, (op, _) = writes[0].local, _combine(writes[0])
        init = [x for x in stmts[:k] if isinstance(x, Alloc) and x.local is acc]
        if not init or not isinstance(init[0].init, Const) or any(
                isinstance(x, (Alloc, Assign)) and x.local is not acc for x in stmts[:k]):
            return None
        chunk = outer.extent.value // parts
        name, n = f"{stage.name}.parts", 1
        while name in taken:
            name, n = f"{stage.name}.parts{n}", n + 1
        taken.add(name)
        buf = Buffer(name, (parts,), acc.dtype, "temp")
        new_buffers.append(buf)
        p, r = var("p"), var(f"{outer.var.name}.c")
        part_loop = rename(For(r, _idx(0), _idx(chunk), outer.body, outer.kind),
                             {outer.var: add(add(mul(p, _idx(chunk)), outer.lo), r)})
        body = Block((init[0], part_loop, Store(buf, p, acc)))
        body = reduce_in_lanes(body, bl) or body
        first = Stage(name, buf, For(p, _idx(0), _idx(parts), body, "parallel"))
        q = var("q")
        combine = For(q, _idx(0), _idx(parts), Block((Assign(acc, _COMBINE[op](acc, BufLoad(buf, q))),)))
        rest = Block(tuple(stmts[:k]) + (combine,) + tuple(stmts[k + 1:]))
        second = Stage(stage.name, stage.buffer, _assemble(nest.loops[:-1] + [
            For(nest.loops[-1].var, nest.loops[-1].lo, nest.loops[-1].extent, rest)]))
        return [first, second]
    return None


def splits_reduction(extents) -> bool:
    """Whether :func:`_split_reduction` spreads a reduction to one element over ``extents`` across threads."""
    return prod(extents) >= SPLIT_MIN_WORK and any(extents[0] % p == 0 for p in SPLIT_PARTS)


def schedule(program: Program, target: Target) -> Program:
    """``program`` with every stage scheduled for ``target`` (see the module
    doc); a pure function."""
    bl = blocking(target)
    stages, new_buffers = [], []
    taken = {b.name for b in program.buffers}
    for st in program.stages:
        stages += schedule_stage(st, taken, new_buffers, bl)
    return Program(program.name, program.buffers + tuple(new_buffers), tuple(stages),
                   program.results, program.checks)
