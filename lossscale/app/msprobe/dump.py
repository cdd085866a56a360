"""An msprobe dump read back: every call (API or module) of every step and rank, with its module path
and the user's source line, and its tensors loaded on demand."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__: list[str] = []  # public as lossscale.msprobe's

#: API names: ``<Kind>.<api>.<count>.<forward|backward>`` (levels L1 and mix).
_API = re.compile(r"^(?P<kind>\w+)\.(?P<api>.+)\.(?P<count>\d+)\.(?P<direction>forward|backward)$")
#: Module names: ``Module.<path>.<Class>.<forward|backward|parameters_grad>.<count>`` (L0 and mix).
_MODULE = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.(?P<direction>forward|backward|parameters_grad)"
                     r"\.(?P<count>\d+)$")


@dataclass(frozen=True)
class Entry:
    """One call in a dump: where (step, rank), what (its dump name, kind, API or module class, and
    direction: forward, backward or, for a module, parameters_grad), its inputs (positional, then
    keyword), outputs and, for a module's forward, parameters as dump.json has them; the module it
    ran in (its dotted path, from the name of a module entry or from construct.json for an API;
    "" at level L1, which records no modules), the user's source line from stack.json, and the
    folder holding its tensors (None: the statistics and md5 tasks)."""

    step: int
    rank: int
    name: str
    kind: str
    api: str
    direction: str
    inputs: list[Any]
    kwargs: dict[str, Any]
    outputs: list[Any]
    source: str = ""
    tensors: Path | None = field(default=None, repr=False)
    module: str = ""
    parameters: dict[str, Any] = field(default_factory=dict, repr=False)


def _number(folder: str, prefix: str) -> int:
    found = re.fullmatch(rf"{prefix}(\d+)", folder)
    return int(found[1]) if found else 0


def _user_frame(frames: list[str]) -> str:
    """The innermost frame outside torch's and msprobe's own files (``path:line``), or ""."""
    for frame in frames:
        found = re.match(r"File (?P<path>.+?), line (?P<line>\d+)", frame)
        if found and not re.search(r"site-packages|dist-packages|/torch/|/msprobe/", found["path"]):
            return f"{found['path']}:{found['line']}"
    return ""


def _dump_files(path: Path) -> list[Path]:
    path = Path(path)
    if path.is_file() and path.name == "dump.json":
        return [path]
    if not path.is_dir():
        raise ValueError(f"{str(path)!r} is not an msprobe dump: give its folder (holding step*/ folders) or a "
                         f"dump.json")
    files = sorted(path.rglob("dump.json"))
    if not files:
        raise ValueError(f"{str(path)!r} holds no dump.json: not an msprobe dump")
    return files


def _side(file: Path, name: str) -> dict:
    """stack.json or construct.json beside a dump.json ({} where absent)."""
    side = file.parent / name
    if not side.exists():
        return {}
    return json.loads(side.read_text()) or {}


def _path(module_name: str | None) -> str:
    found = _MODULE.match(module_name or "")
    return found["path"] if found else ""


def read_dump(path: str | Path) -> list[Entry]:
    """Every call of an msprobe dump (a dump folder, a step's or rank's folder, or a dump.json):
    levels L0, L1 and mix; tasks tensor, statistics and md5; in step, rank and file order.
    ValueError naming a file that is not msprobe's."""
    entries = []
    for file in _dump_files(Path(path)):
        try:
            dump = json.loads(file.read_text())
            data = dump["data"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{str(file)!r} is not an msprobe dump.json ({err})") from None
        rank_dir, step_dir = file.parent.name, file.parent.parent.name
        sources = {name: _user_frame(frames) for names, frames in _side(file, "stack.json").values()
                   for name in names}
        parents = _side(file, "construct.json")
        tensors = Path(dump["dump_data_dir"]) if dump.get("dump_data_dir") else None
        if tensors is not None and not tensors.is_dir():
            tensors = file.parent / "dump_tensor_data"  # the dump was moved: its tensors are beside it
        folder = tensors if tensors is not None and tensors.is_dir() else None
        for name, call in data.items():
            api, module = _API.match(name), _MODULE.match(name)
            if module:
                kind, what, direction, where = "Module", module["cls"], module["direction"], module["path"]
            elif api:
                kind, what, direction, where = api["kind"], api["api"], api["direction"], _path(parents.get(name))
            else:
                continue  # not a call (msprobe writes nothing else under data; a later version might)
            forward = direction == "forward"
            entries.append(Entry(
                _number(step_dir, "step"), _number(rank_dir, "rank"), name, kind, what, direction,
                list(call.get("input_args" if forward else "input") or []), dict(call.get("input_kwargs") or {}),
                list(call.get("output") or []), sources.get(name, ""), folder, where,
                dict(call.get("parameters") or {})))
    return entries


def recorded(entry: Entry) -> list[tuple[str, str, dict]]:
    """Every tensor (or number) an entry records, as ``(name, part, meta)``: msprobe's name for it
    (``<call>.input.0``, ``.input.<kw>``, ``.output.0``, ``.parameters.<name>``, nested positions
    joined by dots), its part (input, output or parameters) and its dump.json record."""
    out: list[tuple[str, str, dict]] = []

    def walk(name: str, part: str, meta: Any) -> None:
        if isinstance(meta, list):
            for i, m in enumerate(meta):
                walk(f"{name}.{i}", part, m)
        elif isinstance(meta, dict):
            out.append((name, part, meta))
    for part, metas in (("input", dict(enumerate(entry.inputs))), ("input", entry.kwargs),
                        ("output", dict(enumerate(entry.outputs))), ("parameters", entry.parameters)):
        for key, m in metas.items():
            walk(f"{entry.name}.{part}.{key}", part, m)
    return out


class Missing(Exception):
    """An argument a replay cannot rebuild (a tensor the dump did not keep, a type it cannot read)."""


def value(meta: Any, folder: Path | None, requires_grad: bool = False) -> Any:
    """An argument of a call, rebuilt from its dump.json entry (a tensor from its file; with
    ``requires_grad``, a floating tensor that required grad when dumped requires it again)."""
    import torch
    if meta is None:
        return None
    if isinstance(meta, list):
        return [value(m, folder, requires_grad) for m in meta]
    if not isinstance(meta, dict):
        raise Missing(f"an argument dump.json records as {meta!r}")
    kind = meta.get("type")
    if kind == "torch.Tensor":
        if folder is None or not meta.get("data_name"):
            raise Missing("the dump keeps no tensors (statistics or md5 task)")
        t = torch.load(folder / meta["data_name"], weights_only=True)
        return t.requires_grad_() if requires_grad and meta.get("requires_grad") and t.is_floating_point() else t
    if kind == "torch.dtype":
        return getattr(torch, str(meta["value"]).removeprefix("torch."))
    if kind in ("int", "float", "bool", "str") and "value" in meta:
        return meta["value"]
    raise Missing(f"an argument of type {kind}")
