"""Code generation choices: stores across the lanes written as rows; the
arithmetic that keeps its association."""
import re

import numpy as np
import pytest

import te_autodiff as te
from lowering.codegen_llvm import row_groups
from lowering.codegen_llvm.emitter import ordered_nodes
from lowering.loop_ir import (Alloc, Assign, Block, BufLoad, Buffer, Local, Simd, Store, children, stmt_exprs,
                              walk)
from lowering.pipeline import lower_for
from lowering.schedule.constructors import idx
from te_autodiff.expr import BinOp, add, const, maximum, mul, var

Y = Buffer("Y", (64, 64), "float32", "output")
LANE, ROW = var("l"), var("r")


def _stores(consts, step=64, value=None, buf=Y, extra=None):
    """``buf[r * 8 + l * step + c] = value`` for each ``c`` of ``consts``."""
    base = add(mul(ROW, idx(8)), mul(LANE, idx(step)))
    if extra is not None:
        base = add(base, extra)
    return [Store(buf, add(base, idx(c)), const(1.5, "float32") if value is None else value) for c in consts]


def test_a_register_tile_stored_across_the_lanes_is_rows():
    """A tile's stores, lanes 64 elements apart, constants 0..5 and 64 * 8 +
    0..5 interleaved (two vectors of lanes): two groups of six, in order of
    the constant; a run longer than the lanes is cut at the lane count."""
    stores = _stores([0, 512, 1, 513, 2, 514, 3, 515, 4, 516, 5, 517])
    step, groups = row_groups(stores, LANE, 8)
    assert step == 64
    assert [len(g) for g in groups] == [6, 6]
    assert groups[0] == [stores[k] for k in (0, 2, 4, 6, 8, 10)]
    step, groups = row_groups(_stores(range(12)), LANE, 8)
    assert [len(g) for g in groups] == [8, 4]


@pytest.mark.parametrize("why, stores", [
    ("contiguous across the lanes: one vector store each", _stores([0, 8], step=1)),
    ("the same element in every lane", _stores([0, 1], step=0)),
    ("lane 1's first element is lane 0's second: the order of the stores counts", _stores([0, 1, 2], step=2)),
    ("no two constants in a row", _stores([0, 9, 18])),
    ("a value reads the buffer written", _stores([0, 1], value=BufLoad(Y, idx(3)))),
    ("two buffers", _stores([0]) + _stores([1], buf=Buffer("Z", (64, 64), "float32", "output"))),
    ("two indices that differ by more than a constant", _stores([0]) + _stores([1], extra=var("q"))),
    ("bool elements", _stores([0, 1], value=const(True), buf=Buffer("B", (64, 64), "bool", "output"))),
])
def test_stores_that_are_not_rows_stay_as_they_are(why, stores):
    assert row_groups(stores, LANE, 8) is None, why


def test_rows_that_do_not_overlap_across_lanes_may_be_narrower_than_the_stride():
    """Lanes two elements apart, constants 0 and 1: each lane writes its own
    pair, the pairs side by side."""
    step, groups = row_groups(_stores([1, 0], step=2), LANE, 8)
    assert step == 2 and [len(g) for g in groups] == [2]


def _conv(N, C, H, W, F):
    X = te.placeholder((N, C, H + 2, W + 2), "float32", "X")
    Wt = te.placeholder((F, C, 3, 3), "float32", "Wt")
    c, kh, kw = te.reduce_axis(C, "c"), te.reduce_axis(3, "kh"), te.reduce_axis(3, "kw")
    out = te.compute((N, F, H, W), lambda n, f, y, x: te.sum(X[n, c, y + kh, x + kw] * Wt[f, c, kh, kw],
                                                             axis=[c, kh, kw]), name="conv")
    return X, Wt, out


def _conv_np(x, w):
    H, W = x.shape[2] - 2, x.shape[3] - 2
    return sum(np.einsum("ncyx,fc->nfyx", x[:, :, i:i + H, j:j + W].astype(np.float64), w[:, :, i, j])
               for i in range(3) for j in range(3))


def _rows_found(program) -> int:
    """Stores in runs that :func:`row_groups` writes as rows, in ``program``."""
    found = 0
    for st in program.stages:
        for loop in (x for x in walk(st.body) if isinstance(x, Simd)):
            for block in (x for x in walk(loop.body) if isinstance(x, Block)):
                stores = [x for x in block.stmts if isinstance(x, Store)]
                rows = row_groups(stores, loop.var, loop.lanes) if len(stores) > 1 else None
                found += 0 if rows is None else sum(len(g) for g in rows[1] if len(g) > 1)
    return found


@pytest.mark.parametrize("target", ["x86-64-v2", "haswell", "skylake-avx512"])
def test_a_convolution_with_channels_in_the_lanes_stores_its_tiles_as_rows(rng, target):
    """An NCHW convolution whose register tiles run their lanes over the
    output channels (each an image plane apart) and their columns along the
    width stores every tile as rows: on each target, one of these shapes
    (the benchmark's conv2d among them) has such tiles.  Every output matches
    numpy, also where channels leave lanes inactive (a masked vector: a
    scatter) and where the schedule puts the lanes along the width."""
    found = 0
    for N, C, H, W, F in ((8, 32, 28, 28, 32), (2, 16, 14, 14, 48), (1, 5, 9, 13, 24), (2, 3, 6, 7, 20)):
        X, Wt, out = _conv(N, C, H, W, F)
        found += _rows_found(lower_for([X, Wt], [out], target=target).scheduled)
        run = te.build([X, Wt], [out], target=target if te.target(target).missing_on_host() is None else "host")
        x = rng.standard_normal((N, C, H + 2, W + 2)).astype(np.float32)
        w = rng.standard_normal((F, C, 3, 3)).astype(np.float32)
        np.testing.assert_allclose(run(x, w), _conv_np(x, w), rtol=1e-4, atol=1e-4)
    assert found > 0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_convolution_gradients_through_row_stores_match_numpy(dtype):
    """A convolution of stride 1 or 2 and its gradients (dX is itself a
    convolution with its channels in the lanes) on three targets, float32
    and float64 (8 lanes of AVX-512: other tiles, other rows), against
    numpy; row stores are found on each target."""
    rng = np.random.default_rng(5)
    for N, C, H, W, F, s in ((2, 5, 11, 17, 24, 1), (1, 7, 9, 20, 16, 2)):
        OH, OW = (H - 3) // s + 1, (W - 3) // s + 1
        X = te.placeholder((N, C, H, W), dtype, "X")
        Wt = te.placeholder((F, C, 3, 3), dtype, "Wt")
        Hh = te.placeholder((N, F, OH, OW), dtype, "Hh")
        c, kh, kw = te.reduce_axis(C, "c"), te.reduce_axis(3, "kh"), te.reduce_axis(3, "kw")
        Y = te.compute((N, F, OH, OW), lambda n, f, y, x: te.sum(X[n, c, y * s + kh, x * s + kw] * Wt[f, c, kh, kw],
                                                                  axis=[c, kh, kw]), name="Y")
        dX, dW = te.gradient(Y, [X, Wt], head=Hh)
        x, w = rng.standard_normal((N, C, H, W)), rng.standard_normal((F, C, 3, 3))
        h = rng.standard_normal((N, F, OH, OW))
        want = [np.zeros((N, F, OH, OW)), np.zeros((N, C, H, W)), np.zeros((F, C, 3, 3))]
        for i in range(3):
            for j in range(3):
                window = (slice(None), slice(None), slice(i, i + s * (OH - 1) + 1, s), slice(j, j + s * (OW - 1) + 1, s))
                want[0] += np.einsum("ncyx,fc->nfyx", x[window], w[:, :, i, j])
                want[1][window] += np.einsum("nfyx,fc->ncyx", h, w[:, :, i, j])
                want[2][:, :, i, j] += np.einsum("nfyx,ncyx->fc", h, x[window])
        tol = 1e-3 if dtype == "float32" else 1e-10
        for target in ("x86-64-v2", "haswell", "skylake-avx512"):
            assert _rows_found(lower_for([X, Wt, Hh], [Y, dX, dW], target=target).scheduled) > 0, target
            run = te.build([X, Wt, Hh], [Y, dX, dW],
                           target=target if te.target(target).missing_on_host() is None else "host")
            for got, ref in zip(run(*(a.astype(dtype) for a in (x, w, h))), want):
                np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def _float_products(stage):
    nodes, stack = set(), [e for s in walk(stage.body) for e in stmt_exprs(s)]
    while stack:
        e = stack.pop()
        if e not in nodes:
            nodes.add(e)
            stack += children(e)
    return {e for e in nodes if isinstance(e, BinOp) and e.op == "mul" and e.dtype == "float64"}


def test_what_is_compared_or_an_extremum_candidate_keeps_its_association():
    """The float arithmetic of a min's body and of the argmax stage that
    recomputes it and compares it with == is ordered: emitted without
    ``reassoc``, so LLVM computes it as written in every stage and code
    path (a register tile, its remainder rows); a sum's products stay free."""
    A = te.placeholder((8, 9), "float64", "A")
    B = te.placeholder((16, 8), "float64", "B")
    r = te.reduce_axis(8, "r")
    Y = te.compute((9, 16), lambda i, j: te.min(A[r, i] * (j - 1).astype("float64") * B[j, r], axis=r), name="Y")
    Z = te.compute((9, 16), lambda i, j: te.sum(A[r, i] * (j - 1).astype("float64") * B[j, r], axis=r), name="Z")
    dA, = te.gradient(Y, [A])
    stages = {s.name: s for s in lower_for([A, B], [Y, Z, dA]).scheduled.stages}
    for name, ordered in (("Y", True), ("Y.argmax", True), ("Z", False)):
        products = _float_products(stages[name])
        assert products, name
        assert (products <= ordered_nodes(stages[name].body)) if ordered else \
            not (products & ordered_nodes(stages[name].body)), name


def test_an_extremum_of_a_local_orders_what_the_local_is_computed_from():
    """``m = max(m, s)`` with ``s`` a sum's accumulator (a reduction nested
    in a max) or a let: the arithmetic assigned to ``s`` is ordered too;
    another accumulator's is not."""
    a, b, c = (BufLoad(Buffer(n, (4,), "float64", "input"), idx(0)) for n in "abc")
    s, m, t = Local("s", "float64"), Local("m", "float64"), Local("t", "float64")
    body = Block((Alloc(s, const(0.0, "float64")), Assign(s, add(s, mul(a, b))),
                  Alloc(t, const(0.0, "float64")), Assign(t, add(t, mul(b, c))),
                  Alloc(m, const(float("-inf"), "float64")), Assign(m, maximum(m, s))))
    ordered = ordered_nodes(body)
    assert {mul(a, b), add(s, mul(a, b))} <= ordered
    assert not {mul(b, c), add(t, mul(b, c))} & ordered


def _lane_tests(n):
    """``y[j]``: three taps of ``x`` around ``j``, each counted where ``lo <=
    j + d - 1 < hi`` and where ``j != at`` (bounds read from data, so the
    tests stay in the vector loop), and ``y2[j] = x[j]`` where ``hi > j``
    (the lane index second)."""
    x = te.placeholder((n,), "float32", "x")
    lim = te.placeholder((3,), "int64", "lim")
    d = te.reduce_axis(3, "d")
    y = te.compute((n,), lambda j: te.sum(te.if_then_else(
        te.all(j + d - 1 >= lim[0], j + d - 1 < lim[1], te.not_equal(j, lim[2])), x[te.clip(j + d - 1, 0, n - 1)],
        0.0), axis=[d]), name="y")
    y2 = te.compute((n,), lambda j: te.if_then_else(lim[1] > j, x[j], 0.0), name="y2")
    return x, lim, y, y2


@pytest.mark.parametrize("target", ["x86-64-v2", "haswell", "skylake-avx512"])
def test_lane_tests_compare_lane_numbers_where_compares_write_vectors(rng, target):
    """A test between an index that grows by one per lane and a value the
    same in every lane compares 32-bit lane numbers with the scalar gap on a
    target without mask registers (AVX2, SSE); with AVX-512's the 64-bit
    index compare stays.  The gap is clamped, so bounds far beyond 32 bits
    (either side, either order) give numpy's values."""
    n = 38                      # a partial last vector: a masked one, or pieces of 4 and 2 lanes
    x, lim, y, y2 = _lane_tests(n)
    kernel = te.build([x, lim], [y, y2], target=target)
    compares = set(re.findall(r"icmp \w+ <\d+ x (i\d+)>", kernel.llvm_ir))
    assert compares == ({"i64"} if te.target(target).mask_registers else {"i32"}), compares
    run = kernel if te.target(target).missing_on_host() is None else te.build([x, lim], [y, y2])
    xs = rng.standard_normal(n).astype(np.float32)
    for lo, hi, at in ((0, n, -1), (-2 ** 40, 2 ** 40, 5), (5, 9, 7), (2 ** 62, -2 ** 62, 0), (-1, n + 1, n - 1),
                       (-2 ** 63, 2 ** 63 - 1, 2 ** 63 - 1), (3, 3, 3)):
        got, got2 = run(xs, np.array([lo, hi, at], np.int64))
        want = [sum(xs[min(max(j + d - 1, 0), n - 1)] for d in range(3) if lo <= j + d - 1 < hi and j != at)
                for j in range(n)]
        np.testing.assert_allclose(got, np.array(want, np.float32), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(got2, np.where(np.arange(n) < hi, xs, 0))
