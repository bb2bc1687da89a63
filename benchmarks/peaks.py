"""The machine's limits, measured in the run that uses them (one thread count per process).

- **FMA peak**, float32 and float64: the generated loop of ``fma_peak.py``,
  built for te-autodiff's target; the 100% of every GFLOP/s in the report;
- **BLAS**: the best sgemm and dgemm at hand, numpy's (OpenBLAS) and
  ``torch.matmul`` (MKL or oneDNN), each at the sizes ``BLAS_SIZES``, the
  best size counting: a peer's figure, shown beside the peak so that a GEMM
  can be placed between the library and the machine;
- **copy bandwidth**: numpy copies of arrays far larger than the last cache
  (read + write bytes), the 100% of every GB/s; a copy of 4 MB arrays that
  stay in cache, and a triad, for comparison.

Each figure is the best of N calls (the quiet moments of a shared machine),
at the thread count the parent set for this process.
"""
from __future__ import annotations

import importlib.util
import threading

import numpy as np

from lowering.throughput import best_seconds

from .fma_peak import fma_loop, fma_peak_gflops

BLAS_SIZES = (1024, 2048)          # OpenBLAS and MKL reach their peak between these on current cores


def _threaded(fn_chunk, chunks: int):
    def run():
        ts = [threading.Thread(target=fn_chunk, args=(c,)) for c in range(1, chunks)]
        for t in ts:
            t.start()
        fn_chunk(0)
        for t in ts:
            t.join()
    return run


def _fma(quick: bool, threads: int) -> dict:
    seconds = 0.2 if quick else 2.0
    loop = fma_loop(False)
    return dict(fma_f32_gflops=fma_peak_gflops(False, threads, seconds),
                fma_f64_gflops=fma_peak_gflops(True, threads, seconds),
                fma_loop=f"{loop.target.cpu}, {loop.target.vector_bytes}-byte vectors ({loop.lanes} float32 lanes), "
                         f"{loop.accumulators} accumulators")


def _gemm_gflops(matmul, dtype, reps: int, sizes) -> tuple:
    """(best GFLOP/s, the size that gave it) of ``matmul(a, b, out)`` on square ``dtype`` matrices."""
    rng = np.random.default_rng(0)
    best = (0.0, 0)
    for n in sizes:
        a, b = rng.random((n, n)).astype(dtype), rng.random((n, n)).astype(dtype)
        c = np.empty((n, n), dtype)
        best = max(best, (2 * n ** 3 / best_seconds(lambda: matmul(a, b, c), reps) / 1e9, n))
    return best


def _blas(quick: bool, threads: int) -> dict:
    reps = 3 if quick else 10
    sizes = tuple(n // 2 for n in BLAS_SIZES) if quick else BLAS_SIZES
    libraries = {"numpy": lambda a, b, c: np.matmul(a, b, out=c)}
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(threads)
        libraries["torch"] = lambda a, b, c: torch.matmul(torch.from_numpy(a), torch.from_numpy(b),
                                                          out=torch.from_numpy(c))
    out = {}
    for name, dtype in (("sgemm", np.float32), ("dgemm", np.float64)):
        for lib, matmul in libraries.items():
            rate, n = _gemm_gflops(matmul, dtype, reps, sizes)
            out[f"{name}_{lib}_gflops"], out[f"{name}_{lib}_n"] = rate, n
        out[f"{name}_gflops"] = max(out[f"{name}_{lib}_gflops"] for lib in libraries)
    return out


def _copy(quick: bool, threads: int) -> dict:
    rng = np.random.default_rng(0)
    reps = 3 if quick else 20
    n = 1 << (24 if quick else 25)                      # float32: 64 MB (quick) or 128 MB per array
    src, dst = rng.random(n, np.float32), np.empty(n, np.float32)
    b, c = rng.random(n, np.float32), rng.random(n, np.float32)
    copy1 = 2 * 4 * n / best_seconds(lambda: np.copyto(dst, src), reps) / 1e9
    parts = max(1, threads)
    edges = np.linspace(0, n, parts + 1).astype(np.int64)
    copy_t = 2 * 4 * n / best_seconds(_threaded(lambda k: np.copyto(dst[edges[k]:edges[k + 1]], src[edges[k]:edges[k + 1]]),
                                         parts), reps) / 1e9

    def triad(k):                                       # a = b + 3 c, in two numpy passes over a chunk
        s = slice(edges[k], edges[k + 1])
        np.multiply(c[s], np.float32(3), out=dst[s])
        np.add(dst[s], b[s], out=dst[s])
    triad_t = 3 * 4 * n / best_seconds(_threaded(triad, parts), reps) / 1e9
    m = 1 << 20                                         # 4 MB arrays: the size of the kernels' vectors
    src_s, dst_s = src[:m].copy(), dst[:m].copy()
    es = np.linspace(0, m, parts + 1).astype(np.int64)
    copy_small = max(2 * 4 * m / best_seconds(lambda: np.copyto(dst_s, src_s), 5 * reps) / 1e9,
                     2 * 4 * m / best_seconds(_threaded(lambda k: np.copyto(dst_s[es[k]:es[k + 1]], src_s[es[k]:es[k + 1]]),
                                                 parts), 5 * reps) / 1e9)
    return dict(copy_4mb_gbs=copy_small, copy_1thread_gbs=copy1, copy_gbs=max(copy1, copy_t),
                copy_threads_gbs=copy_t, triad_gbs=triad_t, bandwidth_gbs=max(copy1, copy_t), array_mb=4 * n / 2 ** 20)


def run_limits(quick: bool, threads: int) -> dict:
    """Every limit at ``threads`` threads (see the module doc)."""
    return dict(**_fma(quick, threads), **_blas(quick, threads), **_copy(quick, threads), status="ok")
