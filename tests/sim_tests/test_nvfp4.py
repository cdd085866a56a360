"""NVFP4 blocks (sim.nvfp4) worked by hand; tests/sim_tests/test_torchao_blocks.py holds them to
torchao's quantiser bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from sim import Fpu, formats, nvfp4


def test_a_tensor_worked_by_hand() -> None:
    """amax 2688 = 448 * 6: tensor scale 1. Block 0 (amax 2688): scale 2688 / 6 = 448, elements
    x / 448; block 1 (amax 3): scale 0.5, elements 2x; 1.25 * 2 = 2.5 is a tie between 2 and 3
    (to even: 2), 0.3 * 2 = 0.6 rounds to 0.5; block 2 (zeros): scale clamped to 2**-6."""
    x = np.zeros(48, np.float32)
    x[0], x[1] = 2688, -896  # 6 and -2 at scale 448
    x[16], x[17], x[18] = 3.0, 1.25, 0.3
    q = nvfp4.quantize(x)
    assert q.tensor_scale == 1 and q.clamped == 0
    assert formats.decode(q.scales, "float8_e4m3fn").tolist() == [448.0, 0.5, 2.0**-6]
    e2m1 = formats.decode(q.elements, "float4_e2m1fn")
    assert e2m1[[0, 1, 16, 17, 18]].tolist() == [6.0, -2.0, 6.0, 2.0, 0.5]
    assert nvfp4.dequantize(q)[[0, 1, 16, 17, 18]].tolist() == [2688.0, -896.0, 3.0, 1.0, 0.25]


def test_tensor_scale_and_single_level() -> None:
    assert nvfp4.tensor_scale(2688.0) == 1 and nvfp4.tensor_scale(5376.0) == 2
    x = np.linspace(-5, 5, 32, dtype=np.float32)
    assert nvfp4.quantize(x, two_level=False).tensor_scale == 1
    assert nvfp4.quantize(x, two_level=0.5).tensor_scale == np.float32(0.5)
    assert nvfp4.quantize(np.zeros(16, np.float32)).tensor_scale == 1  # zeros: scale 1, not 0 / 0


def test_sixteen_by_sixteen_tiles_share_a_scale() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((32, 48)).astype(np.float32)
    w[3, 20] = 40.0  # raises the scale of the tile of rows 0-15, columns 16-31
    q = nvfp4.quantize(w, tile=16)
    assert q.scales.shape == (32, 3)
    assert np.all(q.scales[:16] == q.scales[0]) and np.all(q.scales[16:] == q.scales[16])
    rows = nvfp4.quantize(w)  # 1 x 16 blocks: rows 0-15 of tile (0, 1) would differ
    assert q.scales[0, 1] == rows.scales[3, 1] and np.any(rows.scales[:16, 1] != q.scales[0, 1])
    with pytest.raises(ValueError, match="tile must be 1 .* or 16 .*, got 8"):
        nvfp4.quantize(w, tile=8)
    with pytest.raises(ValueError, match="got 16 for a 1-D array"):
        nvfp4.quantize(w[0], tile=16)
    with pytest.raises(TypeError, match="got float64"):
        nvfp4.quantize(w.astype(np.float64))


def test_stochastic_elements_are_a_neighbour_and_reproducible() -> None:
    x = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
    a = nvfp4.quantize(x, rounding="stochastic", fpu=Fpu(seed=5))
    b = nvfp4.quantize(x, rounding="stochastic", fpu=Fpu(seed=5))
    nearest = nvfp4.quantize(x)
    assert np.array_equal(a.elements, b.elements) and np.array_equal(a.scales, nearest.scales)
    scale = np.repeat(formats.decode(a.scales, "float8_e4m3fn"), 16, axis=1) * float(a.tensor_scale)
    y = x / scale  # what was rounded, nearly (the reciprocal rounds)
    got = formats.decode(a.elements, "float4_e2m1fn")
    grid = np.array(sorted({float(v) for v in formats.decode(np.arange(16, dtype=np.uint8), "float4_e2m1fn")}))
    lo = grid[np.clip(np.searchsorted(grid, y, side="right") - 1, 0, grid.size - 1)]
    hi = grid[np.clip(np.searchsorted(grid, y, side="left"), 0, grid.size - 1)]
    assert np.all((got == lo) | (got == hi)) and np.any(a.elements != nearest.elements)
