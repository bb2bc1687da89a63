"""Row chains (``lowering/row_chains.py``): consecutive stages over the same
rows run as one stage, row by row, only where every buffer they share is
touched at one row; the results are those of the stages run apart."""
import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import te_autodiff as te
from lowering import pipeline
from lowering.loop_ir import linear_form, substitute
from lowering.row_chains import one_row
from lowering.schedule.constructors import idx
from te_autodiff.expr import var as te_var


def _build(inputs, outputs, joined: bool, monkeypatch):
    with monkeypatch.context() as m:
        if not joined:
            m.setattr(pipeline, "join_rows", lambda program, target: program)
            m.setattr(pipeline, "join_blocks", lambda program, target: program)
        return te.build(inputs, outputs)


def _stage_names(f):
    return [line.split()[1].rstrip(":") for line in f.scheduled_ir.splitlines() if line.startswith("stage ")]


def _rows_beyond_l2(row_bytes: int) -> int:
    """Rows of ``row_bytes`` whose whole, a thread's share of it, leaves L2."""
    t = te.target()
    return t.l2_bytes * t.threads // row_bytes + 37


def _softmax(h: int, n: int, m: int):
    """``(X, P)``: ``P`` the softmax of the rows of ``X`` (``h x n x m``), in
    four row stages: the row's max, ``exp``, the row's sum, the quotient."""
    X = te.placeholder((h, n, m), "float32", "X")
    j1, j2 = te.reduce_axis(m, "j"), te.reduce_axis(m, "j")
    M = te.compute((h, n), lambda a, i: te.max(X[a, i, j1], axis=j1), name="row_max")
    E = te.compute((h, n, m), lambda a, i, j: te.exp(X[a, i, j] - M[a, i]), name="exp")
    Z = te.compute((h, n), lambda a, i: te.sum(E[a, i, j2], axis=j2), name="row_sum")
    return X, te.compute((h, n, m), lambda a, i, j: E[a, i, j] / Z[a, i], name="softmax")


def test_stages_split_to_run_apart_stay_apart(monkeypatch):
    """The softmax of the test below, whose row stages join once its rows
    leave L2, with every stage marked ``apart`` before the join (as the
    schedule marks column groups): none joins."""
    X, P = _softmax(3, _rows_beyond_l2(3 * 100 * 4), 100)
    assert any("+" in name for name in _stage_names(te.build([X], [P])))
    join = pipeline.join_rows
    monkeypatch.setattr(pipeline, "join_rows", lambda program, target: join(
        replace(program, stages=tuple(replace(s, apart=True) for s in program.stages)), target))
    assert not any("+" in name for name in _stage_names(te.build([X], [P])))


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("h", [3, 5])
def test_a_softmax_and_its_gradient_run_row_by_row(rng, monkeypatch, large, h):
    """The four row stages of a softmax join into one, and so do those of
    its gradient (the row sum's adjoint and ``dX``: the max gets none,
    ``shift_invariance.py``; here all join, each reading only its own row),
    once the rows they share leave L2 between stages (on both sides of
    that); values as the stages run apart (to a last bit) and as numpy
    computes them in float64.  Five heads do not share out over two
    threads, so their root collapses heads and rows into one loop whose
    indices divide by the row count (``a.i // n``, ``a.i % n``)."""
    m = 100
    n = _rows_beyond_l2(h * m * 4) if large else 37
    X, P = _softmax(h, n, m)
    H = te.placeholder((h, n, m), "float32", "H")
    r = [te.reduce_axis(d, f"r{k}") for k, d in enumerate((h, n, m))]
    loss = te.compute((1,), lambda _: te.sum(P[r[0], r[1], r[2]] * H[r[0], r[1], r[2]], axis=r), name="loss")
    (dX,) = te.gradient(loss, [X])
    joined, apart = (_build([X, H], [P, dX], flag, monkeypatch) for flag in (True, False))
    parts = [set(name.split("+")) for name in _stage_names(joined)]
    assert any({"row_max", "exp", "row_sum", "softmax"} <= p for p in parts) == large, parts
    assert any({"drow_sum", "dX"} <= p for p in parts) == large, parts
    assert all(len(name.split("+")) < 3 for name in _stage_names(apart))
    x, hh = rng.standard_normal((h, n, m)).astype(np.float32), rng.standard_normal((h, n, m)).astype(np.float32)
    got, want = joined(x, hh), apart(x, hh)
    for g, w in zip(got, want):             # the same operations; LLVM may round a last bit apart
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6 * np.abs(w).max())
    x64 = x.astype(np.float64)
    p = np.exp(x64 - x64.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dx = p * (hh - np.sum(hh * p, -1, keepdims=True))
    np.testing.assert_allclose(got[0], p, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[1], dx, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("reverse", [False, True])
def test_a_stage_reading_another_row_keeps_to_itself(rng, monkeypatch, reverse):
    """``Z[i, j] = 2 Y[i, j]`` after ``Y = exp(X)`` joins it; ``Z[i, j] = 2
    Y[n - 1 - i, j]`` reads a row the joined loop would not have written
    yet, so the stages stay apart.  Values as numpy's either way."""
    m = 40
    n = _rows_beyond_l2(m * 4)
    X = te.placeholder((n, m), "float32", "X")
    Y = te.compute((n, m), lambda i, j: te.exp(X[i, j]), name="Y")
    Z = te.compute((n, m), lambda i, j: Y[n - 1 - i if reverse else i, j] * 2.0, name="Z")
    f = te.build([X], [Y, Z])
    names = _stage_names(f)
    assert ("Y+Z" in names) != reverse, names
    x = rng.standard_normal((n, m)).astype(np.float32)
    y, z = f(x)
    np.testing.assert_allclose(y, np.exp(x.astype(np.float64)), rtol=1e-6)
    np.testing.assert_array_equal(z, (y[::-1] if reverse else y) * np.float32(2))


@settings(max_examples=300, deadline=None)
@given(extents=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       steps=st.lists(st.integers(-2, 24), min_size=3, max_size=3),
       spans=st.lists(st.tuples(st.integers(-3, 12), st.integers(0, 12)), min_size=1, max_size=3),
       other=st.booleans())
def test_accesses_judged_one_row_touch_disjoint_rows(extents, steps, spans, other):
    """Property: when ``one_row`` accepts accesses (steps per row loop, and
    the range ``[lo, hi]`` of the rest), no address is touched from two
    different rows; an access with other steps is refused."""
    steps = tuple(steps[:len(extents)])
    found = [(steps, lo, lo + w) for lo, w in spans]
    if other:
        found.append((tuple(s + 1 for s in steps), 0, 0))
    if not one_row(found, extents):
        return
    assert not other
    owner = {}
    for point in itertools.product(*(range(e) for e in extents)):
        base = sum(s * p for s, p in zip(steps, point))
        for _, lo, hi in found:
            for address in range(base + lo, base + hi + 1):
                assert owner.setdefault(address, point) == point


@settings(max_examples=200, deadline=None)
@given(c=st.integers(2, 40), s=st.integers(-9, 9), extra=st.integers(-2, 2), t=st.integers(-5, 5),
       summed=st.booleans(),
       points=st.lists(st.tuples(st.integers(-500, 500), st.integers(-50, 50)), min_size=1, max_size=5))
def test_an_index_of_fused_loops_reads_as_affine(c, s, extra, t, summed, points):
    """Property: ``linear_form`` reads ``s * (x % c) + q * (x // c)`` as
    ``s * x`` exactly when ``q == c * s`` (loops fused into one, the buffer
    laid out row after row), the dividend ``x`` itself affine (a sum of
    loops, as a block's first row plus a row in it) read into its terms,
    and keeps both atoms otherwise; either way the form has the
    expression's value at every point, negative ones too."""
    x, y = te_var("x"), te_var("y")
    q = c * s + extra
    dividend = x * 3 + y if summed else x
    e = (dividend % c) * s + (dividend // c) * q + y * t + 3
    terms, const = linear_form(e)
    if s and not extra:
        assert set(terms) <= {x, y} and terms.get(x) == (3 * s if summed else s)
    elif s and q:
        assert any(getattr(a, "op", None) == "mod" for a in terms)
    for px, py in points:
        at = {x: idx(px), y: idx(py)}
        d = 3 * px + py if summed else px
        value = const + sum(k * substitute(a, at).value for a, k in terms.items())
        assert value == substitute(e, at).value == (d % c) * s + (d // c) * q + py * t + 3
