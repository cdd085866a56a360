"""The notebooks run top to bottom, and are kept in git without outputs."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from paths import ROOT  # tests/ is on the path (conftest.py)

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_eight() -> None:
    assert [p.name for p in NOTEBOOKS] == ["01-overflow-modes.ipynb", "02-scale-policies.ipynb",
                                           "03-training-on-atlas.ipynb", "04-your-own-model.ipynb",
                                           "05-who-sees-the-overflow.ipynb", "06-fp8-on-atlas-350.ipynb",
                                           "07-your-run.ipynb", "08-four-bits.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path: Path) -> None:
    book = nbformat.read(path, as_version=4)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name} holds outputs"


@pytest.mark.notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom(path: Path, tmp_path: Path) -> None:
    if "import torch" in path.read_text() and importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch (the optional extra; .ci/run installs it)")
    from jupyter_client.manager import KernelManager
    book = nbformat.read(path, as_version=4)
    # The kernel talks over Unix sockets in a folder of its own: over TCP, two workers' kernels
    # starting at once can pick the same free port, and one dies ("Address already in use").
    sockets = tempfile.mkdtemp(prefix="nb")  # short: a Unix socket's path is limited to ~100 bytes
    try:
        km = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(sockets, "k"))
        client = nbclient.NotebookClient(book, km=km, timeout=600, resources={"metadata": {"path": str(tmp_path)}})
        client.execute()  # raises CellExecutionError, with the cell and traceback, on any error
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
