"""One stage's body as an LLVM function (:class:`FunctionEmitter`): loops,
vector lanes and their masks, loads, stores (streaming where they write
whole lines), locals and run-time checks; the functions of ``fast_math.py``
inline or as one copy per module."""
from __future__ import annotations

from collections import Counter

from llvmlite import ir

from te_autodiff import dtype as dt
from te_autodiff.expr import BinOp, Cmp, Const, Unary, Var
from te_autodiff.ops import OPS
from te_autodiff.visit import topo_order

from ..fast_math import BODIES
from ..loop_ir import (AlignGap, Alloc, Assign, Block, BufLoad, Check, For, GuardedLoad, If, LaneReduce, Local,
                       Prefetch, Simd, Stage, Store, children, free_leaves, nodes_in, simplify_index, stage_buffers,
                       stmt_exprs, stride, substitute, walk)
from ..target import Target
from .llvm_types import (FAST, I1, I8, I32, I64, ITEMSIZE, MEMORY_TYPE, ORDERED, PTR, VALUE_TYPE, distinct_md,
                         element_align, element_type, kind_of, mangle, shaped)
from .operators import CMP_SYMBOL, EXPR, apply_operator
from .streaming import StreamingStores
from .vector_idioms import TransposedRows, row_groups

_MIRROR = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
PARTIAL_UNROLL = 4      # times LLVM unrolls a loop of kind "partial"
INLINE_MATH_USES = 2    # a stage applying a fast_math function more often calls one copy of it


class _Lanes:
    """The enclosing :class:`Simd` loop: its variable, first value and width,
    and which memory indices are contiguous across its lanes."""

    def __init__(self, var, lo, width):
        self.var, self.lo, self.width = var, lo, width
        self.bases, self.compares = {}, {}

    def base(self, index):
        """The index of lane 0 when ``index`` grows by exactly one per lane
        (a vector load or store at that base), else ``None``."""
        if index not in self.bases:
            leaves = free_leaves(index)
            ok = (self.var in leaves and not any(isinstance(x, Local) for x in leaves)
                  and stride(index, self.var) == 1)
            self.bases[index] = simplify_index(substitute(index, {self.var: self.lo})) if ok else None
        return self.bases[index]

    def compare(self, e):
        """``(lane 0's side, other side, op)`` of an integer comparison between
        an index growing by one per lane and a value the same in every lane
        (a padding test ``j + d - 1 >= 0``), the lane side first (``op``
        mirrored when it was second), else ``None``."""
        if e not in self.compares:
            self.compares[e] = None
            for side, other, op in ((e.a, e.b, e.op), (e.b, e.a, _MIRROR[e.op])) if e.a.dtype == "int64" else ():
                leaves = free_leaves(other)
                if self.var not in leaves and not any(isinstance(x, Local) for x in leaves) \
                        and self.base(side) is not None:
                    self.compares[e] = (self.base(side), other, op)
                    break
        return self.compares[e]


def ordered_nodes(body) -> set:
    """The expression nodes of a stage's ``body`` whose float arithmetic
    keeps the association written (``ORDERED``: no ``reassoc``, no
    ``contract``; a product and a sum fuse where the emitter writes an fma,
    ``_Emitter._fused``, not where LLVM's heuristics find one): the values
    compared (a float comparison's operands), those combined by a float max
    or min (a reduction's body included) and everything they are computed
    from, through the locals they read (a let, an inner reduction's
    accumulator).

    LLVM reassociates a tree of ``reassoc`` operations by the rank of its
    operands, which follows their order in the surrounding code, and fuses
    ``contract`` ones where it sees fit: the same expression can round
    differently in a register tile, in its remainder row and in another
    stage.  The derivative of a max or a min finds the
    first position where the recomputed body *equals* the stored extremum
    (``derivative._seed_extremum``), and a select's derivative recomputes
    its comparison; so wherever a value is compared or is an extremum's
    candidate it is computed as written, in every stage and every code
    path, and the other arithmetic stays free to be reassociated."""
    defs, roots, visited = {}, [], set()
    for s in walk(body):
        if isinstance(s, Alloc) and s.init is not None:
            defs.setdefault(s.local, []).append(s.init)
        elif isinstance(s, Assign):
            defs.setdefault(s.local, []).append(s.value)
        roots += [e for e in nodes_in(stmt_exprs(s), visited, (Cmp, BinOp, LaneReduce))
                  if isinstance(e, Cmp) and dt.is_float(e.a.dtype) or (
                      not isinstance(e, Cmp) and e.op in ("max", "min") and dt.is_float(e.dtype))]
    seen, stack = set(), roots
    while stack:
        e = stack.pop()
        if e not in seen:
            seen.add(e)
            stack += children(e)
            stack += defs.get(e, ()) if isinstance(e, Local) else ()
    return seen


class _Emitter:
    """An IR builder ``b`` in function ``fn`` of ``module``, for ``target``;
    float arithmetic carries ``float_flags``."""

    float_flags = FAST

    def intrinsic(self, name, ret, args):
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, args), name=name)
        return fn

    def call_intrinsic(self, base, args):
        """``base.<type>(args)`` for an overloaded intrinsic returning its argument type."""
        t = args[0].type
        return self.b.call(self.intrinsic(f"{base}.{mangle(t)}", t, [a.type for a in args]), list(args))

    def _fused(self, node, vals, local_memo):
        """``a * b + c`` (or ``-``) of an ordered node as one ``llvm.fma``
        where the target has it, else None.  Ordered arithmetic carries no
        ``contract`` flag: LLVM would fuse it where its heuristics find the
        pattern, so a value could round differently in the stage that takes
        a max and in the one that recomputes it to find the maximum's
        position; fused here, it rounds the same wherever it is computed."""
        if not (self.target.fma and isinstance(node, BinOp) and node.op in ("add", "sub")
                and dt.is_float(node.dtype)):
            return None
        for k, (m, other) in enumerate(((node.a, vals[1]), (node.b, vals[0]))):
            if isinstance(m, BinOp) and m.op == "mul" and m in self.ordered:
                a, b = (self._lookup(x, local_memo) for x in (m.a, m.b))
                a, b = (self.splat(x) if isinstance(other.type, ir.VectorType) and
                        not isinstance(x.type, ir.VectorType) else x for x in (a, b))
                if node.op == "sub":
                    other, a = (self.b.fneg(other), a) if k == 0 else (other, self.b.fneg(a))
                return self.call_intrinsic("llvm.fma", (a, b, other))
        return None

    def libm(self, name, args):
        """The C function ``name`` on ``args``: one call per lane of a vector
        (libm has no vector entry)."""
        t = args[0].type
        scalar = element_type(t)
        fn = self.intrinsic(name, scalar, [scalar] * len(args))
        if not isinstance(t, ir.VectorType):
            return self.b.call(fn, args)
        out = ir.Constant(t, ir.Undefined)
        for k in range(t.count):
            lane = ir.Constant(I32, k)
            out = self.b.insert_element(
                out, self.b.call(fn, [self.b.extract_element(a, lane) for a in args]), lane)
        return out

    def lanes_of(self, v, first, count):
        """Lanes ``first .. first + count - 1`` of vector ``v`` (``v`` itself when that is all of it)."""
        if first == 0 and count == v.type.count:
            return v
        return self.b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), ir.Constant(
            ir.VectorType(I32, count), list(range(first, first + count))))

    def joined(self, parts):
        """One vector of the lanes of ``parts`` (equal widths, a power of two of them) in order."""
        while len(parts) > 1:
            n = 2 * parts[0].type.count
            parts = [self.b.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, n), list(range(n))))
                     for a, b in zip(parts[::2], parts[1::2])]
        return parts[0]


class _MathBody(_Emitter):
    """The body of one of ``fast_math.py``'s functions, a function of its own."""

    def __init__(self, module, target, fn):
        self.module, self.target, self.fn = module, target, fn
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))


class FunctionEmitter(_Emitter, TransposedRows, StreamingStores):
    """Emits one stage's body function.

    Inside a :class:`Simd` loop (``self.lanes``) a value that is the same in
    every lane stays a scalar and the others are ``<W x T>`` vectors; scalars
    are splatted where they meet vectors.  ``self.mask`` holds the active
    lanes (``None``: all): masked loads, stores and assignments respect it,
    an ``If`` or loop whose condition or bounds differ between lanes narrows
    it, and a branch no lane takes is skipped.  Rows transposed in registers
    (:class:`~.vector_idioms.TransposedRows`) and streaming stores
    (:class:`~.streaming.StreamingStores`) are methods of their own modules."""

    def __init__(self, module: ir.Module, stage: Stage, name: str, target: Target, read=frozenset(),
                 inline: bool = True):
        self.module = module
        self.target = target
        self.buffers, self.read_here = stage_buffers(stage)
        self.written = {x.buffer for x in walk(stage.body) if isinstance(x, Store)}
        self.loaded = self.read_here | read        # read by this stage or by another one
        args = [PTR] * len(self.buffers) + [I64, I64, PTR]
        self.fn = ir.Function(module, ir.FunctionType(ir.VoidType(), args), name=name)
        self.fn.linkage = "internal"
        self.fn.attributes.add("alwaysinline" if inline else "noinline")
        self.fn.attributes.add("nounwind")
        add_vector_attributes(self.fn, target)
        for arg, buf in zip(self.fn.args, self.buffers):
            arg.add_attribute("noalias")
            if buf.nbytes:
                arg.attributes.dereferenceable = buf.nbytes
            if buf.kind != "input":
                arg.attributes.align = target.alignment
        self.ptr = dict(zip(self.buffers, self.fn.args))
        *_, self.lo, self.hi, self.err = self.fn.args
        entry = self.fn.append_basic_block("entry")
        body = self.fn.append_basic_block("body")
        self.alloca = ir.IRBuilder(entry)
        self.b = ir.IRBuilder(body)
        self.scopes = [{}]          # memo: loop IR expression -> value, per block
        if stage.step is not None:  # a scan's step: its time is read from the loop's counter
            self.scopes[0][stage.step.var] = self.b.load(self.ptr[stage.step.counter], typ=I64)
        self.varies = {}           # node -> reads a local or a buffer this stage writes (may change)
        self.math_uses = Counter(e.op for t in walk(stage.body) for e in topo_order(stmt_exprs(t))
                                 if isinstance(e, (Unary, BinOp)))     # each statement emits its own
        self.locals = {}
        self.local_type = {}
        self.access_group = None
        self.lanes = None
        self.mask = None
        self.loops = []             # the variables of the loops around the statement emitted
        self.narrow_compares = not target.mask_registers       # see _lane_compare
        self.stream = []            # the candidates for streaming stores (_vector_store)
        self.ordered = ordered_nodes(stage.body)
        self.stmt(stage.body)
        if self._mark_streaming():  # order the streaming stores before whatever follows the stage
            self.b.call(self.intrinsic(self.target.store_fence, ir.VoidType(), []), [])
        self.b.ret_void()
        self.alloca.branch(body)

    # ------------------------------------------------------------ helpers

    def fast_math(self, body, op, args):
        """``body`` (of ``fast_math.py``) on ``args``: inline code, or on
        vectors in a stage that applies ``op`` more than ``INLINE_MATH_USES``
        times, a call of one copy per module (made at first use).  A
        register tile's epilogue applies it to each of its vectors (an RNN
        step: 16 tanh), and as many inline copies (~60 instructions and a
        branch each) would multiply LLVM's work.  In a streaming loop a call
        is not free (the vector registers live across it are saved and
        restored), so a stage with few uses keeps them inline."""
        t = args[0].type
        if not isinstance(t, ir.VectorType) or self.math_uses[op] <= INLINE_MATH_USES:
            return body(self, *args)
        name = f"te.{op}.{mangle(t)}"
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(t, [t] * len(args)), name=name)
            fn.linkage, fn.calling_convention = "internal", "fastcc"
            for attr in ("nounwind", "noinline"):
                fn.attributes.add(attr)
            add_vector_attributes(fn, self.target)
            inner = _MathBody(self.module, self.target, fn)
            inner.b.ret(body(inner, *fn.args))
        return self.b.call(fn, list(args), cconv="fastcc")

    def math(self, op, args):
        """The function ``op`` of ops.py on float ``args`` (all of one type):
        the body of ``fast_math.py`` for its dtype, else the table's LLVM
        intrinsic, else its libm function, called once per lane."""
        t = args[0].type
        scalar = element_type(t)
        dtype = "float32" if scalar == VALUE_TYPE["float32"] else "float64"
        body = BODIES.get((op, dtype))
        if body is not None:
            return self.fast_math(body, op, args)
        spec = OPS[op]
        if spec.llvm is not None:
            return self.call_intrinsic(spec.llvm, args)
        return self.libm(spec.libm[dtype == "float64"], args)

    def splat(self, v, width=None):
        """``v`` as a vector of the current width (vectors pass through)."""
        if isinstance(v.type, ir.VectorType):
            return v
        vt = ir.VectorType(v.type, width or self.lanes.width)
        if isinstance(v, ir.Constant):
            return ir.Constant(vt, v.constant)
        x = self.b.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(I32, 0))
        return self.b.shuffle_vector(x, ir.Constant(vt, ir.Undefined),
                                     ir.Constant(ir.VectorType(I32, vt.count), [0] * vt.count))

    def _reduce(self, op, v):
        t = v.type
        return self.b.call(self.intrinsic(f"llvm.vector.reduce.{op}.{mangle(t)}", t.element, [t]), [v])

    def any_lane(self, mask):
        return self._reduce("or", mask)

    def _tag(self, instr):
        if self.access_group is not None:
            instr.set_metadata("llvm.access.group", self.access_group)
        return instr

    def _native_pieces(self, buf, mask) -> list:
        """``(first lane, mask)`` of each piece of the target's vector width in
        a masked access to ``buf`` under ``mask``: a masked load, store,
        gather or scatter of several registers (``Blocking.math_chains``) is
        emitted as one per register, since LLVM 22.1 aborts splitting a
        wider one."""
        width = max(1, self.target.vector_bytes // ITEMSIZE[buf.dtype])
        if mask.type.count <= width:
            return [(0, mask)]
        return [(k, self.lanes_of(mask, k, width)) for k in range(0, mask.type.count, width)]

    def _at(self, buf, ptr, first):
        """``ptr`` moved ``first`` elements of ``buf`` on."""
        if first == 0:
            return ptr
        return self.b.gep(ptr, [ir.Constant(I64, first)], inbounds=True, source_etype=MEMORY_TYPE[buf.dtype])

    def align_gap(self, e: AlignGap):
        """``(-address) mod bytes`` of ``e.buffer``'s start, in elements (the
        runtime passes arrays aligned to their element)."""
        gap = self.b.and_(self.b.neg(self.b.ptrtoint(self.ptr[e.buffer], I64)), ir.Constant(I64, e.bytes - 1))
        return self.b.lshr(gap, ir.Constant(I64, ITEMSIZE[e.buffer.dtype].bit_length() - 1))

    def _address(self, buf, index):
        ptr = self.b.gep(self.ptr[buf], [index], inbounds=True, source_etype=MEMORY_TYPE[buf.dtype])
        if isinstance(index.type, ir.VectorType):
            ptr.type = ir.VectorType(PTR, index.type.count)
        return ptr

    def _mask_or_all(self, width):
        return self.mask if self.mask is not None else ir.Constant(ir.VectorType(I1, width), 1)

    def load(self, e, index, cond=None):
        """Load ``e.buffer[index]`` (only where ``cond`` holds, else zero, for a
        :class:`GuardedLoad`); in a vector loop, ``index`` is lane 0's index
        when :meth:`_Lanes.base` found ``e`` contiguous."""
        buf = e.buffer
        t = MEMORY_TYPE[buf.dtype]
        align = ir.Constant(I32, element_align(buf))
        vector_cond = cond is not None and isinstance(cond.type, ir.VectorType)
        contiguous = self.lanes is not None and self.lanes.base(e.index) is not None
        if cond is not None and not contiguous and not vector_cond \
                and not isinstance(index.type, ir.VectorType):       # one scalar: read a safe index
            safe = self.b.select(cond, index, ir.Constant(index.type, 0))
            value = self._tag(self.b.load(self._address(buf, safe), typ=t, align=element_align(buf)))
            value = self.b.select(cond, value, ir.Constant(t, 0))
        elif contiguous:
            vt = ir.VectorType(t, self.lanes.width)
            ptr = self._address(buf, index)
            mask = self.mask if cond is None else self._and_mask(self.splat(cond))
            if mask is None:
                value = self._tag(self.b.load(ptr, typ=vt, align=element_align(buf)))
            else:
                parts = []
                for first, m in self._native_pieces(buf, mask):
                    pt = ir.VectorType(t, m.type.count)
                    fn = self.intrinsic(f"llvm.masked.load.{mangle(pt)}.p0", pt, [PTR, I32, m.type, pt])
                    parts.append(self._tag(self.b.call(fn, [self._at(buf, ptr, first), align, m,
                                                            ir.Constant(pt, None)])))
                value = self.joined(parts)
        elif isinstance(index.type, ir.VectorType) or vector_cond:
            index = self.splat(index)
            ptrs = self._address(buf, index)
            mask = self._mask_or_all(index.type.count) if cond is None else self._and_mask(self.splat(cond))
            parts = []
            for first, m in self._native_pieces(buf, mask):
                pt, at = ir.VectorType(t, m.type.count), self.lanes_of(ptrs, first, m.type.count)
                fn = self.intrinsic(f"llvm.masked.gather.{mangle(pt)}.{mangle(at.type)}", pt,
                                    [at.type, I32, m.type, pt])
                parts.append(self._tag(self.b.call(fn, [at, align, m, ir.Constant(pt, None)])))
            value = self.joined(parts)
        else:
            value = self._tag(self.b.load(self._address(buf, index), typ=t, align=element_align(buf)))
        if buf.dtype == "bool":
            return self.b.icmp_unsigned("!=", value, ir.Constant(value.type, 0))
        return value

    def lane_reduce(self, e, value):
        """Combine the active lanes of ``value`` pairwise (a fixed tree: the
        same bits on every run)."""
        if self.lanes is None:
            return value
        value = self.splat(value)
        if self.mask is not None:
            value = self.b.select(self.mask, value, self.splat(self.expr(e.identity)))
        width = value.type.count
        while width > 1:
            width //= 2
            undef = ir.Constant(value.type, ir.Undefined)
            halves = [self.b.shuffle_vector(value, undef, ir.Constant(ir.VectorType(I32, width),
                                                                       list(range(k, k + width))))
                      for k in (0, width)]
            value = apply_operator(self, e.op, kind_of(e.dtype), halves)
        return self.b.extract_element(value, ir.Constant(I32, 0))

    def _lookup(self, e, local_memo):
        if e in local_memo:
            return local_memo[e]
        for scope in reversed(self.scopes):
            if e in scope:
                return scope[e]
        return None

    def _kids(self, node):
        if self.lanes is not None and isinstance(node, (BufLoad, GuardedLoad)):
            base = self.lanes.base(node.index)
            if base is not None:
                return (base,) if isinstance(node, BufLoad) else (base, node.cond)
        form = self._lane_test(node)
        return children(node) if form is None else form[:2]

    def _lane_test(self, node):
        """:meth:`_Lanes.compare` of ``node`` where lane tests compare lane
        numbers (:meth:`_lane_compare`), else None."""
        if self.lanes is None or not self.narrow_compares or not isinstance(node, Cmp):
            return None
        return self.lanes.compare(node)

    def _lane_compare(self, op, first, other):
        """The lanes' ``first + lane OP other`` as ``lane OP other - first`` on
        32-bit lane numbers, on a target without mask registers: one vector
        compare of narrow lanes instead of each lane's 64-bit index
        arithmetic, which AVX2 does in halves and then packs (a padding
        test's mask inside a stencil's taps).  ``other - first`` is computed
        once, as a scalar (saturating: the compare of the operands never
        overflowed), and clamped to ``[-1, width]``, which keeps every lane's
        result (the lane numbers are ``0..width - 1``).  With mask
        registers (AVX-512) the index form stays: its compares write lane
        bits directly, and LLVM folds them where it unrolls a column loop,
        which the clamp would prevent."""
        width = self.lanes.width
        gap = self.call_intrinsic("llvm.ssub.sat", [other, first])
        for fn, bound in (("llvm.smax", -1), ("llvm.smin", width)):
            gap = self.call_intrinsic(fn, [gap, ir.Constant(gap.type, bound)])
        iota = ir.Constant(ir.VectorType(I32, width), list(range(width)))
        return self.b.icmp_signed(CMP_SYMBOL[op], iota, self.splat(self.b.trunc(gap, I32), width))

    def expr(self, e):
        """The value of a loop IR expression; each distinct node once per block
        (nodes that read locals, or buffers the stage writes, only once per
        statement: those change)."""
        local_memo = {}
        stack = [(e, False)]
        while stack:
            node, ready = stack.pop()
            if self._lookup(node, local_memo) is not None:
                continue
            kids = self._kids(node)
            if not ready:
                stack.append((node, True))
                stack += [(k, False) for k in kids]
                continue
            vals = [self._lookup(k, local_memo) for k in kids]
            if (self.lanes is not None and type(node) not in _LEAVES
                    and any(isinstance(v.type, ir.VectorType) for v in vals)):
                vals = [self.splat(v) for v in vals]
            outer, self.float_flags = self.float_flags, ORDERED if node in self.ordered else FAST
            fused = self._fused(node, vals, local_memo) if node in self.ordered else None
            form = None if fused is not None else self._lane_test(node)
            if form is not None:
                fused = self._lane_compare(form[2], *vals)
            value = EXPR[type(node)](self, node, vals) if fused is None else fused
            self.float_flags = outer
            varies = (isinstance(node, Local) or any(self.varies.get(k, False) for k in kids)
                          or isinstance(node, (BufLoad, GuardedLoad)) and node.buffer in self.written)
            self.varies[node] = varies
            (local_memo if varies else self.scopes[-1])[node] = value
        return self._lookup(e, local_memo)

    def block(self, stmt, bindings=None):
        self.scopes.append(dict(bindings or {}))
        self.stmt(stmt)
        self.scopes.pop()

    def _masked_block(self, stmt, mask, bindings=None):
        """Run ``stmt`` with the active lanes narrowed to ``mask``, skipped when none is active."""
        run = self.fn.append_basic_block("lanes")
        done = self.fn.append_basic_block("lanes.done")
        self.b.cbranch(self.any_lane(mask), run, done)
        self.b.position_at_end(run)
        outer, self.mask = self.mask, mask
        self.block(stmt, bindings)
        self.mask = outer
        self.b.branch(done)
        self.b.position_at_end(done)

    def _and_mask(self, cond):
        return cond if self.mask is None else self.b.and_(self.mask, cond)

    # --------------------------------------------------------- statements

    def stmt(self, s):
        _STMT[type(s)](self, s)

    def _loop(self, var, lo, hi, body_fn, kind="serial"):
        """``for var in [lo, hi)`` with scalar bounds; ``body_fn(iv)`` emits the body."""
        pre = self.b.block
        body = self.fn.append_basic_block(f"{var.name}.loop")
        done = self.fn.append_basic_block(f"{var.name}.done")
        self.b.cbranch(self.b.icmp_signed("<", lo, hi), body, done)
        self.b.position_at_end(body)
        iv = self.b.phi(I64, name=var.name)
        iv.add_incoming(lo, pre)
        outer_group = self.access_group
        if kind == "vectorize":
            self.access_group = distinct_md(self.module)
        self.loops.append(var)
        body_fn(iv)
        self.loops.pop()
        nxt = self.b.add(iv, ir.Constant(I64, 1))
        iv.add_incoming(nxt, self.b.block)
        latch = self.b.cbranch(self.b.icmp_signed("<", nxt, hi), body, done)
        hint = {"vectorize": ["llvm.loop.parallel_accesses", self.access_group],
                "rolled": ["llvm.loop.unroll.disable"],
                "partial": ["llvm.loop.unroll.count", ir.Constant(I32, PARTIAL_UNROLL)]}.get(kind)
        if hint is not None:
            md = self.module.add_metadata([ir.MetaDataString(self.module, hint[0])] + hint[1:])
            loop_id = distinct_md(self.module)
            loop_id.operands = (loop_id, md)
            latch.set_metadata("llvm.loop", loop_id)
        self.access_group = outer_group
        self.b.position_at_end(done)

    def for_(self, s: For):
        lo = self.expr(s.lo)
        extent = self.expr(s.extent)
        if isinstance(lo.type, ir.VectorType) or isinstance(extent.type, ir.VectorType):
            return self._masked_for(s, lo, extent)
        hi = self.b.add(lo, extent)
        if s.kind == "parallel":        # this call runs the chunk [lo, hi) of the root loop
            lo = self.b.call(self.intrinsic("llvm.smax.i64", I64, [I64, I64]), [lo, self.lo])
            hi = self.b.call(self.intrinsic("llvm.smin.i64", I64, [I64, I64]), [hi, self.hi])
        kind = "serial" if self.lanes is not None and s.kind not in ("rolled", "partial") else s.kind
        reads = self._transposed_reads(s) if s.kind == "transpose" else []
        if reads:
            return self._transposed_for(s, lo, reads)
        self._loop(s.var, lo, hi, lambda iv: self.block(s.body, {s.var: iv}), kind)

    def _masked_for(self, s: For, lo, extent):
        """A loop whose bounds differ between lanes: the scalar variable runs
        over the union of the active lanes' ranges, each lane active in its own."""
        lo_v, hi_v = self.splat(lo), self.splat(self.b.add(self.splat(lo), self.splat(extent)))
        width = lo_v.type.count
        active = self._mask_or_all(width)
        vt = lo_v.type
        first = self._reduce("smin", self.b.select(active, lo_v, ir.Constant(vt, 2 ** 62)))
        last = self._reduce("smax", self.b.select(active, hi_v, ir.Constant(vt, -2 ** 62)))

        def body(iv):
            at = self.splat(iv, width)
            inside = self.b.and_(self.b.icmp_signed(">=", at, lo_v), self.b.icmp_signed("<", at, hi_v))
            outer, self.mask = self.mask, self.b.and_(active, inside)
            self.block(s.body, {s.var: iv})
            self.mask = outer

        self._loop(s.var, first, last, body)

    def simd(self, s: Simd):
        if self.lanes is not None:
            raise RuntimeError("loop IR nests a simd loop in another")
        if isinstance(s.count, Const) and s.count.value <= 0:
            return
        width = s.lanes
        lo = self.expr(s.lo)
        iota = ir.Constant(ir.VectorType(I64, width), list(range(width)))
        lane = self.b.add(self.splat(lo, width), iota)
        mask = None
        if not (isinstance(s.count, Const) and s.count.value >= width):
            mask = self.b.icmp_signed("<", iota, self.splat(self.expr(s.count), width))
        outer_group, self.access_group = self.access_group, None
        self.lanes, self.mask = _Lanes(s.var, s.lo, width), mask
        self.block(s.body, {s.var: lane})
        self.lanes, self.mask = None, None
        self.access_group = outer_group

    def block_(self, s: Block):
        """The statements of ``s``; in a vector loop with every lane active, a
        run of stores that write rows (:func:`row_groups`) as rows."""
        stmts, k = s.stmts, 0
        while k < len(stmts):
            end = k
            while end < len(stmts) and isinstance(stmts[end], Store):
                end += 1
            end = max(end, k + 1)
            rows = row_groups(stmts[k:end], self.lanes.var, self.lanes.width) \
                if end - k > 1 and self.lanes is not None and self.mask is None else None
            if rows is None:
                for x in stmts[k:end]:
                    self.stmt(x)
            else:
                self._row_stores(*rows)
            k = end

    def store(self, s: Store):
        buf = s.buffer
        value = self.expr(s.value)
        base = self.lanes.base(s.index) if self.lanes is not None else None
        index = self.expr(base if base is not None else s.index)
        vector = base is not None or isinstance(index.type, ir.VectorType)
        if vector:
            value = self.splat(value)
        if buf.dtype == "bool":
            value = self.b.zext(value, shaped(I8, value))
        align = ir.Constant(I32, element_align(buf))
        if base is not None:
            ptr = self._address(buf, index)
            if self.mask is None:
                self._tag(self._vector_store(buf, base, value, ptr))
            else:
                for first, m in self._native_pieces(buf, self.mask):
                    part = self.lanes_of(value, first, m.type.count)
                    fn = self.intrinsic(f"llvm.masked.store.{mangle(part.type)}.p0", ir.VoidType(),
                                        [part.type, PTR, I32, m.type])
                    self._tag(self.b.call(fn, [part, self._at(buf, ptr, first), align, m]))
        elif vector:
            ptrs = self._address(buf, index)
            for first, m in self._native_pieces(buf, self._mask_or_all(index.type.count)):
                part, at = self.lanes_of(value, first, m.type.count), self.lanes_of(ptrs, first, m.type.count)
                fn = self.intrinsic(f"llvm.masked.scatter.{mangle(part.type)}.{mangle(at.type)}",
                                    ir.VoidType(), [part.type, at.type, I32, m.type])
                self._tag(self.b.call(fn, [part, at, align, m]))
        else:
            if isinstance(value.type, ir.VectorType):
                raise RuntimeError(f"stage stores different lanes' values to one element of '{buf.name}'")
            self._tag(self.b.store(value, self._address(buf, index), align=element_align(buf)))

    def prefetch(self, s: Prefetch):
        """``llvm.prefetch`` of lane 0's element for reading, into L2 and the
        levels past it (locality 2: x86 ``prefetcht1``, AArch64
        ``PLDL2KEEP``): the L1's own prefetchers bring it on from L2 without
        the hint displacing lines the tile is using."""
        base = self.lanes.base(s.index) if self.lanes is not None else None
        index = self.expr(base if base is not None else s.index)
        if isinstance(index.type, ir.VectorType):
            index = self.b.extract_element(index, ir.Constant(I32, 0))
        at = self.b.gep(self.ptr[s.buffer], [index], source_etype=MEMORY_TYPE[s.buffer.dtype])  # may pass the end
        fn = self.intrinsic("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
        self.b.call(fn, [at, ir.Constant(I32, 0), ir.Constant(I32, 2), ir.Constant(I32, 1)])

    def _fit(self, value, t):
        return self.splat(value, t.count) if isinstance(t, ir.VectorType) else value

    def alloc(self, s: Alloc):
        t = VALUE_TYPE[s.local.dtype]
        if self.lanes is not None:
            t = ir.VectorType(t, self.lanes.width)
        self.local_type[s.local] = t
        self.locals[s.local] = self.alloca.alloca(t, name=s.local.name)
        if s.init is not None:
            self.b.store(self._fit(self.expr(s.init), t), self.locals[s.local])

    def assign(self, s: Assign):
        t = self.local_type[s.local]
        value = self.expr(s.value)
        if isinstance(value.type, ir.VectorType) and not isinstance(t, ir.VectorType):
            raise RuntimeError(f"a vector loop assigns lane values to the scalar local '{s.local.name}'")
        value = self._fit(value, t)
        if self.mask is not None and isinstance(t, ir.VectorType):
            value = self.b.select(self.mask, value, self.b.load(self.locals[s.local], typ=t))
        self.b.store(value, self.locals[s.local])

    def if_(self, s: If):
        cond = self.expr(s.cond)
        if isinstance(cond.type, ir.VectorType):
            self._masked_block(s.then, self._and_mask(cond))
            if s.else_ is not None:
                self._masked_block(s.else_, self._and_mask(self.b.not_(cond)))
            return
        then = self.fn.append_basic_block("then")
        done = self.fn.append_basic_block("endif")
        other = self.fn.append_basic_block("else") if s.else_ is not None else done
        self.b.cbranch(cond, then, other)
        for block, stmt in ((then, s.then), (other, s.else_)):
            if stmt is not None:
                self.b.position_at_end(block)
                self.block(stmt)
                self.b.branch(done)
        self.b.position_at_end(done)

    def check(self, s: Check):
        index = self.expr(s.index)
        if element_type(index.type).width < 64:               # an int32 index read from data
            index = self.b.sext(index, shaped(I64, index))
        if isinstance(index.type, ir.VectorType):
            bad = self._and_mask(self.b.icmp_unsigned(">=", index, ir.Constant(index.type, s.extent)))
            failed = self.any_lane(bad)
        else:
            failed = self.b.icmp_unsigned(">=", index, ir.Constant(I64, s.extent))
        fail = self.fn.append_basic_block("out_of_bounds")
        cont = self.fn.append_basic_block("in_bounds")
        self.b.cbranch(failed, fail, cont)
        self.b.position_at_end(fail)
        if isinstance(index.type, ir.VectorType):     # report the first failing lane
            width = index.type.count
            bits = self.b.bitcast(bad, ir.IntType(width))
            lane = self.b.call(self.intrinsic(f"llvm.cttz.i{width}", ir.IntType(width),
                                              [ir.IntType(width), I1]), [bits, ir.Constant(I1, 1)])
            index = self.b.extract_element(index, lane)
        self.b.store(ir.Constant(I64, s.code), self.err)
        self.b.store(index, self.b.gep(self.err, [ir.Constant(I64, 1)], source_etype=I64))
        self.b.ret_void()
        self.b.position_at_end(cont)


_LEAVES = (BufLoad, GuardedLoad, LaneReduce, AlignGap, Local, Var, Const)

_STMT = {
    Block: FunctionEmitter.block_,
    For: FunctionEmitter.for_,
    Simd: FunctionEmitter.simd,
    Store: FunctionEmitter.store,
    Alloc: FunctionEmitter.alloc,
    Assign: FunctionEmitter.assign,
    If: FunctionEmitter.if_,
    Check: FunctionEmitter.check,
    Prefetch: FunctionEmitter.prefetch,
}


def add_vector_attributes(fn, target: Target):
    """Let LLVM use the target's full native vectors (it prefers 256 bits on
    AVX-512 CPUs) and no wider ones."""
    bits = target.vector_bytes * 8
    for attr in (f'"prefer-vector-width"="{bits}"', f'"min-legal-vector-width"="{bits}"'):
        set.add(fn.attributes, attr)
