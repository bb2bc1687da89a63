"""The derivatives of ``a + log(sum_c exp(b_c - a))`` and of ``exp(b_j - a)
/ sum_c exp(b_c - a)`` do not reach the shift ``a``
(``te_autodiff/shift_invariance.py``): a log-sum-exp or a softmax written
with the max trick differentiates without the argmax pass the max's
derivative would need; where the formula does not have that shape exactly,
every route is differentiated as written.  Oracles: numpy's
softmax by hand and central finite differences (``te.check_gradient``)."""
import numpy as np
import pytest

import te_autodiff as te

F64 = "float64"


def _softmax(x):
    p = np.exp(x - x.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def _lse_rows(X, commuted=False, separate=False):
    """``m + log(sum_c exp(X[i, c] - m))`` per row, ``m`` the row's max."""
    N, C = X.shape
    c1, c2 = te.reduce_axis(C, "c"), te.reduce_axis(C, "c")
    m = te.compute((N,), lambda i: te.max(X[i, c1], axis=c1), name="m")
    if separate:
        s = te.compute((N,), lambda i: te.sum(te.exp(X[i, c2] - m[i]), axis=c2), name="s")
        total = lambda i: s[i]                                              # noqa: E731
    else:
        total = lambda i: te.sum(te.exp(X[i, c2] - m[i]), axis=c2)         # noqa: E731
    if commuted:
        return te.compute((N,), lambda i: te.log(total(i)) + m[i], name="lse")
    return te.compute((N,), lambda i: m[i] + te.log(total(i)), name="lse")


def _data(rng, shape, tie=True):
    x = rng.standard_normal(shape) * 3
    if tie:                                           # where a max has no derivative: the sum does
        x[..., 1] = x[..., 3] = x.max(-1) + 1.0
    return x


@pytest.mark.parametrize("commuted", [False, True])
@pytest.mark.parametrize("separate", [False, True])
def test_a_max_shifted_logsumexp_differentiates_into_the_softmax(rng, commuted, separate):
    """Inline or a tensor of its own, ``m + log(S)`` or ``log(S) + m``: the
    gradient has no argmax, equals the softmax times the head and passes
    finite differences."""
    X = te.placeholder((4, 7), F64, "X")
    lse = _lse_rows(X, commuted, separate)
    H = te.placeholder((4,), F64, "H")
    dX, = te.gradient(lse, [X], head=H)
    assert "argmax" not in te.pretty(dX)
    x, h = _data(rng, (4, 7)), rng.standard_normal(4)
    f = te.build([X, H], [lse, dX])
    value, grad = f(x, h)
    np.testing.assert_allclose(value, np.log(np.exp(x).sum(1)), rtol=1e-14)
    np.testing.assert_allclose(grad, _softmax(x) * h[:, None], rtol=1e-13, atol=1e-16)
    te.check_gradient(lse, [X], [x], head=h)


def test_the_cross_entropy_of_a_batch_needs_no_argmax(rng):
    """Mean over rows of ``lse - X[i, L[i]]`` (the loss the benchmarks and
    GradBench write): the gradient program runs no argmax stage; values as
    numpy's ``(softmax - onehot) / N``, in float32 too."""
    for dtype, rtol in ((F64, 1e-13), ("float32", 2e-6)):
        N, C = 6, 11
        X = te.placeholder((N, C), dtype, "X")
        L = te.placeholder((N,), "int32", "L")
        lse = _lse_rows(X)
        r = te.reduce_axis(N, "r")
        loss = te.compute((1,), lambda _: te.sum(lse[r] - X[r, L[r]], axis=r) / float(N), name="loss")
        dX, = te.gradient(loss, [X])
        f = te.build([X, L], [loss, dX])
        assert not [st.name for st in f.program.stages if "argmax" in st.name]
        x, labels = _data(rng, (N, C)).astype(dtype), rng.integers(0, C, N).astype(np.int32)
        _, grad = f(x, labels)
        want = _softmax(x.astype(np.float64))
        want[np.arange(N), labels] -= 1
        np.testing.assert_allclose(grad, want / N, rtol=rtol, atol=rtol / N)


def test_a_scalar_logsumexp_and_a_shift_given_as_input(rng):
    """``a + log(sum_j exp(x[j] - a))`` of a vector (GradBench's lse), and a
    shift ``a`` passed in: the result does not depend on ``a``, so its
    gradient there is exactly 0, and finite differences agree."""
    n = 9
    x_ = te.placeholder((n,), F64, "x")
    a_ = te.placeholder((1,), F64, "a")
    j = te.reduce_axis(n, "j")
    lse = te.compute((1,), lambda _: a_[0] + te.log(te.sum(te.exp(x_[j] - a_[0]), axis=j)), name="lse")
    dx, da = te.gradient(lse, [x_, a_])
    x = rng.standard_normal(n)
    gx, ga = te.build([x_, a_], [dx, da])(x, np.array([0.7]))
    np.testing.assert_allclose(gx, _softmax(x), rtol=1e-13)
    assert ga[0] == 0.0
    te.check_gradient(lse, [x_, a_], [x, np.array([0.7])])


def _log_softmaxes():
    """A log-softmax as people write it: ``x - m - log(Σ exp(x - m))``, its
    terms in another order, and as PyTorch and JAX decompose it, shifted
    logits ``s = x - m`` a tensor of their own, ``s - log(Σ exp(s))`` (the
    log-sum-exp inline or a tensor too)."""
    def difference(X, m, c):
        Z = te.compute((X.shape[0],), lambda i: te.sum(te.exp(X[i, c] - m[i]), axis=c), name="Z")
        return te.compute(X.shape, lambda i, j: X[i, j] - m[i] - te.log(Z[i]), name="logp")

    def log_first(X, m, c):
        Z = te.compute((X.shape[0],), lambda i: te.sum(te.exp(X[i, c] - m[i]), axis=c), name="Z")
        return te.compute(X.shape, lambda i, j: X[i, j] - te.log(Z[i]) - m[i], name="logp")

    def shifted_logits(X, m, c):
        s = te.compute(X.shape, lambda i, j: X[i, j] - m[i], name="shifted")
        return te.compute(X.shape, lambda i, j: s[i, j] - te.log(te.sum(te.exp(s[i, c]), axis=c)), name="logp")

    def shifted_logsumexp(X, m, c):
        s = te.compute(X.shape, lambda i, j: X[i, j] - m[i], name="shifted")
        lse = te.compute((X.shape[0],), lambda i: te.log(te.sum(te.exp(s[i, c]), axis=c)), name="lse")
        return te.compute(X.shape, lambda i, j: s[i, j] - lse[i], name="logp")
    return [difference, log_first, shifted_logits, shifted_logsumexp]


@pytest.mark.parametrize("make", _log_softmaxes(), ids=lambda f: f.__name__)
def test_a_log_softmax_cross_entropy_needs_no_argmax(rng, make):
    """``-mean_i logp[i, L[i]]`` of each log-softmax form: no argmax, the
    gradient numpy's ``(softmax - onehot) / N`` (ties for the maximum
    included), and finite differences."""
    N, C = 5, 7
    X, L = te.placeholder((N, C), F64, "X"), te.placeholder((N,), "int32", "L")
    c1, c2, r = te.reduce_axis(C, "c"), te.reduce_axis(C, "c"), te.reduce_axis(N, "r")
    m = te.compute((N,), lambda i: te.max(X[i, c1], axis=c1), name="m")
    logp = make(X, m, c2)
    loss = te.compute((1,), lambda _: -te.sum(logp[r, L[r]], axis=r) / float(N), name="loss")
    dX, = te.gradient(loss, [X])
    assert "argmax" not in te.pretty(dX)
    x, labels = _data(rng, (N, C)), rng.integers(0, C, N).astype(np.int32)
    value, grad = te.build([X, L], [loss, dX])(x, labels)
    want = _softmax(x)
    np.testing.assert_allclose(value, -np.log(want[np.arange(N), labels]).mean(), rtol=1e-13)
    want[np.arange(N), labels] -= 1
    np.testing.assert_allclose(grad, want / N, rtol=1e-12, atol=1e-16)
    lp = te.build([X], [logp])(x)
    np.testing.assert_allclose(lp, np.log(_softmax(x)), rtol=1e-13, atol=1e-14)
    te.check_gradient(logp, [X], [x], head=rng.standard_normal((N, C)))


def _shapes_that_keep_the_shift():
    """Formulas one step away from the shape: the argmax stays and every
    route is differentiated."""
    def shared_sum(X, m, c):                        # the sum read by a second tensor too
        N = X.shape[0]
        s = te.compute((N,), lambda i: te.sum(te.exp(X[i, c] - m[i]), axis=c), name="s")
        lse = te.compute((N,), lambda i: m[i] + te.log(s[i]), name="lse")
        return te.compute((N,), lambda i: lse[i] + 0.25 * s[i], name="out")

    def other_shift(X, m, c):                       # a shifted by 2a inside the exponentials
        return te.compute((X.shape[0],), lambda i: m[i] + te.log(te.sum(te.exp(X[i, c] - 2.0 * m[i]), axis=c)),
                          name="out")

    def log_twice(X, m, c):                         # the log used outside the sum as well
        N = X.shape[0]
        s = te.compute((N,), lambda i: te.sum(te.exp(X[i, c] - m[i]), axis=c), name="s")
        return te.compute((N,), lambda i: (m[i] + te.log(s[i])) * te.log(s[i]), name="out")

    def first_row_shift(X, m, c):                   # the exponentials shifted by another row's max
        return te.compute((X.shape[0],), lambda i: m[i] + te.log(te.sum(te.exp(X[i, c] - m[0]), axis=c)),
                          name="out")
    def opposite_signs(X, m, c):                    # x - m + log(S): m's two routes add up
        Z = te.compute((X.shape[0],), lambda i: te.sum(te.exp(X[i, c] - m[i]), axis=c), name="Z")
        return te.compute(X.shape, lambda i, j: X[i, j] - m[i] + te.log(Z[i]), name="out")

    def shifted_logits_read_twice(X, m, c):         # s read outside the log-softmax as well
        s = te.compute(X.shape, lambda i, j: X[i, j] - m[i], name="shifted")
        return te.compute(X.shape, lambda i, j: s[i, j] - te.log(te.sum(te.exp(s[i, c]), axis=c)) + 0.5 * s[i, j],
                          name="out")

    def logits_shifted_by_a_column(X, m, c):        # a shift that varies along the sum
        s = te.compute(X.shape, lambda i, j: X[i, j] - X[0, j], name="shifted")
        return te.compute(X.shape, lambda i, j: s[i, j] - te.log(te.sum(te.exp(s[i, c]), axis=c)) + m[i],
                          name="out")
    return [shared_sum, other_shift, log_twice, first_row_shift, opposite_signs, shifted_logits_read_twice,
            logits_shifted_by_a_column]




def _softmax_rows(X, inline=False, masked=False):
    """``exp(X[i, j] - m_i) / sum_c exp(X[i, c] - m_i)``, ``m`` the row's max:
    the exponentials a tensor read by the sum and the ratio, or written
    inline in both; ``masked``: a causal softmax (the sum over ``c <= i``,
    the ratio's exponentials only there, zero above)."""
    N, C = X.shape
    c1, c2 = te.reduce_axis(C, "c"), te.reduce_axis(C, "c")
    m = te.compute((N,), lambda i: te.max(X[i, c1], axis=c1), name="m")
    if masked:
        keep = lambda i, j: j <= i                                            # noqa: E731
        E = te.compute((N, C), lambda i, j: te.exp(X[i, j] - m[i]), name="E")
        Z = te.compute((N,), lambda i: te.sum(te.if_then_else(keep(i, c2), E[i, c2], 0.0), axis=c2), name="Z")
        return te.compute((N, C), lambda i, j: te.if_then_else(keep(i, j), E[i, j] / Z[i], 0.0), name="P")
    if inline:
        Z = te.compute((N,), lambda i: te.sum(te.exp(X[i, c2] - m[i]), axis=c2), name="Z")
        return te.compute((N, C), lambda i, j: te.exp(X[i, j] - m[i]) / Z[i], name="P")
    E = te.compute((N, C), lambda i, j: te.exp(X[i, j] - m[i]), name="E")
    Z = te.compute((N,), lambda i: te.sum(E[i, c2], axis=c2), name="Z")
    return te.compute((N, C), lambda i, j: E[i, j] / Z[i], name="P")


@pytest.mark.parametrize("inline", [False, True])
def test_a_max_shifted_softmax_sends_nothing_to_its_max(rng, inline):
    """A softmax's vector-Jacobian product ``P (H - sum_j P_j H_j)`` needs no
    argmax, whether its exponentials are a tensor (attention's) or written
    in both places; numpy's formula and finite differences agree, ties for
    the maximum included."""
    X = te.placeholder((4, 7), F64, "X")
    H = te.placeholder((4, 7), F64, "H")
    P = _softmax_rows(X, inline)
    dX, = te.gradient(P, [X], head=H)
    assert "argmax" not in te.pretty(dX)
    x, h = _data(rng, (4, 7)), rng.standard_normal((4, 7))
    p, g = te.build([X, H], [P, dX])(x, h)
    want = _softmax(x)
    np.testing.assert_allclose(p, want, rtol=1e-14)
    np.testing.assert_allclose(g, want * (h - (want * h).sum(1, keepdims=True)), rtol=1e-12, atol=1e-15)
    te.check_gradient(P, [X], [x], head=h)


def test_a_causal_softmax_sends_nothing_to_its_max(rng):
    """The ratios read only some exponentials and the sum adds only some: the
    cancellation holds for any such subsets (the sum's adjoint gathers the
    ratios' terms exactly), so the argmax goes here too."""
    X = te.placeholder((5, 5), F64, "X")
    P = _softmax_rows(X, masked=True)
    dX, = te.gradient(P, [X], head=te.placeholder((5, 5), F64, "H"))
    assert "argmax" not in te.pretty(dX)
    x, h = _data(rng, (5, 5), tie=False), rng.standard_normal((5, 5))
    te.check_gradient(P, [X], [x], head=h)
    keep = np.tril(np.ones((5, 5), bool))
    e = np.where(keep, np.exp(x - x.max(1, keepdims=True)), 0.0)
    np.testing.assert_allclose(te.build([X], [P])(x), e / e.sum(1, keepdims=True), rtol=1e-14)


@pytest.mark.parametrize("form", ["tensor", "inline", "logsumexp"])
def test_masked_exponentials_send_nothing_to_their_max(rng, form):
    """The mask on the exponentials themselves, ``keep ? exp(x - m) : 0`` (as
    a tensor, or inline in the ratio and the sum; in a log-sum-exp ``m +
    log(sum_c keep ? exp(x_c - m) : 0)``): a masked element is a constant
    zero that ``m`` does not reach, so the shift cancels as before."""
    N, C = 5, 6
    X = te.placeholder((N, C), F64, "X")
    c1, c2 = te.reduce_axis(C, "c"), te.reduce_axis(C, "c")
    m = te.compute((N,), lambda i: te.max(X[i, c1], axis=c1), name="m")
    masked = lambda i, j: te.if_then_else(j <= i, te.exp(X[i, j] - m[i]), 0.0)          # noqa: E731
    if form == "tensor":
        E = te.compute((N, C), masked, name="E")
        Z = te.compute((N,), lambda i: te.sum(E[i, c2], axis=c2), name="Z")
        out = te.compute((N, C), lambda i, j: E[i, j] / Z[i], name="P")
    elif form == "inline":
        Z = te.compute((N,), lambda i: te.sum(masked(i, c2), axis=c2), name="Z")
        out = te.compute((N, C), lambda i, j: masked(i, j) / Z[i], name="P")
    else:
        out = te.compute((N,), lambda i: m[i] + te.log(te.sum(masked(i, c2), axis=c2)), name="lse")
    H = te.placeholder(out.shape, F64, "H")
    dX, = te.gradient(out, [X], head=H)
    assert "argmax" not in te.pretty(dX)
    x, h = _data(rng, (N, C), tie=False), rng.standard_normal(out.shape)
    keep = np.tril(np.ones((N, C), bool))
    e = np.where(keep, np.exp(x - x.max(1, keepdims=True)), 0.0)
    p = e / e.sum(1, keepdims=True)
    if form == "logsumexp":
        want = np.log(e.sum(1)) + x.max(1), p * h[:, None]
    else:
        want = p, p * (h - (p * h).sum(1, keepdims=True))
    got = te.build([X, H], [out, dX])(x, h)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-13, atol=1e-15)
    te.check_gradient(out, [X], [x], head=h)


def test_attention_scores_softmax_in_float32_needs_no_argmax(rng):
    """Batched attention weights ``softmax(Q K^T)`` per head, float32: no
    argmax stage is built and the gradient of ``sum(P H)`` matches numpy's
    in float64 within float32's rounding over the row."""
    h, T, d = 2, 6, 4
    Q, K = te.placeholder((h, T, d), "float32", "Q"), te.placeholder((h, T, d), "float32", "K")
    r, j1, j2 = te.reduce_axis(d, "r"), te.reduce_axis(T, "j"), te.reduce_axis(T, "j")
    S = te.compute((h, T, T), lambda a, i, j: te.sum(Q[a, i, r] * K[a, j, r], axis=r), name="scores")
    M = te.compute((h, T), lambda a, i: te.max(S[a, i, j1], axis=j1), name="row_max")
    E = te.compute((h, T, T), lambda a, i, j: te.exp(S[a, i, j] - M[a, i]), name="exp")
    Z = te.compute((h, T), lambda a, i: te.sum(E[a, i, j2], axis=j2), name="row_sum")
    P = te.compute((h, T, T), lambda a, i, j: E[a, i, j] / Z[a, i], name="softmax")
    H = te.placeholder((h, T, T), "float32", "H")
    dQ, = te.gradient(P, [Q], head=H)
    kernel = te.build([Q, K, H], [dQ])
    assert "argmax" not in kernel.scheduled_ir
    q, k, hh = (rng.standard_normal(s.shape).astype(np.float32) for s in (Q, K, H))
    s = np.einsum("aid,ajd->aij", q.astype(F64), k.astype(F64))
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ds = p * (hh - (p * hh).sum(-1, keepdims=True))
    want = np.einsum("aij,ajd->aid", ds, k.astype(F64))
    np.testing.assert_allclose(kernel(q, k, hh), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def _softmaxes_written_otherwise():
    """The softmax as people also write it: a temperature or a scale on the
    shifted exponent (``exp((x - m) / t)``, ``exp(c * (x - m))``, on a
    tensor of exponentials or inline), the reciprocal of the sum as a
    factor (``E * (1 / Z)`` inline, or a tensor ``R = 1 / Z``), shifted
    logits ``s = x - m`` a tensor of their own (PyTorch's and JAX's form).  Each is
    ``softmax(x / t)`` (or ``softmax(c x)``): its shift cancels as before."""
    def temperature(X, m, c, T):
        N, C = X.shape
        E = te.compute((N, C), lambda i, j: te.exp((X[i, j] - m[i]) / T[i]), name="E")
        Z = te.compute((N,), lambda i: te.sum(E[i, c], axis=c), name="Z")
        return te.compute((N, C), lambda i, j: E[i, j] / Z[i], name="P"), lambda x, t: x / t[:, None]

    def scale_inline(X, m, c, T):
        N, C = X.shape
        Z = te.compute((N,), lambda i: te.sum(te.exp(0.5 * (X[i, c] - m[i])), axis=c), name="Z")
        return (te.compute((N, C), lambda i, j: te.exp(0.5 * (X[i, j] - m[i])) / Z[i], name="P"),
                lambda x, t: 0.5 * x)

    def reciprocal_inline(X, m, c, T):
        N, C = X.shape
        E = te.compute((N, C), lambda i, j: te.exp(X[i, j] - m[i]), name="E")
        Z = te.compute((N,), lambda i: te.sum(E[i, c], axis=c), name="Z")
        return te.compute((N, C), lambda i, j: E[i, j] * (1.0 / Z[i]), name="P"), lambda x, t: x

    def reciprocal_tensor(X, m, c, T):
        N, C = X.shape
        E = te.compute((N, C), lambda i, j: te.exp((X[i, j] - m[i]) * 0.25), name="E")
        R = te.compute((N,), lambda i: 1.0 / te.sum(E[i, c], axis=c), name="R")
        return te.compute((N, C), lambda i, j: R[i] * E[i, j], name="P"), lambda x, t: 0.25 * x
    def shifted_logits_inline(X, m, c, T):
        s = te.compute(X.shape, lambda i, j: X[i, j] - m[i], name="shifted")
        return (te.compute(X.shape, lambda i, j: te.exp(s[i, j]) / te.sum(te.exp(s[i, c]), axis=c), name="P"),
                lambda x, t: x)

    def shifted_logits_tensor(X, m, c, T):
        s = te.compute(X.shape, lambda i, j: X[i, j] - m[i], name="shifted")
        E = te.compute(X.shape, lambda i, j: te.exp(s[i, j]), name="E")
        Z = te.compute((X.shape[0],), lambda i: te.sum(E[i, c], axis=c), name="Z")
        return te.compute(X.shape, lambda i, j: E[i, j] / Z[i], name="P"), lambda x, t: x
    return [temperature, scale_inline, reciprocal_inline, reciprocal_tensor, shifted_logits_inline,
            shifted_logits_tensor]


@pytest.mark.parametrize("make", _softmaxes_written_otherwise(), ids=lambda f: f.__name__)
def test_a_softmax_written_otherwise_sends_nothing_to_its_max(rng, make):
    """No argmax in the gradient, ties for the maximum included; values as
    numpy's softmax of the scaled rows, the gradient as its vector-Jacobian
    product and as finite differences (the temperature's own route kept)."""
    X, T, H = te.placeholder((4, 7), F64, "X"), te.placeholder((4,), F64, "T"), te.placeholder((4, 7), F64, "H")
    c1, c2 = te.reduce_axis(7, "c"), te.reduce_axis(7, "c")
    m = te.compute((4,), lambda i: te.max(X[i, c1], axis=c1), name="m")
    P, scaled = make(X, m, c2, T)
    dX, dT = te.gradient(P, [X, T], head=H)
    assert "argmax" not in te.pretty(dX) + te.pretty(dT)
    x, t, h = _data(rng, (4, 7)), rng.uniform(0.5, 2.0, 4), rng.standard_normal((4, 7))
    p, gx = te.build([X, T, H], [P, dX])(x, t, h)
    want = _softmax(scaled(x, t))
    np.testing.assert_allclose(p, want, rtol=1e-14)
    vjp = want * (h - (want * h).sum(1, keepdims=True))          # d/d(scaled x)
    np.testing.assert_allclose(gx, scaled(vjp, t), rtol=1e-12, atol=1e-15)
    te.check_gradient(P, [X, T], [x, t], head=h)


def _softmaxes_that_keep_the_shift():
    """Softmax formulas one step away from the shape: the argmax stays."""
    def softmax_shared_sum(X, m, c):                # the sum read by a second tensor too
        N, C = X.shape
        E = te.compute((N, C), lambda i, j: te.exp(X[i, j] - m[i]), name="E")
        Z = te.compute((N,), lambda i: te.sum(E[i, c], axis=c), name="Z")
        P = te.compute((N, C), lambda i, j: E[i, j] / Z[i], name="P")
        return te.compute((N, C), lambda i, j: P[i, j] + 0.25 * Z[i], name="out")

    def exp_read_again(X, m, c):                    # the exponentials read outside the ratio
        N, C = X.shape
        E = te.compute((N, C), lambda i, j: te.exp(X[i, j] - m[i]), name="E")
        Z = te.compute((N,), lambda i: te.sum(E[i, c], axis=c), name="Z")
        return te.compute((N, C), lambda i, j: E[i, j] / Z[i] + 0.5 * E[i, j], name="out")

    def other_row_sum(X, m, c):                     # the ratio divides by another row's sum
        N, C = X.shape
        E = te.compute((N, C), lambda i, j: te.exp(X[i, j] - m[i]), name="E")
        Z = te.compute((N,), lambda i: te.sum(E[i, c], axis=c), name="Z")
        return te.compute((N, C), lambda i, j: E[i, j] / Z[0], name="out")

    def doubled_shift(X, m, c):                     # the numerator shifted by 2m, the sum by m
        N, C = X.shape
        Z = te.compute((N,), lambda i: te.sum(te.exp(X[i, c] - m[i]), axis=c), name="Z")
        return te.compute((N, C), lambda i, j: te.exp(X[i, j] - 2.0 * m[i]) / Z[i], name="out")

    def other_scales(X, m, c):                      # the numerator's shift scaled by 2, the sum's by 3
        N, C = X.shape
        Z = te.compute((N,), lambda i: te.sum(te.exp((X[i, c] - m[i]) * 3.0), axis=c), name="Z")
        return te.compute((N, C), lambda i, j: te.exp((X[i, j] - m[i]) * 2.0) / Z[i], name="out")

    def scale_by_column(X, m, c):                   # a factor varying along the sum: no common shift
        N, C = X.shape
        E = te.compute((N, C), lambda i, j: te.exp((X[i, j] - m[i]) * X[0, j]), name="E")
        Z = te.compute((N,), lambda i: te.sum(E[i, c], axis=c), name="Z")
        return te.compute((N, C), lambda i, j: E[i, j] / Z[i], name="out")

    def shift_in_the_factor(X, m, c):               # the shift also scales: exp((x - m) * (x - m))
        N, C = X.shape
        E = te.compute((N, C), lambda i, j: te.exp((X[i, j] - m[i]) * (X[i, j] - m[i]) * -0.5), name="E")
        Z = te.compute((N,), lambda i: te.sum(E[i, c], axis=c), name="Z")
        return te.compute((N, C), lambda i, j: E[i, j] / Z[i], name="out")

    def reciprocal_of_the_max(X, m, c):             # E * (m / Z): the factor is not a constant
        N, C = X.shape
        E = te.compute((N, C), lambda i, j: te.exp(X[i, j] - m[i]), name="E")
        Z = te.compute((N,), lambda i: te.sum(E[i, c], axis=c), name="Z")
        return te.compute((N, C), lambda i, j: E[i, j] * (m[i] / Z[i]), name="out")

    def reciprocal_read_again(X, m, c):             # R = 1 / Z read by a second tensor too
        N, C = X.shape
        E = te.compute((N, C), lambda i, j: te.exp(X[i, j] - m[i]), name="E")
        R = te.compute((N,), lambda i: 1.0 / te.sum(E[i, c], axis=c), name="R")
        P = te.compute((N, C), lambda i, j: E[i, j] * R[i], name="P")
        return te.compute((N, C), lambda i, j: P[i, j] + 0.25 * R[i], name="out")
    return [softmax_shared_sum, exp_read_again, other_row_sum, doubled_shift, other_scales, scale_by_column,
            shift_in_the_factor, reciprocal_of_the_max, reciprocal_read_again]


@pytest.mark.parametrize("make", _shapes_that_keep_the_shift() + _softmaxes_that_keep_the_shift(),
                         ids=lambda f: f.__name__)
def test_formulas_of_another_shape_keep_every_route(rng, make):
    """No tie for a maximum here: these formulas depend on the max itself."""
    X = te.placeholder((3, 5), F64, "X")
    c1, c2 = te.reduce_axis(5, "c"), te.reduce_axis(5, "c")
    m = te.compute((3,), lambda i: te.max(X[i, c1], axis=c1), name="m")
    out = make(X, m, c2)
    dX, = te.gradient(out, [X])
    assert "argmax" in te.pretty(dX)
    te.check_gradient(out, [X], [_data(rng, (3, 5), tie=False)], head=rng.standard_normal(out.shape))
