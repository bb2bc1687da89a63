"""``python -m benchmarks.scan_steps``: the recurrent kernels (13: Elman RNN,
14: LSTM) over more time steps.

te-autodiff compiles a ``te.scan`` and its reverse scan as one loop over
time, so its build time should not depend on the number of steps T; the run
time grows with T like everyone's.  For T = 16, 64, 256 each (kernel, peer)
runs in a fresh process, measured like the suite (``worker.measure``); the
table gives te's derive + build seconds and every peer's milliseconds per
forward + backward (JAX: ``lax.scan`` under ``jax.jit``).  Nothing is written
to the committed reports.
"""
from __future__ import annotations

import argparse
import os

from .peers import LABELS
from .runner import run_child


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default="16,64,256", help="numbers of time steps (default 16,64,256)")
    p.add_argument("--kernels", default="13,14", help="13 (rnn), 14 (lstm) or both")
    p.add_argument("--peers", default="te,jax,torch", help="out of te, numpy, jax, torch")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--quick", action="store_true", help="a few repetitions (rough figures)")
    args = p.parse_args(argv)
    peers = args.peers.split(",")
    print(f"| kernel | T | te derive + build s | " + " | ".join(f"{LABELS[x]} ms" for x in peers) + " |")
    print("|---|---:|---:|" + "---:|" * len(peers))
    for kid in (int(k) for k in args.kernels.split(",")):
        for steps in (int(s) for s in args.steps.split(",")):
            cells, build = [], "-"
            for peer in peers:
                res = run_child(dict(peer=peer, kernel=kid, steps=steps, quick=args.quick, threads=args.threads),
                                args.threads, 600.0)
                if res.get("status") != "ok":
                    cells.append(res.get("status", "error"))
                    continue
                cells.append(f"{res['median_ms']:.2f}" + ("" if res["correct"] else " ✗"))
                if peer == "te":
                    d = res["details"]
                    build = f"{res['compile_s']:.2f} ({d['gradient_s']:.2f} + {d['build_s']:.2f})"
            name = {13: "rnn", 14: "lstm"}[kid]
            print(f"| {name} | {steps} | {build} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
