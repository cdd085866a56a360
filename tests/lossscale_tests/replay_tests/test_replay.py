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

import csv
import io
import json
import logging
import re

import pytest
from framework_logs import DS, deepspeed_log, deepspeed_run  # tests/ is on the path (tests/conftest.py)
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from lossscale.app.cli import main
from lossscale.app.files import MANIFEST
from lossscale.policy.ascend import ExponentialUpdate, FixedLossScale
from lossscale.policy.frameworks import ApexPolicy, DeepSpeedPolicy, FairseqPolicy, TorchPolicy
from lossscale.replay import LOG_FORMATS, LogEvent, bounds, consistency, counterfactual, exact_fit, log_steps, read_log

MAX = 65504.0


#: The sample log the package ships (``lossscale.replay.SAMPLE_LOG``): :func:`sample_log` wrote it.
SAMPLE_ARGS = dict(init_scale=2**16, scale_window=50, min_scale=1, delayed_shift=2, consecutive_hysteresis=False)


def sample_log() -> str:
    """A 300-step DeepSpeed run as its log shows it: the installed ``DynamicLossScaler`` prints
    its overflow lines itself (``update_scale``, binary16: with the scales), the engine's
    ``_report_progress`` line every ``steps_per_print`` = 10 steps through ``log_dist`` (``[Rank 0]``),
    both through DeepSpeed's logger format (``deepspeed/utils/logging.py``), time stamps one second
    a step from a fixed start. The gradient maxima: a seeded random walk from 2**-5.5 with spikes."""
    import datetime

    import numpy as np

    ls = pytest.importorskip("deepspeed.runtime.fp16.loss_scaler")
    clock = {"step": 0}
    start = datetime.datetime(2024, 5, 1, 12, 0, 0)

    class Stamped(logging.Formatter):
        def formatTime(self, record, datefmt=None):  # noqa: N802 - logging's name
            stamp = start + datetime.timedelta(seconds=clock["step"], milliseconds=137)
            return stamp.strftime("%Y-%m-%d %H:%M:%S,") + f"{stamp.microsecond // 1000:03d}"

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(Stamped("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"))
    ls.logger.addHandler(handler)
    level, rank = ls.logger.level, ls.dist.get_rank
    ls.logger.setLevel(logging.INFO)
    ls.dist.get_rank = lambda *a: 0
    rng = np.random.default_rng(2024)
    log2g = -4.0 + np.cumsum(rng.normal(0, 0.08, 300)) + (rng.random(300) < 0.04) * rng.uniform(4, 10, 300)
    try:
        scaler, skipped = ls.DynamicLossScaler(**SAMPLE_ARGS), 0
        for step, x in enumerate(log2g, start=1):
            clock["step"] = step
            overflow = bool(2.0**x * scaler.cur_scale > MAX)
            scaler.update_scale(overflow)
            skipped += overflow
            if step % 10 == 0:
                stamp = Stamped().formatTime(None)
                buf.write(f"[{stamp}] [INFO] [logging.py:107:log_dist] [Rank 0] step={step}, skipped={skipped}, "
                          f"lr=[0.0001], mom=[(0.9, 0.999)]\n")
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
        (1, True, 65536, 65536, 2), (2, True, 65536, 32768, 1),  # a reduction: hysteresis 1
        (3, False, None, None, None)]
    assert [e.line for e in log.events] == [1, 3, 5]  # an overflow step is its overflow line


def test_older_deepspeed_and_step_less_lines() -> None:
    text = ("[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4294967296, reducing to 2147483648\n"
            "[deepspeed] fp16 dynamic loss scale overflow! Skipping step. Attempted loss scale: 2147483648.0, "
            "reducing to 1073741824.0\n")
    log = read_log(text)
    assert [(e.step, e.scale, e.next_scale) for e in log.events if not e.gap] == [(None, 2**32, 2**31),
                                                                                  (None, 2**31, 2**30)]
    assert [e.span for e in log.events if e.gap] == [(0, None)] * 2  # unknown: no counter counts the steps
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
    assert [(e.step, e.overflow, e.scale, e.next_scale) for e in log.events if not e.gap] == expected


def test_malformed_lines_are_counted_with_their_numbers() -> None:
    text = ("step,scale,overflow\n1,1024,1\n2,lots,0\n3,512,maybe\n4,512,0\n")
    log = read_log(text)
    assert [n for n, _ in log.unparsed] == [3, 4] and len([e for e in log.events if not e.gap]) == 2
    assert [e.span for e in log.events if e.gap] == [(2, 2)]  # steps 2 and 3: their lines were not read
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


# -- the command: lossscale replay LOG --out DIR --manager ... ----------------------------------------



def replay(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()  # not what DeepSpeed printed on import
    code = main(["replay", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_replay_command_writes_what_counterfactual_says(capsys, tmp_path) -> None:
    text, truth = deepspeed_run(SEQ, **DS)
    path = tmp_path / "ds.log"
    path.write_text(text)
    out = tmp_path / "replay"
    code, stdout, err = replay(capsys, str(path), "--manager", "torch", "--manager", "exponential", "--out", str(out),
                               "--manager-arg", "torch:growth_interval=3", "--manager-arg",
                               "exponential:init_loss_scale=2**20", "--manager-arg", "exponential:incr_every_n_steps=4")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "replay.csv", "replay.png", "summary.json"]
    log = read_log(path)
    lines = stdout.splitlines()
    # each overflow line prints two scales (attempted, and reduced to or kept); the short log fits
    # windows 4 to 6 alike, so the window is not pinned, and the scales they disagree on are unknown
    assert re.fullmatch(r"consistent with deepspeed's policy \(DeepSpeedPolicy: init_scale 65536, scale_window \d+, "
                        rf"delayed_shift 2\): all {2 * sum(SEQ)} logged scales reproduced \(\d settings fit the log "
                        r"equally well; the steps whose scale they disagree on are unknown\)", lines[1]), lines[1]
    assert lines[-1] == f"wrote {out}: replay.csv, replay.png, summary.json"
    rows = list(csv.DictReader((out / "replay.csv").open()))
    managers = {"torch": TorchPolicy(growth_interval=3),  # the framework's defaults otherwise
                "exponential": ExponentialUpdate(init_loss_scale=2.0**20, incr_every_n_steps=4)}
    assert tuple(rows[0]) == ("step", "line", "overflow", "scale", "steps", *(f"{m}_{c}" for m in managers
                                                                     for c in ("decision", "scale_low", "scale_high")))
    assert [int(r["step"]) for r in rows] == list(range(1, len(SEQ) + 1))
    assert [r["overflow"] == "1" for r in rows] == SEQ  # what the real scaler was told
    known = [(float(r["scale"]), t) for r, t in zip(rows, truth, strict=True) if r["scale"]]
    assert all(s == t for s, t in known)  # the real scaler's scale before each step, where the log pins it
    assert all(r["scale"] for r in rows if r["overflow"] == "1") and len(known) >= len(SEQ) - 6
    summary = json.loads((out / "summary.json").read_text())
    seen: set[str] = set()
    for name, policy in managers.items():
        direct = counterfactual(log, policy)
        assert [r[f"{name}_decision"] for r in rows] == [d.decision for d in direct]
        assert [float(r[f"{name}_scale_low"]) for r in rows] == [min(d.scales) for d in direct]
        assert [float(r[f"{name}_scale_high"]) for r in rows] == [max(d.scales) for d in direct]
        seen |= {d.decision for d in direct}
        entry = next(m for m in summary["managers"] if m["name"] == name)
        assert entry["decisions"] == {k: sum(d.decision == k for d in direct) for k in ("overflow", "clean", "unknown")}
    assert seen == {"clean", "overflow", "unknown"}  # not a comparison of all-unknown columns
    assert summary["consistency"]["consistent"] and summary["placed_steps"] == len(SEQ)
    assert summary["unparsed_lines"] == 0 and summary["counted_steps"] == summary["unknown_gaps"] == 0
    assert summary["overflow_steps"] == sum(SEQ) and summary["format"] == "deepspeed"
    # lossscale plot redraws the figure, byte for byte
    first = (out / "replay.png").read_bytes()
    (out / "replay.png").unlink()
    assert main(["plot", str(out)]) == 0 and (out / "replay.png").read_bytes() == first


def test_replay_decisions_worked_by_hand(capsys, tmp_path) -> None:
    """DeepSpeed at 2**16 (no hysteresis): clean, clean, overflow (to 2**15), clean. The log pins the
    scale of steps 3 and 4 only; a clean step at most doubles it, so step 1 ran at 2**14 to 2**16 and
    step 2 at 2**15 to 2**16 (a growth window of 1 from 2**14 fits the log as well as DeepSpeed's
    1000). torch from 2**10: clean where its scale is at most the least the logged one can be; at
    the overflow its lower scale may or may not overflow (unknown), so it holds 2**9 or 2**10, both
    at most 2**15: clean. fixed at 2**16: unknown on steps 1 and 2 (the logged scale may have been
    below it), overflow where the log overflowed at 2**16, unknown at the last step (2**16 above the
    logged 2**15 on a clean step)."""
    text, truth = deepspeed_run([False, False, True, False], init_scale=2**16, scale_window=1000, min_scale=1,
                                delayed_shift=1, consecutive_hysteresis=False)
    assert truth == [2**16, 2**16, 2**16, 2**15]
    path = tmp_path / "ds.log"
    path.write_text(text)
    out = tmp_path / "r"
    code, _, err = replay(capsys, str(path), "--manager", "torch", "--manager", "fixed", "--manager-arg",
                          "torch:init_scale=2**10", "--manager-arg", "fixed:loss_scale=2**16", "--out", str(out))
    assert code == 0, err
    rows = [tuple(r.values())[5:] for r in csv.DictReader((out / "replay.csv").open())]
    a, b, c = "1024.0", "512.0", "65536.0"
    assert rows == [("clean", a, a, "unknown", c, c), ("clean", a, a, "unknown", c, c),
                    ("unknown", a, a, "overflow", c, c), ("clean", b, a, "unknown", c, c)]


def test_replay_names_the_departure(capsys, tmp_path) -> None:
    lines = deepspeed_log(SEQ, **DS).splitlines()
    at = next(i for i, line in enumerate(lines) if "reducing to" in line)
    head, value = lines[at].rsplit(" ", 1)
    lines[at] = f"{head} {int(value) // 2}"  # a backoff that halves twice
    path = tmp_path / "edited.log"
    path.write_text("\n".join(lines) + "\n")
    code, stdout, _ = replay(capsys, str(path), "--out", str(tmp_path / "r"))
    verdict = stdout.splitlines()[1:3]
    assert code == 0 and verdict[0].startswith("inconsistent with deepspeed's policy (DeepSpeedPolicy: ")
    assert verdict[1].startswith(f"departs at line {at + 1} (step ") and "the log's scale after the step" in verdict[1]


def test_replay_of_a_csv_log_has_no_framework_policy(capsys, tmp_path) -> None:
    path = tmp_path / "scales.csv"
    path.write_text("step,scale,overflow\n1,1024,1\n2,512,0\n3,512,0\n")
    code, stdout, _ = replay(capsys, str(path), "--manager", "fixed", "--manager-arg", "loss_scale=512",
                             "--out", str(tmp_path / "r"))
    assert code == 0 and "csv log: no framework policy to check it against" in stdout
    rows = list(csv.DictReader((tmp_path / "r" / "replay.csv").open()))
    assert [r["fixed_decision"] for r in rows] == ["unknown", "clean", "clean"]  # 512 < 1024 on the overflow step


@pytest.mark.parametrize("argv, message", [
    (["missing.log"], "no log file 'missing.log'; give the path of a training log"),
    (["ds.log", "--format", "nginx"], "argument --format: invalid choice: 'nginx' (choose from 'auto', 'deepspeed'"),
    (["hello.log"], "no known log format found"),
    (["header.csv"], "'header.csv' holds no loss-scale events in the csv format; valid formats: deepspeed, apex"),
    (["ds.log", "--format", "apex"], "'ds.log' holds no loss-scale events in the apex format"),
    (["ds.log", "--manager", "gradscaler"], "argument --manager: invalid choice: 'gradscaler' (choose from 'fixed'"),
    (["ds.log", "--manager-arg", "init_scale=2"], "--manager-arg goes with a --manager"),
    (["ds.log", "--manager", "torch", "--manager-arg", "window=2"], "manager 'torch' takes no argument 'window'"),
    (["ds.log", "--manager", "torch", "--manager-arg", "apex:scale_window=2"], "names manager 'apex', which this"),
    (["ds.log"], "the following arguments are required: --out"),
])
def test_replay_bad_input_is_one_line_exit_2_nothing_written(capsys, tmp_path, monkeypatch, argv, message) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.log").write_text(deepspeed_log([False, True, False], **DS))
    (tmp_path / "hello.log").write_text("hello\nworld\n")
    (tmp_path / "header.csv").write_text("step,scale,overflow\n")
    (tmp_path / "steps.log").write_text("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 8, reducing "
                                        "to 4\n")  # no step counters: the steps are not placed
    out = [] if "--out" in message else ["--out", "out"]
    code, stdout, err = replay(capsys, *argv, *out)
    assert code == 2 and stdout == "" and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("lossscale: error: ") and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.log", "header.csv", "hello.log", "steps.log"]


def test_replay_refuses_a_full_folder_without_force(capsys, tmp_path) -> None:
    path = tmp_path / "ds.log"
    path.write_text(deepspeed_log([False, True, False], **DS))
    out = tmp_path / "r"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    for force in ([], ["--force"]):  # the user's file: refused either way, and left as it was
        code, _, err = replay(capsys, str(path), "--out", str(out), *force)
        assert code == 2 and "did not write (keep.txt)" in err and (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    assert replay(capsys, str(path), "--out", str(out))[0] == 0
    code, _, err = replay(capsys, str(path), "--out", str(out))
    assert code == 2 and "use --force" in err
    assert replay(capsys, str(path), "--out", str(out), "--force")[0] == 0
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "replay.csv", "replay.png", "summary.json"]


# -- more of the frameworks' own lines (issue 32, items 5-10) ------------------------------------------

_DS_FMT = "[2024-01-01 00:00:00,000] [INFO] [{}] {}"


def test_deepspeed_fp16_optimizer_lines() -> None:
    """DeepSpeed's FP16_Optimizer without ZeRO (``runtime/fp16/fused_optimizer.py``, ``_update_scale``
    with ``verbose``): ``logger.info(f"\\nGrad overflow on iteration {cur_iter}")`` (the newline
    breaks the record in two), ``Reducing dynamic loss scale from {prev} to {cur}``; on growth
    ``No Grad overflow for {window} iterations`` and ``Increasing dynamic loss scale from ..``;
    cur_iter counts the steps before this one. The older ``[Rank 0] Overflow detected. Skipping
    step. Attempted loss scale: S, reducing to T`` too."""
    where = "fused_optimizer.py:413:_update_scale"
    text = "\n".join([
        _DS_FMT.format(where, ""), "Grad overflow on iteration 12",
        _DS_FMT.format(where, "Reducing dynamic loss scale from 65536 to 32768.0"),
        _DS_FMT.format(where, "No Grad overflow for 4 iterations"),
        _DS_FMT.format(where, "Increasing dynamic loss scale from 32768.0 to 65536.0"),
        "[Rank 0] Overflow detected. Skipping step. Attempted loss scale: 65536.0, reducing to 32768.0", ""])
    log = read_log(text)
    assert log.framework == "deepspeed" and not log.unparsed
    assert [(e.step, e.overflow, e.scale, e.next_scale) for e in log.events if not e.gap] == [
        (13, True, 65536, 32768), (None, False, 32768, 65536), (None, True, 65536, 32768)]
    check = consistency(log)
    assert check.consistent and check.compared > 0, check.verdict()


def test_deepspeed_hysteresis_is_carried_between_unplaced_overflow_lines() -> None:
    """The real DynamicLossScaler with delayed_shift 2, its step counters dropped (a log of overflow
    lines only): each 'reducing to' line follows a 'Reducing hysteresis to 1' one, and its own update
    (a reduction happens only at hysteresis 1) is the policy's: consistent, no departure."""
    text = deepspeed_log(SEQ, **DS)
    sparse = "\n".join(line for line in text.splitlines() if "step=" not in line) + "\n"
    log = read_log(sparse)
    assert not log.complete and sum(e.overflow for e in log.events) == sum(SEQ)
    check = consistency(log)
    assert check.consistent and check.compared >= sum(SEQ), check.verdict()


def test_apex_fp16_utils_lines() -> None:
    """``apex/fp16_utils/fp16_optimizer.py``, ``FP16_Optimizer.step``: ``print("OVERFLOW! Skipping
    step. Attempted loss scale: {}, reducing to {}".format(scale, self.loss_scale))`` (the
    DynamicLossScaler of ``fp16_utils/loss_scaler.py`` halves on overflow); not DeepSpeed's line."""
    text = ("OVERFLOW! Skipping step. Attempted loss scale: 4294967296, reducing to 2147483648\n"
            "Epoch: [0][10/500]\tTime 0.5\tLoss 6.9\n"
            "OVERFLOW! Skipping step. Attempted loss scale: 2147483648, reducing to 1073741824\n")
    log = read_log(text)
    assert log.framework == "apex" and not log.unparsed
    assert [(e.overflow, e.scale, e.next_scale) for e in log.events if not e.gap] == [(True, 2**32, 2**31),
                                                                                      (True, 2**31, 2**30)]
    assert consistency(log).consistent
    assert read_log("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 8, reducing to 4\n"
                    ).framework == "deepspeed"


def _megatron_line(it: int, scale: float, skipped: int, colons: bool = True) -> str:
    c = ":" if colons else ""
    return (f" iteration {it:8d}/{1000:8d} | consumed samples: {it * 8:12d} | loss scale{c} {scale:.1f} | "
            f"number of skipped iterations{c} {skipped:3d} | number of nan iterations{c} {0:3d} |")


def test_megatron_interval_logs_bf16_and_the_2019_form(capsys, tmp_path) -> None:
    """``megatron/training/training.py``, ``training_log`` every ``log_interval`` iterations: the
    replay no longer dies on MegatronPolicy's missing default window (Megatron's
    ``--loss-scale-window`` is 1000); a bf16 run's constant ``loss scale: 1.0`` is said to be
    constant, never 'consistent'; the 2019 form without colons is read."""
    text = "\n".join(_megatron_line(it, s, k) for it, s, k in [(10, 2.0**31, 3), (20, 2.0**30, 1), (30, 2.0**30, 0)])
    path = tmp_path / "megatron.log"
    path.write_text(text + "\n")
    code, out, err = replay(capsys, str(path), "--manager", "torch", "--manager", "exponential", "--out",
                            str(tmp_path / "r"))
    assert code == 0 and "megatron log" in out, err
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["overflow_steps"] == 4  # 3 + 1 skipped
    log = read_log(text + "\n")  # each line sums its interval: 10 iterations, that many skipped, anywhere in it
    assert [(e.step, e.span, e.overflows, e.next_scale) for e in log.events] == [
        (10, (3, 10), 3, 2.0**31), (20, (10, 10), 1, 2.0**30), (30, (10, 10), 0, 2.0**30)]
    assert log_steps(log) == {"placed_steps": 0, "counted_steps": 20, "counted_gaps": 2, "bounded_gaps": 1,
                              "unknown_gaps": 0}
    decisions = counterfactual(log, TorchPolicy(init_scale=2.0**20))  # far below every logged scale
    assert [d.decision for d in decisions] == ["unknown", "unknown", "clean"]  # an interval with overflows: open
    bf16 = read_log("\n".join(_megatron_line(it, 1.0, 0) for it in (10, 20, 30)) + "\n")
    check = consistency(bf16)
    assert not check.consistent and "a constant loss scale 1 and no overflow" in check.verdict()
    old = read_log(_megatron_line(100, 65536.0, 2, colons=False) + "\n")
    assert [(e.step, e.overflow, e.next_scale) for e in old.events] == [(100, True, 65536.0)] and not old.unparsed


def test_a_megatron_line_cut_before_its_skipped_count_leaves_its_interval_open(capsys, tmp_path) -> None:
    """The shape of a real Megatron-LM log (NVIDIA/nccl#743): at iteration 10, ten skipped and the
    scale at 2**23 (the first overflow spends the hysteresis); the paste is cut inside the next
    line, after its scale 2**15 and before its count. The missing count was read as 0, so a fall by
    2**8 over ten clean steps left no Megatron run reproducing the log; the interval's outcomes are
    now unknown, said in a note, and the log replays exactly."""
    cut = _megatron_line(20, 2.0**15, 8)
    text = _megatron_line(10, 2.0**23, 10) + "\n" + cut[:cut.index("number of skipped") + len("number of skipp")]
    log = read_log(text + "\n")
    assert [(e.step, e.span, e.overflows, e.next_scale) for e in log.events] == [
        (10, (10, 10), 10, 2.0**23), (20, (10, 10), None, 2.0**15)]
    assert any("line 2: no number of skipped iterations" in n for n in log.notes)
    path = tmp_path / "cut.log"
    path.write_text(text + "\n")
    code, out, err = replay(capsys, str(path), "--manager", "torch", "--out", str(tmp_path / "r"))
    assert code == 0 and "replayed exactly" in out, (err, out)


def test_mindformers_mindyolo_and_colossalai_lines() -> None:
    """MindFormers' ``MFLossMonitor.print_output_info`` (``mindformers/core/callback/callback.py``:
    ``"{ Epoch:[%3d/%3d], step:[%5d/%5d], loss: %5.3f, per_step_time: %dms, lr: %s, overflow cond:
    %s, loss_scale: %s"``, the scale in binary32, steps numbered within the epoch); MindYOLO's
    ``overflow, still update, loss scale adjust to S``; Colossal-AI's ``Found overflow. Skip step``
    (no scale)."""
    text = ("{ Epoch:[  1/  2], step:[    4/  125], loss: 10.123, per_step_time: 512ms, lr: 1e-05, overflow cond: "
            "True, loss_scale: 268435460.0\n"
            "{ Epoch:[  2/  2], step:[    1/  125], loss: 9.876, per_step_time: 511ms, lr: 1e-05, overflow cond: "
            "False, loss_scale: 134217730.0\n")
    log = read_log(text)
    assert log.framework == "mindspore" and not log.unparsed
    assert [(e.step, e.overflow, e.scale) for e in log.events if not e.gap] == [(4, True, 268435460.0),
                                                                                (126, False, 134217730.0)]
    assert [(e.span, e.overflows) for e in log.events if e.gap] == [((3, 3), None), ((121, 121), None)]  # sinks
    yolo = read_log("2024-01-01 00:00:00,000 [WARNING] overflow, still update, loss scale adjust to 32768.0\n")
    assert [(e.overflow, e.next_scale) for e in yolo.events if not e.gap] == [(True, 32768.0)]
    colossal = read_log("[01/01/24 00:00:00] WARNING colossalai - colossalai - WARNING: Found overflow. Skip step\n")
    assert colossal.framework == "colossalai" and [(e.overflow, e.scale) for e in colossal.events
                                                   if not e.gap] == [(True, None)]
    assert "no framework policy" in consistency(colossal).verdict()


def test_unread_overflow_lines_are_counted_whatever_the_format_and_nothing_compared_is_not_consistent() -> None:
    text = ("[deepspeed] OVERFLOW! Skipping step. Gradients are non-finite, weights were not updated.\n"
            "rank 3: gradient overflow in layer 7, loss scale unchanged\n")
    log = read_log(text, format="deepspeed")
    assert [n for n, _ in log.unparsed] == [2] and len([e for e in log.events if not e.gap]) == 1
    check = consistency(log)
    assert not check.consistent and "nothing" in check.verdict()
    yolo = read_log("overflow cond: maybe, loss_scale: lots\n", format="mindspore")
    assert [n for n, _ in yolo.unparsed] == [1]


# -- sparse logs (issue 32, items 1, 2 and 12): gaps replayed, never a guess -------------------------------

def _ds_text(grads: list[float], policy: DeepSpeedPolicy, every: int | None, drop: frozenset[int] = frozenset(),
             bare: frozenset[int] = frozenset(), ranks: int = 1) -> tuple[str, list[bool], list[bool]]:
    """A DeepSpeed run on the gradient maxima: its own lines (``loss_scaler.py``, ``update_scale``:
    each overflow's line, the hysteresis form while hysteresis is left) and, every ``every`` steps
    (None: never), the engine's ``step=N, skipped=M`` report; the overflow lines of the steps in
    ``drop`` (0-based) left out where a later counter counts them (a paste missing lines), those
    in ``bare`` printed without scales (``[deepspeed] OVERFLOW! Skipping step. Gradients are
    non-finite, weights were not updated.``, ``update_scale``'s other branch); each overflow line
    printed by each of ``ranks`` ranks (the report by rank 0 only: ``log_dist(ranks=[0])``). The
    outcomes, and which steps printed a line."""
    state, out, skipped, overflows, printed = policy.initial(), [], 0, [], []
    last = len(grads) // every * every if every else 0
    for t, g in enumerate(grads, start=1):
        s = float(state.scale)
        overflow = g * s > MAX
        hysteresis = state.cur_hysteresis
        state = policy.next(state, not overflow)
        shown = overflow and not (t - 1 in drop and t <= last)
        if overflow:
            skipped += 1
        if shown:
            out += _ds_overflow(s, float(state.scale), policy.delayed_shift == 1 or hysteresis == 1, hysteresis,
                                t - 1 in bare, ranks)
        if every and t % every == 0:
            out.append(f"[Rank 0] step={t}, skipped={skipped}, lr=[0.001], mom=[(0.9, 0.999)]")
        overflows.append(overflow)
        printed.append(shown)
    return "\n".join(out) + "\n", overflows, printed


def _ds_overflow(s: float, after: float, reduced: bool, hysteresis: int, bare: bool, ranks: int) -> list[str]:
    """The lines of one overflow as ``update_scale`` prints them on each rank."""
    if bare:
        return ["[deepspeed] OVERFLOW! Skipping step. Gradients are non-finite, weights were not updated."] * ranks
    tail = (f"reducing to {after}" if reduced else
            f"but hysteresis is {hysteresis}. Reducing hysteresis to {hysteresis - 1}")
    return [f"[deepspeed] OVERFLOW! Rank {r} Skipping step. Attempted loss scale: {s}, {tail}" for r in range(ranks)]


def _covered(log, text: str, printed: list[bool], every: int | None) -> list[tuple[int, list[int]]]:
    """The true steps (0-based) each event of the log stands for, from how the log was written, and
    the first step of its window: an overflow line's event its own step (the k-th overflow line
    printed is the k-th step that printed one; a step a counter places, that step); a gap the steps
    of its window that no event of their own stands for (since the last counter, or with no counter
    since the last overflow event): clean steps, and overflows whose line is missing or was read as
    another rank's copy of the line before it (with no counter to count them, as after the last
    one, the log does not speak for those: left out)."""
    lines = [n for n, line in enumerate(text.splitlines(), 1) if "OVERFLOW" in line]
    step_of = dict(zip(lines, [i for i, o in enumerate(printed) if o], strict=True))
    placed = sorted(e.step - 1 if e.step is not None else step_of[e.line] for e in log.events if not e.gap)
    every = every if every and len(printed) >= every else None
    out, since, done = [], 0, -1
    for e in log.events:
        if not e.gap:
            done = e.step - 1 if e.step is not None else step_of[e.line]
            out.append((done, [done]))
            since = max(since, e.step or 0)  # placed by a counter: its window ends there
            continue
        if every:
            first, end = since, e.step if e.step is not None else len(printed)
            since = end
        else:
            first, end = done + 1, next((i for i in placed if i > done), len(printed))
        counted = every and e.step is not None  # a counter closes the window: it counts every overflow
        out.append((first, [i for i in range(first, end) if i not in placed and (counted or not printed[i])]))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-30, 12), min_size=1, max_size=40), st.sampled_from([None, 1, 2, 3, 5]),
       st.integers(1, 4), st.integers(1, 2), st.sampled_from([12, 16]), st.integers(1, 4), st.sampled_from([8, 16]),
       st.frozensets(st.integers(0, 39), max_size=4), st.frozensets(st.integers(0, 39), max_size=8))
def test_a_sparse_log_is_replayed_and_never_certain_where_it_is_open(log2g, every, window, shift, init_log,
                                                                      other_window, other_log, drop, bare) -> None:
    """For random gradient maxima, a DeepSpeed run logged with counters every k steps (or overflow
    lines only): every step is placed or counted in a gap, each gap's length is what the counters
    say (overflow lines missing from a paste are counted as overflows of unknown place), and the
    other policy's replay holds the true state before every row and is never certain of an outcome
    the truth contradicts, in a placed step or anywhere in a gap; with counters at every step it is
    the complete replay."""
    grads = [2.0**x for x in log2g]
    logging_policy = DeepSpeedPolicy(init_scale=2.0**init_log, scale_window=window, delayed_shift=shift,
                                     raise_error_at_min_scale=False)
    text, overflows, printed = _ds_text(grads, logging_policy, every, drop, bare)
    if not text.strip():
        return  # nothing printed
    log = read_log(text)
    if every == 1 and printed == overflows and not bare:
        assert log.complete and not any(e.gap for e in log.events)
    steps = log_steps(log)
    if every and len(grads) >= every:  # a counter printed: every gap is counted or bounded
        last = len(grads) // every * every
        assert steps["unknown_gaps"] == 0 and steps["placed_steps"] + steps["counted_steps"] <= len(grads)
        assert steps["placed_steps"] + steps["counted_steps"] >= last  # every step up to the last counter
    other = TorchPolicy(init_scale=2.0**other_log, growth_interval=other_window)
    decisions = counterfactual(log, other)
    truth, states = other.initial(), []
    for g in grads:  # the other policy's true path on the same gradients
        states.append(truth)
        truth = other.next(truth, not g * float(truth.scale) > MAX)
    for e, d, (first, covered) in zip(log.events, decisions, _covered(log, text, printed, every), strict=True):
        if d.scales and first < len(grads):  # the state before the step, or as the gap's window begins
            assert float(states[first].scale) in d.scales, (e, d, first)
        if d.decision != "unknown":
            for i in covered:
                assert d.decision == ("overflow" if grads[i] * float(states[i].scale) > MAX else "clean"), (e, d, i)


@pytest.mark.parametrize("grads, window, every, drop, bare, fixed, row, truth", [
    # the scale grows (window 1: the second clean step after an overflow) between a pinned one (2048)
    # and an overflow line that prints none: step 4 ran at 4096; 3072 * 20 is clean there, so fixed
    # 3072 is not certain to overflow where the log overflowed
    ([20.0, 1.0, 1.0, 20.0], 1, 1, (), (3,), 3072.0, 3, "clean"),
    # a counter counts an overflow whose line is missing: after it the scale may be lower than the last
    # one printed (1024, not 2048), so fixed 1536 on the clean steps after it is not certain to be clean
    ([20.0, 40.0, 50.0, 50.0], 1000, 2, (1,), (), 1536.0, 2, "overflow"),
    # an overflow line with no scale among a window's steps: the window's clean steps may come before it
    # and grow the scale (to 4096), so fixed 3072 is not certain to overflow where the log overflowed
    ([20.0, 1.0, 1.0, 20.0], 1, 4, (), (3,), 3072.0, 1, "clean"),
])
def test_sparse_bounds_worked_by_hand(grads, window, every, drop, bare, fixed, row, truth) -> None:
    """DeepSpeed from 4096 with no hysteresis: each row's logged scale as the log bounds it, and a
    fixed scale replayed on them, left unknown where the truth is the other outcome than the log's."""
    policy = DeepSpeedPolicy(init_scale=4096.0, scale_window=window, delayed_shift=1, raise_error_at_min_scale=False)
    text, overflows, printed = _ds_text(grads, policy, every, frozenset(drop), frozenset(bare))
    log = read_log(text)
    decisions = counterfactual(log, FixedLossScale(loss_scale=fixed))
    assert decisions[row].decision == "unknown", (log.events, decisions)
    covered = _covered(log, text, printed, every)[row][1]
    assert covered and {"overflow" if grads[i] * fixed > MAX else "clean" for i in covered} == {truth}


def _every_history(lines: list[str], every: int, steps: int, other, events: set[int],
                   ranks: int = 1) -> dict[int, tuple[set[bool], set[float]]]:
    """The oracle: every DeepSpeed run (window 1 to steps + 1, hysteresis 1 to 4, initial scale 2**0
    to 2**30; every outcome of every step; each overflow's line printed, printed without its scale,
    or missing) that prints exactly ``lines``, with the other policy beside it taking each outcome
    the gradient maximum allows (an overflow at S: g > MAX / S; clean: g <= MAX / S; both policies
    overflow where g * scale > MAX); each overflow line printed by each of ``ranks`` ranks. For
    each of the reader's ``events`` (line numbers: an overflow line, or the counter that closes a
    window, standing for the window's steps without an event of their own), the other's outcomes on
    its steps and the scales it held before them (a counter: as its window began), over every such
    run."""
    counters = [n for n, line in enumerate(lines, 1) if "step=" in line]
    found: dict[int, tuple[set[bool], set[float]]] = {}

    def record(line: int, outcomes: set[bool], scales: set[float]) -> None:
        o, s = found.setdefault(line, (set(), set()))
        o.update(outcomes)
        s.update(scales)

    def go(t: int, p: int, fw, ot, skipped: int, policy, seen: dict) -> bool:
        """Whether a run from this state prints the rest of the lines; each step taken on such a
        run is recorded. Every state is reached from the start, so a state met again (by another
        path) completes the same way and was recorded the first time: ``seen`` keeps its answer."""
        key = (t, p, fw, ot, skipped)
        if key in seen:
            return seen[key]
        if t > steps:
            seen[key] = p == len(lines)
            return seen[key]
        s, tt = float(fw.scale), float(ot.scale)
        closes = t % every == 0
        window_line = counters[(t - 1) // every]
        begins = (t - 1) % every == 0
        completes = False
        for overflow in (False, True):
            after = policy.next(fw, not overflow)
            if overflow:
                reduced = policy.delayed_shift == 1 or fw.cur_hysteresis == 1
                shown = [_ds_overflow(s, float(after.scale), reduced, fw.cur_hysteresis, bare, ranks)
                         for bare in (False, True)] + [[]]
            else:
                shown = [[]]
            for out in shown:
                emitted = out + ([f"[Rank 0] step={t}, skipped={skipped + overflow}, lr=[0.001], "
                                  f"mom=[(0.9, 0.999)]"] if closes else [])
                if lines[p:p + len(emitted)] != emitted:
                    continue
                own = bool(out) and p + 1 in events  # else read as a copy of the line before: in the gap
                line = p + 1 if own else window_line
                possible = [True] if overflow and tt >= s else [False] if not overflow and tt <= s else [True, False]
                for o in possible:
                    if go(t + 1, p + len(emitted), after, other.next(ot, not o), skipped + overflow, policy, seen):
                        completes = True
                        if begins:
                            record(window_line, set(), {tt})
                        record(line, {o}, {tt} if own else set())
        seen[key] = completes
        return completes

    printed = [float(x) for line in lines for x in re.findall(r"Attempted loss scale: ([0-9.e+]+)", line)]
    for window in range(1, steps + 2):
        for shift in range(1, 5):
            for e in range(31):
                policy = DeepSpeedPolicy(init_scale=2.0**e, scale_window=window, delayed_shift=shift,
                                         raise_error_at_min_scale=False)
                if printed and not printed[0] / 2.0**steps <= 2.0**e <= printed[0] * 2.0**steps:
                    continue  # no run from there prints that scale (a step at most doubles or halves it)
                go(1, 0, policy.initial(), other.initial(), 0, policy, {})
    return found


@settings(max_examples=60, deadline=None)
# Two ranks print each overflow; step 1's line is missing and step 2's printed twice without its scale:
# the two identical lines are one overflow (the scaled lines show two ranks printing), not two.
@example(log2g=[0.0], every=3, window=1, shift=3, init_log=16, other_window=1, other_log=11, drop=frozenset([0]),
         bare=frozenset([1]), ranks=2)
@given(st.lists(st.floats(-30, 12), min_size=1, max_size=4), st.sampled_from([1, 2, 3]), st.integers(1, 3),
       st.integers(1, 3), st.sampled_from([12, 16]), st.integers(1, 3), st.sampled_from([11, 12, 13, 16]),
       st.frozensets(st.integers(0, 8), max_size=2), st.frozensets(st.integers(0, 8), max_size=2),
       st.sampled_from([1, 1, 2]))
def test_a_sparse_log_is_replayed_as_certain_as_the_log_allows(log2g, every, window, shift, init_log, other_window,
                                                                other_log, drop, bare, ranks) -> None:
    """Issue 32, Done means 3, both ways: on short DeepSpeed logs (counters every k steps, missing
    and scale-less overflow lines, one or two ranks printing each overflow), each row's decision is
    exactly what every run that prints the log agrees on (the oracle enumerates them all), and its
    scales exactly those the other policy may hold there: nothing certain the log leaves open,
    nothing open the log decides."""
    grads = [2.0**x for x in log2g] * every  # a whole number of counter windows: the log says how many steps
    logging_policy = DeepSpeedPolicy(init_scale=2.0**init_log, scale_window=window, delayed_shift=shift,
                                     raise_error_at_min_scale=False)
    text, _, printed = _ds_text(grads, logging_policy, every, drop, bare, ranks)
    if "Attempted" not in text:
        return  # no scale printed: the replay does not claim exactness there
    log = read_log(text)
    other = TorchPolicy(init_scale=2.0**other_log, growth_interval=other_window)
    found = _every_history(text.splitlines(), every, len(grads), other, {e.line for e in log.events}, ranks)
    decisions = counterfactual(log, other)
    for e, d in zip(log.events, decisions, strict=True):
        outcomes, scales = found.get(e.line, (set(), set()))
        if outcomes:
            want = "unknown" if len(outcomes) == 2 else "overflow" if True in outcomes else "clean"
            assert d.decision == want, (e, d, outcomes)
        assert set(d.scales) == scales, (e, d, scales)


def _values(text: str, steps: int) -> set[int]:
    """The numbers ``exact_fit`` writes ("3", "4 to 9", "12 or more", joined by ", "), up to ``steps``."""
    out: set[int] = set()
    for part in text.split(", "):
        low, _, high = part.replace(" or more", f" to {steps}").partition(" to ")
        out.update(range(int(low), int(high or low) + 1))
    return {v for v in out if v <= steps}


@pytest.mark.parametrize("shift", [1, 2, 3])
@pytest.mark.parametrize("outcomes", [[1] + [0] * 5 + [1, 1] + [0] * 9 + [1, 1, 1] + [0] * 3 + [1], [0] * 3 + [1]])
def test_the_exact_replay_keeps_only_the_runs_that_print_the_log(outcomes, shift) -> None:
    """The runs the exact replay keeps are exactly those that print the log: gradients that overflow
    (or not) at any scale fix the outcomes, so each DeepSpeed window and hysteresis either prints
    the same lines or not, and the kept windows and hysteresis values are the ones that do
    (DeepSpeed's hysteresis line names the hysteresis left: "but hysteresis is 3", where no later
    scale would tell)."""
    grads = [1e30 if o else 1e-30 for o in outcomes]
    steps = len(grads) + 1  # a window past the log's steps never grows in it: one for all

    def text(window: int, h: int, init: float) -> str:
        return _ds_text(grads, DeepSpeedPolicy(init_scale=init, scale_window=window, delayed_shift=h,
                                               raise_error_at_min_scale=False), 1)[0]

    logged = text(4, shift, 4096.0)
    fit, why = exact_fit(read_log(logged))
    assert fit is not None, why
    prints = {(w, h, 2.0**e) for w in range(1, steps + 1) for h in range(1, 5) for e in range(25)
              if text(w, h, 2.0**e) == logged}
    assert _values(fit["scale_window"], steps) == {w for w, _, _ in prints}
    assert _values(fit["delayed_shift"], 4) == {h for _, h, _ in prints}
    assert {float(x) for x in fit["init_scale"].split(", ")} == {init for _, _, init in prints}


def test_a_gap_of_more_than_1024_steps_replays(capsys, tmp_path, monkeypatch) -> None:
    """``steps_per_print`` 1200: on the bounds (past the exact replay's limit, set low here to be
    quick), a counted gap of 1,199 clean steps bounds the scale by 2**1199, past the largest
    double: Python's float power raised, and the command died."""
    from lossscale.replay import fit as module

    monkeypatch.setattr(module, "MAX_RUNS", 100)
    line = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768"
    counter = "[Rank 0] step={}, skipped={}, lr=[0.001], mom=[(0.9, 0.999)]"
    (tmp_path / "long.log").write_text("\n".join([line, counter.format(1, 1), line, counter.format(1201, 2)]) + "\n")
    code, out, err = replay(capsys, str(tmp_path / "long.log"), "--manager", "torch", "--out", str(tmp_path / "r"))
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert not summary["replay"]["exact"] and summary["counted_steps"] == 1199
    assert summary["consistency"]["consistent"]


@settings(max_examples=100, deadline=None)
@given(st.floats(2.0**-1074, 2.0**1023, allow_subnormal=True), st.sampled_from([2.0, 4.0, 3.0]),
       st.integers(0, 1200), st.integers(0, 1200))
@example(65536.0, 2.0, 1100, 0).via("the first scale printed after 1,100 steps")
@example(2.0**-1070, 2.0, 3, 1100).via("near the least subnormal")
def test_initial_scales_by_exponent_are_those_of_every_count_of_growths_and_backoffs(logged, grow, growths,
                                                                                       backoffs) -> None:
    """The initial scales at most n growths and m backoffs take to a printed scale: for a power of
    two and its inverse, found by exponent (fast however many steps a log places), they are the
    positive binary64 numbers logged * grow**k for -n <= k <= m, each rounded once (exact
    rationals), which holds every value of the pairs (a, c); other factors enumerate the pairs."""
    from fractions import Fraction

    from lossscale.replay.fit import _MOST_PAIRS, _initials, _through

    found = _initials(logged, grow, 1 / grow, growths, backoffs)
    if grow == 3.0:
        pairs = sorted({v for a in range(growths + 1) for c in range(backoffs + 1)
                        if (v := _through(logged, grow, 1 / grow, a, c)) is not None}) \
            if (growths + 1) * (backoffs + 1) <= _MOST_PAIRS else None
        assert found == pairs
        return
    exact = set()
    for k in range(-growths, backoffs + 1):
        try:
            v = float(Fraction(logged) * Fraction(grow) ** k)
        except OverflowError:
            continue
        if v > 0:
            exact.add(v)
    assert found == sorted(exact)
    some = [(a, c) for a in {0, min(1, growths), growths // 2, growths} for c in {0, min(1, backoffs), backoffs // 2,
                                                                               backoffs}]
    assert {v for a, c in some if (v := _through(logged, grow, 1 / grow, a, c)) is not None} <= exact


def test_a_progress_bar_far_into_the_run_replays_on_the_bounds(capsys, tmp_path) -> None:
    """A bar at step 34,081 and one apex overflow line (a Horovod run's paste): the initial scales
    that many steps allow were enumerated pair by pair, 34,082 x 34,082 of them, and the command
    ran for hours; now it replays on the bounds."""
    bar = " 11%|#1        | 34081/300000 [9:57:53<76:49:37,  1.04s/it]"
    line = "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 4096.0"
    (tmp_path / "far.log").write_text(f"{bar}\n{line}\n")
    code, out, err = replay(capsys, str(tmp_path / "far.log"), "--manager", "torch", "--out", str(tmp_path / "r"))
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert not summary["replay"]["exact"]


@pytest.mark.parametrize("lines, skipped, overflows", [
    (["B", "B", "B", "B"], 2, 2),  # two overflows, each printed by two ranks
    (["B", "B", "S"], 2, 2),  # the run of two is one overflow: the scaled line is the other
    (["B", "B", "B", "S"], 2, 2),  # three copies of one overflow
    (["B", "B", "B"], 2, None),  # one and two copies, or two and one: which lines are copies is open
])
def test_repeated_lines_a_counter_proves_are_copies(lines, skipped, overflows) -> None:
    """Overflow lines with no rank prefix that repeat the line before them, more than the counter's
    skipped count: read as copies where the count fixes how many overflows each run stands for (or
    every overflow is printed the same number of times); else the window is left unknown."""
    text = {"B": "[deepspeed] OVERFLOW! Skipping step. Gradients are non-finite, weights were not updated.",
            "S": "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1024, reducing to 512"}
    log = read_log("\n".join([text[x] for x in lines] + [f"[Rank 0] step=4, skipped={skipped}, lr=[0.1]"]) + "\n")
    read = [e for e in log.events if not e.gap]
    gap = next(e for e in log.events if e.gap)
    if overflows is None:
        assert len(read) == len(lines) and gap.span == (0, None) and gap.overflows is None
    else:
        assert len(read) == overflows and gap.span == (4 - overflows, 4 - overflows) and gap.overflows == 0
        assert any("read as copies" in note for note in log.notes)


def test_the_sample_log_ships_and_replays(capsys, tmp_path) -> None:
    """The sample log is DeepSpeed's own output (written again here where DeepSpeed is installed)
    and the README's replay of it runs: every step placed or counted, the log's own policy
    consistent with it, and both managers replayed."""
    from lossscale.replay import SAMPLE_LOG

    try:
        assert SAMPLE_LOG.read_text() == sample_log()
    except pytest.skip.Exception:
        pass  # no DeepSpeed here: the shipped file is still replayed below
    code, out, err = replay(capsys, str(SAMPLE_LOG), "--manager", "torch", "--manager", "exponential", "--out",
                            str(tmp_path / "r"))
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["placed_steps"] + summary["counted_steps"] == 300 and summary["unknown_gaps"] == 0
    assert summary["consistency"]["consistent"] and summary["overflow_steps"] == SAMPLE_LOG.read_text().count(
        "OVERFLOW!")
    assert "steps placed, 293 more counted in 30 gaps" in out.splitlines()[0]
    runs = summary["replay"]["runs"]  # exact: the run that wrote it among those kept
    assert summary["replay"]["exact"] and "replayed exactly" in out
    assert runs["delayed_shift"] == "2" and runs["init_scale"] == "65536"
    low, more = runs["scale_window"].split(" or ")
    assert int(low) <= SAMPLE_ARGS["scale_window"] and more == "more"


def test_progress_bars_as_pasted_terminals_show_them() -> None:
    """Issue 32, item 3: a tqdm bar and a log message on one physical line (HF Trainer, trlx and
    Colossal-AI pastes): the bar closes step 9 and the overflow after it is step 10; trlx's rollout
    bar (128 steps) is not the training bar and counts nothing; a bar that goes back is noted."""
    bar = "{pct:3d}%|#         | {n}/63645 [00:19<37:53:00,  2.14s/it]"
    text = "\n".join([
        bar.format(pct=0, n=8),
        bar.format(pct=0, n=9) + "[2021-06-08 10:00:00,000] [INFO] [stage3.py:2323:_overflow_clean_up] [deepscale] "
        "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
        "[rollout 128 / 128]: 100%|##########| 128/128 [00:05<00:00, 25.1it/s]",
        bar.format(pct=0, n=10), bar.format(pct=0, n=11), bar.format(pct=0, n=7)])
    log = read_log(text + "\n")
    placed = [(e.step, e.overflow, e.scale) for e in log.events if not e.gap]
    assert (10, True, 65536.0) in placed and (11, False, None) in placed
    assert not any(e.step == 128 for e in log.events)
    assert any("not the training bar" in n for n in log.notes) and any("goes back from 11 to 7" in n for n in log.notes)


def test_several_ranks_printing_one_overflow() -> None:
    """Issue 32, item 4: apex on 2 processes prints each overflow twice (its scale after halves on
    a real second overflow, so an identical line is a copy); DeepSpeed's old FP16_Optimizer on 4
    ranks prints ``[Rank r]`` lines (different ranks: copies); identical scale-less lines with no
    rank are not taken for copies (two real overflows print the same), nor are two reductions at
    the floor. Each copy is noted, never read as a growth."""
    apex = "\n".join(["Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0"] * 2 +
                     ["Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 16384.0"] * 2) + "\n"
    log = read_log(apex)
    assert [e.next_scale for e in log.events if not e.gap] == [32768.0, 16384.0]
    assert any("2 overflow lines repeat" in n for n in log.notes) and consistency(log).consistent
    # no prefix names the ranks: the note says what else the lines could be
    assert any("no rank prefix tells" in n and "grew back" in n for n in log.notes), log.notes
    ranks = "\n".join(f"[Rank {r}] Overflow detected. Skipping step. Attempted loss scale: 65536, reducing to 32768"
                      for r in range(4)) + "\n"
    assert sum(e.overflow for e in read_log(ranks).events) == 1
    assert any("their rank prefixes differ" in n for n in read_log(ranks).notes)
    bare = "[deepspeed] OVERFLOW! Skipping step. Gradients are non-finite, weights were not updated.\n" * 2
    assert sum(e.overflow for e in read_log(bare).events) == 2
    floor = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 1\n" * 2
    assert sum(e.overflow for e in read_log(floor).events) == 2


def test_fairseq_in_its_own_field_order_and_its_older_forms() -> None:
    """Issue 32, item 7: ``SimpleProgressBar.log`` prints the stats in fairseq's order
    (``num_updates`` before ``loss_scale``), every ``log_interval`` updates; up to 0.9 the loss scale
    is the interval's mean (not a scale: never compared), and from 0.10, whose lines come through
    its logging module (``| INFO | train_inner |``), the scale the trainer holds
    (``fairseq/trainer.py``, ``train_step``: ``log_scalar("loss_scale", ..., weight=0)``, so the
    meter's latest value; a number no power of two prints as is still read as a mean, as a master
    checkout of early 2020 printed); 0.9/0.10's ``NOTE: overflow detected, setting loss scale to:
    S``; 0.6's pipe-separated epoch summary; the JSON end-of-epoch ``train_`` keys."""
    def progress(n: int, scale: str) -> str:
        return (f"2020-01-01 00:00:00 | INFO | train_inner | epoch 001:  {n:5d} / 500 loss=7.123, nll_loss=7.0, "
                f"ppl=128.5, wps=1000, ups=1, wpb=1000, bsz=8, num_updates={n}, lr=0.0001, gnorm=1.2, "
                f"loss_scale={scale}, train_wall=10, wall=100")
    text = "\n".join([progress(10, "64"), "2020-01-01 00:00:00 | INFO | fairseq.trainer | NOTE: overflow detected, "
                      "setting loss scale to: 32.0", progress(20, "40.5"), progress(30, "32"), ""])
    log = read_log(text)
    assert log.framework == "fairseq" and not log.unparsed
    placed = [(e.step, e.overflow, e.next_scale) for e in log.events if not e.gap]
    assert placed == [(10, False, 64.0), (None, True, 32.0), (20, False, None), (30, False, 32.0)]
    check = consistency(log)  # 40.5, a mean over the interval, is no scale to depart from
    assert check.consistent and check.compared == 1, check.verdict()
    means = "\n".join(f"| epoch 001:  {n:5d} / 500 loss=7.123, num_updates={n}, lr=0.0001, loss_scale=64, wall=100"
                      for n in (10, 20)) + "\n"
    assert [e.next_scale for e in read_log(means, format="fairseq").events if not e.gap] == [None, None]
    # --amp: fairseq/optim/amp_optimizer.py's clip_grad_norm logs the next scale ("to " twice, as printed)
    amp = read_log("2021-05-01 10:00:00 | INFO | fairseq.optim.amp_optimizer | AMP: overflow detected, setting "
                   "scale to to 64.0\n" + progress(50, "64") + "\n")
    assert amp.framework == "fairseq" and [(e.overflow, e.next_scale) for e in amp.events if not e.gap] == [
        (True, 64.0), (False, 64.0)] and not amp.unparsed
    mega = progress(40, "1.04858e+06").replace("2020-01-01", "2021-01-01")
    assert [e.next_scale for e in read_log(mega + "\n").events if not e.gap] == [1.04858e6]
    old = read_log("| epoch 001 | loss 7.123 | nll_loss 7.0 | ppl 138.5 | wps 1000 | num_updates 10198 | lr 0.0005 | "
                   "gnorm 1.2 | clip 0.0 | oom 0 | loss_scale 0.500 | wall 100 | train_wall 90\n", format="fairseq")
    assert [e.step for e in old.events if not e.gap] == [10198] and not old.unparsed
    end = read_log('{"epoch": 1, "train_loss": "7.1", "train_loss_scale": "8", "train_num_updates": "1234"}\n')
    assert [e.step for e in end.events if not e.gap] == [1234]


def _logs_of_every_shape() -> dict[str, str]:
    """One log of each format in the shapes real logs take: per step, every k steps, overflow lines only."""
    ds = DeepSpeedPolicy(init_scale=2.0**16, scale_window=5, delayed_shift=2, raise_error_at_min_scale=False)
    grads = [2.0**x for x in [-4, -4, 2, -4, -4, -4, -4, -4, 3, 3, -4, -4, -4, -4, -4, -4, -4, 1, -4, -4]]
    return {
        "deepspeed-every-step": _ds_text(grads, ds, 1)[0],
        "deepspeed-every-5": _ds_text(grads, ds, 5)[0],
        "deepspeed-lines-only": _ds_text(grads, ds, None)[0],
        "apex": apex_log(SEQ, ApexPolicy(init_scale=2.0**16, scale_window=4)),
        "fairseq": fairseq_log(SEQ, FairseqPolicy(init_scale=128.0, scale_window=4)),
        "megatron": "\n".join(_megatron_line(it, s, k) for it, s, k in [(10, 2.0**31, 3), (20, 2.0**30, 1)]) + "\n",
        "mindformers": "{ Epoch:[  1/  1], step:[    4/  125], loss: 10.1, per_step_time: 512ms, lr: 1e-05, overflow "
                       "cond: True, loss_scale: 268435460.0\n",
        "colossalai": "WARNING colossalai - Found overflow. Skip step\n" * 3,
    }


@pytest.mark.parametrize("shape", list(_logs_of_every_shape()))
def test_every_shape_of_log_replays_with_managers(capsys, tmp_path, shape) -> None:
    """Done means 2's command on a log of every format and shape: it exits 0, writes replay.csv with
    a row per placed step and per gap, and counts the steps as placed, counted, bounded or unknown."""
    path = tmp_path / f"{shape}.log"
    path.write_text(_logs_of_every_shape()[shape])
    code, out, err = replay(capsys, str(path), "--manager", "torch", "--manager", "exponential", "--out",
                            str(tmp_path / "r"))
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "r" / "replay.csv").open()))
    log = read_log(path)
    assert len(rows) == len(log.events) and all(r["torch_decision"] in ("overflow", "clean", "unknown") for r in rows)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert {k: summary[k] for k in log_steps(log)} == log_steps(log)
    assert "consistent with" not in out or summary["consistency"]["compared"] > 0


def test_lines_naming_no_rank_are_read_in_groups_of_the_ranks_the_log_shows() -> None:
    """Two ranks print each overflow (the scaled lines name ranks 0 and 1), so the two identical
    scale-less lines before them are one overflow printed twice, and the counter's third skipped
    step is an overflow whose line is missing: two overflow lines and a gap of one step, not three
    overflow lines."""
    bare = "[deepspeed] OVERFLOW! Skipping step. Gradients are non-finite, weights were not updated."
    text = "\n".join([bare, bare] + [f"[deepspeed] OVERFLOW! Rank {r} Skipping step. Attempted loss scale: 65536.0, "
                                     f"reducing to 32768.0" for r in (0, 1)]
                     + ["[Rank 0] step=3, skipped=3, lr=[0.001], mom=[(0.9, 0.999)]"])
    log = read_log(text)
    assert [(e.line, e.overflow, e.span, e.overflows) for e in log.events] == [
        (1, True, None, 0), (3, True, None, 0), (5, False, (1, 1), 1)]
    first = counterfactual(log, TorchPolicy(init_scale=2048.0, growth_interval=1))[0]
    assert set(first.scales) == {1024.0, 2048.0, 4096.0}  # the missing overflow may come first: 2048 halved or grown


def test_each_log_format_is_one_entry() -> None:
    """A log format is its LOG_FORMATS entry: the reader, the signs, the framework's policy (whose
    argument names must be the class's), and a line of the package's documentation."""
    import dataclasses

    import lossscale.replay

    for name, entry in LOG_FORMATS.items():
        assert entry.name == name and f"``{name}``" in lossscale.replay.__doc__
        spec = entry.policy
        if spec is not None:
            names = {f.name for f in dataclasses.fields(spec.cls)}
            used = {spec.init, spec.window, *([spec.hysteresis] if spec.hysteresis else []), *spec.fixed,
                    *spec.bounds(1.0)}
            assert used <= names, (name, used - names)


def test_a_first_scale_printed_after_more_than_1024_steps_replays(capsys, tmp_path, monkeypatch) -> None:
    """The shape of a real DeepSpeed log (deepspeedai/DeepSpeed#2069: FP16_Optimizer on 4 ranks under a
    tqdm bar), the bar at step 1,100 when the first scale is printed: the candidate initial scales
    that 1,100 growths take to it lie past the largest double, and the command died with Python's
    float power error ("Numerical result out of range") instead of replaying."""
    from lossscale.replay import fit as module

    monkeypatch.setattr(module, "MAX_RUNS", 100)  # on the bounds: quick
    where = "[2022-07-05 16:30:10,796] [INFO] [fused_optimizer.py:382:_update_scale]"
    lines = [" 21%|██        | 1100/5000 [00:32<00:41, 21.56it/s]" + where]
    lines += ["Grad overflow on iteration 1099", where] * 3 + ["Grad overflow on iteration 1099"]
    lines += [where + " Reducing dynamic loss scale from 8388608.0 to 4194304.0"] * 4
    lines += ["[2022-07-05 16:30:10,797] [INFO] [logging.py:69:log_dist] [Rank 0] Overflow detected. Skipping step. "
              "Attempted loss scale: 8388608.0, reducing to 4194304.0"]
    (tmp_path / "ranks.log").write_text("\n".join(lines) + "\n")
    code, out, err = replay(capsys, str(tmp_path / "ranks.log"), "--manager", "torch", "--out", str(tmp_path / "r"))
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["consistency"]["consistent"]


def test_overflows_on_consecutive_bar_steps_after_a_counted_gap_replay(capsys, tmp_path) -> None:
    """The shape of a real ZeRO-2 log (huggingface/transformers#9996: stage2.py's ``[deepscale]
    OVERFLOW!`` line printed on the tqdm bar's line, at bar steps 6, 7 and 8, the paste cut inside
    the next bar). The runs that reach the first line through the counted gap before it include
    runs whose end the next line cannot continue from; the exact replay once met such an end and
    died with a KeyError instead of replaying."""
    where = "[INFO] [stage2.py:1357:step] [deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: "
    bar = "  1%|▉          | {}/1184 [00:2{}<1:09:10,  3.52s/it][2021-02-04 15:06:1{},825] "
    scales = [134217728.0, 67108864.0, 33554432.0, 16777216.0]
    lines = [bar.format(6 + i, i, i) + where + f"{scales[i]}, reducing to {scales[i + 1]}" for i in range(3)]
    (tmp_path / "zero2.log").write_text("\n".join(lines + ["  1%|█▍"]) + "\n")
    code, out, err = replay(capsys, str(tmp_path / "zero2.log"), "--manager", "torch", "--manager", "exponential",
                            "--out", str(tmp_path / "r"))
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["consistency"]["consistent"]
    rows = (tmp_path / "r" / "replay.csv").read_text().splitlines()
    assert len(rows) > 3 and "exactly" in out


def test_a_fall_by_more_backoffs_than_lines_names_the_missing_lines() -> None:
    """The shape of a real apex amp log on several GPUs (NVIDIA/apex#715: ``Gradient overflow.
    Skipping step, loss scaler 0 reducing loss scale to S``, every rank printing, no rank prefix):
    between two lines the scale falls by 8, which one scaler printing every overflow cannot give.
    The departure says that two more overflows give it, whose lines are not in the log; a fall
    that no number of backoffs gives is still said to be none."""
    line = "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {}"
    check = consistency(read_log("\n".join(line.format(s) for s in (1024.0, 2048.0, 256.0)) + "\n"))
    first = check.departures[0]
    assert not check.consistent and first.line == 3 and first.logged == 256.0
    assert "after 2 more overflows, whose lines are not in the log" in first.explanation, first.explanation
    odd = consistency(read_log("\n".join(line.format(s) for s in (1024.0, 2048.0, 300.0)) + "\n"))
    assert odd.departures[0].explanation == "the policy's backoff does not give it"


def _wrapped(text: str, width: int, pad: int | None) -> str:
    """``text`` as a terminal ``width`` columns wide shows it, pasted: each line longer than the
    terminal cut into rows of ``width`` characters, the rows on lines of their own (``pad`` None) or
    joined on one line by ``pad`` spaces (a paste that kept the rows' padding: NVIDIA's and
    DeepSpeed's users paste such lines, ``Attempted loss scal      e: 8192``)."""
    out = []
    for line in text.splitlines():
        rows = [line[k:k + width] for k in range(0, len(line), width)] or [""]
        out += rows if pad is None else [(" " * pad).join(rows)]
    return "\n".join(out) + "\n"


def _read_as(log) -> list[tuple]:
    return [(e.step, e.overflow, e.scale, e.next_scale, e.hysteresis, e.span, e.overflows, e.among)
            for e in log.events]


@pytest.mark.parametrize("pad", [None, 2, 9, 33])
@pytest.mark.parametrize("width", [40, 57, 80, 100])
def test_lines_a_terminal_wrapped_read_as_printed(width, pad) -> None:
    """Issue 32, item 3: a terminal's wrap, as pasted, leaves every event as the log printed it. The
    logs: DeepSpeed's own lines (the installed ``DynamicLossScaler.update_scale``: reductions and
    hysteresis lines) with the engine's step reports, and apex's ``scale_loss`` lines (two spaces
    after its full stop), each wrapped at ``width`` columns, the rows on lines of their own or kept
    on one line with the padding between them; the wraps are noted, nothing is left unread."""
    ds = deepspeed_log([False, True, True, False, True, False, False, True, True, True], **DS)
    apex = apex_log(SEQ, ApexPolicy(init_scale=2.0**16, scale_window=4))
    for text in (ds, apex):
        plain = read_log(text)
        log = read_log(_wrapped(text, width, pad))
        assert _read_as(log) == _read_as(plain) and not log.unparsed
        assert any("a terminal wrapped" in n for n in log.notes) == (max(map(len, text.splitlines())) > width)
        assert consistency(log).consistent == consistency(plain).consistent


def test_a_cut_line_does_not_take_the_next_line_for_its_rest() -> None:
    """A line cut short (a paste's end, a crash) is unparsed, never completed by the full line after
    it: a line of a format's own is no continuation."""
    full = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768"
    log = read_log(full[:60] + "\n" + full + "\n")
    assert [e.line for e in log.events if not e.gap] == [2] and [n for n, _ in log.unparsed] == [1]


def test_the_first_fp16_optimizers_dynamic_line_and_fp16_utils_line_without_its_next_scale() -> None:
    """Two older printers of the same steps. ``apex/optimizers/fp16_optimizer.py`` (DeepSpeed's first
    FP16_Optimizer copied it), ``_update_scale``: ``print("\\nGrad overflow on iteration", cur_iter)``
    then ``print("Using dynamic loss scale of", cur_scale)`` before it halves the scale (floor 1),
    beside a tqdm bar (NVIDIA/apex#289); and the 2018 ``apex/fp16_utils/fp16_optimizer.py``,
    ``FP16_Optimizer.step``: ``"OVERFLOW! Skipping step. Attempted loss scale: {}"`` with no next
    scale (NVIDIA/tacotron2#112). Each overflow is read with the scale it ran at, and the next
    one's scale is checked against the policy's own halving of it: a second halving in one line
    departs."""
    bar = "  {p}% {n}/184 [00:0{n}<01:34,  1.93it/s, loss=4.215]"
    ds = [bar.format(p=0, n=0)]
    for it, scale in [(0, "65536"), (1, "32768.0"), (2, "16384.0"), (8, "8192.0")]:
        ds += ["", f"Grad overflow on iteration {it}", f"Using dynamic loss scale of {scale}",
               bar.format(p=1, n=it + 1)]
    log = read_log("\n".join(ds) + "\n")
    assert log.framework == "deepspeed" and not log.unparsed
    assert [(e.step, e.scale) for e in log.events if e.overflow] == [(1, 65536), (2, 32768), (3, 16384), (9, 8192)]
    check = consistency(log)
    assert check.consistent and check.compared == 3, check.verdict()
    line = "OVERFLOW! Skipping step. Attempted loss scale: {}"
    halving = read_log("\n".join(line.format(s) for s in ("4294967296", "2147483648.0", "1073741824.0")) + "\n")
    assert [(e.scale, e.next_scale) for e in halving.events if e.overflow] == [(2**32, None), (2**31, None),
                                                                             (2**30, None)]
    assert consistency(halving).consistent and consistency(halving).compared == 2
    jump = consistency(read_log("\n".join(line.format(s) for s in ("4294967296", "1073741824.0")) + "\n"))
    assert not jump.consistent and jump.departures[0].line == 2


def test_lines_a_paste_left_out_leave_their_steps_unknown() -> None:
    """A paste that leaves lines out says so with a line of its own (``...``, ``[...]``, ``<snip>``:
    NVIDIA/tacotron2#112): the steps there may hold overflows, so the scale may fall by any number
    of halvings across it, and the replay says nothing of those steps. Without the mark, the same
    fall is a departure."""
    line = "OVERFLOW! Skipping step. Attempted loss scale: {}"
    for mark in ("...", "  …", "[...]", "<snip>", "---- snip ----"):
        text = "\n".join([line.format(2.0**32), mark, line.format(2.0**18), line.format(2.0**17)]) + "\n"
        log = read_log(text)
        assert any("left out of the paste" in n for n in log.notes), mark
        assert [e.overflows for e in log.events if e.gap] == [0, None, 0], mark
        assert consistency(log).consistent, mark
        assert all(d.decision == "unknown" for d in counterfactual(log, TorchPolicy())[2:4])
    plain = consistency(read_log("\n".join([line.format(2.0**32), line.format(2.0**18)]) + "\n"))
    assert not plain.consistent


def test_a_paste_that_leaves_lines_out_between_step_counters_leaves_their_outcomes_unknown() -> None:
    """A progress bar counts the steps a paste left out, not their outcomes (the Hugging Face
    DeepSpeed docs' ZeRO paste: ``[...]`` between the bar at step 1 and the bar at step 27, across
    which the scale falls from 131072 to 1): the window's other steps are of unknown outcome, and
    its lines are not compared as if nothing came between them; after the last bar, a ``[...]``
    leaves the rest unknown too. A skipped count (DeepSpeed's engine report) does count the
    outcomes: the same fall across lines it counts departs."""
    fmt = ("[2021-01-10 15:06:26,218] [INFO] [stage2.py:1397:step] [deepscale] OVERFLOW! Rank 0 Skipping step. "
           "Attempted loss scale: {}, reducing to {}")
    bar = "{:3d}%|{}| {}/189 [00:{:02d}<01:26,  2.17it/s]"
    lines = [bar.format(0, " " * 10, 0, 0), fmt.format(262144, 262144), bar.format(1, "▌" + " " * 9, 1, 0),
             fmt.format(262144, "131072.0"), " [...]", fmt.format(1, 1), bar.format(14, "█" + " " * 9, 27, 12),
             fmt.format(1, 1), bar.format(15, "█" + " " * 9, 28, 12), "[...]", fmt.format(1, 1)]
    log = read_log("\n".join(lines) + "\n")
    assert not log.unparsed
    windows = [e for e in log.events if e.gap]
    assert [(w.span, w.overflows, w.among) for w in windows] == [((24, 24), None, 2), ((0, None), None, 1)]
    check = consistency(log)
    assert check.consistent, check.verdict()
    decided = counterfactual(log, TorchPolicy())
    assert decided[[i for i, e in enumerate(log.events) if e.gap][0]].decision == "unknown"
    report = "[Rank 0] step={}, skipped={}, lr=[0.001], mom=[(0.9, 0.999)]"
    counted = [report.format(1, 1), fmt.format(262144, "131072.0"), " [...]", fmt.format(1, 1),
               report.format(27, 3)]
    assert not consistency(read_log("\n".join(counted) + "\n")).consistent


def test_a_bar_drawn_per_epoch_counts_on_and_a_column_of_dots_is_an_elision() -> None:
    """A training loop that draws one tqdm bar per epoch (``Epoch: 29. Loss: 3.3:  76%|...| 263/348``,
    an apex amp paste from openalpr) restarts it at 0: the steps count on from the first epoch's bar
    (the overflow at epoch 29's step 263 is step 28 * 348 + 264), not a restart; the lone ``.``
    lines of the paste are lines left out, so the epochs they cover have steps of unknown outcome."""
    bar = "Epoch: {}. Loss: 3.1:  {:3d}%|{}| {}/348 [00:41<00:00,  8.40it/s]"
    overflow = "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 65536.0"
    lines = [bar.format(1, 100, "#" * 10, 348), bar.format(2, 100, "#" * 10, 348), ".", ".",
             bar.format(29, 76, "#" * 7 + " " * 3, 263) + overflow, bar.format(29, 100, "#" * 10, 348)]
    log = read_log("\n".join(lines) + "\n")
    assert not any("goes back" in n for n in log.notes) and any("left out" in n for n in log.notes)
    counters = [(e.step, e.span, e.overflows) for e in log.events if e.gap]
    at = 28 * 348 + 263
    assert counters == [(348, (0, 348), None), (696, (348, 348), 0), (at, (at - 696,) * 2, None),
                        (29 * 348, (84, 84), 0)], counters


def test_apex_amps_banner_is_read_not_counted_as_a_line_not_understood() -> None:
    """``amp.initialize`` prints each property as ``"{:22} : {}"`` (apex/amp/frontend.py): the
    ``loss_scale             : dynamic`` of the defaults and of the overrides is read, not shown as a
    line not understood; a static scale there is noted."""
    banner = ["Selected optimization level O1:  Insert automatic casts around Pytorch functions and Tensor methods.",
              "Defaults for this optimization level are:", "enabled                : True",
              "loss_scale             : dynamic", "Processing user overrides (additional kwargs that are not None)...",
              "After processing overrides, optimization options are:", "loss_scale             : dynamic"]
    line = "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0"
    log = read_log("\n".join([*banner, line]) + "\n")
    assert log.framework == "apex" and not log.unparsed and sum(e.overflow for e in log.events) == 1
    static = read_log("\n".join([*banner[:3], "loss_scale             : 128.0", line]) + "\n")
    assert not static.unparsed and any("static loss scale of 128.0" in n for n in static.notes)


def test_apex_loss_scalers_of_several_losses_are_checked_apart() -> None:
    """apex amp with ``num_losses`` 3 keeps a scaler per loss and prints its id (``apex/amp/handle.py``,
    ``scale_loss``; hukkelas/DeepPrivacy#36): scalers 0 and 3 each halve on their own overflows,
    interleaved. Each id's lines are one sequence, consistent; as one sequence they would not be.
    A step prints only its first overflowing loss's line (``skip_step`` is patched once a step), so
    between two of scaler 2's lines it may have halved unprinted once per other line between: a
    fall by 8 across 3 other lines is consistent, across 1 it departs."""
    line = "Gradient overflow.  Skipping step, loss scaler {} reducing loss scale to {}"
    order = [(0, 32768.0), (3, 32768.0), (3, 16384.0), (3, 8192.0), (0, 16384.0), (3, 4096.0), (0, 8192.0)]
    log = read_log("\n".join(line.format(k, s) for k, s in order) + "\n")
    assert [e.scaler for e in log.events if e.overflow] == [str(k) for k, _ in order]
    check = consistency(log)
    assert check.consistent and check.compared == len(order) - 2, check.verdict()
    assert any("several loss scalers (0, 3)" in n for n in log.notes)
    one = read_log("\n".join(line.format(0, s) for _, s in order[:1]) + "\n")
    assert [e.scaler for e in one.events] == [None, None]
    unprinted = [(2, 32768.0), (0, 32768.0), (3, 32768.0), (0, 16384.0), (2, 4096.0)]
    assert consistency(read_log("\n".join(line.format(k, s) for k, s in unprinted) + "\n")).consistent
    too_far = [(2, 32768.0), (0, 32768.0), (2, 4096.0)]
    assert not consistency(read_log("\n".join(line.format(k, s) for k, s in too_far) + "\n")).consistent


def test_zero_overflow_lines_that_keep_the_scale_leave_the_hysteresis_open() -> None:
    """ZeRO stages 1 and 2 (``deepspeed/runtime/zero/stage_1_and_2.py``, ``step``) print ``Attempted
    loss scale: S, reducing to T`` after every overflow, T = S where the scaler's hysteresis took
    the overflow (deepspeedai/DeepSpeed#1773): such a line does not say the hysteresis was 1, the
    settings tried include a delayed shift above 1, and the log is consistent with one."""
    fmt = ("[2022-02-15 18:51:45,705] [INFO] [stage_1_and_2.py:1644:step] [deepscale] OVERFLOW! Rank 0 Skipping "
           "step. Attempted loss scale: {}, reducing to {}")
    text = "\n".join([fmt.format(4096, 4096), "[Rank 0] step=228, skipped=1, lr=[0.0003], mom=[(0.9, 0.99)]",
                      fmt.format(4096, "2048.0")]) + "\n"
    log = read_log(text)
    assert [e.hysteresis for e in log.events if e.overflow] == [None, 1]
    check = consistency(log)
    assert check.consistent and check.policy.delayed_shift >= 2, check.verdict()


def test_a_paste_that_begins_with_the_hysteresis_spent_is_consistent_with_it() -> None:
    """DeepSpeed's ``DynamicLossScaler.update_scale`` with ``delayed_shift`` 2 prints ``but hysteresis
    is 2`` for the first overflow after a growth and ``reducing to`` for the next; a paste that begins
    after the first of a pair and leaves out the step lines (deepspeedai/DeepSpeed's MoE example on
    Ascend) shows ``reducing to``, then ``hysteresis is 2``, then ``reducing to``. A reducing line
    says its hysteresis was spent, so the log is consistent with a delayed shift of 2 (and not of 1:
    a hysteresis line needs one above 1)."""
    text = deepspeed_log([True, True] + [False] * 6 + [True, True], **DS)
    lines = [line for line in text.splitlines() if "OVERFLOW" in line][1:]
    assert ["hysteresis is 2" in line for line in lines] == [False, True, False]
    check = consistency(read_log("\n".join(lines) + "\n"))
    assert check.consistent and check.policy.delayed_shift >= 2, check.verdict()


def test_megatron_deepspeed_logs_and_colossal_ais_sharded_optimizer() -> None:
    """Megatron-DeepSpeed and GPT-NeoX print DeepSpeed's engine reports beside Megatron's iteration
    lines (EleutherAI/gpt-neox#947): read as Megatron's where DeepSpeed prints no overflow line, as
    DeepSpeed's where it does. Colossal-AI's ShardedOptimizerV2 says ``found inf during
    ShardedOptimV2 step`` (``zero/sharded_optim/sharded_optim_v2.py``, ``step``), which a rich
    console wraps after ``found`` (hpcaitech/ColossalAI#1375): an overflow either way."""
    report = "[2023-05-22 21:52:36,066] [INFO] [logging.py:96:log_dist] [Rank 0] step={}, skipped=0, lr=[2.4e-09]"
    lines = [report.format(1), _megatron_line(1, 4096.0, 0), report.format(2), _megatron_line(2, 4096.0, 0)]
    assert read_log("\n".join(lines) + "\n").framework == "megatron"
    overflow = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 8192, reducing to 4096"
    assert read_log("\n".join([overflow, *lines]) + "\n").framework == "deepspeed"
    rich = ("[09/30/22 02:45:43] WARNING  colossalai - ShardedOptimizerV2 - WARNING: found   \n"
            "                             inf during ShardedOptimV2 step                     \n")
    for text in (rich, "WARNING colossalai - ShardedOptimizerV2 - WARNING: found inf during ShardedOptimV2 step\n"):
        log = read_log(text)
        assert log.framework == "colossalai" and sum(e.overflow for e in log.events) == 1 and not log.unparsed


def test_a_2019_megatron_log_whose_first_scale_lies_far_below_binary32s_top_replays(capsys, tmp_path) -> None:
    """Megatron's 2019 lines (``| loss scale 64.0 |``, no skipped count; THUDM/Chinese-Transformer-XL#7)
    every 100 iterations from iteration 400: the runs that could print the first scale include
    initial scales past binary32's range, which Megatron cannot hold. Those are left out, not
    raised: the replay exits 0."""
    row = " iteration {:8d}/    3000 | elapsed time per iteration (ms): 12879.0 | lm loss 6.7E+00 | loss scale {} |"
    path = tmp_path / "megatron2019.log"
    path.write_text("\n".join(row.format(it, s) for it, s in [(400, "64.0"), (500, "8.0"), (600, "4.0"),
                                                             (800, "0.1"), (900, "0.2")]) + "\n")
    code, out, err = replay(capsys, str(path), "--manager", "torch", "--out", str(tmp_path / "r"))
    assert code == 0 and "megatron log" in out, err


def test_the_replay_command_prints_how_it_read_the_log(capsys, tmp_path) -> None:
    """What the reading decided (lines a paste left out, copies, wraps) changes what the log says:
    the command prints the first notes and where the rest are, not only summary.json."""
    line = "OVERFLOW! Skipping step. Attempted loss scale: {}"
    marks = ["...", "[...]", "<snip>", "…"]
    text = "\n".join(x for s, m in zip((2.0**32, 2.0**30, 2.0**27, 2.0**20, 2.0**18), [*marks, ""], strict=True)
                     for x in (line.format(s), m) if x) + "\n"
    path = tmp_path / "cut.log"
    path.write_text(text)
    code, out, err = replay(capsys, str(path), "--out", str(tmp_path / "r"))
    notes = json.loads((tmp_path / "r" / "summary.json").read_text())["notes"]
    assert code == 0 and notes and all(f"note: {n}" in out for n in notes[:3]), (out, err)
    many = "\n".join(["[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 8, reducing to 4"] +
                     [f"[Rank 0] step={n}, skipped={n}, lr=[0.1], mom=[0.9]" for n in (5, 9, 14, 20, 30)]) + "\n"
    path.write_text(many)
    code, out, err = replay(capsys, str(path), "--out", str(tmp_path / "r2"))
    notes = json.loads((tmp_path / "r2" / "summary.json").read_text())["notes"]
    assert code == 0 and len(notes) > 3 and f"note: {len(notes) - 3} more in summary.json" in out, (notes, out)


def test_megatron_intervals_apply_each_skipped_step_and_long_hystereses_are_tried(capsys, tmp_path) -> None:
    """``training_log`` sums its interval's skipped iterations (NVIDIA/Megatron-LM#60: iterations 1-5
    and 6-10 all skipped, 2**28 then 2**23): the interval halves five times, not once. Four skipped
    iterations in a row that keep the scale (Megatron-LM#602, one line per iteration) need a
    hysteresis of 5, which is tried; a fall that the skipped count cannot give still departs."""
    intervals = read_log("\n".join([_megatron_line(5, 2.0**28, 5), _megatron_line(10, 2.0**23, 5)]) + "\n")
    check = consistency(intervals)
    assert check.consistent and check.compared == 1, check.verdict()
    # the initial scale it names runs to the first line's: 5 overflows, the first h - 1 taken by the hysteresis
    h = check.policy.hysteresis
    assert check.policy.initial_scale * 0.5 ** (5 - (h - 1)) == 2.0**28, check.verdict()
    too_far = consistency(read_log("\n".join([_megatron_line(5, 2.0**28, 5), _megatron_line(10, 2.0**20, 5)]) + "\n"))
    assert not too_far.consistent
    kept = read_log("\n".join(_megatron_line(it, 16384.0, 1) for it in (1, 2, 3, 4)) + "\n")
    check = consistency(kept)
    assert check.consistent and check.policy.hysteresis == 5, check.verdict()
    path = tmp_path / "kept.log"
    path.write_text("\n".join(_megatron_line(it, 16384.0, 1) for it in (1, 2, 3, 4)) + "\n")
    code, out, err = replay(capsys, str(path), "--manager", "torch", "--out", str(tmp_path / "r"))
    assert code == 0 and "replayed exactly" in out and "hysteresis 5" in out, (out, err)


def test_a_scale_printed_as_0_is_said_to_be_unreadable_not_raised(capsys, tmp_path) -> None:
    """DeepSpeed prints ``int(S)``: a scale below 1 prints as 0 (ymcui/Chinese-LLaMA-Alpaca-2#97).
    No initial scale DeepSpeed can hold leads to 0; the replay says so and exits 0."""
    path = tmp_path / "zero.log"
    path.write_text("[2023-08-07 18:35:18,432] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 "
                    "Skipping step. Attempted loss scale: 0, reducing to 0\n")
    code, out, err = replay(capsys, str(path), "--manager", "torch", "--out", str(tmp_path / "r"))
    assert code == 0 and "cannot hold" in out and "nothing to check" in out, (out, err)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=2, max_size=14), st.lists(st.sampled_from([0, 2, 3]), min_size=14, max_size=14))
def test_lines_two_by_two_out_of_order_are_read_swapped(swap, grow) -> None:
    """Several processes printing one apex scaler into one stream can put two adjacent lines out of
    order (NVIDIA/apex#715: 2.9e-303 printed after 1.5e-303, then 3.6e-304 before 7.3e-304). Each
    halving line of a run with growths between (never two equal lines in a row: a repeat reads as a
    copy), some disjoint adjacent pairs of overflows in a row swapped: the policy reproduces it once
    those pairs are read swapped, and no more pairs are named than were swapped."""
    line = "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {}"
    scales, s = [], 2.0**20
    for g in grow[:len(swap)]:
        s = s * 2.0**g / 2
        scales.append(s)
    order, i, pairs = list(range(len(scales))), 0, 0
    while i + 1 < len(order):
        if swap[i] and grow[i + 1] == 0:  # two overflows in a row, their lines printed out of order
            order[i], order[i + 1] = order[i + 1], order[i]
            pairs, i = pairs + 1, i + 2
        else:
            i += 1
    printed = [scales[j] for j in order]
    assume(all(a != b for a, b in zip(printed, printed[1:], strict=False)))  # a repeated line reads as a copy
    check = consistency(read_log("\n".join(line.format(s) for s in printed) + "\n"))
    assert check.consistent and len(check.swapped) <= pairs, check.verdict()
    assert not check.swapped or "read swapped" in check.verdict()


def test_a_missing_line_is_not_read_as_lines_out_of_order() -> None:
    """A fall no reordering of the log's own lines gives (a line missing) still departs, and a pair
    is read swapped only where one line is the other's own halving: two lines, the second a fall by
    4, stay a departure (swapped, the fall would be a growth)."""
    line = "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {}"
    check = consistency(read_log("\n".join(line.format(s) for s in (1024.0, 512.0, 128.0, 64.0)) + "\n"))
    assert not check.consistent and not check.swapped
    two = consistency(read_log("\n".join(line.format(s) for s in (1024.0, 256.0)) + "\n"))
    assert not two.consistent and not two.swapped
