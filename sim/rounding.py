"""The one place where an exact value becomes a format value.

Every operation of the emulator computes its result as a binary64 number that
is the exact value when that has at most p+1 significant bits, and otherwise
lies strictly between the same two consecutive (p+1)-bit numbers as the exact
value (p: the target's precision, at most 51). The exact value rounded to odd
at 53 bits always qualifies (sums and fma use it); for binary16, bfloat16 and
binary32 a correctly rounded quotient or square root does too (see
:mod:`sim.ops`). Such a number carries everything the rounding needs, in every
rounding mode: which side of each candidate and each midpoint the exact value
lies on, and whether anything was lost.

:func:`round_float64` then does what SoftFloat's ``roundPack`` does, on whole
numpy arrays in integer arithmetic: choose the quantum (normal or subnormal),
round in one of six modes, detect overflow, underflow (tininess after or
before rounding) and inexactness, and apply the overflow mode.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from .formats import Format

__all__ = ["Flag", "Rounding", "OverflowMode", "Tininess", "Rounder", "round_float64", "saturate"]


class Flag(enum.IntFlag):
    """IEEE 754 exception flags, with SoftFloat / TestFloat bit values."""

    INEXACT = 0x01
    UNDERFLOW = 0x02
    OVERFLOW = 0x04
    DIVBYZERO = 0x08
    INVALID = 0x10


class _Parsed(enum.Enum):
    """An enum that also accepts its names and aliases, case-insensitively."""

    @classmethod
    def parse(cls, value: object):
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().lower().replace("-", "_")
            for member in cls:
                if key == member.name.lower() or key in cls._aliases().get(member.name, ()):
                    return member
        valid = ", ".join(
            f"{m.name} ({'/'.join(cls._aliases().get(m.name, ()))})" if cls._aliases().get(m.name) else m.name
            for m in cls
        )
        raise ValueError(f"unknown {cls.__name__} {value!r}; valid: {valid}")

    @classmethod
    def _aliases(cls) -> dict[str, tuple[str, ...]]:
        return {}


class Rounding(_Parsed):
    """The six rounding modes; aliases are the Ascend Cast and TestFloat names."""

    NEAREST_EVEN = "rint"
    TOWARD_ZERO = "trunc"
    DOWNWARD = "floor"
    UPWARD = "ceil"
    NEAREST_AWAY = "round"
    ODD = "odd"

    @classmethod
    def _aliases(cls) -> dict[str, tuple[str, ...]]:
        return {
            "NEAREST_EVEN": ("rint", "near_even", "rne"),
            "TOWARD_ZERO": ("trunc", "minmag", "rtz"),
            "DOWNWARD": ("floor", "min"),
            "UPWARD": ("ceil", "max"),
            "NEAREST_AWAY": ("round", "near_maxmag", "rna"),
            "ODD": ("odd", "rto"),
        }


class OverflowMode(_Parsed):
    """Ascend float overflow modes; values are ``ACL_RT_OVERFLOW_MODE_*``."""

    SATURATION = 0
    INF_NAN = 1

    @classmethod
    def _aliases(cls) -> dict[str, tuple[str, ...]]:
        return {"SATURATION": ("sat", "saturate"), "INF_NAN": ("infnan", "ieee")}


class Tininess(_Parsed):
    """When underflow's tininess is detected: after rounding (x86) or before (ARM)."""

    AFTER = "after"
    BEFORE = "before"

    @classmethod
    def _aliases(cls) -> dict[str, tuple[str, ...]]:
        return {"AFTER": ("after",), "BEFORE": ("before",)}


_U = np.uint64
_ONE = _U(1)
_ABS = _U((1 << 63) - 1)
_FRAC = _U((1 << 52) - 1)
_INF64 = _U(0x7FF << 52)
_NONE = np.empty(0, np.intp)


def _round_int(v: np.ndarray, shift, neg, mode: Rounding) -> tuple[np.ndarray, np.ndarray]:
    """Round unsigned integers ``v`` right by ``shift`` bits (scalar or per element).

    ``neg`` (a callable giving the 0/1 uint64 signs) is needed by the directed
    modes only. Returns the rounded integers and where bits were lost. When
    ``v`` holds binary64 magnitudes (exponent and fraction), a carry out of
    the fraction moves into the exponent field, which is exactly what
    rounding up to the next power of two does.
    """
    s = _U(shift) if np.ndim(shift) == 0 else shift.astype(_U)
    mask = (_ONE << s) - _ONE
    lost = (v & mask) != 0
    if mode is Rounding.NEAREST_EVEN:
        kept = v >> s
        kept &= _ONE
        kept += mask >> _ONE
    elif mode is Rounding.NEAREST_AWAY:
        kept = (mask >> _ONE) + _ONE
    elif mode is Rounding.UPWARD:
        kept = mask * (_ONE - neg())
    elif mode is Rounding.DOWNWARD:
        kept = mask * neg()
    else:  # TOWARD_ZERO, ODD: truncate
        kept = v >> s
        if mode is Rounding.ODD:
            kept |= lost
        return kept, lost
    kept = kept + v  # increment, then drop the shifted-out bits
    kept >>= s
    return kept, lost


def _split(mag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Biased binary64 exponents (subnormals: that of 2**-1022) and integer significands."""
    e = np.maximum(mag >> _U(52), _ONE).astype(np.int64)
    sig = (mag & _FRAC) | ((mag >= _U(1 << 52)).astype(_U) << _U(52))
    return e, sig


@dataclass(frozen=True)
class Rounder:
    """Rounds binary64 values (as the module docstring says) into ``fmt`` under fixed settings.

    Calling it returns ``(bits, flags)``: the result's bit patterns in
    ``fmt.uint`` and a ``uint8`` array of :class:`Flag` bits (INEXACT,
    UNDERFLOW, OVERFLOW; the operation adds INVALID and DIVBYZERO). A NaN
    becomes ``nan_bits`` (default: the format's canonical quiet NaN). In
    saturation mode a result that would be +-Inf becomes +-MAX and a NaN
    becomes +0 (or stays NaN if ``nan_to_zero`` is false); flags are unchanged.

    The work comes in two stages so that callers working in chunks can batch
    the rare cases: :meth:`bulk` rounds everything as if the result were
    normal and finite, and names the elements for which that may be wrong;
    :meth:`hard` rounds any values completely.
    """

    fmt: Format
    rounding: Rounding = Rounding.NEAREST_EVEN
    overflow: OverflowMode = OverflowMode.INF_NAN
    tininess: Tininess = Tininess.AFTER
    nan_bits: int | None = None
    nan_to_zero: bool = True

    def __post_init__(self) -> None:
        if self.fmt.precision > 51:
            raise ValueError(f"rounding from binary64 needs a format of at most 51 significand bits, "
                             f"{self.fmt.name} has {self.fmt.precision}")

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.ascontiguousarray(x, dtype=np.float64)
        bits, flags, hard = self.bulk(x)
        if hard.size:
            bits[hard], flags[hard] = self.hard(x[hard])
        return bits, flags

    def bulk(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Round with the normal-range quantum; ``hard`` indexes the results that
        lie near or below 2**emin or overflow, or come from Inf/NaN: their bits
        and flags here are wrong and must come from :meth:`hard`."""
        fmt = self.fmt
        u = x.view(_U)
        mag = u & _ABS
        kept, lost = _round_int(mag, 52 - fmt.man_bits, lambda: u >> _U(63), self.rounding)
        bits = kept.view(np.int64)
        bits -= (1023 - fmt.bias) << fmt.man_bits  # rebias the exponent field
        flags = lost.view(np.uint8)
        safe = 1 << fmt.man_bits | 1  # above 2**emin: no underflow question
        suspect = (bits - safe).view(_U) >= _U(fmt.inf_bits - safe)
        if not suspect.any():
            return self._signed(u, bits), flags, _NONE
        zero = mag == 0  # zeros are common (ReLU, exact cancellation) and need nothing more
        if zero.any():
            np.copyto(bits, 0, where=zero)
            suspect &= ~zero
        # Finite overflows are common in some workloads: settle them here.
        overflow = (bits >= fmt.inf_bits) & (mag < _INF64)
        if overflow.any():
            np.copyto(bits, self._overflow_bits(u >> _U(63)), where=overflow)
            flags |= overflow * np.uint8(Flag.OVERFLOW | Flag.INEXACT)
            suspect &= ~overflow
        return self._signed(u, bits), flags, np.flatnonzero(suspect)

    def hard(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Round any values: subnormal range with underflow, overflow, Inf and NaN."""
        fmt = self.fmt
        u = np.ascontiguousarray(x, dtype=np.float64).view(_U)
        mag, neg = u & _ABS, u >> _U(63)
        bits = np.empty(mag.shape, np.int64)
        flags = np.empty(mag.shape, np.uint8)
        low = mag < _U((fmt.emin + 1024) << 52)  # below 2**(emin+1): the quantum is 2**qmin
        if low.any():
            bits[low], flags[low] = self._round_low(mag[low], neg[low])
        if not low.all():
            bits[~low], flags[~low] = self._round_big(mag[~low], neg[~low])
        return self._special(u, self._signed(u, bits)), flags

    def to_quantum(self, x: np.ndarray, quantum: int) -> tuple[np.ndarray, np.ndarray]:
        """Round to a multiple of ``2**quantum`` (``0``: to an integral value), never
        finer than the format's own quantum. Raises INEXACT only; never underflow."""
        fmt = self.fmt
        u = np.ascontiguousarray(x, dtype=np.float64).view(_U)
        mag, neg = u & _ABS, u >> _U(63)
        e, sig = _split(mag)
        q = np.maximum(e - 1023 - fmt.man_bits, max(quantum, fmt.qmin))
        kept, lost = _round_int(sig, np.minimum(q - (e - 1075), 63), lambda: neg, self.rounding)
        finite = mag < _INF64
        # kept * 2**q is a format value (integral, at most p bits): encode it exactly.
        r = np.where(finite, np.ldexp(kept.astype(np.float64), np.where(finite, q, 0)), mag.view(np.float64))
        bits, _ = Rounder(fmt)(r)
        return self._special(u, self._signed(u, bits.astype(np.int64))), (lost & finite).view(np.uint8)

    def _signed(self, u: np.ndarray, magnitude: np.ndarray) -> np.ndarray:
        fmt = self.fmt
        out = magnitude.astype(fmt.uint)
        out |= (u >> _U(64 - fmt.width)).astype(fmt.uint) & fmt.uint.type(fmt.sign_bit)
        return out

    def _special(self, u: np.ndarray, out: np.ndarray) -> np.ndarray:
        """NaN bit patterns and the saturation rule."""
        fmt = self.fmt
        out[(u & _ABS) > _INF64] = fmt.default_nan if self.nan_bits is None else self.nan_bits
        if self.overflow is OverflowMode.SATURATION:
            out = saturate(out, fmt, self.nan_to_zero)
        return out

    def _round_low(self, mag: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rounding at the fixed quantum 2**qmin; underflow is decided here."""
        fmt = self.fmt
        e, sig = _split(mag)
        kept, lost = _round_int(sig, np.minimum(fmt.qmin + 1075 - e, 63), lambda: neg, self.rounding)
        tiny = e < fmt.emin + 1023  # |x| < 2**emin
        if self.tininess is Tininess.AFTER:
            # Tiny after rounding: rounded to full precision with an unbounded
            # exponent, the value still lies below 2**emin.
            unbounded, _ = _round_int(sig, 52 - fmt.man_bits, lambda: neg, self.rounding)
            tiny &= (e < fmt.emin + 1022) | (unbounded < _U(1 << fmt.precision))
        flags = lost * np.uint8(Flag.INEXACT) | (lost & tiny) * np.uint8(Flag.UNDERFLOW)
        return kept.view(np.int64), flags

    def _round_big(self, mag: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Finite overflow, and Inf/NaN operands (exact)."""
        finite = mag < _INF64
        bits = np.where(finite, self._overflow_bits(neg), self.fmt.inf_bits)
        return bits, finite * np.uint8(Flag.OVERFLOW | Flag.INEXACT)

    def _overflow_bits(self, neg: np.ndarray) -> np.ndarray | int:
        """Magnitude of an overflowed result: Inf when rounding goes away from
        zero (nearest modes; upward for +, downward for -), else MAX; and in
        saturation mode always MAX."""
        fmt = self.fmt
        if self.overflow is OverflowMode.SATURATION:
            return fmt.max_bits
        to_inf = {
            Rounding.NEAREST_EVEN: True, Rounding.NEAREST_AWAY: True,
            Rounding.TOWARD_ZERO: False, Rounding.ODD: False,
            Rounding.UPWARD: neg == 0, Rounding.DOWNWARD: neg == 1,
        }[self.rounding]
        return np.where(to_inf, fmt.inf_bits, fmt.max_bits)


def round_float64(
    x: np.ndarray,
    fmt: Format,
    rounding: Rounding = Rounding.NEAREST_EVEN,
    overflow: OverflowMode = OverflowMode.INF_NAN,
    *,
    tininess: Tininess = Tininess.AFTER,
    nan_bits: int | None = None,
    nan_to_zero: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Round binary64 values (as the module docstring says) to ``fmt``: ``(bits, flags)``.

    The functional form of :class:`Rounder`.
    """
    return Rounder(fmt, rounding, overflow, tininess, nan_bits, nan_to_zero)(x)


def saturate(bits: np.ndarray, fmt: Format, nan_to_zero: bool = True) -> np.ndarray:
    """Saturation mode's rule on result bits: +-Inf -> +-MAX, NaN -> +0 (or kept)."""
    mag = bits & fmt.uint.type(fmt.sign_bit - 1)
    out = np.where(mag == fmt.inf_bits, bits - fmt.uint.type(1), bits)
    return np.where(nan_to_zero & (mag > fmt.inf_bits), fmt.uint.type(0), out).astype(fmt.uint)
