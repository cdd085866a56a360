"""Pointwise models: the activations, pow, and binary arithmetic with a scalar, each rounded once
(or as torch's kernel rounds in binary32)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .common import _F32, _cr, _np, _scalar32, _t


def _unary(name: str) -> Callable:
    return lambda mode, x: _cr(mode, name, x)


_UNARY = {"exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log2": "log2", "log10": "log10",
          "log1p": "log1p", "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan",
          "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh",
          "sigmoid": "sigmoid", "erf": "erf", "erfc": "erfc", "erfinv": "erfinv", "rsqrt": "rsqrt",
          "lgamma": "lgamma", "i0": "i0", "special_i0": "i0", "silu": "silu", "mish": "mish"}


def _gelu(mode, x, approximate="none"):
    return _cr(mode, "gelu_tanh" if approximate == "tanh" else "gelu", x)


def _gelu_backward(mode, grad, x, approximate="none"):
    return _cr(mode, "gelu_tanh_backward" if approximate == "tanh" else "gelu_backward", grad, x)


def _elu(mode, x, alpha=1, scale=1, input_scale=1):
    return _cr(mode, "elu", x, params=(_scalar32(alpha), _scalar32(scale), _scalar32(input_scale)))


def _elu_backward(mode, grad, alpha, scale, input_scale, is_result, y):
    return _cr(mode, "elu_backward", grad, y,
               params=(_scalar32(alpha), _scalar32(scale), _scalar32(input_scale), float(bool(is_result))))


def _softplus(mode, x, beta=1, threshold=20):
    return _cr(mode, "softplus", x, params=(_scalar32(beta), _scalar32(threshold)))


def _softplus_backward(mode, grad, x, beta, threshold):
    return _cr(mode, "softplus_backward", grad, x, params=(_scalar32(beta), _scalar32(threshold)))


def _log_sigmoid_forward(mode, x):
    """(logsigmoid x, the buffer exp(-|x|)): the backward here does not read the buffer."""
    return _cr(mode, "logsigmoid", x), _cr(None, "exp", -x.abs())


def _glu(mode, x, dim=-1):
    a, b = x.chunk(2, dim)
    return _cr(mode, "glu", a, b)


def _glu_backward(mode, grad, x, dim):
    a, b = x.chunk(2, dim)
    s = _cr(mode, "sigmoid", b)
    ga = _cr(mode, "glu", grad, b)  # grad * sigmoid(b)
    gb = _cr(mode, "sigmoid_backward", grad * a, s)  # grad * a * s (1 - s), two roundings
    return torch.cat([ga, gb], dim)


def _pow(mode, x, e):
    if isinstance(x, torch.Tensor) and not isinstance(e, torch.Tensor):
        if e == 2:
            return x * x  # IEEE: one rounding of the exact square
        if e == 1:
            return x.clone()
        if e == 0.5 and x.dtype == _F32:
            return _sqrt(x)
    return _cr(mode, "pow", x, e)


def _add(mode, x, y, alpha=1):
    """x + alpha * y: one rounding of the exact value (as a fused multiply-add gives it)."""
    if alpha == 1 or alpha == -1 or not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        return NotImplemented
    one = np.float32(1)
    return _cr(mode, "addcmul", x, y, one, params=(_scalar32(alpha),))


def _sub(mode, x, y, alpha=1):
    return NotImplemented if alpha in (1, -1) else _add(mode, x, y, -alpha)


def _addcmul(mode, x, a, b, value=1):
    return _cr(mode, "addcmul", x, a, b, params=(_scalar32(value),))


def _addcdiv(mode, x, a, b, value=1):
    return _cr(mode, "addcdiv", x, a, b, params=(_scalar32(value),))


def _lerp(mode, x, end, weight):
    return _cr(mode, "lerp", x, end, weight)


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root of a binary32 tensor (see :func:`_numpy_ieee`)."""
    with np.errstate(invalid="ignore"):
        return _t(np.sqrt(_np(x)))


def _numpy_ieee(fn: Callable, op: Callable) -> Callable:
    """An exact IEEE operation of numpy's (sqrt, fmod, remainder) on binary32 results. torch's own
    are not the same on every host: its binary32 sqrt here is not correctly rounded (on every
    CPU capability), and its vectorised fmod and remainder differ from its scalar ones for
    operands far apart in magnitude. numpy's sqrt is the CPU's correctly rounded instruction,
    its fmod C's (exact), its remainder Python's modulus (fmod, then the divisor added once
    where the signs differ: one rounding). Another result dtype: torch's own ``op``."""
    def run(mode, *xs):
        if torch.result_type(*xs) != _F32 if len(xs) > 1 else xs[0].dtype != _F32:
            return op(*xs)
        arrays = [_np(x.to(_F32)) if isinstance(x, torch.Tensor) else np.float32(x) for x in xs]
        with np.errstate(all="ignore"):
            return _t(np.asarray(fn(*arrays), np.float32))
    return run


def _binary_cr(name: str) -> Callable:
    return lambda mode, x, y: _cr(mode, name, x, y)

