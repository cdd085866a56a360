"""Batch norm, layer norm, softmax and the embedding gradient, written out as torch's decompositions
compute them."""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import binary32
from .attention import _softmax_np
from .common import _F32, _all32, _both32, _cr_np, _filled, _np, _strides, _t, _to_dim, _vec, aten
from .products import _index_put
from .reductions import _moments_np, _sum


def _batch_norm_helper(mode, x, weight, bias, running_mean, running_var, training, momentum, eps, functional):
    """decompositions.native_batch_norm_helper: (output, save_mean, save_rstd, new_running_mean,
    new_running_var); the running statistics written unless ``functional``."""
    nd = x.dim()
    dims = (0, *range(2, nd))
    three = (x.shape[0], x.shape[1], math.prod(x.shape[2:]))
    new_mean, new_var = running_mean, running_var
    with np.errstate(all="ignore"):
        if training:
            biased_var, mean = _moments_np(_np(x), dims, True, 0.0)
            centre = mean.reshape(-1)
            scale = _cr_np(mode, "rsqrt", biased_var.reshape(-1) + np.float32(eps))
            save_mean, save_rstd = _t(centre), _t(scale)
            keep = np.float32(1 - momentum)
            if running_mean is not None:
                new_mean = _t(np.float32(momentum) * centre + keep * _np(running_mean))
                if not functional:
                    running_mean.copy_(new_mean)
            if running_var is not None:
                n = x.numel() / x.shape[1]
                unbiased = biased_var.reshape(-1) * np.float32(n / (n - 1))
                new_var = _t(np.float32(momentum) * unbiased + keep * _np(running_var))
                if not functional:
                    running_var.copy_(new_var)
        else:
            if running_mean is None or running_var is None:
                raise AssertionError("running_mean and running_var must not be None in eval mode")
            new_mean, new_var = running_mean.clone(), running_var.clone()
            centre = _np(running_mean).reshape(-1)
            scale = np.float32(1) / np.sqrt(_np(running_var).reshape(-1) + np.float32(eps))
            save_mean = save_rstd = x.new_zeros((0,))
    strides = _strides(aten.native_batch_norm.default,
                       (x, weight, bias, running_mean, running_var, training, 0.1, 1e-5))
    a3 = _np(x).reshape(three)
    output = _filled(x.shape, strides, lambda o: binary32.norm_apply(
        a3, centre, scale, _vec(weight), _vec(bias), weight is not None, bias is not None, False, o),
        lambda o: o.reshape(three))
    return output, save_mean, save_rstd, new_mean, new_var


def _native_batch_norm(mode, x, weight, bias, running_mean, running_var, training, momentum, eps):
    if not _all32(x, weight, bias, running_mean, running_var):
        return NotImplemented
    return _batch_norm_helper(mode, x, weight, bias, running_mean, running_var, training, momentum, eps, False)[:3]


def _batch_norm_no_stats(mode, x, weight, bias, training, momentum, eps):
    return _native_batch_norm(mode, x, weight, bias, None, None, training, momentum, eps)


def _batch_norm_legit_no_training(mode, x, weight, bias, running_mean, running_var, momentum, eps):
    return _native_batch_norm(mode, x, weight, bias, running_mean, running_var, False, momentum, eps)


def _batch_norm_legit_functional(mode, x, weight, bias, running_mean, running_var, training, momentum, eps):
    if not _all32(x, weight, bias, running_mean, running_var):
        return NotImplemented
    result = _batch_norm_helper(mode, x, weight, bias, running_mean, running_var, training, momentum, eps, True)
    if result[3] is None or result[4] is None:
        raise AssertionError("new_running_mean and new_running_var should not be None")
    return result


def _batch_norm_backward(mode, grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                         output_mask, reserve=None):
    """decompositions.native_batch_norm_backward (and batch_norm_backward, which adds ``reserve``)."""
    if not _all32(grad, x, weight, running_mean, running_var, save_mean, save_invstd):
        return NotImplemented
    rank = x.dim()
    if rank < 2:
        raise AssertionError(f"rank of the input must be at least 2, got {rank}")
    num_features = math.prod(x.shape) / x.shape[1]
    if train:
        if save_mean is None or save_invstd is None:
            raise AssertionError("mean and invstd must not be None in training mode")
        mean, invstd = _vec(save_mean), _vec(save_invstd)
    else:
        if running_mean is None or running_var is None:
            raise AssertionError("running_mean_cast and running_var_cast must not be None in eval mode")
        mean = _vec(running_mean)
        invstd = _cr_np(mode, "rsqrt", _vec(running_var) + np.float32(eps))
    three = (x.shape[0], x.shape[1], math.prod(x.shape[2:]))
    g3, x3 = _np(grad).reshape(three), _np(x).reshape(three)
    norm = np.float32(1.0 / num_features)
    with np.errstate(all="ignore"):
        grad_sum = binary32.sum(g3, (0, 2))
        terms = np.empty(three, np.float32)
        binary32.batch_norm_terms(g3, x3, mean, terms)
        dot_p = binary32.sum(terms, (0, 2))
        grad_mean = grad_sum * norm
        proj_scale = (dot_p * norm) * (invstd * invstd)
        grad_scale = invstd * np.float32(1.0) if weight is None else invstd * _vec(weight)
    strides = _strides(aten.native_batch_norm_backward.default, (grad, x, weight, running_mean, running_var, save_mean,
                                                                 save_invstd, train, 1e-5, [True, False, False]))
    grad_input = _filled(x.shape, strides, lambda o: binary32.batch_norm_grad_input(
        g3, x3, mean, proj_scale, grad_mean, grad_scale, bool(train), o), lambda o: o.reshape(three))
    with np.errstate(all="ignore"):
        grad_weight = _t(dot_p * invstd) if output_mask[1] else None
    return grad_input, grad_weight, _t(grad_sum) if output_mask[2] else None


def _native_layer_norm(mode, x, normalized_shape, weight, bias, eps):
    """torch._refs.native_layer_norm (its checks of the shapes included)."""
    if not _all32(x, weight, bias):
        return NotImplemented
    nd = len(normalized_shape)
    shape = tuple(normalized_shape)
    ok = (nd >= 1, weight is None or weight.shape == shape, bias is None or bias.shape == shape,
          x.ndim >= nd and x.shape[x.ndim - nd:] == shape)
    if not all(ok):  # torch's checks and messages, in its order (its _check only where one fails: it is slow)
        torch._check(ok[0], lambda: "Expected normalized_shape to be at least 1-dimensional, i.e., containing "
                     f"at least one element, but got normalized_shape = {normalized_shape}")
        torch._check(ok[1], lambda: "Expected weight to be of same shape as normalized_shape, but got weight of "
                     f"shape {weight.shape} and normalized_shape = {normalized_shape}")
        torch._check(ok[2], lambda: "Expected bias to be of same shape as normalized_shape, but got bias of shape "
                     f"{bias.shape} and normalized_shape = {normalized_shape}")
        torch._check(ok[3], lambda: f"Given normalized_shape={normalized_shape}, expected input with shape "
                     f"{normalized_shape}, but got input of size {x.shape}")
    a = np.ascontiguousarray(_np(x))
    inner = math.prod(shape)
    two = (a.size // inner if inner else 0, inner)
    var, mean = _moments_np(a, tuple(range(x.ndim - nd, x.ndim)), True, 0.0)  # refs._normalize
    rstd = _cr_np(mode, "rsqrt", var + np.float32(eps))
    out = torch.empty(x.shape, dtype=_F32)
    if out.numel():
        binary32.norm_apply(a.reshape(two[0], 1, inner), mean.reshape(-1), rstd.reshape(-1), _vec(weight),
                            _vec(bias), weight is not None, bias is not None, True, _np(out).reshape(two[0], 1, inner))
    return out, _t(mean), _t(rstd)


def _native_layer_norm_backward(mode, grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    """decompositions.native_layer_norm_backward."""
    if not _all32(grad, x, mean, rstd, weight, bias):
        return NotImplemented
    shape = x.shape
    axis = x.dim() - len(normalized_shape)
    N, M = math.prod(shape[axis:]), math.prod(shape[:axis])
    if M == 0 or N == 0:
        return (x.new_zeros(shape) if output_mask[0] else None, x.new_zeros(shape[axis:]) if output_mask[1] else None,
                x.new_zeros(shape[axis:]) if output_mask[2] else None)
    g, a = np.ascontiguousarray(_np(grad)).reshape(M, N), np.ascontiguousarray(_np(x)).reshape(M, N)
    rstd = _to_dim(rstd, x.dim())
    layout = (grad, x, normalized_shape, mean, rstd, weight, bias, [True, True, False])
    x_hat, gxh, gxh_x_hat, g_x_hat = (np.empty((M, N), np.float32) for _ in range(4))
    binary32.layer_norm_terms(g, a, _vec(mean), _vec(rstd), _vec(weight), weight is not None, x_hat, gxh, gxh_x_hat,
                              g_x_hat)
    d_input = d_weight = d_bias = None
    with np.errstate(all="ignore"):
        if output_mask[0]:
            strides = _strides(aten.native_layer_norm_backward.default, layout)
            row_sum, row_dot = binary32.sum(gxh, 1), binary32.sum(gxh_x_hat, 1)
            d_input = _filled(shape, strides, lambda o: binary32.layer_norm_grad_input(
                gxh, x_hat, _vec(rstd), row_sum, row_dot, np.float32(N), o), lambda o: o.reshape(M, N))
        if output_mask[1] and weight is not None:
            if axis:
                d_weight = _t(binary32.sum(g_x_hat, 0).reshape(shape[axis:]))
            else:
                strides = _strides(aten.native_layer_norm_backward.default, layout, 1)
                d_weight = _filled(shape, strides, lambda o: np.copyto(o, g_x_hat), lambda o: o.reshape(M, N))
        if output_mask[2] and bias is not None:
            d_bias = _t(binary32.sum(g, 0).reshape(shape[axis:])) if axis else grad.clone()
    return d_input, d_weight, d_bias


def _softmax_op(mode, x, dim, half_to_float):
    """decompositions._softmax: exp(x - max) / its sum (:func:`_softmax_np` along ``dim``)."""
    if x.dtype != _F32 or half_to_float:
        return NotImplemented
    a = _np(x).reshape(x.shape or (1,))
    axis = dim % a.ndim
    if axis == a.ndim - 1:  # the usual case, without numpy's moveaxis (slow for small arrays)
        return _t(_softmax_np(mode, a).reshape(x.shape))
    out = np.moveaxis(_softmax_np(mode, np.moveaxis(a, axis, -1)), -1, axis)
    return _t(np.ascontiguousarray(out).reshape(x.shape))


def _softmax_backward_data(mode, grad, output, dim, input_dtype):
    """decompositions._softmax_backward_data: g * y - y * sum(g * y)."""
    if not _both32(grad, output) or input_dtype != _F32:
        return NotImplemented
    new_grad = grad * output
    return (new_grad - output * _sum(mode, new_grad, dim, True)).contiguous()


def _embedding_dense_backward(mode, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """decompositions.embedding_dense_backward (without scale_grad_by_freq) and the
    _unsafe_masked_index_put_accumulate it calls: the gradient rows of valid, non-padding indices
    added in order (:func:`_index_put`)."""
    if grad.dtype != _F32 or scale_grad_by_freq:
        return NotImplemented
    if indices.dtype != torch.long:
        indices = indices.to(torch.long)
    mask = _to_dim(((indices >= 0) & (indices < num_weights)) & (indices != padding_idx), grad.ndim)
    weight = grad.new_zeros((num_weights, *grad.shape[indices.ndim:]))
    if weight.numel() == 0:
        return weight.clone()
    index = indices.clamp(min=-weight.size(0), max=weight.size(0) - 1)
    return _index_put(mode, weight, [index], grad.masked_fill(~mask, 0), True)

