"""The automatic schedule: a loop IR to loop IR pass, a pure function of the
program and the target; nothing is tuned by hand or by timing.

``lower.py`` gives every stage the same shape (``nest.py``): a row-major nest
of *output loops*, one per axis of the stored tensor, the outermost
``parallel``, around an *element body* that computes one element (its
reductions as accumulator loops) and stores it.  Output elements are
independent, so the output loops may be split, reordered, tiled and
vectorised freely.  :func:`schedule_stage` lists the rules in the order they
run, one module each; each rule decides a plan from the nest and the target
(``blocking.py`` derives every figure that depends on the CPU) and then
builds it.

Determinism: every rule either keeps each element's sequence of operations
(vector lanes, tiles, loop order) or reassociates a reduction in one fixed
way that depends on the shapes and the target (lanes, parts, K blocks)
and, for a reduction in lanes with rows inside, on where in a cache line
the input read along the lanes starts (``aligned_grid.py``): the same
arrays give the same bits, a copy placed elsewhere may differ in the last
bits.  The thread count only decides which thread runs which root
iterations, so every run and every thread count gives the same bits.

A stage that already holds a ``Simd`` loop is left alone, so the pass is
idempotent; so is a ``fixed`` stage, written by hand (``key_stages.py``).
Stages that are one template (``share.py``) are scheduled once
(``templates.py``).  The stages of a scan's time loop stay in it, but copies
that are the same at every step move before it (``hoist.py``).
"""
from __future__ import annotations

from dataclasses import replace

from .. import share
from ..loop_ir import Program, Simd, Stage, stage_buffers, walk
from ..target import Target
from . import (column_groups, gather_blocks, interior_split, k_blocks, lane_reduction, merged_loops, offset_loops,
               packing, panels, parallel_root, prefetch, register_tile, residue_classes, row_blocks, row_peeling,
               selects, split_reduction, sum_chains, templates, tile_loops, tile_plan, triangles, uniform_values,
               vector_axis, vector_width)
from .blocking import TILE_VECTORS, Blocking, blocking
from .constructors import Temporaries
from .hoist import hoist_invariants
from .nest import as_nest
from .split_reduction import SPLIT_MIN_WORK, splits_reduction

__all__ = ["schedule", "schedule_stage", "splits_reduction", "blocking", "Blocking", "TILE_VECTORS",
           "SPLIT_MIN_WORK"]


def schedule_stage(stage: Stage, temps: Temporaries, bl: Blocking, compared: frozenset = frozenset()) -> list:
    """The scheduled form of ``stage``: a list of stages, copies first.  The
    rules in the order they run; each decides a plan (None, or the plan
    unchanged: the rule does not apply) and builds it.  The stages a rule
    makes of one stage are scheduled from the first rule again."""
    nest = None if stage.fixed else as_nest(stage)
    if nest is None or any(isinstance(s, Simd) for s in walk(stage.body)):
        return [stage]                   # written by hand, not as lowered, or scheduled already
    if stage.step is not None:
        bl = replace(bl, math_chains=1)  # a scan's step: no math chains (vector_width.py)

    def again(stages):
        return [s for part in stages for s in schedule_stage(part, temps, bl, compared)]

    residues = residue_classes.decide(nest)
    if residues is not None:
        return again(residue_classes.build(nest, stage, residues))
    interior = interior_split.decide(nest, stage.buffer, bl.target)
    if interior is not None:
        return again(interior_split.build(nest, stage, interior))
    triangle = triangles.decide(nest, bl)
    if triangle is not None:
        return again(triangles.build(nest, stage, triangle))
    split = split_reduction.decide(nest)
    if split is not None:
        return split_reduction.build(nest, stage, split, temps, bl)
    nest = offset_loops.build(nest)
    nest = merged_loops.build(nest)                       # axes walked as one run of memory
    axis = vector_axis.decide(nest, bl)                   # with the transposed copies along it
    if axis is None:
        return [stage]
    if axis.j is None:
        return lane_reduction.build(nest, stage, bl)
    uniform = uniform_values.decide(nest, axis.j, bl, stage.step and stage.step.var)
    if uniform:                                           # values repeated per element: their own stages
        return again(uniform_values.build(nest, stage, uniform, temps))
    nest = selects.build(nest, axis.j)
    plan = tile_plan.start(nest, axis, stage.buffer, bl)  # the tile rules: each adds to one plan
    plan = register_tile.decide(plan, nest, bl)
    plan = panels.decide(plan, nest, bl)
    plan = k_blocks.decide(plan, bl)
    plan = row_blocks.decide(plan, bl)
    plan = column_groups.decide(plan, bl)
    plan = row_peeling.decide(plan, nest)
    plan = gather_blocks.decide(plan, nest, bl)
    plan = vector_width.decide(plan, bl)
    plan = sum_chains.decide(plan, nest, bl, stage.buffer in compared)
    copies = []                                           # the plan built, innermost first
    body = packing.build(plan.body, plan.copies, temps, copies, bl.target)
    body = prefetch.build(plan, nest, body, bl)
    body, into, epilogue = k_blocks.build(plan, nest, stage, body, temps)
    out = []
    for name, group in column_groups.parts(plan, into[0]):  # a stage per group of column tiles
        loops = tile_loops.build(plan, body, group) if plan.gather is None else gather_blocks.build(plan, body)
        out.append(Stage(name, into[1], parallel_root.build(plan.untiled(nest), loops, bl.target.threads,
                                                            plan.pinned, plan.shared), apart=group is not None))
    out += again(epilogue)                                 # scheduled before the copies: temporaries keep their order
    return [packing.unrolled_partially(s) for s in again(copies)] + out


def schedule(program: Program, target: Target) -> Program:
    """``program`` with every stage scheduled for ``target`` (see the module
    doc); a pure function."""
    bl = blocking(target)
    temps, done = Temporaries({b.name for b in program.buffers}, []), {}
    compared = sum_chains.compared(program.stages)
    read = frozenset().union(*(stage_buffers(st)[1] for st in program.stages))
    for template, members in share.group(program.stages, target.alignment, read):
        if len(members) == 1:
            done[id(template)] = schedule_stage(template, temps, bl, compared)
            continue
        own = Temporaries(set(temps.taken), [])
        derived = schedule_stage(template, own, bl, compared)
        for member, stages in zip(members, templates.instances(template, derived, own.made, members, temps)):
            done[id(member.stage)] = stages
    stages = [replace(s, step=st.step) for st in program.stages   # a scan's step stays in its time
              for s in done[id(st)]]                              # loop, copies included
    return Program(program.name, program.buffers + tuple(temps.made), tuple(hoist_invariants(stages)),
                   program.results, program.checks)
