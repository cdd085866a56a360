"""Whole runs under each framework's detector: false positives from a harmless logging
overflow, undetected overflows, the event log and its summary, through the API and the CLI."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import scripted  # tests/ is on the path (pytest prepends it)

from lossscale import simulate
from lossscale.app.cli import main
from lossscale.app.files import read_run
from lossscale.training.detectors import DETECTORS
from lossscale.training.records import EVENT_COLUMNS
from sim import profiles

from groups import representatives  # noqa: E402

LOGGED = dict(profile="atlas-training", steps=60, workload_args={"log_perplexity": True})


@pytest.fixture(scope="module")
def logged():
    return {d: simulate(detector=d, **LOGGED) for d in DETECTORS}


def test_logging_overflow_is_a_false_positive_only_where_the_window_holds_the_forward(logged) -> None:
    s = {d: run.summary for d, run in logged.items()}
    # exp of the summed loss overflows in the log phase: tf-npu and all_finite skip for it.
    assert s["tf-npu"]["false_positive_steps"] > 0 and s["mindspore-all-finite"]["false_positive_steps"] > 0
    for d in ("torch-npu", "mindspore"):
        assert s[d]["false_positive_steps"] == 0 and s[d]["undetected_overflow_steps"] == 0
    assert s["tf-npu"]["final"]["accuracy"] < s["torch-npu"]["final"]["accuracy"] - 0.3
    # isfinite skips nothing in saturation mode: every overflow that feeds the update gets through.
    assert s["isfinite"]["skipped_steps"] == 0 and s["isfinite"]["undetected_overflow_steps"] > 0
    for d, summary in s.items():
        assert summary["detector"] == d and summary["first_overflow"]["label"] == "perplexity"
        assert summary["first_overflow"]["phase"] == "log" and summary["first_overflow"]["op"] == "exp"


def test_the_event_log_agrees_with_the_steps_phases(logged) -> None:
    """(Each step's classification is checked against hand-worked values in
    test_simulate.py::test_every_column_of_a_hand_built_run.)"""
    for run in logged.values():
        assert any(r["event_phases"] for r in run.records)
        for t in (0, 10, 30):
            assert {e["phase"] for e in run.events if e["step"] == t} == set(run.records[t]["event_phases"].split())


def test_without_logging_every_detector_that_sees_the_backward_agrees() -> None:
    runs = {d: simulate(detector=d, profile="atlas-training", steps=60) for d in ("tf-npu", "torch-npu", "mindspore")}
    trajectories = {d: run.column("loss_scale").tolist() for d, run in runs.items()}
    assert trajectories["tf-npu"] == trajectories["torch-npu"] == trajectories["mindspore"]
    assert all(r.summary["false_positive_steps"] == 0 for r in runs.values())


def test_torch_npu_scaler_under_its_detector_on_two_ranks() -> None:
    run = simulate(manager="torch-npu", detector="torch-npu", ranks=2, **LOGGED)
    s = run.summary
    assert s["manager"]["class"] == "TorchNpuGradScaler" and s["rank_disagreement_steps"] == 0
    assert s["skipped_steps"] > 0 and s["false_positive_steps"] == 0 and s["undetected_overflow_steps"] == 0
    assert {e["rank"] for e in run.events} == {0, 1}
    # Summing saturated gradients across ranks overflows again, on the devices.
    assert any(e["label"] == "allreduce" and e["phase"] == "allreduce" and e["op"] == "add" for e in run.events)


def test_all_finite_lets_ranks_disagree() -> None:
    # Two ranks of 5 images each: a summed loss near 11, where exp overflows binary16, so the
    # ranks' logging overflows on different steps, and each rank decides alone.
    run = simulate(detector="mindspore-all-finite", ranks=2, profile="atlas-training", steps=40,
                   workload_args={"log_perplexity": True, "batch": 10})
    assert run.summary["rank_disagreement_steps"] > 0
    assert not all(run.column("ranks_agree"))


def test_unmarked_workload_is_one_phase_every_window_holds() -> None:
    from test_simulate import Linear  # tests/ is on the path (pytest prepends it)
    runs = {d: simulate(workload=Linear(), manager="torch", detector=d, profile="atlas-training", steps=30)
            for d in ("tf-npu", "torch-npu", "mindspore")}
    for run in runs.values():
        assert run.summary["phases"].startswith("unmarked")
        assert {e["phase"] for e in run.events} == {"forward_backward"}
        assert run.summary["undetected_overflow_steps"] == 0 and run.summary["skipped_steps"] > 0
    assert len({tuple(r.column("applied")) for r in runs.values()}) == 1


def test_events_off() -> None:
    run = simulate(steps=20, profile="atlas-training", record_events=False)
    assert run.events == [] and run.summary["first_overflow"] is None and run.summary["events_recorded"] is None
    assert run.summary["skipped_steps"] > 0  # the decisions do not depend on the log


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


TRAINING_PROFILES = [p for p in profiles.names() if profiles.get(p).supports_npu_loss_scale_optimizer]


#: The products' default overflow modes (docs/semantics.md's table, from the product documentation).
DEFAULT_MODE = {"atlas-350": "inf_nan", "atlas-a3": "inf_nan", "atlas-a2": "inf_nan", "atlas-training": "saturation"}


@pytest.mark.parametrize("profile", TRAINING_PROFILES)
def test_every_detector_and_the_torch_npu_manager_on_every_training_profile(profile) -> None:
    """On the scripted workload (tests/scripted.py) each detector skips the steps its window
    holds, in the profile's default overflow mode, and torch_npu's scaler halves on each."""
    mode = DEFAULT_MODE[profile]
    for detector in [*DETECTORS, "status"]:
        run = simulate(workload=scripted.Scripted(), profile=profile, detector=detector, manager="torch-npu",
                       manager_args={"init_scale": 1024.0, "growth_interval": 1000}, steps=6, record_events=False)
        skips = scripted.SKIPS[mode][run.summary["detector"]]
        assert run.summary["detector"] == ("tf-npu" if detector == "status" else detector)
        assert [t for t, r in enumerate(run.records) if not r["applied"]] == sorted(skips), (profile, detector)
        assert list(run.column("loss_scale")) == [1024.0 * 0.5 ** len(skips & set(range(t))) for t in range(6)]
        assert run.summary["false_positive_steps"] == len(skips & {2})  # step 2's overflow is in logging only
        assert run.summary["manager"]["class"] == "TorchNpuGradScaler"


@pytest.mark.parametrize("detector", representatives([*DETECTORS, "status"], lambda d: d in ("tf-npu", "isfinite")))
def test_cli_every_detector_and_the_torch_npu_manager(capsys, tmp_path, detector) -> None:
    out = tmp_path / detector
    code, stdout, err = run_cli(capsys, "run", "--profile", "atlas-350", "--detector", detector, "--manager",
                                "torch-npu", "--steps", "12", "--quiet", "--no-events", "--out", str(out))
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["detector"] == ("tf-npu" if detector == "status" else detector)
    assert summary["manager"]["class"] == "TorchNpuGradScaler" and f"detector {summary['detector']}," in stdout


def test_cli_prints_and_writes_the_event_log(capsys, tmp_path) -> None:
    out = tmp_path / "tf"
    code, stdout, _ = run_cli(capsys, "run", "--profile", "atlas-training", "--detector", "tf-npu",
                              "--workload-arg", "log_perplexity=true", "--steps", "30", "--quiet", "--out", str(out))
    assert code == 0
    assert "first overflow: step 0, exp in perplexity (log phase, rank 0, INEXACT|OVERFLOW)" in stdout
    assert "operations with register events, by label: " in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["false_positive_steps"] > 0 and "perplexity" in summary["top_labels"]
    rows = list(csv.DictReader((out / "events.csv").open()))
    assert tuple(rows[0]) == EVENT_COLUMNS and len(rows) == summary["events_recorded"]
    assert (out / "events.png").stat().st_size > 0
    back = read_run(out)
    assert back.events[0] == {"rank": 0, "step": 0, "phase": "log", "label": "perplexity", "op": "exp",
                              "flags": "INEXACT|OVERFLOW", "elements": 1}
    assert np.array_equal(back.column("false_positive"), [r == "1" for r in
                                                          [row["false_positive"] for row in csv.DictReader(
                                                              (out / "trajectory.csv").open())]])
    (out / "events.png").unlink()
    assert run_cli(capsys, "plot", str(out))[0] == 0 and (out / "events.png").exists()
    code, _, _ = run_cli(capsys, "run", "--steps", "5", "--quiet", "--no-events", "--out", str(tmp_path / "quiet"))
    assert code == 0 and not (tmp_path / "quiet" / "events.csv").exists()


def test_cli_profiles_lists_soc_names(capsys) -> None:
    code, stdout, _ = run_cli(capsys, "profiles")
    assert code == 0 and "Ascend910B1" in stdout and "Ascend910_9391" in stdout and "Ascend310P3" in stdout
