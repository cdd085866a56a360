"""What every block-scaled format shares: an array split into blocks along an axis (zero-padded),
the blocks' amax (over square tiles of a 2-D array where a recipe asks), and the elements put back
in the array's shape. MX, NVFP4, HiF4 and block-scaled FP8 are built on it."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .checks import integer

__all__ = ["split", "join", "amax", "float_input", "check_tile"]

_INPUTS = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def split(x: np.ndarray, axis: int, block: int) -> tuple[np.ndarray, int]:
    """x with ``axis`` last and split into (..., blocks, block), zero-padded; and the padding."""
    moved = np.moveaxis(x, axis, -1)
    pad = -moved.shape[-1] % block
    if pad:
        moved = np.concatenate([moved, np.zeros(moved.shape[:-1] + (pad,), moved.dtype)], axis=-1)
    return moved.reshape(*moved.shape[:-1], -1, block), pad


def join(blocks: np.ndarray, pad: int, axis: int) -> np.ndarray:
    """The inverse of :func:`split`: blocks back along ``axis``, the padding cut."""
    flat = blocks.reshape(*blocks.shape[:-2], -1)
    if pad:
        flat = flat[..., :-pad]
    return np.moveaxis(flat, -1, axis)


def amax(blocks: np.ndarray, tile: int = 1) -> np.ndarray:
    """Each block's largest magnitude (NaN where it holds one); ``tile`` > 1: the largest of each
    ``tile`` rows of blocks (a 2-D array's square tiles, the rows the other axis)."""
    with np.errstate(invalid="ignore"):
        out = np.abs(blocks).max(axis=-1)
        if tile > 1:
            rows = out.shape[0]
            tiles, _ = split(out, 0, tile)  # (blocks, row tiles, tile)
            out = np.repeat(tiles.max(axis=-1), tile, axis=-1)[..., :rows].T
    return out


def float_input(x, what: str, block: int, tile: int) -> tuple[np.ndarray, int]:
    """x as an array of binary32, binary16 or bfloat16 values with at least one axis, and a checked
    ``tile`` (1, or ``block`` for square tiles of a 2-D array)."""
    x = np.asarray(x)
    if x.ndim == 0:
        raise ValueError("quantize takes an array with at least one axis")
    if x.dtype not in _INPUTS:
        raise TypeError(f"{what} quantize takes binary32, binary16 or bfloat16 arrays, got {x.dtype}")
    return x, check_tile(tile, block, x.ndim)


def check_tile(tile: int, block: int, ndim: int) -> int:
    """``tile``: 1 (blocks along the axis) or ``block`` (square tiles, of a 2-D array only)."""
    if integer("tile", tile, 1) not in (1, block) or (tile == block and ndim != 2):
        raise ValueError(f"tile must be 1 (1 x {block} blocks) or {block} ({block} x {block} tiles of a 2-D array), "
                         f"got {tile} for a {ndim}-D array")
    return int(tile)
