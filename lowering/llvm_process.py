"""LLVM's optimiser and code generator, run in a child process.

Why a child process:

* **Memory.**  Each run of llvmlite 0.50's optimisation pipeline leaks about
  100 KB (``LLVMPY_CreatePassBuilder`` allocates instrumentation callbacks
  that nothing frees), so a notebook or a service that builds kernels for
  changing shapes would grow without bound.  The child is replaced after
  ``RESTART_AFTER`` requests, which bounds what it can hold; this process
  only links the object code it gets back (``runtime.py``).
* **Crashes.**  An LLVM assertion or a crash in a pass aborts the process it
  runs in.  Here that is the child: the build raises ``RuntimeError`` naming
  the kernel, and the next request starts a new child.
* **Hangs.**  A pass that never finishes would hang the build.  The parent
  waits ``TE_LLVM_TIMEOUT`` seconds (default ``TIMEOUT``) for an answer, then
  kills the child and raises ``RuntimeError``.  A child whose parent has gone
  (killed, or timed out itself) exits within a second instead of running on
  as an orphan.
* **Time.**  There is one child per core (at most ``MAX_WORKERS``):
  ``run_all`` compiles the parts of a large program at once, one per child.

The child is this file run as a script: it imports llvmlite and nothing of
te-autodiff, reads pickled ``(operation, arguments)`` requests on stdin and
answers each on its own pipe.  ``TE_LLVM_PROCESS=0`` (or a machine where no
child can be started) runs the same functions in this process instead.
"""
from __future__ import annotations

import logging
import os
import pickle
import re
import select
import subprocess
import sys
import tempfile
import threading
import time

import llvmlite.binding as llvm

log = logging.getLogger("te_autodiff.llvm")

MAX_WORKERS = 4                 # LLVM processes at most (each holds LLVM's memory, plus its leak)
RESTART_AFTER = 256             # requests one child serves before it is replaced (bounds its leak)
TIMEOUT = 300.0                 # seconds one request may take (a large kernel takes a few)
SLP_SECONDS, SLP_SECONDS_PER_KB = 10.0, 0.1     # see slp_budget

_MASKED = re.compile(r"llvm\.masked\.(?:load|store|gather|scatter|expandload|compressstore)\.v(\d+)([if])(\d+)")


# ----------------------------------------------------------- what the child does


def _initialise():
    """Set up LLVM, once per process.  LLVM 22.1's VectorCombine pass is
    switched off: when it scalarises a vector operation whose scalar form
    folds to an instruction that already exists, it copies the vector
    operation's flags (``exact``, ``nuw``) onto that instruction, and later
    folds trust them (llvm-project issue 192607): the lane-0 part of
    ``(i // 2 * 4 + lane) // 4`` made ``i >> 1`` exact, so ``i // 2 * 4``
    became ``i * 2`` and odd ``i`` read and wrote the wrong elements."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.initialize_native_asmparser()
    llvm.set_option("", "-disable-vector-combine")


def _machine(spec):
    """A target machine for ``spec = (triple, cpu, features)``."""
    triple, cpu, features = spec
    # position-independent: the parent links the object anywhere in its address space
    return llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=3, reloc="pic")


def masked_wider_than(llvm_ir: str, vector_bytes: int) -> bool:
    """Whether ``llvm_ir`` has a masked memory operation on data wider than ``vector_bytes``."""
    return any(int(lanes) * int(bits) > 8 * vector_bytes for lanes, _, bits in _MASKED.findall(llvm_ir)
               if int(bits) > 1)


def _optimised(ir_text: str, tm, vector_bytes: int, slp: bool):
    """``ir_text`` parsed and run through LLVM's -O3 pipeline for ``tm``.
    LLVM 22.1's SLP vectoriser can leave a module that code generation must
    not see, which is then optimised again without it:

    * a masked memory operation wider than the target's vectors, made of
      strided scalar loads (a max pool's window in float64; te never emits
      one): type legalisation splits it, where LLVM can abort the process
      ("unknown LocationSize", llvm-project issue 180251);
    * an invalid module: a shuffle among its own operands (a second-order
      gradient of ``sigmoid(log(x² + 1))`` found by the fuzzer), on which
      instruction selection asserts ("Already set a value for this node").

    ``slp=False`` (a retry after a hang: ``slp_budget``) never uses it.  A
    module still invalid without it raises ``RuntimeError``."""
    for with_slp in (True, False) if slp else (False,):
        module = llvm.parse_assembly(ir_text)
        module.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = True
        pto.slp_vectorization = with_slp
        pto.loop_unrolling = True
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(module, pb)
        if with_slp and _sound(module, vector_bytes):
            return module
    module.verify()
    return module


def _sound(module, vector_bytes: int) -> bool:
    """Whether an optimised ``module`` is valid and safe to generate code for."""
    try:
        module.verify()
    except RuntimeError:
        return False
    return not masked_wider_than(str(module), vector_bytes)


def optimise(ir_text: str, spec, vector_bytes: int, slp: bool = True) -> str:
    """The optimised module's text (a kernel that this machine cannot run)."""
    return str(_optimised(ir_text, _machine(spec), vector_bytes, slp))


def compile_object(ir_text: str, spec, vector_bytes: int, slp: bool = True) -> tuple:
    """``(optimised IR text, object code)`` for ``ir_text``."""
    tm = _machine(spec)
    module = _optimised(ir_text, tm, vector_bytes, slp)
    return str(module), tm.emit_object(module)


def assembly(ir_text: str, spec) -> str:
    """The machine code of (optimised) ``ir_text`` as assembly text."""
    return _machine(spec).emit_assembly(llvm.parse_assembly(ir_text))


def link(ir_texts: list) -> str:
    """The modules ``ir_texts`` linked into one (the parts of a program, each
    calling the others' functions), as text."""
    module = llvm.parse_assembly(ir_texts[0])
    for text in ir_texts[1:]:
        module.link_in(llvm.parse_assembly(text))
    return str(module)


_OPERATIONS = {"optimise": optimise, "compile_object": compile_object, "assembly": assembly, "link": link}
_OPTIMISING = ("optimise", "compile_object")


def _watch_parent(parent: int):
    """Exit once ``parent`` is gone.  A thread: LLVM runs through ctypes,
    which releases the GIL, so this runs even while a pass is looping."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _serve(parent: int):
    """The child's loop: answer requests until stdin closes.  Answers go to a
    copy of stdout; stdout itself is pointed at stderr so that nothing LLVM
    prints can corrupt them."""
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    _initialise()
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while True:
        try:
            operation, args = pickle.load(requests)
        except EOFError:
            return
        try:
            answer = ("ok", _OPERATIONS[operation](*args))
        except Exception as e:          # reported to the parent, which raises it
            answer = ("error", f"{type(e).__name__}: {e}")
        pickle.dump(answer, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()


# ---------------------------------------------------------- the parent's side


class _Child:
    """One running child and the file its stderr goes to."""

    def __init__(self):
        self.stderr = tempfile.TemporaryFile()
        # -P (Python 3.11+): this file's directory stays off sys.path; its modules are not the child's
        flags = ["-P"] if sys.version_info >= (3, 11) else []
        self.process = subprocess.Popen([sys.executable, *flags, os.path.abspath(__file__), str(os.getpid())],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)
        self.served = 0

    def ask(self, operation: str, args: tuple, timeout: float):
        """The child's answer to one request; ``TimeoutError`` after ``timeout`` seconds without one."""
        pickle.dump((operation, args), self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self.process.stdin.flush()
        self.served += 1
        # the child writes a whole answer at once: waiting for its first byte is waiting for all of it
        if not select.select([self.process.stdout], [], [], timeout)[0]:
            raise TimeoutError
        return pickle.load(self.process.stdout)

    def crash_report(self) -> str:
        code = self.process.wait()
        self.stderr.seek(0)
        tail = self.stderr.read()[-2000:].decode(errors="replace").strip()
        return f"exit status {code}" + (f"; it said: {tail}" if tail else "")

    def close(self):
        self.process.stdin.close()
        self.process.wait()
        self.stderr.close()

    def kill(self):
        self.process.kill()
        self.process.wait()
        self.stderr.close()


class _Worker:
    """One of the parent's LLVM processes: its child (started on first use)
    and the lock that gives it one request at a time."""

    def __init__(self):
        self.lock = threading.Lock()
        self.child: _Child | None = None


def _worker_count() -> int:
    """How many LLVM processes may compile at once: one per core this process
    may run on, no more than ``TE_NUM_THREADS`` asks te to use (this module
    runs alone in its children, so it reads the variable itself; the target
    checks it), at most ``MAX_WORKERS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        cores = os.cpu_count() or 1
    limit = os.environ.get("TE_NUM_THREADS", "")
    if limit.strip().isdigit() and int(limit) >= 1:
        cores = min(cores, int(limit))
    return max(1, min(MAX_WORKERS, cores))


_workers = [_Worker() for _ in range(_worker_count())]
_in_process = os.environ.get("TE_LLVM_PROCESS", "1") == "0"
_initialised = False


def _after_fork_in_child():
    """A forked process must not talk to its parent's children: it starts its own."""
    global _workers
    _workers = [_Worker() for _ in range(_worker_count())]


os.register_at_fork(after_in_child=_after_fork_in_child)


def _start(slot: _Worker):
    """Start ``slot``'s child if it has none (its lock held); where no child
    can be started, LLVM runs in this process from then on."""
    global _in_process
    if not _in_process and slot.child is None:
        try:
            slot.child = _Child()
        except OSError:             # no interpreter to start: stay in this process
            _in_process = True


def start():
    """Start every LLVM process that is not running, without waiting for it:
    a child imports LLVM while this process lowers and schedules a program."""
    for slot in _workers:
        if slot.lock.acquire(blocking=False):   # a busy one is running
            try:
                _start(slot)
            finally:
                slot.lock.release()


def workers() -> int:
    """How many requests ``run_all`` runs at once."""
    return 1 if _in_process else len(_workers)


def run(operation: str, *args, what: str = "a kernel", worker: int = 0):
    """``operation`` (a name of ``_OPERATIONS``) on ``args``, in LLVM process
    number ``worker``; ``what`` names the kernel in the errors.  An
    optimisation that takes far longer than its module's size warrants is
    stopped and run again without the SLP vectoriser (see ``slp_budget``)."""
    timeout = _timeout()
    if operation in _OPTIMISING:
        budget = slp_budget(args[0])
        if budget < timeout:
            try:
                return _ask(operation, args, budget, what, worker)
            except TimeoutError:
                log.warning("LLVM did not optimise %s within %.0f s; optimising it again without the SLP "
                            "vectoriser", what, budget)
                args = (*args, False)
    try:
        return _ask(operation, args, timeout, what, worker)
    except TimeoutError:
        raise RuntimeError(f"LLVM did not finish compiling {what} within {timeout:g} s (TE_LLVM_TIMEOUT); "
                           "its process was stopped and the next build starts a new one") from None


def run_all(operation: str, requests, what: str = "a kernel") -> list:
    """``run(operation, *args)`` for each ``args`` of the iterable ``requests``
    (a generator is drawn from as the LLVM processes need work), spread over
    the LLVM processes: each takes the next request as soon as it is done
    with one (the parent's threads wait on their pipes).  The answers come in
    order; the first failure, in making a request or in answering it, is
    raised once every request made has been answered."""
    if workers() == 1:
        return [run(operation, *args, what=what) for args in requests]
    pending, lock = enumerate(requests), threading.Lock()
    answers, failures = {}, {}

    def serve(worker: int):
        while True:
            with lock:
                try:
                    item = next(pending, None)
                except Exception as e:      # raised below, in the caller's thread
                    failures[-1] = e
                    item = None
            if item is None:
                return
            k, args = item
            try:
                answers[k] = run(operation, *args, what=what, worker=worker)
            except Exception as e:
                failures[k] = e

    threads = [threading.Thread(target=serve, args=(w,)) for w in range(len(_workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[min(failures)]
    return [answers[k] for k in range(len(answers))]


def slp_budget(ir_text: str) -> float:
    """Seconds an optimisation of ``ir_text`` may take with the SLP vectoriser.
    LLVM 22.1's VectorCombine looped forever on the shuffles SLP made of some
    index arithmetic (llvm-project issue 211984, fixed by pull 211717 after
    22.1); it is switched off (``_initialise``), and this budget keeps any
    other such loop from hanging a build.  The budget is a fixed allowance
    plus four times the slowest optimisation per KB of IR seen for a te
    kernel on a loaded machine (``benchmarks/README.md``): past it, the
    optimisation is a hang."""
    return SLP_SECONDS + SLP_SECONDS_PER_KB * len(ir_text) / 1024


def _ask(operation: str, args: tuple, timeout: float, what: str, worker: int):
    """One request, in LLVM process ``worker`` (started if needed) or in this
    process; ``TimeoutError`` (the child killed) after ``timeout`` seconds."""
    global _initialised
    slot = _workers[worker]
    with slot.lock:
        _start(slot)
        answer = None if _in_process else _answer(slot, operation, args, timeout, what)
    if answer is None:
        with _workers[0].lock:          # LLVM in this process: one request at a time
            if not _initialised:
                _initialise()
                _initialised = True
            return _OPERATIONS[operation](*args)
    status, value = answer
    if status == "error":
        raise RuntimeError(f"LLVM failed on {what}: {value}")
    return value


def _answer(slot: _Worker, operation: str, args: tuple, timeout: float, what: str) -> tuple:
    """``slot``'s child's ``(status, value)`` for one request (its lock held);
    a child that dies or times out is dropped, and one that served
    ``RESTART_AFTER`` requests is retired."""
    child = slot.child
    try:
        answer = child.ask(operation, args, timeout)
    except TimeoutError:
        slot.child = None
        child.kill()
        raise
    except (EOFError, OSError, pickle.UnpicklingError):
        slot.child = None
        raise RuntimeError(f"LLVM crashed while compiling {what} ({child.crash_report()}); "
                           "the next build starts a new LLVM process") from None
    if child.served >= RESTART_AFTER:
        slot.child = None
        child.close()
    return answer


def _timeout() -> float:
    """Seconds to wait for one answer: ``TE_LLVM_TIMEOUT`` if set, else ``TIMEOUT``."""
    text = os.environ.get("TE_LLVM_TIMEOUT")
    if not text:
        return TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"TE_LLVM_TIMEOUT must be a positive number of seconds, got {text!r}")
    return value


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
