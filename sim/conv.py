"""Convolutions as the cube unit computes them: im2col, then one matrix product per group
(a pointwise convolution: per example, the weight times the input, the same sums).

One formulation, shared by the device (:meth:`sim.Device.conv` and its gradients, binary16 or
bfloat16 products into binary32 sums) and the binary32 kernels of :mod:`sim.torch_binary32`
(binary32 products, in the same order); each caller gives the product, ``product(a, b, init)``
for stacks of matrices (g, R, C) @ (g, C, O) with optional initial sums broadcasting to the
result, the stacks' leading dimensions broadcast (a pointwise convolution: (1, O, C) @ (N, C, P)
from (1, O, 1)). Which operand holds the positions (the im2col rows or the kernel's outputs) is
chosen for speed; each output's sum is the same either way.

- **Forward** (:func:`forward`, N-d, grouped, strided, padded, dilated): each output's reduction
  index is (c, kernel taps row-major), c slowest; padded positions are +0 operands.
- **Input gradient and transposed convolution** (:func:`grad_input`): the direct convolution,
  stride 1, of the output gradient with stride - 1 zeros stuffed between its elements and
  dilation * (K - 1) - padding zeros around it, the kernel reversed and its two channel axes
  swapped per group: per input element, (o, taps in ascending dy position), o slowest.
- **Weight gradient** (:func:`grad_weight`): dy^T times x's im2col per group: per weight, (n,
  output position row-major), n slowest.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from .checks import integer, integer_problem, integer_range
from .kernels import inline, jit

__all__ = ["per_dim", "forward", "grad_input", "grad_weight", "transpose", "transpose_size"]

Product = Callable[[np.ndarray, np.ndarray, "np.ndarray | None"], np.ndarray]


def per_dim(name: str, v, d: int, low: int) -> tuple[int, ...]:
    """A convolution parameter as one integer per spatial dimension."""
    vs = tuple(v) if isinstance(v, (tuple, list)) else (v,) * d
    if len(vs) == 1:
        vs = vs * d
    if len(vs) != d or any(integer_problem(name, e, low) for e in vs):
        raise ValueError(f"conv: {name} must be {integer_range(low, None, f'{d} of them')}, got {v!r}")
    return tuple(int(e) for e in vs)


def check_shapes(name: str, x: np.ndarray, w: np.ndarray, groups: int) -> int:
    """The number of spatial dimensions of x (N, C, *S) and w (O, C / groups, *K), checked."""
    d = x.ndim - 2
    groups = integer(f"{name}: groups", groups, 1)
    if (d < 1 or w.ndim != x.ndim or x.shape[1] != w.shape[1] * groups or w.shape[0] % groups):
        raise ValueError(f"{name} needs x (N, C, *S) and w (O, C/groups, *K) with O divisible by groups, "
                         f"got {x.shape}, {w.shape}, groups={groups}")
    return d


def pad(x: np.ndarray, lo, hi) -> np.ndarray:
    """x with lo[i] / hi[i] +0s before / after spatial axis i (cropped where negative)."""
    if not any(lo) and not any(hi):
        return x
    inner = x[(slice(None), slice(None), *(slice(max(-a, 0), x.shape[i + 2] - max(-b, 0))
                                           for i, (a, b) in enumerate(zip(lo, hi, strict=True))))]
    shape = [s + max(a, 0) + max(b, 0) for s, a, b in zip(inner.shape[2:], lo, hi, strict=True)]
    out = np.zeros((*x.shape[:2], *shape), x.dtype)
    out[(slice(None), slice(None), *(slice(max(a, 0), max(a, 0) + s) for a, s in zip(lo, inner.shape[2:],
                                                                                     strict=True)))] = inner
    return out


def output_shape(shape, k, stride, padding, dilation) -> list[int]:
    """The spatial shape of a convolution's output for an input of ``shape`` (N, C, *S); a kernel
    larger than the padded input is refused."""
    spans = [di * (ki - 1) + 1 for di, ki in zip(dilation, k, strict=True)]
    padded = [s + 2 * p for s, p in zip(shape[2:], padding, strict=True)]
    if any(s > size for s, size in zip(spans, padded, strict=True)):
        raise ValueError(f"conv: the kernel {tuple(k)} (dilation {dilation}) is larger than the padded input "
                         f"{tuple(padded)}")
    return [(size - span) // st + 1 for size, span, st in zip(padded, spans, stride, strict=True)]


def im2col(x: np.ndarray, k, stride, padding, dilation, groups: int,
           positions_last: bool = False) -> tuple[np.ndarray, list[int]]:
    """x (N, C, *S) as im2col rows per group, (g, N * prod(OS), C/g * prod(K)): rows in (n, output
    position) order, columns in (c, kernel tap) order, c slowest; and the output shape OS.
    ``positions_last``: the same columns transposed, (g, C/g * prod(K), N * prod(OS)). Small
    geometries gather by a kept index; larger ones of up to three spatial dimensions are copied by
    one compiled loop (padding read as +0, never copied); more, from a strided view of the padded
    input. The same values every way."""
    d = x.ndim - 2
    out_shape = output_shape(x.shape, k, stride, padding, dilation)
    n, c = x.shape[:2]
    if n * c * math.prod(out_shape) * math.prod(k) <= INDEXED:
        xp = np.ascontiguousarray(pad(x, padding, padding))
        index = _im2col_index(xp.shape, tuple(k), tuple(stride), tuple(dilation), groups, tuple(out_shape),
                              positions_last)
        return np.take(xp.reshape(-1), index), out_shape
    if d > 3:
        cols = _im2col_view(x, k, stride, padding, dilation, groups, out_shape)
        return (np.ascontiguousarray(cols.transpose(0, 2, 1)) if positions_last else cols), out_shape
    rows, width = n * math.prod(out_shape), (c // groups) * math.prod(k)
    out = np.empty((groups, width, rows) if positions_last else (groups, rows, width), x.dtype)
    three = lambda v, fill: (fill,) * (3 - d) + tuple(int(e) for e in v)  # noqa: E731  (1 or 2 dims as 3)
    bits = np.dtype(f"u{x.dtype.itemsize}")  # copied as bits: any format, bfloat16 too
    _im2col3(np.ascontiguousarray(x).view(bits).reshape(n, c, *three(x.shape[2:], 1)), three(k, 1),
             three(stride, 1), three(padding, 0), three(dilation, 1), groups, three(out_shape, 1), positions_last,
             out.view(bits).reshape(-1))
    return out, out_shape


#: The most elements whose im2col gathers by a kept index (8 bytes each; a model's convolutions
#: repeat): a gather costs least where the runs are short; larger ones are copied by the loop.
INDEXED = 1 << 18


@functools.lru_cache(maxsize=64)
def _im2col_index(shape: tuple[int, ...], k: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
                  groups: int, out_shape: tuple[int, ...], positions_last: bool) -> np.ndarray:
    """The flat positions in a C-ordered (N, C, *S) array of its im2col rows (see :func:`im2col`;
    ``out_shape`` the output's spatial shape; ``positions_last``: transposed), one gather per
    convolution of that geometry (kept: a model's convolutions repeat)."""
    n, c, sizes = shape[0], shape[1], shape[2:]
    d = len(sizes)
    strides = [math.prod(sizes[i + 1:]) for i in range(d)]  # element strides of the spatial axes
    spatial = np.zeros(out_shape + k, np.int64)  # (*OS, *K): the offset of each output's taps
    for i in range(d):
        pos = np.arange(out_shape[i])[:, None] * stride[i] + np.arange(k[i])[None, :] * dilation[i]
        spatial += (pos * strides[i]).reshape([out_shape[i] if a == i else 1 for a in range(d)]
                                              + [k[i] if a == i else 1 for a in range(d)])
    spatial = spatial.reshape(math.prod(out_shape), math.prod(k))
    cg = c // groups
    base = (np.arange(n)[:, None] * c + np.arange(c)[None, :]) * math.prod(sizes)  # (N, C)
    base = base.reshape(n, groups, cg).transpose(1, 0, 2)  # (g, N, Cg)
    index = base[:, :, None, :, None] + spatial[None, None, :, None, :]  # (g, N, OS, Cg, K)
    index = index.reshape(groups, n * spatial.shape[0], cg * spatial.shape[1])
    if positions_last:
        index = index.transpose(0, 2, 1)
    index = np.ascontiguousarray(index, np.intp)  # take's own index type: no conversion of the index on every call
    index.flags.writeable = False
    return index


def _im2col_view(x: np.ndarray, k, stride, padding, dilation, groups: int, out_shape) -> np.ndarray:
    """:func:`im2col`'s rows copied from a strided view of the padded input (any number of dims)."""
    xp = pad(x, padding, padding)
    d = xp.ndim - 2
    spans = [di * (ki - 1) + 1 for di, ki in zip(dilation, k, strict=True)]
    n, c = xp.shape[:2]
    windows = np.lib.stride_tricks.sliding_window_view(xp, spans, axis=tuple(range(2, d + 2)))
    windows = windows[(slice(None), slice(None), *(slice(None, None, st) for st in stride),
                       *(slice(None, None, di) for di in dilation))]  # (N, C, *OS, *K)
    cols = windows.reshape(n, groups, c // groups, *windows.shape[2:])  # (N, g, Cg, *OS, *K)
    cols = cols.transpose(1, 0, *range(3, d + 3), 2, *range(d + 3, 2 * d + 3))  # (g, N, *OS, Cg, *K)
    rows, width = n * math.prod(out_shape), (c // groups) * math.prod(k)
    return np.ascontiguousarray(cols).reshape(groups, rows, width)


@jit
def _im2col3(x, k, stride, padding, dilation, groups, out_shape, positions_last, out):
    """:func:`im2col` of x (N, C, D, H, W) into ``out`` (flat, in the layout ``positions_last``
    says); k, stride, padding, dilation and the output shape three each. Positions outside the
    input are +0 (zero bits). Each run of outputs along the last axis is a strided run of the
    input between zeroed ends; rows first, one row of positions is done for every column
    before the next, so that its runs stay in cache."""
    n, c, sd, sh, sw = x.shape
    flat = x.reshape(-1)
    kd, kh, kw = k
    od, oh, ow = out_shape
    cg = c // groups
    taps = kd * kh * kw
    rows, width = n * od * oh * ow, cg * taps
    st = stride[2]
    # per column: its channel in the group; its tap's offsets along the three axes; and the
    # outputs [lo, hi) of a run whose inputs lie inside along the last axis
    info = np.empty((width, 6), np.int64)
    for col in range(width):
        t = col % taps
        off = (t % kw) * dilation[2] - padding[2]
        lo = min(ow, max(0, (st - 1 - off) // st))
        info[col, 0] = col // taps
        info[col, 1] = (t // (kh * kw)) * dilation[0] - padding[0]
        info[col, 2] = ((t // kw) % kh) * dilation[1] - padding[1]
        info[col, 3] = off
        info[col, 4] = lo
        info[col, 5] = max(lo, min(ow, (sw - off + st - 1) // st))
    for g in range(groups):
        if positions_last:  # each column's runs in turn: out[g, col, row] at (g * width + col) * rows + row
            for col in range(width):
                ch, dz, dy, off, lo, hi = info[col]
                for b in range(n):
                    for i in range(od):
                        z = i * stride[0] + dz
                        for j in range(oh):
                            y = j * stride[1] + dy
                            a, e = (lo, hi) if 0 <= z < sd and 0 <= y < sh else (0, 0)
                            src = (((b * c + g * cg + ch) * sd + z) * sh + y) * sw + off + a * st
                            _run(flat, out, (g * width + col) * rows + ((b * od + i) * oh + j) * ow, 1, src, st,
                                 a, e, ow)
        else:  # each row of positions in turn: out[g, row, col] at (g * rows + row) * width + col
            for b in range(n):
                for i in range(od):
                    for j in range(oh):
                        row = ((b * od + i) * oh + j) * ow
                        for col in range(width):
                            ch, dz, dy, off, lo, hi = info[col]
                            z, y = i * stride[0] + dz, j * stride[1] + dy
                            a, e = (lo, hi) if 0 <= z < sd and 0 <= y < sh else (0, 0)
                            src = (((b * c + g * cg + ch) * sd + z) * sh + y) * sw + off + a * st
                            _run(flat, out, (g * rows + row) * width + col, width, src, st, a, e, ow)


@inline
def _run(flat, out, at, step, src, st, a, e, ow):
    """out[at + m * step] for m < ow: +0 outside [a, e), flat[src + (m - a) * st] inside. Unsigned
    indices: numba then adds no wraparound test, and a contiguous run vectorises."""
    at, step, src = np.uint64(at), np.uint64(step), np.uint64(src)
    for m in range(np.uint64(a)):
        out[at + m * step] = 0
    at += np.uint64(a) * step
    if st == 1 and step == 1:
        for m in range(np.uint64(e - a)):
            out[at + m] = flat[src + m]
    else:
        for m in range(np.uint64(e - a)):
            out[at + m * step] = flat[src + m * np.uint64(st)]
    at += np.uint64(e - a) * step
    for m in range(np.uint64(ow - max(a, e))):
        out[at + m * step] = 0


def swapped(x: np.ndarray, reverse: bool = False) -> np.ndarray:
    """x (G, P, Q, R) with its axes P and Q swapped, (G, Q, P, R), each run of R reversed if
    ``reverse``: a new C-ordered array (a kernel's transposes, copied in tiles that stay in cache)."""
    bits = np.dtype(f"u{x.dtype.itemsize}")
    out = np.empty((x.shape[0], x.shape[2], x.shape[1], x.shape[3]), x.dtype)
    _swap(np.ascontiguousarray(x).view(bits), out.view(bits), reverse)
    return out


#: The side of :func:`_swap`'s tiles (of runs).
_TILE = 32


@jit
def _swap(x, out, reverse):
    """out[g, q, p] = x[g, p, q] (runs of R, reversed if ``reverse``), tile by tile; flat unsigned
    indices (numba then adds no wraparound test)."""
    count, p_size, q_size, r_size = x.shape
    src, dst = x.reshape(-1), out.reshape(-1)
    r_n = np.uint64(r_size)
    for g in range(count):
        base = np.uint64(g * p_size * q_size * r_size)
        for p0 in range(0, p_size, _TILE):
            for q0 in range(0, q_size, _TILE):
                for q in range(q0, min(q0 + _TILE, q_size)):
                    for p in range(p0, min(p0 + _TILE, p_size)):
                        s = base + np.uint64(p * q_size + q) * r_n
                        d = base + np.uint64(q * p_size + p) * r_n
                        if r_size == 1:
                            dst[d] = src[s]
                        elif reverse:
                            for r in range(r_n):
                                dst[d + r] = src[s + r_n - np.uint64(1) - r]
                        else:
                            for r in range(r_n):
                                dst[d + r] = src[s + r]


def from_groups(y: np.ndarray, n: int, o: int, out_shape) -> np.ndarray:
    """Per-group matmul results (g, N * prod(OS), O/g) as (N, O, *OS)."""
    d = len(out_shape)
    y = y.reshape(y.shape[0], n, *out_shape, y.shape[-1])  # (g, N, *OS, Og)
    y = y.transpose(1, 0, d + 2, *range(2, d + 2))  # (N, g, Og, *OS)
    return np.ascontiguousarray(y.reshape(n, o, *out_shape))


def forward(x: np.ndarray, w: np.ndarray, stride, padding, dilation, groups: int, product: Product,
            init: np.ndarray | None = None, name: str = "conv") -> np.ndarray:
    """The convolution of x (N, C, *S) with w (O, C / groups, *K): (N, O, *OS); ``init`` (O,),
    where given, each output's initial sum (a fused bias)."""
    d = check_shapes(name, x, w, groups)
    stride, padding, dilation = (per_dim(n_, v, d, low) for n_, v, low in
                                 (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)))
    o, n = w.shape[0], x.shape[0]
    if (groups == 1 and all(k == 1 for k in w.shape[2:]) and all(st == 1 for st in stride) and not any(padding)
            and math.prod(x.shape[2:]) >= o):
        # A pointwise convolution with more positions than outputs: per example, w (O, C) @ x (C,
        # prod(S)), the same sums (over c, in order) without im2col's copy or the result's
        # transpose, and its rows the longer side (the products vectorise along them).
        start = None if init is None else np.asarray(init).reshape(1, o, 1)
        y = product(w.reshape(1, o, -1), x.reshape(n, x.shape[1], -1), start)  # (N, O, prod(S))
        return y.reshape(n, o, *x.shape[2:])
    og, k = o // groups, w.shape[2:]
    if n * math.prod(output_shape(x.shape, k, stride, padding, dilation)) >= og:
        # More positions than outputs per group: the kernel (g, Og, Cg*K) times the columns with
        # the positions last (g, Cg*K, N*OS), the longer side along the product's rows (which
        # its additions vectorise along), no copy of the kernel, and the result (g, Og, N, *OS).
        # Either way each output adds the same products in the same order.
        cols, out_shape = im2col(x, k, stride, padding, dilation, groups, positions_last=True)
        start = None if init is None else np.asarray(init).reshape(groups, og, 1)
        y = product(w.reshape(groups, og, -1), cols, start).reshape(groups, og, n, *out_shape)
        return np.ascontiguousarray(np.moveaxis(y, 2, 0)).reshape(n, o, *out_shape)
    cols, out_shape = im2col(x, k, stride, padding, dilation, groups)  # (g, N*OS, Cg*K)
    kernel = swapped(w.reshape(groups, og, -1, 1))[..., 0]  # (g, Cg*K, Og)
    start = None if init is None else np.asarray(init).reshape(groups, 1, og)
    return from_groups(product(cols, kernel, start), n, o, out_shape)


def grad_input_operands(dy: np.ndarray, w: np.ndarray, input_size, stride, padding, dilation,
                        groups: int) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """The stuffed and padded output gradient and the reversed, channel-swapped kernel whose
    stride-1 convolution (dilated as the forward) is the input gradient; and the dilation."""
    d = dy.ndim - 2
    if d < 1 or w.ndim != d + 2 or dy.shape[1] != w.shape[0] or w.shape[0] % groups:
        raise ValueError(f"conv_grad_input needs dy (N, O, *OS) and w (O, C/groups, *K) with O divisible by "
                         f"groups, got {dy.shape}, {w.shape}, groups={groups}")
    stride, padding, dilation = (per_dim(n_, v, d, low) for n_, v, low in
                                 (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)))
    size = tuple(int(s) for s in input_size)[-d:]
    k = w.shape[2:]
    spread = [(o - 1) * s + 1 for o, s in zip(dy.shape[2:], stride, strict=True)]
    stuffed = np.zeros((*dy.shape[:2], *spread), dy.dtype)
    stuffed[(slice(None), slice(None), *(slice(None, None, s) for s in stride))] = dy
    lo = [di * (ki - 1) - p for di, ki, p in zip(dilation, k, padding, strict=True)]
    rest = [si + 2 * p - di * (ki - 1) - 1 - (o - 1) * s
            for si, p, di, ki, o, s in zip(size, padding, dilation, k, dy.shape[2:], stride, strict=True)]
    if any(r < 0 or r >= max(s, di) for r, s, di in zip(rest, stride, dilation, strict=True)):
        raise ValueError(f"conv_grad_input: dy's spatial shape {dy.shape[2:]} does not come from an input of "
                         f"{size} with stride {stride}, padding {padding}, dilation {dilation}, kernel {k}")
    z = pad(stuffed, lo, [a + r for a, r in zip(lo, rest, strict=True)])
    o, cg = w.shape[:2]
    flipped = swapped(w.reshape(groups, o // groups, cg, -1), reverse=True)  # (g, Cg, Og, taps reversed)
    return z, flipped.reshape(groups * cg, o // groups, *k), dilation


def grad_input(dy: np.ndarray, w: np.ndarray, input_size, stride, padding, dilation, groups: int,
               product: Product, init: np.ndarray | None = None) -> np.ndarray:
    """The gradient of :func:`forward` with respect to its input (N, C, *input_size)."""
    z, flipped, dilation = grad_input_operands(dy, w, input_size, stride, padding, dilation, groups)
    return forward(z, flipped, 1, 0, dilation, groups, product, init, "conv_grad_input")


def grad_weight(x: np.ndarray, dy: np.ndarray, kernel_size, stride, padding, dilation, groups: int,
                product: Product) -> np.ndarray:
    """The gradient of :func:`forward` with respect to its weight (O, C / groups, *kernel_size)."""
    d = x.ndim - 2
    k = tuple(int(v) for v in kernel_size)[-d:]
    if d < 1 or dy.ndim != x.ndim or dy.shape[0] != x.shape[0] or x.shape[1] % groups or dy.shape[1] % groups:
        raise ValueError(f"conv_grad_weight needs x (N, C, *S) and dy (N, O, *OS) with C and O divisible by "
                         f"groups, got {x.shape}, {dy.shape}, groups={groups}")
    stride, padding, dilation = (per_dim(n_, v, d, low) for n_, v, low in
                                 (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)))
    n, o = dy.shape[:2]
    cols, out_shape = im2col(x, k, stride, padding, dilation, groups)  # (g, N*OS, Cg*K)
    if tuple(out_shape) != dy.shape[2:]:
        raise ValueError(f"conv_grad_weight: dy's spatial shape {dy.shape[2:]} is not the convolution's "
                         f"output shape {tuple(out_shape)}")
    grad = np.ascontiguousarray(np.moveaxis(dy.reshape(n, groups, o // groups, -1), 0, 2).reshape(groups, o // groups,
                                                                                                   -1))
    return product(grad, cols, None).reshape(o, x.shape[1] // groups, *k)


def transpose_size(x_shape, w_shape, stride, padding, output_padding, dilation) -> list[int]:
    """The output size of a transposed convolution: (S - 1) * stride - 2 * padding + dilation *
    (K - 1) + output_padding + 1."""
    d = len(x_shape) - 2
    stride, padding, output_padding, dilation = (
        per_dim(n_, v, d, low) for n_, v, low in (("stride", stride, 1), ("padding", padding, 0),
                                                  ("output_padding", output_padding, 0), ("dilation", dilation, 1)))
    return [(s - 1) * st - 2 * p + di * (k - 1) + op + 1
            for s, st, p, di, k, op in zip(x_shape[2:], stride, padding, dilation, w_shape[2:], output_padding,
                                           strict=True)]


def transpose(x: np.ndarray, w: np.ndarray, stride, padding, output_padding, dilation, groups: int,
              product: Product, init: np.ndarray | None = None) -> np.ndarray:
    """The transposed convolution of x (N, Cin, *S) with w (Cin, Cout / groups, *K): :func:`grad_input`
    of x for the input size :func:`transpose_size` gives."""
    size = transpose_size(x.shape, w.shape, stride, padding, output_padding, dilation)
    return grad_input(x, w, size, stride, padding, dilation, groups, product, init)
