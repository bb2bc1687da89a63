"""A stage as the rules see it: output loops around an element body (the
shape ``lower.py`` gives every stage), and what the rules ask of that body:
its memory accesses and how often they run, loop ranges, reductions and
their accumulators."""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from te_autodiff.expr import BinOp, Cast, Const, Var, add, maximum, minimum, mul

from ..loop_ir import (Alloc, Assign, Block, Buffer, For, If, Stage, Store, free_leaves, loads_in, stmt_exprs,
                       stride, walk)
from .constructors import as_block

UNKNOWN_TRIPS = 16           # assumed iterations of a loop whose extent is not a constant
COMBINE = {"add": add, "mul": mul, "max": maximum, "min": minimum}


@dataclass
class Nest:
    """A stage as output loops (outermost first) around an element body."""

    loops: list
    body: Block

    @property
    def vars(self):
        return [lp.var for lp in self.loops]

    @property
    def extents(self):
        return [lp.extent.value for lp in self.loops]

    def extent(self, v) -> int:
        return self.extents[self.vars.index(v)]

    def around(self, body) -> For:
        """The output loops around a new element ``body``, the outermost parallel."""
        return assemble(self.loops, body)


def as_nest(stage: Stage):
    """The output loops and element body of ``stage``, or None when it does not
    have the shape ``lower.py`` gives (constant extents from zero)."""
    loops, s = [], stage.body
    while True:
        if not (isinstance(s, For) and isinstance(s.lo, Const) and s.lo.value == 0
                and isinstance(s.extent, Const)):
            return None
        loops.append(s)
        body = s.body
        if isinstance(body, Block) and len(body.stmts) == 1 and isinstance(body.stmts[0], For):
            s = body.stmts[0]
        elif isinstance(body, For):
            s = body
        else:
            return Nest(loops, as_block(body))


def assemble(chain, body=None):
    """Nest ``chain`` (outermost first), the outermost parallel, around
    ``body`` (default: the body of the last loop of ``chain``)."""
    body = chain[-1].body if body is None else body
    for d in reversed(range(len(chain))):
        lp = chain[d]
        loop = For(lp.var, lp.lo, lp.extent, body, "parallel" if d == 0 else "serial")
        body = loop if d == 0 else Block((loop,))
    return body


def trips(loop: For) -> int:
    return max(loop.extent.value, 0) if isinstance(loop.extent, Const) else UNKNOWN_TRIPS


def operand_bytes(accesses, moves: Var, fixed: Var, extent: int) -> int:
    """Bytes of the operand a GEMM's loads read along ``moves`` (``extent``
    iterations), not along ``fixed``: each such load over ``moves`` and the
    loops inside the element, the largest (a tile's row operand: ``moves``
    the rows, ``fixed`` the columns; its column operand the other way)."""
    return max((extent * prod(trips(lp) for lp in a.loops) * np.dtype(a.buffer.dtype).itemsize
                for a in accesses if a.loops and not a.store and stride(a.index, fixed) == 0
                and stride(a.index, moves) != 0), default=0)


def depends(exprs, names) -> bool:
    return any(free_leaves(e) & names for e in exprs)


@dataclass
class Access:
    buffer: Buffer
    index: object
    weight: int               # times it runs per element
    store: bool
    loops: tuple              # reduction loops around it, outermost first
    tested: frozenset = frozenset()   # the variables the tests around it read


def accesses_of(body) -> list:
    """Every load and store of an element body with its run count per element."""
    out = []

    def exprs(es, weight, loops, tested):
        out.extend(Access(e.buffer, e.index, weight, False, loops, tested) for e in loads_in(es, set()))

    def visit(s, weight, loops, tested):
        if isinstance(s, Block):
            for x in s.stmts:
                visit(x, weight, loops, tested)
        elif isinstance(s, For):
            exprs(stmt_exprs(s), weight, loops, tested)
            visit(s.body, weight * trips(s), loops + (s,), tested)
        elif isinstance(s, If):
            exprs(stmt_exprs(s), weight, loops, tested)
            inside = tested | frozenset(free_leaves(s.cond))
            visit(s.then, weight, loops, inside)
            if s.else_ is not None:
                visit(s.else_, weight, loops, inside)
        else:
            if isinstance(s, Store):
                out.append(Access(s.buffer, s.index, weight, True, loops, tested))
            exprs(stmt_exprs(s), weight, loops, tested)

    visit(body, 1, (), frozenset())
    return out


def loop_ranges(nest: Nest) -> dict:
    """``{variable: (first, last)}`` of the output loops and of the constant-bound loops inside."""
    out = {v: (0, n - 1) for v, n in zip(nest.vars, nest.extents)}
    for x in walk(nest.body):
        if isinstance(x, For) and isinstance(x.lo, Const) and isinstance(x.extent, Const):
            out[x.var] = (x.lo.value, x.lo.value + x.extent.value - 1)
    return out


def innermost_reduction(body):
    """The innermost loop of the element body when all the body's loops form
    one chain (the usual single reduction), else None."""
    loops = [s for s in walk(body) if isinstance(s, For)]
    if not loops:
        return None
    inner = loops[-1]
    if any(isinstance(x, For) for x in walk(inner.body)):
        return None
    return inner


def _perfect_nest(s):
    """``(loops, innermost body)`` of a nest of constant-bound loops, each
    holding only the next; None otherwise."""
    loops = []
    while isinstance(s, For) and isinstance(s.lo, Const) and isinstance(s.extent, Const):
        loops.append(s)
        body = s.body
        inner = body.stmts[0] if isinstance(body, Block) and len(body.stmts) == 1 else body
        if not isinstance(inner, For):
            return loops, body
        s = inner
    return None


def loop_nests(body: Block):
    """``(k, loops, innermost body)`` for each statement ``k`` of ``body`` that
    is a nest of constant-bound loops, each holding only the next."""
    for k, s in enumerate(body.stmts):
        found = _perfect_nest(s)
        if found is not None:
            yield (k,) + found


def accumulation(assign: Assign):
    """``(op, e)`` when ``assign`` is ``acc = acc op e`` with ``e`` not reading ``acc``."""
    v = assign.value
    while isinstance(v, Cast) and v.to == assign.local.dtype:
        v = v.a
    if not (isinstance(v, BinOp) and v.op in COMBINE):
        return None
    for a, e in ((v.a, v.b), (v.b, v.a)):
        if a is assign.local and assign.local not in free_leaves(e):
            return v.op, e
    return None


def outer_writes(inner) -> list:
    """The assignments in ``inner`` to locals declared outside it (the accumulators of a reduction)."""
    declared = {x.local for x in walk(inner) if isinstance(x, Alloc)}
    return [x for x in walk(inner) if isinstance(x, Assign) and x.local not in declared]
