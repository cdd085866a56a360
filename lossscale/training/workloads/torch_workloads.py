"""PyTorch models as simulator workloads (optional extra ``torch``).

:class:`TorchWorkload` wraps a user's ``torch.nn.Module``, a loss function and
data into the :class:`lossscale.training.workloads.Workload` protocol. Master weights
are binary32 numpy arrays (the simulator's); each step they are cast on the
device to the compute dtype (binary16 or bfloat16), the model runs forward and
backward under :class:`sim.torch.DeviceMode` with the loss multiplied by the
loss scale (times the rank's share of the global batch), and the parameters'
low-precision gradients are the step's gradients; the optimizer unscales them.
The binary32 reference is the same model in torch float32 under
:class:`sim.torch_binary32.Binary32Mode`, whose every bit is a function of the
operands (torch's own float32 kernels differ by CPU capability, tensor length
and BLAS), and the built-in models' initial weights are drawn in the same mode
(torch's float32 ``uniform_`` and ``normal_`` differ by CPU capability too).

Built in: ``torch-mlp`` (64-32-10 on the 8x8 digits, the hand-written ``mlp``'s
model in torch), ``torch-cnn`` (a small CNN on the digits as 1x8x8 images:
conv 3x3, ReLU, max-pool, linear) and ``torch-transformer`` (one pre-norm
transformer block, character-level, on the Zen of Python: embeddings, layer
norm, causal attention with batched matmuls and softmax, GELU, dropout,
cross-entropy).
"""

from __future__ import annotations

import copy
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import torch

from sim import Device
from sim.torch import DeviceMode
from sim.torch_binary32 import Binary32Mode

from ...policy.core import check_bool
from ..phases import begin_phase
from .base import COUNT, FLAG, MOMENTUM, POSITIVE, Argument, SampledWorkload, argument, digits, logits_in
from .builtin import DIGITS_TRAIN, check_fields

# TorchWorkload and the built-in torch workloads are public as lossscale.training.workloads' (imported
# with torch on first use): one import path each.
__all__ = ["logits_of"]

_DTYPES = {"float16": (torch.float16, np.dtype(np.float16)), "bfloat16": (torch.bfloat16, np.dtype(ml_dtypes.bfloat16))}
DTYPE = Argument("text", choices=tuple(_DTYPES))
DIGITS_BATCH = Argument("integer", low=1, high=DIGITS_TRAIN)


def logits_of(output: Any) -> torch.Tensor:
    """The logits of a model's output: a tensor itself; else the ``logits`` key (a dict, a
    Hugging Face ``ModelOutput``) or attribute; else the first element of a tuple, list or dict."""
    return logits_in(output, lambda t: isinstance(t, torch.Tensor), "TorchWorkload(..., output_fn=...)")


@dataclass(eq=False)
class _Owned:
    """A parameter list's buffers (in binary32) and whether the device run trains it."""

    params: list[np.ndarray]
    buffers: list[torch.Tensor]
    device: bool = False


def _load(model: torch.nn.Module, buffers: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for b, v in zip(model.buffers(), buffers, strict=True):
            b.copy_(v)


def _save(model: torch.nn.Module, buffers: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for b, v in zip(model.buffers(), buffers, strict=True):
            v.copy_(b)


class TorchWorkload(SampledWorkload):
    """A torch model, a loss and data as a workload.

    ``data``: ``(inputs, targets)`` for training and optionally ``test=(inputs, targets)``
    for :meth:`evaluate` (numpy arrays or tensors; inputs float32). ``loss_fn(output,
    target)`` gives the mean loss over the batch; it receives the model's output in the
    compute dtype (cast to float32 inside it, as mixed-precision code does, to compute the
    loss in binary32). ``accuracy=True`` reports the argmax accuracy of integer targets.
    A model may return a tensor, a Hugging Face ``ModelOutput``, a tuple or a dict:
    ``loss_fn`` receives ``output_fn(output)`` (default: the output as the model returns it),
    and the accuracy is taken of its logits (:func:`logits_of`: the tensor itself, else the
    ``logits`` key or attribute, else the first element) where their argmax has the targets'
    shape; where it does not (a causal LM's (N, T, V) logits against (N,) labels), the accuracy
    is NaN with a warning saying why. ``metric_fn(output, target)``, a float, replaces it.
    ``log_perplexity=True`` also computes, for logging, exp of the sum of the batch's losses
    (the mean times the number of targets) in the compute dtype on the device.

    Buffers (BatchNorm running statistics) belong to the parameter list they train with: each
    list given to :meth:`forward_backward` or :meth:`grads32` (by identity) has its own, from
    the model's initial ones, so the binary32 baseline never depends on the device run.
    ``grads32`` of a list that ``forward_backward`` trains (the reference gradients) uses its
    buffers and leaves them as they were; :meth:`evaluate` uses the list's own (the initial
    ones for a list it has not seen). The last 32 lists are remembered.

    The step's phases are marked on the device: ``forward`` (the model), ``loss``, ``log``,
    ``scale`` (the loss times S) and ``backward``.
    """

    marks_phases = True

    def __init__(self, model: torch.nn.Module, loss_fn: Callable, data: Sequence, *, test: Sequence | None = None,
                 batch: int = 64, learning_rate: float = 0.1, momentum: float = 0.9, dtype: str = "float16",
                 seed: int = 0, name: str | None = None, accuracy: bool | None = None,
                 strict: bool = False, log_perplexity: bool = False,
                 output_fn: Callable[[Any], Any] | None = None,
                 metric_fn: Callable[[Any, Any], float] | None = None) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        dtype = {torch.float16: "float16", torch.bfloat16: "bfloat16"}.get(dtype, dtype)  # torch's dtypes too
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)} (or torch's), got {dtype!r}")
        x, y = (torch.as_tensor(np.asarray(v)) for v in data)
        self.x, self.y = (x.float() if x.is_floating_point() else x), y
        self.test = tuple(torch.as_tensor(np.asarray(v)) for v in test) if test is not None else (self.x, self.y)
        self.model32 = copy.deepcopy(model).float()
        self._sample_from([p.detach().numpy() for p in self.model32.parameters()], len(x), len(y), batch=batch,
                          learning_rate=learning_rate, momentum=momentum, seed=seed)
        self.dtype, self._np = _DTYPES[dtype]
        self.model = copy.deepcopy(model).to(self.dtype)
        for what, fn in (("output_fn", output_fn), ("metric_fn", metric_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{what} must be callable, got {type(fn).__name__}")
        self.loss_fn, self.strict, self.output_fn, self.metric_fn = loss_fn, strict, output_fn, metric_fn
        check_bool("log_perplexity", log_perplexity)
        self.log_perplexity = log_perplexity
        self.name = name or type(model).__name__
        self.has_accuracy = bool(accuracy if accuracy is not None else not torch.is_floating_point(y))
        self._calls = 0
        self._buffers0 = [b.detach().clone() for b in self.model32.buffers()]
        self._owned: OrderedDict[int, _Owned] = OrderedDict()  # id(params) -> its buffers
        self.routes: dict = {}  # the last step's DeviceMode routes
        self.events: dict = {}  # the last step's ops with register events, per module

    def forward_backward(self, dev: Device, params: list[np.ndarray], scale: float, idx: np.ndarray,
                         share: float = 1.0) -> tuple[float, list[np.ndarray]]:
        """The loss and the compute-dtype gradients of ``scale * share * loss``, on ``dev``."""
        with torch.no_grad():
            for p, v in zip(self.model.parameters(), params, strict=True):
                p.copy_(torch.from_numpy(dev.cast(v, self._np).view(np.int16)).view(self.dtype))
                p.grad = None
        owned = self._own(params, device=True)
        _load(self.model, owned.buffers)
        x, y = self.x[torch.as_tensor(idx)], self.y[torch.as_tensor(idx)]
        self._calls += 1
        # Dropout: the same masks in every run, from a seed of the step's own; the caller's
        # random state is left as it was.
        with torch.random.fork_rng(), DeviceMode(dev, strict=self.strict) as mode:
            torch.manual_seed(self.seed * 1_000_003 + self._calls)
            out = self._seen(self.model(x.to(self.dtype) if x.is_floating_point() else x))
            begin_phase(dev, "loss")
            with dev.label("loss"):  # operations outside the model's modules, both ways
                loss = self.loss_fn(out, y)
            if self.log_perplexity:
                begin_phase(dev, "log")
                with dev.label("perplexity"), torch.no_grad():
                    torch.exp((loss * y.numel()).to(self.dtype))
            begin_phase(dev, "scale")
            scaled = loss * (scale * share)
            begin_phase(dev, "backward")
            with dev.label("loss"):
                scaled.backward()
        _save(self.model, owned.buffers)
        self.routes, self.events = dict(mode.routes), dict(mode.events)
        grads = [p.grad.view(torch.int16).numpy().view(self._np) for p in self.model.parameters()]
        return float(loss.detach()) * share, grads

    def grads32(self, params: list[np.ndarray], idx: np.ndarray, share: float = 1.0):
        """The same loss and unscaled gradients in torch float32, under :class:`Binary32Mode`."""
        model = self.model32
        with torch.no_grad():
            for p, v in zip(model.parameters(), params, strict=True):
                p.copy_(torch.from_numpy(v))
                p.grad = None
        owned = self._own(params, device=False)
        _load(model, owned.buffers)
        x, y = self.x[torch.as_tensor(idx)], self.y[torch.as_tensor(idx)]
        with torch.random.fork_rng(), Binary32Mode():  # the dropout masks of the last forward_backward
            torch.manual_seed(self.seed * 1_000_003 + self._calls)
            loss = self.loss_fn(self._seen(model(x)), y) * share
            loss.backward()
        if not owned.device:  # a binary32 run's step moves its buffers; a reference leaves them
            _save(model, owned.buffers)
        return float(loss.detach()), [p.grad.detach().numpy().copy() for p in model.parameters()]

    def _own(self, params: list[np.ndarray], device: bool) -> _Owned:
        """The buffers of ``params`` (new ones, from the initial, for a list not seen before)."""
        owned = self._owned.get(id(params))
        if owned is None or owned.params is not params:
            owned = self._owned[id(params)] = _Owned(params, [b.clone() for b in self._buffers0])
            while len(self._owned) > 32:
                self._owned.popitem(last=False)
        owned.device = owned.device or device
        return owned

    def _seen(self, output: Any) -> Any:
        """What the loss and the accuracy take of the model's output."""
        return output if self.output_fn is None else self.output_fn(output)

    def evaluate(self, params: list[np.ndarray]) -> dict[str, float]:
        """Test loss and accuracy of binary32 weights, in torch float32 under :class:`Binary32Mode`."""
        model = self.model32
        with torch.no_grad(), Binary32Mode():
            for p, v in zip(model.parameters(), params, strict=True):
                p.copy_(torch.from_numpy(v))
            _load(model, self._buffers_of(params))
            x, y = self.test
            model.eval()
            out = self._seen(model(x.float() if x.is_floating_point() else x))
            model.train()
            loss = float(self.loss_fn(out, y))
        return {"loss": loss, "accuracy": self._accuracy(out, y)}

    def trained_model(self, params: list[np.ndarray]) -> torch.nn.Module:
        """A new float32 copy of the model holding ``params`` (a run's :attr:`Run.params`, the
        device-trained weights, or :attr:`Run.baseline_params`) and the buffers (BatchNorm running
        statistics) that trained with that list; the model given to the workload is never changed.
        ``simulate(workload=wl, ...).params`` then ``wl.trained_model(run.params)``."""
        shapes = [tuple(p.shape) for p in self.model32.parameters()]
        if not isinstance(params, list) or [tuple(np.shape(v)) for v in params] != shapes:
            raise ValueError(f"params must be this workload's parameter list (a run's .params: {len(shapes)} arrays "
                             f"of the model's shapes), got {type(params).__name__}")
        model = copy.deepcopy(self.model32)
        with torch.no_grad():
            for p, v in zip(model.parameters(), params, strict=True):
                p.copy_(torch.from_numpy(np.asarray(v, np.float32)))
        _load(model, self._buffers_of(params))
        return model

    def _buffers_of(self, params: list[np.ndarray]) -> list[torch.Tensor]:
        """The buffers that trained with ``params`` (the initial ones for a list not seen)."""
        owned = self._owned.get(id(params))
        return owned.buffers if owned is not None and owned.params is params else self._buffers0

    def _accuracy(self, out: Any, y: torch.Tensor) -> float:
        """``metric_fn``'s figure, else the argmax accuracy where the predictions have the targets'
        shape (NaN with a warning where they do not), else NaN."""
        if self.metric_fn is not None:
            return float(self.metric_fn(out, y))
        if not self.has_accuracy:
            return float("nan")
        logits = logits_of(out)
        pred = logits.argmax(dim=-1)
        if pred.shape != y.shape:
            warnings.warn(f"accuracy not available: the argmax of logits of shape {tuple(logits.shape)} has shape "
                          f"{tuple(pred.shape)}, the targets {tuple(y.shape)}; give TorchWorkload(metric_fn=...) "
                          f"or an output_fn= whose logits fit the targets", stacklevel=2)
            return float("nan")
        return float((pred == y).float().mean())


class _BuiltIn(TorchWorkload):
    """A built-in workload: a dataclass whose fields (seed, batch, learning_rate, momentum,
    dtype, log_perplexity) set up the TorchWorkload it is."""

    def _made(self, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        """``build()`` with the workload's seed, its draws host-independent (:class:`Binary32Mode`);
        the caller's random state is left as it was."""
        with torch.random.fork_rng(), Binary32Mode():
            torch.manual_seed(self.seed)
            return build()

    def _build(self, model, loss_fn, train, test, name: str, **kw) -> None:
        TorchWorkload.__init__(self, model, loss_fn, train, test=test, batch=self.batch,
                               learning_rate=self.learning_rate, momentum=self.momentum, dtype=self.dtype,
                               seed=self.seed, name=name, log_perplexity=self.log_perplexity, **kw)


def _cross_entropy(out, y):
    return torch.nn.functional.cross_entropy(out.float(), y)


def _digit_data(shape: tuple[int, ...]):
    x, y = digits()
    order = np.random.default_rng(1234).permutation(len(y))  # the hand-written mlp's fixed split
    x, y = x[order].reshape(-1, *shape), y[order]
    return (x[:1500], y[:1500]), (x[1500:], y[1500:])


@dataclass(kw_only=True)
class _OnDigits:
    """The training settings of the built-in workloads on the digits (keyword-only: after each
    workload's own fields)."""

    batch: int = argument(64, DIGITS_BATCH)
    learning_rate: float = argument(0.1, POSITIVE)
    momentum: float = argument(0.9, MOMENTUM)
    dtype: str = argument("float16", DTYPE)
    log_perplexity: bool = argument(False, FLAG)


@dataclass
class TorchMlp(_BuiltIn, _OnDigits):
    """The hand-written ``mlp``'s 64-``hidden``-10 perceptron, in torch."""

    seed: int = 0
    hidden: int = argument(32, COUNT)

    def __post_init__(self) -> None:
        check_fields(self, "torch-mlp")
        model = self._made(lambda: torch.nn.Sequential(torch.nn.Linear(64, self.hidden), torch.nn.ReLU(),
                                                       torch.nn.Linear(self.hidden, 10)))
        train, test = _digit_data((64,))
        self._build(model, _cross_entropy, train, test, "torch-mlp")


class _Cnn(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, channels, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)
        self.head = torch.nn.Linear(channels * 16, 10)

    def forward(self, x):
        return self.head(self.pool(torch.relu(self.conv(x))).flatten(1))


@dataclass
class TorchCnn(_BuiltIn, _OnDigits):
    """A small CNN on the digits as 1x8x8 images: conv 3x3 (``channels``), ReLU, max-pool 2, linear."""

    seed: int = 0
    channels: int = argument(8, COUNT)

    def __post_init__(self) -> None:
        check_fields(self, "torch-cnn")
        model = self._made(lambda: _Cnn(self.channels))
        train, test = _digit_data((1, 8, 8))
        self._build(model, _cross_entropy, train, test, "torch-cnn")


class _Block(torch.nn.Module):
    """Pre-norm transformer block: causal multi-head attention, then a GELU MLP."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) * (c // self.heads) ** -0.5
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        attn = self.drop(torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1))
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.drop(self.mlp(self.ln2(x)))


class _Transformer(torch.nn.Module):
    def __init__(self, vocab: int, context: int, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.embed, self.position = torch.nn.Embedding(vocab, width), torch.nn.Embedding(context, width)
        self.block = _Block(width, heads, dropout)
        self.ln, self.head = torch.nn.LayerNorm(width), torch.nn.Linear(width, vocab)

    def forward(self, idx):
        x = self.embed(idx) + self.position(torch.arange(idx.shape[1]))
        return self.head(self.ln(self.block(x)))


def _next_char_loss(out, y):
    return torch.nn.functional.cross_entropy(out.float().flatten(0, 1), y.flatten())


@dataclass
class TorchTransformer(_BuiltIn):
    """One transformer block predicting the next character of the Zen of Python
    (``lossscale/data/zen.txt``) from ``context`` before it."""

    seed: int = 0
    context: int = argument(16, COUNT)
    width: int = argument(32, COUNT)
    heads: int = argument(2, COUNT)
    dropout: float = argument(0.1, Argument("number", low=0, high=1, open_high=True))
    batch: int = argument(32, COUNT)
    learning_rate: float = argument(0.05, POSITIVE)
    momentum: float = argument(0.9, MOMENTUM)
    dtype: str = argument("float16", DTYPE)
    log_perplexity: bool = argument(False, FLAG)

    def __post_init__(self) -> None:
        from importlib import resources
        check_fields(self, "torch-transformer")
        if self.width % self.heads:
            raise ValueError(f"workload 'torch-transformer': heads must divide width (each head gets width / heads "
                             f"channels), got width={self.width} and heads={self.heads}")
        text = resources.files("lossscale").joinpath("data/zen.txt").read_text()
        if self.context >= len(text) - 1:
            raise ValueError(f"workload 'torch-transformer': context must be below {len(text) - 1} (the text has "
                             f"{len(text)} characters), got {self.context}")
        chars = sorted(set(text))
        codes = np.array([chars.index(ch) for ch in text], np.int64)
        starts = np.arange(len(codes) - self.context)
        windows = starts[:, None] + np.arange(self.context)
        x, y = codes[windows], codes[windows + 1]
        test = np.arange(len(starts)) % 10 == 0  # every tenth window held out
        model = self._made(lambda: _Transformer(len(chars), self.context, self.width, self.heads, self.dropout))
        self._build(model, _next_char_loss, (x[~test], y[~test]), (x[test], y[test]), "torch-transformer",
                    accuracy=True)
