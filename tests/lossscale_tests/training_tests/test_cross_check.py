"""The hand-written mlp workload against the same model in torch (sim.torch.DeviceMode) and in
JAX (sim.jax.on_device) on its weights: bit-identical gradients and register, at a scale that
fits and one that overflows, in both overflow modes. Three independent routes to one answer."""

from __future__ import annotations

import numpy as np
import pytest

from lossscale.training.workloads import Mlp
from sim import Device

H, F32 = np.float16, np.float32
CASES = [(profile, scale) for profile in ("atlas-training", "atlas-a2") for scale in (2.0**10, 2.0**20)]


def hand(profile: str, scale: float):
    wl = Mlp()
    params, idx = wl.init_params(), wl.batches(1)[0]
    dev = Device(profile)
    _, grads = wl.forward_backward(dev, params, scale, idx)
    return wl, params, idx, [np.ascontiguousarray(g).view(np.uint16) for g in grads], dev.get_float_status()


@pytest.mark.parametrize("profile, scale", CASES)
def test_torch_mlp_on_the_hand_written_weights(profile: str, scale: float) -> None:
    torch = pytest.importorskip("torch")
    from sim.torch import DeviceMode
    wl, params, idx, want, register = hand(profile, scale)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)).half()
    dev = Device(profile)
    with torch.no_grad():
        for p, v in zip(model.parameters(), (params[0].T, params[1], params[2].T, params[3]), strict=True):
            p.copy_(torch.from_numpy(dev.cast(np.ascontiguousarray(v), H)))
    x, y = torch.from_numpy(wl.train[0][idx]), torch.from_numpy(wl.train[1][idx])
    with DeviceMode(dev, float32=True):  # the loss in binary32 on the device too, as the hand-written one
        (torch.nn.functional.cross_entropy(model(x.half()).float(), y) * scale).backward()
    got = [model[0].weight.grad.T, model[0].bias.grad, model[2].weight.grad.T, model[2].bias.grad]
    got = [np.ascontiguousarray(g.numpy()).view(np.uint16) for g in got]
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert dev.get_float_status().tolist() == register.tolist()
    assert register[0] == int(scale > 2.0**16)  # the larger scale overflows binary16


@pytest.mark.parametrize("profile, scale", CASES)
def test_jax_mlp_on_the_hand_written_weights(profile: str, scale: float) -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from sim.jax import on_device
    wl, params, idx, want, register = hand(profile, scale)

    def loss(w, x, y, s):
        h = jax.nn.relu(x @ w[0] + w[1])
        z = (h @ w[2] + w[3]).astype(jnp.float32)
        return -jnp.mean(jax.nn.log_softmax(z)[jnp.arange(y.shape[0]), y]) * s

    dev = Device(profile)
    w16, x16 = [dev.cast(p, H) for p in params], dev.cast(wl.train[0][idx], H)
    _, got = on_device(jax.value_and_grad(loss), dev)(w16, x16, wl.train[1][idx], F32(scale))
    assert all(np.array_equal(np.asarray(a).view(np.uint16), b) for a, b in zip(got, want, strict=True))
    assert dev.get_float_status().tolist() == register.tolist()
