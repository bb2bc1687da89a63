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


def test_peers_are_kept_to_the_vector_width_of_a_narrower_target(monkeypatch):
    """With te-autodiff built for a narrower CPU than this one (``TE_TARGET``),
    every benchmark child gets the variables that keep the peers to that
    width, and they take effect: numpy dispatches no AVX-512 loop (nor AVX2
    ones below AVX2) and PyTorch reports the capped capability.  Built for
    this machine, nothing is capped."""
    import te_autodiff as te
    from benchmarks.peer_isa import peer_caps
    from benchmarks.runner import child_env

    monkeypatch.delenv("TE_TARGET", raising=False)
    assert peer_caps() == {} and "ATEN_CPU_CAPABILITY" not in child_env(2, "/tmp")
    host = te.target("host")
    if not host.x86 or host.vector_bytes == 16:
        return                                  # nothing narrower to emulate here
    narrower = "haswell" if host.vector_bytes == 64 else "x86-64-v2"
    monkeypatch.setenv("TE_TARGET", narrower)
    caps = peer_caps()
    env = child_env(1, "/tmp")
    assert all(var in env for var in caps) and caps["XLA_FLAGS"] in env["XLA_FLAGS"]
    assert "--xla_cpu_multi_thread_eigen=false" in env["XLA_FLAGS"]        # the threads' flags stay
    probe = ("from numpy._core._multiarray_umath import __cpu_dispatch__ as d, __cpu_features__ as f\n"
             "print(sorted(k for k in d if f.get(k)))\n"
             "try:\n    import torch; print(torch.backends.cpu.get_cpu_capability())\n"
             "except ImportError:\n    print('no torch')\n")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    dispatched, torch_isa = out.stdout.splitlines()[-2:]
    assert "X86_V4" not in dispatched and "AVX512_SKX" not in dispatched
    assert narrower == "haswell" or "X86_V3" not in dispatched
    assert torch_isa in ("no torch", {"haswell": "AVX2", "x86-64-v2": "DEFAULT"}[narrower])
