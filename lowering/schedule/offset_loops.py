"""Offset loops: a reduction loop ``for x in max(L, e)..min(U, e + D - 1) + 1``
whose bounds read output variables (zero elimination leaves such bounds on
the gradients of convolutions) becomes ``for d in 0..D: x = e + d; if L <= x
<= U: ...``: the bounds no longer depend on the output position, so the
loop can be vectorised and jammed across outputs, and the test becomes a
guard (``selects.py``).  So does a loop with affine bounds a constant
span apart, ``for a in g v..g v + g`` (grouped heads' sum in the gradient
of ``V[a // g]``), without a test: a loop bound that reads an output
variable keeps a product's operand from its packed panels.  The rule rewrites the element body loop by loop,
inner loops first, deciding at each (:func:`decide`)."""
from __future__ import annotations

from dataclasses import dataclass

from te_autodiff.expr import BinOp, Const, add, compare, sub, var

from ..loop_ir import Block, For, If, linear_form, map_loops, rename, simplify_index
from .constructors import as_block, conjunction, idx
from .nest import Nest, depends


@dataclass(frozen=True)
class Offsets:
    """The loop runs ``x = first + d`` for ``d`` in ``0..span``, where ``x >=
    lows`` and ``x < highs`` (constants)."""

    first: object
    span: int
    lows: tuple
    highs: tuple


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


def decide(loop: For, outer: set):
    """The :class:`Offsets` of ``loop`` when its bounds read the output
    variables ``outer`` and have the form above, or are affine with a
    constant span (a group of heads, ``for a in 2 g..2 g + 2``); None
    otherwise."""
    if not depends((loop.lo, loop.extent), outer):
        return None
    lows, lo_rest = _bound_terms(loop.lo, "max")
    hi = add(loop.lo, loop.extent)
    hi_form = linear_form(hi)
    if len(lo_rest) != 1 or hi_form is None:
        return None
    mins = [a for a in hi_form[0] if isinstance(a, BinOp) and a.op == "min"]
    highs, last = (), hi                                                 # x in [first, last)
    if mins:
        if len(hi_form[0]) != 1 or hi_form[0][mins[0]] != 1:
            return None
        highs, hi_rest = _bound_terms(mins[0], "min")
        if len(hi_rest) != 1:
            return None
        highs, last = tuple(v + hi_form[1] for v in highs), add(hi_rest[0], idx(hi_form[1]))
    first = lo_rest[0]
    span = linear_form(sub(last, first))
    if span is None or span[0] or span[1] <= 0 or linear_form(first) is None:
        return None
    return Offsets(first, span[1], tuple(lows), highs)


def _offset_loop(loop: For, body, plan: Offsets) -> For:
    """``loop`` (its ``body`` rewritten already) over the offsets of ``plan``."""
    d = var(f"{loop.var.name}.d")
    x = simplify_index(add(plan.first, d))
    conds = [compare("ge", x, idx(v)) for v in plan.lows] + [compare("lt", x, idx(v)) for v in plan.highs]
    body = rename(body, {loop.var: x})
    if conds:
        body = Block((If(conjunction(conds), as_block(body)),))
    return For(d, idx(0), idx(plan.span), body, loop.kind)


def _rewrite(s, outer: set):
    def loop(lp: For):
        body = map_loops(lp.body, loop)
        plan = decide(lp, outer)
        return For(lp.var, lp.lo, lp.extent, body, lp.kind) if plan is None else _offset_loop(lp, body, plan)
    return map_loops(s, loop)


def build(nest: Nest) -> Nest:
    """``nest`` with every loop of its element body that :func:`decide` takes
    over offsets."""
    return Nest(nest.loops, _rewrite(nest.body, set(nest.vars)))
