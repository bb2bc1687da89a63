"""LinearExpr, LinearSystem, Transform and Var."""

import pytest
from hypothesis import given, settings, strategies as st

from arith import LinearExpr, LinearSystem, Transform, Var


class Node:
    """Stands in for the tensor layer's index variables: opaque, hashable, printable."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return self.name


i, j, k = Node("i"), Node("j"), Node("k")
L = LinearExpr.var


def test_constructors_drop_zero_coefficients():
    e = LinearExpr({i: 2, j: 0, k: -1}, 3)
    assert e.vars == (i, k)
    assert dict(e.terms) == {i: 2, k: -1}
    assert e.const == 3
    assert LinearExpr.const(5).const == 5 and LinearExpr.const(5).is_const
    assert L(i, 0) == LinearExpr.const(0)
    assert L(j, 3).coeff(j) == 3 and L(j, 3).coeff(i) == 0


def test_arithmetic_with_ints_and_exprs():
    e = 2 * L(i) - L(j) + 3
    assert e == LinearExpr({i: 2, j: -1}, 3)
    assert e - 2 * L(i) == 3 - L(j)
    assert (e + L(j)).vars == (i,)
    assert -e == LinearExpr({i: -2, j: 1}, -3)
    assert 1 + e == e + 1 == LinearExpr({i: 2, j: -1}, 4)
    assert e * 0 == LinearExpr.const(0)
    assert e * LinearExpr.const(2) == LinearExpr({i: 4, j: -2}, 6)


def test_bad_operands_raise_type_error():
    with pytest.raises(TypeError, match="multiplier"):
        L(i) * 1.5
    with pytest.raises(TypeError, match="not linear"):
        L(i) * L(j)
    with pytest.raises(TypeError, match="integer"):
        L(i) + 0.5
    with pytest.raises(TypeError, match="coefficient of i"):
        LinearExpr({i: 1.0})


def test_structural_equality_and_hash_ignore_term_order():
    a = LinearExpr({i: 1, j: 2}, 1)
    b = LinearExpr({j: 2, i: 1}, 1)
    assert a == b and hash(a) == hash(b)
    assert len({a, b, a + 0}) == 1
    assert a != a + 1
    assert (LinearExpr.const(3) == 3) is False  # no coercion: hashes would disagree


def test_vars_in_first_appearance_order():
    e = L(k) + L(i) - L(j)
    assert e.vars == (k, i, j)
    assert (e + L(j) + L(j)).vars == (k, i, j)


def test_terms_are_read_only():
    e = L(i)
    with pytest.raises(TypeError):
        e.terms[i] = 5


@pytest.mark.parametrize("expr, text", [
    (2 * L(i) - L(j) + 3, "2*i - j + 3"),
    (-L(i) + 2 * L(j), "-i + 2*j"),
    (-3 * L(i) - 1, "-3*i - 1"),
    (LinearExpr.const(-4), "-4"),
    (LinearExpr.const(0), "0"),
    (L(i) - L(j) - 3 * L(k), "i - j - 3*k"),
])
def test_str(expr, text):
    assert str(expr) == text


def test_gcd_substitute_evaluate():
    e = 4 * L(i) - 6 * L(j) + 1
    assert e.gcd_of_coeffs() == 2
    assert LinearExpr.const(7).gcd_of_coeffs() == 0
    assert e.substitute({i: L(j) + 1, j: 2}) == 4 * L(j) - 7
    assert e.substitute({k: 5}) == e
    assert e.evaluate({i: 2, j: 1}) == 3
    with pytest.raises(ValueError, match="no value for variable j"):
        e.evaluate({i: 2})
    assert (6 * L(i) + 4).exact_div(2) == 3 * L(i) + 2
    with pytest.raises(ValueError, match="does not divide"):
        (6 * L(i) + 3).exact_div(2)


def test_var_is_fresh_each_time():
    a, b = Var("t"), Var("t")
    assert a != b and str(a) == str(b) == "t"
    assert L(a) + L(b) == LinearExpr({a: 1, b: 1})
    with pytest.raises(TypeError):
        Var(3)


VARS = [i, j, k, "s", ("t", 1)]
exprs = st.builds(
    LinearExpr,
    st.dictionaries(st.sampled_from(VARS), st.integers(-5, 5), max_size=4),
    st.integers(-9, 9))
envs = st.fixed_dictionaries({v: st.integers(-6, 6) for v in VARS})


@settings(max_examples=150, deadline=None)
@given(exprs, exprs, st.integers(-4, 4), envs)
def test_evaluate_is_a_homomorphism(a, b, m, env):
    assert (a + b).evaluate(env) == a.evaluate(env) + b.evaluate(env)
    assert (a - b).evaluate(env) == a.evaluate(env) - b.evaluate(env)
    assert (a * m).evaluate(env) == m * a.evaluate(env)
    assert (-a).evaluate(env) == -a.evaluate(env)
    assert a + b - b == a


@settings(max_examples=150, deadline=None)
@given(exprs, exprs, exprs, envs)
def test_substitute_then_evaluate(e, x, y, env):
    sub = {i: x, j: y}
    inner = dict(env)
    inner[i], inner[j] = x.evaluate(env), y.evaluate(env)
    assert e.substitute(sub).evaluate(env) == e.evaluate(inner)


def test_system_basics_and_printing():
    s = LinearSystem([i], {i: (0, 9), j: (1, 4)},
                     equalities=[L(i) - 2 * L(j)], inequalities=[L(k) - L(i)])
    assert s.variables == (i, j, k)
    assert s.contains({i: 4, j: 2, k: 5})
    assert not s.contains({i: 4, j: 2, k: 3})
    assert not s.contains({i: 2, j: 2, k: 5})
    assert not s.contains({i: 10, j: 5, k: 11})
    assert str(s).splitlines() == ["0 <= i <= 9", "1 <= j <= 4", "i - 2*j == 0", "k - i >= 0"]
    assert len(s.all_inequalities()) == 4 + 2 + 1
    t = s.with_inequality(L(k) - 7).with_equality(0).with_range(k, 0, 20)
    assert s != t and len(s.inequalities) == 1 and len(t.inequalities) == 2
    assert t.ranges[k] == (0, 20)
    assert s == LinearSystem([i], {i: (0, 9), j: (1, 4)}, [L(i) - 2 * L(j)], [L(k) - L(i)])
    assert hash(s) == hash(LinearSystem([i], {i: (0, 9), j: (1, 4)}, [L(i) - 2 * L(j)], [L(k) - L(i)]))
    with pytest.raises(TypeError, match="range of i"):
        LinearSystem(ranges={i: [0, 3]})


@settings(max_examples=100, deadline=None)
@given(st.integers(-3, 3), st.integers(-3, 3), st.integers(-6, 6), st.integers(-6, 6))
def test_system_substitute_keeps_points(a, c, p, q):
    """Substituting i = a*p + q' + c maps points of the new system to points of the old one."""
    s = LinearSystem(ranges={i: (0, 5), j: (-2, 2)}, inequalities=[L(i) - L(j) - 1])
    pv, qv = Var("p"), Var("q")
    image = a * L(pv) + L(qv) + c
    t = s.substitute({i: image})
    assert i not in t.variables and qv in t.variables and (pv in t.variables) == (a != 0)
    for jv in range(-3, 4):
        env = {pv: p, qv: q, j: jv}
        assert t.contains(env) == s.contains({i: image.evaluate(env), j: jv})


def test_transform_apply_inverse_and_compose():
    a, b, c = Var("a"), Var("b"), Var("c")
    first = Transform({i: L(a) + L(j), k: L(b)}, {a: L(i) - L(j), b: L(k)})
    assert first.apply(L(i) + 2 * L(k)) == L(a) + L(j) + 2 * L(b)
    assert first.apply_inverse(L(a) + L(b)) == L(i) - L(j) + L(k)
    second = Transform({a: 2 * L(c) + 1}, {}, new_vars=[c])
    both = first.compose(second)
    assert both.apply(L(i)) == 2 * L(c) + 1 + L(j)
    assert both.apply(L(k)) == L(b)
    assert set(both.new_vars) == {c, b}
    assert dict(both.new_to_old) == {b: L(k)}  # c has no integer inverse in `second`
    with pytest.raises(ValueError, match="no expression over the old variables"):
        both.apply_inverse(L(c))
    third = Transform({b: L(c) - 1}, {c: L(b) + 1})
    chain = first.compose(third)
    assert chain.apply(L(k)) == L(c) - 1
    assert chain.apply_inverse(L(c)) == L(k) + 1
    assert "i = a + j" in str(first)
