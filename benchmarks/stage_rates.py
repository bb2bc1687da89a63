"""The products' own rate: each GEMM-like stage run alone against the FMA peak.

A whole forward + backward also pays for packing copies, elementwise stages
and the data earlier stages pushed out of the caches; how close to the
machine the products themselves run needs them timed alone.
``kernel.profile`` times every stage of the scheduled program alone (the
call's threads, the least of ``REPEAT`` runs); ``te.cost`` counts each fused
stage's multiply-adds.  A kernel names the lowered stages that hold its GEMM
flops (``Kernel.products``).

A scheduled stage *holds* a product when one of its '+'-joined parts is the
product's name, or the name with the suffixes the schedule gives the pieces
of one stage (``PIECE``: ``dWt.sums`` for K-block partial sums,
``loss.parts``, ``conv.interior``, ``C.cols1``, ``conv%2=1``); a packed copy
(``dh.packed``) or another tensor (``dh.r1``) is not the product.  Stages
that hold products together (fused, or pieces of one) form one group: its
rate is its products' flops over its stages' seconds.  A product the
kernel runs with the row stages that read it, a block of rows at a time
(``lowering/block_chains.py``: attention's scores and their softmax), is
no stage of its own there; the products are timed in a build without
those chains, whose product stages run the same tiles.
"""
from __future__ import annotations

import re

import numpy as np

REPEAT = 10
PIECE = re.compile(r"(\.(sums|parts|border0|interior|border1|cols\d+)\d*|%\d+=\d+)+")  # k_blocks, split_reduction,
                                                                          # interior_split, column_groups, residue_classes


def holds(part: str, product: str) -> bool:
    """Whether the scheduled stage part ``part`` computes (a piece of) ``product``."""
    return part == product or part.startswith(product) and PIECE.fullmatch(part[len(product):]) is not None


def groups(entries: list, products) -> list:
    """``[(stage names, product names, seconds)]``: the profile's ``entries``
    (``(name, seconds)``) that hold ``products``, joined where they share one."""
    merged = []
    for name, seconds in entries:
        parts = name.replace(", ", "+").split("+")
        mine = {p for p in products if any(holds(part, p) for part in parts)}
        if not mine:
            continue
        names = [name]
        for g in [g for g in merged if g[1] & mine]:
            merged.remove(g)
            names, mine, seconds = g[0] + names, g[1] | mine, g[2] + seconds
        merged.append((names, mine, seconds))
    return [(names, sorted(mine), seconds) for names, mine, seconds in merged]


def measure(kernel, arrays) -> dict:
    """The products of ``kernel`` (a benchmark kernel with ``products``) on
    ``arrays``: every group with its flops (2 per iteration of the fused
    stages that compute its products: ``te.cost``'s ``built`` counts, so a
    gradient computed inside the crop that reads it counts the elements
    kept) and seconds, the products no stage holds (a renamed stage: an
    error in ``Kernel.products``), and the profile's total seconds."""
    import te_autodiff as te
    from lowering import pipeline
    inputs, outputs = kernel.te_program(te)
    join, pipeline.join_blocks = pipeline.join_blocks, lambda program, target: program
    try:                                    # the products as stages of their own (see the module doc)
        fused = te.cost(inputs, outputs)["built"]["stage_iterations"]
        f = te.build(inputs, outputs)
    finally:
        pipeline.join_blocks = join
    profile = f.profile(*(np.ascontiguousarray(a) for a in arrays), repeat=REPEAT)
    found = groups([(s.name, s.seconds) for s in profile], kernel.products)

    def flops(mine):
        return 2 * sum(n for name, n in fused if set(name.split("+")) & set(mine))

    missing = sorted(set(kernel.products) - {p for g in found for p in g[1]})
    return dict(groups=[dict(stages=n, products=p, flops=flops(p), seconds=s) for n, p, s in found],
                missing=missing, profile_s=sum(s.seconds for s in profile))


def better(old: dict | None, new: dict | None) -> dict | None:
    """Two passes' products (``measure``) as one: each group at its least
    seconds (a pass slowed by other processes, as a shared machine's are for
    seconds at a time, does not decide the figure)."""
    if not old or not new:
        return old or new
    least = {tuple(g["products"]): g["seconds"] for g in old["groups"]}
    groups = [dict(g, seconds=min(g["seconds"], least.get(tuple(g["products"]), g["seconds"]))) for g in new["groups"]]
    return dict(new, groups=groups, profile_s=min(old["profile_s"], new["profile_s"]))


def cell(result: dict, limits: dict, dtype: str) -> str:
    """The report's cell: the products' rate together, and the slowest
    group's, as percentages of the FMA peak of ``dtype`` (above 100%: the
    peak loop was interrupted, as ``roofline.percent`` says)."""
    found = result.get("products")
    peak = limits.get("fma_f64_gflops" if dtype == "float64" else "fma_f32_gflops")
    if found and found["missing"]:
        return "stage(s) not found: " + ", ".join(found["missing"])
    if not found or not peak:
        return "–"

    def pct(flops, seconds):
        frac = flops / seconds / 1e9 / peak
        return f"{100 * frac:.1f}%" + (" (peak measured low)" if frac > 1 else "")

    least = min(found["groups"], key=lambda g: g["flops"] / g["seconds"])
    together = pct(sum(g["flops"] for g in found["groups"]), sum(g["seconds"] for g in found["groups"]))
    return f"{together}; least {pct(least['flops'], least['seconds'])}: {'+'.join(least['products'])}"
