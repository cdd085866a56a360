"""The packages' layers, as their docstrings state them, checked on the import statements of
every module (those inside functions included):

- ``sim`` knows nothing of loss scaling: it never imports ``lossscale``;
- inside ``lossscale`` imports point down: ``app`` -> ``training`` -> ``policy``, and
  ``testing`` (the property kit) stands on ``policy`` and ``training``;
- no module imports, directly or through others, a module that imports it (no circles).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: What each layer of lossscale may import of lossscale (``version`` is a leaf every layer reads).
ALLOWED = {
    "policy": {"policy", "version"},
    "training": {"policy", "training", "version"},
    "app": {"policy", "training", "app", "version"},
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


def imports(module: str, known: dict[str, Path]) -> set[str]:
    """The project's modules that ``module`` imports, anywhere in its text."""
    path = known[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
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
    assert "sim.device" in GRAPH["sim"]


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


#: The import paths users and the README rely on, kept through the move into layers.
PUBLIC = {
    "sim": ["Fpu", "Device", "Flag", "OverflowMode", "Rounding", "BINARY16", "BFLOAT16", "BINARY32", "SIX_MODES",
            "profiles"],
    "sim.profiles": ["overflow_mode_from_env", "for_soc"],
    "sim.formats": ["decode"],
    "sim.mx": ["quantize"],
    "lossscale": ["FixedLossScaleManager", "ExponentialUpdateLossScaleManager", "NPULossScaleOptimizer",
                  "LossScaleOptimizer", "PHASES", "trajectory", "policies"],
    "lossscale.policies": ["TorchPolicy", "DeepSpeedPolicy", "TorchGradScaler"],
    "lossscale.policy": ["MANAGERS", "trajectory"],
    "lossscale.simulate": ["simulate", "make_manager", "SCHEMA", "COLUMNS"],
    "lossscale.workloads": ["Mlp", "make_workload"],
    "lossscale.testing": ["check_policy"],
    "lossscale.fp8": ["DelayedScaling", "CurrentScaling", "MXScaling", "TensorScaler"],
    "lossscale.detectors": ["DETECTORS", "make_detector", "TfNpu"],
    "lossscale.replay": ["read_log", "Log", "LogEvent", "consistency", "counterfactual"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_paths_import(module: str) -> None:
    import importlib

    mod = importlib.import_module(module)
    assert not [name for name in PUBLIC[module] if not hasattr(mod, name)]


def test_optional_paths_import() -> None:
    pytest.importorskip("torch")
    import lossscale.workloads as w
    import sim.torch

    assert w.TorchWorkload and sim.torch.DeviceMode
    pytest.importorskip("jax")
    import sim.jax

    assert w.JaxWorkload and sim.jax.on_device and sim.jax.coverage
