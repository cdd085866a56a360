"""Output folders read back as typed values (``lossscale.load_run``): a run's rows, summary,
event and FP8 logs; a compare folder's runs in order; a sweep's typed rows; older files, bad
folders, and the pandas frames (skipped without pandas). The oracle is the files' own text,
read here with the csv and json modules."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

import lossscale
from lossscale.app.cli import main
from lossscale.app.results import CompareResult, RunResult, SweepResult
from lossscale.app.sweep import RESULT_COLUMNS, run_sweep
from lossscale.training.records import COLUMNS, EventRow, Fp8Row, Row, ShadowRow, Summary


@pytest.fixture(scope="module")
def fp8_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "fp8"
    assert main(["run", "--profile", "atlas-350", "--fp8", "delayed", "--steps", "12", "--quiet", "--out",
                 str(out), "--shadow", "nvfp4", "hifloat8"]) == 0
    return out


def text_rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.open()))


def test_a_run_folder_reads_back_as_typed_records(fp8_run: Path) -> None:
    got = lossscale.load_run(fp8_run)
    assert isinstance(got, RunResult) and got.folder == fp8_run
    text = text_rows(fp8_run / "trajectory.csv")
    assert len(got.rows) == len(text) == 12 and all(isinstance(r, Row) for r in got.rows)
    for row, line in zip(got.rows, text, strict=True):
        assert row.step == int(line["step"]) and isinstance(row.step, int)
        assert row.applied is (line["applied"] == "1") and row.overflow is (line["overflow"] == "1")
        assert repr(row.loss) == line["loss"] and repr(row.grad_max) == line["grad_max"]  # NaN too
        assert isinstance(row.register, tuple) and len(row.register) == 8
        assert all(type(v) is int for v in row.register)
        assert row.register == tuple(int(v) for v in line["register"].split(" "))
        assert row.overflow_harm == line["overflow_harm"]
    assert any(r.register[0] for r in got.rows)  # the default scale of 2**32 overflows: slot 0 is set somewhere
    summary = json.loads((fp8_run / "summary.json").read_text())
    assert isinstance(got.summary, Summary)
    assert got.summary.skipped_steps == summary["skipped_steps"] == sum(not r.applied for r in got.rows)
    assert got.summary.arguments == summary["arguments"] and got.summary.fp8 == summary["fp8"]
    events = text_rows(fp8_run / "events.csv")
    assert len(got.events) == len(events) > 0 and all(isinstance(e, EventRow) for e in got.events)
    assert [(e.rank, e.step, e.op, e.elements) for e in got.events] == [
        (int(e["rank"]), int(e["step"]), e["op"], int(e["elements"])) for e in events]
    fp8 = text_rows(fp8_run / "fp8.csv")
    assert len(got.fp8) == len(fp8) > 0 and all(isinstance(r, Fp8Row) for r in got.fp8)
    assert [(r.tensor, r.scale, r.saturated) for r in got.fp8] == [
        (r["tensor"], float(r["scale"]), int(r["saturated"])) for r in fp8]
    shadow = text_rows(fp8_run / "shadow.csv")
    assert len(got.shadow) == len(shadow) == 2 * len(fp8) and all(isinstance(r, ShadowRow) for r in got.shadow)
    assert [(r.shadow, r.tensor, repr(r.rel_error), r.underflowed) for r in got.shadow] == [
        (r["shadow"], r["tensor"], r["rel_error"], int(r["underflowed"])) for r in shadow]
    assert got.summary.arguments["shadow"] == ["nvfp4", "hifloat8"] and (fp8_run / "shadow.png").exists()


def test_the_register_is_written_as_eight_numbers_and_read_from_older_files(fp8_run: Path, tmp_path: Path) -> None:
    """The file keeps the space-separated text every release wrote; a folder with a hand-made
    trajectory and a summary lacking later keys (NaN as null, infinity as text) reads back."""
    old = tmp_path / "old"
    old.mkdir()
    line = {c: "" for c in COLUMNS} | {
        "step": "0", "loss_scale": "65536.0", "overflow": "1", "event_phases": "backward", "detector_finite": "0",
        "applied": "0", "undetected_overflow": "0", "false_positive": "0", "ranks_agree": "1",
        "ranks_applied": "0", "register": "1 0 0 3 0 0 0 0", "loss": "2.5", "baseline_loss": "2.25",
        "grad_max": "inf", "underflow_fraction": "nan", "update_error": "1.0", "skipped_update_error": "0.5"}
    with (old / "trajectory.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerow(line)
    (old / "summary.json").write_text(json.dumps({"arguments": {"steps": 1}, "detector": "tf-npu", "steps_run": 1,
                                                  "mean_underflow_fraction": None, "final_loss_scale": "inf",
                                                  "final": {"loss": "inf", "accuracy": 0.5}}))
    got = lossscale.load_run(old)
    [row] = got.rows
    assert row.register == (1, 0, 0, 3, 0, 0, 0, 0) and row.grad_max == math.inf
    assert math.isnan(row.underflow_fraction) and row.overflow_harm == ""
    s = got.summary
    assert s.detector == "tf-npu" and s.steps_run == 1 and s.final_loss_scale == math.inf
    assert math.isnan(s.mean_underflow_fraction) and s.final == {"loss": math.inf, "accuracy": 0.5}
    assert s.harmful_overflow_steps is None and s.fp8 is None  # keys an older release did not write
    written = text_rows(fp8_run / "trajectory.csv")[0]["register"]
    assert len(written.split(" ")) == 8 and all(v.isdigit() for v in written.split(" "))


@pytest.mark.parametrize("cell, value, message", [
    ("register", "1 0 x 0 0 0 0 0", "line 2 is malformed"),
    ("applied", "yes", "line 2 is malformed ('yes' is not 1 or 0)"),
    ("loss", "heavy", "line 2 is malformed"),
])
def test_a_malformed_cell_names_the_file_and_line(fp8_run: Path, tmp_path: Path, cell, value, message) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(fp8_run, bad)
    rows = text_rows(bad / "trajectory.csv")
    rows[0][cell] = value
    with (bad / "trajectory.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(ValueError, match="trajectory.csv") as err:
        lossscale.load_run(bad)
    assert message in str(err.value)


def test_a_folder_without_output_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        lossscale.load_run(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="holds no run, compare or sweep output"):
        lossscale.load_run(tmp_path)
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="is not a folder"):
        lossscale.load_run(tmp_path / "file.txt")


def test_a_compare_folder_reads_back_in_the_order_it_ran(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    assert main(["compare", "--manager", "torch", "--manager", "exponential", "--steps", "8", "--quiet",
                 "--out", str(out)]) == 0
    got = lossscale.load_run(out)
    assert isinstance(got, CompareResult) and got.managers == ("torch", "exponential")
    for name in got.managers:
        assert isinstance(got.runs[name], RunResult)
        text = text_rows(out / name / "trajectory.csv")
        assert [r.loss_scale for r in got.runs[name].rows] == [float(r["loss_scale"]) for r in text]
    assert got.runs["torch"].summary.manager["name"] == "torch"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    (root / "grid.toml").write_text('[sweep]\nworkload = "trace"\nsteps = 20\n\n[grid]\n'
                                    'manager = ["exponential", {name = "torch", growth_interval = 5}]\n'
                                    'seed = [0, 3]\n')
    run_sweep(root / "grid.toml", root / "out", workers=1)
    return root / "out"


def test_a_sweep_folder_reads_back_with_typed_cells(sweep: Path) -> None:
    got = lossscale.load_run(sweep)
    assert isinstance(got, SweepResult)
    assert got.fixed == {"workload": "trace", "steps": 20} and got.axes["seed"] == [0, 3]
    text = text_rows(sweep / "results.csv")
    assert len(got.rows) == len(text) == 4
    for row, line in zip(got.rows, text, strict=True):
        assert tuple(row) == RESULT_COLUMNS
        assert row["index"] == int(line["index"]) and row["seed"] == int(line["seed"]) and row["steps"] == 20
        assert row["skipped_steps"] == int(line["skipped_steps"]) and type(row["skipped_steps"]) is int
        assert row["final_loss"] == float(line["final_loss"])
        assert row["overflow_mode"] is None and row["fp8_overflowed_elements"] is None  # empty cells
    assert [r["manager_args"] for r in got.rows] == [None, None, {"growth_interval": 5}, {"growth_interval": 5}]


def test_to_pandas_gives_the_same_values(fp8_run: Path, sweep: Path, tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    run = lossscale.load_run(fp8_run)
    frame = run.to_pandas()
    assert list(frame.columns) == list(COLUMNS) and len(frame) == len(run.rows)
    assert [repr(v) for v in frame["loss"]] == [repr(r.loss) for r in run.rows]
    assert frame["register"].tolist() == [r.register for r in run.rows]
    assert run.to_pandas("fp8")["saturated"].sum() == sum(r.saturated for r in run.fp8)
    assert run.to_pandas("shadow")["underflowed"].sum() == sum(r.underflowed for r in run.shadow)
    assert len(run.to_pandas("events")) == len(run.events)
    with pytest.raises(ValueError, match="unknown table 'bogus'; valid: trajectory, events, fp8"):
        run.to_pandas("bogus")
    table = lossscale.load_run(sweep).to_pandas()
    assert list(table.columns) == list(RESULT_COLUMNS) and table["seed"].tolist() == [0, 3, 0, 3]
    out = tmp_path / "cmp"
    assert main(["compare", "--manager", "fixed", "--manager", "torch", "--steps", "5", "--quiet", "--out",
                 str(out), "--no-events"]) == 0
    both = lossscale.load_run(out).to_pandas()
    assert both["manager"].tolist() == ["fixed"] * 5 + ["torch"] * 5 and both["step"].tolist() == [*range(5)] * 2
