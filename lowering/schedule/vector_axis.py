"""Rule 3, the vector axis: which iterations of a stage run in vector lanes.
Each output axis is scored by the element body's memory accesses, weighted
by how often they run, plus the cost of its transposed copies (rule 5); the
innermost reduction is scored the same way.  The decision is a
:class:`VectorAxis`."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from math import prod

import numpy as np

from te_autodiff.expr import Const, Unary, Var
from te_autodiff.visit import topo_order

from ..fast_math import FAST_MATH, FAST_MATH_F64
from ..loop_ir import Alloc, Assign, Block, For, children, free_leaves, stmt_exprs, stride, walk
from .blocking import PACK_MAX_BYTES, Blocking
from .nest import Nest, accesses_of, accumulation, innermost_reduction
from .packing import transposed_copies


@dataclass(frozen=True)
class VectorAxis:
    """Rule 3's decision.  ``j``: the output axis whose iterations become
    vector lanes, or None when each element's reduction runs in lanes (a
    stage storing one element, a row reduction such as a softmax
    denominator).  ``copies``: the transposed copies along ``j`` (rule 5);
    ``dot_tiles``: they are larger than ``PACK_MAX_BYTES``, so dot-product
    tiles (vector lanes along the reduction) are tried first."""

    j: Var | None
    copies: tuple = ()
    dot_tiles: bool = False


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
    neighbouring rows (rule 8) reread them.  On the AMD EPYC (Zen 4,
    AVX-512, 8 ways) the strided benchmark kernel's two gathering stages ran
    0.48 + 0.59 ms with 16 lanes and 0.27 + 0.36 ms with 8; with rows of 1000
    or 1040 elements 16 lanes were as fast as 8."""
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


TRANSPOSE_BODY = 4      # statements at most in a body the code generator emits once per lane


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
    bytes apart) keep evicting.  The strided benchmark kernel's loss stage
    (B[i, j] = A[2j + 1, i] against a head H, numpy's 16-byte aligned
    arrays), on the AMD EPYC Zen 4: gathers 0.27 ms (AVX2) and 0.41 ms
    (AVX-512, 8 lanes); rows transposed in 8 lanes 0.33 and 0.33; in 16
    lanes 0.24 and 0.23."""
    gathers = [a for a in accesses if stride(a.index, v) not in (0, 1)]
    stmts = [x for x in walk(body) if not isinstance(x, Block)]
    if inner is None or not gathers or len(stmts) > TRANSPOSE_BODY or any(
            stride(a.index, v) is None or stride(a.index, inner.var) != 1 or a.store for a in gathers):
        return None
    itemsize = max(np.dtype(a.buffer.dtype).itemsize for a in accesses)
    wide = max(lanes, min(bl.target.cache_line // itemsize, 2 * bl.lanes(itemsize)))
    return wide if isinstance(inner.extent, Const) and inner.extent.value % wide == 0 else None


def _crowding(step: int, lanes: int, line: int, sets: int) -> int:
    """The most lines of one L1 set that ``lanes`` lanes ``step`` bytes apart
    touch (lanes sharing a line count once)."""
    return max(Counter(x % sets for x in {k * step // line for k in range(lanes)}).values())


def chained_lanes(lanes: int, body, extent: int, bl: Blocking) -> int:
    """The lanes of one step of a vector loop of ``extent`` iterations over
    ``body``: ``bl.math_chains`` vectors (the chains the register file
    holds) when a value of ``body`` passes through two functions of
    ``fast_math.py`` in turn (:func:`math_depth`), half as many when through
    one, and one vector otherwise (or when the loop is shorter than that).

    Such a function is a chain of ~25 dependent instructions; a body applying
    three of them is ~180 instructions per vector, so the out-of-order window
    holds about one iteration and the chains' latency, not the arithmetic,
    sets the time.  LLVM splits a vector wider than a register into
    registers whose instructions alternate: the chains advance side by side.
    On the AMD EPYC (Zen 3) the elementwise benchmark kernel ran 1.66 -> 1.23 ms
    with AVX2 (3.42 -> 2.57 ms on one thread) and 5.06 -> 4.05 ms built for
    SSE (x86-64-v2) with two vectors; the softmax cross-entropy, whose exp
    share is smaller, 1-3%.  Its tanh of a sigmoid is a chain twice as long:
    on the AMD EPYC Zen 4, four vectors took 0.95 -> 0.75 ms built for AVX2,
    0.58 -> 0.49 with AVX-512 and 2.63 -> 2.38 for SSE, where the softmax's
    single exp ran 7% slower with four (AVX2).  With AVX-512's 32 registers
    the chains fill them at eight and four vectors: on the AMD EPYC Zen 5
    (alternating processes) the elementwise kernel ran 0.220-0.232 ->
    0.200-0.231 ms with eight rather than four, the softmax cross-entropy
    0.078-0.080 -> 0.073-0.077 with four rather than two, the MLP and the
    float64 seed no slower (sixteen, past the registers: 0.26 ms).  A
    scan's step stages keep one vector: their slices are small, and the
    LSTM benchmark kernel built 0.25 s slower for 2% less run time."""
    depth = min(math_depth(body), 2)
    chained = lanes * max(1, bl.math_chains >> (2 - depth)) if depth else lanes
    return chained if extent >= chained else lanes


def math_depth(body) -> int:
    """The most functions of ``fast_math.py`` one value of ``body`` passes
    through in turn (a local carries the depth of what it was given)."""
    math = set(FAST_MATH) | set(FAST_MATH_F64)
    depth = {}
    for x in walk(body):
        for e in topo_order(stmt_exprs(x), children):
            if e not in depth:
                depth[e] = max((depth[k] for k in children(e)), default=0) + \
                    (isinstance(e, Unary) and e.op in math)
        if isinstance(x, (Alloc, Assign)) and stmt_exprs(x):
            depth[x.local] = depth[stmt_exprs(x)[0]]
    return max(depth.values(), default=0)


def vector_cost(accesses, v, lanes, extent) -> float:
    """Estimated cost per element of running ``v``'s iterations in vector
    lanes: an index that does not move with ``v`` is a broadcast (nearly
    free), one that moves by one element a vector access (1), any other a
    gather (one per lane) or a scatter (two per lane); one more when a test
    around the access differs between lanes (masked work).  Inside a loop
    whose range differs between lanes (the matches of an inverse index)
    every access is a masked gather or scatter."""
    if extent < 2:
        return float("inf")
    used = extent / (-(-extent // lanes) * lanes)
    total = 0.0
    for a in accesses:
        s = None if any(v in free_leaves(lp.lo) | free_leaves(lp.extent) for lp in a.loops) \
            else stride(a.index, v)
        total += a.weight * (0.1 if s == 0 else 1.0 if s == 1 else 2 * lanes if a.store else lanes)
        total += a.weight if s is None else 0
        total += a.weight if v in a.tested else 0     # a test that differs between lanes: masked work
    return total / (lanes * used)


def _plain(loop: For) -> bool:
    """Whether LLVM's loop vectoriser can take ``loop``: its body only
    combines one accumulator (``acc = acc + e``: no tests, no second local)."""
    stmts = loop.body.stmts if isinstance(loop.body, Block) else (loop.body,)
    return all(isinstance(x, Alloc) or (isinstance(x, Assign) and accumulation(x) is not None) for x in stmts) \
        and sum(isinstance(x, Assign) for x in stmts) == 1


def _axis_cost(nest: Nest, accesses, v: Var, extent: int, lanes: int, copies) -> float:
    """:func:`vector_cost` of output axis ``v`` when ``copies`` are made: a
    copied load reads its copy with unit stride, and the copy moves each
    element once (about one gather lane each), per output element."""
    packed = {id(c.access) for c in copies}
    cost = vector_cost([a if id(a) not in packed else replace(a, index=v, store=False) for a in accesses],
                       v, lanes, extent)
    return cost + sum(prod(n for _, _, n in c.box) for c in copies) / prod(nest.extents)


def _row_reduction(body, accesses, lanes: int, best: float) -> bool:
    """Whether the innermost reduction, in vector lanes, costs less than half
    the best output axis ``best`` (a reduction LLVM could vectorise, as a
    row reduction)."""
    red = innermost_reduction(body)
    if red is None or red.kind != "serial" or not isinstance(red.extent, Const) or not _plain(red):
        return False
    inner = [a for a in accesses if red in a.loops]
    return vector_cost(inner, red.var, lanes, red.extent.value) < best * 0.5


def vector_axis(nest: Nest, bl: Blocking) -> VectorAxis | None:
    """Rule 3's decision for ``nest``; None when no iteration can use the
    lanes (a stage without elements)."""
    accesses = accesses_of(nest.body)
    lanes = lanes_for(accesses, bl)
    copies = {v: transposed_copies(nest, v, accesses) for v in nest.vars}
    costs = {v: _axis_cost(nest, accesses, v, n, lanes, copies[v]) for v, n in zip(nest.vars, nest.extents)}
    j = min(reversed(nest.vars), key=lambda v: costs[v])
    if costs[j] == float("inf"):          # a stage storing one element
        return None if any(n != 1 for n in nest.extents) else VectorAxis(None)
    if _row_reduction(nest.body, accesses, lanes, costs[j]):
        return VectorAxis(None)
    large = sum(c.access.buffer.nbytes for c in copies[j]) > PACK_MAX_BYTES
    return VectorAxis(j, tuple(copies[j]), bool(copies[j]) and large)
