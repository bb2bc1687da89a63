"""The tensor graph: which tensors a set of outputs depends on, in order."""
from __future__ import annotations

from .visit import topo_order


def tensors_in_order(roots, inputs_of=lambda t: t.inputs) -> list:
    """Every tensor reachable from ``roots`` through ``inputs_of`` (the tensors a
    compute body reads), producers before consumers, each once."""
    return topo_order(roots, inputs_of)


def consumers(roots) -> dict:
    """For every tensor reachable from ``roots``: the compute tensors that read it."""
    users = {}
    for t in tensors_in_order(roots):
        users.setdefault(t, [])
        for p in t.inputs:
            users.setdefault(p, []).append(t)
    return users
