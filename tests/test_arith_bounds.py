"""Fourier-Motzkin loop bounds and the CP-SAT queries, against brute force."""

import itertools
import json
import random
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from arith import (LinearExpr, LinearSystem, Var, fourier_motzkin, is_feasible, is_implied,
                   normalize_inequality, numeric_bounds, solve_equations)
from arith import bounds as bounds_module

L = LinearExpr.var
i, j, k, x, y = (Var(n) for n in "ijkxy")


def test_normalize_inequality_rounds_the_constant_down():
    assert normalize_inequality(2 * L(x) + 3) == L(x) + 1      # 2x >= -3  <=>  x >= -1
    assert normalize_inequality(-4 * L(x) + 6 * L(y) - 1) == -2 * L(x) + 3 * L(y) - 1
    assert normalize_inequality(L(x) - 7) == L(x) - 7


def test_conv_gradient_bounds():
    """sum_{i,k} [j == i + k]: k = j - i, then i runs over max(0, j-2)..min(5, j)."""
    sol = solve_equations([L(j) - L(i) - L(k)], [i, k])
    system = LinearSystem(ranges={i: (0, 5), k: (0, 2)}).substitute(sol.values)
    (f,) = sol.free
    result = fourier_motzkin(system.all_inequalities(), [f],
                             context=LinearSystem(ranges={j: (0, 7)}))
    assert str(result) == "max(0, j - 2) <= i <= min(5, j)"
    assert result.remaining == []
    for jv in range(8):
        got = sorted(p[f] for p in result.points({j: jv}))
        assert got == [iv for iv in range(6) if 0 <= jv - iv <= 2]


def test_parameters_left_in_remaining_without_context():
    result = fourier_motzkin([L(x), L(j) - L(x), 3 - L(j) + 1], [x])
    assert [str(b) for b in result.bounds] == ["0 <= x <= j"]
    assert set(result.remaining) == {L(j), 4 - L(j)}
    assert list(result.points({j: -1})) == []
    assert len(list(result.points({j: 2}))) == 3


def test_duplicates_and_parallel_constraints_without_solver():
    result = fourier_motzkin([L(x) - 1, L(x) - 3, 2 * L(x) - 5, 10 - 2 * L(x), 5 - L(x)],
                             [x], prune=False)
    (b,) = result.bounds
    assert b.lower == ((LinearExpr.const(3), 1),)
    assert b.upper == ((LinearExpr.const(5), 1),)


def test_division_bounds_print_with_ceil_and_floor():
    result = fourier_motzkin([2 * L(x) - L(j), L(j) + 7 - 3 * L(x)], [x], prune=False)
    assert str(result.bounds[0]) == "ceil(j / 2) <= x <= floor((j + 7) / 3)"
    assert [p[x] for p in result.points({j: 3})] == [2, 3]


def test_solver_pruning_drops_implied_bounds():
    # With 0 <= j <= 3, the bound x >= j - 5 is never tighter than x >= 0.
    ctx = LinearSystem(ranges={j: (0, 3)})
    result = fourier_motzkin([L(x), L(x) - L(j) + 5, 9 - L(x), L(j) + 20 - L(x)], [x], context=ctx)
    assert str(result) == "0 <= x <= 9"
    with pytest.raises(ValueError, match="context constrains x"):
        fourier_motzkin([L(x)], [x], context=LinearSystem(ranges={x: (0, 1)}))


def test_infeasible_polytope():
    result = fourier_motzkin([L(x) - L(y) - 3, L(y), 1 - L(x)], [x, y])
    assert result.infeasible
    assert list(result.points()) == []
    assert not is_feasible(LinearSystem(inequalities=[L(x) - L(y) - 3, L(y), 1 - L(x)]))


# -- property: the loop nest enumerates exactly the integer points ---------------

BOX = 3
VARS = [Var(f"v{n}") for n in range(3)]
PARAM = Var("p")


@st.composite
def polytopes(draw):
    n = draw(st.integers(1, 3))
    names = VARS[:n] + [PARAM]
    cons = []
    for _ in range(draw(st.integers(1, 4))):
        coefs = {v: draw(st.integers(-3, 3)) for v in names}
        cons.append(LinearExpr(coefs, draw(st.integers(-4, 4))))
    order = draw(st.permutations(VARS[:n]))
    return list(order), cons, draw(st.booleans()), draw(st.booleans())


def brute_force(names, cons, box=BOX):
    pts = np.array(list(itertools.product(range(-box, box + 1), repeat=len(names))))
    ok = np.ones(len(pts), dtype=bool)
    for e in cons:
        ok &= pts @ np.array([e.coeff(v) for v in names]) + e.const >= 0
    return {tuple(map(int, p)) for p in pts[ok]}


@settings(max_examples=80, deadline=None)
@given(polytopes())
def test_loop_nest_enumerates_exactly_the_integer_points(case):
    order, cons, prune, with_context = case
    box = [c for v in order for c in (L(v) + BOX, BOX - L(v))]
    param_box = [L(PARAM) + BOX, BOX - L(PARAM)]
    if with_context:
        context = LinearSystem(ranges={PARAM: (-BOX, BOX)})
        result = fourier_motzkin(cons + box, order, context=context, prune=prune)
    else:
        result = fourier_motzkin(cons + box + param_box, order, prune=prune)
    names = order + [PARAM]
    expected = brute_force(names, cons)
    got = set()
    for pv in range(-BOX, BOX + 1):
        for point in result.points({PARAM: pv}):
            got.add(tuple(point[v] for v in order) + (pv,))
    assert got == expected
    for b in result.bounds:  # bounds only use outer variables and the parameter
        allowed = set(order[:order.index(b.var)]) | {PARAM}
        assert all(set(e.vars) <= allowed for e, _ in b.lower + b.upper)


def test_ten_variables_thirty_constraints_is_fast_and_exact():
    rng = random.Random(7)
    vs = [Var(f"w{n}") for n in range(10)]
    cons = [c for v in vs for c in (L(v), 3 - L(v))]
    for _ in range(10):
        picked = rng.sample(vs, 3)
        cons.append(LinearExpr({v: rng.choice([-2, -1, 1, 2]) for v in picked}, rng.randint(0, 4)))
    start = time.perf_counter()
    result = fourier_motzkin(cons, vs)
    assert time.perf_counter() - start < 10
    for _ in range(300):
        point = {v: rng.randint(-1, 4) for v in vs}
        inside = all(e.evaluate(point) >= 0 for e in cons)
        assert result.contains(point) == inside


# -- CP-SAT queries ----------------------------------------------------------------

@st.composite
def bounded_systems(draw):
    names = VARS[:draw(st.integers(1, 3))]
    ranges = {}
    for v in names:
        lo = draw(st.integers(-3, 2))
        ranges[v] = (lo, draw(st.integers(lo, 3)))
    coef = st.integers(-3, 3)
    eqs = [LinearExpr({v: draw(coef) for v in names}, draw(coef))
           for _ in range(draw(st.integers(0, 1)))]
    ineqs = [LinearExpr({v: draw(coef) for v in names}, draw(st.integers(-4, 4)))
             for _ in range(draw(st.integers(0, 3)))]
    target = LinearExpr({v: draw(coef) for v in names}, draw(coef))
    return LinearSystem(names, ranges, eqs, ineqs), target


def points_of(system):
    names = system.variables
    spans = [range(system.ranges[v][0], system.ranges[v][1] + 1) for v in names]
    for vals in itertools.product(*spans):
        env = dict(zip(names, vals))
        if system.contains(env):
            yield env


@settings(max_examples=80, deadline=None)
@given(bounded_systems())
def test_queries_match_brute_force(case):
    system, target = case
    values = [target.evaluate(env) for env in points_of(system)]
    got = numeric_bounds(target, system)
    if values:
        assert got == (min(values), max(values))
    else:
        assert got is None
    assert is_feasible(system) == bool(values)
    assert is_implied(target, system) == all(v >= 0 for v in values)


def test_bounds_of_constraint_bounded_variables():
    # x and y have no ranges; the rotated square bounds them (found via LP).
    square = LinearSystem(inequalities=[L(x) + L(y), 9 - L(x) - L(y), L(x) - L(y), 9 - L(x) + L(y)])
    assert numeric_bounds(L(x), square) == (0, 9)
    assert numeric_bounds(L(y), square) == (-4, 4)
    assert numeric_bounds(2 * L(x) + L(y), square) == (0, 18)
    assert numeric_bounds(LinearExpr.const(4), square) == (4, 4)
    assert is_implied(L(x) - 9 + 9, square)
    assert not is_implied(L(x) - 1, square)


def test_unbounded_variable_is_named():
    with pytest.raises(ValueError, match="variable y is unbounded"):
        numeric_bounds(L(x), LinearSystem(ranges={x: (0, 3)}, inequalities=[L(y) - L(x)]))
    with pytest.raises(ValueError, match="variable k is unbounded"):
        numeric_bounds(L(k), LinearSystem(ranges={x: (0, 3)}))


def test_infeasible_queries():
    parity = LinearSystem(ranges={x: (0, 3)}, equalities=[2 * L(x) - 3])
    assert numeric_bounds(L(x), parity) is None
    assert not is_feasible(parity)
    assert is_implied(L(x) - 100, parity)  # vacuously
    assert not is_feasible(LinearSystem(ranges={x: (2, 1)}))


def test_queries_are_cached_on_a_canonical_form():
    bounds_module.clear_caches()
    a = LinearSystem(ranges={x: (0, 5), y: (0, 5)}, inequalities=[L(x) - L(y), 2 * L(y) - 2])
    b = LinearSystem(ranges={y: (0, 5), x: (0, 5)}, inequalities=[L(y) - 1, L(x) - L(y)])
    assert numeric_bounds(L(x) + L(y), a) == numeric_bounds(L(y) + L(x), b) == (2, 10)
    info = bounds_module._numeric_bounds.cache_info()
    assert (info.hits, info.misses) == (1, 1)


def test_a_point_of_the_box_answers_without_the_solver(monkeypatch):
    """A system its box's centre or a corner satisfies is feasible with no
    solver asked; one no such point satisfies still asks it."""
    bounds_module.clear_caches()

    def no_solver():
        raise AssertionError("CP-SAT asked")
    monkeypatch.setattr(bounds_module.cpsat, "Model", no_solver)
    assert is_feasible(LinearSystem(ranges={x: (0, 9), y: (0, 9)}, inequalities=[L(x) - L(y) - 3]))   # corner (9, 0)
    assert not is_implied(L(x) - 5, LinearSystem(ranges={x: (0, 9)}))                               # x = 4 is a point
    a, b, c = (LinearExpr.var(v) for v in "abc")
    with pytest.raises(AssertionError, match="CP-SAT asked"):
        is_feasible(LinearSystem(ranges={"a": (0, 10), "b": (0, 9), "c": (0, 6)}, equalities=[a + 4 * b + c - 29]))
    bounds_module.clear_caches()


def test_solver_questions_import_no_pandas():
    """Zero elimination's integer bounds and the exact bounds check of a
    quadratic index are questions about integer points; a fresh process
    that builds such a gradient answers them with points of the systems'
    boxes (``_witness``) and loads no solver.  A question no such point
    answers asks CP-SAT (``arith.cpsat`` writes its model message
    directly): that imports OR-tools' solver but not its ``cp_model``
    module, nor pandas, which that imports (a tenth of a second of every
    first build)."""
    import subprocess
    import sys
    code = """
import json
import sys
import numpy as np
import te_autodiff as te
D, K = 4, 3
l = te.placeholder((K, D * (D - 1) // 2), "float64", name="l")
x = te.placeholder((K, D), "float64", name="x")
L = te.compute((K, D, D), lambda k, r, c: te.if_then_else(c < r, l[k, c * (2 * D - c - 1) // 2 + r - c - 1], 0.0),
               name="L")
j = te.reduce_axis(D, "j")
y = te.compute((K, D), lambda k, r: te.sum(L[k, r, j] * x[k, j], axis=j), name="y")
dl, = te.gradient(y, [l])
got = te.build([l, x], [dl])(np.ones((K, 6)), np.arange(K * D, dtype=float).reshape(K, D))
loaded = lambda: [m for m in ("pandas", "ortools.sat.python.cp_model", "ortools.sat.python.cp_model_helper")
                  if m in sys.modules]
built = loaded()
from arith.bounds import is_feasible
from arith.linear import LinearExpr, LinearSystem
a, b, c = (LinearExpr.var(v) for v in "abc")       # a + 4b + c = 29: (6, 5, 3), but no corner of the box
assert is_feasible(LinearSystem(ranges={"a": (0, 10), "b": (0, 9), "c": (0, 6)}, equalities=[a + 4 * b + c - 29]))
print(json.dumps([built, loaded(), float(got.sum())]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    built, asked, total = json.loads(out.stdout)
    assert built == [] and asked == ["ortools.sat.python.cp_model_helper"], out.stdout
    x = np.arange(12.0).reshape(3, 4)
    want = sum(x[k, c] for k in range(3) for r in range(4) for c in range(r))    # d sum(y) / d l = x[k, c]
    assert float(total) == want
