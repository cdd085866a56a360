"""Products and index accumulation: matmuls in order (``sim.binary32``), convolutions through
im2col, and index_put, index_add and scatter_add in index order."""

from __future__ import annotations

import numpy as np
import torch

from .. import binary32, conv
from .. import kernels as K
from .common import _F32, _both32, _np, _scalar32, _t
from .reductions import _in_order


def _mm(mode, a, b):
    return _t(binary32.matmul(_np(a), _np(b))) if _both32(a, b) else NotImplemented


def _dot(mode, a, b):
    return _t(binary32.matmul(_np(a), _np(b))) if _both32(a, b) else NotImplemented


def _scaled(mode, product, bias, beta, alpha):
    """alpha * product + beta * bias, each step one binary32 rounding (alpha 1, beta 1: product + bias)."""
    if alpha != 1:
        product = product * _scalar32(alpha)
    if beta == 0:
        return product
    term = bias if beta == 1 else bias * _scalar32(beta)
    return product + term


def _addmm(mode, bias, a, b, *, beta=1, alpha=1):
    if not _both32(bias, a, b):
        return NotImplemented
    return _scaled(mode, _mm(mode, a, b), bias, beta, alpha)


def _addmv(mode, bias, a, v, *, beta=1, alpha=1):
    return _addmm(mode, bias, a, v, beta=beta, alpha=alpha)


def _baddbmm(mode, bias, a, b, *, beta=1, alpha=1):
    return _addmm(mode, bias, a, b, beta=beta, alpha=alpha)


def _addbmm(mode, bias, a, b, *, beta=1, alpha=1):
    if not _both32(bias, a, b):
        return NotImplemented
    batched = _t(binary32.matmul(_np(a), _np(b)))
    total = _in_order("sum", batched, 0, False)  # the batches' products added in order
    return _scaled(mode, total, bias, beta, alpha)


def _convolution(mode, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    if not _both32(x, w) or (bias is not None and bias.dtype != _F32):
        return NotImplemented
    batched = x.dim() == w.dim()
    a = _np(x) if batched else _np(x)[None]
    if transposed:
        y = conv.transpose(a, _np(w), stride, padding, output_padding, dilation, groups, binary32.matmul)
    else:
        y = conv.forward(a, _np(w), stride, padding, dilation, groups, binary32.matmul)
    if bias is not None:
        y = y + _np(bias).reshape(1, -1, *[1] * (y.ndim - 2))
    return _t(y if batched else y[0])


def _convolution_backward(mode, grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding,
                          groups, output_mask):
    if not _both32(grad, x, w):
        return NotImplemented
    batched = x.dim() == w.dim()
    g, a, k = _np(grad), _np(x), _np(w)
    if not batched:
        g, a = g[None], a[None]
    gi = gw = gb = None
    mm = binary32.matmul
    if output_mask[0]:
        if transposed:
            gi = conv.forward(g, k, stride, padding, dilation, groups, mm)
        else:
            gi = conv.grad_input(g, k, a.shape[2:], stride, padding, dilation, groups, mm)
        gi = _t(gi if batched else gi[0])
    if output_mask[1]:
        if transposed:
            gw = conv.grad_weight(g, a, k.shape[2:], stride, padding, dilation, groups, mm)
        else:
            gw = conv.grad_weight(a, g, k.shape[2:], stride, padding, dilation, groups, mm)
        gw = _t(gw)
    if output_mask[2]:
        gb = _t(binary32.sum(np.moveaxis(g, 1, -1).reshape(-1, g.shape[1]), 0))
    return gi, gw, gb


# -- accumulations -------------------------------------------------------------------------------------
def _accumulate_into(dst: np.ndarray, flat_index: np.ndarray, values: np.ndarray) -> None:
    """dst.flat[flat_index[i]] += values[i] for i in order, one binary32 rounding each."""
    K.accumulate32(dst.reshape(-1), flat_index.reshape(-1).astype(np.int64),
                   np.ascontiguousarray(values, np.float32).reshape(-1))


def _index_put(mode, x, indices, values, accumulate=False, unsafe=False, *, inplace=False):
    if not accumulate or x.dtype != _F32 or values.dtype != _F32:
        return NotImplemented
    out = x if inplace else x.clone()
    # Every position the indexing selects, in the order torch's indexing lists them.
    key = tuple(slice(None) if i is None else i for i in indices)  # None: the whole dimension
    positions = torch.arange(x.numel(), dtype=torch.int64).reshape(x.shape)[key]
    vals = torch.broadcast_to(values, positions.shape)
    _accumulate_into(_np(out), _np(positions), _np(vals.contiguous()))
    return out


def _index_put_(mode, x, indices, values, accumulate=False, unsafe=False):
    return _index_put(mode, x, indices, values, accumulate, unsafe, inplace=True)


def _index_add(mode, x, dim, index, source, *, alpha=1, inplace=False):
    if x.dtype != _F32 or source.dtype != _F32:
        return NotImplemented
    out = x if inplace else x.clone()
    if alpha != 1:
        source = source * _scalar32(alpha)
    positions = torch.arange(x.numel(), dtype=torch.int64).reshape(x.shape).index_select(dim, index)
    order = positions.movedim(dim, 0).contiguous()
    _accumulate_into(_np(out), _np(order), _np(source.movedim(dim, 0).contiguous()))
    return out


def _scatter_add(mode, x, dim, index, src, *, inplace=False):
    if x.dtype != _F32 or src.dtype != _F32:
        return NotImplemented
    out = x if inplace else x.clone()
    positions = torch.arange(x.numel(), dtype=torch.int64).reshape(x.shape)
    target = positions.gather(dim, index) if index.dim() else positions
    lead = [slice(0, s) for s in index.shape]
    _accumulate_into(_np(out), _np(target.contiguous()), _np(src[tuple(lead)].contiguous()))
    return out

