"""Stateful hypothesis tests: every manager against a model written from the frameworks' rules.

The models below are written afresh from those rules, in a different
style from the implementation (mutable state, binary64 arithmetic rounded to
binary32 afterwards, which is exact for the products and innocuous for the
quotients involved). Each machine also drives a twin manager with the same
steps (determinism) and checks the declared floor and cap.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from lossscale import ExponentialUpdateLossScaleManager, FixedLossScaleManager
from lossscale.policy.frameworks import (
    DeepSpeedLossScaler,
    JmpDynamicLossScale,
    Keras3LossScale,
    KerasDynamicLossScale,
    MegatronGradScaler,
    MindSporeDynamicLossScale,
    MinimumScaleError,
    TF1ExponentialUpdateLossScaleManager,
    TorchGradScaler,
)

MAX32 = float(np.finfo(np.float32).max)


def r32(x: float) -> float:
    """Round a binary64 value to binary32 (to nearest even; overflow to Inf)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


class Model:
    counters: tuple = ()

    def __init__(self, **kw):
        self.kw = kw


class AscendModel(Model):
    tf1 = False

    def __init__(self, init_loss_scale, incr_every_n_steps, decr_every_n_nan_or_inf=2, incr_ratio=2, decr_ratio=0.8):
        self.S, self.good, self.bad = r32(init_loss_scale), 0, 0
        self.n, self.m = incr_every_n_steps, decr_every_n_nan_or_inf
        self.up, self.down = r32(incr_ratio), r32(decr_ratio)
        self.guard = r32(3.4e38 / incr_ratio)

    def step(self, finite):
        if finite:
            if self.good + 1 >= self.n:
                grown = r32(self.S * self.up)
                if (math.isfinite(grown) if self.tf1 else self.S < self.guard):
                    self.S = grown
                self.good = self.bad = 0
            else:
                self.good += 1
        elif self.bad + 1 >= self.m:
            self.S = max(1.0, r32(self.S * self.down))
            self.good = self.bad = 0
        else:
            self.bad += 1
            self.good = 0
        self.counters = (self.good, self.bad)


class TF1Model(AscendModel):
    tf1 = True


class FixedModel(Model):
    def __init__(self, loss_scale, enable_overflow_check=True):
        self.S = r32(loss_scale)

    def step(self, finite):
        pass


class TorchModel(Model):
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.S, self.t = r32(init_scale), 0
        self.g, self.b, self.i = growth_factor, backoff_factor, growth_interval

    def step(self, finite):
        if not finite:
            self.S, self.t = r32(self.S * self.b), 0
        elif self.t + 1 == self.i:
            grown = r32(self.S * self.g)
            self.S = grown if math.isfinite(grown) else self.S
            self.t = 0
        else:
            self.t += 1
        self.counters = (self.t,)


class KerasModel(Model):
    def __init__(self, initial_scale=2.0**15, dynamic_growth_steps=2000, multiplier=2.0):
        self.S, self.g, self.p, self.mult = r32(initial_scale), 0, dynamic_growth_steps, r32(multiplier)

    def step(self, finite):
        if finite:
            if self.g + 1 >= self.p:
                grown = r32(self.S * self.mult)
                self.S = grown if math.isfinite(grown) else self.S
                self.g = 0
            else:
                self.g += 1
        else:
            self.g, self.S = 0, max(r32(self.S / self.mult), 1.0)
        self.counters = (self.g,)


class Keras3Model(Model):
    def __init__(self, initial_scale=2.0**15, dynamic_growth_steps=2000):
        self.S, self.c, self.p = r32(initial_scale), 0, dynamic_growth_steps

    def step(self, finite):
        if finite and self.c == self.p - 1:
            self.S, self.c = r32(self.S * 2), 0
        elif finite:
            self.c += 1
        else:
            self.S, self.c = r32(self.S / 2), 0
        self.counters = (self.c,)


class DeepSpeedModel(Model):
    def __init__(self, init_scale=2.0**32, scale_factor=2.0, scale_window=1000, min_scale=1, delayed_shift=1,
                 consecutive_hysteresis=False, raise_error_at_min_scale=True):
        self.S, self.f, self.w, self.lo = float(init_scale), scale_factor, scale_window, float(min_scale)
        self.shift, self.consec, self.err = delayed_shift, consecutive_hysteresis, raise_error_at_min_scale
        self.it, self.last, self.hyst = 0, -1, delayed_shift
        self.counters = (self.it, self.last, self.hyst)

    def step(self, finite):
        if not finite:
            if self.shift == 1 or self.hyst == 1:
                if self.S == self.lo and self.err:
                    raise MinimumScaleError
                self.S = max(self.S / self.f, self.lo)
            else:
                self.hyst -= 1
            self.last = self.it
        else:
            if self.consec:
                self.hyst = self.shift
            stable = self.it - self.last - 1
            if stable > 0 and stable % self.w == 0:
                if not self.consec:
                    self.hyst = self.shift
                self.S *= self.f
        self.it += 1
        self.counters = (self.it, self.last, self.hyst)


class MegatronModel(Model):
    def __init__(self, initial_scale, min_scale, growth_factor, backoff_factor, growth_interval, hysteresis):
        self.S, self.lo = r32(initial_scale), r32(min_scale)
        self.up, self.down, self.i, self.h = r32(growth_factor), r32(backoff_factor), growth_interval, hysteresis
        self.tracker, self.hyst = 0, hysteresis
        self.counters = (0, hysteresis)

    def step(self, finite):
        if not finite:
            self.tracker = 0
            self.hyst -= 1
            if self.hyst <= 0:
                self.S = max(r32(self.S * self.down), self.lo)
        else:
            self.tracker += 1
            if self.tracker == self.i:
                self.tracker, self.hyst, self.S = 0, self.h, r32(self.S * self.up)
        self.counters = (self.tracker, self.hyst)


class MindSporeModel(Model):
    def __init__(self, init_loss_scale=2.0**24, scale_factor=2, scale_window=2000):
        self.S, self.f, self.w, self.cur, self.last = r32(init_loss_scale), r32(scale_factor), scale_window, 1, 0
        self.counters = (1, 0)

    def step(self, finite):
        overflow = not finite
        s = max(r32(self.S * r32(1 / self.f)), 1.0) if overflow else self.S  # times reciprocal(factor)
        inc = self.w <= self.cur - self.last
        if overflow or inc:
            self.last = self.cur
        if inc and not overflow:
            s = r32(s * self.f)
        self.S, self.cur = s, self.cur + 1
        self.counters = (self.cur, self.last)


class JmpModel(Model):
    def __init__(self, loss_scale, counter=0, period=2000, factor=2, min_loss_scale=1.0):
        self.S, self.c, self.p, self.f, self.lo = r32(loss_scale), counter, period, r32(factor), r32(min_loss_scale)
        self.counters = (counter,)

    def step(self, finite):
        if finite:
            if self.c == self.p - 1:
                grown = r32(self.S * self.f)
                self.S = grown if math.isfinite(grown) else self.S
        else:
            self.S = max(self.lo, r32(self.S / self.f))
        self.c = ((self.c + 1) % self.p) * int(finite)
        self.counters = (self.c,)


scales = st.sampled_from([1.0, 2.0, 3.0, 2.0**15, 2.0**32, 1.7e38, 2.0**127, 12345.678, 2.0**126 * 1.5])
small_scales = st.sampled_from([2.0**-140, 1e-30, 0.75, 5.0])
periods = st.integers(1, 4)
ups = st.sampled_from([2.0, 1.5, 3.0, 1.0001])
downs = st.sampled_from([0.5, 0.8, 0.3, 0.999])

CASES = {
    "Ascend": (ExponentialUpdateLossScaleManager, AscendModel,
               st.fixed_dictionaries({"init_loss_scale": scales, "incr_every_n_steps": periods,
                                      "decr_every_n_nan_or_inf": periods, "incr_ratio": ups, "decr_ratio": downs})),
    "TF1": (TF1ExponentialUpdateLossScaleManager, TF1Model,
            st.fixed_dictionaries({"init_loss_scale": scales, "incr_every_n_steps": periods,
                                   "decr_every_n_nan_or_inf": periods, "incr_ratio": ups, "decr_ratio": downs})),
    "Fixed": (FixedLossScaleManager, FixedModel, st.fixed_dictionaries({"loss_scale": scales})),
    "Torch": (TorchGradScaler, TorchModel,
              st.fixed_dictionaries({"init_scale": scales | small_scales, "growth_factor": ups,
                                     "backoff_factor": downs, "growth_interval": periods})),
    "Keras": (KerasDynamicLossScale, KerasModel,
              st.fixed_dictionaries({"initial_scale": scales, "dynamic_growth_steps": periods, "multiplier": ups})),
    "Keras3": (Keras3LossScale, Keras3Model,
               st.fixed_dictionaries({"initial_scale": scales | small_scales, "dynamic_growth_steps": periods})),
    "DeepSpeed": (DeepSpeedLossScaler, DeepSpeedModel,
                  st.fixed_dictionaries({"init_scale": scales, "scale_factor": ups, "scale_window": periods,
                                         "min_scale": st.sampled_from([1.0, 0.5, 4.0]), "delayed_shift": periods,
                                         "consecutive_hysteresis": st.booleans(),
                                         "raise_error_at_min_scale": st.booleans()})),
    "Megatron": (MegatronGradScaler, MegatronModel,
                 st.fixed_dictionaries({"initial_scale": scales, "min_scale": st.sampled_from([1.0, 0.5]),
                                        "growth_factor": ups, "backoff_factor": downs,
                                        "growth_interval": periods, "hysteresis": periods})),
    "MindSpore": (MindSporeDynamicLossScale, MindSporeModel,
                  st.fixed_dictionaries({"init_loss_scale": scales, "scale_factor": ups, "scale_window": periods})),
    "Jmp": (JmpDynamicLossScale, JmpModel,
            st.fixed_dictionaries({"loss_scale": scales | small_scales, "period": periods, "factor": st.integers(2, 3),
                                   "min_loss_scale": st.sampled_from([1.0, 0.25])})),
}


def machine(manager_type, model_type, configs):
    class PolicyMachine(RuleBasedStateMachine):
        @initialize(config=configs)
        def build(self, config):
            self.manager, self.twin, self.model = manager_type(**config), manager_type(**config), model_type(**config)
            # The declared floor, or the initial scale if that starts below it (DeepSpeed allows it).
            self.floor = min(self.manager.policy.floor_value(), self.manager.get_loss_scale())
            self.broken = False

        @rule(finite=st.booleans())
        def step(self, finite):
            if self.broken:
                return
            try:
                self.model.step(finite)
            except MinimumScaleError:
                self.broken = True
                for m in (self.manager, self.twin):
                    try:
                        m.update_loss_scale(finite)
                    except MinimumScaleError:
                        continue
                    raise AssertionError("the model raised at the minimum scale, the manager did not") from None
                return
            self.manager.update_loss_scale(finite)
            self.twin.update_loss_scale(finite)

        @invariant()
        def agrees(self):
            if not hasattr(self, "model"):
                return
            scale = self.manager.get_loss_scale()
            assert scale == self.model.S, (scale, self.model.S)
            assert tuple(self.manager.state)[1:] == tuple(self.model.counters) or not self.model.counters
            assert self.twin.state == self.manager.state
            assert scale >= self.floor
            assert scale > 0 or self.floor == 0
            if self.manager.policy.capped:
                assert math.isfinite(scale) and scale <= MAX32

    PolicyMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
    return PolicyMachine


for _name, _case in CASES.items():
    globals()[f"Test{_name}Machine"] = machine(*_case).TestCase
