"""Shadow statistics: while a run trains under one recipe (or in binary16), what each named
alternative would have given on the same operands at every step: elements saturated and not
finite, underflowed to zero, the relative error against the binary32 operand, the scales it
would pick (``shadow.csv``: :data:`lossscale.training.records.SHADOW_COLUMNS`).

An alternative (``simulate(shadow=[...])``, ``--shadow NAME ...``) is written
``NAME[:KEY=VALUE[:KEY=VALUE...]]`` or given as a :class:`~lossscale.training.fp8.Recipe`:

- a recipe of :data:`~lossscale.training.fp8.RECIPES` with its arguments (``nvfp4``,
  ``mx:rule=floor``, ``delayed:fp8_format=HIF8``);
- an element format (``hifloat8``, ``float4_e2m1fn``): the run's recipe with that format
  (``fp8_format``), or current scaling into it where the run has none;
- an overflow mode (``saturation``, ``inf_nan``): the run's recipe under that mode.

``overflow=MODE`` sets the mode of any of them. Each alternative quantises on a device of its own,
made as the run's (the same product, choices and seed, so its stochastic roundings draw what a
run of its own would draw from its block unit), keeps its own per-tensor scales (from the amaxes
it sees; across ranks none are reduced), and changes nothing the run computes. At step 0 the
operands of the first matmuls are what a run under the alternative would see: there its rows are,
bit for bit, that run's ``fp8.csv`` rows (later matmuls see operands the run's own recipe made).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sim import Device, OverflowMode

from ..policy.core import parse_value
from .fp8 import FP8_FORMATS, RECIPES, CurrentScaling, Quantiser, Recipe, make_recipe
from .recipes import _format_name

__all__ = ["Shadow", "Alternative", "alternative", "alternatives"]

_MODES = ("saturation", "inf_nan")


@dataclass(frozen=True)
class Alternative:
    """A resolved alternative: its name in ``shadow.csv``, its recipe, and its overflow mode
    (None: the run's)."""

    name: str
    recipe: Recipe
    overflow: OverflowMode | None = None

    def attach(self, dev: Device, rank: int, record: Callable[[dict[str, Any]], None]) -> Shadow:
        """The alternative beside ``dev``: a device made as it is, and a quantiser logging to ``record``."""
        c = dev.choices
        twin = Device(dev.profile, self.overflow or dev.overflow, rounding=dev.fpu.rounding,
                      saturate_float32=c.saturate_float32, tininess=c.tininess, default_nan=c.default_nan,
                      nan_to_zero=c.nan_to_zero, name=f"{dev.name}.shadow.{self.name}", seed=dev.seed,
                      matmul_bias=dev.matmul_bias)
        return Shadow(self.name, Quantiser(self.recipe, rank, lambda row: record({"shadow": self.name, **row})), twin)


@dataclass(frozen=True)
class Shadow:
    """An alternative at work beside one device (:class:`lossscale.training.fp8.Fp8Matmuls`)."""

    name: str
    quantiser: Quantiser
    device: Device


def _value(text: str) -> Any:
    value = parse_value(text)
    return text.strip() if value is None else value


def alternative(spec: str | Recipe, recipe: Recipe | None) -> Alternative:
    """One alternative (the module says how), beside a run under ``recipe`` (None: binary16)."""
    try:
        return _alternative(spec, recipe)
    except ValueError as e:
        raise ValueError(str(e) if str(e).startswith(("shadow", "unknown shadow", "a shadow"))
                         else f"shadow {spec!r}: {e}") from None


def _alternative(spec: str | Recipe, recipe: Recipe | None) -> Alternative:
    if isinstance(spec, Recipe):
        return Alternative(type(spec).__name__, spec)
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"a shadow is a recipe, an element format or an overflow mode (text), or a Recipe; "
                         f"got {spec!r}")
    name, *pairs = (p.strip() for p in spec.strip().split(":"))
    args: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"shadow {spec!r}: arguments are KEY=VALUE after the name, separated by ':'; got {pair!r}")
        args[key.strip()] = _value(text)
    overflow = args.pop("overflow", None)
    if name in _MODES:
        overflow = name if overflow is None else overflow
        if recipe is None or args:
            raise ValueError(f"shadow {spec!r}: an overflow mode shadows the run's own recipe, with no arguments "
                             "(the run has none: give a recipe, such as current:overflow=" + name + ")"
                             if recipe is None else f"shadow {spec!r}: an overflow mode takes no recipe arguments")
        chosen = recipe
    elif name in RECIPES:
        chosen = make_recipe(name, **args)
    else:
        try:
            fmt = _format_name(name)
        except ValueError:
            raise ValueError(f"unknown shadow {name!r}; valid: a recipe ({', '.join(RECIPES)}), an overflow mode "
                             f"({', '.join(_MODES)}), or an element format ({', '.join(FP8_FORMATS)}, or a "
                             f"catalogue name such as hifloat8)") from None
        base = recipe if recipe is not None else CurrentScaling()
        valid = [f.name for f in dataclasses.fields(base)]
        unknown = sorted(set(args) - set(valid))
        if unknown:
            raise ValueError(f"shadow {spec!r}: {type(base).__name__} takes no argument {', '.join(unknown)}; "
                             f"valid: {', '.join(valid)}, overflow")
        chosen = dataclasses.replace(base, fp8_format=fmt, **args)
    return Alternative(spec.strip(), chosen, None if overflow is None else OverflowMode.parse(overflow))


def alternatives(specs: Sequence[str | Recipe] | None, recipe: Recipe | None) -> list[Alternative]:
    """The run's alternatives, each once."""
    if specs is None:
        return []
    if isinstance(specs, (str, Recipe)):
        specs = [specs]
    out = [alternative(s, recipe) for s in specs]
    names = [a.name for a in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"shadow {', '.join(twice)} given twice; give each alternative once")
    return out
