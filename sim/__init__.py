"""The hardware model: a bit-accurate binary16 emulator, Atlas profiles, a simulated NPU."""

from . import formats, profiles
from .collective import Group
from .device.core import Device, current_device
from .device.register import Event, LegacyModeWarning, Observer
from .formats import FORMATS, Format, format_of
from .fpu import Fpu
from .rounding import SIX_MODES, Flag, OverflowMode, Rounding, Tininess, round_float64

__all__ = [
    "Device", "Group", "current_device", "LegacyModeWarning", "profiles", "Event", "Observer",
    "Fpu", "Flag", "Rounding", "SIX_MODES", "OverflowMode", "Tininess", "round_float64",
    "Format", "format_of", "formats",
]

# Each format of the catalogue as a constant named by its name in capitals (sim.BINARY16,
# sim.FLOAT8_E4M3FN, sim.HIFLOAT8, ...): derived, so that a format is one catalogue entry.
globals().update({f.name.upper(): f for f in FORMATS})
__all__ += [f.name.upper() for f in FORMATS]
