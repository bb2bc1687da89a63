"""GradBench ``lse``: LogSumExp with the max trick, and its gradient.

    a = max x,    LSE(x) = a + log sum_i exp(x_i - a)

written from its primitives (a max and a sum reduction, as the eval's
README asks), the scalar as a tensor of shape (1,); the gradient is
``te.gradient`` of it.
"""
from functools import lru_cache

import numpy as np

import te_autodiff as te

from ..function import applied, scalar, vector


def logsumexp(x: te.Tensor) -> te.Tensor:
    """LSE of a vector, shape (1,)."""
    n = x.shape[0]
    i = te.reduce_axis(n, name="i")
    a = te.compute((1,), lambda _: te.max(x[i], axis=i), name="a")
    a0 = a[0]
    j = te.reduce_axis(n, name="j")
    return te.compute((1,), lambda _: a0 + te.log(te.sum(te.exp(x[j] - a0), axis=j)), name="lse")


@lru_cache(maxsize=32)
def kernel(which: int, n: int):
    """The primal (``which`` 0) or gradient (1) kernel for vectors of ``n`` elements."""
    x = te.placeholder((n,), dtype="float64", name="x")
    y = logsumexp(x)
    dx, = te.gradient(y, [x])
    if which == 0:
        return te.build([x], [y], name="lse")
    return te.build([x], [dx], name="lse_gradient")


def _prepare(which):
    def pre(input):
        x = np.asarray(input["x"], dtype=np.float64)
        return kernel(which, x.shape[0]), x
    return pre


primal = applied(_prepare(0), scalar)
gradient = applied(_prepare(1), vector)
