"""The packages' layers, as their docstrings state them, checked on the import statements of
every module (those inside functions included):

- ``sim`` knows nothing of loss scaling: it never imports ``lossscale``;
- inside ``lossscale`` imports point down: ``app`` -> ``training`` -> ``policy`` and ``app`` ->
  ``replay`` -> ``policy`` (replay reads logs and replays policies; it trains nothing), and
  ``testing`` (the property kit) stands on ``policy`` and ``training``;
- no module imports, directly or through others, a module that imports it (no circles).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from paths import ROOT  # tests/ is on the path (conftest.py)

#: What each layer of lossscale may import of lossscale (``version`` is a leaf every layer reads).
ALLOWED = {
    "policy": {"policy", "version"},
    "training": {"policy", "training", "version"},
    "replay": {"policy", "replay", "version"},
    "app": {"policy", "training", "replay", "app", "version"},
    "testing": {"policy", "training", "version"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in ("sim", "lossscale") for p in (ROOT / package).rglob("*.py")}


def resolve(name: str, known: dict[str, Path]) -> str:
    """The module that an import of ``name`` runs last: the name itself, or its package."""
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(module: str, known: dict[str, Path]) -> set[str]:
    """The project's modules that ``module`` imports, anywhere in its text."""
    path = known[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _type_checking(block.test)
                   for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in typing_only:  # ``if TYPE_CHECKING:``: read by type checkers, never run
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {resolve(n, known) for n in found if n.split(".")[0] in ("sim", "lossscale")} - {module}


KNOWN = modules()
GRAPH = {m: imports(m, KNOWN) for m in KNOWN}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "lossscale" and len(parts) > 1 and parts[1] in {*ALLOWED, "version"} else None


def test_the_graph_is_read() -> None:
    assert "lossscale.policy.core" in GRAPH["lossscale.policy.ascend"]
    assert "sim.device.core" in GRAPH["sim"]


def test_sim_never_imports_lossscale() -> None:
    wrong = {m: sorted(u for u in uses if u.startswith("lossscale")) for m, uses in GRAPH.items()
             if m.startswith("sim")}
    assert not any(wrong.values()), wrong


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if layer(m) in ALLOWED))
def test_imports_point_down_the_layers(module: str) -> None:
    wrong = {u for u in GRAPH[module] if u.startswith("lossscale") and layer(u) not in ALLOWED[layer(module)]}
    assert not wrong, f"{module} ({layer(module)}) imports {sorted(wrong)}"


def test_no_import_circles() -> None:
    """Tarjan's strongly connected components: every one must be a single module."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_a_circle_is_found() -> None:
    """The check itself can fail: a two-module circle added to the graph is reported."""
    saved = dict(GRAPH)
    try:
        GRAPH["lossscale.policy.core"] = GRAPH["lossscale.policy.core"] | {"lossscale.policy.ascend"}
        with pytest.raises(AssertionError, match="import circles"):
            test_no_import_circles()
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


#: The import paths users and the README rely on.
PUBLIC = {
    "sim": ["Fpu", "Device", "Flag", "OverflowMode", "Rounding", "BINARY16", "BFLOAT16", "BINARY32", "SIX_MODES",
            "profiles", "formats"],
    "sim.profiles": ["overflow_mode_from_env", "for_soc"],
    "sim.formats": ["decode", "FORMATS"],
    "sim.mx": ["quantize"],
    "lossscale": ["simulate", "RunConfig", "load_run", "FixedLossScaleManager", "ExponentialUpdateLossScaleManager",
                  "NPULossScaleOptimizer", "LossScaleOptimizer", "SGD", "PHASES", "begin_phase", "trajectory"],
    "lossscale.policy": ["MANAGERS", "register", "manager_class"],
    "lossscale.policy.frameworks": ["TorchPolicy", "DeepSpeedPolicy", "TorchGradScaler"],
    "lossscale.training.config": ["make_manager", "check_arguments"],
    "lossscale.training.records": ["SCHEMA", "COLUMNS", "Run", "Row", "Summary"],
    "lossscale.training.workloads": ["Mlp", "make_workload", "WORKLOADS", "Workload"],
    "lossscale.training.fp8": ["DelayedScaling", "CurrentScaling", "MXScaling", "TensorScaler"],
    "lossscale.training.detectors": ["DETECTORS", "make_detector", "TfNpu"],
    "lossscale.replay": ["read_log", "Log", "LogEvent", "consistency", "counterfactual", "SAMPLE_LOG", "LOG_FORMATS"],
    "lossscale.testing": ["check_policy"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_paths_import(module: str) -> None:
    mod = importlib.import_module(module)
    assert not [name for name in PUBLIC[module] if name not in mod.__all__ or not hasattr(mod, name)]


def public_modules() -> list[str]:
    """Every module of sim and lossscale whose path has no private part (each optional bridge whose
    library is installed)."""
    found = []
    for name in KNOWN:
        if any(part.startswith("_") for part in name.split(".")):
            continue
        try:
            importlib.import_module(name)
        except ImportError as err:  # an optional extra (torch, jax) missing
            if err.name and err.name.split(".")[0] in ("sim", "lossscale"):
                raise
            continue
        found.append(name)
    return sorted(found)


def public_paths(modules: list[str]) -> dict[int, list[str]]:
    """Each object a public module lists in ``__all__`` (numbers and strings aside: Python shares
    equal ones), by identity: the paths that list it."""
    paths: dict[int, list[str]] = {}
    for name in modules:
        mod = importlib.import_module(name)
        for attr in getattr(mod, "__all__", ()):
            value = getattr(mod, attr)
            if not isinstance(value, (int, float, str, bytes, type(None))):
                paths.setdefault(id(value), []).append(f"{name}.{attr}")
    return paths


def test_each_public_name_has_one_import_path() -> None:
    """A package that re-exports a name is its path; the module that defines it leaves it out of its
    own ``__all__``. Two public paths to one object make a reader guess which is meant."""
    modules = public_modules()
    assert {"sim", "lossscale", "lossscale.replay", "sim.device"} <= set(modules)
    twice = sorted(" = ".join(sorted(p)) for p in public_paths(modules).values() if len(p) > 1)
    assert not twice, twice


def test_a_second_path_is_found(monkeypatch) -> None:
    """The check itself can fail: a module listing a name its package already exports is reported."""
    import sim.device.core

    monkeypatch.setattr(sim.device.core, "__all__", ["Device"], raising=False)
    with pytest.raises(AssertionError, match=r"sim\.Device = sim\.device\.core\.Device"):
        test_each_public_name_has_one_import_path()


def test_optional_paths_import() -> None:
    pytest.importorskip("torch")
    import lossscale.training.workloads as w
    import sim.torch

    assert w.TorchWorkload and sim.torch.DeviceMode
    pytest.importorskip("jax")
    import sim.jax

    assert w.JaxWorkload and sim.jax.on_device and sim.jax.coverage


#: Modules over 600 lines, and functions over 60, with the reason each stays so. kernels.py is one
#: idea, the one rounding routine and the loops that inline it (its docstring says more); these are
#: its compiled kernels whose branches numba inlines into one loop.
LONG_MODULES = {"sim.kernels"}
LONG_FUNCTIONS = {("sim.kernels", "round_pack"), ("sim.kernels", "_unary_value"), ("sim.kernels", "tree_sum")}


def test_modules_and_functions_are_short() -> None:
    """A module over 600 lines or a function over 60 holds more than one idea: none, but the
    compiled kernels named above."""
    long_modules, long_functions = set(), set()
    for name, path in KNOWN.items():
        text = path.read_text()
        if text.count("\n") > 600:
            long_modules.add(name)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long_functions.add((name, node.name))
    assert long_modules == LONG_MODULES and long_functions == LONG_FUNCTIONS, (
        sorted(long_modules - LONG_MODULES), sorted(long_functions - LONG_FUNCTIONS))


def test_no_test_folder_stands_in_for_a_package() -> None:
    """Test folders are on the import path (pytest puts each test file's folder there, conftest.py
    puts tests/): a folder named like a package (lossscale, sim, torch) would be imported in its place
    where the package is installed by a finder rather than a path (pip's editable installs). The data
    folder holds no tests (pytest puts nothing of it on the path)."""
    folders = [p for p in (ROOT / "tests").rglob("*") if p.is_dir() and p.name != "__pycache__"
               and "__pycache__" not in p.parts and p.relative_to(ROOT / "tests").parts[0] != "data"]
    assert folders and all(p.name.endswith("_tests") for p in folders), [p.name for p in folders]
