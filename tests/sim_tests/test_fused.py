"""Fused operation families (sim.fused) under DeviceMode: fused against float64, unfused as device ops."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import sim  # noqa: E402
from sim import fused  # noqa: E402
from sim.torch import DeviceMode  # noqa: E402


def _within_one_rounding(a: torch.Tensor, ref64: torch.Tensor) -> bool:
    """a is the float64 reference rounded once into a's dtype, give or take binary32's error inside:
    |a - ref| at most one ulp of a's dtype (at the reference) plus 2**-18 of the largest |ref|."""
    info = torch.finfo(a.dtype)
    r = ref64.double()
    ulp = 2.0 ** torch.floor(torch.log2(r.abs().clamp(min=info.tiny))) * info.eps
    slack = 2.0 ** -18 * float(r.abs().max()) if r.numel() else 0.0
    return bool(((a.double() - r).abs() <= ulp + slack).all())


def _wide64(x):
    if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16, torch.float32):
        return x.detach().double()
    return torch.float64 if isinstance(x, torch.dtype) and x in (torch.float16, torch.bfloat16) else x


def _check_fused(fn, *xs, monkeypatch):
    """Every fused aten call of fn's forward and backward (and the fused kernels above autograd) gives,
    for each output of our dtype, the same call in float64 on the same operands rounded once."""
    from torch.utils._pytree import tree_map

    calls = []
    real = DeviceMode._float32

    def record(self, func, args, kwargs):
        out = real(self, func, args, kwargs)
        calls.append((func, tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, (args, kwargs)), out))
        return out

    monkeypatch.setattr(DeviceMode, "_float32", record)
    dev = sim.Device("atlas-training")
    ins = [x.clone().requires_grad_(x.is_floating_point()) for x in xs]
    with DeviceMode(dev, strict=True, fused=True) as mode:
        y = fn(*ins)
        g = torch.randn_like(y.float()).to(y.dtype)
        y.backward(g)
    assert {r for _, r in mode.routes} <= {"fused", "exact", "factory", "device"}
    fused_calls = [k for k, r in mode.routes if r == "fused"]
    assert fused_calls
    for func, (args, kwargs), out in calls:
        ref = func(*tree_map(_wide64, args), **tree_map(_wide64, kwargs))
        outs = out if isinstance(out, (tuple, list)) else [out]
        refs = ref if isinstance(ref, (tuple, list)) else [ref]
        if "_ctc_loss" in str(func):  # log_alpha: torch's kernel leaves its unused entries uninitialised, so
            outs, refs = outs[:1], refs[:1]  # the binary64 reference's hold whatever memory held; the loss only
        for o, r in zip(outs, refs, strict=True):
            if isinstance(o, torch.Tensor) and o.dtype in (torch.float16, torch.bfloat16):
                assert _within_one_rounding(o, r), str(func)
    if not calls:  # a fused kernel above autograd: float64 autograd of the same function
        wide = [x.double().requires_grad_(x.is_floating_point()) for x in xs]
        ref = fn(*wide)
        ref.backward(g.double())
        assert _within_one_rounding(y.detach(), ref.detach())
        for x, w in zip(ins, wide, strict=True):
            if x.is_floating_point():
                assert _within_one_rounding(x.grad, w.grad)


torch.manual_seed(0)
X = torch.randn(6, 16).half()
IMG = torch.randn(2, 8, 5, 5).half()


#: The weights of 2-layer nn.LSTM / nn.GRU (4 -> 8), as torch.lstm / torch.gru take them.
RNN_WEIGHTS = {name: [w.detach().half() for w in cls(4, 8, num_layers=2, batch_first=True)._flat_weights]
               for name, cls in (("lstm", nn.LSTM), ("gru", nn.GRU))}


@pytest.mark.parametrize("name,fn,xs", [
    ("gelu", F.gelu, (X,)),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), (X,)),
    ("silu", F.silu, (X,)),
    ("softmax", lambda x: F.softmax(x, -1), (X,)),
    ("log_softmax", lambda x: F.log_softmax(x, -1), (X,)),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (16,), w, b), (X, torch.randn(16).half(), torch.randn(16).half())),
    ("rms_norm", lambda x, w: F.rms_norm(x, (16,), w, 1e-5), (X, torch.randn(16).half())),
    ("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), (IMG, torch.randn(8).half(), torch.randn(8).half())),
    ("batch_norm", lambda x, w, b: F.batch_norm(x, None, None, w, b, True), (IMG, torch.randn(8).half(),
                                                                           torch.randn(8).half())),
    ("nll_loss", lambda x: F.nll_loss(x, torch.tensor([1, 0, 3, 2, 5, 4])), (X,)),
    ("attention", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (torch.randn(2, 3, 5, 8).half(),) * 3),
    ("attention_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     (torch.randn(2, 3, 5, 8).half(),) * 3),
    ("lstm", lambda x, *ps: torch.lstm(x, (torch.zeros(2, 3, 8, dtype=x.dtype),) * 2, list(ps), True, 2, 0.0, True,
                                       False, True)[0], (torch.randn(3, 5, 4).half(), *RNN_WEIGHTS["lstm"])),
    ("gru", lambda x, *ps: torch.gru(x, torch.zeros(2, 3, 8, dtype=x.dtype), list(ps), True, 2, 0.0, True, False,
                                     True)[0], (torch.randn(3, 5, 4).half(), *RNN_WEIGHTS["gru"])),
    # The families of real models' other operations (each fused call against float64, forward and backward).
    ("avg_pool2d", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), (IMG,)),
    ("avg_pool2d_no_pad_count", lambda x: F.avg_pool2d(x, 2, 1, 1, count_include_pad=False), (IMG,)),
    ("avg_pool1d", lambda x: F.avg_pool1d(x, 3, 2), (X[None],)),
    ("avg_pool3d", lambda x: F.avg_pool3d(x, 2), (IMG[:, None, :, :4, :4].repeat(1, 1, 2, 1, 1),)),
    ("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, 3), (IMG,)),
    ("upsample_nearest", lambda x: F.interpolate(x, scale_factor=2), (IMG,)),
    ("upsample_bilinear", lambda x: F.interpolate(x, size=(7, 9), mode="bilinear"), (IMG,)),
    ("upsample_bicubic", lambda x: F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=True), (IMG,)),
    ("relu6", F.relu6, (X * 4,)),
    ("hardtanh", lambda x: F.hardtanh(x, -0.3, 0.7), (X,)),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.1), (X,)),
    ("elu", F.elu, (X,)),
    ("selu", F.selu, (X,)),
    ("celu", lambda x: F.celu(x, 0.5), (X,)),
    ("softplus", F.softplus, (X,)),
    ("mish", F.mish, (X,)),
    ("logsigmoid", F.logsigmoid, (X,)),
    ("glu", F.glu, (X,)),
    ("prelu", F.prelu, (IMG, torch.full((8,), 0.25).half())),
    ("hardshrink", F.hardshrink, (X,)),
    ("softshrink", F.softshrink, (X,)),
    ("var", lambda x: x.var(1), (X,)),
    ("std", lambda x: x.std(), (X,)),
    ("vector_norm", lambda x: torch.linalg.vector_norm(x, dim=1), (X,)),
    ("normalize", lambda x: F.normalize(x, dim=1), (X,)),
    ("logsumexp", lambda x: x.logsumexp(1), (X,)),
    ("prod", lambda x: x[:, :4].prod(1), (X,)),
    ("cumsum", lambda x: x.cumsum(1), (X,)),
    ("sin_cos", lambda x: x.sin() * x.cos(), (X,)),
    ("atan2", torch.atan2, (X, X.flip(0))),
    ("expm1_log1p", lambda x: x.expm1() + x.abs().log1p(), (X,)),
    ("mse_loss", F.mse_loss, (X, X.flip(1))),
    ("smooth_l1_loss", F.smooth_l1_loss, (X, X.flip(1))),
    ("bce_with_logits", lambda x: F.binary_cross_entropy_with_logits(x, torch.ones_like(x)), (X,)),
    ("index_add", lambda x, v: x.index_add(0, torch.tensor([0, 2, 2, 5]), v), (X, X[:4] * 8)),
    ("scatter_add", lambda x, v: x.scatter_add(1, torch.tensor([[0, 1, 1, 0]] * 6), v), (X, X[:, :4] * 8)),
    ("index", lambda x: x[torch.tensor([0, 2, 2, 5])], (X,)),  # its gradient: a put that accumulates
    ("addcmul_addcdiv", lambda x, y: torch.addcdiv(torch.addcmul(x, x, y, value=0.5), y, x.abs() + 1, value=-2),
     (X, X.flip(0))),
    ("lerp", lambda x, y: torch.lerp(x, y, 0.1), (X, X.flip(1))),
    # The rarer functions' kernels (issue 33's probe).
    ("pow_general", lambda x, y: x.abs() ** y + 2.0 ** x + x.abs() ** 0.75, (X, X.flip(0))),
    ("fmod_remainder", lambda x, y: torch.fmod(x, 0.75) + torch.remainder(x, y.abs() + 1), (X, X.flip(1))),
    ("xlogy_logaddexp", lambda x, y: torch.xlogy(x.abs(), y.abs()) + torch.logaddexp(x, y), (X, X.flip(0))),
    ("sinc_hypot_logit", lambda x, y: torch.sinc(x) + torch.hypot(x, y) + torch.logit(x / 8 + 0.5),
     (X, X.flip(1))),
    ("cross", torch.linalg.cross, (X.reshape(-1, 3), X.flip(0).reshape(-1, 3))),
    ("dot_mv_addr", lambda x, y: torch.addr(torch.mv(x, y[0])[:, None], x[:, 0], y[1]).sum(1) + torch.dot(x[0], y[0]),
     (X, X.flip(1))),
    ("dist_nansum", lambda x, y: torch.dist(x, y) + torch.nansum(x, 1), (X, X.flip(0))),
    ("pad_backward", lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect") + F.pad(x, (2, 1, 1, 2), mode="replicate"),
     (IMG,)),
    ("fold_unfold", lambda x: F.fold(F.unfold(x, 3, padding=1), (5, 5), 3, padding=1) + x.unfold(3, 3, 1).sum(-1).sum(
        -1, keepdim=True), (IMG,)),
    ("weight_norm", lambda v, g: torch._weight_norm(v, g, 0), (X, X[:, :1].abs() + 1)),
    ("logcumsumexp", lambda x: torch.logcumsumexp(x * 4, 1)[:, :3] + torch.logcumsumexp(x[:, :3], 0), (X,)),
    ("cdist", lambda a, b: torch.cdist(a, b) + torch.cdist(a, b, p=1) + torch.cdist(a, b, p=3),
     (X.reshape(2, 3, 16), torch.cat([X[:2], X[3:]]).reshape(2, 5, 8)[..., :16].repeat(1, 1, 2))),
    ("pdist", lambda x: F.pdist(x) + F.pdist(x, p=1.5), (torch.cat([X, X[:1]]),)),
    ("embedding_bag_sum_weighted", lambda w, s: F.embedding_bag(torch.tensor([1, 2, 4, 5, 4, 0]), w * 8,
                                                                torch.tensor([0, 2, 2]), mode="sum",
                                                                per_sample_weights=s), (X, X[:, 0].abs())),
    ("embedding_bag_mean_padding", lambda w: F.embedding_bag(torch.tensor([[1, 2, 3], [3, 3, 5]]), w, mode="mean",
                                                             padding_idx=3), (X,)),
    ("embedding_bag_max_last_offset", lambda w: F.embedding_bag(torch.tensor([1, 2, 4, 5, 1]), w,
                                                                torch.tensor([0, 3, 5]), mode="max",
                                                                include_last_offset=True), (X,)),
    ("bilinear", lambda a, b, w, c: F.bilinear(a, b, w, c), (X[:, :3], X[:, 4:8], X[:5, :12].reshape(5, 3, 4),
                                                             X[0, :5])),
    ("ctc_loss", lambda x: F.ctc_loss(x.reshape(6, 2, 8).log_softmax(2), torch.tensor([[1, 2, 2], [3, 1, 4]]),
                                      torch.tensor([6, 5]), torch.tensor([3, 2])), (X,)),
    ("multi_margin_loss", lambda x: F.multi_margin_loss(x, torch.tensor([1, 0, 15, 2, 7, 7]), p=2, margin=0.5),
     (X,)),
    ("affine_grid", lambda t: F.affine_grid(t, (2, 1, 5, 7), align_corners=False), (torch.randn(2, 2, 3).half(),)),
    ("grid_sample", lambda x, g: F.grid_sample(x, g, align_corners=False),
     (IMG, torch.rand(2, 4, 3, 2).half() * 2 - 1)),
    ("grid_sample_bicubic_border", lambda x, g: F.grid_sample(x, g, mode="bicubic", padding_mode="border",
                                                              align_corners=True),
     (IMG, torch.rand(2, 3, 4, 2).half() * 2.4 - 1.2)),
])
def test_fused_within_one_rounding_of_float64(name, fn, xs, monkeypatch):
    _check_fused(fn, *xs, monkeypatch=monkeypatch)


def test_fused_attention_with_dropout_reuses_its_mask():
    """With dropout, the fused kernel draws one mask; forward and backward agree with float64 on it."""
    q = torch.randn(1, 2, 4, 8).half().requires_grad_()
    dev = sim.Device("atlas-training")
    torch.manual_seed(3)
    with DeviceMode(dev, strict=True) as mode:
        y = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
        y.sum().backward()
    assert mode.routes["aten.scaled_dot_product_attention", "fused"] == 1
    assert mode.routes["aten.scaled_dot_product_attention_backward", "fused"] == 1
    assert torch.isfinite(q.grad).all() and torch.isfinite(y).all()


def test_fused_overflow_inside_reaches_the_register():
    """A binary32 value beyond binary16 (softmax of fine inputs is not; layer norm's output times a big
    weight is) is rounded once on the device: saturated to 65504 with the register set."""
    dev = sim.Device("atlas-training")
    x = torch.randn(2, 16).half()
    with DeviceMode(dev, strict=True):
        y = F.layer_norm(x, (16,), torch.full((16,), 60000.0).half())
    assert dev.get_float_status().any() and y.abs().max() == 65504


@pytest.mark.parametrize("kernel", ["attention", "lstm"])
def test_fused_kernels_read_their_operands_and_a_signaling_nan_is_invalid(kernel):
    """A fused kernel above autograd widens its operands itself (no device conversion of its own,
    forward or backward); a signaling NaN among them, which widening quiets, is still an
    operation on a signaling NaN: INVALID (IEEE 754 section 7.2), and only then."""
    torch.manual_seed(5)
    lstm = nn.LSTM(4, 4, batch_first=True).half()
    for bits, invalid in ((0x3C00, 0), (0x7E00, 0), (0x7D00, 1)):  # 1.0, a quiet NaN, a signaling NaN
        x = torch.randn(1, 2, 3, 4).half()
        x.view(torch.int16)[0, 0, 0, 0] = bits
        x.requires_grad_()
        dev = sim.Device("atlas-training")
        with DeviceMode(dev, strict=True) as mode:
            y = F.scaled_dot_product_attention(x, x, x) if kernel == "attention" else lstm(x[0])[0]
            y.float().sum().backward()
        assert dev.get_float_status()[1] == invalid, bits
        # the conversions are the loss's own: its .float() and that one's gradient back to float16
        assert mode.routes["aten._to_copy.default", "device"] == 2


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_fused_rnn_is_one_kernel_and_its_gradient_overflow_reaches_the_register(cls):
    """nn.LSTM / nn.GRU are one fused kernel forward and one backward (strict accepts them); a loss
    scaled past binary16 saturates their weight gradients on atlas-training (register set, finite)
    and makes them infinite on atlas-a2; unfused, they are the device operations of torch's cell."""
    torch.manual_seed(2)
    model = cls(4, 8, num_layers=2, batch_first=True).half()
    x = torch.randn(3, 5, 4).half()
    for profile in ("atlas-training", "atlas-a2"):
        model.zero_grad()
        dev = sim.Device(profile)
        with DeviceMode(dev, strict=True) as mode:
            (model(x)[0].float().sum() * 2.0 ** 20).backward()
        kernel = "aten.lstm" if cls is nn.LSTM else "aten.gru"
        assert mode.routes[kernel, "fused"] == 1 and mode.routes[kernel + "_backward", "fused"] == 1
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert dev.get_float_status()[0] == 1
        assert (bool(torch.isfinite(grads).all()) and grads.abs().max() == 65504) if profile == "atlas-training" \
            else not torch.isfinite(grads).all()
    with DeviceMode(sim.Device("atlas-training"), fused={"rnn": False}) as unfused:
        model(x)[0].float().sum().backward()
    assert not any(r == "fused" for _, r in unfused.routes) and unfused.routes["aten.sigmoid_.default", "device"] > 0


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_a_packed_sequence_is_one_fused_kernel_and_equal_lengths_are_the_padded_batch(cls):
    """nn.LSTM / nn.GRU / nn.RNN on a PackedSequence (torch.lstm(data, batch_sizes, ...)) are one
    fused kernel each way (strict accepts them); sequences of one length give the padded batch's
    outputs and gradients bit for bit."""
    from torch.nn.utils.rnn import pack_padded_sequence

    torch.manual_seed(4)
    x = torch.randn(3, 5, 4).half()
    model = cls(4, 8, num_layers=2, bidirectional=True, batch_first=True).half()
    kind = {nn.LSTM: "lstm", nn.GRU: "gru", nn.RNN: "rnn_tanh"}[cls]
    results = []
    for lengths in ([5, 5, 5], None, [5, 3, 2]):
        model.zero_grad()
        with DeviceMode(sim.Device("atlas-training"), strict=True) as mode:
            if lengths is None:
                out = model(x)[0].transpose(0, 1).reshape(15, 16)  # step-major rows, as packed data
            else:
                out = model(pack_padded_sequence(x, torch.tensor(lengths), batch_first=True))[0].data
            (out.float() * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
        assert mode.routes[f"aten.{kind}", "fused"] == 1 and mode.routes[f"aten.{kind}_backward", "fused"] == 1
        results.append([out, *[p.grad.clone() for p in model.parameters()]])
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(*results[:2], strict=True))
    assert results[2][0].shape == (10, 16) and torch.isfinite(results[2][0]).all()


def _device_gelu(dev, a):
    h = dev.mul(a, np.float16(0.5))
    return dev.mul(h, dev.add(dev.erf(dev.mul(a, np.float16(0.5 ** 0.5))), np.float16(1)))


def test_unfused_gelu_is_the_device_ops_one_by_one():
    dev = sim.Device("atlas-training")
    with DeviceMode(dev, strict=True, fused={"gelu": False}) as mode:
        y = F.gelu(X)
    assert not any(r == "fused" for _, r in mode.routes)
    expect = _device_gelu(sim.Device("atlas-training"), X.numpy())
    assert np.array_equal(y.numpy().view(np.uint16), expect.view(np.uint16))


def test_unfused_softmax_is_the_device_ops_one_by_one():
    dev, ref = sim.Device("atlas-training"), sim.Device("atlas-training")
    with DeviceMode(dev, strict=True, fused={"softmax": False}):
        y = F.softmax(X, -1)
    a = X.numpy()
    m = ref.amax(a.T, axis=0)[:, None]
    e = ref.exp(ref.sub(a, m))
    s = ref.sum(e.T, axis=0, accumulate=np.float32, out_dtype=np.float16)[:, None]
    assert np.array_equal(y.numpy().view(np.uint16), ref.div(e, s).view(np.uint16))


def test_family_names_and_defaults():
    assert fused.choose() == {f.name: f.default for f in fused.FAMILIES}
    assert set(fused.choose(False).values()) == {False}
    assert fused.choose({"softmax": False})["softmax"] is False
    with pytest.raises(ValueError, match="unknown fused family"):
        DeviceMode(sim.Device("atlas-training"), fused={"softmaxx": True})


class _Block(nn.Module):
    """A small transformer block calling F.scaled_dot_product_attention."""

    def __init__(self, d=16, heads=2, dropout=0.0, causal=False, masked=False):
        super().__init__()
        self.heads, self.dropout, self.causal, self.masked = heads, dropout, causal, masked
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        mask = torch.ones(t, t, dtype=torch.bool).tril() if self.masked else None
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout, is_causal=self.causal)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


def _models():
    torch.manual_seed(1)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.SiLU(), nn.LayerNorm(32),
                        nn.RMSNorm(32), nn.Linear(32, 10))
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.GroupNorm(2, 8),
                        nn.SiLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    tokens = torch.randn(2, 6, 16)
    return [("mlp", mlp, torch.randn(4, 16)), ("cnn", cnn, torch.randn(2, 3, 8, 8)),
            ("block", nn.Sequential(_Block(), nn.Flatten(), nn.Linear(96, 10)), tokens),
            ("block_dropout", nn.Sequential(_Block(dropout=0.1), nn.Flatten(), nn.Linear(96, 10)), tokens),
            ("block_causal", nn.Sequential(_Block(causal=True), nn.Flatten(), nn.Linear(96, 10)), tokens),
            ("block_masked", nn.Sequential(_Block(masked=True), nn.Flatten(), nn.Linear(96, 10)), tokens)]


@pytest.mark.parametrize("fused_", [None, False], ids=["defaults", "unfused"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_strict_accepts_models_forward_and_backward(fused_, dtype):
    """MLP (GELU, SiLU, LayerNorm, RMSNorm), transformer blocks (sdpa: plain, dropout, causal, masked), a
    CNN (BatchNorm, GroupNorm), each with cross-entropy: strict refuses nothing, forward or backward."""
    for name, model, x in _models():
        model = model.to(dtype).train()
        dev = sim.Device("atlas-a2")
        with DeviceMode(dev, strict=True, fused=fused_) as mode:
            loss = F.cross_entropy(model(x.to(dtype)), torch.arange(x.shape[0]) % 10)
            loss.backward()
        assert {r for _, r in mode.routes} <= {"fused", "exact", "factory", "device", "random"}, name
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters()), name
        assert (fused_ is False) == (not any(r == "fused" for _, r in mode.routes)), name


@pytest.mark.parametrize("fused_", [True, False], ids=["fused", "unfused"])
def test_inplace_silu_takes_its_functional_route(fused_):
    dev = sim.Device("atlas-training")
    with DeviceMode(dev, strict=True, fused={"silu": fused_}) as mode:
        functional = F.silu(X)
        inplace = F.silu(X.clone(), inplace=True)
    assert torch.equal(inplace.view(torch.int16), functional.view(torch.int16))
    assert fused_ == any(r == "fused" for _, r in mode.routes)


def test_square_is_the_device_product_and_other_powers_the_fused_general_kernel():
    """x ** 2 is the device's product; x ** 1.5, x ** y and 2 ** y are aclnn's general pow kernels:
    fused, the exact power rounded to binary32 and then once into the dtype (float64's, rounded twice)."""
    dev, ref = sim.Device("atlas-training"), sim.Device("atlas-training")
    y = X[:1].abs()
    with DeviceMode(dev, strict=True) as mode:
        sq = X ** 2
        powers = [X.abs() ** 1.5, X.abs() ** y, 2.0 ** X]
    a = X.numpy()
    assert np.array_equal(sq.numpy().view(np.uint16), ref.mul(a, a).view(np.uint16))
    assert mode.routes["aten.pow.Tensor_Scalar", "device"] == 1
    assert mode.routes["aten.pow.Tensor_Scalar", "fused"] == 1
    assert mode.routes["aten.pow.Tensor_Tensor", "fused"] == 1 and mode.routes["aten.pow.Scalar", "fused"] == 1
    wide = X.double()
    for got, want in zip(powers, [wide.abs() ** 1.5, wide.abs() ** y.double(), 2.0 ** wide], strict=True):
        assert torch.equal(got, want.float().half())


def test_logcumsumexp_meets_infinities_and_nan_as_torchs_recurrence():
    """From -inf: -inf stays -inf, +inf takes over and stays, a NaN propagates from where it enters;
    the finite steps within one rounding of float64 (the recurrence: binary32 inside)."""
    from sim import torch_binary32 as tb

    x = torch.tensor([[-float("inf"), -float("inf"), 0.5, 3.0, float("inf"), 2.0],
                      [1.0, -2.0, float("nan"), 4.0, -float("inf"), 0.0]])
    with tb.Binary32Mode(strict=True):
        got = torch.logcumsumexp(x, 1)
    assert got[0, :2].tolist() == [-float("inf")] * 2 and got[0, 4:].tolist() == [float("inf")] * 2
    assert got[1, 2:].isnan().all()
    want = torch.logcumsumexp(x.double(), 1)
    finite = want.isfinite()
    assert _within_one_rounding(got[finite], want[finite])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_embedding_max_norm_rescales_the_looked_up_rows_once_in_place(dtype):
    """nn.Embedding(max_norm=...) under the device: the rows looked up (a repeated index once) whose
    norm exceeds max_norm are scaled by max_norm / (norm + 1e-7) and written back rounded once (within
    one rounding of float64's); other rows keep their bits; strict accepts it; the register is clear."""
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(6, 4, generator=g) * torch.tensor([0.1, 2, 3, 0.2, 5, 1])[:, None]).to(dtype)
    before = w.clone()
    emb = nn.Embedding.from_pretrained(w, freeze=False, max_norm=1.5)
    idx = torch.tensor([[1, 2, 2], [0, 4, 1]])
    dev = sim.Device("atlas-training" if dtype == torch.float16 else "atlas-a2")
    with DeviceMode(dev, strict=True) as mode:
        out = emb(idx)
    assert mode.routes["aten.embedding_renorm_.default", "fused"] == 1
    w64 = before.double()
    norms = w64.norm(dim=1)
    for r in range(6):
        if r in (0, 1, 2, 4) and norms[r] > 1.5:
            assert _within_one_rounding(emb.weight[r].detach(), w64[r] * (1.5 / (norms[r] + 1e-7)))
            assert not torch.equal(emb.weight[r], before[r])
        else:
            assert torch.equal(emb.weight[r].view(torch.int16), before[r].view(torch.int16))
    assert torch.equal(out, emb.weight.detach()[idx]) and not dev.get_float_status().any()
