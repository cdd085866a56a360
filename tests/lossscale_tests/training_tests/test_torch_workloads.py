"""TorchWorkload: a user's torch model trained by the simulator on the device, and the
built-in torch workloads: in saturation mode the register skips the steps isfinite lets through."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lossscale import simulate  # noqa: E402
from lossscale.training.workloads import WORKLOADS, make_workload  # noqa: E402
from lossscale.training.workloads.torch_workloads import TorchWorkload  # noqa: E402
from sim.torch_binary32 import Binary32Mode  # noqa: E402

from groups import representatives  # noqa: E402


@pytest.mark.parametrize("name", representatives(["torch-mlp", "torch-cnn", "torch-transformer"],
                                                  lambda n: n == "torch-mlp"))  # the others: -m slow
def test_builtin_torch_workloads_register_catches_what_isfinite_misses(name: str) -> None:
    assert name in WORKLOADS
    steps = 16 if name == "torch-transformer" else 40
    caught = simulate(workload=name, profile="atlas-training", steps=steps)
    missed = simulate(workload=name, profile="atlas-training", steps=steps, detector="isfinite")
    # The NPULossScaleOptimizer page's 2**32 overflows binary16 gradients: in saturation mode they stay finite.
    assert caught.summary["skipped_steps"] > 5 and caught.summary["undetected_overflow_steps"] == 0
    assert missed.summary["skipped_steps"] == 0 and missed.summary["undetected_overflow_steps"] > 5
    if name == "torch-transformer":  # still backing off after 16 steps: no update applied, while the other
        # run applied 16 updates from saturated gradients (65504 / 2**32 each: they move the loss by 1e-5)
        assert caught.summary["skipped_steps"] == steps
        assert caught.summary["final"]["loss"] != missed.summary["final"]["loss"]
    else:
        assert caught.summary["final"]["accuracy"] > missed.summary["final"]["accuracy"] + 0.3
    labels = caught.summary["top_labels"]  # which modules' operations overflowed ("loss": the loss function's)
    wl = make_workload(name)
    paths = {path for path, _ in wl.model.named_modules()} - {""}
    assert labels and set(labels) <= paths | {"loss"} and set(labels) & paths
    assert "head" in [m.rsplit(".", 1)[-1] for m in labels] + (["head"] if name == "torch-mlp" else [])
    first = caught.summary["first_overflow"]
    assert first["step"] == 0 and first["phase"] == "backward" and first["label"] in paths | {"loss"}
    wl.forward_backward(__import__("sim").Device("atlas-training"), wl.init_params(), 2.0**32, wl.batches(1)[0])
    assert {route for _, route in wl.routes} <= {"device", "exact", "fused", "float32", "factory", "random"} \
        and wl.events


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.fc(x)


def test_own_torch_model_trains_and_its_reference_is_float32() -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 8)).astype(np.float32)
    y = (x @ rng.standard_normal((8, 1))).astype(np.float32)
    mse = lambda out, t: torch.nn.functional.mse_loss(out.float(), t)  # noqa: E731
    wl = TorchWorkload(Regression(), mse, (x, y), batch=32, learning_rate=0.05, momentum=0.5, name="regression")
    assert not wl.has_accuracy
    run = simulate(workload=wl, manager="fixed", profile="atlas-a2", steps=60)
    assert run.summary["final"]["loss"] < 0.05 * run.records[0]["loss"]
    assert run.summary["arguments"]["workload"] == "regression"
    # grads32 is torch's float32 backprop from the given weights, computed in Binary32Mode (fixed
    # orders, the same bits on every host), and float32-close to the float64 gradient.
    params = wl.init_params()
    loss, grads = wl.grads32(params, np.arange(32))
    w, b = (torch.from_numpy(p.copy()).requires_grad_() for p in params)
    with Binary32Mode():
        ref = torch.nn.functional.mse_loss(torch.from_numpy(x[:32]) @ w.T + b, torch.from_numpy(y[:32]))
        ref.backward()
    assert loss == float(ref.detach()) and np.array_equal(grads[0], w.grad.numpy())
    w64, b64 = (p.astype(np.float64) for p in params)
    r = x[:32].astype(np.float64) @ w64.T + b64 - y[:32]
    assert loss == pytest.approx(float(np.mean(r * r)), rel=1e-5)
    assert np.allclose(grads[0], 2 * r.T @ x[:32] / 32, rtol=1e-4, atol=1e-6)


def test_bfloat16_compute_and_bad_arguments() -> None:
    run = simulate(workload=make_workload("torch-mlp", dtype="bfloat16"), profile="atlas-a2", steps=5)
    assert run.summary["steps_run"] == 5
    mse = torch.nn.functional.mse_loss
    data = (np.zeros((4, 8), np.float32), np.zeros((4, 1), np.float32))
    with pytest.raises(ValueError, match="dtype must be one of float16, bfloat16"):
        TorchWorkload(Regression(), mse, data, batch=2, dtype="float8")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        TorchWorkload(object(), mse, data)
    with pytest.raises(ValueError, match="batch must be at most 4, the number of training examples .* got 64"):
        TorchWorkload(Regression(), mse, data)


def test_lossscale_run_names_the_modules_whose_operations_overflowed(capsys, tmp_path) -> None:
    from lossscale.app.cli import main
    code = main(["run", "--workload", "torch-cnn", "--profile", "atlas-training", "--steps", "12", "--quiet",
                 "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert code in (0, None)
    line = next(s for s in out.splitlines() if s.startswith("operations with register events, by label: "))
    assert "head" in line and "loss" in line and "conv" in line
    assert "first overflow: step 0, cast in loss (backward phase, rank 0" in out


# Each built-in model's routes for one step, reviewed against sim.torch's documented routes:
# a torch upgrade that changes its decompositions, or a change of routing, fails here loudly.
ROUTE_TABLES = {
    "torch-mlp": {
        "device": {"_to_copy.default": 3, "addmm.default": 2, "mm.default": 3, "relu.default": 1,
                   "sum.dim_IntList": 2},
        "exact": {"detach.default": 6, "t.default": 9, "threshold_backward.default": 1, "view.default": 2}},
    "torch-cnn": {
        "device": {"_to_copy.default": 3, "addmm.default": 1, "convolution.default": 1,
                   "convolution_backward.default": 1, "mm.default": 2, "relu.default": 1, "sum.dim_IntList": 1},
        "fused": {"max_pool2d_with_indices_backward.default": 1},  # the overlapping windows' gradient sum
        "exact": {"detach.default": 6, "max_pool2d_with_indices.default": 1, "t.default": 5,
                  "threshold_backward.default": 1, "view.default": 3}},
    "torch-transformer": {
        "fused": {"embedding_dense_backward.default": 2, "_softmax.default": 1, "_softmax_backward_data.default": 1,
                  "gelu.default": 1,
                  "gelu_backward.default": 1, "native_layer_norm.default": 3,
                  "native_layer_norm_backward.default": 3},
        "device": {"_to_copy.default": 2, "add.Tensor": 5, "addmm.default": 5, "bmm.default": 6, "mm.default": 10,
                   "mul.Tensor": 6, "sum.dim_IntList": 6, "div_.Scalar": 2, "masked_fill.Scalar": 2},
        "factory": {"empty_like.default": 2},  # dropout's mask: empty_like().bernoulli_().div_(), then mul
        "random": {"bernoulli_.float": 2},
        "exact": {"_unsafe_view.default": 8, "clone.default": 6, "detach.default": 20, "embedding.default": 2,
                  "expand.default": 4, "permute.default": 2, "stack.default": 1,
                  "t.default": 25, "transpose.int": 8, "unbind.int": 1, "view.default": 34}},
}


@pytest.mark.parametrize("name", list(ROUTE_TABLES))
def test_route_table_of_each_builtin_model(name: str) -> None:
    from sim import Device
    wl = make_workload(name)
    wl.forward_backward(Device("atlas-a2"), wl.init_params(), 1024.0, wl.batches(1)[0])
    table: dict = {}
    for (op, route), n in wl.routes.items():
        table.setdefault(route, {})[op.removeprefix("aten.")] = n
    assert table == ROUTE_TABLES[name]


def test_runs_repeat_bit_for_bit_and_leave_torch_random_state_alone() -> None:
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    one = simulate(workload="torch-transformer", profile="atlas-training", steps=3, manager="fixed")
    assert torch.equal(torch.random.get_rng_state(), state)
    two = simulate(workload="torch-transformer", profile="atlas-training", steps=3, manager="fixed")
    assert [r["loss"] for r in one.records] == [r["loss"] for r in two.records]
    assert one.summary["final"] == two.summary["final"]


def test_the_trained_model_comes_back() -> None:
    """Issue 31, item 11: a run keeps rank 0's trained parameters and the baseline's
    (``Run.params``, ``Run.baseline_params``), and ``TorchWorkload.trained_model`` makes a float32
    module of them with the BatchNorm statistics that trained with them: it evaluates to the
    summary's figures exactly, and the model given to the workload is unchanged."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 3))
    given = {k: v.clone() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(1)
    x = rng.standard_normal((128, 8)).astype(np.float32)
    y = rng.integers(0, 3, 128)
    ce = lambda out, t: torch.nn.functional.cross_entropy(out.float(), t)  # noqa: E731
    wl = TorchWorkload(model, ce, (x, y), batch=32, learning_rate=0.05)
    run = simulate(workload=wl, manager="fixed", profile="atlas-training", steps=6)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in given.items())  # the user's model untouched
    for params, figures in ((run.params, run.summary["final"]), (run.baseline_params, run.summary["baseline_float32"])):
        trained = wl.trained_model(params)
        assert all(np.array_equal(p.detach().numpy(), v) for p, v in zip(trained.parameters(), params, strict=True))
        bn = trained[1]
        assert not torch.equal(bn.running_mean, given["1.running_mean"]) and int(bn.num_batches_tracked) == 6
        trained.eval()
        with torch.no_grad(), Binary32Mode():
            out = trained(torch.from_numpy(x))
            loss = float(ce(out, torch.from_numpy(y)))
        assert loss == figures["loss"]
        assert float((out.argmax(-1).numpy() == y).mean()) == figures["accuracy"]
    assert not np.array_equal(run.params[0], run.baseline_params[0])
    with pytest.raises(ValueError, match=r"params must be this workload's parameter list \(a run's .params: 6 "
                                         r"arrays of the model's shapes\), got tuple"):
        wl.trained_model(tuple(run.params))
