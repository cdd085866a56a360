"""Scenarios on simulated devices: which detector sees an overflowing gradient."""

from __future__ import annotations

import numpy as np
import pytest

from lossscale import (
    SGD,
    Adam,
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
    LossScaleOptimizer,
    Momentum,
    NPULossScaleOptimizer,
)
from sim import Device, Group

H = np.float16


def grad_fn(dev: Device, overflow: bool):
    """The gradient of the scaled loss, computed on ``dev`` in binary16: 300 * S
    overflows binary16 for S = 2**10 (307200 > 65504), 0.01 * S does not."""
    def fn(scale: float):
        x = np.array([300.0 if overflow else 0.01, 1.0], H)
        return [dev.mul(x, np.array([scale, scale], H))]
    return fn


def fresh(profile: str, detector: str | None = None, **kw):
    dev = Device(profile)
    w = np.array([1.0, 2.0], np.float32)
    opt = NPULossScaleOptimizer(SGD(0.1), ExponentialUpdateLossScaleManager(2**10, 100, decr_every_n_nan_or_inf=1),
                                detector=detector, **kw)
    return dev, w, opt


def test_saturation_overflow_is_caught_only_through_the_register() -> None:
    dev, w, opt = fresh("atlas-training")
    with dev:
        grads = opt.compute_gradients(grad_fn(dev, overflow=True), [w])
        assert np.isfinite(grads[0][0]).all()  # saturated to 65504: finite, and wrong
        assert dev.get_float_status().any()
        assert opt.apply_gradients(grads) is False
    assert w.tolist() == [1.0, 2.0]  # untouched
    assert not dev.get_float_status().any()  # read, then cleared
    assert opt.get_loss_scale() == 2**10 * np.float32(0.8)

    dev, w, naive = fresh("atlas-training", detector="isfinite")
    with dev:
        assert naive.minimize(grad_fn(dev, overflow=True), [w]) is True  # the naive check misses it
    assert w.tolist() != [1.0, 2.0]
    assert naive.get_loss_scale() == 2**10  # and the scale never backs off


@pytest.mark.parametrize("detector", [None, "isfinite", "status"])
def test_inf_nan_overflow_is_caught_by_both(detector) -> None:
    dev, w, opt = fresh("atlas-a2", detector=detector)
    with dev:
        grads = opt.compute_gradients(grad_fn(dev, overflow=True), [w])
        assert np.isinf(grads[0][0]).any()
        assert opt.apply_gradients(grads) is False
    assert w.tolist() == [1.0, 2.0]


def test_finite_steps_apply_and_grow() -> None:
    dev = Device("atlas-training")
    w = np.array([1.0, 2.0], np.float32)
    opt = NPULossScaleOptimizer(SGD(0.5), ExponentialUpdateLossScaleManager(2**10, 2))
    with dev:
        assert opt.minimize(grad_fn(dev, overflow=False), [w]) is True
        assert opt.minimize(grad_fn(dev, overflow=False), [w]) is True
    assert opt.get_loss_scale() == 2**11
    # grad = x * S in binary16, unscaled by 1/S in binary32: 0.01 rounded to binary16 first.
    g = np.float32(H(H(0.01) * H(2**10))) * np.reciprocal(np.float32(2**10))
    assert w[1] == np.float32(np.float32(2) - np.float32(0.5)) - np.float32(0.5)
    assert w[0] == np.float32(1) - np.float32(0.5) * g - np.float32(0.5) * g


def test_distributed_ranks_skip_together() -> None:
    devices = [Device("atlas-training", name=f"rank{r}") for r in range(4)]
    Group(devices)
    weights = [np.array([1.0, 2.0], np.float32) for _ in devices]
    opts = [NPULossScaleOptimizer(SGD(0.1), ExponentialUpdateLossScaleManager(2**10, 100, 1), is_distributed=True,
                                  device=dev) for dev in devices]
    # Every rank computes its gradients first (rank 2 overflows), then every rank applies.
    grads = [opt.compute_gradients(grad_fn(dev, overflow=(r == 2)), [w])
             for r, (dev, opt, w) in enumerate(zip(devices, opts, weights, strict=True))]
    applied = [opt.apply_gradients(g) for opt, g in zip(opts, grads, strict=True)]
    assert applied == [False] * 4
    assert all(w.tolist() == [1.0, 2.0] for w in weights)
    assert {opt.get_loss_scale() for opt in opts} == {float(np.float32(2**10) * np.float32(0.8))}
    assert all(opt.last_status[0] == 1 for opt in opts)  # each saw the summed register
    assert not any(d.get_float_status().any() for d in devices)
    # Without is_distributed only the overflowing rank would skip.
    for dev in devices:
        dev.clear_float_status()
    local = [NPULossScaleOptimizer(SGD(0.1), FixedLossScaleManager(2**10), device=dev) for dev in devices]
    grads = [opt.compute_gradients(grad_fn(dev, overflow=(r == 2)), [np.zeros(2, np.float32)])
             for r, (dev, opt) in enumerate(zip(devices, local, strict=True))]
    assert [opt.apply_gradients(g) for opt, g in zip(local, grads, strict=True)] == [True, True, False, True]


def test_unchecked_fixed_manager_applies_everything() -> None:
    dev, w, _ = fresh("atlas-training")
    opt = NPULossScaleOptimizer(SGD(0.1), FixedLossScaleManager(2**10, enable_overflow_check=False))
    with dev:
        assert opt.minimize(grad_fn(dev, overflow=True), [w]) is True
    assert w.tolist() != [1.0, 2.0]


def test_tf1_loss_scale_optimizer_checks_gradients() -> None:
    w = np.array([1.0], np.float32)
    opt = LossScaleOptimizer(Momentum(0.1), ExponentialUpdateLossScaleManager(4, 10, decr_every_n_nan_or_inf=1))
    assert opt.minimize(lambda s: [np.array([np.inf], np.float32)], [w]) is False
    assert w[0] == 1 and opt.get_loss_scale() == np.float32(4) * np.float32(0.8)
    assert opt.minimize(lambda s: [np.array([s], np.float32), None], [w, np.zeros(1, np.float32)]) is True
    assert w[0] == np.float32(1) - np.float32(0.1)  # grad s * (1/s) = 1; None is skipped


def test_optimizer_errors_and_adam() -> None:
    with pytest.raises(ValueError, match="unknown detector 'bogus'"):
        NPULossScaleOptimizer(SGD(0.1), FixedLossScaleManager(1), detector="bogus")
    with pytest.raises(ValueError, match="is_distributed must be a bool"):
        NPULossScaleOptimizer(SGD(0.1), FixedLossScaleManager(1), is_distributed="yes")
    with pytest.raises(RuntimeError, match="no current device"):
        NPULossScaleOptimizer(SGD(0.1), FixedLossScaleManager(1)).apply_gradients([(np.zeros(1), np.zeros(1))])
    with pytest.raises(TypeError, match="float32"):
        SGD(0.1).apply_gradients([(np.zeros(1), np.zeros(1, np.float64))])
    with pytest.raises(RuntimeError, match="not a rank"):
        with Device("atlas-training"):
            NPULossScaleOptimizer(SGD(0.1), FixedLossScaleManager(1), is_distributed=True).apply_gradients([])
    w = np.array([1.0], np.float32)
    adam = Adam(0.1)
    adam.apply_gradients([(np.array([0.5], np.float32), w)])
    assert abs(float(w[0]) - 0.9) < 1e-6  # the first Adam step moves by about lr
