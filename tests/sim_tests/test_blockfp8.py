"""Block-scaled FP8 (sim.blockfp8) against TE's compute_scale_from_amax, worked by hand."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from sim import blockfp8, formats


def test_scales_worked_by_hand() -> None:
    """fp8_max / amax in binary32; pow2 drops the fraction bits: 448 / 1000 = 0.448 = 1.792 * 2**-2 ->
    2**-2; amax 0, Inf or NaN -> 1; an infinite quotient (amax 1e-40) -> binary32's max, whose
    power of two is 2**127; eps raises amax."""
    amax = np.array([448, 1000, 0, np.inf, np.nan, 1e-40, 3.0], np.float32)
    assert blockfp8.scales(amax, 448.0).tolist() == [1.0, 0.25, 1.0, 1.0, 1.0, 2.0**127, 128.0]
    fp32 = blockfp8.scales(amax, 448.0, pow2=False)
    assert fp32[1] == np.float32(448) / np.float32(1000) and fp32[5] == np.finfo(np.float32).max
    assert blockfp8.scales(np.float32(0.5), 448.0, pow2=False, eps=1.0) == 448


def test_a_block_worked_by_hand() -> None:
    x = np.zeros((2, 128), np.float32)
    x[0, 0], x[0, 1] = 1000.0, -3.0  # scale 2**-2: 250 -> 256 (E4M3 has 240 and 256 there), -0.75
    x[1, 5] = 448.0
    q = blockfp8.quantize(x)
    assert q.scale_inv[:, 0].tolist() == [4.0, 1.0] and q.elements.dtype == ml_dtypes.float8_e4m3fn
    assert q.elements[0, :2].astype(np.float64).tolist() == [256.0, -0.75]
    assert blockfp8.dequantize(q)[0, :2].tolist() == [1024.0, -3.0] and blockfp8.dequantize(q)[1, 5] == 448


@pytest.mark.parametrize("pow2", [True, False])
@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
def test_no_block_saturates_and_the_largest_lands_near_max(fmt: str, pow2: bool) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 384)) * 2.0 ** rng.integers(-60, 60, (64, 1))).astype(np.float32)
    q = blockfp8.quantize(x, fmt, pow2=pow2)
    v = np.abs(q.elements.astype(np.float64))
    top = v.reshape(64, 3, 128).max(axis=-1)
    limit = formats.format_of(fmt).max
    assert np.all(v <= limit)
    assert np.all(top >= limit / 2) if pow2 else np.all(top >= limit * (1 - 2.0**-3))  # within a power of two


def test_tiles_axes_and_bad_input() -> None:
    w = np.random.default_rng(2).standard_normal((256, 200)).astype(np.float32)
    w[5, 150] = 100.0
    q = blockfp8.quantize(w, tile=128)
    assert q.scale_inv.shape == (256, 2) and np.all(q.scale_inv[:128, 1] == q.scale_inv[5, 1])
    assert np.all(q.scale_inv[128:, 1] == q.scale_inv[128, 1]) and q.scale_inv[5, 1] != q.scale_inv[200, 1]
    t = blockfp8.quantize(w, axis=0)
    assert np.array_equal(blockfp8.dequantize(t), blockfp8.dequantize(blockfp8.quantize(w.T)).T)
    with pytest.raises(ValueError, match="float8_e4m3fn or float8_e5m2, not float4_e2m1fn"):
        blockfp8.quantize(w, "float4_e2m1fn")
    with pytest.raises(ValueError, match="tile must be 1 .* or 128 .*, got 16"):
        blockfp8.quantize(w, tile=16)
