"""One core's throughput on this machine, measured once and kept: what the
runtime's estimate of a stage's time (``runtime._estimate_us``) divides by.

**The work unit.**  A stage's work is counted statement by statement
(``runtime._ops``): every float operation weighs :data:`OP`, a load
:data:`LOAD`, a transcendental function :data:`TRANSCENDENTAL`, and the sum
is divided by :data:`PER_UNIT`; a vector operation counts as one operation
whatever its lanes.

**work_per_ns** is measured on the loop the unit models: a register-tiled
dot product at the target's vector width over two float32 vectors that stay
in L1 (per vector of lanes: two loads, a multiply and an add —
``(2 LOAD + 2 OP) / PER_UNIT`` units — into :data:`ACCUMULATORS`
independent sums), its units over its best time.  **l2_bytes_per_ns**: the
bytes numpy's copy of a buffer of a quarter of L2 reads and writes per ns.
Both are the best of :data:`TRIES` short calls, so a call no other process
interrupted decides, and only comparisons with the runtime's thresholds
read them (a figure off by a factor of two changes few decisions).

The figures are kept in the user's cache directory (``XDG_CACHE_HOME`` or
``~/.cache``, ``te-autodiff/throughput.json``) under the CPU's name, its
features and the vector width, so a machine measures once; where that file
cannot be written they are kept for the process.  The loop runs at the
target's width only when this machine can run the target's code (else at
the host's: the estimate only serves kernels run here).
"""
from __future__ import annotations

import ctypes
import json
import os
import threading
import time

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

OP, LOAD, TRANSCENDENTAL, PER_UNIT = 1, 4, 64, 4     # the work unit's weights (see the module doc)
ACCUMULATORS = 8                # independent sums: latency x two FMA units on current cores
TRIES = 7                       # timed calls; the best counts
CALL_SECONDS = 2e-4             # one timed call: far shorter than a scheduler slice
CACHE_FILE = "throughput.json"

_lock = threading.Lock()
_kept: dict = {}


def measured(target) -> tuple:
    """``(work_per_ns, l2_bytes_per_ns)`` of one core of this machine running
    ``target``'s code: from the cache file if it has them, else measured."""
    run_as, key = _key(target)
    with _lock:
        if key not in _kept:
            _kept[key] = _read(key) or _write(key, (_work_per_ns(run_as), _l2_bytes_per_ns(run_as)))
        return _kept[key]


def _key(target) -> tuple:
    """The target the loop runs as, and the name its figures are kept under."""
    from .target import host_target

    run_as = target if target.missing_on_host() is None else host_target()
    return run_as, f"{llvm.get_host_cpu_name()} {run_as.vector_bytes}B {run_as.llvm_spec[1]} L2 {run_as.l2_bytes}"


def _path() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "te-autodiff", CACHE_FILE)


def _load_file() -> dict:
    try:
        with open(_path()) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _read(key: str):
    figures = _load_file().get(key)
    valid = (isinstance(figures, list) and len(figures) == 2
             and all(isinstance(x, (int, float)) and 0 < x < float("inf") for x in figures))
    return tuple(float(x) for x in figures) if valid else None


def _write(key: str, figures: tuple) -> tuple:
    """Keep ``figures`` under ``key`` in the cache file (written whole, then
    renamed over the old one, so a reader never sees half of it)."""
    data = _load_file()
    data[key] = list(figures)
    path = _path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        scratch = f"{path}.{os.getpid()}"
        with open(scratch, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(scratch, path)
    except OSError:
        pass
    return figures


def best_seconds(call, tries: int = TRIES) -> float:
    """The best time of ``call`` over ``tries`` calls (after one untimed)."""
    call()
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t)
    return best


def _dot_module(lanes: int) -> ir.Module:
    """``float dot(i64 reps, i64 vectors, float* x, float* y)``: ``reps`` passes of
    ``acc_j += x[v] * y[v]`` over ``vectors`` vectors of ``lanes``, the sums
    ``acc_0 .. acc_{ACCUMULATORS-1}`` taking the vectors in turn."""
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vec = ir.VectorType(f32, lanes)
    mod = ir.Module("throughput")
    fn = ir.Function(mod, ir.FunctionType(f32, [i64, i64, f32.as_pointer(), f32.as_pointer()]), "dot")
    reps, vectors, x, y = fn.args
    entry, outer, inner, latch, done = (fn.append_basic_block(n) for n in ("entry", "outer", "inner", "latch", "done"))
    bld = ir.IRBuilder(entry)
    xv, yv = bld.bitcast(x, vec.as_pointer()), bld.bitcast(y, vec.as_pointer())
    zero = ir.Constant(vec, [0.0] * lanes)
    bld.branch(outer)

    bld = ir.IRBuilder(outer)
    rep = bld.phi(i64)
    outer_accs = [bld.phi(vec) for _ in range(ACCUMULATORS)]
    bld.branch(inner)

    bld = ir.IRBuilder(inner)
    base = bld.phi(i64)
    accs = [bld.phi(vec) for _ in range(ACCUMULATORS)]
    sums = []
    for j, acc in enumerate(accs):
        at = bld.add(base, ir.Constant(i64, j))
        a = bld.load(bld.gep(xv, [at]), align=4)
        b = bld.load(bld.gep(yv, [at]), align=4)
        sums.append(bld.fadd(acc, bld.fmul(a, b, flags=["contract"]), flags=["contract"]))
    step = bld.add(base, ir.Constant(i64, ACCUMULATORS))
    bld.cbranch(bld.icmp_signed("<", step, vectors), inner, latch)

    bld = ir.IRBuilder(latch)
    next_rep = bld.add(rep, ir.Constant(i64, 1))
    bld.cbranch(bld.icmp_signed("<", next_rep, reps), outer, done)

    rep.add_incoming(ir.Constant(i64, 0), entry)
    rep.add_incoming(next_rep, latch)
    base.add_incoming(ir.Constant(i64, 0), outer)
    base.add_incoming(step, inner)
    for outer_acc, acc, s in zip(outer_accs, accs, sums):
        outer_acc.add_incoming(zero, entry)
        outer_acc.add_incoming(s, latch)
        acc.add_incoming(outer_acc, outer)
        acc.add_incoming(s, inner)

    bld = ir.IRBuilder(done)
    bld.ret(lanes_summed(bld, sums, lanes))
    return mod


def lanes_summed(bld: ir.IRBuilder, vectors: list, lanes: int):
    """The sum of every lane of ``vectors`` (so that none of them is dead code)."""
    total = vectors[0]
    for v in vectors[1:]:
        total = bld.fadd(total, v)
    i32 = ir.IntType(32)
    scalar = bld.extract_element(total, ir.Constant(i32, 0))
    for k in range(1, lanes):
        scalar = bld.fadd(scalar, bld.extract_element(total, ir.Constant(i32, k)))
    return scalar


class Jitted:
    """One function of an llvmlite module compiled for ``target`` in this
    process: ``fn`` (a ctypes function of ``signature``; it lives as long as
    this object) and the module's ``asm``."""

    def __init__(self, mod: ir.Module, target, name: str, signature):
        from .target import data_layout, initialise_llvm, target_machine

        initialise_llvm()
        mod.triple, mod.data_layout = target.triple, data_layout(target)
        parsed = llvm.parse_assembly(str(mod))
        parsed.verify()
        self._engine = llvm.create_mcjit_compiler(parsed, target_machine(target))
        self._engine.finalize_object()
        self.asm = target_machine(target).emit_assembly(parsed)
        self.fn = signature(self._engine.get_function_address(name))


def _work_per_ns(target) -> float:
    lanes = target.lanes(4)
    jitted = Jitted(_dot_module(lanes), target, "dot",
                    ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p))
    dot = jitted.fn
    per_array = target.l1_bytes // 4                    # both vectors fill half of L1
    vectors = max(ACCUMULATORS, per_array // target.vector_bytes // ACCUMULATORS * ACCUMULATORS)
    x, y = _aligned(vectors * lanes, 0.5, target), _aligned(vectors * lanes, 2.0 ** -20, target)
    units_per_pass = vectors * (2 * LOAD + 2 * OP) / PER_UNIT
    reps = 1
    while best_seconds(lambda: dot(reps, vectors, x.ctypes.data, y.ctypes.data)) < CALL_SECONDS:
        reps *= 4
    seconds = best_seconds(lambda: dot(reps, vectors, x.ctypes.data, y.ctypes.data))
    return reps * units_per_pass / (seconds * 1e9)


def _aligned(n: int, value: float, target) -> np.ndarray:
    """``n`` float32 copies of ``value`` starting on a vector boundary (a load
    across two cache lines costs two)."""
    step = target.alignment // 4
    block = np.full(n + step, value, np.float32)
    start = (-block.ctypes.data // 4) % step
    return block[start:start + n]


def _l2_bytes_per_ns(target) -> float:
    source = _aligned(target.l2_bytes // 16, 1.0, target)      # a quarter of L2, and its copy
    dest = _aligned(source.size, 0.0, target)
    reps = 1

    def copies():
        for _ in range(reps):
            np.copyto(dest, source)
    while best_seconds(copies) < CALL_SECONDS:
        reps *= 4
    return reps * 2 * source.nbytes / (best_seconds(copies) * 1e9)
