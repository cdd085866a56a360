"""Binary interchange formats as data.

A :class:`Format` is a small frozen value: the exponent and fraction widths and
the numpy dtype that stores it. Everything else (bias, limits, bit masks) is
derived, so binary16, bfloat16 and binary32 are three constants, not three
implementations. Only IEEE-style formats are described (all-ones exponent is
Inf/NaN); formats without infinities (OCP E4M3) would need a field for that.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import ml_dtypes
import numpy as np

__all__ = ["Format", "BINARY16", "BFLOAT16", "BINARY32", "BINARY64", "FORMATS", "format_of"]


@dataclass(frozen=True)
class Format:
    """An IEEE 754 style binary format: 1 sign bit, ``exp_bits``, ``man_bits``."""

    name: str
    exp_bits: int
    man_bits: int
    dtype: np.dtype

    @property
    def width(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def precision(self) -> int:
        """Significand bits including the implicit one (11 for binary16)."""
        return self.man_bits + 1

    @property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (-14 for binary16)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        return self.bias

    @property
    def qmin(self) -> int:
        """Exponent of the smallest subnormal, the finest quantum (-24 for binary16)."""
        return self.emin - self.man_bits

    @cached_property
    def uint(self) -> np.dtype:
        """Unsigned integer dtype of the same width, for bit views."""
        return np.dtype(f"u{self.width // 8}")

    @property
    def sign_bit(self) -> int:
        return 1 << (self.width - 1)

    @property
    def inf_bits(self) -> int:
        """Bit pattern of +Inf; every magnitude at or above it is Inf or NaN."""
        return ((1 << self.exp_bits) - 1) << self.man_bits

    @property
    def max_bits(self) -> int:
        """Bit pattern of the largest finite value (0x7BFF for binary16)."""
        return self.inf_bits - 1

    @property
    def quiet_bit(self) -> int:
        return 1 << (self.man_bits - 1)

    @property
    def default_nan(self) -> int:
        """The canonical quiet NaN, positive (0x7E00 for binary16)."""
        return self.inf_bits | self.quiet_bit

    @cached_property
    def max(self) -> float:
        return float((2 - 2.0**-self.man_bits) * 2.0**self.emax)

    @cached_property
    def tiny(self) -> float:
        """Smallest positive normal number."""
        return 2.0**self.emin

    @property
    def sum_exact_in_float64(self) -> bool:
        """Whether the sum of any two finite values is exact in binary64."""
        return self.emax - self.qmin + 2 <= 53

    def __repr__(self) -> str:
        return f"Format({self.name!r}: e{self.exp_bits}m{self.man_bits})"


BINARY16 = Format("binary16", 5, 10, np.dtype(np.float16))
BFLOAT16 = Format("bfloat16", 8, 7, np.dtype(ml_dtypes.bfloat16))
BINARY32 = Format("binary32", 8, 23, np.dtype(np.float32))
BINARY64 = Format("binary64", 11, 52, np.dtype(np.float64))
FORMATS = (BINARY16, BFLOAT16, BINARY32, BINARY64)

_BY_DTYPE = {f.dtype: f for f in FORMATS}
_BY_NAME = {f.name: f for f in FORMATS} | {
    "float16": BINARY16, "half": BINARY16, "bf16": BFLOAT16,
    "float32": BINARY32, "float64": BINARY64,
}


def format_of(spec: Format | str | np.dtype | type) -> Format:
    """The Format for a Format, a name ("binary16", "bfloat16", ...) or a dtype."""
    if isinstance(spec, Format):
        return spec
    if isinstance(spec, str) and spec in _BY_NAME:
        return _BY_NAME[spec]
    try:
        return _BY_DTYPE[np.dtype(spec)]
    except (TypeError, KeyError):
        valid = ", ".join(f.name for f in FORMATS)
        raise ValueError(f"unknown floating-point format {spec!r}; valid: {valid}") from None
