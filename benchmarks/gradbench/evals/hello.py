"""GradBench ``hello``: ``square`` is f(x) = x², ``double`` its gradient 2x.

The input is one number; te's scalars are tensors of shape (1,).
"""
from functools import lru_cache

import numpy as np

import te_autodiff as te

from ..function import function, scalar


@lru_cache(maxsize=None)
def kernel(which: int):
    """``square`` (``which`` 0) or its gradient ``double`` (1), built once."""
    x = te.placeholder((1,), dtype="float64", name="x")
    y = te.compute((1,), lambda i: x[i] * x[i], name="square")
    dx, = te.gradient(y, [x])
    if which == 0:
        return te.build([x], [y], name="square")
    return te.build([x], [dx], name="double")


def _input(value):
    return np.array([value], dtype=np.float64)


@function(pre=lambda value: (kernel(0), _input(value)), post=scalar)
def square(prepared):
    kernel, x = prepared
    return kernel(x)


@function(pre=lambda value: (kernel(1), _input(value)), post=scalar)
def double(prepared):
    kernel, x = prepared
    return kernel(x)
