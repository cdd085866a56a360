"""The other frameworks' dynamic loss scalers, with their argument names,
defaults and arithmetic. Each is a pure policy core and a stateful face made from it
(:func:`~lossscale.policy.core.manager_class`) with ``get_loss_scale()`` / ``update_loss_scale(finite)``
and ``state_dict()`` / ``load_state_dict()``.

Sources (each rule below is that file's): PyTorch ``torch/amp/grad_scaler.py`` and
``aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp`` (``_amp_update_scale``); Keras 2 /
TF2 ``keras/mixed_precision/loss_scale_optimizer.py`` (``DynamicLossScale``); Keras 3
``keras/src/optimizers/loss_scale_optimizer.py``; DeepSpeed
``deepspeed/runtime/fp16/loss_scaler.py`` (``DynamicLossScaler``); Megatron-LM
``megatron/core/optimizer/grad_scaler.py`` (``DynamicGradScaler``); MindSpore
``mindspore/python/mindspore/nn/wrap/loss_scale.py`` (``DynamicLossScaleUpdateCell``) and
``mindspore/python/mindspore/train/loss_scale_manager.py``; NVIDIA apex ``apex/amp/scaler.py``
(``LossScaler``, as of the commit before ``apex.amp`` was removed); fairseq
``fairseq/optim/dynamic_loss_scaler.py`` (``DynamicLossScaler``); jmp ``jmp/_src/loss_scale.py``
(``DynamicLossScale``); TF 1.x ``tensorflow/contrib/mixed_precision/python/
loss_scale_manager.py``. The torch, Keras 3 and jmp ones are also compared bit for bit
with the installed frameworks (``tests/lossscale_tests/policy_tests/test_against_frameworks.py``).

Arithmetic follows the originals: PyTorch multiplies its binary32 scale by a
binary64 factor and rounds once; TensorFlow, Keras, Megatron, MindSpore and
jmp compute in binary32 with the factor rounded to binary32; DeepSpeed, apex and
fairseq keep a Python float (binary64).

Every scaler's rules, with their sources: ``docs/semantics.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .ascend import ExponentialUpdate
from .core import (
    DEMO_SCALE,
    Policy,
    check_bool,
    check_period,
    check_positive,
    check_ratio,
    check_scale,
    f32,
    manager_class,
    register,
)

__all__ = [
    "TorchGradScaler", "TorchNpuGradScaler", "KerasDynamicLossScale", "Keras3LossScale", "DeepSpeedLossScaler",
    "MegatronGradScaler", "MindSporeDynamicLossScale", "JmpDynamicLossScale",
    "TF1ExponentialUpdateLossScaleManager", "ApexLossScaler", "FairseqDynamicLossScaler", "ApexPolicy", "FairseqPolicy",
    "TorchPolicy", "TorchNpuPolicy", "KerasPolicy", "Keras3Policy", "DeepSpeedPolicy", "MegatronPolicy",
    "MindSporePolicy", "JmpPolicy", "TF1ExponentialUpdate",
]


class _Counted(NamedTuple):
    scale: np.float32
    counter: int = 0


def _times(scale: np.float32, factor: np.float32) -> np.float32:
    with np.errstate(over="ignore"):
        return scale * factor


@dataclass(frozen=True)
class TorchPolicy(Policy):
    """``torch.amp.GradScaler``: backoff on overflow with no floor; growth after
    ``growth_interval`` finite steps if the grown scale is finite; the tracker
    resets whenever growth was due, granted or not."""

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    floor = 0.0
    State = _Counted

    def __post_init__(self) -> None:
        check_scale("init_scale", self.init_scale)
        check_ratio("growth_factor", self.growth_factor, above_one=True)
        check_ratio("backoff_factor", self.backoff_factor, above_one=False)
        check_period("growth_interval", self.growth_interval)

    def initial(self) -> _Counted:
        return _Counted(f32(self.init_scale))

    def _times(self, scale: np.float32, factor: float) -> np.float32:
        # float * double in C++: the product in binary64, rounded once to binary32.
        with np.errstate(over="ignore"):
            return np.float32(float(scale) * factor)

    def next(self, state: _Counted, finite: bool) -> _Counted:
        scale, tracker = state
        if not finite:
            return _Counted(self._times(scale, self.backoff_factor), 0)
        if tracker + 1 == self.growth_interval:
            grown = self._times(scale, self.growth_factor)
            return _Counted(grown if not math.isinf(grown) else scale, 0)
        return _Counted(scale, tracker + 1)


@dataclass(frozen=True)
class TorchNpuPolicy(TorchPolicy):
    """torch_npu's ``GradScaler`` (``torch_npu/npu/amp/grad_scaler.py``, ``_npu_update_scale``):
    the rules of torch's, run on the host with tensor arithmetic: the binary32 scale times
    the factor as a binary32 scalar (``self._scale.mul_(backoff)``, ``self._scale *
    growth``), growth kept unless ``torch.isinf``; no lower bound. ``dynamic=False``: a
    constant scale, gradients times 1/scale, no check. ``enabled=False``: no scaling (the
    scale reads 1.0, as ``get_scale`` says) and no check."""

    enabled: bool = True
    dynamic: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bool("enabled", self.enabled)
        check_bool("dynamic", self.dynamic)

    @property
    def grows(self) -> bool:  # type: ignore[override]
        return self.enabled and self.dynamic

    @property
    def lowers(self) -> bool:  # type: ignore[override]
        return self.enabled and self.dynamic

    def checks_overflow(self) -> bool:
        return bool(self.enabled and self.dynamic)

    def _times(self, scale: np.float32, factor: float) -> np.float32:
        return _times(scale, f32(factor))

    def initial(self) -> _Counted:
        return _Counted(f32(self.init_scale if self.enabled else 1.0))

    def next(self, state: _Counted, finite: bool) -> _Counted:
        return super().next(state, finite) if self.enabled and self.dynamic else state


@dataclass(frozen=True)
class KerasPolicy(Policy):
    """Keras 2 / TF2 dynamic loss scale: grow by ``multiplier`` after
    ``dynamic_growth_steps`` finite steps if finite; on overflow
    ``max(S / multiplier, 1)`` and the counter resets."""

    initial_scale: float = 2.0**15
    dynamic_growth_steps: int = 2000
    multiplier: float = 2.0
    floor = 1.0
    State = _Counted

    def __post_init__(self) -> None:
        check_scale("initial_scale", self.initial_scale, 1)
        check_period("dynamic_growth_steps", self.dynamic_growth_steps)
        check_ratio("multiplier", self.multiplier, above_one=True)

    def initial(self) -> _Counted:
        return _Counted(f32(self.initial_scale))

    def next(self, state: _Counted, finite: bool) -> _Counted:
        scale, counter = state
        m = f32(self.multiplier)
        if not finite:
            return _Counted(max(scale / m, f32(1)), 0)
        if counter + 1 >= self.dynamic_growth_steps:
            grown = _times(scale, m)
            return _Counted(grown if np.isfinite(grown) else scale, 0)
        return _Counted(scale, counter + 1)


@dataclass(frozen=True)
class Keras3Policy(Policy):
    """Keras 3 ``LossScaleOptimizer``: doubles after ``dynamic_growth_steps``
    finite steps with no finiteness check (the scale can reach Inf), halves
    on overflow with no floor."""

    initial_scale: float = 2.0**15
    dynamic_growth_steps: int = 2000
    floor = 0.0
    capped = False
    State = _Counted

    def __post_init__(self) -> None:
        check_scale("initial_scale", self.initial_scale)
        check_period("dynamic_growth_steps", self.dynamic_growth_steps)

    def initial(self) -> _Counted:
        return _Counted(f32(self.initial_scale))

    def next(self, state: _Counted, finite: bool) -> _Counted:
        scale, counter = state
        if not finite:
            return _Counted(scale / f32(2), 0)
        if counter == self.dynamic_growth_steps - 1:
            return _Counted(_times(scale, f32(2)), 0)
        return _Counted(scale, counter + 1)


class DeepSpeedState(NamedTuple):
    scale: float
    cur_iter: int = 0
    last_overflow_iter: int = -1
    cur_hysteresis: int = 1


class MinimumScaleError(RuntimeError):
    """DeepSpeed's error: an overflow at the minimum scale with ``raise_error_at_min_scale``."""


@dataclass(frozen=True)
class DeepSpeedPolicy(Policy):
    """DeepSpeed ``DynamicLossScaler`` (binary64 scale). Overflow: with no
    hysteresis left the scale drops to ``max(S / scale_factor, min_scale)``
    (an error if already at ``min_scale`` and ``raise_error_at_min_scale``),
    otherwise one hysteresis step is spent. Growth when the count of steps
    since the last overflow, minus one, is a positive multiple of ``scale_window``."""

    init_scale: float = 2.0**32
    scale_factor: float = 2.0
    scale_window: int = 1000
    min_scale: float = 1.0
    delayed_shift: int = 1
    consecutive_hysteresis: bool = False
    raise_error_at_min_scale: bool = True
    floor = "min_scale"
    capped = False
    State = DeepSpeedState

    def __post_init__(self) -> None:
        check_positive("init_scale", self.init_scale)
        check_ratio("scale_factor", self.scale_factor, above_one=True)
        check_period("scale_window", self.scale_window)
        check_positive("min_scale", self.min_scale)
        check_period("delayed_shift", self.delayed_shift)
        check_bool("consecutive_hysteresis", self.consecutive_hysteresis)
        check_bool("raise_error_at_min_scale", self.raise_error_at_min_scale)

    def initial(self) -> DeepSpeedState:
        return DeepSpeedState(float(self.init_scale), 0, -1, self.delayed_shift)

    def next(self, state: DeepSpeedState, finite: bool) -> DeepSpeedState:
        scale, it, last, hyst = state
        if not finite:
            if self.delayed_shift == 1 or hyst == 1:
                if scale == self.min_scale and self.raise_error_at_min_scale:
                    raise MinimumScaleError("Current loss scale already at minimum - cannot decrease scale anymore")
                scale = max(scale / self.scale_factor, float(self.min_scale))
            else:
                hyst -= 1
            return DeepSpeedState(scale, it + 1, it, hyst)
        if self.consecutive_hysteresis:
            hyst = self.delayed_shift
        stable = it - last - 1
        if stable > 0 and stable % self.scale_window == 0:
            if not self.consecutive_hysteresis:
                hyst = self.delayed_shift
            scale = scale * self.scale_factor
        return DeepSpeedState(scale, it + 1, last, hyst)


class MegatronState(NamedTuple):
    scale: np.float32
    growth_tracker: int = 0
    hysteresis_tracker: int = 1


@dataclass(frozen=True)
class MegatronPolicy(Policy):
    """Megatron-LM ``DynamicGradScaler`` (all arguments required): each
    overflow spends one hysteresis step and, with none left, backs off to
    ``max(S * backoff_factor, min_scale)``; ``growth_interval`` finite steps in
    a row grow the scale (no cap) and refill the hysteresis."""

    initial_scale: float
    min_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    hysteresis: int
    floor = "min_scale"
    capped = False
    State = MegatronState

    def __post_init__(self) -> None:
        check_scale("initial_scale", self.initial_scale)
        check_positive("min_scale", self.min_scale)
        if self.min_scale > self.initial_scale:
            raise ValueError(f"min_scale must not exceed initial_scale, "
                             f"got {self.min_scale!r} > {self.initial_scale!r}")
        check_ratio("growth_factor", self.growth_factor, above_one=True)
        check_ratio("backoff_factor", self.backoff_factor, above_one=False)
        check_period("growth_interval", self.growth_interval)
        check_period("hysteresis", self.hysteresis)

    def initial(self) -> MegatronState:
        return MegatronState(f32(self.initial_scale), 0, self.hysteresis)

    def next(self, state: MegatronState, finite: bool) -> MegatronState:
        scale, growth, hyst = state
        if not finite:
            hyst -= 1
            if hyst <= 0:
                scale = max(scale * f32(self.backoff_factor), f32(self.min_scale))
            return MegatronState(scale, 0, hyst)
        growth += 1
        if growth == self.growth_interval:
            return MegatronState(_times(scale, f32(self.growth_factor)), 0, self.hysteresis)
        return MegatronState(scale, growth, hyst)


class MindSporeState(NamedTuple):
    scale: np.float32
    cur_iter: int = 1
    last_overflow_iter: int = 0


@dataclass(frozen=True)
class MindSporePolicy(Policy):
    """MindSpore ``DynamicLossScaleUpdateCell`` with the ``DynamicLossScaleManager``
    defaults: on overflow ``max(S * reciprocal(scale_factor), 1)`` (binary32: the
    reciprocal rounded, then the product); growth when
    ``scale_window <= cur_iter - last_overflow_iter`` (no cap)."""

    init_loss_scale: float = 2.0**24
    scale_factor: float = 2
    scale_window: int = 2000
    floor = 1.0
    capped = False
    State = MindSporeState

    def __post_init__(self) -> None:
        check_scale("init_loss_scale", self.init_loss_scale, 1)
        check_ratio("scale_factor", self.scale_factor, above_one=True)
        check_period("scale_window", self.scale_window)

    def initial(self) -> MindSporeState:
        return MindSporeState(f32(self.init_loss_scale), 1, 0)

    def next(self, state: MindSporeState, finite: bool) -> MindSporeState:
        scale, cur, last = state
        f = f32(self.scale_factor)
        overflow = not finite
        if overflow:  # loss_scale * reciprocal(scale_factor): two roundings, not one division
            scale = max(scale * (f32(1) / f), f32(1))
        inc = self.scale_window <= cur - last
        if overflow or inc:
            last = cur
        if inc and not overflow:
            scale = _times(scale, f)
        return MindSporeState(scale, cur + 1, last)


@dataclass(frozen=True)
class JmpPolicy(Policy):
    """jmp ``DynamicLossScale``: after ``period`` finite steps the scale grows by
    ``factor`` if the result is finite; an overflow divides it, not below
    ``min_loss_scale``; the counter resets on overflow and at each period."""

    loss_scale: float
    counter: int = 0
    period: int = 2000
    factor: int = 2
    min_loss_scale: float = 1.0
    floor = "min_loss_scale"
    State = _Counted

    def __post_init__(self) -> None:
        check_scale("loss_scale", self.loss_scale)
        check_period("counter", self.counter, low=0)
        check_period("period", self.period)
        check_ratio("factor", self.factor, above_one=True)
        check_positive("min_loss_scale", self.min_loss_scale)

    def initial(self) -> _Counted:
        return _Counted(f32(self.loss_scale), self.counter)

    def next(self, state: _Counted, finite: bool) -> _Counted:
        scale, counter = state
        f = f32(self.factor)
        if finite:
            if counter == self.period - 1:
                grown = _times(scale, f)
                scale = grown if np.isfinite(grown) else scale
        else:
            scale = max(f32(self.min_loss_scale), scale / f)
        return _Counted(scale, ((counter + 1) % self.period) * int(finite))


class ApexState(NamedTuple):
    scale: float
    unskipped: int = 0


@dataclass(frozen=True)
class ApexPolicy(Policy):
    """apex ``amp`` ``LossScaler`` (dynamic; binary64): an overflow halves the scale (not below
    ``min_loss_scale`` where one is set: 0 stands for apex's None) and zeroes the count of unskipped
    steps; the ``scale_window``-th unskipped step in a row doubles it, not above ``max_loss_scale``.
    apex's ``scale_factor`` argument is not used by its update (it halves and doubles), so it is
    not an argument here. The initial scale is ``min(max_loss_scale, init_scale)``."""

    init_scale: float = 2.0**16
    scale_window: int = 2000
    min_loss_scale: float = 0.0
    max_loss_scale: float = 2.0**24
    State = ApexState

    def __post_init__(self) -> None:
        check_positive("init_scale", self.init_scale)
        check_period("scale_window", self.scale_window)
        if self.min_loss_scale != 0:
            check_positive("min_loss_scale", self.min_loss_scale)
        check_positive("max_loss_scale", self.max_loss_scale)

    def floor_value(self) -> float:
        return float(self.min_loss_scale)

    def cap_value(self) -> float:
        return float(self.max_loss_scale)

    def initial(self) -> ApexState:
        return ApexState(float(min(self.max_loss_scale, self.init_scale)))

    def next(self, state: ApexState, finite: bool) -> ApexState:
        scale, unskipped = state
        if not finite:
            scale = max(self.min_loss_scale, scale / 2.0) if self.min_loss_scale else scale / 2.0
            unskipped = 0
        else:
            unskipped += 1
        if unskipped == self.scale_window:
            return ApexState(min(float(self.max_loss_scale), scale * 2.0), 0)
        return ApexState(scale, unskipped)


class FairseqState(NamedTuple):
    scale: float
    iter: int = 0
    last_overflow_iter: int = -1
    last_rescale_iter: int = -1
    overflows_since_rescale: int = 0


@dataclass(frozen=True)
class FairseqPolicy(Policy):
    """fairseq ``DynamicLossScaler`` (binary64): a clean step grows the scale by ``scale_factor``
    when ``(iter - last_overflow_iter) % scale_window == 0``; an overflow divides it (not below
    ``threshold``, where one is set: 0 stands for fairseq's None) once the share of overflows since
    the last rescale reaches ``tolerance``. Where the lowered scale is at or below
    ``min_loss_scale``, fairseq keeps the old one and stops training (FloatingPointError):
    here MinimumScaleError."""

    init_scale: float = 2.0**15
    scale_factor: float = 2.0
    scale_window: int = 2000
    tolerance: float = 0.0
    threshold: float = 0.0
    min_loss_scale: float = 1e-4
    floor = "min_loss_scale"
    capped = False
    State = FairseqState

    def __post_init__(self) -> None:
        check_positive("init_scale", self.init_scale)
        check_ratio("scale_factor", self.scale_factor, above_one=True)
        check_period("scale_window", self.scale_window)
        if not 0 <= self.tolerance <= 1:
            raise ValueError(f"tolerance must be between 0 and 1, got {self.tolerance!r}")
        if self.threshold != 0:
            check_positive("threshold", self.threshold)
        check_positive("min_loss_scale", self.min_loss_scale)

    def initial(self) -> FairseqState:
        return FairseqState(float(self.init_scale))

    def next(self, state: FairseqState, finite: bool) -> FairseqState:
        scale, it, last_overflow, last_rescale, since = state
        if finite:
            if (it - last_overflow) % self.scale_window == 0:
                scale, last_rescale = scale * self.scale_factor, it
            return FairseqState(scale, it + 1, last_overflow, last_rescale, since)
        previous, since = scale, since + 1
        if since / float(it - last_rescale) >= self.tolerance:
            scale = scale / self.scale_factor
            if self.threshold:
                scale = max(scale, float(self.threshold))
            last_rescale, since = it, 0
        if scale <= self.min_loss_scale:
            raise MinimumScaleError(f"Minimum loss scale reached ({self.min_loss_scale}); the scale stays {previous}")
        return FairseqState(scale, it + 1, it, last_rescale, since)


@dataclass(frozen=True)
class TF1ExponentialUpdate(ExponentialUpdate):
    """TensorFlow 1.x ``tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager``:
    as Ascend's, but growth is refused only when ``S * incr_ratio`` is not finite."""

    def grown(self, scale: np.float32) -> np.float32:
        candidate = _times(scale, f32(self.incr_ratio))
        return candidate if np.isfinite(candidate) else scale


# -- the stateful faces, made from the policies (``manager_class``) and registered by their short names ----------

TorchGradScaler = register("torch", init_scale=DEMO_SCALE, growth_interval=50)(manager_class(
    TorchPolicy, "TorchGradScaler",
    "``torch.amp.GradScaler(init_scale=2**16, growth_factor=2, backoff_factor=0.5, growth_interval=2000)``."))

TorchNpuGradScaler = register("torch-npu", init_scale=DEMO_SCALE, growth_interval=50)(manager_class(
    TorchNpuPolicy, "TorchNpuGradScaler",
    """torch_npu ``GradScaler(init_scale=2**16, growth_factor=2, backoff_factor=0.5, growth_interval=2000,
    dynamic=True, enabled=True)``; its overflow check is the ``torch-npu`` detector."""))

KerasDynamicLossScale = register("keras", initial_scale=DEMO_SCALE, dynamic_growth_steps=50)(manager_class(
    KerasPolicy, "KerasDynamicLossScale",
    "Keras 2 / TF2 ``LossScaleOptimizer(initial_scale=2**15, dynamic_growth_steps=2000)``, multiplier 2."))

Keras3LossScale = register("keras3", initial_scale=DEMO_SCALE, dynamic_growth_steps=50)(manager_class(
    Keras3Policy, "Keras3LossScale",
    "Keras 3 ``LossScaleOptimizer(initial_scale=2**15, dynamic_growth_steps=2000)``."))

DeepSpeedLossScaler = register("deepspeed", init_scale=DEMO_SCALE, scale_window=50)(manager_class(
    DeepSpeedPolicy, "DeepSpeedLossScaler",
    "DeepSpeed ``DynamicLossScaler`` (binary64); raises MinimumScaleError at the floor."))

MegatronGradScaler = register(
    "megatron", initial_scale=DEMO_SCALE, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
    growth_interval=50, hysteresis=2,
    required=({"initial_scale": 2.0**32, "min_scale": 1.0, "growth_factor": 2.0, "backoff_factor": 0.5,
               "growth_interval": 1000, "hysteresis": 2},
              "Megatron-LM's command-line defaults (--initial-loss-scale 2**32, --min-loss-scale 1, "
              "--loss-scale-window 1000, --hysteresis 2; factors 2 and 0.5)"))(manager_class(
    MegatronPolicy, "MegatronGradScaler",
    """Megatron-LM ``DynamicGradScaler(initial_scale, min_scale, growth_factor, backoff_factor,
    growth_interval, hysteresis)``."""))

MindSporeDynamicLossScale = register("mindspore", init_loss_scale=DEMO_SCALE, scale_window=50)(manager_class(
    MindSporePolicy, "MindSporeDynamicLossScale",
    "MindSpore ``DynamicLossScaleManager(init_loss_scale=2**24, scale_factor=2, scale_window=2000)``."))

JmpDynamicLossScale = register("jmp", loss_scale=DEMO_SCALE, period=50,
                               required=({"loss_scale": 2.0**15}, "jmp's README example: 2**15"))(manager_class(
    JmpPolicy, "JmpDynamicLossScale",
    "jmp ``DynamicLossScale(loss_scale, counter=0, period=2000, factor=2, min_loss_scale=1)``."))

TF1ExponentialUpdateLossScaleManager = register(
    "tf1", init_loss_scale=DEMO_SCALE, incr_every_n_steps=50, decr_every_n_nan_or_inf=2, decr_ratio=0.5,
    required=({"init_loss_scale": DEMO_SCALE, "incr_every_n_steps": 1000},
              "as Ascend's (its example: 2**32 and 1000)"))(manager_class(
    TF1ExponentialUpdate, "TF1ExponentialUpdateLossScaleManager",
    "TF 1.x contrib ``ExponentialUpdateLossScaleManager`` (same arguments as Ascend's)."))

ApexLossScaler = register("apex", init_scale=DEMO_SCALE, scale_window=50, max_loss_scale=2.0**120)(manager_class(
    ApexPolicy, "ApexLossScaler",
    "apex ``amp`` ``LossScaler('dynamic', init_scale=2**16, scale_window=2000, min_loss_scale=None, "
    "max_loss_scale=2**24)``."))

FairseqDynamicLossScaler = register("fairseq", init_scale=DEMO_SCALE, scale_window=50)(manager_class(
    FairseqPolicy, "FairseqDynamicLossScaler",
    "fairseq ``DynamicLossScaler(init_scale=2**15, scale_factor=2, scale_window=2000, tolerance=0, threshold=None, "
    "min_loss_scale=1e-4)``."))
