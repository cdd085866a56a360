"""sim.elementary and the fused/float32 unary routes of sim.torch, checked against MPFR.

What is checked against what:

- ``test_elementary_*``: ``sim.elementary.evaluate`` for every one-operand function of
  ``FUNCTIONS`` (default parameters: softplus beta 1, threshold 20; elu alpha = scale =
  input_scale = 1) against a reference written here from MPFR primitives (gmpy2) at 128 to 2048
  bits, the precision raised until the whole error band rounds to one binary32 number (Ziv's
  loop; a result MPFR reports exact is rounded directly), then rounded once to binary32 (an MPFR
  context of precision 24, emin -148, emax 128, subnormalize). Composites are built from MPFR
  primitives: gelu = x erfc(-x/sqrt2)/2, gelu_tanh = x sigmoid(2 sqrt(2/pi)(x + 0.044715 x**3))
  with 0.044715 the exact decimal (the docstring's and ``_exact_mp``'s definition), silu, mish =
  x tanh(softplus x), softplus, logsigmoid, elu, sigmoid; erfinv by Newton's method on MPFR's erf
  / erfc; i0 by its power series; lgamma, rsqrt and the rest are MPFR functions. Zeros, infinities,
  poles and domain errors come from a table written from the module docstring (torch's formulas
  where it says so: gelu/silu/mish of -inf is NaN, elu(-0) = -0). Values bit for bit (NaNs by
  NaN-ness), flags (INVALID, DIVBYZERO, OVERFLOW; a signaling NaN operand INVALID) exactly.
  Default run: a few thousand binary16, bfloat16 and binary32 operands aimed at the hard places
  (specials, NaN payloads, subnormals, poles, the binary16-output and binary32 overflow
  thresholds found by bisection on the reference, random patterns); ``exhaustive``: every
  binary16 and every bfloat16 value.
- ``test_device_*``: the float16 unary fused-family functions (math, gelu, silu, activation) and
  the float32-route functions with an elementary model (erfc, asinh, acosh, atanh, lgamma, i0)
  under ``sim.torch.DeviceMode`` in atlas-a2 (INF/NaN mode) and atlas-training (saturation): each
  output equals RN16(RN32(f(x))) from the MPFR reference (numpy's float32 -> float16 rounding,
  then Inf -> +-65504 and NaN -> 0 in saturation mode), and the register (slots 0-2 of
  ``get_float_status``) holds exactly the events that reach the output: OVERFLOW where the
  binary32 value overflowed or has |RN32(f(x))| >= 65520, INVALID for a NaN from a non-NaN
  operand, DIVBYZERO for a pole. Each element is computed alone (a fresh 1-element tensor) and
  inside long tensors at several positions and lengths: the same bits, the same events.
  The other float32-route unary functions (digamma, logit, sinc, ndtri, erfcx, log_ndtr, entr,
  deg2rad, i0e, i1, i1e: torch's binary32 values, no elementary model) only for the register
  against what IEEE mode's output shows, and saturation mode against IEEE mode.
- ``test_elementary_slow_path`` / ``_hard_cases``: ``exact_value`` (the path of the elements near a
  rounding boundary) against the reference, on the binary32 sample and (exhaustive) on operands
  the fast path leaves open, mined with the module's kernel (only the operands are chosen so).
- hand-worked cases of the issue (exp2(200) saturating to 65504 and setting OVERFLOW, log2(-1.5),
  log2(0), log10(0), log1p(-1), asin(2), acos(2), erfinv(+-1), sinh(-88.75) at any length).

Cases found by these tests each have a test of their own: exp2 of an integer 1024..1100 (it gave
Inf with no OVERFLOW), a signaling NaN operand of the fused and float32 routes (no INVALID), and
events judged element by element on every pointwise float32 route (a NaN elsewhere in the tensor
hid an element's pole).
"""

from __future__ import annotations

import functools
import math
import random
import zlib

import gmpy2
import ml_dtypes
import numpy as np
import pytest
from gmpy2 import mpfr, mpq

from sim import BINARY16, Flag
from sim import elementary as E
from sim.elementary import compiled

from oracle import saturated

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from sim import Device  # noqa: E402
from sim.torch import DeviceMode  # noqa: E402

INVALID, DIVBYZERO, OVERFLOW = int(Flag.INVALID), int(Flag.DIVBYZERO), int(Flag.OVERFLOW)
EVENTS = INVALID | DIVBYZERO | OVERFLOW
INF, NAN = math.inf, math.nan
BF16 = np.dtype(ml_dtypes.bfloat16)

# -- the MPFR reference ---------------------------------------------------------------------------
B32 = gmpy2.context(precision=24, emin=-148, emax=128, subnormalize=True, round=gmpy2.RoundToNearest)
_WIDE = dict(emin=-(1 << 30), emax=1 << 30, round=gmpy2.RoundToNearest)
_PRECISIONS = (128, 256, 512, 1024, 2048)
_K1 = mpq(44715, 10**6)  # GELU's tanh constant, the exact decimal

#: MPFR's own functions (correctly rounded; MPFR says when the result is exact).
_PRIMITIVES = {"exp": "exp", "log": "log", "expm1": "expm1", "log1p": "log1p", "exp2": "exp2", "log2": "log2",
               "log10": "log10", "tanh": "tanh", "erf": "erf", "erfc": "erfc", "rsqrt": "rec_sqrt", "sin": "sin",
               "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh",
               "cosh": "cosh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh"}
_COMPOSITES = {"sigmoid", "erfinv", "lgamma", "i0", "gelu", "gelu_tanh", "silu", "mish", "softplus", "logsigmoid",
               "elu"}
#: torch's defaults.
DEFAULT_PARAMS = {"softplus": (1.0, 20.0), "elu": (1.0, 1.0, 1.0)}


def _softplus(ctx, z):
    """ln(1 + e**z), no cancellation (z + ln(1 + e**-z) above 0)."""
    if z <= 0:
        return ctx.log1p(ctx.exp(z))
    return ctx.add(z, ctx.log1p(ctx.exp(-z)))


def _sigmoid(ctx, z):
    return ctx.div(1, ctx.add(1, ctx.exp(-z)))


def _erfinv(ctx, x, p):
    """erfinv(x), 0 < |x| < 1: Newton's method, monotone from the safe side (erf(y) = a from below
    on [0, 1/2], concave there; erfc(y) = 1 - a from above beyond, erfc convex, y0 = sqrt(-ln q)
    at or above the root since erfc(y) <= e**-y**2)."""
    a = abs(x)
    two_sqrtpi = ctx.div(2, ctx.sqrt(ctx.const_pi()))
    if a <= 0.5:
        y = ctx.div(a, two_sqrtpi)
        g = lambda y: ctx.sub(ctx.erf(y), a)  # noqa: E731
    else:
        q = ctx.sub(1, a)  # exact
        y = ctx.sqrt(-ctx.log(q))
        g = lambda y: ctx.sub(q, ctx.erfc(y))  # noqa: E731  (= erf(y) - a)
    small = 0
    for _ in range(500):
        step = ctx.div(g(y), ctx.mul(two_sqrtpi, ctx.exp(-ctx.mul(y, y))))
        y = ctx.sub(y, step)
        small = small + 1 if abs(step) <= y * mpfr(2) ** -(p - 8) else 0
        if small == 2:
            return gmpy2.copy_sign(y, x)
    raise AssertionError(f"reference: erfinv({x}) did not converge")


def _i0(ctx, x, p):
    """I0(x) = sum (x**2/4)**k / (k!)**2 (positive terms); stops once a term is below 2**-(p+8)
    of the sum and the ratio of terms below 1/2 (the tail is below twice the last term)."""
    q = ctx.div(ctx.mul(x, x), 4)
    term, total, k = mpfr(1), mpfr(1), 0
    while True:
        k += 1
        term = ctx.div(ctx.mul(term, q), k * k)
        total = ctx.add(total, term)
        if term <= total * mpfr(2) ** -(p + 8) and q < (k + 1) ** 2 / 2:
            return total


def _approx(name, x, ctx, p, params):
    """f(x) at precision p for finite x outside the special table: (value, exact)."""
    if name in _PRIMITIVES:
        ctx.clear_flags()
        v = getattr(ctx, _PRIMITIVES[name])(x)
        return v, not ctx.inexact
    if name == "lgamma":
        ctx.clear_flags()
        v, _ = ctx.lgamma(x)
        return v, not ctx.inexact
    if name == "sigmoid":
        return _sigmoid(ctx, x), False
    if name == "erfinv":
        return _erfinv(ctx, x, p), False
    if name == "i0":
        return _i0(ctx, x, p), False
    if name == "gelu":  # x Phi(x) = x erfc(-x / sqrt 2) / 2
        return ctx.div(ctx.mul(x, ctx.erfc(ctx.div(-x, ctx.sqrt(2)))), 2), False
    if name == "gelu_tanh":  # 0.5 x (1 + tanh u) = x sigmoid(2u), u = sqrt(2/pi) (x + k1 x**3)
        k0 = ctx.sqrt(ctx.div(2, ctx.const_pi()))
        u2 = ctx.mul(2 * k0, ctx.add(x, ctx.mul(mpfr(_K1, p + 64), x * x * x)))
        return ctx.mul(x, _sigmoid(ctx, u2)), False
    if name == "silu":
        return ctx.mul(x, _sigmoid(ctx, x)), False
    if name == "mish":
        return ctx.mul(x, ctx.tanh(_softplus(ctx, x))), False
    if name == "softplus":
        beta = mpfr(params[0])
        return ctx.div(_softplus(ctx, ctx.mul(beta, x)), beta), False
    if name == "logsigmoid":
        return -_softplus(ctx, -x), False
    if name == "elu":
        alpha, scale, iscale = (mpfr(v) for v in params)
        if x > 0:
            return ctx.mul(scale, x), True  # exact at p >= 128 (two binary32-or-narrower values)
        return ctx.mul(ctx.mul(alpha, scale), ctx.expm1(ctx.mul(iscale, x))), False
    raise AssertionError(f"no reference for {name}")


def _special(name, x, params):
    """(value, flags) where the table decides: NaN/Inf operands, zeros of exact value, poles and
    domain errors (the module docstring's definitions); None elsewhere. A value here is a float
    held by binary32, or an mpfr rounded by the caller."""
    pos_inf, neg_inf = x == INF, x == -INF
    inf = pos_inf or neg_inf
    if name in ("log", "log2", "log10", "log1p"):
        edge = -1.0 if name == "log1p" else 0.0
        if x < edge:
            return NAN, INVALID
        if x == edge:
            return -INF, DIVBYZERO
        return (INF, 0) if pos_inf else None
    if name in ("exp", "exp2"):
        return ((INF if pos_inf else 0.0), 0) if inf else None
    if name == "expm1":
        return ((INF if pos_inf else -1.0), 0) if inf else None
    if name in ("tanh", "erf"):
        return (math.copysign(1.0, x), 0) if inf else None
    if name == "sigmoid":
        return ((1.0 if pos_inf else 0.0), 0) if inf else None
    if name == "erfc":
        return ((0.0 if pos_inf else 2.0), 0) if inf else None
    if name == "erfinv":
        if abs(x) > 1:
            return NAN, INVALID
        if abs(x) == 1:
            return math.copysign(INF, x), DIVBYZERO
        return None
    if name == "rsqrt":
        if x == 0:
            return math.copysign(INF, x), DIVBYZERO  # IEEE 754 rSqrt(+-0) = +-Inf
        if x < 0:
            return NAN, INVALID
        return (0.0, 0) if pos_inf else None
    if name in ("sin", "cos", "tan"):
        return (NAN, INVALID) if inf else None
    if name in ("asin", "acos"):
        return (NAN, INVALID) if abs(x) > 1 else None
    if name == "atan":
        return None  # MPFR: atan(+-inf) = +-pi/2, rounded
    if name in ("sinh", "asinh"):
        return (x, 0) if inf else None
    if name == "cosh":
        return (INF, 0) if inf else None
    if name == "acosh":
        if x < 1:
            return NAN, INVALID
        return (INF, 0) if pos_inf else None
    if name == "atanh":
        if abs(x) > 1:
            return NAN, INVALID
        if abs(x) == 1:
            return math.copysign(INF, x), DIVBYZERO
        return None
    if name == "lgamma":
        if inf:
            return INF, 0
        if x <= 0 and x == math.floor(x):
            return INF, DIVBYZERO  # a pole of Gamma (+-0 among them)
        return None
    if name == "i0":
        if inf:
            return INF, 0
        if abs(x) >= 100:  # I0 increases with |x|; I0(100) > its term k = 50, 50**100 / (50!)**2 > 2**128
            return INF, OVERFLOW
        return None
    if name in ("gelu", "gelu_tanh", "silu", "mish"):
        if pos_inf:
            return INF, 0
        if neg_inf:
            return NAN, INVALID  # torch's formula: -inf * 0
        return None
    if name == "softplus":
        beta, threshold = params
        if beta * x > threshold:  # exact in binary64 (binary32 times a binary32-or-narrower value)
            return x, 0
        return (0.0, 0) if neg_inf else None
    if name == "logsigmoid":
        if pos_inf:
            return -0.0, 0
        return (-INF, 0) if neg_inf else None
    if name == "elu":
        alpha, scale, _ = params
        if x == 0:
            return x * scale, 0  # torch: scale x for either zero, whatever alpha
        if pos_inf:
            return INF, 0
        if neg_inf:
            return -(mpfr(alpha) * mpfr(scale)), 0
        return None
    raise AssertionError(f"no special table for {name}")


def _bits32(v) -> int:
    return int(np.float32(float(v)).view(np.uint32))


def _round32(v) -> float:
    return float(B32.plus(v))


def reference(name: str, x: float, params: tuple = ()) -> tuple[float, int]:
    """(RN32(f(x)) as a float, flags INVALID/DIVBYZERO/OVERFLOW) for a non-NaN x (binary32 or
    narrower), f the exact real function."""
    return _reference(name, x, math.copysign(1.0, x), tuple(params))  # +0 and -0 cached apart


@functools.cache
def _reference(name: str, x: float, sign: float, params: tuple) -> tuple[float, int]:
    special = _special(name, x, params)
    if special is not None:
        v, fl = special
        return (_round32(v) if isinstance(v, type(mpfr(0))) else v), fl
    xm = mpfr(x, 53)  # exact
    for p in _PRECISIONS:
        with gmpy2.context(precision=p, **_WIDE) as ctx:
            v, exact = _approx(name, xm, ctx, p, params)
        if gmpy2.is_nan(v):
            raise AssertionError(f"reference: {name}({x!r}) is NaN in MPFR")
        if gmpy2.is_infinite(v):  # finite x, finite exact value beyond 2**(2**30): an overflow
            return math.copysign(INF, v), OVERFLOW
        if exact:
            r = _round32(v)
        else:
            with gmpy2.context(precision=p + 64, **_WIDE):
                tol = mpfr(2) ** -(p - 40)
                lo, hi = v * (1 - tol), v * (1 + tol)
            r, r_hi = _round32(lo), _round32(hi)
            if _bits32(r) != _bits32(r_hi):
                continue
        return r, (OVERFLOW if math.isinf(r) else 0)
    raise AssertionError(f"reference: {name}({x!r}) undecided at {_PRECISIONS[-1]} bits")


# -- operands -----------------------------------------------------------------------------------
FORMATS = {"binary16": (np.float16, np.uint16, 10), "bfloat16": (BF16, np.uint16, 7),
           "binary32": (np.float32, np.uint32, 23)}


def is_snan(bits: int, fmt: str) -> bool:
    _, _, man = FORMATS[fmt]
    width = 16 if fmt != "binary32" else 32
    mag = bits & ((1 << (width - 1)) - 1)
    inf = ((1 << (width - 1 - man)) - 1) << man
    return mag > inf and not mag & (1 << (man - 1))


def expected(name: str, fmt: str, bits: np.ndarray, params: tuple = ()) -> tuple[np.ndarray, np.ndarray]:
    """The reference over operands given by bit patterns: (float32 values, flags)."""
    dtype, uint, _ = FORMATS[fmt]
    with np.errstate(invalid="ignore"):
        xs = np.asarray(bits, uint).view(dtype).astype(np.float64)
    vals = np.empty(len(xs), np.float32)
    flags = np.zeros(len(xs), np.uint8)
    for i, (b, x) in enumerate(zip(bits, xs, strict=True)):
        if math.isnan(x):
            vals[i], flags[i] = NAN, INVALID if is_snan(int(b), fmt) else 0
            continue
        v, fl = reference(name, float(x), params)
        vals[i], flags[i] = v, fl
    return vals, flags


def _neighbours(x: float, fmt: str, k: int = 3) -> list[int]:
    """x rounded into fmt and its k neighbours on each side, as bit patterns (both signs)."""
    dtype, uint, _ = FORMATS[fmt]
    with np.errstate(over="ignore"):
        b = int(np.array([abs(x)]).astype(np.float32).astype(dtype).view(uint)[0])
    width = np.dtype(uint).itemsize * 8
    inf = int(np.array([np.inf], dtype).view(uint)[0])
    out = []
    for d in range(-k, k + 1):
        m = b + d
        if 0 <= m <= inf:
            out += [m, m | (1 << (width - 1))]
    return out


def _threshold(name: str, fmt: str, params, pred) -> list[int]:
    """Bit patterns around the first positive operand of fmt where pred(RN32 f(x)) holds (pred
    monotone over the positive operands from 3 up): bisection on the reference."""
    dtype, uint, _ = FORMATS[fmt]
    lo = int(np.array([3.0], dtype).view(uint)[0])
    hi = int(np.array([np.inf], dtype).view(uint)[0]) - 1
    val = lambda b: float(np.array([b], uint).view(dtype)[0])  # noqa: E731
    if not pred(reference(name, val(hi), params)[0]) or pred(reference(name, val(lo), params)[0]):
        return []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(reference(name, val(mid), params)[0]):
            hi = mid
        else:
            lo = mid
    return _neighbours(val(hi), fmt)


_POINTS = [0.0, 0.5, 1.0, 2.0, 3.0, 6.0, 10.0, 20.0, 30.0, 100.0, math.pi / 2, math.pi, 3 * math.pi / 2,
           2.0**-14, 2.0**-24, 2.0**-20, 2.0**-28, 2.0**-126, 2.0**-149, 65504.0, 3.96484375, 88.75, 4.0, 5.0,
           0.25, 1e-3, 1024.0, 1100.0, 1075.0, 150.0]
_SPECIALS = {"binary16": [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0xFC01, 0x7D00, 0x7DFF,
                          0x7FFF, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00],
             "bfloat16": [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFF81, 0x7FA0, 0x7FFF, 0x0001,
                          0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x3F80, 0xBF80],
             "binary32": [0x0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFF800001,
                          0x7FA00000, 0x7FBFFFFF, 0x1, 0x80000001, 0x7FFFFF, 0x800000, 0x7F7FFFFF, 0xFF7FFFFF,
                          0x3F800000, 0xBF800000]}
_GROWING = ("exp", "exp2", "expm1", "sinh", "cosh", "i0", "lgamma")


@functools.cache
def sample(fmt: str, name: str) -> np.ndarray:
    """The default run's operands of fmt for function name: specials, the points' neighbours,
    the function's overflow thresholds (binary16 output, binary32), random patterns."""
    dtype, uint, _ = FORMATS[fmt]
    bits = list(_SPECIALS[fmt])
    for x in _POINTS:
        bits += _neighbours(x, fmt, 2)
    if name in _GROWING:
        params = DEFAULT_PARAMS.get(name, ())
        bits += _threshold(name, fmt, params, lambda v: abs(v) >= 65520)
        bits += _threshold(name, fmt, params, math.isinf)
    if name == "lgamma":
        for k in range(1, 8):
            bits += _neighbours(-k, fmt, 2) + _neighbours(-k + 0.5, fmt, 1)
    rng = random.Random(f"{fmt}-{name}")
    width = np.dtype(uint).itemsize * 8
    bits += [rng.getrandbits(width) for _ in range(48)]
    bits += [int(np.array([rng.uniform(-12, 12)]).astype(np.float32).astype(dtype).view(uint)[0])
             for _ in range(48)]
    return np.array(sorted(set(bits)), uint)


# -- test 1: sim.elementary against the reference ---------------------------------------------
UNARY = sorted(n for n, f in E.FUNCTIONS.items() if f.arity == 1)


def test_every_unary_function_has_a_reference():
    assert set(UNARY) == set(_PRIMITIVES) | _COMPOSITES
    for n in UNARY:
        assert len(DEFAULT_PARAMS.get(n, ())) == len(E.FUNCTIONS[n].params), n


def _describe(name, fmt, bits, got, want, gf, wf):
    rows = []
    for i in range(len(bits)):
        rows.append(f"{name}({fmt} 0x{int(bits[i]):x}): got 0x{_bits32(got[i]):08x} flags {int(gf[i]):#x}, "
                    f"want 0x{_bits32(want[i]):08x} flags {int(wf[i]):#x}")
    return "\n".join(rows[:20]) + (f"\n... {len(rows)} in all" if len(rows) > 20 else "")


def check_elementary(name: str, fmt: str, bits: np.ndarray) -> None:
    dtype, uint, _ = FORMATS[fmt]
    params = DEFAULT_PARAMS.get(name, ())
    bits = np.asarray(bits, uint)
    xs = bits.view(dtype)
    with np.errstate(invalid="ignore"):  # numpy's warning on widening NaN bfloat16s
        got, gflags = E.evaluate(name, xs, params=params)
    want, wflags = expected(name, fmt, bits, params)
    assert got.dtype == np.float32 and got.shape == xs.shape
    same = np.where(np.isnan(want), np.isnan(got), got.view(np.uint32) == want.view(np.uint32))
    bad = ~same | (gflags != wflags)
    idx = np.flatnonzero(bad)
    assert not idx.size, _describe(name, fmt, bits[idx], got[idx], want[idx], gflags[idx], wflags[idx])


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("name", UNARY)
def test_elementary_sample(name, fmt):
    check_elementary(name, fmt, sample(fmt, name))


@pytest.mark.exhaustive
@pytest.mark.parametrize("fmt", ["binary16", "bfloat16"])
@pytest.mark.parametrize("name", UNARY)
def test_elementary_exhaustive(name, fmt):
    check_elementary(name, fmt, np.arange(1 << 16, dtype=np.uint16))


def _finite_cases(name: str, fmt: str, bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The operands among bits where the slow path applies (finite operand, finite exact value:
    no pole, no domain error, no table entry) and their reference values."""
    dtype, uint, _ = FORMATS[fmt]
    params = DEFAULT_PARAMS.get(name, ())
    with np.errstate(invalid="ignore"):
        xs = np.asarray(bits, uint).view(dtype).astype(np.float64)
    keep = []
    for i, x in enumerate(xs):
        if np.isfinite(x) and _special(name, float(x), params) is None:
            keep.append(i)
    xs = xs[keep]
    want = np.array([reference(name, float(x), params)[0] for x in xs], np.float32)
    # a value beyond binary32 or rounding to 0 (exp(1e30), gelu(-1e4)) is no element of the slow path,
    # whose exact rationals would grow with it
    ok = np.isfinite(want) & (want != 0) & (np.abs(xs) < 2.0**16)
    if name == "elu":  # scale x above 0 is exact in the fast path (exact_value's formula is the other branch's)
        ok &= xs < 0
    return xs[ok], want[ok]


def check_exact_value(name: str, xs: np.ndarray, want: np.ndarray) -> None:
    fn = E.FUNCTIONS[name]
    params = tuple(float(np.float32(v)) for v in DEFAULT_PARAMS.get(name, ()))
    with np.errstate(over="ignore"):
        got = np.array([E.exact_value(fn, (float(x),), params) for x in xs]).astype(np.float32)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert not bad.size, "\n".join(f"exact_value {name}({xs[i]!r}): rounds to 0x{_bits32(got[i]):08x}, want "
                                   f"0x{_bits32(want[i]):08x}" for i in bad[:20])


@pytest.mark.parametrize("name", UNARY)
def test_elementary_slow_path(name):
    """exact_value (the path of the elements near a rounding boundary) on part of the binary32
    sample: its binary64 stand-in rounds to the reference's binary32 value."""
    xs, want = _finite_cases(name, "binary32", sample("binary32", name)[::6])
    assert xs.size
    check_exact_value(name, xs, want)


@pytest.mark.exhaustive
def test_elementary_hard_cases():
    """binary32 operands the fast path leaves open (flags HARD from sim.elementary's kernel: only
    the operands are chosen that way), found among 2**23 random ones in (-16, 16) ((-1, 1) for
    erfinv) per function (one in about 2**21 is), through evaluate and through exact_value."""
    found = {}
    for name in UNARY:
        fn = E.FUNCTIONS[name]
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        x = rng.uniform(-16, 16, 1 << 23).astype(np.float32)
        if name == "erfinv":
            x = (x / 16).astype(np.float32)
        out, fl = np.empty(x.size, np.uint32), np.empty(x.size, np.uint8)
        p = np.zeros(4)
        p[:len(DEFAULT_PARAMS.get(name, ()))] = DEFAULT_PARAMS.get(name, ())
        compiled.unary(fn.code, x.astype(np.float64), out, fl, p)
        bits = x[fl == compiled._HARD][:64].view(np.uint32)
        found[name] = bits.size
        if bits.size:
            check_elementary(name, "binary32", bits)
            xs, want = _finite_cases(name, "binary32", bits)
            check_exact_value(name, xs, want)
    assert sum(found.values()) >= 20, found


def test_reference_self_checks():
    """The reference on values known in closed form (so that a wrong reference cannot pass
    unnoticed): exact points, ties at the bottom of binary32, one-rounding constants."""
    assert reference("exp2", -150.0) == (0.0, 0)  # 2**-150: the tie between 0 and 2**-149, to even
    assert reference("exp2", -149.0) == (2.0**-149, 0)
    assert reference("exp2", 128.0) == (INF, OVERFLOW)
    assert reference("log10", 1000.0) == (3.0, 0)
    assert reference("lgamma", 2.0) == (0.0, 0)
    assert reference("cosh", 0.0) == (1.0, 0)
    assert reference("atan", INF)[0] == float(np.float32(math.pi / 2))
    assert reference("sigmoid", 0.0) == (0.5, 0)
    assert reference("gelu", -0.0) == (-0.0, 0) and math.copysign(1, reference("gelu", -0.0)[0]) < 0
    assert math.copysign(1, reference("elu", -0.0, (1.0, 1.0, 1.0))[0]) < 0
    assert math.copysign(1, reference("elu", 0.0, (1.0, 1.0, 1.0))[0]) > 0
    assert reference("erfinv", 0.5)[0] == float(np.float32(0.4769362762044699))
    assert reference("i0", 1.0)[0] == float(np.float32(1.2660658777520082))
    assert reference("gelu_tanh", 1.0)[0] == float(np.float32(0.8411919906082768))
    assert reference("mish", 1.0)[0] == float(np.float32(0.8650983882673103))
    assert reference("logsigmoid", 0.0)[0] == float(np.float32(-math.log(2)))


# -- tests 2 and 3: DeviceMode on float16 ---------------------------------------------------------
_SELU = (float(np.float32(1.6732632423543772848170429916717)), float(np.float32(1.0507009873554804934193349852946)),
         1.0)
#: name: (torch function, elementary name, params, route)
DEVICE_FUNCTIONS = {
    **{n: (getattr(torch, n), n, (), "fused") for n in (
        "sin", "cos", "tan", "sinh", "cosh", "asin", "acos", "atan", "expm1", "log1p", "log2", "log10", "exp2",
        "erfinv")},
    "gelu": (F.gelu, "gelu", (), "fused"),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), "gelu_tanh", (), "fused"),
    "silu": (F.silu, "silu", (), "fused"),
    "mish": (F.mish, "mish", (), "fused"),
    "softplus": (F.softplus, "softplus", (1.0, 20.0), "fused"),
    "logsigmoid": (F.logsigmoid, "logsigmoid", (), "fused"),
    "elu": (F.elu, "elu", (1.0, 1.0, 1.0), "fused"),
    "selu": (F.selu, "elu", _SELU, "fused"),
    **{n: (getattr(torch, n), n, (), "float32") for n in ("erfc", "asinh", "acosh", "atanh", "lgamma", "i0")},
}
PROFILES = ("atlas-a2", "atlas-training")


def device_expected(name: str, bits: np.ndarray, profile: str) -> tuple[np.ndarray, np.ndarray]:
    """float16 bits and register events of f on binary16 operands: RN16(RN32(f(x))), saturated in
    saturation mode; events the binary32 value's flags (a NaN operand none) and OVERFLOW where a
    finite binary32 value rounds beyond binary16 (|v| >= 65520)."""
    _, ename, params, _ = DEVICE_FUNCTIONS[name]
    v32, fl = expected(ename, "binary16", bits, params)
    fl = np.where(np.isnan(np.asarray(bits, np.uint16).view(np.float16)), 0, fl).astype(np.uint8)
    with np.errstate(over="ignore"):
        out = v32.astype(np.float16).view(np.uint16)
    fl |= np.where(np.isfinite(v32) & (np.abs(v32) >= 65520), OVERFLOW, 0).astype(np.uint8)
    if Device(profile).overflow.name == "SATURATION":
        out = np.array([saturated(int(b), BINARY16) for b in out], np.uint16)
    return out, fl


def _register(dev) -> int:
    reg = dev.get_float_status()
    return (OVERFLOW if reg[0] else 0) | (INVALID if reg[1] else 0) | (DIVBYZERO if reg[2] else 0)


def _clear(dev):
    dev.clear_status()
    dev.clear_float_status()


def _run(dev, mode, fn, bits: np.ndarray) -> tuple[np.ndarray, int]:
    """fn on a fresh float16 tensor of these bits: (output bits, register events)."""
    _clear(dev)
    x = torch.from_numpy(np.array(bits, np.uint16).view(np.float16).copy())
    y = fn(x)
    assert y.dtype == torch.float16 and y.shape == x.shape
    return y.numpy().view(np.uint16).copy(), _register(dev)


def _same16(got, want):
    nan_g = np.isnan(got.view(np.float16))
    nan_w = np.isnan(want.view(np.float16))
    return np.where(nan_w, nan_g, got == want)


def check_device(name: str, profile: str, bits: np.ndarray, alone: np.ndarray) -> None:
    """The whole tensor, then the ``alone`` operands one by one: outputs and register events as
    device_expected says."""
    fn, ename, _, route = DEVICE_FUNCTIONS[name]
    keep = ~np.array([is_snan(int(b), "binary16") for b in bits])  # test_device_signaling_nan_operand
    bits, alone = bits[keep], np.intersect1d(alone, bits[keep])
    want, events = device_expected(name, bits, profile)
    dev = Device(profile)
    with DeviceMode(dev) as mode:
        got, reg = _run(dev, mode, fn, bits)
        assert {r for (_, r) in mode.routes} - {"exact"} == {route}, dict(mode.routes)  # exact: the tensor's making
        bad = np.flatnonzero(~_same16(got, want))
        assert not bad.size, "\n".join(
            f"{name} {profile} x=0x{int(bits[i]):04x}: got 0x{int(got[i]):04x}, want 0x{int(want[i]):04x}"
            for i in bad[:20])
        assert reg == int(np.bitwise_or.reduce(events, initial=0)), (name, profile, hex(reg))
        where = {int(b): i for i, b in enumerate(bits)}
        wrong = []
        for b in alone:
            i = where[int(b)]
            g, r = _run(dev, mode, fn, bits[i:i + 1])
            if not _same16(g, got[i:i + 1])[0] or r != events[i]:
                wrong.append(f"{name} {profile} x=0x{int(b):04x} alone: 0x{int(g[0]):04x} register {r:#x}; "
                             f"in the tensor 0x{int(got[i]):04x}, want register {int(events[i]):#x}")
        assert not wrong, "\n".join(wrong[:20]) + f"\n{len(wrong)} in all"


# The float32-route functions without a sim.elementary model (and the fused kernels computed the
# same way: logit, sinc, deg2rad): their binary32 values are torch's
# (a decomposition or the host's kernel), not claimed correctly rounded, so only the register's
# agreement with what reaches the output is checked (IEEE mode shows it: Inf from a finite
# operand is an overflow or a pole, NaN from a non-NaN one an invalid), and saturation mode's
# output and register against IEEE mode's.
OTHER_FLOAT32 = {"special_erfcx": torch.special.erfcx, "special_ndtri": torch.special.ndtri, "digamma": torch.digamma,
                 "special_log_ndtr": torch.special.log_ndtr, "logit": torch.logit, "sinc": torch.sinc,
                 "special_entr": torch.special.entr, "deg2rad": torch.deg2rad, "special_i0e": torch.special.i0e,
                 "special_i1": torch.special.i1, "special_i1e": torch.special.i1e}


def _observed_events(bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The events an IEEE-mode float16 output shows: OVERFLOW or DIVBYZERO (as a set: 0x0C) where a
    finite operand gives +-Inf, INVALID where a non-NaN operand gives NaN."""
    x = np.asarray(bits, np.uint16).view(np.float16)
    y = np.asarray(out, np.uint16).view(np.float16)
    inf = np.isfinite(x) & np.isinf(y)
    nan = ~np.isnan(x) & np.isnan(y)
    return np.where(inf, OVERFLOW | DIVBYZERO, 0) | np.where(nan, INVALID, 0)


def _matches(reg: int, observed: int) -> bool:
    """reg holds INVALID exactly when observed does, and OVERFLOW or DIVBYZERO exactly when observed
    has an infinity."""
    return bool(reg & INVALID) == bool(observed & INVALID) and \
        bool(reg & (OVERFLOW | DIVBYZERO)) == bool(observed & (OVERFLOW | DIVBYZERO))


@pytest.mark.parametrize("name", list(OTHER_FLOAT32))
def test_other_float32_routes_register(name):
    check_other_float32(name, np.union1d(_device_sample("sinh"), np.random.default_rng(13).integers(0, 1 << 16, 600)))


@pytest.mark.exhaustive
@pytest.mark.parametrize("name", list(OTHER_FLOAT32))
def test_other_float32_routes_register_exhaustive(name):
    check_other_float32(name, np.arange(1 << 16))


def check_other_float32(name, bits):
    """The finite binary16 operands among ``bits`` in one tensor (with non-finite ones too: see
    test_other_float32_routes_mixed_tensor),
    and a sample of them (flagged ones among them) alone: the register holds what IEEE mode's
    output shows, saturation mode gives the saturated output and the same register."""
    fn = OTHER_FLOAT32[name]
    bits = np.asarray(bits, np.uint16)
    bits = bits[(bits & 0x7C00) != 0x7C00]  # the finite ones
    outs, regs = {}, {}
    for profile in PROFILES:
        dev = Device(profile)
        with DeviceMode(dev) as mode:
            outs[profile], regs[profile] = _run(dev, mode, fn, bits)
            assert {r for (_, r) in mode.routes} - {"exact"} in ({"float32"}, {"fused"}), dict(mode.routes)
    ieee, sat = outs["atlas-a2"], outs["atlas-training"]
    assert (sat == np.array([saturated(int(b), BINARY16) for b in ieee], np.uint16)).all()
    observed = _observed_events(bits, ieee)
    assert regs["atlas-a2"] == regs["atlas-training"]
    assert _matches(regs["atlas-a2"], int(np.bitwise_or.reduce(observed))), (regs, int(np.bitwise_or.reduce(observed)))
    rng = np.random.default_rng(11)
    flagged = np.flatnonzero(observed)
    picks = np.union1d(rng.choice(bits.size, 24, replace=False),
                       rng.choice(flagged, min(24, flagged.size), replace=False) if flagged.size else [])
    wrong = []
    for profile in PROFILES:
        dev = Device(profile)
        with DeviceMode(dev) as mode:
            for i in picks.astype(int):
                g, r = _run(dev, mode, fn, bits[i:i + 1])
                if not _same16(g, outs[profile][i:i + 1])[0]:
                    wrong.append(f"{name} {profile} 0x{int(bits[i]):04x}: alone 0x{int(g[0]):04x}, in the tensor "
                                 f"0x{int(outs[profile][i]):04x}")
                if not _matches(r, int(observed[i])):
                    wrong.append(f"{name} {profile} 0x{int(bits[i]):04x}: register {r:#x}, output 0x{int(ieee[i]):04x}")
    assert not wrong, "\n".join(wrong[:20])


_MIXED = {"digamma": 0.0, "logit": 2.0, "special_i1": 100.0, "special_ndtri": 2.0, "sinc": math.inf}


@pytest.mark.parametrize("name", list(_MIXED))
def test_other_float32_routes_mixed_tensor(name):
    """An element's pole, overflow or invalid reaches the register whatever the tensor holds beside it
    (a NaN or an infinity): a pointwise route judges element by element."""
    fn, x = OTHER_FLOAT32[name], _MIXED[name]
    dev = Device("atlas-a2")
    with DeviceMode(dev) as mode:
        bits = np.array(np.array([x], np.float16).view(np.uint16))
        y, alone = _run(dev, mode, fn, bits)
        assert _matches(alone, int(_observed_events(bits, y)[0])) and alone != 0  # the element raises alone
        for other in (0x7E00, 0x7C00, 0xFC00):
            _, r = _run(dev, mode, fn, np.array([bits[0], other], np.uint16))
            assert r & alone == alone, (name, hex(other), r, alone)


@pytest.mark.parametrize("profile", PROFILES)
def test_digamma_and_polygamma_poles_are_divisions_by_zero(profile):
    """digamma(+-0) and polygamma(1, 0) are poles (torch gives -inf, inf and inf from a finite
    operand): IEEE 754's division by zero, not an overflow, in the register; digamma of the smallest
    subnormal, about -1.7e7, is a binary16 overflow (its binary32 value is finite)."""
    dev = Device(profile)
    with DeviceMode(dev) as mode:
        for fn in (torch.digamma, lambda x: torch.polygamma(1, x)):
            for bits in (0x0000, 0x8000):
                _, r = _run(dev, mode, fn, np.array([bits], np.uint16))
                assert r & (OVERFLOW | DIVBYZERO) == DIVBYZERO, (bits, r)
        _, r = _run(dev, mode, torch.digamma, np.array([0x0001], np.uint16))
        assert r & (OVERFLOW | DIVBYZERO) == OVERFLOW, r


@functools.cache
def _device_hard() -> tuple[int, ...]:
    """The issue's operands and the binary16-output overflow thresholds of exp2, sinh, cosh, expm1."""
    extra = _neighbours(-3.96484375, "binary16") + _neighbours(-88.75, "binary16") + _neighbours(200, "binary16")
    for fname in ("exp2", "sinh", "cosh", "expm1"):
        extra += _threshold(fname, "binary16", (), lambda v: abs(v) >= 65520)
    return tuple(sorted(set(extra)))


def _device_sample(name: str) -> np.ndarray:
    _, ename, _, _ = DEVICE_FUNCTIONS[name]
    return np.array(sorted(set(sample("binary16", ename).tolist()) | set(_device_hard())), np.uint16)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", list(DEVICE_FUNCTIONS))
def test_device_sample(name, profile):
    bits = _device_sample(name)
    rng = np.random.default_rng(7)
    alone = rng.choice(bits, size=min(32, bits.size), replace=False)
    # 32 of the elements that raise (or should), and the hard places, alone
    _, events = device_expected(name, bits, profile)
    flagged = bits[events != 0]
    alone = np.union1d(alone, rng.choice(flagged, size=min(32, flagged.size), replace=False))
    alone = np.union1d(alone, np.array(_device_hard(), np.uint16))
    check_device(name, profile, bits, alone)


@pytest.mark.exhaustive
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", list(DEVICE_FUNCTIONS))
def test_device_exhaustive(name, profile):
    bits = np.arange(1 << 16, dtype=np.uint16)
    check_device(name, profile, bits, bits)


_LENGTHS = (2, 9, 17, 1000)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", list(DEVICE_FUNCTIONS))
def test_device_length_and_position(name, profile):
    """Each probe alone, then inside tensors of several lengths (a benign filler elsewhere) at the
    first and last positions (and the middle of the longest), filling tensors of 17 and 1000, then
    all probes together shuffled: the same output bits, the same register events."""
    fn = DEVICE_FUNCTIONS[name][0]
    probes = _device_sample(name)
    probes = probes[np.random.default_rng(3).choice(probes.size, size=min(8, probes.size), replace=False)]
    probes = np.union1d(probes, np.array(_neighbours(-3.96484375, "binary16", 1) + _neighbours(-88.75, "binary16", 1)
                                         + [0x7E00, 0x7BFF], np.uint16))
    ename, params = DEVICE_FUNCTIONS[name][1:3]
    filler = next(np.uint16(b) for b in (0x3800, 0x4000)  # 0.5, else 2: a value raising nothing
                  if reference(ename, float(np.array([b], np.uint16).view(np.float16)[0]), params)[1] == 0)
    dev = Device(profile)
    with DeviceMode(dev) as mode:
        _, reg = _run(dev, mode, fn, np.full(1000, filler, np.uint16))
        assert reg == 0
        solo = {int(b): _run(dev, mode, fn, np.array([b], np.uint16)) for b in probes}
        wrong = []
        for b in probes:
            want, want_reg = solo[int(b)]
            for n in _LENGTHS:
                for pos in sorted({0, n - 1} | ({n // 2} if n > 100 else set())):
                    t = np.full(n, filler, np.uint16)
                    t[pos] = b
                    got, r = _run(dev, mode, fn, t)
                    if not _same16(got[pos:pos + 1], want)[0] or r != want_reg:
                        wrong.append(f"{name} {profile} 0x{int(b):04x} at {pos} of {n}: 0x{int(got[pos]):04x} "
                                     f"register {r:#x}, alone 0x{int(want[0]):04x} register {want_reg:#x}")
            for n in (17, 1000):  # the probe everywhere
                got, r = _run(dev, mode, fn, np.full(n, b, np.uint16))
                if not _same16(got, np.repeat(want, n)).all() or r != want_reg:
                    wrong.append(f"{name} {profile} 0x{int(b):04x} x{n}: register {r:#x}, alone {want_reg:#x}")
        order = np.random.default_rng(5).permutation(probes.size)
        got, r = _run(dev, mode, fn, probes[order])
        for k, i in enumerate(order):
            if not _same16(got[k:k + 1], solo[int(probes[i])][0])[0]:
                wrong.append(f"{name} {profile} 0x{int(probes[i]):04x} in the shuffled tensor: 0x{int(got[k]):04x}")
        assert r == int(np.bitwise_or.reduce([solo[int(b)][1] for b in probes], initial=0))
        assert not wrong, "\n".join(wrong[:20]) + f"\n{len(wrong)} in all"


# -- the hand-worked cases ------------------------------------------------------------------
# (function, operand, IEEE result bits (None: NaN), register events), worked by hand.
HAND = [
    (torch.exp2, 200.0, 0x7C00, OVERFLOW),
    (torch.log2, -1.5, None, INVALID),
    (torch.log2, 0.0, 0xFC00, DIVBYZERO),
    (torch.log2, -0.0, 0xFC00, DIVBYZERO),
    (torch.log10, 0.0, 0xFC00, DIVBYZERO),
    (torch.log1p, -1.0, 0xFC00, DIVBYZERO),
    (torch.asin, 2.0, None, INVALID),
    (torch.acos, 2.0, None, INVALID),
    (torch.erfinv, 1.0, 0x7C00, DIVBYZERO),
    (torch.erfinv, -1.0, 0xFC00, DIVBYZERO),
    (torch.sinh, -88.75, 0xFC00, OVERFLOW),
    (torch.exp2, 16.0, 0x7C00, OVERFLOW),  # 65536 >= 65520: the binary16 rounding overflows
    (torch.exp2, 15.984375, int(np.array([2**15.984375]).astype(np.float16).view(np.uint16)[0]), 0),  # < 65520
]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("case", HAND, ids=lambda c: f"{c[0].__name__}({c[1]})")
def test_hand_worked(case, profile):
    fn, x, ieee, events = case
    dev = Device(profile)
    saturation = dev.overflow.name == "SATURATION"
    for n in (1, 2, 7, 8, 9, 16, 17, 1000):
        with DeviceMode(dev):
            _clear(dev)
            y = fn(torch.full((n,), x, dtype=torch.float16)).numpy().view(np.uint16)
            reg = _register(dev)
        assert reg == events, (fn.__name__, x, n, profile, hex(reg))
        if ieee is None:
            assert (y == 0).all() if saturation else np.isnan(y.view(np.float16)).all()
        else:
            want = saturated(ieee, BINARY16) if saturation else ieee
            assert (y == want).all(), (fn.__name__, x, n, profile, [hex(v) for v in set(y.tolist())])


@pytest.mark.parametrize("name", ["sin", "gelu", "erfc"])
def test_device_signaling_nan_operand(name):
    fn = DEVICE_FUNCTIONS[name][0]
    dev = Device("atlas-a2")
    with DeviceMode(dev):
        _clear(dev)
        torch.exp(torch.from_numpy(np.array([0x7C01], np.uint16).view(np.float16)))
        assert _register(dev) == INVALID  # the device route's own behaviour
        for b in (0x7C01, 0xFC01, 0x7D00):
            _, reg = _run(dev, None, fn, np.array([b], np.uint16))
            assert reg == INVALID, (name, hex(b), reg)


@pytest.mark.parametrize("x", [1024.0, 1050.0, 1100.0])
def test_exp2_of_large_integers_overflows(x):
    assert reference("exp2", x) == (INF, OVERFLOW)  # the reference's (2**x > 2**128)
    v, fl = E.evaluate("exp2", np.array([x], np.float16))
    assert v[0] == np.inf and fl[0] == OVERFLOW, (v, fl)
    dev = Device("atlas-training")
    with DeviceMode(dev):
        y = torch.exp2(torch.tensor([x], dtype=torch.float16))
    assert y.item() == 65504.0 and _register(dev) == OVERFLOW


def test_signed_zeros_where_torch_defines_them_are_torchs() -> None:
    """The table's signed zeros against torch itself (elu of either zero is scale times it, whatever
    alpha; gelu of -0 is -0), in every dtype torch computes them in, one element and a vector's
    worth, and the device's elu route gives the same."""
    torch = pytest.importorskip("torch")
    from sim import Device
    from sim.torch import DeviceMode

    for x, alpha in ((-0.0, 1.0), (0.0, 1.0), (-0.0, -0.5)):
        want = math.copysign(1, reference("elu", x, (alpha, 1.0, 1.0))[0])
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            for n in (1, 64):
                got = torch.nn.functional.elu(torch.full((n,), x, dtype=dtype), alpha=alpha)
                assert bool((torch.signbit(got) == (want < 0)).all()), (x, alpha, dtype, n)
        with DeviceMode(Device("atlas-a2")):
            dev = torch.nn.functional.elu(torch.full((3,), x, dtype=torch.float16), alpha=alpha)
        assert bool((torch.signbit(dev) == (want < 0)).all()), (x, alpha)
    assert bool(torch.signbit(torch.nn.functional.gelu(torch.tensor([-0.0])))) == (
        math.copysign(1, reference("gelu", -0.0)[0]) < 0)
