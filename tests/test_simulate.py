"""simulate() with the user's own objects: workloads that follow the Workload protocol and
managers, policies or plain scaler objects, against the named ones they stand for."""

from __future__ import annotations

import numpy as np
import pytest

from lossscale import SGD, ExponentialUpdateLossScaleManager, PolicyManager, policies
from lossscale.managers import ExponentialUpdate
from lossscale.simulate import MANAGERS, simulate
from lossscale.workloads import Trace

F32, H = np.float32, np.float16


class Linear:
    """Least squares y = x w on fixed data: a workload of the kind a user writes."""

    name = "linear"
    has_accuracy = False

    def __init__(self, n: int = 16, rows: int = 256, batch: int = 32, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal((rows, n)).astype(F32)
        self.y = (self.x @ rng.standard_normal((n, 1))).astype(F32)
        self.n, self.batch, self.seed = n, batch, seed

    def init_params(self):
        return [np.zeros((self.n, 1), F32)]

    def optimizer(self):
        return SGD(0.05)

    def batches(self, steps):
        rng = np.random.default_rng(self.seed + 1)
        return [rng.choice(len(self.y), self.batch, replace=False) for _ in range(steps)]

    def shards(self, batch, ranks):
        return [(part, len(part) / len(batch)) for part in np.array_split(batch, ranks)]

    def forward_backward(self, dev, params, scale, idx, share=1.0):
        total = round(len(idx) / share)
        x16 = dev.cast(self.x[idx], H)
        r = dev.sub(dev.matmul(x16, dev.cast(params[0], H), out_dtype=F32), self.y[idx])
        dr = dev.cast(dev.mul(r, F32(scale / total)), H)  # where a too-high scale overflows
        return float(0.5 * np.sum(r.astype(np.float64) ** 2) / total), [
            dev.matmul(np.ascontiguousarray(x16.T), dr)]

    def grads32(self, params, idx, share=1.0):
        total = round(len(idx) / share)
        r = self.x[idx] @ params[0] - self.y[idx]
        return float(0.5 * np.sum(r.astype(np.float64) ** 2) / total), [self.x[idx].T @ r / F32(total)]

    def evaluate(self, params):
        r = self.x @ params[0] - self.y
        return {"loss": float(0.5 * np.mean(r.astype(np.float64) ** 2)), "accuracy": float("nan")}


class Halving:
    """A scaler as a user writes one: halve on overflow, double after 10 good steps."""

    def __init__(self, scale: float = 2.0**40) -> None:
        self.scale, self.good = scale, 0

    def get_loss_scale(self) -> float:
        return self.scale

    def update_loss_scale(self, finite: bool) -> None:
        self.good = self.good + 1 if finite else 0
        if not finite:
            self.scale /= 2
        elif self.good % 10 == 0:
            self.scale *= 2


def records(run):
    return [{k: v for k, v in r.items() if k != "underflow_fraction"} for r in run.records]


RUN = dict(workload="trace", profile="atlas-training", steps=80, seed=3)


DEMO = MANAGERS["exponential"][1]  # the simulator's arguments for the name "exponential"


@pytest.mark.parametrize("make, cls", [
    (lambda: ExponentialUpdateLossScaleManager(**DEMO), "ExponentialUpdateLossScaleManager"),  # an object
    (lambda: (lambda: ExponentialUpdateLossScaleManager(**DEMO)), "ExponentialUpdateLossScaleManager"),  # a factory
    (lambda: ExponentialUpdate(**DEMO), "PolicyManager"),  # a policy value
], ids=["object", "factory", "policy"])
def test_manager_objects_train_as_the_named_manager(make, cls) -> None:
    named, mine = simulate(manager="exponential", **RUN), simulate(manager=make(), **RUN)
    assert records(mine) == records(named)
    assert mine.summary["manager"]["arguments"] == named.summary["manager"]["arguments"]
    assert mine.summary["manager"]["class"] == cls


def test_a_manager_class_is_made_with_its_own_defaults() -> None:
    run = simulate(manager=policies.TorchGradScaler, **RUN)
    assert run.summary["manager"]["arguments"]["init_scale"] == 2.0**16  # torch's, not the demo's 2**32
    assert run.summary["manager"]["arguments"]["growth_interval"] == 2000
    assert run.records[0]["loss_scale"] == 2.0**16


def test_workload_object_trains_as_the_named_workload() -> None:
    named = simulate(**RUN)
    mine = simulate(**{**RUN, "workload": Trace(seed=3)})
    assert records(mine) == records(named)
    assert mine.summary["arguments"]["workload"] == "trace"


def test_own_workload_and_scaler_train_and_the_register_catches_overflow() -> None:
    scaler = Halving()
    run = simulate(workload=Linear(), manager=scaler, profile="atlas-training", steps=120)
    scales, applied, overflow = run.column("loss_scale"), run.column("applied"), run.column("overflow")
    # 2**40 times gradients of order 1 saturates binary16: the first steps overflow and are
    # skipped, each halving the scale, until the scaled gradients fit.
    first_good = int(np.argmax(applied))
    assert first_good > 10 and not applied[:first_good].any() and overflow[:first_good].all()
    assert list(scales[:first_good + 1]) == [2.0**40 / 2**k for k in range(first_good + 1)]
    assert not run.column("undetected_overflow").any()  # the register saw every one
    assert run.summary["final"]["loss"] < 0.05 * run.records[0]["loss"]  # and it trains
    assert scaler.get_loss_scale() == run.summary["final_loss_scale"]  # rank 0 trained the object itself
    assert run.summary["manager"] == {"name": "Halving", "class": "Halving", "arguments": {}, "defaults": None,
                                      "demo_arguments": []}


def test_ranks_get_copies_of_a_scaler_object_and_skip_together() -> None:
    scaler = Halving()
    run = simulate(workload=Linear(), manager=scaler, profile="atlas-training", steps=40, ranks=2)
    one = simulate(workload=Linear(), manager=Halving(), profile="atlas-training", steps=40)
    assert list(run.column("loss_scale")) == list(one.column("loss_scale"))
    assert scaler.scale == run.summary["final_loss_scale"]


@pytest.mark.parametrize("kw, error, message", [
    (dict(workload=object()), TypeError, "lacks name, has_accuracy, init_params"),
    (dict(workload=Trace(), workload_args={"size": 8}), ValueError, "workload_args go with a workload name"),
    (dict(manager=Halving(), manager_args={"scale": 2.0}), ValueError, "manager_args go with a manager name"),
    (dict(manager=object()), TypeError, "manager must be a name"),
    (dict(manager=lambda: 3), TypeError, "got int"),
    (dict(manager=ExponentialUpdateLossScaleManager), TypeError, "missing 2 required positional arguments"),
    (dict(manager="nope"), ValueError, "unknown manager 'nope'"),
])
def test_bad_objects_are_refused_before_any_work(kw, error, message) -> None:
    with pytest.raises(error, match=message):
        simulate(**{**RUN, "steps": 2, **kw})


def test_policy_manager_takes_only_policies() -> None:
    with pytest.raises(TypeError, match="takes a Policy"):
        PolicyManager(Halving())


def test_records_follow_the_one_schema() -> None:
    from lossscale.simulate import SCHEMA
    run = simulate(**{**RUN, "steps": 12})
    for rec in run.records:
        assert list(rec) == list(SCHEMA)
        assert all(type(rec[k]) is kind for k, kind in SCHEMA.items()), rec


def test_one_registry_holds_every_manager_once() -> None:
    from lossscale import managers
    from lossscale.policy import Manager, register
    faces = {cls for module in (managers, policies) for cls in vars(module).values()
             if isinstance(cls, type) and issubclass(cls, Manager) and cls.__module__ == module.__name__}
    assert {cls for cls, _ in MANAGERS.values()} == faces and len(MANAGERS) == len(faces) == 11
    with pytest.raises(ValueError, match="manager name 'torch' is taken by TorchGradScaler"):
        register("torch")(ExponentialUpdateLossScaleManager)
