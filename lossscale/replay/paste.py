"""What a paste does to a log's lines: lines it leaves out (a line ``...`` in their place) and lines
a terminal wrapped, as the log readers meet them (``parsers._scan``)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from typing import Any

#: A line that stands for lines a paste left out: ``...``, ``…``, ``[...]``, ``<snip>``, or a lone ``.`` (a
#: column of them, the vertical ellipsis).
_ELISION = re.compile(r"\s*(?:\.{3,}|…+|[.⋮]|[\[(<]\s*(?:\.{3,}|…|snip(?:ped)?)\s*[\])>]|-*\s*snip(?:ped)?\s*-*)\s*",
                      re.IGNORECASE)
#: How many unread lines carrying a format's words are tried as wrapped ones, at most (a log in another
#: format has many).
_TRIES = 256
#: A run of spaces inside a line: where a paste of a wrapped terminal line may hold the wrap's padding.
_GAP = re.compile(r"(?<=\S)\s{2,}(?=\S)")


def _unpadded(text: str) -> Iterable[str]:
    """``text``, then ``text`` with each of its first 4 runs of spaces dropped or made one space, in
    every combination: the line a terminal printed before its wrap's padding came into a paste
    (``Attempted loss scal      e: 8192``)."""
    yield text
    gaps = list(_GAP.finditer(text))[:4]
    if not gaps:
        return
    for choice in itertools.product(("", " "), repeat=len(gaps)):
        pieces, at = [], 0
        for m, c in zip(gaps, choice, strict=True):
            pieces += [text[at:m.start()], c]
            at = m.end()
        yield "".join(pieces) + text[at:]


def _unwrapped(read, alone, lines: Sequence[str], i: int, text: str, words: re.Pattern[str]) -> int | None:
    """Line ``i`` (``text``, which ``read`` did not read) read as the line a terminal printed before
    it wrapped it: its paste's padding dropped (:func:`_unpadded`), or the line joined (directly or
    by a space) with up to 3 lines after it that continue it (none longer than the row before it),
    where the format's words appear in the joined text. A line that ``alone`` reads as one of the
    format's own is no continuation: a line cut short before a whole one is not completed by it.
    How many following lines it took, or None where no way of undoing a wrap reads it."""
    window = lines[i:i + 3]
    own = words.search(text)
    if not own and (not window or len(window[0].rstrip()) > len(text.rstrip()) + 1):
        return None  # the usual unread line: none of the format's words, and no row of a wrap
    if not (own or words.search(text + "".join(window)) or words.search(" ".join([text, *window]))):
        return None  # nothing of the format's in reach
    following: list[str] = []
    for extra in range(len(window) + 1):
        if extra:
            nxt, row = window[extra - 1], following[-1] if following else text
            # a wrap fills each row but the last to the terminal's width (a trailing space may be lost)
            if len(nxt.rstrip()) > len(row.rstrip()) + 1 or not nxt.strip() or "\r" in nxt or alone(nxt):
                return None
            following.append(nxt)
        for joins in itertools.product(("", " "), repeat=extra):
            joined = text + "".join(j + f for j, f in zip(joins, following, strict=True))
            if not words.search(joined):
                continue
            # (the line as it is was read before: its variants only)
            if any(read(i, v) for v in itertools.islice(_unpadded(joined), 0 if extra else 1, None)):
                return extra
    return None


class _Paste:
    """What a paste did to a log's lines, as the scan meets the lines the format does not read: the
    lines it left out (a line ``...``: their steps unknown) and the lines a terminal wrapped
    (:func:`_unwrapped`); the rest that carry the format's words are unparsed."""

    def __init__(self, b: Any, read, alone, lines: Sequence[str], words: re.Pattern[str]) -> None:
        self.b, self.read, self.alone, self.lines, self.words = b, read, alone, lines, words
        self.skip = 0  # the last line read as the continuation of an earlier one
        self.wrapped: list[int] = []
        self.elisions: list[int] = []
        self.tries = 0  # unread lines of the format's words that no unwrapping read

    def unread(self, i: int, part: str, whole: bool) -> None:
        """Line ``i``'s ``part`` (``whole``: all of the line), which the format did not read."""
        b = self.b
        if _ELISION.fullmatch(part):
            b.elided.add(len(b.pending))
            self.elisions.append(i)
            return
        taken = _unwrapped(self.read, self.alone, self.lines, i, part, self.words) if (
            whole and self.tries < _TRIES) else None
        if taken is not None:
            self.wrapped.append(i)
            self.skip = i + taken
        elif self.words.search(part):
            self.tries += 1
            b.unparsed.append((i, part))

    def notes(self) -> list[str]:
        notes = []
        if self.elisions:
            notes.append(f"lines left out of the paste ('...') at line{'s' if len(self.elisions) > 1 else ''} "
                         f"{', '.join(map(str, self.elisions))}: the steps there are unknown, overflows or not, "
                         f"unless a step counter after them counts them")
        if self.wrapped:
            notes.append(f"{len(self.wrapped)} lines read as a terminal wrapped them (the padding of the wrap "
                         f"dropped, or the line continued on the next), the first at line {self.wrapped[0]}")
        return notes
