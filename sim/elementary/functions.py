"""The table of functions (name, operands, parameters) and ``evaluate``: a function of numpy operands
rounded once to binary32, with its flags."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import kernels as K
from ..formats import BINARY32
from ..rounding import config
from . import compiled as C
from . import pairs as P
from .exact import exact_value


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
    _f("exp", C.EXP, 1, "e**x"), _f("log", C.LOG, 1, "ln x"), _f("expm1", C.EXPM1, 1, "e**x - 1"),
    _f("log1p", C.LOG1P, 1, "ln(1 + x)"), _f("exp2", C.EXP2, 1, "2**x"), _f("log2", C.LOG2, 1, "log2 x"),
    _f("log10", C.LOG10, 1, "log10 x"), _f("tanh", C.TANH, 1, "tanh x"), _f("sigmoid", C.SIGMOID, 1, "1 / (1 + e**-x)"),
    _f("erf", C.ERF, 1, "erf x"), _f("erfc", C.ERFC, 1, "1 - erf x"), _f("erfinv", C.ERFINV, 1, "erf**-1 x"),
    _f("rsqrt", C.RSQRT, 1, "1 / sqrt x"), _f("sin", C.SIN, 1, "sin x"), _f("cos", C.COS, 1, "cos x"),
    _f("tan", C.TAN, 1, "tan x"), _f("asin", C.ASIN, 1, "asin x"), _f("acos", C.ACOS, 1, "acos x"),
    _f("atan", C.ATAN, 1, "atan x"), _f("sinh", C.SINH, 1, "sinh x"), _f("cosh", C.COSH, 1, "cosh x"),
    _f("asinh", C.ASINH, 1, "asinh x"), _f("acosh", C.ACOSH, 1, "acosh x"), _f("atanh", C.ATANH, 1, "atanh x"),
    _f("lgamma", C.LGAMMA, 1, "ln |Gamma(x)|"), _f("i0", C.I0, 1, "the modified Bessel function I0"),
    _f("gelu", C.GELU, 1, "x Phi(x) (Phi: the standard normal CDF)"),
    _f("gelu_tanh", C.GELU_TANH, 1, "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))"),
    _f("silu", C.SILU, 1, "x sigmoid(x)"), _f("mish", C.MISH, 1, "x tanh(ln(1 + e**x))"),
    _f("softplus", C.SOFTPLUS, 1, "ln(1 + e**(beta x)) / beta; x where beta x > threshold",
       ("beta", "threshold")),
    _f("logsigmoid", C.LOGSIGMOID, 1, "-ln(1 + e**-x)"),
    _f("elu", C.ELU, 1, "scale x above 0, else alpha scale (e**(input_scale x) - 1)",
       ("alpha", "scale", "input_scale")),
    _f("atan2", C.ATAN2, 2, "atan2(x, y)"), _f("pow", C.POW, 2, "x ** y (IEEE pow's special cases)"),
    _f("hypot", C.HYPOT, 2, "sqrt(x**2 + y**2)"), _f("logaddexp", C.LOGADDEXP, 2, "ln(e**x + e**y)"),
    _f("glu", C.GLU, 2, "x sigmoid(y)"),
    _f("sigmoid_backward", C.SIGMOID_BW, 2, "grad s (1 - s) from the result s"),
    _f("tanh_backward", C.TANH_BW, 2, "grad (1 - t**2) from the result t"),
    _f("gelu_backward", C.GELU_BW, 2, "grad (Phi(x) + x phi(x))"),
    _f("gelu_tanh_backward", C.GELU_TANH_BW, 2, "grad times gelu_tanh'(x)"),
    _f("silu_backward", C.SILU_BW, 2, "grad (s + x s (1 - s)), s = sigmoid(x)"),
    _f("mish_backward", C.MISH_BW, 2, "grad times mish'(x)"),
    _f("softplus_backward", C.SOFTPLUS_BW, 2, "grad sigmoid(beta x); grad where beta x > threshold",
       ("beta", "threshold")),
    _f("logsigmoid_backward", C.LOGSIGMOID_BW, 2, "grad sigmoid(-x)"),
    _f("elu_backward", C.ELU_BW, 2, "grad scale above 0, else grad input_scale alpha scale e**(input_scale x); "
       "from the result y (is_result 1): grad input_scale (y + alpha scale)",
       ("alpha", "scale", "input_scale", "is_result")),
    _f("addcmul", C.ADDCMUL, 3, "x + value a b", ("value",)),
    _f("addcdiv", C.ADDCDIV, 3, "x + value a / b", ("value",)),
    _f("lerp", C.LERP, 3, "x + w (end - x): operands start, end, weight"),
)}


# -- the public face ---------------------------------------------------------------------------------
_CFG32 = config(BINARY32)
_LAYOUT = {np.dtype(np.float16): (np.uint16, 10), np.dtype(np.float32): (np.uint32, 23)}  # else bfloat16
_BITS: dict[np.dtype, tuple[Any, Any, Any, Any]] = {}


def _bits(x: np.ndarray) -> tuple[Any, Any, Any, Any]:
    """x's bit layout: its unsigned integer type, the magnitude mask (all but the sign), the
    bits of Inf, and the quiet bit (made once per dtype)."""
    layout = _BITS.get(x.dtype)
    if layout is None:
        uint, man = _LAYOUT.get(x.dtype, (np.uint16, 7))
        width = 8 * x.dtype.itemsize
        layout = _BITS[x.dtype] = (uint, uint((1 << (width - 1)) - 1), uint(((1 << (width - 1 - man)) - 1) << man),
                                   uint(1 << (man - 1)))
    return layout


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


_NO_PARAMS = _params(())


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
    arrays = [x if x.__class__ is np.ndarray else np.asarray(x) for x in operands]
    for a in arrays:
        if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
            raise TypeError(f"{name}: operands must be float16, bfloat16, float32 or float64, got {a.dtype}")
    shape = arrays[0].shape
    if all(a.shape == shape for a in arrays):  # nothing to broadcast (one operand, or alike ones)
        wide = [a.astype(np.float64).reshape(-1) for a in arrays]
    else:
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
        wide = [np.ascontiguousarray(np.broadcast_to(a.astype(np.float64), shape)).reshape(-1) for a in arrays]
    p = _params(tuple([float(v) for v in params])) if params else _NO_PARAMS
    n = wide[0].size
    bits = np.empty(n, np.uint32)
    flags = np.empty(n, np.uint8)
    if fn.arity == 1:
        hard = C.unary(fn.code, wide[0], bits, flags, p)
    elif fn.arity == 2:
        hard = P.binary(fn.code, wide[0], wide[1], bits, flags, p)
    else:
        hard = P.ternary(fn.code, wide[0], wide[1], wide[2], bits, flags, p)
    if hard:
        idx = np.flatnonzero(flags == C._HARD)
        ps = tuple(float(v) for v in p[:len(fn.params)])
        r = np.array([exact_value(fn, tuple(float(w[i]) for w in wide), ps) for i in idx])
        b, f = np.empty(idx.size, np.uint32), np.empty(idx.size, np.uint8)
        K.round_values(r, b, f, _CFG32)
        bits[idx], flags[idx] = b, f & C._OVERFLOW
    for a in arrays:
        s = signaling(a)
        if s is not None:
            flags |= np.broadcast_to(s, shape).reshape(-1).astype(np.uint8) * np.uint8(C._INVALID)
    return bits.view(np.float32).reshape(shape), flags.reshape(shape)

