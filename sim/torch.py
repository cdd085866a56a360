"""Unmodified PyTorch code on a simulated Atlas device (optional extra ``torch``).

Inside ``with DeviceMode(dev):`` every aten operation on float16 or bfloat16
tensors (and float32 ones with ``float32=True``), or asked for in one (a dtype
argument), is taken by one of the routes of ``ROUTE_KINDS``, counted in
``mode.routes``; none runs natively uncounted:

- ``device``: the operation has a device equivalent and runs on ``dev``, in its
  rounding, overflow mode and register (see ``ROUTES`` for the list). Operands
  of other dtypes are first cast on the device to the dtype torch's promotion
  gives the result; Python scalars are rounded into it there too (one cast,
  its events recorded), then the device operation rounds once more.
  ``addmm`` and biased convolutions place the bias as the device's
  ``matmul_bias`` says (default: the product rounded, then the bias added);
  sums and means accumulate in binary32 and round once to the tensor's dtype.
  ``rsub`` (``1.0 - x``) is ``sub`` with its operands swapped.
  Compositions of device operations, each documented with its order:
  ``clamp`` (maximum, then minimum), ``hardsigmoid`` and ``hardswish`` (the
  NPU kernel's order) and their backward (torch's CPU formulas), operation by
  operation in the tensor's dtype, ``tanh_backward``, ``sigmoid_backward``, and ``pow`` for the
  exponents of CANN's Pows kernel (2, 3, 0.5, -1, -2, -0.5; see ``_pow``).
  In-place (``add_``, ``relu_``...) and ``out=`` overloads take their functional
  operation's route, the result written into the destination (rounded on the
  device where its dtype differs).
- ``exact``: views, in-place views (``transpose_``, ``unsqueeze_``,
  ``as_strided_``..., applied to the tensor itself), and pure data movement and
  selection (reshape, cat, index, gather, where, splits, pooling indices, the
  gradients of a selection: ``select_backward``, ``slice_backward``), and the
  quiet classifications (``isinf``, ``isnan``), which torch computes exactly
  itself.
- ``factory``: operations that create values (``empty*``, ``new_empty*``,
  ``zeros``, ``ones``, ``*_like``, ``full``, ``fill_``, ``scalar_tensor``,
  ``arange``, ``linspace``, ``eye``): torch makes the tensor in our dtype
  directly, so uninitialised memory is never cast (it would fake overflows); a
  fill value the dtype cannot hold is rounded into it on the device, and a
  computed sequence (``arange``, ``linspace``) is computed in binary64 and each
  value rounded once on the device. What torch refuses (``full(1e6)`` in
  float16), it still refuses.
- ``random``: operations that draw from torch's generator (``bernoulli_``,
  ``normal_``, ``uniform_``, ``rand``, ``native_dropout``...): the draw is made
  in binary32 from binary64 uniforms of torch's generator (``sim.torch_binary32``),
  then converted: Bernoulli draws are 0 or 1, exact in every format; continuous
  draws are rounded once on the device into the dtype (a uniform draw toward
  -inf, so that it stays below its upper bound). ``native_dropout`` multiplies on
  the device by the exact mask and by 1/(1-p) rounded into the dtype (its
  backward is a device route, the same two multiplies).
- ``fused``: the fused operation families of ``sim.fused`` (attention, layer/RMS/batch/group
  norm, softmax and log-softmax, GELU, SiLU, cross-entropy, RNN, LSTM and GRU, and the gradient
  accumulations of embeddings and max pooling) chosen fused
  (``DeviceMode(dev, fused={"softmax": False, ...})``, the defaults those of ``sim.fused``):
  computed by torch in binary32 from the exact values of the operands, each output rounded
  once on the device, forward and backward. A family chosen unfused is its math
  decomposition in the tensor's dtype (torch-function level, above autograd), each piece on
  the device.
- ``float32``: anything else is computed by torch in binary32 from the exact
  binary32 values of its operands, and each floating result is rounded once
  on the device into the dtype torch would return, so that its overflow still
  reaches the register. ``strict=True`` raises NotImplementedError naming
  the operation instead (the other routes are deliberate and always taken).

Autograd works as usual when backward runs inside the mode (on CPU it runs in
the calling thread, so the backward operations are routed too). Modes are
made per step in a training loop: a graph made under one mode may be run
backward under a later one (a loss kept alive from the previous step keeps
its parameters' autograd nodes alive), and a model used natively, or under
another mode, before is welcome.

Modes nest, on the same device or different ones: the innermost mode that
takes an operation computes and counts it, on its device; the torch calls it
makes meanwhile pass through the outer modes unseen, so an outer mode counts
only what the inner ones do not take (with ``float32=True`` outside only, the
float32 operations).

A backward pass of operations made in a module's forward under a mode that
runs where no DeviceMode is active (after the ``with`` block, or in a thread
the mode does not cover: modes are per thread) raises RuntimeError, rather
than running natively unseen. The check sits on the autograd nodes of each
module's outputs, which a backward pass from outside the module reaches before
any node of its forward: one check a module call, not one an operation (the
difference is 4-6% of a transformer's step).

Each routed operation is labelled with the module that issued it: its path
in the outermost module called inside the mode (``encoder.layers.1.attn``;
outside any module, the label of the enclosing ``device.label`` block, or
""), found by forward hooks in the forward pass and, in the backward pass,
from the autograd node being run: the module whose forward made it, told by
the node's sequence number (torch numbers a thread's autograd nodes in the
order made; the mode notes the number at each module's entry and exit, so a
node's module is found without walking the graph). A node made outside
modules, or in a forward whose graph is gone, takes the enclosing
``device.label``; a parameter's gradient accumulation takes the module that
owns the parameter. The operation runs inside
``device.label(path)``, and ``mode.events`` counts, per label, the device
operations whose events reached the register.

The mode is a ``torch.utils._python_dispatch.TorchDispatchMode``: it sees the
operations below autograd, after torch's Python-level decompositions.
"""

from __future__ import annotations

import bisect
import collections
import functools
import math
import threading
import weakref
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_map

from . import elementary, ops
from . import fused as _fused
from . import recurrent as _recurrent
from . import torch_binary32 as _binary32
from .device import Device
from .kernels import INVALID as _INVALID

__all__ = ["DeviceMode", "ROUTES", "EXACT", "EXACT_OVERLOADS", "FACTORIES", "ROUTE_KINDS", "FUNCTIONS",
           "ABOVE_AUTOGRAD", "as_array", "as_tensor", "NUMPY_DTYPES"]

aten = torch.ops.aten
_CHECKED = "sim.checked"  # the autograd node metadata key of a checked node (its forward's _Spans)
#: The numpy dtype of each torch dtype the device computes in.
NUMPY_DTYPES = {torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
                torch.float32: np.dtype(np.float32)}


def as_array(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array of the same dtype (bfloat16 as ml_dtypes'), sharing its
    memory where torch can: the device's operands."""
    if t.requires_grad:
        t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def as_tensor(a) -> torch.Tensor:
    """A numpy array or scalar (a device's result; ml_dtypes bfloat16 included) as a CPU tensor of
    its dtype and shape (a 0-d array or a scalar as a 0-d tensor)."""
    a = np.asarray(a)
    if not a.flags.c_contiguous:
        a = a.copy()  # not np.ascontiguousarray: it makes a 0-d array 1-d
    if a.dtype == _BFLOAT16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


_NUMPY, _numpy, _tensor = NUMPY_DTYPES, as_array, as_tensor  # the short names used below
_BFLOAT16 = NUMPY_DTYPES[torch.bfloat16]


class _Op:
    """One routed call: the mode, its device and the arguments' conversion."""

    def __init__(self, mode: DeviceMode) -> None:
        self.mode, self.dev = mode, mode.device

    def operand(self, x, dtype: torch.dtype) -> np.ndarray:
        """x as a numpy array of ``dtype``, cast on the device where its dtype differs."""
        if isinstance(x, torch.Tensor):
            a = _numpy(x)
            if x.dtype == dtype:
                return a
            if x.dtype not in _NUMPY:  # integer or bool tensors: exact in float64 up to 2**53
                a = a.astype(np.float64)
        else:
            return self.dev.scalar(x, _NUMPY[dtype])
        return self.dev.cast(a, _NUMPY[dtype])


def _result_dtype(a, b) -> torch.dtype:
    """torch's promotion of two operands; without asking torch where it is plain: one floating
    dtype, or a floating tensor and a Python int or float (the tensor's dtype)."""
    if isinstance(a, torch.Tensor) and a.dtype in _NUMPY:
        if isinstance(b, torch.Tensor):
            if b.dtype is a.dtype:
                return a.dtype
        elif b.__class__ is float or b.__class__ is int:
            return a.dtype
    return torch.result_type(a, b)


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


def _held(value: float, dtype: torch.dtype) -> bool:
    """Whether ``dtype`` holds the Python number ``value`` exactly (Inf and NaN: as they are)."""
    return not math.isfinite(value) or float(np.asarray(value).astype(_NUMPY[dtype])) == value


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


def _dropout(op: _Op, x, p, train=None):
    """native_dropout: an exact Bernoulli mask (``sim.torch_binary32.bernoulli_mask``: binary64
    uniform draws from torch's generator below 1 - p, the same on every host), then the device
    multiplies by the mask and by 1/(1-p) rounded into the tensor's dtype, as torch's kernel does
    (input * mask * scale)."""
    if train is False or p == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    keep = _binary32.bernoulli_mask(x.shape, 1 - p)
    if p == 1:
        return torch.zeros_like(x), keep
    dtype = x.dtype
    masked = op.dev.mul(_numpy(x), _numpy(keep.to(dtype)))
    return _tensor(op.dev.mul(masked, op.operand(1 / (1 - p), dtype))), keep


def _dropout_backward(op: _Op, grad, mask, scale):
    """grad * mask * scale on the device, the mask exact and the scale rounded into grad's dtype."""
    masked = op.dev.mul(_numpy(grad), _numpy(mask.to(grad.dtype)))
    return _tensor(op.dev.mul(masked, op.operand(scale, grad.dtype)))


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


_OPERANDS = object()  # _result_dtypes' mark: no meta kernel, the results take the operands' dtype
_EACH = object()  # _result_dtypes' mark: a list of results, each of one dtype
_DTYPES: dict[tuple, tuple] = {}


def _signature(x) -> Any:
    """What of an argument can decide a result's dtype: a tensor's dtype and whether it is 0-d (a
    0-d tensor promotes as a scalar), a scalar's Python type, a dtype argument itself."""
    if isinstance(x, torch.Tensor):
        return x.dtype, x.dim() == 0
    if isinstance(x, (list, tuple)):
        return tuple(_signature(y) for y in x)
    return x if isinstance(x, torch.dtype) else type(x)


def _result_dtypes(func, args, kwargs, ours: frozenset) -> tuple:
    """The dtypes torch gives func's results, from its meta kernel (no values computed), kept per
    overload and argument signature (dtypes, 0-d tensors, scalar types: all that decides them), so
    the meta kernel runs once per signature. Without one: ``(_OPERANDS, dtype)``, the first of our
    dtypes among the operands (torch's own errors, such as full(1e6, fp16), propagate). Results none
    of which is a tensor (allclose's bool) have no dtype to round into: ``(None, ...)``, no meta kernel
    asked (some read a value, which a meta tensor refuses)."""
    key = (func, tuple([_signature(x) for x in args]), tuple([(k, _signature(v)) for k, v in kwargs.items()]))
    dtypes = _DTYPES.get(key)
    if dtypes is None:
        returns = func._schema.returns
        if returns and all("Tensor" not in str(r.type) for r in returns):
            dtypes = _DTYPES[key] = (None,) * len(returns)
            return dtypes
        to_meta = lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x  # noqa: E731
        meta_kwargs = _map(to_meta, kwargs)
        if not any(isinstance(t, torch.Tensor) for t in torch.utils._pytree.tree_leaves((args, kwargs))) and \
                any(a.name == "device" for a in func._schema.arguments):
            meta_kwargs["device"] = torch.device("meta")  # a factory (rand, randn...): made on meta, no draw
        try:
            meta = func(*_map(to_meta, args), **meta_kwargs)
            if isinstance(meta, list):  # Tensor[] (split...): as many as the values say, of one dtype
                if not meta:
                    return ()
                dtypes = (_EACH, meta[0].dtype)
            else:
                dtypes = tuple(m.dtype if isinstance(m, torch.Tensor) else None
                               for m in (meta if isinstance(meta, tuple) else [meta]))
        except NotImplementedError:
            leaves = [kwargs.get("dtype")] + [t.dtype for t in torch.utils._pytree.tree_leaves((args, kwargs))
                                              if isinstance(t, torch.Tensor)]
            return _OPERANDS, next(d for d in leaves if d in ours)
        _DTYPES[key] = dtypes
    return dtypes


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
      (tests/test_torch_routes.py checks every finite one); for bfloat16 the binary32 steps can
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


#: Operations with a device equivalent, by aten overload packet (from the table of sim.ops).
ROUTES: dict[Any, Callable] = {getattr(aten, packet): _HANDLERS[packet] if packet in _HANDLERS else _handler(op)
                               for op in ops.OPS if op.device for packet in op.aten}


#: Operations that move or select values without arithmetic: exact as torch computes them. Every
#: view (``func.is_view``) and in-place view (``transpose_``, ``t_``, ``unsqueeze_``, ``as_strided_``...,
#: torch's ``inplace_view`` tag) is exact too, applied to the tensor itself. Among them: the
#: non-view splits (``unsafe_split``...), the gradients of a selection (``select_backward``,
#: ``slice_backward``, ``diagonal_backward``: +0 everywhere, the gradient copied into its place),
#: the quiet IEEE classifications (``isinf``, ``isnan``...: predicates on the stored bits, raising no
#: flags), selections by value (``sort``, ``topk``, ``max``/``min`` over a dimension or all, their
#: arg-forms, max pooling's 3-d and adaptive forms, ``tril``/``triu``), ``sgn``/``sign`` (-1, 0
#: or 1, exact in every format), ``nextafter`` (a neighbour in the operand's own format: in binary32 it
#: would round back to the operand), a value read out (``.item()``, ``_local_scalar_dense``: float(loss),
#: f"{loss:.4f}"; their meta kernels refuse) and dtype queries (``promote_types``, ``can_cast``).
EXACT = frozenset({
    aten.view, aten._unsafe_view, aten.reshape, aten.t, aten.transpose, aten.permute, aten.expand, aten.squeeze,
    aten.unsqueeze, aten.cat, aten.stack, aten.slice, aten.select, aten.index, aten.index_select, aten.gather,
    aten.clone, aten.detach, aten.alias, aten.split, aten.split_with_sizes, aten.unbind,
    aten.unsafe_split, aten.unsafe_split_with_sizes, aten.select_backward, aten.slice_backward,
    aten.isinf, aten.isnan, aten.isposinf, aten.isneginf, aten.threshold_backward, aten.embedding,
    aten.max_pool2d_with_indices, aten.constant_pad_nd, aten.as_strided, aten.lift_fresh,
    aten._reshape_alias, aten.flip, aten.roll, aten.repeat, aten.max_pool3d_with_indices, aten.adaptive_max_pool2d,
    aten.adaptive_max_pool3d, aten.tril, aten.triu, aten.sgn, aten.sign, aten.sort, aten.topk, aten.max, aten.min,
    aten.argmax, aten.argmin, aten.pixel_shuffle, aten.pixel_unshuffle, aten.diagonal_backward, aten.masked_scatter,
    aten._local_scalar_dense, aten.promote_types, aten.can_cast, aten.nextafter,
    aten.nextafter_,
    # Selections and copies whose every output is an operand's value or a constant 0 or 1: the sign
    # copied (IEEE copysign is a quiet operation), a step, a median, running maxima, an unpooling's
    # scatter, padding by reflection or replication, im2col's windows, a channel shuffle.
    aten.copysign, aten.copysign_, aten.heaviside, aten.heaviside_, aten.diag_embed, aten.channel_shuffle,
    aten._pack_padded_sequence,  # a packed sequence's rows (its backward is torch's composite of copies)
    aten.median, aten.nanmedian, aten.cummax, aten.cummin, aten.max_unpool2d,
    aten.max_unpool3d, aten.reflection_pad1d, aten.reflection_pad2d, aten.reflection_pad3d, aten.replication_pad1d,
    aten.replication_pad2d, aten.replication_pad3d, aten.im2col,
})

#: Overloads exact where others of their packet are not: a scatter that places values (not one
#: that reduces), and rounding to an integral value in a fixed direction (an integral binary16 or
#: bfloat16 value is held exactly; ``round`` to some decimals is not among them), and ``frac``
#: (x - trunc(x), exact by Sterbenz's lemma).
EXACT_OVERLOADS = frozenset({
    aten.scatter.src, aten.scatter.value, aten.scatter_.src, aten.scatter_.value, aten.floor.default,
    aten.ceil.default, aten.trunc.default, aten.round.default, aten.frac.default, aten.floor_.default,
    aten.ceil_.default, aten.trunc_.default, aten.round_.default, aten.frac_.default,
})

#: Factory operations, by the position of their fill value: torch makes the tensor, and a fill
#: value that the tensor's dtype cannot hold exactly is rounded into it on the device instead.
_FILLS = {aten.full: 1, aten.new_full: 2, aten.full_like: 1, aten.fill_: 1, aten.scalar_tensor: 0}
#: Factory operations of computed sequences: computed in binary64, each value rounded once on the device.
_SEQUENCES = frozenset({aten.arange, aten.linspace, aten.logspace})
#: Operations that create values: no operand is cast, so uninitialised memory never reaches the device.
FACTORIES = frozenset({
    aten.empty, aten.empty_strided, aten.new_empty, aten.new_empty_strided, aten.empty_like, aten.zeros,
    aten.ones, aten.zeros_like, aten.ones_like, aten.new_zeros, aten.new_ones, aten.zero_, aten.eye,
    aten._efficientzerotensor,
    *_FILLS, *_SEQUENCES,
})

#: The in-place twins of ROUTES (``add_``, ``relu_``...): the same handler, its result written into self.
_INPLACE: dict[Any, Callable] = {
    getattr(aten, f"{p.__name__.split('.')[-1]}_"): h for p, h in ROUTES.items()
    if hasattr(aten, f"{p.__name__.split('.')[-1]}_") and getattr(aten, f"{p.__name__.split('.')[-1]}_") not in ROUTES}

#: The route kinds, in the order they are tried (``mode.routes`` counts each call under one).
ROUTE_KINDS = ("exact", "factory", "random", "fused", "device", "float32")

_busy = threading.local()  # depth of DeviceMode calls being computed in this thread (nested modes)


def _kind(func) -> str:
    """The route kind of an aten overload: exact, factory, random, or "device" (a device handler
    is tried, else float32)."""
    packet = func.overloadpacket
    if packet in EXACT or func in EXACT_OVERLOADS or func.is_view or torch.Tag.inplace_view in func.tags:
        return "exact"
    if packet in FACTORIES:
        return "factory"
    if torch.Tag.nondeterministic_seeded in func.tags:
        return "random"
    return "device"


_KINDS: dict[Any, tuple[str, str, Any]] = {}  # each overload's name, route kind and packet, as first met


def _tensors(output) -> list[torch.Tensor]:
    """The tensors of a module's output: itself, those of a plain tuple or list, else every
    tensor leaf of its pytree (a model's output classes)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if output.__class__ in (tuple, list) and all(o is None or isinstance(o, torch.Tensor) for o in output):
        return [o for o in output if o is not None]
    return [t for t in torch.utils._pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]


def _map(fn: Callable, args):
    """``fn`` applied to each argument of an aten call and to each element of a list or tuple
    argument (aten's schemas nest no deeper: ``Tensor[]``, ``int[]``...); args a tuple, list or
    dict of keyword arguments, returned as the same kind. What pytree's ``tree_map`` gives for
    these, without its generality."""
    one = lambda x: [fn(y) for y in x] if x.__class__ is list else (  # noqa: E731
        tuple(fn(y) for y in x) if x.__class__ is tuple else fn(x))
    if args.__class__ is dict:
        return {k: one(v) for k, v in args.items()}
    return args.__class__(one(x) for x in args) if args.__class__ in (tuple, list) else tree_map(fn, args)


#: The sequence number torch gives the next autograd node made in this thread; AccumulateGrad's.
_next_sequence_nr, _NO_SEQUENCE_NR = torch._C._autograd._get_sequence_nr, 2**64 - 1
_forwards = threading.local()  # this thread's _Spans, as weak references, oldest first


class _Spans:
    """One outermost forward's module paths by autograd sequence number: the nodes numbered from
    ``starts[i]`` up to the next start were made by ``paths[i]`` (None: outside any module). Kept
    alive by its graph (the module outputs' nodes hold it), so that a backward in a later mode
    still finds it."""

    __slots__ = ("starts", "paths", "root", "params", "__weakref__")

    def __init__(self, root: torch.nn.Module) -> None:
        self.starts: list[int] = []
        self.paths: list[str | None] = []
        self.root, self.params = root, None

    def mark(self, path: str | None) -> None:
        """From the next node on, nodes are made by ``path``."""
        seq = _next_sequence_nr()
        if self.starts and self.starts[-1] == seq:  # no node since the last mark
            self.paths[-1] = path
        else:
            self.starts.append(seq)
            self.paths.append(path)

    def param_path(self, param: torch.Tensor) -> str | None:
        """The path of the module owning ``param`` (a shared one: the first), if the root has it."""
        if self.params is None:
            self.params = {}
            for name, m in self.root.named_modules():
                for p in m.parameters(recurse=False):
                    self.params.setdefault(id(p), name)
        return self.params.get(id(param))

    @classmethod
    def begin(cls, root: torch.nn.Module) -> _Spans:
        spans = cls(root)
        live = [r for r in getattr(_forwards, "spans", ()) if r() is not None]
        live.append(weakref.ref(spans))
        _forwards.spans = live
        return spans


def _node_path(node) -> str | None:
    """The module path of the forward that made autograd ``node``, if its forward's record is alive;
    for a parameter's AccumulateGrad, the module owning it in the latest forward that has it."""
    seq = node._sequence_nr()
    for ref in reversed(getattr(_forwards, "spans", ())):
        spans = ref()
        if spans is None or not spans.starts:
            continue
        if seq == _NO_SEQUENCE_NR:
            path = spans.param_path(node.variable)
            if path is not None:
                return path
        elif spans.starts[0] <= seq:
            return spans.paths[bisect.bisect_right(spans.starts, seq) - 1]
    return None


def _check_backward(grad_outputs):
    """Refuse to let the backward pass of operations made under a DeviceMode run where no
    DeviceMode is active (natively, unseen by any device)."""
    if not any(isinstance(m, DeviceMode) for m in _get_current_dispatch_mode_stack()):
        raise RuntimeError(
            "the backward pass of operations run under DeviceMode is running outside it (after its with "
            "block, or in another thread): its operations would run natively, unseen by the device. Run "
            "backward inside a DeviceMode, in the same thread.")


@functools.cache
def _fused_packets(families: tuple[str, ...]) -> frozenset:
    """The aten packets of the fused families named."""
    return frozenset(getattr(aten, p) for f in _fused.FAMILIES if f.name in families
                     for p in f.aten if hasattr(aten, p))


class DeviceMode(TorchDispatchMode):
    """Route every aten operation on float16 / bfloat16 tensors (float32 too with
    ``float32=True``) to ``device``; see the module's docstring for the routes.

    An eager mode: torch.compile is not meant to trace its ``__torch_dispatch__``, so it opts
    out of the ``torch._disable_dynamo`` wrapper that torch puts around every dispatch-mode
    subclass's ``__torch_dispatch__`` (torch/utils/_python_dispatch.py,
    ``TorchDispatchMode.__init_subclass__`` and ``_should_skip_dynamo``), which costs each
    operation an eval-frame switch. A torch without that hook ignores the classmethod."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __init__(self, device: Device, *, strict: bool = False, float32: bool = False,
                 fused: bool | dict[str, bool] | None = None) -> None:
        super().__init__()
        self.fused = _fused.choose(fused)  # each family's model (sim.fused.FAMILIES)
        self._fused_packets = _fused_packets(tuple(f.name for f in _fused.FAMILIES if self.fused[f.name]))
        self._functions = _Functions(self)
        if not isinstance(device, Device):
            raise TypeError(f"DeviceMode takes a sim.Device, got {type(device).__name__}")
        self.device, self.strict = device, strict
        self._op = _Op(self)  # the routed calls' arguments' conversion (it keeps no call's state)
        self.dtypes = frozenset({torch.float16, torch.bfloat16} | ({torch.float32} if float32 else set()))
        self.routes: collections.Counter[tuple[str, str]] = collections.Counter()
        self.events: collections.Counter[str] = collections.Counter()
        self._modules: list[str] = []  # the forward pass's module paths, innermost last
        self._names: dict[int, str] = {}
        self._spans: _Spans | None = None
        self._hooks: list[Any] = []

    def __enter__(self):
        hooks = torch.nn.modules.module
        self._modules = []
        self._hooks = [hooks.register_module_forward_pre_hook(self._enter_module),
                       hooks.register_module_forward_hook(self._leave_module)]
        self._functions.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        try:
            return super().__exit__(*exc)
        finally:
            self._functions.__exit__(*exc)

    def _enter_module(self, module, args) -> None:
        if not self._modules:  # the outermost module: it names the others
            self._names = {id(m): name for name, m in module.named_modules()}
            self._spans = _Spans.begin(module)
        path = self._names.get(id(module), type(module).__name__)
        self._modules.append(path)
        self._spans.mark(path)

    def _leave_module(self, module, args, output) -> None:
        self._modules.pop()
        spans = self._spans
        spans.mark(self._modules[-1] if self._modules else None)
        # The module's outputs' nodes are checked: a backward pass from outside the module reaches one
        # of them before any node of its forward. The check is one function for every mode, so a node
        # that outlives its mode serves later modes; the nodes keep their forward's spans alive.
        for t in _tensors(output):
            node = t.grad_fn
            if node is not None:
                metadata = node.metadata
                if _CHECKED not in metadata:
                    metadata[_CHECKED] = spans
                    node.register_prehook(_check_backward)
        if not self._modules:  # the outermost module's exit: the spans now live as long as the graph does
            self._spans = None

    def _label(self) -> str:
        node = torch._C._current_autograd_node()
        if node is not None:  # backward: the module whose forward made this node
            return _node_path(node) or self.device.current_label or ""
        return self._modules[-1] if self._modules else (self.device.current_label or "")

    def _ours(self, args, kwargs) -> bool:
        """An operand of our dtypes (on the CPU), or a result asked for in one (a dtype argument)."""
        dtypes = self.dtypes
        for xs in (args, kwargs.values()) if kwargs else (args,):
            for x in xs:
                if isinstance(x, torch.Tensor):
                    if x.dtype in dtypes and x.is_cpu:
                        return True
                elif isinstance(x, (list, tuple)):
                    if any(isinstance(t, torch.Tensor) and t.dtype in dtypes and t.is_cpu for t in x):
                        return True
                elif isinstance(x, torch.dtype) and x in dtypes:
                    return True
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Inside another DeviceMode's call (nested modes), its own torch calls pass through: the
        # innermost mode computes.
        if getattr(_busy, "depth", 0) or not self._ours(args, kwargs):
            return func(*args, **kwargs)
        known = _KINDS.get(func)
        if known is None:
            known = _KINDS[func] = str(func), _kind(func), func.overloadpacket
        name, kind, packet = known
        if packet in self._fused_packets:  # before the others: attention's kernels draw dropout
            kind = "fused"
        if kind == "exact":
            _busy.depth = 1  # (only reached at depth 0)
            try:
                result = func(*args, **kwargs)
            finally:
                _busy.depth = 0
            self.routes[name, "exact"] += 1
            return result
        label = self._label()
        block = self.device.label(label)
        _busy.depth = 1
        try:
            with block:
                if kind == "factory":
                    route, result = "factory", self._factory(func, args, kwargs)
                elif kind == "random":
                    route, result = "random", self._random(func, args, kwargs)
                elif kind == "fused":  # a fused kernel: binary32 inside, each output rounded once
                    route, result = "fused", self._float32(func, args, kwargs)
                else:
                    route, result = self._route(func, packet, name, args, kwargs)
        finally:
            _busy.depth = 0
            if block.raised:
                self.events[label] += 1
        self.routes[name, route] += 1
        return result

    def _factory(self, func, args, kwargs):
        """A new tensor made by torch (its own checks, dtype and layout); values that its dtype
        cannot hold exactly (a fill value, a computed sequence) are rounded into it on the device."""
        result = func(*args, **kwargs)
        packet = func.overloadpacket
        if not isinstance(result, torch.Tensor) or result.dtype not in _NUMPY or result.numel() == 0:
            return result
        target = _NUMPY[result.dtype]
        if packet in _FILLS:
            value = args[_FILLS[packet]]
            value = value.item() if isinstance(value, torch.Tensor) else value
            value = float(value)
            if _held(value, result.dtype):
                return result  # a value the dtype holds (Inf and NaN too): written as it is, no rounding
            result.fill_(float(self.device.cast(np.asarray(value, np.float64), target)))
        elif packet in _SEQUENCES:
            wide = func(*args, **{**kwargs, "dtype": torch.float64})
            if wide.shape == result.shape:
                result.copy_(_tensor(self.device.cast(wide.numpy(), target)))
        return result

    def _random(self, func, args, kwargs):
        """A random operation: the draw in binary32 from torch's generator (a Bernoulli draw is 0 or 1,
        exact in every format; a continuous draw is rounded once on the device); dropout's mask and
        scale multiplies are device multiplies."""
        if func.overloadpacket is aten.native_dropout:
            try:
                return _dropout(self._op, *args, **kwargs)
            except TypeError:
                pass
        # A uniform draw on [from, to) is rounded downward, so that it stays below ``to`` in its dtype.
        return self._float32(func, args, kwargs, "DOWNWARD" if func.overloadpacket in _UNIFORM else None)

    def _route(self, func, packet, name: str, args, kwargs) -> tuple[str, Any]:
        handler, into = ROUTES.get(packet), None
        if handler is None and packet in _INPLACE:  # add_, relu_...: the functional op's route, written into self
            handler, into = _INPLACE[packet], args[0]
        out = kwargs.get("out")
        if handler is not None and (out is None or isinstance(out, torch.Tensor)):
            rest = {k: v for k, v in kwargs.items() if k != "out"} if out is not None else kwargs
            op = self._op
            try:
                result = handler(op, *args, **rest)
            except _Exact:
                return "exact", func(*args, **kwargs)
            except _Fused:
                return "fused", self._float32(func, args, kwargs)
            except (_Unmapped, TypeError):
                pass
            else:
                if out is not None:
                    into = out
                return "device", result if into is None else _write(op, into, result)
        if self.strict:
            raise NotImplementedError(f"{name} has no device equivalent (DeviceMode(strict=True)); "
                                      f"without strict it runs in float32 and is rounded once on the device")
        return "float32", self._float32(func, args, kwargs)

    def _passthrough(self, fn: Callable, *, kernel: bool = False):
        """fn() run by torch natively, unseen by the mode (its own computation); a ``kernel``'s
        computation is unseen by any dispatch mode too, as a routed call's is (the kernel is
        counted as one call)."""
        depth = getattr(_busy, "depth", 0)
        _busy.depth = 1
        try:
            if not kernel:
                return fn()
            with _disable_current_modes():
                return fn()
        finally:
            _busy.depth = depth

    def _fused_call(self, name: str, fn: Callable, dtypes: torch.dtype | list[torch.dtype],
                    operands: list[torch.Tensor], *, numpy: bool = False) -> list[Any]:
        """A fused kernel above autograd: fn() (a tensor or a list) computed in binary32 by
        ``sim.torch_binary32`` from the binary32 ``operands``, each of its results rounded once on
        the device into ``dtypes`` (one dtype: for each), with the events that reached its
        outputs; counted as one ``fused`` route. ``numpy``: fn computes outside any mode (numpy's
        binary32) and returns (results, the elementwise functions' flags), judged the same way."""
        dev, label = self.device, self._label()

        def kernel():
            if numpy:
                outs, flags = fn()
                events = _binary32.judge(outs, operands, flags)
            else:
                outs, events = _binary32.run(fn, operands)
            outs = outs if isinstance(outs, list) else [outs]
            each = dtypes if isinstance(dtypes, list) else [dtypes] * len(outs)
            kept = [(i, o, d) for i, (o, d) in enumerate(zip(outs, each, strict=True)) if o is not None]
            rounded = dev.round_results([_numpy(o.detach()) for _, o, _ in kept], [_NUMPY[d] for _, _, d in kept],
                                        events, name)
            result: list[Any] = [None] * len(outs)
            for (i, _, _), r in zip(kept, rounded, strict=True):
                result[i] = _tensor(r)
            return result

        with dev.label(label) as block:
            rounded = self._passthrough(kernel, kernel=True)
        if block.raised:
            self.events[label] += 1
        self.routes[name, "fused"] += 1
        return rounded

    def _float32(self, func, args, kwargs, rounding: str | None = None):
        """func computed in binary32 from the exact values of its operands (``sim.torch_binary32``:
        the same bits on every host), each floating result rounded once on the device into the
        dtype torch gives it (see ``_result_dtypes``), with the events the computation raised
        inside (an infinity or NaN reaching an output). Every argument the operation writes (its
        schema says which: ``self`` in place, ``out=``, a batch norm's running statistics, rrelu's
        noise) is written back, rounded on the device, as torch's kernel writes it."""
        dtypes = _result_dtypes(func, args, kwargs, self.dtypes)
        copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def wide(x):  # our tensors as float32, and dtype arguments naming ours (input_dtype=...) too
            if isinstance(x, torch.Tensor) and x.dtype in self.dtypes:
                pair = copies.get(id(x))
                if pair is None:
                    pair = copies[id(x)] = (x, x.float())
                return pair[1]
            return torch.float32 if isinstance(x, torch.dtype) and x in self.dtypes else x

        out, events = _binary32.evaluate(func, _map(wide, args), _map(wide, kwargs))
        targets = _written(func, args, kwargs)
        # Widening quiets a signaling NaN (x.float()); the operation still met it. Only the operands it
        # reads: a tensor it writes may be uninitialised (bernoulli_ into empty_like, out=).
        if any(_signaling(x, w) for x, w in copies.values() if not any(x is t for t in targets)):
            events |= _INVALID
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if dtypes and dtypes[0] is _OPERANDS:  # no meta kernel: each floating result in the operands' dtype
            dtypes = [dtypes[1] if isinstance(o, torch.Tensor) and o.is_floating_point() else None for o in outs]
        elif dtypes and dtypes[0] is _EACH:
            dtypes = [dtypes[1]] * len(outs)
        written = [copies[id(t)] for t in targets if id(t) in copies]
        written = [(orig, w) for orig, w in written if w is not orig]
        alias = {id(w): orig for orig, w in written}
        values, places = [], []
        for i, (o, d) in enumerate(zip(outs, dtypes, strict=True)):
            if isinstance(o, torch.Tensor) and id(o) not in alias and d in self.dtypes and o.dtype != d:
                values.append(o)
                places.append((i, d))
        values += [w for _, w in written]
        places += [(orig, orig.dtype) for orig, _ in written]
        name = func.overloadpacket.__name__
        rounded = self.device.round_results([_numpy(v) for v in values], [_NUMPY[d] for _, d in places], events,
                                            name, rounding)
        for (place, _), r in zip(places, rounded, strict=True):
            if isinstance(place, int):
                outs[place] = _tensor(r)
            else:  # a written argument: its new values, rounded, written into it
                if place.shape != r.shape:
                    place.resize_(r.shape)
                place.copy_(_tensor(r))
        outs = [alias.get(id(o), o) if isinstance(o, torch.Tensor) else o for o in outs]
        # one result (a tensor; None: an in-place _foreach_ op; a number or dtype) as it is, else the tuple or list
        return type(out)(outs) if isinstance(out, (tuple, list)) else outs[0]


_UNIFORM = frozenset({aten.rand, aten.rand_like, aten.uniform, aten.uniform_})  # draws on [from, to)
_WRITTEN: dict[Any, tuple[tuple[int, str], ...]] = {}
#: Kernels that write arguments their schemas do not mark (``Tensor? running_mean``), by packet: the
#: tensors a call writes. native_batch_norm in training and batch_norm_update_stats update a batch
#: norm's running statistics in place.
_UNMARKED: dict[Any, Callable] = {
    aten.native_batch_norm: lambda input, weight, bias, running_mean, running_var, training, *rest, **kw:
        [t for t in (running_mean, running_var) if training and isinstance(t, torch.Tensor)],
    aten.batch_norm_update_stats: lambda input, running_mean, running_var, *rest, **kw:
        [t for t in (running_mean, running_var) if isinstance(t, torch.Tensor)],
}


def _signaling(x: torch.Tensor, wide: torch.Tensor) -> bool:
    """Whether x holds a signaling NaN (``wide``: x widened to binary32, where NaNs are looked for
    first, numpy's binary32 isnan being fast)."""
    w = _numpy(wide)
    if not (np.isnan(w).any() if w.size < 4096 else elementary.specials(w) == 2):
        return False
    found = elementary.signaling(_numpy(x))
    return found is not None and bool(found.any())


def _written(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors a call writes, as its schema marks them (``Tensor(a!)``), and those of
    ``_UNMARKED``."""
    places = _WRITTEN.get(func)
    if places is None:
        places = _WRITTEN[func] = tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                                        if a.alias_info is not None and a.alias_info.is_write)
    unmarked = _UNMARKED.get(func.overloadpacket)
    found = unmarked(*args, **kwargs) if unmarked is not None else []
    for i, name in places:
        v = args[i] if i < len(args) else kwargs.get(name)
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(t for t in v if isinstance(t, torch.Tensor))
    return found


# --- Fused families above autograd: the unfused decompositions, and fused kernels torch's CPU
# build has no aten operation for (attention with dropout, RMS norm, LSTM, GRU) ---------------------

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
    def forward(ctx, mode: DeviceMode, name: str, fn: Callable, *xs):
        ctx.mode, ctx.kernel, ctx.fn = mode, name, fn
        ctx.save_for_backward(*[x if isinstance(x, torch.Tensor) else None for x in xs])
        ctx.others = [None if isinstance(x, torch.Tensor) else x for x in xs]
        dtype = next(x.dtype for x in xs if isinstance(x, torch.Tensor) and x.dtype in mode.dtypes)
        ctx.tuple = False

        wide = [_wide(x) for x in xs]

        def kernel():
            out = fn(*wide)
            ctx.tuple = isinstance(out, tuple)
            return list(out) if ctx.tuple else out

        rounded = mode._fused_call(name, kernel, dtype, _floating(wide))
        return tuple(rounded) if ctx.tuple else rounded[0]

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        xs = [o if t is None else t for t, o in zip(saved, ctx.others, strict=True)]
        differentiable = [i for i, x in enumerate(xs) if isinstance(x, torch.Tensor) and x.is_floating_point()
                          and ctx.needs_input_grad[i + 3]]

        wide32 = [_wide(x).detach() if isinstance(x, torch.Tensor) else x for x in xs]
        grads32 = [None if g is None else g.float() for g in grads]

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
                                       _floating(wide32 + grads32))
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
            and _binary32._masks_ours(mask))


def _attention32_steps(q, k, v, keep, mask, p, is_causal, scale):
    """_attention's steps in numpy, the modelled operations (the same values as its torch operations
    in Binary32Mode): (output, softmax, attention after dropout, scale)."""
    scale = 1 / q.shape[-1] ** 0.5 if scale is None else scale
    scores = _binary32._scores(_numpy(q), _numpy(k), mask, is_causal, scale)
    attn = _binary32._softmax_np(None, scores)
    dropped = attn
    if keep is not None:
        with np.errstate(all="ignore"):
            dropped = (attn * _numpy(keep)) / np.float32(1 - p)
    return _tensor(_binary32.binary32.matmul(dropped, _numpy(v))), attn, dropped, scale


def _attention32_vjp(q, k, v, keep, mask, p, is_causal, scale, grad, of_mask: bool = False
                     ) -> tuple[torch.Tensor, ...]:
    """The gradients of :func:`_attention32` with respect to q, k and v (and an additive mask, with
    ``of_mask``) by the formulas autograd applies to its torch operations, in the same order:
    dA = dO V^T, dV = A^T dO, back through the dropout (/ (1 - p), then * keep), softmax
    (g y - y rowsum(g y)) and the mask (zero where a boolean one is False; an additive one's
    gradient this, summed to its shape as autograd sums a broadcast operand's), then the scale,
    dQ = dS K and dK = (Q^T dS)^T."""
    _, attn, dropped, scale = _attention32_steps(q, k, v, keep, mask, p, is_causal, scale)
    b32, g = _binary32.binary32, _numpy(grad)
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


def _f_attention(mode: DeviceMode, fused: bool, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
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
    def forward(ctx, mode: DeviceMode, kind: str, config: dict, *xs):
        ctx.set_materialize_grads(False)
        ctx.mode, ctx.kind, ctx.dtype = mode, kind, xs[0].dtype
        wide = [_wide(x).detach() for x in xs]
        states = 2 if kind == "lstm" else 1

        def kernel():
            arrays = [w.numpy() for w in wide]
            outs, ctx.tape, flags = _recurrent.forward(kind, arrays[0], arrays[1:1 + states], arrays[1 + states:],
                                                      **config)
            return [_tensor(o) for o in outs], flags

        ctx.wide = wide
        return tuple(mode._fused_call("aten." + kind, kernel, ctx.dtype, wide, numpy=True))

    @staticmethod
    def backward(ctx, *grads):
        grads32 = [None if g is None else g.float() for g in grads]
        wanted = ctx.needs_input_grad[3:]

        def kernel():
            gs, flags = _recurrent.backward(ctx.tape, [None if g is None else g.numpy() for g in grads32])
            return [_tensor(g) if g is not None and need else None for g, need in zip(gs, wanted, strict=True)], flags

        rounded = ctx.mode._fused_call(f"aten.{ctx.kind}_backward", kernel, ctx.dtype,
                                       _floating(ctx.wide + grads32), numpy=True)
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


def _call(mode: DeviceMode, func: Callable, *args, **kwargs):
    """func as the mode computes it (its family's model), else torch's own."""
    family, fn = FUNCTIONS[func]
    result = fn(mode, mode.fused[family], *args, **kwargs)
    return func(*args, **kwargs) if result is NotImplemented else result


class _Functions(torch.overrides.TorchFunctionMode):
    """A DeviceMode's torch-function level: the functions of the fused families on our tensors."""

    def __init__(self, mode: DeviceMode) -> None:
        super().__init__()
        self.mode = mode

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FUNCTIONS and not getattr(_busy, "depth", 0) and args and isinstance(args[0], torch.Tensor) \
                and args[0].dtype in self.mode.dtypes and args[0].device.type == "cpu":
            return _call(self.mode, func, *args, **kwargs)
        return func(*args, **kwargs)
