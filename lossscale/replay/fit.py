"""The policy arguments that reproduce a log exactly, found by search over the runs a log allows."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..policy.core import Policy
from .consistency import _arguments, _matches, _policy, _show
from .log import Log, LogEvent
from .steps import Decision, _counts, _limits, _next, _seen, _window

__all__ = ["MAX_RUNS", "MAX_JOINT"]  # exact_fit: lossscale.replay.exact_fit

#: The most places (framework candidate and state, place in a window) the exact replay visits in
#: following the framework's own runs, and the most (with the other policy's state beside them) in
#: replaying another policy, before it leaves a log to the bounds above (a few seconds each).
MAX_RUNS = 250_000
MAX_JOINT = 2_000_000


def _family(log: Log) -> list[tuple[Policy, int]] | None:
    """Every run of the log's framework policy the log may come from, with the framework's
    defaults for what a log never shows (DeepSpeed: ``scale_factor`` 2 and no consecutive
    hysteresis): each growth window from 1 to one past the log's steps (no growth at all), each
    hysteresis from 1 to 4 (or the most the log prints or needs) where the policy has one, and each
    initial scale that some number of growths and backoffs takes to the first scale the log
    prints. Each candidate is a policy with the least window and the greatest window it stands
    for (a window's growth is the only difference, and :func:`_graph` splits a window off when it
    grows). None where the log bounds too little for that (no scale printed, or a gap of unknown
    length before the end)."""
    spec = _policy(log.framework)
    if spec is None or not log.events:
        return None
    cls, hyst_name = spec.cls, spec.hysteresis
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
    logged = spec.value(logged)
    probe = cls(**_arguments(log.framework, 1.0, 1, 1 if hyst_name else None))
    grow = float(getattr(probe, "scale_factor", getattr(probe, "growth_factor", 2.0)))
    back = float(getattr(probe, "backoff_factor", 1.0 / grow))
    printed = max((e.hysteresis for e in events if e.hysteresis), default=1)
    inferred = max(spec.hystereses(log)[0]) if spec.hystereses is not None else 1  # (more where the log says so)
    hystereses = list(range(1, max(4, printed, inferred) + 1)) if hyst_name else [None]
    inits = _initials(logged, grow, back, before + 1, overflows_before)
    if inits is None:
        return None
    family = []
    for h in hystereses:
        for init in inits:
            try:
                family.append((cls(**_arguments(log.framework, init, 1, h)), steps + 1))
            except ValueError:  # a scale the framework cannot hold (past binary32's range): no run starts there
                continue
    return family


#: The most (growths, backoffs) pairs :func:`_initials` tries one by one: a log placing more steps
#: before its first printed scale (a progress bar at step 34081, say) bounds the initial scale too
#: little to follow the framework's runs, unless the factors are a power of two and its inverse.
_MOST_PAIRS = 100_000


def _initials(logged: float, grow: float, back: float, growths: int, backoffs: int) -> list[float] | None:
    """The initial scales (positive binary64 numbers, ascending) that at most ``growths`` growths
    and at most ``backoffs`` backoffs take to ``logged``. Where ``grow`` is a power of two and
    ``back`` its inverse (every framework's defaults), the scales are ``logged`` times each power
    of ``grow`` between ``grow**-growths`` and ``grow**backoffs``, found by exponent however many
    steps the log places; otherwise the pairs are tried one by one, and None past ``_MOST_PAIRS``."""
    power = math.frexp(grow)
    if power[0] == 0.5 and back * grow == 1.0:
        shift, exponent = power[1] - 1, math.frexp(logged)[1]  # grow == 2**shift
        low = max(-growths, math.ceil((-1074 - exponent) / shift) - 1)
        high = min(backoffs, (1024 - exponent) // shift)  # ldexp raises past binary64
        values = (math.ldexp(logged, n * shift) for n in range(low, high + 1))
        return sorted({v for v in values if 0 < v < math.inf})
    if (growths + 1) * (backoffs + 1) > _MOST_PAIRS:
        return None
    return sorted({v for a in range(growths + 1) for c in range(backoffs + 1)
                   if (v := _through(logged, grow, back, a, c)) is not None})


def _through(logged: float, grow: float, back: float, growths: int, backoffs: int) -> float | None:
    """The initial scale that ``growths`` growths and ``backoffs`` backoffs take to ``logged``;
    None where it is not a positive binary64 number (a real log's hundreds of steps before its first
    printed scale allow more growths than binary64 spans: no framework starts there)."""
    try:
        value = logged / (grow**growths * back**backoffs)
    except (OverflowError, ZeroDivisionError):  # a factor past binary64, or below it
        return None
    return value if 0 < value < math.inf else None


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
    cands = _Candidates(_policy(log.framework).window)
    layer = {(cands.id(p), most, p.initial()) for p, most in family}
    graphs, budget = [], [MAX_RUNS]
    for i, j in groups:
        made = _graph(log, log.events[i:j + 1], layer, budget, cands)
        if made is None:
            return _Runs(None, f"more than {MAX_RUNS} places to follow the framework's runs through the log "
                         f"(lossscale.replay.fit.MAX_RUNS)")
        if not made[1]:
            return _Runs(None, f"no run of {_policy(log.framework).cls.__name__} reproduces the log up to line "
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
                         # an end whose node the later runs cannot continue from is no end (within
                         # a gap, such a place is kept for the places it leads to)
                         {number[place]: nodes.setdefault(node, len(nodes)) for place, node in ends.items()
                          if place in live and node in alive},
                         [float(place[0][2].scale) for place in live]))
        alive = {place[0] for place in live if place[1:] == (0, 0, 0, 0)}
    return _Runs(kept[::-1], fit=_fit(log, cands, layer))


def _fit(log: Log, cands: _Candidates, ends: set[Any]) -> dict[str, str]:
    """The arguments of the runs that reproduce the log (each run's candidate, as it ends)."""
    spec = _policy(log.framework)
    init_name, window_name, hyst_name = spec.init, spec.window, spec.hysteresis
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

