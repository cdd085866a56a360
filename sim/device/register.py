"""A device's record of its operations: the float-status register, the IEEE status, events, labels,
context tags, observers and substitutes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from ..checks import integer
from ..rounding import Flag

if TYPE_CHECKING:
    from .core import Device

#: The flags that reach the float-status register.
EVENTS = Flag.OVERFLOW | Flag.INVALID | Flag.DIVBYZERO


# As plain ints for the per-operation path (IntFlag arithmetic is slow).
_EVENTS, _OVERFLOW, _INVALID, _DIVBYZERO = int(EVENTS), int(Flag.OVERFLOW), int(Flag.INVALID), int(Flag.DIVBYZERO)
_INT32_MAX = int(np.iinfo(np.int32).max)
#: The operations :meth:`Device.substitute` can route elsewhere.
SUBSTITUTABLE = frozenset({"matmul"})
_NO_TAGS: Mapping[str, Any] = MappingProxyType({})


class Event(NamedTuple):
    """One device operation that raised a register event."""

    tags: Mapping[str, Any]  #: the device's context tags when it ran (:meth:`Device.set_tags`)
    label: str | None  #: the innermost :meth:`Device.label`, or None
    op: str  #: the device operation (``matmul``, ``exp``, ``cast``, ...)
    flags: Flag  #: every IEEE flag the operation raised
    elements: int  #: the number of elements the operation produced


class Observer(Protocol):
    """What a device tells its observers (:meth:`Device.add_observer`). Both methods are
    optional: a device calls only those an observer has, so that one which does not watch
    events costs the operations nothing."""

    def on_event(self, device: Device, event: Event) -> None:
        """An operation raised a register event (called whether or not the device logs)."""

    def on_tags(self, device: Device, previous: Mapping[str, Any], current: Mapping[str, Any]) -> None:
        """:meth:`Device.set_tags` was called (``previous`` and ``current`` may be equal)."""


class _Label:
    """The context manager of :meth:`Device.label` (a class: it runs around every module call and,
    in sim.torch and sim.jax, every operation). After the block, ``raised`` says whether an
    operation inside it raised an event (the register's operation count moved)."""

    __slots__ = ("device", "name", "previous", "before", "raised")

    def __init__(self, device: Device, name: str | None) -> None:
        self.device, self.name, self.raised = device, name, False

    def __enter__(self) -> _Label:
        self.previous, self.device._label = self.device._label, self.name
        self.before = self.device.event_count
        return self

    def __exit__(self, *exc) -> None:
        self.device._label = self.previous
        self.raised = self.device.event_count != self.before


class LegacyModeWarning(UserWarning):
    """Saturation mode chosen on a product where it is kept only for compatibility."""



class _Register:
    """The float-status register, the IEEE status, the event log, labels, context tags, observers,
    substitutes and a collective group: what a device records of its operations."""

    # -- labels: what the running operations belong to --------------------------------
    def label(self, name: str | None) -> _Label:
        """Label the operations run inside the ``with`` block (sim.torch labels them with the
        issuing module's path; hand-written code can name its parts), for the record of which
        operation raised an event. Blocks nest; the innermost label holds. ``with dev.label(x) as
        block:`` then ``block.raised``: whether an operation in the block raised an event."""
        return _Label(self, name)

    @property
    def current_label(self) -> str | None:
        """The label of the innermost :meth:`label` block, or None."""
        return self._label

    # -- context tags, observers, substitutes, group ---------------------------------
    def set_tags(self, **tags: Any) -> None:
        """Update the context tags that events record (``dev.set_tags(step=3, phase="forward")``;
        a tag set to None is removed). The device gives them no meaning: they say where its
        driver is, for the log and the observers. Then each observer's ``on_tags`` runs, in
        the order they were added, on every call."""
        with self._lock:
            previous = self._tags
            merged = {**previous, **tags}
            self._tags = MappingProxyType({k: v for k, v in merged.items() if v is not None})
            for notify in self._on_tags:
                notify(self, previous, self._tags)

    @property
    def tags(self) -> Mapping[str, Any]:
        """The current context tags (a read-only mapping; :meth:`set_tags` changes them)."""
        return self._tags

    @property
    def observers(self) -> tuple[Observer, ...]:
        """The observers, in the order they were added."""
        return self._observers

    def add_observer(self, observer: Observer) -> None:
        """Tell ``observer`` of this device's register events and tag changes (see
        :class:`Observer`); an observer already added stays where it is."""
        if not (callable(getattr(observer, "on_event", None)) or callable(getattr(observer, "on_tags", None))):
            raise ValueError(f"an observer needs an on_event or on_tags method, got {observer!r}")
        with self._lock:
            if not any(o is observer for o in self._observers):
                self._set_observers((*self._observers, observer))

    def remove_observer(self, observer: Observer) -> None:
        """Stop telling ``observer``; ValueError if it was not added."""
        with self._lock:
            if not any(o is observer for o in self._observers):
                raise ValueError(f"{observer!r} is not an observer of {self!r}")
            self._set_observers(tuple(o for o in self._observers if o is not observer))

    def _set_observers(self, observers: tuple[Observer, ...]) -> None:
        self._observers = observers
        self._on_event = tuple(o.on_event for o in observers if callable(getattr(o, "on_event", None)))
        self._on_tags = tuple(o.on_tags for o in observers if callable(getattr(o, "on_tags", None)))

    def substitute(self, op: str, fn: Callable | None) -> None:
        """Route operation ``op`` (one of :data:`SUBSTITUTABLE`) to ``fn``, called with the
        device first and the operation's arguments as they were given (``matmul``:
        ``fn(device, a, b, accumulate, out_dtype)``), its result returned as the operation's;
        None restores the device's own. For a different implementation of a whole operation,
        such as a model's matmuls run in FP8 (``fn`` must not call the substituted operation:
        it would call itself)."""
        if op not in SUBSTITUTABLE:
            raise ValueError(f"cannot substitute {op!r}; substitutable: {', '.join(sorted(SUBSTITUTABLE))}")
        if fn is None:
            self._substitutes.pop(op, None)
        elif not callable(fn):
            raise ValueError(f"a substitute for {op} must be callable, got {fn!r}")
        else:
            self._substitutes[op] = fn

    def substitute_of(self, op: str) -> Callable | None:
        """What ``op`` is routed to (:meth:`substitute`), or None."""
        return self._substitutes.get(op)

    def join(self, group: Any, rank: int) -> None:
        """Become rank ``rank`` of the collective ``group`` (``sim.Group`` calls it)."""
        self._group, self._rank = group, integer("rank", rank, 0)

    @property
    def group(self) -> Any:
        """The collective this device is a rank of (:meth:`join`), or None."""
        return self._group

    @property
    def rank(self) -> int | None:
        """This device's rank in :attr:`group`, or None."""
        return self._rank

    @property
    def events(self) -> list[Event]:
        """The event log, oldest first (empty unless made with ``record_events=True``)."""
        return list(self._log) if self._log is not None else []

    def clear_events(self) -> None:
        with self._lock:
            if self._log is not None:
                self._log.clear()

    # -- the float-status register and the IEEE status ------------------------------
    def get_float_status(self) -> np.ndarray:
        """The register, ``int32[8]``: all zero unless an event happened since the last clear."""
        with self._lock:
            return self._register.copy()

    @property
    def event_count(self) -> int:
        """Slot 3 of the register: how many device operations raised an event since the last
        clear (``int(get_float_status()[3])`` without the copy: :meth:`label` blocks read it
        around every operation of sim.torch and sim.jax)."""
        return int(self._register[3])

    def clear_float_status(self) -> None:
        with self._lock:
            self._register[:] = 0

    def raise_event(self, flags: Flag, op: str, elements: int = 1, label: str | None = None) -> None:
        """Raise ``flags`` here as if operation ``op`` had raised them: the register, the IEEE
        status, the log and the observers see an event with this device's tags. For a driver that
        runs operations on one device and replays them, in another order, on the devices they are
        attributed to (a pipeline schedule's stage devices)."""
        if not isinstance(flags, (Flag, int)) or isinstance(flags, bool):
            raise ValueError(f"flags must be a sim.Flag, got {flags!r}")
        previous, self._label = self._label, label
        try:
            self._record(int(flags), op, elements)
        finally:
            self._label = previous

    @property
    def status(self) -> Flag:
        """The OR of every IEEE flag raised by this device's operations since :meth:`clear_status`."""
        return Flag(self._status)

    def clear_status(self) -> None:
        with self._lock:
            self._status = 0

    @property
    def operations(self) -> int:
        """How many operations this device has run (events or not; never reset): a driver
        compares two readings to learn whether anything ran on the device between them, as a
        loss scaler does to tell a backward pass run off the device."""
        return self._operations

    def _record(self, status: int, op: str, elements: int) -> None:
        """One operation's flags: into the IEEE status, and its events into the register
        (and the log and the observers)."""
        with self._lock:
            self._operations += 1
            self._status |= status
            if status & _EVENTS:
                self._event(status, op, elements)

    def _event(self, status: int, op: str, elements: int) -> None:
        reg = self._register
        reg[0] |= (status & _OVERFLOW) != 0
        reg[1] |= (status & _INVALID) != 0
        reg[2] |= (status & _DIVBYZERO) != 0
        reg[3] = min(int(reg[3]) + 1, _INT32_MAX)
        if self._log is not None or self._on_event:
            event = Event(self._tags, self._label, op, Flag(status), int(elements))
            if self._log is not None:
                self._log.append(event)
            for notify in self._on_event:
                notify(self, event)

