"""RESULTS.md, results.json and the bar chart from one run's measurements."""
from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import subprocess
from pathlib import Path

from .kernels import KERNELS
from .peer_isa import UNCAPPED, peer_caps
from .peers import LABELS, PEERS
from .roofline import REASONS, cache_level, caches, footprint, peaks_markdown, percent, rates
from .worker import TOL

OTHERS = [p for p in PEERS if p != "te"]
COLORS = {"te": "#d62728", "numpy": "#7f7f7f", "jax": "#1f77b4", "torch": "#ff7f0e", "torch.compile": "#2ca02c"}


# ------------------------------------------------------------------ machine


def _cpuinfo() -> dict:
    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            key, val = key.strip(), val.strip()
            if key in ("model name", "flags") and key not in info:
                info[key] = val
    except OSError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["mem_gb"] = int(line.split()[1]) / 2 ** 20
    except OSError:
        pass
    return info


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _git_rev() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (rev or "unknown") + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def isa_name() -> str:
    """The instruction set te-autodiff compiles for in this environment (``TE_TARGET`` or the host)."""
    import te_autodiff as te

    t = te.target()
    return {64: "avx512", 32: "avx2"}.get(t.vector_bytes, "sse") if t.x86 else "neon"


def machine() -> dict:
    import te_autodiff as te

    cpu = _cpuinfo()
    flags = set(cpu.get("flags", "").split())
    simd = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return dict(cpu=cpu.get("model name", platform.processor() or "unknown"), cores=os.cpu_count(), simd=simd,
                target=str(te.target()), isa=isa_name(), peer_caps=peer_caps(),
                mem_gb=cpu.get("mem_gb"), python=platform.python_version(), platform=platform.platform(),
                git=_git_rev(), caches=caches(),
                versions={d: _version(d) for d in ("te-autodiff", "numpy", "llvmlite", "jax", "jaxlib", "torch",
                                                   "matplotlib")})


# ------------------------------------------------------------------ summary


def _ok(r) -> bool:
    return r is not None and r.get("status") == "ok"


def summarise(limits: dict, results: list, key: str = "kernel", kernel_of=KERNELS.__getitem__) -> list:
    """One row per kernel (per ``key``: ``"case"`` for the size sweep, whose
    kernels ``kernel_of`` makes): times per peer, fastest correct peer,
    ratio, and te's and that peer's rates against the limits
    (``roofline.rates``: ``te_rates``, ``peer_rates``)."""
    by = {(r[key], r["peer"]): r for r in results}
    names = sorted({r[key] for r in results}) if key == "kernel" else list(dict.fromkeys(r[key] for r in results))
    rows = []
    for name in names:
        k = kernel_of(name)
        te = by.get((name, "te"))
        peers = {p: by.get((name, p)) for p in OTHERS if (name, p) in by}
        good = {p: r["median_ms"] for p, r in peers.items() if _ok(r) and r["correct"]}
        fastest = min(good, key=good.get) if good else None
        te_ok = _ok(te) and te["correct"]
        ratio = good[fastest] / te["median_ms"] if te_ok and fastest else None
        row = {key: name, "te": te, "peers": peers, "fastest": fastest, "fastest_ms": good.get(fastest),
               "ratio": ratio, "kernel_record": k}
        for who, ms in (("te", te["median_ms"] if _ok(te) else None), ("peer", good.get(fastest))):
            if ms is not None:
                row[who + "_rates"] = rates(k, ms, limits)
        rows.append(row)
    return rows


def ratio_line(rows: list, what: str) -> str:
    """The geometric mean of peer / te over the rows with a ratio, and how often te is at least as fast."""
    ratios = [r["ratio"] for r in rows if r["ratio"]]
    return (f"**Geometric mean of (fastest peer ms / te ms) over {len(ratios)} {what}: {geomean(ratios):.3f}** "
            f"(> 1 means te-autodiff is faster); te is at least as fast as the fastest peer on "
            f"{sum(1 for x in ratios if x >= 1)} of {len(ratios)}.")


def kept_line(rows: list, what: str, uncapped, isa: str) -> str | None:
    """In a run whose peers are kept to a narrower instruction set than the
    machine's (``TE_TARGET``): te against the fastest correct peer that is
    kept to it, JAX left out of the rows where ``uncapped(row)`` (its matrix
    products and convolutions choose their own instructions,
    ``peer_isa.UNCAPPED``).  None when no row leaves JAX out."""
    left_out = sum(1 for r in rows if uncapped(r) and "jax" in r["peers"])
    ratios = []
    for r in rows:
        kept = {p: x["median_ms"] for p, x in r["peers"].items()
                if _ok(x) and x["correct"] and not (p == "jax" and uncapped(r))}
        if kept and _ok(r["te"]) and r["te"]["correct"]:
            ratios.append(min(kept.values()) / r["te"]["median_ms"])
    if not left_out or not ratios:
        return None
    return (f"Against the peers kept to {isa} (JAX left out of the {left_out} {what} it runs through matrix "
            f"libraries that are not): geometric mean of (fastest peer ms / te ms) {geomean(ratios):.3f}; te is "
            f"at least as fast as the fastest such peer on {sum(1 for x in ratios if x >= 1)} of {len(ratios)}.")


def percent_cell(row: dict, who: str, mach: dict, threads: int) -> str:
    """``who``'s (``"te"`` or ``"peer"``: the fastest) first rate of a
    summary row as a percentage of its limit, with the reason when above
    100% (``roofline.percent``)."""
    r = (row.get(who + "_rates") or [None])[0]
    if not r or r["frac"] is None:
        return "–"
    k = row["kernel_record"]
    wider = bool(mach.get("peer_caps")) and who == "peer" and row["fastest"] == "jax" and k.limit == "fma"
    return percent(r, cache_level(footprint(k), mach.get("caches") or [], threads), wider)


def geomean(values) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


# ------------------------------------------------------------------ markdown


def _ms(r) -> str:
    if r is None:
        return "–"
    if r.get("status") == "not installed":
        return "not installed"
    if r.get("status") != "ok":
        return r.get("status", "error")
    s = f"{r['median_ms']:.3g}" if r["median_ms"] < 100 else f"{r['median_ms']:.0f}"
    return s if r["correct"] else s + " ✗"


def _err(r) -> str:
    if r is None:
        return "–"
    if r.get("status") != "ok":
        return r.get("status", "error")
    det = "" if r.get("deterministic", True) else ", non-det."
    return (f"{r['max_rel_err']:.1e}" + ("" if r["correct"] else " ✗")) + det


def _compile(r) -> str:
    if not _ok(r):
        return "–" if r is None or r.get("status") == "not installed" else r.get("status", "error")
    return f"{r['compile_s']:.2f}"


def _overhead_section(overhead: dict | None) -> list:
    """The per-call costs (``overhead.py``), or nothing when they were not measured."""
    from .overhead import report as report_overhead

    if overhead is None:
        return []
    L = ["## Per-call overhead (µs)", ""]
    if overhead.get("status") != "ok":
        return L + [f"Not measured: {overhead.get('status')}: `{overhead.get('error', '')}`", ""]
    L.append("`python -m benchmarks.overhead` in its own process, one thread: `Y = X·X` over 16 float32 numbers, "
             "so the arithmetic is nothing and every microsecond is the call; a te kernel called warm from numpy, "
             "and forward + backward of a te op in PyTorch eager and under `jax.jit`, each against the "
             "framework's own `x * x` and a hand-written foreign function calling numpy. Median of interleaved "
             "rounds; wall clock and the process's CPU time (on a busy machine the wall clock also counts time "
             "spent waiting for a core).")
    L.append("")
    L.append(report_overhead(overhead["us"]))
    L += [f"- not installed: {line}" for line in overhead.get("missing", [])]
    L.append("")
    return L


def markdown(run: dict, mach: dict, limits: dict, results: list, sweep=(), overhead: dict | None = None) -> str:
    """RESULTS.md: the machine and its peaks, the per-call costs, then the size sweep's and the kernels'
    sections (those run)."""
    from .sweep_report import sweep_markdown            # it imports this module's helpers

    L = []
    L.append("# te-autodiff benchmark results")
    L.append("")
    L.append(f"Produced by `{run['command']}` on {run['date']} in {run['total_s']:.0f} s"
             f"{' (quick mode: few repetitions, rough figures)' if run['quick'] else ''}; "
             f"{run['threads']} thread(s) per peer; repository at {mach['git']}.")
    L.append("")
    L.append("## Machine")
    L.append("")
    mem = f", {mach['mem_gb']:.0f} GB RAM" if mach.get("mem_gb") else ""
    L.append(f"- CPU: {mach['cpu']}, {mach['cores']} logical cores{mem}; SIMD: {', '.join(mach['simd']) or '–'}")
    if mach.get("target"):
        L.append(f"- te-autodiff compiled for **{mach['isa']}**: {mach['target']}"
                 f"{' (TE_TARGET, narrower than this machine)' if mach.get('peer_caps') else ''}")
    if mach.get("peer_caps"):
        L.append(f"- The peers kept to {mach['isa'].upper()} too, so that the run stands for a machine without wider "
                 "vectors (`benchmarks/peer_isa.py`): " + ", ".join(f"`{k}={v}`" for k, v in mach["peer_caps"].items())
                 + f"; {UNCAPPED}")
    L.append(f"- Python {mach['python']} on {mach['platform']}")
    L.append("- " + ", ".join(f"{d} {v}" for d, v in mach["versions"].items()))
    if mach.get("caches"):
        L.append("- Data caches: " + ", ".join(f"L{c['level']} {c['bytes'] >> 10} KiB"
                                               + (f" shared by {c['sharing']} cores" if c["sharing"] > 1 else "")
                                               for c in mach["caches"]))
    if run.get("load_start") is not None:
        L.append(f"- Load average (1 min) at start / end of the run: {run['load_start']:.2f} / {run['load_end']:.2f} "
                 f"on {mach['cores']} logical cores" + (" — **other processes were running: the figures are "
                                                        "noisy**" if max(run["load_start"], run["load_end"]) > 0.5
                                                        else ""))
    L.append("")
    L.append("## Peaks measured in this run")
    L.append("")
    L += peaks_markdown(limits, run["threads"])
    L.append("")
    L += _overhead_section(overhead)
    if sweep:
        L += sweep_markdown(run, mach, limits, sweep)
    if results:
        _kernel_sections(run, mach, limits, results, L)
    return "\n".join(L)


def _kernel_sections(run: dict, mach: dict, limits: dict, results: list, L: list):
    """The kernels' table, compile times, correctness and method, appended to ``L``."""
    rows = summarise(limits, results)
    peers_run = [p for p in PEERS if p in run["peers"]]
    others = [p for p in peers_run if p != "te"]
    L.append("## Median forward + backward time (ms, best of 5 rounds)")
    L.append("")
    head = ["#", "kernel", "te"] + [LABELS[p] for p in others] + \
        ["fastest peer", "peer / te", "te compile s", "te correct", "te rate", "te of limit", "peer of limit"]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "|".join(["---:", ":---"] + ["---:"] * (len(head) - 2)) + "|")
    for row in rows:
        k = KERNELS[row["kernel"]]
        te = row["te"]
        cells = [str(k.id), k.title + ("" if k.dtype == "float32" else f" ({k.dtype})"), _ms(te)]
        cells += [_ms(row["peers"].get(p)) for p in others]
        cells.append(LABELS[row["fastest"]] if row["fastest"] else "–")
        cells.append(f"**{row['ratio']:.2f}**" if row["ratio"] else "–")
        cells.append(_compile(te))
        cells.append(("ok" if te["correct"] else "err") if _ok(te) else (te or {}).get("status", "–"))
        te_rate = (row.get("te_rates") or [None])[0]
        cells.append(f"{te_rate['rate']:.3g} {te_rate['unit']}" if te_rate else "–")
        cells += [percent_cell(row, who, mach, run["threads"]) for who in ("te", "peer")]
        L.append("| " + " | ".join(cells) + " |")
    L.append("")
    gm = geomean([r["ratio"] for r in rows])
    if gm is not None:
        L.append(ratio_line(rows, "kernel(s)"))
        kept = mach.get("peer_caps") and kept_line(rows, "kernel(s)", lambda r: r["kernel_record"].limit == "fma",
                                                    mach["isa"].upper())
        if kept:
            L.append(kept)
    else:
        L.append("No ratio: te-autodiff or every peer is missing, failed or wrong on every kernel.")
    missing = [KERNELS[r["kernel"]].key for r in rows if not r["ratio"]]
    if missing and gm is not None:
        L.append(f"Kernels without a ratio (te or all peers failed / wrong / not run): {', '.join(missing)}.")
    L.append("")
    L.append("`✗` marks a result outside the tolerance (not counted as fastest). "
             "Rates: GFLOP/s counts the GEMM flops of forward + backward (kernels 1, 2, 3, 7, 10, 13, 14, against "
             "the FMA peak of the kernel's dtype); GB/s counts the least bytes a loss + gradient pass must move (read "
             "inputs and head, write gradients; kernels 4, 5, 6, 8, 9, 11, 12, against the copy bandwidth). "
             + REASONS + " Issue targets: ≥ 60% of sgemm (the BLAS lines of the peaks) for 1, 2, 3, 10 and ≥ 70% "
             "of copy for 6, 8, 9.")
    L.append("")
    L.append("## Compile / first-call time (s)")
    L.append("")
    L.append("te: `te.gradient` + `te.build` (split in parentheses); the others: the first call "
             "(tracing + compilation for JAX and torch.compile; torch.compile starts from an empty cache).")
    L.append("")
    L.append("| # | kernel | " + " | ".join(LABELS[p] for p in peers_run) + " |")
    L.append("|---:|:---|" + "---:|" * len(peers_run))
    by = {(r["kernel"], r["peer"]): r for r in results}
    for row in rows:
        k = KERNELS[row["kernel"]]
        cells = [str(k.id), k.key]
        for p in peers_run:
            r = by.get((k.id, p))
            c = _compile(r)
            if p == "te" and _ok(r) and r.get("details"):
                d = r["details"]
                c += f" ({d['gradient_s']:.2f} + {d['build_s']:.2f})"
            cells.append(c)
        L.append("| " + " | ".join(cells) + " |")
    L.append("")
    L.append("## Correctness")
    L.append("")
    L.append("Worst relative error over every gradient, max|a − b| / max|b|, and the loss, |a − b| / max(|b|, "
             "‖out·H‖₂) (Σ out·H cancels, so it is judged against the size of its terms), against the float64 "
             f"numpy reference; tolerance {TOL['float32']:g} for float32, {TOL['float64']:g} for float64. "
             "\"non-det.\" marks results that differed bit-wise between the first and the last call.")
    L.append("")
    L.append("| # | kernel | " + " | ".join(LABELS[p] for p in peers_run) + " |")
    L.append("|---:|:---|" + "---:|" * len(peers_run))
    for row in rows:
        k = KERNELS[row["kernel"]]
        L.append("| " + " | ".join([str(k.id), k.key] + [_err(by.get((k.id, p))) for p in peers_run]) + " |")
    problems = [r for r in results if r.get("status") not in ("ok", "not installed") or
                (_ok(r) and (not r["correct"] or not r.get("deterministic", True)))]
    if problems:
        L.append("")
        L.append("## Problems")
        L.append("")
        for r in problems:
            k = KERNELS[r["kernel"]]
            if r.get("status") == "ok":
                what = f"wrong result, relative errors {json.dumps(r['errors'])}" if not r["correct"] else \
                    "results differ between calls"
            else:
                what = f"{r.get('status')}: `{r.get('error', '')}`"
                if r.get("where"):
                    what += f" (raised at {os.path.relpath(r['where'], Path(__file__).resolve().parent.parent)})"
            L.append(f"- kernel {k.id} ({k.key}), {LABELS[r['peer']]}: {what}")
    L.append("")
    L.append("## How it was measured")
    L.append("")
    L.append("Each (kernel, peer) runs in a fresh subprocess with the thread count set through the environment "
             "(`OMP/OPENBLAS/MKL/TE_NUM_THREADS`, `torch.set_num_threads`). After the compile / first call, the step "
             "(loss and all gradients, results materialised: JAX `block_until_ready`) is warmed up, then timed call "
             "by call with the garbage collector off, in 5 consecutive rounds; the table shows the lowest round median "
             "(a burst of other work slows one round, not the figure; results.json keeps every round); with "
             "`--repeat N` the whole suite runs N times, passes interleaved, and each (kernel, peer) keeps its best "
             "pass (results.json: `pass_medians_ms`; a result counts as correct only if every pass was). "
             "te-autodiff's kernel returns the "
             "loss Σ(output·H) (or the scalar loss) and the gradients from one `te.build`, like "
             "`jax.jit(jax.value_and_grad(...))`; PyTorch runs the forward and `torch.autograd.grad`. "
             "See `benchmarks/README.md`.")
    L.append("")
    return "\n".join(L)


# ------------------------------------------------------------------ chart


def chart(path: Path, run: dict, results: list) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    kernels = sorted({r["kernel"] for r in results})
    peers = [p for p in PEERS if p in run["peers"]]
    by = {(r["kernel"], r["peer"]): r for r in results}
    width = 0.8 / max(1, len(peers))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(kernels) + 2), 4.8))
    failed = []
    for n, p in enumerate(peers):
        xs, ys, hatch = [], [], []
        for i, kid in enumerate(kernels):
            r = by.get((kid, p))
            x = i + (n - (len(peers) - 1) / 2) * width
            if _ok(r):
                xs.append(x)
                ys.append(r["median_ms"])
                hatch.append(not r["correct"])
            elif r is not None:
                failed.append((x, r.get("status", "error")))
        bars = ax.bar(xs, ys, width, label=LABELS[p], color=COLORS.get(p))
        for b, h in zip(bars, hatch):
            if h:
                b.set_hatch("xx")
    ax.set_yscale("log")
    for x, status in failed:                            # no bar: say why, at the bottom of the axis
        ax.annotate(status, (x, 0), xycoords=("data", "axes fraction"), xytext=(0, 3), textcoords="offset points",
                    rotation=90, ha="center", va="bottom", fontsize=7, color="#444444")
    ax.set_xticks(range(len(kernels)))
    ax.set_xticklabels([f"{k}. {KERNELS[k].key}" for k in kernels], rotation=30, ha="right")
    ax.set_ylabel("median forward + backward (ms, log scale)")
    ax.set_title(f"te-autodiff vs peers, {run['threads']} thread(s){' (quick)' if run['quick'] else ''}")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_outputs(out_dir: Path, run: dict, limits: dict, results: list, mach: dict | None = None, sweep=(),
                  overhead: dict | None = None):
    from .sweep_report import sweep_chart               # it imports this module's helpers

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mach = mach or machine()
    md = markdown(run, mach, limits, results, sweep, overhead)
    paths = [out_dir / "RESULTS.md", out_dir / "results.json"]
    paths[0].write_text(md)
    rows = summarise(limits, results)
    summary = dict(geomean_ratio=geomean([r["ratio"] for r in rows]),
                   ratios={KERNELS[r["kernel"]].key: r["ratio"] for r in rows})
    paths[1].write_text(json.dumps(dict(run=run, machine=mach, limits=limits, summary=summary, results=results,
                                        sweep=list(sweep), overhead=overhead), indent=1))
    if results and chart(out_dir / "results.png", run, results):
        paths.append(out_dir / "results.png")
    if sweep and sweep_chart(out_dir / "sizes.png", run, sweep):
        paths.append(out_dir / "sizes.png")
    return md, paths
