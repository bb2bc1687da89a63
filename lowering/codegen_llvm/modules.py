"""A program's LLVM modules: one entry point per stage, the stages of one
template sharing a body function, and the stage groups partitioned into
modules of balanced weight, so LLVM optimises several at once."""
from __future__ import annotations

import re
from collections import Counter

from llvmlite import ir

from ..fast_math import BODIES
from ..loop_ir import Program, stage_buffers
from .. import share
from ..target import Target
from .emitter import INLINE_MATH_USES, FunctionEmitter, add_vector_attributes
from .llvm_types import I64, MEMORY_TYPE, PTR
from .run_stages import emit_run_stages

_ENTRY = ir.FunctionType(ir.VoidType(), [PTR, I64, I64, PTR])   # stageN(buffers, lo, hi, err)


def stage_symbol(n: int) -> str:
    return f"stage{n}"


def stage_groups(program: Program, target: Target) -> list:
    """``program``'s stages grouped by template (:func:`~lowering.share.group`)."""
    read = frozenset().union(*(stage_buffers(stage)[1] for stage in program.stages))
    return share.group(program.stages, target.alignment, read)


def emit_modules(program: Program, groups: list, target: Target, data_layout: str = "", openmp: bool = False,
                 parts: int = 1):
    """LLVM modules for ``target``, at most ``parts`` of them (see
    :func:`partition`), together one entry point ``stageN`` per stage of
    ``program`` and, in the first, ``run_stages`` running a range of them
    (splitting stages across threads through libgomp's ``GOMP_parallel``
    when ``openmp``).  The stages of one template (``groups``:
    :func:`stage_groups`) call one body function, with their own buffers at
    their own offsets; a template and its entries are in one module, and the
    first module declares the entries the others define.  A generator: the
    modules are emitted one at a time, so LLVM can work on one while the
    next is emitted."""
    part_of = partition([compile_weight(members[0].key[0]) for _, members in groups], parts)
    index = {buf: k for k, buf in enumerate(program.buffers)}
    number = {id(stage): n for n, stage in enumerate(program.stages)}
    for part in range(max(part_of, default=0) + 1):
        module = ir.Module(name=f"{program.name}.{part}" if part else program.name)
        module.triple, module.data_layout = target.triple, data_layout
        entries = {}
        for k, (template, members) in enumerate(groups):
            if part_of[k] != part:
                continue
            # the slots some stage reads (share.form's key says which)
            read = frozenset(c for c, (_, _, is_read, _) in zip(share.slot_buffers(template), members[0].key[1])
                             if is_read)
            name = stage_symbol(number[id(template)]) + ".body" if len(members) == 1 else f"template{k}"
            body = FunctionEmitter(module, template, name, target, read, inline=len(members) == 1)
            for member in members:
                n = number[id(member.stage)]
                entries[n] = _entry(module, stage_symbol(n), target, body.fn,
                                    [(index[buf], off, buf.dtype) for buf, off in member.slots])
        if part == 0:
            emit_run_stages(module, program, [entries[n] if n in entries else
                                               ir.Function(module, _ENTRY, name=stage_symbol(n))
                                               for n in range(len(program.stages))], openmp, target)
        yield module


# LLVM's time for a stage group, in characters of its loop-IR text: a fixed
# part for its functions, its text, and for each transcendental function the
# vector instructions of its inline code (fast_math.py; one copy when the
# group calls it).  Only the ratios matter (they balance the modules).
GROUP_TEXT, MATH_TEXT = 1_000, 600
PART_TEXT = 10_000      # weight worth an LLVM process of its own
_MATH_CALL = re.compile(r"\b(" + "|".join(sorted({op for op, _ in BODIES})) + r")\(")


def compile_weight(text: str) -> int:
    """Roughly how long LLVM takes over a stage group whose typed loop IR is ``text``."""
    copies = sum(n if n <= INLINE_MATH_USES else 1 for n in Counter(_MATH_CALL.findall(text)).values())
    return GROUP_TEXT + len(text) + MATH_TEXT * copies


def partition(sizes: list, parts: int) -> list:
    """The module each of the stage groups of ``sizes`` (their
    :func:`compile_weight`) goes to: at most ``parts`` modules, one per
    ``PART_TEXT``, balanced by giving each group, heaviest first, to the
    module with the least weight so far.  Module 0 also holds ``run_stages``."""
    count = max(1, min(parts, sum(sizes) // PART_TEXT))
    load, out = [0] * count, [0] * len(sizes)
    for k in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
        out[k] = load.index(min(load))
        load[out[k]] += sizes[k]
    return out


def _entry(module, name, target, body, slots):
    """``name(i8** buffers, i64 lo, i64 hi, i64* err)``: calls ``body`` with
    the buffers ``slots`` names (``(table index, element offset, dtype)``)."""
    entry = ir.Function(module, _ENTRY, name=name)
    add_vector_attributes(entry, target)
    entry.attributes.add("noinline")    # one machine code per stage, whatever calls it: the
    table, lo, hi, err = entry.args     # same bits from run_stages, a thread chunk or Python
    for arg in (table, err):
        arg.add_attribute("noalias")
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    ptrs = []
    for slot, off, dtype in slots:
        ptr = b.load(b.gep(table, [ir.Constant(I64, slot)], source_etype=PTR), typ=PTR)
        if off:
            ptr = b.gep(ptr, [ir.Constant(I64, off)], inbounds=True, source_etype=MEMORY_TYPE[dtype])
        ptrs.append(ptr)
    b.call(body, ptrs + [lo, hi, err])
    b.ret_void()
    return entry
