"""JIT compilation (MCJIT, host CPU), execution, and the callable :class:`Kernel`.

Compiled programs are cached by their typed loop IR text, so building the
same program twice in a process runs LLVM once.  Stages run in order; a stage
with enough work is split into contiguous chunks of its parallel root loop
across a persistent thread pool (``TE_NUM_THREADS``, default
``min(2, os.cpu_count())``).  Every element is computed by the same code
whatever the chunking, so results are bit-identical for any thread count.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import llvmlite.binding as llvm
import numpy as np

from .codegen_llvm import emit_module, stage_symbol
from .loop_ir import Block, Const, For, If, Program
from .lower import lower, validate

CACHE_SIZE = 256                 # compiled programs kept for reuse
PARALLEL_WORK = 1 << 15          # estimated inner iterations below which a stage runs serially
_CHUNK_ALIGN_1D = 1024           # chunk edges of 1-d stages: keep vector/remainder splits identical
_STAGE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)

_lock = threading.Lock()
_initialised = False
_cache = OrderedDict()
_pool = None
_threads = None


# ---------------------------------------------------------------------- LLVM


def _new_target_machine():
    """A target machine for the host CPU.  Each JIT engine takes ownership of
    (and eventually frees) the one it is given, so every engine gets its own."""
    global _initialised
    if not _initialised:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        llvm.load_library_permanently(ctypes.util.find_library("m"))
        _initialised = True
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)


def _optimise(module, tm):
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(module, pb)


@dataclass
class Compiled:
    """A JIT-compiled program: the engine (kept alive), one entry per stage,
    and the optimised LLVM IR text."""

    engine: object
    stages: list
    llvm_ir: str


def compile_program(program: Program) -> Compiled:
    """Compile ``program`` for the host CPU (cached by its structure)."""
    key = program.text(typed=True)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
        tm = _new_target_machine()
        ir_module = emit_module(program, llvm.get_process_triple(), str(tm.target_data))
        module = llvm.parse_assembly(str(ir_module))
        module.verify()
        _optimise(module, tm)
        engine = llvm.create_mcjit_compiler(module, tm)
        engine.finalize_object()
        stages = [_STAGE_FN(engine.get_function_address(stage_symbol(n)))
                  for n in range(len(program.stages))]
        _cache[key] = compiled = Compiled(engine, stages, str(module))
        if len(_cache) > CACHE_SIZE:        # kernels keep their own engine alive
            _cache.popitem(last=False)
        return compiled


# ------------------------------------------------------------------- threads


def num_threads() -> int:
    """Threads a large stage is split across (the calling thread included)."""
    global _threads
    if _threads is None:
        _threads = max(1, int(os.environ.get("TE_NUM_THREADS", min(2, os.cpu_count() or 1))))
    return _threads


def set_num_threads(n: int) -> None:
    """Change the thread count (1 runs everything on the calling thread)."""
    global _threads, _pool
    with _lock:
        if _pool is not None:
            _pool.shutdown(wait=True)
            _pool = None
        _threads = max(1, int(n))


def _thread_pool():
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=num_threads() - 1, thread_name_prefix="te")
        return _pool


_WORK = {
    For: lambda s: max(s.extent.value if isinstance(s.extent, Const) else 16, 0) * _work(s.body),
    Block: lambda s: max(1, sum(_work(x) for x in s.stmts)),
    If: lambda s: max(_work(s.then), 0 if s.else_ is None else _work(s.else_)),
}


def _work(stmt) -> int:
    """Estimated innermost iterations of a statement (unknown extents count 16)."""
    rule = _WORK.get(type(stmt))
    return 1 if rule is None else rule(stmt)


def _chunks(extent: int, parts: int, align: int) -> list:
    step = -(-extent // parts)
    step = -(-step // align) * align
    return [(lo, min(lo + step, extent)) for lo in range(0, extent, step)]


@dataclass
class _StagePlan:
    fn: object
    extent: int              # iterations of the parallel root loop (1 if none)
    splittable: bool
    align: int


def plan_stages(program: Program, compiled: Compiled) -> list:
    plans = []
    for stage, fn in zip(program.stages, compiled.stages):
        root = stage.body
        parallel = isinstance(root, For) and root.kind == "parallel" and isinstance(root.extent, Const)
        extent = root.extent.value if parallel else 1
        plans.append(_StagePlan(fn, extent, parallel and extent > 1 and _work(root) >= PARALLEL_WORK,
                                _CHUNK_ALIGN_1D if len(stage.buffer.shape) <= 1 else 1))
    return plans


# ----------------------------------------------------------------- execution


def aligned_empty(shape, dtype, align: int = 64) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``align``-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    offset = (-raw.ctypes.data) % align
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def execute(program: Program, plans: list, arrays: list) -> dict:
    """Run the stages on input ``arrays``; returns every buffer's array."""
    storage = dict(zip(program.inputs, arrays))
    for buf in program.buffers:
        if buf.kind != "input":
            storage[buf] = aligned_empty(buf.shape, buf.dtype)
    table = (ctypes.c_void_p * len(program.buffers))(*(storage[b].ctypes.data for b in program.buffers))
    threads = num_threads()
    for plan in plans:
        chunks = (_chunks(plan.extent, threads, plan.align) if plan.splittable and threads > 1
                  else [(0, plan.extent)])
        errors = np.zeros((len(chunks), 2), np.int64)
        slots = [errors[k].ctypes.data for k in range(len(chunks))]
        if len(chunks) == 1:
            plan.fn(table, 0, plan.extent, slots[0])
        else:
            pool = _thread_pool()
            futures = [pool.submit(plan.fn, table, lo, hi, slot)
                       for (lo, hi), slot in zip(chunks[1:], slots[1:])]
            plan.fn(table, chunks[0][0], chunks[0][1], slots[0])
            for f in futures:
                f.result()
        failed = errors[errors[:, 0] != 0]
        if len(failed):
            code, index = (int(v) for v in failed[0])
            tensor, dim, extent = program.checks[code - 1]
            raise IndexError(f"index {index} is out of bounds for dimension {dim} of tensor "
                             f"'{tensor}' (extent {extent}); the index was read from tensor data")
    return storage


# -------------------------------------------------------------------- kernel


class Kernel:
    """A compiled program: ``kernel(*arrays)`` returns the outputs as new arrays
    (one array when there is one output).  ``loop_ir`` is the lowered program
    and ``llvm_ir`` the optimised LLVM module, as text."""

    def __init__(self, program: Program, compiled: Compiled, inputs, outputs):
        self.name = program.name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.loop_ir = str(program)
        self.llvm_ir = compiled.llvm_ir
        self.program = program
        self._compiled = compiled
        self._stages = plan_stages(program, compiled)

    def _check(self, arrays) -> list:
        if len(arrays) != len(self.inputs):
            names = ", ".join(f"'{t.name}'" for t in self.inputs)
            raise TypeError(f"kernel '{self.name}' takes {len(self.inputs)} array(s) ({names}), "
                            f"got {len(arrays)}")
        out = []
        for t, a in zip(self.inputs, arrays):
            if not isinstance(a, np.ndarray):
                raise TypeError(f"kernel '{self.name}': placeholder '{t.name}' needs a numpy.ndarray, "
                                f"got {type(a).__name__}")
            if a.dtype != np.dtype(t.dtype):
                raise TypeError(f"kernel '{self.name}': placeholder '{t.name}' has dtype {t.dtype}, "
                                f"got an array of dtype {a.dtype}")
            if a.shape != t.shape:
                raise ValueError(f"kernel '{self.name}': placeholder '{t.name}' has shape {t.shape}, "
                                 f"got an array of shape {a.shape}")
            out.append(a if a.flags.c_contiguous and a.flags.aligned else a.copy(order="C"))
        return out

    def __call__(self, *arrays):
        storage = execute(self.program, self._stages, self._check(arrays))
        results, returned = [], set()
        for buf in self.program.results:
            fresh = buf.kind == "output" and buf not in returned
            returned.add(buf)
            results.append(storage[buf] if fresh else storage[buf].copy())
        return results[0] if len(results) == 1 else tuple(results)

    def __repr__(self):
        ins = ", ".join(t.name for t in self.inputs)
        outs = ", ".join(t.name for t in self.outputs)
        return f"<Kernel {self.name}({ins}) -> ({outs})>"


def build(inputs, outputs, name=None) -> Kernel:
    """``te.build``: compile ``outputs`` as functions of the placeholders ``inputs``."""
    inputs, outputs, _ = validate(inputs, outputs)
    program = lower(inputs, outputs, name)
    return Kernel(program, compile_program(program), inputs, outputs)
