"""The compiled elementwise functions of two and three operands (atan2, pow, hypot, logaddexp,
GLU, the activations' backwards; addcmul, addcdiv, lerp), evaluated and rounded once to binary32
as the one-operand functions of :mod:`.compiled` are, whose codes and helpers they share."""

from __future__ import annotations

import math

import numpy as np

from .. import kernels as K
from .compiled import (
    _BIG,
    _DIVBYZERO,
    _INV_SQRT_2PI,
    _INVALID,
    _K0,
    _K1,
    _SQRT1_2,
    _U,
    ADDCDIV,
    ADDCMUL,
    ATAN2,
    ELU_BW,
    GELU_BW,
    GELU_TANH_BW,
    GLU,
    HYPOT,
    LIBM,
    LOGADDEXP,
    LOGSIGMOID_BW,
    MISH_BW,
    POW,
    SIGMOID_BW,
    SILU_BW,
    SOFTPLUS_BW,
    TANH_BW,
    _accept,
    _approx,
    _sigmoid,
    inline,
    jit,
)

_HARD = K.HARD


@inline
def _binary(code, x, y, p0, p1, p2, p3):
    """(r, err, flags) of the two-operand functions (y: the second operand; for the backward
    functions x is the gradient and y the forward's input)."""
    if code <= GLU or code == LOGADDEXP:  # ATAN2, POW, HYPOT, GLU and LOGADDEXP
        return _pairs(code, x, y)
    # The backward functions: grad x, input (or result) y.
    if math.isnan(x) or math.isnan(y):
        return np.nan, 0.0, 0
    if code == SIGMOID_BW or code == TANH_BW or code == ELU_BW or code == SOFTPLUS_BW or code == LOGSIGMOID_BW:
        return _backward(code, x, y, p0, p1, p2, p3)
    if math.isinf(y):  # gelu', silu', mish' at +-inf: inf * 0 in torch's formulas
        return np.nan, 0.0, _INVALID
    return _gated_backward(code, x, y)


@inline
def _pairs(code, x, y):
    """atan2, hypot, logaddexp, pow and GLU."""
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
    return np.nan, 0.0, _INVALID


@inline
def _backward(code, x, y, p0, p1, p2, p3):
    """The backwards of sigmoid, tanh, ELU, softplus and logsigmoid (x, y not NaN)."""
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
    return np.nan, 0.0, _INVALID


@inline
def _gated_backward(code, x, y):
    """The backwards of the gated activations (x, y not NaN, y finite)."""
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

