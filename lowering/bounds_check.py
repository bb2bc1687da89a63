"""Build-time bounds analysis of tensor reads.

An index is normalised to a linear form ``sum(coef * atom) + const`` whose
atoms are variables or non-affine sub-expressions (``//``, ``%``, products,
``max``/``min``...).  Its range is bounded by

* eliminating variables innermost first, substituting each one's extreme
  (``lo`` or ``lo + extent - 1`` of its loop, expressions of outer variables),
  which is exact for triangular (zero-eliminated) domains;
* splitting on ``max``/``min`` atoms (``c*max(x, y)`` is ``max(c*x, c*y)``
  for ``c > 0``), and interval arithmetic on the other atoms;
* ``c * (X // d)`` with ``d`` dividing ``c`` rewritten exactly as
  ``(c/d)*X - (c/d)*(X % d)`` (and ``X % d`` as ``X - d*(X // d)``), so that
  the strided and reshaped reads of zero-eliminated gradients cancel;
* the guards around the read (enclosing ``if_then_else`` conditions and
  ``te.all`` conjunctions), each a linear form ``g >= 0``: a guard on a
  single variable narrows that variable, and ``index = alpha*g + rest``
  bounds the index by the bound of ``rest``.

When that is not enough, ``bounds_exact`` decides the read exactly by integer
programming.  A read whose index depends on tensor data is left to a
run-time check.
"""
from __future__ import annotations

import functools

from te_autodiff import dtype as dt
from te_autodiff.expr import (BinOp, Cast, Cmp, Const, InverseIndex, Load, Logic, MatchSum, Reduce, Select,
                              Unary, Var, add, binop, const, sub)
from te_autodiff.inverse_index import value_range
from te_autodiff.visit import children, topo_order

from .bounds_exact import reach
from .loop_ir import expr_text

NEGATED = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}
_MAX_DEPTH = 16
_BUDGET = 4000                  # elimination steps per bounds query
_PURE = (Const, Var, BinOp, Cmp, Logic, Unary, Select, Cast)


class Linear:
    """``sum(terms[atom] * atom) + const`` with int coefficients."""

    __slots__ = ("terms", "const")

    def __init__(self, terms=None, c=0):
        self.terms = {a: k for a, k in (terms or {}).items() if k}
        self.const = c

    def __add__(self, other):
        terms = dict(self.terms)
        for a, k in other.terms.items():
            terms[a] = terms.get(a, 0) + k
        return Linear(terms, self.const + other.const)

    def scale(self, k: int):
        return Linear({a: c * k for a, c in self.terms.items()}, self.const * k)

    def without(self, atom):
        terms = dict(self.terms)
        del terms[atom]
        return Linear(terms, self.const)


def _lin_binop(e):
    if e.op in ("add", "sub"):
        a, b = linearize(e.a), linearize(e.b)
        return a + (b if e.op == "add" else b.scale(-1))
    if e.op == "mul":
        a, b = linearize(e.a), linearize(e.b)
        if not a.terms:
            return b.scale(a.const)
        if not b.terms:
            return a.scale(b.const)
    if e.op == "mod" and isinstance(e.b, Const) and e.b.value != 0:     # X - d*(X // d)
        return linearize(e.a) + Linear({binop("floordiv", e.a, e.b): -e.b.value})
    return Linear({e: 1})


_LINEARIZE = {
    Const: lambda e: Linear({}, int(e.value)) if dt.is_int(e.dtype) else Linear({e: 1}),
    BinOp: _lin_binop,
    Unary: lambda e: linearize(e.a).scale(-1) if e.op == "neg" else Linear({e: 1}),
    Cast: lambda e: linearize(e.a) if dt.is_int(e.a.dtype) and dt.is_int(e.to) else Linear({e: 1}),
}


LINEAR_FORMS = 1 << 13          # linear forms remembered (by node) across builds


@functools.lru_cache(maxsize=LINEAR_FORMS)
def linearize(e) -> Linear:
    """The linear form of an integer expression over its atoms (memoised on the
    node: an index DAG is not unfolded into a tree; forms are never mutated)."""
    rule = _LINEARIZE.get(type(e))
    return rule(e) if rule and dt.is_int(e.dtype) else Linear({e: 1})


def _conditions(cond, truth: bool) -> list:
    """Linear forms ``g`` with ``g >= 0`` implied by ``cond == truth`` (each
    sub-condition once, even when the condition is a DAG)."""
    out, seen, stack = [], set(), [(cond, truth)]
    while stack:
        c, t = stack.pop()
        if (c, t) in seen:
            continue
        seen.add((c, t))
        if isinstance(c, Logic):
            if c.op == "not":
                stack.append((c.a, not t))
            elif (c.op == "and") == t:
                stack += [(c.b, t), (c.a, t)]
            continue
        if not isinstance(c, Cmp) or not dt.is_int(c.a.dtype):
            continue
        op = c.op if t else NEGATED[c.op]
        d = linearize(c.a) + linearize(c.b).scale(-1)     # a - b
        minus_one = Linear({}, -1)
        out += {"lt": [d.scale(-1) + minus_one], "le": [d.scale(-1)], "gt": [d + minus_one],
                "ge": [d], "eq": [d, d.scale(-1)], "ne": []}[op]
    return out


def _compares_integers(cond) -> bool:
    """Whether the ``and``/``or``/``not`` tree of ``cond`` holds a comparison of
    integers or a constant (a contradiction the constructors folded to false:
    a read under it never runs)."""
    stack = [cond]
    while stack:
        c = stack.pop()
        if isinstance(c, Logic):
            stack += [c.a] if c.b is None else [c.a, c.b]
        elif isinstance(c, Const) or isinstance(c, Cmp) and dt.is_int(c.a.dtype):
            return True
    return False


class Scope:
    """Loop variables with their domains (outermost first) and the guards
    known to hold at one point of a tensor's body.

    The scopes with the same domains form a family in which each set of
    conditions has one scope, however the selects that lead to it nest: a
    body of nested selects on one integer test has a few scopes, not one
    per path through them."""

    def __init__(self, doms=None, guards=(), conds=(), family=None):
        self.doms = doms or {}
        self.guards = guards            # linear forms g >= 0
        self.conds = conds              # the (condition, truth) pairs they come from
        self._children = {}
        self._family = {} if family is None else family     # frozenset(conds) -> scope
        self._family.setdefault(frozenset(conds), self)

    @classmethod
    def of_axes(cls, axes, shape) -> "Scope":
        return cls({v: (const(0, dt.INDEX), const(n, dt.INDEX)) for v, n in zip(axes, shape)})

    def with_vars(self, axes, doms) -> "Scope":
        key = ("vars", tuple(axes), tuple(doms))
        if key not in self._children:
            self._children[key] = Scope({**self.doms, **dict(zip(axes, doms))}, self.guards,
                                        self.conds)
        return self._children[key]

    def guarded(self, cond, truth: bool) -> "Scope":
        """This scope where ``cond == truth``: itself when ``cond`` compares no
        integers (a test of float data says nothing about an index, and a
        body of nested such selects would otherwise have a scope per path)."""
        if not _compares_integers(cond):
            return self
        key = ("guard", cond, truth)
        if key not in self._children:
            conds = frozenset(self.conds + ((cond, truth),))
            if conds not in self._family:
                Scope(self.doms, self.guards + tuple(_conditions(cond, truth)), self.conds + ((cond, truth),),
                      self._family)
            self._children[key] = self._family[conds]
        return self._children[key]

    def var_limits(self, v):
        """Constant bounds on ``v`` from guards on ``v`` alone."""
        lo = hi = None
        for g in self.guards:
            if set(g.terms) == {v}:
                c = g.terms[v]
                if c > 0:
                    b = -(g.const // c)              # c*v + k >= 0  ->  v >= ceil(-k/c)
                    lo = b if lo is None else max(lo, b)
                else:
                    b = g.const // -c
                    hi = b if hi is None else min(hi, b)
        return lo, hi


def _tighter(a, b, sense):
    if a is None or b is None:
        return b if a is None else a
    return min(a, b) if sense > 0 else max(a, b)


def _ratio(form: Linear, g: Linear):
    """An int ``alpha`` such that ``form - alpha*g`` cancels an atom of ``g``."""
    for atom, k in g.terms.items():
        if atom in form.terms and form.terms[atom] % k == 0:
            return form.terms[atom] // k
    return None


def _combine(x, y, outer_max: bool, sense: int):
    """Bound of ``max(X, Y)`` (or min) from bounds ``x`` of X and ``y`` of Y."""
    if outer_max == (sense > 0):                 # the bound of both sides is needed
        if x is None or y is None:
            return None
        return max(x, y) if outer_max else min(x, y)
    return _tighter(x, y, sense)                 # either side alone is a valid bound


def _floordiv_as_remainder(atom, c):
    """``c * (X // d)`` as ``(c/d)*X - (c/d)*(X % d)`` when d divides c (floor
    semantics: X == d*(X // d) + X % d), else None."""
    if (isinstance(atom, BinOp) and atom.op == "floordiv" and isinstance(atom.b, Const)
            and atom.b.value != 0 and c % atom.b.value == 0):
        q = c // atom.b.value
        return linearize(atom.a).scale(q) + Linear({binop("mod", atom.a, atom.b): -q})
    return None


def _vars_in(atom) -> list:
    return [atom] if isinstance(atom, Var) else [n for n in topo_order([atom]) if isinstance(n, Var)]


def _innermost_atom(form: Linear, scope: Scope):
    """The term holding the innermost variable.  An atom wins over the bare
    variable (which must appear bare only to be eliminated), an exactly
    rewritable ``//`` over other atoms, a bigger atom over the ones inside it."""
    order = {v: n for n, v in enumerate(scope.doms)}
    best, best_key = None, None
    for atom, c in form.terms.items():
        exact = _floordiv_as_remainder(atom, c) is not None
        for v in _vars_in(atom) or [None]:
            key = (order.get(v, -1), not isinstance(atom, Var), exact, len(_vars_in(atom)))
            if best_key is None or key > best_key:
                best, best_key = atom, key
    return best


class _Bounder:
    """Bounds of linear forms in one scope.  ``budget`` (shared by the bounders
    of one query) caps the work: case splits can multiply."""

    def __init__(self, scope: Scope, budget: list):
        self.scope = scope
        self.budget = budget

    def range(self, e, depth: int):
        form = linearize(e)
        return self.bound(form, -1, None, depth), self.bound(form, 1, None, depth)

    def bound(self, form: Linear, sense: int, guards, depth: int):
        """An upper (sense +1) or lower (-1) bound of ``form``, None if unknown."""
        guards = self.scope.guards if guards is None else guards
        best = self.eliminate(form, sense, depth)
        for n, g in enumerate(guards):
            alpha = _ratio(form, g)
            if alpha is None or alpha * sense >= 0 or depth >= 3:
                continue
            rest = form + g.scale(-alpha)        # g >= 0 bounds alpha*g on this side
            best = _tighter(best, self.bound(rest, sense, guards[:n] + guards[n + 1:], depth + 1),
                            sense)
        return best

    def eliminate(self, form: Linear, sense: int, depth: int):
        self.budget[0] -= 1
        if depth > _MAX_DEPTH or self.budget[0] < 0:
            return None
        if not form.terms:
            return form.const
        for atom, c in form.terms.items():
            if isinstance(atom, BinOp) and atom.op in ("max", "min"):
                rest = form.without(atom)
                x = self.eliminate(rest + linearize(atom.a).scale(c), sense, depth + 1)
                y = self.eliminate(rest + linearize(atom.b).scale(c), sense, depth + 1)
                return _combine(x, y, (atom.op == "max") == (c > 0), sense)
        atom = _innermost_atom(form, self.scope)
        c = form.terms[atom]
        rest = form.without(atom)
        best = None
        if not isinstance(atom, Var):
            lo, hi = self.atom_range(atom, depth + 1)
            value = hi if c * sense > 0 else lo
            if value is not None:
                best = self.eliminate(rest + Linear({}, c * value), sense, depth + 1)
            exact = _floordiv_as_remainder(atom, c)
            if exact is not None:           # keeps X's terms, which may cancel against the rest
                best = _tighter(best, self.eliminate(rest + exact, sense, depth + 1), sense)
            return best
        if atom in self.scope.doms:
            lo, ext = self.scope.doms[atom]
            edge = lo if c * sense < 0 else sub(add(lo, ext), 1)
            best = self.eliminate(rest + linearize(edge).scale(c), sense, depth + 1)
        if best is None and atom.dom is not None:       # a range read from data: the fixed range
            first, n = atom.dom
            best = self.eliminate(rest + Linear({}, c * (first if c * sense < 0 else first + n - 1)), sense,
                                  depth + 1)
        lo_g, hi_g = self.scope.var_limits(atom)
        edge = hi_g if c * sense > 0 else lo_g
        if edge is not None:
            best = _tighter(best, self.eliminate(rest + Linear({}, c * edge), sense, depth + 1), sense)
        return best

    def atom_range(self, atom, depth: int):
        """Interval ``(lo, hi)`` of a non-affine atom (None ends when unknown)."""
        rule = _ATOM_RANGE.get(type(atom))
        return (None, None) if rule is None else rule(self, atom, depth)

    def binop_range(self, e, depth):
        if e.op in ("floordiv", "mod") and isinstance(e.b, Const) and e.b.value != 0:
            c = e.b.value
            lo, hi = self.range(e.a, depth)
            if e.op == "floordiv":
                ends = (None if lo is None else lo // c, None if hi is None else hi // c)
                return ends if c > 0 else ends[::-1]
            if lo is not None and hi is not None and lo // c == hi // c:
                return lo % c, hi % c
            return (0, c - 1) if c > 0 else (c + 1, 0)
        if e.op == "mul":
            x, y = self.range(e.a, depth), self.range(e.b, depth)
            if None in x or None in y:
                return None, None
            products = [a * b for a in x for b in y]
            return min(products), max(products)
        return None, None

    def select_range(self, e, depth):
        a = _Bounder(self.scope.guarded(e.cond, True), self.budget).range(e.a, depth)
        b = _Bounder(self.scope.guarded(e.cond, False), self.budget).range(e.b, depth)
        if None in a or None in b:
            return None, None
        return min(a[0], b[0]), max(a[1], b[1])

    def load_range(self, e, depth):
        """What an inverse index holds (positions and starts); other tensor data is unbounded."""
        if not isinstance(e.tensor.body, InverseIndex):
            return None, None
        return value_range(e, self.range(e.indices[-1], depth))


_ATOM_RANGE = {
    Load: _Bounder.load_range,
    BinOp: _Bounder.binop_range,
    Select: _Bounder.select_range,
    Cast: lambda self, e, depth: (0, 1) if e.a.dtype == "bool" else (None, None),
}


def bounds(e, scope: Scope):
    """``(lo, hi)`` with ``lo <= e <= hi`` wherever ``scope`` holds (None: unknown)."""
    return _Bounder(scope, [_BUDGET]).range(e, 0)


def is_index_only(e) -> bool:
    """True when ``e`` is a function of loop variables alone (reads no data)."""
    return all(isinstance(n, _PURE) for n in topo_order([e]))


def in_bounds(indices, shape, scope: Scope) -> bool:
    """Whether an index tuple provably lies inside ``shape`` in ``scope``."""
    for ix, n in zip(indices, shape):
        if not is_index_only(ix):
            return False
        lo, hi = bounds(ix, scope)
        if lo is None or hi is None or lo < 0 or hi >= n:
            return False
    return True


def _check_load(t, load, scope):
    """Raise IndexError unless every data-independent index of ``load`` stays in
    its dimension where the read executes: the interval bounds first, then the
    exact range (``bounds_exact``), whose example point the error names."""
    target = load.tensor
    for d, (ix, n) in enumerate(zip(load.indices, target.shape)):
        if not is_index_only(ix):       # checked at run time
            continue
        lo, hi = bounds(ix, scope)
        if lo is not None and hi is not None and 0 <= lo and hi < n:
            continue
        exact = reach(ix, scope)
        if exact is None or (exact != "unknown" and 0 <= exact.lo and exact.hi < n):
            continue
        if exact == "unknown":
            reach_text = "cannot be proven to stay"
        else:
            low = exact.lo < 0
            point = ", ".join(f"{name} = {value}" for name, value in (exact.at_lo if low else exact.at_hi))
            example = f" (it is {exact.lo if low else exact.hi} at {point})" if point else ""
            reach_text = f"reaches [{exact.lo}, {exact.hi}] where the read executes{example}, not"
        raise IndexError(
            f"tensor '{t.name}' reads '{target.name}' out of bounds: dimension {d} index "
            f"{expr_text(ix)} {reach_text} within [0, {n}); guard the read with te.if_then_else "
            f"or narrow the loop")


_SCOPED_CHILDREN = {       # sub-expressions with the scope each is evaluated in
    Select: lambda e, s: [(e.cond, s), (e.a, s.guarded(e.cond, True)), (e.b, s.guarded(e.cond, False))],
    Logic: lambda e, s: ([(e.a, s)] if e.op == "not"
                         else [(e.a, s), (e.b, s.guarded(e.a, e.op == "and"))]),
    Reduce: lambda e, s: _reduce_children(e, s),
    InverseIndex: lambda e, s: [(e.at, s), (e.key, _positions(e, s))],
    MatchSum: lambda e, s: [(e.at, s), (e.key, _positions(e, s)), (e.value, _positions(e, s))],
}


def _reduce_children(e, scope):
    """A reduction's domains and body with their scopes: the domain of each
    axis may use the axes before it, and is evaluated inside their loops."""
    out = [(x, scope.with_vars(e.axes[:n], e.doms[:n])) for n, dom in enumerate(e.doms) for x in dom]
    return out + [(e.body, scope.with_vars(e.axes, e.doms))]


def _positions(e, scope):
    """``scope`` with the positions of a keyed node (inverse index, match sum)."""
    return scope.with_vars(e.axes, [(const(lo, dt.INDEX), const(n, dt.INDEX)) for lo, n in e.doms])


def reads(t, doms=None):
    """Every read in ``t``'s body with the scope it executes in (its loops and
    the guards around it); ``doms`` narrows some axes (``{axis: (lo,
    extent)}``: a scan's step runs at times ``k ...``).  A tensor without
    elements reads nothing."""
    if 0 in t.shape:
        return
    stack = [(t.body, Scope({**Scope.of_axes(t.axes, t.shape).doms, **(doms or {})}))]
    seen = set()
    while stack:
        e, scope = stack.pop()
        if (e, scope) in seen:
            continue
        seen.add((e, scope))
        if isinstance(e, Load):
            yield e, scope
        rule = _SCOPED_CHILDREN.get(type(e))
        stack += rule(e, scope) if rule else [(c, scope) for c in children(e)]


def check_tensor(t, doms=None) -> None:
    """Raise IndexError unless every data-independent read in ``t``'s body is
    in range; ``doms`` as for :func:`reads`."""
    for load, scope in reads(t, doms):
        _check_load(t, load, scope)
