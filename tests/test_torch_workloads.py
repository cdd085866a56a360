"""TorchWorkload: a user's torch model trained by the simulator on the device, and the
built-in torch workloads: in saturation mode the register skips the steps isfinite lets through."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lossscale.simulate import simulate  # noqa: E402
from lossscale.torch_workloads import TorchWorkload  # noqa: E402
from lossscale.workloads import WORKLOADS, make_workload  # noqa: E402


@pytest.mark.parametrize("name", ["torch-mlp", "torch-cnn"])
def test_builtin_torch_workloads_register_catches_what_isfinite_misses(name: str) -> None:
    assert name in WORKLOADS
    caught = simulate(workload=name, profile="atlas-training", steps=40)
    missed = simulate(workload=name, profile="atlas-training", steps=40, detector="isfinite")
    # The seed's 2**32 overflows binary16 gradients: in saturation mode they stay finite.
    assert caught.summary["skipped_steps"] > 5 and caught.summary["undetected_overflow_steps"] == 0
    assert missed.summary["skipped_steps"] == 0 and missed.summary["undetected_overflow_steps"] > 5
    assert caught.summary["final"]["accuracy"] > missed.summary["final"]["accuracy"] + 0.3
    modules = caught.summary["event_modules"]  # which modules' operations overflowed
    assert modules and set(modules) <= {"", "0", "2", "conv", "head", "pool"} and "" in modules
    wl = make_workload(name)
    wl.forward_backward(__import__("sim").Device("atlas-training"), wl.init_params(), 2.0**32, wl.batches(1)[0])
    assert {route for _, route in wl.routes} <= {"device", "exact", "float32"} and wl.events


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
    # grads32 is plain torch float32 backprop from the given weights.
    params = wl.init_params()
    loss, grads = wl.grads32(params, np.arange(32))
    w, b = (torch.from_numpy(p.copy()).requires_grad_() for p in params)
    ref = torch.nn.functional.mse_loss(torch.from_numpy(x[:32]) @ w.T + b, torch.from_numpy(y[:32]))
    ref.backward()
    assert loss == pytest.approx(float(ref.detach())) and np.array_equal(grads[0], w.grad.numpy())


def test_bfloat16_compute_and_bad_arguments() -> None:
    run = simulate(workload=make_workload("torch-mlp", dtype="bfloat16"), profile="atlas-a2", steps=5)
    assert run.summary["steps_run"] == 5
    mse = torch.nn.functional.mse_loss
    data = (np.zeros((4, 8), np.float32), np.zeros((4, 1), np.float32))
    with pytest.raises(ValueError, match="dtype must be one of float16, bfloat16"):
        TorchWorkload(Regression(), mse, data, batch=2, dtype="float8")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        TorchWorkload(object(), mse, data)
    with pytest.raises(ValueError, match="at least batch=64"):
        TorchWorkload(Regression(), mse, data)


def test_lossscale_run_names_the_modules_whose_operations_overflowed(capsys, tmp_path) -> None:
    from lossscale.cli import main
    code = main(["run", "--workload", "torch-cnn", "--profile", "atlas-training", "--steps", "12", "--quiet",
                 "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert code in (0, None)
    line = next(s for s in out.splitlines() if s.startswith("device operations with register events"))
    assert "head" in line and "(outside modules)" in line
