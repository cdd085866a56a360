"""Random draws: torch's generator drawn in binary64 (``sim.torch_binary32.bernoulli_mask``), the
same on every host, and dropout's device multiplies."""

from __future__ import annotations

import numpy as np
import torch

from .. import torch_binary32 as _binary32
from .convert import _NUMPY, _numpy, _Op, _tensor, aten


def _dropout(op: _Op, x, p, train=None):
    """native_dropout: an exact Bernoulli mask (``sim.torch_binary32.bernoulli_mask``: binary64
    uniform draws from torch's generator below 1 - p, the same on every host), then the device
    multiplies by the mask and by 1/(1-p) rounded into the tensor's dtype, as torch's kernel does
    (input * mask * scale)."""
    if train is False or p == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    keep = _binary32.bernoulli_mask(x.shape, 1 - p)
    if p == 1:
        return torch.zeros_like(x), keep
    dtype = x.dtype
    masked = op.dev.mul(_numpy(x), _numpy(keep.to(dtype)))
    return _tensor(op.dev.mul(masked, op.operand(1 / (1 - p), dtype))), keep


def _bernoulli_(op: _Op, target: torch.Tensor, p: float = 0.5, *, generator=None) -> torch.Tensor:
    """bernoulli_(p) into a tensor of ours (dropout's and drop-path's masks): the exact 0/1 draws of
    ``sim.torch_binary32.bernoulli_mask``, the float32 route's own, written as one device operation
    (the rounding of 0 and 1, exact in every format, raises nothing). A p outside [0, 1] (NaN
    included) is refused with torch's message."""
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
    keep = _binary32.bernoulli_mask(target.shape, p, generator)
    (values,) = op.dev.round_results([_numpy(keep).astype(np.float32)], [_NUMPY[target.dtype]], 0, "bernoulli_")
    return target.copy_(_tensor(values))


def _dropout_backward(op: _Op, grad, mask, scale):
    """grad * mask * scale on the device, the mask exact and the scale rounded into grad's dtype."""
    masked = op.dev.mul(_numpy(grad), _numpy(mask.to(grad.dtype)))
    return _tensor(op.dev.mul(masked, op.operand(scale, grad.dtype)))


_UNIFORM = frozenset({aten.rand, aten.rand_like, aten.uniform, aten.uniform_})  # draws on [from, to)

