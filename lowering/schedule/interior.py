"""Where the tests on a variable hold: the interior range of an output loop
on which every test term that reads it is true for all values of the loops
inside (a stencil's ``2 <= j`` and ``j <= n - 3``; a convolution's padding
test ``0 <= i + d - 2 < H`` for every tap ``d``), and a body with such
terms left out.  Two rules run the interior without its tests: the
interior split (``interior_split.py``) and row peeling (``row_peeling.py``).
"""
from __future__ import annotations

from te_autodiff.expr import Cmp, Logic, Var, sub

from ..loop_ir import Block, For, If, free_leaves, linear_form, walk
from .constructors import conjunction, flat


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


def drop_tests(s, tests):
    """``s`` with the test terms ``tests`` (known to hold) left out of its
    conditions; a test left with no term is replaced by its branch."""
    if isinstance(s, Block):
        return flat(drop_tests(x, tests) for x in s.stmts)
    if isinstance(s, For):
        return For(s.var, s.lo, s.extent, drop_tests(s.body, tests), s.kind)
    if not isinstance(s, If):
        return s
    then = drop_tests(s.then, tests)
    other = None if s.else_ is None else drop_tests(s.else_, tests)
    terms = [t for t in _conjuncts(s.cond) if t not in tests]
    if not terms:
        return then
    return If(conjunction(terms), then, other)
