"""The derivative rules, one per node kind, and reverse mode over a scalar DAG.

``RULES[kind](node, g)`` returns, for adjoint ``g`` of ``node``, the adjoint
contribution of each child.  Rules refer to ``node`` itself where the
derivative is a function of the result (``d exp(u) = exp(u) du``,
``d tanh(u) = (1 - t*t) du`` with ``t`` the tanh node): hash-consing makes
that a reference to the shared primal value, not a copy.

:func:`load_adjoints` runs reverse mode over a reduction-free expression
(see ``lift.py``) and returns the adjoint of every tensor read in it.
Integer and boolean sub-expressions carry no derivative; ``max``/``min`` and
selects send the adjoint to the chosen operand (the first one on ties).  The
contributions a node receives are summed with their common factor taken out
(:func:`factored_sum`).
"""
from __future__ import annotations

import heapq
import itertools
import weakref
from collections import Counter

from . import dtype as dt
from .expr import (BinOp, Cast, Const, Load, Reduce, Select, Unary, all_, cast, compare, const, is_const,
                   logic_and, logic_not, select)
from .ops import OPS
from .visit import children, conjuncts, topo_order


def _zero(like):
    return const(0, like.dtype)


def _pick(cond, g):
    """``g`` where ``cond`` holds, else 0."""
    return select(cond, g, _zero(g))


# each operator's rule is in the table (ops.py); the other node kinds' here
RULES = {
    BinOp: lambda e, g: OPS[e.op].derivative(e, g),
    Unary: lambda e, g: OPS[e.op].derivative(e, g),
    # the else branch's adjoint is a guard too (``select(not c, g, 0)``, not
    # ``select(c, 0, g)``): peeled, it stays outermost around the factors the
    # rules below multiply it with and around the head, so a non-finite value
    # there does not meet its 0 where the branch is not taken
    Select: lambda e, g: (None, _pick(e.cond, g), _pick(logic_not(e.cond), g)),
    Cast: lambda e, g: (cast(e.a.dtype, g),),
}


def peel_guards(g):
    """``(c, g')`` with ``g == select(c, g', 0)``, or ``(None, g)``."""
    conds = []
    while isinstance(g, Select) and is_const(g.b, 0):
        conds.append(g.cond)
        g = g.a
    return (all_(*conds) if conds else None), g


def differentiable(e) -> bool:
    """Only float-valued nodes carry derivatives."""
    return dt.is_float(e.dtype)


def load_adjoints(root, seed, wanted, cut=frozenset()) -> dict:
    """Reverse mode on the reduction-free DAG ``root`` with adjoint ``seed``.

    Returns ``{load_node: adjoint}`` for every read of a tensor in ``wanted``
    that the result depends on (each distinct read once; a tensor read at two
    different indices gives two entries).  Nothing flows along the edges in
    ``cut`` (``(node, k)``: ``node``'s child ``k``; see ``shift_invariance.py``).
    """
    order = topo_order([root])
    # active: the nodes through which a wanted float tensor influences root
    active = set()
    for node in order:
        if isinstance(node, Load):
            if node.tensor in wanted and differentiable(node):
                active.add(node)
        elif differentiable(node) and any(c in active for c in children(node)):
            active.add(node)
    if root not in active:
        return {}
    adj = {root: seed}
    out = {}
    for node in reversed(order):
        g = adj.pop(node, None)
        if g is None or is_const(g, 0):
            continue
        if isinstance(node, Load):
            out[node] = g
            continue
        rule = RULES.get(type(node))
        if rule is None:
            continue
        # a guarded adjoint select(c, g', 0) keeps its guard around whatever the
        # rule multiplies it with: the factors may read out of range where c fails
        guard, g = peel_guards(g)
        for k, (child, contrib) in enumerate(zip(children(node), rule(node, g))):
            if contrib is None or child not in active or (node, k) in cut:
                continue
            if guard is not None:
                contrib = select(guard, contrib, _zero(contrib))
            prev = adj.get(child)
            adj[child] = contrib if prev is None else _add_guarded(prev, contrib)
    return out


def _conditions(g):
    """``(conjuncts, g')`` with ``g == select(all(conjuncts), g', 0)``."""
    conds = []
    while isinstance(g, Select) and is_const(g.b, 0):
        conds.append(g.cond)
        g = g.a
    return conjuncts(conds), g


def _add_guarded(a, b):
    """``a + b`` with the guard conjuncts both adjoints share kept outermost:
    ``select(c and p, x, 0) + select(c and q, y, 0) = select(c, select(p, x,
    0) + select(q, y, 0), 0)``, so that the rules applied to the sum still
    see ``c`` (their factors may read out of range where it fails)."""
    ca, xa = _conditions(a)
    cb, xb = _conditions(b)
    common = [c for c in ca if c in cb]
    if not common:
        return factored_sum(a, b)

    def rest(conds, x):
        others = [c for c in conds if c not in common]
        return select(all_(*others), x, _zero(x)) if others else x
    total = factored_sum(rest(ca, xa), rest(cb, xb))
    return select(all_(*common), total, _zero(total))


_OPENED = 64     # steps a sum takes to open an operand whole, openings past that (see _split)
_HEIGHT = weakref.WeakKeyDictionary()     # node -> 1 + the height of its highest child


def _height(e) -> int:
    if e not in _HEIGHT:
        for node in topo_order([e], lambda n: [c for c in children(n) if c not in _HEIGHT]):
            _HEIGHT[node] = 1 + max((_HEIGHT[c] for c in children(node)), default=0)
    return _HEIGHT[e]


def _opens(f) -> bool:
    """Whether ``f`` is a product, a negation or a number (a factor that opens)."""
    return (isinstance(f, Const) or isinstance(f, Unary) and f.op == "neg"
            or isinstance(f, BinOp) and f.op == "mul" and f.a.dtype == f.b.dtype == f.dtype)


def _split(a, b):
    """``(ka, fa, kb, fb)`` with ``a == ka * fa[0] * fa[1] * ...`` and ``b`` alike:
    ``k`` a number, ``f`` factors, left to right, of the products and
    negations ``a`` and ``b`` are made of (not through a product that
    converts its operands' dtype).  Both are opened whole when that takes
    at most ``_OPENED`` steps each: opened partway, one side's factor
    could stay whole where the other side's is opened, and the factor
    they share would be missed (the chain of :func:`factored_sum`'s
    docstring grows instead of shrinking).
    Larger ones open highest first, keeping whole a product that is a
    factor of both: a factor hidden in a product of the other side is found
    (the product is higher), and in a chain of adjoints, where each
    contribution is the consumer's adjoint times a local derivative, that
    adjoint (a product of every adjoint above it) is shared whole; opened,
    a chain of ``n`` levels would cost ``n²``."""
    opened = [_products(a), _products(b)]
    if None in opened:
        opened = _highest_first(a, b)
    (ka, fa), (kb, fb) = _factors(a, opened[0]), _factors(b, opened[1])
    common = set(fa) & set(fb)
    if common:      # a product with no common factor inside stays whole: the rest reuses it
        (ka, fa), (kb, fb) = (_factors(e, _around(e, o, common)) for e, o in ((a, opened[0]), (b, opened[1])))
    return ka, fa, kb, fb


def _around(e, opened: set, common: set) -> set:
    """The nodes of ``opened`` (products of ``e``) with a factor in ``common``
    below them, and its numbers (they fold into ``k``)."""
    keep = set()
    for node in topo_order([e], lambda n: children(n) if n in opened else ()):
        if node in opened and (isinstance(node, Const) or any(c in common or c in keep for c in children(node))):
            keep.add(node)
    return keep


def _products(e):
    """The products, negations and numbers ``e`` is made of, or ``None`` when
    that takes more than ``_OPENED`` steps (counting repeats)."""
    out, stack = set(), [e]
    for _ in range(_OPENED):
        if not stack:
            return out
        f = stack.pop()
        if _opens(f):
            out.add(f)
            stack += children(f)
    return out if not stack else None


def _highest_first(a, b):
    """The products to open of ``a`` and ``b`` (:func:`_split`): highest first,
    not one that is a factor of both, ``_OPENED`` openings in all (counting
    repeats)."""
    counts, opened = [Counter([a]), Counter([b])], [set(), set()]
    heap, tie, budget = [], itertools.count(), _OPENED
    for side, e in ((0, a), (1, b)):
        heapq.heappush(heap, (-_height(e), next(tie), side, e))
    while heap and budget > 0:
        _, _, side, f = heapq.heappop(heap)
        if not counts[side][f] or counts[1 - side][f] or not _opens(f):
            continue
        opened[side].add(f)
        n = counts[side].pop(f)
        budget -= n
        for c in children(f):
            counts[side][c] += n
            heapq.heappush(heap, (-_height(c), next(tie), side, c))
    return opened


def _factors(e, opened: set):
    """``(k, fs)``: ``e`` opened at the nodes in ``opened``, factors left to right."""
    k, fs, stack = 1, [], [e]
    while stack:
        e = stack.pop()
        if e not in opened:
            fs.append(e)
        elif isinstance(e, Const):
            k *= e.value
        elif isinstance(e, Unary):
            k, stack = -k, stack + [e.a]
        else:
            stack += [e.b, e.a]
    return k, fs


def _product(k, fs, dtype):
    out = const(k, dtype)
    for f in fs:
        out = out * f
    return out


def factored_sum(a, b):
    """``a + b`` with the factors both products share taken out once:
    ``g·u·x + -(g·u·y) = g·u·(x - y)``.  Reverse mode sums the contributions
    of a node's uses, each the adjoint of a use times its local derivative,
    and the uses' adjoints share their consumers' adjoints: for
    ``tanh(sigmoid(x)·exp(-x·x))`` the three terms of ``dx`` all carry
    ``(1 - y²)·s·e``, so the factored sum is the gradient a person writes
    (``(1 - y²)·s·e·((1 - s) - 2x)``), with fewer operations and fewer
    values alive at once (``lowering/fuse.py`` then computes ``s`` and
    ``e`` once).  The sum is reassociated (the compiled code is anyway);
    constants are folded (``-p + -p = -2p``).  The plain sum is kept where
    the factored one would take more operations (a product reusing a
    sub-product, ``m·m``).  Small operands open whole, large ones down to
    the factors they share (:func:`_split`): opening every product would
    take time growing with the square of a chain's depth."""
    if a.dtype != b.dtype or not dt.is_float(a.dtype):
        return a + b
    ka, fa, kb, fb = _split(a, b)
    ca, cb = Counter(fa), Counter(fb)
    common = ca & cb
    if not common:
        return a + b
    shared, left = [], Counter(common)
    for f in fa:
        if left[f]:
            left[f] -= 1
            shared.append(f)
    rest_a = _product(ka, list((ca - common).elements()), a.dtype)
    rest_b = _product(kb, list((cb - common).elements()), a.dtype)
    out = _product(1, shared, a.dtype) * (rest_a + rest_b)
    free = _computed_anyway(set(fa) | set(fb))
    return out if _operations([out], free) <= _operations([a, b], free) + 1 else a + b


def _computed_anyway(factors: set, most: int = 256) -> set:
    """The nodes both forms of a sum compute: the factors and everything inside
    them, or only the factors past ``most`` nodes (a chain's adjoints: then a
    node inside a factor that is also used outside it counts as an extra
    operation of the plain sum)."""
    seen, stack = set(), list(factors)
    while stack:
        e = stack.pop()
        if e not in seen:
            seen.add(e)
            if len(seen) > most:
                return factors
            stack += children(e)
    return seen


def _operations(roots, leaves: set) -> int:
    """The distinct operations computing ``roots`` from ``leaves``."""
    seen, stack = set(), [r for r in roots if r not in leaves]
    while stack:
        e = stack.pop()
        if e not in seen:
            seen.add(e)
            stack += [c for c in children(e) if c not in leaves]
    return sum(isinstance(e, (BinOp, Unary)) for e in seen)


# ------------------------------------------------------------ reductions
#
# A top-level reduction T[i] = op_k g(i, k) passes its adjoint to each g(i, k)
# times the seed below.  Seeds read sibling tensors (the argmax, the product
# of the non-zero factors...) instead of recomputing a reduction per element.


def _sibling(t, suffix: str, op: str, body, dtype=None):
    """A tensor over ``t``'s shape: ``op`` over ``t``'s reduce axes of ``body``."""
    from .tensor import Tensor
    from .term import fresh_copy
    from .visit import substitute
    r = t.body
    rename = fresh_copy(t.axes)
    red = substitute(Reduce(op, body, r.axes, r.doms), rename)
    return Tensor(f"{t.name}.{suffix}", t.shape, dtype or red.dtype, tuple(rename[a] for a in t.axes), red)


def _position(r):
    """Row-major position of the reduce axes of ``r`` within its domain (0-based)."""
    pos = const(0, dt.INDEX)
    for ax, (lo, ext) in zip(r.axes, r.doms):
        pos = pos * ext + (ax - lo)
    return pos


def _seed_sum(t, here):
    return const(1, t.dtype)


NO_POSITION = 1 << 62   # beyond every position: where a row never reaches its extremum (NaN)
POSITIONS: "weakref.WeakSet" = weakref.WeakSet()    # the tensors of first positions (argmax)


def _seed_extremum(t, here):
    # the derivative follows the first position where the body reaches the
    # extremum ``t`` holds: a min reduction of positions over ``t``'s own
    # value (a second pass that runs in vector lanes, like ``t``), rather
    # than an argmax that tracks the best value and its position together.
    # The positions are in the index type; lowering may narrow them for
    # its vector lanes (``lowering/positions.py``), which POSITIONS lets it find.
    r = t.body
    first = _cached(t, "argmax", lambda: _position_tensor(_sibling(t, "argmax", "min", select(
        compare("eq", r.body, t[tuple(t.axes)]), _position(r), const(NO_POSITION, dt.INDEX)))))
    return select(compare("eq", _position(r), first[here]), const(1, t.dtype), const(0, t.dtype))


def _position_tensor(p):
    POSITIONS.add(p)
    return p


def _seed_prod(t, here):
    # d/dg_k prod_k' g_k' = prod_{k' != k} g_k', right with zeros: with z zero
    # factors and P the product of the non-zero ones it is P / g_k when z = 0,
    # P at the zero factor when z = 1, and 0 otherwise.
    g = t.body.body
    is0 = compare("eq", g, 0)
    nz = _cached(t, "nonzero_prod", lambda: _sibling(t, "nzprod", "prod", select(is0, const(1, g.dtype), g)))
    zc = _cached(t, "zero_count", lambda: _sibling(t, "zeros", "sum", select(is0, const(1, "int32"),
                                                                              const(0, "int32"))))
    p, z = nz[here], zc[here]
    one_zero = select(logic_and(compare("eq", z, 1), is0), p, const(0, g.dtype))
    return select(compare("eq", z, 0), p / g, one_zero)


REDUCE_SEEDS = {"sum": _seed_sum, "max": _seed_extremum, "min": _seed_extremum, "prod": _seed_prod}

_SIBLINGS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _cached(t, key, make):
    """One sibling tensor per (tensor, kind), so all consumers share it."""
    table = _SIBLINGS.setdefault(t, {})
    if key not in table:
        table[key] = make()
    return table[key]


def reduction_seed(t):
    """The adjoint factor of the body of ``t``'s top-level reduction."""
    return REDUCE_SEEDS[t.body.op](t, tuple(t.axes))
