"""Hand-worked trajectories for every manager's edges, and argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from lossscale import ExponentialUpdateLossScaleManager, FixedLossScaleManager, trajectory
from lossscale.policy.frameworks import (
    ApexLossScaler,
    DeepSpeedLossScaler,
    FairseqDynamicLossScaler,
    JmpDynamicLossScale,
    Keras3LossScale,
    KerasDynamicLossScale,
    MegatronGradScaler,
    MindSporeDynamicLossScale,
    MinimumScaleError,
    TF1ExponentialUpdateLossScaleManager,
    TorchGradScaler,
    TorchNpuGradScaler,
)

T, F = True, False
F32_MAX = float(np.finfo(np.float32).max)


def run(manager, steps) -> list[float]:
    out = [manager.get_loss_scale()]
    for finite in steps:
        manager.update_loss_scale(finite)
        out.append(manager.get_loss_scale())
    return out


def test_ascend_exponential_rules() -> None:
    m = ExponentialUpdateLossScaleManager(init_loss_scale=8, incr_every_n_steps=2, decr_every_n_nan_or_inf=2)
    # F: bad=1. T: good=1, bad stays 1. F: bad+1=2 -> 8*0.8 = 6.4 (binary32). T,T: grows to 12.8.
    assert run(m, [F, T, F, T, T]) == [8, 8, 8, float(np.float32(6.4)), float(np.float32(6.4)),
                                        float(np.float32(6.4) * np.float32(2))]
    assert m.state.good == 0 and m.state.bad == 0
    m = ExponentialUpdateLossScaleManager(8, 3)
    run(m, [T, T, F])  # a non-finite step resets the good counter
    assert (m.state.good, m.state.bad) == (0, 1)


def test_binary32_arithmetic_of_the_seed_example() -> None:
    # The NPULossScaleOptimizer page's call: 2**32 with decr_ratio=0.5; and the default ratio 0.8, which rounds.
    m = ExponentialUpdateLossScaleManager(init_loss_scale=2**32, incr_every_n_steps=1000,
                                          decr_every_n_nan_or_inf=2, decr_ratio=0.5)
    assert run(m, [F, F]) == [2.0**32, 2.0**32, 2.0**31]
    m = ExponentialUpdateLossScaleManager(2**32, 1000)
    m.update_loss_scale(False)
    m.update_loss_scale(False)
    # 2**32 * 0.8 = 3435973836.8; binary32 spacing there is 256: 13421772.8 * 256 -> 13421773 * 256.
    assert m.get_loss_scale() == 3435973888.0


def test_growth_guards_differ_between_ascend_and_tf1() -> None:
    s = float(np.float32(1.7e38))  # not below 3.4e38 / 2 in binary32, yet twice it is finite
    ascend = ExponentialUpdateLossScaleManager(s, 1)
    tf1 = TF1ExponentialUpdateLossScaleManager(s, 1)
    assert run(ascend, [T])[-1] == s and ascend.state.good == 0
    assert run(tf1, [T])[-1] == float(np.float32(s) * np.float32(2)) <= F32_MAX
    top = 2.0**127
    assert run(TF1ExponentialUpdateLossScaleManager(top, 1), [T])[-1] == top  # 2**128 would be Inf


def test_floors() -> None:
    assert run(ExponentialUpdateLossScaleManager(1, 5, decr_every_n_nan_or_inf=1), [F, F]) == [1, 1, 1]
    assert run(KerasDynamicLossScale(initial_scale=2), [F, F]) == [2, 1, 1]
    assert run(MindSporeDynamicLossScale(init_loss_scale=2), [F, F]) == [2, 1, 1]
    assert run(JmpDynamicLossScale(4, min_loss_scale=2), [F, F]) == [4, 2, 2]
    assert run(MegatronGradScaler(4, 3, 2, 0.5, 10, 1), [F, F]) == [4, 3, 3]
    assert run(TorchGradScaler(init_scale=2.0**-148), [F, F]) == [2.0**-148, 2.0**-149, 0.0]  # no floor
    assert run(Keras3LossScale(initial_scale=2.0**-149), [F]) == [2.0**-149, 0.0]


def test_caps() -> None:
    assert run(TorchGradScaler(2.0**127, growth_interval=1), [T]) == [2.0**127, 2.0**127]
    assert run(KerasDynamicLossScale(2.0**127, dynamic_growth_steps=1), [T]) == [2.0**127, 2.0**127]
    assert run(JmpDynamicLossScale(2.0**127, period=1), [T]) == [2.0**127, 2.0**127]
    assert run(Keras3LossScale(2.0**127, dynamic_growth_steps=1), [T]) == [2.0**127, np.inf]
    assert run(MegatronGradScaler(2.0**127, 1, 2, 0.5, 1, 1), [T]) == [2.0**127, np.inf]


def test_torch_rounds_a_binary64_product_once() -> None:
    # 0.75 * 0.3 in binary64 is 0.22499999999999998, rounded once to binary32.
    assert run(TorchGradScaler(0.75, backoff_factor=0.3), [F])[-1] == 0.22499999403953552
    # The tracker resets when growth is due, even when refused.
    t = TorchGradScaler(2.0**127, growth_interval=2)
    run(t, [T, T])
    assert t.state.counter == 0
    assert run(TorchGradScaler(1.0, growth_factor=1.5, growth_interval=2), [T, T, T, F]) == [1, 1, 1.5, 1.5, 0.75]


def test_torch_npu_rules() -> None:
    # torch_npu's _npu_update_scale: the defaults are PyTorch's; overflow halves, tracker 0.
    t = TorchNpuGradScaler()
    assert (t.policy.init_scale, t.policy.growth_factor, t.policy.backoff_factor, t.policy.growth_interval,
            t.policy.enabled, t.policy.dynamic) == (2.0**16, 2.0, 0.5, 2000, True, True)
    assert run(TorchNpuGradScaler(8, growth_interval=2), [T, F, T, T, T]) == [8, 8, 4, 4, 8, 8]
    # Growth to Inf is refused (torch.isinf) and the tracker resets all the same.
    big = TorchNpuGradScaler(2.0**127, growth_interval=1)
    assert run(big, [T, T]) == [2.0**127] * 3 and big.state.counter == 0
    # No lower bound: halving the smallest subnormal gives 0.
    assert run(TorchNpuGradScaler(2.0**-148), [F, F, F]) == [2.0**-148, 2.0**-149, 0.0, 0.0]
    # The factor is a binary32 scalar: 0.75 * f32(0.3), not the binary64 product rounded once.
    assert run(TorchNpuGradScaler(0.75, backoff_factor=0.3), [F])[-1] == float(np.float32(0.75) * np.float32(0.3))
    # dynamic=False: a constant scale and no check; enabled=False: no scaling (scale 1.0), no check.
    static = TorchNpuGradScaler(2.0**10, dynamic=False)
    assert run(static, [F, T, F]) == [1024.0] * 4 and not static.policy.checks_overflow()
    off = TorchNpuGradScaler(2.0**10, enabled=False)
    assert run(off, [F, T]) == [1.0] * 3 and not off.policy.checks_overflow()
    assert TorchNpuGradScaler().policy.checks_overflow()


def test_keras_and_jmp_periods() -> None:
    assert run(KerasDynamicLossScale(4, dynamic_growth_steps=2), [T, T, T, F, T, T]) == [4, 4, 8, 8, 4, 4, 8]
    assert run(Keras3LossScale(4, dynamic_growth_steps=2), [T, T, T, F, T, T]) == [4, 4, 8, 8, 4, 4, 8]
    j = JmpDynamicLossScale(4, period=2)
    assert run(j, [T, T, T, F, T]) == [4, 4, 8, 8, 4, 4]
    assert j.state.counter == 1


def test_deepspeed_schedule_hysteresis_and_error() -> None:
    # Window 2: stable = iter - last_overflow - 1; growth when stable > 0 and stable % 2 == 0.
    # iter 0: stable 0; iter 1: 1; iter 2: 2 -> grow; iter 3: 3; iter 4: 4 -> grow.
    assert run(DeepSpeedLossScaler(init_scale=8, scale_window=2), [T] * 5) == [8, 8, 8, 16, 16, 32]
    # An overflow at iter 1 (last_overflow = 1): iter 2 stable 0, iter 3 stable 1, iter 4 stable 2 -> grow.
    assert run(DeepSpeedLossScaler(init_scale=8, scale_window=2), [T, F, T, T, T]) == [8, 8, 4, 4, 4, 8]
    # Hysteresis 2: the first overflow is absorbed, the second halves.
    assert run(DeepSpeedLossScaler(init_scale=8, delayed_shift=2), [F, F, F]) == [8, 8, 4, 2]
    # Without consecutive_hysteresis a finite step does not refill it.
    assert run(DeepSpeedLossScaler(init_scale=8, delayed_shift=2), [F, T, F]) == [8, 8, 8, 4]
    assert run(DeepSpeedLossScaler(init_scale=8, delayed_shift=2, consecutive_hysteresis=True),
               [F, T, F]) == [8, 8, 8, 8]
    d = DeepSpeedLossScaler(init_scale=2, min_scale=1)
    d.update_loss_scale(False)
    with pytest.raises(MinimumScaleError):
        d.update_loss_scale(False)
    assert run(DeepSpeedLossScaler(init_scale=2, min_scale=1, raise_error_at_min_scale=False), [F, F]) == [2, 1, 1]


def test_megatron_hysteresis_and_growth() -> None:
    m = MegatronGradScaler(initial_scale=16, min_scale=1, growth_factor=2, backoff_factor=0.5,
                           growth_interval=2, hysteresis=2)
    # F: hyst 1 (no change). F: hyst 0 -> 8. F: hyst -1 -> 4. T,T: grow to 8, hyst refilled to 2.
    assert run(m, [F, F, F, T, T, F]) == [16, 16, 8, 4, 4, 8, 8]
    assert m.state.hysteresis_tracker == 1


def test_mindspore_window() -> None:
    # cur starts at 1, last at 0; growth when 2 <= cur - last.
    ms = MindSporeDynamicLossScale(init_loss_scale=4, scale_window=2)
    assert run(ms, [T, T, T, T, F, T, T]) == [4, 4, 8, 8, 16, 8, 8, 16]
    # On overflow the scale is multiplied by reciprocal(factor) in binary32, as the cell does:
    # 100 * f32(1/3) = 100 * 0.3333333432674408 rounds to 33.333335876464844, while the
    # quotient 100 / 3 rounds to 33.33333206176758.
    assert run(MindSporeDynamicLossScale(100, 3), [F])[-1] == 33.333335876464844
    assert float(np.float32(100) / np.float32(3)) == 33.33333206176758


def test_apex_halves_doubles_and_clamps() -> None:
    # apex/amp/scaler.py update_scale: an overflow halves (not below min_loss_scale where set) and
    # zeroes the unskipped count; the scale_window-th unskipped step doubles, not above max_loss_scale.
    # Window 2, cap 8: T (1), T (2: 4*2=8, count 0), T (1), T (2: min(8, 16)=8), F (4, count 0), T, T (8).
    assert run(ApexLossScaler(init_scale=4, scale_window=2, max_loss_scale=8),
               [T, T, T, T, F, T, T]) == [4, 4, 8, 8, 8, 4, 4, 8]
    assert run(ApexLossScaler(init_scale=32, max_loss_scale=8), []) == [8]  # min(max_loss_scale, init_scale)
    assert run(ApexLossScaler(init_scale=4, min_loss_scale=3), [F, F]) == [4, 3, 3]
    assert run(ApexLossScaler(init_scale=4), [F, F, F]) == [4, 2, 1, 0.5]  # no min_loss_scale: no floor


def test_fairseq_window_tolerance_threshold_and_minimum() -> None:
    # fairseq/optim/dynamic_loss_scaler.py. Growth on a clean step when (iter - last_overflow_iter) %
    # scale_window == 0, iter from 0 and last_overflow_iter from -1: with window 2 at iters 1 and 3.
    # The overflow at iter 4 halves (tolerance 0); growth then at iter 6 ((6 - 4) % 2 == 0).
    assert run(FairseqDynamicLossScaler(init_scale=4, scale_window=2),
               [T, T, T, T, F, T, T]) == [4, 4, 8, 8, 16, 8, 8, 16]
    # tolerance 0.5: the overflow at iter 1 is 1 overflow in 1 - (-1) = 2 iterations since the last
    # rescale, 0.5 >= 0.5, so it halves; the next, at iter 2, is 1 in 2 - 1 = 1: halves again.
    assert run(FairseqDynamicLossScaler(init_scale=16, scale_window=100, tolerance=0.5), [T, F, F]) == [16, 16, 8, 4]
    # tolerance 0.75: 1 in 2 (0.5) is tolerated, then 2 in 3 (iter 2 - (-1)) too, then 3 in 4 halves.
    assert run(FairseqDynamicLossScaler(init_scale=16, scale_window=100, tolerance=0.75),
               [T, F, F, F]) == [16, 16, 16, 16, 8]
    assert run(FairseqDynamicLossScaler(init_scale=4, threshold=3), [F, F]) == [4, 3, 3]
    f = FairseqDynamicLossScaler(init_scale=2, min_loss_scale=1)
    with pytest.raises(MinimumScaleError, match="the scale stays 2"):
        f.update_loss_scale(False)  # 2 / 2 = 1 is at min_loss_scale: fairseq keeps 2 and stops
    assert f.get_loss_scale() == 2


def test_fixed_manager() -> None:
    m = FixedLossScaleManager(loss_scale=1024)
    assert run(m, [F, T, F]) == [1024] * 4
    with pytest.raises(ValueError, match="loss_scale must be at least 1, got 0.5"):
        FixedLossScaleManager(0.5)


@pytest.mark.parametrize("make, message", [
    (lambda: ExponentialUpdateLossScaleManager(2**10, 0), "incr_every_n_steps must be an integer of at least 1, got 0"),
    (lambda: ExponentialUpdateLossScaleManager(2**10, 10, incr_ratio=0.5), "incr_ratio must be greater than 1"),
    (lambda: ExponentialUpdateLossScaleManager(2**10, 10, decr_ratio=1.5), "decr_ratio must be between 0 and 1"),
    (lambda: ExponentialUpdateLossScaleManager(float("inf"), 10), "init_loss_scale must be finite"),
    (lambda: ExponentialUpdateLossScaleManager("big", 10), "init_loss_scale must be a real number, got 'big'"),
    (lambda: ExponentialUpdateLossScaleManager(2**10, 2.5), "incr_every_n_steps must be an integer"),
    (lambda: ExponentialUpdateLossScaleManager(2**10, True), "incr_every_n_steps must be an integer"),
    (lambda: TorchGradScaler(backoff_factor=1.0), "backoff_factor must be between 0 and 1"),
    (lambda: DeepSpeedLossScaler(scale_window=0), "scale_window must be an integer of at least 1"),
    (lambda: MegatronGradScaler(1, 2, 2, 0.5, 10, 1), "min_scale must not exceed initial_scale"),
    (lambda: JmpDynamicLossScale(float("nan")), "loss_scale must be finite"),
    (lambda: FixedLossScaleManager(8, enable_overflow_check="yes"), "enable_overflow_check must be a bool"),
    (lambda: TorchNpuGradScaler(growth_factor=1.0), "growth_factor must be greater than 1"),
    (lambda: TorchNpuGradScaler(dynamic=1), "dynamic must be a bool"),
    (lambda: TorchNpuGradScaler(enabled="no"), "enabled must be a bool"),
])
def test_invalid_arguments_name_the_argument(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_update_takes_a_bool() -> None:
    with pytest.raises(ValueError, match="finite_grads must be a bool"):
        TorchGradScaler().update_loss_scale(1)


def exponential_reference(init: float, n_incr: int, n_decr: int, incr: float, decr: float,
                          steps: list[bool]) -> list[float]:
    """Ascend's ExponentialUpdateLossScaleManager rules written out from its documentation (the
    TF1 ``ExponentialUpdateLossScaleManager`` it adapts): binary32 scale, a good-step and a
    bad-step counter; growth refused at or above 3.4e38 / incr; the floor after a decrease is 1."""
    scale, good, bad = np.float32(init), 0, 0
    out = [float(scale)]
    for finite in steps:
        if finite:
            good += 1
            if good == n_incr:
                if scale < np.float32(3.4e38 / incr):
                    scale = np.float32(scale * np.float32(incr))
                good = bad = 0
        else:
            bad += 1
            good = 0
            if bad == n_decr:
                scale = max(np.float32(1), np.float32(scale * np.float32(decr)))
                good = bad = 0
        out.append(float(scale))
    return out


@pytest.mark.parametrize("init, n_incr, n_decr, incr, decr", [
    (2.0**16, 3, 2, 2.0, 0.8), (8.0, 1, 1, 2.0, 0.5), (2.0**120, 2, 3, 2.0, 0.8), (3.0, 4, 2, 3.0, 0.25)])
def test_trajectory_and_manager_follow_the_written_out_rules(init, n_incr, n_decr, incr, decr) -> None:
    """``trajectory`` on the policy and the stateful manager both match the rules written out
    independently, over random finite/overflow runs (mostly finite, so the scale also reaches the
    3.4e38 / incr ceiling from 2**120 and falls to the floor of 1 from 3)."""
    rng = np.random.default_rng(n_incr * 10 + n_decr)
    for p_finite in (0.9, 0.5, 0.2):
        steps = [bool(x) for x in rng.random(300) < p_finite]
        want = exponential_reference(init, n_incr, n_decr, incr, decr, steps)
        args = dict(init_loss_scale=init, incr_every_n_steps=n_incr, decr_every_n_nan_or_inf=n_decr,
                    incr_ratio=incr, decr_ratio=decr)
        assert trajectory(ExponentialUpdateLossScaleManager(**args).policy, steps) == want
        assert run(ExponentialUpdateLossScaleManager(**args), steps) == want
    # The ceiling by hand: 2**127 = 1.70141e38 is not below f32(3.4e38 / 2) = 1.7e38, so it stays.
    ceiling = ExponentialUpdateLossScaleManager(2.0**120, 2, incr_ratio=2.0).policy
    assert trajectory(ceiling, [T] * 40)[-1] == 2.0**127


def test_trajectory_refuses_what_is_not_a_bool() -> None:
    """A string is truthy: "False" must not be read as a finite step."""
    from lossscale.policy.frameworks import TorchPolicy

    with pytest.raises(TypeError, match=r"finite\[0\] must be a bool.*'False'"):
        trajectory(TorchPolicy(init_scale=4.0), ["False", "True"])
    with pytest.raises(TypeError, match=r"finite\[1\]"):
        trajectory(TorchPolicy(init_scale=4.0), [True, 1])
    assert trajectory(TorchPolicy(init_scale=4.0), np.array([False, True])) == [4.0, 2.0, 2.0]


@pytest.mark.parametrize("name,arg", [("torch", "init_scale"), ("torch-npu", "init_scale"), ("keras", "initial_scale"),
                                      ("keras3", "initial_scale"), ("megatron", "initial_scale"),
                                      ("mindspore", "init_loss_scale"), ("jmp", "loss_scale"),
                                      ("exponential", "init_loss_scale"), ("fixed", "loss_scale")])
def test_a_binary32_scale_beyond_binary32_is_refused(name: str, arg: str) -> None:
    """These frameworks keep the scale in a float32 tensor or variable: 1e39 would be Inf, and every
    step would be skipped. 3.4028235e38 (binary32's largest) is taken."""
    from lossscale.training.config import make_manager

    with pytest.raises(ValueError, match=rf"{arg} must be finite in binary32.*at most 3\.403e\+38.*1e\+39"):
        make_manager(name, {arg: 1e39}, defaults="framework")
    assert make_manager(name, {arg: 3.4028235e38}, defaults="framework").get_loss_scale() == np.float32(3.4028235e38)
