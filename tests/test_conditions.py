"""Contradictory conditions (``te_autodiff/conditions.py``) against brute force.

``te.all(c, d)`` folds to false, and ``select(c, select(d, x, y), z)`` to
``select(c, y, z)``, when ``c`` and ``d`` contradict.  Each example draws
two integer comparisons of affine functions of two index variables, written
in any of the forms a program or a derivative produces (either side, a
constant on both sides, scaled, negated with ``te.not_``), and evaluates
them at every point of a box:

* sound: whenever they fold, no point satisfies both;
* complete on comparisons of one function (the second a multiple of the
  first, shifted): they fold exactly when no point satisfies both.  The
  box holds a witness of every such pair that has one (its constants are
  small), so "no point in the box" means "no integer point".
"""
from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

import te_autodiff as te
from te_autodiff.expr import Const, Select, is_const, select, var

OPS = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "eq": operator.eq,
       "ne": operator.ne}
NEGATE = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}
MIRROR = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
I, J = var("i"), var("j")
BOX = range(-30, 31)


@dataclass(frozen=True)
class Comparison:
    """``a·i + b·j + c  op  0``, written ``a·i + b·j + c + shift  op  shift``
    (or mirrored: the constant left, the function right), negated when
    ``negated`` (``te.not_`` of the opposite comparison)."""
    a: int
    b: int
    c: int
    op: str
    shift: int
    mirrored: bool
    negated: bool

    def holds(self, i, j) -> bool:
        return OPS[self.op](self.a * i + self.b * j + self.c, 0)

    def te(self):
        f = I * self.a + J * self.b + (self.c + self.shift)
        op = NEGATE[self.op] if self.negated else self.op
        cond = te_compare(MIRROR[op], self.shift, f) if self.mirrored else te_compare(op, f, self.shift)
        return te.not_(cond) if self.negated else cond


def te_compare(op, x, y):
    return {"lt": lambda: x < y, "le": lambda: x <= y, "gt": lambda: x > y, "ge": lambda: x >= y,
            "eq": lambda: te.equal(x, y), "ne": lambda: te.not_equal(x, y)}[op]()


def comparisons(a=st.integers(-3, 3), b=st.integers(-3, 3)):
    return st.builds(Comparison, a, b, st.integers(-8, 8), st.sampled_from(sorted(OPS)), st.integers(-3, 3),
                     st.booleans(), st.booleans())


@st.composite
def same_function_pairs(draw):
    """Two comparisons of ``m·(a·i + b·j)`` plus constants, ``m`` a small non-zero multiple."""
    first = draw(comparisons(st.integers(-3, 3).filter(bool)))
    m = draw(st.sampled_from([-3, -2, -1, 1, 2, 3]))
    second = draw(comparisons(st.just(m * first.a), st.just(m * first.b)))
    return first, second


def folds(c, d) -> bool:
    both = te.all(c.te(), d.te())
    return is_const(both) and both.value is False


def satisfiable(c, d) -> bool:
    return any(c.holds(i, j) and d.holds(i, j) for i, j in itertools.product(BOX, BOX))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(comparisons(), comparisons())
def test_folded_conditions_have_no_common_point(c, d):
    if folds(c, d):
        assert not satisfiable(c, d), (c, d)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(same_function_pairs())
def test_comparisons_of_one_function_fold_exactly_when_disjoint(pair):
    c, d = pair
    assert folds(c, d) == (not satisfiable(c, d)), (c, d)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(same_function_pairs())
def test_a_select_under_a_contradicting_condition_takes_its_other_branch(pair):
    c, d = pair
    x, y, z = te.const(1.0, "float64"), te.const(2.0, "float64"), te.const(3.0, "float64")
    inner = select(d.te(), x, y)
    outer = select(c.te(), inner, z)
    if satisfiable(c, d):
        assert isinstance(outer, Select) and outer.a is inner
    else:
        assert isinstance(outer, Select) and outer.a is y or isinstance(outer, Const)


def test_a_condition_and_its_negation():
    X = te.placeholder((4,), "float64", "X")
    t = X[I] > 0.0                  # a float comparison: only its own negation contradicts it
    assert te.all(t, te.not_(t)).value is False
    assert te.all(te.not_(t), X[I] >= 1.0, t).value is False
    assert not is_const(te.all(t, X[I] <= 0.0))
