"""Exact operation kernels over binary64 arrays.

Each kernel returns a binary64 result that the rounding routine can turn into
the correctly rounded format value (see :mod:`sim.rounding`): the exact result
when it has at most p+1 significant bits, and otherwise a number strictly
between the same two consecutive (p+1)-bit numbers as the exact result.

For formats of at most 25 significand bits (binary16, bfloat16) that is cheap:
products are exact in binary64; a quotient or square root that is not exact
lies at least 2**-(2p+2) (relative) away from every (p+1)-bit number, far more
than binary64's rounding error of 2**-53, so binary64's own correctly rounded
``/`` and ``sqrt`` qualify as they are. Sums are exact in binary64 when the
format's exponent range is narrow (binary16); otherwise, and for fma, an
error-free TwoSum yields the sum rounded to odd.
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


def add(x: np.ndarray, y: np.ndarray, fmt: Format, downward: bool = False) -> np.ndarray:
    r = x + y if fmt.sum_exact_in_float64 else _two_sum_odd(x, y)
    return _zero_sign_downward(r, x, y) if downward else r


def mul(x: np.ndarray, y: np.ndarray, fmt: Format) -> np.ndarray:
    return x * y


def div(x: np.ndarray, y: np.ndarray, fmt: Format) -> np.ndarray:
    return x / y


def sqrt(x: np.ndarray, fmt: Format) -> np.ndarray:
    return np.sqrt(x)


def fma(x: np.ndarray, y: np.ndarray, z: np.ndarray, fmt: Format, downward: bool = False) -> np.ndarray:
    p = x * y
    r = _two_sum_odd(p, z)
    return _zero_sign_downward(r, p, z) if downward else r


def special_flags(op: str, xs: list[np.ndarray], r: np.ndarray) -> np.ndarray:
    """INVALID and DIVBYZERO of an operation whose result ``r`` is not all finite.

    INVALID: a NaN result from non-NaN operands (Inf-Inf, 0*Inf, 0/0, Inf/Inf,
    sqrt of a negative), and for fma 0*Inf whatever the addend is, as
    SoftFloat does. DIVBYZERO: a finite non-zero over zero.
    """
    quiet_in = np.zeros(r.shape, bool)
    for v in xs:
        quiet_in |= np.isnan(v)
    flags = (np.isnan(r) & ~quiet_in) * _INV
    if op == "fma":
        flags |= (np.isnan(xs[0] * xs[1]) & ~np.isnan(xs[0]) & ~np.isnan(xs[1])) * _INV
    elif op == "div":
        x, y = xs
        flags |= ((y == 0) & np.isfinite(x) & (x != 0)) * np.uint8(Flag.DIVBYZERO)
    return flags
