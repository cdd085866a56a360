"""The public elementwise face of the emulator: settings plus a sticky status."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import ops
from .formats import BINARY16, Format, format_of
from .rounding import Flag, OverflowMode, Rounder, Rounding, Tininess, saturate

__all__ = ["Fpu"]

#: Elements per chunk: the working set of one chunk stays in the L2 cache.
CHUNK = 1 << 14

_Out = np.ndarray | tuple[np.ndarray, np.ndarray]


class Fpu:
    """A binary16 floating-point unit (or bfloat16, binary32: ``format=``).

    Every operation rounds once, in ``rounding``, and returns the IEEE result
    (``OverflowMode.INF_NAN``) or the Ascend saturated one (``SATURATION``:
    +-Inf -> +-MAX, NaN -> +0, or NaN kept with ``nan_to_zero=False``, as OCP
    FP8 does). Per-element flags are the IEEE flags in both modes; ``status``
    is their sticky OR since the last :meth:`clear_status`. NaN results are
    the format's canonical quiet NaN (``default_nan`` overrides the bits);
    input payloads are not propagated.
    """

    def __init__(
        self,
        overflow: OverflowMode | str = OverflowMode.INF_NAN,
        rounding: Rounding | str = Rounding.NEAREST_EVEN,
        tininess: Tininess | str = Tininess.AFTER,
        *,
        format: Format | str = BINARY16,
        nan_to_zero: bool = True,
        default_nan: int | None = None,
    ) -> None:
        self.overflow = OverflowMode.parse(overflow)
        self.rounding = Rounding.parse(rounding)
        self.tininess = Tininess.parse(tininess)
        self.format = format_of(format)
        if self.format.precision > 25:
            raise ValueError(f"Fpu computes in formats of at most 25 significand bits "
                             f"(binary16, bfloat16, binary32), not {self.format.name}")
        self.nan_to_zero = bool(nan_to_zero)
        self.default_nan = self.format.default_nan if default_nan is None else int(default_nan)
        self._status = 0

    def __repr__(self) -> str:
        return (f"Fpu(overflow={self.overflow.name}, rounding={self.rounding.name}, "
                f"tininess={self.tininess.name}, format={self.format.name})")

    # -- status ---------------------------------------------------------------
    @property
    def status(self) -> Flag:
        """OR of every flag raised since the last clear (sticky)."""
        return Flag(self._status)

    def clear_status(self) -> None:
        self._status = 0

    # -- arithmetic -------------------------------------------------------------
    def add(self, a, b, *, return_flags: bool = False) -> _Out:
        """a + b, rounded once."""
        down = self.rounding is Rounding.DOWNWARD
        return self._run("add", lambda x, y: ops.add(x, y, self.format, down), (a, b), return_flags)

    def sub(self, a, b, *, return_flags: bool = False) -> _Out:
        """a - b, rounded once."""
        down = self.rounding is Rounding.DOWNWARD
        return self._run("sub", lambda x, y: ops.add(x, -y, self.format, down), (a, b), return_flags)

    def mul(self, a, b, *, return_flags: bool = False) -> _Out:
        """a * b, rounded once."""
        return self._run("mul", lambda x, y: ops.mul(x, y, self.format), (a, b), return_flags)

    def div(self, a, b, *, return_flags: bool = False) -> _Out:
        """a / b, rounded once."""
        return self._run("div", lambda x, y: ops.div(x, y, self.format), (a, b), return_flags)

    def sqrt(self, a, *, return_flags: bool = False) -> _Out:
        """Square root, rounded once; sqrt(-0) is -0."""
        return self._run("sqrt", lambda x: ops.sqrt(x, self.format), (a,), return_flags)

    def fma(self, a, b, c, *, return_flags: bool = False) -> _Out:
        """a * b + c with a single rounding."""
        down = self.rounding is Rounding.DOWNWARD
        return self._run("fma", lambda x, y, z: ops.fma(x, y, z, self.format, down), (a, b, c), return_flags)

    def rint(self, a, *, exact: bool = False, return_flags: bool = False) -> _Out:
        """Round to an integral value in the current rounding mode.

        IEEE ``roundToIntegral``: no INEXACT unless ``exact=True``
        (``roundToIntegralExact``).
        """
        return self._run("rint", lambda x: x, (a,), return_flags,
                         quantum=0, keep=0x1F if exact else 0x1F & ~Flag.INEXACT)

    def via_float64(self, fn: Callable, *args, pole: Callable | None = None, return_flags: bool = False) -> _Out:
        """``fn`` computed in binary64 from the exact operands, rounded once.

        The model of an operation whose hardware result is taken as correctly
        rounded from binary64 (transcendentals). A binary64 overflow from
        finite operands is an overflow; ``pole(*xs)`` marks where an infinite
        result is exact (log(0)): DIVBYZERO. A NaN from non-NaN operands is
        INVALID, and so is a signaling NaN operand.
        """
        def kernel(*xs):
            r = fn(*xs)
            inf = np.isinf(r)
            if inf.any():
                inf &= np.logical_and.reduce([np.isfinite(x) for x in xs])
                if pole is not None:
                    inf &= ~pole(*xs)
                r = np.where(inf, np.copysign(np.finfo(np.float64).max, r), r)
            return r
        return self._run("via_float64", kernel, args, return_flags, special=self._poles(pole))

    def _poles(self, pole: Callable | None) -> Callable:
        def special(parts, xs, r):
            quiet_in = np.logical_or.reduce([np.isnan(x) for x in xs])
            flags = (np.isnan(r) & ~quiet_in) * np.uint8(Flag.INVALID)
            for p in parts:
                flags |= ops.is_snan(p.view(self.format.uint), self.format) * np.uint8(Flag.INVALID)
            if pole is not None:
                flags |= (np.isinf(r) & pole(*xs)) * np.uint8(Flag.DIVBYZERO)
            return flags
        return special

    def neg(self, a, *, return_flags: bool = False) -> _Out:
        """-a: exact, quiet (no flags, even for a signaling NaN)."""
        return self._run("neg", np.negative, (a,), return_flags, special=self._quiet)

    def abs(self, a, *, return_flags: bool = False) -> _Out:
        """|a|: exact, quiet."""
        return self._run("abs", np.abs, (a,), return_flags, special=self._quiet)

    @staticmethod
    def _quiet(parts, xs, r):
        return np.zeros(r.shape, np.uint8)

    # -- conversions ------------------------------------------------------------
    def convert(self, x, dtype, *, return_flags: bool = False) -> _Out:
        """Convert between binary16, bfloat16, binary32 and binary64.

        Narrowing rounds in the current mode; widening is exact. The overflow
        mode applies to every result (an Inf becomes the target's MAX in
        saturation mode). A signaling NaN raises INVALID.
        """
        src = self._format_of_array(x, "convert")
        return self._run("convert", lambda v: v, (x,), return_flags, src=src, dst=format_of(dtype))

    # -- comparisons ------------------------------------------------------------
    def eq(self, a, b, *, signaling: bool = False, return_flags: bool = False) -> _Out:
        """a == b; quiet (INVALID only for a signaling NaN) unless ``signaling``."""
        return self._compare(np.equal, a, b, signaling, return_flags)

    def lt(self, a, b, *, signaling: bool = True, return_flags: bool = False) -> _Out:
        """a < b; signaling (INVALID for any NaN) unless ``signaling=False``."""
        return self._compare(np.less, a, b, signaling, return_flags)

    def le(self, a, b, *, signaling: bool = True, return_flags: bool = False) -> _Out:
        """a <= b; signaling (INVALID for any NaN) unless ``signaling=False``."""
        return self._compare(np.less_equal, a, b, signaling, return_flags)

    # -- machinery --------------------------------------------------------------
    def _format_of_array(self, x, op: str) -> Format:
        if not isinstance(x, (np.ndarray, np.generic)):
            raise TypeError(f"{op}: expected a numpy array or numpy scalar, got {type(x).__name__}; "
                            f"wrap values as np.asarray(x, dtype=...)")
        try:
            return format_of(x.dtype)
        except ValueError:
            raise TypeError(f"{op}: unsupported dtype {x.dtype}; valid: float16, bfloat16, float32, float64") from None

    def _operands(self, op: str, args: tuple, fmt: Format) -> tuple[list[np.ndarray], tuple[int, ...], bool]:
        for name, x in zip("abc", args, strict=False):
            if not isinstance(x, (np.ndarray, np.generic)) or x.dtype != fmt.dtype:
                got = x.dtype if hasattr(x, "dtype") else type(x).__name__
                raise TypeError(f"{op}: operand {name} has dtype {got}; {fmt.name} operations take "
                                f"numpy {fmt.dtype} arrays or scalars (convert with fpu.convert(x, {fmt.dtype}))")
        try:
            shape = np.broadcast_shapes(*(np.shape(x) for x in args))
        except ValueError:
            shapes = ", ".join(str(np.shape(x)) for x in args)
            raise ValueError(f"{op}: operand shapes {shapes} do not broadcast together") from None
        flat = [np.ascontiguousarray(np.broadcast_to(x, shape)).reshape(-1) for x in args]
        scalar = all(isinstance(x, np.generic) for x in args)
        return flat, shape, scalar

    def _finish(self, out, flags, shape, scalar, return_flags):
        out = out.reshape(shape)
        if not return_flags:
            return out[()] if scalar else out
        flags = flags.reshape(shape)
        return (out[()], flags[()]) if scalar else (out, flags)

    def _rounder(self, dst: Format) -> Rounder:
        nan = self.default_nan if dst == self.format else None
        return Rounder(dst, self.rounding, self.overflow, self.tininess, nan, self.nan_to_zero)

    def _run(self, op: str, kernel: Callable, args: tuple, return_flags: bool, *,
             quantum: int | None = None, keep: int = 0x1F, special: Callable | None = None,
             src: Format | None = None, dst: Format | None = None) -> _Out:
        """Apply ``kernel`` (binary64 operands -> exact or round-to-odd binary64
        result) chunk by chunk, round, and gather flags. The rare results that
        need the full rounding treatment are collected and rounded at the end."""
        src, dst = src or self.format, dst or self.format
        flat, shape, scalar = self._operands(op, args, src)
        rounder = None if dst.precision > 51 else self._rounder(dst)
        n = flat[0].size
        out = np.empty(n, dst.dtype)
        bits_out = out.view(dst.uint)
        flags = np.empty(n if return_flags else 0, np.uint8)
        status = 0
        hard_at, hard_x = [], []
        with np.errstate(all="ignore"):
            for lo in range(0, n, CHUNK):
                parts = [x[lo:lo + CHUNK] for x in flat]
                xs = [p.astype(np.float64) for p in parts]
                r = kernel(*xs)
                if rounder is None:
                    bits, f = self._widen(r, dst)
                elif quantum is not None:
                    bits, f = rounder.to_quantum(r, quantum)
                else:
                    bits, f, hard = rounder.bulk(r)
                    if hard.size:
                        f[hard] = 0
                        hard_at.append(hard + lo)
                        hard_x.append(r[hard])
                if not np.isfinite(r).all():
                    if special is None:
                        f |= ops.special_flags(op, xs, r)
                        for p in parts:
                            f |= ops.is_snan(p.view(src.uint), src) * np.uint8(Flag.INVALID)
                    else:
                        f |= special(parts, xs, r)
                bits_out[lo:lo + CHUNK] = bits
                if return_flags:
                    flags[lo:lo + CHUNK] = f
                status |= int(np.bitwise_or.reduce(f))
            if hard_at:
                at = np.concatenate(hard_at)
                bits_out[at], f = rounder.hard(np.concatenate(hard_x))
                if return_flags:
                    flags[at] |= f
                status |= int(np.bitwise_or.reduce(f))
        if keep != 0x1F:
            flags &= np.uint8(keep)
            status &= keep
        self._status |= status
        return self._finish(out, flags, shape, scalar, return_flags)

    def _widen(self, r: np.ndarray, dst: Format) -> tuple[np.ndarray, np.ndarray]:
        """Exact results in binary64: only NaN canonicalisation and the overflow mode apply."""
        bits = r.astype(dst.dtype).view(dst.uint).copy()
        bits[np.isnan(r)] = dst.default_nan
        if self.overflow is OverflowMode.SATURATION:
            bits = saturate(bits, dst, self.nan_to_zero)
        return bits, np.zeros(r.shape, np.uint8)

    def _compare(self, ufunc, a, b, signaling: bool, return_flags: bool) -> _Out:
        fmt = self.format
        flat, shape, scalar = self._operands(ufunc.__name__, (a, b), fmt)
        x, y = (v.astype(np.float64) for v in flat)
        result = ufunc(x, y)
        if signaling:
            bad = np.isnan(x) | np.isnan(y)
        else:
            bad = ops.is_snan(flat[0].view(fmt.uint), fmt) | ops.is_snan(flat[1].view(fmt.uint), fmt)
        flags = bad * np.uint8(Flag.INVALID)
        if bad.any():
            self._status |= Flag.INVALID
        return self._finish(result, flags, shape, scalar, return_flags)
