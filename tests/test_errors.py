"""SPEC error rules (kernel argument checks, bounds at build and run time, definition errors,
gradient argument errors) and determinism / zero-gradient guarantees."""
import numpy as np
import pytest

import te_autodiff as te
from conftest import assert_close, build_grad, run

F64 = "float64"


def _axpy():
    A = te.placeholder((3, 4), F64, "Alpha")
    B = te.placeholder((4,), "int32", "Beta")
    C = te.compute((3, 4), lambda i, j: A[i, j] * 2.0 + B[j].astype(F64), name="C")
    return A, B, C, te.build([A, B], [C])


def _good_args():
    return np.ones((3, 4)), np.arange(4, dtype=np.int32)


# ---------------------------------------------------------------- kernel arguments


def test_kernel_runs_on_good_arguments():
    *_, f = _axpy()
    c = f(*_good_args())
    assert isinstance(c, np.ndarray) and c.shape == (3, 4) and c.dtype == np.float64
    assert_close(c, 2.0 + np.arange(4.0)[None, :] * np.ones((3, 1)))


@pytest.mark.parametrize("args", [(), (np.ones((3, 4)),), _good_args() + (np.ones(4),)])
def test_kernel_wrong_number_of_arrays(args):
    *_, f = _axpy()
    with pytest.raises((TypeError, ValueError)):
        f(*args)


@pytest.mark.parametrize("which,bad,name", [
    (0, np.ones((3, 4), np.float32), "Alpha"),
    (0, np.ones((3, 4), np.int64), "Alpha"),
    (1, np.arange(4, dtype=np.int64), "Beta"),
    (1, np.arange(4, dtype=np.float64), "Beta"),
])
def test_kernel_wrong_dtype_names_the_placeholder(which, bad, name):
    *_, f = _axpy()
    args = list(_good_args())
    args[which] = bad
    with pytest.raises(TypeError, match=name):
        f(*args)


@pytest.mark.parametrize("which,bad,name", [
    (0, np.ones((4, 3)), "Alpha"),
    (0, np.ones(12), "Alpha"),
    (0, np.ones((3, 4, 1)), "Alpha"),
    (1, np.arange(5, dtype=np.int32), "Beta"),
    (1, np.arange(4, dtype=np.int32).reshape(1, 4), "Beta"),
])
def test_kernel_wrong_shape_names_the_placeholder(which, bad, name):
    *_, f = _axpy()
    args = list(_good_args())
    args[which] = bad
    with pytest.raises(ValueError, match=name):
        f(*args)


@pytest.mark.parametrize("bad", [None, "abc", 3.0, object()])
def test_kernel_non_array_argument(bad):
    *_, f = _axpy()
    with pytest.raises(TypeError, match="Alpha"):
        f(bad, _good_args()[1])


def test_kernel_accepts_non_contiguous_arrays_and_leaves_inputs_alone():
    *_, f = _axpy()
    b = np.arange(4, dtype=np.int32)
    views = [np.asfortranarray(np.arange(12.0).reshape(3, 4)),     # column-major
             np.arange(24.0).reshape(3, 8)[:, ::2],                 # strided
             np.arange(12.0).reshape(4, 3).T,                       # transposed
             np.arange(12.0).reshape(3, 4)[::-1]]                   # negative stride
    for a in views:
        keep = a.copy()
        assert_close(f(a, b), keep * 2.0 + b)
        np.testing.assert_array_equal(a, keep)
    assert_close(f(np.ones((3, 4)), np.arange(8, dtype=np.int32)[::2]),
                 2.0 + np.arange(0, 8, 2.0) * np.ones((3, 1)))


def test_kernel_returns_fresh_arrays():
    A, B, C, f = _axpy()
    a, b = _good_args()
    c1 = f(a, b)
    c1[...] = -1.0
    c2 = f(a, b)
    assert_close(c2, 2.0 + b * np.ones((3, 1)))
    assert not np.shares_memory(c2, a)


def test_multiple_outputs_come_back_as_a_tuple_in_order():
    A = te.placeholder((3,), F64, "A")
    P = te.compute((3,), lambda i: A[i] + 1.0, name="P")
    Q = te.compute((2,), lambda i: A[i] * A[i + 1], name="Q")
    res = te.build([A], [Q, P])(np.array([1.0, 2.0, 3.0]))
    assert isinstance(res, tuple) and len(res) == 2
    assert_close(list(res), [np.array([2.0, 6.0]), np.array([2.0, 3.0, 4.0])])


# ---------------------------------------------------------------- bounds


@pytest.mark.parametrize("index", [
    lambda i: i + 1, lambda i: i - 1, lambda i: 2 * i, lambda i: 5 - i, lambda i: i * 0 + 5,
])
def test_build_rejects_an_access_that_can_leave_bounds(index):
    A = te.placeholder((5,), F64, "A")
    B = te.compute((5,), lambda i: A[index(i)] * 2.0, name="B")
    with pytest.raises(IndexError):
        te.build([A], [B])


def test_build_rejects_a_reduction_running_past_the_end():
    A = te.placeholder((4, 3), F64, "A")
    k = te.reduce_axis(4, "k")
    B = te.compute((4,), lambda i: te.sum(A[i, k], axis=k), name="B")
    with pytest.raises(IndexError):
        te.build([A], [B])


def test_build_rejects_an_unsafe_access_in_an_intermediate_tensor():
    A = te.placeholder((5,), F64, "A")
    B = te.compute((5,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((5,), lambda i: B[i + 1] * 2.0, name="C")
    with pytest.raises(IndexError):
        te.build([A], [C])


def test_guarded_access_builds_and_reads_in_range():
    A = te.placeholder((5,), F64, "A")
    B = te.compute((5,), lambda i: te.if_then_else(i + 1 < 5, A[i + 1], 0.0), name="B")
    C = te.compute((5,), lambda i: te.if_then_else(te.all(i >= 1, i - 1 < 5), A[i - 1] * 2.0, -1.0), name="C")
    D = te.compute((6, 2), lambda i, j: te.if_then_else(te.all(i < 5, te.equal(j, 0)), A[i], 7.0), name="D")
    a = np.arange(1.0, 6.0)
    b, c, d = run([A], [B, C, D], [a])
    np.testing.assert_array_equal(b, [2, 3, 4, 5, 0])
    np.testing.assert_array_equal(c, [-1, 2, 4, 6, 8])
    np.testing.assert_array_equal(d[:, 1], 7.0)
    np.testing.assert_array_equal(d[:, 0], [1, 2, 3, 4, 5, 7])


def test_guarded_access_gradient():
    A = te.placeholder((5,), F64, "A")
    B = te.compute((5,), lambda i: te.if_then_else(i + 1 < 5, A[i + 1] * A[i + 1], 0.0), name="B")
    a, h = np.arange(1.0, 6.0), np.array([1.0, -2.0, 0.5, 3.0, 9.0])
    r = build_grad(B, [A], [a], head=h)
    expected = np.concatenate([[0.0], 2 * a[1:] * h[:-1]])
    assert_close(r.grads, [expected])
    assert_close(r.naive, [expected])


def test_untaken_branch_with_data_dependent_index_is_never_evaluated():
    T = te.placeholder((4,), F64, "T")
    I = te.placeholder((6,), "int32", "I")
    out = te.compute((6,), lambda n: te.if_then_else(te.all(I[n] >= 0, I[n] < 4), T[I[n]], -1.0), name="out")
    t = np.array([10.0, 11.0, 12.0, 13.0])
    idx = np.array([0, -1, 3, 4, 1000, -7], np.int32)
    o, = run([T, I], [out], [t, idx])
    np.testing.assert_array_equal(o, [10.0, -1.0, 13.0, -1.0, -1.0, -1.0])


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("bad", [-1, 5, 2 ** 31 - 1])
def test_runtime_gather_index_out_of_range(dtype, bad):
    T = te.placeholder((5, 2), F64, "T")
    I = te.placeholder((3,), dtype, "I")
    out = te.compute((3, 2), lambda n, d: T[I[n], d], name="out")
    f = te.build([T, I], [out])
    t = np.arange(10.0).reshape(5, 2)
    assert_close(f(t, np.array([4, 0, 2], dtype)), t[[4, 0, 2]])
    with pytest.raises(IndexError):
        f(t, np.array([0, bad, 1], dtype))


def test_runtime_index_check_in_a_forward_and_gradient_kernel():
    T = te.placeholder((5,), F64, "T")
    I = te.placeholder((3,), "int64", "I")
    out = te.compute((3,), lambda n: T[I[n]] * 2.0, name="out")
    dT, = te.gradient(out, [T])
    f = te.build([T, I], [out, dT])
    o, d = f(np.arange(5.0), np.array([1, 1, 4]))
    assert_close([o, d], [np.array([2.0, 2.0, 8.0]), np.array([0.0, 4.0, 0.0, 0.0, 2.0])])
    with pytest.raises(IndexError):
        f(np.zeros(5), np.array([1, 5, 4]))


# ---------------------------------------------------------------- definitions


def test_wrong_fcompute_arity():
    A = te.placeholder((3, 4), F64, "A")
    with pytest.raises((TypeError, ValueError)):
        te.compute((3, 4), lambda i: A[i, 0], name="C")
    with pytest.raises((TypeError, ValueError)):
        te.compute((3,), lambda i, j: A[i, j], name="C")


def test_wrong_number_of_indices():
    A = te.placeholder((3, 4), F64, "A")
    with pytest.raises((IndexError, TypeError, ValueError), match="'A'"):
        te.compute((3,), lambda i: A[i], name="C")
    with pytest.raises((IndexError, TypeError, ValueError), match="'A'"):
        te.compute((3, 4), lambda i, j: A[i, j, 0], name="C")


def test_other_definition_errors():
    A = te.placeholder((3, 4), F64, "A")
    n = te.placeholder((3,), "int32", "n")
    k = te.reduce_axis(4, "k")
    with pytest.raises(TypeError):                              # '/' on ints is not floor division
        te.compute((3,), lambda i: n[i] / 2, name="C")
    with pytest.raises(TypeError):                              # a tensor, not an element
        te.compute((3, 4), lambda i, j: A, name="C")
    with pytest.raises(ValueError):                             # reduce axis used outside its reduction
        te.compute((3,), lambda i: A[i, k], name="C")
    with pytest.raises(ValueError):                             # one reduce axis, two reductions
        te.compute((3,), lambda i: te.sum(A[i, k], axis=k) + te.max(A[i, k], axis=k), name="C")
    with pytest.raises(TypeError):                              # Python bool as a condition
        te.compute((3, 4), lambda i, j: te.if_then_else(A[i, j] == 0.0, 1.0, 0.0), name="C")
    with pytest.raises(TypeError):                              # non-bool condition
        te.compute((3, 4), lambda i, j: te.if_then_else(A[i, j], 1.0, 0.0), name="C")
    with pytest.raises(ValueError, match="non-negative"):       # (3, 0) is an empty tensor, (3, -1) nothing
        te.placeholder((3, -1), F64, "Z")
    with pytest.raises(TypeError):
        te.placeholder((3, 4), "complex64", "Z")


@pytest.mark.parametrize("make", [
    lambda e: bool(e),
    lambda e: e and True,
    lambda e: 1.0 if e > 0 else 0.0,
    lambda e: not e,
])
def test_expression_has_no_truth_value(make):
    A = te.placeholder((3,), F64, "A")
    k = te.reduce_axis(3, "k")
    with pytest.raises(TypeError):
        make(A[k])
    with pytest.raises(TypeError):
        te.compute((3,), lambda i: make(A[i]), name="C")


# ---------------------------------------------------------------- gradient arguments


def test_gradient_head_of_wrong_shape():
    A = te.placeholder((3, 4), F64, "A")
    C = te.compute((3, 4), lambda i, j: A[i, j] * A[i, j], name="C")
    for shape in [(4, 3), (3,), (3, 4, 1)]:
        with pytest.raises(ValueError):
            te.gradient(C, [A], head=te.placeholder(shape, F64, "H"))


def test_gradient_non_tensor_arguments():
    A = te.placeholder((3,), F64, "A")
    C = te.compute((3,), lambda i: A[i] * 2.0, name="C")
    k = te.reduce_axis(3, "k")
    for bad in (np.ones(3), A[k], "A", 1.0):
        with pytest.raises(TypeError):
            te.gradient(C, [bad])
        with pytest.raises(TypeError):
            te.gradient(bad, [A])
    with pytest.raises(TypeError):
        te.gradient(C, [A], head=np.ones(3))


def test_check_gradient_reports_a_mismatch():
    """At a jump of floor division the finite differences disagree with the (zero) derivative."""
    X = te.placeholder((3,), F64, "X")
    Y = te.compute((3,), lambda i: X[i] // 0.5 + X[i], name="Y")
    te.check_gradient(Y, [X], [np.array([0.25, 1.25, 2.3])])
    with pytest.raises(AssertionError, match="X"):
        te.check_gradient(Y, [X], [np.array([0.25, 1.0, 2.3])])


# ---------------------------------------------------------------- determinism and zero gradients


def _mixed_program():
    X = te.placeholder((4, 6), "float32", "X")
    W = te.placeholder((3, 6), "float32", "W")
    k, c = te.reduce_axis(6, "k"), te.reduce_axis(3, "c")
    Z = te.compute((4, 3), lambda i, j: te.tanh(te.sum(X[i, k] * W[j, k], axis=k)), name="Z")
    L = te.compute((4,), lambda i: te.log(te.sum(te.exp(Z[i, c]), axis=c)), name="L")
    return [X, W], [L] + te.gradient(L, [X, W])


def test_same_program_built_twice_is_bit_identical():
    rng = np.random.default_rng(0)
    vals = [rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((3, 6)).astype(np.float32)]
    ins1, outs1 = _mixed_program()
    ins2, outs2 = _mixed_program()
    r1 = run(ins1, outs1, vals)
    r2 = run(ins2, outs2, vals)
    r3 = run(ins1, outs1, vals)
    for a, b, c in zip(r1, r2, r3):
        assert a.dtype == b.dtype == np.float32
        assert a.tobytes() == b.tobytes() == c.tobytes()


def test_gradient_of_ignored_input_is_zero():
    A = te.placeholder((3,), F64, "A")
    B = te.placeholder((2, 2), F64, "B")
    C = te.compute((3,), lambda i: te.exp(A[i]), name="C")
    dA, dB = te.gradient(C, [A, B])
    assert dB.shape == (2, 2) and dB.dtype == F64
    a, b = np.zeros(3), np.ones((2, 2))
    da, db = run([A, B], [dA, dB], [a, b])
    assert_close(da, np.ones(3))
    np.testing.assert_array_equal(db, np.zeros((2, 2)))


def test_gradient_through_integer_and_boolean_paths_is_zero():
    X = te.placeholder((4,), F64, "X")
    Y = te.compute((4,), lambda i: (X[i] * 3.0).astype("int32").astype(F64) + (X[i] > 0.0).astype(F64),
                   name="Y")
    dX, = te.gradient(Y, [X])
    np.testing.assert_array_equal(run([X], [dX], [np.array([0.3, -1.2, 2.5, 0.7])])[0], np.zeros(4))


@pytest.mark.parametrize("idx_dtype", ["int32", "int64", "bool"])
def test_integer_inputs_get_zero_gradients(idx_dtype):
    X = te.placeholder((4,), F64, "X")
    N = te.placeholder((4,), idx_dtype, "N")
    Y = te.compute((4,), lambda i: X[i] * N[i].astype(F64) + N[i].astype(F64) ** 2, name="Y")
    dX, dN = te.gradient(Y, [X, N])
    assert dN.dtype == idx_dtype and dN.shape == (4,)
    nv = np.array([1, 0, 1, 1]).astype(idx_dtype)
    xv = np.array([0.5, 1.0, -2.0, 3.0])
    dx, dn = run([X, N], [dX, dN], [xv, nv])
    assert dn.dtype == np.dtype(idx_dtype)
    np.testing.assert_array_equal(dn, np.zeros(4, idx_dtype))
    assert_close(dx, nv.astype(F64))
