"""Exact operation kernels: each returns its result as a binary64 array that is
exact or rounded to odd (see :mod:`sim.rounding`), plus the operation's own
INVALID / DIVBYZERO flags.

The kernels hold for formats of at most 25 significand bits (binary16,
bfloat16): products are then exact in binary64, and a quotient or square root
that is not exact lies so far from every (p+1)-bit number that setting the
last bit of binary64's correctly rounded result gives a valid round-to-odd
value. Sums are exact in binary64 when the format's exponent range is narrow
(binary16) and go through an error-free TwoSum otherwise.
"""

from __future__ import annotations

import numpy as np

from .formats import Format
from .rounding import Flag

_U = np.uint64
_INV = np.uint8(Flag.INVALID)


def is_snan(bits: np.ndarray, fmt: Format) -> np.ndarray:
    """Signaling NaNs: exponent all ones, quiet bit clear, fraction non-zero."""
    mag = bits & fmt.uint.type(fmt.sign_bit - 1)
    return (mag > fmt.inf_bits) & ((mag & fmt.uint.type(fmt.quiet_bit)) == 0)


def _odd(r: np.ndarray, inexact: np.ndarray) -> np.ndarray:
    """Set the last bit of binary64 ``r`` where the true value differs from it."""
    u = r.view(_U)
    return (u | inexact.astype(_U)).view(np.float64)


def _sticky_if_wide(r: np.ndarray, fmt: Format) -> np.ndarray:
    """Round-to-odd for a quotient or root: exact iff it fits ``fmt.precision`` bits."""
    low = _U((1 << (52 - fmt.man_bits)) - 1)
    return _odd(r, (r.view(_U) & low) != 0)


def _two_sum_odd(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x + y rounded to odd at 53 bits, via Knuth's error-free TwoSum."""
    s = x + y
    bb = s - x
    err = (x - (s - bb)) + (y - bb)
    fix = (err != 0) & np.isfinite(err) & ((s.view(_U) & _U(1)) == 0)
    if not fix.any():
        return s
    # Move one binary64 ulp towards the true value: away from zero iff err has s's sign.
    step = np.where(np.signbit(s) == np.signbit(err), 1, -1).astype(np.int64)
    out = s.copy()
    out.view(np.int64)[fix] += step[fix]
    return out


def _zero_sign_downward(r: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """An exact zero sum of opposite-signed operands is -0 when rounding down."""
    z = (r == 0) & (np.signbit(x) != np.signbit(y))
    return np.where(z, -0.0, r) if z.any() else r


def _invalid_where(r: np.ndarray, *inputs: np.ndarray) -> np.ndarray | None:
    """INVALID where the result is NaN though no input is (Inf-Inf, 0*Inf, ...)."""
    nan = np.isnan(r)
    if not nan.any():
        return None
    for v in inputs:
        nan &= ~np.isnan(v)
    return nan * _INV


def add(x: np.ndarray, y: np.ndarray, fmt: Format, downward: bool = False):
    r = x + y if fmt.sum_exact_in_float64 else _two_sum_odd(x, y)
    if downward:
        r = _zero_sign_downward(r, x, y)
    return r, _invalid_where(r, x, y)


def mul(x: np.ndarray, y: np.ndarray, fmt: Format):
    r = x * y
    return r, _invalid_where(r, x, y)


def div(x: np.ndarray, y: np.ndarray, fmt: Format):
    with np.errstate(divide="ignore", invalid="ignore"):
        r = _sticky_if_wide(x / y, fmt)
    flags = _invalid_where(r, x, y)
    dz = (y == 0) & np.isfinite(x) & (x != 0)
    if dz.any():
        flags = (dz * np.uint8(Flag.DIVBYZERO)) | (0 if flags is None else flags)
    return r, flags


def sqrt(x: np.ndarray, fmt: Format):
    with np.errstate(invalid="ignore"):
        r = _sticky_if_wide(np.sqrt(x), fmt)
    return r, _invalid_where(r, x)


def fma(x: np.ndarray, y: np.ndarray, z: np.ndarray, fmt: Format, downward: bool = False):
    p = x * y
    r = _two_sum_odd(p, z)
    if downward:
        r = _zero_sign_downward(r, p, z)
    inv = np.isnan(p) & ~np.isnan(x) & ~np.isnan(y)  # 0 * Inf, whatever z is
    inv |= np.isnan(r) & ~np.isnan(p) & ~np.isnan(z)  # Inf - Inf
    return r, (inv * _INV) if inv.any() else None
