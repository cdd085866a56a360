"""JAX functions as simulator workloads (optional extra ``jax``): the twin of
:class:`lossscale.training.workloads.TorchWorkload`.

:class:`JaxWorkload` takes ``loss(params, x, y)`` (a JAX function of a list of
parameter arrays and a batch, giving the mean loss), the initial binary32
parameters and data. Each step the binary32 master weights are cast on the
device to binary16 (or bfloat16), and ``jax.value_and_grad`` of ``scale *
share * loss`` is evaluated with :func:`sim.jax.on_device`, forward and
backward on the device; the binary32 reference is the same function in plain
JAX float32. ``predict(params, x)``, if given, adds accuracy: the argmax of its logits (an
array, or of a dict, tuple or flax output its ``logits`` key or attribute, else its first
element).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import ml_dtypes
import numpy as np

from sim import Device
from sim.jax import on_device

from .base import SampledWorkload, logits_in

__all__: list[str] = []  # JaxWorkload is public as lossscale.training.workloads.JaxWorkload (imported on first use)

_DTYPES = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


class JaxWorkload(SampledWorkload):
    """A JAX loss, its initial parameters and data as a workload (see the module's docstring)."""

    def __init__(self, loss: Callable, params: Sequence, data: Sequence, *, test: Sequence | None = None,
                 predict: Callable | None = None, batch: int = 64, learning_rate: float = 0.1,
                 momentum: float = 0.9, dtype: str = "float16", seed: int = 0, name: str = "jax") -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
        x, y = (np.asarray(v) for v in data)
        self._sample_from(params, len(x), len(y), batch=batch, learning_rate=learning_rate, momentum=momentum,
                          seed=seed)
        self.loss, self.predict, self.dtype = loss, predict, _DTYPES[dtype]
        self.x, self.y = x, y
        self.test = tuple(np.asarray(v) for v in test) if test is not None else (x, y)
        self.name = name
        self.has_accuracy = predict is not None
        self._step = jax.value_and_grad(lambda p, x, y, s: loss(p, x, y) * s)
        self.routes: dict = {}

    def forward_backward(self, dev: Device, params: list[np.ndarray], scale: float, idx: np.ndarray,
                         share: float = 1.0) -> tuple[float, list[np.ndarray]]:
        low = [dev.cast(p, self.dtype) for p in params]
        x = self.x[idx]
        x = dev.cast(x.astype(np.float32), self.dtype) if x.dtype.kind == "f" else x
        run = on_device(self._step, dev)
        value, grads = run(low, x, self.y[idx], np.float32(scale * share))
        self.routes = dict(run.routes)
        return float(value) / scale, [np.asarray(g) for g in grads]

    def grads32(self, params: list[np.ndarray], idx: np.ndarray, share: float = 1.0):
        value, grads = self._step(params, self.x[idx].astype(np.float32) if self.x.dtype.kind == "f" else self.x[idx],
                                  self.y[idx], np.float32(share))
        return float(value), [np.asarray(g, np.float32) for g in grads]

    def evaluate(self, params: list[np.ndarray]) -> dict[str, float]:
        x, y = self.test
        x = x.astype(np.float32) if x.dtype.kind == "f" else x
        loss = float(self.loss(params, x, y))
        if self.predict is None:
            return {"loss": loss, "accuracy": float("nan")}
        logits = logits_in(self.predict(params, x), lambda a: isinstance(a, (jax.Array, np.ndarray)),
                           "JaxWorkload(..., predict=...) a function returning")
        return {"loss": loss, "accuracy": float(np.mean(np.argmax(np.asarray(logits), -1) == y))}
