"""The FP8 and block scaling recipes, the counterpart of loss scaling for narrow formats: a scale
chosen from a tensor's (or a block's) amax so that scale * x fits the format, as frozen policy
values with a pure transition and a small stateful face (``TensorScaler``). Public as
:mod:`lossscale.training.fp8`'s.

The recipes follow NVIDIA Transformer Engine (``transformer_engine/common/recipe/__init__.py``;
the update in ``common/recipe/delayed_scaling.cu`` and ``recipe_common.cuh``):

- :class:`DelayedScaling` (``margin=0``, ``fp8_format="HYBRID"``, ``amax_history_len=1024``,
  ``amax_compute_algo="max"`` or ``"most_recent"``): each step the tensor's amax is written
  to the history's slot 0; the next scale is ``(fp8_max * 2**-margin) / amax``, amax the
  history's max (fmaxf: NaN passes) or its latest, if amax is finite and positive, else the
  scale is kept (so one Inf amax holds the scale for the history's length); a
  scale that is Inf becomes FLT_MAX; then the history rolls: ``new[i] = old[i+1]``,
  ``new[L-1] = old[0]``, ``new[0] = 0``. The scale a step quantises with comes from the
  steps before it. Arithmetic in binary32, as TE's kernels.
- :class:`CurrentScaling` (TE ``Float8CurrentScaling``, ``amax_epsilon=0``): this step's scale
  from this step's amax, ``fp8_max / max(amax, amax_epsilon)``; an amax that is Inf, NaN or
  0 gives scale 1.
- :class:`MXScaling`: OCP MX blocks of 32 with E8M0 scales (``rule="floor"``, OCP's, or
  ``"rceil"``, TE's and cuBLAS's round-up, or torchao's ``"ceil"`` and ``"even"``: ``sim.mx.RULES``), no
  per-tensor state; :class:`MXFP8Scaling` is TE's ``MXFP8BlockScaling``: E4M3 both ways, RCEIL.
- :class:`BlockScaling` (TE ``Float8BlockScaling``, DeepSeek-V3): a binary32 scale per 1 x 128
  block of activations and gradients and per 128 x 128 tile of weights, power-of-two scales by
  default (``sim.blockfp8``), E4M3 both ways.
- :class:`NVFP4Scaling` (TE ``NVFP4BlockScaling``, arXiv 2509.25149): E2M1 elements, an E4M3 scale
  per 16 values and a binary32 scale per tensor (``sim.nvfp4``), 16 x 16 tiles for weights,
  stochastic rounding for gradients, the random Hadamard transform of the wgrad GEMM's operands.

Every recipe names the GEMMs it quantises (``gemms``: of fprop, dgrad, wgrad; see
:mod:`lossscale.training.operands` for how a matmul's GEMM is found) and the layers it leaves in
binary16 (``keep``: fnmatch patterns of labels, such as ``lm_head`` or ``*.h.1[01].*``: NVFP4's
recipe keeps the last blocks in high precision). Blocks run along each GEMM's contraction axis, as
TE quantises an operand row-wise or column-wise for the GEMM that takes it.

``fp8_format``: ``"HYBRID"`` (TE's default: E4M3 in the forward pass, max 448, E5M2 in the
backward pass, max 57344), ``"E4M3"``, ``"HIF8"`` (HiFloat8 both ways, max 32768: the
Atlas 350's own format, rounded ties-away as its cube unit's ``CAST_ROUND``), or any signed 8-,
6- or 4-bit element format of the catalogue by name, both ways.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, NamedTuple

import numpy as np

from sim import Device, blockfp8, mx, nvfp4
from sim.checks import integer
from sim.formats import EIGHT_BIT, FLOAT4_E2M1FN, FLOAT8_E4M3FN, FLOAT8_E5M2, HIFLOAT8, Format, decode, format_of

from ..policy.core import F32_MAX
from .operands import GEMMS, Operand

__all__: list[str] = []  # public as lossscale.training.fp8's

#: Formats by recipe format and pass: (forward, backward).
FP8_FORMATS: dict[str, tuple[Format, Format]] = {
    "HYBRID": (FLOAT8_E4M3FN, FLOAT8_E5M2), "E4M3": (FLOAT8_E4M3FN, FLOAT8_E4M3FN), "HIF8": (HIFLOAT8, HIFLOAT8),
}
def _sylvester(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


#: Transformer Engine's random Hadamard matrix for NVFP4's wgrad GEMM: diag(signs) @ H16 / 4, its
#: entries +-1/4 (exact in every float format here; ``nvfp4_tensor.py``, ``get_rht_matrix``).
HADAMARD16 = (np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1])[:, None] * _sylvester(16) / 4)

#: The element formats a recipe may name for both passes: the catalogue's signed 8-, 6- and 4-bit ones.
ELEMENT_FORMATS: tuple[Format, ...] = tuple(f for f in EIGHT_BIT if f.signed)
F32 = np.float32


def _format_name(value: str) -> str:
    key = str(value).upper()
    if key in FP8_FORMATS:
        return key
    names = {f.name: f for f in ELEMENT_FORMATS}
    try:
        fmt = format_of(value) if isinstance(value, str) else None
    except ValueError:
        fmt = None
    if fmt is None or fmt.name not in names:
        raise ValueError(f"unknown fp8_format {value!r}; valid: {', '.join(FP8_FORMATS)}, or an element format "
                         f"({', '.join(names)})")
    return fmt.name


def _names(what: str, value: Any, valid: Sequence[str] | None = None) -> tuple[str, ...]:
    """A recipe's list argument: a sequence of names, or one text of comma-separated names."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
        raise ValueError(f"{what} must be names (a list, or text separated by commas), got {value!r}")
    names = tuple(v.strip() for v in items if v.strip())
    wrong = [n for n in names if valid is not None and n not in valid]
    if wrong:
        raise ValueError(f"{what}: unknown {', '.join(map(repr, wrong))}; valid: {', '.join(valid)}")
    return names


@dataclass(frozen=True)
class Recipe:
    """Base of the FP8 recipes: ``initial()``, ``scale(state, amax, fp8_max)`` (the scale this
    step quantises with), ``next(state, amax, fp8_max)`` (the state after the step)."""

    #: Whether the recipe scales whole tensors (the block recipes scale blocks).
    per_tensor: ClassVar[bool] = True
    fp8_format: str = "HYBRID"
    #: The GEMMs it quantises; the others run in binary16.
    gemms: tuple[str, ...] = GEMMS
    #: Labels (fnmatch patterns) whose matmuls run in binary16.
    keep: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "fp8_format", _format_name(self.fp8_format))
        object.__setattr__(self, "gemms", _names("gemms", self.gemms, GEMMS))
        object.__setattr__(self, "keep", _names("keep", self.keep))

    def formats(self) -> tuple[Format, Format]:
        """The (forward, backward) element formats."""
        if self.fp8_format in FP8_FORMATS:
            return FP8_FORMATS[self.fp8_format]
        return (format_of(self.fp8_format),) * 2

    def needs(self) -> tuple[Format, ...]:
        """The narrow formats the recipe computes in (elements and block scales)."""
        return tuple(dict.fromkeys(self.formats()))

    def applies(self, label: str, gemm: str) -> bool:
        """Whether a matmul of ``label`` in ``gemm`` is quantised (a backward matmul not matched
        to its layer: where both backward GEMMs are)."""
        wanted = gemm in self.gemms if gemm != "backward" else {"dgrad", "wgrad"} <= set(self.gemms)
        return wanted and not any(fnmatch.fnmatchcase(label, k) for k in self.keep)

    def initial(self) -> Any:
        raise NotImplementedError

    def scale(self, state: Any, amax: float, fp8_max: float) -> np.float32:
        raise NotImplementedError

    def next(self, state: Any, amax: float, fp8_max: float) -> Any:
        raise NotImplementedError


def _check_reduce(value: Any) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"reduce_amax must be true or false, got {value!r}")


class DelayedState(NamedTuple):
    scale: np.float32
    history: tuple[np.float32, ...]


def _scale_from(amax: np.float32, fp8_max: float, margin: int, previous: np.float32) -> np.float32:
    """TE's compute_scale_from_amax: (fp8_max * 2**-margin) / amax in binary32; kept where amax
    is not finite and positive; FLT_MAX where the quotient is Inf."""
    if not (math.isfinite(amax) and amax > 0):
        return previous
    with np.errstate(over="ignore"):
        s = F32(F32(fp8_max) * F32(2.0**-margin)) / F32(amax)
    return F32(F32_MAX) if math.isinf(s) else s


@dataclass(frozen=True)
class DelayedScaling(Recipe):
    """Transformer Engine's delayed scaling (the module says how)."""

    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    reduce_amax: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_reduce(self.reduce_amax)
        integer("margin", self.margin)
        integer("amax_history_len", self.amax_history_len, 1)
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got {self.amax_compute_algo!r}")

    def initial(self) -> DelayedState:
        return DelayedState(F32(1.0), (F32(0.0),) * self.amax_history_len)

    def scale(self, state: DelayedState, amax: float, fp8_max: float) -> np.float32:
        return state.scale

    def next(self, state: DelayedState, amax: float, fp8_max: float) -> DelayedState:
        history = (F32(amax), *state.history[1:])
        latest = history[0] if self.amax_compute_algo == "most_recent" else F32(np.fmax.reduce(history))
        scale = _scale_from(latest, fp8_max, self.margin, state.scale)
        rolled = (F32(0.0), *history[2:], history[0]) if len(history) > 1 else (F32(0.0),)
        return DelayedState(scale, rolled)


class CurrentState(NamedTuple):
    scale: np.float32


@dataclass(frozen=True)
class CurrentScaling(Recipe):
    """Transformer Engine's current (per-tensor, just-in-time) scaling. ``reduce_amax``: each
    tensor's amax is reduced (MAX) over the data-parallel ranks before its scale is taken, as TE's
    ``Float8CurrentScalingQuantizer`` does with ``with_amax_reduction`` and an
    ``amax_reduction_group`` (``transformer_engine/pytorch/tensor/float8_tensor.py``; the C++
    ``quantize`` all-reduces the amax before computing the scale). The ``Float8CurrentScaling``
    recipe itself has no such field, and the quantizers it makes do not reduce (TE's modules turn
    it on for sequence-parallel inputs, over the tensor-parallel group), hence the default False."""

    amax_epsilon: float = 0.0
    reduce_amax: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_reduce(self.reduce_amax)
        if not (isinstance(self.amax_epsilon, (int, float)) and math.isfinite(self.amax_epsilon)
                and self.amax_epsilon >= 0):
            raise ValueError(f"amax_epsilon must be a finite number >= 0, got {self.amax_epsilon!r}")

    def initial(self) -> CurrentState:
        return CurrentState(F32(1.0))

    def scale(self, state: CurrentState, amax: float, fp8_max: float) -> np.float32:
        a = max(F32(amax), F32(self.amax_epsilon)) if math.isfinite(amax) else F32(amax)
        if not (math.isfinite(a) and a > 0):
            return F32(1.0)
        with np.errstate(over="ignore"):
            s = F32(fp8_max) / a
        return F32(F32_MAX) if math.isinf(s) else s

    def next(self, state: CurrentState, amax: float, fp8_max: float) -> CurrentState:
        return CurrentState(self.scale(state, amax, fp8_max))


@dataclass(frozen=True)
class BlockRecipe(Recipe):
    """Base of the block recipes: no per-tensor state; :meth:`operand` quantises one matrix of a
    GEMM along its contraction axis."""

    per_tensor: ClassVar[bool] = False

    def initial(self) -> tuple:
        return ()

    def scale(self, state: tuple, amax: float, fp8_max: float) -> np.float32:
        return F32(1.0)

    def next(self, state: tuple, amax: float, fp8_max: float) -> tuple:
        return ()

    def prepare(self, dev: Device, stack: np.ndarray, axis: int, gemm: str) -> np.ndarray:
        """An operand (a stack of matrices, contracted along ``axis`` of each) as the recipe
        quantises it in ``gemm``: as it is, but for NVFP4's Hadamard transform."""
        return stack

    def operand(self, dev: Device, x: np.ndarray, fmt: Format, axis: int, role: str, whole: np.ndarray) -> Operand:
        """Matrix ``x`` of a GEMM quantised on ``dev`` along ``axis`` (1: the left operand, 0: the
        right), as ``role`` (activation, weight, gradient); ``whole``: the operand it is a matrix of."""
        raise NotImplementedError


def _flag(name: str, value: Any) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be true or false, got {value!r}")


def _blocked(scales: np.ndarray, axis: int) -> np.ndarray:
    """Per-block scales with the quantised axis last, laid out as matmul_blocks takes them."""
    return np.asarray(scales, F32) if axis == 1 else np.ascontiguousarray(np.asarray(scales, F32).T)


@dataclass(frozen=True)
class MXScaling(BlockRecipe):
    """OCP MX block scaling: E8M0 scales per block of ``block`` values along the contraction
    axis (``rule``: one of ``sim.mx.RULES``: "floor", OCP's, "rceil", the round-up rule); its
    ``scale`` is the tensor's largest block scale's reciprocal."""

    fp8_format: str = "E4M3"
    rule: str = "floor"
    block: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        wrong = [f.name for f in self.needs() if f not in mx.ELEMENTS]
        if wrong:
            raise ValueError(f"MX blocks hold {', '.join(f.name for f in mx.ELEMENTS)} elements, not "
                             f"{', '.join(wrong)}")
        rules = [r for r in mx.RULES if r not in mx.CANN_RULES]  # CANN's take float16 or bfloat16 operands
        if self.rule not in rules:
            raise ValueError(f"MX rule {self.rule!r} does not serve training's binary32 operands; valid: "
                             f"{', '.join(rules)}")
        integer("block", self.block, 1)

    def operand(self, dev: Device, x: np.ndarray, fmt: Format, axis: int, role: str, whole: np.ndarray) -> Operand:
        q = dev.quantize_blocks("mx", x, fmt, axis=axis, block=self.block, rule=self.rule)
        scales = decode(q.scales, "float8_e8m0fnu").astype(F32)
        return Operand(q.elements, fmt, scales, self.block, F32(1), mx.dequantize(q), 1 / scales.astype(np.float64),
                       q.saturated, q.saturated_blocks)


@dataclass(frozen=True)
class MXFP8Scaling(MXScaling):
    """Transformer Engine's ``MXFP8BlockScaling``: MX blocks of 32, E4M3 in both passes, scales by
    the round-up rule (RCEIL, as TE's and cuBLAS's quantisers take them)."""

    rule: str = "rceil"


@dataclass(frozen=True)
class BlockScaling(BlockRecipe):
    """Transformer Engine's ``Float8BlockScaling`` (DeepSeek-V3's recipe): a binary32 scale per
    1 x 128 block of activations and gradients and per 128 x 128 tile of weights, powers of two
    unless ``pow2`` is false; ``amax_epsilon`` the least amax a scale is taken from
    (:mod:`sim.blockfp8`)."""

    fp8_format: str = "E4M3"
    pow2: bool = True
    amax_epsilon: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        wrong = [f.name for f in self.needs() if f not in (FLOAT8_E4M3FN, FLOAT8_E5M2)]
        if wrong:
            raise ValueError(f"block-scaled FP8 holds float8_e4m3fn or float8_e5m2 elements (fp8_format E4M3 or "
                             f"HYBRID), not {', '.join(wrong)}")
        _flag("pow2", self.pow2)
        if not (isinstance(self.amax_epsilon, (int, float)) and math.isfinite(self.amax_epsilon)
                and self.amax_epsilon >= 0):
            raise ValueError(f"amax_epsilon must be a finite number >= 0, got {self.amax_epsilon!r}")

    def operand(self, dev: Device, x: np.ndarray, fmt: Format, axis: int, role: str, whole: np.ndarray) -> Operand:
        q = dev.quantize_blocks("blockfp8", x, fmt, axis=axis, tile=128 if role == "weight" else 1, pow2=self.pow2,
                                eps=self.amax_epsilon)
        scales = _blocked(q.scale_inv, axis)
        return Operand(q.elements, fmt, scales, 128, F32(1), blockfp8.dequantize(q), 1 / scales.astype(np.float64),
                       q.saturated, q.saturated_blocks)


@dataclass(frozen=True)
class NVFP4Scaling(BlockRecipe):
    """Transformer Engine's ``NVFP4BlockScaling``: E2M1 elements with an E4M3 scale per 16 values
    and, with ``two_level``, a binary32 scale per tensor (:mod:`sim.nvfp4`); 16 x 16 tiles for
    weights (``weight_tiles``), stochastic rounding for gradients (``stochastic_gradients``).
    ``hadamard``: both operands of the wgrad GEMM are first multiplied, per 16 values along the
    contraction axis, by TE's 16 x 16 random Hadamard matrix diag(signs) @ H16 / 4 (orthogonal, so
    the product is unchanged but for rounding; its fixed signs are TE's ``get_wgrad_sign_vector``,
    ``transformer_engine/pytorch/tensor/nvfp4_tensor.py``), on the device's cube unit (products
    exact, sums in order in binary32, an axis padded with zeros to 16), and quantised from the
    transformed values, whose amax gives the tensor scale (TE's post-RHT amax)."""

    fp8_format: str = "float4_e2m1fn"
    two_level: bool = True
    weight_tiles: bool = True
    stochastic_gradients: bool = True
    hadamard: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fp8_format != FLOAT4_E2M1FN.name:
            raise ValueError(f"NVFP4's elements are float4_e2m1fn, not {self.fp8_format}")
        for name in ("two_level", "weight_tiles", "stochastic_gradients", "hadamard"):
            _flag(name, getattr(self, name))

    def prepare(self, dev: Device, stack: np.ndarray, axis: int, gemm: str) -> np.ndarray:
        if not (self.hadamard and gemm == "wgrad"):
            return stack
        moved = stack if axis == 1 else np.swapaxes(stack, 1, 2)  # the contraction axis last
        pad = -moved.shape[2] % 16
        moved = np.concatenate([moved, np.zeros((*moved.shape[:2], pad), moved.dtype)], axis=2) if pad else moved
        rows = np.ascontiguousarray(moved).reshape(-1, 16)
        turned = dev.matmul(rows, HADAMARD16.astype(rows.dtype), accumulate=np.float32, out_dtype=np.float32,
                            substitute=False).reshape(moved.shape)
        return turned if axis == 1 else np.ascontiguousarray(np.swapaxes(turned, 1, 2))

    def needs(self) -> tuple[Format, ...]:
        return FLOAT4_E2M1FN, FLOAT8_E4M3FN

    def operand(self, dev: Device, x: np.ndarray, fmt: Format, axis: int, role: str, whole: np.ndarray) -> Operand:
        q = dev.quantize_blocks("nvfp4", x, axis=axis, two_level=nvfp4.tensor_scale_of(whole) if self.two_level
                                else False, tile=16 if role == "weight" and self.weight_tiles else 1,
                                rounding="stochastic" if role == "gradient" and self.stochastic_gradients else None)
        scales = _blocked(decode(q.scales, FLOAT8_E4M3FN).astype(F32), axis)
        with np.errstate(divide="ignore", invalid="ignore"):  # an Inf tensor scale: NaN, as the values
            encode = 1 / (scales.astype(np.float64) * float(q.tensor_scale))
        return Operand(q.elements, fmt, scales, nvfp4.BLOCK, q.tensor_scale, nvfp4.dequantize(q), encode, q.clamped,
                       q.clamped_blocks)


class TensorScaler:
    """The stateful face of a recipe for one tensor: ``get_scale()``, ``scale_for(amax)`` (the
    scale this step uses) and ``update(amax)`` (after the step)."""

    def __init__(self, recipe: Recipe, fp8_max: float) -> None:
        self.recipe, self.fp8_max = recipe, float(fp8_max)
        self.state = recipe.initial()

    def get_scale(self) -> float:
        return float(getattr(self.state, "scale", 1.0))

    def scale_for(self, amax: float) -> float:
        return float(self.recipe.scale(self.state, float(amax), self.fp8_max))

    def update(self, amax: float) -> None:
        if not isinstance(amax, (int, float, np.floating)) or isinstance(amax, bool):
            raise ValueError(f"amax must be a number, got {amax!r}")
        self.state = self.recipe.next(self.state, float(amax), self.fp8_max)

    def reset(self) -> None:
        self.state = self.recipe.initial()


RECIPES: dict[str, type[Recipe]] = {"delayed": DelayedScaling, "current": CurrentScaling, "mx": MXScaling,
                                    "mxfp8": MXFP8Scaling, "block": BlockScaling, "nvfp4": NVFP4Scaling}


def make_recipe(name: str | Recipe, **kwargs: Any) -> Recipe:
    """A recipe by name (:data:`RECIPES`) and its arguments, or a Recipe as it is."""
    if isinstance(name, Recipe):
        if kwargs:
            raise ValueError("recipe arguments go with a recipe name")
        return name
    if not isinstance(name, str) or name not in RECIPES:
        raise ValueError(f"unknown FP8 recipe {name!r}; valid: {', '.join(RECIPES)}")
    valid = [f.name for f in fields(RECIPES[name])]
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ValueError(f"recipe {name} takes no argument {', '.join(map(repr, unknown))}; valid: {', '.join(valid)}")
    return RECIPES[name](**kwargs)
