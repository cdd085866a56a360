"""Pipeline parallelism (``pipeline_stages`` p): each rank's model split over p stage devices,
run in the non-interleaved 1F1B order, so that each stage's float-status register sees its
micro-batches' events when that schedule runs them.

The order is Megatron-LM's ``forward_backward_pipelining_without_interleaving``
(``megatron/core/pipeline_parallel/schedules.py``): stage s of p runs
``min(p - s - 1, m)`` warm-up forwards, then one forward and one backward at a time for the
remaining micro-batches (forward j + warm-up, then backward j), then the cool-down backwards.

The model of a stage (a workload knows no stages):

- the workload runs each micro-batch's forward and backward on the rank's device as without a
  pipeline (the gradients, the losses and the events are the same); then every event of the
  step is replayed (``sim.Device.raise_event``) on the stage device it belongs to, in that
  stage's 1F1B order, each micro-batch's phases begun on the stage device as they would be there,
  so that the detectors, which observe the stage devices, clear and read each stage's register
  where their framework does;
- an event belongs to the stage named by the device's ``stage`` tag when it was raised
  (``dev.set_tags(stage=s)`` in the workload; the step loop removes the tag at each
  micro-batch's start); an event without one belongs to stage 0. A workload that never names a
  stage runs everything on stage 0, whose register then sees every event in stage 0's order;
- a micro-batch's forward holds its ``forward``, ``loss`` and ``log`` phases; its backward its
  ``scale`` and ``backward`` phases (where Megatron scales the loss, at the start of
  ``backward_step``, and where Paddle's pipeline inserted its clear, at the start of the
  backward: PaddlePaddle/Paddle pull 35144) and an unmarked workload's whole call; the
  gradient accumulation belongs to the backward of the micro-batch it adds;
- the allreduce after the last backward runs on each stage; its events on the stage the tag last
  named (stage 0 where the workload names none);
- a rank's stages decide together: a rank applies its step only if every stage's check finds
  it finite, as Megatron all-reduces found_inf (MAX) over the model-parallel group, which holds
  the pipeline stages (``MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan``,
  ``megatron/core/optimizer/optimizer.py``; MindSpeed keeps it:
  ``mindspeed/core/optimizer/low_precision/quant_optimizer_hooks.py``,
  ``unscale_main_grads_and_check_for_nan``) and Paddle's hybrid-parallel optimizer all-reduces
  found_inf with ``c_allreduce_max`` over its rings (``FP16Utils.sync_amp_check_nan_inf``,
  ``python/paddle/distributed/fleet/meta_optimizers/sharding/fp16_helper.py``; that the pipeline
  ring is among them is assumed, not checked). Stages that disagree would update part of the
  model, which the simulator, training one model per rank, does not model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sim import Device, Event
from sim.checks import integer_problem

from .detectors import UNMARKED
from .errors import SettingValueError
from .phases import begin_phase

__all__ = ["one_f_one_b", "FORWARD", "BACKWARD", "Pipeline", "check_stages"]

#: The phases of a micro-batch's forward and of its backward on a stage, in order.
FORWARD = ("forward", "loss", "log")
BACKWARD = ("scale", UNMARKED, "backward")


def one_f_one_b(stages: int, stage: int, micro_batches: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s order of passes, ``("F", j)`` and ``("B", j)``, in Megatron's
    non-interleaved 1F1B schedule (the module gives the source)."""
    check_stages(stages, micro_batches)
    if not 0 <= stage < stages:
        raise ValueError(f"stage must be in 0..{stages - 1}, got {stage!r}")
    warm = min(stages - stage - 1, micro_batches)
    order = [("F", j) for j in range(warm)]
    for i in range(micro_batches - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", j) for j in range(micro_batches - warm, micro_batches)]


def check_stages(stages: Any, micro_batches: Any) -> None:
    """ValueError unless ``pipeline_stages`` is at most ``micro_batches`` (1F1B keeps every stage
    busy only with at least one micro-batch per stage; Megatron's interleaved schedule requires
    it, and so does this model)."""
    if isinstance(stages, int) and isinstance(micro_batches, int) and stages > micro_batches:
        raise ValueError(f"pipeline_stages={stages} needs micro_batches >= {stages} (one micro-batch per stage "
                         f"at least), got micro_batches={micro_batches}")


class _Collect:
    """An observer of a rank's device: the events of the step in progress."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def on_event(self, device: Device, event: Event) -> None:
        self.events.append(event)


class Pipeline:
    """The stage devices of every rank (``stages[r][s]``) and the replay of a step's events onto
    them (the module says how)."""

    def __init__(self, devices: Sequence[Device], stages: int, make: Any) -> None:
        self.p = stages
        self.stages = [[make(r, s) for s in range(stages)] for r in range(len(devices))]
        self._collect = [_Collect() for _ in devices]
        for dev, c in zip(devices, self._collect, strict=True):
            dev.add_observer(c)

    @property
    def devices(self) -> list[Device]:
        """Every stage device, rank by rank."""
        return [d for rank in self.stages for d in rank]

    def replay(self, t: int, micro_batches: int) -> None:
        """Raise step ``t``'s events on the stage devices in each stage's 1F1B order, then the
        allreduce's; the collected events are then dropped."""
        for stages, collect in zip(self.stages, self._collect, strict=True):
            by: dict[tuple[Any, Any, int], list[Event]] = {}
            for e in collect.events:
                by.setdefault((e.tags.get("micro_batch"), e.tags.get("phase"), self._stage(e)), []).append(e)
            for s, dev in enumerate(stages):
                for kind, j in one_f_one_b(self.p, s, micro_batches):
                    for n, phase in enumerate(FORWARD if kind == "F" else BACKWARD):
                        begin_phase(dev, phase, **({"step": t, "micro_batch": j} if n == 0 else {}))
                        self._raise(dev, by.get((j, phase, s), []))
                begin_phase(dev, "allreduce")
                self._raise(dev, by.get((None, "allreduce", s), []) + by.get((micro_batches - 1, "allreduce", s), []))
            collect.events = []

    def _stage(self, e: Event) -> int:
        if e.tags.get("phase") not in (*FORWARD, *BACKWARD, "allreduce"):
            raise SettingValueError(f"a pipeline places the phases {', '.join((*FORWARD, *BACKWARD))} on its stages; "
                                    f"an event came in phase {e.tags.get('phase')!r} (op {e.op}, label {e.label})")
        s = e.tags.get("stage", 0)
        if integer_problem("stage", s, 0, self.p - 1):
            raise SettingValueError(f"an event's stage tag must be a stage 0..{self.p - 1}, got {s!r} (op {e.op}, "
                                    f"label {e.label})")
        return s

    @staticmethod
    def _raise(dev: Device, events: list[Event]) -> None:
        for e in events:
            dev.raise_event(e.flags, e.op, e.elements, e.label)
