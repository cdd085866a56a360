"""Sweeps: the grid file, failing points, resuming after a kill, and the Dask path."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT  # tests/ is on the path (conftest.py)

from lossscale.app.sweep import RESULT_COLUMNS, load_grid, points, run_sweep

GRID = """
[sweep]
workload = "trace"
steps = 20

[grid]
manager = ["exponential", "torch"]
profile = ["atlas-a2", "atlas-training"]
overflow_mode = ["inf_nan"]
seed = [0, 1]
"""


def grid(tmp_path: Path, text: str = GRID) -> Path:
    path = tmp_path / "grid.toml"
    path.write_text(text)
    return path


def valid_lines(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


@pytest.mark.parametrize("text, message", [
    ("[grid]\nmanagers = ['torch']", "unknown sweep argument 'managers'"),
    ("[grid]\nmanager = []", "must be a non-empty list"),
    ("[sweeps]\nsteps = 3", "unknown tables sweeps"),
    ("[sweep]\nsteps = 3\n[grid]\nsteps = [1, 2]", "both fixed"),
    ("[grid\n", "not valid TOML"),
])
def test_grid_file_errors(tmp_path, text, message) -> None:
    with pytest.raises(ValueError, match=message):
        load_grid(grid(tmp_path, text))


def test_points_and_failures_are_recorded(tmp_path) -> None:
    fixed, axes = load_grid(grid(tmp_path))
    assert len(points(fixed, axes)) == 8
    rows = run_sweep(grid(tmp_path), tmp_path / "out", workers=2)
    assert [r["index"] for r in rows] == list(range(8))
    failed = [r for r in rows if r["status"] == "error"]
    # Atlas training series supports saturation only: those points fail and are recorded, the others run.
    assert len(failed) == 4 and all(r["profile"] == "atlas-training" for r in failed)
    assert all("supports SATURATION" in r["error"] for r in failed)
    assert all(r["status"] == "ok" and r["steps_run"] == 20 for r in rows if r["profile"] == "atlas-a2")
    header = (tmp_path / "out" / "results.csv").read_text().splitlines()[0].split(",")
    assert tuple(header) == RESULT_COLUMNS
    assert (tmp_path / "out" / "sweep.png").stat().st_size > 0


#: A sweep that SIGKILLs its own process group (itself, the forkserver and the worker) from the
#: progress callback, which run_sweep calls once a point's line is written and synced: the kill
#: lands after exactly KILL_AFTER points, whatever the machine's speed.
KILLED_SWEEP = """
import os, signal, sys
from lossscale.app.sweep import run_sweep

def stop(done, total, failed, eta):
    if done == int(sys.argv[3]):
        os.killpg(0, signal.SIGKILL)

run_sweep(sys.argv[1], sys.argv[2], workers=1, progress=stop)
"""
KILL_AFTER = 3


def test_resume_after_a_kill_loses_nothing_and_repeats_nothing(tmp_path) -> None:
    text = GRID.replace('seed = [0, 1]', "seed = [0, 1, 2, 3, 4]").replace('overflow_mode = ["inf_nan"]', "")
    g, out = grid(tmp_path, text), tmp_path / "out"
    killed = subprocess.run([sys.executable, "-c", KILLED_SWEEP, str(g), str(out), str(KILL_AFTER)],
                            start_new_session=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    log = out / "points.jsonl"
    before = valid_lines(log)
    assert len(before) == KILL_AFTER and not (out / "results.csv").exists()
    with open(log, "a") as f:
        f.write('{"key": "torn')  # a line cut short by the kill
    cmd = [sys.executable, "-m", "lossscale", "sweep", str(g), "--out", str(out), "--workers", "1", "--quiet"]
    subprocess.run(cmd, check=True, timeout=300)
    after = valid_lines(log)
    keys = [r["key"] for r in after]
    assert len(keys) == len(set(keys)) == 20  # every point once
    assert after[:len(before)] == before  # what was done before the kill was kept, not run again
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 21


@pytest.mark.slow
def test_dask_gives_the_same_table_as_local(tmp_path) -> None:
    distributed = pytest.importorskip("distributed")
    g = grid(tmp_path)
    run_sweep(g, tmp_path / "local", workers=2)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        run_sweep(g, tmp_path / "dask", scheduler=cluster.scheduler_address)
    assert (tmp_path / "dask" / "results.csv").read_bytes() == (tmp_path / "local" / "results.csv").read_bytes()


def test_a_value_twice_and_a_heat_map_over_one_axis_are_refused(tmp_path) -> None:
    from lossscale.app.sweep import heatmap_axes

    grid = tmp_path / "grid.toml"
    grid.write_text('[sweep]\nworkload = "trace"\n[grid]\nseed = [0, 0, 1]\n')
    with pytest.raises(ValueError, match=r"grid axis 'seed' lists 0 more than once"):
        load_grid(grid)
    rows = [{"manager": "torch", "seed": "0", "profile": "atlas-a2"}, {"manager": "keras", "seed": "1",
                                                                       "profile": "atlas-a2"}]
    with pytest.raises(ValueError, match="two different axes, got 'manager' twice"):
        heatmap_axes(rows, ("manager", "manager"))
    with pytest.warns(UserWarning, match=r"'profile' does not vary in this sweep \(one value: 'atlas-a2'\); "
                                         r"axes that do: manager, seed"):
        assert heatmap_axes(rows, ("manager", "profile")) == ("manager", "profile")


def test_the_example_grid_has_a_second_axis_that_shows_a_difference() -> None:
    """examples/sweep-trace.toml: its heat maps' two default axes (manager, detector) both vary,
    and the detector changes the skipped steps of one manager and seed."""

    from lossscale.app.sweep import heatmap_axes, run_point

    fixed, axes = load_grid(ROOT / "examples" / "sweep-trace.toml")
    grid = points(fixed, axes)
    assert len(grid) == 200 and heatmap_axes(grid) == ("manager", "detector")
    pair = [p for p in grid if p["manager"] == "torch" and p["seed"] == 0]
    skipped = {p["detector"]: run_point(p)["skipped_steps"] for p in pair}
    assert skipped["isfinite"] == 0 < skipped["tf-npu"]


def test_a_heat_map_never_averages_a_varying_setting_unsaid() -> None:
    """Issue 31, item 10: profile x manager x detector, drawn over the first two, says in the
    title that each cell averages over the detector (tf-npu with isfinite); a grid whose only
    other varying axis is the seed says nothing, and its default axes put the seed last."""
    from lossscale.app.plots import figure_heatmaps
    from lossscale.app.sweep import AXES, heatmap_axes

    rows = [{"manager": m, "profile": p, "detector": d, "seed": s, "status": "ok", "skipped_steps": 1,
             "final_loss": 0.5} for m in ("torch", "keras") for p in ("atlas-a2", "atlas-training")
            for d in ("tf-npu", "isfinite") for s in (0, 1)]
    axes = heatmap_axes(rows)
    assert axes == ("manager", "profile")
    title = figure_heatmaps(rows, *axes, over=AXES)._suptitle
    assert title is not None and "each cell averages over detector (tf-npu, isfinite)" in title.get_text()
    assert "seed" not in title.get_text()
    assert figure_heatmaps(rows, "manager", "detector", over=AXES)._suptitle.get_text().startswith(
        "each cell averages over profile (atlas-a2, atlas-training)")
    two = [r for r in rows if r["detector"] == "tf-npu" and r["profile"] == "atlas-a2"]
    assert heatmap_axes(two) == ("manager", "seed")
    assert figure_heatmaps(two, "manager", None, over=AXES)._suptitle is None
    micro = [{"seed": s, "micro_batches": k, "status": "ok"} for s in (0, 1) for k in (1, 2)]
    assert heatmap_axes(micro) == ("micro_batches", "seed")
