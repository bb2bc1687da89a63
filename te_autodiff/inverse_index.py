"""Inverse indices: sums over the positions where a data-dependent index takes a value.

The adjoint of an embedding lookup ``Y[n, d] = E[I[n], d]`` is

    dE[v, d] = Σ_n H[n, d] · [I[n] == v]

The equality reads tensor data, so the integer solver of ``zero_elim`` cannot
use it, and summed as written it costs V·N·D.  Inverting the index at run
time makes the adjoint a gather again.  A counting sort of the keys ``I[n]``
(count each value, prefix-sum the counts, place each position) lists, for
every value ``v``, the positions ``n`` with ``I[n] == v`` in increasing order:

    dE[v, d] = Σ_{r in starts[v] .. starts[v + 1]} H[order[r], d]

That is O(N + V) to sort and O(N·D) to gather, with one writer per output
element and no atomics.  Every sum runs in an order fixed by the data alone,
so results are bit-identical for any thread count.

``starts`` and ``order`` are the two parts of one tensor whose body is an
:class:`~te_autodiff.expr.InverseIndex`.  Its key may depend on several
positions (``X[I[t] + 2j]``: the key ``I[t] + 2j`` over ``(t, j)``) and on
outer *batch* variables, with one sort per batch row.  torch.gather's
adjoint is such a case: ``dX[a, c] = Σ_j H[a, j]·[I[a, j] == c]``.  Equal
keys give one tensor, so every gradient that needs it shares one sort.

When the sum runs over the key's positions alone and each batch row of keys
owns a whole row of the result (``dX[a, c]`` above, ``take``), the inverse
index is not needed either: a :class:`~te_autodiff.expr.MatchSum` zeroes the
row and adds each position's value at its key, in position order.  That is
the same additions in the same order, without the sort or a pass over the
values.

A data-dependent equality on a *summation* variable needs no sort.  In
``Σ_s H[s]·[S[n] == s]`` (a segment sum's adjoint) ``s`` takes the one value
``S[n]``, under the guard that ``S[n]`` lies in the range of ``s``.

:func:`solve_data_equalities` applies both rewrites to a sum that zero
elimination leaves behind.
"""
from __future__ import annotations

import logging
import math
import weakref

from . import dtype as dt
from .expr import Cast, Cmp, Const, InverseIndex, Load, MatchSum, Var, all_, cast, const, floordiv, mod, select, var
from .pretty import expr_str
from .sharing import canonical_var
from .tensor import Tensor
from .term import read_guards
from .visit import eager_children, free_vars, substitute, topo_order

log = logging.getLogger("te_autodiff.zero_elim")

_TENSORS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()


def _canonical(positions, doms, batch):
    """Canonical batch axes and position variables for a keyed tensor, and
    the renaming of ``batch`` and ``positions`` to them (equal keys give equal
    nodes, so their tensors are found in the cache)."""
    axes = [canonical_var("b", n, (0, b.dom[1])) for n, b in enumerate(batch)]
    rename = {b: a + b.dom[0] for a, b in zip(axes, batch)}
    canon = [canonical_var("p", n, (0, ext)) for n, (_, ext) in enumerate(doms)]
    rename.update({p: c + first for p, c, (first, _) in zip(positions, canon, doms)})
    return axes, tuple(canon), rename


def _first_read(e, default: str) -> str:
    reads = [n.tensor.name for n in topo_order([e]) if isinstance(n, Load)]
    return reads[0] if reads else default


def _keyed(cache_key, make):
    t = _TENSORS.get(cache_key)
    if t is None:
        t = _TENSORS[cache_key] = make()
    return t


def inverse_index(key, positions, doms, batch, lo: int, count: int) -> Tensor:
    """The inverse-index tensor of ``key`` over ``positions`` (ranges ``doms``,
    pairs of ints) for the values ``lo .. lo + count - 1``, one sort per point
    of the outer variables ``batch`` (each with a fixed range); int32 unless
    a row is too long.

    Its shape is ``batch extents + (count + 1 + R,)``, ``R`` the number of
    positions; see :class:`~te_autodiff.expr.InverseIndex` for the layout."""
    axes, canon, rename = _canonical(positions, doms, batch)
    size = math.prod(ext for _, ext in doms)
    body_key = cast(dt.INDEX, substitute(key, rename))
    zeroed = tuple((0, ext) for _, ext in doms)

    def make():
        at = canonical_var("x", len(axes), (0, count + 1 + size))
        # int32 when the positions fit: half the memory traffic, twice the vector lanes
        dtype = "int32" if count + 1 + size < 2**31 else dt.INDEX
        return Tensor(f"{_first_read(key, 'key')}_inv", tuple(a.dom[1] for a in axes) + (count + 1 + size,),
                      dtype, tuple(axes) + (at,), InverseIndex(body_key, canon, zeroed, lo, count, at))
    return _keyed(("inverse", body_key, tuple(doms), tuple(a.dom for a in axes), lo, count), make)


def match_sum(value, key, positions, doms, batch, lo: int, count: int) -> Tensor:
    """The tensor of sums of ``value`` over the positions whose ``key`` takes
    each value ``lo .. lo + count - 1``, one row per point of ``batch``:
    shape ``batch extents + (count,)`` (see :class:`~te_autodiff.expr.MatchSum`)."""
    axes, canon, rename = _canonical(positions, doms, batch)
    body_key, body_value = cast(dt.INDEX, substitute(key, rename)), substitute(value, rename)
    zeroed = tuple((0, ext) for _, ext in doms)

    def make():
        at = canonical_var("x", len(axes), (0, count))
        name = f"{_first_read(value, 'sum')}_by_{_first_read(key, 'key')}"
        return Tensor(name, tuple(a.dom[1] for a in axes) + (count,), body_value.dtype, tuple(axes) + (at,),
                      MatchSum(body_value, body_key, canon, zeroed, lo, count, at))
    return _keyed(("sum", body_value, body_key, tuple(doms), tuple(a.dom for a in axes), lo, count), make)


def value_range(load: Load, last_index_range) -> tuple | None:
    """``(lo, hi)`` of the values read by ``load`` when it reads an inverse
    index (else None): starts lie in ``[0, R]``, positions in ``[0, R - 1]``.
    ``last_index_range`` bounds the read's last index (None ends: unknown)."""
    body = load.tensor.body
    if not isinstance(body, InverseIndex):
        return None
    size = math.prod(ext for _, ext in body.doms)
    first = last_index_range[0]
    return (0, size - 1) if first is not None and first > body.count else (0, size)


def _unflatten(p, doms) -> list:
    """The positions whose row-major offset (from 0) is ``p``."""
    out, stride = [], math.prod(ext for _, ext in doms)
    for n, (first, ext) in enumerate(doms):
        stride //= ext
        q = p if stride == 1 else floordiv(p, const(stride, dt.INDEX))
        out.append((q if n == 0 else mod(q, const(ext, dt.INDEX))) + first)
    return out


def _sides(c):
    """``(a, b)`` and ``(b, a)`` of an integer equality ``a == b``, else ().
    A variable narrowed to a type that holds its whole range (``int32(j) ==
    argmin[i]``: int32 positions) is compared as itself, the other side widened."""
    if isinstance(c, Cmp) and c.op == "eq" and dt.is_int(c.a.dtype) and dt.is_int(c.b.dtype):
        a, b = _unnarrowed(c.a), _unnarrowed(c.b)
        if a is not c.a or b is not c.b:
            a, b = cast(dt.INDEX, a), cast(dt.INDEX, b)
        return ((a, b), (b, a))
    return ()


def _unnarrowed(x):
    """``v`` for ``cast(int, v)`` with every value of the variable ``v`` in the cast's range, else ``x``."""
    if isinstance(x, Cast) and isinstance(x.a, Var) and x.a.dom is not None and dt.is_int(x.to):
        bits = 31 if x.to == "int32" else 63
        lo, n = x.a.dom
        if -(1 << bits) <= lo and lo + n <= 1 << bits:
            return x.a
    return x


def _read_guarded(conds) -> list:
    """``conds``, each after the conditions that keep its own tensor reads in
    range (:func:`~te_autodiff.term.read_guards`), for a key that tests them
    over a box wider than the points where the program tested them.  Only
    the reads evaluated whenever the condition is: a read in a select's
    branch is guarded by the select (a clip's bound ``select(j < n, X[j],
    0)``), and its range is no condition of the point."""
    return [g for c in conds for g in read_guards([c], eager_children) + [c]]


class _Sum:
    """A sum ``Σ_{axes in doms} [all(conds)] · body`` being rewritten, used
    only where the conditions ``outer`` on the outer variables hold."""

    def __init__(self, axes, doms, body, conds, outer=()):
        self.axes, self.doms, self.body, self.conds = list(axes), list(doms), body, list(conds)
        self.outer = list(outer)

    def replace(self, mapping: dict, drop, new_axes=(), new_doms=()):
        """Substitute ``mapping`` everywhere, drop the axes ``drop`` and put
        ``new_axes`` first."""
        kept = [(a, tuple(substitute(x, mapping) for x in d))
                for a, d in zip(self.axes, self.doms) if a not in drop]
        self.axes = list(new_axes) + [a for a, _ in kept]
        self.doms = list(new_doms) + [d for _, d in kept]
        self.body = substitute(self.body, mapping)
        self.conds = [substitute(c, mapping) for c in self.conds]

    def point(self) -> bool:
        """Solve one ``s == e`` (``s`` summed, ``e`` free of ``s`` and of the
        axes after it) by substitution; the range of ``s`` becomes a guard."""
        for c in self.conds:
            for s, e in _sides(c):
                if s not in self.axes:
                    continue
                later = set(self.axes[self.axes.index(s):])
                if free_vars(e) & later:
                    continue
                first, ext = self.doms[self.axes.index(s)]
                e = cast(dt.INDEX, e)
                self.conds.remove(c)
                # s's range, now e's, before the conditions on s (they may read at
                # e only where it holds), after the others and after the range
                # guards of e's own reads: a condition on s may be what kept those
                # in range (zero elimination bounds a point by one max(...) <= z,
                # a bound from a condition on s beside those from the domain of
                # e's index), and it now reads at e itself.  Where e's reads leave
                # their tensors no point meets the sum's conditions: the summand
                # is zero there
                others = [d for d in self.conds if s not in free_vars(d)]
                self.conds = others + [d for d in self.conds if s in free_vars(d)]
                self.replace({s: e}, {s})
                self.conds[len(others):len(others)] = _read_guarded([all_(e >= first, e < first + ext)])
                return True
        return False

    def invert(self) -> bool:
        """Sum ``v == key(positions)`` over the matches of ``v`` only, ``v``
        an outer variable with a fixed range and the positions summed over
        constant ranges: as one element of a match sum when :meth:`scatter`
        applies, else through an inverse index."""
        for c in self.conds:
            for v, key in _sides(c):
                if not isinstance(v, Var) or v in self.axes or v.dom is None:
                    continue
                fv = free_vars(key)
                positions = [a for a in self.axes if a in fv]
                batch = sorted(fv - set(self.axes), key=lambda b: b.uid)
                if v in fv or not positions or any(b.dom is None for b in batch):
                    continue
                boxed = self.box(positions, batch)
                if boxed is None:
                    continue
                doms, in_domain = boxed
                lo, count = v.dom
                row = tuple(b - b.dom[0] for b in batch)
                self.conds.remove(c)
                # the keyed tensor has a row for every batch value and a key at
                # every position of a box, but the sum reads only those where the
                # outer conditions and its own conditions on them hold, and where
                # the key's own reads are in range (a point of the box outside the
                # program's domain): elsewhere the key may read out of range, and
                # becomes lo - 1, matching nothing.  A condition that reads data
                # is tested after those keeping its reads in range: the sum's
                # conditions on other variables, which kept them there in the
                # program (the slots of an inverse index a gradient read between
                # the starts of one value), are not the key's
                rows = _read_guarded([g for g in self.outer + self.conds
                                      if free_vars(g) and free_vars(g) <= set(batch)])
                rows += read_guards([key])
                valid = rows + in_domain + _read_guarded([g for g in self.conds if free_vars(g) & set(positions)
                                                          and free_vars(g) <= set(batch) | set(positions)])
                if valid:
                    key = select(all_(*dict.fromkeys(valid)), key, const(lo - 1, key.dtype))
                if self.scatter(v, key, positions, doms, batch, row, rows + in_domain):
                    return True
                inv = inverse_index(key, positions, doms, batch, lo, count)
                start, end = cast(dt.INDEX, inv[row + (v - lo,)]), cast(dt.INDEX, inv[row + (v - lo + 1,)])
                size = math.prod(ext for _, ext in doms)
                r = var("r", (0, size))
                at = _unflatten(cast(dt.INDEX, inv[row + (r + (count + 1),)]), doms)
                log.info("zero elimination inverts the index %s == %s at run time: a counting sort "
                         "of %d position(s) for %d value(s)", v.name, expr_str(key), size, count)
                self.replace(dict(zip(positions, at)), set(positions), [r], [(start, end - start)])
                return True
        return False

    def box(self, positions, batch):
        """Constant ranges ``[(lo, extent)]`` of the ``positions`` and the
        conditions that keep a point of that box in the sum's own domain, or
        None.  A range that depends on other positions or on the batch (a
        triangle left by a guard ``c < r``) is replaced by the position's fixed
        range, its own range becoming a condition of the key: the keyed tensor
        then covers a box, and a point outside the domain matches nothing."""
        doms, in_domain = [], []
        for a in positions:
            first, ext = self.doms[self.axes.index(a)]
            if isinstance(first, Const) and isinstance(ext, Const):
                doms.append((first.value, ext.value))
            elif a.dom is not None and free_vars(first) | free_vars(ext) <= set(positions) | set(batch):
                doms.append(a.dom)
                in_domain.append(all_(a >= first, a < first + ext))
            else:
                return None
        return doms, in_domain

    def scatter(self, v, key, positions, doms, batch, row, rows) -> bool:
        """When the sum runs over the key's positions alone and depends on no
        outer variable but ``v`` and the batch (each batch row owns a whole
        row of the result), it is one element of a :func:`match_sum` tensor:
        no sort, each row's positions added in order at their keys.  The
        value is computed only where ``rows`` hold (other batch rows are never
        read, other positions of the box are not the program's, and their
        reads may be out of range), and where the reads it always makes are
        in range: conditions on other outer variables may keep a read in
        range (``X[b + b % 2]`` read where it equals ``i < 2``) and exclude
        no row, and the summand is zero wherever the program made no read."""
        inner = [c for c in self.conds if free_vars(c) & set(self.axes)]
        guards = list(dict.fromkeys(rows + inner + read_guards([self.body], eager_children)))
        value = select(all_(*guards), self.body, const(0, self.body.dtype)) if guards else self.body
        owners = (free_vars(value) | free_vars(key)) - set(self.axes)
        if len(positions) != len(self.axes) or v in free_vars(value) or not owners - {v} <= set(batch):
            return False
        lo, count = v.dom
        log.info("zero elimination sums %s over the positions where %s == %s, row by row",
                 expr_str(self.body), expr_str(key), v.name)
        self.body = match_sum(value, key, positions, doms, batch, lo, count)[row + (v - lo,)]
        self.axes, self.doms = [], []
        self.conds = [c for c in self.conds if c not in inner]
        return True


def solve_data_equalities(axes, doms, body, conds, outer=()):
    """Rewrite ``Σ_{axes in doms} [all(conds)] · body``, used where ``outer``
    holds, so that no equality in ``conds`` that reads tensor data is tested
    at every point of the sum (see the module doc).  Returns the new
    ``(axes, doms, body, conds)``.  A zero summand is a zero sum: no key
    is built for it, and none of its conditions (whose data reads only the
    sum's own guards kept in range) is tested."""
    if isinstance(body, Const) and body.value == 0:
        return [], [], body, []
    s = _Sum(axes, doms, body, conds, outer)
    while s.point() or s.invert():
        pass
    return s.axes, s.doms, s.body, s.conds
