"""Integer powers by multiplications (lowering/powers.py): ``te.power(x, k)``
with ``k`` an index converted to float becomes a running product along a
sequential loop, else branch-free square-and-multiply (``powi`` in the
loop IR), else stays ``pow``.

Accuracy is checked against mpmath at 60 digits with the bounds the module
doc derives, in units of u = 2**-53 (the products are float64 for both
dtypes): any ``k - 1`` rounded multiplications are within ``(k - 1) u`` of
``x^k``, and square-and-multiply (or a product started from one, or
stepping by ``x^c``) adds at most ``log2 k`` more, so every form is within
``(k - 1 + bit_length(k)) u``; float32 then rounds once (half an ulp more).
Special values (zeros, infinities, NaN, ±1) must equal numpy's power.
"""
import mpmath as mp
import numpy as np
import pytest

import te_autodiff as te
from lowering.powers import MAX_BITS

U = 2.0 ** -53
LIMIT = 1 << MAX_BITS                  # exponents below this are multiplied
SPECIAL = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan]


def bound(k: int) -> int:
    """The error bound of x^k by multiplications, in units of u."""
    k = abs(k)
    return max(k - 1, 0) + k.bit_length()


def assert_accurate(got, t, ks, dtype):
    """``got[a, b]`` is ``t[a] ** ks[b]`` within the bound (finite, normal values)."""
    with mp.workdps(60):
        for a, x in enumerate(t):
            for b, k in enumerate(ks):
                _check(float(got[a, b]), float(x), int(k), dtype)


def _check(g, x, k, dtype):
    exact = mp.power(mp.mpf(x), k)
    info = np.finfo(dtype)
    if abs(exact) < info.tiny:                  # (sub)normal or 0: precision is lost there, as in any product
        assert abs(g) < 2 * float(info.tiny), (x, k, g)
        return
    if abs(exact) > info.max:
        assert g == float(np.copysign(np.inf, float(exact))), (x, k, g)
        return
    err = abs(mp.mpf(g) - exact) / abs(exact)                 # relative
    allowed = (bound(k) + (1 if k < 0 else 0)) * U            # 1 / x^|k|: one more rounding
    if dtype == "float32":
        allowed += 0.5 * float(np.spacing(np.float32(abs(g)))) / abs(g)
    assert err <= allowed * (1 + 1e-9), (dtype, x, k, g, float(err / U), allowed / U)


def scheduled(kernel) -> str:
    return kernel.scheduled_ir


def running_product(text: str) -> bool:
    """A local ``pwN`` multiplied along its loop (``pwN = pwN * ...``)."""
    return any(line.strip().startswith("pw") and "= pw" in line and " * " in line for line in text.splitlines())


def polynomial(m, dtype, n=16):
    """``Y[i] = sum_j W[j] t[i]^j``: a reduction over ``j`` with the lanes over ``i`` (llsq's form)."""
    T, W = te.placeholder((n,), dtype, "t"), te.placeholder((m,), dtype, "w")
    j = te.reduce_axis(m, "j")
    Y = te.compute((n,), lambda i: te.sum(W[j] * te.power(T[i], j.astype(dtype)), axis=j), name="y")
    return te.build([T, W], [Y])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_power_of_the_reduction_index_is_a_running_product(rng, dtype):
    """t^j in sum_j W_j t^j: no pow, a product along j; with W one-hot at q
    the sum is t^q itself, checked at exponents across 0 .. 2**MAX_BITS - 1."""
    m = LIMIT
    kernel = polynomial(m, dtype)
    text = scheduled(kernel)
    assert running_product(text) and "pow(" not in text and "powi(" not in text, text
    t = np.concatenate([rng.uniform(0.995, 1.005, 10), -rng.uniform(0.995, 1.005, 3), [1.0, -1.0, 0.0]])
    ks = [0, 1, 2, 3, 7, 8, 9, 100, 127, 128, 1000, 2048, m - 2, m - 1]
    got = np.empty((t.size, len(ks)))
    for b, k in enumerate(ks):
        w = np.zeros(m, dtype)
        w[k] = 1.0
        got[:, b] = kernel(t.astype(dtype), w)
    assert_accurate(got, t.astype(dtype), ks, dtype)


def test_a_longer_reduction_keeps_pow(rng):
    """One exponent past 2**MAX_BITS - 1 (the range's bound, not the values
    used) and the power stays pow, about one ulp at any exponent."""
    m = LIMIT + 1
    kernel = polynomial(m, "float64")
    text = scheduled(kernel)
    assert not running_product(text) and "pow(" in text, text
    t = rng.uniform(0.995, 1.005, 16)
    for k in (0, 5, m - 1):
        w = np.zeros(m)
        w[k] = 1.0
        np.testing.assert_allclose(kernel(t, w), t ** k, rtol=4 * U)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_special_values_of_a_running_product(dtype):
    """Zeros, infinities, NaN and ±1 as numpy's power gives them at every
    exponent 0 .. m-1 (0^0 = inf^0 = nan^0 = 1); the exponent is picked by a
    select on data, so every term but one adds an exact 0."""
    m, n = 40, len(SPECIAL)
    T, Q = te.placeholder((n,), dtype, "t"), te.placeholder((1,), "int64", "q")
    j = te.reduce_axis(m, "j")
    Y = te.compute((n,), lambda i: te.sum(te.if_then_else(te.equal(j, Q[0]), te.power(T[i], j.astype(dtype)), 0.0),
                                          axis=j), name="y")
    kernel = te.build([T, Q], [Y])
    text = scheduled(kernel)
    assert running_product(text) and "pow(" not in text, text
    t = np.array(SPECIAL, dtype)
    for k in range(m):
        with np.errstate(all="ignore"):
            want = np.power(t, np.array(k, dtype))
        np.testing.assert_array_equal(kernel(t, np.array([k])), want, err_msg=f"k = {k}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_power_of_an_output_index_squares_and_multiplies(rng, dtype):
    """t_i^j with j an output index (parallel or the vector's lanes: nothing
    to carry): powi with as many bits as the range needs, no pow, up to the
    threshold 2**MAX_BITS - 1; one more column and the part of the loop
    that reaches it keeps pow (the schedule's guard on the last, partial
    vector bounds the rest below the threshold)."""
    n = 12
    T = te.placeholder((n,), dtype, "t")
    t = np.concatenate([rng.uniform(0.995, 1.005, 8), -rng.uniform(0.995, 1.005, 2), [1.0, 0.5]]).astype(dtype)
    for m in (LIMIT, LIMIT + 1):
        P = te.compute((n, m), lambda i, j: te.power(T[i], j.astype(dtype)), name="p")
        kernel = te.build([T], [P])
        text = scheduled(kernel)
        assert "powi(" in text and f"{MAX_BITS} bits" in text and ("pow(" in text) == (m > LIMIT), text
        ks = [0, 1, 2, 3, 15, 16, 17, 255, 1000, 2047, 2048, 2049, m - 2, m - 1]
        assert_accurate(kernel(t)[:, ks].astype(np.float64), t, ks, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_negative_index_exponents(rng, dtype):
    """t^(j - 10): a signed powi, 1 / t^|k| below zero; at the zeros and
    infinities numpy's values (0^-odd = ±inf by the zero's sign, inf^-k = 0)."""
    m = 40
    t = np.concatenate([rng.uniform(-1.5, 1.5, 9), SPECIAL]).astype(dtype)
    T = te.placeholder(t.shape, dtype, "t")
    P = te.compute((t.size, m), lambda i, j: te.power(T[i], j - 10), name="p")
    kernel = te.build([T], [P])
    text = scheduled(kernel)
    assert "pow(" not in text and "powi(" in text and "±5 bits" in text, text
    got = kernel(t)
    ks = np.arange(-10, m - 10)
    with np.errstate(all="ignore"):
        want = np.power(t.astype(np.float64)[:, None], ks.astype(np.float64)).astype(dtype)
    special = ~np.isfinite(t) | (t == 0) | (np.abs(t) == 1)
    np.testing.assert_array_equal(got[special], want[special])
    assert_accurate(got[~special].astype(np.float64), t[~special], list(ks), dtype)


def test_an_exponent_read_from_data_stays_pow(rng):
    """An int tensor's element has no range the bounds analysis knows: pow."""
    n = 64
    T, K = te.placeholder((n,), "float64", "t"), te.placeholder((n,), "int64", "k")
    kernel = te.build([T, K], [te.compute((n,), lambda i: te.power(T[i], K[i].astype("float64")), name="p")])
    assert "pow(" in scheduled(kernel) and "powi(" not in scheduled(kernel)
    t, k = rng.uniform(0.5, 2, n), rng.integers(-50, 50, n)
    np.testing.assert_allclose(kernel(t, k), t ** k.astype(np.float64), rtol=4 * U)


def test_a_strided_exponent_steps_by_a_power(rng):
    """t^(2j + 1) along j: the product starts at t and steps by t^2."""
    m, n = 50, 16
    T, W = te.placeholder((n,), "float64", "t"), te.placeholder((m,), "float64", "w")
    j = te.reduce_axis(m, "j")
    Y = te.compute((n,), lambda i: te.sum(W[j] * te.power(T[i], (2 * j + 1).astype("float64")), axis=j), name="y")
    kernel = te.build([T, W], [Y])
    text = scheduled(kernel)
    assert running_product(text) and "pow(" not in text, text
    t = rng.uniform(-1.2, 1.2, n)
    w = rng.standard_normal(m)
    want = (w * t[:, None] ** (2 * np.arange(m) + 1)).sum(1)
    np.testing.assert_allclose(kernel(t, w), want, rtol=1e-12, atol=1e-12 * np.abs(w).sum())


def test_the_gradients_of_a_polynomial_in_t():
    """Y_i = sum_j X_j t_i^j.  dX_j = sum_i H_i t_i^j (j the output loop:
    powi) and dt_i = H_i sum_j j X_j t_i^(j-1): the derivative's exponent
    j - 1 is -1 at j = 0, where the rule multiplies by 0; that iteration is
    peeled and the product runs from j = 1, so t = 0 gives X_1, not NaN.
    Both against numpy by hand and central differences."""
    rng = np.random.default_rng(35)
    n, m = 20, 24
    T, X, H = (te.placeholder((s,), "float64", name) for s, name in ((n, "t"), (m, "x"), (n, "h")))
    j = te.reduce_axis(m, "j")
    Y = te.compute((n,), lambda i: te.sum(X[j] * te.power(T[i], j.astype("float64")), axis=j), name="y")
    dT, dX = te.gradient(Y, [T, X], head=H)
    kernel = te.build([T, X, H], [Y, dT, dX])
    text = scheduled(kernel)
    assert "pow(" not in text and "powi(" in text and running_product(text), text
    t = np.concatenate([rng.uniform(-1, 1, n - 4), [0.0, -0.0, 1.0, -1.0]])
    x, h = rng.standard_normal(m), rng.standard_normal(n)
    y, dt, dx = kernel(t, x, h)
    powers = t[:, None] ** np.arange(m)
    np.testing.assert_allclose(y, powers @ x, rtol=1e-13, atol=1e-13)
    want_dt = h * (np.arange(1, m) * x[1:] * t[:, None] ** np.arange(m - 1)).sum(1)
    assert np.isfinite(dt).all()
    np.testing.assert_allclose(dt, want_dt, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, h @ powers, rtol=1e-12, atol=1e-12)
    step = 1e-6
    f = lambda tt, xx: (tt[:, None] ** np.arange(m)) @ xx @ h          # noqa: E731
    fd_t = [(f(t + step * e, x) - f(t - step * e, x)) / (2 * step) for e in np.eye(n)]
    fd_x = [(f(t, x + step * e) - f(t, x - step * e)) / (2 * step) for e in np.eye(m)]
    np.testing.assert_allclose(dt, fd_t, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dx, fd_x, rtol=1e-6, atol=1e-6)


def test_a_triangular_domain_peels_and_guards():
    """Y_i = sum_{j < i} X_j t_i^j: zero elimination gives dt a reduction
    over j in [0, i), an extent that is 0 at i = 0, and the exponent j - 1:
    the product is entered only where the loop runs, after a peeled part as
    long as min(i, 1).  dX_j sums over i in (j, n) with j the output loop."""
    rng = np.random.default_rng(36)
    n = 20
    T, X = te.placeholder((n,), "float64", "t"), te.placeholder((n,), "float64", "x")
    j = te.reduce_axis(n, "j")
    Y = te.compute((n,), lambda i: te.sum(te.if_then_else(j < i, X[j] * te.power(T[i], j.astype("float64")), 0.0),
                                          axis=j), name="y")
    dT, dX = te.gradient(Y, [T, X])
    kernel = te.build([T, X], [dT, dX])
    text = scheduled(kernel)
    assert "pow(" not in text and running_product(text) and "powi(" in text, text
    t = np.concatenate([rng.uniform(-1.5, 1.5, n - 2), [0.0, -0.0]])
    x = rng.standard_normal(n)
    dt, dx = kernel(t, x)
    want_dt = [sum(x[q] * q * t[i] ** (q - 1) for q in range(1, i)) for i in range(n)]
    want_dx = [sum(t[i] ** q for i in range(q + 1, n)) for q in range(n)]
    assert np.isfinite(dt).all()
    np.testing.assert_allclose(dt, want_dt, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-12)
