"""The GPU frameworks' value checks (deepspeed-sum, fairseq-norm, megatron-norm) and clipping by
global norm, against independent references: numpy binary64 sums and norms of the same rule
(an overflow of binary32 is a binary64 value above FLT_MAX), and torch.nn.utils.clip_grad_norm_
itself on binary32 gradients.

Why a norm check never fires in saturation mode: a saturated gradient is 65504, finite, and so
is its binary32 sum of squares unless it passes FLT_MAX, which the hand-built cases below reach
(binary32 or bfloat16 values near 2**64, or tiny loss scales for the checks that unscale first).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from lossscale import simulate
from lossscale.training.detectors import DETECTORS, MegatronNorm, norm32
from lossscale.training.optimizers import clip_by_global_norm
from sim import Device

H, F = np.float16, np.float32
FLT_MAX = float(np.finfo(F).max)
NAMES = ["deepspeed-sum", "fairseq-norm", "megatron-norm"]


def decide(name: str, grads: list[list[np.ndarray]], scales: list[float] | None = None, det=None) -> list[bool]:
    det = det or DETECTORS[name]()
    det.scales = scales
    devices = [Device("atlas-training", "saturation") for _ in grads]
    return det.check(devices, grads), det


def oracle_norm(grads, scale: float = 1.0) -> float:
    """sqrt(sum((g / S)**2)) in binary64, no overflow short of 1e308."""
    return float(np.sqrt(sum(np.sum((np.asarray(g, np.float64) / scale) ** 2) for g in grads)))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_inf_nan_gradients_fire(name, bad) -> None:
    grads = [np.array([1, 2, 3], H), np.array([4, bad, 6], H)]
    [finite], _ = decide(name, [grads], [1024.0])
    assert finite is False


@pytest.mark.parametrize("name", NAMES)
def test_saturated_but_finite_gradients_do_not_fire(name) -> None:
    g = np.full(1000, 65504, H)  # what saturation mode leaves of an overflow
    grads = [g, np.array([-65504, 3], H)]
    [finite], det = decide(name, [grads], [1024.0])
    assert finite is True
    if name == "deepspeed-sum":
        assert det.norms[0] == 65504.0 * 1000  # the largest |sum|, exact in binary32
    else:
        assert det.norms[0] == pytest.approx(oracle_norm(grads, 1024.0), rel=2.0 ** -21)


def test_binary16_sum_of_squares_cannot_overflow_binary32() -> None:
    """A binary16 gradient's squares are at most 65504**2 < 2**32: (2**64 / 65504)**2 ~ 7.9e28
    of them are needed to pass FLT_MAX, far beyond any gradient."""
    assert 65504.0 ** 2 * 10 ** 9 < FLT_MAX / 1e10
    assert (2.0 ** 64 / 65504) ** 2 > 7.9e28
    assert np.isfinite(norm32([np.full(10 ** 6, 65504, H)]))


def test_a_finite_gradient_whose_sum_of_squares_overflows_binary32_fires_the_norm_check() -> None:
    g = np.array([2.0 ** 65, 2.0 ** 65], ml_dtypes.bfloat16)  # finite bfloat16 (and binary32) values
    assert np.isfinite(g.astype(F)).all()
    assert oracle_norm([g]) ** 2 > FLT_MAX  # binary64: the binary32 sum of squares overflows
    [fairseq], det = decide("fairseq-norm", [[g]])
    assert fairseq is False and det.norms == [float("inf")]
    [deepspeed], det = decide("deepspeed-sum", [[g]])
    assert deepspeed is True and det.norms == [2.0 ** 66]  # the plain sum does not overflow
    # just below: 2**63 each, the squares sum to 2**127 < FLT_MAX
    [fine], det = decide("fairseq-norm", [[np.array([2.0 ** 63, 2.0 ** 63], F)]])
    assert fine is True and det.norms[0] == pytest.approx(oracle_norm([[2.0 ** 63, 2.0 ** 63]]), rel=2.0 ** -22)


def test_a_tiny_loss_scale_overflows_the_unscaled_norm() -> None:
    """Saturated binary16 gradients unscaled by 1/S with S = 2**-60: (65504 * 2**60)**2 * 4 ~ 2.3e46 >
    FLT_MAX. Megatron takes the norm of the unscaled grads, so it is Inf, yet found_inf (checked
    on the scaled values) is clear and the default threshold (inf) never skips; fairseq takes the
    norm of the scaled grads (2 * 65504) and multiplies by 1/S after: finite."""
    grads = [np.full(4, 65504, H)]
    scale = 2.0 ** -60
    assert oracle_norm(grads, scale) ** 2 > FLT_MAX > oracle_norm(grads, scale)
    [megatron], det = decide("megatron-norm", [grads], [scale])
    assert megatron is True and det.norms == [float("inf")]
    [skips], _ = decide("megatron-norm", [grads], [scale], det=MegatronNorm(skip_threshold=1e30))
    assert skips is False
    [fairseq], det = decide("fairseq-norm", [grads], [scale])
    assert fairseq is True and det.norms[0] == pytest.approx(oracle_norm(grads, scale), rel=2.0 ** -21)
    # fairseq's product 1/S * norm overflows once S < 2 * 65504 / FLT_MAX
    [overflows], _ = decide("fairseq-norm", [grads], [2.0 ** -112])
    assert 2 * 65504 * 2.0 ** 112 > FLT_MAX and overflows is False


@pytest.mark.parametrize("name", NAMES)
def test_ranks_reduce_the_flag_unless_not_distributed(name) -> None:
    grads = [[np.ones(3, H)], [np.array([1, np.inf, 1], H)]]
    both, _ = decide(name, grads, [1.0, 1.0])
    alone, _ = decide(name, grads, [1.0, 1.0], det=DETECTORS[name](distributed=False))
    assert both == [False, False] and alone == [True, False]


def test_megatron_threshold_is_checked() -> None:
    with pytest.raises(ValueError, match="skip_threshold must be a number"):
        MegatronNorm(skip_threshold=float("nan"))


def torch_clip(grads: list[np.ndarray], max_norm: float) -> tuple[list[np.ndarray], float]:
    torch = pytest.importorskip("torch")
    params = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float32))
        p.grad = torch.from_numpy(g.copy())
        params.append(p)
    total = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return [p.grad.numpy() for p in params], float(total)


CASES = {
    # sums of squares exact in binary32 in any order: the norm is order-free, so torch's bits are fixed
    "integers": [np.arange(-20, 20, dtype=F).reshape(5, 8), np.array([3, -4, 12], F)],
    "dyadic": [np.array([0.5, -0.25, 1.5, 2.0], F), np.array([[8.0, 0.125]], F), np.array([-6.0], F)],
    "one element": [np.array([7.0], F)],
    "overflowing norm": [np.array([3e19, 3e19], F)],
    "infinite gradient": [np.array([np.inf, 1.0], F), np.array([2.0, 3.0], F)],
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("max_norm", [0.1, 1.0, 3.0, 1e3])
def test_clipping_matches_torch_bit_for_bit(case, max_norm) -> None:
    grads = CASES[case]
    want, total = torch_clip(grads, max_norm)
    got = [g for g, _ in clip_by_global_norm([(g, None) for g in grads], max_norm)]
    np.testing.assert_array_equal(np.float32(total), norm32(grads))
    for w, g in zip(want, got, strict=True):
        assert g.dtype == F
        np.testing.assert_array_equal(w.view(np.uint32), g.view(np.uint32))  # NaN payloads and zero signs too


def test_clipping_follows_the_rule_on_random_gradients() -> None:
    rng = np.random.default_rng(5)
    grads = [(rng.standard_normal(s) * 10).astype(F) for s in [(30, 7), (100,), (3,)]]
    norm = oracle_norm(grads)
    coef = min(1.0, 2.0 / (norm + 1e-6))
    got = clip_by_global_norm([(g, None) for g in grads], 2.0)
    for g, (c, _) in zip(grads, got, strict=True):
        np.testing.assert_allclose(c, g * coef, rtol=2.0 ** -20)
    assert oracle_norm([c for c, _ in got]) == pytest.approx(2.0, rel=2.0 ** -18)
    kept = clip_by_global_norm([(g, None) for g in grads], 10 * norm)
    assert all(np.array_equal(g, c) for g, (c, _) in zip(grads, kept, strict=True))


def test_norm_detectors_never_fire_in_saturation_mode_in_a_run() -> None:
    run = simulate(detector="fairseq-norm", profile="atlas-training", steps=8, record_events=False)
    rows = run.records
    assert any(r["overflow"] for r in rows)
    assert all(r["detector_finite"] for r in rows) and run.summary["skipped_steps"] == 0


def test_clip_grad_norm_setting() -> None:
    plain = simulate(profile="atlas-training", detector="isfinite", steps=6, record_events=False)
    clipped = simulate(profile="atlas-training", detector="isfinite", steps=6, record_events=False, clip_grad_norm=1e-8)
    assert clipped.summary["arguments"]["clip_grad_norm"] == 1e-8
    assert plain.summary["arguments"]["clip_grad_norm"] is None
    assert not np.array_equal(plain.column("loss"), clipped.column("loss"))
    with pytest.raises(ValueError, match="clip_grad_norm must be a finite number above 0"):
        simulate(clip_grad_norm=-1.0, steps=1)


def fp8_run(**fp8_args):
    return simulate(profile="atlas-350", ranks=2, steps=3, fp8="delayed", record_events=False,
                    fp8_args={"amax_history_len": 1, **fp8_args})


def by_tensor(rows):
    out: dict[tuple[int, str], dict[int, dict]] = {}
    for r in rows:
        out.setdefault((r["step"], r["tensor"]), {})[r["rank"]] = r
    return out


def test_delayed_scaling_reduces_amax_over_ranks() -> None:
    """amax_history_len=1, margin 0: the scale of step t+1 is fp8_max / max over ranks of step t's
    amax (binary32), the same on every rank (TE's reduce_amax, its default)."""
    fp8_max = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}  # the OCP FP8 formats' largest finite values
    table = by_tensor(fp8_run().fp8)
    assert any(len({r["amax"] for r in ranks.values()}) > 1 for ranks in table.values())  # the ranks' data differ
    checked = 0
    for (step, tensor), ranks in table.items():
        assert len({r["scale"] for r in ranks.values()}) == 1, (step, tensor)
        if step == 0:
            continue
        top = max(r["amax"] for r in table[(step - 1, tensor)].values())
        previous = table[(step - 1, tensor)][0]["scale"]
        with np.errstate(all="ignore"):  # TE keeps the scale where the amax is not finite and positive
            want = np.float32(fp8_max[ranks[0]["format"]]) / np.float32(top) if 0 < top < np.inf else previous
        want = min(want, float(np.finfo(np.float32).max))
        assert ranks[0]["scale"] == float(want), (step, tensor)
        checked += 1
    assert checked > 0


def test_delayed_scaling_without_reduction_parts_and_warns() -> None:
    with pytest.warns(UserWarning, match="FP8 scales differ across ranks"):
        table = by_tensor(fp8_run(reduce_amax=False).fp8)
    assert any(len({r["scale"] for r in ranks.values()}) > 1 for ranks in table.values())
    with pytest.raises(ValueError, match="reduce_amax must be true or false"):
        fp8_run(reduce_amax="maybe")
