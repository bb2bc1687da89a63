"""``python -m benchmarks.build_time``: a process's first build against a later one.

For each benchmark kernel (``--kernels``; ``13:64`` is kernel 13 over 64
steps), fresh processes run ``te.gradient`` + ``te.build`` of it as their
first build, and after building two other kernels (two of 12, 11, 8: they
import all a build needs, llvmlite, ``lowering``, OR-tools' two solvers);
the difference is what the first build pays once per process.  Each figure is the median over
``--repeat`` processes of: wall seconds, the main process's CPU seconds and
the CPU seconds of the LLVM processes it started (``llvm_process``), which
together do not depend on how busy the machine is.  The repository's
modules are compiled to bytecode first, as an installed package's are: a
process that may not write ``__pycache__`` (``PYTHONDONTWRITEBYTECODE``)
would otherwise compile them from source in every run, a cost of the
Python setup and not of a build.  Nothing is written to the committed
reports.
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = (12, 11, 8)       # kernels that ask both OR-tools solvers: two that are not the one measured

_CHILD = r'''
import json, os, sys, time
import te_autodiff as te
from benchmarks.kernels import KERNELS, STEPPED

def llvm_cpu():
    llvm_process = sys.modules.get("lowering.llvm_process")     # not imported before the first build
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for worker in (llvm_process._workers if llvm_process else ()):
        if worker.child is not None:
            with open(f"/proc/{worker.child.process.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total

for kid in json.loads(sys.argv[2]):
    te.build(*KERNELS[kid].te_program(te))
kid, _, steps = sys.argv[1].partition(":")
kernel = KERNELS[int(kid)] if not steps else STEPPED[int(kid)](int(steps))
wall, cpu, llvm = time.perf_counter(), time.process_time(), llvm_cpu()
te.build(*kernel.te_program(te))
print(json.dumps(dict(wall=time.perf_counter() - wall, cpu=time.process_time() - cpu, llvm=llvm_cpu() - llvm)))
'''


def measure(spec: str, warm_up: tuple, repeat: int) -> dict:
    """Median wall, main-process CPU and LLVM CPU seconds of building ``spec``
    in ``repeat`` fresh processes, after building the kernels ``warm_up``."""
    runs = []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-c", _CHILD, spec, json.dumps(list(warm_up))], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise RuntimeError(f"kernel {spec}: {done.stderr[-2000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {key: statistics.median(r[key] for r in runs) for key in ("wall", "cpu", "llvm")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.build_time", description=__doc__.splitlines()[0])
    p.add_argument("--kernels", default="1,2,3,4,5,6,7,8,9,10,11,12,13,14,13:64",
                   help="kernel numbers, KERNEL:STEPS for a recurrent kernel over more steps")
    p.add_argument("--repeat", type=int, default=3, help="fresh processes per figure (default 3)")
    args = p.parse_args(argv)
    if not Path("/proc/self/stat").exists():
        p.error("needs /proc (Linux) to read the LLVM processes' CPU time")
    for package in ("arith", "te_autodiff", "lowering", "benchmarks"):
        compileall.compile_dir(ROOT / package, quiet=1)
    print(f"load average {os.getloadavg()[0]:.1f}; seconds: wall, main-process CPU + LLVM-process CPU")
    print("| kernel | first build | after two other builds | first − later (main CPU) |")
    print("|---|---:|---:|---:|")
    for spec in args.kernels.split(","):
        warm_up = [k for k in WARM_UP if k != int(spec.partition(":")[0])][:2]
        first, later = measure(spec, (), args.repeat), measure(spec, warm_up, args.repeat)
        cell = lambda m: f"{m['wall']:.2f}, {m['cpu']:.2f} + {m['llvm']:.2f}"     # noqa: E731
        print(f"| {spec} | {cell(first)} | {cell(later)} | {first['cpu'] - later['cpu']:+.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
