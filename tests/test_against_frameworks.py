"""The peer policies against the frameworks themselves, where they install here.

Compared, each through the framework's public API on the same finite/overflow
sequences (a gradient that is finite or Inf, then the framework's own update):

- PyTorch's ``torch.amp.GradScaler`` (CPU build 2.13.0) against ``TorchGradScaler``;
- Keras 3's ``LossScaleOptimizer`` (on the torch backend) against ``Keras3LossScale``;
- jmp's ``DynamicLossScale`` (on JAX, CPU) against ``JmpDynamicLossScale``.

Each is skipped cleanly when its framework is absent (``.ci/run`` installs
them). Not compared, because they do not install here or need CUDA:
TensorFlow 2 / Keras 2 and TF 1.x contrib, DeepSpeed, Megatron-LM, MindSpore;
their rules (as lossscale.policies cites them from each framework's source) are checked
against hand-worked trajectories and independent models in tests/test_policies.py and
tests/test_policy_models.py.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lossscale.policies import JmpDynamicLossScale, Keras3LossScale, TorchGradScaler

torch = pytest.importorskip("torch")
os.environ.setdefault("KERAS_BACKEND", "torch")


def torch_trajectory(steps, **kw) -> list[float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scaler = torch.amp.GradScaler("cpu", **kw)
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.0)
    out = [scaler.get_scale()]
    for finite in steps:
        opt.zero_grad()
        loss = p.sum() * (1.0 if finite else float("inf"))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        out.append(scaler.get_scale())
    return out


def ours(steps, **kw) -> list[float]:
    m = TorchGradScaler(**kw)
    out = [m.get_loss_scale()]
    for finite in steps:
        m.update_loss_scale(finite)
        out.append(m.get_loss_scale())
    return out


@given(steps=st.lists(st.booleans(), min_size=1, max_size=80),
       init_scale=st.sampled_from([2.0**16, 0.75, 3.0, 2.0**126, 1e-30, 12345.678]),
       growth_factor=st.sampled_from([2.0, 1.5, 1.0001, 3.7]),
       backoff_factor=st.sampled_from([0.5, 0.3, 0.999, 0.125]),
       growth_interval=st.integers(1, 5))
@settings(max_examples=150, deadline=None)
def test_torch_grad_scaler_bit_for_bit(steps, init_scale, growth_factor, backoff_factor, growth_interval) -> None:
    kw = dict(init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
              growth_interval=growth_interval)
    theirs, mine = torch_trajectory(steps, **kw), ours(steps, **kw)
    # Before the first update torch reports init_scale as given; after, its binary32 tensor.
    assert np.float32(mine[0]) == np.float32(theirs[0])
    assert mine[1:] == theirs[1:]


def keras_trajectory(steps, initial_scale: float, dynamic_growth_steps: int) -> list[float]:
    keras = pytest.importorskip("keras")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        var = keras.Variable(np.zeros(1, np.float32))
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(learning_rate=0.0), initial_scale=initial_scale,
                                                  dynamic_growth_steps=dynamic_growth_steps)
        opt.build([var])
        read = lambda: float(keras.ops.convert_to_numpy(opt.dynamic_scale))  # noqa: E731
        out = [read()]
        for finite in steps:
            opt.apply([keras.ops.convert_to_tensor(np.array([1.0 if finite else np.inf], np.float32))], [var])
            out.append(read())
    return out


@given(steps=st.lists(st.booleans(), min_size=1, max_size=40),
       initial_scale=st.sampled_from([2.0**15, 3.0, 2.0**126 * 1.5, 1e-30, 0.75]),
       dynamic_growth_steps=st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_keras3_loss_scale_optimizer_bit_for_bit(steps, initial_scale, dynamic_growth_steps) -> None:
    theirs = keras_trajectory(steps, initial_scale, dynamic_growth_steps)
    m = Keras3LossScale(initial_scale, dynamic_growth_steps)
    mine = [m.get_loss_scale()]
    for finite in steps:
        m.update_loss_scale(finite)
        mine.append(m.get_loss_scale())
    assert mine == theirs


@given(steps=st.lists(st.booleans(), min_size=1, max_size=40),
       loss_scale=st.sampled_from([2.0**15, 3.0, 2.0**126 * 1.5, 1e-30, 0.75]),
       period=st.integers(1, 4), factor=st.integers(2, 3), min_loss_scale=st.sampled_from([1.0, 0.25]))
@settings(max_examples=60, deadline=None)
def test_jmp_dynamic_loss_scale_bit_for_bit(steps, loss_scale, period, factor, min_loss_scale) -> None:
    jmp = pytest.importorskip("jmp")
    jnp = pytest.importorskip("jax.numpy")
    theirs = jmp.DynamicLossScale(jnp.float32(loss_scale), period=period, factor=factor,
                                  min_loss_scale=jnp.float32(min_loss_scale))
    mine = JmpDynamicLossScale(loss_scale, period=period, factor=factor, min_loss_scale=min_loss_scale)
    assert float(theirs.loss_scale) == mine.get_loss_scale()
    for finite in steps:
        theirs = theirs.adjust(jnp.array(finite))
        mine.update_loss_scale(finite)
        assert float(theirs.loss_scale) == mine.get_loss_scale()
        assert int(theirs.counter) == mine.state.counter
