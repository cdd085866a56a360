"""Convolutions on the device (forward, transposed, both gradients; 1-d to 3-d, grouped, strided,
dilated, padded), bfloat16 matmuls and convolutions, and a matmul's bias, each against a plain loop
reference in the documented order and a float64 bound; then the same through DeviceMode."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from sim import Device

H, F32, BF = np.float16, np.float32, np.dtype(ml_dtypes.bfloat16)


def round32(acc: np.float32, p: float) -> np.float32:
    """acc + p (p an exact product) rounded once to binary32, to nearest even (exactly, in fractions)."""
    exact = Fraction(float(acc)) + Fraction(p)
    r = np.float32(float(exact))  # within an ulp: the answer is r or a neighbour
    near = [np.nextafter(r, np.float32(-np.inf)), r, np.nextafter(r, np.float32(np.inf))]
    key = lambda v: (abs(Fraction(float(v)) - exact), int(np.array(v).view(np.uint32)) & 1)  # noqa: E731
    return min((v for v in near if np.isfinite(v)), key=key)


def loop_sum(pairs, start: float = 0.0) -> np.float32:
    """The documented accumulation: from ``start``, each exact product added in order, rounded to binary32."""
    acc = np.float32(start)
    for a, b in pairs:
        acc = round32(acc, float(a) * float(b))
    return acc


def taps(shape):
    return itertools.product(*(range(k) for k in shape))


def ref_conv(x, w, stride, padding, dilation, groups):
    """Loop reference of Device.conv: per output, (c, kernel taps row-major), padded positions +0."""
    n, c = x.shape[:2]
    o, cg, *k = w.shape
    og = o // groups
    out_shape = [(s + 2 * p - d * (kk - 1) - 1) // st + 1
                 for s, p, d, kk, st in zip(x.shape[2:], padding, dilation, k, stride, strict=True)]
    y = np.zeros((n, o, *out_shape), F32)
    for b, oo in itertools.product(range(n), range(o)):
        grp = oo // og
        for pos in taps(out_shape):
            pairs = []
            for ci in range(cg):
                for t in taps(k):
                    q = [pp * st + tt * d - p
                         for pp, st, tt, d, p in zip(pos, stride, t, dilation, padding, strict=True)]
                    inside = all(0 <= qq < s for qq, s in zip(q, x.shape[2:], strict=True))
                    pairs.append((x[(b, grp * cg + ci, *q)] if inside else 0.0, w[(oo, ci, *t)]))
            y[(b, oo, *pos)] = loop_sum(pairs)
    return y


def ref_grad_input(dy, w, size, stride, padding, dilation, groups):
    """Loop reference of Device.conv_grad_input: per input element, (o, taps in ascending dy position)."""
    n, o = dy.shape[:2]
    _, cg, *k = w.shape
    og = o // groups
    gx = np.zeros((n, cg * groups, *size), F32)
    for b, c in itertools.product(range(n), range(cg * groups)):
        grp, ci = divmod(c, cg)
        for q in taps(size):
            pairs = []
            for oi in range(og):
                for t in taps(k):  # tap t of the reversed kernel: the original tap K - 1 - t
                    orig = [kk - 1 - tt for kk, tt in zip(k, t, strict=True)]
                    num = [qq + p - ok * d for qq, p, ok, d in zip(q, padding, orig, dilation, strict=True)]
                    pos = [u // st for u, st in zip(num, stride, strict=True)]
                    ok = all(u % st == 0 and 0 <= pp < s
                             for u, st, pp, s in zip(num, stride, pos, dy.shape[2:], strict=True))
                    pairs.append((dy[(b, grp * og + oi, *pos)] if ok else 0.0, w[(grp * og + oi, ci, *orig)]))
            gx[(b, c, *q)] = loop_sum(pairs)
    return gx


def ref_grad_weight(x, dy, k, stride, padding, dilation, groups):
    """Loop reference of Device.conv_grad_weight: per weight, (n, output position row-major)."""
    n, c = x.shape[:2]
    o = dy.shape[1]
    cg, og = c // groups, o // groups
    gw = np.zeros((o, cg, *k), F32)
    for oo, ci in itertools.product(range(o), range(cg)):
        grp = oo // og
        for t in taps(k):
            pairs = []
            for b in range(n):
                for pos in taps(dy.shape[2:]):
                    q = [pp * st + tt * d - p
                         for pp, st, tt, d, p in zip(pos, stride, t, dilation, padding, strict=True)]
                    inside = all(0 <= qq < s for qq, s in zip(q, x.shape[2:], strict=True))
                    pairs.append((dy[(b, oo, *pos)], x[(b, grp * cg + ci, *q)] if inside else 0.0))
            gw[(oo, ci, *t)] = loop_sum(pairs)
    return gw


#: (dims, N, C, O, spatial, kernel, stride, padding, dilation, groups)
CASES = {
    "1d": (1, 2, 3, 4, 7, 3, 1, 1, 1, 1),
    "1d-strided-dilated": (1, 2, 2, 3, 9, 3, 2, 2, 2, 1),
    "2d": (2, 2, 3, 2, 5, 3, 1, 1, 1, 1),
    "2d-strided-padded": (2, 1, 2, 3, 6, 3, 2, 2, 1, 1),
    "2d-dilated": (2, 1, 2, 2, 6, 2, 1, 0, 2, 1),
    "2d-grouped": (2, 1, 4, 6, 4, 3, 1, 1, 1, 2),
    "2d-depthwise": (2, 2, 3, 3, 5, 3, 2, 1, 1, 3),
    "3d": (3, 1, 2, 2, 4, 2, 1, 1, 1, 1),
    "3d-grouped-strided": (3, 1, 2, 2, 5, 3, 2, 1, 1, 2),
    "1d-pointwise": (1, 2, 5, 3, 6, 1, 1, 0, 1, 1),
    "2d-pointwise": (2, 3, 4, 5, 3, 1, 1, 0, 1, 1),
    "2d-pointwise-wide": (2, 2, 3, 12, 3, 1, 1, 0, 1, 1),
    "2d-pointwise-strided": (2, 2, 3, 2, 5, 1, 2, 0, 1, 1),
    # fewer positions (N * OS) than outputs per group: the columns with the positions first
    "2d-few-positions": (2, 1, 2, 8, 3, 3, 2, 1, 1, 1),
    "2d-many-channels": (2, 1, 8, 2, 2, 2, 1, 0, 1, 1),  # and the input gradient's, too
    "2d-expanding-strided": (2, 1, 2, 8, 3, 1, 2, 0, 1, 1),
}


def make(case: str, dtype=H, seed: int = 0):
    d, n, c, o, s, k, st, p, dl, g = CASES[case]
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c, *(s,) * d)) * 4).astype(dtype)
    w = rng.standard_normal((o, c // g, *(k,) * d)).astype(dtype)
    out = [(s + 2 * p - dl * (k - 1) - 1) // st + 1] * d
    dy = rng.standard_normal((n, o, *out)).astype(dtype)
    return x, w, dy, dict(stride=(st,) * d, padding=(p,) * d, dilation=(dl,) * d, groups=g)


def bits(a) -> list[int]:
    a = np.asarray(a)
    return a.view(np.uint32 if a.dtype == F32 else np.uint16).ravel().tolist()


def within_bound(got32, want64, abs64, terms: int) -> None:
    u = 2.0 ** -24
    gamma = terms * u / (1 - terms * u)
    assert np.all(np.abs(got32.astype(np.float64) - want64) <= gamma * abs64 + 1e-300)


def torch_f64(case: str, x, w, dy, kw):
    torch = pytest.importorskip("torch")
    F = (None, torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d)[x.ndim - 2]
    t = lambda a: torch.from_numpy(np.asarray(a, np.float64)).requires_grad_()  # noqa: E731
    xt, wt = t(x), t(w)
    y = F(xt, wt, **kw)
    gx, gw = torch.autograd.grad(y, (xt, wt), torch.from_numpy(dy.astype(np.float64)))
    xa, wa = t(np.abs(x.astype(np.float64))), t(np.abs(w.astype(np.float64)))
    ya = F(xa, wa, **kw)
    gxa, gwa = torch.autograd.grad(ya, (xa, wa), torch.from_numpy(np.abs(dy.astype(np.float64))))
    return [v.detach().numpy() for v in (y, ya, gx, gxa, gw, gwa)]


@pytest.mark.parametrize("case", list(CASES))
def test_conv_forward_and_gradients_are_the_loop_reference_and_within_the_binary32_bound(case: str) -> None:
    x, w, dy, kw = make(case)
    dev = Device("atlas-a2")
    size = x.shape[2:]
    fwd = dev.conv(x, w, out_dtype=F32, **kw)
    gx = dev.conv_grad_input(dy, w, size, out_dtype=F32, **kw)
    gw = dev.conv_grad_weight(x, dy, w.shape[2:], out_dtype=F32, **kw)
    args = kw["stride"], kw["padding"], kw["dilation"], kw["groups"]
    assert bits(fwd) == bits(ref_conv(x, w, *args))
    assert bits(gx) == bits(ref_grad_input(dy, w, size, *args))
    assert bits(gw) == bits(ref_grad_weight(x, dy, w.shape[2:], *args))
    # the binary16 results are those sums rounded once
    assert bits(dev.conv(x, w, **kw)) == bits(fwd.astype(H))
    assert bits(dev.conv_grad_input(dy, w, size, **kw)) == bits(gx.astype(H))
    assert bits(dev.conv_grad_weight(x, dy, w.shape[2:], **kw)) == bits(gw.astype(H))
    y, ya, gx64, gxa, gw64, gwa = torch_f64(case, x, w, dy, kw)
    g, k = kw["groups"], math.prod(w.shape[2:])
    within_bound(fwd, y, ya, w.shape[1] * k)
    within_bound(gx, gx64, gxa, (w.shape[0] // g) * k)
    within_bound(gw, gw64, gwa, dy.shape[0] * math.prod(dy.shape[2:]))


@pytest.mark.parametrize("case", ["1d-strided-dilated", "2d-grouped", "3d"])
def test_transposed_conv_is_the_input_gradient_and_matches_float64(case: str) -> None:
    torch = pytest.importorskip("torch")
    x, w, _, kw = make(case)
    dev = Device("atlas-a2")
    st, p, dl, g = kw["stride"], kw["padding"], kw["dilation"], kw["groups"]
    op = tuple(s - 1 for s in st)
    wt = np.random.default_rng(1).standard_normal((x.shape[1], 2, *w.shape[2:])).astype(H)  # (Cin, Cout/g, *K)
    out = dev.conv_transpose(x, wt, st, p, op, dl, g, out_dtype=F32)
    size = out.shape[2:]
    assert bits(out) == bits(ref_grad_input(x, wt, size, st, p, dl, g))
    T = (None, torch.nn.functional.conv_transpose1d, torch.nn.functional.conv_transpose2d,
         torch.nn.functional.conv_transpose3d)[x.ndim - 2]
    f64 = lambda a: torch.from_numpy(np.abs(a).astype(np.float64))  # noqa: E731
    want = T(torch.from_numpy(x.astype(np.float64)), torch.from_numpy(wt.astype(np.float64)), stride=st, padding=p,
             output_padding=op, dilation=dl, groups=g).numpy()
    mag = T(f64(x), f64(wt), stride=st, padding=p, output_padding=op, dilation=dl, groups=g).numpy()
    within_bound(out, want, mag, x.shape[1] // g * math.prod(wt.shape[2:]))


def test_conv2d_is_conv_in_two_dimensions() -> None:
    x, w, _, _ = make("2d-strided-padded")
    a, b = Device("atlas-a2"), Device("atlas-a2")
    assert bits(a.conv2d(x, w, stride=2, padding=2)) == bits(b.conv(x, w, stride=2, padding=2))


def test_bfloat16_matmul_and_conv_are_the_loop_reference_on_a_bfloat16_cube() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((5, 9)).astype(BF), rng.standard_normal((9, 4)).astype(BF)
    a[0, 0], b[0, 0] = BF.type(2.0 ** 60), BF.type(2.0 ** 30)  # a product beyond binary16, exact in binary32
    dev = Device("atlas-a3")
    got = dev.matmul(a, b, out_dtype=F32)
    want = np.array([[loop_sum(zip(a[i], b[:, j], strict=True)) for j in range(4)] for i in range(5)], F32)
    assert bits(got) == bits(want)
    low = dev.matmul(a, b)
    assert low.dtype == BF and bits(low) == bits(want.astype(BF))
    x, w, _, kw = make("2d-grouped", BF)
    y = dev.conv(x, w, out_dtype=F32, **kw)
    assert bits(y) == bits(ref_conv(x, w, kw["stride"], kw["padding"], kw["dilation"], kw["groups"]))
    assert not dev.get_float_status().any()


def test_bfloat16_sum_overflowing_binary32_raises_overflow() -> None:
    big = np.full((1, 2), 2.0 ** 127, BF)
    dev = Device("atlas-350")
    out = dev.matmul(big, np.full((2, 1), 2.0, BF), out_dtype=F32)
    assert np.isinf(out[0, 0]) and dev.get_float_status()[0] == 1


@pytest.mark.parametrize("profile", ["atlas-training", "atlas-inference", "atlas-200i-500-a2"])
def test_a_cube_without_bfloat16_refuses_it(profile: str) -> None:
    a = np.ones((2, 2), BF)
    with pytest.raises(TypeError, match="not bfloat16"):
        Device(profile).matmul(a, a)
    with pytest.raises(TypeError, match="not bfloat16"):
        Device(profile).conv(np.ones((1, 1, 3), BF), np.ones((1, 1, 2), BF))


def test_a_fused_bias_starts_the_binary32_sum_and_after_is_a_second_rounding() -> None:
    # 1 + 2**-11 is not binary16; 2**-11 + 2**-11 ... : bias 1, products summing to 2**-11 + 2**-12
    a = np.array([[2.0 ** -11, 2.0 ** -12]], H)
    b = np.ones((2, 1), H)
    bias = np.array([1.0], H)
    fused = Device("atlas-a2", matmul_bias="fused").matmul(a, b, bias=bias)
    after = Device("atlas-a2").matmul(a, b, bias=bias)
    # fused: 1 + 3 * 2**-12 rounded once -> 1 + 2**-10; after: 3 * 2**-12 exact, then 1 + 3 * 2**-12 -> 1 + 2**-10
    assert float(fused[0, 0]) == float(np.float16(1 + 2.0 ** -10))
    assert float(after[0, 0]) == float(np.float16(1 + 2.0 ** -10))
    a = np.array([[1.0, 2.0 ** -11], [1.0, 2.0 ** -11]], H)
    b = np.array([[1.0], [1.0]], H)
    bias = np.array([2.0 ** -11], H)
    # fused: 2**-11 + 1 + 2**-11 in binary32 = 1 + 2**-10, exact in binary16
    assert float(Device("atlas-a2", matmul_bias="fused").matmul(a, b, bias=bias)[0, 0]) == 1 + 2.0 ** -10
    # after: 1 + 2**-11 rounds to 1 (a tie, to even), then 1 + 2**-11 rounds to 1 again
    assert float(Device("atlas-a2").matmul(a, b, bias=bias)[0, 0]) == 1.0
    assert float(Device("atlas-a2").matmul(a, b, bias=bias, fuse_bias=True)[0, 0]) == 1 + 2.0 ** -10
    with pytest.raises(ValueError, match="bias table"):
        Device("atlas-training", matmul_bias="fused")
    with pytest.raises(ValueError, match="bias table"):
        Device("atlas-training").matmul(a, b, bias=bias, fuse_bias=True)


@pytest.mark.parametrize("case", ["1d", "1d-pointwise"])
def test_a_fused_conv_bias_is_the_initial_value_of_the_loop_sum(case: str) -> None:
    x, w, _, kw = make(case)
    bias = np.array([0.5, -1.0, 3.0, 2.0 ** -20], H)[:w.shape[0]]
    got = Device("atlas-a2", matmul_bias="fused").conv(x, w, bias=bias, out_dtype=F32, **kw)
    base = ref_conv(x, w, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    d, (n, o, length) = Device("atlas-a2"), base.shape
    pad = kw["padding"][0]
    for b, oo, i in itertools.product(range(n), range(o), range(length)):
        pairs = [(x[b, c, i + t - pad] if 0 <= i + t - pad < x.shape[2] else 0.0, w[oo, c, t])
                 for c in range(w.shape[1]) for t in range(w.shape[2])]
        assert bits(got[b, oo, i]) == bits(loop_sum(pairs, float(bias[oo])))
    after = d.conv(x, w, bias=bias.astype(F32), out_dtype=F32, **kw)
    assert bits(after) == bits(d.add(base, bias.astype(F32)[:, None]))


# -- the torch routes ------------------------------------------------------------------------
TORCH_CASES = [(c, False) for c in CASES] + [("1d-strided-dilated", True), ("2d-grouped", True),
                                             ("2d-depthwise", True), ("3d", True)]


@pytest.mark.parametrize("case,transposed", TORCH_CASES, ids=lambda v: str(v))
def test_torch_convolution_forward_and_backward_run_on_the_device(case: str, transposed: bool) -> None:
    torch = pytest.importorskip("torch")
    from sim.torch import DeviceMode
    x, w, _, kw = make(case)
    d = x.ndim - 2
    st, p, dl, g = kw["stride"], kw["padding"], kw["dilation"], kw["groups"]
    if transposed:
        w = np.random.default_rng(2).standard_normal((x.shape[1], 2, *w.shape[2:])).astype(H)
        op = tuple(s - 1 for s in st)
        fn = (None, torch.nn.functional.conv_transpose1d, torch.nn.functional.conv_transpose2d,
              torch.nn.functional.conv_transpose3d)[d]
        call = lambda a, b, bias: fn(a, b, bias, st, p, op, g, dl)  # noqa: E731
    else:
        fn = (None, torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d)[d]
        call = lambda a, b, bias: fn(a, b, bias, st, p, dl, g)  # noqa: E731
    cout = w.shape[1] * g if transposed else w.shape[0]
    bias = np.linspace(-1, 1, cout).astype(H)
    dev, ref = Device("atlas-a2"), Device("atlas-a2")
    xt, wt, bt = (torch.from_numpy(v.copy()).requires_grad_() for v in (x, w, bias))
    with DeviceMode(dev) as mode:
        y = call(xt, wt, bt)
        dy = torch.from_numpy(np.random.default_rng(5).standard_normal(tuple(y.shape)).astype(H))
        y.backward(dy)
    g_out = dy.numpy()
    if transposed:
        want = ref.conv_transpose(x, w, st, p, op, dl, g, bias=bias)
        want_gx = ref.conv(g_out, w, st, p, dl, g)
        want_gw = ref.conv_grad_weight(g_out, x, w.shape[2:], st, p, dl, g)
    else:
        want = ref.conv(x, w, st, p, dl, g, bias=bias)
        want_gx = ref.conv_grad_input(g_out, w, x.shape[2:], st, p, dl, g)
        want_gw = ref.conv_grad_weight(x, g_out, w.shape[2:], st, p, dl, g)
    want_gb = ref.sum(np.moveaxis(g_out, 1, -1).reshape(-1, cout), axis=0, accumulate=F32, out_dtype=H)
    assert bits(y.detach().numpy()) == bits(want)
    assert bits(xt.grad.numpy()) == bits(want_gx) and bits(wt.grad.numpy()) == bits(want_gw)
    assert bits(bt.grad.numpy()) == bits(want_gb)
    assert mode.routes["aten.convolution.default", "device"] == 1
    assert mode.routes["aten.convolution_backward.default", "device"] == 1
    assert not [k for k in mode.routes if k[1] == "float32"], mode.routes


def test_torch_bfloat16_matmul_and_conv_route_to_a_bfloat16_cube_and_fall_back_counted_elsewhere() -> None:
    torch = pytest.importorskip("torch")
    from sim.torch import DeviceMode
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((4, 6)).astype(BF), rng.standard_normal((6, 3)).astype(BF)
    x, w, _, kw = make("2d", BF)
    t = lambda v: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16)  # noqa: E731
    back = lambda v: v.view(torch.int16).numpy().view(BF)  # noqa: E731
    dev, ref = Device("atlas-a2"), Device("atlas-a2")
    with DeviceMode(dev) as mode:
        mm = t(a) @ t(b)
        conv = torch.nn.functional.conv2d(t(x), t(w), padding=1)
    assert bits(back(mm)) == bits(ref.matmul(a, b)) and bits(back(conv)) == bits(ref.conv(x, w, padding=1))
    assert not [k for k in mode.routes if k[1] == "float32"], mode.routes
    with DeviceMode(Device("atlas-training")) as mode:
        t(a) @ t(b)
    assert mode.routes["aten.mm.default", "float32"] == 1
    with pytest.raises(NotImplementedError), DeviceMode(Device("atlas-training"), strict=True):
        t(a) @ t(b)


def test_torch_addmm_places_the_bias_as_the_device_says() -> None:
    torch = pytest.importorskip("torch")
    from sim.torch import DeviceMode
    a = np.array([[1.0, 2.0 ** -11], [1.0, 2.0 ** -11]], H)
    w = np.array([[1.0, 1.0]], H)  # linear's weight (out, in)
    bias = np.array([2.0 ** -11], H)
    got = {}
    for where in ("after", "fused"):
        with DeviceMode(Device("atlas-a2", matmul_bias=where)) as mode:
            got[where] = torch.nn.functional.linear(torch.from_numpy(a), torch.from_numpy(w), torch.from_numpy(bias))
        assert mode.routes["aten.addmm.default", "device"] == 1
    assert got["after"].tolist() == [[1.0], [1.0]] and got["fused"].tolist() == [[1 + 2.0 ** -10]] * 2


@pytest.mark.parametrize("indexed", [0, 1 << 62], ids=["copied", "gathered"])
def test_im2col_is_the_strided_view_of_the_padded_input(monkeypatch, indexed: int) -> None:
    """im2col, in both layouts, copied by the compiled loop or gathered by a kept index, holds the
    columns a strided view of the padded input holds, bit for bit: 1-3 spatial dimensions, groups,
    strides, dilations, padding wider than the kernel's reach (whole runs of +0), and 16-, 32-
    and 64-bit elements (NaN payloads kept)."""
    from sim import conv

    monkeypatch.setattr(conv, "INDEXED", indexed)

    rng = np.random.default_rng(0)
    checked = 0
    for case in range(400):
        d, g, cg = int(rng.integers(1, 4)), int(rng.choice([1, 2, 3])), int(rng.integers(1, 3))
        shape = (int(rng.integers(1, 3)), g * cg, *(int(v) for v in rng.integers(1, 8, d)))
        k, stride, dilation, padding = ([int(v) for v in rng.integers(lo, hi, d)] for lo, hi in
                                        ((1, 4), (1, 4), (1, 3), (0, 4)))
        dtype = (H, BF, F32, np.float64)[case % 4]
        x = rng.integers(0, 256 ** np.dtype(dtype).itemsize, shape, dtype=np.uint64).astype(
            f"u{np.dtype(dtype).itemsize}").view(dtype)
        try:
            out_shape = conv.output_shape(x.shape, k, stride, padding, dilation)
        except ValueError:  # a kernel larger than the padded input
            continue
        want = conv._im2col_view(x, k, stride, padding, dilation, g, out_shape)
        for last in (False, True):
            got, got_shape = conv.im2col(x, k, stride, padding, dilation, g, positions_last=last)
            assert got_shape == out_shape and got.dtype == x.dtype
            u = f"u{x.dtype.itemsize}"
            assert np.array_equal(got.view(u), (want.transpose(0, 2, 1) if last else want).view(u))
        checked += 1
    assert checked > 250
