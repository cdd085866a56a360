"""The loss-scale protocol: a policy is a frozen value (its configuration) with a
pure transition ``next(state, finite) -> state``; a manager is the small
stateful face that frameworks expose (``get_loss_scale``/``update_loss_scale``).

Keeping the state a small immutable value (as jmp does) makes policies easy to
property-test, to replay on a recorded overflow sequence, and to sweep.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, NamedTuple

import numpy as np

from sim.checks import integer

#: The protocol, the registry and manager_class are public as lossscale.policy's (Policy, Manager,
#: PolicyManager and trajectory as lossscale's): one import path each.
__all__ = ["F32_MAX", "DEMO_SCALE"]

F32_MAX = float(np.finfo(np.float32).max)


def f32(x: float) -> np.float32:
    """x rounded to binary32 (to nearest even), as a numpy scalar."""
    return np.float32(x)


@dataclass(frozen=True)
class Policy:
    """Base of the pure policy cores. Subclasses are frozen dataclasses whose
    fields are the original's constructor arguments (names and defaults)."""

    #: Lower bound the scale never goes below (0.0: none).
    floor: ClassVar[str | float] = 0.0
    #: Whether growth is refused where it would overflow binary32 (else the scale may reach Inf).
    capped: ClassVar[bool] = True
    #: Whether a long enough run of finite steps grows the scale.
    grows: ClassVar[bool] = True
    #: Whether a run of overflows lowers the scale (down to its floor).
    lowers: ClassVar[bool] = True

    class State(NamedTuple):
        scale: Any

    def initial(self) -> Any:
        raise NotImplementedError

    def next(self, state: Any, finite: bool) -> Any:
        raise NotImplementedError

    def checks_overflow(self) -> bool:
        """Whether a step's overflow check runs at all (False: every step is applied)."""
        return True

    def floor_value(self) -> float:
        """The declared floor as a number in the scale's own type (a field name
        resolves to its value: 1.7e38 is 1.6999999e38 in binary32)."""
        value = getattr(self, self.floor) if isinstance(self.floor, str) else self.floor
        return float(type(self.initial().scale)(value))

    def cap_value(self) -> float:
        """The ceiling the policy's growth stops at (inf: none but binary32's range, where
        ``capped``), as apex's ``max_loss_scale``."""
        return math.inf


def trajectory(policy: Policy, finite: Iterable[bool]) -> list[float]:
    """The scale before each step and after the last, for a finite/overflow sequence of bools
    (True or numpy True: the step's gradients were finite); TypeError naming the first other value
    (a string such as "False" is truthy, so it is refused rather than read)."""
    state = policy.initial()
    scales = [float(state.scale)]
    for i, ok in enumerate(finite):
        if not isinstance(ok, (bool, np.bool_)):
            raise TypeError(f"finite[{i}] must be a bool (True: the step's gradients were finite), got {ok!r}")
        state = policy.next(state, bool(ok))
        scales.append(float(state.scale))
    return scales


class Manager:
    """Stateful face on a policy: ``get_loss_scale()`` and ``update_loss_scale(finite)``, and
    checkpoints with ``state_dict()`` / ``load_state_dict()``.

    Subclasses name their policy type in ``policy_type`` (:func:`manager_class` makes them); the
    constructor takes that policy's arguments.
    """

    policy_type: ClassVar[type[Policy]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.policy = self.policy_type(*args, **kwargs)
        self.state = self.policy.initial()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "policy_type" in cls.__dict__:
            cls.__signature__ = inspect.signature(cls.policy_type)

    def get_loss_scale(self) -> float:
        """The current scale (the binary32 value, as a Python float)."""
        return float(self.state.scale)

    def update_loss_scale(self, finite_grads: bool) -> None:
        """Advance one step: ``finite_grads`` says whether the step's gradients were finite."""
        if not isinstance(finite_grads, (bool, np.bool_)):
            raise ValueError(f"finite_grads must be a bool, got {finite_grads!r}")
        self.state = self.policy.next(self.state, bool(finite_grads))

    def reset(self) -> None:
        self.state = self.policy.initial()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.policy}, state={self.state})"

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint of plain Python values, as torch's ``GradScaler.state_dict``
        (``torch/amp/grad_scaler.py``) holds its factors, interval, scale and tracker:
        ``{"policy": name, "arguments": {...}, "state": {...}}``. A binary32 scale is a
        Python float (exactly: binary64 holds every binary32 value)."""
        if not hasattr(self.state, "_fields"):
            raise TypeError(f"{type(self).__name__}: state_dict needs the policy's state as a NamedTuple, "
                            f"got {type(self.state).__name__}")
        return {"policy": type(self.policy).__name__,
                "arguments": {k: _plain(v) for k, v in describe(self.policy).items()},
                "state": {k: _plain(getattr(self.state, k)) for k in self.state._fields}}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`: the arguments (as torch's ``load_state_dict`` restores
        its factors and interval) and the state, so the run continues bit for bit. Everything
        is checked before anything changes: a dict of another policy, with missing or extra
        keys, or with values of the wrong kind raises ValueError and leaves the face as it was."""
        self.policy, self.state = restore(self.policy, state_dict)


#: The keys of a :meth:`Manager.state_dict`.
STATE_DICT_KEYS = ("policy", "arguments", "state")


def parse_value(text: str) -> bool | int | float | None:
    """A setting's value written as text (``KEY=VALUE`` on a command line, a recipe's arguments):
    true/false, an integer (also ``2**k``), a float; None for any other text."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    power = re.fullmatch(r"(\d+)\s*\*\*\s*(-?\d+)", text.strip())
    if power:
        base, exp = int(power[1]), int(power[2])
        return base**exp if exp >= 0 else float(base) ** exp
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return None


def _plain(value: Any) -> Any:
    """A number as the Python value that holds it exactly (bool, int or float); others as they are."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def _check_keys(what: str, given: Any, valid: Iterable[str]) -> None:
    valid = list(valid)
    if not isinstance(given, Mapping):
        raise ValueError(f"{what} must be a dict with keys {', '.join(valid)}; got {type(given).__name__}")
    missing = [k for k in valid if k not in given]
    extra = [repr(k) for k in given if k not in valid]
    if missing or extra:
        wrong = "; ".join(([f"missing {', '.join(missing)}"] if missing else []) +
                          ([f"unknown {', '.join(extra)}"] if extra else []))
        raise ValueError(f"{what}: {wrong}; valid keys: {', '.join(valid)}")


def _state_value(name: str, value: Any, kind: type) -> Any:
    """``value`` as the type ``kind`` of the policy's own state field, refused if that would change it."""
    if issubclass(kind, (bool, np.bool_)):
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"state_dict state {name}: must be a bool, got {value!r}")
        return kind(value)
    if not issubclass(kind, numbers.Real):
        return value
    integral = issubclass(kind, numbers.Integral)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral if integral else numbers.Real):
        raise ValueError(f"state_dict state {name}: must be {'an integer' if integral else 'a real number'}, "
                         f"got {value!r}")
    converted = kind(value)
    if not integral and not math.isnan(float(value)) and float(converted) != float(value):
        raise ValueError(f"state_dict state {name}: {value!r} is not a {kind.__name__} value "
                         f"(a state_dict holds the exact scale)")
    return converted


def restore(policy: Policy, state_dict: Mapping[str, Any]) -> tuple[Policy, Any]:
    """The policy and state a :meth:`Manager.state_dict` describes, checked against ``policy``
    (the same policy type; its arguments, keys and kinds of values)."""
    _check_keys("state_dict", state_dict, STATE_DICT_KEYS)
    name = type(policy).__name__
    if state_dict["policy"] != name:
        raise ValueError(f"state_dict is of policy {state_dict['policy']!r}, this face runs {name}: "
                         f"load a state_dict saved from a face on {name}")
    _check_keys("state_dict arguments", state_dict["arguments"], (f.name for f in fields(policy)))
    try:
        restored = dataclasses.replace(policy, **state_dict["arguments"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"state_dict arguments: {err}") from err
    initial = restored.initial()
    _check_keys("state_dict state", state_dict["state"], initial._fields)
    values = [_state_value(k, state_dict["state"][k], type(getattr(initial, k))) for k in initial._fields]
    return restored, type(initial)(*values)


def manager_class(policy_type: type[Policy], name: str, doc: str, *, module: str | None = None,
                  **methods: Callable[..., Any]) -> type[Manager]:
    """The manager class of a policy type (its stateful face), a :class:`Manager` named ``name``: its
    constructor takes the policy's arguments (their names, defaults and signature), ``doc`` is
    its docstring, ``methods`` are added to it (a framework's own names for them, say).

    Every manager class is made here, so each has the same protocol and checkpoints.
    ``module`` is where it is defined (default: the caller's module, as ``namedtuple`` does)."""
    if not (isinstance(policy_type, type) and issubclass(policy_type, Policy)):
        raise TypeError(f"manager_class takes a Policy subclass, got {policy_type!r}")
    if module is None:
        module = sys._getframe(1).f_globals.get("__name__", __name__)
    namespace = {"policy_type": policy_type, "__doc__": doc, "__module__": module, "__qualname__": name, **methods}
    return type(name, (Manager,), namespace)


# -- argument checks ------------------------------------------------------------------
#: The NPULossScaleOptimizer page's initial scale, 2**32: too high for binary16 gradients, so backoff shows.
DEMO_SCALE = 2.0**32

#: Every manager by its short name (``lossscale run --manager``), in registration order: its
#: class and the arguments of the demo runs (the NPULossScaleOptimizer page's 2**32 where a manager takes an initial
#: scale, and a growth period of 50 steps, so that both backoff and growth show in a default
#: run; each can be overridden). A manager is added here by :func:`register`, where it is defined.
MANAGERS: dict[str, tuple[type[Manager], dict[str, Any]]] = {}


#: For managers whose framework requires arguments (no default in its constructor): the values
#: ``--defaults framework`` gives them, and where they come from.
REQUIRED: dict[str, tuple[dict[str, Any], str]] = {}


def register(name: str, *, required: tuple[dict[str, Any], str] | None = None,
             **demo: Any) -> Callable[[type[Manager]], type[Manager]]:
    """Class decorator: enter a manager in :data:`MANAGERS` under ``name`` with its demo
    arguments, and in :data:`REQUIRED` the values (and their source) of the arguments its
    framework requires."""
    def add(cls: type[Manager]) -> type[Manager]:
        if name in MANAGERS:
            raise ValueError(f"manager name {name!r} is taken by {MANAGERS[name][0].__name__}")
        need = [f.name for f in fields(cls.policy_type) if f.default is MISSING and f.name not in
                (required or ({}, ""))[0]]
        if need:
            raise ValueError(f"manager {name!r}: its framework requires {', '.join(need)}; register it with "
                             f"required=({{...}}, source)")
        MANAGERS[name] = (cls, demo)
        if required is not None:
            REQUIRED[name] = required
        return cls
    return add


def missing_scaler_methods(obj: Any) -> list[str]:
    """Which of ``get_loss_scale`` and ``update_loss_scale`` an object lacks as callables (the
    protocol every scaler follows, ours or a user's)."""
    return [m for m in ("get_loss_scale", "update_loss_scale") if not callable(getattr(obj, m, None))]


class PolicyManager(Manager):
    """The stateful face on a given policy value (any :class:`Policy`, yours included)."""

    def __init__(self, policy: Policy) -> None:
        if not isinstance(policy, Policy):
            raise TypeError(f"PolicyManager takes a Policy, got {type(policy).__name__}")
        self.policy = policy
        self.state = policy.initial()


def _number(name: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond binary64, such as 2**2000
        number = math.inf
    if not math.isfinite(number):
        big = isinstance(value, int) and abs(value) >= 10**20
        shown = f"an integer of {value.bit_length()} bits" if big else repr(value)
        raise ValueError(f"{name} must be finite (below {float(np.finfo(np.float64).max):.4g}), got {shown}")
    return number


def check_at_least(name: str, value: Any, low: float) -> None:
    if _number(name, value) < low:
        raise ValueError(f"{name} must be at least {low:g}, got {value!r}")


def check_positive(name: str, value: Any) -> None:
    if _number(name, value) <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")


def check_scale(name: str, value: Any, low: float = 0.0) -> None:
    """A loss scale the framework holds in binary32 (a float32 tensor or variable): above 0 (at
    least ``low``, where given), and finite once rounded to binary32."""
    v = _number(name, value)
    if low and v < low:
        raise ValueError(f"{name} must be at least {low:g}, got {value!r}")
    if not low and v <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    with np.errstate(over="ignore"):
        if not np.isfinite(np.float32(v)):
            raise ValueError(f"{name} must be finite in binary32, the format the scale is kept in (at most "
                             f"{F32_MAX:.4g}), got {value!r}")


def check_ratio(name: str, value: Any, above_one: bool) -> None:
    v = _number(name, value)
    if above_one and not v > 1:
        raise ValueError(f"{name} must be greater than 1, got {value!r}")
    if not above_one and not 0 < v < 1:
        raise ValueError(f"{name} must be between 0 and 1 (exclusive), got {value!r}")


def check_period(name: str, value: Any, low: int = 1) -> None:
    integer(name, value, low)


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def describe(policy: Policy) -> dict[str, Any]:
    """The policy's arguments as a plain dict (for summaries and sweeps)."""
    return {f.name: getattr(policy, f.name) for f in fields(policy)}
