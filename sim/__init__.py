"""The hardware model: a bit-accurate binary16 emulator, Atlas profiles, a simulated NPU."""

from . import profiles
from .collective import Group
from .device import PHASES, Device, Event, LegacyModeWarning, current_device
from .formats import BFLOAT16, BINARY16, BINARY32, BINARY64, Format, format_of
from .fpu import Fpu
from .rounding import Flag, OverflowMode, Rounding, Tininess, round_float64

__all__ = [
    "Device", "Group", "current_device", "LegacyModeWarning", "profiles", "Event", "PHASES",
    "Fpu", "Flag", "Rounding", "OverflowMode", "Tininess", "round_float64",
    "Format", "format_of", "BINARY16", "BFLOAT16", "BINARY32", "BINARY64",
]
