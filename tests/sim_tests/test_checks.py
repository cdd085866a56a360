"""One rule for an integer setting (``sim.checks``), and every layer's settings following it:
Python's and numpy's integers accepted alike, bools and floats refused, the message naming the
setting, the valid values and the value given."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lossscale import ExponentialUpdateLossScaleManager
from lossscale.policy.frameworks import DeepSpeedLossScaler
from lossscale.training.config import RunConfig
from lossscale.training.fp8 import DelayedScaling, MXScaling
from lossscale.training.phases import begin_phase
from sim import Device, Fpu, mx
from sim.checks import NotAnInteger, integer, integer_problem, integer_range

INTEGER_TYPES = (int, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
NOT_INTEGERS = (True, False, np.bool_(True), 2.0, np.float32(2), 2.5, "2", None, [2], np.array([2]))


@given(st.integers(0, 127), st.sampled_from(INTEGER_TYPES))
def test_every_integer_type_is_accepted_as_a_python_int(value: int, kind) -> None:
    got = integer("n", kind(value), 0, 127)
    assert got == value and type(got) is int


@given(st.integers(-300, 300), st.integers(-5, 5), st.integers(0, 10))
def test_a_value_is_in_range_exactly_when_low_le_value_le_high(value: int, low: int, width: int) -> None:
    high = low + width
    inside = low <= value <= high
    assert (integer_problem("n", value, low, high) is None) == inside
    assert (integer_problem("n", np.int64(value), low, high) is None) == inside
    if not inside:
        with pytest.raises(ValueError) as err:
            integer("n", value, low, high)
        assert not isinstance(err.value, TypeError)  # the type was right: only the range is wrong


@pytest.mark.parametrize("value", NOT_INTEGERS, ids=repr)
def test_anything_else_is_not_an_integer_and_either_except_catches_it(value) -> None:
    with pytest.raises(NotAnInteger, match=r"^seed must be an integer of at least 0, got ") as err:
        integer("seed", value, 0)
    assert isinstance(err.value, TypeError) and isinstance(err.value, ValueError)


def test_the_valid_values_in_words() -> None:
    assert integer_range() == "an integer"
    assert integer_range(1) == "an integer of at least 1"
    assert integer_range(None, 9) == "an integer of at most 9"
    assert integer_range(1, 10_000_000) == "an integer from 1 to 10,000,000"
    assert integer_range(1, 62, "None (every dropped bit)") == "an integer from 1 to 62, or None (every dropped bit)"
    assert integer_problem("steps", 0, 1, 10) == "steps must be an integer from 1 to 10, got 0"


#: Every layer's integer settings: (what, a call taking the value given).
SETTINGS = [
    ("Device threads", lambda v: Device("atlas-a2", threads=v)),
    ("Device seed", lambda v: Device("atlas-a2", seed=v)),
    ("Fpu seed", lambda v: Fpu(seed=v)),
    ("Fpu random_bits", lambda v: Fpu(random_bits=v)),
    ("mx block", lambda v: mx.quantize(np.ones(32, np.float16), block=v)),
    ("conv2d stride", lambda v: Device("atlas-a2").conv2d(np.ones((1, 1, 4, 4), np.float16),
                                                          np.ones((1, 1, 2, 2), np.float16), stride=v)),
    ("conv groups", lambda v: Device("atlas-a2").conv(np.ones((1, 2, 4, 4), np.float16),
                                                      np.ones((2, 1, 2, 2), np.float16), groups=v)),
    ("manager period", lambda v: ExponentialUpdateLossScaleManager(2**10, v)),
    ("DeepSpeed scale_window", lambda v: DeepSpeedLossScaler(scale_window=v)),
    ("DelayedScaling amax_history_len", lambda v: DelayedScaling(amax_history_len=v)),
    ("MXScaling block", lambda v: MXScaling(block=v)),
    ("begin_phase step", lambda v: begin_phase(Device("atlas-a2"), "forward", step=v)),
    ("simulate steps", lambda v: RunConfig(steps=v)),
]


@pytest.mark.parametrize("what, make", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_every_layer_takes_numpy_integers_and_refuses_bools_and_floats(what: str, make) -> None:
    make(np.int64(2))
    make(np.uint8(2))
    for bad in (True, np.bool_(True), 2.0):
        with pytest.raises(ValueError, match="must be an integer"):
            make(bad)


def test_a_run_config_keeps_numpy_integers_as_python_ints() -> None:
    config = RunConfig(steps=np.int64(3), seed=np.uint16(4))
    assert type(config.steps) is int and config.steps == 3 and type(config.seed) is int
