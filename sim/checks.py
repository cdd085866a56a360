"""The one rule for an integer setting, shared by every layer (seeds, thread and rank counts,
block sizes, periods, a run's steps): Python's ``int`` and numpy's integer scalars alike, never a
bool (Python's or numpy's, though ``bool`` is an ``int`` subclass) and never a float, even one
holding a whole number (``threads=2.0`` is refused, as ``range(2.0)`` is)."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

__all__ = ["NotAnInteger", "integer", "integer_problem", "integer_range"]


class NotAnInteger(TypeError, ValueError):
    """A value that is not an integer where one is needed: a TypeError by Python's convention, and
    a ValueError as every other invalid setting is, so that either ``except`` catches it (as
    numpy's ``AxisError`` is both a ValueError and an IndexError)."""


def integer_range(low: int | None = None, high: int | None = None, alternative: str | None = None) -> str:
    """The valid values in words: "an integer", "an integer of at least 1", "an integer from 1 to
    62"; ``alternative``: another valid value, said after them ("None (every dropped bit)")."""
    if low is not None and high is not None:
        words = f"an integer from {low:,} to {high:,}"
    elif low is not None:
        words = f"an integer of at least {low:,}"
    else:
        words = "an integer" if high is None else f"an integer of at most {high:,}"
    return words if alternative is None else f"{words}, or {alternative}"


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def integer_problem(name: str, value: Any, low: int | None = None, high: int | None = None,
                    alternative: str | None = None) -> str | None:
    """What is wrong with ``value`` as the integer setting ``name`` within [low, high] (None:
    unbounded), in one sentence naming the valid values (``alternative``: see :func:`integer_range`);
    None if nothing is."""
    if _is_integer(value) and (low is None or value >= low) and (high is None or value <= high):
        return None
    return f"{name} must be {integer_range(low, high, alternative)}, got {value!r}"


def integer(name: str, value: Any, low: int | None = None, high: int | None = None,
            alternative: str | None = None) -> int:
    """``value`` as a Python int, checked as the integer setting ``name`` within [low, high]:
    :class:`NotAnInteger` for a value of another type, ValueError for one out of range. A caller
    that takes another value too (None) checks it first and names it as ``alternative``."""
    problem = integer_problem(name, value, low, high, alternative)
    if problem is not None:
        raise (ValueError if _is_integer(value) else NotAnInteger)(problem)
    return int(value)
