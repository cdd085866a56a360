"""The phases of a training step on a simulated device, as context tags.

A device knows no training: it records whatever context tags its driver sets
(:meth:`sim.Device.set_tags`). The step loop and the workloads mark the step and its phases
with :func:`begin_phase`, which sets the tags ``step`` and ``phase``; every register event
then records them, and the device's observers see each phase begin (a detector clears or
reads the register there; :class:`PhaseEvents` counts the events of each phase).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sim import Device, Event
from sim.checks import integer

__all__ = ["current_phase", "current_step", "PhaseEvents"]

#: The phases of a training step, in order (names for :func:`begin_phase`; others are allowed
#: too). ``log``: computations for logging only, which feed no gradient.
PHASES = ("forward", "loss", "log", "scale", "backward", "allreduce", "unscale", "apply")


def begin_phase(device: Device, phase: str, step: int | None = None, micro_batch: int | None = None) -> None:
    """Mark the start of ``phase`` (one of :data:`PHASES`, or a name of yours) of the training
    step on ``device``; ``step`` starts a new step (or, with ``micro_batch``, that micro-batch of
    the step: gradient accumulation). Sets the device's ``phase`` (and ``step``, ``micro_batch``)
    tags in one change, so the device's observers run once, in order."""
    if not isinstance(phase, str) or not phase:
        raise ValueError(f"phase must be a non-empty string such as {', '.join(PHASES)}; got {phase!r}")
    if micro_batch is not None and step is None:
        raise ValueError("micro_batch goes with its step: begin_phase(device, phase, step=..., micro_batch=...)")
    for name, value in (("step", step), ("micro_batch", micro_batch)):
        if value is not None:
            integer(name, value, 0, alternative="None")
    if step is None:
        device.set_tags(phase=phase)
    else:  # a step without micro_batch removes an earlier step's micro-batch tag (None removes a tag)
        device.set_tags(step=int(step), phase=phase, micro_batch=None if micro_batch is None else int(micro_batch))


def current_phase(device: Device) -> str | None:
    """The phase last begun on ``device`` with :func:`begin_phase`, or None."""
    return device.tags.get("phase")


def current_step(device: Device) -> int | None:
    """The step ``device`` is in (:func:`begin_phase`), or None."""
    return device.tags.get("step")


class PhaseEvents:
    """A device observer: how many operations raised a register event in each phase of the
    current step (:attr:`counts`, by phase, None outside phases, in the order the phases first
    raised one); the counts start at zero when a step begins."""

    def __init__(self) -> None:
        self.counts: dict[str | None, int] = {}

    def __repr__(self) -> str:
        return f"PhaseEvents({self.counts})"

    def on_tags(self, device: Device, previous: Mapping[str, Any], current: Mapping[str, Any]) -> None:
        if current.get("step") != previous.get("step"):
            self.counts = {}

    def on_event(self, device: Device, event: Event) -> None:
        phase = event.tags.get("phase")
        self.counts[phase] = self.counts.get(phase, 0) + 1
