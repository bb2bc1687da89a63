"""Rule 2, offset loops: a reduction loop whose bounds read output variables
(zero elimination leaves them on the gradients of convolutions) becomes a
loop over offsets with bounds independent of the element, and a test."""
from __future__ import annotations

from te_autodiff.expr import BinOp, Const, add, compare, sub, var

from ..loop_ir import Block, For, If, linear_form, rename, simplify_index
from .ir import as_block, conjunction, idx
from .nest import depends


def _bound_terms(e, op):
    """``e`` as the ``op`` (max or min) of its operands: (constants, others)."""
    stack, consts, others = [e], [], []
    while stack:
        x = stack.pop()
        if isinstance(x, BinOp) and x.op == op:
            stack += [x.a, x.b]
        elif isinstance(x, Const):
            consts.append(x.value)
        else:
            others.append(x)
    return consts, others


def offset_loops(s, outer: set):
    """Rewrite a loop ``for x in max(L, e)..min(U, e + D - 1) + 1`` whose bounds
    read output variables (zero elimination leaves such bounds on transposed
    convolutions) as ``for d in 0..D: x = e + d; if L <= x <= U: ...``: the
    bounds no longer depend on the output position, so the loop can be
    vectorised and jammed across outputs, and the test becomes a guard."""
    if isinstance(s, Block):
        return Block(tuple(offset_loops(x, outer) for x in s.stmts))
    if isinstance(s, If):
        return If(s.cond, offset_loops(s.then, outer),
                  None if s.else_ is None else offset_loops(s.else_, outer))
    if not isinstance(s, For):
        return s
    body = offset_loops(s.body, outer)
    if not depends((s.lo, s.extent), outer):
        return For(s.var, s.lo, s.extent, body, s.kind)
    lows, lo_rest = _bound_terms(s.lo, "max")
    hi_form = linear_form(add(s.lo, s.extent))
    if len(lo_rest) != 1 or hi_form is None or len(hi_form[0]) != 1:
        return For(s.var, s.lo, s.extent, body, s.kind)
    (hi_atom, k), = hi_form[0].items()
    highs, hi_rest = _bound_terms(hi_atom, "min")
    if k != 1 or len(hi_rest) != 1:
        return For(s.var, s.lo, s.extent, body, s.kind)
    first, last = lo_rest[0], add(hi_rest[0], idx(hi_form[1]))       # x in [first, last)
    span = linear_form(sub(last, first))
    if span is None or span[0] or span[1] <= 0 or linear_form(first) is None:
        return For(s.var, s.lo, s.extent, body, s.kind)
    d = var(f"{s.var.name}.d")
    x = simplify_index(add(first, d))
    conds = [compare("ge", x, idx(v)) for v in lows] + \
            [compare("lt", x, idx(v + hi_form[1])) for v in highs]
    body = rename(body, {s.var: x})
    if conds:
        body = Block((If(conjunction(conds), as_block(body)),))
    return For(d, idx(0), idx(span[1]), body, s.kind)
