"""Temporaries alive at different stages share bytes (lowering/temp_layout.py):
the placement never overlaps two temporaries alive together, a scan's time
loop keeps every temporary it touches for all its steps, and a kernel's
results are bit for bit those of a layout with every temporary apart."""
import functools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import te_autodiff as te
from benchmarks.kernels import KERNELS
from lowering import runtime
from lowering.loop_ir import stage_buffers
from lowering.pipeline import lower_for
from lowering.temp_layout import layout, lives, place


@st.composite
def blocks(draw):
    n = draw(st.integers(0, 12))
    sizes = draw(st.lists(st.integers(1, 64).map(lambda k: 64 * k), min_size=n, max_size=n))
    spans = []
    for _ in range(n):
        lo = draw(st.integers(0, 9))
        spans.append((lo, draw(st.integers(lo, 9))))
    return sizes, spans


@settings(max_examples=300, deadline=None)
@given(blocks())
def test_blocks_alive_together_never_overlap(case):
    sizes, spans = case
    offsets = place(sizes, spans)
    for a in range(len(sizes)):
        assert offsets[a] >= 0 and offsets[a] % 64 == 0
        for b in range(a):
            if spans[a][0] <= spans[b][1] and spans[b][0] <= spans[a][1]:
                assert offsets[a] + sizes[a] <= offsets[b] or offsets[b] + sizes[b] <= offsets[a]
    total = max((o + n for o, n in zip(offsets, sizes)), default=0)
    alive = max((sum(n for n, (lo, hi) in zip(sizes, spans) if lo <= t <= hi) for t in range(10)), default=0)
    assert alive <= total <= sum(sizes)


def test_blocks_alive_apart_take_the_same_bytes():
    assert place([128, 64, 64], [(0, 1), (2, 3), (2, 3)]) == [0, 0, 64]
    assert place([64, 128], [(0, 5), (5, 6)]) == [128, 0]             # one stage in common: apart


def matmul_loss(n):
    A, B, H = (te.placeholder((n, n), "float32", name) for name in "ABH")
    k = te.reduce_axis(n, "k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return [A, B, H], te.gradient(C, [A, B], head=H)


PROGRAMS = {"matmul": lambda: matmul_loss(256),                 # the benchmark's RNN and LSTM: scans and their
            "rnn": lambda: KERNELS[13].te_program(te),          # reverse scans
            "lstm": lambda: KERNELS[14].te_program(te)}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_kernels_results_are_those_of_every_temporary_apart(name, rng, monkeypatch):
    inputs, outputs = PROGRAMS[name]()
    arrays = [rng.standard_normal(t.shape).astype(t.dtype) for t in inputs]
    shared = te.build(inputs, outputs)
    program = shared.program
    temps = [b for b in program.buffers if b.kind == "temp"]
    span, (offsets, block) = lives(program), layout(program, 64)
    assert block < sum(-(-b.nbytes // 64) * 64 for b in temps)          # some share
    for a, (x, ox) in enumerate(offsets):
        for y, oy in offsets[:a]:
            if span[x][0] <= span[y][1] and span[y][0] <= span[x][1]:
                assert ox + x.nbytes <= oy or oy + y.nbytes <= ox, (x.name, y.name)
    monkeypatch.setattr(runtime, "layout", functools.partial(layout, share=False))
    apart = te.build(inputs, outputs)
    for _ in range(2):                              # a second call finds the block as the first left it
        for x, y in zip(shared(*arrays), apart(*arrays)):
            assert np.array_equal(x, y, equal_nan=True)


@pytest.mark.parametrize("name", ["rnn", "lstm"])
def test_the_temporaries_a_time_loop_touches_never_share(name):
    """A step's stages run again at the next step: whatever one of them
    touches is alive for the whole loop."""
    program = lower_for(*PROGRAMS[name]()).scheduled
    where = dict(layout(program, 64)[0])
    loops = {}
    for stage in program.stages:
        if stage.step is not None:
            loops.setdefault(stage.step, []).append(stage)
    assert any(len(stages) > 1 for stages in loops.values())
    for stages in loops.values():
        touched = {b for st in stages for b in stage_buffers(st)[0] if b.kind == "temp"}
        ranges = sorted((where[b], where[b] + b.nbytes) for b in touched)
        assert all(end <= start for (_, end), (start, _) in zip(ranges, ranges[1:]))


def test_te_cost_reports_the_shared_block():
    inputs, outputs = matmul_loss(256)
    built = te.cost(inputs, outputs)["built"]
    assert 0 < built["temp_block_bytes"] < built["temp_bytes"]
