"""A workload of one's own named by import path, package.module:factory: in simulate(), on the
command line and in a sweep; and the one-line errors when the path names the wrong thing."""

from __future__ import annotations

import sys
import textwrap

import pytest

from lossscale import simulate
from lossscale.app.cli import main
from lossscale.app.sweep import run_sweep
from lossscale.training.config import check_arguments

MODULE = '''
from lossscale.training.workloads import Trace

calls = []

def make(seed, size=64):
    calls.append((seed, size))
    return Trace(seed=seed, size=size, name=f"mine-{size}")

class Made(Trace):
    pass

NOT_CALLABLE = 3

def not_a_workload(seed):
    return object()

def no_seed(size=3):
    return Trace(size=size)

def needs(seed, width):
    return Trace(seed=seed, size=width)
'''


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package ``mywl`` with a module ``models``, on the path (restored afterwards)."""
    (tmp_path / "mywl").mkdir()
    (tmp_path / "mywl" / "__init__.py").write_text("")
    (tmp_path / "mywl" / "models.py").write_text(textwrap.dedent(MODULE))
    (tmp_path / "broken.py").write_text("import not_installed_anywhere\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("mywl", "mywl.models", "broken"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_simulate_imports_and_calls_the_factory(package) -> None:
    run = simulate(workload="mywl.models:make", workload_args={"size": 32}, seed=5, steps=5)
    assert run.summary["arguments"]["workload"] == "mywl.models:make"
    assert run.summary["arguments"]["workload_args"] == {"size": 32}
    assert (5, 32) in sys.modules["mywl.models"].calls
    named = simulate(workload="trace", workload_args={"size": 32}, seed=5, steps=5)
    assert [r["loss"] for r in run.records] == [r["loss"] for r in named.records]
    assert simulate(workload="mywl.models:Made", steps=2).summary["steps_run"] == 2  # a class is a factory
    assert check_arguments({"workload": "mywl.models:make", "workload_args": {"size": 8}}) == []


@pytest.mark.parametrize("path, args, message", [
    ("nowhere.models:make", {}, "workload 'nowhere.models:make': no module named 'nowhere'"),
    ("mywl.nothing:make", {}, "no module named 'mywl.nothing'"),
    ("broken:make", {}, "importing 'broken' failed: No module named 'not_installed_anywhere'"),
    ("mywl.models:absent", {}, "'mywl.models' has no attribute 'absent'"),
    ("mywl.models:make.deeper", {}, "'mywl.models:make' has no attribute 'deeper'"),
    ("mywl.models:NOT_CALLABLE", {}, "'NOT_CALLABLE' is a int, not callable"),
    ("mywl.models:not_a_workload", {}, "returned a object, not a workload: it lacks name, has_accuracy, "
                                       "init_params"),
    ("mywl.models:make", {"width": 3}, "takes no argument 'width'; valid: seed, size"),
    ("mywl.models:no_seed", {}, "takes no argument 'seed'; valid: size (a factory takes seed)"),
    ("mywl.models:needs", {}, "missing a required argument: 'width'"),
    (":make", {}, "an import path is package.module:factory"),
])
def test_a_wrong_path_says_what_was_wrong(package, path, args, message) -> None:
    problems = check_arguments({"workload": path, "workload_args": args})
    assert len(problems) == 1 and message in problems[0] and "\n" not in problems[0]
    with pytest.raises((ValueError, TypeError), match="workload"):
        simulate(workload=path, workload_args=args, steps=1)


def test_command_line_runs_a_workload_by_path(package, capsys, tmp_path) -> None:
    out = tmp_path / "run"
    code = main(["run", "--workload", "mywl.models:make", "--workload-arg", "size=16", "--steps", "3", "--quiet",
                 "--out", str(out)])
    assert code == 0 and (out / "summary.json").exists()
    assert '"workload": "mywl.models:make"' in (out / "summary.json").read_text()
    capsys.readouterr()
    for argv, message in [(["--workload", "mywl.models:absent"], "has no attribute 'absent'"),
                          (["--workload", "bogus"], "invalid choice: 'bogus'"),
                          (["--workload", "mywl.models:make", "--workload-arg", "width=2"], "no argument 'width'")]:
        code = main(["run", *argv, "--steps", "2", "--quiet", "--out", str(tmp_path / "bad")])
        _, err = capsys.readouterr()
        assert code == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err
        assert not (tmp_path / "bad").exists()


def test_command_line_finds_a_module_in_the_current_folder(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "here_wl.py").write_text("from lossscale.training.workloads import Trace\nmake = Trace\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "here_wl", raising=False)
    code = main(["run", "--workload", "here_wl:make", "--steps", "2", "--quiet", "--out", "out"])
    assert code == 0, capsys.readouterr().err


def test_sweep_runs_a_workload_by_path(package, tmp_path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text('[sweep]\nworkload = "mywl.models:make"\nsteps = 3\nworkload_args = {size = 16}\n'
                    '[grid]\nseed = [0, 1]\n')
    rows = run_sweep(grid, tmp_path / "out", workers=1)
    assert [r["status"] for r in rows] == ["ok", "ok"] and {r["workload"] for r in rows} == {"mywl.models:make"}
    grid.write_text('[sweep]\nsteps = 3\n[grid]\nworkload = ["trace", "mywl.models:absent"]\n')
    with pytest.raises(ValueError, match="has no attribute 'absent'"):
        run_sweep(grid, tmp_path / "bad", workers=1)
