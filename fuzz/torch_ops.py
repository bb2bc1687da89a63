"""te's constructs in PyTorch, for the torch side of a fuzzed program.

A program runs with torch's default dtype float64 (``float64_default``;
the child processes set it for good, ``runner.child_main``), so Python float
constants in ``torch.where`` and friends are float64 as they are in te next
to a float64 expression; importing this module changes nothing.  The rules
that pin te's semantics down where PyTorch's differ:

* ``te.maximum(a, b)`` takes ``a`` on ties and so does its derivative
  (``torch.maximum`` splits a tie's gradient in halves): ``maximum`` is
  ``torch.where(a >= b, a, b)``; ``minimum`` likewise with ``<=``.
* ``te.max``/``te.min`` reductions pass the adjoint to the first position
  (row-major over the reduce axes) that reaches the extremum (``amax``
  spreads it over ties): ``red`` gathers at ``argmax``/``argmin``, which
  return the first one.
* A reduction over an empty range is its identity (sum 0, prod 1).
"""
import contextlib
import math

import torch

INT_DTYPES = {"int32": torch.int32, "int64": torch.int64}


@contextlib.contextmanager
def float64_default():
    """torch's default dtype float64 inside the block (restored after it)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def ax(lo: int, n: int, slot: int, rank: int) -> torch.Tensor:
    """The values ``lo .. lo + n - 1`` of an index variable along dimension ``slot`` of a rank-``rank`` grid."""
    shape = [1] * rank
    shape[slot] = n
    return torch.arange(lo, lo + n).view(shape)


def f64(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64)


def cread(x: torch.Tensor, *ix) -> torch.Tensor:
    """``x[ix]`` with out-of-range indices clamped: where te never evaluates
    the read (a guard fails), torch reads somewhere harmless and discards it."""
    return x[tuple(torch.as_tensor(i).clamp(0, max(n - 1, 0)) for i, n in zip(ix, x.shape))]


def maximum(a, b):
    return torch.where(torch.as_tensor(a >= b), a, b)


def minimum(a, b):
    return torch.where(torch.as_tensor(a <= b), a, b)


def fdiv(a, b):
    """Floor division of floats (no derivative, as in te)."""
    return torch.div(a, b, rounding_mode="floor")


def red(op: str, body, lead: tuple, extents: tuple) -> torch.Tensor:
    """``op`` over the trailing ``extents`` dimensions of ``body`` (broadcast to ``lead + extents``)."""
    body = torch.as_tensor(body, dtype=torch.float64)
    size = math.prod(extents)
    if size == 0:
        return torch.full(lead, {"sum": 0.0, "prod": 1.0}[op], dtype=torch.float64)
    flat = body.expand(tuple(lead) + tuple(extents)).reshape(tuple(lead) + (size,))
    if op == "sum":
        return flat.sum(-1)
    if op == "prod":
        return flat.prod(-1)
    first = flat.argmax(-1, keepdim=True) if op == "max" else flat.argmin(-1, keepdim=True)
    return flat.gather(-1, first).squeeze(-1)


def fill(body, shape: tuple, dtype: str = "float64") -> torch.Tensor:
    """A compute tensor: its body broadcast to ``shape``."""
    return torch.as_tensor(body, dtype=INT_DTYPES.get(dtype, torch.float64)).expand(shape)


def grad(y: torch.Tensor, xs: list, head=None, create_graph: bool = False) -> list:
    """The vector-Jacobian product ``head · dy/dx`` for each of ``xs`` (zeros
    where ``y`` does not depend on ``x``), as ``te.gradient(y, xs, head)``;
    ``head=None`` means ones."""
    if not y.requires_grad:
        return [torch.zeros_like(x) for x in xs]
    head = torch.ones_like(y) if head is None else head.expand(y.shape)
    return list(torch.autograd.grad(y, xs, grad_outputs=head, create_graph=create_graph,
                                    allow_unused=True, materialize_grads=True))
