"""The compiled core: one rounding routine, and every operation's loop around it.

Every kernel computes each result as a binary64 value ``r`` that carries all a
rounding needs, then hands it to :func:`round_pack`, the one routine that makes
rounding decisions (the shape of Berkeley SoftFloat's ``roundPackToF16``: sign,
exponent and a significand with sticky bits in; bits and flags out). ``r`` is
the exact result when that has at most p+1 significant bits, and otherwise lies
strictly between the same two consecutive (p+1)-bit numbers as the exact result
(p: the target's precision, at most 52). Then ``r`` tells every rounding mode
which side of each candidate and midpoint the exact value lies on, and whether
anything was lost. The operations meet that contract as follows:

- products of binary16, bfloat16 and binary32 values are exact in binary64;
- a quotient or square root of such values that is not exact lies at least
  2**-(2p+2) (relative) from every (p+1)-bit number, far more than binary64's
  error of 2**-53, so binary64's own correctly rounded ``/`` and ``sqrt`` serve;
- sums of two binary16 values are exact in binary64; other sums and fma use an
  error-free TwoSum that yields the exact sum rounded to odd at 53 bits;
- a quotient by a count (``mean``) is made round-to-odd with an exact
  remainder (Dekker's product);
- exp, log, tanh, sigmoid come from binary64 libm results, which are within a
  few binary64 ulps of the exact value; the result is then moved strictly inside
  the bounds the exact value is known to obey (exp x > 0, |tanh x| < min(1, |x|),
  0 < sigmoid x < 1, ...: see ``_unary_value``), so that where binary64 says
  exactly 0, +-1, 1/2 or ``x``, or lands just past such a bound, the rounding
  still sees the exact value's side. All 65,536 binary16 and bfloat16 inputs
  agree with MPFR in all six modes (``tests/sim_tests/test_transcendentals.py``).
- rsqrt: b, the (p+1)-bit number nearest to binary64's 1/sqrt(x), squared is
  exact (p <= 25), so the sign of fma(b*b, x, -1) says exactly whether the exact
  value is below, at or above b; r is b or its binary64 neighbour on that side.
- erf comes from binary64 libm and is moved inside 0 < |erf x| < min(1, 2|x|/sqrt(pi))
  as the other transcendentals are (erf is concave for x > 0).
- the binary32 matmul accumulation uses the IEEE fused multiply-add: binary16
  products are exact in binary32, so it is the addition with one rounding.

This module stays one file, past the project's 600 lines for a module: it is one idea, the
rounding routine and the loops that inline it, whose branches numba folds into each loop.

Numba's on-disk cache keys a cached loop by its own source file only ("changes in symbols defined
in another file are not detected", numba's "Notes on Caching"), and the loops of
``sim/binary32.py`` and ``sim/elementary/`` inline helpers from here and from each other. So the
caches of all the compiled files (:data:`COMPILED`) live and die together: at import, a digest of
their sources is checked against the one their caches were made under, and every compiled file's
cache is dropped when it differs (numba then compiles again). Caches under ``NUMBA_CACHE_DIR`` are
dropped too; the user-wide cache numba falls back to for a read-only tree is not (nothing there is
edited in place).

Format and settings travel as a small int64 array (:func:`config`), so one
compiled loop serves every format (the 8-bit ones too: where their overflow starts,
what an overflow, an infinity or a NaN becomes, HiFloat8's tapered precision), mode
(stochastic rounding draws counter-based random bits per element) and overflow mode; a loop is compiled
once per combination of operand array types, on first use, and cached. No
fastmath anywhere: the binary64 and binary32 operations are IEEE operations in
program order. The rounding is branch-free (selects and masks), so the loops
vectorise (in 512-bit vectors where the CPU has them: twice the lanes of LLVM's
default for Intel server parts, for the same instructions per vector); values
that need the subnormal quantum, and NaN results (whose INVALID needs the
operands' bits), are marked HARD on the fast path and valued and rounded again
in full, gathered in a loop of their own.

Flag bits are SoftFloat's: INEXACT 1, UNDERFLOW 2, OVERFLOW 4, DIVBYZERO 8, INVALID 16.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic
from numba.np.unsafe.ndarray import to_fixed_tuple

# -- settings layout ---------------------------------------------------------------------
#: The settings array's fields, by name, in their places: the one place that knows the order.
#: The format's come from :class:`sim.formats.Encoding` (``taper`` fills taper1..3), the
#: rest from the rounding settings (:func:`config`).
SETTINGS = ("width", "man", "bias", "mode", "saturate", "before", "nan_bits", "nan_to_zero", "quantum", "keep",
            "limit", "max", "overflow", "inf", "nan_sign", "zero", "taper1", "taper2", "taper3", "tiny", "key",
            "random_bits", "source", "source_qmin")
_INDEX = {name: i for i, name in enumerate(SETTINGS)}
_N_SETTINGS = len(SETTINGS)
#: The places as the kernels' constants (numba folds module-level integers into the loops).
WIDTH, MAN, BIAS, MODE, SAT, BEFORE = (_INDEX[n] for n in ("width", "man", "bias", "mode", "saturate", "before"))
NAN_BITS, NAN_TO_ZERO, QUANTUM, KEEP = (_INDEX[n] for n in ("nan_bits", "nan_to_zero", "quantum", "keep"))
LIMIT, MAXB, OVER, INFB, NAN_SIGN, ZERO = (_INDEX[n] for n in ("limit", "max", "overflow", "inf", "nan_sign", "zero"))
TAPER1, TAPER2, TAPER3, TINY, KEY = (_INDEX[n] for n in ("taper1", "taper2", "taper3", "tiny", "key"))
RBITS, SOURCE, SOURCE_QMIN = (_INDEX[n] for n in ("random_bits", "source", "source_qmin"))
RNE, RTZ, DOWN, UP, RNA, ODD, STOCHASTIC, HYBRID = range(8)
INEXACT, UNDERFLOW, OVERFLOW, DIVBYZERO, INVALID = 1, 2, 4, 8, 16
# Operation codes.
ADD, SUB, MUL, DIV, MAX, MIN = range(6)
SQRT, EXP, LOG, TANH, SIGMOID, RSQRT, ERF, RECIPROCAL = range(8)
EQ, LT, LE = range(3)

EXP_INF = 1 << 20  # exponents handed to round_pack for Inf and NaN
EXP_NAN = EXP_INF + 1
_FRAC52 = (1 << 52) - 1

#: The files whose loops numba compiles and caches, relative to the package.
COMPILED = ("kernels.py", "binary32.py", "conv.py", "elementary/compiled.py", "elementary/pairs.py")


def _cache_dirs(path: Path) -> list[Path]:
    """Where numba may cache ``path``'s loops: its ``__pycache__``, and under ``NUMBA_CACHE_DIR``."""
    dirs = [path.parent / "__pycache__"]
    if nb.config.CACHE_DIR:
        try:  # numba's own mapping of a source file to its folder there (a private name: guarded)
            from numba.core.caching import _CacheLocator
            dirs.append(Path(nb.config.CACHE_DIR) / _CacheLocator.get_suitable_cache_subpath(str(path)))
        except (ImportError, AttributeError):
            pass
    return dirs


def _drop_stale_caches(root: Path = Path(__file__).parent) -> None:
    """Drops every compiled file's cached loops when any compiled source under ``root`` changed
    since they were cached: a loop inlines helpers of other files, which numba's per-file check
    cannot see."""
    files = [root / name for name in COMPILED]
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    stamp = root / "__pycache__" / "compiled.sha256"
    try:
        if stamp.read_text() == digest:
            return
    except OSError:  # no stamp: nothing says the caches there match these sources
        pass
    try:
        for f in files:
            for folder in _cache_dirs(f):
                for cached in folder.glob(f"{f.stem}.*.nb[ci]"):
                    cached.unlink(missing_ok=True)
        stamp.parent.mkdir(exist_ok=True)
        fresh = stamp.with_name(f"{stamp.name}.{os.getpid()}")
        fresh.write_text(digest)
        os.replace(fresh, stamp)  # whole or absent, whoever reads it
    except OSError:  # a read-only tree: numba caches elsewhere, and nothing here is edited
        pass


_drop_stale_caches()

jit = nb.njit(cache=True, nogil=True, error_model="numpy")  # IEEE division: x/0 is +-Inf or NaN
#: Helpers are inlined into each loop (numba does not inline across compiled functions by
#: itself); they are never called from Python, so they need no Python wrapper (less to compile).
inline = nb.njit(cache=True, nogil=True, error_model="numpy", forceinline=True, no_cpython_wrapper=True,
                 no_cfunc_wrapper=True)


def _bitcast(src, dst, llvm_type):
    """A scalar reinterpretation of bits (numba's scalar ``.view`` allocates)."""
    @intrinsic
    def cast(typingctx, x):
        return dst(src), lambda context, builder, signature, args: builder.bitcast(args[0], llvm_type)
    return cast


@intrinsic
def _clz(typingctx, x):
    """Leading zero bits of an int64 (64 for 0)."""
    def codegen(context, builder, signature, args):
        return builder.ctlz(args[0], ir.Constant(ir.IntType(1), 0))
    return types.int64(types.int64), codegen


@intrinsic
def _half_to_f64(typingctx, x):
    """binary16 bits (uint16) as a binary64 value: the hardware's exact widening (F16C)."""
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.DoubleType())
    return types.float64(types.uint16), codegen


def _fused(t):
    @intrinsic
    def fma(typingctx, x, y, z):
        """The IEEE fused multiply-add x * y + z (one rounding)."""
        return t(t, t, t), lambda context, builder, signature, args: builder.fma(*args)
    return fma


_fma, _fma64 = _fused(types.float32), _fused(types.float64)
fma64 = _fma64  #: the IEEE fused multiply-add in binary64, for the kernels of other modules


@intrinsic
def _wide_vectors(typingctx):
    """Let the loop vectoriser use 512-bit vectors in the calling function where the CPU has
    them (LLVM's per-function "prefer-vector-width"; Intel's default is 256 bits)."""
    def codegen(context, builder, signature, args):
        set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        return context.get_dummy_value()
    return types.none(), codegen


_f64_bits = _bitcast(types.float64, types.int64, ir.IntType(64))
_bits_f64 = _bitcast(types.int64, types.float64, ir.DoubleType())
_bits_f32 = _bitcast(types.uint32, types.float32, ir.FloatType())
f32_bits = _bitcast(types.float32, types.uint32, ir.IntType(32))  #: a binary32 value's bits


#: The taper threshold of formats whose precision does not taper (no exponent is that large).
NO_TAPER = 1 << 30


def config(encoding, mode: int, saturate: bool, before: bool, nan_bits: int | None, nan_to_zero: bool,
           quantum: int | None, keep: int, random_bits: int = 0, source: tuple[int, int] = (0, 0)) -> np.ndarray:
    """The settings array every kernel takes: a format's ``encoding`` (a
    :class:`sim.formats.Encoding`), a rounding mode, the overflow mode, tininess, the NaN it
    produces (None: the encoding's), for rounding to an integral value the coarsest quantum
    and the flags kept; for stochastic rounding the number of random bits (the key is set
    per operation: :data:`KEY`); for HiFloat8's hybrid rounding the source format's fraction
    bits and finest quantum. Filled by name from :data:`SETTINGS`."""
    if len(encoding.taper) > 3:
        raise ValueError(f"the rounding routine takes at most 3 taper thresholds, got {encoding.taper}")
    taper = (*encoding.taper, NO_TAPER, NO_TAPER, NO_TAPER)
    fields = {
        "width": encoding.width, "man": encoding.man, "bias": encoding.bias, "limit": encoding.limit,
        "max": encoding.max, "overflow": encoding.overflow, "inf": encoding.inf, "nan_sign": encoding.nan_sign,
        "zero": encoding.zero, "taper1": taper[0], "taper2": taper[1], "taper3": taper[2], "tiny": encoding.tiny,
        "mode": mode, "saturate": saturate, "before": before, "nan_to_zero": nan_to_zero, "keep": keep,
        "nan_bits": encoding.nan if nan_bits is None else nan_bits,
        "quantum": encoding.qmin if quantum is None else quantum,
        "key": 0, "random_bits": random_bits, "source": source[0], "source_qmin": source[1],
    }
    assert fields.keys() == _INDEX.keys(), sorted(fields.keys() ^ _INDEX.keys())
    cfg = np.empty(len(SETTINGS), np.int64)
    for name, value in fields.items():
        cfg[_INDEX[name]] = value
    return cfg


# -- the one rounding routine ---------------------------------------------------------------
# Written without data-dependent branches (selects only), so that the loops around it
# vectorise; the settings are loop-invariant.
@inline
def settings(cfg):
    """The settings array as a tuple: helpers take values, not arrays (no reference counting)."""
    return to_fixed_tuple(cfg, _N_SETTINGS)


@inline
def _abs_mask(cfg):
    return ~(-1 << (cfg[WIDTH] - 1))


@inline
def _inf_bits(cfg):
    return ((1 << (cfg[WIDTH] - 1 - cfg[MAN])) - 1) << cfg[MAN]


@inline
def saturate(bits, cfg):
    """Saturation mode's rule on a stored IEEE value: +-Inf -> +-MAX, NaN -> +0 (or kept), for the
    sign-bit operations; round_pack applies the same rule to every rounded result."""
    mag = bits & _abs_mask(cfg)
    inf = _inf_bits(cfg)
    out = bits - (mag == inf)
    out = 0 if (mag > inf) & (cfg[NAN_TO_ZERO] != 0) else out
    return out if cfg[SAT] != 0 else bits


@inline
def _shift_round(sig, s, sign, mode, rand=0, rbits=0, threshold=0):
    """``sig`` (below 2**62) shifted right by ``s`` (1..62) bits and rounded in ``mode``
    (the increment is added before the shift); and 1 if bits were lost. The mode enters
    as all-ones or zero masks (loop-invariant), not as branches or selects. Stochastic
    rounding adds the top min(rbits, s) bits of ``rand`` (63 random bits) below the kept ones;
    hybrid rounding rounds up where the top ``rbits`` dropped bits are non-zero and at
    least ``threshold``."""
    near, even = -np.int64((mode == RNE) | (mode == RNA)), -np.int64(mode == RNE)
    directed, up = -np.int64((mode == UP) | (mode == DOWN)), -np.int64(mode == UP)
    mask = (1 << s) - 1
    lost = np.int64((sig & mask) != 0)
    # Nearest: half, plus the last kept bit for ties to even, or plus one for ties away;
    # directed: all the dropped bits when rounding away from zero (sign against direction).
    inc = ((mask >> 1) & near) + (((sig >> s) & 1) & even) + np.int64(mode == RNA) \
        + (mask & (-sign ^ up) & directed)
    k = min(rbits, s)
    inc += (((rand >> (63 - k)) & ((1 << k) - 1)) << (s - k)) & -np.int64(mode == STOCHASTIC)
    top = (sig >> (s - k)) & ((1 << k) - 1)
    inc += (1 << s) & -np.int64((mode == HYBRID) & (top >= threshold) & (top != 0))
    kept = (sig + inc) >> s
    return kept | (lost & np.int64(mode == ODD)), lost


@inline
def random_bits(key, i):
    """63 random bits for element ``i`` of the operation keyed ``key``: SplitMix64's output
    function on a counter (Steele, Lea and Flood 2014), so element i's bits depend on the
    key and i alone, never on chunking or order."""
    z = np.uint64(key) + np.uint64(i + 1) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return np.int64((z ^ (z >> np.uint64(31))) >> np.uint64(1))


@inline
def round_pack(sign, exp, sig, cfg, normal=False, rand=0):
    """The value (-1)**sign * sig * 2**(exp - 61) rounded into the format of ``cfg``: (bits, flags).

    ``sig`` has its leading one at bit 61 (or is 0 for a zero); any non-zero bits
    below the kept ones count as sticky. ``exp`` is EXP_INF or EXP_NAN for an
    infinite or NaN result (exact; NaN becomes the configured NaN bits). Every
    rounding, tininess, overflow and inexact decision is made here, and the
    overflow mode is applied here; the operation adds INVALID and DIVBYZERO.
    Formats beyond IEEE's enter as data (:attr:`sim.formats.Format.encoding`): where
    overflow starts and what it, an infinity, a NaN and a zero become, and for a
    tapered format the exponent magnitudes above which a fraction bit fewer is kept.
    ``rand``: the element's random bits, for stochastic rounding.

    ``normal=True`` (a constant at the call) is the caller's promise that the quantum is
    the format's, the format not tapered, the rounding neither stochastic nor hybrid and
    tininess detected at 2**emin, and that a value below 2**emin is, where tininess is
    detected after rounding, below 2**(emin-1) (so tiny whichever way it rounds): the same
    decisions with the cases that cannot arise left out, so that loops vectorise.
    """
    width, man0, mode = cfg[WIDTH], cfg[MAN], cfg[MODE]
    emin = 1 - cfg[BIAS]
    qmin = emin - man0
    if normal:
        # A value below 2**emin is first shifted to exponent emin, its lost bits kept as one sticky
        # bit below the round bit: then one shift, the same for every element, keeps the bits
        # above the quantum.
        d = min(max(emin - exp, 0), 62)
        sig = (sig >> d) | np.int64((sig & ((1 << d) - 1)) != 0)
        kept, flags = _shift_round(sig, 61 - man0, sign, mode)
        bits = ((max(exp, emin) - man0 - qmin) << man0) + kept
        flags |= UNDERFLOW * ((d != 0) & (flags != 0))
    else:
        a = abs(exp)
        man = man0 - np.int64(a > cfg[TAPER1]) - np.int64(a > cfg[TAPER2]) - np.int64(a > cfg[TAPER3])
        q = max(exp - man, cfg[QUANTUM])
        s = q - exp + 61
        # HiFloat8's hybrid rounding (HR): ties away where |E| < 4; elsewhere up where the top
        # bits dropped reach a threshold taken from the source's own low bits (the 14 low
        # fraction bits of binary32; for 16-bit sources 2 bits, the last fraction bit and a 1;
        # the source's last bit is its quantum's, below 2**emin). Below 2**-23 only stickiness
        # is left, so the result is 0, as Ascend's reference conversion gives.
        low = (sig >> (61 - min(cfg[SOURCE], exp - cfg[SOURCE_QMIN]))) & ((1 << cfg[RBITS]) - 1)
        threshold = low if cfg[RBITS] > 2 else 2 * (low & 1) + 1
        mode = RNA if (mode == HYBRID) & (a < 4) else mode
        # Below half the quantum only stickiness is left (hybrid rounding then gives 0), except
        # that stochastic rounding keeps the value's top bits, shifted to s = 62, for its odds.
        below = min(max(s - 62, 0), 62)
        shifted = (sig >> below) | np.int64((sig & ((1 << below) - 1)) != 0)
        sig = shifted if mode == STOCHASTIC else np.int64(sig != 0) if below > 0 else sig
        s = min(s, 62)
        kept, flags = _shift_round(sig, s, sign, mode, rand, cfg[RBITS], threshold)
        # Tiny: below 2**emin before rounding, or (the default) still below it after rounding
        # to p bits with an unbounded exponent.
        tiny_exp = cfg[TINY]
        unbounded, _ = _shift_round(sig, 61 - man, sign, mode, rand, cfg[RBITS], threshold)
        after = (exp < tiny_exp - 1) | ((exp == tiny_exp - 1) & (unbounded < (2 << man)))
        tiny = exp < tiny_exp if cfg[BEFORE] != 0 else after
        flags |= UNDERFLOW * (tiny & (flags != 0))
        # A quantum coarser than the format's (round to integral, a tapered format) leaves
        # kept unnormalised.
        shift = q - qmin if kept == 0 else max(0, min(_clz(kept) - (63 - man0), q - qmin))
        bits = ((q - shift - qmin) << man0) + (kept << shift)
    # Overflow: away from zero (by the mode's direction) to Inf, or the format's stand-in;
    # else, and always when saturating, to MAX.
    sat = cfg[SAT] != 0
    over = bits >= cfg[LIMIT]
    away = np.int64((mode == RNE) | (mode == RNA) | (mode >= STOCHASTIC)) | (np.int64(mode == UP) & (1 - sign)) \
        | (np.int64(mode == DOWN) & sign)
    top = cfg[MAXB]
    bits = (top if sat | (away == 0) else cfg[OVER]) if over else bits
    flags |= (OVERFLOW | INEXACT) * over
    # Exact results: zeros and Inf keep their sign, NaN is the configured NaN; saturation
    # makes Inf MAX and NaN +0 (unless kept).
    special = exp >= EXP_INF
    nan = exp > EXP_INF
    bits = (top if sat else cfg[INFB]) if special else bits
    bits = cfg[ZERO] if sig == 0 else bits
    nan_bits = cfg[NAN_BITS] ^ ((sign << (width - 1)) & -cfg[NAN_SIGN])
    nan_bits = cfg[ZERO] if sat & (cfg[NAN_TO_ZERO] != 0) else nan_bits  # E8M0 has no zero: NaN stays
    bits = nan_bits if nan else bits | (sign << (width - 1))
    # A NaN or an infinity the format cannot hold, where the overflow mode does not map it (to
    # MAX, or NaN to 0), is invalid: IEEE 754-2019 section 5.8's rule for a conversion whose
    # destination cannot represent a NaN or infinite operand. So an infinity into E4M3FN (its NaN)
    # or E8M0 (its NaN), and an infinity or a NaN into FP6 and FP4 (MAX, a zero), in INF/NaN mode.
    no_inf = (cfg[INFB] == cfg[NAN_BITS]) | (cfg[INFB] == top)
    no_nan = cfg[NAN_BITS] == (1 << (width - 1))
    invalid = INVALID * ((special & ~nan & ~sat & no_inf) | (nan & no_nan & ~(sat & (cfg[NAN_TO_ZERO] != 0))))
    return bits, invalid if special | (sig == 0) else flags & cfg[KEEP]


@inline
def split64(x):
    """A binary64 value as round_pack's (sign, exp, sig)."""
    u = _f64_bits(np.float64(x))
    sign = (u >> 63) & 1
    e = (u >> 52) & 0x7FF
    f = u & _FRAC52
    shift = _clz(f) - 11  # subnormal: normalise
    sig = f << (shift + 9) if e == 0 else (f | (1 << 52)) << 9
    exp = -1022 - shift if e == 0 else e - 1023
    exp = EXP_INF + (f != 0) if e == 0x7FF else exp
    return sign, exp, sig


@inline
def round64(x, cfg, rand=0):
    """A binary64 value (see the module's contract) rounded into ``cfg``: (bits, flags);
    ``rand``: the element's random bits, for stochastic rounding."""
    sign, exp, sig = split64(x)
    return round_pack(sign, exp, sig, cfg, False, rand)


HARD = 0x80  # a flags value no operation raises: "round this element again, in full"
_HARD8 = 0x8080808080808080  # HARD in each byte of a word


@jit
def _hard_indices(flags, count):
    """The ``count`` indices whose flags are HARD, in order, skipping eight clear bytes at a time."""
    idx = np.empty(count, np.int64)
    n = flags.size
    words = flags[: n - n % 8].view(np.uint64)
    j = 0
    for w in range(words.size):
        if words[w] & np.uint64(_HARD8):
            for i in range(8 * w, 8 * w + 8):
                if flags[i] & HARD:
                    idx[j] = i
                    j += 1
    for i in range(n - n % 8, n):
        if flags[i] & HARD:
            idx[j] = i
            j += 1
    return idx


@inline
def round64_fast(x, cfg):
    """round64 for the common case, (bits, flags); flags is HARD where round_pack's promise
    for ``normal=True`` does not hold (a value in [2**(emin-1), 2**emin) with tininess after
    rounding; a quantum other than the format's, a tapered format, stochastic or hybrid
    rounding) and for a binary64 subnormal, which the caller rounds again with round64."""
    u = _f64_bits(x)
    e = (u >> 52) & 0x7FF
    f = u & _FRAC52
    zero = (e == 0) & (f == 0)
    exp = EXP_INF + (f != 0) if e == 0x7FF else e - 1023
    sig = 0 if zero else (f | (1 << 52)) << 9
    bits, flags = round_pack((u >> 63) & 1, exp, sig, cfg, True)
    emin = 1 - cfg[BIAS]
    edge = (exp == emin - 1) & (cfg[BEFORE] == 0)
    hard = (((e == 0) | edge) & ~zero) | (cfg[QUANTUM] != emin - cfg[MAN]) | (cfg[MODE] >= STOCHASTIC) \
        | (cfg[TAPER1] != NO_TAPER) | (cfg[TINY] != emin)
    return bits, HARD if hard else flags


@inline
def _round_value(x, cfg):
    """round64 by way of the fast path, for loops that round one value at a time."""
    bits, flags = round64_fast(x, cfg)
    return round64(x, cfg) if flags & HARD else (bits, flags)


@inline
def decode(bits, cfg):
    """A format value's bits as a binary64 number (exact)."""
    width = cfg[WIDTH]
    b = np.int64(bits)
    wide = np.float64(_bits_f32(np.uint32(b << 16 if width == 16 else b)))  # bfloat16, binary32
    v = _half_to_f64(np.uint16(b)) if cfg[MAN] == 10 else wide
    return _bits_f64(b) if width == 64 else v


@inline
def is_snan(bits, cfg):
    mag = np.int64(bits) & _abs_mask(cfg)
    return (mag > _inf_bits(cfg)) & ((mag & (1 << (cfg[MAN] - 1))) == 0)


@inline
def add64(x, y, down, exact=False):
    """x + y as round_pack needs it: the exact sum rounded to odd at 53 bits (TwoSum;
    ``exact=True``, a constant, where binary64 adds the format's values exactly); an
    exact zero sum of opposite-signed operands is -0 when rounding downward. The only
    place these two rules live."""
    s = x + y
    if not exact:
        bb = s - x
        err = (x - (s - bb)) + (y - bb)
        u = _f64_bits(s)
        fix = (err != 0) & ((u & 1) == 0) & math.isfinite(s)
        step = 1 if (err > 0) == (s > 0) else -1  # one ulp towards the exact sum
        s = _bits_f64(u + step) if fix else s
    opposite = math.copysign(1.0, x) != math.copysign(1.0, y)
    return -0.0 if (s == 0) & down & opposite else s


@inline
def _binary_value(op, exact, x, y, down):
    if op == ADD:
        return add64(x, y, down, exact)
    if op == SUB:
        return add64(x, -y, down, exact)
    if op == MUL:
        return x * y
    if op == DIV:
        return x / y
    # IEEE 754-2019 maximum / minimum: NaN if either is NaN, +0 above -0.
    first = (x > y) if op == MAX else (x < y)
    tie = (math.copysign(1.0, x) > 0) if op == MAX else (math.copysign(1.0, x) < 0)
    r = x if first | ((x == y) & tie) else y
    return np.nan if math.isnan(x) | math.isnan(y) else r


@inline
def _binary_at(operands, i, cfg, full):
    """Element i of a binary operation (op, exact, a, b): its binary64 value and its INVALID
    and DIVBYZERO flags (binary operations on these formats cannot overflow binary64)."""
    op, exact, a, b = operands
    x, y = decode(a[i], cfg), decode(b[i], cfg)
    r = _binary_value(op, exact, x, y, cfg[MODE] == DOWN)
    zero_div = DIVBYZERO * ((op == DIV) & (y == 0) & (x != 0) & math.isfinite(x))
    if not full:
        return r, HARD if math.isnan(r) else zero_div
    invalid = is_snan(a[i], cfg) | is_snan(b[i], cfg) | (math.isnan(r) & ~(math.isnan(x) | math.isnan(y)))
    return r, INVALID * invalid | zero_div


@jit
def _round_hard(values, special, idx, out, flags, cfg):
    """The rare elements (indices ``idx``, their values and operation flags) rounded in full,
    in a loop of their own, and put back; returns the OR of their flags. Compiled once and
    shared by every operation (it is off the fast path)."""
    bits = np.empty(values.size, np.int64)
    fl = np.empty(values.size, np.int64)
    sr = cfg[MODE] == STOCHASTIC
    for j in range(values.size):
        bits[j], fl[j] = round64(values[j], cfg, random_bits(cfg[KEY], idx[j]) if sr else 0)
    status = 0
    for j in range(idx.size):
        f = fl[j] | special[j]
        out[idx[j]] = bits[j]
        flags[idx[j]] = f
        status |= f
    return status


@inline
def _rounded(value_at, operands, out, flags, cfg):
    """The loop of every rounded elementwise operation: ``value_at(operands, i, cfg, full)``
    gives element i's binary64 value (see the contract) and the flags the operation itself
    raises, or with ``full=False`` HARD where those flags take more work (NaN results). The
    fast path rounds the value; the rare elements are valued and rounded again in full, in
    a loop of their own. Returns the OR of the flags."""
    _wide_vectors()
    status = 0
    hard = 0
    for i in range(out.size):
        r, special = value_at(operands, i, cfg, False)
        bits, fl = round64_fast(r, cfg)
        fl |= special
        out[i] = bits
        flags[i] = fl
        status |= fl
        hard += fl >> 7
    if hard == 0:
        return status
    idx = _hard_indices(flags, hard)
    values, special = np.empty(hard, np.float64), np.empty(hard, np.int64)
    for j in range(hard):
        values[j], special[j] = value_at(operands, idx[j], cfg, True)
    return (status & ~HARD) | _round_hard(values, special, idx, out, flags, cfg)


# One compiled function per operation, so that a program compiles only what it uses
# (each function once per combination of array types). The operation's code and exactness
# enter the shared loop as run-time values, not literals, so that the loop and its helpers
# compile once per array types for all eight (LLVM still folds the constants after inlining).
_op, _flag = np.int64, np.bool_

@jit
def add(a, b, out, flags, cfg):
    """out = a + b elementwise (bits of one format), its flags; returns the OR of the flags."""
    return _rounded(_binary_at, (_op(ADD), _flag(False), a, b), out, flags, settings(cfg))


@jit
def add_exact(a, b, out, flags, cfg):
    """:func:`add` for a format whose sums binary64 holds exactly (binary16): no TwoSum."""
    return _rounded(_binary_at, (_op(ADD), _flag(True), a, b), out, flags, settings(cfg))


@jit
def sub(a, b, out, flags, cfg):
    """out = a - b, as :func:`add`."""
    return _rounded(_binary_at, (_op(SUB), _flag(False), a, b), out, flags, settings(cfg))


@jit
def sub_exact(a, b, out, flags, cfg):
    """:func:`sub` for a format whose sums binary64 holds exactly (binary16)."""
    return _rounded(_binary_at, (_op(SUB), _flag(True), a, b), out, flags, settings(cfg))


@jit
def mul(a, b, out, flags, cfg):
    """out = a * b, as :func:`add`."""
    return _rounded(_binary_at, (_op(MUL), _flag(False), a, b), out, flags, settings(cfg))


@jit
def div(a, b, out, flags, cfg):
    """out = a / b, as :func:`add`."""
    return _rounded(_binary_at, (_op(DIV), _flag(False), a, b), out, flags, settings(cfg))


@jit
def maximum(a, b, out, flags, cfg):
    """out = IEEE 754-2019 maximum(a, b), as :func:`add`."""
    return _rounded(_binary_at, (_op(MAX), _flag(False), a, b), out, flags, settings(cfg))


@jit
def minimum(a, b, out, flags, cfg):
    """out = IEEE 754-2019 minimum(a, b), as :func:`add`."""
    return _rounded(_binary_at, (_op(MIN), _flag(False), a, b), out, flags, settings(cfg))


@inline
def _fma_at(operands, i, cfg, full):
    a, b, c = operands
    x, y, z = decode(a[i], cfg), decode(b[i], cfg), decode(c[i], cfg)
    p = x * y
    r = add64(p, z, cfg[MODE] == DOWN)
    if not full:
        return r, HARD if math.isnan(r) else 0
    nan_in = math.isnan(x) | math.isnan(y)
    invalid = (is_snan(a[i], cfg) | is_snan(b[i], cfg) | is_snan(c[i], cfg)
               | (math.isnan(p) & ~nan_in)  # 0 * Inf, whatever the addend (as SoftFloat)
               | (math.isnan(r) & ~(nan_in | math.isnan(z))))
    return r, INVALID * invalid


@jit
def fma(a, b, c, out, flags, cfg):
    """out = a * b + c with one rounding, its flags; returns the OR of the flags."""
    return _rounded(_fma_at, (a, b, c), out, flags, settings(cfg))


@inline
def _inside(r, lo, hi):
    """r moved strictly inside (lo, hi), where the exact value is known to lie: a binary64
    libm result within an ulp or two of a bound may sit on it or beyond it. Where no
    binary64 number lies inside, the odd one of the two bounds: it is no (p+1)-bit
    number for any p <= 51, so it stands for the exact value in every rounding."""
    if lo < r < hi:
        return r
    up = np.nextafter(lo, np.inf)
    if up >= hi:
        return lo if _f64_bits(lo) & 1 else hi
    return up if r <= lo else np.nextafter(hi, -np.inf)


@inline
def _exact_sum(a, b):
    """a + b if binary64 holds it exactly, else NaN (a bound that cannot be used)."""
    s = a + b
    return s if (s - a == b) & (s - b == a) else np.nan


_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)


@inline
def _rsqrt(x, man):
    """1/sqrt(x) for x > 0 as the contract needs it, for a target of man + 1 <= 25 bits: b,
    the (man+2)-bit number nearest binary64's estimate, if the exact value is b, else b's
    binary64 neighbour on the exact value's side (the sign of b*b*x - 1, exactly)."""
    r = 1.0 / math.sqrt(x)
    if man > 23:  # beyond binary32 b*b is not exact: binary64's estimate (not correctly rounded)
        return r
    u = _f64_bits(r)
    drop = 51 - man
    b = _bits_f64((u + (1 << (drop - 1))) & ~((1 << drop) - 1))
    side = _fma64(b * b, x, -1.0)  # b*b is exact; one rounding keeps the sign
    return b if side == 0 else np.nextafter(b, 0.0 if side > 0 else np.inf)


rsqrt_value = _rsqrt  #: 1/sqrt(x) meeting the contract, for the kernels of other modules


@inline
def _unary_value(op, x, man):
    """(r, flags) for the transcendental and elementwise unary operations on a binary64 operand,
    for a target with ``man`` fraction bits.

    Where the exact value is transcendental, r is the binary64 value moved inside the
    bounds the exact value is known to obey (so that its side of every rounding boundary
    near those bounds is right): exp x > 0, > 1 iff x > 0, >= 1 + x; |tanh x| < min(|x|, 1);
    0 < sigmoid x < 1, > 1/2 iff x > 0, on the far side of 1/2 + x/4 from 1/2; log x
    < 0 iff x < 1, <= x - 1. Comparisons with a NaN bound are false: no bound.
    """
    if math.isnan(x):
        return x, 0
    if op == SQRT:
        r = math.sqrt(x)
        return r, (INVALID if math.isnan(r) else 0)
    if op == RECIPROCAL:  # a quotient of such values: binary64's / serves
        return 1.0 / x, DIVBYZERO * (x == 0)
    if op == RSQRT:
        if x == 0:
            return math.copysign(np.inf, x), DIVBYZERO  # IEEE 754 rSqrt(+-0) = +-Inf
        if x < 0:
            return np.nan, INVALID
        if math.isinf(x):
            return 0.0, 0
        return _rsqrt(x, man), 0
    if op == ERF:
        if math.isinf(x) or x == 0:
            return (math.copysign(1.0, x) if x != 0 else x), 0
        bound = min(1.0, np.nextafter(abs(x) * _TWO_OVER_SQRT_PI, np.inf))
        return math.copysign(_inside(abs(math.erf(x)), 0.0, bound), x), 0
    if math.isinf(x):
        if op == EXP:
            return (x if x > 0 else 0.0), 0
        if op == LOG:
            return (x if x > 0 else np.nan), (0 if x > 0 else INVALID)
        if op == TANH:
            return math.copysign(1.0, x), 0
        return (1.0 if x > 0 else 0.0), 0  # SIGMOID
    if op == LOG:
        if x < 0:
            return np.nan, INVALID
        if x == 0:
            return -np.inf, DIVBYZERO
        if x == 1:
            return 0.0, 0
        r = math.log(x)
        bound = _exact_sum(x, -1.0)
        if x > 1:
            return _inside(r, 0.0, bound if bound == bound else np.inf), 0
        return _inside(r, -np.inf, bound if bound == bound else 0.0), 0
    if x == 0:  # exact: exp 1, tanh +-0, sigmoid 1/2
        return (1.0 if op == EXP else x if op == TANH else 0.5), 0
    if op == EXP:
        r = math.exp(x)
        if math.isinf(r):
            return 1.5 * 2.0**1023, 0  # beyond every format: round_pack overflows it
        lo = _exact_sum(1.0, x)
        return (_inside(r, max(1.0, lo) if lo == lo else 1.0, np.inf) if x > 0
                else _inside(r, max(0.0, lo) if lo == lo else 0.0, 1.0)), 0
    if op == TANH:
        r = _inside(abs(math.tanh(x)), 0.0, min(abs(x), 1.0))
        return math.copysign(r, x), 0
    # SIGMOID, without cancellation: 1 / (1 + e**-x), or e**x / (1 + e**x) for x < 0.
    e = math.exp(-abs(x))
    r = 1.0 / (1.0 + e) if x > 0 else e / (1.0 + e)
    mid = _exact_sum(0.5, 0.25 * x)
    if x > 0:
        return _inside(r, 0.5, min(1.0, mid) if mid == mid else 1.0), 0
    return _inside(r, max(0.0, mid) if mid == mid else 0.0, 0.5), 0


@inline
def _convert_at(operands, i, cfg, full):
    a, src = operands
    x = decode(a[i], src)
    if not full:
        return x, HARD if math.isnan(x) else 0
    return x, INVALID * is_snan(a[i], src)


@jit
def convert(a, out, flags, src, cfg):
    """out = a (bits in format ``src``) rounded into ``cfg`` (also to an integral value, by the
    quantum ``cfg`` says), its flags; returns the OR of the flags."""
    return _rounded(_convert_at, (a, settings(src)), out, flags, settings(cfg))


@jit
def lookup(a, shift, codes, table_flags, out, flags):
    """A conversion read from a table the rounding routine made of every class of input (see
    ``sim.fpu.Fpu``'s tables): out = codes[k], flags = table_flags[k], where k is ``a``'s bits
    (``shift`` 0) or its bits above ``shift`` then whether any bit below is set; returns the OR
    of the flags."""
    status = 0
    mask = (1 << shift) - 1
    for i in range(a.size):
        b = np.int64(a[i])
        k = b if shift == 0 else ((b >> shift) << 1) | np.int64((b & mask) != 0)
        out[i] = codes[k]
        f = table_flags[k]
        flags[i] = f
        status |= f
    return status


@jit
def sign_op(negate, a, out, flags, cfg):
    """out = -a (``negate``) or |a|: sign-bit operations, NaNs included, quiet; saturated in
    saturation mode."""
    cfg = settings(cfg)
    sign_bit = 1 << (cfg[WIDTH] - 1)
    for i in range(a.size):
        bits = np.int64(a[i])
        out[i] = saturate(bits ^ sign_bit if negate else bits & (sign_bit - 1), cfg)
        flags[i] = 0
    return 0


@inline
def _elementary_at(operands, i, cfg, full):
    op, a, src = operands
    r, fl = _unary_value(op, decode(a[i], src), cfg[MAN])
    return r, fl | INVALID * is_snan(a[i], src)


@jit
def elementary(op, a, out, flags, src, cfg):
    """out = op(a) for SQRT, EXP, LOG, TANH, SIGMOID, RSQRT, ERF, RECIPROCAL (a's bits in format ``src``), its
    flags; returns the OR of the flags."""
    return _rounded(_elementary_at, (op, a, settings(src)), out, flags, settings(cfg))


@jit
def round_values(x, out, flags, cfg):
    """Round binary64 values (meeting the module's contract) into ``cfg``."""
    _wide_vectors()
    cfg = settings(cfg)
    status = 0
    sr = cfg[MODE] == STOCHASTIC
    for i in range(x.size):
        bits, fl = round64(x[i], cfg, random_bits(cfg[KEY], i) if sr else 0)
        out[i] = bits
        status |= fl
        flags[i] = fl
    return status


@jit
def compare(op, signaling, a, b, out, flags, cfg):
    """out = a == b, a < b or a <= b; INVALID for a signaling NaN, or any NaN when ``signaling``."""
    _wide_vectors()
    cfg = settings(cfg)
    status = 0
    for i in range(a.size):
        x, y = decode(a[i], cfg), decode(b[i], cfg)
        if op == EQ:
            out[i] = x == y
        elif op == LT:
            out[i] = x < y
        else:
            out[i] = x <= y
        fl = 0
        if (signaling and (math.isnan(x) or math.isnan(y))) or is_snan(a[i], cfg) or is_snan(b[i], cfg):
            fl = INVALID
        status |= fl
        flags[i] = fl
    return status


# -- reductions and matrix products ---------------------------------------------------------
@inline
def _div_odd(s, n):
    """s / n (n a positive integer below 2**53) rounded to odd at 53 bits, via an exact remainder."""
    q = s / n
    if not math.isfinite(q) or q == 0:
        return q
    # Dekker: q * n = hi + lo exactly (Veltkamp splits of q and n).
    c = 134217729.0  # 2**27 + 1
    t = c * q
    qh = t - (t - q)
    ql = q - qh
    t = c * n
    nh = t - (t - n)
    nl = n - nh
    hi = q * n
    lo = ((qh * nh - hi) + qh * nl + ql * nh) + ql * nl
    rem = (s - hi) - lo  # exact: hi is within an ulp of s
    if rem != 0:
        u = _f64_bits(q)
        if (u & 1) == 0:
            u += 1 if (rem > 0) == (q > 0) else -1
            q = _bits_f64(u)
    return q


@inline
def _pair(x0, x1, acc, down, fast):
    """x0 + x1 rounded into ``acc``: (the value, its flags)."""
    s = add64(x0, x1, down)
    bits, flags = round64_fast(s, acc) if fast else round64(s, acc)
    return decode(bits, acc), flags | INVALID * (math.isnan(s) & ~(math.isnan(x0) | math.isnan(x1)))


@inline
def _pair_rne32(x0, x1):
    """:func:`_pair` where ``acc`` is IEEE binary32 rounding to nearest even: the sum (round to
    odd at 53 bits by add64, so that one more rounding is correct) rounded by the hardware's
    binary32 conversion, with the flags that rounding raises (INEXACT where it lost bits,
    OVERFLOW with INEXACT where a finite sum became infinite, INVALID as _pair's)."""
    s = add64(x0, x1, False)
    r = np.float64(np.float32(s))
    flags = INVALID * (math.isnan(s) & ~(math.isnan(x0) | math.isnan(x1)))
    if math.isinf(r) and not math.isinf(s):
        flags |= OVERFLOW | INEXACT
    elif r != s and not math.isnan(s):
        flags |= INEXACT
    return r, flags


@inline
def _element(b, src, acc, fast):
    """b (bits of format ``src``) rounded into ``acc``: (the value, its flags)."""
    bits, flags = round64_fast(decode(b, src), acc) if fast else round64(decode(b, src), acc)
    return decode(bits, acc), flags | INVALID * is_snan(b, src)


@jit
def tree_sum(x, out, src, acc, dst, mean, rne32=False):
    """Sum each column of ``x`` (n, C) in a fixed pairwise tree: adjacent pairs, then pairs of
    pairs, each addition rounded into ``acc``; each element is first rounded into ``acc``
    (where ``acc`` is ``src``'s format the elements enter as they are, NaN and Inf
    included, as the operands of the device's additions do). The column totals are
    rounded into ``dst`` (for ``mean``, divided exactly by n first, one rounding).
    Returns the OR of the flags. Each row of a level is one vectorised loop over the
    columns; the rare elements are rounded again in full. ``rne32``: ``acc`` is IEEE binary32
    rounding to nearest even (the caller checked its settings), whose additions the hardware
    rounds (:func:`_pair_rne32`), and a 16-bit source widens into it exactly."""
    _wide_vectors()
    src = settings(src)
    acc = settings(acc)
    dst = settings(dst)
    n, cols = x.shape
    down = acc[MODE] == DOWN
    v = np.zeros((max(n, 1), cols), np.float64)
    row_value = np.empty(cols, np.float64)
    row_flags = np.empty(cols, np.uint8)
    status = 0
    same = (src[WIDTH] == acc[WIDTH]) & (src[MAN] == acc[MAN]) & (src[BIAS] == acc[BIAS])
    # The elements enter exactly where acc is src's format (no rounding, and no overflow mode
    # applied to an operand) or a 16-bit format widens into IEEE binary32: a signaling NaN alone raises.
    exact = same | (rne32 & (src[WIDTH] == 16))
    for r in range(n):
        xr = x[r]
        row = 0
        if exact:
            for c in range(cols):
                row_value[c] = decode(xr[c], src)
                row |= INVALID * is_snan(xr[c], src)
            for c in range(cols):
                v[r, c] = row_value[c]
            status |= row
            continue
        for c in range(cols):
            row_value[c], fl = _element(xr[c], src, acc, True)
            row_flags[c] = fl
            row |= fl
        if row & HARD:
            row &= ~HARD
            for c in range(cols):
                if row_flags[c] & HARD:
                    row_value[c], fl = _element(xr[c], src, acc, False)
                    row |= fl
        for c in range(cols):  # loops, not array assignment: that costs seconds of compiling
            v[r, c] = row_value[c]
        status |= row
    m = max(n, 1)
    while m > 1:
        half = m // 2
        for r in range(half):
            v0, v1 = v[2 * r], v[2 * r + 1]
            row = 0
            if rne32:
                for c in range(cols):
                    row_value[c], fl = _pair_rne32(v0[c], v1[c])
                    row |= fl
                for c in range(cols):
                    v[r, c] = row_value[c]
                status |= row
                continue
            for c in range(cols):
                row_value[c], fl = _pair(v0[c], v1[c], acc, down, True)
                row_flags[c] = fl
                row |= fl
            if row & HARD:
                row &= ~HARD
                for c in range(cols):
                    if row_flags[c] & HARD:
                        row_value[c], fl = _pair(v0[c], v1[c], acc, down, False)
                        row |= fl
            for c in range(cols):
                v[r, c] = row_value[c]
            status |= row
        if m % 2 == 1:
            for c in range(cols):
                v[half, c] = v[m - 1, c]
            half += 1
        m = half
    for c in range(cols):
        t = v[0, c]
        if mean:
            t = _div_odd(t, np.float64(n)) if n > 0 else np.nan
            status |= INVALID if n == 0 else 0
        bits, fl = round64(t, dst)
        out[c] = bits
        status |= fl
    return status


@jit
def tree32(v, out, count):
    """The pairwise tree of :func:`tree_sum` (adjacent rows, then pairs of pairs) with IEEE
    binary32 additions to nearest even: out[c] is the sum over the rows r = a * B + b, in that
    order, of v[a, c, b] for v (A, C, B) binary32 (a reduction over leading and trailing axes
    around kept ones, read where they lie), divided by ``count`` (a binary32 integer; 0: none)
    with one rounding; +0 for no rows, a NaN result the canonical quiet NaN."""
    _wide_vectors()
    na, cols, nb_ = v.shape
    n = na * nb_
    w = np.empty(max((n + 1) // 2, 1), np.float32)
    for c in range(cols):
        if n == 0:
            out[c] = 0
            continue
        if n == 1:
            out[c] = v[0, c, 0]
        else:
            half = n // 2
            if nb_ % 2 == 0:  # pairs never straddle a row of b
                for a in range(na):
                    src, base = v[a, c], a * (nb_ // 2)
                    for j in range(nb_ // 2):
                        w[base + j] = src[2 * j] + src[2 * j + 1]
            else:
                for r in range(half):
                    r0, r1 = 2 * r, 2 * r + 1
                    w[r] = v[r0 // nb_, c, r0 % nb_] + v[r1 // nb_, c, r1 % nb_]
                if n % 2:
                    w[half] = v[na - 1, c, nb_ - 1]
            m = half + n % 2
            while m > 1:  # in place: w[r] is written after w[2r] and w[2r + 1] are read
                half = m // 2
                for r in range(half):
                    w[r] = w[2 * r] + w[2 * r + 1]
                if m % 2:
                    w[half] = w[m - 1]
                m = half + m % 2
            out[c] = w[0]
        if count != 0:
            out[c] = out[c] / count
        if out[c] != out[c]:
            out[c] = np.float32(np.nan)


@jit
def largest_magnitude(u, mask):
    """The largest ``u & mask`` over the unsigned integers u (a float array's bits, ``mask`` all
    but the sign bit): at or above the format's infinity's bits where an Inf or a NaN is there,
    above them where a NaN is. One vectorised pass, no temporary (numpy's isnan and isfinite
    write a boolean array first)."""
    m = u.dtype.type(0)
    for i in range(u.size):
        v = u[i] & mask
        m = v if v > m else m
    return m


@inline
def _fma32(x, y, z):
    return _fma(np.float32(x), np.float32(y), np.float32(z))


#: matmul32's blocks: columns and steps of k whose panel of b (256 x 512 binary32, 512 KB) stays
#: in cache while every row of a passes over it.
_COLUMNS, _STEPS = 512, 256


@jit
def matmul32(a, b, acc):
    """acc[i] += sum over k, in ascending order, of a[i, k] * b[k]: binary32, each addition
    rounded to nearest even, the order along k the program's.

    The operands are binary16 values, so each product is exact in binary32 and
    fma(a, b, acc) is the same IEEE addition acc + a * b with one rounding. The work goes
    by blocks of columns and of k (each output still adds its products in ascending k);
    four rows share each row of b and four steps of k share each load and store of acc.
    """
    k_dim, n = a.shape[1], b.shape[1]
    for j0 in range(0, n, _COLUMNS):
        j1 = min(j0 + _COLUMNS, n)
        for k0 in range(0, k_dim, _STEPS):
            _matmul32_block(a, b, acc, k0, min(k0 + _STEPS, k_dim), j0, j1)


@jit
def _matmul32_block(a, b, acc, k0, k1, j0, j1):
    """matmul32's additions of steps k0..k1 into columns j0..j1 (row slices: contiguous, so the
    loops along them vectorise)."""
    hi = a.shape[0]
    i = 0
    while i + 4 <= hi:
        r0, r1, r2, r3 = acc[i, j0:j1], acc[i + 1, j0:j1], acc[i + 2, j0:j1], acc[i + 3, j0:j1]
        n = r0.size
        k = k0
        while k + 4 <= k1:
            b0, b1, b2, b3 = b[k, j0:j1], b[k + 1, j0:j1], b[k + 2, j0:j1], b[k + 3, j0:j1]
            a00, a01, a02, a03 = a[i, k], a[i, k + 1], a[i, k + 2], a[i, k + 3]
            a10, a11, a12, a13 = a[i + 1, k], a[i + 1, k + 1], a[i + 1, k + 2], a[i + 1, k + 3]
            a20, a21, a22, a23 = a[i + 2, k], a[i + 2, k + 1], a[i + 2, k + 2], a[i + 2, k + 3]
            a30, a31, a32, a33 = a[i + 3, k], a[i + 3, k + 1], a[i + 3, k + 2], a[i + 3, k + 3]
            for j in range(n):
                x0, x1, x2, x3 = b0[j], b1[j], b2[j], b3[j]
                r0[j] = _fma32(a03, x3, _fma32(a02, x2, _fma32(a01, x1, _fma32(a00, x0, r0[j]))))
                r1[j] = _fma32(a13, x3, _fma32(a12, x2, _fma32(a11, x1, _fma32(a10, x0, r1[j]))))
                r2[j] = _fma32(a23, x3, _fma32(a22, x2, _fma32(a21, x1, _fma32(a20, x0, r2[j]))))
                r3[j] = _fma32(a33, x3, _fma32(a32, x2, _fma32(a31, x1, _fma32(a30, x0, r3[j]))))
            k += 4
        while k < k1:
            bk = b[k, j0:j1]
            a0, a1, a2, a3 = a[i, k], a[i + 1, k], a[i + 2, k], a[i + 3, k]
            for j in range(n):
                x = bk[j]
                r0[j] = _fma32(a0, x, r0[j])
                r1[j] = _fma32(a1, x, r1[j])
                r2[j] = _fma32(a2, x, r2[j])
                r3[j] = _fma32(a3, x, r3[j])
            k += 1
        i += 4
    for r in range(i, hi):  # the last rows, one at a time
        row = acc[r, j0:j1]
        for k in range(k0, k1):
            aik = a[r, k]
            bk = b[k, j0:j1]
            for j in range(row.size):
                row[j] = _fma32(aik, bk[j], row[j])


@jit
def accumulate32(dst, index, values):
    """dst[index[i]] += values[i] for i in order (flat binary32 arrays): each addition rounded once
    to binary32 to nearest even, so repeated indices accumulate in the order given."""
    for i in range(index.size):
        j = index[i]
        dst[j] = np.float32(dst[j] + values[i])


@jit
def matmul32_inexact(a, b, acc):
    """:func:`matmul32` in a plain loop that also returns INEXACT if an addition rounded (an
    error-free Fast2Sum on the larger magnitude), else 0."""
    k_dim, n = a.shape[1], b.shape[1]
    inexact = False
    for i in range(a.shape[0]):
        row = acc[i]
        for k in range(k_dim):
            aik = a[i, k]
            bk = b[k]
            lost = False
            for j in range(n):
                p = aik * bk[j]
                t = row[j]
                s = t + p
                big, small = (t, p) if abs(t) >= abs(p) else (p, t)
                lost |= (small - (s - big) != 0) & (abs(s) < np.inf)  # Inf and NaN sums are exact
                row[j] = s
            inexact |= lost
    return INEXACT if inexact else 0


@inline
def _wide_bits(v, bf16):
    """One binary16 (``bf16``: bfloat16) value's bits as binary32 bits (exact), and whether it is
    Inf or NaN."""
    if bf16:
        return np.uint32(v) << 16, (v & 0x7F80) == 0x7F80
    return f32_bits(np.float32(_half_to_f64(v))), (v & 0x7C00) == 0x7C00


@inline
def _widened(x, bf16):
    """binary16 (``bf16``: bfloat16) bits (2-D, any layout) as a C-ordered binary32 array (exact),
    and whether any is Inf or NaN."""
    rows, cols = x.shape
    out = np.empty((rows, cols), np.float32)
    wide = out.view(np.uint32)
    special = False
    for i in range(rows):
        for j in range(cols):
            wide[i, j], sp = _wide_bits(x[i, j], bf16)
            special |= sp
    return out, special


@jit
def matmul32_flags(a, b, cfg, init):
    """INVALID and OVERFLOW as binary32 accumulation raises them inside a matmul of bits ``a``
    (M, K) and ``b`` (K, N) in the format of ``cfg`` (binary16 or bfloat16) whose sums start
    from ``init`` (M, N binary32): INVALID for a signaling NaN operand, a product 0 * Inf, or
    Inf - Inf in a partial sum (each addition is an IEEE operation, whatever NaN the sum
    carries already); OVERFLOW (with INEXACT) where a step of finite terms overflows binary32
    (bfloat16 products can; binary16 ones cannot)."""
    cfg = settings(cfg)
    m, k_dim = a.shape
    n = b.shape[1]
    flags = 0
    for i in range(m):
        for j in range(n):
            s = np.float32(init[i, j])
            for k in range(k_dim):
                x, y = decode(a[i, k], cfg), decode(b[k, j], cfg)
                if is_snan(a[i, k], cfg) or is_snan(b[k, j], cfg):
                    flags |= INVALID
                p = x * y  # exact in binary64 for binary16 and bfloat16 operands
                if math.isnan(p) and not (math.isnan(x) or math.isnan(y)):
                    flags |= INVALID
                t = _fma32(x, y, s)
                if math.isnan(t) and not (math.isnan(s) or math.isnan(p)):
                    flags |= INVALID
                if math.isinf(t) and not (math.isinf(s) or math.isinf(p) or math.isnan(p)):
                    flags |= OVERFLOW | INEXACT
                s = t
    return flags


@jit
def matmul16(a, b, out, cfg):
    """out = a @ b with binary16 (cfg) accumulation: along k in ascending order from +0, each step
    a * b + acc rounded once in the device's mode. Returns the OR of the flags."""
    cfg = settings(cfg)
    m, k_dim = a.shape
    n = b.shape[1]
    down = cfg[MODE] == DOWN
    status = 0
    for i in range(m):
        for j in range(n):
            s = 0.0
            for k in range(k_dim):
                x, y = decode(a[i, k], cfg), decode(b[k, j], cfg)
                p = x * y
                r = add64(p, s, down)
                fl = 0
                if not math.isfinite(r) or not math.isfinite(p):
                    if is_snan(a[i, k], cfg) or is_snan(b[k, j], cfg):
                        fl = INVALID
                    if math.isnan(p) and not (math.isnan(x) or math.isnan(y)):
                        fl = INVALID
                    if math.isnan(r) and not (math.isnan(x) or math.isnan(y) or math.isnan(s)):
                        fl = INVALID
                bits, rf = round64(r, cfg)
                status |= fl | rf
                s = decode(bits, cfg)
            bits, _ = round64(s, cfg)
            out[i, j] = bits
    return status


@jit
def matmul(a, b, out, flags, acc, dst):
    """out = a @ b for binary16 bits ``a`` (M, K) and ``b`` (K, N) with binary32 accumulation
    from +0: :func:`matmul_from` with zero initial sums. Returns the OR of the flags and
    whether an operand is Inf or NaN."""
    status, special, _ = matmul_from(a, b, np.zeros((a.shape[0], b.shape[1]), np.float32), out, flags, acc, dst,
                                     0, np.empty(0, np.uint16), np.empty(0, np.uint8), False)
    return status, special


@jit
def matmul_from(a, b, init, out, flags, acc, dst, shift, codes, table_flags, bf16):
    """out = init + a @ b for binary16 (or, with ``bf16``, bfloat16) bits ``a`` (M, K) and
    ``b`` (K, N): each output's sum starts from its binary32 ``init`` (M, N) and adds the
    exact products along k in ascending order in binary32 (``acc``; :func:`matmul32`), then
    is rounded once into ``dst`` (flat M*N bits; read from ``codes`` and ``table_flags`` by
    :func:`lookup` with ``shift`` where the caller gives that table). Returns the OR of the
    flags (INEXACT where the output rounding or an addition of the accumulation lost bits),
    whether an operand or an initial sum is Inf or NaN, and whether a sum is Inf or NaN (then
    :func:`matmul32_flags` gives the INVALID and OVERFLOW of the accumulation). One call,
    so that small matmuls cost little besides their arithmetic."""
    m, n = a.shape[0], b.shape[1]
    # matmul32 vectorises along the rows of its right operand: give it the longer side
    # (C^T = B^T A^T adds the same products in the same order along k).
    flip = (n < m) & (n < 64)
    x, y = (b.T, a.T) if flip else (a, b)
    left, special_l = _widened(x, bf16)
    right, special_r = _widened(y, bf16)
    total = init.T.copy() if flip else init.copy()
    special = special_l | special_r
    for v in init.ravel():
        special |= not math.isfinite(v)
    matmul32(left, right, total)
    nonfinite = False
    for v in total.ravel():
        nonfinite |= not math.isfinite(v)
    status = 0
    bits = (total.T.copy() if flip else total).ravel().view(np.uint32)
    out_status = _round_sums(bits, out, flags, acc, dst, shift, codes, table_flags)
    if not out_status & INEXACT:
        # The output rounding was exact (always so for binary32 outputs): whether the
        # accumulation rounded takes a second, slower pass that tracks it (from a fresh copy of
        # the initial sums, made only here: an output-sized array the usual case never needs).
        status |= matmul32_inexact(left, right, init.T.copy() if flip else init.copy())
    return status | out_status, special, nonfinite


@jit
def matmul_stack(a, b, init, out, flags, acc, dst, shift, codes, table_flags, bf16):
    """:func:`matmul_from` for each matrix of the stacks ``a`` (S, M, K), ``b`` (S, K, N) and
    ``init`` (S, M, N) into ``out`` and ``flags`` (S, M*N): one call for a batch or the groups
    of a convolution. Returns the OR of the flags, and per matrix whether an operand or an
    initial sum is Inf or NaN (``special``) and whether a sum is (``nonfinite``).

    Each matrix's sums are matmul_from's, added in the same order; the widening, the output
    rounding (elementwise) and the buffers are done once for the whole stack, so that a stack
    of many small matrices (a depthwise convolution's groups) costs its arithmetic."""
    count, m, k_dim = a.shape
    n = b.shape[2]
    flip = (n < m) & (n < 64)  # as matmul_from: C^T = B^T A^T, the longer side along the rows
    left, special = _widened_stack(b, True, bf16) if flip else _widened_stack(a, False, bf16)
    right, special_r = _widened_stack(a, True, bf16) if flip else _widened_stack(b, False, bf16)
    rows, cols = left.shape[1], right.shape[2]
    total = np.empty((count, rows, cols), np.float32)
    nonfinite = np.zeros(count, np.bool_)
    for s in range(count):
        total[s, :, :] = init[s].T if flip else init[s]
        bad, out_bad = special[s] | special_r[s], False
        for i in range(m):
            for j in range(n):
                bad |= not math.isfinite(init[s, i, j])
        matmul32(left[s], right[s], total[s])
        for i in range(rows):
            for j in range(cols):
                out_bad |= not math.isfinite(total[s, i, j])
        special[s], nonfinite[s] = bad, out_bad
    sums = np.empty((count, m, n), np.float32)
    for s in range(count):
        sums[s, :, :] = total[s].T if flip else total[s]
    size = count * m * n
    status = _round_sums(sums.reshape(size).view(np.uint32), out.reshape(size), flags.reshape(size), acc, dst, shift,
                         codes, table_flags)
    for s in range(count):
        rounded = 0
        for f in flags[s]:
            rounded |= f
        if not rounded & INEXACT:
            # The output rounding was exact: whether the accumulation rounded (matmul_from's
            # second pass, from a fresh copy of the initial sums).
            status |= matmul32_inexact(left[s], right[s], init[s].T.copy() if flip else init[s].copy())
    return status, special, nonfinite


@inline
def _round_sums(bits, out, flags, acc, dst, shift, codes, table_flags):
    """binary32 sums (bits) rounded into ``dst``: by the table ``codes`` where one is given (see
    ``sim.fpu.narrowing32``), else by :func:`convert`. Returns the OR of the flags."""
    if codes.size:
        return lookup(bits, shift, codes, table_flags, out, flags)
    return convert(bits, out, flags, acc, dst)


@inline
def _widened_stack(x, transpose, bf16):
    """A stack of binary16 (``bf16``: bfloat16) bits (S, R, C) as C-ordered binary32 matrices
    (exact), each transposed if ``transpose``, and per matrix whether any is Inf or NaN."""
    count, rows, cols = x.shape
    out = np.empty((count, cols, rows) if transpose else (count, rows, cols), np.float32)
    wide = out.view(np.uint32)
    special = np.zeros(count, np.bool_)
    for s in range(count):
        sp = False
        for i in range(rows):
            for j in range(cols):
                bits, special_v = _wide_bits(x[s, i, j], bf16)
                sp |= special_v
                if transpose:
                    wide[s, j, i] = bits
                else:
                    wide[s, i, j] = bits
        special[s] = sp
    return out, special


