"""The tool side of GradBench's JSON-lines protocol, shared by the te tool
and the peer adapters.

GradBench's eval sends one JSON object per line (``start``, ``define``,
``evaluate``, ``analysis``) and expects one response per message, with the
same ``id``; ``evaluate`` responses carry the output and a list of timings
(name and nanoseconds), one ``evaluate`` entry per timed call. The
``min_runs`` / ``min_seconds`` fields of an input say how often to call
(at least ``min_runs`` times and until ``min_seconds`` have been spent).
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any, Callable


def repeat(run: Callable[[], Any], min_runs: int, min_seconds: float) -> tuple[Any, list[dict]]:
    """Call ``run`` at least ``min_runs`` times and until ``min_seconds`` have
    been spent in it; the last result and one timing per call."""
    timings, spent, result = [], 0.0, None
    while len(timings) < max(1, min_runs) or spent < min_seconds:
        start = time.perf_counter_ns()
        result = run()
        elapsed = time.perf_counter_ns() - start
        timings.append({"name": "evaluate", "nanoseconds": elapsed})
        spent += elapsed / 1e9
    return result, timings


def runs(input: Any) -> tuple[int, float]:
    """(min_runs, min_seconds) of an input; inputs without them (hello) run once."""
    if isinstance(input, dict):
        return int(input.get("min_runs", 1)), float(input.get("min_seconds", 0.0))
    return 1, 0.0


def failure(error: BaseException) -> dict:
    return {"success": False, "error": "".join(traceback.format_exception(error))}


def serve(tool: str, define: Callable[[str], None], evaluate: Callable[[dict], dict],
          config: Any = None, stdin=None, stdout=None) -> None:
    """Answer protocol messages from ``stdin`` until it closes. ``define(module)``
    raises if the module cannot be served; ``evaluate(message)`` returns the
    response fields (success, output, timings)."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    for line in stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        response: dict = {"id": message["id"]}
        kind = message.get("kind")
        if kind == "start":
            response["tool"] = tool
            if config is not None:
                response["config"] = config
        elif kind == "define":
            try:
                define(message["module"])
                response["success"] = True
            except Exception as error:          # noqa: BLE001 - reported to the eval
                response |= failure(error)
        elif kind == "evaluate":
            try:
                response |= evaluate(message)
            except Exception as error:          # noqa: BLE001 - reported to the eval
                response |= failure(error)
        elif kind == "end":
            return
        stdout.write(json.dumps(response) + "\n")
        stdout.flush()
