"""msprobe dumps in: what Ascend's precision debugger recorded of a script, read back and re-executed
on a simulated device (optional extra ``torch``; msprobe itself is not needed to read a dump).

msprobe (PyPI ``mindstudio-probe``; ``msprobe.pytorch.PrecisionDebugger``) writes one folder per step
and rank (``step0/rank0``, or ``step0/proc<pid>`` where there is no rank) holding ``dump.json``
(``task``, ``level``, ``framework``, ``dump_data_dir`` and ``data``: per API call, named
``<Kind>.<api>.<count>.<forward|backward>``, its ``input_args``, ``input_kwargs`` and ``output``
for a forward call, ``input`` and ``output`` for a backward one, each tensor as its ``dtype``,
``shape``, ``Max``, ``Min``, ``Mean``, ``Norm`` and, with the ``tensor`` task, ``data_name``, the
file under ``dump_tensor_data/`` holding it), ``stack.json`` (the call stacks: ``{id: [[api
names], [frames, innermost first]]}``) and ``construct.json`` (the module tree, at levels L0 and
mix).

:func:`read_dump` reads every API of every step and rank; :func:`replay` re-executes each forward
API whose input tensors the dump holds (``Functional.X`` is ``torch.nn.functional.X``, ``Torch.X``
``torch.X``, ``Tensor.X`` the method ``torch.Tensor.X``) under :class:`sim.torch.DeviceMode` on a
simulated device, one call at a time from the dumped inputs, and compares its first tensor output
with the dumped one: bit for bit, in units in the last place, and by msprobe's accuracy metrics
(cosine similarity, largest absolute and relative error, the share of elements whose relative
error is above 1e-3), with the register events the call raised. Not yet re-executed: backward
entries, statistics-only dumps (no tensors: their statistics are read), other API kinds.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__: list[str] = []  # public as lossscale.msprobe's

_KINDS = {"Functional": "torch.nn.functional", "Torch": "torch", "Tensor": "torch.Tensor"}
_NAME = re.compile(r"^(?P<kind>\w+)\.(?P<api>.+)\.(?P<count>\d+)\.(?P<direction>forward|backward)$")


@dataclass(frozen=True)
class Entry:
    """One API call in a dump: where (step, rank), what (its dump name, kind, API and direction),
    its inputs (positional, then keyword) and outputs as dump.json has them, the user's source
    line from stack.json, and the folder holding its tensors (None: the statistics task)."""

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


def read_dump(path: str | Path) -> list[Entry]:
    """Every API call of an msprobe dump (a dump folder, a step's or rank's folder, or a
    dump.json), in step, rank and file order; ValueError naming a file that is not msprobe's."""
    entries = []
    for file in _dump_files(Path(path)):
        try:
            dump = json.loads(file.read_text())
            data = dump["data"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{str(file)!r} is not an msprobe dump.json ({err})") from None
        rank_dir, step_dir = file.parent.name, file.parent.parent.name
        stack_file = file.parent / "stack.json"
        sources: dict[str, str] = {}
        if stack_file.exists():
            for names, frames in json.loads(stack_file.read_text()).values():
                for name in names:
                    sources[name] = _user_frame(frames)
        tensors = Path(dump["dump_data_dir"]) if dump.get("dump_data_dir") else None
        if tensors is not None and not tensors.is_dir():
            tensors = file.parent / "dump_tensor_data"  # the dump was moved: its tensors are beside it
        for name, call in data.items():
            parts = _NAME.match(name)
            if parts is None:
                continue  # a module entry of levels L0 and mix (Module.*), not an API call
            forward = parts["direction"] == "forward"
            entries.append(Entry(_number(step_dir, "step"), _number(rank_dir, "rank"), name, parts["kind"],
                                 parts["api"], parts["direction"],
                                 list(call.get("input_args" if forward else "input") or []),
                                 dict(call.get("input_kwargs") or {}), list(call.get("output") or []),
                                 sources.get(name, ""), tensors if tensors is not None and tensors.is_dir() else None))
    return entries


class _Missing(Exception):
    """An argument a replay cannot rebuild (a tensor the dump did not keep, a type it cannot read)."""


def _value(meta: Any, folder: Path | None) -> Any:
    """An argument of the call, rebuilt from its dump.json entry."""
    import torch
    if meta is None:
        return None
    if isinstance(meta, list):
        return [_value(m, folder) for m in meta]
    if not isinstance(meta, dict):
        raise _Missing(f"an argument dump.json records as {meta!r}")
    kind = meta.get("type")
    if kind == "torch.Tensor":
        if folder is None or not meta.get("data_name"):
            raise _Missing("the dump keeps no tensors (statistics task)")
        return torch.load(folder / meta["data_name"], weights_only=True)
    if kind == "torch.dtype":
        return getattr(torch, str(meta["value"]).removeprefix("torch."))
    if kind in ("int", "float", "bool", "str") and "value" in meta:
        return meta["value"]
    raise _Missing(f"an argument of type {kind}")


def _ordered(bits: np.ndarray, width: int) -> np.ndarray:
    """Sign-magnitude bit patterns as integers in the order of the values they encode."""
    b = bits.astype(np.int64)
    sign = 1 << (width - 1)
    return np.where(b & sign, -(b & (sign - 1)), b)


def compare(got: np.ndarray, want: np.ndarray) -> dict[str, Any]:
    """The simulated output against the dumped one: identical bits; the largest distance in units
    in the last place of their dtype; msprobe's metrics in binary64 over the finite elements
    (cosine similarity, largest absolute and relative error, the share of elements whose relative
    error is above 1e-3, 0/0 counted as 0)."""
    identical = got.dtype == want.dtype and got.shape == want.shape and np.array_equal(
        got.view(f"u{got.dtype.itemsize}"), want.view(f"u{want.dtype.itemsize}"))
    out: dict[str, Any] = {"identical": bool(identical)}
    if got.shape != want.shape:
        return {**out, "max_ulp": None, "cosine": None, "max_abs_err": None, "max_rel_err": None,
                "rel_err_above_1e-3": None}
    width = got.dtype.itemsize * 8
    out["max_ulp"] = int(np.abs(_ordered(got.view(f"u{got.dtype.itemsize}"), width)
                                - _ordered(want.view(f"u{want.dtype.itemsize}"), width)).max(initial=0)) \
        if got.dtype == want.dtype else None
    a, b = got.astype(np.float64).reshape(-1), want.astype(np.float64).reshape(-1)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    with np.errstate(all="ignore"):
        norms = np.sqrt(np.sum(a * a) * np.sum(b * b))
        cosine = float(np.sum(a * b) / norms) if norms > 0 else (1.0 if not a.any() and not b.any() else 0.0)
        err = np.abs(a - b)
        rel = np.where(err == 0, 0.0, err / np.abs(b))
    out["cosine"] = min(max(cosine, -1.0), 1.0)  # the quotient's rounding can pass 1
    out["max_abs_err"] = float(err.max(initial=0.0))
    out["max_rel_err"] = float(rel.max(initial=0.0))
    out["rel_err_above_1e-3"] = float(np.count_nonzero(rel > 1e-3) / rel.size) if rel.size else 0.0
    return out


#: ``msprobe.csv``'s columns: the call, what was done with it, the comparison, the register, and
#: whether the simulated output holds Inf or NaN.
COLUMNS = ("step", "rank", "api", "source", "dtype", "shape", "status", "identical", "max_ulp", "cosine",
           "max_abs_err", "max_rel_err", "rel_err_above_1e-3", "events", "register", "nonfinite")


def replay(entries: list[Entry], profile: str = "atlas-a2", overflow_mode: str | None = None) -> list[dict[str, Any]]:
    """Each forward API of ``entries`` re-executed on a fresh ``Device(profile, overflow_mode)``
    register (cleared before each call): one row per entry (:data:`COLUMNS`), its ``status``
    ``compared`` or why it was not (a backward entry, no tensors, an API or argument it cannot
    rebuild, the call failing)."""
    import torch

    from sim import Device
    from sim.torch import DeviceMode
    dev = Device(profile, overflow_mode)
    rows = []
    for e in entries:
        want = next((o for o in e.outputs if isinstance(o, dict) and o.get("type") == "torch.Tensor"), None)
        row: dict[str, Any] = {"step": e.step, "rank": e.rank, "api": e.name, "source": e.source,
                               "dtype": (want or {}).get("dtype", ""), "shape": "x".join(map(str, (want or {}).get(
                                   "shape", []))), **dict.fromkeys(COLUMNS[7:])}
        rows.append(row)
        if e.direction != "forward":
            row["status"] = "not replayed: a backward entry"
            continue
        module = _KINDS.get(e.kind)
        fn = _resolve(module, e.api) if module else None
        if fn is None:
            row["status"] = f"not replayed: no torch function for {e.kind}.{e.api}"
            continue
        try:
            args = [_value(m, e.tensors) for m in e.inputs]
            kwargs = {k: _value(m, e.tensors) for k, m in e.kwargs.items()}
            dumped = _value(want, e.tensors) if want is not None else None
        except _Missing as why:
            row["status"] = f"not replayed: {why}"
            continue
        dev.clear_float_status()
        try:
            with DeviceMode(dev), torch.no_grad():
                result = fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 (the user's API, any error: reported, the rest go on)
            row["status"] = f"not replayed: the call failed ({type(err).__name__}: {err})"
            continue
        got = result if isinstance(result, torch.Tensor) else next(
            (r for r in result if isinstance(r, torch.Tensor)), None) if isinstance(result, (tuple, list)) else None
        register = dev.get_float_status()
        row.update(events=int(register[3]), register=" ".join(map(str, register.tolist())))
        if got is None or dumped is None:
            row["status"] = "replayed: no tensor output to compare"
            row["nonfinite"] = got is not None and not bool(torch.isfinite(got).all())
            continue
        out = got.detach().numpy()
        row["nonfinite"] = bool(not np.isfinite(out.astype(np.float64)).all())
        row.update(status="compared", **compare(out, dumped.detach().numpy()))
    return rows


def _bad(meta: Any) -> bool:
    """A dumped tensor that holds Inf or NaN (its Max or Min not finite), or, in binary16, +-65504
    (what saturation mode makes of an overflow)."""
    if not (isinstance(meta, dict) and meta.get("type") == "torch.Tensor"):
        return False
    ends = [meta.get("Max"), meta.get("Min")]
    if any(not isinstance(v, (int, float)) or not np.isfinite(v) for v in ends if v is not None):
        return True
    return meta.get("dtype") == "torch.float16" and any(v is not None and abs(v) == 65504.0 for v in ends)


def _tensors(metas: list[Any]) -> list[dict]:
    out = []
    for m in metas:
        if isinstance(m, list):
            out += _tensors(m)
        elif isinstance(m, dict) and m.get("type") == "torch.Tensor":
            out.append(m)
    return out


def verdict(entries: list[Entry], profiles: list[str] | None = None) -> list[dict[str, Any]]:
    """Per step and rank, the first producer of a non-finite (or, in binary16, +-65504) value: the
    first call, in the dump's order, whose input tensors were all finite and one of whose outputs
    is not (read from the dumped statistics, so a statistics-only dump serves too), and how many
    calls after it only carried such a value on (a bad input, a bad output); where the dump holds
    its tensors, whether a simulated device reproduces it on each profile in each of its overflow
    modes (INF/NaN mode: a non-finite output; saturation mode: a register event), msprobe's
    normal/abnormal question asked of each product. One row per step and rank that has one."""
    from sim import profiles as sim_profiles
    names = profiles or sim_profiles.names()
    rows = []
    for key in dict.fromkeys((e.step, e.rank) for e in entries):
        mine = [e for e in entries if (e.step, e.rank) == key]
        first, carried = None, 0
        for e in mine:
            bad_in = any(_bad(m) for m in _tensors(e.inputs) + _tensors(list(e.kwargs.values())))
            bad_out = any(_bad(m) for m in _tensors(e.outputs))
            if bad_out and not bad_in and first is None:
                first = e
            elif bad_out and bad_in:
                carried += 1
        if first is None:
            continue
        row: dict[str, Any] = {"step": key[0], "rank": key[1], "api": first.name, "source": first.source,
                               "carried_by": carried}
        for name in names:
            for mode in sim_profiles.get(name).overflow_modes:
                row[f"{name}/{mode.name.lower()}"] = _reproduced(first, name, mode.name.lower())
        rows.append(row)
    return rows


def _reproduced(entry: Entry, profile: str, mode: str) -> bool | None:
    """Whether the device reproduces the entry's overflow (None: it could not be re-executed)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a legacy saturation mode is asked for on purpose
        row = replay([entry], profile, mode)[0]
    if row["events"] is None:
        return None
    if mode == "saturation":
        return row["events"] > 0
    return bool(row.get("nonfinite"))


def _resolve(module: str, api: str):
    import importlib

    import torch
    root = torch.Tensor if module == "torch.Tensor" else importlib.import_module(module)
    fn = getattr(root, api, None)
    return fn if callable(fn) else None


def add_parser(p: argparse.ArgumentParser) -> None:
    """``lossscale msprobe``'s options."""
    from ..training.config import settings
    from .options import _setting
    p.add_argument("dump", type=Path, help="the dump's folder (holding step*/) or a dump.json")
    declared = {f.name: f for f in settings()}
    _setting(p, declared["profile"])
    _setting(p, declared["overflow_mode"])
    p.add_argument("--out", type=Path, required=True, help="output folder (its parent must exist)")
    p.add_argument("--force", action="store_true",
                   help="replace an earlier lossscale output in --out (only the files lossscale wrote there: "
                        "a folder holding anything else is refused)")


def command(args: argparse.Namespace) -> None:
    """``lossscale msprobe``: read, replay, write msprobe.csv and summary.json, print the worst."""
    import importlib.util

    from .files import _csv, check_out, json_text, staged, write_atomic
    from .options import UsageError
    if importlib.util.find_spec("torch") is None:
        raise UsageError("msprobe needs torch to read a dump's tensors: pip install -e \".[frameworks]\"")
    check_out(args.out, args.force)
    entries = read_dump(args.dump)
    rows = replay(entries, args.profile, args.overflow_mode)
    compared = [r for r in rows if r["status"] == "compared"]
    summary = {"dump": str(args.dump), "profile": args.profile, "overflow_mode": args.overflow_mode,
               "apis": len(rows), "steps": sorted({r["step"] for r in rows}),
               "ranks": sorted({r["rank"] for r in rows}),
               "compared": len(compared), "identical": sum(bool(r["identical"]) for r in compared),
               "with_events": sum(bool(r["events"]) for r in compared),
               "not_replayed": dict(sorted(Counter(r["status"] for r in rows if r["status"] != "compared").items())),
               "first_producers": verdict(entries)}
    with staged(args.out, args.force) as stage:
        write_atomic(stage / "msprobe.csv", _csv(COLUMNS, rows))
        write_atomic(stage / "summary.json", (json_text(summary) + "\n").encode())
    print(f"{args.dump}: {len(rows)} API calls, {len(summary['steps'])} step(s), {len(summary['ranks'])} rank(s); "
          f"{len(compared)} re-executed on {args.profile}: {summary['identical']} bit-identical, "
          f"{summary['with_events']} raised register events")
    worst = sorted((r for r in compared if not r["identical"]), key=lambda r: -(r["max_ulp"] or 0))[:5]
    for r in worst:
        print(f"  step {r['step']} rank {r['rank']} {r['api']}: {r['max_ulp']} ulp, max rel. error "
              f"{r['max_rel_err']:.3g}, events {r['events']}{', ' + r['source'] if r['source'] else ''}")
    for v in summary["first_producers"]:
        seen = [k for k, r in v.items() if "/" in k and r]
        print(f"step {v['step']} rank {v['rank']}: first non-finite value from {v['api']}"
              f"{' (' + v['source'] + ')' if v['source'] else ''}, carried on by {v['carried_by']} call(s); "
              f"reproduced on {len(seen)} of {sum('/' in k for k in v)} product/mode pairs")
    print(f"wrote {args.out}: msprobe.csv, summary.json")
