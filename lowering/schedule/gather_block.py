"""Rule 8, gather blocks: when the vector loop gathers (a transposed read),
the loop outside it is visited ``GATHER_BLOCK`` rows at a time inside each
column tile, so the cache lines a gather touches are reused by the
neighbouring rows."""
from __future__ import annotations

from te_autodiff.expr import Var

from ..loop_ir import stride
from .blocking import GATHER_BLOCK
from .nest import Nest


def gather_block(nest: Nest, j: Var, accesses, copied: set):
    """``(b, extent)``: the output loop just outside ``j`` to visit in blocks;
    None when the gathers are a small part of the accesses or there is no
    such loop.  Loads in ``copied`` (``(buffer, index)``) read a transposed
    copy with unit stride instead (rule 5)."""
    k = nest.vars.index(j)
    if k == 0:
        return None
    total = sum(a.weight for a in accesses)
    gathered = sum(a.weight for a in accesses
                   if stride(a.index, j) not in (0, 1) and (a.buffer, a.index) not in copied)
    b, n = nest.vars[k - 1], nest.extents[k - 1]
    if gathered * 4 < total or n <= GATHER_BLOCK // 2:
        return None
    return b, n
