"""A device's reductions: sums and means in the accumulation a profile gives, maxima and minima."""

from __future__ import annotations

import math

import numpy as np

from .. import kernels as K
from ..formats import BINARY32, Format
from ..fpu import plain
from ..rounding import OverflowMode, Rounding, config


def _columns(x, axis: int | None, fmt: Format, op: str = "sum") -> tuple[np.ndarray, tuple[int, ...]]:
    """``x`` as bits (n, columns) with the reduced axis first, C-ordered (one compiled kernel
    serves every layout; a copy only where needed), and the shape of the result."""
    x = np.asarray(x)
    if axis is not None:
        valid = f"None or one integer from {-x.ndim} to {x.ndim - 1}" if x.ndim else "None (it has no axes)"
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise TypeError(f"{op}: axis must be None or one integer, got {axis!r}; valid: {valid}")
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"{op}: axis {axis} is out of range for a {x.ndim}-dimensional array; valid: {valid}")
    if axis is None:
        v = x.reshape(-1, 1)
    else:
        v = x if axis in (0, -x.ndim) else x.swapaxes(0, axis) if x.ndim == 2 else np.moveaxis(x, axis, 0)
    rest = v.shape[1:]
    return np.ascontiguousarray(v.reshape(v.shape[0], math.prod(rest))).view(fmt.uint), rest



class _Reductions:
    """Reductions: sums and means in a chosen accumulation, maxima and minima."""

    def sum(self, x, axis: int | None = None, accumulate=None, out_dtype=None) -> np.ndarray:
        """Sum along ``axis`` (all if None) in a fixed pairwise tree (adjacent pairs, then
        pairs of pairs, ...), each addition rounded to ``accumulate`` (default: x's dtype);
        the total is rounded to ``out_dtype`` (default: x's dtype).

        In x's own dtype the additions are the device's, each in its overflow mode (in
        saturation mode a NaN becomes 0 and an Inf MAX at the addition that makes it). An
        ``accumulate`` of another dtype is the reduction unit's own register, IEEE inside as
        :meth:`amax`'s pairs are: each element enters it converted in INF/NaN mode (exactly,
        NaN and Inf included, where the dtype widens), the additions raise IEEE's flags, and
        the overflow mode applies once, to the total rounded into ``out_dtype``. So in
        saturation mode sum([NaN, 1, 2]) is 0 in any order, [Inf, -Inf] gives 0 with INVALID,
        [Inf, Inf] gives MAX with no OVERFLOW (an infinity of infinite operands is no overflow),
        and a binary16 mean of [Inf, Inf] is MAX, as the mean of [Inf] is."""
        return self._reduce(x, axis, accumulate, out_dtype, mean=False)

    def mean(self, x, axis: int | None = None, accumulate=None, out_dtype=None) -> np.ndarray:
        """``sum`` (rounded as the sum is, in ``accumulate``) divided by the count as an exact
        number and rounded once to ``out_dtype``; the mean of nothing is NaN (INVALID)."""
        return self._reduce(x, axis, accumulate, out_dtype, mean=True)

    def amax(self, x, axis: int | None = None) -> np.ndarray:
        """The IEEE 754-2019 maximum along ``axis`` (all if None): NaN if any element is NaN
        (INVALID for a signaling one), +0 above -0; exact, with the overflow mode applied to
        the result once (saturation: NaN -> 0, Inf -> MAX). Empty: ValueError."""
        return self._extremum("amax", "maximum", x, axis)

    def amin(self, x, axis: int | None = None) -> np.ndarray:
        """The IEEE 754-2019 minimum along ``axis``, as :meth:`amax`; -0 below +0."""
        return self._extremum("amin", "minimum", x, axis)

    def _extremum(self, name: str, op: str, x, axis) -> np.ndarray:
        x = plain(x)
        fpu = self._on(x)
        fmt = fpu.format
        v, rest = _columns(x, axis, fmt, name)
        if v.shape[0] == 0:
            raise ValueError(f"{op} reduction of an empty axis has no result (no identity)")
        # Pairs of rows in INF/NaN mode, so that a NaN is not saturated to 0 half-way; the
        # device's mode applies to the result.
        ieee, kernel = self._ieee(fmt), fpu.kernels[op]
        status = 0
        while v.shape[0] > 1:
            half = v.shape[0] // 2
            pair = np.empty((half, v.shape[1]), fmt.uint)
            status |= kernel(v[:half].ravel(), v[half:2 * half].ravel(), pair.reshape(-1),
                             np.empty(pair.size, np.uint8), ieee)
            v = np.concatenate([pair, v[2 * half:]]) if v.shape[0] % 2 else pair
        out = np.empty(v.shape[1], fmt.uint)
        self._record(status | K.convert(v.reshape(-1), out, np.empty(out.size, np.uint8), fpu.settings, fpu.settings),
                     name, out.size)
        result = out.view(fmt.dtype)
        return result[0] if axis is None else result.reshape(rest)

    def _ieee(self, fmt: Format) -> np.ndarray:
        """Kernel settings for ``fmt`` in the device's rounding, INF/NaN mode."""
        fpu = self._fpus[fmt.dtype]
        return config(fmt, fpu.rounding, OverflowMode.INF_NAN, fpu.tininess, fpu.default_nan, False)

    def _reduce(self, x, axis, accumulate, out_dtype, mean: bool) -> np.ndarray:
        x = plain(x)
        src = self._on(x)
        acc = src if accumulate is None else self._unit(accumulate, "accumulate")
        dst = src if out_dtype is None else self._unit(out_dtype, "out_dtype")
        v, rest = _columns(x, axis, src.format, "mean" if mean else "sum")
        out = np.empty(v.shape[1], dst.format.uint)
        inside = acc.settings if acc is src else self._ieee(acc.format)
        # The usual register: IEEE binary32 to nearest even (its tininess and NaN bits read nothing a sum meets).
        rne32 = acc is not src and acc.format is BINARY32 and acc.rounding is Rounding.NEAREST_EVEN
        status = K.tree_sum(v, out, src.settings, inside, dst.settings, mean, rne32)
        self._record(status, "mean" if mean else "sum", out.size)
        total = out.view(dst.format.dtype)
        return total[0] if axis is None else total.reshape(rest)

