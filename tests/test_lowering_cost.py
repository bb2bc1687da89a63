"""te.cost: exact innermost iteration counts and temporary bytes of the lowered program."""
import time

import numpy as np

import te_autodiff as te
from te_autodiff.expr import const, reduce, var


def matmul(n, m, p):
    A, B = te.placeholder((n, m), name="A"), te.placeholder((m, p), name="B")
    k = te.reduce_axis(m, "k")
    return A, B, te.compute((n, p), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")


def test_matmul_counts_n_m_p():
    A, B, C = matmul(13, 7, 5)
    c = te.cost([A, B], [C])
    assert c["iterations"] == 13 * 7 * 5
    assert c["temp_bytes"] == 0 and c["stages"] == 1
    assert c["output_bytes"] == 13 * 5 * 4 and c["input_bytes"] == (13 * 7 + 7 * 5) * 4


def test_elementwise_counts_its_size():
    X = te.placeholder((6, 7, 8), name="X")
    Y = te.compute(X.shape, lambda a, b, c: te.exp(X[a, b, c]) * 2.0, name="Y")
    assert te.cost([X], [Y])["iterations"] == 6 * 7 * 8


def test_triangular_reduction_is_counted_exactly():
    n = 50
    X = te.placeholder((n, n), name="X")

    def body(i, j):
        k = var("k")
        return reduce("sum", X[i, k] * X[k, j], [k], [(const(0, "int64"), te.minimum(i, j) + 1)])

    T = te.compute((n, n), body, name="T")
    assert te.cost([X], [T])["iterations"] == sum(min(i, j) + 1 for i in range(n) for j in range(n))


def test_index_guards_are_exact_and_data_conditions_count_as_taken():
    n, m = 10, 6
    X = te.placeholder((n, m), name="X")
    k, r = te.reduce_axis(m, "k"), te.reduce_axis(m, "r")
    by_index = te.compute((n,), lambda i: te.if_then_else(i < 3, te.sum(X[i, k], axis=k), 0.0), name="a")
    by_data = te.compute((n,), lambda i: te.if_then_else(X[i, 0] > 0.0, te.sum(X[i, r], axis=r), 0.0),
                         name="b")
    assert te.cost([X], [by_index])["iterations"] == 3 * m
    assert te.cost([X], [by_data])["iterations"] == n * m


def test_temp_bytes_of_a_materialised_intermediate():
    X = te.placeholder((8, 9), "float64", "X")
    k = te.reduce_axis(9, "k")
    s = te.compute((8,), lambda i: te.sum(X[i, k], axis=k), name="s")
    Y = te.compute((8, 9), lambda i, j: X[i, j] - s[i], name="Y")
    c = te.cost([X], [Y])
    assert c["temp_bytes"] == 8 * 8
    assert c["stages"] == 2
    assert c["iterations"] == 8 * 9 + 8 * 9


def test_large_counts_are_fast():
    A, B, C = matmul(1000, 1000, 1000)
    start = time.perf_counter()
    assert te.cost([A, B], [C])["iterations"] == 10 ** 9
    assert time.perf_counter() - start < 5


def test_cost_agrees_with_a_counting_reference_on_a_window():
    n = 12
    X = te.placeholder((n,), "float64", "X")

    def body(i):
        k = var("k")
        lo = te.maximum(i - 3, 0)
        return reduce("max", X[k], [k], [(lo, te.minimum(i + 2, n) - lo)])

    out = te.compute((n,), body, name="out")
    assert te.cost([X], [out])["iterations"] == sum(min(i + 2, n) - max(i - 3, 0) for i in range(n))
    x = np.random.default_rng(0).standard_normal(n)
    np.testing.assert_array_equal(te.build([X], [out])(x),
                                  [x[max(i - 3, 0):min(i + 2, n)].max() for i in range(n)])
