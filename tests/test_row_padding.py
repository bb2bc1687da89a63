"""Row padding (``lowering/row_padding.py``): temporaries whose rows crowd a
few L1 sets get one more cache line per row; every access still reaches the
same element."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import te_autodiff as te
from te_autodiff.expr import Var, add, const, mul, var
from lowering.pipeline import lower_for
from lowering.row_padding import crowded, padded_index
from lowering.target import target as named_target

TARGETS = ["x86-64-v2", "haswell", "znver4", "znver5", "neoverse-n1"]


@pytest.mark.parametrize("name", TARGETS)
def test_rows_a_multiple_of_the_way_apart_are_crowded_on_both_sides(name):
    """Rows a multiple of the L1 way size apart fall in one set: crowded once
    there are more of them than the set has ways.  Half a way, a way and a
    line, or a stride that is no whole number of lines reach other sets."""
    t = named_target(name)
    way, rows = t.l1_bytes // t.l1_ways, 1 << 20
    assert crowded(way, rows, t) and crowded(3 * way, rows, t)
    assert not crowded(way // 2, rows, t) and not crowded(3 * way // 2, rows, t)
    assert not crowded(way + t.cache_line, rows, t) and not crowded(way + 4, rows, t)
    assert not crowded(way, t.l1_ways, t) and crowded(way, t.l1_ways + 1, t)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 64), pad=st.integers(1, 16), rows=st.lists(st.integers(1, 5), min_size=1, max_size=3),
       col=st.integers(0, 63), width=st.integers(1, 64), scale=st.integers(-3, 3), data=st.data())
def test_a_padded_index_reaches_the_same_row_and_column(n, pad, rows, col, width, scale, data):
    """Property: for every point of the loops, the padded index is the old
    element's ``row * (n + pad) + column``; an index whose within-row part
    leaves the row over the loops' ranges gets None."""
    col = col % n
    row_vars = [var(f"r{d}") for d in range(len(rows))]
    c = var("c")
    strides = [int(np.prod(rows[d + 1:])) * n for d in range(len(rows))]
    ranges = {v: (0, e - 1) for v, e in zip(row_vars, rows)}
    ranges[c] = (0, width - 1)
    index = const(col, "int64")
    for v, s in zip(row_vars, strides):
        index = add(index, mul(v, const(s, "int64")))
    index = add(index, mul(c, const(scale, "int64")))
    got = padded_index(index, n, pad, ranges)
    span = [col + scale * x for x in (0, width - 1)]
    if scale % n and (min(span) < 0 or max(span) >= n):
        assert got is None
        return
    assert got is not None
    point = {v: data.draw(st.integers(0, e - 1)) for v, e in zip(row_vars, rows)}
    point[c] = data.draw(st.integers(0, width - 1))
    old = sum(point[v] * s for v, s in zip(row_vars, strides)) + col + scale * point[c]
    row, column = divmod(old, n)
    assert _value(got, point) == row * (n + pad) + column


def _value(e, point):
    from te_autodiff.expr import BinOp, Const
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        return point[e]
    assert isinstance(e, BinOp), e
    a, b = _value(e.a, point), _value(e.b, point)
    return {"add": a + b, "sub": a - b, "mul": a * b}[e.op]


def _transposed_product(T, dtype="float32"):
    """``dK[j, c] = Σ_i S[i, j] Q[i, c]`` with ``S = exp(A)`` a temporary read
    down its columns (attention's key gradient)."""
    A, Q = te.placeholder((T, T), dtype, "A"), te.placeholder((T, 64), dtype, "Q")
    S = te.compute((T, T), lambda i, j: te.exp(A[i, j]), name="S")
    i = te.reduce_axis(T, "i")
    dK = te.compute((T, 64), lambda j, c: te.sum(S[i, j] * Q[i, c], axis=i), name="dK")
    D = te.compute((T, T), lambda i, j: S[i, j] * A[i, j], name="D")
    return [A, Q], [dK, D]


def _shape(program, name):
    return {b.name: b.shape for b in program.buffers}[name]


@pytest.mark.parametrize("name", ["x86-64-v2", "haswell", "znver4"])
@pytest.mark.parametrize("T, dtype, padded", [(1024, "float32", True), (512, "float64", True),
                                              (512, "float32", False), (1536, "float32", False)])
def test_a_temporary_read_down_its_columns_gets_padded_rows(rng, name, T, dtype, padded):
    """``S``'s rows of 4 KiB (1024 float32, 512 float64: the L1 way of
    these targets) all fall in one L1 set: one more line per row; rows of 2
    or 6 KiB keep their layout.  The output ``D``, written in the same
    loops, keeps the caller's layout.  Values against numpy (float64)."""
    t = named_target(name)
    inputs, outputs = _transposed_product(T, dtype)
    program = lower_for(inputs, outputs, target=t).scheduled
    extra = t.cache_line // np.dtype(dtype).itemsize if padded else 0
    assert _shape(program, "S") == (T, T + extra)
    assert _shape(program, "D") == (T, T)
    if name != "x86-64-v2" or not padded:
        return                                  # one target runs: the others only change the layout
    a = rng.uniform(-1, 1, (T, T)).astype(dtype)
    q = rng.standard_normal((T, 64)).astype(dtype)
    dk, d = te.build(inputs, outputs, target=t)(a, q)
    s = np.exp(a.astype(np.float64))
    tol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(dk, s.T @ q, rtol=tol, atol=tol * T)
    np.testing.assert_allclose(d, s * a, rtol=tol, atol=tol)


def test_a_temporary_read_at_a_data_dependent_column_keeps_its_rows(rng):
    """``S[i, idx[i]]`` moves within a row by a loaded value, whose range the
    pass does not know: ``S`` keeps its layout, and the gather reads the
    right element."""
    T = 512
    A, idx = te.placeholder((T, T), "float32", "A"), te.placeholder((T,), "int32", "idx")
    S = te.compute((T, T), lambda i, j: te.exp(A[i, j]), name="S")
    i = te.reduce_axis(T, "i")
    G = te.compute((T,), lambda r: S[r, idx[r]], name="G")
    col = te.compute((T,), lambda j: te.sum(S[i, j], axis=i), name="col")
    program = lower_for([A, idx], [G, col]).scheduled
    assert _shape(program, "S") == (T, T)
    a = rng.uniform(-1, 1, (T, T)).astype(np.float32)
    ix = rng.integers(0, T, T).astype(np.int32)
    g, c = te.build([A, idx], [G, col])(a, ix)
    s = np.exp(a.astype(np.float64))
    np.testing.assert_allclose(g, s[np.arange(T), ix], rtol=1e-6)
    np.testing.assert_allclose(c, s.sum(0), rtol=1e-4)


@pytest.mark.parametrize("name", ["x86-64-v2", "haswell"])
def test_a_padded_temporary_is_read_down_its_columns_in_place(name):
    """The transposed product's ``S`` (re-read by enough column tiles on
    these targets to pay for row panels) is read in place once its rows are
    padded: the walk down its columns no longer meets set conflicts.  The
    same product from an input ``S``, whose rows stay a way apart, still
    reads it from row panels."""
    t = named_target(name)
    inputs, outputs = _transposed_product(1024)
    program = lower_for(inputs, outputs, target=t).scheduled
    assert _shape(program, "S") == (1024, 1024 + 16)
    assert not any(b.name.startswith("S.packed") for b in program.buffers)
    S, Q = te.placeholder((1024, 1024), "float32", "S"), te.placeholder((1024, 64), "float32", "Q")
    i = te.reduce_axis(1024, "i")
    dK = te.compute((1024, 64), lambda j, c: te.sum(S[i, j] * Q[i, c], axis=i), name="dK")
    assert any(b.name.startswith("S.packed") for b in lower_for([S, Q], [dK], target=t).scheduled.buffers)
