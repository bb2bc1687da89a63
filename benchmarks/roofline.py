"""How far a measured time is from the machine: rates as fractions of the measured limits.

A GEMM-like kernel's GFLOP/s is a fraction of the FMA peak of its dtype
(``peaks.py``), a memory-bound kernel's GB/s a fraction of the copy
bandwidth of arrays far larger than the last cache.  Neither fraction can
honestly pass 100% without a reason, and the report gives one:

- GB/s above the copy figure: the kernel's data (inputs + gradients) fits in
  a cache, named here (:func:`cache_level`), which serves it faster than
  memory; if it fits in none, the copy figure of that run was low;
- GFLOP/s above the FMA peak: the peak loop ran slower than the units can
  (another process interrupted every round of it), or the kernel is a peer
  that uses wider vectors than te-autodiff's target (``peer_isa.UNCAPPED``).

This module also renders the limits themselves (:func:`peaks_markdown`).
"""
from __future__ import annotations

import os

import numpy as np

CACHE_ROOT = "/sys/devices/system/cpu/cpu0/cache"
LEVEL_NAMES = ("L1", "L2", "L3", "L4")


def caches(root: str = CACHE_ROOT) -> list:
    """The data caches of CPU 0 as Linux reports them, innermost first:
    ``{"level", "bytes", "sharing"}`` (``sharing``: the CPUs that share one)."""
    def read(entry, name):
        with open(os.path.join(root, entry, name)) as f:
            return f.read().strip()

    def cpus(listing):
        return sum(int(b) - int(a) + 1 if "-" in part else 1
                   for part in listing.split(",") for a, _, b in [part.partition("-")])

    out = []
    try:
        entries = sorted(e for e in os.listdir(root) if e.startswith("index"))
    except OSError:
        return out
    for entry in entries:
        try:
            if read(entry, "type") == "Instruction":
                continue
            size = read(entry, "size")
            n = int(size.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
            out.append(dict(level=int(read(entry, "level")), bytes=n, sharing=cpus(read(entry, "shared_cpu_list"))))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda c: c["level"])


def cache_level(nbytes: float, cache_list: list, threads: int) -> str:
    """The innermost cache that holds ``nbytes`` when ``threads`` threads on
    distinct cores share the work: a cache private to a core (or shared by
    ``sharing`` CPUs) counts once per ``sharing`` threads; "memory" if none,
    "unknown" without cache sizes (a report re-rendered from an older run)."""
    if not cache_list:
        return "unknown"
    for c in cache_list:
        if nbytes <= c["bytes"] * max(1, threads // max(1, c["sharing"])):
            return LEVEL_NAMES[c["level"] - 1] if c["level"] <= len(LEVEL_NAMES) else f"L{c['level']}"
    return "memory"


def footprint(kernel) -> int:
    """Bytes of the kernel's inputs and gradients: what a loss + gradients
    pass must touch at least (intermediates not counted)."""
    def size(name):
        item = 4 if name in kernel.int_inputs else np.dtype(kernel.dtype).itemsize
        return int(np.prod(kernel.shapes[name])) * item
    return sum(size(n) for n in kernel.names) + sum(size(n) for n in kernel.wrt)


def rates(kernel, ms: float, limits: dict) -> list:
    """``[{rate, unit, frac, tag}]``: the kernel's rate per measure it
    counts, as a fraction of the matching limit (``frac`` None if that limit
    was not measured); the kernel's own ``limit`` first."""
    peak = limits.get("fma_f64_gflops" if kernel.dtype == "float64" else "fma_f32_gflops")
    measures = {"fma": (kernel.flops, "GFLOP/s", peak, "FMA peak"),
                "bandwidth": (kernel.bytes, "GB/s", limits.get("bandwidth_gbs"), "copy")}
    order = [kernel.limit] + [m for m in measures if m != kernel.limit]
    out = []
    for key in order:
        if key not in measures or not measures[key][0]:
            continue
        amount, unit, limit, tag = measures[key]
        rate = amount / (ms * 1e-3) / 1e9
        out.append(dict(rate=rate, unit=unit, frac=rate / limit if limit else None, tag=tag))
    return out


def percent(r: dict, level: str, wider_than_target: bool = False) -> str:
    """``"73.2% FMA peak"``, with the reason when above 100% (see the module doc)."""
    text = f"{100 * r['frac']:.1f}% {r['tag']}"
    if r["frac"] <= 1:
        return text
    if r["tag"] == "copy":
        return text + {"memory": " (copy figure low)", "unknown": " (cache sizes unknown)"}.get(level,
                                                                                            f" (data in {level})")
    return text + (" (wider vectors)" if wider_than_target else " (peak measured low)")


REASONS = ("Percentages above 100% say why: *data in L2* (L1, L3): the inputs and gradients fit in that cache, "
           "which serves them faster than the memory the copy figure streams from; *copy figure low*: the data fits "
           "in no cache, so this run's copy measurement fell short of what the memory system delivers (it varies "
           "between runs); *peak measured low*: every round of the FMA loop was interrupted by other processes; "
           "*wider vectors*: a peer using wider vectors than te-autodiff's target.")


def _gf(x) -> str:
    return f"{x:.0f}" if x is not None else "–"


def peaks_markdown(limits: dict, threads: int) -> list:
    """The "Peaks" section: each limit at 1 thread and at ``threads``."""
    if limits.get("status") != "ok":
        return [f"Limits: {limits.get('status')}: {limits.get('error')}"]
    per = limits.get("by_threads", {})
    counts = sorted(per, key=int)
    L = ["| limit | " + " | ".join(f"{t} thread(s)" for t in counts) + " | used as |",
         "|:---|" + "---:|" * len(counts) + ":---|"]

    def row(label, key, fmt, use):
        L.append(f"| {label} | " + " | ".join(fmt(per[t].get(key)) for t in counts) + f" | {use} |")

    row("FMA peak float32, GFLOP/s", "fma_f32_gflops", _gf, "**100%** of float32 GFLOP/s")
    row("FMA peak float64, GFLOP/s", "fma_f64_gflops", _gf, "**100%** of float64 GFLOP/s")
    for name, what in (("sgemm", "float32"), ("dgemm", "float64")):
        for lib, label in (("numpy", "numpy (OpenBLAS)"), ("torch", "torch.matmul")):
            if f"{name}_{lib}_gflops" in limits:
                L.append(f"| {name} {label}, GFLOP/s | " + " | ".join(
                    f"{per[t][f'{name}_{lib}_gflops']:.0f} (n {per[t][f'{name}_{lib}_n']})" for t in counts)
                    + f" | a peer's {what} GEMM, for comparison |")
    row(f"copy, {limits['array_mb']:.0f} MB arrays, GB/s", "copy_gbs", lambda x: f"{x:.1f}", "**100%** of GB/s")
    row("copy, 4 MB arrays (in cache), GB/s", "copy_4mb_gbs", lambda x: f"{x:.1f}", "for comparison")
    row("triad, GB/s", "triad_gbs", lambda x: f"{x:.1f}", "for comparison")
    L.append("")
    L.append(f"FMA loop: {limits.get('fma_loop', '–')}, independent FMA chains in registers, built for te-autodiff's "
             "target (`benchmarks/fma_peak.py`), the best round of short calls; GEMM: square n×n matrices, the "
             "better of the sizes tried (n shown); copy: read + write bytes. A percentage divides by the better of "
             "the thread counts.")
    return L
