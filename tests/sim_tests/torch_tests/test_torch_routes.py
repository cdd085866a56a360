"""The deliberate routes of sim.torch.DeviceMode for the operations real models use beyond the
basic table: exact selections and predicates, rsub, clamp, hardsigmoid and hardswish (forward and
backward) as device compositions, pow's Pows-kernel exponents, and the fused gradient
accumulations of embeddings and max pooling. Each against a reference of independent means:
numpy float16 arithmetic (binary32 then rounded to binary16, the same as one binary16 rounding for
+, -, *, /, sqrt), float64 sums rounded once, and explicit loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sim import Device  # noqa: E402
from sim.torch import DeviceMode  # noqa: E402

H, F32 = np.float16, np.float32
aten = torch.ops.aten
F = torch.nn.functional
MAX = 65504.0


def bits(x) -> list[int]:
    a = x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    return a.view(np.uint16).ravel().tolist()


def routed(fn, profile: str = "atlas-a2"):
    """fn() under a strict mode on a new device: its result, the routes that computed (all but the
    exact ones: views, the operands' tensors), the register."""
    dev = Device(profile)
    with DeviceMode(dev, strict=True) as mode:
        out = fn()
    return out, {route for _, route in mode.routes if route != "exact"}, dev.get_float_status()


def sat(a: np.ndarray) -> np.ndarray:
    """A binary16 result as saturation mode writes it: an overflow to +-Inf becomes +-65504."""
    return np.clip(a, -MAX, MAX).astype(H)


def t(a) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def test_splits_selection_gradients_and_classifications_are_exact() -> None:
    x = np.array([[1.0, -0.0, np.inf], [np.nan, -np.inf, 65504.0]], H)
    g = np.array([3.0, 2.0**-24, -7.5], H)
    dev = Device("atlas-a2")
    with DeviceMode(dev, strict=True) as mode:
        parts, sel = aten.unsafe_split(t(x), 2, 1), aten.select_backward(t(g), [2, 3], 0, 1)
        sl, inf, nan = aten.slice_backward(t(g[:2]), [5], 0, 1, 5, 2), torch.isinf(t(x)), torch.isnan(t(x))
    assert {route for _, route in mode.routes} == {"exact"} and not dev.get_float_status().any()
    assert {name.split(".")[1] for name, _ in mode.routes} >= {"unsafe_split", "select_backward", "isinf"}
    assert [bits(p) for p in parts] == [bits(x[:, :2]), bits(x[:, 2:])]
    want = np.zeros((2, 3), H)
    want[1] = g
    assert bits(sel) == bits(want)
    want = np.zeros(5, H)
    want[1], want[3] = g[0], g[1]
    assert bits(sl) == bits(want) and not np.signbit(sl.numpy()[[0, 2, 4]]).any()  # +0 where nothing was
    assert inf.tolist() == [[False, False, True], [False, True, False]]
    assert nan.tolist() == [[False, False, False], [True, False, False]]


def test_clamp_is_the_device_maximum_then_minimum_with_bounds_rounded_into_the_dtype() -> None:
    x = np.array([-np.inf, -65504.0, -3.0, 0.5, 64500.0, 65504.0, np.nan, 2.0**-24], H)
    lo = np.array([-1.0, -2.0, -2.5, 1.0, 0.0, -5.0, 0.0, 0.0], H)
    hi = np.array([1.0, 4.0, 3.0, 2.0, 64000.0, np.nan, 1.0, 1.0], H)
    bound = torch.tensor(64504.0)  # float32, 0-d: the result stays float16 and the bound rounds to 64512
    (both, scalar, low, wide), routes, status = routed(lambda: (
        torch.clamp(t(x), t(lo), t(hi)), torch.clamp(t(x), -bound, bound), torch.clamp_min(t(x), 0.1),
        torch.clamp(t(x), max=t(hi.astype(F32)))))
    assert routes == {"device"} and not status[0]
    assert bits(both) == bits(np.minimum(np.maximum(x, lo), hi))  # numpy's maximum and minimum keep NaN too
    assert float(np.float16(64504.0)) == 64512.0 and scalar.dtype == torch.float16
    assert bits(scalar) == bits(np.clip(x, H(-64512.0), H(64512.0)))
    assert bits(low) == bits(np.maximum(x, H(0.1)))
    # A float32 bound of full shape promotes: x widened exactly, a binary32 minimum.
    assert wide.dtype == torch.float32
    assert np.array_equal(wide.numpy(), np.minimum(x.astype(F32), hi.astype(F32)), equal_nan=True)


@pytest.mark.parametrize("profile", ["atlas-a2", "atlas-training"])
def test_rsub_is_the_device_subtraction_with_its_operands_swapped(profile: str) -> None:
    """``1.0 - x`` (aten rsub) is 1 - x rounded once; ``rsub(x, 2, alpha=3)`` is 3 * x rounded, then
    2 minus that rounded, as sub's alpha is: numpy float16 arithmetic, saturated in saturation mode."""
    x = np.array([0.0, 1.0, -0.0, 2.0**-24, 3.0, -65504.0, 30000.0], H)
    (one, alpha), routes, status = routed(lambda: (1.0 - t(x), torch.rsub(t(x), 2.0, alpha=3)), profile)
    assert routes == {"device"} and one.dtype == alpha.dtype == torch.float16
    assert bits(one) == bits(H(1) - x)  # 1 - (-65504) = 65505 rounds to 65504: no overflow
    with np.errstate(over="ignore"):
        triple = x * H(3)  # 3 * -65504 and 3 * 30000 overflow
    assert bits(alpha) == bits(H(2) - triple if profile == "atlas-a2" else sat(H(2) - sat(triple)))
    assert status[0] == 1


XS = np.array([-65504.0, -100.0, -3.0, -2.998, -1.0, -0.0, 0.0, 0.1, 1.0, 2.5, 3.0, 3.002, 7.0, 10000.0,
               12000.0, 65504.0], H)


def hardsigmoid16(x: np.ndarray) -> np.ndarray:
    """relu6(x + 3) / 6 in binary16, each operation rounded (numpy float16)."""
    return (np.minimum(np.maximum(x + H(3), H(0)), H(6)) / H(6)).astype(H)


@pytest.mark.parametrize("profile", ["atlas-a2", "atlas-training"])
def test_hardsigmoid_and_hardswish_are_device_compositions_in_the_npu_kernels_order(profile: str) -> None:
    """hardsigmoid = relu6(x + 3) / 6 and hardswish = x * that, each step rounded in binary16 (numpy
    float16 is IEEE binary16 arithmetic): nothing overflows, x >= 3 gives x itself."""
    (sig, swish, inplace), routes, status = routed(
        lambda: (F.hardsigmoid(t(XS)), F.hardswish(t(XS)), F.hardswish(t(XS.copy()), inplace=True)), profile)
    assert routes == {"device"} and sig.dtype == swish.dtype == torch.float16
    assert bits(sig) == bits(hardsigmoid16(XS))
    assert bits(swish) == bits((XS * hardsigmoid16(XS)).astype(H)) and bits(inplace) == bits(swish)
    big = XS >= 3
    assert np.array_equal(np.asarray(bits(swish))[big], np.asarray(bits(XS))[big])
    assert not status[0]


@pytest.mark.parametrize("profile", ["atlas-a2", "atlas-training"])
def test_the_hard_activations_backward_computes_only_inside_their_range(profile: str) -> None:
    x = np.array([-4.0, -3.0, -2.0, 0.0, 1.5, 3.0, 4.0, np.nan, 100.0, -100.0], H)
    g = np.array([1.0, 3.0, -2.5, 7.0, 0.1, 2.0, 5.0, 9.0, 65504.0, 65504.0], H)
    (sig, swish), routes, status = routed(
        lambda: (aten.hardsigmoid_backward(t(g), t(x)), aten.hardswish_backward(t(g), t(x))), profile)
    assert routes == {"device"}
    inside = (x > -3) & (x < 3)
    assert bits(sig) == bits(np.where(inside, g * H(1 / 6), H(0)).astype(H))
    middle = (x >= -3) & (x <= 3)
    want = np.where(x < -3, H(0), np.where(middle, g * (x / H(3) + H(0.5)), g)).astype(H)  # NaN x: grad
    assert bits(swish) == bits(want)
    # 65504 gradients outside the range pass through (or vanish) without a flag: nothing computed there.
    assert not status[0]
    (big,), _, flagged = routed(lambda: (aten.hardswish_backward(t(np.array([65504.0], H)),
                                                                 t(np.array([2.0], H))),), profile)
    assert flagged[0] == 1 and float(big[0]) == (np.inf if profile == "atlas-a2" else MAX)


def test_pow_takes_the_pows_kernel_for_its_six_exponents() -> None:
    """On every finite binary16 operand: the kernel's binary32 steps (each exact in float64, then
    rounded to binary32), rounded to binary16; which is, for binary16, also the one rounding of the
    exact power (float64 values rounded once)."""
    finite = np.arange(0, 0x7C00, dtype=np.uint16).view(H)
    x = np.concatenate([finite, -finite[1:]])
    pos = finite[1:]
    exponents = (2, 3, 0.5, -1, -2, -0.5)
    outs, routes, _ = routed(lambda: [torch.pow(t(x if e in (2, 3) else pos), e) for e in exponents])
    assert routes == {"device"}
    r32 = lambda v: v.astype(F32).astype(np.float64)  # noqa: E731
    x64, p64 = x.astype(np.float64), pos.astype(np.float64)
    with np.errstate(all="ignore"):
        kernel = [x64 * x64, r32(x64 * r32(x64 * x64)), np.sqrt(p64), 1 / p64, r32(1 / r32(p64 * p64)),
                  r32(1 / r32(np.sqrt(p64)))]
        exact = [x64**2, x64**3, np.sqrt(p64), 1 / p64, 1 / (p64 * p64), 1 / np.sqrt(p64)]
    for e, got, k, ref in zip(exponents, outs, kernel, exact, strict=True):
        assert bits(got) == bits(k.astype(H)) == bits(ref.astype(H)), e


@pytest.mark.parametrize("profile", ["atlas-a2", "atlas-training"])
def test_pow_overflow_reaches_the_register_and_other_exponents_take_the_fused_kernel(profile: str) -> None:
    (cube, bf), _, status = routed(lambda: (torch.pow(t(np.array([300.0, -2.0], H)), 3),
                                            torch.pow(torch.tensor([1e13, 2.0], dtype=torch.bfloat16), 3)), profile)
    assert status[0] == 1 and float(cube[1]) == -8.0 and float(bf[1]) == 8.0
    big = np.inf if profile == "atlas-a2" else MAX
    assert float(cube[0]) == big  # 2.7e7 overflows binary16
    # 1e39 overflows binary32 inside the kernel: Inf, kept or saturated to bfloat16's largest
    assert float(bf[0]) == (np.inf if profile == "atlas-a2" else float(torch.finfo(torch.bfloat16).max))
    general, routes, status = routed(lambda: torch.pow(t(np.array([100.0, 2.0], H)), 2.5), profile)
    assert routes == {"fused"} and status[0] == 1 and float(general[0]) == big  # 100 ** 2.5 = 1e5 overflows
    assert float(general[1]) == float(np.float16(2.0 ** 2.5))


def exact_sum16(values: list[float]) -> float:
    """A sum of binary16 values in float64 (exact for the values used here), rounded once."""
    return float(np.float16(np.sum(np.asarray(values, np.float64))))


@pytest.mark.parametrize("profile", ["atlas-a2", "atlas-training"])
def test_embedding_backward_is_a_fused_binary32_accumulation(profile: str) -> None:
    """Each row of the weight gradient: the gradients of its index summed in binary32, rounded once.
    60000 + 60000 - 60000 stays finite (a binary16 running sum would overflow); 40000 + 40000 does not."""
    ids = torch.tensor([[0, 1, 0, 3], [1, 0, 2, 2]])
    grads = np.array([[[60000.0, 1.0], [1 + 2.0**-10, 3.0], [60000.0, 2.0**-11], [5.0, 6.0]],
                      [[1 + 2.0**-10, 7.0], [-60000.0, 2.0**-11], [40000.0, 1.0], [40000.0, 0.5]]], H)
    dev = Device(profile)
    weight = torch.zeros(4, 2, dtype=torch.float16, requires_grad=True)
    with DeviceMode(dev, strict=True) as mode:
        F.embedding(ids, weight).backward(t(grads))
    assert mode.routes["aten.embedding_dense_backward.default", "fused"] == 1
    flat, idx = grads.reshape(-1, 2), ids.reshape(-1).numpy()
    want = np.array([[exact_sum16([flat[k, c] for k in range(len(idx)) if idx[k] == row]) for c in range(2)]
                     for row in range(4)])
    if profile == "atlas-training":
        want = np.clip(want, -MAX, MAX)
    assert weight.grad.numpy().tolist() == want.tolist()
    assert float(weight.grad[0, 0]) == 60000.0 and float(weight.grad[0, 1]) == float(H(1 + 2.0**-11 * 2))
    assert dev.get_float_status()[0] == 1  # row 2's 80000 overflowed binary16, and only that


def test_max_pool_backward_sums_overlapping_windows_in_binary32_once() -> None:
    """3x3 windows at stride 1 over a 5x5 image whose centre is the largest value: the centre's
    gradient is the sum of all nine windows' gradients, rounded once (the other positions, maxima of
    no window, get +0), as a loop over the windows computes it."""
    rng = np.random.default_rng(0)
    img = rng.permutation(25).astype(H).reshape(1, 1, 5, 5)
    img[0, 0, 2, 2] = 100.0
    img[0, 0, 0, 0] = 99.0  # the maximum of the top-left window only, not the centre
    g = (rng.integers(-2000, 2000, (1, 1, 3, 3)) * 2.0**-4 + 2.0**-10).astype(H)
    x = t(img).requires_grad_(True)
    dev = Device("atlas-a2")
    with DeviceMode(dev, strict=True) as mode:
        F.max_pool2d(x, 3, stride=1).backward(t(g))
    assert mode.routes["aten.max_pool2d_with_indices_backward.default", "fused"] == 1
    want = np.zeros((5, 5))
    for i in range(3):
        for j in range(3):
            window = img[0, 0, i:i + 3, j:j + 3]
            r, c = np.unravel_index(np.argmax(window), (3, 3))
            want[i + r, j + c] += float(g[0, 0, i, j])
    assert x.grad.numpy()[0, 0].tolist() == want.astype(H).astype(np.float64).tolist()
    assert not dev.get_float_status()[0]


def test_selections_by_value_and_integral_rounding_are_exact() -> None:
    """sort, topk, max/min (over a dimension and all), argmax, tril/triu, sgn/sign, pixel_shuffle, 3-d and
    adaptive max pooling, diagonal's gradient, masked_scatter, scatter's placement, floor/ceil/round/trunc and
    frac: exact, bit for bit against numpy (NaN, -0 and the extremes included), the register untouched."""
    x = np.array([[1.5, -0.0, np.inf, 3.25], [np.nan, -np.inf, 65504.0, -2.5], [0.0, 2.0**-24, -1.0, 6.5]], H)
    dev = Device("atlas-a2")
    mask = np.array([[True, False, True, False]] * 3)
    with DeviceMode(dev, strict=True) as mode:
        srt, top = torch.sort(t(x[2]), descending=True).values, torch.topk(t(x[2]), 2).values
        mx, mn, amx = t(x[[0, 2]]).max(1).values, t(x[2]).min(), t(x[2]).argmax()
        lower, sign, sgn = t(x).tril(), t(x).sign(), t(x).sgn()
        shuffled = F.pixel_shuffle(t(np.arange(16, dtype=H).reshape(1, 4, 2, 2)), 2)
        pooled3 = F.max_pool3d(t(np.arange(8, dtype=H).reshape(1, 1, 2, 2, 2)), 2)
        adaptive = F.adaptive_max_pool2d(t(x[None, None, :, :]), (1, 2))
        diag = aten.diagonal_backward(t(x[0, :3]), [3, 3], 0, 0, 1)
        scattered = t(np.zeros((3, 4), H)).masked_scatter(t(mask), t(x))
        placed = t(np.zeros(4, H)).scatter(0, torch.tensor([3, 0]), t(x[0, :2]))
        rounded = [f(t(np.array([2.5, -2.5, 0.5, -0.0, 1023.5], H))) for f in (torch.floor, torch.ceil, torch.round,
                                                                               torch.trunc, torch.frac)]
    assert {route for _, route in mode.routes} == {"exact"} and not dev.get_float_status().any()
    assert bits(srt) == bits(np.array([6.5, 2.0**-24, 0.0, -1.0], H)) and bits(top) == bits(srt[:2])
    assert bits(mx) == bits(np.array([np.inf, 6.5], H)) and float(mn) == -1.0 and int(amx) == 3
    numbers = ~np.isnan(x)  # torch's sign of NaN is 0 (its own convention; no arithmetic either way)
    assert bits(lower) == bits(np.tril(x)) and bits(sign.numpy()[numbers]) == bits(np.sign(x[numbers]) + H(0))
    assert torch.equal(sgn, sign) and sign.numpy()[~numbers].tolist() == [0.0]
    assert shuffled.reshape(-1).tolist() == [0, 4, 1, 5, 8, 12, 9, 13, 2, 6, 3, 7, 10, 14, 11, 15]
    assert pooled3.item() == 7.0 and adaptive.isnan().reshape(-1).tolist() == [True, False]
    assert bits(diag) == bits(np.diag(x[0, :3])) and not np.signbit(diag.numpy()[~np.eye(3, dtype=bool)]).any()
    want = np.zeros((3, 4), H)
    want[mask] = x.ravel()[:mask.sum()]
    assert bits(scattered) == bits(want) and bits(placed) == bits(np.array([-0.0, 0, 0, 1.5], H))
    v = np.array([2.5, -2.5, 0.5, -0.0, 1023.5])
    for got, want in zip(rounded, (np.floor(v), np.ceil(v), np.round(v), np.trunc(v), v - np.trunc(v)), strict=True):
        assert bits(got) == bits(want.astype(H))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_masked_fill_rounds_only_a_value_the_dtype_cannot_hold(dtype) -> None:
    """masked_fill selects exactly; its value is rounded into the dtype on the device (0.1 as the
    device's cast rounds it), the masks' -inf and finfo.min are held as they are, and a value the
    dtype overflows is refused by torch, as natively."""
    x = torch.arange(6, dtype=torch.float32).to(dtype)
    mask = torch.tensor([True, False, True, False, False, True])
    dev = Device("atlas-training")
    with DeviceMode(dev, strict=True) as mode:
        tenth = x.masked_fill(mask, 0.1)
        low = x.masked_fill(mask, torch.finfo(dtype).min)
        inf = x.masked_fill(mask, torch.tensor(float("-inf")))
    assert {route for _, route in mode.routes} <= {"device", "exact"}
    assert mode.routes["aten.masked_fill.Scalar", "device"] == 2
    assert tenth[mask].tolist() == [float(torch.tensor(0.1).to(dtype))] * 3 and torch.equal(tenth[~mask], x[~mask])
    assert low[mask].tolist() == [torch.finfo(dtype).min] * 3 and inf[mask].isneginf().all()
    assert not dev.get_float_status().any()
    if dtype == torch.float16:
        with DeviceMode(Device("atlas-training")), pytest.raises(RuntimeError, match="overflow"):
            x.masked_fill(mask, 1e9)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_index_fill_rounds_its_value_by_the_rule_of_every_selection(dtype) -> None:
    """index_fill (trace's gradient writes the diagonal with it) selects exactly; a binary32 value
    is rounded into the dtype on the device, -inf is held as it is, and a value the dtype
    overflows is refused by torch, as natively."""
    x = torch.arange(12, dtype=torch.float32).to(dtype).reshape(3, 4)
    index = torch.tensor([0, 2])
    dev = Device("atlas-training")
    with DeviceMode(dev, strict=True) as mode:
        tenth = x.index_fill(1, index, torch.tensor(0.1))
        inf = x.index_fill(0, index, torch.tensor(float("-inf")))
        y = x.clone().index_fill_(1, index, 0.1)
    assert {route for _, route in mode.routes} <= {"device", "exact"}
    assert tenth[:, [0, 2]].flatten().tolist() == [float(torch.tensor(0.1).to(dtype))] * 6
    assert torch.equal(tenth[:, [1, 3]], x[:, [1, 3]]) and torch.equal(y, tenth)
    assert inf[[0, 2]].isneginf().all() and torch.equal(inf[1], x[1])
    assert not dev.get_float_status().any()
    if dtype == torch.float16:
        with DeviceMode(dev), pytest.raises(RuntimeError, match="overflow"):
            x.index_fill(0, index, torch.tensor(1e9))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_angle_selects_pi_rounded_on_the_device_zero_or_the_nan_itself(dtype) -> None:
    """angle of a real tensor: pi in the dtype (one rounding) where negative, +0 where not (-0
    included), the operand's own NaN (payload and sign) where NaN; every binary16 or bfloat16
    value against torch's native kernel, bit for bit (its NaNs excepted: its vectorised loop gives
    the default NaN, its scalar loop the operand, so a tensor's length decides); the gradient is
    zero; the register stays clear."""
    x = torch.arange(2**16, dtype=torch.int32).to(torch.int16).view(dtype)
    dev = Device("atlas-training")
    with DeviceMode(dev, strict=True) as mode:
        got = torch.angle(x)
    assert mode.routes["aten.angle.default", "device"] == 1
    number = ~x.isnan()
    assert torch.equal(got.view(torch.int16)[number], torch.angle(x).view(torch.int16)[number])
    assert got.view(torch.int16)[x.isnan()].tolist() == x.view(torch.int16)[x.isnan()].tolist()
    assert got[x < 0].unique().tolist() == [float(torch.tensor(math.pi).to(dtype))]
    assert (got[x == 0].view(torch.int16) == 0).all()
    w = x[:8].clone().requires_grad_()
    with DeviceMode(dev, strict=True):
        torch.angle(w).sum().backward()
    assert (w.grad == 0).all() and not dev.get_float_status().any()


def test_baddbmm_is_the_cube_binary32_sum_then_alpha_and_beta_then_one_rounding() -> None:
    """baddbmm against a loop: products exact, summed in order in binary32, times alpha, plus beta
    times the bias (binary32), rounded once to binary16; an overflow of that rounding reaches the
    register (saturating on atlas-training, Inf on atlas-a2)."""
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((2, 3, 5)).astype(H), rng.standard_normal((2, 5, 4)).astype(H)
    bias = rng.standard_normal((2, 3, 4)).astype(H)
    alpha, beta = 0.3535, 0.5
    want = np.empty((2, 3, 4), H)
    for n in range(2):
        for i in range(3):
            for j in range(4):
                s = F32(0)
                for k in range(5):
                    s = F32(s + F32(a[n, i, k]) * F32(b[n, k, j]))
                want[n, i, j] = H(F32(F32(alpha) * s) + F32(F32(beta) * F32(bias[n, i, j])))
    out, routes, register = routed(lambda: torch.baddbmm(t(bias), t(a), t(b), beta=beta, alpha=alpha))
    assert routes == {"device"} and bits(out) == bits(want) and not register.any()
    big = lambda: torch.baddbmm(t(bias), t(a), t(b), alpha=40000.0)  # noqa: E731
    out, _, register = routed(big, "atlas-training")
    assert register[0] == 1 and torch.isfinite(out).all() and out.abs().max().item() == MAX
    out, _, register = routed(big, "atlas-a2")
    assert register[0] == 1 and torch.isinf(out).any()


def test_pow_0_and_1_are_exact_so_a_square_trains_under_strict() -> None:
    """x ** 2's backward makes x ** 1 (grad * 2 * x ** 1): exact, as is x ** 0."""
    x = t(np.array([1.5, -0.0, np.nan, 65504.0], H))
    with DeviceMode(Device("atlas-a2"), strict=True) as mode:
        one, zero = x ** 1, x ** 0
        y = t(np.array([3.0, -2.0], H)).requires_grad_(True)
        (y ** 2).sum().backward()
    assert bits(one) == bits(x) and zero.tolist() == [1.0] * 4 and y.grad.tolist() == [6.0, -4.0]
    assert mode.routes["aten.pow.Tensor_Scalar", "exact"] == 3


@pytest.mark.parametrize("profile", ["atlas-training", "atlas-a2"])
def test_nan_to_num_replaces_in_the_dtype_and_reports_no_overflow(profile: str) -> None:
    """nan_to_num's defaults are the dtype's own largest values: no event (binary32's largest values,
    rounded back, would report an overflow that never happened); a replacement the dtype cannot hold
    is rounded on the device, and one it overflows is an overflow of that conversion."""
    x = t(np.array([np.nan, np.inf, -np.inf, 1.0, -0.0], H))
    out, routes, register = routed(lambda: torch.nan_to_num(x), profile)
    assert routes == {"device"} and not register.any()
    assert bits(out) == bits(np.array([0.0, MAX, -MAX, 1.0, -0.0], H))
    out, _, register = routed(lambda: torch.nan_to_num(x, nan=0.1, posinf=1000.3), profile)
    assert bits(out) == bits(np.array([0.1, 1000.3, -MAX, 1.0, -0.0], H)) and not register.any()
    out, _, register = routed(lambda: torch.nan_to_num(x, posinf=1e6), profile)
    assert register[0] == 1 and out[1].item() == (MAX if profile == "atlas-training" else np.inf)


@pytest.mark.parametrize("profile", ["atlas-training", "atlas-a2"])
def test_where_converts_an_operand_of_another_dtype_on_the_device(profile: str) -> None:
    """A binary32 mask value (its lowest, as mixed-precision code writes it) selected into binary16:
    converted on the device first, so it saturates to -65504 in saturation mode (-Inf otherwise) and its
    overflow reaches the register; a value binary16 holds raises nothing; same-dtype operands are exact."""
    x = t(np.array([1.0, -2.5, 3.0, 0.25], H))
    mask = torch.tensor([True, False, True, False])
    lowest = torch.tensor(torch.finfo(torch.float32).min)
    out, routes, register = routed(lambda: torch.where(mask, x, lowest), profile)
    low = -MAX if profile == "atlas-training" else -np.inf
    assert routes == {"device"} and register[0] == 1
    assert bits(out) == bits(np.array([1.0, low, 3.0, low], H))
    out, _, register = routed(lambda: torch.where(mask, torch.tensor(0.5), x), profile)
    assert bits(out) == bits(np.array([0.5, -2.5, 0.5, 0.25], H)) and not register.any()
    dev = Device(profile)
    with DeviceMode(dev, strict=True) as mode:
        torch.where(mask, x, x.flip(0))
    assert mode.routes["aten.where.self", "exact"] == 1 and {r for _, r in mode.routes} == {"exact"}


@pytest.mark.parametrize("profile", ["atlas-training", "atlas-a2"])
def test_integers_and_float64_convert_into_binary16_on_the_device(profile: str) -> None:
    """.to(float16) of an integer or float64 tensor is the device's cast from binary64: values beyond
    binary16's range saturate (or are Inf) and set the register; a bool mask's 0 and 1 raise nothing."""
    big = 65504.0 if profile == "atlas-training" else np.inf
    for source in (torch.tensor([1, 70000, -100000, 3]), torch.tensor([1.0, 70000.0, -1e5, 3.0], dtype=torch.float64)):
        out, routes, register = routed(lambda s=source: s.to(torch.float16), profile)
        assert routes == {"device"} and register[0] == 1
        assert bits(out) == bits(np.array([1.0, big, -big, 3.0], H))
    zeros = torch.zeros(2, dtype=torch.float16)
    out, routes, register = routed(lambda: zeros.copy_(torch.tensor([70000, 2])), profile)
    assert routes == {"device"} and register[0] == 1 and bits(out) == bits(np.array([big, 2.0], H))
    out, routes, register = routed(lambda: torch.tensor([True, False]).to(torch.float16), profile)
    assert out.tolist() == [1.0, 0.0] and not register.any()
    out, _, register = routed(lambda: torch.tensor([0.1], dtype=torch.float64).to(torch.float16), profile)
    assert bits(out) == bits(np.array([0.1], H)) and not register.any()
    for meta in (torch.zeros(3, dtype=torch.int64, device="meta"), torch.zeros(3, device="meta")):  # no values
        out, routes, _ = routed(lambda m=meta: m.to(torch.float16), profile)
        assert out.is_meta and out.dtype == torch.float16 and routes == set()


@pytest.mark.parametrize("profile", ["atlas-a2", "atlas-training"])
def test_a_value_the_dtype_holds_is_written_as_it_is_by_every_selection(profile: str) -> None:
    """where, masked_fill and nan_to_num follow one rule: -inf is a binary16 value, so each writes
    -inf in either overflow mode, with no register event; binary32's lowest is not, so each rounds it
    on the device (-inf, or -65504 with OVERFLOW in saturation mode)."""
    x, m = t(np.array([1.0, 2.0], H)), torch.tensor([True, False])
    for value in (-np.inf, float(np.finfo(F32).min)):
        dev = Device(profile)
        with DeviceMode(dev):
            got = [torch.where(m, torch.tensor(value), x), torch.where(m, value, x),
                   t(np.array([-np.inf, 2.0], H)).nan_to_num(neginf=value)]
            held = np.isinf(value)
            if held:
                got.append(x.masked_fill(m, value))
            else:  # torch refuses it natively, before any conversion; so does the mode
                with pytest.raises(RuntimeError, match="without overflow"):
                    x.masked_fill(m, value)
        want = -np.inf if held or profile == "atlas-a2" else -MAX
        for g in got:
            assert g.dtype == torch.float16 and bits(g) == bits(np.array([want, 2.0], H)), (value, g)
        assert dev.get_float_status()[0] == (0 if held else 1), value


@pytest.mark.parametrize("profile", ["atlas-a2", "atlas-training"])
def test_an_intermediate_binary32_overflow_that_reaches_the_output_is_reported(profile: str) -> None:
    """prod in index order: ten 10000s overflow binary32 at the tenth (1e40), so the output is Inf
    (65504 in saturation mode) though the exact product of ten 1e4 and ten 1e-4 (as binary16) is
    finite; the model keeps binary32 inside and reports the overflow that reaches the output."""
    values = np.array([1e4] * 10 + [1e-4] * 10, H)
    exact = np.prod(values.astype(np.float64))  # 1.0017...: no binary16 overflow
    assert 1 < exact < 1.01
    dev = Device(profile)
    with DeviceMode(dev):
        got = torch.prod(t(values))
    assert got.shape == () and bits(got) == bits(np.array(np.inf if profile == "atlas-a2" else MAX, H))
    assert dev.get_float_status()[0] == 1


@pytest.mark.parametrize("profile", ["atlas-a2", "atlas-training"])
def test_addcmul_decides_overflow_on_its_binary32_result(profile: str) -> None:
    """Double rounding at the threshold, as documented: 65504 + (1 + 2**-10)(16 - 2**-6) is exactly
    65520 - 2**-16, which rounds to 65504 in one step but to 65520 in binary32 first, and 65520
    overflows binary16 under nearest-even."""
    from fractions import Fraction

    a, b, c = 65504.0, 1 + 2.0**-10, 16 - 2.0**-6
    exact = Fraction(a) + Fraction(b) * Fraction(c)
    assert exact == 65520 - Fraction(1, 2**16)
    assert float(np.float32(float(exact))) == 65520.0  # binary64 holds it exactly; one rounding to binary32
    dev = Device(profile)
    with DeviceMode(dev):
        got = torch.addcmul(t(np.array([a], H)), t(np.array([b], H)), t(np.array([c], H)))
    assert bits(got) == bits(np.array([np.inf if profile == "atlas-a2" else MAX], H))
    assert dev.get_float_status()[0] == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nextafter_steps_to_the_neighbour_in_the_operands_own_format(dtype) -> None:
    """nextafter is a bit operation on the stored format (exact route); in binary32 it would round
    back to the operand. Neighbours worked by hand from the formats' precision (11 and 8 bits)."""
    eps = 2.0**-10 if dtype == torch.float16 else 2.0**-7
    tiny = 2.0**-24 if dtype == torch.float16 else 2.0**-133
    big = 65504.0 if dtype == torch.float16 else float(torch.finfo(torch.bfloat16).max)
    x = torch.tensor([1.0, 1.0, 0.0, big, -0.0], dtype=dtype)
    to = torch.tensor([2.0, 0.0, 1.0, np.inf, -1.0], dtype=dtype)
    dev = Device("atlas-training")
    with DeviceMode(dev, strict=True) as mode:
        got = [torch.nextafter(x, to), x.clone().nextafter_(to)]
    want = torch.tensor([1 + eps, 1 - eps / 2, tiny, np.inf, -tiny], dtype=dtype)
    for g in got:
        assert g.view(torch.int16).tolist() == want.view(torch.int16).tolist()
    assert {route for _, route in mode.routes} == {"exact"}



@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_uniform_draws_stay_below_their_upper_bound(dtype) -> None:
    """rand and uniform_ are binary64 uniform draws from torch's generator rounded toward -inf into
    the dtype, so every draw lies in [from, to), as native torch's do (rounded to nearest, a draw
    just below 1 became 1.0, about one float16 draw in 4096). Expected: the same binary64 draws,
    floored into the dtype with numpy and ml_dtypes."""
    import ml_dtypes

    np_dtype = H if dtype == torch.float16 else ml_dtypes.bfloat16

    def floor_into(u: np.ndarray) -> np.ndarray:
        f = u.astype(np_dtype)  # to nearest; then one step down where that went up
        up = f.astype(np.float64) > u
        f[up] = np.nextafter(f[up], np_dtype(-np.inf))
        return f

    n = 1 << 16
    torch.manual_seed(3)
    u = torch.empty(n, dtype=torch.float64).uniform_(0, 1).numpy()
    v = torch.empty(n, dtype=torch.float64).uniform_(0, 1).numpy()
    torch.manual_seed(3)
    with DeviceMode(Device("atlas-a2"), strict=True):
        r = torch.rand(n, dtype=dtype)
        w = torch.empty(n, dtype=dtype).uniform_(-2, 1)
    assert r.dtype == w.dtype == dtype
    assert float(r.max()) < 1 and -2 <= float(w.min()) and float(w.max()) < 1
    assert r.view(torch.int16).tolist() == floor_into(u).view(np.int16).tolist()
    assert w.view(torch.int16).tolist() == floor_into(-2 + 3 * v).view(np.int16).tolist()


# --- the probe of common functions (issue 33, item 4) ----------------------------------------------
Fn = torch.nn.functional


def _probe(shape, dtype, grad=True, seed=0, positive=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g) * 1.5 + 0.25 if positive else torch.randn(shape, generator=g)
    return x.to(dtype).requires_grad_(grad)


#: Common functions of torch, torch.nn.functional and torch.linalg, each given its operands' dtype.
PROBE = {
    "weight_norm": lambda d: torch._weight_norm(_probe((4, 3), d), _probe((4, 1), d, seed=1), 0),
    "pow tensor exponent": lambda d: _probe(5, d, positive=True) ** _probe(5, d, seed=1),
    "pow 0.75": lambda d: _probe(5, d, positive=True) ** 0.75,
    "scalar ** tensor": lambda d: 2.0 ** _probe(5, d),
    "fold": lambda d: Fn.fold(_probe((1, 4, 9), d), (4, 4), 2),
    "unfold": lambda d: Fn.unfold(_probe((1, 1, 4, 4), d), 2),
    "Tensor.unfold": lambda d: _probe(10, d).unfold(0, 3, 2),
    "fmod and remainder": lambda d: torch.fmod(_probe(5, d), 1.5) + torch.remainder(_probe(5, d), _probe(5, d, seed=1)),
    "xlogy": lambda d: torch.xlogy(_probe(5, d, positive=True), _probe(5, d, seed=1, positive=True)),
    "kl_div": lambda d: Fn.kl_div(_probe(5, d), _probe(5, d, seed=1).softmax(0)),
    "logaddexp": lambda d: torch.logaddexp(_probe(5, d), _probe(5, d, seed=1)),
    "hypot": lambda d: torch.hypot(_probe(5, d), _probe(5, d, seed=1)),
    "sinc": lambda d: torch.sinc(_probe(5, d)),
    "logit": lambda d: torch.logit(_probe(5, d).sigmoid()),
    "median and cummax": lambda d: torch.median(_probe(5, d)) + torch.cummax(_probe(5, d), 0)[0],
    "copysign and heaviside": lambda d: torch.copysign(_probe(5, d), _probe(5, d, seed=1)) + torch.heaviside(
        _probe(5, d, grad=False), _probe(5, d, grad=False)),
    "dot, mv, addmv, addr, vdot": lambda d: torch.addmv(_probe(3, d), _probe((3, 4), d), _probe(4, d)).sum()
    + torch.mv(_probe((3, 4), d), _probe(4, d)).sum() + torch.addr(_probe((3, 4), d), _probe(3, d), _probe(4, d)).sum()
    + torch.dot(_probe(4, d), _probe(4, d, seed=1)) + torch.vdot(_probe(4, d), _probe(4, d, seed=2)),
    "cross": lambda d: torch.linalg.cross(_probe((2, 3), d), _probe((2, 3), d, seed=1)),
    "dist and nansum": lambda d: torch.dist(_probe(5, d), _probe(5, d, seed=1)) + torch.nansum(_probe(5, d)),
    "diag_embed": lambda d: torch.diag_embed(_probe(3, d)),
    "deg2rad and floor_divide": lambda d: torch.deg2rad(_probe(5, d)) + torch.floor_divide(
        _probe(5, d, grad=False), 0.7),
    "rrelu": lambda d: Fn.rrelu(_probe(5, d), training=True),
    "max_unpool2d": lambda d: Fn.max_unpool2d(*Fn.max_pool2d(_probe((1, 1, 4, 4), d), 2, return_indices=True), 2),
    "reflection and replication padding": lambda d: Fn.pad(_probe((1, 1, 4, 4), d), (1, 1, 1, 1), mode="reflect") + (
        Fn.pad(_probe((1, 1, 4, 4), d), (1, 1, 1, 1), mode="replicate")),
    "channel_shuffle": lambda d: Fn.channel_shuffle(_probe((1, 4, 2, 2), d), 2),
    "sgn": lambda d: torch.sgn(_probe(5, d)),
    "einsum, tensordot, matrix_power": lambda d: torch.einsum("ij,jk->ik", _probe((3, 4), d), _probe((4, 2), d)).sum(
    ) + torch.tensordot(_probe((3, 4), d), _probe((4, 2), d), 1).sum() + torch.linalg.matrix_power(
        _probe((3, 3), d), 2).sum(),
    "convolutions": lambda d: Fn.conv_transpose1d(_probe((1, 2, 5), d), _probe((2, 3, 3), d)).sum() + Fn.conv3d(
        _probe((1, 2, 4, 4, 4), d), _probe((3, 2, 2, 2, 2), d)).sum(),
    "losses": lambda d: Fn.mse_loss(_probe(5, d), _probe(5, d, seed=1)) + Fn.l1_loss(_probe(5, d), _probe(5, d))
    + Fn.huber_loss(_probe(5, d), _probe(5, d, seed=2)) + Fn.binary_cross_entropy_with_logits(
        _probe(5, d), _probe(5, d, grad=False).sigmoid()),
    "activations": lambda d: Fn.elu(_probe(5, d)) + Fn.selu(_probe(5, d)) + Fn.mish(_probe(5, d)) + Fn.softplus(
        _probe(5, d)) + Fn.logsigmoid(_probe(5, d)) + Fn.hardtanh(_probe(5, d)) + Fn.softsign(_probe(5, d)),
    "normalisations": lambda d: Fn.normalize(_probe((3, 4), d)).sum() + Fn.instance_norm(_probe((2, 3, 4), d)).sum()
    + Fn.local_response_norm(_probe((1, 4, 3, 3), d), 2).sum() + torch.linalg.vector_norm(_probe((3, 4), d), 3),
    "scans and sorts": lambda d: torch.cumsum(_probe(5, d), 0) + torch.cumprod(_probe(5, d), 0) + torch.sort(
        _probe(5, d))[0] + torch.diff(_probe(6, d)),
    "angle": lambda d: torch.angle(_probe(5, d)),
    "grid_sample": lambda d: Fn.grid_sample(_probe((1, 1, 4, 4), d), _probe((1, 2, 2, 2), d).tanh(),
                                           align_corners=False),
    "affine_grid": lambda d: Fn.affine_grid(_probe((1, 2, 3), d), (1, 1, 4, 4), align_corners=False),
    "cdist": lambda d: torch.cdist(_probe((3, 4), d), _probe((5, 4), d)),
    "pdist": lambda d: Fn.pdist(_probe((4, 3), d)),
    "embedding_bag": lambda d: Fn.embedding_bag(torch.tensor([1, 2, 4, 5]), _probe((10, 3), d), torch.tensor([0, 2])),
    "bilinear": lambda d: Fn.bilinear(_probe((2, 3), d), _probe((2, 4), d), _probe((5, 3, 4), d), _probe(5, d)),
    "embedding max_norm": lambda d: Fn.embedding(torch.tensor([1, 2]), _probe((5, 3), d, grad=False), max_norm=1.0),
    "logcumsumexp": lambda d: torch.logcumsumexp(_probe(5, d), 0),
    "ctc_loss": lambda d: Fn.ctc_loss(_probe((6, 2, 5), d).log_softmax(2), torch.tensor([[1, 2], [3, 4]]),
                                      torch.tensor([6, 6]), torch.tensor([2, 2])),
    "multi_margin_loss": lambda d: Fn.multi_margin_loss(_probe((3, 4), d), torch.tensor([0, 1, 2])),
    "trace and renorm": lambda d: torch.trace(_probe((4, 4), d)) + torch.renorm(_probe((3, 4), d), 2, 0, 1.0).sum(),
    "interpolation": lambda d: Fn.interpolate(_probe((1, 1, 4, 4), d), scale_factor=2, mode="bicubic").sum()
    + Fn.interpolate(_probe((1, 1, 2, 2, 2), d), scale_factor=2, mode="trilinear").sum(),
}
#: The functions still without a device, exact or fused route (strict refuses them; without strict
#: they take the float32 route): what is left of the probe.
STILL_FLOAT32: dict = {}


def _forward_backward(fn, dtype):
    """fn on ``dtype`` under a strict mode (float16 on atlas-training, bfloat16 on atlas-a2, whose
    cube takes it), forward and backward."""
    with DeviceMode(Device("atlas-training" if dtype == torch.float16 else "atlas-a2"), strict=True):
        y = fn(dtype)
        y = y if isinstance(y, torch.Tensor) else y[0]
        if y.requires_grad:
            y.float().sum().backward()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_strict_refuses_none_of_the_probes_common_functions(dtype) -> None:
    """Each common function, forward and backward, takes a device, exact or fused route: strict
    accepts it; and the functions still left to the float32 route are exactly those listed."""
    refused = []
    for name, fn in {**PROBE, **STILL_FLOAT32}.items():
        try:
            _forward_backward(fn, dtype)
        except NotImplementedError:
            refused.append(name)
    assert refused == list(STILL_FLOAT32)
