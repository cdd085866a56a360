"""Run files: ``trajectory.csv``, ``summary.json``, ``events.csv`` (the devices' event log,
when kept), ``scale.png`` and ``events.png``, written whole.

Every file is written to a temporary name in the same folder and renamed into
place, so an interrupted run never leaves a half-written file that looks
complete.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from .simulate import COLUMNS, EVENT_COLUMNS, SCHEMA, Run

__all__ = ["write_atomic", "write_run", "read_run", "check_out", "write_plots"]



def write_atomic(path: Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_out(out: Path, force: bool) -> Path:
    """Refuse an output path that is a file, or a non-empty folder without ``force``."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"output path {str(out)!r} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ValueError(f"output folder {str(out)!r} exists and is not empty; use --force to overwrite")
    return out


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item"):
        return _json_safe(value.item())
    return value


def _csv_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value)  # shortest round-trip text: the file carries the exact binary64 value
    return str(value)


def _csv(columns, rows) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for rec in rows:
        writer.writerow([_csv_value("" if rec[c] is None else rec[c]) for c in columns])
    return buf.getvalue().encode()


def write_run(run: Run, out: Path, plot: bool = True) -> list[Path]:
    """Write the run's files into ``out`` (created if need be); returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "trajectory.csv", out / "summary.json"]
    write_atomic(paths[0], _csv(COLUMNS, run.records))
    write_atomic(paths[1], (json.dumps(_json_safe(run.summary), indent=2, sort_keys=True) + "\n").encode())
    if run.summary.get("events_recorded") is not None:
        paths.append(out / "events.csv")
        write_atomic(paths[-1], _csv(EVENT_COLUMNS, run.events))
    if plot:
        paths += write_plots(run, out)
    return paths


def write_plots(run: Run, out: Path) -> list[Path]:
    """``scale.png``, and ``events.png`` when the run has events; returns their paths."""
    from .plots import plot_events, plot_run
    paths = [Path(out) / "scale.png"]
    write_atomic(paths[0], plot_run(run))
    if run.events:
        paths.append(Path(out) / "events.png")
        write_atomic(paths[1], plot_events(run))
    return paths


def read_run(folder: Path) -> Run:
    """A run back from its files (for ``lossscale plot``)."""
    folder = Path(folder)
    try:
        text = (folder / "trajectory.csv").read_text()
        summary = json.loads((folder / "summary.json").read_text())
    except FileNotFoundError as err:
        raise ValueError(f"{str(folder)!r} holds no run: {Path(err.filename).name} is missing") from None
    rows = list(csv.DictReader(io.StringIO(text)))
    if rows and set(rows[0]) != set(COLUMNS):
        raise ValueError(f"{str(folder / 'trajectory.csv')!r} does not have the columns {', '.join(COLUMNS)}")
    records = []
    for row in rows:
        rec: dict[str, Any] = {}
        for k, v in row.items():
            kind = SCHEMA[k]
            rec[k] = v == "1" if kind is bool else kind(v)
        records.append(rec)
    events = []
    if (folder / "events.csv").exists():
        for row in csv.DictReader(io.StringIO((folder / "events.csv").read_text())):
            events.append({**row, "rank": int(row["rank"]), "elements": int(row["elements"]),
                           "step": int(row["step"]) if row["step"] else None, "phase": row["phase"] or None,
                           "label": row["label"] or None})
    return Run(records, summary, summary.get("arguments", {}), events)
