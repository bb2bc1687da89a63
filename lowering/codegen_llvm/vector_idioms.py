"""Rows transposed in registers, the vector idioms the emitter recognises: a
loop whose reads are strided across the lanes and contiguous along it (the
gather blocks of a transposing copy) loads rows and transposes them, and
stores that together write one row per lane (a register tile stored across
the lanes, :func:`row_groups`) are transposed and stored row by row."""
from __future__ import annotations

from llvmlite import ir

from te_autodiff.expr import Const
from te_autodiff.visit import topo_order

from ..loop_ir import (Block, BufLoad, For, GuardedLoad, Local, children, free_leaves, linear_form, stmt_exprs,
                       stride, substitute, walk)
from .llvm_types import I32, I64, ITEMSIZE, MEMORY_TYPE, element_align


def _interleave_mask(width: int, unit: int, n: int, high: int) -> list:
    """The shufflevector mask interleaving two vectors ``a``, ``b`` of
    ``width`` lanes by units of ``unit`` lanes within segments of ``n``
    units: each segment of the result is ``a``'s and ``b``'s first (or with
    ``high``, second) halves of that segment, unit by unit alternately."""
    seg = unit * n
    return [s * seg + (j // 2 + high * (n // 2)) * unit + e + (width if j % 2 else 0)
            for s in range(width // seg) for j in range(n) for e in range(unit)]


def row_groups(stores, lane, width: int):
    """How the consecutive stores ``stores`` in a vector loop of ``width``
    lanes over ``lane`` write rows, or None when they do not.

    They qualify when they write one buffer at one index but for a constant
    ``c``, strided across the lanes (``S`` elements apart, not 0 or 1), to
    distinct elements, and no value reads the buffer (so the stores may be
    reordered).  Then lane ``l`` of the stores whose constants run
    ``c0, c0 + 1, ..`` writes the elements ``l S + c0, l S + c0 + 1, ..``:
    a row.  Returns ``(S, groups)``, each group the stores of one such run
    (at most ``width``, in order of the constant); at least one group holds
    two stores or more.  A register tile of a convolution whose lanes run
    over output channels (NCHW) stores its columns this way."""
    buf = stores[0].buffer
    if len(stores) < 2 or buf.dtype == "bool" or any(s.buffer is not buf for s in stores):
        return None
    forms = [linear_form(s.index) for s in stores]
    if any(f is None for f in forms) or any(f[0] != forms[0][0] for f in forms):
        return None
    step = stride(stores[0].index, lane)
    consts = [c for _, c in forms]
    if step in (None, 0, 1) or len({l * step + c for l in range(width) for c in consts}) != width * len(consts):
        return None
    if any(isinstance(e, (BufLoad, GuardedLoad)) and e.buffer is buf
           for e in topo_order((s.value for s in stores), children)):
        return None
    groups = []
    for c, s in sorted(zip(consts, stores), key=lambda cs: cs[0]):
        if groups and c == groups[-1][-1][0] + 1 and len(groups[-1]) < width:
            groups[-1].append((c, s))
        else:
            groups.append([(c, s)])
    if all(len(g) == 1 for g in groups):
        return None
    return step, [[s for _, s in g] for g in groups]


class TransposedRows:
    """The emitter's methods for rows transposed in registers (a mixin of
    ``emitter.FunctionEmitter``): a loop whose reads are strided across the
    lanes and contiguous along it loads rows and transposes them, and the
    stores of :func:`row_groups` are transposed and stored row by row."""

    def _transposed_reads(self, s: For) -> list:
        """The reads in the body of ``s``, a loop of kind ``transpose`` inside
        a vector loop, that are strided across the lanes and contiguous along
        ``s``: :meth:`_transposed_for` reads them as rows.  Empty while a lane
        is inactive or when ``s`` does not run whole vectors (leftover lanes
        or iterations gather)."""
        lanes = self.lanes
        if lanes is None or self.mask is not None or not isinstance(s.extent, Const) \
                or s.extent.value <= 0 or s.extent.value % lanes.width:
            return []
        stmts = [x for x in walk(s.body) if not isinstance(x, Block)]
        return [e for e in topo_order(e for x in stmts for e in stmt_exprs(x))
                if isinstance(e, BufLoad) and e.buffer not in self.written and e.buffer.dtype != "bool"
                and stride(e.index, lanes.var) not in (None, 0, 1) and stride(e.index, s.var) == 1
                and not any(isinstance(x, Local) for x in free_leaves(e.index))]

    def _transposed_for(self, s: For, lo, reads):
        """``s`` a vector at a time: each read of ``reads`` is ``W`` contiguous
        row loads (lane ``l``'s next ``W`` elements along ``s``) transposed in
        registers, so iteration ``k`` of the block finds its ``W`` lanes in
        vector ``k``; the body is emitted once per iteration.  A gather costs
        one load per lane, this one per vector (and ``W log2 W`` shuffles)."""
        width = self.lanes.width
        lane0 = {e: substitute(e.index, {self.lanes.var: self.lanes.lo}) for e in reads}

        def block(iv):
            first = self.b.add(lo, self.b.mul(iv, ir.Constant(I64, width)))
            self.scopes.append({s.var: first})
            columns = {e: self._transposed(self._rows(e, self.expr(lane0[e]), stride(e.index, self.lanes.var)),
                                           ITEMSIZE[e.buffer.dtype]) for e in reads}
            self.scopes.pop()
            for k in range(width):
                self.block(s.body, {s.var: self.b.add(first, ir.Constant(I64, k)),
                                    **{e: columns[e][k] for e in reads}})

        self._loop(s.var, ir.Constant(I64, 0), ir.Constant(I64, s.extent.value // width), block)

    def _rows(self, e, index, step):
        """``W`` vector loads of ``e.buffer`` at ``index``, ``index + step``, ..."""
        vt = ir.VectorType(MEMORY_TYPE[e.buffer.dtype], self.lanes.width)
        return [self._tag(self.b.load(self._address(e.buffer, self.b.add(index, ir.Constant(index.type, l * step))),
                                      typ=vt, align=element_align(e.buffer)))
                for l in range(self.lanes.width)]

    def _transposed(self, rows, itemsize):
        """The columns of the square matrix whose rows are the vectors ``rows``.
        First the ``C x C`` blocks within chunks of ``C`` elements are
        transposed, then the chunks themselves: each step is log2 of its size
        rounds of interleaving row ``t`` with row ``t + n/2`` of the ``n`` rows
        it pairs (``n`` perfect shuffles transpose ``n x n``).  The chunk is
        the target's ``shuffle_chunk_bytes``: on x86, unpcklps and unpckhps
        within 128-bit lanes, then vperm2f128 or vshuff32x4 for whole chunks."""
        width = len(rows)
        chunk = min(width, self.target.shuffle_chunk_bytes // itemsize)
        for unit, n, step in ((1, chunk, 1), (chunk, width // chunk, chunk)):
            starts = range(0, width, chunk) if step == 1 else range(chunk)
            masks = [ir.Constant(ir.VectorType(I32, width), _interleave_mask(width, unit, n, h)) for h in (0, 1)]
            for _ in range(n.bit_length() - 1):
                out = list(rows)
                for first in starts:
                    for t in range(n // 2):
                        a, b = rows[first + t * step], rows[first + (t + n // 2) * step]
                        for h in (0, 1):
                            out[first + (2 * t + h) * step] = self.b.shuffle_vector(a, b, masks[h])
                rows = out
        return rows

    def _row_stores(self, step, groups):
        """Each group of stores (``m`` of them, constants ``c0 .. c0 + m - 1``)
        as ``W`` stores of ``m`` contiguous elements, lane ``l``'s at
        ``l step + c0``: the ``m`` values, padded to ``p``, the power of two
        at or above ``m``, are transposed ``p`` lanes at a time
        (:meth:`_transposed`).  A scatter costs a store and an extraction
        per element; this ``p log2 p`` shuffles per ``p`` lanes and a store
        per row, so an output whose lanes run across rows (conv2d's NCHW
        output, lanes over the channels) is written about as fast as a
        contiguous one."""
        width = self.lanes.width
        values = {s: self.splat(self.expr(s.value), width) for g in groups for s in g}
        for group in groups:
            buf, m = group[0].buffer, len(group)
            if m == 1:
                self.store(group[0])
                continue
            p = 1 << (m - 1).bit_length()
            vt = ir.VectorType(MEMORY_TYPE[buf.dtype], width)
            rows = [values[s] for s in group] + [ir.Constant(vt, ir.Undefined)] * (p - m)
            lane0 = self.expr(substitute(group[0].index, {self.lanes.var: self.lanes.lo}))
            for first in range(0, width, p):
                columns = self._transposed([self.lanes_of(r, first, p) for r in rows], ITEMSIZE[buf.dtype])
                for l, column in enumerate(columns):
                    at = self.b.add(lane0, ir.Constant(I64, (first + l) * step))
                    self._tag(self.b.store(self.lanes_of(column, 0, m), self._address(buf, at),
                                           align=element_align(buf)))
