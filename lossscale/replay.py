"""Replay a training log: read the loss-scale lines a framework printed, check them against that
framework's own policy, and replay other policies on what the log bounds.

Formats read (the format strings are the frameworks' own; the tests cite file and function):

- ``deepspeed``: ``[deepspeed] OVERFLOW! Rank R Skipping step. Attempted loss scale: S, reducing
  to T`` and its hysteresis form (``deepspeed/runtime/fp16/loss_scaler.py``,
  ``DynamicLossScaler.update_scale``); the older ``[deepspeed] fp16 dynamic loss scale overflow!
  ...`` and ``[deepscale] OVERFLOW! ...`` (fused and unfused optimizers, ZeRO 1/2/3 of earlier
  releases); ``step=N, skipped=M`` (``engine.py``, ``_report_progress``); the FP16_Optimizer's
  ``Grad overflow on iteration N`` with ``Reducing``/``Increasing dynamic loss scale from S to T``
  or ``Using static loss scale of: S`` (``runtime/fp16/fused_optimizer.py`` and
  ``unfused_optimizer.py``, ``_update_scale``) and the older ``Overflow detected. Skipping step.
  Attempted loss scale: S, reducing to T``;
- ``apex``: ``Gradient overflow.  Skipping step, loss scaler K reducing loss scale to T``
  (``apex/amp/handle.py``, ``scale_loss``) and ``fp16_utils``' form without ``loss scaler K``;
  ``OVERFLOW! Skipping step. Attempted loss scale: S, reducing to T``
  (``apex/fp16_utils/fp16_optimizer.py``, ``FP16_Optimizer.step``);
- ``fairseq``: ``NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: T``
  (``fairseq/trainer.py``, ``train_step``; ``WARNING: overflow detected, ...`` of older
  releases) and the progress lines' ``loss_scale`` and ``num_updates`` (simple and JSON bars);
- ``megatron``: ``iteration N/ M | ... loss scale: T | ... number of skipped iterations: K |``
  (``megatron/training/training.py``, ``training_log``; the 2019 form has no colons);
- ``mindspore``: ``epoch: E, step: N, loss is L, overflow is B, loss scale is S`` (the model zoo's
  ``LossCallBack.step_end``, printing ``TrainOneStepWithLossScaleCell``'s outputs); MindFormers'
  ``{ Epoch:[E/n], step:[N/m], ..., overflow cond: B, loss_scale: S`` (``MFLossMonitor``); MindYOLO's
  ``overflow, still update, loss scale adjust to S``;
- ``colossalai``: ``Found overflow. Skip step`` (an overflow, its scale not printed);
- ``csv``: ``step,scale,overflow`` (the scale each step ran at; overflow 0/1 or true/false).

Progress-bar counters (tqdm's ``| N/M [``) give step numbers to the overflow lines between them.
Whatever the format, a line that speaks of an overflow or a loss scale and is not read is counted
in ``Log.unparsed`` with its number. A verdict is "consistent" only where at least one logged scale
was compared; a constant scale with no overflow (a bf16 run) is said to be one.

Where the log places every step (each step is an event or implied by its counters:
``Log.complete``), the policy is replayed step by step; otherwise only each overflow's own update
and the growth between overflows are checked.

Sparse logs: the steps a log does not print one by one are *gaps* (``LogEvent.span``): counted
where counters give their number (DeepSpeed's ``step=N, skipped=M`` every ``steps_per_print``
steps: the overflow lines since the last report, and ``M`` minus the last report's skipped
overflows, of which those without a line are overflows of unknown place; fairseq's
``num_updates``: applied updates), bounded (the overflow lines after the last counter lie within
one counter interval of it) or of unknown length (overflow lines with no counter: any number of
clean steps before each). A gap's steps lie anywhere around the overflow lines between its two
counters (``LogEvent.among``), in their order. Every framework prints each overflow, so a gap
between two lines holds clean steps only; a counter that counts fewer skipped steps than there
are lines since the last one (several ranks printing) leaves its steps unknown.

Counterfactual replay, the model: a step overflows at scale S when its unscaled gradient maximum
g exceeds MAX / S (MAX: the gradient format's largest finite value, 65504 for binary16); so an
overflow at S says g > MAX / S and a clean step g <= MAX / S. Another policy at scale T then
certainly overflows where T >= S on an overflow step and is certainly clean where T <= S on a
clean step; every other step is unknown. Where the log does not give S, it bounds it
(:func:`scale_bounds`: a clean step multiplies the scale by 1 to the growth factor, an overflow
by the backoff factor to 1, from every scale the log prints, forward and backward), and the
certainty takes the bound that holds for every S within it. After an unknown step the other
policy's state branches (it overflowed, or not): the replay keeps the set of states it may be in
(a step is certain only when it is certain in every one), up to ``MAX_STATES``; past that the
state is lost and every later step is unknown. Through a gap it follows every order of the gap's
steps around its overflow lines and every length the gap may have (a gap of unknown length
usually loses the state: the other policy may have grown without bound). A gap's row holds the
decision that is certain for every one of its steps, and the scales the policy may hold as the
gap's window begins. The framework's own scales are taken from its replay only where every growth
window the log allows was tried and they agree; elsewhere from the log's own numbers.

Exact replay: where the log prints a scale and every gap but the last has a known or bounded length,
the bounds above give way to the framework's own run, followed beside the other policy's. Every run
of the framework's policy that prints the log is tried (each growth window from 1 to one past the
log's steps, each hysteresis from 1 to 4, each initial scale that growths and backoffs take to the
first printed scale; the framework's defaults for the rest), through every order of each gap's steps,
and only the runs that reproduce the whole log are kept (forward through the log, then back). The
other policy's step then sees the exact scale S of each such run, and a step is certain exactly when
every kept run and every outcome the gradients allow agree on it: nothing the log leaves open is
certain and nothing it decides is left open (:func:`exact_fit` names the runs kept). Windows that
behave alike are followed as one until one of them grows, so the cost is the number of distinct
runs, not of windows; past ``MAX_RUNS`` or ``MAX_JOINT`` places the replay falls back to the bounds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .policy.core import Policy, describe
from .policy.frameworks import (
    ApexPolicy,
    DeepSpeedPolicy,
    FairseqPolicy,
    MegatronPolicy,
    MindSporePolicy,
    MinimumScaleError,
)

__all__ = ["LogEvent", "Log", "read_log", "LOG_FORMATS", "Departure", "Consistency", "consistency", "Decision",
           "counterfactual", "bounds", "MAX_STATES", "BINARY16_MAX", "framework_policy", "logged_scales",
           "log_steps", "scale_bounds", "SAMPLE_LOG", "exact_fit", "MAX_RUNS", "MAX_JOINT"]

BINARY16_MAX = 65504.0
#: A DeepSpeed run's log that ships with the package (``lossscale/data/README.md`` says how it was
#: made): ``lossscale replay`` on it shows a sparse log's replay.
SAMPLE_LOG = Path(__file__).resolve().parent / "data" / "deepspeed-sample.log"
#: The most states a counterfactual replay follows after unknown steps before it calls the state lost.
MAX_STATES = 256


@dataclass(frozen=True)
class LogEvent:
    """One step of a log: its number where the log says it (None where not), whether it
    overflowed, the scale it ran at and the scale after it (None where the log does not print
    them), its 1-based line; ``hysteresis``: DeepSpeed's hysteresis before the step, where printed or
    implied (a line that reduces the scale says it was 1: ``DynamicLossScaler.update_scale`` reduces
    only then)."""

    step: int | None
    overflow: bool
    scale: float | None
    next_scale: float | None
    line: int
    hysteresis: int | None = None
    #: A gap: steps the log does not print one by one, ``(low, high)`` of them (high None: no
    #: bound); ``step`` is its last step and ``next_scale`` the scale after it, where printed.
    span: tuple[int, int | None] | None = None
    #: Of a gap's steps, how many overflowed (in positions the log does not give; None: the log
    #: says nothing of their outcomes); the others are clean.
    overflows: int | None = 0
    #: How many events just before a gap are among its steps, in their order but with the gap's
    #: steps anywhere around them (the overflow lines between two step counters).
    among: int = 0

    @property
    def gap(self) -> bool:
        return self.span is not None


@dataclass(frozen=True)
class Log:
    """A parsed log: its ``framework``, its ``events`` in log order, the ``unparsed`` lines (line
    number and text) that spoke of overflow or the loss scale in no form the format has, and
    ``complete``: whether every step between the first event and the last is an event."""

    framework: str
    events: tuple[LogEvent, ...]
    unparsed: tuple[tuple[int, str], ...] = ()
    complete: bool = False
    notes: tuple[str, ...] = ()


_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_BAR = re.compile(r"\|\s*(\d+)/(\d+)\s*\[")  # tqdm: "| 12/100 [00:03<...]" after N finished steps

_DS_REDUCE = re.compile(r"\[(?:deepspeed|deepscale)\] (?:OVERFLOW!|fp16 dynamic loss scale overflow!)"
                        r"(?: Rank \d+)? Skipping step\. Attempted loss scale: " + _NUM + r", reducing to " + _NUM)
_DS_HYST = re.compile(r"\[(?:deepspeed|deepscale)\] OVERFLOW!(?: Rank \d+)? Skipping step\. Attempted loss scale: "
                      + _NUM + r", but hysteresis is (\d+)\. Reducing hysteresis to (\d+)")
_DS_BARE = re.compile(r"\[deepspeed\] OVERFLOW!(?: Rank \d+)? Skipping step\.(?: Gradients are non-finite, "
                      r"weights were not updated\.)?\s*$")
_DS_STEP = re.compile(r"\bstep=(\d+), skipped=(\d+)")
# DeepSpeed's FP16_Optimizer (fused_optimizer.py, unfused_optimizer.py: _update_scale, verbose), and its
# older "Overflow detected" form; the iteration is cur_iter, the number of steps before this one
_DS_ITER = re.compile(r"Grad overflow on iteration:? (\d+)")
_DS_FROM = re.compile(r"(Reducing|Increasing) dynamic loss scale from " + _NUM + r" to " + _NUM)
_DS_STATIC = re.compile(r"Using static loss scale of:? " + _NUM)
_DS_QUIET = re.compile(r"No Grad overflow for \d+ iterations")  # said before an Increasing line
_DS_DETECTED = re.compile(r"Overflow detected\. Skipping step\. Attempted loss scale: " + _NUM +
                          r", reducing to " + _NUM)
_APEX = re.compile(r"Gradient overflow\.\s+Skipping step, (?:loss scaler (\d+) )?reducing loss scale to " + _NUM)
# apex/fp16_utils/fp16_optimizer.py, FP16_Optimizer.step (and the copies of it in NVIDIA's examples)
_APEX_FP16 = re.compile(r"(?<!\] )(?<!Rank \d )OVERFLOW! Skipping step\. Attempted loss scale: " + _NUM +
                        r", reducing to " + _NUM)
_FS_OVERFLOW = re.compile(r"(?:NOTE: (?:gradient )?|WARNING: )overflow detected, (?:ignoring gradient, )?"
                          r"setting loss scale to: " + _NUM)
# progress lines: key=value pairs (SimpleProgressBar) in fairseq's order, num_updates before loss_scale,
# or the other; fairseq <= 0.6's pipe-separated epoch summaries "| num_updates 10198 | ... | loss_scale 0.500 |"
_FS_SCALE = re.compile(r"\bloss_scale[= ]" + _NUM + r"\b")
_FS_UPDATES = re.compile(r"\bnum_updates[= ](\d+)\b")
_FS_JSON = re.compile(r"(\{.*\"(?:train_)?loss_scale\".*\})")
_MEGATRON = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.* loss scale:? " + _NUM + r" \|(?:.* number of skipped "
                       r"iterations:?\s*(\d+) \|)?")  # the 2019 form has no colons
# MindFormers' MFLossMonitor.print_output_info (mindformers/core/callback/callback.py): one line per
# sink of steps, the step within the epoch, the scale the step ran at (scaling_sens) in binary32
_MINDFORMERS = re.compile(r"Epoch:\[\s*(\d+)/\s*\d+\], step:\[\s*(\d+)/\s*(\d+)\],.*?overflow cond: (True|False), "
                          r"loss_scale: \[?" + _NUM)
# MindYOLO's train step (mindyolo/utils/train_step_factory.py): an overflow it applies anyway
_MINDYOLO = re.compile(r"overflow, still update, loss scale adjust to " + _NUM)
# Colossal-AI's naive AMP optimizer: an overflow, the scale not printed
_COLOSSAL = re.compile(r"Found overflow\. Skip step")
_MINDSPORE = re.compile(r"step: (\d+), loss is .*?, overflow is \[?(True|False)\]?, loss scale is \[?" + _NUM + r"\]?")

def _words(own: str) -> re.Pattern[str]:
    """The words that make a line the format did not read count as unparsed rather than unrelated:
    the format's own, and, whatever the format, any mention of an overflow or a loss scale."""
    return re.compile(rf"{own}|(?i:overflow|loss[ _]?scale)")


#: What marks a line as the format's (format detection), and the words that make an unmatched
#: line count as unparsed rather than unrelated (:func:`_words`).
_SIGNS: dict[str, tuple[re.Pattern[str], re.Pattern[str]]] = {
    "deepspeed": (re.compile(r"\[(?:deepspeed|deepscale)\] (?:OVERFLOW!|fp16 dynamic loss scale overflow!)|"
                             r"Grad overflow on iteration|dynamic loss scale from|Overflow detected\. Skipping step|"
                             r"\bstep=\d+, skipped=\d+"),
                  _words(r"OVERFLOW|overflow!|Attempted loss scale|step=\d+, skipped=")),
    "apex": (re.compile(r"Gradient overflow\.\s+Skipping step|"
                        r"(?<!\] )(?<!Rank \d )OVERFLOW! Skipping step\. Attempted"),
             _words(r"Gradient overflow|reducing loss scale|OVERFLOW")),
    "fairseq": (re.compile(r"(?:NOTE: (?:gradient )?|WARNING: )overflow detected|\bloss_scale[= ]\d|"
                           r"\"(?:train_)?loss_scale\""),
                _words(r"overflow detected|loss_scale")),
    "megatron": (re.compile(r"iteration\s+\d+/\s*\d+ \|.* loss scale:? "),
                 _words(r"iteration\s+\d+/|loss scale:|skipped iterations")),
    "mindspore": (re.compile(r"overflow is \[?(?:True|False)\]?, loss scale is|overflow cond: (?:True|False), "
                             r"loss_scale:|overflow, still update, loss scale adjust to"),
                  _words(r"overflow is|loss scale is|overflow cond|loss_scale")),
    "colossalai": (_COLOSSAL, _words(r"overflow")),
}
LOG_FORMATS = (*_SIGNS, "csv")


def _detect(lines: Sequence[str]) -> str:
    if lines and re.fullmatch(r"\s*step\s*,\s*scale\s*,\s*overflow\s*", lines[0]):
        return "csv"
    counts = {name: sum(1 for line in lines if sign.search(line)) for name, (sign, _) in _SIGNS.items()}
    found = {name: n for name, n in counts.items() if n}
    if len(found) == 1:
        return next(iter(found))
    if not found:
        raise ValueError(f"no known log format found (no overflow or loss-scale line of {', '.join(LOG_FORMATS)}; "
                         f"a csv log starts with the header step,scale,overflow)")
    shown = ", ".join(f"{name} ({n} lines)" for name, n in found.items())
    raise ValueError(f"mixed log formats: {shown}; give format= one of {', '.join(LOG_FORMATS)}")


def read_log(source: str | Path, format: str = "auto") -> Log:
    """The log at a path, or log text (a string holding a newline, or naming no file), parsed in
    ``format`` (``auto``: the one format whose lines appear; ValueError naming the formats known
    where none or several do)."""
    if isinstance(source, Path) or ("\n" not in source and Path(source).is_file()):
        try:
            text = Path(source).read_text(errors="replace")
        except OSError as err:
            raise ValueError(f"cannot read the log {str(source)!r}: {err.strerror or err}") from None
    elif "\n" not in source and not any(sign.search(source) for sign, _ in _SIGNS.values()):
        raise ValueError(f"no log file {source!r} (give a path to a log, or the log's text)")
    else:
        text = source
    lines = text.splitlines()
    if format == "auto":
        format = _detect(lines)
    if format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {format!r}; valid: auto, {', '.join(LOG_FORMATS)}")
    if format == "csv":
        return _read_csv(lines)
    return _PARSERS[format](lines)


def _float(text: str) -> float:
    return float(text)


class _Builder:
    """Collects a log's overflow lines and step counters and assembles its events.

    ``all`` counters count every step (DeepSpeed's ``step=N`` and tqdm's bar close step N: an
    overflow line before counter N, after N - 1, is step N); ``clean`` counters count applied steps
    only (fairseq's ``num_updates``: the overflow lines between counters N - 1 and N are the skipped
    steps before applied step N, which the log does not number)."""

    def __init__(self, framework: str) -> None:
        self.framework = framework
        self.events: list[LogEvent] = []
        self.pending: list[LogEvent] = []
        self.unparsed: list[tuple[int, str]] = []
        self.notes: list[str] = []
        self.last: int | None = None
        self.kind = "all"
        self.skipped_before: int | None = 0  # a skipped counter starts at 0 with the run
        self.interval = 1  # the most steps between two counters
        self.complete = True
        self.maybe_copies: set[int] = set()  # overflow lines identical to the one before: copies, or not

    def overflow(self, event: LogEvent) -> None:
        self.pending.append(event)

    def counter(self, n: int, line: int, kind: str, next_scale: float | None = None,
                skipped: int | None = None) -> None:
        if n == 0 and self.last is None:  # a bar's first frame, before any step
            self.last = 0
            return
        pending, self.pending, self.kind = self.pending, [], kind
        last = self.last if self.last is not None else (0 if n == 1 else None)
        before = self.skipped_before
        counted = skipped - before if skipped is not None and before is not None else None
        if counted is not None and counted != len(pending) and self.last is not None:
            self.notes.append(f"line {line}: skipped={skipped} counts {counted} overflows since the last report; the "
                              f"log shows {len(pending)}")
        if last is not None and n == last and not pending:
            return  # the same counter again (a bar redrawn)
        if last is not None and n == last + 1 and (kind == "clean" or len(pending) <= 1) and \
                counted in (None, len(pending)):
            if kind == "all" and pending:
                self.events.append(replace(pending[0], step=n))
            else:
                self.events.extend(pending)
                self.events.append(LogEvent(n, False, None, next_scale, line))
        elif last is None:  # the first counter, after step 1 (printing every k steps, or a pasted tail)
            self._window(pending, n, None, line, kind, next_scale, skipped, self.skipped_before)
        else:  # the steps since the last counter: the overflow lines among clean steps the log does not print
            self._window(pending, n, n - last, line, kind, next_scale, skipped, self.skipped_before)
        self.skipped_before = skipped if skipped is not None else self.skipped_before
        self.interval = max(self.interval, n - (self.last or 0))  # the first counter's window: from step 1
        self.last = n

    def _window(self, pending: list[LogEvent], n: int, steps: int | None, line: int, kind: str,
                next_scale: float | None, skipped: int | None, before: int | None) -> None:
        """The steps up to counter ``n`` (``steps`` of them; None: from an unknown start): the
        pending overflow lines in their order, with the clean steps (and, where the counter's
        skipped count is higher, unprinted overflows) around them as one gap."""
        self.complete = False
        k = len(pending)
        counted = skipped - before if skipped is not None and before is not None else None
        if kind == "clean":  # fairseq: the counter counts applied updates; its own step is the last
            clean = steps - 1 if steps is not None else None
            gap = LogEvent(n - 1, False, None, None, line, span=(clean or 0, clean), among=k)
            self.events.extend(pending)
            if clean != 0:
                self.events.append(gap)
            # fairseq's loss_scale is the mean over the logging interval: the scale only for an interval of one
            self.events.append(LogEvent(n, False, None, next_scale if clean == 0 else None, line))
            return
        if counted is not None and 0 < counted < k:
            pending = self._copies(pending, counted, line)
            k = len(pending)
        if counted is not None and counted < k:
            return self._unknown(pending, n, line, next_scale, f"{k} overflow lines since the last counter, which "
                                 f"counts {counted} skipped steps (several ranks printing, or a duplicated paste?)")
        if steps is None and counted is None:  # a pasted tail, no skipped count: the lines cut off are unknown
            self.events.extend(pending)
            self.events.append(LogEvent(n, False, None, next_scale, line, span=(0, n - k), overflows=None, among=k))
            return
        anonymous = counted - k if counted is not None else 0
        low = high = n if steps is None else steps  # the first counter's window: from the run's first step
        if low - k < anonymous or high - k < anonymous:
            return self._unknown(pending, n, line, next_scale, "more overflows than steps since the last counter")
        if low == high == k + anonymous and not anonymous:  # every step is an overflow line: each placed
            self.events.extend(replace(e, step=n - k + 1 + i) for i, e in enumerate(pending))
            return
        self.events.extend(pending)
        self.events.append(LogEvent(n, False, None, next_scale, line, span=(low - k, high - k), overflows=anonymous,
                                    among=k))

    def _copies(self, pending: list[LogEvent], counted: int, line: int) -> list[LogEvent]:
        """More overflow lines than the counter counts overflows, where lines repeat the one before
        them: the repeats read as copies from other ranks, where that accounts for the count (every
        overflow printed by the same number of ranks, or every repeat a copy). Else as they are."""
        runs: list[list[LogEvent]] = []
        for e in pending:
            if runs and e.line in self.maybe_copies:
                runs[-1].append(e)
            else:
                runs.append([e])
        # run i stands for m_i overflows, 1 <= m_i <= its length, summing to the count: where that fixes
        # every m_i, or every overflow was printed the same number of times, the copies are known
        total = sum(len(run) for run in runs)
        least = [max(1, counted - (total - len(run))) for run in runs]
        most = [min(len(run), counted - (len(runs) - 1)) for run in runs]
        ranks = len(pending) // counted
        if least == most and all(len(run) % m == 0 for run, m in zip(runs, least, strict=True)):
            kept = [e for run, m in zip(runs, least, strict=True) for e in run[::len(run) // m]]
        elif len(pending) % counted == 0 and all(len(run) % ranks == 0 for run in runs):
            kept = [e for run in runs for e in run[::ranks]]
        else:
            return pending
        self.notes.append(f"line {line}: {len(pending)} overflow lines, some repeating the line before them, and "
                          f"the counter counts {counted} overflows: the repeats read as copies (several ranks "
                          f"printing)")
        return kept

    def _unknown(self, pending: list[LogEvent], n: int, line: int, next_scale: float | None, why: str) -> None:
        """The window up to counter ``n`` that the log contradicts: its lines, then its steps unknown."""
        self.notes.append(f"line {line}: {why}: their steps are left unknown")
        self.events.extend(pending)
        self.events.append(LogEvent(n, False, None, next_scale, line, span=(0, None), overflows=None))

    def build(self) -> Log:
        pending = self.pending
        if self.last is None:  # no counters: nothing numbers the steps, nor counts the clean ones between
            self.complete = False
            previous: LogEvent | None = None
            for e in pending:
                if previous is not None and previous.step is not None and e.step is not None:
                    between = e.step - previous.step - 1  # numbered overflow lines: the clean steps between
                    if between > 0:
                        self.events.append(LogEvent(e.step - 1, False, None, None, e.line, span=(between, between)))
                else:
                    self.events.append(LogEvent(None, False, None, None, e.line, span=(0, None)))
                self.events.append(e)
                previous = e
        elif pending:  # overflow lines after the last counter: within one counter interval of it
            k, every = len(pending), self.kind == "all"
            room = self.interval - k if every else self.interval - 1
            if room < 0:
                self.notes.append(f"{k} overflow lines after the last counter, which comes every {self.interval} "
                                  f"steps: their steps are left unknown")
                self.events.append(LogEvent(None, False, None, None, pending[0].line, span=(0, None)))
                self.events.extend(pending)
                self.complete = False
            elif room == 0:  # each the next step
                self.events.extend(replace(e, step=self.last + 1 + i) if every else e for i, e in enumerate(pending))
            else:
                self.events.extend(pending)
                self.events.append(LogEvent(None, False, None, None, pending[-1].line, span=(0, room), among=k))
                self.complete = False
        return Log(self.framework, tuple(self.events), tuple(self.unparsed), self.complete and bool(self.events),
                   tuple(self.notes))


#: What a line carries before its message: time stamps, levels, sources and rank prefixes (``[...]``
#: groups, torchrun's ``0: `` and ``[default0]:``, ``Rank N``), dropped to compare two ranks' lines.
_PREFIX = re.compile(r"^(?:\s*(?:\[[^\]]*\]:?|\d+:|\|)\s*)+|\b[Rr]ank\s*\d+\b")


def _rank(text: str) -> str | None:
    """The rank a line names in its prefix (``Rank N``, torchrun's ``N:`` or ``[defaultN]:``), if any."""
    m = re.search(r"\b[Rr]ank\s*(\d+)|^\s*(\d+):|\[default(\d+)\]", text)
    return next((g for g in m.groups() if g is not None), None) if m else None


def _ranks_printing(lines: Sequence[str], words: re.Pattern[str]) -> int:
    """How many ranks print each overflow line, where the log shows it: the most lines in a row that
    repeat one message under distinct rank prefixes (1 where none do). The frameworks print an
    overflow's scaled and unscaled forms from one function on every rank that prints either
    (DeepSpeed's ``update_scale``), so the count holds for the lines that name no rank too."""
    most, ranks, last = 1, set(), None
    for text in lines:
        rank, message = _rank(text), _PREFIX.sub("", text).strip()
        if rank is not None and message == last and rank not in ranks and words.search(text):
            ranks.add(rank)
            most = max(most, len(ranks))
        else:
            ranks, last = ({rank}, message) if rank is not None else (set(), None)
    return most


def _scan(lines: Sequence[str], framework: str, handle) -> Log:
    """Run ``handle(builder, line_number, text)`` over the lines (it returns True where it read the
    line); lines it did not read that carry the format's words are unparsed. tqdm bars count steps
    in every format: the training bar only (the one with the most steps; a rollout or evaluation
    bar is not a step counter), read in its place on the line (a message pasted after a bar on the
    same line follows it); a bar that goes backwards is noted. A line identical to the overflow
    line just before it, prefixes aside and no counter between, is another rank printing the same
    step's overflow: one overflow, the copies noted. Where the log shows R ranks printing each
    overflow (the same line under R rank prefixes), identical lines naming no rank are read in
    groups of R, one overflow each."""
    b = _Builder(framework)
    words = _SIGNS[framework][1]
    printing = _ranks_printing(lines, words)
    totals = [int(m[2]) for text in lines for m in _BAR.finditer(text)]
    training = max(totals) if totals else None
    other_bars: set[int] = set()
    copies, last_message, group = 0, None, 0  # the last overflow line's message and rank; its lines in a row

    def read(i: int, text: str) -> bool:
        nonlocal copies, last_message, group
        before = len(b.pending)
        if not handle(b, i, text):
            return False
        if len(b.pending) != before + 1:  # a counter, or a line that is no overflow: copies end here
            last_message = None
            return True
        message, rank, e = _PREFIX.sub("", text).strip(), _rank(text), b.pending[-1]
        # a real overflow after another changes the scale it prints (or its hysteresis), so an identical
        # line is a copy where the first one changed it, or where the two name different ranks
        changed = e.next_scale is not None and (e.scale is None or e.next_scale != e.scale or e.hysteresis != 1)
        same = last_message is not None and message == last_message[0]
        if same and printing > 1 and rank is None:  # R ranks print each overflow: R identical lines, one overflow
            copy = group % printing != 0
        else:
            copy = same and (changed or (rank is not None and last_message[1] is not None and rank != last_message[1]))
        if copy:
            b.pending.pop()
            copies += 1
            group += 1
        else:
            if same:  # a copy, or the same line again
                b.maybe_copies.add(i)
            last_message, group = (message, rank), 1
        return True

    for i, text in enumerate(lines, start=1):
        for part in text.split("\r"):  # a bar redrawn in place leaves its frames on one line
            bar = _BAR.search(part)
            if not (bar and "%" in part[:bar.start()]):
                if not read(i, part) and words.search(part):
                    b.unparsed.append((i, part))
                continue
            head, close = part[:bar.start()], part.find("]", bar.end())
            tail = part[close + 1:] if close >= 0 else ""
            read(i, head)
            n, total = int(bar[1]), int(bar[2])
            if total != training:
                other_bars.add(total)
            elif b.last is not None and n < b.last:
                b.notes.append(f"line {i}: the progress bar goes back from {b.last} to {n} (a restart?); read on "
                               f"from {b.last}")
            else:
                b.counter(n, i, "all")
                last_message = None
            if tail.strip() and not read(i, tail) and words.search(tail):
                b.unparsed.append((i, tail))
    if other_bars:
        b.notes.append(f"progress bars of {', '.join(map(str, sorted(other_bars)))} steps are not the training "
                       f"bar ({training} steps) and count no step")
    if copies:
        b.notes.append(f"{copies} overflow lines repeat the line before them (several ranks printing, told apart by "
                       f"their prefixes and that no step counter came between): each read as one overflow")
    return b.build()


def _deepspeed(lines: Sequence[str]) -> Log:
    iteration: list[int | None] = [None]  # FP16_Optimizer's "Grad overflow on iteration N", awaiting its scales

    def handle(b: _Builder, i: int, text: str) -> bool:
        if m := _DS_ITER.search(text):
            iteration[0] = int(m[1])
        elif m := _DS_FROM.search(text):
            grow = m[1] == "Increasing"
            step = None if grow or iteration[0] is None else iteration[0] + 1
            b.overflow(LogEvent(step, not grow, _float(m[2]), _float(m[3]), i, None if grow else 1))
            iteration[0] = None
        elif m := _DS_STATIC.search(text):  # a static scale: the overflow's step is skipped, the scale kept
            step = None if iteration[0] is None else iteration[0] + 1
            b.overflow(LogEvent(step, True, _float(m[1]), _float(m[1]), i))
            iteration[0] = None
        elif _DS_QUIET.search(text):
            pass
        elif m := _DS_REDUCE.search(text) or _DS_DETECTED.search(text):  # a reduction: the hysteresis was 1
            b.overflow(LogEvent(None, True, _float(m[1]), _float(m[2]), i, 1))
        elif m := _DS_HYST.search(text):
            b.overflow(LogEvent(None, True, _float(m[1]), _float(m[1]), i, int(m[2])))
        elif _DS_BARE.search(text):
            b.overflow(LogEvent(None, True, None, None, i))
        elif m := _DS_STEP.search(text):
            b.counter(int(m[1]), i, "all", skipped=int(m[2]))
        else:
            return False
        return True
    return _scan(lines, "deepspeed", handle)


def _apex(lines: Sequence[str]) -> Log:
    ids: set[str] = set()

    def handle(b: _Builder, i: int, text: str) -> bool:
        if m := _APEX.search(text):
            ids.add(m[1] or "0")
            b.overflow(LogEvent(None, True, None, _float(m[2]), i))
            return True
        if m := _APEX_FP16.search(text):
            b.overflow(LogEvent(None, True, _float(m[1]), _float(m[2]), i))
            return True
        return False
    log = _scan(lines, "apex", handle)
    if len(ids) > 1:
        log = replace(log, notes=(*log.notes, f"several loss scalers ({', '.join(sorted(ids))}): their lines are read "
                                  f"as one sequence"), complete=False)
    return log


def _fairseq(lines: Sequence[str]) -> Log:
    def handle(b: _Builder, i: int, text: str) -> bool:
        if m := _FS_OVERFLOW.search(text):
            b.overflow(LogEvent(None, True, None, _float(m[1]), i))
        elif (m := _FS_UPDATES.search(text)) and (scale := _FS_SCALE.search(text)):
            b.counter(int(m[1]), i, "clean", next_scale=_float(scale[1]))
        elif (m := _FS_JSON.search(text)) and _fairseq_json(b, i, m[1]):
            pass
        else:
            return False
        return True
    return _scan(lines, "fairseq", handle)


def _fairseq_json(b: _Builder, i: int, text: str) -> bool:
    try:
        stats = json.loads(text)
        train = "train_" if "train_loss_scale" in stats else ""  # the end-of-epoch record's keys
        scale, updates = float(stats[f"{train}loss_scale"]), int(stats[f"{train}num_updates"])
    except (ValueError, KeyError, TypeError):
        return False
    b.counter(updates, i, "clean", next_scale=scale)
    return True


def _per_step(framework: str, rows: Iterable[tuple[int, int | None, bool, float | None, float | None]],
              unparsed: list[tuple[int, str]], notes: list[str], interval: dict[int, int] | None = None) -> Log:
    """A log with one line per numbered step: complete where the steps run on by one; the steps
    between two numbered lines a gap whose outcomes the log does not give; before each unnumbered
    overflow line (MindYOLO's, Colossal-AI's) a gap of clean steps of unknown length. ``interval``:
    for a line that sums its logging interval (Megatron's, keyed by line), how many of the
    interval's steps were skipped: the interval is a gap with that many overflows."""
    events, complete, last = [], True, None
    for line, step, overflow, scale, next_scale in rows:
        if step is None:
            complete = False
            events += [LogEvent(None, False, None, None, line, span=(0, None)),
                       LogEvent(None, overflow, scale, next_scale, line)]
            continue
        skipped = (interval or {}).get(line)
        if last is not None and step <= last:
            complete = False
            notes.append(f"line {line}: step {step} follows step {last}; the steps between are unknown")
            events.append(LogEvent(step - 1, False, None, None, line, span=(0, None), overflows=None))
        elif skipped is not None and step - (last or 0) > 1:  # an interval: its skipped steps anywhere in it
            complete = False
            steps = step - last if last is not None else None
            span = (steps, steps) if steps is not None else (max(skipped, 1), step)
            events.append(LogEvent(step, skipped > 0, None, next_scale, line, span=span, overflows=skipped))
            last = step
            continue
        elif step > (last if last is not None else 0) + 1:
            complete = False
            if last is not None:
                notes.append(f"line {line}: step {step} follows step {last}; the steps between are not in the log")
            between = step - (last if last is not None else 0) - 1
            events.append(LogEvent(step - 1, False, None, None, line, span=(between, between), overflows=None))
        events.append(LogEvent(step, overflow, scale, next_scale, line))
        last = step
    return Log(framework, tuple(events), tuple(unparsed), complete and bool(events), tuple(notes))


def _megatron(lines: Sequence[str]) -> Log:
    rows, unparsed, notes, skipped = [], [], [], {}
    words = _SIGNS["megatron"][1]
    for i, text in enumerate(lines, start=1):
        if m := _MEGATRON.search(text):
            skipped[i] = int(m[3] or 0)  # over the logging interval, which the iterations give
            rows.append((i, int(m[1]), skipped[i] > 0, None, _float(m[2])))
        elif words.search(text):
            unparsed.append((i, text))
    return _per_step("megatron", rows, unparsed, notes, skipped)


def _mindspore(lines: Sequence[str]) -> Log:
    rows, unparsed = [], []
    words = _SIGNS["mindspore"][1]
    for i, text in enumerate(lines, start=1):
        if m := _MINDSPORE.search(text):
            rows.append((i, int(m[1]), m[2] == "True", _float(m[3]), None))
        elif m := _MINDFORMERS.search(text):  # the step within its epoch, numbered through the epochs
            rows.append((i, (int(m[1]) - 1) * int(m[3]) + int(m[2]), m[4] == "True", _float(m[5]), None))
        elif m := _MINDYOLO.search(text):
            rows.append((i, None, True, None, _float(m[1])))
        elif words.search(text):
            unparsed.append((i, text))
    return _per_step("mindspore", rows, unparsed, [])


def _colossalai(lines: Sequence[str]) -> Log:
    rows, unparsed = [], []
    for i, text in enumerate(lines, start=1):
        if _COLOSSAL.search(text):
            rows.append((i, None, True, None, None))
        elif _SIGNS["colossalai"][1].search(text):
            unparsed.append((i, text))
    return _per_step("colossalai", rows, unparsed, [])


def _read_csv(lines: Sequence[str]) -> Log:
    rows, unparsed = [], []
    truth = {"1": True, "0": False, "true": True, "false": False}
    for i, text in enumerate(lines[1:], start=2):
        if not text.strip():
            continue
        cells = [c.strip() for c in text.split(",")]
        try:
            step, scale = int(cells[0]), float(cells[1])
            overflow = truth[cells[2].lower()]
            if len(cells) != 3 or not (scale > 0 and math.isfinite(scale)):
                raise ValueError
        except (ValueError, KeyError, IndexError):
            unparsed.append((i, text))
            continue
        rows.append((i, step, overflow, scale, None))
    return _per_step("csv", rows, unparsed, [])


_PARSERS = {"deepspeed": _deepspeed, "apex": _apex, "fairseq": _fairseq, "megatron": _megatron,
            "mindspore": _mindspore, "colossalai": _colossalai}


# -- consistency: the log's own policy replayed on its overflow sequence ------------------------------

#: Per framework: its policy, and the names of its initial scale, growth window and hysteresis
#: arguments (None: it has none), and fixed arguments for a replay (a replay must not stop at the
#: floor where the log goes on).
_POLICIES: dict[str, tuple[type[Policy], str, str, str | None, dict[str, Any]]] = {
    "deepspeed": (DeepSpeedPolicy, "init_scale", "scale_window", "delayed_shift", {"raise_error_at_min_scale": False}),
    "apex": (ApexPolicy, "init_scale", "scale_window", None, {}),
    "fairseq": (FairseqPolicy, "init_scale", "scale_window", None, {}),
    "megatron": (MegatronPolicy, "initial_scale", "growth_interval", "hysteresis",
                 {"min_scale": 1.0, "growth_factor": 2.0, "backoff_factor": 0.5}),
    "mindspore": (MindSporePolicy, "init_loss_scale", "scale_window", None, {}),
}


#: The growth window where the policy class has no default: Megatron-LM's ``--loss-scale-window``
#: (``megatron/training/arguments.py``, default 1000; ``MegatronPolicy`` takes every argument).
_DEFAULT_WINDOW = {"megatron": 1000}


def _matches(framework: str, replayed: float, logged: float) -> bool:
    """Whether a replayed scale prints as the logged one: DeepSpeed prints ``int(S)`` (older
    releases the float), Megatron ``{:.1f}``, fairseq's progress lines ``{:g}`` of S rounded to 4
    places (its overflow lines ``str(S)``), MindSpore the binary32 value; apex and csv the value."""
    if replayed == logged:
        return True
    if not math.isfinite(replayed):
        return False
    if framework == "deepspeed":
        return int(replayed) == logged
    if framework == "megatron":
        return f"{replayed:.1f}" == f"{logged:.1f}"
    if framework == "fairseq":  # {:g} of S rounded to 4 places, or (0.6-0.10) 3 or 0 decimals
        return any(float(format(round(replayed, d), "g")) == logged for d in (4, 3, 0))
    if framework == "mindspore":
        return bool(np.float32(replayed) == np.float32(logged))
    return False


@dataclass(frozen=True)
class Departure:
    """Where a replay and the log disagree: the log's line and step, which scale (``before`` the
    step or ``after`` it), the logged and replayed values, and what would explain it."""

    line: int
    step: int | None
    which: str
    logged: float
    replayed: float
    explanation: str = ""

    def __str__(self) -> str:
        where = f"line {self.line}" + (f" (step {self.step})" if self.step is not None else "")
        text = (f"{where}: the log's scale {self.which} the step is {_show(self.logged)}, the replay's "
                f"{_show(self.replayed)}")
        return text + (f"; {self.explanation}" if self.explanation else "")


def _show(x: float) -> str:
    return str(int(x)) if math.isfinite(x) and x == int(x) and abs(x) < 2**63 else repr(float(x))


@dataclass(frozen=True)
class Consistency:
    """The framework's own policy replayed on a log: the policy with the arguments inferred from the
    log (``inferred`` says how each was found), how many logged scales were compared, the
    departures (the replay takes the logged scale after each, so later ones are counted too), and
    the replayed scale before each event (None where the replay cannot say: from the first
    departure on, or where the ``fits`` candidates that fit the log equally well disagree)."""

    framework: str
    policy: Policy | None
    inferred: dict[str, str]
    compared: int
    departures: tuple[Departure, ...]
    scales: tuple[float | None, ...]
    complete: bool
    fits: int = 1
    #: Why nothing was checked, where nothing was (no policy, no event, no scale compared, a constant scale).
    unchecked: str = ""

    @property
    def consistent(self) -> bool:
        """The policy reproduced every logged scale, and there was at least one to compare."""
        return self.policy is not None and self.compared > 0 and not self.departures

    def verdict(self) -> str:
        """The consistency verdict in a few lines."""
        if self.unchecked:
            return f"{self.framework} log: {self.unchecked}"
        args = ", ".join(f"{k}={_show(v) if isinstance(v, float) else v}" for k, v in describe(self.policy).items())
        how = "; ".join(f"{k} {v}" for k, v in self.inferred.items())
        scope = ("every step" if self.complete else
                 "each overflow's own update and the growth between overflows (the log does not place every step)")
        head = [f"{self.framework} log, replayed with {type(self.policy).__name__}({args})", f"inferred: {how}",
                f"checked {scope}: {self.compared} logged scales compared"]
        if not self.departures:
            return "\n".join(head + ["consistent: the replay reproduces every logged scale"])
        more = f" ({len(self.departures)} departures in all)" if len(self.departures) > 1 else ""
        return "\n".join(head + [f"INCONSISTENT{more}: first at {self.departures[0]}"])


def _arguments(framework: str, init: float, window: int | None, hysteresis: int | None) -> dict[str, Any]:
    cls, init_name, window_name, hyst_name, fixed = _POLICIES[framework]
    args = {**fixed, init_name: init}
    if window is not None:
        args[window_name] = window
    if hyst_name and hysteresis is not None:
        args[hyst_name] = hysteresis
    if framework == "apex":
        args["max_loss_scale"] = max(2.0**24, init)
    if framework == "megatron":
        args["min_scale"] = min(1.0, init)
    return args


def _resync(state: Any, logged: float) -> Any:
    return state._replace(scale=type(state.scale)(logged))


def _replay(policy: Policy, log: Log) -> tuple[list[Departure], list[float | None], int]:
    """The policy stepped through a complete log: departures, the scale before each event, the
    number of logged scales compared."""
    state, departures, scales, compared = policy.initial(), [], [], 0
    for e in log.events:
        scales.append(float(state.scale))
        if e.scale is not None:
            compared += 1
            if not _matches(log.framework, float(state.scale), e.scale):
                departures.append(Departure(e.line, e.step, "before", e.scale, float(state.scale)))
                state = _resync(state, e.scale)
        try:
            state = policy.next(state, not e.overflow)
        except MinimumScaleError:
            departures.append(Departure(e.line, e.step, "after", e.next_scale or float(state.scale),
                                        float(state.scale), "the policy stops training here (at its minimum scale)"))
        if e.next_scale is not None:
            compared += 1
            if not _matches(log.framework, float(state.scale), e.next_scale):
                departures.append(Departure(e.line, e.step, "after", e.next_scale, float(state.scale)))
                state = _resync(state, e.next_scale)
    return departures, scales, compared


def _initial(framework: str, log: Log, window: int | None, hysteresis: int | None) -> float | None:
    """The initial scale that makes the replay meet the first logged scale: the policy run from a
    reference scale up to it, the ratio taken (each rule multiplies the scale by factors that do not
    depend on it, away from its floor and cap)."""
    ref = 2.0**64
    cls = _POLICIES[framework][0]
    policy = cls(**_arguments(framework, ref, window, hysteresis))
    if framework == "apex":
        policy = replace(policy, max_loss_scale=2.0**100)
    state = policy.initial()
    for e in log.events:
        if e.scale is not None:
            return e.scale * ref / float(state.scale)
        state = policy.next(state, not e.overflow)
        if e.next_scale is not None:
            return e.next_scale * ref / float(state.scale)
    return None


def _windows(log: Log, default: int) -> tuple[list[int], str, bool]:
    """Growth windows to try. Each run of clean steps whose scale is known before and after it
    grew k times (a doubling per window), so its length L bounds the window: about L / (k + 1) to
    L / k (one more or less, as the frameworks count from different steps); with no growth, above
    L - 1. The windows every run allows, up to 64 of them (the framework's default among them
    where it fits)."""
    events = log.events
    before: list[float | None] = []
    for i, e in enumerate(events):
        prev = events[i - 1].next_scale if i else None
        before.append(e.scale if e.scale is not None else prev if prev is not None else
                      2 * e.next_scale if e.overflow and e.next_scale is not None else None)
    low, high, grew, i = 1, math.inf, False, 0
    while i < len(events):
        if events[i].overflow:
            i += 1
            continue
        j = i
        while j + 1 < len(events) and not events[j + 1].overflow:
            j += 1
        start = before[i]
        end = before[j + 1] if j + 1 < len(events) else events[j].next_scale
        length = j - i + 1
        if start and end and end >= start:
            k = round(math.log2(end / start))
            grew = grew or k > 0
            low = max(low, length // (k + 1) - 1)
            if k > 0:
                high = min(high, length // k + 1)
        i = j + 1
    if high < low:
        return [default], "the framework's default (the log's growths fit no single window)", False
    if high == math.inf:
        return [max(default, low)], f"{'the default' if default >= low else low} (no growth in the log; any " \
            f"value from about {low} fits)", False
    span = list(range(low, int(high) + 1))
    picked = span if len(span) <= 64 else sorted({*span[:: max(1, len(span) // 64)], *(
        [default] if low <= default <= high else [])})
    return picked, f"from the growths in the log (windows {low} to {int(high)} tried)", len(span) <= 64


def framework_policy(log: Log) -> tuple[Policy | None, dict[str, str]]:
    """The log's own framework policy with arguments inferred from the log, and how each was
    inferred: the initial scale from the first logged scale, the hysteresis from DeepSpeed's
    hysteresis lines (Megatron's: tried from 1 to 4), the growth window from the first growth; among
    the candidates, the one whose replay departs least (and latest)."""
    fits, how, _ = _fits(log)
    return (fits[0] if fits else None), how


def _fits(log: Log) -> tuple[list[Policy], dict[str, str], bool]:
    """The candidates of :func:`framework_policy` that fit the log equally well (the first is the
    one it returns; a short log often fits several growth windows), how each argument was found, and
    whether every window the log allows was tried (else the replayed scales are not the log's)."""
    if log.framework not in _POLICIES:
        return [], {}, False
    cls, init_name, window_name, hyst_name, _ = _POLICIES[log.framework]
    default_window = _DEFAULT_WINDOW.get(log.framework) or next(
        f.default for f in dataclasses.fields(cls) if f.name == window_name)
    windows, window_how, pinned = _windows(log, default_window) if log.complete else (
        [default_window], "not inferred (the log does not place every step)", False)
    hysteresis: list[int | None] = [None]
    how: dict[str, str] = {}
    if log.framework == "deepspeed":
        first = next((e for e in log.events if e.overflow and e.scale is not None), None)
        hysteresis = [first.hysteresis if first is not None and first.hysteresis else 1]
        how[hyst_name] = f"from the first overflow line (line {first.line})" if first else "1 (no overflow line)"
    elif log.framework == "megatron":
        hysteresis = [1, 2, 3, 4]
        how[hyst_name] = "the best of 1 to 4"
    best = None
    for h in hysteresis:
        for w in windows:
            init = _initial(log.framework, log, w, h)
            if init is None:
                continue
            policy = cls(**_arguments(log.framework, init, w, h))
            departures = _replay(policy, log)[0] if log.complete else _chain(policy, log)[0]
            key = (len(departures), -(departures[0].line if departures else 0))
            if best is None or key < best[0]:
                best = (key, [policy])
            elif key == best[0]:
                best[1].append(policy)
    if best is None:
        return [], {"initial scale": "not found (no logged scale)"}, False
    how = {init_name: "from the first logged scale", window_name: window_how, **how}
    return best[1], how, pinned


def _chain(policy: Policy, log: Log) -> tuple[list[Departure], int]:
    """For a log that does not place every step: each overflow's own update (from the logged scale
    before it, where printed), and that some number of growths by the policy's factor leads from
    one overflow's scale after to the next one's."""
    factor = float(getattr(policy, "scale_factor", getattr(policy, "growth_factor", 2.0)))
    departures, compared, after = [], 0, None
    for e in log.events:
        if not e.overflow:
            unseen = e.gap and e.overflows != 0 and e.next_scale is None  # overflows the log does not print
            after = e.next_scale if e.next_scale is not None else None if unseen else after
            continue
        starts = [e.scale] if e.scale is not None else (
            [after * factor**k for k in range(0, 64)] if after is not None else [])
        if e.scale is not None and after is not None:
            compared += 1
            ratio = math.log(e.scale / after, factor) if e.scale > 0 and after > 0 else -1
            if ratio < -1e-9 or abs(ratio - round(ratio)) > 1e-6 and not _matches(log.framework, after, e.scale):
                departures.append(Departure(e.line, e.step, "before", e.scale, after,
                                            f"no number of growths by {factor:g} leads from {_show(after)} to it"))
        if e.next_scale is not None and starts:
            compared += 1
            state = policy.initial()
            if e.hysteresis is not None and hasattr(state, "cur_hysteresis"):
                state = state._replace(cur_hysteresis=e.hysteresis)
            results = []
            for s in starts:
                try:
                    results.append(float(policy.next(_resync(state, s), False).scale))
                except MinimumScaleError:
                    continue
            if not any(_matches(log.framework, r, e.next_scale) for r in results):
                departures.append(Departure(e.line, e.step, "after", e.next_scale, results[0] if results else math.nan,
                                            "the policy's backoff does not give it"))
        after = e.next_scale if e.next_scale is not None else None
    return departures, compared


def _explain(policy: Policy, log: Log, first: Departure) -> str:
    """Which single change of the policy's arguments would move the first departure later (or
    remove it): each number doubled, halved, one more or one less, each flag flipped."""
    best = None
    for f in dataclasses.fields(policy):
        value = getattr(policy, f.name)
        if isinstance(value, bool):
            options = [not value]
        elif isinstance(value, int):
            options = [v for v in (value - 1, value + 1, value * 2, value // 2) if v >= 1]
        elif isinstance(value, float):
            options = [value * 2, value / 2]
        else:
            continue
        for v in options:
            try:
                other = replace(policy, **{f.name: v})
            except (ValueError, TypeError):
                continue
            departures = _replay(other, log)[0]
            line = departures[0].line if departures else math.inf
            if line > first.line and (best is None or line > best[0]):
                best = (line, f.name, v)
    if best is None:
        return "no single change of the policy's arguments explains it (an edited log, or lines missing?)"
    line, name, v = best
    reach = "the whole log" if line == math.inf else f"the log up to line {line}"
    return f"{name}={_show(v) if isinstance(v, float) else v} would reproduce {reach}"


def consistency(log: Log, policy: Policy | None = None) -> Consistency:
    """The log's own framework policy (``policy``, or one inferred from the log) replayed on its
    overflow sequence, every logged scale compared; the first departure explained."""
    inferred: dict[str, str] = {}
    fits: list[Policy] = []
    nothing = tuple(None for _ in log.events)
    values = {v for e in log.events for v in (e.scale, e.next_scale) if v is not None}
    if not log.events:
        return Consistency(log.framework, None, {}, 0, (), (), log.complete, unchecked="no loss-scale event read: "
                           "nothing to check")
    if log.framework not in _POLICIES and policy is None:
        return Consistency(log.framework, None, {}, 0, (), nothing, log.complete, unchecked="no framework policy "
                           "to check it against (the scales are the log's own)")
    if len(values) == 1 and not any(e.overflow for e in log.events):
        return Consistency(log.framework, None, {}, 0, (), nothing, log.complete, unchecked=(
            f"a constant loss scale {_show(values.pop())} and no overflow (a bf16 run, or a constant scaler): "
            f"nothing for a dynamic policy to check"))
    pinned = policy is not None  # a policy given is the log's, as given
    if policy is None:
        fits, inferred, pinned = _fits(log)
        policy = fits[0] if fits else None
    if policy is None:
        return Consistency(log.framework, None, inferred, 0, (), nothing, log.complete, unchecked="no logged scale: "
                           "nothing to check")
    if log.complete:
        departures, scales, compared = _replay(policy, log)
        # not pinned (windows the log allows were left untried): the log's own scales only
        cut = -math.inf if not pinned else departures[0].line if departures else math.inf
        scales = [s if e.line < cut else None for s, e in zip(scales, log.events, strict=True)]
        if len(fits) > 1:  # the scales the equally fitting candidates disagree on are not known
            others = [_replay(other, log)[1] for other in fits[1:]]
            scales = [s if all(o[i] == s for o in others) else None for i, s in enumerate(scales)]
            window = _POLICIES[log.framework][2]
            inferred = {**inferred, window: f"{inferred.get(window, '')}; {len(fits)} candidates fit equally well, "
                        f"the steps whose scale they disagree on are unknown"}
        if departures:
            departures[0] = replace(departures[0], explanation=departures[0].explanation or
                                    _explain(policy, log, departures[0]))
    else:
        departures, compared = _chain(policy, log)
        scales = [None] * len(log.events)
    unchecked = "" if compared else f"no logged scale could be compared with {type(policy).__name__}: nothing checked"
    return Consistency(log.framework, policy, inferred, compared, tuple(departures), tuple(scales), log.complete,
                       max(1, len(fits)), unchecked)


# -- counterfactual: another policy on the bounds the log sets on each step's gradients ---------------

@dataclass(frozen=True)
class Decision:
    """Another policy's step: the scales it may hold before the step (one, unless unknown steps
    branched it; none once the state is lost) and its decision: ``overflow``, ``clean`` or ``unknown``."""

    scales: tuple[float, ...]
    decision: str


def log_steps(log: Log) -> dict[str, int]:
    """How the log knows its steps: ``placed_steps`` (each an event), ``counted_steps`` in
    ``counted_gaps`` (gaps whose length the counters give), ``bounded_gaps`` (a length within
    bounds) and ``unknown_gaps`` (no bound)."""
    gaps = [e.span for e in log.events if e.span is not None]
    exact = [lo for lo, hi in gaps if hi == lo]
    return {"placed_steps": sum(not e.gap for e in log.events), "counted_steps": sum(exact),
            "counted_gaps": len(exact), "bounded_gaps": sum(hi is not None and hi != lo for lo, hi in gaps),
            "unknown_gaps": sum(hi is None for _, hi in gaps)}


def logged_scales(log: Log, check: Consistency | None = None) -> list[float | None]:
    """The scale each step of the log ran at, where known: the replayed scale up to the first
    departure (exact), else the logged one (before the step, or after the step before)."""
    out, after = [], None
    replayed = check.scales if check is not None else (None,) * len(log.events)
    for e, r in zip(log.events, replayed, strict=True):
        s = r if r is not None else e.scale if e.scale is not None and e.scale > 0 else after if log.complete else None
        out.append(s)
        after = e.next_scale
    return out


def bounds(log: Log, scales: Sequence[float | None], max_value: float = BINARY16_MAX) -> list[tuple[float, float]]:
    """Each step's bounds (low, high] on its unscaled gradient maximum g: an overflow at S says
    g > max_value / S, a clean step g <= max_value / S; (0, inf] where the scale is unknown."""
    out = []
    for e, s in zip(log.events, scales, strict=True):
        if s is None:
            out.append((0.0, math.inf))
        else:
            out.append((max_value / s, math.inf) if e.overflow else (0.0, max_value / s))
    return out


def counterfactual(log: Log, policy: Policy, scales: Sequence[float | None] | None = None,
                   max_states: int = MAX_STATES, check: Consistency | None = None) -> list[Decision]:
    """``policy`` replayed on the log's bounds (see the module): each step certain only where it is
    certain for every gradient maximum the log allows, every state the policy may be in and, in a
    gap, every way the log's steps can lie (a gap row's decision holds for every step in it; its
    scales are those the policy may hold as the gap begins). ``scales``: the scale each event ran
    at, where known (None: :func:`logged_scales` of the log's consistency check, ``check`` or made
    here, and between them the bounds :func:`scale_bounds` gives)."""
    if scales is None:
        exact = _exact(log, policy, max_states)
        if exact is not None:
            return exact
        check = check if check is not None else consistency(log)
        grow, back = _factors(log, check.policy)
        known, starts = _scale_bounds(log, logged_scales(log, check), grow, back)
    else:
        back = 0.0
        known = [(s, s) if s is not None else (0.0, math.inf) for s in scales]
        starts = known
    events = log.events
    window_of = {j - k: j for j, e in enumerate(events) if e.gap and (k := e.among)}
    states: set[Any] | None = {policy.initial()}
    out: list[Decision | None] = [None] * len(events)
    low = 0.0  # the least scale the logging run can hold now (clean steps never lower it)
    i = 0
    while i < len(events):
        j = window_of.get(i, i)
        if j == i and not events[i].gap:  # a placed step
            e = events[i]
            states, out[i] = _placed(policy, states, e, known[i], max_states)
            low = _after(e, known[i][0], low)
        else:  # a gap, with the events among its steps (the least scale as it begins: also what comes after says)
            states, decisions, low = _window(policy, states, events[i:j + 1], known[i:j + 1], max(low, starts[i][0]),
                                             back, max_states)
            out[i:j + 1] = decisions
        i = j + 1
    return [d for d in out if d is not None]


def _factors(log: Log, policy: Policy | None) -> tuple[float, float]:
    """The most one clean step can grow the logging run's scale, and the least an overflow can
    leave of it: the framework policy's factors, widened by any step of the log that grew or
    backed off by more (inf and 0 where there is no policy: nothing is assumed)."""
    if policy is None:
        return math.inf, 0.0
    grow = float(getattr(policy, "scale_factor", getattr(policy, "growth_factor", 2.0)))
    back = float(getattr(policy, "backoff_factor", 1.0 / grow))
    for e in log.events:
        if not e.gap and e.scale and e.next_scale:
            ratio = e.next_scale / e.scale
            grow, back = (max(grow, ratio), back) if not e.overflow else (grow, min(back, ratio))
    return grow, back


def scale_bounds(log: Log, scales: Sequence[float | None], grow: float = math.inf,
                 back: float = 0.0) -> list[tuple[float, float]]:
    """Bounds (low, high) on the scale each event ran at (a gap: as it begins): ``scales`` where
    known, else what the known ones around it allow when a clean step multiplies the scale by 1 to
    ``grow`` and an overflow by ``back`` to 1 (floors and caps only narrow that), carried forward and
    backward through the log and across its gaps."""
    return _scale_bounds(log, scales, grow, back)[0]


def _scale_bounds(log: Log, scales: Sequence[float | None], grow: float,
                  back: float) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """:func:`scale_bounds`, and bounds on the scale just before each event in the log's order (for
    the first event of a gap's window: as the window begins)."""
    events, n = log.events, len(log.events)
    bounds = [(0.0, math.inf)] * n
    starts = [(0.0, math.inf)] * n
    among = {i: _counts(e) for j, e in enumerate(events) if e.gap for i in range(j - e.among, j)}
    low, high = 0.0, math.inf  # forward: the scale before event i
    for i, e in enumerate(events):
        if scales[i] is not None:
            low = high = scales[i]
        starts[i] = (low, high)
        if i in among and scales[i] is None:  # a gap's steps may come before it: any of them
            c_max, o_max = among[i]
            bounds[i] = (_power(low, back, o_max), _power(high, grow, c_max))
        else:
            bounds[i] = (low, high)
        low, high = _across(e, low, high, grow, back)
    low, high = 0.0, math.inf  # backward: the scale after event i
    for i in range(n - 1, -1, -1):
        e = events[i]
        if e.next_scale is not None:
            low = high = e.next_scale
        c_max, o_max = _counts(e)
        before = (_power(low, 1 / grow if grow else math.inf, c_max),
                  _power(high, 1 / back if back else math.inf, o_max))
        lo, hi = bounds[i]
        bounds[i] = (max(lo, before[0]), min(hi, before[1]))
        starts[i] = (max(starts[i][0], before[0]), min(starts[i][1], before[1]))
        low, high = bounds[i]
    return bounds, starts


def _power(x: float, f: float, n: float) -> float:
    """``x * f**n`` for a bound: ``n`` steps (inf: unbounded) each multiplying by at most ``f``
    (0 and inf allowed; x itself where n is 0 or x is 0)."""
    if not n or x == 0 or f == 1:
        return x
    if f == 0 or f == math.inf or n == math.inf:
        return math.inf if f > 1 else 0.0
    try:
        return float(x * f**n)
    except OverflowError:  # Python's float power raises past the largest double (1024 growths and more)
        return math.inf


def _counts(e: LogEvent) -> tuple[float, float]:
    """The most clean steps and the most overflows an event stands for (inf: no bound)."""
    if not e.gap:
        return (0, 1) if e.overflow else (1, 0)
    lo, hi = e.span
    steps = math.inf if hi is None else hi
    if e.overflows is None:
        return steps, steps
    return steps - e.overflows, e.overflows


def _across(e: LogEvent, low: float, high: float, grow: float, back: float) -> tuple[float, float]:
    """Bounds on the scale after ``e`` from bounds before it."""
    if e.next_scale is not None:
        return e.next_scale, e.next_scale
    c_max, o_max = _counts(e)
    return _power(low, back, o_max), _power(high, grow, c_max)


def _after(e: LogEvent, low_e: float, low: float) -> float:
    """The least scale the logging run may hold after ``e`` (``low_e``: its own least; ``low``: the
    least before it, for a gap)."""
    if e.next_scale is not None:
        return e.next_scale
    if e.gap:
        return low if e.overflows == 0 else 0.0
    return low_e if not e.overflow else 0.0


def _limits(gap: LogEvent | None) -> tuple[int, int, int | None, int, int | None]:
    """How many of a gap's steps are overflows of unknown place, and the least and most of its
    clean steps and of its steps whose outcome the log does not give (None: no bound); a placed
    step's group (no gap) has none of them."""
    if gap is None:
        return 0, 0, 0, 0, 0
    lo, hi = gap.span or (0, 0)
    if gap.overflows is None:
        return 0, 0, 0, lo, hi
    return gap.overflows, lo - gap.overflows, None if hi is None else hi - gap.overflows, 0, 0


def _outcomes(overflow: bool | None, bound: tuple[float, float], t: float) -> tuple[bool, ...]:
    """Another policy's possible outcomes (True: overflow) at scale ``t`` on a step the log ran at a
    scale within ``bound`` with the outcome ``overflow`` (None: unknown): an overflow at every scale
    up to its highest one, a clean step at every scale down to its lowest."""
    if overflow is None:
        return (True, False)
    if overflow:
        return (True,) if t >= bound[1] else (True, False)
    return (False,) if t <= bound[0] else (True, False)


def _next(policy: Policy, state: Any, overflow: bool) -> Any:
    try:
        return policy.next(state, not overflow)
    except MinimumScaleError:
        return state


def _seen(outcomes: set[bool]) -> str:
    return "unknown" if len(outcomes) != 1 else "overflow" if True in outcomes else "clean"


def _placed(policy: Policy, states: set[Any] | None, e: LogEvent, bound: tuple[float, float],
            max_states: int) -> tuple[set[Any] | None, Decision]:
    if states is None:
        return None, Decision((), "unknown")
    seen: set[bool] = set()
    following: set[Any] = set()
    for state in states:
        for overflow in _outcomes(e.overflow, bound, float(state.scale)):
            seen.add(overflow)
            following.add(_next(policy, state, overflow))
    decision = Decision(tuple(sorted({float(x.scale) for x in states})), _seen(seen))
    return (following if len(following) <= max_states else None), decision


def _window(policy: Policy, states: set[Any] | None, window: Sequence[LogEvent],
            known: Sequence[tuple[float, float]], low: float, back: float,
            max_states: int) -> tuple[set[Any] | None, list[Decision], float]:
    """A gap (the last of ``window``) with the events before it among its steps: every order of its
    steps around them followed, each state with how many of the gap's clean, overflowed and
    unknown steps it has taken and how many of the events."""
    *marked, gap = window
    anonymous, clean_lo, clean_hi, free_lo, free_hi = _limits(gap)
    lows = [low]
    for e, bound in zip(marked, known, strict=False):
        lows.append(_after(e, bound[0], lows[-1]))
    if states is None:
        return None, [Decision((), "unknown")] * len(window), _after(gap, 0.0, lows[-1])
    seen_marked: list[set[bool]] = [set() for _ in marked]
    held_marked: list[set[float]] = [set() for _ in marked]
    seen_gap: set[bool] = set()
    start = {(state, 0, 0, 0, 0) for state in states}
    visited, frontier, final = set(start), start, set()

    def cap(n: int, least: int, most: int | None) -> int:
        return min(n, least) if most is None else n  # past its least, an unbounded count is only "enough"

    while frontier:
        following = set()
        for state, clean, over, free, done in frontier:
            t = float(state.scale)
            if done == len(marked) and over == anonymous and clean >= clean_lo and free >= free_lo:
                final.add(state)
            moves = []
            if clean_hi is None or clean < clean_hi:
                moves += [(o, (cap(clean + 1, clean_lo, clean_hi), over, free, done), None)
                          for o in _outcomes(False, (_power(lows[done], back, over + free), math.inf), t)]
            if over < anonymous:
                moves += [(o, (clean, over + 1, free, done), None) for o in (True, False)]
            if free_hi is None or free < free_hi:
                moves += [(o, (clean, over, cap(free + 1, free_lo, free_hi), done), None) for o in (True, False)]
            if done < len(marked):
                e = marked[done]
                held_marked[done].add(t)
                moves += [(o, (clean, over, free, done + 1), done) for o in _outcomes(e.overflow, known[done], t)]
            for o, counts, which in moves:
                (seen_gap if which is None else seen_marked[which]).add(o)
                item = (_next(policy, state, o), *counts)
                if item not in visited:
                    visited.add(item)
                    following.add(item)
        if len(visited) > max_states * 16:
            return None, [Decision((), "unknown")] * len(window), _after(gap, 0.0, lows[-1])
        frontier = following
    decisions = [Decision(tuple(sorted(held_marked[n])), _seen(seen_marked[n])) for n in range(len(marked))]
    decisions.append(Decision(tuple(sorted({float(x.scale) for x in states})), _seen(seen_gap)))
    return (final if 0 < len(final) <= max_states else None), decisions, _after(gap, 0.0, lows[-1])


# -- the exact replay: the framework's own run and the other policy's, step by step together ---------

#: The most places (framework candidate and state, place in a window) the exact replay visits in
#: following the framework's own runs, and the most (with the other policy's state beside them) in
#: replaying another policy, before it leaves a log to the bounds above (a few seconds each).
MAX_RUNS = 250_000
MAX_JOINT = 2_000_000


def _family(log: Log) -> list[tuple[Policy, int]] | None:
    """Every run of the log's framework policy the log may come from, with the framework's
    defaults for what a log never shows (DeepSpeed: ``scale_factor`` 2 and no consecutive
    hysteresis): each growth window from 1 to one past the log's steps (no growth at all), each
    hysteresis from 1 to 4 (or the most the log prints) where the policy has one, and each
    initial scale that some number of growths and backoffs takes to the first scale the log
    prints. Each candidate is a policy with the least window and the greatest window it stands
    for (a window's growth is the only difference, and :func:`_graph` splits a window off when it
    grows). None where the log bounds too little for that (no scale printed, or a gap of unknown
    length before the end)."""
    if log.framework not in _POLICIES or not log.events:
        return None
    cls, _, _, hyst_name, _ = _POLICIES[log.framework]
    events = log.events
    spans = [e.span if e.gap else (1, 1) for e in events]
    if any(hi is None for _, hi in spans[:-1]):
        return None
    pin = next((i for i, e in enumerate(events) if e.scale is not None or e.next_scale is not None), None)
    if pin is None:
        return None
    pin = next((j for j, e in enumerate(events) if j >= pin and j - e.among <= pin and e.gap), pin)  # its window
    steps = _bounded_steps(log)
    before = sum(spans[i][1] for i in range(pin + 1))
    overflows_before = int(min(sum(_counts(e)[1] for e in events[:pin + 1]), before))
    logged = next(v for e in events for v in (e.scale, e.next_scale) if v is not None)
    if log.framework == "mindspore":  # printed as the shortest decimal of its binary32 value
        logged = float(np.float32(logged))
    probe = cls(**_arguments(log.framework, 1.0, 1, 1 if hyst_name else None))
    grow = float(getattr(probe, "scale_factor", getattr(probe, "growth_factor", 2.0)))
    back = float(getattr(probe, "backoff_factor", 1.0 / grow))
    printed = max((e.hysteresis for e in events if e.hysteresis), default=1)
    hystereses = list(range(1, max(4, printed) + 1)) if hyst_name else [None]
    inits = sorted({logged / (grow**a * back**c) for a in range(before + 2) for c in range(overflows_before + 1)})
    return [(cls(**_arguments(log.framework, init, 1, h)), steps + 1) for h in hystereses for init in inits]


def _bounded_steps(log: Log) -> int:
    """The most steps the log's events stand for, a last gap of unknown length left out."""
    return sum(1 if not e.gap else e.span[1] or 0 for e in log.events)


def _followed(log: Log) -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
    """The groups the exact replay follows (:func:`_groups`), and the last one where it is a gap
    of unknown length (replayed on the bounds), else None."""
    groups = _groups(log)
    tail = groups.pop() if log.events and log.events[-1].gap and log.events[-1].span[1] is None else None
    return groups, tail


def _groups(log: Log) -> list[tuple[int, int]]:
    """The log's events as the replay takes them: a placed step alone, or a gap with the events
    among its steps (first and last index)."""
    window_of = {j - e.among: j for j, e in enumerate(log.events) if e.gap and e.among}
    out, i = [], 0
    while i < len(log.events):
        j = window_of.get(i, i)
        out.append((i, j))
        i = j + 1
    return out


def _fits_step(framework: str, e: LogEvent, before: Any, after: Any) -> bool:
    """Whether a framework state before and after an event prints as the event says."""
    return ((e.scale is None or _matches(framework, float(before.scale), e.scale))
            and (e.hysteresis is None or getattr(before, "cur_hysteresis", e.hysteresis) == e.hysteresis)
            and (e.next_scale is None or _matches(framework, float(after.scale), e.next_scale)))


def _relative(state: Any) -> Any:
    """A framework state with its step counter at 0 and the steps it remembers (``last_*``) counted
    from it: the policies use only their differences, so runs that differ only in where a gap's
    steps fell meet in one state."""
    kind = type(state)
    if kind not in _COUNTERS:
        fields = getattr(state, "_fields", ())
        now = next((i for i, f in enumerate(fields) if f in ("cur_iter", "iter")), None)
        _COUNTERS[kind] = None if now is None else (now, [i for i, f in enumerate(fields) if f.startswith("last_")])
    spec = _COUNTERS[kind]
    if spec is None or not state[spec[0]]:
        return state
    values, shift = list(state), state[spec[0]]
    values[spec[0]] = 0
    for i in spec[1]:
        values[i] -= shift
    return kind._make(values)


_COUNTERS: dict[type, tuple[int, list[int]] | None] = {}  # per state type: its step counter and the steps it keeps


class _Candidates:
    """The framework's candidate policies, each by a number (nodes hash fast), and each one's
    policy with another window, made once."""

    def __init__(self, window: str) -> None:
        self.window, self.policies, self._ids, self._widened = window, [], {}, {}
        self._steps: dict[Any, list[tuple[int, int, Any]]] = {}

    def id(self, policy: Policy) -> int:
        if policy not in self._ids:
            self._ids[policy] = len(self.policies)
            self.policies.append(policy)
        return self._ids[policy]

    def widened(self, pid: int, window: int) -> int:
        if (pid, window) not in self._widened:
            self._widened[pid, window] = self.id(replace(self.policies[pid], **{self.window: window}))
        return self._widened[pid, window]

    def step(self, pid: int, most: int, state: Any, overflow: bool) -> list[tuple[int, int, Any]]:
        """The candidate's step (its policy at its least window, its greatest window): one run, or
        two where the least window grows here and the others do not (it is split off)."""
        key = (pid, most, state, overflow)
        if key not in self._steps:
            self._steps[key] = self._step(pid, most, state, overflow)
        return self._steps[key]

    def _step(self, pid: int, most: int, state: Any, overflow: bool) -> list[tuple[int, int, Any]]:
        policy = self.policies[pid]
        after = _relative(_next(policy, state, overflow))
        least = getattr(policy, self.window)
        if least < most:
            wider = _relative(_next(self.policies[self.widened(pid, most)], state, overflow))
            if wider != after:
                return [(pid, least, after), (self.widened(pid, least + 1), most, wider)]
        return [(pid, most, after)]


def _graph(log: Log, group: Sequence[LogEvent], starts: set[Any], budget: list[int],
           cands: _Candidates) -> tuple[dict[Any, list[tuple[int, bool, Any]]], dict[Any, Any]] | None:
    """Every way the framework's run can go through one group from ``starts`` (nodes: a candidate
    policy at its least window (by number), its greatest window, its state): each order of a gap's steps
    around the events among them, each outcome of a step the log does not give, the state checked
    against every scale the log prints. The edges (which event, ``len(marked)`` for a gap step;
    the step's outcome; the next place: node and counts) and the places that end the group, with
    the node they leave. None past the budget."""
    *marked, gap = group
    if not gap.gap:
        marked, gap = [*marked, gap], None
    anonymous, clean_lo, clean_hi, free_lo, free_hi = _limits(gap)
    edges: dict[Any, list[tuple[int, bool, Any]]] = {}
    ends: dict[Any, Any] = {}
    frontier = [(node, 0, 0, 0, 0) for node in starts]
    seen = set(frontier)
    while frontier:
        following = []
        for place in frontier:
            (pid, most, fw), clean, over, free, done = place
            if (done == len(marked) and over == anonymous and clean >= clean_lo and free >= free_lo
                    and (gap is None or gap.next_scale is None or _matches(log.framework, float(fw.scale),
                                                                          gap.next_scale))):
                ends[place] = place[0]
            moves: list[tuple[int, bool, tuple[int, int, int, int], LogEvent | None]] = []
            if clean < clean_hi:
                moves.append((len(marked), False, (clean + 1, over, free, done), None))
            if over < anonymous:
                moves.append((len(marked), True, (clean, over + 1, free, done), None))
            if free < free_hi:
                moves += [(len(marked), overflow, (clean, over, free + 1, done), None) for overflow in (True, False)]
            if done < len(marked):
                moves.append((done, marked[done].overflow, (clean, over, free, done + 1), marked[done]))
            out = [(which, overflow, (run, *counts)) for which, overflow, counts, e in moves
                   for run in cands.step(pid, most, fw, overflow)
                   if e is None or _fits_step(log.framework, e, fw, run[2])]
            edges[place] = out
            for _, _, nxt in out:
                if nxt not in seen:
                    seen.add(nxt)
                    following.append(nxt)
        budget[0] -= len(following)
        if budget[0] < 0:
            return None
        frontier = following
    return edges, ends


@dataclass
class _Run:
    """The framework's run through one group, its places numbered: the moves out of place p are
    ``offsets[p]:offsets[p + 1]`` of ``which`` (the event, ``len(marked)`` for a gap step),
    ``overflow`` and ``dst`` (the next place); ``start``: the place each node starts at; ``end``:
    the node each place ends the group with (-1: none); ``scale``: each place's scale."""

    offsets: np.ndarray
    which: np.ndarray
    overflow: np.ndarray
    dst: np.ndarray
    start: dict[int, int]
    end: np.ndarray
    scale: np.ndarray

    @classmethod
    def of(cls, moves: list[list[tuple[int, bool, int]]], start: dict[int, int], ends: dict[int, int],
           scale: list[float]) -> _Run:
        flat = [m for ms in moves for m in ms]
        end = np.full(len(moves), -1, dtype=np.int64)
        end[list(ends)] = list(ends.values())
        return cls(np.cumsum([0] + [len(ms) for ms in moves]), np.array([m[0] for m in flat], dtype=np.int64),
                   np.array([m[1] for m in flat], dtype=bool), np.array([m[2] for m in flat], dtype=np.int64),
                   start, end, np.array(scale, dtype=np.float64))


@dataclass
class _Runs:
    """What the exact replay knows of a log: the framework's runs through each group (None where
    it cannot follow them, ``why`` says why) and the arguments of those that reproduce the log."""

    runs: list[_Run] | None
    why: str = ""
    fit: dict[str, str] = dataclasses.field(default_factory=dict)


_LAST_RUNS: list[Any] = [None, None]  # the last log's runs: every other policy replays on the same


def _runs(log: Log) -> _Runs:
    """The framework's own run through each group (:func:`_groups`, without a last gap of unknown
    length), kept to the places that lie on a run reproducing the whole log (forward through the
    log, then back)."""
    if _LAST_RUNS[0] is not log:
        _LAST_RUNS[:] = [log, _reproducing(log)]
    return _LAST_RUNS[1]


def _reproducing(log: Log) -> _Runs:
    family = _family(log)
    if family is None:
        return _Runs(None, "the log does not bound its framework's run enough (no scale printed, no known policy, "
                     "or steps of unknown number before its end)")
    groups, _ = _followed(log)
    cands = _Candidates(_POLICIES[log.framework][2])
    layer = {(cands.id(p), most, p.initial()) for p, most in family}
    graphs, budget = [], [MAX_RUNS]
    for i, j in groups:
        made = _graph(log, log.events[i:j + 1], layer, budget, cands)
        if made is None:
            return _Runs(None, f"more than {MAX_RUNS} places to follow the framework's runs through the log "
                         f"(lossscale.replay.MAX_RUNS)")
        if not made[1]:
            return _Runs(None, f"no run of {_POLICIES[log.framework][0].__name__} reproduces the log up to line "
                         f"{log.events[j].line}")
        graphs.append(made)
        layer = set(made[1].values())
    kept, alive = [], layer
    nodes: dict[Any, int] = {}
    for edges, ends in reversed(graphs):
        reverse: dict[Any, list[Any]] = {}
        for place, moves in edges.items():
            for _, _, nxt in moves:
                reverse.setdefault(nxt, []).append(place)
        live = {place for place, node in ends.items() if node in alive}
        todo = list(live)
        while todo:
            for before in reverse.get(todo.pop(), ()):
                if before not in live:
                    live.add(before)
                    todo.append(before)
        number = {place: n for n, place in enumerate(live)}
        kept.append(_Run.of([[(w, o, number[nxt]) for w, o, nxt in edges[place] if nxt in live] for place in live],
                         {nodes.setdefault(place[0], len(nodes)): number[place] for place in live
                          if place[1:] == (0, 0, 0, 0)},
                         {number[place]: nodes.setdefault(node, len(nodes)) for place, node in ends.items()
                          if place in live},
                         [float(place[0][2].scale) for place in live]))
        alive = {place[0] for place in live if place[1:] == (0, 0, 0, 0)}
    return _Runs(kept[::-1], fit=_fit(log, cands, layer))


def _fit(log: Log, cands: _Candidates, ends: set[Any]) -> dict[str, str]:
    """The arguments of the runs that reproduce the log (each run's candidate, as it ends)."""
    _, init_name, window_name, hyst_name, _ = _POLICIES[log.framework]
    windows: set[int] = set()
    for pid, most, _ in ends:
        windows.update(range(getattr(cands.policies[pid], window_name), most + 1))
    spans, run = [], []
    for w in sorted(windows):
        if run and w != run[-1] + 1:
            spans.append(run)
            run = []
        run.append(w)
    spans.append(run)
    steps = _bounded_steps(log)
    fit = {window_name: ", ".join(f"{r[0]} or more" if r[-1] > steps else f"{r[0]}" if len(r) == 1 else
                                  f"{r[0]} to {r[-1]}" for r in spans if r)}
    if hyst_name:
        fit[hyst_name] = ", ".join(str(h) for h in sorted({getattr(cands.policies[p], hyst_name) for p, _, _ in ends}))
    fit[init_name] = ", ".join(_show(x) for x in sorted({float(getattr(cands.policies[p], init_name))
                                                           for p, _, _ in ends}))
    return fit


def exact_fit(log: Log) -> tuple[dict[str, str] | None, str]:
    """Whether the counterfactual replay of ``log`` is exact: the arguments of the framework runs
    that reproduce the log (each a list or ranges of values), or None and why it replays on bounds."""
    known = _runs(log)
    return (known.fit if known.runs is not None else None), known.why


def _exact(log: Log, policy: Policy, max_states: int) -> list[Decision] | None:
    """The counterfactual replay with the framework's own run followed exactly beside the other
    policy's: every run of :func:`_family` that reproduces the whole log (:func:`_runs`) and every
    way the log's steps can lie on it, so a step is certain exactly when every such run agrees on
    it (the other policy can follow any of them: a step always has an outcome). A gap of unknown
    length at the end is replayed on the bounds from the states that reach it. None where the log
    is beyond this (see :func:`_family`) or past ``MAX_JOINT`` places."""
    runs = _runs(log).runs
    if runs is None:
        return None
    events, (groups, tail) = log.events, _followed(log)
    budget = MAX_JOINT
    out: list[Decision] = [Decision((), "unknown")] * len(events)
    other = _Other(policy)
    layer = np.array([(node, 0) for node in runs[0].start], dtype=np.int64).reshape(-1, 2) if runs else None
    for (i, j), run in zip(groups, runs, strict=True):
        size = j - i + 1
        seen = np.zeros((size + 1, 2), dtype=bool)  # [which, outcome]
        held: list[set[int]] = [set() for _ in range(size + 1)]
        gap_at = size - 1 if events[j].gap else size
        place = np.array([run.start[n] for n in layer[:, 0]], dtype=np.int64)
        ot = layer[:, 1]
        held[gap_at].update(ot.tolist())
        ending = []
        while len(place):
            budget -= len(place)
            if budget < 0:
                return None
            here = run.end[place] >= 0
            ending.append(np.stack([run.end[place[here]], ot[here]], axis=1))
            count = run.offsets[place + 1] - run.offsets[place]
            row = np.repeat(np.arange(len(place)), count)
            edge = run.offsets[place][row] + np.arange(len(row)) - np.repeat(np.cumsum(count) - count, count)
            src_ot, which, fw_over = ot[row], run.which[edge], run.overflow[edge]
            s, t = run.scale[place][row], other.scale[src_ot]
            both = np.where(fw_over, t < s, t > s)  # the other's outcome is the framework's unless bounds allow both
            which = np.concatenate([which, which[both]])
            outcome = np.concatenate([fw_over, ~fw_over[both]])
            src_ot = np.concatenate([src_ot, src_ot[both]])
            dst = np.concatenate([run.dst[edge], run.dst[edge][both]])
            seen[which, outcome.astype(np.int64)] = True
            for w, o in zip(*_unique_pairs(which, src_ot), strict=True):
                if w != gap_at:  # a gap's scales are those as its window begins
                    held[w].add(int(o))
            place, ot = _unique_pairs(dst, other.following(src_ot, outcome))
        layer = np.stack(_unique_pairs(*np.concatenate(ending).T), axis=1)
        out[i:j + 1] = [Decision(tuple(sorted({other.states_scale(o) for o in held[n]})),
                                 _seen({o for o in (False, True) if seen[n, int(o)]})) for n in range(size)]
    if tail is not None:
        i, j = tail
        last = {other.states[o] for o in layer[:, 1]} if groups else {policy.initial()}
        low = float(runs[-1].scale[runs[-1].end >= 0].min()) if groups else 0.0
        known = [(e.scale, e.scale) if e.scale is not None else (0.0, math.inf) for e in events[i:j + 1]]
        out[i:j + 1] = _window(policy, last if len(last) <= max_states else None, events[i:j + 1], known, low,
                               0.0, max_states)[1]
    return out


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct pairs (a[k], b[k]) of two arrays of small non-negative integers."""
    key = np.unique((a.astype(np.int64) << 32) | b.astype(np.int64))
    return key >> 32, key & 0xFFFFFFFF


class _Other:
    """The other policy's states, numbered as they are met, and its step between them by number."""

    def __init__(self, policy: Policy) -> None:
        self.policy, self.states, self._ids = policy, [policy.initial()], {policy.initial(): 0}
        self._scales = [float(policy.initial().scale)]
        self._next = np.full((1, 2), -1, dtype=np.int64)

    @property
    def scale(self) -> np.ndarray:
        return np.asarray(self._scales)

    def states_scale(self, n: int) -> float:
        return self._scales[n]

    def following(self, ot: np.ndarray, overflow: np.ndarray) -> np.ndarray:
        o = overflow.astype(np.int64)
        lost = self._next[ot, o] < 0
        for n, flag in zip(*_unique_pairs(ot[lost], o[lost]), strict=True):
            state = _next(self.policy, self.states[n], bool(flag))
            if state not in self._ids:
                self._ids[state] = len(self.states)
                self.states.append(state)
                self._scales.append(float(state.scale))
            self._next[n, flag] = self._ids[state]
            if len(self.states) > len(self._next):
                self._next = np.concatenate([self._next, np.full((len(self._next), 2), -1, dtype=np.int64)])
        return self._next[ot, o]

