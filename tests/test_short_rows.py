"""Short rows (lowering/short_rows.py): a stage whose rows are shorter than a
vector unrolls them, a temporary with such rows keeps a buffer per column,
and the chain fuses into one loop over the rows; elsewhere nothing changes."""
import numpy as np
import pytest

import lowering.pipeline as pipeline
import te_autodiff as te
from lowering.loop_ir import Alloc, For, If, stmt_text, walk
from lowering.short_rows import short_rows


def lanes(dtype) -> int:
    return te.target().lanes(np.dtype(dtype).itemsize)


def fused(inputs, outputs):
    return pipeline.lower_for(inputs, outputs).fused


def temps(program) -> list:
    return sorted(b.name for b in program.buffers if b.kind == "temp")


def rotation(n, p, dtype="float64"):
    """Rodrigues' rotation of gathered points by gathered axis-angle vectors,
    then a perspective projection: the shape of bundle adjustment's residual."""
    rot = te.placeholder((n, 3), dtype, "rot")
    X = te.placeholder((p, 3), dtype, "X")
    idx = te.placeholder((p,), "int32", "idx")
    a = te.reduce_axis(3, name="a")
    sq = te.compute((p,), lambda i: te.sum(rot[idx[i], a] * rot[idx[i], a], axis=a), name="sq")
    b = te.reduce_axis(3, name="b")
    dot = te.compute((p,), lambda i: te.sum(rot[idx[i], b] * X[i, b], axis=b), name="dot")

    def entry(i, j):
        theta = te.sqrt(sq[i])
        k = lambda c: rot[idx[i], c] / theta
        cross = k((j + 1) % 3) * X[i, (j + 2) % 3] - k((j + 2) % 3) * X[i, (j + 1) % 3]
        return X[i, j] * te.cos(theta) + cross * te.sin(theta) + k(j) * dot[i] / theta * (1.0 - te.cos(theta))
    Xr = te.compute((p, 3), entry, name="Xr")
    proj = te.compute((p, 2), lambda i, r: Xr[i, r] / Xr[i, 2], name="proj")
    return [rot, X, idx], proj


def rotation_numpy(rot, X, idx):
    r = rot[idx]
    theta = np.sqrt((r * r).sum(1))[:, None]
    k = r / theta
    Xr = X * np.cos(theta) + np.cross(k, X) * np.sin(theta) + k * (k * X).sum(1)[:, None] * (1 - np.cos(theta))
    return Xr[:, :2] / Xr[:, 2:]


def rotation_data(n, p, dtype="float64", seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(0.2, 1.0, (n, 3)).astype(dtype), (rng.normal(size=(p, 3)) + [0, 0, 6]).astype(dtype),
            rng.integers(0, n, p).astype(np.int32))


def test_a_rotation_chain_runs_as_one_loop_over_its_rows():
    p = 4 * lanes("float64") + 3
    inputs, proj = rotation(5, p)
    program = fused(inputs, [proj])
    if 3 < lanes("float64"):                                  # rows of 3 are short on this target
        assert {"Xr.0", "Xr.1", "Xr.2"} <= set(temps(program)) and "Xr" not in temps(program)
        (stage,) = [s for s in program.stages if any(b.name == "Xr.0" for b in _stores(s))]
        assert len([x for x in walk(stage.body) if isinstance(x, For)]) == 1     # one loop: the rows
    else:
        assert "Xr" in temps(program)
    kernel = te.build(inputs, [proj])
    data = rotation_data(5, p)
    # each entry: a few roundings of sqrt, cos, sin (a few ulp each) and a division
    np.testing.assert_allclose(kernel(*data), rotation_numpy(*data), rtol=1e-13, atol=1e-15)


def _stores(stage):
    from lowering.loop_ir import Store
    return [x.buffer for x in walk(stage.body) if isinstance(x, Store)]


def test_the_rows_unrolled_compute_a_rotations_cos_and_sin_once():
    dtype = "float64" if 3 < lanes("float64") else "float32"     # rows of 3 short on this target
    inputs, proj = rotation(5, 4 * lanes(dtype), dtype)
    program = fused(inputs, [proj])
    text = str(program)
    assert text.count("cos(") == 1 and text.count("sin(") == 1


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("side", ["row one short of a vector", "row of a vector", "too few rows", "enough rows"])
def test_the_rule_holds_on_both_sides_of_its_thresholds(dtype, side):
    L = lanes(dtype)
    c, p = {"row one short of a vector": (L - 1, 3 * L), "row of a vector": (L, 3 * L),
            "too few rows": (2, L - 1), "enough rows": (2, L)}[side]
    x = te.placeholder((p, c), dtype, "x")
    y = te.compute((p, c), lambda i, j: te.exp(x[i, (j + 1) % c]) * x[i, j], name="y")
    k = te.reduce_axis(c, name="k")
    z = te.compute((p,), lambda i: te.sum(y[i, k] * y[i, c - 1 - k], axis=k), name="z")
    program = fused([x], [z])
    splits = 2 <= c < L <= p                                  # the rule (module doc of short_rows.py)
    assert splits == (side in ("row one short of a vector", "enough rows")) or L <= 2
    assert temps(program) == ([f"y.{k}" for k in sorted(map(str, range(c)))] if splits else ["y"])
    xv = np.random.default_rng(2).uniform(-1, 1, (p, c)).astype(dtype)
    yv = np.exp(np.roll(xv, -1, axis=1)) * xv
    got = te.build([x], [z])(xv)
    # exp within a few ulp, a product, c terms summed: bounded by (c + 8) eps relative to the sum of |terms|
    bound = (c + 8) * np.finfo(dtype).eps * np.abs(yv * yv[:, ::-1]).sum(1)
    assert np.all(np.abs(got - (yv * yv[:, ::-1]).sum(1)) <= bound)


def test_a_column_named_by_a_loop_variable_reads_through_a_select():
    """A stage that keeps its short row (an output written row-wise) reads
    the split temporary's columns by the row's variable."""
    p = 3 * lanes("float64")
    x = te.placeholder((p, 3), "float64", "x")
    y = te.compute((p, 3), lambda i, j: te.exp(x[i, (j + 2) % 3]), name="y")
    out = te.compute((p, 3), lambda i, j: y[i, j] * 2.0 + y[i, 0], name="out")
    program = short_rows(pipeline.lower_for([x], [out]).plain, te.target())
    assert temps(program) == (["y.0", "y.1", "y.2"] if 3 < lanes("float64") else ["y"])
    xv = np.random.default_rng(3).normal(size=(p, 3))
    yv = np.exp(np.roll(xv, 1, axis=1))
    np.testing.assert_allclose(te.build([x], [out])(xv), yv * 2 + yv[:, :1], rtol=1e-15)


def test_a_temporary_read_in_another_order_keeps_its_layout():
    """A read of ``y`` as a flat array in another order (its element ``j p + i``)
    names no column of a row: ``y`` keeps its layout."""
    p = 2 * lanes("float64") + 1
    x = te.placeholder((p, 3), "float64", "x")
    y = te.compute((p, 3), lambda i, j: te.exp(x[i, (j + 1) % 3]), name="y")
    out = te.compute((p, 3), lambda i, j: y[(j * p + i) // 3, (j * p + i) % 3] + y[i, 0], name="out")
    program = fused([x], [out])
    assert "y" in temps(program)
    xv = np.random.default_rng(4).normal(size=(p, 3))
    yv = np.exp(np.roll(xv, -1, axis=1))
    want = yv.reshape(-1)[np.arange(3)[None, :] * p + np.arange(p)[:, None]] + yv[:, :1]
    np.testing.assert_allclose(te.build([x], [out])(xv), want, rtol=1e-15)


def test_a_rotations_gradient_matches_finite_differences_and_the_rule_switched_off(monkeypatch):
    n, p = 4, 2 * lanes("float64") + 1
    inputs, proj = rotation(n, p)
    H = te.placeholder((p, 2), "float64", "H")
    r = te.reduce_axis(p, name="r")
    c = te.reduce_axis(2, name="c")
    loss = te.compute((1,), lambda z: te.sum(proj[r, c] * H[r, c], axis=[r, c]), name="loss")
    grads = te.gradient(loss, inputs[:2])
    rot, X, idx = rotation_data(n, p, seed=5)
    h = np.random.default_rng(6).normal(size=(p, 2))
    on = te.build(inputs + [H], grads)(rot, X, idx, h)
    monkeypatch.setattr(pipeline, "short_rows", lambda program, target: program)
    off = te.build(inputs + [H], grads)(rot, X, idx, h)
    for a, b in zip(on, off):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    # through gathered rows: the loss's gradient by the points against central differences
    eps = 1e-6
    for i, c in [(0, 0), (p // 2, 2), (p - 1, 1)]:
        up, down = X.copy(), X.copy()
        up[i, c] += eps
        down[i, c] -= eps
        numeric = ((rotation_numpy(rot, up, idx) - rotation_numpy(rot, down, idx)) * h).sum() / (2 * eps)
        assert abs(on[1][i, c] - numeric) <= 1e-6 * (1 + abs(numeric))


def _tested(s, tests=()):
    """``(statement, tests around it)`` for every statement in ``s``."""
    from lowering.loop_ir import Block
    if isinstance(s, Block):
        for x in s.stmts:
            yield from _tested(x, tests)
    elif isinstance(s, For):
        yield from _tested(s.body, tests)
    elif isinstance(s, If):
        yield from _tested(s.then, tests + (s.cond,))
        if s.else_ is not None:
            yield from _tested(s.else_, tests + (s.cond,))
    else:
        yield s, tests


def test_unrolled_copies_of_a_tested_value_keep_its_test():
    """A value under a test moves before the unrolled copies, under the same
    test (``log`` of a negative number is never computed), once."""
    p = 2 * lanes("float64")
    x = te.placeholder((p, 3), "float64", "x")
    s = te.placeholder((p,), "float64", "s")
    g = te.placeholder((5,), "float64", "g")
    q = te.placeholder((p,), "int32", "q")
    # a gather in a branch makes the select a test around statements (a select's operands would both run)
    y = te.compute((p, 3), lambda i, j: te.if_then_else(
        s[i] > 0.0, x[i, j] * te.log(s[i]) + g[q[i]], x[i, j]), name="y")
    z = te.compute((p, 2), lambda i, r: y[i, r] / y[i, 2], name="z")
    program = fused([x, s, g, q], [z])
    logs = [(st, tests) for stage in program.stages for st, tests in _tested(stage.body) if "log(" in stmt_text(st)]
    assert len(logs) == 1 and len(logs[0][1]) == 1
    for stage in program.stages:
        names = [x.local.name for x in walk(stage.body) if isinstance(x, Alloc)]
        assert len(names) == len(set(names))                 # every copy's locals are its own
    rng = np.random.default_rng(7)
    xv, sv, gv, qv = rng.normal(size=(p, 3)), rng.normal(size=p), rng.normal(size=5), rng.integers(0, 5, p)
    yv = np.where(sv[:, None] > 0, xv * np.log(np.abs(sv))[:, None] + gv[qv][:, None], xv)
    got = te.build([x, s, g, q], [z])(xv, sv, gv, qv.astype(np.int32))
    np.testing.assert_allclose(got, yv[:, :2] / yv[:, 2:], rtol=1e-14)
