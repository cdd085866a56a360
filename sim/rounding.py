"""Rounding settings: the modes, flags, overflow modes and tininess, as named values,
and how they become the settings of the compiled rounding routine.

The rounding itself happens in one place, :func:`sim.kernels.round_pack`;
:func:`round_float64` applies it to binary64 arrays.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from . import kernels
from .formats import Format

__all__ = ["config", "Choices"]


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
    """The rounding modes; aliases are the Ascend Cast and TestFloat names.

    The six deterministic modes (:data:`SIX_MODES`) apply to every format. ``STOCHASTIC``
    rounds up with probability equal to the dropped fraction of an ulp, from a seeded
    counter-based random source (``Fpu(seed=, random_bits=)``). ``HYBRID`` is HiFloat8's HR
    (Ascend ``CAST_HYBRID``), for casts into HiFloat8 only.
    """

    NEAREST_EVEN = "rint"
    TOWARD_ZERO = "trunc"
    DOWNWARD = "floor"
    UPWARD = "ceil"
    NEAREST_AWAY = "round"
    ODD = "odd"
    STOCHASTIC = "stochastic"
    HYBRID = "hybrid"

    @classmethod
    def _aliases(cls) -> dict[str, tuple[str, ...]]:
        return {
            "NEAREST_EVEN": ("rint", "near_even", "rne"),
            "TOWARD_ZERO": ("trunc", "minmag", "rtz"),
            "DOWNWARD": ("floor", "min"),
            "UPWARD": ("ceil", "max"),
            "NEAREST_AWAY": ("round", "near_maxmag", "rna"),
            "ODD": ("odd", "rto"),
            "STOCHASTIC": ("sr",),
            "HYBRID": ("hr", "cast_hybrid"),
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


@dataclasses.dataclass(frozen=True)
class Choices:
    """The choices IEEE 754 and Ascend's documents leave to an implementation, kept in one place
    (as SoftFloat keeps a platform's in one ``specialize.h``). A product's are its profile's
    (``Profile.choices``); ``Fpu`` and ``Device`` read them, and each can be overridden by name
    (``Device("atlas-a2", tininess="before")``, ``Fpu(nan_to_zero=False)``). Where a source
    is silent the value is the model's choice, said here."""

    #: The bits of a binary16 NaN result: the positive canonical quiet NaN, 0x7E00 (the sources are
    #: silent; x86's and SoftFloat's default NaN is the negative one). bfloat16 and binary32 results
    #: take their format's positive canonical quiet NaN.
    default_nan: int = 0x7E00
    #: When underflow's tininess is detected: after rounding, as x86 and TestFloat's default (the
    #: sources are silent).
    tininess: Tininess = Tininess.AFTER
    #: In saturation mode a NaN result becomes +0 (Ascend's rule, "NaN -> 0"); False keeps the NaN,
    #: as OCP FP8's saturating conversion does.
    nan_to_zero: bool = True
    #: binary32 results follow the device's overflow mode, as binary16 and bfloat16 ones do; False
    #: keeps binary32 in INF/NaN mode while the narrower formats saturate.
    saturate_float32: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "tininess", Tininess.parse(self.tininess))
        for name in ("nan_to_zero", "saturate_float32"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
            object.__setattr__(self, name, bool(getattr(self, name)))

    def replace(self, **changes) -> Choices:
        """These choices with some changed by name; a value of None leaves its choice as it is."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown choice {', '.join(unknown)}; the choices are "
                            f"{', '.join(f.name for f in dataclasses.fields(self))}")
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


#: The six deterministic rounding modes, which every format and operation supports.
SIX_MODES = (Rounding.NEAREST_EVEN, Rounding.TOWARD_ZERO, Rounding.DOWNWARD, Rounding.UPWARD,
             Rounding.NEAREST_AWAY, Rounding.ODD)

_MODE_CODE = {
    Rounding.NEAREST_EVEN: kernels.RNE, Rounding.TOWARD_ZERO: kernels.RTZ, Rounding.DOWNWARD: kernels.DOWN,
    Rounding.UPWARD: kernels.UP, Rounding.NEAREST_AWAY: kernels.RNA, Rounding.ODD: kernels.ODD,
    Rounding.STOCHASTIC: kernels.STOCHASTIC, Rounding.HYBRID: kernels.HYBRID,
}


def config(fmt: Format, rounding: Rounding = Rounding.NEAREST_EVEN, overflow: OverflowMode = OverflowMode.INF_NAN,
           tininess: Tininess = Tininess.AFTER, nan_bits: int | None = None, nan_to_zero: bool = True,
           quantum: int | None = None, keep: int = 0x1F, *, random_bits: int = 0,
           source: Format | None = None) -> np.ndarray:
    """The settings array of the compiled kernels for rounding into ``fmt`` (see :mod:`sim.kernels`):
    ``random_bits`` for stochastic rounding, ``source`` for hybrid rounding."""
    if fmt.precision > 53:
        raise ValueError(f"the rounding routine handles formats of at most 53 significand bits, "
                         f"{fmt.name} has {fmt.precision}")
    if rounding is Rounding.HYBRID:
        if not fmt.tapered:
            raise ValueError(f"hybrid rounding (HR) is HiFloat8's; {fmt.name} takes "
                             f"{', '.join(m.name for m in SIX_MODES)} or STOCHASTIC")
        if source is None or source.man_bits > 23:
            raise ValueError("hybrid rounding needs a binary32, binary16 or bfloat16 source")
        random_bits, src = (14 if source.man_bits == 23 else 2), (source.man_bits, source.qmin)
    else:
        src = (0, 0)
    return kernels.config(fmt.encoding, _MODE_CODE[rounding], overflow is OverflowMode.SATURATION,
                          tininess is Tininess.BEFORE, nan_bits, nan_to_zero, quantum, keep, random_bits, src)


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
    """Round binary64 values to ``fmt``: ``(bits, flags)``, bits in ``fmt.uint``, flags ``uint8``.

    Each value must carry what the rounding needs (the exact value, or one strictly
    between the same two consecutive (p+1)-bit numbers as the exact value; the exact
    value rounded to odd at 53 bits always does). In saturation mode a result that
    would be +-Inf becomes +-MAX and a NaN +0 (kept with ``nan_to_zero=False``).
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    bits = np.empty(x.shape, fmt.uint)
    flags = np.empty(x.shape, np.uint8)
    kernels.round_values(x.reshape(-1), bits.reshape(-1), flags.reshape(-1),
                         config(fmt, Rounding.parse(rounding), OverflowMode.parse(overflow),
                                Tininess.parse(tininess), nan_bits, nan_to_zero))
    return bits, flags
