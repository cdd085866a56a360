"""``GradScaler``: torch's AMP loss scaler (``torch.amp.GradScaler``'s interface) on a simulated
device, deciding overflow as a named detector does and updating by any loss-scale policy; it
records its trajectory (per step: the scale, the events, the decision) as a :class:`Run`.

Imported as ``lossscale.torch.GradScaler`` (optional extra ``torch``); ``import lossscale``
does not import torch. Outside facts, each from its source:

- ``torch/amp/grad_scaler.py`` (torch 2.x): ``scale(outputs)`` returns ``outputs * scale``
  (the scale a binary32 0-dim tensor); ``unscale_`` computes the inverse scale as
  ``scale.double().reciprocal().float()`` and refuses float16 gradients ("Attempting to
  unscale FP16 gradients."); ``step`` skips ``optimizer.step()`` if any found_inf is set;
  ``update(new_scale)`` sets the scale, else applies the growth/backoff rule
  (:class:`~lossscale.policy.frameworks.TorchPolicy`); a disabled scaler passes everything
  through and ``get_scale()`` reads 1.0.
- ``aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp``
  (``_amp_foreach_non_finite_check_and_unscale_``): each gradient element, widened to binary32,
  sets found_inf if it is not finite, and is multiplied by the binary32 inverse scale (left as
  it is where that is 1) and rounded back to its dtype.
- ``torch_npu/npu/amp/grad_scaler.py`` (Ascend/pytorch): in saturation mode ``scale()`` clears
  the float-status register once per step (``_clear_overflow_flag``, reset by ``update()``),
  and the unscale kernel reads it; an overflow it reports leaves the gradients scaled
  (``docs/semantics.md``, "torch-npu"). Which detector clears where:
  :mod:`lossscale.training.detectors`.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from sim import Device, Event
from sim.checks import integer
from sim.torch import NUMPY_DTYPES as _NUMPY
from sim.torch import DeviceMode
from sim.torch import as_array as _array
from sim.torch import as_tensor as _tensor

from ..policy.core import Manager, Policy, PolicyManager, check_scale, describe
from ..policy.frameworks import TorchGradScaler, TorchPolicy
from .config import make_manager
from .detectors import UNMARKED, Detector, TorchNpu, make_detector
from .records import Row, Run, Summary, counts, versions

#: The keys of ``torch.amp.GradScaler.state_dict()`` (torch/amp/grad_scaler.py).
TORCH_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")

__all__ = ["GradScaler"]

_TORCH_ARGS = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}
_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


def _times(device: Device, a: np.ndarray, factor: np.float32, dtype: np.dtype) -> np.ndarray:
    """``a * factor`` as torch's CPU kernels compute a tensor times a binary32 scalar: in binary32
    (``a`` widened exactly), rounded once more into ``dtype``, each on the device."""
    wide = a if a.dtype == np.float32 else device.cast(a, np.float32)
    out = device.mul(wide, np.full(wide.shape, factor, np.float32))
    return out if dtype == np.float32 else device.cast(out, dtype)


def _result_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of ``x * scale`` (scale a binary32 0-dim tensor), by torch's promotion: a
    dimensioned floating tensor keeps its dtype, a 0-dim one promotes with binary32."""
    if x.dim() > 0 and x.dtype.is_floating_point:
        return x.dtype
    return torch.promote_types(x.dtype, torch.float32)


class _DeviceScale(torch.autograd.Function):
    """``x * scale`` computed on the device, and its backward (the gradient times the scale,
    rounded into ``x``'s dtype) too; the backward's device operations are counted as the
    scaler's own (:meth:`GradScaler._off_device`)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scaler: GradScaler, scale: np.float32) -> torch.Tensor:  # type: ignore[override]
        ctx.scaler, ctx.scale, ctx.dtype = scaler, scale, x.dtype
        if x.dtype not in _NUMPY:
            x = x.float()
        return _tensor(_times(scaler.device, _array(x), scale, _NUMPY[_result_dtype(x)]))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        if grad.dtype not in _NUMPY or ctx.dtype not in _NUMPY:
            return None, None, None
        device, before = ctx.scaler.device, ctx.scaler.device.operations
        out = _tensor(_times(device, _array(grad), ctx.scale, _NUMPY[ctx.dtype]))
        ctx.scaler._own_operations += device.operations - before
        return out, None, None


def _routing_mode(device: Device) -> DeviceMode | None:
    """The innermost active DeviceMode on ``device``, if any."""
    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, DeviceMode) and mode.device is device:
            return mode
    return None


def _manager(policy: Any, policy_args: Mapping[str, Any] | None, torch_args: dict[str, Any]) -> Manager:
    """The manager the scaler updates: torch's rule from torch's arguments, a registered manager by
    name (its framework's defaults under ``policy_args``), a Policy value, or a Manager as given."""
    changed = [k for k, v in torch_args.items() if v != _TORCH_ARGS[k]]
    if policy is None:
        if policy_args:
            raise ValueError("policy_args go with a policy named by string (policy='torch-npu', ...)")
        return TorchGradScaler(**torch_args)
    if changed:
        raise ValueError(f"{', '.join(changed)} set torch's own rule; with policy={policy!r} give the policy's "
                         f"arguments instead (policy_args=...)")
    if isinstance(policy, str):
        return make_manager(policy, dict(policy_args or {}), defaults="framework")
    if policy_args:
        raise ValueError("policy_args go with a policy named by string; a Policy value carries its arguments")
    if isinstance(policy, Policy):
        return PolicyManager(policy)
    if isinstance(policy, Manager):
        return policy
    raise ValueError(f"policy must be a registered name (see lossscale.policy.MANAGERS), a Policy or a Manager, "
                     f"got {policy!r}")


class GradScaler:
    """``torch.amp.GradScaler`` on a simulated ``device``: ``scale``, ``unscale_``, ``step``,
    ``update``, ``get_scale``, ``is_enabled``, ``state_dict``/``load_state_dict`` and the
    factor getters and setters, with torch's arguments and defaults.

    ``policy``: the update rule (None: torch's, from ``init_scale``... ``growth_interval``; a
    name of :data:`lossscale.policy.MANAGERS` with ``policy_args`` over its framework's
    defaults; a :class:`~lossscale.policy.Policy` value; a Manager). ``detector``: who sees the
    overflow (a name of :data:`~lossscale.training.detectors.DETECTORS` or a Detector; default
    ``torch-npu``: the register in saturation mode, the gradients' finiteness in INF/NaN mode,
    as torch_npu's scaler). :attr:`rows` holds a :class:`Row` per :meth:`update`; :meth:`run`
    gives them as a :class:`Run` for the run-folder writer.
    """

    def __init__(self, device: Device, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True, *,
                 policy: str | Policy | Manager | None = None, policy_args: Mapping[str, Any] | None = None,
                 detector: str | Detector | None = "torch-npu") -> None:
        if not isinstance(device, Device):
            raise TypeError(f"GradScaler takes a sim.Device (the simulated NPU), got {device!r}; "
                            f"for torch's own scaler use torch.amp.GradScaler")
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled must be a bool, got {enabled!r}")
        self.device = device
        self.manager = _manager(policy, policy_args, {"init_scale": init_scale, "growth_factor": growth_factor,
                                                      "backoff_factor": backoff_factor,
                                                      "growth_interval": growth_interval})
        self.detector = make_detector(detector, device.overflow)
        if self.detector.clears_at not in (None, "scale"):
            raise ValueError(f"detector {self.detector.name!r} clears the register at {self.detector.clears_at!r}; "
                             f"a GradScaler sees only scale() and unscale_(), so it can clear at 'scale' or after a "
                             f"read")
        self._enabled = enabled and bool(getattr(self.manager.policy, "enabled", True))
        self.rows: list[Row] = []
        self._step_index = 0
        self._new_step()
        device.add_observer(self)

    # -- the device observer: events of the current step ------------------------------------------
    def on_event(self, device: Device, event: Event) -> None:
        """Count a register event of the current step (the device calls this)."""
        self._events += 1

    def _new_step(self) -> None:
        self._per_optimizer: dict[int, dict[str, Any]] = {}
        self._events, self._scaled, self._loss, self._register = 0, False, math.nan, None
        self._grad_max, self._overflow_seen = 0.0, False
        # device.operations after the last scale(), and how many since were the scaler's own
        self._mark: int | None = None
        self._own_operations = 0

    # -- torch's interface ---------------------------------------------------------------------
    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled), as torch's ``get_scale``."""
        return float(self.manager.state.scale) if self._enabled else 1.0

    def _checks(self) -> bool:
        policy = self.manager.policy
        return not isinstance(policy, Policy) or policy.checks_overflow()

    def _reads_register(self) -> bool:
        return self._checks() and self.detector.reads_register(self.device)

    def scale(self, outputs: Any) -> Any:
        """``outputs`` (a tensor, or nested lists/tuples of them) times the scale, on the device:
        under an active DeviceMode on this device that routes the operand's dtype and gives a
        binary32 result, by that mode (counted in ``mode.routes``); otherwise explicitly, in
        binary32 rounded once into the result's dtype, forward and backward. Where the detector
        clears the register at ``scale`` (torch-npu, mindspore) and reads it, the first call of a
        step clears it, as torch_npu's ``scale()`` does."""
        if not self._enabled:
            return outputs
        if self.detector.clears_at == "scale" and not self._scaled and self._reads_register():
            self.device.clear_float_status()
        self._scaled = True
        scale = np.float32(self.manager.state.scale)
        if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
            self._loss = float(_array(outputs.float() if outputs.dtype not in _NUMPY else outputs).reshape(()))
        scaled = self._apply(outputs, scale)
        self._mark, self._own_operations = self.device.operations, 0
        return scaled

    def _apply(self, x: Any, scale: np.float32) -> Any:
        if isinstance(x, torch.Tensor):
            mode = _routing_mode(self.device)
            if mode is not None and x.dtype in mode.dtypes and _result_dtype(x) == torch.float32:
                return x * torch.full((), float(scale), dtype=torch.float32)
            return _DeviceScale.apply(x, self, scale)
        if isinstance(x, (list, tuple)):
            return type(x)(self._apply(v, scale) for v in x)
        if isinstance(x, Iterable):
            return map(lambda v: self._apply(v, scale), x)
        raise TypeError(f"outputs must be a Tensor or an iterable of Tensors, got {type(x).__name__}")

    def _state(self, optimizer: Any) -> dict[str, Any]:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": _READY, "found_inf": False})

    def _step_wide(self) -> bool:
        """Whether an overflow found by one optimizer's unscale_ marks the whole step (torch_npu's
        ``_has_overflow``: its detector, in either mode, and any check that reads the register,
        which is the device's, one per step) rather than that optimizer alone (torch's
        ``found_inf_per_device``: a check of each optimizer's own gradients)."""
        return isinstance(self.detector, TorchNpu) or self._reads_register()

    def _require_scale(self, call: str) -> None:
        if not self._scaled:
            raise AssertionError(f"Attempted {call} but scale() was not called since the last update(). This may "
                                 f"indicate your script did not use scaler.scale(loss or outputs) earlier in the "
                                 f"iteration.")

    def _off_device(self) -> None:
        """Warn, at the step's first unscale_, when the decision rests on the register and no
        device operation but the scaler's own ran since the last scale(): the backward pass ran
        off the device (outside DeviceMode), so the register saw none of its overflows."""
        if self._mark is None:
            return
        mark, self._mark = self._mark, None
        if self._checks() and self._reads_register() and self.device.operations == mark + self._own_operations:
            warnings.warn(f"GradScaler step {self._step_index}: no device operation ran between scale() and "
                          f"unscale_(), so the backward pass ran off the simulated device (outside DeviceMode) and "
                          f"the float-status register the {self.detector.name!r} detector reads saw none of its "
                          f"overflows: run scaler.scale(loss).backward() inside `with DeviceMode(device):`",
                          RuntimeWarning, stacklevel=3)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Check the optimizer's gradients by the detector's rule, then multiply them by the
        binary32 inverse scale on the device (torch's kernel: in binary32, rounded back into each
        gradient's dtype); torch_npu's kernel (the ``torch-npu`` and ``megatron-npu`` detectors)
        leaves them scaled when its check reports an overflow.

        The check runs in every unscale_ (a detector that clears the register after a read clears
        it there). With several optimizers, by torch_npu's ``GradScaler`` (``_unscale_grads_``,
        ``_maybe_opt_step``): where the decision rests on the register, or the detector is
        torch-npu's in either mode, an overflow found by any unscale_ marks the step: every later
        :meth:`step` is skipped, also that of an optimizer unscaled before and found finite; one
        stepped before stays stepped. So when the register is set between the first and the second
        optimizer's unscale_, the first is skipped if its step() comes after the second's unscale_
        and applied if before, and the second is skipped. A check of the gradients' values
        (``isfinite``, the norms, and the register detectors but torch-npu's in INF/NaN mode)
        decides each optimizer by its own gradients, as ``torch.amp.GradScaler`` does.
        :meth:`update` backs off if any optimizer found one.

        When the decision rests on the register and nothing ran on the device since
        :meth:`scale` (a backward pass outside DeviceMode), a RuntimeWarning says so. Raises
        AssertionError, as torch's scaler does, if :meth:`scale` was not called this step."""
        if not self._enabled:
            return
        self._require_scale("unscale_")
        state = self._state(optimizer)
        if state["stage"] == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        grads = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.dtype == torch.float16:
                    raise ValueError("Attempting to unscale FP16 gradients (as torch.amp.GradScaler refuses them): "
                                     "keep float32 master parameters and cast them to float16 in the forward pass")
                if p.grad.is_sparse or p.grad.dtype not in _NUMPY:
                    raise ValueError(f"GradScaler unscales dense float32 or bfloat16 gradients, got a "
                                     f"{'sparse ' if p.grad.is_sparse else ''}{p.grad.dtype} gradient")
                grads.append(p.grad)
        arrays = [_array(g) for g in grads]
        self._off_device()
        self._register = tuple(int(v) for v in self.device.get_float_status())
        kernel = False
        if self._checks():
            self.detector.scales = [float(self.manager.state.scale)]
            kernel = not self.detector.check([self.device], [arrays])[0]
        self._overflow_seen |= kernel
        # grad_max: the largest scaled magnitude over the scale in binary64, as simulate() writes it,
        # whether or not the gradients are unscaled in place (torch_npu keeps an overflowed step's)
        with np.errstate(all="ignore"):
            biggest = max((float(np.max(np.abs(a.astype(np.float32)))) for a in arrays if a.size), default=0.0)
            biggest = float(np.float64(biggest) / np.float64(self.manager.state.scale))
        self._grad_max = max(self._grad_max, biggest)
        inv = np.float32(1.0 / float(self.manager.state.scale)) if self.manager.state.scale else np.float32(np.inf)
        if inv != 1 and not (kernel and isinstance(self.detector, TorchNpu)):
            for a in arrays:
                a[...] = _times(self.device, a, inv, a.dtype)
        state.update(stage=_UNSCALED, found_inf=kernel)  # a step-wide overflow is step()'s to apply

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Unscale (unless :meth:`unscale_` ran this step) and call ``optimizer.step(*args,
        **kwargs)`` unless an overflow was found (:meth:`unscale_` says which, with several
        optimizers); its return value, or None when skipped."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._require_scale("step")
        state = self._state(optimizer)
        if state["stage"] == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        state["stage"] = _STEPPED
        if state["found_inf"] or (self._overflow_seen and self._step_wide()):
            state["found_inf"] = True
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """End the step: record its row, then set ``new_scale`` or advance the policy (finite iff
        no optimizer found an overflow)."""
        if not self._enabled:
            return
        if new_scale is None and not self._per_optimizer:
            raise AssertionError("No inf checks were recorded prior to update.")
        found = any(s["found_inf"] for s in self._per_optimizer.values())
        self._record(found)
        if new_scale is not None:
            self._set_scale(new_scale)
        else:
            self.manager.update_loss_scale(not found)
        self._step_index += 1
        self._new_step()

    def _set_scale(self, new_scale: float | torch.Tensor) -> None:
        if isinstance(new_scale, torch.Tensor):
            if new_scale.numel() != 1 or new_scale.requires_grad:
                raise ValueError("new_scale should be a float or a 1-element tensor with requires_grad=False.")
            new_scale = float(new_scale.detach().double().reshape(()))
        check_scale("new_scale", new_scale)
        state = self.manager.state
        self.manager.state = state._replace(scale=type(state.scale)(new_scale))

    def _record(self, found: bool) -> None:
        overflow = self._events > 0
        self.rows.append(Row(
            step=self._step_index, loss_scale=float(self.manager.state.scale), overflow=overflow,
            event_phases=UNMARKED if overflow else "", detector_finite=not found, applied=not found,
            undetected_overflow=overflow and not found, false_positive=found and not overflow, ranks_agree=True,
            ranks_applied="0" if found else "1", register=self._register or (0,) * 8, loss=self._loss,
            baseline_loss=math.nan, grad_max=self._grad_max if self._per_optimizer else math.nan,
            underflow_fraction=math.nan, update_error=math.nan, skipped_update_error=math.nan, overflow_harm=""))

    # -- torch's getters and setters (torch's rule and its family) ------------------------------
    def _field(self, name: str) -> Any:
        if not hasattr(self.manager.policy, name):
            raise AttributeError(f"the policy {type(self.manager.policy).__name__} has no {name}")
        return getattr(self.manager.policy, name)

    def _replace(self, **change: Any) -> None:
        self._field(next(iter(change)))
        self.manager.policy = dataclasses.replace(self.manager.policy, **change)

    def get_growth_factor(self) -> float:
        return self._field("growth_factor")

    def set_growth_factor(self, new_factor: float) -> None:
        self._replace(growth_factor=new_factor)

    def get_backoff_factor(self) -> float:
        return self._field("backoff_factor")

    def set_backoff_factor(self, new_factor: float) -> None:
        self._replace(backoff_factor=new_factor)

    def get_growth_interval(self) -> int:
        return self._field("growth_interval")

    def set_growth_interval(self, new_interval: int) -> None:
        self._replace(growth_interval=new_interval)

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The policy's checkpoint (:meth:`Manager.state_dict`: plain Python values, exact, so
        JSON and ``torch.save`` keep it) and the step count; ``{}`` when disabled, as torch's.
        On torch's policy (and torch_npu's) also ``torch.amp.GradScaler.state_dict``'s keys
        (``scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``,
        ``_growth_tracker``), so that torch's scaler loads it and continues bit for bit."""
        if not self._enabled:
            return {}
        own = {**self.manager.state_dict(), "step": self._step_index}
        policy, state = self.manager.policy, getattr(self.manager, "state", None)
        if not isinstance(policy, TorchPolicy) or state is None:
            return own
        return {"scale": float(state.scale), "growth_factor": float(policy.growth_factor),
                "backoff_factor": float(policy.backoff_factor), "growth_interval": int(policy.growth_interval),
                "_growth_tracker": int(state.counter), **own}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`, or from ``torch.amp.GradScaler.state_dict()`` (its
        scale, factors, interval and tracker, on torch's policy or torch_npu's: its scale becomes
        the initial scale too, as torch's load makes it; the step count stays). A state_dict of
        another policy is refused naming both; the rows recorded so far stay."""
        if not self._enabled:
            return
        if not isinstance(state_dict, Mapping) or not state_dict:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled "
                               "instance of GradScaler.")
        if "policy" not in state_dict and all(k in state_dict for k in TORCH_KEYS):
            self.manager.load_state_dict(self._from_torch(state_dict))
            return
        step = state_dict.get("step")
        step = integer("state_dict step", step, 0)
        self.manager.load_state_dict({k: v for k, v in state_dict.items() if k != "step" and k not in TORCH_KEYS})
        self._step_index = step

    def _from_torch(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        """torch.amp.GradScaler's state_dict as this scaler's policy's checkpoint."""
        policy = self.manager.policy
        if not isinstance(policy, TorchPolicy):
            raise ValueError(f"this state_dict is torch.amp.GradScaler's (policy TorchPolicy); this scaler runs "
                             f"{type(policy).__name__}: load it into a GradScaler on torch's policy")
        arguments = {**describe(policy), "init_scale": saved["scale"], "growth_factor": saved["growth_factor"],
                     "backoff_factor": saved["backoff_factor"], "growth_interval": saved["growth_interval"]}
        return {"policy": type(policy).__name__, "arguments": arguments,
                "state": {"scale": saved["scale"], "counter": saved["_growth_tracker"]}}

    # -- the trajectory as a run ---------------------------------------------------------------
    def run(self) -> Run:
        """The recorded steps as a :class:`Run` (:func:`lossscale.app.files.write_run` writes it as
        a run folder that ``lossscale plot`` draws); the columns a GradScaler cannot know (the
        baseline, underflow, update error) are NaN, and every event counts as feeding the update."""

        rows, dev, policy = self.rows, self.device, self.manager.policy
        summary = Summary(
            arguments={"ranks": 1, "steps": len(rows), "profile": dev.profile.name,
                       "overflow_mode": dev.overflow.name, "detector": self.detector.name, "source": "GradScaler"},
            manager={"name": type(self.manager).__name__, "class": type(self.manager).__name__,
                     "arguments": describe(policy) if isinstance(policy, Policy) else {}, "defaults": None,
                     "demo_arguments": []},
            profile={"name": dev.profile.name, "product": dev.profile.product_en,
                     "overflow_mode": dev.overflow.name, "warnings": []},
            detector=self.detector.name, phases=f"unmarked (the workload's whole step is one phase, {UNMARKED})",
            versions={**versions(), "torch": torch.__version__}, steps_run=len(rows), stopped_early=None,
            interrupted=False, final={}, baseline_float32={}, final_loss_scale=self.get_scale(),
            **counts(rows),
            max_quiet_update_error=math.nan, harmless_error=math.nan, mean_underflow_fraction=math.nan,
            underflow_every=0, matmul_accumulation=np.dtype(dev.profile.matmul_accumulate).name,
            events_recorded=None, first_overflow=None, top_labels={}, fp8=None)
        return Run([r.to_dict() for r in rows], summary.to_dict(), summary.arguments)

    def __repr__(self) -> str:
        return (f"GradScaler({self.device.profile.name}, {self.device.overflow.name}, policy={self.manager.policy}, "
                f"detector={self.detector.name}, scale={self.get_scale()}, steps={self._step_index})")
