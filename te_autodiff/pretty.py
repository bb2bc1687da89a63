"""Readable text for expressions and tensors (``te.pretty``).

A non-trivial node used more than once is printed once, as ``let tN = ... in``,
and referred to by name afterwards, so the text grows with the DAG, not with
the tree it unfolds to.  Variables that share a name get a ``'`` suffix.
"""
from __future__ import annotations

from . import dtype as dt
from .expr import (BinOp, Cast, Cmp, Const, Expr, InverseIndex, Load, Logic, MatchSum, Reduce, ScanState, Select,
                   Unary, Var)
from .ops import OPS
from .visit import children, topo_order, trampoline

_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _binop(e):
    if OPS[e.op].infix:
        sym, p = OPS[e.op].infix
        a = yield e.a, p
        b = yield e.b, p + 1
        return f"{a} {sym} {b}", p
    a = yield e.a, 0
    b = yield e.b, 0
    return f"{e.op}({a}, {b})", 3


def _cmp(e):
    a = yield e.a, 1
    b = yield e.b, 1
    return f"{a} {_CMP[e.op]} {b}", 0


def _logic(e):
    if e.op == "not":
        a = yield e.a, 3
        return f"not {a}", 0
    side = [-1 if isinstance(x, Logic) and x.op == e.op else 0 for x in (e.a, e.b)]
    a = yield e.a, side[0]
    b = yield e.b, side[1]
    return f"{a} {e.op} {b}", -1


def _unary(e):
    if e.op == "neg":
        a = yield e.a, 3
        return f"-{a}", 2
    a = yield e.a, 0
    return f"{e.op}({a})", 3


def _cast(e):
    a = yield e.a, 0
    return f"{e.to}({a})", 3


# The text of an operator node and its precedence (3 = atomic), as generators
# that yield ``(child, precedence of the context)`` for each child's text: the
# te printer here and the loop IR printer (lowering/loop_ir.py) share them.
OPERATOR_TEXT = {BinOp: _binop, Cmp: _cmp, Logic: _logic, Unary: _unary, Cast: _cast}


class _Printer:
    def __init__(self, roots, share=True):
        self.names = {}
        self.var_names = {}
        self.lets = []
        uses = {}
        order = topo_order(roots)
        for node in order:
            for c in children(node):
                uses[c] = uses.get(c, 0) + 1
        self.shared = set()
        if share:
            # a node that mentions a reduction's own axis must stay inside it
            bound = {ax for n in order if isinstance(n, (Reduce, InverseIndex, MatchSum)) for ax in n.axes}
            local = {}
            for n in order:
                local[n] = (n in bound) or any(local[c] for c in children(n))
            self.shared = {n for n in order
                           if uses.get(n, 0) > 1 and _worth_naming(n) and not local[n]}

    def var(self, v: Var) -> str:
        name = self.var_names.get(v)
        if name is None:
            taken = set(self.var_names.values())
            name = v.name
            while name in taken:
                name += "'"
            self.var_names[v] = name
        return name

    def expr(self, e: Expr, prec: int = 0) -> str:
        return trampoline(self._expr, e, prec)

    def _expr(self, e: Expr, prec: int):
        """The text of ``e`` in a context of precedence ``prec``: its let name,
        or its formula, parenthesised when it binds less tightly (a generator
        for :func:`trampoline`: deep expressions print without recursion)."""
        if e in self.names:
            return self.names[e]
        text, own = yield from self._format(e)
        if e in self.shared:
            name = f"t{len(self.lets)}"
            self.lets.append((name, text))
            self.names[e] = name
            return name
        return f"({text})" if own < prec else text

    def _format(self, e: Expr):
        """Text of ``e`` and its precedence (3 = atomic); yields ``(child, prec)``
        for the text of each child."""
        if isinstance(e, Const):
            if e.dtype == "bool":
                return ("true" if e.value else "false"), 3
            text = repr(e.value) if e.dtype.startswith("float") else str(e.value)
            return (f"({text})" if e.value < 0 else text), 3
        if isinstance(e, Var):
            return self.var(e), 3
        if type(e) in OPERATOR_TEXT:
            return (yield from OPERATOR_TEXT[type(e)](e))
        if isinstance(e, Select):
            cond = yield e.cond, -1
            a = yield e.a, 0
            b = yield e.b, 0
            return f"select({cond}, {a}, {b})", 3
        if isinstance(e, Load):
            indices = []
            for i in e.indices:
                indices.append((yield i, 0))
            return f"{e.tensor.name}[{', '.join(indices)}]", 3
        if isinstance(e, Reduce):
            ranges = []
            for ax, (lo, ext) in zip(e.axes, e.doms):
                if isinstance(lo, Const) and isinstance(ext, Const):
                    hi = str(lo.value + ext.value)
                elif _is_inclusive(ext, lo):       # ext = (last - lo) + 1
                    hi = "=" + (yield ext.a.a, 0)
                elif isinstance(ext, BinOp) and ext.op == "sub" and ext.b is lo:     # ext = end - lo
                    hi = yield ext.a, 0
                else:
                    hi = yield lo + ext, 0
                name = self.var(ax)
                first = yield lo, 0
                ranges.append(f"{name} in {first}..{hi}")
            body = yield e.body, 0
            return f"{e.op}[{', '.join(ranges)}]({body})", 3
        if isinstance(e, MatchSum):
            ranges = ", ".join(f"{self.var(ax)} in {lo}..{lo + n}" for ax, (lo, n) in zip(e.axes, e.doms))
            value = yield e.at + e.lo, 0
            key = yield e.key, 1
            summed = yield e.value, 0
            return f"sum[{ranges} where {key} == {value}]({summed})", 3
        if isinstance(e, InverseIndex):
            ranges = ", ".join(f"{self.var(ax)} in {lo}..{lo + n}" for ax, (lo, n) in zip(e.axes, e.doms))
            key = yield e.key, 0
            at = yield e.at, 0
            return f"inverse_index[{ranges}]({key}, values {e.lo}..{e.lo + e.count})[{at}]", 3
        raise TypeError(f"cannot print {type(e).__name__}")

    def wrap(self, text: str) -> str:
        if not self.lets:
            return text
        lets = "".join(f"  let {n} = {t}\n" for n, t in self.lets)
        return f"{lets}  in {text}"


def _is_inclusive(ext, lo) -> bool:
    return (isinstance(ext, BinOp) and ext.op == "add" and isinstance(ext.b, Const) and ext.b.value == 1
            and isinstance(ext.a, BinOp) and ext.a.op == "sub" and ext.a.b is lo)


def _worth_naming(e) -> bool:
    """Shared nodes worth a let: anything bigger than a leaf or a simple index."""
    if isinstance(e, (Const, Var)):
        return False
    if isinstance(e, (BinOp, Cmp)) and all(isinstance(c, (Const, Var)) for c in (e.a, e.b)):
        return False
    if isinstance(e, Load) and all(isinstance(c, (Const, Var)) for c in e.indices):
        return False
    if isinstance(e, Cast) and dt.is_int(e.to) and dt.is_int(e.a.dtype):   # widening an index
        return _worth_naming(e.a)
    return not (isinstance(e, Unary) and e.op == "neg" and isinstance(e.a, (Const, Var)))


def expr_str(e: Expr, share: bool = False) -> str:
    """One expression as text."""
    p = _Printer([e], share)
    return p.wrap(p.expr(e))


def tensor_str(t, share: bool = True) -> str:
    """``name[i, j] = body`` for a compute tensor, a signature for a placeholder."""
    dims = ", ".join(str(s) for s in t.shape)
    if t.is_placeholder:
        return f"{t.name}: placeholder({dims}) {t.dtype}"
    if isinstance(t.body, ScanState):
        op = t.body.scan
        return f"{t.name} = state {op.state[t.body.which].name} of scan {op.name}    # shape ({dims}) {t.dtype}"
    p = _Printer([t.body], share)
    head = f"{t.name}[{', '.join(p.var(a) for a in t.axes)}]"
    body = p.expr(t.body)
    text = f"{head} = {body}" if not p.lets else f"{head} =\n{p.wrap(body)}"
    return f"{text}    # shape ({dims}) {t.dtype}"


def pretty(tensors) -> str:
    """``te.pretty``: each tensor's formula, producers first, shared parts let-bound."""
    from .graph import tensors_in_order
    from .tensor import Tensor
    roots = [tensors] if not isinstance(tensors, (list, tuple)) else list(tensors)
    for t in roots:
        if not isinstance(t, Tensor):
            raise TypeError(f"te.pretty: expected a te tensor or a list of them, got {type(t).__name__}")
    lines, steps = [], set()
    for t in tensors_in_order(roots):
        op = t.body.scan if isinstance(t.body, ScanState) else None
        if op is not None and op not in steps:      # a scan's step, once, before its first state
            steps.add(op)
            lines.append(f"scan {op.name} over t in 0..{op.steps}:")
            lines += [f"    {s.name}[t] = {i.name}[t] for t < {op.k}, then {u.name}[t]    (state {y.name})"
                      for s, i, u, y in zip(op.state, op.init, op.update, op.results)]
            lines += ["    " + line for c in op.chain for line in tensor_str(c).split("\n")]
        lines.append(tensor_str(t))
    return "\n".join(lines)
