"""The format catalogue: every limit derived from a format's fields agrees with ml_dtypes' finfo
where it has the format and with the published tables (OCP OFP8 v1.0, OCP MX v1.0, the
HiFloat8 paper, arXiv 2409.16626) typed in here; the description module imports no compiled
code; the FP6 formats are reachable by name and by dtype."""

from __future__ import annotations

import math
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from paths import ROOT  # tests/ is on the path (conftest.py)

from sim import FLOAT6_E2M3FN, FLOAT6_E3M2FN, Device, Fpu, formats

WITH_FINFO = [f for f in formats.FORMATS if f.dtype != np.uint8]  # the formats ml_dtypes has

# (max, smallest normal, smallest subnormal) as published.
PUBLISHED = {
    "float8_e4m3fn": (448, 2.0**-6, 2.0**-9),  # OCP OFP8 v1.0, table 1
    "float8_e5m2": (57344, 2.0**-14, 2.0**-16),  # OCP OFP8 v1.0, table 1
    "float4_e2m1fn": (6, 1, 0.5),  # OCP MX v1.0, section 5.3.3
    "float6_e3m2fn": (28, 2.0**-2, 2.0**-4),  # OCP MX v1.0, section 5.3.2
    "float6_e2m3fn": (7.5, 1, 0.125),  # OCP MX v1.0, section 5.3.2
    "float8_e8m0fnu": (2.0**127, 2.0**-127, 2.0**-127),  # OCP MX v1.0, section 5.4.1: no subnormals
    "hifloat8": (32768, 2.0**-15, 2.0**-22),  # arXiv 2409.16626, section 3
    "float4_e1m2fn": (1.75, 1, 0.25),  # CANN opbase include/nnopbase/opdev/float4_e1m2.h
    "hifloat4": (1.75, 1, 0.25),  # CANN opbase include/nnopbase/opdev/hifloat4.h
}


@pytest.mark.parametrize("fmt", WITH_FINFO, ids=lambda f: f.name)
def test_limits_agree_with_ml_dtypes_finfo(fmt) -> None:
    info = ml_dtypes.finfo(fmt.dtype)
    assert fmt.max == float(info.max)
    assert fmt.tiny == float(info.tiny)
    assert fmt.smallest_subnormal == float(info.smallest_subnormal)
    assert fmt.eps == float(info.eps)
    assert (fmt.emin, fmt.emax) == (info.minexp, info.maxexp - 1)
    assert fmt.man_bits == info.nmant
    assert fmt.has_inf == bool(np.isinf(np.array([np.inf]).astype(fmt.dtype).astype(np.float64))[0])


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_limits_agree_with_the_published_tables(name: str) -> None:
    fmt = formats.format_of(name)
    assert (fmt.max, fmt.tiny, fmt.smallest_subnormal) == PUBLISHED[name]
    finite = fmt.values[np.isfinite(fmt.values)]
    assert finite.max() == fmt.max and finite[finite > 0].min() == fmt.smallest_subnormal


def test_hifloat8_limits_from_its_table() -> None:
    fmt = formats.HIFLOAT8
    positive = fmt.values[np.isfinite(fmt.values) & (fmt.values > 0)]
    assert positive.size == 126 and np.unique(np.floor(np.log2(positive))).size == 38  # 126 values, 38 binades
    assert (fmt.emax, fmt.qmin, fmt.max) == (15, -22, 32768)
    assert not fmt.has_negative_zero and fmt.has_inf and fmt.has_nan


def test_fp6_descriptions() -> None:
    for fmt, values in ((FLOAT6_E3M2FN, [0.0625, 0.25, 1.75, 28.0]), (FLOAT6_E2M3FN, [0.125, 1.0, 1.875, 7.5])):
        assert fmt.bits == 6 and not fmt.has_inf and not fmt.has_nan and fmt.has_negative_zero
        decoded = formats.decode(np.arange(64, dtype=np.uint8), fmt)
        assert np.all(np.isfinite(decoded)) and np.unique(decoded).size == 63  # +0 and -0 compare equal
        assert set(values) <= set(decoded)


def test_fp6_by_name_and_by_dtype() -> None:
    x = np.array([0.3, -5.0, 100.0], np.float16)
    a = Fpu().convert(x, "float6_e3m2fn")
    assert a.dtype == ml_dtypes.float6_e3m2fn and a.astype(np.float64).tolist() == [0.3125, -5.0, 28.0]
    b = Device("atlas-350").cast(x, ml_dtypes.float6_e2m3fn)
    assert b.dtype == ml_dtypes.float6_e2m3fn and b.astype(np.float64).tolist() == [0.25, -5.0, 7.5]
    assert formats.format_of("e3m2") is FLOAT6_E3M2FN and formats.format_of(ml_dtypes.float6_e2m3fn) is FLOAT6_E2M3FN


def test_descriptions_import_no_compiled_code() -> None:
    """sim/formats.py loads on its own without numba (the kernels build their settings from it)."""
    path = ROOT / "sim" / "formats.py"
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('formats', {str(path)!r})\n"
            "m = sys.modules['formats'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "assert m.FLOAT6_E3M2FN.max == 28\n"
            "assert 'numba' not in sys.modules and 'llvmlite' not in sys.modules, 'compiled code imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bad_descriptions_are_named() -> None:
    with pytest.raises(ValueError, match="NaN encoding"):
        formats.Format("x", 3, 2, np.dtype(np.uint8), nans="some")
    assert math.isclose(formats.BINARY16.eps, 2.0**-10)


def test_every_list_of_formats_is_the_catalogue() -> None:
    """A format is one catalogue entry: sim's constant, its names and the narrow list follow."""
    import sim
    from sim import profiles

    for f in formats.FORMATS:
        assert getattr(sim, f.name.upper()) is f and f.name.upper() in sim.__all__
        assert all(formats.format_of(name) is f for name in (f.name, *f.aliases))
    assert formats.EIGHT_BIT == tuple(f for f in formats.FORMATS if f.dtype.itemsize == 1)
    assert [f.name for f in formats.EIGHT_BIT] == ["float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float6_e3m2fn",
                                                   "float6_e2m3fn", "float4_e2m1fn", "float4_e1m2fn", "hifloat4",
                                                   "hifloat8"]
    aliases = [a for f in formats.FORMATS for a in (f.name, *f.aliases)]
    assert len(aliases) == len(set(aliases)), "a name of two formats"
    for p in profiles.PROFILES.values():  # a product's formats are catalogue names
        assert all(formats.format_of(name).name == name for name in p.eight_bit), p.name


@pytest.mark.parametrize("fmt", [f for f in formats.EIGHT_BIT if f.dtype != np.uint8 and not f.tapered],
                         ids=lambda f: f.name)
def test_values_from_the_fields_are_ml_dtypes_values(fmt) -> None:
    """The decoding the formats ml_dtypes lacks use (E1M2, HiFloat4), checked on those it has."""
    codes = np.arange(1 << fmt.bits, dtype=np.uint8)
    want = codes.view(fmt.dtype).astype(np.float64)
    got = fmt.from_fields(codes)
    assert np.array_equal(got, want, equal_nan=True) and np.array_equal(np.signbit(got), np.signbit(want))


def test_four_bit_e1m2_and_hifloat4_elements() -> None:
    """Every code of E1M2 and of HiFloat4's element, as CANN's headers list them: bit 3 the sign, bit 2
    the exponent (bias 1), bits 1-0 the fraction; 0x7 is 1.75, 0x4 is 1.0, 0x1 is 0.25; no Inf, no NaN."""
    positive = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
    for fmt in (formats.format_of("e1m2"), formats.format_of("hif4")):
        assert fmt.bits == 4 and not fmt.has_inf and not fmt.has_nan and fmt.has_negative_zero
        decoded = formats.decode(np.arange(16, dtype=np.uint8), fmt)
        assert decoded.tolist() == positive + [-v for v in positive] and np.signbit(decoded[8])
    with pytest.raises(ValueError, match="unknown floating-point format"):
        formats.format_of(np.uint8)  # uint8 codes name their format


def test_nibbles_pack_low_first() -> None:
    codes = np.array([[0x1, 0x7, 0xF], [0x8, 0x0, 0x4]], np.uint8)
    packed = formats.pack_nibbles(codes)
    assert packed.tolist() == [[0x71, 0x0F], [0x08, 0x04]]
    assert np.array_equal(formats.unpack_nibbles(packed, 3), codes)
    assert formats.unpack_nibbles(np.array([0xA5], np.uint8)).tolist() == [0x5, 0xA]
    with pytest.raises(ValueError, match="4-bit codes as uint8 values 0..15, got uint8 up to 16"):
        formats.pack_nibbles(np.array([16], np.uint8))
    with pytest.raises(ValueError, match="count must be from 0 to 2"):
        formats.unpack_nibbles(np.array([0xA5], np.uint8), 3)
