"""Gradient accumulation (``micro_batches``): what each detector skips and misses when one
micro-batch of a step overflows, against windows worked out by hand from the frameworks' code
(see ``lossscale.training.detectors``), and ``micro_batches=1`` as today's runs, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from lossscale import simulate
from lossscale.training.optimizers import SGD
from lossscale.training.phases import begin_phase

F32, H = np.float32, np.float16
SCALE = 2.0 ** 10  # the "fixed" manager's demo scale
K = 4  # micro-batches per step, one example each
# LOUD * SCALE = 2**17 overflows binary16 (saturating to 65504); QUIET * SCALE = 4 does not, nor does
# 65504 + 4 (below half of binary16's last spacing, 32): adding a later quiet micro-batch to a saturated
# sum raises nothing, so what a later clear erases stays erased (with QUIET * SCALE >= 16 the sum would
# overflow again in every later micro-batch's accumulation, and paddle-npu would see that)
QUIET, LOUD = 2.0 ** -8, 2.0 ** 7
LOG_LOUD = 40000.0  # doubled in binary16 in the log phase: overflows


class Spikes:
    """One parameter; each example is (gradient, logged value): its backward casts
    ``gradient * S`` to binary16 (an overflow where it exceeds 65504) and its log phase doubles
    the logged value in binary16. Step ``t``'s batch is given, so which micro-batch overflows,
    and in which phase, is chosen per step."""

    name, has_accuracy, marks_phases = "spikes", False, True

    def __init__(self, steps: list[np.ndarray]) -> None:
        self.steps = steps

    def init_params(self):
        return [np.zeros(1, F32)]

    def optimizer(self):
        return SGD(0.01)

    def batches(self, steps):
        return self.steps[:steps]

    def shards(self, batch, ranks):
        return [(part, len(part) / len(batch)) for part in np.array_split(batch, ranks)]

    def forward_backward(self, dev, params, scale, part, share=1.0):
        begin_phase(dev, "loss")
        begin_phase(dev, "log")
        dev.mul(part[:, 1].astype(H), H(2))
        begin_phase(dev, "scale")
        begin_phase(dev, "backward")
        g = dev.cast(dev.mul(np.array([part[:, 0].sum()], F32), F32(scale)), H)
        return 0.0, [g]

    def grads32(self, params, part, share=1.0):
        return 0.0, [np.array([part[:, 0].sum()], F32)]

    def evaluate(self, params):
        return {"loss": 0.0, "accuracy": float("nan")}


def _batch(where: str | None, j: int) -> np.ndarray:
    """K quiet examples; micro-batch ``j`` overflows in ``where`` ("backward" or "log"), or none."""
    rows = np.array([[QUIET, 1.0]] * K)
    if where == "backward":
        rows[j, 0] = LOUD
    elif where == "log":
        rows[j, 1] = LOG_LOUD
    return rows


CASES = [("backward", j) for j in range(K)] + [("log", j) for j in range(K)] + [(None, 0)]


def _run(detector: str, micro_batches: int = K) -> list[dict]:
    wl = Spikes([_batch(w, j) for w, j in CASES])
    return simulate(workload=wl, profile="atlas-training", manager="fixed", detector=detector, steps=len(CASES),
                    micro_batches=micro_batches, record_events=False).records


def _expected(detector: str, where: str | None, j: int) -> str:
    """By hand, from each framework's clear and read points (detectors.py's sources): ``skip``,
    ``undetected`` (applied over an overflow that feeds the update), ``false-positive`` (skipped
    over a logging overflow only) or ``ok``."""
    if where is None:
        return "ok"
    if detector == "isfinite":  # saturated gradients are finite: nothing is ever seen
        return "undetected" if where == "backward" else "ok"
    if detector in ("paddle-npu", "deepspeed-npu"):  # cleared before every micro-batch's scale: only the last
        # backward counts (Paddle: alloc/clear_float_status after the loss; DeepSpeed's adaptor:
        # clear_npu_overflow_flag() in LossScalerBase.backward, before loss * scale); a logging
        # overflow comes before its micro-batch's clear
        if where == "backward":
            return "skip" if j == K - 1 else "undetected"
        return "ok"
    if where == "backward":  # one window over every micro-batch's backward
        return "skip"
    # a logging overflow: tf-npu and all_finite read-then-clear (every forward is in the window);
    # torch-npu and mindspore clear once, at the first micro-batch's scale (after its log)
    if detector in ("torch-npu", "mindspore") and j == 0:
        return "ok"
    return "false-positive"


def _observed(row: dict) -> str:
    if row["undetected_overflow"]:
        return "undetected"
    if row["false_positive"]:
        return "false-positive"
    return "ok" if row["applied"] else "skip"


@pytest.mark.parametrize("detector", ["tf-npu", "torch-npu", "mindspore", "mindspore-all-finite", "paddle-npu",
                                      "deepspeed-npu", "isfinite"])
def test_each_detector_loses_what_its_window_leaves_out(detector: str) -> None:
    rows = _run(detector)
    got = [(w, j, _observed(r)) for (w, j), r in zip(CASES, rows, strict=True)]
    want = [(w, j, _expected(detector, w, j)) for w, j in CASES]
    assert got == want
    assert all(r["overflow"] == (w is not None) for (w, _), r in zip(CASES, rows, strict=True))


def test_accumulated_gradient_is_the_binary16_sum_of_the_micro_batches() -> None:
    rows = np.array([[QUIET * (i + 1), 1.0] for i in range(K)])
    run = simulate(workload=Spikes([rows]), profile="atlas-training", manager="fixed", steps=1,
                   micro_batches=K, record_events=False)
    parts = [H(F32(QUIET * (i + 1)) * F32(SCALE)) for i in range(K)]
    total = parts[0]
    for p in parts[1:]:
        total = H(total + p)  # binary16 additions in micro-batch order, each exact here or rounded once
    assert run.records[0]["grad_max"] == float(total) / SCALE


def test_micro_batches_must_leave_every_micro_batch_data() -> None:
    wl = Spikes([_batch(None, 0)])
    with pytest.raises(ValueError, match=r"micro_batches=5 leaves 1 micro-batch\(es\) without data"):
        simulate(workload=wl, profile="atlas-training", manager="fixed", steps=1, micro_batches=5)
    with pytest.raises(ValueError, match="micro_batches must be an integer from 1 to 4,096, got 0"):
        simulate(workload=wl, steps=1, micro_batches=0)


