"""Front end: dtype promotion, hash-consing, tensor attributes, te.pretty, te.jacobian, fcompute forms."""
import itertools
import re

import numpy as np
import pytest

import te_autodiff as te
from conftest import assert_close, run

ORDER = ["bool", "int32", "int64", "float32", "float64"]


def promoted(a, b):
    """The documented rule: the higher dtype wins, bool arithmetic is int32."""
    top = max(a, b, key=ORDER.index)
    return "int32" if top == "bool" else top


def elem(dtype, shape=(4,), name=None):
    """A placeholder and its element at a fresh reduce axis (an index variable usable anywhere)."""
    t = te.placeholder(shape, dtype, name or f"p_{dtype}")
    k = te.reduce_axis(shape[0], "k")
    return t, t[k]


# ---------------------------------------------------------------- dtypes


@pytest.mark.parametrize("a,b", list(itertools.product(ORDER, ORDER)))
def test_binary_promotion_table(a, b):
    _, x = elem(a)
    _, y = elem(b)
    for e in (x + y, x * y, x - y, te.maximum(x, y), te.minimum(x, y)):
        assert e.dtype == promoted(a, b), (a, b, e)


@pytest.mark.parametrize("a,b,expected", [
    ("int64", "float32", "float32"), ("bool", "bool", "int32"), ("int32", "int64", "int64"),
    ("bool", "float32", "float32"), ("float32", "float64", "float64"), ("int32", "bool", "int32"),
])
def test_promotion_examples(a, b, expected):
    _, x = elem(a)
    _, y = elem(b)
    assert (x + y).dtype == expected
    assert (y + x).dtype == expected


def test_weak_python_literals():
    _, f32 = elem("float32")
    _, f64 = elem("float64")
    _, i32 = elem("int32")
    _, i64 = elem("int64")
    _, b = elem("bool")
    assert (f32 + 1).dtype == "float32" and (f32 * 0.5).dtype == "float32"
    assert (f64 * 0.5).dtype == "float64" and (2 * f64).dtype == "float64"
    assert (i32 + 1).dtype == "int32" and (i64 * 3).dtype == "int64"
    assert (i32 * 0.5).dtype == "float32" and (0.5 + i64).dtype == "float32"
    assert (b + 1).dtype == "int32"
    assert (f64 > 0).dtype == "bool" and (i32 <= 2).dtype == "bool"


def test_literal_dtypes_on_their_own():
    assert te.const(1).dtype == "int32"
    assert te.const(2 ** 40).dtype == "int64"
    assert te.const(1.5).dtype == "float32"
    assert te.const(True).dtype == "bool"
    assert te.const(1, "float64").dtype == "float64"
    assert te.const(3, np.int64).dtype == "int64"


def test_division_and_intrinsic_dtypes():
    _, i32 = elem("int32")
    _, f64 = elem("float64")
    _, b = elem("bool")
    with pytest.raises(TypeError):
        i32 / 2
    with pytest.raises(TypeError):
        i32 / i32
    assert (i32 / 2.0).dtype == "float32"
    assert (i32 // 2).dtype == "int32" and (i32 % 3).dtype == "int32"
    assert (f64 // 2.0).dtype == "float64" and (f64 % 2.0).dtype == "float64"
    assert te.exp(i32).dtype == "float32" and te.tanh(f64).dtype == "float64"
    assert te.sqrt(i32).dtype == "float32" and te.log(f64).dtype == "float64"
    assert te.abs(i32).dtype == "int32" and te.abs(f64).dtype == "float64"
    assert te.power(i32, 2).dtype == "float32" and te.power(f64, 2).dtype == "float64"
    assert (-i32).dtype == "int32"
    assert f64.astype("float32").dtype == "float32" and i32.astype(np.float64).dtype == "float64"
    assert te.equal(i32, 1).dtype == "bool" and te.not_equal(f64, 1.0).dtype == "bool"
    assert te.all(f64 > 0, i32 < 1).dtype == "bool" and te.any(b, f64 > 0).dtype == "bool"
    with pytest.raises(TypeError):
        te.exp(b)


def test_index_variables_and_reductions_dtypes():
    A = te.placeholder((3, 4), "float64", "A")
    N = te.placeholder((3,), "int32", "N")
    seen = {}

    def body(i, j):
        seen["i"] = i
        seen["idx"] = (i * 2 + 1) // 2
        return A[i, j]

    C = te.compute((3, 4), body, name="C")
    assert seen["i"].dtype == "int64" and seen["idx"].dtype == "int64"
    assert C.dtype == "float64"
    k = te.reduce_axis(4, "k")
    assert te.sum(A[0, k] > 0.0, axis=k).dtype == "int32"      # bools are counted in int32
    assert te.max(N[k % 3], axis=k).dtype == "int32"
    D = te.compute((3,), lambda i: A[N[i], 0], name="D")         # int32 may index
    assert D.dtype == "float64"
    with pytest.raises(TypeError):
        A[0.5, 0]
    with pytest.raises(TypeError):
        te.compute((3,), lambda i: A[i.astype("float32"), 0], name="bad")


@pytest.mark.parametrize("a,b", [("int64", "float32"), ("int32", "float64"), ("bool", "int32"),
                                 ("bool", "bool"), ("int32", "int64"), ("float32", "float64")])
def test_promoted_kernel_output_dtype_and_values(a, b):
    x = te.placeholder((6,), a, "x")
    y = te.placeholder((6,), b, "y")
    out = te.compute((6,), lambda i: x[i] * y[i] + x[i], name="out")
    rng = np.random.default_rng(0)
    xv = rng.integers(0, 2, 6).astype(a) if a == "bool" else rng.integers(-5, 6, 6).astype(a)
    yv = rng.integers(0, 2, 6).astype(b) if b == "bool" else rng.integers(-5, 6, 6).astype(b)
    res, = run([x, y], [out], [xv, yv])
    assert res.dtype == np.dtype(promoted(a, b))
    w = np.dtype(promoted(a, b))
    np.testing.assert_array_equal(res, xv.astype(w) * yv.astype(w) + xv.astype(w))


@pytest.mark.parametrize("dtype", ["int32", "int64", "float64"])
def test_floor_division_and_modulo_semantics(dtype):
    x = te.placeholder((8,), dtype, "x")
    y = te.placeholder((8,), dtype, "y")
    q = te.compute((8,), lambda i: x[i] // y[i], name="q")
    r = te.compute((8,), lambda i: x[i] % y[i], name="r")
    c = te.compute((8,), lambda i: x[i] // 3 + x[i] % 3, name="c")
    xv = np.array([7, -7, 7, -7, 0, 6, -6, 5], dtype)
    yv = np.array([2, 2, -2, -2, 3, -4, 4, 5], dtype)
    qv, rv, cv = run([x, y], [q, r, c], [xv, yv])
    np.testing.assert_array_equal(qv, np.floor_divide(xv, yv))
    np.testing.assert_array_equal(rv, np.mod(xv, yv))
    np.testing.assert_array_equal(cv, np.floor_divide(xv, 3) + np.mod(xv, 3))
    assert qv.dtype == np.dtype(dtype) and rv.dtype == np.dtype(dtype)


def test_float_floordiv_by_one_is_floor():
    x = te.placeholder((4,), "float64", "x")
    q = te.compute((4,), lambda i: x[i] // 1.0, name="q")
    xv = np.array([0.5, 2.5, -1.5, 3.0])
    np.testing.assert_array_equal(run([x], [q], [xv])[0], np.floor(xv))


def test_casts_in_kernel():
    x = te.placeholder((5,), "float64", "x")
    n = te.placeholder((5,), "int32", "n")
    out = te.compute((5,), lambda i: x[i].astype("float32") + n[i].astype("float32") * 0.5, name="out")
    b = te.compute((5,), lambda i: (x[i] > 0.0).astype("int32") + n[i], name="b")
    xv = np.array([1.25, -2.5, 0.0, 3.0, 1e-3])
    nv = np.array([1, 2, -3, 4, 0], np.int32)
    ov, bv = run([x, n], [out, b], [xv, nv])
    assert ov.dtype == np.float32 and bv.dtype == np.int32
    np.testing.assert_array_equal(ov, xv.astype(np.float32) + nv.astype(np.float32) * np.float32(0.5))
    np.testing.assert_array_equal(bv, (xv > 0).astype(np.int32) + nv)


# ---------------------------------------------------------------- hash-consing


def test_structurally_equal_expressions_are_the_same_object():
    A = te.placeholder((4,), "float32", "A")
    k = te.reduce_axis(4, "k")
    assert (A[k] * 2) is (A[k] * 2)
    assert te.exp(A[k] + 1.0) is te.exp(A[k] + 1.0)
    assert te.sum(A[k] * A[k], axis=k) is te.sum(A[k] * A[k], axis=k)
    assert te.const(2.0, "float64") is te.const(2.0, "float64")
    assert te.if_then_else(A[k] > 0, A[k], 0.0) is te.if_then_else(A[k] > 0, A[k], 0.0)
    assert (A[k] * 2) is not (A[k] * 3)
    assert te.const(0.0, "float64") is not te.const(-0.0, "float64")
    assert te.const(1.0, "float32") is not te.const(1.0, "float64")


def test_hash_consing_inside_compute():
    A = te.placeholder((3, 4), "float64", "A")
    same = []

    def body(i, j):
        a, b = A[i, j] * 2, A[i, j] * 2
        same.append(a is b)
        return a + b

    te.compute((3, 4), body, name="C")
    assert same == [True]


def test_distinct_variables_and_placeholders_are_distinct():
    A1 = te.placeholder((4,), "float32", "A")
    A2 = te.placeholder((4,), "float32", "A")
    k1, k2 = te.reduce_axis(4, "k"), te.reduce_axis(4, "k")
    assert A1 is not A2
    assert A1[k1] is not A2[k1]
    assert A1[k1] is not A1[k2]
    assert A1[k1] is A1[k1]


# ---------------------------------------------------------------- tensors


def test_tensor_attributes():
    A = te.placeholder((3, 4), name="A")
    assert A.shape == (3, 4) and A.ndim == 2 and A.name == "A" and A.dtype == "float32"
    v = te.placeholder(5, "int64", name="v")
    assert v.shape == (5,) and v.ndim == 1 and v.dtype == "int64"
    B = te.placeholder((2, 3, 4), dtype=np.float64, name="B")
    assert B.dtype == "float64" and B.ndim == 3
    C = te.compute((3,), lambda i: A[i, 0] + A[i, 1], name="C")
    assert C.shape == (3,) and C.ndim == 1 and C.name == "C" and C.dtype == "float32"
    assert isinstance(C.shape, tuple) and all(type(s) is int for s in C.shape)
    M = te.compute((3, 4), lambda i, j: A[i, j] > 0.0, name="M")
    assert M.dtype == "bool"
    for dtype in te.DTYPES:
        assert te.placeholder((2,), dtype).dtype == dtype


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gradients_have_input_shape_and_dtype(dtype):
    A = te.placeholder((3, 4), dtype, "A")
    B = te.placeholder((4, 2), dtype, "B")
    k = te.reduce_axis(4, "k")
    C = te.compute((3, 2), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    dA, dB = te.gradient(C, [A, B])
    assert dA.shape == A.shape and dB.shape == B.shape
    assert dA.dtype == dtype and dB.dtype == dtype
    J = te.jacobian(C, A)
    assert J.shape == (3, 2, 3, 4) and J.dtype == dtype and J.ndim == 4


def test_fcompute_with_star_indices():
    A = te.placeholder((2, 3, 4), "float64", "A")
    B = te.compute((2, 3, 4), lambda *idx: A[idx] * 2.0, name="B")
    C = te.compute((2, 3, 4), lambda i, *rest: A[(i,) + rest] + i.astype("float64"), name="C")
    D = te.compute((4, 3, 2), lambda *idx: A[idx[::-1]], name="D")
    assert B.shape == (2, 3, 4) and D.shape == (4, 3, 2)
    av = np.random.default_rng(0).standard_normal((2, 3, 4))
    bv, cv, dv = run([A], [B, C, D], [av])
    np.testing.assert_array_equal(bv, av * 2)
    np.testing.assert_array_equal(cv, av + np.arange(2)[:, None, None])
    np.testing.assert_array_equal(dv, av.transpose(2, 1, 0))
    assert_close(run([A], te.gradient(D, [A]), [av])[0], np.ones_like(av))


def test_constant_and_index_valued_computes():
    iota = te.compute((3, 4), lambda i, j: (i * 4 + j).astype("float64"), name="iota")
    A = te.placeholder((3, 4), "float64", "A")
    out = te.compute((3, 4), lambda i, j: A[i, j] * iota[i, j], name="out")
    av = np.ones((3, 4))
    iv, ov = run([A], [iota, out], [av])
    np.testing.assert_array_equal(iv, np.arange(12.0).reshape(3, 4))
    np.testing.assert_array_equal(ov, np.arange(12.0).reshape(3, 4))


# ---------------------------------------------------------------- printing


def _matmul(n=3, m=4, p=2, dtype="float64"):
    A = te.placeholder((n, m), dtype, "A")
    B = te.placeholder((m, p), dtype, "B")
    k = te.reduce_axis((0, m), name="k")
    C = te.compute((n, p), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return A, B, C


def test_pretty_contains_the_formula():
    A, B, C = _matmul()
    text = te.pretty(C)
    assert isinstance(text, str)
    assert re.search(r"C\[i, *j\]", text), text
    assert re.search(r"A\[i, *k\]", text) and re.search(r"B\[k, *j\]", text), text
    assert "sum" in text and "*" in text, text
    T = te.compute((3, 2), lambda i, j: te.tanh(C[i, j]) + 1.0, name="T")
    text = te.pretty([T])
    assert "tanh" in text and re.search(r"C\[i, *j\]", text) and "T[" in text, text
    both = te.pretty([C, T])
    assert "A[" in both and "tanh" in both
    dA, = te.gradient(T, [A])
    text = te.pretty(dA)
    assert isinstance(text, str) and "B[" in text, text


def test_pretty_let_binds_shared_parts():
    A = te.placeholder((4,), "float64", "A")
    B = te.placeholder((4,), "float64", "B")

    def body(i):
        e = te.exp(A[i] * B[i] + 1.0)
        return e * e + e * B[i] - te.sin(e)

    C = te.compute((4,), body, name="C")
    text = te.pretty(C)
    assert text.count("exp(") == 1, text


def test_kernel_exposes_ir_text():
    A, B, C = _matmul()
    f = te.build([A, B], [C])
    assert isinstance(f.loop_ir, str) and f.loop_ir.strip()
    assert isinstance(f.llvm_ir, str) and f.llvm_ir.strip()
    av, bv = np.ones((3, 4)), np.ones((4, 2))
    assert_close(f(av, bv), av @ bv)


# ---------------------------------------------------------------- jacobian


@pytest.mark.parametrize("optimize", [True, False])
def test_jacobian_elementwise(optimize):
    X = te.placeholder((5,), "float64", "X")
    Y = te.compute((5,), lambda i: te.sin(X[i]) * X[i], name="Y")
    J = te.jacobian(Y, X, optimize=optimize)
    assert J.shape == (5, 5)
    xv = np.linspace(-1, 1, 5)
    jv, = run([X], [J], [xv])
    assert_close(jv, np.diag(np.cos(xv) * xv + np.sin(xv)))


@pytest.mark.parametrize("optimize", [True, False])
def test_jacobian_matmul(optimize):
    A, B, C = _matmul()
    J = te.jacobian(C, A, optimize=optimize)
    JB = te.jacobian(C, B, optimize=optimize)
    assert J.shape == (3, 2, 3, 4) and JB.shape == (3, 2, 4, 2)
    rng = np.random.default_rng(3)
    av, bv = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    jv, jbv = run([A, B], [J, JB], [av, bv])
    eye3, eye2 = np.eye(3), np.eye(2)
    assert_close(jv, np.einsum("ia,bj->ijab", eye3, bv))
    assert_close(jbv, np.einsum("ia,jb->ijab", av, eye2))


@pytest.mark.parametrize("optimize", [True, False])
def test_jacobian_strided_access(optimize):
    X = te.placeholder((9,), "float64", "X")
    Y = te.compute((4,), lambda i: X[2 * i + 1] * 3.0 + X[i] * X[i], name="Y")
    J = te.jacobian(Y, X, optimize=optimize)
    xv = np.arange(9.0) - 4
    jv, = run([X], [J], [xv])
    expected = np.zeros((4, 9))
    for i in range(4):
        expected[i, 2 * i + 1] += 3.0
        expected[i, i] += 2 * xv[i]
    assert_close(jv, expected)


def test_jacobian_through_a_nested_reduction():
    """Y[i] = log(sum_k exp(X[i, k])) reads X inside a reduction nested in log."""
    X = te.placeholder((3, 4), "float64", "X")
    k = te.reduce_axis(4, "k")
    Y = te.compute((3,), lambda i: te.log(te.sum(te.exp(X[i, k]), axis=k)), name="Y")
    J = te.jacobian(Y, X)
    xv = np.random.default_rng(4).standard_normal((3, 4))
    jv, = run([X], [J], [xv])
    sm = np.exp(xv) / np.exp(xv).sum(1, keepdims=True)
    expected = np.einsum("ia,ab->iab", np.eye(3), sm)
    assert_close(jv, expected)
