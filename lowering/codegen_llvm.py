"""Loop IR to LLVM IR (llvmlite.ir).

Each stage becomes two functions:

* ``stageN.body(T0* noalias b0, ..., i64 lo, i64 hi, i64* err)``: internal,
  always inlined, one typed ``noalias dereferenceable`` pointer per buffer the
  stage touches (so LLVM knows the buffers are disjoint and may be read
  speculatively); runs the iterations ``[lo, hi)`` of the parallel root loop;
* ``stageN(i8** buffers, i64 lo, i64 hi, i64* err)``: the entry point the
  runtime calls, which picks the stage's buffers out of the program's table.

A failed run-time check stores ``(code, index)`` into ``err`` and returns.
Float arithmetic carries ``reassoc contract nsz arcp`` (never nnan/ninf:
max reductions start from -inf); floor division and modulo on floats follow
numpy's ``divmod`` exactly and carry no fast-math flags.
"""
from __future__ import annotations

from llvmlite import ir

from te_autodiff import dtype as dt
from te_autodiff.expr import BinOp, Cast, Cmp, Const, Logic, Select, Unary, Var

from .loop_ir import (Alloc, Assign, Block, BufLoad, Check, For, If, Local, Program, Stage, Store,
                      children, stmt_exprs, walk)

I1, I8, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(64)
PTR = ir.PointerType()
VALUE_TYPE = {"bool": I1, "int32": ir.IntType(32), "int64": I64,
              "float32": ir.FloatType(), "float64": ir.DoubleType()}
MEMORY_TYPE = {**VALUE_TYPE, "bool": I8}
FAST = ("reassoc", "contract", "nsz", "arcp")

# Math functions by operation: (float32 symbol, float64 symbol).  llvm.* are
# intrinsics; tanh and log1p are libm symbols resolved in-process.
MATH_FUNCTIONS = {
    "exp": ("llvm.exp.f32", "llvm.exp.f64"),
    "log": ("llvm.log.f32", "llvm.log.f64"),
    "sqrt": ("llvm.sqrt.f32", "llvm.sqrt.f64"),
    "sin": ("llvm.sin.f32", "llvm.sin.f64"),
    "cos": ("llvm.cos.f32", "llvm.cos.f64"),
    "abs": ("llvm.fabs.f32", "llvm.fabs.f64"),
    "pow": ("llvm.pow.f32", "llvm.pow.f64"),
    "max": ("llvm.maximum.f32", "llvm.maximum.f64"),
    "min": ("llvm.minimum.f32", "llvm.minimum.f64"),
    "floor": ("llvm.floor.f32", "llvm.floor.f64"),
    "copysign": ("llvm.copysign.f32", "llvm.copysign.f64"),
    "tanh": ("tanhf", "tanh"),
    "log1p": ("log1pf", "log1p"),
}


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
    mod = bld.select(bld.fcmp_ordered("==", mod, zero), fe.math("copysign", [zero, b]), mod)
    floor = fe.math("floor", [div])
    floor = bld.select(bld.fcmp_ordered(">", bld.fsub(div, floor), half), bld.fadd(floor, one), floor)
    quot = bld.select(bld.fcmp_ordered("==", div, zero), fe.math("copysign", [zero, bld.fdiv(a, b)]),
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
        return fe.b.call(fe.intrinsic(f"llvm.{name}.i{a.type.width}", a.type, [a.type, a.type]), [a, b])
    return rule


_BINOP = {
    ("add", "f"): lambda fe, a, b: fe.b.fadd(a, b, flags=FAST),
    ("sub", "f"): lambda fe, a, b: fe.b.fsub(a, b, flags=FAST),
    ("mul", "f"): lambda fe, a, b: fe.b.fmul(a, b, flags=FAST),
    ("div", "f"): lambda fe, a, b: fe.b.fdiv(a, b, flags=FAST),
    ("floordiv", "f"): lambda fe, a, b: _float_divmod(fe, a, b)[0],
    ("mod", "f"): lambda fe, a, b: _float_divmod(fe, a, b)[1],
    ("max", "f"): lambda fe, a, b: fe.math("max", [a, b]),
    ("min", "f"): lambda fe, a, b: fe.math("min", [a, b]),
    ("pow", "f"): lambda fe, a, b: fe.math("pow", [a, b]),
    ("add", "i"): lambda fe, a, b: fe.b.add(a, b),
    ("sub", "i"): lambda fe, a, b: fe.b.sub(a, b),
    ("mul", "i"): lambda fe, a, b: fe.b.mul(a, b),
    ("floordiv", "i"): lambda fe, a, b: _int_divmod(fe, a, b)[0],
    ("mod", "i"): lambda fe, a, b: _int_divmod(fe, a, b)[1],
    ("max", "i"): _int_minmax("smax"),
    ("min", "i"): _int_minmax("smin"),
}

_CMP_SYMBOL = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _cmp(fe, e, a, b):
    sym, kind = _CMP_SYMBOL[e.op], _kind(e.a.dtype)
    if kind == "f":     # numpy: every comparison with NaN is false except !=
        return fe.b.fcmp_unordered(sym, a, b) if e.op == "ne" else fe.b.fcmp_ordered(sym, a, b)
    return (fe.b.icmp_signed if kind == "i" else fe.b.icmp_unsigned)(sym, a, b)


def _sigmoid(fe, x):
    one = ir.Constant(x.type, 1.0)
    exp = fe.math("exp", [fe.b.fneg(x, flags=FAST)])
    return fe.b.fdiv(one, fe.b.fadd(one, exp, flags=FAST), flags=FAST)


def _int_abs(fe, x):
    fn = fe.intrinsic(f"llvm.abs.i{x.type.width}", x.type, [x.type, I1])
    return fe.b.call(fn, [x, ir.Constant(I1, 0)])


_UNARY = {
    ("neg", "f"): lambda fe, x: fe.b.fneg(x, flags=FAST),
    ("neg", "i"): lambda fe, x: fe.b.sub(ir.Constant(x.type, 0), x),
    ("abs", "i"): _int_abs,
    ("sigmoid", "f"): _sigmoid,
    **{(op, "f"): (lambda op: lambda fe, x: fe.math(op, [x]))(op)
       for op in ("exp", "log", "log1p", "sqrt", "tanh", "sin", "cos", "abs")},
}


def _cast_int_float(fe, x, to):
    return fe.b.sitofp(x, to)


def _cast_float_int(fe, x, to):     # truncates toward zero, saturating instead of UB
    src = "f32" if x.type == VALUE_TYPE["float32"] else "f64"
    return fe.b.call(fe.intrinsic(f"llvm.fptosi.sat.i{to.width}.{src}", to, [x.type]), [x])


def _cast_int_int(fe, x, to):
    if x.type.width == to.width:
        return x
    return fe.b.sext(x, to) if x.type.width < to.width else fe.b.trunc(x, to)


def _cast_float_float(fe, x, to):
    if x.type == to:
        return x
    return fe.b.fpext(x, to) if isinstance(to, ir.DoubleType) else fe.b.fptrunc(x, to)


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
    BinOp: lambda fe, e, v: _BINOP[(e.op, _kind(e.dtype))](fe, v[0], v[1]),
    Cmp: lambda fe, e, v: _cmp(fe, e, v[0], v[1]),
    Logic: _logic,
    Unary: lambda fe, e, v: _UNARY[(e.op, _kind(e.dtype))](fe, v[0]),
    Select: lambda fe, e, v: fe.b.select(v[0], v[1], v[2]),
    Cast: lambda fe, e, v: _CAST[(_kind(e.a.dtype), _kind(e.to))](fe, v[0], VALUE_TYPE[e.to]),
    BufLoad: lambda fe, e, v: fe.load(e.buffer, v[0]),
    Local: lambda fe, e, v: fe.b.load(fe.locals[e], typ=VALUE_TYPE[e.dtype]),
}


# ----------------------------------------------------------------- functions


class _FunctionEmitter:
    """Emits one stage's body function."""

    def __init__(self, module: ir.Module, stage: Stage, name: str):
        self.module = module
        self.buffers = _buffers_of(stage)
        args = [PTR] * len(self.buffers) + [I64, I64, PTR]
        self.fn = ir.Function(module, ir.FunctionType(ir.VoidType(), args), name=name)
        self.fn.linkage = "internal"
        self.fn.attributes.add("alwaysinline")
        self.fn.attributes.add("nounwind")
        for arg, buf in zip(self.fn.args, self.buffers):
            arg.add_attribute("noalias")
            arg.attributes.dereferenceable = buf.nbytes
            if buf.kind != "input":
                arg.attributes.align = 64
        self.ptr = dict(zip(self.buffers, self.fn.args))
        *_, self.lo, self.hi, self.err = self.fn.args
        entry = self.fn.append_basic_block("entry")
        body = self.fn.append_basic_block("body")
        self.alloca = ir.IRBuilder(entry)
        self.b = ir.IRBuilder(body)
        self.scopes = [{}]          # memo: loop IR expression -> value, per block
        self.uses_local = {}
        self.locals = {}
        self.access_group = None
        self.stmt(stage.body)
        self.b.ret_void()
        self.alloca.branch(body)

    # ------------------------------------------------------------ helpers

    def intrinsic(self, name, ret, args):
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, args), name=name)
        return fn

    def math(self, op, args):
        t = args[0].type
        name = MATH_FUNCTIONS[op][0 if t == VALUE_TYPE["float32"] else 1]
        return self.b.call(self.intrinsic(name, t, [t] * len(args)), args, fastmath=())

    def _tag(self, instr):
        if self.access_group is not None:
            instr.set_metadata("llvm.access.group", self.access_group)
        return instr

    def _address(self, buf, index):
        return self.b.gep(self.ptr[buf], [index], inbounds=True, source_etype=MEMORY_TYPE[buf.dtype])

    def load(self, buf, index):
        t = MEMORY_TYPE[buf.dtype]
        value = self._tag(self.b.load(self._address(buf, index), typ=t, align=_align(buf)))
        return self.b.icmp_unsigned("!=", value, ir.Constant(I8, 0)) if buf.dtype == "bool" else value

    def _lookup(self, e, local_memo):
        if e in local_memo:
            return local_memo[e]
        for scope in reversed(self.scopes):
            if e in scope:
                return scope[e]
        return None

    def expr(self, e):
        """The value of a loop IR expression; each distinct node once per block
        (nodes that read locals only once per statement: locals change)."""
        local_memo = {}
        stack = [(e, False)]
        while stack:
            node, ready = stack.pop()
            if self._lookup(node, local_memo) is not None:
                continue
            kids = children(node)
            if not ready:
                stack.append((node, True))
                stack += [(k, False) for k in kids]
                continue
            value = _EXPR[type(node)](self, node, [self._lookup(k, local_memo) for k in kids])
            uses_local = isinstance(node, Local) or any(self.uses_local.get(k, False) for k in kids)
            self.uses_local[node] = uses_local
            (local_memo if uses_local else self.scopes[-1])[node] = value
        return self._lookup(e, local_memo)

    def block(self, stmt, bindings=None):
        self.scopes.append(dict(bindings or {}))
        self.stmt(stmt)
        self.scopes.pop()

    # --------------------------------------------------------- statements

    def stmt(self, s):
        _STMT[type(s)](self, s)

    def for_(self, s: For):
        lo = self.expr(s.lo)
        hi = self.b.add(lo, self.expr(s.extent))
        if s.kind == "parallel":        # this call runs the chunk [lo, hi) of the root loop
            lo = self.b.call(self.intrinsic("llvm.smax.i64", I64, [I64, I64]), [lo, self.lo])
            hi = self.b.call(self.intrinsic("llvm.smin.i64", I64, [I64, I64]), [hi, self.hi])
        pre = self.b.block
        body = self.fn.append_basic_block(f"{s.var.name}.loop")
        done = self.fn.append_basic_block(f"{s.var.name}.done")
        self.b.cbranch(self.b.icmp_signed("<", lo, hi), body, done)
        self.b.position_at_end(body)
        iv = self.b.phi(I64, name=s.var.name)
        iv.add_incoming(lo, pre)
        outer_group = self.access_group
        if s.kind == "vectorize":
            self.access_group = _distinct(self.module)
        self.block(s.body, {s.var: iv})
        nxt = self.b.add(iv, ir.Constant(I64, 1))
        iv.add_incoming(nxt, self.b.block)
        latch = self.b.cbranch(self.b.icmp_signed("<", nxt, hi), body, done)
        if s.kind == "vectorize":
            parallel = self.module.add_metadata(
                [ir.MetaDataString(self.module, "llvm.loop.parallel_accesses"), self.access_group])
            loop_id = _distinct(self.module)
            loop_id.operands = (loop_id, parallel)
            latch.set_metadata("llvm.loop", loop_id)
        self.access_group = outer_group
        self.b.position_at_end(done)

    def store(self, s: Store):
        value = self.expr(s.value)
        index = self.expr(s.index)
        if s.buffer.dtype == "bool":
            value = self.b.zext(value, I8)
        self._tag(self.b.store(value, self._address(s.buffer, index), align=_align(s.buffer)))

    def alloc(self, s: Alloc):
        self.locals[s.local] = self.alloca.alloca(VALUE_TYPE[s.local.dtype], name=s.local.name)
        if s.init is not None:
            self.b.store(self.expr(s.init), self.locals[s.local])

    def assign(self, s: Assign):
        self.b.store(self.expr(s.value), self.locals[s.local])

    def if_(self, s: If):
        cond = self.expr(s.cond)
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
        ok = self.b.icmp_unsigned("<", index, ir.Constant(I64, s.extent))
        fail = self.fn.append_basic_block("out_of_bounds")
        cont = self.fn.append_basic_block("in_bounds")
        self.b.cbranch(ok, cont, fail)
        self.b.position_at_end(fail)
        self.b.store(ir.Constant(I64, s.code), self.err)
        self.b.store(index, self.b.gep(self.err, [ir.Constant(I64, 1)], source_etype=I64))
        self.b.ret_void()
        self.b.position_at_end(cont)


_STMT = {
    Block: lambda fe, s: [fe.stmt(x) for x in s.stmts],
    For: _FunctionEmitter.for_,
    Store: _FunctionEmitter.store,
    Alloc: _FunctionEmitter.alloc,
    Assign: _FunctionEmitter.assign,
    If: _FunctionEmitter.if_,
    Check: _FunctionEmitter.check,
}


_ITEMSIZE = {"bool": 1, "int32": 4, "int64": 8, "float32": 4, "float64": 8}


def _align(buf) -> int:
    """Element alignment (inputs may be any numpy array, so no more is promised)."""
    return _ITEMSIZE[buf.dtype]


def _buffers_of(stage: Stage) -> list:
    """The buffers a stage reads or writes, in first-use order."""
    seen = {stage.buffer: None}
    visited = set()
    for s in walk(stage.body):
        stack = list(stmt_exprs(s))
        while stack:
            e = stack.pop()
            if e in visited:
                continue
            visited.add(e)
            if isinstance(e, BufLoad):
                seen.setdefault(e.buffer, None)
            stack += children(e)
    return list(seen)


def stage_symbol(n: int) -> str:
    return f"stage{n}"


def emit_module(program: Program, triple: str = "", data_layout: str = "") -> ir.Module:
    """An LLVM module with one entry point ``stageN`` per stage of ``program``."""
    module = ir.Module(name=program.name)
    module.triple, module.data_layout = triple, data_layout
    index = {buf: k for k, buf in enumerate(program.buffers)}
    for n, stage in enumerate(program.stages):
        body = _FunctionEmitter(module, stage, stage_symbol(n) + ".body")
        entry = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64, PTR]),
                            name=stage_symbol(n))
        table, lo, hi, err = entry.args
        for arg in (table, err):
            arg.add_attribute("noalias")
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        ptrs = [b.load(b.gep(table, [ir.Constant(I64, index[buf])], source_etype=PTR), typ=PTR)
                for buf in body.buffers]
        b.call(body.fn, ptrs + [lo, hi, err])
        b.ret_void()
    return module
