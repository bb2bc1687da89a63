"""Differential fuzzing against PyTorch (the ``fuzz`` package), and the bugs it found.

* 300 random programs (exploration seed 13), each built by te (forward,
  gradients, sometimes second-order gradients: one kernel) and run by
  ``torch.autograd`` on the same float64 data, in child processes: every
  output agrees, every bad argument is refused naming its placeholder, NaN
  and inf inputs compute and do not leak into values torch finds finite,
  and nothing crashes or hangs.
* A few hundred programs of the targeted forms (exploration seed 17):
  selects around gathers, equality guards, non-affine guarded indices,
  one-element max, min and sum (``fuzz/forms.py``), every form generated;
  and large programs on both sides of every threshold of the schedule
  (``fuzz/large.py``), every template and side generated (marked slow);
  a program failing on a library bug not yet fixed is listed in ``KNOWN``
  (each reduced to a small program and reported), any other fails.
* The runner itself: an abort or a hang in a child is the failure of the
  program it was running, and the rest of the batch still runs.
* Regressions: fixed programs that te refused (IndexError at ``te.build`` or
  at the call, TypeError in ``te.gradient``) though the program never reads
  out of range, compared with torch.  Each was found by the fuzzer;
  ``python -m fuzz`` explores more.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch.autograd is the fuzzer's oracle (pip install -e '.[torch]')")

import te_autodiff as te  # noqa: E402  (after the skip above)
from fuzz.check import compare  # noqa: E402
from fuzz import forms, large  # noqa: E402
from fuzz.programs import generate, is_large  # noqa: E402
from fuzz.runner import program_seeds, run, run_batch, targeted_seeds  # noqa: E402
from fuzz.torch_ops import ax, cread, float64_default, grad, red  # noqa: E402

SEED, PROGRAMS = 13, 300
TARGETED_SEED, FORMS, LARGE = 17, 80, 100
# programs failing on a library bug not fixed yet, each reduced to a repro
# the fuzzer's report names; the run must not fail on any other
KNOWN = {}
F64 = "float64"
# programs that failed in an exploration, on a library bug since fixed (each
# also a reduced regression test where the fix is): they stay fixed
FOUND = (71000187, 71002195, 71003427, 72000615, 72000919, 72001077, 72001389, 72002020, 73019841,
         53000318, 59006724, 59011692, 59012196)


def test_programs_explorations_found_stay_fixed():
    summary = run(list(FOUND), jobs=2, batch=-(-len(FOUND) // 2), timeout=300)
    assert summary.count == len(FOUND)
    assert not summary.failures, "\n".join(summary.report(r) for r in summary.failures[:3])


def test_random_programs_agree_with_torch():
    summary = run(program_seeds(SEED, PROGRAMS), jobs=2, batch=PROGRAMS // 2, timeout=120)
    assert summary.count == PROGRAMS
    failures = [r for r in summary.failures if r["seed"] not in KNOWN]
    assert not failures, "\n".join(summary.report(r) for r in failures[:3])
    covered = {"second:squares", "second:head", "reduce:max", "reduce:min", "reduce:prod", "reduce:nested",
               "index:data", "data:gather", "data:nested_key", "guard:outer", "index:reshape", "batch:empty",
               "select:data", "pow:expr", "nonfinite", "shared:expr", "large", "gather:select", "guard:equal",
               "index:nonaffine", "guard:nonaffine", "one:max", "one:min"}
    assert not covered - set(summary.features), f"never generated: {covered - set(summary.features)}"


def _covering(seeds, features, count):
    """The first ``count`` of ``seeds``, then those of the rest that bring a
    feature of ``features`` none before had (every one, if ``seeds`` has it)."""
    out, seen = [], set()
    for seed in seeds:
        if len(out) >= count and features <= seen:
            break
        new = generate(seed).features
        if len(out) < count or new & (features - seen):
            out.append(seed)
            seen |= new
    return out


def _run_covering(seeds, features, count):
    """Run the :func:`_covering` seeds; none fails but the ``KNOWN`` ones, every one of ``features`` is generated."""
    seeds = _covering(seeds, features, count)
    summary = run(seeds, jobs=2, batch=-(-len(seeds) // 2), timeout=300)
    assert summary.count == len(seeds)
    failures = [r for r in summary.failures if r["seed"] not in KNOWN]
    assert not failures, "\n".join(summary.report(r) for r in failures[:3])
    missing = features - set(summary.features)
    assert not missing, f"never generated: {sorted(missing)}"


def test_targeted_forms_agree_with_torch():
    seeds = [s for s in targeted_seeds(TARGETED_SEED, 3 * FORMS) if not is_large(s)]
    _run_covering(seeds, forms.FEATURES, FORMS)


@pytest.mark.slow
def test_large_programs_agree_with_torch():
    seeds = [s for s in range(TARGETED_SEED * 1_000_000, TARGETED_SEED * 1_000_000 + 400 * LARGE) if is_large(s)]
    _run_covering(seeds, large.FEATURES, LARGE)


def test_a_crash_or_hang_is_the_failure_of_its_program(monkeypatch):
    seeds = program_seeds(SEED, 4)
    monkeypatch.setenv("FUZZ_FAULT", f"{seeds[1]}:abort,{seeds[2]}:hang")
    records = {r["seed"]: r for r in run_batch(seeds, timeout=5)}
    assert [records[s]["status"] for s in seeds] == ["ok", "crash", "hang", "ok"]
    assert "exit code -6" in records[seeds[1]]["detail"]            # SIGABRT, confirmed alone


def test_nan_and_inf_propagate_as_in_torch():
    X = te.placeholder((6,), F64, "X")
    k = te.reduce_axis(6, "k")
    Y = te.compute((6,), lambda i: te.exp(te.tanh(X[i])) * te.log(X[i] * X[i] + 1.0) / te.sqrt(X[i] * X[i] + 0.5)
                   + te.sum(te.sigmoid(X[k]) * X[i], axis=k), name="Y")
    (dX,) = te.gradient(Y, [X])
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 1.5, -2.0])
    got = te.build([X], [Y, dX])(x)
    t = torch.tensor(x, requires_grad=True)
    y = torch.exp(torch.tanh(t)) * torch.log(t * t + 1) / torch.sqrt(t * t + 0.5) + (torch.sigmoid(t).sum() * t)
    want = [y.detach().numpy(), grad(y, [t])[0].numpy()]
    assert compare(["Y", "dX"], list(got), want, nonfinite=True) is None
    # nothing here folds or reassociates a NaN away: the same elements are not finite
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_array_equal(np.isinf(g), np.isinf(w))


# --------------------------------------------------------------------------- regressions


def _agree(inputs, outputs, reference, arrays, target=None):
    """te's kernel (for ``target``) and ``reference`` (torch, float inputs
    requiring grad) give the same outputs."""
    got = te.build(inputs, outputs, target=target)(*arrays)
    got = list(got) if isinstance(got, tuple) else [got]
    tensors = [torch.tensor(a, requires_grad=a.dtype == np.float64) for a in arrays]
    with float64_default():
        want = [w.detach().numpy() for w in reference(*tensors)]
    assert compare([t.name for t in outputs], got, want) is None




def test_second_order_through_a_guarded_key(rng):
    """The adjoint's coefficient was the stored value of the first gradient
    (``exp``'s derivative is itself), which swallowed the guard ``o1 >= 0``
    protecting the key ``J[i1 - i0]``: ``te.build`` raised IndexError."""
    T = te.placeholder((3, 1, 2), F64, "T")
    J = te.placeholder((3,), "int64", "J")
    H = te.placeholder((4, 3), F64, "H")
    K = te.placeholder((3, 1, 2), F64, "K")
    Y = te.compute((4, 3), lambda a, b: te.if_then_else(te.any(a >= 3, a + b >= 1), 0.0, te.exp(T[a, a + b, J[b]])),
                   name="Y")
    (dT,) = te.gradient(Y, [T], head=H)
    (ddT,) = te.gradient(dT, [T], head=K)

    def reference(t, j, h, k):
        a, b = torch.arange(4)[:, None], torch.arange(3)[None, :]
        y = torch.where((a < 3) & (a + b < 1), torch.exp(cread(t, a, a + b, j[b])), 0.0)
        (dt,) = grad(y, [t], h, create_graph=True)
        return [y, dt, grad(dt, [t], k)[0]]
    _agree([T, J, H, K], [Y, dT, ddT], reference,
           [rng.standard_normal((3, 1, 2)), np.array([1, 0, 1]), rng.standard_normal((4, 3)),
            rng.standard_normal((3, 1, 2))])


@pytest.mark.parametrize("optimize", [True, False])
def test_a_key_read_under_a_guard(rng, optimize):
    """``E[J[n - 1], d]`` under ``n >= 1``: the naive gradient tested the key
    before the guard (IndexError at build)."""
    E = te.placeholder((5, 2), F64, "E")
    J = te.placeholder((4,), "int32", "J")
    Y = te.compute((4, 2), lambda n, d: te.if_then_else(n >= 1, E[J[n - 1], d], 0.0), name="Y")
    (dE,) = te.gradient(Y, [E], optimize=optimize)

    def reference(e, j):
        n = torch.arange(4)[:, None]
        y = torch.where(n >= 1, cread(e, j[(n - 1).clamp(min=0)].long(), torch.arange(2)[None, :]), 0.0)
        return [y, grad(y, [e])[0]]
    _agree([E, J], [Y, dE], reference, [rng.standard_normal((5, 2)), np.array([0, 4, 2, 4], "int32")])


def test_a_dead_branch_in_a_second_order_gradient(rng):
    """The select's branch reading ``X[3c + 3a + 1, c + b]`` is never taken
    (``2a + c - 1 > 2`` with ``a = 0``, ``c < 4``); zero elimination kept it,
    under a guard no point meets, and the second-order gradient read ``Y``
    (the quotient's derivative) out of range: IndexError at build."""
    X = te.placeholder((3, 1), F64, "X")

    def den(a, b, c):
        t = c * 3 + a * 3 + 1
        taken = te.if_then_else(te.all(c >= 0, c < 3), X[c, b], 0.0)
        dead = te.if_then_else(te.all(t >= 0, t < 3, c + b >= 0, c + b < 1), te.tanh(X[t, c + b]), 0.5)
        return te.abs(te.sigmoid(te.if_then_else(te.not_(a * 2 + c - 1 > 2), taken, dead))) + 1.0
    Y = te.compute((1, 1, 4), lambda a, b, c: X[1, 0] * X[1, 0] / den(a, b, c), name="Y")
    (dX,) = te.gradient(Y, [X])
    S = te.compute((3, 1), lambda i, j: dX[i, j] * dX[i, j], name="S")
    (ddX,) = te.gradient(S, [X])

    def reference(x):
        c = torch.arange(4)
        y = (x[1, 0] * x[1, 0] / (torch.abs(torch.sigmoid(torch.where(c < 3, cread(x, c, 0), 0.0))) + 1.0))
        y = y.reshape(1, 1, 4)
        (dx,) = grad(y, [x], create_graph=True)
        return [y, dx, grad((dx * dx).sum(), [x])[0]]
    _agree([X], [Y, dX, ddX], reference, [rng.standard_normal((3, 1))])


def test_a_gather_of_an_offset_column(rng):
    """``X[I[b, a], b + 4]``: the match sum of the gradient has a row per
    column of ``X`` but only column 4 has keys; the others read ``I`` out of range."""
    X = te.placeholder((2, 5), F64, "X")
    I = te.placeholder((1, 2), "int32", "I")
    Y = te.compute((2, 1), lambda a, b: X[I[b, a], b + 4], name="Y")
    (dX,) = te.gradient(Y, [X])

    def reference(x, i):
        y = x[i.long().T, 4]
        return [y, grad(y, [x])[0]]
    _agree([X, I], [Y, dX], reference, [rng.standard_normal((2, 5)), np.array([[1, 1]], "int32")])


def test_a_match_sum_whose_value_reads_out_of_range_in_unused_rows(rng):
    """``X[J[a] + b, b + 2]``: the match sum's value ``H[p, row - 2]`` was
    computed in rows 0 and 1 too, which the gradient never reads."""
    X = te.placeholder((4, 6), F64, "X")
    J = te.placeholder((5,), "int32", "J")
    H = te.placeholder((5, 4), F64, "H")
    Y = te.compute((5, 4), lambda a, b: te.if_then_else(te.all(J[a] + b >= 0, J[a] + b < 4),
                                                        te.tanh(X[J[a] + b, b + 2]), 0.0), name="Y")
    (dX,) = te.gradient(Y, [X], head=H)

    def reference(x, j, h):
        a, b = torch.arange(5)[:, None], torch.arange(4)[None, :]
        key = j[a].long() + b
        y = torch.where(key < 4, torch.tanh(cread(x, key, b + 2)), 0.0)
        return [y, grad(y, [x], h)[0]]
    _agree([X, J, H], [Y, dX], reference,
           [rng.standard_normal((4, 6)), np.array([0, 3, 1, 2, 0], "int32"), rng.standard_normal((5, 4))])


def test_a_nested_key_under_a_guard(rng):
    """``X[J[I[n]]]`` under ``0 <= I[n] < 3``: the match sum's key read
    ``J`` at ``I[n] = -1`` (IndexError at the call)."""
    X = te.placeholder((5,), F64, "X")
    I = te.placeholder((4,), "int32", "I")
    J = te.placeholder((3,), "int32", "J")
    Y = te.compute((4,), lambda n: te.if_then_else(te.all(I[n] >= 0, I[n] < 3), X[J[I[n]]] * 2.0, 0.0), name="Y")
    (dX,) = te.gradient(Y, [X])

    def reference(x, i, j):
        ok = (i >= 0) & (i < 3)
        y = torch.where(ok, cread(x, cread(j, i.long()).long()) * 2.0, 0.0)
        return [y, grad(y, [x])[0]]
    _agree([X, I, J], [Y, dX], reference,
           [rng.standard_normal(5), np.array([0, -1, 2, 7], "int32"), np.array([4, 1, 0], "int32")])


def test_second_order_of_a_slice(rng):
    """``T[0, j] = sqrt(X[j]^2 + 1)`` over the first 4 of 6 elements: two
    adjoint contributions guarded by ``i <= 3`` were added outside the guard,
    and the second-order gradient read ``T[0, i]`` for ``i`` up to 5."""
    X = te.placeholder((6,), F64, "X")
    H = te.placeholder((1, 4), F64, "H")
    T = te.compute((1, 4), lambda a, j: te.sqrt(X[j] * X[j] + 1.0), name="T")
    (dX,) = te.gradient(T, [X], head=H)
    S = te.compute((6,), lambda i: dX[i] * dX[i], name="S")
    ddX, dH = te.gradient(S, [X, H])

    def reference(x, h):
        t = torch.sqrt(x[:4] * x[:4] + 1.0)[None, :]
        (dx,) = grad(t, [x], h, create_graph=True)
        return [t, dx, *grad((dx * dx).sum(), [x, h])]
    _agree([X, H], [T, dX, ddX, dH], reference, [rng.standard_normal(6), rng.standard_normal((1, 4))])


def test_a_point_condition_before_the_data_conditions(rng):
    """``Y[a, b] = min(X[b + 1, 2a], T[2a + b])`` with ``b`` in 0..0: the
    gradient sums the one point ``a = i // 2, b = i % 2`` under ``i % 2 == 0``,
    but tested the min's comparison (reading ``X[i % 2 + 1]``) first."""
    X = te.placeholder((2, 3), F64, "X")
    T = te.placeholder((2,), F64, "T")
    Y = te.compute((5, 1), lambda a, b: te.minimum(
        te.if_then_else(te.all(a * 2 >= 0, a * 2 < 3), X[b + 1, a * 2], 0.0),
        te.if_then_else(te.all(a * 2 + b >= 0, a * 2 + b < 2), T[a * 2 + b], 0.0)), name="Y")
    (dT,) = te.gradient(Y, [T])

    def reference(x, t):
        a = torch.arange(5)[:, None]
        left = torch.where(a * 2 < 3, cread(x, a * 0 + 1, a * 2), 0.0)
        right = torch.where(a * 2 < 2, cread(t, a * 2), 0.0)
        y = torch.where(left <= right, left, right)
        return [y, grad(y, [t])[0]]
    _agree([X, T], [Y, dT], reference, [rng.standard_normal((2, 3)), rng.standard_normal(2)])


def test_a_match_sum_whose_rows_are_restricted_by_a_condition(rng):
    """``X[I[a, b] + b, (5 - b) % 2]`` read where ``(5 - b) % 2 < 1`` (never:
    ``b`` is 0): the match sum has a row per value of the second index, and
    in row 0 (``b = 1``, out of ``I``) its key and value read ``I`` out of
    range; the condition excluding that row stayed outside the sum."""
    X = te.placeholder((1, 1), F64, "X")
    I = te.placeholder((3, 1), "int32", "I")
    H = te.placeholder((3, 1), F64, "H")
    Y = te.compute((3, 1), lambda a, b: te.if_then_else(te.all((5 - b) % 2 >= 0, (5 - b) % 2 < 1),
                                                        te.tanh(X[I[a, b] + b, (5 - b) % 2]), -1.0), name="Y")
    (dX,) = te.gradient(Y, [X], head=H)

    def reference(x, i, h):
        y = torch.full((3, 1), -1.0, dtype=torch.float64) + 0.0 * x.sum()
        return [y, grad(y, [x], h)[0]]
    _agree([X, I, H], [Y, dX], reference, [rng.standard_normal((1, 1)), np.zeros((3, 1), "int32"),
                                           rng.standard_normal((3, 1))])


def test_a_reduction_under_a_condition_on_more_variables(rng):
    """``s * s`` with ``s = Σ_k X[i - 1, k]`` under ``i >= 1 and j == 0``: the
    reduction is lifted into a tensor over ``i``, and ``i >= 1`` was dropped
    with the condition it is a conjunct of (which also reads ``j``): the
    lifted tensor read ``X[-1, k]``."""
    X = te.placeholder((3, 4), F64, "X")
    k = te.reduce_axis(4, "k")

    def body(i, j):
        s = te.sum(X[i - 1, k], axis=k)
        return te.if_then_else(te.all(i >= 1, te.equal(j, 0)), s * s, 0.0)
    Y = te.compute((3, 2), body, name="Y")
    (dX,) = te.gradient(Y, [X])

    def reference(x):
        s = torch.cat([torch.zeros(1), x[:2].sum(1)])[:, None]
        y = torch.where((torch.arange(3)[:, None] >= 1) & (torch.arange(2)[None, :] == 0), s * s, 0.0)
        return [y, grad(y, [x])[0]]
    _agree([X], [Y, dX], reference, [rng.standard_normal((3, 4))])


def test_a_sum_over_a_range_that_is_neither_affine_nor_fixed(rng):
    """The second-order gradient through a min over ``X0[(r - a + 2) % 2,
    (2a + r + 5) // 4 + a, (-2r - 2) % 4 + a]`` sums over a variable whose
    range is a ``//`` expression: zero elimination looked up the variable's
    fixed range, which it has not (TypeError in ``te.gradient``)."""
    X0 = te.placeholder((3, 2, 6), F64, "X0")
    X1 = te.placeholder((2, 3), F64, "X1")
    H = te.placeholder((1,), F64, "H")
    r = te.reduce_axis(3, "r")

    def t0(a):
        mid = (a * 2 + r + 5) // 4 + a
        return te.min(te.if_then_else(te.all(mid >= 0, mid < 2), X0[(r - a + 2) % 2, mid, (r * -2 - 2) % 4 + a], 0.5),
                      axis=r) / 0.5
    T0 = te.compute((3,), t0, name="T0")
    Y = te.compute((1,), lambda a: X1[1, 1] * T0[a + 1], name="Y")
    dX0, dX1 = te.gradient(Y, [X0, X1], head=H)
    K = te.placeholder(dX0.shape, F64, "K")
    second = te.gradient(dX0, [X0, X1, H], head=K)

    def reference(x0, x1, h, k):
        a, r = ax(0, 3, 0, 2), ax(0, 3, 1, 2)
        mid = torch.div(a * 2 + r + 5, 4, rounding_mode="floor") + a
        body = torch.where((mid >= 0) & (mid < 2), cread(x0, (r - a + 2) % 2, mid, (r * -2 - 2) % 4 + a), 0.5)
        t0 = red("min", body, (3,), (3,)) / 0.5
        y = x1[1, 1] * t0[1:2]
        d0, d1 = grad(y, [x0, x1], h, create_graph=True)
        return [y, d0, d1, *grad(d0, [x0, x1, h], k)]
    _agree([X0, X1, H, K], [Y, dX0, dX1, *second], reference,
           [rng.standard_normal((3, 2, 6)), rng.standard_normal((2, 3)), rng.standard_normal(1),
            rng.standard_normal((3, 2, 6))])


def test_a_key_from_a_segment_condition_under_a_guard(rng):
    """``I1[a] == c`` selects ``c``, under which ``X0[I2[c, c + 1] + c]`` is read
    if ``c + 1 < 4``: the gradient substitutes ``c = I1[a]`` and tested the
    range of ``c`` after the conditions reading ``I2[c, c + 1]`` (IndexError
    at the call for ``I1[a] = 3``)."""
    X0 = te.placeholder((3,), F64, "X0")
    I1 = te.placeholder((2,), "int32", "I1")
    I2 = te.placeholder((5, 4), "int32", "I2")

    def key(c):
        return I2[c, c + 1] + c
    Y = te.compute((2, 4), lambda a, c: te.if_then_else(
        te.equal(I1[a], c), te.if_then_else(te.all(c + 1 < 4, key(c) >= 0, key(c) < 3), X0[key(c)], 0.0) * 2.0,
        0.0), name="Y")
    (dX0,) = te.gradient(Y, [X0])

    def reference(x0, i1, i2):
        a, c = torch.arange(2)[:, None], torch.arange(4)[None, :]
        k = cread(i2, c, c + 1).long() + c
        y = torch.where((i1[a] == c) & (c + 1 < 4) & (k >= 0) & (k < 3), cread(x0, k) * 2.0, 0.0)
        return [y, grad(y, [x0])[0]]
    _agree([X0, I1, I2], [Y, dX0], reference,
           [rng.standard_normal(3), np.array([3, 1], "int32"), rng.integers(0, 2, (5, 4)).astype("int32")])


def test_a_reduction_bounded_by_a_condition_on_two_variables(rng):
    """``s * s`` with ``s = Σ_k X[j - 1, k]`` under ``i >= 1 and j >= i``: only
    both conditions together keep ``j - 1`` in range, and the first mentions
    no variable of the reduction, so the tensor the reduction is lifted into
    takes ``i`` as an axis too (over ``j`` alone it read ``X[-1, k]``)."""
    X = te.placeholder((3, 4), F64, "X")
    k = te.reduce_axis(4, "k")

    def body(i, j):
        s = te.sum(X[j - 1, k], axis=k)
        return te.if_then_else(te.all(i >= 1, j >= i), s * s, 0.0)
    Y = te.compute((2, 4), body, name="Y")
    (dX,) = te.gradient(Y, [X])

    def reference(x):
        s = torch.cat([torch.zeros(1), x.sum(1)])[None, :]
        i, j = torch.arange(2)[:, None], torch.arange(4)[None, :]
        y = torch.where((i >= 1) & (j >= i), s * s, 0.0)
        return [y, grad(y, [x])[0]]
    _agree([X], [Y, dX], reference, [rng.standard_normal((3, 4))])


def test_a_max_whose_row_is_chosen_by_a_key():
    """``max_r (I[a, 0] == b ? X[(r + 5) // 3] : 3)``: the gradient solves
    ``b = I[a, 0]`` and read the first position of the max at ``[a, I[a, 0]]``
    before testing that ``I[a, 0]`` is a valid ``b`` (IndexError at the call
    for ``I[a, 0] = -1``)."""
    X = te.placeholder((4,), F64, "X")
    I = te.placeholder((3, 2), "int32", "I")
    r = te.reduce_axis((2, 5), "r")
    Y = te.compute((3, 4), lambda a, b: te.max(te.if_then_else(te.equal(I[a, 0], b), X[(r + 5) // 3], 3.0), axis=r),
                   name="Y")
    (dX,) = te.gradient(Y, [X])

    def reference(x, i):
        a, b, r = ax(0, 3, 0, 3), ax(0, 4, 1, 3), ax(2, 3, 2, 3)
        y = red("max", torch.where(i[a, 0] == b, x[torch.div(r + 5, 3, rounding_mode="floor")], 3.0), (3, 4), (3,))
        return [y, grad(y, [x])[0]]
    _agree([X, I], [Y, dX], reference, [np.array([4.0, 1.0, 5.0, 2.0]), np.array([[-1, 0], [2, 0], [3, 1]], "int32")])


def test_the_gradient_of_a_min_in_the_vector_tail():
    """``min_r X[o] / D[r]`` over 5 rows (4 vector lanes and a tail of 1): the
    derivative finds the first ``r`` where the recomputed ``X[o] / D[r]``
    equals the stored minimum, but with the ``arcp`` fast-math flag one stage
    divided and the other multiplied by ``1 / D[r]``, so a quarter of the tail
    rows found none and lost their gradient."""
    X = te.placeholder((5,), F64, "X")
    D = te.placeholder((2,), F64, "D")
    r = te.reduce_axis(2, "r")
    Y = te.compute((5,), lambda o: te.min(X[o] / D[r], axis=r), name="Y")
    dX, dD = te.gradient(Y, [X, D])
    kernel = te.build([X, D], [Y, dX, dD])
    for seed in range(20):
        data = np.random.default_rng(seed)
        x, d = data.uniform(-2, 2, 5), data.uniform(0.5, 2, 2)
        t, u = torch.tensor(x, requires_grad=True), torch.tensor(d, requires_grad=True)
        y = red("min", t[:, None] / u[None, :], (5,), (2,))
        want = [y.detach().numpy(), *(g.numpy() for g in grad(y, [t, u]))]
        assert compare(["Y", "dX", "dD"], list(kernel(x, d)), want) is None, seed


def test_a_factor_kept_inside_a_guarded_sum(rng):
    """A second-order gradient sums ``ddX.r[k]`` under conditions that also
    keep ``i + j - 1`` in range, times a factor reading ``X[i + j - 1, ...]``
    that does not depend on ``k``: moved out of the sum, the factor read ``X``
    out of range wherever the sum is empty (IndexError at build)."""
    X0 = te.placeholder((4, 5), F64, "X0")
    X1 = te.placeholder((7, 4), F64, "X1")
    H = te.placeholder((4, 5, 2), F64, "H")

    def body(a, b, c):
        p, q, s = (c * 2 + 4) % 4 + b, (b + 4) // 4 + a, b + a - 1
        left = te.if_then_else(te.any(p < 0, p >= 5), 0.0, X0[3, p])
        right = te.if_then_else(te.all(q >= 0, q < 4), X0[q, 0], 0.0)
        mid = te.if_then_else(te.all(s >= 0, s < 4, b + c >= 0, b + c < 5), X0[s, b + c], 0.0)
        return (left - right) * (mid / (te.abs(X1[b, c + 1]) + 0.5))
    Y = te.compute((4, 5, 2), body, name="Y")
    (dX0,) = te.gradient(Y, [X0], head=H)
    S = te.compute((4, 5), lambda i, j: dX0[i, j] * dX0[i, j], name="S")
    ddX0, dH = te.gradient(S, [X0, H])

    def reference(x0, x1, h):
        a, b, c = ax(0, 4, 0, 3), ax(0, 5, 1, 3), ax(0, 2, 2, 3)
        p, q, s = (c * 2 + 4) % 4 + b, torch.div(b + 4, 4, rounding_mode="floor") + a, b + a - 1
        left = torch.where((p >= 0) & (p < 5), cread(x0, p * 0 + 3, p), 0.0)
        right = torch.where((q >= 0) & (q < 4), cread(x0, q, q * 0), 0.0)
        mid = torch.where((s >= 0) & (s < 4) & (b + c < 5), cread(x0, s, b + c), 0.0)
        y = (left - right) * (mid / (torch.abs(x1[b, c + 1]) + 0.5))
        (d0,) = grad(y, [x0], h, create_graph=True)
        return [y, d0, *grad((d0 * d0).sum(), [x0, h])]
    _agree([X0, X1, H], [Y, dX0, ddX0, dH], reference,
           [rng.standard_normal((4, 5)), rng.standard_normal((7, 4)), rng.standard_normal((4, 5, 2))])


def test_the_gradient_of_a_power_at_zero():
    """``X ** E`` at ``X = 0``: the derivative in ``X`` where ``E = 0`` and the
    one in ``E`` where ``E >= 0`` are 0 (the power is constant there), as in
    torch; the formulas gave ``0 * inf`` (NaN) and ``log(0)`` (-inf)."""
    X = te.placeholder((3,), F64, "X")
    E = te.placeholder((3,), F64, "E")
    Y = te.compute((3,), lambda i: te.power(X[i], E[i]), name="Y")
    dX, dE = te.gradient(Y, [X, E])

    def reference(x, e):
        y = torch.pow(x, e)
        return [y, *grad(y, [x, e])]
    _agree([X, E], [Y, dX, dE], reference, [np.array([0.0, 0.0, 2.0]), np.array([0.0, 1.5, 0.0])])


def test_an_inverse_index_over_a_box_of_positions(rng):
    """The second-order gradient inverts the key ``2 I[b, b]`` of a read at
    ``(5 - b) % 3``: its positions are a box (``b`` solved from the column
    and a quotient) with points where ``b = 5``, outside ``I``, and the
    counting sort read the key there (IndexError at build)."""
    X = te.placeholder((7, 5), F64, "X")
    I = te.placeholder((5, 4), "int32", "I")
    H = te.placeholder((2,), F64, "H")
    r1, r2 = te.reduce_axis((1, 3), "r1"), te.reduce_axis((1, 4), "r2")
    T = te.compute((5, 4), lambda a, b: te.sqrt(X[I[b, b] * 2, (5 - b) % 3] * X[I[b, b] * 2, (5 - b) % 3] + 0.5),
                   name="T")
    Y = te.compute((2,), lambda o: te.max(te.sum(X[(o * 2 + r1 - 1) // 5, (o * 2 + r1 - 1) % 5], axis=r2), axis=r1)
                   + T[o + 1, o + 2], name="Y")
    (dX,) = te.gradient(Y, [X], head=H)
    S = te.compute((7, 5), lambda i, j: dX[i, j] * dX[i, j], name="S")
    ddX, dH = te.gradient(S, [X, H])

    def reference(x, i, h):
        a, b = ax(0, 5, 0, 2), ax(0, 4, 1, 2)
        t = torch.sqrt(x[i[b, b].long() * 2, (5 - b) % 3] ** 2 + 0.5).expand(5, 4)
        o, r = ax(0, 2, 0, 2), ax(1, 2, 1, 2)
        f = o * 2 + r - 1
        y = red("max", 3.0 * x[torch.div(f, 5, rounding_mode="floor"), f % 5], (2,), (2,)) + t[[1, 2], [2, 3]]
        (d,) = grad(y, [x], h, create_graph=True)
        return [y, d, *grad((d * d).sum(), [x, h])]
    _agree([X, I, H], [Y, dX, ddX, dH], reference,
           [rng.standard_normal((7, 5)), rng.integers(0, 4, (5, 4)).astype("int32"), rng.standard_normal(2)])


def test_a_program_on_which_llvm_looped(rng):
    """LLVM 22.1's VectorCombine never finished on the code its SLP vectoriser
    made of this gradient (a product over a window read at ``(2 b + r) // 3``
    and ``% 3``): the build hung.  VectorCombine is now switched off
    (``llvm_process._initialise``); the build must finish and agree with torch
    (a hang would stop it after ``slp_budget`` and warn: see
    tests/test_reliability.py)."""
    X0 = te.placeholder((3, 3), F64, "X0")
    I1 = te.placeholder((3, 5), "int32", "I1")
    H = te.placeholder((3, 5), F64, "H")
    r = te.reduce_axis(2, "r")
    T0 = te.compute((3, 4, 5), lambda a, b, c: te.prod(te.tanh(X0[(b * 2 + r) // 3, (b * 2 + r) % 3]), axis=r),
                    name="T0")
    Y = te.compute((3, 5), lambda a, b: te.sigmoid(te.if_then_else(te.all(b >= 0, b < 4), T0[a, b, b], 0.0)
                                                   + te.if_then_else(te.all(b >= 0, b < 4),
                                                                     te.tanh(T0[a, b, I1[a, b]]), 0.5)), name="Y")
    (dX0,) = te.gradient(Y, [X0], head=H)

    def reference(x0, i1, h):
        a, b, c, r = ax(0, 3, 0, 4), ax(0, 4, 1, 4), ax(0, 5, 2, 4), ax(0, 2, 3, 4)
        t0 = red("prod", torch.tanh(x0[torch.div(b * 2 + r, 3, rounding_mode="floor"), (b * 2 + r) % 3]),
                 (3, 4, 5), (2,))
        a, b = ax(0, 3, 0, 2), ax(0, 5, 1, 2)
        inside = (b >= 0) & (b < 4)
        y = torch.sigmoid(torch.where(inside, cread(t0, a, b, b), 0.0)
                          + torch.where(inside, torch.tanh(cread(t0, a, b, i1[a, b].long())), 0.5))
        return [y, grad(y, [x0], h)[0]]
    _agree([X0, I1, H], [Y, dX0], reference,
           [rng.standard_normal((3, 3)), rng.integers(0, 5, (3, 5)).astype("int32"), rng.standard_normal((3, 5))])


def test_a_condition_on_the_outer_variables_kept_after_the_range_guarding_its_read(rng):
    """The second-order gradient in ``H`` of a read at the key ``I[o - 1] + 2 o``
    (guarded by ``o >= 1``) sums over the columns of ``dX``, where ``o``'s range
    ``max(1, 2 c) .. min(3, 2 c + 1)`` depends on the column ``c``: the key's
    range conditions, on ``o`` alone, moved out of the sum ahead of that range
    and read ``I[-1]`` (IndexError at build)."""
    X = te.placeholder((6, 7), F64, "X")
    I = te.placeholder((4,), "int32", "I")
    K = te.placeholder((6, 7), F64, "K")

    def body(o):
        k = I[o - 1] + o * 2
        return te.if_then_else(te.all(o >= 1, k >= 0, k < 6), X[k, o // 2], 0.0)
    Y = te.compute((4,), body, name="Y")
    H = te.placeholder((4,), F64, "H")
    (dX,) = te.gradient(Y, [X], head=H)
    (dH,) = te.gradient(dX, [H], head=K)

    def reference(x, i, k, h):
        o = torch.arange(4)
        key = cread(i, o - 1).long() + o * 2
        y = torch.where((o >= 1) & (key >= 0) & (key < 6), cread(x, key, torch.div(o, 2, rounding_mode="floor")), 0.0)
        (d,) = grad(y, [x], h, create_graph=True)
        return [y, d, *grad(d, [h], k)]
    _agree([X, I, K, H], [Y, dX, dH], reference,
           [rng.standard_normal((6, 7)), rng.integers(-3, 3, 4).astype("int32"), rng.standard_normal((6, 7)),
            rng.standard_normal(4)])


def test_a_reduction_domain_that_reads_at_an_earlier_axis(rng):
    """The gradient sums over ``q``, ``a`` and ``r``, and the range of ``r``
    reads the key ``I[a, q - i0 // 2]``: in range, since ``q`` runs over
    ``i0 // 2 ..= i0 // 2 + 1``, but the bounds check took each axis's
    range outside the loops of the axes before it, where ``q`` is not bound
    (IndexError at build)."""
    I = te.placeholder((3, 5), "int64", "I")
    X = te.placeholder((6, 3), F64, "X")
    r, s = te.reduce_axis((2, 5), "r"), te.reduce_axis((1, 5), "s")

    def body(a, b, c):
        col = r // 2 + b
        total = te.sum(te.if_then_else(te.all(col >= 0, col < 3), X[s, col], 0.0), axis=[r, s],
                       where=te.equal((c * 2 + s) % 2, 0))
        return te.select(te.equal(I[a, c], b), total, 0.0)
    T = te.compute((3, 5, 2), body, name="T")
    (dX,) = te.gradient(T, [X])

    def reference(i, x):
        b, c, r, s = ax(0, 5, 0, 4), ax(0, 2, 1, 4), ax(2, 3, 2, 4), ax(1, 4, 3, 4)
        col = torch.div(r, 2, rounding_mode="floor") + b
        total = red("sum", torch.where((col < 3) & ((c * 2 + s) % 2 == 0), cread(x, s, col), 0.0), (5, 2), (3, 4))
        a, b, c = ax(0, 3, 0, 3), ax(0, 5, 1, 3), ax(0, 2, 2, 3)
        t = torch.where(i[a, c] == b, total, 0.0)
        return [t, *grad(t, [x])]
    _agree([I, X], [T, dX], reference, [rng.integers(0, 5, (3, 5)), rng.standard_normal((6, 3))])


def test_a_match_sum_row_whose_read_only_the_other_outer_variables_keep_in_range(rng):
    """The gradient of a read ``X[b + b % 2, b, I[a, b]]`` (guarded by
    ``b + b % 2 < 2``) sums over ``a`` where the key ``I[a, b]`` is ``k``,
    one row of a match sum per ``b``.  The guard holds where the outer
    ``i0 == b + b % 2``, a condition on ``i0`` and ``b`` together, so no row
    condition kept the rows ``b >= 2`` from reading ``X[2]`` and ``X[4]``
    (IndexError at build)."""
    X = te.placeholder((2, 4, 3), F64, "X")
    I = te.placeholder((4, 4), "int32", "I")

    def body(a, b):
        p, k = b + b % 2, I[a, b]
        return te.if_then_else(te.all(p < 2, k >= 0, k < 3), te.tanh(X[p, b, k]), 0.0)
    Y = te.compute((4, 4), body, name="Y")
    (dX,) = te.gradient(Y, [X])

    def reference(x, i):
        a, b = ax(0, 4, 0, 2), ax(0, 4, 1, 2)
        p, k = b + b % 2, i.long()
        y = torch.where((p < 2) & (k >= 0) & (k < 3), torch.tanh(cread(x, p, b, k)), 0.0)
        return [y, *grad(y, [x])]
    _agree([X, I], [Y, dX], reference, [rng.standard_normal((2, 4, 3)), rng.integers(-1, 4, (4, 4)).astype("int32")])


def test_a_non_finite_value_in_the_select_branch_not_taken():
    """``T[i] = select(i < 1, X[i, 2], X[i, 0]^2)`` times ``X[i, 1]``, with
    ``X[0, 1] = inf``: the else branch's adjoint was ``select(c, 0, g)``,
    which the rules did not peel as a guard, so the derivative in ``X[i, 0]``
    became ``select(i < 1, 0, 1) * 2 X[i, 0]`` times the adjoint ``X[i, 1]``
    of ``T``: ``0 * inf``, NaN in ``dX[0, 0]`` where torch (and the math) give 0."""
    X = te.placeholder((2, 3), F64, "X")
    T = te.compute((2,), lambda i: te.if_then_else(i < 1, X[i, 2], X[i, 0] * X[i, 0]), name="T")
    Y = te.compute((2,), lambda i: X[i, 1] * T[i], name="Y")
    (dX,) = te.gradient(Y, [X])
    x = np.array([[0.5, np.inf, -1.0], [1.5, -0.5, 2.0]])
    got = te.build([X], [Y, dX])(x)
    t = torch.tensor(x, requires_grad=True)
    y = t[:, 1] * torch.where(torch.arange(2) < 1, t[:, 2], t[:, 0] * t[:, 0])
    want = [y.detach().numpy(), grad(y, [t])[0].numpy()]
    assert compare(["Y", "dX"], list(got), want, nonfinite=True) is None
    assert got[1][0, 0] == 0.0


def test_a_non_finite_factor_of_a_sum_over_no_match(rng):
    """``Y[n, c] = S[0] * X[I[n], c]``: the gradient in ``X[j, c]`` sums
    ``S[0] * H[n, c]`` over the ``n`` that an inverse index lists for key
    ``j``, and ``S[0]`` moved out of the sum.  At a ``j`` no key holds the sum
    is empty: ``inf * 0`` gave NaN where the gradient (torch's too) is 0.
    The factor now moves out only under the condition that the sum has a term."""
    S = te.placeholder((1,), F64, "S")
    X = te.placeholder((3, 2), F64, "X")
    I = te.placeholder((2,), "int64", "I")
    H = te.placeholder((2, 2), F64, "H")
    Y = te.compute((2, 2), lambda n, c: S[0] * X[I[n], c], name="Y")
    (dX,) = te.gradient(Y, [X], head=H)
    s, x, i, h = np.array([np.inf]), rng.standard_normal((3, 2)), np.array([0, 0]), np.array([[0.25, 0.5], [1.0, 2.0]])
    got = te.build([S, X, I, H], [Y, dX])(s, x, i, h)
    ts, tx = torch.tensor(s, requires_grad=True), torch.tensor(x, requires_grad=True)
    y = ts[0] * tx[torch.tensor(i)]
    want = [y.detach().numpy(), grad(y, [tx], torch.tensor(h))[0].numpy()]
    assert compare(["Y", "dX"], list(got), want, nonfinite=True) is None
    np.testing.assert_array_equal(got[1], [[np.inf, np.inf], [0.0, 0.0], [0.0, 0.0]])


def test_a_floor_quotient_scaled_back_in_a_fused_loop(rng):
    """``Y[b, i, j] = X[(4 i + j) // 4, j]`` (guarded by ``i < 4``): the loops
    over ``i`` and ``b`` fuse into one over ``n = 2 i + b``, so the read and
    the store address ``n // 2 * 4``.  LLVM 22.1's VectorCombine made the
    shift ``n >> 1`` exact (llvm-project issue 192607) and the address became
    ``n * 2``: for odd ``n`` the kernel read and wrote the wrong rows, leaving
    ``Y[1, 4]`` unwritten (a silent wrong answer)."""
    X = te.placeholder((4, 4), F64, "X")
    Y = te.compute((2, 5, 4), lambda b, i, j: te.if_then_else(i < 4, X[(i * 4 + j) // 4, j], 0.0), name="Y")

    def reference(x):
        i, j = ax(0, 5, 1, 3), ax(0, 4, 2, 3)
        y = torch.where(i < 4, cread(x, torch.div(i * 4 + j, 4, rounding_mode="floor"), j), 0.0)
        return [y.expand(2, 5, 4)]
    _agree([X], [Y], reference, [rng.standard_normal((4, 4))])


@pytest.mark.parametrize("target", [None, "haswell"])
def test_a_second_order_gradient_the_slp_vectoriser_broke(rng, target):
    """The second-order gradient of ``sigmoid(log(X[a + 1]² + 1))``: for an
    AVX2 target LLVM 22.1's SLP vectoriser left a shuffle among its own
    operands (an invalid module), and instruction selection aborted the LLVM
    process.  Such a module is now optimised again without SLP."""
    if target and te.target(target).missing_on_host():
        pytest.skip(te.target(target).missing_on_host())
    X = te.placeholder((5,), F64, "X")
    Y = te.compute((4, 5), lambda a, b: te.sigmoid(te.log(X[a + 1] * X[a + 1] + 1.0)), name="Y")
    H = te.placeholder(Y.shape, F64, "H")
    (dX,) = te.gradient(Y, [X], head=H)
    S = te.compute((5,), lambda i: dX[i] * dX[i], name="S")
    ddX, dH = te.gradient(S, [X, H])

    def reference(x, h):
        y = torch.sigmoid(torch.log(x[1:] * x[1:] + 1.0))[:, None].expand(4, 5)
        (dx,) = grad(y, [x], h, create_graph=True)
        return [y, dx, *grad((dx * dx).sum(), [x, h])]
    _agree([X, H], [Y, dX, ddX, dH], reference, [rng.standard_normal(5), rng.standard_normal((4, 5))], target)
