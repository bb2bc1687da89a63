"""One measurement in its own process: ``python -m benchmarks.worker JSON``.

The JSON argument is ``{"peer": ..., "kernel": id, "quick": bool, "threads": n}``
for a kernel, ``{"peer": ..., "case": "matmul:512", ...}`` for a case of the
size sweep (``sizes.py``), ``{"limits": true, "quick": bool, "threads": n}``
for the machine limits (``peaks.py``), or ``{"overhead": true, "quick": bool}``
for the per-call costs (``overhead.py``).  The result is printed as one JSON line prefixed with
``RESULT `` (anything else on stdout/stderr is the libraries' chatter).
Thread counts are set by the parent through the environment, before any
library is imported.
"""
from __future__ import annotations

import gc
import json
import sys
import time
import traceback

import numpy as np

MARK = "RESULT "
TOL = {"float32": 1e-4, "float64": 1e-9}
ROUNDS = 5                 # timed rounds per measurement (the best round's median is reported)
SEED = 20240521


def measure(step, budget: float, quick: bool) -> dict:
    """Wall time of ``step()`` in ms: warm up for ~20% of ``budget`` seconds
    (at least one call), then as many timed calls as fit in ``budget``
    (clamped to [min, max] repetitions), in ``ROUNDS`` consecutive rounds.
    ``median_ms`` is the lowest of the rounds' medians: on a shared machine a
    burst of other work slows down one round, not the figure (every peer is
    measured the same way; ``all_median_ms`` is the median of every call)."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        n = 0
        while True:
            step()
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= 0.2 * budget or n >= (3 if quick else 50):
                break
        est = elapsed / n
        lo = (2 if quick else 5) if est < 1.0 else (1 if quick else 3)
        reps = int(min(max(budget / max(est, 1e-7), lo), 50 if quick else 2000))
        rounds = min(ROUNDS, reps)
        reps -= reps % rounds
        times = np.empty(reps)
        for r in range(reps):
            t = time.perf_counter()
            step()
            times[r] = time.perf_counter() - t
    finally:
        if enabled:
            gc.enable()
    ms = times * 1e3
    per_round = [float(np.median(part)) for part in np.split(ms, rounds)]
    return dict(median_ms=min(per_round), round_medians_ms=per_round, all_median_ms=float(np.median(ms)),
                min_ms=float(ms.min()), p25_ms=float(np.percentile(ms, 25)),
                p75_ms=float(np.percentile(ms, 75)), reps=reps, warmup=n)


def rel_err(a, b) -> float:
    """max|a - b| / max|b| (norm-based relative error; b is the float64 reference)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    diff = float(np.max(np.abs(a - b))) if b.size else 0.0
    if not np.isfinite(diff):
        return float("inf")
    return diff / scale if scale > 0 else diff


def identical(x, y) -> bool:
    """Bit-identical results of two calls (loss and gradients)."""
    (l1, g1), (l2, g2) = x, y
    return bool(np.array_equal(l1, l2) and all(np.array_equal(a, b) for a, b in zip(g1, g2)))


def run_kernel(peer: str, kernel_id: int, quick: bool, threads: int, steps=None, case=None) -> dict:
    """One (kernel, peer) measurement; ``steps``: a recurrent kernel over
    that many time steps; ``case``: a case of the size sweep instead."""
    from .kernels import KERNELS, STEPPED
    from .peers import PREPARE
    from .sizes import kernel_for

    kernel = kernel_for(case) if case else KERNELS[kernel_id] if steps is None else STEPPED[kernel_id](steps)
    arrays = kernel.arrays(np.random.default_rng(SEED + kernel.id))
    ref_loss, ref_grads, loss_scale = kernel.reference(arrays)
    res = dict(peer=peer, kernel=kernel.id, dtype=kernel.dtype)
    if case:
        res["case"] = case
    prep = PREPARE[peer](kernel, arrays, threads)
    res.update(compile_s=prep.compile_s, details=prep.details)
    first = prep.result(prep.first)
    products = products_alone(peer, case, kernel, arrays)
    res.update(measure(prep.step, 0.15 if quick else 1.0, quick))
    last = prep.result(prep.step())
    loss, grads = last
    errs = {}
    for name, g, r in zip(kernel.wrt, grads, ref_grads):
        errs["d" + name] = rel_err(g, r)
    if len(grads) != len(ref_grads):
        errs["count"] = float("inf")
    grad_err = max(errs.values())
    loss_err = abs(float(loss) - float(ref_loss)) / loss_scale if loss_scale > 0 else abs(float(loss))
    if not np.isfinite(loss_err):
        loss_err = float("inf")
    errs["loss"] = loss_err
    worst = max(grad_err, loss_err)
    res.update(errors=errs, grad_rel_err=grad_err, loss_rel_err=loss_err, max_rel_err=worst,
               correct=bool(worst <= TOL[kernel.dtype]),
               deterministic=identical(first, last), status="ok")
    if products is not None:                            # again after the timing, seconds apart: the better
        from .stage_rates import better
        res["products"] = better(products, products_alone(peer, case, kernel, arrays))
    return res


def products_alone(peer: str, case, kernel, arrays):
    """te's products timed alone (``stage_rates.py``) for a case of the sweep
    whose kernel names them; None otherwise."""
    if peer != "te" or not case or not kernel.products:
        return None
    from .stage_rates import measure as measure_products
    return measure_products(kernel, arrays)


def main(argv=None) -> int:
    args = json.loads((argv or sys.argv[1:])[0])
    try:
        if args.get("limits"):
            from .peaks import run_limits
            res = run_limits(args.get("quick", False), args.get("threads", 1))
        elif args.get("overhead"):
            from .overhead import measure_all
            res = dict(measure_all(*((3, 50) if args.get("quick") else (15, 400))), status="ok")
        else:
            res = run_kernel(args["peer"], args.get("kernel"), args.get("quick", False), args.get("threads"),
                             args.get("steps"), args.get("case"))
    except Exception as exc:                            # reported, never raised: one failure must not stop the run
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
        res = dict(peer=args.get("peer"), kernel=args.get("kernel"), case=args.get("case"), status="error",
                   error=f"{type(exc).__name__}: {exc}"[:2000], where=where, traceback=traceback.format_exc()[-4000:])
    sys.stdout.flush()
    print(MARK + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
