"""The automatic schedule (lowering/schedule/), the vector code it leads to,
the inline math functions (lowering/fast_math.py) and the native runner."""
import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import te_autodiff as te
from te_autodiff.expr import add, const, minimum, mul, var
from lowering import runtime
from lowering.codegen_llvm import stream_beyond_bytes, stream_min_bytes
from lowering.loop_ir import (Alloc, Assign, Block, BufLoad, Buffer, For, If, Local, Prefetch, Simd, Store, expr_text,
                              linear_form, loads_in, stmt_exprs, stmt_text, walk)
from lowering.lower import lower
from lowering.pipeline import lower_for, schedule_program
from lowering.schedule import TILE_VECTORS, blocking, sum_chains
from lowering.schedule.constructors import idx
from lowering.schedule.tile_plan import TilePlan
from lowering.schedule.blocking import Blocking
from lowering.schedule.nest import Nest
from lowering.schedule.aligned_grid import ALIGN_MIN_VECTORS
from lowering.schedule import packing
from lowering.schedule.packing import PACK_MIN_REUSE
from lowering.schedule.residue_classes import MAX_RESIDUES
from lowering.schedule.split_reduction import SPLIT_MIN_WORK, SPLIT_PARTS
from lowering.throughput import ACCUMULATORS



def unscheduled(inputs, outputs, arrays):
    """Run the program as lowered (scalar loops, no schedule)."""
    program = lower(inputs, outputs)
    compiled = runtime.compile_program(program, te.target())
    storage = runtime.execute(program, compiled, arrays)
    return [storage[b] for b in program.results]


@pytest.fixture
def threads(monkeypatch):
    """Set the thread count for one test, restoring it afterwards; kernels
    built in the test split their stages however small they are."""
    monkeypatch.setattr(runtime, "SERIAL_KERNEL_US", 0)
    before = runtime.num_threads()
    yield runtime.set_num_threads
    runtime.set_num_threads(before)


def matmul(n, k, m, dtype="float32", transposed=False):
    A = te.placeholder((n, k), dtype, "A")
    B = te.placeholder((m, k) if transposed else (k, m), dtype, "B")
    r = te.reduce_axis(k, "r")
    C = te.compute((n, m), (lambda i, j: te.sum(A[i, r] * B[j, r], axis=r)) if transposed else
                   (lambda i, j: te.sum(A[i, r] * B[r, j], axis=r)), name="C")
    return A, B, C


# ------------------------------------------------------------------ math


_ARGS_RNG = np.random.default_rng(2024)     # import-time data: the same arguments in any test order
F32_ARGS = np.concatenate([
    _ARGS_RNG.standard_normal(4000) * 30, np.exp(_ARGS_RNG.uniform(-87, 88, 4000)), -np.exp(_ARGS_RNG.uniform(-20, 20, 4000)),
    _ARGS_RNG.uniform(-1, 1, 4000) * 1e-5, _ARGS_RNG.uniform(-1, 1, 4000), np.exp(_ARGS_RNG.uniform(-103, -87, 1000)),
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-45, -1e-45, 1.2e-38, 88.7, 88.8, 89.0, -87.5,
     -103.9, -104.0, -200.0, -0.99999994, -1.0000001, 3.4e38, -3.4e38, 0.625, -0.625, 9.0, 20.0]])
F64_ARGS = np.concatenate([
    _ARGS_RNG.standard_normal(4000) * 30, np.exp(_ARGS_RNG.uniform(-700, 700, 4000)), -np.exp(_ARGS_RNG.uniform(-50, 50, 4000)),
    _ARGS_RNG.uniform(-1, 1, 4000) * 1e-9, _ARGS_RNG.uniform(-1, 1, 4000), np.exp(_ARGS_RNG.uniform(-745, -708, 1000)),
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 5e-324, 2.2e-308, 709.7, 709.8, 710.0, -745.0, -745.2,
     -746.0, -1000.0, -0.9999999999999999, -1.0000000000000002, 1.7e308, -1.7e308]])
FUNCTIONS = {"exp": (te.exp, np.exp), "log": (te.log, np.log), "log1p": (te.log1p, np.log1p),
             "tanh": (te.tanh, np.tanh),
             "sigmoid": (te.sigmoid, lambda x: np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))),
                                                        np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x)))))}


def ulps(got, want_exact, dtype):
    """|got - exact| in units of the last place of the exact value rounded to ``dtype``."""
    with np.errstate(all="ignore"):
        rounded = want_exact.astype(dtype)
        spacing = np.spacing(np.abs(rounded).astype(dtype)).astype(np.float64)
        return np.abs(got.astype(np.float64) - want_exact) / spacing


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_math_accuracy_and_special_values(name, dtype):
    args = (F32_ARGS if dtype == "float32" else F64_ARGS).astype(dtype)
    x = te.placeholder(args.shape, dtype, "x")
    fn, ref = FUNCTIONS[name]
    y = te.compute(x.shape, lambda i: fn(x[i]), name="y")
    got = te.build([x], [y])(args)
    with np.errstate(all="ignore"):
        exact = ref(args.astype(np.float64))
        rounded = exact.astype(dtype)
    same = (got == rounded) | (np.isnan(got) & np.isnan(rounded))
    finite = np.isfinite(rounded) & (rounded != 0)
    odd = ~finite & ~same
    assert not odd.any(), list(zip(args[odd], got[odd], rounded[odd]))
    # the exact value is known in float64 only to about 1e-16: float64 is checked relatively
    limit = 2.5 if dtype == "float32" else 4.0
    bad = finite & (ulps(got, exact, dtype) > limit)
    if dtype == "float64" and name in ("tanh", "sigmoid"):
        bad &= np.abs(got - exact) > 4e-16 * np.abs(exact)
    assert not bad.any(), list(zip(args[bad], got[bad], rounded[bad]))[:5]


@pytest.mark.parametrize("name", ["exp", "log", "log1p", "tanh"])
def test_vector_and_scalar_math_agree_bit_for_bit(name):
    """The same inline code runs in scalar loops and in vector lanes."""
    args = F32_ARGS[np.isfinite(F32_ARGS)].astype("float32")[:999]
    x = te.placeholder(args.shape, "float32", "x")
    y = te.compute(x.shape, lambda i: FUNCTIONS[name][0](x[i]), name="y")
    kernel = te.build([x], [y])
    assert any(isinstance(s, Simd) for st in kernel.program.stages for s in walk(st.body))
    np.testing.assert_array_equal(kernel(args), unscheduled([x], [y], [args])[0])


# -------------------------------------------------------------- schedules


def stage(kernel, name):
    return next(s for s in kernel.program.stages if s.name == name)


def stage_llvm(kernel, stage):
    """The LLVM function of a stage, given by name or position (stage entries are never inlined)."""
    k = stage if isinstance(stage, int) else [s.name for s in kernel.program.stages].index(stage)
    return next(f for f in kernel.llvm_ir.split("define ") if f.startswith(f"void @stage{k}("))


def has_simd(st):
    return any(isinstance(s, Simd) for s in walk(st.body))


def test_lower_without_schedule_and_kernel_texts():
    A, B, C = matmul(16, 8, 32)
    plain = lower([A, B], [C])
    assert not has_simd(plain.stages[0])
    kernel = te.build([A, B], [C])
    assert kernel.loop_ir == str(plain)
    lanes = te.target().lanes(4)
    assert f"simd[{lanes}]" in kernel.scheduled_ir and "simd" not in kernel.loop_ir


def test_schedule_is_idempotent_and_pure():
    A, B, C = matmul(40, 24, 50)
    H = te.placeholder(C.shape, "float32", "H")
    dA, dB = te.gradient(C, [A, B], head=H)
    plain = lower([A, B, H], [C, dA, dB])
    once = schedule_program(plain, te.target())
    assert str(schedule_program(plain, te.target())) == str(once)                # same input, same output
    assert str(schedule_program(once, te.target())) == str(once)                 # a scheduled stage is left alone
    assert str(lower([A, B, H], [C, dA, dB])) == str(plain)


def test_gemm_register_tile_reuses_loads():
    """C[i, j] += A[i, k] B[k, j]: a tile of rows x 2 vectors shares one k loop;
    the rows follow from the target's vector registers (8 with 32, 6 with 16)."""
    target = te.target()
    bl = blocking(target)
    assert bl.tile_rows == {16: 6, 32: 8}[target.vector_registers]
    A, B, C = matmul(64, 32, 64)
    text = te.build([A, B], [C]).scheduled_ir
    k_loop = text[text.index("for r in"):]
    tile = bl.tile_rows * TILE_VECTORS
    assert k_loop.count("acc") >= tile * 3 and f"simd[{target.lanes(4)}]" in text and "parallel for i.o" in text


def test_transposed_operand_is_packed(rng):
    """A transposed copy (a gather) leaves its loops to LLVM's unroller."""
    A, B, C = matmul(64, 48, 40, transposed=True)
    kernel = te.build([A, B], [C])
    assert [part for s in kernel.program.stages for part in s.name.split("+")] == ["B.packed", "C"]
    assert "partial for" not in kernel.scheduled_ir
    a, b = rng.standard_normal(A.shape, np.float32), rng.standard_normal(B.shape, np.float32)
    np.testing.assert_allclose(kernel(a, b), a @ b.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n,k,m", [(256, 256, 256), (130, 260, 150)])
def test_gemm_operands_are_read_from_panels(rng, n, k, m, threads):
    """C = A^T B with operands larger than L1: B is copied into column panels
    (tiles of 2 vectors), A^T into row panels of 8 rows; the column tiles
    are the parallel root.  Tails in both dimensions, any thread count."""
    A = te.placeholder((k, n), "float32", "A")
    B = te.placeholder((k, m), "float32", "B")
    r = te.reduce_axis(k, "r")
    C = te.compute((n, m), lambda i, j: te.sum(A[r, i] * B[r, j], axis=r), name="C")
    kernel = te.build([A, B], [C])
    buffers = {b.name: b.shape for b in kernel.program.buffers}
    width, rows = TILE_VECTORS * te.target().lanes(4), blocking(te.target()).tile_rows
    assert buffers["B.packed"] == (-(-m // width), k, width) and buffers["A.packed"] == (-(-n // rows), k, rows)
    text = kernel.scheduled_ir
    assert text[text.index("stage C:"):].split("\n")[1].strip().startswith("parallel for j.o")
    # contiguous copies: LLVM unrolls their serial loops around other loops only
    # partially (packing.unrolled_partially); with wide vectors the parallel root
    # may take in the loop over k
    kinds = [s.kind for name in ("A.packed", "B.packed") for s in walk(stage(kernel, name).body)
             if isinstance(s, For) and s.kind != "parallel" and any(isinstance(x, For) for x in walk(s.body))]
    assert kinds and set(kinds) == {"partial"}, kinds
    a, b = rng.standard_normal(A.shape, np.float32), rng.standard_normal(B.shape, np.float32)
    runs = []
    for t in (1, 2, 3):
        threads(t)
        runs.append(kernel(a, b))
    for run in runs[1:]:
        np.testing.assert_array_equal(run, runs[0])
    np.testing.assert_allclose(runs[0], a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


def _block_rows(k: int, ways: int) -> int:
    """The largest divisor of ``k`` rows that is at most ``ways``."""
    return max(d for d in range(1, ways + 1) if k % d == 0)


@pytest.mark.parametrize("target", ["x86-64-v2", "haswell", "skylake-avx512"])
@pytest.mark.parametrize("k", [256, 260, 257])
def test_panels_are_copied_in_blocks_of_rows(rng, target, k):
    """A panel row of at most two cache lines is copied in blocks of rows
    with the tiles inside: as many rows as L1 has ways, the largest such
    divisor of the ``k`` rows (256: 8; 260: 5; 257: 1, where a row panel
    of ``MR`` float32, narrower than a line, takes the rows in turn and a
    column panel of a line or more keeps its tiles outermost).  Values as
    numpy's on every target."""
    A, B = te.placeholder((k, 200), "float32", "A"), te.placeholder((k, 256), "float32", "B")
    r = te.reduce_axis(k, "r")
    C = te.compute((200, 256), lambda i, j: te.sum(A[r, i] * B[r, j], axis=r), name="C")
    kernel = te.build([A, B], [C], target=target)
    t, mr = te.target(target), blocking(te.target(target)).tile_rows
    nr = TILE_VECTORS * t.lanes(4)
    rows = _block_rows(k, t.l1_ways)
    def loops(name):
        return [(s.var.name, s.extent.value) for s in walk(stage(kernel, name).body) if isinstance(s, For)]
    for name, width, tiles in (("A.packed", mr, -(-200 // mr)), ("B.packed", nr, -(-256 // nr))):
        got = loops(name)                             # copy loops: p0 tiles, p1 rows of k, p2 the panel
        assert width * 4 <= 2 * t.cache_line
        if rows > 1:
            assert got[:3] == [("p1.b", k // rows), ("p0", tiles), ("p1.r", rows)], (name, got)
        elif width * 4 < t.cache_line:
            assert got[:2] == [("p1", k), ("p0", tiles)], (name, got)
        else:
            assert got[:2] == [("p0", tiles), ("p1", k)], (name, got)
    run = kernel if t.missing_on_host() is None else te.build([A, B], [C])
    a, b = rng.standard_normal(A.shape, np.float32), rng.standard_normal(B.shape, np.float32)
    np.testing.assert_allclose(run(a, b), a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("k", [64, 63, 61])
@pytest.mark.parametrize("lines", [0.5, 1, 2, 2.25])
@pytest.mark.parametrize("contiguous", [True, False])
def test_panel_rows_follow_the_width_and_the_read(k, lines, contiguous):
    """Both sides of each threshold of the rule: a panel row of at most two
    lines takes blocks of rows (the largest divisor of ``k`` up to the L1
    ways: 64 -> 8, 63 -> 7, 61 -> 1); a wider one keeps its tiles, and so
    does one of a line or more that is read across the panel (a transposed
    copy) or whose rows have no divisor but 1."""
    line, ways, itemsize = 64, 8, 4
    shape = (5, k, int(lines * line) // itemsize)
    got = packing._panel_rows(shape, itemsize, line, ways, contiguous)
    rows = _block_rows(k, ways)
    if lines > 2 or (lines >= 1 and (not contiguous or rows == 1)):
        assert got == 0
    else:
        assert got == rows


@pytest.mark.parametrize("target", ["x86-64-v2", "haswell", "skylake-avx512"])
@pytest.mark.parametrize("rest", [0, 1, 2, 3, 6, 7])
@pytest.mark.parametrize("body", ["map", "exp"])
def test_a_partial_last_vector_is_masked_only_with_mask_registers(rng, target, rest, body):
    """``n = lanes + rest`` elements: the last ``rest`` run as one masked
    vector where compares write mask registers (AVX-512), elsewhere as
    vectors of decreasing powers of two and a scalar (a masked store is
    microcoded on AVX2 and a branch per lane on SSE), no masked memory
    operation at all, when the body is a map or one piece covers the rest;
    a body applying exp keeps one masked vector for more pieces (each would
    apply exp again).  Values as numpy's (exp to its ulp bound)."""
    t = te.target(target)
    lanes = max(s.lanes for s in walk(stage(te.build(*_unary(64, body), target=target), "y").body)
                if isinstance(s, Simd))
    rest %= lanes
    pieces = not t.mask_registers and (body == "map" or rest & (rest - 1) == 0)
    ins, outs = _unary(lanes + rest, body)
    kernel = te.build(ins, outs, target=target)
    widths = sorted(s.lanes for s in walk(stage(kernel, "y").body) if isinstance(s, Simd))
    masked = "llvm.masked." in kernel.llvm_ir
    if pieces:
        assert widths == sorted([lanes] + [w for w in (16, 8, 4, 2) if rest & w]) and not masked, widths
    else:
        assert widths == [lanes] * (1 + (rest > 0)) and masked == (rest > 0), widths
    run = kernel if t.missing_on_host() is None else te.build(ins, outs)
    data = rng.standard_normal(lanes + rest).astype(np.float32)
    if body == "map":
        np.testing.assert_array_equal(run(data), data * np.float32(2) + np.float32(1))
    else:
        np.testing.assert_allclose(run(data), np.exp(data.astype(np.float64)), rtol=4 * 2.0 ** -23)


def _unary(n, body):
    x = te.placeholder((n,), "float32", "x")
    return [x], [te.compute((n,), (lambda i: x[i] * 2.0 + 1.0) if body == "map" else (lambda i: te.exp(x[i])),
                            name="y")]


def _transposed_gemm(k):
    X = te.placeholder((64, k), "float32", "X")
    W = te.placeholder((256, k), "float32", "W")
    r = te.reduce_axis(k, "r")
    Y = te.compute((64, 256), lambda i, j: te.tanh(te.sum(X[i, r] * W[j, r], axis=r)), name="Y")
    return X, W, Y


def test_k_blocks_of_a_gemm_with_a_transposed_output_add_up_in_a_temporary(rng):
    """The lanes run along the batch, which is not contiguous in the output:
    the K blocks keep their partial sums in a temporary with the batch last,
    and an epilogue stage applies tanh and writes the output.  The column
    operand is a panel (``X.packed``): blocks of ``k_block_panel`` steps,
    from a reduction longer than 1.5 of them."""
    bl = blocking(te.target())
    X, W, Y = _transposed_gemm(Blocking.k_block_min(bl.k_block_panel))      # at the threshold: one block
    assert [s.name for s in te.build([X, W], [Y]).program.stages][-2:] == ["X.packed", "Y"]
    k = 2 * bl.k_block_panel - 12                        # two blocks
    X, W, Y = _transposed_gemm(k)
    kernel = te.build([X, W], [Y])
    assert [s.name for s in kernel.program.stages][-2:] == ["Y.sums", "Y"]
    x = rng.standard_normal(X.shape, np.float32) * 0.05
    w = rng.standard_normal(W.shape, np.float32) * 0.05
    np.testing.assert_allclose(kernel(x, w), np.tanh(x.astype(np.float64) @ w.T), rtol=2e-5, atol=2e-6)


def test_loss_reduction_runs_in_lanes_and_transposed_reads_are_blocked(rng):
    n = 96
    A = te.placeholder((2 * n, n), "float32", "A")
    H = te.placeholder((n, n), "float32", "H")
    r0, r1 = te.reduce_axis(n, "r0"), te.reduce_axis(n, "r1")
    loss = te.compute((1,), lambda _: te.sum(A[2 * r1 + 1, r0] * H[r0, r1], axis=[r0, r1]), name="loss")
    T = te.compute((n, n), lambda i, j: A[2 * j + 1, i], name="T")
    kernel = te.build([A, H], [loss, T])
    assert "add_lanes" in kernel.scheduled_ir and ".b in" in kernel.scheduled_ir
    a, h = rng.standard_normal(A.shape, np.float32), rng.standard_normal(H.shape, np.float32)
    got_loss, got_t = kernel(a, h)
    np.testing.assert_array_equal(got_t, a[1::2].T)
    np.testing.assert_allclose(got_loss[0], np.sum(a[1::2].T.astype(np.float64) * h), rtol=1e-5)


@pytest.mark.parametrize("n,k,m", [(1, 1, 1), (7, 5, 3), (37, 29, 53), (16, 400, 48), (9, 777, 33)])
@pytest.mark.parametrize("transposed", [False, True])
def test_gemm_tails_and_blocked_reductions(rng, n, k, m, transposed):
    A, B, C = matmul(n, k, m, transposed=transposed)
    a = rng.standard_normal(A.shape).astype(np.float32)
    b = rng.standard_normal(B.shape).astype(np.float32)
    want = a.astype(np.float64) @ (b.T if transposed else b).astype(np.float64)
    np.testing.assert_allclose(te.build([A, B], [C])(a, b), want, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def _after_its_loop(text: str) -> bool:
    """Whether every K block of the scheduled ``text`` combines the
    partial result of the blocks before after its own loop."""
    lines = [ln.strip() for ln in text.splitlines()]
    combines = [n for n, ln in enumerate(lines) if ln.startswith("if k.b > 0:")]
    loops = [n for n, ln in enumerate(lines) if re.match(r"for \S+ in k\.b \* \d+", ln)]
    return bool(combines) and len(combines) == len(loops) and all(c > k for c, k in zip(combines, loops))


def test_k_blocked_gemm_adds_the_blocks_before_after_its_own_sum(rng):
    """Each block sums its steps from zero and then adds the partial sum the
    blocks before left, so the reload of the output tile does not delay its
    multiply-adds; the value is within the blocked sum's error bound.  One
    row tile fewer than ``PACK_MIN_REUSE`` reads ``B`` too few times for a
    panel: blocks of ``k_block`` steps."""
    bl = blocking(te.target())
    A, B, C = matmul((PACK_MIN_REUSE - 1) * bl.tile_rows, 3 * bl.k_block - 68, 40)
    Y = te.compute(C.shape, lambda i, j: te.tanh(C[i, j]) * 2.0, name="Y")
    kernel = te.build([A, B], [Y])
    assert _after_its_loop(kernel.scheduled_ir)
    a = rng.standard_normal(A.shape).astype(np.float32) * 0.05
    b = rng.standard_normal(B.shape).astype(np.float32) * 0.05
    np.testing.assert_allclose(kernel(a, b), np.tanh(a.astype(np.float64) @ b) * 2, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("op", ["max", "min"])
def test_k_blocks_combine_partial_results_with_the_reductions_operator(rng, op):
    """A max-plus (min-plus) product in K blocks: a block's partial maximum
    is combined with the blocks' before by ``max``, not added to it; max and
    min round nothing, so the value is numpy's exactly."""
    bl = blocking(te.target())
    n, k, m = (PACK_MIN_REUSE - 1) * bl.tile_rows, 3 * bl.k_block - 68, 40
    A, B = te.placeholder((n, k), "float32", "A"), te.placeholder((k, m), "float32", "B")
    r = te.reduce_axis(k, "r")
    C = te.compute((n, m), lambda i, j: getattr(te, op)(A[i, r] + B[r, j], axis=r), name="C")
    kernel = te.build([A, B], [C])
    assert _after_its_loop(kernel.scheduled_ir)
    a, b = rng.standard_normal(A.shape).astype(np.float32), rng.standard_normal(B.shape).astype(np.float32)
    np.testing.assert_array_equal(kernel(a, b), getattr(np, op)(a[:, :, None] + b[None], axis=1))


@pytest.mark.parametrize("name, blocked", [("haswell", True), ("skylake-avx512", False)])
def test_a_row_operand_read_down_its_columns_takes_k_blocks_when_its_lines_outgrow_l2(rng, name, blocked):
    """``C[t, d] = Σ_s P[s, t] Q[s, d]`` with ``P`` a padded temporary read in
    place down its columns (attention's key gradient).  With AVX2's 6-row
    tiles and Haswell's L2 the rows blocked for all 2048 steps are 18 wide,
    three lines a step: 384 KB of lines against a 128 KB budget, so the
    reduction takes K blocks and blocks of whole lines; with AVX-512's
    8-row tiles and its L2 a block is 64 rows, four whole lines a step,
    512 KB against 512 KB, and the reduction stays whole.  The K blocks are
    as long as a tile's walk down ``P`` stays in L1 (two lines of ``P`` and
    a 64-byte row of ``Q``'s panel a step: 64 steps, where BLIS's KC is
    256).  Bits are one thread's either way."""
    T = 2048
    target = replace(te.target(name), threads=2)
    S, Q = te.placeholder((T, T), "float32", "S"), te.placeholder((T, 64), "float32", "Q")
    P = te.compute((T, T), lambda s, t: te.exp(S[s, t]), name="P")
    s = te.reduce_axis(T, "s")
    C = te.compute((T, 64), lambda t, d: te.sum(P[s, t] * Q[s, d], axis=s), name="C")
    kernel = te.build([S, Q], [C], target=target)
    text = stmt_text(stage(kernel, "C").body)
    assert ("for k.b in" in text) == blocked
    if blocked:
        bl = blocking(target)
        walk = bl.k_block_l1(2 * target.cache_line + TILE_VECTORS * target.lanes(4) * 4)
        assert walk < bl.k_block_rows(4)
        assert f"for k.b in 0..{T // walk}:" in text
    assert "P.packed" not in kernel.scheduled_ir                           # P read in place
    if kernel.target.missing_on_host() is None:
        x = rng.uniform(-1, 1, (T, T)).astype(np.float32)
        q = rng.standard_normal((T, 64)).astype(np.float32)
        one = te.build([S, Q], [C], target=replace(target, threads=1))
        np.testing.assert_array_equal(kernel(x, q), one(x, q))
        p = np.exp(x.astype(np.float64))
        bound = (T + 8) * np.finfo(np.float32).eps * (p.T @ np.abs(q))      # sums of T products, exp a few ulp
        assert np.all(np.abs(kernel(x, q) - p.T @ q) <= bound)


@pytest.mark.parametrize("name", ["haswell", "skylake-avx512"])
def test_row_blocks_take_the_k_blocks_inside_them(rng, name):
    """A weight gradient's product ``Σ_k A[k, i] B[k, j]`` over a long batch
    (8192 steps: K blocks from the column panel) with a row operand larger
    than a row block: BLIS's order, row blocks, K blocks, column tiles, row
    tiles, so one K block of a block of rows stays in L2 while the column
    panels pass once per block (each block sized for one K block), instead
    of every column tile re-reading the rows' whole reduction; the K blocks
    are BLIS's KC (``Blocking.k_block_rows``), not the panel's longest.
    Each element still sums its terms in order: the bits of one thread, and
    numpy's values."""
    A = te.placeholder((8192, 768), "float32", "A")
    B = te.placeholder((8192, 64), "float32", "B")
    k = te.reduce_axis(8192, "k")
    C = te.compute((768, 64), lambda i, j: te.sum(A[k, i] * B[k, j], axis=k), name="C")
    target = replace(te.target(name), threads=2)
    kernel = te.build([A, B], [C], target=target)
    text = stmt_text(stage(kernel, "C").body)
    loops = [ln.split(" in ")[0].split()[-1] for ln in text.splitlines() if " for " in f" {ln.strip()}"]
    assert loops[:3] == ["i.b", "k.b", "j.o"]
    assert f"in 0..{8192 // blocking(target).k_block_rows(4)}:" in text.splitlines()[1]
    if kernel.target.missing_on_host() is None:
        a = rng.standard_normal(A.shape).astype(np.float32)
        b = rng.standard_normal(B.shape).astype(np.float32)
        one = te.build([A, B], [C], target=replace(te.target(name), threads=1))
        np.testing.assert_array_equal(kernel(a, b), one(a, b))
        np.testing.assert_allclose(kernel(a, b), a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", ["haswell", "skylake-avx512"])
@pytest.mark.parametrize("threads", [2, 4])
def test_row_blocks_stay_the_parallel_root_where_they_share_out_evenly(rng, name, threads):
    """A weight gradient's product whose rows make two row blocks (one K
    block of them between one and two ``row_block_bytes``) and eight column
    tiles.  The blocks are made as many as the threads (a multiple of them:
    two, four) and stay the parallel root, their K blocks and the
    column tiles inside, so each thread reads its rows' K blocks once (with
    two blocks over four threads the column tiles moved out to give every
    thread work, and the rows' K blocks were re-read per column tile).  The
    values are one thread's."""
    target = replace(te.target(name), threads=threads)
    bl = blocking(target)
    kc = bl.k_block_rows(4)
    rows, cols, steps = 3 * bl.row_block_bytes // (2 * kc * 4), 8 * TILE_VECTORS * target.lanes(4), 2 * bl.k_block_panel
    A, B = te.placeholder((steps, rows), "float32", "A"), te.placeholder((steps, cols), "float32", "B")
    k = te.reduce_axis(steps, "k")
    C = te.compute((rows, cols), lambda i, j: te.sum(A[k, i] * B[k, j], axis=k), name="C")
    kernel = te.build([A, B], [C], target=target)
    text = stmt_text(stage(kernel, "C").body)
    loops = [ln.split(" in ")[0].split()[-1] for ln in text.splitlines() if " for " in f" {ln.strip()}"]
    assert loops[:3] == ["i.b", "k.b", "j.o"]
    assert text.splitlines()[0] == f"parallel for i.b in 0..{threads}:"
    if kernel.target.missing_on_host() is None:
        one = te.build([A, B], [C], target=replace(target, threads=1))
        a = rng.standard_normal(A.shape).astype(np.float32)
        b = rng.standard_normal(B.shape).astype(np.float32)
        np.testing.assert_array_equal(kernel(a, b), one(a, b))
        np.testing.assert_allclose(kernel(a, b), a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", ["haswell", "skylake-avx512"])
def test_weight_gradient_runs_each_k_block_across_every_tap(rng, name):
    """A convolution's weight gradient ``D[o, i, p, q] = Σ_b,y,x H[b, o, y,
    x] X[b, i, y + p, x + q]``: K blocks of whole images, partial sums in a
    temporary, row blocks of input channels.  Inside each block of rows the
    K blocks come first, the nine taps and the column tiles inside them, so
    a block of images is read once per block of rows, not once per tap and
    column tile (it was: the whole ``H`` from memory nine times per block).
    The blocks of rows are the parallel root where they share out evenly
    (AVX-512: 8 tiles of 8 channels over 2 threads); AVX2's 64 channels make
    11 tiles of 6, which do not, and its 4 column tiles do: they go
    outermost, each thread taking whole columns of every block of rows."""
    target = replace(te.target(name), threads=2)
    n, c, f, h = 8, 64, 64, 28
    X, H = te.placeholder((n, c, h + 2, h + 2), "float32", "X"), te.placeholder((n, f, h, h), "float32", "H")
    b, y, x = te.reduce_axis(n, "b"), te.reduce_axis(h, "y"), te.reduce_axis(h, "x")
    D = te.compute((f, c, 3, 3), lambda o, i, p, q: te.sum(H[b, o, y, x] * X[b, i, y + p, x + q], axis=[b, y, x]),
                   name="D")
    kernel = te.build([X, H], [D], target=target)
    text = stmt_text(stage(kernel, "D.sums").body)
    loops = [ln.split(" in ")[0].split()[-1] for ln in text.splitlines() if " for " in f" {ln.strip()}"]
    bl = blocking(target)
    even = -(-c // bl.tile_rows) % target.threads == 0
    assert even == (name == "skylake-avx512")
    assert loops[:5] == (["i.b", "k.b", "p", "q", "o.o"] if even else ["o.o", "i.b", "k.b", "p", "q"])
    assert text.splitlines()[0].startswith(f"parallel for {loops[0]} in")
    if kernel.target.missing_on_host() is None:
        xs = rng.standard_normal(X.shape).astype(np.float32)
        hs = rng.standard_normal(H.shape).astype(np.float32)
        want = np.zeros(D.shape)
        for p in range(3):
            for q in range(3):
                want[:, :, p, q] = np.einsum("boyx,biyx->oi", hs, xs[:, :, p:p + h, q:q + h], dtype=np.float64)
        np.testing.assert_allclose(kernel(xs, hs), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", ["haswell", "skylake-avx512"])
@pytest.mark.parametrize("over", [0, 1])
def test_a_column_panel_beyond_l2_is_prefetched_a_page_ahead(rng, name, over):
    """A GEMM whose column panel (steps x columns) is one step larger than
    L2 asks for it ``prefetch_bytes`` ahead in the reduction loop, one hint
    per cache line of a step; a panel of exactly L2 gets no hint.  The
    hints of the last steps point past the panel: they fault nothing and
    change no value."""
    target = replace(te.target(name), threads=2)
    bl = blocking(target)
    width = TILE_VECTORS * target.lanes(4)
    m = 4 * width
    k = target.l2_bytes // (m * 4) + over
    A, B, C = matmul(PACK_MIN_REUSE * bl.tile_rows + 3, k, m)
    kernel = te.build([A, B], [C], target=target)
    hints = [s for s in walk(stage(kernel, "C").body) if isinstance(s, Prefetch)]
    if not over:
        assert hints == []
        return
    lines = width * 4 // target.cache_line
    assert {s.buffer.name for s in hints} == {"B.packed"} and len({s.index for s in hints}) % lines == 0
    ahead = {linear_form(s.index)[1] for s in hints}
    assert ahead == {bl.prefetch_bytes // 4 + q * target.cache_line // 4 for q in range(lines)}
    assert "prefetcht1" in kernel.asm
    if kernel.target.missing_on_host() is None:
        a = rng.standard_normal(A.shape).astype(np.float32)
        b = rng.standard_normal(B.shape).astype(np.float32)
        np.testing.assert_allclose(kernel(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", ["haswell", "skylake-avx512"])
@pytest.mark.parametrize("over", [0, 1])
def test_a_walk_down_columns_beyond_l2_asks_for_its_next_line(rng, name, over):
    """``C[t, d] = Σ_s P[s, t] Q[s, d]`` with ``P`` a temporary read in place
    down its columns (two column tiles or one: no row panel).  Each step the
    tile reads part of a line of ``P``'s row ``s`` and the tiles after it
    the rest and the next lines: when the rows the walk reads over the
    reduction are one step larger than L2, each step asks for the line after
    its first row's (one hint per step in each tile's code, a line further
    along the row); at exactly L2, none.  Values against numpy in float64."""
    target = replace(te.target(name), threads=2)
    n, d = 512, 32
    steps = target.l2_bytes // (n * 4) + over
    S = te.placeholder((steps, n), "float32", "S")
    Q = te.placeholder((steps, d), "float32", "Q")
    P = te.compute((steps, n), lambda s, t: te.exp(S[s, t]), name="P")
    s = te.reduce_axis(steps, "s")
    C = te.compute((n, d), lambda t, c: te.sum(P[s, t] * Q[s, c], axis=s), name="C")
    kernel = te.build([S, Q], [C], target=target)
    assert "P.packed" not in kernel.scheduled_ir
    hints = [x for x in walk(stage(kernel, "C").body) if isinstance(x, Prefetch) and x.buffer.name == "P"]
    if not over:
        assert hints == []
        return
    loops = [x for x in walk(stage(kernel, "C").body) if isinstance(x, For) and x.var.name.startswith("s")]
    assert loops and all(sum(isinstance(y, Prefetch) and y.buffer.name == "P" for y in lp.body.stmts) == 1
                         for lp in loops)
    assert {linear_form(h.index)[1] for h in hints} == {target.cache_line // 4}
    if kernel.target.missing_on_host() is None:
        x = rng.uniform(-1, 1, S.shape).astype(np.float32)
        q = rng.standard_normal(Q.shape).astype(np.float32)
        p = np.exp(x.astype(np.float64))
        bound = (steps + 8) * np.finfo(np.float32).eps * (p.T @ np.abs(q))
        assert np.all(np.abs(kernel(x, q) - p.T @ q) <= bound)


def test_two_reductions_each_size_their_own_panel(rng):
    """An element summing two products, each over a panel of about half L2:
    the panels are sized by their own reduction's steps (no hint), not by
    the product of both loops' steps (far beyond L2)."""
    target = replace(te.target("haswell"), threads=2)
    bl = blocking(target)
    m = 4 * TILE_VECTORS * target.lanes(4)
    k = target.l2_bytes // (2 * m * 4)
    A, D = (te.placeholder((PACK_MIN_REUSE * bl.tile_rows + 3, k), "float32", name) for name in "AD")
    B, E = (te.placeholder((k, m), "float32", name) for name in "BE")
    r, q = te.reduce_axis(k, "r"), te.reduce_axis(k, "q")
    C = te.compute((A.shape[0], m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r) + te.sum(D[i, q] * E[q, j], axis=q),
                   name="C")
    kernel = te.build([A, B, D, E], [C], target=target)
    body = stage(kernel, "C").body
    assert sum(isinstance(s, For) and s.var.name in ("r", "q") for s in walk(body)) >= 2
    assert not any(isinstance(s, Prefetch) for s in walk(body))
    if kernel.target.missing_on_host() is None:
        a, d = (rng.standard_normal(A.shape).astype(np.float32) for _ in "ad")
        b, e = (rng.standard_normal(B.shape).astype(np.float32) for _ in "be")
        want = a.astype(np.float64) @ b + d.astype(np.float64) @ e
        np.testing.assert_allclose(kernel(a, b, d, e), want, rtol=1e-4, atol=1e-3)


def test_gemms_of_one_form_each_prefetch_their_own_panel(rng):
    """Two products of one shape are scheduled once, as one template
    (``share.py``); each instance's hints name its own column panel."""
    target = replace(te.target("haswell"), threads=2)
    n, k, m = 40, target.l2_bytes // (64 * 4) + 1, 64
    As = [te.placeholder((n, k), "float32", f"A{q}") for q in (1, 2)]
    Bs = [te.placeholder((k, m), "float32", f"B{q}") for q in (1, 2)]
    rs = [te.reduce_axis(k, "r") for _ in (1, 2)]
    Cs = [te.compute((n, m), lambda i, j, a=a, b=b, r=r: te.sum(a[i, r] * b[r, j], axis=r), name=f"C{q}")
          for q, a, b, r in zip((1, 2), As, Bs, rs)]
    kernel = te.build(As + Bs, Cs, target=target)
    for q in (1, 2):
        hinted = {s.buffer.name for s in walk(stage(kernel, f"C{q}").body) if isinstance(s, Prefetch)}
        assert hinted == {f"B{q}.packed"}
    if kernel.target.missing_on_host() is None:
        a = rng.standard_normal((2, n, k)).astype(np.float32)
        b = rng.standard_normal((2, k, m)).astype(np.float32)
        for got, x, y in zip(kernel(*a, *b), a, b):
            np.testing.assert_allclose(got, x.astype(np.float64) @ y, rtol=1e-4, atol=1e-3)


def conv(n, c, h, f, k, pad):
    X = te.placeholder((n, c, h, h), "float32", "X")
    W = te.placeholder((f, c, k, k), "float32", "W")
    Xp = te.compute((n, c, h + 2 * pad, h + 2 * pad), lambda a, b, y, x: te.if_then_else(
        te.all(y >= pad, y < h + pad, x >= pad, x < h + pad), X[a, b, y - pad, x - pad], 0.0), name="Xp")
    rc, ry, rx = te.reduce_axis(c, "rc"), te.reduce_axis(k, "ry"), te.reduce_axis(k, "rx")
    out = h + 2 * pad - k + 1
    Y = te.compute((n, f, out, out), lambda a, o, y, x: te.sum(Xp[a, rc, y + ry, x + rx] * W[o, rc, ry, rx],
                                                                axis=[rc, ry, rx]), name="Y")
    return X, W, Y


def conv_reference(x, w, pad):
    n, c, h, _ = x.shape
    f, _, k, _ = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = xp.shape[2] - k + 1
    y = np.zeros((n, f, out, out))
    for dy in range(k):
        for dx in range(k):
            y += np.einsum("ncyx,fc->nfyx", xp[:, :, dy:dy + out, dx:dx + out], w[:, :, dy, dx])
    return y


@pytest.mark.parametrize("shape", [(2, 3, 9, 5, 3, 1), (3, 4, 7, 17, 3, 0), (1, 2, 20, 3, 5, 2)])
def test_conv_forward_and_gradients_with_odd_shapes(rng, shape):
    *dims, pad = shape
    X, W, Y = conv(*dims, pad)
    H = te.placeholder(Y.shape, "float32", "H")
    dX, dW = te.gradient(Y, [X, W], head=H)
    kernel = te.build([X, W, H], [Y, dX, dW])
    x = rng.standard_normal(X.shape).astype(np.float32)
    w = rng.standard_normal(W.shape).astype(np.float32)
    h = rng.standard_normal(H.shape).astype(np.float32)
    y, gx, gw = kernel(x, w, h)
    np.testing.assert_allclose(y, conv_reference(x, w, pad), rtol=1e-4, atol=1e-4)
    for got, want in zip((gx, gw), unscheduled([X, W, H], [dX, dW], [x, w, h])):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_padding_tests_are_peeled_off_the_interior_rows(rng):
    """The data gradient of a padded convolution tiles the output columns;
    the tests on the column hold away from the borders, so the interior tile
    keeps only the test on the row (the border tiles keep theirs)."""
    X, W, Y = conv(2, 16, 20, 32, 3, 1)
    H = te.placeholder(Y.shape, "float32", "H")
    dX, dW = te.gradient(Y, [X, W], head=H)
    kernel = te.build([X, W, H], [Y, dX, dW])
    tests = [sum(isinstance(x, If) for x in walk(s.body)) for s in walk(stage(kernel, "dXp+dX").body)
             if isinstance(s, Simd)]           # dXp, read without its border, is computed in dX
    assert min(tests) == 1 and max(tests) > 1
    x = rng.standard_normal(X.shape).astype(np.float32)
    w = rng.standard_normal(W.shape).astype(np.float32)
    h = rng.standard_normal(H.shape).astype(np.float32)
    for got, want in zip(kernel(x, w, h), unscheduled([X, W, H], [Y, dX, dW], [x, w, h])):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_guarded_reads_in_vector_lanes_stay_in_bounds(rng):
    """A select whose other branch would read far out of bounds: the vector
    code reads only where its lanes' condition holds."""
    n, m = 37, 21
    A, B = te.placeholder((n,), "float32", "A"), te.placeholder((m,), "float32", "B")
    far = te.const(10 ** 12, "int64")
    cat = te.compute((n + m,), lambda i: te.if_then_else(
        i < n, A[i], B[i - n + far * te.maximum(n - i, 0)]), name="cat")
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(m).astype(np.float32)
    np.testing.assert_array_equal(te.build([A, B], [cat])(a, b), np.concatenate([a, b]))


def test_data_dependent_index_checked_in_vector_lanes(rng):
    X = te.placeholder((50, 40), "float32", "X")
    idx = te.placeholder((40,), "int32", "idx")
    G = te.compute((3, 40), lambda t, c: X[idx[c], c] * (t + 1), name="G")
    kernel = te.build([X, idx], [G])
    assert has_simd(kernel.program.stages[0])
    x = rng.standard_normal(X.shape).astype(np.float32)
    good = rng.integers(0, 50, 40).astype(np.int32)
    want = x[good, np.arange(40)] * np.arange(1, 4, dtype=np.float32)[:, None]
    np.testing.assert_array_equal(kernel(x, good), want)
    bad = good.copy()
    bad[[17, 23]] = [-3, 99]
    with pytest.raises(IndexError, match=r"index -3 .*dimension 0 of tensor 'X'"):
        kernel(x, bad)


def test_row_max_gradient_argmax_vectorises_across_rows(rng):
    """The gradient of a row maximum goes to the first maximum of the row; the
    argmax stage (a test and two assignments per step) runs rows in lanes."""
    Z = te.placeholder((45, 300), "float32", "Z")
    c = te.reduce_axis(300, "c")
    m = te.compute((45,), lambda i: te.max(Z[i, c], axis=c), name="m")
    H = te.placeholder((45,), "float32", "H")
    (dZ,) = te.gradient(m, [Z], head=H)
    kernel = te.build([Z, H], [m, dZ])
    assert has_simd(stage(kernel, "m.argmax"))
    z = rng.standard_normal(Z.shape).astype(np.float32)
    z[3, [10, 20]] = 9.0                                # ties: the first position wins
    h = rng.standard_normal(45).astype(np.float32)
    got_m, got_dz = kernel(z, h)
    want = np.zeros_like(z)
    want[np.arange(45), np.argmax(z, axis=1)] = h
    np.testing.assert_array_equal(got_m, z.max(axis=1))
    np.testing.assert_array_equal(got_dz, want)


@pytest.mark.parametrize("rows, cols, window", [(45, 300, False), (8, 14, True)])
def test_argmax_positions_are_int32_in_long_rows(rng, rows, cols, window):
    """The first position of a long row's maximum is tracked in int32 (twice
    the vector lanes of int64; AVX2 has no int64 min), that of a pooling
    window's in int64 (scalar selects); the gradient is the same."""
    X = te.placeholder((rows, 2 * cols if window else cols), "float32", "X")
    k = te.reduce_axis(2 if window else cols, "k")
    m = te.compute((rows, cols) if window else (rows,),
                   (lambda i, j: te.max(X[i, 2 * j + k], axis=k)) if window else
                   (lambda i: te.max(X[i, k], axis=k)), name="m")
    H = te.placeholder(m.shape, "float32", "H")
    (dX,) = te.gradient(m, [X], head=H)
    kernel = te.build([X, H], [dX])
    assert f"m.argmax: {'int64' if window else 'int32'}[" in kernel.loop_ir
    x = rng.standard_normal(X.shape).astype(np.float32)
    h = rng.standard_normal(H.shape).astype(np.float32)
    groups = x.reshape(rows, cols, 2) if window else x[:, None, :]
    first = np.argmax(groups, axis=2)
    want = np.zeros_like(groups)
    np.put_along_axis(want, first[..., None], h.reshape(rows, -1)[..., None], axis=2)
    np.testing.assert_array_equal(kernel(x, h), want.reshape(X.shape))


@pytest.mark.parametrize("target", ["x86-64-v2", "haswell", "skylake-avx512"])
def test_math_stages_run_dependency_chains_side_by_side(rng, target):
    """A value passing through two functions such as exp in turn (tanh of
    a sigmoid) runs in as many vectors per step as the register file holds
    chains of such a function (four vector registers each: eight with
    AVX-512's 32 registers, four with 16); LLVM splits each operation into
    registers whose instructions alternate, so the chains overlap.  A stage
    applying one such function takes half as many, a stage without one
    keeps one vector.  On AVX-512 every 16 lanes of a wide exp or sigmoid
    still scale with one vscalefps.  Values match numpy on this machine."""
    chains = te.target(target).vector_registers // 4
    x = te.placeholder((1000,), "float32", "x")
    y = te.compute((1000,), lambda i: te.exp(x[i]) * 2.0, name="y")
    w = te.compute((1000,), lambda i: te.tanh(te.sigmoid(x[i]) * te.exp(-x[i] * x[i])), name="w")
    z = te.compute((1000,), lambda i: x[i] * 2.0, name="z")
    lanes = te.target(target).lanes(4)
    data = rng.standard_normal(1000).astype(np.float32)
    widths = {}
    for out in (y, w, z):
        kernel = te.build([x], [out], target=target)
        widths[out.name] = {max(s.lanes for s in walk(stage(kernel, out.name).body) if isinstance(s, Simd))}
        if target == "skylake-avx512" and out is not z:
            assert f"<{chains * 16} x float> @llvm.x86" not in kernel.llvm_ir
            assert "<16 x float> @llvm.x86.avx512.mask.scalef.ps.512" in kernel.llvm_ir
        if kernel.target.missing_on_host() is None and out is w:
            x64 = data.astype(np.float64)
            want = np.tanh(np.exp(-x64 * x64) / (1 + np.exp(-x64)))
            np.testing.assert_allclose(kernel(data), want, rtol=2e-6, atol=1e-7)
    assert widths == {"y": {chains // 2 * lanes}, "w": {chains * lanes}, "z": {lanes}}


@pytest.mark.parametrize("k", [PACK_MIN_REUSE - 1, PACK_MIN_REUSE, 40])
def test_a_reduction_rereading_cached_lanes_runs_chains_side_by_side(rng, k):
    """``min_j Σ_e (C[j, e] - P[i, e])²`` along ``i``: each element is a chain
    of dependent steps over data that stays in L1 (``P``, read again for
    every ``j``), so the vector loop takes as many vectors as a stage
    applying one math function; a column sum streaming ``X`` once keeps one
    vector (its rows of odd length split into no whole pair of vectors, so
    the partial sums of ``sum_chains.py`` keep one too).  ``P`` is copied
    transposed when the ``j`` loop re-reads it ``PACK_MIN_REUSE`` times or
    more (there is no other output loop; with fewer, each element's sum runs
    in lanes instead)."""
    n, d = 500, 8
    P, C = te.placeholder((n, d), "float64", "P"), te.placeholder((k, d), "float64", "C")
    e, j, r = te.reduce_axis(d, "e"), te.reduce_axis(k, "j"), te.reduce_axis(300, "r")
    D = te.compute((n, k), lambda i, jj: te.sum((C[jj, e] - P[i, e]) * (C[jj, e] - P[i, e]), axis=e), name="D")
    M = te.compute((n,), lambda i: te.min(D[i, j], axis=j), name="M")
    X = te.placeholder((300, n + 1), "float64", "X")
    S = te.compute((n + 1,), lambda i: te.sum(X[r, i], axis=r), name="S")
    lanes, chains = te.target().lanes(8), blocking(te.target()).math_chains
    kernel = te.build([P, C], [M])
    width = max((s.lanes for s in walk(stage(kernel, "D+M").body) if isinstance(s, Simd)), default=0)
    assert k < PACK_MIN_REUSE or width == chains // 2 * lanes
    assert any(st.name.startswith("P.") for st in kernel.program.stages) == (k >= PACK_MIN_REUSE)
    column = te.build([X], [S])
    assert {s.lanes for s in walk(stage(column, "S").body) if isinstance(s, Simd)} == {lanes}
    p, c = rng.standard_normal((n, d)), rng.standard_normal((k, d))
    np.testing.assert_allclose(kernel(p, c), ((p[:, None, :] - c[None]) ** 2).sum(-1).min(1), rtol=1e-12)


@pytest.mark.parametrize("target", ["haswell", "skylake-avx512", "neoverse-n1"])
def test_a_float_maximum_reduction_runs_chains_side_by_side(rng, target):
    """x86 has no instruction for a float maximum that is NaN if either
    operand is (LLVM builds one of ~5 dependent instructions around
    ``maxps``), so a reduction stepping by it is a chain of ~10 cycles a
    step: a row's maximum in lanes and a column's minimum along the output
    take as many vectors per step as the register file holds chains
    (``Blocking.math_chains``).  AArch64's ``fmax`` is one instruction and
    an integer maximum one ``pmaxsd``: they keep one vector, as does
    ``min_j`` of sums over an inner loop (its steps are the adds).  On this
    machine the values keep the maximum's rules at lengths on both sides of
    the chained width: a NaN anywhere gives NaN, and ``-0 < +0``."""
    t = te.target(target)
    lanes = t.lanes(4)
    chained = lanes * (blocking(t).math_chains if t.chained_minmax else 1)
    n = 1000
    X, I = te.placeholder((n, n), "float32", "X"), te.placeholder((n, n), "int32", "I")
    C = te.placeholder((n, 8), "float32", "C")
    c, e = te.reduce_axis(n, "c"), te.reduce_axis(8, "e")
    row = te.compute((n,), lambda i: te.max(X[i, c], axis=c), name="row")
    col = te.compute((n,), lambda j: te.min(X[c, j], axis=c), name="col")
    irow = te.compute((n,), lambda i: te.max(I[i, c], axis=c), name="irow")
    D = te.compute((n, n), lambda i, j: te.sum((X[i, e] - C[j, e]) * (X[i, e] - C[j, e]), axis=e), name="D")
    nearest = te.compute((n,), lambda i: te.min(D[i, c], axis=c), name="nearest")
    for out, inputs, want in ((row, [X], chained), (col, [X], chained), (irow, [I], lanes),
                              (nearest, [X, C], None)):
        kernel = te.build(inputs, [out], target=target)
        widths = {x.lanes for st in kernel.program.stages for x in walk(st.body) if isinstance(x, Simd)}
        if want is None:                  # the chains of the sums over e decide, as without the minimum
            want = lanes * blocking(t).math_chains // 2
        assert max(widths) == want, (out.name, widths)
    host = te.target()
    wide = host.lanes(4) * (blocking(host).math_chains if host.chained_minmax else 1)
    for m in (wide - 3, wide, wide + 5, 1000):
        Xm = te.placeholder((6, m), "float32", "X")
        r = te.reduce_axis(m, "r")
        most = te.compute((6,), lambda i: te.max(Xm[i, r], axis=r), name="most")
        least = te.compute((6,), lambda i: te.min(Xm[i, r], axis=r), name="least")
        kernel = te.build([Xm], [most, least])
        x = rng.standard_normal((6, m)).astype(np.float32)
        x[1, rng.integers(m)] = np.nan
        x[2] = np.where(rng.random(m) < 0.5, -0.0, 0.0)
        x[2, :2] = (-0.0, 0.0)
        x[3] = -0.0
        x[4] = np.inf
        x[5, rng.integers(m)] = -np.inf
        hi, lo = kernel(x)
        np.testing.assert_array_equal(hi, np.max(x, axis=1))
        np.testing.assert_array_equal(lo, np.min(x, axis=1))
        assert not np.signbit(hi[2]) and np.signbit(lo[2]) and np.signbit(hi[3]), (m, hi[2], lo[2], hi[3])


def test_a_scan_step_applying_math_keeps_one_vector_per_step(rng):
    """The stages of a scan's step are small slices: they keep one vector per
    step (two would cost build time for no measurable gain)."""
    T, B, H = 4, 2, 64
    S = te.placeholder((T, B, H), "float32", "S")
    h0 = te.placeholder((1, B, H), "float32", "h0")
    X = te.placeholder((T, B, H), "float32", "X")
    h = te.compute((T, B, H), lambda t, b, i: te.tanh(S[t - 1, b, i] * 0.5 + X[t, b, i]), name="h")
    Y = te.scan(h0, h, S, inputs=[X], name="Y")
    kernel = te.build([X, h0], [Y])
    steps = [st for st in kernel.program.stages if st.step is not None]
    assert steps
    assert {s.lanes for st in steps for s in walk(st.body) if isinstance(s, Simd)} == {te.target().lanes(4)}
    x = rng.standard_normal((T, B, H)).astype(np.float32)
    y0 = rng.standard_normal((1, B, H)).astype(np.float32)
    want = [y0[0]]
    for t in range(1, T):
        want.append(np.tanh(want[-1] * 0.5 + x[t]))
    np.testing.assert_allclose(kernel(x, y0), np.stack(want), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------ runs and threads


def mixed_program(rng):
    """Forward and backward of a small network: GEMMs, reductions, transcendental functions."""
    X = te.placeholder((70, 130), "float32", "X")
    W = te.placeholder((90, 130), "float32", "W")
    b = te.placeholder((90,), "float32", "b")
    k = te.reduce_axis(130, "k")
    h = te.compute((70, 90), lambda i, j: te.tanh(te.sum(X[i, k] * W[j, k], axis=k) + b[j]), name="h")
    r0, r1 = te.reduce_axis(70, "r0"), te.reduce_axis(90, "r1")
    loss = te.compute((1,), lambda _: te.sum(te.log1p(h[r0, r1] * h[r0, r1]), axis=[r0, r1]), name="loss")
    grads = te.gradient(loss, [X, W, b])
    arrays = [rng.standard_normal(X.shape).astype(np.float32),
              rng.standard_normal(W.shape).astype(np.float32) * 0.1,
              rng.standard_normal(b.shape).astype(np.float32)]
    return [X, W, b], [loss] + grads, arrays


def test_results_are_bit_identical_for_any_thread_count(rng, threads):
    inputs, outputs, arrays = mixed_program(rng)
    kernel = te.build(inputs, outputs)
    runs = []
    for n in (1, 2, 3, 1):
        threads(n)
        runs.append(kernel(*arrays))
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            np.testing.assert_array_equal(a, b)
    for got, want in zip(runs[0], unscheduled(inputs, outputs, arrays)):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-5)


@pytest.mark.parametrize("m, k", [(64, 96), (2048, 2048), (64, 1 << 20)])
def test_a_transposed_product_copies_an_operand_at_every_size(m, k):
    """``A @ B.T`` (both read along ``k``) copies one operand into a
    temporary the product reads along its vector lanes, whatever the sizes
    (``B`` is 16 MB at 2048 x 2048, 256 MB at 64 x 2**20: reading both in
    place along ``k`` was up to 2.5 times as slow).  Built, not run: the
    schedule depends on the shapes alone."""
    A, B, C = matmul(64, k, m, transposed=True)
    program = te.build([A, B], [C]).program
    copies = {st.buffer.name for st in program.stages if st.name.split(".")[0] in ("A", "B")}
    assert copies and all(program_buffer.kind == "temp" for program_buffer in program.buffers
                          if program_buffer.name in copies)
    products = [st for st in program.stages if st.name.split(".")[0] == "C"]
    read = {load.buffer.name for st in products for s in walk(st.body) for load in loads_in(stmt_exprs(s), set())}
    assert read & copies and len(read & {"A", "B"}) <= 1


@pytest.mark.parametrize("rows", [PACK_MIN_REUSE - 1, 64])
def test_a_batched_transposed_product_copies_the_whole_batch(rng, rows):
    """``S[a, i, j] = Σ_k Q[a, i, k] K[a, j, k]`` (attention's scores): ``K``
    reads the output loop ``a``, so its transposed copy holds every batch,
    ``K.packed`` as large as ``K``; re-read fewer than ``PACK_MIN_REUSE``
    times (by the rows ``i``) it is not copied."""
    Q, K = te.placeholder((3, rows, 64), "float32", "Q"), te.placeholder((3, 80, 64), "float32", "K")
    k = te.reduce_axis(64, "k")
    S = te.compute((3, rows, 80), lambda a, i, j: te.sum(Q[a, i, k] * K[a, j, k], axis=k), name="S")
    kernel = te.build([Q, K], [S])
    copy = {b.name: b for b in kernel.program.buffers}.get("K.packed")
    assert (copy is not None and copy.size >= 3 * 80 * 64) == (rows >= PACK_MIN_REUSE)
    q, kk = rng.standard_normal(Q.shape, np.float32), rng.standard_normal(K.shape, np.float32)
    np.testing.assert_allclose(kernel(q, kk), np.einsum("aik,ajk->aij", q.astype(np.float64), kk),
                               rtol=1e-4, atol=1e-4)


def test_a_batched_panel_counts_its_reuse_without_the_batch(rng):
    """``dK[a, j, c] = Σ_i dS[a, i, j] Q[a, i, c]``: ``Q`` is re-read by every
    row tile of ``j``, so its column panels (one per batch) pay; each element
    of ``dS`` only by the column tiles of ``c``, one here: copying the large
    ``dS`` into row panels would cost a pass over it for nothing, however
    many batches ``a`` holds."""
    width = TILE_VECTORS * te.target().lanes(4)
    dS, Q = te.placeholder((8, 512, 128), "float32", "dS"), te.placeholder((8, 512, width), "float32", "Q")
    i = te.reduce_axis(512, "i")
    dK = te.compute((8, 128, width), lambda a, j, c: te.sum(dS[a, i, j] * Q[a, i, c], axis=i), name="dK")
    kernel = te.build([dS, Q], [dK])
    names = {b.name for b in kernel.program.buffers}
    assert "Q.packed" in names and "dS.packed" not in names
    ds, q = rng.standard_normal(dS.shape, np.float32), rng.standard_normal(Q.shape, np.float32)
    np.testing.assert_allclose(kernel(ds, q), np.einsum("aij,aic->ajc", ds.astype(np.float64), q),
                               rtol=1e-4, atol=1e-4)


def test_small_kernels_run_on_one_thread_and_large_ones_split():
    """Below SERIAL_KERNEL_US of estimated work a kernel keeps every stage on
    the calling thread (a fork and join per stage would cost more)."""
    small = te.build(*(lambda A, B, C: ([A, B], [C]))(*matmul(16, 16, 16)))
    large = te.build(*(lambda A, B, C: ([A, B], [C]))(*matmul(256, 256, 256)))
    assert not any(plan.splittable for plan in small._stages)
    assert any(plan.splittable for plan in large._stages)


@pytest.mark.parametrize("name", ["x86-64-v2", "haswell", "x86-64-v4"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_vector_loop_is_one_operation_per_native_vector(name, dtype):
    """The runtime's work estimate counts a vector loop's operations once
    per native vector of the target its float lanes fill (int64 index
    arithmetic is free and does not widen a float32 loop)."""
    target = te.target(name)
    x = te.placeholder((4096,), dtype, "x")
    kernel = te.build([x], [te.compute((4096,), lambda i: te.exp(x[i]), name="y")], target=target)
    simds = [s for st in kernel.program.stages for s in walk(st.body) if isinstance(s, Simd)]
    assert simds
    itemsize = np.dtype(dtype).itemsize
    for simd in simds:
        assert runtime._native_vectors(simd, target) == max(1, -(-simd.lanes * itemsize // target.vector_bytes))
    loop = simds[0]
    assert runtime._work(loop, target) == runtime._native_vectors(loop, target) * runtime._work(loop.body, target)


def test_data_address_of_writable_read_only_and_empty_arrays():
    a = np.arange(12.0)
    frozen = a[2:]
    frozen.flags.writeable = False
    for x in (a, frozen, np.empty(0)):
        assert runtime.data_address(x) == x.ctypes.data


def test_python_thread_pool_fallback_matches(rng, threads, monkeypatch):
    inputs, outputs, arrays = mixed_program(rng)
    kernel = te.build(inputs, outputs)
    threads(2)
    want = kernel(*arrays)
    compiled = kernel._compiled
    monkeypatch.setattr(compiled, "openmp", False)          # the per-stage Python path
    for plan in kernel._stages:
        plan.splittable = plan.extent > 1
    kernel._run.steps_for.clear()
    for a, b in zip(want, kernel(*arrays)):
        np.testing.assert_array_equal(a, b)


def test_temporaries_are_reused_and_outputs_are_fresh(rng):
    inputs, outputs, arrays = mixed_program(rng)
    kernel = te.build(inputs, outputs)
    first = kernel(*arrays)
    second = kernel(*arrays)
    for a, b in zip(first, second):
        assert a is not b and not np.shares_memory(a, b)
        np.testing.assert_array_equal(a, b)
        assert a.ctypes.data % 64 == 0


def test_repeated_calls_agree_when_the_root_loop_is_moved(rng, threads):
    """A K-blocked GEMM with 10 columns: the root (parallel) loop is the row
    tile loop moved out past the K blocks; every call must agree."""
    A, B, C = matmul(128, 512, 10, transposed=True)
    kernel = te.build([A, B], [C])
    a = rng.standard_normal(A.shape).astype(np.float32)
    b = rng.standard_normal(B.shape).astype(np.float32)
    threads(2)
    first = kernel(a, b)
    for _ in range(20):
        np.testing.assert_array_equal(kernel(a, b), first)
    np.testing.assert_allclose(first, a.astype(np.float64) @ b.T, rtol=1e-4, atol=1e-3)


def test_stage_code_is_the_same_on_every_path(rng):
    """A stage called alone, through run_stages or split into thread chunks
    runs the same machine code (stage entries are never inlined)."""
    kernel = te.build(*mixed_program(rng)[:2])
    for n in range(len(kernel.program.stages)):
        assert f"call void @stage{n}(" in kernel.llvm_ir


def test_large_outputs_written_once_use_streaming_stores(rng):
    """A 4 MB output written with full vectors skips the cache (non-temporal
    stores); one below the target's streaming threshold (L2), and an output a
    K-blocked GEMM reads back, do not."""
    n = 1 << 20
    assert 4 * n >= stream_min_bytes(te.target())
    x = te.placeholder((n,), "float32", "x")
    big = te.build([x], [te.compute((n,), lambda i: te.exp(x[i]) * 2.0, name="big")])
    n_small = stream_min_bytes(te.target()) // 8         # half the threshold
    small = te.build([x], [te.compute((n_small,), lambda i: x[i] + 1.0, name="small")])
    assert "!nontemporal" in big.llvm_ir and "!nontemporal" not in small.llvm_ir
    assert "llvm.x86.sse.sfence" in big.llvm_ir
    xs = rng.standard_normal(n).astype(np.float32)
    np.testing.assert_allclose(big(xs), np.exp(xs) * 2.0, rtol=2e-6)
    A, B, C = matmul(512, 2 * blocking(te.target()).k_block_panel, 1024)   # B a panel, in two K blocks
    gemm = te.build([A, B], [C])
    assert "k.b" in gemm.scheduled_ir and "!nontemporal" not in stage_llvm(gemm, "C")
    y = te.compute((n,), lambda i: te.exp(x[i]), name="y")
    reread = te.build([x], [y, te.compute((n,), lambda i: y[n - 1 - i] * 2.0, name="z")])
    assert "!nontemporal" in stage_llvm(reread, "z")                    # z streams,
    assert "!nontemporal" not in stage_llvm(reread, "y")                # y, read by z, stays cached
    assert 4 * n < stream_beyond_bytes(te.target())


@pytest.mark.parametrize("below", [False, True])
def test_a_temporary_beyond_the_caches_streams_though_a_later_stage_reads_it(rng, below):
    """A temporary of at least every thread's L2 and L3 share loses its first
    lines before its stage ends, so it is written past the caches even
    though the next stage reads it (no read for ownership); one a vector
    smaller stays cached (both sides of ``stream_beyond_bytes``)."""
    lanes = te.target().lanes(4)
    n = stream_beyond_bytes(te.target()) // 4 - (lanes if below else 0)
    x = te.placeholder((n,), "float32", "x")
    y = te.compute((n,), lambda i: te.exp(x[i]), name="y")
    z = te.compute((n,), lambda i: y[n - 1 - i] * 2.0, name="z")
    kernel = te.build([x], [z], store=[y])
    assert [st.name for st in kernel.program.stages] == ["y", "z"]
    assert ("!nontemporal" in stage_llvm(kernel, "y")) == (not below)
    xs = rng.standard_normal(n).astype(np.float32)
    np.testing.assert_allclose(kernel(xs), (np.exp(xs) * 2.0)[::-1], rtol=2e-6)


@pytest.mark.parametrize("name,streams", [("haswell", False), ("skylake-avx512", True)])
def test_a_transposed_write_streams_only_whole_cache_lines(rng, name, streams):
    """A gathering transpose (``A[j, 2i]``: every other element of a row, so
    not read as rows) writes a tile's rows in turn, one vector each:
    AVX-512's 64-byte vector is a whole cache line and streams; AVX2's
    32-byte one would leave lines half written (partial write-combining
    flushes), so it goes through the caches.  A transpose read as rows
    writes a line of lanes per row and a row written in order streams: both
    stream on both.  (Rows of 1040 elements: with 1024, rows 4 KiB apart,
    the gathers take 8 lanes, see
    test_gathers_keep_their_lanes_lines_within_the_l1_ways.)"""
    n = 1040
    A = te.placeholder((n, 2 * n), "float32", "A")
    gathered = te.build([A], [te.compute((n, n), lambda i, j: A[j, 2 * i] * 2.0, name="B")], target=name)
    assert "for i.i in" in gathered.scheduled_ir and "transpose for" not in gathered.scheduled_ir
    assert ("!nontemporal" in gathered.llvm_ir) == streams
    transposed = te.build([A], [te.compute((2 * n, n), lambda i, j: A[j, i] * 2.0, name="B")], target=name)
    assert "transpose for i.i in" in transposed.scheduled_ir and "!nontemporal" in transposed.llvm_ir
    rows = te.build([A], [te.compute((n, n), lambda i, j: A[i, j] * 2.0, name="B")], target=name)
    assert "!nontemporal" in rows.llvm_ir
    if gathered.target.missing_on_host() is None:
        a = rng.standard_normal((n, 2 * n)).astype(np.float32)
        np.testing.assert_array_equal(gathered(a), a[:, ::2].T * 2)
        np.testing.assert_array_equal(transposed(a), a.T * 2)


@pytest.mark.parametrize("target", ["x86-64-v2", "haswell", "skylake-avx512"])
def test_a_transposing_copy_reads_rows_and_transposes_them_in_registers(rng, target):
    """``T[i, j] = A[j, i]``: the vector loop along ``j`` reads ``A``
    strided across its lanes and contiguously along ``i``, the loop of the
    gather blocks (``gather_blocks.py``).  That loop runs inside the lanes
    as a loop of kind ``transpose`` (rows loaded, a line of lanes, and
    transposed in registers): every whole block has a constant extent, a
    partial last block (``cols % 16`` rows) is a loop of its own, and with
    four blocks or more, when a column sweep's lines (one per source row)
    exceed L1, two neighbouring blocks are visited together in each column
    tile.
    Exact against numpy for every shape, the rows starting on a cache line
    or 16 bytes past one (as numpy's large arrays do)."""
    from lowering.runtime import _aligned

    line = te.target(target).cache_line // 4
    for rows, cols, dtype in ((1024, 1024, "float32"), (1040, 1000, "float32"), (37, 50, "float32"),
                              (512, 256, "float64"), (64, 48, "float32"), (96, 40, "float32")):
        A = te.placeholder((rows, cols), dtype, "A")
        T = te.compute((cols, rows), lambda i, j: A[j, i], name="T")
        kernel = te.build([A], [T], target=target)
        loops = [x for st in kernel.program.stages for x in walk(st.body)]
        extents = {x.extent.value for x in loops if isinstance(x, For) and x.kind == "transpose"}
        assert extents == ({16} if cols >= 16 else set()) | ({cols % 16} if cols % 16 else set()), (rows, cols)
        pairs = [x for x in loops if isinstance(x, For) and x.var.name == "i.s"]
        t = te.target(target)
        assert bool(pairs) == (-(-cols // 16) >= 4 and rows * t.cache_line > t.l1_bytes), (rows, cols)
        if rows % line == 0:
            item = np.dtype(dtype).itemsize
            assert {x.lanes for x in loops if isinstance(x, Simd)} == {
                max(te.target(target).lanes(item), min(64 // item, 2 * te.target(target).lanes(item)))}
        run = kernel if kernel.target.missing_on_host() is None else te.build([A], [T], target="host")
        a = rng.standard_normal((rows, cols)).astype(dtype)
        flat = _aligned((rows * cols + 64,), dtype, 64)[0]
        for offset in (0, 16):              # bytes past a cache line, as numpy's large arrays start
            start = offset // np.dtype(dtype).itemsize
            placed = flat[start:start + rows * cols].reshape(rows, cols)
            placed[...] = a
            np.testing.assert_array_equal(run(placed), a.T)


def _output_loops(st):
    """The names of a stage's output loops as scheduled, outermost first,
    each split loop by its base name (``h_w.o`` -> ``h_w``)."""
    names = []
    for x in walk(st.body):
        if isinstance(x, (For, Simd)):
            base = x.var.name.rsplit(".", 1)[0] if x.var.name[-2:] in (".o", ".l", ".b", ".i") else x.var.name
            if base not in names:
                names.append(base)
    return names


def _merged(inputs, outputs):
    """The output loops of the first stage as lowered, after ``merged_loops``
    (the rule alone: the parallel root may collapse them later)."""
    from lowering.schedule import merged_loops
    from lowering.schedule.nest import as_nest
    return [lp.var.name for lp in merged_loops.build(as_nest(lower(inputs, outputs).stages[0])).loops]


def test_axes_walked_as_one_run_of_memory_become_one_loop(rng):
    """``merged_loops.py``: neighbouring output loops inside the outermost
    merge when every index steps ``E`` times as far with the outer as with
    the inner (extent ``E``) and nothing else reads them.  A batch of 14x14
    images becomes one loop per image of the batch; a per-channel broadcast
    keeps the channel loop and merges the image; a padded row (``15 i + j``
    for a row of 14: one more than the merge allows) keeps both loops, a
    guard on ``w`` keeps ``w``.  A user axis already called ``h_w`` gets a
    primed name.  Exact against numpy in each case, built for this machine."""
    X = te.placeholder((8, 6, 14, 14), name="X")
    b = te.placeholder((6,), name="b")
    x, bv = rng.standard_normal((8, 6, 14, 14)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    whole = [te.compute(X.shape, lambda n, c, h, w: X[n, c, h, w] * 2.0, name="Y")]
    assert _merged([X], whole) == ["n", "c_h_w"]
    np.testing.assert_array_equal(te.build([X], whole)(x), x * 2)
    bias = [te.compute(X.shape, lambda n, c, h, w: X[n, c, h, w] + b[c], name="Y")]
    assert _merged([X, b], bias) == ["n", "c", "h_w"]
    np.testing.assert_array_equal(te.build([X, b], bias)(x, bv), x + bv[:, None, None])
    for row in (14, 15):
        F = te.placeholder((2 * 4 * row,), name="F")
        rows = [te.compute((2, 4, 14), lambda a, i, j: F[a * 4 * row + i * row + j], name="Y")]
        assert _merged([F], rows) == (["a", "i_j"] if row == 14 else ["a", "i", "j"]), row
        f = rng.standard_normal(2 * 4 * row).astype(np.float32)
        np.testing.assert_array_equal(te.build([F], rows)(f), f.reshape(2, 4, row)[:, :, :14])
    guarded = [te.compute(X.shape, lambda n, c, h, w: te.if_then_else(w > 0, X[n, c, h, w], te.const(0.0)),
                          name="Y")]
    assert _merged([X], guarded) == ["n", "c_h", "w"]
    np.testing.assert_array_equal(te.build([X], guarded)(x), np.where(np.arange(14) > 0, x, 0))
    Z = te.placeholder((4, 4, 5), name="Z")
    named = [te.compute(Z.shape, lambda h_w, h, w: Z[h_w, h, w] + 1.0, name="Y")]
    assert _merged([Z], named) == ["h_w", "h_w'"]
    z = rng.standard_normal((4, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(te.build([Z], named)(z), z + 1)


def test_a_packed_copy_over_merged_axes_reads_rows_and_transposes_them(rng):
    """A convolution's weights ``W[k, c, kh, kw]`` packed into blocks of
    32 output channels: ``(c, kh, kw)`` is one contiguous run of the source
    and of the copy, merged into one loop, which the copy reads in rows
    transposed in registers (before the merge each element was gathered:
    the inner loop of 3 was too short to block).  Flipped (``2 - kh``), the
    run reads backwards: it cannot be transposed and, one block at most
    long (9 rows), it is gathered unblocked, the column tiles inside the
    rows (blocks only where rows are left to share a block's lines: 17)."""
    W = te.placeholder((64, 16, 3, 3), name="W")
    w = rng.standard_normal((64, 16, 3, 3)).astype(np.float32)
    packed = te.build([W], [te.compute((2, 16, 3, 3, 32), lambda a, c, y, x, e: W[a * 32 + e, c, y, x], name="P")])
    st = packed.program.stages[0]
    assert any(isinstance(x, For) and x.kind == "transpose" for x in walk(st.body))
    np.testing.assert_array_equal(packed(w), w.reshape(2, 32, 16, 3, 3).transpose(0, 2, 3, 4, 1))
    flipped = te.build([W], [te.compute((2, 16, 3, 3, 32), lambda a, c, y, x, e: W[a * 32 + e, c, 2 - y, 2 - x],
                                        name="P")])
    st = flipped.program.stages[0]
    loops = [x for x in walk(st.body) if isinstance(x, For)]
    assert "y_x" in _output_loops(st) and not any(x.var.name == "y_x.b" for x in loops)
    assert [x.var.name for x in loops].index("y_x") < [x.var.name for x in loops].index("e.o")
    np.testing.assert_array_equal(flipped(w), w[:, :, ::-1, ::-1].reshape(2, 32, 16, 3, 3).transpose(0, 2, 3, 4, 1))
    for n in (16, 17):
        X = te.placeholder((64, n), name="X")
        kernel = te.build([X], [te.compute((n, 64), lambda i, j: X[j, n - 1 - i], name="Y")])
        blocked = any(isinstance(x, For) and x.var.name == "i.b" for x in walk(kernel.program.stages[0].body))
        assert blocked == (n > 16), n
        a = rng.standard_normal((64, n)).astype(np.float32)
        np.testing.assert_array_equal(kernel(a), a[:, ::-1].T)


def _placed(a, offset: int):
    """A copy of ``a`` starting ``offset`` bytes past a 64-byte boundary."""
    flat = runtime._aligned((a.nbytes + 64,), np.uint8, 64)[0]
    placed = flat[offset:offset + a.nbytes].view(a.dtype).reshape(a.shape)
    placed[...] = a
    return placed


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_align_gap_counts_the_elements_before_the_first_aligned_address(dtype):
    """``align_gap(X, bytes)``, read at run time from the array passed, for
    every element offset of ``X`` from a 64-byte boundary."""
    from lowering.loop_ir import AlignGap, Store, map_stmt
    from te_autodiff.expr import cast

    X = te.placeholder((64,), dtype, "X")
    outs = [te.compute((1,), lambda i: X[i] * k, name=name) for name, k in (("Y", 1.0), ("Z", 2.0))]
    plain = lower([X], outs)
    x = plain.inputs[0]
    stages = [replace(st, body=map_stmt(st.body, lambda e: e, store=lambda s, expr, n=n: Store(
        s.buffer, expr(s.index), cast(dtype, AlignGap(x, n))))) for st, n in zip(plain.stages, (64, 32))]
    program = replace(plain, stages=tuple(stages))
    assert "align_gap(X, 64)" in str(program)
    compiled = runtime.compile_program(program, te.target())
    item = np.dtype(dtype).itemsize
    for offset in range(0, 64, item):
        storage = runtime.execute(program, compiled, [_placed(np.zeros(64, dtype), offset)])
        got = [storage[b][0] for b in program.results]
        assert got == [(-offset) % 64 // item, (-offset) % 32 // item], offset


def _aligned_grid_loss(n: int, m: int):
    """``sum A[2j + 1, i] H[i, j]`` over ``i < n``, ``j < m`` (the strided benchmark kernel's loss)."""
    A = te.placeholder((2 * m, n), "float32", "A")
    H = te.placeholder((n, m), "float32", "H")
    i, j = te.reduce_axis(n, "i"), te.reduce_axis(m, "j")
    return [A, H], te.compute((1,), lambda _: te.sum(A[2 * j + 1, i] * H[i, j], axis=[i, j]), name="loss")


@pytest.mark.parametrize("target", ["x86-64-v2", "haswell", "skylake-avx512"])
def test_vector_grids_start_on_the_lines_of_the_input_they_read(rng, target):
    """Where loops over rows run inside a vector loop (a reduction in lanes
    with rows inside, a transposing copy whose column sweep exceeds L1),
    the whole vectors start on the cache lines of the input read along the
    lanes (``align_gap``), and the iterations before and after them run on
    their own; loops of fewer than ``ALIGN_MIN_VECTORS`` vectors, rows that
    do not all start at the same place in a vector (1000 float32 in 16
    lanes), sweeps that fit L1 and reads from two inputs along the lanes
    keep their grid.  Every placement of the inputs, element by element within
    a line, gives numpy's result."""
    t = te.target(target)
    run_target = target if t.missing_on_host() is None else "host"
    for n, m in ((256, 512), (64, 1024), (256, 64), (256, 1000)):
        inputs, loss = _aligned_grid_loss(n, m)
        kernel = te.build(inputs, [loss], target=target)
        lanes = max(x.lanes for st in kernel.program.stages for x in walk(st.body) if isinstance(x, Simd))
        shifted = m % lanes == 0 and m >= ALIGN_MIN_VECTORS * lanes
        assert ("align_gap(H, " in kernel.scheduled_ir) == shifted, (n, m)
        run = te.build(inputs, [loss], target=run_target)
        # small integers: every partial sum is exact in float32 (|sum| < 2^24), so
        # any order of the additions gives the same bits and a term dropped or
        # counted twice by a misplaced vector shows
        a = rng.integers(-3, 4, (2 * m, n)).astype(np.float32)
        h = rng.integers(-3, 4, (n, m)).astype(np.float32)
        want = np.sum(a[1::2].T.astype(np.int64) * h.astype(np.int64))
        for oa, oh in ((0, 0), (16, 16), (4, 60), (48, 8), (60, 32)):
            np.testing.assert_array_equal(run(_placed(a, oa), _placed(h, oh))[0], want)
    for rows, cols, dtype, shifted in ((1024, 256, "float32", True), (1024, 128, "float64", True),
                                       (1024, 1000, "float32", False), (1024, 64, "float32", False),
                                       (256, 256, "float32", False)):
        A = te.placeholder((rows, cols), dtype, "A")
        T = te.compute((cols, rows), lambda i, j: A[j, i], name="T")
        kernel = te.build([A], [T], target=target)
        assert ("align_gap(A, " in kernel.scheduled_ir) == shifted, (rows, cols)
        run = te.build([A], [T], target=run_target)
        a = rng.standard_normal((rows, cols)).astype(dtype)
        item = np.dtype(dtype).itemsize
        for offset in range(0, 64, 3 * item):
            np.testing.assert_array_equal(run(_placed(a, offset)), a.T)
    X = te.placeholder((256, 512), "float32", "X")        # two inputs read along the lanes
    i, j = te.reduce_axis(256, "i"), te.reduce_axis(512, "j")
    inputs, loss = _aligned_grid_loss(256, 512)
    both = te.compute((1,), lambda _: te.sum(inputs[1][i, j] * X[i, j] * inputs[0][2 * j + 1, i], axis=[i, j]))
    assert "align_gap" not in te.build(inputs + [X], [both], target=target).scheduled_ir


@pytest.mark.parametrize("name,rolled", [("haswell", True), ("skylake-avx512", False)])
def test_shared_broadcasts_stay_rolled_where_registers_are_short(rng, name, rolled):
    """A convolution's rows x read Xp[x + rx]: unrolling rx lets LLVM keep the
    shared broadcasts live, more than AVX2's 16 registers hold beside a 6 x 2
    tile (the rx loop stays rolled) but not more than AVX-512's 32."""
    X, W, Y = conv(2, 16, 12, 16, 3, 1)
    kernel = te.build([X, W], [Y], target=name)
    assert ("rolled for rx" in kernel.scheduled_ir) == rolled
    assert ("rolled for" in kernel.scheduled_ir) == rolled
    if te.target(name).missing_on_host() is None:
        x = rng.standard_normal(X.shape).astype(np.float32)
        w = rng.standard_normal(W.shape).astype(np.float32)
        np.testing.assert_allclose(kernel(x, w), conv_reference(x, w, 1), rtol=1e-4, atol=1e-4)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 600), st.integers(1, 10))
def test_rows_per_tile_keep_the_fewest_tiles_and_even_them(extent, most):
    """register_tile.rows_per_tile: as many tiles as tiles of ``most`` rows
    need, no fewer rows per tile could keep that count, so the last tile
    falls short of the others by less than their number of tiles."""
    from lowering.schedule.register_tile import rows_per_tile

    rows = rows_per_tile(extent, most)
    tiles = -(-extent // most)
    assert 1 <= rows <= most and -(-extent // rows) == tiles
    assert rows == 1 or -(-extent // (rows - 1)) > tiles
    assert rows - (extent - (tiles - 1) * rows) < tiles


@pytest.mark.parametrize("extent,most,rows", [(14, 6, 5), (12, 6, 6), (32, 6, 6), (512, 6, 6), (14, 8, 7),
                                              (17, 8, 6), (3, 6, 3), (13, 6, 5)])
def test_rows_per_tile_examples(extent, most, rows):
    """AVX2's tiles of at most 6 rows cut 14 rows as 5 + 5 + 4 and 13 as 5 +
    5 + 3; 32 and 512 keep 6 (as many tiles need 6 rows); AVX-512's 8 cut
    14 as 7 + 7 and 17 as 6 + 6 + 5."""
    from lowering.schedule.register_tile import rows_per_tile

    assert rows_per_tile(extent, most) == rows


def _tile_accumulators(kernel, name) -> set:
    """The accumulator counts of a stage's register tile variants (one per row tile size)."""
    text = stmt_text(stage(kernel, name).body)
    counts = {}
    for tile, k in re.findall(r"acc\d+\.(\d+)\.(\d+): ", text):
        counts[tile] = max(counts.get(tile, 0), int(k) + 1)
    return set(counts.values())


@pytest.mark.parametrize("name,width,accumulators", [
    ("haswell", 14, {10, 8}), ("haswell", 12, {12}), ("haswell", 17, {12, 10}),
    ("skylake-avx512", 14, {14}), ("skylake-avx512", 12, {12}), ("skylake-avx512", 17, {12, 10})])
def test_register_tiles_cut_the_rows_evenly(rng, name, width, accumulators):
    """A convolution's output columns are its register tile's rows
    (:func:`~lowering.schedule.register_tile.rows_per_tile`): 14 of them on
    AVX2 (tiles of at most 6 rows by 2 vectors) run as 5 + 5 + 4, not 6 + 6
    + 2, whose last tile's 4 accumulators are too few chains to hide the
    multiply-add latency; 12 stay 6 + 6.  On AVX-512 (at most 8 rows; the
    weights' slice, 64 x 9 steps of 2 vectors, streams from L2) as few
    tiles as evenly: 7 + 7, 6 + 6 and 6 + 6 + 5."""
    X, W, Y = conv(1, 64, width, 64, 3, 1)
    kernel = te.build([X, W], [Y], target=name)
    assert _tile_accumulators(kernel, "Y") == accumulators
    if te.target(name).missing_on_host() is None:
        x = rng.standard_normal(X.shape).astype(np.float32)
        w = rng.standard_normal(W.shape).astype(np.float32)
        np.testing.assert_allclose(kernel(x, w), conv_reference(x, w, 1), rtol=1e-4, atol=1e-4)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 200), st.integers(1, 10), st.integers(-5, 210), st.integers(-5, 210))
def test_peeled_rows_are_whole_tiles(extent, mr, lo, hi):
    """row_peeling.whole_tiles: the interior it peels is made of the tiles of
    ``mr`` rows (the last one partial) within ``lo <= i < hi``, all of them."""
    from lowering.schedule.row_peeling import whole_tiles

    starts = list(range(0, extent, mr))
    inside = [t for t in starts if t >= lo and min(t + mr, extent) <= hi]
    got = whole_tiles(lo, hi, extent, mr)
    if not inside:
        assert got is None
    else:
        assert got == (inside[0], min(inside[-1] + mr, extent))
        assert inside == starts[starts.index(inside[0]):starts.index(inside[-1]) + 1]


@pytest.mark.parametrize("name,accumulators,peeled", [("haswell", {12, 8}, True), ("skylake-avx512", {16}, False)])
def test_peeling_keeps_the_tiles_of_the_unpeeled_rows(rng, name, accumulators, peeled):
    """The gradient of a 3x3 convolution's padded input (16 columns, the
    register tile's rows) tests its first and last two columns.  Peeling
    cuts on tile boundaries: the border tiles keep their tests, no border
    becomes a tile of its own with too few accumulators for the
    multiply-add latency (2 columns: 4), and the tiles are those of the
    columns unpeeled: on AVX2 6 + 6 + 4, the middle one without the tests;
    on AVX-512 8 + 8, both borders, nothing peeled.  ``dXp`` is an output
    too: otherwise ``dX``, its crop, computes only the 14 columns it reads
    (``fuse.py``), and no stage tests a border."""
    X, W, Y = conv(1, 64, 14, 64, 3, 1)
    H = te.placeholder(Y.shape, "float32", "H")
    dX, = te.gradient(Y, [X], head=H)
    dXp, = dX.inputs
    kernel = te.build([X, W, H], [dX, dXp], target=name)
    assert _tile_accumulators(kernel, "dXp") == accumulators
    tests = [sum(isinstance(x, If) for x in walk(s.body)) for s in walk(stage(kernel, "dXp").body)
             if isinstance(s, Simd)]
    assert (min(tests) < max(tests)) == peeled          # a tile without the column tests
    if te.target(name).missing_on_host() is None:
        arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in (X, W, H)]
        for got, want in zip(kernel(*arrays), unscheduled([X, W, H], [dX, dXp], arrays)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_no_panel_copies_an_element_twice(rng):
    """A convolution vectorised along its 56 output columns on AVX2 reads
    ``Xp[c, y + kh, x + kw]``: a column panel over the reduction (c, kh, kw)
    would hold each element once per tap, 9 times the padded input (264 MB
    at 32 x 64 x 56²), written and read back on every call.  Such a box is
    read in place; the 3x3 filter, each element once, is still packed."""
    X, W, Y = conv(1, 32, 56, 64, 3, 1)
    kernel = te.build([X, W], [Y], target="haswell")
    sources = {b.name: b for b in kernel.program.buffers}
    for b in kernel.program.buffers:
        if b.name.endswith(".packed"):
            assert np.prod(b.shape) <= np.prod(sources[b.name[:-len(".packed")]].shape), b.name
    assert "Xp.packed" not in sources
    X2, W2, Y2 = conv(1, 64, 28, 64, 3, 1)
    assert "W.packed" in {b.name for b in te.build([X2, W2], [Y2], target="haswell").program.buffers}
    if kernel.target.missing_on_host() is None:
        x = rng.standard_normal(X.shape).astype(np.float32)
        w = rng.standard_normal(W.shape).astype(np.float32)
        np.testing.assert_allclose(kernel(x, w), conv_reference(x, w, 1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads,collapsed", [(1, False), (2, True), (3, False)])
def test_unbalanced_parallel_root_is_collapsed(rng, threads, collapsed):
    """The filter gradient's tile loops have 3 iterations each (kh, kw): over 2
    threads one would idle a third of the time, so kh and kw become one root
    loop of 9 (over 1 or 3 threads 3 shares out evenly).  The bits do not change."""
    from dataclasses import replace

    X, W, Y = conv(2, 16, 12, 16, 3, 1)
    H = te.placeholder(Y.shape, "float32", "H")
    dW, = te.gradient(Y, [W], head=H)
    target = replace(te.target(), threads=threads)
    kernel = te.build([X, W, H], [dW], target=target)
    root = [ln.strip() for ln in kernel.scheduled_ir.split("stage dW")[-1].splitlines() if "parallel" in ln][0]
    assert root.startswith("parallel for i2.i3") == collapsed
    x, w, h = (rng.standard_normal(t.shape).astype(np.float32) for t in (X, W, H))
    reference = te.build([X, W, H], [dW], target=replace(te.target(), threads=1))(x, w, h)
    np.testing.assert_array_equal(kernel(x, w, h), reference)


@pytest.mark.parametrize("batch", [1, 4])
def test_a_row_reduction_in_lanes_takes_a_long_root(rng, batch):
    """``Σ_j X[b, i, j]`` over a batch of one has one iteration in its
    first loop: its rows must be the parallel root, not that loop (the two
    threads would leave all rows to one).  A batch of ``MIN_ROOT`` keeps
    its order.  Values as numpy's."""
    from lowering.schedule.parallel_root import MIN_ROOT

    X = te.placeholder((batch, 300, 200), "float32", "X")
    j = te.reduce_axis(200, "j")
    S = te.compute((batch, 300), lambda b, i: te.sum(X[b, i, j], axis=j), name="S")
    kernel = te.build([X], [S])
    root = next(ln.split() for ln in kernel.scheduled_ir.splitlines() if "parallel" in ln)
    assert int(root[-1].rstrip(":").split("..")[1]) == (300 if batch < MIN_ROOT else batch), root
    x = rng.standard_normal(X.shape).astype(np.float32)
    np.testing.assert_allclose(kernel(x), x.astype(np.float64).sum(-1), rtol=1e-5, atol=1e-4)


def test_parallel_root_is_collapsed_again_while_it_stays_unbalanced(rng):
    """On SSE (4 lanes) the filter gradient of 16 output channels has two
    column tiles inside kh and kw: kh x kw = 9 over 2 threads still idles
    one a tenth of the time, so the column tiles join the root (18: 9 and
    9).  The bits do not change."""
    X, W, Y = conv(2, 16, 12, 16, 3, 1)
    H = te.placeholder(Y.shape, "float32", "H")
    dW, = te.gradient(Y, [W], head=H)
    kernel = te.build([X, W, H], [dW], target=replace(te.target("x86-64-v2"), threads=2))
    root = [ln.strip() for ln in kernel.scheduled_ir.split("stage dW")[-1].splitlines() if "parallel" in ln][0]
    assert root == "parallel for i2.i3.i0.o in 0..18:"
    if kernel.target.missing_on_host() is None:
        x, w, h = (rng.standard_normal(t.shape).astype(np.float32) for t in (X, W, H))
        one = te.build([X, W, H], [dW], target=replace(te.target("x86-64-v2"), threads=1))
        np.testing.assert_array_equal(kernel(x, w, h), one(x, w, h))


@pytest.mark.parametrize("threads, blocks", [(1, 15), (2, 16), (3, 15)])
def test_row_blocks_share_out_evenly_over_the_threads(rng, threads, blocks):
    """An MLP layer's product on AVX2: L2 holds the rows of 6 row tiles of
    86, so 15 blocks; over 2 threads they become 16 (a multiple of the
    threads) of 5 or 6 tiles, 43 a thread, where 15 blocks of 6 and a last
    of 2 gave the runtime's equal chunks 48 and 38; over 3 threads 15
    blocks share out as they are.  The root stays the blocks, and the bits
    are one thread's."""
    X = te.placeholder((128, 784), "float32", "X")
    W = te.placeholder((512, 784), "float32", "W")
    k = te.reduce_axis(784, "k")
    h = te.compute((128, 512), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="h")
    kernel = te.build([X, W], [h], target=replace(te.target("haswell"), threads=threads))
    lines = [ln.strip() for ln in kernel.scheduled_ir.split("stage h:")[1].splitlines()]
    assert [ln for ln in lines if "parallel" in ln][0] == f"parallel for j.b in 0..{blocks}:"
    assert f"for j.o in 0..(j.b + 1) * 86 // {blocks} - j.b * 86 // {blocks}:" in lines
    if kernel.target.missing_on_host() is None:
        x, w = (rng.standard_normal(t.shape).astype(np.float32) for t in (X, W))
        one = te.build([X, W], [h], target=replace(te.target("haswell"), threads=1))
        np.testing.assert_array_equal(kernel(x, w), one(x, w))
        np.testing.assert_allclose(kernel(x, w), x.astype(np.float64) @ w.T, rtol=1e-4, atol=1e-3)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 400), st.integers(1, 64), st.integers(1, 4))
def test_blocks_of_tiles_differ_by_one_tile_at_most(tiles, per_thread, threads):
    """tile_loops.block_of: the blocks cover the tiles in order, each once;
    any two blocks, and any two threads' equal runs of them, differ by a
    tile at most; an even split is written as a plain product."""
    from lowering.loop_ir import substitute
    from lowering.schedule.tile_loops import block_of

    blocks = min(per_thread * threads, tiles)
    b = var("b")
    first, n = block_of(tiles, b, blocks)
    starts = [substitute(first, {b: idx(v)}).value for v in range(blocks)]
    sizes = [substitute(n, {b: idx(v)}).value for v in range(blocks)]
    assert starts == list(np.cumsum([0] + sizes[:-1])) and sum(sizes) == tiles
    assert max(sizes) - min(sizes) <= 1
    if blocks % threads == 0:
        run = blocks // threads
        shares = [sum(sizes[t * run:(t + 1) * run]) for t in range(threads)]
        assert max(shares) - min(shares) <= 1
    assert ("//" in expr_text(first)) == (tiles % blocks != 0)


def test_a_ragged_root_is_weighed_by_its_work():
    """parallel_root.build over 49 blocks of 6 row tiles of 289 (the last
    1), each around 32 column tiles: counted alike 49 blocks over 2 threads
    (25 and 24) look balanced, weighed the runtime's equal chunks give 150
    and 139 tiles (96%), so the blocks take in the column tiles (147 and
    142); tile_loops.block_of's 49 blocks of 5 or 6 (147 and 142 too) stay
    the root."""
    from lowering.schedule.parallel_root import build
    from lowering.schedule.tile_loops import block_of

    b, jo, io = var("b"), var("jo"), var("io")
    body = Block((Store(Buffer("out", (1734, 32), "float32", "output"), add(mul(io, const(32)), jo), const(0.0)),))
    ragged = minimum(idx(6), add(idx(289), mul(b, idx(-6))))
    for extent, root in [(ragged, "b.jo"), (block_of(289, b, 49)[1], "b")]:
        tiles = For(b, idx(0), idx(49), Block((For(jo, idx(0), idx(32), Block((
            For(io, idx(0), extent, body),))),)))
        assert build([], tiles, threads=2).var.name == root


@pytest.mark.parametrize("rows, root", [(47, "parallel for i.j.o in 0..12032:"), (49, "parallel for i in 0..49:")])
def test_a_root_idling_a_thread_two_percent_is_collapsed(rng, rows, root):
    """47 rows over 2 threads keep one idle 1/48 of the time (97.9% busy,
    under ``BALANCED``): the rows take in the vector tiles inside; 49 rows
    (98.0%) stay the root.  The bits are one thread's."""
    A = te.placeholder((rows, 4096), "float32", "A")
    B = te.compute((rows, 4096), lambda i, j: te.exp(A[i, j]) * 2.0, name="B")
    kernel = te.build([A], [B], target=replace(te.target("haswell"), threads=2))
    assert [ln.strip() for ln in kernel.scheduled_ir.split("stage B:")[1].splitlines() if "parallel" in ln][0] == root
    if kernel.target.missing_on_host() is None:
        a = rng.standard_normal((rows, 4096)).astype(np.float32)
        one = te.build([A], [B], target=replace(te.target("haswell"), threads=1))
        np.testing.assert_array_equal(kernel(a), one(a))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=40), st.integers(1, 5))
def test_root_balance_models_the_runtime_split(work, threads):
    """parallel_root.balance: the threads' busy share when the runtime cuts a
    root into its equal chunks (runtime._chunks), each iteration weighing its work."""
    from lowering.schedule.parallel_root import balance

    chunks = runtime._chunks(len(work), threads, 1)
    most = max(sum(work[lo:hi]) for lo, hi in chunks)
    assert balance(work, threads) == (sum(work) / (most * threads) if most else 1.0)


# lanes of the gathering stages: rows 4 KiB apart put every lane's line in one L1 set
@pytest.mark.parametrize("target, row, lanes", [
    ("haswell", 1024, 8), ("skylake-avx512", 1024, 8), ("icelake-server", 1024, 8),
    ("haswell", 1000, 8), ("skylake-avx512", 1000, 16), ("icelake-server", 1000, 16)])
def test_gathers_keep_their_lanes_lines_within_the_l1_ways(rng, target, row, lanes):
    """A vector loop gathering along rows 4 KiB apart (1024 float32) touches
    one line per lane, all in one L1 set: it takes no more lanes than the set
    has ways (8 on these CPUs; 12 on Ice Lake, so 8 lanes there too).  Rows
    of 1000 elements spread the lines over many sets and keep the native
    vector.  Both a transposing copy and a reduction gathering across rows
    (every other element of a row, so not read as rows) follow the rule;
    the values match numpy on this machine."""
    n = 64
    A = te.placeholder((n, 2 * row), "float32", "A")
    H = te.placeholder((row, n), "float32", "H")
    T = te.compute((row, n), lambda i, j: A[j, 2 * i] * 2.0, name="T")
    r0, r1 = te.reduce_axis(row, "r0"), te.reduce_axis(n, "r1")
    s = te.compute((1,), lambda _: te.sum(A[r1, 2 * r0] * H[r0, r1], axis=[r0, r1]), name="s")
    a = rng.standard_normal((n, 2 * row)).astype(np.float32)
    h = rng.standard_normal((row, n)).astype(np.float32)
    for out in (T, s):
        kernel = te.build([A, H], [out], target=target)
        widths = {x.lanes for st in kernel.program.stages for x in walk(st.body) if isinstance(x, Simd)}
        assert widths == {lanes}, (out.name, widths)
        host = te.build([A, H], [out], target="host")
        got = host(a, h)
        if out is T:
            np.testing.assert_array_equal(got, a[:, ::2].T * 2.0)
        else:
            terms = a[:, ::2].T.astype(np.float64) * h      # a float32 sum: judged against the size of its terms
            np.testing.assert_allclose(got, [np.sum(terms)], rtol=1e-5, atol=1e-5 * np.sum(np.abs(terms)))


@pytest.mark.parametrize("target, dtype, lanes", [
    ("x86-64-v2", "float32", 8), ("haswell", "float32", 16), ("haswell", "float64", 8),
    ("skylake-avx512", "float32", 16), ("skylake-avx512", "float64", 8)])
def test_reads_contiguous_along_the_loop_inside_the_lanes_are_transposed_rows(rng, target, dtype, lanes):
    """The strided benchmark kernel's loss, ``sum A[2j + 1, i] H[i, j]``
    (1024 x 1024), in lanes along ``j``: ``A`` is strided across the lanes
    (rows 8 KiB apart) and contiguous along ``i``, the loop inside them.
    That loop is of kind ``transpose`` (rows loaded and transposed in
    registers, not gathered) and the lanes cover a cache line, two native
    vectors at most (SSE: 8 float32).  The sums match numpy for rows
    starting anywhere in a line (numpy's arrays, and views one element on),
    also for 1032 or 24 columns (on some targets lanes left over: a masked
    vector, which gathers)."""
    for nj, ni in ((1024, 1024), (1032, 1024), (24, 1024)):
        A = te.placeholder((2 * nj, ni), dtype, "A")
        H = te.placeholder((ni, nj), dtype, "H")
        i, j = te.reduce_axis(ni, "i"), te.reduce_axis(nj, "j")
        s = te.compute((1,), lambda _: te.sum(A[2 * j + 1, i] * H[i, j], axis=[i, j]), name="s")
        kernel = te.build([A, H], [s], target=target)
        if nj == ni:
            loops = [x for st in kernel.program.stages for x in walk(st.body)]
            assert [x.kind for x in loops if isinstance(x, For) and x.kind == "transpose"]
            assert {x.lanes for x in loops if isinstance(x, Simd)} == {lanes}
        run = kernel if kernel.target.missing_on_host() is None else te.build([A, H], [s], target="host")
        for offset in (0, 1):
            a = rng.standard_normal(2 * nj * ni + 1).astype(dtype)[offset:offset + 2 * nj * ni].reshape(2 * nj, ni)
            h = rng.standard_normal(ni * nj + 1).astype(dtype)[offset:offset + ni * nj].reshape(ni, nj)
            terms = a[1::2].T.astype(np.float64) * h
            tol = 1e-5 if dtype == "float32" else 1e-12
            np.testing.assert_allclose(run(a, h), [np.sum(terms)], rtol=tol, atol=tol * np.sum(np.abs(terms)))


@pytest.mark.parametrize("target, lanes", [("x86-64-v2", 4), ("haswell", 8), ("skylake-avx512", 8)])
def test_a_reduction_shorter_than_a_vector_takes_narrower_lanes(rng, target, lanes):
    """A loss summed over rows of 14 (a pooled feature map's width) runs its
    reduction in lanes along the rows: a native vector where 14 holds one
    (SSE, AVX2), half of one on AVX-512 (8 lanes, then 6), not a scalar loop
    (the max-pool benchmark kernel's loss, on the AMD EPYC Zen 4: 0.216 ->
    0.181 ms for the whole kernel).  The sum matches numpy."""
    X = te.placeholder((400, 14), "float32", "X")
    H = te.placeholder((400, 14), "float32", "H")
    a, b = te.reduce_axis(400, "a"), te.reduce_axis(14, "b")
    s = te.compute((1,), lambda _: te.sum(X[a, b] * H[a, b], axis=[a, b]), name="s")
    kernel = te.build([X, H], [s], target=target)
    assert {x.lanes for x in walk(stage(kernel, "s").body) if isinstance(x, Simd)} == {lanes}
    x, h = rng.standard_normal((2, 400, 14)).astype(np.float32)
    got = te.build([X, H], [s], target="host")(x, h)
    terms = x.astype(np.float64) * h                # a float32 sum: judged against the size of its terms
    np.testing.assert_allclose(got, [np.sum(terms)], rtol=1e-5, atol=1e-5 * np.sum(np.abs(terms)))


def _enclosing(body, name_start: str) -> list:
    """The names of the loops around each loop of ``body`` whose variable's
    name starts with ``name_start``, outermost first (one list per such loop)."""
    out = []

    def visit(s, around):
        if isinstance(s, Block):
            for x in s.stmts:
                visit(x, around)
        elif isinstance(s, (For, Simd)):
            if isinstance(s, For) and s.var.name.startswith(name_start):
                out.append(around)
            visit(s.body, around + [s.var.name])
        elif isinstance(s, If):
            visit(s.then, around)
            if s.else_ is not None:
                visit(s.else_, around)
    visit(body, [])
    return out


@pytest.mark.parametrize("rows, cols", [(512, 512), (37, 1000), (3, 70000), (2000, 56), (100, 33)])
def test_a_sum_without_gathers_reads_rows_in_address_order(rng, rows, cols):
    """A loss ``Σ C[r, c] H[r, c]`` runs in lanes along ``c``, its rows:
    with no gather, a row's whole vectors are added in turn and the rows go
    around them (the loop over vectors ``c.b`` inside the loop over ``r``),
    so the inputs are read in address order (C and H 512 x 512, one thread,
    AMD EPYC Zen 4: 75 -> 23.5 us, OpenBLAS's sdot 22.7).  The sums match
    numpy at the size of their terms: whole vectors, a masked rest, rows of
    one vector or less."""
    C = te.placeholder((rows, cols), "float32", "C")
    H = te.placeholder((rows, cols), "float32", "H")
    r, c = te.reduce_axis(rows, "r"), te.reduce_axis(cols, "c")
    s = te.compute((1,), lambda _: te.sum(C[r, c] * H[r, c], axis=[r, c]), name="s")
    kernel = te.build([C, H], [s])
    if cols >= 2 * kernel.target.lanes(4) and rows > 1:
        around = _enclosing(kernel.program.stages[0].body, "c.b")
        assert around and all(any(n.startswith("r") for n in names) for names in around), around
    x, h = rng.standard_normal((2, rows, cols)).astype(np.float32)
    terms = x.astype(np.float64) * h
    np.testing.assert_allclose(kernel(x, h), [np.sum(terms)], rtol=1e-5, atol=1e-5 * np.sum(np.abs(terms)))


def test_a_gathering_sum_keeps_its_vectors_loop_outermost(rng):
    """The other side of the rule above: ``Σ A[c, r] H[r, c]`` gathers ``A``
    along the lanes' loop ``c`` (rows 4 KiB apart), so the loop over vectors
    ``c.b`` stays outside the loop over ``r``, whose steps reuse the lines
    the gather brought in.  The sum matches numpy."""
    A = te.placeholder((1024, 1024), "float32", "A")
    H = te.placeholder((1024, 1024), "float32", "H")
    r, c = te.reduce_axis(1024, "r"), te.reduce_axis(1024, "c")
    g = te.compute((1,), lambda _: te.sum(A[c, r] * H[r, c], axis=[r, c]), name="g")
    kernel = te.build([A, H], [g])
    around = _enclosing(kernel.program.stages[0].body, "r")
    assert around and any(n.startswith("c.b") for n in around[0]), around
    a, h = rng.standard_normal((2, 1024, 1024)).astype(np.float32)
    terms = a.T.astype(np.float64) * h
    np.testing.assert_allclose(kernel(a, h), [np.sum(terms)], rtol=1e-5, atol=1e-5 * np.sum(np.abs(terms)))


def _residue_stages(kernel, name):
    """The stages computing residue classes of ``name`` (alone or in a row chain)."""
    return [st for st in kernel.program.stages if any(part.startswith(f"{name}%") for part in st.name.split("+"))]


def _residue_names(kernel, name):
    return [part for st in _residue_stages(kernel, name) for part in st.name.split("+") if part.startswith(f"{name}%")]


@pytest.mark.parametrize("target", ["haswell", "skylake-avx512"])
def test_a_strided_read_gradient_runs_one_stage_per_residue_class(rng, target):
    """``B[i, j] = A[3j + 1, i]``: zero elimination gives ``dA[r, c] =
    H[c, (r - 1) // 3]`` where ``r % 3 == 1``, else 0.  The schedule runs
    ``dA`` as three stages, ``r = 3w``, ``3w + 1`` and ``3w + 2``, none
    testing the residue: two zero fills and a copy reading ``H[c, w]``.  The
    rows of A (100) are not a multiple of 3, so the classes differ in
    length (34, 33, 33).  The gradient matches numpy exactly, and the loss."""
    A = te.placeholder((100, 40), "float32", "A")
    B = te.compute((40, 33), lambda i, j: A[3 * j + 1, i], name="B")
    H = te.placeholder((40, 33), "float32", "H")
    i, j = te.reduce_axis(40, "i"), te.reduce_axis(33, "j")
    loss = te.compute((1,), lambda _: te.sum(B[i, j] * H[i, j], axis=[i, j]), name="loss")
    (dA,) = te.gradient(loss, [A])
    kernel = te.build([A, H], [loss, dA], target=target)
    parts = _residue_stages(kernel, "dA")
    assert _residue_names(kernel, "dA") == ["dA%3=0", "dA%3=1", "dA%3=2"]
    assert not any(isinstance(s, If) and "% 3 ==" in expr_text(s.cond) for st in parts for s in walk(st.body))
    run = kernel if kernel.target.missing_on_host() is None else te.build([A, H], [loss, dA], target="host")
    a, h = rng.standard_normal((100, 40)).astype(np.float32), rng.standard_normal((40, 33)).astype(np.float32)
    got_loss, got = run(a, h)
    want = np.zeros_like(a)
    want[1::3][:33] = h.T
    np.testing.assert_array_equal(got, want)
    terms = a[1::3][:33].T.astype(np.float64) * h
    np.testing.assert_allclose(got_loss, [terms.sum()], rtol=1e-5, atol=1e-5 * np.abs(terms).sum())


def test_residue_classes_only_where_one_outer_loop_decides_the_test(rng):
    """The rule leaves a stage alone when the test is on the innermost output
    loop (the classes would store with a stride: ``y[r] = x[(r - 1) // 2]``
    for odd ``r``), when another loop's term is not a multiple of ``m``
    (``(r + c) % 2``), or when ``m`` is above ``MAX_RESIDUES``; all of them
    still compute numpy's values."""
    x = te.placeholder((64,), "float32", "x")
    X = te.placeholder((64, 48), "float32", "X")
    m = MAX_RESIDUES + 1
    cases = {
        "y": (te.compute((64,), lambda r: te.if_then_else(te.equal((r - 1) % 2, 0), x[(r - 1) // 2], 0.0), name="y"),
              lambda a: np.where(np.arange(64) % 2 == 1, a[np.maximum(np.arange(64) - 1, 0) // 2], 0)),
        "Y": (te.compute((64, 48), lambda r, c: te.if_then_else(te.equal((r + c) % 2, 0), X[r, c], 0.0), name="Y"),
              lambda a: np.where((np.arange(64)[:, None] + np.arange(48)) % 2 == 0, a, 0)),
        "Z": (te.compute((64, 48), lambda r, c: te.if_then_else(te.equal(r % m, 0), X[r, c], 0.0), name="Z"),
              lambda a: np.where(np.arange(64)[:, None] % m == 0, a, 0)),
    }
    for name, (T, numpy) in cases.items():
        inp = x if name == "y" else X
        kernel = te.build([inp], [T])
        assert not _residue_stages(kernel, name)
        a = rng.standard_normal(inp.shape).astype(np.float32)
        np.testing.assert_array_equal(kernel(a), numpy(a).astype(np.float32))


@settings(max_examples=12, deadline=None)
@given(m=st.integers(2, 4), offset=st.integers(-3, 3), rows=st.integers(2, 40), cols=st.integers(1, 20),
       scale=st.sampled_from([1, 2]), seed=st.integers(0, 2 ** 32 - 1))
def test_residue_classes_compute_the_same_values_as_one_stage(m, offset, rows, cols, scale, seed):
    """For any modulus, offset and shape, a stage split by residue classes of
    its rows stores what numpy computes: ``Y[r, c] = X[(s r + k) // m, c]``
    where ``(s r + k) % m == 0`` (s coprime to m), else ``X[r, c] + 1``;
    bit for bit, with the stage split whenever there are at least m rows."""
    if np.gcd(scale, m) != 1:
        scale = 1
    X = te.placeholder((rows, cols), "float32", "X")
    Y = te.compute((rows, cols), lambda r, c: te.if_then_else(
        te.equal((scale * r + offset) % m, 0), X[((scale * r + offset) // m) % rows, c], X[r, c] + 1.0), name="Y")
    kernel = te.build([X], [Y])
    assert len(_residue_names(kernel, "Y")) == (m if rows >= m else 0)
    a = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    r = np.arange(rows)[:, None]
    want = np.where((scale * r + offset) % m == 0, a[((scale * r[:, 0] + offset) // m) % rows], a + np.float32(1))
    np.testing.assert_array_equal(kernel(a), want)


def test_stages_of_one_template_split_by_residue_keep_their_own_names(rng):
    """Four computes that differ only in the slice they read, ``Y_t[r, c] =
    X[t, c, (r - 1) // 2]`` on odd rows, are one template (``share.py``),
    scheduled once: each instance gets the two residue stages under its own
    name (``Y2%2=1``, not the template's) and stores numpy's values."""
    X = te.placeholder((4, 16, 8), "float32", "X")
    outs = [te.compute((16, 16), lambda r, c, t=t: te.if_then_else(
        te.equal((r - 1) % 2, 0), X[t, c, (r - 1) // 2], 0.0), name=f"Y{t}") for t in range(4)]
    kernel = te.build([X], outs)
    names = [part for st in kernel.program.stages for part in st.name.split("+")]     # row chains join them
    assert names == [f"Y{t}%2={rho}" for t in range(4) for rho in range(2)]
    x = rng.standard_normal((4, 16, 8)).astype(np.float32)
    for t, got in enumerate(kernel(x)):
        want = np.zeros((16, 16), np.float32)
        want[1::2] = x[t].T
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------- interior split (interior_split.py)


def _interior_stages(kernel, name):
    return [st.name for st in kernel.program.stages if st.name.startswith(f"{name}.")]


def _stencil(n, taps):
    """``y[i] = sum_d w_d x[i + d]`` over the taps ``{d: w_d}`` and its gradient
    in ``x`` for a head ``H``: ``dx[j] = sum_d w_d H[j - d]`` where ``0 <= j - d < m``."""
    lo, hi = min(0, *taps), max(0, *taps)
    m = n - (hi - lo)
    x, H = te.placeholder((n,), "float32", "x"), te.placeholder((m,), "float32", "H")
    y = te.compute((m,), lambda i: sum(w * x[i + d - lo] for d, w in taps.items()), name="y")
    (dx,) = te.gradient(y, [x], head=H)
    return x, H, y, dx, lo


def _np_stencil_gradient(h, n, taps, lo):
    dx = np.zeros(n, np.float64)
    for d, w in taps.items():
        dx[d - lo:d - lo + len(h)] += w * h.astype(np.float64)
    return dx


@pytest.mark.parametrize("target", ["haswell", "skylake-avx512"])
def test_a_stencil_gradient_runs_its_interior_without_tests(rng, target):
    """The gradient of a 3-point stencil tests ``j >= 1``, ``j <= n - 2``...
    around its reads of the head; those hold away from both ends, so the
    stage runs as a border, an interior with no test, select or masked read,
    whose ends are multiples of a cache line, and a border.  The values
    match numpy's."""
    n, taps = 4099, {0: 0.25, 1: 0.5, 2: 0.25}
    x, H, y, dx, lo = _stencil(n, taps)
    kernel = te.build([x, H], [y, dx], target=target)
    assert _interior_stages(kernel, "dx") == ["dx.border0", "dx.interior", "dx.border1"]
    border0, interior, border1 = (stmt_text(st.body) for st in kernel.program.stages if st.name.startswith("dx."))
    assert " if " not in interior and "select(" not in interior and "select(" in border0
    line = kernel.target.alignment // 4                 # float32 elements in a cache line
    assert f"+ {line}]" in interior and f"+ {4096 // line * line}]" in border1     # interior: j in 16..4096
    run = kernel if kernel.target.missing_on_host() is None else te.build([x, H], [y, dx], target="host")
    a, h = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n - 2).astype(np.float32)
    got_y, got_dx = run(a, h)
    np.testing.assert_allclose(got_y, 0.25 * a[:-2] + 0.5 * a[1:-1] + 0.25 * a[2:], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got_dx, _np_stencil_gradient(h, n, taps, lo), rtol=1e-6, atol=1e-6)


def test_interior_split_only_where_it_removes_tests_from_most_of_the_loop(rng):
    """The rule leaves alone a stage whose element body runs a loop (a
    reduction), a test that is not an order comparison affine in the loop
    (``i * i < n``), and a loop too short for an interior of a whole line
    at least as long as its borders; each still computes numpy's values."""
    x = te.placeholder((200,), "float32", "x")
    k = te.reduce_axis(3, "k")
    cases = {
        "R": (te.compute((200,), lambda i: te.sum(te.if_then_else(i + k < 200, x[te.minimum(i + k, 199)], 0.0),
                                                   axis=k), name="R"),
              lambda a: np.array([a[i:i + 3].sum() for i in range(200)], np.float32)),
        "Q": (te.compute((200,), lambda i: te.if_then_else(i * i < 200, x[te.minimum(i * i, 199)], 0.0), name="Q"),
              lambda a: np.where(np.arange(200) ** 2 < 200, a[np.minimum(np.arange(200) ** 2, 199)], 0)),
        "S": (te.compute((200,), lambda i: te.if_then_else(i >= 90, x[te.maximum(i - 90, 0)], 0.0), name="S"),
              lambda a: np.where(np.arange(200) >= 90, a[np.maximum(np.arange(200) - 90, 0)], 0)),
    }
    for name, (T, numpy) in cases.items():
        kernel = te.build([x], [T])
        assert not _interior_stages(kernel, name), name
        a = rng.standard_normal(200).astype(np.float32)
        np.testing.assert_allclose(kernel(a), numpy(a).astype(np.float32), rtol=1e-6, atol=1e-6)


def test_a_first_element_case_is_decided_false_on_the_interior(rng):
    """``y[i] = x[i] * x[i - 1]`` for ``i > 0``, ``x[0]`` at ``i = 0``: its
    gradient tests ``j >= 1`` around one term and ``j <= 0`` around the other
    (in selects and around reads); on the interior the first holds and the
    second fails, so the interior stage runs neither, and the values match
    numpy's."""
    n = 1000
    x, H = te.placeholder((n,), "float64", "x"), te.placeholder((n,), "float64", "H")
    y = te.compute((n,), lambda i: te.if_then_else(i > 0, x[i] * x[i - 1], x[i]), name="y")
    (dx,) = te.gradient(y, [x], head=H)
    kernel = te.build([x, H], [dx])
    assert "dx.interior" in _interior_stages(kernel, "dx")
    interior = next(stmt_text(st.body) for st in kernel.program.stages if st.name == "dx.interior")
    assert " if " not in interior and "select(" not in interior
    a, h = rng.standard_normal(n), rng.standard_normal(n)
    want = h.copy()
    want[0], want[1:] = 0.0, h[1:] * a[:-1]
    want[0] += h[0]
    want[:-1] += h[1:] * a[1:]
    np.testing.assert_allclose(kernel(a, h), want, rtol=1e-12, atol=1e-12)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(4, 700), taps=st.dictionaries(st.integers(-4, 4), st.sampled_from([0.5, -1.25, 2.0]),
                                                    min_size=1, max_size=4),
       rows=st.sampled_from([None, 3]), seed=st.integers(0, 2 ** 32 - 1))
def test_interior_split_computes_the_stencil_gradient_of_any_shape(n, taps, rows, seed):
    """For any taps, length, and with or without an outer loop of rows, the
    gradient of a stencil (split into border, interior and border stages
    wherever the interior holds a cache line and is as long as the borders)
    matches numpy, and the interior stage never tests its loop."""
    lo, hi = min(0, *taps), max(0, *taps)
    if n - (hi - lo) < 1:
        n = hi - lo + 1
    m = n - (hi - lo)
    shape = (n,) if rows is None else (rows, n)
    x, H = te.placeholder(shape, "float32", "x"), te.placeholder(shape[:-1] + (m,), "float32", "H")
    y = te.compute(shape[:-1] + (m,), (lambda i: sum(w * x[i + d - lo] for d, w in taps.items())) if rows is None
                   else (lambda r, i: sum(w * x[r, i + d - lo] for d, w in taps.items())), name="y")
    (dx,) = te.gradient(y, [x], head=H)
    kernel = te.build([x, H], [dx])
    parts = [st for st in kernel.program.stages if st.name.startswith("dx.")]
    if n >= 80 and hi > lo:                 # a test at each end, an interior of several lines
        assert "dx.interior" in [st.name for st in parts]
    for st in parts:
        if st.name == "dx.interior":
            assert " if " not in stmt_text(st.body)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(np.float32)
    h = rng.standard_normal(shape[:-1] + (m,)).astype(np.float32)
    want = (_np_stencil_gradient(h, n, taps, lo) if rows is None else
            np.stack([_np_stencil_gradient(h[r], n, taps, lo) for r in range(rows)]))
    np.testing.assert_allclose(kernel(a, h), want, rtol=1e-5, atol=1e-5)


# ---------------------------------- reductions to one element split (split_reduction.py)


def _split_extents():
    """Extents on both sides of the split's thresholds: too little work (though a
    multiple of every part count), just enough, enough but prime (no part
    count divides it)."""
    work, parts = SPLIT_MIN_WORK, SPLIT_PARTS
    multiple = int(np.lcm.reduce(parts))
    below = (work - 1) // multiple * multiple
    prime = next(n for n in range(work + 1, 2 * work) if all(n % d for d in range(2, int(n ** 0.5) + 1)))
    return [(below, False), (work, True), (prime, False)]


@pytest.mark.parametrize("n,splits", _split_extents())
@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
@pytest.mark.parametrize("op", ["max", "min"])
def test_the_gradient_of_a_max_or_min_to_one_element_at_every_extent(rng, n, splits, shape, op):
    """max/min of a long vector into a tensor of one element (a loss, lse's
    scalar): the reduction is split into parts exactly when the rule says so,
    and the gradient is one at the first extreme element (ties included)."""
    x = te.placeholder((n,), "float32", "x")
    k = te.reduce_axis(n, "k")
    red = te.max if op == "max" else te.min
    m = te.compute(shape, lambda *_: red(x[k], axis=k), name="m")
    dx, = te.gradient(m, [x])
    kernel = te.build([x], [m, dx])
    assert (".parts" in kernel.scheduled_ir) == splits
    xs = np.round(rng.standard_normal(n) * 8).astype(np.float32)       # many ties at the extremes
    got_m, got_dx = kernel(xs)
    first = int(np.argmax(xs) if op == "max" else np.argmin(xs))
    want = np.zeros(n, np.float32)
    want[first] = 1
    np.testing.assert_array_equal(got_m, np.full(shape, xs[first]))
    np.testing.assert_array_equal(got_dx, want)


def _row_times_matrix(k, m, dtype, where=None):
    """``y[j] = sum_r x[r] A[r, j]`` over ``m`` columns: no row to tile, one
    accumulator per vector; ``where`` adds a float test to the summand."""
    x = te.placeholder((k,), dtype, "x")
    A = te.placeholder((k, m), dtype, "A")
    r = te.reduce_axis(k, "r")
    term = (lambda j: x[r] * A[r, j]) if where is None else (lambda j: te.if_then_else(A[r, j] > 0.0, x[r], 0.0))
    return x, A, te.compute((m,), lambda j: te.sum(term(j), axis=r), name="y")


@pytest.mark.parametrize("target", ["x86-64-v2", "haswell", "skylake-avx512"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_sum_with_too_few_accumulators_runs_several_chains(rng, target, dtype):
    """One vector of outputs summing a long reduction keeps one accumulator:
    its innermost loop feeds ``ACCUMULATORS`` partial sums in turn (a
    reduction of exactly that many steps, and the steps left over of a
    longer one, on each target), added to it at the end; numpy's sums to
    the float error bound.  A reduction one step shorter keeps one chain,
    and so does a register tile with as many accumulators."""
    lanes = te.target(target).lanes(np.dtype(dtype).itemsize)
    eps = np.finfo(dtype).eps
    for k, split in ((ACCUMULATORS - 1, False), (ACCUMULATORS, True), (5 * ACCUMULATORS + 3, True)):
        x, A, y = _row_times_matrix(k, lanes, dtype)
        ir = str(lower_for([x, A], [y], target=target).scheduled)
        assert (".p1" in ir) == split, (k, ir)
        run = te.build([x, A], [y], target=target if te.target(target).missing_on_host() is None else "host")
        xs, a = rng.standard_normal(k).astype(dtype), rng.standard_normal((k, lanes)).astype(dtype)
        bound = k * eps * (np.abs(xs) @ np.abs(a)) + np.finfo(dtype).tiny
        assert np.all(np.abs(run(xs, a) - xs.astype(np.float64) @ a) <= bound)
    A, B, C = matmul(2 * blocking(te.target(target)).tile_rows, 4 * ACCUMULATORS, 2 * lanes, dtype)
    assert ".p1" not in str(lower_for([A, B], [C], target=target).scheduled)


def _column_sum(rows, cols, dtype):
    """``s[j] = Σ_i a[i, j]``: a vector loop with no row to tile."""
    a = te.placeholder((rows, cols), dtype, "a")
    i = te.reduce_axis(rows, "i")
    return a, te.compute((cols,), lambda j: te.sum(a[i, j], axis=i), name="s")


def _vector_lanes(program, name):
    return {s.lanes for st in program.stages if st.name == name for s in walk(st.body) if isinstance(s, Simd)}


@pytest.mark.parametrize("target", ["x86-64-v2", "haswell", "skylake-avx512"])
def test_column_sums_run_neighbouring_columns_side_by_side(rng, target):
    """A column sum over 64 native vectors of columns takes ``ACCUMULATORS``
    vectors side by side (chains enough, each column summed in the written
    order: bit-identical to adding the rows in turn in float32, no partial
    sums); two vectors of columns (one column tile per thread, no more) and
    a row of an odd number of vectors (no whole wide vectors) keep one
    vector and take partial sums instead."""
    t = te.target(target)
    lanes = t.lanes(4)
    wide = min(ACCUMULATORS, 64 // t.threads)
    a, s = _column_sum(1000, 64 * lanes, "float32")
    program = lower_for([a], [s], target=target).scheduled
    assert _vector_lanes(program, "s") == {wide * lanes} and ".p1" not in str(program)
    run = te.build([a], [s], target=target if t.missing_on_host() is None else "host")
    x = rng.standard_normal(a.shape).astype(np.float32)
    want = np.zeros(a.shape[1], np.float32)
    for row in x:
        want += row
    np.testing.assert_array_equal(run(x), want)
    for cols in (2 * lanes, 5 * lanes):
        a, s = _column_sum(1000, cols, "float32")
        program = lower_for([a], [s], target=target).scheduled
        if cols == 5 * lanes or t.threads > 1:
            assert _vector_lanes(program, "s") == {lanes} and ".p1" in str(program), cols


def test_a_sum_of_compared_values_keeps_its_one_chain():
    """A summand that compares floats is computed as written: no partial sums."""
    x, A, y = _row_times_matrix(4 * ACCUMULATORS, 8, "float32", where=True)
    assert ".p1" not in str(lower_for([x, A], [y]).scheduled)


def test_partial_sums_wait_for_a_sum_read_or_changed_inside_its_loops():
    """A sum scaled between the steps of an outer loop (``acc = acc * 2``
    after each inner loop) is only complete in the written order: its loops
    stay one chain, while the same nest without that statement is split."""
    x = Buffer("x", (64, 64), "float32", "input")
    acc, r1, r2 = Local("acc", "float32"), var("r1"), var("r2")
    step = Assign(acc, add(acc, BufLoad(x, add(mul(r1, idx(64)), r2))))
    inner = For(r2, idx(0), idx(64), Block((step,)))

    j = var("j")

    def plan(*after):
        body = Block((Alloc(acc, const(0.0, "float32")), For(r1, idx(0), idx(64), Block((inner,) + after))))
        return TilePlan(body, x, [], {}, j, 8, 8, var("j.l"), var("j.t"), ())
    bl = blocking(te.target("haswell"))
    nest = Nest([For(j, idx(0), idx(8), Block(()))], Block(()))
    scaled = plan(Assign(acc, mul(acc, const(2.0, "float32"))))
    assert sum_chains.decide(scaled, nest, bl) is scaled
    assert "acc.p1" in stmt_text(sum_chains.decide(plan(), nest, bl).body)


def test_a_stored_sum_another_stage_compares_keeps_its_one_chain():
    """A relu's ``y > 0`` of a stored sum ``y`` decides on the written sum: a
    kernel recomputing ``y`` where it compares it (a gradient kernel) must
    decide alike, so ``y`` gets no partial sums when a stage compares it, and
    gets them when none does."""
    x, A, y = _row_times_matrix(8 * ACCUMULATORS, 8, "float32")
    z = te.compute(y.shape, lambda j: te.if_then_else(y[j] > 0.0, y[j], 0.0), name="z")
    assert ".p1" in str(lower_for([x, A], [y], target="haswell").scheduled)
    assert ".p1" not in str(lower_for([x, A], [y, z], target="haswell").scheduled)


@pytest.mark.parametrize("steps", ["below", "above"])
def test_a_reduction_over_a_nest_of_loops_is_k_blocked_along_its_outer_loop(rng, steps):
    """``C[i, j] = sum_{a, b} A[i, a, b] B[a, b, j]``: a reduction of two loops
    longer than ``k_block_min`` is cut into K blocks along ``a`` (each block
    whole iterations of ``a``), as one loop of that many steps is; one of
    ``k_block_min`` steps is not.  numpy's products either way."""
    bl = blocking(te.target())
    b = 4
    a = 3 * bl.k_block // b - 17 if steps == "above" else Blocking.k_block_min(bl.k_block) // b
    A = te.placeholder(((PACK_MIN_REUSE - 1) * bl.tile_rows, a, b), "float32", "A")
    B = te.placeholder((a, b, 40), "float32", "B")
    ra, rb = te.reduce_axis(a, "ra"), te.reduce_axis(b, "rb")
    C = te.compute((A.shape[0], 40), lambda i, j: te.sum(A[i, ra, rb] * B[ra, rb, j], axis=[ra, rb]), name="C")
    kernel = te.build([A, B], [C])
    assert ("k.b" in kernel.scheduled_ir) == (steps == "above")
    x = rng.standard_normal(A.shape).astype(np.float32) * 0.05
    y = rng.standard_normal(B.shape).astype(np.float32) * 0.05
    want = x.reshape(len(x), -1).astype(np.float64) @ y.reshape(a * b, 40)
    np.testing.assert_allclose(kernel(x, y), want, rtol=2e-5, atol=2e-6)


def test_a_scans_step_never_streams_the_slice_the_next_step_reads(rng):
    """A scan's state beyond the caches is written a step at a time by the
    stage that reads the step before: it stays cached."""
    n = 1 << 14
    T = -(-stream_beyond_bytes(te.target()) // (4 * n)) + 1
    X, a, S = (te.placeholder(s, "float32", name) for s, name in (((T, n), "X"), ((n,), "a"), ((T, n), "S")))
    init = te.compute((1, n), lambda t, i: X[0, i], name="init")
    upd = te.compute((T, n), lambda t, i: a[i] * S[t - 1, i] + X[t, i], name="upd")
    Y = te.scan(init, upd, S, inputs=[X], name="Y")
    assert 4 * T * n >= stream_beyond_bytes(te.target())
    kernel = te.build([X, a], [Y])
    steps = [k for k, st in enumerate(kernel.program.stages) if st.step is not None]
    assert steps and all("!nontemporal" not in stage_llvm(kernel, k) for k in steps)
    xs, av = rng.standard_normal((T, n)).astype(np.float32), (rng.random(n) * 0.9).astype(np.float32)
    want = xs.astype(np.float64).copy()
    for t in range(1, T):
        want[t] = av * want[t - 1] + xs[t]
    np.testing.assert_allclose(kernel(xs, av), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [2, 3])
def test_a_sum_over_a_group_of_heads_is_an_offset_loop_and_packs_its_operand(rng, group):
    """Grouped-query attention's ``V[a // g]``: the gradient sums over the
    heads of a group, ``for a in g v..g v + g`` (bounds read the output's
    group ``v``).  Over offsets ``a = g v + d``, ``d`` in ``0..g``, the loop no
    longer depends on the output, so the other operand is read from packed
    panels as in any product (``T`` makes ``H`` larger than the target's
    ``panel_min_bytes``, which packing asks of an operand).  Values as numpy's."""
    h, d = 2 * group, 32
    T = max(96, -(-blocking(te.target()).panel_min_bytes // (h * d * 4 * 32)) * 32)
    A = te.placeholder((h, T, T), "float32", "A")
    V = te.placeholder((h // group, T, d), "float32", "V")
    j = te.reduce_axis(T, "j")
    O = te.compute((h, T, d), lambda a, i, c: te.sum(A[a, i, j] * V[a // group, j, c], axis=j), name="O")
    H = te.placeholder((h, T, d), "float32", "H")
    dV, = te.gradient(O, [V], head=H)
    kernel = te.build([A, V, H], [dV])
    text = kernel.scheduled_ir.split(f"stage {dV.name}:")[1]
    assert re.search(rf"for \S+\.d in 0\.\.{group}:", text) and ".packed[" in text, text[:1500]
    a, v, hh = (rng.standard_normal(s.shape).astype(np.float32) for s in (A, V, H))
    want = np.einsum("aij,aic->ajc", a.astype(np.float64), hh.astype(np.float64))
    want = want.reshape(h // group, group, T, d).sum(1)
    np.testing.assert_allclose(kernel(a, v, hh), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
