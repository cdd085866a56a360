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

Every rule is computed exactly (from the binary64 amax). A block whose amax is 0 takes the
smallest scale, 2**-127; a block holding an Inf or NaN takes the scale NaN (0xFF), as the
specification prescribes for a NaN scale. torchao's emulation (0.18, ``to_mx``) differs in
three places: its RCEIL takes ceil(log2) of the binary32 quotient amax / MAX through a binary32
log2, which gives 2**k for an amax just above MAX * 2**k where |k| >= 2 (the exact rule, and the
hardware's, give 2**(k+1)); it divides the elements of a block whose scale is 2**-127 by
2**-126; and it gives a block holding an infinity (no NaN) a finite scale.
"""

from __future__ import annotations

from typing import NamedTuple

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

__all__ = ["MX", "ELEMENTS", "RULES", "quantize", "dequantize", "shared_exponents"]

ELEMENTS = (FLOAT8_E4M3FN, FLOAT8_E5M2, FLOAT6_E3M2FN, FLOAT6_E2M3FN, FLOAT4_E2M1FN, FLOAT4_E1M2FN)
RULES = ("floor", "rceil", "ceil", "even")


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


def shared_exponents(amax: np.ndarray, fmt: Format, rule: str = "floor") -> np.ndarray:
    """The E8M0 codes of the blocks' shared scales, from their binary64 amax values."""
    if rule not in RULES:
        raise ValueError(f"unknown MX scale rule {rule!r}; valid: {', '.join(RULES)}")
    amax = np.asarray(amax, np.float64)
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
    return codes


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
    scales = shared_exponents(block_amax(blocks, tile), fmt, rule)
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = blocks / decode(scales, FLOAT8_E8M0FNU)[..., None]
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
