"""torch's binary32 arithmetic made a function of the operands alone: the fused and float32 routes
of :mod:`sim.torch` compute in it, and :class:`Binary32Mode` gives it to any float32 code.

torch's CPU kernels differ by CPU capability (``ATEN_CPU_CAPABILITY``: vectorised Sleef functions,
fused multiply-adds, reduction orders by vector width), by a tensor's length (the vector body
and the scalar tail), by the BLAS, and, for Bernoulli draws, by the CPU's vendor (MKL's
generator on Intel). Inside :class:`Binary32Mode` every operation on binary32 tensors is
computed by one of these means instead, each giving the same bits on every host:

- the elementwise functions of :mod:`sim.elementary` (exp, log, tanh, sigmoid, erf, the
  trigonometric and hyperbolic functions, pow, GELU, SiLU, Mish, softplus, ELU and the other
  activations, their backward formulas, addcmul, addcdiv, lerp, add with a scale): each output
  the exact value rounded once to binary32;
- reductions in fixed orders (:mod:`sim.binary32`): sum and mean in the device's pairwise tree;
  var and std in two passes (the mean, then the sum of the squared deviations, each a tree,
  divided by the count less the correction); prod, cumsum and cumprod in index order; norms as
  the tree sum of |x|**p (p = 2: x * x, then the square root); logsumexp as max + log(sum of
  exp(x - max));
- matrix products (mm, bmm, addmm, baddbmm, mv, dot, and the convolutions as im2col and a
  matmul, in the device's orders) with the products added in order along k, each addition one
  binary32 rounding (a bias or a beta term added after, alpha scaling last);
- accumulations into a tensor (index_put with accumulate, index_add, scatter_add, the gradients
  of embeddings, of max and average pooling and of upsampling) adding each source element in
  order, one binary32 rounding each;
- attention as torch's math path written with the above (scores, mask, softmax, @ v), its
  backward by autograd of that path;
- random draws from torch's generator through binary64 uniform draws (torch's ``uniform_``, which
  computes no floating-point function), transformed here: Bernoulli as u < p, normal by Box and
  Muller from two uniforms with the functions above, exponential, log-normal, Cauchy and
  geometric by inversion;
- IEEE operations (``+ - * /`` of two operands, comparisons, selections, data movement,
  conversions), which torch computes identically on every host, by torch itself; sqrt, fmod and
  remainder by numpy (torch's are not the same on every host: see :func:`_numpy_ieee`);
- anything else by torch's own decomposition (``torch._decomp``) into the above, evaluated in
  the same mode; an operation with none is computed by torch's kernel and counted in
  ``Binary32Mode.host`` (its bits may depend on the host). The decompositions of batch and layer
  normalisation, softmax, their backwards and the embedding gradient (:data:`DIRECT`) are
  evaluated directly: the same steps with the modelled ones called, not re-dispatched.

Each fused or float32 route of DeviceMode computes its operation this way (in binary32 from the
exact values of the operands) and hands the results to the device, which rounds them into
their dtypes; :func:`evaluate` also returns the events the register records (see its docstring).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch._decomp import decomposition_table
from torch.utils._python_dispatch import TorchDispatchMode

from . import binary32, conv, elementary
from . import kernels as K

__all__ = ["Binary32Mode", "evaluate", "run", "judge", "bernoulli_mask", "IMPLEMENTED", "NATIVE"]

aten, prims = torch.ops.aten, torch.ops.prims
_F32, _F64 = torch.float32, torch.float64
_INVALID, _DIVBYZERO, _OVERFLOW = K.INVALID, K.DIVBYZERO, K.OVERFLOW


def _np(t: torch.Tensor) -> np.ndarray:
    """A binary32 tensor's values as numpy (shared where torch can)."""
    return t.detach().numpy()


def _t(a) -> torch.Tensor:
    """numpy values as a tensor, 0-d kept 0-d."""
    a = np.asarray(a)
    if a.flags.c_contiguous and a.ndim > 1:  # torch's strides (numpy's may differ along unit dimensions)
        return torch.from_numpy(a if a.flags.writeable else a.copy()).reshape(-1).view(a.shape)
    if a.flags.writeable and all(st > 0 for st in a.strides):
        return torch.from_numpy(a)  # numpy's layout kept: an elementwise result's follows its operands'
    return torch.from_numpy(a.copy(order="K"))


def _scalar32(v) -> float:
    """A Python number (or 0-d tensor) as its binary32 value, as torch's kernels take scalars."""
    if isinstance(v, torch.Tensor):
        v = v.item()
    return float(np.float32(v))


# -- elementwise: sim.elementary -----------------------------------------------------------------
def _cr(mode: Binary32Mode | None, name: str, *xs, params=()) -> torch.Tensor:
    """The elementwise function ``name`` of tensors (and Python numbers) xs: a binary32 tensor of
    the broadcast shape; its flags are ORed into the mode's record."""
    return _t(_cr_np(mode, name, *[np.float32(x) if not isinstance(x, torch.Tensor) else _np(x) for x in xs],
                     params=params))


def _cr_np(mode: Binary32Mode | None, name: str, *arrays: np.ndarray, params=()) -> np.ndarray:
    """:func:`_cr` of numpy operands, a numpy result."""
    values, flags = elementary.evaluate(name, *arrays, params=params)
    if mode is not None and flags.size:
        mode.flags_seen |= int(np.bitwise_or.reduce(flags, axis=None))
    return values


def _unary(name: str) -> Callable:
    return lambda mode, x: _cr(mode, name, x)


_UNARY = {"exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log2": "log2", "log10": "log10",
          "log1p": "log1p", "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan",
          "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh",
          "sigmoid": "sigmoid", "erf": "erf", "erfc": "erfc", "erfinv": "erfinv", "rsqrt": "rsqrt",
          "lgamma": "lgamma", "i0": "i0", "special_i0": "i0", "silu": "silu", "mish": "mish"}


def _gelu(mode, x, approximate="none"):
    return _cr(mode, "gelu_tanh" if approximate == "tanh" else "gelu", x)


def _gelu_backward(mode, grad, x, approximate="none"):
    return _cr(mode, "gelu_tanh_backward" if approximate == "tanh" else "gelu_backward", grad, x)


def _elu(mode, x, alpha=1, scale=1, input_scale=1):
    return _cr(mode, "elu", x, params=(_scalar32(alpha), _scalar32(scale), _scalar32(input_scale)))


def _elu_backward(mode, grad, alpha, scale, input_scale, is_result, y):
    return _cr(mode, "elu_backward", grad, y,
               params=(_scalar32(alpha), _scalar32(scale), _scalar32(input_scale), float(bool(is_result))))


def _softplus(mode, x, beta=1, threshold=20):
    return _cr(mode, "softplus", x, params=(_scalar32(beta), _scalar32(threshold)))


def _softplus_backward(mode, grad, x, beta, threshold):
    return _cr(mode, "softplus_backward", grad, x, params=(_scalar32(beta), _scalar32(threshold)))


def _log_sigmoid_forward(mode, x):
    """(logsigmoid x, the buffer exp(-|x|)): the backward here does not read the buffer."""
    return _cr(mode, "logsigmoid", x), _cr(None, "exp", -x.abs())


def _glu(mode, x, dim=-1):
    a, b = x.chunk(2, dim)
    return _cr(mode, "glu", a, b)


def _glu_backward(mode, grad, x, dim):
    a, b = x.chunk(2, dim)
    s = _cr(mode, "sigmoid", b)
    ga = _cr(mode, "glu", grad, b)  # grad * sigmoid(b)
    gb = _cr(mode, "sigmoid_backward", grad * a, s)  # grad * a * s (1 - s), two roundings
    return torch.cat([ga, gb], dim)


def _pow(mode, x, e):
    if isinstance(x, torch.Tensor) and not isinstance(e, torch.Tensor):
        if e == 2:
            return x * x  # IEEE: one rounding of the exact square
        if e == 1:
            return x.clone()
        if e == 0.5 and x.dtype == _F32:
            return _sqrt(x)
    return _cr(mode, "pow", x, e)


def _add(mode, x, y, alpha=1):
    """x + alpha * y: one rounding of the exact value (as a fused multiply-add gives it)."""
    if alpha == 1 or alpha == -1 or not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        return NotImplemented
    one = np.float32(1)
    return _cr(mode, "addcmul", x, y, one, params=(_scalar32(alpha),))


def _sub(mode, x, y, alpha=1):
    return NotImplemented if alpha in (1, -1) else _add(mode, x, y, -alpha)


def _addcmul(mode, x, a, b, value=1):
    return _cr(mode, "addcmul", x, a, b, params=(_scalar32(value),))


def _addcdiv(mode, x, a, b, value=1):
    return _cr(mode, "addcdiv", x, a, b, params=(_scalar32(value),))


def _lerp(mode, x, end, weight):
    return _cr(mode, "lerp", x, end, weight)


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root of a binary32 tensor (see :func:`_numpy_ieee`)."""
    with np.errstate(invalid="ignore"):
        return _t(np.sqrt(_np(x)))


def _numpy_ieee(fn: Callable, op: Callable) -> Callable:
    """An exact IEEE operation of numpy's (sqrt, fmod, remainder) on binary32 results. torch's own
    are not the same on every host: its binary32 sqrt here is not correctly rounded (on every
    CPU capability), and its vectorised fmod and remainder differ from its scalar ones for
    operands far apart in magnitude. numpy's sqrt is the CPU's correctly rounded instruction,
    its fmod C's (exact), its remainder Python's modulus (fmod, then the divisor added once
    where the signs differ: one rounding). Another result dtype: torch's own ``op``."""
    def run(mode, *xs):
        if torch.result_type(*xs) != _F32 if len(xs) > 1 else xs[0].dtype != _F32:
            return op(*xs)
        arrays = [_np(x.to(_F32)) if isinstance(x, torch.Tensor) else np.float32(x) for x in xs]
        with np.errstate(all="ignore"):
            return _t(np.asarray(fn(*arrays), np.float32))
    return run


def _binary_cr(name: str) -> Callable:
    return lambda mode, x, y: _cr(mode, name, x, y)


# -- reductions ------------------------------------------------------------------------------------
def _axes(x: torch.Tensor, dim) -> tuple[int, ...] | None:
    """A reduction's axes, non-negative; None for all of them (a 0-d tensor's dimension 0 or -1 is
    all of it). A dimension out of range raises torch's IndexError."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    n = max(x.dim(), 1)
    for d in dims:
        if not -n <= d < n:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})")
    return tuple(d % n for d in dims) if x.dim() else None


def _want(x: torch.Tensor, dtype) -> bool:
    """A reduction computed here: binary32 in and out (another dtype: torch's decomposition)."""
    return x.dtype == _F32 and dtype in (None, _F32)


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


# -- matrix products ---------------------------------------------------------------------------------
def _both32(*ts) -> bool:
    return all(t.dtype == _F32 for t in ts)


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
    return _t(binary32.matmul(_softmax_np(mode, scores), _np(v))), _t(_logsumexp_np(mode, scores))


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
        x_max = np.max(x, -1, keepdims=True) if x.shape[-1] else np.full((*x.shape[:-1], 1), -np.inf, np.float32)
        e = _cr_np(mode, "exp", x - x_max)
        return e / binary32.sum(e, -1, True)


def _logsumexp_np(mode, x: np.ndarray) -> np.ndarray:
    """_logsumexp along the last axis of a numpy array: max + log(tree sum of exp(x - max))."""
    with np.errstate(all="ignore"):
        m = np.max(x, -1, keepdims=True)
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


# -- normalisations and softmax: torch's decompositions, evaluated directly ------------------------------
# Each function below is torch's decomposition of its operation (torch/_decomp/decompositions.py,
# torch/_refs/__init__.py) step for step, with the steps Binary32Mode models (var_mean, rsqrt, sum,
# exp) called directly and the rest (IEEE operations, views) run by torch: the same operations on
# the same values as the decomposition evaluated in the mode, without re-dispatching each step.
# Binary32 operands only (another dtype: NotImplemented, so the decomposition itself).
def _all32(*ts) -> bool:
    return all(t is None or (t.dtype == _F32 and t.device.type == "cpu") for t in ts)


def _to_dim(x: torch.Tensor, dim: int) -> torch.Tensor:
    """decompositions._unsqueeze_to_dim: trailing unit dimensions until x has ``dim``."""
    for _ in range(dim - x.dim()):
        x = x.unsqueeze(-1)
    return x


# Batch and layer norm: torch's decompositions (torch/_decomp/decompositions.py, torch/_refs) step for
# step: the reductions sim.binary32's trees, rsqrt sim.elementary's, the per-channel steps on small
# vectors in numpy, and the elementwise steps over the input fused into one pass each
# (sim.binary32's normalisation loops: the same IEEE operations in the same order). Each result is
# laid out as torch lays out the decomposition's (its strides found once per layout of the
# operands, on meta tensors). tests/test_binary32_direct.py holds them to the decompositions
# evaluated in Binary32Mode: bits, strides, written arguments, flags.
_STRIDES: dict[tuple, tuple[int, ...]] = {}
_NONE = np.zeros(1, np.float32)  # a kernel's absent weight or bias


def _strides(op, args: tuple, which: int = 0) -> tuple[int, ...]:
    """The strides of result ``which`` of torch's decomposition of ``op`` on ``args``, found by
    running it once on meta tensors of the same shapes and strides (per op, layout and the other
    arguments)."""
    key = (op, which, *((tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else
                        tuple(a) if isinstance(a, list) else a for a in args))
    found = _STRIDES.get(key)
    if found is None:
        meta = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
                if isinstance(a, torch.Tensor) else a for a in args]
        found = _STRIDES[key] = decomposition_table[op](*meta)[which].stride()
    return found


def _filled(shape, strides, loop: Callable, view: Callable[[np.ndarray], np.ndarray]) -> torch.Tensor:
    """A new binary32 tensor of ``shape`` and ``strides`` written by ``loop(view(its values))``
    (through a contiguous buffer where ``view`` cannot see its memory in place)."""
    out = torch.empty_strided(shape, strides, dtype=_F32)
    a = _np(out)
    v = view(a)
    if v.size and not np.may_share_memory(v, a):
        v = np.empty(v.shape, np.float32)
        loop(v)
        a[...] = v.reshape(a.shape)
    else:
        loop(v)
    return out


def _vec(t: torch.Tensor | None) -> np.ndarray:
    return _NONE if t is None else _np(t).reshape(-1)


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
    torch._check(nd >= 1, lambda: "Expected normalized_shape to be at least 1-dimensional, i.e., containing at "
                 f"least one element, but got normalized_shape = {normalized_shape}")
    torch._check(weight is None or tuple(weight.shape) == shape, lambda: "Expected weight to be of same shape as "
                 f"normalized_shape, but got weight of shape {weight.shape} and normalized_shape = {normalized_shape}")
    torch._check(bias is None or tuple(bias.shape) == shape, lambda: "Expected bias to be of same shape as "
                 f"normalized_shape, but got bias of shape {bias.shape} and normalized_shape = {normalized_shape}")
    torch._check(x.ndim >= nd and tuple(x.shape[x.ndim - nd:]) == shape, lambda: f"Given normalized_shape="
                 f"{normalized_shape}, expected input with shape {normalized_shape}, but got input of size {x.shape}")
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
    out = np.moveaxis(_softmax_np(mode, np.moveaxis(a, dim % a.ndim, -1)), -1, dim % a.ndim)
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


def _margins(x, target, p, margin, weight) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows of a multi-margin loss as torch's kernel reads them (aten/src/ATen/native/
    LossMultiMargin.cpp): the (N, C) input, the targets, ``z = (margin - x[target]) + x`` in binary32,
    the places counted (z > 0 off the target: a NaN z is not) and each row's target weight."""
    a = np.ascontiguousarray(_np(x), np.float32).reshape(-1, x.shape[-1] if x.dim() else 1)
    t = np.ascontiguousarray(target.numpy()).reshape(-1).astype(np.int64)
    rows = np.arange(len(a))
    torch._check(p in (1, 2), lambda: "only p == 1 and p == 2 supported")
    torch._check(bool(((t >= 0) & (t < a.shape[1])).all()), lambda: "target out of range")
    with np.errstate(all="ignore"):
        z = (np.float32(margin) - a[rows, t])[:, None] + a
    counted = z > 0
    counted[rows, t] = False
    w = _np(weight)[t] if weight is not None else None
    return a, t, z, counted, w


def _from_zero(ufunc: np.ufunc, terms: np.ndarray, axis: int = 1) -> np.ndarray:
    """((0 op t0) op t1) op ... along ``axis`` in binary32, as a kernel's loop from a zero
    accumulates (a term of +0 standing for one the loop skips: it changes no total); ``axis`` gone."""
    axis %= terms.ndim
    zero = np.zeros(terms.shape[:axis] + (1,) + terms.shape[axis + 1:], np.float32)
    return np.take(ufunc.accumulate(np.concatenate([zero, terms], axis=axis), axis=axis), -1, axis=axis)


def _multi_margin_loss(mode, x, target, p=1, margin=1, weight=None, reduction=1):
    """torch's CPU kernel, whose order it keeps: each row's terms (z or z*z, times the target's
    weight) added in class order in binary32 and divided by C; the rows as they are
    (``reduction`` none), or added in binary64 in row order, divided by N for the mean, rounded
    once to binary32."""
    if not _all32(x, weight) or x.numel() == 0:
        return NotImplemented
    a, t, z, counted, w = _margins(x, target, p, margin, weight)
    with np.errstate(all="ignore"):
        h = z if p == 1 else z * z
        if w is not None:
            h = h * w[:, None]
        rows = _from_zero(np.add, np.where(counted, h, np.float32(0))) / np.float32(a.shape[1])
        if reduction == 0 and target.dim() > 0:
            return _t(rows)
        total = np.add.accumulate(rows.astype(np.float64))[-1]
        return _t(np.asarray(total / len(rows) if reduction == 1 else total, np.float32))


def _multi_margin_loss_backward(mode, grad, x, target, p, margin, weight=None, reduction=1):
    """torch's CPU kernel, whose order it keeps: g = 1/(N*C) for the mean, else 1/C (rounded once
    to binary32), each counted place's g or (2*g)*z times the target's weight, the target's the
    negated in-order sum of its row's, all times the output's gradient."""
    if not _all32(grad, x, weight) or x.numel() == 0:
        return NotImplemented
    a, t, z, counted, w = _margins(x, target, p, margin, weight)
    n, c = a.shape
    g = np.float32(1.0 / (n * c) if reduction == 1 else 1.0 / c)
    with np.errstate(all="ignore"):
        h = np.broadcast_to(g, z.shape) if p == 1 else (np.float32(2) * g) * z
        if w is not None:
            h = h * w[:, None]
        out = np.where(counted, h, np.float32(0))
        out[np.arange(n), t] = _from_zero(np.subtract, out)
        go = _np(grad)
        out = out * (go.reshape(-1)[0] if reduction != 0 or grad.dim() == 0 else go.reshape(-1, 1))
    return _t(out.reshape(x.shape))


def _bags(indices, offsets, include_last_offset: bool, padding_idx: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Each looked-up position's bag (from the offsets, as F.embedding_bag defines them), whether it
    counts (not padding_idx), and the number of bags."""
    idx, off = indices.numpy().reshape(-1).astype(np.int64), offsets.numpy().reshape(-1).astype(np.int64)
    n_bags = len(off) - 1 if include_last_offset else len(off)
    bag = np.searchsorted(off[:n_bags], np.arange(len(idx)), side="right") - 1
    return bag, (idx != padding_idx) & (bag >= 0), n_bags


def _embedding_bag(mode, weight, indices, offsets, scale_grad_by_freq=False, bag_mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """F.embedding_bag's sum and mean: each bag's rows (times their per-sample weights, one rounding
    each) added in order from 0 in binary32, a mean divided by its count (one rounding); max is a
    selection, torch's own. The index bookkeeping (offset2bag, bag sizes, argmax) is torch's."""
    if not _all32(weight, per_sample_weights):
        return NotImplemented
    native = aten._embedding_bag.default(weight, indices, offsets, scale_grad_by_freq, bag_mode, sparse,
                                         per_sample_weights, include_last_offset, padding_idx)
    if bag_mode == 2:
        return native
    bag, counted, n_bags = _bags(indices, offsets, include_last_offset, padding_idx)
    w, idx = _np(weight), indices.numpy().reshape(-1)[counted]
    rows = w[idx]
    with np.errstate(all="ignore"):
        if per_sample_weights is not None:
            rows = rows * _np(per_sample_weights).reshape(-1)[counted][:, None]
        out = np.zeros((n_bags, w.shape[1]), np.float32)
        places = bag[counted][:, None] * w.shape[1] + np.arange(w.shape[1])
        _accumulate_into(out, places, rows)
        if bag_mode == 1:
            count = np.bincount(bag[counted], minlength=n_bags).astype(np.float32)[:, None]
            out = np.where(count > 0, out / np.maximum(count, 1), out)
    return (_t(out), *native[1:])


def _embedding_bag_backward(mode, grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                            scale_grad_by_freq, bag_mode, sparse, per_sample_weights, padding_idx=-1):
    """The dense weight gradient of :func:`_embedding_bag`: each counted position's bag gradient
    (times its per-sample weight, or divided by its bag's count, one rounding) added into its row in
    position order; for max, each bag's gradient into the rows its argmax chose, in bag order."""
    if sparse or scale_grad_by_freq or not _all32(grad, per_sample_weights):
        return NotImplemented
    g = _np(grad)
    d = g.shape[1]
    out = np.zeros((num_weights, d), np.float32)
    with np.errstate(all="ignore"):
        if bag_mode == 2:
            chosen = maximum_indices.numpy().reshape(g.shape)
            valid = chosen >= 0
            _accumulate_into(out, (chosen * d + np.arange(d))[valid], g[valid])
            return _t(out)
        bag, counted, _ = _bags(indices, offsets, len(offsets) > len(g), padding_idx)
        terms = g[bag[counted]]
        if per_sample_weights is not None:
            terms = terms * _np(per_sample_weights).reshape(-1)[counted][:, None]
        elif bag_mode == 1:
            terms = terms / np.bincount(bag[counted], minlength=len(g)).astype(np.float32)[bag[counted]][:, None]
        idx = indices.numpy().reshape(-1)[counted]
        _accumulate_into(out, idx[:, None] * d + np.arange(d), terms)
    return _t(out)


def _embedding_bag_per_sample_weights_backward(mode, grad, weight, indices, offsets, offset2bag, bag_mode,
                                               padding_idx=-1):
    """Each position's per-sample-weight gradient: the dot product of its bag's gradient and its
    row, the products added in order from 0 in binary32 (0 for padding)."""
    if not _all32(grad, weight):
        return NotImplemented
    bag, counted, _ = _bags(indices, offsets, len(offsets) > len(grad), padding_idx)
    with np.errstate(all="ignore"):
        products = _np(grad)[np.maximum(bag, 0)] * _np(weight)[indices.numpy().reshape(-1)]
        dots = _from_zero(np.add, products)
    return _t(np.where(counted, dots, np.float32(0)))


def _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank):
    """CTC's operands as torch's kernel reads them (LossCTC.cpp): log-probabilities (B, T, C), the
    lengths, and each item's extended target (blank, l1, blank, l2, ..., blank)."""
    lengths = [np.asarray(v.numpy() if isinstance(v, torch.Tensor) else v, np.int64).reshape(-1)
               for v in (input_lengths, target_lengths)]
    t_in, t_len = lengths
    tg = targets.numpy().astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(t_len)[:-1]]) if tg.ndim == 1 else None
    primes = []
    for b, n in enumerate(t_len):
        labels = tg[starts[b]:starts[b] + n] if tg.ndim == 1 else tg[b, :n]
        prime = np.full(2 * n + 1, blank, np.int64)
        prime[1::2] = labels
        primes.append(prime)
    return np.moveaxis(_np(log_probs), 1, 0), t_in, t_len, primes


def _log_sum(mode, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """log(exp(a - m) + exp(b - m) [+ exp(c - m)]) + m, m the largest (first wins a tie; 0 if all
    -inf), as torch's CTC kernel adds its terms, exp and log correctly rounded in binary32."""
    m = np.where(b > a, b, a)
    if c is not None:
        m = np.where(c > m, c, m)
    m = np.where(m == -np.inf, np.float32(0), m).astype(np.float32)
    with np.errstate(all="ignore"):
        total = _cr_np(mode, "exp", a - m) + _cr_np(mode, "exp", b - m)
        if c is not None:
            total = total + _cr_np(mode, "exp", c - m)
        return _cr_np(mode, "log", total) + m


def _ctc_loss(mode, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """torch's CTC forward (LossCTC.cpp, ctc_loss_cpu_template) in binary32: the alphas step by
    step, each a log of the sum of the allowed predecessors' exponentials (``_log_sum``) plus the
    step's log-probability, the loss minus the log of the last two alphas' sum. Returns (loss,
    log_alpha); the alphas torch leaves unwritten are -inf here."""
    if not _all32(log_probs):
        return NotImplemented
    lp, t_in, t_len, primes = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    batch, steps = lp.shape[:2]
    width = 2 * (max(t_len) if len(t_len) else 0) + 1
    alpha = np.full((batch, steps, width), -np.inf, np.float32)
    nll = np.empty(batch, np.float32)
    with np.errstate(all="ignore"):
        for b in range(batch):
            n, prime = t_in[b], primes[b]
            s = len(prime)
            if n == 0:
                nll[b] = -(0.0 if t_len[b] == 0 else -np.inf)
                continue
            la = alpha[b]
            la[0, 0] = lp[b, 0, blank]
            if s > 1:
                la[0, 1] = lp[b, 0, prime[1]]
            skip = np.zeros(s, bool)
            skip[2:] = prime[:-2] != prime[2:]
            for t in range(1, n):
                prev = la[t - 1, :s]
                a2 = np.concatenate([[-np.inf], prev[:-1]]).astype(np.float32)
                a3 = np.where(skip, np.concatenate([[-np.inf, -np.inf], prev[:-2]])[:s], -np.inf).astype(np.float32)
                la[t, :s] = _log_sum(mode, prev, a2, a3) + lp[b, t, prime]
            end = la[n - 1]
            nll[b] = -(end[0] if s == 1 else _log_sum(mode, end[s - 1:s], end[s - 2:s - 1])[0])
    return _t(nll), _t(alpha)


def _ctc_loss_backward(mode, grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank,
                       zero_infinity=False):
    """torch's CTC backward (ctc_loss_backward_cpu_template) in binary32: the betas step by step as
    the alphas, each step's alpha + beta collected per character in descending order of the
    extended target's positions (``_log_sum`` of two), then exp(lp) - exp(collected + nll - lp),
    times the loss's gradient; steps past an item's length 0; an infinite loss with
    ``zero_infinity`` a zero gradient."""
    if not _all32(grad, log_probs, nll, log_alpha):
        return NotImplemented
    lp, t_in, t_len, primes = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    batch, steps, classes = lp.shape
    la_all, losses, g_out = _np(log_alpha), _np(nll), _np(grad).reshape(-1)
    out = np.zeros((batch, steps, classes), np.float32)
    with np.errstate(all="ignore"):
        for b in range(batch):
            n, prime = t_in[b], primes[b]
            s = len(prime)
            if (zero_infinity and losses[b] == np.inf) or n == 0:
                continue
            la = la_all[b]
            lb = np.full((n, s), -np.inf, np.float32)
            col = np.full((n, classes), -np.inf, np.float32)
            lb[n - 1, s - 1] = lp[b, n - 1, blank]
            col[n - 1, blank] = la[n - 1, s - 1] + lb[n - 1, s - 1]
            if s > 1:
                lb[n - 1, s - 2] = lp[b, n - 1, prime[s - 2]]
                col[n - 1, prime[s - 2]] = la[n - 1, s - 2] + lb[n - 1, s - 2]
            skip = np.zeros(s, bool)
            skip[:-2] = prime[2:] != prime[:-2]
            order = np.arange(s - 1, -1, -1)  # the positions in torch's order, descending
            rounds = _ctc_rounds(prime[order])
            for t in range(n - 2, -1, -1):
                nxt = lb[t + 1]
                b2 = np.concatenate([nxt[1:], [-np.inf]]).astype(np.float32)
                b3 = np.where(skip, np.concatenate([nxt[2:], [-np.inf, -np.inf]])[-s:], -np.inf).astype(np.float32)
                lb[t] = _log_sum(mode, nxt, b2, b3) + lp[b, t, prime]
                both = la[t, :s] + lb[t]
                for picks in rounds:  # one position per character a round, in descending order
                    pos = order[picks]
                    chars, new = prime[pos], both[pos]
                    old = col[t, chars]
                    empty = old == -np.inf
                    merged = new.copy()
                    if (~empty).any():
                        merged[~empty] = _log_sum(mode, old[~empty], new[~empty])
                    col[t, chars] = merged
            p = lp[b, :n]
            out[b, :n] = (_cr_np(mode, "exp", p) - _cr_np(mode, "exp", (col + losses[b]) - p)) * g_out[b]
    return _t(np.ascontiguousarray(np.moveaxis(out, 0, 1)))


def _ctc_rounds(chars: np.ndarray) -> list[np.ndarray]:
    """The indices of ``chars`` in rounds, each character at most once a round and each
    character's occurrences in order across the rounds."""
    seen: dict[int, int] = {}
    rounds: list[list[int]] = []
    for i, c in enumerate(chars.tolist()):
        r = seen.get(c, 0)
        seen[c] = r + 1
        if r == len(rounds):
            rounds.append([])
        rounds[r].append(i)
    return [np.asarray(r, np.int64) for r in rounds]


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


# -- the table -------------------------------------------------------------------------------------------
#: The implementations, by aten overload packet: called as impl(mode, *args, **kwargs); NotImplemented
#: hands the call on (to torch's decomposition, or its kernel).
IMPLEMENTED: dict[Any, Callable] = {getattr(aten, name): _unary(fn) for name, fn in _UNARY.items()
                                     if hasattr(aten, name)}
IMPLEMENTED.update({
    aten.gelu: _gelu, aten.gelu_backward: _gelu_backward, aten.elu: _elu, aten.elu_backward: _elu_backward,
    aten.softplus: _softplus, aten.softplus_backward: _softplus_backward,
    aten.log_sigmoid_forward: _log_sigmoid_forward,
    aten.log_sigmoid_backward: lambda mode, g, x, buffer: _cr(mode, "logsigmoid_backward", g, x),
    aten.silu_backward: _binary_cr("silu_backward"), aten.mish_backward: _binary_cr("mish_backward"),
    aten.sigmoid_backward: _binary_cr("sigmoid_backward"), aten.tanh_backward: _binary_cr("tanh_backward"),
    aten.glu: _glu, aten.glu_backward: _glu_backward, aten.atan2: _binary_cr("atan2"),
    aten.hypot: _binary_cr("hypot"), aten.logaddexp: _binary_cr("logaddexp"), aten.pow: _pow,
    aten.sqrt: _numpy_ieee(np.sqrt, torch.sqrt), aten.fmod: _numpy_ieee(np.fmod, torch.fmod),
    aten.remainder: _numpy_ieee(np.remainder, torch.remainder),
    aten.add: _add, aten.sub: _sub, aten.addcmul: _addcmul, aten.addcdiv: _addcdiv, aten.lerp: _lerp,
    aten.sum: _sum, aten.mean: _mean, aten.var: _var, aten.std: _std, aten.var_mean: _var_mean,
    aten.std_mean: _std_mean, aten.prod: _prod, aten.cumsum: _cumsum, aten.cumprod: _cumprod,
    aten.logsumexp: _logsumexp, aten.logcumsumexp: _logcumsumexp, aten.linalg_vector_norm: _vector_norm,
    aten.norm: _norm, aten._cdist_forward: _cdist, aten._cdist_backward: _cdist_backward, aten._pdist_forward: _pdist,
    aten._pdist_backward: _pdist_backward, aten.embedding_renorm_: _embedding_renorm_,
    aten._trilinear: _trilinear, aten._embedding_bag: _embedding_bag, aten._ctc_loss: _ctc_loss,
    aten._ctc_loss_backward: _ctc_loss_backward,
    aten._embedding_bag_backward: _embedding_bag_backward,
    aten._embedding_bag_per_sample_weights_backward: _embedding_bag_per_sample_weights_backward,
    aten.mm: _mm, aten.bmm: _mm, aten.mv: _mm, aten.dot: _dot, aten.addmm: _addmm, aten.baddbmm: _baddbmm,
    aten.addbmm: _addbmm, aten.addmv: _addmv,
    aten.convolution: _convolution, aten.convolution_backward: _convolution_backward,
    aten.index_put: _index_put, aten.index_put_: _index_put_, aten._index_put_impl_: _index_put_,
    aten.index_add: _index_add, aten.index_add_: lambda mode, *a, **kw: _index_add(mode, *a, **kw, inplace=True),
    aten.scatter_add: _scatter_add,
    aten.scatter_add_: lambda mode, *a, **kw: _scatter_add(mode, *a, **kw, inplace=True),
    aten.max_pool2d_with_indices_backward: lambda mode, *a: _max_pool_backward(mode, *a, d=2),
    aten.max_pool3d_with_indices_backward: lambda mode, *a: _max_pool_backward(mode, *a, d=3),
    aten.adaptive_max_pool2d_backward: lambda mode, *a: _max_pool_backward(mode, *a, d=2),
    aten.adaptive_max_pool3d_backward: lambda mode, *a: _max_pool_backward(mode, *a, d=3),
    aten.avg_pool2d: lambda mode, *a, **kw: _avg_pool(mode, *a, **kw, d=2),
    aten.avg_pool3d: lambda mode, *a, **kw: _avg_pool(mode, *a, **kw, d=3),
    aten.avg_pool2d_backward: lambda mode, *a, **kw: _avg_pool_backward(mode, *a, **kw, d=2),
    aten.avg_pool3d_backward: lambda mode, *a, **kw: _avg_pool_backward(mode, *a, **kw, d=3),
    aten._adaptive_avg_pool2d: lambda mode, *a, **kw: _adaptive_avg_pool(mode, *a, **kw, d=2),
    aten._adaptive_avg_pool3d: lambda mode, *a, **kw: _adaptive_avg_pool(mode, *a, **kw, d=3),
    aten._adaptive_avg_pool2d_backward: lambda mode, *a, **kw: _adaptive_avg_pool_backward(mode, *a, **kw, d=2),
    aten._adaptive_avg_pool3d_backward: lambda mode, *a, **kw: _adaptive_avg_pool_backward(mode, *a, **kw, d=3),
    aten._scaled_dot_product_flash_attention_for_cpu: _flash,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _flash_backward,
    aten._scaled_dot_product_efficient_attention: _efficient,
    aten._scaled_dot_product_efficient_attention_backward: _efficient_backward,
    aten._scaled_dot_product_attention_math: _attention_math_op,
    aten.native_dropout: _dropout, aten.rrelu_with_noise: _rrelu_with_noise,
    aten.multi_margin_loss: _multi_margin_loss, aten.multi_margin_loss_backward: _multi_margin_loss_backward,
})
#: torch's decompositions evaluated directly (see "normalisations and softmax"), by overload: their
#: out= forms keep the decomposition.
DIRECT: dict[Any, Callable] = {
    aten.native_batch_norm.default: _native_batch_norm,
    aten._native_batch_norm_legit.default: _native_batch_norm,
    aten._native_batch_norm_legit.no_stats: _batch_norm_no_stats,
    aten._native_batch_norm_legit_no_training.default: _batch_norm_legit_no_training,
    aten._native_batch_norm_legit_functional.default: _batch_norm_legit_functional,
    aten.native_batch_norm_backward.default: _batch_norm_backward,
    aten.batch_norm_backward.default: _batch_norm_backward,
    aten.native_layer_norm.default: _native_layer_norm,
    aten.native_layer_norm_backward.default: _native_layer_norm_backward,
    aten._softmax.default: _softmax_op,
    aten._softmax_backward_data.default: _softmax_backward_data,
    aten.embedding_dense_backward.default: _embedding_dense_backward,
}
for _kind in ("nearest1d", "nearest2d", "nearest3d", "linear1d", "bilinear2d", "bicubic2d", "trilinear3d"):
    _fwd = getattr(aten, f"upsample_{_kind}")
    IMPLEMENTED[getattr(aten, f"upsample_{_kind}_backward")] = _upsample_backward(_fwd)
for _kind in ("nearest_exact1d", "nearest_exact2d", "nearest_exact3d", "bilinear2d_aa"):
    _fwd = getattr(aten, f"_upsample_{_kind}")
    IMPLEMENTED[getattr(aten, f"_upsample_{_kind}_backward")] = _upsample_backward(_fwd)
for _d in (1, 2, 3):
    IMPLEMENTED[getattr(aten, f"replication_pad{_d}d_backward")] = _replication_pad_backward(
        getattr(aten, f"replication_pad{_d}d"))
IMPLEMENTED[aten._weight_norm_interface_backward] = _weight_norm_interface_backward
IMPLEMENTED[aten.grid_sampler_2d_backward] = _grid_sampler_2d_backward
_RANDOM = frozenset({aten.rand, aten.randn, aten.rand_like, aten.randn_like, aten.bernoulli, aten.bernoulli_,
                     aten.uniform, aten.uniform_, aten.normal, aten.normal_, aten.exponential_, aten.log_normal_,
                     aten.cauchy_, aten.geometric_})
#: prims (which torch's decompositions emit) with an aten twin here.
_PRIMS = {getattr(prims, name): IMPLEMENTED[getattr(aten, name)] for name in
          ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
           "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "rsqrt", "lgamma", "atan2", "hypot",
           "pow", "sum", "prod", "sqrt", "fmod", "remainder")
          if hasattr(prims, name)}

#: What torch computes the same way on every host (IEEE operations of one rounding, exact
#: selections, data movement, conversions, factories): run by torch itself.
NATIVE = frozenset({
    aten.add, aten.sub, aten.mul, aten.div, aten.neg, aten.abs, aten.reciprocal, aten.rsub, aten.square,
    aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge, aten.logical_and, aten.logical_or, aten.logical_not,
    aten.logical_xor, aten.isnan, aten.isinf, aten.isfinite, aten.isposinf, aten.isneginf, aten.signbit,
    aten.where, aten.masked_fill, aten.clamp, aten.clamp_min, aten.clamp_max, aten.maximum, aten.minimum, aten.fmax,
    aten.fmin, aten.relu, aten.threshold, aten.threshold_backward, aten.hardtanh, aten.hardtanh_backward,
    aten.leaky_relu, aten.leaky_relu_backward, aten.hardshrink, aten.hardshrink_backward, aten.softshrink,
    aten.softshrink_backward, aten._prelu_kernel, aten._prelu_kernel_backward, aten.sign, aten.sgn, aten.floor,
    aten.ceil, aten.round, aten.trunc, aten.frac, aten.copysign, aten.nextafter,
    aten.max, aten.min, aten.amax, aten.amin, aten.argmax, aten.argmin, aten.sort, aten.topk, aten.cat, aten.stack,
    aten.index, aten.index_select, aten.gather, aten.scatter, aten.index_fill, aten.masked_select,
    aten.masked_scatter, aten.take, aten.embedding, aten.constant_pad_nd, aten.reflection_pad1d,
    aten.reflection_pad2d, aten.reflection_pad3d, aten.replication_pad1d, aten.replication_pad2d,
    aten.replication_pad3d, aten.expand, aten.repeat, aten.flip, aten.roll, aten.tril, aten.triu, aten.diag_embed,
    aten.nonzero, aten.unique_dim, aten._unique2, aten.zero_, aten.fill_, aten.fill, aten.clone, aten.detach,
    aten.alias, aten.copy_, aten._to_copy, aten.to, aten.lift_fresh, aten.lift_fresh_copy, aten._local_scalar_dense,
    aten.is_nonzero, aten.equal, aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
    aten.new_empty_strided, aten.zeros, aten.zeros_like, aten.ones, aten.ones_like, aten.new_zeros, aten.new_ones,
    aten.full, aten.full_like, aten.new_full, aten.scalar_tensor, aten.arange, aten.eye, aten.max_pool2d_with_indices,
    aten.max_pool3d_with_indices, aten.adaptive_max_pool2d, aten.adaptive_max_pool3d, aten.upsample_nearest1d,
    aten.upsample_nearest2d, aten.upsample_nearest3d, aten._upsample_nearest_exact1d,
    aten._upsample_nearest_exact2d, aten._upsample_nearest_exact3d, aten.im2col, aten.col2im, aten.pixel_shuffle,
    aten.pixel_unshuffle, aten.split, aten.split_with_sizes, aten.unbind, aten.unsafe_split,
    aten.unsafe_split_with_sizes, aten.select_backward, aten.slice_backward, aten.diagonal_backward, aten.one_hot,
    aten.resize_, aten.set_, aten.view, aten._unsafe_view, aten.reshape, aten.contiguous, aten.t, aten.transpose,
    aten.permute, aten.squeeze, aten.unsqueeze, aten.slice, aten.select, aten.as_strided, aten.diagonal,
    aten.unfold, aten._reshape_alias, aten.diag, aten.atleast_1d, aten.atleast_2d, aten.atleast_3d, aten.pad,
    aten.logical_not, aten.bitwise_and, aten.bitwise_or, aten.bitwise_not,
    aten.bitwise_xor, aten.count_nonzero, aten.any, aten.all, aten.isin, aten.bucketize, aten.searchsorted,
    aten.histc, aten.sym_size, aten.sym_stride, aten.sym_numel, aten.sym_storage_offset, aten.masked_fill_,
    prims.convert_element_type, prims.broadcast_in_dim, prims.squeeze, prims.view_of, prims.where, prims.div,
    prims.mul, prims.add, prims.sub, prims.neg, prims.abs, prims.eq, prims.ne, prims.lt, prims.le,
    prims.gt, prims.ge, prims.maximum, prims.minimum, prims.reshape, prims.transpose, prims.collapse_view,
    prims.split_dim, prims.amax, prims.amin, prims.full, prims.iota, prims.clone, prims.copy_to,
    prims.empty_strided, prims.reciprocal,
})


class Binary32Mode(TorchDispatchMode):
    """Inside ``with Binary32Mode():`` torch's operations on binary32 tensors give the same bits on
    every host (see the module's docstring for how each is computed). ``host`` counts, by
    operation, the calls computed by torch's own kernel for want of a model (their bits may
    depend on the host); ``strict=True`` raises NotImplementedError for them instead.
    ``flags_seen`` is the OR of the events (INVALID, DIVBYZERO, OVERFLOW) the elementwise
    functions raised.

    Like DeviceMode it opts out of the ``torch._disable_dynamo`` wrapper torch puts around a
    dispatch mode's ``__torch_dispatch__``: an eager mode, whose every operation would pay an
    eval-frame switch."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __init__(self, *, strict: bool = False) -> None:
        super().__init__()
        self.strict = strict
        self.host: collections.Counter[str] = collections.Counter()
        self.flags_seen = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        how = _HOW.get(func)
        if how is None:
            how = _HOW[func] = _how(func)
        kind, impl, names = how
        if kind == "native" or not _touches32(args, kwargs):  # torch's kernel either way
            return func(*args, **kwargs)
        if kind != "other":
            outs, rest = (), kwargs
            if names:
                outs = [kwargs[n] for n in names if isinstance(kwargs.get(n), torch.Tensor)]
                rest = {k: v for k, v in kwargs.items() if k not in names}
            result = _draw(self, func, args, rest) if kind == "random" else impl(self, *args, **rest)
            if result is not NotImplemented:
                if outs:
                    return _write_outs(outs, result)
                if kind == "inplace" and not _returns_own(result, args):
                    return args[0].copy_(result)
                return result
            native = _IEEE.get(func)
            if native is None:
                native = _IEEE[func] = _functional(func) in NATIVE
            if native:
                return func(*args, **kwargs)  # not ours to model (another dtype): an IEEE operation
        decomposition = decomposition_table.get(func)
        if decomposition is not None:
            with self:
                return decomposition(*args, **kwargs)
        if self.strict:
            raise NotImplementedError(f"{func} has no host-independent binary32 model (Binary32Mode(strict=True))")
        self.host[str(func)] += 1
        return func(*args, **kwargs)


def _functional(func) -> Any:
    """The functional packet of an in-place overload (``aten.add_`` -> ``aten.add``), else its own."""
    name = func._schema.name.split("::")[-1]
    if name.endswith("_") and not name.startswith("_"):
        return getattr(aten, name[:-1], func.overloadpacket)
    return func.overloadpacket


def _how(func) -> tuple[str, Callable | None, tuple[str, ...]]:
    """How :class:`Binary32Mode` computes an overload, decided once: ("random", None, outs), ("impl"
    or "inplace", its model, outs: an in-place twin computes its functional op's model and writes it
    into self), ("native", None, ()) for IEEE operations and views, or ("other", None, ()): torch's
    decomposition, else its kernel. ``outs``: the out= arguments, whatever their names (out,
    grad_input, output, buffer...)."""
    packet, functional = func.overloadpacket, _functional(func)
    if func in DIRECT:
        return "impl", DIRECT[func], ()
    names = _out_names(func)
    if packet in _RANDOM:
        return "random", None, names
    impl = IMPLEMENTED.get(packet) or _PRIMS.get(packet)
    if impl is not None:
        return ("inplace" if functional is not packet else "impl"), impl, names
    if packet in NATIVE or functional in NATIVE or func.is_view or torch.Tag.inplace_view in func.tags:
        return "native", None, ()
    impl = IMPLEMENTED.get(functional)
    if impl is not None and not names:
        return "inplace", impl, ()
    return "other", None, ()


def _out_names(func) -> tuple[str, ...]:
    """An overload's out= arguments, whatever their names (out, grad_input, output, buffer...):
    written, not read."""
    names = _OUT_NAMES.get(func)
    if names is None:
        names = _OUT_NAMES[func] = tuple(a.name for a in func._schema.arguments
                                         if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)
    return names


_OUT_NAMES: dict[Any, tuple[str, ...]] = {}
_HOW: dict[Any, tuple[str, Callable | None, tuple[str, ...]]] = {}  # each overload's _how, as first met
_IEEE: dict[Any, bool] = {}  # each overload's functional op in NATIVE, as first asked


def _write_outs(outs: list[torch.Tensor], result):
    """An out= overload's results written into its out tensors (resized as torch resizes them)."""
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    for out, r in zip(outs, results, strict=True):
        out.resize_(r.shape).copy_(r)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _returns_own(result, args) -> bool:
    return isinstance(result, torch.Tensor) and bool(args) and result is args[0]


def _touches32(args, kwargs) -> bool:
    """A binary32 tensor among the arguments, or a binary32 result asked for."""
    for xs in (args, kwargs.values()):
        for x in xs:
            if isinstance(x, torch.Tensor):
                if x.dtype == _F32:
                    return True
            elif isinstance(x, (list, tuple)):
                if any(isinstance(t, torch.Tensor) and t.dtype == _F32 for t in x):
                    return True
            elif x is _F32:
                return True
    return False


def _operands(args, kwargs) -> list[torch.Tensor]:
    found = []
    for xs in (args, kwargs.values()):
        for x in xs:
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                found.append(x)
            elif isinstance(x, (list, tuple)):
                found.extend(t for t in x if isinstance(t, torch.Tensor) and t.is_floating_point())
    return found


def evaluate(func, args, kwargs) -> tuple[Any, int]:
    """``func`` on binary32 operands as :class:`Binary32Mode` computes it: its result and the
    events it raises (see :func:`run`)."""
    kind = _KIND.get(func)
    if kind is None:
        kind = _KIND[func] = (_out_names(func), func.overloadpacket in _ELEMENTWISE, torch.Tag.pointwise in func.tags,
                              _POLES.get(func.overloadpacket), _JUDGED.get(func.overloadpacket))
    outs, elementwise, pointwise, poles, judged = kind  # out= tensors are written, not read: not operands
    operands = _operands(args, {k: v for k, v in kwargs.items() if k not in outs} if outs else kwargs)
    how = _HOW.get(func)
    if how is None:
        how = _HOW[func] = _how(func)
    if how[0] == "native":  # torch's own kernel, which is what the mode would call: no mode to enter
        out = func(*args, **kwargs)
        return out, _judge(out, _NO_FLAGS, operands, elementwise, pointwise, poles, judged)
    if how[0] == "impl" and not how[2] and _touches32(args, kwargs):
        # The model called as the mode's dispatch would call it (a handler runs with the mode off;
        # DeviceMode calls this from its own handler, below autograd), without a round trip
        # through torch's dispatcher.
        mode = Binary32Mode()
        out = how[1](mode, *args, **kwargs)
        if out is not NotImplemented:
            return out, _judge(out, mode, operands, elementwise, pointwise, judged=judged)
    return run(lambda: func(*args, **kwargs), operands, elementwise, pointwise, poles, judged)


#: Operations whose first outputs alone are results, by packet: how many. The others are working
#: values kept for the backward whose infinities are meant (CTC's log-space alphas are -inf where no
#: alignment reaches), not events.
_JUDGED = {aten._ctc_loss: 1}


class _Flags:
    """A mode's record of the elementwise functions' flags, for a computation that took none."""

    flags_seen = 0


_NO_FLAGS = _Flags()  # the record of a computation no modelled function took part in

#: Functions torch computes in one kernel, with the poles among their floating operand's values: an
#: infinite result there is IEEE 754's division by zero (an exact infinity from finite operands,
#: section 7.3), not an overflow. torch 2.13's digamma is -inf at +0 and inf at -0 (NaN at the
#: negative integers); polygamma(n >= 1, x) is inf at every integer x <= 0.
_POLES: dict[Any, Callable[[torch.Tensor], torch.Tensor]] = {
    aten.digamma: lambda x: x == 0,
    aten.polygamma: lambda x: (x <= 0) & (x == torch.floor(x)),
}

#: Each overload's out= names, whether it is elementwise (sim.elementary's) and pointwise (torch's tag),
#: its poles (``_POLES``, or None) and how many of its outputs are judged (``_JUDGED``; None: all).
_KIND: dict[Any, tuple[tuple[str, ...], bool, bool, Any, int | None]] = {}


def run(fn: Callable[[], Any], operands: list[torch.Tensor], elementwise: bool = False,
        pointwise: bool = False, poles: Callable[[torch.Tensor], torch.Tensor] | None = None,
        judged: int | None = None) -> tuple[Any, int]:
    """``fn()`` computed in :class:`Binary32Mode`: its result and the events the float-status
    register records, judged at the outputs. An elementwise function's are its own, element by
    element (sim.elementary's). For any other computation: OVERFLOW where an output is infinite
    while its floating operands are finite (DIVBYZERO instead where only poles were met: log(0),
    a division by zero), and INVALID where an output is NaN while no operand is NaN; for a
    ``pointwise`` computation (torch's tag: each output element a function of the operands'
    elements at its place, broadcast) element by element, so that a NaN elsewhere in the tensor
    hides nothing, for any other over the whole call. An overflow inside a kernel whose outputs
    stay finite raises nothing: the register sees what reaches them. ``poles``: where a pointwise
    function of one operand has its poles (``_POLES``): an infinite output there is DIVBYZERO.
    ``judged``: only the first outputs are results (``_JUDGED``); None: all."""
    mode = Binary32Mode()
    with mode:
        out = fn()
    return out, _judge(out, mode, operands, elementwise, pointwise, poles, judged)


def judge(out, operands: list[torch.Tensor], flags: int = 0) -> int:
    """The events of a binary32 computation made without a mode (numpy's: ``sim.recurrent``) whose
    result is ``out``, as :func:`run` judges a computation that is not pointwise; ``flags`` the
    elementwise functions' flags it raised."""
    seen = _Flags()
    seen.flags_seen = flags
    return _judge(out, seen, operands, False, False)


def _judge(out, mode: Binary32Mode | _Flags, operands: list[torch.Tensor], elementwise: bool, pointwise: bool,
           poles: Callable[[torch.Tensor], torch.Tensor] | None = None, judged: int | None = None) -> int:
    """The events of a computation in ``mode`` whose result is ``out`` (see :func:`run`)."""
    if elementwise:
        return mode.flags_seen
    outs = [o for o in (list(out) if isinstance(out, (tuple, list)) else [out])[:judged]
            if isinstance(o, torch.Tensor) and o.is_floating_point()]
    events = 0
    finite = nan_free = None  # the operands', looked at only for an output that is not finite
    for o in outs:
        if _all_finite(o):
            continue
        if pointwise:
            try:
                places = [torch.broadcast_to(t, o.shape) for t in operands]
            except RuntimeError:  # operands that do not broadcast to this output: judged as a whole
                pass
            else:
                finite_at = torch.ones(o.shape, dtype=torch.bool)
                number_at = torch.ones(o.shape, dtype=torch.bool)
                for t in places:
                    finite_at &= torch.isfinite(t)
                    number_at &= ~torch.isnan(t)
                infinite = torch.isinf(o) & finite_at
                if poles is not None and len(operands) == 1 and bool(infinite.any()):
                    at = torch.broadcast_to(poles(operands[0]), o.shape)
                    events |= (_DIVBYZERO if bool((infinite & at).any()) else 0) | (
                        _OVERFLOW if bool((infinite & ~at).any()) else 0)
                elif bool(infinite.any()):
                    pole = mode.flags_seen & _DIVBYZERO and not mode.flags_seen & _OVERFLOW
                    events |= _DIVBYZERO if pole else _OVERFLOW
                if bool((torch.isnan(o) & number_at).any()):
                    events |= _INVALID
                continue
        if finite is None:
            finite = all(_all_finite(t) for t in operands)
            nan_free = finite or not any(bool(torch.isnan(t).any()) for t in operands)
        if finite and bool(torch.isinf(o).any()):
            pole = mode.flags_seen & _DIVBYZERO and not mode.flags_seen & _OVERFLOW
            events |= _DIVBYZERO if pole else _OVERFLOW
        if nan_free and bool(torch.isnan(o).any()):
            events |= _INVALID
    return events


def _all_finite(t: torch.Tensor) -> bool:
    """No infinity or NaN in t (numpy's test where it can read t: faster than torch's for small tensors)."""
    if t.dtype in (_F32, _F64, torch.float16) and t.layout == torch.strided and t.device.type == "cpu":
        try:
            a = t.detach().numpy()
        except (RuntimeError, TypeError):  # a tensor numpy cannot view (a negative or conjugate bit set)
            pass
        else:  # numpy's isfinite for small arrays and binary64, one pass without a temporary for large ones
            return bool(np.isfinite(a).all()) if a.size < 4096 or t.dtype == _F64 else elementary.specials(a) == 0
    return bool(torch.isfinite(t).all())


_ELEMENTWISE = frozenset({getattr(aten, name) for name in _UNARY if hasattr(aten, name)} | {
    aten.gelu, aten.gelu_backward, aten.elu, aten.elu_backward, aten.softplus, aten.softplus_backward,
    aten.silu_backward, aten.mish_backward, aten.sigmoid_backward, aten.tanh_backward, aten.atan2, aten.hypot,
    aten.logaddexp, aten.pow, aten.addcmul, aten.addcdiv, aten.lerp, aten.log_sigmoid_backward})
