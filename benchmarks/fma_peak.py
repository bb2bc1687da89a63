"""The machine's FMA peak: a generated loop of independent vector FMAs.

GFLOP/s of GEMM-like kernels are compared with what the FMA units can do,
not with a BLAS library: a library's GEMM is a peer, and on small or
cache-resident shapes te-autodiff may beat it, which says nothing about how
close to the machine either is.  The loop is built with llvmlite for the
target te-autodiff compiles for (``te.target()``: ``TE_TARGET=haswell``
gives AVX2 code on an AVX-512 machine), at that target's vector width:

    acc_j = fma(acc_j, a, b)        for j = 1 .. accumulators, unrolled

Each accumulator is a chain of dependent FMAs; the chains are independent,
so with at least latency × FMA units of them (4 × 2 on current x86 cores)
every FMA unit starts one FMA per cycle.  The loop keeps as many
accumulators as the register file holds beside the two operands
(``vector_registers - 2``), more than any current core needs, without
spilling.  ``a`` slightly below 1 and ``b`` small keep the values normal (no
denormal slow path).  One FMA on ``lanes`` elements counts 2 · lanes flops.

All threads: the same function called from that many Python threads at once
(ctypes releases the GIL during the call); a round's rate is the flops of
every thread over the time from the common start to the last finish, and
the best round counts (calls are short: on a shared machine a round that
no other process interrupted shows what the units can do).
"""
from __future__ import annotations

import ctypes
import threading
import time
from functools import lru_cache

from llvmlite import ir

from lowering.throughput import Jitted, lanes_summed

UNROLL = 4                     # rounds over the accumulators per loop iteration
CALL_SECONDS = 2e-3            # one timed call: shorter than a scheduler slice on a shared machine


def _module(lanes: int, accumulators: int, double: bool) -> ir.Module:
    """``T fma_loop(i64 iterations, T a, T b)``: ``iterations`` × ``UNROLL`` ×
    ``accumulators`` vector FMAs; returns a sum of the accumulators (so none is dead)."""
    scalar = ir.DoubleType() if double else ir.FloatType()
    vec = ir.VectorType(scalar, lanes)
    i64, i32 = ir.IntType(64), ir.IntType(32)
    mod = ir.Module("fma_peak")
    fma = ir.Function(mod, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.v{lanes}{'f64' if double else 'f32'}")
    fn = ir.Function(mod, ir.FunctionType(scalar, [i64, scalar, scalar]), "fma_loop")
    iterations, a, b = fn.args
    entry, loop, done = fn.append_basic_block("entry"), fn.append_basic_block("loop"), fn.append_basic_block("done")
    bld = ir.IRBuilder(entry)
    zero_mask = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)

    def splat(x):
        one = bld.insert_element(ir.Constant(vec, ir.Undefined), x, ir.Constant(i32, 0))
        return bld.shuffle_vector(one, ir.Constant(vec, ir.Undefined), zero_mask)
    va, vb = splat(a), splat(b)
    starts = [bld.fadd(vb, ir.Constant(vec, [float(j)] * lanes)) for j in range(accumulators)]
    bld.branch(loop)
    bld = ir.IRBuilder(loop)
    count = bld.phi(i64)
    accs = [bld.phi(vec) for _ in range(accumulators)]
    values = list(accs)
    for _ in range(UNROLL):
        values = [bld.call(fma, [v, va, vb]) for v in values]
    step = bld.add(count, ir.Constant(i64, 1))
    bld.cbranch(bld.icmp_signed("<", step, iterations), loop, done)
    count.add_incoming(ir.Constant(i64, 0), entry)
    count.add_incoming(step, loop)
    for phi, start, value in zip(accs, starts, values):
        phi.add_incoming(start, entry)
        phi.add_incoming(value, loop)
    bld = ir.IRBuilder(done)
    bld.ret(lanes_summed(bld, values, lanes))
    return mod


class FmaLoop:
    """The compiled loop for one target and precision: ``flops_per_iteration``
    and ``run(iterations)`` (the call releases the GIL)."""

    def __init__(self, target, double: bool):
        self.target, self.double = target, double
        self.lanes = target.lanes(8 if double else 4)
        self.accumulators = max(1, target.vector_registers - 2)
        real = ctypes.c_double if double else ctypes.c_float
        self._jitted = Jitted(_module(self.lanes, self.accumulators, double), target, "fma_loop",
                              ctypes.CFUNCTYPE(real, ctypes.c_int64, real, real))
        self.asm, self._fn = self._jitted.asm, self._jitted.fn
        self.flops_per_iteration = 2 * self.lanes * self.accumulators * UNROLL

    def run(self, iterations: int) -> float:
        return self._fn(iterations, 1.0 - 2.0 ** -20, 2.0 ** -20)


@lru_cache(maxsize=None)
def fma_loop(double: bool) -> FmaLoop:
    """The loop for ``te.target()`` (``TE_TARGET`` or this machine)."""
    import te_autodiff as te

    return FmaLoop(te.target(), double)


def fma_peak_gflops(double: bool, threads: int, seconds: float) -> float:
    """The best GFLOP/s of ``threads`` copies of the loop started together,
    over rounds of calls of about ``CALL_SECONDS`` each for ``seconds``: a
    round that ran undisturbed by other processes shows the peak."""
    loop = fma_loop(double)
    iterations = 64
    while True:                                     # calibrate one call to CALL_SECONDS
        t = time.perf_counter()
        loop.run(iterations)
        elapsed = time.perf_counter() - t
        if elapsed >= CALL_SECONDS / 4:
            break
        iterations *= 4
    iterations = max(1, int(iterations * CALL_SECONDS / elapsed))
    rounds = max(3, int(seconds / CALL_SECONDS))
    go, done = threading.Barrier(threads), threading.Barrier(threads)

    def rounds_of_calls(times):
        for _ in range(rounds):
            go.wait()
            t = time.perf_counter()
            loop.run(iterations)
            done.wait()
            times.append(time.perf_counter() - t)

    others = [threading.Thread(target=rounds_of_calls, args=([],)) for _ in range(threads - 1)]
    for w in others:
        w.start()
    times = []                                      # this thread's: start to the last thread's finish
    rounds_of_calls(times)
    for w in others:
        w.join()
    return threads * iterations * loop.flops_per_iteration / min(times) / 1e9
