"""sim.binary32's reductions: the pairwise tree in IEEE binary32 additions, against the device's
own tree kernel (its generic rounding, in binary64 with a rounding routine) and hand-worked trees;
the mean's single division against MPFR."""

from __future__ import annotations

import gmpy2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sim import binary32
from sim import kernels as K
from sim.formats import BINARY32
from sim.rounding import config

F = np.float32
_CFG = config(BINARY32)


def _kernel(x: np.ndarray, axis, mean: bool) -> np.ndarray:
    """The device's tree_sum kernel in binary32 (every format's rounding routine)."""
    axes = tuple(range(x.ndim)) if axis is None else tuple(sorted(a % max(x.ndim, 1) for a in np.atleast_1d(axis)))
    rest = [d for d in range(x.ndim) if d not in axes]
    n = int(np.prod([x.shape[d] for d in axes], dtype=np.int64))
    cols = int(np.prod([x.shape[d] for d in rest], dtype=np.int64))
    v = np.ascontiguousarray(np.transpose(x, axes + tuple(rest)).reshape(n, cols)).view(np.uint32)
    out = np.empty(cols, np.uint32)
    K.tree_sum(v, out, _CFG, _CFG, _CFG, mean)
    return out.view(F).reshape([x.shape[d] for d in rest])


# Values aimed at the hard places: cancellation, ties, overflow to Inf, subnormals, NaN and Inf.
_hard = st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0**-24, 1 + 2.0**-23, 3.4028235e38, -3.4028235e38, 2.0**127,
                         1e-45, -1e-45, 1.1754942e-38, np.inf, -np.inf, np.nan, 16777216.0, 1e8, -1e8])
_elements = st.one_of(_hard, st.floats(width=32, allow_nan=True, allow_infinity=True))


@st.composite
def _arrays_and_axes(draw):
    x = draw(hnp.arrays(F, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=7), elements=_elements))
    if x.ndim == 0 or draw(st.booleans()):
        return x, None
    return x, tuple(draw(st.lists(st.integers(0, x.ndim - 1), min_size=1, max_size=x.ndim, unique=True)))


@settings(max_examples=400, deadline=None)
@given(_arrays_and_axes(), st.booleans())
def test_tree_is_the_device_kernels_tree(case, mean) -> None:
    x, axis = case
    with np.errstate(all="ignore"):
        want = _kernel(x, axis, mean)
    got = (binary32.mean if mean else binary32.sum)(x, axis)
    assert got.dtype == F and got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # NaN: the one canonical quiet NaN too
    # The axes are a set (taken in dimension order), and the layout in memory changes nothing.
    fortran = (binary32.mean if mean else binary32.sum)(np.asfortranarray(x), axis[::-1] if axis else axis)
    assert np.array_equal(fortran.view(np.uint32), want.view(np.uint32))


def test_tree_by_hand() -> None:
    x = np.array([1e8, 1, -1e8, 1, 3], F)  # ((1e8 + 1) + (-1e8 + 1)) + 3: the pairs round to +-1e8
    assert float(binary32.sum(x)) == 3.0
    assert float(binary32.sum(x[:4])) == 0.0
    assert float(binary32.sum(np.array([3.4028235e38, 3.4028235e38, -3.4028235e38], F))) == np.inf
    assert float(binary32.sum(np.zeros(0, F))) == 0.0 and np.isnan(binary32.mean(np.zeros(0, F)))
    assert binary32.sum(np.array([-0.0, -0.0], F)).view(np.uint32) == 0x80000000  # -0 + -0 = -0
    nan = np.array([1, 0], F)
    nan.view(np.uint32)[1] = 0xFFC01234  # a negative NaN with a payload
    assert binary32.sum(nan).view(np.uint32) == 0x7FC00000
    assert binary32.sum(np.arange(6, dtype=F).reshape(2, 3), 0).tolist() == [3, 5, 7]
    assert binary32.mean(np.array([1, 2], F)).tolist() == 1.5


@pytest.mark.parametrize("seed", range(4))
def test_mean_of_counts_binary32_does_not_hold_is_one_rounding(seed) -> None:
    """Above 2**24 elements the count is not a binary32: the division is the exact quotient
    rounded once (against MPFR's binary32 division of the exact total by the exact count)."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        totals = (rng.standard_normal(2000) * 2.0 ** rng.integers(-149, 128, 2000)).astype(F)
    counts = rng.integers(2**24 + 1, 2**45, 2000)
    counts[:8] = [2**24 + 1, 2**24 + 3, 3 * 2**30, 2**44 + 1, 10**13, 2**25 + 1, 5**17, 7**15]
    ctx = gmpy2.ieee(32)
    for t, n in zip(totals.tolist(), counts.tolist(), strict=True):
        with gmpy2.context(ctx):
            want = F(float(gmpy2.div(gmpy2.mpfr(t), gmpy2.mpz(n))))
        got = binary32._divide(np.array([t], F), n)[0]
        assert got.view(np.uint32) == want.view(np.uint32), (t, n)
    assert binary32._divide(np.array([np.inf, np.nan], F), 2**30).tolist()[0] == np.inf


# -- pooling: the vectorised windows against one window at a time -------------------------------------
def _loop_apply(a: np.ndarray, d: int, outs, starts, ends, divisors, override) -> np.ndarray:
    """Reference: each window by itself, its elements added in row-major order from +0."""
    lead = a.shape[:-d]
    planes = a.reshape(-1, *a.shape[-d:])
    grid = np.stack(np.meshgrid(*[np.arange(o) for o in outs], indexing="ij"), -1).reshape(-1, d)
    out = np.empty((planes.shape[0], len(grid)), np.float32)
    for j, pos in enumerate(grid):
        window = planes[(slice(None), *[slice(starts[i][pos[i]], ends[i][pos[i]]) for i in range(d)])]
        w = window.reshape(planes.shape[0], -1)
        acc = np.zeros(planes.shape[0], np.float32)
        for c in range(w.shape[1]):
            acc = (acc + w[:, c]).astype(np.float32)
        if override:
            div = np.float32(override)
        else:
            div = np.float32(np.prod([divisors[i][pos[i]] for i in range(d)]))
        with np.errstate(all="ignore"):
            out[:, j] = acc / div
    return out.reshape(*lead, *outs)


def _loop_scatter(g: np.ndarray, shape, d, outs, starts, ends, divisors, override) -> np.ndarray:
    """Reference: output by output, its share added to each element of its window."""
    planes = g.reshape(-1, len(np.zeros(outs).reshape(-1)))
    out = np.zeros((planes.shape[0], *shape[-d:]), np.float32)
    grid = np.stack(np.meshgrid(*[np.arange(o) for o in outs], indexing="ij"), -1).reshape(-1, d)
    for j, pos in enumerate(grid):
        div = np.float32(override) if override else np.float32(np.prod([divisors[i][pos[i]] for i in range(d)]))
        with np.errstate(all="ignore"):
            share = (planes[:, j] / div).astype(np.float32)
        region = (slice(None), *[slice(starts[i][pos[i]], ends[i][pos[i]]) for i in range(d)])
        window = out[region]
        window += share.reshape(-1, *[1] * d)  # elementwise: one rounding each
        out[region] = window
    return out.reshape(shape)


@pytest.mark.parametrize("seed", range(3))
def test_pooling_windows_are_summed_in_order(seed) -> None:
    """Average pooling (plain, padded, ceil mode, divisor override, adaptive) and its gradient, 1-3
    spatial dimensions, with NaN, Inf and -0 among the values: the vectorised windows of
    sim.torch_binary32 give the bits of the window-by-window loop."""
    torch = pytest.importorskip("torch")
    from sim.torch_binary32 import pooling as tb

    rng = np.random.default_rng(seed)
    cases = 0
    while cases < 150:
        d = int(rng.integers(1, 4))
        spatial = [int(rng.integers(1, 8)) for _ in range(d)]
        a = (rng.standard_normal((2, 3, *spatial)) * 10.0 ** rng.integers(-3, 30)).astype(F)
        if rng.random() < 0.3:
            a.reshape(-1)[int(rng.integers(a.size))] = rng.choice([np.nan, np.inf, -np.inf, -0.0, 3e38])
        x = torch.from_numpy(a)
        if rng.random() < 0.5:
            k = [int(rng.integers(1, s + 1)) for s in spatial]
            stride = [int(rng.integers(1, 4)) for _ in spatial]
            pad = [int(rng.integers(0, kk // 2 + 1)) for kk in k]
            override = int(rng.integers(1, 5)) if rng.random() < 0.2 else None
            outs, starts, ends, divisors, override = tb._pool_geometry(
                x, k, stride, pad, bool(rng.random() < 0.5), bool(rng.random() < 0.5), override, d)
        else:
            outs, override = [int(rng.integers(1, 9)) for _ in spatial], None
            starts, ends, divisors = tb._adaptive_geometry(x.shape[-d:], outs)
        if min(outs) <= 0 or any((e - s).min() <= 0 for s, e in zip(starts, ends, strict=True)):
            continue
        cases += 1
        with np.errstate(all="ignore"):
            want = _loop_apply(a, d, outs, starts, ends, divisors, override)
        got = tb._pool_apply(a, d, outs, starts, ends, divisors, override)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (spatial, outs)
        g = (rng.standard_normal(want.shape) * 10.0 ** rng.integers(-3, 30)).astype(F)
        with np.errstate(all="ignore"):
            want = _loop_scatter(g, a.shape, d, outs, starts, ends, divisors, override)
        got = tb._pool_scatter(g, a.shape, d, outs, starts, ends, divisors, override)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (spatial, outs)


# -- IEEE operations that torch's kernels do not give the same on every host ----------------------------
def _random32(rng, n: int) -> np.ndarray:
    """Binary32 bit patterns drawn uniformly (every binade, subnormals, both signs), NaN replaced."""
    x = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(F).copy()
    x[np.isnan(x)] = 1.5
    return x


def _round32(v) -> float:
    """An exact number (gmpy2 mpfr or mpq) rounded once to binary32, to nearest even."""
    with gmpy2.context(gmpy2.ieee(32)):
        return float(gmpy2.mpfr(v))


def test_sqrt_fmod_and_remainder_are_ieee_in_binary32_mode() -> None:
    """Binary32Mode's sqrt is correctly rounded (torch's own is not, here) and fmod and remainder are
    exact and Python's modulus (torch's vectorised ones differ from its scalar ones): each
    against MPFR and exact rationals, on random bit patterns and on operands far apart."""
    torch = pytest.importorskip("torch")
    from fractions import Fraction

    from sim.torch_binary32 import Binary32Mode

    rng = np.random.default_rng(7)
    a, b = _random32(rng, 3000), _random32(rng, 3000)
    b[:5] = [0.0, -0.0, np.inf, -np.inf, 1e-45]
    a[5:10] = [np.inf, -np.inf, 0.0, -0.0, 3.4028235e38]
    with Binary32Mode() as mode:
        root = torch.sqrt(torch.from_numpy(np.abs(a))).numpy()
        fmod = torch.fmod(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        rem = torch.remainder(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        inplace = torch.from_numpy(np.abs(a)).sqrt_().numpy()
        scalar = torch.fmod(torch.from_numpy(a), 0.3).numpy()
    assert not mode.host
    with gmpy2.context(gmpy2.ieee(32)):
        want = np.array([float(gmpy2.sqrt(gmpy2.mpfr(float(v)))) for v in np.abs(a)], F)
    assert np.array_equal(root.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(inplace.view(np.uint32), want.view(np.uint32))
    for x, y, f, r in zip(a.tolist(), b.tolist(), fmod.tolist(), rem.tolist(), strict=True):
        if not (np.isfinite(x) and np.isfinite(y)) or y == 0:
            assert np.isnan(f) == (not np.isfinite(x) or y == 0 or np.isnan(y))
            continue
        exact = Fraction(x) - Fraction(y) * int(Fraction(x) / Fraction(y))  # truncated quotient: exact
        assert f == float(exact) and (f != 0 or np.signbit(f) == np.signbit(x)), (x, y, f)
        if exact != 0 and (exact < 0) != (y < 0):
            assert r == _round32(gmpy2.mpq(exact + Fraction(y))), (x, y, r)
        else:
            assert r == float(exact) and (r != 0 or np.signbit(r) == np.signbit(y)), (x, y, r)
    assert np.array_equal(scalar, np.fmod(a, F(0.3)), equal_nan=True)  # the scalar rounded to binary32 first


@settings(max_examples=300, deadline=None)
@given(_arrays_and_axes(), st.sampled_from([0.0, 1.0, 0.5, 3.0]), st.booleans())
def test_moments_are_the_two_passes(case, correction, keepdims) -> None:
    """binary32.moments (one compiled loop) against its definition in the module's own steps: the
    tree mean, d = x - mean, the tree sum of d * d, one division by max(n - correction, 0)."""
    x, axis = case
    var, mean = binary32.moments(x, axis, keepdims, correction)
    m = binary32.mean(x, axis, keepdims=True)
    axes = range(x.ndim) if axis is None else axis
    n = int(np.prod([x.shape[a] for a in axes]))
    with np.errstate(all="ignore"):
        d = x - m
        want = binary32.sum(d * d, axis, keepdims) / F(max(n - correction, 0))
    want_mean = m if keepdims else m.reshape(want.shape)
    for got, ref in ((var, want), (mean, want_mean)):
        assert got.shape == ref.shape and got.dtype == F
        assert np.array_equal(np.isnan(got), np.isnan(ref))
        finite_bits = [np.where(np.isnan(a), 0, a).astype(F).view(np.uint32) for a in (got, ref)]
        assert np.array_equal(*finite_bits)
        assert np.all(got.view(np.uint32)[np.isnan(got)] == 0x7FC00000)  # NaN: the canonical quiet NaN
