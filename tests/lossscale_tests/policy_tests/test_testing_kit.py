"""The testing kit: built-in policies pass check_policy, broken ones fail readably."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings

from lossscale.policy import MANAGERS
from lossscale.policy.frameworks import MinimumScaleError
from lossscale.testing import (
    PolicyError,
    binary16_arrays,
    check_policy,
    gradient_arrays,
    overflow_sequences,
)
from lossscale.training.config import make_manager

from groups import representatives


@pytest.mark.parametrize("name", representatives(MANAGERS, lambda n: n == "exponential"))  # the rest: -m slow
def test_builtin_policies_pass(name: str) -> None:
    args = {"deepspeed": {"init_scale": 2.0**16}}.get(name, {})
    check_policy(lambda: make_manager(name, args), growth_within=200, raises=(MinimumScaleError,), max_examples=60)


class Halving:
    """A minimal user policy: halve on overflow (not below 1), double after 10 good steps."""

    def __init__(self, grow_on_overflow=False, floor=1.0, cap=True, shared=None, factor=2.0):
        self.scale, self.good, self.factor = 1024.0, 0, factor
        self.grow_on_overflow, self.floor, self.cap, self.shared = grow_on_overflow, floor, cap, shared

    def get_loss_scale(self):
        return self.scale

    def update_loss_scale(self, finite):
        if self.shared is not None:
            self.shared[0] += 1
        if not finite:
            self.scale = self.scale * 2 if self.grow_on_overflow else max(self.scale / self.factor, self.floor)
            self.good = 0
            return
        self.good += 1
        if self.good >= 10 + (self.shared[0] % 3 if self.shared is not None else 0):
            self.good = 0
            with np.errstate(over="ignore"):
                grown = float(np.float32(self.scale * self.factor)) if not self.cap else min(self.scale * 2, 2.0**100)
            self.scale = grown


def test_a_well_behaved_user_policy_passes() -> None:
    check_policy(lambda: Halving(), floor=1.0, growth_within=50, max_examples=60)


@pytest.mark.parametrize("make, floor, capped, message", [
    (lambda: Halving(grow_on_overflow=True), 1.0, False, "an overflow at step"),
    (lambda: Halving(floor=0.0, factor=2.0**40), None, True, "the scale reached 0.0"),
    (lambda: Halving(cap=False, factor=2.0**40), 1.0, True, "(not finite)"),
    (lambda shared=[0]: Halving(shared=shared), 1.0, True, "hidden shared state"),
])
def test_broken_policies_fail_with_a_readable_counterexample(make, floor, capped, message) -> None:
    with pytest.raises(PolicyError) as info:
        check_policy(make, floor=floor, capped=capped, growth_within=50, max_examples=200)
    text = str(info.value)
    assert message in text and "Halving" in text and "steps (. finite, X overflow):" in text


@given(seq=overflow_sequences(50), arr=binary16_arrays(), grads=gradient_arrays(16, center=-20, spread=4))
@settings(max_examples=50, deadline=None)
def test_strategies_produce_what_they_say(seq, arr, grads) -> None:
    assert len(seq) <= 50 and all(isinstance(s, bool) for s in seq)
    assert arr.dtype == np.float16
    assert grads.dtype == np.float32 and grads.shape == (16,)
    nz = np.abs(grads[grads != 0])
    assert ((nz >= 2.0**-25) & (nz < 2.0**-15)).all()


class Deaf(Halving):
    """Never lowers the scale on overflow (it only resets its counter): passed before the
    backoff property existed."""

    def update_loss_scale(self, finite):
        if finite:
            super().update_loss_scale(True)
        else:
            self.good = 0


class Doubling(Halving):
    """Doubles on overflow, and never grows otherwise."""

    def update_loss_scale(self, finite):
        if not finite:
            self.scale *= 2


def test_a_policy_that_never_backs_off_fails() -> None:
    with pytest.raises(PolicyError, match=r"16 overflows in a row after the sequence never lowered the scale from"):
        check_policy(Deaf, floor=1.0, growth_within=50, max_examples=60)
    check_policy(lambda: Halving(), floor=1.0, growth_within=50, max_examples=30)  # at its floor, it may stay


def test_the_property_that_failed_is_the_one_reported() -> None:
    # Doubling also never grows on finite runs; the shrinker would report that (the empty
    # sequence), but the overflow that raised the scale is checked, and reported, first.
    with pytest.raises(PolicyError, match=r"an overflow at step \d+ raised the scale from 1024.0 to 2048.0") as info:
        check_policy(Doubling, floor=1.0, capped=False, growth_within=50, max_examples=60)
    assert "never grew" not in str(info.value)


@pytest.mark.parametrize("make, message", [
    (object, "object lacks get_loss_scale() and update_loss_scale()"),
    (lambda: type("OnlyGet", (), {"get_loss_scale": lambda self: 1.0})(), "OnlyGet lacks update_loss_scale()"),
    (lambda x: x, "could not make a policy by calling '<lambda>'()"),
    (3, "takes a class or a function"),
])
def test_not_a_policy_is_a_policy_error(make, message) -> None:
    with pytest.raises(PolicyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_policy(make)


class ClassShared:
    """Keeps its scale in a class attribute: every instance is the same scaler."""

    scale, good = 2.0**16, 0

    def get_loss_scale(self):
        return type(self).scale

    def update_loss_scale(self, finite):
        cls = type(self)
        if not finite:
            cls.scale, cls.good = max(cls.scale / 2, 1.0), 0
        else:
            cls.good += 1
            if cls.good % 5 == 0:
                cls.scale *= 2


class DoubleOnOverflow(Halving):
    """Doubles on overflow, capped at nothing: it also leaves binary32's range after enough overflows."""

    def update_loss_scale(self, finite):
        if not finite:
            self.scale *= 2
        else:
            super().update_loss_scale(True)


def test_shared_state_is_named_as_such_not_as_a_huge_scale() -> None:
    with pytest.raises(PolicyError) as info:
        check_policy(ClassShared, floor=1.0, max_examples=30)
    text = str(info.value)
    assert text.startswith("ClassShared: two instances share state: updating one instance changed another's scale "
                           "from 65536.0 to 32768.0 (after 1 update)"), text
    assert "not finite" not in text and "\n" not in text


def test_an_overflow_that_raises_the_scale_is_named_with_a_short_example() -> None:
    # capped (the default): the scale also leaves binary32's range, after 112 overflows; the
    # overflow that raised it is the more specific property, and shrinks to a step or two
    with pytest.raises(PolicyError) as info:
        check_policy(DoubleOnOverflow, floor=1.0, growth_within=50, max_examples=100)
    text = str(info.value)
    assert "DoubleOnOverflow: an overflow at step" in text and "raised the scale from" in text
    assert "not finite" not in text
    steps = text.split("steps (. finite, X overflow): ")[1].split("\n")[0]
    assert set(steps) <= {".", "X"} and "X" in steps and len(steps) <= 4, steps


def test_an_exception_by_design_is_explained_not_leaked() -> None:
    with pytest.raises(PolicyError) as info:
        check_policy(lambda: make_manager("deepspeed"), growth_within=200, max_examples=30)
    text = str(info.value)
    assert "update_loss_scale raised MinimumScaleError at step" in text
    assert "pass raises=(MinimumScaleError,)" in text
    check_policy(lambda: make_manager("deepspeed"), growth_within=200, raises=(MinimumScaleError,), max_examples=10)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_examples": 0}, "max_examples must be an integer of at least 1, got 0"),
    ({"max_steps": -1}, "max_steps must be an integer of at least 1, got -1"),
    ({"growth_within": 2.5}, "growth_within must be an integer of at least 1, got 2.5"),
    ({"raises": MinimumScaleError}, "raises must be a tuple of exception classes"),
])
def test_bad_settings_are_refused_before_hypothesis_runs(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        check_policy(lambda: Halving(), floor=1.0, **kwargs)


class NanOnOverflow(Halving):
    """Its overflow rule computes 0 * inf: the scale becomes NaN at the first overflow."""

    def update_loss_scale(self, finite):
        if not finite:
            self.scale = self.scale * 0.0 * float("inf")
        else:
            super().update_loss_scale(True)


class CappedAt24(Halving):
    """A correct policy capped at 2**24, apex's default max_loss_scale."""

    def update_loss_scale(self, finite):
        super().update_loss_scale(finite)
        self.scale = min(self.scale, 2.0**24)


class Coin(Halving):
    """Grows when a coin from the global generator says so: independent instances, not deterministic."""

    def update_loss_scale(self, finite):
        if finite and random.random() < 0.5:
            self.scale *= 2
        elif not finite:
            self.scale = max(self.scale / 2, 1.0)


class CoinAtBirth(Halving):
    """Starts at a random scale."""

    def __init__(self):
        super().__init__()
        self.scale = float(2 ** np.random.randint(4, 20))  # noqa: NPY002 - the global generator, on purpose


class Text(Halving):
    def get_loss_scale(self):
        return str(int(self.scale))


def test_each_failure_names_its_own_property() -> None:
    """Issue 31, item 9: a NaN scale is NaN (not shared state, NaN != NaN), a policy capped at
    2**24 passes with cap= and says so when it is missing, a coin-tossing policy is named not
    deterministic (not shared state), and a string scale is refused, not coerced."""
    with pytest.raises(PolicyError) as info:
        check_policy(NanOnOverflow, floor=1.0, growth_within=50, max_examples=60)
    assert "the scale became NaN at step" in str(info.value) and "share" not in str(info.value)
    with pytest.raises(PolicyError, match=r"never grew the scale from 16777216.0; if 16777216.0 is the policy's "
                                          r"ceiling, give cap=16777216.0"):
        check_policy(CappedAt24, floor=1.0, growth_within=50, max_examples=60)
    check_policy(CappedAt24, floor=1.0, cap=2.0**24, growth_within=50, max_examples=60)
    with pytest.raises(PolicyError, match=r"rose above the cap 65536.0"):
        check_policy(CappedAt24, floor=1.0, cap=2.0**16, growth_within=50, max_examples=60)
    check_policy(lambda: make_manager("apex", {"max_loss_scale": 2.0**24, "scale_window": 20}), growth_within=100,
                 max_examples=30)  # its declared max_loss_scale is the cap
    with pytest.raises(PolicyError) as info:
        check_policy(Coin, floor=1.0, growth_within=50, max_examples=60)
    assert "Coin: not deterministic" in str(info.value) and "share state" not in str(info.value)
    with pytest.raises(PolicyError, match=r"^CoinAtBirth: not deterministic: fed the same steps"):
        check_policy(CoinAtBirth, floor=1.0)
    with pytest.raises(PolicyError, match=r"^Text: get_loss_scale\(\) returned '1024' \(a str\) before any update: "
                                          r"a scale is a number"):
        check_policy(Text, floor=1.0)
    check_policy(lambda: type("F32", (Halving,), {"get_loss_scale": lambda self: np.float32(self.scale)})(),
                 floor=1.0, growth_within=50, max_examples=20)  # numpy scalars are numbers


@pytest.mark.parametrize("kwargs, message", [
    ({"floor": -1}, "floor must be None or a finite number at least 0, got -1"),
    ({"floor": float("nan")}, "floor must be None or a number at least 0, got nan"),
    ({"floor": "1"}, "floor must be None or a number at least 0, got '1'"),
    ({"cap": 0}, "cap must be None or a number above 0 .inf: none., got 0"),
    ({"capped": "no"}, "capped must be None .what the policy declares. or a bool, got 'no'"),
    ({"grows": 1}, "grows must be None .what the policy declares. or a bool, got 1"),
])
def test_bad_bounds_are_refused_up_front(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        check_policy(lambda: Halving(), **kwargs)
