"""Set-up the command-line tests share: one finished run, made once per test process."""

import shutil
from pathlib import Path

import pytest
from runs import FAST  # tests/ is on the path (tests/conftest.py)

from lossscale.app.cli import main


@pytest.fixture(scope="session")
def _shared_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shared") / "run"
    assert main(["run", *FAST, "--out", str(out)]) == 0
    return out


@pytest.fixture
def earlier_run(_shared_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A copy of a finished ``lossscale run --out`` folder (``runs.FAST``), the test's own to change."""
    capsys.readouterr()  # what the shared run printed is no test's output
    return Path(shutil.copytree(_shared_run, tmp_path / "earlier"))
