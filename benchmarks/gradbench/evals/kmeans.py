"""GradBench ``kmeans``: the k-means cost and the Newton direction J / H.

    f(P, C) = sum_i min_j |C_j - P_i|²

``cost`` is f; ``dir`` is the gradient J of f with respect to the centroids
C divided elementwise by the diagonal of the Hessian H, which is the
gradient of J (head of ones: H is diagonal, so that is its diagonal).
"""
from functools import lru_cache

import numpy as np

import te_autodiff as te

from ..function import function, scalar, vector


def objective(points: te.Tensor, centroids: te.Tensor) -> te.Tensor:
    """f(P, C), shape (1,)."""
    n, d = points.shape
    k = centroids.shape[0]
    e = te.reduce_axis(d, name="e")

    def sq(i, j):
        diff = centroids[j, e] - points[i, e]
        return diff * diff

    dist = te.compute((n, k), lambda i, j: te.sum(sq(i, j), axis=e), name="dist")
    j = te.reduce_axis(k, name="j")
    closest = te.compute((n,), lambda i: te.min(dist[i, j], axis=j), name="closest")
    i = te.reduce_axis(n, name="i")
    return te.compute((1,), lambda _: te.sum(closest[i], axis=i), name="cost")


@lru_cache(maxsize=32)
def kernel(which: int, n: int, k: int, d: int):
    """The cost (``which`` 0) or dir (1) kernel for ``n`` points, ``k`` centroids in ``d`` dimensions."""
    P = te.placeholder((n, d), dtype="float64", name="points")
    C = te.placeholder((k, d), dtype="float64", name="centroids")
    f = objective(P, C)
    J, = te.gradient(f, [C])
    H, = te.gradient(J, [C])
    direction = te.compute((k, d), lambda j, e: J[j, e] / H[j, e], name="dir")
    if which == 0:
        return te.build([P, C], [f], name="kmeans_cost")
    return te.build([P, C], [direction], name="kmeans_dir")


def _prepare(which):
    def pre(input):
        P = np.asarray(input["points"], dtype=np.float64)
        C = np.asarray(input["centroids"], dtype=np.float64)
        return kernel(which, P.shape[0], C.shape[0], P.shape[1]), P, C
    return pre


@function(pre=_prepare(0), post=scalar)
def cost(prepared):
    kernel, P, C = prepared
    return kernel(P, C)


@function(pre=_prepare(1), post=vector)
def dir(prepared):  # noqa: A001 - GradBench's name
    kernel, P, C = prepared
    return kernel(P, C)

