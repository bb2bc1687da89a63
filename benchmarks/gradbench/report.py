"""results.json and RESULTS.md: per eval and input, each tool's median time,
GradBench's verdict on its output, and te-autodiff's time over each peer's."""
from __future__ import annotations

import datetime
import importlib.metadata
import math
import subprocess
from collections import defaultdict
from pathlib import Path

from .session import Evaluation

PEERS = ("manual", "jax", "pytorch")
TOOLS = ("te",) + PEERS

TIMING = """\
Timing. Every tool computes each input as often as GradBench's eval asks
(`--min-runs`, `--min-seconds`) and reports one time per call; the tables
give the median, in milliseconds. Only the computation is timed: not the
conversion of the JSON input to arrays, nor of the result to JSON (as in
GradBench). The times are of *finished* results: te-autodiff's kernels
return numpy arrays; GradBench's JAX and PyTorch tools run under an adapter
(`peer_tool.py`) that waits for each result inside the timed region
(`jax.block_until_ready`; GradBench's own `wrap.py` times JAX's
asynchronous dispatch only) and makes one untimed call first (JAX's jit
compiles then; te-autodiff builds its kernels before its untimed first
call too); the C++ `manual` tool times its own calls with `steady_clock`.
"Threads" is what each tool was allowed: te `TE_NUM_THREADS`; PyTorch
`torch.set_num_threads` and `OMP_NUM_THREADS`; JAX, for one thread,
`--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1` and a
process pinned to one CPU; the manual tool its plain build for one thread
and its OpenMP build (`OMP_NUM_THREADS`) for more.
Ratios are te-autodiff's median over the peer's: below 1, te-autodiff is faster.
A time marked ✗ is of an output GradBench's validator rejected; ? means no
verdict (the validator did not run)."""


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _git(root: Path, *args) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def machine_meta(checkout, root: Path) -> dict:
    import os

    import te_autodiff as te
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "te_commit": _git(root, "rev-parse", "--short", "HEAD") + (" (modified)" if dirty else ""),
            "gradbench_commit": checkout.commit,
            "cpu": f"{cpu_name()} ({te.target().cpu} to LLVM), {os.cpu_count()} cores",
            "target": str(te.target()),
            "versions": {d: _version(d) for d in ("numpy", "llvmlite", "jax", "jaxlib", "torch")}}


def merge(previous: dict | None, meta: dict, records: list[Evaluation], skipped: list[dict]) -> dict:
    """This run's results over an earlier results.json: an (eval, tool,
    threads, function, input) measured now replaces the earlier one."""
    now = {"runs": [meta], "evaluations": [r.to_json() for r in records], "skipped": skipped}
    return merge_data(previous, now) if previous else now


def merge_data(base: dict, newer: dict) -> dict:
    """Two results.json merged: ``newer``'s evaluations replace ``base``'s of
    the same (eval, tool, threads, function, input); runs are listed in order."""
    def key(e):
        return (e["eval"], e["tool"], e["threads"], e["function"], e["description"])
    replaced = {key(e) for e in newer["evaluations"]}
    measured = {(e["eval"], e["tool"], e["threads"]) for e in newer["evaluations"]}
    skips = {(s["eval"], s["tool"], s["threads"]): s for s in base.get("skipped", [])
             if (s["eval"], s["tool"], s["threads"]) not in measured}
    skips.update({(s["eval"], s["tool"], s["threads"]): s for s in newer.get("skipped", [])})
    return {"runs": base["runs"] + newer["runs"],
            "evaluations": [e for e in base["evaluations"] if key(e) not in replaced] + newer["evaluations"],
            "skipped": list(skips.values())}


def _ms(e: dict) -> float | None:
    if e["status"] != "ok" or not e.get("median_ns"):
        return None
    return e["median_ns"] / 1e6


#: (eval, function, peer) whose peer computes something else, with why: shown, never compared
INCOMPARABLE = {
    ("ode", "gradient", "manual"): "GradBench's manual ode gradient is the closed-form gradient of the exact "
                                   "solution (O(n)), not of the s Runge-Kutta steps the eval's primal takes",
}


def _cell(e: dict | None, skip: str | None) -> str:
    if e is None:
        return "—"
    if e["status"] != "ok":
        return e["status"]
    mark = {True: "", False: " ✗", None: " ?"}[e["valid"]]
    return f"{_fmt(_ms(e))}{mark}"


def _fmt(ms: float | None) -> str:
    if ms is None:
        return "—"
    return f"{ms:.3g}" if ms >= 0.001 else f"{ms:.2g}"


def _ratio(te: dict | None, peer: dict | None) -> float | None:
    if te is None or peer is None or te["valid"] is False or peer["valid"] is False:
        return None
    if (peer["eval"], peer["function"], peer["tool"]) in INCOMPARABLE:
        return None
    a, b = _ms(te), _ms(peer)
    return a / b if a and b else None


def _size_key(description: str):
    """Order inputs by their numbers (n=2500 before n=10000)."""
    import re
    return [int(x) for x in re.findall(r"\d+", description)] or [0]


def render(data: dict) -> str:
    runs = data["runs"]
    last = runs[-1]
    by = {}
    for e in data["evaluations"]:
        by[(e["eval"], e["tool"], e["threads"], e["function"], e["description"])] = e
    skips = {(s["eval"], s["tool"], s["threads"]): s["reason"] for s in data.get("skipped", [])}
    evals = sorted({e["eval"] for e in data["evaluations"]}, key=lambda n: _EVAL_ORDER.get(n, 99))
    threads = sorted({e["threads"] for e in data["evaluations"]})
    lines = ["# GradBench: te-autodiff against JAX, PyTorch and hand-written C++", ""]
    lines += [f"Machine: {last['cpu']}; te-autodiff compiles for `{last['target']}`.",
              f"te-autodiff {', '.join(dict.fromkeys(r['te_commit'] for r in runs))} (each run's commit below), "
              f"GradBench {last['gradbench_commit'][:12]}; "
              + ", ".join(f"{k} {v}" for k, v in last["versions"].items()) + ".", ""]
    lines += ["Runs merged into this report (newest last):", ""]
    for r in runs:
        load = f"load average {r['load_start'][0]:.2f} at the start, {r['load_end'][0]:.2f} at the end"
        lines.append(f"- {r['date']}, te-autodiff {r['te_commit']}: `{r['command'].strip()}` "
                     f"({r['wall_s'] / 60:.0f} min, {load})")
    notes = sorted({n for r in runs for n in r.get("notes", [])})
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    lines += ["", TIMING, ""]

    lines += ["## Summary: geometric mean of te-autodiff's time over each peer's", "",
              "Over the inputs both measured with a valid (or unjudged) output; n = how many.", ""]
    head = "| eval | function | threads | " + " | ".join(f"te / {p}" for p in PEERS) + " |"
    lines += [head, "|" + "---|" * (3 + len(PEERS))]
    for name in evals:
        functions = sorted({e["function"] for e in data["evaluations"]
                            if e["eval"] == name and e["function"] != "define"})
        for fn in functions:
            for n in threads:
                cells = []
                for peer in PEERS:
                    ratios = []
                    for (ev, tool, th, f, desc), e in by.items():
                        if ev == name and tool == "te" and th == n and f == fn:
                            r = _ratio(e, by.get((name, peer, n, fn, desc)))
                            if r:
                                ratios.append(r)
                    cells.append(f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f} (n={len(ratios)})"
                                 if ratios else "—")
                lines.append(f"| {name} | {fn} | {n} | " + " | ".join(cells) + " |")
    lines.append("")

    worst = []
    for (ev, tool, th, f, desc), e in by.items():
        if tool == "te" and ev != "hello":             # hello times a call, not a computation (its README says so)
            for peer in PEERS:
                r = _ratio(e, by.get((ev, peer, th, f, desc)))
                if r:
                    worst.append((r, ev, f, desc, th, peer, _ms(e), _ms(by[(ev, peer, th, f, desc)])))
    if worst:
        lines += ["## Where te-autodiff is furthest behind", "",
                  "The twelve largest ratios of te-autodiff's time over a peer's (hello aside).", "",
                  "| eval | function | input | threads | peer | te ms | peer ms | te / peer |",
                  "|---|---|---|---|---|---|---|---|"]
        for r, ev, f, desc, th, peer, a, b in sorted(worst, reverse=True)[:12]:
            lines.append(f"| {ev} | {f} | {desc} | {th} | {peer} | {_fmt(a)} | {_fmt(b)} | {r:.2f} |")
        lines.append("")

    for name in evals:
        lines += [f"## {name}", ""]
        descs = defaultdict(set)
        for e in data["evaluations"]:
            if e["eval"] == name and e["function"] != "define":
                descs[e["function"]].add(e["description"])
        lines += ["| input | function | threads | " + " | ".join(f"{t} ms" for t in TOOLS) + " | "
                  + " | ".join(f"te / {p}" for p in PEERS) + " | te prepare s |",
                  "|" + "---|" * (3 + len(TOOLS) + len(PEERS) + 1)]
        problems = []
        for fn in sorted(descs):
            for desc in sorted(descs[fn], key=_size_key):
                for n in threads:
                    row = {t: by.get((name, t, n, fn, desc)) for t in TOOLS}
                    if not any(row.values()):
                        continue
                    cells = [_cell(row[t], skips.get((name, t, n)))
                             + (" †" if row[t] and (name, fn, t) in INCOMPARABLE else "") for t in TOOLS]
                    ratios = [_ratio(row["te"], row[p]) for p in PEERS]
                    te = row["te"]
                    prep = f"{te['prepare_ns'] / 1e9:.2f}" if te and te.get("prepare_ns") else "—"
                    lines.append(f"| {desc} | {fn} | {n} | " + " | ".join(cells) + " | "
                                 + " | ".join(f"{r:.2f}" if r else "—" for r in ratios) + f" | {prep} |")
                    for t, e in row.items():
                        if e and (e["status"] != "ok" or e["valid"] is False):
                            text = (e.get("analysis") or e.get("error") or "").strip().splitlines()
                            problems.append(f"- {t}, {fn} {desc}, {n} thread(s): {e['status']}"
                                            + (", rejected" if e["valid"] is False else "")
                                            + (f": {text[-1][:200]}" if text else ""))
        notes = sorted({f"{tool} ({n} thread{'s' if n > 1 else ''}): {why}"
                        for (ev, tool, n), why in skips.items() if ev == name})
        notes = _collapse(notes)
        if notes:
            lines += ["", "Not measured: " + "; ".join(notes) + "."]
        for (ev, fn, tool), why in INCOMPARABLE.items():
            if ev == name and any(k[0] == ev and k[1] == tool and k[3] == fn for k in by):
                lines += ["", f"† Not compared: {why}."]
        defines = [e for e in data["evaluations"] if e["eval"] == name and e["function"] == "define"]
        problems += [f"- {e['tool']}, {e['threads']} thread(s): define failed: "
                     + ((e.get("error") or "").strip().splitlines() or [""])[-1][:200] for e in defines]
        if problems:
            lines += ["", "Problems:", ""] + sorted(set(problems))
        lines.append("")
    return "\n".join(lines)


def _collapse(notes: list[str]) -> list[str]:
    """'jax (1 thread): x' and 'jax (2 threads): x' as 'jax: x'."""
    import re
    by_tool = defaultdict(set)
    for note in notes:
        tool, _, why = note.partition(": ")
        by_tool[(re.sub(r" \(.*\)", "", tool), why)].add(tool)
    out = []
    for (tool, why), variants in sorted(by_tool.items()):
        out += [f"{tool}: {why}"] if len(variants) > 1 else [f"{v}: {why}" for v in sorted(variants)]
    return out


_EVAL_ORDER = {n: i for i, n in enumerate(("hello", "lse", "llsq", "kmeans", "gmm", "lstm", "ode", "ba"))}


def write(out: Path, data: dict) -> None:
    (Path(out) / "RESULTS.md").write_text(render(data))
