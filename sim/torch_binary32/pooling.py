"""Pooling, upsampling and padding gradients, each window summed in torch's order."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch._decomp import decomposition_table

from .common import _F32, _np, _t
from .gradients import _vjp
from .products import _accumulate_into


def _max_pool_backward(mode, grad, x, *rest, d: int):
    """The gradient of a max pooling over d dimensions: each output's gradient added, in output
    order, to the input its index names (one binary32 rounding each)."""
    indices = rest[-1]
    if grad.dtype != _F32:
        return NotImplemented
    lead = x.dim() - d  # (N, C) or (C,)
    size = math.prod(x.shape[lead:])
    offsets = (torch.arange(math.prod(x.shape[:lead]), dtype=torch.int64) * size).reshape(*x.shape[:lead], *[1] * d)
    out = torch.zeros_like(x)
    _accumulate_into(_np(out), _np((indices + offsets).contiguous()), _np(grad.contiguous()))
    return out


# -- pooling -----------------------------------------------------------------------------------------
def _windows(size: int, k: int, s: int, p: int, ceil_mode: bool) -> int:
    """torch's pooling output size (aten/src/ATen/native/Pool.h, pooling_output_shape)."""
    out = (size + 2 * p - k + ((s - 1) if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_geometry(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, d: int):
    kernel = list(kernel) * (d if len(kernel) == 1 else 1)
    stride = (list(stride) * (d if len(stride) == 1 else 1)) if len(stride) else kernel
    padding = list(padding) * (d if len(padding) == 1 else 1)
    spatial = x.shape[-d:]
    outs = [_windows(n, k, s, p, ceil_mode) for n, k, s, p in zip(spatial, kernel, stride, padding, strict=True)]
    starts, ends, divisors = [], [], []
    for n, k, s, p, o in zip(spatial, kernel, stride, padding, outs, strict=True):
        st = np.arange(o) * s - p
        en = np.minimum(st + k, n + p)
        pool = en - st  # count_include_pad's divisor (padding counted, not past it)
        st2, en2 = np.maximum(st, 0), np.minimum(en, n)
        starts.append(st2)
        ends.append(en2)
        divisors.append(pool if count_include_pad else en2 - st2)
    return outs, starts, ends, divisors, divisor_override


def _avg_pool(mode, x, kernel, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
              divisor_override=None, *, d: int = 2):
    if x.dtype != _F32:
        return NotImplemented
    outs, starts, ends, divisors, override = _pool_geometry(x, kernel, stride, padding, ceil_mode, count_include_pad,
                                                            divisor_override, d)
    return _t(_pool_apply(_np(x), d, outs, starts, ends, divisors, override))


def _pool_windows(spatial, outs, starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Each output's window as flat indices into the spatial plane, row-major, (outputs, K),
    padded to the largest window with the index one past the plane; and where they are real."""
    size = math.prod(spatial)
    flat = np.zeros([1] * (2 * len(spatial)), np.int64)
    valid = np.ones_like(flat, dtype=bool)
    d = len(spatial)
    for i, (n, st, en) in enumerate(zip(spatial, starts, ends, strict=True)):
        k = int((en - st).max()) if len(st) else 0
        idx = st[:, None] + np.arange(k)[None, :]  # (outs_i, k)
        shape = [1] * (2 * d)
        shape[i], shape[d + i] = len(st), k
        flat = flat * n + idx.reshape(shape)
        valid = valid & (idx < en[:, None]).reshape(shape)
    n_out, k = math.prod(outs), flat.size // max(math.prod(outs), 1)
    flat, valid = np.broadcast_to(flat, valid.shape).reshape(n_out, k), valid.reshape(n_out, k)
    return np.where(valid, flat, size), valid


def _pool_divisors(outs, divisors, override) -> np.ndarray:
    if override:
        return np.float32(override)
    grid = np.ix_(*divisors)
    return np.asarray(math.prod(grid) if grid else 1, np.float32).reshape(-1)  # exact: a window's size


def _pool_apply(a: np.ndarray, d: int, outs, starts, ends, divisors, override) -> np.ndarray:
    """Each window's sum in row-major order from +0, each addition one binary32 rounding, then one
    division by its divisor."""
    lead, spatial = a.shape[:-d], a.shape[-d:]
    planes = a.reshape(-1, math.prod(spatial))
    index, _ = _pool_windows(spatial, outs, starts, ends)
    padded = np.concatenate([planes, np.full((len(planes), 1), -0.0, np.float32)], axis=1)  # x + -0 = x
    acc = np.zeros((len(planes), len(index)), np.float32)
    with np.errstate(all="ignore"):
        for c in range(index.shape[1]):
            acc += padded[:, index[:, c]]
        out = acc / _pool_divisors(outs, divisors, override)
    return out.reshape(*lead, *outs)


def _adaptive_geometry(spatial, outs):
    starts = [np.array([(o * n) // m for o in range(m)]) for n, m in zip(spatial, outs, strict=True)]
    ends = [np.array([-((-(o + 1) * n) // m) for o in range(m)]) for n, m in zip(spatial, outs, strict=True)]
    return starts, ends, [e - s for s, e in zip(starts, ends, strict=True)]


def _adaptive_avg_pool(mode, x, output_size, *, d: int = 2):
    if x.dtype != _F32:
        return NotImplemented
    outs = [int(o) for o in output_size]
    starts, ends, divisors = _adaptive_geometry(x.shape[-d:], outs)
    return _t(_pool_apply(_np(x), d, outs, starts, ends, divisors, None))


def _avg_pool_backward(mode, grad, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, *,
                       d: int = 2):
    if grad.dtype != _F32:
        return NotImplemented
    outs, starts, ends, divisors, override = _pool_geometry(x, kernel, stride, padding, ceil_mode, count_include_pad,
                                                            divisor_override, d)
    return _t(_pool_scatter(_np(grad), x.shape, d, outs, starts, ends, divisors, override))


def _pool_scatter(g: np.ndarray, shape, d, outs, starts, ends, divisors, override) -> np.ndarray:
    """The gradient of :func:`_pool_apply`: each output's gradient divided by its divisor (one
    rounding), then added, in output order, to every input of its window (one rounding each)."""
    spatial = tuple(shape[-d:])
    planes = g.reshape(-1, math.prod(outs))
    index, valid = _pool_windows(spatial, outs, starts, ends)
    with np.errstate(all="ignore"):
        share = planes / _pool_divisors(outs, divisors, override)
        out = np.zeros((len(planes), math.prod(spatial)), np.float32)
        source = np.nonzero(valid)  # (output, window place) pairs in output order, row-major inside
        np.add.at(out, (slice(None), index[source]), share[:, source[0]])  # in order: one rounding each
    return out.reshape(shape)


def _adaptive_avg_pool_backward(mode, grad, x, *, d: int = 2):
    if grad.dtype != _F32:
        return NotImplemented
    outs = list(grad.shape[-d:])
    starts, ends, divisors = _adaptive_geometry(x.shape[-d:], outs)
    return _t(_pool_scatter(_np(grad), x.shape, d, outs, starts, ends, divisors, None))


def _upsample_backward(forward_packet) -> Callable:
    """An upsampling's gradient: autograd of its forward as torch decomposes it (gathers and
    weighted sums, evaluated here), whose gathers' gradient accumulates in order (index_put)."""
    default = getattr(forward_packet, "default", None)
    decomposed = decomposition_table.get(default)

    def run(mode, grad, output_size, input_size, *rest):
        if grad.dtype != _F32:
            return NotImplemented
        if decomposed is not None:
            forward = lambda t: decomposed(t, output_size, *rest)  # noqa: E731
        else:  # only the .vec form decomposes (the anti-aliased bilinear): the sizes given, no scales
            vec = decomposition_table[forward_packet.vec]
            forward = lambda t: vec(t, output_size, *rest[:1], None)  # noqa: E731
        return _vjp(forward, torch.zeros(list(input_size), dtype=_F32), grad, mode)
    return run


def _replication_pad_backward(forward_packet) -> Callable:
    """Replication padding's gradient: autograd of its forward as torch decomposes it (a gather of
    clamped indices, evaluated here), whose gradient accumulates in order (index_put)."""
    decomposed = decomposition_table[forward_packet.default]

    def run(mode, grad, x, padding):
        if grad.dtype != _F32:
            return NotImplemented
        return _vjp(lambda t: decomposed(t, padding), torch.zeros(x.shape, dtype=_F32), grad, mode)
    return run

