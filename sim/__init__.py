"""The hardware model: a bit-accurate binary16 emulator, Atlas profiles, a simulated NPU."""

from . import formats, profiles
from .collective import Group
from .device.core import Device, current_device
from .device.register import Event, LegacyModeWarning, Observer
from .formats import (
    BFLOAT16,
    BINARY16,
    BINARY32,
    BINARY64,
    FLOAT4_E2M1FN,
    FLOAT6_E2M3FN,
    FLOAT6_E3M2FN,
    FLOAT8_E4M3FN,
    FLOAT8_E5M2,
    FLOAT8_E8M0FNU,
    HIFLOAT8,
    Format,
    format_of,
)
from .fpu import Fpu
from .rounding import SIX_MODES, Flag, OverflowMode, Rounding, Tininess, round_float64

__all__ = [
    "Device", "Group", "current_device", "LegacyModeWarning", "profiles", "Event", "Observer",
    "Fpu", "Flag", "Rounding", "SIX_MODES", "OverflowMode", "Tininess", "round_float64",
    "Format", "format_of", "formats", "BINARY16", "BFLOAT16", "BINARY32", "BINARY64",
    "FLOAT8_E4M3FN", "FLOAT8_E5M2", "FLOAT8_E8M0FNU", "FLOAT6_E3M2FN", "FLOAT6_E2M3FN", "FLOAT4_E2M1FN",
    "HIFLOAT8",
]
