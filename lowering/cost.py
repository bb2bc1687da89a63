"""Exact iteration counts of a loop IR program (``te.cost``, see ``pipeline.py``).

Iterations are counted by compiling a counting variant of the program: every
innermost loop is replaced by ``count += max(extent, 0)``, every other loop
and every index-only condition is kept (with the let-bound locals of index
arithmetic and sort starts they read), and every statement that touches
data is dropped.  A condition that depends on tensor data counts as taken
(both of its branches are counted).  A loop over the matches of an inverse
index (bounds read from a counting sort's starts) counts as if every key
were in range: the counting program fills each sort's starts with an even
share of the positions, so such loops total exactly the number of positions
per row whatever the data.  The stages of a scan's time loop are counted
in that loop, once per step.  LLVM folds most of these nests into closed
forms, so 10^9 iterations cost nothing to count.
"""
from __future__ import annotations

from te_autodiff import dtype as dt
from te_autodiff.expr import add, const, floordiv, maximum, mul, var
from te_autodiff.visit import topo_order

from .bounds_check import is_index_only
from .loop_ir import Alloc, Block, Buffer, BufLoad, For, If, Local, Program, Stage, Store, loads_in, walk
from .runtime import compile_program, execute
from .target import host_target


def _innermost(loop: For) -> bool:
    return not any(isinstance(s, For) for s in walk(loop.body))


class _Counting:
    """The counting version of one stage's statements: they add to
    ``counter[slot]``, the stage's own count."""

    def __init__(self, counter: Buffer, slot: int, stage: str, sorts: frozenset):
        self.counter, self.slot, self.stage, self.sorts = counter, const(slot, dt.INDEX), stage, sorts
        self.kept = set()           # let-bound locals the counting program computes

    def bound_ok(self, e) -> bool:
        """Index arithmetic, reads of the starts of a counting sort, and kept locals."""
        return (all(ld.buffer in self.sorts and is_index_only(ld.index) for ld in loads_in((e,), set()))
                and all(n in self.kept for n in topo_order([e]) if isinstance(n, Local)))

    def alloc(self, s: Alloc):
        """A let-binding of index arithmetic or sort starts (loop bounds and
        conditions may read it) is kept; other locals hold data."""
        if s.let and s.init is not None and self.bound_ok(s.init):
            self.kept.add(s.local)
            return s
        return None

    def for_(self, s: For):
        if not (self.bound_ok(s.lo) and self.bound_ok(s.extent)):
            raise ValueError(f"te.cost: a loop bound in stage '{self.stage}' depends on tensor data")
        if _innermost(s):
            slot = self.slot
            return Store(self.counter, slot, add(BufLoad(self.counter, slot), maximum(s.extent, const(0, dt.INDEX))))
        body = self(s.body)
        return None if body is None else For(s.var, s.lo, s.extent, Block((body,)))

    def block(self, s: Block):
        parts = tuple(p for p in (self(x) for x in s.stmts) if p is not None)
        return Block(parts) if parts else None

    def if_(self, s: If):
        then = self(s.then)
        other = None if s.else_ is None else self(s.else_)
        if then is None and other is None:
            return None
        if not (is_index_only(s.cond) or self.bound_ok(s.cond)):    # data decides: both count as taken
            return Block(tuple(p for p in (then, other) if p is not None))
        return If(s.cond, then or Block(()), other)

    def __call__(self, stmt):
        """The counting version of ``stmt`` (None when it counts nothing)."""
        rule = {For: _Counting.for_, Block: _Counting.block, If: _Counting.if_,
                Alloc: _Counting.alloc}.get(type(stmt))
        return None if rule is None else rule(self, stmt)


def _even_starts(st: Stage) -> Stage:
    """A stand-in for counting sort ``st``: value ``x`` of every row starts at
    ``x · positions // values``, so all positions match some value."""
    values, positions = st.sort
    buf = st.buffer
    width = values + 1 + positions
    row, x = var("row", (0, buf.size // width)), var("x", (0, values + 1))
    start = floordiv(mul(x, const(positions, dt.INDEX)), const(values, dt.INDEX))
    fill = For(x, const(0, dt.INDEX), const(values + 1, dt.INDEX),
               Block((Store(buf, add(mul(row, const(width, dt.INDEX)), x), start),)))
    return Stage(f"{st.name}.even", buf, For(row, const(0, dt.INDEX), const(buf.size // width, dt.INDEX),
                                              Block((fill,)), "parallel"))


def stage_iterations(program: Program) -> list:
    """``[(stage name, innermost loop-body executions)]``, one per stage of
    ``program`` in order (a scan's step counted over all its steps)."""
    n = len(program.stages)
    counter = Buffer("count", (max(n, 1),), dt.INDEX, "output")
    sorts = [st for st in program.stages if st.sort is not None]
    sort_buffers = frozenset(st.buffer for st in sorts)
    slot, zero = var("slot", (0, counter.size)), const(0, dt.INDEX)
    stages = [Stage("zero", counter, For(slot, zero, const(counter.size, dt.INDEX),
                                         Block((Store(counter, slot, zero),))))]
    for k, st in enumerate(program.stages):
        body = _Counting(counter, k, st.name, sort_buffers)(st.body)
        if body is not None:
            stages.append(Stage(st.name, counter, body, step=st.step))
        if st.sort is not None:
            stages.append(_even_starts(st))
    clocks = tuple(dict.fromkeys(st.step.counter for st in program.stages if st.step is not None))
    counting = Program(f"count_{program.name}", (counter,) + tuple(sort_buffers) + clocks, tuple(stages),
                       (counter,), ())
    storage = execute(counting, compile_program(counting, host_target()), [])
    return [(st.name, int(c)) for st, c in zip(program.stages, storage[counter])]
