"""The fused families above autograd: the torch functions of ``sim.fused``'s families (their fused
kernels, or their decompositions in the tensor's dtype), and the fused kernels torch's CPU build
has no aten operation for (attention with dropout, RMS norm, RNN, LSTM, GRU)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .. import binary32 as _b32
from .. import recurrent as _recurrent
from .. import torch_binary32 as _binary32
from ..torch_binary32 import attention as _b32_attention
from .convert import _numpy, _signaling, _tensor

F = torch.nn.functional
#: The fused kernels above autograd, as ``mode.routes`` names them (their backward: the name and
#: ``_backward``): torch's CPU build has no aten operation of them for the mode to see.
ABOVE_AUTOGRAD = ("aten.scaled_dot_product_attention", "aten.rms_norm", "aten.lstm", "aten.gru", "aten.rnn_tanh",
                  "aten.rnn_relu")


class _FusedFunction(torch.autograd.Function):
    """A fused kernel made from a float32 function: forward and backward computed by torch in
    binary32 from the exact values of the operands (each backward by autograd of the same
    function), each output and gradient rounded once on the device into its operand's dtype.
    ``fn`` returns one tensor or a tuple of them (then so does the kernel)."""

    @staticmethod
    def forward(ctx, mode, name: str, fn: Callable, *xs):
        ctx.mode, ctx.kernel, ctx.fn = mode, name, fn
        ctx.save_for_backward(*[x if isinstance(x, torch.Tensor) else None for x in xs])
        ctx.others = [None if isinstance(x, torch.Tensor) else x for x in xs]
        dtype = next(x.dtype for x in xs if isinstance(x, torch.Tensor) and x.dtype in mode.dtypes)
        ctx.tuple = False

        wide, invalid = _widened(mode, xs)

        def kernel():
            out = fn(*wide)
            ctx.tuple = isinstance(out, tuple)
            return list(out) if ctx.tuple else out

        rounded = mode._fused_call(name, kernel, dtype, _floating(wide), invalid=invalid)
        return tuple(rounded) if ctx.tuple else rounded[0]

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        xs = [o if t is None else t for t, o in zip(saved, ctx.others, strict=True)]
        differentiable = [i for i, x in enumerate(xs) if isinstance(x, torch.Tensor) and x.is_floating_point()
                          and ctx.needs_input_grad[i + 3]]

        wide32, invalid = _widened(ctx.mode, [*xs, *grads], detach=True)
        wide32, grads32 = wide32[:len(xs)], wide32[len(xs):]

        def kernel():
            additive = differentiable == [0, 1, 2, 4] and wide32[4] is not None and wide32[4].dtype == torch.float32
            if ctx.fn is _attention32 and (differentiable == [0, 1, 2] or additive) and grads32[0] is not None \
                    and _attention_direct(*wide32[:5], wide32[8]):
                return list(_attention32_vjp(*wide32[:8], grads32[0], additive))
            with torch.enable_grad():
                wide = [x.requires_grad_(i in differentiable) if isinstance(x, torch.Tensor) else x
                        for i, x in enumerate(wide32)]
                out = ctx.fn(*wide)
                outs = list(out) if ctx.tuple else [out]
                pairs = [(o, g) for o, g in zip(outs, grads32, strict=True) if g is not None]
                return list(torch.autograd.grad([o for o, _ in pairs], [wide[i] for i in differentiable],
                                                [g for _, g in pairs], allow_unused=True))

        rounded = ctx.mode._fused_call(ctx.kernel + "_backward", kernel, [xs[i].dtype for i in differentiable],
                                       _floating(wide32 + grads32), invalid=invalid)
        result: list[Any] = [None] * (3 + len(xs))
        for i, g in zip(differentiable, rounded, strict=True):
            result[i + 3] = g
        return tuple(result)


def _floating(xs) -> list[torch.Tensor]:
    """The floating tensors among xs (the operands a kernel's events are judged against)."""
    return [x for x in xs if isinstance(x, torch.Tensor) and x.is_floating_point()]


def _wide(x):
    """A floating tensor of ours as binary32 (exact); anything else as it is."""
    return x.float() if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16) else x


def _widened(mode, xs, detach: bool = False) -> tuple[list, bool]:
    """xs with our floating tensors widened to binary32 (and every tensor detached, ``detach``),
    natively (exact, and part of the fused kernel that reads them: not a device conversion of its
    own); also whether any held a signaling NaN, which widening quiets and the kernel still met
    (IEEE 754 section 7.2: INVALID)."""
    wide = mode._passthrough(lambda: [_wide(x.detach() if detach and isinstance(x, torch.Tensor) else x)
                                      for x in xs], kernel=True)
    return wide, any(_signaling(x, w) for x, w in zip(xs, wide, strict=True)
                     if isinstance(w, torch.Tensor) and w.dtype != x.dtype)


def _attention(q, k, v, mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, *,
               softmax: Callable, dropout: Callable):
    """Scaled dot-product attention as torch's math path writes it, in the operands' own dtype."""
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
    scale = 1 / q.shape[-1] ** 0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    L, S = q.shape[-2], k.shape[-2]
    if is_causal:
        mask = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = torch.where(mask, scores, torch.full((), float("-inf"), dtype=scores.dtype))
        else:
            scores = scores + mask
    attn = softmax(scores, -1)
    if dropout_p > 0:
        attn = dropout(attn, dropout_p)
    return attn @ v


def _attention32(q, k, v, keep, mask, p, is_causal, scale, enable_gqa):
    """Attention in binary32 with a given dropout keep mask (1/(1-p) applied inside)."""
    if not torch.is_grad_enabled() and _attention_direct(q, k, v, keep, mask, enable_gqa):
        return _attention32_steps(q, k, v, keep, mask, p, is_causal, scale)[0]
    return _attention(q, k, v, mask, p if keep is not None else 0.0, is_causal, scale, enable_gqa,
                      softmax=lambda s, d: torch.softmax(s, d), dropout=lambda a, _p: a * keep / (1 - p))


def _attention_direct(q, k, v, keep, mask, enable_gqa) -> bool:
    """Whether :func:`_attention32` takes its numpy steps: binary32 q, k and v of one shape but their
    last two dimensions (no heads to repeat, nothing broadcast), a boolean or binary32 mask (the
    calls whose backward :func:`_attention32_vjp` writes out)."""
    lead = q.shape[:-2]
    return (q.dim() >= 2 and k.shape[:-2] == lead and v.shape[:-2] == lead
            and q.dtype == k.dtype == v.dtype == torch.float32
            and (keep is None or tuple(keep.shape) == (*lead, q.shape[-2], k.shape[-2]))
            and _b32_attention._masks_ours(mask))


def _attention32_steps(q, k, v, keep, mask, p, is_causal, scale):
    """_attention's steps in numpy, the modelled operations (the same values as its torch operations
    in Binary32Mode): (output, softmax, attention after dropout, scale)."""
    scale = 1 / q.shape[-1] ** 0.5 if scale is None else scale
    scores = _b32_attention._scores(_numpy(q), _numpy(k), mask, is_causal, scale)
    attn = _b32_attention._softmax_np(None, scores)
    dropped = attn
    if keep is not None:
        with np.errstate(all="ignore"):
            dropped = (attn * _numpy(keep)) / np.float32(1 - p)
    return _tensor(_b32.matmul(dropped, _numpy(v))), attn, dropped, scale


def _attention32_vjp(q, k, v, keep, mask, p, is_causal, scale, grad, of_mask: bool = False
                     ) -> tuple[torch.Tensor, ...]:
    """The gradients of :func:`_attention32` with respect to q, k and v (and an additive mask, with
    ``of_mask``) by the formulas autograd applies to its torch operations, in the same order:
    dA = dO V^T, dV = A^T dO, back through the dropout (/ (1 - p), then * keep), softmax
    (g y - y rowsum(g y)) and the mask (zero where a boolean one is False; an additive one's
    gradient this, summed to its shape as autograd sums a broadcast operand's), then the scale,
    dQ = dS K and dK = (Q^T dS)^T."""
    _, attn, dropped, scale = _attention32_steps(q, k, v, keep, mask, p, is_causal, scale)
    b32, g = _b32, _numpy(grad)
    qn, kn, vn = _numpy(q), _numpy(k), _numpy(v)
    with np.errstate(all="ignore"):
        da = b32.matmul(g, np.swapaxes(vn, -1, -2))
        dv = b32.matmul(np.swapaxes(dropped, -1, -2), g)
        if keep is not None:
            da = (da / np.float32(1 - p)) * _numpy(keep)
        new = da * attn
        ds = new - attn * b32.sum(new, -1, True)
        if is_causal:
            mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        if mask is not None and mask.dtype == torch.bool:
            ds = np.where(_numpy(mask), ds, np.float32(0))
        grads = []
        if of_mask:  # at::sum_to: the leading dimensions and those mask broadcast, one sum, then squeezed
            lead = ds.ndim - mask.dim()
            dims = [*range(lead), *(i for i in range(lead, ds.ndim) if mask.shape[i - lead] == 1 and ds.shape[i] != 1)]
            dm = b32.sum(ds, tuple(dims), True) if dims else ds.copy()
            grads = [_tensor(np.ascontiguousarray(dm.reshape(mask.shape)))]
        ds = ds * np.float32(scale)
        dq = b32.matmul(ds, kn)
        dk = np.swapaxes(b32.matmul(np.swapaxes(qn, -1, -2), ds), -1, -2)
    return (_tensor(dq), _tensor(np.ascontiguousarray(dk)), _tensor(dv), *grads)


def _f_attention(mode, fused: bool, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
                 scale=None, enable_gqa=False):
    if fused:
        if dropout_p == 0:
            return NotImplemented  # the aten kernels (flash, efficient) are taken by the fused route
        shape = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
        # The mask from binary64 uniforms, as every draw of the mode's (sim.torch_binary32): torch's
        # own bernoulli_ with a scalar p is a kernel with a CPU-vendor branch (MKL's generator on
        # Intel in torch's CPU distribution kernels), not a function of the seed alone.
        keep = mode._passthrough(lambda: _binary32.bernoulli_mask(shape, 1 - dropout_p).float())
        return _FusedFunction.apply(mode, ABOVE_AUTOGRAD[0], _attention32, q, k, v, keep,
                                    attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return _attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                      softmax=lambda s, d: _call(mode, F.softmax, s, d), dropout=lambda a, p: F.dropout(a, p))


def _f_rnn(mode, fused, x, *args, kind: str = "lstm"):
    """torch.lstm / gru / rnn_tanh / rnn_relu (nn.LSTM, nn.GRU, nn.RNN) on a padded batch
    ``(x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)`` or a
    packed sequence ``(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train,
    bidirectional)``: one fused kernel (``sim.recurrent``), its state (h, or h and c) and weights
    its operands; dropout between layers in training draws its masks
    (``sim.torch_binary32.bernoulli_mask``, one a layer, of the shape torch's decomposition draws)
    before the kernel. Operands of mixed dtypes or shapes torch would refuse take torch's
    decomposition, whose errors are torch's."""
    packed = isinstance(args[0], torch.Tensor) and not args[0].is_floating_point()  # batch_sizes, not a state
    if packed:
        batch_sizes, (hx, params, has_biases, num_layers, dropout, train, bidirectional) = args[0], args[1:]
        batch_first = False
    else:
        hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
        batch_sizes = None
    if not fused or not isinstance(has_biases, bool):
        return NotImplemented
    state = tuple(hx) if kind == "lstm" else (hx,)
    tensors = (x, *state, *params)
    if x.dim() != (2 if packed else 3) or 0 in x.shape or any(
            not isinstance(t, torch.Tensor) or t.dtype != x.dtype or t.device != x.device for t in tensors):
        return NotImplemented
    p = float(dropout) if train and num_layers > 1 else 0.0
    keep = None
    if 0 < p < 1:
        width = state[0].shape[2] * (2 if bidirectional else 1)
        rows = (x.shape[0],) if packed else ((x.shape[1], x.shape[0]) if batch_first else tuple(x.shape[:2]))
        keep = [mode._passthrough(lambda: _binary32.bernoulli_mask((*rows, width), 1 - p)).numpy()
                for _ in range(num_layers - 1)]
    config = {"has_biases": has_biases, "num_layers": num_layers, "bidirectional": bidirectional,
              "batch_first": batch_first, "dropout": p, "keep": keep,
              "batch_sizes": None if batch_sizes is None else batch_sizes.numpy().copy()}
    return _Recurrent.apply(mode, kind, config, *tensors)


class _Recurrent(torch.autograd.Function):
    """A recurrent layer as one fused kernel (``sim.recurrent``): forward and backward in binary32
    from the exact values of the operands, each output and gradient rounded once on the device
    into the operands' dtype, with the events that reached them. An output the loss does not use
    sends no gradient (not a zero, which autograd's decomposition would not add either)."""

    @staticmethod
    def forward(ctx, mode, kind: str, config: dict, *xs):
        ctx.set_materialize_grads(False)
        ctx.mode, ctx.kind, ctx.dtype = mode, kind, xs[0].dtype
        wide, invalid = _widened(mode, xs, detach=True)
        states = 2 if kind == "lstm" else 1

        def kernel():
            arrays = [w.numpy() for w in wide]
            outs, ctx.tape, flags = _recurrent.forward(kind, arrays[0], arrays[1:1 + states], arrays[1 + states:],
                                                      **config)
            return [_tensor(o) for o in outs], flags

        ctx.wide = wide
        return tuple(mode._fused_call("aten." + kind, kernel, ctx.dtype, wide, numpy=True, invalid=invalid))

    @staticmethod
    def backward(ctx, *grads):
        grads32, invalid = _widened(ctx.mode, list(grads))
        wanted = ctx.needs_input_grad[3:]

        def kernel():
            gs, flags = _recurrent.backward(ctx.tape, [None if g is None else g.numpy() for g in grads32])
            return [_tensor(g) if g is not None and need else None for g, need in zip(gs, wanted, strict=True)], flags

        rounded = ctx.mode._fused_call(f"aten.{ctx.kind}_backward", kernel, ctx.dtype,
                                       _floating(ctx.wide + grads32), numpy=True, invalid=invalid)
        return (None, None, None, *rounded)


def _norm(x, dims, eps):
    """(x - mean) / sqrt(var + eps) over ``dims`` in x's dtype; also the mean and biased variance."""
    mean = x.mean(dims, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(dims, keepdim=True)
    return centred / torch.sqrt(var + eps), mean, var


def _f_layer_norm(mode, fused, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    if fused:
        return NotImplemented
    y = _norm(x, tuple(range(-len(normalized_shape), 0)), eps)[0]
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def _rms32(x, normalized_shape, weight, eps):
    dims = tuple(range(-len(normalized_shape), 0))
    y = x * torch.rsqrt((x * x).mean(dims, keepdim=True) + eps)
    return y if weight is None else y * weight


def _f_rms_norm(mode, fused, x, normalized_shape, weight=None, eps=None):
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    if fused:
        return _FusedFunction.apply(mode, ABOVE_AUTOGRAD[1], _rms32, x, list(normalized_shape), weight, eps)
    dims = tuple(range(-len(normalized_shape), 0))
    y = x / torch.sqrt((x * x).mean(dims, keepdim=True) + eps)
    return y if weight is None else y * weight


def _f_group_norm(mode, fused, x, num_groups, weight=None, bias=None, eps=1e-5):
    if fused:
        return NotImplemented
    n, c = x.shape[:2]
    y = _norm(x.reshape(n, num_groups, -1), (2,), eps)[0].reshape(x.shape)
    shape = (1, c) + (1,) * (x.dim() - 2)
    y = y if weight is None else y * weight.reshape(shape)
    return y if bias is None else y + bias.reshape(shape)


def _f_batch_norm(mode, fused, x, running_mean, running_var, weight=None, bias=None, training=False,
                  momentum=0.1, eps=1e-5):
    if fused or momentum is None:
        return NotImplemented
    dims = (0, *range(2, x.dim()))
    shape = (1, x.shape[1]) + (1,) * (x.dim() - 2)
    if training or running_mean is None:
        y, mean, var = _norm(x, dims, eps)
        if training and running_mean is not None:
            count = x.numel() // x.shape[1]
            with torch.no_grad():
                running_mean.copy_(running_mean * (1 - momentum) + mean.reshape(-1) * momentum)
                running_var.copy_(running_var * (1 - momentum) + var.reshape(-1) * (momentum * count / (count - 1)))
    else:
        y = (x - running_mean.reshape(shape)) / torch.sqrt(running_var.reshape(shape) + eps)
    y = y if weight is None else y * weight.reshape(shape)
    return y if bias is None else y + bias.reshape(shape)


def _softmax_dim(x, dim):
    return dim if dim is not None else (0 if x.dim() in (0, 1, 3) else 1)  # torch's legacy implicit dim


def _f_softmax(mode, fused, x, dim=None, _stacklevel=3, dtype=None):
    if fused or (dtype is not None and dtype != x.dtype):
        return NotImplemented
    dim = _softmax_dim(x, dim)
    e = torch.exp(x - x.amax(dim, keepdim=True).detach())
    return e / e.sum(dim, keepdim=True)


def _f_log_softmax(mode, fused, x, dim=None, _stacklevel=3, dtype=None):
    if fused or (dtype is not None and dtype != x.dtype):
        return NotImplemented
    dim = _softmax_dim(x, dim)
    shifted = x - x.amax(dim, keepdim=True).detach()
    return shifted - torch.log(torch.exp(shifted).sum(dim, keepdim=True))


def _f_gelu(mode, fused, x, approximate="none"):
    if fused:
        return NotImplemented
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * (2 / torch.pi) ** 0.5
        return x * 0.5 * (torch.tanh(inner) + 1)
    return x * 0.5 * (torch.erf(x * 0.5 ** 0.5) + 1)


def _f_silu(mode, fused, x, inplace=False):
    if fused:
        return NotImplemented  # silu and silu_ alike: the fused route
    y = x * torch.sigmoid(x)
    return x.copy_(y) if inplace else y  # in place: the same device operations, written into x


def _nll(logp, target, reduction):
    """The negative log-likelihood as a one-hot product and device sums (class dimension 1)."""
    classes = logp.shape[1] if logp.dim() > 1 else logp.shape[0]
    onehot = F.one_hot(target, classes).to(logp.dtype)
    if logp.dim() > 2:
        onehot = onehot.movedim(-1, 1)
    picked = -(logp * onehot).sum(1 if logp.dim() > 1 else 0)
    if reduction == "none":
        return picked
    return picked.mean() if reduction == "mean" else picked.sum()


def _plain(target, weight, ignore_index, reduction, label_smoothing=0.0, size_average=None, reduce=None) -> bool:
    return (weight is None and ignore_index == -100 and label_smoothing == 0.0 and size_average is None
            and reduce is None and reduction in ("mean", "sum", "none") and not target.is_floating_point()
            and not bool((target == ignore_index).any()))  # ignored positions (padding): torch's operation


def _f_nll_loss(mode, fused, logp, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                reduction="mean"):
    if fused or not _plain(target, weight, ignore_index, reduction, 0.0, size_average, reduce):
        return NotImplemented
    return _nll(logp, target, reduction)


def _f_cross_entropy(mode, fused, x, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                     reduction="mean", label_smoothing=0.0):
    if fused or not _plain(target, weight, ignore_index, reduction, label_smoothing, size_average, reduce):
        return NotImplemented
    return _nll(_call(mode, F.log_softmax, x, 1 if x.dim() > 1 else 0), target, reduction)


#: The torch functions of the fused families: their family and their function (called with the
#: mode, whether the family is fused, and the call's arguments; NotImplemented: call torch's own).
FUNCTIONS: dict[Callable, tuple[str, Callable]] = {
    F.scaled_dot_product_attention: ("attention", _f_attention),
    F.layer_norm: ("layer_norm", _f_layer_norm),
    F.group_norm: ("group_norm", _f_group_norm),
    F.batch_norm: ("batch_norm", _f_batch_norm),
    F.softmax: ("softmax", _f_softmax), torch.softmax: ("softmax", _f_softmax),
    torch.Tensor.softmax: ("softmax", _f_softmax),
    F.log_softmax: ("softmax", _f_log_softmax), torch.log_softmax: ("softmax", _f_log_softmax),
    torch.Tensor.log_softmax: ("softmax", _f_log_softmax),
    F.gelu: ("gelu", _f_gelu), F.silu: ("silu", _f_silu),
    F.nll_loss: ("cross_entropy", _f_nll_loss), F.cross_entropy: ("cross_entropy", _f_cross_entropy),
}


if hasattr(F, "rms_norm"):
    FUNCTIONS[F.rms_norm] = ("rms_norm", _f_rms_norm)


FUNCTIONS.update({getattr(torch, k): ("rnn", functools.partial(_f_rnn, kind=k))  # as nn.LSTM, nn.GRU, nn.RNN
                  for k in _recurrent.KINDS})                                    # call them (torch._VF)


def _call(mode, func: Callable, *args, **kwargs):
    """func as the mode computes it (its family's model), else torch's own."""
    family, fn = FUNCTIONS[func]
    result = fn(mode, mode.fused[family], *args, **kwargs)
    return func(*args, **kwargs) if result is NotImplemented else result

