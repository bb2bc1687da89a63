"""te kernels as differentiable PyTorch ops (needs ``torch``: the ``[torch]`` extra).

``op(inputs, outputs)`` returns a callable taking torch CPU tensors in
placeholder order.  Under ``torch.compile`` it is a ``torch.library`` custom
op with a fake implementation (traced without a graph break) and an autograd
formula whose backward is the te VJP kernel (``vjp.py``), itself a custom op;
in eager mode the same kernels run through a plain ``autograd.Function``,
which skips the dispatcher's per-call cost.  Contiguous CPU tensors of the right dtype reach the kernel as
numpy views of their memory, and the kernel's new arrays come back as tensors
sharing theirs: no copies either way.
"""

import itertools

import numpy as np

from .vjp import VJP

_COUNT = itertools.count()


def _torch():
    try:
        import torch
    except ImportError as e:                # pragma: no cover - the extra is missing
        raise ImportError("te_autodiff.torch needs PyTorch: pip install 'te-autodiff[torch]'") from e
    return torch


def _arrays(tensors, placeholders) -> list:
    """numpy views of ``tensors`` (copies only of non-contiguous ones); the
    kernel checks shapes and dtypes and names the placeholder."""
    torch = _torch()
    out = []
    for t, x in zip(tensors, placeholders):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"te op: input '{x.name}' must be a torch tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise ValueError(f"te op: input '{x.name}' is on {t.device}; te kernels run on the CPU")
        out.append(t.detach().contiguous().numpy())
    return out


def op(inputs, outputs, name=None):
    """``outputs`` (te tensors over the placeholders ``inputs``) as a PyTorch op,
    differentiable with respect to every float input."""
    torch = _torch()
    v = VJP(inputs, outputs, name, "te_autodiff.torch.op")
    qual = f"te_autodiff::{v.name.replace('.', '_')}_{next(_COUNT)}"
    dtypes = {np.dtype(y.dtype): getattr(torch, y.dtype) for y in v.outputs + v.inputs}

    @torch.library.custom_op(qual, mutates_args=())
    def forward(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        res = v.forward(*_arrays(xs, v.inputs))
        return [torch.from_numpy(a) for a in ((res,) if len(v.outputs) == 1 else res)]

    @forward.register_fake
    def _(xs):
        return [xs[0].new_empty(y.shape, dtype=dtypes[np.dtype(y.dtype)]) for y in v.outputs]

    def run_backward(xs, heads):
        res = v.backward(*_arrays(xs, v.inputs), *_arrays(heads, [v.outputs[k] for k in v.float_outputs]))
        return [torch.from_numpy(a) for a in ((res,) if len(v.float_inputs) == 1 else res)]

    @torch.library.custom_op(qual + "_vjp", mutates_args=())
    def backward(xs: list[torch.Tensor], heads: list[torch.Tensor]) -> list[torch.Tensor]:
        return run_backward(xs, heads)

    @backward.register_fake
    def _(xs, heads):
        return [torch.empty_like(xs[k]) for k in v.float_inputs]

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[0])

    def vjp(ctx, grads, run=backward):
        xs = list(ctx.saved_tensors)
        heads = [g if g is not None else torch.zeros(v.outputs[k].shape, dtype=dtypes[np.dtype(v.outputs[k].dtype)])
                 for k, g in ((k, grads[k]) for k in v.float_outputs)]
        out = [None] * len(xs)
        if v.float_inputs and v.float_outputs:
            for k, g in zip(v.float_inputs, run(xs, heads)):
                out[k] = g
        return out,

    forward.register_autograd(vjp, setup_context=setup_context)

    class Eager(torch.autograd.Function):
        """The same op outside torch.compile, without the dispatcher's per-call cost."""

        @staticmethod
        def forward(ctx, *xs):
            ctx.save_for_backward(*xs)
            res = v.forward(*_arrays(xs, v.inputs))
            out = [torch.from_numpy(a) for a in ((res,) if len(v.outputs) == 1 else res)]
            ctx.mark_non_differentiable(*(out[k] for k in range(len(out)) if k not in v.float_outputs))
            return tuple(out)

        @staticmethod
        def backward(ctx, *grads):
            return tuple(vjp(ctx, grads, run_backward)[0])

    def call(*tensors):
        if len(tensors) != len(v.inputs):
            raise TypeError(f"te op '{v.name}' takes {len(v.inputs)} tensors "
                            f"({', '.join(x.name for x in v.inputs)}), got {len(tensors)}")
        res = forward(list(tensors)) if torch.compiler.is_compiling() else Eager.apply(*tensors)
        return res[0] if v.single else tuple(res)
    call.kernel, call.vjp_kernels = v.forward, v
    return call
