"""Who sees the overflow: each framework's overflow check, as the points of the training
step where it clears and reads the device's float-status register.

The register is sticky: every device operation since the last clear sets it, the forward
pass and logging included. So what a framework catches, and which harmless events make it
skip a good step, depends on where in the step it clears and reads. A detector is that
framework's piece of the step: what it does when a phase of the step begins (the simulator
and the workloads mark phases with ``phases.begin_phase``) and its check at the unscale
step, for all ranks at once (ranks run one after another in the simulator, so a detector
sees every rank's register before it reduces them).

- ``tf-npu`` (``status`` is an alias): the Ascend TensorFlow adapter's
  ``NPULossScaleOptimizer.apply_gradients`` (``tf_adapter/python/npu_bridge/estimator/npu/
  npu_loss_scale_optimizer.py``): after the gradients, ``npu_get_float_status_v2`` then
  ``npu_clear_float_status_v2``; with ``is_distributed`` the status is all-reduced (sum);
  finite iff it is all zero. It clears only after a read, so the window runs from the
  previous step's read and holds this step's forward pass, loss and logging. It reads the
  register in either overflow mode.
- ``torch-npu``: torch_npu's ``GradScaler`` (``torch_npu/npu/amp/grad_scaler.py``, the
  op-plugin kernel of ``_amp_foreach_non_finite_check_and_unscale_``). In saturation mode
  ``scale(loss)`` clears the register (once per step, after the forward pass); the unscale
  kernel reads it and, if it is set, clears it and reports found_inf (without unscaling);
  with several ranks the 0/1 overflow count is all-reduced (SUM). In INF/NaN mode nothing
  touches the register: a non-finite check of the gradients.
- ``mindspore``: MindSpore's ``TrainOneStepWithLossScaleCell`` (``mindspore/nn/wrap/
  loss_scale.py``): ``start_overflow_check`` clears the status after the loss, before the
  sens (scale) and the backward pass; ``get_overflow_status`` reads it after the gradients
  are unscaled and reduced: overflow iff the sum of its 8 values (all-reduced over ranks
  when distributed) is at least 1. Graph mode is modelled: the forward pass runs once,
  before the clear. INF/NaN mode: a non-finite check of the gradients.
- ``mindspore-all-finite``: MindSpore's ``amp.all_finite`` (``mindspore/amp.py``) on
  Ascend: after the gradients, ``NPUGetFloatStatusV2`` then ``NPUClearFloatStatusV2``,
  finite iff all zero, per rank: nothing reduces it, so ranks can disagree. INF/NaN mode:
  a non-finite check.
- ``paddle-npu``: Paddle 2.1's static-graph AMP on NPU in a pipeline (:class:`PaddleNpu`):
  cleared after every micro-batch's loss, read then cleared by ``check_finite_and_unscale``;
  per rank.
- ``megatron-npu``: Megatron-LM (and MindSpeed, which keeps Megatron's optimizer) on torch_npu
  (:class:`MegatronNpu`): no clear anywhere in the step; the optimizer's
  ``torch._amp_foreach_non_finite_check_and_unscale_`` (torch_npu's kernel: read, and clear if
  set) after the last micro-batch's backward, found_inf all-reduced with MAX over the
  model-parallel group (every pipeline stage) and, here, the ranks.
- ``deepspeed-npu``: DeepSpeed on NPU through Ascend's adaptor (:class:`DeepSpeedNpu`): cleared
  before every micro-batch's ``loss * scale``; read by torch_npu's ``npu_check_overflow`` at the
  optimizer's step (cleared if set), the overflow all-reduced with MAX over the ranks.
- ``isfinite``: the naive check of the (all-reduced) gradients, which saturation mode
  defeats: saturated gradients are finite.
- ``deepspeed-sum``, ``fairseq-norm``, ``megatron-norm``: the GPU frameworks' checks, which
  decide from the gradients' values (a sum, a norm) in binary32 and never read the register
  (:class:`DeepSpeedSum`, :class:`FairseqNorm`, :class:`MegatronNorm` give their sources).
  They fire on an Inf or NaN gradient, so in INF/NaN mode they agree with ``isfinite``; in
  saturation mode an overflowed gradient is 65504, finite, and so are its sum and its norm,
  unless the binary32 sum of squares itself overflows: ``sum(g**2) > FLT_MAX``, a norm above
  about 2**64 (:func:`norm32`). Scaled binary16 gradients cannot reach that (it takes
  (2**64 / 65504)**2, some 8e28, saturated elements); unscaled ones can, when the loss scale
  is below about ``65504 * sqrt(n) * 2**-64`` (n saturated elements).

Under gradient accumulation (``micro_batches``: the micro-batches of a step run one after
another, each its forward, loss, scale and backward, before the one check):

- ``tf-npu`` reads and clears in ``apply_gradients`` only, once per optimizer step, so its
  window holds every micro-batch.
- ``torch-npu`` clears in ``scale()`` only while ``self._clear_overflow_flag`` is False; the
  first ``scale()`` sets it and only ``update()`` resets it (Ascend/pytorch
  ``torch_npu/npu/amp/grad_scaler.py``, ``GradScaler.scale`` and ``GradScaler.update``). So it
  clears once per optimizer step, at the first micro-batch's scale: no micro-batch's overflow
  is lost, and the later micro-batches' forward passes and logging are in the window.
- ``mindspore`` is modelled the same way (one clear per step, at the first micro-batch's
  scale). MindSpore runs accumulation in one graph, where the clear follows every micro-batch's
  loss; the model's window also holds the later micro-batches' forward passes (not checked
  against MindSpore's source).
- ``mindspore-all-finite`` is modelled as called once per step, on the accumulated
  gradients (a loop that calls it on every micro-batch's gradients checks each alone).
- ``paddle-npu`` and ``deepspeed-npu`` clear in every micro-batch: an overflow in any micro-batch
  but the last is lost (applied, an undetected overflow).

The windows, with their sources: ``docs/semantics.md``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from sim import Device, OverflowMode

from .phases import PHASES, current_step

__all__ = ["Detector", "DETECTORS", "ALIASES", "make_detector", "UNMARKED", "FEEDS_NOTHING", "TfNpu", "TorchNpu",
           "MindSpore", "MindSporeAllFinite", "PaddleNpu", "MegatronNpu", "DeepSpeedNpu", "IsFinite", "DeepSpeedSum",
           "FairseqNorm", "MegatronNorm", "ascend_register_check", "norm32"]

#: The phase of a workload that does not mark its phases: its whole forward and backward.
#: Detectors treat it as beginning at ``scale``, so every window holds it (nothing is missed,
#: and its events cannot be told apart as harmless).
UNMARKED = "forward_backward"
#: Phases whose operations feed no gradient and no update (events there are harmless).
FEEDS_NOTHING = frozenset({"log"})
_ORDER = {**{p: i for i, p in enumerate(PHASES)}, UNMARKED: PHASES.index("scale")}


def _finite(grads: Sequence[np.ndarray]) -> bool:
    with np.errstate(all="ignore"):
        return all(bool(np.isfinite(np.asarray(g, np.float32)).all()) for g in grads if g is not None)


class Detector:
    """One framework's overflow check. ``distributed``: whether it reduces over ranks as
    that framework does with several ranks (False: each rank decides alone)."""

    name: ClassVar[str]
    #: The phase at whose beginning the framework clears the register (None: it does not).
    clears_at: ClassVar[str | None] = None
    #: Whether it clears there once per optimizer step (False) or in every micro-batch (True;
    #: with ``micro_batches`` 1 the two are the same).
    clears_every_micro_batch: ClassVar[bool] = False
    #: Each rank's loss scale for the step being checked, set by the step loop before
    #: :meth:`check` (None: the gradients are taken as unscaled); the norm checks unscale by it.
    scales: list[float] | None = None

    def __init__(self, distributed: bool = True) -> None:
        if not isinstance(distributed, (bool, np.bool_)):
            raise ValueError(f"distributed must be a bool, got {distributed!r}")
        self.distributed = bool(distributed)
        #: The window (step, micro-batch or None) each device was last cleared in (weakly keyed: a new
        #: device never inherits it).
        self._cleared: weakref.WeakKeyDictionary[Device, tuple[Any, Any]] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(distributed={self.distributed})"

    def reads_register(self, device: Device) -> bool:
        """Whether the check reads the register on ``device`` (else it checks the gradients)."""
        return device.overflow is OverflowMode.SATURATION

    def attach(self, devices: Sequence[Device]) -> None:
        """Observe each rank's phases (once per device)."""
        for dev in devices:
            dev.add_observer(self)

    def on_tags(self, device: Device, previous: Mapping[str, Any], current: Mapping[str, Any]) -> None:
        """At a phase's beginning: clear once per step at ``clears_at`` (or the first phase after
        it that the step reaches), if this framework does."""
        phase = current.get("phase")
        if self.clears_at is None or phase not in _ORDER or _ORDER[phase] < _ORDER[self.clears_at]:
            return
        window = (current_step(device), current.get("micro_batch") if self.clears_every_micro_batch else None)
        if self._cleared.get(device) != window and self.reads_register(device):
            device.clear_float_status()
        self._cleared[device] = window

    def check(self, devices: Sequence[Device], grads: Sequence[Sequence[np.ndarray]]) -> list[bool]:
        """Each rank's decision (True: finite, apply the step), at the unscale step: from the
        registers (:meth:`_read`) where this framework reads them, else from the gradients
        (already all-reduced, so no further reduction)."""
        if not self.reads_register(devices[0]):
            return [_finite(g) for g in grads]
        return self._read(devices)

    def _read(self, devices: Sequence[Device]) -> list[bool]:
        raise NotImplementedError

    def _reduce(self, values: list[np.ndarray]) -> list[np.ndarray]:
        """Each rank's value, or (distributed) every rank's sum, as an all-reduce gives."""
        if not self.distributed or len(values) == 1:
            return values
        total = np.sum([v.astype(np.int64) for v in values], axis=0)
        return [total] * len(values)


def ascend_register_check(devices: Sequence[Device],
                          reduce: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None,
                          ) -> tuple[list[bool], list[np.ndarray]]:
    """The Ascend TensorFlow adapter's overflow check (``NPULossScaleOptimizer.apply_gradients``,
    ``npu_loss_scale_optimizer.py``): read each device's float-status register
    (``npu_get_float_status_v2``), all-reduce the values with ``reduce`` if given, clear each
    register (``npu_clear_float_status_v2``); a rank's step is finite iff its value is all zero.
    Returns each rank's decision and the value it decided on. The one implementation, used by
    the ``tf-npu`` detector and by ``NPULossScaleOptimizer``."""
    status = [dev.get_float_status() for dev in devices]
    if reduce is not None:
        status = reduce(status)
    for dev in devices:
        dev.clear_float_status()
    return [not s.any() for s in status], status


class TfNpu(Detector):
    name = "tf-npu"

    def reads_register(self, device: Device) -> bool:
        return True

    def _read(self, devices):
        return ascend_register_check(devices, self._reduce)[0]


class TorchNpu(Detector):
    name = "torch-npu"
    clears_at = "scale"

    def _read(self, devices):
        found = []
        for dev in devices:
            hit = bool(dev.get_float_status().any())
            if hit:
                dev.clear_float_status()
            found.append(np.array([int(hit)]))
        return [not int(c[0]) for c in self._reduce(found)]


class MindSpore(Detector):
    name = "mindspore"
    clears_at = "scale"

    def _read(self, devices):
        sums = [np.array([dev.get_float_status().astype(np.int64).sum()]) for dev in devices]
        return [int(s[0]) < 1 for s in self._reduce(sums)]


class MindSporeAllFinite(TfNpu):
    """The TF adapter's read-then-clear, per rank unless ``distributed``, and only in saturation mode."""

    name = "mindspore-all-finite"
    reads_register = Detector.reads_register

    def __init__(self, distributed: bool = False) -> None:
        super().__init__(distributed)


class PaddleNpu(Detector):
    """Paddle 2.1's static-graph AMP on NPU in a pipeline (``PipelineOptimizer``), before the fix.
    ``OptimizerWithMixedPrecision.backward`` (``python/paddle/fluid/contrib/mixed_precision/
    decorator.py``) appends ``alloc_float_status`` and ``clear_float_status`` after the loss,
    before it is scaled; the pipeline runs that section once per micro-batch, so the register is
    cleared in every micro-batch and only the last one's overflows (and its forward's, after its
    loss) reach the check (PaddlePaddle/Paddle pull 35144 describes it; pull 35165,
    https://github.com/PaddlePaddle/Paddle/pull/35165, gives the two ops the LRSched role so that
    they run once per mini-batch). The check, ``check_finite_and_unscale``'s NPU kernel
    (``paddle/fluid/operators/amp/check_finite_and_unscale_op_npu.cc``): ``NPUGetFloatStatus``,
    found_inf iff the sum of the 8 values is above 1 (in the model's slots any event sums to at
    least 2), then ``NPUClearFloatStatus``. Each rank decides alone. INF/NaN mode: a non-finite
    check."""

    name = "paddle-npu"
    clears_at = "scale"
    clears_every_micro_batch = True

    def __init__(self, distributed: bool = False) -> None:
        super().__init__(distributed)

    def _read(self, devices):
        sums = [np.array([dev.get_float_status().astype(np.int64).sum()]) for dev in devices]
        for dev in devices:
            dev.clear_float_status()
        return [int(s[0]) <= 1 for s in self._reduce(sums)]


class MegatronNpu(TorchNpu):
    """Megatron-LM's mixed-precision optimizer on Ascend NPUs through torch_npu, as MindSpeed runs
    it. ``MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan``
    (``megatron/core/optimizer/optimizer.py``; MindSpeed's ``unscale_main_grads_and_check_for_nan``,
    ``mindspeed/core/optimizer/low_precision/quant_optimizer_hooks.py``) calls
    ``torch._amp_foreach_non_finite_check_and_unscale_`` on the main gradients once per optimizer
    step, after the pipeline schedule's last backward, then ``all_reduce(found_inf, MAX)`` over the
    model-parallel (grad-stats) group, which holds every pipeline stage. On NPU in saturation mode
    that kernel reads the float-status register and clears it if set (the op-plugin kernel
    :class:`TorchNpu` models). Megatron scales the loss itself (``grad_scale_func`` in
    ``backward_step``, ``megatron/core/pipeline_parallel/schedules.py``), never through torch's
    ``GradScaler.scale``, so nothing else clears: the window is everything since the last read that
    found an event. MindSpeed's own source calls no ``npu_get_float_status``/``clear_float_status``:
    the register is read inside torch_npu's kernel. INF/NaN mode: a non-finite check."""

    name = "megatron-npu"
    clears_at = None


class DeepSpeedNpu(TorchNpu):
    """DeepSpeed's fp16 optimizers on Ascend NPUs through Ascend's adaptor (``Ascend/DeepSpeed``,
    ``deepspeed_npu/``; the 0.6.0 and 0.9.2 lines alike). Where the chip is not in INF/NaN mode
    (``FLAG_SUPPORT_INF_NAN``, torch_npu's ``is_support_inf_nan()``), every backward the engine runs
    clears the flag first: ``LossScalerBase.backward`` (``adaptor_runtime_fp16_loss_scaler.py``, the
    path of ZeRO 1 and 2), ``FP16_Optimizer.backward`` (``adaptor_runtime_fp16_fused_optimizer.py``)
    and ``FP16_UnfusedOptimizer.backward`` (``adaptor_runtime_fp16_unfused_optimizer.py``) call
    ``clear_npu_overflow_flag()`` before ``loss * scale``, once per micro-batch, so under gradient
    accumulation only the last micro-batch's backward (and what follows it before the step) is in
    the window. The step's check, ``CheckOverflow.has_overflow_serial`` (``adaptor_runtime_utils.py``;
    ZeRO's ``has_overflow_partitioned_grads_serial``), is torch_npu's ``npu_check_overflow``: read the
    flag, clear it if set (``torch_npu/npu/utils.py``); ``has_overflow`` all-reduces it with MAX over
    the world (or data- and model-parallel) group. In INF/NaN mode no clear happens and DeepSpeed's
    own check decides: ``float(x.float().sum())`` not finite, which for binary16 gradients is their
    isfinite. Not modelled: activation checkpointing's save-and-restore of the flag around its
    recomputation (``adaptor_runtime_activation_checkpointing_checkpointing.py``)."""

    name = "deepspeed-npu"
    clears_every_micro_batch = True


class IsFinite(Detector):
    name = "isfinite"

    def reads_register(self, device: Device) -> bool:
        return False


F32 = np.float32


def _two_norm(x: np.ndarray) -> np.float32:
    """One tensor's 2-norm as torch's ``linalg.vector_norm`` takes it for binary32: the sum of the
    squares in binary32, then sqrt (a one-element tensor: its magnitude, as torch returns)."""
    x = np.asarray(x, F32).reshape(-1)
    with np.errstate(all="ignore"):
        if x.size == 1:
            return np.abs(x[0])
        return np.sqrt(np.sum(x * x, dtype=F32))


def norm32(grads: Sequence[np.ndarray | None]) -> np.float32:
    """The global 2-norm of ``grads`` (None skipped) in binary32, in the two levels of
    ``torch.nn.utils.clip_grad_norm_`` (``torch/nn/utils/clip_grad.py``, ``_get_total_norm``) and
    fairseq's ``utils.clip_grad_norm_``: each tensor's norm, then the norm of those norms. Every
    square and sum is binary32, so the norm is Inf once a sum of squares passes FLT_MAX (a norm
    above about 2**64) though every value is finite, and NaN or Inf where a value is. The
    summation order is numpy's pairwise one: torch's vectorised order may differ in the last
    bit, never in whether the sum overflows by more than a rounding."""
    norms = [_two_norm(g) for g in grads if g is not None]
    return _two_norm(np.array(norms, F32)) if norms else F32(0.0)


def _inverse(scale: float) -> np.float32:
    """1/S in binary32, as the frameworks keep it (Inf where S is below 2**-128 or 0)."""
    with np.errstate(all="ignore"):
        return np.reciprocal(F32(scale))


class _ValueCheck(Detector):
    """A check of the gradients' values that never reads the register; :attr:`norms` keeps
    each rank's value from the last check (a norm or a sum), for inspection."""

    def __init__(self, distributed: bool = True) -> None:
        super().__init__(distributed)
        self.norms: list[float] = []

    def reads_register(self, device: Device) -> bool:
        return False

    def check(self, devices: Sequence[Device], grads: Sequence[Sequence[np.ndarray]]) -> list[bool]:
        scales = self.scales if self.scales is not None else [1.0] * len(grads)
        self.norms, finite = [], []
        for g, s in zip(grads, scales, strict=True):
            value, ok = self._decide([x for x in g if x is not None], float(s))
            self.norms.append(float(value))
            finite.append(ok)
        if self.distributed and len(finite) > 1:  # an all-reduce of the overflow flag (MAX)
            return [all(finite)] * len(finite)
        return finite

    def _decide(self, grads: list[np.ndarray], scale: float) -> tuple[np.float32, bool]:
        raise NotImplementedError


class DeepSpeedSum(_ValueCheck):
    """DeepSpeed's ``CheckOverflow._has_inf_or_nan`` (``deepspeed/runtime/utils.py``, also
    ``runtime/zero/stage_1_and_2.py`` and the fp16 ``FP16_Optimizer``), as DeepSpeed 0.x had it
    for years: ``cpu_sum = float(x.float().sum())`` on each (scaled) gradient; overflow if a sum
    is +-Inf or NaN; the flag all-reduced with MAX. (DeepSpeed 0.19's ``has_inf_or_nan`` tests
    ``x.amax()`` and ``x.amin()`` instead: the same decision on binary16 gradients, whose binary32
    sum cannot overflow.) :attr:`norms` holds the largest |sum|."""

    name = "deepspeed-sum"

    def _decide(self, grads, scale):
        with np.errstate(all="ignore"):
            sums = np.array([np.sum(np.asarray(g, F32), dtype=F32) for g in grads], F32)
            worst = F32(np.max(np.abs(sums))) if sums.size else F32(0.0)
        return worst, bool(np.isfinite(sums).all())


class FairseqNorm(_ValueCheck):
    """fairseq's ``FP16Optimizer.clip_grad_norm`` (``fairseq/optim/fp16_optimizer.py``): the
    scaled gradients copied to binary32, their norm by ``utils.clip_grad_norm_``
    (``fairseq/utils.py``: :func:`norm32`), times ``_multiply_factor`` = 1/S; then
    ``DynamicLossScaler.check_overflow(grad_norm)`` (``fairseq/optim/dynamic_loss_scaler.py``):
    overflow iff ``grad_norm == inf or grad_norm != grad_norm``. :attr:`norms` holds that
    unscaled norm."""

    name = "fairseq-norm"

    def _decide(self, grads, scale):
        with np.errstate(all="ignore"):
            norm = F32(_inverse(scale) * norm32(grads))
        return norm, not (norm == np.inf or norm != norm)


class MegatronNorm(_ValueCheck):
    """Megatron-LM's ``MixedPrecisionOptimizer.step`` (``megatron/core/optimizer/optimizer.py``):
    ``_unscale_main_grads_and_check_for_nan`` copies the gradients to binary32 main grads and runs
    ``torch._amp_foreach_non_finite_check_and_unscale_``, which tests each value *before* it
    multiplies by 1/S, so found_inf is the scaled gradients' non-finite check; the grad norm
    (``clip_grads.get_grad_norm_fp32``: :func:`norm32` of the unscaled main grads) is taken
    after, for clipping, and skips the step only above ``grad_norm_skip_threshold`` (the
    optimizer config's, default inf: ``norm > inf`` is never true, so an Inf or NaN norm does
    not skip). :attr:`norms` holds that unscaled norm."""

    name = "megatron-norm"

    def __init__(self, distributed: bool = True, skip_threshold: float = float("inf")) -> None:
        super().__init__(distributed)
        if isinstance(skip_threshold, bool) or not isinstance(skip_threshold, (int, float)) \
                or skip_threshold != skip_threshold:
            raise ValueError(f"skip_threshold must be a number (inf: never skip on the norm), got {skip_threshold!r}")
        self.skip_threshold = float(skip_threshold)

    def _decide(self, grads, scale):
        with np.errstate(all="ignore"):
            found_inf = not all(bool(np.isfinite(np.asarray(g, F32)).all()) for g in grads)
            norm = norm32([np.asarray(g, F32) * _inverse(scale) for g in grads])
        return norm, not (found_inf or norm > self.skip_threshold)


#: Every detector by name, in the order ``lossscale run --detector`` lists them.
DETECTORS: dict[str, type[Detector]] = {d.name: d for d in (TfNpu, TorchNpu, MindSpore, MindSporeAllFinite,
                                                               PaddleNpu, MegatronNpu, DeepSpeedNpu, IsFinite,
                                                               DeepSpeedSum,
                                                               FairseqNorm, MegatronNorm)}
#: Earlier names: ``status`` is today's ``tf-npu``.
ALIASES = {"status": "tf-npu"}


def make_detector(name: str | Detector | None, overflow: OverflowMode) -> Detector:
    """A detector by name (None: ``tf-npu`` in saturation mode, ``isfinite`` in INF/NaN mode,
    as the Ascend adapter's NPULossScaleOptimizer is meant for saturation mode and TF's own
    LossScaleOptimizer checks the gradients), or a Detector object as it is."""
    if isinstance(name, Detector):
        return name
    if name is None:
        name = "tf-npu" if overflow is OverflowMode.SATURATION else "isfinite"
    name = ALIASES.get(name, name)
    if name not in DETECTORS:
        raise ValueError(f"unknown detector {name!r}; valid: {', '.join([*DETECTORS, *ALIASES])}")
    return DETECTORS[name]()
