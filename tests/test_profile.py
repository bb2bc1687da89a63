"""kernel.profile: each stage of the scheduled program timed alone, and
te.cost's stage_iterations, the work each lowered stage does."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import te_autodiff as te
from lowering import runtime


def matmul_loss(n, m, p, dtype="float32"):
    A, B, H = (te.placeholder(s, dtype, name) for s, name in (((n, m), "A"), ((m, p), "B"), ((n, p), "H")))
    k = te.reduce_axis(m, "k")
    C = te.compute((n, p), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    dA, dB = te.gradient(C, [A, B], head=H)
    return [A, B, H], [C, dA, dB]


def test_one_entry_per_scheduled_stage_in_order_and_the_call_unchanged(rng):
    inputs, outputs = matmul_loss(96, 80, 72)
    kernel = te.build(inputs, outputs)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in inputs]
    kept = [a.copy() for a in arrays]
    before = kernel(*arrays)
    entries = kernel.profile(*arrays, repeat=np.int64(3))        # any integer
    assert [e.stages for e in entries] == [(st.name,) for st in kernel.program.stages]
    assert [e.name for e in entries] == [st.name for st in kernel.program.stages]
    assert all(e.seconds > 0 and e.steps == 1 and e.threads >= 1 for e in entries)
    assert "C" in [e.name for e in entries] and str(entries[0]).startswith(entries[0].name + ": ")
    assert all(np.array_equal(a, b) for a, b in zip(arrays, kept))          # the inputs are only read
    after = kernel(*arrays)
    assert all(np.array_equal(x, y) for x, y in zip(before, after))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_split_stage_reports_the_threads_of_a_call(rng, threads):
    inputs, outputs = matmul_loss(256, 256, 256)
    kernel = te.build(inputs, outputs)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in inputs]
    old = runtime.num_threads()
    runtime.set_num_threads(threads)
    try:
        entries = {e.name: e for e in kernel.profile(*arrays, repeat=1)}
    finally:
        runtime.set_num_threads(old)
    assert entries["C"].threads == threads                  # a 256³ product is split when it can be
    assert all(e.threads in (1, threads) for e in entries.values())


def test_a_scans_time_loop_is_one_entry_over_its_steps(rng):
    T, B, H, I = 12, 3, 8, 5
    X = te.placeholder((T, B, I), "float64", name="X")
    W = te.placeholder((H, H), "float64", name="W")
    U = te.placeholder((H, I), "float64", name="U")
    h0 = te.placeholder((1, B, H), "float64", name="h0")
    S = te.placeholder((T, B, H), "float64", name="S")
    j, q = te.reduce_axis(H, "j"), te.reduce_axis(I, "q")
    h = te.compute((T, B, H), lambda t, b, i: te.tanh(te.sum(S[t - 1, b, j] * W[i, j], axis=j)
                                                      + te.sum(X[t, b, q] * U[i, q], axis=q)), name="h")
    hs = te.scan(h0, h, S, inputs=[X], name="hs")
    L = te.placeholder(hs.shape, "float64", name="L")
    grads = te.gradient(hs, [W, U], head=L)
    kernel = te.build([X, W, U, h0, L], [hs, *grads])
    arrays = [rng.standard_normal(t.shape) for t in (X, W, U, h0, L)]
    want = kernel(*arrays)
    entries = kernel.profile(*arrays, repeat=2)
    stages = kernel.program.stages
    assert [n for e in entries for n in e.stages] == [st.name for st in stages]
    looped = [e for e in entries if e.steps > 1]
    assert looped and all(e.steps == T - 1 for e in looped)     # the forward loop and the reverse one
    first = 0
    for e in entries:                                        # an entry is one stage or one whole time loop
        group = stages[first:first + len(e.stages)]
        assert len({id(st.step) for st in group}) == 1 and (e.steps > 1) == (group[0].step is not None)
        assert e.name == ", ".join(e.stages)
        first += len(e.stages)
    got = kernel(*arrays)
    assert all(np.array_equal(x, y) for x, y in zip(want, got))


def test_stage_iterations_count_each_lowered_stage():
    n, m, p = 13, 7, 5
    inputs, outputs = matmul_loss(n, m, p)
    cost = te.cost(inputs, outputs)
    by_stage = dict(cost["stage_iterations"])
    assert cost["iterations"] == sum(by_stage.values())
    assert by_stage["C"] == n * m * p                        # the products count their multiply-adds
    assert sorted(by_stage.values()) == [n * m * p] * 3
    X = te.placeholder((8, 9), "float64", "X")
    k = te.reduce_axis(9, "k")
    s = te.compute((8,), lambda i: te.sum(X[i, k], axis=k), name="s")
    Y = te.compute((8, 9), lambda i, j: te.exp(X[i, j] - s[i]), name="Y")
    assert te.cost([X], [Y])["stage_iterations"] == [("s", 8 * 9), ("Y", 8 * 9)]


def test_built_stage_iterations_count_only_what_a_reader_keeps():
    """A product read at a shifted window is computed in its reader's loops
    (stage ``P+C``): the fused count is the elements kept times the
    reduction, the lowered count every element of ``P``."""
    A, B = te.placeholder((10, 6), "float32", "A"), te.placeholder((6, 12), "float32", "B")
    k = te.reduce_axis(6, "k")
    P = te.compute((10, 12), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="P")
    C = te.compute((8, 9), lambda i, j: P[i + 1, j + 2], name="C")
    cost = te.cost([A, B], [C], store=[P])
    assert cost["stage_iterations"] == [("P", 10 * 12 * 6), ("C", 8 * 9)]
    assert cost["built"]["stage_iterations"] == [("P+C", 8 * 9 * 6)]
    kernel = te.build([A, B], [C], store=[P])
    a, b = (np.ones(t.shape, np.float32) for t in (A, B))
    assert [e.name for e in kernel.profile(a, b, repeat=1)] == ["P+C"]


PROFILE_BOTH_WAYS = """
import json
import numpy as np, te_autodiff as te
from tests.test_profile import matmul_loss
from tests.test_scan import elman
rng = np.random.default_rng(0)
for inputs, outputs in (matmul_loss(256, 256, 256), (lambda ins, Y: (ins, [Y] + te.gradient(Y, ins)))(
        *elman(9, 4, 32, 8, dtype="float32"))):
    kernel = te.build(inputs, outputs)
    arrays = [rng.standard_normal(t.shape).astype("float32") * 0.3 for t in inputs]
    want = kernel(*arrays)
    entries = kernel.profile(*arrays, repeat=2)
    assert [n for e in entries for n in e.stages] == [st.name for st in kernel.program.stages]
    assert all(np.array_equal(a, b) for a, b in zip(want, kernel(*arrays)))
    print(json.dumps([sorted({e.threads for e in entries}), sorted({e.steps for e in entries})]))
"""


@pytest.mark.parametrize("openmp", ["1", "0"])
def test_profile_runs_stages_alone_with_libgomp_and_with_python_threads(openmp):
    """Without libgomp (``TE_OPENMP=0``) split stages run on a Python pool and
    a time loop's stages in one native call: a profile entry runs the same
    stages either way."""
    env = dict(os.environ, TE_NUM_THREADS="2", TE_OPENMP=openmp)
    done = subprocess.run([sys.executable, "-c", PROFILE_BOTH_WAYS], env=env, capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(__file__)), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (matmul_threads, matmul_steps), (_, scan_steps) = map(json.loads, done.stdout.splitlines()[:2])
    assert 2 in matmul_threads and matmul_steps == [1] and scan_steps == [1, 8]
