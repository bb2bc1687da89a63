"""Compilation for a :class:`~lowering.target.Target`, execution, and the callable :class:`Kernel`.

LLVM optimises a program and generates its object code in child processes
(``llvm_process``; a large program as one module per process, at once); the
object code is linked into this process by one ORC JIT per target, as a
library that is unloaded when the last kernel using it and the cache drop it.
Compiled programs are cached (``CACHE_SIZE``) by their typed loop IR text
and target, so building the same program twice in a process runs LLVM once.  A program
built for a CPU this machine cannot run (cross-compilation) is optimised and
inspectable (``llvm_ir``, ``asm``) but not loaded; calling it raises
``RuntimeError``.  Stages run in order; a stage
with enough work is split into contiguous chunks of its parallel root loop
across ``TE_NUM_THREADS`` threads (default: the machine's cores).  A
kernel estimated to take less than ``SERIAL_KERNEL_US`` on one thread runs
every stage on the calling thread: each split stage costs a fork and a join
and moves half of its data between cores, more than such a kernel saves.
Otherwise every stage with more than a trivial amount of work is split, small
ones included: stages split along the same axis find the data the previous
one wrote in their own core's cache.  A stage inside a scan's time loop
forks and joins at every step: its stages split only when the step, all
of its stages together, takes ``STEP_SPLIT_US`` or more.

That plan assumes the other cores are free.  While another process holds
one, every split stage waits for a descheduled thread, and a kernel of
tens of microseconds can take milliseconds: so a kernel with split stages
times its own calls, both ways, and runs the faster (:class:`_SplitChoice`).

A kernel call is one native call when libgomp is installed: ``run_stages``
runs every stage and hands a large one to libgomp's thread team
(``GOMP_parallel``, a few microseconds per split stage).  Without libgomp,
runs of small stages are one native call each and a large stage is split
across a Python thread pool (ctypes releases the GIL; an order of magnitude
more per split stage).
Python per call: argument checks, one table of buffer addresses, the output
allocations (aligned to ``Target.alignment``; a large output in a block an
earlier one left: ``output_memory``); temporaries live in one aligned block per
kernel and thread, reused by later calls, where those alive at different
stages share bytes (``temp_layout``).  A kernel whose stages all run on
the calling thread is called through ``native_call`` from its second call
on: one builtin function checks the arrays, fills in the table and runs the
stages, and Python only allocates the outputs (the checked path above
still runs, and raises, for arguments it does not accept).

Without libgomp, the stages of a time loop run on one thread
(``run_stages`` loops over them in one native call).

Every element is computed by the same machine code whatever the chunking
(stage entries are never inlined into their callers), so results are
bit-identical for any thread count.

A process forked after kernels ran (a multiprocessing or data-loader worker)
inherits none of the threads: there, kernels split stages over a new Python
pool and never call libgomp (see ``_after_fork_in_child``).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import math
import numbers
import os
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import llvmlite.binding as llvm
import numpy as np

from te_autodiff.ops import is_transcendental

from .codegen_llvm import RUN_STAGES, chunk_align, emit_modules, stage_groups, stage_symbol
from .loop_ir import (Block, BufLoad, Const, For, GuardedLoad, If, IntPower, Program, Simd, Store, children,
                      stmt_exprs, walk)
from . import llvm_process, output_memory
from .temp_layout import layout, stage_runs
from .native_call import Descriptor
from .throughput import LOAD, OP, PER_UNIT, TRANSCENDENTAL
from .target import (Target, data_layout, default_threads, initialise_llvm, target_machine,
                     thread_count)

CACHE_SIZE = 256                 # compiled programs kept for reuse
PARALLEL_WORK = 1 << 18          # estimated work (_work: an operation on a native vector counts once)
                                 # below which a stage runs on one thread (a Python pool's split is costly)
PARALLEL_WORK_OPENMP = 1 << 11   # the same when libgomp splits stages (a region costs far less)
SERIAL_KERNEL_US = 100           # kernels estimated (_estimate_us) to take less than this on one
                                 # thread run on one thread
STEP_SPLIT_US = 5                # a scan's step (every stage of it) estimated to take less than
                                 # this keeps its stages on one thread: a fork and a join per step cost more
_STAGE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
_RUN_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                           ctypes.c_int64, ctypes.c_void_p)

_lock = threading.Lock()
_initialised = False
_cache = OrderedDict()
_jits = {}
_libraries = itertools.count()
_pool = None
_threads = None


# ---------------------------------------------------------------------- LLVM


def _initialise():
    global _initialised
    if not _initialised:
        initialise_llvm()
        _load_openmp()
        _initialised = True


_openmp = False
_gomp_team = True               # libgomp's thread team can run here (not in a forked child)


def _after_fork_in_child():
    """A forked child (a multiprocessing or data-loader worker) has none of
    the parent's threads: libgomp would wait forever for its team, the
    Python pool for its workers, and a lock held by another thread at the
    fork would never be released.  The child starts with a free lock and no
    pool; its kernels, those built before the fork included, split stages
    over a new Python pool and never call libgomp."""
    global _lock, _pool, _openmp, _gomp_team
    _lock = threading.Lock()
    _pool = None
    _openmp = _gomp_team = False


os.register_at_fork(after_in_child=_after_fork_in_child)


GOMP_SPINCOUNT = "10000"        # libgomp's idle spin before a thread sleeps (its default: 300000)


def _load_openmp():
    """Use libgomp's thread team for split stages when it is installed (a
    region costs about a microsecond instead of tens through Python threads);
    ``TE_OPENMP=0`` turns it off.  Unless ``OMP_WAIT_POLICY`` or
    ``GOMP_SPINCOUNT`` is set, idle threads spin for ``GOMP_SPINCOUNT``
    rounds (tens of microseconds: enough between the stages and calls of a
    kernel) and then sleep: with libgomp's default (milliseconds of spinning),
    a busy machine where another process takes a core makes every split
    stage wait for a descheduled thread while its partner spins, and kernels
    run tens of times slower."""
    global _openmp
    path = ctypes.util.find_library("gomp")
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)
    if path and os.environ.get("TE_OPENMP", "1") != "0":
        try:
            llvm.load_library_permanently(path)
            _openmp = True
        except RuntimeError:
            _openmp = False


@dataclass
class Compiled:
    """A compiled program: its object code linked into this process (the
    ``library`` keeps it loaded), one entry per stage, and the optimised
    LLVM IR of each module it was compiled as (``codegen_llvm.emit_modules``)."""

    library: object
    stages: list
    parts: list
    target: Target
    costs: list                       # (work, bytes) per stage: _stage_costs
    run_stages: object = None
    openmp: bool = False
    unrunnable: str | None = None     # why this machine cannot run it (cross-compiled)
    _llvm_ir: str | None = None
    _asm: str | None = None

    @property
    def llvm_ir(self) -> str:
        """The optimised LLVM IR, one module (its parts linked on first use)."""
        if self._llvm_ir is None:
            self._llvm_ir = (self.parts[0] if len(self.parts) == 1 else
                             llvm_process.run("link", self.parts))
        return self._llvm_ir

    @property
    def asm(self) -> str:
        """The machine code as assembly text for the target (made on first use)."""
        if self._asm is None:
            self._asm = llvm_process.run("assembly", self.llvm_ir, self.target.llvm_spec)
        return self._asm


def _jit(target: Target):
    """The JIT that links ``target``'s object code into this process (one per
    target; a program's code is unloaded when its ``Compiled`` is dropped),
    with the linker ``Target.jit_link`` names."""
    jit = _jits.get(target)
    if jit is None:
        jit = _jits[target] = llvm.create_lljit_compiler(target_machine(target), use_jit_link=target.jit_link)
    return jit


def compile_program(program: Program, target: Target) -> Compiled:
    """Compile ``program`` for ``target`` (cached by its structure and target):
    LLVM IR (``codegen_llvm``), as one module per LLVM process when it is
    large, then LLVM's optimisation pipeline and code generator on each
    module at once (in child processes: ``llvm_process``), then the object
    code linked into this process, unless this machine cannot run it."""
    key = (program.text(typed=True), target)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
        _initialise()
        unrunnable = target.missing_on_host()
        openmp = _openmp and unrunnable is None
        groups = stage_groups(program, target)
        modules = emit_modules(program, groups, target, data_layout(target), openmp=openmp,
                               parts=llvm_process.workers())
        requests = ((str(module), target.llvm_spec, target.vector_bytes) for module in modules)
        what = f"kernel '{program.name}' for {target.name}"
        if unrunnable is not None:
            parts = llvm_process.run_all("optimise", requests, what=what)
            compiled = Compiled(None, [], parts, target, [], unrunnable=unrunnable)
        else:
            parts, objects = zip(*llvm_process.run_all("compile_object", requests, what=what))
            symbols = [stage_symbol(n) for n in range(len(program.stages))] + [RUN_STAGES]
            builder = llvm.JITLibraryBuilder().add_current_process()
            for code in objects:
                builder.add_object_img(code)
            for symbol in symbols:
                builder.export_symbol(symbol)
            library = builder.link(_jit(target), f"{program.name}_{next(_libraries)}")
            stages = [_STAGE_FN(library[symbol]) for symbol in symbols[:-1]]
            compiled = Compiled(library, stages, list(parts), target, _stage_costs(program, groups, target),
                                _RUN_FN(library[RUN_STAGES]), openmp)
        _cache[key] = compiled
        if len(_cache) > CACHE_SIZE:        # kernels keep their own library loaded
            _cache.popitem(last=False)
        return compiled


# ------------------------------------------------------------------- threads


def num_threads() -> int:
    """Threads a large stage is split across (the calling thread included):
    :func:`~lowering.target.default_threads` until :func:`set_num_threads`
    says otherwise."""
    global _threads
    if _threads is None:
        _threads = default_threads()
    return _threads


def set_num_threads(n: int) -> None:
    """Change the thread count of later calls (1 runs everything on the
    calling thread).  Kernels keep the parallel loops their schedule balanced
    for ``Target.threads``; results are bit-identical at any count."""
    global _threads, _pool
    with _lock:
        if _pool is not None:
            _pool.shutdown(wait=True)
            _pool = None
        _threads = thread_count(n, "set_num_threads")


def _thread_pool():
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=num_threads() - 1, thread_name_prefix="te")
        return _pool


_WORK = {
    For: lambda s, t: max(s.extent.value if isinstance(s.extent, Const) else 16, 0) * _work(s.body, t),
    Simd: lambda s, t: _native_vectors(s, t) * _work(s.body, t),
    Block: lambda s, t: max(1, sum(_work(x, t) for x in s.stmts)),
    If: lambda s, t: max(_work(s.then, t), 0 if s.else_ is None else _work(s.else_, t)),
}


def _work(stmt, target: Target) -> int:
    """Estimated cost of a statement on ``target``: innermost iterations
    (unknown extents count 16) times :func:`_ops` of each statement, a vector
    loop's operations once per native vector its lanes fill."""
    rule = _WORK.get(type(stmt))
    return _ops(stmt) if rule is None else rule(stmt, target)


def _native_vectors(simd: Simd, target: Target) -> int:
    """Native vectors of ``target`` one operation on ``simd``'s lanes of its
    widest float value takes (a float64 vector of 32 lanes is four 64-byte
    ones); only float operations count as work (:func:`_ops`)."""
    widest = 4
    for st in walk(simd.body):
        exprs = list(stmt_exprs(st))
        while exprs:
            e = exprs.pop()
            if e.dtype.startswith("float"):
                widest = max(widest, np.dtype(e.dtype).itemsize)
            exprs += children(e)
    return max(1, -(-simd.lanes * widest // target.vector_bytes))


def _ops(stmt) -> int:
    """The work units of one statement (``throughput.py``'s weights; index
    arithmetic is free, an integer power is 3 operations per bit of its exponent)."""
    seen, stack, total = set(), list(stmt_exprs(stmt)), 0
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, IntPower):                 # a square, a product and a select per bit
            total += 3 * OP * e.bits
        elif e.dtype.startswith("float"):
            total += (TRANSCENDENTAL if is_transcendental(getattr(e, "op", None))
                      else LOAD if hasattr(e, "buffer") else OP)
        stack += children(e)
    return max(1, total // PER_UNIT)


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


def _stage_costs(program: Program, groups: list, target: Target) -> list:
    """``(work, bytes)`` of each stage: its :func:`_work` (counted once per
    template: ``codegen_llvm.stage_groups``) and the bytes of the buffers it
    touches; for a step of a time loop, no more than its loads and stores
    move (:func:`_moved`): it touches a row of the buffers that hold every
    step, not the whole of them."""
    number = {id(st): n for n, st in enumerate(program.stages)}
    out = [None] * len(program.stages)
    for template, members in groups:
        work = _work(template.body, target)
        moved = _moved(template.body) if any(m.stage.step is not None for m in members) else None
        for member in members:
            nbytes = sum(buf.nbytes for buf, _ in member.slots)
            if member.stage.step is not None:
                nbytes = min(nbytes, moved)
            out[number[id(member.stage)]] = (work, nbytes)
    return out


def _moved(stmt) -> int:
    """Bytes the loads and stores of ``stmt`` move when it runs once, as if
    none were reused (unknown extents count 16, as in :func:`_work`)."""
    if isinstance(stmt, For):
        return max(stmt.extent.value if isinstance(stmt.extent, Const) else 16, 0) * _moved(stmt.body)
    if isinstance(stmt, Simd):
        return stmt.lanes * _moved(stmt.body)
    if isinstance(stmt, Block):
        return sum(_moved(x) for x in stmt.stmts)
    if isinstance(stmt, If):
        return max(_moved(stmt.then), 0 if stmt.else_ is None else _moved(stmt.else_))
    seen, stack, total = set(), list(stmt_exprs(stmt)), 0
    if isinstance(stmt, Store):
        total += np.dtype(stmt.buffer.dtype).itemsize
    while stack:
        e = stack.pop()
        if id(e) not in seen:
            seen.add(id(e))
            if isinstance(e, (BufLoad, GuardedLoad)):
                total += np.dtype(e.buffer.dtype).itemsize
            stack += children(e)
    return total


def _estimate_us(work: int, nbytes: int, target: Target) -> float:
    """Estimated time of a stage on one thread of ``target``, in
    microseconds: its ``work`` (:func:`_work`) at ``target.work_per_ns``
    plus the ``nbytes`` of the buffers it touches at ``target.l2_bytes_per_ns``."""
    return work / (1e3 * target.work_per_ns) + nbytes / (1e3 * target.l2_bytes_per_ns)


def plan_stages(program: Program, compiled: Compiled) -> list:
    """How each stage runs: a stage is split across threads when its root loop
    is parallel and it has enough work, in a kernel that is not small (see
    the module doc)."""
    work = [w for w, _ in compiled.costs]
    estimate = [_estimate_us(*cost, compiled.target) for cost in compiled.costs]
    steps = [st.step.extent if st.step else 1 for st in program.stages]
    small = sum(e * n for e, n in zip(estimate, steps)) < SERIAL_KERNEL_US
    step_us = {}                            # a time loop's step: all of its stages
    for stage, us in zip(program.stages, estimate):
        if stage.step is not None:
            step_us[id(stage.step)] = step_us.get(id(stage.step), 0.0) + us
    threshold = PARALLEL_WORK_OPENMP if compiled.openmp else PARALLEL_WORK
    plans = []
    for stage, fn, w, us in zip(program.stages, compiled.stages, work, estimate):
        root = stage.body
        parallel = isinstance(root, For) and root.kind == "parallel" and isinstance(root.extent, Const)
        extent = root.extent.value if parallel else 1
        split = not small and parallel and extent > 1 and w >= threshold
        if stage.step is not None:          # a fork and a join at every step: only for long steps
            split = split and step_us[id(stage.step)] >= STEP_SPLIT_US
        plans.append(_StagePlan(fn, extent, split, chunk_align(stage)))
    return plans


class _SplitChoice:
    """Whether a kernel splits its stages across threads as planned (way 1)
    or runs them all on the calling thread (way 0), chosen by timing its own
    calls.  Splitting pays while the other cores are free; while another
    process holds one, every split stage waits for a descheduled thread (a
    scheduler slice, milliseconds, where the kernel may take microseconds),
    which only a measurement tells.  The first call runs the plan untimed
    (it touches new temporaries and starts the thread team: not a measure
    of either way); then each way runs ``RECENT`` calls in a row, and each
    call runs the faster one, and now and then the other runs ``RECENT``
    calls in a row (a probe), so a change of the machine's load is followed.
    A way is timed in runs, never by a lone call: the first split call after
    calls on one thread wakes threads that went to sleep (``GOMP_SPINCOUNT``
    ran out), a cost the calls after it do not pay; a lone probe would pay
    it every time, lose every time, and keep a kernel on one thread for
    good.  A way's time is the least of its last ``RECENT`` calls: one fast
    call shows a way can be fast, and the way in use turns slow only when
    its last few calls all were.  A probe comes ``FIRST`` calls after the
    last; one that loses comes half as often, down to one in ``LAST``.
    Results are the same bits either way.  Threads calling one kernel at
    once share its choice: a lock keeps each step whole, and a call's time
    may arrive after later calls chose."""

    FIRST, LAST = 16, 1024      # calls between probes
    WARM = 1                    # first calls, run as planned, whose times are not kept
    RECENT = 3                  # calls of a way in a row, whose least time is its time

    def __init__(self):
        self.calls = 0
        self.recent = (deque(maxlen=self.RECENT), deque(maxlen=self.RECENT))   # not splitting / splitting
        self.interval = self.FIRST
        self.probe_at = self.WARM + 2 * self.RECENT + self.FIRST
        self.probing, self.left, self.timed = None, 0, 0    # a probe's way, calls to choose, calls ended
        self.lock = threading.Lock()

    def seconds(self, way: int) -> float:
        return min(self.recent[way])

    def best(self) -> int:
        return int(self.seconds(1) < self.seconds(0))

    def choose(self) -> int:
        with self.lock:
            n, self.calls = self.calls, self.calls + 1
            if n < self.WARM:
                return 1
            if n < self.WARM + 2 * self.RECENT or not all(self.recent):
                return (n - self.WARM) // self.RECENT % 2
            if self.left:
                self.left -= 1
                return self.probing
            if n >= self.probe_at:
                self.probing, self.left, self.timed, self.probe_at = 1 - self.best(), self.RECENT - 1, 0, math.inf
                return self.probing
            return self.best()

    def record(self, way: int, seconds: float | None):
        """A call's time (None: it raised, so it is not timed)."""
        with self.lock:
            if self.calls <= self.WARM:
                return
            if seconds is not None:
                self.recent[way].append(seconds)
            if way == self.probing:
                self.timed += 1
                if self.timed == self.RECENT:      # the probe has run: it lost if its way is still the slower
                    lost = way != self.best()
                    self.interval = min(2 * self.interval, self.LAST) if lost else self.FIRST
                    self.probe_at, self.probing = self.calls + self.interval, None


# ----------------------------------------------------------------- execution


def data_address(a: np.ndarray) -> int:
    """The data address of a contiguous array, through a ctypes view of its
    buffer (several times faster than ``a.ctypes.data``, which adds up over
    the arrays of a call); numpy's for a read-only or empty array."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):
        return a.ctypes.data


def beyond_memory(program: Program, temp_bytes: int) -> str | None:
    """Why the outputs and the block of temporaries (``temp_bytes``) a call
    of ``program`` allocates cannot fit in this machine's memory, naming the
    largest buffer (None when they fit): a kernel refuses such a call before
    allocating anything, rather than fail inside numpy, or be killed by the
    kernel when the pages are touched."""
    made = [b for b in program.buffers if b.kind != "input"]
    total = sum(b.nbytes for b in made if b.kind == "output") + temp_bytes
    memory = output_memory.memory_bytes()
    if memory is None or total <= memory:               # not POSIX: let the allocation decide
        return None
    big = max(made, key=lambda b: b.nbytes)
    return (f"{'output' if big.kind == 'output' else 'temporary'} '{big.name}' of shape {big.shape} "
            f"needs {big.nbytes / 2**30:.3g} GiB; the outputs and temporaries need {total / 2**30:.3g} GiB "
            f"and this machine has {memory / 2**30:.3g} GiB of memory")


def _aligned(shape, dtype, align: int):
    """An uninitialised C-contiguous array whose data starts on an
    ``align``-byte boundary, and that address."""
    dtype = np.dtype(dtype)
    return _fresh(dtype.itemsize * math.prod(shape), shape, dtype, align)


def _fresh(nbytes: int, shape, dtype: np.dtype, align: int, new=None):
    """``_aligned`` with the size and dtype worked out by the caller (a
    kernel call allocates its outputs this way, their sizes and dtypes
    worked out once per kernel, in ``new(bytes)``: ``output_memory.block``)."""
    raw = np.empty(nbytes + align, np.uint8) if new is None else new(nbytes + align)
    base = ctypes.addressof(ctypes.c_char.from_buffer(raw))
    offset = -base % align
    return np.ndarray(shape, dtype, raw, offset), base + offset


def execute(program: Program, compiled: Compiled, arrays: list) -> dict:
    """Run the stages of ``program`` (compiled as ``compiled``) on input
    ``arrays``, one Python call per stage; returns every buffer's array."""
    plans = plan_stages(program, compiled)
    storage = dict(zip(program.inputs, arrays))
    for buf in program.buffers:
        if buf.kind != "input":
            storage[buf] = _aligned(buf.shape, buf.dtype, compiled.target.alignment)[0]
    table = (ctypes.c_void_p * len(program.buffers))(*(storage[b].ctypes.data for b in program.buffers))
    if any(st.step is not None for st in program.stages):     # time loops: run_stages, on one thread
        err = (ctypes.c_int64 * 2)()
        compiled.run_stages(table, 0, len(plans), err, 1, (ctypes.c_int8 * len(plans))())
        if err[0]:
            _raise_check(program, err[0], err[1])
        return storage
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


def _raise_check(program: Program, code: int, index: int):
    tensor, dim, extent = program.checks[code - 1]
    raise IndexError(f"index {index} is out of bounds for dimension {dim} of tensor "
                     f"'{tensor}' (extent {extent}); the index was read from tensor data")


@dataclass(frozen=True)
class StageTime:
    """One entry of :meth:`Kernel.profile`: ``stages`` (names as in
    ``scheduled_ir``) run by one native call, ``name`` their names joined,
    the least wall time in ``seconds``; ``steps``: time steps of a scan's
    loop (its stages run together, every step), else 1; ``threads``: how
    many threads shared the work."""

    name: str
    seconds: float
    stages: tuple
    steps: int
    threads: int

    def __str__(self):
        return f"{self.name}: {self.seconds * 1e3:.4g} ms, {self.threads} thread(s)" + \
            (f", {self.steps} steps" if self.steps > 1 else "")


class _Runner:
    """A kernel's calls with the per-call work precomputed: the buffer table
    (one per calling thread, its temporaries' slots filled in once: one
    aligned block reused by later calls on that thread), the output
    allocations, and the steps: a stretch of stages that each run on one
    thread is one native call (``run_stages``); a stage with enough work is
    split across the thread pool.  A call fills in the input and output
    addresses and makes one native call."""

    def __init__(self, program: Program, compiled: Compiled, plans: list):
        self.program = program
        self.compiled = compiled
        self.plans = plans
        slot = {b: k for k, b in enumerate(program.buffers)}
        self.n = len(program.buffers)
        self.table_type = ctypes.c_void_p * self.n
        self.input_slots = [slot[b] for b in program.inputs]
        self.outputs = [(slot[b], np.dtype(b.dtype).itemsize * math.prod(b.shape), b.shape, np.dtype(b.dtype))
                        for b in program.buffers if b.kind == "output"]
        self.align = align = compiled.target.alignment
        offsets, self.temp_bytes = layout(program, align)
        self.temp_offsets = [(slot[b], off) for b, off in offsets]
        self.local = threading.local()
        self.results = []
        returned = set()
        for b in program.results:
            fresh = b.kind == "output" and b not in returned
            returned.add(b)
            self.results.append((slot[b], fresh, b.shape, np.dtype(b.dtype)))
        self.io_slots = self.input_slots + [k for k, *_ in self.outputs]
        self.steps_for = {}
        self.split_choice = _SplitChoice() if any(p.splittable for p in plans) else None

    def native(self):
        """``(call, call_at)`` through the kernel's native entries
        (``native_call``), or None for a kernel that splits stages across
        threads (or where numpy's array struct is not as expected).
        ``call(arrays)`` returns the results or None, ``call_at(*addresses)``
        0 or -1: None and -1 when the checked Python path must run instead
        (a wrong argument, a failed index check, another thread in the
        kernel)."""
        if self.split_choice is not None:
            return None
        d = Descriptor(ctypes.cast(self.compiled.run_stages, ctypes.c_void_p).value, len(self.plans), self.n,
                       [(k, b.dtype, b.shape) for k, b in zip(self.input_slots, self.program.inputs)],
                       [k for k, *_ in self.outputs], self.temp_offsets, self.temp_bytes, self.align)
        if not d.available:
            return None
        entry, align = d.arrays, self.align
        sizes = [nbytes + align for _, nbytes, _, _ in self.outputs]
        views = [(shape, dtype, d.bits * n) for n, (_, _, shape, dtype) in enumerate(self.outputs)]
        mask = d.mask
        direct = [(k, fresh) for k, fresh, _, _ in self.results] == [(k, True) for k, *_ in self.outputs]
        empty, u8, ndarray = np.empty, np.uint8, np.ndarray

        if direct and len(sizes) == 1:
            (size,), ((shape, dtype, _),) = sizes, views
            reused = output_memory.block if size >= output_memory.REUSE_MIN_BYTES else None

            def call(arrays):
                raw = empty(size, u8) if reused is None else reused(size)
                offset = entry(raw, *arrays)
                return None if offset < 0 else ndarray(shape, dtype, raw, offset)
        else:
            def call(arrays):
                raws = [output_memory.block(size) for size in sizes]
                packed = entry(*raws, *arrays)
                if packed < 0:
                    return None
                outs = [ndarray(shape, dtype, raw, packed >> shift & mask)
                        for raw, (shape, dtype, shift) in zip(raws, views)]
                if direct:
                    return tuple(outs)
                return self.collect(dict(zip(self.io_slots, [*arrays, *outs])))

        return call, d.addresses

    def steps(self, threads: int) -> list:
        """``[(first, last, chunks)]``: stages ``first .. last - 1`` in one
        ``run_stages`` call (``chunks`` None), or the one stage ``first``
        split across the thread pool in ``chunks``."""
        steps = self.steps_for.get(threads)
        if steps is None:
            steps, start = [], 0
            for k, plan in enumerate(self.plans):
                # a scan's step runs inside run_stages' time loop, on one thread here
                if plan.splittable and threads > 1 and self.program.stages[k].step is None:
                    if start < k:
                        steps.append((start, k, None))
                    steps.append((k, k + 1, _chunks(plan.extent, threads, plan.align)))
                    start = k + 1
            if start < len(self.plans):
                steps.append((start, len(self.plans), None))
            self.steps_for[threads] = steps
        return steps

    def table(self):
        """This thread's buffer table, the temporaries' slots filled in, and
        its error slots (two per thread; the native code writes them only
        when a check fails, so they are cleared after a failure, not per call)."""
        local = self.local
        table = getattr(local, "table", None)
        if table is None:
            table, local.block = self.temp_table(self.temp_offsets, self.temp_bytes)
            local.table = table
            local.err = (ctypes.c_int64 * 2)()
        return table, local.err

    def temp_table(self, offsets, nbytes):
        """``(table, block)``: a new buffer table whose temporaries' slots
        point into a new aligned block of ``nbytes`` at ``offsets``."""
        block, base = _aligned((max(nbytes, 1),), np.uint8, self.align)
        table = self.table_type()
        for k, off in offsets:
            table[k] = base + off
        return table, block

    def __call__(self, arrays):
        table, err = self.table()
        arrays_by_slot = {}
        for k, a in zip(self.input_slots, arrays):
            table[k] = data_address(a)
            arrays_by_slot[k] = a
        align = self.align
        for k, nbytes, shape, dtype in self.outputs:
            arrays_by_slot[k], table[k] = _fresh(nbytes, shape, dtype, align, output_memory.block)
        self.run(table, err)
        return self.collect(arrays_by_slot)

    def run_at(self, addresses):
        """Run on memory the caller owns: the inputs' data addresses, then the outputs'."""
        table, err = self.table()
        for k, address in zip(self.io_slots, addresses):
            table[k] = address
        self.run(table, err)

    def run(self, table, err):
        """The native calls, ``table`` filled in; raises the first failed check.
        With more than one thread, the kernel's :class:`_SplitChoice` says
        whether this call splits its stages as planned or runs them all here."""
        threads = num_threads()
        measure = self.split_choice is not None and threads > 1
        way = self.split_choice.choose() if measure else 1
        start, seconds = time.perf_counter(), None
        try:
            self.run_split(table, err, threads if way else 1)
            seconds = time.perf_counter() - start
        finally:
            if measure:
                self.split_choice.record(way, seconds)

    def run_split(self, table, err, threads: int, first: int = 0, last: int | None = None):
        """Run stages ``first .. last - 1`` (every stage by default), those
        planned to split across ``threads``.  A range starts and ends outside
        a scan's time loop (``run_stages`` opens the loop at its first stage)."""
        last = len(self.plans) if last is None else last
        if self.compiled.openmp and _gomp_team:         # the whole range in one native call
            if len(err) < 2 * threads:
                err = self.local.err = (ctypes.c_int64 * (2 * threads))()
            self.compiled.run_stages(table, first, last, err, threads, self.split_flags(threads))
            self.raise_failed(err, threads)
            return
        for lo, hi, chunks in self.steps(threads):
            lo, hi = max(lo, first), min(hi, last)
            if lo >= hi:
                continue
            if chunks is None:
                self.compiled.run_stages(table, lo, hi, err, 1, self.split_flags(1))
                self.raise_failed(err, 1)
            else:
                plan = self.plans[lo]
                errors = (ctypes.c_int64 * (2 * len(chunks)))()
                address = ctypes.addressof(errors)
                pool = _thread_pool()
                futures = [pool.submit(plan.fn, table, a, b, address + 16 * c)
                           for c, (a, b) in enumerate(chunks) if c]
                plan.fn(table, chunks[0][0], chunks[0][1], address)
                for f in futures:
                    f.result()
                self.raise_failed(errors, len(chunks))

    def profile(self, arrays, repeat: int) -> list:
        """:meth:`Kernel.profile` on checked ``arrays``: every temporary at
        bytes of its own (``temp_layout.layout``), as a stage run alone reads
        what the whole call before left."""
        err = self.table()[1]
        slot = {b: k for k, b in enumerate(self.program.buffers)}
        offsets, temp_bytes = layout(self.program, self.align, share=False)
        table, block = self.temp_table([(slot[b], off) for b, off in offsets], temp_bytes)
        for k, a in zip(self.input_slots, arrays):
            table[k] = data_address(a)
        outputs = [_fresh(nbytes, shape, dtype, self.align) for k, nbytes, shape, dtype in self.outputs]
        for (k, *_), (_, address) in zip(self.outputs, outputs):
            table[k] = address
        threads = num_threads()
        self.run_split(table, err, threads)             # every temporary now holds what later stages read
        times = []
        for first, last in stage_runs(self.program):
            best = math.inf
            for _ in range(repeat):
                start = time.perf_counter()
                self.run_split(table, err, threads, first, last)
                best = min(best, time.perf_counter() - start)
            names = tuple(st.name for st in self.program.stages[first:last])
            step = self.program.stages[first].step
            times.append(StageTime(", ".join(names), best, names, 1 if step is None else step.extent,
                                   threads if any(self.plans[k].splittable for k in range(first, last)) else 1))
        return times

    def raise_failed(self, err, slots: int):
        """Raise the first failed check reported in ``err`` (``slots`` pairs),
        clearing ``err`` for the next call."""
        for t in range(slots):
            if err[2 * t]:
                code, index = err[2 * t], err[2 * t + 1]
                ctypes.memset(err, 0, ctypes.sizeof(err))
                _raise_check(self.program, code, index)

    def split_flags(self, threads: int):
        """Which stages ``run_stages`` splits across ``threads`` (none on one)."""
        flags = self.steps_for.get(("flags", threads))
        if flags is None:
            flags = (ctypes.c_int8 * max(len(self.plans), 1))(
                *[int(p.splittable and threads > 1) for p in self.plans])
            self.steps_for[("flags", threads)] = flags
        return flags

    def collect(self, arrays_by_slot):
        results = []
        for k, fresh, shape, dtype in self.results:
            a = arrays_by_slot.get(k)
            if a is None:                   # a temporary returned by mistake cannot happen; inputs
                raise RuntimeError("kernel result is not an input or output")
            results.append(a if fresh else a.copy())
        return results[0] if len(results) == 1 else tuple(results)


# -------------------------------------------------------------------- kernel


class Kernel:
    """A compiled program: ``kernel(*arrays)`` returns the outputs as new arrays
    (one array when there is one output).  ``loop_ir`` is the lowered program
    (before fusion and scheduling), ``scheduled_ir`` the program after
    ``schedule`` (what is compiled), ``llvm_ir`` the optimised LLVM module and
    ``asm`` its assembly, as text; ``target`` the CPU it was built for."""

    def __init__(self, program: Program, compiled: Compiled, inputs, outputs, lowered=None):
        self.name = program.name
        self._inputs = tuple(inputs)            # read-only: the runner trusts them (see inputs)
        self._dtypes = [np.dtype(t.dtype) for t in self._inputs]
        self._outputs = tuple(outputs)
        self.target = compiled.target
        self._lowered = program if lowered is None else lowered
        self.program = program
        self._compiled = compiled
        self._beyond_memory = None
        if compiled.unrunnable is None:
            self._stages = plan_stages(program, compiled)
            self._run = _Runner(program, compiled, self._stages)
            self._beyond_memory = beyond_memory(program, self._run.temp_bytes)
            if self._beyond_memory is not None:
                self._run = self._refuse_memory
        else:
            self._run = self._refuse
        runnable = compiled.unrunnable is None and self._beyond_memory is None
        self._fast = self._fast_at = False if runnable else None    # False: made by the first call

    @property
    def inputs(self) -> list:
        """The placeholders, in call order (a copy: a kernel whose argument
        list could change would hand native code missing buffers)."""
        return list(self._inputs)

    @property
    def outputs(self) -> list:
        """The tensors returned, in order (a copy)."""
        return list(self._outputs)

    @property
    def loop_ir(self) -> str:       # the texts are made on first use (a kernel keeps its programs)
        return str(self._lowered)

    @property
    def scheduled_ir(self) -> str:
        return str(self.program)

    @property
    def llvm_ir(self) -> str:
        return self._compiled.llvm_ir

    @property
    def asm(self) -> str:
        return self._compiled.asm

    def _refuse(self, arrays):
        raise RuntimeError(f"kernel '{self.name}' was built for target '{self.target.name}' "
                           f"({self.target.cpu}) and cannot run here: {self._compiled.unrunnable}")

    def _refuse_memory(self, arrays):
        raise MemoryError(f"kernel '{self.name}' cannot run here: {self._beyond_memory}")

    def _check(self, arrays) -> list:
        if len(arrays) != len(self._inputs):
            names = ", ".join(f"'{t.name}'" for t in self._inputs)
            raise TypeError(f"kernel '{self.name}' takes {len(self._inputs)} array(s) ({names}), "
                            f"got {len(arrays)}")
        out = []
        for t, dtype, a in zip(self._inputs, self._dtypes, arrays):
            if type(a) is not np.ndarray and (not isinstance(a, np.ndarray) or isinstance(a, np.ma.MaskedArray)):
                masked = " (a masked array: its mask would be ignored)" if isinstance(a, np.ndarray) else ""
                raise TypeError(f"kernel '{self.name}': placeholder '{t.name}' needs a numpy.ndarray, "
                                f"got {type(a).__name__}{masked}")
            if a.dtype != dtype:
                raise TypeError(f"kernel '{self.name}': placeholder '{t.name}' has dtype {t.dtype}, "
                                f"got an array of dtype {a.dtype}")
            if a.shape != t.shape:
                raise ValueError(f"kernel '{self.name}': placeholder '{t.name}' has shape {t.shape}, "
                                 f"got an array of shape {a.shape}")
            out.append(a if a.flags.c_contiguous and a.flags.aligned else a.copy(order="C"))
        return out

    def _native(self):
        """Make the native entries (the first call does; it takes the checked path)."""
        self._fast, self._fast_at = self._run.native() or (None, None)

    def __call__(self, *arrays):
        fast = self._fast
        if fast:
            out = fast(arrays)
            if out is not None:
                return out
        elif fast is False:
            self._native()
        return self._run(self._check(arrays))

    def profile(self, *arrays, repeat: int = 5) -> list:
        """Where a call's time goes: a list of :class:`StageTime`, one per
        stage of ``scheduled_ir`` in order (a scan's time loop is one entry).
        The kernel runs once on ``arrays``, so every temporary holds what the
        later stages read; then each stage runs ``repeat`` times alone, with
        the threads a call uses, and keeps its least time.  A stage run alone
        finds its inputs in cache more often than in a call, where earlier
        stages pushed them out; each entry adds a native call's overhead."""
        if isinstance(repeat, bool) or not isinstance(repeat, numbers.Integral) or repeat < 1:
            raise ValueError(f"kernel '{self.name}'.profile: repeat must be a positive integer, got {repeat!r}")
        if not isinstance(self._run, _Runner):
            self._run(arrays)                           # raises why this kernel cannot run here
        return self._run.profile(self._check(arrays), int(repeat))

    @property
    def output_layout(self) -> list:
        """``(shape, numpy dtype)`` of each array the kernel writes, in ``call_at`` order."""
        return [(shape, dtype) for _, _, shape, dtype in self._run.outputs]

    @property
    def result_sources(self) -> list:
        """For each result, ``(from_input, index, fresh)``: the input or the
        ``output_layout`` entry it is, and whether it may be returned as is
        (otherwise it is returned as a copy: an input, or an array returned twice)."""
        inputs, outputs = self._run.input_slots, [k for k, *_ in self._run.outputs]
        return [(k in inputs, inputs.index(k) if k in inputs else outputs.index(k), fresh)
                for k, fresh, _, _ in self._run.results]

    def call_at(self, addresses) -> None:
        """Run on memory the caller owns, checking nothing: ``addresses`` are
        the data of C-contiguous arrays, one per input placeholder (its shape
        and dtype), then one per ``output_layout`` entry (aligned to
        ``target.alignment`` bytes).  For wrappers that checked their
        arguments already (``te_autodiff.torch``): it skips numpy and the
        checks of a call (a wrong address is a crash, not an exception)."""
        fast = self._fast_at
        if fast:
            if fast(*addresses) >= 0:
                return
        elif fast is False:
            self._native()
        if self._compiled.unrunnable is not None:
            self._refuse(addresses)
        self._run.run_at(addresses)

    def __repr__(self):
        ins = ", ".join(t.name for t in self.inputs)
        outs = ", ".join(t.name for t in self.outputs)
        return f"<Kernel {self.name}({ins}) -> ({outs})>"

