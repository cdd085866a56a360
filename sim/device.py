"""A simulated NPU: a product profile, an overflow mode, tensor operations on
the emulator, and the sticky float-status register that loss scaling reads.

The float-status register reads as ``int32[8]`` (as ``NpuGetFloatStatusV2``
does). Its slots, as this model uses them:

====  ==================================================================
slot  meaning
====  ==================================================================
0     1 if an element raised OVERFLOW since the last clear
1     1 if an element raised INVALID
2     1 if an element raised DIVBYZERO
3     how many device operations raised any of the three
4-7   0 (reserved)
====  ==================================================================

Any non-zero slot means an overflow/invalid event, as on the device. Every
operation run on the device ORs its events in, the forward pass included;
reading does not clear, only :meth:`Device.clear_float_status` does. INEXACT
and UNDERFLOW do not reach the register.

Slot 3 counts device operations (one per call: a matmul or a sum is one
operation).

Which operation raised an event: each operation runs under the device's
current *label* (``with device.label("fc1"):``; ``sim.torch`` labels with the
issuing module's path) and its *context tags*, names and values that whoever
drives the device sets to say where it is (:meth:`Device.set_tags`, such as
``step=3, phase="forward"`` for a training step; the device gives them no
meaning). With ``record_events=True`` the device keeps a log,
:attr:`Device.events`: one :class:`Event` (tags, label, op, flags, elements)
per operation that raised a register event. *Observers* (:class:`Observer`,
given to the constructor or :meth:`Device.add_observer`) are told of every
such event and of every change of tags, so that they can count events or
clear and read the register at the points where a framework does. Beside the
register the device keeps the sticky IEEE status of everything it ran
(:attr:`Device.status`, all five flags), cleared only by
:meth:`Device.clear_status`.

An operation can be routed to another implementation
(:meth:`Device.substitute`; ``matmul`` only, as FP8 training runs a model's
matmuls in FP8), and a device can be a rank of a collective
(:meth:`Device.join`, which ``sim.Group`` calls).

Arithmetic is binary16 (and binary32 or bfloat16 where the operands are),
in the device's overflow mode; binary32 results saturate too in saturation
mode unless ``saturate_float32=False``. A result is rounded in the settings
of its own format: a cast, a matmul or a sum into binary16 follows the
binary16 overflow mode whatever the source. Transcendentals are correctly
rounded in every mode. ``matmul`` multiplies exactly, accumulates in binary32
(the cube unit; the profile's default) or binary16, along k in ascending
order with one rounding per addition, and rounds the result once to the
output dtype; ``sum`` adds in a fixed pairwise tree; ``mean`` divides that
sum by the count as an exact number, with one rounding. No result depends
on the machine, its BLAS or the number of threads.

Each operation is argument checks, one compiled kernel call and one
register update. Big-endian arrays are converted to native byte order;
masked arrays are refused (their masks would be lost: fill or compress them).
The device runs single-threaded unless ``threads=N`` is given; then large
matmuls split their output rows over N threads.

The overflow modes and the register, with their sources: ``docs/semantics.md``.
"""

from __future__ import annotations

import contextvars
import functools
import math
import operator
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

import numpy as np

from . import conv, formats, mx, ops, profiles
from . import kernels as K
from .checks import integer
from .formats import BFLOAT16, BINARY16, BINARY32, BINARY64, Format, format_of
from .fpu import Fpu, filled, finish, plain
from .rounding import SIX_MODES, Flag, OverflowMode, Rounding, config

__all__ = ["EVENTS", "SUBSTITUTABLE"]

#: The flags that reach the float-status register.
EVENTS = Flag.OVERFLOW | Flag.INVALID | Flag.DIVBYZERO
# As plain ints for the per-operation path (IntFlag arithmetic is slow).
_EVENTS, _OVERFLOW, _INVALID, _DIVBYZERO = int(EVENTS), int(Flag.OVERFLOW), int(Flag.INVALID), int(Flag.DIVBYZERO)
_INT32_MAX = int(np.iinfo(np.int32).max)
_SCALARS_KEPT = 4096  # the most values Device.scalar keeps (then it starts again)
_F16 = np.dtype(np.float16)
#: The classes the short paths take as they are (a masked array or other subclass is checked first).
_PLAIN = frozenset({np.ndarray, np.float16, np.float32, BFLOAT16.dtype.type})

_current: contextvars.ContextVar[tuple[Device, ...]] = contextvars.ContextVar("sim_devices", default=())


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="sim-matmul")


#: Multiply-adds below which a matmul stays on one thread (threads cost more than they save).
THREADED_MATMUL = 1 << 18


def matrix_stacks(a: np.ndarray, b: np.ndarray) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """The broadcast leading dimensions of (..., M, K) and (..., K, N) operands, and each operand
    as a flat stack of matrices over them (for matmuls that run matrix by matrix)."""
    try:
        lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: leading dimensions of {a.shape} and {b.shape} do not broadcast") from None
    return (lead, np.broadcast_to(a, lead + a.shape[-2:]).reshape(-1, *a.shape[-2:]),
            np.broadcast_to(b, lead + b.shape[-2:]).reshape(-1, *b.shape[-2:]))


def _columns(x, axis: int | None, fmt: Format, op: str = "sum") -> tuple[np.ndarray, tuple[int, ...]]:
    """``x`` as bits (n, columns) with the reduced axis first, C-ordered (one compiled kernel
    serves every layout; a copy only where needed), and the shape of the result."""
    x = np.asarray(x)
    if axis is not None:
        valid = f"None or one integer from {-x.ndim} to {x.ndim - 1}" if x.ndim else "None (it has no axes)"
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise TypeError(f"{op}: axis must be None or one integer, got {axis!r}; valid: {valid}")
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"{op}: axis {axis} is out of range for a {x.ndim}-dimensional array; valid: {valid}")
    if axis is None:
        v = x.reshape(-1, 1)
    else:
        v = x if axis in (0, -x.ndim) else x.swapaxes(0, axis) if x.ndim == 2 else np.moveaxis(x, axis, 0)
    rest = v.shape[1:]
    return np.ascontiguousarray(v.reshape(v.shape[0], math.prod(rest))).view(fmt.uint), rest


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


def current_device() -> Device:
    """The innermost device entered with ``with`` in this thread or task."""
    stack = _current.get()
    if not stack:
        raise RuntimeError("no current device: run the code inside `with Device(...):`")
    return stack[-1]


class Device:
    """A simulated Atlas NPU with its own float-status register and sticky IEEE status."""

    def __init__(self, profile: str | profiles.Profile = "atlas-a2", overflow: OverflowMode | str | None = None,
                 *, rounding: Rounding | str = Rounding.NEAREST_EVEN, saturate_float32: bool = True,
                 name: str | None = None, threads: int = 1, record_events: bool = False, seed: int = 0,
                 observers: Iterable[Observer] = (), substitutes: Mapping[str, Callable] | None = None,
                 matmul_bias: str = "after") -> None:
        self.profile = profiles.get(profile)
        if matmul_bias not in ("after", "fused"):
            raise ValueError(f"matmul_bias must be 'after' or 'fused', got {matmul_bias!r}")
        if matmul_bias == "fused" and not self.profile.bias_table:
            raise ValueError(f"{self.profile.name}: its cube unit has no bias table (Mmad supports "
                             f"cmatrixSource=false only), so a bias cannot enter the binary32 sum; "
                             f"use matmul_bias='after'")
        #: Where a matmul's or convolution's bias enters when none is named in the call: "fused"
        #: (the initial value of the binary32 sums, one rounding) or "after" (added to the rounded
        #: product by the vector unit, a second rounding).
        self.matmul_bias = matmul_bias
        mode = self.profile.default_overflow_mode if overflow is None else OverflowMode.parse(overflow)
        if mode not in self.profile.overflow_modes:
            raise ValueError(f"{self.profile.name} ({self.profile.product_en}) supports "
                             f"{self.profile.describe_modes()}, not {mode.name}")
        threads = integer("threads", threads, 1)
        rounding = Rounding.parse(rounding)
        if rounding not in SIX_MODES:
            raise ValueError(f"a device computes in one of {', '.join(m.name for m in SIX_MODES)}; "
                             f"{rounding.name} rounding is for casts: dev.cast(x, fmt, rounding={rounding.name!r})")
        if mode is OverflowMode.SATURATION and self.profile.saturation_is_legacy:
            warnings.warn(f"{self.profile.name}: saturation mode is kept for compatibility only, is no longer "
                          f"developed, and may carry precision error; the default is INF_NAN",
                          LegacyModeWarning, stacklevel=2)
        self.overflow = mode
        self.name = name or self.profile.name
        self.threads = threads
        p = self.profile
        kw = dict(rounding=rounding, tininess=p.tininess)
        #: Seeds the random bits of stochastic casts; each source format's unit draws its own stream.
        self.seed = integer("seed", seed, 0)
        self.fpu = Fpu(mode, format=BINARY16, default_nan=p.default_nan, seed=4 * self.seed, **kw)
        f32_mode = mode if saturate_float32 else OverflowMode.INF_NAN
        self._fpus = {np.dtype(np.float16): self.fpu,
                      np.dtype(np.float32): Fpu(f32_mode, format=BINARY32, seed=4 * self.seed + 1, **kw),
                      BFLOAT16.dtype: Fpu(mode, format=BFLOAT16, seed=4 * self.seed + 2, **kw)}
        self._register = np.zeros(8, np.int32)
        self._status = 0
        self._operations = 0
        self._label: str | None = None
        self._tags: Mapping[str, Any] = _NO_TAGS  # replaced, never changed: events share it
        self._observers: tuple[Observer, ...] = ()
        # The bound methods the observers have, so that an event without observers costs nothing.
        self._on_event: tuple[Callable[[Device, Event], None], ...] = ()
        self._on_tags: tuple[Callable[[Device, Mapping[str, Any], Mapping[str, Any]], None], ...] = ()
        if not isinstance(record_events, (bool, np.bool_)):
            raise ValueError(f"record_events must be a bool, got {record_events!r}")
        self._log: list[Event] | None = [] if record_events else None
        self._substitutes: dict[str, Callable] = {}
        self._mx_unit: Fpu | None = None  # quantize_mx's unit, made on first use
        self._group: Any = None
        self._rank: int | None = None
        self._lock = threading.RLock()
        for observer in observers:
            self.add_observer(observer)
        for op, fn in (substitutes or {}).items():
            self.substitute(op, fn)
        self._tokens: list[contextvars.Token] = []
        self._scalars: dict[tuple, tuple[np.ndarray, Fpu, int]] = {}  # scalar()'s results and flags

    def __repr__(self) -> str:
        return f"Device({self.profile.name!r}, overflow={self.overflow.name})"

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

    # -- the event log ----------------------------------------------------------------

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

    def _on(self, x) -> Fpu:
        try:
            return self._fpus[x.dtype]
        except (KeyError, AttributeError):
            if isinstance(getattr(x, "dtype", None), np.dtype) and x.dtype.newbyteorder("=") in self._fpus:
                return self._fpus[x.dtype.newbyteorder("=")]  # big-endian: the operands are converted
            got = getattr(x, "dtype", type(x).__name__)
            raise TypeError(f"{self.name}: no arithmetic on {got}; valid: numpy arrays or scalars of "
                            f"float16, float32, bfloat16") from None

    def _unit(self, dtype, what: str) -> Fpu:
        """The unit computing in ``dtype`` (for accumulation and output types)."""
        try:
            return self._fpus[np.dtype(dtype)]
        except (KeyError, TypeError):
            raise TypeError(f"{self.name}: {what} must be float16, float32 or bfloat16, not {dtype!r}") from None

    def _op(self, op: str, *args, **kw) -> np.ndarray:
        """Run one elementwise operation in the settings of its operands' format."""
        result, shape, scalar = self._on(args[0]).run(op, args, **kw)
        self._record(result.status, op, math.prod(shape))
        return finish(result, shape, scalar, False)

    def _flat(self, op: str, call, n: int, dst: Format, shape: tuple[int, ...]) -> np.ndarray:
        """The short path: ``call(out, flags)`` runs one kernel on n elements into fresh arrays
        of ``dst`` bits; its events are recorded and the result shaped."""
        out = np.empty(n, dst.uint)
        self._record(call(out, np.empty(n, np.uint8)), op, n)
        return out.view(dst.dtype).reshape(shape)

    def _elementary(self, op: str, code: int, a) -> np.ndarray:
        """A transcendental or similar one-operand operation (``code``: its kernel's); arrays take
        the short path."""
        fpu = self._fpus.get(a.dtype) if a.__class__ is np.ndarray else None
        if fpu is None:
            return self._op(op, a)
        bits, cfg = a.reshape(-1).view(fpu.uint), fpu.settings
        return self._flat(op, lambda out, flags: K.elementary(code, bits, out, flags, cfg, cfg), a.size,
                          fpu.format, a.shape)

    def _binary(self, op: str, a, b) -> np.ndarray:
        """A binary operation on arrays or scalars of one dtype (broadcast as numpy does): checks,
        one kernel call, one register update. Anything else (errors included) goes by ``_op``."""
        try:
            fpu = self._fpus[a.dtype]
            usual = b.dtype == a.dtype and a.__class__ in _PLAIN and b.__class__ in _PLAIN
        except (AttributeError, KeyError, TypeError):
            usual = False
        if not usual:
            return self._op(op, a, b)
        shape = a.shape
        if b.shape != shape:
            try:
                shape = np.broadcast(a, b).shape
            except ValueError:
                return self._op(op, a, b)
            a = a if a.shape == shape else filled(a, shape)
            b = b if b.shape == shape else filled(b, shape)
        uint, out = fpu.uint, np.empty(shape, a.dtype)
        self._record(fpu.kernels[op](a.ravel().view(uint), b.ravel().view(uint), out.ravel().view(uint),
                                     np.empty(out.size, np.uint8), fpu.settings), op, out.size)
        return out if shape or a.__class__ is np.ndarray or b.__class__ is np.ndarray else out[()]

    # -- context ------------------------------------------------------------------
    def __enter__(self) -> Device:
        self._tokens.append(_current.set(_current.get() + (self,)))
        return self

    def __exit__(self, *exc) -> None:
        _current.reset(self._tokens.pop())

    # -- elementwise: the methods of sim.ops's operations are made below the class ----------
    def _compare(self, name: str, op: int, signaling: bool, a, b) -> np.ndarray:
        fpu = self._on(a)
        flat, shape, scalar = fpu.operands("compare", (a, b), fpu.format)
        out = np.empty(flat[0].size, bool)
        self._record(K.compare(op, signaling, flat[0], flat[1], out, np.empty(out.size, np.uint8), fpu.settings),
                     name, out.size)
        return out[0] if scalar else out.reshape(shape)

    def relu(self, a) -> np.ndarray:
        """max(a, 0), with +0 for -0 and NaN kept: IEEE 754-2019 maximum(a, +0)."""
        return self._binary("maximum", a, np.zeros(np.shape(a), self._on(a).format.dtype))

    def cast(self, x, dtype, rounding: Rounding | str | None = None, overflow: OverflowMode | str | None = None,
             *, return_flags: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Convert between float32, binary16 and bfloat16 (or widen to float64; float64 sources,
        such as the scalars of a program, round into the device's formats), or into the 8-bit
        formats (by ml_dtypes dtype or name: ``"float8_e4m3fn"``, ``"float8_e5m2"``,
        ``"float8_e8m0fnu"``, ``"float4_e2m1fn"``, ``"hifloat8"``, whose results are uint8
        codes), rounding in ``rounding`` (default: the device's; ``"stochastic"`` draws from
        the device's ``seed``) and in the overflow mode of the destination (default: the
        device's; ``"satfinite"``: OCP's saturating cast, NaN kept). Ascend's saturation
        control covers casts to hif8, e8m0, e5m2 and e4m3fn as it does half and bf16.
        ``return_flags`` (casts into the 8-bit formats): also each element's flags."""
        x = plain(x)
        dst = format_of(dtype)
        if dst.dtype.itemsize == 1 or overflow is not None:
            src_fpu = self._on(x)
            mode = None if rounding is None else Rounding.parse(rounding)
            result, shape, scalar = src_fpu.cast_to(x, dst, mode, overflow or self._overflow_of(dst))
            self._record(result.status, "cast", math.prod(shape))
            return finish(result, shape, scalar, return_flags)
        if return_flags:
            raise ValueError("cast returns flags for casts into the 8-bit formats "
                             "(Fpu.convert has them for every cast)")
        if getattr(x, "dtype", None) == np.float64 and dst is not BINARY64:
            _, (result, shape, scalar) = self._from_float64(x, dtype, rounding, "cast's dtype")
            self._record(result.status, "cast", math.prod(shape))
            return finish(result, shape, scalar, False)
        src_fpu = self._on(x)
        src = src_fpu.format
        fpu = self._fpus.get(dst.dtype, src_fpu)
        if rounding is None and x.__class__ is np.ndarray and fpu.format is dst:
            bits = x.reshape(-1).view(src.uint)
            return self._flat("cast", lambda out, flags: K.convert(bits, out, flags, src_fpu.settings, fpu.settings),
                              x.size, dst, x.shape)
        cfg = fpu.settings_for(dst, None if rounding is None else Rounding.parse(rounding))
        result, shape, scalar = fpu.run("convert", (x,), src=src, dst=dst, cfg=cfg)
        self._record(result.status, "cast", math.prod(shape))
        return finish(result, shape, scalar, False)

    def round_results(self, values, dtypes, flags: int = 0, op: str = "fused",
                      rounding: Rounding | str | None = None) -> list[np.ndarray]:
        """Results an operation computed inside in binary32 or binary64 (``values``, numpy arrays)
        rounded into their ``dtypes`` (float16, bfloat16 or float32) as one device operation, in
        ``rounding`` (default: the device's): each rounding's flags and ``flags`` (the events the
        computation raised inside: an overflow to infinity, a pole, an invalid operation, which
        the rounding of an Inf or NaN cannot see) reach the register once, as the operation ``op``."""
        out, status, elements = [], int(flags), 0
        for v, dtype in zip(values, dtypes, strict=True):
            v = plain(v)
            dst = self._unit(dtype, "a result's dtype")
            cfg = dst.settings if rounding is None else dst.settings_for(dst.format, Rounding.parse(rounding))
            src = self._on(v) if v.dtype != np.float64 else None
            n = v.size
            bits = np.empty(n, dst.format.uint)
            fl = np.empty(n, np.uint8)
            if src is None:  # binary64 values: the unit's cast from binary64
                result, _, _ = dst.run("convert", (np.ascontiguousarray(v).reshape(-1),), src=BINARY64,
                                       dst=dst.format, cfg=cfg)
                bits, s = result.value.view(dst.format.uint), result.status
            else:
                s = K.convert(np.ascontiguousarray(v).reshape(-1).view(src.uint), bits, fl, src.settings, cfg)
            status |= s
            elements += n
            out.append(bits.view(dst.format.dtype).reshape(v.shape))
        self._record(status, op, elements)
        return out

    def scalar(self, value: float, dtype) -> np.ndarray:
        """A Python number rounded into ``dtype`` (float16, bfloat16 or float32) on the device:
        what ``cast(np.asarray(value, np.float64), dtype)`` returns (a new 0-d array), its flags
        recorded as that cast's on every call. Each value's result and flags are kept per dtype
        (the device's rounding is deterministic), so a program's constants are converted once."""
        value = float(value)
        key = (dtype, value, math.copysign(1.0, value))  # +0 and -0 apart (they compare equal)
        kept = self._scalars.get(key)
        if kept is None:
            fpu, (result, shape, scalar) = self._from_float64(np.asarray(value, np.float64), dtype, None,
                                                              "scalar's dtype")
            kept = finish(result, shape, scalar, False), fpu, result.status
            if value == value:  # not NaN (its payload is not in the key)
                if len(self._scalars) >= _SCALARS_KEPT:
                    self._scalars.clear()
                self._scalars[key] = kept
        else:
            kept[1].raise_status(kept[2])  # the unit's sticky status, as its conversion sets it
        self._record(kept[2], "cast", 1)
        return kept[0].copy()

    def _from_float64(self, x: np.ndarray, dtype, rounding, what: str) -> tuple[Fpu, tuple]:
        """binary64 values rounded into ``dtype`` by its unit, not yet recorded: the unit and its
        ``run`` result (the one path of ``cast`` and ``scalar`` for a program's numbers)."""
        fpu = self._unit(dtype, what)
        cfg = fpu.settings_for(fpu.format, None if rounding is None else Rounding.parse(rounding))
        return fpu, fpu.run("convert", (x,), src=BINARY64, dst=fpu.format, cfg=cfg)

    def _overflow_of(self, dst: Format) -> OverflowMode:
        """The overflow mode of results in ``dst``: the device's (binary32 follows ``saturate_float32``)."""
        return self._fpus.get(dst.dtype, self.fpu).overflow

    # -- reductions and matmul ----------------------------------------------------
    def matmul(self, a, b, accumulate=None, out_dtype=None, bias=None, fuse_bias: bool | None = None) -> np.ndarray:
        """``a @ b`` for binary16 (or bfloat16, on a profile whose cube unit takes it) matrices
        (M, K) and (K, N), or stacks of them (..., M, K) and (..., K, N) whose leading
        dimensions broadcast (one device operation for the stack).

        Products are exact; they are added along k in ascending order, each
        addition rounded to ``accumulate`` (default: the profile's, binary32;
        float32: to nearest even, as the cube unit accumulates, whatever the
        device's rounding mode; float16: the device's rounding and overflow
        mode at every step); the sum is rounded once to ``out_dtype`` (default:
        the operands' dtype) in the device's settings for that format.

        ``bias`` (broadcasting to the output) fused (``fuse_bias``; default: the
        device's ``matmul_bias``) is the sums' binary32 initial value, as the cube
        starts L0C from its bias table, and the result is rounded once; otherwise the
        rounded product and the bias are added on the device in ``out_dtype``.

        Where a substitute is set (:meth:`substitute`, as a training simulator does to run a
        model's matmuls in FP8), the call goes to ``fn(device, a, b, accumulate, out_dtype)`` instead
        (with a bias, the substitute's product and the bias are then added on the device).
        """
        a, b = np.asarray(plain(a)), np.asarray(plain(b))
        if out_dtype is None:
            out_dtype = a.dtype if a.dtype == BFLOAT16.dtype else np.float16
        fused = self._fused(bias, fuse_bias)
        fn = self._substitutes.get("matmul")
        if fn is not None:
            out = fn(self, a, b, accumulate, out_dtype)
            return out if bias is None else self.add(out, self._bias_operand(bias, out.dtype))
        if fused:
            return self._product("matmul", a, b, accumulate, out_dtype, init=bias)
        out = self._product("matmul", a, b, accumulate, out_dtype)
        return out if bias is None else self.add(out, self._bias_operand(bias, out.dtype))

    def _fused(self, bias, fuse_bias: bool | None) -> bool:
        if bias is None:
            return False
        fused = self.matmul_bias == "fused" if fuse_bias is None else bool(fuse_bias)
        if fused and not self.profile.bias_table:
            raise ValueError(f"{self.profile.name}: its cube unit has no bias table (Mmad supports "
                             f"cmatrixSource=false only); the bias cannot enter the binary32 sum")
        return fused

    @staticmethod
    def _bias_operand(bias, dtype) -> np.ndarray:
        bias = np.asarray(bias)
        if bias.dtype != dtype:
            raise TypeError(f"a bias added after the rounding must have the output's dtype {np.dtype(dtype)}, "
                            f"got {bias.dtype}")
        return bias

    def matmul_fp8(self, a, b, a_format: Format | str | None = None, b_format: Format | str | None = None,
                   scale_inv: float = 1.0, out_dtype=np.float32) -> np.ndarray:
        """``a @ b`` for 8-bit operands (M, K) and (K, N): E4M3FN, E5M2 or E2M1 arrays (their
        ml_dtypes dtypes), or uint8 codes of a named format (``"hifloat8"``).

        As the cube unit computes: every 8-bit value is exact in binary16, so the operands
        widen exactly; the products are exact and are added along k in ascending order in
        binary32; the sum times ``scale_inv`` (the operands' dequantisation factor,
        1 / (scale_a * scale_b)) is rounded once in binary32, then to ``out_dtype``.
        """
        wide = [self._widen8(x, f, name) for x, f, name in ((a, a_format, "a"), (b, b_format, "b"))]
        out = self._product("matmul_fp8", wide[0], wide[1], np.float32, np.float32)
        if scale_inv != 1.0:
            out = self.mul(out, np.float32(scale_inv))
        return out if np.dtype(out_dtype) == np.float32 else self.cast(out, out_dtype)

    def matmul_mx(self, a: mx.MX, b: mx.MX, out_dtype=np.float32) -> np.ndarray:
        """``a @ b`` for MX operands (M, K) blocked along K and (K, N) blocked along K: per block
        the cube unit's exact products and in-order binary32 sum, scaled by the two blocks'
        powers of two (exact unless binary32 overflows or underflows), the blocks' partial sums
        added in order in binary32."""
        if a.axis != 1 or b.axis != 0 or a.block != b.block or a.elements.shape[1] != b.elements.shape[0]:
            raise ValueError("matmul_mx takes a (M, K) operand blocked along axis 1 and a (K, N) operand "
                             f"blocked along axis 0 with the same block size; got axes {a.axis}, {b.axis}, "
                             f"blocks {a.block}, {b.block}, shapes {a.elements.shape}, {b.elements.shape}")
        a16, b16 = self._widen8(a.elements, a.format, "a"), self._widen8(b.elements, b.format, "b")
        fa = formats.decode(a.scales, "float8_e8m0fnu").astype(np.float32)
        fb = formats.decode(b.scales, "float8_e8m0fnu").astype(np.float32)
        total = None
        for k in range(a.scales.shape[1]):
            lo, hi = k * a.block, min((k + 1) * a.block, a16.shape[1])
            part = self._product("matmul_mx", np.ascontiguousarray(a16[:, lo:hi]), np.ascontiguousarray(b16[lo:hi]),
                                 np.float32, np.float32)
            part = self.mul(self.mul(part, fa[:, k:k + 1]), fb[k:k + 1, :])
            total = part if total is None else self.add(total, part)
        return total if np.dtype(out_dtype) == np.float32 else self.cast(total, out_dtype)

    def quantize_mx(self, x, fmt: Format | str = "float8_e4m3fn", axis: int = -1, block: int = 32,
                    rule: str = "floor", rounding: Rounding | str | None = None) -> mx.MX:
        """MX block quantisation on the device (:func:`sim.mx.quantize`), in the device's rounding
        unless ``rounding`` is given; the element casts' flags reach the register."""
        if self._mx_unit is None:
            self._mx_unit = Fpu(OverflowMode.SATURATION, self.fpu.rounding, self.fpu.tininess, seed=4 * self.seed + 3)
        unit = self._mx_unit
        unit.clear_status()
        x = plain(x)
        q = mx.quantize(x, fmt, axis=axis, block=block, rule=rule, rounding=rounding, fpu=unit)
        self._record(int(unit.status), "quantize_mx", np.asarray(x).size)
        return q

    @staticmethod
    def _widen8(x, fmt: Format | str | None, name: str) -> np.ndarray:
        """An 8-bit operand as the binary16 values it holds (exact for every 8-bit format)."""
        x = np.asarray(x)
        f = format_of(fmt) if fmt is not None else format_of(x.dtype) if x.dtype != np.uint8 else None
        if f is None or f.dtype.itemsize != 1 or not f.signed:  # not the unsigned E8M0 scales
            valid = ", ".join(f.name for f in formats.EIGHT_BIT if f.signed)
            raise TypeError(f"matmul_fp8: operand {name} must hold {valid} values (uint8 codes need their "
                            f"format named), got {x.dtype}")
        return formats.decode(x, f).astype(np.float16)

    def _operands(self, name: str, a: np.ndarray, b: np.ndarray) -> bool:
        """Check the cube unit takes ``a`` and ``b``; True for bfloat16 operands."""
        if a.dtype == _F16 and b.dtype == _F16:
            return False
        if a.dtype == BFLOAT16.dtype and b.dtype == BFLOAT16.dtype:
            if not self.profile.cube_bfloat16:
                raise TypeError(f"{name}: the cube unit of {self.profile.name} ({self.profile.product_en}) takes "
                                f"binary16 operands, not bfloat16; bfloat16 matmuls and convolutions need a profile "
                                f"whose cube takes them: "
                                f"{', '.join(p.name for p in profiles.PROFILES.values() if p.cube_bfloat16)}")
            return True
        raise TypeError(f"{name} takes two binary16 or two bfloat16 operands, got {a.dtype} and {b.dtype}")

    def _product(self, name: str, a, b, accumulate, out_dtype, init=None) -> np.ndarray:
        a, b = np.asarray(plain(a)), np.asarray(plain(b))
        bf16 = self._operands(name, a, b)
        if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
            raise ValueError(f"matmul needs shapes (..., M, K) and (..., K, N), got {a.shape} and {b.shape}")
        acc = self.profile.matmul_accumulate if accumulate is None else accumulate
        try:
            acc_fpu, out_fpu = self._fpus[np.dtype(acc)], self._fpus[np.dtype(out_dtype)]
        except (KeyError, TypeError):
            acc_fpu = out_fpu = None
        if acc_fpu is None or acc_fpu.format is BFLOAT16 or (out_fpu.format is BFLOAT16 and acc_fpu is self.fpu):
            raise ValueError(f"matmul accumulates in float16 or float32 and returns float16, bfloat16 or float32, "
                             f"not {acc!r} / {out_dtype!r}")
        if acc_fpu is self.fpu and (bf16 or init is not None):
            raise ValueError("bfloat16 operands and a fused bias need binary32 accumulation")
        fmt = out_fpu.format
        m, n = a.shape[-2], b.shape[-1]
        if init is not None:
            init = np.asarray(init)
            if init.dtype not in (_F16, BFLOAT16.dtype, np.dtype(np.float32)):
                raise TypeError(f"a fused bias is binary16, bfloat16 or binary32, got {init.dtype}")
            init = init.astype(np.float32)  # exact
        if a.ndim == 2 and b.ndim == 2:
            start = None if init is None else np.ascontiguousarray(np.broadcast_to(init, (m, n)))
            out, status = self._matmul(a, b, acc_fpu, out_fpu, bf16, start)
            self._record(status, name, m * n)
            return out.view(fmt.dtype).reshape(m, n)
        lead, stack_a, stack_b = matrix_stacks(a, b)
        if acc_fpu is self.fpu:  # binary16 accumulation: matrix by matrix
            out = np.empty((len(stack_a), m * n), fmt.uint)
            status = 0
            for i in range(len(stack_a)):
                out[i], s = self._matmul(stack_a[i], stack_b[i], acc_fpu, out_fpu, bf16)
                status |= s
        else:
            starts = np.zeros((len(stack_a), m, n), np.float32) if init is None else \
                np.ascontiguousarray(np.broadcast_to(init, (*lead, m, n)).reshape(-1, m, n))
            out, status = self._matmul_stack(stack_a, stack_b, starts, acc_fpu, out_fpu, bf16)
        self._record(status, name, out.size)
        return out.view(fmt.dtype).reshape(*lead, m, n)

    def _matmul_stack(self, a: np.ndarray, b: np.ndarray, init: np.ndarray, acc_fpu: Fpu, out_fpu: Fpu,
                      bf16: bool) -> tuple[np.ndarray, int]:
        """Stacks of (M, K) @ (K, N) products from binary32 ``init`` sums in one compiled call
        (blocks of the stack on worker threads where the work is large): their output bits
        (S, M*N) and flags, not yet recorded; each product as :meth:`_matmul` computes it."""
        a16, b16 = np.ascontiguousarray(a).view(np.uint16), np.ascontiguousarray(b).view(np.uint16)
        count, m, n = len(a), a.shape[1], b.shape[2]
        out = np.empty((count, m * n), out_fpu.format.uint)
        flags = np.empty((count, m * n), np.uint8)
        settings = acc_fpu.settings, out_fpu.settings
        workers = min(self.threads, count) if a.size * n >= THREADED_MATMUL else 1
        bounds = np.linspace(0, count, workers + 1).astype(int)
        parts = list(_pool(workers).map(
            lambda lo, hi: K.matmul_stack(a16[lo:hi], b16[lo:hi], init[lo:hi], out[lo:hi], flags[lo:hi], *settings,
                                          bf16), bounds[:-1], bounds[1:])) if workers > 1 else \
            [K.matmul_stack(a16, b16, init, out, flags, *settings, bf16)]
        status = functools.reduce(operator.or_, (p[0] for p in parts))
        special, nonfinite = np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])
        unit = self._fpus[BFLOAT16.dtype] if bf16 else self.fpu
        for i in np.flatnonzero(special | (nonfinite & bf16)):  # INVALID (bfloat16: OVERFLOW) inside the sums
            status |= K.matmul32_flags(a16[i], b16[i], unit.settings, init[i])
        return out, status

    def _matmul(self, a: np.ndarray, b: np.ndarray, acc_fpu: Fpu, out_fpu: Fpu, bf16: bool = False,
                init: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """One (M, K) @ (K, N) product: its output bits (flat) and flags, not yet recorded."""
        a16, b16 = np.ascontiguousarray(a).view(np.uint16), np.ascontiguousarray(b).view(np.uint16)
        m, n = a.shape[0], b.shape[1]
        out = np.empty(m * n, out_fpu.format.uint)
        flags = np.empty(m * n, np.uint8)
        settings = acc_fpu.settings, out_fpu.settings
        workers = min(self.threads, m) if a.size * n >= THREADED_MATMUL else 1
        if acc_fpu is self.fpu:
            total = np.empty(m * n, np.uint16)
            status = K.matmul16(a16, b16, total.reshape(m, n), self.fpu.settings)
            return out, status | K.convert(total, out, flags, *settings)
        if init is None:
            init = np.zeros((m, n), np.float32)
        if workers == 1:
            status, special, nonfinite = K.matmul_from(a16, b16, init, out, flags, *settings, bf16)
        else:
            # Blocks of output rows on worker threads (the kernel releases the GIL): each
            # output element's sum is the same whichever block computes it.
            bounds = np.linspace(0, m, workers + 1).astype(int)
            parts = list(_pool(workers).map(
                lambda lo, hi: K.matmul_from(a16[lo:hi], b16, init[lo:hi], out[lo * n:hi * n], flags[lo * n:hi * n],
                                             *settings, bf16),
                bounds[:-1], bounds[1:]))
            status = functools.reduce(operator.or_, (p[0] for p in parts))
            special = any(p[1] for p in parts)
            nonfinite = any(p[2] for p in parts)
        if special or (bf16 and nonfinite):  # INVALID (and, for bfloat16, OVERFLOW) inside the sums
            unit = self._fpus[BFLOAT16.dtype] if bf16 else self.fpu
            status |= K.matmul32_flags(a16, b16, unit.settings, init)
        return out, status

    # -- convolution: im2col, then the matmul above --------------------------------
    def conv(self, x, w, stride=1, padding=0, dilation=1, groups: int = 1, bias=None, accumulate=None,
             out_dtype=None, fuse_bias: bool | None = None) -> np.ndarray:
        """N-d cross-correlation (torch's conv1d/2d/3d) of ``x`` (N, C, *S) with ``w``
        (O, C / groups, *K): (N, O, *OS). ``stride``, ``padding`` (zeros, both sides) and
        ``dilation`` are an int or one per spatial dimension.

        As the cube unit computes it, im2col then :meth:`matmul` (one device operation):
        per group, each output is one matmul row whose exact products x * w are added in
        ascending order of the reduction index (c, k1, ..., kd) (c slowest, the kernel's
        taps row-major), each addition rounded to ``accumulate`` from +0 (or from the
        bias, fused); padded positions are +0 operands. The sum is rounded once to
        ``out_dtype`` (default: the operands' dtype). ``bias`` (O,) is placed as
        :meth:`matmul`'s is.
        """
        return self._conv("conv", x, w, stride, padding, dilation, groups, bias, accumulate, out_dtype, fuse_bias)

    def _conv(self, name: str, x, w, stride, padding, dilation, groups, bias, accumulate, out_dtype,
              fuse_bias) -> np.ndarray:
        x, w = np.asarray(x), np.asarray(w)
        if out_dtype is None:
            out_dtype = x.dtype if x.dtype == BFLOAT16.dtype else np.float16
        fused = self._fused(bias, fuse_bias)
        y = conv.forward(x, w, stride, padding, dilation, groups, self._grouped(name, accumulate, out_dtype),
                         np.asarray(bias) if fused else None, name)
        if bias is not None and not fused:
            y = self.add(y, self._bias_operand(bias, y.dtype).reshape(1, w.shape[0], *[1] * (x.ndim - 2)))
        return y

    def _grouped(self, name: str, accumulate, out_dtype) -> conv.Product:
        """The cube's product of stacks of matrices, one per group, for :mod:`sim.conv`."""
        def product(a: np.ndarray, b: np.ndarray, init: np.ndarray | None) -> np.ndarray:
            if a.shape[0] == 1:
                return self._product(name, a[0], b[0], accumulate, out_dtype,
                                     init=None if init is None else init[0])[None]
            return self._product(name, a, b, accumulate, out_dtype, init=init)
        return product

    def conv2d(self, x, w, stride: int = 1, padding: int = 0, dilation: int = 1, accumulate=None,
               out_dtype=np.float16) -> np.ndarray:
        """2-D cross-correlation (torch's conv2d, groups=1) of binary16 ``x`` (N, C, H, W) with
        ``w`` (O, C, KH, KW): (N, O, OH, OW); :meth:`conv` in two dimensions.

        Each output is one matmul row: the products x * w, exact, added in ascending order
        of the reduction index (c, kh, kw) (c slowest), each addition rounded to
        ``accumulate`` as :meth:`matmul` does, from +0; padded positions are +0 operands.
        The sum is rounded once to ``out_dtype``. One device operation.
        """
        x, w = np.asarray(plain(x)), np.asarray(plain(w))
        if x.ndim != 4 or w.ndim != 4 or x.shape[1] != w.shape[1]:
            raise ValueError(f"conv2d needs x (N, C, H, W) and w (O, C, KH, KW), got {x.shape} and {w.shape}")
        for name, v, low in (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)):
            integer(f"conv2d: {name}", v, low)
        return self._conv("conv2d", x, w, stride, padding, dilation, 1, None, accumulate, out_dtype, None)

    def conv_grad_input(self, dy, w, input_size, stride=1, padding=0, dilation=1, groups: int = 1,
                        accumulate=None, out_dtype=None, bias=None, fuse_bias: bool | None = None) -> np.ndarray:
        """The gradient of :meth:`conv` with respect to its input (N, C, *input_size), from the
        output gradient ``dy`` (N, O, *OS) and the weight ``w`` (O, C / groups, *K); also a
        transposed convolution of ``dy`` with ``w``.

        As the cube unit computes it, a direct convolution (:meth:`conv`, stride 1): ``dy``
        with stride - 1 zeros stuffed between its elements and dilation * (K - 1) - padding
        zeros around it (cropped where negative), with the weight's taps reversed and its
        O and C / groups axes swapped per group. So each input gradient is one binary32 sum,
        from +0, of the exact products dy * w in ascending order of (o, the dy position), o
        slowest, stuffed zeros being +0 operands, rounded once. ``bias`` (C,) is placed
        as :meth:`conv` places it (a transposed convolution's bias).
        """
        dy, w = np.asarray(dy), np.asarray(w)
        z, flipped, dilation = conv.grad_input_operands(dy, w, input_size, stride, padding, dilation, groups)
        return self._conv("conv_grad_input", z, flipped, 1, 0, dilation, groups, bias, accumulate, out_dtype,
                          fuse_bias)

    def conv_grad_weight(self, x, dy, kernel_size, stride=1, padding=0, dilation=1, groups: int = 1,
                         accumulate=None, out_dtype=None) -> np.ndarray:
        """The gradient of :meth:`conv` with respect to its weight (O, C / groups, *kernel_size),
        from the input ``x`` (N, C, *S) and the output gradient ``dy`` (N, O, *OS).

        As the cube unit computes it, one matmul per group of dy^T (O/g, N*OS) with x's
        im2col (N*OS, C/g*K): each weight gradient is one binary32 sum, from +0, of the exact
        products in ascending order of (n, the output position row-major), n slowest, padded
        positions being +0 operands, rounded once.
        """
        x, dy = np.asarray(x), np.asarray(dy)
        if out_dtype is None:
            out_dtype = x.dtype if x.dtype == BFLOAT16.dtype else np.float16
        return conv.grad_weight(x, dy, kernel_size, stride, padding, dilation, groups,
                                self._grouped("conv_grad_weight", accumulate, out_dtype))

    def conv_transpose(self, x, w, stride=1, padding=0, output_padding=0, dilation=1, groups: int = 1,
                       bias=None, accumulate=None, out_dtype=None, fuse_bias: bool | None = None) -> np.ndarray:
        """Transposed convolution (torch's conv_transpose1d/2d/3d) of ``x`` (N, Cin, *S) with
        ``w`` (Cin, Cout / groups, *K): :meth:`conv_grad_input` of ``x`` for an input of
        (S - 1) * stride - 2 * padding + dilation * (K - 1) + output_padding + 1, in its order;
        ``bias`` (Cout,) as :meth:`conv` places it."""
        x, w = np.asarray(x), np.asarray(w)
        size = conv.transpose_size(x.shape, w.shape, stride, padding, output_padding, dilation)
        return self.conv_grad_input(x, w, size, stride, padding, dilation, groups, accumulate, out_dtype, bias,
                                    fuse_bias)

    def sum(self, x, axis: int | None = None, accumulate=None, out_dtype=None) -> np.ndarray:
        """Sum along ``axis`` (all if None) in a fixed pairwise tree (adjacent pairs, then
        pairs of pairs, ...), each addition rounded to ``accumulate`` (default: x's dtype);
        the total is rounded to ``out_dtype`` (default: x's dtype).

        In x's own dtype the additions are the device's, each in its overflow mode (in
        saturation mode a NaN becomes 0 and an Inf MAX at the addition that makes it). An
        ``accumulate`` of another dtype is the reduction unit's own register, IEEE inside as
        :meth:`amax`'s pairs are: each element enters it converted in INF/NaN mode (exactly,
        NaN and Inf included, where the dtype widens), the additions raise IEEE's flags, and
        the overflow mode applies once, to the total rounded into ``out_dtype``. So in
        saturation mode sum([NaN, 1, 2]) is 0 in any order, [Inf, -Inf] gives 0 with INVALID,
        [Inf, Inf] gives MAX with no OVERFLOW (an infinity of infinite operands is no overflow),
        and a binary16 mean of [Inf, Inf] is MAX, as the mean of [Inf] is."""
        return self._reduce(x, axis, accumulate, out_dtype, mean=False)

    def mean(self, x, axis: int | None = None, accumulate=None, out_dtype=None) -> np.ndarray:
        """``sum`` (rounded as the sum is, in ``accumulate``) divided by the count as an exact
        number and rounded once to ``out_dtype``; the mean of nothing is NaN (INVALID)."""
        return self._reduce(x, axis, accumulate, out_dtype, mean=True)

    def amax(self, x, axis: int | None = None) -> np.ndarray:
        """The IEEE 754-2019 maximum along ``axis`` (all if None): NaN if any element is NaN
        (INVALID for a signaling one), +0 above -0; exact, with the overflow mode applied to
        the result once (saturation: NaN -> 0, Inf -> MAX). Empty: ValueError."""
        return self._extremum("amax", "maximum", x, axis)

    def amin(self, x, axis: int | None = None) -> np.ndarray:
        """The IEEE 754-2019 minimum along ``axis``, as :meth:`amax`; -0 below +0."""
        return self._extremum("amin", "minimum", x, axis)

    def _extremum(self, name: str, op: str, x, axis) -> np.ndarray:
        x = plain(x)
        fpu = self._on(x)
        fmt = fpu.format
        v, rest = _columns(x, axis, fmt, name)
        if v.shape[0] == 0:
            raise ValueError(f"{op} reduction of an empty axis has no result (no identity)")
        # Pairs of rows in INF/NaN mode, so that a NaN is not saturated to 0 half-way; the
        # device's mode applies to the result.
        ieee, kernel = self._ieee(fmt), fpu.kernels[op]
        status = 0
        while v.shape[0] > 1:
            half = v.shape[0] // 2
            pair = np.empty((half, v.shape[1]), fmt.uint)
            status |= kernel(v[:half].ravel(), v[half:2 * half].ravel(), pair.reshape(-1),
                             np.empty(pair.size, np.uint8), ieee)
            v = np.concatenate([pair, v[2 * half:]]) if v.shape[0] % 2 else pair
        out = np.empty(v.shape[1], fmt.uint)
        self._record(status | K.convert(v.reshape(-1), out, np.empty(out.size, np.uint8), fpu.settings, fpu.settings),
                     name, out.size)
        result = out.view(fmt.dtype)
        return result[0] if axis is None else result.reshape(rest)

    def _ieee(self, fmt: Format) -> np.ndarray:
        """Kernel settings for ``fmt`` in the device's rounding, INF/NaN mode."""
        fpu = self._fpus[fmt.dtype]
        return config(fmt, fpu.rounding, OverflowMode.INF_NAN, fpu.tininess, fpu.default_nan, False)

    def _reduce(self, x, axis, accumulate, out_dtype, mean: bool) -> np.ndarray:
        x = plain(x)
        src = self._on(x)
        acc = src if accumulate is None else self._unit(accumulate, "accumulate")
        dst = src if out_dtype is None else self._unit(out_dtype, "out_dtype")
        v, rest = _columns(x, axis, src.format, "mean" if mean else "sum")
        out = np.empty(v.shape[1], dst.format.uint)
        inside = acc.settings if acc is src else self._ieee(acc.format)
        status = K.tree_sum(v, out, src.settings, inside, dst.settings, mean)
        self._record(status, "mean" if mean else "sum", out.size)
        total = out.view(dst.format.dtype)
        return total[0] if axis is None else total.reshape(rest)


# -- the methods of the table's operations ---------------------------------------------------

def _method(op: ops.Op) -> Callable:
    """The Device method of ``op``: one call into the device's path for its kind, its signature
    and docstring as if written out by hand."""
    name, code, signaling = op.name, op.code, op.signaling
    if op.kind == ops.COMPARE and op.negate:
        def method(self, a, b) -> np.ndarray:
            return ~self._compare(name, code, signaling, a, b)
    elif op.kind == ops.COMPARE and op.swap:
        def method(self, a, b) -> np.ndarray:
            return self._compare(name, code, signaling, b, a)
    elif op.kind == ops.COMPARE:
        def method(self, a, b) -> np.ndarray:
            return self._compare(name, code, signaling, a, b)
    elif op.kind == ops.ELEMENTARY:
        def method(self, a) -> np.ndarray:
            return self._elementary(name, code, a)
    elif op.kind == ops.BINARY and op.short:
        def method(self, a, b) -> np.ndarray:
            return self._binary(name, a, b)
    elif op.arity == 1:
        def method(self, a) -> np.ndarray:
            return self._op(name, a)
    else:
        def method(self, a, b) -> np.ndarray:
            return self._op(name, a, b)
    method.__name__, method.__qualname__, method.__doc__ = name, f"Device.{name}", op.doc
    return method


for _op in ops.OPS:
    if _op.device and _op.elementwise and _op.kind != ops.OTHER:
        setattr(Device, _op.name, _method(_op))
