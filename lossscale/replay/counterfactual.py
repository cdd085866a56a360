"""Another policy replayed on a log's overflow decisions: each step's scale and decision, or the
bounds a gap of unknown length leaves."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..policy.core import Policy
from .consistency import Consistency, consistency
from .fit import _exact
from .log import Log
from .steps import Decision, _across, _after, _counts, _factors, _placed, _power, _window

BINARY16_MAX = 65504.0
#: The most states a counterfactual replay follows after unknown steps before it calls the state lost.
MAX_STATES = 256


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

