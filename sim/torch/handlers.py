"""The device routes of the operations that need more than the device method of the same name:
compositions of device operations, each in the order its NPU or torch kernel computes, and the
selections whose values are rounded by one rule."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from .. import ops
from .convert import _NUMPY, _held, _numpy, _Op, _result_dtype, _tensor
from .draws import _dropout_backward


def _binary(name: str) -> Callable:
    def run(op: _Op, a, b, alpha=1):
        dtype = _result_dtype(a, b)
        x, y = op.operand(a, dtype), op.operand(b, dtype)
        if alpha != 1:
            y = op.dev.mul(y, op.operand(alpha, dtype))
        return _tensor(getattr(op.dev, name)(x, y))
    return run


def _unary(name: str) -> Callable:
    return lambda op, a: _tensor(getattr(op.dev, name)(_numpy(a)))


def _compare(name: str) -> Callable:
    def run(op: _Op, a, b):
        dtype = _result_dtype(a, b)
        return _tensor(getattr(op.dev, name)(op.operand(a, dtype), op.operand(b, dtype)))
    return run


def _dims(x: torch.Tensor, dim) -> tuple[int, ...]:
    """The dimensions a reduction reduces, sorted and non-negative (a 0-d tensor's dimension 0 or -1:
    none to move); a dimension out of range or given twice takes the float32 route, where torch
    raises its own error."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(x.dim()))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    n = max(x.dim(), 1)
    if any(not -n <= d < n for d in dims) or len({d % n for d in dims}) != len(dims):
        raise _Unmapped
    return tuple(sorted(d % n for d in dims)) if x.dim() else ()


def _reduce(kind: str) -> Callable:
    """sum, mean (binary32 accumulation, one rounding to the tensor's dtype, or to binary32 with
    ``dtype=torch.float32``: the elements widen exactly, aclnnReduceSum's and aclnnMean's dtype
    argument), amax, amin over any set of dimensions: those are moved to the front and flattened
    into one."""
    def run(op: _Op, x, dim=None, keepdim=False, dtype=None):
        a = _numpy(x)
        into = a.dtype
        if dtype is not None and dtype != x.dtype:
            if dtype is not torch.float32 or x.dtype not in (torch.float16, torch.bfloat16):
                raise _Unmapped  # a narrowing dtype= rounds each element first (torch's cast)
            into = np.dtype(np.float32)
        dims = _dims(x, dim)
        rest = [d for d in range(a.ndim) if d not in dims]
        if kind in ("amax", "amin") and any(a.shape[d] == 0 for d in dims):
            raise _Unmapped  # torch refuses a maximum of nothing: its own error
        count = math.prod(a.shape[d] for d in dims)  # not -1: ambiguous where another dimension is 0
        flat = np.transpose(a, dims + tuple(rest)).reshape(count, *[a.shape[d] for d in rest])
        if kind in ("sum", "mean"):
            r = getattr(op.dev, kind)(flat, axis=0, accumulate=np.float32, out_dtype=into)
        else:
            r = getattr(op.dev, kind)(flat, axis=0)
        r = np.asarray(r)
        if keepdim:
            r = r.reshape([1 if d in dims else a.shape[d] for d in range(a.ndim)])
        return _tensor(r)
    return run


_true_div = _binary("div")
def _div(op: _Op, a, b, rounding_mode=None):
    """a / b on the device, rounded once; with a rounding mode (``trunc``, ``floor``: fmod's and
    remainder's gradients make it) aclnnDivMod: the fused model, binary32 inside, one rounding."""
    if rounding_mode is not None:
        raise _Fused
    return _true_div(op, a, b)


def _mm(op: _Op, a, b):
    """mm and bmm: two binary16 or two bfloat16 operands (a profile whose cube refuses bfloat16
    raises TypeError: the float32 route, counted)."""
    if a.dtype != b.dtype or a.dtype not in (torch.float16, torch.bfloat16):
        raise _Unmapped
    return _tensor(op.dev.matmul(_numpy(a), _numpy(b)))


def _addmm(op: _Op, bias, a, b, beta=1, alpha=1):
    """bias + a @ b, the bias placed as the device's ``matmul_bias`` says (fused: the sums'
    binary32 initial value; after: added to the rounded product)."""
    if beta != 1 or alpha != 1 or not (bias.dtype == a.dtype == b.dtype) or a.dtype not in (torch.float16,
                                                                                          torch.bfloat16):
        raise _Unmapped
    return _tensor(op.dev.matmul(_numpy(a), _numpy(b), bias=_numpy(bias)))


def _baddbmm(op: _Op, bias, a, b, beta=1, alpha=1):
    """beta * bias + alpha * (a @ b) (baddbmm; Bloom's attention scores with ALiBi): the device's
    stacked matmul, its products exact and summed in order in binary32, then alpha and beta applied
    and the two terms added in binary32 (numpy float32, in that order), and the result rounded once
    into the dtype on the device, as the cube unit's binary32 result is before its one cast."""
    dtype = _conv_dtype(bias, a, b)
    wide = op.dev.matmul(_numpy(a), _numpy(b), out_dtype=np.float32)
    with np.errstate(all="ignore"):  # a binary32 overflow is Inf, as the unit's: the cast reports it
        r = np.float32(alpha) * wide if alpha != 1 else wide
        if beta != 0:
            r = r + np.float32(beta) * _numpy(bias).astype(np.float32)
    return _tensor(op.dev.cast(np.asarray(r, np.float32), _NUMPY[dtype]))


def _plain_cpu(x: torch.Tensor) -> bool:
    """A dense CPU tensor, whose values numpy can read (not meta, not sparse)."""
    return x.is_cpu and x.layout == torch.strided


def _to_copy(op: _Op, x, dtype=None, **kw):
    """A conversion into one of the device's dtypes, rounded on the device: from another of them, or
    from float64, integers and bools (their values in binary64, exact up to 2**53), so that an integer
    or a binary64 value beyond binary16's range saturates and reaches the register as the NPU's cast
    does (torch converts it to Inf without a word). Anything else (into other dtypes) is exact."""
    if dtype is None or dtype == x.dtype or dtype not in _NUMPY or x.is_complex() or not _plain_cpu(x):
        raise _Exact
    return _tensor(op.operand(x, dtype))


def _copy_(op: _Op, dst, src, non_blocking=False):
    """copy_ into one of the device's dtypes from another dtype is a cast (rounded on the device, from
    integers and float64 too, as ``_to_copy``); within one, exact."""
    if (not isinstance(src, torch.Tensor) or src.dtype == dst.dtype or dst.dtype not in _NUMPY or src.is_complex()
            or not _plain_cpu(src) or not _plain_cpu(dst)):
        raise _Exact
    return dst.copy_(_tensor(op.operand(src, dst.dtype)))


def _into(op: _Op, value, dtype: torch.dtype):
    """A selection's value (a Python number or a tensor of another dtype) in ``dtype``, by the one
    rule of every selection: what the dtype holds is written as it is (Inf and NaN included, in
    either overflow mode); anything else is rounded into it on the device, so that a value beyond
    its range (binary32's lowest as a mask) saturates in saturation mode and reaches the register,
    as the NPU's cast does."""
    if not isinstance(value, torch.Tensor):
        v = float(value)
        return v if _held(v, dtype) else float(op.operand(v, dtype))
    if value.dtype == dtype:
        return value
    a = _numpy(value)
    a = a if value.dtype in _NUMPY else a.astype(np.float64)
    with np.errstate(all="ignore"):
        out = a.astype(_NUMPY[dtype])
        held = ~np.isfinite(a) | (out.astype(a.dtype) == a)
    if not held.all():
        out[~held] = op.dev.cast(a[~held], _NUMPY[dtype])
    return _tensor(out)


def _fill(fill: Callable) -> Callable:
    """masked_fill, index_fill: x with a value placed (a selection, exact; trace's gradient writes
    its diagonal with index_fill), torch's own checks first (it refuses a value the dtype
    overflows); the value in x's dtype as every selection's (``_into``)."""
    def run(op: _Op, x, *where_and_value):
        *where, value = where_and_value
        if not isinstance(x, torch.Tensor) or x.dtype not in _NUMPY or (isinstance(value, torch.Tensor)
                                                                         and value.dim() != 0):
            raise _Unmapped
        result = fill(x, *where, value)
        v = _into(op, value, x.dtype)
        return result if v is value else fill(x, *where, v)
    return run


_masked_fill, _index_fill = _fill(torch.masked_fill), _fill(torch.index_fill)


def _angle(op: _Op, x):
    """The angle of a real tensor (aclnnAngleV2): a selection of pi (rounded into x's dtype on the
    device), 0 where x is not negative (-0 included), and x's own NaN where x is NaN (a selection:
    no flag), as torch's scalar kernel selects (UnaryOpsKernel.cpp, angle_impl; its vectorised
    loop gives the default NaN instead, so natively a tensor's length decides); its gradient is
    zero."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _NUMPY:
        raise _Unmapped
    a = _numpy(x)
    pi = op.operand(math.pi, x.dtype)
    return _tensor(np.where(np.isnan(a), a, np.where(a < 0, pi, np.zeros((), a.dtype))))


def _nan_to_num(op: _Op, x, nan=None, posinf=None, neginf=None):
    """NaN, +Inf and -Inf replaced (a selection, exact) in x's own dtype: by default with 0 and the
    dtype's largest finite values, which it holds; a value given, as every selection's (``_into``).
    (In binary32 the defaults would be binary32's largest values, whose rounding back would report
    an overflow that never happened.)"""
    if not isinstance(x, torch.Tensor) or x.dtype not in _NUMPY:
        raise _Unmapped
    return torch.nan_to_num(x, *(v if v is None else _into(op, v, x.dtype) for v in (nan, posinf, neginf)))


def _where(op: _Op, condition, a, b):
    """where(condition, a, b): a selection, exact, in the result's dtype; an operand of another dtype
    (a binary32 0-d mask value, a Python number) in it as every selection's (``_into``): -inf as
    -inf, binary32's lowest rounded on the device. Operands already of the result's dtype: the exact
    route."""
    dtype = torch.result_type(a, b)
    if dtype not in _NUMPY or all(isinstance(v, torch.Tensor) and v.dtype == dtype for v in (a, b)):
        raise _Exact
    a, b = (_into(op, v, dtype) for v in (a, b))
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        a = torch.tensor(a, dtype=dtype)
    return torch.where(condition, a, b).to(dtype)


def _write(op: _Op, dst: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """An in-place or ``out=`` result written into its destination: rounded on the device
    where the destination's float dtype differs, else copied exactly."""
    if result.dtype != dst.dtype and result.dtype in _NUMPY and dst.dtype in _NUMPY:
        result = _tensor(op.dev.cast(_numpy(result), _NUMPY[dst.dtype]))
    if dst.shape != result.shape:
        dst.resize_(result.shape)
    return dst.copy_(result)


def _conv_dtype(*ts) -> torch.dtype:
    """The one dtype of a convolution's tensors: binary16 or bfloat16, else the float32 route."""
    dtypes = {t.dtype for t in ts if t is not None}
    if len(dtypes) != 1 or not dtypes <= {torch.float16, torch.bfloat16}:
        raise _Unmapped
    return dtypes.pop()


def _convolution(op: _Op, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """Every convolution torch makes (1-d to 3-d, strided, padded, dilated, grouped,
    transposed), the bias placed as the device's ``matmul_bias`` says."""
    _conv_dtype(x, w, bias)
    batched = x.dim() == w.dim()
    a = _numpy(x) if batched else _numpy(x)[None]
    b = None if bias is None else _numpy(bias)
    if transposed:
        y = op.dev.conv_transpose(a, _numpy(w), list(stride), list(padding), list(output_padding), list(dilation),
                                  groups, bias=b)
    else:
        y = op.dev.conv(a, _numpy(w), list(stride), list(padding), list(dilation), groups, bias=b)
    return _tensor(y if batched else y[0])


def _convolution_backward(op: _Op, grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding,
                          groups, output_mask):
    """The gradients of a convolution for its input, weight and bias, those ``output_mask``
    asks for: each a device convolution (the bias's a device sum, binary32, one rounding)."""
    dtype = _conv_dtype(grad, x, w)
    batched = x.dim() == w.dim()
    g, a, k = _numpy(grad), _numpy(x), _numpy(w)
    if not batched:
        g, a = g[None], a[None]
    stride, padding, dilation, output_padding = list(stride), list(padding), list(dilation), list(output_padding)
    gi = gw = gb = None
    if output_mask[0]:
        if transposed:
            gi = op.dev.conv(g, k, stride, padding, dilation, groups)
        else:
            gi = op.dev.conv_grad_input(g, k, a.shape[2:], stride, padding, dilation, groups)
        gi = _tensor(gi if batched else gi[0])
    if output_mask[1]:
        if transposed:
            gw = op.dev.conv_grad_weight(g, a, k.shape[2:], stride, padding, dilation, groups)
        else:
            gw = op.dev.conv_grad_weight(a, g, k.shape[2:], stride, padding, dilation, groups)
        gw = _tensor(gw)
    if output_mask[2]:
        flat = np.moveaxis(g, 1, -1).reshape(-1, g.shape[1])
        gb = _tensor(op.dev.sum(flat, axis=0, accumulate=np.float32, out_dtype=_NUMPY[dtype]))
    return gi, gw, gb


class _Unmapped(Exception):
    """This call's arguments have no device equivalent: take the float32 route."""


class _Exact(Exception):
    """This call is exact as torch computes it: take the exact route."""


class _Fused(Exception):
    """This call is a fused kernel of its family (binary32 inside, each output rounded once): take
    the fused route."""


#: The packets whose calls need more than the device method of the same name (sim.ops says which
#: operation each packet is).
_HANDLERS: dict[str, Callable] = {"mm": _mm, "bmm": _mm, "addmm": _addmm, "_to_copy": _to_copy, "copy_": _copy_,
                                  "div": _div,
                                  "masked_fill": _masked_fill, "index_fill": _index_fill, "angle": _angle,
                                  "nan_to_num": _nan_to_num, "where": _where,
                                  "baddbmm": _baddbmm,
                                  "convolution": _convolution, "convolution_backward": _convolution_backward}


def _handler(op: ops.Op) -> Callable:
    """The route of a call to ``op``'s device method, by its kind."""
    if op.kind == ops.COMPARE:
        return _compare(op.name)
    if op.kind == ops.REDUCTION:
        return _reduce(op.name)
    return _binary(op.name) if op.arity == 2 else _unary(op.name)


#: aclnnPowTensorScalar's exponents taken by the Pows kernel on the Atlas A2 and A3 (hicann/ops-math
#: math/pow/op_host/op_api/aclnn_pow.cpp, CheckSupportPows), as ``_pow`` models them.
_POWS = (2, 0.5, -1, 3, -2, -0.5)


def _pow(op: _Op, x, exponent):
    """x ** e for a Python-number exponent of ``_POWS``, as the Pows kernel computes it
    (hicann/ops-math math/pows/op_kernel/pows_fp16.h and pows_base.h, ComputePowsBase: a float16
    or bfloat16 operand cast to binary32, the kernel's operations in binary32, the result rounded
    once into the dtype):

    - 2: x * x, exact in binary32, one rounding: the device's ``mul(x, x)``, what x * x is
      (autograd's formulas make it, erf's and pow's backward among them);
    - 0.5 and -1: one binary32 rounding of sqrt(x) or 1/x, then one into the dtype, which is the
      one rounding of the device's ``sqrt`` and ``reciprocal`` (binary32's 24 bits are at least
      2p + 2 for binary16's and bfloat16's p, so the double rounding is innocuous);
    - 3, -2 and -0.5: x * (x * x), 1 / (x * x) and 1 / sqrt(x), each operation rounded to binary32
      in the kernel's order (numpy binary32 arithmetic), then rounded once on the device (GPT-2's
      GELU takes x ** 3). For binary16 operands that is also the one rounding of the exact power
      (tests/sim_tests/torch_tests/test_torch_routes.py checks every finite one); for bfloat16 the binary32 steps can
      differ from it where they leave binary32's normal range.

    The model takes the Pows kernel on every profile; on the Atlas training series (Ascend910)
    aclnn sends these exponents to its general Pow kernel, whose binary32 algorithm is not
    modelled. The exponents 0 and 1 are exact (1 and x). Any other exponent, a tensor one, or a
    Python-number base is aclnn's general kernel (aclnnPowTensorScalar, aclnnPowTensorTensor,
    aclnnPowScalarTensor): the fused model, binary32 inside (x ** e correctly rounded), one rounding."""
    if (not isinstance(x, torch.Tensor) or x.dtype not in _NUMPY or isinstance(exponent, (torch.Tensor, bool))
            or not isinstance(exponent, (int, float)) or exponent not in (*_POWS, 0, 1)):
        raise _Fused
    if exponent in (0, 1):  # x ** 0 is 1 and x ** 1 is x (NaN included), exactly: x ** 2's backward makes x ** 1
        raise _Exact
    a = _numpy(x)
    if exponent == 2:
        return _tensor(op.dev.mul(a, a))
    if exponent in (0.5, -1):
        return _tensor(op.dev.sqrt(a) if exponent == 0.5 else op.dev.reciprocal(a))
    w = a.astype(np.float32)
    with np.errstate(all="ignore"):  # binary32 overflow and division by zero: Inf, as the kernel's
        if exponent == 3:
            r = w * (w * w)
        else:
            r = np.float32(1) / (w * w if exponent == -2 else np.sqrt(w))
    return _tensor(op.dev.cast(r, a.dtype))


def _tanh_backward(op: _Op, grad, y):
    """grad * (1 - y * y), three device operations."""
    g, t = _numpy(grad), op.operand(y, grad.dtype)
    return _tensor(op.dev.mul(g, op.dev.sub(op.operand(1, grad.dtype), op.dev.mul(t, t))))


def _sigmoid_backward(op: _Op, grad, y):
    """grad * (y * (1 - y)), three device operations."""
    g, s = _numpy(grad), op.operand(y, grad.dtype)
    return _tensor(op.dev.mul(g, op.dev.mul(s, op.dev.sub(op.operand(1, grad.dtype), s))))


def _promoted(x, *others) -> torch.dtype:
    """The dtype of an elementwise result of x (a floating tensor of ours) and others (tensors,
    Python numbers, None), by torch's promotion; any other x takes the float32 route."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _NUMPY:
        raise _Unmapped
    dtype = x.dtype
    for o in others:
        if o is not None:
            dtype = torch.promote_types(dtype, torch.result_type(x, o))
    return dtype


def _clamp(op: _Op, x, min=None, max=None):
    """clamp with scalar or tensor bounds (clamp_min, clamp_max: one bound): the device's
    maximum with the lower bound, then its minimum with the upper one, as torch's CPU kernel
    writes it (aten/src/ATen/native/cpu/TensorCompareKernel.cpp, clamp: min(max(x, lo), hi)).
    The bounds are in the result's dtype (rounded on the device where they are not, as torch
    converts them); maximum and minimum round nothing, and a NaN anywhere gives NaN."""
    if min is None and max is None:
        raise _Unmapped
    dtype = _promoted(x, min, max)
    y = op.operand(x, dtype)
    if min is not None:
        y = op.dev.maximum(y, op.operand(min, dtype))
    if max is not None:
        y = op.dev.minimum(y, op.operand(max, dtype))
    return _tensor(y)


def _relu6_plus_3(op: _Op, a: np.ndarray, dtype: torch.dtype):
    """min(max(x + 3, 0), 6) on the device in a's dtype: add (rounded), maximum, minimum (exact)."""
    c = lambda v: op.operand(v, dtype)  # noqa: E731
    return op.dev.minimum(op.dev.maximum(op.dev.add(a, c(3)), c(0)), c(6))


def _hardsigmoid(op: _Op, x):
    """relu6(x + 3) / 6 as the NPU's HardSwish kernel computes its factor (CANN ops-math
    ``math/hard_swish/op_kernel/hard_swish.h``, ``HardSwish<T>::Compute``: Adds 3, Maxs 0, Mins 6,
    Div by 6, in the tensor's own type), each operation on the device in the tensor's dtype: two
    roundings (x + 3, the division)."""
    return _tensor(op.dev.div(_relu6_plus_3(op, _numpy(x), x.dtype), op.operand(6, x.dtype)))


def _hardswish(op: _Op, x):
    """x * (relu6(x + 3) / 6), the factor first, as the NPU's HardSwish kernel computes it in the
    tensor's own type (CANN ops-math ``math/hard_swish/op_kernel/hard_swish.h``: Adds, Maxs, Mins,
    Div, then Mul by x), each operation on the device: x >= 3 gives x exactly (the factor is 1), so
    nothing overflows that the result does not. (torch's CPU kernel writes x * relu6(x + 3) / 6 in
    binary32; in binary16 that order would overflow at x * 6 above 10922.)"""
    a = _numpy(x)
    return _tensor(op.dev.mul(a, op.dev.div(_relu6_plus_3(op, a, x.dtype), op.operand(6, x.dtype))))


def _gradient_where(op: _Op, grad, x) -> tuple[np.ndarray, np.ndarray, Callable]:
    """An activation backward's grad and x (in grad's dtype) as numpy, and a function filling
    ``out`` where ``mask`` with ``fn(*parts)`` of the masked elements only (on the device, so the
    elements outside the range, which torch's kernel does not compute, raise no flags)."""
    if not isinstance(x, torch.Tensor) or grad.shape != x.shape or grad.dtype not in _NUMPY:
        raise _Unmapped

    def fill(out: np.ndarray, mask: np.ndarray, fn: Callable, *parts: np.ndarray) -> np.ndarray:
        if mask.any():
            out[mask] = fn(*[p[mask] for p in parts])
        return out

    return _numpy(grad), op.operand(x, grad.dtype), fill


def _hardsigmoid_backward(op: _Op, grad, x):
    """grad * (1/6) where -3 < x < 3, +0 elsewhere, as torch's CPU kernel writes it (Activation.cpp,
    hardsigmoid_backward_kernel): the device's gt and lt select, the device's mul by 1/6 rounded into
    grad's dtype."""
    g, a, fill = _gradient_where(op, grad, x)
    c = lambda v: op.operand(v, grad.dtype)  # noqa: E731
    inside = np.asarray(op.dev.gt(a, c(-3))) & np.asarray(op.dev.lt(a, c(3)))
    return _tensor(fill(np.zeros_like(g), inside, lambda gi: op.dev.mul(gi, c(1 / 6)), g))


def _hardswish_backward(op: _Op, grad, x):
    """As torch's CPU kernel writes it (Activation.cpp, hardswish_backward_kernel): +0 where x < -3,
    grad * (x / 3 + 0.5) where -3 <= x <= 3 (the device's div, add and mul, in that order), grad
    itself elsewhere (x > 3, or NaN); the ranges by the device's lt and le."""
    g, a, fill = _gradient_where(op, grad, x)
    c = lambda v: op.operand(v, grad.dtype)  # noqa: E731
    below = np.asarray(op.dev.lt(a, c(-3)))
    middle = ~below & np.asarray(op.dev.le(a, c(3)))
    return _tensor(fill(np.where(below, np.zeros_like(g), g), middle,
                        lambda gi, ai: op.dev.mul(gi, op.dev.add(op.dev.div(ai, c(3)), c(0.5))), g, a))


_sub = _binary("sub")
def _rsub(op: _Op, a, b, alpha=1):
    """``b - alpha * a`` (torch's ``rsub``, which ``1.0 - x`` calls): ``sub`` with its operands
    swapped, rounded as ``sub`` with ``alpha`` is (the product first where alpha is not 1)."""
    return _sub(op, b, a, alpha)


# Compositions of device operations for packets the table declares under the operation they
# are made of (autograd's formulas make some of them).
_HANDLERS.update({"native_dropout_backward": _dropout_backward, "pow": _pow, "tanh_backward": _tanh_backward,
                  "sigmoid_backward": _sigmoid_backward, "clamp": _clamp,
                  "clamp_min": lambda op, x, min: _clamp(op, x, min, None),
                  "clamp_max": lambda op, x, max: _clamp(op, x, None, max),
                  "hardsigmoid": _hardsigmoid, "hardswish": _hardswish, "rsub": _rsub,
                  "hardsigmoid_backward": _hardsigmoid_backward, "hardswish_backward": _hardswish_backward})

