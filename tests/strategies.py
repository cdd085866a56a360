"""Hypothesis strategies for format bit patterns, weighted towards the hard places."""

from __future__ import annotations

from hypothesis import strategies as st

from sim import BINARY16, Format


def values(fmt: Format = BINARY16) -> st.SearchStrategy[int]:
    """Bit patterns: uniform, special, near MAX, near the subnormal boundary,
    tiny subnormals, and significands with few bits or all ones."""
    man_mask = (1 << fmt.man_bits) - 1
    one = fmt.bias << fmt.man_bits
    specials = [0, 1, man_mask, 1 << fmt.man_bits, fmt.max_bits, fmt.max_bits - 1, fmt.inf_bits,
                fmt.default_nan, fmt.inf_bits | 1, one, one - 1, one + 1]
    significand = st.one_of(
        st.integers(0, man_mask),
        st.sampled_from([0, 1, man_mask, man_mask - 1, 1 << (fmt.man_bits - 1)]),
        st.integers(0, 7).map(lambda k: (k << (fmt.man_bits - 3)) & man_mask),  # few significant bits
    )
    structured = st.builds(lambda e, m: e << fmt.man_bits | m, st.integers(0, (1 << fmt.exp_bits) - 2), significand)
    magnitude = st.one_of(
        st.integers(0, fmt.sign_bit - 1),
        st.sampled_from(specials),
        st.integers(fmt.max_bits - 32, fmt.max_bits),
        st.integers((1 << fmt.man_bits) - 32, (1 << fmt.man_bits) + 32),
        st.integers(0, 64),
        structured,
    )
    return st.builds(lambda s, m: s | m, st.sampled_from([0, fmt.sign_bit]), magnitude)


def finite(fmt: Format = BINARY16) -> st.SearchStrategy[int]:
    return values(fmt).filter(lambda b: b & (fmt.sign_bit - 1) < fmt.inf_bits)


def near_pair(fmt: Format = BINARY16) -> st.SearchStrategy[tuple[int, int]]:
    """(a, b) with b's exponent a little below a's: ties, carries and cancellation in a sum."""
    def build(a: int, k: int, m: int, s: int) -> tuple[int, int]:
        e = max((a >> fmt.man_bits & ((1 << fmt.exp_bits) - 1)) - k, 0)
        return a, s | e << fmt.man_bits | m
    return st.builds(build, finite(fmt), st.integers(0, fmt.precision + 2),
                     st.integers(0, (1 << fmt.man_bits) - 1), st.sampled_from([0, fmt.sign_bit]))


def fma_triple(fmt: Format = BINARY16) -> st.SearchStrategy[tuple[int, int, int]]:
    """(a, b, c) with |c| near, far below or far above |a*b|."""
    def build(a: int, b: int, shift: int, m: int, s: int) -> tuple[int, int, int]:
        ea = a >> fmt.man_bits & ((1 << fmt.exp_bits) - 1)
        eb = b >> fmt.man_bits & ((1 << fmt.exp_bits) - 1)
        ec = min(max(ea + eb - fmt.bias + shift, 0), (1 << fmt.exp_bits) - 2)
        return a, b, s | ec << fmt.man_bits | m
    return st.builds(build, finite(fmt), finite(fmt), st.integers(-40, 40),
                     st.integers(0, (1 << fmt.man_bits) - 1), st.sampled_from([0, fmt.sign_bit]))
