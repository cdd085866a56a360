"""Large conversions into the narrow formats, and long one-operand functions of 16-bit formats, read a
table the rounding routine made: the same codes, flags and status as the routine itself, for every
input class."""

from __future__ import annotations

import numpy as np
import pytest

from sim import Device, Fpu, Rounding, formats
from sim import fpu as F

NARROW = [f for f in formats.EIGHT_BIT if f.signed]
MODES = ["rint", "trunc", "floor", "ceil", "round", "odd"]
OVERFLOW = ["inf_nan", "saturation", "satfinite"]


def both(x: np.ndarray, src: str, fmt: formats.Format, rounding: str, overflow: str):
    """(the table's result, the routine's), each as (codes, flags, status)."""
    out = []
    for lookup in (True, False):
        unit = Fpu("inf_nan" if overflow == "satfinite" else overflow, format=src)
        result, _, _ = unit._cast(x, unit.format, fmt, Rounding.parse(rounding),
                                  "satfinite" if overflow == "satfinite" else None, lookup=lookup)
        out.append((np.asarray(result.value).view(np.uint8), result.flags, unit.status))
    return out


def same(a, b) -> bool:
    return np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


@pytest.mark.parametrize("fmt", NARROW, ids=lambda f: f.name)
def test_every_binary32_class_at_both_ends_reads_as_the_routine_rounds(fmt: formats.Format) -> None:
    """A class is the sign, the exponent, the top p fraction bits and whether any lower bit is
    set; its two ends (lowest bit alone set, every lower bit set) and its bare member, in every
    deterministic mode and overflow mode: rounding is monotone, so a class whose ends round alike
    rounds alike throughout."""
    shift = 23 - (fmt.man_bits + 1)
    top = np.arange(1 << (32 - shift), dtype=np.uint64) << np.uint64(shift)
    x = np.concatenate([top, top | 1, top | ((1 << shift) - 1)]).astype(np.uint32).view(np.float32)
    x = np.tile(x, -(-F._LOOKUP_MIN // x.size))  # large enough to take the table
    for rounding in MODES:
        for overflow in OVERFLOW:
            table, routine = both(x, "binary32", fmt, rounding, overflow)
            assert same(table, routine), (rounding, overflow)


@pytest.mark.parametrize("src", ["binary16", "bfloat16"])
def test_every_16_bit_input_reads_as_the_routine_rounds(src: str) -> None:
    x = np.arange(1 << 16, dtype=np.uint16).view(formats.format_of(src).dtype)
    for fmt in NARROW:
        for rounding in MODES + (["hybrid"] if fmt.name == "hifloat8" else []):
            for overflow in OVERFLOW:
                table, routine = both(x, src, fmt, rounding, overflow)
                assert same(table, routine), (fmt.name, rounding, overflow)


def test_the_table_serves_only_where_it_is_exact() -> None:
    """Small arrays, stochastic rounding, HiFloat8's hybrid rounding from binary32 and E8M0 go to
    the routine; a large deterministic cast reads a table, and its status is the unit's."""
    unit = Fpu(format="binary32")
    big = np.full(F._LOOKUP_MIN, 1e6, np.float32)
    cfg = np.zeros(1)
    for x, fmt, rounding in ((big[:10], formats.FLOAT8_E4M3FN, Rounding.NEAREST_EVEN),
                             (big, formats.FLOAT8_E4M3FN, Rounding.STOCHASTIC),
                             (big, formats.HIFLOAT8, Rounding.HYBRID),
                             (big, formats.FLOAT8_E8M0FNU, Rounding.NEAREST_EVEN)):
        assert unit._lookup(x, unit.format, fmt, rounding, None, cfg) is None
    codes, flags = unit.convert(big, "float8_e4m3fn", return_flags=True)
    assert np.all(codes.view(np.uint8) == 0x7F) and np.all(flags == int(unit.status))  # 1e6 overflows to NaN


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
@pytest.mark.parametrize("profile, rounding", [("atlas-a2", "nearest_even"), ("atlas-training", "nearest_even"),
                                                ("atlas-training", "upward")])
def test_elementary_tables_are_the_kernels_results(dtype, profile: str, rounding: str) -> None:
    """A long one-operand call reads a table of the kernel's results for every 16-bit input: over
    every input, in blocks long enough to read it, the same bits and the same register as the
    kernel run on halves too short to read it, for each function, both overflow modes and two
    roundings (a table made in other settings would differ)."""
    import ml_dtypes

    from sim import ops
    from sim.device import elementwise

    every = np.arange(1 << 16, dtype=np.uint16).view(getattr(ml_dtypes, dtype) if dtype == "bfloat16" else dtype)
    block, half = elementwise._TABLE_MIN, elementwise._TABLE_MIN // 2
    for op in ops.OPS:
        if op.kind != ops.ELEMENTARY or not op.device:
            continue
        for start in range(0, every.size, block):
            long, short = Device(profile, rounding=rounding), Device(profile, rounding=rounding)
            x = every[start:start + block]
            got = getattr(long, op.name)(x)
            want = np.concatenate([getattr(short, op.name)(x[:half]), getattr(short, op.name)(x[half:])])
            assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), f"{op.name} from {start:#06x}"
            assert long.status == short.status, f"{op.name} from {start:#06x}"
            assert long.get_float_status()[0] == short.get_float_status()[0], f"{op.name} from {start:#06x}"


@pytest.mark.parametrize("src, dst", [(np.float16, np.float32), (np.float16, "bfloat16"), ("bfloat16", np.float16),
                                      ("bfloat16", np.float32)])
@pytest.mark.parametrize("profile, rounding", [("atlas-a2", "nearest_even"), ("atlas-training", "nearest_even"),
                                                ("atlas-training", "upward")])
def test_cast_tables_are_the_kernels_results(src, dst, profile: str, rounding: str) -> None:
    """A long cast from a 16-bit format reads a table of the conversion kernel's results for every
    input: over every input, in blocks long enough to read it, the same bits and the same status and
    register as the kernel on halves too short to read it (signaling NaNs, overflow into binary16
    in both overflow modes, directed rounding: a table made in other settings would differ)."""
    import ml_dtypes

    from sim.device import elementwise

    dtype = lambda d: getattr(ml_dtypes, d) if isinstance(d, str) else d  # noqa: E731
    every = np.arange(1 << 16, dtype=np.uint16).view(dtype(src))
    uint = np.uint32 if dst is np.float32 else np.uint16
    block, half = elementwise._TABLE_MIN, elementwise._TABLE_MIN // 2
    for start in range(0, every.size, block):
        long, short = Device(profile, rounding=rounding), Device(profile, rounding=rounding)
        x = every[start:start + block]
        got = long.cast(x, dtype(dst))
        want = np.concatenate([short.cast(x[:half], dtype(dst)), short.cast(x[half:], dtype(dst))])
        assert np.array_equal(got.view(uint), want.view(uint)), f"from {start:#06x}"
        assert long.status == short.status, f"from {start:#06x}"
        assert long.get_float_status()[:3].tolist() == short.get_float_status()[:3].tolist(), f"from {start:#06x}"


def test_a_stochastic_cast_reads_no_table() -> None:
    """Stochastic rounding (a cast's own rounding; a device computes in a deterministic one) draws
    for each element: 1,024 copies of a binary16 value between two bfloat16 neighbours round to
    both (a table, one entry per input, would give one of them)."""
    import ml_dtypes

    x = np.full(1024, 1 + 2.0**-9, np.float16)  # a quarter of the way from 1 to bfloat16's next value
    got = Device("atlas-a2").cast(x, ml_dtypes.bfloat16, rounding="stochastic")
    assert set(got.astype(np.float64).tolist()) == {1.0, 1 + 2.0**-7}


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
@pytest.mark.parametrize("profile", ["atlas-a2", "atlas-training"])
@pytest.mark.parametrize("rounding", [None] + [pytest.param(m, marks=pytest.mark.slow) for m in MODES])
def test_long_binary32_results_read_as_the_routine_rounds(dtype, profile: str, rounding: str | None) -> None:
    """A fused kernel's long binary32 result rounds into binary16 or bfloat16 by a table
    (``sim.fpu.narrowing32``): every class of input, at both ends and bare (rounding is monotone),
    in both overflow modes and (slow) every deterministic mode, gives the bits, status and
    register of the same values rounded in pieces too short to read it."""
    import ml_dtypes

    dtype = getattr(ml_dtypes, dtype) if isinstance(dtype, str) else dtype
    fmt = formats.format_of(dtype)
    shift = 23 - (fmt.man_bits + 1)
    top = np.arange(1 << (32 - shift), dtype=np.uint64) << np.uint64(shift)
    x = np.concatenate([top, top | 1, top | ((1 << shift) - 1)]).astype(np.uint32).view(np.float32)
    long, short = Device(profile), Device(profile)
    got = long.round_results([x], [dtype], rounding=rounding)[0]
    piece = F.NARROWING_MIN // 2
    want = np.concatenate([short.round_results([x[i:i + piece]], [dtype], rounding=rounding)[0]
                           for i in range(0, x.size, piece)])
    assert np.array_equal(got.view(fmt.uint), want.view(fmt.uint))
    assert long.status == short.status
    assert long.get_float_status()[:3].tolist() == short.get_float_status()[:3].tolist()


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
@pytest.mark.parametrize("profile", ["atlas-a2", "atlas-training"])
def test_relu_tables_are_the_maximum_kernels_results(dtype, profile: str) -> None:
    """A long relu of a 16-bit format reads a table of the maximum kernel's results against +0:
    over every input, in blocks long enough to read it, the bits, status and register of the
    kernel itself on halves too short to (-0 to +0, NaNs kept or zeroed by the overflow mode, a
    signaling NaN's INVALID)."""
    import ml_dtypes

    from sim.device import elementwise

    dtype = getattr(ml_dtypes, dtype) if isinstance(dtype, str) else dtype
    every = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    block, half = elementwise._TABLE_MIN, elementwise._TABLE_MIN // 2
    for start in range(0, every.size, block):
        long, short = Device(profile), Device(profile)
        x = every[start:start + block]
        got = long.relu(x)
        want = np.concatenate([short.relu(x[:half]), short.relu(x[half:])])
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), f"from {start:#06x}"
        assert long.status == short.status, f"from {start:#06x}"
        assert long.get_float_status()[:3].tolist() == short.get_float_status()[:3].tolist(), f"from {start:#06x}"


def test_a_long_binary32_result_kept_in_binary32_reads_no_table() -> None:
    """A fused kernel's long binary32 result that stays binary32 (no 16-bit destination) is no
    narrowing: it goes as it is, as in short pieces (the table was once asked for it, with a
    negative shift)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(F.NARROWING_MIN + 7).astype(np.float32)
    x[:3] = [np.inf, -np.inf, np.nan]
    long, short = Device("atlas-a2"), Device("atlas-a2")
    got = long.round_results([x], [np.float32])[0]
    piece = F.NARROWING_MIN // 2
    want = np.concatenate([short.round_results([x[i:i + piece]], [np.float32])[0] for i in range(0, x.size, piece)])
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(got.view(np.uint32), x.view(np.uint32))
    assert long.status == short.status
