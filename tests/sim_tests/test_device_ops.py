"""The device operations models need beyond arithmetic: sqrt, rsqrt, erf, comparisons, max/min
reductions, batched matmul and conv2d, each against a reference written here afresh."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lossscale.testing import binary16_arrays
from sim import BINARY16, Device, OverflowMode
from sim.rounding import Flag

H, F32 = np.float16, np.float32
SNAN, QNAN = 0x7D00, 0x7E00


def bits(x) -> np.ndarray:
    return np.asarray(x).view(np.uint16)


def is_snan(b: int) -> bool:
    return (b & 0x7FFF) > 0x7C00 and not b & 0x200


@pytest.mark.parametrize("profile", ["atlas-a2", "atlas-training"])
@pytest.mark.parametrize("fn", ["sqrt", "rsqrt", "erf"])
def test_elementary_ops_are_mpfrs_with_events_in_the_register(fn: str, profile: str) -> None:
    """Each element against MPFR (tests/oracle.py; saturated in saturation mode), and the register."""
    from sim import Rounding

    from oracle import reference, saturated

    dev = Device(profile)
    x = np.array([0.0, -0.0, -1.0, 2.0, 4.0, 2.0**-24, 65504.0, np.inf, -np.inf, 0.3, 3.0], H)
    x = np.concatenate([x, np.array([SNAN, QNAN], np.uint16).view(H)])
    got = bits(getattr(dev, fn)(x)).tolist()
    for g, b in zip(got, bits(x).tolist(), strict=True):
        want, _ = reference(fn, [b], BINARY16, Rounding.NEAREST_EVEN)
        if dev.overflow is OverflowMode.SATURATION:
            want = saturated(want, BINARY16)
        assert g == want or ((g & 0x7FFF) > 0x7C00 and (want & 0x7FFF) > 0x7C00), f"{fn}({b:#x}): {g:#x} != {want:#x}"
    reg = dev.get_float_status()
    assert reg[1] == 1  # sNaN (and sqrt/rsqrt of -1): INVALID
    assert reg[2] == int(fn == "rsqrt")  # rsqrt(+-0) = +-Inf: DIVBYZERO
    assert reg[3] == 1  # one device operation


def test_rsqrt_of_zero_is_signed_infinity_or_max() -> None:
    z = np.array([0.0, -0.0], H)
    assert Device("atlas-a2").rsqrt(z).tolist() == [np.inf, -np.inf]
    assert Device("atlas-training").rsqrt(z).tolist() == [65504.0, -65504.0]


PREDICATES = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
              "ge": np.greater_equal}


@given(data=st.data(), op=st.sampled_from(list(PREDICATES)))
@settings(max_examples=25, deadline=None)
def test_comparisons_are_ieee_predicates(data, op: str) -> None:
    a = data.draw(binary16_arrays())
    b = data.draw(binary16_arrays(st.just(a.shape)))
    dev = Device("atlas-a2")
    with np.errstate(invalid="ignore"):
        want = PREDICATES[op](a.astype(np.float64), b.astype(np.float64))  # NaN: unordered
    got = getattr(dev, op)(a, b)
    assert got.dtype == bool and got.tolist() == want.tolist()
    ab = np.concatenate([bits(a).ravel(), bits(b).ravel()]).tolist()
    nan = any((v & 0x7FFF) > 0x7C00 for v in ab)
    invalid = any(is_snan(v) for v in ab) or (nan and op not in ("eq", "ne"))
    assert dev.get_float_status()[1] == int(invalid)


def ieee_extremum(values: list[int], biggest: bool, saturate: bool) -> int:
    """IEEE 754-2019 maximum / minimum of binary16 bit patterns, then the overflow mode."""
    if any((v & 0x7FFF) > 0x7C00 for v in values):
        return 0 if saturate else BINARY16.default_nan
    key = lambda v: (float(np.uint16(v).view(H)), v < 0x8000)  # noqa: E731 (+0 above -0, for both)
    best = functools.reduce(lambda x, y: y if (key(y) > key(x)) == biggest and key(y) != key(x) else x, values)
    if saturate and (best & 0x7FFF) == 0x7C00:
        return best - 1
    return best


@given(x=binary16_arrays(st.tuples(st.integers(1, 9), st.integers(1, 7))),
       op=st.sampled_from(["amax", "amin"]), axis=st.sampled_from([None, 0, 1, -1]),
       profile=st.sampled_from(["atlas-a2", "atlas-training"]))
@settings(max_examples=80, deadline=None)
def test_max_min_reductions_are_exact_ieee(x, op: str, axis, profile: str) -> None:
    dev = Device(profile)
    got = bits(getattr(dev, op)(x, axis=axis))
    b = bits(x).astype(int)
    sat = dev.overflow is OverflowMode.SATURATION
    if axis is None:
        want = ieee_extremum(b.ravel().tolist(), op == "amax", sat)
        assert int(got) == want
    else:
        cols = np.moveaxis(b, axis, 0).reshape(b.shape[axis], -1).T
        assert got.tolist() == [ieee_extremum(c.tolist(), op == "amax", sat) for c in cols]
    assert dev.get_float_status()[1] == int(any(is_snan(v) for v in b.ravel().tolist()))


def test_reductions_keep_a_nan_in_saturation_mode_until_the_end() -> None:
    """[NaN, 1, 5]: the maximum is NaN, which saturation mode makes 0 once; a NaN saturated
    half-way would have lost to 5."""
    x = np.array([QNAN, 0x3C00, 0x4500], np.uint16).view(H)
    assert Device("atlas-training").amax(x) == 0
    with pytest.raises(ValueError, match="empty"):
        Device().amax(np.zeros((0, 3), H), axis=0)


def test_batched_matmul_is_the_stack_of_matmuls_and_one_operation() -> None:
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((3, 1, 6, 5)) * 8000).astype(H)  # overflows binary16 in some sums
    b = (rng.standard_normal((4, 5, 7)) * 4).astype(H)
    dev, ref = Device("atlas-training"), Device("atlas-training")
    got = dev.matmul(a, b)
    assert got.shape == (3, 4, 6, 7)
    for i in range(3):
        for j in range(4):
            assert bits(got[i, j]).tolist() == bits(ref.matmul(a[i, 0], b[j])).tolist()
    assert dev.get_float_status()[0] == 1 and dev.get_float_status()[3] == 1  # one op, though 12 products
    with pytest.raises(ValueError, match="do not broadcast"):
        dev.matmul(np.zeros((2, 3, 4), H), np.zeros((3, 4, 5), H))


_STACK_VALUES = st.sampled_from([0.0, -0.0, 1.0, -2.0, 3.0, 0.5, 2.0**-14, 2.0**-24, 4096.0, 65504.0, -65504.0,
                                  np.inf, -np.inf, np.nan, 0.1, -7.5, 1000.0])


@settings(max_examples=60, deadline=None)
@given(data=st.data(), count=st.integers(0, 7), m=st.integers(1, 5), k=st.integers(0, 6), n=st.integers(1, 5),
       out=st.sampled_from([np.float16, np.float32, "bfloat16"]), bf16=st.booleans(), biased=st.booleans(),
       profile=st.sampled_from(["atlas-a2", "atlas-training"]))
def test_a_stack_of_matmuls_is_each_matmul_alone(data, count, m, k, n, out, bf16, biased, profile) -> None:
    """A stack (one compiled call for all its matrices: a batch, a depthwise convolution's groups)
    gives each matrix's bits and the OR of their flags, as matmuls of the matrices one by one: shapes
    on both sides of the transposed product (N < M), sums that round or stay exact (the second pass
    for INEXACT inside the sum), infinities, NaNs, a signaling NaN and fused biases."""
    import ml_dtypes

    if bf16 or biased:  # a cube unit that takes bfloat16 and has a bias table
        profile = "atlas-a2"
    dtype = ml_dtypes.bfloat16 if bf16 else H
    values = lambda shape: np.array(data.draw(st.lists(_STACK_VALUES, min_size=int(np.prod(shape)),  # noqa: E731
                                                       max_size=int(np.prod(shape)))), np.float64).reshape(shape)
    a, b = values((count, m, k)).astype(dtype), values((count, k, n)).astype(dtype)
    for x in (a, b):  # a signaling NaN in either operand
        if x.size and data.draw(st.booleans()):
            x.reshape(-1).view(np.uint16)[data.draw(st.integers(0, x.size - 1))] = 0x7F81 if bf16 else SNAN
    bias = values((n,)).astype(np.float32) if biased else None
    stacked = Device(profile)
    got = stacked.matmul(a, b, out_dtype=out, bias=bias, fuse_bias=True)
    alone = Device(profile)
    want = [alone.matmul(a[i], b[i], out_dtype=out, bias=bias, fuse_bias=True) for i in range(count)]
    assert got.shape == (count, m, n)
    assert [g.view(np.uint16 if g.itemsize == 2 else np.uint32).tolist() for g in got] == \
        [w.view(np.uint16 if w.itemsize == 2 else np.uint32).tolist() for w in want]
    assert stacked.status == alone.status
    assert stacked.get_float_status()[:3].tolist() == alone.get_float_status()[:3].tolist()


@pytest.mark.parametrize("values", ["mixed", "exact"])
@pytest.mark.parametrize("out", [np.float16, "bfloat16", np.float32])
@pytest.mark.parametrize("profile, bf16", [("atlas-a2", False), ("atlas-training", False), ("atlas-a2", True)])
@pytest.mark.parametrize("stacked", [False, True])
def test_a_long_matmul_rounds_its_sums_as_short_ones(values: str, out, profile: str, bf16: bool,
                                                     stacked: bool) -> None:
    """A matmul with at least ``sim.fpu.NARROWING_MIN`` outputs rounds its binary32 sums into a
    16-bit format by a table: the same bits, status and register as the same rows in products too
    short to read it. Mixed values: rounding, overflow (saturated or Inf), Inf, NaN, a signaling
    NaN; exact ones: every output exact, one sum rounding inside (2**24 + 1 - 2**24), so that only
    the second pass for INEXACT sees it."""
    import ml_dtypes

    from sim import fpu

    dtype = ml_dtypes.bfloat16 if bf16 else H
    rng = np.random.default_rng(7)
    m, k, n = 2 * (fpu.NARROWING_MIN // 256 + 3), 3, 256  # 2 * 259 rows of 256: over the bound
    if values == "mixed":
        a = rng.standard_normal((m, k)) * rng.choice([1.0, 300.0, 3e4], (m, 1))
        b = rng.standard_normal((k, n)) * rng.choice([1.0, 300.0], (1, n))
        a[5, 1], a[9, 0], b[2, 7] = np.inf, np.nan, np.nan
    else:
        a, b = rng.integers(-3, 4, (m, k)).astype(np.float64), rng.integers(-3, 4, (k, n)).astype(np.float64)
        a[4], b[:, 4] = (4096.0, 1.0, -4096.0), (4096.0, 1.0, 4096.0)
    a, b = a.astype(dtype), b.astype(dtype)
    if values == "mixed":
        a.view(np.uint16)[11, 2] = 0x7F81 if bf16 else SNAN
    long, short = Device(profile), Device(profile)
    if stacked:
        got = long.matmul(a.reshape(2, m // 2, k), np.stack([b, b]), out_dtype=out).reshape(m, n)
    else:
        got = long.matmul(a, b, out_dtype=out)
    piece = fpu.NARROWING_MIN // n // 2
    want = np.concatenate([short.matmul(a[i:i + piece], b, out_dtype=out) for i in range(0, m, piece)])
    u = np.uint32 if got.itemsize == 4 else np.uint16
    assert np.array_equal(got.view(u), want.view(u))
    assert long.status == short.status
    assert long.get_float_status()[:3].tolist() == short.get_float_status()[:3].tolist()
    if values == "exact":  # the rounding inside the one sum reached the status
        assert long.status & Flag.INEXACT


@pytest.mark.parametrize("special, invalid", [(np.inf, 1), (np.nan, 0), ("snan", 1)])
def test_a_stack_sees_the_specials_of_either_operand(special, invalid: int) -> None:
    """0 * Inf in a sum (INVALID), a NaN, a signaling NaN: in the second operand of one matrix of a
    stack alone, the stack raises what that matrix raises alone."""
    a = np.ones((3, 2, 2), H)
    a[1, 0, 0] = 0.0
    b = np.ones((3, 2, 2), H)
    b[1, 0, 0] = np.nan if special == "snan" else special
    if special == "snan":
        b.view(np.uint16)[1, 0, 0] = SNAN
    stacked, alone = Device("atlas-a2"), Device("atlas-a2")
    got = stacked.matmul(a, b)
    want = [alone.matmul(a[i], b[i]) for i in range(3)]
    assert [bits(g).tolist() for g in got] == [bits(w).tolist() for w in want]
    assert stacked.status == alone.status and stacked.get_float_status()[1] == alone.get_float_status()[1]
    assert stacked.get_float_status()[1] == invalid  # 0 * Inf and a signaling NaN are INVALID


def conv_reference(x: np.ndarray, w: np.ndarray, stride: int, padding: int, dilation: int) -> np.ndarray:
    """The documented order, one element at a time: binary32 sums from +0 of the exact products
    in ascending (c, kh, kw), each addition rounded to nearest (numpy float32 scalars)."""
    n, c, hh, ww = x.shape
    o, _, kh, kw = w.shape
    xp = np.zeros((n, c, hh + 2 * padding, ww + 2 * padding), F32)
    xp[:, :, padding:padding + hh, padding:padding + ww] = x
    oh = (hh + 2 * padding - dilation * (kh - 1) - 1) // stride + 1
    ow = (ww + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, o, oh, ow), F32)
    w32 = w.astype(F32)
    for b in range(n):
        for f in range(o):
            for i in range(oh):
                for j in range(ow):
                    s = F32(0)
                    for ci in range(c):
                        for u in range(kh):
                            for v in range(kw):
                                s = F32(s + xp[b, ci, i * stride + u * dilation, j * stride + v * dilation]
                                        * w32[f, ci, u, v])
                    out[b, f, i, j] = s
    return out


@pytest.mark.parametrize("stride, padding, dilation", [(1, 0, 1), (2, 1, 1), (1, 2, 2), (3, 1, 2)])
def test_conv2d_adds_in_the_documented_order(stride: int, padding: int, dilation: int) -> None:
    rng = np.random.default_rng(stride * 10 + padding + dilation)
    # Spread magnitudes, so that the binary32 order matters and some sums round.
    x = (rng.standard_normal((2, 3, 7, 8)) * 2.0 ** rng.integers(-8, 9, (2, 3, 7, 8))).astype(H)
    w = (rng.standard_normal((4, 3, 3, 2)) * 2.0 ** rng.integers(-8, 9, (4, 3, 3, 2))).astype(H)
    dev = Device("atlas-a2")
    got = dev.conv2d(x, w, stride, padding, dilation, out_dtype=F32)
    want = conv_reference(x, w, stride, padding, dilation)
    assert got.shape == want.shape and got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    # ...and near the exact value: each of the K additions loses at most half an ulp of binary32.
    exact = conv_reference(x.astype(np.float64), w.astype(np.float64), stride, padding, dilation)
    absum = conv_reference(np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)), stride, padding, dilation)
    k = w[0].size
    assert np.all(np.abs(got - exact) <= k * 2.0**-24 * absum)
    h16 = dev.conv2d(x, w, stride, padding, dilation)  # rounded once more, to binary16 (INF/NaN mode)
    with np.errstate(over="ignore"):
        assert h16.view(np.uint16).tolist() == got.astype(H).view(np.uint16).tolist()


def test_conv2d_refuses_bad_shapes_and_arguments() -> None:
    dev = Device()
    with pytest.raises(ValueError, match=r"x \(N, C, H, W\)"):
        dev.conv2d(np.zeros((3, 4, 4), H), np.zeros((1, 3, 2, 2), H))
    with pytest.raises(ValueError, match="stride must be an integer of at least 1"):
        dev.conv2d(np.zeros((1, 3, 4, 4), H), np.zeros((1, 3, 2, 2), H), stride=0)
    with pytest.raises(ValueError, match="larger than the padded input"):
        dev.conv2d(np.zeros((1, 3, 2, 2), H), np.zeros((1, 3, 3, 3), H))
