"""A kernel call's fast path (``lowering/native_call.py``: the checks, buffer
table and run in one native step) behaves like the checked Python path:
the same results and the same errors naming the placeholder on every call,
not only the first; inputs that are not contiguous, read-only or subclasses
still work; several Python threads and a forked process can call one
kernel; torch ops trust the inputs their forward checked, not the heads.
And importing te_autodiff imports none of what only some builds need."""
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

import te_autodiff as te


def _kernel():
    """Two outputs, an integer input read as an index (a check in the kernel), a temporary."""
    X = te.placeholder((4, 3), name="X")
    I = te.placeholder((5,), "int32", name="I")
    k = te.reduce_axis(3, "k")
    S = te.compute((4,), lambda i: te.sum(X[i, k] * X[i, k], axis=k), name="S")
    G = te.compute((5,), lambda j: X[I[j], 0] * S[I[j]], name="G")
    return te.build([X, I], [S, G]), [X, I]


def _want(x, idx):
    s = (x.astype("f8") ** 2).sum(1)
    return s, x[idx, 0] * s[idx]


X0 = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
I0 = np.array([0, 1, 2, 3, 1], np.int32)


def test_results_and_aligned_outputs_on_every_call():
    f, _ = _kernel()
    for _ in range(3):                              # the first call makes the fast path
        s, g = f(X0, I0)
        for got, want in zip((s, g), _want(X0, I0)):
            np.testing.assert_allclose(got, want, rtol=1e-6)
        assert s.ctypes.data % f.target.alignment == 0 and g.ctypes.data % f.target.alignment == 0
        assert s.base is not g.base and s.flags.writeable and s.flags.c_contiguous


@pytest.mark.parametrize("args, error, text", [
    ((X0.astype(np.float64), I0), TypeError, "placeholder 'X' has dtype float32"),
    ((X0.T.copy(), I0), ValueError, "placeholder 'X' has shape (4, 3)"),
    ((X0, I0[:4]), ValueError, "placeholder 'I' has shape (5,)"),
    ((X0.tolist(), I0), TypeError, "placeholder 'X' needs a numpy.ndarray"),
    ((np.ma.masked_array(X0), I0), TypeError, "masked array"),
    ((X0,), TypeError, "takes 2 array(s)"),
    ((X0, I0, I0), TypeError, "takes 2 array(s)"),
    ((X0, np.array([0, 1, 9, 3, 1], np.int32)), IndexError, "index 9 is out of bounds for dimension 0 of tensor"),
])
def test_the_same_errors_on_every_call(args, error, text):
    f, _ = _kernel()
    for _ in range(3):
        with pytest.raises(error, match=re.escape(text)):
            f(*args)
        f(X0, I0)                                   # and the kernel still works between them


def test_inputs_the_fast_path_leaves_to_python():
    f, _ = _kernel()
    want = _want(X0, I0)
    f(X0, I0)
    readonly = X0.copy()
    readonly.flags.writeable = False

    class Sub(np.ndarray):
        pass
    swapped = X0.astype(X0.dtype.newbyteorder())    # equal values, another dtype object
    for x in (np.asfortranarray(X0), X0[:, ::-1][:, ::-1], readonly, X0.view(Sub), swapped.astype(np.float32),
              np.concatenate([X0, X0])[::2]):
        for got, w in zip(f(x, I0), _want(np.ascontiguousarray(x), I0)):
            np.testing.assert_allclose(got, w, rtol=1e-6)
    for got, w in zip(f(X0, I0), want):
        np.testing.assert_allclose(got, w, rtol=1e-6)


def test_a_result_returned_twice_and_an_input_returned():
    X = te.placeholder((6,), name="X")
    Y = te.compute((6,), lambda i: X[i] + 1.0, name="Y")
    f = te.build([X], [Y, Y, X])
    x = np.arange(6, dtype=np.float32)
    for _ in range(2):
        a, b, c = f(x)
        np.testing.assert_array_equal(a, x + 1)
        np.testing.assert_array_equal(b, x + 1)
        np.testing.assert_array_equal(c, x)
        assert a is not b and not np.shares_memory(a, b) and not np.shares_memory(c, x)


def _aligned_empty(shape, dtype, align):
    """An uninitialised array whose data starts on an ``align``-byte boundary (``call_at``'s outputs)."""
    raw = np.empty(int(np.prod(shape)) * dtype.itemsize + align, np.uint8)
    return np.ndarray(shape, dtype, raw, -raw.ctypes.data % align)


def test_call_at_runs_on_the_callers_memory():
    f, _ = _kernel()
    outs = [_aligned_empty(shape, dtype, f.target.alignment) for shape, dtype in f.output_layout]
    for _ in range(2):
        f.call_at([X0.ctypes.data, I0.ctypes.data] + [o.ctypes.data for o in outs])
        for got, want in zip(outs, _want(X0, I0)):
            np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("serial", [False, True])
def test_a_large_output_lives_in_the_memory_of_one_let_go(rng, monkeypatch, serial):
    """An output of ``output_memory.REUSE_MIN_BYTES`` or more lives in the
    block an earlier output of its size left once nothing references it: a
    view of it keeps the block, so while it is held each call writes other
    memory; the values are right either way.  Both call paths: split stages
    (Python) and, with every stage on the calling thread, the native one."""
    from lowering import output_memory, runtime
    if serial:
        monkeypatch.setattr(runtime, "SERIAL_KERNEL_US", float("inf"))
    n = output_memory.REUSE_MIN_BYTES // 4
    x = te.placeholder((n,), "float32", "x")
    f = te.build([x], [te.compute((n,), lambda i: x[i] * 2.0 + 1.0, name="y")])
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    f(b)
    first = f(a)
    view, at = first[5:], first.ctypes.data
    del first
    held = f(b)                                   # the view holds the first block
    assert held.ctypes.data != at
    np.testing.assert_array_equal(view, a[5:] * np.float32(2) + np.float32(1))
    del view
    again = f(b)                                  # now it is free again
    assert again.ctypes.data == at
    for out in (held, again):
        np.testing.assert_array_equal(out, b * np.float32(2) + np.float32(1))


@pytest.mark.skipif(sys.platform != "linux", reason="counts the page faults Linux reports")
def test_outputs_let_go_are_not_faulted_in_again(rng):
    """Two outputs of 2 MiB freed together leave more free memory at the top
    of glibc's heap than it keeps (twice its mmap threshold, which follows
    the largest block freed), so fresh blocks would be mapped and zeroed
    page by page on every call: the blocks let go are lent again instead,
    and twenty calls fault in less than one output's pages."""
    import resource
    n = 512
    A, B = te.placeholder((n, n), "float64", "A"), te.placeholder((n, n), "float64", "B")
    f = te.build([A, B], [te.compute((n, n), lambda i, j: A[i, j] + B[i, j], name="S"),
                          te.compute((n, n), lambda i, j: A[i, j] * B[i, j], name="P")])
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    for _ in range(3):
        f(a, b)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        s, p = f(a, b)
        del s, p
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < n * n * 8 // resource.getpagesize(), faults
    s, p = f(a, b)
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(p, a * b)


def test_output_blocks_kept_stay_within_their_budget():
    """Blocks given back beyond the budget are freed, not kept; kept ones
    are lent again, by size."""
    from lowering.output_memory import _Blocks
    blocks = _Blocks(keep_bytes=2 * 1000)
    lent = [blocks.lend(1000) for _ in range(3)] + [blocks.lend(500)]
    addresses = {x.ctypes.data for x in lent[:3]}
    while lent:
        lent.pop(0)                               # in turn: two of 1000 fill the budget
    assert blocks.kept == 2000 and sorted(blocks.free) == [1000] and len(blocks.free[1000]) == 2
    again = [blocks.lend(1000) for _ in range(3)]
    assert len({x.ctypes.data for x in again[:2]} & addresses) == 2 and blocks.kept == 0
    assert all(x.flags.writeable and x.nbytes == 1000 for x in again)


def test_threads_calling_one_small_kernel():
    """The fast path's table is one per kernel: a thread that finds it
    taken runs the kernel through its own thread's table."""
    f, _ = _kernel()
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(8)]
    wants = [_want(x, I0) for x in xs]
    errors = []

    def call(n):
        try:
            for _ in range(2000):
                for got, want in zip(f(xs[n], I0), wants[n]):
                    np.testing.assert_allclose(got, want, rtol=1e-5)
        except Exception as e:          # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=call, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:1]


_FORK = """
import os, sys, threading
import numpy as np
import te_autodiff as te
X = te.placeholder((16,), name="X")
f = te.build([X], [te.compute((16,), lambda i: X[i] * X[i] + 1.0, name="Y")])
x = np.arange(16, dtype=np.float32)
f(x); f(x)
stop = False
def spin():                             # another thread inside the kernel at the fork
    while not stop:
        f(x)
t = threading.Thread(target=spin)
t.start()
pids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        ok = all(np.array_equal(f(x), x * x + 1) for _ in range(100))
        os._exit(0 if ok else 1)
    pids.append(pid)
codes = [os.waitpid(p, 0)[1] for p in pids]
stop = True
t.join()
print("ok" if codes == [0] * 4 and np.array_equal(f(x), x * x + 1) else f"failed {codes}")
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_process_calls_the_parents_small_kernel():
    done = subprocess.run([sys.executable, "-c", _FORK], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stdout + done.stderr[-3000:]


def test_imports_and_a_build_without_solver_queries_import_no_solver():
    """OR-tools (its CP-SAT module imports pandas) is imported by the
    questions that need a solver, and te-autodiff never imports sympy: an
    import, or a build that asks no such question, pays for neither."""
    code = ("import sys\n"
            "import te_autodiff as te, lowering, arith\n"
            "X = te.placeholder((64,), name='X')\n"
            "f = te.build([X], [te.compute((64,), lambda i: te.exp(X[i]) * 2.0, name='Y')])\n"
            "print(sorted(m for m in ('sympy', 'ortools', 'pandas') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]


def test_torch_op_heads_are_checked_and_saved_inputs_trusted():
    torch = pytest.importorskip("torch")
    import te_autodiff.torch as tet
    X = te.placeholder((3, 4), "float64", name="X")
    Y = te.compute((3, 4), lambda i, j: te.sin(X[i, j]) * X[i, j], name="Y")
    f = tet.op([X], Y)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    want = torch.cos(x.detach()) * x.detach() + torch.sin(x.detach())
    (g,) = torch.autograd.grad(f(x).sum(), (x,))               # the head: an expanded (stride 0) tensor
    torch.testing.assert_close(g, want)
    xt = torch.randn(4, 3, dtype=torch.float64).t().requires_grad_()     # not contiguous
    (g,) = torch.autograd.grad(f(xt), (xt,), grad_outputs=torch.ones(4, 3, dtype=torch.float64).t())
    torch.testing.assert_close(g, torch.cos(xt.detach()) * xt.detach() + torch.sin(xt.detach()))

    def pack(t):
        return t.t().contiguous().t()           # unpacked with the other layout
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = f(x)
    (g,) = torch.autograd.grad(y, (x,), grad_outputs=torch.ones(3, 4, dtype=torch.float64))
    torch.testing.assert_close(g, want)
    assert torch.autograd.gradcheck(f, (x,))
