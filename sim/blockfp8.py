"""Block-scaled FP8 as DeepSeek-V3 trains and Transformer Engine's ``Float8BlockScaling`` recipe
computes it: a binary32 scale per 1 x 128 block (activations, gradients) or per 128 x 128 tile
(weights), E4M3 (or E5M2) elements.

A block's (encode) scale is TE's ``compute_scale_from_amax`` (``transformer_engine/common/recipe/
recipe_common.cuh``): amax is raised to ``eps`` at least; an amax that is 0, Inf or NaN takes the
scale 1; else scale = fp8_max / amax rounded to binary32, an infinite quotient replaced by the
input type's largest value (binary32's), and with ``pow2`` (the recipe's default) the scale's
fraction bits dropped, so a power of two at most fp8_max / amax. An element is the format's
saturating cast of x * scale (binary32 product, rounded to nearest even); the block stores
1 / scale, which dequantisation multiplies by.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .blocks import amax as block_amax
from .blocks import float_input, join, split
from .formats import FLOAT8_E4M3FN, FLOAT8_E5M2, Format, decode, format_of
from .fpu import Fpu
from .rounding import Flag, OverflowMode, Rounding

__all__ = ["BlockFP8", "quantize", "dequantize", "scales"]

_F32 = np.float32
_F32_MAX = np.finfo(np.float32).max


class BlockFP8(NamedTuple):
    """A block-scaled FP8 array: element codes (the format's dtype, the input's shape), each block's
    binary32 decode scale (1 / scale; the quantised axis last, a tile's repeated for its rows), the
    format, the axis and the block's rows (1 or 128)."""

    elements: np.ndarray
    scale_inv: np.ndarray
    format: Format
    axis: int
    tile: int
    saturated: int = 0  #: elements clamped to MAX (an Inf, or a cast that overflowed)
    saturated_blocks: int = 0  #: blocks holding such an element


def scales(amax, fp8_max: float, *, pow2: bool = True, eps: float = 0.0) -> np.ndarray:
    """TE's encode scales of blocks with these amax values (binary32)."""
    amax = np.maximum(np.asarray(amax, _F32), _F32(eps))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        scale = _F32(fp8_max) / amax
    scale = np.where(np.isinf(scale), _F32_MAX, scale)
    scale = np.where(np.isfinite(amax) & (amax != 0), scale, _F32(1)).astype(_F32)
    if pow2:
        scale = (scale.view(np.uint32) & np.uint32(0xFF800000)).view(_F32)
    return scale


def quantize(x, fmt: Format | str = FLOAT8_E4M3FN, *, axis: int = -1, tile: int = 1, pow2: bool = True,
             eps: float = 0.0, rounding: Rounding | str | None = None, fpu: Fpu | None = None) -> BlockFP8:
    """Block-scaled FP8 of a binary32 (or binary16, bfloat16) array: blocks of 128 along ``axis``,
    ``tile=128`` for 128 x 128 tiles of a 2-D array (the other axis the rows)."""
    fmt = format_of(fmt)
    if fmt not in (FLOAT8_E4M3FN, FLOAT8_E5M2):
        raise ValueError(f"block-scaled FP8 elements are float8_e4m3fn or float8_e5m2, not {fmt.name}")
    x, tile = float_input(x, "block FP8", 128, tile)
    axis = int(axis) % x.ndim
    blocks, pad = split(x.astype(_F32), axis, 128)
    amax = block_amax(blocks, tile)
    scale = scales(amax, fmt.max, pow2=pow2, eps=eps)
    with np.errstate(over="ignore", invalid="ignore"):
        y = blocks * scale[..., None]
    unit = fpu or Fpu(OverflowMode.SATURATION)
    codes, flags = unit.convert(y, fmt, rounding=rounding, overflow="satfinite", return_flags=True)
    over = ((flags & Flag.OVERFLOW) != 0) | np.isinf(y)  # satfinite clamps an Inf without a flag
    return BlockFP8(join(codes, pad, axis), (_F32(1) / scale).astype(_F32), fmt, axis, tile,
                    int(np.count_nonzero(over)), int(np.count_nonzero(over.any(axis=-1))))


def dequantize(q: BlockFP8) -> np.ndarray:
    """The binary32 values: element * (1 / scale), rounded once."""
    blocks, pad = split(q.elements.view(np.uint8), q.axis, 128)
    return join(decode(blocks, q.format).astype(_F32) * q.scale_inv[..., None], pad, q.axis)
