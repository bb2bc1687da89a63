"""Programs checked in this process: te against PyTorch.

``check_group(seeds)`` generates the programs, runs their te sources
(``te.build`` of each output, its gradients and second-order gradients: one
kernel for the whole group) and their torch sources (``torch.autograd``) on
the same float64 data, and compares every output.  Then, on the built
kernel: the bad-input checks of ``bad_inputs.py``, and for programs without
a data-dependent choice (see ``NONFINITE_UNDEFINED``) inputs with NaN and
inf at random places.  ``check(seed)`` is a group of one.

What NaN and inf must do: the kernel computes (no exception), and wherever
torch's value is finite te's is the same (no NaN or inf leaks into a value
that does not depend on it: a masked position, a branch not taken, a
padding).  Not more: where torch's value is not finite, te's may be a number,
since te, like fast-math code, does not keep IEEE semantics for NaN and inf
everywhere: it folds ``x * 0`` to 0 (``tanh(X[j]) * T[3]`` where ``T[3]`` is
a guarded read known to be 0), may reassociate sums (``Σ (x_r - y)`` meets
``inf - inf`` in one order and not in the other), and its gradients skip
the terms that are zero by construction (zero elimination), where torch
computes ``0 * inf``.

Tolerances: both sides compute in float64; te may reassociate and contract
(``reassoc contract`` fast-math flags) and evaluate exp/log/tanh by its own
polynomials, each within a few ulp.  Values are bounded by 1e3 and the
programs are a few dozen operations deep, so the differences stay under
1e-12 relative to the largest magnitude involved; ``RTOL = 1e-8`` and
``ATOL = 1e-10`` times the array's largest magnitude (at least 1) leave
room for cancellation and still catch any wrong term.
"""
from __future__ import annotations

import time
import traceback

import numpy as np

from .bad_inputs import bad_input_failures
from .programs import generate

RTOL, ATOL = 1e-8, 1e-10
# features under which NaN/inf propagation is not defined alike in te and torch:
# data-dependent choices (a comparison with NaN, max/min ties with NaN: clip
# too), floor of inf, derivatives that branch on the sign (abs: torch's
# sign(NaN) is NaN), and sign itself (torch's sign(NaN) is 0, numpy's and te's NaN)
NONFINITE_UNDEFINED = {"select:data", "binary:max", "binary:min", "reduce:max", "reduce:min", "binary:fdiv",
                       "binary:fmod", "unary:abs", "positive:abs", "data:segment", "call:clip", "unary:sign"}


def data(program, seed):
    """The input arrays by placeholder name: floats uniform in [-2, 2] (heads in [-1, 1]), keys in their range."""
    rng = np.random.default_rng([seed, 1])
    out = {}
    for name, shape, dtype in program.placeholders():
        if dtype == "float64":
            bound = 1.0 if name in ("H", "K") else 2.0
            out[name] = rng.uniform(-bound, bound, shape)
        else:
            lo, hi = next(i.values for i in program.inputs if i.name == name)
            out[name] = rng.integers(lo, hi + 1, shape).astype(dtype)
    return out


def te_tensors(program):
    """(placeholders, outputs) of the program's te source."""
    ns = {}
    exec(compile(program.te_source(), f"<te program {program.seed}>", "exec"), ns)
    return ns["inputs"], ns["outputs"]


def run_torch(program, arrays) -> list:
    """The torch source's outputs on ``arrays`` (float inputs require grad)."""
    import torch
    from .torch_ops import float64_default
    ns = {}
    exec(compile(program.torch_source(), f"<torch program {program.seed}>", "exec"), ns)
    args = []
    for name, _, dtype in program.placeholders():
        t = torch.from_numpy(arrays[name].copy())
        args.append(t.requires_grad_() if dtype == "float64" else t)
    with float64_default():
        return [o.detach().numpy() for o in ns["program"](*args)]


def compare(names, got, want, nonfinite=False) -> str | None:
    """The first difference between te's outputs ``got`` and torch's ``want``,
    or None.  With ``nonfinite``, only where torch's value is finite (see the
    module doc)."""
    for name, g, w in zip(names, got, want):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"{name}: te gives {g.dtype}{g.shape}, torch {w.dtype}{w.shape}"
        finite = np.isfinite(w)
        if not nonfinite and not finite.all():
            return f"{name}: torch's value is not finite (a generator bug)"
        scale = max(1.0, float(np.max(np.abs(w[finite]), initial=0.0)))
        same = np.isclose(g, w, rtol=RTOL, atol=ATOL * scale) | ~finite
        if not same.all():
            at = tuple(int(i) for i in np.argwhere(~same)[0])
            return (f"{name}{list(at)}: te {g[at]!r}, torch {w[at]!r} "
                    f"({int((~same).sum())} of {same.size} elements differ)")
    return None


def with_nonfinite(program, arrays, rng):
    """``arrays`` with NaN, inf or -inf at one or two places of each float input."""
    out = dict(arrays)
    for i in program.inputs:
        if i.is_float and arrays[i.name].size:
            a = arrays[i.name].copy()
            for _ in range(int(rng.integers(1, 3))):
                a.reshape(-1)[rng.integers(a.size)] = rng.choice([np.nan, np.inf, -np.inf])
            out[i.name] = a
    return out


class _Case:
    """One program of a group: its data, torch's outputs, its te tensors and its record."""

    def __init__(self, seed):
        self.program = generate(seed)
        self.names = self.program.outputs()
        self.arrays = data(self.program, seed)
        self.record = {"seed": seed, "features": sorted(self.program.features), "status": "ok", "detail": ""}
        self.nonfinite = not self.program.features & NONFINITE_UNDEFINED
        if self.nonfinite:
            self.record["features"].append("nonfinite")

    def fail(self, status, detail):
        if self.record["status"] == "ok":
            self.record.update(status=status, detail=detail)

    def prepare(self) -> bool:
        """torch's outputs and te's tensors; False (and the failure recorded) if either raises."""
        try:
            self.want = run_torch(self.program, self.arrays)
        except Exception:
            self.fail("torch_error", traceback.format_exc(limit=-4))
            return False
        try:
            self.inputs, self.outputs = te_tensors(self.program)
        except Exception:
            self.fail("te_error", traceback.format_exc(limit=-8))
            return False
        return True

    def args(self, arrays=None) -> list:
        return [(arrays or self.arrays)[t.name] for t in self.inputs]

    def alone(self, group_diff=None):
        """Build and check this program in a kernel of its own: the run for its
        later checks, or None when it failed.  ``group_diff``: how it differed in
        the group's kernel (a failure even if it agrees alone)."""
        import te_autodiff as te
        try:
            kernel = te.build(self.inputs, self.outputs)
            got = _results(kernel(*self.args()))
        except Exception:
            self.fail("te_error", traceback.format_exc(limit=-8))
            return None
        diff = compare(self.names, got, self.want)
        if diff or group_diff:
            self.fail("mismatch", diff or f"only in one kernel with the rest of its group: {group_diff}")
            return None
        return kernel, [self], [got]


def _results(res) -> list:
    return list(res) if isinstance(res, tuple) else [res]


def _split(results, cases) -> list:
    """The group kernel's outputs, one list per case."""
    out, at = [], 0
    for c in cases:
        out.append(results[at:at + len(c.outputs)])
        at += len(c.outputs)
    return out


def _group_run(cases):
    """(kernel, cases, outputs per case) of one kernel for all ``cases``, or None when te refuses it."""
    import te_autodiff as te
    try:
        kernel = te.build([t for c in cases for t in c.inputs], [t for c in cases for t in c.outputs])
        return kernel, cases, _split(_results(kernel(*[a for c in cases for a in c.args()])), cases)
    except Exception:
        return None


def check_group(seeds) -> list:
    """The records of programs ``seeds``, checked together: one te kernel for
    all of them (a build and a pass through LLVM instead of one per program),
    each program again alone when the group kernel cannot be built or it
    differs there.  A record has ``status`` ok, mismatch, te_error (te refused
    or failed on a valid program), torch_error (a generator bug), bad_input or
    nonfinite; ``detail``; ``features``; ``seconds`` (wall) and ``cpu`` (this
    process's CPU time), the group's shared equally."""
    start = time.perf_counter(), time.process_time()
    cases = [_Case(s) for s in seeds]
    live = [c for c in cases if c.prepare()]
    group = _group_run(live) if len(live) > 1 else None
    if group is None:
        runs = [r for r in (c.alone() for c in live) if r is not None]
    else:
        runs = [group]
        for c, got in zip(live, group[2]):
            diff = compare(c.names, got, c.want)
            if diff:
                c.alone(diff)
    for kernel, members, got in runs:
        _check_kernel(kernel, [c for c in members if c.record["status"] == "ok"], members, got)
    seconds, cpu = time.perf_counter() - start[0], time.process_time() - start[1]
    for c in cases:
        c.record.update(seconds=round(seconds / len(cases), 3), cpu=round(cpu / len(cases), 3))
    return [c.record for c in cases]


def _check_kernel(kernel, ok, members, got):
    """The bad-argument calls and the NaN/inf inputs, on a kernel of ``members``
    (their outputs ``got``); failures go to the cases ``ok`` that passed so far."""
    if not ok:
        return
    seed = ok[0].record["seed"]
    failures = bad_input_failures(kernel, [a for c in members for a in c.args()], [g for gs in got for g in gs],
                                  np.random.default_rng([seed, 2]))
    if failures:
        ok[0].fail("bad_input", "\n".join(failures))
    odd = {id(c): with_nonfinite(c.program, c.arrays, np.random.default_rng([c.record["seed"], 3]))
           for c in members if c.nonfinite}
    if not odd:
        return
    try:
        res = _split(_results(kernel(*[a for c in members for a in c.args(odd.get(id(c)))])), members)
    except Exception:
        for c in members:
            if id(c) in odd:
                c.fail("nonfinite", traceback.format_exc(limit=-6))
        return
    for c, got_c in zip(members, res):
        if id(c) in odd:
            diff = compare(c.names, got_c, run_torch(c.program, odd[id(c)]), nonfinite=True)
            if diff:
                c.fail("nonfinite", diff)


def check(seed: int) -> dict:
    """The record of one program (see ``check_group``)."""
    return check_group([seed])[0]
