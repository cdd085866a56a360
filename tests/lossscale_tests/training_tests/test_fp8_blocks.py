"""The block recipes in training (NVFP4, MXFP8, block-scaled FP8): their GEMMs against the formats'
own quantisers and a block sum written out here, the GEMM each matmul is found to be, the layers
and GEMMs left in binary16, and fp8.csv's block columns."""

from __future__ import annotations

import numpy as np
import pytest
from runs import same  # noqa: E402

from lossscale import simulate
from lossscale.training.fp8 import HADAMARD16, BlockScaling, Fp8Matmuls, MXFP8Scaling, NVFP4Scaling, make_recipe
from lossscale.training.operands import Roles
from lossscale.training.phases import begin_phase
from sim import Device, blockfp8, mx, nvfp4
from sim.formats import FLOAT4_E2M1FN, FLOAT8_E4M3FN, decode

F32 = np.float32


def block_sum(a: np.ndarray, b: np.ndarray, sa: np.ndarray, sb: np.ndarray, block: int) -> np.ndarray:
    """(M, K) @ (K, N) of element values with a binary32 scale per block of K: per block the exact
    products added along k in order in binary32, times a's scale, then b's; the blocks added in order."""
    total = np.zeros((a.shape[0], b.shape[1]), F32)
    for j, lo in enumerate(range(0, a.shape[1], block)):
        part = np.zeros_like(total)
        for k in range(lo, min(lo + block, a.shape[1])):
            part = part + np.outer(a[:, k], b[k]).astype(F32)
        total = total + (part * sa[:, j:j + 1]) * sb[j:j + 1]
    return total


def one_matmul(recipe, a: np.ndarray, b: np.ndarray, phase: str = "forward") -> tuple[np.ndarray, Fp8Matmuls]:
    dev, hook = Device("atlas-350"), Fp8Matmuls(recipe)
    dev.substitute("matmul", hook)
    begin_phase(dev, phase, step=0)
    return dev.matmul(a, b, out_dtype=F32), hook


def operands(m: int = 8, k: int = 160, n: int = 24, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-6, 6, (m, k)))).astype(np.float16)
    return a, rng.standard_normal((k, n)).astype(np.float16)


def test_nvfp4_forward_gemm_is_its_quantised_blocks_summed() -> None:
    """The activation in 1 x 16 blocks along K, the weight in 16 x 16 tiles, each with its tensor
    scale from its own amax (sim.nvfp4, held to torchao's quantiser elsewhere); the sum times
    ts_a * ts_b (binary32)."""
    a, b = operands()
    got, hook = one_matmul(NVFP4Scaling(), a, b)
    qa = nvfp4.quantize(a, axis=1)
    qb = nvfp4.quantize(b, axis=0, tile=16)
    sa = decode(qa.scales, FLOAT8_E4M3FN).astype(F32)
    sb = decode(qb.scales, FLOAT8_E4M3FN).astype(F32).T
    ea, eb = (decode(q.elements, FLOAT4_E2M1FN).astype(F32) for q in (qa, qb))
    want = block_sum(ea, eb, sa, sb, 16) * (qa.tensor_scale * qb.tensor_scale)
    assert np.array_equal(got, want)
    rows = {r["tensor"]: r for r in hook.rows}
    assert rows["matmul.forward.0.a"]["blocks"] == 8 * 10 and rows["matmul.forward.0.b"]["blocks"] == 24 * 10
    assert rows["matmul.forward.0.a"]["gemm"] == "fprop"


@pytest.mark.parametrize("pow2", [True, False])
def test_block_fp8_gemm_takes_128_blocks_and_weight_tiles(pow2: bool) -> None:
    a, b = operands(k=200, n=130)
    got, hook = one_matmul(BlockScaling(pow2=pow2), a, b)
    qa = blockfp8.quantize(a, axis=1, pow2=pow2)
    qb = blockfp8.quantize(b, axis=0, tile=128, pow2=pow2)
    ea, eb = (decode(q.elements.view(np.uint8), FLOAT8_E4M3FN).astype(F32) for q in (qa, qb))
    assert np.array_equal(got, block_sum(ea, eb, qa.scale_inv, qb.scale_inv.T, 128))
    b_row = next(r for r in hook.rows if r["tensor"].endswith(".b"))
    assert b_row["blocks"] == 130 * 2  # a scale per 128 rows of each column: repeated over a tile's columns
    scales = 1 / qb.scale_inv.astype(np.float64)
    assert (b_row["scale_min"], b_row["scale_max"]) == (scales.min(), scales.max())


def test_mxfp8_is_e4m3_with_the_round_up_rule() -> None:
    a, b = operands()
    got, _ = one_matmul(MXFP8Scaling(), a, b, phase="backward")  # E4M3 in the backward pass too
    qa, qb = (mx.quantize(x, "float8_e4m3fn", axis=axis, rule="rceil") for x, axis in ((a, 1), (b, 0)))
    sa, sb = (decode(q.scales, "float8_e8m0fnu").astype(F32) for q in (qa, qb))
    ea, eb = (decode(q.elements.view(np.uint8), FLOAT8_E4M3FN).astype(F32) for q in (qa, qb))
    assert np.array_equal(got, block_sum(ea, eb, sa, sb, 32))


def test_underflow_and_clamping_are_counted_per_block() -> None:
    """Hand-worked NVFP4 (one block, no tensor scale): amax 6 gives block scale 1; 0.2 is below
    E2M1's smallest half step 0.25 and becomes 0 (0.25 itself ties to even: 0); 0 stays 0 and is
    not counted. With amax 7 * 448 * 6 ... the E4M3 scale clamps at 448 only past its range."""
    a = np.zeros((1, 16), np.float16)
    a[0, :4] = [6.0, 0.2, 0.25, 0.3]
    _, hook = one_matmul(NVFP4Scaling(two_level=False), a, np.ones((16, 1), np.float16))
    row = hook.rows[0]
    assert (row["underflowed"], row["blocks"], row["saturated"], row["elements"]) == (2, 1, 0, 16)
    assert row["scale"] == row["scale_min"] == row["scale_max"] == 1.0


def test_each_matmul_is_found_to_be_its_layers_gemm() -> None:
    """y = x @ w, then dx = dy @ w.T (dgrad), dw = x.T @ dy (wgrad) or (dy.T @ x).T as torch
    computes it for a weight stored transposed; a backward matmul of no forward's operands is
    'backward'."""
    rng = np.random.default_rng(0)
    x, w, dy = (rng.standard_normal(s).astype(np.float16) for s in ((4, 6), (6, 5), (4, 5)))
    roles = Roles()
    assert roles.of("fc", "forward", x, w) == ("fprop", "activation", "weight")
    assert roles.of("fc", "backward", dy, np.ascontiguousarray(w.T)) == ("dgrad", "gradient", "weight")
    assert roles.of("fc", "backward", np.ascontiguousarray(x.T), dy) == ("wgrad", "activation", "gradient")
    assert roles.of("fc", "backward", np.ascontiguousarray(dy.T), x) == ("wgrad", "gradient", "activation")
    assert roles.of("other", "backward", dy, np.ascontiguousarray(w.T)) == ("backward", "gradient", "gradient")
    roles.clear()
    assert roles.of("fc", "backward", dy, np.ascontiguousarray(w.T))[0] == "backward"


def test_the_mlps_gemms_in_fp8_csv() -> None:
    run = simulate("mlp", profile="atlas-350", fp8="block", steps=1)
    gemm = {r["tensor"].rsplit(".", 1)[0]: r["gemm"] for r in run.fp8}
    assert gemm == {"fc1.forward.0": "fprop", "fc2.forward.0": "fprop", "fc2.backward.0": "wgrad",
                    "fc2.backward.1": "dgrad", "fc1.backward.0": "wgrad"}


def test_a_kept_layer_runs_in_binary16() -> None:
    """Every layer kept: the run is the run without FP8, step for step."""
    plain = simulate("mlp", profile="atlas-350", steps=4)
    kept = simulate("mlp", profile="atlas-350", fp8="nvfp4", fp8_args={"keep": "*"}, steps=4)
    assert same(kept.records, plain.records) and kept.fp8 == []
    fc1_only = simulate("mlp", profile="atlas-350", fp8="mxfp8", fp8_args={"keep": "fc2", "gemms": "fprop,wgrad"},
                        steps=1)
    assert {(r["tensor"].split(".")[0], r["gemm"]) for r in fc1_only.fp8} == {("fc1", "fprop"), ("fc1", "wgrad")}


def test_nvfp4_rounds_gradients_stochastically_only() -> None:
    """dgrad: the gradient operand (a) takes the device's block unit's random bits (its seed), the
    weight (b) rounds to nearest even."""
    a, w = operands(n=24)
    dy = np.ascontiguousarray(a[:, :24])
    rows = []
    for seed in (0, 1):
        dev, hook = Device("atlas-350", seed=seed), Fp8Matmuls(NVFP4Scaling())
        dev.substitute("matmul", hook)
        begin_phase(dev, "forward", step=0)
        dev.matmul(a, w)
        begin_phase(dev, "backward")
        dev.matmul(dy, np.ascontiguousarray(w.T))
        rows.append({r["tensor"]: r["rel_error"] for r in hook.rows})
    assert rows[0]["matmul.backward.0.a"] != rows[1]["matmul.backward.0.a"]
    assert rows[0]["matmul.backward.0.b"] == rows[1]["matmul.backward.0.b"]
    assert rows[0]["matmul.forward.0.a"] == rows[1]["matmul.forward.0.a"]


def test_bad_block_recipe_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="NVFP4's elements are float4_e2m1fn"):
        make_recipe("nvfp4", fp8_format="E4M3")
    with pytest.raises(ValueError, match="block-scaled FP8 holds"):
        BlockScaling(fp8_format="HIF8")
    with pytest.raises(ValueError, match="gemms: unknown 'fwd'; valid: fprop, dgrad, wgrad"):
        make_recipe("block", gemms="fwd")
    with pytest.raises(ValueError, match="pow2 must be true or false"):
        BlockScaling(pow2="yes")
    with pytest.raises(ValueError, match="keep must be names"):
        make_recipe("mxfp8", keep=3)


def test_a_file_from_before_the_block_columns_reads(tmp_path) -> None:
    from lossscale import load_run
    from lossscale.app.files import write_run
    run = simulate("mlp", profile="atlas-350", fp8="current", steps=2)
    write_run(run, tmp_path, plot=False)
    lines = (tmp_path / "fp8.csv").read_text().splitlines()
    (tmp_path / "fp8.csv").write_text("\n".join(",".join(line.split(",")[:8]) for line in lines) + "\n")
    back = load_run(tmp_path)
    assert back.fp8[0].gemm == "" and back.fp8[0].blocks == 1 and np.isnan(back.fp8[0].rel_error)
    assert back.fp8[0].scale == run.fp8[0]["scale"]


def test_nvfp4_wgrad_takes_the_hadamard_transform() -> None:
    """dW = x.T @ dy over 20 tokens: both operands padded to 32 tokens, each run of 16 along the
    tokens multiplied by diag(signs) @ H16 / 4 (products exact, summed in order in binary32),
    then quantised from the transformed values (their amax the tensor scale). H is orthogonal
    (H @ H.T = I exactly), so the transform changes the product only by rounding."""
    assert np.array_equal(HADAMARD16 @ HADAMARD16.T, np.eye(16))
    rng = np.random.default_rng(8)
    x, w, dy = (rng.standard_normal(s).astype(np.float16) for s in ((20, 8), (8, 6), (20, 6)))
    recipe = NVFP4Scaling(stochastic_gradients=False)
    dev, hook = Device("atlas-350"), Fp8Matmuls(recipe)
    dev.substitute("matmul", hook)
    begin_phase(dev, "forward", step=0)
    dev.matmul(x, w)
    begin_phase(dev, "backward")
    got = dev.matmul(np.ascontiguousarray(x.T), dy, out_dtype=F32)

    def turned(rows: np.ndarray) -> np.ndarray:  # (R, 32): each run of 16 times the matrix, in order
        out = np.zeros(rows.shape, F32)
        for lo in (0, 16):
            for k in range(16):
                out[:, lo:lo + 16] += rows[:, lo + k:lo + k + 1].astype(F32) * HADAMARD16[k].astype(F32)
        return out

    ta = turned(np.pad(x.T, ((0, 0), (0, 12))))
    tb = turned(np.pad(dy.T, ((0, 0), (0, 12)))).T
    qa, qb = nvfp4.quantize(ta, axis=1), nvfp4.quantize(tb, axis=0)
    sa = decode(qa.scales, FLOAT8_E4M3FN).astype(F32)
    sb = decode(qb.scales, FLOAT8_E4M3FN).astype(F32).T
    ea, eb = (decode(q.elements, FLOAT4_E2M1FN).astype(F32) for q in (qa, qb))
    assert np.array_equal(got, block_sum(ea, eb, sa, sb, 16) * (qa.tensor_scale * qb.tensor_scale))
    wgrad = [r for r in hook.rows if r["gemm"] == "wgrad"]
    assert [r["elements"] for r in wgrad] == [8 * 32, 32 * 6]
    plain = Fp8Matmuls(NVFP4Scaling(stochastic_gradients=False, hadamard=False))
    dev.substitute("matmul", plain)
    begin_phase(dev, "forward", step=1)
    dev.matmul(x, w)
    begin_phase(dev, "backward")
    dev.matmul(np.ascontiguousarray(x.T), dy)
    assert [r["elements"] for r in plain.rows if r["gemm"] == "wgrad"] == [8 * 20, 20 * 6]
