"""Run the same `lossscale` jobs at two commits and compare what they write, byte for byte.

    python bench/compare_commits.py OLD NEW [--keep DIR] [--job NAME ...]

OLD and NEW are git refs of the repository this script is in (committed code only: each is
checked out into a temporary `git worktree`, removed at the end, also on error or Ctrl-C). In
each checkout, with PYTHONPATH set to it and a fresh temporary folder as the working directory,
`python -m lossscale` runs every job of JOBS, each into its own `--out` folder (a file of the
checkout a job reads, such as the grid or the log, is copied into the working directory first):

    run-default          run                                      (mlp, atlas-a2, exponential, 300 steps)
    run-atlas-training   run --profile atlas-training
    log-perplexity-tf    run --profile atlas-training --workload-arg log_perplexity=true --detector tf-npu
    log-perplexity-torch run --profile atlas-training --workload-arg log_perplexity=true --detector torch-npu
    fp8-delayed          run --profile atlas-350 --fp8 delayed
    compare              compare --manager exponential --manager torch --manager deepspeed
    sweep-trace          sweep <checkout>/examples/sweep-trace.toml   (200 trace points, 2 workers)
    torch-transformer    run --workload torch-transformer --profile atlas-training --steps 30
    replay               replay <checkout>/lossscale/data/deepspeed-sample.log --manager torch
                         --manager exponential

These are README.md's commands, with the CLI's own defaults (300 steps; the sweep's 200 steps
come from its grid file), but for the torch workload, whose 300 steps would take minutes (it is
skipped where torch is not installed). Each checkout compiles the numba kernels
afresh (its own __pycache__), which is most of the time: about 5 minutes per commit on 2 cores,
so about 10 minutes in all.

Then, per job: the exit status; stdout (the sweep's "in N.N s" masked; stderr, the progress
lines, is kept with --keep but not compared); the set of files written;
every CSV (and any other non-JSON, non-figure file) byte for byte, with the first differing line;
JSON files (summary.json, compare.json) field by field, recursively, without EXCLUDED_KEYS, with
the first differing key; JSON-lines files (the sweep's points.jsonl, appended in completion
order) record by record, matched by their "key". Figures (PNG/SVG/PDF) hold matplotlib metadata
and are listed as present or absent only. The table's last column is the first difference.
Exit status: 0 if everything is identical, 1 if anything differs, 2 if a job could not be set up.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The jobs: name and arguments of `python -m lossscale`; "{src}" is the checkout, and every job
# gets "--out <name>" (relative to its working directory, so that stdout names the same paths).
JOBS: dict[str, list[str]] = {
    "run-default": ["run"],
    "run-atlas-training": ["run", "--profile", "atlas-training"],
    "log-perplexity-tf": ["run", "--profile", "atlas-training", "--workload-arg", "log_perplexity=true",
                          "--detector", "tf-npu"],
    "log-perplexity-torch": ["run", "--profile", "atlas-training", "--workload-arg", "log_perplexity=true",
                             "--detector", "torch-npu"],
    "fp8-delayed": ["run", "--profile", "atlas-350", "--fp8", "delayed"],
    "compare": ["compare", "--manager", "exponential", "--manager", "torch", "--manager", "deepspeed"],
    "sweep-trace": ["sweep", "{src}/examples/sweep-trace.toml"],
    "torch-transformer": ["run", "--workload", "torch-transformer", "--profile", "atlas-training", "--steps", "30"],
    "replay": ["replay", "{src}/lossscale/data/deepspeed-sample.log", "--manager", "torch", "--manager",
               "exponential"],
}

# Top-level JSON keys left out of the comparison, because they legitimately differ between
# commits or machines without any change of behaviour. summary.json has no timings or wall-clock
# fields (and compare.json and points.jsonl no provenance at all); the one such key is:
EXCLUDED_KEYS = {
    "versions",  # provenance: the python, numpy and ml_dtypes versions and lossscale.__version__
}

FIGURES = {".png", ".svg", ".pdf"}
# stdout: the sweep's wall-clock time ("200 points (0 failed) in 69.9 s; ...").
TIMING = re.compile(r"\bin \d+(?:\.\d+)? s\b")


@dataclass
class Row:
    job: str
    file: str
    result: str  # identical, differs, present (figures), only in OLD/NEW, failed
    detail: str = ""

    @property
    def bad(self) -> bool:
        return self.result not in ("identical", "present")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[:width - 3] + "..."


def run_jobs(python: str, src: Path, work: Path, jobs: list[str], label: str) -> dict[str, int]:
    """Run the jobs in checkout ``src``, each with cwd ``work``; stdout and stderr go to
    ``work/<job>.stdout`` and ``.stderr``. Returns each job's exit status."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(src)
    work.mkdir(parents=True)
    where = subprocess.run([python, "-c", "import lossscale; print(lossscale.__file__)"], cwd=work, env=env,
                           check=True, capture_output=True, text=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(src.resolve()):
        raise SystemExit(f"compare_commits: with PYTHONPATH={src}, lossscale imports from {where}")
    codes, started = {}, time.perf_counter()
    for job in jobs:
        args = [_local(a, src, work) for a in JOBS[job]] + ["--out", job]
        t0 = time.perf_counter()
        with open(work / f"{job}.stdout", "wb") as out, open(work / f"{job}.stderr", "wb") as err:
            codes[job] = subprocess.run([python, "-m", "lossscale", *args], cwd=work, env=env,
                                        stdout=out, stderr=err).returncode
        print(f"  {label}: {job:<21} exit {codes[job]}  {time.perf_counter() - t0:6.1f} s", file=sys.stderr)
    print(f"  {label}: all jobs {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return codes


def _local(arg: str, src: Path, work: Path) -> str:
    """A job's argument, a file of the checkout (``{src}/...``) copied into the working folder and
    named there, so that both commits' runs read it under one name (a log's path is in its replay's
    output)."""
    if "{src}" not in arg:
        return arg
    path = Path(arg.replace("{src}", str(src)))
    if not (work / path.name).exists():
        shutil.copyfile(path, work / path.name)
    return path.name


def first_line_difference(a: bytes, b: bytes) -> str:
    la, lb = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(la, lb, strict=False), 1):
        if x != y:
            sx, sy = x.decode(errors="replace"), y.decode(errors="replace")
            col = next((c for c, (p, q) in enumerate(zip(sx, sy, strict=False)) if p != q), min(len(sx), len(sy)))
            start = max(0, col - 15)  # show where the lines part, not only how they begin
            cut = "..." if start else ""
            return f"line {i}, col {col + 1}: {cut}{short(sx[start:], 40)} | {cut}{short(sy[start:], 40)}"
    if len(la) != len(lb):
        return f"{len(la)} lines | {len(lb)} lines"
    return "same lines, different bytes (line endings or final newline)"


def json_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The first key path (dotted; [i] for list items) where ``a`` and ``b`` differ, with both
    values, or None. Top-level EXCLUDED_KEYS are skipped."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if not path and key in EXCLUDED_KEYS:
                continue
            where = f"{path}.{key}" if path else key
            if key not in b:
                return f"{where}: only in OLD"
            if key not in a:
                return f"{where}: only in NEW"
            found = json_difference(a[key], b[key], where)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = json_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None if len(a) == len(b) else f"{path}: {len(a)} items | {len(b)} items"
    nans = isinstance(a, float) and isinstance(b, float) and a != a and b != b  # NaN here matches NaN there
    if type(a) is not type(b) or not (nans or a == b):  # 2 and 2.0 differ: their text does
        return f"{path or '(top)'}: {short(a, 40)} | {short(b, 40)}"
    return None


def jsonl_difference(a: bytes, b: bytes) -> str | None:
    """Records matched by their "key" field (points.jsonl is written in completion order, which
    depends on the worker processes), else by line number; a record seen twice keeps the last."""
    def records(data: bytes) -> dict[str, Any]:
        out = {}
        for i, line in enumerate(data.splitlines()):
            if line.strip():
                record = json.loads(line)
                out[str(record.get("key", i)) if isinstance(record, dict) else str(i)] = record
        return out
    ra, rb = records(a), records(b)
    for key in sorted(set(ra) | set(rb)):
        if key not in rb:
            return f"record {key}: only in OLD"
        if key not in ra:
            return f"record {key}: only in NEW"
        found = json_difference(ra[key], rb[key])
        if found:
            return f"record {key}: {found}"
    return None


def compare_file(job: str, name: str, a: Path, b: Path) -> Row:
    suffix = a.suffix.lower()
    if suffix in FIGURES:
        return Row(job, name, "present", "figure: not compared")
    da, db = a.read_bytes(), b.read_bytes()
    if suffix == ".json":
        try:
            ja, jb = json.loads(da), json.loads(db)
        except ValueError as err:
            return Row(job, name, "differs", f"not JSON: {err}")
        found = json_difference(ja, jb)
        ignored = sorted(EXCLUDED_KEYS & set(ja if isinstance(ja, dict) else ()))
        note = f"without {', '.join(ignored)}" if ignored else ""
        return Row(job, name, "differs", found) if found else Row(job, name, "identical", note)
    if suffix == ".jsonl":
        found = jsonl_difference(da, db)
        return Row(job, name, "differs", found) if found else Row(job, name, "identical", "records by key")
    if da == db:
        return Row(job, name, "identical")
    return Row(job, name, "differs", first_line_difference(da, db))


def compare_job(job: str, old: Path, new: Path, codes: tuple[int, int]) -> list[Row]:
    if codes[0] != codes[1]:
        rows = [Row(job, "(exit status)", "differs", f"{codes[0]} | {codes[1]}; see {job}.stderr (--keep)")]
    elif codes[0] != 0:
        rows = [Row(job, "(exit status)", "failed", f"both {codes[0]}; see {job}.stderr (--keep)")]
    else:
        rows = [Row(job, "(exit status)", "identical", "0")]
    so, sn = (TIMING.sub("in <time> s", (d / f"{job}.stdout").read_text(errors="replace")) for d in (old, new))
    rows.append(Row(job, "(stdout)", "identical", "timings masked") if so == sn
                else Row(job, "(stdout)", "differs", first_line_difference(so.encode(), sn.encode())))
    files = [{p.relative_to(d / job).as_posix() for p in (d / job).rglob("*") if p.is_file()}
             if (d / job).is_dir() else set() for d in (old, new)]
    only_old, only_new = sorted(files[0] - files[1]), sorted(files[1] - files[0])
    if only_old or only_new:
        detail = "; ".join(part for part in (f"only OLD: {', '.join(only_old)}" if only_old else "",
                                             f"only NEW: {', '.join(only_new)}" if only_new else "") if part)
        rows.append(Row(job, "(files written)", "differs", short(detail, 100)))
    else:
        rows.append(Row(job, "(files written)", "identical", f"{len(files[0])} files"))
    for name in sorted(files[0] | files[1]):
        if name in only_old:
            rows.append(Row(job, name, "only in OLD"))
        elif name in only_new:
            rows.append(Row(job, name, "only in NEW"))
        else:
            rows.append(compare_file(job, name, old / job / name, new / job / name))
    return rows


def print_table(rows: list[Row]) -> None:
    head = Row("job", "file", "result", "first difference / note")
    widths = [max(len(getattr(r, f)) for r in [head, *rows]) for f in ("job", "file", "result")]
    for r in [head, *rows]:
        print(f"{r.job:<{widths[0]}}  {r.file:<{widths[1]}}  {r.result:<{widths[2]}}  {r.detail}".rstrip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", metavar="OLD", help="git ref of the reference commit")
    ap.add_argument("new", metavar="NEW", help="git ref of the commit to check against it")
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="write the outputs to DIR/old and DIR/new (DIR must not exist) and keep them")
    ap.add_argument("--job", action="append", choices=list(JOBS), help="run only this job (repeatable)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter to run (default: this one)")
    args = ap.parse_args()

    repo = Path(git(Path(__file__).resolve().parent, "rev-parse", "--show-toplevel"))
    try:
        commits = [git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}") for ref in (args.old, args.new)]
    except subprocess.CalledProcessError:
        print(f"compare_commits: {args.old!r} or {args.new!r} is not a commit of {repo}", file=sys.stderr)
        return 2
    if args.keep is not None and args.keep.exists():
        print(f"compare_commits: --keep {args.keep} exists already", file=sys.stderr)
        return 2
    jobs = args.job or [j for j in JOBS if not j.startswith("torch-") or importlib.util.find_spec("torch")]

    tmp = Path(tempfile.mkdtemp(prefix="compare-commits-"))
    outputs = args.keep.resolve() if args.keep is not None else tmp / "out"
    added: list[Path] = []
    try:
        codes = {}
        for side, commit in zip(("old", "new"), commits, strict=True):
            src = tmp / f"src-{side}"
            git(repo, "worktree", "add", "--detach", str(src), commit)
            added.append(src)
            print(f"{side.upper()} {commit[:12]} ({getattr(args, side)}) in {src}", file=sys.stderr)
            codes[side] = run_jobs(args.python, src, outputs / side, jobs, side.upper())
        rows = [row for job in jobs
                for row in compare_job(job, outputs / "old", outputs / "new", (codes["old"][job], codes["new"][job]))]
    except subprocess.CalledProcessError as err:
        print(f"compare_commits: {' '.join(map(str, err.cmd))} failed: {(err.stderr or '').strip()}", file=sys.stderr)
        return 2
    finally:
        for src in added:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(src)], capture_output=True)
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"OLD {args.old} = {commits[0][:12]}, NEW {args.new} = {commits[1][:12]}; "
          f"JSON compared without: {', '.join(sorted(EXCLUDED_KEYS))}")
    print_table(rows)
    bad = [r for r in rows if r.bad]
    if args.keep is not None:
        print(f"outputs kept in {outputs}/old and {outputs}/new")
    if bad:
        print(f"DIFFERS: {len(bad)} of {len(rows)} rows")
        return 1
    print(f"IDENTICAL: all {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
