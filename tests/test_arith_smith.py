"""Smith normal form and the integer equation solver, against brute force."""

import itertools

import numpy as np
import pytest
import sympy
from hypothesis import given, settings, strategies as st
from sympy.matrices.normalforms import smith_normal_form as sympy_snf

from arith import LinearExpr, Var, smith_normal_form, solve_equations

L = LinearExpr.var


def check_snf(A):
    U, S, V = smith_normal_form(A)
    MU, MS, MV, MA = (sympy.Matrix(x) for x in (U, S, V, A))
    assert MU * MA * MV == MS
    assert abs(MU.det()) == 1 and abs(MV.det()) == 1
    m, n = MA.shape
    diag = [S[t][t] for t in range(min(m, n))]
    assert all(S[r][c] == 0 for r in range(m) for c in range(n) if r != c)
    assert all(d >= 0 for d in diag)
    for a, b in zip(diag, diag[1:]):
        assert (b == 0) if a == 0 else (b % a == 0)
    return diag


matrices = st.integers(1, 4).flatmap(lambda m: st.integers(1, 4).flatmap(
    lambda n: st.lists(st.lists(st.integers(-6, 6), min_size=n, max_size=n),
                       min_size=m, max_size=m)))


@settings(max_examples=200, deadline=None)
@given(matrices)
def test_snf_properties_and_agrees_with_sympy(A):
    diag = check_snf(A)
    ref = sympy_snf(sympy.Matrix(A), domain=sympy.ZZ)
    assert diag == [abs(int(ref[t, t])) for t in range(min(ref.shape))]


def test_snf_examples():
    assert check_snf([[2, 4, 4], [-6, 6, 12], [10, -4, -16]]) == [2, 6, 12]
    assert check_snf([[0, 0], [0, 0]]) == [0, 0]
    assert check_snf([[6, 10, 15]]) == [1]
    assert check_snf(sympy.Matrix([[4], [6]])) == [2]
    with pytest.raises(TypeError, match="integers"):
        smith_normal_form([[1.5, 2]])
    with pytest.raises(ValueError, match="different lengths"):
        smith_normal_form([[1, 2], [3]])


# -- the solver on the shapes zero elimination meets ------------------------------

i, k, j, j0, j1 = (Var(n) for n in ("i", "k", "j", "j0", "j1"))


def test_direct_equalities_stay_direct():
    sol = solve_equations([L(j0) - L(i), L(j1) - L(k)], [i, k])
    assert not sol.infeasible
    assert sol.values == {i: L(j0), k: L(j1)}
    assert sol.free == [] and sol.quotients == [] and sol.conditions == []
    assert sol.params == (j0, j1)


def test_single_unknown_equations_are_solved_first():
    sol = solve_equations([L(j0) - L(i) - L(k), L(j1) - L(k)], [i, k])
    assert sol.values == {i: L(j0) - L(j1), k: L(j1)}
    assert sol.free == [] and sol.quotients == []


def test_sum_index_keeps_one_unknown_free():
    sol = solve_equations([L(j) - L(i) - L(k)], [i, k])
    (f,) = sol.free
    assert str(f) == "i"
    assert sol.values == {i: L(f), k: L(j) - L(f)}
    assert sol.inverse == {f: L(i)}
    assert str(sol) == "i = i\nk = j - i\nfree: i"


def test_stride_gives_a_quotient():
    sol = solve_equations([L(j) - 2 * L(i) - 1], [i])
    ((q, num, d),) = sol.quotients
    assert (num, d) == (L(j) - 1, 2)
    assert sol.values == {i: L(q)} and sol.free == []
    assert sol.evaluate({j: 7}) == {i: 3}
    assert sol.evaluate({j: 6}) is None
    assert "q0 = (j - 1) / 2" in str(sol)


def test_divisor_one_needs_no_quotient():
    sol = solve_equations([2 * L(j) - 2 * L(i) - 4], [i])
    assert sol.values == {i: L(j) - 2} and sol.quotients == []
    assert solve_equations([2 * L(i) - 4], [i]).values == {i: LinearExpr.const(2)}


def test_consistency_conditions():
    sol = solve_equations([L(j0) - L(i), L(j1) - L(i)], [i])
    assert sol.values == {i: L(j0)}
    assert sol.conditions == [L(j1) - L(j0)]
    assert sol.evaluate({j0: 2, j1: 2}) == {i: 2}
    assert sol.evaluate({j0: 2, j1: 3}) is None
    assert solve_equations([2 * L(j0) - 4 * L(j1) + 6], []).conditions == [L(j0) - 2 * L(j1) + 3]


@pytest.mark.parametrize("eqs", [
    [LinearExpr.const(3)],
    [2 * L(i) - 1],
    [L(i) + L(k) - 1, L(i) + L(k) - 2],
    [4 * L(i) - 2 * L(j) - 1],          # even == odd for every j
    [4 * L(i) + 6 * L(j) - 2 * L(j) - 2],  # 4 i == 2 - 4 j never holds
])
def test_infeasible(eqs):
    sol = solve_equations(eqs, [i, k])
    assert sol.infeasible
    assert str(sol) == "infeasible"
    with pytest.raises(ValueError, match="infeasible"):
        sol.transform()


def test_unused_unknown_is_free_and_duplicates_rejected():
    sol = solve_equations([L(j) - L(i)], [i, k])
    assert [str(f) for f in sol.free] == ["k"]
    assert sol.values[k] == L(sol.free[0])
    with pytest.raises(ValueError, match="twice"):
        solve_equations([L(i)], [i, i])


def test_transform_round_trip():
    sol = solve_equations([L(j) - 2 * L(i) - 3 * L(k)], [i, k])
    t = sol.transform()
    for w in t.new_vars:
        # w = inverse(w)(i, k), and i, k = values(new vars): composing gives w back.
        assert t.apply(t.new_to_old[w]) == L(w)


# -- property: the solution is exactly the set of integer solutions ---------------

BOX = 2
FREE_BOX = 1
UNKNOWNS = [Var(f"u{n}") for n in range(4)]
PARAMS = [Var(f"p{n}") for n in range(2)]


@st.composite
def systems(draw):
    nu = draw(st.integers(1, 4))
    npar = draw(st.integers(0, 2))
    neq = draw(st.integers(1, 3))
    coeff = st.integers(-3, 3)
    rows = [[draw(coeff) for _ in range(nu + npar)] + [draw(coeff)] for _ in range(neq)]
    return UNKNOWNS[:nu], PARAMS[:npar], rows


def as_exprs(unknowns, params, rows):
    names = unknowns + params
    return [LinearExpr(dict(zip(names, r[:-1])), r[-1]) for r in rows]


@settings(max_examples=120, deadline=None)
@given(systems())
def test_solution_matches_brute_force(system):
    unknowns, params, rows = system
    eqs = as_exprs(unknowns, params, rows)
    sol = solve_equations(eqs, unknowns)

    # Brute force over the box: every integer solution (unknowns, params).
    names = unknowns + params
    grid = np.array(list(itertools.product(range(-BOX, BOX + 1), repeat=len(names))))
    M = np.array([r[:-1] for r in rows])
    c = np.array([r[-1] for r in rows])
    hits = grid[np.all(grid @ M.T + c == 0, axis=1)]

    if sol.infeasible:
        assert len(hits) == 0
        return
    for point in hits:
        env = dict(zip(names, map(int, point)))
        assert all(cond.evaluate(env) == 0 for cond in sol.conditions)
        # Completeness: the inverse gives the free values that reproduce the point.
        free_env = {f: sol.inverse[f].evaluate(env) for f in sol.free}
        got = sol.evaluate({**{p: env[p] for p in params}, **free_env})
        assert got == {u: env[u] for u in unknowns}

    # Soundness: every produced point solves the equations.
    for pvals in itertools.product(range(-BOX, BOX + 1), repeat=len(params)):
        for fvals in itertools.product(range(-FREE_BOX, FREE_BOX + 1), repeat=len(sol.free)):
            env = dict(zip(params, pvals)) | dict(zip(sol.free, fvals))
            got = sol.evaluate(env)
            if got is None:
                continue
            full = env | got
            assert all(e.evaluate(full) == 0 for e in eqs)
