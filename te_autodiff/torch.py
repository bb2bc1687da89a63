"""te kernels as differentiable PyTorch ops (needs ``torch``: the ``[torch]`` extra).

``op(inputs, outputs)`` returns a callable taking torch CPU tensors in
placeholder order.  Under ``torch.compile`` it is a ``torch.library`` custom
op with a fake implementation (traced without a graph break) and an autograd
formula whose backward is the te VJP kernel (``vjp.py``), itself a custom op;
in eager mode the same kernels run through a plain ``autograd.Function``,
which skips the dispatcher's per-call cost.  The kernels read contiguous
CPU tensors in place and write new torch tensors (``_Call``): no copies and
no numpy arrays in between.
"""

import functools
import itertools
import re

import numpy as np

from .vjp import VJP

_COUNT = itertools.count()
_TORCH = None


def _torch():
    global _TORCH
    if _TORCH is None:
        try:
            import torch
        except ImportError as e:                # pragma: no cover - the extra is missing
            raise ImportError("te_autodiff.torch needs PyTorch: pip install 'te-autodiff[torch]'") from e
        _TORCH = torch
    return _TORCH


class _Call:
    """One te kernel called on torch tensors with no numpy in between: each
    input is checked (type, device, layout, dtype, shape; errors name the
    placeholder) and read in place when contiguous; the outputs are new
    torch tensors (aligned as the kernel's target wants) that the kernel
    writes (``Kernel.call_at``)."""

    def __init__(self, kernel, placeholders):
        torch = _torch()
        self.kernel = kernel
        self.inputs = [(x.name, str(x.dtype), getattr(torch, x.dtype), torch.Size(x.shape)) for x in placeholders]
        self.outputs = [(tuple(shape), getattr(torch, dtype.name))     # a tuple: torch.empty parses it faster
                        for shape, dtype in kernel.output_layout]
        self.sources = kernel.result_sources
        self.align = kernel.target.alignment

    def __call__(self, tensors) -> list:
        torch = _TORCH
        ins = []
        for t, (name, dtype_name, dtype, shape) in zip(tensors, self.inputs):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"te op: input '{name}' must be a torch tensor, got {type(t).__name__}")
            if t.dtype != dtype or t.layout != torch.strided or t.is_nested:
                raise TypeError(f"te op: input '{name}' must be a dense tensor of dtype {dtype_name}, "
                                f"got {t.dtype} ({t.layout})")
            if t.shape != shape:
                raise ValueError(f"te op: input '{name}' has shape {tuple(shape)}, got a tensor of shape "
                                 f"{tuple(t.shape)}")
            if not t.is_cpu:
                raise ValueError(f"te op: input '{name}' is on {t.device}; te kernels run on the CPU")
            ins.append(t if t.is_contiguous() else t.contiguous())
        outs = [self.empty(shape, dtype) for shape, dtype in self.outputs]
        self.kernel.call_at([t.data_ptr() for t in ins] + [t.data_ptr() for t in outs])
        return [(ins if from_input else outs)[k] if fresh else (ins if from_input else outs)[k].clone()
                for from_input, k, fresh in self.sources]

    def empty(self, shape, dtype):
        """A new tensor whose data starts on the kernel's alignment (torch's
        allocator aligns to 64 bytes; another allocator gets a padded block)."""
        torch = _TORCH
        t = torch.empty(shape, dtype=dtype)
        if t.data_ptr() % self.align == 0:
            return t
        nbytes = t.numel() * t.element_size()
        raw = torch.empty(nbytes + self.align, dtype=torch.uint8)
        offset = -raw.data_ptr() % self.align
        return raw[offset:offset + nbytes].view(dtype).view(shape)


def op(inputs, outputs, name=None):
    """``outputs`` (te tensors over the placeholders ``inputs``) as a PyTorch op,
    differentiable with respect to every float input."""
    torch = _torch()
    v = VJP(inputs, outputs, name, "te_autodiff.torch.op")
    qual = f"te_autodiff::op{next(_COUNT)}_{re.sub('[^0-9A-Za-z_]', '_', v.name)}"   # an identifier
    dtypes = {np.dtype(y.dtype): getattr(torch, y.dtype) for y in v.outputs + v.inputs}
    frozen = [k for k in range(len(v.outputs)) if k not in v.float_outputs]
    run_forward = _Call(v.forward, v.forward.inputs)

    @functools.cache
    def backward_call():                    # the VJP kernel is built on the first backward
        return _Call(v.backward, v.backward.inputs)

    def run_backward(xs, heads):
        return backward_call()(list(xs) + list(heads))

    @torch.library.custom_op(qual, mutates_args=())
    def forward(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return run_forward(xs)

    @forward.register_fake
    def _(xs):
        return [xs[0].new_empty(y.shape, dtype=dtypes[np.dtype(y.dtype)]) for y in v.outputs]

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
            out = run_forward(xs)
            if frozen:
                ctx.mark_non_differentiable(*(out[k] for k in frozen))
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
