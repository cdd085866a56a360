"""A simulated NPU: a product profile, an overflow mode, tensor operations on
the emulator, and the sticky float-status register that loss scaling reads.

The float-status register reads as ``int32[8]`` (as ``NpuGetFloatStatusV2``
does). Its slots, as this model uses them:

====  ==================================================================
slot  meaning
====  ==================================================================
0     1 if an element raised OVERFLOW since the last clear
1     1 if an element raised INVALID
2     1 if an element raised DIVBYZERO
3     how many device operations raised any of the three
4-7   0 (reserved)
====  ==================================================================

Any non-zero slot means an overflow/invalid event, as on the device. Every
operation run on the device ORs its events in, the forward pass included;
reading does not clear, only :meth:`Device.clear_float_status` does. INEXACT
and UNDERFLOW do not reach the register.

Arithmetic is binary16 (and binary32 or bfloat16 where the operands are),
in the device's overflow mode; binary32 results saturate too in saturation
mode unless ``saturate_float32=False``. Transcendentals are modelled as
correctly rounded from binary64. ``matmul`` multiplies exactly, accumulates in
binary32 (the cube unit) or binary16, along k in ascending order with one
rounding per addition, and rounds the result once to the output dtype;
``sum`` and ``mean`` add in a fixed pairwise tree. No result depends on the
machine or its BLAS.
"""

from __future__ import annotations

import contextvars
import functools
import os
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import profiles
from .formats import BFLOAT16, BINARY16, BINARY32, format_of
from .fpu import Fpu
from .rounding import Flag, OverflowMode, Rounding

__all__ = ["Device", "current_device", "LegacyModeWarning", "EVENTS"]

#: The flags that reach the float-status register.
EVENTS = Flag.OVERFLOW | Flag.INVALID | Flag.DIVBYZERO

_current: contextvars.ContextVar[tuple[Device, ...]] = contextvars.ContextVar("sim_devices", default=())


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(_workers(), thread_name_prefix="sim-matmul")


def _workers() -> int:
    return max(1, min(os.cpu_count() or 1, 4))


class LegacyModeWarning(UserWarning):
    """Saturation mode chosen on a product where it is kept only for compatibility."""


def current_device() -> Device:
    """The innermost device entered with ``with`` in this thread or task."""
    stack = _current.get()
    if not stack:
        raise RuntimeError("no current device: run the code inside `with Device(...):`")
    return stack[-1]


class Device:
    """A simulated Atlas NPU with its own float-status register."""

    def __init__(self, profile: str | profiles.Profile = "atlas-a2", overflow: OverflowMode | str | None = None,
                 *, rounding: Rounding | str = Rounding.NEAREST_EVEN, saturate_float32: bool = True,
                 name: str | None = None) -> None:
        self.profile = profiles.get(profile)
        mode = self.profile.default_overflow_mode if overflow is None else OverflowMode.parse(overflow)
        if mode not in self.profile.overflow_modes:
            raise ValueError(f"{self.profile.name} ({self.profile.product_en}) supports "
                             f"{self.profile.describe_modes()}, not {mode.name}")
        if mode is OverflowMode.SATURATION and self.profile.saturation_is_legacy:
            warnings.warn(f"{self.profile.name}: saturation mode is kept for compatibility only, is no longer "
                          f"developed, and may carry precision error; the default is INF_NAN",
                          LegacyModeWarning, stacklevel=2)
        self.overflow = mode
        self.name = name or self.profile.name
        p = self.profile
        kw = dict(rounding=rounding, tininess=p.tininess)
        self.fpu = Fpu(mode, format=BINARY16, default_nan=p.default_nan, **kw)
        f32_mode = mode if saturate_float32 else OverflowMode.INF_NAN
        self._fpus = {np.dtype(np.float16): self.fpu,
                      np.dtype(np.float32): Fpu(f32_mode, format=BINARY32, **kw),
                      BFLOAT16.dtype: Fpu(mode, format=BFLOAT16, **kw)}
        self._register = np.zeros(8, np.int32)
        self.group = None  # set by sim.Group: the collective this device is a rank of
        self.rank: int | None = None
        self._lock = threading.RLock()
        self._tokens: list[contextvars.Token] = []

    def __repr__(self) -> str:
        return f"Device({self.profile.name!r}, overflow={self.overflow.name})"

    # -- the float-status register ------------------------------------------------
    def get_float_status(self) -> np.ndarray:
        """The register, ``int32[8]``: all zero unless an event happened since the last clear."""
        with self._lock:
            return self._register.copy()

    def clear_float_status(self) -> None:
        with self._lock:
            self._register[:] = 0

    def _record(self, flags: Flag) -> None:
        events = flags & EVENTS
        if events:
            self._register[0] |= bool(events & Flag.OVERFLOW)
            self._register[1] |= bool(events & Flag.INVALID)
            self._register[2] |= bool(events & Flag.DIVBYZERO)
            self._register[3] = min(int(self._register[3]) + 1, np.iinfo(np.int32).max)

    def _on(self, x: np.ndarray) -> Fpu:
        try:
            return self._fpus[np.asarray(x).dtype]
        except KeyError:
            raise TypeError(f"{self.name}: no arithmetic on dtype {np.asarray(x).dtype}; "
                            f"valid: float16, float32, bfloat16") from None

    def _run(self, fpu: Fpu, call: Callable[[], np.ndarray]) -> np.ndarray:
        """Run one operation on ``fpu`` and OR its events into the register."""
        with self._lock:
            fpu.clear_status()
            result = call()
            self._record(fpu.status)
            return result

    # -- context ------------------------------------------------------------------
    def __enter__(self) -> Device:
        self._tokens.append(_current.set(_current.get() + (self,)))
        return self

    def __exit__(self, *exc) -> None:
        _current.reset(self._tokens.pop())

    # -- elementwise --------------------------------------------------------------
    _NUMPY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}

    def _binary(self, op: str, a, b) -> np.ndarray:
        fpu = self._on(a)
        if self._native32(fpu, a, b):
            # binary32 to nearest even is what numpy computes; a finite result from
            # finite operands raised no event, so the register has nothing to learn.
            with np.errstate(all="ignore"):
                r = self._NUMPY[op](a, b)
            if np.isfinite(r).all() and np.isfinite(a).all() and np.isfinite(b).all():
                return r
        return self._run(fpu, lambda: getattr(fpu, op)(a, b))

    def _native32(self, fpu: Fpu, *xs) -> bool:
        """Whether numpy's own binary32 arithmetic gives this device's result."""
        return (fpu.format is BINARY32 and fpu.rounding is Rounding.NEAREST_EVEN
                and all(np.asarray(x).dtype == np.float32 for x in xs))

    def add(self, a, b) -> np.ndarray:
        return self._binary("add", a, b)

    def sub(self, a, b) -> np.ndarray:
        return self._binary("sub", a, b)

    def mul(self, a, b) -> np.ndarray:
        return self._binary("mul", a, b)

    def div(self, a, b) -> np.ndarray:
        return self._binary("div", a, b)

    def neg(self, a) -> np.ndarray:
        fpu = self._on(a)
        return self._run(fpu, lambda: fpu.neg(a))

    def abs(self, a) -> np.ndarray:
        fpu = self._on(a)
        return self._run(fpu, lambda: fpu.abs(a))

    def _f64(self, fn: Callable, *args, pole: Callable | None = None) -> np.ndarray:
        fpu = self._on(args[0])
        return self._run(fpu, lambda: fpu.via_float64(fn, *args, pole=pole))

    def maximum(self, a, b) -> np.ndarray:
        """Elementwise maximum; NaN if either is NaN."""
        return self._f64(np.maximum, a, b)

    def exp(self, a) -> np.ndarray:
        return self._f64(np.exp, a)

    def log(self, a) -> np.ndarray:
        """Natural log; log(0) = -Inf raises DIVBYZERO, log(<0) is INVALID."""
        return self._f64(np.log, a, pole=lambda x: x == 0)

    def tanh(self, a) -> np.ndarray:
        return self._f64(np.tanh, a)

    def sigmoid(self, a) -> np.ndarray:
        return self._f64(lambda x: 0.5 * (1.0 + np.tanh(0.5 * x)), a)

    def relu(self, a) -> np.ndarray:
        """max(a, 0), with +0 for -0 and NaN kept."""
        return self._f64(lambda x: np.where(np.isnan(x) | (x > 0), x, 0.0), a)

    def cast(self, x, dtype, rounding: Rounding | str | None = None) -> np.ndarray:
        """Convert between float32, binary16 and bfloat16 in ``rounding`` (default: the device's)."""
        src = self._on(x)
        fpu = src if rounding is None else Fpu(src.overflow, rounding, src.tininess, format=src.format,
                                               default_nan=src.default_nan)
        dst = format_of(dtype)  # refuse unknown targets before running
        if dst is BINARY16 and fpu.rounding is Rounding.NEAREST_EVEN and np.asarray(x).dtype == np.float32:
            # numpy rounds binary32 to binary16 once, to nearest even: below 65520, and with
            # no NaN, that is the device's result and raises no event.
            with np.errstate(invalid="ignore"):
                if np.abs(x).max(initial=0) < 65520:
                    return np.asarray(x).astype(np.float16)
        return self._run(fpu, lambda: fpu.convert(x, dtype))

    # -- reductions and matmul ----------------------------------------------------
    def matmul(self, a, b, accumulate=np.float32, out_dtype=np.float16) -> np.ndarray:
        """``a @ b`` for binary16 matrices (M, K) and (K, N).

        Products are exact; they are added along k in ascending order, each
        addition rounded to ``accumulate`` (float32: to nearest even, as the
        cube unit accumulates, whatever the device's rounding mode; float16:
        the device's rounding and overflow mode at every step); the sum is
        rounded once to ``out_dtype`` in the device's mode.
        """
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype != np.float16 or b.dtype != np.float16:
            raise TypeError(f"matmul takes binary16 operands, got {a.dtype} and {b.dtype}")
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise ValueError(f"matmul needs shapes (M, K) and (K, N), got {a.shape} and {b.shape}")
        acc_fmt, out_fmt = format_of(accumulate), format_of(out_dtype)
        if acc_fmt not in (BINARY16, BINARY32) or out_fmt not in (BINARY16, BINARY32):
            raise ValueError(f"matmul accumulates and returns float16 or float32, not "
                             f"{np.dtype(accumulate)} / {np.dtype(out_dtype)}")
        if acc_fmt is BINARY16:
            acc = self._matmul16(a, b)
            return acc if out_fmt is BINARY16 else self.cast(acc, out_fmt.dtype)
        return self.cast(self._matmul32(a, b), out_fmt.dtype)  # binary32 to binary32 still saturates

    def _matmul32(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Sequential binary32 accumulation over k; row blocks run on worker threads
        (numpy releases the GIL), which changes nothing in the result."""
        a32t, b32 = np.ascontiguousarray(a.T, np.float32), b.astype(np.float32)
        acc = np.zeros((a.shape[0], b.shape[1]), np.float32)

        def rows(lo: int, hi: int, kb: int = 8) -> None:
            part = acc[lo:hi]
            terms = np.empty((kb, hi - lo, b.shape[1]), np.float32)
            with np.errstate(all="ignore"):
                for k0 in range(0, a32t.shape[0], kb):
                    t = terms[:min(kb, a32t.shape[0] - k0)]
                    np.multiply(a32t[k0:k0 + kb, lo:hi, None], b32[k0:k0 + kb, None, :], out=t)  # exact
                    for term in t:
                        np.add(part, term, out=part)

        workers = _workers() if a.size * b.shape[1] >= 1 << 20 else 1  # threads pay off on large products only
        bounds = np.linspace(0, a.shape[0], workers + 1).astype(int)
        if workers == 1:
            rows(0, a.shape[0])
        else:
            list(_pool().map(rows, bounds[:-1], bounds[1:]))
        if not np.isfinite(acc).all():
            self._matmul_events(a32t.T, b32, acc)
        return acc

    def _matmul_events(self, a32: np.ndarray, b32: np.ndarray, acc: np.ndarray) -> None:
        """INVALID for NaNs made inside the accumulation (0*Inf, Inf-Inf); binary32
        cannot overflow on binary16 products."""
        nan_in = np.isnan(a32).any(axis=1)[:, None] | np.isnan(b32).any(axis=0)[None, :]
        if (np.isnan(acc) & ~nan_in).any():
            with self._lock:
                self._record(Flag.INVALID)

    def _matmul16(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        acc = np.zeros((a.shape[0], b.shape[1]), np.float16)
        fpu = self.fpu
        for k in range(a.shape[1]):
            acc = self._run(fpu, lambda k=k, acc=acc: fpu.fma(a[:, k, None], b[None, k, :], acc))
        return acc

    def sum(self, x, axis: int | None = None, accumulate=None, out_dtype=None) -> np.ndarray:
        """Sum along ``axis`` (all if None) in a fixed pairwise tree, each
        addition rounded to ``accumulate`` (default: x's dtype); the result is
        rounded to ``out_dtype`` (default: x's dtype)."""
        x = np.asarray(x)
        self._on(x)
        acc_dtype = x.dtype if accumulate is None else np.dtype(accumulate)
        out_dtype = x.dtype if out_dtype is None else np.dtype(out_dtype)
        v = x.reshape(-1) if axis is None else np.moveaxis(x, axis, 0)
        if acc_dtype != x.dtype:
            v = self.cast(v, acc_dtype)
        fpu = self._on(v)
        if v.shape[0] == 0:
            v = np.zeros((1, *v.shape[1:]), v.dtype)
        total = None
        if self._native32(fpu, v):
            with np.errstate(all="ignore"):
                total = self._tree(v, np.add)  # binary32, nearest even: numpy's own, when all stays finite
            if not (np.isfinite(total).all() and np.isfinite(v).all()):
                total = None
        if total is None:
            total = self._tree(v, lambda x, y: self._run(fpu, lambda: fpu.add(x, y)))
        return total if total.dtype == out_dtype else self.cast(total, out_dtype)

    def _tree(self, v: np.ndarray, add) -> np.ndarray:
        """Adjacent pairs, then pairs of pairs, ... along axis 0."""
        while v.shape[0] > 1:
            half = v.shape[0] // 2
            pairs = add(v[0:2 * half:2], v[1:2 * half:2])
            v = np.concatenate([pairs, v[2 * half:]]) if v.shape[0] % 2 else pairs
        return v[0]

    def mean(self, x, axis: int | None = None, accumulate=None, out_dtype=None) -> np.ndarray:
        """``sum`` divided by the count, in the accumulation dtype, then rounded to ``out_dtype``."""
        x = np.asarray(x)
        acc_dtype = x.dtype if accumulate is None else np.dtype(accumulate)
        total = self.sum(x, axis, accumulate=acc_dtype, out_dtype=acc_dtype)
        count = x.size if axis is None else x.shape[axis]
        mean = self.div(np.asarray(total), np.asarray(count, acc_dtype)[()])
        out_dtype = x.dtype if out_dtype is None else np.dtype(out_dtype)
        return mean if np.asarray(mean).dtype == out_dtype else self.cast(mean, out_dtype)
