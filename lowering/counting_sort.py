"""The loop IR of an inverse index: a counting sort, one per batch row.

A tensor whose body is an :class:`~te_autodiff.expr.InverseIndex` (see
``te_autodiff/inverse_index.py``) holds, per batch row, ``count + 1`` starts
followed by ``R`` positions.  One stage computes all of it in three passes,
O(R + count) per row, serially within a row (rows run in parallel):

1. zero the starts, then count each key in range at ``inv[k]``;
2. prefix-sum in place: ``inv[k]`` becomes the end of value ``k``'s matches
   (``inv[count]``, counted zero, the number of keys in range);
3. visit the positions last to first, each one taking the slot just below
   its value's end: ``inv[k] -= 1; order[inv[k]] = p``.  Afterwards every
   ``inv[k]`` is its value's start, and each value's positions are in
   increasing order (a stable sort: a sum over them has one fixed order).

Keys outside ``[lo, lo + count)`` match no value; their positions fill the
slots after the last value's, in increasing order, so every slot holds a
position whatever the data.  The key is evaluated twice (passes 1 and 3)
instead of being stored.
"""
from __future__ import annotations

import math

from te_autodiff import dtype as dt
from te_autodiff.expr import InverseIndex, add, all_, cast, const, floordiv, mod, sub, var
from te_autodiff.visit import substitute

from .loop_ir import Alloc, Assign, Block, BufLoad, For, If, Stage, Store


def _index(n: int):
    return const(n, dt.INDEX)


def _scaled(e, k: int):
    return e if k == 1 else e * _index(k)


def _nest(axes, extents, body) -> Block:
    for ax, n in reversed(list(zip(axes, extents))):
        body = Block((For(ax, _index(0), _index(n), body),))
    return body


def counting_sort_stage(t, buf, evaluate, local) -> Stage:
    """The stage computing inverse-index tensor ``t`` into ``buf``.
    ``evaluate(expr, doms) -> (stmts, value)`` lowers an expression with the
    variables of ``doms`` (``{var: (lo, extent)}``) in scope; ``local(prefix,
    dtype)`` makes a fresh local."""
    inv: InverseIndex = t.body
    batch, width = t.axes[:-1], t.shape[-1]
    size = math.prod(ext for _, ext in inv.doms)
    row = _index(0)
    for b, n in zip(batch, t.shape[:-1]):
        row = add(_scaled(row, n), b)
    row = _scaled(row, width)
    scope = {b: (_index(0), _index(n)) for b, n in zip(batch, t.shape[:-1])}

    def at(e):
        return add(row, e)

    def put(index, value):
        return Store(buf, at(index), cast(buf.dtype, value))

    def keyed(positions, doms, then, otherwise=None):
        """Statements evaluating the key at ``positions`` (in scope over
        ``doms``) and running ``then(k)`` when ``k = key - lo`` is in range
        (else ``otherwise``)."""
        stmts, value = evaluate(substitute(inv.key, dict(zip(inv.axes, positions))), {**scope, **doms})
        k = local("k", dt.INDEX)
        test = all_(k >= _index(0), k < _index(inv.count))
        return stmts + (Alloc(k, sub(value, _index(inv.lo)), let=True),
                        If(test, Block(then(k)), None if otherwise is None else Block(otherwise)))

    x = var("x", (0, inv.count + 1))
    zero = For(x, _index(0), _index(inv.count + 1), Block((put(x, _index(0)),)))

    pos = [var(p.name, p.dom) for p in inv.axes]
    count = _nest(pos, [ext for _, ext in inv.doms], Block(keyed(
        pos, {p: (_index(0), _index(ext)) for p, (_, ext) in zip(pos, inv.doms)},
        lambda k: (put(k, add(BufLoad(buf, at(k)), _index(1))),))))

    acc = local("end", dt.INDEX)
    scan = (Alloc(acc, _index(0)),
            For(x, _index(0), _index(inv.count + 1), Block((
                Assign(acc, add(acc, BufLoad(buf, at(x)))), put(x, acc)))))

    q = var("q", (0, size))
    p = sub(_index(size - 1), q)            # last position first
    unflat, stride = [], size
    for n, (_, ext) in enumerate(inv.doms):
        stride //= ext
        e = p if stride == 1 else floordiv(p, _index(stride))
        unflat.append(e if n == 0 else mod(e, _index(ext)))

    def place(k):
        slot = local("slot", dt.INDEX)
        return (Alloc(slot, sub(BufLoad(buf, at(k)), _index(1)), let=True),
                put(k, slot),
                put(add(slot, _index(inv.count + 1)), p))
    tail = local("tail", dt.INDEX)
    aside = (Assign(tail, sub(tail, _index(1))), put(add(tail, _index(inv.count + 1)), p))
    scatter = (Alloc(tail, _index(size)),
               For(q, _index(0), _index(size), Block(keyed(unflat, {q: (_index(0), _index(size))}, place, aside))))

    body = Block((zero,) + count.stmts + scan + scatter)
    if not batch:
        return Stage(buf.name, buf, For(var("_", (0, 1)), _index(0), _index(1), body, "parallel"), sort=(inv.count, size))
    for d in reversed(range(len(batch))):
        loop = For(batch[d], _index(0), _index(t.shape[d]), body, "parallel" if d == 0 else "serial")
        body = loop if d == 0 else Block((loop,))
    return Stage(buf.name, buf, body, sort=(inv.count, size))
