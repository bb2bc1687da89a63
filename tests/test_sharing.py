"""Sharing: programs and their gradients stay linear in the size of the program.

Each target asserts measured quantities: wall time of ``te.gradient`` +
``te.build``, the length of ``te.pretty``, exact ``te.cost`` counts, and the
text of the lowered loop IR.
"""
from __future__ import annotations

import gc
import sys
import time

import numpy as np
import pytest

import te_autodiff as te
from lowering.lower import lower
from te_autodiff.visit import count_nodes

LEVELS = 40


# --------------------------------------------------------------------------- deep DAG


def deep_body(x, levels=LEVELS):
    """``v <- sin(v)·v·0.05 + v``: every level uses the previous value three times."""
    v = x
    for _ in range(levels):
        v = te.sin(v) * v * 0.05 + v
    return v


def np_deep(x, levels=LEVELS):
    """The same recurrence in numpy and its derivative by the chain rule."""
    v, d = np.array(x, dtype=np.float64), np.ones_like(x, dtype=np.float64)
    for _ in range(levels):
        d = d * (0.05 * (np.cos(v) * v + np.sin(v)) + 1.0)
        v = np.sin(v) * v * 0.05 + v
    return v, d


def tree_size(e, memo=None):
    """Nodes of ``e`` unfolded into a tree, counted without building it."""
    from te_autodiff.visit import children, topo_order
    memo = {} if memo is None else memo
    for n in topo_order([e]):
        memo[n] = 1 + sum(memo[c] for c in children(n))
    return memo[e]


def test_deep_dag_in_one_body_gradient_builds_fast_and_stays_small():
    n = 16
    X = te.placeholder((n,), "float64", "X")
    Y = te.compute((n,), lambda i: deep_body(X[i]), name="Y")
    t0 = time.perf_counter()
    dX, = te.gradient(Y, [X])
    kernel = te.build([X], [Y, dX])
    elapsed = time.perf_counter() - t0
    assert elapsed < 10, f"gradient + build of a {LEVELS}-level DAG took {elapsed:.2f} s"

    x = np.linspace(-2.0, 2.0, n)
    y, dx = kernel(x)
    want_y, want_dx = np_deep(x)
    np.testing.assert_allclose(y, want_y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-9, atol=1e-12)

    text = te.pretty(dX)
    assert len(text) < 20_000, f"te.pretty of the gradient is {len(text)} characters"
    assert "let " in text
    # the DAG is linear in the depth; the tree it unfolds to is exponential
    assert count_nodes([dX.body]) < 50 * LEVELS
    assert tree_size(dX.body) > 3 ** (LEVELS // 2)
    # the loop IR names each level once (no exponential text)
    assert len(kernel.loop_ir) < 40_000
    assert kernel.loop_ir.count("sin(") <= 2 * LEVELS + 2


def test_a_body_deeper_than_pythons_recursion_limit(monkeypatch):
    """400 levels (expressions 1000 and more deep): checking the body,
    differentiating it, printing it and building it need no recursion, and
    the work of reverse mode's factored sums (the products they open) grows
    linearly with the depth."""
    import te_autodiff.derivative as derivative
    opened = []
    counted = derivative._opens
    monkeypatch.setattr(derivative, "_opens", lambda f: opened.append(f) or counted(f))
    work = {}
    for levels in (200, 400):
        X = te.placeholder((4,), "float64", "X")
        Y = te.compute((4,), lambda i: deep_body(X[i], levels), name="Y")
        opened.clear()
        dX, = te.gradient(Y, [X])
        work[levels] = len(opened)
    assert work[400] < 2.2 * work[200], work
    assert count_nodes([dX.body]) < 50 * 400
    assert "let " in te.pretty(dX)
    kernel = te.build([X], [Y, dX])
    x = np.linspace(-2.0, 2.0, 4)
    y, dx = kernel(x)
    want_y, want_dx = np_deep(x, 400)
    np.testing.assert_allclose(y, want_y, rtol=1e-9)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-8)


def select_chain(v, w, levels):
    """``v <- v·0.99 if v > 0.5 else v·1.01 + w``: each level tests the one below."""
    for _ in range(levels):
        v = te.if_then_else(v > 0.5, v * 0.99, v * 1.01 + w)
    return v


def np_select_chain(x, w, levels):
    """The same in numpy with its derivatives in ``x`` and ``w`` (forward mode)."""
    v, dx, dw = x.copy(), np.ones_like(x), np.zeros_like(x)
    for _ in range(levels):
        hi = v > 0.5
        v, dx, dw = (np.where(hi, v * 0.99, v * 1.01 + w), np.where(hi, dx * 0.99, dx * 1.01),
                     np.where(hi, dw * 0.99, dw * 1.01 + 1.0))
    return v, dx, dw


def branch_chain(v, w, levels, x):
    """``v <- v·0.99 if x > 0.01 k else v·1.01 + w``: the level below sits in both branches."""
    for k in range(levels):
        v = te.if_then_else(x > 0.01 * k, v * 0.99, v * 1.01 + w)
    return v


def np_branch_chain(x, w, levels):
    v, dx, dw = x.copy(), np.ones_like(x), np.zeros_like(x)
    for k in range(levels):
        hi = x > 0.01 * k
        v, dx, dw = (np.where(hi, v * 0.99, v * 1.01 + w), np.where(hi, dx * 0.99, dx * 1.01),
                     np.where(hi, dw * 0.99, dw * 1.01 + 1.0))
    return v, dx, dw


def guarded_chain(v, w, levels, i):
    """``v <- w[i-1]/2 + v if i >= 1 else 0.9 v``: an index guard, the level below in both branches."""
    for _ in range(levels):
        v = te.if_then_else(i >= 1, w[i - 1] * 0.5 + v, v * 0.9)
    return v


def np_guarded_chain(x, w, levels):
    first = np.arange(len(x)) == 0
    shifted = np.r_[0.0, w[:-1]] * 0.5
    v, dx, dw = x.copy(), np.ones_like(x), np.zeros_like(x)
    for _ in range(levels):
        v, dx = np.where(first, v * 0.9, shifted + v), np.where(first, dx * 0.9, dx)
    dw[:-1] = levels * 0.5 * ~first[1:]         # dw[j] from v[j + 1], one half per level
    return v, dx, dw


CHAINS = {      # name: (te body of Y[i] from X, W; numpy values and derivatives)
    "tests the level below": (lambda X, W, i, n: select_chain(X[i], W[i], n), np_select_chain),
    "level below in both branches": (lambda X, W, i, n: branch_chain(X[i], W[i], n, X[i]), np_branch_chain),
    "index guard": (lambda X, W, i, n: guarded_chain(X[i], W, n, i), np_guarded_chain),
}


@pytest.mark.parametrize("chain", CHAINS)
def test_nested_selects_are_visited_once_per_node_not_once_per_path(monkeypatch, chain):
    """A select's branches are checked and lifted under its condition; the
    nodes below are visited once, not once per path through the selects
    (eight levels took 52 s to build, twenty would not finish): a condition
    on float data says nothing about indices, a body has one scope per set of
    index conditions, and what both branches compute is lowered once before
    them."""
    import lowering.bounds_check as bounds_check
    import lowering.lower as lower_module
    import te_autodiff.lift as lift
    calls = []
    for module, name in ((bounds_check, "_check_load"), (lift._Lifter, "_walk"),
                         (lower_module._Emitter, "select")):
        def counted(*args, _f=getattr(module, name), _name=name):
            calls.append(_name)
            assert len(calls) < 100_000, "the nested selects are visited once per path"
            return _f(*args)
        monkeypatch.setattr(module, name, counted)
    body, reference = CHAINS[chain]
    levels, n = 40, 8
    X, W = te.placeholder((n,), "float64", "X"), te.placeholder((n,), "float64", "W")
    Y = te.compute((n,), lambda i: body(X, W, i, levels), name="Y")
    dX, dW = te.gradient(Y, [X, W])
    y, dx, dw = te.build([X, W], [Y, dX, dW])(x := np.linspace(0.3, 0.7, n), w := np.linspace(0.01, 0.02, n))
    for got, ref in zip((y, dx, dw), reference(x, w, levels)):
        np.testing.assert_allclose(got, ref, rtol=1e-12)


@pytest.mark.parametrize("chain", CHAINS)
def test_selects_nested_to_the_limit_build(chain):
    """MAX_NESTING levels lower and compile inside Python's default recursion
    limit, called from deep in a caller's own stack."""
    from lowering.lower import MAX_NESTING
    body, reference = CHAINS[chain]
    n = 8
    X, W = te.placeholder((n,), "float64", "X"), te.placeholder((n,), "float64", "W")
    Y = te.compute((n,), lambda i: body(X, W, i, MAX_NESTING), name="Y")

    def from_depth(frames):
        return from_depth(frames - 1) if frames else te.build([X, W], [Y])
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        kernel = from_depth(100)
    finally:
        sys.setrecursionlimit(limit)
    x, w = np.linspace(0.3, 0.7, n), np.linspace(0.01, 0.02, n)
    np.testing.assert_allclose(kernel(x, w), reference(x, w, MAX_NESTING)[0], rtol=1e-12)


@pytest.mark.parametrize("recursion_limit", [1000, 20_000])
def test_selects_nested_too_deeply_to_lower_are_a_clear_error(recursion_limit):
    """The same error whatever Python's recursion limit (torch.compile raises it to 2000)."""
    from lowering.lower import MAX_NESTING
    X, W = te.placeholder((4,), "float64", "X"), te.placeholder((4,), "float64", "W")
    Y = te.compute((4,), lambda i: select_chain(X[i], W[i], MAX_NESTING + 1), name="Y")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(recursion_limit)
    try:
        with pytest.raises(ValueError, match=f"tensor 'Y' is nested too deeply to lower.*{MAX_NESTING} levels"):
            te.build([X, W], [Y])
    finally:
        sys.setrecursionlimit(limit)


def test_deep_dag_lowers_in_well_under_a_second():
    X = te.placeholder((8,), "float64", "X")
    Y = te.compute((8,), lambda i: deep_body(X[i]), name="Y")
    dX, = te.gradient(Y, [X])
    gc.collect()            # the suite's garbage is not lowering time
    t0 = time.perf_counter()
    program = lower([X], [Y, dX])
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.5, f"lowering a {LEVELS}-level DAG took {elapsed:.2f} s"
    assert len(str(program)) < 40_000


def test_deep_dag_across_compute_stages():
    n = 16
    X = te.placeholder((n,), "float64", "X")
    v = X
    for k in range(LEVELS):
        v = (lambda p: te.compute((n,), lambda i: te.sin(p[i]) * p[i] * 0.05 + p[i], name=f"V{k}"))(v)
    t0 = time.perf_counter()
    dX, = te.gradient(v, [X])
    kernel = te.build([X], [v, dX])
    assert time.perf_counter() - t0 < 10
    x = np.linspace(-2.0, 2.0, n)
    y, dx = kernel(x)
    want_y, want_dx = np_deep(x)
    np.testing.assert_allclose(y, want_y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-9, atol=1e-12)
    assert len(te.pretty(dX)) < 20_000


# --------------------------------------------------------------------------- linear chains


def chain(T, n):
    """T elementwise stages, each reading the previous one (twice) through a sine."""
    X = te.placeholder((n,), "float64", "X")
    A = X
    for k in range(T):
        A = (lambda p: te.compute((n,), lambda i: te.sin(p[i]) * p[i] * 0.05 + p[i], name=f"A{k}"))(A)
    return X, A


def chain_figures(T, n):
    """(te.cost iterations, scheduled stages, optimised LLVM IR characters) of
    forward + gradient: deterministic measures of the work and of the code
    LLVM compiles (build time itself is measured by the benchmarks)."""
    X, A = chain(T, n)
    dX, = te.gradient(A, [X])
    kernel = te.build([X], [A, dX])
    return te.cost([X], [A, dX])["iterations"], len(kernel.program.stages), len(kernel.llvm_ir)


def test_chain_of_stages_grows_linearly():
    """Twice the stages: at most 2.5x the iterations, the stages and the LLVM IR
    (from 60 stages on, where fusion no longer merges the chain's stages)."""
    small, large = chain_figures(60, 64), chain_figures(120, 64)
    for what, a, b in zip(("te.cost iterations", "stages", "LLVM IR size"), small, large):
        assert b / a <= 2.5, f"{what}: {a} -> {b}"


def test_chain_gradient_is_correct():
    X, A = chain(12, 10)
    dX, = te.gradient(A, [X])
    x = np.linspace(-2.0, 2.0, 10)
    y, dx = te.build([X], [A, dX])(x)
    want_y, want_dx = np_deep(x, 12)
    np.testing.assert_allclose(y, want_y, rtol=1e-10)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-9)


# --------------------------------------------------------------------------- MLP


def mlp(n=64, d=32, h=48, c=10, dtype="float64"):
    X, W1 = te.placeholder((n, d), dtype, "X"), te.placeholder((d, h), dtype, "W1")
    W2, T = te.placeholder((h, c), dtype, "W2"), te.placeholder((n, c), dtype, "T")
    k, k2 = te.reduce_axis(d, "k"), te.reduce_axis(h, "k2")
    Z1 = te.compute((n, h), lambda i, j: te.sum(X[i, k] * W1[k, j], axis=k), name="Z1")
    H = te.compute((n, h), lambda i, j: te.tanh(Z1[i, j]), name="H")
    Z2 = te.compute((n, c), lambda i, j: te.sum(H[i, k2] * W2[k2, j], axis=k2), name="Z2")
    r, s = te.reduce_axis(n, "r"), te.reduce_axis(c, "s")
    L = te.compute((), lambda: 0.5 * te.sum((Z2[r, s] - T[r, s]) * (Z2[r, s] - T[r, s]), axis=[r, s]),
                   name="L")
    return [X, W1, W2, T], L


def test_mlp_forward_and_backward_share_activations():
    ins, L = mlp()
    dW1, dW2 = te.gradient(L, [ins[1], ins[2]])
    fwd = te.cost(ins, [L])["iterations"]
    bwd = te.cost(ins, [dW1, dW2])["iterations"]
    both = te.cost(ins, [L, dW1, dW2])["iterations"]
    assert both < fwd + bwd, f"together {both}, forward {fwd} + backward {bwd}"
    # everything the forward computes is needed by the backward: together costs
    # no more than the backward alone plus the loss itself
    assert both <= bwd + 64 * 10

    kernel = te.build(ins, [L, dW1, dW2])
    ir = kernel.loop_ir
    assert ir.count("tanh(") == 1, "the activation is computed once and stored"
    assert "H: float64[64, 48] temp" in ir
    assert ir.count("stage Z1:") == 1 and ir.count("stage H:") == 1

    rng = np.random.default_rng(0)
    x, w1, w2, t = (rng.standard_normal(a.shape) * 0.5 for a in ins)
    loss, dw1, dw2 = kernel(x, w1, w2, t)
    hid = np.tanh(x @ w1)
    err = hid @ w2 - t
    np.testing.assert_allclose(loss, 0.5 * np.sum(err * err), rtol=1e-10)
    np.testing.assert_allclose(dw2, hid.T @ err, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dw1, x.T @ ((err @ w2.T) * (1 - hid * hid)), rtol=1e-9, atol=1e-12)


def test_softmax_cross_entropy_forward_and_backward_share_reductions():
    n, c = 16, 10
    Z, Y = te.placeholder((n, c), "float64", "Z"), te.placeholder((n, c), "float64", "Y")
    k1, k2 = te.reduce_axis(c, "k1"), te.reduce_axis(c, "k2")
    M = te.compute((n,), lambda i: te.max(Z[i, k1], axis=k1), name="M")
    # the normaliser is a nested reduction: lifted, and shared with the gradient
    P = te.compute((n, c), lambda i, j: te.exp(Z[i, j] - M[i]) / te.sum(te.exp(Z[i, k2] - M[i]), axis=k2),
                   name="P")
    r, s = te.reduce_axis(n, "r"), te.reduce_axis(c, "s")
    L = te.compute((), lambda: -te.sum(Y[r, s] * te.log(P[r, s]), axis=[r, s]), name="L")
    dZ, = te.gradient(L, [Z])
    fwd, bwd = te.cost([Z, Y], [L])["iterations"], te.cost([Z, Y], [dZ])["iterations"]
    both = te.cost([Z, Y], [L, dZ])["iterations"]
    assert both < fwd + bwd
    rng = np.random.default_rng(1)
    z = rng.standard_normal((n, c))
    y = np.eye(c)[rng.integers(0, c, n)]
    kernel = te.build([Z, Y], [L, dZ])
    ir = kernel.loop_ir
    assert ir.count("stage M:") == 1 and ir.count("stage P.r1:") == 1, "max and normaliser computed once"
    loss, dz = kernel(z, y)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(loss, -np.sum(y * np.log(p)), rtol=1e-10)
    np.testing.assert_allclose(dz, p * y.sum(1, keepdims=True) - y, rtol=1e-8, atol=1e-12)


def test_equal_tensors_are_computed_once_and_returned_as_copies():
    X = te.placeholder((5, 6), "float64", "X")
    k1, k2 = te.reduce_axis(6, "k1"), te.reduce_axis(6, "k2")
    A = te.compute((5,), lambda i: te.sum(te.exp(X[i, k1]), axis=k1), name="A")
    B = te.compute((5,), lambda j: te.sum(te.exp(X[j, k2]), axis=k2), name="B")
    assert te.cost([X], [A, B])["stages"] == 1
    kernel = te.build([X], [A, B])
    assert "stage A:" in kernel.loop_ir and "B" not in kernel.loop_ir.split("return")[0]
    x = np.random.default_rng(2).standard_normal((5, 6))
    a, b = kernel(x)
    np.testing.assert_allclose(a, np.exp(x).sum(1), rtol=1e-12)
    np.testing.assert_array_equal(a, b)
    a[0] = 123.0
    assert b[0] != 123.0, "outputs computing the same values are independent copies"


def test_maxpool_argmax_is_computed_once_for_two_gradients():
    X = te.placeholder((2, 8, 8), "float64", "X")
    di, dj = te.reduce_axis(2, "di"), te.reduce_axis(2, "dj")
    Y = te.compute((2, 4, 4), lambda c, i, j: te.max(X[c, 2 * i + di, 2 * j + dj], axis=[di, dj]), name="Y")
    H1, H2 = te.placeholder(Y.shape, "float64", "H1"), te.placeholder(Y.shape, "float64", "H2")
    g1, = te.gradient(Y, [X], head=H1)
    g2, = te.gradient(Y, [X], head=H2)
    kernel = te.build([X, H1, H2], [Y, g1, g2])
    assert kernel.loop_ir.count("stage Y.argmax") == 1
    x = np.random.default_rng(3).standard_normal((2, 8, 8))
    h1, h2 = np.ones((2, 4, 4)), np.full((2, 4, 4), 2.0)
    y, d1, d2 = kernel(x, h1, h2)
    np.testing.assert_allclose(y, x.reshape(2, 4, 2, 4, 2).max(axis=(2, 4)))
    np.testing.assert_allclose(d2, 2 * d1)
    assert d1.sum() == 2 * 4 * 4


# --------------------------------------------------------------------------- store / recompute


def override_program(n=24, m=16):
    X = te.placeholder((n, m), "float64", "X")
    k = te.reduce_axis(m, "k")
    A = te.compute((n, m), lambda i, j: te.exp(X[i, j]) * 0.5, name="A")          # read in a reduction
    B = te.compute((n,), lambda i: te.sum(A[i, k] * X[i, k], axis=k), name="B")
    C = te.compute((n, m), lambda i, j: X[i, j] * 2.0 + 1.0, name="C")             # cheap
    Y = te.compute((n, m), lambda i, j: C[i, j] * C[i, j] + B[i] + A[i, j], name="Y")
    return X, A, B, C, Y


def test_default_rule_stores_values_read_in_a_reduction_and_inlines_cheap_ones():
    X, A, B, C, Y = override_program()
    ir = te.build([X], [Y]).loop_ir
    assert "A: float64[24, 16] temp" in ir and "stage C:" not in ir


def test_gemm_like_gradient_reads_a_stored_elementwise_factor():
    """dW[j,k] = Σ_i dY[i,j]·X[i,k] with dY = (Y - T)(1 - Y²)c: recomputing dY
    would repeat its six operations in every multiply-add."""
    n, p, m = 32, 8, 12
    Y, T, X = (te.placeholder(s, "float64", nm) for s, nm in (((n, p), "Y"), ((n, p), "T"), ((n, m), "X")))
    dY = te.compute((n, p), lambda i, j: (Y[i, j] - T[i, j]) * (1.0 - Y[i, j] * Y[i, j]) * 0.25, name="dY")
    i = te.reduce_axis(n, "i")
    dW = te.compute((p, m), lambda j, k: te.sum(dY[i, j] * X[i, k], axis=i), name="dW")
    ir = te.build([Y, T, X], [dW]).loop_ir
    assert "dY: float64[32, 8] temp" in ir and "stage dY:" in ir
    assert te.cost([Y, T, X], [dW])["stages"] == 2
    assert te.cost([Y, T, X], [dW], recompute=[dY])["stages"] == 1
    # a single elementwise op on a load is trivial: recomputed inside the reduction
    S = te.compute((n, p), lambda i, j: Y[i, j] * 0.5, name="S")
    i2 = te.reduce_axis(n, "i2")
    dS = te.compute((p, m), lambda j, k: te.sum(S[i2, j] * X[i2, k], axis=i2), name="dS")
    assert te.cost([Y, X], [dS])["stages"] == 1


@pytest.mark.parametrize("picked", [1, 4, 5])
def test_a_value_a_reduction_reads_at_fewer_points_than_it_has_is_computed_there(rng, picked):
    """``-Σ_i Σ_p logp[i, L[i, p]]`` reads a log-softmax ``N x C`` at ``N ·
    picked`` points inside its reduction: fewer than its elements (1 or 4 of
    5 a row), so only those are computed, at the reads; reading as many as
    it has (5 of 5) computes each once either way, and it stays a stage,
    shared with its other readers.  Values as numpy's."""
    N, C = 6, 5
    X, L = te.placeholder((N, C), "float64", "X"), te.placeholder((N, picked), "int32", "L")
    c1, c2 = te.reduce_axis(C, "c"), te.reduce_axis(C, "c")
    r, q = te.reduce_axis(N, "r"), te.reduce_axis(picked, "q")
    m = te.compute((N,), lambda i: te.max(X[i, c1], axis=c1), name="m")
    Z = te.compute((N,), lambda i: te.sum(te.exp(X[i, c2] - m[i]), axis=c2), name="Z")
    logp = te.compute((N, C), lambda i, j: X[i, j] - m[i] - te.log(Z[i]), name="logp")
    loss = te.compute((1,), lambda _: -te.sum(logp[r, L[r, q]], axis=[r, q]), name="loss")
    kernel = te.build([X, L], [loss])
    assert ("logp: float64" in kernel.loop_ir) == (picked == C)
    x = rng.standard_normal((N, C))
    labels = np.stack([rng.permutation(C)[:picked] for _ in range(N)]).astype(np.int32)
    want = x - x.max(1, keepdims=True)
    want -= np.log(np.exp(want).sum(1, keepdims=True))
    np.testing.assert_allclose(kernel(x, labels), [-np.take_along_axis(want, labels, 1).sum()], rtol=1e-13)


def test_padding_read_many_times_in_reductions_is_stored():
    """A convolution reads each element of its zero-padded input F*K*K times
    inside its reduction: the padding select is stored once (no test in the
    inner loop); a 3-tap stencil, three reads per element, keeps it inlined."""
    n, c, size, f = 2, 4, 10, 8
    X = te.placeholder((n, c, size, size), "float64", "X")
    W = te.placeholder((f, c, 3, 3), "float64", "W")
    Xp = te.compute((n, c, size + 2, size + 2), lambda a, b, y, x: te.if_then_else(
        te.all(y >= 1, y < size + 1, x >= 1, x < size + 1), X[a, b, y - 1, x - 1], 0.0), name="Xp")
    rc, ry, rx = te.reduce_axis(c, "rc"), te.reduce_axis(3, "ry"), te.reduce_axis(3, "rx")
    Y = te.compute((n, f, size, size), lambda a, o, y, x: te.sum(
        Xp[a, rc, y + ry, x + rx] * W[o, rc, ry, rx], axis=[rc, ry, rx]), name="Y")
    assert "stage Xp:" in te.build([X, W], [Y]).loop_ir
    V = te.placeholder((40,), "float64", "V")
    Vp = te.compute((42,), lambda i: te.if_then_else(te.all(i >= 1, i < 41), V[i - 1], 0.0), name="Vp")
    t = te.reduce_axis(3, "t")
    S = te.compute((40,), lambda i: te.sum(Vp[i + t] * 0.25, axis=t), name="S")
    assert "stage Vp:" not in te.build([V], [S]).loop_ir


def test_store_and_recompute_overrides_change_the_cost_not_the_result():
    n, m = 24, 16
    X, A, B, C, Y = override_program(n, m)
    x = np.random.default_rng(4).standard_normal((n, m))
    base = te.cost([X], [Y])
    want = te.build([X], [Y])(x)

    rec = te.cost([X], [Y], recompute=[A])
    assert rec["temp_bytes"] == base["temp_bytes"] - n * m * 8
    assert rec["iterations"] == base["iterations"] - n * m
    np.testing.assert_allclose(te.build([X], [Y], recompute=[A])(x), want, rtol=1e-12)

    sto = te.cost([X], [Y], store=[C])
    assert sto["temp_bytes"] == base["temp_bytes"] + n * m * 8
    assert sto["iterations"] == base["iterations"] + n * m
    assert sto["stages"] == base["stages"] + 1
    np.testing.assert_allclose(te.build([X], [Y], store=[C])(x), want, rtol=1e-12)

    both = te.cost([X], [Y], store=[C], recompute=[A])
    assert both["temp_bytes"] == base["temp_bytes"]
    np.testing.assert_allclose(te.build([X], [Y], store=[C], recompute=[A])(x), want, rtol=1e-12)


def test_overrides_that_cannot_hold_are_errors():
    X, A, B, C, Y = override_program()
    with pytest.raises(ValueError, match="cannot recompute 'B': it is a reduction"):
        te.build([X], [Y], recompute=[B])
    with pytest.raises(ValueError, match="cannot recompute 'Y': it is an output"):
        te.cost([X], [Y], recompute=[Y])
    with pytest.raises(ValueError, match="both store= and recompute="):
        te.build([X], [Y], store=[C], recompute=[C])
    other = te.compute((3,), lambda i: X[i, 0] * 2.0, name="other")
    with pytest.raises(ValueError, match="'other'.*do not depend on"):
        te.build([X], [Y], store=[other])
    with pytest.raises(TypeError, match="store= must list tensors"):
        te.build([X], [Y], store=["A"])


# --------------------------------------------------------------------------- let-binding in the loop IR


def test_shared_subexpression_is_let_bound_once_in_the_loop_ir():
    X = te.placeholder((32,), "float32", "X")
    Y = te.compute((32,), lambda i: te.exp(X[i]) * te.exp(X[i]) + te.exp(X[i]), name="Y")
    ir = te.build([X], [Y]).loop_ir
    assert ir.count("exp(") == 1
    assert "let t1 = exp(X[i])" in ir
    assert "Y[i] = t1 * t1 + t1" in ir


def test_inlined_producer_read_three_times_is_let_bound():
    X = te.placeholder((8, 8), "float64", "X")
    E = te.compute((8, 8), lambda i, j: te.tanh(X[i, j]) * 3.0, name="E")
    k = te.reduce_axis(8, "k")
    Y = te.compute((8,), lambda i: te.sum(E[i, k] * E[i, k] - E[i, k], axis=k), name="Y")
    kernel = te.build([X], [Y])
    ir = kernel.loop_ir
    # E is read inside the reduction of Y and is a transcendental: stored, read
    # once per iteration through a let-bound load-free value
    assert ir.count("tanh(") == 1
    x = np.random.default_rng(5).standard_normal((8, 8))
    e = np.tanh(x) * 3
    np.testing.assert_allclose(kernel(x), (e * e - e).sum(1), rtol=1e-12)
    # recomputed inside the reduction, it is still evaluated once per iteration
    ir = te.build([X], [Y], recompute=[E]).loop_ir
    assert ir.count("tanh(") == 1 and "let t" in ir


def test_let_stays_inside_the_loop_of_the_variables_it_reads():
    X = te.placeholder((6, 5), "float64", "X")
    k = te.reduce_axis(5, "k")
    Y = te.compute((6,), lambda i: te.sum(te.sin(X[i, k]) * te.sin(X[i, k]) + te.sin(X[i, k]), axis=k)
                   + te.cos(X[i, 0]) * te.cos(X[i, 0]), name="Y")
    kernel = te.build([X], [Y])
    lines = kernel.loop_ir.splitlines()
    let_sin = next(n for n, line in enumerate(lines) if "= sin(" in line)
    loop_k = next(n for n, line in enumerate(lines) if "for k in" in line)
    assert let_sin > loop_k
    x = np.random.default_rng(6).standard_normal((6, 5))
    s = np.sin(x)
    np.testing.assert_allclose(kernel(x), (s * s + s).sum(1) + np.cos(x[:, 0]) ** 2, rtol=1e-12)


# --------------------------------------------------------------------------- report


def _report():
    """Print the measured figures behind the targets (``python tests/test_sharing.py``)."""
    chain_figures(4, 8)
    X = te.placeholder((16,), "float64", "X")
    Y = te.compute((16,), lambda i: deep_body(X[i]), name="Y")
    t0 = time.perf_counter()
    dX, = te.gradient(Y, [X])
    t1 = time.perf_counter()
    kernel = te.build([X], [Y, dX])
    t2 = time.perf_counter()
    print(f"deep DAG, {LEVELS} levels x 3 uses: te.gradient {t1 - t0:.3f} s, te.build {t2 - t1:.3f} s, "
          f"te.pretty(dX) {len(te.pretty(dX)):,} chars, DAG {count_nodes([dX.body])} nodes, "
          f"tree {tree_size(dX.body):.2e} nodes, loop IR {len(kernel.loop_ir):,} chars")
    t0 = time.perf_counter()
    lower([X], [Y, dX])
    print(f"  lowering alone {time.perf_counter() - t0:.3f} s")
    rows = {T: [chain_figures(T, 64 + r) for r in range(3)] for T in (30, 60)}
    for T, figs in rows.items():
        print(f"chain T={T}: gradient+build {min(s for s, _ in figs):.3f} s (CPU, best of 3), "
              f"iterations {figs[0][1]:,}")
    print(f"  ratios: time {min(s for s, _ in rows[60]) / min(s for s, _ in rows[30]):.2f}, "
          f"iterations {rows[60][0][1] / rows[30][0][1]:.2f}")
    ins, L = mlp()
    dW1, dW2 = te.gradient(L, [ins[1], ins[2]])
    c = [te.cost(ins, outs)["iterations"] for outs in ([L], [dW1, dW2], [L, dW1, dW2])]
    print(f"MLP 64x32x48x10: forward {c[0]:,} + backward {c[1]:,} = {c[0] + c[1]:,}; together {c[2]:,}")
    X, A, B, C, Y = override_program()
    for label, kw in (("default", {}), ("recompute=[A]", {"recompute": [A]}), ("store=[C]", {"store": [C]})):
        c = te.cost([X], [Y], **kw)
        print(f"overrides {label:14s} iterations {c['iterations']:5d} temp_bytes {c['temp_bytes']:5d} "
              f"stages {c['stages']}")


if __name__ == "__main__":
    _report()
