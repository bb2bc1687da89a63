"""Reverse mode's sums (te_autodiff/derivative.py, ``factored_sum``): the
contributions a node's uses make to its adjoint share their consumers'
adjoints, and the factor they share is multiplied in once.  Checked against
the plain sum (random products, hypothesis), finite differences and a
hand-written numpy gradient."""
import numpy as np
from hypothesis import given, settings, strategies as st

import te_autodiff as te
from conftest import assert_close
from te_autodiff.derivative import factored_sum
from te_autodiff.expr import BinOp, Const, Load, Unary
from te_autodiff.visit import topo_order

X = te.placeholder((4,), "float64", "x")
LEAVES = [X[0], X[1], te.exp(X[2]), X[3] * X[0]]
NUMPY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "neg": np.negative, "exp": np.exp}


def operations(e) -> int:
    return sum(isinstance(n, (BinOp, Unary)) for n in topo_order([e]))


def evaluate(e, x):
    """``e`` (products, sums, negations, exp of reads of ``X``) at ``X = x``, in numpy."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Load):
        return x[e.indices[0].value]
    if isinstance(e, Unary):
        return NUMPY[e.op](evaluate(e.a, x))
    assert isinstance(e, BinOp), e
    return NUMPY[e.op](evaluate(e.a, x), evaluate(e.b, x))


@st.composite
def products(draw):
    """``k · f1 · f2 ...`` over ``LEAVES`` (repeats allowed), some factors negated."""
    out = te.const(draw(st.sampled_from([1.0, -1.0, 2.0, 0.5])), "float64")
    for k in draw(st.lists(st.integers(0, len(LEAVES) - 1), max_size=5)):
        f = LEAVES[k]
        out = out * (-f if draw(st.booleans()) else f)
    return out


@settings(max_examples=200, deadline=None)
@given(products(), products(), st.lists(st.floats(-2, 2), min_size=4, max_size=4))
def test_the_factored_sum_is_the_sum_and_no_larger(a, b, x):
    got = factored_sum(a, b)
    want = a + b
    assert operations(got) <= operations(want)
    x = np.array(x)
    scale = abs(evaluate(a, x)) + abs(evaluate(b, x)) + 1e-300
    assert abs(evaluate(got, x) - evaluate(want, x)) <= 1e-12 * scale


@st.composite
def long_products(draw):
    """A product of 40 to 60 leaves: past what :func:`factored_sum` opens whole."""
    out = te.const(draw(st.sampled_from([1.0, -1.0, 2.0, 0.5])), "float64")
    for k in draw(st.lists(st.integers(0, len(LEAVES) - 1), min_size=40, max_size=60)):
        out = out * LEAVES[k]
    return out


@settings(max_examples=100, deadline=None)
@given(long_products(), st.lists(st.integers(0, len(LEAVES) - 1), max_size=4),
       st.lists(st.integers(0, len(LEAVES) - 1), max_size=4), st.lists(st.floats(0.5, 1.5), min_size=4, max_size=4))
def test_long_products_share_their_common_product_whole(g, more_a, more_b, x):
    """``g·u + g·(-v)`` with ``g`` long: opened highest first, ``g`` is the common factor, kept whole."""
    a, b = g, g
    for k in more_a:
        a = a * LEAVES[k]
    for k in more_b:
        b = b * -LEAVES[k]
    got, want = factored_sum(a, b), a + b
    assert operations(got) <= operations(want)
    x = np.array(x)
    scale = abs(evaluate(a, x)) + abs(evaluate(b, x)) + 1e-300
    assert abs(evaluate(got, x) - evaluate(want, x)) <= 1e-12 * scale


def test_a_product_of_sums_keeps_its_shape():
    a, b = LEAVES[0] + LEAVES[1], LEAVES[2]
    assert factored_sum(a, b) is a + b              # nothing shared: the plain sum
    assert factored_sum(a * b, a) is a * (b + 1.0)  # the sum itself is a shared factor


def test_the_elementwise_gradient_is_the_one_a_person_writes():
    """``y = tanh(s·e)``, ``s = sigmoid(x)``, ``e = exp(-x²)``: the three paths
    from ``x`` to ``y`` all carry ``(1 - y²)·s·e``, so ``dx`` is that times
    ``(1 - s) - 2x``: the tanh's derivative and each function once."""
    n = 64
    x, H = te.placeholder((n,), "float32", "x"), te.placeholder((n,), "float32", "H")
    y = te.compute((n,), lambda i: te.tanh(te.sigmoid(x[i]) * te.exp(-x[i] * x[i])), name="y")
    (dx,) = te.gradient(y, [x], head=H)
    text = te.pretty(dx).split("dx[i0] =")[1]
    assert text.count("sigmoid(") == 1 and text.count("exp(") == 1, text
    assert text.count("1.0 - y[i0] * y[i0]") == 1, text
    assert "x[i0] * (-2.0)" in text or "(-2.0) * x[i0]" in text, text   # -x·x's two paths: one term, -2x
    rng = np.random.default_rng(3)
    xs, hs = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    s = 1 / (1 + np.exp(-xs.astype(np.float64)))
    u = s * np.exp(-xs.astype(np.float64) ** 2)
    want = hs * (1 - np.tanh(u) ** 2) * u * ((1 - s) - 2 * xs)
    got = te.build([x, H], [dx])(xs, hs)
    assert_close(got, want, rtol=2e-5, atol=2e-6)
    te.check_gradient(y, [x], [xs.astype(np.float64)], head=hs.astype(np.float64))
