"""``te.jacobian``: the full Jacobian of a tensor with respect to a direct input."""
from __future__ import annotations

from .expr import const
from .gradient import combine, tensor_terms
from .lift import lifted
from .tensor import Tensor, compute


def jacobian(output: Tensor, input: Tensor, optimize: bool = True) -> Tensor:
    """``J[i..., j...] = ∂output[i...] / ∂input[j...]``, of shape
    ``output.shape + input.shape``; ``input`` must be read directly by ``output``'s
    formula (use :func:`te.gradient` for vector-Jacobian products through a graph)."""
    for what, t in (("output", output), ("input", input)):
        if not isinstance(t, Tensor):
            raise TypeError(f"te.jacobian: {what} must be a te tensor, got {type(t).__name__}")
    if output.is_placeholder or input not in lifted(output).inputs and input not in output.inputs:
        raise ValueError(f"te.jacobian: '{output.name}' does not read '{input.name}' directly; "
                         "the Jacobian is defined for a direct input (use te.gradient through a graph)")
    n = output.ndim

    def body(*ij):
        at, outer = ij[:n], ij[n:]
        terms = tensor_terms(output, input, tuple(outer), lambda i: const(1, output.dtype), at=at)
        return combine(terms, output.dtype, optimize)

    return compute(output.shape + input.shape, body, name=f"J_{output.name}_{input.name}")
