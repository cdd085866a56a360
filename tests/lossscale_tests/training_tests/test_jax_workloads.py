"""JaxWorkload: a JAX loss trained by the simulator, forward and backward on the device."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from lossscale import simulate  # noqa: E402
from lossscale.training.workloads.jax_workloads import JaxWorkload  # noqa: E402
from sim import Device  # noqa: E402


def predict(w, x):
    h = jnp.maximum(x @ w[0] + w[1], 0)
    return (h @ w[2] + w[3]).astype(jnp.float32)


def loss(w, x, y):
    return -jnp.mean(jax.nn.log_softmax(predict(w, x))[jnp.arange(y.shape[0]), y])


def workload(**kw) -> JaxWorkload:
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((4, 16)) * 2
    y = rng.integers(0, 4, 600)
    x = (centers[y] + rng.standard_normal((600, 16))).astype(np.float32)
    w = [(rng.standard_normal((16, 32)) * 0.25).astype(np.float32), np.zeros(32, np.float32),
         (rng.standard_normal((32, 4)) * 0.2).astype(np.float32), np.zeros(4, np.float32)]
    return JaxWorkload(loss, w, (x[:500], y[:500]), test=(x[500:], y[500:]), predict=predict, batch=50,
                       learning_rate=0.05, name="jax-mlp", **kw)


@pytest.mark.slow
def test_a_jax_model_trains_and_the_register_catches_what_isfinite_misses() -> None:
    caught = simulate(workload=workload(), profile="atlas-training", steps=60)
    missed = simulate(workload=workload(), profile="atlas-training", steps=60, detector="isfinite")
    assert caught.summary["skipped_steps"] > 5 and caught.summary["undetected_overflow_steps"] == 0
    assert missed.summary["undetected_overflow_steps"] > 5
    assert caught.summary["final"]["accuracy"] > 0.9 > missed.summary["final"]["accuracy"]
    assert caught.summary["arguments"]["workload"] == "jax-mlp"


def test_the_reference_is_plain_jax_float32_and_the_step_ran_on_the_device() -> None:
    wl = workload()
    params, idx = wl.init_params(), np.arange(50)
    value, grads = wl.grads32(params, idx)
    ref_value, ref_grads = jax.value_and_grad(loss)(params, wl.x[idx], wl.y[idx])
    assert value == float(ref_value)
    assert all(np.array_equal(g, np.asarray(r)) for g, r in zip(grads, ref_grads, strict=True))
    _, low = wl.forward_backward(Device("atlas-a2"), params, 1024.0, idx)
    assert [g.dtype for g in low] == [np.float16] * 4
    assert wl.routes[("dot_general", "device")] == 5  # 2 forward; 3 backward (none for x)
    with pytest.raises(ValueError, match="dtype must be one of"):
        workload(dtype="float8")
