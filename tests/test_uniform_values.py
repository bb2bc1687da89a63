"""Uniform values (lowering/schedule/uniform_values.py): a transcendental
function of the other axes, in a stage whose vector axis is shorter than a
vector, runs in a stage of its own; where it may not move, it stays."""
import re

import numpy as np
import pytest

import te_autodiff as te
from te_autodiff.expr import compare, unary, var
from lowering.loop_ir import Alloc, Block, BufLoad, Buffer, For, If, Local, Store, walk
from lowering.schedule import TILE_VECTORS, blocking, uniform_values
from lowering.schedule.constructors import idx, linear
from lowering.schedule.nest import Nest
from te_autodiff.testing import check_gradient

UNIFORM = re.compile(r"\.u\d+(\.|$)")


def lanes(dtype) -> int:
    return te.target().lanes(np.dtype(dtype).itemsize)


def moved(kernel) -> list:
    """The stages the rule added to ``kernel``."""
    return [s.name for s in kernel.program.stages if UNIFORM.search(s.name)]


def without_rule(monkeypatch, inputs, outputs):
    """``outputs`` built with the rule switched off."""
    monkeypatch.setattr(uniform_values, "decide", lambda *args, **kw: [])
    return te.build(inputs, outputs)


def rows(p, e, dtype):
    """out[i, j] = y[i, j] cos(x[i]) + sin(x[i]): two values of each row."""
    x = te.placeholder((p,), dtype, "x")
    y = te.placeholder((p, e), dtype, "y")
    out = te.compute((p, e), lambda i, j: y[i, j] * te.cos(x[i]) + te.sin(x[i]), name="out")
    return [x, y], out


# An evaluation of cos or sin is within a few ulp (test_fast_math), and one
# product and sum add one rounding each.
TOL = {"float32": 1e-5, "float64": 1e-13}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("short", [True, False])
def test_a_short_row_computes_its_values_apart(dtype, short, monkeypatch):
    tile = TILE_VECTORS * lanes(dtype)
    e = 2 * tile - 1 if short else 2 * tile                  # both sides of the rule's threshold
    p = 203
    inputs, out = rows(p, e, dtype)
    rng = np.random.default_rng(1)
    x, y = rng.uniform(-4, 4, p).astype(dtype), rng.normal(size=(p, e)).astype(dtype)
    kernel = te.build(inputs, [out])
    assert moved(kernel) == (["out.u0", "out.u1"] if short else [])
    got = kernel(x, y)
    want = y * np.cos(x)[:, None] + np.sin(x)[:, None]
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])
    # the same polynomial per lane: the values are those of the stage computing them itself
    np.testing.assert_array_equal(got, without_rule(monkeypatch, inputs, [out])(x, y))


@pytest.mark.parametrize("m", [1, 2])
def test_a_value_of_the_lanes_axis_read_by_every_row_moves(m, monkeypatch):
    """``exp(b[j])`` in ``x[i, j] * exp(b[j])``: evaluated again for each
    row unless the rows are one (both sides of the rule's threshold)."""
    n = 3 * lanes("float32") + 1
    x = te.placeholder((m, n), "float32", "x")
    b = te.placeholder((n,), "float32", "b")
    out = te.compute((m, n), lambda i, j: x[i, j] * te.exp(b[j]), name="out")
    rng = np.random.default_rng(6)
    xv, bv = rng.normal(size=(m, n)).astype(np.float32), rng.normal(size=n).astype(np.float32)
    kernel = te.build([x, b], [out])
    assert bool(moved(kernel)) == (m >= 2)
    np.testing.assert_allclose(kernel(xv, bv), xv * np.exp(bv), rtol=TOL["float32"])
    np.testing.assert_array_equal(kernel(xv, bv), without_rule(monkeypatch, [x, b], [out])(xv, bv))


def test_values_that_may_not_move_stay(monkeypatch):
    """A value reading the vector axis, or through an index read from
    memory (bounds-checked in the stage's order), stays in the stage."""
    e, p = lanes("float32") - 1, 57
    x = te.placeholder((p,), "float32", "x")
    y = te.placeholder((p, e), "float32", "y")
    at = te.placeholder((p,), "int32", "at")
    reads_j = te.compute((p, e), lambda i, j: te.exp(x[i] * y[i, j]), name="reads_j")
    gathered = te.compute((p, e), lambda i, j: y[i, j] * te.exp(x[at[i]]), name="gathered")
    rng = np.random.default_rng(2)
    xv, yv = rng.normal(size=p).astype(np.float32), rng.normal(size=(p, e)).astype(np.float32)
    atv = rng.integers(0, p, p).astype(np.int32)
    kernel = te.build([x, y, at], [reads_j, gathered])
    assert moved(kernel) == []
    a, b = kernel(xv, yv, atv)
    np.testing.assert_allclose(a, np.exp(xv[:, None] * yv), rtol=TOL["float32"])
    np.testing.assert_allclose(b, yv * np.exp(xv[atv])[:, None], rtol=TOL["float32"])
    with pytest.raises(IndexError, match="x"):          # the gather's check still runs first
        kernel(xv, yv, np.full(p, p, np.int32))


def test_a_guarded_read_moves_with_its_guard(monkeypatch):
    """``x[i - 1]`` exists for i >= 1 only: the new stage reads it under the
    same test."""
    e, p = lanes("float32") - 1, 64
    x = te.placeholder((p,), "float32", "x")
    y = te.placeholder((p, e), "float32", "y")
    out = te.compute((p, e), lambda i, j: y[i, j] * te.if_then_else(i >= 1, te.log1p(x[i - 1] * x[i - 1]), 1.0),
                     name="out")
    rng = np.random.default_rng(3)
    xv, yv = rng.normal(size=p).astype(np.float32), rng.normal(size=(p, e)).astype(np.float32)
    kernel = te.build([x, y], [out])
    pieces = [s for s in kernel.program.stages if s.name.startswith("out.u0")]      # border, interior...
    assert pieces and len(pieces) == len(moved(kernel))
    assert any(isinstance(x, If) for s in pieces for x in walk(s.body))             # the test, at the border
    want = yv * np.concatenate([[1.0], np.log1p(xv[:-1] ** 2)])[:, None]
    np.testing.assert_allclose(kernel(xv, yv), want, rtol=TOL["float32"])
    np.testing.assert_array_equal(kernel(xv, yv), without_rule(monkeypatch, [x, y], [out])(xv, yv))


def rotation(p, dtype="float64"):
    """Rodrigues' rotation of X[i] by r[i] (bundle adjustment's), |r| > 0."""
    r = te.placeholder((p, 3), dtype, "r")
    X = te.placeholder((p, 3), dtype, "X")
    a = te.reduce_axis(3, "a")
    sq = te.compute((p,), lambda i: te.sum(r[i, a] * r[i, a], axis=a), name="sq")

    def entry(i, j):
        theta = te.sqrt(sq[i])
        cross = r[i, (j + 1) % 3] * X[i, (j + 2) % 3] - r[i, (j + 2) % 3] * X[i, (j + 1) % 3]
        return X[i, j] * te.cos(theta) + cross / theta * te.sin(theta)
    return [r, X], te.compute((p, 3), entry, name="rotated")


def test_rotation_values_and_gradient_against_numpy_and_differences():
    p = 41
    inputs, out = rotation(p)
    rng = np.random.default_rng(4)
    r, X = rng.uniform(0.1, 1, (p, 3)), rng.normal(size=(p, 3))
    kernel = te.build(inputs, [out])
    assert len(moved(kernel)) == 2                   # cos θ and sin θ, whichever axis runs in lanes
    theta = np.linalg.norm(r, axis=1)[:, None]
    want = X * np.cos(theta) + np.cross(r, X) / theta * np.sin(theta)
    np.testing.assert_allclose(kernel(r, X), want, rtol=1e-12, atol=1e-14)
    head = rng.normal(size=(p, 3))
    check_gradient(out, inputs, [r, X], head=head, rtol=1e-6, atol=1e-8)
    H = te.placeholder((p, 3), "float64", "H")
    assert moved(te.build(inputs + [H], te.gradient(out, inputs, head=H)))


def test_a_scan_step_moves_values_of_its_time():
    """Inside a scan's time loop the value may read the step's time."""
    T, B = 6, 37
    e = lanes("float32") - 1
    X = te.placeholder((T, B), "float32", "X")
    h0 = te.placeholder((1, B, e), "float32", "h0")
    S = te.placeholder((T, B, e), "float32", "S")
    h = te.compute((T, B, e), lambda t, b, j: S[t - 1, b, j] * te.cos(X[t, b]) + te.sin(X[t, b]), name="h")
    hs = te.scan(h0, h, S, inputs=[X], name="hs")
    rng = np.random.default_rng(5)
    xv, h0v = rng.normal(size=(T, B)).astype(np.float32), rng.normal(size=(1, B, e)).astype(np.float32)
    kernel = te.build([X, h0], [hs])
    assert moved(kernel)
    want = np.empty((T, B, e), np.float32)
    want[0] = h0v[0]
    for t in range(1, T):
        want[t] = want[t - 1] * np.cos(xv[t])[:, None] + np.sin(xv[t])[:, None]
    np.testing.assert_allclose(kernel(xv, h0v), want, rtol=1e-5, atol=1e-6)


def test_an_unrolled_recurrence_moves_the_values_of_each_step():
    """Steps that are one template (``share.py``) each get their stages."""
    B, T = 37, 5
    e = lanes("float64")        # a row of one vector: shorter ones unroll (short_rows.py), their values once a row
    x = te.placeholder((T, B), "float64", "x")
    h0 = te.placeholder((B, e), "float64", "h0")
    hs = [h0]
    for t in range(T):
        hs.append(te.compute((B, e), lambda b, j, t=t, h=hs[-1]: h[b, j] * te.cos(x[t, b] + h[b, 0]) + te.sin(x[t, b]),
                             name=f"h{t + 1}"))
    rng = np.random.default_rng(7)
    xv, hv = rng.normal(size=(T, B)), rng.normal(size=(B, e))
    kernel = te.build([x, h0], [hs[-1]])
    assert len(moved(kernel)) == 2 * T
    want = hv
    for t in range(T):
        want = want * np.cos(xv[t] + want[:, 0])[:, None] + np.sin(xv[t])[:, None]
    np.testing.assert_allclose(kernel(xv, hv), want, rtol=1e-12, atol=1e-13)
    check_gradient(hs[-1], [x, h0], [xv, hv], head=rng.normal(size=(B, e)), rtol=1e-6, atol=1e-8)


# --------------------------------------------------------- the rule on loop IR

def nest_of(body, p=16, e=3):
    i, j = var("i"), var("j")
    return Nest([For(i, idx(0), idx(p), None, "parallel"), For(j, idx(0), idx(e), None)], body(i, j)), i, j


def test_decide_reads_tests_and_lets():
    """A value under a test of its row moves with the test (the else
    branch's negated); under a test of the vector axis, or written by the
    stage, or met under two different tests, it stays; a let-bound local
    is read through."""
    bl = blocking(te.target())
    x = Buffer("x", (16,), "float32", "input")
    out = Buffer("out", (16, 3), "float32", "output")
    t = Local("t", "float32")

    def cosx(i):
        return unary("cos", BufLoad(x, i))

    def store(i, j, v):
        return Store(out, linear((i, j), (16, 3)), v)

    def body_row_test(i, j):
        return Block((If(compare("lt", i, idx(8)), Block((store(i, j, cosx(i)),)),
                         Block((Alloc(t, unary("exp", BufLoad(x, i)), let=True), store(i, j, t))),),))
    nest, i, j = nest_of(body_row_test)
    found = uniform_values.decide(nest, j, bl)
    assert [(u.value.op, [h for _, h in u.tests], u.axes) for u in found] == [("cos", [True], (i,)),
                                                                             ("exp", [False], (i,))]

    def body_lane_test(i, j):
        return Block((If(compare("lt", j, idx(1)), Block((store(i, j, cosx(i)),))),))
    nest, i, j = nest_of(body_lane_test)
    assert uniform_values.decide(nest, j, bl) == []

    def body_two_tests(i, j):
        return Block((If(compare("lt", i, idx(8)), Block((store(i, j, cosx(i)),)), Block((store(i, j, cosx(i)),))),))
    nest, i, j = nest_of(body_two_tests)
    assert uniform_values.decide(nest, j, bl) == []

    def body_reads_own_output(i, j):
        return Block((store(i, j, unary("cos", BufLoad(out, linear((i, idx(0)), (16, 3))))),))
    nest, i, j = nest_of(body_reads_own_output)
    assert uniform_values.decide(nest, j, bl) == []
