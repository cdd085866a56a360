"""The dispatch mode: ``DeviceMode`` takes every aten operation on our dtypes by one of its routes,
and its torch-function level takes the functions of the fused families."""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes, _get_current_dispatch_mode_stack

from .. import fused as _fused
from .. import torch_binary32 as _binary32
from ..device.core import Device
from ..kernels import INVALID as _INVALID
from .convert import _NUMPY, _held, _map, _numpy, _Op, _signaling, _tensor, aten
from .draws import _UNIFORM, _bernoulli_, _dropout
from .functions import FUNCTIONS, _call
from .handlers import _Exact, _Fused, _Unmapped, _write
from .labels import _CHECKED, _node_path, _Spans, _tensors
from .routes import _EACH, _FILLS, _INPLACE, _KINDS, _OPERANDS, _SEQUENCES, ROUTES, _kind, _result_dtypes

_busy = threading.local()  # depth of DeviceMode calls being computed in this thread (nested modes)


@contextlib.contextmanager
def on_host() -> Iterator[None]:
    """Torch calls inside run on the host, as if no DeviceMode were active: an observer's own work
    (a debugger's statistics and copies of the tensors it records) neither computes on the device
    nor reaches its register, which sees the model's operations alone."""
    depth = getattr(_busy, "depth", 0)
    _busy.depth = depth + 1
    try:
        yield
    finally:
        _busy.depth = depth


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
        packet = func.overloadpacket
        if packet is aten.native_dropout or func is aten.bernoulli_.float:
            try:
                return (_dropout if packet is aten.native_dropout else _bernoulli_)(self._op, *args, **kwargs)
            except TypeError:
                pass
        # A uniform draw on [from, to) is rounded downward, so that it stays below ``to`` in its dtype.
        return self._float32(func, args, kwargs, "DOWNWARD" if packet in _UNIFORM else None)

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
                    operands: list[torch.Tensor], *, numpy: bool = False, invalid: bool = False) -> list[Any]:
        """A fused kernel above autograd: fn() (a tensor or a list) computed in binary32 by
        ``sim.torch_binary32`` from the binary32 ``operands``, each of its results rounded once on
        the device into ``dtypes`` (one dtype: for each), with the events that reached its
        outputs; counted as one ``fused`` route. ``numpy``: fn computes outside any mode (numpy's
        binary32) and returns (results, the elementwise functions' flags), judged the same way.
        ``invalid``: the kernel met a signaling NaN among its operands, which their widening
        quieted (``functions._widened``)."""
        dev, label = self.device, self._label()

        def kernel():
            if numpy:
                outs, flags = fn()
                events = _binary32.judge(outs, operands, flags)
            else:
                outs, events = _binary32.run(fn, operands)
            events |= _INVALID if invalid else 0
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

