"""HiF4 blocks (sim.hif4) bit for bit against the published reference quantiser, and by hand."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from paths import DATA  # tests/ is on the path (conftest.py)

from sim import hif4

#: The reference quantiser's outputs on chosen blocks (tests/data/make_hif4.py made them).
REFERENCE = np.load(DATA / "hif4.npz")


def test_blocks_are_the_reference_quantisers_bit_for_bit() -> None:
    x, want = REFERENCE["x"], REFERENCE["y"]
    q = hif4.quantize(x)
    got = hif4.dequantize(q).view(np.uint32)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{len(bad)} values differ; first block {bad[0][0]}, value {x[tuple(bad[0])]!r}"
    # the data reach the places that matter: both micro-exponents, the scale's clips, signed zeros
    assert q.level2.any() and not q.level2.all() and q.level3.any() and not q.level3.all()
    scales = hif4.E6M2.values[q.scales]
    assert scales.min() == 2.0**-48 and scales.max() == 49152
    assert np.signbit(want.view(np.float32)[want.view(np.float32) == 0]).any()


def test_a_block_worked_by_hand() -> None:
    """amax 7: scale bf16(7 * bf16(1/7)) = bf16(0.998046875) = 1 (a tie, to even); the group holding
    7 has level 2 (7 >= 4) and its group of 4 level 3 (7 / 2 >= 2); 0.125 is half way between 0
    and 0.25 and rounds up (floor(m * 4 + 0.5)); 1.9 caps at 1.75; -0.05 becomes -0."""
    x = np.zeros(64, np.float32)
    x[:4] = [0.125, 0.375, 1.9, -0.05]
    x[60] = 7.0
    q = hif4.quantize(x)
    assert q.scales.tolist() == [48 << 2]  # E6M2 1.0: exponent field 48, fraction 0
    assert q.level2.tolist() == [[0] * 7 + [1]] and q.level3.tolist() == [[0] * 15 + [1]]
    assert q.elements[:4].tolist() == [0x1, 0x2, 0x7, 0x8] and q.elements[60] == 0x7  # 7 = 1.75 * 2 * 2
    y = hif4.dequantize(q)
    assert y[:4].tolist() == [0.25, 0.5, 1.75, -0.0] and np.signbit(y[3]) and y[60] == 7.0


def test_non_finite_blocks_are_nan_and_the_others_untouched() -> None:
    x = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)
    bad = x.copy()
    bad[1, 7], bad[2, 0] = np.nan, -np.inf
    q = hif4.quantize(bad)
    assert q.scales[1:].tolist() == [[0xFF], [0xFF]] and q.scales[0, 0] != 0xFF
    y = hif4.dequantize(q)
    assert np.isnan(y[1:]).all() and np.array_equal(y[0], hif4.dequantize(hif4.quantize(x[:1]))[0])


def test_axes_padding_and_input_types() -> None:
    x = np.random.default_rng(4).standard_normal((100, 5)).astype(np.float32)
    along0 = hif4.dequantize(hif4.quantize(x, axis=0))
    assert np.array_equal(along0, hif4.dequantize(hif4.quantize(x.T)).T)
    padded = np.concatenate([x.T, np.zeros((5, 28), np.float32)], axis=1)
    assert np.array_equal(along0.T, hif4.dequantize(hif4.quantize(padded))[:, :100])
    q = hif4.quantize(x, axis=0)
    assert q.elements.shape == (100, 5) and q.scales.shape == (5, 2) and q.level3.shape == (5, 2, 16)
    assert np.array_equal(hif4.quantize(x.astype(ml_dtypes.bfloat16)).scales,
                          hif4.quantize(x.astype(ml_dtypes.bfloat16).astype(np.float32)).scales)
    with pytest.raises(TypeError, match="binary32, binary16 or bfloat16 arrays, got float64"):
        hif4.quantize(x.astype(np.float64))
    with pytest.raises(ValueError, match="at least one axis"):
        hif4.quantize(np.float32(1))


def test_the_scale_format_e6m2() -> None:
    """Six exponent bits of bias 48, two fraction bits, no zero, 0xFF NaN: 2**-48 to 1.75 * 2**15."""
    v = hif4.E6M2.values
    assert v[0] == 2.0**-48 and v[1] == 1.25 * 2.0**-48 and v[48 << 2] == 1.0 and np.isnan(v[0xFF])
    assert v[0xFE] == 1.5 * 2.0**15 == 49152 and np.all(np.diff(v[:0xFF]) > 0)
