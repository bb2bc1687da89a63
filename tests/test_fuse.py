"""Stage fusion (lowering/fuse.py): fused programs make fewer passes and
compute what the stages scheduled one by one compute: the same operations,
up to LLVM's choice of where to fuse a multiply and an add (``contract``),
which the code around an expression can change (a last-bit difference)."""
import numpy as np
import pytest

import te_autodiff as te
from conftest import cross_entropy
from lowering import runtime
from lowering.fuse import _computed_once
from lowering.loop_ir import (Alloc, Assign, Buffer, BufLoad, For, Local, Simd, Store, loads_in, stmt_exprs, stmt_text,
                             walk)
from lowering.lower import lower
from lowering.pipeline import schedule_program
from lowering.schedule import SPLIT_MIN_WORK
from lowering.schedule.nest import accumulation
from te_autodiff.expr import const



def run(program, arrays):
    compiled = runtime.compile_program(program, te.target())
    storage = runtime.execute(program, compiled, arrays)
    return [storage[b] for b in program.results]


def both(inputs, outputs, arrays, **kw):
    """``(fused program, fused results, unfused results)``."""
    lowered = lower(inputs, outputs, **kw)
    fused = schedule_program(lowered, te.target())
    return fused, run(fused, arrays), run(schedule_program(lowered, te.target(), fusion=False), arrays)


def temps(program):
    return sorted(b.name for b in program.buffers if b.kind == "temp")


def assert_same(a, b):
    """Equal up to a last-bit difference from a fused multiply-add (relative to the largest value)."""
    for x, y in zip(a, b):
        assert np.max(np.abs(x - y)) <= 4 * np.finfo(x.dtype).eps * np.max(np.abs(y))


def elementwise_loss(n):
    x, H = te.placeholder((n,), "float32", "x"), te.placeholder((n,), "float32", "H")
    y = te.compute((n,), lambda i: te.tanh(te.sigmoid(x[i]) * te.exp(-x[i] * x[i])), name="y")
    r = te.reduce_axis(n, "r")
    loss = te.compute((1,), lambda _: te.sum(y[r] * H[r], axis=r), name="loss")
    (dx,) = te.gradient(y, [x], head=H)
    return x, H, loss, dx


def test_loss_and_gradient_run_in_one_pass_without_the_forward_buffer(rng):
    n = 2 * SPLIT_MIN_WORK
    x, H, loss, dx = elementwise_loss(n)
    xs, hs = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    fused, got, want = both([x, H], [loss, dx], [xs, hs])
    assert temps(schedule_program(lower([x, H], [loss, dx]), te.target(), fusion=False)) == ["loss.parts", "y"]
    assert temps(fused) == ["y+loss+dx.parts"]           # y lives in registers only
    assert [st.name for st in fused.stages] == ["y+loss+dx.parts", "y+loss+dx"]
    assert_same(got, want)
    y = np.tanh(1 / (1 + np.exp(-xs.astype(np.float64))) * np.exp(-xs.astype(np.float64) ** 2))
    np.testing.assert_allclose(got[0][0], np.dot(y, hs), rtol=1e-5)


def test_a_small_loss_stays_apart_from_the_parallel_gradient(rng):
    x, H, loss, dx = elementwise_loss(1000)
    fused, got, want = both([x, H], [loss, dx], [rng.standard_normal(1000).astype(np.float32)] * 2)
    assert not any("+" in st.name for st in fused.stages)
    assert_same(got, want)


def test_maps_reading_one_input_share_a_pass(rng):
    x = te.placeholder((64, 48), "float32", "x")
    a = te.compute((64, 48), lambda i, j: te.exp(x[i, j]), name="a")
    b = te.compute((64, 48), lambda i, j: x[i, j] * te.sin(x[i, j]), name="b")
    fused, got, want = both([x], [a, b], [rng.standard_normal((64, 48)).astype(np.float32)])
    assert [st.name for st in fused.stages] == ["a+b"]
    assert_same(got, want)


def test_a_stored_producer_is_computed_in_its_only_reader(rng):
    x = te.placeholder((300,), "float32", "x")
    y = te.compute((300,), lambda i: te.exp(x[i]) + 1.0, name="y")
    z = te.compute((300,), lambda i: te.log(y[i]) * y[i], name="z")
    fused, got, want = both([x], [z], [rng.standard_normal(300).astype(np.float32)], store=[y])
    assert temps(fused) == [] and [st.name for st in fused.stages] == ["y+z"]
    assert_same(got, want)


def test_a_producer_that_would_be_recomputed_stays_stored(rng):
    x, w = te.placeholder((40,), "float32", "x"), te.placeholder((30,), "float32", "w")
    y = te.compute((40,), lambda i: te.exp(x[i]), name="y")
    z = te.compute((40, 30), lambda i, j: y[i] * w[j], name="z")
    fused, got, want = both([x, w], [z], [rng.standard_normal(40).astype(np.float32),
                                           rng.standard_normal(30).astype(np.float32)], store=[y])
    assert temps(fused) == ["y"]
    assert_same(got, want)


def test_a_map_reading_another_at_a_different_point_is_not_fused(rng):
    x = te.placeholder((100,), "float32", "x")
    a = te.compute((100,), lambda i: te.exp(x[i]), name="a")
    b = te.compute((99,), lambda i: a[i + 1] - a[i] + x[i], name="b")
    c = te.compute((100,), lambda i: a[99 - i] * x[i], name="c")
    fused, got, want = both([x], [a, b, c], [rng.standard_normal(100).astype(np.float32)])
    assert not any("+" in st.name for st in fused.stages)
    assert_same(got, want)


@pytest.mark.parametrize("n", [SPLIT_MIN_WORK, 3 * SPLIT_MIN_WORK + 16 * 7])
def test_fused_gradient_kernels_match_numpy(rng, n):
    x, H, loss, dx = elementwise_loss(n)
    f = te.build([x, H], [loss, dx])
    xs, hs = rng.standard_normal(n), rng.standard_normal(n)
    got_loss, got_dx = f(xs.astype(np.float32), hs.astype(np.float32))
    s = 1 / (1 + np.exp(-xs))
    u = s * np.exp(-xs * xs)
    y = np.tanh(u)
    np.testing.assert_allclose(got_loss[0], np.dot(y, hs), rtol=1e-4)
    np.testing.assert_allclose(got_dx, hs * (1 - y * y) * u * ((1 - s) - 2 * xs), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_reduction_read_at_a_shifted_window_is_computed_in_the_reader(rng, batch):
    """The gradient of a padded input is read without its border (dX = dXp[1:-1]):
    only the elements read are computed, in the reader's own loops; a batch
    of one too (the reader's loop of one iteration adds nothing to the read)."""
    A, B = te.placeholder((batch, 10, 6), "float32", "A"), te.placeholder((6, 12), "float32", "B")
    k = te.reduce_axis(6, "k")
    P = te.compute((batch, 10, 12), lambda n, i, j: te.sum(A[n, i, k] * B[k, j], axis=k), name="P")
    C = te.compute((batch, 8, 9), lambda n, i, j: P[n, i + 1, j + 2], name="C")
    a, b = rng.standard_normal((batch, 10, 6)).astype(np.float32), rng.standard_normal((6, 12)).astype(np.float32)
    fused, got, want = both([A, B], [C], [a, b], store=[P])
    assert temps(fused) == [] and [st.name for st in fused.stages] == ["P+C"]
    assert_same(got, want)
    np.testing.assert_allclose(got[0], (a @ b)[:, 1:9, 2:11], rtol=1e-5, atol=1e-6)


def distances(n, k, d):
    """``min_j Σ_e (C[j, e] - P[i, e])²`` (k-means' cost per point) with its inputs."""
    P, C = te.placeholder((n, d), "float64", "P"), te.placeholder((k, d), "float64", "C")
    e, j = te.reduce_axis(d, "e"), te.reduce_axis(k, "j")
    D = te.compute((n, k), lambda i, jj: te.sum((C[jj, e] - P[i, e]) * (C[jj, e] - P[i, e]), axis=e), name="D")
    M = te.compute((n,), lambda i: te.min(D[i, j], axis=j), name="M")
    return P, C, D, M


@pytest.mark.parametrize("n, k, d", [(50, 20, 3), (37, 9, 17)])
def test_a_reduction_is_computed_inside_the_reduction_that_reads_it(rng, n, k, d):
    """The distances ``D`` (no contraction: both factors read both points and
    centroids) are computed inside the minimum over centroids that reads
    each once: no ``n x k`` temporary, the same values."""
    P, C, D, M = distances(n, k, d)
    p, c = rng.standard_normal((n, d)), rng.standard_normal((k, d))
    fused, got, want = both([P, C], [M], [p, c])
    assert "D" not in temps(fused) and all(st.name != "D" for st in fused.stages)
    assert_same(got, want)
    np.testing.assert_allclose(got[0], ((p[:, None, :] - c[None]) ** 2).sum(-1).min(1), rtol=1e-12)


@pytest.mark.parametrize("form", ["product", "difference"])
def test_a_contraction_stays_a_stage_under_the_reduction_reading_it(rng, form):
    """``max_j Σ_k A[i, k] B[k, j]`` and ``Σ_d (Σ_c Q[d, c] (x[i, c] - m[c]))²``
    (gmm's form): products whose factors each miss a variable the other
    reads keep their own register-tiled stage."""
    A = te.placeholder((24, 16), "float64", "A")
    B = te.placeholder((16, 20), "float64", "B")
    m = te.placeholder((16,), "float64", "m")
    c, j = te.reduce_axis(16, "c"), te.reduce_axis(20, "j")
    if form == "product":
        T = te.compute((24, 20), lambda i, jj: te.sum(A[i, c] * B[c, jj], axis=c), name="T")
        Y = te.compute((24,), lambda i: te.max(T[i, j], axis=j), name="Y")
    else:
        T = te.compute((24, 20), lambda i, jj: te.sum(B[c, jj] * (A[i, c] - m[c]), axis=c), name="T")
        Y = te.compute((24,), lambda i: te.sum(T[i, j] * T[i, j], axis=j), name="Y")
    a, b, mm = rng.standard_normal((24, 16)), rng.standard_normal((16, 20)), rng.standard_normal(16)
    fused, got, want = both([A, B, m], [Y], [a, b, mm])
    assert "T" in temps(fused)
    assert_same(got, want)


@pytest.mark.parametrize("form", ["row sum", "product"])
def test_a_reduction_is_computed_in_the_map_reading_it(rng, form):
    """``y[i] = -r[i] / (z[i] z[i])`` of a row sum ``r`` (the adjoint of a
    ``1 / Σ`` in a softmax's gradient): one stage, the row reduction with
    that epilogue, no temporary for ``r``; of a product ``r = A B`` the
    contraction keeps its register-tiled stage.  The same values."""
    X, Y = te.placeholder((40, 24), "float64", "X"), te.placeholder((40, 24), "float64", "Y")
    Z = te.placeholder((40, 24), "float64", "Z")
    j = te.reduce_axis(24, "j")
    if form == "row sum":
        R = te.compute((40,), lambda i: te.sum(X[i, j] * Y[i, j], axis=j), name="r")
        out = te.compute((40,), lambda i: -R[i] / (Z[i, 0] * Z[i, 0]), name="y")
    else:
        R = te.compute((40, 40), lambda i, c: te.sum(X[i, j] * Y[c, j], axis=j), name="r")
        out = te.compute((40, 40), lambda i, c: -R[i, c] / (Z[i, 0] * Z[c, 0]), name="y")
    x, y, z = (rng.standard_normal((40, 24)) for _ in range(3))
    fused, got, want = both([X, Y, Z], [out], [x, y, z], store=[R])
    assert [st.name for st in fused.stages if "y" in st.name.split("+")] == (["r+y"] if form == "row sum" else ["y"])
    assert ("r" in temps(fused)) == (form == "product")
    assert_same(got, want)
    r = (x * y).sum(1) if form == "row sum" else x @ y.T
    np.testing.assert_allclose(got[0], -r / (z[:, 0] * z[:, 0] if form == "row sum" else np.outer(z[:, 0], z[:, 0])),
                               rtol=1e-12)


def test_a_reduction_is_not_computed_inside_a_reduction_to_one_element(rng):
    """The sum over rows would run one element at a time: ``P`` keeps its stage."""
    A = te.placeholder((64, 64), "float32", "A")
    k, r = te.reduce_axis(64, "k"), te.reduce_axis(64, "r")
    P = te.compute((64,), lambda i: te.sum(A[i, k] * A[k, i], axis=k), name="P")
    Q = te.compute((1,), lambda _: te.sum(P[r] * P[r], axis=r), name="Q")
    fused, got, want = both([A], [Q], [rng.standard_normal((64, 64)).astype(np.float32)])
    assert temps(fused) == ["P"]
    assert_same(got, want)


def test_a_value_the_fused_statements_share_is_computed_once(rng):
    """Fused, the loss's ``y = tanh(sigmoid(x)·exp(-x²))`` and the gradient's
    ``s·(1 - s)`` and ``e`` are computed from one ``sigmoid`` and one ``exp``:
    let-bound before their first use, read by the rest."""
    n = 2 * SPLIT_MIN_WORK
    x, H, loss, dx = elementwise_loss(n)
    xs, hs = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    fused, got, want = both([x, H], [loss, dx], [xs, hs])
    text = stmt_text(fused.stages[0].body)
    assert text.count("sigmoid(") == 1 and text.count("exp(") == 1, text
    assert text.index("= sigmoid(") < text.index("let y = tanh(")
    assert_same(got, want)


def test_a_value_whose_inputs_change_between_statements_is_not_shared():
    acc, out = Local("acc", "float32"), Buffer("out", (2,), "float32", "output")
    inp = Buffer("inp", (2,), "float32", "input")
    i0, i1 = const(0, "int64"), const(1, "int64")
    x0 = BufLoad(inp, i0)
    grows = [Assign(acc, te.exp(acc) * x0), Store(out, i0, te.exp(acc)), Assign(acc, acc + 1.0),
             Store(out, i1, te.exp(acc))]
    assert _computed_once(tuple(grows), {"acc"}) == tuple(grows)          # acc is assigned
    read = [Store(out, i0, te.exp(BufLoad(out, i1))), Store(out, i1, te.exp(BufLoad(out, i1)))]
    assert _computed_once(tuple(read), set()) == tuple(read)              # out is stored to
    pure = [Store(out, i0, te.exp(x0) * 2.0), Store(out, i1, te.exp(x0) + 1.0)]
    shared = _computed_once(tuple(pure), set())
    assert isinstance(shared[0], Alloc) and shared[0].let and shared[0].init is te.exp(x0)
    assert [s.value for s in shared[1:]] == [shared[0].local * 2.0, shared[0].local + 1.0]


@pytest.mark.parametrize("kind", ["int", "float"])
def test_a_producer_read_by_one_reduction_in_two_loops_stays_stored(rng, kind):
    """``T[i] = s(i) + (i odd ? X[i, 1] : s(i))``, ``s(i) = sum_r J[i, r]``:
    the sum is lowered once in the select's branch and once outside it, two
    loops over ``r`` reading ``J[i, r]``.  ``J`` may not be computed in one of
    them only: the other would read a buffer nobody writes."""
    X, I = te.placeholder((6, 2), "float64", "X"), te.placeholder((6, 4), "int32", "I")
    if kind == "int":
        J = te.compute((6, 4), lambda a, b: I[a, b] * 2 + 2, name="J")
    else:
        J = te.compute((6, 4), lambda a, b: I[a, b].astype("float64") % 5.0, name="J")
    r = te.reduce_axis((0, 4), "r")

    def body(a):
        s = te.sum(J[a, r].astype("float64"), axis=r)
        return s + te.select(te.not_equal(a % 2, 0), X[a, 1], s)
    T = te.compute((6,), body, name="T")
    x, i = rng.standard_normal((6, 2)), rng.integers(-9, 10, (6, 4)).astype(np.int32)
    fused, got, want = both([X, I], [T], [x, i])
    written = {x.buffer for st in fused.stages for x in walk(st.body) if isinstance(x, Store)}
    exprs = [e for st in fused.stages for x in walk(st.body) for e in stmt_exprs(x)]
    assert {ld.buffer for ld in loads_in(exprs, set())} <= written | set(fused.inputs)
    j = (i * 2 + 2 if kind == "int" else np.mod(i, 5)).astype(np.float64)
    s = j.sum(1)                                   # exact: small integers
    odd = np.arange(6) % 2 != 0
    expected = s + np.where(odd, x[:, 1], s)
    # 2 s is exact; s + x sums five terms in some order (the vectoriser may
    # start the reduction from x): at most 4 roundings of partial sums bounded
    # by the sum of magnitudes, and one in numpy's s + x
    bound = np.where(odd, 2.5 * np.finfo(np.float64).eps * (np.abs(x[:, 1]) + np.abs(j).sum(1)), 0.0)
    for result in (got[0], want[0]):
        assert np.all(np.abs(result - expected) <= bound), (result, expected)


def _row_passes(stage) -> list:
    """For each innermost loop of ``stage`` that loads from a buffer, the
    kinds of accumulation it advances ("add", "max"...)."""
    loops = [x for x in walk(stage.body) if isinstance(x, (For, Simd))
             and not any(isinstance(y, (For, Simd)) for y in walk(x.body))]
    return [{accumulation(a)[0] for a in walk(lp.body) if isinstance(a, Assign) and accumulation(a) is not None}
            for lp in loops if loads_in([e for x in walk(lp.body) for e in stmt_exprs(x)], set())]


def test_row_reductions_reading_one_row_share_its_loop(rng):
    """A sum and a maximum over each row of ``x`` read the row once: one
    loop over the row with both accumulators; a sum over part of the row
    (another range) and a reduction reading the sum (it must wait for it)
    stay apart.  The values are those of the stages run apart."""
    x = te.placeholder((64, 300), "float32", "x")
    r = [te.reduce_axis(300, "r") for _ in range(3)]
    part = te.reduce_axis(200, "p")
    s = te.compute((64,), lambda i: te.sum(x[i, r[0]], axis=r[0]), name="s")
    m = te.compute((64,), lambda i: te.max(x[i, r[1]] * 2.0, axis=r[1]), name="m")
    h = te.compute((64,), lambda i: te.sum(x[i, part], axis=part), name="h")
    v = te.compute((64,), lambda i: te.sum((x[i, r[2]] - s[i]) ** 2, axis=r[2]), name="v")
    xs = rng.standard_normal((64, 300)).astype(np.float32)
    fused, got, want = both([x], [s, m, h, v], [xs])
    names = [st.name for st in fused.stages]
    assert "s+m" in names and "h" in names and "v" in names
    joined = next(st for st in fused.stages if st.name == "s+m")
    passes = _row_passes(joined)                    # one pass over the row, not two: every loop reading
    assert passes and all(kinds == {"add", "max"} for kinds in passes), passes     # x advances both
    assert_same(got, want)
    x64 = xs.astype(np.float64)
    np.testing.assert_allclose(got[0], x64.sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(got[1], (xs * 2).max(1))


def test_a_max_derivative_and_the_normaliser_of_its_row_run_in_one_pass(rng):
    """A loss reading each row's maximum besides its logsumexp (``lse +
    m / 2 - z[i, L[i]]``): the max's derivative follows the row's maximum
    (its first index, ``m.argmax``), and the normaliser ``Σ exp(z - m)``
    reads the same row: the two run in one pass.  (Inside the logsumexp the
    shift has no derivative: ``shift_invariance.py``.)  The gradient is
    softmax plus half the one-hot of the maximum minus the one-hot label,
    over the rows, as numpy computes it."""
    n, c = 48, 257
    z, labels = te.placeholder((n, c), "float32", "Z"), te.placeholder((n,), "int32", "L")
    c1, c2, r = te.reduce_axis(c, "c"), te.reduce_axis(c, "c"), te.reduce_axis(n, "r")
    m = te.compute((n,), lambda i: te.max(z[i, c1], axis=c1), name="m")
    lse = te.compute((n,), lambda i: m[i] + te.log(te.sum(te.exp(z[i, c2] - m[i]), axis=c2)), name="lse")
    loss = te.compute((1,), lambda _: te.sum(lse[r] + 0.5 * m[r] - z[r, labels[r]], axis=r) / float(n),
                      name="loss")
    (dz,) = te.gradient(loss, [z])
    zs = rng.standard_normal((n, c)).astype(np.float32) * 2
    ls = rng.integers(0, c, n).astype(np.int32)
    fused, got, want = both([z, labels], [loss, dz], [zs, ls])
    joined = [st.name for st in fused.stages if "argmax" in st.name]
    assert len(joined) == 1 and "+" in joined[0]
    assert_same(got, want)
    p = np.exp(zs - zs.max(1, keepdims=True).astype(np.float64))
    p /= p.sum(1, keepdims=True)
    p[np.arange(n), zs.argmax(1)] += 0.5
    p[np.arange(n), ls] -= 1
    np.testing.assert_allclose(got[1], p / n, rtol=1e-5, atol=1e-7)


def test_row_reductions_of_an_outer_product_stay_apart(rng):
    """A minimum and a sum of ``A[r, i] B[j, r]`` read the same elements, but
    each is register-tiled (rows of ``A`` by vectors of ``B``): joined, one
    tile would hold both stages' accumulators, so they stay two stages."""
    A, B = te.placeholder((40, 24), "float32", "A"), te.placeholder((32, 40), "float32", "B")
    r1, r2 = te.reduce_axis(40, "r"), te.reduce_axis(40, "r")
    lo = te.compute((24, 32), lambda i, j: te.min(A[r1, i] * B[j, r1], axis=r1), name="lo")
    dot = te.compute((24, 32), lambda i, j: te.sum(A[r2, i] * B[j, r2], axis=r2), name="dot")
    a, b = rng.standard_normal((40, 24)).astype(np.float32), rng.standard_normal((32, 40)).astype(np.float32)
    fused, got, want = both([A, B], [lo, dot], [a, b])
    assert not any("+" in st.name for st in fused.stages)
    assert_same(got, want)
    np.testing.assert_allclose(got[1], a.T.astype(np.float64) @ b.T, rtol=1e-5, atol=1e-4)

