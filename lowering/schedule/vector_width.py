"""Vector width: how many lanes a vector loop takes.  One native vector of
the widest element it reads or writes (``Blocking.lanes``: 16 float32 on
AVX-512, 8 on AVX2), the last vector masked; then, for a vector loop that
neither runs a register tile nor transposes rows (the last tile rule,
:func:`decide`):

* a loop gathering from rows whose lines fall in one L1 set (rows 4 KiB
  apart) takes no more lanes than the set has ways
  (:func:`uncrowded_lanes`, ``Target.l1_ways``);
* a body applying exp, log, tanh... takes several vectors per step, as many
  chains as the register file holds (``Blocking.math_chains``) when a value
  passes through two such functions in turn or a reduction takes a float
  maximum built of several instructions, half as many through one function
  or a reduction re-reading data from cache (:func:`chained_lanes`:
  dependency chains side by side); the stages of a scan's step keep one
  vector.

Rows transposed in registers (``gather_blocks.py``, ``lane_reduction.py``)
take lanes covering a cache line (:func:`transposed_lanes`)."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np

from te_autodiff.dtype import is_float
from te_autodiff.expr import Const, Unary, Var
from te_autodiff.visit import topo_order

from ..fast_math import BODIES
from ..loop_ir import Alloc, Assign, Block, For, children, free_leaves, stmt_exprs, stride, walk
from .blocking import Blocking
from .nest import accumulation

TRANSPOSE_BODY = 4      # statements at most in a body the code generator emits once per lane


def lanes_for(accesses, bl: Blocking) -> int:
    """Lanes of a vector register for the widest element ``accesses`` read or write."""
    return bl.lanes(max([np.dtype(a.buffer.dtype).itemsize for a in accesses] + [4]))


def uncrowded_lanes(lanes: int, accesses, v: Var, bl: Blocking) -> int:
    """``lanes``, halved while the lines one gather or scatter along ``v``
    touches crowd a single L1 set past its ways.

    A lane of a gather reads its own cache line, ``stride`` bytes from the
    next lane's; the set of a line is its address modulo the way size
    (``l1_bytes / l1_ways``).  A stride that is a multiple of the way size
    (rows of 1024 float32 are 4 KiB apart) puts every lane in one set, and
    with more lanes than ways the lines evict each other before the
    neighbouring rows (``gather_blocks.py``) reread them."""
    t = bl.target
    line, sets = t.cache_line, max(1, t.l1_bytes // t.l1_ways // t.cache_line)
    for a in accesses:
        s = stride(a.index, v)
        if s in (0, 1, None):
            continue
        step = s * np.dtype(a.buffer.dtype).itemsize
        while lanes > 2 and _crowding(step, lanes, line, sets) > t.l1_ways:
            lanes //= 2
    return lanes


def _crowding(step: int, lanes: int, line: int, sets: int) -> int:
    """The most lines of one L1 set that ``lanes`` lanes ``step`` bytes apart
    touch (lanes sharing a line count once)."""
    return max(Counter(x % sets for x in {k * step // line for k in range(lanes)}).values())


def transposed_lanes(lanes: int, accesses, v: Var, inner: For | None, body, bl: Blocking) -> int | None:
    """The lanes of a vector loop along ``v`` whose gathers all read
    contiguously along ``inner``, the loop inside it: the code generator
    reads them as rows and transposes them in registers (loop kind
    ``transpose``), one load per lane and vector instead of one per element.
    None when there is no such gather, ``body`` (the innermost one) has
    more than ``TRANSPOSE_BODY`` statements or ``inner`` does not run whole
    vectors.

    The lanes cover a cache line of the widest element (two native vectors
    at most): a row load then uses the line it brings in, and so does each
    read contiguous along ``v``; with half a line, the other half waits in
    an L1 set that the rows ``inner`` steps through (often a power of two of
    bytes apart) keep evicting."""
    gathers = [a for a in accesses if stride(a.index, v) not in (0, 1)]
    stmts = [x for x in walk(body) if not isinstance(x, Block)]
    if inner is None or not gathers or len(stmts) > TRANSPOSE_BODY or any(
            stride(a.index, v) is None or stride(a.index, inner.var) != 1 or a.store for a in gathers):
        return None
    itemsize = max(np.dtype(a.buffer.dtype).itemsize for a in accesses)
    wide = max(lanes, min(bl.target.cache_line // itemsize, 2 * bl.lanes(itemsize)))
    return wide if isinstance(inner.extent, Const) and inner.extent.value % wide == 0 else None


def chained_lanes(lanes: int, body, extent: int, bl: Blocking, chain: int = 0) -> int:
    """The lanes of one step of a vector loop of ``extent`` iterations over
    ``body``: ``bl.math_chains`` vectors (the chains the register file
    holds) when a value of ``body`` passes through two functions of
    ``fast_math.py`` in turn (:func:`math_depth`), half as many when through
    one, and one vector otherwise (or when the loop is shorter than that).
    ``chain`` (0, 1 or 2) stands for that depth when each element's reduction
    is a chain of dependent steps that memory does not pace: 1 for an add
    re-reading cached data (:func:`cached_in_loops`), 2 for a float maximum
    that the target builds of several instructions (``Target.chained_minmax``:
    a step's ~5 dependent instructions take ~10 cycles, and each chain
    holds only its total, the vector read and a blend).

    Such a function is a chain of ~25 dependent instructions; a body applying
    three of them is ~180 instructions per vector, so the out-of-order window
    holds about one iteration and the chains' latency, not the arithmetic,
    sets the time.  LLVM splits a vector wider than a register into
    registers whose instructions alternate: the chains advance side by side.
    Through a single such function, more than half as many vectors ran
    slower when measured (the softmax cross-entropy's one exp).  A scan's
    step stages keep one vector (``Blocking.math_chains`` is 1 there): their
    slices are small, and wider steps cost more build time than they save."""
    depth = min(math_depth(body), 2) or chain
    chained = lanes * max(1, bl.math_chains >> (2 - depth)) if depth else lanes
    return chained if extent >= chained else lanes


def math_depth(body) -> int:
    """The most functions of ``fast_math.py`` one value of ``body`` passes
    through in turn (a local carries the depth of what it was given)."""
    depth = {}
    for x in walk(body):
        for e in topo_order(stmt_exprs(x), children):
            if e not in depth:
                depth[e] = max((depth[k] for k in children(e)), default=0) + \
                    (isinstance(e, Unary) and (e.op, e.dtype) in BODIES)
        if isinstance(x, (Alloc, Assign)) and stmt_exprs(x):
            depth[x.local] = depth[stmt_exprs(x)[0]]
    return max(depth.values(), default=0)


def reduction_chain(body, bl: Blocking, cached: bool = False) -> int:
    """:func:`chained_lanes`'s ``chain`` for a vector loop over ``body``: 2
    when the reduction its innermost loop steps combines by a float maximum
    or minimum that the target builds of several instructions (a row's
    maximum; not ``min_j`` of sums over an inner loop, whose steps are
    that loop's adds), 1 when it re-reads ``cached`` data, else 0."""
    loops = [x for x in walk(body) if isinstance(x, For)]
    innermost = [lp.body for lp in loops if not any(isinstance(y, For) for y in walk(lp.body))] or [body]
    combines = {accumulation(x)[0] for b in innermost for x in walk(b)
                if isinstance(x, Assign) and is_float(x.local.dtype) and accumulation(x) is not None}
    return 2 if bl.target.chained_minmax and combines & {"max", "min"} else int(cached)


def cached_in_loops(accesses, v: Var) -> bool:
    """Whether a load along the vector axis ``v`` stays put while one of the
    reduction loops around it runs (``P[e, i]`` in ``min_j Σ_e (C[j, e] -
    P[e, i])²``, read again from L1 for every ``j``)."""
    return any(not a.store and stride(a.index, v) != 0 and any(lp.var not in free_leaves(a.index) for lp in a.loops)
               for a in accesses)


def decide(plan, bl: Blocking):
    """``plan`` (a :class:`~lowering.schedule.tile_plan.TilePlan`) with the
    lanes of a vector loop that is neither a register tile's nor transposes
    rows: no more than the L1 sets allow, as many as its math chains take."""
    if plan.i is not None or plan.transpose:
        return plan
    lanes = uncrowded_lanes(plan.lanes, plan.accesses, plan.j, bl)
    chain = reduction_chain(plan.body, bl, cached_in_loops(plan.accesses, plan.j))
    return replace(plan, lanes=chained_lanes(lanes, plan.body, plan.j_extent, bl, chain))
