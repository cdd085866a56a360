"""Plain optimizers on binary32 master weights, and the loss-scale optimizers
that wrap them: TensorFlow 1.x's ``LossScaleOptimizer`` and the Ascend
adapter's ``NPULossScaleOptimizer``.

Sources: TensorFlow 1.x ``tensorflow/contrib/mixed_precision/python/loss_scale_optimizer.py``
(gradients of the scaled loss times 1/S, applied only if all finite, the manager always
updated); the Ascend adapter's ``tf_adapter/python/npu_bridge/estimator/npu/
npu_loss_scale_optimizer.py`` and its ``NPULossScaleOptimizer`` documentation page (in
saturation mode the float-status register is read after the gradients, then cleared, and
summed over ranks with ``is_distributed``; the step is finite iff it is all zero).

There is no autodiff here: a *gradient function* ``grad_fn(loss_scale)``
returns the gradients of the scaled loss, one per variable (the training
simulator computes them on a simulated device). Variables are binary32 numpy
arrays updated in place; a gradient may be ``None`` (no update, no check).
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from sim import Device, OverflowMode, current_device

from ..policy.core import Manager, Policy, check_positive, check_ratio
from .detectors import ascend_register_check, norm32

__all__ = ["OPTIMIZER_DETECTORS", "UnsupportedProductWarning", "clip_by_global_norm"]

GradsAndVars = Sequence[tuple[np.ndarray | None, np.ndarray]]
F32 = np.float32


def _check_var(v: np.ndarray) -> None:
    if not isinstance(v, np.ndarray) or v.dtype != F32:
        raise TypeError(f"variables are float32 numpy arrays (master weights), got {getattr(v, 'dtype', type(v))}")


class _Plain:
    """Shared: per-variable slots, binary32 arithmetic.

    Slots belong to the variable object itself: they are held beside a weak reference to
    it, so a new array that happens to reuse a dead array's ``id`` starts from zero instead
    of inheriting the dead one's momentum, and a dead variable's slots are dropped."""

    def __init__(self) -> None:
        self._slots: dict[int, tuple[weakref.ref, dict[str, np.ndarray]]] = {}

    def slot(self, var: np.ndarray, name: str) -> np.ndarray:
        slots, key = self._slots, id(var)
        entry = slots.get(key)
        if entry is None or entry[0]() is not var:
            def forget(ref: weakref.ref) -> None:
                if slots.get(key, (None,))[0] is ref:
                    del slots[key]
            entry = slots[key] = (weakref.ref(var, forget), {})
        return entry[1].setdefault(name, np.zeros_like(var))

    def apply_gradients(self, grads_and_vars: GradsAndVars) -> None:
        pairs = [(np.asarray(g, F32), v) for g, v in grads_and_vars if g is not None]
        for _, v in pairs:
            _check_var(v)
        self._begin()
        with np.errstate(all="ignore"):
            for g, v in pairs:
                self._update(g, v)

    def preview(self, grads_and_vars: GradsAndVars) -> list[np.ndarray]:
        """The change :meth:`apply_gradients` would make to each variable (zero where the
        gradient is None), computed on copies: the optimizer's state and the variables are
        left as they were."""
        trial = copy.copy(self)
        trial._slots = {}
        pairs, kept = [], []
        for g, v in grads_and_vars:
            _check_var(v)
            w = v.copy()
            kept.append((v, w))
            entry = self._slots.get(id(v))
            if entry is not None and entry[0]() is v:
                trial._slots[id(w)] = (weakref.ref(w), {k: a.copy() for k, a in entry[1].items()})
            pairs.append((g, w))
        trial.apply_gradients(pairs)
        with np.errstate(all="ignore"):
            return [w - v for v, w in kept]

    def _begin(self) -> None:
        pass

    def _update(self, g: np.ndarray, v: np.ndarray) -> None:
        raise NotImplementedError


class SGD(_Plain):
    """``var -= learning_rate * grad``."""

    def __init__(self, learning_rate: float) -> None:
        super().__init__()
        check_positive("learning_rate", learning_rate)
        self.lr = F32(learning_rate)

    def _update(self, g, v) -> None:
        v -= self.lr * g


class Momentum(_Plain):
    """TensorFlow ``MomentumOptimizer``: ``accum = momentum * accum + grad; var -= lr * accum``."""

    def __init__(self, learning_rate: float, momentum: float = 0.9) -> None:
        super().__init__()
        check_positive("learning_rate", learning_rate)
        check_ratio("momentum", momentum, above_one=False)
        self.lr, self.momentum = F32(learning_rate), F32(momentum)

    def _update(self, g, v) -> None:
        accum = self.slot(v, "accum")
        accum *= self.momentum
        accum += g
        v -= self.lr * accum


class Adam(_Plain):
    """TensorFlow ``AdamOptimizer`` (bias correction folded into the step size)."""

    def __init__(self, learning_rate: float = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8) -> None:
        super().__init__()
        check_positive("learning_rate", learning_rate)
        check_ratio("beta1", beta1, above_one=False)
        check_ratio("beta2", beta2, above_one=False)
        check_positive("epsilon", epsilon)
        self.lr, self.beta1, self.beta2, self.epsilon = (F32(x) for x in (learning_rate, beta1, beta2, epsilon))
        self.t = 0

    def _begin(self) -> None:
        self.t += 1
        self._lr_t = self.lr * np.sqrt(F32(1) - self.beta2 ** self.t) / (F32(1) - self.beta1 ** self.t)

    def _update(self, g, v) -> None:
        m, s = self.slot(v, "m"), self.slot(v, "v")
        m *= self.beta1
        m += (F32(1) - self.beta1) * g
        s *= self.beta2
        s += (F32(1) - self.beta2) * g * g
        v -= self._lr_t * m / (np.sqrt(s) + self.epsilon)


def clip_by_global_norm(grads_and_vars: GradsAndVars, max_norm: float) -> list[tuple[np.ndarray | None, np.ndarray]]:
    """The pairs with their gradients clipped as ``torch.nn.utils.clip_grad_norm_``
    (``torch/nn/utils/clip_grad.py``) clips them: the global norm in binary32 (:func:`norm32`),
    ``clip_coef = max_norm / (total_norm + 1e-6)`` in binary32 (a float over a tensor is the
    tensor's reciprocal times the float, ``Tensor.__rdiv__`` in ``torch/_tensor.py``), clamped
    to at most 1, and every gradient times it, even when it is 1. An Inf norm makes the
    coefficient 0, so finite gradients become 0 and Inf ones NaN, as in torch."""
    pairs = list(grads_and_vars)
    total = norm32([g for g, _ in pairs])
    with np.errstate(all="ignore"):
        coef = np.minimum(np.reciprocal(F32(total + F32(1e-6))) * F32(max_norm), F32(1.0))
        return [(None if g is None else np.asarray(g, F32) * coef, v) for g, v in pairs]


class UnsupportedProductWarning(UserWarning):
    """NPULossScaleOptimizer run, as asked, on a product the NPULossScaleOptimizer page marks as not supporting it."""


#: Overflow detectors: the float-status register, or isfinite on the gradients.
OPTIMIZER_DETECTORS = ("status", "isfinite")


class LossScaleOptimizer:
    """TensorFlow 1.x ``LossScaleOptimizer(opt, loss_scale_manager)``.

    ``compute_gradients`` scales the loss by S (through ``grad_fn``) and
    multiplies each gradient by 1/S in binary32; ``apply_gradients`` applies
    the wrapped optimizer only if every gradient is finite, always updates the
    manager, and returns whether the update was applied.
    """

    def __init__(self, opt: _Plain, loss_scale_manager: Manager) -> None:
        if not hasattr(opt, "apply_gradients"):
            raise TypeError(f"opt must have apply_gradients, got {type(opt).__name__}")
        if not (hasattr(loss_scale_manager, "get_loss_scale") and hasattr(loss_scale_manager, "update_loss_scale")):
            raise TypeError(f"loss_scale_manager must have get_loss_scale and update_loss_scale, "
                            f"got {type(loss_scale_manager).__name__}")
        self._opt = opt
        self._loss_scale_manager = loss_scale_manager

    @property
    def loss_scale_manager(self) -> Manager:
        return self._loss_scale_manager

    def get_loss_scale(self) -> float:
        return self._loss_scale_manager.get_loss_scale()

    def compute_gradients(self, grad_fn: Callable[[float], Sequence[np.ndarray | None]],
                          var_list: Sequence[np.ndarray]) -> list[tuple[np.ndarray | None, np.ndarray]]:
        scale = self.get_loss_scale()
        grads = list(grad_fn(scale))
        if len(grads) != len(var_list):
            raise ValueError(f"grad_fn returned {len(grads)} gradients for {len(var_list)} variables")
        return list(zip(self._down_scale(grads, scale), var_list, strict=True))

    @staticmethod
    def _down_scale(grads: list, scale: float) -> list:
        with np.errstate(all="ignore"):  # 1/S may overflow binary32 (S below 2**-128, or 0): inf, as in the frameworks
            rcp = np.reciprocal(F32(scale))
            return [None if g is None else np.asarray(g).astype(F32) * rcp for g in grads]

    def _finite(self, grads_and_vars: GradsAndVars) -> bool:
        return all(bool(np.isfinite(g).all()) for g, _ in grads_and_vars if g is not None)

    def _decide(self, grads_and_vars: GradsAndVars) -> bool:
        return self._finite(grads_and_vars)

    def apply_gradients(self, grads_and_vars: GradsAndVars) -> bool:
        grads_and_vars = list(grads_and_vars)
        return self.apply_decided(grads_and_vars, self._decide(grads_and_vars))

    def preview(self, grads_and_vars: GradsAndVars) -> list[np.ndarray] | None:
        """The change the wrapped optimizer would make to each variable, nothing changed
        (None if it cannot say: an optimizer without ``preview``)."""
        preview = getattr(self._opt, "preview", None)
        return preview(list(grads_and_vars)) if callable(preview) else None

    def apply_decided(self, grads_and_vars: GradsAndVars, finite: bool) -> bool:
        """Apply the step if ``finite`` (a decision made elsewhere: another framework's
        overflow check) and update the manager; returns ``finite``."""
        if finite:
            self._opt.apply_gradients(grads_and_vars)
        self._loss_scale_manager.update_loss_scale(bool(finite))
        return bool(finite)

    def minimize(self, grad_fn: Callable[[float], Sequence[np.ndarray | None]], var_list: Sequence[np.ndarray]) -> bool:
        return self.apply_gradients(self.compute_gradients(grad_fn, var_list))

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint of the loss scaling: ``{"loss_scale_manager": its state_dict()}``.

        It holds the manager's arguments and state only. The wrapped optimizer's own state
        (its learning rate, momentum and Adam slots, Adam's step count) and the variables are
        not in it (checkpoint them beside it), nor are the settings given to the constructor
        (``is_distributed``, ``detector``, ``device``) or ``last_status``, a record of the
        last read."""
        save = getattr(self._loss_scale_manager, "state_dict", None)
        if not callable(save):
            raise TypeError(f"{type(self._loss_scale_manager).__name__} has no state_dict()")
        return {"loss_scale_manager": save()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` into the manager (checked by it: ValueError, and nothing
        changed, if the dict is of another manager or malformed)."""
        if not isinstance(state_dict, Mapping) or set(state_dict) != {"loss_scale_manager"}:
            keys = list(state_dict) if isinstance(state_dict, Mapping) else type(state_dict).__name__
            raise ValueError(f"an optimizer's state_dict is a dict with one key; valid keys: loss_scale_manager; "
                             f"got {keys}")
        load = getattr(self._loss_scale_manager, "load_state_dict", None)
        if not callable(load):
            raise TypeError(f"{type(self._loss_scale_manager).__name__} has no load_state_dict()")
        load(state_dict["loss_scale_manager"])


class NPULossScaleOptimizer(LossScaleOptimizer):
    """The Ascend adapter's ``NPULossScaleOptimizer(opt, loss_scale_manager, is_distributed=False)``.

    On a device in saturation mode the step is finite iff the float-status
    register (read after the gradients, then cleared) is all zero; with
    ``is_distributed`` the registers of all ranks are summed first (the
    device's ``sim.Group``), so every rank skips together. In INF/NaN mode the
    gradients are checked for Inf/NaN. ``detector`` overrides the choice:
    ``"isfinite"`` is the naive check that saturation mode defeats,
    ``"status"`` reads the register in either mode. A ``FixedLossScaleManager``
    with ``enable_overflow_check=False`` applies every step.

    The NPULossScaleOptimizer page's support table lists the Atlas 200I/500 A2 and the Atlas inference series
    as not supporting this optimizer: on their devices it raises ValueError, unless
    ``allow_unsupported=True`` (then a :class:`UnsupportedProductWarning`).
    """

    def __init__(self, opt: _Plain, loss_scale_manager: Manager, is_distributed: bool = False, *,
                 detector: str | None = None, device: Device | None = None, allow_unsupported: bool = False) -> None:
        super().__init__(opt, loss_scale_manager)
        if not isinstance(is_distributed, (bool, np.bool_)):
            raise ValueError(f"is_distributed must be a bool, got {is_distributed!r}")
        if detector is not None and detector not in OPTIMIZER_DETECTORS:
            raise ValueError(f"unknown detector {detector!r}; valid: {', '.join(OPTIMIZER_DETECTORS)}, "
                             f"or None (chosen by the overflow mode)")
        self._is_distributed = bool(is_distributed)
        self.detector = detector
        self._device = device
        self.allow_unsupported = bool(allow_unsupported)
        self._checked: weakref.WeakSet[Device] = weakref.WeakSet()  # devices, not ids a new one may reuse
        if device is not None:
            self._check_product(device)
        #: The float-status value the last decision read (after any all-reduce), or None.
        self.last_status: np.ndarray | None = None

    @property
    def device(self) -> Device:
        dev = self._device if self._device is not None else current_device()
        if dev not in self._checked:
            self._check_product(dev)
        return dev

    def _check_product(self, dev: Device) -> None:
        p = dev.profile
        if not p.supports_npu_loss_scale_optimizer:
            text = (f"{p.name} ({p.product_en}) does not support NPULossScaleOptimizer (the NPULossScaleOptimizer "
                    f"page's support table)")
            if not self.allow_unsupported:
                raise ValueError(f"{text}; pass allow_unsupported=True to run it anyway")
            warnings.warn(f"{text}; running anyway (allow_unsupported=True)", UnsupportedProductWarning, stacklevel=3)
        self._checked.add(dev)

    def detector_for(self, device: Device) -> str:
        if self.detector is not None:
            return self.detector
        return "status" if device.overflow is OverflowMode.SATURATION else "isfinite"

    def _decide(self, grads_and_vars: GradsAndVars) -> bool:
        policy = getattr(self._loss_scale_manager, "policy", None)
        if isinstance(policy, Policy) and not policy.checks_overflow():
            self.last_status = None
            return True
        dev = self.device
        if self.detector_for(dev) == "isfinite":
            self.last_status = None
            return self._finite(grads_and_vars)
        if self._is_distributed and dev.group is None:
            raise RuntimeError(f"is_distributed=True, but {dev!r} is not a rank of a sim.Group")
        reduce = (lambda statuses: [dev.group.allreduce_float_status(dev)]) if self._is_distributed else None
        [finite], [self.last_status] = ascend_register_check([dev], reduce)
        return finite
