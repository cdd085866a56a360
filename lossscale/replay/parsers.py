"""Each framework's lines parsed into a log's events, from the logging code that prints them (the
readers of :data:`lossscale.replay.formats.LOG_FORMATS`; each takes the lines and its format's
words, which make a line it did not read count as unparsed)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace

from .log import (
    _APEX,
    _APEX_FP16,
    _BAR,
    _COLOSSAL,
    _DS_BARE,
    _DS_DETECTED,
    _DS_DYNAMIC,
    _DS_FROM,
    _DS_HYST,
    _DS_ITER,
    _DS_QUIET,
    _DS_REDUCE,
    _DS_STATIC,
    _DS_STEP,
    _FS_JSON,
    _FS_LOGGING,
    _FS_OVERFLOW,
    _FS_SCALE,
    _FS_UPDATES,
    _MEGATRON,
    _MINDFORMERS,
    _MINDSPORE,
    _MINDYOLO,
    _NUM,
    Log,
    LogEvent,
    _fairseq_shows,
    _float,
)
from .paste import _Paste


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
        self.elided: set[int] = set()  # where a paste left lines out (``...``): how many overflow lines came before

    def overflow(self, event: LogEvent) -> None:
        self.pending.append(event)

    def counter(self, n: int, line: int, kind: str, next_scale: float | None = None,
                skipped: int | None = None, held: bool = False) -> None:
        """Step counter ``n`` (``kind``: "all" counts every step, "clean" the applied updates);
        ``next_scale``: a scale the counter's line prints, the scale after step n where the
        interval is one step or ``held`` (a line printing the scale it holds, not a mean over its
        interval)."""
        if n == 0 and self.last is None:  # a bar's first frame, before any step
            self.last = 0
            return
        pending, self.pending, self.kind = self.pending, [], kind
        # the counter counts the steps a paste left out, not their outcomes (a skipped count does)
        elided, self.elided = bool(self.elided), set()
        last = self.last if self.last is not None else (0 if n == 1 else None)
        before = self.skipped_before
        counted = skipped - before if skipped is not None and before is not None else None
        unknown = elided and counted is None and kind != "clean"
        if counted is not None and counted != len(pending) and self.last is not None:
            self.notes.append(f"line {line}: skipped={skipped} counts {counted} overflows since the last report; the "
                              f"log shows {len(pending)}")
        if last is not None and n == last and not pending:
            return  # the same counter again (a bar redrawn)
        if last is not None and n == last + 1 and (kind == "clean" or len(pending) <= 1) and \
                counted in (None, len(pending)) and not (unknown and not pending):
            if kind == "all" and pending:
                self.events.append(replace(pending[0], step=n))
            else:
                self.events.extend(pending)
                self.events.append(LogEvent(n, False, None, next_scale, line))
        elif last is None:  # the first counter, after step 1 (printing every k steps, or a pasted tail)
            self._window(pending, n, None, line, kind, next_scale, skipped, self.skipped_before, unknown, held)
        else:  # the steps since the last counter: the overflow lines among clean steps the log does not print
            self._window(pending, n, n - last, line, kind, next_scale, skipped, self.skipped_before, unknown, held)
        self.skipped_before = skipped if skipped is not None else self.skipped_before
        self.interval = max(self.interval, n - (self.last or 0))  # the first counter's window: from step 1
        self.last = n

    def _window(self, pending: list[LogEvent], n: int, steps: int | None, line: int, kind: str,
                next_scale: float | None, skipped: int | None, before: int | None, unknown: bool = False,
                held: bool = False) -> None:
        """The steps up to counter ``n`` (``steps`` of them; None: from an unknown start): the
        pending overflow lines in their order, with the clean steps (and, where the counter's
        skipped count is higher, unprinted overflows) around them as one gap; ``unknown``: a paste
        left lines out among them, so the gap's outcomes are unknown."""
        self.complete = False
        k = len(pending)
        counted = skipped - before if skipped is not None and before is not None else None
        if kind == "clean":  # fairseq: the counter counts applied updates; its own step is the last
            clean = steps - 1 if steps is not None else None
            gap = LogEvent(n - 1, False, None, None, line, span=(clean or 0, clean), among=k)
            self.events.extend(pending)
            if clean != 0:
                self.events.append(gap)
            # fairseq 0.9's loss_scale is the mean over the logging interval: the scale only for an interval of
            # one; from 0.10 (fairseq/trainer.py, train_step: log_scalar("loss_scale", ..., weight=0)) the
            # scale it holds
            self.events.append(LogEvent(n, False, None, next_scale if clean == 0 or held else None, line))
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
        if unknown and high > k:
            self.events.extend(pending)
            self.events.append(LogEvent(n, False, None, next_scale, line, span=(low - k, high - k), overflows=None,
                                        among=k))
            return
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
            for k, e in enumerate(pending):
                # the steps between two lines are clean (every overflow prints its line), unless the paste
                # left lines out there: then the log says nothing of their outcomes
                outcomes = None if k in self.elided else 0
                if previous is not None and previous.step is not None and e.step is not None:
                    between = e.step - previous.step - 1  # numbered overflow lines: the steps between
                    if between > 0:
                        self.events.append(LogEvent(e.step - 1, False, None, None, e.line, span=(between, between),
                                                    overflows=outcomes))
                else:
                    self.events.append(LogEvent(None, False, None, None, e.line, span=(0, None), overflows=outcomes))
                self.events.append(e)
                previous = e
        elif pending:  # overflow lines after the last counter: within one counter interval of it
            k, every = len(pending), self.kind == "all"
            room = self.interval - k if every else self.interval - 1
            if self.elided:  # a paste left lines out after the counter: how many steps, and their outcomes, unknown
                self.events.extend(pending)
                self.events.append(LogEvent(None, False, None, None, pending[-1].line, span=(0, None),
                                            overflows=None, among=k))
                self.complete = False
            elif room < 0:
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


#: The epoch a progress bar's description names (``Epoch: 29. Loss: 3.3:  76%|...``, ``epoch 3``): a
#: training loop that draws one bar per epoch restarts it at 0, its steps counted on from the epoch.
_EPOCH = re.compile(r"\b[Ee]poch\b[\s:=#\[]*(\d+)")


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


class _Copies:
    """Several ranks printing one overflow: each line ``handle`` reads into the builder, with an
    overflow line that copies the one before it (prefixes aside, no counter between) taken back."""

    def __init__(self, b: _Builder, handle, printing: int) -> None:
        self.b, self.handle, self.printing = b, handle, printing
        self.copies, self.group = 0, 0  # copies taken back; the last overflow line's lines in a row
        self.named = 0  # copies whose line names its rank
        self.last_message: tuple[str, str | None] | None = None  # the last overflow line's message and rank

    def counted(self) -> None:
        """A step counter came: the next overflow line copies none before it."""
        self.last_message = None

    def read(self, i: int, text: str) -> bool:
        """Whether ``handle`` read the line (a copy of the overflow before it is read, then taken back)."""
        b = self.b
        before = len(b.pending)
        if not self.handle(b, i, text):
            return False
        if len(b.pending) != before + 1:  # a counter, or a line that is no overflow: copies end here
            self.last_message = None
            return True
        message, rank, e = _PREFIX.sub("", text).strip(), _rank(text), b.pending[-1]
        # a real overflow after another changes the scale it prints (or its hysteresis), so an identical
        # line is a copy where the first one changed it, or where the two name different ranks
        # (a line that keeps the scale, its hysteresis unknown, may be a reduction at the floor: it may repeat)
        changed = e.next_scale is not None and (e.scale is None or e.next_scale != e.scale or
                                                e.hysteresis not in (None, 1))
        last = self.last_message
        same = last is not None and message == last[0]
        if same and self.printing > 1 and rank is None:  # R ranks print each overflow: R identical lines, one
            copy = self.group % self.printing != 0
        else:
            copy = same and (changed or (rank is not None and last[1] is not None and rank != last[1]))
        if copy:
            b.pending.pop()
            self.copies += 1
            self.named += rank is not None
            self.group += 1
        else:
            if same:  # a copy, or the same line again
                b.maybe_copies.add(i)
            self.last_message, self.group = (message, rank), 1
        return True


def _scan(lines: Sequence[str], framework: str, words: re.Pattern[str], handle) -> Log:
    """Run ``handle(builder, line_number, text)`` over the lines (it returns True where it read the
    line); lines it did not read that carry the format's words are unparsed. tqdm bars count steps
    in every format: the training bar only (the one with the most steps; a rollout or evaluation
    bar is not a step counter), read in its place on the line (a message pasted after a bar on the
    same line follows it); a bar that goes backwards is noted, but for one drawn per epoch, whose
    description names the epoch: its steps count on from the first epoch's. A line identical to the overflow
    line just before it, prefixes aside and no counter between, is another rank printing the same
    step's overflow: one overflow, the copies noted. Where the log shows R ranks printing each
    overflow (the same line under R rank prefixes), identical lines naming no rank are read in
    groups of R, one overflow each. A line that carries the format's words but reads as none of its
    lines is tried as a terminal wrapped it (:func:`_unwrapped`) before it is counted unparsed."""
    b = _Builder(framework)
    totals = [int(m[2]) for text in lines for m in _BAR.finditer(text)]
    training = max(totals) if totals else None
    other_bars: set[int] = set()
    first: int | None = None  # the epoch of the first bar that names one
    ranks = _Copies(b, handle, _ranks_printing(lines, words))
    read = ranks.read

    paste = _Paste(b, read, lambda text: handle(_Builder(framework), 0, text), lines, words)
    for i, text in enumerate(lines, start=1):
        if i <= paste.skip:
            continue
        parts = text.split("\r")  # a bar redrawn in place leaves its frames on one line
        for part in parts:
            bar = _BAR.search(part)
            if not (bar and "%" in part[:bar.start()]):
                if not read(i, part):
                    paste.unread(i, part, len(parts) == 1)
                continue
            head, close = part[:bar.start()], part.find("]", bar.end())
            tail = part[close + 1:] if close >= 0 else ""
            read(i, head)
            n, total = int(bar[1]), int(bar[2])
            if total == training and (epoch := _EPOCH.search(head)):  # a bar per epoch: counted on across them
                first = int(epoch[1]) if first is None else first
                n += (int(epoch[1]) - first) * total
            if total != training:
                other_bars.add(total)
            elif b.last is not None and n < b.last:
                b.notes.append(f"line {i}: the progress bar goes back from {b.last} to {n} (a restart?); read on "
                               f"from {b.last}")
            else:
                b.counter(n, i, "all")
                ranks.counted()
            if tail.strip() and not read(i, tail) and words.search(tail):
                b.unparsed.append((i, tail))
    if other_bars:
        b.notes.append(f"progress bars of {', '.join(map(str, sorted(other_bars)))} steps are not the training "
                       f"bar ({training} steps) and count no step")
    b.notes.extend(paste.notes())
    if ranks.copies:
        how = ("their rank prefixes differ" if ranks.named == ranks.copies else
               "no step counter came between; no rank prefix tells, and a run whose scale grew back between "
               "two of them would print the same")
        b.notes.append(f"{ranks.copies} overflow lines repeat the line before them, read as copies from several "
                       f"ranks printing ({how}): each run of them is one overflow")
    return b.build()


def deepspeed(lines: Sequence[str], words: re.Pattern[str]) -> Log:
    iteration: list[int | None] = [None]  # FP16_Optimizer's "Grad overflow on iteration N", awaiting its scales

    def handle(b: _Builder, i: int, text: str) -> bool:
        if m := _DS_ITER.search(text):
            iteration[0] = int(m[1])
        elif m := _DS_FROM.search(text):
            grow = m[1] == "Increasing"
            step = None if grow or iteration[0] is None else iteration[0] + 1
            b.overflow(LogEvent(step, not grow, _float(m[2]), _float(m[3]), i, None if grow else 1))
            iteration[0] = None
        elif m := _DS_STATIC.search(text) or _DS_DYNAMIC.search(text):
            # the overflow's step skipped: a static scale kept, a dynamic one's next the log does not print
            step = None if iteration[0] is None else iteration[0] + 1
            static = m.re is _DS_STATIC
            b.overflow(LogEvent(step, True, _float(m[1]), _float(m[1]) if static else None, i, None if static else 1))
            iteration[0] = None
        elif _DS_QUIET.search(text):
            pass
        elif m := _DS_REDUCE.search(text) or _DS_DETECTED.search(text):
            # a reduction says the hysteresis was 1; ZeRO's line prints the same scale where the hysteresis
            # took the overflow instead (or the scale is at its floor): the hysteresis unknown
            scale, after = _float(m[1]), _float(m[2])
            b.overflow(LogEvent(None, True, scale, after, i, 1 if after < scale else None))
        elif m := _DS_HYST.search(text):
            b.overflow(LogEvent(None, True, _float(m[1]), _float(m[1]), i, int(m[2])))
        elif _DS_BARE.search(text):
            b.overflow(LogEvent(None, True, None, None, i))
        elif m := _DS_STEP.search(text):
            b.counter(int(m[1]), i, "all", skipped=int(m[2]))
        else:
            return False
        return True
    return _scan(lines, "deepspeed", words, handle)


#: apex amp's start-up banner (apex/amp/frontend.py, ``initialize``: ``"{:22} : {}".format(k, v)`` for each
#: property): ``loss_scale             : dynamic``, or the static scale.
_APEX_BANNER = re.compile(r"^\s*(?:Defaults for this optimization level are:\s*|Processing user overrides.*:\s*)?"
                          r"loss_scale\s+:\s+(dynamic|" + _NUM[1:-1] + r")\s*$")


def apex(lines: Sequence[str], words: re.Pattern[str]) -> Log:
    ids: set[str] = set()

    def handle(b: _Builder, i: int, text: str) -> bool:
        if m := _APEX_BANNER.match(text):
            if m[1] != "dynamic" and not any("static loss scale" in n for n in b.notes):
                b.notes.append(f"line {i}: apex amp's banner gives a static loss scale of {m[1]}")
            return True
        if m := _APEX.search(text):
            ids.add(m[1] or "0")
            b.overflow(LogEvent(None, True, None, _float(m[2]), i, scaler=m[1] or "0"))
            return True
        if m := _APEX_FP16.search(text):
            b.overflow(LogEvent(None, True, _float(m[1]), None if m[2] is None else _float(m[2]), i))
            return True
        return False
    log = _scan(lines, "apex", words, handle)
    if len(ids) > 1:
        return replace(log, notes=(*log.notes, f"several loss scalers ({', '.join(sorted(ids))}), one per loss: each "
                                   f"one's scales are checked as its own sequence (a step prints the first overflowing "
                                   f"loss's line only), the steps read as one sequence of lines"), complete=False)
    return replace(log, events=tuple(replace(e, scaler=None) for e in log.events))


def fairseq(lines: Sequence[str], words: re.Pattern[str]) -> Log:
    def handle(b: _Builder, i: int, text: str) -> bool:
        if m := _FS_OVERFLOW.search(text):
            b.overflow(LogEvent(None, True, None, _float(m[1]), i))
        elif (m := _FS_UPDATES.search(text)) and (scale := _FS_SCALE.search(text)):
            value = _float(scale[1])
            b.counter(int(m[1]), i, "clean", next_scale=value,
                      held=bool(_FS_LOGGING.search(text)) and _prints_a_power_of_two(value))
        elif (m := _FS_JSON.search(text)) and _fairseq_json(b, i, m[1]):
            pass
        else:
            return False
        return True
    return _scan(lines, "fairseq", words, handle)


def _prints_a_power_of_two(value: float) -> bool:
    """Whether a fairseq 0.10 progress line (4 places) prints a power of two as ``value``."""
    if not value > 0 or not math.isfinite(value):
        return False
    k = round(math.log2(value))
    return any(_fairseq_shows(2.0**j, value, (4,)) for j in (k - 1, k, k + 1))


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
              unparsed: list[tuple[int, str]], notes: list[str], interval: dict[int, int | None] | None = None) -> Log:
    """A log with one line per numbered step: complete where the steps run on by one; the steps
    between two numbered lines a gap whose outcomes the log does not give; before each unnumbered
    overflow line (MindYOLO's, Colossal-AI's) a gap of clean steps of unknown length. ``interval``:
    for a line that sums its logging interval (Megatron's, keyed by line), how many of the
    interval's steps were skipped: the interval is a gap with that many overflows (None: a count
    the line does not give, the interval's outcomes unknown)."""
    events, complete, last = [], True, None
    for line, step, overflow, scale, next_scale in rows:
        if step is None:
            complete = False
            events += [LogEvent(None, False, None, None, line, span=(0, None)),
                       LogEvent(None, overflow, scale, next_scale, line)]
            continue
        in_interval = interval is not None and line in interval
        skipped = interval[line] if in_interval else None
        if last is not None and step <= last:
            complete = False
            notes.append(f"line {line}: step {step} follows step {last}; the steps between are unknown")
            events.append(LogEvent(step - 1, False, None, None, line, span=(0, None), overflows=None))
        elif in_interval and (step - (last or 0) > 1 or skipped is None):
            # an interval: its skipped steps anywhere in it (a count the line does not give: its
            # outcomes unknown, even for one step)
            complete = False
            steps = step - last if last is not None else None
            span = (steps, steps) if steps is not None else (max(skipped or 0, 1), step)
            events.append(LogEvent(step, bool(skipped), None, next_scale, line, span=span, overflows=skipped))
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


def megatron(lines: Sequence[str], words: re.Pattern[str]) -> Log:
    rows, unparsed, notes, skipped = [], [], [], {}
    for i, text in enumerate(lines, start=1):
        if m := _MEGATRON.search(text):
            # skipped over the logging interval, which the iterations give; a line cut before its
            # count (a paste, a wrapped terminal) leaves the interval's outcomes unknown
            skipped[i] = int(m[3]) if m[3] is not None else None
            if skipped[i] is None:
                notes.append(f"line {i}: no number of skipped iterations (a cut line?): the interval's outcomes "
                             "are unknown")
            rows.append((i, int(m[1]), bool(skipped[i]), None, _float(m[2])))
        elif words.search(text):
            unparsed.append((i, text))
    return _per_step("megatron", rows, unparsed, notes, skipped)


def mindspore(lines: Sequence[str], words: re.Pattern[str]) -> Log:
    rows, unparsed = [], []
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


def colossalai(lines: Sequence[str], words: re.Pattern[str]) -> Log:
    rows, unparsed = [], []
    for i, text in enumerate(lines, start=1):
        if _COLOSSAL.search(text):
            rows.append((i, None, True, None, None))
        elif words.search(text):
            unparsed.append((i, text))
    return _per_step("colossalai", rows, unparsed, [])


def read_csv(lines: Sequence[str], words: re.Pattern[str] | None = None) -> Log:
    """``step,scale,overflow`` rows after the header (the scale each step ran at)."""
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
