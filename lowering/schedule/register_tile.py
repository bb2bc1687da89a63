"""Register tiles (unroll and jam): when the element body runs a reduction
whose bounds read neither the vector axis ``j`` nor a second output axis
``i``, and the reduction reads an operand that does not move with ``j`` (a
broadcast) and one that does not move with ``i``, a tile of ``MR`` values
of ``i`` by ``NR`` vectors of ``j`` is computed together: the reduction loop
is shared and its body repeated per tile element (``jam.py``), so the ``MR
x NR`` accumulators stay in vector registers, each vector load serves
``MR`` rows and each broadcast ``NR`` vectors.  A statement is repeated only
over the tile positions it depends on; remainder rows and columns get their
own, smaller tiles (``tile_loops.py`` builds them), so the rows per tile are
chosen for the whole extent (:func:`rows_per_tile`).  Among the candidates
for ``i``, one whose tests can be peeled (``row_peeling.py``) is preferred,
then one along which the broadcast loads move least: neighbouring rows
share cache lines (the output columns of a convolution, not its batch).
``MR`` and ``NR`` come from the register file (``blocking.py``)."""
from __future__ import annotations

from dataclasses import replace
from math import prod

from te_autodiff.expr import Var, var

from ..loop_ir import Block, For, map_stmt, stmt_exprs, stride, walk
from .blocking import TILE_VECTORS, Blocking
from .interior import interior
from .nest import Nest, accesses_of, depends, trips

GEMM_MIN_TRIPS = 8           # a reduction this long is worth register tiling
UNROLL_GUESS = 4             # times LLVM unrolls a short loop inside a tile (fully when shorter)


def gemm_rows(nest: Nest, body, j: Var, accesses, inner: dict, bl: Blocking):
    """The output variable to register-tile with ``j``, or None: the body must
    run a reduction whose bounds read neither, in which some load does not
    move with ``j`` (a broadcast) and some load does not move with it.
    Among the variables whose rows share the most vector loads, the first
    whose tests can be peeled off (:func:`~lowering.schedule.interior.interior`;
    a test on the row would be repeated for each row of a tile), then one
    with a full tile of rows, then the one along which the broadcast loads
    move least (adjacent rows read the same cache lines: the output columns
    of a convolution rather than its batch).  ``inner``: the ranges of the
    loops inside the body."""
    loops = [s for s in walk(body) if isinstance(s, For)]
    if not loops:
        return None
    steps = prod(trips(lp) for lp in loops if not depends(stmt_exprs(lp), {j}))
    if steps < GEMM_MIN_TRIPS:
        return None
    reads = [a for a in accesses if a.loops and not a.store]
    if not any(stride(a.index, j) == 0 for a in reads):
        return None
    best, best_key = None, None
    for v, n in zip(nest.vars, nest.extents):
        if v is j or n < 2 or any(depends(stmt_exprs(lp), {v, j}) for lp in loops):
            continue
        score = sum(a.weight for a in reads if stride(a.index, v) == 0 and stride(a.index, j) != 0)
        moves = [stride(a.index, v) for a in reads if stride(a.index, j) == 0 and stride(a.index, v) != 0]
        spread = max((float("inf") if m is None else abs(m) for m in moves), default=0)
        key = (score, interior(body, v, n, inner) is not None, min(n, bl.tile_rows), -spread)
        if score > 0 and (best_key is None or key > best_key):
            best, best_key = v, key
    return best


def roll_shared_broadcasts(body: Block, i: Var, j: Var, mr: int, nr: int, bl: Blocking) -> Block:
    """``body`` with the reduction loops LLVM must not unroll marked ``rolled``.

    A tile step holds ``mr x nr`` accumulators, ``nr`` vectors and one
    broadcast at a time (rows in order, :mod:`~lowering.schedule.tile_loops`).
    When a broadcast operand moves along a reduction loop by ``q`` rows
    (``X[x + kw]`` with rows ``x``: ``q = 1``), unrolling that loop ``t``
    times lets LLVM load each shared broadcast once and keep it: ``mr + (t -
    1) q`` broadcasts live at once.  Where those do not fit in the target's
    vector registers (AVX2's 16, not AVX-512's 32) they would be spilled on
    every step, so the loop stays rolled."""
    spare = bl.target.vector_registers - mr * nr - nr - mr
    rolled = set()
    for a in accesses_of(body):
        si = stride(a.index, i)
        if a.store or not a.loops or stride(a.index, j) != 0 or not si:
            continue
        for lp in a.loops:
            sk = stride(a.index, lp.var)
            if sk and sk % si == 0 and abs(sk // si) < mr and \
                    (min(trips(lp), UNROLL_GUESS) - 1) * abs(sk // si) > spare:
                rolled.add(lp.var)
    if not rolled:
        return body
    return map_stmt(body, lambda e: e, kind=lambda lp: "rolled" if lp.var in rolled else lp.kind)


def rows_per_tile(extent: int, most: int) -> int:
    """Rows per register tile for ``extent`` rows, tiles of at most ``most``:
    the fewest tiles (each costs a pass over the column operand and its
    accumulators' stores), then the fewest rows that keep their number, so
    the tiles are as even as they can be.  The last tile is the one that
    grows: with few rows its accumulators are too few independent chains to
    hide the multiply-add latency (AVX2's 6 x 2 tiles cut 14 rows as 5 + 5
    + 4, not 6 + 6 + 2)."""
    return -(-extent // -(-extent // most))


def decide(plan, nest: Nest, bl: Blocking):
    """``plan`` (a :class:`~lowering.schedule.tile_plan.TilePlan`) with a
    register tile over the rows :func:`gemm_rows` finds, its reduction loops
    that must stay rolled marked; unchanged when there is none."""
    i = gemm_rows(nest, plan.body, plan.j, plan.accesses, plan.inner, bl)
    if i is None:
        return plan
    i_extent = nest.extent(i)
    nr = min(TILE_VECTORS, -(-plan.j_extent // plan.lanes))
    mr = rows_per_tile(i_extent, bl.tile_rows)
    return replace(plan, body=roll_shared_broadcasts(plan.body, i, plan.j, mr, nr, bl), i=i, it=var(f"{i.name}.t"),
                   i_extent=i_extent, mr=mr, nr=nr)
