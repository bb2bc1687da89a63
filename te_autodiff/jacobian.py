"""``te.jacobian``: the full Jacobian of a tensor with respect to a direct input."""
from __future__ import annotations

from .expr import Load, ScanState, add, const, reduce
from .gradient import check_optimize, combine, tensor_terms
from .lift import is_lifted_part, lifted
from .tensor import Tensor, compute


def jacobian(output: Tensor, input: Tensor, optimize: bool = True) -> Tensor:
    """``J[i..., j...] = ∂output[i...] / ∂input[j...]``, of shape
    ``output.shape + input.shape``.  ``input`` must be read by ``output``'s own
    formula (use :func:`te.gradient` for vector-Jacobian products through a
    graph of tensors)."""
    for what, t in (("output", output), ("input", input)):
        if not isinstance(t, Tensor):
            raise TypeError(f"te.jacobian: {what} must be a te tensor, got {type(t).__name__}")
    check_optimize(optimize, "te.jacobian")
    if isinstance(output.body, ScanState):
        raise NotImplementedError(f"te.jacobian: '{output.name}' is a scan; use te.gradient (a reverse scan)")
    if output.is_placeholder or input not in output.inputs:
        raise ValueError(f"te.jacobian: '{output.name}' does not read '{input.name}' directly; "
                         "the Jacobian is defined for a direct input (use te.gradient through a graph)")
    return _jacobian(output, input, optimize)


def _jacobian(output: Tensor, input: Tensor, optimize: bool) -> Tensor:
    """The Jacobian through the lifted form of ``output``: reductions nested in its
    formula became tensors of their own (``lift.py``), so the chain rule runs
    through them, ``J = ∂out/∂input + Σ_L ∂out/∂L · J_L``."""
    n = output.ndim
    inner = [t for t in lifted(output).inputs if is_lifted_part(t) and _reads(t, input)]
    inner_j = {t: _jacobian(t, input, optimize) for t in inner}

    def body(*ij):
        at, outer = tuple(ij[:n]), tuple(ij[n:])
        one = lambda i: const(1, output.dtype)  # noqa: E731
        total = combine(tensor_terms(output, input, outer, one, at=at), output.dtype, optimize)
        for t, jt in inner_j.items():
            # Σ_l ∂out[i]/∂t[l] · J_t[l, j]: each read t[idx] contributes value · J_t[idx, j]
            for term in tensor_terms(output, t, (), one, at=at):
                read = Load(jt, tuple(term.indices) + outer)
                total = add(total, reduce("sum", term.value * read, term.sum_axes, term.sum_doms))
        return total

    return compute(output.shape + input.shape, body, name=f"J_{output.name}_{input.name}")


def _reads(t: Tensor, x: Tensor) -> bool:
    """Whether ``t`` reads ``x``, directly or through lifted parts of itself."""
    return x in t.inputs or any(_reads(p, x) for p in t.inputs if is_lifted_part(p))
