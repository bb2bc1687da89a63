"""te-autodiff as a GradBench tool: ``python -m benchmarks.gradbench.tool``.

Speaks GradBench's JSON-lines protocol on stdin/stdout (``protocol.py``).
For each ``evaluate`` it converts the input and fetches the kernels for its
shape (building them the first time), calls the computation once untimed
(as the first call of a jitted JAX function compiles), then times the
computation alone as many times as the input asks; every result is a
materialised numpy array, so the timings are of finished work. The
untimed part is reported as a ``prepare`` timing. ``TE_NUM_THREADS`` sets
the kernels' threads.
"""
from __future__ import annotations

import os
import time

from . import protocol
from .evals import load


def evaluate(message: dict) -> dict:
    module = load(message["module"])
    function = getattr(module, message["function"], None)
    if function is None or not hasattr(function, "run"):
        raise ValueError(f"eval {message['module']!r} has no function {message['function']!r} in te-autodiff")
    start = time.perf_counter_ns()
    prepared = function.pre(message["input"])
    function.run(prepared)
    prepare_ns = time.perf_counter_ns() - start
    min_runs, min_seconds = protocol.runs(message["input"])
    result, timings = protocol.repeat(lambda: function.run(prepared), min_runs, min_seconds)
    return {"success": True, "output": function.post(result),
            "timings": [{"name": "prepare", "nanoseconds": prepare_ns}] + timings}


def config() -> dict:
    import te_autodiff as te
    return {"target": str(te.target()), "threads": os.environ.get("TE_NUM_THREADS", "all cores")}


def main() -> int:
    protocol.serve("te-autodiff", lambda module: load(module), evaluate, config=config())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
