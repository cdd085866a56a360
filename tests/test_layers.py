"""The package's layers, as its docstring states them: sim knows nothing of loss scaling;
lossscale's core (the policy protocol, managers, peer policies, optimizers) uses only sim;
training (simulate, workloads) uses the core; the application (cli, files, plots, sweep,
the testing kit) uses both. Checked on the import statements of every module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {
    "core": {"policy", "managers", "policies", "optimizers", "detectors", "fp8"},
    "training": {"simulate", "workloads", "torch_workloads", "jax_workloads"},
    "application": {"cli", "files", "plots", "sweep", "testing", "__main__"},
}
ALLOWED = {"core": {"core"}, "training": {"core", "training"}, "application": {"core", "training", "application"}}


def imported(path: Path, package: str) -> set[str]:
    """The modules of ``package`` that ``path`` imports (absolute or relative)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                names |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif node.module and node.module.split(".")[0] == package:
                parts = node.module.split(".")
                names |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[1] for a in node.names if a.name.startswith(package + ".")}
    return names


def layer_of(module: str) -> str:
    return next(layer for layer, members in LAYERS.items() if module in members)


def test_every_lossscale_module_has_a_layer() -> None:
    modules = {p.stem for p in (ROOT / "lossscale").glob("*.py")} - {"__init__"}
    assert modules == set().union(*LAYERS.values())


@pytest.mark.parametrize("module", sorted(set().union(*LAYERS.values())))
def test_imports_point_down_the_layers(module: str) -> None:
    uses = imported(ROOT / "lossscale" / f"{module}.py", "lossscale") - {"__version__", "data"}
    wrong = {u for u in uses if layer_of(u) not in ALLOWED[layer_of(module)]}
    assert not wrong, f"lossscale.{module} ({layer_of(module)}) imports {wrong}"


def test_sim_never_imports_lossscale() -> None:
    for path in (ROOT / "sim").glob("*.py"):
        text = path.read_text()
        assert "import lossscale" not in text and "from lossscale" not in text, path.name
