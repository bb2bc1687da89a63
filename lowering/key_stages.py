"""Stages written by hand over the positions of a data-dependent key.

Two tensor kinds of ``te_autodiff/inverse_index.py`` are not one formula per
element, and get a stage of their own here, one batch row of keys at a time
(rows run in parallel, each row by one thread):

**Inverse index** (:class:`~te_autodiff.expr.InverseIndex`): per row,
``count + 1`` starts followed by the positions; a counting sort in three
passes, O(positions + count):

1. zero the starts, then count each key in range at ``inv[k]``;
2. prefix-sum in place: ``inv[k]`` becomes the end of value ``k``'s matches
   (``inv[count]``, counted zero, the number of keys in range);
3. visit the positions last to first, each one taking the slot just below
   its value's end: ``inv[k] -= 1; order[inv[k]] = p``.  Afterwards every
   ``inv[k]`` is its value's start, and each value's positions are in
   increasing order (a stable sort: a sum over them has one fixed order).
   Keys out of range match no value; their positions fill the slots after
   the last value's, in increasing order, so every slot holds a position.

**Match sum** (:class:`~te_autodiff.expr.MatchSum`): per row, the sum of a
value over the positions whose key takes each value; the row is zeroed,
then its positions are visited in increasing order, each adding its value
at its key.  One writer per row, so each sum runs in position order: the
additions a gather over an inverse index would make, in the same order.

Keys are evaluated where they are needed instead of being stored.
"""
from __future__ import annotations

import math

from te_autodiff import dtype as dt
from te_autodiff.expr import InverseIndex, MatchSum, add, all_, cast, const, floordiv, mod, sub, var
from te_autodiff.visit import substitute

from .loop_ir import Alloc, Assign, Block, BufLoad, For, If, Stage, Store


def _index(n: int):
    return const(n, dt.INDEX)


def _scaled(e, k: int):
    return e if k == 1 else e * _index(k)


class _Rows:
    """One keyed tensor's stage under construction: the rows of its batch
    axes, the flat offset of an element of the current row, the key test."""

    def __init__(self, t, buf, node, evaluate, local):
        self.t, self.buf, self.node, self.evaluate, self.local = t, buf, node, evaluate, local
        self.batch = t.axes[:-1]
        row = _index(0)
        for b, n in zip(self.batch, t.shape[:-1]):
            row = add(_scaled(row, n), b)
        self.row = _scaled(row, t.shape[-1])
        self.scope = {b: (_index(0), _index(n)) for b, n in zip(self.batch, t.shape[:-1])}

    def at(self, e):
        return add(self.row, e)

    def put(self, index, value):
        return Store(self.buf, self.at(index), cast(self.buf.dtype, value))

    def get(self, index):
        return BufLoad(self.buf, self.at(index))

    def keyed(self, positions, doms, then, otherwise=None) -> tuple:
        """Statements evaluating the key at ``positions`` (in scope over
        ``doms``) and running ``then(k, at)`` (``at``: the positions'
        substitution) when ``k = key - lo`` is in range (else ``otherwise``)."""
        node = self.node
        at = dict(zip(node.axes, positions))
        stmts, value = self.evaluate(substitute(node.key, at), {**self.scope, **doms})
        k = self.local("k", dt.INDEX)
        test = all_(k >= _index(0), k < _index(node.count))
        return stmts + (Alloc(k, sub(value, _index(node.lo)), let=True),
                        If(test, Block(then(k, at)), None if otherwise is None else Block(otherwise)))

    def in_order(self, then) -> Block:
        """The positions' loops, first to last, running ``keyed(then)``."""
        pos = [var(p.name, p.dom) for p in self.node.axes]
        body = Block(self.keyed(pos, {p: (_index(0), _index(ext)) for p, (_, ext) in zip(pos, self.node.doms)},
                                then))
        for ax, (_, n) in reversed(list(zip(pos, self.node.doms))):
            body = Block((For(ax, _index(0), _index(n), body),))
        return body

    def zero(self, n: int):
        x = var("x", (0, n))
        return For(x, _index(0), _index(n), Block((self.put(x, _index(0)),)))

    def stage(self, body: Block, sort=None) -> Stage:
        """``body`` for every batch row, the first batch loop the parallel root."""
        t = self.t
        if not self.batch:
            root = For(var("_", (0, 1)), _index(0), _index(1), body, "parallel")
        else:
            for d in reversed(range(len(self.batch))):
                loop = For(self.batch[d], _index(0), _index(t.shape[d]), body, "parallel" if d == 0 else "serial")
                body = loop if d == 0 else Block((loop,))
            root = body
        return Stage(self.buf.name, self.buf, root, fixed=True, sort=sort)


def _counting_sort(rows: _Rows) -> Stage:
    inv: InverseIndex = rows.node
    size = math.prod(ext for _, ext in inv.doms)
    count = rows.in_order(lambda k, _: (rows.put(k, add(rows.get(k), _index(1))),))

    acc = rows.local("end", dt.INDEX)
    x = var("x", (0, inv.count + 1))
    scan = (Alloc(acc, _index(0)),
            For(x, _index(0), _index(inv.count + 1), Block((
                Assign(acc, add(acc, rows.get(x))), rows.put(x, acc)))))

    q = var("q", (0, size))
    p = sub(_index(size - 1), q)            # last position first
    unflat, stride = [], size
    for n, (_, ext) in enumerate(inv.doms):
        stride //= ext
        e = p if stride == 1 else floordiv(p, _index(stride))
        unflat.append(e if n == 0 else mod(e, _index(ext)))

    def place(k, _):
        slot = rows.local("slot", dt.INDEX)
        return (Alloc(slot, sub(rows.get(k), _index(1)), let=True),
                rows.put(k, slot),
                rows.put(add(slot, _index(inv.count + 1)), p))
    tail = rows.local("tail", dt.INDEX)
    aside = (Assign(tail, sub(tail, _index(1))), rows.put(add(tail, _index(inv.count + 1)), p))
    scatter = (Alloc(tail, _index(size)),
               For(q, _index(0), _index(size), Block(rows.keyed(unflat, {q: (_index(0), _index(size))},
                                                                place, aside))))
    body = Block((rows.zero(inv.count + 1),) + count.stmts + scan + scatter)
    return rows.stage(body, sort=(inv.count, size))


def _match_sum(rows: _Rows) -> Stage:
    ms: MatchSum = rows.node

    def add_value(k, at):
        stmts, value = rows.evaluate(substitute(ms.value, at), {
            **rows.scope, **{v: (_index(0), _index(ext)) for v, (_, ext) in zip(at.values(), ms.doms)}})
        return stmts + (rows.put(k, add(rows.get(k), value)),)
    return rows.stage(Block((rows.zero(ms.count),) + rows.in_order(add_value).stmts))


_STAGES = {InverseIndex: _counting_sort, MatchSum: _match_sum}


def is_keyed(t) -> bool:
    """Whether tensor ``t`` is computed by a stage of this module."""
    return type(t.body) in _STAGES


def keyed_stage(t, buf, evaluate, local) -> Stage:
    """The stage computing keyed tensor ``t`` into ``buf``.  ``evaluate(expr,
    doms) -> (stmts, value)`` lowers an expression with the variables of
    ``doms`` (``{var: (lo, extent)}``) in scope; ``local(prefix, dtype)``
    makes a fresh local."""
    return _STAGES[type(t.body)](_Rows(t, buf, t.body, evaluate, local))
