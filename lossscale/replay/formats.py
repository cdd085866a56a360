"""The log formats, one entry each: what marks a line as the format's, its reader, and the policy of
the framework that prints it (:class:`LogFormat`); :func:`read_log` reads a log in one of them.
A new format is one entry here, its reader in ``parsers`` and its line patterns in ``log``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..policy.frameworks import ApexPolicy, DeepSpeedPolicy, FairseqPolicy, MegatronPolicy, MindSporePolicy
from . import parsers
from .log import _COLOSSAL, _DS_STEP, Log, LogFormat, LogPolicy, _fairseq_shows


def _words(own: str) -> re.Pattern[str]:
    """The format's own words and, whatever the format, any mention of an overflow or a loss scale."""
    return re.compile(rf"{own}|(?i:overflow|loss[ _]?scale)")


def _deepspeed_hystereses(log: Log) -> tuple[list[int], str]:
    """DeepSpeed prints its hysteresis on an overflow line that keeps the scale
    (``DynamicLossScaler.update_scale``: ``but hysteresis is h``, h at most ``delayed_shift``, to which
    a growth restores it), none on one that reduces it (the hysteresis was spent, or 1); ZeRO's
    ``Attempted loss scale: S, reducing to S`` does not print it either (the hysteresis took the
    overflow): from the largest printed (or 1) to 4 tried."""
    printed = [e for e in log.events if e.overflow and e.hysteresis is not None]
    least = max((e.hysteresis for e in printed), default=1)
    tried, best = list(range(least, max(4, least) + 1)), f"the best of {least} to {max(4, least)}"
    if any(e.overflow and e.hysteresis is None and e.scale is not None and e.scale == e.next_scale and e.scale > 1
           for e in log.events):
        return tried, f"{best} (overflows that kept the scale, their hysteresis not printed)"
    if not printed:
        return [1], "1 (no overflow line prints one)"
    where = next(e.line for e in printed if e.hysteresis == least)
    return tried, f"{best} (at least the largest printed, line {where})"


def _megatron_hystereses(log: Log) -> tuple[list[int], str]:
    """Megatron prints no hysteresis (``--hysteresis``, default 2): 1 to 4 tried, and more where the log
    holds more overflows in a row that keep the scale (a hysteresis of n takes n - 1 of them)."""
    run = longest = 0
    previous = None
    for e in log.events:
        if e.overflow and not e.gap and e.next_scale is not None:
            run = run + 1 if e.next_scale == previous else 1
            longest, previous = max(longest, run), e.next_scale
        elif e.overflow or e.next_scale is not None:
            run, previous = 0, e.next_scale
    most = min(max(4, longest + 1), 64)
    return list(range(1, most + 1)), f"the best of 1 to {most}"


def _binary32(value: float) -> float:
    """MindSpore prints a scale as the shortest decimal of its binary32 value."""
    return float(np.float32(value))


#: Every log format ``read_log`` reads, by name. The format strings are the frameworks' own (the
#: package's docstring lists them; the tests cite file and function).
LOG_FORMATS: dict[str, LogFormat] = {f.name: f for f in (
    LogFormat("deepspeed",
              re.compile(r"\[(?:deepspeed|deepscale)\] (?:OVERFLOW!|fp16 dynamic loss scale overflow!)|"
                         r"Grad overflow on iteration|dynamic loss scale from|Overflow detected\. Skipping step|"
                         r"\bstep=\d+, skipped=\d+"),
              _words(r"OVERFLOW|overflow!|Attempted loss scale|step=\d+, skipped="), parsers.deepspeed,
              # DeepSpeed prints int(S) (older releases the float)
              LogPolicy(DeepSpeedPolicy, "init_scale", "scale_window", "delayed_shift",
                        fixed={"raise_error_at_min_scale": False}, hystereses=_deepspeed_hystereses,
                        prints=lambda replayed, logged: int(replayed) == logged)),
    LogFormat("apex",
              re.compile(r"Gradient overflow\.\s+Skipping step|(?<!\] )(?<!Rank \d )OVERFLOW! Skipping step\. "
                         r"Attempted"),
              _words(r"Gradient overflow|reducing loss scale|OVERFLOW"), parsers.apex,
              LogPolicy(ApexPolicy, "init_scale", "scale_window",
                        bounds=lambda init: {"max_loss_scale": max(2.0**24, init)})),
    LogFormat("fairseq",
              re.compile(r"(?:NOTE: (?:gradient )?|WARNING: |AMP: )overflow detected|\bloss_scale[= ]\d|"
                         r"\"(?:train_)?loss_scale\""),
              _words(r"overflow detected|loss_scale"), parsers.fairseq,
              LogPolicy(FairseqPolicy, "init_scale", "scale_window", prints=_fairseq_shows)),
    LogFormat("megatron", re.compile(r"iteration\s+\d+/\s*\d+ \|.* loss scale:? "),
              _words(r"iteration\s+\d+/|loss scale:|skipped iterations"), parsers.megatron,
              # Megatron prints {:.1f}; its --loss-scale-window defaults to 1000
              # (megatron/training/arguments.py; MegatronPolicy takes every argument)
              LogPolicy(MegatronPolicy, "initial_scale", "growth_interval", "hysteresis",
                        fixed={"min_scale": 1.0, "growth_factor": 2.0, "backoff_factor": 0.5},
                        bounds=lambda init: {"min_scale": min(1.0, init)}, default_window=1000,
                        hystereses=_megatron_hystereses,
                        prints=lambda replayed, logged: f"{replayed:.1f}" == f"{logged:.1f}")),
    LogFormat("mindspore",
              re.compile(r"overflow is \[?(?:True|False)\]?, loss scale is|overflow cond: (?:True|False), "
                         r"loss_scale:|overflow, still update, loss scale adjust to"),
              _words(r"overflow is|loss scale is|overflow cond|loss_scale"), parsers.mindspore,
              LogPolicy(MindSporePolicy, "init_loss_scale", "scale_window",
                        prints=lambda replayed, logged: _binary32(replayed) == _binary32(logged), value=_binary32)),
    LogFormat("colossalai", _COLOSSAL, _words(r"overflow|found inf"), parsers.colossalai),
    LogFormat("csv", None, None, parsers.read_csv),
)}


def _detect(lines: Sequence[str]) -> str:
    if lines and re.fullmatch(r"\s*step\s*,\s*scale\s*,\s*overflow\s*", lines[0]):
        return "csv"
    counts = {f.name: sum(1 for line in lines if f.sign.search(line)) for f in LOG_FORMATS.values() if f.sign}
    found = {name: n for name, n in counts.items() if n}
    if len(found) == 1:
        return next(iter(found))
    if set(found) == {"deepspeed", "megatron"}:
        # Megatron-DeepSpeed and GPT-NeoX print both: DeepSpeed's engine reports (step=N, skipped=M) beside
        # Megatron's iteration lines, and DeepSpeed's overflow lines where its fp16 optimizer keeps the scale.
        # Its overflow lines say most; without them, Megatron's lines carry the scale.
        sign = LOG_FORMATS["deepspeed"].sign
        return "deepspeed" if any(sign.search(line) and not _DS_STEP.search(line) for line in lines) else "megatron"
    if not found:
        raise ValueError(f"no known log format found (no overflow or loss-scale line of {', '.join(LOG_FORMATS)}; "
                         f"a csv log starts with the header step,scale,overflow)")
    shown = ", ".join(f"{name} ({n} lines)" for name, n in found.items())
    raise ValueError(f"mixed log formats: {shown}; give format= one of {', '.join(LOG_FORMATS)}")


def read_log(source: str | Path, format: str = "auto") -> Log:
    """The log at a path, or log text (a string holding a newline, or naming no file), parsed in
    ``format`` (``auto``: the one format whose lines appear, Megatron-DeepSpeed's DeepSpeed and
    Megatron lines read as one of them; ValueError naming the formats known where none or several
    do)."""
    if isinstance(source, Path) or ("\n" not in source and Path(source).is_file()):
        try:
            text = Path(source).read_text(errors="replace")
        except OSError as err:
            raise ValueError(f"cannot read the log {str(source)!r}: {err.strerror or err}") from None
    elif "\n" not in source and not any(f.sign.search(source) for f in LOG_FORMATS.values() if f.sign):
        raise ValueError(f"no log file {source!r} (give a path to a log, or the log's text)")
    else:
        text = source
    lines = text.splitlines()
    if format == "auto":
        format = _detect(lines)
    if format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {format!r}; valid: auto, {', '.join(LOG_FORMATS)}")
    entry = LOG_FORMATS[format]
    return entry.read(lines, entry.words)
