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


def test_optimizer_errors() -> None:
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


# -- the plain optimizers against their documented formulas and the frameworks ------------------
U = 2.0**-24  # binary32's unit roundoff
STEPS = 30


def gradients(size: float, seed: int = 8) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(16) * size).astype(np.float32) for _ in range(STEPS)]


W0 = np.random.default_rng(9).standard_normal(16).astype(np.float32)


def ours(opt, grads: list[np.ndarray]) -> list[np.ndarray]:
    w, out = W0.copy(), []
    for g in grads:
        opt.apply_gradients([(g, w)])
        out.append(w.copy())
    return out


def adam_reference(grads, lr, b1, b2, eps, epsilon_hat: bool = True) -> tuple[list[np.ndarray], float]:
    """Adam in binary64 on binary32 master weights' start, and a bound on a binary32 run's
    distance from it. ``epsilon_hat``: TensorFlow 1.x ``AdamOptimizer``'s documented update
    (tf.compat.v1.train.AdamOptimizer: lr_t = lr * sqrt(1 - b2**t) / (1 - b1**t);
    w -= lr_t * m / (sqrt(v) + eps)); else PyTorch's torch.optim.Adam (w -= lr / (1 - b1**t) *
    m / (sqrt(v / (1 - b2**t)) + eps)). The bound: step t's update is off by at most (8 + 4t)
    units relatively (m and v each gain about 2 units a step), and each weight is rounded once."""
    lr, b1, b2, eps = (float(np.float32(x)) for x in (lr, b1, b2, eps))
    w, m, v, out, bound = W0.astype(np.float64), 0.0, 0.0, [], 0.0
    for t, g in enumerate(grads, 1):
        g = g.astype(np.float64)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        if epsilon_hat:
            step = lr * np.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + eps)
        else:
            step = lr / (1 - b1**t) * m / (np.sqrt(v / (1 - b2**t)) + eps)
        w = w - step
        bound += (8 + 4 * t) * U * np.abs(step).max() + U * np.abs(w).max()
        out.append(w)
    return out, bound


@pytest.mark.parametrize("size, eps", [(1.0, 1e-8), (1e-8, 1e-8)], ids=["ordinary", "gradients-near-epsilon"])
def test_adam_is_tensorflow_1s_formula(size: float, eps: float) -> None:
    """Against the documented TF 1.x formula in binary64 with a bound. With gradients near epsilon
    the epsilon-hat form differs from PyTorch's by far more than the bound: the test tells them apart."""
    grads = gradients(size)
    got = ours(Adam(0.01, 0.9, 0.999, eps), grads)
    want, bound = adam_reference(grads, 0.01, 0.9, 0.999, eps)
    assert max(np.abs(g - w).max() for g, w in zip(got, want, strict=True)) <= bound
    if size < 1:
        torch_form, _ = adam_reference(grads, 0.01, 0.9, 0.999, eps, epsilon_hat=False)
        assert np.abs(torch_form[-1] - want[-1]).max() > 100 * bound


@pytest.mark.slow  # imports TensorFlow (~25 s); test_adam_is_tensorflow_1s_formula stays in the default run
def test_adam_against_tensorflow() -> None:
    """tf.compat.v1.train.AdamOptimizer itself, on binary32 variables (its kernel computes m and v
    as m + (g - m) * (1 - b1): another rounding, within the same bound of the binary64 formula)."""
    tf = pytest.importorskip("tensorflow")
    for size in (1.0, 1e-8):
        grads = gradients(size)
        var = tf.Variable(W0.copy())
        opt = tf.compat.v1.train.AdamOptimizer(0.01, 0.9, 0.999, 1e-8)
        theirs = []
        for g in grads:
            opt.apply_gradients([(tf.constant(g), var)])
            theirs.append(var.numpy().copy())
        want, bound = adam_reference(grads, 0.01, 0.9, 0.999, 1e-8)
        got = ours(Adam(0.01, 0.9, 0.999, 1e-8), grads)
        for name, run in (("tensorflow", theirs), ("ours", got)):
            assert max(np.abs(r - w).max() for r, w in zip(run, want, strict=True)) <= bound, (name, size)


def test_adam_against_torch_where_epsilon_does_not_matter() -> None:
    """torch.optim.Adam adds epsilon after the bias correction; with epsilon 1e-30 the two forms
    agree, so torch's run is within twice the bound of ours."""
    torch = pytest.importorskip("torch")
    grads = gradients(1.0)
    p = torch.nn.Parameter(torch.from_numpy(W0.copy()))
    opt = torch.optim.Adam([p], lr=0.01, betas=(0.9, 0.999), eps=1e-30)
    theirs = []
    for g in grads:
        p.grad = torch.from_numpy(g.copy())
        opt.step()
        theirs.append(p.detach().numpy().copy())
    got = ours(Adam(0.01, 0.9, 0.999, 1e-30), grads)
    _, bound = adam_reference(grads, 0.01, 0.9, 0.999, 1e-30)
    assert max(np.abs(a - b).max() for a, b in zip(got, theirs, strict=True)) <= 2 * bound


def momentum_reference(grads, lr: float, momentum: float) -> list[np.ndarray]:
    """TF ``MomentumOptimizer`` / ``ApplyMomentum`` (and torch.optim.SGD with momentum, no dampening
    or Nesterov: the same recurrence), written out in binary32: accum = momentum * accum + g;
    w -= lr * accum, each operation rounded by numpy."""
    lr32, mu = np.float32(lr), np.float32(momentum)
    w, accum, out = W0.copy(), np.zeros_like(W0), []
    for g in grads:
        accum = accum * mu + g
        w = w - lr32 * accum
        out.append(w)
    return out


def test_momentum_is_the_documented_recurrence() -> None:
    grads = gradients(1.0)
    for got, want in zip(ours(Momentum(0.05, 0.9), grads), momentum_reference(grads, 0.05, 0.9), strict=True):
        assert np.array_equal(got, want)


def test_momentum_against_tensorflow() -> None:
    """tf.compat.v1.train.MomentumOptimizer on binary32 variables gives the same bits as ours
    (ApplyMomentum: the same roundings, in the same order)."""
    tf = pytest.importorskip("tensorflow")
    grads = gradients(1.0)
    var = tf.Variable(W0.copy())
    opt = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9)
    for g, w in zip(grads, ours(Momentum(0.05, 0.9), grads), strict=True):
        opt.apply_gradients([(tf.constant(g), var)])
        assert np.array_equal(var.numpy(), w)


def test_momentum_against_torch() -> None:
    """torch.optim.SGD(momentum=0.9) on binary32 weights: the same recurrence, but its CPU kernel
    may fuse w - lr * accum into one rounding. The momentum buffer does not depend on the weights,
    so the runs differ by at most one rounding of each weight per step: STEPS units of the largest."""
    torch = pytest.importorskip("torch")
    grads = gradients(1.0)
    got = ours(Momentum(0.05, 0.9), grads)
    p = torch.nn.Parameter(torch.from_numpy(W0.copy()))
    opt = torch.optim.SGD([p], lr=0.05, momentum=0.9)
    for g in grads:
        p.grad = torch.from_numpy(g.copy())
        opt.step()
    largest = max(np.abs(w).max() for w in got)
    assert np.abs(p.detach().numpy() - got[-1]).max() <= 2 * STEPS * U * largest
