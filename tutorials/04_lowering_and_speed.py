"""Tutorial 04: from loop nests to fast native code, and how fast it is.

`te.build` turns tensors into a loop IR program (one *stage* per stored
tensor: a loop nest over its elements), then `lowering/fuse.py` merges
stages that walk the same domain and `lowering/schedule/` rewrites every
stage for speed -- automatically, for the CPU it compiles for, there is
nothing to tune -- and LLVM compiles the result (`lowering/pipeline.py`
runs these steps in this order).  We follow a convolution gradient through
the schedule, see how the register tile follows from the CPU, watch fusion
put an elementwise forward, loss and gradient into one pass, time both
against numpy, see where the time goes stage by stage, and learn to read
the benchmark table.

Run it:  python tutorials/04_lowering_and_speed.py
"""
import pathlib
import time

import numpy as np

import te_autodiff as te
from lowering.lower import lower
from lowering.pipeline import schedule_program

rng = np.random.default_rng(0)


def conv2d(n, c, size, f, k=3, pad=1):
    """NCHW convolution with zero padding, written as index formulas."""
    X = te.placeholder((n, c, size, size), name="X")
    W = te.placeholder((f, c, k, k), name="W")
    Xp = te.compute((n, c, size + 2 * pad, size + 2 * pad), lambda a, b, y, x: te.if_then_else(
        te.all(y >= pad, y < size + pad, x >= pad, x < size + pad), X[a, b, y - pad, x - pad], 0.0),
        name="Xp")
    rc, ry, rx = te.reduce_axis(c, "rc"), te.reduce_axis(k, "ry"), te.reduce_axis(k, "rx")
    Y = te.compute((n, f, size, size), lambda a, o, y, x: te.sum(
        Xp[a, rc, y + ry, x + rx] * W[o, rc, ry, rx], axis=[rc, ry, rx]), name="Y")
    H = te.placeholder(Y.shape, name="H")               # the head: loss = sum(Y * H)
    dX, dW = te.gradient(Y, [X, W], head=H)
    return [X, W, H], [Y, dX, dW]


def best_ms(fn, reps=30):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * min(times)


def stage_text(program, name, limit=None):
    lines = program.text().splitlines()
    start = lines.index(f"stage {name}:")
    end = next((k for k in range(start + 1, len(lines)) if lines[k].startswith(("stage ", "return"))),
               len(lines))
    body = lines[start:end]
    if limit and len(body) > limit:
        body = body[:limit] + [f"  ... ({len(body) - limit} more lines)"]
    return "\n".join(body)


# Step 1 -- the data gradient of a convolution, as lowered.  Zero elimination
# made it a gather: each element of dX sums only the (output, filter) pairs
# that touch it, so the y'/x' loops have bounds that depend on the element
# (max(0, i2 - 2) ...).  Fine for a scalar loop, bad for vector lanes.
inputs, outputs = conv2d(2, 8, 10, 8)
plain = lower(inputs, outputs)
grad_stage = next(st.name for st in plain.stages if st.name.startswith("dX"))
print("Step 1: the gradient stage as lowered (lower(...))")
print(stage_text(plain, grad_stage))

# Step 2 -- the same stage after the schedule.  What the rules did:
#  * offset loops: `for y' in max(0, i2-2)..` became `for y'.d in 0..3` with
#    a test `if 0 <= y' < 10`: the bounds no longer depend on the element;
#  * vector axis: the axis whose reads are contiguous or shared (broadcast)
#    runs in one native vector of float32 lanes (`simd[8]` on AVX2,
#    `simd[16]` on AVX-512: step 3 shows both); the tail of a row is masked;
#  * packing: the filter, read with stride 9 along that axis, is copied once
#    into a transposed temporary (the new `W.packed` stage) so the lanes
#    read it with unit stride;
#  * register tile: several rows share one reduction loop, each loaded
#    vector is used by every row and the accumulators stay in registers;
#  * parallel root: the outermost tile loop is split across threads;
#  * fusion (before all that): dX only copies dXp without its border, so
#    dXp is computed inside dX, for the elements dX reads: one stage named
#    after both, `dXp+dX` (step 4 shows fusion on its own).
here = te.target()
scheduled = schedule_program(plain, here)
print(f"\nStep 2: the stages after fusion and the schedule, for this machine ({here.cpu})")
print("  stages:", ", ".join(st.name for st in scheduled.stages))
print(stage_text(scheduled, "dXp+dX", limit=40))

# Step 3 -- the target.  Every figure of the schedule comes from one
# description of the CPU, `te.target()` (this machine, or the TE_TARGET
# environment variable, or `te.build(..., target="haswell")`): the vector
# width gives the lanes, the number of vector registers the register tile.
# A tile of MR rows x 2 vectors keeps MR*2 accumulators in registers, plus
# the 2 vectors loaded and 1 value broadcast per reduction step: with 16
# registers (AVX2) that allows 6 rows, with 32 (AVX-512) 8 (more rows would
# only add remainder code).  The rows are then cut evenly: as few tiles as
# that many rows need, each as short as that count allows (28 columns on
# AVX-512: 7 + 7 + 7 + 7, not 8 + 8 + 8 + 4, whose last tile would hold too
# few accumulators to keep the multiply-add units busy).  The same gradient,
# scheduled for both:
from lowering.schedule import TILE_VECTORS, blocking  # noqa: E402
from lowering.schedule.register_tile import rows_per_tile  # noqa: E402



def largest_tile(program, name):
    """The lines of the vector loop in stage ``name`` that keeps the most
    accumulators (its register tile), and that number."""
    lines = stage_text(program, name).splitlines()
    best = (0, [])
    for k, line in enumerate(lines):
        if "simd[" in line:
            accs = 0
            while k + 1 + accs < len(lines) and lines[k + 1 + accs].strip().endswith("= 0.0"):
                accs += 1
            best = max(best, (accs, lines[k:k + 1 + accs + 3]), key=lambda b: b[0])
    return best


print("\nStep 3: targets")
print(f"  this machine: {here}")
inputs3, outputs3 = conv2d(8, 32, 28, 32)        # the benchmark's convolution, 28 output columns
plain3 = lower(inputs3, outputs3)
columns = {}
for name in ("haswell", "skylake-avx512"):
    t = te.target(name)
    bl = blocking(t)
    accs, tile = largest_tile(schedule_program(plain3, t), "Y")
    print(f"  {name:15s} {t.vector_bytes}-byte vectors, {t.vector_registers} registers -> "
          f"simd[{t.lanes(4)}], register tile at most {bl.tile_rows} x {TILE_VECTORS} vectors "
          f"({accs} accumulators in the forward conv), K blocks of {bl.k_block} steps "
          f"({bl.k_block_panel} from a panel)")
    assert accs == rows_per_tile(28, bl.tile_rows) * TILE_VECTORS
    columns[name] = [line.strip()[:56] for line in tile]
print(f"\n  {'haswell (AVX2)':60s}skylake-avx512 (AVX-512)")
for k in range(max(map(len, columns.values()))):
    left, right = (col[k] if k < len(col) else "" for col in columns.values())
    print(f"  {left:60s}{right}")
for name in ("haswell", "skylake-avx512"):
    k_ = te.build(inputs, outputs, target=name)
    runs_here = te.target(name).missing_on_host() is None
    fma = sum("vfmadd" in line for line in k_.asm.splitlines())
    print(f"  {name}: {fma} vfmadd instructions in kernel.asm"
          f"{'' if runs_here else ' (cross-compiled: this machine cannot run it)'}")

# Step 4 -- every schedule computes each element with the same operations
# whatever the thread count, so results are bit-identical run to run.
kernel = te.build(inputs, outputs)
arrays = [rng.standard_normal(t.shape).astype("float32") for t in inputs]
from lowering import runtime  # noqa: E402  (thread count: TE_NUM_THREADS, default 2)
runs = []
for threads in (1, 2):
    runtime.set_num_threads(threads)
    runs.append(kernel(*arrays))
runtime.set_num_threads(2)
same = all(np.array_equal(a, b) for a, b in zip(*runs))
print(f"\nStep 4: 1 thread and 2 threads give bit-identical results: {same}")
assert same

# Step 5 -- fusion.  The loss sum(tanh(sigmoid(x)*exp(-x*x)) * H) and its
# gradient lower to three stages: y (stored, two stages read it), the loss
# and dx.  Fusion (rule 1, siblings) runs dx inside the loss's reduction
# loop, both reading x and H at the same point; then y has one reader, at
# its own index, and is computed there (rule 2): one pass reads x and H once
# and writes dx, y never touches memory, and LLVM computes the parts of y
# the gradient shares (sigmoid(x), exp(-x*x)) once.
n = 1 << 18
x_ = te.placeholder((n,), name="x")
h_ = te.placeholder((n,), name="H")
y_ = te.compute((n,), lambda i: te.tanh(te.sigmoid(x_[i]) * te.exp(-x_[i] * x_[i])), name="y")
r_ = te.reduce_axis(n, "r")
loss_ = te.compute((1,), lambda _: te.sum(y_[r_] * h_[r_], axis=r_), name="loss")
dx_, = te.gradient(y_, [x_], head=h_)
plain = lower([x_, h_], [loss_, dx_])
apart, fused = schedule_program(plain, te.target(), fusion=False), schedule_program(plain, te.target())
print("\nStep 5: fusion")
print("  stages without fusion:", ", ".join(st.name for st in apart.stages),
      f"(temporaries: {apart.temp_bytes} bytes)")
print("  stages with fusion:   ", ", ".join(st.name for st in fused.stages),
      f"(temporaries: {fused.temp_bytes} bytes)")
print(stage_text(fused, fused.stages[0].name, limit=16))
xs, hs = rng.standard_normal(n).astype("float32"), rng.standard_normal(n).astype("float32")
timings = {}
for label, program in (("apart", apart), ("fused", fused)):
    k_ = runtime.Kernel(program, runtime.compile_program(program, te.target()), [x_, h_], [loss_, dx_], plain)
    timings[label] = best_ms(lambda: k_(xs, hs))
print(f"  {n} elements: {timings['apart']:.3f} ms apart, {timings['fused']:.3f} ms fused")

# Step 6 -- timing against numpy on the benchmark's convolution (8x32x28x28,
# 32 filters of 3x3): te runs forward + both gradients in one call; numpy
# uses im2col and three matrix products (OpenBLAS sgemm).
inputs, outputs = conv2d(8, 32, 28, 32)
t0 = time.perf_counter()
kernel = te.build(inputs, outputs)
build_s = time.perf_counter() - t0
x, w, h = (rng.standard_normal(t.shape).astype("float32") for t in inputs)


def numpy_conv(x, w, h):
    n, c, size, _ = x.shape
    f, _, k, _ = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, :, dy:dy + size, dx:dx + size] for dy in range(k) for dx in range(k)], 2)
    cols = cols.transpose(1, 2, 0, 3, 4).reshape(c * k * k, n * size * size)      # (c k k, n y x)
    w2 = w.reshape(f, c * k * k)
    y = (w2 @ cols).reshape(f, n, size, size).transpose(1, 0, 2, 3)
    h2 = h.transpose(1, 0, 2, 3).reshape(f, -1)
    dw = (h2 @ cols.T).reshape(w.shape)
    dcols = (w2.T @ h2).reshape(c, k, k, n, size, size)
    dxp = np.zeros((n, c, size + 2, size + 2), x.dtype)
    for dy in range(k):
        for dx in range(k):
            dxp[:, :, dy:dy + size, dx:dx + size] += dcols[:, dy, dx].transpose(1, 0, 2, 3)
    return y, dxp[:, :, 1:-1, 1:-1], dw


te_ms, np_ms = best_ms(lambda: kernel(x, w, h)), best_ms(lambda: numpy_conv(x, w, h))
for got, want in zip(kernel(x, w, h), numpy_conv(x, w, h)):
    assert np.allclose(got, want, rtol=1e-3, atol=1e-3)
flops = 3 * 2 * 8 * 32 * 28 * 28 * 32 * 9
print(f"\nStep 6: conv2d forward + 2 gradients (build {build_s:.2f} s)")
print(f"  te-autodiff {te_ms:7.3f} ms  ({flops / te_ms / 1e6:6.1f} GFLOP/s)")
print(f"  numpy       {np_ms:7.3f} ms  ({flops / np_ms / 1e6:6.1f} GFLOP/s)")
print("  (best of 30 calls; on a busy machine every timing is noisy)")

# Step 7 -- where the time goes.  `kernel.profile(x, w, h)` runs the kernel
# once (filling its temporaries), then each stage of the scheduled program
# alone, a few times, and keeps each one's least time.  The names are those
# of `kernel.scheduled_ir`: `Xp` pads the input (on some targets inside
# `Y`'s stage, then named `Xp+Y`), `W.packed` and `H.packed` copy operands
# into panels the products read contiguously, `dXp+dX` is the data gradient
# computed only where `dX` reads it (the padding's border is never
# computed), and the weight gradient runs as K-block partial sums
# (`dW.sums`) that `dW` adds up.  `te.cost` counts each fused stage's
# innermost iterations (`["built"]["stage_iterations"]`): for a product,
# its multiply-adds, so the products' own GFLOP/s follow.
work = dict(te.cost(inputs, outputs)["built"]["stage_iterations"])
entries = kernel.profile(x, w, h)
print("\nStep 7: where the time goes, each stage alone")
for entry in entries:
    print(f"  {entry.name:9s} {entry.seconds * 1e3:7.3f} ms  on {entry.threads} thread(s)")
for product in ("Y", "dXp+dX", "dW"):        # dW.sums is part of dW; where Y pads as it reads, its stage is Xp+Y
    seconds = sum(e.seconds for e in entries if product in (e.name.split(".")[0], e.name.split("+")[-1]))
    print(f"  {product:9s} {2 * work[product] / seconds / 1e9:6.1f} GFLOP/s")

# Step 8 -- the benchmark table.  `python -m benchmarks` (peers: `pip install
# -e .[bench]`) runs fifteen forward + backward kernels in te-autodiff, numpy,
# JAX and PyTorch, each peer in its own process, and writes
# benchmarks/<isa>/RESULTS.md, one report per instruction set (avx2,
# avx512; the AVX2 one, measured on an AVX-512 machine, keeps the peers to
# AVX2 too and says which).  How to read it:
#  * "Machine" states the CPU, the target te-autodiff compiled for and the
#    load average -- a loaded machine makes every figure noisy; "Peaks" the
#    limits measured in the same run: the FMA peak GFLOP/s (the roof for
#    GEMM-like kernels, from a generated loop of FMAs), the best BLAS GEMM
#    (a peer's figure) and copy GB/s (the roof for memory-bound ones);
#  * the main table gives the median ms per peer, the fastest peer, and
#    "peer / te" (> 1: te-autodiff is faster), the compile time, whether the
#    result matched the float64 reference ("ok"), and the rate as a fraction
#    of the machine's limit ("te of limit");
#  * the geometric mean of peer / te summarises the fifteen kernels.
isa = {64: "avx512", 32: "avx2"}.get(here.vector_bytes, "sse") if here.x86 else "neon"
results = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / isa / "RESULTS.md"
print(f"\nStep 8: reading benchmarks/{isa}/RESULTS.md (the report for this machine's instruction set)")
if results.exists():
    lines = results.read_text().splitlines()
    rows = lines[next(k for k, ln in enumerate(lines) if ln.startswith("|")):]
    table = rows[:next((k for k, ln in enumerate(rows) if not ln.startswith("|")), len(rows))]   # the first table
    summary = [ln for ln in lines if ln.startswith("**Geometric mean")]
    print("\n".join(table + summary))
else:
    print("  (not generated yet: run python -m benchmarks)")
