"""A log checked against a framework's policy: where the logged scales depart from what the policy
would have done."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from typing import Any

from ..policy.core import Policy, describe
from ..policy.frameworks import MinimumScaleError
from .formats import LOG_FORMATS
from .log import Log, LogEvent, LogPolicy


def _policy(framework: str) -> LogPolicy | None:
    """The policy of the framework that prints a log format (None: none to check a log against)."""
    return LOG_FORMATS[framework].policy


def _matches(framework: str, replayed: float, logged: float) -> bool:
    """Whether a replayed scale prints as the logged one (each framework's printing:
    :attr:`LogPolicy.prints`)."""
    if replayed == logged:
        return True
    spec = _policy(framework)
    return math.isfinite(replayed) and spec is not None and spec.prints(replayed, logged)


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
    #: The pairs of adjacent lines (line numbers) read swapped to reproduce a log of overflow lines alone.
    swapped: tuple[tuple[int, int], ...] = ()

    def swaps_text(self) -> str:
        """The swapped pairs in words ('' where none)."""
        if not self.swapped:
            return ""
        pairs = ", ".join(f"{a}-{b}" for a, b in self.swapped)
        return (f"once {len(self.swapped)} pair{'s' if len(self.swapped) > 1 else ''} of adjacent lines "
                f"{'are' if len(self.swapped) > 1 else 'is'} read swapped (lines {pairs}: several processes printing "
                f"into one stream?)")

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
            swaps = f" {self.swaps_text()}" if self.swapped else ""
            return "\n".join(head + [f"consistent: the replay reproduces every logged scale{swaps}"])
        more = f" ({len(self.departures)} departures in all)" if len(self.departures) > 1 else ""
        return "\n".join(head + [f"INCONSISTENT{more}: first at {self.departures[0]}"])


def _arguments(framework: str, init: float, window: int | None, hysteresis: int | None) -> dict[str, Any]:
    spec = _policy(framework)
    args = {**spec.fixed, spec.init: init}
    if window is not None:
        args[spec.window] = window
    if spec.hysteresis and hysteresis is not None:
        args[spec.hysteresis] = hysteresis
    return {**args, **spec.bounds(init)}


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
    depend on it, away from its floor and cap). A gap of known steps and overflows (a Megatron
    interval line counting its skipped iterations) runs as its overflows, then its clean steps; after
    a gap the log bounds less, the first logged scale itself."""
    ref, spec = 2.0**64, _policy(framework)
    policy = spec.cls(**_arguments(framework, ref, window, hysteresis))
    policy = replace(policy, **spec.bounds(2.0**100))  # no cap met on the way from the reference
    state = policy.initial()
    for e in log.events:
        if e.scale is not None:
            return spec.value(e.scale) * ref / float(state.scale)
        if not e.gap:
            state = policy.next(state, not e.overflow)
        elif e.overflows is not None and e.span[0] == e.span[1] and not e.among:
            for finite in [False] * e.overflows + [True] * (e.span[0] - e.overflows):
                state = policy.next(state, finite)
        elif e.next_scale is not None:
            return spec.value(e.next_scale)
        else:
            state = policy.initial()  # what the gap did is unknown: the next logged scale starts the run
            ref = float(state.scale)
        if e.next_scale is not None:
            return spec.value(e.next_scale) * ref / float(state.scale)
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
    hysteresis lines (Megatron's: tried from 1 to 4, or more), the growth window from the first growth; among
    the candidates, the one whose replay departs least (and latest)."""
    fits, how, _ = _fits(log)
    return (fits[0] if fits else None), how


def _fits(log: Log) -> tuple[list[Policy], dict[str, str], bool]:
    """The candidates of :func:`framework_policy` that fit the log equally well (the first is the
    one it returns; a short log often fits several growth windows), how each argument was found, and
    whether every window the log allows was tried (else the replayed scales are not the log's)."""
    spec = _policy(log.framework)
    if spec is None:
        return [], {}, False
    cls, init_name, window_name, hyst_name = spec.cls, spec.init, spec.window, spec.hysteresis
    default_window = spec.default_window or next(f.default for f in dataclasses.fields(cls) if f.name == window_name)
    windows, window_how, pinned = _windows(log, default_window) if log.complete else (
        [default_window], "not inferred (the log does not place every step)", False)
    hysteresis: list[int | None] = [None]
    how: dict[str, str] = {}
    if spec.hystereses is not None:
        values, how[hyst_name] = spec.hystereses(log)
        hysteresis = list(values)
    best, refused = None, None
    for h in hysteresis:
        for w in windows:
            init = _initial(log.framework, log, w, h)
            if init is None:
                continue
            try:
                policy = cls(**_arguments(log.framework, init, w, h))
            except ValueError:  # a scale the framework cannot hold (0: DeepSpeed prints int(S) below 1)
                refused = init
                continue
            departures = _replay(policy, log)[0] if log.complete else _chain(policy, log)[0]
            key = (len(departures), -(departures[0].line if departures else 0))
            if best is None or key < best[0]:
                best = (key, [policy])
            elif key == best[0]:
                best[1].append(policy)
    if best is None:
        return [], {"initial scale": "not found (no logged scale)" if refused is None else
                    f"not found (the logged scales lead to {_show(refused)}, which the framework cannot hold: "
                    f"scales printed as integers below 1?)"}, False
    how = {init_name: "from the first logged scale", window_name: window_how, **how}
    return best[1], how, pinned


def _chain(policy: Policy, log: Log) -> tuple[list[Departure], int]:
    """For a log that does not place every step: each overflow's own update (from the logged scale
    before it, where printed), and that some number of growths by the policy's factor leads from
    one overflow's scale after (the log's, or where it prints only the scale before, the policy's
    update of that) to the next one's, each loss scaler's lines apart where the log names several
    (with as many unprinted backoffs between two of one scaler's lines as other scalers' lines
    between them). A logging interval that counts k skipped steps (Megatron's) updates the scale k times, and where
    it holds clean steps too, any number of growths may come between."""
    departures, compared = [], 0
    afters: dict[str | None, float | None] = {}  # each loss scaler's scale after its last overflow
    last: dict[str | None, int] = {}  # where each loss scaler's last line was, among the overflow lines
    seen = 0  # overflow lines so far
    # overflow lines among the steps of a gap holding overflows the log does not print (a counter's
    # skipped count above the lines, or lines a paste left out): that many may come before each
    hidden: dict[int, int] = {}
    for j, g in enumerate(log.events):
        if g.gap and g.among and g.overflows != 0:
            most = _UNPRINTED if g.overflows is None or g.span[1] is None else min(g.span[1], _UNPRINTED)
            hidden.update({i: most if g.overflows is None else min(g.overflows, most) for i in range(j - g.among, j)})
    for i, e in enumerate(log.events):
        if not e.overflow:
            unseen = e.gap and e.overflows != 0 and e.next_scale is None  # overflows the log does not print
            if e.next_scale is not None or unseen:
                afters = {None: e.next_scale}
            continue
        # apex amp prints one line a step, the first overflowing loss's: another scaler's line may stand
        # for a step in which this scaler overflowed too, unprinted (apex/amp/handle.py, scale_loss)
        silent = seen - last[e.scaler] - 1 if e.scaler is not None and e.scaler in last else 0
        silent = max(silent, hidden.get(i, 0))
        last[e.scaler], seen = seen, seen + 1
        found, n, afters[e.scaler] = _link(policy, log.framework, afters.get(e.scaler), e, silent=silent)
        departures += found
        compared += n
    return departures, compared


#: The most overflows the sparse check lets a gap hide between two lines where the log bounds them
#: no better: more backoffs than binary32's exponents span (2**127 to 2**-149) take any scale to any.
_UNPRINTED = 300


def _link(policy: Policy, framework: str, after: float | None, e: LogEvent, grown: bool = True,
          silent: int = 0) -> tuple[list[Departure], int, float | None]:
    """One overflow event of :func:`_chain` after the scale ``after`` (None: unknown): its
    departures, how many scales it compared and the scale after it. ``grown``: whether growths may
    come between (else the event's own update follows ``after`` directly); ``silent``: how many
    overflows the log may not print may come between too."""
    factor = float(getattr(policy, "scale_factor", getattr(policy, "growth_factor", 2.0)))
    departures, compared = [], 0
    k = e.overflows if e.gap and e.overflows else 1  # a logging interval's skipped steps, all in it
    clean = e.gap and (e.span[1] is None or e.span[1] > k)  # and its clean ones, which may grow the scale
    starts = [e.scale] if e.scale is not None else (
        [after * factor**j for j in range(-silent, 64 if grown else 1)] if after is not None else [])
    if e.scale is not None and after is not None:
        compared += 1
        ratio = math.log(e.scale / after, factor) if e.scale > 0 and after > 0 else -1
        if not grown and not _matches(framework, after, e.scale) or ratio < -silent - 1e-9 or \
                abs(ratio - round(ratio)) > 1e-6 and not _matches(framework, after, e.scale):
            departures.append(Departure(e.line, e.step, "before", e.scale, after,
                                        f"no number of growths by {factor:g} leads from {_show(after)} to it"))
    results = []
    if starts and (e.next_scale is not None or e.scale is not None):
        state = policy.initial()
        if hasattr(state, "cur_hysteresis"):
            if e.hysteresis is not None:
                state = state._replace(cur_hysteresis=e.hysteresis)
            elif not e.gap and e.scale is not None and e.next_scale is not None and e.next_scale < e.scale:
                # a line that reduces the scale: its hysteresis was spent (DeepSpeed prints the
                # hysteresis instead where it takes the overflow), whatever steps the log leaves out before
                state = state._replace(cur_hysteresis=1)
        for s in starts:
            try:
                following = _resync(state, s)
                for _ in range(k):
                    following = policy.next(following, False)
            except MinimumScaleError:
                continue
            results.append(float(following.scale))
    if e.next_scale is not None and starts:
        compared += 1
        reachable = [r * factor**j for r in results for j in range(64)] if clean else results
        if not any(_matches(framework, r, e.next_scale) for r in reachable):
            departures.append(Departure(e.line, e.step, "after", e.next_scale, results[0] if results else math.nan,
                                        _backoff_misses(policy, results, e.next_scale, framework)))
    # the scale after: the log's; where it prints only the scale the step ran at, the policy's update of it
    return departures, compared, (e.next_scale if e.next_scale is not None else
                                  results[0] if e.scale is not None and results else None)


def _swaps(policy: Policy, log: Log) -> list[tuple[int, int]] | None:
    """For a log of overflow lines alone (one scaler, clean steps of unknown number between them):
    the fewest pairs of adjacent lines that, read swapped, leave no departure in :func:`_chain`
    (several processes printing one scaler's lines into one stream can put two out of order), or
    None where no such reading exists. In a pair read swapped, the line printed first must be the
    policy's own update of the other's scale, with no growth between."""
    if any(e.scaler is not None or (not e.overflow and (not e.gap or e.overflows != 0 or e.next_scale is not None))
           for e in log.events):
        return None
    lines = [e for e in log.events if e.overflow]
    after = [_link(policy, log.framework, None, e)[2] for e in lines]  # a line's scale after: its own

    def fits(previous: int, j: int, grown: bool = True) -> bool:
        return not _link(policy, log.framework, after[previous] if previous >= 0 else None, lines[j], grown)[0]

    # reached[(placed, last)]: the fewest swaps that place lines[:placed] with lines[last] last, and which
    reached: dict[tuple[int, int], tuple[int, tuple[tuple[int, int], ...]]] = {(0, -1): (0, ())}
    for i in range(len(lines)):
        for (_, last), (cost, swapped) in [item for item in reached.items() if item[0][0] == i]:
            moves = [((i + 1, i), cost, swapped)] if fits(last, i) else []
            # a pair read swapped: the line printed first is the update of the one after it, no growth between
            # (two overflows close together, their lines out of order)
            if i + 1 < len(lines) and fits(last, i + 1) and fits(i + 1, i, grown=False):
                moves.append(((i + 2, i), cost + 1, (*swapped, (lines[i].line, lines[i + 1].line))))
            for key, c, sw in moves:
                if key not in reached or c < reached[key][0]:
                    reached[key] = (c, sw)
    done = [v for (placed, _), v in reached.items() if placed == len(lines)]
    return list(min(done)[1]) if done else None


def _backoff_misses(policy: Policy, results: list[float], logged: float, framework: str) -> str:
    """Why an overflow's logged scale after it departs: where more backoffs in a row reach it, the
    lines that would have printed them are not in the log (a paste that dropped them, or several
    ranks printing scalers out of step), which the log cannot tell apart from a departure."""
    for r in results:
        state, more = policy.initial(), 0
        while more < 64 and r > logged and not _matches(framework, r, logged):
            try:
                r, more = float(policy.next(_resync(state, r), False).scale), more + 1
            except MinimumScaleError:
                break
        if more and _matches(framework, r, logged):
            return (f"the policy's backoff gives it after {more} more overflow{'s' if more > 1 else ''}, whose lines "
                    f"are not in the log (dropped from a paste, or ranks' scalers out of step?)")
    return "the policy's backoff does not give it"


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
    if _policy(log.framework) is None and policy is None:
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
        why = inferred.get("initial scale", "")
        return Consistency(log.framework, None, inferred, 0, (), nothing, log.complete, unchecked=(
            f"initial scale {why}: nothing to check" if "cannot hold" in why else "no logged scale: nothing to check"))
    swapped = None
    if log.complete:
        departures, scales, compared = _replay(policy, log)
        # not pinned (windows the log allows were left untried): the log's own scales only
        cut = -math.inf if not pinned else departures[0].line if departures else math.inf
        scales = [s if e.line < cut else None for s, e in zip(scales, log.events, strict=True)]
        if len(fits) > 1:  # the scales the equally fitting candidates disagree on are not known
            others = [_replay(other, log)[1] for other in fits[1:]]
            scales = [s if all(o[i] == s for o in others) else None for i, s in enumerate(scales)]
            window = _policy(log.framework).window
            inferred = {**inferred, window: f"{inferred.get(window, '')}; {len(fits)} candidates fit equally well, "
                        f"the steps whose scale they disagree on are unknown"}
        if departures:
            departures[0] = replace(departures[0], explanation=departures[0].explanation or
                                    _explain(policy, log, departures[0]))
    else:
        departures, compared = _chain(policy, log)
        swapped = _swaps(policy, log) if departures else None
        if swapped:  # the log's own lines, two by two out of order, reproduce it
            departures = []
        scales = [None] * len(log.events)
    unchecked = "" if compared else f"no logged scale could be compared with {type(policy).__name__}: nothing checked"
    return Consistency(log.framework, policy, inferred, compared, tuple(departures), tuple(scales), log.complete,
                       max(1, len(fits)), unchecked, tuple(swapped or ()))

