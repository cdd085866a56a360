"""Mixed-precision training on simulated Atlas devices, one loss-scale policy at a time.

Each step, on every rank, in phases that the devices see (``phases.begin_phase``):
``forward``, ``loss``, ``log``, ``scale`` and ``backward`` inside the workload's
``forward_backward`` (the built-in workloads mark them; an unmarked workload's whole call
is one phase, ``forward_backward``), then ``allreduce`` (the binary16 gradients summed
across ranks on the devices), ``unscale`` (the detector, a framework's overflow check,
decides: see ``lossscale.detectors``) and ``apply`` (the gradients times 1/S in binary32,
applied to the binary32 master weights if the step was finite; the manager updated).
Beside it, the same model is trained in plain binary32 with the same batches (the
baseline), and every ``underflow_every`` steps rank 0's binary16 gradients are compared
with binary32 ones from the same weights: the fraction that became zero though the
binary32 value is not. Same arguments and seed give the same bits.

Which steps went wrong, from the events each phase raised (a register event: an
operation raised OVERFLOW, INVALID or DIVBYZERO): an *undetected overflow* is a step
applied though an operation that feeds the update raised an event (every phase but
``log``); a *false positive* is a step skipped though none did (its events came only from
logging, or from an earlier step, still in the register). With ``record_events`` every
device keeps its event log, and the summary names the first overflow and the labels (the
module paths, for torch workloads) whose operations raised the most events.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import inspect
import json
import signal
import threading
import warnings
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import numpy as np

from sim import Device, Group, OverflowMode, profiles

from ..policy import frameworks as policies
from ..policy.core import MANAGERS, REQUIRED, Manager, Policy, PolicyManager, describe, missing_scaler_methods
from .detectors import ALIASES, DETECTORS, FEEDS_NOTHING, UNMARKED, Detector, make_detector
from .fp8 import Fp8Matmuls, Recipe, make_recipe
from .optimizers import LossScaleOptimizer
from .phases import PHASES, PhaseEvents, begin_phase
from .workloads import WORKLOADS, Workload, check_workload, make_workload

__all__ = ["MANAGERS", "make_manager", "simulate", "Run", "COLUMNS", "SCHEMA", "EVENT_COLUMNS", "Interrupted"]

#: The trajectory's one schema: its columns, in file order, and their types (files.py
#: writes and reads by it). ``overflow``: some device operation of the step raised a register
#: event, on any rank; ``event_phases``: the phases those operations ran in;
#: ``detector_finite``: the detector saw a finite step (rank 0); ``applied``: rank 0 applied
#: it (every step, with a manager that checks nothing); ``undetected_overflow`` and
#: ``false_positive`` as the module says; ``ranks_agree``: every rank decided alike;
#: ``ranks_applied``: each rank's decision (1 applied, 0 skipped), as text;
#: ``register``: the registers summed over ranks as the check found them, as text.
SCHEMA: dict[str, type] = {
    "step": int, "loss_scale": float, "overflow": bool, "event_phases": str, "detector_finite": bool,
    "applied": bool, "undetected_overflow": bool, "false_positive": bool, "ranks_agree": bool,
    "ranks_applied": str, "register": str,
    "loss": float, "baseline_loss": float, "grad_max": float, "underflow_fraction": float,
}
#: The event log's columns (``events.csv``): the rank, then :class:`sim.Event`'s fields.
EVENT_COLUMNS = ("rank", "step", "phase", "label", "op", "flags", "elements")
COLUMNS = tuple(SCHEMA)


def _managers(manager: Any, args: dict[str, Any] | None, ranks: int, defaults: str = "demo") -> tuple[list[Any], str]:
    """One manager per rank and the name the summary gives them. ``manager`` is a name; a
    class or zero-argument factory (called once per rank); a :class:`Policy` value (each
    rank gets a :class:`PolicyManager` on it); or an object with ``get_loss_scale`` and
    ``update_loss_scale`` (rank 0 trains it; other ranks get deep copies of it)."""
    if isinstance(manager, str):
        made = [make_manager(manager, args, defaults) for _ in range(ranks)]
        return made, manager
    if args:
        raise ValueError("manager_args go with a manager name; give a manager object its arguments "
                         "when you make it")
    if isinstance(manager, Policy):
        made = [PolicyManager(manager) for _ in range(ranks)]
    elif _is_scaler(manager):
        made = [manager] + [copy.deepcopy(manager) for _ in range(ranks - 1)]
    elif callable(manager):
        try:
            made = [manager() for _ in range(ranks)]
        except TypeError as err:
            raise TypeError(f"could not make a manager by calling {getattr(manager, '__name__', manager)}(): "
                            f"{err}; give a manager object made with its arguments instead") from None
    else:
        made = [manager]
    for m in made:
        if not _is_scaler(m):
            raise TypeError(f"manager must be a name ({', '.join(MANAGERS)}), a Policy, or an object with "
                            f"get_loss_scale() and update_loss_scale(finite) (or a class or factory making "
                            f"one); got {type(m).__name__}")
    return made, type(made[0]).__name__


def _is_scaler(obj: Any) -> bool:
    return not isinstance(obj, type) and not missing_scaler_methods(obj)


#: Where a named manager's unset arguments come from: ``demo`` (the simulator's demo set, in
#: ``MANAGERS``: the seed's 2**32 and growth after 50 steps, so that a short run shows both
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


#: simulate()'s integer arguments and their lower bounds.
_INTEGERS = (("ranks", 1), ("steps", 1), ("seed", 0), ("underflow_every", 1))


def _integer_problems(get: Callable[[str], Any]) -> list[str]:
    """The integer arguments (``get(name)``) that are not integers at least their bound."""
    return [f"{name} must be an integer of at least {low}, got {get(name)!r}" for name, low in _INTEGERS
            if isinstance(get(name), bool) or not isinstance(get(name), int) or get(name) < low]


def check_arguments(args: dict[str, Any]) -> list[str]:
    """What is wrong with ``simulate(**args)``'s names, types and manager or workload arguments,
    found without running it (one sentence per problem; empty if none). Combinations that only
    a run can refuse (a mode the profile lacks) are not checked."""
    params = inspect.signature(simulate).parameters
    problems = [f"unknown argument {k!r}; valid: {', '.join(params)}" for k in args if k not in params]
    get = lambda k: args.get(k, params[k].default if k in params else None)  # noqa: E731
    problems += _integer_problems(get)
    for name in ("manager_args", "workload_args", "fp8_args"):
        if get(name) is not None and not isinstance(get(name), dict):
            problems.append(f"{name} must be a table of arguments, got {get(name)!r}")
    defaults = get("manager_defaults")
    if defaults not in DEFAULTS:
        problems.append(f"unknown manager_defaults {defaults!r}; valid: {', '.join(DEFAULTS)}")
    checks = [
        lambda: profiles.get(get("profile")),
        lambda: get("overflow_mode") is None or OverflowMode.parse(get("overflow_mode")),
        lambda: get("detector") is None or make_detector(ALIASES.get(get("detector"), get("detector")),
                                                         OverflowMode.INF_NAN),
        lambda: _fp8_recipe(get("fp8"), get("fp8_args")),
    ]
    if not isinstance(get("manager"), str):
        problems.append(f"manager must be a name; valid: {', '.join(MANAGERS)}")
    elif isinstance(get("manager_args"), (dict, type(None))):
        checks.append(lambda: make_manager(get("manager"), get("manager_args"),
                                           defaults if defaults in DEFAULTS else "demo"))
    for check in checks:
        try:
            check()
        except (ValueError, TypeError) as err:
            problems.append(str(err))
    workload, wargs = get("workload"), get("workload_args")
    if not isinstance(workload, str) or workload not in WORKLOADS:
        problems.append(f"unknown workload {workload!r}; valid: {', '.join(WORKLOADS)}")
    elif isinstance(wargs, (dict, type(None))) and isinstance(get("seed"), int) and get("seed") >= 0:
        try:
            _workload_check(workload, json.dumps(wargs or {}, sort_keys=True), get("seed"))
        except (ValueError, TypeError) as err:
            problems.append(str(err))
    return problems


@functools.lru_cache(maxsize=64)
def _workload_check(name: str, wargs: str, seed: int) -> None:
    make_workload(name, seed, **json.loads(wargs))


@dataclass
class Run:
    """A finished simulation: one record per step, the summary, (with ``record_events``) the
    devices' event logs, one dict per event with :data:`EVENT_COLUMNS`, and (with ``fp8``)
    the per-tensor FP8 log."""

    records: list[dict[str, Any]]
    summary: dict[str, Any]
    args: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    #: With an FP8 recipe: one row per tensor per step (:data:`lossscale.fp8.FP8_COLUMNS`).
    fp8: list[dict[str, Any]] = field(default_factory=list)

    def column(self, name: str) -> np.ndarray:
        return np.array([r[name] for r in self.records])


def _fp8_recipe(fp8: Any, args: Any) -> Recipe | None:
    """The recipe ``simulate(fp8=..., fp8_args=...)`` runs (None: no FP8 matmuls); ValueError where
    the recipe or its arguments are wrong."""
    if fp8 is None:
        if args:
            raise ValueError("fp8_args go with an fp8 recipe (fp8='delayed', 'current' or 'mx')")
        return None
    return make_recipe(fp8, **(args if isinstance(args, dict) else {}))


def _fp8_summary(recipe: Recipe | None, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The FP8 part of the summary: the recipe, its formats, and totals over the tensors."""
    if recipe is None:
        return None
    return {"recipe": type(recipe).__name__, "arguments": describe(recipe),
            "formats": {"forward": recipe.formats()[0].name, "backward": recipe.formats()[1].name},
            "tensors": len({r["tensor"] for r in rows}),
            "saturated_elements": sum(r["saturated"] for r in rows),
            "nonfinite_elements": sum(r["nonfinite"] for r in rows)}


def _versions() -> dict[str, str]:
    import platform

    import ml_dtypes

    from ..version import __version__
    return {"python": platform.python_version(), "numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__,
            "lossscale": __version__}


def _checks(manager: Any) -> bool:
    policy = getattr(manager, "policy", None)
    return not isinstance(policy, Policy) or policy.checks_overflow()


def _event_log(devices: list[Device]) -> list[dict[str, Any]]:
    """Every rank's events, in step order, then phase order, then rank (ranks run side by
    side: within a phase no rank's events come before another's)."""
    order = {p: i for i, p in enumerate(PHASES)}
    rows = [{"rank": r, "step": e.tags.get("step"), "phase": e.tags.get("phase"), "label": e.label, "op": e.op,
             "flags": "|".join(sorted((e.flags.name or "").split("|"))), "elements": e.elements}
            for r, dev in enumerate(devices) for e in dev.events]
    rows.sort(key=lambda e: (e["step"] if e["step"] is not None else -1, order.get(e["phase"], len(order)),
                             e["rank"]))
    return rows


def _event_summary(events: list[dict[str, Any]], top: int = 10) -> dict[str, Any]:
    labels = collections.Counter(e["label"] or "(unlabelled)" for e in events)
    first = events[0] if events else None
    return {
        "first_overflow": None if first is None else
        {k: first[k] for k in ("step", "op", "label", "phase", "rank", "flags")},
        "top_labels": dict(labels.most_common(top)),
    }


def simulate(workload: str | Workload = "mlp", profile: str = "atlas-a2", overflow_mode: str | None = None,
             manager: Any = "exponential", manager_args: dict[str, Any] | None = None,
             detector: str | Detector | None = None, ranks: int = 1, steps: int = 300, seed: int = 0,
             underflow_every: int = 10, workload_args: dict[str, Any] | None = None,
             progress: Callable[[int, int], None] | None = None, record_events: bool = True,
             allow_unsupported: bool = False, manager_defaults: str = "demo", fp8: str | Recipe | None = None,
             fp8_args: dict[str, Any] | None = None) -> Run:
    """Train ``workload`` for ``steps`` steps on ``ranks`` simulated devices of ``profile``.

    ``workload``: a name (``workload_args`` and ``seed`` configure it) or any object
    following :class:`lossscale.workloads.Workload` (it brings its own seed).
    ``manager``: a name (``manager_args`` over ``manager_defaults``: ``demo``, the
    simulator's demo set, or ``framework``, the framework's own; see :data:`DEFAULTS`), a
    :class:`Policy` value, a class or factory making a manager, or a manager object (any
    object with ``get_loss_scale`` and ``update_loss_scale``, as ``check_policy`` takes;
    with several ranks each other rank trains a deep copy of it).
    ``detector``: whose overflow check decides (a name of ``lossscale.detectors.DETECTORS``
    or a Detector; None: ``tf-npu`` in saturation mode, ``isfinite`` in INF/NaN mode).
    ``record_events``: keep every device's event log (``Run.events``; the summary's
    ``first_overflow`` and ``top_labels`` come from it).
    ``allow_unsupported``: run the ``tf-npu`` detector (``NPULossScaleOptimizer``'s check) on
    a product the seed marks as not supporting it, with a warning in the summary; without
    it, that is a ValueError.
    ``fp8``: run the workload's matmuls in FP8 under a scaling recipe (``"delayed"``,
    ``"current"``, ``"mx"`` with ``fp8_args``, or a :class:`lossscale.fp8.Recipe`): each
    operand scaled per tensor and cast on the device, the product as the cube unit computes
    it (see :class:`lossscale.fp8.Fp8Matmuls`); ``Run.fp8`` holds every tensor's scale,
    amax and overflowed elements per step (:data:`lossscale.fp8.FP8_COLUMNS`).

    Ctrl-C (SIGINT, when called from the main thread) stops the run after the step in
    progress: :class:`Interrupted` is raised with the finished steps' :class:`Run`
    (``summary["interrupted"]`` true). A second Ctrl-C interrupts at once.
    """
    wrong = _integer_problems({"ranks": ranks, "steps": steps, "seed": seed, "underflow_every": underflow_every}.get)
    if wrong:
        raise ValueError(wrong[0])
    if isinstance(workload, str):
        wl = make_workload(workload, seed, **(workload_args or {}))
    elif workload_args:
        raise ValueError("workload_args go with a workload name; give a workload object its arguments "
                         "when you make it")
    else:
        check_workload(workload)
        wl = workload
    label = workload if isinstance(workload, str) else str(getattr(wl, "name", type(wl).__name__))
    args = {"workload": label, "profile": profile, "overflow_mode": overflow_mode,
            "manager": manager if isinstance(manager, str) else None,
            "manager_args": dict(manager_args or {}), "manager_defaults": manager_defaults,
            "detector": detector if isinstance(detector, str) else None,
            "ranks": ranks, "steps": steps, "seed": seed, "underflow_every": underflow_every,
            "workload_args": dict(workload_args or {}), "fp8": fp8 if isinstance(fp8, str) else None,
            "fp8_args": dict(fp8_args or {})}
    recipe = _fp8_recipe(fp8, fp8_args)
    prof = profiles.get(profile)
    managers, manager_name = _managers(manager, manager_args, ranks, manager_defaults)  # refuse bad ones first
    args["manager"] = manager_name
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counts = [PhaseEvents() for _ in range(ranks)]
        devices = [Device(prof, overflow_mode, name=f"rank{r}", record_events=record_events, observers=[c])
                   for r, c in enumerate(counts)]
        det = make_detector(detector, devices[0].overflow)
        if det.name == "tf-npu" and not prof.supports_npu_loss_scale_optimizer:
            refusal = (f"{prof.name} ({prof.product_en}) does not support NPULossScaleOptimizer (the seed's "
                       f"support table), whose check the tf-npu detector is")
            if not allow_unsupported:
                others = ", ".join(n for n in DETECTORS if n != "tf-npu")
                raise ValueError(f"{refusal}; choose another detector ({others}) or allow it explicitly "
                                 f"(allow_unsupported=True, --allow-unsupported)")
            warnings.warn(f"{refusal}; run anyway (allow_unsupported)", UserWarning, stacklevel=2)
    det.attach(devices)
    fp8_rows: list[dict[str, Any]] = []
    if recipe is not None:
        for r, dev in enumerate(devices):
            dev.substitute("matmul", Fp8Matmuls(recipe, rank=r, record=fp8_rows.append))
    if ranks > 1:
        Group(devices)
    marks = bool(getattr(wl, "marks_phases", False))
    checks = [_checks(m) for m in managers]
    params = [wl.init_params() for _ in devices]
    opts = [LossScaleOptimizer(wl.optimizer(), m) for m in managers]
    base_params, base_opt = wl.init_params(), wl.optimizer()
    batches = wl.batches(steps)
    _check_shards(wl.shards(batches[0], ranks), ranks)
    records: list[dict[str, Any]] = []
    stopped = None
    with _stop_on_interrupt() as interrupt:
        for t in range(steps):
            if interrupt.requested:
                break
            scales = [opt.get_loss_scale() for opt in opts]
            shards = wl.shards(batches[t], ranks)
            losses, grads = [], []
            for dev, p, s, (part, share) in zip(devices, params, scales, shards, strict=True):
                begin_phase(dev, "forward" if marks else UNMARKED, step=t)
                with dev:
                    loss, g = wl.forward_backward(dev, p, s, part, share)
                losses.append(loss)
                grads.append(g)
            local0 = grads[0]
            for dev in devices:
                begin_phase(dev, "allreduce")
            if ranks > 1:
                with contextlib.ExitStack() as stack:
                    for dev in devices:
                        stack.enter_context(dev.label("allreduce"))
                    summed = [devices[0].group.allreduce([g[i] for g in grads]) for i in range(len(local0))]
                grads = [[s[r] for s in summed] for r in range(ranks)]
            register = np.sum([dev.get_float_status() for dev in devices], axis=0)
            for dev in devices:
                begin_phase(dev, "unscale")
            finite = det.check(devices, grads) if any(checks) else [True] * ranks
            decisions = [bool(f) or not c for f, c in zip(finite, checks, strict=True)]
            for dev in devices:
                begin_phase(dev, "apply")
            try:
                for opt, g, p, ok in zip(opts, grads, params, decisions, strict=True):
                    opt.apply_decided(opt.compute_gradients(lambda _s, g=g: g, p), ok)
            except policies.MinimumScaleError as err:
                stopped = f"step {t}: {err}"
                break
            with np.errstate(all="ignore"):
                grad_max = max(float(np.max(np.abs(g.astype(np.float32)))) for g in grads[0]) / scales[0]
            underflow = float("nan")
            if t % underflow_every == 0:
                _, ref = wl.grads32(params[0], *shards[0])
                nonzero = sum(int(np.count_nonzero(r)) for r in ref)
                lost = sum(int(np.count_nonzero((g == 0) & (r != 0))) for g, r in zip(local0, ref, strict=True))
                underflow = lost / nonzero if nonzero else 0.0
            base_loss, base_grads = wl.grads32(base_params, batches[t])
            base_opt.apply_gradients(list(zip(base_grads, base_params, strict=True)))
            phases = [p for p in dict.fromkeys(p for c in counts for p in c.counts)]
            feeds = any(p not in FEEDS_NOTHING for p in phases)
            applied = decisions[0]
            records.append({
                "step": t, "loss_scale": scales[0], "overflow": bool(phases),
                "event_phases": " ".join(str(p) for p in phases), "detector_finite": bool(finite[0]),
                "applied": applied, "undetected_overflow": feeds and applied,
                "false_positive": not applied and not feeds, "ranks_agree": len(set(decisions)) == 1,
                "ranks_applied": " ".join(str(int(d)) for d in decisions),
                "register": " ".join(str(int(v)) for v in register), "loss": sum(losses), "baseline_loss": base_loss,
                "grad_max": grad_max, "underflow_fraction": underflow,
            })
            if progress is not None:
                progress(t + 1, steps)
    final, baseline = wl.evaluate(params[0]), wl.evaluate(base_params)
    policy = getattr(managers[0], "policy", None)
    col = lambda k: [r[k] for r in records]  # noqa: E731
    fractions = [f for f in col("underflow_fraction") if f == f]
    events = _event_log(devices) if record_events else []
    summary = {
        "arguments": args,
        "manager": {"name": manager_name, "class": type(managers[0]).__name__,
                    "arguments": describe(policy) if isinstance(policy, Policy) else {},
                    "defaults": manager_defaults if isinstance(manager, str) else None,
                    "demo_arguments": sorted(set(MANAGERS[manager][1]) - set(manager_args or {}))
                    if isinstance(manager, str) and manager_defaults == "demo" else []},
        "profile": {"name": prof.name, "product": prof.product_en, "overflow_mode": devices[0].overflow.name,
                    "warnings": [str(w.message) for w in caught]},
        "detector": det.name,
        "phases": "marked" if marks else f"unmarked (the workload's whole step is one phase, {UNMARKED})",
        "versions": _versions(),
        "steps_run": len(records), "stopped_early": stopped, "interrupted": interrupt.requested,
        "final": final, "baseline_float32": baseline,
        "final_loss_scale": opts[0].get_loss_scale(),
        "skipped_steps": sum(not a for a in col("applied")),
        "overflow_steps": sum(col("overflow")),
        "undetected_overflow_steps": sum(col("undetected_overflow")),
        "false_positive_steps": sum(col("false_positive")),
        "rank_disagreement_steps": sum(not a for a in col("ranks_agree")),
        "mean_underflow_fraction": float(np.mean(fractions)) if fractions else float("nan"),
        "underflow_every": underflow_every,
        "matmul_accumulation": np.dtype(prof.matmul_accumulate).name,
        "events_recorded": len(events) if record_events else None,
        **(_event_summary(events) if record_events else {"first_overflow": None, "top_labels": {}}),
        "fp8": _fp8_summary(recipe, fp8_rows),
    }
    run = Run(records, summary, args, events, fp8_rows)
    if interrupt.requested:
        raise Interrupted(run)
    return run


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a simulation between steps; ``run`` holds the steps it finished."""

    def __init__(self, run: Run) -> None:
        super().__init__(f"interrupted after {len(run.records)} steps")
        self.run = run


class _Interrupt:
    requested = False


@contextlib.contextmanager
def _stop_on_interrupt():
    """While the block runs, a first SIGINT asks it to stop (``requested``) and a second one
    interrupts as usual. Outside the main thread signals cannot be caught: nothing changes."""
    flag = _Interrupt()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def ask(signum, frame) -> None:
        flag.requested = True
        signal.signal(signal.SIGINT, previous)

    previous = signal.signal(signal.SIGINT, ask)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def _check_shards(shards, ranks: int) -> None:
    """Every rank needs a share of the batch: ValueError before any step otherwise."""
    sized = all(hasattr(part, "__len__") for part, _ in shards)
    empty = sum(1 for part, share in shards if not share > 0 or (sized and not len(part)))
    if len(shards) != ranks or empty:
        batch = f"{sum(len(p) for p, _ in shards)} examples" if sized else "too few examples"
        raise ValueError(f"ranks={ranks} leaves {empty} rank(s) without data: the batch has {batch}; use fewer "
                         f"ranks or a larger batch")
