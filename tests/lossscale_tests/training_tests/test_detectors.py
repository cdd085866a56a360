"""Each framework's register window on hand-built steps: which events fall inside it, what the
check does to the register, how ranks agree; the event log; torch_npu's environment rules.

The expected decisions are worked by hand from each framework's source as the detectors'
module cites it: TF adapter reads after the gradients and clears (its window holds the
forward pass); torch_npu and MindSpore clear when the loss is scaled (after the forward
pass, the loss and logging); in INF/NaN mode torch_npu and MindSpore check the gradients.
"""

from __future__ import annotations

import numpy as np
import pytest

from lossscale import SGD, ExponentialUpdateLossScaleManager, NPULossScaleOptimizer
from lossscale.training.detectors import DETECTORS, MindSporeAllFinite, TfNpu, make_detector
from lossscale.training.phases import PhaseEvents, begin_phase
from sim import Device, Event, Flag, Group, OverflowMode, profiles

H = np.float16
FINITE, INF = [np.ones(3, H)], [np.array([1, np.inf, 1], H)]
STEP = ("forward", "loss", "log", "scale", "backward", "allreduce", "unscale")


def overflow(dev: Device) -> None:
    """One device operation that overflows binary16 (exp(20) > 65504)."""
    dev.exp(np.array([20.0], H))


def run_step(devices, detector, step: int, event_in: dict[int, str | None], grads=None) -> list[bool]:
    """One step: every phase begun on every rank; an overflowing op in ``event_in[rank]``'s
    phase; the detector's decisions at the unscale phase."""
    for phase in STEP:
        for r, dev in enumerate(devices):
            begin_phase(dev, phase, step=step if phase == "forward" else None)
            if event_in.get(r) == phase:
                overflow(dev)
    decisions = detector.check(devices, grads or [FINITE] * len(devices))
    for dev in devices:
        begin_phase(dev, "apply")
        if event_in.get("after") == "apply":
            overflow(dev)
    return decisions


def setup(name: str, mode: str = "saturation", ranks: int = 1, **kw):
    profile = "atlas-training" if mode == "saturation" else "atlas-a2"
    devices = [Device(profile, mode, record_events=True) for _ in range(ranks)]
    det = DETECTORS[name](**kw)
    det.attach(devices)
    return devices, det


# Saturation mode: for an overflow in each phase, does the detector skip the step?
SKIPS = {
    "tf-npu":               {"forward": 1, "loss": 1, "log": 1, "scale": 1, "backward": 1, "allreduce": 1},
    "torch-npu":            {"forward": 0, "loss": 0, "log": 0, "scale": 1, "backward": 1, "allreduce": 1},
    "mindspore":            {"forward": 0, "loss": 0, "log": 0, "scale": 1, "backward": 1, "allreduce": 1},
    "mindspore-all-finite": {"forward": 1, "loss": 1, "log": 1, "scale": 1, "backward": 1, "allreduce": 1},
    "isfinite":             {"forward": 0, "loss": 0, "log": 0, "scale": 0, "backward": 0, "allreduce": 0},
}


@pytest.mark.parametrize("name", list(SKIPS))
@pytest.mark.parametrize("phase", ["forward", "loss", "log", "scale", "backward", "allreduce"])
def test_saturation_windows(name, phase) -> None:
    devices, det = setup(name)
    [finite] = run_step(devices, det, 0, {0: phase})
    assert finite == (not SKIPS[name][phase])
    [finite] = run_step(devices, det, 1, {})  # a quiet step after it is finite, whatever came before
    assert finite


# An event after the check (in ``apply``: an optimizer or logging after the update) stays in
# the register: only the frameworks that clear nothing before their read see it next step.
CARRIED = {"tf-npu": True, "torch-npu": False, "mindspore": False, "mindspore-all-finite": True, "isfinite": False}


@pytest.mark.parametrize("name", list(CARRIED))
def test_events_after_the_check_reach_the_next_window(name) -> None:
    devices, det = setup(name)
    assert run_step(devices, det, 0, {"after": "apply"}) == [True]
    assert run_step(devices, det, 1, {}) == [not CARRIED[name]]


def test_what_each_check_leaves_in_the_register() -> None:
    # tf-npu and all_finite clear after reading; torch_npu clears only what it found set;
    # MindSpore's cell reads without clearing (the next step's start_overflow_check does).
    for name, left in (("tf-npu", 0), ("mindspore-all-finite", 0), ("torch-npu", 0), ("mindspore", 1),
                       ("isfinite", 1)):
        devices, det = setup(name)
        run_step(devices, det, 0, {0: "backward"})
        assert bool(devices[0].get_float_status().any()) == bool(left), name


@pytest.mark.parametrize("name", ["torch-npu", "mindspore", "mindspore-all-finite", "isfinite"])
def test_inf_nan_mode_checks_the_gradients(name) -> None:
    devices, det = setup(name, "inf_nan")
    assert run_step(devices, det, 0, {0: "backward"}, grads=[FINITE]) == [True]  # events alone do not count
    assert run_step(devices, det, 1, {}, grads=[INF]) == [False]


def test_tf_npu_reads_the_register_in_both_modes() -> None:
    # The adapter's apply_gradients has no mode branch: npu_get_float_status_v2 in either mode.
    devices, det = setup("tf-npu", "inf_nan")
    assert run_step(devices, det, 0, {0: "forward"}, grads=[FINITE]) == [False]
    assert run_step(devices, det, 1, {}, grads=[FINITE]) == [True]


@pytest.mark.parametrize("name", ["tf-npu", "torch-npu", "mindspore"])
def test_ranks_agree_when_one_rank_overflows(name) -> None:
    devices, det = setup(name, ranks=3)
    assert run_step(devices, det, 0, {1: "backward"}) == [False, False, False]
    assert run_step(devices, det, 1, {}) == [True, True, True]


def test_all_finite_is_per_rank_and_ranks_disagree() -> None:
    devices, det = setup("mindspore-all-finite", ranks=2)
    assert run_step(devices, det, 0, {1: "forward"}) == [True, False]
    devices, det = setup("tf-npu", ranks=2, distributed=False)  # is_distributed=False
    assert run_step(devices, det, 0, {0: "backward"}) == [False, True]
    devices, det = setup("mindspore-all-finite", ranks=2, distributed=True)
    assert run_step(devices, det, 0, {1: "forward"}) == [False, False]


def test_tf_npu_decides_as_npu_loss_scale_optimizer() -> None:
    """The detector and Ascend's optimizer (its own code path, through sim.Group) on the
    same two-rank step sequences."""
    rng = np.random.default_rng(5)
    plan = [{r: rng.choice([None, *STEP[:-1]]) for r in range(2)} for _ in range(30)]
    devices, det = setup("tf-npu", ranks=2)
    mine = [run_step(devices, det, t, events) for t, events in enumerate(plan)]
    devs = [Device("atlas-training") for _ in range(2)]
    Group(devs)
    opts = [NPULossScaleOptimizer(SGD(0.1), ExponentialUpdateLossScaleManager(2**10, 5), is_distributed=True,
                                  device=d) for d in devs]
    w = [np.zeros(3, np.float32) for _ in devs]
    theirs = []
    for events in plan:
        for phase in STEP[:-1]:
            for r, d in enumerate(devs):
                if events.get(r) == phase:
                    overflow(d)
        theirs.append([o.apply_gradients([(np.ones(3, np.float32), v)]) for o, v in zip(opts, w, strict=True)])
    assert mine == theirs and any(not all(s) for s in mine) and any(all(s) for s in mine)


def test_once_per_step_clear_and_unknown_phases() -> None:
    # torch_npu clears once per iteration (its _clear_overflow_flag): an event between the
    # scale and a second scale-or-later phase stays; custom phase names do not clear.
    devices, det = setup("torch-npu")
    dev = devices[0]
    begin_phase(dev, "forward", step=0)
    begin_phase(dev, "scale")
    overflow(dev)
    begin_phase(dev, "my-phase")
    begin_phase(dev, "backward")
    assert det.check(devices, [FINITE]) == [False]


def test_make_detector_defaults_and_errors() -> None:
    assert make_detector(None, OverflowMode.SATURATION).name == "tf-npu"
    assert make_detector(None, OverflowMode.INF_NAN).name == "isfinite"
    assert make_detector("status", OverflowMode.INF_NAN).name == "tf-npu"
    det = MindSporeAllFinite()
    assert make_detector(det, OverflowMode.INF_NAN) is det
    with pytest.raises(ValueError, match="unknown detector 'bogus'; valid: tf-npu, torch-npu"):
        make_detector("bogus", OverflowMode.INF_NAN)
    with pytest.raises(ValueError, match="distributed must be a bool"):
        TfNpu(distributed="yes")


# -- the event log ---------------------------------------------------------------------
def test_event_log_names_the_operation() -> None:
    counts = PhaseEvents()
    dev = Device("atlas-training", record_events=True, observers=[counts])
    x = np.array([30000, 1, 2], H)
    begin_phase(dev, "forward", step=7)
    dev.add(x, x)  # fine in float32 terms, 60000 rounds to 60000: no overflow
    with dev.label("fc1"):
        dev.mul(x, x)  # 9e8: overflows (saturates), three elements produced
    begin_phase(dev, "backward")
    with dev.label("head"), dev.label("head.inner"):
        dev.div(np.array([1.0], H), np.array([0.0], H))
    assert dev.events == [
        Event({"step": 7, "phase": "forward"}, "fc1", "mul", Flag.OVERFLOW | Flag.INEXACT, 3),
        Event({"step": 7, "phase": "backward"}, "head.inner", "div", Flag.DIVBYZERO, 1),
    ]
    assert counts.counts == {"forward": 1, "backward": 1} and dev.current_label is None
    begin_phase(dev, "forward", step=8)
    assert counts.counts == {} and len(dev.events) == 2
    dev.clear_events()
    assert dev.events == []


def test_no_log_unless_asked_but_phase_counts_kept() -> None:
    counts = PhaseEvents()
    dev = Device("atlas-training", observers=[counts])
    begin_phase(dev, "loss", step=0)
    overflow(dev)
    dev.matmul(np.full((2, 2), 60000, H), np.full((2, 2), 2, H))
    assert dev.events == [] and counts.counts == {"loss": 2}
    with pytest.raises(ValueError, match="record_events must be a bool"):
        Device(record_events="yes")
    with pytest.raises(ValueError, match="phase must be a non-empty string"):
        begin_phase(dev, "")
    with pytest.raises(ValueError, match="step must be an integer of at least 0, or None, got -1"):
        begin_phase(dev, "forward", step=-1)


def test_event_log_op_names() -> None:
    dev = Device("atlas-training", record_events=True)
    big = np.full((1, 1, 2, 2), 300, H)
    dev.conv2d(big, big)
    dev.sum(np.full(4, 60000, H))
    dev.cast(np.array([1e6], np.float32), H)
    dev.amax(np.array([0x7D00], np.uint16).view(H))  # a signaling NaN: INVALID
    assert [(e.op, e.elements) for e in dev.events] == [("conv2d", 1), ("sum", 1), ("cast", 1), ("amax", 1)]


# -- the runtime's mode from the environment ---------------------------------------------
ENV_CASES = [
    ("atlas-a2", {}, OverflowMode.INF_NAN),
    ("atlas-a2", {"INF_NAN_MODE_ENABLE": "1"}, OverflowMode.INF_NAN),
    ("atlas-a2", {"INF_NAN_MODE_FORCE_DISABLE": "1"}, OverflowMode.SATURATION),
    ("atlas-a3", {"INF_NAN_MODE_ENABLE": "0", "INF_NAN_MODE_FORCE_DISABLE": "1"}, OverflowMode.SATURATION),
    ("atlas-training", {"INF_NAN_MODE_ENABLE": "1"}, OverflowMode.SATURATION),
    ("atlas-training", {"INF_NAN_MODE_ENABLE": "0"}, OverflowMode.SATURATION),
    ("atlas-inference", {}, OverflowMode.SATURATION),
    ("atlas-350", {"INF_NAN_MODE_ENABLE": "1"}, OverflowMode.INF_NAN),
    ("atlas-a2", {"MS_ASCEND_CHECK_OVERFLOW_MODE": "SATURATION_MODE"}, OverflowMode.SATURATION),
    ("atlas-training", {"MS_ASCEND_CHECK_OVERFLOW_MODE": "SATURATION_MODE"}, OverflowMode.SATURATION),
    ("atlas-a3", {"MS_ASCEND_CHECK_OVERFLOW_MODE": "INFNAN_MODE", "INF_NAN_MODE_ENABLE": "1"}, OverflowMode.INF_NAN),
]


@pytest.mark.parametrize("profile, env, mode", ENV_CASES)
def test_overflow_mode_from_env(profile, env, mode) -> None:
    assert profiles.overflow_mode_from_env(profile, env) is mode


@pytest.mark.parametrize("profile, env, message", [
    ("atlas-a2", {"INF_NAN_MODE_ENABLE": "0"}, "INF_NAN_MODE_ENABLE shouldn't be set to 0"),
    ("atlas-a3", {"INF_NAN_MODE_ENABLE": "0", "INF_NAN_MODE_FORCE_DISABLE": "0"}, "INF_NAN_MODE_FORCE_DISABLE=1"),
    ("atlas-a2", {"INF_NAN_MODE_ENABLE": "2"}, "INF_NAN_MODE_ENABLE should be 0 or 1"),
    ("atlas-a2", {"MS_ASCEND_CHECK_OVERFLOW_MODE": "SAT"}, "must be one of SATURATION_MODE, INFNAN_MODE"),
    ("atlas-training", {"MS_ASCEND_CHECK_OVERFLOW_MODE": "INFNAN_MODE"}, "supports SATURATION"),
    ("atlas-a2", {"INF_NAN_MODE_FORCE_DISABLE": "1", "MS_ASCEND_CHECK_OVERFLOW_MODE": "INFNAN_MODE"},
     "disagree|selects"),
])
def test_overflow_mode_from_env_refuses(profile, env, message) -> None:
    with pytest.raises(ValueError, match=message):
        profiles.overflow_mode_from_env(profile, env)


def test_atlas_350_follows_the_seed_and_warns() -> None:
    with pytest.warns(UserWarning, match="torch_npu ignores .* follows that page"):
        assert profiles.overflow_mode_from_env("atlas-350", {"INF_NAN_MODE_FORCE_DISABLE": "1"}) is \
            OverflowMode.SATURATION
    # One framework's variables only; the other's are ignored.
    env = {"INF_NAN_MODE_FORCE_DISABLE": "1", "MS_ASCEND_CHECK_OVERFLOW_MODE": "INFNAN_MODE"}
    assert profiles.overflow_mode_from_env("atlas-a2", env, framework="mindspore") is OverflowMode.INF_NAN
    assert profiles.overflow_mode_from_env("atlas-a2", env, framework="torch_npu") is OverflowMode.SATURATION
    with pytest.raises(ValueError, match="unknown framework"):
        profiles.overflow_mode_from_env("atlas-a2", env, framework="tf")


def test_soc_names() -> None:
    assert profiles.for_soc("Ascend910B3").name == "atlas-a2"
    assert profiles.for_soc("Ascend910_9391").name == "atlas-a3"
    assert profiles.for_soc("Ascend910ProA").name == "atlas-training"
    assert profiles.for_soc("Ascend950PR").name == "atlas-350"
    assert profiles.for_soc("Ascend310P3").name == "atlas-inference"
    assert profiles.for_soc("Ascend310B1").name == "atlas-200i-500-a2"
    with pytest.raises(ValueError, match="unknown SoC name 'Ascend123'; known: Ascend950"):
        profiles.for_soc("Ascend123")
    # Every product but none twice.
    names = [n for p in profiles.PROFILES.values() for n in p.socs]
    assert len(names) == len(set(names)) and all(p.socs for p in profiles.PROFILES.values())


class StandInRegister:
    """A stand-in for a device in saturation mode whose float-status register reads ``values``."""

    overflow = OverflowMode.SATURATION

    def __init__(self, values: list[int]) -> None:
        self.values = np.array(values, np.int32)

    def get_float_status(self) -> np.ndarray:
        return self.values.copy()

    def clear_float_status(self) -> None:
        self.values[:] = 0


@pytest.mark.parametrize("name, finite_at_sum_1", [("mindspore", False), ("paddle-npu", True)])
def test_register_sum_thresholds_as_the_sources_state_them(name: str, finite_at_sum_1: bool) -> None:
    """MindSpore's ``get_overflow_status``: overflow iff the 8 values sum to at least 1; Paddle's
    ``check_finite_and_unscale`` NPU kernel: found_inf iff they sum to more than 1. This model's
    register never sums to exactly 1 (an event sets a flag slot and the count), so a stand-in
    register reading 1 shows the two rules apart."""
    for total, want in ((0, True), (1, finite_at_sum_1), (2, False)):
        register = StandInRegister([0, 0, 0, total, 0, 0, 0, 0])
        assert make_detector(name, OverflowMode.SATURATION).check([register], [FINITE]) == [want], total
        # Paddle clears after reading; MindSpore leaves the register to its next clear (at scale).
        assert int(register.values.sum()) == (total if name == "mindspore" else 0)


def test_deepspeed_npu_reads_as_npu_check_overflow_and_reduces_with_max() -> None:
    """Ascend's DeepSpeed adaptor: ``npu_check_overflow`` reads the flag and clears it only if set
    (any non-zero value is an overflow: a register reading 1 counts, unlike Paddle's sum above 1);
    ``has_overflow`` all-reduces the 0/1 answer with MAX, so a rank without an event skips too,
    where Paddle's ranks each decide alone."""
    quiet, loud = StandInRegister([0] * 8), StandInRegister([0, 0, 0, 1, 0, 0, 0, 0])
    assert make_detector("deepspeed-npu", OverflowMode.SATURATION).check([quiet, loud], [FINITE, FINITE]) \
        == [False, False]
    assert not loud.values.any() and not quiet.values.any()
    loud.values[3] = 1
    assert make_detector("paddle-npu", OverflowMode.SATURATION).check([quiet, loud], [FINITE, FINITE]) \
        == [True, True]  # a sum of 1 is not above 1
    loud.values[3] = 2
    assert make_detector("paddle-npu", OverflowMode.SATURATION).check([quiet, loud], [FINITE, FINITE]) \
        == [True, False]
