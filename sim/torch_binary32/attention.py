"""Scaled dot-product attention: the math path, flash and efficient attention, and their gradients."""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import binary32
from .common import _F32, _both32, _cr_np, _np, _t


# -- attention ---------------------------------------------------------------------------------------
def _attention_math(q, k, v, mask=None, is_causal=False, scale=None, enable_gqa=False, mode=None):
    """torch's math path: softmax(q k^T * scale + mask) @ v; also the log-sum-exp of each row. Fewer
    key and value heads than query heads (grouped-query attention, which the flash kernel takes
    without ``enable_gqa``) are repeated to the query's. Computed in numpy with the modelled steps
    (the same values as the path's torch operations evaluated in the mode)."""
    if q.dim() >= 3 and q.shape[-3] != k.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = _scores(_np(q), _np(k), mask, is_causal, scale)
    probs, lse = _softmax_and_logsumexp(mode, scores)
    return _t(binary32.matmul(probs, _np(v))), _t(lse)


def _scores(q: np.ndarray, k: np.ndarray, mask, is_causal: bool, scale: float) -> np.ndarray:
    """(q @ k^T) * scale, then the mask (a causal one, a boolean's -inf where it is False, or a
    float one added)."""
    with np.errstate(all="ignore"):
        scores = binary32.matmul(q, np.swapaxes(k, -1, -2)) * np.float32(scale)
        if is_causal:
            mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        if mask is not None:
            m = mask.detach().numpy()
            scores = np.where(m, scores, np.float32(-np.inf)) if m.dtype == np.bool_ else scores + m
    return scores


def _softmax_np(mode, x: np.ndarray) -> np.ndarray:
    """_softmax_op along the last axis of a numpy array: exp(x - max) / its tree sum."""
    with np.errstate(all="ignore"):
        x_max = x.max(-1, keepdims=True) if x.shape[-1] else np.full((*x.shape[:-1], 1), -np.inf, np.float32)
        e = _cr_np(mode, "exp", x - x_max)
        return e / binary32.sum(e, -1, True)


def _softmax_and_logsumexp(mode, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_softmax_np` and :func:`_logsumexp_np` of x: where no row's maximum is infinite the
    two shift by the same maximum, so they share exp(x - max) and its tree sum (the same values
    and flags as computing each)."""
    with np.errstate(all="ignore"):
        x_max = x.max(-1, keepdims=True) if x.shape[-1] else None
    if x_max is None or np.isinf(x_max).any():
        return _softmax_np(mode, x), _logsumexp_np(mode, x)
    with np.errstate(all="ignore"):
        e = _cr_np(mode, "exp", x - x_max)
        total = binary32.sum(e, -1, True)
        return e / total, (_cr_np(mode, "log", total) + x_max)[..., 0]


def _logsumexp_np(mode, x: np.ndarray) -> np.ndarray:
    """_logsumexp along the last axis of a numpy array: max + log(tree sum of exp(x - max))."""
    with np.errstate(all="ignore"):
        m = x.max(-1, keepdims=True)
        m = np.where(np.isinf(m), np.float32(0), m)
        r = _cr_np(mode, "log", binary32.sum(_cr_np(mode, "exp", x - m), -1, True)) + m
    return r[..., 0]


def _masks_ours(*masks) -> bool:
    """Masks the numpy path takes: none, boolean, or binary32 (another dtype promotes the scores)."""
    return all(m is None or m.dtype in (torch.bool, _F32) for m in masks)


def _flash(mode, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if not _both32(q, k, v) or dropout_p or not _masks_ours(attn_mask):
        return NotImplemented
    return _attention_math(q, k, v, attn_mask, is_causal, scale, mode=mode)


def _attention_backward(mode, grad, q, k, v, out, lse, mask, is_causal, scale, enable_gqa=False):
    """Flash attention's backward from what the forward saved (its output and row log-sum-exp), as
    torch's CPU kernel and the NPU's FlashAttentionScoreGrad take them: P = exp(S - lse) with the
    scores S recomputed, dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO * O)), dQ = dS K scale,
    dK = dS^T Q scale (heads summed back where they were repeated); also dS, the scores' gradient
    (a bias's). In numpy, each step the modelled one."""
    heads = q.shape[-3] // k.shape[-3] if enable_gqa and q.shape[-3] != k.shape[-3] else 1
    qn, kn, vn, g = _np(q), _np(k), _np(v), _np(grad)
    kk = np.repeat(kn, heads, -3) if heads > 1 else kn
    vv = np.repeat(vn, heads, -3) if heads > 1 else vn
    s_ = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = _scores(qn, kk, mask, is_causal, s_)
    with np.errstate(all="ignore"):
        p = _cr_np(mode, "exp", scores - _np(lse)[..., None])
        dv = binary32.matmul(np.swapaxes(p, -1, -2), g)
        dp = binary32.matmul(g, np.swapaxes(vv, -1, -2))
        rows = binary32.sum(g * _np(out), -1, True)
        ds = p * (dp - rows)
        dq = binary32.matmul(ds, kk) * np.float32(s_)
        dk = binary32.matmul(np.swapaxes(ds, -1, -2), qn) * np.float32(s_)
        if heads > 1:
            dk = binary32.sum(dk.reshape(*dk.shape[:-3], k.shape[-3], heads, *dk.shape[-2:]), -3)
            dv = binary32.sum(dv.reshape(*dv.shape[:-3], v.shape[-3], heads, *dv.shape[-2:]), -3)
    return _t(dq), _t(dk), _t(dv), _t(ds)


def _flash_backward(mode, grad, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None, scale=None):
    if not _both32(grad, q, k, v) or dropout_p or not _masks_ours(attn_mask):
        return NotImplemented
    return _attention_backward(mode, grad, q, k, v, out, lse, attn_mask, is_causal, scale,
                               enable_gqa=q.shape[-3] != k.shape[-3])[:3]


def _efficient(mode, q, k, v, bias, compute_lse, dropout_p=0.0, is_causal=False, *, scale=None):
    if not _both32(q, k, v) or dropout_p:
        return NotImplemented
    if not _masks_ours(bias):
        return NotImplemented
    out, lse = _attention_math(q, k, v, bias, is_causal, scale, mode=mode)
    empty = torch.empty(0, dtype=torch.int64)
    return out, lse if compute_lse else torch.empty(0), empty, empty


def _efficient_backward(mode, grad, q, k, v, bias, out, lse, seed, offset, dropout_p, grad_input_mask, is_causal=False,
                        *, scale=None):
    if not _both32(grad, q, k, v) or dropout_p or not _masks_ours(bias):
        return NotImplemented
    dq, dk, dv, ds = _attention_backward(mode, grad, q, k, v, out, lse, bias, is_causal, scale)
    db = None
    if grad_input_mask[3] and bias is not None:
        with mode:
            db = ds.sum([i for i in range(ds.dim()) if i < ds.dim() - bias.dim() or bias.shape[i - ds.dim()] == 1
                         and ds.shape[i] != 1], keepdim=True).reshape(bias.shape) if ds.shape != bias.shape else ds
    return dq, dk, dv, db


def _attention_math_op(mode, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, dropout_mask=None, *,
                       scale=None, enable_gqa=False):
    if not _both32(q, k, v) or dropout_p:
        return NotImplemented
    with mode:
        scale_ = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        kk, vv = k, v
        if enable_gqa and q.shape[-3] != k.shape[-3]:
            kk = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
            vv = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
        scores = (q @ kk.transpose(-2, -1)) * scale_
        if is_causal:
            attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
                else scores + attn_mask
        attn = torch.softmax(scores, -1)
        return attn @ vv, attn

