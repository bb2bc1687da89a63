"""Targeted forms: the shapes of reads users' programs take and random indices rarely do.

Each of these forms hid a compiler bug from thousands of random programs
(GradBench's evaluations found them); the generator now takes one in
``FORM_SHARE`` of its reads (``targeted_read``) and makes one in
``ONE_SHARE`` of its outputs one element (``one_element``):

* **selects around gathers** (``gather:select``): ``te.if_then_else(v < u,
  X[w, I[u, v]], 0.0)``, a read whose index is read from an int tensor over
  two positions, under index conditions relating them (GMM's ``l[k,
  IDX[r, c]]`` under ``c < r``): one condition (``gather:one``), nested
  selects (``gather:nested``), ``te.all``/``te.any`` of two
  (``gather:logic``);
* **equality guards** (``guard:equal``): a read that leaves its tensor at
  exactly one point, ``X[i - 1]`` at ``i = 0``, kept in range by
  ``te.not_equal(i, 0)`` or by the other branch of ``te.equal(i, 0)``,
  which reads the tensor's edge (``X[0]``) or is a constant; with two such
  axes ``te.all`` of ``not_equal``, ``te.any`` of ``equal`` or nested
  selects (``guard:equal:ne``, ``:eq``, ``:not``, ``:all``, ``:any``,
  ``:nested``);
* **non-affine guarded indices** (``index:nonaffine``): products of index
  variables, quadratic forms, ``//`` and ``%`` of them (GMM's packed
  triangle ``X[k, c*(2D - c - 1)//2 + r - c - 1]``, ``r*(r + 1)//2 + c``,
  ``2*r*c - r``, ``(r - c)*(r - c)`` ...), the tensor sized to the values
  the index takes where a condition on its variables holds; the guard
  (``guard:nonaffine``) is a condition found by evaluating candidates on
  the grid: it does not mention the index, implies the index is in range
  wherever it holds, and holds somewhere;
* **one-element reductions** (``one:max``, ``one:min``, ``one:sum``): an
  output of shape (), (1,) or (1, 1) reduced by max, min or sum over one or
  two axes (``large.py`` takes them past the schedule's split threshold).
"""
from __future__ import annotations

import numpy as np

from .describe import IBin, IConst, IData, IVar, Cmp, Logic, Num, Read, Select
from .values import MAX_ELEMENTS, Env, V, exact, holds, hull, plus

NONAFFINE = ("triangle", "packed", "product", "square", "divmod")
GATHER_FORMS = ("one", "nested", "logic")
EQUAL_FORMS = ("ne", "eq", "not", "all", "any", "nested")
ONE_OPS = ("max", "min", "sum")
MAX_KEYS = 6            # points of the axis a gather reads
# every tag of the forms (the tests check that each is generated)
FEATURES = frozenset({"gather:select", "guard:equal", "index:nonaffine", "guard:nonaffine"}
                     | {f"gather:{k}" for k in GATHER_FORMS} | {f"guard:equal:{k}" for k in EQUAL_FORMS}
                     | {f"nonaffine:{k}" for k in NONAFFINE} | {f"one:{op}" for op in ONE_OPS})


class Forms:
    """The targeted forms, a part of :class:`~fuzz.programs.Generator`."""

    def targeted_read(self, scope) -> V | None:
        """One of the targeted reads (see the module doc), or None when ``scope`` has no room for it."""
        kind = self.pick(["gather", "equal", "nonaffine"])
        return getattr(self, f"{kind}_read")(scope)

    def one_element(self, scope, depth) -> V:
        """A max, min or sum over one or two axes: the body of an output of one element."""
        op = self.pick(list(ONE_OPS), [2, 2, 1])
        self.tag(f"one:{op}")
        return self.gen_reduce(scope, depth - 1, op=op)

    # ------------------------------------------------------------ helpers

    def form_vars(self, scope, k) -> list | None:
        """``k`` distinct free variables of two points or more, reduce axes first
        most of the time; None when the scope has fewer."""
        free = [v for v in scope.free() if v.extent >= 2]
        if len(free) < k:
            return None
        order = [free[i] for i in self.rng.permutation(len(free))]
        if self.chance(0.7):
            order.sort(key=lambda v: v not in scope.prefer)
        return order[:k]

    def relations(self, u, v) -> list:
        """Conditions on ``u`` and ``v``: ``v op u + d``, ``v != u``, ``u + v op c``, ``x op c``."""
        U, W = IVar(u), IVar(v)
        out = [Cmp(op, W, plus(U, d)) for op in ("lt", "le", "gt", "ge") for d in (-1, 0, 1)]
        out.append(Cmp("ne", W, U))
        lo, hi = u.lo + v.lo, u.lo + u.extent + v.lo + v.extent - 2
        out += [Cmp(op, IBin("+", U, W), IConst(c)) for op in ("lt", "gt") for c in range(lo + 1, hi)]
        out += [Cmp(op, IVar(x), IConst(c)) for x in (u, v) for op in ("lt", "ge")
                for c in range(x.lo + 1, x.lo + x.extent)]
        return out

    def other_axis(self, scope, taken, n) -> tuple:
        """A tensor axis for a read besides its targeted index, most of the time:
        ``(extent, index)`` over a free variable not in ``taken``; None (no
        second axis) otherwise, or when it would take the tensor past ``MAX_ELEMENTS``."""
        others = [w for w in scope.free() if w not in taken and w.extent >= 1]
        if not others or not self.chance(0.7):
            return None
        w = self.pick(others)
        rows = w.lo + w.extent
        return (rows, IVar(w)) if rows * n <= MAX_ELEMENTS else None

    def new_read(self, scope, n, index, taken, guard="none") -> V:
        """A new input read at ``index`` along an axis of ``n`` points (a second
        axis over another variable, before or after it, sometimes)."""
        other = self.other_axis(scope, taken, n)
        if other is None:
            shape, indices = (n,), (index,)
        elif self.chance(0.5):
            shape, indices = (other[0], n), (other[1], index)
        else:
            shape, indices = (n, other[0]), (index, other[1])
        x = self.add_input(shape)
        self.reads[x.name] = self.reads.get(x.name, 0) + 1
        checks = ((index, n),) if guard != "none" else ()
        return V(Read(x.name, shape, indices, guard, checks), -2.0, 2.0)

    # ------------------------------------------------------------ the forms

    def gather_read(self, scope) -> V | None:
        """``te.if_then_else(cond, X[..., I[u, v], ...], 0.0)`` with conditions relating ``u`` and ``v``."""
        pair = self.form_vars(scope, 2)
        if pair is None:
            return None
        u, v = pair
        n = int(self.rng.integers(2, MAX_KEYS + 1))
        keys = self.add_input((u.lo + u.extent, v.lo + v.extent), self.pick(["int32", "int64"]), (0, n - 1))
        self.reads[keys.name] = 1
        read = self.new_read(scope, n, IData(keys.name, (IVar(u), IVar(v))), {u, v})
        env = Env(scope.rank, self.values)
        conds = []
        for c in self.relations(u, v):
            m = holds(c, env)
            if m.any() and not m.all():
                conds.append(c)
        alt = Num(float(self.pick([0.0, 0.0, 0.5])))
        form = self.pick(list(GATHER_FORMS), [2, 1, 1])
        self.tag("gather:select", f"gather:{form}")
        first, second = self.pick(conds), self.pick(conds)
        if form == "one":
            e = Select(first, read.e, alt)
        elif form == "nested":
            e = Select(first, Select(second, read.e, alt), alt)
        else:
            e = Select(Logic(self.pick(["all", "any"]), (first, second)), read.e, alt)
        return V(e, min(read.lo, alt.value), max(read.hi, alt.value))

    def equal_read(self, scope) -> V | None:
        """A read that leaves its tensor at one point of one or two of its
        axes, guarded by ``te.equal``/``te.not_equal`` on those points."""
        t = self.tensor_for(scope)
        batched = t.name in self.batched
        # axes d where some variable v runs one point past the tensor: 2 <= extent <= n + 1
        fits = [(d, v) for d, n in enumerate(t.shape) if not (batched and d == 0)
                for v in scope.free() if 2 <= v.extent <= n + 1]
        if not fits:
            return None
        picked = []
        for _ in range(int(self.pick([1, 2]))):
            left = [(d, v) for d, v in fits if all(d != e and v is not w for e, w in picked)]
            if left:
                prefer = [(d, v) for d, v in left if v in scope.prefer]
                picked.append(self.pick(prefer if prefer and self.chance(0.7) else left))
        indices, edges, points = {}, {}, []
        for d, v in picked:
            n, last = t.shape[d], v.lo + v.extent - 1
            if self.chance(0.5):                              # leaves at v = v.lo, reading -1
                indices[d], edges[d], point, bad = plus(IVar(v), -1 - v.lo), 0, v.lo, -1
            else:                                             # leaves at the last v, reading n
                indices[d], edges[d], point, bad = plus(IVar(v), n - last), n - 1, last, n
            points.append((IVar(v), IConst(point)) if self.chance(0.7) else (indices[d], IConst(bad)))
        used = {v for _, v in picked}
        for d, n in enumerate(t.shape):
            if d in indices:
                continue
            if batched and d == 0:
                indices[d] = IVar(scope.batch)
                continue
            inside = [w for w in scope.free() if w not in used and w.lo + w.extent <= n]
            w = self.pick(inside) if inside and self.chance(0.7) else None
            used.add(w)
            indices[d] = IVar(w) if w is not None else IConst(int(self.rng.integers(n)))
        indices = tuple(indices[d] for d in range(len(t.shape)))
        self.reads[t.name] = self.reads.get(t.name, 0) + 1
        lo, hi = self.tensor_iv[t.name]
        read = Read(t.name, t.shape, indices, "outer", tuple((indices[d], t.shape[d]) for d, _ in picked))
        if self.chance(0.6):          # the edge: the same read with the leaving indices at their last point inside
            alt = Read(t.name, t.shape, tuple(IConst(edges[d]) if d in edges else ix for d, ix in enumerate(indices)))
            alo, ahi = lo, hi
        else:
            c = float(self.pick([0.0, 0.5, -1.0]))
            alt, alo, ahi = Num(c), c, c
        eq = [Cmp("eq", a, b) for a, b in points]
        ne = [Cmp("ne", a, b) for a, b in points]
        if len(points) == 1:
            form = self.pick(["ne", "eq", "not"])
            e = {"ne": lambda: Select(ne[0], read, alt), "eq": lambda: Select(eq[0], alt, read),
                 "not": lambda: Select(Logic("not", (eq[0],)), read, alt)}[form]()
        else:
            form = self.pick(["all", "any", "nested"])
            e = {"all": lambda: Select(Logic("all", tuple(ne)), read, alt),
                 "any": lambda: Select(Logic("any", tuple(eq)), alt, read),
                 "nested": lambda: Select(eq[0], alt, Select(eq[1], alt, read))}[form]()
        self.tag("guard:equal", f"guard:equal:{form}")
        return V(e, min(lo, alo), max(hi, ahi))

    def nonaffine_read(self, scope) -> V | None:
        """A read at a non-affine index of two variables, kept in range by a
        condition on them found on the grid (see the module doc)."""
        pair = self.form_vars(scope, 2)
        if pair is None:
            return None
        u, v = pair
        kind = self.pick(NONAFFINE)
        f, natural = self.nonaffine(kind, u, v)
        env = Env(scope.rank, self.values)
        values = exact(f, env)
        atoms = list(dict.fromkeys(([natural] if natural is not None else []) + self.relations(u, v)))
        masks = {c: holds(c, env) for c in atoms}
        live = [c for c in atoms if masks[c].any()]
        chosen = natural if natural in live and self.chance(0.7) else self.pick(live)
        at, where = np.broadcast_arrays(values, masks[chosen])
        taken = at[where]
        low, high = int(taken.min()), int(taken.max())
        n = high - low + 1 + int(self.pick([0, 0, 1]))
        if n > MAX_ELEMENTS:
            return None
        index = plus(f, -low)
        inside = (values - low >= 0) & (values - low < n)
        self.tag("index:nonaffine", f"nonaffine:{kind}")
        if inside.all():
            return self.new_read(scope, n, index, {u, v})
        pairs = [Logic("all", (live[a], live[b])) for a, b in self.rng.integers(len(live), size=(8, 2)) if a != b]
        for c in pairs:
            masks[c] = masks[c.conds[0]] & masks[c.conds[1]]
        valid = [c for c in live + pairs if masks[c].any() and not (masks[c] & ~inside).any()]
        guard = self.pick(valid)
        self.tag("guard:nonaffine")
        read = self.new_read(scope, n, index, {u, v}, "outer")
        alt = float(self.pick([0.0, 0.0, 0.5]))
        return V(Select(guard, read.e, Num(alt)), *hull(read, V(None, alt, alt)))

    def nonaffine(self, kind, u, v) -> tuple:
        """``(index, condition)``: a non-affine index of ``u`` and ``v`` and the
        condition it was written for (None: any)."""
        U, W = IVar(u), IVar(v)
        if kind == "triangle":      # GMM: column v of a strict lower triangle of D rows, packed by columns
            d = u.lo + u.extent
            col = IBin("//", IBin("*", W, IBin("-", IConst(2 * d - 1), W)), IConst(2))
            return IBin("-", IBin("+", col, U), plus(W, 1)), Cmp("lt", W, U)
        if kind == "packed":        # row u of a lower triangle with its diagonal, packed by rows
            return IBin("+", IBin("//", IBin("*", U, plus(U, 1)), IConst(2)), W), Cmp("le", W, U)
        if kind == "product":
            s, a = int(self.pick([1, 2, -1])), int(self.pick([-2, -1, 1, 2]))
            uv = IBin("*", U, W)
            return IBin("+", uv if s == 1 else IBin("*", uv, IConst(s)), IBin("*", U, IConst(a))), None
        if kind == "square":
            diff = IBin("-", U, W)
            return (IBin("*", diff, diff) if self.chance(0.5) else
                    IBin("-", IBin("*", U, U), IBin("*", W, IConst(int(self.pick([1, 2])))))), None
        m = int(self.pick([2, 3, 4]))
        op = self.pick(["//", "%"])
        inner = IBin("+", IBin("*", U, W), U)
        return (IBin(op, inner, IConst(m)) if op == "//" else IBin("+", IBin(op, inner, IConst(m)), W)), None
