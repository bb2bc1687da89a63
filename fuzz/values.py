"""What the generator's parts share (``programs.py``, ``forms.py``,
``large.py``): a value with its interval, the scope of an expression, and
the environment in which index expressions are evaluated on the grid."""
from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

import numpy as np

from .describe import IBin, IConst, Cmp, Logic, Var

MAX_ELEMENTS = 60       # per tensor (but a large program's)


@dataclass(frozen=True)
class V:
    """An expression and an interval containing its values."""
    e: object
    lo: float
    hi: float

    @property
    def mag(self):
        return max(abs(self.lo), abs(self.hi))


@dataclass
class Scope:
    """The variables an expression may use, in grid order, and the batch axis."""
    vars: list
    batch: Var | None
    prefer: tuple = ()          # reduce axes a read should use first

    @property
    def rank(self):
        return len(self.vars)

    def free(self):
        """Variables a non-batch index may use."""
        return [v for v in self.vars if v is not self.batch]


class Env:
    """What ``IExpr.bounds`` needs: the grid rank and the value ranges of index tensors."""

    def __init__(self, rank, values):
        self.rank, self.values = rank, values

    def grid(self, var):
        return var.grid(self.rank)


def hull(*vs):
    return min(v.lo for v in vs), max(v.hi for v in vs)


def plus(e, c: int):
    """Index expression ``e + c``, written ``e - |c|`` when ``c`` is negative."""
    return e if c == 0 else IBin("+", e, IConst(c)) if c > 0 else IBin("-", e, IConst(-c))


def exact(ix, env) -> np.ndarray:
    """The value of index expression ``ix`` (no key reads) at every grid point."""
    lo, hi = ix.bounds(env)
    assert np.array_equal(lo, hi), "an index expression with a key read has no exact value"
    return lo


_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "eq": np.equal, "ne": np.not_equal}


def holds(cond, env) -> np.ndarray:
    """Where a condition on index expressions (``Cmp``, ``Logic``) holds on the grid."""
    if isinstance(cond, Logic):
        parts = [holds(c, env) for c in cond.conds]
        if cond.op == "not":
            return ~parts[0]
        return reduce(np.logical_and if cond.op == "all" else np.logical_or, parts)
    assert isinstance(cond, Cmp)
    return _CMP[cond.op](exact(cond.a, env), exact(cond.b, env))
