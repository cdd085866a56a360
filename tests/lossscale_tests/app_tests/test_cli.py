"""The training simulator and the lossscale command: error paths, determinism,
the files' schema, and the plot's content (no timing)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from runs import FAST  # tests/ is on the path (tests/conftest.py)

from lossscale import simulate
from lossscale.app.cli import main
from lossscale.app.files import MANIFEST, read_run
from lossscale.app.plots import figure_run
from lossscale.training.records import COLUMNS


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, message", [
    (["run", "--manager", "bogus"], "invalid choice: 'bogus'"),
    (["run", "--profile", "atlas-9"], "invalid choice: 'atlas-9'"),
    (["run", "--manager-arg", "foo=1"], "takes no argument 'foo'; valid: init_loss_scale"),
    (["run", "--manager-arg", "init_loss_scale=0.5"], "init_loss_scale must be at least 1, got 0.5"),
    (["run", "--manager-arg", "init_loss_scale"], "--manager-arg takes KEY=VALUE"),
    (["run", "--manager-arg", "init_loss_scale=big"], "bad value for init_loss_scale"),
    (["run", "--workload-arg", "width=3"], "workload 'mlp' takes no argument 'width'; valid: hidden"),
    (["run", "--profile", "atlas-training", "--overflow-mode", "inf_nan"], "supports SATURATION"),
    (["run", "--steps", "0"], "argument --steps: must be an integer from 1 to 10,000,000, got '0'"),
    (["run", "--steps", "many"],
     "argument --steps: must be an integer from 1 to 10,000,000, got 'many'"),
    (["compare", "--manager", "torch"], "at least two different --manager"),
    ([], "a command is needed; valid: run, compare, plot, profiles"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch, argv, message) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("lossscale: error: ") and message in err
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # nothing half-built


def test_existing_output_needs_force(capsys, tmp_path, earlier_run) -> None:
    """An earlier output is replaced only with --force; a folder holding the user's files never is."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    for force in ([], ["--force"]):
        code, _, err = run_cli(capsys, "run", *FAST, "--out", str(out), *force)
        assert code == 2 and "did not write (keep.txt)" in err and (out / "keep.txt").read_text() == "mine"
        assert "use --force" not in err and sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    out = earlier_run
    code, _, err = run_cli(capsys, "run", *FAST, "--out", str(out))
    assert code == 2 and "holds an earlier lossscale output; use --force" in err
    code, _, _ = run_cli(capsys, "run", *FAST, "--out", str(out), "--force")
    assert code == 0 and (out / "trajectory.csv").exists()
    assert not list(out.glob(".*.tmp"))  # no temporary files left behind


def test_run_files_schema_and_determinism(capsys, tmp_path, earlier_run) -> None:
    a, b = earlier_run, tmp_path / "b"  # the same settings, run in another test's set-up
    code, stdout, _ = run_cli(capsys, "run", *FAST, "--out", str(b))
    assert code == 0 and "exponential" in stdout and "wrote" in stdout
    for name in ("trajectory.csv", "summary.json", "scale.png"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    rows = list(csv.DictReader((a / "trajectory.csv").open()))
    assert tuple(rows[0]) == COLUMNS and len(rows) == 60
    assert [int(r["step"]) for r in rows] == list(range(60))
    assert all(len(r["register"].split()) == 8 for r in rows)
    summary = json.loads((a / "summary.json").read_text())
    for key in ("arguments", "versions", "final", "baseline_float32", "skipped_steps", "overflow_steps",
                "mean_underflow_fraction", "undetected_overflow_steps", "manager", "profile"):
        assert key in summary, key
    assert set(summary["final"]) == {"loss", "accuracy"}
    skipped = sum(r["applied"] == "0" for r in rows)
    assert summary["skipped_steps"] == skipped and summary["overflow_steps"] == sum(r["overflow"] == "1" for r in rows)
    # The files read back into the same records.
    back = read_run(a)
    assert back.records[5]["loss_scale"] == float(rows[5]["loss_scale"])


def test_plot_shows_scale_markers_and_loss(tmp_path) -> None:
    run = simulate(steps=130)
    fig = figure_run(run)
    top, bottom = fig.axes[:2]
    assert top.get_ylabel() == "loss scale" and fig.axes[-1].get_xlabel() == "step" and bottom.get_ylabel() == "loss"
    lines = {line.get_label(): line for line in top.get_lines()}
    overflow_steps = run.column("step")[run.column("overflow").astype(bool)]
    assert np.array_equal(lines["register event"].get_xdata(), overflow_steps) and overflow_steps.size > 0
    skipped = run.column("step")[~run.column("applied").astype(bool)]
    assert np.array_equal(lines["skipped step"].get_xdata(), skipped)
    assert lines["register event"].get_marker() == "x"
    scale = lines["loss scale"].get_ydata()
    assert scale[0] == 32 and scale.min() < 32 and scale[-1] > scale.min()  # backoff, then growth
    assert {line.get_label() for line in bottom.get_lines()} == {"binary16 on the device", "binary32 baseline"}


def test_plot_command_redraws(capsys, tmp_path, earlier_run) -> None:
    out = earlier_run
    first = (out / "scale.png").read_bytes()
    (out / "scale.png").unlink()
    assert run_cli(capsys, "plot", str(out))[0] == 0
    assert (out / "scale.png").read_bytes() == first
    code, _, err = run_cli(capsys, "plot", str(tmp_path / "nothing"))
    assert code == 2 and "nothing' does not exist" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(capsys, "plot", str(tmp_path / "empty"))
    assert code == 2 and "holds no run, compare, sweep or replay output" in err


def test_compare_and_profiles(capsys, tmp_path) -> None:
    out = tmp_path / "cmp"
    code, stdout, _ = run_cli(capsys, "compare", "--manager", "exponential", "--manager", "torch",
                              "--steps", "30", "--quiet", "--out", str(out))
    assert code == 0 and (out / "compare.png").exists()
    assert (out / "exponential" / "trajectory.csv").exists() and (out / "torch" / "summary.json").exists()
    assert "torch" in stdout and "exponential" in stdout
    code, stdout, _ = run_cli(capsys, "profiles")
    assert code == 0 and "atlas-training" in stdout and "SATURATION (default SATURATION)" in stdout


def test_saturation_with_isfinite_lets_overflow_through() -> None:
    good = simulate(profile="atlas-training", steps=80)
    naive = simulate(profile="atlas-training", detector="isfinite", steps=80)
    assert good.summary["undetected_overflow_steps"] == 0 and good.summary["skipped_steps"] > 0
    assert naive.summary["undetected_overflow_steps"] == naive.summary["overflow_steps"] > 0
    assert naive.summary["final"]["accuracy"] < good.summary["final"]["accuracy"] - 0.3


def test_ranks_skip_together_and_stay_in_step() -> None:
    run = simulate(profile="atlas-training", ranks=4, steps=40)
    assert run.summary["skipped_steps"] > 0
    one = simulate(profile="atlas-training", ranks=1, steps=40)
    assert run.summary["skipped_steps"] == one.summary["skipped_steps"]  # same scale schedule on any rank count


def test_force_leaves_no_file_of_the_earlier_run(capsys, tmp_path) -> None:
    """--force replaces the folder: an FP8 run's fp8.csv does not survive a run without FP8,
    and redrawing draws no FP8 figure for it."""
    out = tmp_path / "x"
    fp8 = ["--profile", "atlas-350", "--fp8", "delayed"]
    assert main(["run", *fp8, "--steps", "4", "--out", str(out), "--quiet"]) == 0
    assert (out / "fp8.csv").exists()
    assert main(["run", "--manager", "torch", "--steps", "4", "--out", str(out), "--force", "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "events.csv", "events.png", "scale.png", "summary.json",
                                                      "trajectory.csv"]
    capsys.readouterr()
    assert main(["plot", str(out)]) == 0
    assert "fp8" not in capsys.readouterr().out
    assert not list(tmp_path.glob(".x.*"))  # no staging folder left behind


def test_a_folder_filled_meanwhile_is_left_alone_and_the_run_kept(tmp_path) -> None:
    """Two runs into one empty folder: the second to finish changes nothing of the first's files
    and says where its own are."""
    from lossscale.app.files import staged

    out = tmp_path / "x"
    out.mkdir()
    with pytest.raises(ValueError, match=r"was filled by another run \(or given other files\) while this one ran"
                                         r".*'.*x-2'"):
        with staged(out, force=False) as stage:
            (stage / "trajectory.csv").write_text("mine\n")
            (out / "trajectory.csv").write_text("theirs\n")  # the other run finished first
    assert (out / "trajectory.csv").read_text() == "theirs\n"
    assert (tmp_path / "x-2" / "trajectory.csv").read_text() == "mine\n"
    with pytest.raises(RuntimeError), staged(tmp_path / "y", force=False) as stage:
        (stage / "half").write_text("")
        raise RuntimeError("the run failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x", "x-2"]  # nothing half-written


def test_workload_text_arguments_and_repeated_keys(capsys, tmp_path) -> None:
    """A workload argument may be text (the workload checks it); a key given twice is refused."""
    pytest.importorskip("torch")
    out = tmp_path / "bf16"
    assert main(["run", "--workload", "torch-mlp", "--workload-arg", "dtype=bfloat16", "--steps", "2",
                 "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / "summary.json").read_text())["arguments"]["workload_args"] == {"dtype": "bfloat16"}
    assert main(["run", "--manager-arg", "init_loss_scale=8", "--manager-arg", "init_loss_scale=16",
                 "--out", str(tmp_path / "twice")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["lossscale: error: --manager-arg gives init_loss_scale twice (8 and '16'); give it once"]
    assert not (tmp_path / "twice").exists()


def test_run_and_compare_draw_in_the_format_asked(capsys, tmp_path) -> None:
    out = tmp_path / "svg"
    assert main(["run", "--steps", "6", "--quiet", "--format", "svg", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "events.csv", "events.svg", "scale.svg", "summary.json",
                                                      "trajectory.csv"]
    assert (out / "scale.svg").read_bytes().lstrip().startswith(b"<?xml")
    cmp = tmp_path / "pdf"
    assert main(["compare", "--manager", "torch", "--manager", "fixed", "--steps", "4", "--quiet", "--no-events",
                 "--format", "pdf", "--out", str(cmp)]) == 0
    assert (cmp / "compare.pdf").read_bytes().startswith(b"%PDF") and not (cmp / "compare.png").exists()
    assert sorted(p.name for p in (cmp / "torch").iterdir()) == ["scale.pdf", "summary.json", "trajectory.csv"]
    assert "compare.pdf" in capsys.readouterr().out
    code, _, err = run_cli(capsys, "run", "--format", "gif")
    assert code == 2 and "invalid choice: 'gif'" in err


def test_run_help_lists_each_workload_and_its_arguments(capsys) -> None:
    from lossscale.training.workloads import WORKLOADS

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    listing = text[text.index("workloads and their --workload-arg"):]
    assert [line.split(":")[0].strip() for line in listing.splitlines()[1:]] == [*WORKLOADS, "package.module"]
    assert "  mlp: hidden=32, batch=64, learning_rate=0.1, momentum=0.9, log_perplexity=False" in listing
    assert "  trace: size=4096, batch=1, learning_rate=0.01, drift=0.15, spike_rate=0.03, spread=3.0" in listing
