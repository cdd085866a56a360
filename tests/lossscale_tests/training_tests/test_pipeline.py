"""Pipeline parallelism (``pipeline_stages``): Megatron's 1F1B order per stage, and what each
detector loses when one stage's micro-batch overflows, against orders and windows worked out by
hand from the cited code (Megatron-LM's ``forward_backward_pipelining_without_interleaving``;
PaddlePaddle/Paddle pull 35144 for Paddle's clear at every backward; Megatron's optimizer for a
read after the last backward, all-reduced over the stages)."""

from __future__ import annotations

import numpy as np
import pytest

from lossscale import simulate
from lossscale.training.optimizers import SGD
from lossscale.training.phases import begin_phase
from lossscale.training.pipeline import one_f_one_b

F32, H = np.float32, np.float16
P, K = 2, 4


def test_one_f_one_b_orders_by_hand() -> None:
    # warm-up p - s - 1 forwards, then F(j + warm-up) B(j) pairs, then the cool-down backwards
    assert one_f_one_b(2, 0, 4) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    assert one_f_one_b(2, 1, 4) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    assert one_f_one_b(4, 0, 4) == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("B", 1), ("B", 2), ("B", 3)]
    assert one_f_one_b(4, 2, 4) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]


class Staged:
    """One parameter, quiet gradients; each example is (micro-batch overflows: 1/0). The
    overflowing micro-batch raises one binary16 overflow (60000 * 2) on stage ``STAGE`` in phase
    ``PHASE`` of its forward or backward."""

    name, has_accuracy, marks_phases = "staged", False, True

    def __init__(self, stage: int, phase: str) -> None:
        self.stage, self.phase = stage, phase

    def init_params(self):
        return [np.zeros(1, F32)]

    def optimizer(self):
        return SGD(0.01)

    def batches(self, steps):
        return [np.array([[0.0], [1.0], [0.0], [0.0]])] * steps  # micro-batch 1 overflows

    def shards(self, batch, ranks):
        return [(part, len(part) / len(batch)) for part in np.array_split(batch, ranks)]

    def forward_backward(self, dev, params, scale, part, share=1.0):
        for phase in ("forward", "loss", "scale", "backward"):
            if phase != "forward":
                begin_phase(dev, phase)
            if phase == self.phase and part[:, 0].sum() > 0:
                dev.set_tags(stage=self.stage)
                dev.mul(H(60000), H(2))
                dev.set_tags(stage=None)
        g = dev.cast(dev.mul(np.array([2.0 ** -8], F32), F32(scale)), H)
        return 0.0, [g]

    def grads32(self, params, part, share=1.0):
        return 0.0, [np.array([2.0 ** -8], F32)]

    def evaluate(self, params):
        return {"loss": 0.0, "accuracy": float("nan")}


def _observed(detector: str, stage: int, phase: str, stages: int = P) -> str:
    run = simulate(workload=Staged(stage, phase), profile="atlas-training", manager="fixed", detector=detector,
                   steps=1, micro_batches=K, pipeline_stages=stages, record_events=False)
    row = run.records[0]
    assert row["overflow"]
    return "undetected" if row["undetected_overflow"] else "ok" if row["applied"] else "skip"


@pytest.mark.parametrize(("detector", "want"), [
    # read after the last backward, all-reduced over the stages: stage 0's event is still there
    ("megatron-npu", "skip"), ("tf-npu", "skip"),
    # cleared at every backward on every stage: stage 0 clears again at B2 and B3, after B1's event
    ("paddle-npu", "undetected"),
    # cleared once, at stage 0's first backward (B0), before B1: seen
    ("torch-npu", "skip"),
])
def test_stage_zero_backward_overflow_of_micro_batch_one(detector: str, want: str) -> None:
    assert _observed(detector, 0, "backward") == want


def test_a_warm_up_forward_lands_before_the_once_per_step_clear() -> None:
    # stage 0 runs F0 F1 B0: micro-batch 1's forward event comes before torch-npu's one clear (at
    # B0's scale), which erases it; without a pipeline the clear comes in micro-batch 0, before it
    assert _observed("torch-npu", 0, "forward") == "undetected"
    assert _observed("torch-npu", 0, "forward", stages=1) == "skip"
    # stage 1 runs F0 B0 F1: its F1 comes after the clear
    assert _observed("torch-npu", 1, "forward") == "skip"
    # megatron-npu never clears before its read: every forward is in its window
    assert _observed("megatron-npu", 0, "forward") == "skip"


def test_pipeline_stages_needs_as_many_micro_batches() -> None:
    with pytest.raises(ValueError, match=r"pipeline_stages=3 needs micro_batches >= 3"):
        simulate(workload=Staged(0, "backward"), steps=1, micro_batches=2, pipeline_stages=3)
    with pytest.raises(ValueError, match="pipeline_stages must be an integer from 1 to 4,096"):
        simulate(steps=1, pipeline_stages=0)


def test_a_stage_tag_beyond_the_stages_is_refused() -> None:
    with pytest.raises(ValueError, match=r"stage tag must be a stage 0\.\.1, got 2"):
        simulate(workload=Staged(2, "backward"), profile="atlas-training", manager="fixed", steps=1,
                 micro_batches=K, pipeline_stages=P, record_events=False)
