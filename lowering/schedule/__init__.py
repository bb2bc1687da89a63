"""The automatic schedule: a loop IR to loop IR pass, one rule-based plan per stage.

Every figure that depends on the CPU (lanes, register tile, K block, panel
and row-block sizes) comes from :func:`blocking` of the
:class:`~lowering.target.Target` the pipeline passes in (``blocking.py``).

``lower.py`` gives every stage the same shape: a row-major nest of *output
loops* (one per axis of the stored tensor, the outermost ``parallel``) around
an *element body* that computes one element (reductions as accumulator
loops) and stores it (``nest.py``).  Output elements are independent, so the
output loops may be reordered, tiled and vectorised freely.  :func:`schedule`
is a pure function of the program; nothing is tuned by hand or by timing.
Each rule first decides a plan from the nest and the target, then builds it.

Determinism: every rule below either keeps each element's sequence of
operations (vector lanes, tiles, K blocks, loop order) or reassociates a
reduction in one fixed way that depends on the shapes (lanes, parts) and,
for a reduction in lanes with rows inside, on where in a cache line the
input read along the lanes starts (``aligned_grid.py``): the same arrays
give the same bits, a copy placed elsewhere may differ in the last bits.
The thread count only decides which thread runs which root iterations, so
every run and every thread count gives the same bits.

Rules, in the order they are tried for a stage (:func:`schedule_stage`):

0. **Residue classes** (``residues.py``).  A test ``(a v + c) % m == 0``
   that an output loop ``v`` (not the innermost) decides alone, as zero
   elimination leaves on the gradient of a strided read, splits the stage
   into one stage per residue class ``v = m w + rho``, each scheduled
   without the test (zero fills, and reads whose ``// m`` is exact).
   b. **Interior split** (``peeling.py``).  In a stage whose element body
   runs no loop, tests that read the innermost output loop ``j`` and hold
   on an interior range of it (a stencil's gradient: ``j >= 2``, ``j <= n -
   3`` around its reads) split the stage into three stages over ``j``:
   border, interior without the tests, border, the interior's ends on
   cache-line boundaries.  Run as one stage, every vector computes the
   tests and reads under masks (the stencil benchmark kernel's gradient on
   an AMD EPYC Zen 5, built for AVX2: 0.325 -> 0.18 ms).
1. **Split reductions to one element** (``split_reduction.py``).  A stage
   storing one value reduced over a large domain (a loss) would run on one
   thread: its outermost reduction loop is cut into a fixed number of parts
   (``SPLIT_PARTS``); a new stage computes the partial results in parallel,
   the stage itself adds them in order.
2. **Offset loops** (``offsets.py``).  A reduction loop ``for x in
   max(L, e)..min(U, e+D-1)+1`` whose bounds read output variables (zero
   elimination leaves them on the gradients of convolutions) becomes ``for
   d in 0..D`` with a test ``L <= e + d <= U``: bounds independent of the
   element.
3. **Vector axis** (``vector_axis.py``).  Each output axis is scored by the
   element body's memory accesses, weighted by how often they run: an index
   that does not move with the axis is a broadcast (nearly free), one that
   moves by one element a vector access (1), any other a gather (one per
   lane) or a scatter (two per lane: a transposing copy gathers, in blocks,
   rule 8); one more when a test around the access differs between lanes
   (masked work); plus the cost of copying packed operands (rule 5).  The
   innermost reduction loop is scored the same way: when it wins (a row
   reduction such as a softmax denominator) each element's reduction runs
   in vector lanes (``lane_reduction.py``; a reduction shorter than a
   vector, half a vector or more); with loops over rows inside the lanes'
   loop, its vectors start where the lines of the input read along it
   start, found at run time (``aligned_grid.py``: numpy's large arrays
   start 16 bytes past a line, and the rows inside evict a split load's
   second line before the next vector comes back for it).  Otherwise the best output axis
   ``j`` becomes a :class:`~lowering.loop_ir.Simd` loop of one native
   vector of lanes (``Blocking.lanes``: 16 float32 on AVX-512, 8 on AVX2),
   the last vector masked.  A vector loop gathering from rows whose lines
   fall in one L1 set (rows 4 KiB apart) takes no more lanes than the set
   has ways (``vector_axis.uncrowded_lanes``, ``Target.l1_ways``).  A stage
   that stores one element gets its reduction in lanes as well.  A body
   applying exp, log, tanh... takes several vectors per step outside
   register tiles and scan steps, as many chains as the register file
   holds (``Blocking.math_chains``) when a value passes through two such
   functions in turn, half as many through one
   (``vector_axis.chained_lanes``: dependency chains side by side).
   The decisions of rules 4 to 8 for ``j`` form one
   :class:`~lowering.schedule.tile_plan.TilePlan` (``tile_plan.py``), built
   by ``tile_loops.py``.
4. **Tests to selects** (``selects.py``).  An ``If`` whose condition differs
   between lanes and whose branches assign one value to one local (a padding
   test) becomes a ``select`` whose reads are
   :class:`~lowering.loop_ir.GuardedLoad` (masked loads), unless the read is
   provably in bounds.
5. **Packing** (``packing.py``).  A load in a reduction that is a gather
   along ``j`` but reads only ``j`` and reduction variables (``B[j, k]`` in
   ``A @ B.T``) is copied, transposed, into a temporary by a new stage, so
   the lanes read it with unit stride.  Above ``PACK_MAX_BYTES`` the stage
   uses dot-product tiles instead (vector lanes along ``k``,
   ``lane_reduction.py``).
6. **Register tiles (unroll and jam)** (``register_tile.py``, ``jam.py``).
   When the element body runs a reduction whose bounds read neither ``j``
   nor a second output axis ``i``, and the reduction reads an operand that
   does not move with ``j`` (a broadcast) and one that does not move with
   ``i``, a tile of ``MR`` values of ``i`` by ``NR`` vectors of ``j`` is
   computed together: the reduction loop is shared and its body repeated
   per tile element, so the ``MR x NR`` accumulators stay in vector
   registers, each vector load serves ``MR`` rows and each broadcast ``NR``
   vectors.  A statement is repeated only over the tile positions it
   depends on; remainder rows and columns get their own, smaller tiles.
   Among the candidates for ``i``, one whose tests can be peeled (6b) is
   preferred, then one along which the broadcast loads move least:
   neighbouring rows share cache lines (the output columns of a
   convolution, not its batch).

   a. **Panels** (``packing.py``).  The operand read in vector lanes is
      copied into column panels ``P[j tile][k...][NR vectors]`` and a
      broadcast operand whose rows are adjacent but whose reduction steps
      are not (``A[k, i]``) into row panels ``P[i tile][k...][MR]``, when it
      is larger than L1 (``Blocking.panel_min_bytes``) and re-read
      ``PACK_MIN_REUSE`` times: each tile then reads one contiguous, aligned
      block per operand (no cache-set conflicts between rows a power of two
      apart, no split loads from unaligned inputs).  Transposed copies
      (rule 5) take the panel layout.  The loops are ordered column tiles,
      then row tiles, so a column panel stays in cache while the rows pass.
   b. **Peeling** (``peeling.py``).  Tests that read ``i`` (padding,
      ``0 <= i + d - 2 < H`` for every tap ``d``) hold on an interior range
      of ``i``: the row range is cut into border, interior (whole tiles,
      without those tests) and border.
7. **K blocks and row blocks** (``k_blocks.py``).  A GEMM reduction longer
   than ``k_block_min`` is cut into equal blocks of at most ``k_block``,
   each resuming from the partial sums left in the output, and the loops
   are ordered column tiles, K blocks, row tiles: a block x tile-width
   slice of the packed operand stays in L1 (the same additions in the same
   order).  With several column tiles and a row operand larger than
   ``row_block_bytes``, the row tiles are visited in a power-of-two number
   of blocks outside the column tiles, each block staying in L2 while the
   column panels pass.
8. **Gather blocks** (``gather_block.py``).  When the vector loop gathers (a
   transposed read), the loop outside it is visited ``GATHER_BLOCK`` rows at
   a time inside each column tile, so the lines a gather touches are reused.
   When every gather reads contiguously along that loop (a transposing
   copy, packed operands included), the block's loop runs inside the
   vector loop as a loop of kind ``transpose`` in lanes covering a cache
   line (``vector_axis.transposed_lanes``): the code generator loads rows
   and transposes them in registers.  A 1024 x 1024 float32 transpose on an
   AMD EPYC Zen 5: 0.207 -> 0.16 ms built for AVX2, 0.219 -> 0.21 for
   AVX-512.  A partial last block is a loop of its own (every whole block
   keeps a constant extent, so only the last gathers), and where a column
   sweep reads more lines than L1 holds, neighbouring blocks are visited
   together (``tile_plan.blocks_together``) and, with ``ALIGN_MIN_VECTORS``
   blocks or more, start where the source's lines start (the last block
   wraps around and gathers; ``aligned_grid.py``).
9. **Parallel root** (``parallel_root.py``).  The outermost tile loop is the
   ``parallel`` root the runtime splits across threads; when it has fewer
   than ``MIN_ROOT`` iterations an output tile loop with more is moved out.
   A root whose iterations, weighed by the work under each (a ragged last
   row block counts less), leave a thread idle more than a tenth of the
   time is collapsed with the loop inside it.

Stages of a scan's time loop are scheduled like any other and stay in the
loop; copies that compute the same values at every step (packed weights)
then move before it (``hoist.py``).

A stage that already holds a ``Simd`` loop is left alone, so the pass is
idempotent; so is a ``fixed`` stage, written by hand (``key_stages.py``).

Stages that are one loop nest over other buffers (the steps of an unrolled
recurrence: ``share.py``) are scheduled once, as their template; each
instance gets the template's schedule over its own buffers and temporaries.
"""
from __future__ import annotations

import re
from dataclasses import replace

from .. import share
from ..loop_ir import Program, Simd, Stage, stage_buffers, walk
from ..target import Target
from .hoist import hoist_invariants
from .ir import temporary
from .blocking import SPLIT_MIN_WORK, TILE_VECTORS, Blocking, blocking
from .lane_reduction import dot_tiles, in_lanes, reduce_in_lanes
from .nest import Nest, as_nest
from .offsets import offset_loops
from .packing import unrolled_partially
from .peeling import interior_split, split_interior
from .residues import residue_plan, split_residues
from .selects import if_to_select
from .split_reduction import split_reduction, splits_reduction
from .tile_loops import build_tiles
from .tile_plan import plan_tiles
from .vector_axis import vector_axis

__all__ = ["schedule", "schedule_stage", "splits_reduction", "blocking", "Blocking", "TILE_VECTORS",
           "SPLIT_MIN_WORK", "reduce_in_lanes", "if_to_select", "offset_loops"]


def _vectorise(nest: Nest, stage: Stage, taken: set, new_stages: list, new_buffers: list, bl: Blocking) -> list:
    """Rules 2 to 9 for one stage (copy stages join ``new_stages``)."""
    nest = Nest(nest.loops, offset_loops(nest.body, set(nest.vars)))          # 2
    axis = vector_axis(nest, bl)                                                # 3
    if axis is None:
        return [stage]
    if axis.j is None:
        return in_lanes(nest, stage, bl)
    if axis.dot_tiles:                   # a large copy costs more than horizontal sums
        body = dot_tiles(nest, axis.j, bl)
        if body is not None:
            return [Stage(stage.name, stage.buffer, body)]
    plan = plan_tiles(nest, axis, stage.buffer, bl)                             # 4-8 decided
    out, tail = build_tiles(plan, nest, stage, taken, new_stages, new_buffers,  # built, 9
                            bl.target.threads)
    return out if tail is None else out + schedule_stage(tail, taken, new_buffers, bl)


def schedule_stage(stage: Stage, taken: set, new_buffers: list, bl: Blocking) -> list:
    """The scheduled form of one stage: a list of stages (packing copies first).
    ``taken`` holds the buffer names in use; new temporaries join ``new_buffers``."""
    nest = None if stage.fixed else as_nest(stage)
    if nest is None or any(isinstance(s, Simd) for s in walk(stage.body)):
        return [stage]                   # written by hand, not as lowered, or scheduled already
    if stage.step is not None:
        bl = replace(bl, math_chains=1)
    residues = residue_plan(nest)                                                # 0
    if residues is not None:
        return [s for part in split_residues(nest, stage, residues)
                for s in schedule_stage(part, taken, new_buffers, bl)]
    interior = interior_split(nest, bl.target.alignment // stage.buffer.itemsize)   # 0b
    if interior is not None:
        return [s for part in split_interior(nest, stage, interior)
                for s in schedule_stage(part, taken, new_buffers, bl)]
    split = split_reduction(nest, stage, taken, new_buffers, bl)               # 1
    if split is not None:
        return split
    new_stages = []
    out = _vectorise(nest, stage, taken, new_stages, new_buffers, bl)
    packed = [unrolled_partially(s) for st in new_stages for s in schedule_stage(st, taken, new_buffers, bl)]
    return packed + out


def _instances(template: Stage, members: list, taken: set, new_buffers: list, bl: Blocking) -> list:
    """The schedule of ``template`` made once and placed into each member (a
    :class:`~lowering.share.Form`); each member gets temporaries of its own."""
    made = []
    derived = schedule_stage(template, set(taken), made, bl)
    slots = share.slot_buffers(template)
    out = []
    for member in members:
        names = {canon.name: buf.name for canon, (buf, _) in zip(slots, member.slots)}
        names[template.name] = member.stage.name

        def named(name):                 # a stage or buffer name, then ".suffix" or "%m=rho"
            head = re.split(r"[.%]", name, maxsplit=1)[0]
            return names.get(head, f"{member.stage.name}.{head}") + name[len(head):]

        temps = {t: temporary(named(t.name), t.shape, t.dtype, taken, new_buffers) for t in made}
        out.append([replace(share.instance(d, member, slots, temps), name=named(d.name)) for d in derived])
    return out


def schedule(program: Program, target: Target) -> Program:
    """``program`` with every stage scheduled for ``target`` (see the module
    doc); a pure function."""
    bl = blocking(target)
    new_buffers, done = [], {}
    taken = {b.name for b in program.buffers}
    read = frozenset().union(*(stage_buffers(st)[1] for st in program.stages))
    for template, members in share.group(program.stages, target.alignment, read):
        if len(members) == 1:
            done[id(template)] = schedule_stage(template, taken, new_buffers, bl)
            continue
        for member, stages in zip(members, _instances(template, members, taken, new_buffers, bl)):
            done[id(member.stage)] = stages
    stages = [replace(s, step=st.step) for st in program.stages   # a scan's step stays in its time
              for s in done[id(st)]]                              # loop, copies included
    return Program(program.name, program.buffers + tuple(new_buffers), tuple(hoist_invariants(stages)),
                   program.results, program.checks)
