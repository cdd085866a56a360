"""Hand-worked cases for every edge of the float semantics (README, sim.fpu), the API's contract, and bad input."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sim import SIX_MODES, Flag, Fpu, OverflowMode, Rounding, Tininess

H = np.float16
INX, UF, OF, DZ, INV = Flag.INEXACT, Flag.UNDERFLOW, Flag.OVERFLOW, Flag.DIVBYZERO, Flag.INVALID
SNAN, QNAN = np.uint16(0x7D00).view(H), np.uint16(0x7E00).view(H)
#: Values whose results land on every path: normal, subnormal, zero, overflow, Inf, NaN.
EDGES = [H(v) for v in (1.0, -1.5, 3.0, 300.0, -300.0, 65504.0, 2.0**-14, -(2.0**-24), 2.0**-20, 0.0, -0.0,
                        0.1, np.inf, -np.inf, np.nan)] + [SNAN]


def bits(x) -> int:
    return int(np.asarray(x, H).view(np.uint16))


def test_directed_rounding_needs_the_exact_value() -> None:
    # 2048 - 2**-24 lies between 2047 and 2048; a binary32 intermediate rounds it to 2048 first.
    down = Fpu(rounding="floor")
    z, f = down.sub(H(2048), H(2.0**-24), return_flags=True)
    assert float(z) == 2047.0 and f == INX
    assert np.float32(2048) - np.float32(2.0**-24) == 2048  # the trap, in binary32
    assert float(Fpu(rounding="ceil").sub(H(2048), H(2.0**-24))) == 2048.0


@pytest.mark.parametrize("overflow, value", [("inf_nan", np.inf), ("saturation", 65504.0)])
def test_65520_is_the_overflow_threshold(overflow: str, value: float) -> None:
    fpu = Fpu(overflow=overflow)
    z, f = fpu.add(H(65504), H(16), return_flags=True)  # exactly 65520: the tie rounds to even, past MAX
    assert float(z) == value and f == OF | INX
    z, f = fpu.add(H(65504), H(8), return_flags=True)  # 65512 rounds back to 65504
    assert float(z) == 65504.0 and f == INX
    z, f = fpu.convert(np.array([65520, 65519.996, -65520], np.float32), H, return_flags=True)
    assert z.tolist() == [value, 65504.0, -value] and f.tolist() == [OF | INX, INX, OF | INX]


@pytest.mark.parametrize("mode, positive, negative", [
    ("trunc", 65504.0, -65504.0), ("ceil", np.inf, -65504.0), ("floor", 65504.0, -np.inf),
    ("round", np.inf, -np.inf), ("odd", 65504.0, -65504.0), ("rint", np.inf, -np.inf),
])
def test_overflow_result_depends_on_direction(mode: str, positive: float, negative: float) -> None:
    z, f = Fpu(rounding=mode).mul(np.array([300, -300], H), H(300), return_flags=True)
    assert z.tolist() == [positive, negative] and f.tolist() == [OF | INX] * 2
    z = Fpu(overflow="saturation", rounding=mode).mul(np.array([300, -300], H), H(300))
    assert z.tolist() == [65504.0, -65504.0]


def test_signed_zeros() -> None:
    fpu = Fpu()
    negzero = H(-0.0)
    for z in (fpu.add(negzero, negzero), fpu.mul(negzero, H(1)), fpu.sqrt(negzero), fpu.rint(H(-0.25)),
              fpu.convert(np.float32(-0.0), H), fpu.div(H(1), H(-np.inf))):
        assert bits(z) == 0x8000
    assert bits(fpu.sub(H(1), H(1))) == 0x0000
    assert bits(Fpu(rounding="floor").sub(H(1), H(1))) == 0x8000
    assert bits(Fpu(rounding="floor").add(H(0.0), negzero)) == 0x8000
    assert bits(Fpu(rounding="floor").fma(H(1), H(1), H(-1))) == 0x8000
    assert bits(Fpu().mul(H(-2.0**-14), H(2.0**-14))) == 0x8000  # underflow to zero keeps the sign


def test_round_to_odd_leaves_representable_values_alone() -> None:
    every = np.arange(1 << 16, dtype=np.uint16).view(H)
    finite = np.isfinite(every)
    back, f = Fpu(rounding="odd").convert(every.astype(np.float32), H, return_flags=True)
    assert np.array_equal(back.view(np.uint16)[finite], every.view(np.uint16)[finite])
    assert not f[finite].any()
    # And it rounds inexact values to the odd neighbour.
    assert bits(Fpu(rounding="odd").convert(np.float32(1 + 2.0**-12), H)) == 0x3C01
    assert bits(Fpu(rounding="odd").convert(np.float32(1 + 2.0**-10 + 2.0**-12), H)) == 0x3C01


def test_fma_rounds_once() -> None:
    # (1 + 2**-10) * (1 - 2**-10) + 2050 = 2051 - 2**-20: just below the midpoint of 2050 and 2052.
    a, b, c = H(1 + 2.0**-10), H(1 - 2.0**-10), H(2050)
    z, f = Fpu().fma(a, b, c, return_flags=True)
    assert float(z) == 2050.0 and f == INX
    via32 = (np.float32(a) * np.float32(b) + np.float32(c)).astype(H)  # binary32 rounds to the midpoint
    assert float(via32) == 2052.0


def test_tininess_before_and_after_rounding() -> None:
    # 63 * 65 * 2**-26 = 2**-14 - 2**-26: rounds to 2**-14 (MIN normal); with an
    # unbounded exponent it is a tie that rounds to even = 2**-14, so not tiny after.
    a, b = H(63 * 2.0**-13), H(65 * 2.0**-13)
    z, f = Fpu(tininess="after").mul(a, b, return_flags=True)
    assert bits(z) == 0x0400 and f == INX
    z, f = Fpu(tininess=Tininess.BEFORE).mul(a, b, return_flags=True)
    assert bits(z) == 0x0400 and f == INX | UF
    # (1 + 2**-10)**2 * 2**-14 = 2**-14 + 2**-23 + 2**-34: inexact, but at least 2**-14 (emin) before
    # rounding, so not tiny either way (IEEE 754-2019 7.5): no underflow in the binade at emin.
    c = H((1 + 2.0**-10) * 2.0**-7)
    for tininess in ("before", "after"):
        z, f = Fpu(tininess=tininess).mul(c, c, return_flags=True)
        assert bits(z) == 0x0402 and f == INX, tininess  # 2**-14 + 2 * 2**-24
        # Stochastic rounding takes the full path (the nearest modes take a fast one there): up or down,
        # the result is 2**-14 + 2 or 3 quanta, and still no underflow.
        z, f = Fpu(tininess=tininess, rounding="stochastic").mul(np.full(64, c), np.full(64, c), return_flags=True)
        assert set(z.view(np.uint16).tolist()) <= {0x0402, 0x0403} and (f == INX).all(), tininess
    # Exact subnormal results raise nothing.
    z, f = Fpu().mul(H(2.0**-12), H(2.0**-12), return_flags=True)
    assert float(z) == 2.0**-24 and f == 0


def test_nans() -> None:
    fpu = Fpu()
    z, f = fpu.add(SNAN, H(1), return_flags=True)
    assert np.isnan(z) and bits(z) == 0x7E00 and f == INV  # quieted, canonical
    z, f = fpu.add(QNAN, H(1), return_flags=True)
    assert np.isnan(z) and f == 0
    for z, f in (fpu.sub(H(np.inf), H(np.inf), return_flags=True), fpu.mul(H(0), H(np.inf), return_flags=True),
                 fpu.div(H(0), H(0), return_flags=True), fpu.sqrt(H(-1), return_flags=True),
                 fpu.fma(H(0), H(np.inf), QNAN, return_flags=True)):
        assert np.isnan(z) and f == INV
    z, f = fpu.convert(SNAN, np.float32, return_flags=True)
    assert np.isnan(z) and f == INV


def test_comparisons() -> None:
    fpu = Fpu()
    assert fpu.eq(H(1), H(1)) and not fpu.eq(QNAN, QNAN)
    assert fpu.eq(H(0.0), H(-0.0)) and fpu.le(H(-0.0), H(0.0)) and not fpu.lt(H(-0.0), H(0.0))
    for call, flags in ((lambda: fpu.eq(QNAN, H(1), return_flags=True), 0),
                        (lambda: fpu.eq(SNAN, H(1), return_flags=True), INV),
                        (lambda: fpu.eq(QNAN, H(1), signaling=True, return_flags=True), INV),
                        (lambda: fpu.lt(QNAN, H(1), return_flags=True), INV),
                        (lambda: fpu.lt(QNAN, H(1), signaling=False, return_flags=True), 0),
                        (lambda: fpu.le(SNAN, H(1), signaling=False, return_flags=True), INV)):
        result, f = call()
        assert not result and f == flags


def test_saturation_mode() -> None:
    sat = Fpu(overflow=OverflowMode.SATURATION)
    z, f = sat.mul(H(300), H(300), return_flags=True)
    assert float(z) == 65504.0 and f == OF | INX
    assert sat.status == OF | INX
    z, f = sat.sqrt(H(-1), return_flags=True)
    assert bits(z) == 0 and f == INV
    z, f = sat.div(H(-1), H(0), return_flags=True)
    assert float(z) == -65504.0 and f == DZ
    z, f = sat.add(H(np.inf), H(1), return_flags=True)  # an Inf operand saturates too, with no flag
    assert float(z) == 65504.0 and f == 0
    keep = Fpu(overflow="saturation", nan_to_zero=False)
    assert np.isnan(keep.sqrt(H(-1))) and float(keep.mul(H(300), H(300))) == 65504.0
    assert float(sat.convert(np.float64(1e300), np.float32)) == float(np.finfo(np.float32).max)


def test_status_is_sticky_until_cleared() -> None:
    fpu = Fpu()
    assert fpu.status == Flag(0)
    fpu.mul(H(300), H(300))
    fpu.add(H(1), H(1))  # exact: adds nothing, removes nothing
    assert fpu.status == OF | INX
    fpu.div(H(1), H(0))
    assert fpu.status == OF | INX | DZ
    fpu.clear_status()
    assert fpu.status == Flag(0)
    fpu.rint(H(2.5))  # roundToIntegral raises no INEXACT
    assert fpu.status == Flag(0)
    fpu.rint(H(2.5), exact=True)
    assert fpu.status == INX


def test_rint_modes() -> None:
    x = np.array([2.5, -2.5, 3.5, 0.5, -0.5, 1.25, 1023.5], H)
    want = {"rint": [2, -2, 4, 0, -0.0, 1, 1024], "round": [3, -3, 4, 1, -1, 1, 1024],
            "trunc": [2, -2, 3, 0, -0.0, 1, 1023], "floor": [2, -3, 3, 0, -1, 1, 1023],
            "ceil": [3, -2, 4, 1, -0.0, 2, 1024], "odd": [3, -3, 3, 1, -1, 1, 1023]}
    for mode, values in want.items():
        assert Fpu(rounding=mode).rint(x).tolist() == values, mode


def test_shapes_scalars_and_broadcasting() -> None:
    fpu = Fpu()
    z = fpu.add(H(1), H(2))
    assert isinstance(z, np.float16) and z == 3
    z, f = fpu.mul(np.ones((3, 1), H), np.arange(4, dtype=H), return_flags=True)
    assert z.shape == f.shape == (3, 4) and f.dtype == np.uint8
    assert fpu.add(np.empty(0, H), np.empty(0, H)).shape == (0,)
    big = np.full(100_000, 300, H)  # several chunks, with the rare path batched across them
    z, f = fpu.mul(big, big, return_flags=True)
    assert np.isinf(z).all() and (f == OF | INX).all()
    assert fpu.convert(np.float32(1.5), ml_dtypes.bfloat16).dtype == ml_dtypes.bfloat16


def test_bad_input_is_refused_clearly() -> None:
    fpu = Fpu()
    with pytest.raises(TypeError, match="float32"):
        fpu.add(np.ones(3, np.float32), np.ones(3, H))
    with pytest.raises(TypeError, match="float"):
        fpu.mul(1.0, H(1))
    with pytest.raises(ValueError, match=r"\(3,\).*\(4,\)"):
        fpu.add(np.ones(3, H), np.ones(4, H))
    with pytest.raises(ValueError, match="NEAREST_EVEN.*TOWARD_ZERO"):
        Fpu(rounding="nearest")
    with pytest.raises(ValueError, match="SATURATION.*INF_NAN"):
        Fpu(overflow="wrap")
    with pytest.raises(ValueError, match="AFTER.*BEFORE"):
        Fpu(tininess="sometimes")
    with pytest.raises(ValueError, match="binary64"):
        Fpu(format="binary64")
    with pytest.raises(ValueError, match="unknown floating-point format"):
        fpu.convert(np.ones(2, H), np.int32)
    with pytest.raises(TypeError, match="int64"):
        fpu.convert(np.ones(2, np.int64), H)


def test_mode_aliases() -> None:
    assert [Rounding.parse(n) for n in ("rint", "trunc", "floor", "ceil", "round", "odd")] == [
        Rounding.NEAREST_EVEN, Rounding.TOWARD_ZERO, Rounding.DOWNWARD, Rounding.UPWARD,
        Rounding.NEAREST_AWAY, Rounding.ODD]
    assert Rounding.parse("near_maxMag") is Rounding.NEAREST_AWAY and Rounding.parse("minMag") is Rounding.TOWARD_ZERO
    assert OverflowMode.parse("saturation").value == 0 and OverflowMode.parse("inf_nan").value == 1


@given(hnp.arrays(H, hnp.array_shapes(max_dims=2, max_side=50)), hnp.arrays(H, 1))
@settings(max_examples=100, deadline=None)
def test_nearest_even_values_match_numpy(a: np.ndarray, b: np.ndarray) -> None:
    """numpy's float16 ufuncs compute in binary32 and round once: exact for + - * / sqrt."""
    fpu = Fpu()
    with np.errstate(all="ignore"):
        pairs = [(fpu.add(a, b), a + b), (fpu.sub(a, b), a - b), (fpu.mul(a, b), a * b),
                 (fpu.div(a, b), a / b), (fpu.sqrt(a), np.sqrt(a))]
    for ours, theirs in pairs:
        same = (ours.view(np.uint16) == theirs.view(np.uint16)) | (np.isnan(ours) & np.isnan(theirs))
        assert same.all()


def test_a_large_array_matches_mpfr_where_sampled() -> None:
    """50,000 elements in one call (the oracle tests take at most 40): every sampled element's
    result and flags are MPFR's (tests/oracle.py), in each of the six modes."""
    from sim import BINARY16

    from oracle import reference

    rng = np.random.default_rng(7)
    a, b, c = (rng.standard_normal(50_000).astype(H) * H(300) for _ in range(3))
    sample = np.concatenate([rng.choice(50_000, 150, replace=False), [0, 49_999]])
    for mode in SIX_MODES:
        got, flags = Fpu(rounding=mode).fma(a, b, c, return_flags=True)
        for i in sample:
            want, want_flags = reference("fma", [bits(a[i]), bits(b[i]), bits(c[i])], BINARY16, Rounding(mode))
            assert (bits(got[i]), int(flags[i])) == (want, want_flags), f"element {i}, {mode}"


@given(a=hnp.arrays(H, st.integers(1, 40_000), elements=st.sampled_from(EDGES)),
       b=hnp.arrays(H, 1, elements=st.sampled_from(EDGES)),
       op=st.sampled_from(["add", "sub", "mul", "div", "sqrt", "fma", "rint", "exp"]),
       mode=st.sampled_from(list(SIX_MODES)))
@settings(max_examples=60, deadline=None)
def test_status_is_the_or_of_every_elements_flags(a, b, op, mode) -> None:
    """Including the elements rounded on the rare path (subnormal, zero, Inf, NaN results)."""
    fpu = Fpu(rounding=mode)
    args = {"sqrt": (a,), "rint": (a,), "exp": (a,), "fma": (a, b, a)}.get(op, (a, b))
    _, flags = getattr(fpu, op)(*args, return_flags=True)
    assert fpu.status == Flag(int(np.bitwise_or.reduce(flags.reshape(-1), initial=0)))


def test_binary64_subnormals_convert_to_binary64_exactly() -> None:
    """A conversion into the format a value is already in is exact (no flags), binary64's subnormals
    (below 2**-1022) included: 2**-1074 (the smallest), 3 * 2**-1030, -2**-1022 + 2**-1074."""
    x = np.array([2.0**-1074, 3 * 2.0**-1030, -(2.0**-1022 - 2.0**-1074), 2.0**-1022], np.float64)
    z, f = Fpu().convert(x, np.float64, return_flags=True)
    assert z.view(np.uint64).tolist() == x.view(np.uint64).tolist() and not f.any()
