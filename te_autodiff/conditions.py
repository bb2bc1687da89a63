"""Contradictory conditions: which pairs of conditions cannot hold together.

The smart constructors of ``expr.py`` ask :func:`contradict` so that
``c and not c`` folds to false and ``select(c, select(d, x, y), z)`` with
``c`` and ``d`` contradictory folds to ``select(c, y, z)``.  Derivatives
build such forms: the adjoint of a select's else branch, ``select(not t,
g, 0)``, guarded by a consumer's ``select(... and t, ..., 0)``.  Left in a
term, the zero survives only as a product ``NaN * 0`` would not respect,
and it hides the term's other guards from zero elimination, which then
sums over the whole domain.

Two conditions contradict when one is the negation of the other, or when
both compare the same affine function of integers and the sets of values
they allow are disjoint: every integer comparison ``a op b`` (or its
negation) is normalised to ``M in [lo, hi]`` or ``M != v``, with ``M`` the
affine form of ``a - b`` without its constant, divided by the gcd of its
coefficients and signed so that the same function always gives the same
``M`` (``i - 1 != -1``, ``not (i == 0)``, ``i >= 1`` and ``2 * i > 1`` all
speak of ``M = i``).  Anything else (float comparisons, reads of bool
tensors, disjunctions) contradicts only its own negation.
"""
from __future__ import annotations

import math
import weakref

from . import dtype as dt
from .expr import Cmp, Logic, open_affine
from .visit import conjuncts

_NEGATE = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}
_MIRROR = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}

#: steps :func:`_affine` takes at most (an index expression is small; a
#: shared DAG opened as a tree could be exponential)
MAX_STEPS = 64

_FORMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # condition -> (key, allowed) or None


def contradict(c, d) -> bool:
    """Whether the conditions ``c`` and ``d`` (each a conjunction, or a
    single condition) cannot both hold: a conjunct of one contradicts a
    conjunct of the other."""
    cs, ds = conjuncts([c]), conjuncts([d])
    if len(cs) * len(ds) > 4096:        # not worth it: contradictions come from short guards
        return False
    keyed = {}
    for x in cs:
        form = _form(x)
        if form is not None:
            keyed.setdefault(form[0], []).append(form[1])
    xs = set(cs)
    for y in ds:
        if isinstance(y, Logic) and y.op == "not" and y.a in xs:
            return True
        if any(isinstance(x, Logic) and x.op == "not" and x.a is y for x in cs):
            return True
        form = _form(y)
        if form is not None and any(_disjoint(s, form[1]) for s in keyed.get(form[0], ())):
            return True
    return False


def _form(c):
    """``(key, allowed)`` for an integer comparison or its negation: ``key``
    names the normalised affine function ``M`` and ``allowed`` is the set of
    its values where ``c`` holds, ``("in", lo, hi)`` (None: unbounded) or
    ``("ne", v)``; None for any other condition."""
    if c in _FORMS:
        return _FORMS[c]
    form = None
    negated = isinstance(c, Logic) and c.op == "not"
    cmp = c.a if negated else c
    if isinstance(cmp, Cmp) and dt.is_int(cmp.a.dtype) and dt.is_int(cmp.b.dtype):
        form = _normalised(_NEGATE[cmp.op] if negated else cmp.op, cmp.a, cmp.b)
    _FORMS[c] = form
    return form


def _normalised(op, a, b):
    fa, fb = _affine(a), _affine(b)
    if fa is None or fb is None:
        return None
    terms = dict(fa[0])
    for x, k in fb[0].items():
        terms[x] = terms.get(x, 0) - k
    terms = {x: k for x, k in terms.items() if k}
    if not terms:
        return None
    k = fa[1] - fb[1]                   # the comparison is  Σ terms + k  op  0
    if terms[min(terms, key=id)] < 0:   # the same sign for the same function
        terms, k, op = {x: -c for x, c in terms.items()}, -k, _MIRROR[op]
    g = math.gcd(*terms.values())
    key = frozenset((x, c // g) for x, c in terms.items())
    # g * M + k  op  0
    if op == "eq":
        allowed = ("in", -k // g, -k // g) if k % g == 0 else ("in", 1, 0)
    elif op == "ne":
        allowed = ("ne", -k // g) if k % g == 0 else ("in", None, None)
    elif op == "ge":
        allowed = ("in", -(k // g), None)               # M >= ceil(-k / g)
    elif op == "gt":
        allowed = ("in", -((k - 1) // g), None)         # M >= ceil((1 - k) / g)
    elif op == "le":
        allowed = ("in", None, -k // g)                 # M <= floor(-k / g)
    else:
        allowed = ("in", None, (-k - 1) // g)           # M <= floor((-k - 1) / g)
    return key, allowed


def _affine(e):
    """``({atom: coefficient}, constant)`` with ``e`` their sum: sums,
    differences, negations and products by constants opened, anything else
    (a variable, ``x // c``, a read, a cast) an atom; None past
    :data:`MAX_STEPS`."""
    terms = {}
    k = open_affine([(e, 1)], terms, MAX_STEPS)
    return None if k is None else (terms, k)


def _disjoint(s, t) -> bool:
    """Whether the value sets ``s`` and ``t`` of :func:`_form` share no integer."""
    if s[0] == "ne" and t[0] == "ne":
        return False
    if s[0] == "ne":
        s, t = t, s
    _, lo, hi = s
    if lo is not None and hi is not None and lo > hi:
        return True
    if t[0] == "ne":
        return lo is not None and lo == hi == t[1]
    _, lo2, hi2 = t
    if lo2 is not None and hi2 is not None and lo2 > hi2:
        return True
    low = max((v for v in (lo, lo2) if v is not None), default=None)
    high = min((v for v in (hi, hi2) if v is not None), default=None)
    return low is not None and high is not None and low > high
