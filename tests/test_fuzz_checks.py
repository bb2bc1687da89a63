"""The fuzzer's own checks, which need no oracle (tests/test_fuzz.py runs its programs against torch).

* The checks can fail: a kernel that accepts anything fails the bad-argument
  check, a wrong value fails the comparison.
* Shapes far beyond memory (and beyond int64 bytes) are refused with a
  MemoryError or ValueError naming the tensor, each in a child process.
* The generator's guards: a read guarded by the selects around it (the
  targeted forms' equality guards and conditions found on the grid among
  them) stays in its tensor wherever those selects take it.
* The targeted forms (``fuzz/forms.py``, ``fuzz/large.py``) over a fixed
  range of seeds: selects around gathers, equality guards, non-affine
  guarded indices, one-element max, min and sum, and large programs on both
  sides of every threshold; the split reduction's sides on both sides of
  the schedule's own test; the thresholds follow the target and the
  schedule's constants (read, not copied).
"""
from dataclasses import fields
from functools import lru_cache

import numpy as np

import lowering.schedule.split_reduction as split_reduction
import te_autodiff as te
from fuzz import forms, large
from fuzz.bad_inputs import bad_input_failures, huge_extent_failures
from fuzz.check import compare
from fuzz.describe import Cmp, Cond, Expr, IData, IExpr, Read, Reduce, Select, Var, walk
from fuzz.programs import generate, is_large
from fuzz.thresholds import thresholds
from fuzz.values import Env, exact, holds
from lowering.schedule.blocking import blocking

F64 = "float64"


def _kernel():
    A = te.placeholder((3, 4), F64, "Alpha")
    B = te.placeholder((4,), "int32", "Beta")
    C = te.compute((3, 4), lambda i, j: A[i, j] * 2.0 + B[j].astype(F64), name="C")
    arrays = [np.ones((3, 4)), np.arange(4, dtype=np.int32)]
    kernel = te.build([A, B], [C])
    return kernel, arrays, [kernel(*arrays)]


def test_bad_arguments_are_refused_naming_the_placeholder():
    kernel, arrays, good = _kernel()
    for seed in range(5):
        assert bad_input_failures(kernel, arrays, good, np.random.default_rng(seed)) == []


def test_a_placeholder_of_no_axes_gets_the_bad_arguments_too():
    """The head of a one-element output of shape (): its wrong shape is (1,)."""
    X = te.placeholder((4,), F64, "X")
    k = te.reduce_axis(4, "k")
    Y = te.compute((), lambda: te.max(X[k], axis=k), name="Y")
    Head = te.placeholder((), F64, "Head")
    (dX,) = te.gradient(Y, [X], head=Head)
    kernel = te.build([X, Head], [Y, dX])
    arrays = [np.arange(4.0), np.array(2.0)]
    good = list(kernel(*arrays))
    for seed in range(5):
        assert bad_input_failures(kernel, arrays, good, np.random.default_rng(seed)) == []


def test_the_bad_argument_check_catches_a_kernel_that_accepts_anything():
    kernel, arrays, good = _kernel()

    class Permissive:
        inputs = kernel.inputs

        def __call__(self, *args):
            return good[0]

    failures = bad_input_failures(Permissive(), arrays, good, np.random.default_rng(0))
    assert len(failures) == 2 + 3 * len(arrays) and all(f.endswith("accepted") for f in failures)


def test_the_comparison_catches_a_wrong_value_and_a_leaked_nan():
    want = np.array([1.0, np.nan, np.inf, 2.0])
    assert compare(["Y"], [want.copy()], [want], nonfinite=True) is None
    assert "Y[0]" in compare(["Y"], [want + [1e-6, 0, 0, 0]], [want], nonfinite=True)
    assert "Y[3]" in compare(["Y"], [np.array([1.0, np.nan, np.inf, np.nan])], [want], nonfinite=True)
    assert "not finite" in compare(["Y"], [want], [want])


def test_huge_extents_are_refused_cleanly():
    assert huge_extent_failures() == []


def _reads_out_of_range(compute):
    """The reads of ``compute`` guarded by the selects around them ('outer')
    that leave their tensor where those selects take them (a select on keys
    or data is not evaluated here: below one on keys, nothing is checked)."""
    slots = [n.var.slot for n in walk(compute.body) if isinstance(getattr(n, "var", None), Var)]
    env = Env(max(slots, default=0) + 1, {})
    out = []

    def visit(node, taken):
        if isinstance(node, Select) and all(not isinstance(n, Cmp) or isinstance(n.a, IExpr) for n in walk(node.cond)):
            where = None if any(isinstance(n, IData) for n in walk(node.cond)) else holds(node.cond, env)
            visit(node.a, None if where is None or taken is None else taken & where)
            visit(node.b, None if where is None or taken is None else taken & ~where)
        elif isinstance(node, Read) and node.guard == "outer" and taken is not None:
            for ix, n in zip(node.indices, node.shape):
                if n and not any(isinstance(k, IData) for k in walk(ix)):      # n = 0: an empty batch
                    value, at = np.broadcast_arrays(exact(ix, env), taken)
                    if ((value[at] < 0) | (value[at] >= n)).any():
                        out.append(node)
        else:
            for f in fields(node):
                value = getattr(node, f.name)
                for child in value if isinstance(value, tuple) else (value,):
                    if isinstance(child, (Expr, Cond)):
                        visit(child, taken)
    visit(compute.body, np.array(True))
    return out


def test_guarded_reads_stay_in_range_where_their_guards_hold():
    bad = {seed: r for seed in range(41_000_000, 41_002_000) for c in generate(seed).computes
           for r in _reads_out_of_range(c)}
    assert not bad, f"{len(bad)} programs, e.g. {next(iter(bad.items()))}"


FORMS, LARGE = range(41_000_000, 41_002_000), range(41_000_000, 41_040_000)     # seeds


@lru_cache(maxsize=None)
def _large_programs():
    """The large programs among the seeds ``LARGE`` (one in ten; generated only, never run)."""
    return [generate(seed) for seed in LARGE if is_large(seed)]


def test_every_targeted_form_is_generated():
    small = set().union(*(generate(seed).features for seed in FORMS))
    assert not forms.FEATURES - small, f"never generated: {sorted(forms.FEATURES - small)}"
    big = set().union(*(p.features for p in _large_programs()))
    assert not large.FEATURES - big, f"never generated: {sorted(large.FEATURES - big)}"


def test_the_split_sides_straddle_the_schedules_own_test():
    """``large:split:at`` reduces over extents the split rule splits
    (``splits_reduction``); ``:below`` (too short), ``:prime`` and ``:outer``
    (long enough, no part count divides the outer extent) over extents it
    does not."""
    sides = {}
    for p in _large_programs():
        side = next((f.rsplit(":", 1)[1] for f in p.features if f.startswith("large:split:")), None)
        if side is None:
            continue
        red = next(n for n in walk(p.computes[-1].body) if isinstance(n, Reduce))
        extents = [a.extent for a in red.axes]
        assert split_reduction.splits_reduction(extents) == (side == "at"), (p.seed, side, extents)
        sides[side] = sides.get(side, 0) + 1
    assert set(sides) == set(large.SPLIT_SIDES)


def test_the_thresholds_follow_the_target_and_the_schedule(monkeypatch):
    """Generated from ``TE_TARGET``'s figures and the rule modules'
    constants at run time: a ``large:vector`` program's rows are one vector
    of the target's float64 lanes (one fewer, one more), and a retuned
    split threshold moves the split programs' extents."""
    vector = next(p for p in _large_programs() if "large:vector:at" in p.features)
    try:
        lanes = {}
        for name in ("haswell", "x86-64-v4"):
            monkeypatch.setenv("TE_TARGET", name)
            thresholds.cache_clear()
            T, bl = thresholds(), blocking(te.target())
            assert (T.lanes, T.tile_rows, T.k_block, T.math_chains) == \
                (te.target().lanes(8), bl.tile_rows, bl.k_block, bl.math_chains)
            lanes[name] = T.lanes
            assert generate(vector.seed).computes[-1].shape[-1] == T.lanes
        assert lanes["haswell"] < lanes["x86-64-v4"]
        monkeypatch.setattr(split_reduction, "SPLIT_MIN_WORK", 1000)
        thresholds.cache_clear()
        assert thresholds().split_min_work == 1000
        at = next(p for p in _large_programs() if "large:split:at" in p.features)
        red = next(n for n in walk(generate(at.seed).computes[-1].body) if isinstance(n, Reduce))
        assert 1000 <= np.prod([a.extent for a in red.axes]) < 1000 + max(split_reduction.SPLIT_PARTS)
    finally:
        monkeypatch.undo()
        thresholds.cache_clear()
