"""Loop-invariant stages leave a scan's time loop.

The schedule packs the panels of a GEMM-like stage into a temporary with a
copy stage (``packing.py``).  Inside a scan's time loop (``Stage.step``) the
copy of a weight would run at every step, for the same result.  A stage of
the loop that reads neither the time nor any buffer another stage of the
loop writes (and is the only writer of its own buffer, which it does not
read) computes the same values at every step: it runs once, before the loop.
"""
from __future__ import annotations

from dataclasses import replace

from ..loop_ir import Store, free_leaves, stage_buffers, stmt_exprs, walk


def _writes(stage) -> set:
    return {s.buffer for s in walk(stage.body) if isinstance(s, Store)}


def _invariant(stage, loop: list) -> bool:
    others = set().union(*(_writes(s) for s in loop if s is not stage))
    reads = stage_buffers(replace(stage, step=None))[1]
    uses_time = any(stage.step.var in free_leaves(e) for s in walk(stage.body) for e in stmt_exprs(s))
    return not uses_time and not reads & (others | _writes(stage)) and not _writes(stage) & others


def hoist_invariants(stages: list) -> list:
    """``stages`` with the invariant stages of each time loop moved before it."""
    out, k = [], 0
    while k < len(stages):
        step = stages[k].step
        if step is None:
            out.append(stages[k])
            k += 1
            continue
        end = k
        while end < len(stages) and stages[end].step is step:
            end += 1
        loop = stages[k:end]
        moved = [s for s in loop if _invariant(s, loop)]
        out += [replace(s, step=None) for s in moved] + [s for s in loop if s not in moved]
        k = end
    return out
