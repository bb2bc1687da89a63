"""``python -m benchmarks.overhead``: what a te op costs per call beyond its kernels.

A tiny op (``Y = X·X`` over 8 float32 numbers) is called forward and
backward, so the arithmetic is nothing and every microsecond is glue:

* in PyTorch eager, ``te_autodiff.torch.op`` against a plain
  ``torch.autograd.Function`` whose forward and backward call numpy (the
  cheapest hand-written way to put foreign code into torch), and against
  torch's own ``x * x``;
* under ``jax.jit``, ``te_autodiff.jax.op`` against a ``jax.custom_vjp`` whose
  forward and backward call the same numpy through ``jax.pure_callback``;
* the two te kernels called directly from numpy (the floor).

Each step is ``y = f(x)`` then the gradient for a fixed head.  The variants
run interleaved in rounds (a slow spell of a shared machine hits them all),
each round in a rotated order; each keeps the median of its rounds.  The table gives microseconds per
forward + backward and the te op's cost over the plain function: the
per-call cost of being a te op rather than hand-written numpy.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import te_autodiff as te

N = 8


def _program():
    X = te.placeholder((N,), name="X")
    return X, te.compute((N,), lambda i: X[i] * X[i], name="Y")


def _kernels():
    """The te kernels alone: forward, then the VJP kernel, from numpy."""
    from te_autodiff.vjp import VJP
    v = VJP(*_program())
    fwd, bwd = v.forward, v.backward
    x, h = np.linspace(-1, 1, N, dtype=np.float32), np.ones(N, np.float32)
    return {"te kernels alone (numpy)": lambda: (fwd(x), bwd(x, h))}


def _torch_steps():
    import torch

    import te_autodiff.torch as tet
    torch.set_num_threads(1)

    class Plain(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.from_numpy(np.square(x.detach().numpy()))

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return torch.from_numpy(2 * x.detach().numpy() * g.numpy())

    x = torch.linspace(-1, 1, N, requires_grad=True)
    h = torch.ones(N)
    op = tet.op(*_program())

    def step(f):
        return lambda: torch.autograd.grad(f(x), (x,), grad_outputs=(h,))
    return {"torch: te_autodiff.torch.op": step(op),
            "torch: autograd.Function + numpy": step(Plain.apply),
            "torch: x * x (torch's own)": step(lambda x: x * x)}


def _jax_steps():
    import jax
    import jax.numpy as jnp

    import te_autodiff.jax as tej
    shape = jax.ShapeDtypeStruct((N,), np.float32)

    @jax.custom_vjp
    def plain(x):
        return jax.pure_callback(lambda a: np.square(np.asarray(a)), shape, x)

    plain.defvjp(lambda x: (plain(x), x),
                 lambda x, g: (jax.pure_callback(lambda a, b: 2 * np.asarray(a) * np.asarray(b), shape, x, g),))
    op = tej.op(*_program())
    x, h = jnp.linspace(-1, 1, N, dtype=jnp.float32), jnp.ones(N, jnp.float32)

    def step(f):
        g = jax.jit(lambda x: jax.vjp(f, x)[1](h))
        return lambda: jax.block_until_ready(g(x))
    return {"jax.jit: te_autodiff.jax.op": step(op),
            "jax.jit: custom_vjp + pure_callback + numpy": step(plain),
            "jax.jit: x * x (jax's own)": step(lambda x: x * x)}


def measure(steps: dict, rounds: int, calls: int) -> dict:
    """Median over ``rounds`` of the mean microseconds per call, the variants interleaved."""
    for f in steps.values():
        for _ in range(50):
            f()
    times = {name: [] for name in steps}
    names = list(steps)
    for r in range(rounds):
        # each round in another order: no variant always runs after the same one
        for name in names[r % len(names):] + names[:r % len(names)]:
            f = steps[name]
            start = time.perf_counter()
            for _ in range(calls):
                f()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(ts) for name, ts in times.items()}


def report(us: dict) -> str:
    lines = ["| forward + backward of Y = X·X, 8 float32 | µs per call |", "|---|---:|"]
    lines += [f"| {name} | {t:.1f} |" for name, t in us.items()]
    for fw, te_name, plain_name in (("torch", "torch: te_autodiff.torch.op", "torch: autograd.Function + numpy"),
                                    ("jax", "jax.jit: te_autodiff.jax.op",
                                     "jax.jit: custom_vjp + pure_callback + numpy")):
        if te_name in us:
            lines.append(f"\n{fw}: te op − plain function = {us[te_name] - us[plain_name]:+.1f} µs per call; "
                         f"te op − te kernels alone = {us[te_name] - us['te kernels alone (numpy)']:+.1f} µs")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=400)
    args = ap.parse_args(argv)
    steps = _kernels()
    for make in (_torch_steps, _jax_steps):
        try:
            steps.update(make())
        except ImportError as e:
            print(f"({make.__name__[1:-6]} not installed: {e})")
    print(f"target: {te.target()}")
    print(report(measure(steps, args.rounds, args.calls)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
