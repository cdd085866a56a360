"""Mixed-precision training on simulated Atlas devices, one loss-scale policy at a time.

Each step, on every rank, in phases that the devices see (``phases.begin_phase``):
``forward``, ``loss``, ``log``, ``scale`` and ``backward`` inside the workload's
``forward_backward`` (the built-in workloads mark them; an unmarked workload's whole call
is one phase, ``forward_backward``), then ``allreduce`` (the binary16 gradients summed
across ranks on the devices), ``unscale`` (the detector, a framework's overflow check,
decides: see ``lossscale.training.detectors``) and ``apply`` (the gradients times 1/S in binary32,
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
import concurrent.futures
import contextlib
import copy
import math
import numbers
import signal
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim import Device, Group, profiles

from ..policy import frameworks as policies
from ..policy.core import MANAGERS, Policy, PolicyManager, describe, missing_scaler_methods
from .config import (
    SIGNATURE,
    RunConfig,
    check_fp8_profile,
    fp8_recipe,
    make_manager,
    settings,
)
from .detectors import DETECTORS, FEEDS_NOTHING, UNMARKED, Detector, make_detector
from .errors import SettingError, SettingTypeError, SettingValueError
from .fp8 import AmaxGroup, CurrentScaling, Fp8Matmuls, Recipe
from .harm import _NAN, HARMLESS_ERROR, _grad_max, _overflow_harm, _relative_error
from .optimizers import LossScaleOptimizer, clip_by_global_norm
from .phases import PHASES, PhaseEvents, begin_phase
from .pipeline import Pipeline
from .records import Row, Run, Summary, counts, versions
from .shadow import Alternative, alternatives
from .workloads import check_split, check_workload, make_workload

__all__ = ["Interrupted", "StepFailed"]  # simulate: lossscale.simulate


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


def _fp8_summary(recipe: Recipe | None, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The FP8 part of the summary: the recipe, its formats, and totals over the tensors."""
    if recipe is None:
        return None
    return {"recipe": type(recipe).__name__, "arguments": describe(recipe),
            "formats": {"forward": recipe.formats()[0].name, "backward": recipe.formats()[1].name},
            "tensors": len({r["tensor"] for r in rows}),
            "saturated_elements": sum(r["saturated"] for r in rows),
            "nonfinite_elements": sum(r["nonfinite"] for r in rows),
            "underflowed_elements": sum(r["underflowed"] for r in rows)}


def _shadow_summary(alts: list[Alternative], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per alternative: what the FP8 summary says of a recipe, over its shadow rows."""
    if not alts:
        return None
    return {a.name: {**_fp8_summary(a.recipe, [r for r in rows if r["shadow"] == a.name]),
                     "overflow_mode": a.overflow.name if a.overflow else None} for a in alts}


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


@dataclass
class _Training:
    """A run in progress: the settings and everything :func:`_set_up` made for them."""

    config: RunConfig
    wl: Any
    args: dict[str, Any]
    recipe: Recipe | None
    prof: Any
    managers: list[Any]
    manager_name: str
    devices: list[Device]
    counts: list[PhaseEvents]
    det: Detector
    caught: list[warnings.WarningMessage]
    fp8_rows: list[dict[str, Any]]
    alternatives: list[Alternative]
    shadow_rows: list[dict[str, Any]]
    marks: bool
    checks: list[bool]
    params: list[Any]
    opts: list[LossScaleOptimizer]
    base_params: Any
    base_opt: Any
    batches: Any
    pipe: Pipeline | None = None
    side_by_side: AmaxGroup | None = None  # current scaling reducing amax: the ranks' passes run in threads

    def checked(self) -> list[Device]:
        """The devices the detector observes and reads: the ranks', or every rank's stage devices."""
        return self.devices if self.pipe is None else self.pipe.devices


@dataclass
class _Step:
    """What one step left behind on every rank, for the probes and the step's classification."""

    scales: list[float]
    shards: list[Any]
    losses: list[float]
    local0: list[Any]
    grads: list[list[Any]]
    register: np.ndarray
    finite: list[bool]
    decisions: list[bool]
    update_error: float
    skipped_update_error: float


def _workload(config: RunConfig) -> Any:
    """The workload a run trains: made from its name, or the object given (checked)."""
    workload, workload_args, seed = config.workload, config.workload_args, config.seed
    if isinstance(workload, str):
        return make_workload(workload, seed, **(workload_args or {}))
    if workload_args:
        raise ValueError("workload_args go with a workload name; give a workload object its arguments "
                         "when you make it")
    check_workload(workload)
    return workload


def _set_up(config: RunConfig) -> _Training:
    """The workload, the devices (their detector and FP8 matmuls attached), one manager and
    optimizer per rank and the binary32 baseline; refuses bad settings before any step."""
    c = config
    wl = _workload(c)
    check_split(wl, wl.batches(1)[0], c.ranks, c.micro_batches)  # before a device per rank is made
    label = c.workload if isinstance(c.workload, str) else str(getattr(wl, "name", type(wl).__name__))
    recipe = fp8_recipe(c.fp8, c.fp8_args)
    prof = profiles.get(c.profile)
    managers, manager_name = _managers(c.manager, c.manager_args, c.ranks, c.manager_defaults)  # refuse bad ones first
    args = c.arguments(workload=label, manager=manager_name)
    ranks, overflow_mode, record_events = c.ranks, c.overflow_mode, c.record_events
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counts = [PhaseEvents() for _ in range(ranks)]
        devices = [Device(prof, overflow_mode, name=f"rank{r}", record_events=record_events, observers=[c])
                   for r, c in enumerate(counts)]
        det = _detector(c, prof, devices)
        alts = alternatives(c.shadow, recipe)
        for emulated in dict.fromkeys(check_fp8_profile(r, prof, c.allow_unsupported)
                                      for r in [recipe, *(a.recipe for a in alts)]):
            if emulated:
                warnings.warn(emulated, UserWarning, stacklevel=2)
        fp8_rows: list[dict[str, Any]] = []
        shadow_rows: list[dict[str, Any]] = []
        group = AmaxGroup(ranks) if ranks > 1 and recipe is not None else None
        if recipe is not None or alts:
            for r, dev in enumerate(devices):
                dev.substitute("matmul", Fp8Matmuls(recipe, rank=r, record=fp8_rows.append, group=group,
                                                    shadows=[a.attach(dev, r, shadow_rows.append) for a in alts]))
    pipe = None if c.pipeline_stages == 1 else Pipeline(
        devices, c.pipeline_stages, lambda r, s: Device(prof, overflow_mode, name=f"rank{r}.stage{s}"))
    det.attach(devices if pipe is None else pipe.devices)
    if ranks > 1:
        Group(devices)
    marks = bool(getattr(wl, "marks_phases", False))
    checks = [_checks(m) for m in managers]
    params = [wl.init_params() for _ in devices]
    opts = [LossScaleOptimizer(wl.optimizer(), m) for m in managers]
    base_params, base_opt = wl.init_params(), wl.optimizer()
    batches = wl.batches(c.steps)
    check_split(wl, batches[0], ranks, c.micro_batches)
    return _Training(c, wl, args, recipe, prof, managers, manager_name, devices, counts, det, caught, fp8_rows, alts,
                     shadow_rows, marks,
                     checks, params, opts, base_params, base_opt, batches, pipe,
                     group if isinstance(recipe, CurrentScaling) and recipe.reduce_amax else None)


def _detector(config: RunConfig, prof: Any, devices: list[Device]) -> Detector:
    """The run's detector; the tf-npu check on a product that does not support it is refused,
    or with ``allow_unsupported`` run with a warning."""
    det = make_detector(config.detector, devices[0].overflow)
    if det.name == "tf-npu" and not prof.supports_npu_loss_scale_optimizer:
        refusal = (f"{prof.name} ({prof.product_en}) does not support NPULossScaleOptimizer (the "
                   f"NPULossScaleOptimizer page's support table), whose check the tf-npu detector is")
        if not config.allow_unsupported:
            others = ", ".join(n for n in DETECTORS if n != "tf-npu")
            raise ValueError(f"{refusal}; choose another detector ({others}) or allow it explicitly "
                             f"(allow_unsupported=True, --allow-unsupported)")
        warnings.warn(f"{refusal}; run anyway (allow_unsupported)", UserWarning, stacklevel=4)
    return det


def _step(run: _Training, t: int) -> _Step:
    """Step ``t`` on every rank: forward and backward, the allreduce, the detector's check and
    the update (raises :class:`MinimumScaleError` where a manager cannot go lower)."""
    wl, devices, opts, params, ranks = run.wl, run.devices, run.opts, run.params, run.config.ranks
    scales = [_scale(opt.get_loss_scale(), m, run.manager_name, r, t)
              for r, (opt, m) in enumerate(zip(opts, run.managers, strict=True))]
    shards = wl.shards(run.batches[t], ranks)
    losses, grads = map(list, zip(*_side_by_side(run, [
        lambda dev=dev, p=p, s=s, part=part, share=share: _passes(run, dev, p, s, part, share, t)
        for dev, p, s, (part, share) in zip(devices, params, scales, shards, strict=True)]), strict=True))
    local0 = grads[0]
    for dev in devices:
        begin_phase(dev, "allreduce")
    if ranks > 1:
        with contextlib.ExitStack() as stack:
            for dev in devices:
                stack.enter_context(dev.label("allreduce"))
            summed = [devices[0].group.allreduce([g[i] for g in grads]) for i in range(len(local0))]
        grads = [[s[r] for s in summed] for r in range(ranks)]
    p = run.config.pipeline_stages
    if run.pipe is not None:
        run.pipe.replay(t, run.config.micro_batches)
        devices = devices + run.pipe.devices
    register = np.sum([dev.get_float_status() for dev in run.checked()], axis=0)
    for dev in devices:
        begin_phase(dev, "unscale")
    run.det.scales = [v for v in scales for _ in range(p)]
    finite = run.det.check(run.checked(), [g for g in grads for _ in range(p)]) if any(run.checks) \
        else [True] * ranks * p
    finite = [all(finite[r * p:(r + 1) * p]) for r in range(ranks)]  # a rank's stages: found_inf MAX-reduced
    decisions = [bool(f) or not c for f, c in zip(finite, run.checks, strict=True)]
    for dev in devices:
        begin_phase(dev, "apply")
    steps = [_clip(run, opt.compute_gradients(lambda _s, g=g: g, p)) for opt, g, p in zip(opts, grads, params,
                                                                                         strict=True)]
    before = [v.copy() for v in params[0]]
    reference, would_be = _reference(run, t, steps[0], decisions[0])
    for opt, gv, ok in zip(opts, steps, decisions, strict=True):
        opt.apply_decided(gv, ok)
    with np.errstate(all="ignore"):
        applied = [v - b for v, b in zip(params[0], before, strict=True)]
    update_error = _relative_error(applied, reference)
    skipped_error = _NAN if would_be is None else _relative_error(would_be, reference)
    return _Step(scales, shards, losses, local0, grads, register, finite, decisions, update_error, skipped_error)


def _side_by_side(run: _Training, passes: list[Any]) -> list[Any]:
    """Each rank's passes (``passes[r]()`` on device r), one rank after another, or, where current
    scaling reduces each tensor's amax over the ranks (each rank waits for the others' amax), in a
    thread per rank; a rank that fails breaks the others' wait."""
    def on(r: int) -> Any:
        try:
            with run.devices[r]:
                return passes[r]()
        except BaseException:
            if run.side_by_side is not None and run.side_by_side.barrier is not None:
                run.side_by_side.barrier.abort()
            raise
    if run.side_by_side is None:
        return [on(r) for r in range(len(passes))]
    with concurrent.futures.ThreadPoolExecutor(len(passes)) as pool:
        return list(pool.map(on, range(len(passes))))


def _passes(run: _Training, dev: Device, params: list[Any], scale: float, part: Any, share: float,
            t: int) -> tuple[float, list[Any]]:
    """One rank's forward and backward passes in step ``t``: the loss and the gradients. With
    ``micro_batches`` k > 1, k passes on the workload's split of the rank's part
    (``shards(part, k)``), each given its share of the global batch, so that its loss is its
    mean divided by k, as torch's accumulation recipe divides each micro-batch's loss by the
    number of accumulation steps (https://pytorch.org/docs/stable/notes/amp_examples.html,
    "Gradient accumulation"). Their gradients are summed in their own dtype on the device, in
    the backward phase, as autograd's ``AccumulateGrad`` adds a new gradient into ``.grad``
    (``torch/csrc/autograd/functions/accumulate_grad.h``, ``accumulateGrad``): a sum above
    binary16's range overflows there, and the register sees it."""
    k, first = run.config.micro_batches, "forward" if run.marks else UNMARKED
    if k == 1:
        begin_phase(dev, first, step=t)
        return run.wl.forward_backward(dev, params, scale, part, share)
    total, summed = 0.0, None
    for j, (piece, piece_share) in enumerate(run.wl.shards(part, k)):
        if run.pipe is not None:
            dev.set_tags(stage=None)  # a workload names its stage anew in each micro-batch
        begin_phase(dev, first, step=t, micro_batch=j)
        loss, grads = run.wl.forward_backward(dev, params, scale, piece, share * piece_share)
        total += loss
        if summed is not None:
            begin_phase(dev, "backward" if run.marks else UNMARKED)
            with dev.label("accumulate"):
                grads = [a if g is None else g if a is None else dev.add(a, g) for a, g in zip(summed, grads,
                                                                                               strict=True)]
        summed = grads
    return total, summed


def _clip(run: _Training, pairs: list[Any]) -> list[Any]:
    """The step's (gradient, variable) pairs, clipped by global norm if the run clips."""
    return pairs if run.config.clip_grad_norm is None else clip_by_global_norm(pairs, run.config.clip_grad_norm)


def _scale(scale: Any, manager: Any, name: str, rank: int, t: int) -> float:
    """The scale ``manager`` gave for step ``t``, as a float: a real number, above 0 and finite,
    or TypeError/ValueError naming the manager, the rank and the step (a NaN scale would skip
    every step and a negative one train on flipped gradients, both without a word). A
    framework's own policy may reach what the framework itself reaches: 0 where it has no
    floor (``Policy.floor`` 0: backoff underflows binary32), Inf where it does not cap growth
    (``Policy.capped`` False)."""
    where = f"manager {name} gave loss scale {scale!r} for step {t}" + (f" on rank {rank}" if rank else "")
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise SettingTypeError(f"{where}: get_loss_scale() must return a real number (finite and above 0), "
                        f"not a {type(scale).__name__}")
    value = float(scale)
    policy = getattr(manager, "policy", None)
    if isinstance(policy, Policy) and ((value == 0 and policy.floor_value() == 0)
                                       or (value == math.inf and not policy.capped)):
        return value
    if not (math.isfinite(value) and value > 0):
        raise SettingValueError(f"{where}: a loss scale must be finite and above 0")
    return value


def _reference(run: _Training, t: int, step0: list[Any], applies: bool) -> tuple[list[Any] | None, list[Any] | None]:
    """Rank 0's binary32 reference update, before its step is applied: the workload's
    ``grads32`` on the same weights and the step's whole batch (unscaled, clipped as the step is), through a
    preview of rank 0's optimizer (its state and the weights untouched); and, for a step
    about to be skipped, the update its own gradients would have made (None otherwise).
    Both None where the optimizer cannot preview."""
    opt, params = run.opts[0], run.params[0]
    _, grads32 = run.wl.grads32(params, run.batches[t])
    reference = opt.preview(_clip(run, list(zip(grads32, params, strict=True))))
    would_be = None if applies or reference is None else opt.preview(step0)
    return reference, would_be


def _underflow(run: _Training, t: int, step: _Step) -> float:
    """Every ``underflow_every`` steps, the fraction of rank 0's binary16 gradients that are zero
    though the binary32 ones from the same weights are not (NaN in other steps)."""
    if t % run.config.underflow_every != 0:
        return float("nan")
    _, ref = run.wl.grads32(run.params[0], *step.shards[0])
    nonzero = sum(int(np.count_nonzero(r)) for r in ref)
    lost = sum(int(np.count_nonzero((g == 0) & (r != 0))) for g, r in zip(step.local0, ref, strict=True))
    return lost / nonzero if nonzero else 0.0


def _baseline(run: _Training, t: int) -> float:
    """Step ``t`` of the binary32 baseline on the same batch; its loss."""
    base_loss, base_grads = run.wl.grads32(run.base_params, run.batches[t])
    run.base_opt.apply_gradients(list(zip(base_grads, run.base_params, strict=True)))
    return base_loss


def _classify(run: _Training, t: int, step: _Step, grad_max: float, underflow: float, base_loss: float) -> Row:
    """The step's row: which phases raised events, whether the decision was right, how ranks agreed."""
    decisions = step.decisions
    phases = [p for p in dict.fromkeys(p for c in run.counts for p in c.counts)]
    feeds = any(p not in FEEDS_NOTHING for p in phases)
    applied = decisions[0]
    return Row(
        step=t, loss_scale=step.scales[0], overflow=bool(phases),
        event_phases=" ".join(str(p) for p in phases), detector_finite=bool(step.finite[0]),
        applied=applied, undetected_overflow=feeds and applied,
        false_positive=not applied and not feeds, ranks_agree=len(set(decisions)) == 1,
        ranks_applied=" ".join(str(int(d)) for d in decisions),
        register=tuple(int(v) for v in step.register), loss=sum(step.losses), baseline_loss=base_loss,
        grad_max=grad_max, underflow_fraction=underflow,
        update_error=step.update_error, skipped_update_error=step.skipped_update_error,
        overflow_harm=_overflow_harm(step, bool(phases)),
    )


def _finish(run: _Training, rows: list[Row], stopped: str | None, interrupted: bool) -> Run:
    """The finished run: the rows, the event log and the summary (the settings, what the run ran
    on, the counts over the rows, the final losses)."""
    c, prof, managers = run.config, run.prof, run.managers
    errors: list[str] = []
    final, baseline = _evaluate(run.wl, run.params[0], "final", errors), _evaluate(run.wl, run.base_params,
                                                                                 "baseline_float32", errors)
    policy = getattr(managers[0], "policy", None)
    fractions = [r.underflow_fraction for r in rows if r.underflow_fraction == r.underflow_fraction]
    named = isinstance(c.manager, str)
    events = _event_log(run.devices) if c.record_events else []
    summary = Summary(
        arguments=run.args,
        manager={"name": run.manager_name, "class": type(managers[0]).__name__,
                 "arguments": describe(policy) if isinstance(policy, Policy) else {},
                 "defaults": c.manager_defaults if named else None,
                 "demo_arguments": sorted(set(MANAGERS[c.manager][1]) - set(c.manager_args or {}))
                 if named and c.manager_defaults == "demo" else []},
        profile={"name": prof.name, "product": prof.product_en, "overflow_mode": run.devices[0].overflow.name,
                 "warnings": [str(w.message) for w in run.caught]},
        detector=run.det.name,
        phases="marked" if run.marks else f"unmarked (the workload's whole step is one phase, {UNMARKED})",
        versions=versions(),
        steps_run=len(rows), stopped_early=stopped, interrupted=interrupted,
        final=final, baseline_float32=baseline,
        final_loss_scale=float(run.opts[0].get_loss_scale()),  # a user policy's np.float16 as a Python float
        **counts(rows),
        max_quiet_update_error=max((r.update_error for r in rows if r.applied and not r.overflow_harm
                                    and r.update_error == r.update_error), default=float("nan")),
        harmless_error=HARMLESS_ERROR,
        mean_underflow_fraction=float(np.mean(fractions)) if fractions else float("nan"),
        underflow_every=c.underflow_every,
        matmul_accumulation=np.dtype(prof.matmul_accumulate).name,
        events_recorded=len(events) if c.record_events else None,
        **(_event_summary(events) if c.record_events else {"first_overflow": None, "top_labels": {}}),
        fp8=_fp8_summary(run.recipe, run.fp8_rows),
        shadow=_shadow_summary(run.alternatives, run.shadow_rows),
        evaluation_notes=errors,
    )
    fp8_rows, shadow_rows = ((log if run.side_by_side is None else sorted(log, key=lambda r: (r["step"], r["rank"])))
                             for log in (run.fp8_rows, run.shadow_rows))
    return Run([r.to_dict() for r in rows], summary.to_dict(), run.args, events, fp8_rows, shadow_rows,
               params=run.params[0], baseline_params=run.base_params)


def _evaluate(wl: Any, params: Any, which: str, notes: list[str]) -> dict[str, float]:
    """The workload's evaluation of ``params``; where it raises, NaN figures and the error noted in
    ``notes`` (the finished steps are worth more than the figures), as are its warnings (a
    figure it could not give)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = wl.evaluate(params)
        except Exception as err:  # the user's evaluation code: any error
            notes.append(f"{which}: {type(err).__name__}: {err}")
            result = {"loss": float("nan"), "accuracy": float("nan")}
    notes.extend(f"{which}: {w.message}" for w in caught)
    return result


def simulate(*args: Any, **kwargs: Any) -> Run:
    """Train a workload on simulated devices under one loss-scale policy, beside a binary32 baseline.

    The settings (their defaults and meaning are :class:`RunConfig`'s fields, listed below) by
    keyword or position, or a :class:`RunConfig` (keywords replace its settings).

    Ctrl-C (SIGINT, when called from the main thread) stops the run after the step in
    progress: :class:`Interrupted` is raised with the finished steps' :class:`Run`
    (``summary["interrupted"]`` true). A second Ctrl-C interrupts at once. An error raised in a
    step (the workload's model, loss or data) stops the run too: :class:`StepFailed` is raised
    with the finished steps' :class:`Run` (``summary["stopped_early"]`` names the step and the
    error), the error itself its cause.
    """
    run = _set_up(RunConfig.bind(*args, **kwargs))
    rows: list[Row] = []
    stopped = None
    failed: tuple[int, Exception] | None = None
    with _stop_on_interrupt() as interrupt:
        for t in range(run.config.steps):
            if interrupt.requested:
                break
            try:
                step = _step(run, t)
                grad_max, underflow = _grad_max(step), _underflow(run, t, step)
                row = _classify(run, t, step, grad_max, underflow, _baseline(run, t))
            except policies.MinimumScaleError as err:
                stopped = f"step {t}: {err}"
                break
            except SettingError:  # the run's own settings, checked during the step: raised as they are
                raise
            except Exception as err:  # the workload's code raised: the finished steps are kept
                stopped, failed = f"step {t}: {type(err).__name__}: {err}", (t, err)
                break
            rows.append(row)
            if run.config.progress is not None:
                run.config.progress(t + 1, run.config.steps)
    result = _finish(run, rows, stopped, interrupt.requested)
    if interrupt.requested:
        raise Interrupted(result)
    if failed is not None:
        raise StepFailed(result, *failed) from failed[1]
    return result


simulate.__signature__ = SIGNATURE.replace(return_annotation="Run")  # type: ignore[attr-defined]
simulate.__doc__ = (simulate.__doc__ or "") + "".join(
    f"\n    ``{f.name}`` ({f.type}, default {f.default!r}): {f.metadata['help']}." for f in settings())


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a simulation between steps; ``run`` holds the steps it finished."""

    def __init__(self, run: Run) -> None:
        super().__init__(f"interrupted after {len(run.records)} steps")
        self.run = run


class StepFailed(Exception):
    """A step raised (the workload's model, loss or data): ``run`` holds the steps it finished,
    ``step`` the step, ``error`` the exception (also ``__cause__``, with its traceback)."""

    def __init__(self, run: Run, step: int, error: Exception) -> None:
        super().__init__(f"step {step} raised {type(error).__name__}: {error}")
        self.run, self.step, self.error = run, step, error


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

