"""TorchWorkload on models as libraries write them: outputs that are dicts, tuples or
``ModelOutput``s (a Hugging Face model when transformers is installed), BatchNorm buffers kept
apart for the device run and the binary32 baseline."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lossscale import simulate  # noqa: E402
from lossscale.training.workloads.torch_workloads import TorchWorkload, logits_of  # noqa: E402


@dataclass
class Output:  # a ModelOutput-like object: logits as an attribute, not a mapping
    logits: torch.Tensor
    hidden: torch.Tensor


class Classifier(torch.nn.Module):
    """64-16-4 on random data, returning its logits in the wrapping ``kind`` asks for."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.fc1, self.fc2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        logits = self.fc2(h)
        if self.kind == "dict":
            return {"hidden": h, "logits": logits}
        if self.kind == "tuple":
            return logits, h
        if self.kind == "object":
            return Output(logits, h)
        return {"scores": logits, "hidden": h}  # no logits key: the first value


def _data(n: int = 128, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 16)).astype(np.float32)
    return x, (x[:, :4].argmax(1)).astype(np.int64)


def _ce(out, y):
    return torch.nn.functional.cross_entropy(logits_of(out).float(), y)


@pytest.mark.parametrize("kind", ["dict", "tuple", "object", "first"])
def test_structured_outputs_train_and_evaluate(kind: str) -> None:
    torch.manual_seed(0)
    wl = TorchWorkload(Classifier(kind), _ce, _data(), test=_data(64, 1), batch=32, learning_rate=0.1)
    assert wl.has_accuracy
    run = simulate(workload=wl, manager="fixed", profile="atlas-a2", steps=3, underflow_every=2)
    for key in ("final", "baseline_float32"):
        assert np.isfinite(run.summary[key]["loss"]) and 0 <= run.summary[key]["accuracy"] <= 1


def test_output_fn_chooses_what_the_loss_and_accuracy_see() -> None:
    torch.manual_seed(0)
    seen = []

    def pick(out):
        seen.append(type(out).__name__)
        return out[1]["logits"]

    class Nested(Classifier):
        def forward(self, x):
            return "aux", super().forward(x)

    ce = lambda out, y: torch.nn.functional.cross_entropy(out.float(), y)  # noqa: E731
    wl = TorchWorkload(Nested("dict"), ce, _data(), batch=32, output_fn=pick)
    metrics = wl.evaluate(wl.init_params())
    assert set(seen) == {"tuple"} and 0 <= metrics["accuracy"] <= 1
    with pytest.raises(TypeError, match="output_fn must be callable"):
        TorchWorkload(Classifier("dict"), _ce, _data(), output_fn=3)


def test_logits_of_names_what_it_could_not_find() -> None:
    t = torch.ones(2)
    assert logits_of(t) is t and logits_of((t, 1)) is t and logits_of({"logits": t, "x": 1}) is t
    with pytest.raises(TypeError, match="no logits in a model output of type str.*output_fn"):
        logits_of("text")
    with pytest.raises(TypeError, match="of type tuple"):
        logits_of(())


def test_hugging_face_model_output_trains_and_evaluates() -> None:
    from zoo import transformers as load

    transformers = load()
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=8,
                                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 32, (48, 9))
    x, y = tokens[:, :-1], tokens[:, 1:]

    def next_token(out, y):  # a raw ModelOutput, as the model returns it
        return torch.nn.functional.cross_entropy(out.logits.float().flatten(0, 1), y.flatten())

    wl = TorchWorkload(model, next_token, (x, y), batch=16, learning_rate=0.05, name="gpt2")
    run = simulate(workload=wl, manager="fixed", profile="atlas-a2", steps=2, underflow_every=2)
    assert run.summary["arguments"]["workload"] == "gpt2"
    for key in ("final", "baseline_float32"):
        assert np.isfinite(run.summary[key]["loss"]) and 0 <= run.summary[key]["accuracy"] <= 1


class Normed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.bn, self.fc2 = torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def _normed() -> TorchWorkload:
    torch.manual_seed(0)
    return TorchWorkload(Normed(), _ce, _data(), test=_data(64, 1), batch=32, learning_rate=0.1)


def test_batch_norm_baseline_does_not_depend_on_the_device_run() -> None:
    runs = {det: simulate(workload=_normed(), profile="atlas-training", detector=det, steps=4, underflow_every=1)
            for det in ("isfinite", "tf-npu")}
    a, b = (runs[d].summary for d in ("isfinite", "tf-npu"))
    assert a["final"] != b["final"]  # the device runs differ (isfinite applies saturated steps) ...
    assert a["baseline_float32"] == b["baseline_float32"]  # ... their binary32 baselines do not
    losses = {d: [r["baseline_loss"] for r in run.records] for d, run in runs.items()}
    assert losses["isfinite"] == losses["tf-npu"]
    # The same workload object again: each run's parameters start from the model's own buffers.
    wl = _normed()
    first = simulate(workload=wl, profile="atlas-training", detector="tf-npu", steps=4, underflow_every=1)
    again = simulate(workload=wl, profile="atlas-training", detector="tf-npu", steps=4, underflow_every=1)
    assert first.summary["baseline_float32"] == again.summary["baseline_float32"] == b["baseline_float32"]
    assert first.summary["final"] == again.summary["final"] == b["final"]


def test_batch_norm_buffers_belong_to_the_weights_they_trained_with() -> None:
    from sim import Device
    wl = _normed()
    initial = [b.clone() for b in wl.model32.buffers()]
    device, base = wl.init_params(), wl.init_params()
    (idx,) = wl.batches(1)
    wl.forward_backward(Device("atlas-a2"), device, 1.0, idx)
    trained = [b.clone() for b in wl.model.buffers()]
    wl.grads32(device, idx)  # the reference gradients of the device run's weights: its buffers unchanged
    wl.grads32(base, idx)  # a baseline step: its own buffers move
    mean = wl.model32.bn.running_mean.clone()
    assert not torch.equal(mean, initial[0])
    fresh = wl.evaluate(wl.init_params())  # unknown weights: the model's initial buffers
    assert all(torch.equal(b, i) for b, i in zip(wl.model32.buffers(), initial, strict=True))
    wl.evaluate(device)
    assert all(torch.equal(b.to(t.dtype), t) for b, t in zip(wl.model32.buffers(), trained, strict=True))
    wl.evaluate(base)
    assert torch.equal(wl.model32.bn.running_mean, mean)
    assert fresh == wl.evaluate(wl.init_params())


def test_jax_predict_may_return_a_structured_output() -> None:
    jnp = pytest.importorskip("jax.numpy")
    from lossscale.training.workloads.jax_workloads import JaxWorkload
    x, y = _data()
    w = [np.zeros((16, 4), np.float32)]

    def loss(p, x, y):
        return -jnp.mean(jnp.take_along_axis(jax_log_softmax(x @ p[0]), y[:, None], 1))

    def jax_log_softmax(z):
        return z - jnp.log(jnp.sum(jnp.exp(z), -1, keepdims=True))

    plain = JaxWorkload(loss, w, (x, y), batch=32, predict=lambda p, x: x @ p[0])
    expected = plain.evaluate(w)
    for predict in (lambda p, x: {"logits": x @ p[0], "hidden": x}, lambda p, x: (x @ p[0], x)):
        assert JaxWorkload(loss, w, (x, y), batch=32, predict=predict).evaluate(w) == expected
    with pytest.raises(TypeError, match="JaxWorkload"):
        JaxWorkload(loss, w, (x, y), batch=32, predict=lambda p, x: "no").evaluate(w)
