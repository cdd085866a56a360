"""The workload protocol, and what the workloads on ``(inputs, targets)`` arrays share."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Protocol, runtime_checkable

import numpy as np

from sim import Device
from sim.checks import integer

from ..optimizers import Momentum

__all__ = ["PROTOCOL", "logits_in", "Argument", "argument", "declared_arguments", "check_workload_args", "POSITIVE",
           "MOMENTUM", "COUNT", "FLAG"]

F32 = np.float32


@runtime_checkable
class Workload(Protocol):
    """What :func:`lossscale.simulate` needs of a workload (the built-in ones follow it; so
    can any object of yours). Parameters are lists of binary32 arrays (the master
    weights, which the simulator owns and the optimizer updates in place).

    - ``name`` (str) and ``has_accuracy`` (bool: whether ``evaluate`` reports one).
    - ``init_params()``: fresh initial parameters; called once per rank and once for the
      binary32 baseline, so it must give the same values every time.
    - ``optimizer()``: a fresh plain optimizer (``lossscale.SGD``, ``Momentum``, ``Adam``).
    - ``batches(steps)``: a sequence of ``steps`` batches (anything ``shards`` accepts).
    - ``shards(batch, ranks)``: each rank's part of a batch and its share of the global
      batch, ``[(part, share), ...]``, one per rank.
    - ``forward_backward(dev, params, scale, part, share)``: on the simulated device
      ``dev``, the loss (a float) and the low-precision gradients of ``scale * loss``,
      one array per parameter: the arithmetic whose overflow the register sees.
    - ``grads32(params, part, share)``: the loss and the unscaled gradients in plain
      binary32 (the reference for underflow; with the whole batch, the baseline's step).
    - ``evaluate(params)``: ``{"loss": ..., "accuracy": ...}`` of binary32 parameters.
    - optionally ``marks_phases`` (bool, default False): whether ``forward_backward``
      marks the phases of the step with ``lossscale.training.phases.begin_phase(dev, "loss")``,
      ``"log"``, ``"scale"`` and ``"backward"`` (the simulator begins ``"forward"``). Unmarked, the whole call is
      one phase, ``forward_backward``, that every detector's window holds. Labels
      (``with dev.label("fc1"):``) name the operations in the event log.
    """

    name: str
    has_accuracy: bool

    def init_params(self) -> list[np.ndarray]: ...

    def optimizer(self) -> Any: ...

    def batches(self, steps: int) -> Sequence[Any]: ...

    def shards(self, batch: Any, ranks: int) -> list[tuple[Any, float]]: ...

    def forward_backward(self, dev: Device, params: list[np.ndarray], scale: float, part: Any,
                         share: float = 1.0) -> tuple[float, list[np.ndarray]]: ...

    def grads32(self, params: list[np.ndarray], part: Any, share: float = 1.0) -> tuple[float, list[np.ndarray]]: ...

    def evaluate(self, params: list[np.ndarray]) -> dict[str, float]: ...



PROTOCOL = ("name", "has_accuracy", "init_params", "optimizer", "batches", "shards", "forward_backward",
             "grads32", "evaluate")


class Draws(Sequence):
    """``steps`` batches of ``size`` indices into ``rows`` examples, each drawn without replacement
    from ``numpy.random.default_rng(seed)`` in order, when first asked for: the t-th is the t-th
    draw, the values drawing them all up front gives, but a long run holds only the batches it
    reached (a run of 10**7 steps would otherwise build 5 GB of them before its first step)."""

    def __init__(self, rows: int, size: int, steps: int, seed: int) -> None:
        self.rows, self.size, self.steps = rows, size, steps
        self._rng = np.random.default_rng(seed)
        self._drawn: list[np.ndarray] = []

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, t):
        if isinstance(t, slice):
            return [self[i] for i in range(*t.indices(self.steps))]
        t = range(self.steps)[t]  # IndexError beyond the steps, as a sequence's
        while len(self._drawn) <= t:
            self._drawn.append(self._rng.choice(self.rows, self.size, replace=False))
        return self._drawn[t]


class SampledWorkload:
    """What a workload on ``(inputs, targets)`` arrays shares: batches of indices sampled
    without replacement, split across ranks; momentum SGD; fixed initial binary32 parameters.
    The torch and JAX workloads build on it; they set it up with :meth:`_sample_from`."""

    def _sample_from(self, params, inputs: int, targets: int, *, batch: int, learning_rate: float,
                     momentum: float, seed: int) -> None:
        batch = integer("batch", batch, 1)
        if inputs != targets:
            raise ValueError(f"data needs as many targets as inputs, got {inputs} inputs and {targets} targets")
        if inputs < batch:
            raise ValueError(f"batch must be at most {inputs}, the number of training examples (a batch draws "
                             f"them without replacement), got {batch}")
        self._initial = [np.asarray(p, F32).copy() for p in params]
        self._rows, self.batch, self.learning_rate, self.momentum, self.seed = inputs, batch, learning_rate, \
            momentum, seed

    def init_params(self) -> list[np.ndarray]:
        return [p.copy() for p in self._initial]

    def optimizer(self):
        return Momentum(self.learning_rate, self.momentum)

    def batches(self, steps: int) -> Draws:
        return Draws(self._rows, self.batch, steps, self.seed + 1)

    def shards(self, batch: np.ndarray, ranks: int) -> list[tuple[np.ndarray, float]]:
        """Each rank's indices and its share of the global batch."""
        return [(part, len(part) / len(batch)) for part in np.array_split(batch, ranks)]


def digits() -> tuple[np.ndarray, np.ndarray]:
    with resources.files("lossscale").joinpath("data/digits.npz").open("rb") as f:
        data = np.load(f)
        return data["images"].astype(F32) / F32(16), data["labels"].astype(np.int64)


def logits_in(output: Any, is_array: Callable[[Any], bool], fix: str) -> Any:
    """The logits of a model's output: an array itself (``is_array``); else the ``logits`` key
    (a dict, a Hugging Face ``ModelOutput``) or attribute; else the first element of a tuple,
    list or dict. TypeError, saying to give ``fix``, where there are none."""
    if is_array(output):
        return output
    if isinstance(output, Mapping):
        if "logits" in output:
            return logits_in(output["logits"], is_array, fix)
        if output:
            return logits_in(next(iter(output.values())), is_array, fix)
    elif is_array(getattr(output, "logits", None)):
        return output.logits
    elif isinstance(output, (tuple, list)) and output:
        return logits_in(output[0], is_array, fix)
    raise TypeError(f"no logits in a model output of type {type(output).__name__} (an array, or a 'logits' key, "
                    f"attribute or first element); give {fix} the way to them")


# -- declared workload arguments ------------------------------------------------------
@dataclass(frozen=True)
class Argument:
    """What values a built-in workload's argument takes: ``kind`` is ``integer``, ``number``
    (an int or float), ``bool`` or ``text`` (one of ``choices``); numbers lie between ``low``
    and ``high`` (None: unbounded), each end excluded where ``open_low``/``open_high``."""

    kind: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    choices: tuple[str, ...] = ()

    def describe(self) -> str:
        """The valid values in words, such as "an integer from 1 to 1500"."""
        if self.kind == "bool":
            return "true or false"
        if self.kind == "text":
            return f"one of {', '.join(self.choices)}"
        noun = "an integer" if self.kind == "integer" else "a number"
        if self.low is not None and self.high is not None and not (self.open_low or self.open_high):
            return f"{noun} from {self.low:g} to {self.high:g}"
        low = None if self.low is None else "above" if self.open_low else "of at least" if self.high is None \
            else "at least"
        bounds = [f"{low} {self.low:g}"] if low else []
        if self.high is not None:
            bounds.append(f"{'below' if self.open_high else 'at most'} {self.high:g}")
        return " ".join([noun, " and ".join(bounds)]).strip()

    def problem(self, value: Any) -> bool:
        """Whether ``value`` is not one of the valid values."""
        if self.kind == "bool":
            return not isinstance(value, (bool, np.bool_))
        if self.kind == "text":
            return value not in self.choices
        kinds = numbers.Integral if self.kind == "integer" else numbers.Real
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, kinds) or not math.isfinite(value):
            return True
        return ((self.low is not None and (value <= self.low if self.open_low else value < self.low))
                or (self.high is not None and (value >= self.high if self.open_high else value > self.high)))


#: The arguments several built-in workloads share.
POSITIVE = Argument("number", low=0, open_low=True)
MOMENTUM = Argument("number", low=0, high=1, open_low=True, open_high=True)  # as Momentum requires
COUNT = Argument("integer", low=1)
FLAG = Argument("bool")


def argument(default: Any, declared: Argument) -> Any:
    """A built-in workload's dataclass field whose values ``declared`` describes."""
    return field(default=default, metadata={"argument": declared})


def declared_arguments(cls: type) -> dict[str, Argument]:
    """The declared arguments of a workload class (its dataclass fields made by :func:`argument`)."""
    if not dataclasses.is_dataclass(cls):
        return {}
    return {f.name: f.metadata["argument"] for f in dataclasses.fields(cls) if "argument" in f.metadata}


def check_workload_args(cls: type, values: Mapping[str, Any], label: str) -> None:
    """ValueError, in one line, naming the first of ``values`` that its declaration in ``cls``
    refuses, and what is valid (``label``: the workload's name)."""
    declared = declared_arguments(cls)
    for key, value in values.items():
        if key in declared and declared[key].problem(value):
            raise ValueError(f"workload {label!r}: {key} must be {declared[key].describe()}, got {value!r}")
