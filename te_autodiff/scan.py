"""``te.scan``: recurrences over time, and their adjoint (a reverse scan).

**Forward** (TVM's form).  A scan has states ``S_n``: placeholders whose
first axis is time (``T`` steps), initial values ``init_n`` (the first ``k``
steps, ``k = init_n.shape[0]``) and updates ``update_n`` (every later step).
Its *chain* is the updates and every tensor that reads a state, directly or
through another one.  A chain tensor's first axis is time: step ``t``
computes its slice ``t`` from the states at earlier times (``t - 1 ... t -
k``) and from slices ``t`` of the chain.  Everything else the chain reads is
*external* (weights, sequence inputs, other scans).  Result ``n`` holds
every step: ``Y_n[t] = init_n[t]`` for ``t < k``, then ``update_n[t]`` with
every state ``S_m`` read as ``Y_m``.  ``lowering/scan_stages.py`` runs the
step as a loop over time.

**Adjoint.**  With ``G`` the adjoint of ``Y`` from the scan's readers, the
adjoint of the state at time ``t`` is ``G[t]`` plus what each later step
that read ``Y[t]`` sends back:

    λ[t] = G[t] + Σ_j (∂update[t + j] / ∂S[t])ᵀ λ[t + j]

a recurrence backward in time, so a scan over ``u = T - 1 - t`` whose state
is ``R[u] = λ[T - 1 - u]``, starting at ``R[0] = G[T - 1]`` (nothing reads
the last step).  Its step is the vector-Jacobian product of one forward
step, taken from ``te.gradient`` of the chain *restricted* to the steps the
updates compute (time ``t' = t - k`` over ``T - k`` steps, where every read
is in range), with a placeholder head ``H[t'] = λ[t' + k]`` that becomes a
read of the reverse state.  The forward values it needs are read from the
scan's result (a state as ``Y``, an update as its slice of ``Y``) or from
chain tensors recomputed from ``Y``, which the lowering stores or inlines by
its usual rule.  Then the adjoint of ``init_n`` is ``λ_n[t]`` for ``t < k``,
and that of an external tensor is its gradient from the same ``te.gradient``
call with ``H`` read from ``R``: the sum over all steps, computed after the
reverse scan (one large reduction rather than one per step) - or, for an
external each step reads element by element, summed as the reverse scan
runs (an extra state: nothing of every step is kept for it).  The reverse
scan is a scan like any other, so it can be differentiated again.
"""
from __future__ import annotations

import math

from . import dtype as dt
from .expr import (BinOp, Const, InverseIndex, Load, MatchSum, Reduce, ScanState, Select, all_, const, is_const,
                   select, var)
from .gradient import gradient, register_adjoint
from .graph import tensors_in_order
from .sharing import canonical_body
from .tensor import Tensor, check_name, compute, placeholder, reduce_axis, sum as te_sum
from .visit import rewrite, substitute, topo_order


class ScanOp:
    """One scan (module doc): ``init``, ``update``, ``state`` (tuples, one per
    state), ``k`` initial steps of ``steps`` in all, the ``chain`` (producers
    first), the ``external`` tensors its results read (initial values, then
    what the chain reads besides states and itself: ``reads``) and the
    ``results``, one tensor per state.  ``kept(c)`` is chain tensor ``c``
    over every step, as the scan computed it (a gradient reads it instead of
    recomputing it); ``outputs`` lists what a :class:`ScanState` can name.
    ``internal`` scans (the adjoint's) skip the user-level read checks."""

    __slots__ = ("name", "init", "update", "state", "inputs", "k", "steps", "chain", "reads", "external",
                 "outputs", "results", "source", "_kept", "__weakref__")

    def __init__(self, name, init, update, state, inputs=(), internal=False, source=None):
        self.name, self.init, self.update, self.state, self.inputs = name, init, update, state, inputs
        self.source = source or {}          # a chain tensor rebuilt by reading(): the user's tensor
        self.k, self.steps = init[0].shape[0], state[0].shape[0]
        order = tensors_in_order(list(update))
        reaches = set(state)
        for t in order:
            if any(p in reaches for p in t.inputs):
                reaches.add(t)
        self.chain = tuple(t for t in order if (t in reaches or t in update) and t not in state)
        members = set(self.chain) | set(state)
        self.reads = tuple(dict.fromkeys(p for c in self.chain for p in c.inputs if p not in members))
        self.external = tuple(dict.fromkeys(self.init + self.reads))
        _validate(self, internal)
        self.outputs = state + self.chain            # what ScanState(self, which) can name
        names = [name] if len(state) == 1 else [f"{name}.{s.name}" for s in state]
        self.results = tuple(self._output(n, nm) for n, nm in enumerate(names))
        self._kept = {}

    def _output(self, which: int, name: str) -> Tensor:
        like = self.outputs[which]
        axes = tuple(var("t" if d == 0 else f"i{d}", (0, n)) for d, n in enumerate(like.shape))
        return Tensor(name, like.shape, like.dtype, axes, ScanState(self, which))

    def output(self, which: int) -> Tensor:
        """The tensor of output ``which``: a state's result, or past them :meth:`kept`."""
        return self.results[which] if which < len(self.state) else self.kept(self.outputs[which])

    def kept(self, c: Tensor) -> Tensor:
        """Chain tensor ``c`` as the scan computes it, stored over every step
        (its slices before step ``k`` are never computed: read only later ones)."""
        if c not in self._kept:
            self._kept[c] = self._output(self.outputs.index(c), f"{self.name}.{c.name}")
        return self._kept[c]

    def reading(self, new_of) -> "ScanOp":
        """This scan reading ``new_of(x)`` for each external tensor ``x`` (itself when none changes)."""
        if all(new_of(x) is x for x in self.external):
            return self
        chain = {}
        for c in self.chain:
            def retarget(node, new):
                if not isinstance(new, Load) or new.tensor in self.state:
                    return None
                return Load(chain.get(new.tensor) or new_of(new.tensor), new.indices)
            body = rewrite([c.body], retarget)[0]
            chain[c] = Tensor(c.name, c.shape, c.dtype, c.axes, body)
        return ScanOp(self.name, tuple(new_of(i) for i in self.init), tuple(chain[u] for u in self.update),
                      self.state, self.inputs, internal=True,
                      source={chain[c]: self.source.get(c, c) for c in self.chain})

    def __repr__(self):
        return f"<ScanOp {self.name}: {len(self.state)} state(s), steps {self.k}..{self.steps}>"


def scan(init, update, state, inputs=None, name=None):
    """``te.scan``: the recurrence ``state[t] = update[t]`` for ``t >= k``, from
    ``state[t] = init[t]`` for ``t < k`` (``k = init.shape[0]``); see the
    module doc.  ``update`` reads the state only at earlier times.  Lists of
    equal length give several states and return a list of results; each
    result holds every time step."""
    name = check_name(name or "scan", "te.scan")
    several = isinstance(state, (list, tuple))
    parts = []
    for what, value in (("init", init), ("update", update), ("state", state)):
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if isinstance(value, (list, tuple)) != several:
            raise TypeError(f"te.scan '{name}': init, update and state must all be tensors or all lists")
        for x in items:
            if not isinstance(x, Tensor):
                raise TypeError(f"te.scan '{name}': {what} must be te tensors, got {type(x).__name__}")
        parts.append(tuple(items))
    if not (len(parts[0]) == len(parts[1]) == len(parts[2]) >= 1):
        raise ValueError(f"te.scan '{name}': init, update and state must be lists of the same (non-zero) "
                         f"length, got {len(parts[0])}, {len(parts[1])} and {len(parts[2])}")
    seq = list(inputs) if isinstance(inputs, (list, tuple)) else [] if inputs is None else [inputs]
    for x in seq:
        if not isinstance(x, Tensor):
            raise TypeError(f"te.scan '{name}': inputs must be te tensors, got {type(x).__name__}")
    _check_parts(name, *parts)
    results = ScanOp(name, *parts, tuple(seq)).results
    return list(results) if several else results[0]


def _check_parts(name, init, update, state):
    """Shapes, dtypes and kinds of the arguments, with the user's names."""
    if len(set(state)) != len(state):
        raise ValueError(f"te.scan '{name}': a state placeholder is listed twice")
    steps = state[0].shape[0] if state[0].ndim else None
    for i, u, s in zip(init, update, state):
        if not s.is_placeholder:
            raise TypeError(f"te.scan '{name}': state '{s.name}' must be a te.placeholder (its first axis is time)")
        if s.ndim == 0:
            raise ValueError(f"te.scan '{name}': state '{s.name}' has no axes; its first axis is time")
        if s.shape[0] != steps:
            raise ValueError(f"te.scan '{name}': state '{s.name}' has {s.shape[0]} time steps, "
                             f"state '{state[0].name}' has {steps}")
        if u.is_placeholder:
            raise TypeError(f"te.scan '{name}': update '{u.name}' must be a te.compute")
        if u.shape != s.shape:
            raise ValueError(f"te.scan '{name}': update '{u.name}' has shape {u.shape}, "
                             f"state '{s.name}' has shape {s.shape}")
        if i.ndim != s.ndim or i.shape[1:] != s.shape[1:] or not 1 <= i.shape[0] <= s.shape[0]:
            raise ValueError(f"te.scan '{name}': init '{i.name}' has shape {i.shape}; it must be "
                             f"(k,) + {s.shape[1:]} with 1 <= k <= {s.shape[0]} (the first k steps)")
        if i.shape[0] != init[0].shape[0]:
            raise ValueError(f"te.scan '{name}': init '{i.name}' gives {i.shape[0]} steps, "
                             f"init '{init[0].name}' gives {init[0].shape[0]}")
        for x in (i, u):
            if x.dtype != s.dtype:
                raise TypeError(f"te.scan '{name}': '{x.name}' has dtype {x.dtype}, "
                                f"state '{s.name}' has dtype {s.dtype}")


def _time_offset(index, t):
    """``c`` when ``index`` is ``t - c`` for an integer constant ``c``, else None."""
    at0, at1 = (substitute(index, {t: const(v, dt.INDEX)}) for v in (0, 1))
    if isinstance(at0, Const) and isinstance(at1, Const) and at1.value - at0.value == 1:
        return -at0.value
    return None


def _validate(op: ScanOp, internal: bool):
    """Every chain tensor is indexed by time first and reads the states only at
    earlier steps (``t - 1 ... t - k``) and the chain at its own step (the
    reverse scans the adjoint builds, ``internal``, also read earlier slices
    of the chain and states beyond ``t - k`` under guards)."""
    from .pretty import expr_str
    states, chain = set(op.state), set(op.chain)
    for c in op.chain:
        if c.shape[:1] != (op.steps,):
            raise ValueError(f"te.scan '{op.name}': '{c.name}' reads the state, so its first axis must be "
                             f"time ({op.steps} steps), but its shape is {c.shape}")
        if any(isinstance(p.body, ScanState) for p in c.inputs if p in chain):
            raise NotImplementedError(f"te.scan '{op.name}': a scan inside the step of another scan "
                                      "(its initial value or update reads the outer state)")
        for load in (n for n in topo_order([c.body]) if isinstance(n, Load)):
            if load.tensor not in states and load.tensor not in chain:
                continue
            off = _time_offset(load.indices[0], c.axes[0])
            first, last = (1, None if internal else op.k) if load.tensor in states else (0, None if internal else 0)
            if off is None or off < first or (last is not None and off > last):
                allowed = (f"t - 1 ... t - {op.k}" if load.tensor in states else
                           "t, its own step (make a value needed later a state)")
                raise ValueError(
                    f"te.scan '{op.name}': '{c.name}' reads '{load.tensor.name}' at time "
                    f"{expr_str(load.indices[0])} (t = '{c.axes[0].name}'); a step may read "
                    f"{'state' if load.tensor in states else 'the intermediate'} "
                    f"'{load.tensor.name}' only at {allowed}")
    for i in op.init:
        if i in chain or any(p in states or p in chain for p in tensors_in_order([i])):
            raise ValueError(f"te.scan '{op.name}': init '{i.name}' reads the state")


# ----------------------------------------------------------------- adjoint


def _restricted(op: ScanOp, stand_in: dict) -> dict:
    """``{chain tensor: the same over the steps the updates compute}``: time
    ``t' = t - k`` runs over ``[0, T - k)``, so every read is in range; an
    external tensor ``x`` is read as ``stand_in[x]``."""
    k, new = op.k, {}
    for c in op.chain:
        t0 = c.axes[0]
        tp = var(t0.name, (0, op.steps - k))

        def shift(node, rebuilt):
            if isinstance(node, Load) and node.tensor in new:
                return Load(new[node.tensor], (rebuilt.indices[0] - k,) + rebuilt.indices[1:])
            if isinstance(node, Load) and node.tensor in stand_in:
                return Load(stand_in[node.tensor], rebuilt.indices)
            return None
        body = substitute(rewrite([c.body], shift)[0], {t0: tp + k})
        new[c] = Tensor(c.name, (op.steps - k,) + c.shape[1:], c.dtype, (tp,) + c.axes[1:], body)
    return new


def _depends(order, sources) -> set:
    """The tensors of ``order`` (producers first) that read ``sources``, directly or not."""
    out = set(sources)
    for t in order:
        if any(p in out for p in t.inputs):
            out.add(t)
    return out - set(sources)


def _reread(e, loads: dict):
    """``e`` with each read of a tensor in ``loads`` replaced by ``loads[tensor](indices)``."""
    def fix(node, rebuilt):
        if isinstance(node, Load) and node.tensor in loads:
            return loads[node.tensor](rebuilt.indices)
        return None
    return rewrite([e], fix)[0]


def _rebuilt(t: Tensor, loads: dict, axis0=None):
    """``t``'s body read through ``loads`` (:func:`_reread`), its first axis
    replaced by ``axis0`` (if given)."""
    body = _reread(t.body, loads)
    return body if axis0 is None else substitute(body, {t.axes[0]: axis0})


def _reduces(t: Tensor) -> bool:
    return any(isinstance(n, Reduce) for n in topo_order([t.body]))


def _reader(tensor, first=None):
    """``indices -> tensor[first(i0), i1, ...]`` (``tensor[indices]`` without ``first``)."""
    if first is None:
        return lambda ix: Load(tensor, tuple(ix))
    return lambda ix: Load(tensor, (first(ix[0]),) + tuple(ix[1:]))


class _Adjoint:
    """The adjoint of one scan for the adjoints ``heads`` of its results
    (module doc): ``of(x)`` for its initial values and external tensors."""

    def __init__(self, op: ScanOp, heads, optimize: bool, kept_heads=None):
        self.op, self.heads = op, list(heads)
        T, k, kept_heads = op.steps, op.k, kept_heads or {}
        self.grads, self.carried = {}, {}
        if T == k:              # no update step: the result is the initial values
            self.rev = None
            return
        # the external tensors are leaves of the step: stand-in placeholders,
        # so that each one's adjoint is its own partial derivative (a weight
        # read by the step and by a scan the step reads is not counted twice)
        stand_in = {x: placeholder(x.shape, x.dtype, x.name) for x in op.reads}
        chain = _restricted(op, stand_in)
        self.H = [placeholder((T - k,) + s.shape[1:], s.dtype, f"d{y.name}") for s, y in zip(op.state, op.results)]

        # heads: H for the updates, and the adjoints of kept chain tensors
        # (read by a gradient being differentiated again) at their steps
        pairs = [(h, chain[u], lambda i: i) for h, u in zip(self.H, op.update)]
        pairs += [(g, chain[c], lambda i: i + k) for c, g in kept_heads.items()]

        def loss():
            total = None
            for h, c, at in pairs:
                axes = [reduce_axis(n, f"r{d}") for d, n in enumerate(c.shape)]
                term = te_sum(h[(at(axes[0]),) + tuple(axes[1:])] * c[tuple(axes)], axis=axes)
                total = term if total is None else total + term
            return total
        wanted = list(op.state) + [x for x in op.reads if dt.is_float(x.dtype)]
        grads = gradient(compute((), loss, name=f"{op.name}.vjp"), [stand_in.get(x, x) for x in wanted],
                         optimize=optimize)
        self.grads = dict(zip(wanted, grads))
        self.order = tensors_in_order(grads)
        self.hdep = _depends(self.order, self.H)
        # forward values: a state is read from the result, an update as its
        # slice of the result; other chain tensors are recomputed from those
        self.loads = {s: _reader(y) for s, y in zip(op.state, op.results)}
        self.loads.update({p: _reader(x) for x, p in stand_in.items()})
        self.loads.update({chain[u]: _reader(y, lambda i: i + k) for u, y in zip(op.update, op.results)})
        self.replay = {}
        forward = {c2: c for c, c2 in chain.items()}
        for t in self.order:
            if t not in self.hdep and t not in self.loads and not t.is_placeholder:
                if t in forward and _reduces(forward[t]):
                    # a reduction is stored (the lowering's rule): the forward scan keeps it
                    self.loads[t] = _reader(op.kept(forward[t]), lambda i: i + k)
                    continue
                body = _rebuilt(t, self.loads)
                if body is not t.body:
                    self.replay[t] = Tensor(t.name, t.shape, t.dtype, t.axes, body)
                    self.loads[t] = _reader(self.replay[t])
        self.rev = self._reverse_scan()

    def _reverse_scan(self) -> list:
        """The reverse scan's results ``R_n`` (``R_n[u] = λ_n[T - 1 - u]``)."""
        op, T, k = self.op, self.op.steps, self.op.k
        P = [placeholder(s.shape, s.dtype, f"adj_{s.name}") for s in op.state]
        dS = [self.grads[s] for s in op.state]
        loads = dict(self.loads)
        loads.update({h: _reader(p, lambda i: (T - 1 - k) - i) for h, p in zip(self.H, P)})
        back = {}
        for t in tensors_in_order(dS):
            if t not in self.hdep and t not in dS:
                continue
            u = var("u", (0, T))
            if t in dS:             # forward time τ = T - 1 - u
                body = _rebuilt(t, loads, (T - 1) - u)
                first = lambda i: (T - 1) - i       # noqa: E731
            else:                   # an adjoint in the restricted chain: step t' = T - k - u
                if t.shape[:1] != (T - k,):
                    raise NotImplementedError(f"te.gradient through scan '{op.name}': the step's adjoint "
                                              f"'{t.name}' is not indexed by time")
                body = select(all_(u >= 1, u <= T - k), _rebuilt(t, loads, (T - k) - u), const(0, t.dtype))
                first = lambda i: (T - k) - i       # noqa: E731
            back[t] = Tensor(t.name, (T,) + t.shape[1:], t.dtype, (u,) + t.axes[1:], body)
            loads[t] = _reader(back[t], first)
        init = [compute((1,) + g.shape[1:], lambda _, *i, g=g: g[(T - 1,) + i], name=f"{g.name}.last")
                for g in self.heads]
        update = [compute(s.shape, lambda u, *i, g=g, d=back[d]: g[((T - 1) - u,) + i] + d[(u,) + i],
                          name=f"{g.name}.step")
                  for s, g, d in zip(op.state, self.heads, dS)]
        # an external whose every step adds an element-wise term is summed as
        # the reverse scan runs: an extra state, its own running total
        for x in op.reads:
            term = self._step_term(x, back, loads) if x in self.grads else None
            if term is not None:
                acc = placeholder((T,) + x.shape, x.dtype, f"d{x.name}.acc")
                init.append(compute((1,) + x.shape, lambda *_, x=x: const(0, x.dtype), name=f"d{x.name}.none"))
                update.append(compute(acc.shape, lambda u, *i, acc=acc, term=term: acc[(u - 1,) + i] + term(u, i),
                                      name=f"d{x.name}.sum"))
                P.append(acc)
                self.carried[x] = len(P) - 1
        # the step's adjoints that the gradients of the other external tensors
        # read (the adjoint of a pre-activation, read by a weight's gradient)
        # are kept: extra states of the reverse scan, each its own update
        # (an outside adjoint equal to one of the step's, such as the two
        # summands of a pre-activation, is read from it too)
        same = {(t.shape, t.dtype, canonical_body(t)): t for t in back if t not in dS}
        self.alias, outside = {}, []
        for t in tensors_in_order([self.grads[x] for x in self.grads if x not in op.state and x not in self.carried]):
            if t in back:
                continue
            twin = same.get((t.shape, t.dtype, canonical_body(t))) if t in self.hdep else None
            if twin is None:
                outside.append(t)
            else:
                self.alias[t] = twin
        self.saved = list(dict.fromkeys(self.alias.get(p, p) for t in outside for p in t.inputs
                                        if self.alias.get(p, p) in back and p not in dS))
        for t in self.saved:
            init.append(compute((1,) + t.shape[1:], lambda *_, t=t: const(0, t.dtype), name=f"{t.name}.none"))
            update.append(back[t])
            P.append(placeholder(back[t].shape, t.dtype, f"{t.name}.saved"))
        try:
            results = ScanOp(f"{op.name}.back", tuple(init), tuple(update), tuple(P), internal=True).results
        except ValueError as e:
            raise NotImplementedError(f"te.gradient through scan '{op.name}': the adjoint of one step is not "
                                      f"the step of a reverse scan ({e}); te.gradient(..., optimize=False) "
                                      "does not go through scans") from e
        self.kept = dict(zip(self.saved, results[len(op.state) + len(self.carried):]))
        self.kept.update({t: self.kept[twin] for t, twin in self.alias.items() if twin in self.kept})
        self.carried = {x: results[n] for x, n in self.carried.items()}
        return list(results[:len(op.state)])

    def _step_term(self, x: Tensor, back: dict, loads: dict):
        """``(u, i) -> `` what reverse step ``u`` adds to the adjoint of
        external ``x`` at ``i``, or None when its gradient is not a sum over
        the steps of element-wise terms.  Its gradient is linear in the
        step's adjoints (``back``): sums, selects on ``i`` and factors that
        do not read them, around terms that read them at one restricted step
        ``t'``, in a sum over ``t'`` alone or at a constant ``t'`` (a sum of
        one step, folded).  Carried, a term costs one pass over ``x`` per step
        instead of keeping what it reads for a reduction over time after the
        scan; so only an ``x`` no larger than a step's slice of what it reads
        is carried (a weight's outer product per step is not)."""
        g = self.grads[x]
        while isinstance(g.body, Load) and g.body.indices == g.axes and g.body.tensor.shape == g.shape:
            g = g.body.tensor
        if g not in self.hdep:
            return None
        T, k = self.op.steps, self.op.k
        slices = [0]

        def reads(e):
            return [n for n in topo_order([e]) if isinstance(n, (Reduce, InverseIndex, MatchSum))
                    or isinstance(n, Load) and n.tensor in self.hdep]

        def at_step(e, r, lo, ext):
            """``e`` (reading the step's adjoints at ``r`` only), at step ``tp``."""
            found = reads(e)
            if not found or any(not isinstance(n, Load) or n.tensor not in back or n.indices[0] is not r
                                for n in found):
                return None
            slices.append(max(math.prod(n.tensor.shape[1:]) for n in found))
            return lambda tp: select(all_(tp >= lo, tp < lo + ext), substitute(e, {r: tp}), const(0, e.dtype))

        def per_step(e):
            """``tp -> `` the share of step ``tp`` in ``e``, or None."""
            if not reads(e):
                return (lambda tp: e) if is_const(e, 0) else None
            if isinstance(e, BinOp) and e.op == "mul" and not (reads(e.a) and reads(e.b)):
                factor, other = (e.a, e.b) if not reads(e.a) else (e.b, e.a)
                part = per_step(other)
                return None if part is None else lambda tp: factor * part(tp)
            if isinstance(e, BinOp) and e.op in ("add", "sub"):
                a, b = per_step(e.a), per_step(e.b)
                if a is None or b is None:
                    return None
                return (lambda tp: a(tp) + b(tp)) if e.op == "add" else (lambda tp: a(tp) - b(tp))
            if isinstance(e, Select) and not reads(e.cond):
                a, b = per_step(e.a), per_step(e.b)
                return None if a is None or b is None else lambda tp: select(e.cond, a(tp), b(tp))
            if isinstance(e, Reduce):
                return at_step(e.body, e.axes[0], *e.doms[0]) if e.op == "sum" and len(e.axes) == 1 else None
            times = {n.indices[0] for n in reads(e) if isinstance(n, Load)}
            if len(times) != 1 or not isinstance(next(iter(times)), Const):
                return None
            c = next(iter(times))           # one step, at a constant: read it at the step it is added
            r = var("t", (0, T - k))
            moved = rewrite([e], lambda n, new: Load(n.tensor, (r,) + new.indices[1:])
                            if isinstance(n, Load) and n.tensor in back else None)[0]
            return at_step(moved, r, c, const(1, dt.INDEX))

        share = per_step(g.body)
        if share is None or math.prod(x.shape) > max(slices):
            return None

        def term(u, i):
            tp = (T - k) - u
            body = substitute(share(tp), dict(zip(g.axes, i)))
            return select(all_(u >= 1, u <= T - k), _reread(body, loads), const(0, g.dtype))
        return term

    def _outside(self, g: Tensor) -> Tensor:
        """Gradient-graph tensor ``g`` reading the reverse scan's results for ``H``."""
        if g not in self.hdep:
            return self.replay.get(g, g)
        T, k = self.op.steps, self.op.k
        loads = dict(self.loads)
        loads.update({h: _reader(r, lambda i: (T - 1 - k) - i) for h, r in zip(self.H, self.rev)})
        new, scans = dict(self.replay), {}
        for t in tensors_in_order([g]):
            if t not in self.hdep:
                continue
            if t in self.kept:                  # step t' was kept at reverse step T - k - t'
                new[t] = compute(t.shape, lambda tp, *i, r=self.kept[t]: r[((T - k) - tp,) + i], name=t.name)
            elif isinstance(t.body, ScanState):   # a scan reading H (through its externals)
                op = t.body.scan
                if op not in scans:
                    scans[op] = op.reading(lambda x: new.get(x, x))
                new[t] = scans[op].output(t.body.which)
            else:
                new[t] = Tensor(t.name, t.shape, t.dtype, t.axes, _rebuilt(t, loads))
            loads[t] = _reader(new[t])
        return new[g]

    def of(self, x: Tensor):
        """The adjoint of ``x`` (an initial value or external tensor of the scan), or None."""
        T, parts = self.op.steps, []
        for i, g, r in zip(self.op.init, self.heads, self.rev or self.heads):
            if i is x:              # λ[t] for t < k
                at = (lambda t: (T - 1) - t) if self.rev else (lambda t: t)
                parts.append(compute(x.shape, lambda t, *j, r=r, at=at: r[(at(t),) + j], name=f"d{x.name}"))
        if x in self.carried:
            parts.append(compute(x.shape, lambda *j, r=self.carried[x]: r[(self.op.steps - 1,) + j], name=f"d{x.name}"))
        elif x in self.grads:
            parts.append(self._outside(self.grads[x]))
        if len(parts) < 2:
            return parts[0] if parts else None
        return compute(x.shape, lambda *j: parts[0][j] + parts[1][j], name=f"d{x.name}")


def scan_adjoint(op: ScanOp, heads, optimize: bool = True, kept_heads=None) -> _Adjoint:
    """The adjoint of ``op`` given the adjoints ``heads`` of its results
    (tensors of the results' shapes) and ``kept_heads``, those of the chain
    tensors it kept (``{chain tensor: adjoint of op.kept(it)}``); ``.of(x)``
    gives the adjoint of each tensor the scan reads."""
    return _Adjoint(op, heads, optimize, kept_heads)


register_adjoint(ScanOp, scan_adjoint)
