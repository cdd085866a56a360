"""Binary32 arithmetic whose every bit is a function of the operands: for references and the
binary32 kernels of the bridges.

numpy's matmul goes through the BLAS, whose kernel (chosen by the CPU, ``OPENBLAS_CORETYPE``,
the thread count) fixes the order of the additions; numpy's and torch's float32 transcendentals
differ by vector width and by a tensor's length. Here the order and the roundings are fixed:

- :func:`matmul`: each output's products added along k in ascending order from +0 (or from an
  initial value), each step ``acc + a * b`` rounded once to binary32 to nearest even (the IEEE
  fused multiply-add, as the cube unit's binary32 accumulation); stacks broadcast as numpy's.
- :func:`sum`, :func:`mean`: the device's pairwise tree (adjacent pairs, then pairs of pairs),
  each addition rounded to binary32 to nearest even, IEEE inside (an infinity or NaN stays one);
  the mean is the sum divided by the count with one rounding.
- :func:`apply`: the functions of :mod:`sim.elementary`, each its exact value rounded once.

Elementwise ``+ - * /`` and ``sqrt`` are IEEE operations, the same everywhere: numpy's serve.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from . import elementary
from . import kernels as K

__all__ = ["matmul", "sum", "mean", "moments", "apply"]

_F32 = np.dtype(np.float32)


def _wide(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == _F32:
        return x
    if x.dtype.itemsize > 4 or (x.dtype.kind != "f" and x.dtype.name != "bfloat16"):
        raise TypeError(f"binary32 arithmetic takes float16, bfloat16 or float32 operands, got {x.dtype}")
    return x.astype(np.float32)  # exact


def matmul(a, b, init=None) -> np.ndarray:
    """``init + a @ b`` in binary32, in order along k (see the module); ``a`` (..., M, K), ``b``
    (..., K, N) of float16, bfloat16 or float32, their leading dimensions broadcast; ``init``
    (broadcasting to the result) the sums' initial values, +0 without it. 1-d operands as numpy's
    matmul takes them."""
    a, b = _wide(a), _wide(b)
    va, vb = a.ndim == 1, b.ndim == 1
    a2 = a[None, :] if va else a
    b2 = b[:, None] if vb else b
    if a2.ndim < 2 or b2.ndim < 2 or a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"matmul needs shapes (..., M, K) and (..., K, N), got {a.shape} and {b.shape}")
    lead = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    m, n = a2.shape[-2], b2.shape[-1]
    sa = np.broadcast_to(a2, lead + a2.shape[-2:]).reshape(-1, *a2.shape[-2:])
    sb = np.broadcast_to(b2, lead + b2.shape[-2:]).reshape(-1, *b2.shape[-2:])
    out = np.zeros((len(sa), m, n), np.float32)
    if init is not None:
        out[...] = np.broadcast_to(_wide(init), lead + (m, n)).reshape(-1, m, n)
    _matmul_stack(np.ascontiguousarray(sa), np.ascontiguousarray(sb), out)
    out = out.reshape(lead + (m, n))
    if va:
        out = out[..., 0, :]
    if vb:
        out = out[..., 0]
    return out


def _columns(x: np.ndarray, axis) -> tuple[np.ndarray, tuple[int, ...], int]:
    """x as (A, C, B) for the trees: each kept element's column c, its reduced elements the rows
    a * B + b in row-major order of the reduced axes (read in place where the reduced axes lie
    around one block of kept ones, else a transposed copy); also the reduced axes and their count."""
    if axis is None:
        axes = tuple(range(x.ndim))
    elif isinstance(axis, int | np.integer):
        axes = (int(axis) % max(x.ndim, 1),)
    else:
        axes = tuple(sorted({int(a) % max(x.ndim, 1) for a in axis}))
    rest = tuple(d for d in range(x.ndim) if d not in axes)
    n = math.prod(x.shape[d] for d in axes)
    kept = math.prod(x.shape[d] for d in rest)
    if not rest or rest == tuple(range(rest[0], rest[-1] + 1)):  # reduced axes around one kept block
        lead = rest[0] if rest else x.ndim
        return x.reshape(math.prod(x.shape[:lead]), kept, math.prod(x.shape[lead + len(rest):])), axes, n
    return np.transpose(x, axes + rest).reshape(n, kept, 1), axes, n


def _shaped(r: np.ndarray, x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """A reduction's values (one per kept element) in its result's shape."""
    if keepdims:
        return r.reshape([1 if d in axes else x.shape[d] for d in range(x.ndim)])
    return r.reshape([x.shape[d] for d in range(x.ndim) if d not in axes])


@K.jit
def _matmul_stack(a, b, out):
    """out[i] += a[i] @ b[i] for each matrix of the stacks, in order along k (kernels.matmul32)."""
    for i in range(a.shape[0]):
        K.matmul32(a[i], b[i], out[i])


def _reduce(x, axis, keepdims: bool, mean: bool) -> np.ndarray:
    x = _wide(x)
    v, axes, n = _columns(x, axis)
    r = np.empty(v.shape[1], np.float32)
    exact = mean and 0 < n < 2**24  # a count binary32 holds: the division in the kernel
    K.tree32(v, r, np.float32(n if exact else 0))
    if mean and not exact:
        r = _divide(r, n) if n else np.full_like(r, _NAN)  # the mean of nothing is NaN
        r[np.isnan(r)] = _NAN
    return _shaped(r, x, axes, keepdims)


def moments(x, axis=None, keepdims: bool = False, correction: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(variance, mean) over ``axis`` in two passes: :func:`mean`, then the tree sum of the squared
    deviations (each ``d * d`` of ``d = x - mean`` one rounding) divided by ``n - correction``
    (at least 0) with one rounding; a NaN the canonical quiet NaN."""
    x = _wide(x)
    v, axes, n = _columns(x, axis)
    if not 0 < n < 2**24:  # the mean's division outside the kernel
        m = _reduce(x, axis, True, True)
        with np.errstate(all="ignore"):
            d = x - m
            var = np.asarray(sum(d * d, axis, keepdims) / np.float32(max(n - correction, 0)), np.float32)
        var = np.where(np.isnan(var), _NAN, var)
        return var, m if keepdims else _shaped(m, x, axes, False)
    mean, var = np.empty(v.shape[1], np.float32), np.empty(v.shape[1], np.float32)
    _moments32(v, mean, var, np.float32(n), np.float32(max(n - correction, 0)))
    return _shaped(var, x, axes, keepdims), _shaped(mean, x, axes, keepdims)


@K.jit
def _moments32(v, mean, var, count, divisor):
    K.tree32(v, mean, count)
    na, cols, nb_ = v.shape
    d = np.empty((na, 1, nb_), np.float32)
    ss = np.empty(1, np.float32)
    for c in range(cols):
        m = mean[c]
        for a in range(na):
            for j in range(nb_):
                t = v[a, c, j] - m
                d[a, 0, j] = t * t
        K.tree32(d, ss, np.float32(0))
        q = ss[0] / divisor
        var[c] = q if q == q else np.float32(np.nan)


_NAN = np.float32(np.nan)  # 0x7fc00000: a sum's NaN, whatever NaN the host's addition propagates


def _divide(total: np.ndarray, n: int) -> np.ndarray:
    """total / n rounded once to binary32, for a count binary32 does not hold exactly: the exact
    quotient rounded to odd at 53 bits, whose rounding to binary32 is then the exact quotient's
    (53 > 24 + 1). One column per 2**24 elements summed: a loop over columns costs nothing here."""
    out = np.empty(total.shape, np.float32)
    for i, t in enumerate(total.tolist()):
        if not math.isfinite(t) or t == 0:
            out[i] = t / n  # Inf, NaN, and a zero keeping its sign
            continue
        exact = Fraction(t) / n
        q = float(exact)  # correctly rounded (CPython's int / int)
        if Fraction(q) != exact and int(np.float64(q).view(np.uint64)) % 2 == 0:
            q = float(np.nextafter(q, math.inf if Fraction(q) < exact else -math.inf))
        out[i] = q
    return out


def sum(x, axis=None, keepdims: bool = False) -> np.ndarray:  # noqa: A001 (numpy's name)
    """The sum over ``axis`` (an int, a tuple, or None for all) in the pairwise tree, binary32."""
    return _reduce(x, axis, keepdims, mean=False)


def mean(x, axis=None, keepdims: bool = False) -> np.ndarray:
    """:func:`sum` divided by the count, one rounding (the mean of nothing is NaN)."""
    return _reduce(x, axis, keepdims, mean=True)


def apply(name: str, *operands, params: tuple[float, ...] = ()) -> np.ndarray:
    """The function ``name`` of :data:`sim.elementary.FUNCTIONS`, its exact value rounded once to
    binary32 (``elementary.evaluate`` without the flags)."""
    return elementary.evaluate(name, *operands, params=params)[0]


# -- normalisation loops -----------------------------------------------------------------------------
# The elementwise steps of torch's batch and layer norm decompositions fused into one pass each: the
# same IEEE binary32 operations in the same order (numba compiles no contraction into fused
# multiply-adds and no reassociation), so the same bits as the decompositions' separate tensor
# operations, without a pass over memory for each. A NaN result is the canonical quiet NaN: which
# NaN an operation propagates differs between CPUs (x86's default NaN is negative, Arm's positive).
@K.jit
def norm_apply(x, mean, scale, w, b, has_w, has_b, per_row, out):
    """out = ((x - mean) * scale) [* w] [+ b] over x (A, C, B): mean and scale per channel c
    (batch norm: w and b per c too) or, ``per_row``, per row a with w and b per column j of the
    flattened C * B (layer norm, C == 1)."""
    na, nc, nb_ = x.shape
    for a in range(na):
        for c in range(nc):
            k = a if per_row else c
            m, s = mean[k], scale[k]
            for j in range(nb_):
                o = (x[a, c, j] - m) * s
                if has_w:
                    o = o * (w[j] if per_row else w[c])
                if has_b:
                    o = o + (b[j] if per_row else b[c])
                out[a, c, j] = o if o == o else _NAN


@K.jit
def batch_norm_terms(g, x, mean, out):
    """out = g * (x - mean[c]) over (A, C, B): the terms of batch norm's dot product."""
    na, nc, nb_ = x.shape
    for a in range(na):
        for c in range(nc):
            m = mean[c]
            for j in range(nb_):
                out[a, c, j] = g[a, c, j] * (x[a, c, j] - m)


@K.jit
def batch_norm_grad_input(g, x, mean, proj_scale, grad_mean, grad_scale, train, out):
    """out = ((g - (x - mean) * proj_scale) - grad_mean) * grad_scale in training, else
    g * grad_scale; each per channel c of (A, C, B)."""
    na, nc, nb_ = x.shape
    for a in range(na):
        for c in range(nc):
            m, ps, gm, gs = mean[c], proj_scale[c], grad_mean[c], grad_scale[c]
            for j in range(nb_):
                o = ((g[a, c, j] - (x[a, c, j] - m) * ps) - gm) * gs if train else g[a, c, j] * gs
                out[a, c, j] = o if o == o else _NAN


@K.jit
def layer_norm_terms(g, x, mean, rstd, w, has_w, x_hat, gxh, gxh_x_hat, g_x_hat):
    """Per row m of (M, N): x_hat = (x - mean) * rstd, gxh = g [* w], and their products."""
    nm, nn = x.shape
    for m in range(nm):
        mu, r = mean[m], rstd[m]
        for j in range(nn):
            xh = (x[m, j] - mu) * r
            gv = g[m, j]
            t = gv * w[j] if has_w else gv
            x_hat[m, j] = xh
            gxh[m, j] = t
            gxh_x_hat[m, j] = t * xh
            g_x_hat[m, j] = gv * xh


@K.jit
def layer_norm_grad_input(gxh, x_hat, rstd, row_sum, row_dot, n, out):
    """out = (rstd / n) * (((gxh * n) - row_sum) - x_hat * row_dot), per row of (M, N)."""
    nm, nn = x_hat.shape
    for m in range(nm):
        scale, bs, ds = rstd[m] / n, row_sum[m], row_dot[m]
        for j in range(nn):
            o = scale * ((gxh[m, j] * n - bs) - x_hat[m, j] * ds)
            out[m, j] = o if o == o else _NAN
