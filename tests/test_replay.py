"""``lossscale.replay``: logs read per format, the log's own policy replayed on it, and the
counterfactual replay checked against the ground truth of random gradient maxima.

The test logs are written here in each framework's own format strings:

- DeepSpeed: printed by the installed ``deepspeed/runtime/fp16/loss_scaler.py``,
  ``DynamicLossScaler.update_scale`` itself (its logger captured), with ``engine.py``
  ``_report_progress``'s ``step={step}, skipped={skipped_steps}, lr={lr}, mom={mom}`` after each step;
  the older ``[deepscale] OVERFLOW! Rank {} Skipping step. Attempted loss scale: {}, reducing to {}``
  is ``deepspeed/runtime/zero/stage3.py`` (``_overflow_clean_up``) of 2021 releases;
- apex: ``apex/amp/handle.py``, ``scale_loss``: ``"Gradient overflow.  Skipping step, loss scaler "
  "{} reducing loss scale to {}"`` (two spaces after the full stop);
- fairseq: ``fairseq/trainer.py``, ``train_step``: ``f"NOTE: gradient overflow detected, ignoring
  gradient, {str(e)}"`` with ``e`` the ``OverflowError("setting loss scale to: " + str(S))`` of
  ``fairseq/optim/dynamic_loss_scaler.py`` ``check_overflow``; the progress line is
  ``fairseq/logging/progress_bar.py`` ``SimpleProgressBar.log``: ``"{}:  {:5d} / {:d} {}"`` with
  ``key=value`` pairs joined by ``", "``, numbers as ``{:g}``;
- Megatron-LM: ``megatron/training/training.py``, ``training_log``: ``' iteration {:8d}/{:8d} |'``,
  ``f' loss scale: {loss_scale:.1f} |'``, ``' number of skipped iterations: {:3d} |'``;
- MindSpore: the model zoo's ``LossCallBack.step_end`` (``src/callbacks.py``): ``"time: {} local_rank:
  {}, epoch: {}, step: {}, loss is {}, overflow is {}, loss scale is {}"``.
"""

from __future__ import annotations

import io
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lossscale.policies import ApexPolicy, DeepSpeedPolicy, FairseqPolicy, TorchPolicy
from lossscale.replay import LogEvent, bounds, consistency, counterfactual, read_log

MAX = 65504.0


def deepspeed_log(overflows: list[bool], **kwargs) -> str:
    """The real DynamicLossScaler's own lines for the sequence, with the engine's report after each step."""
    ls = pytest.importorskip("deepspeed.runtime.fp16.loss_scaler")
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] "
                                           "%(message)s"))
    ls.logger.addHandler(handler)
    level = ls.logger.level
    ls.logger.setLevel(logging.INFO)
    scaler = ls.DynamicLossScaler(**kwargs)
    skipped = 0
    rank, ls.dist.get_rank = ls.dist.get_rank, lambda *a: 0  # one process, no process group
    try:
        for step, overflow in enumerate(overflows, start=1):
            scaler.update_scale(overflow)
            skipped += overflow
            buf.write(f"[Rank 0] step={step}, skipped={skipped}, lr=[0.001], mom=[(0.9, 0.999)]\n")
    finally:
        ls.logger.removeHandler(handler)
        ls.logger.setLevel(level)
        ls.dist.get_rank = rank
    return buf.getvalue()


def apex_log(overflows: list[bool], policy: ApexPolicy) -> str:
    """apex's overflow line after each overflow, a tqdm bar after each step (steps numbered)."""
    state, out = policy.initial(), []
    for step, overflow in enumerate(overflows, start=1):
        state = policy.next(state, not overflow)
        if overflow:
            out.append(f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {state.scale}")
        out.append(f" {100 * step // len(overflows):3d}%|####      | {step}/{len(overflows)} [00:01<00:02,  9.9it/s]")
    return "\n".join(out) + "\n"


def fairseq_log(overflows: list[bool], policy: FairseqPolicy) -> str:
    """fairseq's NOTE line per overflow and a progress line (log_interval 1) per applied update."""
    state, out, updates = policy.initial(), [], 0
    for overflow in overflows:
        state = policy.next(state, not overflow)
        if overflow:
            out.append("2024-01-01 00:00:00 | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring "
                       f"gradient, setting loss scale to: {state.scale}")
        else:
            updates += 1
            out.append(f"2024-01-01 00:00:00 | INFO | train_inner | epoch 001:  {updates:5d} / 100 loss=7.1, "
                       f"nll_loss=6.9, loss_scale={float(format(round(state.scale, 4), 'g')):g}, "
                       f"num_updates={updates}, lr=0.0005")
    return "\n".join(out) + "\n"


SEQ = [True, True] + [False] * 7 + [True] + [False] * 11 + [True, True, True, False, False]


def test_deepspeed_lines_parse_to_their_events() -> None:
    log = read_log(deepspeed_log([True, True, False], init_scale=2**16, scale_window=5, min_scale=1,
                                 delayed_shift=2, consecutive_hysteresis=False))
    assert log.framework == "deepspeed" and log.complete and not log.unparsed
    assert [(e.step, e.overflow, e.scale, e.next_scale, e.hysteresis) for e in log.events] == [
        (1, True, 65536, 65536, 2), (2, True, 65536, 32768, None), (3, False, None, None, None)]
    assert [e.line for e in log.events] == [1, 3, 5]  # an overflow step is its overflow line


def test_older_deepspeed_and_step_less_lines() -> None:
    text = ("[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4294967296, reducing to 2147483648\n"
            "[deepspeed] fp16 dynamic loss scale overflow! Skipping step. Attempted loss scale: 2147483648.0, "
            "reducing to 1073741824.0\n")
    log = read_log(text)
    assert [(e.step, e.scale, e.next_scale) for e in log.events] == [(None, 2**32, 2**31), (None, 2**31, 2**30)]
    assert not log.complete  # nothing numbers the steps: only the chain is checked
    assert consistency(log).consistent


@pytest.mark.parametrize("text, framework, expected", [
    ("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0\n", "apex",
     [(None, True, None, 32768.0)]),
    ("Gradient overflow.  Skipping step, reducing loss scale to 16.0\n", "apex", [(None, True, None, 16.0)]),
    ("NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0\n"
     "epoch 001:      1 / 10 loss=3.2, loss_scale=64, num_updates=1, lr=0.1\n", "fairseq",
     [(None, True, None, 64.0), (1, False, None, 64.0)]),
    ('{"epoch": 1, "update": 0.1, "loss": "3.2", "loss_scale": "128", "num_updates": "1"}\n', "fairseq",
     [(1, False, None, 128.0)]),
    (" [2024-01-01 00:00:00.000000] iteration        1/     100 | consumed samples:          8 | loss scale: "
     "2147483648.0 | number of skipped iterations:   1 | number of nan iterations:   0 |\n"
     " [2024-01-01 00:00:01.000000] iteration        2/     100 | consumed samples:         16 | loss scale: "
     "2147483648.0 | number of skipped iterations:   0 | number of nan iterations:   0 |\n", "megatron",
     [(1, True, None, 2.0**31), (2, False, None, 2.0**31)]),
    ("time: Mon local_rank: 0, epoch: 1, step: 7, loss is 2.5, overflow is False, loss scale is 65536.0\n",
     "mindspore", [(7, False, 65536.0, None)]),
    ("step,scale,overflow\n1,1024,1\n2,512,0\n", "csv", [(1, True, 1024.0, None), (2, False, 512.0, None)]),
])
def test_each_format_parses(text: str, framework: str, expected: list) -> None:
    log = read_log(text)
    assert log.framework == framework and not log.unparsed
    assert [(e.step, e.overflow, e.scale, e.next_scale) for e in log.events] == expected


def test_malformed_lines_are_counted_with_their_numbers() -> None:
    text = ("step,scale,overflow\n1,1024,1\n2,lots,0\n3,512,maybe\n4,512,0\n")
    log = read_log(text)
    assert [n for n, _ in log.unparsed] == [3, 4] and len(log.events) == 2
    ds = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: lots\n" + \
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 8, reducing to 4\n"
    assert [n for n, _ in read_log(ds).unparsed] == [1]


def test_unknown_and_mixed_formats_are_refused() -> None:
    with pytest.raises(ValueError, match="no known log format.*deepspeed, apex, fairseq"):
        read_log("hello\nworld\n")
    with pytest.raises(ValueError, match="mixed log formats: deepspeed .*apex"):
        read_log("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 8, reducing to 4\n"
                 "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 2.0\n")
    with pytest.raises(ValueError, match="unknown log format 'x'"):
        read_log("a\nb\n", format="x")


@pytest.mark.parametrize("kwargs", [
    dict(init_scale=2**16, scale_window=5, min_scale=1, delayed_shift=2, consecutive_hysteresis=False),
    dict(init_scale=2**20, scale_window=3, min_scale=1, delayed_shift=1, consecutive_hysteresis=False),
])
def test_deepspeed_replays_its_own_log(kwargs: dict) -> None:
    text = deepspeed_log(SEQ, **kwargs)
    check = consistency(read_log(text))
    assert check.consistent and check.compared >= 6, check.verdict()
    assert check.policy.init_scale == kwargs["init_scale"] and check.policy.delayed_shift == kwargs["delayed_shift"]
    # an altered log: a backoff that halves twice is named at its line
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "reducing to" in line)
    old = lines[at].rsplit(" ", 1)
    lines[at] = f"{old[0]} {int(old[1]) // 2}"
    bad = consistency(read_log("\n".join(lines) + "\n"))
    assert not bad.consistent and bad.departures[0].line == at + 1, bad.verdict()


@pytest.mark.parametrize("make, policy", [(apex_log, ApexPolicy(init_scale=2.0**16, scale_window=4)),
                                          (fairseq_log, FairseqPolicy(init_scale=128.0, scale_window=4))])
def test_apex_and_fairseq_replay_their_own_logs(make, policy) -> None:
    text = make(SEQ, policy)
    check = consistency(read_log(text))
    assert check.consistent and check.compared >= 5, check.verdict()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "overflow" in line.lower() and i > 3)
    lines[at] = lines[at].replace("to: ", "to: 1").replace("scale to ", "scale to 1")
    bad = consistency(read_log("\n".join(lines) + "\n"))
    assert not bad.consistent and bad.departures[0].line == at + 1, bad.verdict()


# -- the counterfactual property: never certain where the bounds leave a step open ------------------

def _possible(lo: float, hi: float, t: float) -> set[str]:
    """Exact-arithmetic oracle: which outcomes some g in (lo, hi] allows at scale t (overflow: g * t > MAX)."""
    from fractions import Fraction
    out = set()
    if hi == float("inf") or Fraction(hi) * Fraction(t) > Fraction(MAX):
        out.add("overflow")
    if Fraction(lo) * Fraction(t) < Fraction(MAX):
        out.add("clean")
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(-30, 12), min_size=1, max_size=60), st.integers(1, 4), st.integers(1, 4),
       st.sampled_from([10, 14, 18]), st.sampled_from([8, 16, 24]))
def test_counterfactual_is_never_certain_where_the_log_leaves_it_open(log2g, window, other_window, init_log,
                                                                      other_log) -> None:
    grads = [2.0**x for x in log2g]
    logging_policy = DeepSpeedPolicy(init_scale=2.0**init_log, scale_window=window, raise_error_at_min_scale=False)
    state, events = logging_policy.initial(), []
    for i, g in enumerate(grads, start=1):  # the logging run: overflow iff g * S > MAX
        s = state.scale
        overflow = g * s > MAX
        events.append(LogEvent(i, overflow, s, None, i))
        state = logging_policy.next(state, not overflow)
    from lossscale.replay import Log
    log = Log("csv", tuple(events), (), True)
    scales = [e.scale for e in events]
    other = TorchPolicy(init_scale=2.0**other_log, growth_interval=other_window)
    decisions = counterfactual(log, other, scales)
    truth = other.initial()
    single = True
    for d, g, (lo, hi) in zip(decisions, grads, bounds(log, scales), strict=True):
        t = float(truth.scale)
        overflow = g * t > MAX
        assert t in d.scales  # the true state is among those followed
        if d.decision != "unknown":
            assert d.decision == ("overflow" if overflow else "clean")
        single = single and len(d.scales) == 1
        if single:  # one state: certain exactly where the bounds allow one outcome
            possible = _possible(lo, hi, t)
            assert (d.decision != "unknown") == (len(possible) == 1), (lo, hi, t, d)
        truth = other.next(truth, not overflow)
