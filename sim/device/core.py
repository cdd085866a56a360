"""``Device``: a simulated NPU, made of its parts (the register, the elementwise, cast, cube and
reduction units), and the device a ``with`` block makes current."""

from __future__ import annotations

import contextvars
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from .. import profiles
from ..checks import integer
from ..formats import BFLOAT16, BINARY16, BINARY32
from ..fpu import Fpu
from ..rounding import SIX_MODES, OverflowMode, Rounding, Tininess
from .casts import _Casts
from .cube import _Cube
from .elementwise import _Elementwise
from .reductions import _Reductions
from .register import _NO_TAGS, Event, LegacyModeWarning, Observer, _Register

_current: contextvars.ContextVar[tuple[Device, ...]] = contextvars.ContextVar("sim_devices", default=())


def current_device() -> Device:
    """The innermost device entered with ``with`` in this thread or task."""
    stack = _current.get()
    if not stack:
        raise RuntimeError("no current device: run the code inside `with Device(...):`")
    return stack[-1]




def _matmul_bias(profile: profiles.Profile, matmul_bias: str) -> str:
    """A device's ``matmul_bias``, checked against its product's cube unit."""
    if matmul_bias not in ("after", "fused"):
        raise ValueError(f"matmul_bias must be 'after' or 'fused', got {matmul_bias!r}")
    if matmul_bias == "fused" and not profile.bias_table:
        raise ValueError(f"{profile.name}: its cube unit has no bias table (Mmad supports "
                         f"cmatrixSource=false only), so a bias cannot enter the binary32 sum; "
                         f"use matmul_bias='after'")
    return matmul_bias


def _overflow(profile: profiles.Profile, overflow: OverflowMode | str | None) -> OverflowMode:
    """A device's overflow mode: one its product has (its default for None); a legacy one warns."""
    mode = profile.default_overflow_mode if overflow is None else OverflowMode.parse(overflow)
    if mode not in profile.overflow_modes:
        raise ValueError(f"{profile.name} ({profile.product_en}) supports "
                         f"{profile.describe_modes()}, not {mode.name}")
    if mode is OverflowMode.SATURATION and profile.saturation_is_legacy:
        warnings.warn(f"{profile.name}: saturation mode is kept for compatibility only, is no longer "
                      f"developed, and may carry precision error; the default is INF_NAN",
                      LegacyModeWarning, stacklevel=3)  # the code that made the device
    return mode


def _rounding(rounding: Rounding | str) -> Rounding:
    """A device's rounding mode: one of the six deterministic ones (the others are for casts)."""
    rounding = Rounding.parse(rounding)
    if rounding not in SIX_MODES:
        raise ValueError(f"a device computes in one of {', '.join(m.name for m in SIX_MODES)}; "
                         f"{rounding.name} rounding is for casts: dev.cast(x, fmt, rounding={rounding.name!r})")
    return rounding

class Device(_Register, _Elementwise, _Casts, _Cube, _Reductions):
    """A simulated Atlas NPU with its own float-status register and sticky IEEE status."""

    def __init__(self, profile: str | profiles.Profile = "atlas-a2", overflow: OverflowMode | str | None = None,
                 *, rounding: Rounding | str = Rounding.NEAREST_EVEN, saturate_float32: bool | None = None,
                 tininess: Tininess | str | None = None, default_nan: int | None = None,
                 nan_to_zero: bool | None = None,
                 name: str | None = None, threads: int = 1, record_events: bool = False, seed: int = 0,
                 observers: Iterable[Observer] = (), substitutes: Mapping[str, Callable] | None = None,
                 matmul_bias: str = "after") -> None:
        self.profile = profiles.get(profile)
        #: Where a matmul's or convolution's bias enters when none is named in the call: "fused"
        #: (the initial value of the binary32 sums, one rounding) or "after" (added to the rounded
        #: product by the vector unit, a second rounding).
        self.matmul_bias = _matmul_bias(self.profile, matmul_bias)
        mode = self.overflow = _overflow(self.profile, overflow)
        rounding = _rounding(rounding)
        self.name = name or self.profile.name
        self.threads = integer("threads", threads, 1)
        #: The implementation-defined choices this device computes with: its profile's, with those
        #: named in the constructor (``saturate_float32``, ``tininess``, ``default_nan``,
        #: ``nan_to_zero``) changed.
        self.choices = self.profile.choices.replace(saturate_float32=saturate_float32, tininess=tininess,
                                                    default_nan=default_nan, nan_to_zero=nan_to_zero)
        kw = dict(rounding=rounding, choices=self.choices)
        #: Seeds the random bits of stochastic casts; each source format's unit draws its own stream.
        self.seed = integer("seed", seed, 0)
        self.fpu = Fpu(mode, format=BINARY16, default_nan=self.choices.default_nan, seed=4 * self.seed, **kw)
        f32_mode = mode if self.choices.saturate_float32 else OverflowMode.INF_NAN
        self._fpus = {np.dtype(np.float16): self.fpu,
                      np.dtype(np.float32): Fpu(f32_mode, format=BINARY32, seed=4 * self.seed + 1, **kw),
                      BFLOAT16.dtype: Fpu(mode, format=BFLOAT16, seed=4 * self.seed + 2, **kw)}
        self._register = np.zeros(8, np.int32)
        self._status = 0
        self._operations = 0
        self._label: str | None = None
        self._tags: Mapping[str, Any] = _NO_TAGS  # replaced, never changed: events share it
        self._observers: tuple[Observer, ...] = ()
        # The bound methods the observers have, so that an event without observers costs nothing.
        self._on_event: tuple[Callable[[Device, Event], None], ...] = ()
        self._on_tags: tuple[Callable[[Device, Mapping[str, Any], Mapping[str, Any]], None], ...] = ()
        if not isinstance(record_events, (bool, np.bool_)):
            raise ValueError(f"record_events must be a bool, got {record_events!r}")
        self._log: list[Event] | None = [] if record_events else None
        self._substitutes: dict[str, Callable] = {}
        self._mx_unit: Fpu | None = None  # quantize_mx's unit, made on first use
        self._group: Any = None
        self._rank: int | None = None
        self._lock = threading.RLock()
        for observer in observers:
            self.add_observer(observer)
        for op, fn in (substitutes or {}).items():
            self.substitute(op, fn)
        self._tokens: list[contextvars.Token] = []
        self._scalars: dict[tuple, tuple[np.ndarray, Fpu, int]] = {}  # scalar()'s results and flags

    def __repr__(self) -> str:
        return f"Device({self.profile.name!r}, overflow={self.overflow.name})"

    # -- context ------------------------------------------------------------------
    def __enter__(self) -> Device:
        self._tokens.append(_current.set(_current.get() + (self,)))
        return self

    def __exit__(self, *exc) -> None:
        _current.reset(self._tokens.pop())

