"""The hardware model: a bit-accurate binary16 emulator, Atlas profiles, a simulated NPU."""

from .formats import BFLOAT16, BINARY16, BINARY32, BINARY64, Format, format_of
from .fpu import Fpu
from .rounding import Flag, OverflowMode, Rounding, Tininess, round_float64

__all__ = ["Fpu", "Flag", "Rounding", "OverflowMode", "Tininess", "Format", "format_of",
           "BINARY16", "BFLOAT16", "BINARY32", "BINARY64", "round_float64"]
