"""``run_stages``: runs a range of a program's stages in one call, looping
over a scan's time loop once per step, and with OpenMP hands a stage's
chunks to libgomp's thread team (``run_chunk``)."""
from __future__ import annotations

from llvmlite import ir

from te_autodiff.expr import Const

from ..loop_ir import For, Program, Simd, Stage, walk
from .emitter import add_vector_attributes
from .llvm_types import I8, I32, I64, PTR


RUN_STAGES = "run_stages"
CHUNK_ALIGN_1D = 1024        # chunk edges of unscheduled 1-d stages (LLVM's vector/remainder split)


def root_extent(stage: Stage) -> int:
    """Iterations of a stage's parallel root loop (1 when it has none)."""
    root = stage.body
    if isinstance(root, For) and root.kind == "parallel" and isinstance(root.extent, Const):
        return max(root.extent.value, 0)
    return 1


def chunk_align(stage: Stage) -> int:
    """Chunk edges of a split stage are multiples of this.  A scheduled stage
    computes every element with the same code wherever a chunk starts; a
    1-d stage left to LLVM's loop vectoriser keeps its vector/remainder split."""
    scheduled = any(isinstance(x, Simd) for x in walk(stage.body))
    return CHUNK_ALIGN_1D if len(stage.buffer.shape) <= 1 and not scheduled else 1


def _dispatch(b, fn, n, entries, args_of, after):
    """``switch (n)``: call ``entries[k](*args_of(k))``, then branch to ``after``."""
    switch = b.switch(n, after)
    for k, entry in enumerate(entries):
        case = fn.append_basic_block(f"stage{k}")
        switch.add_case(ir.Constant(I64, k), case)
        b.position_at_end(case)
        b.call(entry, args_of(k))
        b.branch(after)


def _emit_chunk(module, program, entries, target):
    """``run_chunk(i64* ctx)``, run by every thread of a ``GOMP_parallel``
    region: ``ctx = {table, stage, extent, align, err}``; thread ``t`` of ``n``
    runs its contiguous, ``align``-rounded share of the root loop and
    reports a failed check in ``err[2t .. 2t+1]``."""
    i32_fn = ir.FunctionType(I32, [])
    tid_fn = ir.Function(module, i32_fn, name="omp_get_thread_num")
    num_fn = ir.Function(module, i32_fn, name="omp_get_num_threads")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), name="run_chunk")
    add_vector_attributes(fn, target)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ctx = fn.args[0]
    field = [b.load(b.gep(ctx, [ir.Constant(I64, k)], source_etype=I64), typ=I64) for k in range(5)]
    table = b.inttoptr(field[0], PTR)
    stage, extent, align = field[1:4]
    err = b.inttoptr(field[4], PTR)
    tid = b.sext(b.call(tid_fn, []), I64)
    n = b.sext(b.call(num_fn, []), I64)
    one = ir.Constant(I64, 1)
    step = b.sdiv(b.sub(b.add(extent, n), one), n)
    step = b.mul(b.sdiv(b.sub(b.add(step, align), one), align), align)
    lo = b.mul(tid, step)
    hi = b.call(module.globals.get("llvm.smin.i64") or ir.Function(
        module, ir.FunctionType(I64, [I64, I64]), name="llvm.smin.i64"), [b.add(lo, step), extent])
    slot = b.gep(err, [b.mul(tid, ir.Constant(I64, 2))], source_etype=I64)
    done = fn.append_basic_block("done")
    work = fn.append_basic_block("work")
    b.cbranch(b.icmp_signed("<", lo, hi), work, done)
    b.position_at_end(work)
    _dispatch(b, fn, stage, entries, lambda k: [table, lo, hi, slot], done)
    b.position_at_end(done)
    b.ret_void()
    return fn


def _time_loops(program: Program) -> list:
    """``[(first stage, last stage, TimeLoop)]`` for each time loop of ``program``."""
    out = []
    for n, st in enumerate(program.stages):
        if st.step is None:
            continue
        if out and out[-1][2] is st.step and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n, st.step)
        else:
            out.append((n, n, st.step))
    return out


def _stage_table(module, name, values):
    """A constant i64 array, one entry per stage."""
    const_ = ir.Constant(ir.ArrayType(I64, len(values)), values)
    g = ir.GlobalVariable(module, const_.type, name=name)
    g.global_constant, g.initializer, g.linkage = True, const_, "internal"
    return g


def _entry_of(b, g, n):
    return b.load(b.gep(g, [ir.Constant(I64, 0), n], source_etype=g.value_type), typ=I64)


def _counter(b, table, slot):
    return b.load(b.gep(table, [slot], source_etype=PTR), typ=PTR)


def _start_time_loop(module, b, program, table, n):
    """When stage ``n`` (an i64 value) opens a time loop, set its counter to the loop's start."""
    loops = _time_loops(program)
    if not loops:
        return
    slot = {buf: k for k, buf in enumerate(program.buffers)}
    opens, starts = [-1] * len(program.stages), [0] * len(program.stages)
    for first, _, step in loops:
        opens[first], starts[first] = slot[step.counter], step.lo
    opens_g = module.globals.get("loop_opens") or _stage_table(module, "loop_opens", opens)
    starts_g = module.globals.get("loop_starts") or _stage_table(module, "loop_starts", starts)
    inside = b.icmp_signed("<", n, ir.Constant(I64, len(program.stages)))
    n_safe = b.select(inside, n, ir.Constant(I64, 0))
    k = _entry_of(b, opens_g, n_safe)
    with b.if_then(b.and_(inside, b.icmp_signed(">=", k, ir.Constant(I64, 0)))):
        b.store(_entry_of(b, starts_g, n_safe), _counter(b, table, k))


def _next_stage(module, b, program, table, n):
    """The stage after stage ``n``: at the end of a time loop, advance its
    counter and go back to the loop's first stage until the last step ran;
    entering a time loop sets its counter.  Returns the next index."""
    nxt = b.add(n, ir.Constant(I64, 1))
    loops = _time_loops(program)
    if not loops:
        return nxt
    slot = {buf: k for k, buf in enumerate(program.buffers)}
    closes, ends, firsts = ([-1] * len(program.stages) for _ in range(3))
    for first, last, step in loops:
        closes[last], ends[last], firsts[last] = slot[step.counter], step.lo + step.extent, first
    closes_g, ends_g, firsts_g = (_stage_table(module, name, values) for name, values in
                                  (("loop_closes", closes), ("loop_ends", ends), ("loop_firsts", firsts)))
    k = _entry_of(b, closes_g, n)
    closing = b.icmp_signed(">=", k, ir.Constant(I64, 0))
    pre = b.block
    with b.if_then(closing):
        ptr = _counter(b, table, k)
        time = b.add(b.load(ptr, typ=I64), ir.Constant(I64, 1))
        b.store(time, ptr)
        again = b.icmp_signed("<", time, _entry_of(b, ends_g, n))
        back = b.select(again, _entry_of(b, firsts_g, n), nxt)
        inner = b.block
    target = b.phi(I64, name="next")
    target.add_incoming(nxt, pre)
    target.add_incoming(back, inner)
    repeat = b.icmp_signed("<=", target, n)
    with b.if_then(b.not_(repeat)):
        _start_time_loop(module, b, program, table, target)
    return target


def emit_run_stages(module, program, entries, openmp, target):
    """``run_stages(i8** buffers, i64 first, i64 last, i64* err, i64 threads,
    i8* split)``: stages ``[first, last)`` in order, each over its whole root
    loop (with ``openmp``, a stage whose ``split`` flag is set runs on
    ``threads`` threads), stopping at the first failed check: one native
    call runs a whole kernel.  ``err`` has two slots per thread."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64, PTR, I64, PTR]),
                     name=RUN_STAGES)
    table, first, last, err, threads, split = fn.args
    entry = fn.append_basic_block("entry")
    head = fn.append_basic_block("head")
    latch = fn.append_basic_block("latch")
    done = fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    ctx = b.alloca(I64, ir.Constant(I64, 5), name="ctx")
    _start_time_loop(module, b, program, table, first)
    start = b.block
    b.branch(head)
    b.position_at_end(head)
    n = b.phi(I64, name="n")
    n.add_incoming(first, start)
    dispatch = fn.append_basic_block("dispatch")
    b.cbranch(b.icmp_signed("<", n, last), dispatch, done)
    b.position_at_end(dispatch)
    serial = fn.append_basic_block("serial")
    if openmp:
        chunk = _emit_chunk(module, program, entries, target)
        gomp = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I32, I32]), name="GOMP_parallel")
        extents = ir.Constant(ir.ArrayType(I64, len(entries)),
                              [root_extent(st) for st in program.stages])
        aligns = ir.Constant(ir.ArrayType(I64, len(entries)), [chunk_align(st) for st in program.stages])
        tables = []
        for name, const_ in (("extents", extents), ("aligns", aligns)):
            g = ir.GlobalVariable(module, const_.type, name=name)
            g.global_constant, g.initializer, g.linkage = True, const_, "internal"
            tables.append(g)
        flag = b.load(b.gep(split, [n], source_etype=I8), typ=I8)
        parallel = fn.append_basic_block("parallel")
        go = b.and_(b.icmp_signed(">", threads, ir.Constant(I64, 1)),
                    b.icmp_unsigned("!=", flag, ir.Constant(I8, 0)))
        b.cbranch(go, parallel, serial)
        b.position_at_end(parallel)
        values = [b.ptrtoint(table, I64), n,
                  b.load(b.gep(tables[0], [ir.Constant(I64, 0), n], source_etype=extents.type), typ=I64),
                  b.load(b.gep(tables[1], [ir.Constant(I64, 0), n], source_etype=aligns.type), typ=I64),
                  b.ptrtoint(err, I64)]
        for k, v in enumerate(values):
            b.store(v, b.gep(ctx, [ir.Constant(I64, k)], source_etype=I64))
        b.call(gomp, [chunk, ctx, b.trunc(threads, I32), ir.Constant(I32, 0)])
        b.branch(latch)
    else:
        b.branch(serial)
    b.position_at_end(serial)
    _dispatch(b, fn, n, entries,
              lambda k: [table, ir.Constant(I64, 0), ir.Constant(I64, root_extent(program.stages[k])), err],
              latch)
    b.position_at_end(latch)
    nxt = _next_stage(module, b, program, table, n)
    slots = b.select(b.icmp_signed(">", threads, ir.Constant(I64, 1)), threads, ir.Constant(I64, 1))
    # any thread's slot reporting a failure stops the run
    check = fn.append_basic_block("check")
    from_latch = b.block
    b.branch(check)
    b.position_at_end(check)
    t = b.phi(I64, name="t")
    t.add_incoming(ir.Constant(I64, 0), from_latch)
    code = b.load(b.gep(err, [b.mul(t, ir.Constant(I64, 2))], source_etype=I64), typ=I64)
    t_next = b.add(t, ir.Constant(I64, 1))
    failed = b.icmp_signed("!=", code, ir.Constant(I64, 0))
    more = fn.append_basic_block("more")
    b.cbranch(failed, done, more)
    b.position_at_end(more)
    t_more = b.icmp_signed("<", t_next, slots)
    b.cbranch(t_more, check, head)
    t.add_incoming(t_next, more)
    n.add_incoming(nxt, more)
    b.position_at_end(done)
    b.ret_void()
