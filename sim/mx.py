"""OCP Microscaling (MX) block quantisation: blocks of 32 values along an axis share one E8M0
scale, a power of two; the elements are E4M3FN, E5M2, E3M2, E2M3 or E2M1 (MXFP8, MXFP6, MXFP4), or
Ascend's E1M2 (``aclnnDynamicMxQuant`` takes it, with emax 0).

The shared exponent X = 2**x follows one of four rules (``rule=``), for a block's largest
magnitude amax and the element format's largest binade emax (8 for E4M3FN, 15 for E5M2, 4 for
E3M2, 2 for E2M3 and E2M1, 0 for E1M2):

- ``"floor"``: x = floor(log2 amax) - emax, the OCP Microscaling Formats (MX) v1.0
  specification, section 6.3; elements that then exceed the element format's MAX are clamped to
  it (the OCP cast is saturating);
- ``"rceil"``: x = ceil(log2(amax / MAX)), the smallest power of two that fits amax without
  clamping: cuBLAS's block scaling and Transformer Engine's (``cvt.rp.satfinite.ue8m0``);
- ``"ceil"``: x = ceil(log2 amax) - emax, torchao's ``ScaleCalculationMode.CEIL``;
- ``"even"``: x = floor(log2 amax') - emax with amax rounded half up to the element's fraction
  bits first, torchao's ``ScaleCalculationMode.EVEN``.

CANN's ``aclnnDynamicMxQuant`` (hicann/ops-nn ``quant/quant_common/op_kernel/mx_quant_common.h``,
its tiling's ``dstTypeMax`` choice) is five more rules, for float16 and bfloat16 inputs only:

- ``"cann0"``, ``scaleAlg`` 0: the floor rule on amax rounded toward zero to bfloat16 (the same
  exponent), but a block whose amax has a bfloat16 exponent field at most emax (amax below
  2**(emax - 126)) gets scale code 0 and all its elements 0 (OCP would keep them);
- ``"cann1"``, ``scaleAlg`` 1 (E4M3, E5M2): the exponent of the binary32 amax * (1/MAX), up one
  where its fraction is not zero: ``"rceil"`` for every float16 and bfloat16 amax (tested);
- ``"cann2"``, ``"cann2-7"``, ``"cann2-1.875"``, ``scaleAlg`` 2 with ``dstTypeMax`` 0 or 6 (E2M1),
  7 (E2M1) or 1.875 (E1M2): amax rounded to nearest bfloat16, 0x3F, 0x1F or 0x0F added to its
  bits and the exponent field taken (so the scale rounds up from a significand of 1.5078, 1.7578
  or 1.8828), less emax; below emax's binade the scale code is 0. Its elements are scaled by
  2**(127 - the unclamped field), which for an E1M2 block of subnormal amax is not the scale's
  inverse: as the kernel does. (scaleAlg 2 on E1M2 with another dstTypeMax, 0 or within
  [1.75, 3.5], takes the kernel's binary32 path: not modelled.)

The other rules are computed exactly (from the binary64 amax). A block whose amax is 0 takes the
smallest scale, 2**-127; a block holding an Inf or NaN takes the scale NaN (0xFF), as the
specification prescribes for a NaN scale. torchao's emulation (0.18, ``to_mx``) differs in
three places: its RCEIL takes ceil(log2) of the binary32 quotient amax / MAX through a binary32
log2, which gives 2**k for an amax just above MAX * 2**k where |k| >= 2 (the exact rule, and the
hardware's, give 2**(k+1)); it divides the elements of a block whose scale is 2**-127 by
2**-126; and it gives a block holding an infinity (no NaN) a finite scale.
"""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

from .blocks import amax as block_amax
from .blocks import check_tile, join, split
from .checks import integer
from .formats import (
    FLOAT4_E1M2FN,
    FLOAT4_E2M1FN,
    FLOAT6_E2M3FN,
    FLOAT6_E3M2FN,
    FLOAT8_E4M3FN,
    FLOAT8_E5M2,
    FLOAT8_E8M0FNU,
    Format,
    decode,
    format_of,
)
from .fpu import Fpu
from .rounding import Flag, OverflowMode, Rounding

__all__ = ["MX", "ELEMENTS", "RULES", "CANN_RULES", "quantize", "dequantize", "shared_exponents"]

ELEMENTS = (FLOAT8_E4M3FN, FLOAT8_E5M2, FLOAT6_E3M2FN, FLOAT6_E2M3FN, FLOAT4_E2M1FN, FLOAT4_E1M2FN)
#: CANN's rules: scaleAlg, the value scaleAlg 2 adds to amax's bfloat16 bits, the formats served.
CANN_RULES = {"cann0": (0, 0, (FLOAT8_E4M3FN, FLOAT8_E5M2, FLOAT4_E2M1FN, FLOAT4_E1M2FN)),
              "cann1": (1, 0, (FLOAT8_E4M3FN, FLOAT8_E5M2)), "cann2": (2, 0x3F, (FLOAT4_E2M1FN,)),
              "cann2-7": (2, 0x1F, (FLOAT4_E2M1FN,)), "cann2-1.875": (2, 0x0F, (FLOAT4_E1M2FN,))}
RULES = ("floor", "rceil", "ceil", "even", *CANN_RULES)


class MX(NamedTuple):
    """An MX-quantised array: element codes (the element format's dtype), one E8M0 scale per
    block (uint8 codes, blocks along ``axis``), how it was made, and how many elements were
    clamped to the element format's MAX (their cast overflowed: the floor rule allows it)."""

    elements: np.ndarray
    scales: np.ndarray
    format: Format
    axis: int
    block: int
    saturated: int = 0
    saturated_blocks: int = 0  #: blocks holding such an element


def shared_exponents(amax: np.ndarray, fmt: Format, rule: str = "floor", source=None) -> np.ndarray:
    """The E8M0 codes of the blocks' shared scales, from their binary64 amax values (``source``:
    the input's dtype, float16 or bfloat16, for CANN's rules)."""
    return _scales(amax, fmt, rule, source)[0]


def _scales(amax: np.ndarray, fmt: Format, rule: str, source) -> tuple[np.ndarray, np.ndarray]:
    """The blocks' E8M0 scale codes, and what their elements are multiplied by (1 / scale but
    where a CANN kernel does otherwise)."""
    if rule not in RULES:
        raise ValueError(f"unknown MX scale rule {rule!r}; valid: {', '.join(RULES)}")
    amax = np.asarray(amax, np.float64)
    if rule in CANN_RULES and rule != "cann1":
        return _cann(amax, fmt, rule, source)
    if rule == "cann1":
        _cann_check(fmt, rule, source)
        rule = "rceil"
    with np.errstate(divide="ignore", invalid="ignore"):
        m, e = np.frexp(amax if rule != "rceil" else amax / fmt.max)  # m * 2**e, 0.5 <= m < 1
        e = e.astype(np.int64)
        if rule == "floor":  # floor(log2 amax) = e - 1
            x = e - 1 - fmt.emax
        elif rule == "rceil":  # ceil(log2 r) = e - 1 for a power of two, else e (the quotient: exact enough)
            x = e - (m == 0.5)
        elif rule == "ceil":
            x = e - (m == 0.5) - fmt.emax
        else:  # even: the significand 2m rounded half up to man_bits fraction bits reaches 2
            x = e - 1 + (2 * m >= 2 - 2.0 ** -(fmt.man_bits + 1)) - fmt.emax
    codes = np.clip(x + 127, 0, 254).astype(np.uint8)
    codes[amax == 0] = 0
    codes[~np.isfinite(amax)] = 0xFF
    return codes, 1 / decode(codes, FLOAT8_E8M0FNU)


def _cann_check(fmt: Format, rule: str, source) -> None:
    served = CANN_RULES[rule][2]
    if fmt not in served:
        raise ValueError(f"CANN's {rule} serves {', '.join(f.name for f in served)}, not {fmt.name}")
    if source is None or np.dtype(source) not in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        raise ValueError(f"CANN's {rule} takes float16 or bfloat16 inputs, not {source}")


def _cann(amax: np.ndarray, fmt: Format, rule: str, source) -> tuple[np.ndarray, np.ndarray]:
    """CANN's scaleAlg 0 and 2 on the bfloat16 bits of amax (see the module's docstring)."""
    _cann_check(fmt, rule, source)
    alg, add, _ = CANN_RULES[rule]
    wide = np.nan_to_num(amax, nan=np.inf).astype(np.float32)  # exact: a float16 or bfloat16
    if alg == 0:  # float16 to bfloat16 toward zero: the bits above the 16th
        bits = (wide.view(np.uint32) >> 16).astype(np.int64)
    else:  # to nearest even: ml_dtypes' conversion
        bits = wide.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.int64)
    field = bits >> 7
    if alg == 0:
        shared = field - fmt.emax
        zero = field <= fmt.emax
        codes = np.where(zero, 0, shared)
    else:
        shared = np.where(field < fmt.emax, fmt.emax, (bits + add) >> 7) - fmt.emax
        zero, codes = False, np.where(field == 0, 0, shared)
    # The multiplier: bfloat16 bits 0x7F00 - shared << 7 on 16 bits (2**(127 - shared); 2**-127 at
    # 254; -Inf at 255, an E1M2 amax that carries past bfloat16's largest binade), NaN for Inf/NaN
    reciprocal = np.where(shared == 254, 0x0040, (0x7F00 - (shared << 7)) & 0xFFFF).astype(np.uint16)
    inverse = np.where(zero, 0.0, reciprocal.view(ml_dtypes.bfloat16).astype(np.float64))
    inf = field == 0xFF
    return np.where(inf, 0xFF, codes).astype(np.uint8), np.where(inf, np.nan, inverse)


def quantize(x, fmt: Format | str = FLOAT8_E4M3FN, *, axis: int = -1, block: int = 32, rule: str = "floor",
             rounding: Rounding | str | None = None, fpu: Fpu | None = None, tile: int = 1) -> MX:
    """MX quantisation of a binary16, bfloat16 or binary32 array along ``axis``.

    Each element is x / X (exact: X is a power of two) cast once into ``fmt`` with the
    saturating OCP cast, in ``rounding`` (default: ``fpu``'s, else to nearest even); ``fpu``
    (a device's unit, for example) keeps the cast's flags in its status and, for stochastic
    rounding, draws the random bits from its seed. A last block shorter than ``block`` is
    padded with zeros. ``tile=block`` shares one scale over each ``block`` x ``block`` tile of a
    2-D array (CANN's ``aclnnDynamicBlockMxQuant``: 32 x 32), repeated in ``scales`` for each of
    the tile's rows.
    """
    fmt = format_of(fmt)
    if fmt not in ELEMENTS:
        raise ValueError(f"MX elements are {', '.join(f.name for f in ELEMENTS)}, not {fmt.name}")
    block = integer("block", block, 1)
    x = np.asarray(x)
    if x.ndim == 0:
        raise ValueError("quantize takes an array with at least one axis")
    axis, tile = int(axis) % x.ndim, check_tile(tile, block, x.ndim)
    blocks, pad = split(x.astype(np.float64), axis, block)
    scales, inverse = _scales(block_amax(blocks, tile), fmt, rule, x.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = blocks * inverse[..., None]
    unit = fpu or Fpu(OverflowMode.SATURATION)
    elements, flags = unit.convert(scaled, fmt, rounding=rounding, overflow="satfinite", return_flags=True)
    over = (flags & Flag.OVERFLOW) != 0
    return MX(join(elements, pad, axis), np.moveaxis(scales, -1, axis), fmt, axis, block, int(np.count_nonzero(over)),
              int(np.count_nonzero(over.any(axis=-1))))


def dequantize(q: MX) -> np.ndarray:
    """The binary64 values an MX array stands for (exact: elements times powers of two)."""
    values = decode(q.elements, q.format) if q.elements.dtype == np.uint8 else q.elements.astype(np.float64)
    blocks, pad = split(values, q.axis, q.block)
    scales = decode(np.moveaxis(q.scales, q.axis, -1), FLOAT8_E8M0FNU)
    return join(blocks * scales[..., None], pad, q.axis)
