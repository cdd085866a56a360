"""A testing kit: hypothesis strategies aimed at the hard places of binary16 and
of loss scaling, and :func:`check_policy`, which property-tests any scale
policy that follows the protocol (``get_loss_scale()``,
``update_loss_scale(finite)``). Needs hypothesis (the ``test`` extra).

    from lossscale.testing import check_policy
    check_policy(lambda: MyScaler(init=2**16), floor=1.0)   # raises with a shrunk counterexample
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from hypothesis.extra import numpy as hnp

from sim import BINARY16, Format

from .policy import missing_scaler_methods
from .policy.core import check_period

__all__ = [
    "values", "finite", "near_pair", "fma_triple", "binary16", "binary16_arrays",
    "overflow_sequences", "gradient_arrays", "check_policy", "PolicyError", "check_recipe", "amax_sequences",
]


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
    """Bit patterns of finite values only."""
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


# -- numpy values -------------------------------------------------------------------
def binary16() -> st.SearchStrategy[np.float16]:
    """binary16 scalars with weight on ties, MAX, subnormals, -0 and NaN (quiet and signaling)."""
    return values(BINARY16).map(lambda b: np.array(b, np.uint16).view(np.float16)[()])


def binary16_arrays(shape: int | tuple[int, ...] | st.SearchStrategy | None = None):
    """Arrays of :func:`binary16` values (shape: any of up to 2 x 32 by default)."""
    shape = hnp.array_shapes(max_dims=2, max_side=32) if shape is None else shape
    bits = hnp.arrays(np.uint16, shape, elements=values(BINARY16))
    return bits.map(lambda a: a.view(np.float16))


def gradient_arrays(shape: int | tuple[int, ...] = 64, center: float = -8.0, spread: float = 6.0,
                    dtype=np.float32) -> st.SearchStrategy[np.ndarray]:
    """Gradient-like arrays: signed values whose log2 magnitude is spread
    around ``center`` by up to ``spread`` binades, with some exact zeros."""
    def build(exps, mants, signs, zeros):
        x = np.ldexp(mants, exps) * np.where(signs, -1, 1)
        return np.where(zeros, 0, x).astype(dtype)
    n = (shape,) if isinstance(shape, int) else shape
    lo, hi = math.floor(center - spread), math.ceil(center + spread)
    return st.builds(build, hnp.arrays(np.int64, n, elements=st.integers(lo, hi)),
                     hnp.arrays(np.float64, n, elements=st.floats(0.5, 1, exclude_max=True)),
                     hnp.arrays(bool, n), hnp.arrays(bool, n, elements=st.sampled_from([False] * 15 + [True])))


# -- overflow sequences -------------------------------------------------------------
def overflow_sequences(max_size: int = 400) -> st.SearchStrategy[list[bool]]:
    """finite (True) / overflow (False) sequences: random, bursts of overflows in
    quiet runs, long quiet runs, and alternation."""
    random = st.lists(st.booleans(), max_size=max_size)
    burst = st.tuples(st.integers(0, max_size // 2), st.integers(1, 20), st.integers(0, max_size // 2)).map(
        lambda t: [True] * t[0] + [False] * t[1] + [True] * t[2])
    bursts = st.lists(burst, min_size=1, max_size=4).map(lambda parts: sum(parts, [])[:max_size])
    quiet = st.integers(0, max_size).map(lambda n: [True] * n)
    alternate = st.tuples(st.integers(1, max_size // 2), st.integers(1, 3)).map(
        lambda t: ([True] * t[1] + [False]) * t[0])
    return st.one_of(random, bursts, quiet, alternate.map(lambda s: s[:max_size]))


# -- property-testing a policy ------------------------------------------------------
F32_MAX = float(np.finfo(np.float32).max)


class PolicyError(AssertionError):
    """A generic property of loss-scale policies failed."""


class _Raised(Exception):
    """The policy raised an exception not in ``raises`` at a step (turned into a PolicyError)."""

    def __init__(self, step: int, error: Exception) -> None:
        super().__init__(step, error)
        self.step, self.error = step, error
        self.fed: list[bool] = []


class _NotANumber(Exception):
    """``get_loss_scale()`` returned something that is not a number (turned into a PolicyError)."""

    def __init__(self, index: int, value: Any) -> None:
        super().__init__(index, value)
        self.index, self.value = index, value

    def sentence(self) -> str:
        after = f"after {self.index} update{'s' if self.index != 1 else ''}" if self.index else "before any update"
        return (f"get_loss_scale() returned {self.value!r} (a {type(self.value).__name__}) {after}: a scale is a "
                f"number (a float, an int or a numpy scalar), which check_policy does not coerce")


def _scale(m: Any, index: int) -> float:
    """``m.get_loss_scale()`` as a float: a real number (Python's or numpy's, or a 0-d array or
    tensor); a string, a bool or anything else is refused rather than coerced."""
    value = m.get_loss_scale()
    if isinstance(value, (str, bytes, bool, np.bool_)) or not (
            isinstance(value, numbers.Real) or (hasattr(type(value), "__float__") and getattr(value, "ndim", 1) == 0)):
        raise _NotANumber(index, value)
    return float(value)


def _global_generators() -> tuple[Any, Any]:
    """The states of Python's and numpy's global random generators, the ones a policy may draw from."""
    state = np.random.get_state()  # noqa: NPY002 - the legacy global generator is what is watched
    return random.getstate(), (state[0], state[1].tobytes(), *state[2:])


def _draws(fn: Callable[[], Any]) -> bool:
    """Whether ``fn()`` draws from Python's or numpy's global random generator."""
    before = _global_generators()
    fn()
    return _global_generators() != before


#: What instances disagreeing on the same steps means: drawing from the global generators
#: (seen directly, as their state moving), or state outside the instance.
_CHANCE = ("not deterministic: fed the same steps, instances disagree, and it draws from Python's or numpy's "
           "global random generator: give each instance its own seeded generator (random.Random(seed) in __init__)")
_OUTSIDE = ("two instances share state: fed the same steps, they disagree (hidden shared state, such as a class "
            "attribute or a global, a clock, or an unseeded generator)")


def _update(m: Any, finite: bool, step: int, raises: tuple[type[BaseException], ...]) -> bool:
    """``m.update_loss_scale(finite)``; False where it raised one of ``raises`` (the sequence ends)."""
    try:
        m.update_loss_scale(finite)
    except raises:
        return False
    except Exception as err:  # noqa: BLE001 - reported with the step and the way to allow it
        raise _Raised(step, err) from err
    return True


def _scales(make: Callable[[], Any], steps: Sequence[bool], raises: tuple[type[BaseException], ...],
            interleave: Callable[[], Any] | None = None) -> list[float]:
    m = make()
    other = interleave() if interleave else None
    out = [_scale(m, 0)]
    for i, finite in enumerate(steps):
        try:
            if not _update(m, bool(finite), i, raises):
                break
            if other is not None and not _update(other, i % 2 == 0, i, raises):
                other = None  # another instance's updates must not change this one's future
        except _Raised as raised:
            raised.fed = [bool(f) for f in steps[:i + 1]]
            raise
        out.append(_scale(m, i + 1))
    return out


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _agree(a: Sequence[float], b: Sequence[float]) -> bool:
    """Two trajectories are equal, NaN equal to NaN (the NaN itself is its own property)."""
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))


def _shares_state(make: Callable[[], Any], raises: tuple[type[BaseException], ...], steps: int) -> str | None:
    """Whether separate instances share state, seen directly: one instance is updated (overflows,
    then finite steps) while another is watched, and a third is made afterwards. The sentence
    saying what changed, or None."""
    watched = make()
    start = _scale(watched, 0)
    busy = make()
    for i, finite in enumerate([False] * 16 + [True] * steps):
        if not _update(busy, finite, i, raises):
            break
        now = _scale(watched, 0)
        if not _same(now, start):
            return (f"two instances share state: updating one instance changed another's scale from {start} to "
                    f"{now} (after {i + 1} update{'s' if i else ''})")
    fresh = _scale(make(), 0)
    if not _same(fresh, start):
        if _draws(lambda: _scale(make(), 0)):
            return f"{_CHANCE} (a new instance starts at {fresh}, another at {start})"
        return f"two instances share state: a new instance starts at {fresh} after another was updated, not at {start}"
    return None


def _checked_arguments(floor: Any, cap: Any, flags: dict[str, Any]) -> None:
    """check_policy's own arguments, each named with what is valid, before anything runs."""
    for name, value, low in (("floor", floor, "at least 0"), ("cap", cap, "above 0 (inf: none)")):
        if value is None:
            continue
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or value != value:
            raise ValueError(f"{name} must be None or a number {low}, got {value!r}")
        if (name == "floor" and not 0 <= value < math.inf) or (name == "cap" and not value > 0):
            raise ValueError(f"{name} must be None or a {'finite ' if name == 'floor' else ''}number {low}, "
                             f"got {value!r}")
    for name, value in flags.items():
        if value is not None and not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name} must be None (what the policy declares) or a bool, got {value!r}")


class _PolicyCheck:
    """check_policy's properties of one policy, each a check of one overflow sequence that raises
    PolicyError naming the property, the steps and the scales."""

    def __init__(self, make: Callable[[], Any], name: str, floor: float | None, cap: float | None, capped: bool,
                 raises: tuple[type[BaseException], ...], growth_within: int, backoff_within: int) -> None:
        self.make, self.name, self.floor, self.cap, self.capped = make, name, floor, cap, capped
        self.raises, self.growth_within, self.backoff_within = raises, growth_within, backoff_within

    def scales(self, steps: list[bool], interleave: Callable[[], Any] | None = None) -> list[float]:
        return _scales(self.make, steps, self.raises, interleave=interleave)

    def fail(self, what: str, steps: Sequence[bool], scales: list[float]) -> None:
        text = "".join("." if s else "X" for s in steps)
        raise PolicyError(f"{self.name}: {what}\n  steps (. finite, X overflow): {text or '(none)'}\n"
                          f"  scales: {scales[:12]}{' ...' if len(scales) > 12 else ''}")

    def reporting(self, check: Callable[[list[bool]], None]) -> Callable[[list[bool]], None]:
        """``check``, with an exception the policy raised turned into a PolicyError that says how to allow it."""
        def checked(steps: list[bool]) -> None:
            try:
                check(steps)
            except _Raised as raised:
                err = raised.error
                self.fail(f"update_loss_scale raised {type(err).__name__} at step {raised.step}: {err}; if the "
                          f"policy raises it by design, pass raises=({type(err).__name__},)", raised.fed, [])
            except _NotANumber as bad:
                self.fail(bad.sentence(), steps[:bad.index], [])
        checked.__name__ = check.__name__
        return checked

    def never_nan(self, steps: list[bool]) -> None:
        scales = self.scales(steps)
        for i, s in enumerate(scales):
            if math.isnan(s):
                self.fail(f"the scale became NaN {f'at step {i - 1}' if i else 'before any update'}", steps[:i], scales)

    def bounds(self, steps: list[bool]) -> None:
        scales, floor, cap = self.scales(steps), self.floor, self.cap
        for i, s in enumerate(scales):
            if cap is not None and s > cap:
                self.fail(f"the scale {s} rose above the cap {cap} after step {i}", steps, scales)
            if floor is None and not s > 0:
                self.fail(f"the scale reached {s} after step {i}", steps, scales)
            if floor is not None and s < floor:
                self.fail(f"the scale {s} fell below the floor {floor} after step {i}", steps, scales)
            if self.capped and not (math.isfinite(s) and s <= F32_MAX):
                self.fail(f"the scale reached {s} after step {i} (not finite)", steps, scales)

    def overflow_never_raises(self, steps: list[bool]) -> None:
        scales = self.scales(steps)
        for i in range(len(scales) - 1):
            if not steps[i] and scales[i + 1] > scales[i]:
                self.fail(f"an overflow at step {i} raised the scale from {scales[i]} to {scales[i + 1]}", steps,
                          scales)

    def overflows_lower(self, steps: list[bool]) -> None:
        n, floor = self.backoff_within, self.floor
        tail = self.scales(list(steps) + [False] * n)
        if len(tail) == len(steps) + n + 1:
            last = tail[len(steps)]
            at_floor = last <= (floor if floor is not None else 0.0)
            if not at_floor and math.isfinite(last) and min(tail[len(steps):]) >= last:
                self.fail(f"{n} overflows in a row after the sequence never lowered the scale from {last} "
                          f"(its floor: {floor}; give floor= if {last} is it, or lowers=False for a fixed scale)",
                          steps, tail[:len(steps) + 1])

    def no_shared_state(self, steps: list[bool]) -> None:
        scales = self.scales(steps)
        chance = _draws(lambda: self.scales(steps))
        if not _agree(self.scales(steps), scales):
            self.fail(_CHANCE if chance else _OUTSIDE, steps, scales)
        if not _agree(self.scales(steps, interleave=self.make), scales):
            if chance:
                self.fail(_CHANCE, steps, scales)
            self.fail("two instances share state: updating another instance changed this one's scales (hidden "
                      "shared state)", steps, scales)

    def finite_runs_grow(self, steps: list[bool]) -> None:
        n, cap = self.growth_within, self.cap
        scales, tail = self.scales(steps), self.scales(list(steps) + [True] * n)
        if len(tail) == len(steps) + n + 1:
            last = tail[len(steps)]
            if self.capped and not all(math.isfinite(x) and x <= F32_MAX for x in tail):
                self.fail(f"a run of finite steps after the sequence made the scale {max(tail)} (not finite)",
                          steps, scales)
            if 0 < last < min(F32_MAX / 2**8, cap if cap is not None else math.inf) and \
                    max(tail[len(steps):]) <= last:
                hint = f"; if {last} is the policy's ceiling, give cap={last}" if cap is None else ""
                self.fail(f"{n} finite steps after the sequence never grew the scale from {last}{hint} "
                          f"(grows=False for a fixed scale)", steps, scales)

    def run(self, lowers: bool, grows: bool, max_examples: int, max_steps: int) -> None:
        """Every property over hypothesis's sequences, most specific first: shared state makes every
        other result meaningless; an overflow that raises the scale is named as such, not as the
        non-finite scale it leads to."""
        try:
            shared = _shares_state(self.make, self.raises, min(self.growth_within, 2000))
        except _Raised:
            shared = None  # reported below, with the shrunk sequence that raises
        except _NotANumber as bad:
            raise PolicyError(f"{self.name}: {bad.sentence()}") from None
        if shared:
            cause = "" if shared.startswith(_CHANCE) else " (hidden shared state, as in a class attribute)"
            raise PolicyError(f"{self.name}: {shared}{cause}")
        checks = [self.never_nan, self.no_shared_state, self.overflow_never_raises] + (
            [self.overflows_lower] if lowers else []) + [self.bounds] + ([self.finite_runs_grow] if grows else [])
        for check in checks:
            run = settings(max_examples=max_examples, deadline=None, database=None,
                           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])(
                given(steps=overflow_sequences(max_steps))(self.reporting(check)))
            try:
                run()
            except Flaky as err:  # a failure that does not replay: the policy's results drift between runs
                inner = next((e for e in getattr(err, "exceptions", ()) if isinstance(e, PolicyError)), err)
                raise PolicyError(f"{self.name}: the same steps gave different results from one run to the next, so "
                                  f"the policy depends on state outside its instances (hidden shared state) or on "
                                  f"chance (random numbers, a clock)\n{inner}") from None


def check_policy(make: Callable[[], Any], *, floor: float | None = None, cap: float | None = None,
                 capped: bool | None = None, grows: bool | None = None, lowers: bool | None = None,
                 growth_within: int = 5000,
                 backoff_within: int = 16, raises: tuple[type[BaseException], ...] = (),
                 max_examples: int = 150, max_steps: int = 400) -> None:
    """Property-test the policy that ``make()`` builds; raise :class:`PolicyError`
    naming the property and the (shrunk) finite/overflow sequence that breaks it.

    Properties, for every sequence, tested in this order (the first that fails is
    reported, so that a policy which raises the scale on overflow is not reported as one
    that never grows): ``get_loss_scale()`` is a number (a string such as ``"65536"`` is
    refused, not coerced) and never NaN; two instances fed the same steps agree, also when
    other instances are updated in between (no hidden shared state; where reseeding Python's
    and numpy's global random generators makes them agree, the policy is named as not
    deterministic instead); an overflow step never increases the scale; ``backoff_within``
    overflows in a row lower it unless it is at its floor (``lowers=False``: a fixed
    scale); it stays positive (or at least ``floor``; ``floor=0`` allows reaching zero), at
    most ``cap`` and, if ``capped``, finite and at most binary32's MAX; ``growth_within``
    finite steps in a row grow it unless it is at ``cap``, within 2**8 of binary32's MAX, or
    zero where ``floor=0`` allows that (``grows=False``: a fixed scale). ``floor``, ``cap``,
    ``capped``, ``grows`` and ``lowers`` default to what the policy declares (its
    ``policy.floor_value()``, ``policy.cap_value()``, ``policy.capped``, ``policy.grows``,
    ``policy.lowers``: apex's ``max_loss_scale`` is its cap), else 0 < scale, no cap,
    capped, growing and lowering. ``raises`` lists exceptions the policy may raise by
    design (they end the sequence). Every argument is checked before anything runs.

    An FP8 scaling recipe's face (``scale_for(amax)`` and ``update(amax)``, as
    :class:`lossscale.training.fp8.TensorScaler`) is checked by :func:`check_recipe` instead.
    """
    for arg, value in (("max_examples", max_examples), ("max_steps", max_steps), ("growth_within", growth_within),
                       ("backoff_within", backoff_within)):
        check_period(arg, value)
    _checked_arguments(floor, cap, {"capped": capped, "grows": grows, "lowers": lowers})
    if not isinstance(raises, tuple) or not all(isinstance(e, type) and issubclass(e, BaseException) for e in raises):
        raise ValueError(f"raises must be a tuple of exception classes, such as (MinimumScaleError,), got {raises!r}")
    if callable(make) and _is_recipe(_try_make(make)):
        return check_recipe(make, max_examples=max_examples, max_steps=max_steps)
    probe = _made(make)
    policy = getattr(probe, "policy", None)
    if floor is None:
        floor = policy.floor_value() if policy is not None else None
    if cap is None and policy is not None and math.isfinite(policy.cap_value()):
        cap = policy.cap_value()
    if capped is None:
        capped = getattr(policy, "capped", True)
    if grows is None:
        grows = getattr(policy, "grows", True)
    if lowers is None:
        lowers = getattr(policy, "lowers", True)
    _PolicyCheck(make, type(probe).__name__, floor, cap, capped, raises, growth_within, backoff_within).run(
        lowers, grows, max_examples, max_steps)


def _try_make(make: Callable[[], Any]) -> Any:
    try:
        return make()
    except Exception:  # noqa: BLE001 - _made reports it
        return None


def _is_recipe(obj: Any) -> bool:
    return callable(getattr(obj, "scale_for", None)) and callable(getattr(obj, "update", None))


def amax_sequences(max_steps: int = 200) -> st.SearchStrategy[list[float]]:
    """Sequences of amax values aimed at the hard places: 0, binary32 subnormals, values near
    1 and near FP8 MAX, huge ones whose scale underflows or overflows, Inf and NaN."""
    value = st.one_of(
        st.floats(min_value=2.0**-30, max_value=2.0**30),
        st.sampled_from([0.0, 2.0**-149, 2.0**-126, 1.0, 448.0, 57344.0, 3.0e38, math.inf, math.nan]),
        st.floats(min_value=2.0**-149, max_value=2.0**-100),
        st.floats(min_value=2.0**100, max_value=3.4e38),
    )
    return st.lists(value, max_size=max_steps)


def _recipe_scales(make: Callable[[], Any], seq: list[float], other: Any = None) -> list[float]:
    """The scales a new recipe made by ``make`` quantises each amax of ``seq`` with (updating after
    each, and ``other`` beside it), then the scale it would use next."""
    m, out = make(), []
    for a in seq:
        out.append(float(m.scale_for(a)))
        m.update(a)
        if other is not None:
            other.update(1.0)
    out.append(float(m.scale_for(1.0)))
    return out


def _shown(values: list[float]) -> str:
    return f"{values[:12]}{' ...' if len(values) > 12 else ''}"


def check_recipe(make: Callable[[], Any], *, fits: bool | None = None, max_examples: int = 150,
                 max_steps: int = 200) -> None:
    """Property-test an FP8 scaling recipe's face (``scale_for(amax)``, ``update(amax)``):
    raise :class:`PolicyError` naming the property and the (shrunk) amax sequence.

    For every sequence: the scale used is positive, finite and at most binary32's MAX (NaN,
    Inf, 0 and subnormal amax included); where every amax so far is finite and positive the
    tensor fits: amax times the scale it is quantised with (after the update, for a delayed
    recipe) is at most the format's MAX (within binary32's rounding), unless the scale is
    capped at binary32's MAX (``fits``, default: what the recipe declares, False for MX
    blocks, whose scales are per block); two instances fed the same amax values agree, also
    when another instance is updated in between (no hidden shared state).
    """
    probe = _try_make(make)
    if not _is_recipe(probe):
        raise PolicyError(f"check_recipe takes a function making an object with scale_for(amax) and update(amax), "
                          f"got {probe!r}")
    name = f"{type(probe).__name__}({type(getattr(probe, 'recipe', probe)).__name__})"
    if fits is None:
        fits = getattr(getattr(probe, "recipe", None), "per_tensor", True)
    fp8_max = float(getattr(probe, "fp8_max", 448.0))

    def scales(seq: list[float], other: Any = None) -> list[float]:
        return _recipe_scales(make, seq, other)

    def fail(what: str, seq: list[float], got: list[float]) -> None:
        raise PolicyError(f"{name}: {what}\n  amax: {_shown(seq)}\n  scales: {_shown(got)}")

    def bounds(seq: list[float]) -> None:
        got = scales(seq)
        for i, s in enumerate(got):
            if not (math.isfinite(s) and 0 < s <= F32_MAX):
                fail(f"the scale is {s} at step {i}", seq, got)

    def tensor_fits(seq: list[float]) -> None:
        m, seen = make(), []
        for a in seq:
            if not (math.isfinite(a) and a > 0):
                return
            m.update(a)
            seen.append(a)
            s = float(m.scale_for(a))
            if s < F32_MAX and a * s > fp8_max * (1 + 2.0**-22):
                fail(f"amax {a} times its scale {s} is {a * s}, beyond the format's MAX {fp8_max}", seq, seen)

    def no_shared_state(seq: list[float]) -> None:
        got = scales(seq)
        if scales(seq) != got:
            fail("two instances fed the same amax values disagree (hidden shared state?)", seq, got)
        if scales(seq, other=make()) != got:
            fail("updating another instance changed this one's scales (hidden shared state)", seq, got)

    for check in [bounds, *([tensor_fits] if fits else []), no_shared_state]:
        settings(max_examples=max_examples, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])(
            given(seq=amax_sequences(max_steps))(check))()


def _made(make: Callable[[], Any]) -> Any:
    """``make()``, checked to follow the protocol; PolicyError naming what it lacks."""
    if not callable(make):
        raise PolicyError(f"check_policy takes a class or a function making a policy object, got {make!r}")
    try:
        probe = make()
    except TypeError as err:
        raise PolicyError(f"could not make a policy by calling {getattr(make, '__name__', make)!r}(): {err}") from None
    missing = missing_scaler_methods(probe)
    if missing:
        raise PolicyError(f"{type(probe).__name__} lacks {' and '.join(f'{m}()' for m in missing)}: a policy object "
                          f"has get_loss_scale() and update_loss_scale(finite)")
    return probe
