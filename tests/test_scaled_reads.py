"""A tensor that is a stored tensor times broadcast factors, read inside
sums, is not stored again (``lowering/scaled_reads.py``): a softmax ``P =
E / Σ E`` feeding products reads ``E``, the row factor applied after the
sum or carried by the other operand.  Oracles: numpy float64 by hand,
central finite differences, and the same program with ``P`` stored."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import te_autodiff as te

F64 = "float64"


def _program(n, m, c, form="div", dtype=F64, read="product"):
    """``loss = Σ O · H`` with ``O[i, c] = Σ_j P[i, j] V[j, c]`` and ``P`` a
    view of ``E = exp(X)``: ``E / Σ_j E`` ("div"), ``E · (1 / Σ_j E)``
    ("recip") or ``E · 0.5`` ("const").  ``read`` changes how ``O`` reads
    ``P``: "triangle" sums ``j <= i`` only, "alone" sums a column of ``P``
    (``Σ_r P[r, i mod m] V[i mod m, k]``: no operand reads ``r``), "max" takes a row max of ``P · V``."""
    X, V = te.placeholder((n, m), dtype, "X"), te.placeholder((m, c), dtype, "V")
    j1, j2 = te.reduce_axis(m, "j"), te.reduce_axis(m, "j")
    E = te.compute((n, m), lambda i, j: te.exp(X[i, j]), name="E")
    if form == "recip":
        R = te.compute((n,), lambda i: 1.0 / te.sum(E[i, j1], axis=j1), name="R")
        P = te.compute((n, m), lambda i, j: E[i, j] * R[i], name="P")
    elif form == "div":
        Z = te.compute((n,), lambda i: te.sum(E[i, j1], axis=j1), name="Z")
        P = te.compute((n, m), lambda i, j: E[i, j] / Z[i], name="P")
    else:
        P = te.compute((n, m), lambda i, j: E[i, j] * 0.5, name="P")
    if read == "triangle":
        O = te.compute((n, c), lambda i, k: te.sum(
            te.if_then_else(j2 <= i, P[i, j2] * V[j2, k], 0.0), axis=j2), name="O")
    elif read == "alone":
        r = te.reduce_axis(n, "r")
        O = te.compute((n, c), lambda i, k: te.sum(P[r, i % m] * V[i % m, k], axis=r), name="O")
    elif read == "max":
        O = te.compute((n, c), lambda i, k: te.max(P[i, j2] * V[j2, k], axis=j2), name="O")
    else:
        O = te.compute((n, c), lambda i, k: te.sum(P[i, j2] * V[j2, k], axis=j2), name="O")
    H = te.placeholder((n, c), dtype, "H")
    r, s = te.reduce_axis(n, "r"), te.reduce_axis(c, "s")
    loss = te.compute((1,), lambda _: te.sum(O[r, s] * H[r, s], axis=[r, s]), name="loss")
    return [X, V, H], loss, P


def _numpy(x, v, h, form, read="product", magnitude=False):
    """Loss and gradients (X, V) of :func:`_program`, by hand in float64;
    with ``magnitude`` the same sums of absolute values (the scale of the
    rounding error of each result: ``|error| <= k eps`` times it for sums
    and chains of ``k`` operations)."""
    a = np.abs if magnitude else (lambda y: y)
    x, v, h = (np.asarray(y, np.float64) for y in (x, v, h))
    e = np.exp(x)
    p = e * 0.5 if form == "const" else e / e.sum(1, keepdims=True)
    mask = np.tril(np.ones(p.shape)) if read == "triangle" else 1.0
    pm = p * mask
    dp = (a(h) @ a(v).T) * mask
    if form == "const":
        inner = dp
    else:
        inner = dp + (1 if magnitude else -1) * np.sum(dp * p, 1, keepdims=True)
    return np.vdot(pm @ a(v), a(h)), p * inner, pm.T @ a(h)


def _assert_near(got, x, v, h, form, read="product"):
    """``got`` (loss, dX, dV) within ``(m + n + c + 16) eps`` of numpy's
    values, times their magnitudes (16: a few ulp of ``exp`` and the
    divisions)."""
    (n, m), c = x.shape, v.shape[1]
    eps = np.finfo(x.dtype).eps
    want, size = _numpy(x, v, h, form, read), _numpy(x, v, h, form, read, magnitude=True)
    for g, w, s in zip(got, want, size):
        np.testing.assert_allclose(np.ravel(g), np.ravel(w), rtol=0, atol=(m + n + c + 16) * eps * np.max(s) + 1e-300)


def _buffers(kernel) -> dict:
    return {b.name: b for b in kernel.program.buffers}


def _data(rng, n, m, c, dtype):
    return tuple(rng.standard_normal(shape).astype(dtype) for shape in ((n, m), (m, c), (n, c)))


@pytest.mark.parametrize("dtype", [F64, "float32"])
@pytest.mark.parametrize("form", ["div", "recip", "const"])
def test_a_view_read_by_products_is_not_stored(rng, form, dtype):
    """``P`` a view of ``E``, read by ``O = P V``, by ``dV = Pᵀ H`` and (not
    "const") by the row sum of the softmax's gradient: no buffer holds
    ``P``; ``dV``'s operand ``H`` is scaled by the row factor (a buffer of
    ``H``'s shape) unless the factor is a constant.  Values as numpy's;
    in float64 also as central differences."""
    n, m, c = 24, 40, 16
    inputs, loss, P = _program(n, m, c, form, dtype)
    kernel = te.build(inputs, [loss, *te.gradient(loss, inputs[:2])])
    names = _buffers(kernel)
    assert "P" not in names, sorted(names)
    assert ("H.scaled" in names) == (form != "const"), sorted(names)
    if form != "const":
        assert names["H.scaled"].shape == (n, c)
    x, v, h = _data(rng, n, m, c, dtype)
    _assert_near(kernel(x, v, h), x, v, h, form)
    if dtype == F64:
        te.check_gradient(loss, inputs, [x, v, h])


@pytest.mark.parametrize("read", ["triangle", "alone", "max"])
def test_a_view_read_where_its_factor_cannot_move_is_stored(rng, read):
    """A read of ``P`` under a mask (the sum's summand is a select), in a
    sum without an operand to carry ``1 / Σ E[i]`` (it would run at every
    step: a column sum of ``P``), or in a max: ``P`` keeps its buffer.  Values as numpy's."""
    n, m, c = 12, 20, 8
    inputs, loss, P = _program(n, m, c, "div", F64, read)
    grads = te.gradient(loss, inputs[:2]) if read != "max" else []
    kernel = te.build(inputs, [loss, *grads])
    assert "P" in _buffers(kernel), sorted(_buffers(kernel))
    x, v, h = _data(rng, n, m, c, F64)
    if read == "triangle":
        _assert_near(kernel(x, v, h), x, v, h, "div", read)
    elif read == "alone":
        p = np.exp(x) / np.exp(x).sum(1, keepdims=True)
        rows = np.arange(n) % m
        want = np.vdot(p.sum(0)[rows, None] * v[rows], h)
        np.testing.assert_allclose(kernel(x, v, h)[0], want, rtol=1e-12)
        te.check_gradient(loss, inputs, [x, v, h])
    else:
        p = np.exp(x) / np.exp(x).sum(1, keepdims=True)
        np.testing.assert_allclose(kernel(x, v, h), np.vdot((p[:, :, None] * v[None]).max(1), h), rtol=1e-12)


def test_a_view_larger_than_its_saving_is_stored(rng):
    """Scaling ``H`` (``n x c``) to save ``P`` (``n x m``) pays only when
    ``H`` is the smaller: with ``c > m`` ``P`` stays, and values agree."""
    n, m, c = 6, 4, 64
    inputs, loss, P = _program(n, m, c, "div", F64)
    kernel = te.build(inputs, [loss, *te.gradient(loss, inputs[:2])])
    names = _buffers(kernel)
    assert "P" in names and "H.scaled" not in names, sorted(names)
    x, v, h = _data(rng, n, m, c, F64)
    _assert_near(kernel(x, v, h), x, v, h, "div")


def test_store_keeps_a_view(rng):
    """``store=[P]`` keeps its buffer; both programs give the same values
    within rounding."""
    n, m, c = 24, 40, 16
    inputs, loss, P = _program(n, m, c, "div", "float32")
    outputs = [loss, *te.gradient(loss, inputs[:2])]
    kept, viewed = te.build(inputs, outputs, store=[P]), te.build(inputs, outputs)
    assert "P" in _buffers(kept) and "P" not in _buffers(viewed)
    assert te.cost(inputs, outputs)["built"]["temp_bytes"] < te.cost(inputs, outputs, store=[P])["built"]["temp_bytes"]
    x, v, h = _data(rng, n, m, c, "float32")
    _assert_near(kept(x, v, h), x, v, h, "div")
    _assert_near(viewed(x, v, h), x, v, h, "div")


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 9), m=st.integers(1, 33), c=st.integers(1, 9), form=st.sampled_from(["div", "recip", "const"]),
       seed=st.integers(0, 2 ** 16))
def test_views_compute_what_the_stored_program_does(n, m, c, form, seed):
    """Any sizes (views rewritten or not by the size rule): the values of
    the program equal numpy's within the rounding bound."""
    inputs, loss, P = _program(n, m, c, form, F64)
    kernel = te.build(inputs, [loss, *te.gradient(loss, inputs[:2])])
    x, v, h = _data(np.random.default_rng(seed), n, m, c, F64)
    _assert_near(kernel(x, v, h), x, v, h, form)


def test_a_sum_over_a_varying_range_keeps_its_factor_inside(rng):
    """``O[i, c] = Σ_{j <= i} P[i, j] V[j, c]`` as zero elimination writes a
    masked sum (a range that depends on the row): ``1 / Z[i]`` may not move
    after a loop that may not run, so ``P`` keeps its buffer.  Values as
    numpy's."""
    from te_autodiff.dtype import INDEX
    from te_autodiff.expr import Load, const, minimum, reduce, var
    from te_autodiff.tensor import Tensor
    n, m, c = 9, 12, 5
    X, V = te.placeholder((n, m), F64, "X"), te.placeholder((m, c), F64, "V")
    j1 = te.reduce_axis(m, "j")
    E = te.compute((n, m), lambda i, j: te.exp(X[i, j]), name="E")
    Z = te.compute((n,), lambda i: te.sum(E[i, j1], axis=j1), name="Z")
    P = te.compute((n, m), lambda i, j: E[i, j] / Z[i], name="P")
    i, k, j = var("i", (0, n)), var("k", (0, c)), var("j", (0, m))
    body = reduce("sum", Load(P, (i, j)) * Load(V, (j, k)), (j,), ((const(0, INDEX), minimum(i + 1, m)),))
    O = Tensor("O", (n, c), F64, (i, k), body)
    kernel = te.build([X, V], [O, E])
    assert "P" in _buffers(kernel), sorted(_buffers(kernel))
    x, v = rng.standard_normal((n, m)), rng.standard_normal((m, c))
    p = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    np.testing.assert_allclose(kernel(x, v)[0], np.tril(p) @ v, rtol=1e-13, atol=1e-15)
