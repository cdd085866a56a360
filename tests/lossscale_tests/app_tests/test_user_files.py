"""Nothing the user wrote is removed: ``--force`` replaces only what lossscale wrote into a folder
(its manifest lists those files), refuses a folder holding anything else with or without it, in
every command, and never takes the current folder or one that holds it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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
    from framework_logs import DS, deepspeed_log  # tests/ is on the path (tests/conftest.py)

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


def test_force_replaces_what_lossscale_wrote(capsys, earlier_run) -> None:
    """A run folder (and the plots `plot` redrew into it, which join its manifest) is lossscale's:
    --force replaces it whole. A file the user put there makes it the user's."""
    out = earlier_run
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


def test_a_file_put_there_during_a_forced_run_is_kept(tmp_path, earlier_run) -> None:
    """--force checks again when the run ends: a file the user put into the old output meanwhile
    keeps the old folder whole, and the new run goes beside it."""
    out = earlier_run
    before = tree(out)
    with pytest.raises(ValueError, match="x|earlier-2"), staged(out, force=True) as stage:
        (stage / "trajectory.csv").write_text("new\n")
        (out / "later.txt").write_text("mine")
    assert tree(out) == {**before, "later.txt": b"mine"}
    assert (tmp_path / "earlier-2" / "trajectory.csv").read_text() == "new\n"
    assert json.loads((tmp_path / "earlier-2" / MANIFEST).read_text())["files"] == ["trajectory.csv"]


def test_sweep_force_starts_over_only_its_own_folder(capsys, tmp_path, earlier_run) -> None:
    """sweep --force as run's: it starts a sweep folder over, and refuses one holding the user's
    files (a resume, which removes nothing, still runs beside them)."""
    grid = tmp_path / "grid.toml"
    grid.write_text(SWEEP)
    out = tmp_path / "sweep"
    sweep = ["sweep", grid, "--out", out, "--workers", "1", "--quiet"]
    assert cli(capsys, *sweep)[0] == 0
    assert own_files(out) == {"grid.toml", "points.jsonl", "results.csv", "sweep.png", ".lossscale-sweep.lock"}
    (out / "notes.txt").write_text("mine")
    assert cli(capsys, *sweep)[0] == 0  # resumed: nothing of the user's touched
    before = tree(out)
    refused(*cli(capsys, *sweep, "--force"), "did not write (notes.txt)", "--force replaces only what lossscale wrote")
    assert tree(out) == before
    (out / "notes.txt").unlink()
    points = (out / "points.jsonl").read_text()
    assert cli(capsys, *sweep, "--force")[0] == 0
    assert (out / "points.jsonl").read_text().count("\n") == points.count("\n") == 2  # run again, not appended
    run = earlier_run
    refused(*cli(capsys, "sweep", grid, "--out", run, "--quiet"), "holds no sweep", "or --force")
    assert cli(capsys, "sweep", grid, "--out", run, "--quiet", "--force")[0] == 0  # lossscale's run, replaced
    assert sorted(own_files(run)) == [".lossscale-sweep.lock", "grid.toml", "points.jsonl", "results.csv", "sweep.png"]
    assert sorted(p.name for p in run.iterdir()) == sorted([MANIFEST, ".lossscale-sweep.lock", "grid.toml",
                                                            "points.jsonl", "results.csv", "sweep.png"])


# -- a run whose workload raises keeps its finished steps (issue 31, items 2 and 3) --------------------
FAILING = '''
from lossscale.training.workloads import Trace

class Failing(Trace):
    """A trace whose model raises at step ``at`` (a bug in the user's model), or whose evaluation does."""

    def __init__(self, seed, at=-1, error="ValueError", evaluation=False):
        super().__init__(seed=seed)
        self.at, self.error, self.calls, self.evaluation = at, error, 0, evaluation

    def forward_backward(self, dev, params, scale, part, share):
        if self.calls == self.at:
            raise {"ValueError": ValueError, "RuntimeError": RuntimeError}[self.error]("shapes do not match")
        self.calls += 1
        return super().forward_backward(dev, params, scale, part, share)

    def evaluate(self, params):
        if self.evaluation:
            raise RuntimeError("The size of tensor a (8) must match the size of tensor b (64)")
        return super().evaluate(params)


def make(seed, at=-1, error="ValueError", evaluation=False):
    return Failing(seed, at, error, evaluation)
'''


@pytest.fixture
def failing(tmp_path, monkeypatch):
    """A module ``userwl`` on the path whose workload raises where it is told to."""
    import sys

    (tmp_path / "userwl.py").write_text(FAILING)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "userwl", raising=False)
    return tmp_path


@pytest.mark.parametrize("error", ["ValueError", "RuntimeError"])
def test_a_failing_run_keeps_its_finished_steps(capsys, failing, error) -> None:
    """The model raises at step 12 of 30: the 12 finished steps are written as an interrupted run's
    are, the user's traceback (its file and line) is shown, and the exit status is 1, whatever
    the exception's type (a ValueError is not a usage error)."""
    from lossscale import simulate
    from lossscale.app.files import read_run
    from lossscale.training.simulate import StepFailed

    out = failing / "out"
    code, err = cli(capsys, "run", "--workload", "userwl:make", "--workload-arg", "at=12", "--workload-arg",
                    f"error={error}", "--steps", "30", "--quiet", "--out", out)
    assert code == 1
    assert f"{error}: shapes do not match" in err and "userwl.py" in err and ", line " in err  # the user's traceback
    assert "step 12 raised" in err and "the 12 finished steps are in" in err and str(out) in err
    run = read_run(out)
    assert [r["step"] for r in run.records] == list(range(12))
    assert run.summary["steps_run"] == 12 and run.summary["stopped_early"].startswith(f"step 12: {error}")
    with pytest.raises(StepFailed) as caught:  # the library: the same run, the error as the cause
        simulate(workload="userwl:make", workload_args={"at": 12, "error": error}, steps=30)
    assert len(caught.value.run.records) == 12 and type(caught.value.__cause__).__name__ == error
    code, err = cli(capsys, "compare", "--manager", "torch", "--manager", "fixed", "--workload", "userwl:make",
                    "--workload-arg", "at=3", "--steps", "10", "--quiet", "--out", failing / "cmp")
    assert code == 1 and len(read_run(failing / "cmp" / "torch").records) == 3


def test_a_failing_evaluation_loses_no_step(capsys, failing) -> None:
    """The end-of-run evaluation raises (a model whose outputs and labels do not fit): every step is
    written, the figures it would have given are NaN, and the summary and the output say why."""
    from lossscale.app.files import read_run

    out = failing / "out"
    capsys.readouterr()
    assert main(["run", "--workload", "userwl:make", "--workload-arg", "evaluation=true", "--steps", "6", "--quiet",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "evaluation failed, its figures are nan: final: RuntimeError: The size of tensor a (8)" in printed
    run = read_run(out)
    assert len(run.records) == 6
    assert run.summary["final"] == {"loss": None, "accuracy": None}  # NaN, as strict JSON writes it
    assert [e.split(":")[0] for e in run.summary["evaluation_notes"]] == ["final", "baseline_float32"]
    assert "must match the size of tensor b" in run.summary["evaluation_notes"][0]


def test_a_causal_lm_whose_logits_do_not_fit_the_labels_keeps_its_run() -> None:
    """The issue's case: a model with (N, T, V) logits whose loss takes the last position, against
    (N,) labels: every step runs, the loss is evaluated, the accuracy is NaN with the reason in
    the summary; metric_fn= gives one."""
    torch = pytest.importorskip("torch")
    from lossscale import simulate
    from lossscale.training.workloads.torch_workloads import TorchWorkload

    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.out = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16)

        def forward(self, x):
            return self.out(self.emb(x))  # (N, T, V)

    torch.manual_seed(0)
    x, y = torch.randint(0, 16, (64, 5)), torch.randint(0, 16, (64,))

    def loss_fn(out, target):
        return torch.nn.functional.cross_entropy(out[:, -1].float(), target)

    def workload(**kw):
        return TorchWorkload(TinyLM(), loss_fn, (x, y), batch=16, **kw)

    run = simulate(workload=workload(), steps=4, record_events=False)
    s = run.summary
    assert len(run.records) == 4 and s["final"]["loss"] == s["final"]["loss"]  # the loss is there
    assert s["final"]["accuracy"] != s["final"]["accuracy"]  # NaN: not available
    assert any(n.startswith("final: accuracy not available: the argmax of logits of shape (64, 5, 16)")
               for n in s["evaluation_notes"])
    last = simulate(workload=workload(metric_fn=lambda out, t: float((out[:, -1].argmax(-1) == t).float().mean())),
                    steps=4, record_events=False).summary
    assert 0 <= last["final"]["accuracy"] <= 1 and last["evaluation_notes"] == []


def test_one_sweep_at_a_time_into_a_folder(capsys, tmp_path) -> None:
    """A sweep writing into a folder holds its lock: a second one into it (the same grid, or --force)
    is refused at once and writes nothing; once the first ends, the command resumes."""
    fcntl = pytest.importorskip("fcntl")
    from lossscale.app.sweep import LOCK

    grid = tmp_path / "grid.toml"
    grid.write_text(SWEEP)
    out = tmp_path / "sweep"
    sweep = ["sweep", grid, "--out", out, "--workers", "1", "--quiet"]
    assert cli(capsys, *sweep)[0] == 0
    before = tree(out)
    with open(out / LOCK, "a") as held:  # as the other sweep's process holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for extra in ([], ["--force"]):
            refused(*cli(capsys, *sweep, *extra), "another lossscale sweep is writing into", "now")
        assert tree(out) == before
    assert cli(capsys, *sweep)[0] == 0 and tree(out)["points.jsonl"] == before["points.jsonl"]


# -- bounds up front, and what a killed run left (issue 31, item 4) -----------------------------------
def test_settings_beyond_their_bounds_are_refused_before_anything_is_made(capsys, tmp_path, monkeypatch) -> None:
    """--steps 10**23 and --ranks 100000 are refused by the parser (one line, nothing written); a rank
    count within the bound that leaves ranks without data is refused before a device is made."""
    import lossscale.training.simulate as sim_module
    from lossscale import simulate
    from lossscale.training.config import MAX_RANKS, MAX_STEPS

    monkeypatch.chdir(tmp_path)
    refused(*cli(capsys, "run", "--steps", "99999999999999999999999", "--quiet"), "--steps", "from 1 to 10,000,000")
    refused(*cli(capsys, "run", "--ranks", "100000", "--quiet"), "--ranks", "from 1 to 4,096")
    assert list(tmp_path.iterdir()) == []
    for bad in ({"steps": MAX_STEPS + 1}, {"ranks": MAX_RANKS + 1}, {"micro_batches": MAX_RANKS + 1}):
        with pytest.raises(ValueError, match=r"from 1 to [0-9,]+, got"):
            simulate(**bad)

    def no_device(*args, **kwargs):
        raise AssertionError("a device was made before the ranks were checked")

    monkeypatch.setattr(sim_module, "Device", no_device)
    with pytest.raises(ValueError, match="ranks=4000 leaves 3936 rank"):
        simulate(ranks=4000, steps=3)


def test_a_killed_runs_staging_folder_is_found(capsys, tmp_path) -> None:
    """A run killed (SIGKILL) leaves its hidden staging folder; the next run into the same parent
    removes an empty one and names one holding files, leaving it as it is."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    empty = tmp_path / f".a.{pid}.k2j4h5g6.writing"
    full = tmp_path / f".b.{pid}.p0o9i8u7.writing"
    other = tmp_path / ".c.xyz123.writing"  # not one of ours by name: left alone
    for folder in (empty, full, other):
        folder.mkdir()
    (full / "trajectory.csv").write_text("step\n")
    code, err = cli(capsys, "run", *FAST, "--out", tmp_path / "new")
    assert code == 0 and not empty.exists() and (full / "trajectory.csv").exists() and other.exists()
    assert f"removed {str(empty)!r}" in err and f"{str(full)!r} holds what a killed run wrote" in err


def test_batches_are_drawn_as_the_run_reaches_them() -> None:
    """The built-in sampled workloads' batches: drawn in order when first asked for, the same values
    as drawing every step's up front (so every run's data is what it was), none drawn ahead."""
    from lossscale.training.workloads import make_workload
    from lossscale.training.workloads.base import Draws

    rng = np.random.default_rng(8)
    upfront = np.stack([rng.choice(1000, 64, replace=False) for _ in range(50)])
    lazy = Draws(1000, 64, 50, 8)
    assert len(lazy) == 50 and np.array_equal(lazy[3], upfront[3]) and len(lazy._drawn) == 4
    assert np.array_equal(lazy[-1], upfront[-1]) and np.array_equal(np.stack(lazy[10:20]), upfront[10:20])
    with pytest.raises(IndexError):
        lazy[50]
    huge = make_workload("mlp", 0).batches(10_000_000)
    assert len(huge) == 10_000_000 and huge[0].shape == (64,) and len(huge._drawn) == 1


def test_a_resumed_sweep_writes_what_a_fresh_one_does(capsys, tmp_path) -> None:
    """results.csv of a sweep whose points are all read back from points.jsonl (NaN metrics: the
    trace workload's accuracy) is the fresh sweep's, byte for byte (issue 31, item 10)."""
    grid = tmp_path / "grid.toml"
    grid.write_text(SWEEP)
    out = tmp_path / "sweep"
    sweep = ["sweep", grid, "--out", out, "--workers", "1", "--quiet"]
    assert cli(capsys, *sweep)[0] == 0
    fresh = (out / "results.csv").read_bytes()
    assert b",nan," in fresh
    (out / "results.csv").unlink()
    assert cli(capsys, *sweep)[0] == 0  # every point reused
    assert (out / "results.csv").read_bytes() == fresh


def test_minor_inputs_get_one_line_errors(capsys, tmp_path, monkeypatch) -> None:
    """Issue 31, item 11 (in part): a binary grid or log, a grid path that is a folder and an --out
    under a file are one-line errors naming them; replay --out runs/NAME makes runs/ as run does; a
    policy's np.float16 scale is a Python float in the summary."""
    from lossscale import simulate

    monkeypatch.chdir(tmp_path)
    binary = tmp_path / "grid.toml"
    binary.write_bytes(b"\xdd\xfe\x00binary")
    refused(*cli(capsys, "sweep", binary, "--out", "s"), "grid.toml' is not text (not UTF-8)")
    refused(*cli(capsys, "sweep", tmp_path, "--out", "s"), "is a folder; give the grid's TOML file")
    refused(*cli(capsys, "replay", binary, "--format", "csv", "--out", "r"), "grid.toml' holds no loss-scale events")
    (tmp_path / "afile.txt").write_text("x")
    refused(*cli(capsys, "run", *FAST, "--out", "afile.txt/sub"), "'afile.txt' in the output path", "is a file")
    assert cli(capsys, "replay", a_log(tmp_path), "--out", "runs/replay")[0] == 0
    assert (tmp_path / "runs" / "replay" / "replay.csv").exists()

    class Half:
        def get_loss_scale(self):
            return np.float16(1024)

        def update_loss_scale(self, finite):
            pass

    scale = simulate(workload="trace", manager=Half(), steps=3, record_events=False).summary["final_loss_scale"]
    assert type(scale) is float and scale == 1024.0


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="a Linux /proc")
@pytest.mark.parametrize("command", ["run", "sweep"])
def test_an_out_nothing_can_be_written_in_is_refused_up_front(capsys, tmp_path, monkeypatch, command) -> None:
    """Issue 31, item 11: /proc passes os.access but takes no new folder: a one-line error naming
    the folder, before anything runs, and no staging or probe folder is left anywhere."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.toml").write_text(SWEEP)
    args = [*FAST] if command == "run" else ["grid.toml", "--workers", "1", "--quiet"]
    refused(*cli(capsys, command, *args, "--out", "/proc/lossscale-x"), "cannot write to the folder '/proc' for "
            "output '/proc/lossscale-x'", "choose an --out you can write to")
    assert not list(Path("/proc").glob(".lossscale*")) and not list(tmp_path.glob(".*"))
    assert cli(capsys, "run", *FAST, "--out", "ok")[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.toml", "ok"]  # the probe went with its check


def test_help_says_each_default_once_and_what_the_command_line_takes(capsys) -> None:
    """run --help: no "(default: None)" after a help that gives the default itself, and --manager and
    --workload described as the command line takes them (names, import paths), not as Python
    objects (issue 31, item 11)."""
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and "(default: [])" not in text
    assert "(default: the profile's)" in text and "(default: 300)" in text
    assert "a Policy value" not in text and "an object following" not in text
    assert "the loss-scale manager, by name" in text and "package.module:factory for a workload of yours" in text


def test_torch_workload_takes_torchs_dtypes() -> None:
    torch = pytest.importorskip("torch")
    from lossscale.training.workloads.torch_workloads import TorchWorkload

    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    for given, want in ((torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16), ("bfloat16", torch.bfloat16)):
        wl = TorchWorkload(torch.nn.Linear(3, 2), torch.nn.functional.cross_entropy, (x, y), batch=4, dtype=given)
        assert wl.dtype == want
    with pytest.raises(ValueError, match="dtype must be one of float16, bfloat16 .or torch's., got torch.float64"):
        TorchWorkload(torch.nn.Linear(3, 2), torch.nn.functional.cross_entropy, (x, y), batch=4, dtype=torch.float64)
