"""Argmax positions: the integer type of the first positions a max or min
reduction's gradient tracks (``te_autodiff.derivative.POSITIONS``: a min
reduction of positions, read only by equality tests with a position).

The derivative writes them in the index type; here, before lowering, a row
of at least ``LANE_POSITIONS`` positions (a softmax row) gets int32 ones.
Such a row runs in vector lanes, where int32 positions fill twice the
lanes of int64 ones and targets before AVX-512 (AVX2, SSE, NEON) have no
vector int64 min.  A window of a few positions (a pooling window) is
unrolled into scalar selects, where int64 positions measured faster
(``benchmarks/README.md``): it keeps them.  The lane type is the code
generator's concern, not the derivative's; the rule is the same for every
target of the table, so it does not read the target."""
from __future__ import annotations

from math import prod

from te_autodiff.derivative import POSITIONS
from te_autodiff.expr import Cmp, Load, ScanState, cast, compare, const, is_const, select
from te_autodiff.graph import tensors_in_order
from te_autodiff.tensor import Tensor
from te_autodiff.visit import rewrite

LANE_POSITIONS = 64                 # a row of at least this many positions tracks them in int32
LANE_TYPE, NO_LANE_POSITION = "int32", 2 ** 31 - 1


def in_lanes(t: Tensor) -> bool:
    """Whether the positions of ``t`` (one of ``POSITIONS``) are narrowed to
    ``LANE_TYPE``: a row of constant extent, long enough to run in vector
    lanes, whose positions and "none" fit."""
    extents = [ext.value if is_const(ext) else None for _, ext in t.body.doms]
    return None not in extents and LANE_POSITIONS <= prod(extents) < NO_LANE_POSITION


def narrow(outputs, store, recompute) -> tuple:
    """``(outputs, store, recompute)`` with the positions :func:`in_lanes`
    says to narrow in ``LANE_TYPE``: those tensors and every tensor reading
    them, directly or not, are rebuilt (same names, shapes and dtypes; an
    equality with a narrowed position compares ``LANE_TYPE`` values).
    Unchanged when there are none, or when a tensor to rebuild is a scan
    (its steps keep index-typed positions)."""
    graph = tensors_in_order(outputs)
    narrowed = {t for t in graph if t in POSITIONS and in_lanes(t)}
    if not narrowed:
        return outputs, store, recompute
    new, lanes = {}, set()
    for t in graph:
        if t.body is None or t not in narrowed and not any(p in new for p in t.inputs):
            continue
        if isinstance(t.body, ScanState):
            return outputs, store, recompute
        new[t] = _rebuilt(t, new, lanes, t in narrowed)
        if t in narrowed:
            lanes.add(new[t])
    return _mapped(outputs, new), _mapped(store, new), _mapped(recompute, new)


def _mapped(tensors, new: dict):
    """``tensors`` (a tensor or a collection of them, as ``te.build`` takes
    them) with the rebuilt ones of ``new``; anything else as it is, for
    ``lower`` to refuse."""
    if isinstance(tensors, Tensor):
        return new.get(tensors, tensors)
    if isinstance(tensors, (list, tuple, set, frozenset)):
        return [new.get(t, t) if isinstance(t, Tensor) else t for t in tensors]
    return tensors


def _rebuilt(t: Tensor, new: dict, lanes: set, narrowed: bool) -> Tensor:
    """``t`` reading the rebuilt tensors of ``new`` (``lanes``: those holding
    ``LANE_TYPE`` positions); with its own positions (the reduction's
    ``select(found, position, none)``) in ``LANE_TYPE`` when ``narrowed``."""
    memo = {}
    choice = t.body.body if narrowed else None

    def fn(node, rebuilt):
        if isinstance(node, Load) and node.tensor in new:
            return Load(new[node.tensor], tuple(memo[i] for i in node.indices))
        if isinstance(node, Cmp) and node.op == "eq":
            a, b = memo[node.a], memo[node.b]
            if isinstance(b, Load) and b.tensor in lanes:
                return compare("eq", cast(LANE_TYPE, a), b)
            if isinstance(a, Load) and a.tensor in lanes:
                return compare("eq", a, cast(LANE_TYPE, b))
        if node is choice:
            return select(memo[node.cond], cast(LANE_TYPE, memo[node.a]), const(NO_LANE_POSITION, LANE_TYPE))
        return None

    body = rewrite([t.body], fn, memo)[0]
    return Tensor(t.name, t.shape, LANE_TYPE if narrowed else t.dtype, t.axes, body)
