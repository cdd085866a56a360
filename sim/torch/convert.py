"""Tensors as the device's numpy operands and back, and one routed call's conversion of its arguments."""

from __future__ import annotations

import math
from collections.abc import Callable

import ml_dtypes
import numpy as np
import torch
from torch.utils._pytree import tree_map

from .. import elementary

aten = torch.ops.aten
#: The numpy dtype of each torch dtype the device computes in.
NUMPY_DTYPES = {torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
                torch.float32: np.dtype(np.float32)}


def as_array(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array of the same dtype (bfloat16 as ml_dtypes'), sharing its
    memory where torch can: the device's operands."""
    if t.requires_grad:
        t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def as_tensor(a) -> torch.Tensor:
    """A numpy array or scalar (a device's result; ml_dtypes bfloat16 included) as a CPU tensor of
    its dtype and shape (a 0-d array or a scalar as a 0-d tensor)."""
    a = np.asarray(a)
    if not a.flags.c_contiguous:
        a = a.copy()  # not np.ascontiguousarray: it makes a 0-d array 1-d
    if a.dtype == _BFLOAT16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


_NUMPY, _numpy, _tensor = NUMPY_DTYPES, as_array, as_tensor  # the short names used below
_BFLOAT16 = NUMPY_DTYPES[torch.bfloat16]


class _Op:
    """One routed call: the mode, its device and the arguments' conversion."""

    def __init__(self, mode) -> None:
        self.mode, self.dev = mode, mode.device

    def operand(self, x, dtype: torch.dtype) -> np.ndarray:
        """x as a numpy array of ``dtype``, cast on the device where its dtype differs."""
        if isinstance(x, torch.Tensor):
            a = _numpy(x)
            if x.dtype == dtype:
                return a
            if x.dtype not in _NUMPY:  # integer or bool tensors: exact in float64 up to 2**53
                a = a.astype(np.float64)
        else:
            return self.dev.scalar(x, _NUMPY[dtype])
        return self.dev.cast(a, _NUMPY[dtype])


def _result_dtype(a, b) -> torch.dtype:
    """torch's promotion of two operands; without asking torch where it is plain: one floating
    dtype, or a floating tensor and a Python int or float (the tensor's dtype)."""
    if isinstance(a, torch.Tensor) and a.dtype in _NUMPY:
        if isinstance(b, torch.Tensor):
            if b.dtype is a.dtype:
                return a.dtype
        elif b.__class__ is float or b.__class__ is int:
            return a.dtype
    return torch.result_type(a, b)


def _held(value: float, dtype: torch.dtype) -> bool:
    """Whether ``dtype`` holds the Python number ``value`` exactly (Inf and NaN: as they are)."""
    return not math.isfinite(value) or float(np.asarray(value).astype(_NUMPY[dtype])) == value


def _map(fn: Callable, args):
    """``fn`` applied to each argument of an aten call and to each element of a list or tuple
    argument (aten's schemas nest no deeper: ``Tensor[]``, ``int[]``...); args a tuple, list or
    dict of keyword arguments, returned as the same kind. What pytree's ``tree_map`` gives for
    these, without its generality."""
    one = lambda x: [fn(y) for y in x] if x.__class__ is list else (  # noqa: E731
        tuple(fn(y) for y in x) if x.__class__ is tuple else fn(x))
    if args.__class__ is dict:
        return {k: one(v) for k, v in args.items()}
    return args.__class__(one(x) for x in args) if args.__class__ in (tuple, list) else tree_map(fn, args)


def _signaling(x: torch.Tensor, wide: torch.Tensor) -> bool:
    """Whether x holds a signaling NaN (``wide``: x widened to binary32, where NaNs are looked for
    first, numpy's binary32 isnan being fast)."""
    w = _numpy(wide)
    if not (np.isnan(w).any() if w.size < 4096 else elementary.specials(w) == 2):
        return False
    found = elementary.signaling(_numpy(x))
    return found is not None and bool(found.any())
