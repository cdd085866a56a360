"""The routes table: which route each aten operation takes (``ROUTE_KINDS``), the device
operations (``ROUTES``), the exact ones, the factories, and the dtypes torch gives a result."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import ops
from .convert import _map, aten
from .handlers import _HANDLERS, _handler

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

