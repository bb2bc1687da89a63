"""Run the suite: machine limits, then every (kernel, peer) in its own subprocess.

``python -m benchmarks [--kernels 1,3] [--sizes [matmul,...]] [--peers te,numpy] [--quick] [--threads N] [--out DIR]``

A full run (all kernels, all peers, not ``--quick``) writes
``RESULTS.md``, ``results.png`` and ``results.json`` into
``benchmarks/<isa>/`` for the instruction set te-autodiff compiled for
(``avx2``, ``avx512``, ``sse``, ``neon``: ``TE_TARGET`` picks a narrower one
than the machine's), one committed report per ISA; a partial or quick run writes them to a
temporary directory (printed) unless ``--out`` says where, so a smoke test
never overwrites the committed report.  ``--sizes`` runs the size sweep
(``sizes.py``) the same way, instead of the kernels unless ``--kernels`` is
given too; a full sweep writes into ``benchmarks/<isa>/sizes/``.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .kernels import KERNELS
from .peer_isa import peer_caps, with_caps
from .peers import PEERS, installed
from .report import isa_name, write_outputs
from .sizes import cases
from .stage_rates import better as better_products
from .worker import MARK

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SWEEP_PEERS = tuple(p for p in PEERS if p != "torch.compile")    # the sweep's default: compiling is slow


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", default="", help="comma-separated kernel numbers or names (default: all of them)")
    p.add_argument("--peers", default="", help=f"comma-separated peers out of {','.join(PEERS)} (default: all)")
    p.add_argument("--quick", action="store_true", help="few repetitions (smoke test); figures are rough")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="threads for every peer (default: all logical cores, %(default)s)")
    p.add_argument("--out", default=None, help="directory for RESULTS.md, results.png, results.json")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per (kernel, peer) process (default 600, quick 120)")
    p.add_argument("--repeat", type=int, default=1,
                   help="passes over every (kernel, peer), interleaved; each keeps its best pass (default 1)")
    p.add_argument("--sizes", nargs="?", const="all", default=None, metavar="FAMILIES",
                   help="the size sweep: every family at every size, or the families / cases named "
                        "(matmul,attention:128); without --kernels, no kernels")
    p.add_argument("--no-overhead", dest="overhead", action="store_false",
                   help="skip the per-call costs (overhead.py; also skipped when --kernels is given)")
    p.add_argument("--render", metavar="JSON", default=None,
                   help="only rewrite RESULTS.md and the chart from a results.json of an earlier run")
    args = p.parse_args(argv)
    by_name = {k.key: k.id for k in KERNELS.values()}
    if args.kernels:
        ids = []
        for tok in args.kernels.split(","):
            tok = tok.strip()
            kid = int(tok) if tok.isdigit() else by_name.get(tok)
            if kid not in KERNELS:
                p.error(f"unknown kernel {tok!r}; known: {', '.join(f'{k.id}={k.key}' for k in KERNELS.values())}")
            ids.append(kid)
        args.kernel_ids = ids
    else:
        args.kernel_ids = [] if args.sizes else list(KERNELS)
    try:
        args.cases = cases(args.sizes) if args.sizes else []
    except ValueError as e:
        p.error(str(e))
    if args.peers:
        peers = [s.strip() for s in args.peers.split(",") if s.strip()]
        for s in peers:
            if s not in PEERS:
                p.error(f"unknown peer {s!r}; known: {', '.join(PEERS)}")
        args.peer_list = [s for s in PEERS if s in peers]
    else:
        args.peer_list = list(SWEEP_PEERS if args.sizes else PEERS)
    if args.timeout is None:
        args.timeout = 120.0 if args.quick else 600.0
    args.threads = max(1, args.threads)
    args.overhead = args.overhead and not args.kernels
    return args


def child_env(threads: int, tmp: str) -> dict:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                "VECLIB_MAXIMUM_THREADS", "TE_NUM_THREADS"):
        env[var] = str(threads)
    if threads == 1:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                            " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")     # cold torch.compile every time
    env["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONHASHSEED"] = "0"
    return with_caps(env, peer_caps())


def run_child(job: dict, threads: int, timeout: float) -> dict:
    """Run one worker job in a fresh process (its own session, killed whole on timeout)."""
    tmp = tempfile.mkdtemp(prefix="te-bench-")
    cmd = [sys.executable, "-m", "benchmarks.worker", json.dumps(job)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=str(ROOT), env=child_env(threads, tmp), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return dict(job, status="timeout", error=f"no result within {timeout:.0f} s", wall_s=timeout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - t0
    for line in reversed(out.splitlines()):
        if line.startswith(MARK):
            res = json.loads(line[len(MARK):])
            res["wall_s"] = wall
            return res
    tail = (err or out or "").strip().splitlines()[-12:]
    return dict(job, status="error", error=f"worker exited with code {proc.returncode} without a result",
                traceback="\n".join(tail), wall_s=wall)


def _progress(res: dict) -> str:
    if res.get("status") != "ok":
        return f"{res.get('status')}: {res.get('error', '')}"[:160]
    mark = "ok" if res["correct"] else f"WRONG (rel err {res['max_rel_err']:.2e})"
    return f"{res['median_ms']:9.3f} ms  compile {res['compile_s']:6.2f} s  {res['reps']:5d} reps  {mark}"


def measure_limits(args) -> dict:
    """numpy's limits at 1 thread and at ``--threads``; each figure is the better of the two."""
    runs = {t: run_child(dict(limits=True, quick=args.quick, threads=t), t, args.timeout)
            for t in sorted({1, args.threads})}
    good = {t: r for t, r in runs.items() if r.get("status") == "ok"}
    if not good:
        return next(iter(runs.values()))
    first = next(iter(good.values()))
    limits = {**first, **{k: max(r[k] for r in good.values()) for k, v in first.items() if isinstance(v, float)}}
    limits.update(by_threads={str(t): r for t, r in good.items()})
    return limits


def _better_limits(old, new) -> dict:
    """Each machine limit at its best over the passes."""
    if old is None or old.get("status") != "ok":
        return new
    if new.get("status") != "ok":
        return old
    return {**old, **{k: max(v, old[k]) for k, v in new.items() if isinstance(v, float) and k in old}}


def _better_result(old, new) -> dict:
    """The pass with the lower median of one (kernel, peer); correct and
    deterministic only if every pass was; ``pass_medians_ms`` lists them all;
    the products timed alone at their best over the passes (``stage_rates``)."""
    if old is None:
        return dict(new, pass_medians_ms=[new.get("median_ms")])
    medians = old["pass_medians_ms"] + [new.get("median_ms")]
    if new.get("status") != "ok":
        return dict(old, pass_medians_ms=medians) if old.get("status") == "ok" else dict(new, pass_medians_ms=medians)
    if old.get("status") != "ok":
        return dict(new, pass_medians_ms=medians)
    best = new if new["median_ms"] < old["median_ms"] else old
    merged = dict(best, pass_medians_ms=medians, correct=old["correct"] and new["correct"],
                  deterministic=old["deterministic"] and new["deterministic"],
                  max_rel_err=max(old["max_rel_err"], new["max_rel_err"]))
    products = better_products(old.get("products"), new.get("products"))
    return merged if products is None else dict(merged, products=products)


def measure_overhead(args) -> dict:
    """The per-call costs (``overhead.py``) in a fresh process, one thread."""
    return run_child(dict(overhead=True, quick=args.quick), 1, args.timeout)


def _better_overhead(old, new) -> dict:
    """Each variant's wall and CPU time at its best over the passes."""
    if old is None or old.get("status") != "ok":
        return new
    if new.get("status") != "ok":
        return old
    us = {name: [min(a, b) for a, b in zip(t, new["us"].get(name, t))] for name, t in old["us"].items()}
    return dict(old, us=us)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render:
        data = json.loads(Path(args.render).read_text())
        out_dir = Path(args.out) if args.out else Path(args.render).resolve().parent
        md, paths = write_outputs(out_dir, data["run"], data["limits"], data["results"], data.get("machine"),
                                  data.get("sweep", []), data.get("overhead"))
        print(md)
        print("wrote " + ", ".join(str(p) for p in paths))
        return 0
    full = (not args.quick and args.kernel_ids == list(KERNELS) and args.peer_list == list(PEERS) and not args.cases)
    full_sweep = (not args.quick and not args.kernel_ids and args.sizes == "all"
                  and args.peer_list == list(SWEEP_PEERS))
    out_dir = Path(args.out) if args.out else (
        HERE / isa_name() if full else HERE / isa_name() / "sizes" if full_sweep
        else Path(tempfile.gettempdir()) / "te-autodiff-bench")
    given = list(argv) if argv is not None else sys.argv[1:]
    command = " ".join(["python -m benchmarks"] + [shlex.quote(a) for a in given])
    t_start = time.perf_counter()
    print(f"te-autodiff benchmarks: kernels {args.kernel_ids}, {len(args.cases)} size case(s), peers {args.peer_list}, "
          f"threads {args.threads}{', quick' if args.quick else ''}", flush=True)
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    limits, results, sweep, overhead = None, {}, {}, None
    for n in range(max(args.repeat, 1)):
        if args.repeat > 1:
            print(f"pass {n + 1} of {args.repeat}", flush=True)
        limits = _better_limits(limits, measure_limits(args))
        if args.overhead:
            res = measure_overhead(args)
            overhead = _better_overhead(overhead, res)
            print("per-call overhead: " + ("measured" if res.get("status") == "ok" else
                                           f"{res.get('status')}: {res.get('error', '')}"[:160]), flush=True)
        jobs = [(f"[{kid}] {KERNELS[kid].title} ({KERNELS[kid].dtype})", "kernel", kid, results)
                for kid in args.kernel_ids] + [(f"[{case}]", "case", case, sweep) for case in args.cases]
        for title, field, name, store in jobs:
            print(title, flush=True)
            for peer in args.peer_list:
                job = {"peer": peer, field: name}
                if not installed(peer):
                    res = dict(job, status="not installed")
                else:
                    res = run_child(dict(job, quick=args.quick, threads=args.threads), args.threads, args.timeout)
                store[name, peer] = _better_result(store.get((name, peer)), res)
                print(f"    {peer:14s} {_progress(res)}", flush=True)
    results, sweep = list(results.values()), list(sweep.values())
    total = time.perf_counter() - t_start
    run = dict(command=command, quick=args.quick, threads=args.threads, repeat=args.repeat, kernels=args.kernel_ids,
               cases=args.cases, peers=args.peer_list, total_s=total, date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
               load_start=load_start, load_end=os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
    md, paths = write_outputs(out_dir, run, limits, results, sweep=sweep, overhead=overhead)
    print()
    print(md)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
