"""Random draws from torch's generator in binary64, the same on every host: uniform, normal,
Bernoulli, dropout and rrelu's noise."""

from __future__ import annotations

import math

import numpy as np
import torch

from .common import _F32, _F64, _cr, _cr_np, _scalar32, aten


# -- random draws --------------------------------------------------------------------------------------
def _uniform64(shape, generator=None) -> torch.Tensor:
    """Binary64 draws in [0, 1) from torch's generator (its uniform_ kernel: no floating-point
    functions, so the same bits on every host)."""
    return torch.empty(tuple(shape), dtype=_F64).uniform_(0.0, 1.0, generator=generator)


def _down32(v: torch.Tensor) -> torch.Tensor:
    """Binary64 uniform draws on [lo, hi) rounded toward -inf into binary32, so that they stay below
    hi (to nearest, a draw just below 1 would round to 1.0): each binary32 value in the range is
    drawn with probability its spacing, as a uniform draw at binary32's precision is."""
    f = v.float()
    return torch.where(f.double() > v, torch.nextafter(f, torch.tensor(-math.inf)), f)


def _normal32(mode, shape, generator=None) -> torch.Tensor:
    """Standard normal draws by Box and Muller: sqrt(-2 ln(1 - u1)) cos(2 pi u2), each function
    rounded once to binary32 (u1, u2 binary64 uniform draws, the products in binary64)."""
    u = _uniform64((2, *shape), generator)
    radius = torch.from_numpy(np.sqrt(-2 * _cr_np(None, "log", (1 - u[0]).numpy()).astype(np.float64))).float()
    angle = _cr(None, "cos", (2 * math.pi) * u[1].numpy())
    return radius * angle


def bernoulli_mask(shape, p, generator=None) -> torch.Tensor:
    """0/1 (bool) draws with probability p (a number or a tensor broadcasting to shape): u < p,
    u binary64 uniform draws."""
    u = _uniform64(shape, generator)
    return u < (p.double() if isinstance(p, torch.Tensor) else float(p))


def _draw(mode, func, args, kwargs):
    """A random operation on binary32 tensors (or making one): its values from :func:`_uniform64`."""
    packet = func.overloadpacket
    gen = kwargs.get("generator")
    target = args[0] if args and isinstance(args[0], torch.Tensor) else None
    inplace = func._schema.name.endswith("_")
    if packet in (aten.rand, aten.randn):
        shape = args[0]
        return _down32(_uniform64(shape, gen)) if packet is aten.rand else _normal32(mode, shape, gen)
    if packet in (aten.rand_like, aten.randn_like):
        shape = target.shape
        return _down32(_uniform64(shape, gen)) if packet is aten.rand_like else _normal32(mode, shape, gen)
    if packet in (aten.bernoulli, aten.bernoulli_):
        p = args[1] if len(args) > 1 else kwargs.get("p", target if not inplace else 0.5)
        if packet is aten.bernoulli and len(args) == 1 and "p" not in kwargs:
            p = target  # bernoulli(self): probabilities self
        values = bernoulli_mask(target.shape, p, gen).float()
    elif packet in (aten.uniform, aten.uniform_):
        lo = args[1] if len(args) > 1 else kwargs.get("from", 0.0)
        hi = args[2] if len(args) > 2 else kwargs.get("to", 1.0)
        values = _down32(lo + (hi - lo) * _uniform64(target.shape, gen))
    elif packet in (aten.normal, aten.normal_):
        values = _normal_op(mode, func, args, kwargs, gen)
        if not inplace:
            return values
    elif packet is aten.exponential_:
        rate = args[1] if len(args) > 1 else kwargs.get("lambd", 1.0)
        values = -_cr(None, "log1p", (-_uniform64(target.shape, gen)).numpy()) / _scalar32(rate)
    elif packet is aten.log_normal_:
        m = args[1] if len(args) > 1 else kwargs.get("mean", 1.0)
        s = args[2] if len(args) > 2 else kwargs.get("std", 2.0)
        values = _cr(None, "exp", m + s * _normal32(mode, target.shape, gen))
    elif packet is aten.cauchy_:
        m = args[1] if len(args) > 1 else kwargs.get("median", 0.0)
        s = args[2] if len(args) > 2 else kwargs.get("sigma", 1.0)
        values = m + s * _cr(None, "tan", (math.pi * (_uniform64(target.shape, gen) - 0.5)).numpy())
    elif packet is aten.geometric_:
        p = args[1] if len(args) > 1 else kwargs["p"]
        u = _uniform64(target.shape, gen)
        values = torch.ceil(_cr(None, "log1p", (-u).numpy()).double() / math.log1p(-p)).float()
    elif packet is aten.rrelu_with_noise:
        return NotImplemented
    else:
        return NotImplemented
    if inplace:
        return target.copy_(values)
    return values


def _normal_op(mode, func, args, kwargs, gen):
    name = func._overloadname.removesuffix("_out")  # an out= overload draws as its functional one
    z = None
    if name == "float_float":
        mean, std, size = args[0], args[1], args[2]
        z = _normal32(mode, size, gen)
        return z * _scalar32(std) + _scalar32(mean)
    if name in ("Tensor_float", "Tensor_Tensor", "float_Tensor"):
        mean, std = args[0], args[1] if len(args) > 1 else kwargs.get("std", 1.0)
        shape = torch.broadcast_shapes(*(t.shape for t in (mean, std) if isinstance(t, torch.Tensor)))
        z = _normal32(mode, shape, gen)
        return z * std + mean
    target = args[0]  # normal_(self, mean, std)
    mean = args[1] if len(args) > 1 else kwargs.get("mean", 0.0)
    std = args[2] if len(args) > 2 else kwargs.get("std", 1.0)
    z = _normal32(mode, target.shape, gen)
    return z * _scalar32(std) + _scalar32(mean)


def _dropout(mode, x, p, train=None):
    """native_dropout: the mask from :func:`bernoulli_mask` (keep probability 1 - p), then x * mask
    * (1 / (1 - p)) in binary32 (two roundings, as torch's kernel)."""
    if x.dtype != _F32:
        return NotImplemented
    if train is False or p == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    keep = bernoulli_mask(x.shape, 1 - p)
    if p == 1:
        return torch.zeros_like(x), keep
    return x * keep.float() * _scalar32(1 / (1 - p)), keep


def _rrelu_with_noise(mode, x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    """Training: each non-positive element times a slope drawn uniformly from [lower, upper]
    (written into noise; 1 elsewhere); evaluation: the mean slope."""
    if x.dtype != _F32:
        return NotImplemented
    if not training:
        return torch.where(x > 0, x, x * _scalar32((lower + upper) / 2))
    u = _uniform64(x.shape, generator)
    slope = (lower + (upper - lower) * u).float()
    noise.copy_(torch.where(x > 0, torch.ones_like(x), slope))
    return x * noise

