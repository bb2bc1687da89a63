"""One adapter per peer: prepare a kernel, time its compile / first call, and
return a ``step()`` that runs forward + backward once and blocks until done.

``prepare(kernel, arrays)`` returns a :class:`Prepared`: ``compile_s`` (te:
``te.gradient`` + ``te.build``; the others: the first call, which is where
JAX and torch.compile trace and compile), ``step`` and ``result(value)`` that
turns what ``step`` returned into ``(loss, [grads])`` as float64 numpy arrays.
Imports happen inside the adapters, so a peer that is not installed only
fails its own subprocess (and is reported as "not installed").
"""
from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import numpy as np

PEERS = ("te", "numpy", "jax", "torch", "torch.compile")
LABELS = {"te": "te-autodiff", "numpy": "numpy", "jax": "JAX jit", "torch": "PyTorch", "torch.compile": "torch.compile"}
_MODULES = {"te": "te_autodiff", "numpy": "numpy", "jax": "jax", "torch": "torch", "torch.compile": "torch"}


def installed(peer: str) -> bool:
    return importlib.util.find_spec(_MODULES[peer]) is not None


@dataclass
class Prepared:
    compile_s: float
    step: Callable
    result: Callable
    first: object = None                  # the value of the first call (kept for the determinism check)
    details: dict = field(default_factory=dict)


def _f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


# ------------------------------------------------------------------ te-autodiff


def prepare_te(kernel, arrays, threads=None) -> Prepared:
    import te_autodiff as te

    if threads is not None:
        try:
            from lowering import runtime
            runtime.set_num_threads(threads)
        except (ImportError, AttributeError):
            pass
    # The libraries te's builds use are imported before the clock starts, as
    # the other peers' are: the figure is the derive and build work.  A
    # process's first build also imports OR-tools (with pandas) on its first
    # question to a solver; README.md, "Build time", measures that apart.
    import ortools.linear_solver.pywraplp  # noqa: F401
    import ortools.sat.python.cp_model  # noqa: F401
    t0 = time.perf_counter()
    inputs, outputs = kernel.te_program(te)
    t1 = time.perf_counter()
    f = te.build(inputs, outputs)
    t2 = time.perf_counter()
    step = lambda: f(*arrays)                                       # noqa: E731
    first = step()
    t3 = time.perf_counter()

    def result(v):
        return _f64(v[0])[0], [_f64(g) for g in v[1:]]

    return Prepared(t2 - t0, step, result, first,
                    dict(gradient_s=t1 - t0, build_s=t2 - t1, first_call_s=t3 - t2))


# ------------------------------------------------------------------ numpy


def prepare_numpy(kernel, arrays, threads=None) -> Prepared:
    t0 = time.perf_counter()
    step = lambda: kernel.numpy(*arrays)                            # noqa: E731
    first = step()
    return Prepared(time.perf_counter() - t0, step, lambda v: (_f64(v[0]), [_f64(g) for g in v[1]]), first)


# ------------------------------------------------------------------ JAX


def prepare_jax(kernel, arrays, threads=None) -> Prepared:
    import jax

    if kernel.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    m = SimpleNamespace(np=jnp, nn=jax.nn, lax=jax.lax)
    fn = jax.jit(jax.value_and_grad(kernel.jax(m), argnums=tuple(range(len(kernel.wrt)))))
    args = [jax.device_put(a) for a in arrays]
    for a, x in zip(arrays, args):
        assert x.dtype == a.dtype, f"JAX changed dtype {a.dtype} -> {x.dtype}"
    t0 = time.perf_counter()
    first = jax.block_until_ready(fn(*args))
    compile_s = time.perf_counter() - t0
    step = lambda: jax.block_until_ready(fn(*args))                 # noqa: E731
    return Prepared(compile_s, step, lambda v: (_f64(v[0]), [_f64(g) for g in v[1]]), first)


# ------------------------------------------------------------------ PyTorch


def _prepare_torch(kernel, arrays, threads, compiled) -> Prepared:
    import torch
    import torch.nn.functional as F

    if threads is not None:
        torch.set_num_threads(threads)
    m = SimpleNamespace(np=torch, nn=F)
    fn = kernel.torch(m)
    if compiled:
        fn = torch.compile(fn)
    tensors = [torch.from_numpy(a.astype(np.int64) if a.dtype.kind in "iu" else a.copy()) for a in arrays]
    wrt = tensors[:len(kernel.wrt)]
    for t in wrt:
        t.requires_grad_(True)

    def step():
        loss = fn(*tensors)
        return loss.detach(), torch.autograd.grad(loss, wrt)

    t0 = time.perf_counter()
    first = step()
    compile_s = time.perf_counter() - t0
    return Prepared(compile_s, step, lambda v: (_f64(v[0].numpy()), [_f64(g.numpy()) for g in v[1]]), first)


def prepare_torch(kernel, arrays, threads=None) -> Prepared:
    return _prepare_torch(kernel, arrays, threads, compiled=False)


def prepare_torch_compile(kernel, arrays, threads=None) -> Prepared:
    return _prepare_torch(kernel, arrays, threads, compiled=True)


PREPARE = {"te": prepare_te, "numpy": prepare_numpy, "jax": prepare_jax, "torch": prepare_torch,
           "torch.compile": prepare_torch_compile}
