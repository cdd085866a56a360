"""NVFP4: E2M1 elements, an E4M3 scale per 16 values along an axis, and a binary32 scale per tensor
(NVIDIA's format; Transformer Engine 2.x ``NVFP4BlockScaling``, arXiv 2509.25149, "Pretraining
Large Language Models with NVFP4").

A value is ``e2m1 * e4m3_block_scale * tensor_scale``. The per-tensor (decode) scale is
amax(tensor) / (448 * 6), so that the largest block's scale can reach E4M3's 448; a block's scale is
E4M3(clamp(amax(block) / 6 / tensor_scale, 2**-6, 448)), and an element is
E2M1(clamp(x * ((1 / tensor_scale) / block_scale), -6, 6)) (a tensor of zeros takes the tensor
scale 1). Each step is binary32 arithmetic in
this order, as torchao's emulation computes it (``torchao.prototype.mx_formats.nvfp4_tensor``,
``nvfp4_quantize`` and ``per_tensor_amax_to_scale``, 0.18; its comment says the order matches the
MSLK Triton kernel), with which the tests hold the blocks bit for bit. The casts round to nearest
even, or stochastically (``rounding="stochastic"``: the recipe's rounding of gradients). ``tile=16``
takes one scale per 16 x 16 tile of a 2-D array (the recipe's weights), the other axis the rows.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .blocks import amax as block_amax
from .blocks import float_input, join, split
from .formats import FLOAT4_E2M1FN, FLOAT8_E4M3FN, decode
from .fpu import Fpu
from .rounding import OverflowMode, Rounding

__all__ = ["NVFP4", "quantize", "dequantize", "BLOCK", "tensor_scale", "tensor_scale_of"]

BLOCK = 16
_F32 = np.float32
_E2M1_MAX, _E4M3_MAX, _E4M3_SMALLEST = _F32(6), _F32(448), _F32(2.0**-6)


class NVFP4(NamedTuple):
    """An NVFP4 array: E2M1 element codes (uint8, the input's shape; ``sim.formats.pack_nibbles``
    packs them), the blocks' E4M3 scale codes (uint8, the quantised axis last, its blocks in order;
    a 16 x 16 tile's scale repeated for its 16 rows), the binary32 tensor scale (1 for single-level
    scaling), the axis, and how many elements the clamp to +-6 kept from overflowing E2M1 (scaled to
    7 or more: a block scale rounded down, or a calibrated tensor scale too small; not the last
    bit the reciprocal's rounding may add to a block's largest element)."""

    elements: np.ndarray
    scales: np.ndarray
    tensor_scale: np.float32
    axis: int
    clamped: int = 0
    clamped_blocks: int = 0  #: blocks holding such an element


def tensor_scale(amax: float) -> np.float32:
    """The per-tensor decode scale of a tensor whose largest magnitude is ``amax``: amax / (448 * 6)
    in binary32."""
    return _F32(amax) / _F32(448.0 * 6.0)


def tensor_scale_of(x) -> np.float32:
    """The tensor scale two-level quantisation takes for x: :func:`tensor_scale` of its amax (NaN
    passed over), 1 where that is not positive (a tensor of zeros, of NaN, or empty)."""
    x = np.asarray(x)
    with np.errstate(invalid="ignore"):
        s = tensor_scale(np.nanmax(np.abs(x.astype(_F32)))) if x.size and not np.isnan(x).all() else _F32(0)
    return s if s > 0 else _F32(1)


def quantize(x, *, axis: int = -1, two_level: bool | float = True, tile: int = 1,
             rounding: Rounding | str | None = None, fpu: Fpu | None = None) -> NVFP4:
    """NVFP4 quantisation of a binary32 (or binary16, bfloat16: widened exactly) array along
    ``axis``. ``two_level``: True takes the tensor scale from the array's amax, a number is a
    calibrated tensor scale, False scales by blocks only. ``tile``: 1 (1 x 16 blocks) or 16 (16 x 16
    tiles of a 2-D array). ``rounding``/``fpu`` as :func:`sim.mx.quantize` has them."""
    x, tile = float_input(x, "NVFP4", BLOCK, tile)
    axis = int(axis) % x.ndim
    blocks, pad = split(x.astype(_F32), axis, BLOCK)
    amax = block_amax(blocks, tile)
    with np.errstate(invalid="ignore"):
        if two_level is True:
            s = tensor_scale_of(x)
        else:
            s = _F32(1) if two_level is False else _F32(two_level)
        block = amax / _E2M1_MAX
        scaled = block if two_level is False else block / s
    unit = fpu or Fpu(OverflowMode.SATURATION)
    scale_codes = unit.convert(np.clip(scaled, _E4M3_SMALLEST, _E4M3_MAX), FLOAT8_E4M3FN,
                              rounding=Rounding.NEAREST_EVEN)
    scale = decode(scale_codes, FLOAT8_E4M3FN).astype(_F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        reciprocal = _F32(1) / scale if two_level is False else (_F32(1) / s) / scale
        y = blocks * reciprocal[..., None]
    over = np.abs(y) >= 7  # E2M1 would overflow: 7 rounds to 8
    codes = unit.convert(np.clip(y, -_E2M1_MAX, _E2M1_MAX), FLOAT4_E2M1FN, rounding=rounding)
    elements = join(codes.view(np.uint8), pad, axis)
    return NVFP4(elements, scale_codes.view(np.uint8), s, axis, int(np.count_nonzero(over)),
                 int(np.count_nonzero(over.any(axis=-1))))


def dequantize(q: NVFP4) -> np.ndarray:
    """The binary32 values an NVFP4 array stands for: (e2m1 * e4m3 scale) * tensor scale (the
    first product exact, the second rounded once)."""
    blocks, pad = split(q.elements, q.axis, BLOCK)
    e2m1 = decode(blocks, FLOAT4_E2M1FN).astype(_F32)
    scale = decode(q.scales, FLOAT8_E4M3FN).astype(_F32)
    with np.errstate(invalid="ignore"):  # an Inf tensor scale (an Inf in the input): zeros become NaN
        return join((e2m1 * scale[..., None]) * q.tensor_scale, pad, q.axis)
