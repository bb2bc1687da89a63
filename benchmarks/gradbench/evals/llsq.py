"""GradBench ``llsq``: the linear least squares objective of cmpad, and its gradient.

    t_i = -1 + i * 2 / (n - 1),   s_i = sign(t_i),
    y(x) = 1/2 sum_i (s_i - sum_j x_j t_i^j)²

written as GradBench's README states it: ``s_i`` as ``te.sign`` and
``t_i^j`` as ``te.power`` with the index ``j`` as its exponent (the
lowering makes that a running product along ``j`` where ``j`` is a
sequential loop, multiplications elsewhere); ``n`` is part of the input,
``m`` the length of ``x``.
"""
from functools import lru_cache

import numpy as np

import te_autodiff as te

from ..function import applied, scalar, vector


def objective(x: te.Tensor, n: int) -> te.Tensor:
    """y(x), shape (1,)."""
    m = x.shape[0]
    t = te.compute((n,), lambda i: -1.0 + i.astype("float64") * 2.0 / (n - 1), name="t")
    s = te.compute((n,), lambda i: te.sign(t[i]), name="s")
    j = te.reduce_axis(m, name="j")
    r = te.compute((n,), lambda i: s[i] - te.sum(x[j] * te.power(t[i], j.astype("float64")), axis=j), name="r")
    i = te.reduce_axis(n, name="i")
    return te.compute((1,), lambda _: te.sum(r[i] * r[i], axis=i) / 2.0, name="y")


@lru_cache(maxsize=32)
def kernel(which: int, m: int, n: int):
    """The primal (``which`` 0) or gradient (1) kernel for ``m`` coefficients and ``n`` points."""
    x = te.placeholder((m,), dtype="float64", name="x")
    y = objective(x, n)
    dx, = te.gradient(y, [x])
    if which == 0:
        return te.build([x], [y], name="llsq")
    return te.build([x], [dx], name="llsq_gradient")


def _prepare(which):
    def pre(input):
        x = np.asarray(input["x"], dtype=np.float64)
        return kernel(which, x.shape[0], int(input["n"])), x
    return pre


primal = applied(_prepare(0), scalar)
gradient = applied(_prepare(1), vector)
