"""te.scan: recurrences over time (SPEC "Recurrences").  Forward values
against numpy loops; gradients (a reverse scan) against finite differences
(te.check_gradient) and against PyTorch autograd on the same model; several
states (an LSTM's h and c), k > 1 initial steps, a scan reading a scan,
second order; the lowered program is one loop over time whose size does not
depend on the number of steps; te.cost counts steps x body; bad input."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import te_autodiff as te

F64 = "float64"


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def normal(rng, *shape, scale=0.5):
    return rng.standard_normal(shape) * scale


# ------------------------------------------------------------------ models


def elman(T, B, H, I, dtype=F64):
    """h_t = tanh(h_{t-1} Wᵀ + x_t Uᵀ) from a given h_0 (time 0 of the state)."""
    X = te.placeholder((T, B, I), dtype, name="X")
    W = te.placeholder((H, H), dtype, name="W")
    U = te.placeholder((H, I), dtype, name="U")
    h0 = te.placeholder((1, B, H), dtype, name="h0")
    S = te.placeholder((T, B, H), dtype, name="S")
    j, q = te.reduce_axis(H, "j"), te.reduce_axis(I, "q")
    h = te.compute((T, B, H), lambda t, b, i: te.tanh(te.sum(S[t - 1, b, j] * W[i, j], axis=j)
                                                      + te.sum(X[t, b, q] * U[i, q], axis=q)), name="h")
    return [X, W, U, h0], te.scan(h0, h, S, inputs=[X], name="hs")


def elman_numpy(x, w, u, h0):
    out = np.zeros(x.shape[:2] + (w.shape[0],))
    out[0] = h0[0]
    for t in range(1, len(x)):
        out[t] = np.tanh(out[t - 1] @ w.T + x[t] @ u.T)
    return out


def lstm(T, B, H, I, dtype=F64):
    """An LSTM cell: gates from x_t and h_{t-1}; states h and c."""
    X = te.placeholder((T, B, I), dtype, name="X")
    W = te.placeholder((4 * H, I), dtype, name="W")
    R = te.placeholder((4 * H, H), dtype, name="R")
    h0 = te.placeholder((1, B, H), dtype, name="h0")
    c0 = te.placeholder((1, B, H), dtype, name="c0")
    Sh = te.placeholder((T, B, H), dtype, name="Sh")
    Sc = te.placeholder((T, B, H), dtype, name="Sc")
    q, j = te.reduce_axis(I, "q"), te.reduce_axis(H, "j")
    gates = te.compute((T, B, 4 * H), lambda t, b, g: te.sum(X[t, b, q] * W[g, q], axis=q)
                       + te.sum(Sh[t - 1, b, j] * R[g, j], axis=j), name="gates")
    c = te.compute((T, B, H), lambda t, b, i: te.sigmoid(gates[t, b, H + i]) * Sc[t - 1, b, i]
                   + te.sigmoid(gates[t, b, i]) * te.tanh(gates[t, b, 2 * H + i]), name="c")
    h = te.compute((T, B, H), lambda t, b, i: te.sigmoid(gates[t, b, 3 * H + i]) * te.tanh(c[t, b, i]),
                   name="h")
    Yh, Yc = te.scan([h0, c0], [h, c], [Sh, Sc], inputs=[X], name="lstm")
    return [X, W, R, h0, c0], Yh, Yc


def lstm_numpy(x, w, r, h0, c0):
    H = r.shape[1]
    hs, cs = np.zeros(x.shape[:2] + (H,)), np.zeros(x.shape[:2] + (H,))
    hs[0], cs[0] = h0[0], c0[0]
    for t in range(1, len(x)):
        g = x[t] @ w.T + hs[t - 1] @ r.T
        cs[t] = sigmoid(g[:, H:2 * H]) * cs[t - 1] + sigmoid(g[:, :H]) * np.tanh(g[:, 2 * H:3 * H])
        hs[t] = sigmoid(g[:, 3 * H:]) * np.tanh(cs[t])
    return hs, cs


def two_back(T, n):
    """k = 2: S[t] = a * S[t-1] - 0.3 sin(S[t-2]) + X[t], from S[0:2] = X[0:2] / 2."""
    X = te.placeholder((T, n), F64, name="X")
    a = te.placeholder((n,), F64, name="a")
    S = te.placeholder((T, n), F64, name="S")
    init = te.compute((2, n), lambda t, i: X[t, i] * 0.5, name="init")
    upd = te.compute((T, n), lambda t, i: a[i] * S[t - 1, i] - 0.3 * te.sin(S[t - 2, i]) + X[t, i], name="upd")
    return [X, a], te.scan(init, upd, S, inputs=[X], name="Y")


def two_back_numpy(x, a):
    out = np.zeros_like(x)
    out[:2] = x[:2] * 0.5
    for t in range(2, len(x)):
        out[t] = a * out[t - 1] - 0.3 * np.sin(out[t - 2]) + x[t]
    return out


def run(inputs, outputs, values):
    return te.build(inputs, outputs)(*[np.asarray(v, t.dtype) for v, t in zip(values, inputs)])


# ----------------------------------------------------------------- forward


@pytest.mark.aarch64
def test_spec_example_forward_and_gradient(rng):
    m, n = 64, 8
    X = te.placeholder((m, n), name="X")
    S = te.placeholder((m, n), name="S")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    update = te.compute((m, n), lambda t, i: te.tanh(S[t - 1, i] * 0.5 + X[t, i]), name="update")
    Y = te.scan(init, update, S, inputs=[X], name="Y")
    assert Y.shape == (m, n) and Y.dtype == "float32" and Y.name == "Y"
    x = normal(rng, m, n).astype("float32")
    ref = np.zeros_like(x)
    ref[0] = x[0]
    for t in range(1, m):
        ref[t] = np.tanh(ref[t - 1] * 0.5 + x[t])
    np.testing.assert_allclose(te.build([X], [Y])(x), ref, rtol=1e-5, atol=1e-6)
    dX, = te.gradient(Y, [X])
    assert dX.shape == X.shape
    te.check_gradient(Y, [X], [x.astype(F64)])


@pytest.mark.aarch64
def test_elman_forward_matches_numpy_loop(rng):
    ins, Y = elman(7, 3, 5, 4)
    values = [normal(rng, *t.shape) for t in ins]
    np.testing.assert_allclose(run(ins, [Y], values), elman_numpy(*values), rtol=1e-12, atol=1e-12)


@pytest.mark.aarch64
def test_k2_forward_matches_numpy_loop(rng):
    ins, Y = two_back(12, 3)
    values = [normal(rng, 12, 3, scale=1.0), normal(rng, 3)]
    np.testing.assert_allclose(run(ins, [Y], values), two_back_numpy(*values), rtol=1e-12, atol=1e-12)


@pytest.mark.aarch64
def test_lstm_two_states_forward(rng):
    ins, Yh, Yc = lstm(6, 3, 4, 5)
    values = [normal(rng, *t.shape) for t in ins]
    yh, yc = run(ins, [Yh, Yc], values)
    rh, rc = lstm_numpy(*values)
    np.testing.assert_allclose(yh, rh, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(yc, rc, rtol=1e-12, atol=1e-12)
    # one state alone: the other still runs, in a temporary
    np.testing.assert_allclose(run(ins, [Yh], values), rh, rtol=1e-12, atol=1e-12)


@pytest.mark.aarch64
def test_scan_read_by_compute_and_by_scan(rng):
    T, n = 9, 3
    ins, Y = two_back(T, n)
    X, a = ins
    S2 = te.placeholder((T,), F64, name="S2")
    z0 = te.compute((1,), lambda _: te.const(0.0, F64), name="z0")
    r = te.reduce_axis(n, "r")
    zu = te.compute((T,), lambda t: te.tanh(S2[t - 1] + te.sum(Y[t, r] * a[r], axis=r)), name="zu")
    Z = te.scan(z0, zu, S2, name="Z")
    twice = te.compute((T, n), lambda t, i: Y[t, i] * 2.0, name="twice")
    x, av = normal(rng, T, n, scale=1.0), normal(rng, n)
    z, tw = run([X, a], [Z, twice], [x, av])
    y = two_back_numpy(x, av)
    ref = np.zeros(T)
    for t in range(1, T):
        ref[t] = np.tanh(ref[t - 1] + y[t] @ av)
    np.testing.assert_allclose(z, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tw, 2 * y, rtol=1e-12)


def test_pretty_shows_the_scan_and_its_reverse():
    ins, Y = elman(5, 2, 3, 2)
    text = te.pretty(Y)
    assert "scan hs over t in 0..5:\n    S[t] = h0[t] for t < 1, then h[t]    (state hs)" in text
    assert "    h[t, b, i] = tanh(sum[j in 0..3](S[t - 1, b, j] * W[i, j])" in text
    assert "hs = state S of scan hs" in text
    dW, = te.gradient(Y, [ins[1]])
    back = te.pretty(dW)
    assert "scan hs.back over t in 0..5:" in back                       # the reverse scan
    assert "adj_S[t] = dhs.last[t] for t < 1, then dhs.step[t]" in back   # its state: λ from the last step back
    assert "dW[i0, i1] = sum[t in 0..4, b in 0..2](dh.r1[t, b, i0] * hs[" in back   # summed over time


@pytest.mark.aarch64
def test_no_update_step_and_an_integer_state(rng):
    """k = T: the result is the initial values; an int32 counter as a second
    state (no derivative) read by the float one."""
    T, n = 5, 3
    X = te.placeholder((T, n), F64, name="X")
    S = te.placeholder((T, n), F64, name="S")
    x = normal(rng, T, n, scale=1.0)
    whole = te.compute((T, n), lambda t, i: X[t, i] * 3.0, name="whole")
    Y = te.scan(whole, te.compute((T, n), lambda t, i: S[t - 1, i], name="u"), S, name="Y")
    np.testing.assert_allclose(run([X], [Y], [x]), 3 * x)
    te.check_gradient(Y, [X], [x])
    C = te.placeholder((T, n), "int32", name="C")
    c0 = te.compute((1, n), lambda _, i: te.const(0, "int32"), name="c0")
    count = te.compute((T, n), lambda t, i: C[t - 1, i] + 1, name="count")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    f = te.compute((T, n), lambda t, i: S[t - 1, i] * 0.5 + X[t, i] * C[t - 1, i].astype(F64), name="f")
    Yc, Yf = te.scan([c0, init], [count, f], [C, S], name="mixed")
    yc, yf = run([X], [Yc, Yf], [x])
    ref = np.zeros_like(x)
    ref[0] = x[0]
    for t in range(1, T):
        ref[t] = ref[t - 1] * 0.5 + x[t] * (t - 1)
    np.testing.assert_array_equal(yc, np.repeat(np.arange(T)[:, None], n, axis=1))
    np.testing.assert_allclose(yf, ref, rtol=1e-12)
    te.check_gradient(Yf, [X], [x])


# --------------------------------------------------------------- gradients


@pytest.mark.aarch64
def test_elman_gradient_finite_differences(rng):
    ins, Y = elman(6, 2, 4, 3)
    te.check_gradient(Y, ins, [normal(rng, *t.shape) for t in ins])


@pytest.mark.aarch64
def test_k2_gradient_finite_differences(rng):
    ins, Y = two_back(10, 3)
    te.check_gradient(Y, ins, [normal(rng, 10, 3, scale=1.0), normal(rng, 3)])


@pytest.mark.aarch64
def test_lstm_gradient_finite_differences_both_states(rng):
    ins, Yh, Yc = lstm(5, 2, 3, 4)
    T, B, H = Yh.shape
    Hd = te.placeholder(Yh.shape, F64, name="Hd")
    t, b, i = te.reduce_axis(T, "t"), te.reduce_axis(B, "b"), te.reduce_axis(H, "i")
    L = te.compute((1,), lambda _: te.sum(Yh[t, b, i] * Hd[t, b, i] + Yc[t, b, i] * Yc[t, b, i], axis=[t, b, i]),
                   name="L")
    te.check_gradient(L, ins + [Hd], [normal(rng, *x.shape) for x in ins + [Hd]])


def neighbours(T, n):
    """S[t, i] = a_i S[t-1, i] + b_i S[t-1, i-1] (i > 0) + X[t, i], from S[0] = X[0]."""
    X = te.placeholder((T, n), F64, name="X")
    a, b = te.placeholder((n,), F64, name="a"), te.placeholder((n,), F64, name="b")
    S = te.placeholder((T, n), F64, name="S")
    init = te.compute((1, n), lambda t, i: X[t, i], name="init")
    upd = te.compute((T, n), lambda t, i: a[i] * S[t - 1, i] + te.if_then_else(i > 0, b[i] * S[t - 1, i - 1], 0.0)
                     + X[t, i], name="upd")
    return [X, a, b], te.scan(init, upd, S, inputs=[X], name="Y")


@pytest.mark.aarch64
def test_an_elementwise_weight_is_summed_as_the_reverse_scan_runs(rng):
    """Weights each step reads element by element (a_i, b_i) get their
    gradient as a running sum, a state of the reverse scan (``da.acc``),
    rather than from adjoints it keeps for every step; a matrix read
    through a sum (elman's W) keeps its sum over time after the scan.
    Values: numpy's adjoint recurrence written by hand, and finite
    differences."""
    T, n = 9, 7
    (X, a, b), Y = neighbours(T, n)
    v = te.placeholder((n,), F64, name="v")
    i = te.reduce_axis(n, "i")
    loss = te.compute((1,), lambda _: te.sum(Y[T - 1, i] * v[i], axis=i), name="loss")
    da, db = te.gradient(loss, [a, b])
    text = te.pretty(da)
    assert "state Y.back.da.acc" in text and "state Y.back.db.acc" in te.pretty(db)
    xs, av, bv, vv = normal(rng, T, n), normal(rng, n), normal(rng, n), normal(rng, n)
    got_a, got_b = run([X, a, b, v], [da, db], [xs, av, bv, vv])
    S = np.zeros((T, n))
    S[0] = xs[0]
    for t in range(1, T):
        S[t] = av * S[t - 1] + xs[t]
        S[t, 1:] += bv[1:] * S[t - 1, :-1]
    lam, want_a, want_b = vv.copy(), np.zeros(n), np.zeros(n)
    for t in range(T - 1, 0, -1):           # lam = d loss / d S[t]
        want_a += lam * S[t - 1]
        want_b[1:] += lam[1:] * S[t - 1, :-1]
        lam = av * lam + np.append(bv[1:] * lam[1:], 0.0)
    np.testing.assert_allclose(got_a, want_a, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_b, want_b, rtol=1e-12, atol=1e-12)
    te.check_gradient(loss, [X, a, b, v], [xs, av, bv, vv])
    ins, H = elman(6, 2, 4, 3)
    dW, = te.gradient(H, [ins[1]])
    assert "dW.acc" not in te.pretty(dW)


def test_a_scan_runs_only_the_steps_that_are_read(rng):
    """The time loop stops after the latest step some tensor reads (where
    the read executes, its guards included); a read at a time known only
    at run time, or the scan's result as an output, reads every step.  A
    gradient does not read the last forward state: that step is not run;
    nor, over one step, the adjoint of the initial state, which nobody
    asked for: the reverse scan does not compute it."""
    T, n = 12, 5
    (X, a, b), Y = neighbours(T, n)
    xs, av, bv = normal(rng, T, n), normal(rng, n), normal(rng, n)
    want = np.zeros((T, n))
    want[0] = xs[0]
    for t in range(1, T):
        want[t] = av * want[t - 1] + xs[t]
        want[t, 1:] += bv[1:] * want[t - 1, :-1]
    j = te.reduce_axis(T, "j")
    cases = {
        "Y[6]": (te.compute((n,), lambda i: Y[6, i], name="r"), 7, want[6]),
        "guarded": (te.compute((T, n), lambda t, i: te.if_then_else(t < 4, Y[t, i], 0.0), name="r"), 4,
                    np.where(np.arange(T)[:, None] < 4, want, 0.0)),
        "sum": (te.compute((n,), lambda i: te.sum(Y[j, i], axis=j), name="r"), T, want.sum(axis=0)),
        "Y": (Y, T, want),
    }
    for name, (out, steps, expect) in cases.items():
        kernel = te.build([X, a, b], [out])
        assert f"time loop t in 1..{steps}:" in kernel.loop_ir, name
        np.testing.assert_allclose(kernel(xs, av, bv), expect, rtol=1e-12, atol=1e-12, err_msg=name)
    at = te.placeholder((1,), "int64", name="at")
    late = te.compute((n,), lambda i: Y[at[0], i], name="late")
    kernel = te.build([X, a, b, at], [late])
    assert f"time loop t in 1..{T}:" in kernel.loop_ir
    np.testing.assert_allclose(kernel(xs, av, bv, np.array([T - 1])), want[T - 1], rtol=1e-12, atol=1e-12)
    loops = r"time loop \S+ in (\d+)\.\.(\d+):\n((?:  .*\n)*)"
    da, = te.gradient(Y, [a])
    (lo, hi, _), (_, _, reverse) = re.findall(loops, te.build([X, a, b], [da]).loop_ir)
    assert (int(lo), int(hi)) == (1, T - 1)            # the forward scan: its last state is not read
    assert "adj_S" in "".join(re.findall(r"stage (\S+):", reverse))
    (X2, a2, b2), Y2 = neighbours(2, n)
    da2, = te.gradient(Y2, [a2])
    kernel = te.build([X2, a2, b2], [da2])
    (lo, hi, reverse), = re.findall(loops, kernel.loop_ir)     # one step: no forward loop
    assert (int(lo), int(hi)) == (1, 2) and "adj_S" not in "".join(re.findall(r"stage (\S+):", reverse))
    np.testing.assert_allclose(kernel(xs[:2], av, bv), xs[0], rtol=1e-12, atol=1e-12)


@pytest.mark.aarch64
def test_readout_of_the_last_state_gradient(rng):
    """A loss on the last state only, through a read-out: the weight gradients
    read the step's adjoints kept by the reverse scan (packed for a GEMM)."""
    T, B, H = 5, 8, 6
    X = te.placeholder((T, B), F64, name="X")
    W = te.placeholder((H, H), F64, name="W")
    U = te.placeholder((H,), F64, name="U")
    v = te.placeholder((H,), F64, name="v")
    S = te.placeholder((T + 1, B, H), F64, name="S")
    h0 = te.compute((1, B, H), lambda _, b, i: te.const(0.0, F64), name="h0")
    j, k, b = te.reduce_axis(H, "j"), te.reduce_axis(H, "k"), te.reduce_axis(B, "b")
    step = te.compute((T + 1, B, H), lambda t, n, i: te.tanh(te.sum(W[i, j] * S[t - 1, n, j], axis=j)
                                                             + U[i] * X[t - 1, n]), name="step")
    hs = te.scan(h0, step, S, name="hs")
    y = te.compute((B,), lambda n: te.sum(v[k] * hs[T, n, k], axis=k), name="y")
    loss = te.compute((1,), lambda _: te.sum(y[b] * y[b], axis=b), name="loss")
    te.check_gradient(loss, [X, W, U, v], [normal(rng, T, B), normal(rng, H, H), normal(rng, H), normal(rng, H)])


@pytest.mark.aarch64
def test_scan_of_scan_gradient_counts_shared_weights_once(rng):
    """``a`` is read by the step of Y and by the step of Z, which reads Y."""
    T, n = 8, 3
    (X, a), Y = two_back(T, n)
    S2 = te.placeholder((T,), F64, name="S2")
    z0 = te.compute((1,), lambda _: te.const(0.0, F64), name="z0")
    r = te.reduce_axis(n, "r")
    zu = te.compute((T,), lambda t: te.tanh(S2[t - 1] + te.sum(Y[t, r] * a[r], axis=r)), name="zu")
    Z = te.scan(z0, zu, S2, name="Z")
    te.check_gradient(Z, [X, a], [normal(rng, T, n, scale=1.0), normal(rng, n)])


@pytest.mark.aarch64
def test_second_order_through_scans(rng):
    T, n = 7, 2
    (X, a), Y = two_back(T, n)
    dX, da = te.gradient(Y, [X, a])
    V = te.placeholder((T, n), F64, name="V")
    q, p, p2 = te.reduce_axis(T, "q"), te.reduce_axis(n, "p"), te.reduce_axis(n, "p2")
    L2 = te.compute((1,), lambda _: te.sum(dX[q, p] * V[q, p], axis=[q, p]) + te.sum(da[p2] * da[p2], axis=p2),
                    name="L2")
    te.check_gradient(L2, [X, a, V], [normal(rng, T, n, scale=1.0), normal(rng, n), normal(rng, T, n)], rtol=1e-3)


def test_second_order_through_kept_step_values(rng):
    """The LSTM's gradient reads the gates the forward scan kept; its own
    gradient must send the adjoint of those kept values back into the scan."""
    ins, Yh, _ = lstm(4, 2, 2, 3)
    X, W, R, h0, c0 = ins
    dW, dR = te.gradient(Yh, [W, R])
    V1, V2 = te.placeholder(W.shape, F64, name="V1"), te.placeholder(R.shape, F64, name="V2")
    a, b, c, d = (te.reduce_axis(n, name) for n, name in zip(W.shape + R.shape, "abcd"))
    L2 = te.compute((1,), lambda _: te.sum(dW[a, b] * V1[a, b], axis=[a, b]) + te.sum(dR[c, d] * V2[c, d], axis=[c, d]),
                    name="L2")
    values = [normal(rng, *t.shape) for t in ins + [V1, V2]]
    te.check_gradient(L2, ins + [V1, V2], values, rtol=1e-3)


def _torch():
    return pytest.importorskip("torch", reason="PyTorch autograd is the independent implementation")


def test_elman_gradients_match_pytorch(rng):
    torch = _torch()
    ins, Y = elman(6, 3, 5, 4)
    values = [normal(rng, *t.shape) for t in ins]
    head = normal(rng, *Y.shape)
    H = te.placeholder(Y.shape, F64, name="H")
    grads = te.gradient(Y, ins, head=H)
    got = run(ins + [H], grads, values + [head])
    tx = [torch.tensor(v, requires_grad=True) for v in values]
    x, w, u, h0 = tx
    hs = [h0[0]]
    for t in range(1, len(values[0])):
        hs.append(torch.tanh(hs[-1] @ w.T + x[t] @ u.T))
    (torch.stack(hs) * torch.tensor(head)).sum().backward()
    for g, t, x_ in zip(got, tx, ins):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=x_.name)


def test_lstm_gradients_match_pytorch(rng):
    torch = _torch()
    ins, Yh, Yc = lstm(5, 2, 3, 4)
    values = [normal(rng, *t.shape) for t in ins]
    hh, hc = normal(rng, *Yh.shape), normal(rng, *Yc.shape)
    T, B, H = Yh.shape
    Hh, Hc = te.placeholder(Yh.shape, F64, name="Hh"), te.placeholder(Yc.shape, F64, name="Hc")
    t, b, i = te.reduce_axis(T, "t"), te.reduce_axis(B, "b"), te.reduce_axis(H, "i")
    L = te.compute((1,), lambda _: te.sum(Yh[t, b, i] * Hh[t, b, i] + Yc[t, b, i] * Hc[t, b, i], axis=[t, b, i]),
                   name="L")
    got = run(ins + [Hh, Hc], te.gradient(L, ins), values + [hh, hc])
    tx = [torch.tensor(v, requires_grad=True) for v in values]
    x, w, r, h0, c0 = tx
    hs, cs = [h0[0]], [c0[0]]
    for step in range(1, T):
        g = x[step] @ w.T + hs[-1] @ r.T
        cs.append(torch.sigmoid(g[:, H:2 * H]) * cs[-1] + torch.sigmoid(g[:, :H]) * torch.tanh(g[:, 2 * H:3 * H]))
        hs.append(torch.sigmoid(g[:, 3 * H:]) * torch.tanh(cs[-1]))
    ((torch.stack(hs) * torch.tensor(hh)).sum() + (torch.stack(cs) * torch.tensor(hc)).sum()).backward()
    for g_, tt, x_ in zip(got, tx, ins):
        np.testing.assert_allclose(g_, tt.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=x_.name)


# ------------------------------------------------------- lowering and cost


def _rnn_kernel(T):
    """Forward loss sum(h_T²) and its gradient wrt X, W, U, for T steps."""
    ins, Y = elman(T, 4, 8, 5, dtype="float32")
    b, i = te.reduce_axis(4, "b"), te.reduce_axis(8, "i")
    loss = te.compute((1,), lambda _: te.sum(Y[T - 1, b, i] * Y[T - 1, b, i], axis=[b, i]), name="loss")
    return te.build(ins, [loss] + te.gradient(loss, ins[:3]))


@pytest.mark.aarch64
def test_one_loop_over_time_whatever_the_steps():
    """T = 16 and T = 256 lower to the same program but for the numbers
    (extents, offsets): same stages, one loop over time each way, and the
    code does not grow with the steps (16 times the steps, less than half as
    much code again: the schedule may treat long sums apart, e.g. on AVX-512
    the weight gradient's sum over 256 steps is long enough for K blocks,
    over 16 it is not)."""
    kernels = {T: _rnn_kernel(T) for T in (16, 256, 4096)}
    small, large = kernels[16], kernels[256]
    assert re.sub(r"\d+", "N", small.loop_ir) == re.sub(r"\d+", "N", large.loop_ir)
    assert small.loop_ir.count("time loop") == 2                    # forward and reverse scan
    size = {T: len(k.llvm_ir) for T, k in kernels.items()}
    assert size[256] < 1.5 * size[16] and size[4096] < 1.5 * size[256], size


def test_cost_counts_steps_times_body():
    m, n = 20, 8
    X = te.placeholder((m, n), name="X")
    S = te.placeholder((m, n), name="S")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    update = te.compute((m, n), lambda t, i: S[t - 1, i] * 0.5 + X[t, i], name="update")
    Y = te.scan(init, update, S, name="Y")
    assert te.cost([X], [Y])["iterations"] == n + (m - 1) * n          # copy of init, then one row a step
    j = te.reduce_axis(n, "j")
    mix = te.compute((m, n), lambda t, i: te.sum(S[t - 1, j] * X[t, j], axis=j) + X[t, i], name="mix")
    Z = te.scan(init, mix, S, name="Z")
    assert te.cost([X], [Z])["iterations"] == n + (m - 1) * n * n


@pytest.mark.aarch64
def test_store_and_recompute_choose_for_the_step(rng):
    """A step's intermediate is stored (a stage in the time loop) or inlined
    where it is read, as store= / recompute= say; the values do not change."""
    T, n = 9, 16
    X = te.placeholder((T, n), F64, name="X")
    S = te.placeholder((T, n), F64, name="S")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    mid = te.compute((T, n), lambda t, i: te.tanh(S[t - 1, i] * 0.5) + X[t, i], name="mid")
    upd = te.compute((T, n), lambda t, i: mid[t, i] * mid[t, (i + 1) % n], name="upd")
    Y = te.scan(init, upd, S, name="Y")
    x = normal(rng, T, n, scale=1.0)
    stored = te.build([X], [Y], store=[mid])
    inlined = te.build([X], [Y], recompute=[mid])
    assert "stage mid:" in stored.loop_ir and "stage mid:" not in inlined.loop_ir
    np.testing.assert_allclose(stored(x), inlined(x), rtol=1e-14)
    with pytest.raises(ValueError, match="cannot recompute 'upd': it is the update of a scan"):
        te.build([X], [Y], recompute=[upd])




@pytest.mark.parametrize("math", [False, True])
def test_a_step_recomputes_its_arithmetic_intermediates(rng, math):
    """A step's elementwise intermediate read at two points (an RK4 stage
    read at ``i`` and ``i - 1``), more work than the program-wide cheap
    bound, is recomputed where it is read: one stage per step instead of a
    pass over memory (and a barrier) each; one applying a transcendental
    function stays a stage.  The values match a numpy loop."""
    T, n = 7, 40
    X = te.placeholder((n,), F64, name="X")
    S = te.placeholder((T, n), F64, name="S")
    init = te.compute((1, n), lambda _, i: X[i], name="init")

    def g(t, i):
        v = S[t - 1, i] * X[i] * 0.25 + X[i] * X[i] - S[t - 1, i] * 0.5
        return te.tanh(v) if math else v
    mid = te.compute((T, n), lambda t, i: g(t, i), name="mid")
    upd = te.compute((T, n), lambda t, i: S[t - 1, i] + 0.1 * (mid[t, i] + te.if_then_else(i > 0, mid[t, i - 1], 0.0)),
                     name="upd")
    Y = te.scan(init, upd, S, inputs=[X], name="Y")
    kernel = te.build([X], [Y])
    in_step = {st.name.split(".")[0] for st in kernel.program.stages if st.step is not None}
    assert in_step == ({"mid", "Y"} if math else {"Y"})          # the update writes the state Y
    x = normal(rng, n, scale=1.0)
    want = [x]
    for _ in range(1, T):
        s = want[-1]
        m = s * x * 0.25 + x * x - s * 0.5
        m = np.tanh(m) if math else m
        want.append(s + 0.1 * (m + np.concatenate([[0.0], m[:-1]])))
    np.testing.assert_allclose(kernel(x), np.stack(want), rtol=1e-13)
@pytest.mark.aarch64
def test_threads_give_the_same_bits():
    code = ("import numpy as np, te_autodiff as te\n"
            "from tests.test_scan import elman\n"
            "ins, Y = elman(12, 16, 64, 32, dtype='float32')\n"
            "g = te.gradient(Y, ins)\n"
            "rng = np.random.default_rng(0)\n"
            "v = [rng.standard_normal(t.shape).astype('float32') * 0.3 for t in ins]\n"
            "out = te.build(ins, [Y] + g)(*v)\n"
            "print(sum(float(np.abs(o).sum()) for o in out).hex())\n")
    runs = {}
    for threads, openmp in (("1", "1"), ("2", "1"), ("2", "0")):    # TE_OPENMP=0: Python threads, loops native
        env = dict(os.environ, TE_NUM_THREADS=threads, TE_OPENMP=openmp)
        runs[threads, openmp] = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                               text=True, cwd=os.path.dirname(os.path.dirname(__file__)),
                                               check=True).stdout
    assert len(set(runs.values())) == 1, runs


def test_stages_are_split_only_while_splitting_pays(rng):
    """A kernel's planned splits run only while its own calls show they are
    faster than running every stage on the calling thread
    (runtime._SplitChoice): the first call runs the plan untimed, both ways
    are tried ``RECENT`` calls in a row, the faster kept, the other probed
    ``RECENT`` calls in a row, ever less often while it loses, and a change
    of load is followed once the way in use has been slow ``RECENT`` calls
    in a row; one slow call of either way (fresh pages, or the first split
    call waking sleeping threads) decides nothing.  Both ways give the same
    bits, the short steps of a time loop included."""
    from lowering.runtime import _SplitChoice
    split = _SplitChoice()
    first, recent = _SplitChoice.FIRST, _SplitChoice.RECENT

    def call(seconds):              # seconds[way]: what a call takes on one thread / split as planned
        way = split.choose()
        split.record(way, seconds[way])
        return way

    def runs(ways):                 # [(way, calls in a row)]
        out = []
        for way in ways:
            if out and out[-1][0] == way:
                out[-1] = (way, out[-1][1] + 1)
            else:
                out.append((way, 1))
        return out

    assert [call((50.0, 50.0))] == [1]          # the first call runs the plan: its time is not kept
    assert [call((2.0, 1.0)) for _ in range(2 * recent)] == [0] * recent + [1] * recent
    ways = [call((2.0, 1.0)) for _ in range(1200)]
    probes = [k for k, (way, n) in enumerate(runs(ways)) if way == 0]
    assert all(n == recent for way, n in runs(ways) if way == 0)          # a probe is a run of calls
    starts = [sum(n for _, n in runs(ways)[:k]) for k in probes]
    gaps = np.diff(starts)
    assert 3 <= len(probes) <= 7 and (gaps[1:] > gaps[:-1]).all()       # ever rarer
    ways = [call((1.0, 6.0)) for _ in range(50)]                         # another process took a core
    assert ways[:recent] == [1] * recent and ways[recent:].count(1) == 0

    split = _SplitChoice()                        # split calls pay 3.0 after a call on one thread (its
    previous = [1]                                # threads were asleep), 1.0 after a split call: they win

    def wake(way):
        seconds = (2.0, 3.0 if previous[0] == 0 else 1.0)[way]
        previous[0] = way
        return seconds

    ways = []
    for _ in range(600):
        way = split.choose()
        split.record(way, wake(way))
        ways.append(way)
    assert ways[recent + 1:2 * recent + 1] == [1] * recent and ways[2 * recent + 1:].count(0) <= 5 * recent

    split = _SplitChoice()                        # a slow first call of the faster way changes nothing
    ways = [call((50.0, 50.0))] + [call((2.0, 30.0 if k == recent else 1.0)) for k in range(3 * first)]
    assert ways[1:2 * recent + 1] == [0] * recent + [1] * recent and ways[2 * recent + 1:first].count(0) == 0
    split = _SplitChoice()                        # one slow call of the way in use changes nothing
    [call((1.0, 2.0)) for _ in range(1 + 2 * recent)]
    assert [call((1.0, 2.0) if k != 3 else (9.0, 2.0)) for k in range(10)] == [0] * 10
    split = _SplitChoice()                        # a call that raised is not timed, and the probe still ends
    [call((1.0, 2.0)) for _ in range(1 + 2 * recent + first)]
    probe = [split.choose() for _ in range(recent)]
    for way in probe:
        split.record(way, None)
    assert probe == [1] * recent and split.probing is None and [call((1.0, 2.0)) for _ in range(4)] == [0] * 4

    split = _SplitChoice()                        # threads calling at once: times arrive after later choices
    split.record(split.choose(), 9.0)
    ways = [split.choose() for _ in range(2 * recent)]
    for way in sorted(ways):                      # the calls of one way end before the other's
        split.record(way, (1.0, 2.0)[way])
    assert ways == [0] * recent + [1] * recent and (split.seconds(0), split.seconds(1)) == (1.0, 2.0)
    assert split.choose() == 0

    ins, Y = elman(12, 32, 128, 64, dtype="float32")
    g = te.gradient(Y, ins)
    kernel = te.build(ins, [Y] + g)
    if kernel._run.split_choice is None:
        pytest.skip("no stage of this kernel is planned to split on this target")
    v = [rng.standard_normal(t.shape).astype("float32") * 0.3 for t in ins]
    outs = []
    for way in (0, 1):
        kernel._run.split_choice.choose = lambda way=way: way
        outs.append(kernel(*v))
    for a, b in zip(*outs):
        assert np.array_equal(a, b)


# --------------------------------------------------------------- bad input


def _parts(T=6, n=3):
    X = te.placeholder((T, n), name="X")
    S = te.placeholder((T, n), name="S")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    return X, S, init


@pytest.mark.parametrize("at,allowed", [(lambda t: t, "t - 1"), (lambda t: t + 1, "t - 1"),
                                        (lambda t: t - 2, "t - 1 ... t - 1")])
def test_update_reads_the_state_only_at_earlier_times(at, allowed):
    X, S, init = _parts()
    bad = te.compute(S.shape, lambda t, i: S[at(t), i] + X[t, i], name="bad")
    with pytest.raises(ValueError, match=f"'bad' reads 'S' at time .* only at {allowed}"):
        te.scan(init, bad, S, name="Y")


def test_intermediate_read_at_an_earlier_step_is_refused():
    X, S, init = _parts()
    mid = te.compute(S.shape, lambda t, i: S[t - 1, i] * 2.0, name="mid")
    bad = te.compute(S.shape, lambda t, i: mid[t - 1, i] + X[t, i], name="bad")
    with pytest.raises(ValueError, match="'bad' reads 'mid' at time .* intermediate 'mid' only at t, its own step"):
        te.scan(init, bad, S, name="Y")


def test_bad_arguments_name_the_tensors():
    X, S, init = _parts()
    upd = te.compute(S.shape, lambda t, i: S[t - 1, i] + X[t, i], name="upd")
    with pytest.raises(ValueError, match="init 'init2' has shape"):
        te.scan(te.compute((1, 4), lambda _, i: X[0, 0], name="init2"), upd, S, name="Y")
    with pytest.raises(ValueError, match="update 'short' has shape"):
        te.scan(init, te.compute((5, 3), lambda t, i: S[t - 1, i], name="short"), S, name="Y")
    with pytest.raises(TypeError, match="state 'upd' must be a te.placeholder"):
        te.scan(init, upd, upd, name="Y")
    with pytest.raises(TypeError, match="'init64' has dtype float64, state 'S' has dtype float32"):
        te.scan(te.compute((1, 3), lambda _, i: X[0, i].astype("float64"), name="init64"), upd, S, name="Y")
    with pytest.raises(ValueError, match="lists of the same"):
        te.scan([init, init], [upd], [S], name="Y")
    with pytest.raises(TypeError, match="all be tensors or all lists"):
        te.scan(init, [upd], S, name="Y")
    flat = te.compute((3,), lambda i: S[0, i], name="flat")
    with pytest.raises(ValueError, match="'flat' reads the state, so its first axis must be time"):
        te.scan(init, te.compute(S.shape, lambda t, i: flat[i] + X[t, i], name="u"), S, name="Y")


def test_build_checks_the_step_and_refuses_to_recompute_a_scan():
    X, S, init = _parts()
    ahead = te.compute(S.shape, lambda t, i: S[t - 1, i] + X[t + 1, i], name="ahead")
    Y = te.scan(init, ahead, S, name="Y")
    with pytest.raises(IndexError, match="'ahead' reads 'X' out of bounds"):
        te.build([X], [Y])
    inlined = te.compute(S.shape, lambda t, i: X[t + 1, i] * S[t - 1, i], name="inlined")   # in the step, inlined
    Y = te.scan(init, te.compute(S.shape, lambda t, i: S[t - 1, i] + inlined[t, i], name="u"), S, name="Y")
    with pytest.raises(IndexError, match="'inlined' reads 'X' out of bounds"):
        te.build([X], [Y])
    upd = te.compute(S.shape, lambda t, i: S[t - 1, i] + X[t, i], name="upd")
    Y = te.scan(init, upd, S, name="Y")
    Z = te.compute(S.shape, lambda t, i: Y[t, i] * 2.0, name="Z")
    with pytest.raises(ValueError, match="cannot recompute 'Y': it is a scan"):
        te.build([X], [Z], recompute=[Y])
    with pytest.raises(NotImplementedError, match="'Y' is a scan"):
        te.jacobian(Y, X)


def test_unsupported_scans_are_refused_by_name():
    """What te.scan does not do yet is a NotImplementedError naming the scan:
    a scan in the step of another, and gradients with ``optimize=False`` (the
    unoptimised adjoint of a step reads the reverse state at every time)."""
    X, S, init = _parts()
    R = te.placeholder(S.shape, name="R")
    inner = te.scan(te.compute((1, 3), lambda _, i: X[0, i], name="inner_init"),
                    te.compute(S.shape, lambda t, i: R[t - 1, i] + S[t - 1, i], name="inner_upd"), R, name="inner")
    with pytest.raises(NotImplementedError, match="te.scan 'Y': a scan inside the step of another scan"):
        te.scan(init, te.compute(S.shape, lambda t, i: S[t - 1, i] + inner[t, i], name="upd"), S, name="Y")
    Y = te.scan(init, te.compute(S.shape, lambda t, i: te.tanh(S[t - 1, i]) * X[t, i], name="upd"), S, name="Y")
    with pytest.raises(NotImplementedError, match="te.gradient through scan 'Y'.*optimize=False"):
        te.gradient(Y, [X], optimize=False)
    assert len(te.gradient(Y, [X])) == 1


def test_a_step_input_computed_for_every_step_says_why_it_reads_out_of_range(rng):
    """A compute of the update chain that does not read the state is an
    ordinary tensor over every t: reading X[t - 1] there leaves X at t = 0,
    and the error names the scan and says so; guarded, it builds."""
    T, B = 8, 4
    X, S = te.placeholder((T, B), F64, "X"), te.placeholder((T, B), F64, "S")
    init = te.compute((1, B), lambda _, j: X[0, j], name="init")

    def scan_of(x_in):
        upd = te.compute((T, B), lambda t, j: S[t - 1, j] * 0.5 + x_in[t, j], name="upd")
        return te.scan(init, upd, S, inputs=[X], name="Y")

    x_in = te.compute((T, B), lambda t, j: X[t - 1, j] * 2.0, name="x_in")
    with pytest.raises(IndexError, match=r"'x_in' reads 'X'.*\(it is -1 at t = 0, j = 0\).*"
                                         r"'x_in' is read by the update of scan 'Y' but does not read its state"):
        te.build([X], [scan_of(x_in)])
    guarded = te.compute((T, B), lambda t, j: te.if_then_else(t >= 1, X[t - 1, j], 0.0) * 2.0, name="x_in")
    x = normal(rng, T, B)
    want = np.zeros((T, B))
    want[0] = x[0]
    for t in range(1, T):
        want[t] = want[t - 1] * 0.5 + 2 * x[t - 1]
    eps = np.finfo(np.float64).eps      # two roundings a step (one where te contracts to an fma), T steps
    np.testing.assert_allclose(te.build([X], [scan_of(guarded)])(x), want, rtol=2 * T * eps, atol=2 * T * eps)


def test_a_steps_estimate_counts_one_step_of_the_state_not_all_of_it():
    """The runtime's estimate of a step stage (which decides whether it is
    split across threads at every step) counts the bytes one step moves:
    the same for 8 steps as for 512, though the state buffer holding every
    step grows 64 times."""
    from lowering.runtime import _estimate_us

    def step_estimates(T, n=4096):
        X = te.placeholder((T, n), "float32", "X")
        S = te.placeholder((T, n), "float32", "S")
        init = te.compute((1, n), lambda _, i: X[0, i], name="init")
        step = te.compute((T, n), lambda t, i: S[t - 1, i] * 0.5 + X[t, i], name="step")
        kernel = te.build([X], [te.scan(init, step, S, inputs=[X], name="s")])
        c = kernel._compiled
        return [_estimate_us(*cost, c.target) for st, cost in zip(kernel.program.stages, c.costs) if st.step]

    short, long = step_estimates(8), step_estimates(512)
    assert short and short == long
