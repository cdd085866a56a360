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
    """dst.flat[flat_index[i]] += values[i] for i in order (positions in dst's C order, whatever its
    strides), one binary32 rounding each."""
    work = dst if dst.flags.c_contiguous else np.ascontiguousarray(dst)
    K.accumulate32(work.reshape(-1), flat_index.reshape(-1).astype(np.int64),
                   np.ascontiguousarray(values, np.float32).reshape(-1))
    if work is not dst:  # a transposed or sliced tensor: the sums written back into its own layout
        dst[...] = work


def _index_put(mode, x, indices, values, accumulate=False, unsafe=False, *, inplace=False):
    if not accumulate or x.dtype != _F32 or values.dtype != _F32:
        return NotImplemented
    out = x if inplace else x.clone()
    # Every position the indexing selects, in the order torch's indexing lists them.
    first = indices[0] if len(indices) == 1 else None
    if isinstance(first, torch.Tensor) and first.dtype in (torch.int64, torch.int32) and x.dim() \
            and _in_range(first, x.shape[0], -x.shape[0]):  # rows (an embedding's gradient): only the rows' positions
        rows = _np(first).reshape(-1)
        positions = _rows(x.shape, 0, rows).reshape(*first.shape, *x.shape[1:])
    else:  # any other indexing: torch's own, on the positions (an index out of range: its IndexError)
        key = tuple(slice(None) if i is None else i for i in indices)  # None: the whole dimension
        positions = _np(torch.arange(x.numel(), dtype=torch.int64).reshape(x.shape)[key])
    vals = torch.broadcast_to(values, positions.shape)
    _accumulate_into(_np(out), positions, _np(vals.contiguous()))
    return out


def _in_range(index: torch.Tensor, size: int, low: int) -> bool:
    """Whether every index lies in [low, size): indexing takes [-size, size), index_select [0, size)."""
    i = _np(index)
    return not i.size or (int(i.min()) >= low and int(i.max()) < size)


def _rows(shape: tuple[int, ...], dim: int, index: np.ndarray) -> np.ndarray:
    """The flat positions (C order) that ``index_select(dim, index)`` of a tensor of ``shape`` reads,
    in its order (negative indices from the end): what indexing an arange of the tensor's size
    gives, without making one."""
    outer, size, inner = int(np.prod(shape[:dim])), shape[dim], int(np.prod(shape[dim + 1:]))
    i = np.where(index < 0, index + size, index).astype(np.int64)
    positions = (np.arange(outer, dtype=np.int64)[:, None, None] * (size * inner) + i[None, :, None] * inner
                 + np.arange(inner, dtype=np.int64)[None, None, :])
    return positions.reshape(*shape[:dim], i.size, *shape[dim + 1:])


def _index_put_(mode, x, indices, values, accumulate=False, unsafe=False):
    return _index_put(mode, x, indices, values, accumulate, unsafe, inplace=True)


def _index_add(mode, x, dim, index, source, *, alpha=1, inplace=False):
    if x.dtype != _F32 or source.dtype != _F32:
        return NotImplemented
    out = x if inplace else x.clone(memory_format=torch.contiguous_format)  # torch's result is contiguous
    if alpha != 1:
        source = source * _scalar32(alpha)
    if index.dim() <= 1 and x.dim() and index.dtype in (torch.int64, torch.int32) and _in_range(index, x.shape[dim], 0):
        positions = _rows(x.shape, dim % x.dim(), _np(index).reshape(-1))
        order = np.ascontiguousarray(np.moveaxis(positions, dim, 0))
    else:  # torch's own kernel first, for its checks (an index out of range: its error), then its positions
        torch.ops.aten.index_add.default(x, dim, index, source)
        positions = torch.arange(x.numel(), dtype=torch.int64).reshape(x.shape).index_select(dim, index)
        order = _np(positions.movedim(dim, 0).contiguous())
    _accumulate_into(_np(out), order, _np(source.movedim(dim, 0).contiguous()))
    return out


def _scatter_add(mode, x, dim, index, src, *, inplace=False):
    if x.dtype != _F32 or src.dtype != _F32:
        return NotImplemented
    out = x if inplace else x.clone(memory_format=torch.contiguous_format)  # torch's result is contiguous
    positions = torch.arange(x.numel(), dtype=torch.int64).reshape(x.shape)
    target = positions.gather(dim, index) if index.dim() else positions
    lead = [slice(0, s) for s in index.shape]
    _accumulate_into(_np(out), _np(target.contiguous()), _np(src[tuple(lead)].contiguous()))
    return out

