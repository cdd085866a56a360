"""The Ascend TensorFlow adapter's loss-scale managers (``npu_bridge``), exactly.

Scales are binary32 and updated with binary32 arithmetic, the ratios held as
binary32 constants, as the TensorFlow graph does (so ``2**32 * 0.8`` rounds as
on the device).

Sources: the Ascend TensorFlow adapter, ``tf_adapter/python/npu_bridge/estimator/npu/
npu_loss_scale_manager.py`` (github.com/Ascend/tensorflow), and its documentation page
of ``NPULossScaleOptimizer`` (the constructor and the managers it takes); the growth
guard ``S < 3.4e38 / incr_ratio`` is that code's; TensorFlow 1.x's
``tensorflow/contrib/mixed_precision/python/loss_scale_manager.py`` is the original it
adapts (it grows whenever the product is finite).

The rules, with their sources: ``docs/semantics.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .core import DEMO_SCALE, Policy, check_bool, check_period, check_ratio, check_scale, f32, manager_class, register

__all__ = ["FixedLossScale", "ExponentialUpdate"]


@dataclass(frozen=True)
class FixedLossScale(Policy):
    """A constant scale. With ``enable_overflow_check=False`` the optimizer
    applies every step, finite or not."""

    loss_scale: float
    enable_overflow_check: bool = True
    floor = "loss_scale"
    grows = False
    lowers = False

    class State(NamedTuple):
        scale: np.float32

    def __post_init__(self) -> None:
        check_scale("loss_scale", self.loss_scale, 1)
        check_bool("enable_overflow_check", self.enable_overflow_check)

    def checks_overflow(self) -> bool:
        return bool(self.enable_overflow_check)

    def initial(self) -> State:
        return self.State(f32(self.loss_scale))

    def next(self, state: State, finite: bool) -> State:
        return state


@dataclass(frozen=True)
class ExponentialUpdate(Policy):
    """Ascend ``ExponentialUpdateLossScaleManager`` (rules as the adapter's source, see the module).

    Finite step: after ``incr_every_n_steps`` consecutive good steps the scale
    grows by ``incr_ratio`` unless it is not below ``3.4e38 / incr_ratio``; both
    counters reset either way. Otherwise the good counter advances and the bad
    one is kept. Non-finite step: after ``decr_every_n_nan_or_inf`` bad steps
    (not necessarily consecutive) the scale becomes ``max(1, S * decr_ratio)``
    and both counters reset; otherwise the bad counter advances and the good
    one resets.
    """

    init_loss_scale: float
    incr_every_n_steps: int
    decr_every_n_nan_or_inf: int = 2
    incr_ratio: float = 2
    decr_ratio: float = 0.8
    floor = 1.0

    class State(NamedTuple):
        scale: np.float32
        good: int = 0
        bad: int = 0

    def __post_init__(self) -> None:
        check_scale("init_loss_scale", self.init_loss_scale, 1)
        check_period("incr_every_n_steps", self.incr_every_n_steps)
        check_period("decr_every_n_nan_or_inf", self.decr_every_n_nan_or_inf)
        check_ratio("incr_ratio", self.incr_ratio, above_one=True)
        check_ratio("decr_ratio", self.decr_ratio, above_one=False)

    def initial(self) -> State:
        return self.State(f32(self.init_loss_scale))

    def grown(self, scale: np.float32) -> np.float32:
        """The scale after a growth step: refused at or above 3.4e38 / incr_ratio."""
        return scale * f32(self.incr_ratio) if scale < f32(3.4e38 / self.incr_ratio) else scale

    def next(self, state: State, finite: bool) -> State:
        scale, good, bad = state
        with np.errstate(over="ignore"):
            if finite:
                if good + 1 >= self.incr_every_n_steps:
                    return self.State(self.grown(scale))
                return self.State(scale, good + 1, bad)
            if bad + 1 >= self.decr_every_n_nan_or_inf:
                return self.State(max(f32(1), scale * f32(self.decr_ratio)))
            return self.State(scale, 0, bad + 1)


# -- the stateful faces, made from the policies (``manager_class``) and registered by their short names ----------

FixedLossScaleManager = register(
    "fixed", loss_scale=2.0**10,
    required=({"loss_scale": 2.0**10}, "the user must give loss_scale; the demo's 2**10"))(manager_class(
    FixedLossScale, "FixedLossScaleManager",
    "``FixedLossScaleManager(loss_scale, enable_overflow_check=True)``."))

ExponentialUpdateLossScaleManager = register(
    "exponential", init_loss_scale=DEMO_SCALE, incr_every_n_steps=50, decr_every_n_nan_or_inf=2, decr_ratio=0.5,
    required=({"init_loss_scale": DEMO_SCALE, "incr_every_n_steps": 1000},
              "Ascend's example: 2**32 and 1000"))(manager_class(
    ExponentialUpdate, "ExponentialUpdateLossScaleManager",
    """``ExponentialUpdateLossScaleManager(init_loss_scale, incr_every_n_steps,
    decr_every_n_nan_or_inf=2, incr_ratio=2, decr_ratio=0.8)``."""))
