"""Elementwise functions rounded once to binary32 from their exact value: the same bits on every host.

Each function of :data:`FUNCTIONS` is the exact real function of its operands (their exact
values: binary16, bfloat16, binary32 or binary64) and of its parameters, rounded once to binary32
to nearest even, as a correctly rounded binary32 unit would: ``RN32(f(x))``. That value is a
function of the operands alone, so no host's libm, vector width or tensor length can change it.
It is what the fused kernels of ``sim.torch`` compute inside (then the device rounds it into the
output's format), and what host-independent binary32 references use (:mod:`sim.binary32`).

How: each element is first evaluated in binary64 (the host's libm, or a few binary64 steps) with a
bound on that evaluation's error, derived per function from the libm's error (at most :data:`LIBM`
relative: 16 ulps; glibc, musl, macOS and MSVC document 1 to 4 ulps for these functions) and the
roundings of the steps, scaled by the function's condition where an argument is rounded. Where
every value within the bound rounds to the same binary32 number, that is the result. Elsewhere (an
element within the bound of a binary32 rounding boundary, about one in 2**20 at random) the exact
value is computed again at 80 to 1280 bits with mpmath (a dependency of torch, so present wherever
``sim.torch`` runs; exp, log, exp2, log2 and log10, which the built-in workloads use without
torch, fall back to Python's ``decimal`` without it), or exactly with fractions for the rational
functions (``addcmul``, ``addcdiv``, ``lerp``). An exact value that is itself a rounding boundary
is found exactly (a rational function's) or, for a transcendental function at a point other than
those handled exactly (exp(0) = 1, log2 of a power of two...), taken to be one only past 1280
bits.

Flags: per element, the events the float-status register records: INVALID (a NaN from non-NaN
operands: log(-1), asin(2), inf * 0; or a signaling NaN operand), DIVBYZERO (an exact infinite
result from finite operands, a pole: log(0), atanh(1), erfinv(1), x / 0) and OVERFLOW (a finite
exact value beyond binary32's range). INEXACT and UNDERFLOW are not reported.

Zeros and infinities follow torch's CPU formulas where they define the sign or the value (elu of
±0 is scale times it, whatever alpha, as torch gives on every dtype and CPU capability; gelu and silu of
-inf are NaN, as torch's x * cdf(x) gives), so that a device route agrees with torch wherever
torch's answer is exact.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from . import kernels as K
from .formats import BINARY32
from .rounding import config

__all__ = ["Function", "FUNCTIONS", "evaluate", "exact_value", "signaling", "LIBM"]

#: The bound assumed on one binary64 libm call's relative error (16 ulps).
LIBM = 2.0**-48
_U = 2.0**-53  # binary64's unit roundoff
_BIG = 1.5 * 2.0**1023  # beyond every binary32 value: rounds to an overflow
_SQRT_PI_2 = math.sqrt(math.pi) / 2
_TWO_SQRT_PI = 2 / math.sqrt(math.pi)
_SQRT1_2 = math.sqrt(0.5)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_K0 = math.sqrt(2 / math.pi)  # the tanh approximation of GELU: sqrt(2/pi) (x + 0.044715 x**3)
_K1 = 0.044715
_POW10 = np.array([10.0**k for k in range(23)])  # exact in binary64
_INVALID, _DIVBYZERO, _OVERFLOW = K.INVALID, K.DIVBYZERO, K.OVERFLOW
_HARD = K.HARD

inline = K.inline
jit = K.jit

# -- the functions' codes ----------------------------------------------------------------------
(EXP, LOG, EXPM1, LOG1P, EXP2, LOG2, LOG10, TANH, SIGMOID, ERF, ERFC, ERFINV, RSQRT,
 SIN, COS, TAN, ASIN, ACOS, ATAN, SINH, COSH, ASINH, ACOSH, ATANH, LGAMMA, I0,
 GELU, GELU_TANH, SILU, MISH, SOFTPLUS, LOGSIGMOID, ELU) = range(33)
(ATAN2, POW, HYPOT, GLU, GELU_BW, GELU_TANH_BW, SILU_BW, MISH_BW, SOFTPLUS_BW, LOGSIGMOID_BW,
 ELU_BW, SIGMOID_BW, TANH_BW, LOGADDEXP) = range(100, 114)
ADDCMUL, ADDCDIV, LERP = range(200, 203)


# -- binary64 evaluation with an error bound --------------------------------------------------
# Each returns (r, err, flags): the exact value lies within [r - err, r + err] (err 0: r is the
# exact value, or stands for it in every rounding as sim.kernels' contract says), and the
# function's own INVALID and DIVBYZERO.

@inline
def _approx(r):
    """A libm result: r, and LIBM of it."""
    return r, LIBM * abs(r), 0


@inline
def _big(r):
    """r where binary64 overflowed (or did not) but the exact value is finite: beyond binary32."""
    return (math.copysign(_BIG, r), 0.0, 0) if math.isinf(r) else _approx(r)


@inline
def _beside(b, toward):
    """The exact value just beside b, towards ``toward``, by less than 2**-26 of b: b's binary64
    neighbour on that side stands for it (no 25-bit number lies between them)."""
    return np.nextafter(b, toward), 0.0, 0


_TINY = 2.0**-28  # below it x**2 < 2**-56: the functions near x (or x/2, 1/2) are beside them


@inline
def _sigmoid(x):
    """sigmoid(x) in binary64 without cancellation: 1 / (1 + e**-x), or e**x / (1 + e**x)."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@inline
def _softplus(z):
    """log(1 + e**z) without overflow or cancellation."""
    return math.log1p(math.exp(z)) if z <= 0 else z + math.log1p(math.exp(-z))


@inline
def _erfinv(x):
    """erfinv(x) for 0 < |x| < 1 by Newton's method, monotone from a start on the safe side:
    on erf(y) = |x| below 1/2 (erf is concave: from below), on log erfc(y) = log(1 - |x|) above
    (1 - |x| is exact there; log erfc is concave and decreasing: from above). Returns (y, err)."""
    a = abs(x)
    if a < 1e-150:
        return math.copysign(a * _SQRT_PI_2, x), 4 * _U * a
    y = 0.0
    step = 1.0
    small = 0  # steps in a row below 1e-14 y: two more after the first, for the last bits
    if a < 0.5:
        y = a * _SQRT_PI_2 * (1.0 + a * a * (math.pi / 12))  # the series, truncated: below the root
        for _ in range(60):
            step = (math.erf(y) - a) / (_TWO_SQRT_PI * math.exp(-y * y))
            y -= step
            small = small + 1 if abs(step) <= 1e-14 * y else 0
            if small == 3:
                break
    else:
        q = 1.0 - a
        lq = math.log(q)
        y = math.sqrt(-lq)  # erfc(y) <= e**-y**2 = q: at or above the root
        for _ in range(200):
            c = math.erfc(y)
            step = (math.log(c) - lq) * c / (-_TWO_SQRT_PI * math.exp(-y * y))
            y -= step
            small = small + 1 if abs(step) <= 1e-14 * y else 0
            if small == 3:
                break
    err = 4 * LIBM * y + 4 * abs(step) if small == 3 else 1e-6 * y
    return math.copysign(y, x), err


@inline
def _unary(code, x, p0, p1, p2):
    """(r, err, flags) of the one-operand functions."""
    if math.isnan(x):
        return x, 0.0, 0
    inf = math.isinf(x)
    if code == EXP:
        if x == 0:
            return 1.0, 0.0, 0
        if inf:
            return (x if x > 0 else 0.0), 0.0, 0
        return _big(math.exp(x))
    if code == EXPM1:
        if x == 0 or (inf and x > 0):
            return x, 0.0, 0
        if inf:
            return -1.0, 0.0, 0
        return _big(math.expm1(x))
    if code == EXP2:
        if inf:
            return (x if x > 0 else 0.0), 0.0, 0
        if x == math.floor(x):  # an integer: a power of two, exactly
            if x >= 1024:  # beyond binary64 too (ldexp would give an infinity, taken as exact)
                return _BIG, 0.0, 0
            return (math.ldexp(1.0, int(x)) if x > -1100 else 5e-324), 0.0, 0
        return _big(2.0**x)
    if code == LOG or code == LOG2 or code == LOG10 or code == LOG1P:
        one = -1.0 if code == LOG1P else 0.0
        if x < one:
            return np.nan, 0.0, _INVALID
        if x == one:
            return -np.inf, 0.0, _DIVBYZERO
        if inf:
            return x, 0.0, 0
        if code == LOG1P:
            return (x, 0.0, 0) if x == 0 else _approx(math.log1p(x))
        if code == LOG:
            return (0.0, 0.0, 0) if x == 1 else _approx(math.log(x))
        if code == LOG2:
            m, e = math.frexp(x)
            return (float(e - 1), 0.0, 0) if m == 0.5 else _approx(math.log2(x))
        k = int(round(math.log10(x)))  # LOG10: an exact power of ten is exact
        if 0 <= k <= 22 and _POW10[k] == x:
            return float(k), 0.0, 0
        return _approx(math.log10(x))
    if code == TANH:
        if x == 0:
            return x, 0.0, 0
        return (math.copysign(1.0, x), 0.0, 0) if inf else _approx(math.tanh(x))
    if code == SIGMOID:
        if x == 0:
            return 0.5, 0.0, 0
        if inf:
            return (1.0 if x > 0 else 0.0), 0.0, 0
        if abs(x) < 2.0**-20:  # 1/2 + x/4 - x**3/48: beside 1/2 + x/4 (exact from 2**-28 up), or 1/2
            if abs(x) < _TINY:
                return _beside(0.5, math.copysign(np.inf, x))
            return _beside(0.5 + 0.25 * x, math.copysign(np.inf, -x))
        r = _sigmoid(x)
        return r, (LIBM + 3 * _U) * r, 0
    if code == ERF:
        if x == 0:
            return x, 0.0, 0
        return (math.copysign(1.0, x), 0.0, 0) if inf else _approx(math.erf(x))
    if code == ERFC:
        if x == 0:
            return 1.0, 0.0, 0
        if inf:
            return (0.0 if x > 0 else 2.0), 0.0, 0
        return _approx(math.erfc(x))
    if code == ERFINV:
        if x == 0:
            return x, 0.0, 0
        a = abs(x)
        if a > 1:
            return np.nan, 0.0, _INVALID
        if a == 1:
            return math.copysign(np.inf, x), 0.0, _DIVBYZERO
        y, err = _erfinv(x)
        return y, err, 0
    if code == RSQRT:
        if x == 0:
            return math.copysign(np.inf, x), 0.0, _DIVBYZERO
        if x < 0:
            return np.nan, 0.0, _INVALID
        if inf:
            return 0.0, 0.0, 0
        return K.rsqrt_value(x, 23), 0.0, 0  # meets the contract for binary32 exactly
    if code == SIN or code == TAN or code == ASIN or code == ATAN or code == SINH or code == ASINH \
            or code == ATANH or code == TANH or code == EXPM1 or code == LOG1P:
        if x == 0:
            return x, 0.0, 0
        if abs(x) < _TINY:  # x + c x**2 or x + c x**3: beside x, on the side of the correction's sign
            away = code == TAN or code == ASIN or code == SINH or code == ATANH
            if code == EXPM1 or code == LOG1P:
                return _beside(x, np.inf if code == EXPM1 else -np.inf)
            return _beside(x, math.copysign(np.inf, x) if away else 0.0)
    if code == SIN or code == COS or code == TAN:
        if inf:
            return np.nan, 0.0, _INVALID
        if code == COS:
            return (1.0, 0.0, 0) if x == 0 else _approx(math.cos(x))
        return _approx(math.sin(x) if code == SIN else math.tan(x))
    if code == ASIN or code == ACOS:
        if abs(x) > 1:
            return np.nan, 0.0, _INVALID
        if code == ACOS:
            return (0.0, 0.0, 0) if x == 1 else _approx(math.acos(x))
        return _approx(math.asin(x))
    if code == ATAN:
        return _approx(math.atan(x))
    if code == SINH or code == COSH:
        if inf:
            return (x if code == SINH else np.inf), 0.0, 0
        if code == COSH and x == 0:
            return 1.0, 0.0, 0
        return _big(math.sinh(x) if code == SINH else math.cosh(x))
    if code == ASINH:
        return (x, 0.0, 0) if inf else _approx(math.asinh(x))
    if code == ACOSH:
        if x < 1:
            return np.nan, 0.0, _INVALID
        if x == 1:
            return 0.0, 0.0, 0
        return (x, 0.0, 0) if inf else _approx(math.acosh(x))
    if code == ATANH:
        if abs(x) > 1:
            return np.nan, 0.0, _INVALID
        if abs(x) == 1:
            return math.copysign(np.inf, x), 0.0, _DIVBYZERO
        return _approx(math.atanh(x))
    if code == LGAMMA:
        if inf:
            return np.inf, 0.0, 0
        if x <= 0 and x == math.floor(x):
            return np.inf, 0.0, _DIVBYZERO  # a pole of Gamma
        if x == 1 or x == 2:
            return 0.0, 0.0, 0
        r = math.lgamma(x)
        if math.isinf(r):
            return _BIG, 0.0, 0
        return r, 16 * LIBM * abs(r), 0
    if code == I0:
        a = abs(x)
        if inf or a > 100:  # I0(100) > 1e42: beyond binary32
            return (np.inf, 0.0, 0) if inf else (_BIG, 0.0, 0)
        q = a * a * 0.25  # exact
        term, total, k = 1.0, 1.0, 1.0
        while term > total * 1e-18:  # positive terms, no cancellation
            term *= q / (k * k)
            total += term
            k += 1.0
        return total, (a + 16) * 4 * _U * total, 0
    # The activations: parameters p0, p1, p2 as their functions say (binary32 values).
    if code == GELU:  # x * Phi(x)
        if x == 0:
            return x, 0.0, 0
        if inf:
            return (x, 0.0, 0) if x > 0 else (np.nan, 0.0, _INVALID)  # torch: -inf * 0
        if abs(x) < _TINY:  # x/2 + x**2 / sqrt(2 pi): above x/2
            return _beside(0.5 * x, np.inf)
        if x > 0:
            r = 0.5 * x * (1.0 + math.erf(x * _SQRT1_2))
            return r, (LIBM + 6 * _U) * r, 0
        t = -x * _SQRT1_2  # rounded: erfc's condition 2t**2 + 1 amplifies it
        r = 0.5 * x * math.erfc(t)
        return r, (LIBM + (2 * t * t + 4) * 2 * _U) * abs(r), 0
    if code == GELU_TANH:  # 0.5 x (1 + tanh(k0 (x + k1 x**3))) = x * sigmoid(2 z)
        if x == 0:
            return x, 0.0, 0
        if inf:
            return (x, 0.0, 0) if x > 0 else (np.nan, 0.0, _INVALID)
        if abs(x) < _TINY:  # x/2 + k0 x**2 / 2: above x/2
            return _beside(0.5 * x, np.inf)
        z2 = 2.0 * _K0 * (x + _K1 * (x * x * x))
        r = x * _sigmoid(z2)  # sigmoid's condition at u: u sigmoid(-u)
        return r, (2 * LIBM + (abs(z2) * _sigmoid(-z2) + 2) * 8 * _U) * abs(r), 0
    if code == SILU:  # x * sigmoid(x)
        if x == 0:
            return x, 0.0, 0
        if inf:
            return (x, 0.0, 0) if x > 0 else (np.nan, 0.0, _INVALID)
        if abs(x) < _TINY:  # x/2 + x**2/4: above x/2
            return _beside(0.5 * x, np.inf)
        r = x * _sigmoid(x)
        return r, (LIBM + 4 * _U) * abs(r), 0
    if code == MISH:  # x tanh(softplus x) = x n / (n + 2), n = w (w + 2), w = e**x
        if x == 0:
            return x, 0.0, 0
        if inf:
            return (x, 0.0, 0) if x > 0 else (np.nan, 0.0, _INVALID)
        if x > 30:
            return x, 4 * _U * x, 0  # short of x by about 2x e**-2x
        w = math.exp(x)
        n = w * (w + 2.0)
        r = x * n / (n + 2.0)
        return r, (2 * LIBM + 8 * _U) * abs(r), 0
    if code == SOFTPLUS:  # beta p0, threshold p1: x where beta x > threshold
        z = p0 * x  # exact (binary32 times a binary32-or-narrower value)
        if z > p1:
            return x, 0.0, 0
        if inf:
            return 0.0, 0.0, 0  # x = -inf (beta > 0)
        r = _softplus(z) / p0
        return r, (2 * LIBM + 4 * _U) * abs(r), 0
    if code == LOGSIGMOID:  # -softplus(-x)
        if inf:
            return (x, 0.0, 0) if x < 0 else (-0.0, 0.0, 0)
        r = -_softplus(-x)
        return r, (2 * LIBM + 4 * _U) * abs(r), 0
    if code == ELU:  # alpha p0, scale p1, input_scale p2: scale x above 0, else alpha scale (e**(is x) - 1)
        if x > 0:
            return p1 * x, 0.0, 0  # exact
        if x == 0:  # torch gives scale x for either zero, whatever alpha (measured: every dtype, both ISAs)
            return x * p1, 0.0, 0
        if inf:
            return -(p0 * p1), 0.0, 0
        a, z = p0 * p1, p2 * x  # exact
        if abs(z) < _TINY:  # a (z + z**2/2): beside a z where that product is exact (a boundary, maybe)
            hi = a * z
            if K.fma64(a, z, -hi) == 0:
                return _beside(hi, np.inf if a > 0 else -np.inf)
        r = a * math.expm1(z)
        return r, (LIBM + 3 * _U) * abs(r), 0
    return np.nan, 0.0, _INVALID


@inline
def _binary(code, x, y, p0, p1, p2, p3):
    """(r, err, flags) of the two-operand functions (y: the second operand; for the backward
    functions x is the gradient and y the forward's input)."""
    if code == ATAN2:  # atan2(x, y), IEEE's special cases
        if math.isnan(x) or math.isnan(y):
            return np.nan, 0.0, 0
        if x == 0 and (y > 0 or (y == 0 and math.copysign(1.0, y) > 0)):
            return x, 0.0, 0
        return _approx(math.atan2(x, y))
    if code == HYPOT:
        if math.isinf(x) or math.isinf(y):
            return np.inf, 0.0, 0
        if math.isnan(x) or math.isnan(y):
            return np.nan, 0.0, 0
        r = math.sqrt(x * x + y * y)  # the squares are exact
        return r, 3 * _U * r, 0
    if code == LOGADDEXP:  # log(e**x + e**y)
        if math.isnan(x) or math.isnan(y):
            return np.nan, 0.0, 0
        hi, lo = max(x, y), min(x, y)
        if math.isinf(hi):
            return (hi, 0.0, 0) if hi > 0 or lo == hi else (lo, 0.0, 0)
        d = lo - hi  # rounded: softplus's slope is below 1
        r = hi + math.log1p(math.exp(d))
        return r, (abs(hi) + 1) * (2 * LIBM + 6 * _U), 0
    if code == POW:
        return _pow(x, y)
    if code == GLU:  # x * sigmoid(y)
        if math.isnan(x) or math.isnan(y):
            return np.nan, 0.0, 0
        s = 1.0 if y == np.inf else 0.0 if y == -np.inf else _sigmoid(y)
        r = x * s
        if math.isnan(r):
            return r, 0.0, _INVALID
        return r, (0.0 if math.isinf(y) else (LIBM + 4 * _U)) * abs(r), 0
    # The backward functions: grad x, input (or result) y.
    if math.isnan(x) or math.isnan(y):
        return np.nan, 0.0, 0
    if code == SIGMOID_BW:  # grad * s (1 - s), y the result s
        d = y * (1.0 - y)
        r = x * d
        return r, 4 * _U * (abs(x) * (abs(y) + y * y) + abs(r)), 0
    if code == TANH_BW:  # grad * (1 - t**2), y the result t
        d = (1.0 - y) * (1.0 + y)
        r = x * d
        return r, 4 * _U * (abs(x) * (1 + y * y) + abs(r)), 0
    if code == ELU_BW:  # alpha p0, scale p1, input_scale p2, is_result p3
        return _elu_backward(x, y, p0, p1, p2, p3)
    if code == SOFTPLUS_BW:  # beta p0, threshold p1
        z = p0 * y
        if z > p1:
            return x, 0.0, 0
        s = _sigmoid(z) if not math.isinf(z) else (1.0 if z > 0 else 0.0)
        r = x * s
        if math.isnan(r):
            return r, 0.0, _INVALID
        return r, (LIBM + 4 * _U) * abs(r), 0
    if code == LOGSIGMOID_BW:  # grad * sigmoid(-y)
        s = 1.0 if y == -np.inf else 0.0 if y == np.inf else _sigmoid(-y)
        r = x * s
        if math.isnan(r):
            return r, 0.0, _INVALID
        return r, (LIBM + 4 * _U) * abs(r), 0
    if math.isinf(y):  # gelu', silu', mish' at +-inf: inf * 0 in torch's formulas
        return np.nan, 0.0, _INVALID
    if code == GELU_BW:  # grad * (Phi(y) + y phi(y))
        t = -y * _SQRT1_2
        cdf = 0.5 * math.erfc(t)
        pdf = _INV_SQRT_2PI * math.exp(-0.5 * (y * y))  # the argument is exact
        b = y * pdf
        d = cdf + b
        err_d = abs(cdf) * (LIBM + (2 * t * t + 4) * 2 * _U) + abs(b) * (LIBM + 4 * _U) + abs(d) * _U
        r = x * d
        return r, abs(x) * err_d + abs(r) * _U, 0
    if code == GELU_TANH_BW:  # d/dy [y sigmoid(2 z)], z = k0 (y + k1 y**3)
        y2 = y * y
        z2 = 2.0 * _K0 * (y + _K1 * (y2 * y))
        s = _sigmoid(z2)
        dz2 = 2.0 * _K0 * (1.0 + 3.0 * _K1 * y2)
        b = y * dz2 * s * (1.0 - s) if z2 <= 0 else y * dz2 * s * _sigmoid(-z2)
        d = s + b
        e = 2 * LIBM + (abs(z2) * _sigmoid(-z2) + 2) * 8 * _U
        err_d = (abs(s) + abs(b)) * e + abs(d) * _U
        r = x * d
        return r, abs(x) * err_d + abs(r) * _U, 0
    if code == SILU_BW:  # grad * (s + y s (1 - s)), s = sigmoid(y)
        s = _sigmoid(y)
        b = y * s * _sigmoid(-y)
        d = s + b
        err_d = (abs(s) + abs(b)) * (LIBM + 6 * _U) + abs(d) * _U
        r = x * d
        return r, abs(x) * err_d + abs(r) * _U, 0
    if code == MISH_BW:  # grad * (n / D + 4 y w (1 + w) / D**2), n = w (w + 2), D = n + 2, w = e**y
        if y > 30:
            return x, 4 * _U * abs(x), 0
        w = math.exp(y)
        n = w * (w + 2.0)
        big = n + 2.0
        a = n / big
        b = 4.0 * y * w * (1.0 + w) / (big * big)
        d = a + b
        err_d = (abs(a) + abs(b)) * (3 * LIBM + 12 * _U) + abs(d) * _U
        r = x * d
        return r, abs(x) * err_d + abs(r) * _U, 0
    return np.nan, 0.0, _INVALID


@inline
def _elu_backward(g, y, alpha, scale, s, from_result):
    """elu's backward from the input y, or (``from_result`` non-zero) from the forward's result
    y: grad * scale above 0; else grad * input_scale * alpha * scale * e**(input_scale * y), or
    grad * input_scale * (y + alpha * scale) from the result."""
    if y > 0:
        return g * scale, 0.0, 0  # exact
    gi = g * s  # exact
    if from_result != 0:
        d = y + alpha * scale  # one rounding of the exact sum
        r = gi * d
        return r, 3 * _U * abs(r), 0
    r = gi * (alpha * scale) * math.exp(s * y)
    if math.isnan(r):
        return r, 0.0, _INVALID
    return r, (LIBM + 4 * _U) * abs(r), 0


@inline
def _pow(x, y):
    """x ** y with IEEE 754's pow special cases."""
    if y == 0 or x == 1:
        return 1.0, 0.0, 0
    if math.isnan(x) or math.isnan(y):
        return np.nan, 0.0, 0
    integer = y == math.floor(y) and not math.isinf(y)
    odd = integer and abs(y) < 2.0**53 and 0.5 * y != math.floor(0.5 * y)
    if x == 0:
        if y < 0:
            return (math.copysign(np.inf, x) if odd else np.inf), 0.0, _DIVBYZERO
        return (x if odd else 0.0), 0.0, 0
    if math.isinf(x) or math.isinf(y):
        r = x**y  # exact: 0, 1 or inf (binary64's pow follows IEEE here)
        return r, 0.0, 0
    if x < 0 and not integer:
        return np.nan, 0.0, _INVALID
    r = abs(x) ** y
    sign = -1.0 if (x < 0 and odd) else 1.0
    if math.isinf(r) or r == 0:  # beyond binary64, the exact value finite and non-zero
        return sign * (_BIG if r != 0 else 5e-324), 0.0, 0
    return sign * r, LIBM * r, 0


@inline
def _ternary(code, x, a, b, p0):
    """(r, err, flags) of addcmul (x + v a b), addcdiv (x + v a / b), lerp (x + w (a - x), w = b)
    with p0 the scalar value v."""
    if math.isnan(x) or math.isnan(a) or math.isnan(b):
        return np.nan, 0.0, 0
    if code == ADDCMUL:
        p = p0 * a  # exact
        r = K.fma64(p, b, x)  # the exact x + p b, rounded once
        if math.isnan(r):
            return r, 0.0, _INVALID
        if math.isinf(r) and math.isfinite(x) and math.isfinite(p) and math.isfinite(b):
            return _BIG if r > 0 else -_BIG, 0.0, 0
        return r, 2 * _U * abs(r), 0
    if code == ADDCDIV:
        p = p0 * a
        if b == 0 and p != 0 and math.isfinite(p) and math.isfinite(x):
            return math.copysign(np.inf, p) * math.copysign(1.0, b), 0.0, _DIVBYZERO
        q = p / b
        r = x + q
        if math.isnan(r):
            return r, 0.0, _INVALID
        if math.isinf(r):
            return r, 0.0, 0
        return r, 2 * _U * (abs(q) + abs(r)), 0
    # LERP: start x, end a, weight b
    d = a - x
    r = x + b * d
    if math.isnan(r):
        return r, 0.0, _INVALID
    if math.isinf(r):
        return r, 0.0, 0
    return r, 3 * _U * (abs(b) * (abs(a) + abs(x)) + abs(r)), 0


# -- the loops -----------------------------------------------------------------------------------
@inline
def _round32(r):
    """r rounded to binary32 to nearest even (the IEEE conversion of every CPU): its bits, and
    OVERFLOW where a finite r rounds to an infinity; a NaN as the canonical quiet NaN."""
    if r != r:
        return np.uint32(0x7FC00000), 0
    f = np.float32(r)
    return K.f32_bits(f), _OVERFLOW if math.isinf(f) and not math.isinf(r) else 0


@inline
def _accept(r, err, fl):
    """round(r) into binary32 where every value within err of r rounds alike: (bits, flags);
    flags HARD where they do not."""
    if err == 0:
        bits, f = _round32(r)
        return bits, f | fl
    err = err * 1.001 + abs(r) * 2.3e-16  # the bound's own roundings
    lo, f = _round32(r - err)
    hi, _ = _round32(r + err)
    return lo, (f | fl) if lo == hi else _HARD


@jit
def unary(code, x, out, flags, params):
    """out = RN32(f(x)) for the one-operand functions (x: binary64 values), each element's flags
    (HARD: not decided; the caller finds its exact value). Returns how many are HARD."""
    p0, p1, p2 = params[0], params[1], params[2]
    hard = 0
    for i in range(x.size):
        r, err, fl = _unary(code, x[i], p0, p1, p2)
        out[i], flags[i] = _accept(r, err, fl)
        hard += flags[i] == _HARD
    return hard


@jit
def binary(code, x, y, out, flags, params):
    """:func:`unary` for the two-operand functions."""
    p0, p1, p2, p3 = params[0], params[1], params[2], params[3]
    hard = 0
    for i in range(x.size):
        r, err, fl = _binary(code, x[i], y[i], p0, p1, p2, p3)
        out[i], flags[i] = _accept(r, err, fl)
        hard += flags[i] == _HARD
    return hard


@jit
def ternary(code, x, a, b, out, flags, params):
    """:func:`unary` for addcmul, addcdiv and lerp."""
    p0 = params[0]
    hard = 0
    for i in range(x.size):
        r, err, fl = _ternary(code, x[i], a[i], b[i], p0)
        out[i], flags[i] = _accept(r, err, fl)
        hard += flags[i] == _HARD
    return hard


# -- the table -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Function:
    """One function: its code in the kernels, its operands and parameters, and its exact value."""

    name: str
    code: int
    arity: int
    params: tuple[str, ...]  #: the parameters' names, in order (each a binary32 value)
    doc: str


def _f(name, code, arity, doc, params=()):
    return Function(name, code, arity, tuple(params), doc)


FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    _f("exp", EXP, 1, "e**x"), _f("log", LOG, 1, "ln x"), _f("expm1", EXPM1, 1, "e**x - 1"),
    _f("log1p", LOG1P, 1, "ln(1 + x)"), _f("exp2", EXP2, 1, "2**x"), _f("log2", LOG2, 1, "log2 x"),
    _f("log10", LOG10, 1, "log10 x"), _f("tanh", TANH, 1, "tanh x"), _f("sigmoid", SIGMOID, 1, "1 / (1 + e**-x)"),
    _f("erf", ERF, 1, "erf x"), _f("erfc", ERFC, 1, "1 - erf x"), _f("erfinv", ERFINV, 1, "erf**-1 x"),
    _f("rsqrt", RSQRT, 1, "1 / sqrt x"), _f("sin", SIN, 1, "sin x"), _f("cos", COS, 1, "cos x"),
    _f("tan", TAN, 1, "tan x"), _f("asin", ASIN, 1, "asin x"), _f("acos", ACOS, 1, "acos x"),
    _f("atan", ATAN, 1, "atan x"), _f("sinh", SINH, 1, "sinh x"), _f("cosh", COSH, 1, "cosh x"),
    _f("asinh", ASINH, 1, "asinh x"), _f("acosh", ACOSH, 1, "acosh x"), _f("atanh", ATANH, 1, "atanh x"),
    _f("lgamma", LGAMMA, 1, "ln |Gamma(x)|"), _f("i0", I0, 1, "the modified Bessel function I0"),
    _f("gelu", GELU, 1, "x Phi(x) (Phi: the standard normal CDF)"),
    _f("gelu_tanh", GELU_TANH, 1, "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))"),
    _f("silu", SILU, 1, "x sigmoid(x)"), _f("mish", MISH, 1, "x tanh(ln(1 + e**x))"),
    _f("softplus", SOFTPLUS, 1, "ln(1 + e**(beta x)) / beta; x where beta x > threshold",
       ("beta", "threshold")),
    _f("logsigmoid", LOGSIGMOID, 1, "-ln(1 + e**-x)"),
    _f("elu", ELU, 1, "scale x above 0, else alpha scale (e**(input_scale x) - 1)",
       ("alpha", "scale", "input_scale")),
    _f("atan2", ATAN2, 2, "atan2(x, y)"), _f("pow", POW, 2, "x ** y (IEEE pow's special cases)"),
    _f("hypot", HYPOT, 2, "sqrt(x**2 + y**2)"), _f("logaddexp", LOGADDEXP, 2, "ln(e**x + e**y)"),
    _f("glu", GLU, 2, "x sigmoid(y)"),
    _f("sigmoid_backward", SIGMOID_BW, 2, "grad s (1 - s) from the result s"),
    _f("tanh_backward", TANH_BW, 2, "grad (1 - t**2) from the result t"),
    _f("gelu_backward", GELU_BW, 2, "grad (Phi(x) + x phi(x))"),
    _f("gelu_tanh_backward", GELU_TANH_BW, 2, "grad times gelu_tanh'(x)"),
    _f("silu_backward", SILU_BW, 2, "grad (s + x s (1 - s)), s = sigmoid(x)"),
    _f("mish_backward", MISH_BW, 2, "grad times mish'(x)"),
    _f("softplus_backward", SOFTPLUS_BW, 2, "grad sigmoid(beta x); grad where beta x > threshold",
       ("beta", "threshold")),
    _f("logsigmoid_backward", LOGSIGMOID_BW, 2, "grad sigmoid(-x)"),
    _f("elu_backward", ELU_BW, 2, "grad scale above 0, else grad input_scale alpha scale e**(input_scale x); "
       "from the result y (is_result 1): grad input_scale (y + alpha scale)",
       ("alpha", "scale", "input_scale", "is_result")),
    _f("addcmul", ADDCMUL, 3, "x + value a b", ("value",)),
    _f("addcdiv", ADDCDIV, 3, "x + value a / b", ("value",)),
    _f("lerp", LERP, 3, "x + w (end - x): operands start, end, weight"),
)}


# -- the exact values --------------------------------------------------------------------------------
def _mp():
    try:
        import mpmath
    except ImportError:
        return None
    return mpmath


def _exact_mp(mp, fn: Function, xs: tuple[float, ...], ps: tuple[float, ...]):
    """The exact function of exact binary64 values, in mpmath at the current precision."""
    x = [mp.mpf(v) for v in xs]
    p = [mp.mpf(v) for v in ps]
    c = fn.code
    one = {EXP: mp.exp, LOG: mp.log, EXPM1: mp.expm1, LOG1P: mp.log1p, TANH: mp.tanh, ERF: mp.erf, ERFC: mp.erfc,
           ERFINV: mp.erfinv, SIN: mp.sin, COS: mp.cos, TAN: mp.tan, ASIN: mp.asin, ACOS: mp.acos, ATAN: mp.atan,
           SINH: mp.sinh, COSH: mp.cosh, ASINH: mp.asinh, ACOSH: mp.acosh, ATANH: mp.atanh}
    if c in one:
        return one[c](x[0])
    if c == EXP2:
        return mp.power(2, x[0])
    if c == LOG2:
        return mp.log(x[0], 2)
    if c == LOG10:
        return mp.log10(x[0])
    if c == SIGMOID:
        return 1 / (1 + mp.exp(-x[0]))
    if c == RSQRT:
        return 1 / mp.sqrt(x[0])
    if c == LGAMMA:
        return mp.log(abs(mp.gamma(x[0])))
    if c == I0:
        return mp.besseli(0, x[0])
    phi = lambda t: mp.erfc(-t / mp.sqrt(2)) / 2  # noqa: E731
    sig = lambda t: 1 / (1 + mp.exp(-t))  # noqa: E731
    k1 = mp.mpf(44715) / 10**6
    if c == GELU:
        return x[0] * phi(x[0])
    if c == GELU_TANH:
        return x[0] * sig(2 * mp.sqrt(2 / mp.pi) * (x[0] + k1 * x[0] ** 3))
    if c == SILU:
        return x[0] * sig(x[0])
    if c == MISH:
        return x[0] * mp.tanh(mp.log1p(mp.exp(x[0])))
    if c == SOFTPLUS:
        return mp.log1p(mp.exp(p[0] * x[0])) / p[0]
    if c == LOGSIGMOID:
        return -mp.log1p(mp.exp(-x[0]))
    if c == ELU:
        return p[0] * p[1] * mp.expm1(p[2] * x[0])
    if c == ATAN2:
        return mp.atan2(x[0], x[1])
    if c == POW:
        return mp.power(abs(x[0]), x[1]) * (-1 if x[0] < 0 and int(x[1]) % 2 else 1)
    if c == HYPOT:
        return mp.sqrt(x[0] ** 2 + x[1] ** 2)
    if c == LOGADDEXP:
        return mp.log(mp.exp(x[0]) + mp.exp(x[1]))
    if c == GLU:
        return x[0] * sig(x[1])
    g, y = x[0], x[1] if len(x) > 1 else None
    if c == GELU_BW:
        return g * (phi(y) + y * mp.exp(-y * y / 2) / mp.sqrt(2 * mp.pi))
    if c == GELU_TANH_BW:
        z2 = 2 * mp.sqrt(2 / mp.pi) * (y + k1 * y**3)
        s = sig(z2)
        return g * (s + y * 2 * mp.sqrt(2 / mp.pi) * (1 + 3 * k1 * y * y) * s * (1 - s))
    if c == SILU_BW:
        s = sig(y)
        return g * (s + y * s * (1 - s))
    if c == MISH_BW:
        sp = mp.log1p(mp.exp(y))
        t = mp.tanh(sp)
        return g * (t + y * sig(y) * (1 - t * t))
    if c == SOFTPLUS_BW:
        return g * sig(p[0] * y)
    if c == LOGSIGMOID_BW:
        return g * sig(-y)
    if c == SIGMOID_BW:
        return g * y * (1 - y)
    if c == TANH_BW:
        return g * (1 - y * y)
    if c == ELU_BW:
        if p[3]:
            return g * p[2] * (y + p[0] * p[1])
        return g * p[2] * p[0] * p[1] * mp.exp(p[2] * y)
    raise ValueError(f"{fn.name}: no exact evaluation")


def _exact_rational(fn: Function, xs, ps) -> Fraction:
    x, a, b = (Fraction(v) for v in xs)
    v = Fraction(ps[0]) if ps else None
    if fn.code == ADDCMUL:
        return x + v * a * b
    if fn.code == ADDCDIV:
        return x + v * a / b
    return x + b * (a - x)  # LERP


_DECIMAL = (EXP, LOG, EXP2, LOG2, LOG10)  # the functions with an exact value without mpmath


def _exact_decimal(fn: Function, x: float, bits: int) -> Fraction:
    """exp, log, exp2, log2 and log10 in Python's decimal, its exp, ln and log10 correctly rounded at
    the context's precision (10**-8 below the 2**-(bits - 4) that _settle asks; exp2's rounded argument
    x ln 2, |x| < 2**8 where exp2 is finite and not 0, multiplies the error by at most 2**8)."""
    import decimal

    ctx = decimal.Context(prec=int(bits * 0.30103) + 8, Emax=10**6, Emin=-10**6)
    d = decimal.Decimal(x)
    if fn.code == EXP:
        value = ctx.exp(d)
    elif fn.code == EXP2:
        value = ctx.exp(ctx.multiply(d, ctx.ln(decimal.Decimal(2))))
    elif fn.code == LOG:
        value = ctx.ln(d)
    elif fn.code == LOG2:
        value = ctx.divide(ctx.ln(d), ctx.ln(decimal.Decimal(2)))
    else:
        value = ctx.log10(d)
    return Fraction(value)


# The binary32 rounding boundaries near a value: numbers of 25 significant bits (binary32's
# values and the midpoints between them), spaced 2**-150 below 2**-126.
def _spacing(q: Fraction) -> Fraction:
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    return Fraction(2) ** max(e - 24, -150)


def _cell(q: Fraction) -> tuple[Fraction, bool]:
    """The boundary at or below q (q > 0) and whether q is one."""
    g = _spacing(q)
    k = q // g
    return k * g, k * g == q


def _odd53(q: Fraction) -> float:
    """q rounded to odd at 53 bits (a binary64 number that is no 25-bit number unless q is)."""
    if q == 0:
        return 0.0
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    e = max(e - 52, -1074)
    m = a / Fraction(2) ** e
    k = m.numerator // m.denominator
    if k * Fraction(2) ** e != a:
        k |= 1
    if e > 1023 - 52:
        return math.copysign(_BIG, q)
    return math.copysign(math.ldexp(float(k), e), q)


def _settle(approx: Fraction, rel: Fraction) -> tuple[bool, float]:
    """Whether every value within rel * |approx| of approx lies strictly between the same two
    boundaries, and then a binary64 stand-in for the exact value."""
    if approx == 0:
        return False, 0.0
    a = abs(approx)
    if a >= Fraction(2) ** 128:
        return True, math.copysign(_BIG, approx)
    lo, hi = a * (1 - rel), a * (1 + rel)
    cell, on = _cell(lo)
    if on or lo == 0:
        return False, 0.0
    top, _ = _cell(hi)
    if top != cell:
        return False, 0.0
    return True, _odd53(approx)


def exact_value(fn: Function, xs: tuple[float, ...], ps: tuple[float, ...] = ()) -> float:
    """A binary64 number that rounds as ``fn``'s exact value does into binary32 (in every mode):
    the exact value where it is a boundary (25 significant bits), else one strictly between the
    same two boundaries. For the elements the fast path leaves open: finite operands, a finite
    exact value."""
    if fn.code in (ADDCMUL, ADDCDIV, LERP):
        q = _exact_rational(fn, xs, ps)
        cell, on = (_cell(abs(q)) if q else (0, True))
        if on or abs(q) >= Fraction(2) ** 128:
            return math.copysign(_BIG, q) if abs(q) >= Fraction(2) ** 128 else float(q)
        return _odd53(q)
    if fn.code == POW and xs[1] == math.floor(xs[1]) and abs(xs[1]) <= 64:
        q = Fraction(xs[0]) ** int(xs[1])
        if abs(q) >= Fraction(2) ** 128:
            return math.copysign(_BIG, q)
        _, on = _cell(abs(q))
        return float(q) if on else _odd53(q)
    mp = _mp()
    bits = 80
    last = None
    while bits <= 1280:
        if mp is None:
            if fn.code not in _DECIMAL:
                raise ImportError(f"{fn.name}: the exact value of an element near a binary32 rounding boundary "
                                  f"needs mpmath (pip install mpmath; torch installs it)")
            v = _exact_decimal(fn, xs[0], bits)
        else:
            with mp.workprec(bits + 16):
                m = _exact_mp(mp, fn, xs, ps)
                if not mp.isfinite(m):
                    return float(m)
                num, den = mp.libmp.to_rational(mp.mpf(m)._mpf_)  # exact
                v = Fraction(int(num), int(den))
        last = v
        ok, r = _settle(v, Fraction(1, 2 ** (bits - 4)))
        if ok:
            return r
        bits *= 2
    # Past 1280 bits: the exact value is taken to be the boundary nearest the last approximation.
    a = abs(last)
    g = _spacing(a)
    return math.copysign(float(round(a / g) * g), last)


# -- the public face ---------------------------------------------------------------------------------
_CFG32 = config(BINARY32)


_LAYOUT = {np.dtype(np.float16): (np.uint16, 10), np.dtype(np.float32): (np.uint32, 23)}  # else bfloat16


def _bits(x: np.ndarray) -> tuple[Any, Any, Any, Any]:
    """x's bit layout: its unsigned integer type, the magnitude mask (all but the sign), the
    bits of Inf, and the quiet bit."""
    uint, man = _LAYOUT.get(x.dtype, (np.uint16, 7))
    width = 8 * x.dtype.itemsize
    return uint, uint((1 << (width - 1)) - 1), uint(((1 << (width - 1 - man)) - 1) << man), uint(1 << (man - 1))


def specials(x: np.ndarray) -> int:
    """0 where x (binary16, bfloat16 or binary32) is all finite, 1 where it holds an Inf but no
    NaN, 2 where it holds a NaN."""
    uint, mask, inf, _ = _bits(x)
    top = K.largest_magnitude(x.reshape(-1).view(uint), mask)
    return 0 if top < inf else 1 if top == inf else 2


def signaling(x: np.ndarray) -> np.ndarray | None:
    """Where x (binary16, bfloat16 or binary32) holds a signaling NaN, or None if nowhere."""
    if x.dtype == np.float64 or specials(x) < 2:
        return None
    uint, mask, inf, quiet = _bits(x)
    mag = x.view(uint) & mask
    return (mag > inf) & ((mag & quiet) == 0)


@functools.lru_cache(maxsize=256)
def _params(values: tuple[float, ...]) -> np.ndarray:
    """A function's parameters, each rounded to binary32, as the kernels take them (4 slots)."""
    p = np.zeros(4)
    for i, v in enumerate(values):
        p[i] = float(np.float32(v))
    p.flags.writeable = False
    return p


def evaluate(name: str, *operands, params: tuple[float, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """RN32(f(operands)) elementwise for the function ``name`` of :data:`FUNCTIONS` (operands
    numpy arrays or scalars of float16, bfloat16, float32 or float64, broadcast together;
    ``params`` its parameters, each rounded to binary32 first): ``(float32 values, uint8 flags)``
    of the broadcast shape, the flags INVALID, DIVBYZERO and OVERFLOW as the module says."""
    fn = FUNCTIONS.get(name)
    if fn is None:
        raise ValueError(f"unknown function {name!r}; the functions are {', '.join(FUNCTIONS)}")
    if len(operands) != fn.arity:
        raise TypeError(f"{name} takes {fn.arity} operand(s), got {len(operands)}")
    if len(params) != len(fn.params):
        raise TypeError(f"{name} takes the parameters ({', '.join(fn.params)}), got {len(params)} value(s)")
    arrays = [np.asarray(x) for x in operands]
    for a in arrays:
        if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
            raise TypeError(f"{name}: operands must be float16, bfloat16, float32 or float64, got {a.dtype}")
    shape = arrays[0].shape
    if all(a.shape == shape for a in arrays):  # nothing to broadcast (one operand, or alike ones)
        wide = [a.astype(np.float64).reshape(-1) for a in arrays]
    else:
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
        wide = [np.ascontiguousarray(np.broadcast_to(a.astype(np.float64), shape)).reshape(-1) for a in arrays]
    p = _params(tuple(float(v) for v in params))
    n = wide[0].size
    bits = np.empty(n, np.uint32)
    flags = np.empty(n, np.uint8)
    if fn.arity == 1:
        hard = unary(fn.code, wide[0], bits, flags, p)
    elif fn.arity == 2:
        hard = binary(fn.code, wide[0], wide[1], bits, flags, p)
    else:
        hard = ternary(fn.code, wide[0], wide[1], wide[2], bits, flags, p)
    if hard:
        idx = np.flatnonzero(flags == _HARD)
        ps = tuple(float(v) for v in p[:len(fn.params)])
        r = np.array([exact_value(fn, tuple(float(w[i]) for w in wide), ps) for i in idx])
        b, f = np.empty(idx.size, np.uint32), np.empty(idx.size, np.uint8)
        K.round_values(r, b, f, _CFG32)
        bits[idx], flags[idx] = b, f & _OVERFLOW
    for a in arrays:
        s = signaling(a)
        if s is not None:
            flags |= np.broadcast_to(s, shape).reshape(-1).astype(np.uint8) * np.uint8(_INVALID)
    return bits.view(np.float32).reshape(shape), flags.reshape(shape)
