"""The peer policies against the frameworks themselves, where they install here.

Compared: PyTorch's ``torch.amp.GradScaler`` (CPU), driven through its public
API (a parameter whose gradient is finite or Inf, ``step`` then ``update``).
Skipped cleanly when torch is absent. TensorFlow, Keras, DeepSpeed, Megatron,
MindSpore and jmp/JAX are not installed by the project (too heavy for CI or
not installable here); their rules are checked against hand-worked
trajectories and the DESIGN.md models in tests/test_policies.py and
tests/test_policy_models.py.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lossscale.policies import TorchGradScaler

torch = pytest.importorskip("torch")


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
