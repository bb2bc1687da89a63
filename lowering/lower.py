"""Tensors to loop IR.

Placeholders and outputs are buffers.  Every other compute tensor is either
inlined into its readers (when that duplicates no real work, see
:func:`_inlined`) or materialised in a temporary buffer.  Each materialised
tensor becomes one :class:`Stage`: a row-major loop nest over its shape whose
body evaluates the tensor's expression and stores it.

Inside a body, a reduction becomes an accumulator and a loop nest; a select
whose branches read memory they are not provably allowed to read (or hold
reductions) becomes an ``If``, as does the right operand of ``and``/``or``;
reads whose index comes from tensor data get a run-time :class:`Check`.
"""
from __future__ import annotations

from collections import ChainMap

from te_autodiff import dtype as dt
from te_autodiff.expr import (BinOp, Load, Logic, Reduce, Select, Unary, add, cast, compare, const,
                              identity_of, logic_and, logic_not, logic_or, maximum, minimum, mul,
                              select, sub, var)
from te_autodiff.graph import tensors_in_order
from te_autodiff.tensor import Tensor
from te_autodiff.visit import children, rebuild, substitute, topo_order

from .bounds_check import Scope, check_tensor, in_bounds, is_index_only
from .loop_ir import (Alloc, Assign, Block, Buffer, BufLoad, Check, For, If, Local, Program, Stage,
                      Store)

_EXPENSIVE = {"exp", "log", "log1p", "tanh", "sigmoid", "sin", "cos"}
_CHEAP_INLINE_NODES = 48
_COMBINE = {"sum": add, "prod": mul, "max": maximum, "min": minimum}


# ------------------------------------------------------------------ arguments


def _as_list(tensors, what: str) -> list:
    items = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    for x in items:
        if not isinstance(x, Tensor):
            raise TypeError(f"te.build: {what} must be tensors, got {x!r} of type {type(x).__name__}")
    return items


def validate(inputs, outputs):
    """Check the build arguments; return them as lists and the tensors in order."""
    inputs, outputs = _as_list(inputs, "inputs"), _as_list(outputs, "outputs")
    if not outputs:
        raise ValueError("te.build: no outputs given")
    for x in inputs:
        if not x.is_placeholder:
            raise TypeError(f"te.build: input '{x.name}' is a compute tensor; inputs must be "
                            "te.placeholder tensors")
        if inputs.count(x) > 1:
            raise ValueError(f"te.build: placeholder '{x.name}' is listed twice among the inputs")
    order = tensors_in_order(outputs)
    known = set(inputs)
    for t in order:
        if t.is_placeholder and t not in known:
            raise ValueError(f"te.build: the outputs read placeholder '{t.name}' "
                             f"{t.shape} {t.dtype}, which is not among the inputs")
    return inputs, outputs, order


# ------------------------------------------------------------------- inlining


def _reads(t) -> dict:
    """For each tensor ``t`` reads: (number of distinct read sites, any inside a reduction)."""
    out = {}
    stack, seen = [(t.body, False)], set()
    while stack:
        e, inside = stack.pop()
        if (e, inside) in seen:
            continue
        seen.add((e, inside))
        if isinstance(e, Load):
            sites, red = out.get(e.tensor, (set(), False))
            sites.add(e)
            out[e.tensor] = (sites, red or inside)
        if isinstance(e, Reduce):
            stack += [(x, inside) for dom in e.doms for x in dom] + [(e.body, True)]
        else:
            stack += [(c, inside) for c in children(e)]
    return {p: (len(sites), red) for p, (sites, red) in out.items()}


def _elementwise(t, outs) -> bool:
    return (not t.is_placeholder and t not in outs
            and not any(isinstance(x, Reduce) for x in topo_order([t.body])))


def _inlined_sizes(order, outs) -> dict:
    """Node count of each body once every elementwise producer is inlined into
    it (an upper bound: it bounds the code duplicated by inlining cheap tensors)."""
    size = {}
    for t in order:
        if t.is_placeholder:
            continue
        nodes = topo_order([t.body])
        size[t] = len(nodes) + sum(size[n.tensor] for n in nodes
                                   if isinstance(n, Load) and _elementwise(n.tensor, outs))
    return size


def _cheap(t, size) -> bool:
    return size <= _CHEAP_INLINE_NODES and not any(
        (isinstance(n, Unary) and n.op in _EXPENSIVE) or (isinstance(n, BinOp) and n.op == "pow")
        for n in topo_order([t.body]))


def _inlined(order, outputs) -> set:
    """Non-output compute tensors to inline: elementwise (no reduction) and
    either evaluated at a single site outside any reduction, or cheap."""
    outs, inlined, sites = set(outputs), set(), {}
    size = _inlined_sizes(order, outs)
    for t in reversed(order):                       # readers before the tensors they read
        if t.is_placeholder:
            continue
        n, in_reduce = sites.get(t, (0, False))
        if _elementwise(t, outs) and ((n == 1 and not in_reduce) or _cheap(t, size[t])):
            inlined.add(t)
        mult, red = (n, in_reduce) if t in inlined else (1, False)
        for p, (k, inside) in _reads(t).items():
            n0, r0 = sites.get(p, (0, False))
            sites[p] = (n0 + k * mult, r0 or inside or red)
    return inlined


# ---------------------------------------------------------------- expressions


def _linear(indices, shape):
    """Row-major linear index of ``indices`` in ``shape``."""
    terms, stride = [], 1
    for ix, n in reversed(list(zip(indices, shape))):
        terms.append(mul(ix, const(stride, dt.INDEX)))
        stride *= n
    out = const(0, dt.INDEX)
    for term in reversed(terms):
        out = add(out, term)
    return out


def _identity(op, dtype):
    if dtype == "bool":
        return const(op in ("prod", "min"), "bool")
    return const(identity_of(op, dtype), dtype)


def _speculatable(e, scope) -> bool:
    """Whether ``e`` may be evaluated unconditionally at a point where ``scope`` holds."""
    for n in topo_order([e]):
        if isinstance(n, Reduce):
            return False
        if isinstance(n, Load) and not in_bounds(n.indices, n.tensor.shape, scope):
            return False
    return True


class _Context:
    """Program-wide lowering state: buffers, inlined tensors, local names, check codes."""

    def __init__(self, buffers, inlined, checks):
        self.buffers = buffers
        self.inlined = inlined
        self.checks = checks
        self.n_locals = 0

    def local(self, prefix, dtype) -> Local:
        self.n_locals += 1
        return Local(f"{prefix}{self.n_locals}", dtype)

    def check_code(self, tensor, dim, extent) -> int:
        key = (tensor.name, dim, extent)
        if key not in self.checks:
            self.checks[key] = len(self.checks) + 1
        return self.checks[key]


class _Emitter:
    """Lowers te expressions to loop IR values, appending the statements they
    need to ``stmts``.  ``memo`` maps te nodes to values computed so far in
    this block or an enclosing one."""

    def __init__(self, ctx, scope, parent=None):
        self.ctx = ctx
        self.scope = scope
        self.stmts = []
        self.memo = ChainMap() if parent is None else parent.memo.new_child()

    def child(self, scope) -> "_Emitter":
        return _Emitter(self.ctx, scope, self)

    def emit(self, stmt):
        self.stmts.append(stmt)

    def value(self, e):
        memo = self.memo
        stack = [(e, False)]
        while stack:
            node, ready = stack.pop()
            if node in memo:
                continue
            rule = _RULES.get(type(node))
            if rule is not None:
                memo[node] = rule(self, node)
            elif ready:
                memo[node] = rebuild(node, [memo[k] for k in children(node)])
            else:
                stack.append((node, True))
                stack += [(k, False) for k in children(node) if k not in memo]
        return memo[e]

    def branch(self, e, scope):
        """Lower ``e`` in a nested block: (statements, value)."""
        sub_emitter = self.child(scope)
        value = sub_emitter.value(e)
        return tuple(sub_emitter.stmts), value

    def load(self, e):
        t = e.tensor
        idx = [self.value(i) for i in e.indices]
        for d, (ix, n) in enumerate(zip(idx, t.shape)):
            if not is_index_only(e.indices[d]):     # the others are proven at build time
                self.emit(Check(ix, n, self.ctx.check_code(t, d, n), t.name, d))
        if t in self.ctx.inlined:
            return self.value(substitute(t.body, dict(zip(t.axes, idx))))
        return BufLoad(self.ctx.buffers[t], _linear(idx, t.shape))

    def select(self, e):
        cond = self.value(e.cond)
        if _speculatable(e.a, self.scope) and _speculatable(e.b, self.scope):
            (sa, a), (sb, b) = self.branch(e.a, self.scope), self.branch(e.b, self.scope)
            if not sa and not sb:
                return select(cond, a, b)
        sa, a = self.branch(e.a, self.scope.guarded(e.cond, True))
        sb, b = self.branch(e.b, self.scope.guarded(e.cond, False))
        tmp = self.ctx.local("v", e.dtype)
        self.emit(Alloc(tmp, None))
        self.emit(If(cond, Block(sa + (Assign(tmp, a),)), Block(sb + (Assign(tmp, b),))))
        return tmp

    def logic(self, e):
        if e.op == "not":
            return logic_not(self.value(e.a))
        a = self.value(e.a)
        both = logic_and if e.op == "and" else logic_or
        if _speculatable(e.b, self.scope):
            sb, b = self.branch(e.b, self.scope)
            if not sb:
                return both(a, b)
        sb, b = self.branch(e.b, self.scope.guarded(e.a, e.op == "and"))
        tmp = self.ctx.local("c", "bool")
        self.emit(Alloc(tmp, a))
        self.emit(If(a if e.op == "and" else logic_not(a), Block(sb + (Assign(tmp, b),))))
        return tmp

    def reduce(self, e):
        doms = tuple((self.value(lo), self.value(ext)) for lo, ext in e.doms)
        stmts, v = self.branch(e.body, self.scope.with_vars(e.axes, doms))
        dtype = e.body.dtype
        acc = self.ctx.local("acc", dtype)
        self.emit(Alloc(acc, _identity(e.op, dtype)))
        if e.op == "argmax":
            pos = self.ctx.local("pos", dt.INDEX)
            self.emit(Alloc(pos, const(0, dt.INDEX)))
            offset = _position(e.axes, doms)
            update = If(compare("gt", v, acc), Block((Assign(acc, v), Assign(pos, offset))))
            result = pos
        else:
            update = Assign(acc, cast(dtype, _COMBINE[e.op](acc, v)))
            result = acc
        body = Block(stmts + (update,))
        for ax, (lo, ext) in reversed(list(zip(e.axes, doms))):
            body = Block((For(ax, lo, ext, body),))
        self.stmts += body.stmts
        return result


def _position(axes, doms):
    """Row-major position of ``axes`` within their domains, from 0."""
    out, stride = const(0, dt.INDEX), const(1, dt.INDEX)
    for ax, (lo, ext) in reversed(list(zip(axes, doms))):
        out = add(mul(sub(ax, lo), stride), out)
        stride = mul(stride, ext)
    return out


_RULES = {Load: _Emitter.load, Select: _Emitter.select, Logic: _Emitter.logic,
          Reduce: _Emitter.reduce}


# --------------------------------------------------------------------- stages


def _stage(t, buf, ctx) -> Stage:
    axes = t.axes if t.ndim else (var("_", (0, 1)),)
    shape = t.shape if t.ndim else (1,)
    em = _Emitter(ctx, Scope.of_axes(axes, shape))
    value = em.value(t.body)
    body = Block(tuple(em.stmts) + (Store(buf, _linear(t.axes, t.shape), value),))
    for d in reversed(range(len(axes))):
        kind = "parallel" if d == 0 else "vectorize" if d == len(axes) - 1 else "serial"
        loop = For(axes[d], const(0, dt.INDEX), const(shape[d], dt.INDEX), body, kind)
        body = loop if d == 0 else Block((loop,))
    return Stage(buf.name, buf, body)


def _buffers(inputs, order, outputs, inlined) -> dict:
    """A uniquely named buffer for every input and every materialised tensor."""
    out, names = {}, set()

    def make(t, kind):
        name, n = t.name, 1
        while name in names:
            name, n = f"{t.name}_{n}", n + 1
        names.add(name)
        out[t] = Buffer(name, t.shape, t.dtype, kind)

    for t in inputs:
        make(t, "input")
    outs = set(outputs)
    for t in order:
        if not t.is_placeholder and t not in inlined:
            make(t, "output" if t in outs else "temp")
    return out


def lower(inputs, outputs, name=None) -> Program:
    """The loop IR program computing ``outputs`` from the placeholders ``inputs``."""
    inputs, outputs, order = validate(inputs, outputs)
    computes = [t for t in order if not t.is_placeholder]
    for t in computes:
        check_tensor(t)
    inlined = _inlined(order, outputs)
    buffers = _buffers(inputs, order, outputs, inlined)
    ctx = _Context(buffers, inlined, {})
    stages = tuple(_stage(t, buffers[t], ctx) for t in computes if t not in inlined)
    checks = tuple(key for key, _ in sorted(ctx.checks.items(), key=lambda kv: kv[1]))
    return Program(name or outputs[0].name, tuple(buffers.values()), stages,
                   tuple(buffers[t] for t in outputs), checks)
