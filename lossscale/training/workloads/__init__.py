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

A workload of your own is named by its import path, ``package.module:factory``: the module
is imported (from the current folder too), and ``factory(seed=seed, **workload_args)``
must return an object with the :class:`Workload` protocol.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from .base import PROTOCOL, SampledWorkload, Workload, digits
from .builtin import Mlp, Trace

__all__ = ["WORKLOADS", "Workload", "Mlp", "Trace", "make_workload", "check_workload", "SampledWorkload", "digits",
           "is_import_path", "import_factory", "arguments", "check_shards", "check_split"]

#: The built-in torch workloads by name: classes of the optional extra, imported when made.
_TORCH_BUILT_IN = {"torch-mlp": "TorchMlp", "torch-cnn": "TorchCnn", "torch-transformer": "TorchTransformer"}
WORKLOADS: dict[str, Any] = {"mlp": Mlp, "trace": Trace}
if importlib.util.find_spec("torch") is not None:
    WORKLOADS.update(_TORCH_BUILT_IN)

_TORCH_NAMES = ("TorchWorkload", *_TORCH_BUILT_IN.values())


def __getattr__(name: str) -> Any:
    """``lossscale.training.workloads.TorchWorkload`` (and the built-in torch workloads) and
    ``JaxWorkload``, imported with their optional extra on first use."""
    if name in _TORCH_NAMES:
        from . import torch_workloads
        return getattr(torch_workloads, name)
    if name == "JaxWorkload":
        from .jax_workloads import JaxWorkload
        return JaxWorkload
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_import_path(name: Any) -> bool:
    """Whether ``name`` names a workload factory by import path (``package.module:factory``)."""
    return isinstance(name, str) and ":" in name


def _import(module: str) -> Any:
    """``module`` imported; a top-level module not on the path is looked for in the current folder."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        here = os.getcwd()
        if err.name != module.partition(".")[0] or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(module)


def import_factory(path: str) -> Callable[..., Any]:
    """The callable that ``package.module:factory`` names (a dotted attribute is followed);
    ValueError or TypeError, in one line, naming what was wrong."""
    module, _, attribute = path.partition(":")
    if not module or not attribute or ":" in attribute:
        raise ValueError(f"workload {path!r}: an import path is package.module:factory")
    try:
        obj = _import(module)
    except ModuleNotFoundError as err:
        if err.name is not None and (module == err.name or module.startswith(err.name + ".")):
            raise ValueError(f"workload {path!r}: no module named {err.name!r} (on the Python path or in the "
                             f"current folder)") from None
        raise ValueError(f"workload {path!r}: importing {module!r} failed: {err}") from None
    except Exception as err:
        text = " ".join(str(err).split())
        raise ValueError(f"workload {path!r}: importing {module!r} raised {type(err).__name__}: {text}") from None
    for i, part in enumerate(attribute.split(".")):
        if not hasattr(obj, part):
            where = module if i == 0 else f"{module}:{'.'.join(attribute.split('.')[:i])}"
            raise ValueError(f"workload {path!r}: {where!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"workload {path!r}: {attribute!r} is a {type(obj).__name__}, not callable (a class or "
                        f"function taking seed and the workload arguments)")
    return obj


def _from_path(path: str, seed: int, kwargs: dict[str, Any]) -> Any:
    factory = import_factory(path)
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without one: call and see
        signature = None
    if signature is not None:
        params = signature.parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            valid = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            for key in ["seed", *kwargs]:
                if key not in valid:
                    raise ValueError(f"workload {path!r} takes no argument {key!r}; valid: {', '.join(valid)}"
                                     + (" (a factory takes seed)" if key == "seed" else ""))
        try:
            signature.bind(seed=seed, **kwargs)
        except TypeError as err:
            raise ValueError(f"workload {path!r}: {err} (give it with --workload-arg KEY=VALUE)") from None
    workload = factory(seed=seed, **kwargs)
    check_workload(workload, made_by=path)
    return workload


def make_workload(name: str, seed: int = 0, **kwargs: Any):
    """A workload by name, made as ``WORKLOADS[name](seed=seed, **kwargs)`` (any class whose
    constructor takes ``seed``), or by import path, ``package.module:factory``, made as
    ``factory(seed=seed, **kwargs)``; ValueError or TypeError naming what was wrong."""
    if is_import_path(name):
        return _from_path(name, seed, kwargs)
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; valid: {', '.join(WORKLOADS)} or package.module:factory")
    cls = _built_in(name)
    valid = list(arguments(name))
    for key in kwargs:
        if key not in valid:
            raise ValueError(f"workload {name!r} takes no argument {key!r}; valid: {', '.join(valid)}")
    return cls(seed=seed, **kwargs)


def _built_in(name: str) -> Any:
    cls = WORKLOADS[name]
    if isinstance(cls, str):
        from . import torch_workloads
        cls = getattr(torch_workloads, cls)
    return cls


def arguments(name: str) -> dict[str, Any]:
    """The built-in workload ``name``'s arguments (``workload_args``) and their defaults, read
    from its constructor (``seed`` and the internal ones left out)."""
    return {p.name: p.default for p in inspect.signature(_built_in(name)).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and not p.name.startswith("_")
            and p.name not in ("name", "has_accuracy", "seed", "marks_phases")}


def check_workload(workload: Any, made_by: str | None = None) -> None:
    """TypeError naming what ``workload`` lacks of the :class:`Workload` protocol (``made_by``:
    the import path of the factory that returned it)."""
    missing = [a for a in PROTOCOL if not hasattr(workload, a)]
    missing += [a for a in PROTOCOL[2:] if a not in missing and not callable(getattr(workload, a))]
    if missing and made_by is not None:
        raise TypeError(f"workload {made_by!r} returned a {type(workload).__name__}, not a workload: it lacks "
                        f"{', '.join(missing)} of the Workload protocol (see lossscale.training.workloads.Workload)")
    if missing:
        raise TypeError(f"workload {type(workload).__name__} lacks {', '.join(missing)} of the Workload protocol "
                        f"(see lossscale.training.workloads.Workload); or give a name: {', '.join(WORKLOADS)}")



def check_shards(shards: list[tuple[Any, float]], ranks: int, what: str = "ranks") -> None:
    """Every rank needs a share of the batch (``shards``: a workload's ``shards(batch, ranks)``):
    ValueError before any step otherwise. ``what``: the setting that asked for the split
    (``micro_batches``: a rank's part split into micro-batches)."""
    sized = all(hasattr(part, "__len__") for part, _ in shards)
    empty = sum(1 for part, share in shards if not share > 0 or (sized and not len(part)))
    if len(shards) != ranks or empty:
        batch = f"{sum(len(p) for p, _ in shards)} examples" if sized else "too few examples"
        whose = "the batch" if what == "ranks" else "a rank's part of the batch"
        unit = "rank(s)" if what == "ranks" else "micro-batch(es)"
        raise ValueError(f"{what}={ranks} leaves {empty} {unit} without data: {whose} has {batch}; use fewer "
                         f"{what} or a larger batch")


def check_split(workload: Any, batch: Any, ranks: int, micro_batches: int = 1) -> None:
    """``batch`` split across ``ranks`` and each rank's part into ``micro_batches`` by the
    workload's ``shards``: ValueError (:func:`check_shards`) where a rank or micro-batch gets no data."""
    parts = workload.shards(batch, ranks)
    check_shards(parts, ranks)
    if micro_batches > 1:
        for part, _ in parts:
            check_shards(workload.shards(part, micro_batches), micro_batches, "micro_batches")
