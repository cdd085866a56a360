"""Did the overflow hurt? Each step's update against the binary32 reference update, and the
``overflow_harm`` reading: a logging overflow and the GPT-2 attention mask (transformers 4.x's
double mask, which overflows in float16) are harmless, a register skip for them needless;
saturated gradients applied at 2**32 under ``isfinite`` are harmful."""

from __future__ import annotations

import numpy as np
import pytest

from lossscale import SGD, Adam, LossScaleOptimizer, Momentum, simulate
from lossscale.training.harm import HARMLESS_ERROR, _relative_error

from groups import representatives  # noqa: E402

LOGGED = dict(profile="atlas-training", steps=40, workload_args={"log_perplexity": True})


@pytest.mark.parametrize("make", [lambda: SGD(0.1), lambda: Momentum(0.1), lambda: Adam(0.01)])
def test_preview_is_the_next_update_and_changes_nothing(make) -> None:
    rng = np.random.default_rng(0)
    opt, var = make(), rng.standard_normal(5).astype(np.float32)
    g = [rng.standard_normal(5).astype(np.float32) for _ in range(3)]
    opt.apply_gradients([(g[0], var)])  # some state (momentum, Adam's moments and step count)
    kept, step = var.copy(), getattr(opt, "t", None)
    change = opt.preview([(g[1], var)])[0]
    assert np.array_equal(var, kept) and getattr(opt, "t", None) == step
    opt.apply_gradients([(g[1], var)])
    assert np.array_equal(var - kept, change)


def test_preview_through_the_loss_scale_optimizer() -> None:
    class NoPreview:
        def apply_gradients(self, pairs) -> None: ...

    var = np.ones(3, np.float32)
    assert LossScaleOptimizer(NoPreview(), _Fixed()).preview([(var, var)]) is None
    assert np.array_equal(LossScaleOptimizer(SGD(0.5), _Fixed()).preview([(var, var)])[0], -0.5 * var)


class _Fixed:
    def get_loss_scale(self) -> float:
        return 1.0

    def update_loss_scale(self, finite: bool) -> None: ...


def test_relative_error() -> None:
    one, two = [np.array([3.0, 4.0], np.float32)], [np.array([3.0, 4.0], np.float32) * 2]
    assert _relative_error(one, one) == 0 and _relative_error(two, one) == 1
    assert _relative_error([np.zeros(2, np.float32)], one) == 1  # a skipped step
    assert _relative_error([np.array([np.inf, 0], np.float32)], one) == np.inf
    assert _relative_error(one, [np.zeros(2, np.float32)]) == np.inf and _relative_error(one, None) != 0
    assert HARMLESS_ERROR == 2.0**-4


def test_logging_overflow_is_harmless_and_the_tf_npu_skip_for_it_needless() -> None:
    # exp of the summed loss overflows in the log phase and feeds no gradient: torch-npu's
    # window does not hold it (applied), tf-npu's does (skipped, for nothing).
    applied = simulate(detector="torch-npu", **LOGGED)
    logged = [r for r in applied.records if r["event_phases"] == "log"]
    assert logged and all(r["applied"] and r["overflow_harm"] == "harmless" for r in logged)
    assert all(r["update_error"] <= HARMLESS_ERROR for r in logged)
    s = applied.summary
    assert s["harmless_overflow_steps"] >= len(logged) and s["harmful_overflow_steps"] == 0
    assert s["harmless_error"] == HARMLESS_ERROR
    skipped = simulate(detector="tf-npu", **LOGGED)
    false = [r for r in skipped.records if r["false_positive"]]
    assert false and all(r["overflow_harm"] == "skipped-needless" and r["update_error"] == 1 for r in false)
    assert all(r["skipped_update_error"] <= HARMLESS_ERROR for r in false)
    assert skipped.summary["needless_skip_steps"] == len(false)
    # Every skip of a step whose gradients overflowed was needed.
    for r in skipped.records:
        if not r["applied"] and not r["false_positive"]:
            assert r["overflow_harm"] == "skipped-needed" and r["skipped_update_error"] > HARMLESS_ERROR


def test_saturated_gradients_applied_at_2_32_under_isfinite_are_harmful() -> None:
    run = simulate(profile="atlas-training", detector="isfinite", manager="fixed",
                   manager_args={"loss_scale": 2.0**32}, steps=10)
    assert all(r["applied"] and r["overflow_harm"] == "harmful" for r in run.records)
    assert min(run.column("update_error")) > 0.5
    assert run.summary["harmful_overflow_steps"] == 10 and run.summary["harmless_overflow_steps"] == 0


def test_quiet_steps_sit_below_the_threshold() -> None:
    run = simulate(steps=60)  # atlas-a2: skips while the scale comes down, then quiet steps
    quiet = [r for r in run.records if r["applied"] and not r["overflow_harm"]]
    assert quiet and max(r["update_error"] for r in quiet) == run.summary["max_quiet_update_error"]
    assert run.summary["max_quiet_update_error"] < HARMLESS_ERROR / 4
    assert all(np.isnan(r["skipped_update_error"]) for r in quiet)


@pytest.mark.slow  # transformers 5's single mask; the 4.x double mask below is the default run's case
def test_gpt2_attention_mask_overflow_is_harmless() -> None:
    torch = pytest.importorskip("torch")
    from zoo import transformers as load

    from lossscale.training.workloads.torch_workloads import TorchWorkload

    transformers = load()
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=8,
                                     bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    assert model.config._attn_implementation == "eager"
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 32, (32, 9))
    x, y = tokens[:, :-1], tokens[:, 1:]

    def next_token(out, y):
        return torch.nn.functional.cross_entropy(out.logits.float().flatten(0, 1), y.flatten())

    wl = TorchWorkload(model, next_token, (x, y), batch=16, learning_rate=0.05, name="gpt2")
    # torch-npu's window opens after the forward pass: the masked scores' -65504 + -65504
    # overflow is applied, and the update agrees with binary32.
    run = simulate(workload=wl, manager="fixed", manager_args={"loss_scale": 1.0}, profile="atlas-training",
                   detector="torch-npu", steps=3, underflow_every=3)
    # This transformers (5) adds one combined mask, once: no double-mask overflow (a score of
    # -16 or less plus -65504 would still overflow); transformers 4's double mask, which does
    # overflow, is the gpt2_4x tests'. Either way no step may read harmful or be skipped.
    assert all(r["applied"] for r in run.records)
    assert {r["overflow_harm"] for r in run.records if r["overflow"]} <= {"harmless"}
    assert run.summary["harmful_overflow_steps"] == 0
    assert run.summary["harmless_overflow_steps"] == sum(r["overflow"] for r in run.records)


# transformers 4.x's GPT-2 eager attention (tests/zoo.py, GPT2Eager4) on a padded batch: four
# 16-token sequences, the second and fourth ending in 4 padding tokens (targets -100 there).
PAD, SEQS = 4, 4


def _gpt2_4x_data():
    import torch
    import zoo

    ids = torch.randint(1, zoo.VOCAB, (SEQS, zoo.TOKENS), generator=torch.Generator().manual_seed(1))
    mask, target = zoo.padded(torch.roll(ids, -1, 1), PAD)
    return ids, mask, target


def _gpt2_4x_workload():
    """GPT2Eager4 as a TorchWorkload: its one input the ids and the mask stacked (N, 2, T); the batch
    all four sequences, so every step holds padded ones."""
    torch = pytest.importorskip("torch")
    import zoo

    from lossscale.training.workloads.torch_workloads import TorchWorkload

    class Stacked(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(input_ids=x[:, 0], attention_mask=x[:, 1])

    def next_token(out, y):  # the padding's targets are -100: cross-entropy leaves them out
        return torch.nn.functional.cross_entropy(out.logits.float().flatten(0, 1), y.flatten())

    model, _ = zoo.build("gpt2_eager4")
    ids, mask, target = _gpt2_4x_data()
    return TorchWorkload(Stacked(model), next_token, (torch.stack([ids, mask], 1), target), batch=SEQS,
                         learning_rate=0.05, name="gpt2-4.x")


def _run_gpt2_4x(profile: str, detector: str, scale: float = 1.0, **kw):
    return simulate(workload=_gpt2_4x_workload(), manager="fixed", manager_args={"loss_scale": scale},
                    profile=profile, detector=detector, steps=2, underflow_every=2, **kw)


def test_gpt2_4x_mask_overflows_natively_in_float16_and_the_softmax_zeroes_it(monkeypatch) -> None:
    """The independent probe: the 4.x model in plain torch float16. Every score of a key that is
    both after its query and padding is -65504 + -65504 = -inf, and only those; the softmax gives
    them exactly 0."""
    torch = pytest.importorskip("torch")
    import zoo

    zoo.transformers()
    model, _ = zoo.build("gpt2_eager4")
    ids, mask, _ = _gpt2_4x_data()
    scores, weights = [], []
    softmax = torch.nn.functional.softmax

    def spy(x, *args, **kwargs):
        scores.append(x.detach().clone())
        weights.append(softmax(x, *args, **kwargs))
        return weights[-1]

    monkeypatch.setattr(torch.nn.functional, "softmax", spy)
    model.half()(input_ids=ids, attention_mask=mask)
    assert len(scores) == 2 and all(s.dtype == torch.float16 for s in scores)  # one per layer
    t = zoo.TOKENS
    after = torch.arange(t)[None, :] > torch.arange(t)[:, None]  # key after query: causally masked
    both = after[None, None] & (mask == 0)[:, None, None, :]  # and padding
    assert int(both.sum()) == 2 * sum(range(t - PAD, t))  # 2 padded sequences: key j after j queries
    for s, w in zip(scores, weights, strict=True):
        assert torch.equal(torch.isneginf(s), both.expand_as(s)) and not torch.isnan(s).any()
        assert torch.all(w[both.expand_as(w)] == 0)


@pytest.mark.parametrize("profile", representatives(["atlas-training", "atlas-a2"], lambda p: p == "atlas-training"))
def test_gpt2_4x_mask_overflow_is_harmless_and_a_register_skip_for_it_needless(profile: str) -> None:
    """At scale 1 the device register records the mask's overflow in the forward pass (the
    attention's add, every step, in either overflow mode); the gradients stay finite. isfinite
    applies the step: harmless. tf-npu reads the register and skips it: skipped-needless (the
    update it dropped agreed with binary32's)."""
    applied = _run_gpt2_4x(profile, "isfinite", record_events=True)
    for r in applied.records:
        assert r["overflow"] and r["event_phases"] == "forward" and r["register"][0] == 1
        assert r["applied"] and r["overflow_harm"] == "harmless" and r["update_error"] <= HARMLESS_ERROR
    events = applied.events
    assert {(e["op"], e["phase"]) for e in events} == {("add", "forward")}
    assert {e["label"] for e in events} == {f"model.model.transformer.h.{i}.attn" for i in range(2)}
    assert all("OVERFLOW" in e["flags"] for e in events)
    s = applied.summary
    assert s["harmless_overflow_steps"] == 2 and s["harmful_overflow_steps"] == s["skipped_steps"] == 0
    skipped = _run_gpt2_4x(profile, "tf-npu")
    for r in skipped.records:
        assert r["overflow"] and not r["applied"] and not r["detector_finite"] and r["update_error"] == 1
        assert r["overflow_harm"] == "skipped-needless" and r["skipped_update_error"] <= HARMLESS_ERROR
    assert skipped.summary["needless_skip_steps"] == 2 and skipped.summary["needed_skip_steps"] == 0


def test_gpt2_4x_at_2_32_under_isfinite_in_saturation_mode_is_harmful() -> None:
    """The same model at 2**32: the backward pass saturates gradients at 65504 (finite), isfinite
    applies them, and the steps read harmful."""
    run = _run_gpt2_4x("atlas-training", "isfinite", 2.0**32)
    saturated = [r for r in run.records if r["grad_max"] * r["loss_scale"] == 65504.0]
    assert len(saturated) == 2
    for r in saturated:
        assert "backward" in r["event_phases"].split() and r["applied"] and r["detector_finite"]
        assert r["overflow_harm"] == "harmful" and r["update_error"] > 0.5
    assert run.summary["harmful_overflow_steps"] == 2


def test_scale_plot_marks_harmful_and_harmless_overflows() -> None:
    from lossscale.app.plots import figure_run

    run = simulate(detector="torch-npu", **{**LOGGED, "steps": 30})
    drawn = {line.get_label(): line for line in figure_run(run).axes[0].get_lines()}
    harmless = run.column("step")[run.column("overflow_harm") == "harmless"]
    mark = "harmless overflow (applied update within 2**-4 of binary32's)"
    assert harmless.size and np.array_equal(drawn[mark].get_xdata(), harmless)
    assert not any(k.startswith("harmful") for k in drawn)  # none happened
