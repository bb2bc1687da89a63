"""The operators of ``te_autodiff/ops.py`` as LLVM instructions: arithmetic
(``_INSTRUCTIONS``), numpy's floor division and remainder, integer powers,
comparisons, casts, and the table from expression node to emitter
(``EXPR``).  Each rule takes the function emitter ``fe`` and the operands'
values, scalars or vectors alike."""
from __future__ import annotations

from llvmlite import ir

from te_autodiff.expr import BinOp, Cast, Cmp, Const, Logic, Select, Unary, Var

from ..loop_ir import AlignGap, BufLoad, GuardedLoad, IntPower, LaneReduce, Local
from .llvm_types import I1, VALUE_TYPE, element_type, kind_of, mangle, shaped


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
    fn = fe.intrinsic(f"llvm.abs.{mangle(x.type)}", x.type, [x.type, I1])
    return fe.b.call(fn, [x, ir.Constant(I1, 0)])


def _int_sign(fe, x):
    zero = ir.Constant(x.type, 0)
    return fe.b.sub(fe.b.zext(fe.b.icmp_signed(">", x, zero), x.type),
                    fe.b.zext(fe.b.icmp_signed("<", x, zero), x.type))


# the operators of ops.py that are LLVM instructions, by (operator, kind of
# dtype); the others are math functions (_Emitter.math)
_INSTRUCTIONS = {
    ("add", "f"): lambda fe, a, b: fe.b.fadd(a, b, flags=fe.float_flags),
    ("sub", "f"): lambda fe, a, b: fe.b.fsub(a, b, flags=fe.float_flags),
    ("mul", "f"): lambda fe, a, b: fe.b.fmul(a, b, flags=fe.float_flags),
    ("div", "f"): lambda fe, a, b: fe.b.fdiv(a, b, flags=fe.float_flags),
    ("floordiv", "f"): lambda fe, a, b: _float_divmod(fe, a, b)[0],
    ("mod", "f"): lambda fe, a, b: _float_divmod(fe, a, b)[1],
    ("add", "i"): lambda fe, a, b: fe.b.add(a, b),
    ("sub", "i"): lambda fe, a, b: fe.b.sub(a, b),
    ("mul", "i"): lambda fe, a, b: fe.b.mul(a, b),
    ("floordiv", "i"): lambda fe, a, b: _int_divmod(fe, a, b)[0],
    ("mod", "i"): lambda fe, a, b: _int_divmod(fe, a, b)[1],
    ("max", "i"): _int_minmax("smax"),
    ("min", "i"): _int_minmax("smin"),
    ("neg", "f"): lambda fe, x: fe.b.fneg(x, flags=fe.float_flags),
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
    wide = shaped(VALUE_TYPE["float64"], x)
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
        on = b.trunc(b.lshr(m, ir.Constant(m.type, bit)) if bit else m, shaped(I1, m))
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


def apply_operator(fe, op: str, kind: str, args):
    """Operator ``op`` of ops.py on ``args`` of the kind of dtype ``kind``."""
    rule = _INSTRUCTIONS.get((op, kind))
    return fe.math(op, args) if rule is None else rule(fe, *args)


CMP_SYMBOL = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _cmp(fe, e, a, b):
    sym, kind = CMP_SYMBOL[e.op], kind_of(e.a.dtype)
    if kind == "f":     # numpy: every comparison with NaN is false except !=
        return fe.b.fcmp_unordered(sym, a, b) if e.op == "ne" else fe.b.fcmp_ordered(sym, a, b)
    return (fe.b.icmp_signed if kind == "i" else fe.b.icmp_unsigned)(sym, a, b)


def _cast_int_float(fe, x, to):
    return fe.b.sitofp(x, to)


def _cast_float_int(fe, x, to):     # truncates toward zero, saturating instead of UB
    name = f"llvm.fptosi.sat.{mangle(to)}.{mangle(x.type)}"
    return fe.b.call(fe.intrinsic(name, to, [x.type]), [x])


def _cast_int_int(fe, x, to):
    a, b = element_type(x.type).width, element_type(to).width
    if a == b:
        return x
    return fe.b.sext(x, to) if a < b else fe.b.trunc(x, to)


def _cast_float_float(fe, x, to):
    if x.type == to:
        return x
    return fe.b.fpext(x, to) if isinstance(element_type(to), ir.DoubleType) else fe.b.fptrunc(x, to)


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


EXPR = {
    Const: _const,
    Var: _unbound,
    BinOp: lambda fe, e, v: _power(fe, e, v) if e.op == "pow" else apply_operator(fe, e.op, kind_of(e.dtype), v),
    Cmp: lambda fe, e, v: _cmp(fe, e, v[0], v[1]),
    Logic: _logic,
    Unary: lambda fe, e, v: apply_operator(fe, e.op, kind_of(e.dtype), v),
    Select: lambda fe, e, v: fe.b.select(v[0], v[1], v[2]),
    Cast: lambda fe, e, v: _CAST[(kind_of(e.a.dtype), kind_of(e.to))](fe, v[0], shaped(VALUE_TYPE[e.to], v[0])),
    BufLoad: lambda fe, e, v: fe.load(e, v[0]),
    GuardedLoad: lambda fe, e, v: fe.load(e, v[0], v[1]),
    LaneReduce: lambda fe, e, v: fe.lane_reduce(e, v[0]),
    IntPower: _int_power,
    AlignGap: lambda fe, e, v: fe.align_gap(e),
    Local: lambda fe, e, v: fe.b.load(fe.locals[e], typ=fe.local_type[e]),
}
