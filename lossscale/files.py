"""Run files: ``trajectory.csv``, ``summary.json`` and ``scale.png``, written whole.

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

from .simulate import COLUMNS, SCHEMA, Run

__all__ = ["write_atomic", "write_run", "read_run", "check_out"]



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


def write_run(run: Run, out: Path, plot: bool = True) -> list[Path]:
    """Write the run's files into ``out`` (created if need be); returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for rec in run.records:
        writer.writerow([_csv_value(rec[c]) for c in COLUMNS])
    paths = [out / "trajectory.csv", out / "summary.json"]
    write_atomic(paths[0], buf.getvalue().encode())
    write_atomic(paths[1], (json.dumps(_json_safe(run.summary), indent=2, sort_keys=True) + "\n").encode())
    if plot:
        from .plots import plot_run
        paths.append(out / "scale.png")
        write_atomic(paths[2], plot_run(run))
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
    return Run(records, summary, summary.get("arguments", {}))
