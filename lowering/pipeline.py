"""The lowering order, in one place: tensors -> loop IR -> short rows
unrolled -> fused -> rows padded -> scheduled for a target -> row chains
joined -> block chains joined -> LLVM IR -> machine code -> :class:`~lowering.runtime.Kernel`.

``te.build`` and ``te.cost`` both run :func:`lower_for`; ``te.build`` then
compiles its result.  Each step takes the previous step's immutable program
and returns a new one; the :class:`~lowering.target.Target` is resolved once
here and handed to every step that depends on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass

from te_autodiff.tensor import check_name

from . import llvm_process
from .cost import stage_iterations
from .block_chains import join_blocks
from .fuse import fuse
from .loop_ir import Program
from .lower import lower, validate
from .positions import narrow
from .powers import integer_powers
from .row_chains import join_rows
from .row_padding import pad_rows
from .runtime import Kernel, compile_program
from .schedule import schedule, splits_reduction
from .short_rows import short_rows
from .temp_layout import layout
from .target import Target, target as resolve_target


@dataclass(frozen=True)
class Lowered:
    """Every program of the pipeline up to the schedule, for one target."""

    inputs: list
    outputs: list
    target: Target
    plain: Program          # as lowered: one stage per stored tensor
    fused: Program          # stages over one domain fused (te.cost's built counts)
    scheduled: Program      # fused and scheduled: what is compiled


def schedule_program(plain: Program, target: Target, fusion: bool = True) -> Program:
    """Steps 2 and 3: unroll rows shorter than a vector and split temporaries
    of such rows by column (``short_rows.py``), fuse stages over one domain, give temporaries whose
    rows all fall in one cache set a padded row (``row_padding.py``),
    schedule every stage for ``target``, run consecutive stages over the
    same rows as one (``row_chains.py``), and a product with the row stages
    that alone read it, a block of rows at a time (``block_chains.py``; no
    fusion of any kind without ``fusion``);
    with the loops fixed, integer powers become running products and
    multiplications (``powers.py``)."""
    return schedule_fused(fuse(short_rows(plain, target), splits_reduction) if fusion else plain, target, fusion)


def schedule_fused(fused: Program, target: Target, fusion: bool = True) -> Program:
    """Step 3 of :func:`schedule_program`, on a program already fused."""
    scheduled = schedule(pad_rows(fused, target), target)
    return integer_powers(join_blocks(join_rows(scheduled, target), target) if fusion else scheduled)


def lower_for(inputs, outputs, name=None, store=(), recompute=(), target=None) -> Lowered:
    target = resolve_target(target)                                          # 0. the CPU, once
    inputs, outputs, _ = validate(inputs, outputs)
    if name is not None:
        check_name(name, "te.build")
    lowered = narrow(outputs, store, recompute)                              # 0b. argmax lane type
    plain = lower(inputs, lowered[0], name, store=lowered[1], recompute=lowered[2])  # 1. -> loop IR
    fused = fuse(short_rows(plain, target), splits_reduction)                # 2. short rows, fuse
    scheduled = schedule_fused(fused, target)                                # 3. schedule
    return Lowered(inputs, outputs, target, plain, fused, scheduled)


def build(inputs, outputs, name=None, store=(), recompute=(), target=None) -> Kernel:
    """``te.build``: compile ``outputs`` as functions of the placeholders
    ``inputs`` for ``target`` (None: ``TE_TARGET`` or this machine; see
    :func:`lowering.target.target`).  ``store``/``recompute``: tensors always
    kept in a buffer / always inlined (overrides of the store-or-recompute
    rule, see ``lower.py``)."""
    llvm_process.start()                                                    # LLVM starts meanwhile
    p = lower_for(inputs, outputs, name, store, recompute, target)
    compiled = compile_program(p.scheduled, p.target)                       # 4-5. emit, optimise, JIT
    return Kernel(p.scheduled, compiled, p.inputs, p.outputs, p.plain)    # 6. the callable


def cost(inputs, outputs, store=(), recompute=(), target=None) -> dict:
    """``te.cost``.  ``iterations``, ``temp_bytes`` and ``stages`` count the
    program as lowered (step 1, ``counted: "lowered"``): the algorithm's
    work, the same on every target; ``stage_iterations`` splits
    ``iterations`` into ``(stage name, count)`` pairs, one per lowered stage
    in order (a product's stage counts its multiply-adds).  ``built`` gives the temporaries and
    stages of the fused and scheduled program ``te.build`` compiles for
    ``target`` (packed panels and K-block partial sums add temporaries,
    fusion removes some, block chains shrink some to a block, padded rows
    make some larger; ``temp_block_bytes``: the block they occupy in a
    call, those alive at different stages sharing bytes, ``temp_layout.py``), and the iterations
    of each fused stage: a stage computing a producer's values in its own
    loops counts only those it reads; the schedule then splits stages into
    pieces (``.parts``, ``.interior``...) and adds copies, not counted."""
    p = lower_for(inputs, outputs, None, store, recompute, target)
    by_stage = stage_iterations(p.plain)
    return {
        "counted": "lowered",
        "iterations": sum(n for _, n in by_stage),
        "stage_iterations": by_stage,
        "temp_bytes": p.plain.temp_bytes,
        "output_bytes": sum(b.nbytes for b in p.plain.buffers if b.kind == "output"),
        "input_bytes": sum(b.nbytes for b in p.plain.inputs),
        "stages": len(p.plain.stages),
        "built": {"target": p.target.name, "temp_bytes": p.scheduled.temp_bytes,
                  "temp_block_bytes": layout(p.scheduled, p.target.alignment)[1],
                  "stages": len(p.scheduled.stages),
                  "stage_iterations": stage_iterations(p.fused)},
    }
