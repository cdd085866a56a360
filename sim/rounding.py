"""The one place where an exact value becomes a format value.

Every operation of the emulator computes its result as a binary64 number that
is either exact or *rounded to odd* at 53 bits: the true value when it fits,
otherwise the neighbour whose last bit is 1. Round-to-odd keeps the "something
was lost" (sticky) information in that last bit, so a second rounding to any
format with at most 51 significand bits is correct in every rounding mode, and
the binary64 number alone carries everything the rounding needs.

:func:`round_float64` then does what SoftFloat's ``roundPack`` does, on whole
numpy arrays in integer arithmetic: choose the quantum (normal or subnormal),
round in one of six modes, detect overflow, underflow (tininess after or
before rounding) and inexactness, and apply the overflow mode.
"""

from __future__ import annotations

import enum

import numpy as np

from .formats import Format

__all__ = ["Flag", "Rounding", "OverflowMode", "Tininess", "round_float64", "saturate"]


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
_FRAC = _U((1 << 52) - 1)
_ONE = _U(1)


def _increment(sig, kept, rem, half, neg, mode: Rounding):
    """Whether rounding away from ``kept`` (towards larger magnitude) is due."""
    if mode is Rounding.NEAREST_EVEN:
        return (rem > half) | ((rem == half) & (kept & _ONE).astype(bool))
    if mode is Rounding.NEAREST_AWAY:
        return rem >= half
    if mode is Rounding.TOWARD_ZERO:
        return np.zeros(sig.shape, bool)
    if mode is Rounding.ODD:
        return (rem != 0) & ~(kept & _ONE).astype(bool)
    inexact = rem != 0
    return inexact & (neg if mode is Rounding.DOWNWARD else ~neg)


def _round_sig(sig, shift, neg, mode: Rounding):
    """Round the integer ``sig`` right by ``shift`` bits; return (kept, inexact)."""
    if np.ndim(shift) == 0:
        s = _U(shift)
        mask = (_ONE << s) - _ONE
        half = _ONE << (s - _ONE)
    else:
        s = shift.astype(_U)
        mask = (_ONE << s) - _ONE
        half = mask - (mask >> _ONE)
    kept = sig >> s
    rem = sig & mask
    kept = kept + _increment(sig, kept, rem, half, neg, mode)
    return kept, rem != 0


def round_float64(
    x: np.ndarray,
    fmt: Format,
    rounding: Rounding = Rounding.NEAREST_EVEN,
    overflow: OverflowMode = OverflowMode.INF_NAN,
    *,
    tininess: Tininess = Tininess.AFTER,
    quantum: int | None = None,
    nan_bits: int | None = None,
    nan_to_zero: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Round binary64 values (exact, or rounded to odd) to ``fmt``.

    Returns ``(bits, flags)``: the result's bit patterns in ``fmt.uint`` and a
    ``uint8`` array of :class:`Flag` bits (INEXACT, UNDERFLOW, OVERFLOW only;
    the operation adds INVALID and DIVBYZERO). ``quantum`` rounds to a multiple
    of ``2**quantum`` instead (``0`` is round-to-integral; no underflow then).
    A NaN becomes ``nan_bits`` (default: the format's canonical quiet NaN).
    In saturation mode a result that would be +-Inf becomes +-MAX and a NaN
    becomes +0 (or stays NaN if ``nan_to_zero`` is false); flags are unchanged.
    """
    if fmt.precision > 51:
        raise ValueError(f"round_float64 needs at most 51 significand bits, {fmt.name} has {fmt.precision}")
    x = np.ascontiguousarray(x, dtype=np.float64)
    man = fmt.man_bits
    u = x.view(_U)
    neg = (u >> _U(63)).astype(bool)
    e = ((u >> _U(52)) & _U(0x7FF)).astype(np.int64)
    frac = u & _FRAC
    normal64 = e > 0
    sig = frac | (normal64.astype(_U) << _U(52))
    e = np.maximum(e, 1)  # binary64 subnormals share the exponent of the smallest normal
    floor_q = fmt.qmin if quantum is None else max(quantum, fmt.qmin)
    unbounded_shift = 52 - man
    # The result's quantum: the value's own at this precision, but not below floor_q.
    q = np.maximum(e - 1075 + unbounded_shift, floor_q)
    kept, inexact = _round_sig(sig, np.minimum(q - (e - 1075), 63), neg, rounding)
    if quantum is not None:
        # kept * 2**q need not be normalised here; it is a format value, so encode it exactly.
        r = np.where(e == 0x7FF, x, np.copysign(np.ldexp(kept.astype(np.float64), q), x))
        bits, _ = round_float64(r, fmt, rounding, overflow, nan_bits=nan_bits, nan_to_zero=nan_to_zero)
        return bits, (inexact & (e != 0x7FF)).astype(np.uint8)
    bits = ((q - fmt.qmin) << man) + kept.astype(np.int64)

    flags = inexact.astype(np.uint8)
    special = e == 0x7FF
    finite_over = (bits >= fmt.inf_bits) & ~special
    if finite_over.any():
        to_inf = {
            Rounding.NEAREST_EVEN: True, Rounding.NEAREST_AWAY: True,
            Rounding.TOWARD_ZERO: False, Rounding.ODD: False,
            Rounding.UPWARD: ~neg, Rounding.DOWNWARD: neg,
        }[rounding]
        bits = np.where(finite_over, np.where(to_inf, fmt.inf_bits, fmt.max_bits), bits)
        flags |= (finite_over * np.uint8(Flag.OVERFLOW | Flag.INEXACT)).astype(np.uint8)
    tiny_cut = fmt.emin + 1023  # binary64 biased exponent of 2**emin
    candidates = inexact & (e < tiny_cut)
    if candidates.any():
        tiny = e < tiny_cut - 1
        if tininess is Tininess.BEFORE:
            tiny = np.ones_like(tiny)
        else:
            edge = np.flatnonzero(candidates & ~tiny)
            if edge.size:
                kept_u, _ = _round_sig(sig[edge], unbounded_shift, neg[edge], rounding)
                tiny[edge] = kept_u < (1 << fmt.precision)
        flags |= ((candidates & tiny) * np.uint8(Flag.UNDERFLOW)).astype(np.uint8)

    bits = bits.astype(fmt.uint) | (neg.astype(fmt.uint) << fmt.uint.type(fmt.width - 1))
    if special.any():
        nan = special & (frac != 0)
        flags[special] = 0
        bits[special & ~nan] = fmt.inf_bits | (neg[special & ~nan].astype(fmt.uint) << (fmt.width - 1))
        bits[nan] = fmt.default_nan if nan_bits is None else nan_bits
    if overflow is OverflowMode.SATURATION:
        saturate(bits, fmt, nan_to_zero)
    return bits, flags


def saturate(bits: np.ndarray, fmt: Format, nan_to_zero: bool) -> None:
    """In place: +-Inf -> +-MAX, NaN -> +0 (or kept)."""
    mag = bits & fmt.uint.type(fmt.sign_bit - 1)
    inf = mag == fmt.inf_bits
    if inf.any():
        bits[inf] -= fmt.uint.type(1)
    if nan_to_zero:
        nan = mag > fmt.inf_bits
        if nan.any():
            bits[nan] = 0
