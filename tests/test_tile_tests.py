"""Tile tests (``lowering/schedule/tile_tests.py``): a mask on a register
tile's row and column that guards a reduction runs each tile in the version
its value over the whole tile allows."""
import re

import numpy as np
import pytest

import te_autodiff as te

MASKS = {
    "causal": (lambda i, j: j <= i, lambda i, j: j <= i),
    "shifted": (lambda i, j: j >= i + 3, lambda i, j: j >= i + 3),
    "band": (lambda i, j: te.all(i - 20 <= j, j <= i), lambda i, j: (i - 20 <= j) & (j <= i)),
}


def masked_scores(n, m, d, mask, dtype):
    """``S[i, j] = mask(i, j) ? sum_k Q[i, k] K[j, k] : -1e4``, attention's
    masked scores."""
    Q, K = te.placeholder((n, d), dtype, "Q"), te.placeholder((m, d), dtype, "K")
    k = te.reduce_axis(d, "k")
    return [Q, K], te.compute((n, m), lambda i, j: te.if_then_else(
        MASKS[mask][0](i, j), te.sum(Q[i, k] * K[j, k], axis=k), -1e4), name="S")


@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_masked_products_skip_masked_tiles_and_share_the_rest(rng, mask, dtype):
    """Tiles wholly inside the mask run the product jammed (one reduction
    loop for the whole tile), tiles wholly outside store the constant, the
    tiles the boundary crosses test each element; the sizes leave partial
    tiles at the ends.  Values as numpy's."""
    n, m, d = 45, 83, 19
    inputs, S = masked_scores(n, m, d, mask, dtype)
    kernel = te.build(inputs, [S])
    stage = kernel.scheduled_ir.split("stage S:")[1]
    vectors = stage.split("simd[")[1:]
    assert any(v.count("for k in") == 1 and re.search(r"acc\d+\.\d+\.1:", v) for v in vectors), stage[:2000]
    assert any("for k in" not in v and "-10000.0" in v for v in vectors), stage[:2000]     # masked tiles: stores only
    q, k = rng.standard_normal((n, d)).astype(dtype), rng.standard_normal((m, d)).astype(dtype)
    i, j = np.meshgrid(np.arange(n), np.arange(m), indexing="ij")
    want = np.where(MASKS[mask][1](i, j), q.astype(np.float64) @ k.T.astype(np.float64), -1e4)
    eps = np.finfo(dtype).eps
    bound = d * eps * (np.abs(q).astype(np.float64) @ np.abs(k).T.astype(np.float64))
    assert np.all(np.abs(kernel(q, k) - want) <= 2 * bound + 1e-300)
