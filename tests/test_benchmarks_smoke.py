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
    assert any(line.startswith("| numpy: te kernel |") for line in rows), done.stdout
    assert all(float(cell) > 0 for line in rows for cell in line.split("|")[2:4]), done.stdout
    assert "- numpy: te − np.multiply" in done.stdout, done.stdout


def test_build_time_benchmark_runs():
    """``python -m benchmarks.build_time`` builds a kernel first in a process and after two others."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.build_time", "--kernels", "6", "--repeat", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| 6 |"))
    first, later = (float(cell.split(",")[0]) for cell in row.split("|")[2:4])     # wall seconds
    assert first > 0 and later > 0, done.stdout


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


def test_a_capped_run_judges_te_against_the_peers_kept_to_its_width():
    """Built for a narrower CPU, te is also judged against the peers kept to
    that width: JAX leaves the rows whose work runs through its matrix
    libraries (which choose their own instructions) and stays in the others."""
    from benchmarks.report import kept_line

    def ok(ms):
        return {"status": "ok", "correct": True, "median_ms": ms}

    rows = [dict(te=ok(1.0), peers=dict(numpy=ok(1.2), jax=ok(0.5)), matrix=True),
            dict(te=ok(1.0), peers=dict(numpy=ok(2.0), jax=ok(0.8)), matrix=False),
            dict(te=ok(1.0), peers=dict(numpy=dict(ok(0.1), correct=False), jax=ok(3.0)), matrix=True)]
    line = kept_line(rows, "case(s)", lambda r: r["matrix"], "AVX2")
    assert "kept to AVX2" in line and "left out of the 2 case(s)" in line       # 1.2, 0.8: no ratio for row 3
    assert f"{(1.2 * 0.8) ** 0.5:.3f};" in line and "on 1 of 2." in line, line
    assert kept_line(rows, "case(s)", lambda r: False, "AVX2") is None


def test_size_sweep_quick_run(tmp_path):
    """``--sizes`` with tiny cases: every (case, peer) measured and checked in
    its own process, the peaks measured, and the sweep's tables written."""
    cmd = [sys.executable, "-m", "benchmarks", "--quick", "--sizes", "matmul:16,depthwise:1x4x6,elementwise_f64:256",
           "--peers", "te,numpy", "--threads", "1", "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["results"] == [] and data["run"]["cases"] == ["matmul:16", "depthwise:1x4x6", "elementwise_f64:256"]
    runs = {(r["case"], r["peer"]): r for r in data["sweep"]}
    assert set(runs) == {(c, p) for c in data["run"]["cases"] for p in ("te", "numpy")}
    assert all(r["status"] == "ok" and r["correct"] and r["median_ms"] > 0 for r in runs.values()), runs
    assert runs["elementwise_f64:256", "te"]["dtype"] == "float64"
    limits = data["limits"]
    assert limits["fma_f32_gflops"] > 0 and limits["fma_f64_gflops"] > 0 and limits["sgemm_gflops"] > 0
    report = (tmp_path / "RESULTS.md").read_text()
    for text in ("## Peaks", "FMA peak float32", "### matmul (float32)", "### elementwise_f64 (float64)",
                 "matmul 16³", "% FMA peak", "% copy", "te products alone"):
        assert text in report, text
    products = runs["matmul:16", "te"]["products"]          # the products timed alone, each a group
    assert products["missing"] == []
    assert sorted(p for g in products["groups"] for p in g["products"]) == ["C", "dA", "dB"]
    assert all(g["seconds"] > 0 and g["flops"] == 2 * 16 ** 3 for g in products["groups"])
    assert "products" not in runs["depthwise:1x4x6", "te"]   # a family without products
    assert "## Median forward" not in report                   # no kernels were run


def test_fma_peak_loop_is_built_for_the_target():
    """The peak loop fills the target's vector registers with FMA chains of
    its width (AVX2 when te-autodiff is built for haswell) and runs on any
    number of threads."""
    import te_autodiff as te
    from benchmarks.fma_peak import FmaLoop, fma_peak_gflops

    assert fma_peak_gflops(False, 1, 0.01) > 0 and fma_peak_gflops(True, 2, 0.01) > 0
    host = te.target("host")
    targets = [host] + ([te.target("haswell")] if host.x86 and host.vector_bytes == 64 else [])
    for t in targets:
        for double in (False, True):
            loop = FmaLoop(t, double)
            assert loop.lanes == t.vector_bytes // (8 if double else 4)
            assert loop.accumulators == t.vector_registers - 2
            assert loop.flops_per_iteration == 2 * loop.lanes * loop.accumulators * 4
            assert loop.run(10) > 0
            if t.x86:
                register = {64: "%zmm", 32: "%ymm"}[t.vector_bytes]
                fmas = [line for line in loop.asm.splitlines() if "vfmadd" in line]
                assert len(fmas) >= loop.accumulators and all(register in line for line in fmas)
                assert "(%rsp)" not in loop.asm                 # no accumulator spilled


def test_sweep_cases_and_cache_levels():
    """Case names expand and validate; a working set is placed in the
    innermost cache that holds it; a rate above its limit says why."""
    import pytest

    from benchmarks.roofline import cache_level, percent
    from benchmarks.sizes import FAMILIES, cases, kernel_for

    assert cases("matmul") == [f"matmul:{n}" for (n,) in FAMILIES["matmul"].sizes]
    assert cases("attention:128,matmul:64,attention:128") == ["attention:128", "matmul:64"]
    assert kernel_for("conv2d:2x8x10").shapes["X"] == (2, 8, 10, 10)
    for bad in ("nope", "matmul:big", "conv2d:8x32"):
        with pytest.raises(ValueError):
            cases(bad)
    machine = [dict(level=1, bytes=32 << 10, sharing=1), dict(level=2, bytes=1 << 20, sharing=1),
               dict(level=3, bytes=32 << 20, sharing=8)]
    assert [cache_level(b, machine, 1) for b in (16 << 10, 40 << 10, 2 << 20, 64 << 20)] == \
        ["L1", "L2", "L3", "memory"]
    assert cache_level(60 << 10, machine, 2) == "L1" and cache_level(60 << 20, machine, 16) == "L3"
    assert cache_level(1, [], 1) == "unknown"
    assert percent(dict(frac=0.5, tag="copy"), "L2") == "50.0% copy"
    assert percent(dict(frac=1.5, tag="copy"), "L2") == "150.0% copy (data in L2)"
    assert percent(dict(frac=1.2, tag="copy"), "memory") == "120.0% copy (copy figure low)"
    assert percent(dict(frac=1.1, tag="FMA peak"), "L1", wider_than_target=True).endswith("(wider vectors)")


def test_a_scheduled_stage_holds_a_product_or_its_pieces_never_its_copy():
    from benchmarks.stage_rates import better, groups, holds

    assert holds("C", "C") and holds("dWt.sums", "dWt") and holds("conv.interior", "conv")
    assert holds("conv%2=1", "conv") and holds("scores.r1", "scores.r1") and holds("loss.parts1", "loss")
    assert holds("conv.interior%4=3", "conv") and holds("C.cols1", "C") and holds("C.cols12", "C")
    for part, product in (("dh.r1.packed", "dh"), ("dh.r1", "dh"), ("C.packed1", "C"), ("Cx", "C"),
                          ("dh", "dh.r1"), ("conv.interiorx", "conv")):
        assert not holds(part, product), (part, product)
    entries = [("B.packed", 1.0), ("C", 2.0), ("dXp+dX", 3.0), ("dWt.sums", 4.0), ("dWt", 5.0),
               ("h, gates", 6.0), ("gates.packed", 7.0)]
    found = groups(entries, ("C", "dXp", "dWt", "gates", "absent"))
    assert sorted((tuple(n), tuple(p), s) for n, p, s in found) == [
        (("C",), ("C",), 2.0), (("dWt.sums", "dWt"), ("dWt",), 9.0),
        (("dXp+dX",), ("dXp",), 3.0), (("h, gates",), ("gates",), 6.0)]
    assert groups([("A+B", 1.0), ("B.sums", 2.0), ("A.interior", 3.0)], ("A", "B")) == \
        [(["A+B", "B.sums", "A.interior"], ["A", "B"], 6.0)]          # products computed together: one group
    one = dict(groups=[dict(products=["C"], seconds=2.0, flops=8), dict(products=["dA"], seconds=1.0, flops=8)],
               missing=[], profile_s=3.5)
    two = dict(one, groups=[dict(products=["C"], seconds=1.5, flops=8), dict(products=["dA"], seconds=3.0, flops=8)],
               profile_s=5.0)
    assert better(one, two)["groups"] == [dict(products=["C"], seconds=1.5, flops=8),
                                          dict(products=["dA"], seconds=1.0, flops=8)]
    assert better(one, None) is one and better(None, two) is two and better(one, two)["profile_s"] == 3.5


def test_every_family_names_the_stages_holding_its_gemm_flops():
    """``Kernel.products`` are stages of the lowered program whose
    multiply-adds are the kernel's GEMM flops, and the scheduled program
    holds each of them (a renamed stage would leave a product unfound)."""
    import te_autodiff as te
    from benchmarks.sizes import FAMILIES
    from benchmarks.stage_rates import groups
    from lowering.pipeline import lower_for

    with_products = 0
    for name, family in FAMILIES.items():
        for n, size in enumerate(family.sizes):       # the schedule's pieces differ by size (column groups at 2048³)
            kernel = family.make(*size)
            if not kernel.products:
                continue
            with_products += 1
            inputs, outputs = kernel.te_program(te)
            if n < 2:
                iterations = dict(te.cost(inputs, outputs)["stage_iterations"])
                assert 2 * sum(iterations[p] for p in kernel.products) == kernel.flops, (name, size)
            scheduled = lower_for(inputs, outputs).scheduled
            found = groups([(st.name, 1.0) for st in scheduled.stages], kernel.products)
            assert sorted(p for g in found for p in g[1]) == sorted(kernel.products), (name, size)
    assert with_products == 18                       # matmul, matmul_f64, mlp, conv2d, attention at every size
