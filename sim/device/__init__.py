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
mode unless ``saturate_float32=False``. That, tininess, the default NaN and NaN in saturation
mode are the device's ``choices`` (``sim.rounding.Choices``): its profile's, each changed by
name in the constructor. A result is rounded in the settings
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

The package's files: ``core`` (``Device``, made of the parts below), ``register`` (the
float-status register, the event log, labels, tags, observers, substitutes), ``elementwise``,
``casts``, ``cube`` (matmul, FP8, MX, convolutions) and ``reductions``.
"""

from .register import EVENTS, SUBSTITUTABLE

# Device, Event, Observer, LegacyModeWarning and current_device are public as sim's (sim.Device...),
# matrix_stacks as sim.device.cube's: one import path each.
__all__ = ["EVENTS", "SUBSTITUTABLE"]
