"""A model's matmul operands as a recipe puts them into a narrow format: which GEMM of a layer a
matmul is, each operand's role in it, and the figures ``fp8.csv`` and ``shadow.csv`` give of one
quantised operand.

A layer's forward GEMM ``y = x @ w`` ("fprop": x the activation, w the weight) has two backward
GEMMs: the input gradient ``dx = dy @ w.T`` ("dgrad": dy the gradient) and the weight gradient
``dw = x.T @ dy`` ("wgrad"; torch computes it as ``(dy.T @ x).T`` where w is stored transposed).
Transformer Engine's recipes treat the three apart (NVFP4: 16 x 16 weight tiles, stochastic
rounding of gradients, the Hadamard transform on wgrad only), and a matmul hook sees only
operands. So a backward matmul is matched to its layer's forward by content: the one whose operand
is that forward's weight, transposed, is dgrad; the one whose operand is that forward's activation
(transposed, or as it was) is wgrad; a backward matmul that matches neither (an operand recomputed,
or a label whose forward ran elsewhere) is "backward", both operands gradients. An attention
product ``q @ k.T`` has no weight: k takes the weight's part.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np

from sim.formats import Format

from .harm import _relative_error

__all__ = ["GEMMS", "ROLES", "Roles", "Operand", "figures"]  # amax_of: lossscale.training.fp8's

#: A layer's three GEMMs, as Transformer Engine names them.
GEMMS = ("fprop", "dgrad", "wgrad")
#: An operand's part in its GEMM.
ROLES = ("activation", "weight", "gradient")


def _swapped(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2) if x.ndim >= 2 else x


def _print(x: np.ndarray) -> tuple:
    """An array's fingerprint: shape, dtype and a digest of its bytes."""
    x = np.ascontiguousarray(x)
    return x.shape, x.dtype.str, hashlib.blake2b(x.view(np.uint8).reshape(-1), digest_size=16).digest()


class Roles:
    """Each matmul's GEMM and its operands' roles, from the forward matmuls of the step so far
    (the module says how)."""

    def __init__(self) -> None:
        self._forward: dict[str, list[tuple[tuple, tuple, tuple]]] = {}

    def clear(self) -> None:
        """Forget the forward matmuls (a new step)."""
        self._forward.clear()

    def of(self, label: str, phase: str, a: np.ndarray, b: np.ndarray) -> tuple[str, str, str]:
        """(gemm, role of a, role of b) of the matmul ``a @ b`` under ``label`` in ``phase``."""
        if phase != "backward":
            self._forward.setdefault(label, []).append((_print(_swapped(b)), _print(_swapped(a)), _print(a)))
            return "fprop", "activation", "weight"
        pa, pb = _print(a), _print(b)
        for weight_t, activation_t, activation in reversed(self._forward.get(label, ())):
            if pb == weight_t:
                return "dgrad", "gradient", "weight"
            if pa == activation_t:
                return "wgrad", "activation", "gradient"
            if pb == activation:
                return "wgrad", "gradient", "activation"
        return "backward", "gradient", "gradient"


class Operand(NamedTuple):
    """One matrix of a matmul in a narrow format: its elements (the format's dtype or uint8
    codes), the binary32 decode scale of each block along the contraction axis ((M, K/block) for
    the left operand, (K/block, N) for the right), the block length, the per-tensor decode factor
    applied after the sum (NVFP4's; 1 otherwise), the binary32 or binary64 values it stands for,
    its encode scales (one per block), and how many elements (and blocks) the cast clamped."""

    elements: np.ndarray
    format: Format
    scales: np.ndarray
    block: int
    tensor_scale: np.float32
    values: np.ndarray
    encode: np.ndarray
    saturated: int
    saturated_blocks: int


def amax_of(x: np.ndarray) -> float:
    """A tensor's amax as Transformer Engine's kernels reduce it: fmaxf over |x| from 0, which
    passes over NaN (an all-NaN tensor has amax 0) and keeps Inf."""
    return float(np.fmax.reduce(np.abs(np.asarray(x, np.float32)).reshape(-1), initial=0.0))


def figures(x: np.ndarray, parts: list[Operand]) -> dict[str, Any]:
    """What ``fp8.csv`` says of one operand (a stack of matrices: ``parts``) beside its binary32
    values ``x``: its scale (the smallest block's encode scale, NaN where a block has none), the
    range of its blocks' scales, its blocks and those saturated, its elements saturated, not
    finite, and underflowed (nonzero, finite, quantised to zero), and the relative error
    ||q - x|| / ||x|| (binary64 2-norms)."""
    x = np.asarray(x, np.float32)
    values = np.concatenate([np.asarray(p.values, np.float64).reshape(-1) for p in parts]).reshape(x.shape)
    encode = np.concatenate([np.asarray(p.encode, np.float64).reshape(-1) for p in parts])
    with np.errstate(invalid="ignore"):
        kept = encode[~np.isnan(encode)]
    return {"amax": amax_of(x), "scale": float(encode.min()) if encode.size else 1.0,
            "scale_min": float(kept.min()) if kept.size else float("nan"),
            "scale_max": float(kept.max()) if kept.size else float("nan"),
            "elements": int(x.size), "blocks": int(encode.size),
            "saturated": sum(p.saturated for p in parts), "blocks_saturated": sum(p.saturated_blocks for p in parts),
            "nonfinite": int(np.count_nonzero(~np.isfinite(values))),
            "underflowed": int(np.count_nonzero((x != 0) & np.isfinite(x) & (values == 0))),
            "rel_error": _relative_error([values], [x])}
