"""Profiles and the simulated device: the register, the modes, matmul and reductions."""

from __future__ import annotations

import threading
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sim import SIX_MODES, Device, Flag, Fpu, LegacyModeWarning, OverflowMode, current_device, profiles
from sim.formats import BFLOAT16

H = np.float16
SAT, IEEE = OverflowMode.SATURATION, OverflowMode.INF_NAN

# The NPULossScaleOptimizer page's support table, copied by hand,
# with the overflow modes sim.profiles states, with its sources: (name, product, supported, modes, default).
SEED = [
    ("atlas-350", "Atlas 350 加速卡", True, {IEEE, SAT}, IEEE),
    ("atlas-a3", "Atlas A3 训练系列产品 / Atlas A3 推理系列产品", True, {IEEE, SAT}, IEEE),
    ("atlas-a2", "Atlas A2 训练系列产品 / Atlas A2 推理系列产品", True, {IEEE, SAT}, IEEE),
    ("atlas-200i-500-a2", "Atlas 200I/500 A2 推理产品", False, {SAT}, SAT),
    ("atlas-inference", "Atlas 推理系列产品", False, {SAT}, SAT),
    ("atlas-training", "Atlas 训练系列产品", True, {SAT}, SAT),
]


def test_profiles_match_the_seed() -> None:
    assert profiles.names() == [row[0] for row in SEED]
    for name, product, supported, modes, default in SEED:
        p = profiles.get(name)
        assert (p.product_zh, p.supports_npu_loss_scale_optimizer) == (product, supported)
        assert set(p.overflow_modes) == modes and p.default_overflow_mode is default
        assert p.saturation_is_legacy == (modes == {IEEE, SAT})
        assert p.product_en
    with pytest.raises(ValueError, match="atlas-a2.*atlas-training"):
        profiles.get("atlas-a9")


def test_unsupported_mode_is_refused_whole() -> None:
    with pytest.raises(ValueError, match=r"atlas-training \(Atlas training series\) supports SATURATION"):
        Device("atlas-training", overflow="inf_nan")
    with pytest.raises(ValueError, match="unknown OverflowMode"):
        Device("atlas-a2", overflow="wrap")
    with pytest.raises(RuntimeError):
        current_device()  # nothing was registered by the failed constructions
    with pytest.warns(LegacyModeWarning, match="compatibility"):
        Device("atlas-a2", overflow="saturation")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Device("atlas-training").overflow is SAT
        assert Device("atlas-a2").overflow is IEEE


def status(dev: Device) -> bool:
    return bool(dev.get_float_status().any())


@pytest.mark.parametrize("profile, mode", [("atlas-training", SAT), ("atlas-a2", IEEE)])
def test_overflowing_product_in_each_mode(profile: str, mode: OverflowMode) -> None:
    dev = Device(profile)
    x = np.array([300, -300, 2], H)
    y = dev.mul(x, np.array([300, 300, 2], H))
    if mode is SAT:
        assert y.tolist() == [65504.0, -65504.0, 4.0] and np.isfinite(y).all()
    else:
        assert y.tolist() == [np.inf, -np.inf, 4.0]
    assert dev.get_float_status().tolist() == [1, 0, 0, 1, 0, 0, 0, 0]


@given(steps=st.lists(st.tuples(st.sampled_from(["mul", "add", "exp", "div"]), st.booleans(), st.integers(0, 1)),
                      min_size=1, max_size=12),
       mode=st.sampled_from(["atlas-training", "atlas-a2"]))
@settings(max_examples=60, deadline=None)
def test_register_is_sticky_and_per_device(steps, mode) -> None:
    """Each step runs on one of two devices, with or without an event; clears
    happen only when asked. The register must equal a model of that."""
    devs = [Device(mode), Device(mode)]
    model = [False, False]
    quiet, loud = np.array([1.5, 2], H), np.array([300, 0], H)
    for op, event, which in steps:
        dev = devs[which]
        x = loud if event else quiet
        if op == "exp":
            dev.exp(np.array([12], H) if event else np.array([1], H))
        elif op == "div":
            dev.div(np.array([1], H), np.array([0 if event else 4], H))
        else:
            getattr(dev, op)(x, x if op == "mul" else np.array([65504, 1], H) if event else x)
        model[which] |= event
        dev.get_float_status()  # reading never clears
        assert [status(d) for d in devs] == model
    devs[0].clear_float_status()
    assert not status(devs[0]) and status(devs[1]) == model[1]


def test_forward_overflow_survives_the_backward_pass() -> None:
    dev = Device("atlas-training")
    w = np.array([[300, 1], [1, 1]], H)
    h = dev.matmul(w, w)  # forward: 300*300 overflows binary16 on output, saturates to 65504
    assert np.isfinite(h).all() and h.max() == 65504
    loss = dev.sum(dev.mul(h, np.array(1e-3, H)), accumulate=np.float32)
    grad = dev.mul(np.full_like(h, 1e-3), np.ones_like(h))  # a quiet backward pass
    assert np.isfinite(loss) and np.isfinite(grad).all()
    assert status(dev)  # the register still shows the forward event
    dev.clear_float_status()
    dev.mul(grad, grad)
    assert not status(dev)


def test_transcendentals_and_their_events() -> None:
    sat, ieee = Device("atlas-training"), Device("atlas-a2")
    assert float(sat.exp(np.array(12, H))) == 65504.0 and status(sat)  # exp(12) = 162755 saturates to 65504
    assert np.isinf(ieee.exp(np.array(12, H))) and status(ieee)
    sat.clear_float_status()
    assert float(sat.exp(np.array(11, H))) == float(H(np.exp(11))) and not status(sat)
    log0 = Device("atlas-a2")
    assert np.isneginf(log0.log(np.array(0, H))) and log0.get_float_status()[2] == 1
    neg = Device("atlas-training")
    assert float(neg.log(np.array(-1, H))) == 0.0 and neg.get_float_status()[1] == 1  # NaN -> 0
    quiet = Device("atlas-a2")
    x = np.array([-2, -0.0, 0.5, 3], H)
    assert quiet.relu(x).tolist() == [0, 0, 0.5, 3] and quiet.tanh(x)[3] == H(np.tanh(3.0))
    assert quiet.sigmoid(np.array(0, H)) == 0.5 and quiet.maximum(x, np.zeros(4, H)).tolist() == [0, 0, 0.5, 3]
    assert quiet.neg(x).tolist() == [2, 0, -0.5, -3] and quiet.abs(x).tolist() == [2, 0, 0.5, 3]
    assert not status(quiet)


def reference_matmul32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Plain loops: float32 additions along k in ascending order, exact products."""
    m, k = a.shape
    out = np.zeros((m, b.shape[1]), np.float32)
    for i in range(m):
        for j in range(b.shape[1]):
            acc = np.float32(0)
            for t in range(k):
                acc = np.float32(acc + np.float32(a[i, t]) * np.float32(b[t, j]))
            out[i, j] = acc
    return out


finite16 = st.floats(-300, 300, width=16, allow_subnormal=True)
adversarial = st.sampled_from([300.0, -300.0, 65504.0, -65504.0, 1e-3, -1e-3, 2.0**-24, 1.0, -1.0])


@given(data=st.data(), m=st.integers(1, 5), k=st.integers(1, 24), n=st.integers(1, 5))
@settings(max_examples=60, deadline=None)
def test_matmul_is_the_reference_bit_for_bit_and_within_the_float32_bound(data, m, k, n) -> None:
    elements = st.one_of(finite16, adversarial)
    a = data.draw(hnp.arrays(H, (m, k), elements=elements))
    b = data.draw(hnp.arrays(H, (k, n), elements=elements))
    dev = Device("atlas-a2")
    got = dev.matmul(a, b, out_dtype=np.float32)
    want = reference_matmul32(a, b)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    u = Fraction(1, 2**24)
    gamma = k * u / (1 - k * u)
    for i in range(m):
        for j in range(n):
            terms = [Fraction(float(a[i, t])) * Fraction(float(b[t, j])) for t in range(k)]
            bound = gamma * sum(abs(x) for x in terms)
            assert abs(Fraction(float(got[i, j])) - sum(terms)) <= bound
    rounded = dev.matmul(a, b)  # binary16 output: the binary32 sum rounded once
    with np.errstate(over="ignore"):
        assert np.array_equal(rounded.view(np.uint16), want.astype(H).view(np.uint16))


def test_partial_sums_that_overflow_binary16_but_not_binary32() -> None:
    a = np.array([[300, 300, -300, -300, 1]], H)
    b = np.full((5, 1), 300, H)  # partial sums 90000, 180000, 90000, 0, 300
    # binary16 accumulation, by hand. Saturation: 90000 -> 65504; +90000 -> 65504; -90000 -> -24496;
    # -90000 -> -65504; +300 = -65204 -> -65216 (ulp 32). INF/NaN: Inf from the first step on.
    for profile, wrong in (("atlas-training", -65216.0), ("atlas-a2", np.inf)):
        dev = Device(profile)
        assert float(dev.matmul(a, b, accumulate=np.float32)[0, 0]) == 300.0 and not status(dev)
        assert float(dev.matmul(a, b, accumulate=np.float16)[0, 0]) == wrong
        assert status(dev)


def test_sum_order_and_accumulation() -> None:
    dev = Device("atlas-a2")
    x = np.array([2048, 1, 1, 1, 1], H)
    # Pairwise tree: (2048+1) + (1+1) + 1 -> 2048 + 2 + 1 in binary16 (ulp 2 above 2048).
    assert float(dev.sum(x)) == float(H(H(H(2048) + H(2)) + H(1)))
    assert float(dev.sum(x, accumulate=np.float32)) == 2052.0
    big = np.full(8, 30000, H)
    assert np.isinf(dev.sum(big)) and status(dev)
    dev.clear_float_status()
    assert float(dev.sum(big, accumulate=np.float32, out_dtype=np.float32)) == 240000.0 and not status(dev)
    assert float(dev.mean(big, accumulate=np.float32)) == 30000.0 and not status(dev)
    cols = dev.sum(np.arange(12, dtype=H).reshape(3, 4), axis=0)
    assert cols.tolist() == [12, 15, 18, 21]
    assert float(dev.sum(np.zeros(0, H))) == 0.0


def test_cast_rounding_modes_and_events() -> None:
    dev = Device("atlas-training")
    x = np.array([1 + 2.0**-12, 70000.0], np.float32)
    assert dev.cast(x, H).tolist() == [1.0, 65504.0] and status(dev)
    assert float(dev.cast(x[:1], H, rounding="ceil")[0]) == 1 + 2.0**-10
    with pytest.raises(TypeError, match="int32"):
        dev.add(np.ones(2, np.int32), np.ones(2, np.int32))
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(2, 3\)"):
        dev.matmul(np.ones((2, 3), H), np.ones((2, 3), H))
    with pytest.raises(TypeError, match="float32"):
        dev.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), H))


def test_current_device_nesting_and_threads() -> None:
    outer, inner = Device("atlas-a2", name="rank0"), Device("atlas-a2", name="rank1")
    with outer:
        assert current_device() is outer
        with inner:
            assert current_device() is inner
        assert current_device() is outer
        seen = []

        def worker():
            try:
                seen.append(current_device())
            except RuntimeError:
                seen.append(None)
            with Device("atlas-training") as mine:
                seen.append(current_device() is mine)

        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert seen == [None, True]  # a new thread starts with no device
        assert current_device() is outer
    with pytest.raises(RuntimeError, match="no current device"):
        current_device()


def register_of(flags: np.ndarray) -> list[int]:
    """The register one device operation with these per-element flags leaves behind."""
    seen = [bool((flags & f).any()) for f in (Flag.OVERFLOW, Flag.INVALID, Flag.DIVBYZERO)]
    return [*map(int, seen), int(any(seen)), 0, 0, 0, 0]


@given(a=hnp.arrays(np.float32, 20, elements=st.floats(width=32, allow_nan=True)),
       b=hnp.arrays(np.float32, 20, elements=st.floats(width=32, allow_nan=True)),
       op=st.sampled_from(["add", "sub", "mul", "div"]), profile=st.sampled_from(["atlas-a2", "atlas-training"]))
@settings(max_examples=80, deadline=None)
def test_binary32_is_numpy_float32_with_ieee_events(a, b, op, profile) -> None:
    """binary32 to nearest even is numpy's float32 arithmetic (saturated in saturation mode);
    the register holds exactly the events IEEE 754 defines for it."""
    dev = Device(profile)
    got = getattr(dev, op)(a, b)
    with np.errstate(all="ignore"):
        want = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op](a, b)
    x, y = a.astype(np.float64), b.astype(np.float64)
    snan = lambda v: ((v.view(np.uint32) & 0x7FFFFFFF) > 0x7F800000) & ((v.view(np.uint32) & 0x400000) == 0)  # noqa: E731
    zero_div = (op == "div") & (y == 0) & np.isfinite(x) & (x != 0)
    flags = ((np.isinf(want) & np.isfinite(x) & np.isfinite(y) & ~zero_div) * Flag.OVERFLOW
             | ((np.isnan(want) & ~np.isnan(x) & ~np.isnan(y)) | snan(a) | snan(b)) * Flag.INVALID
             | zero_div * Flag.DIVBYZERO)
    if dev.overflow is SAT:
        big = np.float32(np.finfo(np.float32).max)
        want = np.where(np.isnan(want), np.float32(0), np.where(np.isinf(want), np.copysign(big, want), want))
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all()
    assert dev.get_float_status().tolist() == register_of(flags)


@given(x=hnp.arrays(np.float32, 30, elements=st.one_of(
    st.floats(width=32, allow_nan=True), st.floats(-65536, 65536, width=32),
    st.sampled_from([65519.996, 65520.0, -65520.0, 2.0**-25, 3 * 2.0**-26, 2.0**-24 * 1.5]))),
       profile=st.sampled_from(["atlas-a2", "atlas-training"]), rounding=st.sampled_from(list(SIX_MODES)))
@settings(max_examples=80, deadline=None)
def test_binary16_cast_is_mpfrs_conversion(x, profile, rounding) -> None:
    """Each element against MPFR's rounding of the binary32 value (tests/oracle.py), saturated in
    saturation mode; the register is what those flags raise."""
    from sim import BINARY16, BINARY32, Rounding

    from oracle import reference, saturated

    dev = Device(profile, rounding=rounding)
    got = dev.cast(x, H).view(np.uint16)
    flags = np.zeros(len(x), np.int64)
    for i, v in enumerate(x.view(np.uint32)):
        want, flags[i] = reference("convert", [int(v)], BINARY16, Rounding(rounding), src=BINARY32)
        if dev.overflow is SAT:
            want = saturated(want, BINARY16)
        nan = lambda b: (b & 0x7FFF) > 0x7C00  # noqa: E731
        assert got[i] == want or (nan(int(got[i])) and nan(want)), f"{x[i]!r}: got {got[i]:#x} want {want:#x}"
    assert dev.get_float_status().tolist() == register_of(flags)
    assert dev.status == Flag(int(np.bitwise_or.reduce(flags, initial=0)))


# -- the defects the compiled core fixed, each as found ------------------------------------
def b16(bits: int) -> np.ndarray:
    return np.array([bits], np.uint16).view(H)


def test_mean_divides_by_the_exact_count_with_one_rounding() -> None:
    dev = Device("atlas-a2")
    x = np.zeros(2049, H)
    x[0] = 2048
    assert int(dev.mean(x).view(np.uint16)) == 0x3BFF  # 2048/2049, not 2048/2048
    assert int(dev.mean(np.full(70_000, 0.001, H)).view(np.uint16)) == 0x1419  # the count is not a binary16
    assert not dev.get_float_status().any()
    assert np.isnan(dev.mean(np.zeros(0, H))) and dev.get_float_status()[1] == 1  # mean of nothing: 0/0


def test_a_conversion_follows_the_destinations_overflow_mode() -> None:
    dev = Device("atlas-training", saturate_float32=False)  # binary32 in INF/NaN mode, binary16 saturating
    assert int(dev.cast(np.array([1e5], np.float32), H).view(np.uint16)[0]) == 0x7BFF
    a, b = np.full((1, 2), 300, H), np.full((2, 1), 300, H)  # 180000 in binary32, too big for binary16
    assert int(dev.matmul(a, b).view(np.uint16)[0, 0]) == 0x7BFF
    assert float(dev.matmul(a, b, out_dtype=np.float32)[0, 0]) == 180000.0  # fits binary32: no event
    two = np.full(2, 65504, H)
    assert int(dev.sum(two, accumulate=np.float32).view(np.uint16)) == 0x7BFF
    assert float(dev.sum(two, accumulate=np.float32, out_dtype=np.float32)) == 131008.0
    assert dev.get_float_status().tolist() == [1, 0, 0, 3, 0, 0, 0, 0]


@pytest.mark.parametrize("a, b", [
    ([[np.inf, 1]], [[0], [1]]),  # 0 * Inf
    ([[np.inf, np.inf, np.nan]], [[1], [-1], [1]]),  # Inf - Inf, then a NaN that hides it
    ([[np.inf, 0]], [[1], [np.nan]]),  # a quiet NaN operand: NaN, but nothing invalid
], ids=["0*inf", "inf-inf-then-nan", "nan-operand"])
def test_matmul_binary32_accumulation_raises_invalid_inside_the_sum(a, b) -> None:
    dev = Device("atlas-a2")
    out = dev.matmul(np.array(a, H), np.array(b, H))
    assert np.isnan(out).all()
    invalid = a[0][0] == np.inf and (b[0][0] == 0 or b[1][0] == -1)
    assert dev.get_float_status()[1] == invalid
    # The binary16-accumulation path agrees.
    ref = Device("atlas-a2")
    ref.matmul(np.array(a, H), np.array(b, H), accumulate=np.float16)
    assert ref.get_float_status()[1] == invalid


def test_matmul_signaling_nan_operand_is_invalid() -> None:
    for acc in (np.float32, np.float16):
        dev = Device("atlas-a2")
        a = np.ones((2, 2), H)
        a[1, 1] = b16(0x7D00)[0]  # signaling NaN
        assert np.isnan(dev.matmul(a, np.ones((2, 2), H), accumulate=acc)[1]).all()
        assert dev.get_float_status().tolist() == [0, 1, 0, 1, 0, 0, 0, 0]


def test_register_slot_3_counts_operations_not_steps() -> None:
    dev = Device("atlas-a2")
    a = np.full((2, 8), 300, H)
    dev.matmul(a, np.full((8, 3), 300, H), accumulate=np.float16)  # 8 steps, every one overflows
    assert dev.get_float_status().tolist() == [1, 0, 0, 1, 0, 0, 0, 0]
    dev.sum(np.full(64, 30000, H))  # 6 tree levels
    assert dev.get_float_status().tolist() == [1, 0, 0, 2, 0, 0, 0, 0]
    dev.div(np.ones(3, H), np.zeros(3, H))
    dev.log(np.array([-1.0, 0.0], H))
    assert dev.get_float_status().tolist() == [1, 1, 1, 4, 0, 0, 0, 0]
    dev.add(np.ones(3, H), np.ones(3, H))  # no event: no count
    assert dev.get_float_status()[3] == 4


def test_device_keeps_a_sticky_ieee_status_beside_the_register() -> None:
    dev = Device("atlas-training")
    assert dev.status == Flag(0)
    dev.div(np.ones(1, H), np.full(1, 3, H))  # inexact only: nothing for the register
    assert dev.status == Flag.INEXACT and not dev.get_float_status().any()
    dev.mul(np.full(1, 2.0**-14, H), np.full(1, 2.0**-3, H))  # exact subnormal: nothing
    dev.mul(np.full(1, 2.0**-14, H), np.full(1, 0.3, H))  # inexact subnormal: underflow
    assert dev.status == Flag.INEXACT | Flag.UNDERFLOW
    dev.mul(np.full(1, 300, H), np.full(1, 300, H))
    dev.clear_float_status()  # the register only
    assert dev.status == Flag.INEXACT | Flag.UNDERFLOW | Flag.OVERFLOW
    dev.clear_status()
    assert dev.status == Flag(0)


def test_maximum_and_minimum_are_ieee_2019() -> None:
    dev = Device("atlas-a2")
    pz, nz = np.zeros(1, H), -np.zeros(1, H)
    for x, y in ((pz, nz), (nz, pz)):
        assert int(dev.maximum(x, y).view(np.uint16)[0]) == 0x0000
        assert int(dev.minimum(x, y).view(np.uint16)[0]) == 0x8000
    nan = dev.maximum(np.array([np.nan, 1], H), np.array([1, b16(0x7D00)[0]], H))
    assert nan.view(np.uint16).tolist() == [0x7E00, 0x7E00]  # the profile's default NaN, bits
    assert dev.get_float_status().tolist() == [0, 1, 0, 1, 0, 0, 0, 0]  # only the signaling NaN


def test_nan_results_have_the_profiles_default_nan_bits() -> None:
    import dataclasses

    from sim.rounding import Choices
    profile = dataclasses.replace(profiles.get("atlas-a2"), choices=Choices(default_nan=0x7FFF))
    dev = Device(profile)
    for got in (dev.sub(np.full(1, np.inf, H), np.full(1, np.inf, H)), dev.log(np.full(1, -1, H)),
                dev.matmul(np.array([[np.inf]], H), np.zeros((1, 1), H), accumulate=np.float16),
                dev.sum(np.array([np.inf, -np.inf], H)), dev.cast(np.full(1, np.nan, np.float32), H)):
        assert int(np.asarray(got).reshape(-1).view(np.uint16)[0]) == 0x7FFF


def test_neg_and_abs_are_sign_bit_operations() -> None:
    fpu = Fpu()
    nans = np.array([0x7E00, 0xFE00, 0x7D00, 0x7C01], np.uint16).view(H)
    z, f = fpu.neg(nans, return_flags=True)
    assert z.view(np.uint16).tolist() == [0xFE00, 0x7E00, 0xFD00, 0xFC01] and not f.any()
    z, f = fpu.abs(nans, return_flags=True)
    assert z.view(np.uint16).tolist() == [0x7E00, 0x7E00, 0x7D00, 0x7C01] and not f.any()
    sat = Fpu("saturation")
    assert sat.neg(np.array([np.inf, np.nan], H)).view(np.uint16).tolist() == [0xFBFF, 0x0000]


def test_matmul_default_accumulation_comes_from_the_profile() -> None:
    import dataclasses
    a = np.array([[300, 300, -300, -300, 1]], H)
    b = np.full((5, 1), 300, H)
    assert float(Device("atlas-training").matmul(a, b)[0, 0]) == 300.0  # binary32, the cube unit
    sixteen = dataclasses.replace(profiles.get("atlas-training"), matmul_accumulate=np.float16)
    assert float(Device(sixteen).matmul(a, b)[0, 0]) == -65216.0  # the hand-worked binary16 sum above


def test_threaded_matmul_is_the_in_order_binary32_sum() -> None:
    """One thread and two (the rows split) against the documented sum written with numpy:
    binary16 products (exact in binary32: 22 significant bits at most) added along k in ascending
    order, each addition rounded to binary32, then rounded once to the output dtype."""
    from sim.device.cube import THREADED_MATMUL
    rng = np.random.default_rng(3)
    m = k = n = 128
    assert m * k * n >= THREADED_MATMUL  # large enough that the rows are split
    a = (rng.standard_normal((m, k)) * 30).astype(H)
    b = (rng.standard_normal((k, n)) * 30).astype(H)
    total = np.zeros((m, n), np.float32)
    for j in range(k):
        total = total + a[:, j:j + 1].astype(np.float32) * b[j:j + 1, :].astype(np.float32)
    for threads in (1, 2):
        dev = Device("atlas-a2", threads=threads)
        for out in (np.float16, np.float32):
            want = total.astype(out)
            assert np.array_equal(dev.matmul(a, b, out_dtype=out).view(np.uint8), want.view(np.uint8)), (threads, out)
        assert dev.get_float_status().tolist() == [0] * 8  # |sums| < 65504 here: no event
    with pytest.raises(ValueError, match="threads"):
        Device("atlas-a2", threads=0)


def test_binary32_sum_follows_the_tree() -> None:
    dev = Device("atlas-a2")
    x = np.array([1e8, 1, -1e8, 1], np.float32)
    assert float(dev.sum(x)) == 0.0  # (1e8 + 1) + (-1e8 + 1): each pair rounds to +-1e8
    assert float(np.sum(x.astype(np.float64))) == 2.0  # the exact sum


def test_matmul_status_has_inexact_from_inside_the_binary32_sum() -> None:
    dev = Device("atlas-a2")
    got = dev.matmul(np.array([[4096, 1]], H), np.array([[4096], [1]], H), out_dtype=np.float32)
    assert float(got[0, 0]) == 2.0**24 and dev.status == Flag.INEXACT  # 2**24 + 1 rounds; the output is exact
    exact = Device("atlas-a2")
    assert float(exact.matmul(np.array([[1, 2]], H), np.array([[3], [4]], H))[0, 0]) == 11.0
    assert exact.status == Flag(0)
    rounded = Device("atlas-a2")
    rounded.matmul(np.array([[1, 2.0**-12]], H), np.array([[1], [1]], H))  # exact in binary32, not in binary16
    assert rounded.status == Flag.INEXACT


def test_labels_nest_and_come_off_when_the_block_ends() -> None:
    dev = Device()
    assert dev.current_label is None
    with dev.label("encoder"):
        with dev.label("encoder.attn"):
            assert dev.current_label == "encoder.attn"
        assert dev.current_label == "encoder"
        with pytest.raises(ValueError), dev.label("broken"):
            raise ValueError
        assert dev.current_label == "encoder"
    assert dev.current_label is None


def test_a_label_block_says_whether_an_operation_in_it_raised_an_event() -> None:
    dev = Device("atlas-a2")
    with dev.label("clean") as clean:
        dev.add(np.ones(2, H), np.ones(2, H))  # exact: no flag
        dev.add(np.ones(1, H), np.full(1, 2.0**-12, H))  # INEXACT only: not an event
    assert clean.raised is False
    with dev.label("outer") as outer:
        with dev.label("inner") as inner:
            dev.mul(np.full(1, 300, H), np.full(1, 300, H))  # 90000: OVERFLOW
        dev.add(np.ones(1, H), np.ones(1, H))
    assert inner.raised and outer.raised
    with pytest.raises(ValueError), dev.label("broken") as broken:
        dev.div(np.ones(1, H), np.zeros(1, H))  # DIVBYZERO, then the block fails
        raise ValueError
    assert broken.raised and dev.current_label is None


def _scalar_state(dev: Device) -> tuple:
    """All that a conversion leaves on a device: the register, both sticky statuses, the log."""
    return (dev.get_float_status().tolist(), dev.status, dev.fpu.status, [tuple(e) for e in dev.events])


@pytest.mark.parametrize("profile", ["atlas-a2", "atlas-training"])  # INF_NAN, SATURATION
@pytest.mark.parametrize("dtype", [np.float16, np.float32, "bfloat16"])
def test_scalar_is_a_float64_cast_every_time_it_is_asked(profile: str, dtype) -> None:
    """Device.scalar keeps each value's conversion, yet every call returns and records what the
    cast of a float64 0-d array does: the same bits, the register, the statuses and the log."""
    dtype = np.dtype(BFLOAT16.dtype if dtype == "bfloat16" else dtype)
    values = [0.1, -0.0, 0.0, 1e6, -1e40, 1e-8, 3, float("inf"), float("nan"), 1 / 3, 65520.0]
    kept = Device(profile, record_events=True)
    cast = Device(profile, record_events=True)
    for i, value in enumerate(values * 2):  # the second round: every value kept
        for dev in (kept, cast):
            dev.set_tags(value=value)
            if i == len(values):  # the sticky statuses cleared, so the kept ones' flags show again
                dev.clear_status()
                dev.fpu.clear_status()
        with kept.label("kept"), cast.label("kept"):
            got, want = kept.scalar(value, dtype), cast.cast(np.asarray(value, np.float64), dtype)
        assert got.shape == want.shape == () and got.dtype == want.dtype
        assert got.tobytes() == want.tobytes(), value
        assert _scalar_state(kept) == _scalar_state(cast), value
    got = kept.scalar(1e6, dtype)
    got[()] = 0  # a new array each time: the kept one is not changed
    assert kept.scalar(1e6, dtype).tobytes() == cast.cast(np.asarray(1e6, np.float64), dtype).tobytes()


def test_event_count_is_slot_3_of_the_register() -> None:
    dev = Device("atlas-a2")
    assert dev.event_count == 0
    dev.mul(np.full(2, 300, H), np.full(2, 300, H))
    dev.add(np.ones(2, H), np.ones(2, H))  # no event
    dev.div(np.ones(1, H), np.zeros(1, H))
    assert dev.event_count == 2 == dev.get_float_status()[3]
    dev.clear_float_status()
    assert dev.event_count == 0


def test_operations_counts_every_call_and_never_resets() -> None:
    """``operations``: one per device call, with or without an event, whatever its size (a matmul,
    a sum, a cast, a scalar), kept across clears of the register and the status."""
    dev = Device("atlas-training")
    calls = [lambda: dev.add(np.ones(5, H), np.ones(5, H)), lambda: dev.mul(np.full(2, 300, H), np.full(2, 300, H)),
             lambda: dev.matmul(np.ones((3, 4), H), np.ones((4, 2), H)), lambda: dev.sum(np.ones(9, H)),
             lambda: dev.cast(np.ones(3, np.float32), H), lambda: dev.scalar(2.5, H), lambda: dev.exp(np.ones(4, H))]
    for n, call in enumerate(calls, 1):
        call()
        assert dev.operations == n
        dev.clear_float_status()
        dev.clear_status()
    assert dev.event_count == 0 and dev.operations == len(calls)
