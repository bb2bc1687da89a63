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
_TORCH = _Tensor = _STRIDED = _empty_like = None     # torch and what a call uses, once imported


def _torch():
    global _TORCH, _Tensor, _STRIDED, _empty_like
    if _TORCH is None:
        try:
            import torch
        except ImportError as e:                # pragma: no cover - the extra is missing
            raise ImportError("te_autodiff.torch needs PyTorch: pip install 'te-autodiff[torch]'") from e
        _TORCH, _Tensor, _STRIDED, _empty_like = torch, torch.Tensor, torch.strided, torch.empty_like
    return _TORCH


class _Call:
    """One te kernel called on torch tensors with no numpy in between: each
    input is checked (type, device, layout, dtype, shape; errors name the
    placeholder) and read in place when contiguous; the outputs are new
    torch tensors (aligned as the kernel's target wants) that the kernel
    writes (``Kernel.call_at``).  A call is little Python beyond the native
    call: one combined test per input, outputs allocated like a template
    tensor (``empty_like`` parses no arguments); a backward's (``backward``)
    tests less."""

    def __init__(self, kernel, placeholders):
        torch = _torch()
        self.kernel = kernel
        self.inputs = [(x.name, getattr(torch, x.dtype), torch.Size(x.shape)) for x in placeholders]
        self.templates = [torch.empty(shape, dtype=getattr(torch, dtype.name)) for shape, dtype in kernel.output_layout]
        self.template = self.templates[0] if len(self.templates) == 1 else None
        sources = kernel.result_sources
        # the usual case: the results are the outputs, in order, none returned twice
        self.direct = sources == [(False, k, True) for k in range(len(self.templates))]
        self.sources = sources
        self.align = kernel.target.alignment

    def __call__(self, tensors) -> tuple:
        """``(contiguous inputs, results)`` for ``tensors`` in placeholder order."""
        ins, addresses = [], []
        for t, (name, dtype, shape) in zip(tensors, self.inputs):
            if not (isinstance(t, _Tensor) and t.dtype is dtype and t.layout is _STRIDED
                    and not t.is_nested and t.shape == shape and t.is_cpu):   # (a nested tensor has no shape)
                self.refuse(name, t, dtype, shape)
            if not t.is_contiguous():
                t = t.contiguous()
            ins.append(t)
            addresses.append(t.data_ptr())
        return ins, self.run(ins, addresses)

    def backward(self, xs, heads) -> list:
        """The results for an autograd backward: ``xs`` the inputs its forward
        checked, made contiguous and saved (a saved-tensor hook may unpack
        them in another layout), ``heads`` the gradients autograd hands it,
        which it has checked against the outputs' shapes, dtypes and device
        (it lets a sparse one through, and an expanded one is common)."""
        ins, addresses = [], []
        for t in xs:
            if not t.is_contiguous():
                t = t.contiguous()
            ins.append(t)
            addresses.append(t.data_ptr())
        for t in heads:
            if t.layout is not _STRIDED:
                t = t.to_dense()
            if not t.is_contiguous():
                t = t.contiguous()
            ins.append(t)
            addresses.append(t.data_ptr())
        return self.run(ins, addresses)

    def run(self, ins, addresses) -> list:
        """The results of the kernel on the contiguous ``ins`` at ``addresses``."""
        if self.template is not None:           # one output (the usual case)
            t = _empty_like(self.template)
            address = t.data_ptr()
            if address % self.align:
                t = self.aligned(t)
                address = t.data_ptr()
            outs = [t]
            addresses.append(address)
        else:
            outs = []
            for template in self.templates:
                t = _empty_like(template)
                address = t.data_ptr()
                if address % self.align:
                    t = self.aligned(t)
                    address = t.data_ptr()
                outs.append(t)
                addresses.append(address)
        self.kernel.call_at(addresses)
        if self.direct:
            return outs
        return [(ins if from_input else outs)[k] if fresh else (ins if from_input else outs)[k].clone()
                for from_input, k, fresh in self.sources]

    @staticmethod
    def refuse(name, t, dtype, shape):
        """The error for an input ``t`` that is not a dense CPU tensor of the placeholder's dtype and shape."""
        torch = _TORCH
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"te op: input '{name}' must be a torch tensor, got {type(t).__name__}")
        if t.dtype != dtype or t.layout != torch.strided or t.is_nested:
            raise TypeError(f"te op: input '{name}' must be a dense tensor of dtype {str(dtype)[6:]}, "
                            f"got {t.dtype} ({t.layout})")
        if t.shape != shape:
            raise ValueError(f"te op: input '{name}' has shape {tuple(shape)}, got a tensor of shape "
                             f"{tuple(t.shape)}")
        raise ValueError(f"te op: input '{name}' is on {t.device}; te kernels run on the CPU")

    def aligned(self, template):
        """A new tensor like ``template`` whose data starts on the kernel's
        alignment (torch's allocator aligns to 64 bytes; another allocator
        gets a padded block)."""
        torch = _TORCH
        nbytes = template.numel() * template.element_size()
        raw = torch.empty(nbytes + self.align, dtype=torch.uint8)
        offset = -raw.data_ptr() % self.align
        return raw[offset:offset + nbytes].view(template.dtype).view(template.shape)


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
        return backward_call()([*xs, *heads])[1]

    def autograd_backward(xs, heads):
        """The gradients for autograd: ``xs`` its saved inputs (see ``_Call.backward``)."""
        return backward_call().backward(xs, heads)

    @torch.library.custom_op(qual, mutates_args=())
    def forward(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return run_forward(xs)[1]

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

    zero_heads = [(k, v.outputs[k].shape, dtypes[np.dtype(v.outputs[k].dtype)]) for k in v.float_outputs]
    every_input_float = len(v.float_inputs) == len(v.inputs)
    one_float_output = [k for k, *_ in zero_heads] == [0] and len(v.outputs) == 1

    def vjp(xs, grads, run):
        """The gradient of each input (None for an integer input) given the
        gradient of each output (None: nothing depends on that output)."""
        if one_float_output and grads[0] is not None:
            heads = grads
        else:
            heads = [torch.zeros(shape, dtype=dtype) if grads[k] is None else grads[k]
                     for k, shape, dtype in zero_heads]
        if not heads or not v.float_inputs:
            return [None] * len(xs)
        found = run(xs, heads)
        if every_input_float:
            return found
        out = [None] * len(xs)
        for k, g in zip(v.float_inputs, found):
            out[k] = g
        return out

    forward.register_autograd(lambda ctx, grads: (vjp(list(ctx.saved_tensors), grads, backward),),
                              setup_context=setup_context)

    class Eager(torch.autograd.Function):
        """The same op outside torch.compile, without the dispatcher's per-call cost."""

        @staticmethod
        def forward(ctx, *xs):
            ins, out = run_forward(xs)
            ctx.save_for_backward(*ins)     # checked and contiguous: the backward trusts them
            if frozen:
                ctx.mark_non_differentiable(*(out[k] for k in frozen))
            return out[0] if v.single else tuple(out)

        @staticmethod
        def backward(ctx, *grads):
            if one_float_output and every_input_float and grads[0] is not None:     # the usual case
                return tuple(backward_call().backward(ctx.saved_tensors, grads))
            return tuple(vjp(ctx.saved_tensors, grads, autograd_backward))

    arity, compiling, apply = len(v.inputs), torch.compiler.is_compiling, Eager.apply

    def call(*tensors):
        if len(tensors) != arity:
            raise TypeError(f"te op '{v.name}' takes {len(v.inputs)} tensors "
                            f"({', '.join(x.name for x in v.inputs)}), got {len(tensors)}")
        if compiling():
            res = forward(list(tensors))
            return res[0] if v.single else tuple(res)
        return apply(*tensors)
    call.kernel, call.vjp_kernels = v.forward, v
    return call
