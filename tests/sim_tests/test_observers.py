"""The device's generic means (context tags, observers, substituting an operation, joining a
group) and lossscale's phases built on them; the hardware model knows no training."""

from __future__ import annotations

import ast

import numpy as np
import pytest
from paths import ROOT  # tests/ is on the path (conftest.py)

import lossscale
from lossscale.training.phases import PHASES, PhaseEvents, begin_phase, current_phase, current_step
from sim import Device, Event, Flag, Group

H = np.float16


def overflow(dev: Device) -> None:
    dev.exp(np.array([20.0], H))


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def on_event(self, device: Device, event: Event) -> None:
        self.seen.append(("event", device, event))

    def on_tags(self, device: Device, previous, current) -> None:
        self.seen.append(("tags", device, dict(previous), dict(current)))


def test_tags_merge_remove_and_are_recorded_with_events() -> None:
    dev = Device("atlas-training", record_events=True)
    assert dict(dev.tags) == {}
    dev.set_tags(step=3, phase="forward")
    with pytest.raises(TypeError):
        dev.tags["step"] = 4  # a read-only view
    overflow(dev)
    dev.set_tags(phase="backward", run="a")
    overflow(dev)
    dev.set_tags(run=None)
    assert dict(dev.tags) == {"step": 3, "phase": "backward"}
    tags = [dict(e.tags) for e in dev.events]
    assert tags == [{"step": 3, "phase": "forward"}, {"step": 3, "phase": "backward", "run": "a"}]
    assert dev.events[0] == Event({"step": 3, "phase": "forward"}, None, "exp", Flag.OVERFLOW | Flag.INEXACT, 1)


def test_observers_by_constructor_and_method_in_order() -> None:
    first, second = Recorder(), Recorder()
    dev = Device("atlas-training", observers=[first])
    dev.add_observer(second)
    dev.add_observer(second)  # once only
    assert dev.observers == (first, second)
    dev.set_tags(phase="loss")
    overflow(dev)
    dev.add(np.ones(2, H), np.ones(2, H))  # no register event: nobody is told
    assert [s[0] for s in first.seen] == ["tags", "event"] and first.seen == second.seen
    assert first.seen[0][1:] == (dev, {}, {"phase": "loss"})
    assert first.seen[1][2].op == "exp" and dict(first.seen[1][2].tags) == {"phase": "loss"}
    dev.remove_observer(first)
    overflow(dev)
    assert len(first.seen) == 2 and len(second.seen) == 3
    with pytest.raises(ValueError, match="is not an observer"):
        dev.remove_observer(first)
    with pytest.raises(ValueError, match="needs an on_event or on_tags method"):
        dev.add_observer(object())


def test_an_observer_may_watch_only_tags() -> None:
    class Clears:
        def on_tags(self, device, previous, current):
            if current.get("phase") == "scale":
                device.clear_float_status()

    dev = Device("atlas-training", observers=[Clears()])
    overflow(dev)
    dev.set_tags(phase="scale")
    assert not dev.get_float_status().any()


def test_substitute_matmul_and_restore() -> None:
    a, b = np.ones((2, 3), H), np.ones((3, 2), H)
    calls = []

    def fake(device, x, y, accumulate, out_dtype):
        calls.append((device, accumulate, out_dtype))
        return np.zeros((x.shape[0], y.shape[1]), out_dtype)

    dev = Device("atlas-a2", substitutes={"matmul": fake})
    assert dev.substitute_of("matmul") is fake
    assert not dev.matmul(a, b).any() and calls == [(dev, None, np.float16)]
    dev.substitute("matmul", None)
    assert dev.substitute_of("matmul") is None and (dev.matmul(a, b) == 3).all()
    with pytest.raises(ValueError, match="cannot substitute 'add'"):
        dev.substitute("add", fake)
    with pytest.raises(ValueError, match="must be callable"):
        dev.substitute("matmul", 3)


def test_group_joins_its_devices() -> None:
    devs = [Device("atlas-a2"), Device("atlas-a2")]
    assert devs[0].group is None and devs[0].rank is None
    group = Group(devs)
    assert [(d.group, d.rank) for d in devs] == [(group, 0), (group, 1)]
    with pytest.raises(AttributeError):
        devs[0].rank = 3  # set by join only
    with pytest.raises(ValueError, match="rank must be an integer of at least 0, got -1"):
        devs[0].join(group, -1)


def test_phases_live_in_lossscale() -> None:
    import sim

    assert lossscale.PHASES is PHASES and lossscale.begin_phase is begin_phase
    assert not hasattr(sim, "PHASES")
    for name in ("begin_phase", "current_phase", "phase_hooks", "phase_events", "matmul_hook", "step"):
        assert not hasattr(Device("atlas-a2"), name), name
    counts = PhaseEvents()
    dev = Device("atlas-training", observers=[counts])
    begin_phase(dev, "forward", step=0)
    overflow(dev)
    begin_phase(dev, "backward")
    overflow(dev)
    assert (current_step(dev), current_phase(dev)) == (0, "backward")
    assert counts.counts == {"forward": 1, "backward": 1}
    begin_phase(dev, "forward", step=1)
    assert counts.counts == {}


def test_sim_never_imports_lossscale() -> None:
    for path in (ROOT / "sim").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] == "lossscale" for n in names), path
