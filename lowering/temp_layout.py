"""Where each temporary lives in a kernel's block of temporaries: two whose
lives do not overlap share bytes.

A temporary lives from the first stage that touches it to the last; the
stages of a scan's time loop count as one, since they run again at every
step.  The stages of a call run one after another, each compiled as its own
``noinline`` entry whose ``noalias`` pointers are the buffers it touches
(``codegen_llvm``), so memory that one temporary leaves dead can hold the
next.  Placement is greedy by size, as in TFLite's arena planner: the
largest first, each at the lowest aligned offset clear of every placed
temporary whose life overlaps its own.  The block then holds about the
most bytes alive at any one stage instead of every temporary at once: a
call touches less memory, and the data a later stage reads is more often
still in the caches.  Every temporary is written before it is read within
a call (later calls find the block as the last one left it), so sharing
changes no result."""
from __future__ import annotations

from .loop_ir import Program, stage_buffers


def stage_runs(program: Program) -> list:
    """``[(first, last)]``: each stage alone, but the stages of one scan's
    time loop together (a step's stage cannot run outside its loop)."""
    runs = []
    for k, st in enumerate(program.stages):
        if st.step is not None and runs and program.stages[runs[-1][0]].step is st.step:
            runs[-1] = (runs[-1][0], k + 1)
        else:
            runs.append((k, k + 1))
    return runs


def lives(program: Program) -> dict:
    """``{temporary: (first, last)}``: the first and last of
    :func:`stage_runs` that touch it."""
    span = {}
    for r, (first, last) in enumerate(stage_runs(program)):
        for st in program.stages[first:last]:
            for b in stage_buffers(st)[0]:
                if b.kind == "temp":
                    span[b] = (span.get(b, (r, r))[0], r)
    return span


def place(sizes: list, spans: list) -> list:
    """Byte offsets for blocks of ``sizes`` alive over the inclusive
    ``spans`` ``(first, last)``: the largest first (ties in order), each at
    the lowest offset, a sum of sizes, where it overlaps no placed block
    whose span meets its own."""
    offsets = [None] * len(sizes)
    for b in sorted(range(len(sizes)), key=lambda b: (-sizes[b], b)):
        lo, hi = spans[b]
        offset = 0
        for start, end in sorted((offsets[p], offsets[p] + sizes[p]) for p in range(len(sizes))
                                 if offsets[p] is not None and spans[p][0] <= hi and lo <= spans[p][1]):
            if offset + sizes[b] <= start:
                break
            offset = max(offset, end)
        offsets[b] = offset
    return offsets


def layout(program: Program, align: int, share: bool = True) -> tuple:
    """``([(temporary, byte offset)], block bytes)`` for ``program``'s
    temporaries, each at a multiple of ``align``; with ``share`` false,
    every temporary at bytes of its own (``Kernel.profile`` runs a stage
    alone after a whole call, and needs every stage's inputs as that call
    left them)."""
    temps = [b for b in program.buffers if b.kind == "temp"]
    sizes = [-(-max(b.nbytes, 1) // align) * align for b in temps]
    if share:
        span = lives(program)
        offsets = place(sizes, [span.get(b, (len(program.stages), -1)) for b in temps])   # untouched: no life
    else:
        offsets = [sum(sizes[:k]) for k in range(len(sizes))]
    return list(zip(temps, offsets)), max((o + n for o, n in zip(offsets, sizes)), default=0)
