"""Merged loops: two neighbouring output loops ``a`` (outer) and ``b`` (inner,
extent ``E``) that every access walks as one run of memory become one loop
``q`` over ``extent(a) * E`` elements.  The test: in each load and store
index ``a`` steps ``E`` times as far as ``b`` (``c_a = E c_b``, zero for
both in a broadcast operand), and neither variable is read anywhere else
(no guard, no value, no bound).  Then ``c_a a + c_b b = c_b (E a + b) =
c_b q`` in every index, so ``q`` replaces both without a division.  But
``b`` may be compared with the output loop inside both (a causal mask's
``j <= i`` on a row ``i`` in attention's gradient, whose row stages before
it walk heads and rows as one loop: apart, the rows of the three would
meet in no common loop); the comparison then reads ``q % E``, a division
an iteration of ``q``, not one an element.

Why: a tensor's trailing axes are often short and not a multiple of the
vector (a 14x14 image): vectorised along the last axis alone, each row of
14 fills 14 of 16 lanes and pays a loop's overhead; merged, the stage runs
full vectors over the whole contiguous run.  A copy packing a convolution's
weights ``W[k, c, kh, kw]`` into blocks of ``k`` sees ``(c, kh, kw)`` as one
contiguous loop of the source, which it reads in rows and transposes in
registers (``gather_blocks.py``) instead of gathering every element.

Pairs are merged innermost first, so a run of several axes becomes one loop.
The outermost loop stays as it is: it is the row by which consecutive
stages walking the same rows run as one (``row_chains.py``), which merged
loops vectorised to different widths would no longer share.  The order of
the elements visited is unchanged, so the values are too."""
from __future__ import annotations

from te_autodiff.expr import Cmp, Var, floordiv, mod, var

from ..loop_ir import (BufLoad, Block, For, GuardedLoad, Store, children, free_leaves, map_stmt, rename, simplify_index,
                       stmt_exprs, stride, substituter, walk)
from .constructors import idx
from .nest import Nest


def _accesses(body, column=None):
    """The load and store indices in ``body``, the variables it reads
    anywhere else (values, tests, bounds, a guarded load's condition) and
    those read only in order comparisons with the loop ``column`` (a mask's
    ``j <= i``); the walk enters neither an index nor such a comparison."""
    indices, outside, tested, seen = [], set(), set(), set()
    for s in walk(body):
        if isinstance(s, Store):
            indices.append(s.index)
        stack = [s.value] if isinstance(s, Store) else list(stmt_exprs(s))
        while stack:
            e = stack.pop()
            if e in seen:
                continue
            seen.add(e)
            if isinstance(e, (BufLoad, GuardedLoad)):
                indices.append(e.index)
                stack += [e.cond] if isinstance(e, GuardedLoad) else []
            elif isinstance(e, Cmp) and e.op in ("lt", "le", "gt", "ge") and column in free_leaves(e):
                tested |= free_leaves(e)
            else:
                outside |= {e} if isinstance(e, Var) else set()
                stack += children(e)
    return indices, outside, tested


def mergeable(a: Var, b: Var, extent_b: int, body, column=None):
    """None unless every index in ``body`` steps ``extent_b`` times as far
    with ``a`` as with ``b`` and nothing else reads either, but for ``b`` in
    order comparisons with ``column``, the output loop inside both (see the
    module doc); else whether ``b`` is read there."""
    indices, outside, tested = _accesses(body, column)
    if a in outside or a in tested or b in outside:
        return None
    for index in indices:
        sa, sb = stride(index, a), stride(index, b)
        if sa is None or sb is None or sa != extent_b * sb:
            return None
    return b in tested


def _fresh(name: str, loops, body) -> Var:
    """A variable called ``name``, primed until no loop or expression of the
    nest uses the name."""
    taken = {lp.var.name for lp in loops}
    for s in walk(body):
        taken |= {s.var.name} if isinstance(s, For) else set()
        taken |= {v.name for e in stmt_exprs(s) for v in free_leaves(e) if isinstance(v, Var)}
    while name in taken:
        name += "'"
    return var(name)


def build(nest: Nest) -> Nest:
    """``nest`` with each mergeable pair of neighbouring output loops inside the
    outermost made one loop (innermost pairs first, so runs of axes merge
    whole)."""
    loops, body = list(nest.loops), nest.body
    for d in reversed(range(1, len(loops) - 1)):
        a, b = loops[d], loops[d + 1]
        e_a, e_b = a.extent.value, b.extent.value
        column = loops[d + 2].var if d + 2 < len(loops) else None
        tested = mergeable(a.var, b.var, e_b, body, column)
        if tested is None:
            continue
        q = _fresh(f"{a.var.name}_{b.var.name}", loops, body)
        body = _merged(body, a.var, b.var, q, e_b, tested)
        loops[d:d + 2] = [For(q, idx(0), idx(e_a * e_b), Block(()), a.kind)]
    return Nest(loops, body)


def _merged(body, a: Var, b: Var, q: Var, extent_b: int, tested: bool):
    """``body`` over ``q = extent_b a + b``.  Every index ``c_a a + c_b b``
    is ``c_b q``; a ``tested`` ``b`` (a mask's row) reads ``q % extent_b``,
    once per iteration of ``q``: substituted everywhere with ``a = q //
    extent_b``, each index collects back into ``c_b q``."""
    if not tested:
        return rename(body, {a: idx(0), b: q})
    go = substituter({a: floordiv(q, idx(extent_b)), b: mod(q, idx(extent_b))},
                     load=lambda x: _reindexed(x, simplify_index(x.index)))
    return map_stmt(body, go, store=lambda s, expr: Store(s.buffer, simplify_index(expr(s.index)), expr(s.value)))


def _reindexed(load, index):
    return GuardedLoad(load.buffer, index, load.cond) if isinstance(load, GuardedLoad) else BufLoad(load.buffer, index)
