"""``te.gradient``: adjoints composed over the tensor graph.

For every tensor ``X`` on a path from the inputs to the output, in reverse
topological order, the adjoint is gathered from its consumers ``T``:

    adjoint(X)[j] = Σ_T Σ_{reads X[idx] in T}  Σ_{i, k}  adjoint(T)[i] · ∂T[i]/∂X[idx](i, k) · [j == idx(i, k)]

Each inner sum is one :class:`~te_autodiff.term.Term`; the Jacobian is never
materialised.  ``optimize=True`` hands each term to zero elimination, which
rewrites the sum over its non-zero region; ``optimize=False`` keeps the
literal sum, the reference the optimised form is tested against.

A tensor computed by a compound operation (a scan's states) is not a sum of
terms: its operation registers how its adjoint is made
(:func:`register_adjoint`), so this module knows no such operation.
"""
from __future__ import annotations

from . import dtype as dt
from .derivative import differentiable, load_adjoints, peel_guards, reduction_seed
from .expr import (Cmp, Const, Load, MatchSum, Reduce, ScanState, Select, Var, add, all_, cast, const, is_const,
                   logic_not, select)
from .graph import tensors_in_order
from .lift import lifted
from .shift_invariance import cut_edges
from .tensor import Tensor, compute
from .term import Term, fresh_copy, naive, read_guards
from .visit import conjuncts, substitute


_COMPOUND = {}          # operation type -> make(op, heads, optimize, kept_heads), see register_adjoint


def register_adjoint(op_type, make) -> None:
    """Adjoints of the operations of ``op_type`` (the ``.scan`` of a
    :class:`~te_autodiff.expr.ScanState`) come from ``make(op, heads,
    optimize, kept_heads)``, whose ``.of(x)`` is the adjoint of each tensor
    the operation reads (None where it reads none)."""
    _COMPOUND[op_type] = make


def gradient(output, inputs, head=None, optimize=True) -> list:
    """``te.gradient``: the adjoint of each tensor of ``inputs`` for ``output``.

    ``head`` (the output's shape) weights the output elements: the result is
    the vector-Jacobian product ``head · J``; ``None`` means all ones, the
    gradient of ``sum(output)``.  Returns one tensor per input, with that
    input's shape and dtype.
    """
    _check_tensor(output, "output")
    check_optimize(optimize, "te.gradient")
    try:
        inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    except TypeError:
        raise TypeError(f"te.gradient: inputs must be a te tensor or a list of them, "
                        f"got {type(inputs).__name__}") from None
    for n, x in enumerate(inputs):
        _check_tensor(x, f"inputs[{n}]")
    if head is not None:
        _check_tensor(head, "head")
        if head.shape != output.shape:
            raise ValueError(f"te.gradient: head '{head.name}' has shape {head.shape} but output "
                             f"'{output.name}' has shape {output.shape}")
    adj = _Adjoints(output, inputs, head, optimize)
    return [adj.of(x) for x in inputs]


def _check_tensor(t, what):
    if not isinstance(t, Tensor):
        raise TypeError(f"te.gradient: {what} must be a te tensor, got {type(t).__name__}")


def check_optimize(optimize, who: str):
    """``optimize`` must be a bool: a string such as "no" would count as true."""
    if not isinstance(optimize, bool):
        raise TypeError(f"{who}: optimize must be True or False, got {optimize!r}")


def tensor_terms(t: Tensor, x: Tensor, outer: tuple, head_at, at=None, cut=frozenset()) -> list:
    """The terms of ``∂t/∂x`` weighted by ``head_at(i)``, for result variables ``outer``.

    With ``at=None`` the terms sum over ``t``'s axes (a gradient); otherwise
    ``t``'s axes are bound to the variables ``at`` (a Jacobian row).  Reverse
    mode sends nothing along the edges of ``t``'s element body in ``cut``.
    """
    lt = lifted(t)
    if isinstance(lt.body, MatchSum):       # a sum over matches: a reduction with a condition
        lt = Tensor(lt.name, lt.shape, lt.dtype, lt.axes, lt.body.as_reduce())
    body, seed, red_axes, red_doms = lt.body, const(1, t.dtype), (), ()
    if isinstance(body, Reduce):
        seed, red_axes, red_doms = reduction_seed(lt), body.axes, body.doms
        body = body.body
    summed = red_axes if at is not None else tuple(lt.axes) + red_axes
    doms = tuple(red_doms) if at is not None else tuple(
        (const(0, dt.INDEX), const(s, dt.INDEX)) for s in t.shape) + tuple(red_doms)
    # the derivative refers to the value of t itself (exp, tanh, sigmoid...):
    # read it from t instead of recomputing it
    stored = {body: t[lt.axes]} if body is lt.body and not isinstance(body, (Load, Const, Var)) else {}
    terms = []
    for load, coef in load_adjoints(body, seed, {x}, cut).items():
        # the read's guard outermost, kept also where the stored value stands for
        # the whole guarded expression, after the conditions that keep the
        # data reads in its indices in range: the indices may be defined only
        # where they hold (a key read from data), and zero elimination and the
        # naive sum test them before the indices
        guard, _ = peel_guards(coef)
        value = _times_head(head_at(lt.axes), peel_guards(substitute(coef, stored))[1])
        conds = read_guards(load.indices) + ([guard] if guard is not None else [])
        if conds:
            value = select(all_(*conds), value, const(0, value.dtype))
        rename = fresh_copy(summed)
        if at is not None:
            rename.update(zip(lt.axes, at))
        terms.append(Term(outer,
                          tuple(substitute(i, rename) for i in load.indices),
                          substitute(value, rename),
                          tuple(rename[a] for a in summed),
                          tuple(tuple(substitute(e, rename) for e in dom) for dom in doms)))
    return terms


def combine(terms, dtype, optimize: bool):
    """The sum of ``terms``, each rewritten by zero elimination when ``optimize``."""
    if optimize:
        from .zero_elim import gather
        parts = [gather(term) for term in terms]
    else:
        parts = [naive(term) for term in terms]
    total = const(0, dtype)
    for p in parts:
        total = add(total, cast(dtype, p))
    return total


class _Adjoints:
    """Adjoint tensors of one ``te.gradient`` call, built on demand, memoised."""

    def __init__(self, output, inputs, head, optimize):
        self.output, self.head, self.optimize = output, head, optimize
        self.memo = {}
        self.scans = {}
        self.users = {}
        wanted = set(inputs)
        # live: tensors of the lifted graph through which a wanted input reaches the output
        self.live = set()
        order = tensors_in_order([output], lambda t: lifted(t).inputs)
        for t in order:
            for p in lifted(t).inputs:
                self.users.setdefault(p, []).append(t)
            if t in wanted or (differentiable(t) and any(p in self.live for p in lifted(t).inputs)):
                self.live.add(t)
        # edges whose contributions cancel exactly (a + log(sum exp(b - a)) does not depend on a)
        self.cuts = cut_edges(order, self.users)
        # consumers before producers: each adjoint finds its consumers' ready,
        # so a long pipeline needs no deep recursion
        for t in reversed(order):
            if t in self.live:
                self.of(t)

    def of(self, x: Tensor) -> Tensor:
        """The adjoint tensor of ``x`` (zeros if the output does not depend on it)."""
        if x in self.memo:
            return self.memo[x]
        name = f"d{x.name}"
        if x is self.output:
            head = self.head
            out = compute(x.shape, lambda *i: head[i] if head is not None else const(1, x.dtype), name=name)
        elif x not in self.live or not differentiable(x):
            out = compute(x.shape, lambda *i: const(0, x.dtype), name=name)
        else:
            out = self._gather(x, name)
        self.memo[x] = out
        return out

    def _gather(self, x: Tensor, name: str) -> Tensor:
        def body(*j):
            terms, scans = [], []
            for t in dict.fromkeys(self.users.get(x, ())):
                if not (t in self.live or t is self.output):
                    continue
                if isinstance(t.body, ScanState):
                    scans.append(t.body.scan)
                elif t is self.output or not is_const(self.of(t).body, 0):
                    terms += tensor_terms(t, x, tuple(j), self._head_of(t), cut=self.cuts.get(t, frozenset()))
            total = combine(terms, x.dtype, self.optimize)
            for op in dict.fromkeys(scans):         # a scan's states share one adjoint
                adj = self._scan(op).of(x)
                if adj is not None:
                    total = add(total, adj[tuple(j)])
            return total
        return compute(x.shape, body, name=name)

    def _scan(self, op):
        """The adjoint of scan ``op`` (a reverse scan), for the adjoints of its
        results and of the chain tensors it kept that this graph reads."""
        if op not in self.scans:
            kept = {op.outputs[y.body.which]: self.of(y) for y in self.users
                    if isinstance(y.body, ScanState) and y.body.scan is op and y.body.which >= len(op.state)
                    and y in self.live}
            self.scans[op] = _COMPOUND[type(op)](op, [self.of(y) for y in op.results], self.optimize, kept)
        return self.scans[op]

    def _head_of(self, t: Tensor):
        """``i -> adjoint(t)[i]``, reading the output's head directly.  An
        adjoint that is a constant, or a read kept where an integer equality
        holds (``select(j == argmin[i], H[i], 0)``: a max or min's), is
        substituted rather than read, so that a zero folds away and zero
        elimination sees the equality (and sums only where it holds)."""
        if t is self.output and self.head is None:
            return lambda i: const(1, t.dtype)
        src = self.head if t is self.output else self.of(t)
        if t is not self.output and _inlined_adjoint(src.body):
            return lambda i: cast(t.dtype, substitute(src.body, dict(zip(src.axes, i))))
        read = (lambda i: cast(t.dtype, Load(src, tuple(i)))) if src.dtype != t.dtype else (lambda i: src[tuple(i)])
        guard = _zero_guard(src.body) if t is not self.output else None
        if guard is not None:           # the read where the adjoint is not a zero branch, else that 0
            cond, taken = guard
            return lambda i: select(substitute(cond, dict(zip(src.axes, i))) if taken else
                                    logic_not(substitute(cond, dict(zip(src.axes, i)))),
                                    read(i), const(0, t.dtype))
        return read


def _times_head(head, coef):
    """``head · coef``, zero wherever ``head`` is a zero branch of a select:
    the adjoint of an untaken branch stays 0 even where the local derivative
    there is infinite or NaN (``sqrt`` at 0 behind a ``!= 0`` test), where
    the plain product would give NaN."""
    if isinstance(head, Select) and isinstance(head.b, Const) and head.b.value == 0:
        return select(head.cond, head.a * coef, head.b)
    if isinstance(head, Select) and isinstance(head.a, Const) and head.a.value == 0:
        return select(head.cond, head.a, head.b * coef)
    return head * coef


def _zero_guard(body):
    """``(cond, truth)`` when ``body`` is 0 wherever ``cond != truth`` (a select with a zero branch)."""
    if isinstance(body, Select) and isinstance(body.b, Const) and body.b.value == 0:
        return body.cond, True
    if isinstance(body, Select) and isinstance(body.a, Const) and body.a.value == 0:
        return body.cond, False
    return None


def _inlined_adjoint(body) -> bool:
    """Whether an adjoint's ``body`` is worth substituting into the terms that
    read it: a constant, or ``select(c, v, 0)`` (either way round) with ``v``
    a read or a constant and ``c`` holding an equality of integers."""
    if isinstance(body, Const):
        return True
    if not isinstance(body, Select):
        return False
    value, zero = (body.a, body.b) if isinstance(body.b, Const) else (body.b, body.a)
    if not (isinstance(zero, Const) and zero.value == 0 and isinstance(value, (Load, Const))):
        return False
    return any(isinstance(c, Cmp) and c.op == "eq" and dt.is_int(c.a.dtype) for c in conjuncts([body.cond]))
