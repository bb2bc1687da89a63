"""Sum chains: a float sum's accumulator is a chain of dependent additions,
one per multiply-add latency, so a tile that keeps fewer accumulators than
the multiply-add units can have in flight (latency times units,
``throughput.ACCUMULATORS``) waits on its own sums: a weight gradient whose
few outputs each sum a whole image (a depthwise convolution's ``dW`` along
its 3 taps, one vector), a matrix-vector product's one row.  Its innermost
reduction loop then feeds ``k`` partial sums in turn, each a chain of its
own: ``k`` is the chains missing, the tile's accumulators times ``k`` about
the units' capacity.  The partial sums start at zero, run through the whole
reduction (the loops around the innermost one included) and are added to
the accumulator, in a fixed order, where the reduction ends.

Neighbouring outputs come first: a vector loop running alone (a column
sum ``db[j] = Σ_i dh[i, j]``) takes up to ``k`` vectors of its row side
by side, each its own chain with its sums in the written order, and each
step reads a run of the row instead of one vector per row in turn (a
partial sum per row: rows apart in memory, each line read twice when two
vectors share it); partial sums make up the chains still missing.

Each element's sum is reassociated the same way whatever its position in
the tile (the body is changed before it is jammed), so every element of the
stage is summed alike.  Not applied where the element body compares floats
or takes a float max or min, or a stage doing so reads the sum's buffer:
what is compared is computed as written
(``codegen_llvm.emitter.ordered_nodes``), so that a comparison recomputed
in another stage or kernel decides alike; nor where the summand computes
with the step number itself, whose powers become one running product
along the loop (``powers.py``); nor with K blocks, whose blocks resume from
the stored partial sum in the written order."""
from __future__ import annotations

from dataclasses import replace
from math import prod

from te_autodiff import dtype as dt
from te_autodiff.expr import BinOp, Cmp, Const, add, const, mul, var

from ..loop_ir import (Alloc, Assign, Block, BufLoad, For, GuardedLoad, If, Local, children, free_leaves, nodes_in,
                       rename, stage_buffers, stmt_exprs, walk)
from ..throughput import ACCUMULATORS
from .constructors import as_block, flat, idx
from .nest import accumulation, innermost_reduction
from .parallel_root import BALANCED, balance


def _compares_floats(body) -> bool:
    """Whether ``body`` compares floats or takes a float max or min."""
    seen = set()
    return any(isinstance(e, Cmp) and dt.is_float(e.a.dtype)
               or isinstance(e, BinOp) and e.op in ("max", "min") and dt.is_float(e.dtype)
               for s in walk(body) for e in nodes_in(stmt_exprs(s), seen, (Cmp, BinOp)))


def _computes_with(e, v) -> bool:
    """Whether ``e`` reads the variable ``v`` other than in a memory index."""
    stack, seen = [e], set()
    while stack:
        x = stack.pop()
        if x is v:
            return True
        if id(x) not in seen:
            seen.add(id(x))
            stack += [x.cond] if isinstance(x, GuardedLoad) else [] if isinstance(x, BufLoad) else children(x)
    return False


def chains(plan, bl) -> int:
    """The partial sums per accumulator of ``plan``'s element body (1: none):
    a tile's accumulators are its rows times its vectors, each of
    ``plan.lanes`` lanes (several registers where the vector width rule
    widened the loop)."""
    red = innermost_reduction(plan.body)
    if red is None or plan.k_blocks is not None or not isinstance(red.extent, Const):
        return 1
    stmts = as_block(red.body).stmts
    if len(stmts) != 1 or not isinstance(stmts[0], Assign) or not dt.is_float(stmts[0].local.dtype):
        return 1
    form = accumulation(stmts[0])
    if form is None or form[0] != "add" or _compares_floats(plan.body) or _computes_with(form[1], red.var):
        return 1
    registers = max(1, plan.lanes // bl.lanes(dt.numpy_dtype(stmts[0].local.dtype).itemsize))
    k = -(-ACCUMULATORS // (plan.mr * plan.nr * registers))
    return k if 1 < k <= red.extent.value else 1


def _split(red: For, acc: Local, partials: list) -> Block:
    """``red`` (``acc = acc + e(r)``) as a loop over rounds of ``k`` steps,
    step ``t`` of a round into ``partials[t]`` (``acc`` itself first), and
    the steps left over into ``acc``."""
    k, n = len(partials), red.extent.value
    rounds = var(f"{red.var.name}.k")

    def at(step, into):
        return rename(red.body, {red.var: add(red.lo, step), acc: into})
    body = flat(at(add(mul(rounds, idx(k)), idx(t)), p) for t, p in enumerate(partials))
    return flat([For(rounds, idx(0), idx(n // k), body, red.kind)] + [at(idx(n // k * k + t), acc)
                                                                     for t in range(n % k)])


def _contains(s, red) -> bool:
    return any(x is red for x in walk(s))


def _placed(s, red: For, acc: Local, k: int):
    """Statement ``s`` with the reduction ``red`` into ``acc`` run as ``k``
    chains: the partial sums declared in the block that declares ``acc``,
    before the statement holding ``red``, and added to ``acc`` after it;
    None when that statement reads or writes ``acc`` elsewhere (the sum is
    only complete after it)."""
    if isinstance(s, (For, If)):
        parts = [("body", s.body)] if isinstance(s, For) else [("then", s.then), ("else_", s.else_)]
        name, part = next((n, b) for n, b in parts if b is not None and _contains(b, red))
        inner = _placed(part, red, acc, k)
        return None if inner is None else replace(s, **{name: inner})
    stmts = list(s.stmts)
    at = next(i for i, x in enumerate(stmts) if _contains(x, red))
    if not any(isinstance(x, Alloc) and x.local is acc for x in stmts[:at]):
        inner = _placed(stmts[at], red, acc, k)
        return None if inner is None else flat(stmts[:at] + [inner] + stmts[at + 1:])
    step = as_block(red.body).stmts[0]
    if any(acc in free_leaves(e) or isinstance(x, Assign) and x.local is acc
           for x in walk(stmts[at]) if x is not step for e in stmt_exprs(x)):
        return None
    partials = [Local(f"{acc.name}.p{t}", acc.dtype) for t in range(1, k)]
    total = partials[0]
    for p in partials[1:]:
        total = add(total, p)
    return flat(stmts[:at] + [Alloc(p, const(0, acc.dtype)) for p in partials]
                + [_swap(stmts[at], red, _split(red, acc, [acc] + partials)), Assign(acc, add(acc, total))]
                + stmts[at + 1:])


def _swap(s, old, new):
    """Statement ``s`` with its statement ``old`` replaced by ``new``."""
    if s is old:
        return new
    if isinstance(s, Block):
        return flat(_swap(x, old, new) for x in s.stmts)
    if isinstance(s, For):
        return replace(s, body=_swap(s.body, old, new))
    if isinstance(s, If):
        return replace(s, then=_swap(s.then, old, new), else_=None if s.else_ is None else _swap(s.else_, old, new))
    return s


def compared(stages) -> frozenset:
    """The buffers that stages comparing floats (or taking a float max or
    min) read: a sum stored there keeps its written order, as the same sum
    recomputed where it is compared does (a relu's ``Z > 0`` in a gradient
    kernel must decide as the forward kernel's did)."""
    return frozenset(b for st in stages if _compares_floats(st.body) for b in stage_buffers(st)[1])


def _side_by_side(plan, k: int, others: int, threads: int):
    """``plan`` with a vector loop up to ``k`` times as wide (a power of two)
    where it runs alone: no register tile, no rows transposed or visited in
    blocks.  The row must split into whole wide vectors (a partial last one
    would run mostly masked lanes), and the column tiles times ``others``
    (the other output loops' iterations) must still keep the threads
    ``BALANCED`` (``parallel_root.py``)."""
    if plan.i is not None or plan.transpose or plan.gather is not None:
        return plan
    wide = 1
    while wide * 2 <= k and plan.j_extent % (plan.lanes * wide * 2) == 0 and \
            balance([1] * (others * plan.j_extent // (plan.lanes * wide * 2)), threads) >= BALANCED:
        wide *= 2
    return plan if wide == 1 else replace(plan, lanes=plan.lanes * wide)


def decide(plan, nest, bl, exact: bool = False):
    """``plan`` with the sums of neighbouring outputs side by side
    (:func:`_side_by_side`), then its element body's innermost sum run as
    :func:`chains` partial sums; the partial sums not when one chain is
    enough or the stage's values are compared (``exact``: its buffer is
    among :func:`compared`)."""
    k = chains(plan, bl)
    if k == 1:
        return plan
    plan = _side_by_side(plan, k, prod(lp.extent.value for lp in plan.untiled(nest)), bl.target.threads)
    k = 1 if exact else chains(plan, bl)
    if k == 1:
        return plan
    red = innermost_reduction(plan.body)
    body = _placed(plan.body, red, as_block(red.body).stmts[0].local, k)
    return plan if body is None else replace(plan, body=body)
