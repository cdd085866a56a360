"""Replay a training log: read the loss-scale lines a framework printed, check them against that
framework's own policy, and replay other policies on what the log bounds.

Formats read (the format strings are the frameworks' own; the tests cite file and function):

- ``deepspeed``: ``[deepspeed] OVERFLOW! Rank R Skipping step. Attempted loss scale: S, reducing
  to T`` and its hysteresis form (``deepspeed/runtime/fp16/loss_scaler.py``,
  ``DynamicLossScaler.update_scale``); the older ``[deepspeed] fp16 dynamic loss scale overflow!
  ...`` and ``[deepscale] OVERFLOW! ...`` (fused and unfused optimizers, ZeRO 1/2/3 of earlier
  releases); ``step=N, skipped=M`` (``engine.py``, ``_report_progress``); the FP16_Optimizer's
  ``Grad overflow on iteration N`` with ``Reducing``/``Increasing dynamic loss scale from S to T``
  or ``Using static loss scale of: S`` (``runtime/fp16/fused_optimizer.py`` and
  ``unfused_optimizer.py``, ``_update_scale``), the first FP16_Optimizer's ``Using dynamic loss
  scale of S`` (S before its halving: ``apex/optimizers/fp16_optimizer.py``, ``_update_scale``) and
  the older ``Overflow detected. Skipping step. Attempted loss scale: S, reducing to T``; ZeRO's
  ``reducing to S`` that keeps S says the hysteresis took the overflow (or S is at its floor);
- ``apex``: ``Gradient overflow.  Skipping step, loss scaler K reducing loss scale to T``
  (``apex/amp/handle.py``, ``scale_loss``) and ``fp16_utils``' form without ``loss scaler K``;
  ``OVERFLOW! Skipping step. Attempted loss scale: S, reducing to T``
  (``apex/fp16_utils/fp16_optimizer.py``, ``FP16_Optimizer.step``; 2018 releases print S alone);
  amp's scalers of several losses (``loss scaler K``) are checked apart (a step prints its first
  overflowing loss's line only);
- ``fairseq``: ``NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: T``
  (``fairseq/trainer.py``, ``train_step``; ``WARNING: overflow detected, ...`` of older
  releases) and the progress lines' ``loss_scale`` and ``num_updates`` (simple and JSON bars);
- ``megatron``: ``iteration N/ M | ... loss scale: T | ... number of skipped iterations: K |``
  (``megatron/training/training.py``, ``training_log``; the 2019 form has no colons);
- ``mindspore``: ``epoch: E, step: N, loss is L, overflow is B, loss scale is S`` (the model zoo's
  ``LossCallBack.step_end``, printing ``TrainOneStepWithLossScaleCell``'s outputs); MindFormers'
  ``{ Epoch:[E/n], step:[N/m], ..., overflow cond: B, loss_scale: S`` (``MFLossMonitor``); MindYOLO's
  ``overflow, still update, loss scale adjust to S``;
- ``colossalai``: ``Found overflow. Skip step`` and ShardedOptimizerV2's ``found inf during
  ShardedOptimV2 step`` (an overflow, its scale not printed);
- ``csv``: ``step,scale,overflow`` (the scale each step ran at; overflow 0/1 or true/false).

Megatron-DeepSpeed and GPT-NeoX logs hold DeepSpeed's and Megatron's lines: read as DeepSpeed's
where it prints overflow lines, else as Megatron's. Progress-bar counters (tqdm's ``| N/M [``) give
step numbers to the overflow lines between them. Pastes: a line ``...`` (``[...]``, ``<snip>``)
marks lines left out, whose steps are unknown; a line a terminal wrapped is read as printed (the
wrap's padding dropped, or its rows joined).
Whatever the format, a line that speaks of an overflow or a loss scale and is not read is counted
in ``Log.unparsed`` with its number. A verdict is "consistent" only where at least one logged scale
was compared; a constant scale with no overflow (a bf16 run) is said to be one.

Where the log places every step (each step is an event or implied by its counters:
``Log.complete``), the policy is replayed step by step; otherwise only each overflow's own update
and the growth between overflows are checked, and a log of overflow lines alone that departs may
be consistent once pairs of adjacent lines, one the other's own update, are read swapped (processes
sharing a stream print two out of order): the verdict names the pairs.

Sparse logs: the steps a log does not print one by one are *gaps* (``LogEvent.span``): counted
where counters give their number (DeepSpeed's ``step=N, skipped=M`` every ``steps_per_print``
steps: the overflow lines since the last report, and ``M`` minus the last report's skipped
overflows, of which those without a line are overflows of unknown place; fairseq's
``num_updates``: applied updates), bounded (the overflow lines after the last counter lie within
one counter interval of it) or of unknown length (overflow lines with no counter: any number of
clean steps before each). A gap's steps lie anywhere around the overflow lines between its two
counters (``LogEvent.among``), in their order. Every framework prints each overflow, so a gap
between two lines holds clean steps only; a counter that counts fewer skipped steps than there
are lines since the last one (several ranks printing) leaves its steps unknown.

Counterfactual replay, the model: a step overflows at scale S when its unscaled gradient maximum
g exceeds MAX / S (MAX: the gradient format's largest finite value, 65504 for binary16); so an
overflow at S says g > MAX / S and a clean step g <= MAX / S. Another policy at scale T then
certainly overflows where T >= S on an overflow step and is certainly clean where T <= S on a
clean step; every other step is unknown. Where the log does not give S, it bounds it
(:func:`scale_bounds`: a clean step multiplies the scale by 1 to the growth factor, an overflow
by the backoff factor to 1, from every scale the log prints, forward and backward), and the
certainty takes the bound that holds for every S within it. After an unknown step the other
policy's state branches (it overflowed, or not): the replay keeps the set of states it may be in
(a step is certain only when it is certain in every one), up to ``MAX_STATES``; past that the
state is lost and every later step is unknown. Through a gap it follows every order of the gap's
steps around its overflow lines and every length the gap may have (a gap of unknown length
usually loses the state: the other policy may have grown without bound). A gap's row holds the
decision that is certain for every one of its steps, and the scales the policy may hold as the
gap's window begins. The framework's own scales are taken from its replay only where every growth
window the log allows was tried and they agree; elsewhere from the log's own numbers.

Exact replay: where the log prints a scale and every gap but the last has a known or bounded length,
the bounds above give way to the framework's own run, followed beside the other policy's. Every run
of the framework's policy that prints the log is tried (each growth window from 1 to one past the
log's steps, each hysteresis from 1 to 4 (more where the log needs it), each initial scale that
growths and backoffs take to the first printed scale; the framework's defaults for the rest), through
every order of each gap's steps, and only the runs that reproduce the whole log are kept (forward
through the log, then back). The
other policy's step then sees the exact scale S of each such run, and a step is certain exactly when
every kept run and every outcome the gradients allow agree on it: nothing the log leaves open is
certain and nothing it decides is left open (:func:`exact_fit` names the runs kept). Windows that
behave alike are followed as one until one of them grows, so the cost is the number of distinct
runs, not of windows; past ``MAX_RUNS`` or ``MAX_JOINT`` places the replay falls back to the bounds.

The package's files: ``log`` (a log, a format and a framework's policy as values, the line
patterns), ``formats`` (``LOG_FORMATS``, one entry per format, and ``read_log``), ``parsers``
(each framework's lines), ``consistency`` (a log against a framework's policy),
``steps`` (a policy's decisions over a log's steps), ``counterfactual`` (another policy replayed)
and ``fit`` (the arguments that reproduce a log exactly; its search limits ``MAX_RUNS`` and
``MAX_JOINT`` are set there: ``lossscale.replay.fit.MAX_RUNS``).
"""

from .consistency import Consistency, Departure, consistency, framework_policy
from .counterfactual import BINARY16_MAX, MAX_STATES, bounds, counterfactual, log_steps, logged_scales, scale_bounds
from .fit import exact_fit
from .formats import LOG_FORMATS, read_log
from .log import SAMPLE_LOG, Log, LogEvent
from .steps import Decision

__all__ = ["LogEvent", "Log", "read_log", "LOG_FORMATS", "Departure", "Consistency", "consistency", "Decision",
           "counterfactual", "bounds", "MAX_STATES", "BINARY16_MAX", "framework_policy", "logged_scales",
           "log_steps", "scale_bounds", "SAMPLE_LOG", "exact_fit"]
