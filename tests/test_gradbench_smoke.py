"""GradBench evals written in te-autodiff (benchmarks/gradbench): each eval's
functions on small inputs against an implementation written here with numpy
(from the eval's definition, not from the te formulas), gradients also against
central finite differences of that numpy implementation; then the protocol
pieces (driver, timing adapter) on a fake eval. Self-contained: no network, no
GradBench checkout; a last test validates with GradBench's own validators when
a checkout with the manual tool is present, and says why it skips otherwise.

Finite differences: central, step h = 1e-5. Their error is at most
h²/6 max|f'''| + 2 eps max|f| / h, about 2e-11 (max|f'''| + max|f|) for these
smooth, O(1)-scaled objectives; the tolerances below (1e-6 relative to the
largest entry) leave a margin of 10^4 over that and still catch any wrong
term, which is of the order of the entries themselves.
"""
import json
import math
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

from benchmarks.gradbench import protocol, session
from benchmarks.gradbench.evals import EVALS, NOT_COVERED, ba, gmm, hello, kmeans, llsq, load, lse, lstm, ode

ROOT = Path(__file__).resolve().parent.parent
FD_STEP = 1e-5
FD_RTOL = 1e-6


def fd_gradient(f, x):
    """Central differences of the scalar function f at the array x."""
    x = np.array(x, dtype=np.float64)
    g = np.empty_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += FD_STEP
        down[idx] -= FD_STEP
        g[idx] = (f(up) - f(down)) / (2 * FD_STEP)
    return g


def assert_close(got, want, rtol=1e-10, scale=None):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = scale if scale is not None else max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    assert err <= rtol * scale, f"max error {err:.3g} > {rtol:.1g} x {scale:.3g}"


def test_eval_list():
    assert set(EVALS) >= {"hello", "lse", "llsq", "kmeans", "gmm", "lstm", "ode", "ba"}
    assert set(NOT_COVERED) == {"det", "particle", "saddle", "ht"}
    with pytest.raises(ValueError, match="Lehmer"):
        load("det")


def test_hello():
    assert hello.square(3.0) == 9.0 and hello.double(9.0) == 18.0
    assert isinstance(hello.square(1.5), float)


def test_lse():
    x = np.random.default_rng(1).normal(scale=30, size=777)
    y = lse.primal({"x": x.tolist()})
    a = x.max()
    assert_close(y, a + np.log(np.sum(np.exp(x - a))), rtol=1e-13)
    g = np.array(lse.gradient({"x": x.tolist()}))
    e = np.exp(x - a)
    assert_close(g, e / e.sum(), rtol=1e-13)
    small = x[:12] / 30
    assert_close(lse.gradient({"x": small.tolist()}),
                 fd_gradient(lambda v: np.log(np.sum(np.exp(v))), small), rtol=FD_RTOL)


def llsq_reference(x, n):
    t = -1 + np.arange(n) * 2 / (n - 1)
    r = np.sign(t) - (x[None, :] * t[:, None] ** np.arange(x.size)[None, :]).sum(1)
    return 0.5 * np.sum(r * r)


@pytest.mark.parametrize("n", [9, 16])          # odd n has t = 0 (0**0 = 1, sign 0)
def test_llsq(n):
    x = np.random.default_rng(n).random(6)
    assert_close(llsq.primal({"x": x.tolist(), "n": n}), llsq_reference(x, n), rtol=1e-13)
    assert_close(llsq.gradient({"x": x.tolist(), "n": n}), fd_gradient(lambda v: llsq_reference(v, n), x),
                 rtol=FD_RTOL)


def test_kmeans():
    rng = np.random.default_rng(3)
    P = rng.random((300, 5))
    C = P[-7:].copy()                              # as GradBench: every centroid owns a point
    inp = {"points": P.tolist(), "centroids": C.tolist()}
    dist = ((P[:, None, :] - C[None, :, :]) ** 2).sum(-1)
    assert_close(kmeans.cost(inp), dist.min(1).sum(), rtol=1e-13)
    owner = dist.argmin(1)
    J = np.stack([2 * (C[j] - P[owner == j]).sum(0) for j in range(len(C))])
    H = np.stack([np.full(5, 2.0 * np.sum(owner == j)) for j in range(len(C))])
    assert_close(kmeans.dir(inp), J / H, rtol=1e-12)


def gmm_input(rng, d, k, n, m, gamma):
    """GradBench's generator, restated (normal x, alpha, q, l; uniform mu)."""
    return {"d": d, "k": k, "n": n, "m": m, "gamma": gamma, "x": rng.normal(size=(n, d)).tolist(),
            "alpha": rng.normal(size=k).tolist(), "mu": rng.uniform(size=(k, d)).tolist(),
            "q": rng.normal(size=(k, d)).tolist(), "l": rng.normal(size=(k, d * (d - 1) // 2)).tolist()}


def gmm_reference(alpha, mu, q, l, x, m, gamma):
    """log(p(X | θ, φ) p(θ)) from the definitions: Gaussian log densities with
    precision Q^T Q, Wishart log density of each precision matrix."""
    K, D = mu.shape
    n = D + m + 1
    Qs = []
    for k in range(K):
        Q = np.diag(np.exp(q[k]))
        rows, cols = np.tril_indices(D, -1)
        order = np.lexsort((rows, cols))           # column by column
        Q[rows[order], cols[order]] = l[k]
        Qs.append(Q)
    log_phi = alpha - np.log(np.sum(np.exp(alpha)))
    comps = []
    for k, Q in enumerate(Qs):
        P = Q.T @ Q
        diff = x - mu[k]
        comps.append(log_phi[k] - 0.5 * np.einsum("ia,ab,ib->i", diff, P, diff)
                     - D / 2 * np.log(2 * np.pi) + 0.5 * np.linalg.slogdet(P)[1])
    comps = np.stack(comps, 1)
    top = comps.max(1)
    loglik = np.sum(top + np.log(np.sum(np.exp(comps - top[:, None]), 1)))
    log_mgamma = D * (D - 1) / 4 * np.log(np.pi) + sum(math.lgamma(n / 2 + (1 - j) / 2) for j in range(1, D + 1))
    prior = 0.0
    for Q in Qs:
        P = Q.T @ Q
        prior += ((n - D - 1) / 2 * np.linalg.slogdet(P)[1] - gamma ** 2 * np.trace(P) / 2
                  - n * D / 2 * np.log(2) + n * D * np.log(gamma) - log_mgamma)
    return loglik + prior


def test_gmm():
    rng = np.random.default_rng(4)
    inp = gmm_input(rng, d=4, k=3, n=20, m=2, gamma=1.5)
    arrays = [np.array(inp[key]) for key in ("alpha", "mu", "q", "l", "x")]
    want = gmm_reference(*arrays, inp["m"], inp["gamma"])
    assert_close(gmm.objective(inp), want, rtol=1e-12, scale=abs(want))
    jac = gmm.jacobian(inp)
    assert set(jac) == {"alpha", "mu", "q", "l"}
    for pos, key in enumerate(("alpha", "mu", "q", "l")):
        def f(v, pos=pos):
            args = list(arrays)
            args[pos] = v
            return gmm_reference(*args, inp["m"], inp["gamma"])
        assert_close(jac[key], fd_gradient(f, arrays[pos]), rtol=FD_RTOL, scale=abs(want))


def lstm_reference(main, extra, state, seq):
    """ADBench's LSTM objective, loop by loop."""
    sig = lambda v: 1 / (1 + np.exp(-v))          # noqa: E731
    layers, b = main.shape[0] // 2, seq.shape[1]
    h = [state[2 * L].copy() for L in range(layers)]
    c = [state[2 * L + 1].copy() for L in range(layers)]
    total = 0.0
    for t in range(seq.shape[0] - 1):
        inp = seq[t] * extra[0]
        for L in range(layers):
            w, bias = main[2 * L].reshape(4, b), main[2 * L + 1].reshape(4, b)
            forget, ingate = sig(inp * w[0] + bias[0]), sig(h[L] * w[1] + bias[1])
            outgate, change = sig(inp * w[2] + bias[2]), np.tanh(h[L] * w[3] + bias[3])
            c[L] = c[L] * forget + ingate * change
            h[L] = outgate * np.tanh(c[L])
            inp = h[L]
        ypred = inp * extra[1] + extra[2]
        total += np.sum(seq[t + 1] * (ypred - np.log(np.sum(np.exp(ypred)) + 2)))
    return -total / ((seq.shape[0] - 1) * b)


def test_lstm():
    rng = np.random.default_rng(5)
    layers, c, b = 2, 6, 3
    arrays = [rng.random((2 * layers, 4 * b)), rng.random((3, b)), rng.random((2 * layers, b)),
              (rng.random((c, b)) > 0.5).astype(float)]
    inp = dict(zip(("main_params", "extra_params", "state", "sequence"), (a.tolist() for a in arrays)))
    assert_close(lstm.objective(inp), lstm_reference(*arrays), rtol=1e-13)
    grads = [fd_gradient(lambda v, pos=pos: lstm_reference(*(arrays[:pos] + [v] + arrays[pos + 1:])), arrays[pos])
             for pos in (0, 1)]
    assert_close(lstm.jacobian(inp), np.concatenate([g.reshape(-1) for g in grads]), rtol=FD_RTOL)


def ode_reference(x, s):
    """s steps of classical Runge-Kutta on [0, 2] for y_0' = x_0, y_i' = x_i y_{i-1}."""
    def f(y):
        return np.concatenate([x[:1], x[1:] * y[:-1]])
    y, h = np.zeros_like(x), 2.0 / s
    for _ in range(s):
        k1 = f(y)
        k2 = f(y + h / 2 * k1)
        k3 = f(y + h / 2 * k2)
        k4 = f(y + h * k3)
        y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return y


@pytest.mark.parametrize("s", [1, 3])
def test_ode(s):
    x = np.random.default_rng(6).random(7) + 0.5
    assert_close(ode.primal({"x": x.tolist(), "s": s}), ode_reference(x, s), rtol=1e-13)
    assert_close(ode.gradient({"x": x.tolist(), "s": s}), fd_gradient(lambda v: ode_reference(v, s)[-1], x),
                 rtol=FD_RTOL)


def ba_reference(cams, X, w, feats, obs):
    """ADBench's residuals, observation by observation (vectorised over them)."""
    cam, pt = cams[obs[:, 0]], X[obs[:, 1]]
    rot, Xo = cam[:, :3], pt - cam[:, 3:6]
    sq = np.sum(rot ** 2, 1, keepdims=True)
    theta = np.sqrt(sq)
    safe = np.where(sq != 0, theta, 1.0)
    axis = rot / safe
    cos, sin = np.cos(theta), np.sin(theta)
    turned = (Xo * cos + np.cross(axis, Xo) * sin + axis * np.sum(axis * Xo, 1, keepdims=True) * (1 - cos))
    Xcam = np.where(sq != 0, turned, Xo + np.cross(rot, Xo))
    proj = Xcam[:, :2] / Xcam[:, 2:]
    rsq = np.sum(proj ** 2, 1, keepdims=True)
    proj = proj * (1 + cam[:, 9:10] * rsq + cam[:, 10:11] * rsq ** 2) * cam[:, 6:7] + cam[:, 7:9]
    return w[:, None] * (proj - feats), 1 - w * w


def test_ba():
    rng = np.random.default_rng(7)
    n, m, p = 3, 4, 9
    cams = np.column_stack([rng.normal(scale=0.3, size=(n, 3)), rng.normal(size=(n, 3)), 1 + rng.random((n, 1)),
                            rng.normal(size=(n, 2)), rng.normal(scale=0.1, size=(n, 2))])
    cams[1, :3] = 0.0                              # |r| = 0: the other branch of the rotation
    X = rng.normal(size=(m, 3)) + [0, 0, 6]
    w, feats = rng.random(p) + 0.5, rng.normal(size=(p, 2))
    obs = np.stack([np.arange(p) % n, rng.integers(0, m, p)], 1).astype(np.int32)
    arrays = (cams, X, w, feats, obs)
    reproj, w_err = ba.objective_kernel(n, m, p)(*arrays)
    want_reproj, want_w = ba_reference(*arrays)
    assert_close(reproj, want_reproj, rtol=1e-12)
    assert_close(w_err, want_w, rtol=1e-13)

    rows, cols, vals = ba.sparse(ba.jacobian_kernel(n, m, p), arrays)
    dense = np.zeros((3 * p, 11 * n + 3 * m + p))
    for r in range(3 * p):
        for q in range(rows[r], rows[r + 1]):
            dense[r, cols[q]] += vals[q]
    assert rows[-1] == len(vals) == 31 * p

    def residuals(flat):
        c, x, ww = flat[:11 * n].reshape(n, 11), flat[11 * n:11 * n + 3 * m].reshape(m, 3), flat[11 * n + 3 * m:]
        e, we = ba_reference(c, x, ww, feats, obs)
        return np.concatenate([e.reshape(-1), we])
    flat = np.concatenate([cams.reshape(-1), X.reshape(-1), w])
    fd = np.stack([fd_gradient(lambda v, r=r: residuals(v)[r], flat) for r in range(3 * p)])
    assert_close(dense, fd, rtol=FD_RTOL, scale=max(1.0, np.abs(fd).max()))

    one = {"n": 2, "m": 3, "p": 20, "cam": cams[0].tolist(), "x": X[0].tolist(), "w": 0.7, "feat": [0.1, -0.2]}
    out = ba.objective(one)
    assert out["reproj_error"]["repeated"] == 20 and out["w_err"] == {"element": 1 - 0.7 * 0.7, "repeated": 20}
    jac = ba.jacobian(one)
    assert [len(jac[key]) for key in ("rows", "cols", "vals")] == [31, 31, 31]
    assert jac["rows"][:3] == [0, 15, 30] and jac["rows"][-1] == 31 * 20 and jac["cols"][-1] == 11 * 2 + 3 * 3 + 19


def test_outputs_are_json():
    inp = {"x": [0.5, 0.25], "n": 5}
    for value in (llsq.primal(inp), llsq.gradient(inp), lse.gradient({"x": [1.0, 2.0]})):
        json.dumps(value)


# The protocol pieces, on a fake eval (no GradBench needed).

FAKE_EVAL = textwrap.dedent("""
    import json, sys
    def send(message):
        print(json.dumps(message), flush=True)
        return json.loads(sys.stdin.readline()) if message["kind"] != "end" else None
    send({"id": 0, "kind": "start", "eval": "hello"})
    assert send({"id": 1, "kind": "define", "module": "hello"})["success"]
    reply = send({"id": 2, "kind": "evaluate", "module": "hello", "function": "square", "input": 3.0})
    send({"id": 3, "kind": "analysis", "of": 2, "valid": reply["output"] == 9.0})
    reply = send({"id": 4, "kind": "evaluate", "module": "lse", "function": "primal",
                  "input": {"x": [0.0, 0.0], "min_runs": 5, "min_seconds": 0}, "description": "n=2"})
    send({"id": 5, "kind": "analysis", "of": 4, "valid": False, "error": "made up"})
    reply = send({"id": 6, "kind": "evaluate", "module": "lse", "function": "nonesuch", "input": {"x": [1.0]}})
    send({"id": 7, "kind": "end"})
""")


def test_session_drives_the_te_tool(tmp_path):
    script = tmp_path / "fake_eval.py"
    script.write_text(FAKE_EVAL)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TE_NUM_THREADS="1")
    records = session.run("fake", [sys.executable, str(script)], env, "te",
                          [sys.executable, "-m", "benchmarks.gradbench.tool"], env, 1, str(tmp_path),
                          str(tmp_path), timeout=300, progress=lambda s: None)
    square, primal, missing = records
    assert (square.function, square.description, square.status, square.valid) == ("square", "x=3.0", "ok", True)
    assert len(square.timings_ns) == 1 and square.prepare_ns > 0
    assert (primal.description, primal.valid, primal.analysis, len(primal.timings_ns)) == ("n=2", False, "made up", 5)
    assert missing.status == "failed" and "nonesuch" in missing.error


def test_repeat_honours_min_runs_and_min_seconds():
    calls = []
    result, timings = protocol.repeat(lambda: calls.append(1) or len(calls), 3, 0.0)
    assert result == 3 and len(timings) == 3
    result, timings = protocol.repeat(lambda: sum(range(1000)), 1, 0.02)
    assert sum(t["nanoseconds"] for t in timings) >= 0.02e9


def test_peer_adapter_times_finished_results(monkeypatch):
    """The JAX/PyTorch adapter replaces gradbench.wrap's decorators: one untimed
    call, then every timed call waits for its result (the finisher) inside
    the timed region."""
    from dataclasses import dataclass

    from benchmarks.gradbench import peer_tool

    @dataclass
    class Wrapped:
        function: object
        wrapped: object

    fake = types.ModuleType("gradbench.wrap")
    fake.Wrapped = Wrapped
    package = types.ModuleType("gradbench")
    package.wrap = fake
    monkeypatch.setitem(sys.modules, "gradbench", package)
    monkeypatch.setitem(sys.modules, "gradbench.wrap", fake)
    finished = []
    peer_tool.patch_wrap(lambda value: finished.append(value) or value)
    decorated = fake.multiple_runs(pre=lambda raw: raw["v"], post=lambda out: out * 10)(lambda v: v + 1)
    response = decorated.wrapped({"v": 1, "min_runs": 4, "min_seconds": 0})
    assert response["output"] == 20 and finished == [2] * 5
    assert [t["name"] for t in response["timings"]] == ["prepare"] + ["evaluate"] * 4


def test_against_gradbench_validators_when_a_checkout_is_present(tmp_path):
    """GradBench's own evals and validators (which run its C++ manual tool)
    judge te-autodiff's outputs on small inputs."""
    from benchmarks.gradbench import snapshot
    try:
        checkout = snapshot.locate()
    except snapshot.SetupError as error:
        pytest.skip(f"no usable GradBench checkout ({error})")
    if not checkout.has_manual():
        pytest.skip(f"GradBench's manual tool is not built under {checkout.manual_bin(False)}: no validator")
    done = subprocess.run([sys.executable, "-m", "benchmarks.gradbench", "--smoke", "--tools", "te", "--threads", "1",
                           "--evals", "lse,gmm,ba", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())["evaluations"]
    assert len(results) >= 8 and all(r["status"] == "ok" and r["valid"] for r in results), results
