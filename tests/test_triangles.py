"""Triangles (``lowering/schedule/triangles.py``): a reduction whose range
moves with an output row runs as register-tiled rectangles over blocks of
rows plus each row's rest, in pairs of blocks that share the work evenly."""
import re
from dataclasses import replace

import numpy as np
import pytest

import te_autodiff as te
from lowering.loop_ir import For, Prefetch, free_leaves, linear_form, loads_in, stmt_exprs, substitute, walk
from lowering.pipeline import lower_for
from lowering.schedule import TILE_VECTORS, blocking
from lowering.schedule.constructors import idx
from te_autodiff.expr import Const

ROWS = blocking(te.target()).tile_rows
MASKS = {                                                   # (te mask, numpy mask)
    "causal": lambda i, j: j <= i,
    "anticausal": lambda i, j: j >= i,
    "strict": lambda i, j: j < i,
    "band": lambda i, j: (i - 3 <= j) & (j < 2 * i + 1),
    "steep": lambda i, j: j <= 2 * i + 1,
}


def masked_product(n, m, d, mask, dtype="float64"):
    """``Y[i, j] = mask(i, j) ? sum_k Q[i, k] K[j, k] : 0`` and the loss ``sum
    Y H``: zero elimination bounds ``dQ``'s sum over ``j`` and ``dK``'s over
    ``i`` by the mask, each moving with the other's row."""
    Q, K, H = (te.placeholder(s, dtype, x) for s, x in (((n, d), "Q"), ((m, d), "K"), ((n, m), "H")))
    k = te.reduce_axis(d, "k")
    te_mask = (lambda i, j: te.all(i - 3 <= j, j < 2 * i + 1)) if mask == "band" else MASKS[mask]
    Y = te.compute((n, m), lambda i, j: te.if_then_else(te_mask(i, j), te.sum(Q[i, k] * K[j, k], axis=k), 0.0),
                   name="Y")
    r = [te.reduce_axis(n, "r0"), te.reduce_axis(m, "r1")]
    loss = te.compute((1,), lambda _: te.sum(Y[r[0], r[1]] * H[r[0], r[1]], axis=r), name="loss")
    return [Q, K, H], [loss, *te.gradient(loss, [Q, K])], Y


def reference(q, k, h, mask):
    """numpy's loss and gradients, and a bound on each gradient's rounding:
    ``n`` terms summed in float64 err by at most ``n eps`` times the sum of
    their magnitudes."""
    i, j = np.meshgrid(np.arange(q.shape[0]), np.arange(k.shape[0]), indexing="ij")
    hm = h * MASKS[mask](i, j)
    want = [np.vdot((q @ k.T), hm), hm @ k, hm.T @ q]
    eps = np.finfo(np.float64).eps
    bounds = [abs(want[0]) * 1e-12, k.shape[0] * eps * (abs(hm) @ abs(k)), q.shape[0] * eps * (abs(hm).T @ abs(q))]
    return want, bounds


@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("n", [2 * ROWS - 1, 2 * ROWS, 2 * ROWS + 1, 4 * ROWS + 3, 5 * ROWS])
def test_masked_gradients_run_as_rectangles_and_rows(rng, mask, n):
    """Both sides of the rule's threshold (two blocks of tile rows) and of
    whole pairs of blocks (the rows left run as one smaller block)."""
    m, d = n + 5, 7
    inputs, outputs, _ = masked_product(n, m, d, mask)
    kernel = te.build(inputs, outputs)
    q, k, h = rng.standard_normal((n, d)), rng.standard_normal((m, d)), rng.standard_normal((n, m))
    got = kernel(q, k, h)
    want, bounds = reference(q, k, h, mask)
    for g, w, b in zip(got, want, bounds):
        assert np.all(np.abs(np.reshape(g, np.shape(w)) - w) <= 4 * b + 1e-300)
    names = [s.name for s in kernel.program.stages]
    for grad, rows in (("dQ", n), ("dK", m)):       # dK's rows are K's
        parts = [x for x in names if x.startswith(grad)]
        if rows < 2 * ROWS:
            assert parts == [grad]
        else:
            assert f"{grad}.rectangles" in parts and f"{grad}.diagonal" in parts
            assert (f"{grad}.rectangles.last" in parts) == (rows % (2 * ROWS) != 0)
    for name in names:                  # the mask, inlined in the sums, is decided by their ranges
        if ".rectangles" in name or ".diagonal" in name:
            assert "select(" not in _stage_text(kernel, name)


def _stage_text(kernel, name):
    return str(kernel.program).split(f"stage {name}:")[1].split("\nstage ")[0]


def test_gradients_through_the_blocks_match_finite_differences(rng):
    n = 2 * ROWS + 3
    inputs, _, Y = masked_product(n, n + 2, 3, "band")
    q, k = rng.standard_normal((n, 3)), rng.standard_normal((n + 2, 3))
    h = rng.standard_normal((n, n + 2))
    te.check_gradient(Y, inputs[:2], [q, k], head=h, rtol=1e-6, atol=1e-8)


def test_rectangles_are_register_tiled():
    """Each block is one register tile of the target's tile rows; the rows'
    rest stays a plain vector loop."""
    n = 8 * ROWS
    inputs, outputs, _ = masked_product(n, n, 64, "causal", "float32")
    kernel = te.build(inputs, outputs)
    text = str(kernel.program)
    rect = text.split("stage dQ.rectangles:")[1].split("stage ")[0]
    assert len(set(re.findall(r"acc\d+\.\d+\.(\d+): ", rect))) == ROWS * TILE_VECTORS


def test_pairs_of_blocks_share_the_work_evenly():
    """Pair ``p`` runs blocks ``p`` and ``2 P - 1 - p``: under a causal mask
    their rectangles add to the same length for every ``p``, so the
    runtime's equal chunks of pairs are equal work on any number of threads."""
    n = 12 * ROWS
    inputs, outputs, _ = masked_product(n, n, 16, "causal", "float32")
    program = lower_for(inputs, outputs).scheduled
    stage = next(s for s in program.stages if s.name.startswith("dQ.rectangles"))
    loop = next(x for x in walk(stage.body) if isinstance(x, For) and not isinstance(x.extent, Const))
    pair, side = (next(v for v in free_leaves(loop.extent) if v.name.endswith(s)) for s in (".p", ".s"))
    work = [sum(substitute(loop.extent, {pair: idx(p), side: idx(s)}).value for s in (0, 1))
            for p in range(n // (2 * ROWS))]
    assert len(set(work)) == 1 and work[0] > 0


def test_causal_attention_gradients_with_heads(rng):
    """Softmax attention masked on its scores, three heads, rows not a
    multiple of the blocks: ``dQ`` and ``dK`` run in blocks and match numpy."""
    h, T, d = 3, 4 * ROWS + 5, 16
    Q, K, V, G = (te.placeholder((h, T, d), "float64", x) for x in "QKVG")
    k, j1, j2, j3 = te.reduce_axis(d, "k"), te.reduce_axis(T, "j"), te.reduce_axis(T, "j"), te.reduce_axis(T, "j")
    S = te.compute((h, T, T), lambda a, i, j: te.if_then_else(j <= i, te.sum(Q[a, i, k] * K[a, j, k], axis=k), -1e4),
                   name="S")
    M = te.compute((h, T), lambda a, i: te.max(S[a, i, j1], axis=j1), name="M")
    E = te.compute((h, T, T), lambda a, i, j: te.exp(S[a, i, j] - M[a, i]), name="E")
    Z = te.compute((h, T), lambda a, i: te.sum(E[a, i, j2], axis=j2), name="Z")
    O = te.compute((h, T, d), lambda a, i, c: te.sum(E[a, i, j3] / Z[a, i] * V[a, j3, c], axis=j3), name="O")
    r = [te.reduce_axis(x, f"r{n}") for n, x in enumerate((h, T, d))]
    loss = te.compute((1,), lambda _: te.sum(O[r[0], r[1], r[2]] * G[r[0], r[1], r[2]], axis=r), name="loss")
    kernel = te.build([Q, K, V, G], [loss, *te.gradient(loss, [Q, K, V])])
    assert any(s.name.startswith("dQ.rectangles") for s in kernel.program.stages)
    q, kk, v, g = (rng.standard_normal((h, T, d)) for _ in range(4))
    s = np.where(np.tril(np.ones((T, T), bool)), q @ kk.swapaxes(1, 2), -1e4)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = g @ v.swapaxes(1, 2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * np.tril(np.ones((T, T)))
    want = [np.vdot(p @ v, g), ds @ kk, ds.swapaxes(1, 2) @ q, p.swapaxes(1, 2) @ g]
    for got, w in zip(kernel(q, kk, v, g), want):
        np.testing.assert_allclose(np.reshape(got, np.shape(w)), w, rtol=1e-9, atol=1e-9 * np.abs(w).max())


def test_a_triangle_inside_a_sum_over_heads_runs_in_blocks(rng):
    """Heads sharing their keys in groups (grouped-query attention's ``K[a
    // g]``): the key gradient sums over the group's heads, then over the
    rows the mask keeps, ``i >= j``; the rows' loop inside the heads' loop
    runs in blocks as before.  Values as numpy's."""
    h, g, n, d = 4, 2, 4 * ROWS + 3, 8
    Q, H = te.placeholder((h, n, d), "float64", "Q"), te.placeholder((h, n, n), "float64", "H")
    K = te.placeholder((h // g, n, d), "float64", "K")
    k = te.reduce_axis(d, "k")
    Y = te.compute((h, n, n), lambda a, i, j: te.if_then_else(j <= i, te.sum(Q[a, i, k] * K[a // g, j, k], axis=k),
                                                               0.0), name="Y")
    r = [te.reduce_axis(x, f"r{m}") for m, x in enumerate((h, n, n))]
    loss = te.compute((1,), lambda _: te.sum(Y[r[0], r[1], r[2]] * H[r[0], r[1], r[2]], axis=r), name="loss")
    kernel = te.build([Q, K, H], [loss, *te.gradient(loss, [Q, K])])
    assert "dK.rectangles" in [s.name for s in kernel.program.stages]
    q, kk, hh = rng.standard_normal((h, n, d)), rng.standard_normal((h // g, n, d)), rng.standard_normal((h, n, n))
    hm = hh * np.tril(np.ones((n, n)))
    kr = np.repeat(kk, g, 0)
    want = [np.vdot(q @ kr.swapaxes(1, 2), hm), hm @ kr, (hm.swapaxes(1, 2) @ q).reshape(h // g, g, n, d).sum(1)]
    for got, w in zip(kernel(q, kk, hh), want):
        np.testing.assert_allclose(np.reshape(got, np.shape(w)), w, rtol=1e-11, atol=1e-11 * np.abs(w).max())


@pytest.mark.parametrize("name", ["haswell", "skylake-avx512"])
@pytest.mark.parametrize("scale", [0.25, 4])
def test_a_triangle_walking_beyond_l2_asks_for_its_next_line(rng, name, scale):
    """``dK``'s rectangles read ``H`` down its columns, a block of rows at a
    time.  The rows the walk covers are those of every block (the pair and
    side loops), and a step loop whose extent moves with the block counts
    its longest: over a triangle ``scale`` times L2 each step asks for the
    next line (one hint in the loop, a line further), at a quarter of L2
    none.  Values against numpy's."""
    target = replace(te.target(name), threads=2)
    n = int((scale * target.l2_bytes / 8) ** 0.5) // 32 * 32
    inputs, outputs, _ = masked_product(n, n, 8, "causal")
    kernel = te.build(inputs, outputs, target=target)
    rect = next(s for s in kernel.program.stages if s.name == "dK.rectangles")
    hints = [x for x in walk(rect.body) if isinstance(x, Prefetch) and x.buffer.name == "H"]
    assert len(hints) == (scale > 1), hints
    if hints:
        loop = next(x for x in walk(rect.body) if isinstance(x, For) and hints[0] in x.body.stmts)
        assert not isinstance(loop.extent, Const)
        reads = [linear_form(x.index) for s in walk(loop.body) for x in loads_in(stmt_exprs(s), set())
                 if x.buffer.name == "H"]
        terms, ahead = linear_form(hints[0].index)
        assert ahead - min(c for t, c in reads if t == terms) == target.cache_line // 8
    if kernel.target.missing_on_host() is None:
        q, k, h = rng.standard_normal((n, 8)), rng.standard_normal((n, 8)), rng.standard_normal((n, n))
        want, bounds = reference(q, k, h, "causal")
        for g, w, b in zip(kernel(q, k, h), want, bounds):
            assert np.all(np.abs(np.reshape(g, np.shape(w)) - w) <= 4 * b + 1e-300)
