"""Atlas product profiles: which overflow modes a product has, and its default.

The rows are the support table of the ``NPULossScaleOptimizer`` constructor
page of the Ascend TensorFlow adapter (the NPULossScaleOptimizer page, <https://www.hiascend.com/document/detail/zh/
TensorFlowCommercial/latest/migration/tfmigr1/tfmigr1_tfadapi_0064.html>), with the overflow modes
from the same page and the runtime documentation (``docs/semantics.md`` gathers them, with sources):

- Atlas 350, A3 and A2: INF/NaN mode (default) and saturation mode, which
  "exists only for compatibility with older versions, is no longer developed,
  and may carry precision error" (the NPULossScaleOptimizer page). One runtime document says the
  Atlas 350 supports INF/NaN only; the NPULossScaleOptimizer page lists both, and it is followed.
- Atlas training series: saturation mode only ("when a computation
  overflows, it saturates to the floating-point extreme +-MAX").
- Atlas 200I/500 A2 inference and Atlas inference series: saturation; they do
  not support the NPU loss-scale optimizer.

SoC names (what ``aclrtGetSocName`` reports, as torch_npu's
``torch_npu/csrc/core/npu/NpuVariables.cpp`` lists them): Ascend910A, 910ProA,
910PremiumA, 910ProB and 910B (Atlas training series); Ascend910B1-B4 (with
B2C and B4-1: Atlas A2); Ascend910_93xx (Atlas A3); Ascend950 and its variants
(Atlas 350); Ascend310P1-P7 (Atlas inference series); Ascend310B1-B4 (Atlas
200I/500 A2). :func:`for_soc` maps a name to its profile.

:func:`overflow_mode_from_env` gives the mode a framework's runtime would
pick from its environment variables (sources: torch_npu ``NpuVariables.cpp``
``IsSupportInfNan`` and ``register/OptionsManager.cpp``; MindSpore's
``MS_ASCEND_CHECK_OVERFLOW_MODE``, read by MindSpore 2.2 and earlier).

Where the sources are silent the profile states the model's choice: its ``choices``
(``sim.rounding.Choices``: tininess after rounding, the positive canonical quiet NaN 0x7E00, NaN
to +0 in saturation, binary32 saturating with the device), matmul accumulation in binary32 (the
cube unit's; ``Device.matmul``'s default). Subnormals are kept, never flushed to zero, on every
profile.

Cube-unit operand formats and the bias table: ``cube_bfloat16`` says the cube unit
takes bfloat16 matmul and convolution operands (Atlas 350, A3 and A2, whose Ascend C
Matmul and Conv3D APIs list ``bfloat16_t`` inputs); the other products' cubes take
binary16 (and integers) only. ``bias_table`` says the cube can start its L0C sums from
a bias (Ascend C ``Mmad`` with ``cmatrixInitVal=false, cmatrixSource=true``, the C2
bias buffer); the Mmad page says the Atlas training and inference series support
``cmatrixSource=false`` only.

8-bit (and narrower) float formats, ``eight_bit``: the Atlas 350 only. Ascend C's built-in data
types page lists ``hifloat8_t``, ``fp8_e5m2_t``, ``fp8_e4m3fn_t``, ``fp8_e8m0_t`` and
``fp4x2_e2m1_t`` for the Atlas 350 accelerator card and none of them for the A3, A2, 200I/500 A2,
inference or training series (<https://www.hiascend.com/document/detail/zh/canncommercial/900/API/
ascendcopapi/atlas_ascendc_10_0019.html>); the runtime's ``aclDataType`` page says the same of
``ACL_HIFLOAT8`` .. ``ACL_FLOAT4_E1M2`` (values 34-41, the FP6 types among them): "Atlas 350
加速卡，支持", every other product "不支持" (<https://www.hiascend.com/document/detail/zh/
canncommercial/latest/API/runtimeapi/aclcppdevg_03_1346.html>); ``ACL_FLOAT4_E1M2`` among them is
``float4_e1m2fn`` (``fp4x2_e1m2_t``). HiFloat4 (``hifloat4``) is in neither list, so no profile has it.

The Atlas 350's saturation is set per instruction by its CTRL register (Ascend C ``SetCtrlSpr``,
``asc_set_ctrl``): bit 60 enables the control; bit 48 = 0 then saturates (Inf -> +-MAX, NaN -> 0)
half-precision compute and the conversions to hif8, e8m0, e5m2, e4m3fn, half and bf16, and bit 50 =
1 keeps NaN in those saturating conversions (:func:`ctrl_settings` reads a register value). Binary32
compute is not among what bit 48 covers, so the 350 keeps binary32 in INF/NaN mode when it
saturates (``Choices.saturate_float32`` False), and FP6 and FP4 conversions, which have no Inf or NaN
to map, are not either. The runtime's ``aclrtFloatOverflowMode`` page says the 350 supports INF/NaN
mode only, while the TF adapter's NPULossScaleOptimizer page lists both modes: the profile follows
the latter, so that both can be explored.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .checks import integer
from .rounding import Choices, OverflowMode

__all__ = ["Profile", "get", "names", "PROFILES", "for_soc", "overflow_mode_from_env", "ctrl_settings",
           "CTRL_SATURATED"]

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
    #: The implementation-defined choices of its arithmetic (tininess, the default NaN, NaN in
    #: saturation, binary32's overflow mode): see :class:`sim.rounding.Choices`.
    choices: Choices = Choices()
    matmul_accumulate: type = np.float32
    #: The cube unit takes bfloat16 matmul and convolution operands.
    cube_bfloat16: bool = False
    #: The cube unit can start a matmul's binary32 sums from a bias (the C2 bias table).
    bias_table: bool = False
    #: The 8-bit and narrower float formats the product has (``sim.formats`` names); empty: no FP8 units.
    eight_bit: tuple[str, ...] = ()
    note: str = ""
    #: SoC names of the product (a name ending in ``*`` stands for every name with that prefix).
    socs: tuple[str, ...] = ()

    def describe_modes(self) -> str:
        modes = ", ".join(m.name for m in self.overflow_modes)
        return f"{modes} (default {self.default_overflow_mode.name})"


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("atlas-350", "Atlas 350 加速卡", "Atlas 350 accelerator card",
            True, _BOTH, OverflowMode.INF_NAN, True,
            choices=Choices(saturate_float32=False), cube_bfloat16=True, bias_table=True,
            eight_bit=("hifloat8", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float6_e3m2fn", "float6_e2m3fn",
                       "float4_e2m1fn", "float4_e1m2fn"),
            note="one runtime document says INF/NaN only; the NPULossScaleOptimizer page lists both modes and is "
                 "followed",
            socs=("Ascend950*",)),
    Profile("atlas-a3", "Atlas A3 训练系列产品 / Atlas A3 推理系列产品",
            "Atlas A3 training series / Atlas A3 inference series",
            True, _BOTH, OverflowMode.INF_NAN, True, cube_bfloat16=True, bias_table=True,
            socs=tuple(f"Ascend910_{n}" for n in (9391, 9392, 9381, 9382, 9372, 9362, 9363))),
    Profile("atlas-a2", "Atlas A2 训练系列产品 / Atlas A2 推理系列产品",
            "Atlas A2 training series / Atlas A2 inference series",
            True, _BOTH, OverflowMode.INF_NAN, True, cube_bfloat16=True, bias_table=True,
            socs=("Ascend910B1", "Ascend910B2", "Ascend910B2C", "Ascend910B3", "Ascend910B4", "Ascend910B4-1")),
    Profile("atlas-200i-500-a2", "Atlas 200I/500 A2 推理产品", "Atlas 200I/500 A2 inference products",
            False, _SAT, OverflowMode.SATURATION, False, bias_table=True,
            socs=("Ascend310B1", "Ascend310B2", "Ascend310B3", "Ascend310B4")),
    Profile("atlas-inference", "Atlas 推理系列产品", "Atlas inference series",
            False, _SAT, OverflowMode.SATURATION, False,
            socs=tuple(f"Ascend310P{n}" for n in (1, 2, 3, 4, 5, 7))),
    Profile("atlas-training", "Atlas 训练系列产品", "Atlas training series",
            True, _SAT, OverflowMode.SATURATION, False,
            socs=("Ascend910A", "Ascend910ProA", "Ascend910PremiumA", "Ascend910ProB", "Ascend910B")),
)}


def names() -> list[str]:
    """The profile names, in the NPULossScaleOptimizer page's order."""
    return list(PROFILES)


def get(name: str | Profile) -> Profile:
    """The profile called ``name``; ValueError listing the known ones otherwise."""
    if isinstance(name, Profile):
        return name
    try:
        return PROFILES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None


def for_soc(soc: str) -> Profile:
    """The profile of a SoC name (``Ascend910B3`` -> atlas-a2); ValueError listing the known names."""
    for p in PROFILES.values():
        for name in p.socs:
            if soc == name or (name.endswith("*") and isinstance(soc, str) and soc.startswith(name[:-1])):
                return p
    known = ", ".join(n for p in PROFILES.values() for n in p.socs)
    raise ValueError(f"unknown SoC name {soc!r}; known: {known}")


_TORCH_NPU = ("INF_NAN_MODE_ENABLE", "INF_NAN_MODE_FORCE_DISABLE")
_MINDSPORE = "MS_ASCEND_CHECK_OVERFLOW_MODE"
_MS_MODES = {"SATURATION_MODE": OverflowMode.SATURATION, "INFNAN_MODE": OverflowMode.INF_NAN}


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    text = environ.get(name)
    if text is None or text == "":
        return default
    if text.strip() not in ("0", "1"):
        raise ValueError(f"{name} should be 0 or 1, got {text!r} (torch_npu refuses other values)")
    return text.strip() == "1"


def _torch_npu_mode(p: Profile, environ: Mapping[str, str]) -> OverflowMode | None:
    """torch_npu's IsSupportInfNan: None when neither variable is set."""
    if not any(environ.get(n) for n in _TORCH_NPU):
        return None
    enable, force_disable = _flag(environ, _TORCH_NPU[0], True), _flag(environ, _TORCH_NPU[1], False)
    if p.name == "atlas-350":
        # torch_npu treats Ascend950 as INF/NaN only and ignores both variables; the NPULossScaleOptimizer page lists
        # saturation for the Atlas 350 too, and the simulator follows that page.
        wanted = OverflowMode.INF_NAN if enable and not force_disable else OverflowMode.SATURATION
        if wanted is OverflowMode.SATURATION:
            warnings.warn("atlas-350: torch_npu ignores INF_NAN_MODE_ENABLE / INF_NAN_MODE_FORCE_DISABLE on "
                          "Ascend950 and runs INF/NaN mode; the NPULossScaleOptimizer page lists saturation mode for "
                          "the Atlas 350, and this follows that page: SATURATION", UserWarning, stacklevel=3)
        return wanted
    default_inf_nan = p.default_overflow_mode is OverflowMode.INF_NAN
    if not enable:
        if default_inf_nan and not force_disable:
            raise ValueError(f"{p.name}: INF_NAN_MODE_ENABLE shouldn't be set to 0 on this device; to disable "
                             f"INF/NaN mode, also set INF_NAN_MODE_FORCE_DISABLE=1 (torch_npu's rule)")
        return OverflowMode.SATURATION
    if force_disable:
        return OverflowMode.SATURATION
    return p.default_overflow_mode


def _mindspore_mode(p: Profile, environ: Mapping[str, str]) -> OverflowMode | None:
    text = environ.get(_MINDSPORE)
    if not text:
        return None
    if text not in _MS_MODES:
        raise ValueError(f"{_MINDSPORE} must be one of {', '.join(_MS_MODES)}, got {text!r}")
    mode = _MS_MODES[text]
    if mode not in p.overflow_modes:
        raise ValueError(f"{_MINDSPORE}={text}: {p.name} ({p.product_en}) supports {p.describe_modes()} only")
    return mode


def overflow_mode_from_env(profile: str | Profile, environ: Mapping[str, str] | None = None, *,
                           framework: str | None = None) -> OverflowMode:
    """The overflow mode a framework's runtime picks on ``profile`` from ``environ``
    (default: ``os.environ``).

    torch_npu (``INF_NAN_MODE_ENABLE``, default 1, and ``INF_NAN_MODE_FORCE_DISABLE``,
    default 0; each must be 0 or 1): saturation-only products stay in saturation; on
    products that default to INF/NaN (atlas-a2, atlas-a3), ``INF_NAN_MODE_ENABLE=0`` is an
    error unless ``INF_NAN_MODE_FORCE_DISABLE=1``, and ``INF_NAN_MODE_FORCE_DISABLE=1``
    alone selects saturation. On atlas-350 torch_npu ignores both and runs INF/NaN; the
    seed lists both modes there, so this follows the variables (and warns when they ask
    for saturation). The CANN runtime attribute that torch_npu also consults is not
    modelled: without the variables, the profile's default.

    MindSpore (``MS_ASCEND_CHECK_OVERFLOW_MODE=SATURATION_MODE|INFNAN_MODE``): that mode,
    if the product has it.

    ``framework="torch_npu"`` or ``"mindspore"`` reads only that framework's variables;
    None reads both, and refuses variables of the two that disagree.
    """
    p = get(profile)
    env = os.environ if environ is None else environ
    readers = {"torch_npu": _torch_npu_mode, "mindspore": _mindspore_mode}
    if framework is not None and framework not in readers:
        raise ValueError(f"unknown framework {framework!r}; valid: {', '.join(readers)}, or None for both")
    picked = {}
    for name, read in readers.items():
        if framework in (None, name):
            picked[name] = read(p, env)
    modes = {m for m in picked.values() if m is not None}
    if len(modes) > 1:
        raise ValueError(f"{p.name}: torch_npu's variables select {picked['torch_npu'].name} but "
                         f"{_MINDSPORE} selects {picked['mindspore'].name}")
    return modes.pop() if modes else p.default_overflow_mode


#: What the Atlas 350's CTRL bit 48 saturates: half-precision compute and the conversions into
#: these formats.
CTRL_SATURATED = ("binary16", "bfloat16", "hifloat8", "float8_e8m0fnu", "float8_e5m2", "float8_e4m3fn")
_CTRL_ENABLE, _CTRL_NO_SATURATION, _CTRL_KEEP_NAN = 60, 48, 50


def ctrl_settings(ctrl: int) -> dict[str, object]:
    """The ``Device("atlas-350", ...)`` keywords an Atlas 350 CTRL register value stands for: none
    where bit 60 is clear (the device's overflow mode applies), else ``overflow`` SATURATION where
    bit 48 is 0 and INF_NAN where it is 1, and ``nan_to_zero`` False where bit 50 is 1."""
    ctrl = integer("ctrl", ctrl, 0, 2**64 - 1)
    if not ctrl >> _CTRL_ENABLE & 1:
        return {}
    saturate = not ctrl >> _CTRL_NO_SATURATION & 1
    return {"overflow": OverflowMode.SATURATION if saturate else OverflowMode.INF_NAN,
            "nan_to_zero": not ctrl >> _CTRL_KEEP_NAN & 1}

