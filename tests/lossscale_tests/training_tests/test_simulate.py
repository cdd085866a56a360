"""simulate() with the user's own objects: workloads that follow the Workload protocol and
managers, policies or plain scaler objects, against the named ones they stand for."""

from __future__ import annotations

import json
from typing import get_origin

import numpy as np
import pytest
import scripted  # tests/ is on the path (pytest prepends it)

from lossscale import SGD, ExponentialUpdateLossScaleManager, PolicyManager, simulate
from lossscale.policy import MANAGERS
from lossscale.policy import frameworks as policies
from lossscale.policy.ascend import ExponentialUpdate
from lossscale.training.workloads import Trace

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


def records(run) -> str:
    """Every column of every row, as text: NaN (an unmeasured underflow_fraction) equals NaN."""
    return json.dumps(run.records)


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
    from lossscale.training.records import SCHEMA
    run = simulate(**{**RUN, "steps": 12})
    for rec in run.records:
        assert list(rec) == list(SCHEMA)
        assert all(type(rec[k]) is (get_origin(kind) or kind) for k, kind in SCHEMA.items()), rec
        assert all(type(v) is int for v in rec["register"]) and len(rec["register"]) == 8


def test_one_registry_holds_every_manager_once() -> None:
    from lossscale import Manager
    from lossscale.policy import ascend as managers
    from lossscale.policy import register
    faces = {cls for module in (managers, policies) for cls in vars(module).values()
             if isinstance(cls, type) and issubclass(cls, Manager) and cls.__module__ == module.__name__}
    assert {cls for cls, _ in MANAGERS.values()} == faces and len(MANAGERS) == len(faces) == 13
    with pytest.raises(ValueError, match="manager name 'torch' is taken by TorchGradScaler"):
        register("torch")(ExponentialUpdateLossScaleManager)


def scripted_rows(mode: str, detector: str, steps: int = 6, init_scale: float = 1024.0) -> list[dict]:
    """Every column of the scripted workload's trajectory (tests/scripted.py), worked out apart
    from the simulator: the scale halves after each skip (torch's backoff; growth is 1000 steps
    away); the binary16 gradient is numpy's rounding of g * S (Inf beyond 65504, or 65504 in
    saturation mode; TINY * S flushes to 0); applied steps move binary32 weights by LR * g16 / S,
    the baseline's by LR * g; the update errors are 2-norm ratios in binary64."""
    skips, window = scripted.SKIPS[mode][detector], scripted.REGISTER_WINDOW[mode][detector]
    w, base = np.array(scripted.INIT, F32), np.array(scripted.INIT, F32)
    scale, rows, events_so_far = init_scale, [], 0

    def error(update, ref) -> float:
        u, r = update.astype(np.float64), ref.astype(np.float64)
        return float("inf") if not np.isfinite(u).all() else float(np.linalg.norm(u - r) / np.linalg.norm(r))

    for t in range(steps):
        g = scripted.grad(t)
        with np.errstate(over="ignore"):
            g16 = (g * F32(scale)).astype(H)
        if mode == "saturation":
            g16 = np.clip(g16, -65504, 65504).astype(H)
        applied = t not in skips
        phase = scripted.PHASE_OF.get(t)
        events_so_far += phase is not None
        in_window = {"step": phase is not None, "backward": phase == "backward", "run": events_so_far}[window]
        ref = (w - F32(scripted.LR) * g) - w
        with np.errstate(all="ignore"):
            would_be = (w - F32(scripted.LR) * (g16.astype(F32) / F32(scale))) - w
        update_error = error(would_be, ref) if applied else 1.0
        skipped_error = float("nan") if applied else error(would_be, ref)
        harm = "" if phase is None else (("harmless" if update_error <= 2**-4 else "harmful") if applied else
                                         ("skipped-needless" if skipped_error <= 2**-4 else "skipped-needed"))
        measured = t % 2 == 0
        rows.append({
            "step": t, "loss_scale": scale, "overflow": phase is not None, "event_phases": phase or "",
            "detector_finite": applied, "applied": applied,
            "undetected_overflow": applied and scripted.FEEDS.get(t, False),
            "false_positive": not applied and not scripted.FEEDS.get(t, False),
            "ranks_agree": True, "ranks_applied": str(int(applied)),
            "register": (int(in_window > 0), 0, 0, int(in_window), 0, 0, 0, 0),
            "loss": float(np.dot(w.astype(np.float64), g)), "baseline_loss": float(np.dot(base.astype(np.float64), g)),
            "grad_max": float(np.max(np.abs(g16.astype(F32)))) / scale,
            "underflow_fraction": np.count_nonzero((g16 == 0) & (g != 0)) / np.count_nonzero(g) if measured
            else float("nan"),
            "update_error": update_error, "skipped_update_error": skipped_error, "overflow_harm": harm})
        if applied:
            w = w + would_be
        else:
            scale *= 0.5
        base = base - F32(scripted.LR) * g
    return rows


@pytest.mark.parametrize("detector", list(scripted.SKIPS["inf_nan"]))
@pytest.mark.parametrize("profile, mode", [("atlas-training", "saturation"), ("atlas-a2", "inf_nan")])
def test_every_column_of_a_hand_built_run(profile: str, mode: str, detector: str) -> None:
    """Each column of the trajectory against :func:`scripted_rows`: the floats exactly where the
    arithmetic is exact (dyadic values), the update errors to 4 units of binary64 (the same
    binary32 vectors' norms, summed in another order at most)."""
    run = simulate(workload=scripted.Scripted(), manager="torch", manager_args={"init_scale": 1024.0,
                   "growth_interval": 1000}, detector=detector, profile=profile, steps=6, underflow_every=2)
    want = scripted_rows(mode, detector)
    assert [list(r) for r in run.records] == [list(w) for w in want]
    for got, row in zip(run.records, want, strict=True):
        for column in ("update_error", "skipped_update_error"):
            assert got[column] == pytest.approx(row[column], rel=2**-50, nan_ok=True), (row["step"], column)
        exact = {k: v for k, v in row.items() if k not in ("update_error", "skipped_update_error")}
        assert json.dumps({k: got[k] for k in exact}) == json.dumps(exact), row["step"]
    assert len({r["overflow_harm"] for r in want}) >= 3  # the script reaches several outcomes


def test_mlp_grads32_against_finite_differences() -> None:
    """The mlp's binary32 loss and gradients against central differences of the loss written out
    here in binary64 (mean softmax cross-entropy of relu(x w1 + b1) w2 + b2). Step h = 2**-20:
    truncation error ~h**2 and rounding ~2**-52 / h, both below 1e-9, provided no pre-activation is
    within h of the relu's kink (asserted). The binary32 gradients are sums of at most 64 products,
    each rounded: within 64 * 2**-24 of the largest, so 1e-5 of it is a safe bound."""
    from lossscale.training.workloads import Mlp

    wl = Mlp(hidden=8, batch=16)
    rng = np.random.default_rng(5)
    params = [(p + 0.1 * rng.standard_normal(p.shape)).astype(F32) for p in wl.init_params()]
    idx = np.arange(16)
    x, y = wl.train[0][idx].astype(np.float64), wl.train[1][idx]

    def loss64(w1, b1, w2, b2) -> float:
        z = np.maximum(x @ w1 + b1, 0) @ w2 + b2
        z = z - z.max(axis=1, keepdims=True)
        return float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(y)), y]))

    p64 = [p.astype(np.float64) for p in params]
    assert np.abs(x @ p64[0] + p64[1]).min() > 1e-3  # no kink within reach of h
    h = 2.0**-20
    loss, grads = wl.grads32(params, idx)
    assert loss == pytest.approx(loss64(*p64), rel=1e-6)
    for i, g in enumerate(grads):
        fd = np.zeros(p64[i].size)
        for j in range(p64[i].size):
            plus, minus = [q.copy() for q in p64], [q.copy() for q in p64]
            plus[i].flat[j] += h
            minus[i].flat[j] -= h
            fd[j] = (loss64(*plus) - loss64(*minus)) / (2 * h)
        assert g.shape == p64[i].shape and g.dtype == F32
        assert np.abs(g.reshape(-1) - fd).max() <= 1e-5 * np.abs(fd).max(), f"parameter {i}"


def test_summary_counts_are_the_rows_counted() -> None:
    """Each count of summary.json is its column counted, worked by hand on four rows."""
    from dataclasses import fields, replace

    from lossscale.training.records import COUNTS, Row, Summary, counts

    base = Row(step=0, loss_scale=1.0, overflow=False, event_phases="", detector_finite=True, applied=True,
               undetected_overflow=False, false_positive=False, ranks_agree=True, ranks_applied="1",
               register=(0,) * 8, loss=0.0, baseline_loss=0.0, grad_max=0.0, underflow_fraction=0.0,
               update_error=0.0, skipped_update_error=float("nan"), overflow_harm="")
    rows = [base,
            replace(base, step=1, overflow=np.bool_(True), applied=False, overflow_harm="skipped-needed"),
            replace(base, step=2, overflow=True, undetected_overflow=True, overflow_harm="harmful"),
            replace(base, step=3, applied=False, false_positive=True, ranks_agree=False)]
    assert counts(rows) == {"overflow_steps": 2, "skipped_steps": 2, "undetected_overflow_steps": 1,
                            "false_positive_steps": 1, "rank_disagreement_steps": 1, "harmless_overflow_steps": 0,
                            "harmful_overflow_steps": 1, "needless_skip_steps": 0, "needed_skip_steps": 1}
    assert all(type(v) is int for v in counts(rows).values())
    assert set(COUNTS) <= {f.name for f in fields(Summary)}
