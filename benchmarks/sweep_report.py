"""The size sweep's section of RESULTS.md and its chart (``sizes.png``).

One table per family (``sizes.py``), one row per size: where its data lives
(inputs + gradients, and the innermost cache that holds them), every peer's
milliseconds, te-autodiff's ratio to the fastest correct peer, and te's and
that peer's rate as a percentage of the machine's measured limits
(``roofline.py``).
"""
from __future__ import annotations

from pathlib import Path

from .peer_isa import UNCAPPED
from .peers import LABELS, PEERS
from .report import COLORS, _compile, _ms, _ok, kept_line, ratio_line, summarise
from .roofline import REASONS, cache_level, footprint, percent
from .sizes import FAMILIES, kernel_for, parse_case
from .stage_rates import cell as products_cell


def _percents(rates: list, level: str, wider: bool) -> str:
    return " · ".join(percent(r, level, wider) for r in rates if r["frac"] is not None) or "–"


def sweep_markdown(run: dict, mach: dict, limits: dict, sweep: list) -> list:
    rows = summarise(limits, sweep, key="case", kernel_of=kernel_for)
    others = [p for p in PEERS if p in run["peers"] and p != "te"]
    capped = bool(mach.get("peer_caps"))
    L = ["## Sizes: forward + backward from cache-resident data to far beyond the last cache", "",
         "Median ms of one forward + backward (best of 5 rounds), each (case, peer) in its own process as for the "
         "kernels below; **peer / te** = the fastest correct peer's ms ÷ te's (> 1: te-autodiff is faster). *data*: "
         "the bytes of the inputs and gradients and the innermost cache that holds them when the threads share the "
         f"work ({run['threads']} thread(s)); *% of peak*: GFLOP/s of the GEMM flops against the FMA peak of the "
         "dtype, GB/s of the least bytes moved against the copy bandwidth (the depthwise convolution counts both); "
         "*te products alone*: the multiply-adds of the stages that compute products against the FMA peak, each "
         "stage run alone (`kernel.profile`, `benchmarks/stage_rates.py`), all of them and the slowest product (or "
         "products computed together; attention's scores and `dsoftmax`, which the kernel runs with their row "
         "stages a block of rows at a time, are timed as stages of their own in a build without those block chains); "
         "a whole pass also pays for packing copies, elementwise stages and data earlier stages pushed out of the "
         "caches.",
         ""]
    groups = {}
    for row in rows:
        groups.setdefault(parse_case(row["case"])[0], []).append(row)
    for family, family_rows in groups.items():
        k0 = family_rows[0]["kernel_record"]
        wider_jax = capped and FAMILIES[family].matrix
        L += [f"### {family} ({k0.dtype})", ""]
        head = ["case", "data", "te"] + [LABELS[p] + (" †" if p == "jax" and wider_jax else "") for p in others] + \
            ["fastest peer", "peer / te", "te % of peak", "peer % of peak"] + \
            (["te products alone"] if k0.products else []) + ["te build s"]
        L.append("| " + " | ".join(head) + " |")
        L.append("|:---|---:|" + "---:|" * (len(head) - 2))
        for row in family_rows:
            k = row["kernel_record"]
            nbytes = footprint(k)
            level = cache_level(nbytes, mach.get("caches") or [], run["threads"])
            cells = [k.title, f"{nbytes / 2 ** 20:.3g} MB, {level}", _ms(row["te"])]
            cells += [_ms(row["peers"].get(p)) for p in others]
            cells.append(LABELS[row["fastest"]] if row["fastest"] else "–")
            cells.append(f"**{row['ratio']:.2f}**" if row["ratio"] else "–")
            cells.append(_percents(row.get("te_rates", []), level, False))
            cells.append(_percents(row.get("peer_rates", []), level, wider_jax and row["fastest"] == "jax"))
            if k0.products:
                cells.append(products_cell(row["te"] or {}, limits, k.dtype))
            cells.append(_compile(row["te"]))
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
    if any(r["ratio"] for r in rows):
        L += [ratio_line(rows, "case(s)"), ""]
        kept = capped and kept_line(rows, "case(s)", lambda r: FAMILIES[parse_case(r["case"])[0]].matrix,
                                    mach["isa"].upper())
        if kept:
            L += [kept, ""]
    notes = ["`✗`: outside the tolerance (not counted as fastest). " + REASONS]
    if capped:
        notes.append(f"† not kept to {mach['isa'].upper()}: {UNCAPPED}.")
    L += [" ".join(notes), ""]
    problems = [r for r in sweep if r.get("status") not in ("ok", "not installed") or (_ok(r) and not r["correct"])]
    if problems:
        L += ["Problems in the sweep:", ""]
        for r in problems:
            what = (f"wrong result, relative error {r['max_rel_err']:.2e}" if _ok(r)
                    else f"{r.get('status')}: `{r.get('error', '')}`")
            L.append(f"- {r['case']}, {LABELS[r['peer']]}: {what}")
        L.append("")
    return L


def sweep_chart(path: Path, run: dict, sweep: list) -> bool:
    """Milliseconds against size, one panel per family, one line per peer (log scales)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        return False
    cases = list(dict.fromkeys(r["case"] for r in sweep))
    families = list(dict.fromkeys(parse_case(c)[0] for c in cases))
    by = {(r["case"], r["peer"]): r for r in sweep}
    cols = min(3, len(families))
    rows = -(-len(families) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, family in zip(axes.flat, families):
        family_cases = [c for c in cases if parse_case(c)[0] == family]
        sizes = [footprint(kernel_for(c)) / 2 ** 20 for c in family_cases]
        for peer in (p for p in PEERS if p in run["peers"]):
            points = sorted((x, by[c, peer]["median_ms"]) for x, c in zip(sizes, family_cases)
                            if _ok(by.get((c, peer))) and by[c, peer]["correct"])
            if points:
                ax.plot(*zip(*points), marker="o", label=LABELS[peer], color=COLORS.get(peer))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(family, fontsize="medium")
        ax.set_xlabel("inputs + gradients (MB)", fontsize="small")
        ax.set_ylabel("ms", fontsize="small")
        ax.grid(which="both", alpha=0.3)
    for ax in list(axes.flat)[len(families):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize="small")
    fig.suptitle(f"forward + backward by size, {run['threads']} thread(s){' (quick)' if run['quick'] else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
