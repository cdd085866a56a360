"""The ``lossscale`` command line: run, compare, plot, profiles.

Bad input gets one line on stderr saying what is wrong and what is valid, and
exit code 2; no traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from sim import profiles

from .detectors import ALIASES, DETECTORS
from .simulate import MANAGERS, Run, simulate
from .workloads import WORKLOADS

__all__ = ["main"]


class UsageError(Exception):
    """A problem with the command line: reported in one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of argparse's usage block
        raise UsageError(message)


def _value(key: str, text: str) -> Any:
    """Values of KEY=VALUE: integers (also 2**k), floats, true/false."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    power = re.fullmatch(r"(\d+)\s*\*\*\s*(-?\d+)", text.strip())
    if power:
        base, exp = int(power[1]), int(power[2])
        return base**exp if exp >= 0 else float(base) ** exp
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    raise UsageError(f"bad value for {key}: {text!r}; use a number (2**16 is fine) or true/false")


def _pairs(items: list[str], what: str) -> dict[str, Any]:
    out = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} takes KEY=VALUE, got {item!r}")
        out[key.strip()] = _value(key.strip(), text)
    return out


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default="mlp", choices=list(WORKLOADS))
    p.add_argument("--workload-arg", action="append", metavar="KEY=VALUE", default=[])
    p.add_argument("--profile", default="atlas-a2", choices=profiles.names())
    p.add_argument("--overflow-mode", choices=["saturation", "inf_nan"], default=None,
                   help="default: the profile's")
    p.add_argument("--manager-arg", action="append", metavar="KEY=VALUE", default=[])
    p.add_argument("--detector", choices=[*DETECTORS, *ALIASES], default=None,
                   help="whose overflow check decides: tf-npu (status), torch-npu, mindspore, "
                        "mindspore-all-finite or isfinite; default: tf-npu in saturation mode, isfinite in "
                        "INF/NaN mode")
    p.add_argument("--events", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the devices' event log (events.csv, events.png; default: on)")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--underflow-every", type=int, default=10)
    p.add_argument("--out", type=Path, default=None, help="default: a new folder under runs/")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty --out folder")
    p.add_argument("--quiet", action="store_true", help="no progress display")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lossscale", description="Loss scaling on simulated Ascend NPUs.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    run = sub.add_parser("run", help="train one workload under one loss-scale manager")
    _common(run)
    run.add_argument("--manager", default="exponential", choices=list(MANAGERS))
    cmp = sub.add_parser("compare", help="the same run under several managers: one plot, one table")
    _common(cmp)
    cmp.add_argument("--manager", action="append", choices=list(MANAGERS), required=True)
    plot = sub.add_parser("plot", help="redraw scale.png from a run folder")
    plot.add_argument("folder", type=Path)
    sub.add_parser("profiles", help="the Atlas products and their overflow modes")
    sweep = sub.add_parser("sweep", help="a grid of runs (TOML), in worker processes or on a Dask cluster")
    sweep.add_argument("grid", type=Path)
    sweep.add_argument("--out", type=Path, required=True, help="results folder; an existing one is resumed")
    sweep.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    sweep.add_argument("--scheduler", default=None, help="address of a dask.distributed scheduler")
    sweep.add_argument("--force", action="store_true", help="start over: forget the points already done")
    sweep.add_argument("--quiet", action="store_true")
    return parser


def _progress(quiet: bool):
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
            print(f"\r  step {done}/{total}  ({rate:.0f} steps/s)", end=end, file=sys.stderr, flush=True)
        elif done % max(total // 4, 1) == 0:
            print(f"  step {done}/{total}", file=sys.stderr, flush=True)
    return show


def _out_folder(args: argparse.Namespace, name: str) -> Path:
    """--out (checked, not yet created), or a new folder under runs/ that nothing else uses."""
    from .files import check_out
    if args.out is not None:
        return check_out(args.out, args.force)
    stem = Path("runs") / f"{name}-{args.profile}-{args.overflow_mode or 'default'}-seed{args.seed}"
    candidate, n = stem, 1
    while candidate.exists() and any(candidate.iterdir()):
        n += 1
        candidate = stem.with_name(f"{stem.name}-{n}")
    return check_out(candidate, True)


def _simulate(args: argparse.Namespace, manager: str) -> Run:
    return simulate(workload=args.workload, profile=args.profile, overflow_mode=args.overflow_mode,
                    manager=manager, manager_args=_pairs(args.manager_arg, "--manager-arg"),
                    detector=args.detector, ranks=args.ranks, steps=args.steps, seed=args.seed,
                    underflow_every=args.underflow_every, record_events=args.events,
                    workload_args=_pairs(args.workload_arg, "--workload-arg"), progress=_progress(args.quiet))


def _fmt(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _row(name: str, run: Run) -> list[str]:
    s = run.summary
    return [name, str(s["steps_run"]), str(s["overflow_steps"]), str(s["skipped_steps"]),
            str(s["undetected_overflow_steps"]), str(s["false_positive_steps"]), _fmt(s["final_loss_scale"]),
            _fmt(s["mean_underflow_fraction"]),
            f"{s['final']['loss']:.4f} / {s['baseline_float32']['loss']:.4f}",
            f"{s['final']['accuracy']:.3f} / {s['baseline_float32']['accuracy']:.3f}"]


HEADER = ["manager", "steps", "overflow", "skipped", "undetected", "false pos.", "final scale", "underflow",
          "loss / fp32", "accuracy / fp32"]


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [HEADER, *rows]]
    return "\n".join(lines)


def _describe(run: Run) -> str:
    s = run.summary
    head = (f"{s['profile']['product']} ({s['profile']['name']}), {s['profile']['overflow_mode']} mode, "
            f"detector {s['detector']}, {s['arguments']['ranks']} rank(s), workload {s['arguments']['workload']}")
    notes = [f"note: {w}" for w in s["profile"]["warnings"]]
    if s["stopped_early"]:
        notes.append(f"stopped early at {s['stopped_early']}")
    first = s.get("first_overflow")
    if first:
        notes.append(f"first overflow: step {first['step']}, {first['op']} in {first['label'] or '(unlabelled)'} "
                     f"({first['phase']} phase, rank {first['rank']}, {first['flags']})")
    if s.get("top_labels"):
        named = ", ".join(f"{label} {n}" for label, n in s["top_labels"].items())
        notes.append(f"operations with register events, by label: {named}")
    if s["rank_disagreement_steps"]:
        notes.append(f"ranks decided differently in {s['rank_disagreement_steps']} steps")
    return "\n".join([head, *notes])


def cmd_run(args: argparse.Namespace) -> None:
    from .files import write_run
    out = _out_folder(args, args.manager)
    run = _simulate(args, args.manager)
    paths = write_run(run, out)
    print(_describe(run))
    print(_table([_row(args.manager, run)]))
    print("wrote " + ", ".join(str(p) for p in paths))


def cmd_compare(args: argparse.Namespace) -> None:
    from .files import write_atomic, write_run
    from .plots import plot_compare
    if len(set(args.manager)) < 2:
        raise UsageError("compare needs at least two different --manager values")
    out = _out_folder(args, "compare")
    runs = [(name, _simulate(args, name)) for name in dict.fromkeys(args.manager)]
    for name, run in runs:
        write_run(run, out / name)
    write_atomic(out / "compare.png", plot_compare(runs))
    print(_describe(runs[0][1]))
    print(_table([_row(name, run) for name, run in runs]))
    print(f"wrote {out / 'compare.png'} and one folder per manager under {out}")


def cmd_plot(args: argparse.Namespace) -> None:
    from .files import read_run, write_plots
    paths = write_plots(read_run(args.folder), args.folder)
    print("wrote " + ", ".join(str(p) for p in paths))


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


def cmd_sweep(args: argparse.Namespace) -> None:
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
                     progress=progress)
    failed = sum(r["status"] != "ok" for r in rows)
    print(f"{len(rows)} points ({failed} failed) in {time.perf_counter() - started:.1f} s; "
          f"wrote {args.out / 'results.csv'} and {args.out / 'sweep.png'}")


COMMANDS = {"run": cmd_run, "compare": cmd_compare, "plot": cmd_plot, "profiles": cmd_profiles, "sweep": cmd_sweep}


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            raise UsageError(f"a command is needed; valid: {', '.join(COMMANDS)}")
        COMMANDS[args.command](args)
    except (UsageError, ValueError, TypeError) as err:
        print(f"lossscale: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lossscale: interrupted; files already written are complete, the rest were not written",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
