"""Merged loops: two neighbouring output loops ``a`` (outer) and ``b`` (inner,
extent ``E``) that every access walks as one run of memory become one loop
``q`` over ``extent(a) * E`` elements.  The test: in each load and store
index ``a`` steps ``E`` times as far as ``b`` (``c_a = E c_b``, zero for
both in a broadcast operand), and neither variable is read anywhere else
(no guard, no value, no bound).  Then ``c_a a + c_b b = c_b (E a + b) =
c_b q`` in every index, so ``q`` replaces both without a division.

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

from te_autodiff.expr import Var, var

from ..loop_ir import (BufLoad, Block, For, GuardedLoad, Store, children, free_leaves, rename, stmt_exprs, stride,
                       walk)
from .constructors import idx
from .nest import Nest


def _accesses(body):
    """The load and store indices in ``body``, and the variables it reads
    anywhere else (values, tests, bounds, a guarded load's condition): the
    walk does not enter an index."""
    indices, outside, seen = [], set(), set()
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
            else:
                outside |= {e} if isinstance(e, Var) else set()
                stack += children(e)
    return indices, outside


def mergeable(a: Var, b: Var, extent_b: int, body) -> bool:
    """Whether every index in ``body`` steps ``extent_b`` times as far with
    ``a`` as with ``b`` and nothing else reads either (see the module doc)."""
    indices, outside = _accesses(body)
    if a in outside or b in outside:
        return False
    for index in indices:
        sa, sb = stride(index, a), stride(index, b)
        if sa is None or sb is None or sa != extent_b * sb:
            return False
    return True


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
        if not mergeable(a.var, b.var, e_b, body):
            continue
        q = _fresh(f"{a.var.name}_{b.var.name}", loops, body)
        body = rename(body, {a.var: idx(0), b.var: q})
        loops[d:d + 2] = [For(q, idx(0), idx(e_a * e_b), Block(()), a.kind)]
    return Nest(loops, body)
