"""Floating-point formats as descriptions.

A :class:`Format` is a small frozen value of named, orthogonal fields, in the manner of
Graphcore gfloat's ``FormatInfo``: the exponent and fraction widths, the exponent bias,
whether it has infinities, how NaN is encoded, whether it has subnormals, a sign and a
zero, and for a tapered format its precision by exponent and its value table. Every limit
(max, smallest normal and subnormal, epsilon, emin, emax) and what the compiled rounding
routine needs (:attr:`Format.encoding`, by name) are derived from those fields, so
binary16, bfloat16, binary32 and the narrow formats are catalogue entries, not
implementations. This module imports no compiled code.

NaN encodings (the narrow ones follow the OCP 8-bit Floating Point Specification (OFP8)
v1.0, the OCP Microscaling Formats (MX) v1.0 specification, and for HiFloat8 arXiv
2409.16626, "Ascend HiFloat8 Format for Deep Learning"):

- ``ieee``: the all-ones exponent with a non-zero fraction (binary16, bfloat16, binary32,
  E5M2); with ``has_infs`` its zero fraction is Inf.
- ``all_ones``: only the all-ones magnitude (S.1111.111 of E4M3FN, 0xFF of E8M0), so the
  all-ones exponent also holds finite values.
- ``none``: no NaN (E2M1, E3M2, E2M3: every pattern is a finite value).
- ``negative_zero``: the pattern of -0 is the one NaN (HiFloat8's 0x80).

Formats whose codes are not a sign, exponent and fraction (HiFloat8) or that have no zero
(E8M0) are rounded as a wider signed carrier format (``width``, ``bias``, ``uint`` are the
carrier's) and packed into their codes by a table (:attr:`Format.pack`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import ml_dtypes
import numpy as np

__all__ = ["Encoding", "FORMATS", "EIGHT_BIT", "NAN_ENCODINGS", "decode", "pack_nibbles", "unpack_nibbles"]

NAN_ENCODINGS = ("ieee", "all_ones", "none", "negative_zero")


class Encoding(NamedTuple):
    """What the rounding routine needs of a format, as carrier bit patterns (magnitudes):
    ``limit``, the first that is no finite value; ``max``, the largest finite value;
    ``overflow``, the result of an overflow that rounds away from zero when not
    saturating; ``inf``, the result for an exact infinity; ``nan``, for a NaN (its sign
    flipped by the operand's where ``nan_sign``); ``zero``, for an exact zero; ``taper``,
    exponent magnitudes above which one fraction bit fewer is kept; ``tiny``, the exponent
    of the smallest normal; ``qmin``, of the finest quantum."""

    width: int
    man: int
    bias: int
    limit: int
    max: int
    overflow: int
    inf: int
    nan: int
    nan_sign: int
    zero: int
    taper: tuple[int, ...]
    tiny: int
    qmin: int


@dataclass(frozen=True)
class Format:
    """A binary floating-point format: a sign bit (unless not ``signed``), ``exp_bits`` of exponent
    and ``man_bits`` of fraction (a tapered format: its carrier's, the most it keeps).

    ``exponent_bias`` (None: IEEE's, 2**(exp_bits-1) - 1); ``has_infs``; ``nans``, one of
    :data:`NAN_ENCODINGS`; ``has_subnormals``; ``signed``; ``has_zero``; for a tapered format
    ``taper``, the exponent magnitudes above which one fraction bit fewer is kept, and
    ``table``, which makes the value of every code (indexed by code); ``aliases``, other names
    :func:`format_of` takes for it.
    """

    name: str
    exp_bits: int
    man_bits: int
    dtype: np.dtype
    exponent_bias: int | None = None
    has_infs: bool = True
    nans: str = "ieee"
    has_subnormals: bool = True
    signed: bool = True
    has_zero: bool = True
    taper: tuple[int, ...] = ()
    table: Callable[[], np.ndarray] | None = None
    aliases: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.nans not in NAN_ENCODINGS:
            raise ValueError(f"{self.name}: unknown NaN encoding {self.nans!r}; valid: {', '.join(NAN_ENCODINGS)}")
        if self.nans == "ieee" and self.man_bits == 0:
            raise ValueError(f"{self.name}: an IEEE NaN needs a fraction bit")

    # -- the description's derived limits (numpy finfo's names where it has them) -------------
    @property
    def tapered(self) -> bool:
        """Whether the precision falls with the exponent's magnitude (a value table describes it)."""
        return self.table is not None

    @property
    def bits(self) -> int:
        """Bits of a stored code (8 for HiFloat8, 6 for the FP6 formats)."""
        if self.tapered:
            return 8 * self.dtype.itemsize
        return int(self.signed) + self.exp_bits + self.man_bits

    @property
    def precision(self) -> int:
        """Significand bits including the implicit one (11 for binary16; the most, if tapered)."""
        return self.man_bits + 1

    @property
    def _bias(self) -> int:
        """The stored exponent field's bias."""
        return (1 << (self.exp_bits - 1)) - 1 if self.exponent_bias is None else self.exponent_bias

    @property
    def _max_code(self) -> int:
        """The magnitude code of the largest finite value: the all-ones magnitude less the
        NaN codes above it and the infinity."""
        nans = {"ieee": (1 << self.man_bits) - 1, "all_ones": 1}.get(self.nans, 0)
        return (1 << (self.exp_bits + self.man_bits)) - 1 - nans - int(self.has_infs)

    @cached_property
    def _positive(self) -> np.ndarray:
        """A tapered format's positive finite values, ascending."""
        v = self.values
        return np.unique(v[np.isfinite(v) & (v > 0)])

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (-14 for binary16; for a tapered format the
        lowest binade holding more than one value: HiFloat8's denormals hold one each)."""
        if self.tapered:
            binades, counts = np.unique(np.floor(np.log2(self._positive)).astype(int), return_counts=True)
            return int(binades[counts > 1].min())
        return int(self.has_zero) - self._bias  # without a zero, exponent field 0 is normal (E8M0)

    @property
    def emax(self) -> int:
        """Exponent of the largest finite binade (15 for binary16, 8 for E4M3FN)."""
        if self.tapered:
            return math.floor(math.log2(self._positive[-1]))
        return (self._max_code >> self.man_bits) - self._bias

    @property
    def qmin(self) -> int:
        """Exponent of the smallest subnormal, the finest quantum (-24 for binary16)."""
        if self.tapered:
            return math.floor(math.log2(self._positive[0]))
        return self.emin - self.man_bits if self.has_subnormals else self.emin

    @cached_property
    def max(self) -> float:
        """The largest finite value."""
        if self.tapered:
            return float(self._positive[-1])
        fraction = self._max_code & ((1 << self.man_bits) - 1)
        return math.ldexp(1 + fraction / 2.0**self.man_bits, self.emax)

    @cached_property
    def tiny(self) -> float:
        """Smallest positive normal number."""
        return 2.0**self.emin

    @property
    def smallest_subnormal(self) -> float:
        """Smallest positive value (the smallest normal where there are no subnormals)."""
        return 2.0**self.qmin

    @property
    def eps(self) -> float:
        """The distance from 1 to the next larger value."""
        return 2.0**-self.man_bits

    @property
    def has_inf(self) -> bool:
        return self.has_infs

    @property
    def has_nan(self) -> bool:
        return self.nans != "none"

    @property
    def has_negative_zero(self) -> bool:
        return self.signed and self.has_zero and self.nans != "negative_zero"

    @property
    def sum_exact_in_float64(self) -> bool:
        """Whether the sum of any two finite values is exact in binary64."""
        return self.emax - self.qmin + 2 <= 53

    # -- the carrier the rounding routine produces ---------------------------------------------
    @property
    def width(self) -> int:
        """Bits of the rounding routine's result: the encoding's, or a carrier's (a sign, and for
        a format with no zero one more exponent bit, to hold a zero below and the limit above)."""
        return 1 + self.exp_bits + self.man_bits + int(not self.has_zero)

    @property
    def bias(self) -> int:
        """The carrier's exponent bias: every value at or above 2**qmin of a tapered format is a
        carrier normal; a format with no zero keeps exponent field 0 for the carrier's zero."""
        if self.tapered:
            return 1 - self.qmin
        return self._bias + int(not self.has_zero)

    @cached_property
    def uint(self) -> np.dtype:
        """Unsigned integer dtype holding the carrier's bits, for bit views."""
        return np.dtype(f"u{max(1, -(-self.width // 8))}")

    @property
    def sign_bit(self) -> int:
        return 1 << (self.width - 1)

    @property
    def inf_bits(self) -> int:
        """Bit pattern of +Inf in IEEE formats; every magnitude at or above it is Inf or NaN."""
        return ((1 << (self.width - 1 - self.man_bits)) - 1) << self.man_bits

    @property
    def max_bits(self) -> int:
        """Carrier bit pattern of the largest finite value (0x7BFF for binary16, 0x7E for E4M3FN)."""
        return self._carrier(self.max)

    @property
    def quiet_bit(self) -> int:
        return 1 << (self.man_bits - 1)

    @property
    def default_nan(self) -> int:
        """The canonical quiet NaN, positive (0x7E00 for binary16)."""
        return self.inf_bits | self.quiet_bit

    @cached_property
    def encoding(self) -> Encoding:
        """What the rounding routine needs, derived from the fields (see :class:`Encoding`).
        Past MAX: Inf where there is one, else NaN where there is one, else MAX (saturation).
        A NaN of a format without one becomes the zero of the other sign, as ml_dtypes (0.5+)
        casts (OCP MX v1.0 leaves it open); a one-byte format's NaN keeps its operand's sign,
        as ml_dtypes' casts do."""
        top = self.max_bits
        if self.tapered:  # the next carrier grid point above MAX, at the top binade's precision
            man = self.man_bits - sum(self.emax > t for t in self.taper)
            limit = self._carrier(self.max * (1 + 2.0**-man))
        else:
            limit = top + 1
        over = limit if self.has_infs or self.has_nan else top
        nan = self.default_nan if self.nans == "ieee" else \
            {"all_ones": limit, "none": self.sign_bit, "negative_zero": limit + 1}[self.nans]
        return Encoding(width=self.width, man=self.man_bits, bias=self.bias, limit=limit, max=top, overflow=over,
                        inf=over, nan=nan, nan_sign=int(self.dtype.itemsize == 1),
                        zero=0 if self.has_zero else nan, taper=self.taper, tiny=self.emin, qmin=self.qmin)

    def _carrier(self, v: float) -> int:
        """The carrier bits of a positive normal value."""
        m, e = np.frexp(v)
        e = int(e) - 1
        frac = int((float(m) * 2 - 1) * 2**self.man_bits)
        return ((e + self.bias) << self.man_bits) | frac

    @cached_property
    def values(self) -> np.ndarray:
        """Every code's value as binary64 (the one-byte formats), indexed by code: its ml_dtypes
        dtype's, or for a format ml_dtypes lacks (uint8 codes) :meth:`from_fields`'."""
        if self.tapered:
            return self.table()
        codes = np.arange(256, dtype=np.uint8) & np.uint8((1 << self.bits) - 1)
        if self.dtype == np.uint8:
            return self.from_fields(codes)
        return codes.view(self.dtype).astype(np.float64)

    def from_fields(self, codes: np.ndarray) -> np.ndarray:
        """The binary64 values of codes read from the fields alone: sign, biased exponent and
        fraction, subnormals at exponent field 0 where the format has them, and its infinity and
        NaN codes (not for a tapered format, whose value table defines it)."""
        c = np.asarray(codes).astype(np.int64)
        magnitude = c & ((1 << (self.exp_bits + self.man_bits)) - 1)
        e, m = magnitude >> self.man_bits, magnitude & ((1 << self.man_bits) - 1)
        fraction = m / 2.0**self.man_bits
        subnormal = (e == 0) & self.has_subnormals
        value = np.where(subnormal, fraction, 1 + fraction) * np.exp2(np.maximum(e, 1 if self.has_subnormals else 0)
                                                                       - self._bias)
        top = (1 << self.exp_bits) - 1
        if self.nans == "ieee":
            value = np.where(e == top, np.where(m == 0, np.inf, np.nan) if self.has_infs else np.nan, value)
        elif self.nans == "all_ones":
            value = np.where(magnitude == (1 << (self.exp_bits + self.man_bits)) - 1, np.nan, value)
        negative = self.signed and (c >> (self.exp_bits + self.man_bits)) & 1
        return np.where(negative, -value, value)

    @cached_property
    def pack(self) -> np.ndarray | None:
        """Carrier bits to stored code, for the formats that round through a carrier (None otherwise)."""
        if self.has_zero and not self.tapered:
            return None
        enc = self.encoding
        nan = int(np.flatnonzero(np.isnan(self.values))[0])
        table = np.full(1 << self.width, 0 if self.signed else nan, np.uint8)  # unsigned: the rest is NaN
        for code, v in enumerate(self.values):
            if np.isfinite(v) and v > 0:
                table[self._carrier(v)] = code
            elif np.isfinite(v) and v < 0:
                table[self._carrier(-v) | self.sign_bit] = code
        if not self.has_zero:  # an underflow: there is no zero, the smallest value is the nearest code
            table[0] = int(np.argmin(np.where(self.values > 0, self.values, np.inf)))
        if self.has_infs:
            table[enc.inf] = int(np.flatnonzero(self.values == np.inf)[0])
            table[enc.inf | self.sign_bit] = int(np.flatnonzero(self.values == -np.inf)[0])
        table[enc.nan] = table[enc.nan | self.sign_bit] = nan
        return table

    def __repr__(self) -> str:
        if self.tapered:
            return f"Format({self.name!r}: tapered, {self.bits} bits)"
        traits = [] if self.has_infs and self.nans == "ieee" else [f"infs={self.has_infs}", f"nans={self.nans}"]
        return f"Format({self.name!r}: e{self.exp_bits}m{self.man_bits}{''.join(' ' + t for t in traits)})"


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


#: The catalogue: every format the emulator rounds to, one entry each. Every list of formats
#: (:data:`EIGHT_BIT`, the names :func:`format_of` takes, ``sim``'s constants such as
#: ``sim.BINARY16``, named by the format's name in capitals) is derived from it.
FORMATS = (
    BINARY16 := Format("binary16", 5, 10, np.dtype(np.float16), aliases=("float16", "half")),
    BFLOAT16 := Format("bfloat16", 8, 7, np.dtype(ml_dtypes.bfloat16), aliases=("bf16",)),
    BINARY32 := Format("binary32", 8, 23, np.dtype(np.float32), aliases=("float32",)),
    BINARY64 := Format("binary64", 11, 52, np.dtype(np.float64), aliases=("float64",)),
    # OCP OFP8 v1.0: E4M3 has no infinities and one NaN magnitude; E5M2 is IEEE-like.
    FLOAT8_E4M3FN := Format("float8_e4m3fn", 4, 3, np.dtype(ml_dtypes.float8_e4m3fn), has_infs=False,
                            nans="all_ones", aliases=("e4m3",)),
    FLOAT8_E5M2 := Format("float8_e5m2", 5, 2, np.dtype(ml_dtypes.float8_e5m2), aliases=("e5m2",)),
    # OCP MX v1.0: the E8M0 scale is 2**(code - 127), unsigned, no zero, 0xFF NaN; the element
    # formats FP6 (E3M2, E2M3) and FP4 (E2M1) have no infinities and no NaN.
    FLOAT8_E8M0FNU := Format("float8_e8m0fnu", 8, 0, np.dtype(ml_dtypes.float8_e8m0fnu), exponent_bias=127,
                             has_infs=False, nans="all_ones", has_subnormals=False, signed=False, has_zero=False,
                             aliases=("e8m0",)),
    FLOAT6_E3M2FN := Format("float6_e3m2fn", 3, 2, np.dtype(ml_dtypes.float6_e3m2fn), has_infs=False, nans="none",
                            aliases=("e3m2",)),
    FLOAT6_E2M3FN := Format("float6_e2m3fn", 2, 3, np.dtype(ml_dtypes.float6_e2m3fn), has_infs=False, nans="none",
                            aliases=("e2m3",)),
    FLOAT4_E2M1FN := Format("float4_e2m1fn", 2, 1, np.dtype(ml_dtypes.float4_e2m1fn), has_infs=False, nans="none",
                            aliases=("e2m1",)),
    # Ascend's 4-bit E1M2 (Ascend C fp4x2_e1m2_t on the Atlas 350; CANN opbase float4_e1m2.h): bias 1,
    # max 1.75, subnormals 0.25, 0.5, 0.75, no Inf or NaN. ml_dtypes has no such type: uint8 codes.
    FLOAT4_E1M2FN := Format("float4_e1m2fn", 1, 2, np.dtype(np.uint8), exponent_bias=1, has_infs=False, nans="none",
                            aliases=("e1m2",)),
    # HiFloat4's element (CANN opbase hifloat4.h; arXiv 2602.11287): E1M2's layout and values.
    HIFLOAT4 := Format("hifloat4", 1, 2, np.dtype(np.uint8), exponent_bias=1, has_infs=False, nans="none",
                       aliases=("hif4",)),
    # arXiv 2409.16626: rounded as a carrier with 6 exponent and 3 fraction bits, one fraction bit
    # fewer above exponent magnitudes 3, 7 and 15; -0's code is NaN.
    HIFLOAT8 := Format("hifloat8", 6, 3, np.dtype(np.uint8), nans="negative_zero", taper=(3, 7, 15),
                       table=_hifloat8_values, aliases=("hif8",)),
)
#: The narrow formats: a code of at most a byte.
EIGHT_BIT = tuple(f for f in FORMATS if f.bits <= 8)

_BY_DTYPE = {f.dtype: f for f in FORMATS if f.dtype != np.uint8}  # codes are named, not typed
_BY_NAME = {name: f for f in FORMATS for name in (f.name, *f.aliases)}


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
    """The binary64 values of a one-byte format's codes (uint8 arrays, or the ml_dtypes arrays)."""
    fmt = format_of(fmt)
    if fmt.dtype.itemsize != 1:
        raise ValueError(f"decode takes the one-byte formats ({', '.join(f.name for f in EIGHT_BIT)}), "
                         f"not {fmt.name}")
    codes = np.asarray(codes)
    if codes.dtype != fmt.dtype and codes.dtype != np.uint8:
        raise TypeError(f"decode: {fmt.name} codes are uint8 (or {fmt.dtype}) arrays, got {codes.dtype}")
    return fmt.values[codes.view(np.uint8)]


def pack_nibbles(codes) -> np.ndarray:
    """4-bit codes (uint8, one per element) two to a byte along the last axis, the first in the low
    nibble, as Ascend C's ``fp4x2_e2m1_t`` and ``fp4x2_e1m2_t`` hold them; an odd count is padded
    with a zero code."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8 or (codes.size and int(codes.max()) > 0xF):
        raise ValueError(f"pack_nibbles takes 4-bit codes as uint8 values 0..15, got {codes.dtype} "
                         f"{'' if codes.dtype != np.uint8 else f'up to {int(codes.max())}'}".rstrip())
    if codes.shape[-1:] and codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros((*codes.shape[:-1], 1), np.uint8)], axis=-1)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed, count: int | None = None) -> np.ndarray:
    """The 4-bit codes of :func:`pack_nibbles`' bytes, low nibble first, the last axis cut to
    ``count`` codes (default: two per byte)."""
    packed = np.asarray(packed)
    if packed.dtype != np.uint8:
        raise ValueError(f"unpack_nibbles takes uint8 bytes, got {packed.dtype}")
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    if count is not None and not 0 <= count <= codes.shape[-1]:
        raise ValueError(f"count must be from 0 to {codes.shape[-1]} (two codes per byte), got {count}")
    return codes if count is None else codes[..., :count]

