"""One GradBench eval against one tool, over pipes: what GradBench's Rust
CLI does, without Docker.

The eval process (GradBench's ``gradbench.evals.<name>.run``) writes
messages on its stdout; each goes to the tool's stdin, and the tool's
response back to the eval. ``analysis`` messages (the eval's verdict on an
output, from GradBench's validator) are answered here and recorded, not
forwarded. Every evaluation becomes an :class:`Evaluation`.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Evaluation:
    eval: str
    tool: str
    threads: int
    function: str
    description: str
    status: str = "ok"                  # ok, failed (tool said so), timeout, crashed
    error: str | None = None
    valid: bool | None = None           # GradBench's validator; None: never judged
    analysis: str | None = None
    prepare_ns: int | None = None
    timings_ns: list[int] = field(default_factory=list)

    @property
    def key(self) -> tuple:
        return (self.eval, self.tool, self.threads, self.function, self.description)

    def median_ns(self) -> float | None:
        t = sorted(self.timings_ns)
        if not t:
            return None
        mid = len(t) // 2
        return float(t[mid]) if len(t) % 2 else (t[mid - 1] + t[mid]) / 2

    def to_json(self) -> dict:
        """The record for results.json: the timings summarised (a fast function
        is called tens of thousands of times)."""
        out = asdict(self)
        t = out.pop("timings_ns")
        out.update(runs=len(t), median_ns=self.median_ns(), min_ns=min(t) if t else None,
                   max_ns=max(t) if t else None)
        return out


def _reader(stream, q: queue.Queue) -> None:
    for line in stream:
        q.put(line)
    q.put(None)


def _start(cmd, env, cwd, stderr_path):
    err = open(stderr_path, "w")
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                            text=True, bufsize=1, start_new_session=True)
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
    return proc, q, err


def _stop(proc) -> None:
    try:
        if proc.stdin and not proc.stdin.closed:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tail(path, lines=15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run(eval_name: str, eval_cmd: list[str], eval_env: dict, tool: str, tool_cmd: list[str], tool_env: dict,
        threads: int, cwd: str, logdir: str, timeout: float, progress=print) -> list[Evaluation]:
    """Drive ``eval_cmd`` against ``tool_cmd`` until the eval ends; ``timeout``
    bounds each response of the tool (a tool past it is killed and the
    session ends there)."""
    tag = f"{eval_name}-{tool}-{threads}"
    ev, ev_q, ev_err = _start(eval_cmd, eval_env, cwd, os.path.join(logdir, f"{tag}.eval.log"))
    tl, tl_q, tl_err = _start(tool_cmd, tool_env, cwd, os.path.join(logdir, f"{tag}.tool.log"))
    records: dict[int, Evaluation] = {}
    seen: dict[tuple, int] = {}
    out: list[Evaluation] = []
    try:
        while True:
            line = ev_q.get()
            if line is None:
                break
            message = json.loads(line)
            kind = message.get("kind")
            if kind == "analysis":
                rec = records.get(message["of"])
                if rec is not None:
                    rec.valid = bool(message["valid"])
                    rec.analysis = message.get("error")
                ev.stdin.write(json.dumps({"id": message["id"]}) + "\n")
                ev.stdin.flush()
                continue
            tl.stdin.write(line if line.endswith("\n") else line + "\n")
            tl.stdin.flush()
            if kind == "end":
                break
            rec = None
            if kind == "evaluate":
                desc = message.get("description") or _describe(message["input"])
                seen[(message["function"], desc)] = repeat = seen.get((message["function"], desc), 0) + 1
                if repeat > 1:
                    desc += f" (call {repeat})"
                rec = Evaluation(eval_name, tool, threads, message["function"], desc)
                records[message["id"]] = rec
                out.append(rec)
            started = time.monotonic()
            try:
                reply = tl_q.get(timeout=timeout)
            except queue.Empty:
                if rec is not None:
                    rec.status, rec.error = "timeout", f"no response within {timeout:.0f} s"
                progress(f"  {tag}: {message.get('function', kind)} {message.get('description', '')}: timeout")
                os.killpg(tl.pid, signal.SIGKILL)
                break
            if reply is None:
                if rec is not None:
                    rec.status, rec.error = "crashed", f"the tool exited ({tl.wait()}): {_tail(tl_err.name)}"
                progress(f"  {tag}: the tool exited: {_tail(tl_err.name, 3)}")
                break
            response = json.loads(reply)
            if rec is not None:
                _record(rec, response)
                med = rec.median_ns()
                progress(f"  {tag}: {rec.function} {rec.description}: "
                         + (f"{med / 1e6:.4g} ms median of {len(rec.timings_ns)}" if rec.status == "ok" and med
                            else f"{rec.status}: {(rec.error or '').strip().splitlines()[-1:]}")
                         + f" ({time.monotonic() - started:.1f} s)")
            elif kind == "define" and not response.get("success", False):
                progress(f"  {tag}: define failed: {(response.get('error') or '').strip().splitlines()[-1:]}")
                out.append(Evaluation(eval_name, tool, threads, "define", "", status="failed",
                                      error=response.get("error")))
            ev.stdin.write(reply if reply.endswith("\n") else reply + "\n")
            ev.stdin.flush()
    except (BrokenPipeError, OSError) as error:
        progress(f"  {tag}: pipe closed ({error}); eval log: {_tail(ev_err.name, 5)}")
    finally:
        _stop(tl)
        _stop(ev)
        tl_err.close()
        ev_err.close()
    return out


def _describe(input) -> str:
    """A name for an input the eval did not describe (hello's numbers)."""
    return f"x={input}" if isinstance(input, (int, float)) else ""


def _record(rec: Evaluation, response: dict) -> None:
    if not response.get("success", False):
        rec.status, rec.error = "failed", response.get("error") or "the tool reported failure"
        return
    for timing in response.get("timings") or []:
        if timing["name"] == "evaluate":
            rec.timings_ns.append(int(timing["nanoseconds"]))
        elif timing["name"] == "prepare":
            rec.prepare_ns = int(timing["nanoseconds"])
