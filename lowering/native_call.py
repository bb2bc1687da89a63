"""A kernel call from Python in one native step: argument checks, buffer table, run.

A call through ctypes costs microseconds of Python before any work: the
data address of every array (``ctypes.c_char.from_buffer``), a buffer table
filled slot by slot, a foreign call converting six arguments.  Here two
functions, compiled once per process, are builtin Python functions
(``METH_FASTCALL``, made with ``PyCFunction_NewEx``) bound to one kernel's
:class:`Descriptor`, and do all of it natively:

* ``arrays(raw blocks..., input arrays...)`` checks that each input is a
  ``numpy.ndarray`` (not a subclass) of the placeholder's dtype (numpy's
  own descriptor object) and shape, C-contiguous and aligned, reading
  numpy's array struct; points each output at the first ``align``-byte
  boundary of its raw block (a ``uint8`` array the caller allocated
  ``align`` bytes longer); runs every stage on the calling thread with the
  GIL released; and returns each output's offset in its block, packed
  ``bits`` bits apiece.
* ``addresses(input addresses..., output addresses...)`` (``Kernel.call_at``)
  takes the data addresses as Python ints and only runs.

Either returns -1 instead when anything is not as expected (an argument,
its count, a failed index check in the kernel, or another thread running
the same kernel, whose buffer table and temporaries are taken): the caller
then runs the checked Python path, which raises the error naming the
placeholder (before any native code ran for a wrong argument), copies an
input that is not contiguous, or uses its own thread's table.  Nothing is
written to the caller's memory before every check passed.

Only kernels whose stages all run on the calling thread get a descriptor
(the split stages of a large kernel go through the thread team or pool).
The offsets into numpy's struct are checked against a real array before
the first use; where they differ, no kernel gets a descriptor.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
import weakref

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from . import llvm_process
from .target import data_layout, host_target, target_machine

log = logging.getLogger("te_autodiff.call")

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
METH_FASTCALL = 0x0080
C_CONTIGUOUS_AND_ALIGNED = 0x0001 | 0x0100         # NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED

# descriptor words: a flat int64 array
BUSY, RUN, TABLE, ERR, FLAGS, STAGES, INPUTS, OUTPUTS, ALIGN, BITS, HEADER = range(11)
INPUT_WORDS = 4                                     # slot, dtype descriptor, ndim, index of its dims


class _MethodDef(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("meth", ctypes.c_void_p), ("flags", ctypes.c_int),
                ("doc", ctypes.c_char_p)]


def _layout() -> dict | None:
    """Byte offsets of the object header's type and numpy's array fields
    (data, nd, dimensions, descr, flags: ``PyArrayObject_fields``), checked
    on a real array; None if they are not where they are expected."""
    head = object.__basicsize__                     # PyObject_HEAD, whatever the build
    layout = dict(type=head - ctypes.sizeof(ctypes.c_void_p), data=head, nd=head + 8, dims=head + 16,
                  descr=head + 40, flags=head + 48)
    a = np.zeros((2, 3), np.float32)
    word = lambda off: ctypes.c_int64.from_address(id(a) + off).value        # noqa: E731
    dims = word(layout["dims"])
    ok = (word(layout["type"]) == id(np.ndarray) and word(layout["data"]) == a.ctypes.data
          and ctypes.c_int32.from_address(id(a) + layout["nd"]).value == 2
          and [ctypes.c_int64.from_address(dims + 8 * k).value for k in range(2)] == [2, 3]
          and word(layout["descr"]) == id(a.dtype)
          and ctypes.c_int32.from_address(id(a) + layout["flags"]).value == a.flags.num)
    return layout if ok else None


def _api(name: str) -> int:
    return ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value


# ------------------------------------------------------------------ the IR


class _Callee:
    """A function pointer value called as a function of type ``function_type``."""

    type = PTR

    def __init__(self, pointer, function_type):
        self.pointer, self.function_type = pointer, function_type

    def get_reference(self):
        return self.pointer.get_reference()


class _Emitter:
    """Builds the two entry functions (the process's addresses of numpy's
    array type and of the C API functions they call are constants)."""

    def __init__(self, module, layout):
        self.module, self.layout = module, layout
        self.api = {name: ir.Constant(I64, _api(name)) for name in
                    ("PyLong_AsVoidPtr", "PyLong_FromSsize_t", "PyEval_SaveThread", "PyEval_RestoreThread")}
        self.types = {"ndarray": ir.Constant(I64, id(np.ndarray)), "int": ir.Constant(I64, id(int))}

    def function(self, name):
        fn = ir.Function(self.module, ir.FunctionType(PTR, [PTR, PTR, I64]), name=name)
        self.fn = fn
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.slow = fn.append_basic_block("slow")
        self_, args, nargs = fn.args
        self.args = args
        self.d = self.b.inttoptr(self.field(self_, "data"), PTR)
        return nargs

    def call(self, name, ret, params, values):
        """A call of the C API function ``name`` (its address is a constant)."""
        return self.b.call(_Callee(self.b.inttoptr(self.api[name], PTR), ir.FunctionType(ret, params)), values)

    def word(self, k):
        """Descriptor word ``k`` (an i64 value or a Python int)."""
        k = ir.Constant(I64, k) if isinstance(k, int) else k
        return self.b.load(self.b.gep(self.d, [k], source_etype=I64), typ=I64)

    def field(self, obj, name, typ=I64):
        return self.b.load(self.b.gep(obj, [ir.Constant(I64, self.layout[name])], source_etype=I8), typ=typ)

    def arg(self, k):
        return self.b.load(self.b.gep(self.args, [k], source_etype=PTR), typ=PTR)

    def loop(self, count, body):
        """``body(i)`` for ``i`` in ``[0, count)`` (i64 values)."""
        b = self.b
        before = b.block
        head = self.fn.append_basic_block("head")
        work = self.fn.append_basic_block("work")
        after = self.fn.append_basic_block("after")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64)
        i.add_incoming(ir.Constant(I64, 0), before)
        b.cbranch(b.icmp_signed("<", i, count), work, after)
        b.position_at_end(work)
        body(i)
        nxt = b.add(i, ir.Constant(I64, 1))
        i.add_incoming(nxt, b.block)
        b.branch(head)
        b.position_at_end(after)

    def unless(self, cond):
        """Go to the slow return when ``cond`` (an i1) is false."""
        ok = self.fn.append_basic_block("ok")
        self.b.cbranch(cond, ok, self.slow)
        self.b.position_at_end(ok)

    def set_slot(self, slot, address):
        table = self.b.inttoptr(self.word(TABLE), PTR)
        self.b.store(address, self.b.gep(table, [slot], source_etype=I64))

    def take(self):
        """Take the descriptor's table (``BUSY`` 0 -> 1), or go to the slow return."""
        busy = self.b.gep(self.d, [ir.Constant(I64, BUSY)], source_etype=I64)
        pair = self.b.cmpxchg(busy, ir.Constant(I64, 0), ir.Constant(I64, 1), "acquire", "monotonic")
        self.unless(self.b.extract_value(pair, 1))

    def run_and_return(self, result):
        """Run the stages with the GIL released; return ``result`` (-1 if a check failed)."""
        b = self.b
        state = self.call("PyEval_SaveThread", PTR, [], [])
        run = b.inttoptr(self.word(RUN), PTR)
        err = b.inttoptr(self.word(ERR), PTR)
        b.call(_Callee(run, ir.FunctionType(ir.VoidType(), [PTR, I64, I64, PTR, I64, PTR])),
               [b.inttoptr(self.word(TABLE), PTR), ir.Constant(I64, 0), self.word(STAGES), err,
                ir.Constant(I64, 1), b.inttoptr(self.word(FLAGS), PTR)])
        self.call("PyEval_RestoreThread", ir.VoidType(), [PTR], [state])
        code = b.load(err, typ=I64)
        failed = b.icmp_signed("!=", code, ir.Constant(I64, 0))
        with b.if_then(failed):             # cleared for the next call; the Python path reports it
            b.store(ir.Constant(I64, 0), err)
            b.store(ir.Constant(I64, 0), b.gep(err, [ir.Constant(I64, 1)], source_etype=I64))
        busy = b.gep(self.d, [ir.Constant(I64, BUSY)], source_etype=I64)
        b.atomic_rmw("xchg", busy, ir.Constant(I64, 0), "release")
        b.ret(self.call("PyLong_FromSsize_t", PTR, [I64], [b.select(failed, ir.Constant(I64, -1), result)]))
        b.position_at_end(self.slow)
        b.ret(self.call("PyLong_FromSsize_t", PTR, [I64], [ir.Constant(I64, -1)]))

    def arrays(self):
        nargs = self.function("te_call_arrays")
        b = self.b
        n_in, n_out = self.word(INPUTS), self.word(OUTPUTS)
        self.unless(b.icmp_signed("==", nargs, b.add(n_in, n_out)))

        def check(i):
            obj = self.arg(b.add(n_out, i))
            spec = b.add(ir.Constant(I64, HEADER), b.mul(i, ir.Constant(I64, INPUT_WORDS)))
            at = lambda k: self.word(b.add(spec, ir.Constant(I64, k)))      # noqa: E731
            self.unless(b.icmp_signed("==", self.field(obj, "type"), self.types["ndarray"]))
            self.unless(b.icmp_signed("==", self.field(obj, "descr"), at(1)))
            nd = b.sext(self.field(obj, "nd", I32), I64)
            self.unless(b.icmp_signed("==", nd, at(2)))
            flags = b.and_(self.field(obj, "flags", I32), ir.Constant(I32, C_CONTIGUOUS_AND_ALIGNED))
            self.unless(b.icmp_signed("==", flags, ir.Constant(I32, C_CONTIGUOUS_AND_ALIGNED)))
            dims, first = b.inttoptr(self.field(obj, "dims"), PTR), at(3)

            def same(k):
                got = b.load(b.gep(dims, [k], source_etype=I64), typ=I64)
                self.unless(b.icmp_signed("==", got, self.word(b.add(first, k))))
            self.loop(nd, same)
        self.loop(n_in, check)
        self.take()

        def point_input(i):
            obj = self.arg(b.add(n_out, i))
            self.set_slot(self.word(b.add(ir.Constant(I64, HEADER), b.mul(i, ir.Constant(I64, INPUT_WORDS)))),
                          self.field(obj, "data"))
        self.loop(n_in, point_input)
        packed = b.alloca(I64)
        b.store(ir.Constant(I64, 0), packed)
        outputs = b.add(ir.Constant(I64, HEADER), b.mul(n_in, ir.Constant(I64, INPUT_WORDS)))
        mask, bits = b.sub(self.word(ALIGN), ir.Constant(I64, 1)), self.word(BITS)

        def point_output(k):
            data = self.field(self.arg(k), "data")
            offset = b.and_(b.neg(data), mask)
            self.set_slot(self.word(b.add(outputs, k)), b.add(data, offset))
            b.store(b.or_(b.load(packed, typ=I64), b.shl(offset, b.mul(bits, k))), packed)
        self.loop(n_out, point_output)
        self.run_and_return(b.load(packed, typ=I64))

    def addresses(self):
        nargs = self.function("te_call_addresses")
        b = self.b
        n_in, n_out = self.word(INPUTS), self.word(OUTPUTS)
        self.unless(b.icmp_signed("==", nargs, b.add(n_in, n_out)))

        def check(j):
            self.unless(b.icmp_signed("==", self.field(self.arg(j), "type"), self.types["int"]))
        self.loop(nargs, check)
        self.take()
        outputs = b.add(ir.Constant(I64, HEADER), b.mul(n_in, ir.Constant(I64, INPUT_WORDS)))

        def point(j):
            address = b.ptrtoint(self.call("PyLong_AsVoidPtr", PTR, [PTR], [self.arg(j)]), I64)
            is_input = b.icmp_signed("<", j, n_in)
            word = b.select(is_input, b.add(ir.Constant(I64, HEADER), b.mul(j, ir.Constant(I64, INPUT_WORDS))),
                            b.add(outputs, b.sub(j, n_in)))
            self.set_slot(self.word(word), address)
        self.loop(nargs, point)
        self.run_and_return(ir.Constant(I64, 0))


# ------------------------------------------------------------ compilation


_lock = threading.Lock()
_methods = None             # the two method definitions, or () where there are none


_states = weakref.WeakValueDictionary()     # every descriptor's state array, by id


def _after_fork_in_child():
    """A lock held by another thread at a fork is never released in the
    child, nor a kernel's table that thread held: the child has no other
    thread, so every table is free."""
    global _lock
    _lock = threading.Lock()
    for state in list(_states.values()):
        state[BUSY] = 0


os.register_at_fork(after_in_child=_after_fork_in_child)


def _method_defs():
    """The entries compiled and linked into this process (once), as method
    definitions; none where numpy's struct is not as expected or LLVM
    failed on them (kernels then take the Python path)."""
    global _methods
    with _lock:
        if _methods is None:
            layout = _layout()
            try:
                _methods = () if layout is None else _compile(layout)
            except RuntimeError as e:
                log.warning("kernels are called through Python: the native call entry failed to build (%s)", e)
                _methods = ()
        return _methods


def _compile(layout) -> tuple:
    t = host_target()
    module = ir.Module(name="te_call")
    module.triple, module.data_layout = t.triple, data_layout(t)
    emitter = _Emitter(module, layout)
    emitter.arrays()
    emitter.addresses()
    _, code = llvm_process.run("compile_object", str(module), t.llvm_spec, t.vector_bytes, what="the call entry")
    jit = llvm.create_lljit_compiler(target_machine(t))
    builder = llvm.JITLibraryBuilder().add_object_img(code)
    names = ("te_call_arrays", "te_call_addresses")
    for name in names:
        builder.export_symbol(name)
    library = builder.link(jit, "te_call")
    defs = tuple(_MethodDef(name.encode(), library[name], METH_FASTCALL, None) for name in names)
    _keep.extend((jit, library))
    return defs


_keep = []                  # the JIT and its library: the entries stay loaded for the process's life
_new_function = ctypes.pythonapi.PyCFunction_NewEx
_new_function.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p]
_new_function.restype = ctypes.py_object


# ------------------------------------------------------------- descriptor


class Descriptor:
    """One kernel's state for the native entries, in one int64 array that
    the two builtin functions hold (``arrays`` and ``addresses``): the
    words the entries read, its buffer table, error slots, split flags (all
    clear) and the temporaries' block, so that it lives as long as they do.

    ``inputs``: ``(slot, numpy dtype, shape)`` per placeholder; ``outputs``:
    the table slot of each output; ``temps``: ``(slot, byte offset)`` in a
    block of ``temp_bytes``; ``align``: the outputs' and temporaries'
    alignment.  None of the entries exists (``available`` false) where
    numpy's array struct is not laid out as expected."""

    def __init__(self, run_stages: int, stages: int, buffers: int, inputs, outputs, temps, temp_bytes: int,
                 align: int):
        defs = _method_defs()
        self.available = bool(defs) and len(outputs) * (align - 1).bit_length() <= 62
        if not self.available:
            return
        bits = max((align - 1).bit_length(), 1)
        words = [0] * HEADER
        specs, dims = [], []
        start = HEADER + INPUT_WORDS * len(inputs) + len(outputs)
        for slot, dtype, shape in inputs:
            specs += [slot, id(np.dtype(dtype)), len(shape), start + len(dims)]
            dims += list(shape)
        table = start + len(dims)
        err = table + buffers
        flags = err + 2
        temps_at = flags + -(-stages // 8)
        state = np.zeros(temps_at + (temp_bytes + align) // 8 + 1, np.int64)
        base = state.ctypes.data
        block = base + 8 * temps_at
        block += -block % align
        words[RUN], words[TABLE], words[ERR], words[FLAGS] = run_stages, base + 8 * table, base + 8 * err, \
            base + 8 * flags
        words[STAGES], words[INPUTS], words[OUTPUTS], words[ALIGN], words[BITS] = \
            stages, len(inputs), len(outputs), align, bits
        state[:start + len(dims)] = words + specs + list(outputs) + dims
        for slot, offset in temps:
            state[table + slot] = block + offset
        self.state, self.bits, self.mask = state, bits, (1 << bits) - 1
        _states[id(state)] = state
        self.arrays = _new_function(ctypes.addressof(defs[0]), state, None)
        self.addresses = _new_function(ctypes.addressof(defs[1]), state, None)
