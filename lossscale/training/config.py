"""The run setting, declared once: :class:`RunConfig`.

Every setting of a simulation is one field here, with its type, default, help text and
what checks it (``dataclasses.field`` metadata, made by :func:`setting`). ``simulate()``'s
keyword arguments, the ``lossscale run``/``compare`` options, the sweep axes and
``summary.json``'s ``arguments`` are all read from these fields, so a new setting is a new
field here plus the code that uses it.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Iterator
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from sim import OverflowMode, profiles
from sim.checks import integer_problem

from ..policy.core import MANAGERS, REQUIRED, Manager
from .detectors import ALIASES, DETECTORS, Detector, make_detector
from .fp8 import RECIPES, Recipe, make_recipe
from .pipeline import check_stages
from .shadow import alternatives
from .workloads import WORKLOADS, Workload, check_split, is_import_path, make_workload

__all__ = ["setting", "settings", "recorded", "check_arguments", "integer_problems", "DEFAULTS", "manager_arguments",
           "make_manager", "fp8_recipe", "check_fp8_profile"]

#: Where a named manager's unset arguments come from: ``demo`` (the simulator's demo set, in
#: ``MANAGERS``: the NPULossScaleOptimizer page's 2**32 and growth after 50 steps, so that a short run shows both
#: backoff and growth) or ``framework`` (the framework's own defaults; arguments it requires
#: take the values in ``lossscale.policy.REQUIRED``, with their source).
DEFAULTS = ("demo", "framework")


def manager_arguments(name: str, args: dict[str, Any] | None = None, defaults: str = "demo") -> dict[str, Any]:
    """The constructor arguments a named manager gets: every field of its policy, from ``args``,
    else the ``defaults`` set. ValueError naming an unknown manager, argument or set."""
    if name not in MANAGERS:
        raise ValueError(f"unknown manager {name!r}; valid: {', '.join(MANAGERS)}")
    if defaults not in DEFAULTS:
        raise ValueError(f"unknown defaults {defaults!r}; valid: {', '.join(DEFAULTS)}")
    cls, demo = MANAGERS[name]
    names = [f.name for f in fields(cls.policy_type)]
    for key in args or {}:
        if key not in names:
            raise ValueError(f"manager {name!r} takes no argument {key!r}; valid: {', '.join(names)}")
    out = {}
    for f in fields(cls.policy_type):
        has_default = f.default is not MISSING
        if f.name in (args or {}):
            out[f.name] = args[f.name]
        elif defaults == "demo" and f.name in demo:
            out[f.name] = demo[f.name]
        elif not has_default:
            out[f.name] = REQUIRED[name][0][f.name]
        else:
            out[f.name] = f.default
    return out


def make_manager(name: str, args: dict[str, Any] | None = None, defaults: str = "demo") -> Manager:
    """A manager by name: ``args`` over the ``defaults`` set (see :data:`DEFAULTS`)."""
    arguments = manager_arguments(name, args, defaults)
    return MANAGERS[name][0](**arguments)


def fp8_recipe(fp8: Any, args: Any) -> Recipe | None:
    """The recipe ``simulate(fp8=..., fp8_args=...)`` runs (None: no FP8 matmuls); ValueError where
    the recipe or its arguments are wrong."""
    if fp8 is None:
        if args:
            raise ValueError(f"fp8_args go with an fp8 recipe (fp8= one of {', '.join(RECIPES)})")
        return None
    return make_recipe(fp8, **(args if isinstance(args, dict) else {}))


def check_fp8_profile(recipe: Recipe | None, profile: str | profiles.Profile, allow_unsupported: bool) -> str | None:
    """FP8 matmuls on a product without the recipe's 8-bit formats (``Profile.eight_bit``, from
    Ascend C's data-type tables: the Atlas 350 only): ValueError naming the products that have
    them, or, with ``allow_unsupported``, the warning to give (emulated anyway). None where the
    product has them (or there is no recipe)."""
    if recipe is None:
        return None
    prof = profiles.get(profile)
    wanted = list(dict.fromkeys(f.name for f in recipe.needs()))
    lacking = [f for f in wanted if f not in prof.eight_bit]
    if not lacking:
        return None
    having = [p for p in profiles.names() if set(wanted) <= set(profiles.get(p).eight_bit)]
    has = f"has only {', '.join(prof.eight_bit)}" if prof.eight_bit else "has no 8-bit float formats (no FP8 units)"
    refusal = (f"{prof.name} ({prof.product_en}) {has}, and the {type(recipe).__name__} recipe needs "
               f"{' and '.join(lacking)} (Ascend C's data types; profiles that have them: "
               f"{', '.join(having) or 'none'})")
    if not allow_unsupported:
        raise ValueError(f"{refusal}; choose one of those profiles, or emulate them anyway (allow_unsupported=True, "
                         f"--allow-unsupported)")
    return f"{refusal}; emulated anyway (allow_unsupported)"


def _check_shadow(get: Callable[[str], Any]) -> None:
    if not get("shadow"):
        return
    try:
        recipe = fp8_recipe(get("fp8"), get("fp8_args"))
    except ValueError:
        return  # the fp8 setting's own check says what is wrong
    for alt in alternatives(get("shadow"), recipe):
        if get("profile") in profiles.names():
            check_fp8_profile(alt.recipe, get("profile"), bool(get("allow_unsupported")))


def _check_fp8(get: Callable[[str], Any]) -> None:
    recipe = fp8_recipe(get("fp8"), get("fp8_args"))
    if recipe is not None and get("profile") in profiles.names():
        check_fp8_profile(recipe, get("profile"), bool(get("allow_unsupported")))


@functools.lru_cache(maxsize=16)
def _workload_check(name: str, wargs: str, seed: int) -> Workload:
    return make_workload(name, seed, **json.loads(wargs))


#: A setting's check: given the settings (by name), raise ValueError or TypeError naming the problem.
Check = Callable[[Callable[[str], Any]], Any]


def _check_workload(get: Callable[[str], Any]) -> None:
    workload, wargs = get("workload"), get("workload_args")
    if not isinstance(workload, str) or (workload not in WORKLOADS and not is_import_path(workload)):
        raise ValueError(f"unknown workload {workload!r}; valid: {', '.join(WORKLOADS)} or package.module:factory")
    if isinstance(wargs, (dict, type(None))) and integer_problem("seed", get("seed"), 0) is None:
        made = _workload_check(workload, json.dumps(wargs or {}, sort_keys=True), int(get("seed")))
        ranks = get("ranks")
        if integer_problem("ranks", ranks, 1) is None:  # else integer_problems says
            micro = get("micro_batches")
            valid = integer_problem("micro_batches", micro, 1) is None  # else integer_problems says
            check_split(made, made.batches(1)[0], int(ranks), int(micro) if valid else 1)


def _check_manager(get: Callable[[str], Any]) -> None:
    if not isinstance(get("manager"), str):
        raise TypeError(f"manager must be a name; valid: {', '.join(MANAGERS)}")
    if isinstance(get("manager_args"), (dict, type(None))):
        defaults = get("manager_defaults")
        make_manager(get("manager"), get("manager_args"), defaults if defaults in DEFAULTS else "demo")


def _check_positive(name: str, value: Any) -> None:
    """None, or a finite number above 0 (else ValueError naming ``name``)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a finite number above 0 (or unset: off), got {value!r}")


#: The settings' upper bounds, checked before anything is made: a run holds its steps' batches and
#: rows in memory, and makes a device per rank, stage and micro-batch split.
MAX_STEPS, MAX_RANKS = 10_000_000, 4096


def setting(default: Any, help: str, *, option: str | None = "", choices: Callable[[], list[str]] | None = None,
            low: int | None = None, high: int | None = None, table: bool = False, words: bool = False,
            named: bool = False, many: bool = False,
            recorded: bool = True, listed_after: str | None = None, check: Check | None = None,
            importable: bool = False) -> Any:
    """A :class:`RunConfig` field and what the layers need to know of it.

    ``option``: the command-line option ("": ``--`` and the name with dashes; None: none);
    ``choices``: the valid names (command-line choices; with ``check`` unset, also checked);
    ``low``, ``high``: an integer of at least, at most, this; ``table``: arguments as a table (``KEY=VALUE`` on the
    command line, ``words`` keeping text values); ``many``: a list of names (one option, several
    values); ``named``: a name or an object, the summary
    records the name only; ``recorded``: part of what the run is (``summary.json``'s
    arguments, a sweep axis) rather than of how it runs; ``listed_after``: its place among the
    recorded settings when not its field order (where files have always had it); ``check``:
    the domain check, given every setting; ``importable``: besides the choices, an import
    path ``package.module:attribute`` names a value of the user's.
    """
    meta = {"help": help, "option": option, "choices": choices, "low": low, "high": high, "table": table,
            "words": words, "many": many,
            "named": named, "recorded": recorded, "listed_after": listed_after, "check": check,
            "importable": importable}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class RunConfig:
    """Every setting of one simulation (see :func:`lossscale.simulate`), each with its
    default and help; the bounds are checked on construction, the rest by :func:`check_arguments`
    (without running) or by the run itself."""

    workload: str | Workload = setting(
        "mlp", "the model and data: a name or package.module:factory, a function or class of yours "
        "(workload_args and seed configure it: factory(seed=seed, **workload_args) returns the workload), "
        "or an object following lossscale.training.workloads.Workload (it brings its own seed)",
        choices=lambda: list(WORKLOADS), check=_check_workload, importable=True)
    profile: str = setting("atlas-a2", "the Atlas product", choices=profiles.names,
                           check=lambda get: profiles.get(get("profile")))
    overflow_mode: str | None = setting(
        None, "the device's float16 overflow mode (default: the profile's)", choices=lambda: ["saturation", "inf_nan"],
        check=lambda get: get("overflow_mode") is None or OverflowMode.parse(get("overflow_mode")))
    manager: Any = setting(
        "exponential", "the loss-scale manager: a name, a Policy value, a class or factory making a manager, or "
        "a manager object (get_loss_scale, update_loss_scale; other ranks train deep copies of it)",
        choices=lambda: list(MANAGERS), named=True, check=_check_manager)
    manager_args: dict[str, Any] | None = setting(
        None, "a named manager's arguments over manager_defaults (2**16 and true/false are fine on the command "
        "line; with MANAGER: an argument goes to that manager only)", option="--manager-arg", table=True)
    detector: str | Detector | None = setting(
        None, "whose overflow check decides (status is tf-npu; default: tf-npu in saturation mode, isfinite in "
        "INF/NaN mode)", choices=lambda: [*DETECTORS, *ALIASES], named=True,
        check=lambda get: get("detector") is None or make_detector(ALIASES.get(get("detector"), get("detector")),
                                                                  OverflowMode.INF_NAN))
    ranks: int = setting(1, "data-parallel ranks (devices)", low=1, high=MAX_RANKS)
    steps: int = setting(300, "training steps", low=1, high=MAX_STEPS)
    seed: int = setting(0, "the workload's seed", low=0)
    underflow_every: int = setting(10, "measure the gradients' underflow every N steps", low=1)
    workload_args: dict[str, Any] | None = setting(
        None, "a named workload's arguments, such as log_perplexity=true or dtype=bfloat16 (text is kept as "
        "text; the workload checks its own arguments)", option="--workload-arg", table=True, words=True)
    progress: Callable[[int, int], None] | None = setting(
        None, "called with (steps done, steps) after every step", option=None, recorded=False)
    record_events: bool = setting(
        True, "keep the devices' event log (Run.events, events.csv, events.png; the summary's first_overflow and "
        "top_labels)", option="--events", recorded=False)
    allow_unsupported: bool = setting(
        False, "run what the product lacks: the tf-npu detector where there is no NPULossScaleOptimizer, FP8 "
        "matmuls where there are no FP8 units (with a warning in the summary; otherwise that is refused)",
        recorded=False)
    manager_defaults: str = setting(
        "demo", "the named manager's unset arguments: demo (the NPULossScaleOptimizer page's 2**32 and growth "
        "after 50 steps, so that a short run shows backoff and growth) or framework (each framework's own "
        "defaults)", option="--defaults",
        choices=lambda: list(DEFAULTS), listed_after="manager_args")
    fp8: str | Recipe | None = setting(
        None, "run the workload's matmuls in FP8 under this scaling recipe (delayed, current: Transformer "
        "Engine's; mx: OCP MX blocks, or a lossscale.training.fp8.Recipe); Run.fp8 and fp8.csv hold every "
        "tensor's scale",
        choices=lambda: list(RECIPES), named=True, check=_check_fp8)
    fp8_args: dict[str, Any] | None = setting(
        None, "the recipe's arguments, such as fp8_format=HIF8, margin=1, amax_history_len=16, rule=rceil, "
        "gemms=fprop,dgrad, keep=lm_head", option="--fp8-arg", table=True, words=True)
    shadow: tuple[str | Recipe, ...] | None = setting(
        None, "alternatives computed on the same operands at every step, changing nothing (shadow.csv): a recipe "
        "NAME[:KEY=VALUE...] (nvfp4, mx:rule=floor), an element format (the run's recipe in it: hifloat8), or an "
        "overflow mode (the run's recipe under it: saturation)", many=True, check=_check_shadow)
    micro_batches: int = setting(
        1, "forward and backward passes per optimizer step on each rank (gradient accumulation: each rank's "
        "part of the batch split into this many micro-batches, their binary16 gradients summed; 1: none)", low=1,
        high=MAX_RANKS)

    clip_grad_norm: float | None = setting(
        None, "clip the unscaled gradients by their global norm (binary32, as torch.nn.utils.clip_grad_norm_) to "
        "at most this before the optimizer, in the step and in the binary32 reference update alike (default: off)",
        check=lambda get: _check_positive("clip_grad_norm", get("clip_grad_norm")))

    pipeline_stages: int = setting(
        1, "pipeline-parallel stages per rank, each its own device and float-status register, run in Megatron's "
        "1F1B order (needs micro_batches >= pipeline_stages; a workload's operations run on the stage its "
        "device's stage tag names, else stage 0; 1: none)", low=1, high=MAX_RANKS,
        check=lambda get: check_stages(get("pipeline_stages"), get("micro_batches")))

    def __post_init__(self) -> None:
        wrong = integer_problems(lambda name: getattr(self, name))
        if wrong:
            raise ValueError(wrong[0])
        for f in settings():  # numpy's integers as Python's: a run's files write them as numbers
            if f.metadata["low"] is not None:
                object.__setattr__(self, f.name, int(getattr(self, f.name)))
        _check_positive("clip_grad_norm", self.clip_grad_norm)
        check_stages(self.pipeline_stages, self.micro_batches)

    @classmethod
    def bind(cls, *args: Any, **kwargs: Any) -> RunConfig:
        """The config of a call ``simulate(*args, **kwargs)``: settings by position or keyword, or a
        RunConfig as the only positional argument (keywords replace its settings)."""
        if args and isinstance(args[0], RunConfig):
            if len(args) > 1:
                raise TypeError("simulate() takes a RunConfig alone or settings, not both by position")
            base = args[0]
            return cls(**{**{f.name: getattr(base, f.name) for f in fields(cls)}, **SIGNATURE.bind(**kwargs).arguments})
        return cls(**SIGNATURE.bind(*args, **kwargs).arguments)

    def arguments(self, **names: Any) -> dict[str, Any]:
        """The recorded settings, as ``summary.json`` gives them: tables as dicts, a setting given
        as an object as None, ``names`` (a workload's label, the managers' name) over these."""
        out = {}
        for f in recorded():
            value = getattr(self, f.name)
            if f.metadata["table"]:
                value = dict(value or {})
            elif f.metadata["many"] and value is not None:
                value = [v if isinstance(v, str) else type(v).__name__ for v in ([value] if isinstance(value, str)
                                                                                  else value)]
            elif f.metadata["named"] and not isinstance(value, str):
                value = None
            out[f.name] = names.get(f.name, value)
        return out


def settings() -> tuple[Field, ...]:
    """Every setting's field, in ``simulate()``'s order."""
    return fields(RunConfig)


def recorded() -> list[Field]:
    """The settings that say what a run is (``summary.json``'s arguments, the sweep axes), in
    the files' order."""
    out: list[Field] = []
    for f in settings():
        if f.metadata["recorded"]:
            after = f.metadata["listed_after"]
            out.insert(next(i for i, g in enumerate(out) if g.name == after) + 1 if after else len(out), f)
    return out


def _parameters() -> Iterator[inspect.Parameter]:
    for f in settings():
        yield inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=f.default,
                                annotation=f.type)


#: ``simulate()``'s signature: the settings by position or keyword, in field order.
SIGNATURE = inspect.Signature(list(_parameters()), return_annotation="Run")


def integer_problems(get: Callable[[str], Any]) -> list[str]:
    """The integer settings (``get(name)``) that are not integers within their bounds."""
    problems = [integer_problem(f.name, get(f.name), f.metadata["low"], f.metadata["high"]) for f in settings()
                if f.metadata["low"] is not None]
    return [p for p in problems if p is not None]


def check_arguments(args: dict[str, Any]) -> list[str]:
    """What is wrong with ``simulate(**args)``'s names, types and manager or workload arguments,
    found without running it (one sentence per problem; empty if none). Combinations that only
    a run can refuse (a mode the profile lacks) are not checked."""
    known = {f.name: f for f in settings()}
    problems = [f"unknown argument {k!r}; valid: {', '.join(known)}" for k in args if k not in known]
    get = lambda k: args.get(k, known[k].default if k in known else None)  # noqa: E731
    problems += integer_problems(get)
    problems += [f"{f.name} must be a table of arguments, got {get(f.name)!r}" for f in settings()
                 if f.metadata["table"] and get(f.name) is not None and not isinstance(get(f.name), dict)]
    for f in settings():
        check, choices = f.metadata["check"], f.metadata["choices"]
        if check is None and choices is not None and get(f.name) not in choices():
            problems.append(f"unknown {f.name} {get(f.name)!r}; valid: {', '.join(choices())}")
            continue
        try:
            if check is not None:
                check(get)
        except (ValueError, TypeError) as err:
            problems.append(str(err))
    return problems
