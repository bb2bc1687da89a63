"""The tensor graph: which tensors a set of outputs depends on, in order."""
from __future__ import annotations


def tensors_in_order(roots, inputs_of=lambda t: t.inputs) -> list:
    """Every tensor reachable from ``roots`` through ``inputs_of`` (the tensors a
    compute body reads), producers before consumers, each once (iterative:
    deep pipelines are fine)."""
    out, seen = [], set()
    stack = [(t, False) for t in reversed(list(roots))]
    while stack:
        t, expanded = stack.pop()
        if expanded:
            out.append(t)
            continue
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.append((t, True))
        for p in reversed(inputs_of(t)):
            if id(p) not in seen:
                stack.append((p, False))
    return out


def consumers(roots) -> dict:
    """For every tensor reachable from ``roots``: the compute tensors that read it."""
    users = {}
    for t in tensors_in_order(roots):
        users.setdefault(t, [])
        for p in t.inputs:
            users.setdefault(p, []).append(t)
    return users
