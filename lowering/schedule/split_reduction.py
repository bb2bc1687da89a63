"""Split reductions to one element: a stage storing one value reduced over a
large domain (a loss) would run on one thread.  Its outermost reduction loop
is cut into a fixed number of equal parts (one of ``SPLIT_PARTS``, never the
thread count): a new stage computes the partial results in parallel (each
in vector lanes, ``lane_reduction.py``) into a temporary, and the stage
itself adds them in order.  Every run and thread count adds the same
numbers in the same order."""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from te_autodiff.expr import Const, add, mul, var

from ..loop_ir import Alloc, Assign, Block, BufLoad, For, Stage, Store, rename
from .blocking import Blocking
from .constructors import Temporaries, idx
from .lane_reduction import reduce_in_lanes
from .nest import COMBINE, Nest, accumulation, loop_nests, outer_writes

SPLIT_PARTS = (16, 12, 8, 6, 4, 2)   # parts of a large reduction to one element (a fixed number)
SPLIT_MIN_WORK = 1 << 16     # reductions to one element at least this long are split


@dataclass(frozen=True)
class Split:
    """The reduction nest at statement ``k`` of the element body: its outer
    loop ``outer`` is cut into ``parts``; ``init`` declares the accumulator
    it combines into with ``op``."""

    k: int
    outer: For
    parts: int
    init: Alloc
    op: str


def splits_reduction(extents) -> bool:
    """Whether the rule spreads a reduction to one element over ``extents`` across threads."""
    return prod(extents) >= SPLIT_MIN_WORK and any(extents[0] % p == 0 for p in SPLIT_PARTS)


def decide(nest: Nest):
    """The :class:`Split` of a stage storing one element whose first
    reduction loop nest is at least ``SPLIT_MIN_WORK`` long, its outer extent
    a multiple of one of ``SPLIT_PARTS``, and combines one accumulator
    declared with a constant; None otherwise."""
    if any(n != 1 for n in nest.extents):
        return None
    stmts = nest.body.stmts
    for k, loops, inner in loop_nests(nest.body):
        outer = loops[0]
        total = prod(lp.extent.value for lp in loops)
        parts = next((p for p in SPLIT_PARTS if outer.extent.value % p == 0), None)
        if parts is None or total < SPLIT_MIN_WORK:
            return None
        writes = outer_writes(inner)
        if len(writes) != 1 or accumulation(writes[0]) is None:
            return None
        acc, (op, _) = writes[0].local, accumulation(writes[0])
        init = [x for x in stmts[:k] if isinstance(x, Alloc) and x.local is acc]
        if not init or not isinstance(init[0].init, Const) or any(
                isinstance(x, (Alloc, Assign)) and x.local is not acc for x in stmts[:k]):
            return None
        return Split(k, outer, parts, init[0], op)
    return None


def build(nest: Nest, stage: Stage, plan: Split, temps: Temporaries, bl: Blocking) -> list:
    """The two stages: the parts of ``plan.outer`` computed in parallel into a
    temporary ``.parts``, then ``stage`` adding them in order."""
    outer, acc, stmts = plan.outer, plan.init.local, nest.body.stmts
    chunk = outer.extent.value // plan.parts
    buf = temps.new(f"{stage.name}.parts", (plan.parts,), acc.dtype)
    p, r = var("p"), var(f"{outer.var.name}.c")
    # the parts run outside the stage's output loops, each of extent one: their variables are 0 there
    part_loop = rename(For(r, idx(0), idx(chunk), outer.body, outer.kind),
                       {**{v: idx(0) for v in nest.vars}, outer.var: add(add(mul(p, idx(chunk)), outer.lo), r)})
    body = Block((plan.init, part_loop, Store(buf, p, acc)))
    body = reduce_in_lanes(body, bl) or body
    first = Stage(buf.name, buf, For(p, idx(0), idx(plan.parts), body, "parallel"))
    q = var("q")
    combine = For(q, idx(0), idx(plan.parts), Block((Assign(acc, COMBINE[plan.op](acc, BufLoad(buf, q))),)))
    rest = Block(tuple(stmts[:plan.k]) + (combine,) + tuple(stmts[plan.k + 1:]))
    return [first, Stage(stage.name, stage.buffer, nest.around(rest))]
