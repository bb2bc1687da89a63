"""Dot-product tiles: ``C[i, j] = sum_k A[i, k] B[j, k]`` without copying
``B``, for operands too large to copy (the vector axis rule's
``PACK_MAX_BYTES``).  A tile of ``Blocking.dot_tile x dot_tile`` elements
shares one reduction loop (unroll and jam, as scalars: ``jam.py``), and that
loop runs in vector lanes along ``k``, where both operands are contiguous
(``lane_reduction.py``); each element's lanes are added pairwise at the
end.  ``dot_tile`` is the largest ``t`` whose ``t*t`` accumulators and
``2t`` operand vectors fit in the registers."""
from __future__ import annotations

from itertools import count

from te_autodiff.expr import add, var

from ..loop_ir import Block, If, walk
from . import parallel_root
from .blocking import Blocking
from .constructors import idx
from .jam import jam
from .lane_reduction import reduce_in_lanes
from .nest import Nest
from .tile_loops import tiled
from .vector_axis import VectorAxis


def decide(nest: Nest, axis: VectorAxis):
    """``(i, j)``: the rows and columns of the tiles, when the vector axis
    asks for dot-product tiles, ``j`` is not the outermost output loop
    (``i`` is the one outside it) and the element body has no tests; None
    otherwise."""
    if not axis.dot_tiles:
        return None
    k = nest.vars.index(axis.j)
    if k == 0 or any(isinstance(x, If) for x in walk(nest.body)):
        return None
    return nest.vars[k - 1], axis.j


def build(nest: Nest, plan, bl: Blocking):
    """The stage body: column tiles of row tiles of ``plan = (i, j)``, each
    tile's reduction in vector lanes, under a parallel root; None when some
    tile's reduction cannot run in lanes."""
    i, j = plan
    i_extent, j_extent = nest.extent(i), nest.extent(j)
    tags, failed = count(), []

    def tile(ib, n_rows, jb, n_cols):
        jammed = jam(nest.body, [{i: add(ib, idx(r)), j: add(jb, idx(c))}
                                 for r in range(n_rows) for c in range(n_cols)], tags)
        out = reduce_in_lanes(jammed, bl, min_trips=2 * bl.lanes(4))
        if out is None:
            failed.append(True)
            return jammed
        return out

    inner = tiled(j_extent, bl.dot_tile, var(f"{j.name}.o"), lambda jb, nc, _: Block((
        tiled(i_extent, bl.dot_tile, var(f"{i.name}.o"), lambda ib, nr_, _: tile(ib, nr_, jb, nc)),)))
    if failed:
        return None
    outer = [lp for lp in nest.loops if lp.var is not i and lp.var is not j]
    return parallel_root.build(outer, inner, bl.target.threads)
