"""Reductions in vector lanes: each lane combines its own share of a
reduction in order, the lanes are combined pairwise at the end
(:func:`reduce_in_lanes`: a fixed reassociation that depends on the shapes,
the same for every run and thread count).  The build of the vector axis
rule when each element's reduction wins the lanes (:func:`build`: a row
reduction such as a softmax denominator, a stage storing one element; a
reduction shorter than a vector takes half a vector or more); the split
reduction's parts (``split_reduction.py``) run theirs so too.

With loops over rows inside the lanes' loop, its vectors start where the
lines of the input read along it start, found at run time
(``aligned_grid.py``); gathers that read contiguously along the innermost
of those loops are read as rows and transposed in registers
(:func:`~lowering.schedule.vector_width.transposed_lanes`).  Without
gathers, a row's whole vectors are added in turn, the rows around them:
the input is read in address order, where vectors of one column walked
down every row of a thread's share re-read lines from L3 or memory once
per column of vectors (a loss over a large product's output).  A sum over
nested loops adds runs of at least ``RUN_MIN`` vectors (the fewest
innermost loops that make one) into its lanes' totals."""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from te_autodiff.expr import Const, Var, add, compare, floordiv, mul, sub, var

from ..loop_ir import Alloc, Assign, Block, For, If, LaneReduce, Local, Simd, Stage, rename, stride, walk
from . import parallel_root
from .aligned_grid import ALIGN_MIN_VECTORS, grid_shift
from .blocking import Blocking, pow2_floor
from .constructors import as_block, idx
from .nest import COMBINE, Nest, accesses_of, accumulation, loop_nests, outer_writes, trips
from .vector_axis import vector_cost
from .vector_width import chained_lanes, lanes_for, reduction_chain, transposed_lanes, uncrowded_lanes

SUM_RUN = 64                 # a lane adds this many terms on their own before its running total
RUN_MIN = 16                 # a sum over nested loops adds runs of at least this many vectors into its total


@dataclass(frozen=True)
class _LanePlan:
    """A reduction to run in lanes: the loop nest at statement ``k`` of the
    body, ``inner`` its innermost body, ``accs`` its accumulators ``(local,
    op, identity)``; ``loop`` runs in ``lanes`` lanes, the ``rest`` of the
    loops inside it (innermost last); ``gathers``: a load's index moves
    along ``loop`` by other than 0 or 1 element per step."""

    k: int
    inner: object
    accs: tuple
    loop: For
    rest: tuple
    lanes: int
    gathers: bool


def _accumulators(stmts, k: int, inner):
    """``(local, op, identity)`` of each accumulator the loop nest at statement
    ``k`` combines into (``acc = acc op e`` in its innermost body ``inner``,
    ``acc`` declared before it with a constant); None when the nest is not
    such a reduction."""
    inner_stmts = inner.stmts if isinstance(inner, Block) else (inner,)
    writes = outer_writes(inner)
    if not writes or any(x not in inner_stmts for x in writes) or \
            len({x.local for x in writes}) != len(writes):
        return None
    accs = []
    for w in writes:
        comb = accumulation(w)
        init = [x for x in stmts[:k] if isinstance(x, Alloc) and x.local is w.local]
        if comb is None or not init or not isinstance(init[0].init, Const):
            return None
        accs.append((w.local, comb[0], init[0].init))
    if any(isinstance(x, (For, Simd)) for x in walk(inner)):
        return None
    return tuple(accs)


def _lane_plan(body: Block, bl: Blocking):
    """The :class:`_LanePlan` of the first reduction loop nest of ``body``:
    the lanes run over the loop along which the reads are most contiguous,
    the loop along which the remaining gathers move least is innermost.
    A loop shorter than a native vector takes the widest power of two of
    lanes it fills, down to half a vector (rows of 14 on AVX-512: 8 lanes).
    None when no nest qualifies or its best loop is too short."""
    for k, loops, inner in loop_nests(body):
        accs = _accumulators(body.stmts, k, inner)
        if accs is None:
            continue
        accesses = accesses_of(inner)
        native = lanes_for(accesses, bl)
        costs = {lp.var: vector_cost(accesses, lp.var, native, lp.extent.value) for lp in loops}
        loop = min(reversed(loops), key=lambda lp: costs[lp.var])
        lanes = min(native, pow2_floor(loop.extent.value))
        if costs[loop.var] == float("inf") or lanes * 2 < native:
            return None
        lanes = chained_lanes(uncrowded_lanes(lanes, accesses, loop.var, bl), inner, loop.extent.value, bl,
                              reduction_chain(inner, bl))
        gathers = [a for a in accesses if stride(a.index, loop.var) not in (0, 1)]
        rest = sorted((lp for lp in loops if lp is not loop),      # the gathers move least innermost
                      key=lambda lp: -sum(abs(stride(a.index, lp.var) or 1 << 20) * a.weight for a in gathers))
        wide = transposed_lanes(lanes, accesses, loop.var, rest[-1] if rest else None, inner, bl)
        if wide is not None and loop.extent.value >= wide:
            rest[-1] = replace(rest[-1], kind="transpose")
            lanes = wide
        return _LanePlan(k, inner, accs, loop, tuple(rest), lanes, bool(gathers))
    return None


def _around(loops, body):
    """``body`` inside copies of ``loops`` (outermost first)."""
    for lp in reversed(loops):
        body = For(lp.var, lp.lo, lp.extent, as_block(body), lp.kind)
    return body


def _allocs(accs, locals_) -> tuple:
    return tuple(Alloc(locals_[acc], ident) for acc, _, ident in accs)


def _steps(p: _LanePlan, lane: Var, grid: tuple):
    """``(first, chain)``: the reduction index a lane starts from and the loops
    over the whole vectors (``grid``: ``(start, count)``), in runs of
    ``SUM_RUN`` vectors when the loop is long and alone (the rounding error
    grows with a run, not the total); with other loops, the vectors'
    loop outermost when gathers read the lines those loops walk, else
    innermost."""
    v, lanes = p.loop, p.lanes
    start, full = grid
    if not p.rest and isinstance(full, Const) and full.value >= 8 * SUM_RUN and full.value % SUM_RUN == 0:
        outer_b, inner_b = var(f"{v.var.name}.bo"), var(f"{v.var.name}.bi")
        first = add(start, add(mul(add(mul(outer_b, idx(SUM_RUN)), inner_b), idx(lanes)), lane))
        return first, [For(outer_b, idx(0), idx(full.value // SUM_RUN), None),
                       For(inner_b, idx(0), idx(SUM_RUN), None)]
    block = For(var(f"{v.var.name}.b"), idx(0), full, None)
    first = add(start, add(mul(block.var, idx(lanes)), lane))
    if p.gathers:
        return first, [block] + list(p.rest)
    return first, list(p.rest) + [block]        # no gathers: each row's vectors in turn, in address order


def _whole_vectors(p: _LanePlan, lane: Var, parts: dict, grid: tuple):
    """The loops over the whole vectors of the reduction, adding into the lane
    partials ``parts``; a sum over nested loops adds each run of its
    innermost loops (``RUN_MIN`` vectors or more) into a running total first."""
    first, chain = _steps(p, lane, grid)
    k = len(chain) - 1                           # the run: the fewest innermost loops of RUN_MIN steps or more
    while k > 1 and prod(map(trips, chain[k:])) < RUN_MIN:
        k -= 1
    if all(op == "add" for _, op, _ in p.accs) and k >= 1 and prod(map(trips, chain[k:])) >= RUN_MIN:
        runs = {acc: Local(f"{acc.name}.run", acc.dtype) for acc, _, _ in p.accs}
        body = Block(_allocs(p.accs, runs) + (_around(chain[k:], rename(p.inner, {p.loop.var: first, **runs})),) +
                     tuple(Assign(parts[acc], add(parts[acc], runs[acc])) for acc, _, _ in p.accs))
        return _around(chain[:k], body)
    return _around(chain, rename(p.inner, {p.loop.var: first, **parts}))


def _lanes_loop(p: _LanePlan, lane: Var, n_lanes, body, parts: dict) -> Simd:
    """A vector loop of ``n_lanes`` active lanes running ``body`` into the lane
    partials ``parts``, then combining them into the accumulators."""
    return Simd(lane, idx(0), p.lanes, n_lanes, Block(_allocs(p.accs, parts) + (body,) + tuple(
        Assign(acc, COMBINE[op](acc, LaneReduce(op, parts[acc], ident))) for acc, op, ident in p.accs)))


def reduce_in_lanes(body: Block, bl: Blocking):
    """Spread the iterations of the first reduction loop nest of ``body`` over
    vector lanes: each lane combines its own share in order into its own
    partial value per accumulator, the lanes are combined pairwise at the
    end and the leftover iterations after that.  This reassociates the
    reduction in a fixed way (the same for every run and thread count).  The
    lanes run over the reduction loop along which the reads are most
    contiguous; the loop along which the remaining gathers move least is put
    innermost, so the lines a gather touches are reused, and without
    gathers the lanes' whole vectors are innermost (address order); a long
    sum is added up in runs (the rounding error grows with a run, not the
    total).
    With loops inside the lanes' loop, its whole vectors start where the
    lines of the input read along it start (a run-time shift,
    :func:`~lowering.schedule.aligned_grid.grid_shift`), the iterations
    before and after them in masked lanes.  Returns the new body or None
    when no loop nest qualifies."""
    p = _lane_plan(body, bl)
    if p is None:
        return None
    v, n, w = p.loop, p.loop.extent.value, p.lanes
    lane = var(f"{v.var.name}.l")
    parts = {acc: Local(f"{acc.name}.lanes", acc.dtype) for acc, _, _ in p.accs}
    shift = None if not p.rest or n < ALIGN_MIN_VECTORS * w or not isinstance(v.lo, Const) else grid_shift(
        accesses_of(p.inner), v.var, v.lo.value, w, bl.target.cache_line)
    if shift is None:
        grid, leftovers = (v.lo, idx(n // w)), [(add(v.lo, idx(n // w * w)), idx(n % w))] if n % w else []
    else:
        full = floordiv(sub(idx(n), shift), idx(w))
        after = add(shift, mul(full, idx(w)))
        grid = (add(v.lo, shift), full)
        leftovers = [(v.lo, shift), (add(v.lo, after), sub(idx(n), after))]
    out = [_lanes_loop(p, lane, idx(w), _whole_vectors(p, lane, parts, grid), parts)]
    for start, count in leftovers:       # the leftover iterations, in masked lanes, after the rest
        loop = _lanes_loop(p, lane, count, _around(p.rest, rename(p.inner, {v.var: add(start, lane), **parts})), parts)
        out.append(loop if isinstance(count, Const) else If(compare("gt", count, idx(0)), Block((loop,))))
    return Block(tuple(body.stmts[:p.k]) + tuple(out) + tuple(body.stmts[p.k + 1:]))


def build(nest: Nest, stage: Stage, bl: Blocking) -> list:
    """``[stage]`` with each element's reduction in vector lanes
    (:func:`reduce_in_lanes`), its output loops ordered for a parallel root
    (``parallel_root.py``: a batch of one must not leave the rows to one
    thread); unchanged when no reduction qualifies."""
    body = reduce_in_lanes(nest.body, bl)
    return [stage] if body is None else \
        [Stage(stage.name, stage.buffer, parallel_root.build(nest.loops, body, bl.target.threads))]
