"""Checkpoints: every registered manager's ``state_dict``/``load_state_dict`` round trip
continues the same trajectory bit for bit; bad dicts are refused whole."""

from __future__ import annotations

import importlib
import inspect
import json
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lossscale import (
    SGD,
    ExponentialUpdateLossScaleManager,
    LossScaleOptimizer,
    Manager,
    NPULossScaleOptimizer,
    PolicyManager,
)
from lossscale.policy import MANAGERS, manager_class
from lossscale.policy.frameworks import JmpDynamicLossScale, MinimumScaleError, TorchGradScaler, TorchPolicy
from sim import Device, OverflowMode


def exact(state) -> list[tuple[type, float]]:
    """A state's fields with their types: equal only if bit for bit the same."""
    return [(type(v), float(v)) for v in state]


def advance(manager, steps) -> list:
    """Each state after each step (a MinimumScaleError ends the run, as it ends DeepSpeed's)."""
    seen = []
    for finite in steps:
        try:
            manager.update_loss_scale(finite)
        except MinimumScaleError:
            seen.append("MinimumScaleError")
            break
        seen.append(exact(manager.state))
    return seen


@pytest.mark.parametrize("name", list(MANAGERS))
@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.booleans(), max_size=120), k=st.integers(0, 120), through_json=st.booleans())
def test_a_round_trip_mid_run_continues_bit_for_bit(name, steps, k, through_json) -> None:
    cls, demo = MANAGERS[name]
    k = min(k, len(steps))
    whole = cls(**demo)
    expected = advance(whole, steps)
    first = cls(**demo)
    before = advance(first, steps[:k])
    if "MinimumScaleError" in before:
        return
    saved = first.state_dict()
    if through_json:
        saved = json.loads(json.dumps(saved))
    fresh = cls(**demo)
    fresh.load_state_dict(saved)
    assert exact(fresh.state) == exact(first.state) and fresh.policy == first.policy
    assert before + advance(fresh, steps[k:]) == expected


@pytest.mark.parametrize("name", list(MANAGERS))
def test_a_state_dict_is_plain_python(name) -> None:
    cls, demo = MANAGERS[name]
    d = cls(**demo).state_dict()
    assert set(d) == {"policy", "arguments", "state"}

    def plain(x) -> bool:
        if isinstance(x, dict):
            return all(isinstance(k, str) and plain(v) for k, v in x.items())
        return type(x) in (bool, int, float, str)
    assert plain(d), d


def test_the_checkpoint_restores_the_arguments_as_torch_does() -> None:
    # torch's load_state_dict restores growth_factor, backoff_factor and growth_interval too.
    source = TorchGradScaler(init_scale=8.0, growth_interval=3)
    source.update_loss_scale(True)
    target = TorchGradScaler()
    target.load_state_dict(source.state_dict())
    assert target.policy == source.policy and target.state == source.state


def test_a_policy_face_round_trips() -> None:
    m = PolicyManager(TorchPolicy(init_scale=4.0, growth_interval=2))
    for finite in (True, True, False):
        m.update_loss_scale(finite)
    fresh = PolicyManager(TorchPolicy(init_scale=4.0, growth_interval=2))
    fresh.load_state_dict(m.state_dict())
    assert fresh.state == m.state
    assert m.get_loss_scale() == 4.0


def unchanged(manager, bad: dict, match: str) -> None:
    before = (manager.policy, exact(manager.state))
    with pytest.raises(ValueError, match=match):
        manager.load_state_dict(bad)
    assert (manager.policy, exact(manager.state)) == before


def test_bad_dicts_are_refused_whole() -> None:
    m = ExponentialUpdateLossScaleManager(2**10, 5)
    m.update_loss_scale(False)
    good = ExponentialUpdateLossScaleManager(2**20, 7).state_dict()
    unchanged(m, JmpDynamicLossScale(2.0**15).state_dict(),
              r"of policy 'JmpPolicy', this face runs ExponentialUpdate")
    unchanged(m, {k: v for k, v in good.items() if k != "state"}, r"missing state; valid keys: policy, arguments")
    unchanged(m, {**good, "extra": 1}, r"unknown 'extra'; valid keys")
    unchanged(m, {**good, "state": {**good["state"], "tracker": 0}}, r"state_dict state: unknown 'tracker'")
    unchanged(m, {**good, "state": {"scale": 1.0}}, r"state_dict state: missing good, bad")
    unchanged(m, {**good, "arguments": {"init_loss_scale": 8}}, r"state_dict arguments: missing incr_every_n_steps")
    unchanged(m, {**good, "arguments": {**good["arguments"], "decr_ratio": 2}},
              r"state_dict arguments: decr_ratio must be between 0 and 1")
    unchanged(m, {**good, "state": {**good["state"], "good": 1.5}}, r"state good: must be an integer")
    unchanged(m, {**good, "state": {**good["state"], "scale": 0.1}}, r"state scale: 0.1 is not a float32 value")
    unchanged(m, {**good, "state": {**good["state"], "bad": True}}, r"state bad: must be an integer")
    unchanged(m, [], r"state_dict must be a dict")
    assert m.get_loss_scale() == 2.0**10 and (m.state.good, m.state.bad) == (0, 1)


def test_the_optimizers_round_trip_their_manager() -> None:
    dev = Device(overflow=OverflowMode.INF_NAN)
    var = np.zeros(2, np.float32)
    opt = NPULossScaleOptimizer(SGD(0.1), ExponentialUpdateLossScaleManager(2**10, 2), device=dev)
    for g in (np.inf, 1.0, np.inf, np.inf):
        opt.apply_gradients([(np.full(2, g, np.float32), var)])
    saved = opt.state_dict()
    assert set(saved) == {"loss_scale_manager"}
    other = LossScaleOptimizer(SGD(0.1), ExponentialUpdateLossScaleManager(2**10, 2))
    other.load_state_dict(saved)
    assert other.get_loss_scale() == opt.get_loss_scale() and other.loss_scale_manager.state == \
        opt.loss_scale_manager.state
    with pytest.raises(ValueError, match="valid keys: loss_scale_manager"):
        other.load_state_dict({"manager": saved["loss_scale_manager"]})


@pytest.mark.parametrize("name", list(MANAGERS))
def test_every_face_is_made_from_its_policy(name) -> None:
    cls, demo = MANAGERS[name]
    assert inspect.signature(cls) == inspect.signature(cls.policy_type) and cls.__doc__.strip()
    assert getattr(importlib.import_module(cls.__module__), cls.__qualname__) is cls
    m = cls(**demo)
    m.update_loss_scale(False)
    copy = pickle.loads(pickle.dumps(m))
    assert repr(copy) == repr(m) and type(copy) is cls


def test_a_face_takes_a_framework_s_own_method_names() -> None:
    Scaler = manager_class(TorchPolicy, "Scaler", "A scaler with torch's names.", get_scale=Manager.get_loss_scale)
    assert Scaler(init_scale=8.0).get_scale() == 8.0 and Scaler.__module__ == __name__
    with pytest.raises(TypeError, match="manager_class takes a Policy subclass"):
        manager_class(dict, "Bad", "")
