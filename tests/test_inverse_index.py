"""Data-dependent indices: embeddings, take, gather along an axis, a data-dependent
plus affine index, segment sums and label reads.  Gradients against hand-written
numpy (``np.add.at``), the ``optimize=False`` oracle and finite differences
(``te.check_gradient``); the inverse index's work (``te.cost``), sharing,
determinism and bad ids."""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import te_autodiff as te
from conftest import assert_close, build_grad, numeric_vjp

F64 = "float64"


def check(out, inputs, values, expected, wrt, head, fwd=None):
    """te.gradient and optimize=False equal ``expected`` (and ``fwd`` the
    forward); finite differences agree with te.gradient."""
    r = build_grad(out, inputs, values, wrt=wrt, head=head)
    if fwd is not None:
        assert_close(r.fwd, fwd, what="forward")
    assert_close(r.grads, expected, what="te.gradient vs numpy")
    assert_close(r.naive, expected, what="optimize=False vs numpy")
    te.check_gradient(out, inputs, values, head=head)
    return r


def embedding(V, D, id_shape, dtype=F64, id_dtype="int32"):
    E = te.placeholder((V, D), dtype=dtype, name="E")
    I = te.placeholder(id_shape, dtype=id_dtype, name="I")
    Y = te.compute(id_shape + (D,), lambda *ix: E[I[ix[:-1]], ix[-1]], name="Y")
    return E, I, Y


def add_at(shape, ids, values):
    out = np.zeros(shape)
    np.add.at(out, ids, values)
    return out


@pytest.mark.parametrize("id_shape,id_dtype", [((9,), "int32"), ((3, 4), "int64")])
@pytest.mark.aarch64
def test_embedding(rng, id_shape, id_dtype):
    V, D = 7, 5
    E, I, Y = embedding(V, D, id_shape, id_dtype=id_dtype)
    e = rng.standard_normal((V, D))
    ids = rng.integers(0, V - 1, id_shape).astype(id_dtype)       # row V-1 never used
    ids.reshape(-1)[:3] = 2                                         # repeated ids
    h = rng.standard_normal(id_shape + (D,))
    ref = add_at((V, D), ids, h)
    check(Y, [E, I], [e, ids], [ref], wrt=[E], head=h, fwd=e[ids])
    assert not ref[V - 1].any()


def test_pretty_shows_the_inverse_index():
    E, I, Y = embedding(10, 4, (6,))
    H = te.placeholder((6, 4), dtype=F64, name="H")
    (dE,) = te.gradient(Y, [E], head=H)
    lines = te.pretty(dE).splitlines()
    assert "I_inv[x0] = inverse_index[p0 in 0..6](int64(I[p0]), values 0..10)[x0]    # shape (17) int32" \
        in lines, lines
    assert ("dE[i0, i1] = sum[r in int64(I_inv[i0])..int64(I_inv[i0 + 1])](H[int64(I_inv[r + 11]), i1])"
            "    # shape (10, 4) float64") in lines, lines


def test_embedding_cost_is_linear():
    """Forward N·D, backward N·D gathered, and the sort: zero and prefix-sum
    V + 1 starts, count and place N ids (no V·N·D term)."""
    V, D, N = 1000, 16, 300
    E, I, Y = embedding(V, D, (N,), dtype="float32")
    H = te.placeholder((N, D), name="H")
    (dE,) = te.gradient(Y, [E], head=H)
    c = te.cost([E, I, H], [Y, dE])
    assert c["iterations"] == 2 * N * D + 2 * N + 2 * (V + 1)
    assert c["temp_bytes"] == 4 * (V + 1 + N)          # int32 starts and positions


@pytest.mark.aarch64
def test_take_and_a_data_dependent_plus_affine_index(rng):
    X = te.placeholder((20,), dtype=F64, name="X")
    I = te.placeholder((6,), dtype="int32", name="I")
    take = te.compute((6,), lambda n: X[I[n]], name="take")
    x, ids = rng.standard_normal(20), np.array([3, 0, 3, 19, 7, 3], "int32")
    h = rng.standard_normal(6)
    check(take, [X, I], [x, ids], [add_at((20,), ids, h)], wrt=[X], head=h, fwd=x[ids])

    J = 4
    strided = te.compute((6, J), lambda t, j: X[I[t] + 2 * j], name="strided")
    ids = np.array([0, 5, 3, 11, 0, 2], "int32")           # I[t] + 2j <= 17
    h = rng.standard_normal((6, J))
    pos = ids[:, None] + 2 * np.arange(J)[None, :]
    r = check(strided, [X, I], [x, ids], [add_at((20,), pos, h)], wrt=[X], head=h, fwd=x[pos])
    (dX,) = te.gradient(strided, [X])          # dX[v] owns all of v's matches: a sum by scatter, no sort
    assert "sum[p0 in 0..6, p1 in 0..4 where int64(I[p0]) + 2 * p1 == x0](1.0)" in te.pretty(dX), te.pretty(dX)
    assert r.fwd.shape == (6, J)


@pytest.mark.aarch64
def test_gather_along_an_axis_scatters_each_row(rng):
    """torch.gather semantics: Y[i, j] = X[i, I[i, j]].  Row i of dX owns the
    matches of row i of I: each row is zeroed and its 64 positions added at
    their keys, in order (a match sum: no sort, no pass over the values)."""
    A, C, J = 4, 6, 5
    X = te.placeholder((A, C), dtype=F64, name="X")
    I = te.placeholder((A, J), dtype="int64", name="I")
    Y = te.compute((A, J), lambda i, j: X[i, I[i, j]], name="Y")
    x, ids = rng.standard_normal((A, C)), rng.integers(0, C, (A, J))
    h = rng.standard_normal((A, J))
    ref = np.zeros((A, C))
    for i in range(A):
        np.add.at(ref[i], ids[i], h[i])
    check(Y, [X, I], [x, ids], [ref], wrt=[X], head=h, fwd=np.take_along_axis(x, ids, 1))
    H = te.placeholder((A, J), dtype=F64, name="H")
    (dXh,) = te.gradient(Y, [X], head=H)
    lines = te.pretty(dXh).splitlines()
    assert "H_by_I[b0, x1] = sum[p0 in 0..5 where I[b0, p0] == x1](H[b0, p0])    # shape (4, 6) float64" \
        in lines, lines
    assert te.cost([X, I, H], [dXh])["iterations"] == A * (C + J)       # zero each row, add its positions


@pytest.mark.aarch64
def test_segment_sum_gradient_is_a_gather(rng):
    """out[s] = Σ_n [S[n] == s] X[n, d]: dX[n, d] = H[S[n], d], one read per element."""
    N, S, D = 9, 4, 3
    X = te.placeholder((N, D), dtype=F64, name="X")
    seg = te.placeholder((N,), dtype="int32", name="seg")
    n = te.reduce_axis(N, "n")
    out = te.compute((S, D), lambda s, d: te.sum(te.if_then_else(te.equal(seg[n], s), X[n, d], 0.0), axis=n),
                     name="out")
    x, ids = rng.standard_normal((N, D)), np.array([0, 0, 3, 1, 3, 3, 0, 1, 1], "int32")
    h = rng.standard_normal((S, D))
    check(out, [X, seg], [x, ids], [h[ids]], wrt=[X], head=h, fwd=add_at((S, D), ids, x))
    H = te.placeholder((S, D), dtype=F64, name="H")
    (dX,) = te.gradient(out, [X], head=H)
    assert "sum" not in te.pretty(dX)
    assert te.cost([X, seg, H], [dX])["iterations"] == N * D


@pytest.mark.aarch64
def test_label_reads_in_softmax_cross_entropy(rng):
    B, C = 5, 7
    Z = te.placeholder((B, C), dtype=F64, name="Z")
    L = te.placeholder((B,), dtype="int32", name="L")
    c = te.reduce_axis(C, "c")
    m = te.compute((B,), lambda i: te.max(Z[i, c], axis=c), name="m")
    c2 = te.reduce_axis(C, "c2")
    lse = te.compute((B,), lambda i: m[i] + te.log(te.sum(te.exp(Z[i, c2] - m[i]), axis=c2)), name="lse")
    b = te.reduce_axis(B, "b")
    loss = te.compute((1,), lambda _: te.sum(lse[b] - Z[b, L[b]], axis=b) / B, name="loss")
    z, labels = rng.standard_normal((B, C)), rng.integers(0, C, B).astype("int32")
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    ref = p.copy()
    ref[np.arange(B), labels] -= 1
    check(loss, [Z, L], [z, labels], [ref / B], wrt=[Z], head=np.ones(1))


@pytest.mark.aarch64
def test_tables_read_with_the_same_ids_share_one_sort(rng):
    V, D, N = 8, 3, 5
    E = te.placeholder((V, D), dtype=F64, name="E")
    F = te.placeholder((V, D), dtype=F64, name="F")
    I = te.placeholder((N,), dtype="int32", name="I")
    Y = te.compute((N, D), lambda n, d: E[I[n], d] * F[I[n], d], name="Y")
    dE, dF = te.gradient(Y, [E, F])
    f = te.build([E, F, I], [dE, dF])
    assert f.loop_ir.count("stage I_inv") == 1, f.loop_ir
    e, fv, ids = rng.standard_normal((V, D)), rng.standard_normal((V, D)), np.array([1, 4, 1, 7, 0], "int32")
    de, df = f(e, fv, ids)
    assert_close([de, df], [add_at((V, D), ids, fv[ids]), add_at((V, D), ids, e[ids])])


@pytest.mark.aarch64
def test_positions_read_from_the_inverse_index_need_no_run_time_check():
    E, I, Y = embedding(10, 4, (6,))
    H = te.placeholder((6, 4), dtype=F64, name="H")
    (dE,) = te.gradient(Y, [E], head=H)
    ir = te.build([E, I, H], [dE]).loop_ir
    assert "check" not in ir.split("stage dE")[1], ir


@pytest.mark.aarch64
def test_out_of_range_ids_raise_and_return_nothing(rng):
    E, I, Y = embedding(5, 2, (4,))
    H = te.placeholder((4, 2), dtype=F64, name="H")
    (dE,) = te.gradient(Y, [E], head=H)
    f = te.build([E, I, H], [Y, dE])
    e, h = rng.standard_normal((5, 2)), rng.standard_normal((4, 2))
    for bad in (5, -1):
        with pytest.raises(IndexError, match=r"out of bounds for dimension 0 of tensor 'E'"):
            f(e, np.array([0, bad, 1, 2], "int32"), h)
    # the gradient alone skips an id that matches no row, as the sum over n does
    g = te.build([E, I, H], [dE])
    ids = np.array([0, 7, 1, 0], "int32")
    assert_close(g(e, ids, h), add_at((5, 2), ids[[0, 2, 3]], h[[0, 2, 3]]))


_THREADS = textwrap.dedent("""
    import hashlib, sys, numpy as np, te_autodiff as te
    V, D, N = 3000, 24, 5000
    E = te.placeholder((V, D), name="E")
    I = te.placeholder((N,), dtype="int32", name="I")
    Y = te.compute((N, D), lambda n, d: E[I[n], d], name="Y")
    H = te.placeholder((N, D), name="H")
    (dE,) = te.gradient(Y, [E], head=H)
    f = te.build([E, I, H], [dE])
    r = np.random.default_rng(0)
    ids = (r.zipf(1.3, N) % V).astype("int32")       # heavy repeats
    h = r.standard_normal((N, D)).astype("float32")
    e = np.zeros((V, D), "float32")
    first = f(e, ids, h)
    assert all(np.array_equal(first, f(e, ids, h)) for _ in range(3))
    sys.stdout.write(hashlib.sha256(first.tobytes()).hexdigest())
""")


def test_bit_identical_for_every_thread_count(rng):
    outs = []
    for threads in ("1", "2", "3"):
        env = dict(os.environ, TE_NUM_THREADS=threads)
        p = subprocess.run([sys.executable, "-c", _THREADS], env=env, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout)
    assert outs[0] == outs[1] == outs[2]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(V=st.integers(1, 9), N=st.integers(1, 12), D=st.integers(1, 3), batch=st.integers(0, 2),
       shift=st.integers(-3, 3), scale=st.integers(1, 2), seed=st.integers(0, 2**16))
@pytest.mark.aarch64
def test_inverse_index_matches_the_naive_sum(V, N, D, batch, shift, scale, seed):
    """Random keys ``scale·I[.., n] + shift`` (ids in and out of range, repeated)
    over an optional batch axis: zero elimination with an inverse index equals
    the literal sum (``optimize=False``) and np.add.at."""
    r = np.random.default_rng(seed)
    B = max(batch, 1)
    X = te.placeholder((B, V, D), dtype=F64, name="X")
    I = te.placeholder((B, N), dtype="int32", name="I")
    H = te.placeholder((B, N, D), dtype=F64, name="H")
    key = (lambda b, n: I[b, n] * scale + shift) if batch else (lambda b, n: I[0, n] * scale + shift)
    inside = lambda b, n: te.all(key(b, n) >= 0, key(b, n) < V)   # noqa: E731
    Y = te.compute((B, N, D), lambda b, n, d: te.if_then_else(inside(b, n), X[b if batch else 0, key(b, n), d],
                                                              0.0), name="Y")
    (fast,) = te.gradient(Y, [X], head=H)
    (slow,) = te.gradient(Y, [X], head=H, optimize=False)
    ids = r.integers(-2, V + 2, (B, N)).astype("int32")
    h = r.standard_normal((B, N, D))
    got, want = te.build([X, I, H], [fast, slow])(np.zeros((B, V, D)), ids, h)
    pos = ids * scale + shift
    ref = np.zeros((B, V, D))
    for b in range(B):
        for n in range(N):
            if 0 <= pos[b, n] < V:
                ref[b if batch else 0, pos[b, n]] += h[b, n]
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(want, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.aarch64
def test_second_order_through_both_forms(rng):
    """Differentiating the gradient again, with respect to the head and the
    table, through an inverse index (embedding) and a match sum (gather)."""
    V, D, N = 6, 2, 5
    E = te.placeholder((V, D), dtype=F64, name="E")
    I = te.placeholder((N,), dtype="int32", name="I")
    H = te.placeholder((N, D), dtype=F64, name="H")
    K = te.placeholder((V, D), dtype=F64, name="K")
    Y = te.compute((N, D), lambda n, d: E[I[n], d] ** 2, name="Y")
    (dE,) = te.gradient(Y, [E], head=H)
    dH, dE2 = te.gradient(dE, [H, E], head=K)
    e, ids, h, k = (rng.standard_normal((V, D)), np.array([1, 3, 1, 5, 0], "int32"),
                    rng.standard_normal((N, D)), rng.standard_normal((V, D)))
    dh, de2 = te.build([E, I, H, K], [dH, dE2])(e, ids, h, k)
    assert_close([dh, de2], [2 * e[ids] * k[ids], add_at((V, D), ids, 2 * k[ids] * h)])

    A, C, J = 3, 5, 4
    X = te.placeholder((A, C), dtype=F64, name="X")
    G = te.placeholder((A, J), dtype="int32", name="G")
    HX = te.placeholder((A, J), dtype=F64, name="HX")
    KX = te.placeholder((A, C), dtype=F64, name="KX")
    Z = te.compute((A, J), lambda i, j: X[i, G[i, j]] ** 2, name="Z")
    (dX,) = te.gradient(Z, [X], head=HX)
    assert " where " in te.pretty(dX)                       # a match sum
    dHX, dX2 = te.gradient(dX, [HX, X], head=KX)
    x, g, hx, kx = (rng.standard_normal((A, C)), rng.integers(0, C, (A, J)).astype("int32"),
                    rng.standard_normal((A, J)), rng.standard_normal((A, C)))
    dhx, dx2 = te.build([X, G, HX, KX], [dHX, dX2])(x, g, hx, kx)
    picked, kpicked = np.take_along_axis(x, g, 1), np.take_along_axis(kx, g, 1)
    want = np.zeros((A, C))
    for a in range(A):
        np.add.at(want[a], g[a], 2 * kpicked[a] * hx[a])
    assert_close([dhx, dx2], [2 * picked * kpicked, want])


_GUARDS = {
    "c < r": lambda k, r, c, g: te.if_then_else(c < r, g, 0.0),
    "c < r and k > 0": lambda k, r, c, g: te.if_then_else(te.all(c < r, k > 0), g, 0.0),
    "nested": lambda k, r, c, g: te.if_then_else(c < r, te.if_then_else(k > 0, g, 0.0), 0.0),
    "c < r or c == r": lambda k, r, c, g: te.if_then_else(te.any(c < r, te.equal(c, r)), g, 0.0),
}
_MASKS = {"c < r": lambda k, r, c: c < r, "c < r and k > 0": lambda k, r, c: (c < r) & (k > 0),
          "nested": lambda k, r, c: (c < r) & (k > 0), "c < r or c == r": lambda k, r, c: c <= r}


@pytest.mark.parametrize("guard", list(_GUARDS))
def test_a_gather_under_a_select_keeps_the_gather_form_of_its_gradient(rng, guard):
    """``select(cond, l[k, IDX[r, c]], 0)``: the gradient of ``l`` sums the
    matches of each key where the condition holds, at the cost of the plain
    read's gradient (within 2x), not a sum over every (r, c) per element."""
    K, D = 3, 6
    n = D * (D + 1) // 2
    l = te.placeholder((K, n), F64, "l")
    IDX = te.placeholder((D, D), "int64", "IDX")
    L = te.compute((K, D, D), lambda k, r, c: _GUARDS[guard](k, r, c, l[k, IDX[r, c]]), name="L")
    plain = te.compute((K, D, D), lambda k, r, c: l[k, IDX[r, c]], name="plain")
    H = te.placeholder(L.shape, F64, "H")
    (dl,), (dplain,) = te.gradient(L, [l], head=H), te.gradient(plain, [l], head=H)
    assert te.cost([l, IDX, H], [dl])["iterations"] <= 2 * te.cost([l, IDX, H], [dplain])["iterations"]
    lv, h = rng.standard_normal((K, n)), rng.standard_normal((K, D, D))
    ids = rng.integers(0, n, (D, D))
    k, r, c = np.meshgrid(np.arange(K), np.arange(D), np.arange(D), indexing="ij")
    mask = _MASKS[guard](k, r, c)
    want = np.zeros((K, n))
    np.add.at(want, (k[mask], ids[r[mask], c[mask]]), h[mask])
    check(L, [l, IDX, H][:2], [lv, ids], [want], wrt=[l], head=h, fwd=np.where(mask, lv[k, ids[r, c]], 0.0))


def test_second_order_key_reads_data_only_where_the_first_order_did(rng):
    """``Y[b, a, j] = exp(X[I[j] + j, a + j - 1])`` under the box of that read.
    Its gradient ``dX`` sums the slots of an inverse index between the starts
    of one key, and reads ``I`` at ``j`` recovered from a slot.  The second
    order sorts ``dX``'s slots again, over all of them: the trailing ones hold
    positions outside the box (``j = 5``), so the key tests its read of ``I``
    only once that read is known to be in range."""
    X = te.placeholder((3, 6), F64, "X")
    I = te.placeholder((5,), "int32", "I")
    Y = te.compute((2, 2, 5), lambda b, a, j: te.exp(te.if_then_else(
        te.all(I[j] + j >= 0, I[j] + j < 3, a + j - 1 >= 0, a + j - 1 < 6), X[I[j] + j, a + j - 1], -1.0)),
        name="Y")
    H = te.placeholder(Y.shape, F64, "H")
    (dX,) = te.gradient(Y, [X], head=H)
    S = te.compute(dX.shape, lambda p, q: dX[p, q] * dX[p, q], name="S")
    ddX, ddH = te.gradient(S, [X, H])
    x, ids, h = rng.uniform(-2, 2, (3, 6)), rng.integers(-2, 3, 5).astype("int32"), rng.uniform(-1, 1, (2, 2, 5))
    y, dx, ddx, ddh = te.build([X, I, H], [Y, dX, ddX, ddH])(x, ids, h)

    # by hand: Y reads X[p, q] at (p, q) = (I[j] + j, a + j - 1) when it is in X
    want_y = np.full((2, 2, 5), np.exp(-1.0))
    want_dx, mag = np.zeros((3, 6)), np.zeros((3, 6))       # mag: sum of |terms| of each dX
    at = {}
    for b in range(2):
        for a in range(2):
            for j in range(5):
                p, q = ids[j] + j, a + j - 1
                if 0 <= p < 3 and 0 <= q < 6:
                    want_y[b, a, j] = np.exp(x[p, q])
                    want_dx[p, q] += h[b, a, j] * want_y[b, a, j]
                    mag[p, q] += abs(h[b, a, j] * want_y[b, a, j])
                    at[b, a, j] = (p, q)
    want_ddx = 2 * want_dx ** 2                              # d/dX of (e^X G)^2, G the sum of heads
    want_ddh, mag_h = np.zeros((2, 2, 5)), np.zeros((2, 2, 5))
    for (b, a, j), pq in at.items():
        want_ddh[b, a, j] = 2 * want_dx[pq] * want_y[b, a, j]
        mag_h[b, a, j] = mag[pq] * want_y[b, a, j]
    # error bounds, eps = ulp(1): exp within an ulp on both sides; dX sums at
    # most 4 products (8 eps of the sum of their magnitudes, both sides); the
    # second order multiplies it by 2 dX (or sums 2 dX H Y again) and by Y
    eps = np.finfo(np.float64).eps
    assert np.all(np.abs(y - want_y) <= 2 * eps * want_y)
    assert np.all(np.abs(dx - want_dx) <= 8 * eps * mag)
    assert np.all(np.abs(ddx - want_ddx) <= 40 * eps * mag ** 2)
    assert np.all(np.abs(ddh - want_ddh) <= 24 * eps * mag_h)

    # finite differences of sum(S) with I fixed: S is quadratic in H (central
    # differences exact up to rounding) and e^{2X} G^2 in X (truncation
    # step^2 / 6 * 8 S); rounding of the 18-term sum over 2 step dominates
    s_of = te.build([X, I, H], [S])
    step = 1e-6
    fd_x, fd_h = numeric_vjp(lambda xv, hv: s_of(xv, ids, hv), [x, h], 1.0, eps=step)
    total = np.abs(s_of(x, ids, h)).sum()
    tol = 32 * eps * total / (2 * step) + step ** 2 * 8 * total
    np.testing.assert_allclose(ddx, fd_x, rtol=0, atol=tol)
    np.testing.assert_allclose(ddh, fd_h, rtol=0, atol=tol)


@pytest.mark.parametrize("B", [2, 24])          # b within X's first row, and across two rows
def test_key_row_of_a_flattened_read_under_a_select(rng, B):
    """``T[a, b] = select(b + 2a > 0, cos(X[b // 20, b // 4 % 5, b % 4]), 0)``
    reads X as if flattened, and ``Y[a] = T[I[a], a]`` reads T at a key row.
    Zero elimination solves ``b`` for X's element, a point bounded by one
    ``max(...) <= z`` that holds both b's domain and ``b + 2a > 0``, and
    then ``a == I[b]`` by substitution: that bound now reads I at b, so the
    range of b must be tested before it, on its own (te.build raised
    IndexError: dX read I, or H, out of range)."""
    X = te.placeholder((3, 5, 4), F64, "X")
    I = te.placeholder((B,), "int64", "I")
    T = te.compute((4, B), lambda a, b: te.if_then_else(b + 2 * a > 0, te.cos(X[b // 20, (b // 4) % 5, b % 4]),
                                                        0.0), name="T")
    Y = te.compute((B,), lambda a: T[I[a], a], name="Y")
    x, ids, h = rng.uniform(-2, 2, (3, 5, 4)), rng.integers(0, 4, B), rng.uniform(-1, 1, B)
    ids[0] = 0                                  # a = b = 0: the select's condition fails
    r = build_grad(Y, [X, I], [x, ids], wrt=[X], head=h)

    # by hand: Y[a] reads X.flat[a] where a + 2 I[a] > 0
    taken = np.arange(B) + 2 * ids > 0
    flat = x.reshape(-1)[:B]
    want_y = np.where(taken, np.cos(flat), 0.0)
    want_dx = np.zeros(x.size)
    want_dx[:B] = np.where(taken, -h * np.sin(flat), 0.0)
    # te's sin and cos within 1.4 ulp (test_math_bodies.py), numpy's within
    # one, and one rounded product on each side: 4 eps of the value
    eps = np.finfo(np.float64).eps
    assert np.all(np.abs(r.fwd - want_y) <= 4 * eps * np.abs(want_y))
    for got in r.grads + r.naive:
        assert np.all(np.abs(got.reshape(-1) - want_dx) <= 4 * eps * np.abs(want_dx))

    # central differences of sum(H * Y): each step moves one Y[a]; rounding of
    # the B-term sum over 2 step, truncation step^2 / 6 * |H cos'''|
    fwd = te.build([X, I], [Y])
    step = 1e-6
    (fd,) = numeric_vjp(lambda xv: fwd(xv, ids), [x], h, eps=step)
    tol = 4 * eps * np.abs(h).sum() / (2 * step) + step ** 2 / 6 * np.abs(h).max()
    np.testing.assert_allclose(r.grads[0], fd, rtol=0, atol=tol)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4)), K=st.integers(1, 4),
       B=st.integers(1, 30), c=st.integers(-2, 2), d=st.integers(-3, 3), seed=st.integers(0, 2**16))
def test_key_rows_of_flattened_reads_match_numpy(shape, K, B, c, d, seed):
    """``Y[a] = T[I[a], a]`` with ``T[k, b] = select(b + c·k > d, cos(X.flat[b]), 0)``
    (X read through ``//`` and ``%`` as if flattened) for random shapes,
    conditions and keys: zero elimination with the key substituted equals
    the literal sum (``optimize=False``) and numpy, and builds (every read
    it makes is in range)."""
    P, Q, R = shape
    B = min(B, P * Q * R)
    r = np.random.default_rng(seed)
    X = te.placeholder(shape, F64, "X")
    I = te.placeholder((B,), "int64", "I")
    T = te.compute((K, B), lambda k, b: te.if_then_else(b + c * k > d, te.cos(X[b // (Q * R), b // R % Q, b % R]),
                                                        0.0), name="T")
    Y = te.compute((B,), lambda a: T[I[a], a], name="Y")
    H = te.placeholder((B,), F64, "H")
    (fast,), (slow,) = te.gradient(Y, [X], head=H), te.gradient(Y, [X], head=H, optimize=False)
    x, ids, h = r.uniform(-2, 2, shape), r.integers(0, K, B), r.uniform(-1, 1, B)
    got, want = te.build([X, I, H], [fast, slow])(x, ids, h)
    ref = np.zeros(x.size)
    ref[:B] = np.where(np.arange(B) + c * ids > d, -h * np.sin(x.reshape(-1)[:B]), 0.0)
    # one product of sin (1.4 ulp in te, one in numpy) and H on each side
    bound = 4 * np.finfo(np.float64).eps * np.abs(ref)
    assert np.all(np.abs(got.reshape(-1) - ref) <= bound)
    assert np.all(np.abs(want.reshape(-1) - ref) <= bound)


def test_a_bound_read_under_its_own_select_does_not_narrow_the_gather(rng):
    """clip(X[a - a*b + 12], select(a + b < 6, L[a + b], 0), a): the lower
    bound reads L only where a + b < 6, and is 0 elsewhere; the gradient's
    key (the non-affine index, inverted by a counting sort) must keep the
    points a + b >= 6, where the bound's read never ran."""
    X = te.placeholder((18,), "float64", "X")
    L = te.placeholder((6,), "float64", "L")
    H = te.placeholder((5, 5), "float64", "H")
    Y = te.compute((5, 5), lambda a, b: te.clip(
        X[a - a * b + 12], te.if_then_else(te.all(a + b >= 0, a + b < 6), L[a + b], 0.0), a.astype("float64")),
        name="Y")
    dX, = te.gradient(Y, [X], head=H)
    x, lo, h = rng.standard_normal(18), rng.standard_normal(6), rng.standard_normal((5, 5))
    want = np.zeros(18)
    for a in range(5):
        for b in range(5):
            bound = lo[a + b] if a + b < 6 else 0.0
            if bound < x[a - a * b + 12] < a:
                want[a - a * b + 12] += h[a, b]
    got = te.build([X, L, H], [dX])(x, lo, h)
    # each element sums at most 5 of the h, in some order: 5 roundings of at most sum|h|
    assert np.allclose(got, want, rtol=0, atol=5 * np.finfo(np.float64).eps * np.abs(h).sum())
