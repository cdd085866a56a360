"""Run files: ``trajectory.csv``, ``summary.json``, ``events.csv`` (the devices' event log,
when kept), ``fp8.csv`` (every tensor's FP8 scale per step, with an FP8 recipe), ``shadow.csv``
(what each alternative would have given, with shadows), ``scale.png``, ``events.png``, ``fp8.png``
and ``shadow.png``, written whole; a replay's ``replay.csv``.

Every file is written to a temporary name in the same folder and renamed into
place, so an interrupted run never leaves a half-written file that looks
complete.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, get_args, get_origin

from ..replay import Decision, Log
from ..training.records import (
    COLUMNS,
    EVENT_COLUMNS,
    FP8_COLUMNS,
    SCHEMA,
    SHADOW_COLUMNS,
    EventRow,
    Fp8Row,
    Run,
    ShadowRow,
)

__all__ = ["write_atomic", "write_run", "read_run", "check_out", "check_path", "check_folder", "write_plots",
           "KeepWritten", "MANIFEST", "write_manifest", "add_to_manifest", "own_files", "foreign_files",
           "foreign_error", "remove_own",
           "json_text", "staged", "cell", "replay_columns", "replay_rows", "replay_csv", "read_replay"]

_UMASK = os.umask(0)
os.umask(_UMASK)


def write_atomic(path: Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_UMASK)  # an ordinary file's mode, not mkstemp's private 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_path(out: Path) -> Path:
    """Refuse an output path that is a file, whose parent folder does not exist, or that cannot
    be written: its parent (where a run's staging folder is made and renamed into place) or,
    where it exists, the folder itself (moved aside by ``--force``, written into by a sweep).
    Checked before any work, so that a long run does not fail at its end."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"output path {str(out)!r} exists and is not a folder")
    taken = next((p for p in reversed(out.parents) if p.exists() and not p.is_dir()), None)
    if taken is not None:
        raise ValueError(f"{str(taken)!r} in the output path {str(out)!r} is a file, not a folder")
    default_root = out.parent.resolve() == Path("runs").resolve()  # the runs/ folder is made, as run makes it
    if not out.exists() and not out.parent.is_dir() and not default_root:
        raise ValueError(f"the folder {str(out.parent)!r} for output {str(out)!r} does not exist; create it first")
    for folder in (out.parent, out) if out.exists() else (out.parent,):
        if not folder.exists():  # runs/, made when the run is written
            continue
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ValueError(f"cannot write to the folder {str(folder)!r} (permission denied) for output {str(out)!r}; "
                             f"choose an --out you can write to")
        try:  # what the write will do, tried: /proc and /sys pass os.access and refuse a new folder
            os.rmdir(tempfile.mkdtemp(dir=folder, prefix=".lossscale-probe."))
        except OSError as err:
            raise ValueError(f"cannot write to the folder {str(folder)!r} for output {str(out)!r} "
                             f"({err.strerror or err}); choose an --out you can write to") from None
    return out


#: The list of the files lossscale wrote into an output folder (hidden, beside them): what
#: ``--force`` may replace. Anything else in the folder is the user's, and is never removed.
MANIFEST = ".lossscale-files.json"


def write_manifest(folder: Path, names: list[str] | None = None) -> None:
    """Record ``names`` (paths relative to ``folder``; default: every file under it) as the files
    lossscale wrote there."""
    folder = Path(folder)
    if names is None:
        names = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir() and p.name != MANIFEST]
    write_atomic(folder / MANIFEST, (json.dumps({"written_by": "lossscale", "files": sorted(names)}, indent=1)
                                     + "\n").encode())


def add_to_manifest(folder: Path, paths: list[Path]) -> None:
    """Add ``paths`` (written by lossscale into ``folder`` or below it) to the folder's manifest,
    where it has one (an output of lossscale's: ``plot`` redraws into it)."""
    folder = Path(folder)
    if (folder / MANIFEST).exists():
        write_manifest(folder, sorted(own_files(folder) | {Path(p).relative_to(folder).as_posix() for p in paths}))


def remove_own(folder: Path, names: set[str]) -> None:
    """Remove the files ``names`` lossscale wrote into ``folder`` (relative paths), and the folders
    under it that this leaves empty."""
    folder = Path(folder)
    for name in sorted(names):
        path = folder / name
        path.unlink(missing_ok=True)
        for parent in path.parents:
            if parent == folder or not parent.is_relative_to(folder):
                break
            try:
                parent.rmdir()
            except OSError:  # not empty (or gone)
                break


def own_files(folder: Path) -> set[str]:
    """The files lossscale's manifest in ``folder`` lists (none without a readable one)."""
    try:
        listed = json.loads((Path(folder) / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    return {str(n) for n in listed} if isinstance(listed, list) else set()


def foreign_files(folder: Path, own: set[str] | None = None) -> list[str]:
    """What ``folder`` holds that lossscale did not write there (not in its manifest, or in ``own``):
    files, links and empty folders, as paths relative to it, sorted."""
    folder = Path(folder)
    own = own_files(folder) if own is None else own
    found = []
    for root, dirs, names in os.walk(folder):
        rel = Path(root).relative_to(folder)
        found += [(rel / n).as_posix() for n in names if (rel / n).as_posix() not in own and n != MANIFEST]
        found += [(rel / d).as_posix() + "/" for d in dirs if os.path.islink(Path(root) / d)
                  or not any(Path(root, d).iterdir())]
        dirs[:] = [d for d in dirs if not os.path.islink(Path(root) / d)]
    return sorted(found)


def foreign_error(out: Path, foreign: list[str], force: bool) -> ValueError:
    """The refusal of an output folder holding files lossscale did not write (the first five named)."""
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    return ValueError(f"output folder {str(out)!r} holds files lossscale did not write ({shown})"
                      f"{'; --force replaces only what lossscale wrote' if force else ''}: nothing was changed; "
                      f"choose another --out, or move those files away")


def check_out(out: Path, force: bool) -> Path:
    """:func:`check_path`; refuse the current folder or one that holds it (a run's folder is
    put in place by renaming), a folder holding anything lossscale did not write there (with or
    without ``force``: those files are the user's), and, without ``force``, an earlier output."""
    out = check_path(out)
    here = Path.cwd().resolve()
    where = out.resolve()
    if where == where.parent or here == where or where in here.parents:
        raise ValueError(f"output folder {str(out)!r} is the current folder or holds it; name a new folder "
                         f"(for example runs/my-run)")
    if out.is_dir() and any(out.iterdir()):
        foreign = foreign_files(out)
        if foreign:
            raise foreign_error(out, foreign, force)
        if not force:
            raise ValueError(f"output folder {str(out)!r} holds an earlier lossscale output; use --force to "
                             f"replace it, or choose another --out")
    return out


class KeepWritten(Exception):
    """An error after which the files written so far are kept: :func:`staged` puts its folder in
    place before it goes on (a run whose workload raised keeps its finished steps)."""


@contextlib.contextmanager
def staged(out: Path, force: bool) -> Iterator[Path]:
    """A new folder beside ``out`` to write a run's files into; when the block ends (or is
    interrupted, or raises :class:`KeepWritten`: its finished steps are written), it becomes
    ``out`` in one rename, so no
    earlier run's file survives beside the new ones and a reader never sees half of them.

    ``out`` absent or empty: replaced. Not empty (``force``): the old folder is moved aside, the
    new one put in place, then the old one removed. Not empty without ``force`` (another run
    filled it meanwhile): nothing of it is touched; this run's files go to ``out-2`` (or the
    next free name) and ValueError says so. An error in the block removes the new folder."""
    out = Path(out)
    made = not out.parent.exists()
    out.parent.mkdir(parents=True, exist_ok=True)  # the default runs/ folder
    _stale_stages(out.parent)
    try:
        stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.{os.getpid()}.", suffix=".writing"))
    except OSError as err:
        raise ValueError(f"cannot write the output folder {str(out)!r} ({err.strerror or err}); choose an --out "
                         f"you can write to") from None
    try:
        os.chmod(stage, 0o777 & ~_UMASK)
        yield stage
    except (KeyboardInterrupt, KeepWritten):
        write_manifest(stage)
        _publish(stage, out, force)
        raise
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if made:
            with contextlib.suppress(OSError):
                out.parent.rmdir()
        raise
    write_manifest(stage)
    _publish(stage, out, force)


def _stale_stages(parent: Path) -> None:
    """The staging folders a killed run left in ``parent`` (its process id is in the name, and no
    such process runs): an empty one is removed, one holding files is kept and named on stderr."""
    for stage in parent.glob(".*.writing"):
        try:
            pid = int(stage.name.rsplit(".", 3)[-3])
            os.kill(pid, 0)
            continue  # its run is still running (or the id is another process's now: left alone)
        except (ValueError, IndexError, PermissionError):
            continue  # not named by this version, or another user's process
        except ProcessLookupError:
            pass
        if stage.is_dir() and not any(stage.rglob("*")):
            with contextlib.suppress(OSError):
                stage.rmdir()
                print(f"lossscale: note: removed {str(stage)!r}, the empty staging folder of a run that was killed",
                      file=sys.stderr)
        else:
            print(f"lossscale: note: {str(stage)!r} holds what a killed run wrote before it was stopped; it was left "
                  f"as it is", file=sys.stderr)


def _publish(stage: Path, out: Path, force: bool) -> None:
    try:
        os.rename(stage, out)  # atomic; succeeds only where out is absent or an empty folder
        return
    except OSError as err:
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            shutil.rmtree(stage, ignore_errors=True)
            raise
    if force and not foreign_files(out):  # checked again: the user may have put a file there meanwhile
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".replaced"))
        os.rename(out, old / out.name)
        os.rename(stage, out)
        shutil.rmtree(old)
        return
    n = 2
    while True:
        keep = out.with_name(f"{out.name}-{n}")
        try:
            os.rename(stage, keep)
            break
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            n += 1
    raise ValueError(f"output folder {str(out)!r} was filled by another run (or given other files) while this one "
                     f"ran; nothing of it was changed, and this run's files are in {str(keep)!r}")


def json_text(value: Any, indent: int | None = 2) -> str:
    """Strict JSON (no bare NaN or Infinity): NaN as null, infinities as "inf" / "-inf"."""
    return json.dumps(_json_safe(value), indent=indent, sort_keys=True, allow_nan=False)


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
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value)  # the register: its numbers, space-separated
    return str(value)


def _csv(columns, rows) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for rec in rows:
        writer.writerow([_csv_value("" if rec[c] is None else rec[c]) for c in columns])
    return buf.getvalue().encode()


def write_run(run: Run, out: Path, plot: bool = True, fmt: str = "png") -> list[Path]:
    """Write the run's files into ``out`` (created if need be), the plots in ``fmt`` (png, svg
    or pdf); returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "trajectory.csv", out / "summary.json"]
    write_atomic(paths[0], _csv(COLUMNS, run.records))
    write_atomic(paths[1], (json_text(run.summary) + "\n").encode())
    if run.summary.get("events_recorded") is not None:
        paths.append(out / "events.csv")
        write_atomic(paths[-1], _csv(EVENT_COLUMNS, run.events))
    if run.summary.get("fp8"):
        paths.append(out / "fp8.csv")
        write_atomic(paths[-1], _csv(FP8_COLUMNS, run.fp8))
    if run.summary.get("shadow"):
        paths.append(out / "shadow.csv")
        write_atomic(paths[-1], _csv(SHADOW_COLUMNS, run.shadow))
    if plot:
        paths += write_plots(run, out, fmt)
    return paths


def write_plots(run: Run, out: Path, fmt: str = "png") -> list[Path]:
    """``scale.png``, ``events.png`` when the run has events, ``fp8.png`` when it ran FP8 matmuls,
    ``shadow.png`` when it had shadows (or .svg, .pdf); their paths."""
    from .plots import plot_events, plot_fp8, plot_run, plot_shadow
    paths = [Path(out) / f"scale.{fmt}"]
    write_atomic(paths[0], plot_run(run, fmt=fmt))
    if run.events:
        paths.append(Path(out) / f"events.{fmt}")
        write_atomic(paths[-1], plot_events(run, fmt=fmt))
    if run.fp8:
        paths.append(Path(out) / f"fp8.{fmt}")
        write_atomic(paths[-1], plot_fp8(run, fmt=fmt))
    if run.shadow:
        paths.append(Path(out) / f"shadow.{fmt}")
        write_atomic(paths[-1], plot_shadow(run, fmt=fmt))
    return paths


def check_folder(folder: Path, what: str) -> Path:
    """``folder`` as a Path; ValueError if it does not exist or is not a folder (``what`` to give)."""
    folder = Path(folder)
    if not folder.exists():
        raise ValueError(f"{str(folder)!r} does not exist")
    if not folder.is_dir():
        raise ValueError(f"{str(folder)!r} is not a folder; give {what}")
    return folder


def read_run(folder: Path) -> Run:
    """A run back from its files (for ``lossscale plot`` and :func:`lossscale.load_run`), each
    cell of the type its column has (:class:`Row`, :class:`EventRow`, :class:`Fp8Row`);
    ValueError naming a missing or malformed file."""
    folder = check_folder(folder, "the run's folder (it holds trajectory.csv)")
    try:
        text = (folder / "trajectory.csv").read_text()
        summary_text = (folder / "summary.json").read_text()
    except FileNotFoundError as err:
        raise ValueError(f"{str(folder)!r} holds no run: {Path(err.filename).name} is missing") from None
    try:
        summary = json.loads(summary_text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{str(folder / 'summary.json')!r} is not valid JSON ({err})") from None
    records = _rows(folder / "trajectory.csv", text, SCHEMA)
    logs = {}
    for name, record in (("events", EventRow), ("fp8", Fp8Row), ("shadow", ShadowRow)):
        path = folder / f"{name}.csv"
        logs[name] = _rows(path, path.read_text(), {f.name: f.type for f in fields(record)},
                           {f.name: f.default for f in fields(record) if f.default is not MISSING}) \
            if path.exists() else []
    return Run(records, summary, summary.get("arguments", {}), logs["events"], logs["fp8"], logs["shadow"])


def cell(kind: Any, text: str) -> Any:
    """One CSV cell as a value of ``kind``, a column's type: an empty cell is None, except in a
    column of type ``str`` (text, possibly empty); booleans are written 1/0; a tuple of ints (the
    register) is its numbers separated by spaces."""
    optional = type(None) in get_args(kind)
    if optional:
        kind = next(a for a in get_args(kind) if a is not type(None))
    if kind is str:
        return None if optional and text == "" else text
    if text == "":
        return None
    if kind is bool:
        if text not in _BOOLS:
            raise ValueError(f"{text!r} is not 1 or 0")
        return _BOOLS[text]
    if get_origin(kind) is tuple:
        return tuple(int(v) for v in text.split())
    return kind(text)


_BOOLS = {"1": True, "0": False, "True": True, "False": False}


def _rows(path: Path, text: str, kinds: dict[str, Any], defaults: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A CSV file's rows, each cell by :func:`cell` of its column's type in ``kinds`` (whose keys
    are the columns, in order); ValueError naming the file and line. A file written before the
    columns that have ``defaults`` were added (the first columns only) reads with those."""
    columns = tuple(kinds)
    reader = csv.DictReader(io.StringIO(text))
    have = tuple(reader.fieldnames or ())
    missing = columns[len(have):]
    if have != columns[:len(have)] or not set(missing) <= set(defaults or {}):
        raise ValueError(f"{str(path)!r} does not have the columns {', '.join(columns)}")
    rows = []
    for line, row in enumerate(reader, start=2):
        try:
            if None in row or None in row.values():
                raise ValueError("wrong number of cells")
            rows.append({**{k: cell(kinds[k], v) for k, v in row.items()}, **{k: defaults[k] for k in missing}})
        except (TypeError, ValueError) as err:
            raise ValueError(f"{str(path)!r} line {line} is malformed ({err}); the file may be truncated") from None
    return rows


# -- replay.csv: a log's steps, and each manager's replay on the log's bounds -------------------------

#: A manager's columns in replay.csv, after its name and an underscore: its decision (overflow,
#: clean or unknown), and the lowest and highest scale it may hold before the step (equal where its
#: state is one; both empty once the replay has lost its state).
REPLAY_MANAGER_COLUMNS = ("decision", "scale_low", "scale_high")


def replay_columns(managers: list[str]) -> tuple[str, ...]:
    """replay.csv's columns: the log's step, line, overflow and the scale the step ran at (empty
    where the log does not say); ``steps``, how many steps the row stands for (1; a gap's count,
    ``low-high`` where bounded, ``low+`` where the log gives no bound; ``overflow`` on a gap row:
    some of its steps overflowed); then each manager's (see :data:`REPLAY_MANAGER_COLUMNS`; on a
    gap row, its decision for every step of the gap and the scales it may hold as the gap begins)."""
    return ("step", "line", "overflow", "scale", "steps",
            *(f"{m}_{c}" for m in managers for c in REPLAY_MANAGER_COLUMNS))


def _steps(e: Any) -> str:
    if e.span is None:
        return "1"
    lo, hi = e.span
    return f"{lo}+" if hi is None else str(lo) if lo == hi else f"{lo}-{hi}"


def replay_rows(log: Log, scales: list[float | None], decisions: dict[str, list[Decision]]) -> list[dict[str, Any]]:
    """One row per step of the log (see :func:`replay_columns`)."""
    rows = []
    for i, (e, s) in enumerate(zip(log.events, scales, strict=True)):
        row: dict[str, Any] = {"step": e.step, "line": e.line, "overflow": e.overflow or bool(e.gap and e.overflows),
                               "scale": s, "steps": _steps(e)}
        for m, ds in decisions.items():
            held = ds[i].scales
            row.update({f"{m}_decision": ds[i].decision, f"{m}_scale_low": min(held) if held else None,
                        f"{m}_scale_high": max(held) if held else None})
        rows.append(row)
    return rows


def replay_csv(rows: list[dict[str, Any]], managers: list[str]) -> bytes:
    """replay.csv's bytes."""
    return _csv(replay_columns(managers), rows)


def read_replay(folder: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A replay folder's rows and summary back (for ``lossscale plot``); ValueError naming a
    missing or malformed file."""
    folder = check_folder(folder, "the replay's folder (it holds replay.csv)")
    try:
        summary = json.loads((folder / "summary.json").read_text())
        managers = [m["name"] for m in summary["managers"]]
    except FileNotFoundError:
        raise ValueError(f"{str(folder)!r} holds no replay: summary.json is missing") from None
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{str(folder / 'summary.json')!r} is not a replay's summary ({err})") from None
    kinds = dict(zip(replay_columns(managers), [int, int, bool, float, str, *[
        str if c == "decision" else float for _ in managers for c in REPLAY_MANAGER_COLUMNS]], strict=True))
    path = folder / "replay.csv"
    return _rows(path, path.read_text(), kinds), summary
