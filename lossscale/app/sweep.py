"""Policy sweeps: a grid of simulations, run in worker processes or on a Dask cluster.

A grid file (TOML) has a ``[sweep]`` table of arguments shared by every point
and a ``[grid]`` table of axes, each a list of values; every combination is one
call of :func:`lossscale.simulate`::

    [sweep]
    workload = "trace"
    steps = 200

    [grid]
    manager = ["exponential", "torch", "deepspeed"]
    profile = ["atlas-a2", "atlas-training"]
    seed = [0, 1]
    manager_args = [{}, {growth_interval = 20}]   # tables are values too

A manager can carry its own arguments, paired with it rather than crossed with every
manager: ``manager = ["exponential", {name = "torch", growth_interval = 20}]``.

Before any point runs, every point's names, types and manager and workload arguments are
checked, and all problems are reported at once. Each point is keyed by a hash of its
arguments. Finished points are appended to ``points.jsonl`` one line at a time (flushed and
synced, strict JSON), so a sweep that is
stopped and started again with the same folder runs only the points it does
not have; a torn last line is ignored and its point run again. A point that
raises is recorded with its error. ``results.csv`` (one row per point, in grid
order) and ``sweep.png`` (heat maps) are rebuilt, whole, at the end.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import itertools
import json
import math
import multiprocessing
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from sim.checks import integer

from ..training.config import check_arguments, recorded
from .files import (
    check_path,
    foreign_error,
    foreign_files,
    json_text,
    own_files,
    remove_own,
    write_atomic,
    write_manifest,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["load_grid", "points", "run_point", "run_sweep", "RESULT_COLUMNS", "check_points", "redraw_sweep",
           "heatmap_axes",
           "read_results"]

#: The settings a grid can fix or vary: those that say what a run is (``RunConfig``'s recorded fields).
AXES = tuple(f.name for f in recorded())
METRICS = ("steps_run", "skipped_steps", "overflow_steps", "undetected_overflow_steps", "false_positive_steps",
           "mean_underflow_fraction", "final_loss_scale", "final_loss", "final_accuracy", "baseline_loss",
           "baseline_accuracy", "fp8_overflowed_elements")
RESULT_COLUMNS = ("index", "key", *AXES, "status", "error", *METRICS)


def load_grid(path: Path) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The fixed arguments and the axes of a grid file."""
    if Path(path).is_dir():
        raise ValueError(f"grid file {str(path)!r} is a folder; give the grid's TOML file")
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"grid file {str(path)!r} not found") from None
    except UnicodeDecodeError:
        raise ValueError(f"grid file {str(path)!r} is not text (not UTF-8); give the grid's TOML file") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"grid file {str(path)!r} is not valid TOML: {err}") from None
    fixed, axes = data.pop("sweep", {}), data.pop("grid", {})
    if data:
        raise ValueError(f"grid file has unknown tables {', '.join(data)}; valid: sweep, grid")
    for name in [*fixed, *axes]:
        if name not in AXES:
            raise ValueError(f"unknown sweep argument {name!r}; valid: {', '.join(AXES)}")
    if not axes:
        raise ValueError(f"grid file {str(path)!r} has no axes: its [grid] table needs at least one list of values")
    for name, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid axis {name!r} must be a non-empty list, got {values!r}")
        if name in fixed:
            raise ValueError(f"{name!r} is both fixed ([sweep]) and an axis ([grid])")
        shown = [json.dumps(v, sort_keys=True) for v in values]
        twice = sorted({v for v in shown if shown.count(v) > 1})
        if twice:  # the same point twice: duplicate rows, double-weighted heat-map cells
            raise ValueError(f"grid axis {name!r} lists {', '.join(twice)} more than once; give each value once")
    return fixed, axes


def key_of(args: dict[str, Any]) -> str:
    """A stable hash of a point's arguments."""
    return hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:16]


def points(fixed: dict[str, Any], axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the axes (in file order, last axis fastest), with the fixed arguments;
    a manager given as a table ``{name = ..., ARG = ...}`` brings its own arguments."""
    names = list(axes)
    return [_paired({**fixed, **dict(zip(names, combo, strict=True))}) for combo in itertools.product(*axes.values())]


def _paired(point: dict[str, Any]) -> dict[str, Any]:
    manager = point.get("manager")
    if not isinstance(manager, dict):
        return point
    own = dict(manager)
    name = own.pop("name", None)
    if not isinstance(name, str):
        raise ValueError(f"a manager given as a table needs name = \"...\", got {manager!r}")
    shared = point.get("manager_args") or {}
    if not isinstance(shared, dict):
        return {**point, "manager": name}  # reported by the checks
    both = sorted(set(own) & set(shared))
    if both:
        raise ValueError(f"manager {name!r} sets {', '.join(both)} both in its table and in manager_args")
    return {**point, "manager": name, "manager_args": {**shared, **own}}


def check_points(grid_points: list[dict[str, Any]]) -> list[str]:
    """Every distinct problem of the points' arguments, with how many points have it."""
    seen: dict[str, int] = {}
    for p in grid_points:
        for problem in check_arguments(p):
            seen[problem] = seen.get(problem, 0) + 1
    return [f"{problem} ({n} of {len(grid_points)} points)" for problem, n in seen.items()]


def run_point(args: dict[str, Any]) -> dict[str, Any]:
    """One simulation; its metrics, or its error. Never raises."""
    import warnings

    from ..training.simulate import StepFailed, simulate
    row: dict[str, Any] = {"key": key_of(args), "args": args, "status": "ok", "error": ""}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = simulate(**args, record_events=False).summary  # a sweep keeps summaries, not event logs
        row.update({k: s[k] for k in METRICS if k in s})
        row.update(final_loss=s["final"]["loss"], final_accuracy=s["final"]["accuracy"],
                   baseline_loss=s["baseline_float32"]["loss"], baseline_accuracy=s["baseline_float32"]["accuracy"],
                   fp8_overflowed_elements=s["fp8"]["saturated_elements"] if s.get("fp8") else "")
    except Exception as err:  # a failing point is a result, not the end of the sweep
        err = err.error if isinstance(err, StepFailed) else err  # the workload's own error
        row.update(status="error", error=f"{type(err).__name__}: {err}")
    return row


def _read_done(path: Path) -> dict[str, dict[str, Any]]:
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by an interruption: that point runs again
            done[row["key"]] = _metrics_back(row)
    return done


def _metrics_back(row: dict[str, Any]) -> dict[str, Any]:
    """A point read back from points.jsonl as it was when it ran: strict JSON wrote a NaN metric as
    null and an infinite one as "inf" (so a resumed sweep's results.csv is a fresh one's, byte for byte)."""
    for name in METRICS:
        value = row.get(name)
        if value is None and name in row:
            row[name] = math.nan
        elif value in ("inf", "-inf"):
            row[name] = float(value)
    return row


def _append(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json_text(row, indent=None) + "\n")  # strict JSON: NaN as null
        f.flush()
        os.fsync(f.fileno())


def _local(todo: list[dict[str, Any]], workers: int) -> Iterator[dict[str, Any]]:
    # Workers forked from a clean server process, never from this one, which may run threads.
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method)) as pool:
        futures = [pool.submit(run_point, p) for p in todo]
        for fut in as_completed(futures):
            yield fut.result()


def _connect(scheduler: str, timeout: float = 10):
    """A dask.distributed client of ``scheduler``; ValueError if it cannot be reached."""
    try:
        from distributed import Client
    except ImportError:
        raise ValueError("--scheduler needs dask.distributed: pip install 'lossscale-npu[distributed]'") from None
    try:
        return Client(scheduler, timeout=timeout)
    except (OSError, TimeoutError, ValueError) as err:
        raise ValueError(f"could not reach the Dask scheduler at {scheduler!r} within {timeout:g} s "
                         f"({type(err).__name__}: {err}); is it running?") from None


def _dask(todo: list[dict[str, Any]], client) -> Iterator[dict[str, Any]]:
    from distributed import as_completed as dask_completed
    with client:
        futures = client.map(run_point, todo, pure=False)
        for fut in dask_completed(futures):
            yield fut.result()


def run_sweep(grid: Path, out: Path, workers: int = 1, scheduler: str | None = None, force: bool = False,
              progress: Callable[[int, int, int, float], None] | None = None,
              heatmap: tuple[str, str] | None = None,
              report: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run (or resume) the sweep of ``grid`` into ``out``; returns the result rows in grid order.
    ``report`` is told, before any point runs, how many finished points a resumed sweep reuses."""
    fixed, axes = load_grid(grid)
    if heatmap is not None:
        heatmap_axes([], heatmap)
    workers = integer("workers", workers, 1)
    grid_points = points(fixed, axes)
    problems = check_points(grid_points)
    if problems:
        raise ValueError("\n".join(problems))
    out = Path(out)
    own = _check_folder(out, (fixed, axes), force)
    client = _connect(scheduler) if scheduler else None  # before anything is written
    out.mkdir(exist_ok=True)
    with _locked(out):
        return _sweep(out, grid, own, force, client, workers, grid_points, axes, progress, heatmap, report)


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """One sweep at a time into a folder: an exclusive lock on its lock file, held while the sweep
    runs (the system releases it when the process ends, however it ends); a second sweep into
    the folder is refused at once. Where the system has no ``fcntl`` (Windows), no lock."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(out / LOCK, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ValueError(f"another lossscale sweep is writing into {str(out)!r} now; wait for it to finish (this "
                             f"command then resumes it) or choose another --out") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _sweep(out: Path, grid: Path, own: set[str], force: bool, client: Any, workers: int,
           grid_points: list[dict[str, Any]], axes: dict[str, list[Any]], progress, heatmap, report
           ) -> list[dict[str, Any]]:
    log = out / "points.jsonl"
    if force:  # lossscale's own files only (_check_folder refused a folder holding anything else)
        remove_own(out, own - {LOCK})  # the lock this sweep holds stays
        write_manifest(out, [LOCK])
    if log.exists() and log.stat().st_size and not log.read_bytes().endswith(b"\n"):
        with open(log, "a") as f:  # isolate a line torn by an interruption
            f.write("\n")
    write_atomic(out / "grid.toml", Path(grid).read_bytes())
    _record(out)
    done = _read_done(log)
    distinct = dict((key_of(p), p) for p in grid_points)
    todo = [p for key, p in distinct.items() if key not in done]
    reused = len(distinct) - len(todo)
    if reused and report is not None:
        report(f"reused {reused} of {len(distinct)} points from {log}; running the other {len(todo)}")
    started, finished, failed = time.perf_counter(), 0, 0
    source: Iterable[dict[str, Any]] = _dask(todo, client) if client is not None else _local(todo, workers)
    for row in source:
        _append(log, row)
        done[row["key"]] = row
        finished += 1
        failed += row["status"] != "ok"
        if progress is not None:
            elapsed = time.perf_counter() - started
            progress(finished, len(todo), failed, elapsed / finished * (len(todo) - finished))
    rows = [_flatten(i, p, done[key_of(p)]) for i, p in enumerate(grid_points)]
    write_atomic(out / "results.csv", _csv(rows))
    write_atomic(out / "sweep.png", _heatmaps(rows, axes=heatmap))
    _record(out)
    return rows


#: The files a sweep writes into its folder (a folder from before lossscale kept a manifest is
#: known as a sweep's by its grid.toml).
SWEEP_FILES = ("grid.toml", "points.jsonl", "results.csv", "sweep.png", ".lossscale-sweep.lock")
LOCK = SWEEP_FILES[-1]  #: the lock file of :func:`_locked`


def _record(out: Path) -> None:
    """The sweep's files (and any lossscale listed there before) in the folder's manifest."""
    write_manifest(out, sorted(n for n in own_files(out) | set(SWEEP_FILES) if (out / n).exists()))


def _check_folder(out: Path, grid: tuple[dict, dict], force: bool) -> set[str]:
    """Refuse a folder holding anything lossscale did not write there when ``force`` would start it
    over (those files are the user's), and, without ``force``, one that holds a different grid's
    sweep or no sweep; a missing parent always. Returns the files lossscale wrote there (the
    manifest's, and a sweep's from before it kept one)."""
    if not check_path(out).exists() or not any(out.iterdir()):
        return set()
    own = own_files(out)
    try:
        previous = load_grid(out / "grid.toml") if (out / "grid.toml").exists() else None
    except ValueError:
        previous = None
    if previous is not None:
        own |= {n for n in SWEEP_FILES if (out / n).exists()}
    foreign = foreign_files(out, own)
    if force:
        if foreign:
            raise foreign_error(out, foreign, force)
        return own
    again = "" if foreign else ", or --force to start it over with this grid"
    if previous is None:
        raise ValueError(f"{str(out)!r} is not empty and holds no sweep (no grid.toml); choose another --out{again}")
    if previous != grid:
        raise ValueError(f"{str(out)!r} holds the sweep of a different grid; use another --out{again}")
    return own


def read_results(folder: Path, typed: bool = False) -> list[dict[str, Any]]:
    """``results.csv``'s rows: as text, or (``typed``) each cell as its value: the index and
    count metrics as ints, the other metrics as floats, an axis by its ``RunConfig`` field
    (tables decoded from JSON, integers), None where a cell is empty; ValueError naming the file."""
    path = Path(folder) / "results.csv"
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    if not rows or tuple(rows[0]) != RESULT_COLUMNS:
        raise ValueError(f"{str(path)!r} does not have the columns {', '.join(RESULT_COLUMNS)}")
    if not typed:
        return rows
    kinds = {**{f.name: _axis_kind(f) for f in recorded()}, "index": int,
             **{m: int if m == "steps_run" or m.endswith(("_steps", "_elements")) else float for m in METRICS}}
    try:
        return [{k: v if k not in kinds else None if v == "" else kinds[k](v) for k, v in row.items()}
                for row in rows]
    except ValueError as err:
        raise ValueError(f"{str(path)!r} has a malformed cell ({err})") from None


def _axis_kind(f: Any) -> Callable[[str], Any]:
    """How a ``results.csv`` cell of the setting ``f`` is read: tables as JSON, integers as int."""
    if f.metadata["table"]:
        return json.loads
    if isinstance(f.default, int) and not isinstance(f.default, bool):
        return int
    return str


def redraw_sweep(folder: Path, fmt: str = "png", axes: tuple[str, str] | None = None) -> Path:
    """``sweep.FMT`` redrawn from ``results.csv`` (over ``axes``, or the default pair)."""
    rows = read_results(folder)
    path = Path(folder) / f"sweep.{fmt}"
    write_atomic(path, _heatmaps(rows, fmt, axes))
    return path


def _flatten(index: int, args: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    flat = {"index": index, "key": row["key"], "status": row["status"], "error": row["error"]}
    for name in AXES:
        value = args.get(name, "")
        flat[name] = json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
    for name in METRICS:
        flat[name] = row.get(name, "")
    return flat


def _csv(rows: list[dict[str, Any]]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=RESULT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: repr(v) if isinstance(v, float) else ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue().encode()


def heatmap_axes(rows: list[dict[str, Any]], axes: tuple[str, str] | None = None) -> tuple[str, str | None]:
    """The two axes a sweep's heat maps are drawn over: ``axes`` (checked), else the first two
    that vary across the points (manager and profile first, seed last: the cells average over
    seeds), else what there is. A varying axis left out is named in the figure's title."""
    if axes is not None:
        for name in axes:
            if name not in AXES:
                raise ValueError(f"unknown heat-map axis {name!r}; valid: {', '.join(AXES)}")
        if axes[0] == axes[1]:
            raise ValueError(f"the heat map needs two different axes, got {axes[0]!r} twice")
        for name in axes:
            values = {str(r.get(name)) for r in rows}
            if len(values) == 1:
                varying = [a for a in AXES if len({str(r.get(a)) for r in rows}) > 1]
                warnings.warn(f"heat-map axis {name!r} does not vary in this sweep (one value: {values.pop()!r}); "
                              f"axes that do: {', '.join(varying) or 'none'}", UserWarning, stacklevel=2)
        return axes[0], axes[1]
    varying = [a for a in ("manager", "profile", *(a for a in AXES if a != "seed"), "seed")
               if len({str(r.get(a)) for r in rows}) > 1]
    varying = list(dict.fromkeys(varying))
    if not varying:
        return "manager", None
    return varying[0], varying[1] if len(varying) > 1 else None


def _heatmaps(rows: list[dict[str, Any]], fmt: str = "png", axes: tuple[str, str] | None = None) -> bytes:
    """Skipped steps and final loss over two axes (failed points marked, not averaged)."""
    from .plots import heatmaps
    row_axis, col_axis = heatmap_axes(rows, axes)
    return heatmaps(rows, row_axis, col_axis, fmt=fmt, over=AXES)
