"""GradBench's own JAX and PyTorch tools, timed on finished results:
``python -m benchmarks.gradbench.peer_tool jax|pytorch``.

GradBench's Python tools time ``function(input)`` between two clock reads
(``gradbench.wrap``). A jitted JAX function returns as soon as the work is
dispatched, so for JAX that measures the dispatch, not the computation
(k-means ``dir`` at k=1000, n=10000 reads about ten microseconds). This
adapter replaces ``gradbench.wrap``'s two decorators, before GradBench's tool
modules are imported, by versions that (1) call the function once untimed
and wait for it (JAX compiles on the first call; reported as ``prepare``,
as the te tool reports its build) and (2) wait for every timed result
inside the timed region (``jax.block_until_ready``; PyTorch on the CPU has
finished when it returns). Everything else is GradBench's tool as
published: its ``run.py`` protocol loop and its eval modules.

Threads: the runner sets ``OMP_NUM_THREADS`` and, for one thread,
``XLA_FLAGS`` (no Eigen thread pool, one intra-op thread); here PyTorch is
told ``torch.set_num_threads`` and, for one thread, the process is pinned
to one CPU (as GradBench's JAX tool does without ``--multithreaded``).
"""
from __future__ import annotations

import argparse
import importlib
import os
import runpy
import sys
import time
from pathlib import Path

from . import protocol


def finisher(tool: str):
    """A function that waits until a result of ``tool`` is computed."""
    if tool == "jax":
        import jax
        return jax.block_until_ready
    return lambda value: value


def patch_wrap(finish) -> None:
    """Make ``gradbench.wrap``'s decorators time finished results (see the module docstring)."""
    wrap = importlib.import_module("gradbench.wrap")

    def timed(function, pre, post, min_runs_of, min_seconds_of):
        def wrapped(input_raw):
            input = pre(input_raw)
            start = time.perf_counter_ns()
            finish(function(input))
            prepare_ns = time.perf_counter_ns() - start
            result, timings = protocol.repeat(lambda: finish(function(input)),
                                              min_runs_of(input_raw), min_seconds_of(input_raw))
            return {"success": True, "output": post(result),
                    "timings": [{"name": "prepare", "nanoseconds": prepare_ns}] + timings}
        return wrap.Wrapped(function=function, wrapped=wrapped)

    def multiple_runs(*, min_runs=lambda x: x["min_runs"], min_seconds=lambda x: x["min_seconds"], pre, post):
        return lambda function: timed(function, pre, post, min_runs, min_seconds)

    def function(*, pre, post):
        return lambda f: timed(f, pre, post, lambda _: 1, lambda _: 0.0)

    wrap.multiple_runs = multiple_runs
    wrap.function = function


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tool", choices=("jax", "pytorch"))
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--gradbench", required=True, help="the GradBench checkout")
    args = parser.parse_args(argv)

    python_dir = Path(args.gradbench) / "python" / "gradbench"
    tool_dir = python_dir / "gradbench" / "tools" / args.tool
    sys.path[:0] = [str(tool_dir), str(python_dir)]        # run.py imports its eval modules by bare name
    if args.threads == 1:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])
    if args.tool == "pytorch":
        import torch
        torch.set_num_threads(args.threads)
    patch_wrap(finisher(args.tool))
    sys.argv = [str(tool_dir / "run.py")] + (["--multithreaded"] if args.threads > 1 else [])
    runpy.run_path(str(tool_dir / "run.py"), run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
