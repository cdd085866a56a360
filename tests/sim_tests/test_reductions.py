"""Device.sum and Device.mean against their definition: the same pairwise tree of Device.add calls."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import Device

DTYPES = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)]
UINT = {2: np.uint16, 4: np.uint32}


def _device(mode: str) -> Device:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Device("atlas-training") if mode == "saturation" else Device("atlas-a2", overflow="inf_nan")


def _specials(dtype: np.dtype) -> list[float]:
    """NaN (quiet and signaling), +-Inf, +-MAX, subnormals, the smallest normal, zeros and ordinary values."""
    info = ml_dtypes.finfo(dtype)
    tiny, sub = float(info.smallest_normal), float(info.smallest_subnormal)
    big = float(info.max)
    return [np.nan, np.inf, -np.inf, big, -big, big / 2, tiny, -tiny, sub, -sub, tiny - sub, 0.0, -0.0, 1.0, -1.0, 3.0]


def _array(dtype: np.dtype, values: list, snan: list[bool]) -> np.ndarray:
    x = np.array(values, np.float64).astype(dtype)
    bits = x.view(UINT[dtype.itemsize])
    quiet = bits.dtype.type(1 << (ml_dtypes.finfo(dtype).nmant - 1))
    for i, s in enumerate(snan):
        if s and np.isnan(x[i]):  # the quiet bit off, a payload bit on: a signaling NaN
            bits[i] = (bits[i] & ~quiet) | bits.dtype.type(1)
    return x


def _tree(dev: Device, cols: list[np.ndarray]) -> np.ndarray:
    """Adjacent pairs, then pairs of pairs; an odd last one goes up a level as it is."""
    while len(cols) > 1:
        pairs = [dev.add(cols[2 * i], cols[2 * i + 1]) for i in range(len(cols) // 2)]
        cols = pairs + cols[-1:] if len(cols) % 2 else pairs
    return cols[0]


def _register(dev: Device) -> tuple:
    return int(dev.status), tuple(int(v) for v in dev.get_float_status()[:3])


def _compare(dev: Device, x: np.ndarray, mean: bool) -> None:
    dtype = x.dtype
    dev.clear_status()
    dev.clear_float_status()
    got = (dev.mean if mean else dev.sum)(x, axis=0)
    got_reg = _register(dev)
    dev.clear_status()
    dev.clear_float_status()
    total = _tree(dev, [x[i] for i in range(x.shape[0])])
    if mean:
        want = dev.div(total, np.full(total.shape, x.shape[0], dtype))  # the count is exact here: one rounding
    else:
        want = dev.cast(total, dtype)  # the total in the result's settings (a lone element too)
    uint = UINT[dtype.itemsize]
    assert got.view(uint).tolist() == want.view(uint).tolist(), (x, got, want)
    assert got_reg == _register(dev), (x, got_reg, _register(dev))


@st.composite
def _cases(draw) -> tuple[str, np.ndarray, bool]:
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(1, 9))
    cols = draw(st.integers(1, 3))
    pool = _specials(dtype)
    value = st.one_of(st.sampled_from(pool), st.floats(-1e4, 1e4, width=32))
    values = draw(st.lists(st.lists(value, min_size=cols, max_size=cols), min_size=n, max_size=n))
    snan = draw(st.lists(st.booleans(), min_size=n * cols, max_size=n * cols))
    x = _array(dtype, [v for row in values for v in row], snan).reshape(n, cols)
    return draw(st.sampled_from(["saturation", "inf_nan"])), x, draw(st.booleans())


@given(case=_cases())
@settings(max_examples=100, deadline=None)
def test_sum_and_mean_are_the_tree_of_device_adds(case) -> None:
    mode, x, mean = case
    _compare(_device(mode), x, mean)


@pytest.mark.parametrize("mode", ["saturation", "inf_nan"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sum_of_specials_pairwise(mode: str, dtype: np.dtype) -> None:
    """Every pair and triple start of the special values, as columns of one call."""
    dev = _device(mode)
    pool = _specials(dtype)
    pairs = np.array([[a, b] for a in pool for b in pool], np.float64).T.astype(dtype)
    triples = np.array([[a, b, 2.0] for a in pool for b in pool], np.float64).T.astype(dtype)
    for x in (pairs, triples):
        for mean in (False, True):
            _compare(dev, x, mean)


def test_saturation_does_not_saturate_the_operands() -> None:
    dev = Device("atlas-training")
    for dtype in DTYPES:
        assert float(dev.sum(np.array([np.nan, 1, 2], dtype))) == 2.0  # NaN + 1 -> 0, then 0 + 2
        dev.clear_float_status()
        dev.clear_status()
        assert float(dev.sum(np.array([np.inf, np.inf], dtype))) == float(ml_dtypes.finfo(dtype).max)
        assert int(dev.status) == 0 and not dev.get_float_status()[:3].any()  # Inf + Inf is exact


def _wide_tree(dev: Device, x: np.ndarray, acc, out, mean: bool):
    """The definition of a sum in another accumulator: the exact widenings added by an INF/NaN
    device's tree in ``acc``, the total (divided by the count for a mean) cast by ``dev``."""
    ieee = _device("inf_nan")
    wide = x.astype(np.float64).astype(acc)  # exact: binary16 and bfloat16 widen into binary32
    total = _tree(ieee, [wide[i:i + 1] for i in range(x.size)])
    if mean:
        total = ieee.div(total, np.full(1, x.size, acc))
    dev.clear_status()
    dev.clear_float_status()
    got = dev.cast(total, out)[0]
    status = _register(ieee)[0] | _register(dev)[0]
    return got, (status, tuple(a | b for a, b in zip(_register(ieee)[1], _register(dev)[1], strict=True)))


@given(values=st.lists(st.sampled_from(_specials(np.dtype(np.float16))) | st.floats(-65504, 65504, width=16),
                       min_size=1, max_size=9),
       mode=st.sampled_from(["saturation", "inf_nan"]), mean=st.booleans())
@settings(max_examples=200, deadline=None)
def test_another_accumulator_is_ieee_inside_and_the_mode_applies_to_the_total(values, mode, mean) -> None:
    """accumulate=float32 of binary16 elements: exact widening, IEEE additions, one mode at the end
    (the register and the IEEE status: INEXACT inside the sums too)."""
    dev = _device(mode)
    x = np.array(values, np.float16)
    got = (dev.mean if mean else dev.sum)(x, accumulate=np.float32, out_dtype=np.float16)
    reg = _register(dev)
    want, want_reg = _wide_tree(dev, x, np.float32, np.float16, mean)
    assert got.view(np.uint16) == want.view(np.uint16) and reg == want_reg, (x, got, want, reg, want_reg)


@pytest.mark.parametrize(("values", "total", "register"), [
    ([np.nan, 1, 2], 0.0, (0, 0, 0)),  # NaN to the end, then 0: in any order
    ([1, 2, np.nan], 0.0, (0, 0, 0)),
    ([np.inf, -np.inf], 0.0, (0, 1, 0)),  # Inf - Inf is INVALID
    ([np.inf, np.inf], 65504.0, (0, 0, 0)),  # an infinity of infinite operands is no overflow
    ([65504, 65504], 65504.0, (1, 0, 0)),  # 131008 is finite in binary32 and overflows binary16
    ([np.inf], 65504.0, (0, 0, 0)),
])
def test_saturation_with_a_binary32_accumulator_by_hand(values, total, register) -> None:
    dev = Device("atlas-training")
    x = np.array(values, np.float16)
    assert float(dev.sum(x, accumulate=np.float32)) == total and _register(dev)[1] == register
    dev.clear_float_status()
    mean = float(dev.mean(x, accumulate=np.float32))  # [Inf, Inf] -> Inf / 2 = Inf -> MAX, as [Inf] gives
    assert mean == (total if values[0] != 65504 else 65504.0)
