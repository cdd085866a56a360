"""A new user's first runs: every bad input is one line and exit 2 with nothing half-written,
sweeps refuse typos before running, an interrupted run keeps what it finished, defaults and
effective arguments are visible, and the files are strict and ordinary."""

from __future__ import annotations

import gc
import json
import os
import signal
import stat
import weakref
from pathlib import Path

import numpy as np
import pytest

from lossscale import ExponentialUpdateLossScaleManager, Momentum, NPULossScaleOptimizer, simulate
from lossscale.app.cli import build_parser, main
from lossscale.policy import MANAGERS
from lossscale.training.optimizers import UnsupportedProductWarning
from lossscale.training.simulate import Interrupted
from sim import Device

FAST = ["--steps", "12", "--quiet"]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(code: int, err: str, message: str) -> None:
    assert code == 2 and err.count("\n") == 1 and err.startswith("lossscale: error: "), err
    assert message in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv, message", [
    (["run", "--ranks", "65", *FAST], "ranks=65 leaves 1 rank(s) without data: the batch has 64 examples"),
    (["run", "--manager", "torch", "--manager-arg", "init_scale=2**2000", *FAST],
     "init_scale must be finite (below 1.798e+308), got an integer of 2001 bits"),
    (["run", "--seed", "-3", *FAST], "argument --seed: must be an integer of at least 0, got '-3'"),
    (["run", "--profile", "atlas-inference", *FAST], "atlas-inference (Atlas inference series) does not support "
                                                    "NPULossScaleOptimizer"),
    (["run", "--manager-arg", "torch:growth_interval=3", *FAST], "names manager 'torch', which this run does not use"),
    (["run", "--defaults", "frameworks", *FAST], "invalid choice: 'frameworks'"),
])
def test_bad_run_input(capsys, tmp_path, monkeypatch, argv, message) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *argv)
    one_line(code, err, message)
    assert not (tmp_path / "runs").exists()


def test_out_needs_an_existing_parent(capsys, tmp_path) -> None:
    code, _, err = run_cli(capsys, "run", *FAST, "--out", tmp_path / "no" / "such" / "run")
    one_line(code, err, "does not exist; create it first")
    assert not (tmp_path / "no").exists()


def test_plot_names_what_is_wrong(capsys, tmp_path, earlier_run) -> None:
    (tmp_path / "file.txt").write_text("x")
    one_line(*run_cli(capsys, "plot", tmp_path / "file.txt")[::2], "is not a folder")
    one_line(*run_cli(capsys, "plot", tmp_path / "missing")[::2], "missing' does not exist")
    out = earlier_run
    (out / "summary.json").write_text('{"arguments": ')
    one_line(*run_cli(capsys, "plot", out)[::2], "summary.json' is not valid JSON")
    assert run_cli(capsys, "run", *FAST, "--out", out, "--force")[0] == 0
    text = (out / "trajectory.csv").read_text()
    (out / "trajectory.csv").write_text(text[: len(text) // 2])  # cut mid-row
    one_line(*run_cli(capsys, "plot", out)[::2], "trajectory.csv' line")
    (out / "trajectory.csv").write_text("step,loss\n0,1\n")
    one_line(*run_cli(capsys, "plot", out)[::2], "does not have the columns")


@pytest.mark.slow  # test_cli's test_run_and_compare_draw_in_the_format_asked keeps the formats in the default run
def test_plot_redraws_every_kind_of_output_in_every_format(capsys, tmp_path) -> None:
    run, cmp = tmp_path / "run", tmp_path / "cmp"
    assert run_cli(capsys, "run", *FAST, "--out", run)[0] == 0
    assert run_cli(capsys, "compare", *FAST, "--manager", "torch", "--manager", "fixed", "--out", cmp)[0] == 0
    for fmt, magic in (("svg", b"<?xml"), ("pdf", b"%PDF")):
        assert run_cli(capsys, "plot", run, "--format", fmt)[0] == 0
        assert (run / f"scale.{fmt}").read_bytes().startswith(magic)
        assert run_cli(capsys, "plot", cmp, "--format", fmt)[0] == 0
        assert (cmp / f"compare.{fmt}").read_bytes().startswith(magic)
    first = (cmp / "compare.png").read_bytes()
    (cmp / "compare.png").unlink()
    assert run_cli(capsys, "plot", cmp)[0] == 0 and (cmp / "compare.png").read_bytes() == first


# -- sweeps ------------------------------------------------------------------------------
def sweep_cli(capsys, tmp_path, text: str, out_name: str = "out", *extra: str):
    grid = tmp_path / f"{out_name}.toml"
    grid.write_text(text)
    return run_cli(capsys, "sweep", grid, "--out", tmp_path / out_name, "--workers", "1", "--quiet", *extra)


def test_sweep_checks_every_point_before_running(capsys, tmp_path) -> None:
    text = """[sweep]
workload = "trace"
steps = "20"
[grid]
manager = ["torch", "torhc", {name = "keras", growth_interval = 3}]
profile = ["atlas-a2", "atlas-9"]
manager_args = [{}, {bogus = 1}]
"""
    code, out, err = sweep_cli(capsys, tmp_path, text)
    lines = err.splitlines()
    assert code == 2 and all(line.startswith("lossscale: error: ") for line in lines) and "Traceback" not in err
    assert any("steps must be an integer from 1 to 10,000,000, got '20' (12 of 12 points)" in line
               for line in lines)
    assert any("unknown manager 'torhc'" in line for line in lines)
    assert any("unknown profile 'atlas-9'" in line and "(6 of 12 points)" in line for line in lines)
    assert any("manager 'keras' takes no argument 'growth_interval'" in line for line in lines)
    assert any("manager 'torch' takes no argument 'bogus'" in line for line in lines)
    assert len(lines) == len(set(lines))  # each problem once
    assert not (tmp_path / "out").exists()


def test_sweep_grid_and_folder_errors(capsys, tmp_path) -> None:
    one_line(*sweep_cli(capsys, tmp_path, "[sweep]\nsteps = 3\n[grid]\n")[::2], "has no axes")
    good = '[sweep]\nworkload = "trace"\nsteps = 5\n[grid]\nseed = [0, 1]\n'
    assert sweep_cli(capsys, tmp_path, good)[0] == 0
    assert sweep_cli(capsys, tmp_path, good)[0] == 0  # the same grid resumes
    other = good.replace("[0, 1]", "[0, 1, 2]")
    one_line(*sweep_cli(capsys, tmp_path, other)[::2], "holds the sweep of a different grid")
    assert sweep_cli(capsys, tmp_path, other, "out", "--force")[0] == 0
    (tmp_path / "out" / "sweep.png").unlink()
    assert run_cli(capsys, "plot", tmp_path / "out", "--heatmap", "seed,profile", "--format", "svg")[0] == 0
    assert (tmp_path / "out" / "sweep.svg").read_bytes().startswith(b"<?xml")
    one_line(*run_cli(capsys, "plot", tmp_path / "out", "--heatmap", "seed")[::2], "takes two sweep axes as ROW,COL")
    assert run_cli(capsys, "run", *FAST, "--out", tmp_path / "run")[0] == 0
    one_line(*sweep_cli(capsys, tmp_path, good, "run")[::2], "holds no sweep (no grid.toml)")


def test_sweep_pairs_manager_arguments_and_reports_failures_once(capsys, tmp_path) -> None:
    text = """[sweep]
workload = "trace"
steps = 5
[grid]
manager = ["exponential", {name = "torch", init_scale = 1024, growth_interval = 3}]
profile = ["atlas-a2", "atlas-training"]
overflow_mode = ["inf_nan"]
"""
    code, out, err = sweep_cli(capsys, tmp_path, text)
    assert code == 1 and "4 points (2 failed)" in out
    failures = [line for line in err.splitlines() if "point(s) failed" in line]
    assert len(failures) == 1 and failures[0].startswith("lossscale: 2 point(s) failed: ValueError: atlas-training")
    rows = (tmp_path / "out" / "results.csv").read_text().splitlines()
    torch = [r for r in rows if ",torch," in r]
    assert torch and all('""growth_interval"": 3' in r and '""init_scale"": 1024' in r for r in torch)
    exponential = [r for r in rows if ",exponential," in r]
    assert exponential and not any("growth_interval" in r for r in exponential)
    for line in (tmp_path / "out" / "points.jsonl").read_text().splitlines():  # strict JSON: no bare NaN
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


@pytest.mark.slow
def test_sweep_with_no_scheduler_listening(capsys, tmp_path) -> None:
    pytest.importorskip("distributed")
    code, _, err = sweep_cli(capsys, tmp_path, '[grid]\nseed = [0]\n', "out", "--scheduler", "tcp://127.0.0.1:9")
    one_line(code, err, "could not reach the Dask scheduler at 'tcp://127.0.0.1:9'")
    assert not (tmp_path / "out").exists()


# -- interrupted runs ------------------------------------------------------------------
def test_ctrl_c_keeps_the_finished_steps(monkeypatch) -> None:
    def progress(done, total):
        if done == 5:  # raised in this thread: its handler has run when raise_signal returns (os.kill's
            signal.raise_signal(signal.SIGINT)  # may reach another thread first and be handled a step late)
    with pytest.raises(Interrupted) as info:
        simulate(steps=50, progress=progress)
    run = info.value.run
    assert len(run.records) == 5 and run.summary["interrupted"] and run.summary["steps_run"] == 5
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back


def test_ctrl_c_in_the_cli_writes_the_partial_run(capsys, tmp_path, monkeypatch) -> None:
    import lossscale.app.cli as cli
    monkeypatch.setattr(cli, "_progress", lambda quiet, name: lambda done, total: done == 7 and signal.raise_signal(
        signal.SIGINT))
    code, out, err = run_cli(capsys, "run", "--steps", "40", "--out", tmp_path / "r")
    assert code == 130 and "interrupted: wrote the 7 finished steps" in err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["steps_run"] == 7
    assert len((tmp_path / "r" / "trajectory.csv").read_text().splitlines()) == 8


# -- the NPULossScaleOptimizer page's support table ------------------------------------------------------------
def test_npu_loss_scale_optimizer_refuses_unsupported_products() -> None:
    for profile in ("atlas-inference", "atlas-200i-500-a2"):
        with pytest.raises(ValueError, match="does not support NPULossScaleOptimizer"):
            NPULossScaleOptimizer(Momentum(0.1), ExponentialUpdateLossScaleManager(2**10, 10), device=Device(profile))
        with Device(profile) as dev:  # the device found at the first decision
            opt = NPULossScaleOptimizer(Momentum(0.1), ExponentialUpdateLossScaleManager(2**10, 10))
            with pytest.raises(ValueError, match="allow_unsupported=True"):
                opt.apply_gradients([(np.ones(2, np.float32), np.zeros(2, np.float32))])
        with pytest.warns(UnsupportedProductWarning):
            NPULossScaleOptimizer(Momentum(0.1), ExponentialUpdateLossScaleManager(2**10, 10), device=dev,
                                  allow_unsupported=True)
    NPULossScaleOptimizer(Momentum(0.1), ExponentialUpdateLossScaleManager(2**10, 10), device=Device("atlas-a2"))


def test_unsupported_product_runs_when_allowed_and_says_so(capsys, tmp_path) -> None:
    code, out, _ = run_cli(capsys, "run", "--profile", "atlas-inference", "--allow-unsupported", *FAST,
                           "--out", tmp_path / "r")
    assert code == 0 and "note: atlas-inference (Atlas inference series) does not support" in out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert any("run anyway (allow_unsupported)" in w for w in summary["profile"]["warnings"])
    assert run_cli(capsys, "run", "--profile", "atlas-inference", "--detector", "torch-npu", *FAST,
                   "--out", tmp_path / "t")[0] == 0  # another framework's check is not that page's to refuse


# -- optimizer slots -----------------------------------------------------------------------
def test_optimizer_slots_belong_to_the_array_not_its_id() -> None:
    opt = Momentum(0.1, 0.9)
    v = np.zeros(3, np.float32)
    opt.apply_gradients([(np.ones(3, np.float32), v)])
    assert len(opt._slots) == 1
    del v
    gc.collect()
    assert opt._slots == {}  # a dead variable's momentum is dropped, not left for its id's next owner
    w, other = np.zeros(3, np.float32), np.zeros(3, np.float32)
    opt._slots[id(w)] = (weakref.ref(other), {"accum": np.full(3, 100, np.float32)})  # as if id(w) were reused
    opt.apply_gradients([(np.ones(3, np.float32), w)])
    assert w.tolist() == [np.float32(-0.1)] * 3  # fresh momentum: lr * grad


# -- files ---------------------------------------------------------------------------------
def test_output_files_have_ordinary_modes(capsys, tmp_path) -> None:
    assert run_cli(capsys, "run", *FAST, "--out", tmp_path / "r")[0] == 0
    umask = os.umask(0)
    os.umask(umask)
    for path in (tmp_path / "r").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path.name


# -- defaults, help and names ----------------------------------------------------------------
def test_framework_defaults_and_the_printed_arguments(capsys, tmp_path) -> None:
    code, out, _ = run_cli(capsys, "run", "--manager", "torch", "--defaults", "framework", *FAST, "--out",
                           tmp_path / "f")
    assert code == 0
    assert ("manager torch (TorchGradScaler, the framework's defaults): init_scale=65536, growth_factor=2, "
            "backoff_factor=0.5, growth_interval=2000") in out
    summary = json.loads((tmp_path / "f" / "summary.json").read_text())
    assert summary["manager"]["arguments"]["init_scale"] == 2.0**16 and summary["manager"]["defaults"] == "framework"
    code, out, _ = run_cli(capsys, "run", "--manager", "torch", *FAST, "--out", tmp_path / "d")
    assert "init_scale=2**32 (demo)" in out and "growth_interval=50 (demo)" in out
    assert "demo settings; --defaults framework for the framework's own" in out


def test_managers_lists_every_manager_with_its_arguments(capsys) -> None:
    code, out, _ = run_cli(capsys, "managers")
    assert code == 0
    for name, (cls, _) in MANAGERS.items():
        assert f"{name}: {cls.__name__}, " in out
    assert "torch.amp.GradScaler" in out and "growth_interval            framework 2000   demo 50" in out
    assert "incr_every_n_steps         framework 1000 (required; Ascend's example: 2**32 and 1000)   demo 50" in out


def test_every_option_has_help_and_the_version(capsys) -> None:
    parser = build_parser()
    subs = next(a for a in parser._actions if a.dest == "command").choices
    for name, sub in subs.items():
        assert sub.description, name
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings}"
    with pytest.raises(SystemExit):
        parser.parse_args(["--version"])
    assert capsys.readouterr().out.startswith("lossscale 0.")
    assert "(default: 300)" in subs["run"].format_help()


@pytest.mark.slow
def test_run_folder_names_tell_runs_apart(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for extra in ([], ["--manager-arg", "incr_every_n_steps=7"], ["--detector", "isfinite"], ["--ranks", "2"]):
        assert run_cli(capsys, "run", *FAST, *extra)[0] == 0
    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(names) == 4 and not any(n.endswith("-2") for n in names)
    assert any("-isfinite-" in n for n in names) and any("-r2-" in n for n in names)


@pytest.mark.slow
def test_compare_takes_arguments_for_one_manager_and_names_it_in_progress(capsys, tmp_path) -> None:
    code, out, err = run_cli(capsys, "compare", "--manager", "torch", "--manager", "keras", "--steps", "100",
                             "--manager-arg", "torch:growth_interval=7", "--out", tmp_path / "c")
    assert code == 0 and "torch: step 100/100" in err and "keras: step 100/100" in err
    torch = json.loads((tmp_path / "c" / "torch" / "summary.json").read_text())["manager"]["arguments"]
    keras = json.loads((tmp_path / "c" / "keras" / "summary.json").read_text())["manager"]["arguments"]
    assert torch["growth_interval"] == 7 and keras["dynamic_growth_steps"] == 50
    code, _, err = run_cli(capsys, "compare", "--manager", "torch", "--manager", "keras", *FAST,
                           "--manager-arg", "growth_interval=7", "--out", tmp_path / "d")
    one_line(code, err, "manager 'keras' takes no argument 'growth_interval'")
    assert not (tmp_path / "d").exists()


# -- a manager's scale, checked every step -------------------------------------------------
class _Fixed:
    """A user's scaler that always gives the same scale."""

    def __init__(self, scale):
        self.scale = scale

    def get_loss_scale(self):
        return self.scale

    def update_loss_scale(self, finite):
        pass


@pytest.mark.parametrize("scale, error, message", [
    (float("nan"), ValueError, "manager _Fixed gave loss scale nan for step 0: a loss scale must be finite and "
                               "above 0"),
    (-1024.0, ValueError, "gave loss scale -1024.0 for step 0: a loss scale must be finite and above 0"),
    (0.0, ValueError, "gave loss scale 0.0 for step 0"),
    (float("inf"), ValueError, "gave loss scale inf for step 0"),
    ("1024", TypeError, "gave loss scale '1024' for step 0: get_loss_scale() must return a real number"),
    (True, TypeError, "not a bool"),
])
def test_a_managers_bad_scale_is_named_with_its_step(scale, error, message) -> None:
    with pytest.raises(error) as info:
        simulate(workload="trace", manager=_Fixed(scale), steps=3)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_scale_that_goes_bad_later_names_that_step_and_rank() -> None:
    class Sinking(_Fixed):
        def update_loss_scale(self, finite):
            self.scale -= 512.0  # 1024, 512, 0: the third step's scale is refused

    with pytest.raises(ValueError, match=r"manager Sinking gave loss scale 0.0 for step 2: "):
        simulate(workload="trace", manager=Sinking(1024.0), steps=5)
    made: list[Sinking] = []

    def make() -> Sinking:  # rank 0 starts at 2048, rank 1 at 1024 and reaches 0 first
        made.append(Sinking(1024.0 if made else 2048.0))
        return made[-1]

    with pytest.raises(ValueError, match=r"manager Sinking gave loss scale 0.0 for step 2 on rank 1: "):
        simulate(workload="trace", manager=make, steps=5, ranks=2)
    run = simulate(workload="trace", manager=_Fixed(np.float32(1024)), steps=2)  # numpy scalars are numbers
    assert [r["loss_scale"] for r in run.records] == [1024.0, 1024.0]


def test_a_frameworks_own_scale_may_reach_zero_as_the_framework_does() -> None:
    # torch's GradScaler has no floor: 2**-140 * 2**-20 underflows binary32 to 0 (and the run goes on, skipping)
    run = simulate(workload="trace", manager="torch", steps=4,
                   manager_args={"init_scale": 2.0**-140, "backoff_factor": 2.0**-20})
    scales = [r["loss_scale"] for r in run.records]
    assert scales[0] == 2.0**-140 and scales[-1] == 0.0 and run.summary["steps_run"] == 4


# -- workload arguments: declared types and ranges, checked before anything runs -----------
@pytest.mark.parametrize("arg, message", [
    ("hidden=0", "workload 'mlp': hidden must be an integer of at least 1, got 0"),
    ("hidden=-3", "workload 'mlp': hidden must be an integer of at least 1, got -3"),
    ("hidden=2.5", "workload 'mlp': hidden must be an integer of at least 1, got 2.5"),
    ("batch=0", "workload 'mlp': batch must be an integer from 1 to 1500, got 0"),
    ("batch=100000", "workload 'mlp': batch must be an integer from 1 to 1500, got 100000"),
    ("learning_rate=-0.1", "workload 'mlp': learning_rate must be a number above 0, got -0.1"),
    ("momentum=1", "workload 'mlp': momentum must be a number above 0 and below 1, got 1"),
    ("log_perplexity=yes", "workload 'mlp': log_perplexity must be true or false, got 'yes'"),
])
def test_bad_workload_arguments_are_one_line(capsys, tmp_path, monkeypatch, arg, message) -> None:
    monkeypatch.chdir(tmp_path)
    for command in (["run"], ["compare", "--manager", "torch", "--manager", "keras"]):
        code, out, err = run_cli(capsys, *command, "--workload-arg", arg, *FAST)
        one_line(code, err, message)
        assert not (tmp_path / "runs").exists() and not list(tmp_path.iterdir())


def test_workload_arguments_at_their_bounds_run() -> None:
    run = simulate(workload="mlp", workload_args={"hidden": 1, "batch": 1500, "learning_rate": 1, "momentum": 0.5},
                   steps=2)
    assert run.summary["steps_run"] == 2
    with pytest.raises(ValueError, match="workload 'trace': spike_rate must be a number from 0 to 1, got 1.5"):
        simulate(workload="trace", workload_args={"spike_rate": 1.5}, steps=2)


def test_sweeps_check_workload_arguments_and_ranks_up_front(capsys, tmp_path) -> None:
    text = """[sweep]
steps = 3
[grid]
workload_args = [{}, {hidden = 0}]
ranks = [1, 200]
"""
    code, out, err = sweep_cli(capsys, tmp_path, text)
    lines = err.splitlines()
    assert code == 2 and "Traceback" not in err and all(line.startswith("lossscale: error: ") for line in lines)
    assert any("workload 'mlp': hidden must be an integer of at least 1, got 0 (2 of 4 points)" in line
               for line in lines)
    assert any("ranks=200 leaves 136 rank(s) without data: the batch has 64 examples" in line for line in lines)
    assert not (tmp_path / "out").exists()


# -- FP8 on products without FP8 units -------------------------------------------------------
def test_fp8_is_refused_where_the_product_has_no_fp8_units(capsys, tmp_path) -> None:
    for profile in ("atlas-a2", "atlas-a3", "atlas-training"):
        code, _, err = run_cli(capsys, "run", "--fp8", "delayed", "--profile", profile, *FAST, "--out",
                               tmp_path / profile)
        one_line(code, err, f"{profile} (")
        assert "has no 8-bit float formats (no FP8 units)" in err and "profiles that have them: atlas-350" in err
        assert "--allow-unsupported" in err and not (tmp_path / profile).exists()
    code, out, _ = run_cli(capsys, "run", "--fp8", "current", "--profile", "atlas-a2", "--allow-unsupported", *FAST,
                           "--out", tmp_path / "emulated")
    assert code == 0 and "note: atlas-a2 (" in out and "emulated anyway (allow_unsupported)" in out
    summary = json.loads((tmp_path / "emulated" / "summary.json").read_text())
    assert any("emulated anyway" in w for w in summary["profile"]["warnings"]) and summary["fp8"]["tensors"] > 0
    code, out, _ = run_cli(capsys, "run", "--fp8", "current", "--profile", "atlas-350", *FAST, "--out",
                           tmp_path / "real")
    assert code == 0 and "note:" not in out
    code, out, _ = run_cli(capsys, "profiles")
    assert code == 0 and "atlas-a2           none (no FP8 units)" in out
    assert "atlas-350          hifloat8, float8_e4m3fn, float8_e5m2" in out


# -- output folders, resumed sweeps, printed scales ------------------------------------------
def test_an_unwritable_out_is_refused_before_the_run(capsys, tmp_path, monkeypatch) -> None:
    import lossscale.app.cli as cli
    import lossscale.app.files as files

    ran = []
    monkeypatch.setattr(cli, "simulate", lambda **kw: ran.append(kw))
    real = os.access
    locked = {tmp_path / "locked", tmp_path / "full"}
    monkeypatch.setattr(files.os, "access", lambda p, mode: Path(p) not in locked and real(p, mode))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.txt").write_text("x")
    for out, extra in ((tmp_path / "locked" / "run", []), (tmp_path / "full", ["--force"])):
        (tmp_path / "locked").mkdir(exist_ok=True)
        code, _, err = run_cli(capsys, "run", *FAST, "--out", out, *extra)
        one_line(code, err, "(permission denied) for output")
        assert "choose an --out you can write to" in err
    assert ran == []  # refused before the run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "locked"] and not any((tmp_path / "locked").iterdir())


@pytest.mark.skipif(os.geteuid() == 0, reason="permissions do not bind root")
def test_a_read_only_out_is_refused_before_the_run(capsys, tmp_path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        code, _, err = run_cli(capsys, "run", "--steps", "300", "--quiet", "--out", locked / "run")
        one_line(code, err, "cannot write to the folder")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


@pytest.mark.slow  # test_sweep's resume-after-a-kill stays in the default run
def test_a_resumed_sweep_says_how_many_points_it_reused(capsys, tmp_path) -> None:
    text = '[sweep]\nworkload = "trace"\nsteps = 3\n[grid]\nseed = [0, 1, 2]\n'
    code, out, _ = sweep_cli(capsys, tmp_path, text)
    assert code == 0 and "reused" not in out
    log = tmp_path / "out" / "points.jsonl"
    log.write_text(log.read_text().splitlines()[0] + "\n")  # as if stopped after one point
    code, out, _ = sweep_cli(capsys, tmp_path, text)
    assert code == 0 and f"reused 1 of 3 points from {log}; running the other 2" in out
    code, out, _ = sweep_cli(capsys, tmp_path, text)
    assert code == 0 and "reused 3 of 3 points" in out and "running the other 0" in out


def test_scales_print_as_powers_of_two(capsys, tmp_path) -> None:
    code, out, _ = run_cli(capsys, "run", "--manager", "fixed", "--manager-arg", "loss_scale=2**100", *FAST,
                           "--workload", "trace", "--out", tmp_path / "r")
    assert code == 0 and "loss_scale=2**100" in out and "e+30" not in out
    assert out.count("2**100") >= 2  # the arguments and the summary table's final scale
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["final_loss_scale"] == 2.0**100  # the file keeps the number
    assert "1.2676506002282294e+30" in (tmp_path / "r" / "trajectory.csv").read_text()
