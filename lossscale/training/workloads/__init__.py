"""Workloads for the training simulator: a model plus data.

A workload computes, on a simulated device in binary16, the loss and the
gradients of the loss scaled by S; and, in plain numpy binary32, the same
gradients unscaled (the reference for underflow) and a binary32 training step
(the baseline). Master weights are binary32 and live outside the workload.

- ``mlp``: a 64-32-10 perceptron with ReLU and softmax cross-entropy on the
  8x8 handwritten digits (package data, see ``lossscale/data/README.md``).
  Matmuls take binary16 operands and accumulate as the profile says; the
  softmax and loss are computed in binary32 on the device; the loss gradient
  is scaled by S in binary32 and cast to binary16, which is where a too-high
  scale overflows. Its operations are labelled ``fc1``, ``relu``, ``fc2``,
  ``softmax``, ``loss``, ``perplexity`` (the phase tells forward from backward).

The built-in workloads mark the phases of the step on the device (``forward``, ``loss``,
``log``, ``scale``, ``backward``). ``mlp`` and the torch ones take
``log_perplexity=True``: every step they also compute, for logging, exp of the sum of the
batch's losses in binary16 on the device (in the ``log`` phase, after the loss). With a
summed loss above about 11 it overflows, harmlessly: nothing of it feeds a gradient. A
framework whose register window holds the forward pass skips such steps (false positives).
- ``trace``: a synthetic quadratic model whose gradient magnitudes drift and
  spike (log-normal walk plus rare jumps of 2**6..2**12) with a wide spread of
  exponents across elements, trained with Adam; cheap enough for sweeps.
"""

from __future__ import annotations

import importlib.util
import inspect
from typing import Any

from .base import PROTOCOL, SampledWorkload, Workload, digits
from .builtin import Mlp, Trace

__all__ = ["WORKLOADS", "Workload", "Mlp", "Trace", "make_workload", "check_workload", "SampledWorkload", "digits"]

WORKLOADS: dict[str, Any] = {"mlp": Mlp, "trace": Trace}
if importlib.util.find_spec("torch") is not None:  # the optional extra: named here, imported when made
    WORKLOADS.update({"torch-mlp": "TorchMlp", "torch-cnn": "TorchCnn", "torch-transformer": "TorchTransformer"})


_TORCH_NAMES = ("TorchWorkload", "TorchMlp", "TorchCnn", "TorchTransformer")


def __getattr__(name: str) -> Any:
    """``lossscale.workloads.TorchWorkload`` (and the built-in torch workloads) and
    ``JaxWorkload``, imported with their optional extra on first use."""
    if name in _TORCH_NAMES:
        from . import torch_workloads
        return getattr(torch_workloads, name)
    if name == "JaxWorkload":
        from .jax_workloads import JaxWorkload
        return JaxWorkload
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_workload(name: str, seed: int = 0, **kwargs: Any):
    """A workload by name, made as ``WORKLOADS[name](seed=seed, **kwargs)`` (any class whose
    constructor takes ``seed``); ValueError listing the valid names and arguments."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; valid: {', '.join(WORKLOADS)}")
    cls = WORKLOADS[name]
    if isinstance(cls, str):
        from . import torch_workloads
        cls = getattr(torch_workloads, cls)
    valid = [p.name for p in inspect.signature(cls).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD
             and not p.name.startswith("_") and p.name not in ("name", "has_accuracy", "seed", "marks_phases")]
    for key in kwargs:
        if key not in valid:
            raise ValueError(f"workload {name!r} takes no argument {key!r}; valid: {', '.join(valid)}")
    return cls(seed=seed, **kwargs)


def check_workload(workload: Any) -> None:
    """TypeError naming what ``workload`` lacks of the :class:`Workload` protocol."""
    missing = [a for a in PROTOCOL if not hasattr(workload, a)]
    missing += [a for a in PROTOCOL[2:] if a not in missing and not callable(getattr(workload, a))]
    if missing:
        raise TypeError(f"workload {type(workload).__name__} lacks {', '.join(missing)} of the Workload protocol "
                        f"(see lossscale.workloads.Workload); or give a name: {', '.join(WORKLOADS)}")

