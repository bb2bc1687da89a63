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

The child is this file run as a script: it imports llvmlite and nothing of
te-autodiff, reads pickled ``(operation, arguments)`` requests on stdin and
answers each on its own pipe.  ``TE_LLVM_PROCESS=0`` (or a machine where no
child can be started) runs the same functions in this process instead.
"""
from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import tempfile
import threading

import llvmlite.binding as llvm

RESTART_AFTER = 256             # requests one child serves before it is replaced (its leak: ~25 MB)

_MASKED = re.compile(r"llvm\.masked\.(?:load|store|gather|scatter|expandload|compressstore)\.v(\d+)([if])(\d+)")


# ----------------------------------------------------------- what the child does


def _initialise():
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.initialize_native_asmparser()


def _machine(spec):
    """A target machine for ``spec = (triple, cpu, features)``."""
    triple, cpu, features = spec
    # position-independent: the parent links the object anywhere in its address space
    return llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=3, reloc="pic")


def masked_wider_than(llvm_ir: str, vector_bytes: int) -> bool:
    """Whether ``llvm_ir`` has a masked memory operation on data wider than ``vector_bytes``."""
    return any(int(lanes) * int(bits) > 8 * vector_bytes for lanes, _, bits in _MASKED.findall(llvm_ir)
               if int(bits) > 1)


def _optimised(ir_text: str, tm, vector_bytes: int):
    """``ir_text`` parsed and run through LLVM's -O3 pipeline for ``tm``.
    The code te emits never has a masked memory operation wider than the
    target's vectors, but LLVM's SLP vectoriser may make one of strided
    scalar loads (a max pool's window in float64); type legalisation splits
    it, where LLVM 22.1 can abort the process ("unknown LocationSize",
    llvm-project issue 180251).  Such a module is optimised again without
    the SLP vectoriser."""
    for slp in (True, False):
        module = llvm.parse_assembly(ir_text)
        module.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = True
        pto.slp_vectorization = slp
        pto.loop_unrolling = True
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(module, pb)
        if not masked_wider_than(str(module), vector_bytes):
            break
    return module


def optimise(ir_text: str, spec, vector_bytes: int) -> str:
    """The optimised module's text (a kernel that this machine cannot run)."""
    return str(_optimised(ir_text, _machine(spec), vector_bytes))


def compile_object(ir_text: str, spec, vector_bytes: int) -> tuple:
    """``(optimised IR text, object code)`` for ``ir_text``."""
    tm = _machine(spec)
    module = _optimised(ir_text, tm, vector_bytes)
    return str(module), tm.emit_object(module)


def assembly(ir_text: str, spec) -> str:
    """The machine code of (optimised) ``ir_text`` as assembly text."""
    return _machine(spec).emit_assembly(llvm.parse_assembly(ir_text))


_OPERATIONS = {"optimise": optimise, "compile_object": compile_object, "assembly": assembly}


def _serve():
    """The child's loop: answer requests until stdin closes.  Answers go to a
    copy of stdout; stdout itself is pointed at stderr so that nothing LLVM
    prints can corrupt them."""
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
        self.process = subprocess.Popen([sys.executable, *flags, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.stderr)
        self.served = 0

    def ask(self, operation: str, args: tuple):
        pickle.dump((operation, args), self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self.process.stdin.flush()
        self.served += 1
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


_lock = threading.Lock()
_child: _Child | None = None
_in_process = os.environ.get("TE_LLVM_PROCESS", "1") == "0"
_initialised = False


def _after_fork_in_child():
    """A forked process must not talk to its parent's child: it starts its own."""
    global _lock, _child
    _lock = threading.Lock()
    _child = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def run(operation: str, *args, what: str = "a kernel"):
    """``operation`` (a name of ``_OPERATIONS``) on ``args``, in the child
    process; ``what`` names the kernel in the error when LLVM crashes."""
    global _child, _in_process, _initialised
    with _lock:
        if not _in_process and _child is None:
            try:
                _child = _Child()
            except OSError:             # no interpreter to start: stay in this process
                _in_process = True
        if _in_process:
            if not _initialised:
                _initialise()
                _initialised = True
            return _OPERATIONS[operation](*args)
        child = _child
        try:
            status, value = child.ask(operation, args)
        except (EOFError, OSError, pickle.UnpicklingError):
            _child = None
            raise RuntimeError(f"LLVM crashed while compiling {what} ({child.crash_report()}); "
                               "the next build starts a new LLVM process") from None
        if child.served >= RESTART_AFTER:
            _child = None
            child.close()
    if status == "error":
        raise RuntimeError(f"LLVM failed on {what}: {value}")
    return value


if __name__ == "__main__":
    _serve()
