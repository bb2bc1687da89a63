"""``python -m benchmarks.overhead``: what a te kernel and a te op cost per call beyond their arithmetic.

A tiny program (``Y = X·X`` over 16 float32 numbers) makes the arithmetic
nothing, so every microsecond is the call:

* from numpy: the te kernel called warm, against numpy's own ``np.multiply``;
* in PyTorch eager, forward + backward: ``te_autodiff.torch.op`` against
  torch's own ``x * x`` (the plain torch computation) and a plain
  ``torch.autograd.Function`` whose forward and backward call numpy (the
  cheapest hand-written way to put foreign code into torch);
* under ``jax.jit``, forward + backward: ``te_autodiff.jax.op`` against
  jax's own ``x * x`` and a ``jax.custom_vjp`` calling the same numpy
  through ``jax.pure_callback`` (what the te op is built on).

A forward + backward step is ``y, pull = vjp(f, x)`` then ``pull(head)``, and
returns both (JAX would drop an unused forward).  A framework's variants run
interleaved in rounds (a slow spell of a shared machine hits them all), each
round in a rotated order; each variant keeps the median of its rounds' mean
time per call, wall clock and the process's CPU time (on a busy machine the
wall clock also counts the time the process waits for a core).  The lines
under the table give each te variant's cost over its plain framework
equivalent.  ``measure_all`` returns the figures for the benchmark report.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import te_autodiff as te

N = 16
# (label, te variant, its plain framework equivalent, the other plain variant)
COMPARISONS = [
    ("numpy", "numpy: te kernel", "numpy: np.multiply", None),
    ("torch", "torch: te_autodiff.torch.op", "torch: x * x (torch's own)", "torch: autograd.Function + numpy"),
    ("jax", "jax.jit: te_autodiff.jax.op", "jax.jit: x * x (jax's own)", "jax.jit: custom_vjp + pure_callback + numpy"),
]


def _program():
    X = te.placeholder((N,), name="X")
    return X, te.compute((N,), lambda i: X[i] * X[i], name="Y")


def _numpy_steps():
    kernel = te.build(*_program())
    x = np.linspace(-1, 1, N, dtype=np.float32)
    return {"numpy: te kernel": lambda: kernel(x), "numpy: np.multiply": lambda: np.multiply(x, x)}


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
        def run():
            y = f(x)
            return y, torch.autograd.grad(y, (x,), grad_outputs=(h,))
        return run
    return {"torch: te_autodiff.torch.op": step(op),
            "torch: x * x (torch's own)": step(lambda x: x * x),
            "torch: autograd.Function + numpy": step(Plain.apply)}


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
        def both(x):
            y, pull = jax.vjp(f, x)
            return y, pull(h)
        g = jax.jit(both)
        return lambda: jax.block_until_ready(g(x))
    return {"jax.jit: te_autodiff.jax.op": step(op),
            "jax.jit: x * x (jax's own)": step(lambda x: x * x),
            "jax.jit: custom_vjp + pure_callback + numpy": step(plain)}


def measure(steps: dict, rounds: int, calls: int) -> dict:
    """``{name: (wall µs, CPU µs)}`` per call: the median over ``rounds`` of
    each round's mean, the variants interleaved."""
    for f in steps.values():
        for _ in range(50):
            f()
    times = {name: ([], []) for name in steps}
    names = list(steps)
    for r in range(rounds):
        # each round in another order: no variant always runs after the same one
        for name in names[r % len(names):] + names[:r % len(names)]:
            f = steps[name]
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                f()
            times[name][0].append((time.perf_counter() - wall) / calls * 1e6)
            times[name][1].append((time.process_time() - cpu) / calls * 1e6)
    return {name: (statistics.median(w), statistics.median(c)) for name, (w, c) in times.items()}


def measure_all(rounds: int = 15, calls: int = 400) -> dict:
    """Every variant whose framework is installed (see the module doc), for
    the benchmark report: ``{"us": {name: [wall, cpu]}, "missing": [...]}``.
    One framework at a time, JAX last: its thread pool spins for a while
    after each call, CPU time the process would charge to whatever runs next."""
    us, missing = {}, []
    for make in (_numpy_steps, _torch_steps, _jax_steps):
        try:
            steps = make()
        except ImportError as e:
            missing.append(f"{make.__name__[1:-6]}: {e}")
            continue
        us.update({name: list(t) for name, t in measure(steps, rounds, calls).items()})
    return {"us": us, "missing": missing}


def report(us: dict) -> str:
    """The table and the differences, in Markdown."""
    lines = [f"| Y = X·X over {N} float32 | µs per call (wall) | µs per call (CPU) |", "|---|---:|---:|"]
    lines += [f"| {name} | {wall:.1f} | {cpu:.1f} |" for name, (wall, cpu) in us.items()]
    lines.append("")
    for fw, te_name, own, other in COMPARISONS:
        if te_name not in us:
            continue
        what = "per call" if fw == "numpy" else "per forward + backward"
        line = (f"- {fw}: te − {own.split(': ', 1)[1]} = {us[te_name][0] - us[own][0]:+.1f} µs wall, "
                f"{us[te_name][1] - us[own][1]:+.1f} µs CPU {what}")
        if other:
            line += (f"; te − {other.split(': ', 1)[1]} = {us[te_name][0] - us[other][0]:+.1f} wall, "
                     f"{us[te_name][1] - us[other][1]:+.1f} CPU")
        lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=400)
    args = ap.parse_args(argv)
    found = measure_all(args.rounds, args.calls)
    for line in found["missing"]:
        print(f"(not installed: {line})")
    print(f"target: {te.target()}")
    print(report(found["us"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
