"""Kernels in the processes and threads users run them in: a process forked
after kernels ran (multiprocessing, data-loader workers), a spawned one, and
several Python threads calling and building kernels at once.  Each process
test runs in a child with a timeout, so a hang fails instead of stalling."""
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import te_autodiff as te

_WORKERS = textwrap.dedent("""
    import multiprocessing as mp, sys
    import numpy as np
    import te_autodiff as te

    def program(n):
        X = te.placeholder((n, 256), name="X")
        k = te.reduce_axis(256, "k")
        Y = te.compute((n, 256), lambda i, j: te.exp(X[i, j]) * 2.0 + te.sum(X[i, k], axis=k), name="Y")
        return te.build([X], [Y])

    def ref(x):
        return np.exp(x.astype("f8")) * 2 + x.astype("f8").sum(1, keepdims=True)

    f = program(4096)               # large enough that its stages run on every thread
    x = np.random.default_rng(0).random((4096, 256)).astype("f4")
    before = f(x)

    def work(n):
        g = program(100 + n)        # built in the worker
        y = x[:100 + n]
        new = float(np.abs(g(y) - ref(y)).max() / np.abs(ref(y)).max())
        return bool(np.array_equal(f(x), before)), new     # and one built before the fork

    if __name__ == "__main__":
        with mp.get_context(sys.argv[1]).Pool(2) as pool:
            results = pool.map(work, range(4), chunksize=1)
        assert all(same for same, _ in results), results
        assert all(err < 1e-5 for _, err in results), results
        assert np.array_equal(f(x), before)                 # the parent is unaffected
        print("ok", results)
""")


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.aarch64
def test_kernels_in_worker_processes(method, tmp_path):
    """Workers run the parent's kernels and build their own; with ``fork``
    they start after the parent's threads ran (libgomp's team would hang)."""
    script = tmp_path / "workers.py"
    script.write_text(_WORKERS)
    done = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-3000:]


def _program(n):
    X = te.placeholder((n, 64), dtype="float64", name="X")
    k = te.reduce_axis(64, "k")
    Y = te.compute((n, 64), lambda i, j: te.tanh(X[i, j]) * te.sum(X[i, k] * X[i, k], axis=k), name="Y")
    (dX,) = te.gradient(Y, [X])
    return X, Y, dX


@pytest.mark.aarch64
def test_threads_calling_one_kernel():
    X, Y, dX = _program(2048)
    f = te.build([X], [Y, dX])
    x = np.random.default_rng(1).standard_normal((2048, 64))
    want = f(x)
    got, errors = [], []

    def call():
        try:
            for _ in range(50):
                got.append(f(x))
        except Exception as e:          # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(got) == 200
    assert all(np.array_equal(a, want[0]) and np.array_equal(b, want[1]) for a, b in got)


@pytest.mark.aarch64
def test_threads_building_kernels():
    results, errors = {}, []

    def build(n):
        try:
            X, Y, dX = _program(n)
            x = np.random.default_rng(n).standard_normal((n, 64))
            y, dx = te.build([X], [Y, dX])(x)
            s = (x * x).sum(1, keepdims=True)
            results[n] = (np.abs(y - np.tanh(x) * s).max(),
                          np.abs(dx - ((1 - np.tanh(x) ** 2) * s + 2 * x * np.tanh(x).sum(1, keepdims=True))).max())
        except Exception as e:          # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=build, args=(n,)) for n in (33, 34, 35, 36)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and len(results) == 4
    assert all(a < 1e-9 and b < 1e-9 for a, b in results.values()), results


def test_tensors_and_kernels_are_freed_when_dropped():
    """Nothing te-autodiff keeps (lifted forms, shared tensors, the compile
    cache) holds a user's tensors or kernels alive."""
    import gc
    import weakref
    X, Y, dX = _program(40)
    f = te.build([X], [Y, dX])
    f(np.ones((40, 64)))
    refs = [weakref.ref(x) for x in (X, Y, dX, f)]
    del X, Y, dX, f
    gc.collect()
    assert all(r() is None for r in refs)


_MEMORY = textwrap.dedent("""
    import ctypes, gc, os
    import numpy as np
    import te_autodiff as te

    def rss_mb():
        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)     # return freed heap pages, as a long run would reuse them
        except (OSError, AttributeError):
            pass
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def kernel(n):                      # the issue's probe: exp(X[i]) * c, a new program for every n
        X = te.placeholder((n,), name="X")
        f = te.build([X], [te.compute((n,), lambda i: te.exp(X[i]) * 3.0, name="Y")])
        assert np.allclose(f(np.ones(n, "float32")), 3 * np.e)
        return f

    for n in range(8, 108):
        kernel(n)
    first = rss_mb()
    alive = [kernel(n) for n in range(108, 208)]
    per_kernel = (rss_mb() - first) / len(alive)
    del alive
    for n in range(208, 1108):
        kernel(n)
    print(f"{per_kernel:.4f} {rss_mb() - first:.2f}")
""")


@pytest.mark.memory
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_memory_is_bounded_over_a_thousand_kernels(tmp_path):
    """After the first 100 kernels, 1,000 more distinct ones (100 of them held
    alive at once, then dropped) add at most 30 MB to the process, and a live
    small kernel costs well under 1 MB (measured in a child process)."""
    script = tmp_path / "memory.py"
    script.write_text(_MEMORY)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    per_kernel, growth = (float(v) for v in done.stdout.split())
    assert per_kernel < 0.25, f"a live small kernel costs {per_kernel:.3f} MB"
    assert growth <= 30, f"1000 kernels after the first 100 added {growth:.1f} MB"


def _kernel(n):
    X = te.placeholder((n,), name="X")
    return te.build([X], [te.compute((n,), lambda i: X[i] * 2.0 + 1.0, name="Y")])


def test_an_llvm_crash_is_an_exception_and_the_next_build_works(monkeypatch):
    """LLVM runs in a child process (``lowering/llvm_process.py``): when it
    dies (here: killed, as an LLVM assertion would abort it) the build raises
    RuntimeError naming the kernel, and the next build starts a new child;
    a child is also replaced after ``RESTART_AFTER`` requests."""
    import os
    import signal

    from lowering import llvm_process
    if llvm_process._in_process:
        pytest.skip("TE_LLVM_PROCESS=0: LLVM runs in this process")
    monkeypatch.setattr(llvm_process, "RESTART_AFTER", 10 ** 9)     # the suite's earlier builds count too
    _kernel(1001)
    first = llvm_process._workers[0].child.process
    os.kill(first.pid, signal.SIGABRT)
    first.wait(timeout=30)
    with pytest.raises(RuntimeError, match=r"LLVM crashed while compiling kernel 'Y'.*exit status -6"):
        _kernel(1002)
    assert np.array_equal(_kernel(1003)(np.ones(1003, "float32")), np.full(1003, 3, "float32"))
    second = llvm_process._workers[0].child.process
    assert second.pid != first.pid
    monkeypatch.setattr(llvm_process, "RESTART_AFTER", llvm_process._workers[0].child.served + 1)
    _kernel(1004)
    assert llvm_process._workers[0].child is None and second.wait(timeout=30) == 0     # replaced on the next build
    _kernel(1005)
    assert llvm_process._workers[0].child.process.pid not in (first.pid, second.pid)


def _split_program():
    """A program of several stage groups (an unrolled recurrence and its gradient)."""
    from tests.test_share import unrolled_rnn
    ins, loss = unrolled_rnn(3, 4, 8, 5)
    return ins, [loss, *te.gradient(loss, ins[:3])]


def _in_parts(monkeypatch, workers: int):
    """Compile every program as ``workers`` modules at once in fresh LLVM processes."""
    from collections import OrderedDict

    from lowering import codegen_llvm, llvm_process, runtime
    if llvm_process._in_process:
        pytest.skip("TE_LLVM_PROCESS=0: LLVM runs in this process")
    monkeypatch.setattr(codegen_llvm.modules, "PART_TEXT", 1)
    monkeypatch.setattr(llvm_process, "_workers", [llvm_process._Worker() for _ in range(workers)])
    monkeypatch.setattr(runtime, "_cache", OrderedDict())


@pytest.mark.aarch64
def test_a_program_compiled_in_parts_computes_what_one_module_does(monkeypatch):
    """A large program is compiled as one LLVM module per LLVM process, all at
    once (``codegen_llvm.modules.partition``, ``llvm_process.run_all``): the first
    module's ``run_stages`` calls the stages the others define, and the
    results are bit for bit those of the program compiled as one module."""
    from collections import OrderedDict

    from lowering import codegen_llvm, runtime
    ins, outs = _split_program()
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(t.shape).astype("float32") for t in ins]
    monkeypatch.setattr(codegen_llvm.modules, "PART_TEXT", 10 ** 9)
    monkeypatch.setattr(runtime, "_cache", OrderedDict())
    whole = te.build(ins, outs)
    _in_parts(monkeypatch, 3)
    split = te.build(ins, outs)
    assert len(whole._compiled.parts) == 1 and len(split._compiled.parts) == 3
    for n in range(len(split.program.stages)):
        assert f"define void @stage{n}(" in split.llvm_ir
    for a, b in zip(whole(*arrays), split(*arrays)):
        assert np.array_equal(a, b)


def test_an_llvm_crash_in_one_part_is_an_exception(monkeypatch):
    """When the LLVM process compiling one part of a program dies, the build
    raises RuntimeError naming the kernel once the other parts are done, and
    the next build starts a new process for that part."""
    import os
    import signal

    from lowering import llvm_process
    ins, outs = _split_program()
    _in_parts(monkeypatch, 2)
    te.build(ins, outs)
    second = llvm_process._workers[1].child.process
    os.kill(second.pid, signal.SIGKILL)
    second.wait(timeout=30)
    X = te.placeholder((5, 7), name="X")
    bigger = [te.compute((5, 7), lambda i, j, k=k: X[i, j] * float(k), name=f"Y{k}") for k in range(4)]
    with pytest.raises(RuntimeError, match=r"LLVM crashed while compiling kernel 'Y0'.*exit status -9"):
        te.build([X], bigger)
    x = np.arange(35, dtype="float32").reshape(5, 7)
    for k, y in enumerate(te.build([X], bigger)(x)):
        assert np.array_equal(y, x * k)
    assert llvm_process._workers[1].child.process.pid != second.pid


def _stop_llvm_child():
    """Freeze the running LLVM child (SIGSTOP): to its parent, a pass that never ends."""
    import os
    import signal

    from lowering import llvm_process
    if llvm_process._in_process:
        pytest.skip("TE_LLVM_PROCESS=0: LLVM runs in this process")
    if llvm_process._workers[0].child is None:
        _kernel(997)
    child = llvm_process._workers[0].child.process
    os.kill(child.pid, signal.SIGSTOP)
    return child


def test_an_llvm_that_never_answers_is_stopped(monkeypatch):
    """A request gets ``TE_LLVM_TIMEOUT`` seconds: then the child is killed,
    the build raises RuntimeError naming the kernel, and the next build works."""
    monkeypatch.setenv("TE_LLVM_TIMEOUT", "2")
    child = _stop_llvm_child()
    with pytest.raises(RuntimeError, match=r"LLVM did not finish compiling kernel 'Y' .* within 2 s"):
        _kernel(1011)
    assert child.wait(timeout=30) != 0
    assert np.array_equal(_kernel(1012)(np.ones(1012, "float32")), np.full(1012, 3, "float32"))


def test_a_slow_optimisation_is_done_again_without_slp(monkeypatch, caplog):
    """An optimisation over its budget (``slp_budget``, here 1 s) is stopped
    and done again, without the SLP vectoriser, in a new child: the build
    succeeds with a warning.  (tests/test_fuzz.py has a program on which
    LLVM 22.1 looped before VectorCombine was switched off.)"""
    from lowering import llvm_process
    monkeypatch.setattr(llvm_process, "SLP_SECONDS", 1.0)
    monkeypatch.setattr(llvm_process, "SLP_SECONDS_PER_KB", 0.0)
    child = _stop_llvm_child()
    with caplog.at_level("WARNING", logger="te_autodiff.llvm"):
        k = _kernel(1013)
    assert "optimising it again without the SLP vectoriser" in caplog.text
    assert child.wait(timeout=30) != 0
    assert np.array_equal(k(np.ones(1013, "float32")), np.full(1013, 3, "float32"))


_ORPHAN = textwrap.dedent("""
    import te_autodiff as te
    from lowering import llvm_process
    # a module LLVM's optimiser needs about a minute for (12,000 small loops,
    # ~5 ms each): the child is busy with it when this process dies
    loop = '''define void @f{k}(ptr noalias %p, ptr noalias %q, i64 %n) {{
    entry:
      br label %loop
    loop:
      %i = phi i64 [0, %entry], [%i1, %loop]
      %a = getelementptr double, ptr %p, i64 %i
      %x = load double, ptr %a
      %y = fmul double %x, {k}.0
      %b = getelementptr double, ptr %q, i64 %i
      store double %y, ptr %b
      %i1 = add i64 %i, 1
      %c = icmp slt i64 %i1, %n
      br i1 %c, label %loop, label %exit
    exit:
      ret void
    }}'''
    ir = "".join(loop.format(k=k) for k in range(12000))
    X = te.placeholder((7,), name="X")
    te.build([X], [te.compute((7,), lambda i: X[i] + 1.0, name="Y")])
    print(llvm_process._workers[0].child.process.pid, flush=True)
    target = te.target()
    llvm_process.run("optimise", ir, target.llvm_spec, target.vector_bytes)
""")


# Runs _ORPHAN as its child and kills it once the LLVM child is a second into
# its request.  A subreaper: the orphaned LLVM child becomes this process's
# (not init's, which on some machines kills orphans itself), so its exit is
# its own doing and this process can wait for it.
_REAPER = textwrap.dedent("""
    import ctypes, os, subprocess, sys, time
    PR_SET_CHILD_SUBREAPER = 36
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    parent = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())

    def cpu_ticks():
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    start = cpu_ticks()
    while cpu_ticks() < start + os.sysconf("SC_CLK_TCK"):
        time.sleep(0.05)
    with open(f"/proc/{pid}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] == "R", "the LLVM child is not optimising the module"
    parent.kill()
    parent.wait()
    killed = time.monotonic()
    while time.monotonic() < killed + 30:
        if os.waitpid(pid, os.WNOHANG)[0]:
            print(f"exited after {time.monotonic() - killed:.1f} s")
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        print("still running 30 s after its parent died")
""")


def test_the_llvm_child_exits_with_its_parent():
    """A process killed outright in the middle of a build (no cleanup runs)
    does not leave its LLVM child running the pass: the child notices within
    a second or two and exits, though its pass has a minute or more to go."""
    from lowering import llvm_process
    if llvm_process._in_process:
        pytest.skip("TE_LLVM_PROCESS=0: LLVM runs in this process")
    if not sys.platform.startswith("linux"):
        pytest.skip("the test watches the child through /proc and prctl")
    proc = subprocess.run([sys.executable, "-c", _REAPER, _ORPHAN], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout.strip()
    assert said.startswith("exited after"), said
    assert float(said.split()[2]) < 5.0, said
