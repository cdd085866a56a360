"""Gradients by autograd of a decomposition evaluated in the mode, for the kernels whose backward
is its decomposition's."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch._decomp import decomposition_table

from .. import binary32
from .common import _F32, _all32, _np, _t, aten

if TYPE_CHECKING:
    from .mode import Binary32Mode


_AUTOGRAD_KEYS = tuple(getattr(torch._C.DispatchKey, k) for k in ("AutogradFunctionality", "ADInplaceOrView",
                                                                   "AutogradCPU"))


@contextlib.contextmanager
def _autograd():
    """Autograd recording inside a dispatch mode's handler, where torch's dispatcher has it turned
    off for the operation being handled (the thread's excluded dispatch keys, restored after)."""
    excluded = [torch._C._dispatch_tls_is_dispatch_key_excluded(k) for k in _AUTOGRAD_KEYS]
    for k in _AUTOGRAD_KEYS:
        torch._C._dispatch_tls_set_dispatch_key_excluded(k, False)
    try:
        with torch.enable_grad():
            yield
    finally:
        for k, was in zip(_AUTOGRAD_KEYS, excluded, strict=True):
            torch._C._dispatch_tls_set_dispatch_key_excluded(k, was)


def _vjp(forward: Callable, x: torch.Tensor, grad: torch.Tensor, mode: Binary32Mode) -> torch.Tensor:
    """The gradient of a linear map ``forward`` at x (any point), by autograd of its evaluation here."""
    return _gradients(forward, [torch.zeros_like(x)], grad, mode, [True])[0]


def _gradients(forward: Callable, inputs: list[torch.Tensor], grad: torch.Tensor, mode: Binary32Mode,
               wanted: list[bool]) -> list[torch.Tensor | None]:
    """The gradients of ``forward(*inputs)`` at ``inputs`` (those ``wanted``; None for the others),
    by autograd of its evaluation here: its decomposition's backward, index accumulations in order."""
    with _autograd():
        xs = [x.detach().clone().requires_grad_(w) for x, w in zip(inputs, wanted, strict=True)]
        with mode:
            y = forward(*xs)
            gs = iter(torch.autograd.grad(y, [x for x in xs if x.requires_grad], grad, allow_unused=True))
    out = [next(gs) if w else None for w in wanted]
    return [torch.zeros_like(x) if w and g is None else g for x, w, g in zip(inputs, wanted, out, strict=True)]


def _grid_sampler_2d_backward(mode, grad, x, grid, interpolation, padding, align_corners, output_mask):
    """grid_sample's gradients (input's and grid's): autograd of torch's decomposition of its
    forward, evaluated here (the kernel's own order of accumulation not modelled)."""
    if not _all32(grad, x, grid):
        return NotImplemented
    forward = decomposition_table[aten.grid_sampler_2d.default]
    return tuple(_gradients(lambda a, g: forward(a, g, interpolation, padding, align_corners), [x, grid], grad,
                            mode, list(output_mask)))


def _weight_norm_interface_backward(mode, grad_w, v, g, norms, dim):
    """torch's analytic weight-norm gradient (aten/src/ATen/native/WeightNorm.cpp,
    _weight_norm_differentiable_backward) in binary32: each row's sum of grad_w * v the pairwise
    tree, the rest IEEE operations in its order."""
    last = v.dim() - 1
    if not _all32(grad_w, v, g) or dim not in (0, last):
        return NotImplemented
    norms = norms.to(_F32)
    products = _np(grad_w * v)
    rows = products.reshape(v.shape[0], -1) if dim == 0 else products.reshape(-1, v.shape[last])
    shape = [1] * v.dim()
    shape[dim] = v.shape[dim]
    sums = _t(binary32.sum(rows, 1 if dim == 0 else 0)).view(shape)
    return (g / norms) * (grad_w - v * (sums / (norms * norms))), sums / norms

