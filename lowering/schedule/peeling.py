"""Peeling: tests that read an output loop's variable hold on an interior
range of it, which then runs without them.

* Rule 0b, the innermost loop of an element-wise stage (a stencil's
  gradient tests ``2 <= i`` and ``i <= n - 3`` around its reads): the stage
  is split into three stages over that loop's range, border, interior
  (without the tests) and border, the interior's ends on aligned
  boundaries.  Run as one stage, every vector of the loop computes its
  tests and reads under masks (on AVX2, ten instructions per read).
* Rule 6b, the row variable of a register tile (padding, ``0 <= i + d - 2 <
  H`` for every tap ``d``): the row range is cut into border, interior
  (whole tiles, without those tests) and border.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from te_autodiff.expr import Cmp, Logic, Var, add, sub, var

from ..loop_ir import Block, For, If, Stage, free_leaves, linear_form, map_stmt, substituter, walk
from .ir import conjunction, flat, idx
from .nest import Nest


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


def interior(body, i: Var, inner: dict):
    """``(lo, hi, tests)`` for a row variable ``i`` that tests in ``body``
    read: on ``lo <= i < hi`` every test term that reads ``i`` holds for all
    values of the inner loops (a convolution's padding tests on the output
    column: true away from the borders).  ``(0, 0, ())`` when no test reads
    ``i``; None when some test term that reads it cannot be bounded."""
    lo, hi, tests = -(1 << 62), 1 << 62, []
    for x in walk(body):
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
        return flat(_drop_tests(x, tests) for x in s.stmts)
    if isinstance(s, For):
        return For(s.var, s.lo, s.extent, _drop_tests(s.body, tests), s.kind)
    if not isinstance(s, If):
        return s
    then = _drop_tests(s.then, tests)
    other = None if s.else_ is None else _drop_tests(s.else_, tests)
    terms = [t for t in _conjuncts(s.cond) if t not in tests]
    if not terms:
        return then
    return If(conjunction(terms), then, other)


@dataclass(frozen=True)
class Peel:
    """Rule 6b's plan: on rows ``lo <= i < hi`` (whole tiles) the test terms
    ``tests`` always hold."""

    lo: int
    hi: int
    tests: tuple

    def segments(self, extent: int, body) -> list:
        """The row range ``0..extent`` as ``[(first, length, element body)]``:
        border, interior (``body`` without the tests), border."""
        segments = [(0, self.lo, body), (self.lo, self.hi - self.lo, _drop_tests(body, self.tests)),
                    (self.hi, extent - self.hi, body)]
        return [seg for seg in segments if seg[1] > 0]


def peel(extent: int, mr: int, body, i: Var, inner: dict):
    """The :class:`Peel` of the row range of a register-tiled stage with
    ``extent`` rows in tiles of ``mr``: the interior, where the tests on the
    row variable (padding) always hold, runs without them; the borders keep
    them (a test on the row would otherwise be repeated for each row of a
    tile).  None when there is no interior of a full tile."""
    found = interior(body, i, inner)
    if found is None or not found[2]:
        return None
    lo, hi = max(found[0], 0), min(found[1], extent)
    if hi - lo < mr:
        return None
    return Peel(lo, lo + (hi - lo) // mr * mr, found[2])      # whole tiles; the rest joins the border


def interior_split(nest: Nest, align: int):
    """Rule 0b's plan for a stage whose element body runs no loop: ``(lo, hi,
    tests)``, the interior ``lo <= j < hi`` of the innermost output loop
    ``j`` where the tests that read ``j`` hold (``lo`` and ``hi`` multiples
    of ``align`` elements), at least as long as the borders; None when there
    is none."""
    j, extent = nest.vars[-1], nest.extents[-1]
    if any(isinstance(s, For) for s in walk(nest.body)):
        return None
    found = interior(nest.body, j, {})
    if found is None or not found[2]:
        return None
    lo = -(-max(found[0], 0) // align) * align
    hi = min(found[1], extent) // align * align
    if hi - lo < max(align, extent - (hi - lo)):
        return None
    return lo, hi, found[2]


def split_interior(nest: Nest, stage: Stage, plan) -> list:
    """The stages of rule 0b: ``stage`` over ``j < lo``, ``lo <= j < hi``
    without the tests, and ``hi <= j``, named ``.border0``, ``.interior``,
    ``.border1``; each loop counts from 0 (``j = first + j'``)."""
    lo, hi, tests = plan
    j, extent = nest.vars[-1], nest.extents[-1]
    parts = (("border0", "b", 0, lo, nest.body), ("interior", "i", lo, hi - lo, _drop_tests(nest.body, tests)),
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
