"""GradBench ``gmm``: the log posterior of a Gaussian mixture with a Wishart
prior on the precision matrices, and its gradient.

As the eval's README writes it (its "Implementation" section):

    Q_k      lower triangular: exp(q_k) on the diagonal, l_k below it, column by column
    beta_ik  = alpha_k - 1/2 |Q_k (x_i - mu_k)|² + sum_j q_kj
    log p(X) = -N (D/2 log 2 pi + logsumexp(alpha)) + sum_i logsumexp(beta_i)
    log p(θ) = K (n D log(γ/√2) - log Γ_D(n/2)) - γ²/2 sum_k |Q_k|_F² + m sum_k sum_j q_kj

with n = D + m + 1. The packed lower triangle is read at its quadratic
index, ``l[k, c*(2*D-c-1)//2 + r-c-1]`` for c < r; logsumexp is the max
trick; the constant log Γ_D is computed once in Python. ``jacobian`` is
``te.gradient`` of the objective with respect to alpha, mu, q and l.
"""
import math
from functools import lru_cache

import numpy as np

import te_autodiff as te

from ..function import function, scalar


def log_posterior(alpha, mu, q, l, x, m: int, gamma: float) -> te.Tensor:
    """F_X(θ, φ), shape (1,)."""
    N, D = x.shape
    K = alpha.shape[0]
    n = D + m + 1

    def Q_entry(k, r, c):
        packed = c * (2 * D - c - 1) // 2 + r - c - 1
        return te.if_then_else(c < r, l[k, packed], te.if_then_else(te.equal(c, r), te.exp(q[k, c]), 0.0))

    Q = te.compute((K, D, D), Q_entry, name="Q")
    jq = te.reduce_axis(D, name="jq")
    sum_q = te.compute((K,), lambda k: te.sum(q[k, jq], axis=jq), name="sum_q")
    c = te.reduce_axis(D, name="c")
    Qx = te.compute((N, K, D), lambda i, k, r: te.sum(Q[k, r, c] * (x[i, c] - mu[k, c]), axis=c), name="Qx")
    r = te.reduce_axis(D, name="r")
    beta = te.compute((N, K), lambda i, k: alpha[k] - 0.5 * te.sum(Qx[i, k, r] * Qx[i, k, r], axis=r) + sum_q[k],
                      name="beta")

    kb = te.reduce_axis(K, name="kb")
    beta_max = te.compute((N,), lambda i: te.max(beta[i, kb], axis=kb), name="beta_max")
    kb2 = te.reduce_axis(K, name="kb2")
    lse_beta = te.compute((N,), lambda i: beta_max[i] + te.log(te.sum(te.exp(beta[i, kb2] - beta_max[i]), axis=kb2)),
                          name="lse_beta")
    ka = te.reduce_axis(K, name="ka")
    alpha_max = te.compute((1,), lambda _: te.max(alpha[ka], axis=ka), name="alpha_max")
    ka2 = te.reduce_axis(K, name="ka2")
    lse_alpha = te.compute((1,), lambda _: alpha_max[0] + te.log(te.sum(te.exp(alpha[ka2] - alpha_max[0]), axis=ka2)),
                           name="lse_alpha")

    log_gamma_D = D * (D - 1) / 4 * math.log(math.pi) + sum(math.lgamma(n / 2 + (1 - j) / 2) for j in range(1, D + 1))
    prior_const = K * (n * D * math.log(gamma / math.sqrt(2)) - log_gamma_D)
    i = te.reduce_axis(N, name="i")
    fk, fr, fc = (te.reduce_axis(K, name="fk"), te.reduce_axis(D, name="fr"), te.reduce_axis(D, name="fc"))
    sk, sj = te.reduce_axis(K, name="sk"), te.reduce_axis(D, name="sj")
    return te.compute((1,), lambda _: (
        -N * (D / 2 * math.log(2 * math.pi) + lse_alpha[0]) + te.sum(lse_beta[i], axis=i)
        + prior_const
        - gamma * gamma / 2 * te.sum(Q[fk, fr, fc] * Q[fk, fr, fc], axis=[fk, fr, fc])
        + m * te.sum(q[sk, sj], axis=[sk, sj])), name="log_posterior")


@lru_cache(maxsize=8)
def kernel(which: int, d: int, k: int, n: int, m: int, gamma: float):
    """The objective (``which`` 0) or jacobian (1) kernel for one shape and prior."""
    alpha = te.placeholder((k,), dtype="float64", name="alpha")
    mu = te.placeholder((k, d), dtype="float64", name="mu")
    q = te.placeholder((k, d), dtype="float64", name="q")
    l = te.placeholder((k, d * (d - 1) // 2), dtype="float64", name="l")
    x = te.placeholder((n, d), dtype="float64", name="x")
    F = log_posterior(alpha, mu, q, l, x, m, gamma)
    grads = te.gradient(F, [alpha, mu, q, l])
    inputs = [alpha, mu, q, l, x]
    if which == 0:
        return te.build(inputs, [F], name="gmm")
    return te.build(inputs, grads, name="gmm_jacobian")


def _prepare(which):
    def pre(input):
        d, k, n = int(input["d"]), int(input["k"]), int(input["n"])
        arrays = (np.asarray(input["alpha"], dtype=np.float64).reshape(k),
                  np.asarray(input["mu"], dtype=np.float64).reshape(k, d),
                  np.asarray(input["q"], dtype=np.float64).reshape(k, d),
                  np.asarray(input["l"], dtype=np.float64).reshape(k, d * (d - 1) // 2),
                  np.asarray(input["x"], dtype=np.float64).reshape(n, d))
        return kernel(which, d, k, n, int(input["m"]), float(input["gamma"])), arrays
    return pre


@function(pre=_prepare(0), post=scalar)
def objective(prepared):
    kernel, arrays = prepared
    return kernel(*arrays)


def _jacobian_json(grads):
    alpha, mu, q, l = grads
    return {"alpha": alpha.tolist(), "mu": mu.tolist(), "q": q.tolist(), "l": l.tolist()}


@function(pre=_prepare(1), post=_jacobian_json)
def jacobian(prepared):
    kernel, arrays = prepared
    return kernel(*arrays)
