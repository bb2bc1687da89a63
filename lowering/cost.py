"""Exact iteration counts of a loop IR program (``te.cost``, see ``pipeline.py``).

Iterations are counted by compiling a counting variant of the program: every
innermost loop is replaced by ``count += max(extent, 0)``, every other loop
and every index-only condition is kept, and every statement that touches
data is dropped.  A condition that depends on tensor data counts as taken
(both of its branches are counted).  LLVM folds most of these nests into
closed forms, so 10^9 iterations cost nothing to count.
"""
from __future__ import annotations

from te_autodiff import dtype as dt
from te_autodiff.expr import add, const, maximum

from .bounds_check import is_index_only
from .loop_ir import Block, Buffer, BufLoad, For, If, Program, Stage, Store, walk
from .runtime import compile_program, execute
from .target import host_target


def _innermost(loop: For) -> bool:
    return not any(isinstance(s, For) for s in walk(loop.body))


def _count_for(s: For, counter: Buffer, stage: str):
    if not (is_index_only(s.lo) and is_index_only(s.extent)):
        raise ValueError(f"te.cost: a loop bound in stage '{stage}' depends on tensor data")
    zero = const(0, dt.INDEX)
    if _innermost(s):
        return Store(counter, zero, add(BufLoad(counter, zero), maximum(s.extent, zero)))
    body = _counting(s.body, counter, stage)
    return None if body is None else For(s.var, s.lo, s.extent, Block((body,)))


def _count_block(s: Block, counter: Buffer, stage: str):
    parts = tuple(p for p in (_counting(x, counter, stage) for x in s.stmts) if p is not None)
    return Block(parts) if parts else None


def _count_if(s: If, counter: Buffer, stage: str):
    then = _counting(s.then, counter, stage)
    other = None if s.else_ is None else _counting(s.else_, counter, stage)
    if then is None and other is None:
        return None
    if not is_index_only(s.cond):          # data decides: both branches count as taken
        return Block(tuple(p for p in (then, other) if p is not None))
    return If(s.cond, then or Block(()), other)


_COUNTING = {For: _count_for, Block: _count_block, If: _count_if}


def _counting(stmt, counter: Buffer, stage: str):
    """The counting version of ``stmt`` (None when it counts nothing)."""
    rule = _COUNTING.get(type(stmt))
    return None if rule is None else rule(stmt, counter, stage)


def count_iterations(program: Program) -> int:
    """Exact number of innermost loop-body executions of ``program``."""
    counter = Buffer("count", (1,), dt.INDEX, "output")
    zero = const(0, dt.INDEX)
    stages = [Stage("zero", counter, Store(counter, zero, zero))]
    for st in program.stages:
        body = _counting(st.body, counter, st.name)
        if body is not None:
            stages.append(Stage(st.name, counter, body))
    counting = Program(f"count_{program.name}", (counter,), tuple(stages), (counter,), ())
    storage = execute(counting, compile_program(counting, host_target()), [])
    return int(storage[counter][0])
