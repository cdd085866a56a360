"""Mixed-precision training on simulated Atlas devices, one loss-scale policy at a time.

Each step, on every rank: clear the float-status register, run forward and
backward in binary16 on the device with the loss scaled by the manager's S,
all-reduce (sum) the binary16 gradients across ranks on the devices, then let
``NPULossScaleOptimizer`` unscale, decide (register or isfinite) and apply to
the binary32 master weights. Beside it, the same model is trained in plain
binary32 with the same batches (the baseline), and every ``underflow_every``
steps rank 0's binary16 gradients are compared with binary32 ones from the
same weights: the fraction that became zero though the binary32 value is not.
Same arguments and seed give the same bits.
"""

from __future__ import annotations

import collections
import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from sim import Device, Group, profiles

from . import policies
from .optimizers import DETECTORS, NPULossScaleOptimizer
from .policy import MANAGERS, Manager, Policy, PolicyManager, describe
from .workloads import Workload, check_workload, make_workload

__all__ = ["MANAGERS", "make_manager", "simulate", "Run", "COLUMNS", "SCHEMA"]

#: The trajectory's one schema: its columns, in file order, and their types (files.py
#: writes and reads by it). ``overflow``: an event reached any rank's register this step;
#: ``detector_finite``: the optimizer's detector saw a finite step, and so ``applied``
#: (always true with an unchecked FixedLossScaleManager); ``register``: the summed
#: register, as text.
SCHEMA: dict[str, type] = {
    "step": int, "loss_scale": float, "overflow": bool, "detector_finite": bool, "applied": bool,
    "undetected_overflow": bool, "register": str, "loss": float, "baseline_loss": float, "grad_max": float,
    "underflow_fraction": float,
}
COLUMNS = tuple(SCHEMA)


def _managers(manager: Any, args: dict[str, Any] | None, ranks: int) -> tuple[list[Any], str]:
    """One manager per rank and the name the summary gives them. ``manager`` is a name; a
    class or zero-argument factory (called once per rank); a :class:`Policy` value (each
    rank gets a :class:`PolicyManager` on it); or an object with ``get_loss_scale`` and
    ``update_loss_scale`` (rank 0 trains it; other ranks get deep copies of it)."""
    if isinstance(manager, str):
        made = [make_manager(manager, args) for _ in range(ranks)]
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
    return not isinstance(obj, type) and all(callable(getattr(obj, a, None))
                                             for a in ("get_loss_scale", "update_loss_scale"))


def make_manager(name: str, args: dict[str, Any] | None = None) -> Manager:
    """A manager by name, with the simulator's defaults overridden by ``args``."""
    if name not in MANAGERS:
        raise ValueError(f"unknown manager {name!r}; valid: {', '.join(MANAGERS)}")
    cls, defaults = MANAGERS[name]
    valid = [f.name for f in fields(cls.policy_type)]
    for key in args or {}:
        if key not in valid:
            raise ValueError(f"manager {name!r} takes no argument {key!r}; valid: {', '.join(valid)}")
    return cls(**{**defaults, **(args or {})})


@dataclass
class Run:
    """A finished simulation: one record per step, and the summary."""

    records: list[dict[str, Any]]
    summary: dict[str, Any]
    args: dict[str, Any] = field(default_factory=dict)

    def column(self, name: str) -> np.ndarray:
        return np.array([r[name] for r in self.records])


def _versions() -> dict[str, str]:
    import platform

    import ml_dtypes

    from . import __version__
    return {"python": platform.python_version(), "numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__,
            "lossscale": __version__}


def simulate(workload: str | Workload = "mlp", profile: str = "atlas-a2", overflow_mode: str | None = None,
             manager: Any = "exponential", manager_args: dict[str, Any] | None = None,
             detector: str | None = None, ranks: int = 1, steps: int = 300, seed: int = 0,
             underflow_every: int = 10, workload_args: dict[str, Any] | None = None,
             progress: Callable[[int, int], None] | None = None) -> Run:
    """Train ``workload`` for ``steps`` steps on ``ranks`` simulated devices of ``profile``.

    ``workload``: a name (``workload_args`` and ``seed`` configure it) or any object
    following :class:`lossscale.workloads.Workload` (it brings its own seed).
    ``manager``: a name (``manager_args`` override the simulator's defaults), a
    :class:`Policy` value, a class or factory making a manager, or a manager object (any
    object with ``get_loss_scale`` and ``update_loss_scale``, as ``check_policy`` takes;
    with several ranks each other rank trains a deep copy of it).
    """
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
            "manager_args": dict(manager_args or {}), "detector": detector, "ranks": ranks, "steps": steps,
            "seed": seed, "underflow_every": underflow_every, "workload_args": dict(workload_args or {})}
    for name, value, low in (("ranks", ranks, 1), ("steps", steps, 1), ("underflow_every", underflow_every, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer of at least {low}, got {value!r}")
    if detector is not None and detector not in DETECTORS:
        raise ValueError(f"unknown detector {detector!r}; valid: {', '.join(DETECTORS)}")
    prof = profiles.get(profile)
    managers, manager_name = _managers(manager, manager_args, ranks)  # refuse bad ones before any work
    args["manager"] = manager_name
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        devices = [Device(prof, overflow_mode, name=f"rank{r}") for r in range(ranks)]
    if ranks > 1:
        Group(devices)
    params = [wl.init_params() for _ in devices]
    opts = [NPULossScaleOptimizer(wl.optimizer(), m, is_distributed=ranks > 1, detector=detector, device=dev)
            for m, dev in zip(managers, devices, strict=True)]
    base_params, base_opt = wl.init_params(), wl.optimizer()
    batches = wl.batches(steps)
    records: list[dict[str, Any]] = []
    event_modules: collections.Counter[str] = collections.Counter()
    stopped = None
    for t in range(steps):
        scale = opts[0].get_loss_scale()
        shards = wl.shards(batches[t], ranks)
        for dev in devices:
            dev.clear_float_status()
        losses, grads = [], []
        for dev, p, (part, share) in zip(devices, params, shards, strict=True):
            with dev:
                loss, g = wl.forward_backward(dev, p, scale, part, share)
            for module, count in (getattr(wl, "events", None) or {}).items():
                event_modules[module] += count
            losses.append(loss)
            grads.append(g)
        local0 = grads[0]
        if ranks > 1:
            summed = [devices[0].group.allreduce([g[i] for g in grads]) for i in range(len(local0))]
            grads = [[s[r] for s in summed] for r in range(ranks)]
        register = np.sum([dev.get_float_status() for dev in devices], axis=0)
        try:
            applied = [opt.apply_gradients(opt.compute_gradients(lambda _s, g=g: g, p))
                       for opt, g, p in zip(opts, grads, params, strict=True)]
        except policies.MinimumScaleError as err:
            stopped = f"step {t}: {err}"
            break
        with np.errstate(all="ignore"):
            grad_max = max(float(np.max(np.abs(g.astype(np.float32)))) for g in grads[0]) / scale
        underflow = float("nan")
        if t % underflow_every == 0:
            _, ref = wl.grads32(params[0], *shards[0])
            nonzero = sum(int(np.count_nonzero(r)) for r in ref)
            lost = sum(int(np.count_nonzero((g == 0) & (r != 0))) for g, r in zip(local0, ref, strict=True))
            underflow = lost / nonzero if nonzero else 0.0
        base_loss, base_grads = wl.grads32(base_params, batches[t])
        base_opt.apply_gradients(list(zip(base_grads, base_params, strict=True)))
        overflow = bool(register.any())
        records.append({
            "step": t, "loss_scale": scale, "overflow": overflow, "detector_finite": bool(applied[0]),
            "applied": bool(applied[0]), "undetected_overflow": overflow and bool(applied[0]),
            "register": " ".join(str(int(v)) for v in register), "loss": sum(losses),
            "baseline_loss": base_loss, "grad_max": grad_max, "underflow_fraction": underflow,
        })
        if progress is not None:
            progress(t + 1, steps)
    final, baseline = wl.evaluate(params[0]), wl.evaluate(base_params)
    policy = getattr(managers[0], "policy", None)
    col = lambda k: [r[k] for r in records]  # noqa: E731
    fractions = [f for f in col("underflow_fraction") if f == f]
    summary = {
        "arguments": args,
        "manager": {"name": manager_name, "class": type(managers[0]).__name__,
                    "arguments": describe(policy) if isinstance(policy, Policy) else {}},
        "profile": {"name": prof.name, "product": prof.product_en, "overflow_mode": devices[0].overflow.name,
                    "warnings": [str(w.message) for w in caught]},
        "detector": opts[0].detector_for(devices[0]),
        "versions": _versions(),
        "steps_run": len(records), "stopped_early": stopped,
        "final": final, "baseline_float32": baseline,
        "final_loss_scale": opts[0].get_loss_scale(),
        "skipped_steps": sum(not a for a in col("applied")),
        "overflow_steps": sum(col("overflow")),
        "undetected_overflow_steps": sum(col("undetected_overflow")),
        "mean_underflow_fraction": float(np.mean(fractions)) if fractions else float("nan"),
        "underflow_every": underflow_every,
        "matmul_accumulation": np.dtype(prof.matmul_accumulate).name,
        # Workloads that label their device operations (the torch ones): per module ("" for
        # none), how many operations raised a register event, over all steps and ranks.
        "event_modules": dict(event_modules.most_common()),
    }
    return Run(records, summary, args)
