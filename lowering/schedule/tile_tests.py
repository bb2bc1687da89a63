"""Tile tests: a test on a register tile's row and column that guards a
reduction (a causal mask's scores, ``j <= i ? sum_k Q K : -1e4``) makes
each element of the tile run its own reduction, since the jam repeats a
statement over every tile position its test reads.  Over a whole tile the
test is often one value: above the diagonal false, below it true.  The
tile then runs in one of three versions, chosen by a test that is the same
for every lane: the test true (the jammed product, shared loads), false
(the other branch alone: the masked half of a causal mask skips its
products) or the body as it is (the tiles the boundary crosses).

A test qualifies when it is an order comparison affine in the tile's row
and column variables, reading no loop variable or local of the element
(a padding test on a convolution's tap varies inside the tile), and guards
an ``If`` whose branches run a loop.  Its
least and greatest value over the tile are at corners of the tile's rows
and columns (the signs of the coefficients say which).  Each element keeps
its operations in every version, so the values are the same bits."""
from __future__ import annotations

from te_autodiff.expr import Cmp, compare, sub
from te_autodiff.visit import conjuncts

from ..bounds_check import NEGATED
from ..loop_ir import Block, For, If, Local, free_leaves, linear_form, simplify_index, substitute, walk
from .constructors import idx
from .interior import drop_tests

MAX_TESTS = 2                # tests decided per tile: each one triples the tile's code


def _tests(body, axes: set) -> list:
    """The order comparisons reading one of ``axes``, and no loop variable or
    local of ``body``, among the conditions of the ``If`` statements of
    ``body`` that guard a loop."""
    out, inside = {}, {s.var for s in walk(body) if isinstance(s, For)}
    for s in walk(body):
        if isinstance(s, If) and any(isinstance(x, For) for x in walk(s)):
            for t in conjuncts([s.cond]):
                form = linear_form(sub(t.a, t.b)) if isinstance(t, Cmp) and t.op in ("lt", "le", "gt", "ge") else None
                if form is not None and set(form[0]) & axes and not free_leaves(t) & inside \
                        and not any(isinstance(v, Local) for v in free_leaves(t)):
                    out[t] = None
    return list(out)


def _extreme(t, ranges: dict, least: bool):
    """``a - b`` of the test ``a op b`` at the corner of ``ranges`` (``{variable:
    (first, last)}``, expressions) where it is least (or greatest); None
    unless it is affine in those variables."""
    terms, _ = linear_form(sub(t.a, t.b))
    at = {}
    for v, k in terms.items():
        if v in ranges:
            at[v] = ranges[v][0] if (k > 0) == least else ranges[v][1]
        elif free_leaves(v) & set(ranges):
            return None
    return simplify_index(substitute(sub(t.a, t.b), at))


def _always(t, ranges: dict, value: bool):
    """A test that is true when ``t`` has ``value`` on every point of ``ranges``:
    ``a - b op 0`` everywhere when its least value (``ge``, ``gt``) or its
    greatest (``le``, ``lt``) does."""
    op = t.op if value else NEGATED[t.op]
    return compare(op, _extreme(t, ranges, op in ("gt", "ge")), idx(0))


def decided(body, ranges: dict, make, depth: int = 0):
    """The tile ``make(body)`` (``body`` the element body, ``ranges`` the
    tile's ``{variable: (first, last)}``) in versions for its first
    ``MAX_TESTS`` qualifying tests: true over the whole tile, false over it,
    or neither (see the module doc)."""
    tests = [t for t in _tests(body, set(ranges)) if _extreme(t, ranges, True) is not None]
    if not tests or depth == MAX_TESTS:
        return make(body)
    t = tests[0]
    versions = {value: decided(drop_tests(body, [(t, value)]), ranges, make, depth + 1) for value in (True, False)}
    return Block((If(_always(t, ranges, True), versions[True],
                     Block((If(_always(t, ranges, False), versions[False], make(body)),))),))
