"""Tensors to loop IR.

The program is first put in shared normal form (``te_autodiff.sharing.share``):
every compute tensor is lowered in its lifted form (reductions nested in a
formula become tensors of their own) and tensors that compute the same values
are lowered once, so a kernel built from forward outputs and their gradients
computes every common value (a lifted reduction, an argmax, an activation)
once.  Outputs that compute the same values are returned as copies of one
buffer.  Buffers and stages keep the user's tensor names.

Store or recompute
------------------
Placeholders and outputs are buffers.  Every other compute tensor is stored
in a temporary buffer, inlined into its readers (recomputed at every read),
or, for a reduction lifted out of a formula, computed in place where the
formula reads it.  ``work`` is the number of arithmetic operations of one
element, with the work of inlined producers added per read site; loads,
casts, constants and index arithmetic are free; each operator weighs its
``work`` in the operator table (``te_autodiff/ops.py``): transcendental
functions infinite, a division or a square root 2, every other operation 1.

===========================================  ==================================
tensor                                       default
===========================================  ==================================
output, placeholder                          buffer
reduction (sum, max, min, prod, argmax)      buffer
reduction lifted out of a formula, read at   computed in place, as written
one site once per element of its reader
(and nothing else needs it)
a test of the element's position (padding,   buffer: in a convolution the test
``p ? X[...] : 0``) read inside reductions   would run in the innermost loop and
``PAD_STORE_READS`` times or more per        keep the schedule from tiling the
element                                      output columns; the copy is one pass
elementwise, trivial (work <= 1: a load,     inlined, even inside a reduction
a padding select, a cast, one cheap op)
elementwise, cheap (work <= 3, no            inlined unless read inside a
transcendental)                              reduction of its reader
elementwise, evaluated once per element      inlined
(one read site, no broadcast) outside any
reduction of its reader
elementwise, read inside reductions fewer    inlined: only the elements read
times than it has elements (counting their   are computed (a log-softmax a
iterations: a gather of a few)               loss reads at one column a row)
elementwise in a scan's step, no             inlined unless read inside a
transcendental (an RK4 stage ``k2`` read     reduction: each stored tensor of a
at ``i`` and ``i - 1``)                      step is a pass over memory (and a
                                             barrier across threads) at every
                                             step
anything else: transcendental chains read    buffer
by several readers, non-trivial values read
inside a reduction (a GEMM-like gradient
reads a stored ``dY``; recomputing it would
repeat its work in every iteration)
===========================================  ==================================

A *scaled view*, a tensor that is a stored tensor read at its own position
times factors reading fewer of its axes (a softmax ``P = E / Σ E``, whose
``E`` the gradient keeps), read inside sums that can take its factors, is
read as the tensor it scales before this rule runs (``scaled_reads.py``):
``P V`` becomes ``(E V) / Σ E``, so ``P`` is not stored a second time.

Inlining (trivial, cheap or once per element) happens only while the stage
the tensor lands in stays within ``STAGE_BUDGET`` expression nodes; past it
the producer is stored (LLVM's compile time grows faster than linearly with
the size of one loop body, so a long chain becomes several stages, each
compiled fast).  A stage holds one copy of a tensor per distinct position
it is read at (reads at one position are one expression), and the part of
a copy that does not depend on where the copies differ is shared.  A lifted
reduction is computed in place under the same budget, counting
``LOOP_NEST_NODES`` for its loop nest, and the reductions lifted out of one
tensor are in place all or none: the gradient of a weight shared by the T
steps of an unrolled recurrence is a sum of T reductions, and past the
budget they are all stored, each a stage of one template (``share.py``).

``te.build(..., store=[T])`` always gives ``T`` a buffer; ``recompute=[T]``
always inlines it (a reduction or an output cannot be recomputed: that raises
``ValueError``).

Stages
------
Each stored tensor becomes one :class:`Stage`: a row-major loop nest over its
shape whose body evaluates the tensor's expression and stores it.  Inside a
body, a reduction becomes an accumulator and a loop nest (a sum over a
fixed domain multiplies by its term's factors that the loop does not change
once, after the loop: ``Σ_j c·x_j·y_j`` is ``c·Σ_j x_j·y_j``, so a scaled
contraction, such as attention's gradient through ``QKᵀ/√d``, keeps one
multiply-add per step); a select whose
branches read memory they are not provably allowed to read (or hold
reductions) becomes an ``If``, as does the right operand of ``and``/``or``;
reads whose index comes from tensor data get a run-time :class:`Check`.  A
non-trivial value used more than once in a block is computed once into a
let-bound local (``let t3 = ...``); cheap index arithmetic is recomputed.
Every pass memoises on node identity, so deep DAGs lower in linear time.
"""
from __future__ import annotations

import math
from collections import ChainMap

from te_autodiff import dtype as dt
from te_autodiff.expr import (BinOp, Cast, Cmp, Const, Load, Logic, Reduce, ScanState, Select, Unary, Var, add,
                              binop, cast, compare, const, factors, identity_of, logic_and, logic_not, logic_or,
                              maximum, minimum, mul, product, select, sub, var)
from te_autodiff.graph import tensors_in_order
from te_autodiff.lift import is_lifted_part
from te_autodiff.ops import OPS
from te_autodiff.sharing import normal_form, share
from te_autodiff.tensor import Tensor
from te_autodiff.visit import (children, eager_children, free_vars, is_leaf, rebuild, rewrite, substitute,
                               topo_order)

from .bounds_check import Scope, bounds, check_tensor, in_bounds, is_index_only, reads
from .key_stages import is_keyed, keyed_stage
from .loop_ir import (LOOP_NEST_NODES, STAGE_BUDGET, Alloc, Assign, Block, Buffer, BufLoad, Check, For, If, Local,
                      Program, Stage, Store, TimeLoop, children as loop_children, free_leaves, simplify_index,
                      walk)
from .scaled_reads import scale_reads

TRIVIAL_WORK = 1            # inlined everywhere, even inside a reduction
CHEAP_WORK = 3              # inlined when not read inside a reduction
PAD_STORE_READS = 16        # a padding select read this often per element inside reductions is stored
MAX_NESTING = 200           # selects, and/or, reductions nested in one stage's body: lowering and code
                            # generation recurse once per level, and this many levels stay inside Python's
                            # default recursion limit whatever the limit is set to, so the error is the same
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


# ------------------------------------------------------- store or recompute


def _tensor_set(tensors, what: str) -> list:
    if isinstance(tensors, Tensor):
        return [tensors]
    try:
        items = list(tensors or ())
    except TypeError:
        raise TypeError(f"te.build: {what}= must list tensors, got {tensors!r}") from None
    for x in items:
        if not isinstance(x, Tensor):
            raise TypeError(f"te.build: {what}= must list tensors, got {x!r} of type {type(x).__name__}")
    return items


def _bodies(t) -> list:
    """The formulas ``t`` evaluates: its body, or a scan's step (its chain)."""
    return [c.body for c in t.body.scan.chain] if _is_scan(t) else [t.body]


def _reads(t) -> dict:
    """For each tensor ``t`` reads: (number of distinct read sites, any inside a reduction)."""
    out = {}
    stack, seen = [(b, False) for b in _bodies(t)], set()
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


def _positions(load, axes, at) -> set:
    """The positions ``load`` (in the body of a tensor with ``axes``) reads
    from each position of ``at`` that tensor is evaluated at."""
    out = set()
    for ix in at:
        mapping = dict(zip(axes, ix))
        out.add(tuple(simplify_index(e) for e in rewrite(list(load.indices), lambda n, new: mapping.get(n))))
    return out


def _copies_size(t, nodes, at) -> int:
    """The expression nodes of ``t``'s copies at the positions ``at``: a node
    that reads no axis on which the positions differ is one node in all of them."""
    varying = {a for k, a in enumerate(t.axes) if len({ix[k] for ix in at}) > 1}
    if not varying:
        return len(nodes)
    reads = {}
    for n in nodes:
        reads[n] = n in varying or any(reads[c] for c in children(n))
    moving = sum(reads.values())
    return len(nodes) - moving + moving * len(at)


def _reduction_reads(t) -> dict:
    """For each tensor ``t`` reads inside a reduction: its reads per element of
    ``t``, counting the iterations of the enclosing reductions (an extent that
    is not a constant counts once)."""
    return {p: inside for p, (inside, _) in _evaluations(t, 1).items() if inside}


def _evaluations(t, unknown) -> dict:
    """``{tensor: (inside, outside)}``: how often one element of ``t``
    evaluates each tensor it reads inside reductions (once per iteration of
    the enclosing ones, an extent that is not a constant counting
    ``unknown``) and outside them (once per read site)."""
    out = {}
    stack, seen = [(b, 1) for b in _bodies(t)], set()
    while stack:
        e, trips = stack.pop()
        if (e, trips) in seen:
            continue
        seen.add((e, trips))
        if isinstance(e, Load):
            inside, outside = out.get(e.tensor, (0, 0))
            out[e.tensor] = (inside + trips, outside) if trips > 1 else (inside, outside + 1)
        if isinstance(e, Reduce):
            inner = trips * math.prod(x.value if isinstance(x, Const) else unknown for _, x in e.doms)
            stack += [(x, trips) for dom in e.doms for x in dom] + [(e.body, inner)]
        else:
            stack += [(c, trips) for c in children(e)]
    return out


def _position_test(t) -> bool:
    """Whether ``t`` is ``cond ? a : b`` with ``cond`` a test of the element's
    position alone (a padding or boundary select)."""
    return isinstance(t.body, Select) and is_index_only(t.body.cond)


def _is_scan(t) -> bool:
    return isinstance(t.body, ScanState)


def _has_reduction(t) -> bool:
    """Whether ``t`` reduces (a reduction, a keyed tensor or a scan: computed once, into a buffer)."""
    return is_keyed(t) or _is_scan(t) or any(isinstance(x, Reduce) for x in topo_order([t.body]))


def _op_work(n) -> float:
    """Arithmetic operations of one node (its children excluded)."""
    if isinstance(n, (Unary, BinOp)):
        return OPS[n.op].work
    if isinstance(n, (Select, Cmp, Logic)):
        return 1
    return 0                            # Const, Var, Load, Cast


def _work(t, inlined_work: dict) -> float:
    """Operations of one element of ``t``; a read of a tensor in ``inlined_work``
    costs that tensor's work.  Index arithmetic and conditions are free."""
    total, data = 0, {}
    for n in topo_order([t.body]):
        kids = children(n)
        data[n] = (isinstance(n, Load) or dt.is_float(n.dtype) or any(data[k] for k in kids))
        if isinstance(n, Load):
            total += inlined_work.get(n.tensor, 0)
        elif data[n] or isinstance(n, Select):
            total += _op_work(n)
    return total


class Plan:
    """Where each compute tensor of a shared program (or, ``step``, of a
    scan's step) is computed (the rule of the module doc): ``inlined``
    (elementwise, recomputed at every read), ``in_place`` (a lifted
    reduction evaluated where its one reader reads it), everything else
    ``stored``, in producer-first order."""

    def __init__(self, graph, outputs, store=(), recompute=(), parts=(), step=False):
        self.outputs = set(outputs)
        computes = [t for t in graph if not t.is_placeholder]
        nodes = {t: topo_order([t.body]) for t in computes}
        size = {t: len(nodes[t]) for t in computes}
        elementwise = {t for t in computes if not _has_reduction(t)}
        # gathers: tensors that read at a position from data, or read one elementwise
        gathers = set()
        for t in computes:
            if any(p in gathers and p in elementwise for p in t.inputs) or any(
                    isinstance(e, Load) and not all(map(is_index_only, e.indices)) for e in nodes[t]):
                gathers.add(t)
        # producers first: the work of each elementwise tensor, with the
        # producers that are cheap enough to be inlined added per read
        self.work = {}
        for t in computes:
            if t in elementwise:
                inl = {p: self.work[p] for p in t.inputs
                       if p in self.work and p not in self.outputs and p not in store
                       and (self.work[p] <= CHEAP_WORK or p in recompute)}
                self.work[t] = _work(t, inl)
        # readers first: how often each tensor is evaluated and whether inside a
        # reduction; the stages (hosts) its body would be emitted into, at
        # which positions (``sites``: a copy per distinct position, as copies
        # at one position are one expression), and the size each stage has
        # reached.  A gather's copies are counted per read, along chains of
        # readers (``copies``): each is a checked read at a position from
        # data, which a select around it cannot evaluate ahead of its test
        evals, in_reduce, sites, copies, stage_size, red_reads, total = {}, {}, {}, {}, {}, {}, {}
        self.inlined, self.in_place, apart = set(), set(), set()
        for t in reversed(computes):
            n, red, evaluated = evals.get(t, 0), in_reduce.get(t, False), total.get(t, 0)
            once = n <= math.prod(t.shape) and not red
            extra = LOOP_NEST_NODES if t in parts else 0
            grown = {h: (size[t] + extra) * copies.get(t, 1) if t in gathers else
                     _copies_size(t, nodes[t], at) + extra * len(at) for h, at in sites.get(t, {}).items()}
            fits = all(stage_size[h] + g <= STAGE_BUDGET for h, g in grown.items())
            if t in self.outputs or t in store:
                pass
            elif t in elementwise:
                w = self.work[t]
                padding = red_reads.get(t, 0) >= PAD_STORE_READS * math.prod(t.shape) and _position_test(t)
                arithmetic = w < math.inf if step else w <= CHEAP_WORK     # a step: any work but a function's
                # read inside reductions fewer times than it has elements (a log-softmax a
                # loss reads at one column a row): computed at those reads alone
                gathered = red and evaluated < math.prod(t.shape)
                cheap = w <= TRIVIAL_WORK or (arithmetic and not red) or once or gathered
                if t in recompute or (fits and not padding and cheap):
                    self.inlined.add(t)
            elif t in parts and once and fits and t not in apart:
                self.in_place.add(t)
            if t in self.inlined or t in self.in_place:
                mult, where = copies.get(t, 1), sites.get(t, {})
                for h, g in grown.items():
                    stage_size[h] += g
            else:
                n, red, mult, where = math.prod(t.shape), False, 1, {t: {tuple(t.axes)}}
                evaluated = n
                stage_size[t] = size[t]
            # the reductions lifted out of t are computed in place all or none:
            # stored, terms of one structure (the T steps' shares of a shared
            # weight's gradient) are one template; in place, each is code of its own
            terms = [p for p in t.inputs if p in parts]
            need = sum(size[p] + LOOP_NEST_NODES for p in terms)
            if any(stage_size[h] + need > STAGE_BUDGET for h in where):
                apart.update(terms)
            for p, k in _reduction_reads(t).items():
                red_reads[p] = red_reads.get(p, 0) + n * k
            for p, (inside, outside) in _evaluations(t, math.inf).items():
                total[p] = total.get(p, 0) + (evaluated * (inside + outside) if evaluated else 0)
            for p, (k, inside) in _reads(t).items():
                evals[p] = evals.get(p, 0) + n * k
                in_reduce[p] = in_reduce.get(p, False) or inside or red
                copies[p] = copies.get(p, 0) + mult * k
            for load in (e for e in nodes[t] if isinstance(e, Load) and not e.tensor.is_placeholder):
                into = sites.setdefault(load.tensor, {})
                for h, at in where.items():
                    into.setdefault(h, set()).update(_positions(load, t.axes, at))
        self.stored = [t for t in computes if t not in self.inlined and t not in self.in_place]
        # tensors whose lowered form holds a reduction (not speculatable)
        self.reducing = set()
        for t in computes:
            if t in self.in_place or (t in self.inlined and any(p in self.reducing for p in t.inputs)):
                self.reducing.add(t)

    def recomputed(self, t) -> bool:
        return t in self.inlined or t in self.in_place


def _overrides(rep, outputs, store, recompute, updates=frozenset()):
    """Representatives of the tensors named in ``store=``/``recompute=``, checked
    (``rep`` also maps the tensors of scan steps, ``updates`` their updates)."""
    def reps(items, what):
        out = set()
        for x in _tensor_set(items, what):
            if x not in rep:
                raise ValueError(f"te.build: {what}= names tensor '{x.name}', which the outputs "
                                 "do not depend on")
            out.add(rep[x])
        return out
    store_set, recompute_set = reps(store, "store"), reps(recompute, "recompute")
    for x in _tensor_set(recompute, "recompute"):
        r = rep[x]
        if r.is_placeholder:
            raise ValueError(f"te.build: cannot recompute '{x.name}': it is an input placeholder")
        if r in outputs:
            raise ValueError(f"te.build: cannot recompute '{x.name}': it is an output of the kernel "
                             "(or computes the same values as one), so it is stored")
        if _is_scan(r):
            raise ValueError(f"te.build: cannot recompute '{x.name}': it is a scan, computed once into "
                             "a buffer that holds every time step")
        if r in updates:
            raise ValueError(f"te.build: cannot recompute '{x.name}': it is the update of a scan, "
                             "stored as the scan's state")
        if _has_reduction(r):
            raise ValueError(f"te.build: cannot recompute '{x.name}': it is a reduction, which is "
                             "always computed once into a buffer (only elementwise tensors can be "
                             "inlined into their readers)")
        if r in store_set:
            raise ValueError(f"te.build: tensor '{x.name}' is listed in both store= and recompute=")
    return {r for r in store_set if not r.is_placeholder}, recompute_set


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


def _is_let(stmt) -> bool:
    return isinstance(stmt, Alloc) and stmt.let


class _Context:
    """Program-wide lowering state: buffers, the plan, local names, check codes."""

    def __init__(self, buffers, plan, checks):
        self.buffers = buffers
        self.plan = plan
        self.checks = checks
        self.n_locals = 0
        self.speculatable_memo = {}
        self.index_memo = {}
        self.time = None            # the time of the scan step being lowered
        self.nesting = 0            # selects, and/or, reductions being lowered, one inside the other

    def local(self, prefix, dtype) -> Local:
        self.n_locals += 1
        return Local(f"{prefix}{self.n_locals}", dtype)

    def check_code(self, tensor, dim, extent) -> int:
        key = (tensor.name, dim, extent)
        if key not in self.checks:
            self.checks[key] = len(self.checks) + 1
        return self.checks[key]

    def speculatable(self, e, scope) -> bool:
        """Whether ``e`` may be evaluated unconditionally where ``scope`` holds:
        no reduction (also none in a tensor computed in place) and no read that
        may leave its tensor."""
        def rule(n, kids):
            if isinstance(n, Reduce):
                return False
            if isinstance(n, Load) and (n.tensor in self.plan.reducing
                                        or not in_bounds(n.indices, n.tensor.shape, scope)):
                return False
            return all(kids)
        return _bottom_up(e, self.speculatable_memo.setdefault(scope, {}), rule)

    def trivial(self, v) -> bool:
        """Values cheaper to recompute than to bind: leaves, loads, a cast or
        negation of one, and small integer/boolean index arithmetic."""
        if isinstance(v, (Const, Var, Local, BufLoad)):
            return True
        if ((isinstance(v, Cast) or (isinstance(v, Unary) and v.op == "neg"))
                and isinstance(v.a, (Const, Var, Local, BufLoad))):
            return True
        return _bottom_up(v, self.index_memo, _index_size, children=loop_children) <= _INDEX_TREE


_INDEX_TREE = 4096          # index arithmetic up to this many nodes (as a tree) is recomputed
_INDEX_TYPES = (Const, Var, Local, BinOp, Cmp, Logic, Cast, Unary, Select)


def _index_size(n, kids) -> float:
    """Tree size of pure integer/boolean arithmetic (infinite for anything else), saturating."""
    if not isinstance(n, _INDEX_TYPES) or dt.is_float(n.dtype):
        return math.inf
    return min(1 + sum(kids), _INDEX_TREE + 1)


def _bottom_up(root, memo: dict, rule, children=children):
    """``rule(node, [values of its children])`` for ``root``, each node once
    (``memo`` on node identity; nodes already in it are not visited again)."""
    stack = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if node in memo:
            continue
        if ready:
            memo[node] = rule(node, [memo[k] for k in children(node)])
        else:
            stack.append((node, True))
            stack += [(k, False) for k in children(node) if k not in memo]
    return memo[root]


class _Emitter:
    """Lowers te expressions to loop IR values, appending the statements they
    need to ``stmts``.  ``memo`` maps te nodes to values computed so far in
    this block or an enclosing one.

    A stage is lowered twice: a probe (``shared`` None) records in ``reused``
    the nodes whose value is asked for again while it is available; the real
    pass binds the non-trivial values of those nodes to let-bound locals."""

    def __init__(self, ctx, scope, parent=None, shared=None):
        self.ctx = ctx
        self.scope = scope
        self.stmts = []
        if parent is None:
            self.memo, self.shared, self.reused = ChainMap(), shared, set()
        else:
            self.memo, self.shared, self.reused = parent.memo.new_child(), parent.shared, parent.reused

    def child(self, scope) -> "_Emitter":
        return _Emitter(self.ctx, scope, self)

    def emit(self, stmt):
        self.stmts.append(stmt)

    def value(self, e):
        """The loop IR value of ``e``, each node once (iterative: a read of an
        inlined tensor continues with that tensor's body, so long chains of
        inlined tensors do not nest Python calls)."""
        memo, reused, inlined = self.memo, self.reused, {}
        stack = [(e, 0)]                # phases: 0 new, 1 children done, 2 inlined body done
        while stack:
            node, phase = stack.pop()
            if phase == 2:
                memo[node] = self.bind(node, memo[inlined.pop(node)])
                continue
            if node in memo:
                reused.add(node)
                continue
            rule = _RULES.get(type(node))
            if rule is not None:
                memo[node] = self.bind(node, self.nested(rule, node))
            elif phase == 0:
                stack.append((node, 1))
                for k in children(node):
                    if k in memo:
                        reused.add(k)
                    else:
                        stack.append((k, 0))
            elif isinstance(node, Load):
                v, body = self.load(node)
                if body is None:
                    memo[node] = self.bind(node, v)
                elif body in memo:
                    reused.add(body)
                    memo[node] = self.bind(node, memo[body])
                else:
                    inlined[node] = body
                    stack += [(node, 2), (body, 0)]
            else:
                memo[node] = self.bind(node, rebuild(node, [memo[k] for k in children(node)]))
        return memo[e]

    def nested(self, rule, node):
        """``rule(self, node)``, which lowers the parts of ``node`` by calling
        :meth:`value` again: one level deeper (at most :data:`MAX_NESTING`)."""
        ctx = self.ctx
        if ctx.nesting >= MAX_NESTING:
            raise _NestedTooDeeply
        ctx.nesting += 1
        try:
            return rule(self, node)
        finally:
            ctx.nesting -= 1

    def bind(self, node, v):
        """``v``, or a let-bound local holding it when ``node`` is used again."""
        if self.shared is None or node not in self.shared or self.ctx.trivial(v):
            return v
        local = self.ctx.local("t", v.dtype)
        self.emit(Alloc(local, v, let=True))
        return local

    def branch(self, e, scope):
        """Lower ``e`` in a nested block: (emitter, value)."""
        sub_emitter = self.child(scope)
        return sub_emitter, sub_emitter.value(e)

    def hoist_common(self, a, b):
        """Lower here what both branches ``a`` and ``b`` evaluate, whichever
        is taken: evaluated anyway, it is computed once before the branch
        instead of once in each (through nested selects, once per path)."""
        def evaluated(root):
            return topo_order([root], lambda n: () if n in self.memo else eager_children(n))
        in_a = set(evaluated(a))
        common = [n for n in evaluated(b) if n in in_a and n not in self.memo and not is_leaf(n)]
        inside = {k for n in common for k in eager_children(n)}
        for n in common:
            if n not in inside:         # the outermost: each lowers the common nodes below it
                self.value(n)

    def adopt(self, *branches) -> bool:
        """Move the statements of speculated ``branches`` into this block when
        they are all let-bindings (pure, safe to run unconditionally)."""
        if not all(_is_let(s) for b in branches for s in b.stmts):
            return False
        for b in branches:
            self.stmts += b.stmts
            self.memo.maps[0].update(b.memo.maps[0])
        return True

    def load(self, e):
        """A read whose indices are lowered: ``(value, None)`` for a buffer, or
        ``(None, body)`` with the body to evaluate for a recomputed tensor."""
        t = e.tensor
        idx = [self.memo[i] for i in e.indices]
        for d, (ix, n) in enumerate(zip(idx, t.shape)):
            if not is_index_only(e.indices[d]) and not _within(e.indices[d], n, self.scope):
                self.emit(Check(ix, n, self.ctx.check_code(t, d, n), t.name, d))   # the others: proven
        if self.ctx.plan.recomputed(t):
            return None, substitute(t.body, dict(zip(t.axes, e.indices)))
        return BufLoad(self.ctx.buffers[t], _linear(idx, t.shape)), None

    def select(self, e):
        if self.ctx.time is not None:
            known = _fold_time_tests(e.cond, self.ctx.time, self.scope)
            if isinstance(known, Const):
                return self.value(e.a if known.value else e.b)
        cond = self.value(e.cond)
        self.hoist_common(e.a, e.b)
        if self.ctx.speculatable(e.a, self.scope) and self.ctx.speculatable(e.b, self.scope):
            (ba, a), (bb, b) = self.branch(e.a, self.scope), self.branch(e.b, self.scope)
            if self.adopt(ba, bb):
                return select(cond, a, b)
        ba, a = self.branch(e.a, self.scope.guarded(e.cond, True))
        bb, b = self.branch(e.b, self.scope.guarded(e.cond, False))
        tmp = self.ctx.local("v", e.dtype)
        self.emit(Alloc(tmp, None))
        self.emit(If(cond, Block(tuple(ba.stmts) + (Assign(tmp, a),)),
                     Block(tuple(bb.stmts) + (Assign(tmp, b),))))
        return tmp

    def logic(self, e):
        if e.op == "not":
            return logic_not(self.value(e.a))
        a = self.value(e.a)
        both = logic_and if e.op == "and" else logic_or
        if self.ctx.speculatable(e.b, self.scope):
            bb, b = self.branch(e.b, self.scope)
            if self.adopt(bb):
                return both(a, b)
        bb, b = self.branch(e.b, self.scope.guarded(e.a, e.op == "and"))
        tmp = self.ctx.local("c", "bool")
        self.emit(Alloc(tmp, a))
        self.emit(If(a if e.op == "and" else logic_not(a), Block(tuple(bb.stmts) + (Assign(tmp, b),))))
        return tmp

    def reduce(self, e):
        """An accumulator and a loop nest.  The domain of each axis may use the
        axes before it, so it is evaluated inside their loops."""
        dtype = e.body.dtype
        acc = self.ctx.local("acc", dtype)
        self.emit(Alloc(acc, _identity(e.op, dtype)))
        levels, doms, em = [], [], self
        for ax, (lo, ext) in zip(e.axes, e.doms):
            dom = (em.value(lo), em.value(ext))
            doms.append(dom)
            levels.append((em, ax, dom))
            em = em.child(em.scope.with_vars((ax,), (dom,)))
        v = em.value(e.body)
        outside = []
        if e.op == "sum" and dt.is_float(dtype) and all(isinstance(lo, Const) and isinstance(ext, Const)
                                                       and ext.value > 0 for lo, ext in doms):
            inner = [*em.stmts, *(s for outer, _, _ in levels if outer is not self for s in outer.stmts)]
            outside, v = _invariant_factors(v, set(e.axes) | _defined(inner))
        if e.op == "argmax":
            pos = self.ctx.local("pos", dt.INDEX)
            self.emit(Alloc(pos, const(0, dt.INDEX)))
            offset = _position(e.axes, doms)
            update = If(compare("gt", v, acc), Block((Assign(acc, v), Assign(pos, offset))))
            result = pos
        else:
            update = Assign(acc, cast(dtype, _COMBINE[e.op](acc, v)))
            result = acc
            for op, f in outside:
                result = binop(op, result, f)
        body = Block(tuple(em.stmts) + (update,))
        for outer, ax, (lo, ext) in reversed(levels):
            before = () if outer is self else tuple(outer.stmts)
            body = Block(before + (For(ax, lo, ext, body),))
        self.stmts += body.stmts
        return result


def _defined(stmts) -> set:
    """The locals that ``stmts`` allocate."""
    return {x.local for s in stmts for x in walk(s) if isinstance(x, Alloc)}


def _invariant_factors(v, bound: set):
    """``(outside, rest)``: ``v`` as a product (``*``, ``/``) split into
    ``outside``, ``(op, factor)`` pairs reading nothing in ``bound`` (a
    reduction's variables and the locals its loop defines), and the ``rest``
    the loop evaluates; ``([], v)`` unless both parts are non-empty.  The
    factors are applied after the loop, which has run (its domain is fixed
    and not empty) and so has made every check of a read they need.  A
    negation stays: a multiply-add negates for free (``fnmadd``)."""
    pairs = factors(v)
    outside = [(op, f) for op, f in pairs if free_leaves(f).isdisjoint(bound)]
    inside = [(op, f) for op, f in pairs if not free_leaves(f).isdisjoint(bound)]
    if not (inside and outside):
        return [], v
    return outside, product(inside, v.dtype)


class _NestedTooDeeply(Exception):
    """A stage's body nests more than :data:`MAX_NESTING` levels (:func:`_stage` names the tensor)."""


def _within(index, n: int, scope) -> bool:
    """Whether a data-dependent ``index`` is known to lie in ``[0, n)`` (it reads
    an inverse index, whose values are positions)."""
    lo, hi = bounds(index, scope)
    return lo is not None and hi is not None and 0 <= lo and hi < n


def _position(axes, doms):
    """Row-major position of ``axes`` within their domains, from 0."""
    out, stride = const(0, dt.INDEX), const(1, dt.INDEX)
    for ax, (lo, ext) in reversed(list(zip(axes, doms))):
        out = add(mul(sub(ax, lo), stride), out)
        stride = mul(stride, ext)
    return out


_RULES = {Select: _Emitter.select, Logic: _Emitter.logic, Reduce: _Emitter.reduce}


# --------------------------------------------------------------------- stages


def _stage(t, buf, ctx, step=None) -> Stage:
    """The stage computing ``t`` into ``buf``; with a :class:`TimeLoop`
    ``step``, only the slice of ``t`` at the loop's time (a scan's chain)."""
    ctx.time = None if step is None else step.var
    if is_keyed(t):
        return keyed_stage(t, buf, lambda e, doms: _evaluate(ctx, e, doms), ctx.local)
    expr, index, axes, shape, doms = t.body, _linear(t.axes, t.shape), t.axes, t.shape, {}
    if step is not None:
        at = {t.axes[0]: step.var}
        doms = {step.var: (const(step.lo, dt.INDEX), const(step.extent, dt.INDEX))}
        expr, index, axes, shape = substitute(expr, at), substitute(index, at), axes[1:], shape[1:]
    if not axes:
        axes, shape = (var("_", (0, 1)),), (1,)
    scope = Scope({**doms, **Scope.of_axes(axes, shape).doms})
    first_local = ctx.n_locals
    probe = _Emitter(ctx, scope)                    # finds the values used more than once
    try:
        probe.value(expr)
    except _NestedTooDeeply:
        raise ValueError(f"te.build: tensor '{t.name}' is nested too deeply to lower: te.if_then_else, "
                         f"and, or and reductions lower to nested blocks, {MAX_NESTING} levels at most; "
                         "compute the inner levels in a te.compute of their own") from None
    ctx.n_locals = first_local
    em = _Emitter(ctx, scope, shared=probe.reused)
    value = em.value(expr)
    body = Block(tuple(em.stmts) + (Store(buf, index, value),))
    for d in reversed(range(len(axes))):
        kind = "parallel" if d == 0 else "vectorize" if d == len(axes) - 1 else "serial"
        loop = For(axes[d], const(0, dt.INDEX), const(shape[d], dt.INDEX), body, kind)
        body = loop if d == 0 else Block((loop,))
    return Stage(buf.name, buf, body, step=step)


_DECIDE = {"lt": lambda lo, hi: (hi < 0, lo >= 0), "le": lambda lo, hi: (hi <= 0, lo > 0),
           "gt": lambda lo, hi: (lo > 0, hi <= 0), "ge": lambda lo, hi: (lo >= 0, hi < 0)}


def _fold_time_tests(e, time, scope):
    """``e`` with each comparison of the time alone that holds (or fails) at
    every step of the loop replaced by its value (the guards of a reverse
    scan's step that only exclude the initial steps cost nothing)."""
    def fold(node, new):
        if not (isinstance(new, Cmp) and new.op in _DECIDE and dt.is_int(new.a.dtype)
                and is_index_only(new) and free_vars(new) == {time}):
            return None
        lo, hi = bounds(sub(new.a, new.b), scope)
        if lo is None or hi is None:
            return None
        true, false = _DECIDE[new.op](lo, hi)
        return const(True, "bool") if true else const(False, "bool") if false else None
    return rewrite([e], fold)[0]


def _evaluate(ctx, e, doms: dict):
    """``(statements, value)`` computing ``e`` with the variables of ``doms`` in scope."""
    em = _Emitter(ctx, Scope(dict(doms)))
    value = em.value(e)
    return tuple(em.stmts), value


def _buffers(inputs, stored, outputs, taken=()) -> dict:
    """A uniquely named buffer for every input and every stored tensor (names
    in ``taken`` are in use)."""
    out, names = {}, set(taken)

    def make(t, kind):
        name, n = t.name, 1
        while name in names:
            name, n = f"{t.name}_{n}", n + 1
        names.add(name)
        out[t] = Buffer(name, t.shape, t.dtype, kind)

    for t in inputs:
        make(t, "input")
    outs = set(outputs)
    for t in stored:
        make(t, "output" if t in outs else "temp")
    return out


def _checked_form(checked: dict):
    """The lifted form of a tensor when its reads pass the bounds checks, else
    the tensor as written (memoised in ``checked``)."""
    def form(t):
        if t.is_placeholder:
            return t
        if t not in checked:
            lt = normal_form(t)
            if lt is not t:
                try:
                    check_tensor(lt)
                    for p in lt.inputs:
                        if is_lifted_part(p):
                            check_tensor(p)
                except IndexError:
                    lt = t
            checked[t] = lt
        return checked[t]
    return form


# ---------------------------------------------------------------------- scans


class _Nested:
    """The plan of a scan's step inside the program's plan: a tensor is
    recomputed when either plan recomputes it."""

    def __init__(self, inner: Plan, outer: Plan):
        self.inner, self.outer = inner, outer
        self.reducing = inner.reducing | outer.reducing

    def recomputed(self, t) -> bool:
        return self.inner.recomputed(t) or self.outer.recomputed(t)


def _steps_read(graph, outputs) -> dict:
    """For each scan in ``graph``, ``{n: steps}``: how many steps of its
    output ``n`` (``ScanOp.outputs``) the program reads: one past the latest
    time at which a tensor of the program or the step of another scan reads
    it, where that read executes (all steps when it is an output of the
    program or a read's time is not bounded), and a state at least one past
    the latest time its own step reads it (``t - 1`` while the step runs).
    A gradient reads its forward scan up to the second-to-last step, so the
    last is not run."""
    made = {t: (t.body.scan, t.body.which) for t in graph if _is_scan(t)}
    need = {op: {} for op, _ in made.values()}
    for t, (op, n) in made.items():
        need[op][n] = op.steps if t in outputs else op.k
    readers = [(t, None, None) for t in graph if not t.is_placeholder and not _is_scan(t)]
    readers += [(c, op, {c.axes[0]: (const(op.k, dt.INDEX), const(op.steps - op.k, dt.INDEX))})
                for op in need for c in op.chain]
    own = {op: {} for op in need}
    for t, within, doms in readers:
        for load, scope in reads(t, doms):
            op, n = made.get(load.tensor, (None, None))
            if within is not None and load.tensor in within.state:
                op, n = within, within.state.index(load.tensor)
            if op is None:
                continue
            hi = bounds(load.indices[0], scope)[1] if is_index_only(load.indices[0]) else None
            steps = op.steps if hi is None else min(hi + 1, op.steps)
            into = own[op] if op is within else need[op]
            into[n] = max(into.get(n, op.k), steps)
    for op, steps in need.items():      # a state its own step reads at t - j, while the step runs
        end = max(steps.values())
        for n, latest in own[op].items():
            steps[n] = max(steps.get(n, op.k), latest - (op.steps - end))
    return need


def _scan_stages(op, steps, ctx, store=frozenset(), recompute=frozenset()) -> list:
    """The stages of scan ``op`` (see ``te_autodiff/scan.py``): each state's
    initial steps copied into its result buffer, then one loop over the
    times its outputs are read (``steps``: :func:`_steps_read`), computing
    only what the outputs read after the initial steps need, whose stages
    compute one step of the chain, each stored chain tensor as
    a stage of its own (the updates write into the results' buffers, the
    chain tensors a gradient reads (``ScanOp.kept``) into theirs, the other
    stored ones into buffers over all steps); the store or recompute rule
    decides which other chain tensors are stored (``store``/``recompute``:
    its overrides).  The loop's stages are lowered once, whatever the
    number of steps."""
    results = dict(zip(op.state, op.results))
    chain = {}
    for c in op.chain:              # the states are read from the results
        def retarget(node, new):
            to = results.get(new.tensor) or chain.get(new.tensor) if isinstance(new, Load) else None
            return None if to is None else Load(to, new.indices)
        body = rewrite([c.body], retarget)[0]
        chain[c] = Tensor(c.name, c.shape, c.dtype, c.axes, body)
    stages = []
    for i, y in zip(op.init, op.results):               # result[t] = init[t] for t < k
        axes = tuple(var(f"i{d}", (0, n)) for d, n in enumerate(i.shape))
        copy = Tensor(y.name, i.shape, i.dtype, axes, Load(i, axes))
        stages.append(_stage(copy, ctx.buffers[y], ctx))
    produce = [chain[c] for c in op.update + op.outputs[len(op.state):]]      # output n's chain tensor
    reach = {c: steps.get(n, op.k) for n, c in enumerate(produce) if n < len(op.state) or n in steps}
    end = max(reach.values())
    if end == op.k:
        return stages
    t = var("t", (op.k, end - op.k))
    counter = Buffer(f"{op.name}.t", (1,), dt.INDEX, "temp")
    ctx.buffers[counter] = counter
    updates = [chain[u] for u in op.update]
    kept = {chain[op.outputs[y.body.which]]: buf for y, buf in ctx.buffers.items()    # read by a gradient
            if isinstance(y, Tensor) and _is_scan(y) and y.body.scan is op and y.body.which >= len(op.state)}
    plan = Plan(list(chain.values()), updates, store={chain[c] for c in op.chain if c in store} | set(kept),
                recompute={chain[c] for c in op.chain if c in recompute}, step=True)
    given = {**kept, **{u: ctx.buffers[y] for u, y in zip(updates, op.results)}}
    own = _buffers((), [c for c in plan.stored if c not in given], (), {b.name for b in ctx.buffers.values()})
    inner = _Context({**ctx.buffers, **own, **given}, _Nested(plan, ctx.plan), ctx.checks)
    for c in chain.values():        # every read of the step in range, at the times it runs
        check_tensor(c, {c.axes[0]: (const(op.k, dt.INDEX), const(op.steps - op.k, dt.INDEX))})
    step = TimeLoop(t, counter, op.k, end - op.k)
    wanted = _feeding({c for c, m in reach.items() if m > op.k}, set(chain.values()), set(plan.stored))
    stages += [_stage(c, inner.buffers[c], inner, step) for c in plan.stored if c in wanted]
    ctx.buffers.update(own)
    return stages


def _feeding(roots, chain: set, stored: set) -> set:
    """The tensors of ``stored`` that ``roots`` are or read through the chain."""
    out, stack, seen = set(), list(roots), set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in stored:
            out.add(t)
        stack += [p for p in t.inputs if p in chain]
    return out


def _read_by_a_scan(err: IndexError, t, order) -> IndexError:
    """``err`` (``t`` reads out of range), saying why when a scan's update
    chain reads ``t``: not reading the state, ``t`` is an ordinary tensor,
    computed at every time step, the initial ones included."""
    for op in dict.fromkeys(s.body.scan for s in order if _is_scan(s)):
        if t in op.reads:
            return IndexError(
                f"{err}. '{t.name}' is read by the update of scan '{op.name}' but does not read its state, "
                f"so it is an ordinary tensor computed at every step of its first axis, the scan's "
                f"{op.k} initial step(s) included: guard the read (te.if_then_else on the time axis) "
                f"or make the read inside a compute that reads the state")
    return err


def lower(inputs, outputs, name=None, *, store=(), recompute=()) -> Program:
    """The loop IR program computing ``outputs`` from the placeholders ``inputs``.

    ``store``/``recompute`` override the store-or-recompute rule (module doc)
    for the tensors they name."""
    inputs, outputs, order = validate(inputs, outputs)
    for t in order:
        if not t.is_placeholder:
            try:
                check_tensor(t)
            except IndexError as err:
                raise _read_by_a_scan(err, t, order) from None
    rep = share(outputs, _checked_form({}))
    results = [rep[o] for o in outputs]
    ops = {t.body.scan for t in set(rep.values()) if _is_scan(t)}
    in_steps = {op.source.get(c, c): c for op in ops for c in op.chain}      # the user's tensor: the step's
    store_set, recompute_set = _overrides({**in_steps, **rep}, set(results), store, recompute,
                                          {u for op in ops for u in op.update})
    from_user = {rep[t] for t in rep if not is_lifted_part(t)}
    parts = {rep[t] for t in rep if is_lifted_part(t)} - from_user
    graph = tensors_in_order(results)
    plan = Plan(graph, results, store_set, recompute_set, parts)
    scaled = scale_reads(graph, set(plan.stored), set(results) | store_set)
    if scaled:                                      # a view's reads inside sums read what it scales
        results = [scaled.get(t, t) for t in results]
        store_set, recompute_set, parts = ({scaled.get(t, t) for t in s} for s in (store_set, recompute_set, parts))
        graph = tensors_in_order(results)
        plan = Plan(graph, results, store_set, recompute_set, parts)
    # every state of a scan gets a buffer, read or not
    states = [y for t in plan.stored if _is_scan(t) for y in t.body.scan.results if y not in plan.stored]
    buffers = _buffers(inputs, plan.stored + list(dict.fromkeys(states)), results)
    ctx = _Context(buffers, plan, {})
    stages, scans, steps = [], set(), _steps_read(graph, set(results))
    for t in plan.stored:
        if not math.prod(t.shape):                  # empty: nothing to do
            continue
        if not _is_scan(t):
            stages.append(_stage(t, buffers[t], ctx))
        elif t.body.scan not in scans:
            scans.add(t.body.scan)
            stages += _scan_stages(t.body.scan, steps[t.body.scan], ctx, store_set, recompute_set)
    checks = tuple(key for key, _ in sorted(ctx.checks.items(), key=lambda kv: kv[1]))
    program = Program(name or outputs[0].name, tuple(buffers.values()), tuple(stages),
                      tuple(buffers[t] for t in results), checks)
    return program
