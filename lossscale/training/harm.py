"""What an overflow did to a step's update: the update against the binary32 reference, and the
reading of an overflow step as harmless, harmful, a needless skip or a needed one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .simulate import _Step

__all__ = ["HARMLESS_ERROR"]

#: The largest relative error (:func:`_relative_error`) of an update that still agrees with
#: the binary32 one "to within binary16 rounding": 2**-4, 128 units of binary16's rounding
#: (u = 2**-11). One rounding of each element would be an error of at most u, but a binary16
#: step rounds the weights, every layer's activations and every gradient on the way back, and
#: a rounding can flip a ReLU near zero, moving one example's whole contribution to a unit:
#: the default mlp's quiet steps (no overflow) reach 2**-6.4 (300 steps, atlas-a2) and 2**-5.8
#: (atlas-training, log_perplexity). An overflow that reaches the update is of order 1 (a
#: saturated gradient 65504/S, a lost step is exactly 1), so the bar sits 4x above the quiet
#: steps and 16x below that.
HARMLESS_ERROR = 2.0 ** -4
_NAN = float("nan")  # one object: rows of equal runs compare equal (NaN == NaN is false, `is` true)


def _relative_error(update: list[Any] | None, reference: list[Any] | None) -> float:
    """``||update - reference|| / ||reference||`` over all parameters (2-norms, in binary64):
    0 where both are zero, inf where the update is not finite or the reference is zero and
    the update is not, NaN where there is no reference."""
    if update is None or reference is None:
        return _NAN
    with np.errstate(all="ignore"):
        diff = float(np.sqrt(sum(np.sum((np.asarray(u, np.float64) - np.asarray(r, np.float64)) ** 2)
                                 for u, r in zip(update, reference, strict=True))))
        norm = float(np.sqrt(sum(np.sum(np.asarray(r, np.float64) ** 2) for r in reference)))
    if not np.isfinite(diff):
        return float("inf")
    if norm == 0:
        return 0.0 if diff == 0 else float("inf")
    return diff / norm


def _overflow_harm(step: _Step, overflow: bool) -> str:
    """What an overflow step's overflow did to the update ('' on a step without one: no
    operation of the step raised a register event and rank 0's gradients are finite; the
    register itself is not read, since it may still hold an earlier step's flags). Applied: ``harmless`` if its
    update agrees with binary32 within :data:`HARMLESS_ERROR`, else ``harmful``. Skipped (the
    update is zero): ``skipped-needless`` if the update its gradients would have made agrees,
    else ``skipped-needed``. ``''`` too where the update could not be measured."""
    with np.errstate(all="ignore"):
        nonfinite = not all(bool(np.isfinite(np.asarray(g, np.float32)).all()) for g in step.grads[0])
    if not (overflow or nonfinite):
        return ""
    error = step.update_error if step.decisions[0] else step.skipped_update_error
    if error != error:
        return ""
    agrees = error <= HARMLESS_ERROR
    if step.decisions[0]:
        return "harmless" if agrees else "harmful"
    return "skipped-needless" if agrees else "skipped-needed"


def _grad_max(step: _Step) -> float:
    """Rank 0's largest gradient magnitude, unscaled."""
    with np.errstate(all="ignore"):  # a scale of 0 (a framework's backoff underflowed): inf, or NaN
        return float(np.float64(max(float(np.max(np.abs(g.astype(np.float32)))) for g in step.grads[0]))
                     / np.float64(step.scales[0]))
