"""Interior split: in a stage whose element body runs no loop, tests that
read the innermost output loop ``j`` and are decided on an interior range
of it (a stencil's gradient tests ``j >= 2`` and ``j <= n - 3`` around its
reads, true there; a first element's case ``j <= 0``, false there) split
the stage into three stages over ``j``: border, interior without the
tests, border, each scheduled from the first rule.  The interior's ends are
on aligned boundaries (whole vectors from an aligned start).  Run as one
stage, every vector of the loop computes its tests and reads under masks
(on AVX2, ten instructions per read); each element keeps its operations, so
the values are the same bits."""
from __future__ import annotations

from dataclasses import dataclass, replace

from te_autodiff.expr import add, var

from ..loop_ir import Buffer, For, Stage, map_stmt, substituter, walk
from ..target import Target
from .constructors import idx
from .interior import drop_tests, interior
from .nest import Nest


@dataclass(frozen=True)
class Interior:
    """On ``lo <= j < hi`` of the innermost output loop each test term of
    ``tests`` (pairs ``(term, value)``) has its value."""

    lo: int
    hi: int
    tests: tuple


def decide(nest: Nest, out: Buffer, target: Target):
    """The :class:`Interior` of a stage (storing into ``out``) whose element
    body runs no loop: ``lo`` and ``hi`` multiples of the target's alignment
    in elements, the interior at least as long as the borders; None when
    there is none."""
    align = target.alignment // out.itemsize
    j, extent = nest.vars[-1], nest.extents[-1]
    if any(isinstance(s, For) for s in walk(nest.body)):
        return None
    found = interior(nest.body, j, extent, {})
    if found is None or not found[2]:
        return None
    lo = -(-max(found[0], 0) // align) * align
    hi = min(found[1], extent) // align * align
    if hi - lo < max(align, extent - (hi - lo)):
        return None
    return Interior(lo, hi, found[2])


def build(nest: Nest, stage: Stage, plan: Interior) -> list:
    """``stage`` over ``j < lo``, ``lo <= j < hi`` without the tests, and ``hi
    <= j``, named ``.border0``, ``.interior``, ``.border1``; each loop counts
    from 0 (``j = first + j'``)."""
    lo, hi = plan.lo, plan.hi
    j, extent = nest.vars[-1], nest.extents[-1]
    parts = (("border0", "b", 0, lo, nest.body), ("interior", "i", lo, hi - lo, drop_tests(nest.body, plan.tests)),
             ("border1", "c", hi, extent - hi, nest.body))
    out = []
    for name, short, first, n, body in parts:
        if n == 0:
            continue
        jj = var(f"{j.name}.{short}")
        body = map_stmt(body, substituter({j: add(jj, idx(first))}))
        loops = nest.loops[:-1] + [For(jj, idx(0), idx(n), body, nest.loops[-1].kind)]
        out.append(replace(stage, name=f"{stage.name}.{name}", body=Nest(loops, body).around(body)))
    return out
