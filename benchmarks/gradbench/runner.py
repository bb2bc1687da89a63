"""``python -m benchmarks.gradbench``: GradBench's evals against te-autodiff,
GradBench's JAX and PyTorch tools and its hand-written C++ ``manual`` tool,
with one thread and with all cores; writes RESULTS.md (see README.md)."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from . import report, session, snapshot
from .evals import EVALS, NOT_COVERED

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TOOLS = ("te", "manual", "jax", "pytorch")

#: small inputs for --smoke: GradBench's own flags for each eval
SMOKE_ARGS = {
    "hello": [],
    "lse": ["-n", "1000", "4000"],
    "llsq": ["-n", "64", "256", "-m", "8"],
    "kmeans": ["-k", "5", "-n", "200", "-d", "4"],
    "gmm": ["-d", "2", "5", "-k", "3", "-n", "50"],
    "lstm": ["-l", "2", "-c", "32"],
    "ode": ["-n", "100", "-s", "4"],
    "ba": ["--min", "1", "--max", "1"],
}


def peer_evals(checkout: snapshot.Checkout, tool: str) -> dict[str, str]:
    """GradBench's list of the evals ``tool`` implements (tools/<tool>/evals.txt):
    name -> status ('' when it works, else GradBench's word: error, timeout)."""
    path = checkout.root / "tools" / tool / "evals.txt"
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts:
            out[parts[0]] = " ".join(parts[1:])
    return out


def tool_command(tool: str, threads: int, checkout: snapshot.Checkout, manual_bins: dict) -> list[str]:
    py = sys.executable
    if tool == "te":
        return [py, "-m", "benchmarks.gradbench.tool"]
    if tool == "manual":
        return [py, "-m", "benchmarks.gradbench.manual_tool", "--bin", str(manual_bins[threads > 1])]
    return [py, "-m", "benchmarks.gradbench.peer_tool", tool, "--threads", str(threads),
            "--gradbench", str(checkout.root)]


def tool_env(threads: int, checkout: snapshot.Checkout, tmp: str) -> dict:
    from benchmarks.runner import child_env           # the thread variables every benchmark child gets
    env = child_env(threads, tmp)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(checkout.python_dir)])
    return env


def skip_reason(tool: str, eval_name: str, threads: int, checkout, manual_bins, installed) -> str | None:
    if tool == "te":
        return None if eval_name in EVALS else "not covered"
    if tool in ("jax", "pytorch") and not installed[tool]:
        return "not installed"
    status = peer_evals(checkout, tool)
    if eval_name not in status:
        return "no GradBench implementation"
    if status[eval_name]:
        return f"GradBench marks it '{status[eval_name]}'"
    if tool == "manual":
        d = manual_bins[threads > 1]
        if not (d / eval_name).is_file():
            return "not built" if threads == 1 else "no OpenMP build"
    return None


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.gradbench", description=__doc__.splitlines()[0])
    p.add_argument("--evals", default=",".join(EVALS), help="comma-separated GradBench evals (default: all covered)")
    p.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, out of {', '.join(TOOLS)}")
    p.add_argument("--threads", default="1,all", help="comma-separated thread counts; 'all' = this machine's cores")
    p.add_argument("--min-runs", type=int, default=None, help="GradBench's --min-runs for every eval (default 1)")
    p.add_argument("--min-seconds", type=float, default=None,
                   help="GradBench's --min-seconds for every eval (default 1)")
    p.add_argument("--args", action="append", default=[], metavar="EVAL=ARGS",
                   help="GradBench's own flags for one eval, e.g. --args 'lse=-n 2500 5000' (sizes)")
    p.add_argument("--smoke", action="store_true", help="small inputs, one run each: seconds per eval")
    p.add_argument("--gradbench", default=None, help=f"the GradBench checkout (default {snapshot.DEFAULT_DIR})")
    p.add_argument("--setup", metavar="GIT_DIR", help="first lay out GradBench from this repository snapshot")
    p.add_argument("--manual-bin", default=None,
                   help="the manual tool's executables (default <checkout>/tools/manual/bin)")
    p.add_argument("--manual-bin-mt", default=None,
                   help="its OpenMP build, for more than one thread (default <checkout>/tools/manual/bin-mt)")
    p.add_argument("--out", default=None, help="where results.json and RESULTS.md go (default: benchmarks/gradbench "
                   "for a full-size run, $TMPDIR/te-gradbench for --smoke)")
    p.add_argument("--fresh", action="store_true", help="drop earlier results in --out instead of merging")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed for one response of a tool")
    p.add_argument("--render", action="store_true", help="only rewrite RESULTS.md from --out's results.json")
    p.add_argument("--merge", action="append", default=[], metavar="RESULTS_JSON",
                   help="with --render: first merge another run's results.json into --out's (its measurements win)")
    p.add_argument("--note", action="append", default=[],
                   help="a remark for the report (e.g. that the machine was shared); with --render, added to the "
                        "last run")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out) if args.out else (Path(tempfile.gettempdir()) / "te-gradbench" if args.smoke else HERE)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    if args.render:
        data = json.loads(results_path.read_text())
        for other in args.merge:
            data = report.merge_data(data, json.loads(Path(other).read_text()))
        if args.note:
            data["runs"][-1].setdefault("notes", []).extend(args.note)
        if args.merge or args.note:
            results_path.write_text(json.dumps(data, indent=1) + "\n")
        report.write(out, data)
        print(f"wrote {out / 'RESULTS.md'}")
        return 0
    try:
        if args.setup:
            snapshot.setup(args.setup, args.gradbench)
        checkout = snapshot.locate(args.gradbench)
    except snapshot.SetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    evals = [e.strip() for e in args.evals.split(",") if e.strip()]
    for name in evals:
        if name not in EVALS:
            print(f"error: eval {name!r}: " + (NOT_COVERED.get(name) or f"unknown; choose from {', '.join(EVALS)}"),
                  file=sys.stderr)
            return 2
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    bad = [t for t in tools if t not in TOOLS]
    if bad:
        print(f"error: unknown tool(s) {bad}; choose from {', '.join(TOOLS)}", file=sys.stderr)
        return 2
    cores = os.cpu_count() or 1
    threads = sorted({cores if t.strip() == "all" else int(t) for t in args.threads.split(",") if t.strip()})
    extra = {}
    for item in args.args:
        name, _, flags = item.partition("=")
        extra[name.strip()] = shlex.split(flags)
    manual_bins = {False: Path(args.manual_bin) if args.manual_bin else checkout.manual_bin(False),
                   True: Path(args.manual_bin_mt) if args.manual_bin_mt else checkout.manual_bin(True)}
    if "lstm" in evals:
        snapshot.ensure_lstm_text(checkout)
    installed = snapshot.peers_installed()

    previous = json.loads(results_path.read_text()) if results_path.is_file() and not args.fresh else None
    meta = report.machine_meta(checkout, ROOT)
    meta["command"] = "python -m benchmarks.gradbench " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    meta["load_start"] = os.getloadavg()
    meta["smoke"] = args.smoke
    meta["notes"] = list(checkout.notes) + list(args.note)
    if not checkout.has_manual(False) and args.manual_bin is None:
        meta["notes"].append("the manual tool is not built: GradBench's validators (which run it) judged nothing")
    print(f"GradBench {checkout.commit[:12]} at {checkout.root}; {meta['cpu']}; threads {threads}")

    records: list[session.Evaluation] = []
    skipped: list[dict] = []
    logdir = tempfile.mkdtemp(prefix="te-gradbench-logs-")
    t0 = time.monotonic()
    for name in evals:
        eval_args = list(SMOKE_ARGS[name]) if args.smoke else []
        eval_args += extra.get(name, [])
        if name != "hello":
            runs = args.min_runs if args.min_runs is not None else 1
            secs = args.min_seconds if args.min_seconds is not None else (0.0 if args.smoke else None)
            eval_args += ["--min-runs", str(runs)] + (["--min-seconds", str(secs)] if secs is not None else [])
        eval_cmd = [sys.executable, "-m", f"gradbench.evals.{name}.run"] + eval_args
        eval_env = dict(os.environ, PYTHONPATH=str(checkout.python_dir))
        for n in threads:
            for tool in tools:
                why = skip_reason(tool, name, n, checkout, manual_bins, installed)
                if why:
                    skipped.append({"eval": name, "tool": tool, "threads": n, "reason": why})
                    continue
                print(f"{name} / {tool} / {n} thread{'s' if n > 1 else ''}: {' '.join(eval_args)}", flush=True)
                with tempfile.TemporaryDirectory(prefix="te-gradbench-") as tmp:
                    records += session.run(name, eval_cmd, eval_env, tool,
                                           tool_command(tool, n, checkout, manual_bins),
                                           tool_env(n, checkout, tmp), n, str(checkout.root), logdir,
                                           args.timeout, progress=lambda s: print(s, flush=True))
                save(out, previous, meta, records, skipped, t0)        # after every session: a killed run keeps it
    save(out, previous, meta, records, skipped, t0)
    print(f"wrote {out / 'RESULTS.md'} and {results_path} ({meta['wall_s']:.0f} s; logs in {logdir})")
    return 0


def save(out: Path, previous, meta: dict, records, skipped, t0: float) -> None:
    """results.json and RESULTS.md with what this run has measured so far."""
    meta["load_end"] = os.getloadavg()
    meta["wall_s"] = time.monotonic() - t0
    data = report.merge(previous, meta, records, skipped)
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    report.write(out, data)
