"""The ``lossscale`` command line: run, compare, plot, profiles, managers, sweep, replay, msprobe.

Bad input gets one line on stderr saying what is wrong and what is valid, and
exit code 2; no traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from sim import profiles

from ..policy.core import MANAGERS
from ..training.config import manager_arguments, settings
from ..training.records import Run
from ..training.simulate import Interrupted, StepFailed, simulate
from . import IMAGE_FORMATS
from .files import KeepWritten
from .options import UsageError, _axis_pair, _common, _dest, _Help, _integer, _option, _pairs, _Parser, _setting

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    from ..version import __version__
    fmt = _Help
    parser = _Parser(prog="lossscale", description="Loss scaling on simulated Ascend NPUs: train a workload in "
                     "binary16 on a simulated Atlas device under a framework's loss scaler and overflow check.",
                     formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"lossscale {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, description=description, formatter_class=fmt)

    run = command("run", "train one workload under one loss-scale manager",
                  "Train a workload on simulated devices under one manager, beside a binary32 baseline; write "
                  "trajectory.csv, summary.json, events.csv and the plots to a run folder.")
    _common(run)
    cmp = command("compare", "the same run under several managers: one plot, one table",
                  "The same workload, data and seed under several managers; one folder per manager and "
                  "compare.png.")
    _common(cmp, several=True)
    plot = command("plot", "redraw the plots of a run, compare, sweep or replay folder",
                   "Redraw the plots of a folder that lossscale run, compare, sweep or replay wrote.")
    plot.add_argument("folder", type=Path, help="the output folder")
    plot.add_argument("--format", choices=IMAGE_FORMATS, default="png", help="the image format")
    plot.add_argument("--heatmap", type=_axis_pair, default=None, metavar="ROW,COL",
                      help="a sweep's heat-map axes, such as detector,overflow_mode (default: the first two that "
                           "vary; the title names any other varying axis the cells average over)")
    command("profiles", "the Atlas products, their overflow modes and SoC names",
            "The Atlas products of the NPULossScaleOptimizer support table, their overflow modes and SoC names.")
    command("managers", "every manager: the framework it reproduces, its arguments and defaults",
            "Every manager by name: its class, the framework scaler it reproduces, and each argument with "
            "the framework's default and the demo value (--defaults).")
    sweep = command("sweep", "a grid of runs (TOML), in worker processes or on a Dask cluster",
                    "Every combination of a grid file's axes, each point one run; finished points are kept, so "
                    "the same command resumes an interrupted sweep.")
    sweep.add_argument("grid", type=Path, help="the grid file (TOML: [sweep] fixed arguments, [grid] axes)")
    sweep.add_argument("--out", type=Path, required=True, help="results folder; an existing one is resumed")
    sweep.add_argument("--workers", type=_integer(1), default=os.cpu_count() or 1, help="worker processes")
    sweep.add_argument("--scheduler", default=None, help="address of a dask.distributed scheduler")
    sweep.add_argument("--force", action="store_true",
                       help="start over: forget the points already done, or replace another lossscale output "
                            "(only lossscale's own files: a folder holding anything else is refused)")
    sweep.add_argument("--heatmap", type=_axis_pair, default=None, metavar="ROW,COL",
                       help="the heat maps' axes, such as detector,overflow_mode (default: the first two that vary; "
                            "the title names any other varying axis the cells average over)")
    sweep.add_argument("--quiet", action="store_true", help="no progress display")
    _replay_parser(command("replay", "check a training log's loss scales against its framework's policy; replay "
                           "other managers on it",
                           "Read the loss-scale lines of a DeepSpeed, apex, fairseq, Megatron-LM, MindSpore or csv "
                           "log; replay the framework's own policy on its overflows (the first departure named, with "
                           "the setting that explains it) and each --manager on the bounds the log sets on each "
                           "step's gradients (a step either outcome fits is unknown, never guessed). Writes "
                           "replay.csv, replay.png and summary.json. No --profile: the log's own overflows decide."))
    from .msprobe.command import add_parser as _msprobe_parser
    _msprobe_parser(command("msprobe", "re-execute an msprobe dump's APIs on a simulated device",
                            "Read a dump of Ascend's precision debugger (msprobe: dump.json, stack.json, "
                            "dump_tensor_data/), re-execute each forward API whose inputs it holds on a simulated "
                            "device, and compare the outputs with the dumped ones (bits, ulps, cosine, errors) with "
                            "the register events each raised. Writes msprobe.csv and summary.json (needs torch)."))
    return parser


def _replay_parser(p: argparse.ArgumentParser) -> None:
    from ..replay import LOG_FORMATS
    p.add_argument("log", type=Path, help="the training log (a text file)")
    p.add_argument("--out", type=Path, required=True, help="output folder (its parent must exist)")
    p.add_argument("--format", choices=["auto", *LOG_FORMATS], default="auto",
                   help="the log's format (auto: the one whose lines appear)")
    declared = {f.name: f for f in settings()}
    _setting(p, declared["manager"], action="append", default=[],
             help="a manager to replay on the log (give it once per manager; none: the consistency check only)")
    _setting(p, declared["manager_args"])
    _setting(p, declared["manager_defaults"], default="framework",
             help="the managers' unset arguments: framework (each framework's own defaults) or demo (the "
                  "simulator's demo set: 2**32, growth after 50 steps)")
    p.add_argument("--force", action="store_true",
                   help="replace an earlier lossscale output in --out (only the files lossscale wrote there: "
                        "a folder holding anything else is refused)")


def _manager_args(args: argparse.Namespace, manager: str) -> dict[str, Any]:
    """The --manager-arg values for ``manager``: unprefixed ones, and those prefixed with its name."""
    managers = args.manager if isinstance(args.manager, list) else [args.manager]
    mine = []
    for item in args.manager_arg:
        head, colon, rest = item.partition(":")
        if colon and "=" not in head:
            if head not in managers:
                raise UsageError(f"--manager-arg {item!r} names manager {head!r}, which this run does not use; "
                                 f"managers here: {', '.join(managers)}")
            if head == manager:
                mine.append(rest)
        else:
            mine.append(item)
    return _pairs(mine, "--manager-arg")


def _progress(quiet: bool, name: str):
    if quiet:
        return None
    tty = sys.stderr.isatty()
    started = time.perf_counter()

    def show(done: int, total: int) -> None:
        if total < 100:
            return
        if tty:
            rate = done / max(time.perf_counter() - started, 1e-9)
            end = "\n" if done == total else ""
            print(f"\r  {name}: step {done}/{total}  ({rate:.0f} steps/s)", end=end, file=sys.stderr, flush=True)
        elif done % max(total // 4, 1) == 0:
            print(f"  {name}: step {done}/{total}", file=sys.stderr, flush=True)
    return show


def _out_folder(args: argparse.Namespace, name: str) -> Path:
    """--out (checked, not yet created), or a new folder under runs/ that nothing else uses, named
    by what tells runs apart (manager, profile, mode, detector, ranks, seed) and a short hash of
    every argument, so that two different runs never look alike."""
    from .files import check_out
    if args.out is not None:
        return check_out(args.out, args.force)
    skip = ("out", "force", "quiet", "command", "format")  # what does not change the run
    settings = {k: v for k, v in sorted(vars(args).items()) if k not in skip}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:6]
    stem = Path("runs") / (f"{name}-{args.profile}-{args.overflow_mode or 'default'}-{args.detector or 'auto'}-"
                           f"r{args.ranks}-seed{args.seed}-{digest}")
    candidate, n = stem, 1
    while candidate.exists() and any(candidate.iterdir()):
        n += 1
        candidate = stem.with_name(f"{stem.name}-{n}")
    return candidate  # created, with runs/, only when the run has something to write


def _simulate(args: argparse.Namespace, manager: str) -> Run:
    """The run of ``manager`` with the command line's settings."""
    chosen: dict[str, Any] = {"manager": manager, "progress": _progress(args.quiet, manager)}
    for f in settings():
        if f.metadata["option"] is None or f.name in chosen:
            continue
        value = getattr(args, _dest(f))
        if f.name == "manager_args":
            value = _manager_args(args, manager)
        elif f.metadata["table"]:
            value = _pairs(value, _option(f), words=f.metadata["words"])
        chosen[f.name] = value
    return simulate(**chosen)


def _fmt(x: Any) -> str:
    """Numbers in full, for people: exact powers of two from 2**20 up and 2**-20 down as 2**k (a
    scale of 2**100 rather than 1.2676506002282294e+30), other whole numbers below 2**64 as
    integers, the rest as their shortest exact text. (Files keep numbers as numbers.)"""
    if isinstance(x, (list, tuple)):  # a recipe's gemms or keep: as the command line gives them
        return ",".join(map(str, x)) or "none"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if x > 0:
        if isinstance(x, int):  # exactly, also beyond binary64's range
            power, exponent = x & (x - 1) == 0, x.bit_length() - 1
        else:
            mantissa, exponent = math.frexp(x)
            power, exponent = mantissa == 0.5, exponent - 1
        if power and abs(exponent) >= 20:
            return f"2**{exponent}"
    if x == int(x) and abs(x) < 2**64:
        return str(int(x))
    return repr(float(x))


def _row(name: str, run: Run) -> list[str]:
    s = run.summary
    return [name, str(s["steps_run"]), str(s["overflow_steps"]), str(s["skipped_steps"]),
            str(s["undetected_overflow_steps"]), str(s["false_positive_steps"]), _fmt(s["final_loss_scale"]),
            f"{s['mean_underflow_fraction']:.4g}",
            f"{s['final']['loss']:.4f} / {s['baseline_float32']['loss']:.4f}",
            f"{s['final']['accuracy']:.3f} / {s['baseline_float32']['accuracy']:.3f}"]


HEADER = ["manager", "steps", "overflow", "skipped", "undetected", "false pos.", "final scale", "underflow",
          "loss / fp32", "accuracy / fp32"]


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [HEADER, *rows]]
    return "\n".join(lines)


def _arguments(summary: dict[str, Any]) -> str:
    """The manager's effective arguments, the ones that came from the demo set marked."""
    m = summary["manager"]
    demo = set(m.get("demo_arguments") or [])
    shown = ", ".join(f"{k}={_fmt(v)}{' (demo)' if k in demo else ''}" for k, v in m["arguments"].items())
    where = {"demo": "demo settings; --defaults framework for the framework's own",
             "framework": "the framework's defaults"}.get(m.get("defaults"), "as given")
    return f"manager {m['name']} ({m['class']}, {where}): {shown or 'no arguments'}"


def _head(s: dict[str, Any]) -> str:
    return (f"{s['profile']['product']} ({s['profile']['name']}), {s['profile']['overflow_mode']} mode, "
            f"detector {s['detector']}, {s['arguments']['ranks']} rank(s), workload {s['arguments']['workload']}")


def _describe(run: Run) -> str:
    s = run.summary
    head = _head(s)
    notes = [_arguments(s)] + [f"note: {w}" for w in s["profile"]["warnings"]]
    if s["stopped_early"]:
        notes.append(f"stopped early at {s['stopped_early']}")
    if s.get("interrupted"):
        notes.append(f"interrupted: {s['steps_run']} of {s['arguments']['steps']} steps ran")
    for error in s.get("evaluation_notes") or []:
        notes.append(f"evaluation failed, its figures are nan: {error}")
    first = s.get("first_overflow")
    if first:
        notes.append(f"first overflow: step {first['step']}, {first['op']} in {first['label'] or '(unlabelled)'} "
                     f"({first['phase']} phase, rank {first['rank']}, {first['flags']})")
    if s.get("top_labels"):
        named = ", ".join(f"{label} {n}" for label, n in s["top_labels"].items())
        notes.append(f"operations with register events, by label: {named}")
    if s["rank_disagreement_steps"]:
        notes.append(f"ranks decided differently in {s['rank_disagreement_steps']} steps")
    f = s.get("fp8")
    if f:
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in f["arguments"].items())
        notes.append(f"fp8 matmuls: {f['recipe']} ({shown}), {f['formats']['forward']} forward, "
                     f"{f['formats']['backward']} backward; {f['tensors']} tensors, {f['saturated_elements']} "
                     f"elements overflowed, {f['nonfinite_elements']} became NaN or Inf, "
                     f"{f.get('underflowed_elements', 0)} underflowed to zero")
    for name, a in (s.get("shadow") or {}).items():
        notes.append(f"shadow {name} ({a['recipe']}, {a['formats']['forward']} forward, {a['formats']['backward']} "
                     f"backward{', ' + a['overflow_mode'].lower() if a['overflow_mode'] else ''}): "
                     f"{a['saturated_elements']} elements would have overflowed, {a['nonfinite_elements']} become NaN "
                     f"or Inf, {a['underflowed_elements']} underflowed to zero")
    return "\n".join([head, *notes])


def _runs(args: argparse.Namespace, names: list[str], stage: Path, out: Path,
          nested: bool) -> list[tuple[str, Run]]:
    """Each manager's run, written into the staging folder as it finishes; on Ctrl-C the one in
    progress is written with the steps it finished (marked interrupted), and the interruption
    goes on (the staging folder then becomes ``out`` all the same)."""
    from .files import write_run
    runs = []
    for name in names:
        where = stage / name if nested else stage
        shown = out / name if nested else out
        try:
            run = _simulate(args, name)
        except Interrupted as stop:
            write_run(stop.run, where, fmt=args.format)
            print(_describe(stop.run))
            print(f"interrupted: wrote the {len(stop.run.records)} finished steps to {shown}", file=sys.stderr)
            raise
        except StepFailed as failed:  # the workload raised: its finished steps are kept, then the error told
            write_run(failed.run, where, fmt=args.format)
            print(_describe(failed.run))
            raise RunFailed(failed, shown) from failed.error
        write_run(run, where, fmt=args.format)
        runs.append((name, run))
    return runs


class RunFailed(KeepWritten):
    """A run whose workload raised at a step: its finished steps were written to ``shown`` (its
    folder is kept, as an interrupted run's is)."""

    def __init__(self, failed: StepFailed, shown: Path) -> None:
        super().__init__(f"{failed}; the {len(failed.run.records)} finished steps are in {shown}")
        self.error = failed.error


def cmd_run(args: argparse.Namespace) -> None:
    _manager_args(args, args.manager)  # refuse a bad --manager-arg before any work
    from .files import staged
    out = _out_folder(args, args.manager)
    with staged(out, args.force) as stage:
        [(_, run)] = _runs(args, [args.manager], stage, out, nested=False)
    print(_describe(run))
    print(_table([_row(args.manager, run)]))
    print(f"wrote {out}: " + ", ".join(p.name for p in sorted(out.iterdir()) if not p.name.startswith(".")))


def cmd_compare(args: argparse.Namespace) -> None:
    from .files import staged, write_atomic
    from .plots import plot_compare
    names = list(dict.fromkeys(args.manager))
    if len(names) < 2:
        raise UsageError("compare needs at least two different --manager values")
    for name in names:  # every manager's arguments checked before any run
        manager_arguments(name, _manager_args(args, name), args.defaults)
    out = _out_folder(args, "compare")
    with staged(out, args.force) as stage:
        runs = _runs(args, names, stage, out, nested=True)
        write_atomic(stage / "compare.json", (json.dumps({"managers": names}) + "\n").encode())
        write_atomic(stage / f"compare.{args.format}", plot_compare(runs, fmt=args.format))
    print(_head(runs[0][1].summary))
    for _, run in runs:
        print(_arguments(run.summary))
    print(_table([_row(name, run) for name, run in runs]))
    print(f"wrote {out / f'compare.{args.format}'} and one folder per manager under {out}")


def redraw(folder: Path, fmt: str = "png", heatmap: tuple[str, str] | None = None) -> list[Path]:
    """Redraw the plots of a folder that ``lossscale run``, ``compare``, ``sweep`` or ``replay`` wrote; the
    paths written (``heatmap``: a sweep's two axes), added to the folder's list of lossscale's files.
    ValueError naming what the folder lacks."""
    from .files import add_to_manifest
    paths = _redraw(folder, fmt, heatmap)
    add_to_manifest(folder, paths)
    return paths


def _redraw(folder: Path, fmt: str, heatmap: tuple[str, str] | None) -> list[Path]:
    from .files import check_folder, read_run, write_atomic, write_plots
    from .plots import plot_compare
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"unknown image format {fmt!r}; valid: {', '.join(IMAGE_FORMATS)}")
    folder = check_folder(folder, "the folder that lossscale run, compare, sweep or replay wrote")
    if (folder / "replay.csv").exists():
        from .files import read_replay
        from .plots import plot_replay
        rows, summary = read_replay(folder)
        write_atomic(folder / f"replay.{fmt}", plot_replay(rows, summary, fmt))
        return [folder / f"replay.{fmt}"]
    if (folder / "trajectory.csv").exists():
        return write_plots(read_run(folder), folder, fmt)
    if (folder / "results.csv").exists():
        from .sweep import redraw_sweep

        return [redraw_sweep(folder, fmt, heatmap)]
    from .results import compare_members
    members = compare_members(folder)
    if members:
        path = folder / f"compare.{fmt}"
        write_atomic(path, plot_compare([(p.name, read_run(p)) for p in members], fmt=fmt))
        return [path]
    raise ValueError(f"{str(folder)!r} holds no run, compare, sweep or replay output (no trajectory.csv, "
                     f"results.csv or replay.csv, no run folders)")


def cmd_plot(args: argparse.Namespace) -> None:
    paths = redraw(args.folder, args.format, heatmap=args.heatmap)
    print("wrote " + ", ".join(str(p) for p in paths))


def _policy_text(policy: Any, names: Any = None) -> str:
    """A policy's class and arguments (``names``: only these)."""
    from ..policy.core import describe
    shown = ", ".join(f"{k} {_fmt(v)}" for k, v in describe(policy).items() if names is None or k in names)
    return f"{type(policy).__name__}: {shown}"


def _verdict(check: Any) -> list[str]:
    """The consistency verdict in one or two lines."""
    if check.unchecked:
        return [f"{check.framework} log: {check.unchecked}"]
    who = f"{check.framework}'s policy ({_policy_text(check.policy, check.inferred)})"
    scope = "" if check.complete else " (each overflow's own update and the growth between overflows: the log " \
        "does not place every step)"
    if check.fits > 1:
        scope += (f" ({check.fits} settings fit the log equally well; the steps whose scale they disagree on are "
                  f"unknown)")
    if check.consistent:
        swaps = f" {check.swaps_text()}" if check.swapped else ""
        return [f"consistent with {who}: all {check.compared} logged scales reproduced{swaps}{scope}"]
    return [f"inconsistent with {who}: {len(check.departures)} of {check.compared} logged scales depart{scope}",
            f"departs at {check.departures[0]}"]


def _steps_text(steps: dict[str, int]) -> str:
    """What the log says of its steps, in a few words."""
    parts = [f"{steps['placed_steps']} steps placed"]
    if steps["counted_steps"]:
        parts.append(f"{steps['counted_steps']} more counted in {steps['counted_gaps']} gaps")
    if steps["bounded_gaps"]:
        parts.append(f"{steps['bounded_gaps']} gaps of bounded length")
    if steps["unknown_gaps"]:
        parts.append(f"{steps['unknown_gaps']} gaps of unknown length")
    return ", ".join(parts)


def _read_log(path: Path, fmt: str) -> Any:
    """The log at ``path``; UsageError naming a missing file or a log with no events."""
    from ..replay import LOG_FORMATS, read_log
    if not path.is_file():
        raise UsageError(f"no log file {str(path)!r}" + (" (it is a folder)" if path.is_dir() else "") +
                         "; give the path of a training log")
    log = read_log(path, fmt)  # bytes that are not UTF-8 read as U+FFFD: a binary file holds no events
    if not log.events:
        where = (f"; {len(log.unparsed)} line(s) in its words not understood, the first at line {log.unparsed[0][0]}"
                 if log.unparsed else "")
        raise UsageError(f"{str(path)!r} holds no loss-scale events in the {log.framework} format{where}; valid "
                         f"formats: {', '.join(LOG_FORMATS)}")
    return log


#: How many of a log's reading notes the replay command prints (summary.json holds them all).
_NOTES_SHOWN = 3


def cmd_replay(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    from ..policy.core import describe
    from ..replay import consistency, counterfactual, exact_fit, log_steps, logged_scales
    from ..training.config import make_manager
    from .files import check_out, json_text, replay_csv, replay_rows, staged, write_atomic
    from .plots import plot_replay
    names = list(dict.fromkeys(args.manager))
    if args.manager_arg and not names:
        raise UsageError("--manager-arg goes with a --manager (the managers to replay on the log)")
    policies = {name: make_manager(name, _manager_args(args, name), args.defaults).policy for name in names}
    check_out(args.out, args.force)
    log = _read_log(args.log, args.format)
    check = consistency(log)
    scales = logged_scales(log, check)
    decisions = {name: counterfactual(log, policy, check=check) for name, policy in policies.items()}
    rows = replay_rows(log, scales, decisions)
    verdict = _verdict(check)
    counts = {name: {k: sum(d.decision == k for d in ds) for k in ("overflow", "clean", "unknown")}
              for name, ds in decisions.items()}
    steps = log_steps(log)
    fit, why = exact_fit(log)
    summary = {
        "log": str(args.log), "format": log.framework, "complete": log.complete, **steps,
        "overflow_steps": sum(e.overflow if not e.gap else e.overflows or 0 for e in log.events),
        "unparsed_lines": len(log.unparsed),
        "unparsed": [{"line": n, "text": t} for n, t in log.unparsed[:20]], "notes": list(log.notes),
        "consistency": {"verdict": "\n".join(verdict), "consistent": check.consistent, "compared": check.compared,
                        "policy": type(check.policy).__name__ if check.policy is not None else None,
                        "arguments": describe(check.policy) if check.policy is not None else {},
                        "inferred": check.inferred, "departures": [asdict(d) for d in check.departures]},
        "replay": {"exact": fit is not None, "runs": fit or {}, "why_not": why},
        "managers": [{"name": name, "class": type(policy).__name__, "arguments": describe(policy),
                      "defaults": args.defaults, "decisions": counts[name]} for name, policy in policies.items()],
    }
    with staged(args.out, args.force) as stage:
        write_atomic(stage / "replay.csv", replay_csv(rows, names))
        write_atomic(stage / "summary.json", (json_text(summary) + "\n").encode())
        write_atomic(stage / "replay.png", plot_replay(rows, summary))
    unread = f", {len(log.unparsed)} lines not understood (first: line {log.unparsed[0][0]})" if log.unparsed else ""
    print(f"{args.log}: {log.framework} log, {_steps_text(steps)}{unread}")
    for note in log.notes[:_NOTES_SHOWN]:  # how the log was read: copies, wraps, lines left out, contradictions
        print(f"note: {note}")
    if len(log.notes) > _NOTES_SHOWN:
        print(f"note: {len(log.notes) - _NOTES_SHOWN} more in summary.json")
    print("\n".join(verdict))
    if policies:
        print(f"replayed exactly: each step as every {log.framework} run that reproduces the log decides it ("
              + ", ".join(f"{k} {v}" for k, v in fit.items()) + ")" if fit is not None else
              f"replayed on bounds, not exactly: {why}")
    for name, policy in policies.items():
        c = counts[name]
        print(f"{name} ({_policy_text(policy)}): {c['overflow']} overflow, {c['clean']} clean, {c['unknown']} "
              f"unknown steps")
    print(f"wrote {args.out}: replay.csv, replay.png, summary.json")


def cmd_managers(args: argparse.Namespace) -> None:
    from ..policy.core import REQUIRED
    for name, (cls, demo) in MANAGERS.items():
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        print(f"{name}: {cls.__name__}, {doc}")
        required = REQUIRED.get(name, ({}, ""))
        for key, value in manager_arguments(name, defaults="framework").items():
            source = f" (required; {required[1]})" if key in required[0] else ""
            extra = f"   demo {_fmt(demo[key])}" if key in demo else ""
            print(f"    {key:26} framework {_fmt(value)}{source}{extra}")


def cmd_profiles(args: argparse.Namespace) -> None:
    rows = [["profile", "product", "NPULossScaleOptimizer", "overflow modes"]]
    for name in profiles.names():
        p = profiles.get(name)
        legacy = " (saturation legacy)" if p.saturation_is_legacy else ""
        rows.append([p.name, p.product_en, "yes" if p.supports_npu_loss_scale_optimizer else "no",
                     p.describe_modes() + legacy])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print("\nSoC names (as the runtime reports them; * is any suffix):")
    for name in profiles.names():
        print(f"  {name.ljust(widths[0])}  {', '.join(profiles.get(name).socs)}")
    print("\n8-bit and narrower float formats (Ascend C's data types; --fp8 needs them, or --allow-unsupported "
          "to emulate them):")
    for name in profiles.names():
        print(f"  {name.ljust(widths[0])}  {', '.join(profiles.get(name).eight_bit) or 'none (no FP8 units)'}")


def cmd_sweep(args: argparse.Namespace) -> int:
    from .sweep import run_sweep

    tty = sys.stderr.isatty()

    def progress(done: int, total: int, failed: int, left: float) -> None:
        text = f"  points {done}/{total}, failed {failed}, about {left:.0f} s left"
        if args.quiet:
            return
        if tty:
            print(f"\r{text}   ", end="\n" if done == total else "", file=sys.stderr, flush=True)
        elif done == total or done % max(total // 10, 1) == 0:
            print(text, file=sys.stderr, flush=True)
    started = time.perf_counter()
    rows = run_sweep(args.grid, args.out, workers=args.workers, scheduler=args.scheduler, force=args.force,
                     progress=progress, heatmap=args.heatmap, report=print)
    failed = [r for r in rows if r["status"] != "ok"]
    print(f"{len(rows)} points ({len(failed)} failed) in {time.perf_counter() - started:.1f} s; "
          f"wrote {args.out / 'results.csv'} and {args.out / 'sweep.png'}")
    if failed:
        errors: dict[str, int] = {}
        for r in failed:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
        for error, n in errors.items():
            print(f"lossscale: {n} point(s) failed: {error}", file=sys.stderr)
        return 1
    return 0


def _cmd_msprobe(args: argparse.Namespace) -> None:
    from .msprobe.command import command
    command(args)


COMMANDS = {"run": cmd_run, "compare": cmd_compare, "plot": cmd_plot, "profiles": cmd_profiles,
            "managers": cmd_managers, "sweep": cmd_sweep, "replay": cmd_replay, "msprobe": _cmd_msprobe}



def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            raise UsageError(f"a command is needed; valid: {', '.join(COMMANDS)}")
        code = COMMANDS[args.command](args)
    except RunFailed as failed:  # the user's error, where it was raised, then what was kept
        print("".join(traceback.format_exception(failed.error)).rstrip(), file=sys.stderr)
        print(f"lossscale: error: {failed}", file=sys.stderr)
        return 1
    except (UsageError, ValueError, TypeError, OverflowError) as err:
        for line in str(err).splitlines() or [type(err).__name__]:  # one line per problem
            print(f"lossscale: error: {line}", file=sys.stderr)
        return 2
    except OSError as err:  # the file system refused: not a traceback either
        print(f"lossscale: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lossscale: interrupted; files already written are complete, the rest were not written",
              file=sys.stderr)
        return 130
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
