"""sim.jax: a jaxpr evaluated with the device's operations: each mapped primitive against its
device op on binary16 edge data, a gradient's jaxpr, coverage, strict mode."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from sim import Device  # noqa: E402
from sim.jax import coverage, on_device  # noqa: E402

H = np.float16
EDGE = np.array([0.0, -0.0, 1.0, -1.5, 2.0**-24, -(2.0**-14), 65504.0, -65504.0, 0.1, 3.0, 1000.0,
                 np.inf, -np.inf, np.nan, 0.5 + 2.0**-11, 7.0], H)


def bits(x) -> list[int]:
    a = np.asarray(x)
    return a.ravel().tolist() if a.dtype == bool else a.view(np.uint16).ravel().tolist()


@pytest.mark.parametrize("profile", ["atlas-a2", "atlas-training"])
@pytest.mark.parametrize("fn, op", [(jnp.add, "add"), (jnp.subtract, "sub"), (jnp.multiply, "mul"),
                                    (jnp.divide, "div"), (jnp.maximum, "maximum"), (jnp.exp, "exp"),
                                    (jnp.tanh, "tanh"), (jax.nn.sigmoid, "sigmoid"), (jax.lax.rsqrt, "rsqrt"),
                                    (jnp.minimum, "minimum"), (jnp.negative, "neg"), (jnp.abs, "abs"),
                                    (jnp.log, "log"), (jnp.sqrt, "sqrt"), (jax.lax.erf, "erf"), (jnp.less, "lt"),
                                    (jnp.equal, "eq"), (jnp.greater_equal, "ge")])
def test_mapped_primitives_are_the_device_ops(fn, op: str, profile: str) -> None:
    a = np.resize(EDGE, (4, 8)).astype(H)
    b = np.roll(a, 3)
    dev, ref = Device(profile), Device(profile)
    unary = op in ("exp", "tanh", "sigmoid", "rsqrt", "neg", "abs", "log", "sqrt", "erf")
    got = on_device(fn, dev)(*((a,) if unary else (a, b)))
    want = getattr(ref, op)(*((a,) if unary else (a, b)))
    assert bits(got) == bits(want)
    assert dev.get_float_status().tolist() == ref.get_float_status().tolist()


def test_dot_and_reductions_are_the_device_ops() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 5)).astype(H), rng.standard_normal((5, 4)).astype(H)
    dev, ref = Device(), Device()
    run = on_device(lambda a, b: (a @ b, a.sum(axis=0), a.max(axis=1)), dev)
    mm, s, top = run(a, b)
    assert bits(mm) == bits(ref.matmul(a, b))
    assert bits(s) == bits(ref.sum(a, axis=0, accumulate=np.float32, out_dtype=H))
    assert bits(top) == bits(ref.amax(a.T, axis=0))
    assert run.routes["dot_general", "device"] == 1 and run.routes["reduce_max", "device"] == 1
    # jnp.sum of float16 sums in float32 (JAX's own upcast): a device cast in, JAX's float32
    # sum (not ours), a device cast out.
    assert run.routes["reduce_sum", "native"] == 1 and run.routes["convert_element_type", "device"] == 2
    direct = on_device(lambda a: jax.lax.reduce(a, H(0), jax.lax.add, (0,)), dev)
    assert bits(direct(a)) == bits(ref.sum(a, axis=0, accumulate=np.float32, out_dtype=H))
    assert direct.routes["reduce_sum", "device"] == 1


def mlp_loss(w, x, y):
    h = jnp.maximum(x @ w[0] + w[1], 0)
    z = (h @ w[2] + w[3]).astype(jnp.float32)
    return -jnp.mean(jax.nn.log_softmax(z)[jnp.arange(y.shape[0]), y])


def mlp_args(scale: float = 1.0):
    rng = np.random.default_rng(1)
    w = [(rng.standard_normal((64, 32)) * 0.2).astype(H), np.zeros(32, H),
         (rng.standard_normal((32, 10)) * 0.2).astype(H), np.zeros(10, H)]
    return w, rng.standard_normal((16, 64)).astype(H), np.arange(16) % 10


def test_a_gradient_runs_on_the_device_and_the_register_sees_saturated_overflow() -> None:
    w, x, y = mlp_args()
    grad = jax.value_and_grad(lambda w, x, y, s: mlp_loss(w, x, y) * s)
    dev = Device("atlas-a2")
    val, g = on_device(grad, dev)(w, x, y, np.float32(1.0))
    native_val, native_g = grad(w, x, y, np.float32(1.0))
    assert float(val) == pytest.approx(float(native_val), rel=1e-5)
    assert all(np.allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=1e-3)
               for a, b in zip(g, native_g, strict=True))
    sat = Device("atlas-training")
    _, big = on_device(grad, sat)(w, x, y, np.float32(2.0**32))
    assert all(np.isfinite(np.asarray(a, np.float32)).all() for a in big) and sat.get_float_status()[0] == 1
    _, inf = on_device(grad, Device("atlas-a2"))(w, x, y, np.float32(2.0**32))
    assert not all(np.isfinite(np.asarray(a, np.float32)).all() for a in inf)


def test_coverage_lists_what_would_run_in_float32_and_strict_refuses_it() -> None:
    w, x, y = mlp_args()
    assert coverage(jax.value_and_grad(mlp_loss), w, x, y) == ["scatter-add"]
    assert coverage(lambda a: jnp.sin(a) + a, EDGE) == ["sin"]
    dev = Device("atlas-training")
    out = on_device(jnp.sin, dev)(np.array([1.0, 1e4], H))  # float32, then one rounding
    assert bits(out) == bits(Device().cast(np.sin(np.array([1.0, 1e4], np.float32)), H))
    with pytest.raises(NotImplementedError, match="sin has no device equivalent"):
        on_device(jnp.sin, Device(), strict=True)(EDGE)


def test_each_equation_is_labelled_with_its_scope_forward_and_backward() -> None:
    """jax.named_scope (flax modules name theirs) gives each equation its module path, forward and
    backward alike, as sim.torch labels a module's operations; the events are counted per path: an
    overflow only in the head's backward is the head's."""
    def loss(p, x):
        with jax.named_scope("encoder"), jax.named_scope("dense"):
            h = jnp.tanh(x @ p[0])
        with jax.named_scope("head"):
            return (h @ p[1]).astype(jnp.float32).sum()

    p = [np.full((3, 4), 0.25, H), np.full((4, 2), 0.5, H)]
    x = np.ones((2, 3), H)
    dev = Device("atlas-training", record_events=True)
    run = on_device(jax.grad(loss), dev)
    run(p, x)
    assert not dev.get_float_status().any() and not run.events
    scaled = on_device(jax.grad(lambda p, x: loss(p, x) * np.float32(2.0**20)), dev)
    scaled(p, x)  # the gradient 2**20 overflows binary16: the head's cast and product, then encoder.dense's
    assert [(e.label, e.op) for e in dev.events] == [("head", "cast"), ("head", "matmul"),
                                                     ("encoder.dense", "matmul")]
    assert dict(scaled.events) == {"head": 2, "encoder.dense": 1}
