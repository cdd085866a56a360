"""A training log as a value (its events, one a loss-scale or overflow line), a log format and the
policy of the framework that prints it as values, and the line patterns of each framework's logging
code."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..policy.core import Policy

#: A DeepSpeed run's log that ships with the package (``lossscale/data/README.md`` says how it was
#: made): ``lossscale replay`` on it shows a sparse log's replay.
SAMPLE_LOG = Path(__file__).resolve().parents[1] / "data" / "deepspeed-sample.log"


@dataclass(frozen=True)
class LogEvent:
    """One step of a log: its number where the log says it (None where not), whether it
    overflowed, the scale it ran at and the scale after it (None where the log does not print
    them), its 1-based line; ``hysteresis``: DeepSpeed's hysteresis before the step, where printed or
    implied (a line that reduces the scale says it was 1: ``DynamicLossScaler.update_scale`` reduces
    only then)."""

    step: int | None
    overflow: bool
    scale: float | None
    next_scale: float | None
    line: int
    hysteresis: int | None = None
    #: A gap: steps the log does not print one by one, ``(low, high)`` of them (high None: no
    #: bound); ``step`` is its last step and ``next_scale`` the scale after it, where printed.
    span: tuple[int, int | None] | None = None
    #: Of a gap's steps, how many overflowed (in positions the log does not give; None: the log
    #: says nothing of their outcomes); the others are clean.
    overflows: int | None = 0
    #: How many events just before a gap are among its steps, in their order but with the gap's
    #: steps anywhere around them (the overflow lines between two step counters).
    among: int = 0
    #: The loss scaler that printed the line, where the log names several (apex amp's ``loss scaler K``
    #: with one scaler per loss): each keeps its own scale. None where the log has one.
    scaler: str | None = None

    @property
    def gap(self) -> bool:
        return self.span is not None


@dataclass(frozen=True)
class Log:
    """A parsed log: its ``framework``, its ``events`` in log order, the ``unparsed`` lines (line
    number and text) that spoke of overflow or the loss scale in no form the format has, and
    ``complete``: whether every step between the first event and the last is an event."""

    framework: str
    events: tuple[LogEvent, ...]
    unparsed: tuple[tuple[int, str], ...] = ()
    complete: bool = False
    notes: tuple[str, ...] = ()


_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_BAR = re.compile(r"\|\s*(\d+)/(\d+)\s*\[")  # tqdm: "| 12/100 [00:03<...]" after N finished steps
_DS_REDUCE = re.compile(r"\[(?:deepspeed|deepscale)\] (?:OVERFLOW!|fp16 dynamic loss scale overflow!)"
                        r"(?: Rank \d+)? Skipping step\. Attempted loss scale: " + _NUM + r", reducing to " + _NUM)


_DS_HYST = re.compile(r"\[(?:deepspeed|deepscale)\] OVERFLOW!(?: Rank \d+)? Skipping step\. Attempted loss scale: "
                      + _NUM + r", but hysteresis is (\d+)\. Reducing hysteresis to (\d+)")


_DS_BARE = re.compile(r"\[deepspeed\] OVERFLOW!(?: Rank \d+)? Skipping step\.(?: Gradients are non-finite, "
                      r"weights were not updated\.)?\s*$")


_DS_STEP = re.compile(r"\bstep=(\d+), skipped=(\d+)")


# DeepSpeed's FP16_Optimizer (fused_optimizer.py, unfused_optimizer.py: _update_scale, verbose), and its
# older "Overflow detected" form; the iteration is cur_iter, the number of steps before this one
_DS_ITER = re.compile(r"Grad overflow on iteration:? (\d+)")
_DS_FROM = re.compile(r"(Reducing|Increasing) dynamic loss scale from " + _NUM + r" to " + _NUM)
_DS_STATIC = re.compile(r"Using static loss scale of:? " + _NUM)
# the same function's dynamic form (apex/optimizers/fp16_optimizer.py and DeepSpeed's first FP16_Optimizer):
# S is the scale the step ran at, printed before it is divided
_DS_DYNAMIC = re.compile(r"Using dynamic loss scale of:? " + _NUM)
_DS_QUIET = re.compile(r"No Grad overflow for \d+ iterations")  # said before an Increasing line
_DS_DETECTED = re.compile(r"Overflow detected\. Skipping step\. Attempted loss scale: " + _NUM +
                          r", reducing to " + _NUM)


_APEX = re.compile(r"Gradient overflow\.\s+Skipping step, (?:loss scaler (\d+) )?reducing loss scale to " + _NUM)


# apex/fp16_utils/fp16_optimizer.py, FP16_Optimizer.step (and the copies of it in NVIDIA's examples)
_APEX_FP16 = re.compile(r"(?<!\] )(?<!Rank \d )OVERFLOW! Skipping step\. Attempted loss scale: " + _NUM +
                        r"(?:, reducing to " + _NUM + r")?")  # (releases of 2018 print S alone)


_FS_OVERFLOW = re.compile(r"(?:(?:NOTE: (?:gradient )?|WARNING: )overflow detected, (?:ignoring gradient, )?"
                          r"setting loss scale to: "
                          # --amp (fairseq/optim/amp_optimizer.py, clip_grad_norm): "setting scale to " f"to {s}"
                          r"|AMP: overflow detected, setting scale to (?:to )?)" + _NUM)


# progress lines: key=value pairs (SimpleProgressBar) in fairseq's order, num_updates before loss_scale,
# or the other; fairseq <= 0.6's pipe-separated epoch summaries "| num_updates 10198 | ... | loss_scale 0.500 |"
_FS_SCALE = re.compile(r"\bloss_scale[= ]" + _NUM + r"\b")
_FS_UPDATES = re.compile(r"\bnum_updates[= ](\d+)\b")
_FS_JSON = re.compile(r"(\{.*\"(?:train_)?loss_scale\".*\})")
# the lines of fairseq's logging module (its hydra releases, 0.10 on): "2023-06-13 17:33:01 | INFO | train_inner |"
_FS_LOGGING = re.compile(r"\|\s*[A-Z]+\s*\|\s*(?:train_inner|train)\s*\|")
_MEGATRON = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.* loss scale:? " + _NUM + r" \|(?:.* number of skipped "
                       r"iterations:?\s*(\d+) \|)?")  # the 2019 form has no colons


# MindFormers' MFLossMonitor.print_output_info (mindformers/core/callback/callback.py): one line per
# sink of steps, the step within the epoch, the scale the step ran at (scaling_sens) in binary32
_MINDFORMERS = re.compile(r"Epoch:\[\s*(\d+)/\s*\d+\], step:\[\s*(\d+)/\s*(\d+)\],.*?overflow cond: (True|False), "
                          r"loss_scale: \[?" + _NUM)


# MindYOLO's train step (mindyolo/utils/train_step_factory.py): an overflow it applies anyway
_MINDYOLO = re.compile(r"overflow, still update, loss scale adjust to " + _NUM)


# Colossal-AI's naive AMP optimizer: an overflow, the scale not printed
# Colossal-AI: its low-level ZeRO optimizer's "Found overflow. Skip step" and ShardedOptimizerV2.step's
# "found inf during ShardedOptimV2 step" (zero/sharded_optim/sharded_optim_v2.py), read by its rest where
# a rich console wraps "found" onto the line before
_COLOSSAL = re.compile(r"Found overflow\. Skip step|(?:found )?inf during ShardedOptimV2 step")
_MINDSPORE = re.compile(r"step: (\d+), loss is .*?, overflow is \[?(True|False)\]?, loss scale is \[?" + _NUM + r"\]?")


def _no_arguments(init: float) -> dict[str, Any]:
    return {}


def _unequal(replayed: float, logged: float) -> bool:
    return False


@dataclass(frozen=True)
class LogPolicy:
    """The loss-scale policy a log's framework runs, as a replay needs it.

    ``cls``, the :class:`Policy`; ``init``, ``window`` and ``hysteresis``, the names of its
    initial scale, growth window and hysteresis arguments (None: it has none); ``fixed``,
    arguments fixed for a replay (a replay must not stop at a floor where the log goes on);
    ``bounds(init)``, the arguments that follow the initial scale (a cap or floor the log's scales
    must not meet); ``default_window``, the framework's growth window where the class has no
    default; ``hystereses(log)``, the hysteresis values to try and how they were found;
    ``prints(replayed, logged)``, whether an unequal replayed scale prints as the logged number;
    ``value(logged)``, the scale a printed number stands for."""

    cls: type[Policy]
    init: str
    window: str
    hysteresis: str | None = None
    fixed: dict[str, Any] = field(default_factory=dict)
    bounds: Callable[[float], dict[str, Any]] = _no_arguments
    default_window: int | None = None
    hystereses: Callable[[Log], tuple[list[int], str]] | None = None
    prints: Callable[[float, float], bool] = _unequal
    value: Callable[[float], float] = float


@dataclass(frozen=True)
class LogFormat:
    """One log format: ``sign``, what marks a line as the format's (format detection; None: a
    header marks it); ``words``, what makes a line the reader did not read count as unparsed
    rather than unrelated; ``read(lines, words)``, its reader; ``policy``, the policy of the
    framework that prints it (None: none to check it against)."""

    name: str
    sign: re.Pattern[str] | None
    words: re.Pattern[str] | None
    read: Callable[[Sequence[str], re.Pattern[str] | None], Log]
    policy: LogPolicy | None = None


def _float(text: str) -> float:
    return float(text)


def _fairseq_shows(scale: float, logged: float, places: tuple[int, ...] = (4, 3, 0)) -> bool:
    """Whether a fairseq progress line prints ``scale`` as ``logged``: ``{:g}`` of it rounded to 4
    places (0.10 on; 0.6-0.9: 3 or 0), so 2**20 prints as 1.04858e+06."""
    return any(float(format(round(scale, d), "g")) == logged for d in places)

