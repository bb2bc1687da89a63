"""Loop IR to LLVM IR (llvmlite.ir).

Each stage becomes two functions:

* ``stageN.body(T0* noalias b0, ..., i64 lo, i64 hi, i64* err)``: internal,
  always inlined, one typed ``noalias dereferenceable`` pointer per buffer the
  stage touches (so LLVM knows the buffers are disjoint and may be read
  speculatively); runs the iterations ``[lo, hi)`` of the parallel root loop;
* ``stageN(i8** buffers, i64 lo, i64 hi, i64* err)``: the entry point the
  runtime calls, which picks the stage's buffers out of the program's table.

and ``run_stages`` runs a range of stages in one call (see ``runtime.py``),
looping over the stages of a scan's time loop (``Stage.step``) once per
step: it sets the loop's counter on entry and advances it after the loop's
last stage, and each stage of the loop reads its time from the counter.

A failed run-time check stores ``(code, index)`` into ``err`` and returns.
Float arithmetic carries ``reassoc contract nsz`` (never nnan/ninf: max
reductions start from -inf; never arcp: ``x * (1/d)`` for ``x / d`` in one
stage and not in another would make the derivative of a max, which finds the
first position where the recomputed body equals the stored maximum, miss
it); floor division and modulo on floats follow
numpy's ``divmod`` exactly and carry no fast-math flags.  The operators are
those of the table ``te_autodiff/ops.py``: arithmetic is an LLVM instruction
(``_INSTRUCTIONS``); a function with a body of our own for its dtype in
``fast_math.py`` (exp, log, tanh, erf...) is that LLVM IR, inline, or one
internal function per module that a stage applying one many times calls
(``INLINE_MATH_USES``); any other is the table's LLVM intrinsic or libm
function.

Vector loops: inside a :class:`~lowering.loop_ir.Simd` loop every value is
either the same in all lanes (kept scalar) or a ``<W x T>`` vector; a load
or store whose index grows by one per lane is one vector access, any other
a gather or scatter, except consecutive stores that together write a row
per lane (a register tile stored across the lanes: :func:`row_groups`),
which are transposed in registers and stored row by row; locals declared
inside are vectors.  A test or loop
bound that differs between lanes runs under a lane mask (masked loads,
stores and assignments; a branch no lane takes is skipped), so any element
body can run in lanes.

Everything CPU-specific comes from the :class:`~lowering.target.Target`:
functions ask LLVM for vectors of the target's native width (``Simd``
loops are never wider, so no masked operation is split below its width);
AVX-512 math instructions are used only where the target has them.  On a
target with streaming stores (x86), full native vectors into an output of at
least :func:`stream_min_bytes` (the power of two at or above L2) that no
stage reads back are non-temporal stores when they write whole cache lines
(``_mark_streaming``): they skip the read for ownership a cached store
costs, a third of a copy's memory traffic; the stage ends with an
``sfence``.
"""
from __future__ import annotations

import re
from collections import Counter

from llvmlite import ir

from te_autodiff import dtype as dt
from te_autodiff.expr import BinOp, Cast, Cmp, Const, Logic, Select, Unary, Var
from te_autodiff.visit import topo_order

from te_autodiff.ops import OPS

from .fast_math import BODIES
from .loop_ir import (AlignGap, Alloc, Assign, Block, BufLoad, Check, For, GuardedLoad, If, IntPower, LaneReduce,
                      Local, Program, Simd, Stage, Store, children, free_leaves, linear_form, simplify_index,
                      stage_buffers, stmt_exprs, stride, substitute, walk)
from . import share
from .target import Target

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
_ENTRY = ir.FunctionType(ir.VoidType(), [PTR, I64, I64, PTR])   # stageN(buffers, lo, hi, err)
VALUE_TYPE = {"bool": I1, "int32": ir.IntType(32), "int64": I64,
              "float32": ir.FloatType(), "float64": ir.DoubleType()}
MEMORY_TYPE = {**VALUE_TYPE, "bool": I8}
FAST = ("reassoc", "contract", "nsz")

PARTIAL_UNROLL = 4      # times LLVM unrolls a loop of kind "partial"
INLINE_MATH_USES = 2    # a stage applying a fast_math function more often calls one copy of it


def _mangle(t) -> str:
    """The type suffix of an overloaded intrinsic: f32, i64, v16f32..."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_mangle(t.element)}"
    if isinstance(t, ir.FloatType):
        return "f32"
    if isinstance(t, ir.DoubleType):
        return "f64"
    if isinstance(t, ir.PointerType):
        return "p0"
    return f"i{t.width}"


def _element(t):
    return t.element if isinstance(t, ir.VectorType) else t


def _shaped(scalar, like):
    """``scalar`` type, as a vector when ``like`` is a vector value."""
    return ir.VectorType(scalar, like.type.count) if isinstance(like.type, ir.VectorType) else scalar


def _c(t, value):
    """A constant of type ``t`` (splatted when ``t`` is a vector type)."""
    return ir.Constant(t, value)


def _kind(dtype: str) -> str:
    return "f" if dt.is_float(dtype) else "b" if dtype == "bool" else "i"


class _DistinctMD(ir.values.MDValue):
    """A ``distinct`` metadata node (access groups, loop ids), compared by identity."""

    def descr(self, buf):
        buf.append("distinct ")
        super().descr(buf)

    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other


def _distinct(module, operands=()):
    return _DistinctMD(module, operands, name=str(len(module.metadata)))


# ------------------------------------------------------------------ operators


def _float_divmod(fe, a, b):
    """numpy's floor divide and remainder for floats: (quotient, remainder)."""
    bld, f = fe.b, a.type
    zero, one, half = (ir.Constant(f, v) for v in (0.0, 1.0, 0.5))
    mod = bld.frem(a, b)
    div = bld.fdiv(bld.fsub(a, mod), b)
    fix = bld.and_(bld.fcmp_unordered("!=", mod, zero),
                   bld.xor(bld.fcmp_ordered("<", b, zero), bld.fcmp_ordered("<", mod, zero)))
    mod = bld.select(fix, bld.fadd(mod, b), mod)
    div = bld.select(fix, bld.fsub(div, one), div)
    mod = bld.select(bld.fcmp_ordered("==", mod, zero), fe.call_intrinsic("llvm.copysign", [zero, b]), mod)
    floor = fe.call_intrinsic("llvm.floor", [div])
    floor = bld.select(bld.fcmp_ordered(">", bld.fsub(div, floor), half), bld.fadd(floor, one), floor)
    quot = bld.select(bld.fcmp_ordered("==", div, zero), fe.call_intrinsic("llvm.copysign", [zero, bld.fdiv(a, b)]),
                      floor)
    by_zero = bld.fcmp_ordered("==", b, zero)
    return bld.select(by_zero, bld.fdiv(a, b), quot), mod


def _int_divmod(fe, a, b):
    """Floor quotient and remainder on ints; x // 0 = x % 0 = 0 as in numpy,
    and MIN // -1 wraps (no trap)."""
    bld, t = fe.b, a.type
    zero, one, minus_one = (ir.Constant(t, v) for v in (0, 1, -1))
    by_zero = bld.icmp_signed("==", b, zero)
    by_minus_one = bld.icmp_signed("==", b, minus_one)
    safe = bld.select(bld.or_(by_zero, by_minus_one), one, b)
    quot, rem = bld.sdiv(a, safe), bld.srem(a, safe)
    fix = bld.and_(bld.icmp_signed("!=", rem, zero),
                   bld.xor(bld.icmp_signed("<", rem, zero), bld.icmp_signed("<", safe, zero)))
    quot = bld.sub(quot, bld.zext(fix, t))
    rem = bld.add(rem, bld.select(fix, safe, zero))
    quot = bld.select(by_minus_one, bld.sub(zero, a), quot)
    return bld.select(by_zero, zero, quot), bld.select(by_zero, zero, rem)


def _int_minmax(name):
    def rule(fe, a, b):
        return fe.call_intrinsic(f"llvm.{name}", [a, b])
    return rule


def _int_abs(fe, x):
    fn = fe.intrinsic(f"llvm.abs.{_mangle(x.type)}", x.type, [x.type, I1])
    return fe.b.call(fn, [x, ir.Constant(I1, 0)])


def _int_sign(fe, x):
    zero = ir.Constant(x.type, 0)
    return fe.b.sub(fe.b.zext(fe.b.icmp_signed(">", x, zero), x.type),
                    fe.b.zext(fe.b.icmp_signed("<", x, zero), x.type))


# the operators of ops.py that are LLVM instructions, by (operator, kind of
# dtype); the others are math functions (_Emitter.math)
_INSTRUCTIONS = {
    ("add", "f"): lambda fe, a, b: fe.b.fadd(a, b, flags=FAST),
    ("sub", "f"): lambda fe, a, b: fe.b.fsub(a, b, flags=FAST),
    ("mul", "f"): lambda fe, a, b: fe.b.fmul(a, b, flags=FAST),
    ("div", "f"): lambda fe, a, b: fe.b.fdiv(a, b, flags=FAST),
    ("floordiv", "f"): lambda fe, a, b: _float_divmod(fe, a, b)[0],
    ("mod", "f"): lambda fe, a, b: _float_divmod(fe, a, b)[1],
    ("add", "i"): lambda fe, a, b: fe.b.add(a, b),
    ("sub", "i"): lambda fe, a, b: fe.b.sub(a, b),
    ("mul", "i"): lambda fe, a, b: fe.b.mul(a, b),
    ("floordiv", "i"): lambda fe, a, b: _int_divmod(fe, a, b)[0],
    ("mod", "i"): lambda fe, a, b: _int_divmod(fe, a, b)[1],
    ("max", "i"): _int_minmax("smax"),
    ("min", "i"): _int_minmax("smin"),
    ("neg", "f"): lambda fe, x: fe.b.fneg(x, flags=FAST),
    ("neg", "i"): lambda fe, x: fe.b.sub(ir.Constant(x.type, 0), x),
    ("abs", "i"): _int_abs,
    ("sign", "i"): _int_sign,
}


MULTIPLIED_POWERS = 16     # x ** n for a constant integer |n| up to this: multiplications, not pow


def _power(fe, e, vals):
    """``a ** b``: by multiplications where ``b`` is a constant integer
    (:func:`_power_by_squaring`), else the pow body (an integer exponent
    whose range is known was made an :class:`IntPower` or a running product
    by ``powers.py``).  float32 multiplies in float64 (past ``x * x``): the
    result rounds once."""
    x = vals[0]
    n = e.b.value if isinstance(e.b, Const) else None
    if not (n is not None and float(n).is_integer() and abs(n) <= MULTIPLIED_POWERS):
        return fe.math("pow", vals)
    xw = x if n in (-1, 2) else _wide(fe, x)                # one rounding anyway
    out = _power_by_squaring(fe, xw, int(n))
    return out if out.type == x.type else fe.b.fptrunc(out, x.type)


def _wide(fe, x):
    """``x`` in float64 (float32 powers multiply in float64 and round once)."""
    wide = _shaped(VALUE_TYPE["float64"], x)
    return x if wide == x.type else fe.b.fpext(x, wide)


def _int_power(fe, e, vals):
    """:class:`~lowering.loop_ir.IntPower`: ``x ** k`` by square-and-multiply
    over the ``e.bits`` low bits of ``|k|``, each bit a select between the
    product with the current square and the product without it (no branch:
    every lane runs the same instructions), then ``1 / x ** |k|`` where
    ``k < 0`` when ``e.signed``.  The products are in float64, rounded once
    to float32."""
    x, k = vals
    b = fe.b
    xw = _wide(fe, x)
    one = ir.Constant(xw.type, 1.0)
    m = _int_abs(fe, k) if e.signed else k
    acc, square = None, xw
    for bit in range(e.bits):
        on = b.trunc(b.lshr(m, ir.Constant(m.type, bit)) if bit else m, _shaped(I1, m))
        acc = b.select(on, square, one) if acc is None else b.select(on, b.fmul(acc, square), acc)
        if bit + 1 < e.bits:
            square = b.fmul(square, square)
    acc = one if acc is None else acc
    if e.signed:
        acc = b.select(b.icmp_signed("<", k, ir.Constant(k.type, 0)), b.fdiv(one, acc), acc)
    return acc if acc.type == x.type else b.fptrunc(acc, x.type)


def _power_by_squaring(fe, x, n):
    """``x ** n`` for a constant integer ``n``: square-and-multiply over the
    bits of ``|n|``, and ``1 / x ** |n|`` for a negative ``n``."""
    acc, p, m = None, x, abs(n)
    while m:
        if m & 1:
            acc = p if acc is None else fe.b.fmul(acc, p)
        m >>= 1
        if m:
            p = fe.b.fmul(p, p)
    acc = ir.Constant(x.type, 1.0) if acc is None else acc
    return fe.b.fdiv(ir.Constant(x.type, 1.0), acc) if n < 0 else acc


def _operator(fe, op: str, kind: str, args):
    """Operator ``op`` of ops.py on ``args`` of the kind of dtype ``kind``."""
    rule = _INSTRUCTIONS.get((op, kind))
    return fe.math(op, args) if rule is None else rule(fe, *args)


_CMP_SYMBOL = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _cmp(fe, e, a, b):
    sym, kind = _CMP_SYMBOL[e.op], _kind(e.a.dtype)
    if kind == "f":     # numpy: every comparison with NaN is false except !=
        return fe.b.fcmp_unordered(sym, a, b) if e.op == "ne" else fe.b.fcmp_ordered(sym, a, b)
    return (fe.b.icmp_signed if kind == "i" else fe.b.icmp_unsigned)(sym, a, b)


def _cast_int_float(fe, x, to):
    return fe.b.sitofp(x, to)


def _cast_float_int(fe, x, to):     # truncates toward zero, saturating instead of UB
    name = f"llvm.fptosi.sat.{_mangle(to)}.{_mangle(x.type)}"
    return fe.b.call(fe.intrinsic(name, to, [x.type]), [x])


def _cast_int_int(fe, x, to):
    a, b = _element(x.type).width, _element(to).width
    if a == b:
        return x
    return fe.b.sext(x, to) if a < b else fe.b.trunc(x, to)


def _cast_float_float(fe, x, to):
    if x.type == to:
        return x
    return fe.b.fpext(x, to) if isinstance(_element(to), ir.DoubleType) else fe.b.fptrunc(x, to)


_CAST = {
    ("i", "i"): _cast_int_int,
    ("i", "f"): _cast_int_float,
    ("f", "i"): _cast_float_int,
    ("f", "f"): _cast_float_float,
    ("b", "i"): lambda fe, x, to: fe.b.zext(x, to),
    ("b", "f"): lambda fe, x, to: fe.b.uitofp(x, to),
    ("i", "b"): lambda fe, x, to: fe.b.icmp_signed("!=", x, ir.Constant(x.type, 0)),
    ("f", "b"): lambda fe, x, to: fe.b.fcmp_unordered("!=", x, ir.Constant(x.type, 0.0)),
    ("b", "b"): lambda fe, x, to: x,
}


def _logic(fe, e, vals):
    if e.op == "not":
        return fe.b.not_(vals[0])
    return (fe.b.and_ if e.op == "and" else fe.b.or_)(vals[0], vals[1])


def _const(fe, e, vals):
    value = int(e.value) if e.dtype == "bool" else e.value
    return ir.Constant(VALUE_TYPE[e.dtype], value)


def _unbound(fe, e, vals):
    raise RuntimeError(f"loop IR uses variable '{e.name}' outside its loop")


_EXPR = {
    Const: _const,
    Var: _unbound,
    BinOp: lambda fe, e, v: _power(fe, e, v) if e.op == "pow" else _operator(fe, e.op, _kind(e.dtype), v),
    Cmp: lambda fe, e, v: _cmp(fe, e, v[0], v[1]),
    Logic: _logic,
    Unary: lambda fe, e, v: _operator(fe, e.op, _kind(e.dtype), v),
    Select: lambda fe, e, v: fe.b.select(v[0], v[1], v[2]),
    Cast: lambda fe, e, v: _CAST[(_kind(e.a.dtype), _kind(e.to))](fe, v[0], _shaped(VALUE_TYPE[e.to], v[0])),
    BufLoad: lambda fe, e, v: fe.load(e, v[0]),
    GuardedLoad: lambda fe, e, v: fe.load(e, v[0], v[1]),
    LaneReduce: lambda fe, e, v: fe.lane_reduce(e, v[0]),
    IntPower: _int_power,
    AlignGap: lambda fe, e, v: fe.align_gap(e),
    Local: lambda fe, e, v: fe.b.load(fe.locals[e], typ=fe.local_type[e]),
}


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


# ----------------------------------------------------------------- functions


class _Lanes:
    """The enclosing :class:`Simd` loop: its variable, first value and width,
    and which memory indices are contiguous across its lanes."""

    def __init__(self, var, lo, width):
        self.var, self.lo, self.width = var, lo, width
        self.bases = {}

    def base(self, index):
        """The index of lane 0 when ``index`` grows by exactly one per lane
        (a vector load or store at that base), else ``None``."""
        if index not in self.bases:
            leaves = free_leaves(index)
            ok = (self.var in leaves and not any(isinstance(x, Local) for x in leaves)
                  and stride(index, self.var) == 1)
            self.bases[index] = simplify_index(substitute(index, {self.var: self.lo})) if ok else None
        return self.bases[index]


class _Emitter:
    """An IR builder ``b`` in function ``fn`` of ``module``, for ``target``."""

    def intrinsic(self, name, ret, args):
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, args), name=name)
        return fn

    def call_intrinsic(self, base, args):
        """``base.<type>(args)`` for an overloaded intrinsic returning its argument type."""
        t = args[0].type
        return self.b.call(self.intrinsic(f"{base}.{_mangle(t)}", t, [a.type for a in args]), list(args))

    def libm(self, name, args):
        """The C function ``name`` on ``args``: one call per lane of a vector
        (libm has no vector entry)."""
        t = args[0].type
        scalar = _element(t)
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


class _FunctionEmitter(_Emitter):
    """Emits one stage's body function.

    Inside a :class:`Simd` loop (``self.lanes``) a value that is the same in
    every lane stays a scalar and the others are ``<W x T>`` vectors; scalars
    are splatted where they meet vectors.  ``self.mask`` holds the active
    lanes (``None``: all): masked loads, stores and assignments respect it,
    an ``If`` or loop whose condition or bounds differ between lanes narrows
    it, and a branch no lane takes is skipped."""

    def __init__(self, module: ir.Module, stage: Stage, name: str, target: Target, read=frozenset(),
                 inline: bool = True):
        self.module = module
        self.target = target
        self.buffers, self.loaded = stage_buffers(stage)
        self.written = {x.buffer for x in walk(stage.body) if isinstance(x, Store)}
        self.loaded = self.loaded | read           # read by this stage or by another one
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
        self.stream = []            # the candidates for streaming stores (_vector_store)
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
        name = f"te.{op}.{_mangle(t)}"
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
        scalar = _element(t)
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
        return self.b.call(self.intrinsic(f"llvm.vector.reduce.{op}.{_mangle(t)}", t.element, [t]), [v])

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
        width = max(1, self.target.vector_bytes // _ITEMSIZE[buf.dtype])
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
        return self.b.lshr(gap, ir.Constant(I64, _ITEMSIZE[e.buffer.dtype].bit_length() - 1))

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
        align = ir.Constant(I32, _align(buf))
        vector_cond = cond is not None and isinstance(cond.type, ir.VectorType)
        contiguous = self.lanes is not None and self.lanes.base(e.index) is not None
        if cond is not None and not contiguous and not vector_cond \
                and not isinstance(index.type, ir.VectorType):       # one scalar: read a safe index
            safe = self.b.select(cond, index, ir.Constant(index.type, 0))
            value = self._tag(self.b.load(self._address(buf, safe), typ=t, align=_align(buf)))
            value = self.b.select(cond, value, ir.Constant(t, 0))
        elif contiguous:
            vt = ir.VectorType(t, self.lanes.width)
            ptr = self._address(buf, index)
            mask = self.mask if cond is None else self._and_mask(self.splat(cond))
            if mask is None:
                value = self._tag(self.b.load(ptr, typ=vt, align=_align(buf)))
            else:
                parts = []
                for first, m in self._native_pieces(buf, mask):
                    pt = ir.VectorType(t, m.type.count)
                    fn = self.intrinsic(f"llvm.masked.load.{_mangle(pt)}.p0", pt, [PTR, I32, m.type, pt])
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
                fn = self.intrinsic(f"llvm.masked.gather.{_mangle(pt)}.{_mangle(at.type)}", pt,
                                    [at.type, I32, m.type, pt])
                parts.append(self._tag(self.b.call(fn, [at, align, m, ir.Constant(pt, None)])))
            value = self.joined(parts)
        else:
            value = self._tag(self.b.load(self._address(buf, index), typ=t, align=_align(buf)))
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
            value = _operator(self, e.op, _kind(e.dtype), halves)
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
        return children(node)

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
            value = _EXPR[type(node)](self, node, vals)
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
            self.access_group = _distinct(self.module)
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
            loop_id = _distinct(self.module)
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
                                           _ITEMSIZE[e.buffer.dtype]) for e in reads}
            self.scopes.pop()
            for k in range(width):
                self.block(s.body, {s.var: self.b.add(first, ir.Constant(I64, k)),
                                    **{e: columns[e][k] for e in reads}})

        self._loop(s.var, ir.Constant(I64, 0), ir.Constant(I64, s.extent.value // width), block)

    def _rows(self, e, index, step):
        """``W`` vector loads of ``e.buffer`` at ``index``, ``index + step``, ..."""
        vt = ir.VectorType(MEMORY_TYPE[e.buffer.dtype], self.lanes.width)
        return [self._tag(self.b.load(self._address(e.buffer, self.b.add(index, ir.Constant(index.type, l * step))),
                                      typ=vt, align=_align(e.buffer)))
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
                columns = self._transposed([self.lanes_of(r, first, p) for r in rows], _ITEMSIZE[buf.dtype])
                for l, column in enumerate(columns):
                    at = self.b.add(lane0, ir.Constant(I64, (first + l) * step))
                    self._tag(self.b.store(self.lanes_of(column, 0, m), self._address(buf, at), align=_align(buf)))

    def store(self, s: Store):
        buf = s.buffer
        value = self.expr(s.value)
        base = self.lanes.base(s.index) if self.lanes is not None else None
        index = self.expr(base if base is not None else s.index)
        vector = base is not None or isinstance(index.type, ir.VectorType)
        if vector:
            value = self.splat(value)
        if buf.dtype == "bool":
            value = self.b.zext(value, _shaped(I8, value))
        align = ir.Constant(I32, _align(buf))
        if base is not None:
            ptr = self._address(buf, index)
            if self.mask is None:
                self._tag(self._vector_store(buf, base, value, ptr))
            else:
                for first, m in self._native_pieces(buf, self.mask):
                    part = self.lanes_of(value, first, m.type.count)
                    fn = self.intrinsic(f"llvm.masked.store.{_mangle(part.type)}.p0", ir.VoidType(),
                                        [part.type, PTR, I32, m.type])
                    self._tag(self.b.call(fn, [part, self._at(buf, ptr, first), align, m]))
        elif vector:
            ptrs = self._address(buf, index)
            for first, m in self._native_pieces(buf, self._mask_or_all(index.type.count)):
                part, at = self.lanes_of(value, first, m.type.count), self.lanes_of(ptrs, first, m.type.count)
                fn = self.intrinsic(f"llvm.masked.scatter.{_mangle(part.type)}.{_mangle(at.type)}",
                                    ir.VoidType(), [part.type, at.type, I32, m.type])
                self._tag(self.b.call(fn, [part, at, align, m]))
        else:
            if isinstance(value.type, ir.VectorType):
                raise RuntimeError(f"stage stores different lanes' values to one element of '{buf.name}'")
            self._tag(self.b.store(value, self._address(buf, index), align=_align(buf)))

    def _vector_store(self, buf, base, value, ptr):
        """A full vector store (one register or several: ``Blocking.math_chains``), a
        candidate for a non-temporal one (past the caches, no read for
        ownership: :meth:`_mark_streaming`) into a large output no stage
        reads, at an element aligned to the vector (outputs are allocated
        64-byte aligned)."""
        form = linear_form(base)
        lanes = value.type.count
        candidate = (self.target.streaming_stores and buf.kind == "output"
                     and buf.nbytes >= stream_min_bytes(self.target) and buf not in self.loaded
                     and lanes * _ITEMSIZE[buf.dtype] % self.target.vector_bytes == 0 and form is not None
                     and all(k % lanes == 0 for k in form[0].values()) and form[1] % lanes == 0)
        if not candidate:
            return self.b.store(value, ptr, align=_align(buf))
        st = self.b.store(value, ptr, align=self.target.vector_bytes)
        self.stream.append((st, buf, form, lanes, tuple(self.loops)))
        return st

    def _mark_streaming(self) -> bool:
        """Make non-temporal the candidate stores that write whole cache lines,
        and say whether there are any.  A vector narrower than a line (AVX2's
        32 bytes, 64-byte lines) streams only when the line's other vectors
        are stored in the same iteration (a register tile's row) or by the
        next iteration of the innermost loop that moves the store (a row
        written in order).  A store that leaves a line half written (a
        transposed tile: the next store goes to another row) would make the
        processor's few write-combining buffers flush partial lines, slower
        than writing through the caches."""
        offsets = {}
        for _, buf, (terms, c), _, _ in self.stream:
            offsets.setdefault((buf, frozenset(terms.items())), set()).add(c)
        streamed = False
        for st, buf, (terms, c), lanes, loops in self.stream:
            line = self.target.cache_line // _ITEMSIZE[buf.dtype]
            vectors = max(line // lanes, 1)
            same = offsets[(buf, frozenset(terms.items()))]
            whole_line = (vectors == 1 or all(k % line == 0 for k in terms.values())
                          and all(c - c % line + lanes * v in same for v in range(vectors)))
            moving = next((terms.get(v, 0) for v in reversed(loops) if terms.get(v, 0)), 0)
            if whole_line or moving == lanes:
                st.set_metadata("nontemporal", self.module.add_metadata([ir.Constant(I32, 1)]))
                streamed = True
        return streamed

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
        if _element(index.type).width < 64:               # an int32 index read from data
            index = self.b.sext(index, _shaped(I64, index))
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
    Block: _FunctionEmitter.block_,
    For: _FunctionEmitter.for_,
    Simd: _FunctionEmitter.simd,
    Store: _FunctionEmitter.store,
    Alloc: _FunctionEmitter.alloc,
    Assign: _FunctionEmitter.assign,
    If: _FunctionEmitter.if_,
    Check: _FunctionEmitter.check,
}


def add_vector_attributes(fn, target: Target):
    """Let LLVM use the target's full native vectors (it prefers 256 bits on
    AVX-512 CPUs) and no wider ones."""
    bits = target.vector_bytes * 8
    for attr in (f'"prefer-vector-width"="{bits}"', f'"min-legal-vector-width"="{bits}"'):
        set.add(fn.attributes, attr)


_ITEMSIZE = {"bool": 1, "int32": 4, "int64": 8, "float32": 4, "float64": 8}


def stream_min_bytes(target: Target) -> int:
    """Outputs at least this large (the power of two at or above L2: they
    would evict the stage's working set) are written with streaming stores."""
    return 1 << (target.l2_bytes - 1).bit_length()


def _align(buf) -> int:
    """Element alignment (inputs may be any numpy array, so no more is promised)."""
    return _ITEMSIZE[buf.dtype]


def stage_symbol(n: int) -> str:
    return f"stage{n}"


def stage_groups(program: Program, target: Target) -> list:
    """``program``'s stages grouped by template (:func:`~lowering.share.group`)."""
    read = frozenset().union(*(stage_buffers(stage)[1] for stage in program.stages))
    return share.group(program.stages, target.alignment, read)


def emit_modules(program: Program, groups: list, target: Target, data_layout: str = "", openmp: bool = False,
                 parts: int = 1):
    """LLVM modules for ``target``, at most ``parts`` of them (see
    :func:`partition`), together one entry point ``stageN`` per stage of
    ``program`` and, in the first, ``run_stages`` running a range of them
    (splitting stages across threads through libgomp's ``GOMP_parallel``
    when ``openmp``).  The stages of one template (``groups``:
    :func:`stage_groups`) call one body function, with their own buffers at
    their own offsets; a template and its entries are in one module, and the
    first module declares the entries the others define.  A generator: the
    modules are emitted one at a time, so LLVM can work on one while the
    next is emitted."""
    part_of = partition([compile_weight(members[0].key[0]) for _, members in groups], parts)
    index = {buf: k for k, buf in enumerate(program.buffers)}
    number = {id(stage): n for n, stage in enumerate(program.stages)}
    for part in range(max(part_of, default=0) + 1):
        module = ir.Module(name=f"{program.name}.{part}" if part else program.name)
        module.triple, module.data_layout = target.triple, data_layout
        entries = {}
        for k, (template, members) in enumerate(groups):
            if part_of[k] != part:
                continue
            # the slots some stage reads (share.form's key says which)
            read = frozenset(c for c, (_, _, is_read, _) in zip(share.slot_buffers(template), members[0].key[1])
                             if is_read)
            name = stage_symbol(number[id(template)]) + ".body" if len(members) == 1 else f"template{k}"
            body = _FunctionEmitter(module, template, name, target, read, inline=len(members) == 1)
            for member in members:
                n = number[id(member.stage)]
                entries[n] = _entry(module, stage_symbol(n), target, body.fn,
                                    [(index[buf], off, buf.dtype) for buf, off in member.slots])
        if part == 0:
            _emit_run_stages(module, program, [entries[n] if n in entries else
                                               ir.Function(module, _ENTRY, name=stage_symbol(n))
                                               for n in range(len(program.stages))], openmp, target)
        yield module


# LLVM's time for a stage group, in characters of its loop-IR text: a fixed
# part for its functions, its text, and for each transcendental function the
# vector instructions of its inline code (fast_math.py; one copy when the
# group calls it).  Only the ratios matter (they balance the modules).
GROUP_TEXT, MATH_TEXT = 1_000, 600
PART_TEXT = 10_000      # weight worth an LLVM process of its own
_MATH_CALL = re.compile(r"\b(" + "|".join(sorted({op for op, _ in BODIES})) + r")\(")


def compile_weight(text: str) -> int:
    """Roughly how long LLVM takes over a stage group whose typed loop IR is ``text``."""
    copies = sum(n if n <= INLINE_MATH_USES else 1 for n in Counter(_MATH_CALL.findall(text)).values())
    return GROUP_TEXT + len(text) + MATH_TEXT * copies


def partition(sizes: list, parts: int) -> list:
    """The module each of the stage groups of ``sizes`` (their
    :func:`compile_weight`) goes to: at most ``parts`` modules, one per
    ``PART_TEXT``, balanced by giving each group, heaviest first, to the
    module with the least weight so far.  Module 0 also holds ``run_stages``."""
    count = max(1, min(parts, sum(sizes) // PART_TEXT))
    load, out = [0] * count, [0] * len(sizes)
    for k in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
        out[k] = load.index(min(load))
        load[out[k]] += sizes[k]
    return out


def _entry(module, name, target, body, slots):
    """``name(i8** buffers, i64 lo, i64 hi, i64* err)``: calls ``body`` with
    the buffers ``slots`` names (``(table index, element offset, dtype)``)."""
    entry = ir.Function(module, _ENTRY, name=name)
    add_vector_attributes(entry, target)
    entry.attributes.add("noinline")    # one machine code per stage, whatever calls it: the
    table, lo, hi, err = entry.args     # same bits from run_stages, a thread chunk or Python
    for arg in (table, err):
        arg.add_attribute("noalias")
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    ptrs = []
    for slot, off, dtype in slots:
        ptr = b.load(b.gep(table, [ir.Constant(I64, slot)], source_etype=PTR), typ=PTR)
        if off:
            ptr = b.gep(ptr, [ir.Constant(I64, off)], inbounds=True, source_etype=MEMORY_TYPE[dtype])
        ptrs.append(ptr)
    b.call(body, ptrs + [lo, hi, err])
    b.ret_void()
    return entry


RUN_STAGES = "run_stages"
CHUNK_ALIGN_1D = 1024        # chunk edges of unscheduled 1-d stages (LLVM's vector/remainder split)


def root_extent(stage: Stage) -> int:
    """Iterations of a stage's parallel root loop (1 when it has none)."""
    root = stage.body
    if isinstance(root, For) and root.kind == "parallel" and isinstance(root.extent, Const):
        return max(root.extent.value, 0)
    return 1


def chunk_align(stage: Stage) -> int:
    """Chunk edges of a split stage are multiples of this.  A scheduled stage
    computes every element with the same code wherever a chunk starts; a
    1-d stage left to LLVM's loop vectoriser keeps its vector/remainder split."""
    scheduled = any(isinstance(x, Simd) for x in walk(stage.body))
    return CHUNK_ALIGN_1D if len(stage.buffer.shape) <= 1 and not scheduled else 1


def _dispatch(b, fn, n, entries, args_of, after):
    """``switch (n)``: call ``entries[k](*args_of(k))``, then branch to ``after``."""
    switch = b.switch(n, after)
    for k, entry in enumerate(entries):
        case = fn.append_basic_block(f"stage{k}")
        switch.add_case(ir.Constant(I64, k), case)
        b.position_at_end(case)
        b.call(entry, args_of(k))
        b.branch(after)


def _emit_chunk(module, program, entries, target):
    """``run_chunk(i64* ctx)``, run by every thread of a ``GOMP_parallel``
    region: ``ctx = {table, stage, extent, align, err}``; thread ``t`` of ``n``
    runs its contiguous, ``align``-rounded share of the root loop and
    reports a failed check in ``err[2t .. 2t+1]``."""
    i32_fn = ir.FunctionType(I32, [])
    tid_fn = ir.Function(module, i32_fn, name="omp_get_thread_num")
    num_fn = ir.Function(module, i32_fn, name="omp_get_num_threads")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), name="run_chunk")
    add_vector_attributes(fn, target)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ctx = fn.args[0]
    field = [b.load(b.gep(ctx, [ir.Constant(I64, k)], source_etype=I64), typ=I64) for k in range(5)]
    table = b.inttoptr(field[0], PTR)
    stage, extent, align = field[1:4]
    err = b.inttoptr(field[4], PTR)
    tid = b.sext(b.call(tid_fn, []), I64)
    n = b.sext(b.call(num_fn, []), I64)
    one = ir.Constant(I64, 1)
    step = b.sdiv(b.sub(b.add(extent, n), one), n)
    step = b.mul(b.sdiv(b.sub(b.add(step, align), one), align), align)
    lo = b.mul(tid, step)
    hi = b.call(module.globals.get("llvm.smin.i64") or ir.Function(
        module, ir.FunctionType(I64, [I64, I64]), name="llvm.smin.i64"), [b.add(lo, step), extent])
    slot = b.gep(err, [b.mul(tid, ir.Constant(I64, 2))], source_etype=I64)
    done = fn.append_basic_block("done")
    work = fn.append_basic_block("work")
    b.cbranch(b.icmp_signed("<", lo, hi), work, done)
    b.position_at_end(work)
    _dispatch(b, fn, stage, entries, lambda k: [table, lo, hi, slot], done)
    b.position_at_end(done)
    b.ret_void()
    return fn


def _time_loops(program: Program) -> list:
    """``[(first stage, last stage, TimeLoop)]`` for each time loop of ``program``."""
    out = []
    for n, st in enumerate(program.stages):
        if st.step is None:
            continue
        if out and out[-1][2] is st.step and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n, st.step)
        else:
            out.append((n, n, st.step))
    return out


def _stage_table(module, name, values):
    """A constant i64 array, one entry per stage."""
    const_ = ir.Constant(ir.ArrayType(I64, len(values)), values)
    g = ir.GlobalVariable(module, const_.type, name=name)
    g.global_constant, g.initializer, g.linkage = True, const_, "internal"
    return g


def _entry_of(b, g, n):
    return b.load(b.gep(g, [ir.Constant(I64, 0), n], source_etype=g.value_type), typ=I64)


def _counter(b, table, slot):
    return b.load(b.gep(table, [slot], source_etype=PTR), typ=PTR)


def _start_time_loop(module, b, program, table, n):
    """When stage ``n`` (an i64 value) opens a time loop, set its counter to the loop's start."""
    loops = _time_loops(program)
    if not loops:
        return
    slot = {buf: k for k, buf in enumerate(program.buffers)}
    opens, starts = [-1] * len(program.stages), [0] * len(program.stages)
    for first, _, step in loops:
        opens[first], starts[first] = slot[step.counter], step.lo
    opens_g = module.globals.get("loop_opens") or _stage_table(module, "loop_opens", opens)
    starts_g = module.globals.get("loop_starts") or _stage_table(module, "loop_starts", starts)
    inside = b.icmp_signed("<", n, ir.Constant(I64, len(program.stages)))
    n_safe = b.select(inside, n, ir.Constant(I64, 0))
    k = _entry_of(b, opens_g, n_safe)
    with b.if_then(b.and_(inside, b.icmp_signed(">=", k, ir.Constant(I64, 0)))):
        b.store(_entry_of(b, starts_g, n_safe), _counter(b, table, k))


def _next_stage(module, b, program, table, n):
    """The stage after stage ``n``: at the end of a time loop, advance its
    counter and go back to the loop's first stage until the last step ran;
    entering a time loop sets its counter.  Returns the next index."""
    nxt = b.add(n, ir.Constant(I64, 1))
    loops = _time_loops(program)
    if not loops:
        return nxt
    slot = {buf: k for k, buf in enumerate(program.buffers)}
    closes, ends, firsts = ([-1] * len(program.stages) for _ in range(3))
    for first, last, step in loops:
        closes[last], ends[last], firsts[last] = slot[step.counter], step.lo + step.extent, first
    closes_g, ends_g, firsts_g = (_stage_table(module, name, values) for name, values in
                                  (("loop_closes", closes), ("loop_ends", ends), ("loop_firsts", firsts)))
    k = _entry_of(b, closes_g, n)
    closing = b.icmp_signed(">=", k, ir.Constant(I64, 0))
    pre = b.block
    with b.if_then(closing):
        ptr = _counter(b, table, k)
        time = b.add(b.load(ptr, typ=I64), ir.Constant(I64, 1))
        b.store(time, ptr)
        again = b.icmp_signed("<", time, _entry_of(b, ends_g, n))
        back = b.select(again, _entry_of(b, firsts_g, n), nxt)
        inner = b.block
    target = b.phi(I64, name="next")
    target.add_incoming(nxt, pre)
    target.add_incoming(back, inner)
    repeat = b.icmp_signed("<=", target, n)
    with b.if_then(b.not_(repeat)):
        _start_time_loop(module, b, program, table, target)
    return target


def _emit_run_stages(module, program, entries, openmp, target):
    """``run_stages(i8** buffers, i64 first, i64 last, i64* err, i64 threads,
    i8* split)``: stages ``[first, last)`` in order, each over its whole root
    loop (with ``openmp``, a stage whose ``split`` flag is set runs on
    ``threads`` threads), stopping at the first failed check: one native
    call runs a whole kernel.  ``err`` has two slots per thread."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64, PTR, I64, PTR]),
                     name=RUN_STAGES)
    table, first, last, err, threads, split = fn.args
    entry = fn.append_basic_block("entry")
    head = fn.append_basic_block("head")
    latch = fn.append_basic_block("latch")
    done = fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    ctx = b.alloca(I64, ir.Constant(I64, 5), name="ctx")
    _start_time_loop(module, b, program, table, first)
    start = b.block
    b.branch(head)
    b.position_at_end(head)
    n = b.phi(I64, name="n")
    n.add_incoming(first, start)
    dispatch = fn.append_basic_block("dispatch")
    b.cbranch(b.icmp_signed("<", n, last), dispatch, done)
    b.position_at_end(dispatch)
    serial = fn.append_basic_block("serial")
    if openmp:
        chunk = _emit_chunk(module, program, entries, target)
        gomp = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I32, I32]), name="GOMP_parallel")
        extents = ir.Constant(ir.ArrayType(I64, len(entries)),
                              [root_extent(st) for st in program.stages])
        aligns = ir.Constant(ir.ArrayType(I64, len(entries)), [chunk_align(st) for st in program.stages])
        tables = []
        for name, const_ in (("extents", extents), ("aligns", aligns)):
            g = ir.GlobalVariable(module, const_.type, name=name)
            g.global_constant, g.initializer, g.linkage = True, const_, "internal"
            tables.append(g)
        flag = b.load(b.gep(split, [n], source_etype=I8), typ=I8)
        parallel = fn.append_basic_block("parallel")
        go = b.and_(b.icmp_signed(">", threads, ir.Constant(I64, 1)),
                    b.icmp_unsigned("!=", flag, ir.Constant(I8, 0)))
        b.cbranch(go, parallel, serial)
        b.position_at_end(parallel)
        values = [b.ptrtoint(table, I64), n,
                  b.load(b.gep(tables[0], [ir.Constant(I64, 0), n], source_etype=extents.type), typ=I64),
                  b.load(b.gep(tables[1], [ir.Constant(I64, 0), n], source_etype=aligns.type), typ=I64),
                  b.ptrtoint(err, I64)]
        for k, v in enumerate(values):
            b.store(v, b.gep(ctx, [ir.Constant(I64, k)], source_etype=I64))
        b.call(gomp, [chunk, ctx, b.trunc(threads, I32), ir.Constant(I32, 0)])
        b.branch(latch)
    else:
        b.branch(serial)
    b.position_at_end(serial)
    _dispatch(b, fn, n, entries,
              lambda k: [table, ir.Constant(I64, 0), ir.Constant(I64, root_extent(program.stages[k])), err],
              latch)
    b.position_at_end(latch)
    nxt = _next_stage(module, b, program, table, n)
    slots = b.select(b.icmp_signed(">", threads, ir.Constant(I64, 1)), threads, ir.Constant(I64, 1))
    # any thread's slot reporting a failure stops the run
    check = fn.append_basic_block("check")
    from_latch = b.block
    b.branch(check)
    b.position_at_end(check)
    t = b.phi(I64, name="t")
    t.add_incoming(ir.Constant(I64, 0), from_latch)
    code = b.load(b.gep(err, [b.mul(t, ir.Constant(I64, 2))], source_etype=I64), typ=I64)
    t_next = b.add(t, ir.Constant(I64, 1))
    failed = b.icmp_signed("!=", code, ir.Constant(I64, 0))
    more = fn.append_basic_block("more")
    b.cbranch(failed, done, more)
    b.position_at_end(more)
    t_more = b.icmp_signed("<", t_next, slots)
    b.cbranch(t_more, check, head)
    t.add_incoming(t_next, more)
    n.add_incoming(nxt, more)
    b.position_at_end(done)
    b.ret_void()
