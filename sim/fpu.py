"""The public elementwise face of the emulator: settings plus a sticky status."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from . import kernels as K
from . import ops
from .checks import integer
from .formats import BINARY16, BINARY32, Format, format_of
from .rounding import Choices, Flag, OverflowMode, Rounding, Tininess, config

__all__: list[str] = []  # Fpu's one public path is sim.Fpu

_Out = np.ndarray | tuple[np.ndarray, np.ndarray]

_BINARY = {op.name: op.kernel for op in ops.of_kind(ops.BINARY)}
#: Where binary64 adds a format's values exactly (binary16), sums skip the TwoSum.
_EXACT_SUMS = {op.name: op.exact_kernel for op in ops.of_kind(ops.BINARY) if op.exact_kernel is not None}


def binary_kernel(op: str, fmt: Format):
    """The compiled kernel of a binary operation on values of ``fmt``."""
    return _EXACT_SUMS[op] if op in _EXACT_SUMS and fmt.sum_exact_in_float64 else _BINARY[op]
_ELEMENTARY = {op.name: op.code for op in ops.of_kind(ops.ELEMENTARY)}
_COMPARE = {op.name: op.code for op in ops.of_kind(ops.COMPARE, where="fpu")}
_NO_INEXACT = 0x1F & ~(Flag.INEXACT | Flag.UNDERFLOW)
_CHOICES = Choices()  # a unit's choices where none are given


def filled(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """x broadcast to ``shape`` as a new contiguous array (the kernels loop over contiguous memory)."""
    out = np.empty(shape, x.dtype)
    np.copyto(out, x)
    return out


def _is_satfinite(overflow) -> bool:
    return isinstance(overflow, str) and overflow.strip().lower() == "satfinite"


def _overflow_mode(overflow) -> OverflowMode:
    """``overflow`` parsed, the error naming every accepted setting."""
    try:
        return OverflowMode.parse(overflow)
    except ValueError:
        raise ValueError(f"unknown overflow {overflow!r}; valid: SATURATION (sat/saturate), INF_NAN (infnan/ieee), "
                         f"satfinite (SATURATION with NaN kept)") from None


def _quiet_nan(value, fmt: Format) -> int:
    """``value`` checked as the bits of a quiet NaN of ``fmt`` (for ``default_nan``)."""
    lo, top = fmt.inf_bits | fmt.quiet_bit, fmt.sign_bit - 1
    neg = fmt.sign_bit
    valid = f"valid: the bits of a quiet NaN of {fmt.name}, {lo:#x}..{top:#x} or {lo | neg:#x}..{top | neg:#x}"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"default_nan must be an integer bit pattern, got {value!r} ({type(value).__name__}); {valid}")
    v = int(value)
    mag = v & top
    if v < 0:
        what = "negative"
    elif v >> fmt.width:
        what = f"wider than {fmt.name}'s {fmt.width} bits"
    elif mag >= lo:
        return v
    elif mag > fmt.inf_bits:
        what = "a signaling NaN"
    elif mag == fmt.inf_bits:
        what = "an infinity"
    elif mag == 0:
        what = "a zero"
    else:
        what = "a subnormal number" if mag < 1 << fmt.man_bits else "a finite number"
    raise ValueError(f"default_nan {v:#x} is {what}, not a quiet NaN; {valid}" if v >= 0 else
                     f"default_nan {v} is {what}, not a quiet NaN; {valid}")


def plain(x):
    """``x`` as the kernels read it: a big-endian (non-native) array or scalar converted to native
    byte order (a copy); a masked array refused, since the kernels would drop its mask."""
    if x.__class__ is np.ndarray and x.dtype.isnative:
        return x
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError("masked arrays are not supported (their mask would be lost): pass x.filled(value) "
                        "or x.compressed(), a plain numpy array")
    dtype = getattr(x, "dtype", None)
    if isinstance(dtype, np.dtype) and not dtype.isnative and isinstance(x, (np.ndarray, np.generic)):
        return x.astype(dtype.newbyteorder("="))
    return x


class Result(NamedTuple):
    """One operation's result, its per-element flags and their OR."""

    value: np.ndarray
    flags: np.ndarray
    status: int


def finish(result: Result, shape: tuple[int, ...], scalar: bool, return_flags: bool) -> _Out:
    """A flat result as callers get it: shaped, a scalar where every operand was one, with its
    flags where asked."""
    out = result.value.reshape(shape)
    if not return_flags:
        return out[()] if scalar else out
    flags = result.flags.reshape(shape)
    return (out[()], flags[()]) if scalar else (out, flags)


#: Conversions of at least this many elements into a narrow format read a table (``Fpu._lookup``).
_LOOKUP_MIN = 1 << 14
#: Tables of a kernel's results and flags on every class of input, by what the kernel reads (for
#: these conversions: source, destination and settings): (codes, flags), shared by every unit and device.
_TABLES: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def tabulated(key: tuple, make: Callable[[], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The table ``key`` names, made by ``make()`` on first use: a kernel's (codes, flags) on every
    class of input, so that a large call reads it (``sim.kernels.lookup``) instead of rounding
    each element. ``key`` starts with the table's kind and holds every setting the kernel reads."""
    table = _TABLES.get(key)
    if table is None:
        table = _TABLES[key] = make()
    return table


def classes32(shift: int) -> np.ndarray:
    """One binary32 input (bits) per class of ``sim.kernels.lookup``'s key for ``shift``: the
    sign, the exponent and the fraction's bits above ``shift``, then whether any bit below is set.
    A deterministic rounding to fewer than 23 - shift fraction bits reads nothing else of its
    input (the kept bits, the guard bit, the sticky bit; and a NaN payload's top bits), so a
    table of its results on these inputs is its result on every input (see ``Fpu._lookup``)."""
    keys = np.arange(1 << (33 - shift), dtype=np.int64)
    return ((keys >> 1) << shift) | (keys & 1)


#: Results of at least this many binary32 elements round into a 16-bit format by a table
#: (:func:`narrowing32`: made once per pair of settings, then read at about half the cost of
#: rounding each element).
NARROWING_MIN = 1 << 16


def narrowing32(n: int, src: Format, src_cfg: np.ndarray, dst: Format,
                cfg: np.ndarray) -> tuple[int, np.ndarray, np.ndarray] | None:
    """The conversion kernel from ``src`` (settings ``src_cfg``) into ``dst`` (settings ``cfg``)
    as a table, where it serves ``n`` elements: (shift, codes, flags) for ``sim.kernels.lookup``,
    made on first use; None unless ``n`` reaches :data:`NARROWING_MIN`, the source is binary32,
    the destination a 16-bit format and the rounding deterministic. binary16 (2**21 entries) and
    bfloat16 (2**18): their subnormals' rounding bits lie where their normals' do, binary32's
    subnormals included (bfloat16 shares binary32's exponent range)."""
    if n < NARROWING_MIN or src is not BINARY32 or dst.dtype.itemsize != 2 or cfg[K.MODE] >= K.STOCHASTIC:
        return None
    shift = 23 - (dst.man_bits + 1)

    def make() -> tuple[np.ndarray, np.ndarray]:
        reps = classes32(shift).astype(np.uint32)
        codes, flags = np.empty(reps.size, dst.uint), np.empty(reps.size, np.uint8)
        K.convert(reps, codes, flags, src_cfg, cfg)
        return codes, flags

    codes, flags = tabulated(("narrow32", src_cfg.tobytes(), cfg.tobytes(), dst.man_bits), make)
    return shift, codes, flags


class Fpu:
    """A binary16 floating-point unit (or bfloat16, binary32: ``format=``).

    Every operation rounds once, in ``rounding``, and returns the IEEE result
    (``OverflowMode.INF_NAN``) or the Ascend saturated one (``SATURATION``:
    +-Inf -> +-MAX, NaN -> +0, or NaN kept with ``nan_to_zero=False``, as OCP
    FP8 does). ``overflow="satfinite"`` is the same setting as ``convert``'s:
    ``SATURATION`` with ``nan_to_zero=False`` (overflow and Inf -> +-MAX, NaN kept),
    for every operation. Per-element flags are the IEEE flags in both modes; ``status``
    is their sticky OR since the last :meth:`clear_status`. NaN results are
    the format's canonical quiet NaN (``default_nan`` overrides the bits: a quiet NaN's).
    ``choices`` (:class:`sim.rounding.Choices`; a device passes its product's) gives the
    implementation-defined choices that ``tininess`` and ``nan_to_zero`` do not name;
    input payloads are not propagated, except by ``neg`` and ``abs``, which
    are sign-bit operations.

    ``rounding="stochastic"`` draws each element's random bits from a counter-based
    source keyed by ``seed`` and the operation's sequence number on this unit, so the
    same seed and the same sequence of operations give the same bits, whatever the
    array's chunking. ``random_bits``: how many random bits are added below the kept
    ones (None: all that are dropped, which makes the rounding exactly unbiased; K bits
    leave a bias below 2**-K ulp, as hardware with K random bits has).

    Operands are numpy arrays or scalars; big-endian ones are converted to native byte
    order, masked arrays are refused (fill or compress them first).

    The elementwise methods are made from :data:`sim.ops.OPS`. Within sim, the device
    computes through :meth:`run`, :meth:`operands`, :meth:`settings_for`, :meth:`cast_to`,
    the attributes ``settings``, ``kernels`` and ``uint``, and this module's :func:`finish`
    and :func:`filled`.
    """

    def __init__(
        self,
        overflow: OverflowMode | str = OverflowMode.INF_NAN,
        rounding: Rounding | str = Rounding.NEAREST_EVEN,
        tininess: Tininess | str | None = None,
        *,
        format: Format | str = BINARY16,
        nan_to_zero: bool | None = None,
        default_nan: int | None = None,
        seed: int = 0,
        random_bits: int | None = None,
        choices: Choices | None = None,
    ) -> None:
        satfinite = _is_satfinite(overflow)
        if satfinite and nan_to_zero:
            raise ValueError("overflow='satfinite' keeps NaN (SATURATION with nan_to_zero=False); "
                             "nan_to_zero=True contradicts it: use overflow='saturation' for NaN -> 0")
        self.overflow = OverflowMode.SATURATION if satfinite else _overflow_mode(overflow)
        self.rounding = Rounding.parse(rounding)
        self.seed = integer("seed", seed, 0)
        self.random_bits = None if random_bits is None else integer("random_bits", random_bits, 1, 62,
                                                                    "None (every dropped bit)")
        self._draws = 0
        choices = _CHOICES if choices is None else choices
        if not isinstance(choices, Choices):
            raise TypeError(f"choices must be a sim.rounding.Choices, got {type(choices).__name__}")
        self.tininess = choices.tininess if tininess is None else Tininess.parse(tininess)
        self.format = format_of(format)
        if self.format.precision > 25:
            raise ValueError(f"Fpu computes in formats of at most 25 significand bits "
                             f"(binary16, bfloat16, binary32), not {self.format.name}")
        self.nan_to_zero = (False if satfinite else choices.nan_to_zero) if nan_to_zero is None else bool(nan_to_zero)
        self.default_nan = self.format.default_nan if default_nan is None else _quiet_nan(default_nan, self.format)
        self._status = 0
        self._configs: dict[tuple, np.ndarray] = {}
        #: The kernels' settings for results in this unit's format (see :meth:`settings_for`).
        self.settings = config(self.format, self.rounding, self.overflow, self.tininess, self.default_nan,
                               self.nan_to_zero, random_bits=self._bits)
        #: The compiled kernel of each binary operation on this unit's format.
        self.kernels = {op: binary_kernel(op, self.format) for op in _BINARY}
        #: The unsigned integer dtype of the format's bits.
        self.uint = self.format.uint

    def __repr__(self) -> str:
        keep = ", nan_to_zero=False" if self.overflow is OverflowMode.SATURATION and not self.nan_to_zero else ""
        return (f"Fpu(overflow={self.overflow.name}{keep}, rounding={self.rounding.name}, "
                f"tininess={self.tininess.name}, format={self.format.name})")

    @property
    def _bits(self) -> int:
        return 63 if self.random_bits is None else self.random_bits

    def _keyed(self, cfg: np.ndarray) -> np.ndarray:
        """``cfg`` with the next operation's random key, where it rounds stochastically."""
        if cfg[K.MODE] != K.STOCHASTIC:
            return cfg
        cfg = cfg.copy()
        z = (self.seed * 0x9E3779B97F4A7C15 + self._draws * 0xD1B54A32D192ED03 + 1) % 2**64
        z = ((z ^ (z >> 33)) * 0xFF51AFD7ED558CCD) % 2**64
        cfg[K.KEY] = (z ^ (z >> 33)) >> 1
        self._draws += 1
        return cfg

    # -- status ---------------------------------------------------------------
    @property
    def status(self) -> Flag:
        """OR of every flag raised since the last clear (sticky)."""
        return Flag(self._status)

    def clear_status(self) -> None:
        self._status = 0

    def raise_status(self, flags: int) -> None:
        """Add ``flags`` to the sticky status, as an operation that raised them would (a caller that
        replays a kept result's flags)."""
        self._status |= int(flags)

    # -- arithmetic -------------------------------------------------------------
    def rint(self, a, *, exact: bool = False, return_flags: bool = False) -> _Out:
        """Round to an integral value in the current rounding mode.

        IEEE ``roundToIntegral``: no INEXACT unless ``exact=True``
        (``roundToIntegralExact``); never UNDERFLOW.
        """
        keep = _NO_INEXACT | (Flag.INEXACT if exact else 0)
        return self._public("rint", (a,), return_flags, cfg=self.settings_for(self.format, quantum=0, keep=keep))

    def relu(self, a, *, return_flags: bool = False) -> _Out:
        """max(a, 0) with +0 for -0; NaN stays NaN (the default NaN): IEEE 754-2019 maximum(a, +0)."""
        return self._public("maximum", (a, self.format.dtype.type(0)), return_flags)

    def via_float64(self, fn: Callable, *args, pole: Callable | None = None, return_flags: bool = False) -> _Out:
        """``fn`` computed in binary64 from the exact operands, rounded once.

        For a function whose binary64 result carries what the rounding needs (see
        :mod:`sim.kernels`); the built-in transcendentals are their own methods. A
        binary64 overflow from finite operands is an overflow; ``pole(*xs)`` marks
        where an infinite result is exact (log(0)): DIVBYZERO. A NaN from non-NaN
        operands is INVALID, and so is a signaling NaN operand.
        """
        fmt = self.format
        flat, shape, scalar = self.operands("via_float64", args, fmt)
        xs = [b.view(fmt.dtype).astype(np.float64) for b in flat]
        with np.errstate(all="ignore"):
            r = np.asarray(fn(*xs), np.float64)
            finite_in = np.logical_and.reduce([np.isfinite(x) for x in xs])
            nan_in = np.logical_or.reduce([np.isnan(x) for x in xs])
            at_pole = pole(*xs) if pole is not None else np.zeros(r.shape, bool)
            overflow = np.isinf(r) & finite_in & ~at_pole
            r = np.where(overflow, np.copysign(np.finfo(np.float64).max, r), r)
        special = (np.isnan(r) & ~nan_in) * np.uint8(Flag.INVALID) | (np.isinf(r) & at_pole) * np.uint8(Flag.DIVBYZERO)
        for b in flat:
            special |= self._is_snan(b) * np.uint8(Flag.INVALID)
        bits = np.empty(r.size, fmt.uint)
        flags = np.empty(r.size, np.uint8)
        K.round_values(np.ascontiguousarray(r).reshape(-1), bits, flags, self._keyed(self.settings_for(fmt)))
        flags |= special
        self._status |= int(np.bitwise_or.reduce(flags, initial=0))
        return finish(Result(bits.view(fmt.dtype), flags, 0), shape, scalar, return_flags)

    def _is_snan(self, bits: np.ndarray) -> np.ndarray:
        fmt = self.format
        mag = bits & fmt.uint.type(fmt.sign_bit - 1)
        return (mag > fmt.inf_bits) & ((mag & fmt.uint.type(fmt.quiet_bit)) == 0)

    # -- conversions ------------------------------------------------------------
    def convert(self, x, dtype, *, rounding: Rounding | str | None = None, overflow: OverflowMode | str | None = None,
                return_flags: bool = False) -> _Out:
        """Convert between binary16, bfloat16, binary32 and binary64, or from them into the 8-bit
        formats (:data:`sim.formats.EIGHT_BIT`, by name or ml_dtypes dtype; HiFloat8 results are
        uint8 codes).

        Narrowing rounds in ``rounding`` (default: the unit's); widening is exact. The
        overflow mode (default: the unit's) applies to every result: ``INF_NAN`` is IEEE's,
        and OCP's non-saturating casts (E4M3FN overflows to NaN, E5M2 to Inf);
        ``SATURATION`` is Ascend's (Inf -> +-MAX, NaN -> +0, or kept with ``nan_to_zero=False``);
        ``"satfinite"`` is OCP's saturating cast (overflow and Inf -> +-MAX, NaN kept). A
        signaling NaN raises INVALID; so does a value with no encoding (an infinity where the
        result is NaN; zero or a negative value into E8M0, which become its NaN).
        """
        src = self._format_of_array(x, "convert")
        if src.dtype.itemsize == 1:
            raise TypeError(f"convert: {src.name} values widen exactly with numpy's astype "
                            f"(or sim.formats.decode); the unit rounds from binary16, bfloat16, binary32, binary64")
        dst = format_of(dtype)
        mode = None if rounding is None else Rounding.parse(rounding)
        if dst.dtype.itemsize == 1 or mode is not None or overflow is not None:
            result, shape, scalar = self._cast(x, src, dst, mode, overflow)
            return finish(result, shape, scalar, return_flags)
        return self._public("convert", (x,), return_flags, src=src, dst=dst)

    def _cast(self, x, src: Format, dst: Format, rounding: Rounding | None,
              overflow: OverflowMode | str | None, lookup: bool = True) -> tuple[Result, tuple[int, ...], bool]:
        """A conversion with its own rounding and overflow mode, packed into the destination's codes."""
        mode, nan_to_zero = self.overflow, self.nan_to_zero
        if _is_satfinite(overflow):
            mode, nan_to_zero = OverflowMode.SATURATION, False
        elif overflow is not None:
            mode = _overflow_mode(overflow)
        rounding = rounding or self.rounding
        nan = self.default_nan if dst == self.format else None
        cfg = config(dst, rounding, mode, self.tininess, nan, nan_to_zero, random_bits=self._bits, source=src)
        looked_up = self._lookup(x, src, dst, rounding, overflow, cfg) if lookup else None
        if looked_up is not None:
            return looked_up
        before = self._status
        result, shape, scalar = self.run("convert", (x,), src=src, dst=dst, cfg=cfg)
        if dst.pack is None and dst.signed:
            return result, shape, scalar
        self._status = before  # the status is the OR of the final element flags, set below
        bits, flags = result.value.view(dst.uint), result.flags
        if not dst.signed:  # E8M0: no sign and no zero
            with np.errstate(invalid="ignore"):  # a signaling NaN widens quietly
                v = np.asarray(x).reshape(-1).astype(np.float64)
            bad = v <= 0
            flags[bad] = Flag.INVALID
        codes = dst.pack[bits] if dst.pack is not None else bits.astype(np.uint8)
        status = int(np.bitwise_or.reduce(flags, initial=0))
        self._status |= status
        return Result(codes.view(dst.dtype), flags, status), shape, scalar

    def _lookup(self, x, src: Format, dst: Format, rounding: Rounding, overflow: OverflowMode | str | None,
                cfg: np.ndarray) -> tuple[Result, tuple[int, ...], bool] | None:
        """A large conversion into an 8-bit or narrower signed format, read from a table of the
        rounding routine's own results (None where it does not apply). A 16-bit source's table
        holds all 65,536 inputs. A binary32 source's holds one input per class: the sign, the
        exponent, the top p fraction bits (p: the destination's fraction bits and one more) and
        whether any bit below is set, which is all a deterministic rounding to at most p - 1
        fraction bits reads (the kept bits, the guard bit, the sticky bit; and the NaN payload's
        top bits), down to the destination's least subnormal, above binary32's subnormals. Not
        for stochastic rounding, which reads every bit (and draws), nor, from binary32, HiFloat8's
        hybrid rounding, whose threshold is the source's low bits; not for E8M0, whose least value
        2**-127 lies among binary32's subnormals."""
        if (np.size(x) < _LOOKUP_MIN or dst.dtype.itemsize != 1 or not dst.signed or rounding is Rounding.STOCHASTIC
                or src.dtype.itemsize not in (2, 4) or (src.dtype.itemsize == 4 and rounding is Rounding.HYBRID)):
            return None
        source = self.settings_for(src)
        shift = 0 if src.dtype.itemsize == 2 else 23 - (dst.man_bits + 1)

        def make() -> tuple[np.ndarray, np.ndarray]:
            reps = np.arange(1 << 16, dtype=np.int64) if shift == 0 else classes32(shift)
            before = self._status
            made, _, _ = self._cast(reps.astype(src.uint).view(src.dtype), src, dst, rounding, overflow, lookup=False)
            self._status = before
            return np.ascontiguousarray(made.value).view(np.uint8), made.flags

        table = tabulated(("narrow", src.name, dst.name, source.tobytes(), cfg.tobytes()), make)
        flat, shape, scalar = self.operands("convert", (x,), src)
        out, flags = np.empty(flat[0].size, np.uint8), np.empty(flat[0].size, np.uint8)
        status = K.lookup(flat[0], shift, table[0], table[1], out, flags)
        self._status |= status
        return Result(out.view(dst.dtype), flags, status), shape, scalar

    # -- machinery: its public names (and settings, kernels) are the device's interface --------
    def settings_for(self, fmt: Format, rounding: Rounding | None = None, quantum: int | None = None,
                     keep: int = 0x1F) -> np.ndarray:
        """The kernels' settings for results in ``fmt`` (cached: it is made on every call's path)."""
        if fmt is self.format and rounding is None and quantum is None and keep == 0x1F:
            return self.settings
        key = (fmt.name, rounding, quantum, keep)
        cfg = self._configs.get(key)
        if cfg is None:
            nan = self.default_nan if fmt == self.format else None
            cfg = config(fmt, rounding or self.rounding, self.overflow, self.tininess, nan, self.nan_to_zero,
                         quantum, keep, random_bits=self._bits)
            self._configs[key] = cfg
        return cfg

    def _format_of_array(self, x, op: str) -> Format:
        if not isinstance(x, (np.ndarray, np.generic)):
            raise TypeError(f"{op}: expected a numpy array or numpy scalar, got {type(x).__name__}; "
                            f"wrap values as np.asarray(x, dtype=...)")
        try:
            return format_of(x.dtype if x.dtype.isnative else x.dtype.newbyteorder("="))
        except ValueError:
            raise TypeError(f"{op}: unsupported dtype {x.dtype}; valid: float16, bfloat16, float32, float64") from None

    def operands(self, op: str, args: tuple, fmt: Format) -> tuple[list[np.ndarray], tuple[int, ...], bool]:
        """The operands as flat contiguous arrays of bits, the broadcast shape, and whether all were scalars."""
        dtype = fmt.dtype
        a = args[0]
        if a.__class__ is np.ndarray and a.dtype == dtype and len(args) <= 2:  # the common case, quickly
            if len(args) == 1:
                return [a.reshape(-1).view(fmt.uint)], a.shape, False
            b = args[1]
            if b.__class__ is np.ndarray and b.dtype == dtype and b.shape == a.shape:
                uint = fmt.uint
                return [a.reshape(-1).view(uint), b.reshape(-1).view(uint)], a.shape, False
        args = tuple(plain(x) for x in args)
        for name, x in zip("abc", args, strict=False):
            if not isinstance(x, (np.ndarray, np.generic)) or x.dtype != dtype:
                got = x.dtype if hasattr(x, "dtype") else type(x).__name__
                raise TypeError(f"{op}: operand {name} has dtype {got}; {fmt.name} operations take "
                                f"numpy {dtype} arrays or scalars (convert with fpu.convert(x, {dtype}))")
        shape = args[0].shape
        if any(x.shape != shape for x in args[1:]):
            try:
                shape = np.broadcast_shapes(*(x.shape for x in args))
            except ValueError:
                shapes = ", ".join(str(x.shape) for x in args)
                raise ValueError(f"{op}: operand shapes {shapes} do not broadcast together") from None
            args = tuple(x if x.shape == shape else filled(x, shape) for x in args)
        uint = fmt.uint
        flat = [np.asarray(x).reshape(-1).view(uint) for x in args]  # a copy only where not contiguous
        scalar = all(isinstance(x, np.generic) for x in args)
        return flat, shape, scalar

    def run(self, op: str, args: tuple, *, src: Format | None = None, dst: Format | None = None,
            cfg: np.ndarray | None = None) -> tuple[Result, tuple[int, ...], bool]:
        """One kernel call of ``op`` (a name in :data:`sim.ops.OPS`, ``convert`` or ``rint``), its flags
        into the status: the result (flat), its shape, and whether the operands were all scalars."""
        src = src or self.format
        dst = dst or self.format
        flat, shape, scalar = self.operands(op, args, src)
        n = flat[0].size
        out = np.empty(n, dst.uint)
        flags = np.empty(n, np.uint8)
        if cfg is None:
            cfg = self.settings if dst is self.format else self.settings_for(dst)
        cfg = self._keyed(cfg)
        if op in _BINARY:
            kernel = self.kernels[op] if src is self.format else binary_kernel(op, src)
            status = kernel(flat[0], flat[1], out, flags, cfg)
        elif op in _ELEMENTARY:
            status = K.elementary(_ELEMENTARY[op], flat[0], out, flags, self.settings_for(src), cfg)
        elif op == "convert" or op == "rint":
            status = K.convert(flat[0], out, flags, self.settings_for(src), cfg)
        elif op == "fma":
            status = K.fma(flat[0], flat[1], flat[2], out, flags, cfg)
        else:  # neg, abs
            status = K.sign_op(op == "neg", flat[0], out, flags, cfg)
        self._status |= status
        return Result(out.view(dst.dtype), flags, status), shape, scalar

    def cast_to(self, x, dst: Format, rounding: Rounding | None,
                overflow: OverflowMode | str | None) -> tuple[Result, tuple[int, ...], bool]:
        """``x`` (this unit's format) converted into ``dst`` with its own rounding and overflow mode,
        packed into ``dst``'s codes, flags into the status: as :meth:`run` returns."""
        return self._cast(x, self.format, dst, rounding, overflow)

    def _public(self, op: str, args: tuple, return_flags: bool, **kw) -> _Out:
        result, shape, scalar = self.run(op, args, **kw)
        return finish(result, shape, scalar, return_flags)

    def _compare(self, op: str, a, b, signaling: bool, return_flags: bool) -> _Out:
        fmt = self.format
        flat, shape, scalar = self.operands(op, (a, b), fmt)
        out = np.empty(flat[0].size, bool)
        flags = np.empty(out.size, np.uint8)
        self._status |= K.compare(_COMPARE[op], signaling, flat[0], flat[1], out, flags, self.settings_for(fmt))
        return finish(Result(out, flags, 0), shape, scalar, return_flags)


# -- the methods of the table's operations ---------------------------------------------------
def _method(op: ops.Op) -> Callable:
    """The Fpu method of ``op``: its signature and docstring as if written out by hand."""
    name = op.name
    if op.kind == ops.COMPARE:
        if op.signaling:
            def method(self, a, b, *, signaling: bool = True, return_flags: bool = False) -> _Out:
                return self._compare(name, a, b, signaling, return_flags)
        else:
            def method(self, a, b, *, signaling: bool = False, return_flags: bool = False) -> _Out:
                return self._compare(name, a, b, signaling, return_flags)
        doc = f"{op.doc} ``signaling``: INVALID for any NaN operand, not only a signaling one."
    elif op.arity == 1:
        def method(self, a, *, return_flags: bool = False) -> _Out:
            return self._public(name, (a,), return_flags)
    elif op.arity == 2:
        def method(self, a, b, *, return_flags: bool = False) -> _Out:
            return self._public(name, (a, b), return_flags)
    else:
        def method(self, a, b, c, *, return_flags: bool = False) -> _Out:
            return self._public(name, (a, b, c), return_flags)
    if op.kind != ops.COMPARE:
        doc = op.doc
    method.__name__, method.__qualname__, method.__doc__ = name, f"Fpu.{name}", doc
    return method


for _op in ops.OPS:
    if _op.fpu and _op.kind != ops.OTHER:
        setattr(Fpu, _op.name, _method(_op))
