"""Zero elimination against two oracles, on random programs with affine indices.

Each example is a small program ``Y[o] = Σ_r body(o, r)`` (or no reduction)
whose body reads the float64 placeholder ``X`` at index expressions built
from random affine forms of the output and reduce axes, with ``//`` and ``%``
by small constants, guards (``te.if_then_else(te.all(lo <= idx, idx < hi),
X[idx], 0.0)``, the negated ``te.any`` form, or one condition around the
whole body), an optional outer condition on the axes (``aff >= 0`` or
``aff % m == r``), and one or two reads combined by ``+`` or ``*``.  Every
access the program evaluates is inside ``X`` (unguarded reads that could leave
``X`` get a guard), so ``te.build`` must accept the program and its gradients.

The same program description is evaluated in plain Python (floor ``//`` and
``%`` like te), which gives a brute-force forward value, vector-Jacobian
product and Jacobian.  For every example:

* ``te.gradient(Y, [X], head=H)`` with ``optimize=True`` (zero elimination)
  equals the literal Jacobian-composition sum (``optimize=False``), and both
  equal the brute-force VJP;
* ``te.jacobian(Y, X)`` equals the brute-force Jacobian.

``test_known_patterns`` keeps, as fixed examples, programs that broke zero
elimination or the naive oracle.

Set ``TE_PROPERTY_EXAMPLES`` to run more (random) examples, e.g. 2000 when
hunting bugs, and ``TE_PROPERTY_SHRINK=1`` to shrink a failure to a minimal program.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

import te_autodiff as te

EXAMPLES = int(os.environ.get("TE_PROPERTY_EXAMPLES", "0"))
# Shrinking rebuilds a kernel per step and can take minutes: it is off unless
# TE_PROPERTY_SHRINK=1, so a failure reports the first (unshrunk) program.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + (
    [Phase.shrink] if os.environ.get("TE_PROPERTY_SHRINK") else [])
SETTINGS = dict(deadline=None, derandomize=not EXAMPLES, database=None, phases=PHASES,
                report_multiple_bugs=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

RTOL, ATOL = 1e-10, 1e-12


# --------------------------------------------------------------------------- program descriptions


@dataclass(frozen=True)
class Affine:
    """``Σ coefs[v] * var_v + offset`` over variable positions."""
    coefs: tuple          # one int per variable (output axes, then reduce axes)
    offset: int

    def py(self, env):
        return sum(c * x for c, x in zip(self.coefs, env)) + self.offset

    def te(self, vs):
        out = te.const(self.offset, "int64")
        for c, v in zip(self.coefs, vs):
            if c:
                out = out + v * c
        return out

    def text(self, names):
        parts = [f"{c}*{n}" for c, n in zip(self.coefs, names) if c]
        return " + ".join(parts + [str(self.offset)])


@dataclass(frozen=True)
class Index:
    """``(inner op divisor) + post`` where op is None, '//' or '%'."""
    inner: Affine
    op: str | None
    divisor: int
    post: Affine | None

    def py(self, env):
        x = self.inner.py(env)
        if self.op == "//":
            x = x // self.divisor
        elif self.op == "%":
            x = x % self.divisor
        return x + (self.post.py(env) if self.post else 0)

    def te(self, vs):
        x = self.inner.te(vs)
        if self.op == "//":
            x = x // self.divisor
        elif self.op == "%":
            x = x % self.divisor
        return x + self.post.te(vs) if self.post else x

    def text(self, names):
        x = f"({self.inner.text(names)})"
        if self.op:
            x = f"({x} {self.op} {self.divisor})"
        return x + (f" + {self.post.text(names)}" if self.post else "")


@dataclass(frozen=True)
class Read:
    """``X[index]`` under a guard: 'none', 'box' (lo <= idx < hi for each dim,
    as te.all), 'negated' (te.if_then_else(te.any(idx < lo, idx >= hi), 0, X)) or
    'outer' (the box condition guards the whole body, products included:
    ``te.if_then_else(te.all(box...), X[a] * X[b], 0)``)."""
    index: tuple          # one Index per dimension of X
    guard: str
    lo: tuple
    hi: tuple

    def ok(self, env):
        ix = [d.py(env) for d in self.index]
        if self.guard == "none":
            return True, ix
        return all(lo <= v < hi for v, lo, hi in zip(ix, self.lo, self.hi)), ix

    def inside(self, vs):
        ix = [d.te(vs) for d in self.index]
        return [c for v, lo, hi in zip(ix, self.lo, self.hi) for c in (lo <= v, v < hi)]

    def te(self, X, vs):
        ix = [d.te(vs) for d in self.index]
        load = X[tuple(ix)]
        if self.guard in ("none", "outer"):
            return load
        inside = self.inside(vs)
        if self.guard == "box":
            return te.if_then_else(te.all(*inside), load, 0.0)
        outside = [c for v, lo, hi in zip(ix, self.lo, self.hi) for c in (v < lo, v >= hi)]
        return te.if_then_else(te.any(*outside), 0.0, load)


@dataclass(frozen=True)
class Cond:
    """An outer condition on the axes: ``aff >= 0`` or ``aff % m == r``."""
    aff: Affine
    mod: int
    rem: int

    def py(self, env):
        x = self.aff.py(env)
        return x >= 0 if self.mod == 0 else x % self.mod == self.rem

    def te(self, vs):
        x = self.aff.te(vs)
        return x >= 0 if self.mod == 0 else te.equal(x % self.mod, self.rem)


@dataclass(frozen=True)
class Program:
    out_shape: tuple
    red: tuple            # (lo, extent) per reduce axis
    x_shape: tuple
    reads: tuple          # 1 or 2 Reads
    combine: str          # 'add' or 'mul'
    weights: tuple        # float weight per read (for 'add')
    cond: Cond | None

    @property
    def nvars(self):
        return len(self.out_shape) + len(self.red)

    def points(self):
        """(output index, env) for every summand of the program."""
        red = [range(lo, lo + ext) for lo, ext in self.red]
        for o in itertools.product(*map(range, self.out_shape)):
            for r in itertools.product(*red):
                yield o, o + r

    # -- te
    def build_te(self, X=None, name="Y"):
        """(X, Y) in te; ``X`` may be given (a tensor of shape ``x_shape``)."""
        X = te.placeholder(self.x_shape, dtype="float64", name="X") if X is None else X
        raxes = [te.reduce_axis((lo, lo + ext), name=f"r{n}") for n, (lo, ext) in enumerate(self.red)]

        def body(*o):
            vs = list(o) + raxes
            vals = [rd.te(X, vs) for rd in self.reads]
            if self.combine == "mul":
                e = vals[0] * vals[1]
            else:
                e = vals[0] * self.weights[0]
                for v, w in zip(vals[1:], self.weights[1:]):
                    e = e + v * w
            outer = [c for rd in self.reads if rd.guard == "outer" for c in rd.inside(vs)]
            if outer:
                e = te.if_then_else(te.all(*outer), e, 0.0)
            if self.cond is not None:
                e = te.if_then_else(self.cond.te(vs), e, 0.0)
            return te.sum(e, axis=raxes) if raxes else e

        Y = te.compute(self.out_shape, body, name=name)
        return X, Y

    # -- brute force
    def partials(self, x, env):
        """(value, [(X index, ∂value/∂X[index])]) of the body at ``env``."""
        if self.cond is not None and not self.cond.py(env):
            return 0.0, []
        if not all(rd.ok(env)[0] for rd in self.reads if rd.guard == "outer"):
            return 0.0, []
        got = []
        for rd in self.reads:
            ok, ix = rd.ok(env)
            got.append((ok, tuple(ix), x[tuple(ix)] if ok else 0.0))
        if self.combine == "mul":
            (ok0, i0, v0), (ok1, i1, v1) = got
            parts = ([(i0, v1)] if ok0 else []) + ([(i1, v0)] if ok1 else [])
            return v0 * v1, parts
        value = sum(w * v for w, (_, _, v) in zip(self.weights, got))
        return value, [(ix, w) for w, (ok, ix, _) in zip(self.weights, got) if ok]

    def brute(self, x, h):
        y = np.zeros(self.out_shape)
        dx = np.zeros(self.x_shape)
        jac = np.zeros(self.out_shape + self.x_shape)
        for o, env in self.points():
            value, parts = self.partials(x, env)
            y[o] += value
            for ix, d in parts:
                dx[ix] += h[o] * d
                jac[o + ix] += d
        return y, dx, jac

    def in_bounds(self):
        """Whether every X access allowed by its own guard stays inside X (the outer
        condition is ignored: a read it alone protects is guarded too)."""
        for _, env in self.points():
            for rd in self.reads:
                ok, ix = rd.ok(env)
                if ok and not all(0 <= v < n for v, n in zip(ix, self.x_shape)):
                    return False
        return True

    def text(self):
        names = [f"o{n}" for n in range(len(self.out_shape))] + [f"r{n}" for n in range(len(self.red))]
        reads = [f"{rd.guard}{list(zip(rd.lo, rd.hi)) if rd.guard != 'none' else ''} "
                 f"X[{', '.join(d.text(names) for d in rd.index)}]" for rd in self.reads]
        cond = ""
        if self.cond is not None:
            c = self.cond
            cond = (f" if {c.aff.text(names)} >= 0" if c.mod == 0
                    else f" if ({c.aff.text(names)}) % {c.mod} == {c.rem}")
        return (f"Y{self.out_shape} red={self.red} X{self.x_shape} {self.combine}{self.weights}: "
                + " ; ".join(reads) + cond)


# --------------------------------------------------------------------------- strategies


def affines(nvars, lo=-3, hi=3, density=0.6):
    @st.composite
    def draw_affine(draw):
        coefs = tuple(draw(st.sampled_from([0, 0, 1, 1, -1, 2, -2, 3, -3]))
                      if draw(st.floats(0, 1)) < density else 0 for _ in range(nvars))
        return Affine(coefs, draw(st.integers(-3, 6)))
    return draw_affine()


@st.composite
def indices(draw, nvars):
    inner = draw(affines(nvars))
    op = draw(st.sampled_from([None, None, None, "//", "%"]))
    divisor = draw(st.integers(2, 4)) if op else 1
    post = draw(affines(nvars, density=0.4)) if op and draw(st.booleans()) else None
    return Index(inner, op, divisor, post)


@st.composite
def programs(draw, max_out_dims=3, x_shape=None):
    out_shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=max_out_dims)))
    red = tuple(draw(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 4)), max_size=2)))
    nvars = len(out_shape) + len(red)
    if x_shape is None:
        x_shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    combine = draw(st.sampled_from(["add", "add", "mul"]))
    nreads = 2 if combine == "mul" else draw(st.integers(1, 2))
    reads = []
    for _ in range(nreads):
        index = tuple(draw(indices(nvars)) for _ in x_shape)
        guard = draw(st.sampled_from(["none", "none", "box", "negated", "outer"]))
        lo, hi = (0,) * len(x_shape), x_shape
        if guard != "none" and draw(st.booleans()):   # a narrower window than X
            lo = tuple(draw(st.integers(0, n - 1)) for n in x_shape)
            hi = tuple(draw(st.integers(l + 1, n)) for l, n in zip(lo, x_shape))
        reads.append(Read(index, guard, lo, hi))
    weights = tuple(draw(st.sampled_from([1.0, -2.0, 0.5])) for _ in reads)
    cond = None
    if draw(st.integers(0, 3)) == 0:
        mod = draw(st.sampled_from([0, 0, 2, 3]))
        cond = Cond(draw(affines(nvars)), mod, draw(st.integers(0, mod - 1)) if mod else 0)
    prog = Program(out_shape, red, x_shape, tuple(reads), combine, weights, cond)
    if not prog.in_bounds():
        # guard every unguarded read by X's own box: the program is then always valid
        prog = Program(out_shape, red, x_shape,
                       tuple(rd if rd.guard != "none" else Read(rd.index, "box", (0,) * len(x_shape), x_shape)
                             for rd in reads), combine, weights, cond)
    return prog


def _data(prog, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(prog.x_shape), rng.standard_normal(prog.out_shape)


def _close(a, b):
    return np.allclose(a, b, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------- properties


def check_gradient(prog, seed):
    X, Y = prog.build_te()
    H = te.placeholder(Y.shape, dtype="float64", name="H")
    (g_opt,) = te.gradient(Y, [X], head=H)
    (g_naive,) = te.gradient(Y, [X], head=H, optimize=False)
    x, h = _data(prog, seed)
    y_ref, dx_ref, _ = prog.brute(x, h)
    try:                                  # one kernel for all three (builds dominate the time)
        y, dx_opt, dx_naive = te.build([X, H], [Y, g_opt, g_naive])(x, h)
    except Exception:                     # name the tensor that fails to build
        te.build([X], [Y])
        te.build([X, H], [g_opt])
        te.build([X, H], [g_naive])
        raise
    where = f"{prog.text()}\n{te.pretty(g_opt)}"
    assert _close(y, y_ref), f"forward differs from the brute force: {prog.text()}"
    assert _close(dx_opt, dx_ref), f"optimized gradient differs from the brute force: {where}"
    assert _close(dx_naive, dx_ref), f"naive gradient differs from the brute force: {where}"
    assert _close(dx_opt, dx_naive), f"optimized gradient differs from naive: {where}"


@settings(max_examples=EXAMPLES or 200, **SETTINGS)
@given(programs(), st.integers(0, 2**31))
def test_gradient_optimized_equals_naive_and_brute_force(prog, seed):
    check_gradient(prog, seed)


def _read(coefs, offset, guard="none", n=None, op=None, divisor=1):
    index = (Index(Affine(tuple(coefs), offset), op, divisor, None),)
    return Read(index, guard, (0,), (n,) if n else (0,))


KNOWN = {
    # Y[i] = if i >= 2 then X[i-2]·X[i] else 0: the guard protects X[i-2] in a product
    "guarded_product": Program((7,), (), (7,), (_read([1], -2, "outer", 7), _read([1], 0)),
                               "mul", (1.0, 1.0), None),
    # the same with a reduction: Y[i] = Σ_k if 0 <= i+k-1 < 6 then X[i+k-1]·X[k] else 0
    "guarded_product_reduced": Program((6,), ((0, 3),), (6,),
                                       (_read([1, 1], -1, "outer", 6), _read([0, 1], 0)),
                                       "mul", (1.0, 1.0), None),
    # Y[a] = Σ_{r in 0..1} X[(a + r) % 2]: a single-point reduce axis next to a quotient
    "mod_single_point_axis": Program((3,), ((0, 1),), (2,), (_read([1, 1], 0, op="%", divisor=2),),
                                     "add", (1.0,), None),
    # Y[y] = Σ_k X[3y + 2k]: X[1] and X[9] are never read
    "unreachable_elements": Program((3,), ((0, 3),), (11,), (_read([3, 2], 0),), "add", (1.0,), None),
    # Y[a, b, c] = X[a + b + c]: two free summation variables, the inner one's
    # bounds depend on the outer one (a triangular domain)
    "coupled_free_axes": Program((2, 2, 2), (), (4,), (_read([1, 1, 1], 0),), "add", (1.0,), None),
    "coupled_reduce_axes": Program((2,), ((0, 2), (0, 2)), (4,), (_read([1, 1, 1], 0),), "add", (1.0,), None),
    # X[b + 5] guarded, but b + 5 is never inside X: an empty term
    "empty_term": Program((2,), ((0, 2),), (4,), (Read((Index(Affine((0, 1), 5), None, 1, None),),
                                                       "negated", (0,), (4,)),), "add", (1.0,), None),
}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_known_patterns(name):
    """Programs that once broke zero elimination or the naive oracle."""
    prog = KNOWN[name]
    assert prog.in_bounds()
    check_gradient(prog, 0)


@settings(max_examples=EXAMPLES or 80, **SETTINGS)
@given(programs(max_out_dims=2), st.integers(0, 2**31))
def test_jacobian_equals_brute_force(prog, seed):
    assume(np.prod(prog.out_shape) * np.prod(prog.x_shape) <= 2000)
    X, Y = prog.build_te()
    # te.jacobian is defined for a direct input; a condition folded to false can
    # leave Y without any read of X
    assume(X in Y.inputs)
    J = te.jacobian(Y, X)
    assert J.shape == prog.out_shape + prog.x_shape
    x, h = _data(prog, seed)
    jac = te.build([X], [J])(x)
    _, _, jac_ref = prog.brute(x, h)
    assert _close(jac, jac_ref), f"jacobian differs from the brute force: {prog.text()}\n{te.pretty(J)}"


@st.composite
def pipelines(draw):
    """Two programs, the second reading the first's output: X -> T -> Y."""
    first = draw(programs(max_out_dims=2))
    return first, draw(programs(x_shape=first.out_shape))


@settings(max_examples=EXAMPLES or 60, **SETTINGS)
@given(pipelines(), st.integers(0, 2**31))
def test_gradient_through_two_stages(pipe, seed):
    """Adjoints composed over a graph: dX = VJP1(VJP2(H)), each stage zero-eliminated."""
    first, second = pipe
    X, T = first.build_te(name="T")
    _, Y = second.build_te(X=T, name="Y")
    H = te.placeholder(Y.shape, dtype="float64", name="H")
    (g_opt,) = te.gradient(Y, [X], head=H)
    (g_naive,) = te.gradient(Y, [X], head=H, optimize=False)
    x, _ = _data(first, seed)
    h = np.random.default_rng(seed + 1).standard_normal(second.out_shape)
    t, _, _ = first.brute(x, np.zeros(first.out_shape))
    _, dt, _ = second.brute(t, h)
    _, dx_ref, _ = first.brute(x, dt)
    dx_opt, dx_naive = te.build([X, H], [g_opt, g_naive])(x, h)
    where = f"T: {first.text()}\nY: {second.text()}\n{te.pretty(g_opt)}"
    assert _close(dx_naive, dx_ref), f"naive gradient differs from the brute force: {where}"
    assert _close(dx_opt, dx_ref), f"optimized gradient differs from the brute force: {where}"


def test_generator_makes_valid_programs():
    """The generator itself: unguarded reads stay in bounds and the brute force
    matches a second, independent evaluation of the index functions."""
    rng = np.random.default_rng(0)
    prog = Program(out_shape=(3, 4), red=((1, 2),), x_shape=(7, 5),
                   reads=(Read((Index(Affine((2, 0, 1), 0), None, 1, None),
                                Index(Affine((0, 1, 0), 0), None, 1, None)), "none", (0, 0), (7, 5)),),
                   combine="add", weights=(1.0,), cond=None)
    assert prog.in_bounds()
    x, h = rng.standard_normal((7, 5)), rng.standard_normal((3, 4))
    y, dx, jac = prog.brute(x, h)
    # Y[i, j] = Σ_{r in 1..2} X[2i + r, j]
    assert np.allclose(y, [[x[2 * i + 1, j] + x[2 * i + 2, j] for j in range(4)] for i in range(3)])
    ref = np.zeros((7, 5))
    for i, j, r in itertools.product(range(3), range(4), (1, 2)):
        ref[2 * i + r, j] += h[i, j]
    assert np.allclose(dx, ref)
    assert jac.shape == (3, 4, 7, 5) and jac.sum() == 3 * 4 * 2
