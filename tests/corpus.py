"""A corpus of te programs compiled to machine code for one target, in a child process.

``python tests/corpus.py TARGET`` builds every program of :func:`corpus` with
``te.build(..., target=TARGET)``, forces LLVM's code generator to run
(``kernel.asm``) and checks the result: the assembly is for the target's
instruction set and no masked vector operation, in the IR te emits or in the
optimised IR, is wider than the target's native vector (LLVM 22.1's code
generator can abort on those).  When this machine can run TARGET,
a sample of the programs is also run and compared with the same program
built for ``"host"``.  It prints ``BEGIN name`` / ``END name`` around every
program (an LLVM abort kills the process: the last ``BEGIN`` names the
program) and finally ``RESULT {json}``.  Further arguments restrict the run
to the named programs, ``--sample`` to the programs that are run (every
fifth: where the machine runs TARGET, the code is checked by running it,
and building the rest adds only compile time, which emulation multiplies);
``TE_CORPUS_ABORT=name`` makes the child abort at that program (to test the
harness).  ``tests/test_targets.py`` runs one such child per target.

The programs (each ``(inputs, outputs)``, gradients included):

* the benchmark kernels (``benchmarks/kernels.py``): loss and gradients,
  built by ``Kernel.te_program`` as the benchmark runner builds them;
* NN layers from ``test_gradient_nn.py`` / ``conftest.py`` (dense, strided
  and dilated conv with guarded padding, max/avg pooling, softmax, MLP with
  int labels, gathers, residual blocks, second order), in float64 and float32,
  plus layers at odd sizes whose vector loops end in masked tails;
* every operator case of ``test_gradient_ops.py`` in float64 (some in
  float32 too), some of its index patterns and strided/dilated 1-D convolutions;
* random programs of the zero-elimination property generator
  (``test_zero_elim_property.programs``, drawn by hypothesis with a fixed
  seed), its known patterns and two-stage pipelines.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _p in (HERE, ROOT):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import te_autodiff as te  # noqa: E402

F32, F64 = "float32", "float64"
RANDOM_PROGRAMS = 24        # drawn from the zero-elimination generator
RANDOM_PIPELINES = 6
SEED = 20240611


@dataclass
class Built:
    inputs: list
    outputs: list
    data: Callable | None = None      # rng -> arrays in ``inputs`` order (None: not run)


@dataclass
class Entry:
    name: str
    build: Callable                   # () -> Built


def _normal_data(inputs, ints=None):
    """rng -> standard normal floats for each placeholder; ``ints`` maps an int
    placeholder's name to the exclusive upper bound of its values."""
    ints = ints or {}

    def data(rng):
        return [rng.integers(0, ints[t.name], t.shape).astype(t.dtype) if t.dtype.startswith("int")
                else rng.standard_normal(t.shape).astype(t.dtype) for t in inputs]
    return data


def with_grad(out, inputs, wrt=None, head=True, extra=(), ints=None, data=None):
    """``Built`` for ``out`` and its gradients wrt ``wrt`` (default: the float
    inputs), with a head placeholder ``H`` unless ``head`` is false."""
    wrt = [t for t in inputs if t.dtype.startswith("float")] if wrt is None else list(wrt)
    ins = list(inputs)
    if head:
        H = te.placeholder(out.shape, out.dtype, "H")
        grads = te.gradient(out, wrt, head=H)
        ins.append(H)
    else:
        grads = te.gradient(out, wrt)
    return Built(ins, [out, *extra, *grads], data or _normal_data(ins, ints))


# ------------------------------------------------------------------ (a) benchmarks


def _benchmark(kernel):
    def build():
        return Built(*kernel.te_program(te), lambda rng: kernel.arrays(rng))
    return Entry(f"bench/{kernel.key}", build)


def benchmark_entries():
    from benchmarks.kernels import KERNELS
    return [_benchmark(k) for k in KERNELS.values()]


# ------------------------------------------------------------------ (b) NN layers


def nn_entries():
    import conftest
    import test_gradient_nn as nn

    out = []

    def add(name, build):
        out.append(Entry(f"nn/{name}", build))

    def dense(dtype, n, d, m):
        def build():
            X, W, b = te.placeholder((n, d), dtype, "X"), te.placeholder((m, d), dtype, "W"), \
                te.placeholder((m,), dtype, "b")
            return with_grad(nn.dense_relu(X, W, b), [X, W, b])
        return build

    for dtype in (F64, F32):
        add(f"dense_relu_4x5x3_{dtype}", dense(dtype, 4, 5, 3))
        add(f"dense_relu_37x53x29_{dtype}", dense(dtype, 37, 53, 29))

    def conv(xs, ws, s, d, p, inline, dtype=F64):
        def build():
            X, Wt = te.placeholder(xs, dtype, "X"), te.placeholder(ws, dtype, "Wt")
            return with_grad(nn.conv2d(X, Wt, s, d, p, inline=inline), [X, Wt])
        return build

    for s, d, p in [(1, 1, 0), (1, 1, 1), (2, 2, 1), (3, 1, 2), (2, 3, 1)]:
        xs, ws = nn.conv_shapes(s, d, p)
        add(f"conv2d_s{s}d{d}p{p}_f64", conv(xs, ws, s, d, p, False))
    for s, d, p in [(1, 1, 1), (3, 2, 2)]:
        xs, ws = nn.conv_shapes(s, d, p)
        add(f"conv2d_inline_s{s}d{d}p{p}_f64", conv(xs, ws, s, d, p, True))
    add("conv2d_s2p1_13x13_f32", conv((2, 3, 13, 13), (5, 3, 3, 3), 2, 1, 1, False, F32))
    add("conv2d_inline_s1p1_11x11_f32", conv((1, 4, 11, 11), (3, 4, 3, 3), 1, 1, 1, True, F32))

    def conv_guard(stride, dtype):
        def build():
            (X, W), Y = conftest.conv2d(N=2, C=3, F=5, size=9, stride=stride, dtype=dtype)
            return with_grad(Y, [X, W])
        return build

    add("conftest_conv2d_s1_f32", conv_guard(1, F32))
    add("conftest_conv2d_s2_f64", conv_guard(2, F64))

    def pool(K, S, shape, dtype):
        def build():
            X = te.placeholder(shape, dtype, "X")
            return with_grad(nn.max_pool(X, K, S), [X])
        return build

    for K, S in [(2, 2), (3, 2), (3, 1)]:
        add(f"max_pool_k{K}s{S}_f64", pool(K, S, (2, 2, 7, 6), F64))
    add("max_pool_k2s2_f32_odd", pool(2, 2, (2, 3, 17, 19), F32))
    add("max_pool_k3s1_f32_odd", pool(3, 1, (1, 2, 11, 21), F32))

    def avg_pool(K, S):
        def build():
            shape = (1, 2, 6, 5)
            X = te.placeholder(shape, F64, "X")
            kh, kw = te.reduce_axis(K, "kh"), te.reduce_axis(K, "kw")
            OH, OW = (shape[2] - K) // S + 1, (shape[3] - K) // S + 1
            Y = te.compute((1, 2, OH, OW), lambda n, c, y, x: te.sum(X[n, c, y * S + kh, x * S + kw], axis=[kh, kw])
                           / float(K * K), name="avg")
            return with_grad(Y, [X])
        return build

    add("avg_pool_k2s2_f64", avg_pool(2, 2))
    add("avg_pool_k3s1_f64", avg_pool(3, 1))

    def flatten_dense():
        X, V = te.placeholder((2, 3, 2, 4), F64, "X"), te.placeholder((5, 24), F64, "V")
        F = nn.flatten(X)
        q = te.reduce_axis(24, "q")
        out = te.compute((2, 5), lambda n, m: te.sum(F[n, q] * V[m, q], axis=q), name="out")
        return with_grad(out, [X, V])

    add("flatten_dense_f64", flatten_dense)

    def softmax(form, shape, dtype):
        def build():
            X = te.placeholder(shape, dtype, "X")
            sm, ls = form(X)
            H = te.placeholder(shape, dtype, "H")
            g1, = te.gradient(sm, [X], head=H)
            g2, = te.gradient(ls, [X], head=H)
            return Built([X, H], [sm, ls, g1, g2], _normal_data([X, H]))
        return build

    for form in (nn.softmax_graph, nn.softmax_fused):
        add(f"{form.__name__}_3x5_f64", softmax(form, (3, 5), F64))
        add(f"{form.__name__}_7x67_f32", softmax(form, (7, 67), F32))

    def mlp(label_mode, dtype, idx_dtype, N=4, D=3, Hd=5, C=3):
        def build():
            shapes = [(N, D), (Hd, D), (Hd,), (C, Hd), (C,)]
            params = [te.placeholder(s, dtype, n) for s, n in zip(shapes, ["X", "W1", "b1", "W2", "b2"])]
            L = te.placeholder((N,), idx_dtype, "L")
            loss = nn.mlp_loss(*params, L, label_mode)
            return with_grad(loss, params + [L], wrt=params, head=False, ints={"L": C})
        return build

    for label_mode in ("onehot", "gather"):
        for dtype in (F64, F32):
            add(f"mlp_{label_mode}_{dtype}", mlp(label_mode, dtype, "int32"))
    add("mlp_gather_int64_f32_wide", mlp("gather", F32, "int64", N=9, D=13, Hd=11, C=7))

    def gather(idx_dtype):
        def build():
            T, Idx = te.placeholder((5, 3), F64, "T"), te.placeholder((7,), idx_dtype, "I")
            out = te.compute((7, 3), lambda n, d: T[Idx[n], d] * T[Idx[n], d] + T[Idx[n], 0] * 3.0, name="out")
            return with_grad(out, [T, Idx], wrt=[T], ints={"I": 5})
        return build

    add("gather_int32_f64", gather("int32"))
    add("gather_int64_f64", gather("int64"))

    def embedding_bag(dtype, rows, dim, bags, per):
        def build():
            T, Idx = te.placeholder((rows, dim), dtype, "T"), te.placeholder((bags, per), "int64", "I")
            l = te.reduce_axis(per, "l")
            out = te.compute((bags, dim), lambda b, d: te.sum(T[Idx[b, l], d], axis=l), name="bag")
            return with_grad(out, [T, Idx], wrt=[T], ints={"I": rows})
        return build

    add("embedding_bag_f64", embedding_bag(F64, 6, 2, 3, 4))
    add("embedding_bag_f32_wide", embedding_bag(F32, 50, 37, 5, 6))

    def residual():
        B, D = 2, 4
        X, W = te.placeholder((B, D), F64, "X"), te.placeholder((D, D), F64, "W")

        def block(Z, name):
            k = te.reduce_axis(D, "k")
            return te.compute((B, D), lambda b, i: Z[b, i] + te.tanh(te.sum(W[i, k] * Z[b, k], axis=k)), name=name)
        return with_grad(block(block(X, "Y1"), "Y2"), [X, W])

    add("residual_shared_weight_f64", residual)

    def concat():
        A, B = te.placeholder((3, 4), F64, "A"), te.placeholder((2, 4), F64, "B")
        C = te.compute((5, 4), lambda i, j: te.if_then_else(i < 3, A[i, j], B[i - 3, j]), name="concat0")
        T = te.compute((5, 4), lambda i, j: te.tanh(C[i, j]), name="T")
        P = te.compute((2, 4), lambda i, j: T[i, j], name="P")
        Q = te.compute((3, 4), lambda i, j: T[i + 2, j], name="Q")
        D = te.compute((2, 7), lambda i, j: te.if_then_else(j < 4, P[i, j], Q[i + 1, j - 4] * 2.0), name="concat1")
        return with_grad(D, [A, B])

    add("concat_split_f64", concat)

    def hvp():
        n, d = 3, 4
        X, W, V = te.placeholder((d,), F64, "X"), te.placeholder((n, d), F64, "W"), te.placeholder((d,), F64, "V")
        g, = te.gradient(nn._tanh_layer_sum(X, W), [X])
        hv, = te.gradient(g, [X], head=V)
        return Built([X, W, V], [g, hv], _normal_data([X, W, V]))

    add("hessian_vector_product_f64", hvp)

    def second_order_reduction():
        X = te.placeholder((4,), F64, "X")
        k = te.reduce_axis(4, "k")
        S = te.compute((1,), lambda _: te.sum(X[k] * X[k] * X[k], axis=k), name="S")
        g, = te.gradient(S, [X])
        gg, = te.gradient(g, [X])
        return Built([X], [g, gg], _normal_data([X]))

    add("second_derivative_through_sum_f64", second_order_reduction)

    def tails(dtype, n):
        """Elementwise, row reductions and a matmul at odd sizes: every vector loop ends in a masked tail."""
        def build():
            X, Y = te.placeholder((5, n), dtype, "X"), te.placeholder((n, 3), dtype, "Y")
            k, c = te.reduce_axis(n, "k"), te.reduce_axis(n, "c")
            E = te.compute((5, n), lambda i, j: te.sigmoid(X[i, j]) * te.exp(-X[i, j] * X[i, j]), name="E")
            M = te.compute((5,), lambda i: te.max(E[i, c], axis=c), name="M")
            out = te.compute((5, 3), lambda i, j: te.sum(E[i, k] * Y[k, j], axis=k) + M[i], name="out")
            return with_grad(out, [X, Y])
        return build

    for dtype in (F32, F64):
        for n in (13, 67):
            add(f"masked_tails_{n}_{dtype}", tails(dtype, n))

    def mixed_widths():
        """A float32 stage reading float64 and int32 data (lanes of different widths in one loop)."""
        X, Y, I = te.placeholder((6, 45), F32, "X"), te.placeholder((6, 45), F64, "Y"), \
            te.placeholder((45,), "int32", "I")
        out = te.compute((6, 45), lambda i, j: X[i, j] * Y[i, I[j]].astype(F32) + I[j].astype(F32), name="out")
        return with_grad(out, [X, Y, I], wrt=[X, Y], ints={"I": 45})

    add("mixed_f32_f64_int32_widths", mixed_widths)
    return out


# ------------------------------------------------------------------ (b') operator cases


# the operator cases also built in float32 (all are built in float64), and the index patterns used
OP_CASES_F32 = {"exp", "log1p", "tanh", "sigmoid", "div", "floordiv", "mod", "maximum", "if_then_else",
                "astype_f64_f32_f64", "int_cast_is_constant", "max", "prod_with_zeros", "sum_two_axes",
                "cumsum_guarded", "triangular_select", "min_nested"}
INDEX_PATTERNS = ("stride2", "reverse", "upsample", "stride3_plus1_div2", "rotate_mod", "mod_then_div",
                  "overlap_2i_2j", "lattice_3i_minus_2j")


def op_entries():
    import test_gradient_ops as ops

    unknown = (OP_CASES_F32 - {c.name for c in ops.ALL_CASES}) | (set(INDEX_PATTERNS) - set(ops.INDEX_PATTERNS))
    assert not unknown, f"test_gradient_ops.py has no case {sorted(unknown)}"
    out = []
    for case in ops.ALL_CASES:
        for dtype in (F64, F32) if case.name in OP_CASES_F32 else (F64,):
            def build(case=case, dtype=dtype):
                xs, y = case.make(dtype)

                def data(rng, xs=xs, y=y):
                    vals = [np.asarray(v, x.dtype) for v, x in zip(case.sample(rng), xs)]
                    return vals + [rng.standard_normal(y.shape).astype(y.dtype)]
                return with_grad(y, xs, data=data)
            out.append(Entry(f"op/{case.name}_{dtype}", build))

    for pattern in INDEX_PATTERNS:
        shape, idx = ops.INDEX_PATTERNS[pattern]
        def build(shape=shape, idx=idx):
            X = te.placeholder((9,), F64, "X")
            return with_grad(te.compute(shape, lambda *j: X[idx(*j)] * X[idx(*j)], name="Y"), [X])
        out.append(Entry(f"index/{pattern}", build))

    for stride, dilation, n in [(2, 1, 8), (3, 3, 9), (2, 3, 9)]:
        def build(stride=stride, dilation=dilation, n=n):
            K = 3
            m = (n - dilation * (K - 1) - 1) // stride + 1
            X, W = te.placeholder((n,), F64, "X"), te.placeholder((K,), F64, "W")
            k = te.reduce_axis(K, "k")
            Y = te.compute((m,), lambda i: te.sum(X[stride * i + dilation * k] * W[k], axis=k), name="Y")
            return with_grad(Y, [X, W])
        out.append(Entry(f"conv1d/s{stride}d{dilation}n{n}", build))
    return out


# ------------------------------------------------------------------ (c) zero-elimination programs


def random_programs():
    """``(module, programs, pipelines)``: program descriptions drawn from the zero-elimination
    generator with a fixed seed (the same ones in every process), pipelines as ``(first, second)``."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    import test_zero_elim_property as zp

    common = dict(database=None, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    progs, pipes = {}, {}

    @seed(SEED)
    @settings(max_examples=4 * RANDOM_PROGRAMS, **common)
    @given(zp.programs())
    def draw(prog):
        if len(progs) < RANDOM_PROGRAMS:
            progs.setdefault(prog.text(), prog)

    @seed(SEED + 1)
    @settings(max_examples=4 * RANDOM_PIPELINES, **common)
    @given(zp.pipelines())
    def draw_pipe(pipe):
        if len(pipes) < RANDOM_PIPELINES:
            pipes.setdefault(pipe[0].text() + " | " + pipe[1].text(), pipe)

    draw()
    draw_pipe()
    return zp, list(progs.values()), list(pipes.values())


def zero_elim_entries():
    zp, progs, pipes = random_programs()
    out = []

    def single(prog):
        def build():
            X, Y = prog.build_te()
            H = te.placeholder(Y.shape, F64, "H")
            g_opt, = te.gradient(Y, [X], head=H)
            g_naive, = te.gradient(Y, [X], head=H, optimize=False)
            return Built([X, H], [Y, g_opt, g_naive], _normal_data([X, H]))
        return build

    def pipeline(first, second):
        def build():
            X, T = first.build_te(name="T")
            _, Y = second.build_te(X=T, name="Y")
            return with_grad(Y, [X], extra=[T])
        return build

    for name in sorted(zp.KNOWN):
        out.append(Entry(f"zero_elim/known/{name}", single(zp.KNOWN[name])))
    for n, prog in enumerate(progs):
        out.append(Entry(f"zero_elim/random{n:02d}", single(prog)))
    for n, (first, second) in enumerate(pipes):
        out.append(Entry(f"zero_elim/pipeline{n:02d}", pipeline(first, second)))
    return out


def corpus() -> list:
    entries = benchmark_entries() + nn_entries() + op_entries() + zero_elim_entries()
    names = [e.name for e in entries]
    assert len(set(names)) == len(names), "corpus names must be unique"
    return entries


# ------------------------------------------------------------------ checks for one target


_MASKED = re.compile(r'@"?llvm\.masked\.(load|store|gather|scatter|expandload|compressstore)\.v(\d+)(f32|f64|i\d+)')
_BITS = {"f32": 32, "f64": 64}


def masked_too_wide(llvm_ir: str, vector_bytes: int) -> list:
    """The masked vector intrinsics of ``llvm_ir`` whose data is wider than ``vector_bytes``."""
    wide = set()
    for m in _MASKED.finditer(llvm_ir):
        lanes, elem = int(m.group(2)), m.group(3)
        bits = _BITS.get(elem) or int(elem[1:])
        if lanes * bits > 8 * vector_bytes and bits > 1:
            wide.add(m.group(0).lstrip("@\""))
    return sorted(wide)


def emitted_ir(kernel) -> str:
    """The LLVM IR te emits for ``kernel`` before LLVM's optimisation pipeline."""
    from lowering.codegen_llvm import emit_modules, stage_groups
    from lowering.target import target_machine

    target = kernel.target
    layout = str(target_machine(target).target_data)
    groups = stage_groups(kernel.program, target)
    return "\n".join(str(module) for module in emit_modules(kernel.program, groups, target, layout))


def asm_problems(asm: str, target) -> list:
    """Signs that ``asm`` is not machine code for ``target``'s instruction set."""
    problems = []
    if len(asm) < 200 or "stage0" not in asm:
        problems.append("assembly is empty or has no stage0")
    if target.x86:
        if "%rdi" not in asm and "%rsi" not in asm:
            problems.append("x86 target but no x86-64 registers in the assembly")
        if "avx512f" not in target.features and "zmm" in asm:
            problems.append("zmm registers on a target without AVX-512")
        if "avx" not in target.features and "ymm" in asm:
            problems.append("ymm registers on a target without AVX")
    else:
        if "%rdi" in asm or "%rsp" in asm:
            problems.append("x86 registers in the assembly of an AArch64 target")
        if not re.search(r"\bx0\b", asm):
            problems.append("AArch64 target but no x0 register in the assembly")
    return problems


def _tolerance(a):
    return (1e-3, 1e-3) if a.dtype == np.float32 else (1e-8, 1e-8)


def compare(got, want) -> str | None:
    """None when the two kernels' results agree (float rounding may differ: FMA, lane counts)."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    if len(got) != len(want):
        return f"{len(got)} results vs {len(want)}"
    for n, (a, b) in enumerate(zip(got, want)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"result {n}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if a.dtype.kind != "f":
            if not np.array_equal(a, b):
                return f"result {n} differs"
            continue
        rtol, atol = _tolerance(a)
        scale = max(1.0, float(np.nanmax(np.abs(b), initial=0.0)))
        if not np.allclose(a, b, rtol=rtol, atol=atol * scale, equal_nan=True):
            err = float(np.nanmax(np.abs(a.astype(np.float64) - b)))
            return f"result {n} differs (max abs error {err:.3g}, scale {scale:.3g})"
    return None


RUN_EVERY = 5                # every fifth program is run (compared with the host's build)


def run_sample() -> set:
    """The names of the programs :func:`check_target` runs where it can."""
    return {e.name for n, e in enumerate(corpus()) if n % RUN_EVERY == 0}


def check_target(name: str, run_every: int = RUN_EVERY, only=None) -> dict:
    """Build every corpus program for target ``name``; see the module doc."""
    target = te.target(name)
    runnable = target.missing_on_host() is None
    entries = corpus()
    report = dict(target=name, programs=len(entries), names=[e.name for e in entries], failures=[],
                  ran=0, with_masked=0, seconds={}, runnable=runnable,
                  phases=dict(tensors=0.0, build=0.0, asm=0.0, checks=0.0))
    phases = report["phases"]

    def lap(phase, since):
        now = time.perf_counter()
        phases[phase] += now - since
        return now
    started = time.perf_counter()
    for n, entry in enumerate(entries):
        if only is not None and entry.name not in only:
            continue
        print(f"BEGIN {entry.name}", flush=True)
        if os.environ.get("TE_CORPUS_ABORT") == entry.name:     # the harness's own test: die like LLVM does
            print(f"LLVM ERROR: simulated abort compiling {entry.name}", file=sys.stderr, flush=True)
            os.abort()
        t0 = time.perf_counter()
        problems = []
        try:
            built = entry.build()
            t = lap("tensors", t0)
            kernel = te.build(built.inputs, built.outputs, name=f"p{n}", target=name)
            t = lap("build", t)
            if kernel.target != target:
                problems.append(f"kernel.target is {kernel.target.name}, not {name}")
            asm = kernel.asm
            t = lap("asm", t)
            problems += asm_problems(asm, target)
            emitted = emitted_ir(kernel)
            report["with_masked"] += bool(_MASKED.search(emitted))
            wide = masked_too_wide(emitted, target.vector_bytes)
            if wide:
                problems.append(f"te emits masked vector operations wider than {target.vector_bytes} bytes: {wide}")
            wide = masked_too_wide(kernel.llvm_ir, target.vector_bytes)
            if wide:
                problems.append(f"the optimised IR has masked operations wider than {target.vector_bytes} "
                                f"bytes: {wide}")
            if not runnable and built.data is not None and n % run_every == 0:
                try:
                    kernel(*built.data(np.random.default_rng(0)))
                    problems.append("a kernel this machine cannot run was called without RuntimeError")
                except RuntimeError:
                    pass
            elif built.data is not None and n % run_every == 0:
                arrays = built.data(np.random.default_rng(n))
                here = te.build(built.inputs, built.outputs, name=f"p{n}", target="host")
                diff = compare(kernel(*arrays), here(*arrays))
                if diff:
                    problems.append(f"{name} and host kernels disagree: {diff}")
                report["ran"] += 1
            lap("checks", t)
        except Exception:
            problems.append("".join(traceback.format_exc(limit=6)[-3000:]))
        report["seconds"][entry.name] = round(time.perf_counter() - t0, 3)
        if problems:
            report["failures"].append(dict(program=entry.name, problems=problems))
        print(f"END {entry.name}", flush=True)
    report["phases"] = {k: round(v, 1) for k, v in phases.items()}
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    return report


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sample = "--sample" in argv
    argv = [a for a in argv if a != "--sample"]
    if not argv:
        print("usage: python tests/corpus.py [--sample] TARGET [PROGRAM ...]", file=sys.stderr)
        return 2
    only = set(argv[1:]) or None
    if sample:
        only = run_sample() & only if only else run_sample()
    report = check_target(argv[0], only=only)
    print("RESULT " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
