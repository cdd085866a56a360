"""A policy's decisions over a log's steps: the outcomes a step allows and the window of states a
policy can be in, what ``counterfactual`` and ``exact_fit`` share."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..policy.core import Policy
from ..policy.frameworks import (
    MinimumScaleError,
)
from .log import Log, LogEvent


@dataclass(frozen=True)
class Decision:
    """Another policy's step: the scales it may hold before the step (one, unless unknown steps
    branched it; none once the state is lost) and its decision: ``overflow``, ``clean`` or ``unknown``."""

    scales: tuple[float, ...]
    decision: str


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

