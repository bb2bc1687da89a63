"""te.build end to end: whole programs against numpy, argument checking, determinism, threads."""
import numpy as np
import pytest

import te_autodiff as te
from lowering import Kernel, runtime

pytestmark = pytest.mark.aarch64          # all of it runs in .ci/aarch64 (emulated AArch64)


def matmul(n, m, p, dtype="float32"):
    A, B = te.placeholder((n, m), dtype, "A"), te.placeholder((m, p), dtype, "B")
    k = te.reduce_axis(m, "k")
    return A, B, te.compute((n, p), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")


def test_matmul():
    A, B, C = matmul(33, 17, 29)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((33, 17)).astype("float32"), rng.standard_normal((17, 29)).astype("float32")
    np.testing.assert_allclose(te.build([A, B], [C])(a, b), a @ b, rtol=1e-5, atol=1e-5)


def np_conv2d(x, w, pad):
    n, c, h, wd = x.shape
    f, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    out = np.zeros((n, f, oh, ow))
    for a in range(kh):
        for b in range(kw):
            out += np.einsum("ncij,fc->nfij", xp[:, :, a:a + oh, b:b + ow], w[:, :, a, b])
    return out


@pytest.mark.parametrize("inline", [False, True])
def test_conv2d_with_padding_via_if_then_else(inline):
    N, C, H, W, F, K, P = 2, 3, 7, 6, 4, 3, 1
    X, Wt = te.placeholder((N, C, H, W), "float64", "X"), te.placeholder((F, C, K, K), "float64", "Wt")
    c, kh, kw = te.reduce_axis(C, "c"), te.reduce_axis(K, "kh"), te.reduce_axis(K, "kw")
    if inline:
        def body(n, f, y, x):
            h, w = y + kh - P, x + kw - P
            v = te.if_then_else(te.all(h >= 0, h < H, w >= 0, w < W), X[n, c, h, w], 0.0)
            return te.sum(v * Wt[f, c, kh, kw], axis=[c, kh, kw])
    else:
        Xp = te.compute((N, C, H + 2 * P, W + 2 * P), lambda n, ch, h, w: te.if_then_else(
            te.all(h >= P, h < H + P, w >= P, w < W + P), X[n, ch, h - P, w - P], 0.0), name="Xp")

        def body(n, f, y, x):
            return te.sum(Xp[n, c, y + kh, x + kw] * Wt[f, c, kh, kw], axis=[c, kh, kw])
    out = te.compute((N, F, H, W), body, name="conv")
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((N, C, H, W)), rng.standard_normal((F, C, K, K))
    np.testing.assert_allclose(te.build([X, Wt], [out])(x, w), np_conv2d(x, w, P), rtol=1e-12, atol=1e-12)


def test_multiple_outputs_shared_intermediate_and_placeholder_outputs():
    X = te.placeholder((4, 5), "float64", "X")
    k = te.reduce_axis(5, "k")
    s = te.compute((4,), lambda i: te.sum(X[i, k], axis=k), name="s")
    y = te.compute((4, 5), lambda i, j: X[i, j] / s[i], name="y")
    x = np.random.default_rng(2).uniform(1, 2, (4, 5))
    y1, y2, xs, s1 = te.build([X], [y, y, X, s])(x)
    np.testing.assert_allclose(y1, x / x.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(y1, y2)
    assert y1 is not y2 and not np.shares_memory(y1, y2)
    np.testing.assert_array_equal(xs, x)
    assert not np.shares_memory(xs, x)
    np.testing.assert_allclose(s1, x.sum(axis=1))


def test_single_output_returns_an_array_and_inputs_may_be_views():
    X = te.placeholder((3, 4), "float32", "X")
    Y = te.compute((3, 4), lambda i, j: X[i, j] + 1.0, name="Y")
    kernel = te.build([X], Y)
    x = np.arange(48, dtype="float32").reshape(6, 8)[::2, 1::2]          # a strided view
    assert not x.flags.c_contiguous
    out = kernel(x)
    assert isinstance(out, np.ndarray) and out.ctypes.data % 64 == 0
    np.testing.assert_array_equal(out, x + 1)


def test_argument_errors_name_the_placeholder():
    A, B, C = matmul(4, 3, 2)
    kernel = te.build([A, B], [C])
    a, b = np.ones((4, 3), "float32"), np.ones((3, 2), "float32")
    with pytest.raises(TypeError, match=r"2 array\(s\) \('A', 'B'\), got 1"):
        kernel(a)
    with pytest.raises(TypeError, match="'B'.*ndarray.*list"):
        kernel(a, [[1.0, 2.0]] * 3)
    with pytest.raises(TypeError, match="'A'.*float32.*float64"):
        kernel(a.astype("float64"), b)
    with pytest.raises(ValueError, match=r"'B'.*\(3, 2\).*\(2, 3\)"):
        kernel(a, np.ones((2, 3), "float32"))


def test_build_argument_errors():
    A, B, C = matmul(4, 3, 2)
    with pytest.raises(TypeError, match="'C' is a compute tensor"):
        te.build([A, C], [C])
    with pytest.raises(ValueError, match="placeholder 'B'.*not among the inputs"):
        te.build([A], [C])
    with pytest.raises(TypeError, match="must be tensors"):
        te.build([A, B], [np.ones(3)])


def test_same_program_built_twice_is_compiled_once_and_bit_identical():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((40, 50)).astype("float32"), rng.standard_normal((50, 30)).astype("float32")
    A1, B1, C1 = matmul(40, 50, 30)
    A2, B2, C2 = matmul(40, 50, 30)
    k1, k2 = te.build([A1, B1], [C1]), te.build([A2, B2], [C2])
    assert k1._compiled is k2._compiled
    assert k1.loop_ir == k2.loop_ir
    np.testing.assert_array_equal(k1(a, b), k2(a, b))
    np.testing.assert_array_equal(k1(a, b), k1(a, b))


def test_thread_count_does_not_change_results(monkeypatch):
    monkeypatch.setattr(runtime, "SERIAL_KERNEL_US", 0)        # split stages however small the kernel
    n = 300
    X = te.placeholder((n, n), "float32", "X")
    k = te.reduce_axis(n, "k")
    rows = te.compute((n,), lambda i: te.sum(te.exp(X[i, k]) * X[k, i], axis=k), name="rows")
    flat = te.compute((n * n,), lambda q: te.tanh(X[q // n, q % n]) * 3.0, name="flat")
    kernel = te.build([X], [rows, flat])
    x = np.random.default_rng(4).standard_normal((n, n)).astype("float32")
    before = runtime.num_threads()
    try:
        runtime.set_num_threads(1)
        serial = kernel(x)
        runtime.set_num_threads(3)
        parallel = kernel(x)
    finally:
        runtime.set_num_threads(before)
    for s, p in zip(serial, parallel):
        np.testing.assert_array_equal(s, p)
    np.testing.assert_allclose(serial[1], np.tanh(x).reshape(-1) * 3, rtol=1e-6)


def test_kernels_linked_with_jitlink_run(monkeypatch):
    """A target whose ``jit_link`` is set (AArch64: RuntimeDyld can map a
    kernel's constants and GOT out of ``adrp``'s reach) links its kernels with
    JITLink: libm, libgomp's ``GOMP_parallel`` (stages split over threads) and
    the exported stages resolve, results match numpy and the single-thread run
    bit for bit.  Forced on this machine's target, so every machine checks it."""
    from lowering.target import Target

    assert te.target("aarch64-unknown-linux-gnu:neoverse-n1").jit_link
    assert not te.target("haswell").jit_link
    made = []
    create = runtime.llvm.create_lljit_compiler

    def recording(tm, **kw):
        made.append(kw)
        return create(tm, **kw)
    monkeypatch.setattr(Target, "jit_link", property(lambda self: True))
    monkeypatch.setattr(runtime.llvm, "create_lljit_compiler", recording)
    monkeypatch.setattr(runtime, "_jits", {})
    monkeypatch.setattr(runtime, "_cache", type(runtime._cache)())
    monkeypatch.setattr(runtime, "SERIAL_KERNEL_US", 0)        # split stages however small the kernel
    n = 257
    X = te.placeholder((n, n), "float32", "X")
    k = te.reduce_axis(n, "k")
    rows = te.compute((n,), lambda i: te.sum(te.exp(X[i, k]) * X[k, i], axis=k), name="rows")
    flat = te.compute((n * n,), lambda q: te.tanh(X[q // n, q % n]) * 3.0 + te.log(1.0 + X[q // n, q % n] ** 2),
                      name="flat")
    kernel = te.build([X], [rows, flat])
    assert made and all(kw.get("use_jit_link") for kw in made)
    assert kernel._compiled.openmp == runtime._openmp                # libgomp's team, where it is installed
    x = np.random.default_rng(5).standard_normal((n, n)).astype("float32")
    before = runtime.num_threads()
    try:
        runtime.set_num_threads(1)
        serial = kernel(x)
        runtime.set_num_threads(2)
        parallel = kernel(x)
    finally:
        runtime.set_num_threads(before)
    for s, p in zip(serial, parallel):
        np.testing.assert_array_equal(s, p)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(serial[0], (np.exp(x64) * x64.T).sum(1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(serial[1], (np.tanh(x64) * 3 + np.log1p(x64 ** 2)).reshape(-1), rtol=1e-5, atol=1e-5)


def test_kernel_attributes():
    A, B, C = matmul(8, 4, 2)
    kernel = te.build([A, B], [C], name="mm")
    assert isinstance(kernel, Kernel) and kernel.name == "mm"
    assert kernel.inputs == [A, B] and kernel.outputs == [C]
    assert "parallel for i in 0..8" in kernel.loop_ir and "for k in 0..4" in kernel.loop_ir
    assert "define void @stage0" in kernel.llvm_ir


def test_inlining_and_temporaries():
    X = te.placeholder((6, 7), "float64", "X")
    k = te.reduce_axis(7, "k")
    cheap = te.compute((6, 7), lambda i, j: X[i, j] * 2.0, name="cheap")
    costly = te.compute((6, 7), lambda i, j: te.exp(X[i, j]), name="costly")
    once = te.compute((6, 7), lambda i, j: te.log1p(X[i, j] * X[i, j]), name="once")
    total = te.compute((6,), lambda i: te.sum(costly[i, k], axis=k), name="total")
    out = te.compute((6, 7), lambda i, j: cheap[i, j] + cheap[i, (j + 1) % 7] + costly[i, j] * total[i]
                     + once[i, j], name="out")
    kernel = te.build([X], [out])
    text = kernel.loop_ir
    assert "stage costly" in text and "stage total" in text
    assert "stage cheap" not in text and "stage once" not in text
    x = np.random.default_rng(5).standard_normal((6, 7))
    e = np.exp(x)
    expected = 2 * x + 2 * np.roll(x, -1, axis=1) + e * e.sum(axis=1, keepdims=True) + np.log1p(x * x)
    np.testing.assert_allclose(kernel(x), expected, rtol=1e-12)
    assert te.cost([X], [out])["temp_bytes"] == (6 * 7 + 6) * 8
