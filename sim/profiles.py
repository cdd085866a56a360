"""Atlas product profiles: which overflow modes a product has, and its default.

The rows are the support table of the ``NPULossScaleOptimizer`` constructor
page of the Ascend TensorFlow adapter (the seed), with the overflow modes from
the same page and the runtime documentation:

- Atlas 350, A3 and A2: INF/NaN mode (default) and saturation mode, which
  "exists only for compatibility with older versions, is no longer developed,
  and may carry precision error" (the seed). One runtime document says the
  Atlas 350 supports INF/NaN only; the seed lists both, and it is followed.
- Atlas training series: saturation mode only ("when a computation
  overflows, it saturates to the floating-point extreme +-MAX").
- Atlas 200I/500 A2 inference and Atlas inference series: saturation; they do
  not support the NPU loss-scale optimizer.

Where the sources are silent the profile states the model's choice: tininess
after rounding, the positive canonical quiet NaN (0x7E00), matmul accumulation
in binary32 (the cube unit's; ``Device.matmul``'s default). Subnormals are
kept, never flushed to zero, on every profile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .rounding import OverflowMode, Tininess

__all__ = ["Profile", "get", "names", "PROFILES"]

_BOTH = (OverflowMode.INF_NAN, OverflowMode.SATURATION)
_SAT = (OverflowMode.SATURATION,)


@dataclass(frozen=True)
class Profile:
    """One row of the product table, plus the numerics the emulator needs."""

    name: str
    product_zh: str
    product_en: str
    supports_npu_loss_scale_optimizer: bool
    overflow_modes: tuple[OverflowMode, ...]
    default_overflow_mode: OverflowMode
    saturation_is_legacy: bool
    tininess: Tininess = Tininess.AFTER
    default_nan: int = 0x7E00
    matmul_accumulate: type = np.float32
    note: str = ""

    def describe_modes(self) -> str:
        modes = ", ".join(m.name for m in self.overflow_modes)
        return f"{modes} (default {self.default_overflow_mode.name})"


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("atlas-350", "Atlas 350 加速卡", "Atlas 350 accelerator card",
            True, _BOTH, OverflowMode.INF_NAN, True,
            note="one runtime document says INF/NaN only; the seed lists both modes and is followed"),
    Profile("atlas-a3", "Atlas A3 训练系列产品 / Atlas A3 推理系列产品",
            "Atlas A3 training series / Atlas A3 inference series",
            True, _BOTH, OverflowMode.INF_NAN, True),
    Profile("atlas-a2", "Atlas A2 训练系列产品 / Atlas A2 推理系列产品",
            "Atlas A2 training series / Atlas A2 inference series",
            True, _BOTH, OverflowMode.INF_NAN, True),
    Profile("atlas-200i-500-a2", "Atlas 200I/500 A2 推理产品", "Atlas 200I/500 A2 inference products",
            False, _SAT, OverflowMode.SATURATION, False),
    Profile("atlas-inference", "Atlas 推理系列产品", "Atlas inference series",
            False, _SAT, OverflowMode.SATURATION, False),
    Profile("atlas-training", "Atlas 训练系列产品", "Atlas training series",
            True, _SAT, OverflowMode.SATURATION, False),
)}


def names() -> list[str]:
    """The profile names, in the seed's order."""
    return list(PROFILES)


def get(name: str | Profile) -> Profile:
    """The profile called ``name``; ValueError listing the known ones otherwise."""
    if isinstance(name, Profile):
        return name
    try:
        return PROFILES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None
