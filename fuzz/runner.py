"""Child-process execution and reporting.

Programs run in batches, one child process per batch (``python -m
fuzz.runner --group G SEED...``), which checks them in groups of ``G``
(one te kernel per group: ``check.check_group``) and prints one JSON record
per program as each group finishes.  A child that dies (an abort, a
segfault) or stays silent longer than the timeout (a hang) failed in the
group it was running, the first one without records: each program of that
group is run again alone, one process each, to find the culprit (a crash
that needs the rest of the group, or the earlier programs of the batch,
says so), and the rest of the batch goes on in another child.
:class:`Summary` counts the records by status and by feature and keeps the
failures, each with the program's te and torch source.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from itertools import count as naturals, islice

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STARTUP = 120.0         # seconds a child may take to import te and torch
FAILED = ("mismatch", "te_error", "torch_error", "bad_input", "nonfinite", "crash", "hang")


def program_seeds(seed: int, count: int, start: int = 0) -> list:
    """The program seeds of exploration ``seed``: ``seed * 10**6 + k`` for ``k`` in ``start .. start + count - 1``."""
    return [seed * 1_000_000 + k for k in range(start, start + count)]


def targeted_seeds(seed: int, count: int, start: int = 0) -> list:
    """The seeds of exploration ``seed`` whose programs take a targeted form
    (``programs.targeted``): the ``start``-th to the ``start + count - 1``-th of them."""
    from .programs import generate, targeted
    found = (s for s in (seed * 1_000_000 + k for k in naturals()) if targeted(generate(s)))
    return list(islice(found, start, start + count))


def _child(seeds, timeout, group):
    """Run ``seeds`` in one child process, in groups of ``group``; yields
    records as they come, and finally ``(kind, detail)`` where kind is None,
    'crash' or 'hang'."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "fuzz.runner", "--group", str(group), *map(str, seeds)],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        lines = queue.Queue()
        reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)],
                                  daemon=True)
        reader.start()
        kind, expected = None, [None] + list(seeds)       # a "ready" line after the imports, then the records
        for k in expected:
            try:
                line = lines.get(timeout=STARTUP if k is None else timeout)
            except queue.Empty:
                kind = "hang"
                proc.kill()
                break
            if line is None:
                kind = "crash"
                break
            if k is not None:
                yield json.loads(line)
        proc.wait()
        reader.join(timeout=5)
        err.seek(0)
        tail = err.read()[-3000:]
        yield kind, (f"exit code {proc.returncode}\n{tail}" if kind == "crash" else
                     f"no record in {timeout:.0f} s" if kind == "hang" else "")


def _failure(seed, kind, detail):
    from .programs import generate
    return {"seed": seed, "status": kind, "detail": detail, "features": sorted(generate(seed).features),
            "seconds": None, "cpu": None}


def run_batch(seeds, timeout: float, group: int = 1) -> list:
    """The records of ``seeds``, one child per batch, in groups of ``group``;
    a crash or hang becomes its program's record (see the module doc)."""
    records, todo = [], list(seeds)
    while todo:
        got = list(_child(todo, timeout, group))
        kind, detail = got.pop()
        records += got
        todo = todo[len(got):]
        if kind is None:
            break
        flight, todo = todo[:group], todo[group:]
        alone = []
        for seed in flight:
            rerun = list(_child([seed], timeout, 1))
            again, detail_alone = rerun.pop()
            alone += rerun if again is None else [_failure(seed, again, detail_alone)]
        if not any(r["status"] == kind for r in alone):
            before = ", ".join(str(r["seed"]) for r in got) or "none"
            alone[0] = _failure(flight[0], kind, f"{kind} in one process with {flight} (after {before}), "
                                                 f"not alone:\n{detail}")
        records += alone
    return records


def run(seeds, jobs: int = 1, batch: int = 100, timeout: float = 120.0, on_record=None, group: int = 8) -> "Summary":
    """Check ``seeds`` in batches of ``batch`` (groups of ``group``) over ``jobs``
    concurrent children; ``on_record(record, summary)`` after each record is counted."""
    summary = Summary()
    lock = threading.Lock()

    def work(chunk):
        for record in run_batch(chunk, timeout, group):
            with lock:
                summary.add(record)
                if on_record is not None:
                    on_record(record, summary)

    chunks = [seeds[k:k + batch] for k in range(0, len(seeds), batch)]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for f in [pool.submit(work, c) for c in chunks]:
            f.result()
    return summary


class Summary:
    """Records counted by status and by feature; the failures kept."""

    def __init__(self):
        self.status = Counter()
        self.features = Counter()
        self.failing_features = Counter()
        self.failures = []
        self.cpu = 0.0
        self.start = time.perf_counter()

    def add(self, record):
        self.status[record["status"]] += 1
        self.features.update(record["features"])
        self.cpu += record.get("cpu") or 0.0
        if record["status"] in FAILED:
            self.failing_features.update(record["features"])
            self.failures.append(record)

    @property
    def count(self):
        return sum(self.status.values())

    def line(self, total=None) -> str:
        """One progress line: programs done, failures by status, wall time and the estimate left."""
        wall = time.perf_counter() - self.start
        fails = ", ".join(f"{k} {v}" for k, v in sorted(self.status.items()) if k in FAILED) or "no failures"
        eta = f", about {wall / self.count * (total - self.count) / 60:.0f} min left" if total and self.count else ""
        cpu = f", {self.cpu / self.count:.2f} s CPU per program" if self.count else ""
        return f"[{self.count}/{total or self.count}] {fails}; {wall / 60:.1f} min{eta}{cpu}"

    def table(self) -> str:
        """Programs and failures by feature."""
        rows = [f"{'feature':28} {'programs':>9} {'failures':>9}"]
        for name, n in sorted(self.features.items()):
            rows.append(f"{name:28} {n:9d} {self.failing_features[name]:9d}")
        return "\n".join(rows)

    def report(self, record) -> str:
        """A failure with its program (te and torch source), reproducible from the seed."""
        from .programs import generate
        return (f"==== seed {record['seed']}: {record['status']}\n{record['detail']}\n"
                f"{generate(record['seed']).text()}\nreplay: python -m fuzz --replay {record['seed']}\n")


def child_main(seeds, group):
    """The child process: one JSON record per line, flushed as each group of
    ``group`` programs finishes.  ``FUZZ_FAULT="SEED:abort,SEED:hang"`` makes
    it abort or hang at those programs instead (the runner's own test)."""
    import torch
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)      # float constants as te's, next to float64 (torch_ops.py)
    from .check import check_group
    print(json.dumps({"ready": True}), flush=True)
    faults = dict(f.split(":") for f in os.environ.get("FUZZ_FAULT", "").split(",") if f)
    for k in range(0, len(seeds), group):
        chunk = seeds[k:k + group]
        for seed in chunk:
            if faults.get(str(seed)) == "abort":
                os.abort()
            if faults.get(str(seed)) == "hang":
                time.sleep(3600)
        for record in check_group(chunk):
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    child_main([int(s) for s in sys.argv[3:]], int(sys.argv[2]))
