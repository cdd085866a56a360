"""FP8 scaling recipes (Transformer Engine's delayed and current scaling, MX blocks) as policies,
the FP8 matmul hook, and training with FP8 matmuls on atlas-350."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

from lossscale import simulate
from lossscale.testing import PolicyError, check_policy
from lossscale.training.fp8 import (
    CurrentScaling,
    DelayedScaling,
    Fp8Matmuls,
    MXScaling,
    Recipe,
    TensorScaler,
    amax_of,
    make_recipe,
)
from lossscale.training.phases import begin_phase
from lossscale.training.records import FP8_COLUMNS
from sim import Device

from groups import representatives  # noqa: E402

F32 = np.float32
FLT_MAX = float(np.finfo(F32).max)


def te_delayed(amaxes: list[float], fp8_max: float, margin: int, length: int, algo: str) -> list[float]:
    """Transformer Engine's delayed scaling written out with numpy arrays, as its kernels do it:
    history[0] = amax; amax = max(history) or history[0]; scale = (fp8_max * 2**-margin) / amax
    if finite and > 0 else kept, Inf -> FLT_MAX; history = roll(history, -1); history[0] = 0."""
    history, scale, used = np.zeros(length, F32), F32(1), []
    for a in amaxes:
        used.append(float(scale))
        history[0] = a
        m = history[0] if algo == "most_recent" else np.fmax.reduce(history)
        if np.isfinite(m) and m > 0:
            with np.errstate(over="ignore"):
                s = F32(F32(fp8_max) * F32(2.0**-margin)) / F32(m)
            scale = F32(FLT_MAX) if np.isinf(s) else s
        history = np.roll(history, -1)
        history[0] = 0
    return used


AMAXES = [3.0, 0.5, 0.0, 7.0, math.inf, 2.0, math.nan, 1e-44, 0.25, 100.0, 1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize(("margin", "length"), [(0, 1), (0, 3), (1, 4), (3, 1024)])
def test_delayed_scaling_is_transformer_engines(algo: str, margin: int, length: int) -> None:
    scaler = TensorScaler(DelayedScaling(margin=margin, amax_history_len=length, amax_compute_algo=algo), 448.0)
    used = []
    for a in AMAXES:
        used.append(scaler.scale_for(a))
        scaler.update(a)
    assert used == te_delayed(AMAXES, 448.0, margin, length, algo)


def test_delayed_scaling_hand_worked() -> None:
    s = TensorScaler(DelayedScaling(amax_history_len=2), 448.0)
    assert s.get_scale() == 1.0
    s.update(7.0)
    assert s.get_scale() == 64.0  # 448 / 7
    s.update(0.0)  # history (0, 7) -> max 7, kept
    assert s.get_scale() == 64.0
    s.update(14.0)  # history (14, 0): the 7 rolled out
    assert s.get_scale() == 32.0
    s.update(1.0)  # history (1, 14): max 14
    assert s.get_scale() == 32.0
    s.update(math.inf)  # history (inf, 1): not finite, kept
    assert s.get_scale() == 32.0
    s.update(2.0)  # history (2, inf): the Inf holds the scale for the history's length
    assert s.get_scale() == 32.0
    s.update(2.0)  # history (2, 2): the Inf rolled out
    assert s.get_scale() == 224.0
    one = TensorScaler(DelayedScaling(amax_history_len=1), 448.0)
    one.update(1e-44)  # 448 / 1e-44 overflows binary32: FLT_MAX
    assert one.get_scale() == FLT_MAX


def test_current_scaling() -> None:
    r = CurrentScaling()
    s = TensorScaler(r, 57344.0)
    assert s.scale_for(7.0) == float(F32(57344.0) / F32(7.0))
    for bad in (0.0, math.inf, math.nan):
        assert s.scale_for(bad) == 1.0
    assert TensorScaler(CurrentScaling(amax_epsilon=1.0), 448.0).scale_for(0.5) == 448.0
    assert TensorScaler(r, 448.0).scale_for(1e-44) == FLT_MAX


@pytest.mark.parametrize("recipe", [DelayedScaling(), DelayedScaling(amax_history_len=3, margin=1),
                                    DelayedScaling(amax_compute_algo="most_recent"), CurrentScaling(), MXScaling()],
                         ids=repr)
def test_recipes_pass_check_policy(recipe: Recipe) -> None:
    check_policy(lambda: TensorScaler(recipe, 448.0), max_examples=60)


@dataclass(frozen=True)
class _TooBig(CurrentScaling):
    def scale(self, state, amax, fp8_max):
        with np.errstate(over="ignore"):
            return min(F32(2) * super().scale(state, amax, fp8_max), F32(FLT_MAX))


@dataclass(frozen=True)
class _NanOnInf(CurrentScaling):
    def scale(self, state, amax, fp8_max):
        with np.errstate(all="ignore"):
            return F32(fp8_max) / F32(amax) if amax == amax else F32(1)


def test_check_policy_catches_broken_recipes() -> None:
    with pytest.raises(PolicyError, match="beyond the format's MAX"):
        check_policy(lambda: TensorScaler(_TooBig(), 448.0), max_examples=60)
    with pytest.raises(PolicyError, match="the scale is inf"):
        check_policy(lambda: TensorScaler(_NanOnInf(), 448.0), max_examples=100)


def test_bad_recipe_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="fp8_format"):
        DelayedScaling(fp8_format="E3M4")
    with pytest.raises(ValueError, match="amax_compute_algo"):
        DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(ValueError, match="amax_history_len"):
        DelayedScaling(amax_history_len=0)
    with pytest.raises(ValueError, match="valid: delayed, current, mx"):
        make_recipe("tensorwise")
    with pytest.raises(ValueError, match="not hifloat8$"):
        MXScaling(fp8_format="HIF8")
    with pytest.raises(ValueError, match="'cann1' does not serve training's binary32 operands; valid: floor, "):
        MXScaling(rule="cann1")


def test_amax_passes_over_nan_as_fmaxf() -> None:
    assert amax_of(np.array([1.0, np.nan, -3.0], np.float16)) == 3.0
    assert amax_of(np.array([np.nan], np.float32)) == 0.0
    assert amax_of(np.array([1.0, -np.inf], np.float32)) == math.inf


def sum_in_order(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(M, K) @ (K, N) of 8-bit values as the cube unit's documentation says: exact products (a
    product of two 8-bit values has at most 8 significant bits, exact in binary32) added along k in
    ascending order, each addition rounded in binary32 by numpy."""
    a, b = a.astype(F32), b.astype(F32)
    total = np.zeros((a.shape[0], b.shape[1]), F32)
    for k in range(a.shape[1]):
        total = total + a[:, k:k + 1] * b[k:k + 1, :]
    return total


def test_the_hook_quantises_each_operand_with_its_scale() -> None:
    """Against Transformer Engine's current scaling written out with numpy and ml_dtypes: scale =
    448 / amax in binary32, operand * scale in binary32 cast to E4M3 (round to nearest even), the
    in-order binary32 sum times 1/scale_a * 1/scale_b (each reciprocal rounded to binary32), then
    binary16. No operand can overflow: |x * scale| <= 448 * (1 + 2**-24)**2 rounds to 448."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((4, 64)).astype(np.float16)
    b = rng.standard_normal((64, 3)).astype(np.float16)
    dev, hook = Device("atlas-350"), Fp8Matmuls(CurrentScaling())
    dev.substitute("matmul", hook)
    begin_phase(dev, "forward", step=0)
    got = dev.matmul(a, b)
    sa = F32(448) / np.abs(a).max().astype(F32)
    sb = F32(448) / np.abs(b).max().astype(F32)
    a8 = (a.astype(F32) * sa).astype(ml_dtypes.float8_e4m3fn)
    b8 = (b.astype(F32) * sb).astype(ml_dtypes.float8_e4m3fn)
    scale_inv = (F32(1) / sa) * (F32(1) / sb)
    want = (sum_in_order(a8, b8) * scale_inv).astype(np.float16)
    assert np.array_equal(got, want)
    assert [r["tensor"] for r in hook.rows] == ["matmul.forward.0.a", "matmul.forward.0.b"]
    assert [r["scale"] for r in hook.rows] == [float(sa), float(sb)] and hook.rows[0]["saturated"] == 0
    assert set(hook.rows[0]) == set(FP8_COLUMNS)


@pytest.mark.filterwarnings("ignore:atlas-350. saturation mode is kept")
@pytest.mark.parametrize("overflow", ["inf_nan", "saturation"])
def test_the_hook_counts_the_casts_that_overflow(overflow: str) -> None:
    """Delayed scaling quantises the first step with scale 1: every |a| above 464 overflows, and
    nothing else: 464 is half-way between E4M3's largest 448 (1.75 * 2**8, OCP OFP8 v1.0 table 1)
    and the next step 480, and the tie goes to 448, whose significand is even."""
    a = np.array([[1.0, 448.0, 464.0, 465.0, -500.0, 60000.0, -0.5, 2.0]], np.float16)
    dev, hook = Device("atlas-350", overflow), Fp8Matmuls(DelayedScaling())
    dev.substitute("matmul", hook)
    begin_phase(dev, "forward", step=0)
    dev.matmul(a, np.ones((8, 1), np.float16))
    assert hook.rows[0]["scale"] == 1.0 and hook.rows[0]["saturated"] == 3 and hook.rows[1]["saturated"] == 0
    assert hook.rows[0]["nonfinite"] == (3 if overflow == "inf_nan" else 0)


def mx_reference(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """OCP MX v1.0 (section 6.3) quantisation to MXFP8 E4M3 in blocks of 32 along ``axis``: the
    shared scale is 2**(floor(log2(amax)) - 8) (8: E4M3's largest exponent), each element
    x / scale rounded to nearest even and saturated at 448. Returns (elements, scale per element)."""
    x = np.moveaxis(x.astype(np.float64), axis, 0)
    blocks = x.reshape(x.shape[0] // 32, 32, *x.shape[1:])
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    scale = np.broadcast_to(2.0 ** (np.floor(np.log2(amax)) - 8), blocks.shape).reshape(x.shape)
    elements = np.clip(x / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return np.moveaxis(elements, 0, axis), np.moveaxis(scale, 0, axis)


@pytest.mark.parametrize("recipe", ["delayed", "current", "mx"])
def test_training_on_atlas_350_writes_scale_trajectories(recipe: str) -> None:
    run = simulate("mlp", profile="atlas-350", fp8=recipe, steps=12)
    tensors = {r["tensor"] for r in run.fp8}
    assert {"fc1.forward.0.a", "fc2.backward.0.b"} <= tensors  # every matmul's two operands
    assert len(run.fp8) == 12 * len(tensors)
    assert run.summary["fp8"]["tensors"] == len(tensors)
    fmt = {r["format"] for r in run.fp8 if ".backward." in r["tensor"]}
    assert fmt == ({"float8_e5m2"} if recipe != "mx" else {"float8_e4m3fn"})
    if recipe == "delayed":
        first = [r["scale"] for r in run.fp8 if r["tensor"] == "fc1.forward.0.a"]
        assert first[0] == 1.0 and first[1] != 1.0  # the first step quantises with the initial scale


def test_mx_runs_stacked_matmuls_matrix_by_matrix() -> None:
    """Against MX v1.0 written out with numpy and ml_dtypes (:func:`mx_reference`); each block's
    in-order binary32 sum is multiplied by a's block scale, then b's, and the blocks' partial sums
    added in order in binary32 (the scales are powers of two: those products are exact here)."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 4, 64)).astype(np.float16)
    b = rng.standard_normal((64, 5)).astype(np.float16)  # broadcast against the stack
    dev, hook = Device("atlas-350"), Fp8Matmuls(MXScaling())
    dev.substitute("matmul", hook)
    begin_phase(dev, "forward", step=0)
    got = dev.matmul(a, b)
    b8, b_scale = mx_reference(b, axis=0)
    want = []
    for x in a:
        x8, x_scale = mx_reference(x, axis=1)
        total = np.zeros((4, 5), F32)
        for lo in (0, 32):
            part = sum_in_order(x8[:, lo:lo + 32], b8[lo:lo + 32])
            total = total + part * x_scale[:, lo:lo + 1].astype(F32) * b_scale[lo:lo + 1].astype(F32)
        want.append(total.astype(np.float16))
    assert got.shape == (3, 4, 5) and np.array_equal(got, np.stack(want))
    assert [r["tensor"] for r in hook.rows] == ["matmul.forward.0.a", "matmul.forward.0.b"]


@pytest.mark.parametrize("recipe", representatives(["delayed", "mx", "nvfp4", "block"],
                                                   lambda r: r in ("delayed", "nvfp4")))
def test_a_torch_models_matmuls_run_in_fp8(recipe: str) -> None:
    """Every backward matmul (linear layers and attention's products) is matched to its forward:
    as many dgrad and wgrad GEMMs as fprop ones (the embedding's gradient is no matmul)."""
    pytest.importorskip("torch")
    run = simulate("torch-transformer", profile="atlas-350", fp8=recipe, steps=2)
    names = {r["tensor"] for r in run.fp8}
    assert any(".backward." in n for n in names) and run.summary["fp8"]["tensors"] == len(names) > 10
    gemms = [r["gemm"] for r in run.fp8 if r["step"] == 0]
    assert gemms.count("fprop") == gemms.count("dgrad") == gemms.count("wgrad") == len(gemms) / 3


def test_hifloat8_recipe_and_saturation() -> None:
    run = simulate("mlp", profile="atlas-350", overflow_mode="saturation", fp8="current",
                   fp8_args={"fp8_format": "HIF8"}, steps=6)
    assert {r["format"] for r in run.fp8} == {"hifloat8"}
    assert run.summary["fp8"]["nonfinite_elements"] == 0  # saturation: no NaN or Inf reaches the operands
    with pytest.raises(ValueError, match="fp8_args go with"):
        simulate("mlp", profile="atlas-350", fp8_args={"margin": 1}, steps=1)


@pytest.mark.slow  # the CLI end to end; the default run keeps the recipes and fp8.csv's columns
def test_the_command_writes_and_redraws_the_fp8_log(capsys, tmp_path) -> None:
    from lossscale.app.cli import main
    from lossscale.app.files import read_run

    out = tmp_path / "run"
    assert main(["run", "--profile", "atlas-350", "--fp8", "current", "--fp8-arg", "fp8_format=E4M3", "--steps", "4",
                 "--out", str(out), "--quiet"]) in (0, None)
    printed = capsys.readouterr().out
    assert "fp8 matmuls: CurrentScaling (fp8_format=E4M3" in printed
    run = read_run(out)
    assert len(run.fp8) == 4 * run.summary["fp8"]["tensors"] and (out / "fp8.png").exists()
    assert main(["plot", str(out), "--format", "svg"]) in (0, None)
    assert (out / "fp8.svg").read_bytes().startswith(b"<?xml")
    for bad, says in ((["--fp8-arg", "margin=one"], "margin must be an integer"),
                      (["--fp8-arg", "fp8_format=E3M4"], "unknown fp8_format"),
                      (["--fp8-arg", "bogus=1"], "takes no argument 'bogus'; valid: fp8_format, gemms, keep, margin")):
        code = main(["run", "--fp8", "delayed", *bad, "--steps", "2", "--out", str(tmp_path / "x"), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_sweep_over_recipes_and_modes(capsys, tmp_path) -> None:
    import csv

    from lossscale.app.cli import main

    grid = tmp_path / "grid.toml"
    grid.write_text('[sweep]\nprofile = "atlas-350"\nsteps = 5\n'
                    '[grid]\nfp8 = ["delayed", "current", "mx"]\noverflow_mode = ["inf_nan", "saturation"]\n')
    out = tmp_path / "sweep"
    argv = ["sweep", str(grid), "--out", str(out), "--workers", "1", "--quiet", "--heatmap", "fp8,overflow_mode"]
    assert main(argv) in (0, None)
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["fp8"] for r in rows] == ["delayed", "delayed", "current", "current", "mx", "mx"]
    assert all(r["status"] == "ok" for r in rows)
    # Current scaling cannot overflow (|x * 448 / amax| <= 448 * (1 + 2**-24)**2 rounds to 448 or
    # 57344 likewise); delayed scaling with saturation does on this run (the scale of step k comes
    # from earlier amaxes), and the column is the run's count of saturated casts in its fp8 log.
    overflowed = {(r["fp8"], r["overflow_mode"]): int(r["fp8_overflowed_elements"]) for r in rows}
    assert overflowed[("current", "inf_nan")] == overflowed[("current", "saturation")] == 0
    run = simulate("mlp", profile="atlas-350", fp8="delayed", overflow_mode="saturation", steps=5)
    assert overflowed[("delayed", "saturation")] == sum(r["saturated"] for r in run.fp8) > 0
    assert (out / "sweep.png").exists()
    grid.write_text('[sweep]\nsteps = 5\n[grid]\nfp8 = ["delayed", "tensorwise"]\nfp8_args = [{}, {margin = "x"}]\n')
    code = main(["sweep", str(grid), "--out", str(tmp_path / "bad"), "--workers", "1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown FP8 recipe 'tensorwise'" in err and "margin must be an integer" in err


class _OneMatmul:
    """Each rank's forward is one matmul of its shard (rows of binary16 values) by a fixed 2x2
    matrix, so each rank's amax of operand a is the largest |value| of its own shard."""

    name, has_accuracy, marks_phases = "one-matmul", False, True
    ROWS = np.array([[1.5, -3.0], [0.25, 0.5], [-20.0, 2.0], [7.0, 0.125]], np.float16)  # rank 0: 3.0, rank 1: 20.0

    def init_params(self):
        return [np.eye(2, dtype=np.float32)]

    def optimizer(self):
        from lossscale.training.optimizers import SGD
        return SGD(0.01)

    def batches(self, steps):
        return [self.ROWS] * steps

    def shards(self, batch, ranks):
        return [(part, len(part) / len(batch)) for part in np.array_split(batch, ranks)]

    def forward_backward(self, dev, params, scale, part, share=1.0):
        dev.matmul(part, params[0].astype(np.float16), out_dtype=np.float16)
        return 0.0, [np.zeros((2, 2), np.float16)]

    def grads32(self, params, part, share=1.0):
        return 0.0, [np.zeros((2, 2), np.float32)]

    def evaluate(self, params):
        return {"loss": 0.0, "accuracy": float("nan")}


def _current_scales(reduce_amax: bool) -> tuple[dict[int, float], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = simulate(workload=_OneMatmul(), profile="atlas-350", fp8="current", fp8_args={"reduce_amax": reduce_amax},
                       ranks=2, steps=1, record_events=False)
    return ({r["rank"]: r["scale"] for r in run.fp8 if r["tensor"].endswith(".a")},
            [str(w.message) for w in caught if "FP8 scales differ" in str(w.message)])


def test_current_scaling_reduces_amax_over_the_ranks() -> None:
    halves = np.array_split(_OneMatmul.ROWS.astype(np.float32), 2)
    local = [float(np.max(np.abs(h))) for h in halves]  # 3.0 and 20.0
    e4m3_max = np.float32(448.0)  # HYBRID's forward format, E4M3
    scales, said = _current_scales(True)
    assert scales == {0: float(e4m3_max / np.float32(max(local))), 1: float(e4m3_max / np.float32(max(local)))}
    assert said == []
    scales, said = _current_scales(False)
    assert scales == {r: float(e4m3_max / np.float32(a)) for r, a in enumerate(local)}
    assert len(said) == 1 and "set reduce_amax=true" in said[0] and "with_amax_reduction" in said[0]
    assert "as Transformer Engine does by default" not in said[0]  # TE's current scaling does not reduce by default
