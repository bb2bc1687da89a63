"""Loop IR to LLVM IR (llvmlite.ir).

Each stage becomes two functions:

* ``stageN.body(T0* noalias b0, ..., i64 lo, i64 hi, i64* err)``: internal,
  always inlined, one typed ``noalias dereferenceable`` pointer per buffer the
  stage touches (so LLVM knows the buffers are disjoint and may be read
  speculatively); runs the iterations ``[lo, hi)`` of the parallel root loop;
* ``stageN(i8** buffers, i64 lo, i64 hi, i64* err)``: the entry point the
  runtime calls, which picks the stage's buffers out of the program's table.

and ``run_stages`` runs a range of stages in one call (see ``runtime.py``),
looping over the stages of a scan's time loop (``Stage.step``) once per
step: it sets the loop's counter on entry and advances it after the loop's
last stage, and each stage of the loop reads its time from the counter.

A failed run-time check stores ``(code, index)`` into ``err`` and returns.
Float arithmetic carries ``reassoc contract nsz`` (never nnan/ninf: max
reductions start from -inf; never arcp: ``x * (1/d)`` for ``x / d`` in one
stage and not in another would make the derivative of a max, which finds the
first position where the recomputed body equals the stored maximum, miss
it), except a value that is compared or is a max's or min's candidate, and
what it is computed from: that keeps the association written, without
``reassoc`` (``emitter.ordered_nodes``), for LLVM reassociates by the order
of the operands in the surrounding code, which differs between a register
tile, its remainder rows and the argmax stage.  Floor division and modulo
on floats follow numpy's ``divmod`` exactly and carry no fast-math flags.
The operators are those of the table ``te_autodiff/ops.py``: arithmetic is
an LLVM instruction (``_INSTRUCTIONS``); a function with a body of our own
for its dtype in ``fast_math.py`` (exp, log, tanh, erf...) is that LLVM IR,
inline, or one internal function per module that a stage applying one many
times calls (``INLINE_MATH_USES``); any other is the table's LLVM intrinsic
or libm function.

Vector loops: inside a :class:`~lowering.loop_ir.Simd` loop every value is
either the same in all lanes (kept scalar) or a ``<W x T>`` vector; a load
or store whose index grows by one per lane is one vector access, any other
a gather or scatter, except consecutive stores that together write a row
per lane (a register tile stored across the lanes: :func:`row_groups`),
which are transposed in registers and stored row by row; locals declared
inside are vectors.  A test or loop
bound that differs between lanes runs under a lane mask (masked loads,
stores and assignments; a branch no lane takes is skipped), so any element
body can run in lanes.

Everything CPU-specific comes from the :class:`~lowering.target.Target`:
functions ask LLVM for vectors of the target's native width (``Simd``
loops are never wider, so no masked operation is split below its width);
AVX-512 math instructions are used only where the target has them.  On a
target with streaming stores (x86), full native vectors into an output of at
least :func:`stream_min_bytes` (the power of two at or above L2) that no
stage reads back, or into any buffer of at least :func:`stream_beyond_bytes`
(every thread's L2 and L3 share) that the storing stage does not read,
are non-temporal stores when they write whole cache lines
(``_mark_streaming``): they skip the read for ownership a cached store
costs, a third of a copy's memory traffic; the stage ends with an
``sfence``.

The modules, one concern each: ``llvm_types`` (dtypes as LLVM types,
fast-math flags, mangling), ``operators`` (the operator table's LLVM
instructions, comparisons, casts), ``emitter`` (a stage's body function:
loops, lanes and masks, loads and stores, locals, checks),
``vector_idioms`` (rows transposed in registers), ``streaming``
(non-temporal stores), ``modules`` (entry points, templates, the partition
into modules) and ``run_stages`` (the stage dispatcher, time loops and
libgomp).
"""
from __future__ import annotations

from .emitter import INLINE_MATH_USES
from .modules import compile_weight, emit_modules, partition, stage_groups, stage_symbol
from .run_stages import RUN_STAGES, chunk_align, root_extent
from .streaming import stream_beyond_bytes, stream_min_bytes
from .vector_idioms import row_groups

__all__ = ["INLINE_MATH_USES", "RUN_STAGES", "chunk_align", "compile_weight", "emit_modules", "partition",
           "root_extent", "row_groups", "stage_groups", "stage_symbol", "stream_beyond_bytes",
           "stream_min_bytes"]
