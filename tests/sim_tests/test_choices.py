"""The implementation-defined choices in one place (sim.rounding.Choices): a product's are its
profile's, every unit of a device computes with them, and each can be changed by name."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim import Device, Flag, Fpu, OverflowMode, profiles
from sim.rounding import Choices, Tininess

H = np.float16
# 0x3BFE * 0x0401 = 2**-14 * (1 - 2**-20): below binary16's smallest normal before rounding, 2**-14
# after (an unbounded exponent rounds it up), so only tininess before rounding calls it an underflow.
TINY_A, TINY_B = np.array([0x3BFE], np.uint16).view(H), np.array([0x0401], np.uint16).view(H)


def test_every_product_makes_the_documented_choices() -> None:
    for p in profiles.PROFILES.values():  # the 350's CTRL bit 48 does not cover binary32 compute
        assert p.choices == Choices(default_nan=0x7E00, tininess=Tininess.AFTER, nan_to_zero=True,
                                    saturate_float32=p.name != "atlas-350")
        assert Device(p.name, p.default_overflow_mode).choices == p.choices


def test_tininess_reaches_every_unit_of_the_device() -> None:
    default, before = Device("atlas-a2"), Device("atlas-a2", tininess="before")
    assert {u.tininess for u in before._fpus.values()} == {Tininess.BEFORE}
    assert {u.tininess for u in default._fpus.values()} == {Tininess.AFTER}
    default.mul(TINY_A, TINY_B)
    before.mul(TINY_A, TINY_B)
    assert default.status == Flag.INEXACT and before.status == Flag.INEXACT | Flag.UNDERFLOW


def test_a_profile_with_other_choices_drives_the_device() -> None:
    own = dataclasses.replace(profiles.get("atlas-a2"), choices=Choices(tininess="before", default_nan=0xFE00))
    dev = Device(own)
    dev.mul(TINY_A, TINY_B)
    assert dev.status & Flag.UNDERFLOW
    nan = dev.sub(np.array([np.inf], H), np.array([np.inf], H))
    assert nan.view(np.uint16).tolist() == [0xFE00]
    assert Device(own, default_nan=0x7E01).sub(np.array([np.inf], H), np.array([np.inf], H)).view(
        np.uint16).tolist() == [0x7E01]  # a name given to the device changes its profile's choice


def test_nan_in_saturation_mode_and_binary32s_overflow_mode_are_choices() -> None:
    inf, zero = np.array([np.inf], H), np.array([0.0], H)
    assert Device("atlas-training").mul(zero, inf).tolist() == [0.0]  # NaN -> 0, Ascend's rule
    assert np.isnan(Device("atlas-training", nan_to_zero=False).mul(zero, inf)).all()
    big = np.array([3e38], np.float32)
    assert Device("atlas-training").add(big, big).tolist() == [float(np.finfo(np.float32).max)]
    assert Device("atlas-training", saturate_float32=False).add(big, big).tolist() == [np.inf]


def test_a_unit_alone_takes_its_choices_too() -> None:
    kept = Fpu(OverflowMode.SATURATION, choices=Choices(nan_to_zero=False))
    assert np.isnan(kept.mul(H(0), H(np.inf)))
    assert Fpu(OverflowMode.SATURATION).mul(H(0), H(np.inf)) == 0
    assert Fpu(choices=Choices(tininess="before")).tininess is Tininess.BEFORE
    assert Fpu(OverflowMode.INF_NAN, tininess="after", choices=Choices(tininess="before")).tininess \
        is Tininess.AFTER  # a name given to the unit wins


def test_bad_choices_say_what_is_valid() -> None:
    with pytest.raises(TypeError, match="unknown choice rounding; the choices are default_nan, tininess"):
        Choices().replace(rounding="odd")
    with pytest.raises(ValueError, match="nan_to_zero must be a bool"):
        Choices(nan_to_zero="yes")
    with pytest.raises(ValueError, match="unknown Tininess .sometimes.; valid: AFTER"):
        Device("atlas-a2", tininess="sometimes")
    with pytest.raises(TypeError, match="choices must be a sim.rounding.Choices"):
        Fpu(choices={"tininess": "before"})
    assert Choices().replace(tininess=None) == Choices()  # None leaves a choice as it is


def test_the_atlas_350_ctrl_bits() -> None:
    """CTRL bit 60 enables the control, bit 48 = 0 saturates, bit 50 = 1 keeps NaN (Ascend C
    SetCtrlSpr); binary32 compute is not what bit 48 covers, so the 350 keeps it in INF/NaN mode."""
    from sim import Device, OverflowMode, profiles

    assert profiles.ctrl_settings(0) == {} and profiles.ctrl_settings(1 << 48) == {}
    assert profiles.ctrl_settings(1 << 60) == {"overflow": OverflowMode.SATURATION, "nan_to_zero": True}
    assert profiles.ctrl_settings(1 << 60 | 1 << 48) == {"overflow": OverflowMode.INF_NAN, "nan_to_zero": True}
    assert profiles.ctrl_settings(1 << 60 | 1 << 50) == {"overflow": OverflowMode.SATURATION, "nan_to_zero": False}
    with pytest.raises(ValueError, match="ctrl"):
        profiles.ctrl_settings(-1)
    dev = Device("atlas-350", **profiles.ctrl_settings(1 << 60 | 1 << 50))
    x = np.array([np.inf, np.nan, 70000.0], np.float32)
    assert dev.cast(x, np.float16).tolist()[0] == 65504 and np.isnan(dev.cast(x, np.float16)[1])
    big = np.array([3e38], np.float32)
    assert np.isinf(dev.add(big, big)[0])  # binary32 stays in INF/NaN mode on the 350
    assert Device("atlas-a2", "saturation").add(big, big)[0] == np.finfo(np.float32).max
    assert not profiles.get("atlas-350").choices.saturate_float32
    assert set(profiles.CTRL_SATURATED) <= {*profiles.get("atlas-350").eight_bit, "binary16", "bfloat16"}
