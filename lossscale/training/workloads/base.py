"""The workload protocol, and what the workloads on ``(inputs, targets)`` arrays share."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any, Protocol, runtime_checkable

import numpy as np

from sim import Device

from ..optimizers import Momentum

__all__ = ["Workload", "PROTOCOL", "SampledWorkload", "digits", "logits_in"]

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


class SampledWorkload:
    """What a workload on ``(inputs, targets)`` arrays shares: batches of indices sampled
    without replacement, split across ranks; momentum SGD; fixed initial binary32 parameters.
    The torch and JAX workloads build on it; they set it up with :meth:`_sample_from`."""

    def _sample_from(self, params, inputs: int, targets: int, *, batch: int, learning_rate: float,
                     momentum: float, seed: int) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        if inputs != targets or inputs < batch:
            raise ValueError(f"data needs as many targets as inputs and at least batch={batch} of them, "
                             f"got {inputs} inputs and {targets} targets")
        self._initial = [np.asarray(p, F32).copy() for p in params]
        self._rows, self.batch, self.learning_rate, self.momentum, self.seed = inputs, batch, learning_rate, \
            momentum, seed

    def init_params(self) -> list[np.ndarray]:
        return [p.copy() for p in self._initial]

    def optimizer(self):
        return Momentum(self.learning_rate, self.momentum)

    def batches(self, steps: int) -> np.ndarray:
        rng = np.random.default_rng(self.seed + 1)
        return np.stack([rng.choice(self._rows, self.batch, replace=False) for _ in range(steps)])

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
