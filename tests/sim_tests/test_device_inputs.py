"""Inputs the device and the unit take or refuse: reduction axes, byte order, masked arrays."""

from __future__ import annotations

import numpy as np
import pytest

from sim import Device, Fpu

MASKED = "masked arrays are not supported.*filled.*compressed"


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
def test_reduction_axis_out_of_range_names_the_axis_and_the_range(op: str) -> None:
    dev = Device("atlas-a2")
    x = np.ones((2, 3), np.float16)
    for axis in (5, 2, -3):
        with pytest.raises(ValueError, match=rf"^{op}: axis {axis} is out of range for a 2-dimensional array; "
                                             r"valid: None or one integer from -2 to 1$"):
            getattr(dev, op)(x, axis=axis)
    for axis in (1.0, (0, 1), True):
        with pytest.raises(TypeError, match=rf"^{op}: axis must be None or one integer, got .*; valid: None"):
            getattr(dev, op)(x, axis=axis)
    with pytest.raises(ValueError, match=rf"^{op}: axis 0 .* 0-dimensional array; valid: None \(it has no axes\)"):
        getattr(dev, op)(np.float16(1), axis=0)
    assert getattr(dev, op)(x, axis=-1).shape == (2,) and getattr(dev, op)(x, axis=np.int64(0)).shape == (3,)


@pytest.mark.parametrize("dtype", ["f2", "f4"])
def test_big_endian_arrays_compute_as_native_ones(dtype: str) -> None:
    rng = np.random.default_rng(1)
    native = (rng.standard_normal((4, 4)) * 100).astype(f"={dtype}")
    native[0, :3] = [np.inf, np.nan, -0.0]
    big = native.astype(f">{dtype}")
    assert not big.dtype.isnative and np.array_equal(big, native, equal_nan=True)
    calls = [lambda d, x: d.add(x, x), lambda d, x: d.mul(x, native), lambda d, x: d.exp(x),
             lambda d, x: d.sum(x, axis=0), lambda d, x: d.mean(x), lambda d, x: d.amax(x, axis=1),
             lambda d, x: d.cast(x, np.float16), lambda d, x: d.cast(x, "float8_e4m3fn"), lambda d, x: d.lt(x, x),
             lambda d, x: d.relu(x), lambda d, x: d.cast(x[0, 0], np.float32)]
    for mode in ("atlas-a2", "atlas-training"):
        for call in calls:
            a, b = Device(mode), Device(mode)
            want, got = call(a, native), call(b, big)
            assert np.asarray(got).dtype.isnative
            assert np.array_equal(np.atleast_1d(got).view(np.uint8), np.atleast_1d(want).view(np.uint8))
            assert a.status == b.status and np.array_equal(a.get_float_status(), b.get_float_status())
    unit = Fpu(format=native.dtype)
    assert np.array_equal(unit.add(big, big), unit.add(native, native), equal_nan=True)
    assert np.array_equal(unit.convert(big, np.float64), unit.convert(native, np.float64), equal_nan=True)
    assert np.array_equal(Fpu().convert(native.astype(">f8"), np.float16), Fpu().convert(native.astype("f8"),
                                                                                         np.float16), equal_nan=True)


def test_big_endian_float16_matmul_and_conv() -> None:
    dev = Device("atlas-a2")
    a = np.arange(12, dtype=np.float16).reshape(3, 4)
    assert np.array_equal(dev.matmul(a.astype(">f2"), a.T.astype(">f2")), dev.matmul(a, a.T))
    x = np.ones((1, 1, 3, 3), np.float16)
    assert np.array_equal(dev.conv2d(x.astype(">f2"), x[:, :, :2, :2].astype(">f2")), dev.conv2d(x, x[:, :, :2, :2]))


def test_masked_arrays_are_refused_not_unmasked() -> None:
    m = np.ma.masked_array(np.array([1, 2, 3], np.float16), mask=[0, 1, 0])
    dev = Device("atlas-a2")
    calls = [lambda: dev.add(m, m), lambda: dev.add(m.data, m), lambda: dev.exp(m), lambda: dev.sum(m),
             lambda: dev.mean(m), lambda: dev.amax(m), lambda: dev.cast(m, np.float32), lambda: dev.relu(m),
             lambda: dev.lt(m, m), lambda: dev.matmul(m.reshape(1, 3), m.reshape(3, 1)),
             lambda: Fpu().add(m, m), lambda: Fpu().convert(m, "float8_e4m3fn"), lambda: Fpu().sqrt(m)]
    for call in calls:
        with pytest.raises(TypeError, match=MASKED):
            call()
    assert float(dev.sum(m.filled(0))) == 4.0 and float(dev.sum(m.compressed())) == 4.0
