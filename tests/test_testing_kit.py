"""The testing kit: built-in policies pass check_policy, broken ones fail readably."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from lossscale.policies import MinimumScaleError
from lossscale.simulate import MANAGERS, make_manager
from lossscale.testing import (
    PolicyError,
    binary16_arrays,
    check_policy,
    gradient_arrays,
    overflow_sequences,
)

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
