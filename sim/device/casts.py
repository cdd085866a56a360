"""A device's conversions: casts into its formats, the rounding of a fused kernel's results, a
program's numbers."""

from __future__ import annotations

import math

import numpy as np

from .. import kernels as K
from ..formats import BINARY64, Format, format_of
from ..fpu import Fpu, finish, narrowing32, plain
from ..rounding import OverflowMode, Rounding
from .elementwise import _TABLE_MIN

_SCALARS_KEPT = 4096  # the most values Device.scalar keeps (then it starts again)



class _Casts:
    """Conversions into a device's formats: casts, a fused kernel's results, a program's numbers."""

    def cast(self, x, dtype, rounding: Rounding | str | None = None, overflow: OverflowMode | str | None = None,
             *, return_flags: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Convert between float32, binary16 and bfloat16 (or widen to float64; float64 sources,
        such as the scalars of a program, round into the device's formats), or into the 8-bit
        formats (:data:`sim.formats.EIGHT_BIT`, by ml_dtypes dtype or name; ``"hifloat8"``'s
        results are uint8 codes), rounding in ``rounding`` (default: the device's; ``"stochastic"`` draws from
        the device's ``seed``) and in the overflow mode of the destination (default: the
        device's; ``"satfinite"``: OCP's saturating cast, NaN kept). Ascend's saturation
        control covers casts to hif8, e8m0, e5m2 and e4m3fn as it does half and bf16.
        ``return_flags`` (casts into the 8-bit formats): also each element's flags."""
        x = plain(x)
        dst = format_of(dtype)
        if dst.dtype.itemsize == 1 or overflow is not None:
            src_fpu = self._on(x)
            mode = None if rounding is None else Rounding.parse(rounding)
            result, shape, scalar = src_fpu.cast_to(x, dst, mode, overflow or self._overflow_of(dst))
            self._record(result.status, "cast", math.prod(shape))
            return finish(result, shape, scalar, return_flags)
        if return_flags:
            raise ValueError("cast returns flags for casts into the 8-bit formats "
                             "(Fpu.convert has them for every cast)")
        if getattr(x, "dtype", None) == np.float64 and dst is not BINARY64:
            _, (result, shape, scalar) = self._from_float64(x, dtype, rounding, "cast's dtype")
            self._record(result.status, "cast", math.prod(shape))
            return finish(result, shape, scalar, False)
        src_fpu = self._on(x)
        src = src_fpu.format
        fpu = self._fpus.get(dst.dtype, src_fpu)
        if rounding is None and x.__class__ is np.ndarray and fpu.format is dst:
            bits, cfg, src_cfg = x.reshape(-1).view(src.uint), fpu.settings, src_fpu.settings
            if x.size >= _TABLE_MIN and x.dtype.itemsize == 2:
                # A 16-bit source in the device's (deterministic) rounding: the conversion of every
                # input, as a table (see _table).
                return self._tabled("cast", ("convert", src_cfg.tobytes(), cfg.tobytes()), lambda every, out, flags:
                                    K.convert(every, out, flags, src_cfg, cfg), bits, dst, x.shape)
            return self._flat("cast", lambda out, flags: K.convert(bits, out, flags, src_cfg, cfg), x.size, dst,
                              x.shape)
        cfg = fpu.settings_for(dst, None if rounding is None else Rounding.parse(rounding))
        result, shape, scalar = fpu.run("convert", (x,), src=src, dst=dst, cfg=cfg)
        self._record(result.status, "cast", math.prod(shape))
        return finish(result, shape, scalar, False)

    def round_results(self, values, dtypes, flags: int = 0, op: str = "fused",
                      rounding: Rounding | str | None = None) -> list[np.ndarray]:
        """Results an operation computed inside in binary32 or binary64 (``values``, numpy arrays)
        rounded into their ``dtypes`` (float16, bfloat16 or float32) as one device operation, in
        ``rounding`` (default: the device's): each rounding's flags and ``flags`` (the events the
        computation raised inside: an overflow to infinity, a pole, an invalid operation, which
        the rounding of an Inf or NaN cannot see) reach the register once, as the operation ``op``."""
        out, status, elements = [], int(flags), 0
        for v, dtype in zip(values, dtypes, strict=True):
            v = plain(v)
            dst = self._unit(dtype, "a result's dtype")
            cfg = dst.settings if rounding is None else dst.settings_for(dst.format, Rounding.parse(rounding))
            src = self._on(v) if v.dtype != np.float64 else None
            n = v.size
            bits = np.empty(n, dst.format.uint)
            fl = np.empty(n, np.uint8)
            if src is None:  # binary64 values: the unit's cast from binary64
                result, _, _ = dst.run("convert", (np.ascontiguousarray(v).reshape(-1),), src=BINARY64,
                                       dst=dst.format, cfg=cfg)
                bits, s = result.value.view(dst.format.uint), result.status
            elif (table := narrowing32(n, src.format, src.settings, dst.format, cfg)) is not None:
                # long binary32 results into binary16 or bfloat16: read from a table of the
                # conversion's own results, one per class of input
                s = K.lookup(np.ascontiguousarray(v).reshape(-1).view(np.uint32), *table, bits, fl)
            else:
                s = K.convert(np.ascontiguousarray(v).reshape(-1).view(src.uint), bits, fl, src.settings, cfg)
            status |= s
            elements += n
            out.append(bits.view(dst.format.dtype).reshape(v.shape))
        self._record(status, op, elements)
        return out

    def scalar(self, value: float, dtype) -> np.ndarray:
        """A Python number rounded into ``dtype`` (float16, bfloat16 or float32) on the device:
        what ``cast(np.asarray(value, np.float64), dtype)`` returns (a new 0-d array), its flags
        recorded as that cast's on every call. Each value's result and flags are kept per dtype
        (the device's rounding is deterministic), so a program's constants are converted once."""
        value = float(value)
        key = (dtype, value, math.copysign(1.0, value))  # +0 and -0 apart (they compare equal)
        kept = self._scalars.get(key)
        if kept is None:
            fpu, (result, shape, scalar) = self._from_float64(np.asarray(value, np.float64), dtype, None,
                                                              "scalar's dtype")
            kept = finish(result, shape, scalar, False), fpu, result.status
            if value == value:  # not NaN (its payload is not in the key)
                if len(self._scalars) >= _SCALARS_KEPT:
                    self._scalars.clear()
                self._scalars[key] = kept
        else:
            kept[1].raise_status(kept[2])  # the unit's sticky status, as its conversion sets it
        self._record(kept[2], "cast", 1)
        return kept[0].copy()

    def _from_float64(self, x: np.ndarray, dtype, rounding, what: str) -> tuple[Fpu, tuple]:
        """binary64 values rounded into ``dtype`` by its unit, not yet recorded: the unit and its
        ``run`` result (the one path of ``cast`` and ``scalar`` for a program's numbers)."""
        fpu = self._unit(dtype, what)
        cfg = fpu.settings_for(fpu.format, None if rounding is None else Rounding.parse(rounding))
        return fpu, fpu.run("convert", (x,), src=BINARY64, dst=fpu.format, cfg=cfg)

    def _overflow_of(self, dst: Format) -> OverflowMode:
        """The overflow mode of results in ``dst``: the device's (binary32 follows ``saturate_float32``)."""
        return self._fpus.get(dst.dtype, self.fpu).overflow

