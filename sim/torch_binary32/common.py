"""What every binary32 model shares: tensors as numpy and back, the correctly rounded elementwise
functions (``sim.elementary``), dimensions, strides and the flags."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch._decomp import decomposition_table

from .. import elementary
from .. import kernels as K

if TYPE_CHECKING:
    from .mode import Binary32Mode


aten, prims = torch.ops.aten, torch.ops.prims
_F32, _F64 = torch.float32, torch.float64
_INVALID, _DIVBYZERO, _OVERFLOW = K.INVALID, K.DIVBYZERO, K.OVERFLOW


def _np(t: torch.Tensor) -> np.ndarray:
    """A binary32 tensor's values as numpy (shared where torch can)."""
    return (t.detach() if t.requires_grad else t).numpy()


def _t(a) -> torch.Tensor:
    """numpy values as a tensor, 0-d kept 0-d."""
    a = np.asarray(a)
    if a.flags.c_contiguous and a.ndim > 1 and (1 in a.shape or not a.size):  # numpy's strides differ there
        return torch.from_numpy(a if a.flags.writeable else a.copy()).reshape(-1).view(a.shape)
    if a.flags.writeable and all(st > 0 for st in a.strides):
        return torch.from_numpy(a)  # numpy's layout kept: an elementwise result's follows its operands'
    return torch.from_numpy(a.copy(order="K"))


def _scalar32(v) -> float:
    """A Python number (or 0-d tensor) as its binary32 value, as torch's kernels take scalars."""
    if isinstance(v, torch.Tensor):
        v = v.item()
    return float(np.float32(v))


# -- elementwise: sim.elementary -----------------------------------------------------------------
def _cr(mode: Binary32Mode | None, name: str, *xs, params=()) -> torch.Tensor:
    """The elementwise function ``name`` of tensors (and Python numbers) xs: a binary32 tensor of
    the broadcast shape; its flags are ORed into the mode's record."""
    return _t(_cr_np(mode, name, *[np.float32(x) if not isinstance(x, torch.Tensor) else _np(x) for x in xs],
                     params=params))


def _cr_np(mode: Binary32Mode | None, name: str, *arrays: np.ndarray, params=()) -> np.ndarray:
    """:func:`_cr` of numpy operands, a numpy result."""
    values, flags = elementary.evaluate(name, *arrays, params=params)
    if mode is not None and flags.size:
        mode.flags_seen |= int(np.bitwise_or.reduce(flags, axis=None))
    return values


# -- reductions ------------------------------------------------------------------------------------
def _axes(x: torch.Tensor, dim) -> tuple[int, ...] | None:
    """A reduction's axes, non-negative; None for all of them (a 0-d tensor's dimension 0 or -1 is
    all of it). A dimension out of range raises torch's IndexError."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    n = max(x.dim(), 1)
    for d in dims:
        if not -n <= d < n:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})")
    return tuple(d % n for d in dims) if x.dim() else None


def _want(x: torch.Tensor, dtype) -> bool:
    """A reduction computed here: binary32 in and out (another dtype: torch's decomposition)."""
    return x.dtype == _F32 and dtype in (None, _F32)


# -- matrix products ---------------------------------------------------------------------------------
def _both32(*ts) -> bool:
    return all(t.dtype == _F32 for t in ts)


# -- normalisations and softmax: torch's decompositions, evaluated directly ------------------------------
# Each function below is torch's decomposition of its operation (torch/_decomp/decompositions.py,
# torch/_refs/__init__.py) step for step, with the steps Binary32Mode models (var_mean, rsqrt, sum,
# exp) called directly and the rest (IEEE operations, views) run by torch: the same operations on
# the same values as the decomposition evaluated in the mode, without re-dispatching each step.
# Binary32 operands only (another dtype: NotImplemented, so the decomposition itself).
def _all32(*ts) -> bool:
    for t in ts:
        if t is not None and not (t.dtype == _F32 and t.is_cpu):
            return False
    return True


def _to_dim(x: torch.Tensor, dim: int) -> torch.Tensor:
    """decompositions._unsqueeze_to_dim: trailing unit dimensions until x has ``dim``."""
    for _ in range(dim - x.dim()):
        x = x.unsqueeze(-1)
    return x


# Batch and layer norm: torch's decompositions (torch/_decomp/decompositions.py, torch/_refs) step for
# step: the reductions sim.binary32's trees, rsqrt sim.elementary's, the per-channel steps on small
# vectors in numpy, and the elementwise steps over the input fused into one pass each
# (sim.binary32's normalisation loops: the same IEEE operations in the same order). Each result is
# laid out as torch lays out the decomposition's (its strides found once per layout of the
# operands, on meta tensors). tests/sim_tests/torch_tests/test_binary32_direct.py holds them to the decompositions
# evaluated in Binary32Mode: bits, strides, written arguments, flags.
_STRIDES: dict[tuple, tuple[int, ...]] = {}
_NONE = np.zeros(1, np.float32)  # a kernel's absent weight or bias
def _strides(op, args: tuple, which: int = 0) -> tuple[int, ...]:
    """The strides of result ``which`` of torch's decomposition of ``op`` on ``args``, found by
    running it once on meta tensors of the same shapes and strides (per op, layout and the other
    arguments)."""
    key = (op, which, *((tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else
                        tuple(a) if isinstance(a, list) else a for a in args))
    found = _STRIDES.get(key)
    if found is None:
        meta = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
                if isinstance(a, torch.Tensor) else a for a in args]
        found = _STRIDES[key] = decomposition_table[op](*meta)[which].stride()
    return found


def _filled(shape, strides, loop: Callable, view: Callable[[np.ndarray], np.ndarray]) -> torch.Tensor:
    """A new binary32 tensor of ``shape`` and ``strides`` written by ``loop(view(its values))``
    (through a contiguous buffer where ``view`` cannot see its memory in place)."""
    out = torch.empty_strided(shape, strides, dtype=_F32)
    a = _np(out)
    v = view(a)
    if v.size and not np.may_share_memory(v, a):
        v = np.empty(v.shape, np.float32)
        loop(v)
        a[...] = v.reshape(a.shape)
    else:
        loop(v)
    return out


def _vec(t: torch.Tensor | None) -> np.ndarray:
    return _NONE if t is None else _np(t).reshape(-1)

