"""The two kernels an autograd engine needs from a te program: the forward
and its vector-Jacobian product.  ``torch.py`` and ``jax.py`` wrap them as
framework ops.

For placeholders ``inputs`` and tensors ``outputs``, the backward kernel
takes the inputs and one head per float output and returns, for every float
input ``x``, ``Σ_k gradient(outputs[k], x, head=H_k)``: the VJP of all the
outputs at once.  It is built on first use and kept.
"""
from __future__ import annotations

import threading

from . import dtype as dt
from .gradient import gradient
from .tensor import Tensor, compute, placeholder


def _tensors(items, what: str) -> list:
    items = list(items) if isinstance(items, (list, tuple)) else [items]
    for x in items:
        if not isinstance(x, Tensor):
            raise TypeError(f"{what} must be te tensors, got {x!r} of type {type(x).__name__}")
    return items


class VJP:
    """A te program as forward and backward kernels (see the module doc)."""

    def __init__(self, inputs, outputs, name=None, who: str = "te op"):
        from . import build
        self.inputs = _tensors(inputs, f"{who}: inputs")
        self.outputs = _tensors(outputs, f"{who}: outputs")
        if not self.outputs:
            raise ValueError(f"{who}: no outputs given")
        self.single = not isinstance(outputs, (list, tuple))
        self.name = name or self.outputs[0].name
        self.forward = build(self.inputs, self.outputs, name=self.name)
        self.float_inputs = [k for k, x in enumerate(self.inputs) if dt.is_float(x.dtype)]
        self.float_outputs = [k for k, y in enumerate(self.outputs) if dt.is_float(y.dtype)]
        self._backward = None
        self._lock = threading.Lock()

    @property
    def backward(self):
        """The kernel ``(*inputs, *heads) -> grads of the float inputs``."""
        if self._backward is not None:
            return self._backward
        with self._lock:
            if self._backward is None:
                from . import build
                heads = [placeholder(self.outputs[k].shape, self.outputs[k].dtype, f"d{self.outputs[k].name}")
                         for k in self.float_outputs]
                wrt = [self.inputs[k] for k in self.float_inputs]
                parts = [gradient(self.outputs[k], wrt, head=h) for k, h in zip(self.float_outputs, heads)]
                grads = [parts[0][n] if len(parts) == 1 else
                         compute(x.shape, lambda *i, n=n: _total([p[n][i] for p in parts]), name=f"d{x.name}")
                         for n, x in enumerate(wrt)]
                self._backward = build(self.inputs + heads, grads, name=f"{self.name}_vjp")
            return self._backward


def _total(terms):
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out
