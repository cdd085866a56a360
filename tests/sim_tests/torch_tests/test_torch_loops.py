"""sim.torch.DeviceMode in the loops researchers write, and every operation on our dtypes on a
deliberate route: a new mode per step with the last loss alive (MLP, GRU, LSTM), nested modes,
factory, view, in-place, out= and random operations, and no operation left uncounted."""

from __future__ import annotations

import collections

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

from sim import Device  # noqa: E402
from sim.torch import ABOVE_AUTOGRAD, ROUTE_KINDS, DeviceMode  # noqa: E402

H = np.float16
F16 = torch.float16
EDGE = np.array([0.0, -0.0, 1.0, -1.5, 2.0**-24, -(2.0**-14), 65504.0, -65504.0, 0.1, 3.0, 1000.0,
                 np.inf, -np.inf, np.nan, 0.5 + 2.0**-11, 1.0 + 2.0**-10, 7.0, -7.5], H)


def bits(t: torch.Tensor) -> list[int]:
    a = t.detach().contiguous().reshape(-1)
    return a.view(torch.int16 if a.element_size() == 2 else torch.int32).tolist()


class Seq(torch.nn.Module):
    """A recurrent model: an RNN (batch first) and a linear head on its last output."""

    def __init__(self, rnn: type) -> None:
        super().__init__()
        self.rnn = rnn(8, 16, batch_first=True)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


def models() -> dict:
    torch.manual_seed(0)
    return {"mlp": (torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)), (6, 8)),
            "gru": (Seq(torch.nn.GRU), (6, 5, 8)), "lstm": (Seq(torch.nn.LSTM), (6, 5, 8))}


@pytest.mark.parametrize("name", ["mlp", "gru", "lstm"])
def test_a_loop_with_a_new_mode_per_step_and_the_last_loss_alive(name: str) -> None:
    model, shape = models()[name]
    model = model.half()
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal(shape).astype(H))
    y = torch.arange(shape[0]) % 4
    # Used natively first: a model used before is welcome.
    torch.nn.functional.cross_entropy(model(x).float(), y).backward()
    dev, losses = Device("atlas-training"), []
    for _ in range(3):
        model.zero_grad()
        with DeviceMode(dev) as mode:
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            loss.backward()
        losses.append(loss.detach().item())  # the loss (and its graph) stays alive into the next step
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
    assert all(np.isfinite(losses)) and mode.routes and not dev.get_float_status().any()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    # A native backward of a graph made natively still runs after the modes.
    torch.nn.functional.cross_entropy(model(x).float(), y).backward()
    # The check stays: this step's backward outside any mode is refused, even with older graphs alive.
    with DeviceMode(dev):
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    with pytest.raises(RuntimeError, match="running outside it"):
        loss.backward()


@pytest.mark.parametrize("same", [True, False])
def test_nested_modes_the_innermost_device_computes(same: bool) -> None:
    model, shape = models()["mlp"]
    model = model.half()
    x = torch.from_numpy(np.random.default_rng(1).standard_normal(shape).astype(H))
    solo = Device("atlas-training")
    with DeviceMode(solo) as alone:
        want = model(x).float().sum() * 2.0**32  # the gradient's cast to binary16 saturates
        want.backward()
    grads = [bits(p.grad) for p in model.parameters()]
    model.zero_grad()
    inner_dev = Device("atlas-training")
    outer_dev = inner_dev if same else Device("atlas-a2")
    with DeviceMode(outer_dev) as outer:
        with DeviceMode(inner_dev) as inner:
            got = model(x).float().sum() * 2.0**32
            got.backward()
    assert bits(got) == bits(want) and [bits(p.grad) for p in model.parameters()] == grads
    assert inner.routes == alone.routes and not outer.routes
    assert inner_dev.get_float_status().tolist() == solo.get_float_status().tolist()
    assert solo.get_float_status()[0] == 1  # the scale saturates: the inner device's register saw it
    if not same:
        assert not outer_dev.get_float_status().any()


def test_factories_create_values_and_never_cast_garbage() -> None:
    dev = Device("atlas-training")
    base = torch.ones(3, dtype=F16)
    for _ in range(20):  # dirty the allocator with values that overflow binary16
        garbage = torch.full((4096,), 1e30)
        del garbage
    with DeviceMode(dev, strict=True) as mode:
        made = [torch.empty(4096, dtype=F16), torch.empty_strided((64, 64), (1, 64), dtype=F16),
                base.new_empty((64, 64)), base.new_empty_strided((8, 8), (8, 1)), torch.zeros(3, dtype=F16),
                torch.ones(3, dtype=torch.bfloat16), torch.zeros_like(base), torch.empty_like(base),
                torch.full((3,), 0.1, dtype=F16), torch.arange(0, 1, 0.25, dtype=F16),
                torch.scalar_tensor(3.0, dtype=F16), base.new_full((2,), -np.inf), base.new_zeros(2)]
    assert not dev.get_float_status().any()
    assert {route for _, route in mode.routes} == {"factory"}
    assert made[8].tolist() == [float(H(0.1))] * 3 and made[9].tolist() == [0, 0.25, 0.5, 0.75]
    assert made[10].item() == 3.0 and made[11].tolist() == [-np.inf] * 2


class StochasticDepth(torch.nn.Module):
    """torchvision's StochasticDepth ("row" mode): an exact Bernoulli mask from empty().bernoulli_()."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x):
        survival = 1.0 - self.p
        noise = torch.empty([x.shape[0], 1], dtype=x.dtype).bernoulli_(survival)
        noise.div_(survival)
        return x * noise


def test_stochastic_depth_at_scale_one_leaves_the_register_clear() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), StochasticDepth(0.2), torch.nn.ReLU(),
                                torch.nn.Dropout(0.5), torch.nn.Linear(16, 4)).half().train()
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((32, 8)).astype(H))
    dev = Device("atlas-training")
    for _ in range(3):
        for _ in range(20):
            garbage = torch.full((4096,), float("nan"))
            del garbage
        with DeviceMode(dev) as mode:
            loss = model(x).float().square().mean()
            loss.backward()
    assert not dev.get_float_status().any()
    routes = {name: route for name, route in mode.routes}
    assert routes["aten.empty.memory_format"] == "factory" and routes["aten.bernoulli_.float"] == "random"
    assert routes["aten.div_.Scalar"] == "device"


def test_dropout_is_an_exact_mask_then_device_multiplies() -> None:
    x = np.resize(EDGE[np.isfinite(EDGE)], (16, 16)).astype(H)
    dev, ref = Device("atlas-a2"), Device("atlas-a2")
    with DeviceMode(dev) as mode:
        out, mask = torch.ops.aten.native_dropout(torch.from_numpy(x), 0.3, True)
        back = torch.ops.aten.native_dropout_backward(torch.from_numpy(x), mask, 1 / 0.7)
    m = mask.numpy().astype(H)
    scale = ref.cast(np.float64(1 / 0.7), H)
    assert 0 < m.sum() < m.size and mask.dtype == torch.bool
    assert bits(out) == bits(torch.from_numpy(ref.mul(ref.mul(x, m), scale)))
    assert bits(back) == bits(out)
    assert mode.routes["aten.native_dropout.default", "random"] == 1
    assert mode.routes["aten.native_dropout_backward.default", "device"] == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.9, 1.0])
def test_bernoulli_into_our_tensors_is_the_binary64_mask(dtype: torch.dtype, p: float) -> None:
    """bernoulli_(p) (dropout's and drop-path's masks) writes the documented draw, u < p for binary64
    uniforms u from torch's generator, as 0 and 1 in the tensor's own layout, as one device operation
    that raises nothing; a p outside [0, 1] is refused as torch refuses it."""
    from sim.torch_binary32 import bernoulli_mask

    target = torch.full((6, 5), 7.0, dtype=dtype).t()  # a transposed view: written through its strides
    dev = Device("atlas-training")
    before = dev.operations
    torch.manual_seed(11)
    with DeviceMode(dev) as mode:
        same = target.bernoulli_(p)
    torch.manual_seed(11)
    want = bernoulli_mask((5, 6), p)
    assert same is target and target.stride() == (1, 5) and target.dtype == dtype
    assert torch.equal(target.float(), want.float())
    assert dev.operations == before + 1 and not dev.get_float_status().any()
    assert mode.routes["aten.bernoulli_.float", "random"] == 1
    for bad in (1.5, -0.25, float("nan")):
        with pytest.raises(RuntimeError) as native:
            torch.empty(3, dtype=dtype).bernoulli_(bad)
        with DeviceMode(dev), pytest.raises(RuntimeError) as emulated:
            torch.empty(3, dtype=dtype).bernoulli_(bad)
        assert str(emulated.value) == str(native.value).split("\n")[0]


@pytest.mark.parametrize("op, args", [("transpose_", (0, 1)), ("t_", ()), ("unsqueeze_", (1,)), ("squeeze_", ()),
                                      ("squeeze_", (1,)), ("as_strided_", ((3, 2), (1, 3))), ("swapdims_", (0, 1))])
def test_inplace_views_are_views(op: str, args: tuple) -> None:
    x = torch.from_numpy(np.resize(EDGE, (3, 1, 2)).astype(H)) if op.startswith("squeeze") else (
        torch.from_numpy(np.resize(EDGE, (2, 3)).astype(H)))
    want, got = x.clone(), x.clone()
    getattr(want, op)(*args)
    with DeviceMode(Device(), strict=True) as mode:
        same = getattr(got, op)(*args)
    assert same is got and got.shape == want.shape and got.stride() == want.stride() and bits(got) == bits(want)
    assert {route for _, route in mode.routes} == {"exact"}


def test_gru_batch_first_runs_under_the_mode() -> None:
    model, shape = models()["gru"]
    model = model.half()
    x = torch.from_numpy(np.random.default_rng(3).standard_normal(shape).astype(H))
    with DeviceMode(Device()):
        out = model(x)
    assert out.shape == (6, 4) and torch.isfinite(out).all()


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "sigmoid", "exp", "neg", "sqrt", "relu"])
def test_inplace_and_out_overloads_share_the_functional_route(op: str) -> None:
    a = np.resize(EDGE, (6, 6)).astype(H)
    b = np.roll(a, 5).T.copy()
    binary = op in ("add", "sub", "mul", "div")
    operands = (torch.from_numpy(b),) if binary else ()
    dev = Device("atlas-training")
    with DeviceMode(dev) as mode:
        functional = getattr(torch, op)(torch.from_numpy(a), *operands)
        inplace = torch.from_numpy(a.copy())
        same = getattr(inplace, f"{op}_")(*operands)
        out = torch.empty(0, dtype=F16)  # resized by the out= overload
        if op != "relu":  # torch has no relu.out
            getattr(torch, op)(torch.from_numpy(a), *operands, out=out)
    assert same is inplace and bits(inplace) == bits(functional)
    assert op == "relu" or bits(out) == bits(functional)
    ours = {(name, route): n for (name, route), n in mode.routes.items() if name.startswith(f"aten.{op}")}
    assert {route for _, route in ours} == {"device"} and sum(ours.values()) == (2 if op == "relu" else 3)
    assert any(name.startswith(f"aten.{op}_.") for name, _ in ours)


@pytest.mark.parametrize("op", ["silu", "hardswish", "gelu"])
def test_inplace_and_functional_float32_ops_agree(op: str) -> None:
    a = torch.from_numpy(np.resize(EDGE, (6, 6)).astype(H))
    f = getattr(torch.nn.functional, op)
    with DeviceMode(Device()) as mode:
        functional = f(a)
        inplace = a.clone()
        if op != "gelu":
            f(inplace, inplace=True)
        else:
            inplace = f(inplace)
    assert bits(inplace) == bits(functional)
    # SiLU and GELU are fused kernels; hardswish is the NPU kernel's device operations
    assert {route for _, route in mode.routes} - {"exact"} == ({"device"} if op == "hardswish" else {"fused"})


class Seen(TorchDispatchMode):
    """Every operation with a float16 or bfloat16 tensor among its operands or results, or asked
    for in one: the operations DeviceMode must count."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ours = (torch.float16, torch.bfloat16)
        if any((isinstance(t, torch.Tensor) and t.dtype in ours) or (isinstance(t, torch.dtype) and t in ours)
               for t in tree_leaves((args, kwargs, out))):
            self.ops[str(func)] += 1
        return out


class Small(torch.nn.Module):
    """A conv, a GRU and an attention block: a little of everything a real model does."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)
        self.gru = torch.nn.GRU(8, 16, batch_first=True)
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True, dropout=0.1)
        self.ln = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x):
        h = torch.relu(self.norm(self.conv(x)))  # (n, 8, 4, 4)
        h = h.flatten(2).transpose(1, 2)  # (n, 16, 8)
        h, _ = self.gru(h)
        a, _ = self.attn(h, h, h)
        h = self.ln(h + torch.nn.functional.scaled_dot_product_attention(a, h, h, dropout_p=0.1))
        return self.head(torch.nn.functional.silu(h).mean(1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_no_operation_on_our_dtypes_runs_uncounted(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = Small().to(dtype).train()
    x = torch.randn(2, 3, 4, 4).to(dtype)
    with DeviceMode(Device("atlas-training")) as mode, Seen() as seen:
        loss = torch.nn.functional.cross_entropy(model(x).float(), torch.tensor([1, 3]))
        loss.backward()
    counted: collections.Counter[str] = collections.Counter()
    for (name, route), n in mode.routes.items():
        counted[name] += n
        assert route in ROUTE_KINDS
    # A fused kernel above autograd (attention with dropout) is one counted call that no aten
    # operation names; its binary32 computation inside is the kernel's own.
    kernels = {f"{k}{tail}" for k in ABOVE_AUTOGRAD for tail in ("", "_backward")}
    assert all(route == "fused" for name, route in mode.routes if name in kernels)
    assert collections.Counter({name: n for name, n in counted.items() if name not in kernels}) == seen.ops
    assert all(p.grad is not None for p in model.parameters())


def test_continuous_draws_are_the_documented_transforms_of_binary64_uniforms() -> None:
    """uniform_ is lo + (hi - lo) u in binary64 rounded toward -inf into binary32, then by the device
    (toward -inf too, so that a draw stays below hi); normal_ is Box and Muller with correctly rounded
    log and cos (checked here with mpmath), then rounded by the device."""
    mpmath = pytest.importorskip("mpmath")
    dev = Device("atlas-training")
    with DeviceMode(dev, strict=True) as mode:
        torch.manual_seed(5)
        u = torch.empty(1000, dtype=F16).uniform_(-2, 2)
        n = torch.empty(200, dtype=torch.bfloat16).normal_(0, 3)
        r = torch.rand(10, dtype=F16)
    torch.manual_seed(5)
    u64 = torch.empty(1000, dtype=torch.float64).uniform_(0, 1)
    exact = (-2 + 4 * u64).numpy()
    want = exact.astype(np.float32)
    up = want.astype(np.float64) > exact
    want[up] = np.nextafter(want[up], np.float32(-np.inf))  # toward -inf: numpy rounds to nearest
    assert bits(u) == bits(torch.from_numpy(Device("atlas-training").cast(want, H, rounding="DOWNWARD")))
    pair = torch.empty(2, 200, dtype=torch.float64).uniform_(0, 1).tolist()
    mpmath.mp.prec = 200
    f32 = np.float32
    radius = [f32(np.sqrt(np.float64(-2) * np.float64(f32(mpmath.log(1 - mpmath.mpf(a))))))
              for a in pair[0]]
    angle = [f32(mpmath.cos(mpmath.mpf(float(2 * np.pi * b)))) for b in pair[1]]
    z = np.array([f32(ra * an * f32(3)) for ra, an in zip(radius, angle, strict=True)], np.float32)
    assert bits(n) == bits(torch.from_numpy(z).to(torch.bfloat16))
    assert n.dtype == torch.bfloat16 and torch.isfinite(n).all() and ((r >= 0) & (r < 1)).all()
    assert not dev.get_float_status().any()
    assert {route for (name, route) in mode.routes if "empty" not in name} == {"random"}
