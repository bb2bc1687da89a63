"""The benchmark suite runs end to end (one kernel, quick mode) and checks its results."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent


def test_benchmark_quick_run(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks", "--quick", "--peers", "te,numpy", "--kernels", "6",
           "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = (tmp_path / "RESULTS.md").read_text()
    assert "tanh(sigmoid" in report
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    te_run = [r for r in results if r["peer"] == "te" and r["kernel"] == 6]
    assert te_run and te_run[0]["status"] == "ok", te_run
    assert te_run[0]["correct"] and te_run[0]["deterministic"]
    assert te_run[0]["median_ms"] > 0


def test_overhead_benchmark_runs():
    """``python -m benchmarks.overhead`` times every variant it can (a few calls each)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.overhead", "--rounds", "1", "--calls", "3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "µs" not in line]
    assert any(line.startswith("| te kernels alone") for line in rows), done.stdout
    assert all(float(line.rsplit("|", 2)[1]) > 0 for line in rows), done.stdout
