"""Memoised traversal and rewriting of expression DAGs.

Expressions are hash-consed DAGs, so every pass visits each distinct node
once: :func:`topo_order` lists nodes children-first without recursion (deep
programs do not hit Python's recursion limit), :func:`rewrite` rebuilds a
DAG bottom-up with a memo table keyed on node identity, and
:func:`trampoline` runs a recursive pass that carries a context down without
recursion.
"""
from __future__ import annotations

from .expr import (BinOp, Cast, Cmp, Const, Expr, InverseIndex, Load, Logic, MatchSum, Reduce, Select, Unary, Var,
                   binop, cast, compare, logic_and, logic_not, logic_or, reduce, select, unary)


def children(e: Expr) -> tuple:
    """The direct sub-expressions of ``e`` (reduce domains before the body)."""
    if isinstance(e, (BinOp, Cmp)):
        return (e.a, e.b)
    if isinstance(e, Logic):
        return (e.a,) if e.b is None else (e.a, e.b)
    if isinstance(e, (Unary, Cast)):
        return (e.a,)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    if isinstance(e, Load):
        return e.indices
    if isinstance(e, Reduce):
        return tuple(x for dom in e.doms for x in dom) + (e.body,)
    if isinstance(e, InverseIndex):
        return (e.key, e.at)
    if isinstance(e, MatchSum):
        return (e.value, e.key, e.at)
    return ()


def eager_children(e: Expr) -> tuple:
    """The sub-expressions of ``e`` evaluated whenever ``e`` is: not a
    select's branches, the right operand of ``and``/``or`` or a reduction's
    body (each evaluated only where a condition holds)."""
    if isinstance(e, Select):
        return (e.cond,)
    if isinstance(e, Logic):
        return (e.a,)
    if isinstance(e, Reduce):
        return tuple(x for dom in e.doms for x in dom)
    return children(e)


def _logic(e, k):
    if e.op == "not":
        return logic_not(k[0])
    return (logic_and if e.op == "and" else logic_or)(k[0], k[1])


def _reduce(e, k):
    n = len(e.axes)
    doms = tuple((k[2 * t], k[2 * t + 1]) for t in range(n))
    return reduce(e.op, k[-1], e.axes, doms)


_REBUILD = {
    BinOp: lambda e, k: binop(e.op, k[0], k[1]),
    Cmp: lambda e, k: compare(e.op, k[0], k[1]),
    Logic: _logic,
    Unary: lambda e, k: unary(e.op, k[0]),
    Cast: lambda e, k: cast(e.to, k[0]),
    Select: lambda e, k: select(k[0], k[1], k[2]),
    Load: lambda e, k: Load(e.tensor, tuple(k)),
    Reduce: _reduce,
    InverseIndex: lambda e, k: InverseIndex(k[0], e.axes, e.doms, e.lo, e.count, k[1]),
    MatchSum: lambda e, k: MatchSum(k[0], k[1], e.axes, e.doms, e.lo, e.count, k[2]),
}


def rebuild(e: Expr, kids) -> Expr:
    """``e`` with its children replaced by ``kids`` (same order as :func:`children`),
    through the folding constructors; returns ``e`` itself when nothing changed."""
    old = children(e)
    if all(a is b for a, b in zip(old, kids)):
        return e
    return _REBUILD[type(e)](e, tuple(kids))


def topo_order(roots, kids=None) -> list:
    """All nodes reachable from ``roots`` through ``kids`` (default: the
    sub-expressions), each once, children before parents.  Iterative, so deep
    programs do not hit Python's recursion limit."""
    kids = children if kids is None else kids
    out, seen = [], set()
    stack = [(r, False) for r in reversed(list(roots))]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            out.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for c in reversed(tuple(kids(node))):
            if id(c) not in seen:
                stack.append((c, False))
    return out


def trampoline(fn, *args):
    """``fn(*args)`` for a recursive generator function ``fn``: where it would
    call itself it yields the call's arguments (a tuple) and receives the
    result; it returns its own.  The calls nest on a list instead of Python's
    stack, so a pass whose context changes on the way down (a scope, guards)
    handles expressions of any depth."""
    stack, value = [fn(*args)], None
    while stack:
        try:
            call = stack[-1].send(value)
        except StopIteration as done:
            stack.pop()
            value = done.value
            continue
        stack.append(fn(*call))
        value = None
    return value


def rewrite(roots, fn, memo=None):
    """Rebuild ``roots`` bottom-up.  ``fn(node, rebuilt)`` gets the original node
    and the node rebuilt from rewritten children; it returns the replacement or
    ``None`` to keep ``rebuilt``.  Returns a list matching ``roots``."""
    memo = {} if memo is None else memo
    for node in topo_order(roots):
        if node in memo:
            continue
        new = rebuild(node, [memo[c] for c in children(node)])
        out = fn(node, new)
        memo[node] = new if out is None else out
    return [memo[r] for r in roots]


def substitute(e: Expr, mapping: dict) -> Expr:
    """Replace variables (or any nodes) by expressions, everywhere in ``e``."""
    if not mapping:
        return e
    return rewrite([e], lambda node, new: mapping.get(node))[0]


def free_vars(e: Expr) -> set:
    """The variables of ``e`` not bound by a reduction inside it."""
    bound, used = set(), set()
    for node in topo_order([e]):
        if isinstance(node, Var):
            used.add(node)
        elif isinstance(node, (Reduce, InverseIndex, MatchSum)):
            bound.update(node.axes)
    return used - bound


def conjuncts(conds) -> list:
    """The conjuncts of the conditions ``conds``, in order (``a and b`` gives ``a``, ``b``)."""
    out, stack = [], list(reversed(conds))
    while stack:
        c = stack.pop()
        if isinstance(c, Logic) and c.op == "and":
            stack += [c.b, c.a]
        else:
            out.append(c)
    return out


def count_nodes(roots) -> int:
    """Number of distinct nodes (the DAG size)."""
    return len(topo_order(roots))


def is_leaf(e: Expr) -> bool:
    return isinstance(e, (Const, Var))
