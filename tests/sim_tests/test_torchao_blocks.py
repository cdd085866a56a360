"""sim.mx's four scale rules and its elements against torchao's MX emulation (``to_mx``, torchao
0.18 on the CPU), and the places where torchao's emulation departs from the exact rules, each
shown; sim.nvfp4 against torchao's NVFP4 quantiser bit for bit. Skipped without torchao (the
frameworks extra installs it)."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest

from sim import formats, mx, nvfp4

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    mx_tensor = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    from torchao.prototype.mx_formats import nvfp4_tensor
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2

#: The element formats torchao's MX emulation has (not Ascend's E1M2).
TORCH = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2, "float6_e2m3fn": DTYPE_FP6_E2M3,
         "float6_e3m2fn": DTYPE_FP6_E3M2, "float4_e2m1fn": torch.float4_e2m1fn_x2}


def torchao(x: np.ndarray, fmt, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """torchao's E8M0 scale codes and element codes (FP4 unpacked, low nibble first)."""
    scales, data = mx_tensor.to_mx(torch.from_numpy(x), TORCH[fmt.name], 32, ScaleCalculationMode(rule))
    codes = data.view(torch.uint8).numpy()
    if fmt is formats.FLOAT4_E2M1FN:
        codes = formats.unpack_nibbles(codes)
    return scales.view(torch.uint8).numpy(), codes


def blocks() -> np.ndarray:
    """Random blocks over 2**-40 .. 2**40, and blocks whose amax sits on the places the rules
    decide: powers of two, each format's MAX times a power of two, and the EVEN rule's threshold
    (2 - 2**-(m+1)) * 2**k for m = 1, 2, 3 fraction bits, with the float32 neighbours of each."""
    rng = np.random.default_rng(2026)
    rows = list(rng.standard_normal((300, 32)) * 2.0 ** rng.integers(-40, 40, (300, 1)))
    places = [2.0**k * c for k in range(-30, 31, 3) for c in (1, 1.5, 1.75, 1.875, 1.9375, 1.75 * 4, 6 / 4)]
    for p in places:
        for amax in (np.float32(p), np.nextafter(np.float32(p), np.float32(0)),
                     np.nextafter(np.float32(p), np.float32(np.inf))):
            r = rng.uniform(-1, 1, 32).astype(np.float32) * amax
            r[7] = amax
            rows.append(r)
    return np.array(rows, np.float32)


@pytest.mark.parametrize("rule", ("floor", "ceil", "even"))
@pytest.mark.parametrize("fmt", [f for f in mx.ELEMENTS if f.name in TORCH], ids=lambda f: f.name)
def test_scales_and_elements_are_torchaos(fmt, rule: str) -> None:
    x = blocks()
    want_scales, want = torchao(x, fmt, rule)
    q = mx.quantize(x, fmt, rule=rule)
    assert np.array_equal(q.scales, want_scales)
    normal = np.repeat(q.scales > 0, 32, axis=1)  # torchao divides a 2**-127 block by 2**-126
    assert np.array_equal(q.elements.view(np.uint8)[normal], want[normal])


@pytest.mark.parametrize("fmt", [f for f in mx.ELEMENTS if f.name in TORCH], ids=lambda f: f.name)
def test_rceil_is_exact_where_torchaos_binary32_log2_is_not(fmt) -> None:
    """RCEIL: ours is ceil(log2(amax / MAX)) exactly (what cvt.rp of the binary32 quotient gives:
    the quotient of a float32 amax just above MAX * 2**k still rounds above 2**k); torchao takes a
    binary32 log2 of it, which rounds k + tiny to k where |k| >= 2. Everywhere else they agree."""
    x = blocks()
    want_scales, want = torchao(x, fmt, "rceil")
    q = mx.quantize(x, fmt, rule="rceil")
    amax = np.abs(x.astype(np.float64)).max(axis=1)
    exact = []
    for a in amax:
        r = Fraction(float(a)) / Fraction(fmt.max)
        k = r.numerator.bit_length() - r.denominator.bit_length()  # 2**k near r, then the least 2**k >= r
        while r > 0 and Fraction(2) ** k < r:
            k += 1
        while r > 0 and Fraction(2) ** (k - 1) >= r:
            k -= 1
        exact.append(k + 127 if a > 0 else 0)
    assert q.scales[:, 0].tolist() == [min(max(e, 0), 254) for e in exact]
    differ = np.flatnonzero(q.scales[:, 0] != want_scales[:, 0])
    ratio = amax[differ] / fmt.max
    k = np.floor(np.log2(ratio))
    assert differ.size > 0 and np.all(ratio / 2.0**k - 1 < 2.0**-20) and np.all(np.abs(k) >= 2)
    assert np.all(q.scales[differ, 0].astype(int) == want_scales[differ, 0].astype(int) + 1)
    same = np.setdiff1d(np.arange(x.shape[0]), differ)
    normal = np.repeat(q.scales[same] > 0, 32, axis=1)
    assert np.array_equal(q.elements.view(np.uint8)[same][normal], want[same][normal])


def nvfp4_blocks() -> np.ndarray:
    """Rows of 64 over a wide range (block scales below E4M3's 2**-6 clamp and at its 448), rows
    whose block amax sits on E4M3 scale steps times 6 and their float32 neighbours, element ties,
    and a zero block."""
    rng = np.random.default_rng(7)
    rows = list(rng.standard_normal((120, 64)) * 2.0 ** rng.integers(-30, 12, (120, 1)))
    for scale in (0.015625, 0.5, 1.0, 1.125, 240.0, 448.0):
        for amax in (np.float32(6 * scale), np.nextafter(np.float32(6 * scale), np.float32(0)),
                     np.nextafter(np.float32(6 * scale), np.float32(np.inf))):
            r = rng.uniform(-1, 1, 64).astype(np.float32) * amax
            r[::16] = amax
            rows.append(r)
    ties = np.tile(np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], np.float32), 8)  # E2M1 ties at scale 1
    rows += [ties, -ties, np.zeros(64, np.float32)]
    return np.array(rows, np.float32)


@pytest.mark.parametrize("two_level", [True, False])
def test_nvfp4_is_torchaos_bit_for_bit(two_level: bool) -> None:
    x = nvfp4_blocks()
    tensor = nvfp4_tensor.per_tensor_amax_to_scale(torch.from_numpy(x).abs().max()) if two_level else None
    scales, packed = nvfp4_tensor.nvfp4_quantize(torch.from_numpy(x), 16, tensor)
    q = nvfp4.quantize(x, two_level=two_level)
    assert np.array_equal(q.scales, scales.view(torch.uint8).numpy())
    assert np.array_equal(q.elements, formats.unpack_nibbles(packed.numpy()))
    assert q.tensor_scale == (np.float32(tensor) if two_level else 1)
