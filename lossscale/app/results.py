"""Output folders read back as typed values: :func:`load_run` takes the folder that
``lossscale run``, ``compare`` or ``sweep`` wrote and returns a :class:`RunResult` (the
trajectory as :class:`Row` values, the :class:`Summary`, the event and FP8 logs as
:class:`EventRow` and :class:`Fp8Row` values), a :class:`CompareResult` (one run per manager)
or a :class:`SweepResult` (the grid and one typed row per point); each has ``to_pandas()``
when pandas is installed."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..training.records import (
    COLUMNS,
    EVENT_COLUMNS,
    FP8_COLUMNS,
    SHADOW_COLUMNS,
    EventRow,
    Fp8Row,
    Row,
    Run,
    ShadowRow,
    Summary,
)
from .files import check_folder, read_run
from .sweep import load_grid, read_results

if TYPE_CHECKING:  # pragma: no cover
    import pandas

__all__ = ["RunResult", "CompareResult", "SweepResult", "summary_of", "compare_members"]


def _pandas():
    try:
        import pandas
    except ImportError:
        raise ImportError("to_pandas() needs pandas: pip install pandas") from None
    return pandas


def _number(value: Any) -> Any:
    """A number as summary.json writes it back (strict JSON: NaN as null, infinities as text)."""
    if value is None:
        return math.nan
    if value in ("inf", "-inf"):
        return float(value)
    return value


def summary_of(data: dict[str, Any]) -> Summary:
    """``summary.json``'s dict as a :class:`Summary`: NaN and the infinities back as floats in
    its number fields, None for a key that an older release did not write (extra keys are
    left out; the dict itself is :attr:`RunResult.run`'s ``summary``)."""
    values = {}
    for f in fields(Summary):
        value = data.get(f.name)
        if f.type is float:
            value = _number(value)
        elif f.type == dict[str, float] and isinstance(value, dict):
            value = {k: _number(v) for k, v in value.items()}
        values[f.name] = value
    return Summary(**values)


@dataclass(frozen=True)
class RunResult:
    """A run folder: the trajectory (a :class:`Row` per step), the :class:`Summary`, the event
    log, the FP8 log and the shadow log (empty when the run kept none), and :attr:`run`, the same as plain dicts
    for the ``figure_*`` functions of :mod:`lossscale.app.plots`."""

    folder: Path
    rows: tuple[Row, ...]
    summary: Summary
    events: tuple[EventRow, ...]
    fp8: tuple[Fp8Row, ...]
    run: Run = field(repr=False)
    shadow: tuple[ShadowRow, ...] = ()

    def to_pandas(self, table: str = "trajectory") -> pandas.DataFrame:
        """``table`` (``trajectory``, ``events``, ``fp8`` or ``shadow``) as a DataFrame, a column per
        field (``register`` holds its 8 numbers as a tuple)."""
        tables = {"trajectory": (self.rows, COLUMNS), "events": (self.events, EVENT_COLUMNS),
                  "fp8": (self.fp8, FP8_COLUMNS), "shadow": (self.shadow, SHADOW_COLUMNS)}
        if table not in tables:
            raise ValueError(f"unknown table {table!r}; valid: {', '.join(tables)}")
        rows, columns = tables[table]
        return _pandas().DataFrame([[getattr(r, c) for c in columns] for r in rows], columns=list(columns))


@dataclass(frozen=True)
class CompareResult:
    """A compare folder: the managers in the order they ran, and each one's run."""

    folder: Path
    managers: tuple[str, ...]
    runs: dict[str, RunResult]

    def to_pandas(self, table: str = "trajectory") -> pandas.DataFrame:
        """Every manager's ``table`` (see :meth:`RunResult.to_pandas`) in one frame, with a
        ``manager`` column first."""
        pd = _pandas()
        frames = [self.runs[m].to_pandas(table) for m in self.managers]
        for name, frame in zip(self.managers, frames, strict=True):
            frame.insert(0, "manager", name)
        return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True)
class SweepResult:
    """A sweep folder: the grid (``[sweep]``'s fixed arguments and ``[grid]``'s axes, from its
    ``grid.toml``) and ``results.csv``'s rows with typed cells (integers, floats, tables as
    dicts, None where empty)."""

    folder: Path
    fixed: dict[str, Any]
    axes: dict[str, list[Any]]
    rows: tuple[dict[str, Any], ...]

    def to_pandas(self) -> pandas.DataFrame:
        """``results.csv`` as a DataFrame (tables stay dicts)."""
        from .sweep import RESULT_COLUMNS
        return _pandas().DataFrame(list(self.rows), columns=list(RESULT_COLUMNS))


def _run(folder: Path) -> RunResult:
    run = read_run(folder)
    return RunResult(folder, tuple(Row(**r) for r in run.records), summary_of(run.summary),
                     tuple(EventRow(**e) for e in run.events), tuple(Fp8Row(**r) for r in run.fp8), run,
                     tuple(ShadowRow(**r) for r in run.shadow))


def compare_members(folder: Path) -> list[Path]:
    """A compare folder's run folders: in the order compare ran them (``compare.json``), else
    every sub-folder holding a ``trajectory.csv``, by name."""
    if (folder / "compare.json").exists():
        order = json.loads((folder / "compare.json").read_text())["managers"]
        return [folder / name for name in order if (folder / name / "trajectory.csv").exists()]
    return sorted(p for p in folder.iterdir() if (p / "trajectory.csv").exists())


def load_run(folder: str | Path) -> RunResult | CompareResult | SweepResult:
    """The folder that ``lossscale run`` (``trajectory.csv``), ``compare`` (a run folder per
    manager) or ``sweep`` (``results.csv``) wrote, read back as typed values; ValueError naming
    what the folder lacks or which file is malformed."""
    folder = check_folder(Path(folder), "the folder that lossscale run, compare or sweep wrote")
    if (folder / "trajectory.csv").exists():
        return _run(folder)
    if (folder / "results.csv").exists():
        fixed, axes = load_grid(folder / "grid.toml")
        return SweepResult(folder, fixed, axes, tuple(read_results(folder, typed=True)))
    members = compare_members(folder)
    if members:
        return CompareResult(folder, tuple(p.name for p in members), {p.name: _run(p) for p in members})
    raise ValueError(f"{str(folder)!r} holds no run, compare or sweep output (no trajectory.csv, no results.csv, "
                     f"no run folders)")
