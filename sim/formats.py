"""Floating-point formats as data.

A :class:`Format` is a small frozen value: the exponent and fraction widths, the
numpy dtype that stores it, and what its encoding does with the patterns IEEE 754
gives to infinities and NaNs (``kind``). Everything else (bias, limits, bit
masks) is derived, so binary16, bfloat16, binary32 and the 8-bit formats are
constants, not implementations. The compiled rounding routine takes a format as
the small integer array :meth:`Format.kernel` describes.

Kinds (the 8-bit encodings follow the OCP 8-bit Floating Point Specification v1.0,
the OCP Microscaling Formats (MX) v1.0 specification, and for HiFloat8 arXiv
2409.16626, "Ascend HiFloat8 Format for Deep Learning"):

- ``ieee``: the all-ones exponent holds Inf and NaN (binary16, bfloat16, binary32,
  E5M2).
- ``fn``: finite and NaN: no infinities; the all-ones pattern S.1111.111 is NaN, so the
  all-ones exponent also holds finite values (E4M3FN, max 448).
- ``finite``: no Inf and no NaN (E2M1, max 6).
- ``fnu``: unsigned powers of two 2**(e-127), no zero, 0xFF NaN (E8M0, the MX scale).
- ``tapered``: HiFloat8, whose precision falls as the exponent's magnitude grows.
  It is rounded as a wider carrier format (3 fraction bits, exponents -22..15) with
  fewer fraction bits kept where ``taper`` says, and packed into its 8-bit codes by
  a table built from its definition (:func:`decode`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import ml_dtypes
import numpy as np

from .kernels import NO_TAPER

__all__ = ["Format", "BINARY16", "BFLOAT16", "BINARY32", "BINARY64", "FLOAT8_E4M3FN", "FLOAT8_E5M2",
           "FLOAT8_E8M0FNU", "FLOAT4_E2M1FN", "HIFLOAT8", "FORMATS", "EIGHT_BIT", "format_of", "decode"]

KINDS = ("ieee", "fn", "finite", "fnu", "tapered")


@dataclass(frozen=True)
class Format:
    """A binary floating-point format: 1 sign bit (none for ``fnu``), ``exp_bits``, ``man_bits``.

    ``taper`` (tapered formats): exponent magnitudes above which one fraction bit fewer
    is kept; ``emin``/``qmin`` overrides give the smallest normal exponent and the finest
    quantum where the encoding is not IEEE's.
    """

    name: str
    exp_bits: int
    man_bits: int
    dtype: np.dtype
    kind: str = "ieee"
    taper: tuple[int, ...] = ()
    emin_override: int | None = None
    qmin_override: int | None = None
    emax_override: int | None = None

    @property
    def width(self) -> int:
        """Bits of the encoding (of the carrier, for tapered formats)."""
        return 1 + self.exp_bits + self.man_bits

    @property
    def precision(self) -> int:
        """Significand bits including the implicit one (11 for binary16; the most, if tapered)."""
        return self.man_bits + 1

    @property
    def bias(self) -> int:
        if self.kind == "fnu":
            return 128  # code c is 2**(c - 127): the carrier's normals start at code 1
        if self.kind == "tapered":
            return 1 - self.qmin  # the carrier: every value at or above 2**qmin is a carrier normal
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (-14 for binary16)."""
        return 2 - (1 << (self.exp_bits - 1)) if self.emin_override is None else self.emin_override

    @property
    def emax(self) -> int:
        """Exponent of the largest finite binade (15 for binary16, 8 for E4M3FN)."""
        if self.emax_override is not None:
            return self.emax_override
        if self.kind == "ieee":
            return self.bias
        return (1 << self.exp_bits) - 1 - self.bias

    @property
    def qmin(self) -> int:
        """Exponent of the smallest subnormal, the finest quantum (-24 for binary16)."""
        return self.emin - self.man_bits if self.qmin_override is None else self.qmin_override

    @cached_property
    def uint(self) -> np.dtype:
        """Unsigned integer dtype holding the encoding's bits (the carrier's, for the 8-bit kinds
        that round through one), for bit views."""
        return np.dtype(f"u{max(1, -(-self.width // 8))}")

    @property
    def sign_bit(self) -> int:
        return 1 << (self.width - 1)

    @property
    def inf_bits(self) -> int:
        """Bit pattern of +Inf in IEEE formats; every magnitude at or above it is Inf or NaN."""
        return ((1 << self.exp_bits) - 1) << self.man_bits

    @property
    def max_bits(self) -> int:
        """Bit pattern of the largest finite value (0x7BFF for binary16, 0x7E for E4M3FN; the
        carrier's for E8M0 and HiFloat8)."""
        return self.inf_bits - 1 if self.kind == "ieee" else self.kernel[2]

    @property
    def quiet_bit(self) -> int:
        return 1 << (self.man_bits - 1)

    @property
    def default_nan(self) -> int:
        """The canonical quiet NaN, positive (0x7E00 for binary16)."""
        return self.inf_bits | self.quiet_bit

    @cached_property
    def max(self) -> float:
        """The largest finite value."""
        if self.kind == "tapered":
            return 2.0**self.emax
        if self.kind == "fn":
            return float((2 - 2.0 ** (1 - self.man_bits)) * 2.0**self.emax)
        return float((2 - 2.0**-self.man_bits) * 2.0**self.emax)

    @cached_property
    def tiny(self) -> float:
        """Smallest positive normal number."""
        return 2.0**self.emin

    @property
    def has_inf(self) -> bool:
        return self.kind in ("ieee", "tapered")

    @property
    def has_nan(self) -> bool:
        return self.kind != "finite"

    @property
    def signed(self) -> bool:
        return self.kind != "fnu"

    @property
    def has_negative_zero(self) -> bool:
        return self.kind not in ("fnu", "tapered")

    @property
    def has_subnormals(self) -> bool:
        return self.kind not in ("fnu",)

    @property
    def sum_exact_in_float64(self) -> bool:
        """Whether the sum of any two finite values is exact in binary64."""
        return self.emax - self.qmin + 2 <= 53

    @cached_property
    def kernel(self) -> tuple[int, ...]:
        """What the rounding routine needs beyond IEEE's widths, as magnitudes in the carrier:
        (bias, limit, max, overflow, inf, nan, nan takes the sign, zero, taper thresholds x3,
        tiny exponent, finest quantum). ``limit``: the first magnitude that is no finite value;
        ``overflow``: the result of an overflow that rounds away from zero when not saturating;
        ``inf``: the result for an exact infinity; ``zero``: for an exact zero."""
        inf = self.inf_bits
        t = (*self.taper, NO_TAPER, NO_TAPER, NO_TAPER)[:3]
        eight = self.dtype.itemsize == 1
        if self.kind == "ieee":
            limit, top, over, infb, nan, zero = inf, inf - 1, inf, inf, self.default_nan, 0
        elif self.kind == "fn":  # S.1111.111 is NaN: overflow and infinities become it
            limit = (1 << (self.width - 1)) - 1
            limit, top, over, infb, nan, zero = limit, limit - 1, limit, limit, limit, 0
        elif self.kind == "finite":  # nothing beyond MAX: overflow and Inf saturate
            limit = 1 << (self.width - 1)
            # ml_dtypes (0.5+) maps a NaN of sign s to the zero of the other sign; its casts are the
            # reference, and a format without NaN has no better answer (OCP MX leaves it open).
            limit, top, over, infb, nan, zero = limit, limit - 1, limit - 1, limit - 1, limit, 0
        elif self.kind == "fnu":  # carrier magnitude 256 stands for NaN (0xFF); no zero
            limit, top, over, infb, nan, zero = 256, 255, 256, 256, 256, 256
        else:  # tapered: the carrier bits of 2**emax; the next grid point is the Inf code
            top = self._carrier(2.0**self.emax)
            limit = self._carrier(1.5 * 2.0**self.emax)
            over, infb, nan, zero = limit, limit, limit + 1, 0
        return (self.bias, limit, top, over, infb, nan, int(eight), zero, *t, self.emin, self.qmin)

    def _carrier(self, v: float) -> int:
        """The carrier bits of a positive value of a tapered format."""
        m, e = np.frexp(v)
        e = int(e) - 1
        frac = int((float(m) * 2 - 1) * 2**self.man_bits)
        return ((e + self.bias) << self.man_bits) | frac

    @cached_property
    def values(self) -> np.ndarray:
        """Every code's value as binary64 (the 8-bit formats), indexed by code."""
        if self.kind == "tapered":
            return _hifloat8_values()
        codes = np.arange(256, dtype=np.uint8)
        if self.kind == "finite":
            codes = codes & np.uint8(0xF)
        return codes.view(self.dtype).astype(np.float64)

    @cached_property
    def pack(self) -> np.ndarray | None:
        """Carrier bits to stored code, for the kinds that round through a carrier (None otherwise)."""
        if self.kind == "fnu":
            table = np.full(1 << self.width, 0xFF, np.uint8)
            table[0] = 0  # an underflow: there is no zero, 2**-127 is the nearest code
            table[1:256] = np.arange(255, dtype=np.uint8)
            return table
        if self.kind != "tapered":
            return None
        table = np.zeros(1 << self.width, np.uint8)
        limit, nan = self.kernel[1], self.kernel[5]
        for code, v in enumerate(self.values):
            if np.isfinite(v) and v != 0:
                table[self._carrier(abs(v)) | (self.sign_bit if v < 0 else 0)] = code
        table[limit], table[limit | self.sign_bit] = 0x6F, 0xEF
        table[nan], table[nan | self.sign_bit] = 0x80, 0x80
        return table

    def __repr__(self) -> str:
        kind = "" if self.kind == "ieee" else f" {self.kind}"
        return f"Format({self.name!r}: e{self.exp_bits}m{self.man_bits}{kind})"


def _hifloat8_values() -> np.ndarray:
    """The 256 HiFloat8 codes as binary64 values, from the definition (arXiv 2409.16626, section 3):
    sign, a prefix-coded dot field giving the exponent's width D, a sign-magnitude exponent
    (sign bit 0: positive) with an implicit leading magnitude bit, and the rest mantissa.
    Dot 11: D=4, 1 mantissa bit; 10: D=3, 2; 01: D=2, 3; 001: D=1, 3; 0001: D=0 (E=0), 3;
    0000: denormal, 2**(M-23) for M = 1..7. 0x00 is the only zero, 0x80 NaN, 0x6F/0xEF +-Inf."""
    out = np.empty(256)
    mantissa_bits = {4: 1, 3: 2, 2: 3, 1: 3, 0: 3}  # by exponent width D
    for code in range(256):
        s, r = code >> 7, code & 0x7F
        if r >> 5:  # dot 11, 10, 01: D = 4, 3, 2
            d, rest = (r >> 5) + 1, r & 0x1F
        elif r >> 4:  # dot 001
            d, rest = 1, r & 0xF
        elif r >> 3:  # dot 0001
            d, rest = 0, r & 0x7
        else:  # dot 0000: denormal
            out[code] = (-1.0) ** s * 2.0 ** ((r & 7) - 23) if r & 7 else 0.0
            continue
        m_bits = mantissa_bits[d]
        e_field, m = rest >> m_bits, rest & ((1 << m_bits) - 1)
        magnitude = (1 << (d - 1)) | (e_field & ((1 << (d - 1)) - 1)) if d else 0
        e = -magnitude if d and e_field >> (d - 1) else magnitude
        out[code] = (-1.0) ** s * (1 + m / 2**m_bits) * 2.0**e
    out[0x80] = np.nan
    out[0x6F], out[0xEF] = np.inf, -np.inf
    return out


BINARY16 = Format("binary16", 5, 10, np.dtype(np.float16))
BFLOAT16 = Format("bfloat16", 8, 7, np.dtype(ml_dtypes.bfloat16))
BINARY32 = Format("binary32", 8, 23, np.dtype(np.float32))
BINARY64 = Format("binary64", 11, 52, np.dtype(np.float64))
FLOAT8_E4M3FN = Format("float8_e4m3fn", 4, 3, np.dtype(ml_dtypes.float8_e4m3fn), "fn")
FLOAT8_E5M2 = Format("float8_e5m2", 5, 2, np.dtype(ml_dtypes.float8_e5m2))
FLOAT8_E8M0FNU = Format("float8_e8m0fnu", 9, 0, np.dtype(ml_dtypes.float8_e8m0fnu), "fnu",
                        emin_override=-127, qmin_override=-127, emax_override=127)
FLOAT4_E2M1FN = Format("float4_e2m1fn", 2, 1, np.dtype(ml_dtypes.float4_e2m1fn), "finite")
HIFLOAT8 = Format("hifloat8", 6, 3, np.dtype(np.uint8), "tapered", taper=(3, 7, 15),
                  emin_override=-15, qmin_override=-22, emax_override=15)
EIGHT_BIT = (FLOAT8_E4M3FN, FLOAT8_E5M2, FLOAT8_E8M0FNU, FLOAT4_E2M1FN, HIFLOAT8)
FORMATS = (BINARY16, BFLOAT16, BINARY32, BINARY64, *EIGHT_BIT)

_BY_DTYPE = {f.dtype: f for f in FORMATS if f is not HIFLOAT8}
_BY_NAME = {f.name: f for f in FORMATS} | {
    "float16": BINARY16, "half": BINARY16, "bf16": BFLOAT16,
    "float32": BINARY32, "float64": BINARY64, "hif8": HIFLOAT8, "e4m3": FLOAT8_E4M3FN,
    "e5m2": FLOAT8_E5M2, "e8m0": FLOAT8_E8M0FNU, "e2m1": FLOAT4_E2M1FN,
}


def format_of(spec: Format | str | np.dtype | type) -> Format:
    """The Format for a Format, a name ("binary16", "float8_e4m3fn", "hifloat8", ...) or a dtype
    (HiFloat8 has no dtype of its own: its codes are uint8, so it is named)."""
    if isinstance(spec, Format):
        return spec
    if isinstance(spec, str) and spec in _BY_NAME:
        return _BY_NAME[spec]
    try:
        return _BY_DTYPE[np.dtype(spec)]
    except (TypeError, KeyError):
        valid = ", ".join(f.name for f in FORMATS)
        raise ValueError(f"unknown floating-point format {spec!r}; valid: {valid}") from None


def decode(codes, fmt: Format | str) -> np.ndarray:
    """The binary64 values of an 8-bit format's codes (uint8 arrays, or the ml_dtypes arrays)."""
    fmt = format_of(fmt)
    if fmt.dtype.itemsize != 1:
        raise ValueError(f"decode takes the 8-bit formats ({', '.join(f.name for f in EIGHT_BIT)}), "
                         f"not {fmt.name}")
    codes = np.asarray(codes)
    if codes.dtype != fmt.dtype and codes.dtype != np.uint8:
        raise TypeError(f"decode: {fmt.name} codes are uint8 (or {fmt.dtype}) arrays, got {codes.dtype}")
    return fmt.values[codes.view(np.uint8)]
