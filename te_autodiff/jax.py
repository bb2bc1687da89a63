"""te kernels as differentiable JAX functions (needs ``jax``: the ``[jax]`` extra).

``op(inputs, outputs)`` returns a function of JAX arrays in placeholder
order, a ``jax.custom_vjp`` whose forward and backward call the te kernels
(``vjp.py``) through ``jax.pure_callback``: it works under ``jax.jit``,
``jax.grad`` and ``jax.vjp``.  Integer inputs get float0 cotangents, as JAX
requires.  float64 programs need ``jax_enable_x64``.
"""
from __future__ import annotations

import numpy as np

from .vjp import VJP


def _jax():
    try:
        import jax
    except ImportError as e:                # pragma: no cover - the extra is missing
        raise ImportError("te_autodiff.jax needs JAX: pip install 'te-autodiff[jax]'") from e
    return jax


def _tuple(res, n: int) -> tuple:
    return (res,) if n == 1 else tuple(res)


def op(inputs, outputs, name=None):
    """``outputs`` (te tensors over the placeholders ``inputs``) as a JAX
    function, differentiable with respect to every float input."""
    jax = _jax()
    v = VJP(inputs, outputs, name, "te_autodiff.jax.op")
    out_shapes = [jax.ShapeDtypeStruct(y.shape, np.dtype(y.dtype)) for y in v.outputs]
    grad_shapes = [jax.ShapeDtypeStruct(v.inputs[k].shape, np.dtype(v.inputs[k].dtype)) for k in v.float_inputs]
    wide = next((y for y in v.inputs + v.outputs if np.dtype(y.dtype).itemsize == 8), None)   # needs x64

    def run_forward(*xs):
        return _tuple(v.forward(*(np.asarray(x) for x in xs)), len(v.outputs))

    def run_backward(*args):
        return _tuple(v.backward(*(np.asarray(a) for a in args)), len(v.float_inputs))

    @jax.custom_vjp
    def f(*xs):
        return tuple(jax.pure_callback(run_forward, out_shapes, *xs))

    def f_fwd(*xs):
        return f(*xs), xs

    def f_bwd(xs, gs):
        heads = [gs[k] for k in v.float_outputs]
        grads = iter(jax.pure_callback(run_backward, grad_shapes, *xs, *heads)
                     if v.float_inputs and v.float_outputs else
                     [jax.numpy.zeros(s.shape, s.dtype) for s in grad_shapes])
        return tuple(next(grads) if k in v.float_inputs else np.zeros(x.shape, jax.dtypes.float0)
                     for k, x in enumerate(v.inputs))

    f.defvjp(f_fwd, f_bwd)

    def call(*arrays):
        if len(arrays) != len(v.inputs):
            raise TypeError(f"te op '{v.name}' takes {len(v.inputs)} arrays "
                            f"({', '.join(x.name for x in v.inputs)}), got {len(arrays)}")
        if wide is not None and not jax.config.jax_enable_x64:
            raise TypeError(f"te op '{v.name}': '{wide.name}' is {wide.dtype}, which JAX supports only "
                            "with jax_enable_x64")
        for a, x in zip(arrays, v.inputs):
            if not isinstance(a, (jax.Array, np.ndarray)):
                raise TypeError(f"te op '{v.name}': input '{x.name}' must be a JAX or numpy array, "
                                f"got {type(a).__name__}")
            if tuple(a.shape) != x.shape:
                raise ValueError(f"te op '{v.name}': input '{x.name}' has shape {tuple(a.shape)}, "
                                 f"expected {x.shape}")
            if np.dtype(a.dtype) != np.dtype(x.dtype):
                raise TypeError(f"te op '{v.name}': input '{x.name}' has dtype {a.dtype}, expected {x.dtype}")
        res = f(*arrays)
        return res[0] if v.single else res
    call.kernel, call.vjp_kernels = v.forward, v
    return call
