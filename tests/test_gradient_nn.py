"""Neural-network programs written in TE: gradients vs hand-written numpy backward passes
and vs the optimize=False oracle (dense, conv, pooling, reshape, softmax, gather, MLP, 2nd order)."""
import itertools

import numpy as np
import pytest

import te_autodiff as te
from conftest import assert_close, build_grad, numeric_vjp, run

F64 = "float64"


def check(out, inputs, values, expected, wrt=None, head=None, rtol=1e-6, atol=1e-9, fwd=None):
    """Gradients (optimized and optimize=False) of ``out`` equal ``expected``; returns the result."""
    r = build_grad(out, inputs, values, wrt=wrt, head=head)
    if fwd is not None:
        assert_close(r.fwd, fwd, rtol=rtol, atol=atol, what="forward")
    assert_close(r.grads, expected, rtol=rtol, atol=atol, what="te.gradient vs numpy")
    assert_close(r.naive, expected, rtol=rtol, atol=atol, what="optimize=False vs numpy")
    return r


# ---------------------------------------------------------------- dense + relu


def dense_relu(X, W, b, name="Y"):
    (n, d), m = X.shape, W.shape[0]
    k = te.reduce_axis(d, "k")
    return te.compute((n, m), lambda i, j: te.maximum(te.sum(X[i, k] * W[j, k], axis=k) + b[j], 0.0), name=name)


def np_dense_relu(x, w, b, h):
    y = x @ w.T + b
    g = h * (y > 0)
    return np.maximum(y, 0), [g @ w, g.T @ x, g.sum(0)]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.aarch64
def test_dense_relu(dtype):
    rng = np.random.default_rng(0)
    X, W, b = te.placeholder((4, 5), dtype, "X"), te.placeholder((3, 5), dtype, "W"), te.placeholder((3,), dtype, "b")
    Y = dense_relu(X, W, b)
    xv, wv, bv, h = rng.standard_normal((4, 5)), rng.standard_normal((3, 5)), rng.standard_normal(3), \
        rng.standard_normal((4, 3))
    vals = [np.asarray(v, dtype).astype(F64) for v in (xv, wv, bv, h)]
    fwd, expected = np_dense_relu(*vals)
    tol = dict(rtol=1e-6, atol=1e-9) if dtype == F64 else dict(rtol=1e-4, atol=1e-4)
    check(Y, [X, W, b], vals[:3], expected, head=vals[3], fwd=fwd, **tol)
    if dtype == F64:
        te.check_gradient(Y, [X, W, b], vals[:3], head=h)


# ---------------------------------------------------------------- conv2d


def conv2d(X, Wt, stride, dilation, pad, inline=False):
    """NCHW conv; padding as a guarded tensor ``Xp`` or inline in the reduction."""
    N, C, H, W = X.shape
    F, _, K, _ = Wt.shape
    OH = (H + 2 * pad - dilation * (K - 1) - 1) // stride + 1
    OW = (W + 2 * pad - dilation * (K - 1) - 1) // stride + 1
    c, kh, kw = te.reduce_axis(C, "c"), te.reduce_axis(K, "kh"), te.reduce_axis(K, "kw")

    def inside(h, w, lo, hi_h, hi_w):
        return te.all(h >= lo, h < hi_h, w >= lo, w < hi_w)

    if inline:
        def body(n, f, y, x):
            h, w = y * stride + kh * dilation - pad, x * stride + kw * dilation - pad
            xv = te.if_then_else(inside(h, w, 0, H, W), X[n, c, h, w], 0.0)
            return te.sum(xv * Wt[f, c, kh, kw], axis=[c, kh, kw])
    else:
        Xp = te.compute((N, C, H + 2 * pad, W + 2 * pad),
                        lambda n, ch, h, w: te.if_then_else(inside(h, w, pad, H + pad, W + pad),
                                                            X[n, ch, h - pad, w - pad], 0.0), name="Xp")

        def body(n, f, y, x):
            return te.sum(Xp[n, c, y * stride + kh * dilation, x * stride + kw * dilation] * Wt[f, c, kh, kw],
                          axis=[c, kh, kw])
    return te.compute((N, F, OH, OW), body, name="conv")


def im2col(xp, K, OH, OW, s, d):
    N, C = xp.shape[:2]
    cols = np.empty((N, C, K, K, OH, OW))
    for kh, kw in itertools.product(range(K), range(K)):
        cols[:, :, kh, kw] = xp[:, :, kh * d:kh * d + s * (OH - 1) + 1:s, kw * d:kw * d + s * (OW - 1) + 1:s]
    return cols


def np_conv(x, w, s, d, p):
    K = w.shape[2]
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    OH = (xp.shape[2] - d * (K - 1) - 1) // s + 1
    OW = (xp.shape[3] - d * (K - 1) - 1) // s + 1
    return np.einsum("nckloq,fckl->nfoq", im2col(xp, K, OH, OW, s, d), w)


def np_conv_backward(x, w, h, s, d, p):
    """(dx, dw) of sum(conv(x, w) * h), scattering the im2col columns back."""
    N, C, H, W = x.shape
    K = w.shape[2]
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    OH, OW = h.shape[2:]
    dw = np.einsum("nfoq,nckloq->fckl", h, im2col(xp, K, OH, OW, s, d))
    dcols = np.einsum("nfoq,fckl->nckloq", h, w)
    dxp = np.zeros_like(xp)
    for kh, kw in itertools.product(range(K), range(K)):
        dxp[:, :, kh * d:kh * d + s * (OH - 1) + 1:s, kw * d:kw * d + s * (OW - 1) + 1:s] += dcols[:, :, kh, kw]
    return [dxp[:, :, p:p + H, p:p + W], dw]


def conv_shapes(s, d, p):
    """Tiny, varied, always-valid shapes for one (stride, dilation, padding)."""
    need = 2 * d + 1 - 2 * p
    N = 1 + (s + d + p) % 2
    H = max(5 + (s + p) % 3, need)
    W = max(5 + (d + 2 * p) % 3, need)
    return (N, 2, H, W), (2, 2, 3, 3)


def test_numpy_conv_reference_against_finite_differences():
    rng = np.random.default_rng(1)
    for s, d, p in [(1, 1, 0), (2, 2, 1), (3, 1, 2), (2, 3, 1)]:
        xs, ws = conv_shapes(s, d, p)
        x, w = rng.standard_normal(xs), rng.standard_normal(ws)
        h = rng.standard_normal(np_conv(x, w, s, d, p).shape)
        assert_close(np_conv_backward(x, w, h, s, d, p),
                     numeric_vjp(lambda a, b: np_conv(a, b, s, d, p), [x, w], h), rtol=1e-6, atol=1e-7)



@pytest.mark.parametrize("stride,dilation,pad", [sdp
                                                 for sdp in itertools.product([1, 2, 3], [1, 2, 3], [0, 1, 2])])
def test_conv2d(stride, dilation, pad):
    xs, ws = conv_shapes(stride, dilation, pad)
    rng = np.random.default_rng(stride * 100 + dilation * 10 + pad)
    X, Wt = te.placeholder(xs, F64, "X"), te.placeholder(ws, F64, "Wt")
    out = conv2d(X, Wt, stride, dilation, pad)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    fwd = np_conv(x, w, stride, dilation, pad)
    assert out.shape == fwd.shape
    h = rng.standard_normal(fwd.shape)
    check(out, [X, Wt], [x, w], np_conv_backward(x, w, h, stride, dilation, pad), head=h, fwd=fwd)


@pytest.mark.parametrize("stride,dilation,pad", [(1, 1, 1), (2, 1, 2), (2, 2, 1), (3, 2, 2)])
@pytest.mark.aarch64
def test_conv2d_inline_padding(stride, dilation, pad):
    xs, ws = conv_shapes(stride, dilation, pad)
    rng = np.random.default_rng(7 + stride + dilation + pad)
    X, Wt = te.placeholder(xs, F64, "X"), te.placeholder(ws, F64, "Wt")
    out = conv2d(X, Wt, stride, dilation, pad, inline=True)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    fwd = np_conv(x, w, stride, dilation, pad)
    h = rng.standard_normal(fwd.shape)
    check(out, [X, Wt], [x, w], np_conv_backward(x, w, h, stride, dilation, pad), head=h, fwd=fwd)


# ---------------------------------------------------------------- pooling


def max_pool(X, K, S):
    N, C, H, W = X.shape
    kh, kw = te.reduce_axis(K, "kh"), te.reduce_axis(K, "kw")
    return te.compute((N, C, (H - K) // S + 1, (W - K) // S + 1),
                      lambda n, c, y, x: te.max(X[n, c, y * S + kh, x * S + kw], axis=[kh, kw]), name="pool")


def np_max_pool_backward(x, h, K, S):
    """Each window's head goes to the first maximum in row-major window order."""
    dx = np.zeros_like(x)
    N, C, OH, OW = h.shape
    for n, c, y, z in itertools.product(range(N), range(C), range(OH), range(OW)):
        win = x[n, c, y * S:y * S + K, z * S:z * S + K]
        a, b = np.unravel_index(np.argmax(win), win.shape)
        dx[n, c, y * S + a, z * S + b] += h[n, c, y, z]
    return dx


def np_max_pool(x, K, S):
    N, C, H, W = x.shape
    OH, OW = (H - K) // S + 1, (W - K) // S + 1
    return np.array([[[[x[n, c, y * S:y * S + K, z * S:z * S + K].max() for z in range(OW)] for y in range(OH)]
                      for c in range(C)] for n in range(N)])


POOL_DATA = {
    "random": lambda rng, s: rng.permutation(np.linspace(-3, 3, int(np.prod(s)))).reshape(s),
    "all_equal": lambda rng, s: np.full(s, 0.5),
    "many_ties": lambda rng, s: rng.integers(0, 3, s).astype(F64),
}


@pytest.mark.parametrize("K,S", [(2, 2), (3, 2)])
@pytest.mark.parametrize("data", list(POOL_DATA))
@pytest.mark.aarch64
def test_max_pool(K, S, data):
    rng = np.random.default_rng(K + S)
    shape = (2, 2, 7, 6)
    X = te.placeholder(shape, F64, "X")
    out = max_pool(X, K, S)
    x = POOL_DATA[data](rng, shape)
    h = rng.standard_normal(out.shape)
    check(out, [X], [x], [np_max_pool_backward(x, h, K, S)], head=h, fwd=np_max_pool(x, K, S))
    if data == "random":
        te.check_gradient(out, [X], [x], head=h)


def test_max_pool_tie_goes_to_first_element_of_window():
    X = te.placeholder((1, 1, 2, 2), F64, "X")
    out = max_pool(X, 2, 2)
    x = np.array([[[[1.0, 3.0], [3.0, 3.0]]]])
    r = build_grad(out, [X], [x], head=np.array([[[[5.0]]]]))
    expected = np.array([[[[0.0, 5.0], [0.0, 0.0]]]])
    assert_close(r.grads, [expected])
    assert_close(r.naive, [expected])


@pytest.mark.parametrize("K,S", [(2, 2), (3, 1)])
@pytest.mark.aarch64
def test_avg_pool(K, S):
    rng = np.random.default_rng(11)
    shape = (1, 2, 6, 5)
    X = te.placeholder(shape, F64, "X")
    kh, kw = te.reduce_axis(K, "kh"), te.reduce_axis(K, "kw")
    OH, OW = (shape[2] - K) // S + 1, (shape[3] - K) // S + 1
    out = te.compute((1, 2, OH, OW),
                     lambda n, c, y, x: te.sum(X[n, c, y * S + kh, x * S + kw], axis=[kh, kw]) / float(K * K),
                     name="avg")
    x, h = rng.standard_normal(shape), rng.standard_normal((1, 2, OH, OW))
    dx = np.zeros(shape)
    fwd = np.zeros((1, 2, OH, OW))
    for y, z in itertools.product(range(OH), range(OW)):
        dx[:, :, y * S:y * S + K, z * S:z * S + K] += h[:, :, y:y + 1, z:z + 1] / K ** 2
        fwd[:, :, y, z] = x[:, :, y * S:y * S + K, z * S:z * S + K].mean((2, 3))
    check(out, [X], [x], [dx], head=h, fwd=fwd)


# ---------------------------------------------------------------- reshape


def flatten(X):
    N, C, H, W = X.shape
    return te.compute((N, C * H * W), lambda n, q: X[n, q // (H * W), (q // W) % H, q % W], name="flat")


@pytest.mark.aarch64
def test_flatten_then_dense():
    rng = np.random.default_rng(12)
    X, V = te.placeholder((2, 3, 2, 4), F64, "X"), te.placeholder((5, 24), F64, "V")
    F = flatten(X)
    q = te.reduce_axis(24, "q")
    out = te.compute((2, 5), lambda n, m: te.sum(F[n, q] * V[m, q], axis=q), name="out")
    x, v, h = rng.standard_normal((2, 3, 2, 4)), rng.standard_normal((5, 24)), rng.standard_normal((2, 5))
    fwd = x.reshape(2, -1) @ v.T
    check(out, [X, V], [x, v], [(h @ v).reshape(x.shape), h.T @ x.reshape(2, -1)], head=h, fwd=fwd)


def test_flatten_unflatten_roundtrip():
    rng = np.random.default_rng(13)
    X = te.placeholder((2, 3, 2, 4), F64, "X")
    T = te.compute((2, 24), lambda n, q: te.tanh(flatten(X)[n, q]), name="T")
    G = te.compute((2, 3, 2, 4), lambda n, c, y, z: T[n, c * 8 + y * 4 + z], name="G")
    out = te.compute((2, 3, 2, 4), lambda n, c, y, z: G[n, c, y, z] * X[n, c, y, z], name="out")
    x, h = rng.standard_normal((2, 3, 2, 4)), rng.standard_normal((2, 3, 2, 4))
    t = np.tanh(x)
    check(out, [X], [x], [h * (t + x * (1 - t ** 2))], head=h, fwd=t * x)


def test_reshape_2d_to_3d_with_div_mod():
    rng = np.random.default_rng(14)
    X = te.placeholder((4, 6), F64, "X")
    out = te.compute((3, 8), lambda a, b: X[(a * 8 + b) // 6, (a * 8 + b) % 6] * (b + 1).astype(F64),
                     name="out")
    x, h = rng.standard_normal((4, 6)), rng.standard_normal((3, 8))
    scale = np.tile(np.arange(1.0, 9.0), (3, 1))
    check(out, [X], [x], [(h * scale).reshape(4, 6)], head=h, fwd=x.reshape(3, 8) * scale)


def test_rotate_by_modulo_with_head():
    """Y[d] = X[(d + 1) % 3], gradient with a head (the loop bounds are floor divisions)."""
    X = te.placeholder((3,), F64, "X")
    Y = te.compute((3,), lambda d: X[(d + 1) % 3], name="Y")
    h = np.array([1.0, 2.0, 3.0])
    check(Y, [X], [np.zeros(3)], [np.roll(h, 1)], head=h)


# ---------------------------------------------------------------- softmax


def softmax_graph(X):
    """Separate tensors: m = max, e = exp(x - m), s = sum e; softmax and log-softmax."""
    N, M = X.shape
    k1, k2 = te.reduce_axis(M, "k"), te.reduce_axis(M, "k")
    m = te.compute((N,), lambda i: te.max(X[i, k1], axis=k1), name="m")
    e = te.compute((N, M), lambda i, j: te.exp(X[i, j] - m[i]), name="e")
    s = te.compute((N,), lambda i: te.sum(e[i, k2], axis=k2), name="s")
    sm = te.compute((N, M), lambda i, j: e[i, j] / s[i], name="softmax")
    ls = te.compute((N, M), lambda i, j: X[i, j] - m[i] - te.log(s[i]), name="log_softmax")
    return sm, ls


def softmax_fused(X):
    """One compute per output, the reductions nested in the body (and one inside another)."""
    N, M = X.shape

    def rowmax(i):
        k = te.reduce_axis(M, "k")
        return te.max(X[i, k], axis=k)

    def denom(i):
        k = te.reduce_axis(M, "k")
        return te.sum(te.exp(X[i, k] - rowmax(i)), axis=k)

    sm = te.compute((N, M), lambda i, j: te.exp(X[i, j] - rowmax(i)) / denom(i), name="softmax")
    ls = te.compute((N, M), lambda i, j: X[i, j] - rowmax(i) - te.log(denom(i)), name="log_softmax")
    return sm, ls


def softmax_data(rng):
    x = rng.standard_normal((3, 5)) * 2
    x[1, 1] = x[1, 3] = x[1].max() + 1.0      # a tie for the row maximum
    return x


@pytest.mark.parametrize("form", [softmax_graph, softmax_fused])
@pytest.mark.aarch64
def test_softmax(form):
    rng = np.random.default_rng(15)
    X = te.placeholder((3, 5), F64, "X")
    sm, _ = form(X)
    x, h = softmax_data(rng), rng.standard_normal((3, 5))
    p = np.exp(x - x.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    check(sm, [X], [x], [p * (h - (h * p).sum(1, keepdims=True))], head=h, fwd=p)


@pytest.mark.parametrize("form", [softmax_graph, softmax_fused])
@pytest.mark.aarch64
def test_log_softmax(form):
    rng = np.random.default_rng(16)
    X = te.placeholder((3, 5), F64, "X")
    _, ls = form(X)
    x, h = softmax_data(rng), rng.standard_normal((3, 5))
    p = np.exp(x - x.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    check(ls, [X], [x], [h - p * h.sum(1, keepdims=True)], head=h, fwd=np.log(p))


@pytest.mark.aarch64
def test_softmax_check_gradient():
    rng = np.random.default_rng(17)
    X = te.placeholder((2, 4), F64, "X")
    sm, ls = softmax_fused(X)
    x = rng.standard_normal((2, 4))
    te.check_gradient(sm, [X], [x], head=rng.standard_normal((2, 4)))
    te.check_gradient(ls, [X], [x], head=rng.standard_normal((2, 4)))


# ---------------------------------------------------------------- concat / split


@pytest.mark.aarch64
def test_concatenate_and_split():
    rng = np.random.default_rng(18)
    A, B = te.placeholder((3, 4), F64, "A"), te.placeholder((2, 4), F64, "B")
    C = te.compute((5, 4), lambda i, j: te.if_then_else(i < 3, A[i, j], B[i - 3, j]), name="concat0")
    T = te.compute((5, 4), lambda i, j: te.tanh(C[i, j]), name="T")
    P = te.compute((2, 4), lambda i, j: T[i, j], name="P")               # split: rows 0..1
    Q = te.compute((3, 4), lambda i, j: T[i + 2, j], name="Q")           # split: rows 2..4
    D = te.compute((2, 7), lambda i, j: te.if_then_else(j < 4, P[i, j], Q[i + 1, j - 4] * 2.0), name="concat1")
    a, b, h = rng.standard_normal((3, 4)), rng.standard_normal((2, 4)), rng.standard_normal((2, 7))
    t = np.tanh(np.concatenate([a, b]))
    fwd = np.concatenate([t[:2], 2 * t[3:5, :3]], axis=1)
    gt = np.zeros((5, 4))
    gt[:2] += h[:, :4]
    gt[3:5, :3] += 2 * h[:, 4:]
    gc = gt * (1 - t ** 2)
    check(D, [A, B], [a, b], [gc[:3], gc[3:]], head=h, fwd=fwd)


# ---------------------------------------------------------------- gather


@pytest.mark.parametrize("idx_dtype", ["int32", "int64"])
@pytest.mark.aarch64
def test_gather_accumulates_repeated_indices(idx_dtype):
    rng = np.random.default_rng(19)
    T, I = te.placeholder((5, 3), F64, "T"), te.placeholder((7,), idx_dtype, "I")
    out = te.compute((7, 3), lambda n, d: T[I[n], d] * T[I[n], d] + T[I[n], 0] * 3.0, name="out")
    t, idx, h = rng.standard_normal((5, 3)), np.array([4, 0, 4, 2, 4, 0, 1], idx_dtype), rng.standard_normal((7, 3))
    dt = np.zeros((5, 3))
    np.add.at(dt, idx, 2 * t[idx] * h)
    np.add.at(dt[:, 0], idx, 3.0 * h.sum(1))
    r = check(out, [T, I], [t, idx], [dt], wrt=[T], head=h, fwd=t[idx] ** 2 + 3.0 * t[idx][:, :1])
    assert r.grads[0].dtype == np.float64


@pytest.mark.aarch64
def test_embedding_bag_sum():
    rng = np.random.default_rng(20)
    T, I = te.placeholder((6, 2), F64, "T"), te.placeholder((3, 4), "int64", "I")
    l = te.reduce_axis(4, "l")
    out = te.compute((3, 2), lambda b, d: te.sum(T[I[b, l], d], axis=l), name="bag")
    t, idx, h = rng.standard_normal((6, 2)), rng.integers(0, 6, (3, 4)), rng.standard_normal((3, 2))
    idx[0] = [1, 1, 1, 5]
    dt = np.zeros((6, 2))
    for b, j in itertools.product(range(3), range(4)):
        dt[idx[b, j]] += h[b]
    check(out, [T, I], [t, idx], [dt], wrt=[T], head=h, fwd=t[idx].sum(1))


# ---------------------------------------------------------------- residual block, shared weight


@pytest.mark.aarch64
def test_residual_block_twice_shared_weight():
    rng = np.random.default_rng(21)
    B, D = 2, 4
    X, W = te.placeholder((B, D), F64, "X"), te.placeholder((D, D), F64, "W")

    def block(Z, name):
        k = te.reduce_axis(D, "k")
        return te.compute((B, D), lambda b, i: Z[b, i] + te.tanh(te.sum(W[i, k] * Z[b, k], axis=k)), name=name)

    Y = block(block(X, "Y1"), "Y2")
    x, w, h = rng.standard_normal((B, D)), rng.standard_normal((D, D)) * 0.5, rng.standard_normal((B, D))
    a1 = np.tanh(x @ w.T)
    y1 = x + a1
    a2 = np.tanh(y1 @ w.T)
    gz2 = h * (1 - a2 ** 2)
    gy1 = h + gz2 @ w
    gz1 = gy1 * (1 - a1 ** 2)
    dw = gz2.T @ y1 + gz1.T @ x
    dx = gy1 + gz1 @ w
    check(Y, [X, W], [x, w], [dx, dw], head=h, fwd=y1 + a2)
    te.check_gradient(Y, [X, W], [x, w], head=h)


# ---------------------------------------------------------------- MLP + softmax cross-entropy


def mlp_loss(X, W1, b1, W2, b2, L, label_mode):
    N, D = X.shape
    Hd, C = W1.shape[0], W2.shape[0]
    k1, k2 = te.reduce_axis(D, "k"), te.reduce_axis(Hd, "k")
    h1 = te.compute((N, Hd), lambda i, j: te.tanh(te.sum(X[i, k1] * W1[j, k1], axis=k1) + b1[j]), name="h1")
    z = te.compute((N, C), lambda i, j: te.sum(h1[i, k2] * W2[j, k2], axis=k2) + b2[j], name="logits")
    c1, c2 = te.reduce_axis(C, "c"), te.reduce_axis(C, "c")
    m = te.compute((N,), lambda i: te.max(z[i, c1], axis=c1), name="m")
    lse = te.compute((N,), lambda i: m[i] + te.log(te.sum(te.exp(z[i, c2] - m[i]), axis=c2)), name="lse")
    if label_mode == "onehot":
        c3 = te.reduce_axis(C, "c")
        picked = te.compute((N,), lambda i: te.sum(te.if_then_else(te.equal(c3, L[i]), z[i, c3], 0.0), axis=c3),
                            name="picked")
    else:
        picked = te.compute((N,), lambda i: z[i, L[i]], name="picked")
    r = te.reduce_axis(N, "r")
    return te.compute((1,), lambda _: te.sum(lse[r] - picked[r], axis=r) / float(N), name="loss")


def np_mlp(x, w1, b1, w2, b2, lab):
    N = x.shape[0]
    h1 = np.tanh(x @ w1.T + b1)
    z = h1 @ w2.T + b2
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    loss = -np.log(p[np.arange(N), lab]).mean()
    gz = p.copy()
    gz[np.arange(N), lab] -= 1
    gz /= N
    gh = gz @ w2 * (1 - h1 ** 2)
    return np.array([loss]), [gh @ w1, gh.T @ x, gh.sum(0), gz.T @ h1, gz.sum(0)]


@pytest.mark.parametrize("label_mode", ["onehot", "gather"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.aarch64
def test_mlp_softmax_cross_entropy(label_mode, dtype):
    rng = np.random.default_rng(22)
    N, D, Hd, C = 4, 3, 5, 3
    shapes = [(N, D), (Hd, D), (Hd,), (C, Hd), (C,)]
    params = [te.placeholder(s, dtype, n) for s, n in zip(shapes, ["X", "W1", "b1", "W2", "b2"])]
    L = te.placeholder((N,), "int32", "L")
    loss = mlp_loss(*params, L, label_mode)
    vals = [np.asarray(rng.standard_normal(s), dtype).astype(F64) for s in shapes]
    lab = np.array([0, 2, 1, 2], np.int32)
    fwd, expected = np_mlp(*vals, lab)
    tol = dict(rtol=1e-6, atol=1e-9) if dtype == F64 else dict(rtol=1e-4, atol=1e-5)
    check(loss, params + [L], vals + [lab], expected, wrt=params, fwd=fwd, **tol)


@pytest.mark.aarch64
def test_mlp_check_gradient():
    rng = np.random.default_rng(23)
    N, D, Hd, C = 3, 2, 3, 3
    shapes = [(N, D), (Hd, D), (Hd,), (C, Hd), (C,)]
    params = [te.placeholder(s, F64, n) for s, n in zip(shapes, ["X", "W1", "b1", "W2", "b2"])]
    L = te.placeholder((N,), "int64", "L")
    loss = mlp_loss(*params, L, "onehot")
    vals = [rng.standard_normal(s) for s in shapes]
    lab = np.array([2, 0, 1])
    grads = te.check_gradient(loss, params + [L], vals + [lab])
    assert_close(grads[:5], np_mlp(*vals, lab)[1])
    assert not np.any(grads[5])


# ---------------------------------------------------------------- second order


def test_second_derivative_of_cube():
    X = te.placeholder((6,), F64, "X")
    Y = te.compute((6,), lambda i: X[i] ** 3, name="Y")
    for opt in (True, False):
        g, = te.gradient(Y, [X], optimize=opt)
        gg, = te.gradient(g, [X], optimize=opt)
        x = np.array([-2.0, -0.5, 0.25, 1.0, 1.5, 3.0])
        gv, ggv = run([X], [g, gg], [x])
        assert_close([gv, ggv], [3 * x ** 2, 6 * x])


def test_second_derivative_through_a_reduction():
    """d/dx of sum_i (d/dx sum_i x_i^3) where the first gradient flows through a sum."""
    X = te.placeholder((4,), F64, "X")
    k = te.reduce_axis(4, "k")
    S = te.compute((1,), lambda _: te.sum(X[k] * X[k] * X[k], axis=k), name="S")
    g, = te.gradient(S, [X])
    gg, = te.gradient(g, [X])
    x = np.array([-1.0, 0.5, 2.0, 3.0])
    gv, ggv = run([X], [g, gg], [x])
    assert_close([gv, ggv], [3 * x ** 2, 6 * x])


def _tanh_layer_sum(X, W):
    n, d = W.shape
    k = te.reduce_axis(d, "k")
    return te.compute((n,), lambda i: te.tanh(te.sum(W[i, k] * X[k], axis=k)), name="T")


@pytest.mark.aarch64
def test_hessian_vector_product():
    rng = np.random.default_rng(24)
    n, d = 3, 4
    X, W, V = te.placeholder((d,), F64, "X"), te.placeholder((n, d), F64, "W"), te.placeholder((d,), F64, "V")
    T = _tanh_layer_sum(X, W)
    g, = te.gradient(T, [X])                        # W^T (1 - t^2)
    hv, = te.gradient(g, [X], head=V)               # H v (H symmetric)
    hv_naive, = te.gradient(te.gradient(T, [X], optimize=False)[0], [X], head=V, optimize=False)
    k = te.reduce_axis(d, "k")
    gdotv = te.compute((1,), lambda _: te.sum(g[k] * V[k], axis=k), name="gv")
    hv2, = te.gradient(gdotv, [X])
    x, w, v = rng.standard_normal(d), rng.standard_normal((n, d)), rng.standard_normal(d)
    outs = run([X, W, V], [g, hv, hv_naive, hv2], [x, w, v])
    t = np.tanh(w @ x)
    hess = w.T @ np.diag(-2 * t * (1 - t ** 2)) @ w
    assert_close(outs, [w.T @ (1 - t ** 2), hess @ v, hess @ v, hess @ v])
    grad_np = lambda xx: w.T @ (1 - np.tanh(w @ xx) ** 2)  # noqa: E731
    assert_close(numeric_vjp(grad_np, [x], v), [hess @ v], rtol=1e-6, atol=1e-8)
    te.check_gradient(g, [X, W], [x, w], head=v)


def test_mixed_second_derivative():
    rng = np.random.default_rng(25)
    X, Y, V = te.placeholder((5,), F64, "X"), te.placeholder((5,), F64, "Y"), te.placeholder((5,), F64, "V")
    F = te.compute((5,), lambda i: X[i] * X[i] * Y[i], name="F")
    gx, = te.gradient(F, [X])                       # 2 x y
    ddx, ddy = te.gradient(gx, [X, Y], head=V)      # 2 y v, 2 x v
    x, y, v = rng.standard_normal(5), rng.standard_normal(5), rng.standard_normal(5)
    outs = run([X, Y, V], [gx, ddx, ddy], [x, y, v])
    assert_close(outs, [2 * x * y, 2 * y * v, 2 * x * v])


@pytest.mark.parametrize("k", [10, 100])        # positions in int64, then in int32 (lowering.positions)
def test_kmeans_newton_direction_sums_each_centroids_own_points(rng, k):
    """f = Σ_i min_j |C_j - P_i|² (GradBench's kmeans): J = ∂f/∂C and the
    diagonal of the Hessian H = ∂(Σ J)/∂C sum, for each centroid, the points
    whose nearest it is (an inverse index of the argmin), not every point;
    the derivative of the argmin's one-hot is zero and folds away."""
    n, d = 300, 4
    P = te.placeholder((n, d), "float64", "P")
    C = te.placeholder((k, d), "float64", "C")
    e = te.reduce_axis(d, "e")
    dist = te.compute((n, k), lambda i, j: te.sum((C[j, e] - P[i, e]) * (C[j, e] - P[i, e]), axis=e), name="dist")
    j = te.reduce_axis(k, "j")
    closest = te.compute((n,), lambda i: te.min(dist[i, j], axis=j), name="closest")
    i = te.reduce_axis(n, "i")
    f = te.compute((1,), lambda _: te.sum(closest[i], axis=i), name="f")
    J, = te.gradient(f, [C])
    H, = te.gradient(J, [C])
    forward = te.cost([P, C], [f])["iterations"]
    both = te.cost([P, C], [J, H])["iterations"]
    # the forward again, the argmin (n·k), a counting sort (~2n + k) and two sums over each centroid's points
    assert both <= forward + n * k + 4 * (n * d + k * d + n + k), (both, forward)
    p = rng.standard_normal((n, d))
    c = p[rng.choice(n, k, replace=False)] + 0.01 * rng.standard_normal((k, d))
    got_j, got_h = te.build([P, C], [J, H])(p, c)
    owner = ((p[:, None] - c[None]) ** 2).sum(-1).argmin(1)
    want_j = np.zeros((k, d))
    np.add.at(want_j, owner, 2 * (c[owner] - p))
    want_h = np.repeat(2.0 * np.bincount(owner, minlength=k)[:, None], d, axis=1)
    magnitude = np.zeros((k, d))
    np.add.at(magnitude, owner, np.abs(2 * (c[owner] - p)))
    bound = n * np.finfo(np.float64).eps * magnitude        # a sum of n terms in any order
    assert np.all(np.abs(got_j - want_j) <= bound)
    np.testing.assert_array_equal(got_h, want_h)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gelu_dense_layer_matches_torch(dtype):
    """A dense layer with exact GELU, ``0.5 z (1 + erf(z / sqrt 2))``, and its
    gradients with respect to X, W and b against torch.nn.functional.gelu
    (approximate='none') and autograd on the same data; the tolerances are
    a few ulp of the dtype times the sums' lengths."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(41)
    n, d, m = 16, 48, 24
    X, W, b, H = (rng.standard_normal(s).astype(dtype) for s in ((n, d), (m, d), (m,), (n, m)))
    W *= d ** -0.5
    PX, PW, Pb = te.placeholder((n, d), dtype, "X"), te.placeholder((m, d), dtype, "W"), te.placeholder((m,), dtype, "b")
    k = te.reduce_axis(d, "k")
    Z = te.compute((n, m), lambda i, j: te.sum(PX[i, k] * PW[j, k], axis=k) + Pb[j], name="Z")
    Y = te.compute((n, m), lambda i, j: 0.5 * Z[i, j] * (1.0 + te.erf(Z[i, j] * float(np.sqrt(0.5)))), name="Y")
    PH = te.placeholder((n, m), dtype, "H")
    got = te.build([PX, PW, Pb, PH], [Y] + te.gradient(Y, [PX, PW, Pb], head=PH))(X, W, b, H)
    tX, tW, tb = (torch.tensor(a, requires_grad=True) for a in (X, W, b))
    tY = torch.nn.functional.gelu(torch.nn.functional.linear(tX, tW, tb), approximate="none")
    want = [tY] + list(torch.autograd.grad(tY, [tX, tW, tb], torch.tensor(H)))
    tol = 64 * np.finfo(dtype).eps
    for g, w in zip(got, want):
        w = w.detach().numpy()
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * np.abs(w).max())
