"""GradBench's hand-written C++ ``manual`` tool behind the protocol, from
binaries built beforehand: ``python -m benchmarks.gradbench.manual_tool --bin DIR``.

GradBench's own adapter (``gradbench/cpp.py``) rebuilds each program with
``make`` when the eval defines its module; this one only runs what is in
``DIR`` (one executable per eval, as GradBench's ``tools/manual/Makefile``
names them), so nothing is compiled here. Each ``evaluate`` writes the
input to a file and runs ``DIR/<eval> FILE FUNCTION``; the program times
its own computation (``std::chrono::steady_clock`` around each call, after
parsing) and prints the output and its timings. ``OMP_NUM_THREADS`` sets
the threads of an OpenMP build.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from . import protocol


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", required=True, help="directory with the manual tool's executables")
    args = parser.parse_args(argv)
    bin_dir = Path(args.bin)

    def program(module: str) -> Path:
        path = bin_dir / module
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"no executable {path}: the manual tool is not built for {module!r}")
        return path

    def evaluate(message: dict) -> dict:
        exe = program(message["module"])
        with tempfile.NamedTemporaryFile("w", suffix=".json") as tmp:
            json.dump(message["input"], tmp)
            tmp.flush()
            done = subprocess.run([str(exe), tmp.name, message["function"]], capture_output=True, text=True)
        if done.returncode != 0:
            return {"success": False, "error": f"{exe} exited with {done.returncode}: {done.stderr[-2000:]}"}
        lines = done.stdout.splitlines()
        return {"success": True, "output": json.loads(lines[0]), "timings": [json.loads(line) for line in lines[1:]]}

    protocol.serve("manual", program, evaluate)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
