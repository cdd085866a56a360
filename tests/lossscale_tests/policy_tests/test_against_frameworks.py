"""The peer policies against the frameworks themselves, where they install here.

Compared, each through the framework's public API on the same finite/overflow
sequences (a gradient that is finite or Inf, then the framework's own update):

- PyTorch's ``torch.amp.GradScaler`` (CPU build 2.13.0) against ``TorchGradScaler``;
- Keras 3's ``LossScaleOptimizer`` (on the torch backend) against ``Keras3LossScale``;
- jmp's ``DynamicLossScale`` (on JAX, CPU) against ``JmpDynamicLossScale``;
- DeepSpeed's ``DynamicLossScaler`` against ``DeepSpeedLossScaler``;
- TF2's Keras 2 ``tf_keras.mixed_precision.LossScaleOptimizer`` (dynamic) against
  ``KerasDynamicLossScale``;
- MindSpore's ``nn.DynamicLossScaleUpdateCell`` against ``MindSporeDynamicLossScale``, and
  its ``amp.DynamicLossScaler`` (jmp's rule with a floor of 1) against ``JmpDynamicLossScale``.

Each is skipped cleanly when its framework is absent (``.ci/run`` installs them).
torch_npu does not install without an NPU: ``TorchNpuGradScaler`` is checked against torch_npu's
own ``GradScaler._npu_update_scale``, compiled alone out of its ``grad_scaler.py`` and run on CPU
torch tensors where that file is at hand (an installed torch_npu, or the path in
LOSSSCALE_TORCH_NPU_GRAD_SCALER), and everywhere against ``torch.amp.GradScaler``, which it derives
from, on the cases where the two compute alike.
Megatron-LM (it needs CUDA) and TF 1.x contrib (no longer installs) are checked against
hand-worked trajectories and independent models in tests/lossscale_tests/policy_tests/test_policies.py and
tests/lossscale_tests/policy_tests/test_policy_models.py.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_policies import run as trajectory_of  # tests/ is on the path (pytest puts it there)

from lossscale.policy.frameworks import (
    DeepSpeedLossScaler,
    JmpDynamicLossScale,
    Keras3LossScale,
    KerasDynamicLossScale,
    MindSporeDynamicLossScale,
    MinimumScaleError,
    TorchGradScaler,
    TorchNpuGradScaler,
)

try:
    import torch
except ImportError:  # only the tests that run torch skip: jmp's, DeepSpeed's, TF's and MindSpore's run
    torch = None
#: On the tests that need torch itself (Keras 3 runs on its torch backend here).
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
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


@needs_torch
@given(steps=st.lists(st.booleans(), min_size=1, max_size=80),
       init_scale=st.sampled_from([2.0**16, 0.75, 3.0, 2.0**126, 1e-30, 12345.678]),
       growth_factor=st.sampled_from([2.0, 1.5, 1.0001, 3.7]),
       backoff_factor=st.sampled_from([0.5, 0.3, 0.999, 0.125]),
       growth_interval=st.integers(1, 5))
@settings(max_examples=150, deadline=None)
def test_torch_grad_scaler_bit_for_bit(steps, init_scale, growth_factor, backoff_factor, growth_interval) -> None:
    kw = dict(init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
              growth_interval=growth_interval)
    theirs, mine = torch_trajectory(steps, **kw), trajectory_of(TorchGradScaler(**kw), steps)
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


@needs_torch
@pytest.mark.slow
@given(steps=st.lists(st.booleans(), min_size=1, max_size=40),
       initial_scale=st.sampled_from([2.0**15, 3.0, 2.0**126 * 1.5, 1e-30, 0.75]),
       dynamic_growth_steps=st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_keras3_loss_scale_optimizer_bit_for_bit(steps, initial_scale, dynamic_growth_steps) -> None:
    theirs = keras_trajectory(steps, initial_scale, dynamic_growth_steps)
    assert trajectory_of(Keras3LossScale(initial_scale, dynamic_growth_steps), steps) == theirs


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


def torch_npu_update() -> Callable[[Any], None]:
    """torch_npu's own ``GradScaler._npu_update_scale``, taken from its source and run on CPU tensors.

    torch_npu cannot be imported here: its package initialiser loads the Ascend CANN runtime
    (libascendcl and the NPU driver), absent from a machine without an NPU, and grad_scaler.py
    itself imports ``torch_npu`` and ``torch_npu.utils._error_code``. The update method uses none
    of them: only ``self`` (a float32 scale tensor, an int32 tracker, the factors, the interval,
    ``_has_overflow``), ``torch`` and ``print``. So its function is read out of grad_scaler.py
    (found without importing the package, or at the path LOSSSCALE_TORCH_NPU_GRAD_SCALER names)
    and compiled alone, with ``print`` silenced."""
    import ast
    import importlib.util
    from pathlib import Path

    path = os.environ.get("LOSSSCALE_TORCH_NPU_GRAD_SCALER")
    if not path:
        spec = importlib.util.find_spec("torch_npu")  # locates the package without running it
        path = spec and spec.origin and str(Path(spec.origin).parent / "npu" / "amp" / "grad_scaler.py")
    if not path or not Path(path).exists():
        pytest.skip("torch_npu's grad_scaler.py is not here (torch_npu installs only with an NPU); set "
                    "LOSSSCALE_TORCH_NPU_GRAD_SCALER to a copy of torch_npu/npu/amp/grad_scaler.py")
    tree = ast.parse(Path(path).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GradScaler")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_npu_update_scale")
    namespace: dict[str, Any] = {"torch": torch, "print": lambda *a, **k: None}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), namespace)  # noqa: S102
    return namespace["_npu_update_scale"]


def npu_trajectory(update, steps, init_scale, growth_factor, backoff_factor, growth_interval) -> list[float]:
    """The scale torch_npu's update gives, its state laid out as ``GradScaler`` lays it out
    (``_lazy_init_scale_growth_tracker``: a float32 scale, an int32 tracker)."""
    from types import SimpleNamespace

    me = SimpleNamespace(_scale=torch.full((), init_scale, dtype=torch.float32),
                         _growth_tracker=torch.full((), 0, dtype=torch.int32), _growth_factor=growth_factor,
                         _backoff_factor=backoff_factor, _growth_interval=growth_interval, _has_overflow=False)
    out = [float(me._scale)]
    for finite in steps:
        me._has_overflow = not finite
        update(me)
        out.append(float(me._scale))
    return out


SCALER_CASES = dict(steps=st.lists(st.booleans(), min_size=1, max_size=80),
                    init_scale=st.sampled_from([2.0**16, 0.75, 3.0, 2.0**126, 1e-30, 12345.678, 2.0**-140]),
                    growth_factor=st.sampled_from([2.0, 1.5, 1.0001, 3.7]),
                    backoff_factor=st.sampled_from([0.5, 0.3, 0.999, 0.125]),
                    growth_interval=st.integers(1, 5))


@needs_torch
@given(**SCALER_CASES)
@settings(max_examples=150, deadline=None)
def test_torch_npu_grad_scaler_runs_as_torch_npus_own_update(steps, init_scale, growth_factor, backoff_factor,
                                                            growth_interval) -> None:
    kw = dict(init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
              growth_interval=growth_interval)
    assert trajectory_of(TorchNpuGradScaler(**kw), steps) == npu_trajectory(torch_npu_update(), steps, **kw)


@needs_torch
@given(steps=st.lists(st.booleans(), min_size=1, max_size=80),
       init_scale=st.sampled_from([2.0**16, 1.0, 2.0**-100, 2.0**120]),
       growth_factor=st.sampled_from([2.0, 4.0]), backoff_factor=st.sampled_from([0.5, 0.25]),
       growth_interval=st.integers(1, 5))
@settings(max_examples=100, deadline=None)
def test_torch_npu_grad_scaler_is_torchs_where_the_products_are_exact(steps, init_scale, growth_factor,
                                                                     backoff_factor, growth_interval) -> None:
    """torch_npu's GradScaler derives from torch.amp.GradScaler (torch/amp/grad_scaler.py, ``update``,
    lines 484-560 of torch 2.13, which calls ``torch._amp_update_scale_``,
    aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp): the same rules, with the product rounded
    once from binary64 instead of after rounding the factor to binary32. With powers of two every
    product is exact (until binary32 overflows, where both keep the scale), so the two agree: run
    here against torch's own code."""
    kw = dict(init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
              growth_interval=growth_interval)
    assert trajectory_of(TorchNpuGradScaler(**kw), steps) == torch_trajectory(steps, **kw)


@needs_torch
def test_torch_npu_arithmetic_differs_from_torch() -> None:
    # torch's CPU kernel rounds the binary64 product once; torch_npu's tensor.mul_(0.3)
    # multiplies by 0.3 rounded to binary32 first: 0.75 * 0.3 differs in the last bit.
    ours = TorchNpuGradScaler(init_scale=0.75, backoff_factor=0.3)
    ours.update_loss_scale(False)
    assert ours.get_loss_scale() == float(np.float32(0.75) * np.float32(0.3)) == 0.22500000894069672
    assert torch_trajectory([False], init_scale=0.75, backoff_factor=0.3)[1] == 0.22499999403953552


@pytest.fixture(scope="module")
def deepspeed_scaler():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.fp16 import loss_scaler
    # Its overflow branch logs with the rank, which needs an initialised process group.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loss_scaler.dist, "get_rank", lambda: 0)
        yield loss_scaler


@given(steps=st.lists(st.booleans(), min_size=1, max_size=60),
       init_scale=st.sampled_from([2.0**16, 3.0, 2.0**-3, 1e300]),
       scale_window=st.integers(1, 4), min_scale=st.sampled_from([1.0, 0.25, 2.0**-10]),
       delayed_shift=st.integers(1, 3), consecutive_hysteresis=st.booleans(), raising=st.booleans())
@settings(max_examples=100, deadline=None)
def test_deepspeed_dynamic_loss_scaler(deepspeed_scaler, steps, init_scale, scale_window, min_scale, delayed_shift,
                                       consecutive_hysteresis, raising) -> None:
    theirs = deepspeed_scaler.DynamicLossScaler(init_scale, scale_window, min_scale, delayed_shift,
                                                consecutive_hysteresis, raise_error_at_min_scale=raising)
    mine = DeepSpeedLossScaler(init_scale=init_scale, scale_window=scale_window, min_scale=min_scale,
                               delayed_shift=delayed_shift, consecutive_hysteresis=consecutive_hysteresis,
                               raise_error_at_min_scale=raising)
    for finite in steps:
        try:
            theirs.update_scale(not finite)
        except Exception as err:  # noqa: BLE001 - DeepSpeed raises a bare Exception at the floor
            assert "minimum" in str(err)
            with pytest.raises(MinimumScaleError):
                mine.update_loss_scale(finite)
            return
        mine.update_loss_scale(finite)
        assert mine.get_loss_scale() == theirs.loss_scale and mine.state.cur_hysteresis == theirs.cur_hysteresis


@pytest.fixture(scope="module")
def tf_keras():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return pytest.importorskip("tf_keras")


@pytest.mark.slow
@given(steps=st.lists(st.booleans(), min_size=1, max_size=30),
       initial_scale=st.sampled_from([2.0**15, 3.0, 1.0, 2.0**127, 1.5]),
       dynamic_growth_steps=st.integers(1, 4))
@settings(max_examples=40, deadline=None)
def test_keras2_loss_scale_optimizer(tf_keras, steps, initial_scale, dynamic_growth_steps) -> None:
    import tensorflow as tf
    var = tf.Variable(np.zeros(1, np.float32))
    opt = tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.SGD(0.0), dynamic=True,
                                                      initial_scale=initial_scale,
                                                      dynamic_growth_steps=dynamic_growth_steps)
    theirs = [float(opt.loss_scale)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for finite in steps:
            opt.apply_gradients([(tf.constant([1.0 if finite else np.inf], tf.float32), var)])
            theirs.append(float(opt.loss_scale))
    assert trajectory_of(KerasDynamicLossScale(initial_scale, dynamic_growth_steps), steps) == theirs


@pytest.fixture(scope="module")
def mindspore():
    ms = pytest.importorskip("mindspore")
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    return ms


@pytest.mark.slow
@given(steps=st.lists(st.booleans(), min_size=1, max_size=30),
       init=st.sampled_from([2.0**24, 3.0, 1.0, 2.0**127, 1.5, 12345.678]),
       factor=st.sampled_from([2, 3, 5, 10]), window=st.integers(1, 4))
@settings(max_examples=40, deadline=None)
def test_mindspore_update_cell_and_amp_scaler(mindspore, steps, init, factor, window) -> None:
    from mindspore import Parameter, Tensor, amp, nn
    cell = nn.DynamicLossScaleUpdateCell(loss_scale_value=init, scale_factor=factor, scale_window=window)
    scale = Parameter(Tensor(np.float32(init)), name="loss_scale")
    scaler = amp.DynamicLossScaler(init, factor, window)
    cell_out, amp_out = [float(scale.asnumpy())], [float(scaler.scale_value.asnumpy())]
    for finite in steps:
        cell(scale, Tensor(not finite))
        scaler.adjust(Tensor(finite))
        cell_out.append(float(scale.asnumpy()))
        amp_out.append(float(scaler.scale_value.asnumpy()))
    assert trajectory_of(MindSporeDynamicLossScale(init, factor, window), steps) == cell_out
    assert trajectory_of(JmpDynamicLossScale(init, period=window, factor=factor, min_loss_scale=1.0), steps) == \
        amp_out
