"""Reductions in a fixed order: sums and means as tree sums, moments, cumulative sums and products,
logsumexp, norms and distances."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .. import binary32
from .common import _F32, _all32, _axes, _cr, _cr_np, _np, _t, _want
from .pointwise import _sqrt


def _sum(mode, x, dim=None, keepdim=False, *, dtype=None):
    if not _want(x, dtype):
        return NotImplemented
    return _t(binary32.sum(_np(x), _axes(x, dim), keepdim))


def _mean(mode, x, dim=None, keepdim=False, *, dtype=None):
    if not _want(x, dtype):
        return NotImplemented
    return _t(binary32.mean(_np(x), _axes(x, dim), keepdim))


def _correction(unbiased=None, correction=None) -> float:
    if correction is not None:
        return float(correction)
    return 1.0 if unbiased is None or unbiased else 0.0


def _moments(x: torch.Tensor, dim, keepdim, correction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(variance, mean) in two passes: the mean, then the sum of squared deviations / (n - c)."""
    var, mean = _moments_np(_np(x), _axes(x, dim), keepdim, correction)
    return _t(var), _t(mean)


def _moments_np(a: np.ndarray, axes, keepdim: bool, correction: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_moments` of a numpy array over ``axes`` (a tuple, or None for all)."""
    return binary32.moments(a, axes, keepdim, correction)


def _var(mode, x, *rest, **kw):
    dim, unbiased, keepdim, correction = _var_args(rest, kw)
    return _moments(x, dim, keepdim, _correction(unbiased, correction))[0]


def _std(mode, x, *rest, **kw):
    return _sqrt(_var(mode, x, *rest, **kw))


def _var_mean(mode, x, *rest, **kw):
    dim, unbiased, keepdim, correction = _var_args(rest, kw)
    return _moments(x, dim, keepdim, _correction(unbiased, correction))


def _std_mean(mode, x, *rest, **kw):
    var, mean = _var_mean(mode, x, *rest, **kw)
    return _sqrt(var), mean


def _var_args(rest, kw):
    """var's overloads' arguments: (dim, unbiased, keepdim, correction)."""
    dim, unbiased, keepdim = None, kw.get("unbiased"), kw.get("keepdim", False)
    if rest and isinstance(rest[0], bool):  # var(self, unbiased)
        unbiased = rest[0]
    elif rest:
        dim = rest[0]
        if len(rest) > 1:
            unbiased = rest[1]
        if len(rest) > 2:
            keepdim = rest[2]
    return kw.get("dim", dim), unbiased, keepdim, kw.get("correction")


def _in_order(op: str, x: torch.Tensor, dim: int, keep: bool) -> torch.Tensor:
    """cumsum, cumprod (keep) or prod along ``dim``, in index order, one rounding a step."""
    a = np.moveaxis(_np(x), dim, 0) if x.dim() else _np(x).reshape(1)
    out = np.empty_like(a)
    acc = np.full(a.shape[1:], 0 if op == "sum" else 1, np.float32)
    with np.errstate(all="ignore"):
        for i in range(a.shape[0]):
            acc = (acc + a[i] if op == "sum" else acc * a[i]).astype(np.float32)
            out[i] = acc
    if keep:
        return _t(np.moveaxis(out, 0, dim) if x.dim() else out.reshape(()))
    return _t(acc)


def _cumsum(mode, x, dim, *, dtype=None):
    return _in_order("sum", x, dim, True) if _want(x, dtype) else NotImplemented


def _cumprod(mode, x, dim, *, dtype=None):
    return _in_order("prod", x, dim, True) if _want(x, dtype) else NotImplemented


def _prod(mode, x, dim=None, keepdim=False, *, dtype=None):
    if not _want(x, dtype):
        return NotImplemented
    if dim is None:
        return _in_order("prod", x.reshape(-1), 0, False)
    r = _in_order("prod", x, dim, False)
    return r.unsqueeze(dim) if keepdim else r


def _logcumsumexp(mode, x, dim):
    """torch's kernel's recurrence (ReduceOpsKernel.cpp, _log_add_exp_helper) in binary32 where
    torch's accumulates in binary64 (this project's model: binary32 inside): from -inf, each step
    max + log1p(exp(min - max)), correctly rounded, and the element itself where both are the same
    infinity; a NaN propagates."""
    if x.dtype != _F32:
        return NotImplemented
    a = np.moveaxis(_np(x), dim, 0) if x.dim() else _np(x).reshape(1)
    out = np.empty_like(a)
    acc = np.full(a.shape[1:], -np.inf, np.float32)
    with np.errstate(all="ignore"):
        for i in range(a.shape[0]):
            v = a[i]
            nan = np.isnan(acc)
            lo, hi = np.where(nan, acc, np.minimum(v, acc)), np.where(nan, acc, np.maximum(v, acc))
            step = _cr_np(mode, "log1p", _cr_np(mode, "exp", lo - hi)) + hi
            acc = np.where((lo != hi) | np.isfinite(lo), step, v).astype(np.float32)
            out[i] = acc
    return _t(np.moveaxis(out, 0, dim) if x.dim() else out.reshape(()))


def _logsumexp(mode, x, dim, keepdim=False):
    if x.dtype != _F32:
        return NotImplemented
    m = x.amax(dim, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # all -inf (or an inf): exp of the rest is exact
    s = _sum(mode, _cr(mode, "exp", x - m), dim, True)
    r = _cr(mode, "log", s) + m
    axes = _axes(x, dim)
    return r if keepdim else r.squeeze(tuple(range(x.dim())) if axes is None else axes)


def _vector_norm(mode, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if not _want(x, dtype):
        return NotImplemented
    p = float(ord)
    a = x.abs()
    if p == math.inf:
        return a.amax(dim, keepdim) if x.numel() else _sum(mode, a, dim, keepdim)
    if p == -math.inf:
        return a.amin(dim, keepdim)
    if p == 0:
        return _sum(mode, (x != 0).float(), dim, keepdim)
    if p == 1:
        return _sum(mode, a, dim, keepdim)
    if p == 2:
        return _sqrt(_sum(mode, a * a, dim, keepdim))
    s = _sum(mode, _cr(mode, "pow", a, np.float32(p)), dim, keepdim)
    return _cr(mode, "pow", s, np.float32(1 / p))


def _cdist32(x1: torch.Tensor, x2: torch.Tensor, p: float) -> torch.Tensor:
    """cdist as the vector norms of the differences of every pair of rows (to be evaluated in the mode)."""
    return torch.linalg.vector_norm(x1.unsqueeze(-2) - x2.unsqueeze(-3), p, dim=-1)


def _pdist32(x: torch.Tensor, p: float) -> torch.Tensor:
    """pdist as the vector norms of the differences of the pairs i < j in row-major order."""
    i, j = torch.triu_indices(len(x), len(x), 1)
    return torch.linalg.vector_norm(x[i] - x[j], p, dim=-1)


def _cdist(mode, x1, x2, p, compute_mode=None):
    """cdist and pdist: the vector norm of each pair's difference, as dist is (``_vector_norm``);
    torch's kernel may take a matrix product for p = 2 instead, whose cancellation this model does
    not have (this project's choice)."""
    if not _all32(x1, x2):
        return NotImplemented
    with mode:
        return _cdist32(x1, x2, p)


def _pdist(mode, x, p=2.0):
    if not _all32(x):
        return NotImplemented
    with mode:
        return _pdist32(x, p)


def _dist_terms(mode, diff: np.ndarray, grad: np.ndarray, dist: np.ndarray, p: float) -> np.ndarray:
    """Each pair's gradient term, F::backward of torch's DistanceOpsKernel.cpp in binary32 (its sign
    as min(max(0, ceil), 1) + min(max(-1, floor), 0), its powers correctly rounded), grad and dist
    broadcast over the last axis."""
    g, d, pf = grad[..., None], dist[..., None], np.float32(p)
    sign = np.minimum(np.maximum(0, np.ceil(diff)), 1) + np.minimum(np.maximum(-1, np.floor(diff)), 0)
    with np.errstate(all="ignore"):
        if p == 0:
            return np.zeros_like(diff)
        if p == 1:
            return g * sign
        if math.isinf(p):
            return g * sign * (1 - np.minimum(1, np.ceil(np.abs(np.abs(diff) - d))))
        if p == 2:
            terms = g * diff / d
        else:
            up = _cr_np(mode, "pow", np.abs(diff), pf - (1 if p < 2 else 2))
            terms = ((sign if p < 2 else diff) * up) * g / _cr_np(mode, "pow", d, pf - 1)
        terms = np.where(d == 0, np.float32(0), terms)
        return np.where((diff == 0) & (p < 1), np.float32(0), terms)


def _cdist_backward(mode, grad, x1, x2, p, cdist):
    """x1's gradient as torch's kernel adds it: each row's terms over x2's rows, in order, from 0."""
    if not _all32(grad, x1, x2, cdist):
        return NotImplemented
    a, b = _np(x1), _np(x2)
    with np.errstate(all="ignore"):
        diff = a[..., :, None, :] - b[..., None, :, :]
    terms = _dist_terms(mode, diff, _np(grad), _np(cdist), p)  # (..., P, R, M)
    return _t(_from_zero(np.add, terms, -2))


def _pdist_backward(mode, grad, x, p, pdist):
    """x's gradient as torch's kernel adds it: row r from 0, minus its terms as the second of each
    pair (i < r, in order of i), then plus its terms as the first (j > r, in order of j)."""
    if not _all32(grad, x, pdist):
        return NotImplemented
    a = _np(x)
    n = len(a)
    i, j = np.triu_indices(n, 1)
    pair = np.full((n, n), -1)
    pair[i, j] = np.arange(len(i))
    with np.errstate(all="ignore"):
        terms = _dist_terms(mode, a[i] - a[j], _np(grad), _np(pdist), p)  # (pairs, M)
    rows = np.arange(n)[:, None]
    t = np.arange(n - 1)[None, :]
    first = t >= rows  # the row's pairs (r, t + 1), after its pairs (t, r)
    which = np.where(first, pair[rows, np.minimum(t + 1, n - 1)], pair[np.minimum(t, n - 1), rows])
    signed = np.where(first[..., None], terms[which], -terms[which])  # (n, n - 1, M)
    return _t(_from_zero(np.add, signed))


def _embedding_renorm_(mode, w, indices, max_norm, norm_type):
    """nn.Embedding's max_norm as torch's kernel applies it (Embedding.cpp, embedding_renorm_cpu_):
    each looked-up row (once) whose norm exceeds max_norm scaled by max_norm / (norm + 1e-7),
    that scale computed in binary64 and rounded to binary32 for the row's multiplication; the norm
    here is ``_vector_norm``'s, in place of the host's reduction."""
    if w.dtype != _F32:
        return NotImplemented
    rows = torch.from_numpy(np.unique(indices.numpy().reshape(-1)).astype(np.int64))
    if len(rows):
        picked = w[rows]
        norms = _np(_vector_norm(mode, picked, norm_type, 1)).astype(np.float64)
        over = norms > max_norm
        with np.errstate(all="ignore"):
            scale = (max_norm / (norms + 1e-7)).astype(np.float32)
            scaled = _np(picked) * np.where(over, scale, np.float32(1))[:, None]
        w[rows[torch.from_numpy(over)]] = _t(scaled[over])
    return w


def _trilinear(mode, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """F.bilinear's kernel (and its gradients, which are the same kernel): the three operands
    broadcast at their expanded dimensions, their products (i1 * i2) * i3 in binary32, summed over
    ``sumdim`` by the fixed tree of ``_sum``; torch's kernel pairs the sums differently (this
    project's model)."""
    if not _all32(i1, i2, i3):
        return NotImplemented
    a, b, c = (functools.reduce(torch.unsqueeze, sorted(dims), t)
               for t, dims in ((i1, expand1), (i2, expand2), (i3, expand3)))
    with mode:
        product = (a * b) * c
        return product.sum(list(sumdim)) if len(sumdim) else product.contiguous()


def _norm(mode, x, p=2, dim=None, keepdim=False, *, dtype=None):
    return _vector_norm(mode, x, 2 if p is None else p, dim, keepdim, dtype=dtype)


def _from_zero(ufunc: np.ufunc, terms: np.ndarray, axis: int = 1) -> np.ndarray:
    """((0 op t0) op t1) op ... along ``axis`` in binary32, as a kernel's loop from a zero
    accumulates (a term of +0 standing for one the loop skips: it changes no total); ``axis`` gone."""
    axis %= terms.ndim
    zero = np.zeros(terms.shape[:axis] + (1,) + terms.shape[axis + 1:], np.float32)
    return np.take(ufunc.accumulate(np.concatenate([zero, terms], axis=axis), axis=axis), -1, axis=axis)

