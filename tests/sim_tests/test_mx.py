"""MX block quantisation (OCP's floor rule and the round-up rule), dequantisation, and the
device's FP8 and MX matmuls."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from sim import Device, Flag, Fpu, OverflowMode, formats, mx

E4M3 = ml_dtypes.float8_e4m3fn


def test_shared_exponents_hand_worked() -> None:
    amax = np.array([448.0, 1.0, 449.0, 0.0, np.inf, np.nan, 2.0**-140, 3.0, 495.0, 496.0])
    e4m3 = formats.FLOAT8_E4M3FN  # emax 8, MAX 448 = 1.75 * 2**8, 3 fraction bits
    # floor: floor(log2 amax) - 8; rceil: ceil(log2(amax / 448)); ceil: ceil(log2 amax) - 8; even: floor
    # after rounding amax half up to 3 fraction bits (496 = 1.9375 * 2**8 rounds to 2**9, 495 does not)
    assert list(mx.shared_exponents(amax, e4m3, "floor")) == [127, 119, 127, 0, 255, 255, 0, 120, 127, 127]
    assert list(mx.shared_exponents(amax, e4m3, "rceil")) == [127, 119, 128, 0, 255, 255, 0, 120, 128, 128]
    assert list(mx.shared_exponents(amax, e4m3, "ceil")) == [128, 119, 128, 0, 255, 255, 0, 121, 128, 128]
    assert list(mx.shared_exponents(amax, e4m3, "even")) == [127, 119, 127, 0, 255, 255, 0, 120, 127, 128]
    # E2M1 (emax 2, max 6): amax 6 -> 2**(2-2) floor, 2**0 rceil; amax 7 -> 2**0 floor, 2**1 rceil
    e2m1 = formats.FLOAT4_E2M1FN
    assert list(mx.shared_exponents(np.array([6.0, 7.0]), e2m1, "floor")) == [127, 127]
    assert list(mx.shared_exponents(np.array([6.0, 7.0]), e2m1, "rceil")) == [127, 128]
    with pytest.raises(ValueError, match="floor, rceil, ceil, even"):
        mx.shared_exponents(amax, e4m3, "nearest")


@pytest.mark.parametrize("rule", [r for r in mx.RULES if r not in mx.CANN_RULES])
@pytest.mark.parametrize("fmt", mx.ELEMENTS, ids=lambda f: f.name)
def test_quantize_is_the_saturating_cast_of_x_over_its_block_scale(fmt, rule: str) -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 70)) * 2.0 ** rng.integers(-20, 20, (5, 1))).astype(np.float32)
    q = mx.quantize(x, fmt, axis=1, rule=rule)
    assert q.elements.shape == x.shape and q.scales.shape == (5, 3)  # 70 = 32 + 32 + 6 (padded)
    scale = np.repeat(q.scales.view(ml_dtypes.float8_e8m0fnu).astype(np.float64), 32, axis=1)[:, :70]
    ratio = np.clip(x / scale, -fmt.max, fmt.max)  # exact: the scale is a power of two
    if fmt.dtype == np.uint8:  # E1M2: no ml_dtypes type; its cast is held to MPFR in test_eight_bit.py
        want = Fpu().convert(ratio.astype(np.float32), fmt)
    else:
        want = ratio.astype(fmt.dtype).view(np.uint8)
    assert np.array_equal(q.elements.view(np.uint8), want)
    assert np.array_equal(mx.dequantize(q), formats.decode(want, fmt) * scale)
    if rule in ("rceil", "ceil"):  # the round-up rules never clamp
        assert np.all(np.abs(x / scale) <= fmt.max)


def test_quantize_along_the_first_axis_and_bad_input() -> None:
    x = (np.arange(64, dtype=np.float32) % 8 - 4).reshape(64, 1)
    q = mx.quantize(x, "float8_e5m2", axis=0)
    assert q.scales.shape == (2, 1) and np.array_equal(mx.dequantize(q), x)  # small integers are exact
    with pytest.raises(ValueError, match="MX elements"):
        mx.quantize(x, "hifloat8")
    with pytest.raises(ValueError, match="block"):
        mx.quantize(x, "float8_e4m3fn", block=0)


def test_device_quantisation_rounds_as_asked_and_draws_afresh() -> None:
    x = np.zeros((1, 32), np.float32)
    x[0, :2] = 300, 1.95
    dev = Device("atlas-350", seed=1)
    assert mx.dequantize(dev.quantize_mx(x, rounding="trunc"))[0, :2].tolist() == [288.0, 1.875]
    assert mx.dequantize(dev.quantize_mx(x))[0, :2].tolist() == [288.0, 2.0]
    y = np.full((1, 32), 1 + 2**-5, np.float32)
    one, two = (dev.quantize_mx(y, rounding="stochastic").elements.view(np.uint8) for _ in range(2))
    assert not np.array_equal(one, two)  # each call draws its own bits from the device's seed
    again = Device("atlas-350", seed=1).quantize_mx(y, rounding="stochastic").elements.view(np.uint8)
    assert np.array_equal(again, one)


def test_matmul_fp8_is_exact_products_summed_in_binary32() -> None:
    rng = np.random.default_rng(5)
    a = rng.integers(-8, 9, (6, 40)).astype(E4M3)
    b = rng.integers(-8, 9, (40, 3)).astype(ml_dtypes.float8_e5m2)
    dev = Device("atlas-350")
    got = dev.matmul_fp8(a, b, scale_inv=0.25)
    assert got.dtype == np.float32
    assert np.array_equal(got, (a.astype(np.float64) @ b.astype(np.float64)) * 0.25)  # all exact here
    wide = dev.matmul(a.astype(np.float16), b.astype(np.float16), accumulate=np.float32, out_dtype=np.float32)
    assert np.array_equal(dev.matmul_fp8(a, b), wide)  # the cube unit's binary16 path, exactly
    codes = dev.cast(a.astype(np.float16), "hifloat8")
    assert np.array_equal(dev.matmul_fp8(codes, b, "hifloat8"), dev.matmul_fp8(a, b))  # integers <= 8: exact
    with pytest.raises(TypeError, match="named"):
        dev.matmul_fp8(codes, b)


def test_matmul_fp8_overflow_reaches_the_register() -> None:
    dev = Device("atlas-350")
    a = np.full((1, 64), 448, E4M3)
    dev.matmul_fp8(a, a.T.copy(), scale_inv=2.0**120)
    assert dev.status & Flag.OVERFLOW


def test_matmul_mx_is_the_block_scaled_sum() -> None:
    rng = np.random.default_rng(6)
    a = (rng.integers(-4, 5, (3, 64)) * 2.0 ** rng.integers(-3, 4, (3, 64))).astype(np.float32)
    b = (rng.integers(-4, 5, (64, 2)) * 2.0 ** rng.integers(-3, 4, (64, 2))).astype(np.float32)
    qa, qb = mx.quantize(a, "float8_e4m3fn", axis=1), mx.quantize(b, "float8_e4m3fn", axis=0)
    got = Device("atlas-350").matmul_mx(qa, qb)
    assert np.array_equal(got, mx.dequantize(qa) @ mx.dequantize(qb))  # small exact values: no rounding
    with pytest.raises(ValueError, match="blocked along"):
        Device("atlas-350").matmul_mx(qb, qa)


def test_two_dimensional_tiles_share_a_scale() -> None:
    """aclnnDynamicBlockMxQuant's 32 x 32 blocks: one scale per tile, repeated for its rows, from the
    tile's amax; each element is still x / X cast."""
    x = np.random.default_rng(6).standard_normal((64, 96)).astype(np.float32)
    x[40, 70] = 300.0
    q = mx.quantize(x, "float8_e4m3fn", tile=32)
    assert q.scales.shape == (64, 3)
    assert np.all(q.scales[32:, 2] == q.scales[40, 2]) and q.scales[40, 2] > q.scales[0, 2]
    rows = mx.quantize(x, "float8_e4m3fn")  # 1 x 32: only row 40's block has the large scale
    assert rows.scales[40, 2] == q.scales[40, 2] and np.any(rows.scales[32:, 2] != q.scales[40, 2])
    scale = np.repeat(q.scales.view(ml_dtypes.float8_e8m0fnu).astype(np.float64), 32, axis=1)
    assert np.array_equal(mx.dequantize(q), np.clip(x / scale, -448, 448).astype(E4M3).astype(np.float64) * scale)
    with pytest.raises(ValueError, match="tile must be 1 .* or 32 .*, got 32 for a 1-D array"):
        mx.quantize(x[0], tile=32)


def test_block_quantisation_on_the_device_reaches_the_register() -> None:
    """MX under the floor rule clamps 470 in a block of amax 470 (its scale is 2**0, and 470 is past
    464, half-way from 448 to the next step: the cast overflows) and nothing in the other block;
    block FP8 takes scale 1 for a block holding Inf and clamps the Inf;
    both count the blocks that clamped, and their casts' flags reach the register."""
    dev = Device("atlas-350")
    x = np.ones((1, 64), np.float32)
    x[0, 3] = 470.0
    q = dev.quantize_blocks("mx", x, "float8_e4m3fn", rule="floor")
    again = dev.quantize_mx(x, rule="floor")
    assert (q.saturated, q.saturated_blocks) == (1, 1) and np.array_equal(q.scales, again.scales)
    assert Flag(int(dev.status)) & Flag.OVERFLOW
    dev.clear_float_status()
    y = np.ones((2, 256), np.float32)
    y[1, 200] = np.inf
    b = dev.quantize_blocks("blockfp8", y)
    assert (b.saturated, b.saturated_blocks) == (1, 1) and b.scale_inv[1, 1] == 1
    assert Flag(int(dev.status)) & Flag.OVERFLOW
    with pytest.raises(ValueError, match="unknown block scheme 'hif4'; valid: mx, nvfp4, blockfp8"):
        dev.quantize_blocks("hif4", y)


def test_matmul_blocks_refuses_scales_that_do_not_fit() -> None:
    a8 = np.zeros((2, 40), ml_dtypes.float8_e4m3fn)
    b8 = np.zeros((40, 3), ml_dtypes.float8_e4m3fn)
    dev = Device("atlas-350")
    assert dev.matmul_blocks(a8, b8, np.ones((2, 2)), np.ones((2, 3)), 32).shape == (2, 3)
    with pytest.raises(ValueError, match=r"\(M, K/32\) and \(K/32, N\) scales"):
        dev.matmul_blocks(a8, b8, np.ones((2, 1)), np.ones((2, 3)), 32)


def _kernel(bits: np.ndarray, source, fmt: formats.Format, alg: int, add: int) -> tuple[np.ndarray, np.ndarray]:
    """CANN's aclnnDynamicMxQuant scales, as ``mx_quant_common.h`` (hicann/ops-nn ``quant/quant_common/
    op_kernel``) computes them on 16-bit registers, from the amax bits of a float16 or bfloat16
    block: the scale's E8M0 code, and the bfloat16 the elements are multiplied by.
    ComputeMxScaleOCP (scaleAlg 0), ComputeMxScaleCuBLAS (1), ComputeMxScaleDynamicDtypeRange (2)."""
    u16, f32 = np.uint16, np.float32
    dst = u16(fmt.emax << 7)  # FP8_E4M3_MAX_EXP 0x0400, E5M2 0x0780, E2M1 0x0100, E1M2 0
    if alg == 1:  # S = fl32(amax) * fl32(1 / MAX); its exponent field, up one where S is not a power of two
        s = (bits.view(source).astype(f32) * f32(1.0 / fmt.max)).view(np.uint32)
        e, m = (s >> 23) & 0xFF, s & 0x7FFFFF
        e = (e + (((e > 0) & (e < 254) & (m > 0)) | ((e == 0) & (m > 0x400000)))).astype(u16)
        exp = (e << 7).astype(u16)  # then as ComputeMxScaleCuBLAS's tail
        codes = e.astype(np.uint8)
        rev = np.where(exp != 0x7F80, u16(0x7F00) - exp, u16(0x7F81)).astype(u16)
        return codes, np.where(exp == 0x7F00, u16(0x0040), rev).astype(u16)
    if source is np.float16:  # Cast<bfloat16_t, half>: CAST_TRUNC for scaleAlg 0, CAST_RINT for 2
        wide = bits.view(np.float16).astype(f32)
        b = wide.view(np.uint32) >> 16 if alg == 0 else wide.astype(ml_dtypes.bfloat16).view(u16)
        bits = b.astype(u16)
    exp = bits & u16(0x7F80)
    finite = exp != 0x7F80
    if alg == 0:
        invalid = exp <= dst
        e = (exp - dst).astype(u16)
        codes = np.where(invalid, 0, np.where(finite, e >> 7, 0xFF)).astype(np.uint8)
        rev = np.where(invalid, u16(0), np.where(finite, u16(0x7F00) - e, u16(0x7F81))).astype(u16)
        return codes, np.where(e == 0x7F00, u16(0x0040), rev).astype(u16)
    invalid = exp < dst
    carried = np.where(invalid, dst, (bits + u16(add)) & u16(0x7F80)).astype(u16)
    shared = (carried - dst).astype(u16)
    codes = np.where(exp == 0, 0, np.where(finite, shared, u16(0x7F80)) >> 7).astype(np.uint8)
    rev = np.where(finite, u16(0x7F00) - shared, u16(0x7F81)).astype(u16)
    return codes, np.where(shared == 0x7F00, u16(0x0040), rev).astype(u16)


@pytest.mark.parametrize("rule", mx.CANN_RULES)
def test_cann_scale_algorithms_are_their_kernels(rule: str) -> None:
    """Every float16 and bfloat16 amax (zero, subnormal, normal, Inf, NaN), in blocks of two:
    the kernel's scale code, and its elements: x times the kernel's bfloat16 multiplier, cast
    saturating."""
    alg, add, served = mx.CANN_RULES[rule]
    for source in (np.float16, ml_dtypes.bfloat16):
        bits = np.arange(0, 0x7FFF if source is np.float16 else 0x7F81, dtype=np.uint16)
        x = np.stack([bits, (bits >> 1) | 0x8000], axis=1).view(source)  # amax, and -(a smaller one)
        for fmt in served:
            codes, rev = _kernel(bits, source, fmt, alg, add)
            q = mx.quantize(x, fmt, axis=1, block=2, rule=rule)
            assert np.array_equal(q.scales[:, 0], codes)
            with np.errstate(invalid="ignore"):
                scaled = x.astype(np.float64) * rev.view(ml_dtypes.bfloat16).astype(np.float64)[:, None]
            want = Fpu(OverflowMode.SATURATION).convert(scaled, fmt, overflow="satfinite")
            assert np.array_equal(q.elements.view(np.uint8), want.view(np.uint8)), (rule, source, fmt.name)
            if alg == 1:  # and it is the round-up rule
                assert np.array_equal(codes, mx.shared_exponents(x.astype(np.float64)[:, 0], fmt, "rceil"))


def test_cann_rules_hand_worked() -> None:
    e4m3, e2m1, e1m2 = formats.FLOAT8_E4M3FN, formats.FLOAT4_E2M1FN, formats.FLOAT4_E1M2FN
    bf16 = ml_dtypes.bfloat16
    # scaleAlg 0 zeroes a block whose amax's exponent field is at most emax (8): 2**-119 has field 8
    tiny = np.array([[2.0**-119, 2.0**-120], [2.0**-118, 2.0**-120]], bf16)
    q = mx.quantize(tiny, e4m3, axis=1, block=2, rule="cann0")
    assert q.scales.ravel().tolist() == [0, 1] and mx.dequantize(q).tolist() == [[0, 0], [2.0**-118, 2.0**-120]]
    floor = mx.quantize(tiny, e4m3, axis=1, block=2, rule="floor")  # OCP keeps the first block
    assert mx.dequantize(floor)[0].tolist() == [2.0**-119, 2.0**-120]
    # scaleAlg 2 rounds a float16 amax to bfloat16 first: 1.5 + 2**-8 (a tie) becomes 1.5, so the
    # scale stays 2**-2 and the element 6.015625 rounds to 6 (rceil takes 2**-1: the element 3)
    x = np.array([[1.5 + 2**-8, 0.0]], np.float16)
    q = mx.quantize(x, e2m1, axis=1, block=2, rule="cann2")
    assert q.scales.ravel().tolist() == [125] and mx.dequantize(q)[0, 0] == 1.5
    assert mx.quantize(x, e2m1, axis=1, block=2, rule="rceil").scales.ravel().tolist() == [126]
    # dstTypeMax 7: the scale rounds up from 1.7578125 (bfloat16 fraction 0x61), not from 1.5078125
    for amax, code in ((1.5078125, 125), (1.75, 125), (1.7578125, 126)):
        assert mx.quantize(np.array([[amax, 0]], bf16), e2m1, axis=1, block=2, rule="cann2-7").scales[0, 0] == code
    for amax, code in ((1.5078125, 126), (1.5, 125)):
        assert mx.quantize(np.array([[amax, 0]], bf16), e2m1, axis=1, block=2, rule="cann2").scales[0, 0] == code
    # E1M2 (dstTypeMax 1.875): a subnormal amax 0x71 * 2**-133 carries into exponent field 1, so
    # the elements are scaled by 2**126 while the scale code stays 0 (2**-127): 0.8828 rounds to 1,
    # which stands for 2**-127, half the input
    sub = np.array([[0x71 * 2.0**-133, 0]], bf16)
    q = mx.quantize(sub, e1m2, axis=1, block=2, rule="cann2-1.875")
    assert q.scales[0, 0] == 0 and mx.dequantize(q)[0, 0] == 2.0**-127
    with pytest.raises(ValueError, match="CANN's cann2 serves float4_e2m1fn, not float8_e4m3fn"):
        mx.quantize(sub, e4m3, rule="cann2")
    with pytest.raises(ValueError, match="CANN's cann1 takes float16 or bfloat16 inputs, not float32"):
        mx.quantize(np.ones((1, 32), np.float32), e4m3, rule="cann1")
