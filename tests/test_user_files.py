"""Nothing the user wrote is removed: ``--force`` replaces only what lossscale wrote into a folder
(its manifest lists those files), refuses a folder holding anything else with or without it, in
every command, and never takes the current folder or one that holds it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lossscale.app.cli import main
from lossscale.app.files import MANIFEST, foreign_files, own_files, staged

FAST = ["--steps", "3", "--quiet"]
SWEEP = '[sweep]\nworkload = "trace"\nsteps = 4\n[grid]\nseed = [0, 1]\n'


def cli(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def refused(code: int, err: str, *words: str) -> None:
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under folder and its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def a_log(tmp_path: Path) -> Path:
    from test_replay import DS, deepspeed_log

    log = tmp_path / "ds.log"
    log.write_text(deepspeed_log([False, True, False], **DS))
    return log


@pytest.mark.parametrize("command", ["run", "compare", "replay"])
def test_force_never_removes_the_users_files(capsys, tmp_path, monkeypatch, command) -> None:
    """The issue's case: --out names the parent of the current folder, which holds the user's files
    beside it; and a folder holding the user's files two levels down. Refused with and without
    --force; every file, and the current folder, as it was."""
    mine = tmp_path / "a" / "b"
    mine.mkdir(parents=True)
    (mine / "mine.txt").write_text("keep")
    (tmp_path / "a" / "sibling.txt").write_text("keep2")
    exp = tmp_path / "exp2"
    (exp / "sub").mkdir(parents=True)
    (exp / "notes.txt").write_text("notes")
    (exp / "sub" / "deep.txt").write_text("deep")
    monkeypatch.chdir(mine)
    args = {"run": ["run", *FAST], "compare": ["compare", "--manager", "torch", "--manager", "fixed", *FAST],
            "replay": ["replay", a_log(tmp_path)]}[command]
    before = tree(tmp_path)
    for out in (tmp_path / "a", exp):
        for force in ([], ["--force"]):
            code, err = cli(capsys, *args, "--out", out, *force)
            if out == exp:
                refused(code, err, "holds files lossscale did not write", "notes.txt", "sub/deep.txt")
            else:
                refused(code, err, "is the current folder or holds it")
    assert tree(tmp_path) == before and Path.cwd() == mine
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith((".writing", ".replaced"))]


def test_the_current_folder_is_refused(capsys, tmp_path, monkeypatch) -> None:
    """--out . and --out .. (and a path that comes back to either) get a one-line error before any
    work, not a rename's errno."""
    here = tmp_path / "work"
    (here / "sub").mkdir(parents=True)
    monkeypatch.chdir(here)
    for out in (".", "..", "sub/..", str(here)):
        for force in ([], ["--force"]):
            refused(*cli(capsys, "run", *FAST, "--out", out, *force), "is the current folder or holds it")
    assert list(tmp_path.iterdir()) == [here] and list(here.iterdir()) == [here / "sub"]


def test_force_replaces_what_lossscale_wrote(capsys, tmp_path) -> None:
    """A run folder (and the plots `plot` redrew into it, which join its manifest) is lossscale's:
    --force replaces it whole. A file the user put there makes it the user's."""
    out = tmp_path / "run"
    assert cli(capsys, "run", *FAST, "--out", out)[0] == 0
    assert own_files(out) == {p.name for p in out.iterdir() if p.name != MANIFEST}
    assert cli(capsys, "plot", out, "--format", "svg")[0] == 0
    assert "scale.svg" in own_files(out) and foreign_files(out) == []
    refused(*cli(capsys, "run", *FAST, "--out", out), "holds an earlier lossscale output; use --force")
    assert cli(capsys, "run", *FAST, "--out", out, "--force")[0] == 0
    assert not (out / "scale.svg").exists()
    (out / "notes.md").write_text("my notes")
    code, err = cli(capsys, "run", *FAST, "--out", out, "--force")
    refused(code, err, "did not write (notes.md)", "--force replaces only what lossscale wrote")
    assert (out / "notes.md").read_text() == "my notes"


def test_a_file_put_there_during_a_forced_run_is_kept(capsys, tmp_path) -> None:
    """--force checks again when the run ends: a file the user put into the old output meanwhile
    keeps the old folder whole, and the new run goes beside it."""
    out = tmp_path / "run"
    assert cli(capsys, "run", *FAST, "--out", out)[0] == 0
    before = tree(out)
    with pytest.raises(ValueError, match="x|run-2"), staged(out, force=True) as stage:
        (stage / "trajectory.csv").write_text("new\n")
        (out / "later.txt").write_text("mine")
    assert tree(out) == {**before, "later.txt": b"mine"}
    assert (tmp_path / "run-2" / "trajectory.csv").read_text() == "new\n"
    assert json.loads((tmp_path / "run-2" / MANIFEST).read_text())["files"] == ["trajectory.csv"]


def test_sweep_force_starts_over_only_its_own_folder(capsys, tmp_path) -> None:
    """sweep --force as run's: it starts a sweep folder over, and refuses one holding the user's
    files (a resume, which removes nothing, still runs beside them)."""
    grid = tmp_path / "grid.toml"
    grid.write_text(SWEEP)
    out = tmp_path / "sweep"
    sweep = ["sweep", grid, "--out", out, "--workers", "1", "--quiet"]
    assert cli(capsys, *sweep)[0] == 0
    assert own_files(out) == {"grid.toml", "points.jsonl", "results.csv", "sweep.png"}
    (out / "notes.txt").write_text("mine")
    assert cli(capsys, *sweep)[0] == 0  # resumed: nothing of the user's touched
    before = tree(out)
    refused(*cli(capsys, *sweep, "--force"), "did not write (notes.txt)", "--force replaces only what lossscale wrote")
    assert tree(out) == before
    (out / "notes.txt").unlink()
    points = (out / "points.jsonl").read_text()
    assert cli(capsys, *sweep, "--force")[0] == 0
    assert (out / "points.jsonl").read_text().count("\n") == points.count("\n") == 2  # run again, not appended
    run = tmp_path / "run"
    assert cli(capsys, "run", *FAST, "--out", run)[0] == 0
    refused(*cli(capsys, "sweep", grid, "--out", run, "--quiet"), "holds no sweep", "or --force")
    assert cli(capsys, "sweep", grid, "--out", run, "--quiet", "--force")[0] == 0  # lossscale's run, replaced
    assert sorted(own_files(run)) == ["grid.toml", "points.jsonl", "results.csv", "sweep.png"]
    assert sorted(p.name for p in run.iterdir()) == sorted([MANIFEST, "grid.toml", "points.jsonl", "results.csv",
                                                            "sweep.png"])
