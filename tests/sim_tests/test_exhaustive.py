"""Exhaustive checks over binary16.

Every one of the 65,536 inputs of the unary operations against MPFR (default
run); every pair of inputs (2**32) of add and mul under NEAREST_EVEN in both
overflow modes against numpy's float16 (exact for + and * in round-to-nearest,
since it computes in binary32) with flags derived from their IEEE definitions
(marker ``exhaustive``, run by ``.ci/run``).
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import ml_dtypes
import numpy as np
import pytest

from sim import BFLOAT16, BINARY16, BINARY32, BINARY64, SIX_MODES, Flag, Format, Fpu, OverflowMode, Rounding

from groups import representatives
from oracle import reference, saturated

ALL = np.arange(1 << 16, dtype=np.uint16)
#: The mode of the default run (the other five: -m slow; test_oracle samples toward zero in the default run).
DEFAULT_MODES = (Rounding.NEAREST_EVEN,)
NAN16 = lambda b: (b & 0x7FFF) > 0x7C00  # noqa: E731


def compare_all(op: str, mode: Rounding, dst: Format, call, src: Format = BINARY16) -> None:
    """Run ``call(fpu, x)`` on all 65,536 binary16 inputs in both overflow modes against MPFR."""
    expected = [reference(op, [int(b)], dst, mode, src=src) for b in ALL]
    want = np.array([w for w, _ in expected], np.uint64)
    want_flags = np.array([f for _, f in expected], np.uint8)
    nan = lambda b: (b & np.uint64(dst.sign_bit - 1)) > dst.inf_bits  # noqa: E731
    for overflow in (OverflowMode.INF_NAN, OverflowMode.SATURATION):
        got, flags = call(Fpu(overflow, mode), ALL.view(np.float16))
        bits = got.view(dst.uint).astype(np.uint64)
        w = want if overflow is OverflowMode.INF_NAN else np.array([saturated(int(b), dst) for b in want], np.uint64)
        bad = np.flatnonzero(~((bits == w) | (nan(bits) & nan(w))) | (flags != want_flags))
        assert bad.size == 0, (f"{op} {mode.name} {overflow.name}: {bad.size} mismatches, first input "
                               f"{int(ALL[bad[0]]):#06x}: got {int(bits[bad[0]]):#x}/{flags[bad[0]]:#x} "
                               f"want {int(w[bad[0]]):#x}/{want_flags[bad[0]]:#x}")


@pytest.mark.parametrize("mode", representatives(SIX_MODES, DEFAULT_MODES.__contains__, lambda m: m.name))
def test_sqrt_all_inputs(mode: Rounding) -> None:
    compare_all("sqrt", mode, BINARY16, lambda fpu, x: fpu.sqrt(x, return_flags=True))


@pytest.mark.parametrize("mode", representatives(SIX_MODES, DEFAULT_MODES.__contains__, lambda m: m.name))
def test_rint_all_inputs(mode: Rounding) -> None:
    compare_all("rint", mode, BINARY16, lambda fpu, x: fpu.rint(x, return_flags=True))


@pytest.mark.parametrize("mode", representatives(SIX_MODES, DEFAULT_MODES.__contains__, lambda m: m.name))
def test_to_bfloat16_all_inputs(mode: Rounding) -> None:
    compare_all("convert", mode, BFLOAT16, lambda fpu, x: fpu.convert(x, ml_dtypes.bfloat16, return_flags=True))


@pytest.mark.parametrize("dst", [BINARY32, BINARY64], ids=lambda f: f.name)
def test_widening_all_inputs(dst: Format) -> None:
    compare_all("convert", Rounding.NEAREST_EVEN, dst, lambda fpu, x: fpu.convert(x, dst.dtype, return_flags=True))


# -- every pair ---------------------------------------------------------------------
ROWS = 16  # values of a per block: 16 * 65,536 pairs


def expected_pairs(op: str, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy float16 values and IEEE flags for NEAREST_EVEN, tininess after rounding."""
    with np.errstate(all="ignore"):
        value = a + b if op == "add" else a * b
        x, y = a.astype(np.float64), b.astype(np.float64)
        exact = x + y if op == "add" else x * y
    finite_in = np.isfinite(x) & np.isfinite(y)
    nan_in = np.isnan(x) | np.isnan(y)
    snan = lambda h: ((h.view(np.uint16) & 0x7FFF) > 0x7C00) & ((h.view(np.uint16) & 0x0200) == 0)  # noqa: E731
    inexact = finite_in & np.isfinite(exact) & (value.astype(np.float64) != exact)
    overflow = finite_in & (np.abs(exact) >= 65520.0)
    # Tiny after rounding (to nearest even, unbounded exponent): below 2**-14 - 2**-26.
    underflow = inexact & (np.abs(exact) < 2.0**-14 - 2.0**-26)
    invalid = (np.isnan(exact) & ~nan_in) | snan(a) | snan(b)
    flags = (inexact * Flag.INEXACT | underflow * Flag.UNDERFLOW | overflow * Flag.OVERFLOW
             | invalid * Flag.INVALID).astype(np.uint8)
    return value.view(np.uint16), flags


def check_block(op: str, start: int) -> tuple[int, str]:
    a = np.repeat(ALL[start:start + ROWS], 1 << 16).view(np.float16)
    b = np.tile(ALL, ROWS).view(np.float16)
    want, want_flags = expected_pairs(op, a, b)
    sat = np.where((want & 0x7FFF) == 0x7C00, want - 1, np.where(NAN16(want), 0, want)).astype(np.uint16)
    for overflow, w in ((OverflowMode.INF_NAN, want), (OverflowMode.SATURATION, sat)):
        got, flags = getattr(Fpu(overflow), op)(a, b, return_flags=True)
        g = got.view(np.uint16)
        bad = np.flatnonzero(~((g == w) | (NAN16(g) & NAN16(w))) | (flags != want_flags))
        if bad.size:
            i = bad[0]
            x, y = int(a.view(np.uint16)[i]), int(b.view(np.uint16)[i])
            return bad.size, (f"{op} {overflow.name} {x:#06x} {y:#06x}: "
                              f"got {int(g[i]):#x}/{flags[i]:#x} want {int(w[i]):#x}/{want_flags[i]:#x}")
    return 0, ""


@pytest.mark.exhaustive
@pytest.mark.parametrize("op", ["add", "mul"])
def test_every_pair(op: str) -> None:
    starts = range(0, 1 << 16, ROWS)
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for count, first in pool.map(check_block, [op] * len(starts), starts, chunksize=64):
            assert count == 0, f"{count} mismatches in a block, first: {first}"
