"""FP8 scaling recipes, the FP8 counterpart of loss scaling: a per-tensor scale chosen from the
tensor's amax so that scale * x fits the 8-bit format, as frozen policy values with a pure
transition and a small stateful face, and the matmul hook that runs a model's matmuls in FP8.

The recipes follow NVIDIA Transformer Engine (``transformer_engine/common/recipe/__init__.py``;
the update in ``common/recipe/delayed_scaling.cu`` and ``recipe_common.cuh``):

- :class:`DelayedScaling` (``margin=0``, ``fp8_format="HYBRID"``, ``amax_history_len=1024``,
  ``amax_compute_algo="max"`` or ``"most_recent"``): each step the tensor's amax is written
  to the history's slot 0; the next scale is ``(fp8_max * 2**-margin) / amax``, amax the
  history's max (fmaxf: NaN passes) or its latest, if amax is finite and positive, else the
  scale is kept (so one Inf amax holds the scale for the history's length); a
  scale that is Inf becomes FLT_MAX; then the history rolls: ``new[i] = old[i+1]``,
  ``new[L-1] = old[0]``, ``new[0] = 0``. The scale a step quantises with comes from the
  steps before it. Arithmetic in binary32, as TE's kernels.
- :class:`CurrentScaling` (TE ``Float8CurrentScaling``, ``amax_epsilon=0``): this step's scale
  from this step's amax, ``fp8_max / max(amax, amax_epsilon)``; an amax that is Inf, NaN or
  0 gives scale 1.
- :class:`MXScaling`: OCP MX blocks of 32 with E8M0 scales (``rule="floor"``, OCP's, or
  ``"rceil"``, TE's and cuBLAS's round-up, or torchao's ``"ceil"`` and ``"even"``: ``sim.mx.RULES``), no
  per-tensor state.

Across data-parallel ranks (``AmaxGroup``), delayed scaling reduces each tensor's amax with MAX
over the group before the scale update, as TE's ``FP8GlobalStateManager.reduce_and_update_fp8_tensors``
(``transformer_engine/pytorch/quantization.py``) does when the recipe's ``reduce_amax`` is true
(its default; ``common/recipe/__init__.py``: "the amax value for FP8 tensors is reduced across
the amax_reduction_group ... If set to False ... every GPU maintains local amaxes and scaling
factors"). Without the reduction the ranks' scales may part; the first step they do so warns.

``fp8_format``: ``"HYBRID"`` (TE's default: E4M3 in the forward pass, max 448, E5M2 in the
backward pass, max 57344), ``"E4M3"``, or ``"HIF8"`` (HiFloat8 both ways, max 32768: the
Atlas 350's own format, rounded ties-away as its cube unit's ``CAST_ROUND``).
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, NamedTuple

import numpy as np

from sim import Device, Flag, mx
from sim.checks import integer
from sim.device.cube import matrix_stacks
from sim.formats import FLOAT8_E4M3FN, FLOAT8_E5M2, HIFLOAT8, Format, decode

from ..policy.core import F32_MAX
from . import records
from .phases import current_phase, current_step

__all__ = ["Recipe", "DelayedScaling", "CurrentScaling", "MXScaling", "TensorScaler", "Fp8Matmuls", "RECIPES",
           "FP8_FORMATS", "make_recipe", "amax_of", "AmaxGroup"]

#: Formats by recipe format and pass: (forward, backward).
FP8_FORMATS: dict[str, tuple[Format, Format]] = {
    "HYBRID": (FLOAT8_E4M3FN, FLOAT8_E5M2), "E4M3": (FLOAT8_E4M3FN, FLOAT8_E4M3FN), "HIF8": (HIFLOAT8, HIFLOAT8),
}
F32 = np.float32


def _format_name(value: str) -> str:
    key = str(value).upper()
    if key not in FP8_FORMATS:
        raise ValueError(f"unknown fp8_format {value!r}; valid: {', '.join(FP8_FORMATS)}")
    return key


@dataclass(frozen=True)
class Recipe:
    """Base of the FP8 recipes: ``initial()``, ``scale(state, amax, fp8_max)`` (the scale this
    step quantises with), ``next(state, amax, fp8_max)`` (the state after the step)."""

    #: Whether the recipe scales whole tensors (MX scales blocks).
    per_tensor: ClassVar[bool] = True
    fp8_format: str = "HYBRID"

    def __post_init__(self) -> None:
        object.__setattr__(self, "fp8_format", _format_name(self.fp8_format))

    def formats(self) -> tuple[Format, Format]:
        """The (forward, backward) element formats."""
        return FP8_FORMATS[self.fp8_format]

    def initial(self) -> Any:
        raise NotImplementedError

    def scale(self, state: Any, amax: float, fp8_max: float) -> np.float32:
        raise NotImplementedError

    def next(self, state: Any, amax: float, fp8_max: float) -> Any:
        raise NotImplementedError


def _check_reduce(value: Any) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"reduce_amax must be true or false, got {value!r}")


class DelayedState(NamedTuple):
    scale: np.float32
    history: tuple[np.float32, ...]


def _scale_from(amax: np.float32, fp8_max: float, margin: int, previous: np.float32) -> np.float32:
    """TE's compute_scale_from_amax: (fp8_max * 2**-margin) / amax in binary32; kept where amax
    is not finite and positive; FLT_MAX where the quotient is Inf."""
    if not (math.isfinite(amax) and amax > 0):
        return previous
    with np.errstate(over="ignore"):
        s = F32(F32(fp8_max) * F32(2.0**-margin)) / F32(amax)
    return F32(F32_MAX) if math.isinf(s) else s


@dataclass(frozen=True)
class DelayedScaling(Recipe):
    """Transformer Engine's delayed scaling (the module says how)."""

    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    reduce_amax: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_reduce(self.reduce_amax)
        integer("margin", self.margin)
        integer("amax_history_len", self.amax_history_len, 1)
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got {self.amax_compute_algo!r}")

    def initial(self) -> DelayedState:
        return DelayedState(F32(1.0), (F32(0.0),) * self.amax_history_len)

    def scale(self, state: DelayedState, amax: float, fp8_max: float) -> np.float32:
        return state.scale

    def next(self, state: DelayedState, amax: float, fp8_max: float) -> DelayedState:
        history = (F32(amax), *state.history[1:])
        latest = history[0] if self.amax_compute_algo == "most_recent" else F32(np.fmax.reduce(history))
        scale = _scale_from(latest, fp8_max, self.margin, state.scale)
        rolled = (F32(0.0), *history[2:], history[0]) if len(history) > 1 else (F32(0.0),)
        return DelayedState(scale, rolled)


def amax_of(x: np.ndarray) -> float:
    """A tensor's amax as Transformer Engine's kernels reduce it: fmaxf over |x| from 0, which
    passes over NaN (an all-NaN tensor has amax 0) and keeps Inf."""
    return float(np.fmax.reduce(np.abs(np.asarray(x, np.float32)).reshape(-1), initial=0.0))


class CurrentState(NamedTuple):
    scale: np.float32


@dataclass(frozen=True)
class CurrentScaling(Recipe):
    """Transformer Engine's current (per-tensor, just-in-time) scaling. ``reduce_amax``: each
    tensor's amax is reduced (MAX) over the data-parallel ranks before its scale is taken, as TE's
    ``Float8CurrentScalingQuantizer`` does with ``with_amax_reduction`` and an
    ``amax_reduction_group`` (``transformer_engine/pytorch/tensor/float8_tensor.py``; the C++
    ``quantize`` all-reduces the amax before computing the scale). The ``Float8CurrentScaling``
    recipe itself has no such field, and the quantizers it makes do not reduce (TE's modules turn
    it on for sequence-parallel inputs, over the tensor-parallel group), hence the default False."""

    amax_epsilon: float = 0.0
    reduce_amax: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_reduce(self.reduce_amax)
        if not (isinstance(self.amax_epsilon, (int, float)) and math.isfinite(self.amax_epsilon)
                and self.amax_epsilon >= 0):
            raise ValueError(f"amax_epsilon must be a finite number >= 0, got {self.amax_epsilon!r}")

    def initial(self) -> CurrentState:
        return CurrentState(F32(1.0))

    def scale(self, state: CurrentState, amax: float, fp8_max: float) -> np.float32:
        a = max(F32(amax), F32(self.amax_epsilon)) if math.isfinite(amax) else F32(amax)
        if not (math.isfinite(a) and a > 0):
            return F32(1.0)
        with np.errstate(over="ignore"):
            s = F32(fp8_max) / a
        return F32(F32_MAX) if math.isinf(s) else s

    def next(self, state: CurrentState, amax: float, fp8_max: float) -> CurrentState:
        return CurrentState(self.scale(state, amax, fp8_max))


@dataclass(frozen=True)
class MXScaling(Recipe):
    """OCP MX block scaling: E8M0 scales per block of ``block`` values along the contraction
    axis (``rule``: one of ``sim.mx.RULES``: "floor", OCP's, "rceil", the round-up rule); ``scale`` reports the
    tensor's largest block scale's reciprocal, for the trajectories."""

    per_tensor: ClassVar[bool] = False
    fp8_format: str = "E4M3"
    rule: str = "floor"
    block: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fp8_format == "HIF8":
            raise ValueError("MX blocks hold E4M3 or E5M2 elements (fp8_format E4M3 or HYBRID), not HiFloat8")
        if self.rule not in mx.RULES:
            raise ValueError(f"unknown MX rule {self.rule!r}; valid: {', '.join(mx.RULES)}")
        integer("block", self.block, 1)

    def initial(self) -> tuple:
        return ()

    def scale(self, state: tuple, amax: float, fp8_max: float) -> np.float32:
        return F32(1.0)

    def next(self, state: tuple, amax: float, fp8_max: float) -> tuple:
        return ()


class TensorScaler:
    """The stateful face of a recipe for one tensor: ``get_scale()``, ``scale_for(amax)`` (the
    scale this step uses) and ``update(amax)`` (after the step)."""

    def __init__(self, recipe: Recipe, fp8_max: float) -> None:
        self.recipe, self.fp8_max = recipe, float(fp8_max)
        self.state = recipe.initial()

    def get_scale(self) -> float:
        return float(getattr(self.state, "scale", 1.0))

    def scale_for(self, amax: float) -> float:
        return float(self.recipe.scale(self.state, float(amax), self.fp8_max))

    def update(self, amax: float) -> None:
        if not isinstance(amax, (int, float, np.floating)) or isinstance(amax, bool):
            raise ValueError(f"amax must be a number, got {amax!r}")
        self.state = self.recipe.next(self.state, float(amax), self.fp8_max)

    def reset(self) -> None:
        self.state = self.recipe.initial()


RECIPES: dict[str, type[Recipe]] = {"delayed": DelayedScaling, "current": CurrentScaling, "mx": MXScaling}


def make_recipe(name: str | Recipe, **kwargs: Any) -> Recipe:
    """A recipe by name ("delayed", "current", "mx") and its arguments, or a Recipe as it is."""
    if isinstance(name, Recipe):
        if kwargs:
            raise ValueError("recipe arguments go with a recipe name")
        return name
    if not isinstance(name, str) or name not in RECIPES:
        raise ValueError(f"unknown FP8 recipe {name!r}; valid: {', '.join(RECIPES)}")
    valid = [f.name for f in fields(RECIPES[name])]
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ValueError(f"recipe {name} takes no argument {', '.join(map(repr, unknown))}; valid: {', '.join(valid)}")
    return RECIPES[name](**kwargs)


#: The per-tensor log's columns (``fp8.csv``), the fields of :class:`lossscale.training.records.Fp8Row`.
FP8_COLUMNS = records.FP8_COLUMNS


class AmaxGroup:
    """The data-parallel group of :class:`Fp8Matmuls` (one per rank): each step's amax and scale
    of every tensor on every rank. With the recipe's ``reduce_amax`` a delayed-scaling update
    takes the MAX over the ranks' amaxes (fmax, as TE's amax kernels), and current scaling takes
    its scale from that MAX (:meth:`exchange`: the ranks must then run side by side, one thread
    each, since each waits for the others' amax); without it each rank keeps its own, and the
    first tensor whose ranks quantised with different scales warns."""

    #: How long a rank waits for the others' amax (seconds) before the step fails.
    TIMEOUT = 300.0

    def __init__(self, ranks: int = 1) -> None:
        self.amaxes: dict[tuple[int | None, str], dict[int, float]] = {}
        self.scales: dict[tuple[int | None, str], dict[int, float]] = {}
        self.warned = False
        self._lock = threading.Lock()
        self.barrier = threading.Barrier(ranks, timeout=self.TIMEOUT) if ranks > 1 else None

    def exchange(self, step: int | None, rank: int, tensor: str, amax: float) -> float:
        """Current scaling's all-reduce: post this rank's amax of ``tensor``, wait until every rank
        has posted its own, and return the MAX (the ranks run in threads; see the class)."""
        with self._lock:
            self.amaxes.setdefault((step, tensor), {})[rank] = amax
        if self.barrier is not None:
            self.barrier.wait()
        return self.reduced(step, tensor)

    def record(self, step: int | None, rank: int, tensor: str, amax: float, scale: float, recipe: Recipe) -> None:
        with self._lock:
            self.amaxes.setdefault((step, tensor), {}).setdefault(rank, amax)
            seen = self.scales.setdefault((step, tensor), {})
            seen[rank] = scale
            if self.warned or len(set(seen.values())) < 2:
                return
            self.warned = True
        hint = {DelayedScaling: "; set reduce_amax=true to keep them in step, as Transformer Engine does by default",
                CurrentScaling: "; set reduce_amax=true to reduce each tensor's amax over the ranks before its scale "
                                "(Transformer Engine's quantizer with_amax_reduction; off by default)"}
        warnings.warn(f"FP8 scales differ across ranks without amax reduction (step {step}, tensor {tensor}: "
                      f"{', '.join(f'rank {r} {v:g}' for r, v in sorted(seen.items()))}){hint.get(type(recipe), '')}",
                      UserWarning, stacklevel=2)

    def reduced(self, step: int | None, tensor: str) -> float:
        """The MAX over the ranks' amaxes of ``tensor`` in ``step``."""
        return float(np.fmax.reduce(np.array(list(self.amaxes[(step, tensor)].values()), np.float32)))


class Fp8Matmuls:
    """A device's substitute for ``matmul`` (``dev.substitute("matmul", Fp8Matmuls(recipe))``):
    every matmul's two binary16 operands are scaled per tensor by the recipe, cast into the
    pass's 8-bit format on the device (the register sees the casts' overflows; the device's
    overflow mode saturates them or not), multiplied by :meth:`sim.Device.matmul_fp8` (or
    ``matmul_mx``), and the result cast to the requested dtype. A tensor is named by the
    device's label, the phase, the matmul's ordinal among those of that label and phase in the
    step, and the operand (a or b)."""

    def __init__(self, recipe: Recipe, rank: int = 0,
                 record: Callable[[dict[str, Any]], None] | None = None, group: AmaxGroup | None = None) -> None:
        self.recipe, self.rank, self.group = recipe, rank, group
        reduces = group is not None and getattr(recipe, "reduce_amax", False)
        #: Delayed scaling with a group that reduces: updates wait for every rank's amax.
        self._deferred = reduces and isinstance(recipe, DelayedScaling)
        #: Current scaling with a group that reduces: each quantisation waits for every rank's amax.
        self._exchange = reduces and isinstance(recipe, CurrentScaling)
        self._pending: list[str] = []
        self.scalers: dict[str, TensorScaler] = {}
        self.rows: list[dict[str, Any]] = []
        self._record = record or self.rows.append
        self._seen: dict[tuple, int] = {}
        self._step: int | None = None

    def __call__(self, dev: Device, a, b, accumulate, out_dtype) -> np.ndarray:
        step = current_step(dev)
        if step != self._step:
            for tensor in self._pending:  # every rank has finished the step before: reduce, then update
                self.scalers[tensor].update(self.group.reduced(self._step, tensor))
            self._step, self._seen, self._pending = step, {}, []
        label, phase = dev.current_label or "matmul", current_phase(dev) or "forward"
        n = self._seen.get((label, phase), 0)
        self._seen[(label, phase)] = n + 1
        fwd, bwd = self.recipe.formats()
        fmt = bwd if phase == "backward" else fwd
        name = f"{label}.{phase}.{n}"
        if isinstance(self.recipe, MXScaling):
            return self._mx(dev, name, fmt, np.asarray(a), np.asarray(b), out_dtype)
        (a8, sa), (b8, sb) = (self._quantise(dev, f"{name}.{o}", fmt, np.asarray(x)) for o, x in (("a", a), ("b", b)))
        # TE keeps each tensor's scale_inv = 1/scale in binary32; the GEMM scales by their product.
        out = dev.matmul_fp8(a8, b8, fmt, fmt, scale_inv=float(F32(F32(1.0) / F32(sa)) * F32(F32(1.0) / F32(sb))))
        return dev.cast(out, out_dtype)

    def _quantise(self, dev: Device, tensor: str, fmt: Format, x: np.ndarray) -> tuple[np.ndarray, float]:
        scaler = self.scalers.get(tensor)
        if scaler is None:
            scaler = self.scalers[tensor] = TensorScaler(self.recipe, fmt.max)
        amax = amax_of(x)
        scale = scaler.scale_for(self.group.exchange(self._step, self.rank, tensor, amax) if self._exchange else amax)
        scaled = dev.mul(dev.cast(x, np.float32), F32(scale))
        rounding = "rna" if fmt is HIFLOAT8 else None
        x8, flags = dev.cast(scaled, fmt, rounding=rounding, return_flags=True)
        values = decode(x8, fmt)
        self._record({"step": self._step, "rank": self.rank, "tensor": tensor, "format": fmt.name, "scale": scale,
                      "amax": amax, "saturated": int(np.count_nonzero(flags & Flag.OVERFLOW)),
                      "nonfinite": int(np.count_nonzero(~np.isfinite(values)))})
        if self.group is not None:
            self.group.record(self._step, self.rank, tensor, amax, scale, self.recipe)
        if self._deferred:
            self._pending.append(tensor)
        else:
            scaler.update(amax)
        return x8, scale

    def _mx(self, dev: Device, name: str, fmt: Format, a: np.ndarray, b: np.ndarray, out_dtype) -> np.ndarray:
        """MX operands blocked along the contraction axis; a stack of matmuls (leading dimensions
        that broadcast) is quantised and multiplied matrix by matrix, and logged as one tensor."""
        rule, block = self.recipe.rule, self.recipe.block
        lead, stack_a, stack_b = matrix_stacks(a, b)
        quantised: dict[str, list[mx.MX]] = {"a": [], "b": []}
        products = []
        for x, y in zip(stack_a, stack_b, strict=True):
            qa = dev.quantize_mx(np.ascontiguousarray(x), fmt, axis=1, block=block, rule=rule)
            qb = dev.quantize_mx(np.ascontiguousarray(y), fmt, axis=0, block=block, rule=rule)
            quantised["a"].append(qa)
            quantised["b"].append(qb)
            products.append(dev.matmul_mx(qa, qb))
        for operand, x in (("a", a), ("b", b)):
            qs = quantised[operand]
            codes = np.concatenate([q.scales.reshape(-1) for q in qs])
            top = int(codes.max()) if codes.size else 127
            scale = 2.0 ** (127 - top) if top != 0xFF else float("nan")  # the largest block scale's reciprocal
            self._record({"step": self._step, "rank": self.rank, "tensor": f"{name}.{operand}", "format": fmt.name,
                          "scale": scale, "amax": amax_of(x), "saturated": sum(q.saturated for q in qs),
                          "nonfinite": sum(int(np.count_nonzero(~np.isfinite(mx.dequantize(q)))) for q in qs)})
        out = np.stack(products).reshape(*lead, a.shape[-2], b.shape[-1])
        return dev.cast(out, out_dtype)
