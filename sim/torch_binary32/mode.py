"""``Binary32Mode`` and the tables it dispatches with: which model computes each operation, and the
events a computation raises at its outputs (``evaluate``, ``run``, ``judge``)."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch._decomp import decomposition_table
from torch.utils._python_dispatch import TorchDispatchMode

from .. import elementary
from .attention import _attention_math_op, _efficient, _efficient_backward, _flash, _flash_backward
from .common import _DIVBYZERO, _F32, _F64, _INVALID, _OVERFLOW, _cr, aten, prims
from .draws import _draw, _dropout, _rrelu_with_noise
from .gradients import _grid_sampler_2d_backward, _weight_norm_interface_backward
from .losses import (
    _ctc_loss,
    _ctc_loss_backward,
    _embedding_bag,
    _embedding_bag_backward,
    _embedding_bag_per_sample_weights_backward,
    _multi_margin_loss,
    _multi_margin_loss_backward,
)
from .norms import (
    _batch_norm_backward,
    _batch_norm_legit_functional,
    _batch_norm_legit_no_training,
    _batch_norm_no_stats,
    _embedding_dense_backward,
    _native_batch_norm,
    _native_layer_norm,
    _native_layer_norm_backward,
    _softmax_backward_data,
    _softmax_op,
)
from .pointwise import (
    _UNARY,
    _add,
    _addcdiv,
    _addcmul,
    _binary_cr,
    _elu,
    _elu_backward,
    _gelu,
    _gelu_backward,
    _glu,
    _glu_backward,
    _lerp,
    _log_sigmoid_forward,
    _numpy_ieee,
    _pow,
    _softplus,
    _softplus_backward,
    _sub,
    _unary,
)
from .pooling import (
    _adaptive_avg_pool,
    _adaptive_avg_pool_backward,
    _avg_pool,
    _avg_pool_backward,
    _max_pool_backward,
    _replication_pad_backward,
    _upsample_backward,
)
from .products import (
    _addbmm,
    _addmm,
    _addmv,
    _baddbmm,
    _convolution,
    _convolution_backward,
    _dot,
    _index_add,
    _index_put,
    _index_put_,
    _mm,
    _scatter_add,
)
from .reductions import (
    _cdist,
    _cdist_backward,
    _cumprod,
    _cumsum,
    _embedding_renorm_,
    _logcumsumexp,
    _logsumexp,
    _mean,
    _norm,
    _pdist,
    _pdist_backward,
    _prod,
    _std,
    _std_mean,
    _sum,
    _trilinear,
    _var,
    _var_mean,
    _vector_norm,
)

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
    if t.dtype in (_F32, _F64, torch.float16) and t.layout == torch.strided and t.is_cpu:
        try:
            a = (t.detach() if t.requires_grad else t).numpy()
        except (RuntimeError, TypeError):  # a tensor numpy cannot view (a negative or conjugate bit set)
            pass
        else:  # numpy's isfinite for small arrays and binary64, one pass without a temporary for large ones
            return bool(np.isfinite(a).all()) if a.size < 4096 or t.dtype == _F64 else elementary.specials(a) == 0
    return bool(torch.isfinite(t).all())


_ELEMENTWISE = frozenset({getattr(aten, name) for name in _UNARY if hasattr(aten, name)} | {
    aten.gelu, aten.gelu_backward, aten.elu, aten.elu_backward, aten.softplus, aten.softplus_backward,
    aten.silu_backward, aten.mish_backward, aten.sigmoid_backward, aten.tanh_backward, aten.atan2, aten.hypot,
    aten.logaddexp, aten.pow, aten.addcmul, aten.addcdiv, aten.lerp, aten.log_sigmoid_backward})

