"""Berkeley TestFloat conformance: every vector, value and flags, both overflow modes.

The vectors live in ``tests/data/testfloat.npz`` (see ``make_testfloat.py``
there for provenance); the whole level-1 set of f16_mulAdd, of which that file
holds every 61st case, is ``tests/data/f16_mulAdd_level1.npz.xz`` (marker
``exhaustive``). Saturation-mode expectations are derived from the IEEE
ones as the TestFloat README beside the originals says: +-Inf -> +-MAX, NaN -> 0.
"""

from __future__ import annotations

import io
import lzma

import ml_dtypes
import numpy as np
import pytest
from paths import DATA  # tests/ is on the path (conftest.py)

from sim import Fpu, OverflowMode, Rounding, format_of

VECTORS = np.load(DATA / "testfloat.npz")
STEMS = sorted({k.rsplit("/", 1)[0] for k in VECTORS.files if k.endswith("/out")})
DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64}
COMPARE = {"eq": ("eq", False), "eq_signaling": ("eq", True), "le": ("le", True),
           "le_quiet": ("le", False), "lt": ("lt", True), "lt_quiet": ("lt", False)}
BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "mulAdd": "fma",
          "sqrt": "sqrt", "roundToInt": "rint"}


def parse(stem: str):
    """(operation key, call(fpu, operands) -> (value, flags), result dtype, rounding, tininess)."""
    tininess = "before" if stem.endswith("_tininessbefore") else "after"
    base = stem.removesuffix("_tininessbefore")
    for mode in ("near_maxMag", "near_even", "minMag", "min", "max", "odd"):
        if base.endswith("_" + mode):
            op, rounding = base[: -len(mode) - 1], Rounding.parse(mode)
            break
    else:
        op, rounding = base, Rounding.NEAREST_EVEN
    src, _, rest = op.partition("_")
    if rest.startswith("to_"):
        dst = DTYPES[rest[3:]]
        return op, (lambda fpu, x: fpu.convert(x, dst, return_flags=True)), DTYPES[src], dst, rounding, tininess
    if rest in COMPARE:
        name, signaling = COMPARE[rest]
        return (op, (lambda fpu, a, b: getattr(fpu, name)(a, b, signaling=signaling, return_flags=True)),
                np.float16, bool, rounding, tininess)
    name = BINARY[rest]
    return op, (lambda fpu, *xs: getattr(fpu, name)(*xs, return_flags=True)), np.float16, np.float16, rounding, tininess


def case(operands: list[np.ndarray], i: int) -> str:
    hexes = " ".join(f"{int(o.view(f'u{o.dtype.itemsize}')[i]):x}" for o in operands)
    return f"case {i}, operands {hexes}"


def expected_saturated(bits: np.ndarray, dst) -> np.ndarray:
    fmt = format_of(dst)
    bits = bits.astype(np.uint64)
    mag = bits & np.uint64(fmt.sign_bit - 1)
    out = np.where(mag == fmt.inf_bits, bits - np.uint64(1), bits)
    return np.where(mag > fmt.inf_bits, np.uint64(0), out)


@pytest.mark.parametrize("overflow", [OverflowMode.INF_NAN, OverflowMode.SATURATION], ids=["inf_nan", "saturation"])
@pytest.mark.parametrize("stem", STEMS)
def test_vectors(stem: str, overflow: OverflowMode) -> None:
    op, call, src, dst, rounding, tininess = parse(stem)
    operands = []
    k = 0
    while f"{op}/in{k}" in VECTORS.files:
        operands.append(VECTORS[f"{op}/in{k}"].view(src))
        k += 1
    want, want_flags = VECTORS[f"{stem}/out"], VECTORS[f"{stem}/flags"]
    fpu = Fpu(overflow=overflow, rounding=rounding, tininess=tininess)
    got, flags = call(fpu, *operands)
    bad = np.flatnonzero(flags != want_flags)
    assert bad.size == 0, (f"{bad.size} flag mismatches; {case(operands, bad[0])}: "
                           f"got {flags[bad[0]]:#x} want {want_flags[bad[0]]:#x}")
    if dst is bool:
        np.testing.assert_array_equal(got, want.astype(bool))
        return
    fmt = format_of(dst)
    got_bits = got.view(fmt.uint).astype(np.uint64)
    want_bits = want.astype(np.uint64)
    if overflow is OverflowMode.SATURATION:
        want_bits = expected_saturated(want_bits, dst)
    nan = lambda b: (b & np.uint64(fmt.sign_bit - 1)) > fmt.inf_bits  # noqa: E731
    same = (got_bits == want_bits) | (nan(got_bits) & nan(want_bits))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, (f"{bad.size} value mismatches; {case(operands, bad[0])}: "
                           f"got {int(got_bits[bad[0]]):#x} want {int(want_bits[bad[0]]):#x}")


@pytest.mark.parametrize("default", [None, 0x7FFF], ids=["canonical", "custom"])
@pytest.mark.parametrize("stem", [s for s in STEMS if s.split("_", 1)[1] not in COMPARE])
def test_nan_results_are_the_default_nan_bits(stem: str, default: int | None) -> None:
    """Where TestFloat expects a NaN, the result is exactly the unit's default NaN (for
    binary16 results, the one the unit was given), not just some NaN."""
    op, call, src, dst, rounding, tininess = parse(stem)
    operands = [VECTORS[f"{op}/in{k}"].view(src) for k in range(3) if f"{op}/in{k}" in VECTORS.files]
    fmt = format_of(dst)
    want = VECTORS[f"{stem}/out"].astype(np.uint64)
    got, _ = call(Fpu(rounding=rounding, tininess=tininess, default_nan=default), *operands)
    bits = got.view(fmt.uint)[(want & np.uint64(fmt.sign_bit - 1)) > fmt.inf_bits]
    expect = default if default is not None and fmt.width == 16 and fmt.man_bits == 10 else fmt.default_nan
    assert (bits == expect).all(), f"{stem}: NaN bits {[hex(b) for b in np.unique(bits)]}, want {expect:#x}"


@pytest.mark.exhaustive
def test_every_mul_add_vector_of_the_level_1_set() -> None:
    """All 6,133,248 f16_mulAdd cases of TestFloat's level 1, six modes, both overflow modes
    (tests/data/README.md); the archive's every 61st case is the one above."""
    with lzma.open(DATA / "f16_mulAdd_level1.npz.xz") as f:
        full = np.load(io.BytesIO(f.read()))
    operands = [full[f"in{k}"] for k in range(3)]
    for k in range(3):
        assert np.array_equal(operands[k][::61], VECTORS[f"f16_mulAdd/in{k}"]), "not the set the sample came from"
    for mode in ("near_even", "minMag", "min", "max", "near_maxMag", "odd"):
        want, want_flags = full[f"{mode}/out"].astype(np.uint64), full[f"{mode}/flags"]
        for overflow in (OverflowMode.INF_NAN, OverflowMode.SATURATION):
            got, flags = Fpu(overflow, mode).fma(*(o.view(np.float16) for o in operands), return_flags=True)
            expect = want if overflow is OverflowMode.INF_NAN else expected_saturated(want, np.float16)
            bits = got.view(np.uint16).astype(np.uint64)
            nan = lambda b: (b & np.uint64(0x7FFF)) > 0x7C00  # noqa: E731
            bad = np.flatnonzero(~((bits == expect) | (nan(bits) & nan(expect))) | (flags != want_flags))
            assert bad.size == 0, (f"{mode} {overflow.name}: {bad.size} mismatches; {case(operands, bad[0])}: "
                                   f"got {int(bits[bad[0]]):#x}/{flags[bad[0]]:#x} "
                                   f"want {int(expect[bad[0]]):#x}/{want_flags[bad[0]]:#x}")
