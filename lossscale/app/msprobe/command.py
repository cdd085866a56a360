"""``lossscale msprobe DUMP``: a dump re-executed, written as msprobe.csv and summary.json."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from .dump import read_dump
from .replay import COLUMNS, replay
from .verdict import verdict

__all__: list[str] = []  # the command line's


def add_parser(p: argparse.ArgumentParser) -> None:
    """``lossscale msprobe``'s options."""
    from ...training.config import settings
    from ..options import _setting
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

    from ..files import _csv, check_out, json_text, staged, write_atomic
    from ..options import UsageError
    if importlib.util.find_spec("torch") is None:
        raise UsageError("msprobe needs torch to read a dump's tensors: pip install -e \".[frameworks]\"")
    check_out(args.out, args.force)
    entries = read_dump(args.dump)
    rows = replay(entries, args.profile, args.overflow_mode)
    compared = [r for r in rows if r["status"] == "compared"]
    calls = {(r["step"], r["rank"], r["api"]) for r in rows if r["status"] == "compared"}
    summary = {"dump": str(args.dump), "profile": args.profile, "overflow_mode": args.overflow_mode,
               "calls": len(entries), "steps": sorted({e.step for e in entries}),
               "ranks": sorted({e.rank for e in entries}), "calls_replayed": len(calls),
               "tensors_compared": len(compared), "identical": sum(bool(r["identical"]) for r in compared),
               "calls_with_events": len({(r["step"], r["rank"], r["api"]) for r in compared if r["events"]}),
               "not_replayed": dict(sorted(Counter(r["status"] for r in rows
                                                   if not r["status"].startswith(("compared", "replayed"))).items())),
               "first_producers": verdict(entries)}
    with staged(args.out, args.force) as stage:
        write_atomic(stage / "msprobe.csv", _csv(COLUMNS, rows))
        write_atomic(stage / "summary.json", (json_text(summary) + "\n").encode())
    print(f"{args.dump}: {len(entries)} calls, {len(summary['steps'])} step(s), {len(summary['ranks'])} rank(s); "
          f"{len(calls)} re-executed on {args.profile}, {len(compared)} output tensors compared: "
          f"{summary['identical']} bit-identical; {summary['calls_with_events']} calls raised register events")
    worst = sorted((r for r in compared if not r["identical"]), key=lambda r: -(r["max_ulp"] or 0))[:5]
    for r in worst:
        rel = "n/a (Inf or NaN apart)" if r["max_rel_err"] is None else f"{r['max_rel_err']:.3g}"
        print(f"  step {r['step']} rank {r['rank']} {r['tensor']}: {r['max_ulp']} ulp, max rel. error {rel}, "
              f"events {r['events']}{', ' + r['source'] if r['source'] else ''}")
    for v in summary["first_producers"]:
        seen = [k for k, r in v.items() if "/" in k and r]
        where = ", ".join(filter(None, (f"module {v['module']}" if v["module"] else "", v["source"])))
        print(f"step {v['step']} rank {v['rank']}: first non-finite value from {v['api']}"
              f"{' (' + where + ')' if where else ''}, carried on by {v['carried_by']} call(s); "
              f"reproduced on {len(seen)} of {sum('/' in k for k in v)} product/mode pairs")
    print(f"wrote {args.out}: msprobe.csv, summary.json")
