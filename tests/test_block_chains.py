"""Block chains (``lowering/block_chains.py``): a product whose buffer only
the row stages after it read runs with them a block of rows at a time, its
buffer shrunk to a block; values as the stages run apart and as numpy
computes them in float64."""
from math import isqrt

import numpy as np
import pytest

import te_autodiff as te
from lowering import pipeline


def _attention(h: int, T: int, d: int, dtype: str = "float32", output_scores: bool = False, reverse: bool = False,
               form: str = "plain"):
    """``(inputs, outputs)`` of ``loss = Σ softmax(Q Kᵀ / √d) V · H`` and its
    gradients, written as index formulas (the scores ``S``, the row max,
    ``exp``, the row sum, the softmax); with ``output_scores`` ``S`` is an
    output too, with ``reverse`` the row max reads ``S``'s rows backwards;
    ``form`` "temperature" scales inside the exponent (``exp((S - m) /
    √d)``), "reciprocal" multiplies by ``1 / Σ exp``."""
    Q, K, V, H = (te.placeholder((h, T, d), dtype, n) for n in "QKVH")
    k, j1, j2, j3 = (te.reduce_axis(n, name) for n, name in ((d, "k"), (T, "j"), (T, "j"), (T, "j")))
    scale, inner = (1.0, d ** -0.5) if form == "temperature" else (d ** -0.5, 1.0)
    S = te.compute((h, T, T), lambda a, i, j: te.sum(Q[a, i, k] * K[a, j, k], axis=k) * scale, name="S")
    M = te.compute((h, T), lambda a, i: te.max(S[a, T - 1 - i if reverse else i, j1], axis=j1), name="row_max")
    E = te.compute((h, T, T), lambda a, i, j: te.exp((S[a, i, j] - M[a, i]) * inner), name="exp")
    if form == "reciprocal":
        R = te.compute((h, T), lambda a, i: 1.0 / te.sum(E[a, i, j2], axis=j2), name="row_sum")
        P = te.compute((h, T, T), lambda a, i, j: E[a, i, j] * R[a, i], name="P")
    else:
        Z = te.compute((h, T), lambda a, i: te.sum(E[a, i, j2], axis=j2), name="row_sum")
        P = te.compute((h, T, T), lambda a, i, j: E[a, i, j] / Z[a, i], name="P")
    O = te.compute((h, T, d), lambda a, i, c: te.sum(P[a, i, j3] * V[a, j3, c], axis=j3), name="O")
    r = [te.reduce_axis(n, f"r{x}") for x, n in enumerate((h, T, d))]
    loss = te.compute((1,), lambda _: te.sum(O[r[0], r[1], r[2]] * H[r[0], r[1], r[2]], axis=r), name="loss")
    return [Q, K, V, H], [loss, *te.gradient(loss, [Q, K, V])] + ([S] if output_scores else [])


def _numpy(q, k, v, hh, reverse=False, causal=False):
    """The loss and its gradients in float64, by hand."""
    q, k, v, hh = (x.astype(np.float64) for x in (q, k, v, hh))
    scale = q.shape[-1] ** -0.5
    s = q @ k.swapaxes(-1, -2) * scale
    keep = np.tril(np.ones(s.shape[-2:], bool)) if causal else True
    s = np.where(keep, s, -1e4)
    m = (s[..., ::-1, :] if reverse else s).max(-1, keepdims=True)
    p = np.exp(s - m)
    p /= p.sum(-1, keepdims=True)
    dp = hh @ v.swapaxes(-1, -2)
    ds = p * (dp - np.sum(dp * p, -1, keepdims=True)) * scale * keep
    return [np.vdot(p @ v, hh), ds @ k, ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ hh]


def _block_bytes() -> int:
    """The most of a product's buffer a block holds (``block_chains._blocks``)."""
    t = te.target()
    return max(t.l2_bytes, t.l3_bytes) // 4


def _rows(h: int, large: bool) -> int:
    """``T``: ``h`` float32 ``T x T`` matrices beyond every thread's L2 (the
    join's threshold), each larger than a block, when ``large``; else a
    quarter of the threshold; never a multiple of a register tile's rows
    or columns."""
    t = te.target()
    edge = isqrt(t.l2_bytes * t.threads // (4 * h))
    return max(edge, isqrt(_block_bytes() // 4)) + 53 if large else edge // 2 + 1


def _prime_from(n: int) -> int:
    """The least prime from ``n`` on: no block of rows divides it."""
    while any(n % f == 0 for f in range(2, isqrt(n) + 1)):
        n += 1
    return n


def _build(inputs, outputs, joined: bool, monkeypatch):
    with monkeypatch.context() as m:
        if not joined:
            m.setattr(pipeline, "join_blocks", lambda program, target: program)
        return te.build(inputs, outputs)


def _stages(kernel) -> list:
    return [set(line.split()[1].rstrip(":").split("+")) for line in kernel.scheduled_ir.splitlines()
            if line.startswith("stage ")]


def _data(rng, shape, dtype, count=4):
    return [rng.standard_normal(shape).astype(dtype) for _ in range(count)]


@pytest.mark.parametrize("large", [False, True])
def test_attention_products_run_with_their_row_stages_a_block_at_a_time(rng, monkeypatch, large):
    """The scores join the softmax's row stages, and the gradient's ``dP =
    H Vᵀ`` the row stages reading it, once the scores of all heads leave L2
    (on both sides of that); joined, neither ``T x T`` buffer stays (the
    built temporaries shrink by both, less their blocks).  ``T`` is no
    multiple of a tile: the remainder tiles run in the last block."""
    h = 4
    T = _rows(h, large)
    inputs, outputs = _attention(h, T, 64)
    joined, apart = (_build(inputs, outputs, flag, monkeypatch) for flag in (True, False))
    stages = _stages(joined)
    assert any({"S.r1", "row_max", "exp", "row_sum"} <= s for s in stages) == large, stages
    assert any({"dP", "drow_sum", "dS.r1"} <= s for s in stages) == large, stages
    for name in ("S.r1", "dP"):
        whole, kept = (next(b for b in k.program.buffers if b.name == name) for k in (apart, joined))
        assert whole.nbytes >= h * T * T * 4
        if large:
            assert kept.shape[1] < T and kept.nbytes <= h * (_block_bytes() + 16 * kept.shape[-1] * 4), kept
        else:
            assert kept.shape == whole.shape
    arrays = _data(rng, (h, T, 64), np.float32)
    got, same = joined(*arrays), apart(*arrays)
    for g, w in zip(got, same):             # the same operations; LLVM may round a last bit apart
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * np.abs(w).max())
    for g, w in zip(got, _numpy(*arrays)):
        np.testing.assert_allclose(np.ravel(g), np.ravel(w), rtol=1e-3, atol=2e-4 * np.abs(w).max())


@pytest.mark.parametrize("form, h", [("temperature", 2), ("reciprocal", 2), ("reciprocal", 1)])
def test_attention_written_otherwise_joins_its_scores_too(rng, form, h):
    """The scale inside the exponent, or the softmax as ``E · (1 / Σ E)``:
    the max's derivative cancels as in the usual form
    (``te_autodiff/shift_invariance.py``), so no argmax pass reads the
    scores again and they join the softmax's row stages; the adjoint of
    ``1 / Σ`` is computed in its row sum's loop (``fuse.py``), so ``dP``
    joins the gradient's row stages (one head too, whose loops of one
    iteration add nothing to the sum's index).  Both buffers a block a
    head (with one head, a block a thread group); values as numpy's."""
    T = _rows(h, True)
    inputs, outputs = _attention(h, T, 32, form=form)
    kernel = te.build(inputs, outputs)
    assert "argmax" not in kernel.scheduled_ir
    buffers = [b for b in kernel.program.buffers if b.name in ("S", "S.r1", "dP")]
    assert len(buffers) == 2, buffers
    slots = max(te.target().threads, h)
    for kept in buffers:
        assert kept.shape[-2] < T and kept.nbytes <= slots * (_block_bytes() + 16 * kept.shape[-1] * 4), kept
    arrays = _data(rng, (h, T, 32), np.float32)
    for g, w in zip(kernel(*arrays), _numpy(*arrays)):
        np.testing.assert_allclose(np.ravel(g), np.ravel(w), rtol=1e-3, atol=2e-4 * np.abs(w).max())


def test_a_product_with_row_blocks_and_float64_joins_its_row_stages(rng):
    """float64 scores whose row operand (``T x 256`` a head) outgrows the
    row blocks' budget on either target: the product's own blocks of rows
    number its tiles, and restricting its row tiles to a block still runs
    each tile once.  Values as numpy's."""
    h, d = 4, 256
    t = te.target()
    T = max(isqrt(t.l2_bytes * t.threads // (8 * h)) + 29, t.l2_bytes // (2 * 8 * d) + 7)
    inputs, outputs = _attention(h, T, d, "float64")
    kernel = te.build(inputs, outputs)
    stages = _stages(kernel)
    assert any({"S.r1", "exp"} <= s for s in stages), stages
    joined = kernel.scheduled_ir.split("stage S.r1+")[1].split("stage ")[0]
    assert any(line.strip().startswith("for i.b ") for line in joined.splitlines()), "the product keeps its row blocks"
    arrays = _data(rng, (h, T, d), np.float64)
    for g, w in zip(kernel(*arrays), _numpy(*arrays)):
        np.testing.assert_allclose(np.ravel(g), np.ravel(w), rtol=1e-9, atol=1e-11 * np.abs(w).max())


@pytest.mark.parametrize("case", ["output", "reverse"])
def test_a_product_others_read_stays_whole(rng, case):
    """The scores stay a whole buffer of their own stage when they are an
    output too, or when the row max reads row ``T - 1 - i`` (the joined
    loop would not have written it yet); the gradient's ``dP`` still
    joins.  Values as numpy's."""
    h = 4
    T = _rows(h, True)
    inputs, outputs = _attention(h, T, 32, output_scores=case == "output", reverse=case == "reverse")
    kernel = te.build(inputs, outputs)
    stages = _stages(kernel)
    assert any(len(s) == 1 and next(iter(s)).split(".")[0] == "S" for s in stages), stages
    assert any({"dP", "drow_sum"} <= s for s in stages), stages
    arrays = _data(rng, (h, T, 32), np.float32)
    got = kernel(*arrays)
    for g, w in zip(got, _numpy(*arrays, reverse=case == "reverse")):
        np.testing.assert_allclose(np.ravel(g), np.ravel(w), rtol=1e-3, atol=2e-4 * np.abs(w).max())
    if case == "output":
        q, k = (x.astype(np.float64) for x in arrays[:2])
        np.testing.assert_allclose(got[-1], q @ k.transpose(0, 2, 1) / np.sqrt(32), rtol=1e-4, atol=1e-4)


def _attention_2d(T: int, d: int):
    """``_attention`` of one head written without a head axis: ``Q``, ``K``,
    ``V``, ``H`` are ``T x d``."""
    Q, K, V, H = (te.placeholder((T, d), "float32", n) for n in "QKVH")
    k, j1, j2, j3 = (te.reduce_axis(n, name) for n, name in ((d, "k"), (T, "j"), (T, "j"), (T, "j")))
    S = te.compute((T, T), lambda i, j: te.sum(Q[i, k] * K[j, k], axis=k) * d ** -0.5, name="S")
    M = te.compute((T,), lambda i: te.max(S[i, j1], axis=j1), name="row_max")
    E = te.compute((T, T), lambda i, j: te.exp(S[i, j] - M[i]), name="exp")
    Z = te.compute((T,), lambda i: te.sum(E[i, j2], axis=j2), name="row_sum")
    P = te.compute((T, T), lambda i, j: E[i, j] / Z[i], name="P")
    O = te.compute((T, d), lambda i, c: te.sum(P[i, j3] * V[j3, c], axis=j3), name="O")
    r = [te.reduce_axis(n, f"r{x}") for x, n in enumerate((T, d))]
    loss = te.compute((1,), lambda _: te.sum(O[r[0], r[1]] * H[r[0], r[1]], axis=r), name="loss")
    return [Q, K, V, H], [loss, *te.gradient(loss, [Q, K, V])]


def _attention_4d(b: int, h: int, T: int, d: int, causal: bool = False):
    """``_attention`` over a batch: ``Q``, ``K``, ``V``, ``H`` are ``b x h x T
    x d``; ``causal`` masks the scores of later keys with -1e4."""
    Q, K, V, H = (te.placeholder((b, h, T, d), "float32", n) for n in "QKVH")
    k, j1, j2, j3 = (te.reduce_axis(n, name) for n, name in ((d, "k"), (T, "j"), (T, "j"), (T, "j")))

    def scores(x, a, i, j):
        s = te.sum(Q[x, a, i, k] * K[x, a, j, k], axis=k) * d ** -0.5
        return te.if_then_else(j <= i, s, -1e4) if causal else s
    S = te.compute((b, h, T, T), scores, name="S")
    M = te.compute((b, h, T), lambda x, a, i: te.max(S[x, a, i, j1], axis=j1), name="row_max")
    E = te.compute((b, h, T, T), lambda x, a, i, j: te.exp(S[x, a, i, j] - M[x, a, i]), name="exp")
    Z = te.compute((b, h, T), lambda x, a, i: te.sum(E[x, a, i, j2], axis=j2), name="row_sum")
    P = te.compute((b, h, T, T), lambda x, a, i, j: E[x, a, i, j] / Z[x, a, i], name="P")
    O = te.compute((b, h, T, d), lambda x, a, i, c: te.sum(P[x, a, i, j3] * V[x, a, j3, c], axis=j3), name="O")
    r = [te.reduce_axis(n, f"r{x}") for x, n in enumerate((b, h, T, d))]
    loss = te.compute((1,), lambda _: te.sum(O[r[0], r[1], r[2], r[3]] * H[r[0], r[1], r[2], r[3]], axis=r),
                      name="loss")
    return [Q, K, V, H], [loss, *te.gradient(loss, [Q, K, V])]


@pytest.mark.parametrize("form", ["one head", "no head axis"])
def test_a_product_without_outer_loops_shares_blocks_among_thread_groups(rng, monkeypatch, form):
    """One head (its loop of one iteration) or none: the scores' parallel
    root is a column loop, so no loop outside the blocks names a slot.
    The chain's root is then ``target.threads`` groups, each running a
    share of the blocks (their count a multiple of the groups) in a slot
    of its own; the ``T x T`` buffers shrink to those slots.  Values as the
    stages run apart and as numpy's."""
    t = te.target()
    T = _rows(1, True)
    inputs, outputs = _attention(1, T, 64) if form == "one head" else _attention_2d(T, 64)
    joined, apart = (_build(inputs, outputs, flag, monkeypatch) for flag in (True, False))
    stages = _stages(joined)
    assert any({"S.r1", "row_max", "exp", "row_sum"} <= s for s in stages), stages
    assert any({"dP", "drow_sum", "dS.r1"} <= s for s in stages), stages
    chain = joined.scheduled_ir.split("stage S.r1+")[1].splitlines()
    assert chain[1].strip() == f"parallel for i.G in 0..{t.threads}:", chain[:3]
    blocks = int(chain[2].split("i.G * ")[1].split(" //")[0])
    assert blocks % t.threads == 0 and blocks >= t.threads, chain[2]
    for name in ("S.r1", "dP"):
        kept = next(b for b in joined.program.buffers if b.name == name)
        assert kept.shape[0] == t.threads and kept.shape[1] < T, kept
        assert kept.nbytes <= t.threads * (_block_bytes() + 16 * kept.shape[-1] * 4), kept
    shape = (1, T, 64) if form == "one head" else (T, 64)
    arrays = _data(rng, shape, np.float32)
    got, same = joined(*arrays), apart(*arrays)
    for g, w in zip(got, same):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * np.abs(w).max())
    for g, w in zip(got, _numpy(*[a.reshape(1, T, 64) for a in arrays])):
        np.testing.assert_allclose(np.ravel(g), np.ravel(w), rtol=1e-3, atol=2e-4 * np.abs(w).max())


@pytest.mark.parametrize("h, d, dtype", [(2, 64, "float32"), (3, 48, "float32"), (3, 48, "float64"),
                                         (5, 32, "float32")])
def test_heads_a_product_computes_in_one_nest_join_a_block_of_one_head_at_a_time(rng, monkeypatch, h, d, dtype):
    """Heads the threads do not share out as the scores' parallel root
    (fewer than the root needs, or a count the threads do not divide):
    the root is then a column loop with the heads' loop inside it, or a
    loop of heads and columns collapsed into one that numbers a store's
    head by ``x // c`` or ``x % c`` (which of these depends on the target).
    A block is a run of one head's rows: the product's nest runs for that
    head (its loop, or the collapsed loop's iterations of it) and the
    block's tiles, and the ``T x T`` buffers shrink to a block a thread
    group whatever the heads.  ``T`` is prime, so each head ends with a
    short block.  Values as the stages run apart and as numpy's."""
    t = te.target()
    T = _prime_from(_rows(h, True))
    inputs, outputs = _attention(h, T, d, dtype)
    joined, apart = (_build(inputs, outputs, flag, monkeypatch) for flag in (True, False))
    stages = _stages(joined)
    assert any({"S.r1", "row_max", "exp", "row_sum"} <= s for s in stages), stages
    assert any({"dP", "drow_sum", "dS.r1"} <= s for s in stages), stages
    chain = joined.scheduled_ir.split("stage S.r1+")[1].splitlines()
    root = chain[1].strip()
    assert root.startswith("parallel for ") and root.endswith(f".G in 0..{t.threads}:"), root
    for name in ("S.r1", "dP"):
        kept = next(b for b in joined.program.buffers if b.name == name)
        assert kept.shape[0] == t.threads and kept.shape[1] < T and kept.nbytes < h * T * T * kept.itemsize, kept
        assert T % kept.shape[1], kept
    arrays = _data(rng, (h, T, d), np.dtype(dtype))
    got, same = joined(*arrays), apart(*arrays)
    close = 1e-5 if dtype == "float32" else 1e-12
    for g, w in zip(got, same):
        np.testing.assert_allclose(g, w, rtol=close, atol=close * np.abs(w).max())
    for g, w in zip(got, _numpy(*arrays)):
        np.testing.assert_allclose(np.ravel(g), np.ravel(w), rtol=100 * close, atol=20 * close * np.abs(w).max())


def test_a_product_in_blocks_of_row_tiles_joins_by_its_tiles(rng, monkeypatch):
    """One head in float64 whose ``Q`` rows exceed half of L2: where the
    product runs its column tiles first, over ``K`` copied into column
    panels, it walks its row tiles in blocks of rows (``row_blocks.py``), a
    loop of its own or a block's first tile added to the tile loop (a target
    of 16-byte vectors reads ``K`` in place, rows first, in one pass); a
    block of the chain clips the tile loop, the blocks of tiles around it
    counted, so the scores still shrink to a block a thread group.  Values
    as the stages run apart and as numpy's."""
    t, d = te.target(), 64
    T = _prime_from(t.l2_bytes // (2 * d * 8) + 53)
    inputs, outputs = _attention(1, T, d, "float64")
    joined, apart = (_build(inputs, outputs, flag, monkeypatch) for flag in (True, False))
    assert any({"S.r1", "row_max", "exp", "row_sum"} <= s for s in _stages(joined)), _stages(joined)
    before, product = apart.scheduled_ir.split("stage S.r1:")
    assert (".b in 0.." in product.split("stage ")[0]) == ("stage K.packed:" in before)
    kept = next(b for b in joined.program.buffers if b.name == "S.r1")
    assert kept.shape[0] == t.threads and kept.shape[1] < T, kept
    arrays = _data(rng, (1, T, d), np.float64)
    got, same = joined(*arrays), apart(*arrays)
    for g, w in zip(got, same):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12 * np.abs(w).max())
    for g, w in zip(got, _numpy(*arrays)):
        np.testing.assert_allclose(np.ravel(g), np.ravel(w), rtol=1e-10, atol=1e-11 * np.abs(w).max())


@pytest.mark.parametrize("b, h", [(2, 4), (2, 3), (3, 1)])
def test_a_batch_of_heads_joins_a_block_of_one_head_at_a_time(rng, monkeypatch, b, h):
    """Attention over a batch of heads (``b x h x T x d``): the scores'
    buffer has two leading axes, whichever loops (or collapsed loops) the
    product walks them by, and the row stages may walk heads and rows as
    one merged loop with the batch outside it; an axis of one head (whose
    stride is the batch's) names no head.  A block is a run of one
    (batch, head)'s rows, each leading axis's loop running its digit of
    that pair, the row stages' loops their digits of the row; both
    ``T x T`` buffers shrink to a block a thread group, or a slot an
    outer loop.  Values as the stages run apart and as numpy's."""
    t = te.target()
    T = _prime_from(_rows(b * h, True))
    inputs, outputs = _attention_4d(b, h, T, 32)
    joined, apart = (_build(inputs, outputs, flag, monkeypatch) for flag in (True, False))
    stages = _stages(joined)
    assert any({"S.r1", "row_max", "exp", "row_sum"} <= s for s in stages), stages
    assert any({"dP", "drow_sum", "dS.r1"} <= s for s in stages), stages
    for name in ("S.r1", "dP"):
        kept = next(x for x in joined.program.buffers if x.name == name)
        assert kept.nbytes <= max(t.threads, b * h) * (_block_bytes() + 16 * kept.shape[-1] * 4), kept
    arrays = _data(rng, (b, h, T, 32), np.float32)
    got, same = joined(*arrays), apart(*arrays)
    for g, w in zip(got, same):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * np.abs(w).max())
    for g, w in zip(got, _numpy(*arrays)):
        np.testing.assert_allclose(np.ravel(g), np.ravel(w), rtol=1e-3, atol=2e-4 * np.abs(w).max())


@pytest.mark.parametrize("b, h", [(1, 2), (2, 2)])
def test_a_causal_batch_of_heads_joins_its_gradient_rows(rng, monkeypatch, b, h):
    """The mask's test ``j <= i`` in the scores' gradient reads the row, so
    that stage could not walk heads and rows as one loop as the row stages
    before it do (``merged_loops.py``): the rows then met in no common loop
    and ``dP`` stayed whole.  The merged loop reads its row ``q % T`` in the
    test; the gradient's row stages run with ``dP`` a block at a time.
    Values as the stages run apart and as numpy's."""
    t = te.target()
    T = _prime_from(_rows(b * h, True))
    inputs, outputs = _attention_4d(b, h, T, 32, causal=True)
    joined, apart = (_build(inputs, outputs, flag, monkeypatch) for flag in (True, False))
    assert any({"dP", "drow_sum", "dS.r1"} <= s for s in _stages(joined)), _stages(joined)
    kept = next(x for x in joined.program.buffers if x.name == "dP")
    assert kept.nbytes <= max(t.threads, b * h) * (_block_bytes() + 16 * kept.shape[-1] * 4), kept
    arrays = _data(rng, (b, h, T, 32), np.float32)
    got, same = joined(*arrays), apart(*arrays)
    for g, w in zip(got, same):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * np.abs(w).max())
    for g, w in zip(got, _numpy(*arrays, causal=True)):
        np.testing.assert_allclose(np.ravel(g), np.ravel(w), rtol=1e-3, atol=2e-4 * np.abs(w).max())


@pytest.mark.parametrize("copy_joins", [False, True])
def test_a_product_joins_its_rows_not_its_copy(rng, monkeypatch, copy_joins):
    """Three heads on the AVX2 build: the key panels' copy and the scores'
    product walk the same loops (column panels, heads), and the copy, a
    thread's share, would leave L2 (``T`` 1024): row chains would run the
    copy a panel at a time before the product, which then could not run
    with its softmax a block of rows at a time.  A chain of copies takes
    in no stage that is not one; with that rule off (``copy_joins``) the
    copy joins the product and both ``T x T`` buffers stay whole.  Values
    as numpy's where this machine runs the AVX2 build."""
    from lowering import row_chains
    if copy_joins:
        monkeypatch.setattr(row_chains, "_copies_into", lambda chain, stage: False)
    target, T = te.target("haswell"), 1021
    inputs, outputs = _attention(3, T, 64)
    program = pipeline.lower_for(inputs, outputs, target=target).scheduled
    names = [set(st.name.split("+")) for st in program.stages]
    assert ({"K.packed", "S.r1"} in names) == copy_joins, names
    assert any({"S.r1", "row_max", "exp", "row_sum"} <= n for n in names) != copy_joins, names
    kept = next(b for b in program.buffers if b.name == "S.r1")
    assert (kept.nbytes < 3 * T * T * 4) != copy_joins, kept
    host = te.target()
    if copy_joins or not (host.x86 and host.vector_bytes >= 32):
        return
    arrays = _data(rng, (3, T, 64), np.float32)
    got = te.build(inputs, outputs, target=target)(*arrays)
    for g, w in zip(got, _numpy(*arrays)):
        np.testing.assert_allclose(np.ravel(g), np.ravel(w), rtol=1e-3, atol=2e-4 * np.abs(w).max())


def test_a_reduction_of_a_product_may_run_with_it(rng, monkeypatch):
    """``Σ (A B) · H`` with ``C = A B`` of 4 MB: the partial sums read ``C``
    in parts of rows, each part a row of the chain.  Where the product's
    tiles (or its own row blocks) hold whole parts (AVX-512: blocks of 128
    rows against parts of 64) the sums run with the product a block at a
    time and ``C`` shrinks; where they do not (AVX2's 6-row tiles) both
    stay apart.  Values as the stages run apart and as numpy's."""
    n = 1024
    A, B, H = (te.placeholder((n, n), "float32", x) for x in "ABH")
    k = te.reduce_axis(n, "k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    r = [te.reduce_axis(n, f"r{x}") for x in range(2)]
    loss = te.compute((1,), lambda _: te.sum(C[r[0], r[1]] * H[r[0], r[1]], axis=r), name="loss")
    outputs = [loss, *te.gradient(loss, [A, B])]
    joined, apart = (_build([A, B, H], outputs, flag, monkeypatch) for flag in (True, False))
    together = any({"C", "loss.parts"} <= s for s in _stages(joined))
    kept = next(b for b in joined.program.buffers if b.name == "C")
    assert (kept.nbytes < n * n * 4) == together, kept
    a, b, h = _data(rng, (n, n), np.float32, 3)
    got, same = joined(a, b, h), apart(a, b, h)
    for g, w in zip(got, same):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * np.abs(w).max())
    a64, b64, h64 = (x.astype(np.float64) for x in (a, b, h))
    want = [np.vdot(a64 @ b64, h64), h64 @ b64.T, a64.T @ h64]
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.ravel(g), np.ravel(w), rtol=1e-4, atol=1e-5 * np.abs(w).max())
