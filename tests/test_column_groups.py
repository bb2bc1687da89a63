"""Column groups (``lowering/schedule/column_groups.py``): a GEMM whose rows
run in blocks re-reads its column operand once per block; beyond the
threads' share of L3 its column tiles split into groups, a stage each,
whose slice of that operand fits the share.  The values are those of the
GEMM run as one stage, bit for bit."""
from dataclasses import replace

import numpy as np
import pytest

import te_autodiff as te
from lowering.schedule import TILE_VECTORS, blocking

STEPS = 256                  # reduction steps: far from a K block on every target below


def _gemm(name: str, tiles: int, l3_tiles: int, short: int = 0):
    """``C = A B`` for ``name`` (two threads) whose column operand is
    ``tiles`` column tiles wide (the last ``short`` columns short of it), on
    a target whose threads' L3 share holds ``l3_tiles`` of them (0: no L3);
    the rows make four row blocks."""
    target = replace(te.target(name), threads=2)
    bl = blocking(target)
    width = TILE_VECTORS * target.lanes(4)
    target = replace(target, l3_bytes=STEPS * l3_tiles * width * 4 // target.threads)
    rows = 4 * bl.row_block_bytes // (STEPS * 4)
    A = te.placeholder((rows, STEPS), "float32", "A")
    B = te.placeholder((STEPS, tiles * width - short), "float32", "B")
    k = te.reduce_axis(STEPS, "k")
    C = te.compute((rows, tiles * width - short), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return te.build([A, B], [C], target=target)


def _column_loops(kernel):
    """``(stage name, column tile loop's header)`` of each stage writing ``C``."""
    out = []
    for st in kernel.program.stages:
        if st.buffer.name == "C":
            lines = kernel.scheduled_ir.split(f"stage {st.name}:\n", 1)[1].splitlines()
            out.append((st.name, st.apart, next(ln.strip() for ln in lines if "for j.o" in ln)))
    return out


@pytest.mark.parametrize("name", ["haswell", "skylake-avx512"])
@pytest.mark.parametrize("tiles, short, groups", [(4, 0, None), (5, 0, (3, 2)), (5, 3, (3, 2)), (9, 0, (3, 3, 3))])
def test_a_column_operand_beyond_the_l3_share_runs_in_groups(rng, name, tiles, short, groups):
    """The share holds four column tiles' slice of ``B``: four tiles run as
    one stage (at the share, not beyond it); five make two groups of three
    and two tiles (the last partial, three columns short, in the second),
    nine three of three, each its own stage (``apart``, so row chains leave
    them apart) over every block of rows.  The values are the one-stage
    GEMM's (no L3 figure), bit for bit, and numpy's."""
    kernel = _gemm(name, tiles, 4, short)
    loops = _column_loops(kernel)
    if groups is None:
        assert [(n, apart) for n, apart, _ in loops] == [("C", False)]
    else:
        assert [n for n, _, _ in loops] == [f"C.cols{g}" for g in range(len(groups))]
        assert all(apart for _, apart, _ in loops)
        assert [header.split("in 0..")[1].rstrip(":") for _, _, header in loops] == [str(n) for n in groups]
    if kernel.target.missing_on_host() is None:
        one = _gemm(name, tiles, 0, short)
        assert [n for n, _, _ in _column_loops(one)] == ["C"]
        a = rng.standard_normal(kernel.inputs[0].shape).astype(np.float32)
        b = rng.standard_normal(kernel.inputs[1].shape).astype(np.float32)
        got = kernel(a, b)
        np.testing.assert_array_equal(got, one(a, b))
        np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4 * np.sqrt(STEPS))


def test_a_gemm_in_one_block_of_rows_keeps_one_stage():
    """Rows in one block read the column operand once, however large: no
    groups, whatever the L3 share."""
    target = replace(te.target("haswell"), threads=2, l3_bytes=4096)
    A = te.placeholder((24, STEPS), "float32", "A")
    B = te.placeholder((STEPS, 512), "float32", "B")
    k = te.reduce_axis(STEPS, "k")
    C = te.compute((24, 512), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    kernel = te.build([A, B], [C], target=target)
    assert [st.name for st in kernel.program.stages if st.buffer.name == "C"] == ["C"]
