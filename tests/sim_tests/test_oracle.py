"""Property tests against MPFR (tests/oracle.py): every operation, rounding mode and overflow mode."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lossscale.testing as hs
from sim import BFLOAT16, BINARY16, BINARY32, BINARY64, SIX_MODES, Format, Fpu, OverflowMode, Rounding, Tininess

from groups import representatives
from oracle import LIMITS, hifloat8_table, reference, saturated

MODES = list(SIX_MODES)
#: The default run keeps round-to-nearest-even and toward zero (its overflow goes to MAX, not Inf) of
#: each binary16 property; the slow group runs the other four modes (TestFloat's vectors cover all six
#: in the default run).
MODE_PARAMS = representatives(MODES, lambda m: m in (Rounding.NEAREST_EVEN, Rounding.TOWARD_ZERO), lambda m: m.name)
OVERFLOWS = [OverflowMode.INF_NAN, OverflowMode.SATURATION]


def check(fpu: Fpu, op: str, columns: list[list[int]], src: Format, dst: Format, **kw) -> None:
    arrays = [np.array(c, src.uint).view(src.dtype) for c in columns]
    if op == "convert":
        got, flags = fpu.convert(arrays[0], dst.dtype, return_flags=True)
    else:
        got, flags = getattr(fpu, op)(*arrays, return_flags=True, **kw)
    got_bits = got.view(dst.uint)
    mpfr_op = {"fma": "fma", "rint": "rint", "convert": "convert"}.get(op, op)
    for i, operands in enumerate(zip(*columns, strict=True)):
        want, want_flags = reference(mpfr_op, list(operands), dst, fpu.rounding, fpu.tininess, src=src)
        if fpu.overflow is OverflowMode.SATURATION:
            want = saturated(want, dst)
        g = int(got_bits[i])
        nan = lambda b: b & (dst.sign_bit - 1) > dst.inf_bits  # noqa: E731
        where = f"{op} {[hex(o) for o in operands]} {fpu}"
        assert g == want or (nan(g) and nan(want)), f"{where}: got {g:#x} want {want:#x}"
        assert flags[i] == want_flags, f"{where}: flags {flags[i]:#x} want {want_flags:#x}"


def batch(strategy):
    return st.lists(strategy, min_size=1, max_size=40)


common = settings(max_examples=60, deadline=None)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("mode", MODE_PARAMS)
@given(pairs=batch(st.one_of(st.tuples(hs.values(), hs.values()), hs.near_pair())),
       overflow=st.sampled_from(OVERFLOWS), tininess=st.sampled_from(list(Tininess)))
@common
def test_binary(op: str, mode: Rounding, pairs, overflow, tininess) -> None:
    check(Fpu(overflow, mode, tininess), op, [list(c) for c in zip(*pairs, strict=True)], BINARY16, BINARY16)


@pytest.mark.parametrize("mode", MODE_PARAMS)
@given(triples=batch(st.one_of(st.tuples(hs.values(), hs.values(), hs.values()), hs.fma_triple())),
       overflow=st.sampled_from(OVERFLOWS))
@common
def test_fma(mode: Rounding, triples, overflow) -> None:
    check(Fpu(overflow, mode), "fma", [list(c) for c in zip(*triples, strict=True)], BINARY16, BINARY16)


@pytest.mark.parametrize("mode", MODE_PARAMS)
@given(xs=batch(hs.values()), overflow=st.sampled_from(OVERFLOWS))
@common
def test_unary(mode: Rounding, xs, overflow) -> None:
    check(Fpu(overflow, mode), "sqrt", [xs], BINARY16, BINARY16)
    check(Fpu(overflow, mode), "rint", [xs], BINARY16, BINARY16)


def wide_bits(fmt: Format) -> st.SearchStrategy[int]:
    """binary32/64 values aimed at binary16's range, ties, MAX and 65520."""
    def widened(h: int, d: int) -> int:
        bits = int(np.array([h], np.uint16).view(np.float16).astype(fmt.dtype).view(fmt.uint)[0])
        return bits + d & ((1 << fmt.width) - 1)
    near16 = st.builds(widened, hs.values(), st.integers(-3, 3))
    return st.one_of(st.integers(0, (1 << fmt.width) - 1), near16)


@pytest.mark.parametrize("src", [BINARY32, BINARY64], ids=lambda f: f.name)
@pytest.mark.parametrize("mode", MODE_PARAMS)
@given(data=st.data(), overflow=st.sampled_from(OVERFLOWS))
@common
def test_convert_narrowing(src: Format, mode: Rounding, data, overflow) -> None:
    xs = data.draw(batch(wide_bits(src)))
    check(Fpu(overflow, mode), "convert", [xs], src, BINARY16)
    check(Fpu(overflow, mode), "convert", [xs], src, BFLOAT16)


@st.composite
def below_normal(draw, dst: Format) -> int:
    """binary64 bits of a value at or below ``dst``'s 2**emin: a binade down to the quantum and far
    below it, with the bits under the quantum a tie, one off a tie, zero, one or random; or a value
    within a few units of ``dst``'s precision below 2**emin (whether it is tiny depends on the
    tininess rule)."""
    lim = LIMITS[dst.name]
    if draw(st.integers(0, 3)) == 0:
        e, fraction = lim.emin - 1, (1 << 52) - 1 - draw(st.integers(0, 1 << (52 - lim.precision + 3)))
        return draw(st.integers(0, 1)) << 63 | (e + 1023) << 52 | fraction
    e = draw(st.integers(lim.qmin - 3, lim.emin) | st.integers(lim.emin - 300, lim.emin))
    c = lim.qmin - e + 52  # the fraction bits below the quantum (more than 52: all of them, and the leading 1)
    fraction = draw(st.integers(0, (1 << 52) - 1))
    if c <= 52:
        half = 1 << (c - 1)
        low = draw(st.sampled_from([0, 1, half - 1, half, half + 1, 2 * half - 1]) | st.integers(0, 2 * half - 1))
        fraction = (fraction >> c << c) | low
    return draw(st.integers(0, 1)) << 63 | (e + 1023) << 52 | fraction


@pytest.mark.parametrize("dst", [BINARY16, BFLOAT16, BINARY32], ids=lambda f: f.name)
@given(data=st.data(), mode=st.sampled_from(MODES), tininess=st.sampled_from(list(Tininess)),
       overflow=st.sampled_from(OVERFLOWS))
@common
def test_results_below_the_normal_range(dst: Format, data, mode: Rounding, tininess: Tininess, overflow) -> None:
    """Subnormal and zero results, and those that round up to 2**emin, against MPFR in every
    deterministic mode and both tininess rules: the vectorised path shifts such values to the
    quantum itself, the binade just below 2**emin with tininess after rounding excepted."""
    xs = data.draw(batch(below_normal(dst)))
    check(Fpu(overflow, mode, tininess), "convert", [xs], BINARY64, dst)


@pytest.mark.parametrize("fmt", [BFLOAT16, BINARY32], ids=lambda f: f.name)
@pytest.mark.parametrize("op", representatives(["add", "mul", "div", "sqrt", "fma"], lambda o: o in ("add", "fma")))
@pytest.mark.parametrize("mode", representatives([Rounding.NEAREST_EVEN, Rounding.DOWNWARD, Rounding.ODD],
                                                  lambda m: m is Rounding.NEAREST_EVEN, lambda m: m.name))
@given(data=st.data(), overflow=st.sampled_from(OVERFLOWS))
@common
def test_other_formats_are_data(fmt: Format, op: str, mode: Rounding, data, overflow) -> None:
    """The same kernels serve bfloat16 and binary32 (wide exponent range: sums via TwoSum)."""
    arity = {"sqrt": 1, "fma": 3}.get(op, 2)
    rows = data.draw(batch(st.tuples(*[hs.values(fmt)] * arity)))
    check(Fpu(overflow, mode, format=fmt), op, [list(c) for c in zip(*rows, strict=True)], fmt, fmt)


@pytest.mark.parametrize("name", [n for n in LIMITS if n not in ("hifloat8", "float4_e1m2fn", "hifloat4")])  # no finfo
def test_the_oracles_limits_are_ml_dtypes(name: str) -> None:
    """The limits typed into the oracle from the publications against ml_dtypes.finfo (numpy's
    for the IEEE formats), and the IEEE bit facts against the dtype's own encodings."""
    import ml_dtypes

    lim = LIMITS[name]
    dtype = np.dtype({"binary16": np.float16, "binary32": np.float32, "binary64": np.float64}.get(name)
                     or getattr(ml_dtypes, name))
    fi = ml_dtypes.finfo(dtype)
    assert (lim.precision, lim.emin, lim.emax) == (fi.nmant + 1, fi.minexp, fi.maxexp - 1)
    assert (lim.max, lim.tiny, 2.0**lim.qmin) == (float(fi.max), float(fi.tiny), float(fi.smallest_subnormal))
    if lim.inf_bits:
        uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]
        bits = lambda v: int(np.array([v]).astype(dtype).view(uint)[0])  # noqa: E731
        assert (bits(-0.0), bits(np.inf), bits(np.nan)) == (lim.sign_bit, lim.inf_bits, lim.default_nan)
        assert lim.default_nan & lim.quiet_bit and lim.quiet_bit << 1 == lim.inf_bits & -lim.inf_bits


def test_the_oracles_hifloat8_limits_are_the_papers_table() -> None:
    """ml_dtypes has no HiFloat8: its limits against the codes read off the paper (hifloat8_table)."""
    values = np.array([v for v in hifloat8_table().values() if np.isfinite(v) and v > 0])
    lim = LIMITS["hifloat8"]
    assert (values.max(), values.min()) == (lim.max, 2.0**lim.qmin)
    normal = values[values >= lim.tiny]
    assert normal.min() == lim.tiny and 2.0**lim.emax == lim.max
