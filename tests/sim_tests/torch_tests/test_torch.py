"""sim.torch.DeviceMode: torch's aten operations on float16 routed to the simulated device.

Each mapped operation against the device operation it stands for, on binary16 edge data
(ties, 65504, subnormals, -0, NaN), with Python scalars, 0-d, non-contiguous, in-place
and mixed-dtype operands; the float32 route; strict mode; a model's routes; and the
register catching in saturation mode what the gradients do not show."""

from __future__ import annotations

import collections

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sim import Device  # noqa: E402
from sim.torch import DeviceMode  # noqa: E402

H, F32 = np.float16, np.float32
EDGE = np.array([0.0, -0.0, 1.0, -1.5, 2.0**-24, -(2.0**-14), 65504.0, -65504.0, 65519.0, 0.1, 3.0, 1000.0,
                 np.inf, -np.inf, np.nan, 0.5 + 2.0**-11, 1.0 + 2.0**-10, 7.0], H)


def bits(x) -> list[int]:
    a = x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    return a.view(np.uint16 if a.dtype == H else np.uint32).ravel().tolist()


def pair() -> tuple[np.ndarray, np.ndarray]:
    a = np.resize(EDGE, (6, 6)).astype(H)
    return a, np.roll(a, 5).T.copy()


@pytest.mark.parametrize("profile", ["atlas-a2", "atlas-training"])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum"])
def test_binary_ops_are_the_device_ops(op: str, profile: str) -> None:
    a, b = pair()
    dev, ref = Device(profile), Device(profile)
    with DeviceMode(dev) as mode:
        got = getattr(torch, op)(torch.from_numpy(a), torch.from_numpy(b))
    assert bits(got) == bits(getattr(ref, op)(a, b))
    assert dev.get_float_status().tolist() == ref.get_float_status().tolist()
    assert [k for k, route in mode.routes if route != "exact"] == [f"aten.{op}.default" if op in (
        "maximum", "minimum") else f"aten.{op}.Tensor"]
    assert all(route == "device" for k, route in mode.routes if k.startswith(f"aten.{op}"))


def test_scalars_zero_d_noncontiguous_inplace_and_mixed_dtypes() -> None:
    a, b = pair()
    dev, ref = Device("atlas-training"), Device("atlas-training")
    ta, tb = torch.from_numpy(a.copy()), torch.from_numpy(b)
    with DeviceMode(dev):
        scalar = ta * 300.0  # the scalar is rounded to binary16 on the device, then multiplied
        zero_d = ta + torch.tensor(0.1, dtype=torch.float16)
        strided = ta.T - tb  # a non-contiguous operand
        mixed = ta + torch.from_numpy(b.astype(F32))  # promotes to float32: exact widening, binary32 add
        inplace = ta.clone()
        inplace.add_(tb)
    assert bits(scalar) == bits(ref.mul(a, ref.cast(np.float64(300.0), H)))
    assert bits(zero_d) == bits(ref.add(a, np.array(0.1, H)))
    assert bits(strided) == bits(ref.sub(np.ascontiguousarray(a.T), b))
    # float16 + float32 promotes: the float16 operand is cast on the device (saturation mode maps its
    # Inf and NaN as every result there), then a binary32 add.
    assert mixed.dtype == torch.float32 and bits(mixed) == bits(ref.add(ref.cast(a, F32), b.astype(F32)))
    assert bits(inplace) == bits(ref.add(a, b))
    assert ta.numpy().tobytes() == a.tobytes()  # clone kept the original


@pytest.mark.parametrize("op", ["exp", "log", "tanh", "sigmoid", "sqrt", "rsqrt", "erf", "relu", "neg", "abs"])
def test_unary_ops_are_the_device_ops(op: str) -> None:
    a = np.resize(EDGE, 40).astype(H)
    dev, ref = Device("atlas-training"), Device("atlas-training")
    with DeviceMode(dev):
        got = getattr(torch, op)(torch.from_numpy(a))
    assert bits(got) == bits(getattr(ref, op)(a))
    assert dev.get_float_status().tolist() == ref.get_float_status().tolist()


def test_reductions_matmuls_and_conv_are_the_device_ops() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 6, 5)) * 2.0 ** rng.integers(-10, 10, (4, 6, 5))).astype(H)
    m, w = rng.standard_normal((5, 7)).astype(H), rng.standard_normal((7, 3)).astype(H)
    bias = rng.standard_normal(3).astype(H)
    img, ker = rng.standard_normal((2, 3, 6, 6)).astype(H), rng.standard_normal((4, 3, 3, 3)).astype(H)
    dev, ref = Device("atlas-a2"), Device("atlas-a2")
    t = torch.from_numpy
    with DeviceMode(dev) as mode:
        s = t(x).sum(dim=(0, 2))
        wide = t(x).sum(dim=(0, 2), dtype=torch.float32)  # the elements widen exactly: one binary32 sum
        mean = t(x).mean(dim=1, keepdim=True)
        top = t(x).amax(dim=-1)
        mm = t(m) @ t(w)
        lin = torch.nn.functional.linear(t(m), t(np.ascontiguousarray(w.T)), t(bias))
        conv = torch.nn.functional.conv2d(t(img), t(ker), padding=1)
    flat = np.transpose(x, (0, 2, 1)).reshape(-1, 6)
    assert bits(s) == bits(ref.sum(flat, axis=0, accumulate=F32, out_dtype=H))
    assert wide.dtype == torch.float32 and bits(wide) == bits(ref.sum(flat, axis=0, accumulate=F32, out_dtype=F32))
    assert bool((wide.half().float() != wide).any()), "totals binary16 holds could not tell the two apart"
    assert bits(mean) == bits(ref.mean(x, axis=1, accumulate=F32, out_dtype=H))
    assert bits(top) == bits(ref.amax(np.moveaxis(x, 2, 0).reshape(5, -1), axis=0))
    assert bits(mm) == bits(ref.matmul(m, w))
    assert bits(lin) == bits(ref.add(ref.matmul(m, w), bias))
    assert bits(conv) == bits(ref.conv2d(img, ker, padding=1))
    assert {route for _, route in mode.routes} <= {"device", "exact"}


def test_other_ops_run_in_float32_and_round_once_on_the_device() -> None:
    x = np.array([[300.0, 1.0, -2.0], [0.5, 7.0, 65504.0]], H)
    dev, ref = Device("atlas-training"), Device("atlas-training")
    with DeviceMode(dev) as mode:
        sq = torch.pow(torch.from_numpy(x), 2)  # 90000 saturates: the register sees it
        soft = torch.softmax(torch.from_numpy(x), dim=1)
    want = ref.cast(np.power(x.astype(F32), 2), H)
    assert bits(sq) == bits(want) and float(sq[0, 0]) == 65504.0
    assert dev.get_float_status()[0] == 1
    assert bits(soft) == bits(Device().cast(torch.softmax(torch.from_numpy(x).float(), 1).numpy(), H))
    assert mode.routes["aten.pow.Tensor_Scalar", "device"] == 1  # x ** 2 is the device's mul(x, x)
    with pytest.raises(NotImplementedError, match="aten.split_copy.Tensor has no device equivalent"):
        with DeviceMode(Device(), strict=True):
            torch.ops.aten.split_copy(torch.from_numpy(x), 2, 1)
    with DeviceMode(Device()) as general:  # a function no table names: the float32 route
        torch.ops.aten.split_copy(torch.from_numpy(x), 2, 1)
    assert general.routes["aten.split_copy.Tensor", "float32"] == 1


def test_the_float32_route_gives_each_call_its_own_result_dtypes_and_count() -> None:
    """The float32 route keeps the result dtypes per signature: a list result's length still
    follows each call's values, and a dtype that follows the operands' does too."""
    x16 = torch.arange(12, dtype=torch.float16).reshape(3, 4)
    with DeviceMode(Device()) as mode:  # split_copy: a list result the float32 route takes
        halves = torch.ops.aten.split_copy(x16, 2, 1)
        quarters = torch.ops.aten.split_copy(x16, 1, 1)
        thirds = torch.ops.aten.split_copy(x16.to(torch.bfloat16), 3, 0)
    assert [t.dtype for t in halves] == [torch.float16] * 2 and len(quarters) == 4
    assert [t.dtype for t in thirds] == [torch.bfloat16]
    assert [t.tolist() for t in quarters] == [x16[:, i:i + 1].tolist() for i in range(4)]
    assert mode.routes["aten.split_copy.Tensor", "float32"] == 3


def mlp(seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)).half()


def step(model, dev: Device, scale: float):
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((16, 64)).astype(H))
    y = torch.arange(16) % 10
    model.zero_grad()
    with DeviceMode(dev) as mode:
        loss = torch.nn.functional.cross_entropy(model(x).float(), y) * scale
        loss.backward()
    return [p.grad.numpy().copy() for p in model.parameters()], mode


def test_an_mlp_routes_every_float16_op_and_the_register_catches_overflow() -> None:
    grads, mode = step(mlp(), Device("atlas-a2"), 1024.0)
    assert dict(mode.routes) == {  # kept here: a torch upgrade that changes routing fails loudly
        ("aten.t.default", "exact"): 9, ("aten.addmm.default", "device"): 2, ("aten.relu.default", "device"): 1,
        ("aten.detach.default", "exact"): 6, ("aten._to_copy.default", "device"): 2,
        ("aten.mm.default", "device"): 3, ("aten.sum.dim_IntList", "device"): 2, ("aten.view.default", "exact"): 2,
        ("aten.threshold_backward.default", "exact"): 1}
    assert all(np.isfinite(g).all() for g in grads)
    # A scale of 2**32 overflows binary16 gradients: Inf in INF/NaN mode; in saturation mode
    # the gradients stay finite (65504) and only the register knows.
    inf_nan, _ = step(mlp(), Device("atlas-a2"), 2.0**32)
    assert not all(np.isfinite(g).all() for g in inf_nan)
    sat = Device("atlas-training")
    saturated, _ = step(mlp(), sat, 2.0**32)
    assert all(np.isfinite(g).all() for g in saturated) and sat.get_float_status()[0] == 1


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU())
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.encoder(x))


def test_device_ops_are_labelled_with_the_module_that_issued_them() -> None:
    torch.manual_seed(0)
    model, dev = Net().half(), Device("atlas-training")
    mode = DeviceMode(dev)
    labels, route = [], mode._route
    mode._route = lambda func, *rest: (labels.append((str(func), dev.current_label)), route(func, *rest))[1]
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((8, 64)).astype(H))
    with mode:
        out = model(x).float()
        forward = list(labels)
        (torch.nn.functional.cross_entropy(out, torch.arange(8)) * 2.0**32).backward()
    assert forward == [("aten.addmm.default", "encoder.0"), ("aten.relu.default", "encoder.1"),
                       ("aten.addmm.default", "head"), ("aten._to_copy.default", "")]  # .float() is outside
    backward = {label for _, label in labels[len(forward):]}
    assert backward == {"", "head", "encoder.0"}  # relu's backward is an exact select: not routed
    # The overflowing scale: the cast of the loss gradient (outside any module) and the
    # gradients of both linear layers overflow; only the register and mode.events say so.
    assert set(mode.events) == {"", "head", "encoder.0"} and dev.current_label is None


def test_backward_labels_come_from_the_forward_in_a_later_mode_and_accumulation() -> None:
    """The backward pass, run in a later mode, labels each operation with the module whose
    forward made its node; a node made outside modules takes the enclosing label (here "step"),
    not the module that consumed it; a parameter's gradient accumulation its module's."""
    torch.manual_seed(0)
    model, dev = Net().half(), Device("atlas-training")
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((8, 64)).astype(H)).requires_grad_()
    seen = []
    for _ in range(2):  # the second backward accumulates into the gradients of the first
        with DeviceMode(dev):
            out = (model(x * 2.0).float() ** 2).sum()
        mode, labels = DeviceMode(dev), []
        route = mode._route
        mode._route = lambda func, *rest, labels=labels, route=route: (
            labels.append((str(func), dev.current_label)), route(func, *rest))[1]
        with mode, dev.label("step"):
            out.backward()
        seen.append(labels)
    made = [("aten._to_copy.default", "step"), ("aten.mm.default", "head"), ("aten.mm.default", "head"),
            ("aten.sum.dim_IntList", "head"), ("aten.mm.default", "encoder.0"), ("aten.mm.default", "encoder.0"),
            ("aten.sum.dim_IntList", "encoder.0"), ("aten.mul.Tensor", "step")]
    assert seen[0] == made
    added = collections.Counter(label for op, label in seen[1] if op == "aten.add_.Tensor")
    assert [x for x in seen[1] if x[0] != "aten.add_.Tensor"] == made
    assert added == {"head": 2, "encoder.0": 2, "step": 1}  # weight and bias of each Linear; x (no module's)


def test_backward_outside_the_mode_or_in_another_thread_is_refused() -> None:
    import threading
    model = Net().half()
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((4, 64)).astype(H))
    with DeviceMode(Device()):
        loss = model(x).float().sum()
    with pytest.raises(RuntimeError, match="running outside it"):
        loss.backward()
    errors = []
    with DeviceMode(Device()):
        loss = model(x).float().sum()
        thread = threading.Thread(target=lambda: errors.append(_raises(loss.backward)))
        thread.start()
        thread.join()
    assert errors and "running outside it" in errors[0]


def _raises(fn) -> str:
    try:
        fn()
    except RuntimeError as err:
        return str(err)
    return ""


def test_layer_norm_is_float32_rounded_once_within_half_an_ulp_of_float64() -> None:
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((8, 32)) * 2.0 ** rng.integers(-4, 5, (8, 1))).astype(H)
    w, b = rng.standard_normal(32).astype(H), rng.standard_normal(32).astype(H)
    dev = Device("atlas-a2")
    t = torch.from_numpy
    with DeviceMode(dev) as mode:
        got = torch.nn.functional.layer_norm(t(x), (32,), t(w), t(b), eps=1e-5)
    assert mode.routes["aten.native_layer_norm.default", "fused"] == 1
    x64 = x.astype(np.float64)
    mean, var = x64.mean(1, keepdims=True), x64.var(1, keepdims=True)
    exact = (x64 - mean) / np.sqrt(var + 1e-5) * w.astype(np.float64) + b.astype(np.float64)
    ulp = np.spacing(np.abs(exact).astype(H)).astype(np.float64)
    # One binary16 rounding of a binary32 computation: half an ulp, plus binary32's own error.
    assert np.all(np.abs(got.numpy().astype(np.float64) - exact) <= 0.5 * ulp + 1e-5 * np.abs(exact) + 1e-6)


def test_results_asked_for_in_float16_round_on_the_device() -> None:
    """A cast from float32 into float16 is ours too: 1e6 saturates and the register sees it
    (natively it would be an Inf the device never saw). What torch refuses, it still refuses."""
    dev = Device("atlas-training")
    with DeviceMode(dev) as mode:
        cast = torch.tensor([1e6, 1.0]).to(torch.float16)
        ones = torch.full((3,), 2.0, dtype=torch.float16)
        with pytest.raises(RuntimeError, match="cannot be converted to type c10::Half without overflow"):
            torch.full((3,), 1e6, dtype=torch.float16)
    assert cast.tolist() == [65504.0, 1.0] and ones.tolist() == [2.0] * 3
    assert dev.get_float_status()[0] == 1 and dev.get_float_status()[3] == 1
    assert mode.routes["aten._to_copy.default", "device"] == 1 and mode.routes["aten.full.default", "factory"] == 1


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons_are_the_device_predicates(op: str) -> None:
    a, b = pair()
    dev, ref = Device("atlas-a2"), Device("atlas-a2")
    with DeviceMode(dev):
        got = getattr(torch, op)(torch.from_numpy(a), torch.from_numpy(b))
        scalar = getattr(torch, op)(torch.from_numpy(a), 3.0)
    assert got.dtype == torch.bool and got.numpy().tolist() == getattr(ref, op)(a, b).tolist()
    assert scalar.numpy().tolist() == getattr(ref, op)(a, np.full_like(a, 3.0)).tolist()
    assert dev.get_float_status()[1] == ref.get_float_status()[1]  # INVALID: NaN operands (signaling ones)


def test_bmm_and_amin_are_the_device_ops() -> None:
    rng = np.random.default_rng(6)
    a = (rng.standard_normal((3, 4, 5)) * 100).astype(H)
    b = (rng.standard_normal((3, 5, 2)) * 100).astype(H)
    x = np.resize(EDGE, (3, 6)).astype(H)
    dev, ref = Device("atlas-training"), Device("atlas-training")
    with DeviceMode(dev) as mode:
        got = torch.bmm(torch.from_numpy(a), torch.from_numpy(b))
        low = torch.amin(torch.from_numpy(x), dim=1)
    assert bits(got) == bits(ref.matmul(a, b)) and bits(low) == bits(ref.amin(x.T, axis=0))
    assert mode.routes["aten.bmm.default", "device"] == 1 and mode.routes["aten.amin.default", "device"] == 1
    assert dev.get_float_status().tolist() == ref.get_float_status().tolist()


def test_the_dispatch_handler_runs_without_torchs_dynamo_wrapper() -> None:
    """DeviceMode is an eager mode: its __torch_dispatch__ is its own function, not wrapped per
    call in torch._disable_dynamo (torch wraps every dispatch mode's unless it opts out)."""
    handler = DeviceMode.__dict__["__torch_dispatch__"]
    assert handler.__qualname__ == "DeviceMode.__torch_dispatch__" and handler.__module__ == "sim.torch.mode"


def test_the_float32_routes_argument_map_is_pytrees_on_aten_arguments() -> None:
    """The float32 route's one-level map gives what torch's tree_map gives for aten call arguments
    (values, lists and tuples of them, keyword dicts), containers' kinds kept."""
    from torch.utils._pytree import tree_map

    from sim.torch.convert import _map

    x, y = torch.ones(2, dtype=torch.float16), torch.zeros(3, dtype=torch.bfloat16)
    wide = lambda v: v.float() if isinstance(v, torch.Tensor) else (torch.float32 if v is torch.float16 else v)  # noqa: E731
    for args in [(x, 1, 2.5), ([x, y], 0), (x, [None, torch.arange(2)]), (x, (1, 2), [3, 4], None, torch.float16),
                 {"dtype": torch.float16, "out": x, "dims": [0, 1]}, ()]:
        assert _same(_map(wide, args), tree_map(wide, args)), args


def _same(a, b) -> bool:
    """a and b of one type with equal contents, tensors by dtype and values, containers by kind."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b
