"""Stages of one template (``lowering/share.py``): an unrolled recurrence's
steps are scheduled once and compiled as one LLVM function, each step
calling it with its own buffers at its own offsets, and the results are
those of a numpy implementation written by hand and of finite differences."""
import re

import numpy as np
import pytest

import te_autodiff as te
from benchmarks.kernels import _rnn_np as rnn_numpy
from lowering import share
from lowering.loop_ir import Buffer, BufLoad, For, Stage, Store, stage_buffers
from lowering.pipeline import lower_for


def unrolled_rnn(T, B, H, I, dtype="float32"):
    """``h_t = tanh(h_(t-1) Wᵀ + x_t Uᵀ)``, h_0 = 0, written as T computes; loss Σ h_T·G."""
    X = te.placeholder((T, B, I), dtype, "X")
    W = te.placeholder((H, H), dtype, "W")
    U = te.placeholder((H, I), dtype, "U")
    G = te.placeholder((B, H), dtype, "G")
    h = te.compute((B, H), lambda b, i: te.const(0.0, dtype), name="h0")
    for t in range(T):
        j, q = te.reduce_axis(H, "j"), te.reduce_axis(I, "q")
        h = te.compute((B, H), lambda b, i, h=h, t=t, j=j, q=q: te.tanh(
            te.sum(h[b, j] * W[i, j], axis=j) + te.sum(X[t, b, q] * U[i, q], axis=q)), name=f"h{t + 1}")
    r, s = te.reduce_axis(B, "r"), te.reduce_axis(H, "s")
    loss = te.compute((), lambda: te.sum(h[r, s] * G[r, s], axis=[r, s]), name="loss")
    return [X, W, U, G], loss


def _arrays(shape_of, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * k).astype(dtype) for s, k in shape_of]


@pytest.mark.parametrize("T, B, H, I", [(6, 32, 32, 16), (5, 3, 5, 7)])
def test_an_unrolled_rnn_and_its_gradient_match_numpy(T, B, H, I):
    """(6, 32, 32, 16): the rows of X and dX are whole multiples of the buffer
    alignment, so the steps share templates; (5, 3, 5, 7): odd sizes, where
    only offsets into inputs may move into a pointer."""
    ins, loss = unrolled_rnn(T, B, H, I)
    grads = te.gradient(loss, ins[:3])
    kernel = te.build(ins, [loss, *grads])
    values = _arrays([((T, B, I), 0.5), ((H, H), 0.3), ((H, I), 0.3), ((B, H), 1.0)], "float32")
    got = kernel(*values)
    loss_np, grads_np, _ = rnn_numpy(*[v.astype(np.float64) for v in values])   # BPTT by hand
    want = [loss_np, *grads_np]
    for name, a, b in zip(["loss", "dX", "dW", "dU"], got, want):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5, err_msg=name)


def test_an_unrolled_rnn_gradient_matches_finite_differences():
    ins, loss = unrolled_rnn(3, 2, 4, 3, "float64")
    values = _arrays([((3, 2, 3), 0.5), ((4, 4), 0.4), ((4, 3), 0.4), ((2, 4), 1.0)], "float64")
    te.check_gradient(loss, ins, values, rtol=1e-5, atol=1e-7)


def test_the_steps_of_an_unrolled_rnn_are_one_template_each():
    """Forward steps 2..T, and the backward steps, are instances of a few
    templates: the schedule runs once per template and the module defines one
    body function per template, whatever T (from T = 8, when every kind of step
    has a twin)."""
    counts = {}
    for T in (8, 16):
        ins, loss = unrolled_rnn(T, 32, 32, 16)
        p = lower_for(ins, [loss, *te.gradient(loss, ins[:3])])
        read = frozenset().union(*(stage_buffers(st)[1] for st in p.scheduled.stages))
        groups = share.group(p.scheduled.stages, p.target.alignment, read)
        shared = [members for _, members in groups if len(members) > 1]
        assert any(len(members) >= T - 1 for members in shared), [len(m) for m in shared]
        kernel = te.build(ins, [loss, *te.gradient(loss, ins[:3])])
        counts[T] = len(re.findall(r"define internal fastcc void @template", kernel.llvm_ir))
        assert counts[T] >= 1
    assert counts[8] == counts[16], counts


def test_an_offset_moves_into_the_pointer_only_when_it_keeps_it_aligned():
    """A temporary read at an offset that is not a multiple of the alignment
    keeps the offset in its indices (the template's alignment promise would be
    false); an input may move any offset."""
    from te_autodiff.expr import Var, const
    i = Var("i", "int64")
    out = Buffer("out", (8,), "float32", "output")
    src_temp = Buffer("t", (64,), "float32", "temp")
    src_input = Buffer("x", (64,), "float32", "input")
    for src, moved in ((src_temp, {3: 0, 16: 16}), (src_input, {3: 3, 16: 16})):
        for off, want in moved.items():
            body = For(i, const(0, "int64"), const(8, "int64"),
                       Store(out, i, BufLoad(src, i + const(off, "int64"))), "parallel")
            f = share.form(Stage("out", out, body), 64)
            assert dict(f.slots)[src] == want, (src.kind, off)


def test_steps_at_offset_zero_and_with_their_terms_in_another_order_are_one_template():
    """The first step reads ``x[b*8 + i]``, a later one ``x[16 + i + b*8]``:
    one template (the slot is flat, its text canonical).  A step whose index
    differs in more than the offset is another."""
    from te_autodiff.expr import Var, const
    i, b = Var("i", "int64"), Var("b", "int64")
    x = Buffer("x", (4, 8), "float32", "input")
    c = lambda v: const(v, "int64")     # noqa: E731

    def stage(n, index):
        out = Buffer(f"y{n}", (2, 8), "float32", "temp")
        body = For(b, c(0), c(2), For(i, c(0), c(8), Store(out, b * c(8) + i, BufLoad(x, index))), "parallel")
        return Stage(out.name, out, body)

    first = stage(0, b * c(8) + i)
    later = stage(1, c(16) + i + b * c(8))
    other = stage(2, c(16) + i + b * c(4))
    groups = share.group([first, later, other], 64)
    assert [[m.stage.name for m in members] for _, members in groups] == [["y0", "y1"], ["y2"]]
    template, members = groups[0]
    assert [dict(m.slots)[x] for m in members] == [0, 16]
    assert share.slot_buffers(template)[1].shape == (16,)      # the fewest elements past a pointer: 32 - 16


def test_an_alignment_gap_in_a_template_is_that_of_each_instances_buffer():
    """Stages that read ``X`` at element 4, 20 and 8 and store ``align_gap(X,
    64)``: the offsets move into the slot's pointer, so the template's gap
    is the pointer's, corrected by the offset it moved (4 and 20, equal
    modulo a line of elements, share one template; 8 has its own).  Each
    stage gives the gap of ``X`` itself for every placement of ``X``."""
    from dataclasses import replace

    from lowering import runtime
    from lowering.codegen_llvm import stage_groups
    from lowering.loop_ir import AlignGap, map_stmt
    from lowering.lower import lower
    from te_autodiff.expr import cast, compare, const, select

    X = te.placeholder((64,), "float32", "X")
    plain = lower([X], [te.compute((1,), lambda i, c=c: X[i + c] * 1.5, name=f"Y{c}") for c in (4, 20, 8)])

    def store(s, expr):      # the gap, behind a test the read keeps (X is never that large)
        v = expr(s.value)
        return Store(s.buffer, expr(s.index),
                     select(compare("gt", v, const(1e30, "float32")), v, cast("float32", AlignGap(plain.inputs[0], 64))))

    program = replace(plain, stages=tuple(replace(st, body=map_stmt(st.body, lambda e: e, store=store))
                                          for st in plain.stages))
    assert [len(members) for _, members in stage_groups(program, te.target())] == [2, 1]
    compiled = runtime.compile_program(program, te.target())
    for offset in range(0, 64, 4):
        flat = runtime._aligned((256 + 64,), np.uint8, 64)[0]
        x = flat[offset:offset + 256].view(np.float32)
        x[...] = 1.0
        storage = runtime.execute(program, compiled, [x])
        assert [storage[b][0] for b in program.results] == [(-offset) % 64 // 4] * 3, offset
