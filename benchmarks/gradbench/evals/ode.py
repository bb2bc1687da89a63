"""GradBench ``ode``: cmpad's ``an_ode`` solved by s steps of classical
Runge-Kutta on [0, 2], and the gradient of the last component of the
solution.

    y_0' = x_0,   y_i' = x_i y_{i-1}  (i > 0),   y(0) = 0

This is the system GradBench's validator (its C++ reference and cmpad)
integrates; the eval's README prints the second line as
``sum_{j=1}^i x_j y_{i-1}``, which neither computes. The steps are a
``te.scan`` whose update is the chain k1 ... k4 of one RK4 step; the
gradient is ``te.gradient`` of ``y_{n-1}(2)``, a reverse scan.
"""
from functools import lru_cache

import numpy as np

import te_autodiff as te

from ..function import applied, vector


def solve(x: te.Tensor, s: int) -> te.Tensor:
    """The state after every step, shape (s + 1, n): row 0 is y(0) = 0, row s is y(2)."""
    n = x.shape[0]
    h = 2.0 / s
    y = te.placeholder((s + 1, n), dtype="float64", name="y")

    def f(t, i, z):
        """The right-hand side at component i, the state z(t, i) being y_prev + ..."""
        return te.if_then_else(i > 0, x[i] * z(t, i - 1), x[i])

    k1 = te.compute((s + 1, n), lambda t, i: f(t, i, lambda t, j: y[t - 1, j]), name="k1")
    k2 = te.compute((s + 1, n), lambda t, i: f(t, i, lambda t, j: y[t - 1, j] + h / 2 * k1[t, j]), name="k2")
    k3 = te.compute((s + 1, n), lambda t, i: f(t, i, lambda t, j: y[t - 1, j] + h / 2 * k2[t, j]), name="k3")
    k4 = te.compute((s + 1, n), lambda t, i: f(t, i, lambda t, j: y[t - 1, j] + h * k3[t, j]), name="k4")
    step = te.compute((s + 1, n), lambda t, i: y[t - 1, i] + h / 6 * (k1[t, i] + 2.0 * k2[t, i]
                                                                       + 2.0 * k3[t, i] + k4[t, i]), name="step")
    y0 = te.compute((1, n), lambda _, i: te.const(0.0, "float64"), name="y0")
    return te.scan(y0, step, y, inputs=[x], name="ys")


@lru_cache(maxsize=16)
def kernel(which: int, n: int, s: int):
    """The primal (``which`` 0) or gradient (1) kernel for ``n`` components and ``s`` steps."""
    x = te.placeholder((n,), dtype="float64", name="x")
    ys = solve(x, s)
    yf = te.compute((n,), lambda i: ys[s, i], name="y_final")
    last = te.compute((1,), lambda _: ys[s, n - 1], name="y_last")
    dx, = te.gradient(last, [x])
    if which == 0:
        return te.build([x], [yf], name="ode")
    return te.build([x], [dx], name="ode_gradient")


def _prepare(which):
    def pre(input):
        x = np.asarray(input["x"], dtype=np.float64)
        return kernel(which, x.shape[0], int(input["s"])), x
    return pre


primal = applied(_prepare(0), vector)
gradient = applied(_prepare(1), vector)
