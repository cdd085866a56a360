"""HiF4, HiFloat4's block format (arXiv 2602.11287, "HiFloat4 Format for Language Model Inference"):
64 values along an axis share 32 bits of metadata, a three-level scale, and each keeps a 4-bit
HiFloat4 element.

- level 1: one E6M2 scale per 64 values (8 bits: 6 exponent bits of bias 48, 2 fraction bits, no
  zero, no subnormals, code 0xFF NaN), so scales from 2**-48 to 1.5 * 2**15;
- level 2: a one-bit micro-exponent per 8 values (8 bits), a factor 1 or 2;
- level 3: a one-bit micro-exponent per 4 values (16 bits), a factor 1 or 2;
- elements: a sign and a magnitude m/4, m = 0..7 (HiFloat4's element codes, ``sim.formats.HIFLOAT4``).

A value is ``sign * (m/4) * level2 * level3 * scale``. :func:`quantize` computes the block exactly
as the published reference quantiser does (``quant_hifx`` of the ``global-computing-consortium/
HiFloat4`` repository, ``hif4_gpu/quant_cy/base/QFuncs/hifx.py``), operation for operation in
binary32 (bfloat16 where it converts): the scale is bf16(amax64 * bf16(1/7)), clipped to
[2**-48, 49152] and rounded half to even to E6M2; its reciprocal is rounded to bfloat16; a group's
micro-exponent is 2 where its amax times that reciprocal (over level 2's, for level 3) reaches 4
(level 2) or 2 (level 3); the element is floor(|x| / l2 / l3 * reciprocal * 4 + 0.5) / 4, capped at
1.75. A block holding a NaN or an infinity has scale code 0xFF and every value NaN, as CANN's HiF4
cast writes it (the reference quantiser leaves such blocks undefined). An axis whose length is not
a multiple of 64 is padded with zeros (the reference requires a multiple).
"""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

from .blocks import float_input, join, split
from .formats import Format

__all__ = ["HiF4", "quantize", "dequantize", "E6M2", "BLOCK"]

#: Values per block, and the shape the reference views a block as: level-2 groups of 8, each two
#: level-3 groups of 4.
BLOCK = 64
_SHAPE = (8, 2, 4)
#: The level-1 scale's format (as a Format: its values and limits follow from its fields).
E6M2 = Format("e6m2", 6, 2, np.dtype(np.uint8), exponent_bias=48, has_infs=False, nans="all_ones",
              has_subnormals=False, signed=False, has_zero=False)
_F32 = np.float32
_ONE_SEVENTH = _F32(np.float32(1.0) / np.float32(7.0)).astype(ml_dtypes.bfloat16).astype(_F32)


class HiF4(NamedTuple):
    """A HiF4-quantised array: HiFloat4 element codes (uint8, the input's shape) and the blocks'
    metadata, the quantised axis last, its blocks in order (the other axes as the input has them):
    ``scales`` (..., blocks) E6M2 codes, ``level2`` (..., blocks, 8) and ``level3`` (..., blocks, 16)
    bits (uint8 0 or 1: a factor 1 or 2), the groups in order along the block."""

    elements: np.ndarray
    scales: np.ndarray
    level2: np.ndarray
    level3: np.ndarray
    axis: int


def _bf16(a: np.ndarray) -> np.ndarray:
    """binary32 values rounded to bfloat16 (to nearest even) and back."""
    return a.astype(ml_dtypes.bfloat16).astype(_F32)


def _e6m2(scale: np.ndarray) -> np.ndarray:
    """Positive binary32 values rounded half to even to E6M2's three significant bits (exact: the
    scaled value lies in [4, 8))."""
    _, e = np.frexp(scale)
    step = np.ldexp(np.ones_like(scale), e - 3)  # 2**(floor(log2 s) - 2)
    return (np.round(scale / step) * step).astype(_F32)


def quantize(x, *, axis: int = -1) -> HiF4:
    """HiF4 quantisation of a binary32 (or binary16, bfloat16: widened exactly) array along ``axis``,
    bit for bit as the reference quantiser computes it (see the module's docstring)."""
    x, _ = float_input(x, "HiF4", BLOCK, 1)
    axis = int(axis) % x.ndim
    flat, pad = split(x.astype(_F32), axis, BLOCK)
    g = flat.reshape(*flat.shape[:-1], *_SHAPE)
    a = np.abs(g)
    bad = ~np.isfinite(a).all(axis=(-3, -2, -1))
    a = np.where(bad[..., None, None, None], _F32(0), a)
    max3 = a.max(axis=-1)
    max2 = max3.max(axis=-1)
    max1 = max2.max(axis=-1)
    scale = np.clip(_bf16(max1 * _ONE_SEVENTH), _F32(2.0**-48), _F32(49152))
    scale = _e6m2(scale)
    reciprocal = _bf16(_F32(1) / scale)
    l2 = np.where(max2 * reciprocal[..., None] >= 4, _F32(2), _F32(1))
    l3 = np.where(max3 * reciprocal[..., None, None] / l2[..., None] >= 2, _F32(2), _F32(1))
    mant = a / l2[..., None, None] / l3[..., None] * reciprocal[..., None, None, None]
    m = np.minimum(np.floor(mant * _F32(4) + _F32(0.5)), _F32(7)).astype(np.uint8)
    codes = m | (np.signbit(g) & (g != 0)).astype(np.uint8) << 3
    # the scales lie on E6M2's grid: each one's code is its place among the format's finite values
    scales = np.where(bad, np.uint8(0xFF), np.searchsorted(E6M2.values[:0xFF], scale).astype(np.uint8))
    return HiF4(join(codes.reshape(flat.shape), pad, axis), scales, (l2 == 2).astype(np.uint8),
                (l3 == 2).astype(np.uint8).reshape(*l3.shape[:-2], 16), axis)


def dequantize(q: HiF4) -> np.ndarray:
    """The binary32 values a HiF4 array stands for, computed as the reference does:
    ((sign * m/4) * level2 * level3) * scale, each product rounded in binary32; NaN in a block whose
    scale is NaN."""
    blocks, pad = split(q.elements, q.axis, BLOCK)
    g = blocks.reshape(*blocks.shape[:-1], *_SHAPE)
    magnitude = (g & 7).astype(_F32) / _F32(4)
    signed = np.where(g & 8, -magnitude, magnitude)
    l2 = np.where(q.level2 == 1, _F32(2), _F32(1))
    l3 = np.where(q.level3 == 1, _F32(2), _F32(1)).reshape(*q.level3.shape[:-1], 8, 2)
    scale = E6M2.values[q.scales].astype(_F32)  # 0xFF: NaN
    with np.errstate(invalid="ignore"):
        values = signed * l2[..., None, None] * l3[..., None] * scale[..., None, None, None]
    return join(values.reshape(blocks.shape), pad, q.axis)

