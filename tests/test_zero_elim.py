"""Zero elimination on hand-picked programs: the printed formula and the values.

Each case checks what zero elimination should have done to the formula
(``te.pretty``: no reduction left, no ``or`` conditions, a condition kept
where the index is data-dependent) and compares the built gradient with a
numpy reference and with the naive Jacobian-composition sum
(``optimize=False``).  Everything is float64 so the comparison is tight.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import te_autodiff as te
from conftest import conv2d as shared_conv2d

F64 = "float64"


def rand(rng, *shape):
    return rng.standard_normal(shape)


def vjp(rng, out, inputs, values):
    """Optimized and naive VJPs of ``out`` (head H = random), built and run.

    Returns (head array, [optimized arrays], [naive arrays], [gradient tensors])."""
    H = te.placeholder(out.shape, dtype=F64, name="H")
    h = rand(rng, *out.shape)
    opt = te.gradient(out, inputs, head=H)
    naive = te.gradient(out, inputs, head=H, optimize=False)
    got = te.build(list(inputs) + [H], opt + naive)(*values, h)
    got = got if isinstance(got, tuple) else (got,)
    n = len(inputs)
    return h, list(got[:n]), list(got[n:]), opt


def close(a, b):
    return np.allclose(a, b, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- strided, transposed copies


def strided_transpose(n=5, m=4):
    A = te.placeholder((2 * m + 1, n), dtype=F64, name="A")
    B = te.compute((n, m), lambda i, j: A[2 * j + 1, i], name="B")
    return A, B


def test_strided_transposed_copy_formula_has_no_reduction():
    A, B = strided_transpose()
    text = te.pretty(te.gradient(B, [A]))
    assert "sum[" not in text, text


def test_strided_transposed_copy_values(rng):
    A, B = strided_transpose(5, 4)
    a = rand(rng, 9, 5)
    h, (opt,), (naive,), _ = vjp(rng, B, [A], [a])
    ref = np.zeros((9, 5))
    ref[1::2, :] = h.T                    # dA[2j+1, i] = H[i, j]
    assert close(opt, ref) and close(naive, ref)


# --------------------------------------------------------------------------- stencils


def stencil3(n=10):
    A = te.placeholder((n,), dtype=F64, name="A")

    def body(i):
        left = te.if_then_else(i >= 1, A[i - 1], 0.0)
        right = te.if_then_else(i < n - 1, A[i + 1], 0.0)
        return left - 2.0 * A[i] + right
    return A, te.compute((n,), body, name="B")


def test_stencil_formula_has_no_reduction_and_no_or():
    A, B = stencil3()
    text = te.pretty(te.gradient(B, [A]))
    assert "sum[" not in text and " or " not in text, text


def test_stencil_values(rng):
    n = 10
    A, B = stencil3(n)
    h, (opt,), (naive,), _ = vjp(rng, B, [A], [rand(rng, n)])
    ref = -2.0 * h
    ref[:-1] += h[1:]                      # A[p] is the left neighbour of B[p+1]
    ref[1:] += h[:-1]                      # and the right neighbour of B[p-1]
    assert close(opt, ref) and close(naive, ref)


def test_shifted_stencil_without_guards(rng):
    """B[i] = A[i] + 2·A[i+1] + 3·A[i+2] over the interior (A is longer)."""
    n = 9
    A = te.placeholder((n + 2,), dtype=F64, name="A")
    B = te.compute((n,), lambda i: A[i] + 2.0 * A[i + 1] + 3.0 * A[i + 2], name="B")
    h, (opt,), (naive,), (g,) = vjp(rng, B, [A], [rand(rng, n + 2)])
    assert "sum[" not in te.pretty(g)
    ref = np.zeros(n + 2)
    ref[:n] += h
    ref[1:n + 1] += 2 * h
    ref[2:] += 3 * h
    assert close(opt, ref) and close(naive, ref)


# --------------------------------------------------------------------------- transposes of one tensor


def test_sum_with_own_transpose(rng):
    n = 6
    A = te.placeholder((n, n), dtype=F64, name="A")
    B = te.compute((n, n), lambda i, j: A[i, j] + A[j, i], name="B")
    h, (opt,), (naive,), (g,) = vjp(rng, B, [A], [rand(rng, n, n)])
    text = te.pretty(g)
    assert " or " not in text and "sum[" not in text, text
    assert close(opt, h + h.T) and close(naive, h + h.T)


def test_trace_like_product_with_transpose(rng):
    """B[i] = Σ_k A[i,k]·A[k,i]  =>  dA[p,q] = (H[p] + H[q])·A[q,p]."""
    n = 7
    A = te.placeholder((n, n), dtype=F64, name="A")
    k = te.reduce_axis(n, "k")
    B = te.compute((n,), lambda i: te.sum(A[i, k] * A[k, i], axis=k), name="B")
    a = rand(rng, n, n)
    h, (opt,), (naive,), (g,) = vjp(rng, B, [A], [a])
    text = te.pretty(g)
    assert " or " not in text and "sum[" not in text, text
    ref = (h[:, None] + h[None, :]) * a.T
    assert close(opt, ref) and close(naive, ref)


def test_tanh_of_product_with_transpose(rng):
    n = 6
    A = te.placeholder((n, n), dtype=F64, name="A")
    B = te.compute((n, n), lambda i, j: te.tanh(A[i, j] * A[j, i]), name="B")
    a = rand(rng, n, n)
    h, (opt,), (naive,), (g,) = vjp(rng, B, [A], [a])
    assert "sum[" not in te.pretty(g)
    d = h * (1 - np.tanh(a * a.T) ** 2)    # ∂L/∂(A[i,j]·A[j,i])
    ref = d * a.T + d.T * a.T
    assert close(opt, ref) and close(naive, ref)


# --------------------------------------------------------------------------- flatten and reshape with // and %


def test_flatten_with_floordiv_and_mod(rng):
    n, m = 5, 4
    A = te.placeholder((n, m), dtype=F64, name="A")
    B = te.compute((n * m,), lambda t: A[t // m, t % m], name="B")
    h, (opt,), (naive,), (g,) = vjp(rng, B, [A], [rand(rng, n, m)])
    assert "sum[" not in te.pretty(g), te.pretty(g)
    assert close(opt, h.reshape(n, m)) and close(naive, h.reshape(n, m))


def test_flatten_three_dims(rng):
    n, m, p = 3, 4, 5
    A = te.placeholder((n, m, p), dtype=F64, name="A")
    B = te.compute((n * m * p,), lambda t: A[t // (m * p), (t // p) % m, t % p], name="B")
    h, (opt,), (naive,), (g,) = vjp(rng, B, [A], [rand(rng, n, m, p)])
    assert "sum[" not in te.pretty(g), te.pretty(g)
    assert close(opt, h.reshape(n, m, p)) and close(naive, h.reshape(n, m, p))


def test_unflatten(rng):
    n, m = 5, 4
    A = te.placeholder((n * m,), dtype=F64, name="A")
    B = te.compute((n, m), lambda i, j: A[i * m + j], name="B")
    h, (opt,), (naive,), _ = vjp(rng, B, [A], [rand(rng, n * m)])
    assert close(opt, h.reshape(-1)) and close(naive, h.reshape(-1))


def test_shifted_flatten_with_guard(rng):
    """B[t] = A[(t+3) // 4, (t+3) % 4] where that is inside A, else 0."""
    n, m, T = 4, 4, 18
    A = te.placeholder((n, m), dtype=F64, name="A")
    B = te.compute((T,), lambda t: te.if_then_else((t + 3) // m < n, A[(t + 3) // m, (t + 3) % m], 0.0),
                   name="B")
    h, (opt,), (naive,), _ = vjp(rng, B, [A], [rand(rng, n, m)])
    ref = np.zeros(n * m)
    for t in range(T):
        if (t + 3) // m < n:
            ref[t + 3] += h[t]
    assert close(opt, ref.reshape(n, m)) and close(naive, ref.reshape(n, m))


# --------------------------------------------------------------------------- pooling


def test_sum_pool_2x2_stride_2(rng):
    n = 8
    A = te.placeholder((n, n), dtype=F64, name="A")
    di, dj = te.reduce_axis(2, "di"), te.reduce_axis(2, "dj")
    B = te.compute((n // 2, n // 2), lambda i, j: te.sum(A[2 * i + di, 2 * j + dj], axis=[di, dj]), name="B")
    h, (opt,), (naive,), _ = vjp(rng, B, [A], [rand(rng, n, n)])
    ref = np.repeat(np.repeat(h, 2, axis=0), 2, axis=1)
    assert close(opt, ref) and close(naive, ref)


def test_overlapping_avg_pool_3x3_stride_2(rng):
    n, K, S = 9, 3, 2
    out = (n - K) // S + 1
    A = te.placeholder((n, n), dtype=F64, name="A")
    di, dj = te.reduce_axis(K, "di"), te.reduce_axis(K, "dj")
    B = te.compute((out, out), lambda i, j: te.sum(A[S * i + di, S * j + dj], axis=[di, dj]) / 9.0, name="B")
    h, (opt,), (naive,), _ = vjp(rng, B, [A], [rand(rng, n, n)])
    ref = np.zeros((n, n))
    for i, j in itertools.product(range(out), repeat=2):
        ref[S * i:S * i + K, S * j:S * j + K] += h[i, j] / 9.0
    assert close(opt, ref) and close(naive, ref)


def test_max_pool_2x2_stride_2(rng):
    n = 8
    A = te.placeholder((n, n), dtype=F64, name="A")
    di, dj = te.reduce_axis(2, "di"), te.reduce_axis(2, "dj")
    B = te.compute((n // 2, n // 2), lambda i, j: te.max(A[2 * i + di, 2 * j + dj], axis=[di, dj]), name="B")
    a = rand(rng, n, n)
    h, (opt,), (naive,), _ = vjp(rng, B, [A], [a])
    ref = np.zeros((n, n))
    for i, j in itertools.product(range(n // 2), repeat=2):
        win = a[2 * i:2 * i + 2, 2 * j:2 * j + 2]
        di_, dj_ = np.unravel_index(np.argmax(win), win.shape)
        ref[2 * i + di_, 2 * j + dj_] += h[i, j]
    assert close(opt, ref) and close(naive, ref)


# --------------------------------------------------------------------------- convolution


def conv2d(N, C, F, size, K, stride, dilation, pad):
    (X, W), Y = shared_conv2d(N, C, F, size, K, stride, dilation, pad, dtype=F64)
    return X, W, Y


def conv2d_numpy(x, w, h, stride, dilation, pad):
    """Forward and VJP by loops over the padded input."""
    N, C, size, _ = x.shape
    F, _, K, _ = w.shape
    out = (size + 2 * pad - dilation * (K - 1) - 1) // stride + 1
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    y = np.zeros((N, F, out, out))
    dxp, dw = np.zeros_like(xp), np.zeros_like(w)
    for ky, kx in itertools.product(range(K), repeat=2):
        rows = slice(ky * dilation, ky * dilation + stride * (out - 1) + 1, stride)
        cols = slice(kx * dilation, kx * dilation + stride * (out - 1) + 1, stride)
        patch = xp[:, :, rows, cols]                       # N C out out
        y += np.einsum("ncyx,fc->nfyx", patch, w[:, :, ky, kx])
        dw[:, :, ky, kx] += np.einsum("ncyx,nfyx->fc", patch, h)
        dxp[:, :, rows, cols] += np.einsum("nfyx,fc->ncyx", h, w[:, :, ky, kx])
    return y, dxp[:, :, pad:pad + size, pad:pad + size], dw


@pytest.mark.parametrize("stride,dilation,pad", [(1, 1, 1), (2, 2, 1), (2, 1, 0), (3, 2, 2)])
def test_conv2d_stride_dilation_values(rng, stride, dilation, pad):
    N, C, F, size, K = 2, 2, 3, 9, 3
    X, W, Y = conv2d(N, C, F, size, K, stride, dilation, pad)
    x, w = rand(rng, N, C, size, size), rand(rng, F, C, K, K)
    h, (dx, dw), (dx_n, dw_n), _ = vjp(rng, Y, [X, W], [x, w])
    y_ref, dx_ref, dw_ref = conv2d_numpy(x, w, h, stride, dilation, pad)
    assert close(te.build([X, W], [Y])(x, w), y_ref)
    assert close(dx_n, dx_ref) and close(dw_n, dw_ref)
    assert close(dx, dx_ref) and close(dw, dw_ref)


def test_conv2d_stride_2_dilation_2_formula():
    """The data gradient sums over (f, ky, kx) only: y and x are solved."""
    X, W, Y = conv2d(1, 2, 3, 9, 3, 2, 2, 1)
    dX, dW = te.gradient(Y, [X, W])
    text = te.pretty(dX)
    assert "sum[" in text and " or " not in text
    header = text[text.index("sum["):text.index("](")]
    assert " y " not in header and " x " not in header, text


# --------------------------------------------------------------------------- data-dependent indices


def test_gather_with_data_dependent_index(rng):
    n, T = 6, 10
    X = te.placeholder((n,), dtype=F64, name="X")
    I = te.placeholder((T,), dtype="int32", name="I")
    Y = te.compute((T,), lambda t: X[I[t]] * 2.0, name="Y")
    H = te.placeholder((T,), dtype=F64, name="H")
    (g,) = te.gradient(Y, [X], head=H)
    (g_naive,) = te.gradient(Y, [X], head=H, optimize=False)
    text = te.pretty(g)
    # the hit condition I[t] == j became a sum over the positions where it holds (a match sum)
    assert "where int64(I[p0]) == x0" in text and "select(" not in text, text
    idx = rng.integers(0, n, T).astype("int32")
    h = rand(rng, T)
    got, got_naive = te.build([X, I, H], [g, g_naive])(rand(rng, n), idx, h)
    ref = np.zeros(n)
    np.add.at(ref, idx, 2.0 * h)
    assert close(got, ref) and close(got_naive, ref)


def test_gather_rows_with_affine_column(rng):
    n, m, T = 5, 8, 7
    X = te.placeholder((n, m), dtype=F64, name="X")
    I = te.placeholder((T,), dtype="int32", name="I")
    Y = te.compute((T, m // 2), lambda t, j: X[I[t], 2 * j + 1], name="Y")
    H = te.placeholder(Y.shape, dtype=F64, name="H")
    (g,) = te.gradient(Y, [X], head=H)
    idx = rng.integers(0, n, T).astype("int32")
    h = rand(rng, T, m // 2)
    got = te.build([X, I, H], [g])(rand(rng, n, m), idx, h)
    ref = np.zeros((n, m))
    for t in range(T):
        ref[idx[t], 1::2] += h[t]
    assert close(got, ref)


# --------------------------------------------------------------------------- empty regions


def test_term_that_never_hits_is_zero(rng):
    """A read guarded by a condition that is false everywhere contributes nothing."""
    n = 6
    X = te.placeholder((n,), dtype=F64, name="X")
    Y = te.compute((n,), lambda i: X[i] + te.if_then_else(i >= n, X[i - n], 0.0), name="Y")
    h, (opt,), (naive,), (g,) = vjp(rng, Y, [X], [rand(rng, n)])
    assert "sum[" not in te.pretty(g)
    assert close(opt, h) and close(naive, h)


def test_read_whose_target_is_outside_the_input_is_zero(rng):
    """X[b + 5] can only be read where 0 <= b + 5 < 4: never, for b in 0..1; the
    infeasibility shows only with the output's own range (i0 in 0..3)."""
    X = te.placeholder((4,), dtype=F64, name="X")
    Y = te.compute((2, 2), lambda a, b: te.if_then_else(te.any(b + 5 < 0, b + 5 >= 4), 0.0, X[b + 5]),
                   name="Y")
    h, (opt,), (naive,), _ = vjp(rng, Y, [X], [rand(rng, 4)])
    assert close(naive, 0) and close(opt, 0)


def test_disjoint_halves_only_hit_their_own_region(rng):
    """Y[i] = X[2i] for i < 3 and X[2i - 5] after: odd and even elements, nothing else."""
    X = te.placeholder((8,), dtype=F64, name="X")
    Y = te.compute((6,), lambda i: te.if_then_else(i < 3, X[2 * i], X[2 * i - 5]), name="Y")
    h, (opt,), (naive,), _ = vjp(rng, Y, [X], [rand(rng, 8)])
    ref = np.zeros(8)
    for i in range(6):
        ref[2 * i if i < 3 else 2 * i - 5] += h[i]
    assert close(opt, ref) and close(naive, ref)


# --------------------------------------------------------------------------- jacobians


def test_jacobian_of_strided_conv1d_has_the_band_pattern(rng):
    ny, K, S = 5, 3, 2
    nx = S * (ny - 1) + K
    X = te.placeholder((nx,), dtype=F64, name="X")
    W = te.placeholder((K,), dtype=F64, name="W")
    k = te.reduce_axis(K, "k")
    Y = te.compute((ny,), lambda y: te.sum(X[S * y + k] * W[k], axis=k), name="Y")
    JX, JW = te.jacobian(Y, X), te.jacobian(Y, W)
    assert JX.shape == (ny, nx) and JW.shape == (ny, K)
    assert "sum[" not in te.pretty(JX), te.pretty(JX)
    x, w = rand(rng, nx), rand(rng, K)
    jx, jw = te.build([X, W], [JX, JW])(x, w)
    ref_x = np.zeros((ny, nx))
    for y, kk in itertools.product(range(ny), range(K)):
        ref_x[y, S * y + kk] = w[kk]
    assert np.array_equal(jx != 0, ref_x != 0)
    assert close(jx, ref_x)
    assert close(jw, np.array([[x[S * y + kk] for kk in range(K)] for y in range(ny)]))


def test_jacobian_of_strided_conv2d_pattern(rng):
    X, W, Y = conv2d(1, 1, 1, 7, 3, 2, 1, 0)          # out 3x3
    J = te.jacobian(Y, X)
    assert J.shape == (1, 1, 3, 3, 1, 1, 7, 7)
    x, w = rand(rng, 1, 1, 7, 7), rand(rng, 1, 1, 3, 3) + 5.0   # no zero weights
    jac = te.build([X, W], [J])(x, w)
    mask = np.zeros((3, 3, 7, 7), bool)
    for y, xx, ky, kx in itertools.product(range(3), range(3), range(3), range(3)):
        mask[y, xx, 2 * y + ky, 2 * xx + kx] = True
    assert np.array_equal(jac[0, 0, :, :, 0, 0] != 0, mask)
    assert int((jac != 0).sum()) == 9 * 9


def test_jacobian_optimized_equals_naive_on_guarded_shift(rng):
    n = 7
    X = te.placeholder((n,), dtype=F64, name="X")
    Y = te.compute((n,), lambda i: te.if_then_else(i >= 2, X[i - 2] * X[i], 0.0), name="Y")
    from te_autodiff.jacobian import jacobian
    J, Jn = jacobian(Y, X), jacobian(Y, X, optimize=False)
    x = rand(rng, n)
    j, jn = te.build([X], [J, Jn])(x)
    ref = np.zeros((n, n))
    for i in range(2, n):
        ref[i, i - 2] += x[i]
        ref[i, i] += x[i - 2]
    assert close(j, ref) and close(jn, ref)


# --------------------------------------------------------------------------- regressions (property-test finds)


def test_mod_index_with_single_point_reduce_axis(rng):
    """Y[a] = Σ_{r in 0..1} X[(a + r) % 2] for a in 0..3: X[0] is read twice, X[1] once."""
    X = te.placeholder((2,), dtype=F64, name="X")
    r = te.reduce_axis(1, "r")
    Y = te.compute((3,), lambda a: te.sum(X[(a + r) % 2], axis=r), name="Y")
    h, (opt,), (naive,), _ = vjp(rng, Y, [X], [rand(rng, 2)])
    ref = np.array([h[0] + h[2], h[1]])
    assert close(naive, ref)
    assert close(opt, ref)


def test_strided_dilated_window_with_unreachable_elements(rng):
    """Y[y] = Σ_{k<3} X[3y + 2k]: 3y + 2k is never 1 or 9, so X[1] and X[9] get no
    gradient (the solved y = i - 2·((i + 2) // 3) must stay guarded)."""
    X = te.placeholder((11,), dtype=F64, name="X")
    k = te.reduce_axis(3, "k")
    Y = te.compute((3,), lambda y: te.sum(X[3 * y + 2 * k], axis=k), name="Y")
    h, (opt,), (naive,), _ = vjp(rng, Y, [X], [rand(rng, 11)])
    ref = np.zeros(11)
    for y, kk in itertools.product(range(3), range(3)):
        ref[3 * y + 2 * kk] += h[y]
    assert close(naive, ref)
    assert close(opt, ref)


def test_guarded_products_of_neighbours(rng):
    """Y[i] = X[i-1]·X[i] + X[i]·X[i+1] with zero padding: the adjoint of X[i] must
    not read X[i-1] or X[i+1] outside the guards that protect them."""
    n = 6
    X = te.placeholder((n,), dtype=F64, name="X")
    Y = te.compute((n,), lambda i: te.if_then_else(i >= 1, X[i - 1] * X[i], 0.0)
                   + te.if_then_else(i < n - 1, X[i + 1] * X[i], 0.0), name="Y")
    H = te.placeholder((n,), dtype=F64, name="H")
    (g,) = te.gradient(Y, [X], head=H)
    x, h = rand(rng, n), rand(rng, n)
    got = te.build([X, H], [g])(x, h)
    ref = np.zeros(n)
    for i in range(n):
        if i >= 1:
            ref[i - 1] += h[i] * x[i]
            ref[i] += h[i] * x[i - 1]
        if i < n - 1:
            ref[i + 1] += h[i] * x[i]
            ref[i] += h[i] * x[i + 1]
    assert close(got, ref)


def test_naive_gradient_of_guarded_product_builds(rng):
    """The oracle itself (optimize=False) must keep guarded reads under their guard."""
    n = 7
    X = te.placeholder((n,), dtype=F64, name="X")
    Y = te.compute((n,), lambda i: te.if_then_else(i >= 2, X[i - 2] * X[i], 0.0), name="Y")
    (g,) = te.gradient(Y, [X], optimize=False)
    x = rand(rng, n)
    ref = np.zeros(n)
    ref[:n - 2] += x[2:]
    ref[2:] += x[:n - 2]
    assert close(te.build([X], [g])(x), ref)


# --------------------------------------------------------------------------- contradictory guards


SELECT_EDGE_GUARDS = {
    "i - 1 != -1": lambda i: te.not_equal(i - 1, -1),
    "i >= 1": lambda i: i >= 1,
    "not i == 0": lambda i: te.not_(te.equal(i, 0)),
}


@pytest.mark.parametrize("guard", sorted(SELECT_EDGE_GUARDS))
def test_second_order_gradient_through_a_select_edge(rng, guard):
    """Y[i] = cos(select(guard(i), X[i - 1], X[0])) reads X[0] at i = 0 and
    i = 1.  The second-order gradient of sum(dX²) gets, for X[0], the
    adjoint of the select's else branch under the first gradient's own
    guard, ``select(t, select(not t, ...), 0)``: a contradiction, which must
    fold to zero so that zero elimination keeps only i0' = 0 of the sum over
    i0'.  Summed whole, ddX[1] · 0 leaked a NaN of X[1] into ddX[0]."""
    n = 7
    X = te.placeholder((n,), F64, "X")
    Y = te.compute((n,), lambda i: te.cos(te.if_then_else(SELECT_EDGE_GUARDS[guard](i), X[i - 1], X[0])),
                   name="Y")
    H = te.placeholder((n,), F64, "H")
    dX, = te.gradient(Y, [X], head=H)
    S = te.compute((n,), lambda a: dX[a] * dX[a], name="S")
    ddX, ddH = te.gradient(S, [X, H])
    assert "sum[" not in te.pretty([ddX, ddH])
    # dX, ddX and ddH: n elements each, none a sum over another axis
    assert te.cost([X, H], [ddX, ddH])["iterations"] <= 3 * n

    def reference(x, h):
        with np.errstate(invalid="ignore"):         # sin(inf): NaN
            s, c = np.sin(x), np.cos(x)
        dx, ddx, ddh = np.zeros(n), np.zeros(n), np.zeros(n)
        dx[0] = -(h[0] + h[1]) * s[0]
        dx[1:-1] = -h[2:] * s[1:-1]
        ddx[0] = 2 * dx[0] * -(h[0] + h[1]) * c[0]
        ddx[1:-1] = 2 * dx[1:-1] * -h[2:] * c[1:-1]
        ddh[:2] = 2 * dx[0] * -s[0]
        ddh[2:] = 2 * dx[1:-1] * -s[1:-1]
        return ddx, ddh

    f = te.build([X, H], [ddX, ddH])
    x, h = rng.uniform(-2, 2, n), rng.uniform(-1, 1, n)
    # each value is a product of at most six rounded factors (sin and cos
    # within a few ulp) and of H[0] + H[1], which te may sum after the
    # products: an absolute error of a few ulp of |2·(|H0| + |H1|)²| <= 8
    bound = 16 * np.finfo(np.float64).eps
    for got, want in zip(f(x, h), reference(x, h)):
        np.testing.assert_allclose(got, want, rtol=bound, atol=8 * bound)
    te.check_gradient(S, [X, H], [x, h], rtol=1e-6, atol=1e-8)
    x[1] = np.inf                   # NaN in dX[1], ddX[1] and ddH[2] only, as numpy (and torch) give
    got, want = f(x, h), reference(x, h)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g[~np.isnan(w)], w[~np.isnan(w)], rtol=bound, atol=8 * bound)
