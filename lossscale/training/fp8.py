"""Narrow-format matmuls in training: the matmul hook that runs a model's matmuls under a
scaling recipe (:class:`Fp8Matmuls`, one :class:`Quantiser` per recipe, the run's and its
shadows'), the data-parallel amax reduction (:class:`AmaxGroup`), and the recipes themselves
(defined in ``lossscale.training.recipes``; their public path is here).

Across data-parallel ranks (``AmaxGroup``), delayed scaling reduces each tensor's amax with MAX
over the group before the scale update, as TE's ``FP8GlobalStateManager.reduce_and_update_fp8_tensors``
(``transformer_engine/pytorch/quantization.py``) does when the recipe's ``reduce_amax`` is true
(its default; ``common/recipe/__init__.py``: "the amax value for FP8 tensors is reduced across
the amax_reduction_group ... If set to False ... every GPU maintains local amaxes and scaling
factors"). Without the reduction the ranks' scales may part; the first step they do so warns.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sim import Device, Flag
from sim.device.cube import matrix_stacks
from sim.formats import HIFLOAT8, Format, decode

from . import records
from .operands import Operand, Roles, amax_of, figures
from .phases import current_phase, current_step
from .recipes import (
    ELEMENT_FORMATS,
    F32,
    FP8_FORMATS,
    HADAMARD16,
    RECIPES,
    BlockRecipe,
    BlockScaling,
    CurrentScaling,
    DelayedScaling,
    MXFP8Scaling,
    MXScaling,
    NVFP4Scaling,
    Recipe,
    TensorScaler,
    make_recipe,
)

__all__ = ["Recipe", "BlockRecipe", "DelayedScaling", "CurrentScaling", "MXScaling", "MXFP8Scaling", "BlockScaling",
           "NVFP4Scaling", "TensorScaler", "Quantiser", "Fp8Matmuls", "RECIPES", "FP8_FORMATS", "ELEMENT_FORMATS",
           "make_recipe", "amax_of", "AmaxGroup", "HADAMARD16"]


#: The per-tensor log's columns (``fp8.csv``), the fields of :class:`lossscale.training.records.Fp8Row`.
FP8_COLUMNS = records.FP8_COLUMNS


class AmaxGroup:
    """The data-parallel group of :class:`Fp8Matmuls` (one per rank): each step's amax and scale
    of every tensor on every rank. With the recipe's ``reduce_amax`` a delayed-scaling update
    takes the MAX over the ranks' amaxes (fmax, as TE's amax kernels), and current scaling takes
    its scale from that MAX (:meth:`exchange`: the ranks must then run side by side, one thread
    each, since each waits for the others' amax); without it each rank keeps its own, and the
    first tensor whose ranks quantised with different scales warns."""

    #: How long a rank waits for the others' amax (seconds) before the step fails.
    TIMEOUT = 300.0

    def __init__(self, ranks: int = 1) -> None:
        self.amaxes: dict[tuple[int | None, str], dict[int, float]] = {}
        self.scales: dict[tuple[int | None, str], dict[int, float]] = {}
        self.warned = False
        self._lock = threading.Lock()
        self.barrier = threading.Barrier(ranks, timeout=self.TIMEOUT) if ranks > 1 else None

    def exchange(self, step: int | None, rank: int, tensor: str, amax: float) -> float:
        """Current scaling's all-reduce: post this rank's amax of ``tensor``, wait until every rank
        has posted its own, and return the MAX (the ranks run in threads; see the class)."""
        with self._lock:
            self.amaxes.setdefault((step, tensor), {})[rank] = amax
        if self.barrier is not None:
            self.barrier.wait()
        return self.reduced(step, tensor)

    def record(self, step: int | None, rank: int, tensor: str, amax: float, scale: float, recipe: Recipe) -> None:
        with self._lock:
            self.amaxes.setdefault((step, tensor), {}).setdefault(rank, amax)
            seen = self.scales.setdefault((step, tensor), {})
            seen[rank] = scale
            if self.warned or len(set(seen.values())) < 2:
                return
            self.warned = True
        hint = {DelayedScaling: "; set reduce_amax=true to keep them in step, as Transformer Engine does by default",
                CurrentScaling: "; set reduce_amax=true to reduce each tensor's amax over the ranks before its scale "
                                "(Transformer Engine's quantizer with_amax_reduction; off by default)"}
        warnings.warn(f"FP8 scales differ across ranks without amax reduction (step {step}, tensor {tensor}: "
                      f"{', '.join(f'rank {r} {v:g}' for r, v in sorted(seen.items()))}){hint.get(type(recipe), '')}",
                      UserWarning, stacklevel=2)

    def reduced(self, step: int | None, tensor: str) -> float:
        """The MAX over the ranks' amaxes of ``tensor`` in ``step``."""
        return float(np.fmax.reduce(np.array(list(self.amaxes[(step, tensor)].values()), np.float32)))


class Quantiser:
    """One recipe's quantisation of a device's matmul operands: each tensor's scaler, the rows it
    logs (:data:`FP8_COLUMNS`), and the product of what it quantised. :class:`Fp8Matmuls` runs
    one for the run's recipe, and one per shadow. A tensor is named by the device's label, the
    phase, the matmul's ordinal among those of that label and phase in the step, and the operand
    (a or b)."""

    def __init__(self, recipe: Recipe, rank: int = 0, record: Callable[[dict[str, Any]], None] | None = None,
                 group: AmaxGroup | None = None) -> None:
        self.recipe, self.rank, self.group = recipe, rank, group
        reduces = group is not None and getattr(recipe, "reduce_amax", False)
        #: Delayed scaling with a group that reduces: updates wait for every rank's amax.
        self._deferred = reduces and isinstance(recipe, DelayedScaling)
        #: Current scaling with a group that reduces: each quantisation waits for every rank's amax.
        self._exchange = reduces and isinstance(recipe, CurrentScaling)
        self._pending: list[str] = []
        self.scalers: dict[str, TensorScaler] = {}
        self.rows: list[dict[str, Any]] = []
        self._record = record or self.rows.append
        self._step: int | None = None

    def begin_step(self, step: int | None) -> None:
        """A new step: delayed scaling's deferred updates (every rank has finished the step before)."""
        for tensor in self._pending:
            self.scalers[tensor].update(self.group.reduced(self._step, tensor))
        self._step, self._pending = step, []

    def pair(self, dev: Device, name: str, phase: str, gemm: str, roles: tuple[str, str],
             a: np.ndarray, b: np.ndarray) -> Callable[[], np.ndarray]:
        """Quantise the operands of ``a @ b`` on ``dev`` and log them; the function returned
        computes their product (binary32)."""
        fwd, bwd = self.recipe.formats()
        fmt = bwd if phase == "backward" else fwd
        if self.recipe.per_tensor:
            (a8, sa), (b8, sb) = (self._tensor(dev, f"{name}.{o}", gemm, fmt, x) for o, x in (("a", a), ("b", b)))
            # TE keeps each tensor's scale_inv = 1/scale in binary32; the GEMM scales by their product.
            inverse = float(F32(F32(1.0) / F32(sa)) * F32(F32(1.0) / F32(sb)))
            return lambda: dev.matmul_fp8(a8, b8, fmt, fmt, scale_inv=inverse)
        # Blocks: a stack of matmuls (leading dimensions that broadcast) runs matrix by matrix, logged as one tensor.
        lead, stack_a, stack_b = matrix_stacks(a, b)
        parts = {}
        for o, stack, axis, role in (("a", stack_a, 1, roles[0]), ("b", stack_b, 0, roles[1])):
            stack = self.recipe.prepare(dev, stack, axis, gemm)
            parts[o] = [self.recipe.operand(dev, np.ascontiguousarray(m), fmt, axis, role, stack) for m in stack]
            self._log(f"{name}.{o}", gemm, fmt, figures(stack, parts[o]))

        def product() -> np.ndarray:
            out = [dev.matmul_blocks(p.elements, q.elements, p.scales, q.scales, p.block, p.format, q.format,
                                     scale_inv=float(F32(p.tensor_scale) * F32(q.tensor_scale)))
                   for p, q in zip(parts["a"], parts["b"], strict=True)]
            return np.stack(out).reshape(*lead, a.shape[-2], b.shape[-1])
        return product

    def _log(self, tensor: str, gemm: str, fmt: Format, figures: dict[str, Any]) -> None:
        self._record({"step": self._step, "rank": self.rank, "tensor": tensor, "format": fmt.name, "gemm": gemm,
                      **figures})

    def _tensor(self, dev: Device, tensor: str, gemm: str, fmt: Format, x: np.ndarray) -> tuple[np.ndarray, float]:
        scaler = self.scalers.get(tensor)
        if scaler is None:
            scaler = self.scalers[tensor] = TensorScaler(self.recipe, fmt.max)
        amax = amax_of(x)
        scale = scaler.scale_for(self.group.exchange(self._step, self.rank, tensor, amax) if self._exchange else amax)
        scaled = dev.mul(dev.cast(x, np.float32), F32(scale))
        rounding = "rna" if fmt is HIFLOAT8 else None
        x8, flags = dev.cast(scaled, fmt, rounding=rounding, return_flags=True)
        saturated = int(np.count_nonzero(flags & Flag.OVERFLOW))
        values = decode(x8, fmt) * float(F32(1.0) / F32(scale))  # binary64: exact
        whole = Operand(x8, fmt, np.empty(0, F32), 0, F32(1), values, np.array([scale]), saturated, int(saturated > 0))
        self._log(tensor, gemm, fmt, figures(x, [whole]))
        if self.group is not None:
            self.group.record(self._step, self.rank, tensor, amax, scale, self.recipe)
        if self._deferred:
            self._pending.append(tensor)
        else:
            scaler.update(amax)
        return x8, scale


class Fp8Matmuls:
    """A device's substitute for ``matmul`` (``dev.substitute("matmul", Fp8Matmuls(recipe))``):
    every matmul's two binary16 operands are quantised by the recipe (per tensor: scaled and cast
    into the pass's 8-bit format on the device; blocks: per block along the contraction axis), the
    register sees the casts' overflows (the device's overflow mode saturates them or not), they are
    multiplied by :meth:`sim.Device.matmul_fp8` (or ``matmul_blocks``), and the result cast to
    the requested dtype. A matmul the recipe leaves out (its GEMM, its label: ``Recipe.applies``),
    or every matmul where ``recipe`` is None, runs as the device's binary16 matmul.

    ``shadows`` (:class:`lossscale.training.shadow.Shadow`): alternatives quantise the same
    operands beside it, each on a device of its own (its register is not the run's), and log what
    they would have given; they change nothing the run computes. ``rows``: the recipe's log,
    where no ``record`` is given."""

    def __init__(self, recipe: Recipe | None, rank: int = 0,
                 record: Callable[[dict[str, Any]], None] | None = None, group: AmaxGroup | None = None,
                 shadows: Sequence[Any] = ()) -> None:
        self.recipe = recipe
        self.quantiser = None if recipe is None else Quantiser(recipe, rank, record, group)
        self.rows = [] if self.quantiser is None else self.quantiser.rows
        self.shadows = list(shadows)
        self.roles = Roles()
        self._seen: dict[tuple, int] = {}
        self._step: int | None = None

    def __call__(self, dev: Device, a, b, accumulate, out_dtype) -> np.ndarray:
        step = current_step(dev)
        if step != self._step:
            for q in self._quantisers():
                q.begin_step(step)
            self._step, self._seen = step, {}
            self.roles.clear()
        a, b = np.asarray(a), np.asarray(b)
        label, phase = dev.current_label or "matmul", current_phase(dev) or "forward"
        n = self._seen.get((label, phase), 0)
        self._seen[(label, phase)] = n + 1
        name = f"{label}.{phase}.{n}"
        gemm, *roles = self.roles.of(label, phase, a, b)
        for shadow in self.shadows:
            if shadow.quantiser.recipe.applies(label, gemm):
                shadow.quantiser.pair(shadow.device, name, phase, gemm, roles, a, b)
        q = self.quantiser
        if q is None or not q.recipe.applies(label, gemm):
            return dev.matmul(a, b, accumulate=accumulate, out_dtype=out_dtype, substitute=False)
        return dev.cast(q.pair(dev, name, phase, gemm, roles, a, b)(), out_dtype)

    def _quantisers(self) -> list[Quantiser]:
        return ([self.quantiser] if self.quantiser is not None else []) + [s.quantiser for s in self.shadows]
