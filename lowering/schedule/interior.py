"""Where the tests on a variable are decided: the interior range of an
output loop on which every test term that reads it has one value for all
values of the loops inside (a stencil's ``2 <= j`` and ``j <= n - 3``, a
convolution's padding test ``0 <= i + d - 2 < H`` for every tap ``d``: true
there; a first element's ``j <= 0``: false), and a body with those terms
replaced by their values.  Two rules run the interior without its tests:
the interior split (``interior_split.py``) and row peeling
(``row_peeling.py``).
"""
from __future__ import annotations

from te_autodiff.expr import Cmp, Const, Logic, Var, const, sub

from ..loop_ir import (Block, BufLoad, For, GuardedLoad, If, free_leaves, linear_form, map_stmt, nodes_in,
                       stmt_exprs, substituter, walk)
from .constructors import flat


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


_NEGATION = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt"}


def _tests(body, i: Var):
    """``(guards, others)``: the test terms of the ``If`` conditions in
    ``body`` that read ``i``, and the order comparisons reading ``i``
    anywhere else (a select's or a guarded read's condition)."""
    guards, others, seen = {}, {}, set()
    for x in walk(body):
        if isinstance(x, If) and i in free_leaves(x.cond):
            guards.update(dict.fromkeys(t for t in _conjuncts(x.cond) if i in free_leaves(t)))
        others.update(dict.fromkeys(e for e in nodes_in(stmt_exprs(x), seen, Cmp)
                                    if e.op in _NEGATION and i in free_leaves(e)))
    return list(guards), [t for t in others if t not in guards]


def interior(body, i: Var, extent: int, inner: dict):
    """``(lo, hi, tests)`` for a row variable ``i`` of ``extent`` values that
    tests in ``body`` read: on ``lo <= i < hi`` each test term in ``tests``
    (pairs ``(term, value)``) has that value for all values of the inner
    loops (a convolution's padding tests on the output column: true away
    from the borders; the ``i <= 0`` of a first-element case: false).  A
    term is decided the way it goes on more of ``0 <= i < extent``; an
    order comparison a select or a guarded read makes is decided when it
    can be.  ``(0, 0, ())`` when no test reads ``i``; None when an ``If``'s
    test term that reads it cannot be bounded."""
    lo, hi, tests = -(1 << 62), 1 << 62, []
    guards, others = _tests(body, i)
    for t in guards + others:
        spans = [_holds_from(t, i, inner)]
        if t.op in _NEGATION:
            spans.append(_holds_from(Cmp(_NEGATION[t.op], t.a, t.b), i, inner))
        if spans[0] is None:
            if t in guards:
                return None
            continue
        cover = [max(0, min(hi_, extent) - max(lo_, 0)) for lo_, hi_ in spans]
        value = cover[0] >= cover[-1]
        span = spans[0] if value else spans[1]
        lo, hi = max(lo, span[0]), min(hi, span[1])
        tests.append((t, value))
    return (lo, hi, tuple(tests)) if tests else (0, 0, ())


def _settled_load(e):
    """A guarded read whose condition is decided: the read, or zero."""
    if isinstance(e, GuardedLoad) and isinstance(e.cond, Const):
        return BufLoad(e.buffer, e.index) if e.cond.value else const(0, e.dtype)
    return e


def _settled(s):
    """``s`` with each ``If`` whose condition is a constant replaced by its branch."""
    if isinstance(s, Block):
        return flat(_settled(x) for x in s.stmts)
    if isinstance(s, For):
        return For(s.var, s.lo, s.extent, _settled(s.body), s.kind)
    if not isinstance(s, If):
        return s
    then, other = _settled(s.then), None if s.else_ is None else _settled(s.else_)
    if isinstance(s.cond, Const):
        return then if s.cond.value else other or Block(())
    return If(s.cond, then, other)


def drop_tests(s, tests):
    """``s`` with the test terms of ``tests`` (pairs ``(term, value)``, known
    to have that value) replaced by their values and folded away."""
    values = {t: const(v, "bool") for t, v in tests}
    return _settled(map_stmt(s, substituter(values, load=_settled_load)))
