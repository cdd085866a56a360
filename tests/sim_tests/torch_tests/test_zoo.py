"""Real models (tests/zoo.py: torchvision, timm, transformers, torch.nn) in float16 under
sim.torch.DeviceMode, in the loop a researcher writes: a new mode per step with the last loss
alive; strict routing of forward and backward; a clear register at loss scale 1 unless native
float16 overflows too, or the exact (float64) gradients leave binary16's range; and at scale
2**32, saturation (finite gradients, register set) against INF_NAN (non-finite gradients). The
slower models are marked ``zoo`` (run by .ci/run)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import zoo  # noqa: E402

from sim import Device  # noqa: E402
from sim.torch import ROUTE_KINDS, DeviceMode  # noqa: E402

F16 = torch.float16
FAST = {"gpt2", "gpt2_eager4", "hf_vit", "sdpa"}  # a step under a second, cold: in the default run
def _params(marks: tuple = ()) -> list:
    return [pytest.param(name, marks=[*marks] + ([] if name in FAST else [pytest.mark.zoo]), id=name)
            for name in zoo.ZOO]


def half(name: str) -> tuple[torch.nn.Module, zoo.Batch]:
    """Model ``name`` and its batch in float16 (its library imported, or the test skipped)."""
    library = zoo.ZOO[name].library
    if library in ("torchvision", "timm"):  # timm imports torchvision
        try:
            zoo.torchvision()
        except (ImportError, RuntimeError) as e:
            pytest.skip(f"torchvision's models do not import here: {e}")
    if library != "torch":
        pytest.importorskip(library)
    model, batch = zoo.build(name)
    return model.half(), batch.to(F16)


def step(dev: Device, model: torch.nn.Module, batch: zoo.Batch, scale: float = 1.0, **kw) -> tuple[DeviceMode, float]:
    """A forward and backward pass under a new mode on ``dev``, the loss scaled by ``scale``."""
    model.zero_grad()
    with DeviceMode(dev, **kw) as mode:
        loss = zoo.loss(model, batch)
        (loss * scale).backward()
    return mode, loss.item()


def grads_finite(model: torch.nn.Module) -> bool:
    return all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", _params())
def test_a_three_step_loop_with_a_new_mode_per_step_and_the_loss_alive(name: str) -> None:
    model, batch = half(name)
    dev, losses = Device("atlas-training"), []
    for _ in range(3):
        model.zero_grad()
        with DeviceMode(dev) as mode:
            loss = zoo.loss(model, batch)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p -= 0.01 * p.grad
        losses.append(loss.item())  # loss and its graph stay alive into the next step
    assert all(np.isfinite(losses)) and mode.routes
    assert any(p.grad is not None for p in model.parameters()) and grads_finite(model)


@pytest.mark.parametrize("name", _params())
def test_strict_accepts_the_forward_and_backward(name: str) -> None:
    """No operation of any zoo model takes the float32 route (strict=True refuses it), forward or backward."""
    model, batch = half(name)
    mode, loss = step(Device("atlas-training"), model, batch, strict=True)
    assert np.isfinite(loss) and {route for _, route in mode.routes} <= set(ROUTE_KINDS) - {"float32"}


class _NewNonFinite(torch.utils._python_dispatch.TorchDispatchMode):
    """Notes whether an operation, forward or backward, made an Inf or NaN in float16 or bfloat16
    from finite operands: an overflow (or invalid operation) of its own, not one passed on.
    Uninitialised memory (the ``empty`` family) is no result."""

    seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if "empty" in func.overloadpacket.__name__:
            return out
        floats = [t for t in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if floats and all(bool(torch.isfinite(t).all()) for t in floats):
            self.seen |= any(not bool(torch.isfinite(t).all()) for t in torch.utils._pytree.tree_leaves(out)
                             if isinstance(t, torch.Tensor) and t.dtype in (F16, torch.bfloat16))
        return out


def native_overflows(model: torch.nn.Module, batch: zoo.Batch) -> bool:
    """Whether the same step natively in torch float16 (CPU) makes a new Inf or NaN in any
    operation's result, forward or backward, inside a module too (a masked attention score the
    softmax then zeroes): an independent probe. Where torch has no float16 CPU kernel for an
    operation (cdist, pdist), False: the float64 check alone decides."""
    model.zero_grad()
    try:
        with _NewNonFinite() as probe:
            zoo.loss(model, batch).backward()
    except NotImplementedError:
        return False
    finally:
        model.zero_grad()
    return probe.seen


def exact_gradients_overflow(model: torch.nn.Module, batch: zoo.Batch) -> bool:
    """Whether the same step in float64 (a copy of the model and batch) gives a parameter gradient
    beyond binary16's range: then an overflow in the gradients is the exact answer's, whatever
    native float16 happened to compute (a BatchNorm over two values per channel amplifies rounding
    noise by 10**4; native float16 can land below 65504 where the exact gradient is far above)."""
    m64 = copy.deepcopy(model).double()
    zoo.loss(m64, batch.to(torch.float64)).backward()
    return any(bool((p.grad.abs() > 65504).any()) for p in m64.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", _params())
def test_at_scale_one_the_register_is_clear_unless_native_float16_overflows(name: str) -> None:
    model, batch = half(name)
    torch.manual_seed(1)
    overflows = native_overflows(model, batch)
    torch.manual_seed(1)
    overflows = overflows or exact_gradients_overflow(model, batch)
    dev = Device("atlas-training")
    torch.manual_seed(1)
    _, loss = step(dev, model, batch)
    assert np.isfinite(loss)
    assert overflows or not dev.get_float_status().any(), dev.get_float_status().tolist()


@pytest.mark.parametrize("name", _params())
def test_at_scale_2_32_saturation_sets_the_register_and_inf_nan_gradients_are_not_finite(name: str) -> None:
    model, batch = half(name)
    state = copy.deepcopy(model.state_dict())  # with its version metadata (MNASNet's loading reads it)
    sat = Device("atlas-training")
    step(sat, model, batch, scale=2.0**32)
    assert sat.get_float_status().any() and grads_finite(model)
    model.load_state_dict(state)
    step(Device("atlas-a2"), model, batch, scale=2.0**32)
    assert not grads_finite(model)
