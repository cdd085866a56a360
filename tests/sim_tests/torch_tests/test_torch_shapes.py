"""The shape, dtype and requires_grad of every DeviceMode route's result are torch's own, and each
call takes the route the tables say (issue 30, items 8 and 11).

One sample table (``CASES``) covers every packet of ``sim.torch.ROUTES`` and ``EXACT`` and every
fused family of ``sim.fused.FAMILIES``, with float16 operands of several shapes: 0-d, one element,
transposed (non-contiguous), and reductions with ``dim``, ``keepdim`` and ``dtype=`` variants.
Each sample is run natively (torch's own float16 CPU kernel) and under a DeviceMode, and the
results are compared: the shape, dtype and requires_grad of every output (and of the operands'
gradients where the sample runs backward); the values loosely (torch's float16 kernels round
differently in places: the shapes and dims are what is checked here, the bits elsewhere); the
independence of the result from the operands' strides (a transposed operand gives the bits its
contiguous copy gives); and the route ``mode.routes`` counted the sample's operation under. Then
what users do with a loss: ``.item()``, f-strings, ``stack``, ``cat``, ``tolist``,
``clip_grad_norm_`` and ``GradScaler.scale``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sim import Device  # noqa: E402
from sim.fused import FAMILIES  # noqa: E402
from sim.torch import EXACT, ROUTES, DeviceMode  # noqa: E402

aten = torch.ops.aten
F = torch.nn.functional
H, B, F32 = torch.float16, torch.bfloat16, torch.float32


# --- operands ---------------------------------------------------------------------------------

def _values(shape, seed: int, positive: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.uniform(0.25, 2.0, shape) if positive else rng.uniform(-2.0, 2.0, shape)
    return np.asarray(v, np.float64)


def h(*shape, grad: bool = True, t: bool = False, pos: bool = False, dtype=H, seed: int = 0) -> Callable:
    """A maker of a float16 operand of ``shape`` (() is 0-d); ``t``: the transpose of a contiguous
    tensor of the reversed last two dimensions (non-contiguous); ``grad``: a leaf requiring grad."""
    def make():
        if t:
            base = torch.tensor(_values(shape[:-2] + (shape[-1], shape[-2]), seed, pos)).to(dtype)
            x = base.transpose(-1, -2)
            assert not x.is_contiguous()
            return x.requires_grad_(grad) if grad else x
        return torch.tensor(_values(shape, seed, pos)).to(dtype).requires_grad_(grad)
    return make


def const(value) -> Callable:
    return lambda: value


def ints(*values) -> Callable:
    return lambda: torch.tensor(values)


def mask(*shape) -> Callable:
    return lambda: torch.tensor(np.arange(math.prod(shape)).reshape(shape) % 3 == 0)


@dataclass
class Case:
    id: str
    fn: Callable
    inputs: tuple
    kind: str  #: the route kind the sample's operation takes (ROUTE_KINDS)
    packet: str  #: the aten packet whose calls mode.routes must count under ``kind``
    backward: bool = False  #: also run backward (the packet may be a backward operation)
    values: bool = True  #: compare the values loosely with torch's (not for random draws)
    fused: dict | None = None  #: DeviceMode's fused= argument
    xfail: str | None = None  #: a known bug outside this file's reach (strict: its fix shows)


CASES: list[Case] = []


def case(id, fn, *inputs, kind="device", packet=None, **kw) -> None:
    CASES.append(Case(id, fn, inputs, kind, packet or id.split(" ")[0], **kw))


# --- the device routes (ROUTES) ---------------------------------------------------------------

for name in ("add", "sub", "mul", "div", "maximum", "minimum"):
    fn = getattr(torch, name)
    case(f"{name} transposed", fn, h(3, 4), h(3, 4, t=True, pos=True, seed=1))
    case(f"{name} 0-d", fn, h(), h(pos=True, seed=1))
    case(f"{name} broadcast 0-d", fn, h(3, 4, t=True), h(pos=True, seed=1))
    case(f"{name} one element", fn, h(1), h(2, 1, pos=True, seed=1))
    case(f"{name} 0-d float32 promotes", fn, h(), lambda: torch.tensor(1.5, requires_grad=True))
for name in ("add", "sub", "mul", "div"):
    case(f"{name} python scalar", lambda x, name=name: getattr(x, name)(3), h(2, 3, t=True))
case("rsub scalar", lambda x: 1.0 - x, h(3, 2, t=True))
case("rsub 0-d", lambda x: 1 - x, h())
for name in ("abs", "neg", "relu", "exp", "log", "sqrt", "rsqrt", "reciprocal", "erf", "tanh", "sigmoid"):
    fn = getattr(torch, name)
    case(f"{name} 0-d", fn, h(pos=True))
    case(f"{name} one element", fn, h(1, 1, pos=True))
    case(f"{name} transposed", fn, h(2, 3, t=True, pos=True))
for name in ("eq", "ne", "lt", "le", "gt", "ge"):
    fn = getattr(torch, name)
    case(f"{name} transposed", fn, h(3, 4, t=True), h(3, 4, seed=1))
    case(f"{name} 0-d", fn, h(), h(seed=1))
    case(f"{name} scalar", fn, h(2, 3, t=True), const(0.5))
case("tanh_backward", torch.tanh, h(2, 3, t=True), backward=True)
case("sigmoid_backward", torch.sigmoid, h(), backward=True)

# Reductions: dims, keepdim and dtype= (equal to the input's or the exact widening to float32: the
# device; a narrowing one: float32).
for name in ("sum", "mean", "amax", "amin"):
    fn = getattr(torch, name)
    case(f"{name} all", fn, h(3, 4))
    case(f"{name} 0-d", fn, h())
    case(f"{name} 0-d dim 0", lambda x, fn=fn: fn(x, 0), h())
    case(f"{name} 0-d dim -1 keepdim", lambda x, fn=fn: fn(x, -1, keepdim=True), h())
    case(f"{name} one element", fn, h(1, 1))
    case(f"{name} one element dim keepdim", lambda x, fn=fn: fn(x, 1, keepdim=True), h(1, 1))
    case(f"{name} dim", lambda x, fn=fn: fn(x, 1), h(3, 4))
    case(f"{name} dim keepdim", lambda x, fn=fn: fn(x, 1, keepdim=True), h(3, 4))
    case(f"{name} negative dim keepdim transposed", lambda x, fn=fn: fn(x, -2, keepdim=True), h(3, 4, t=True))
    case(f"{name} dims keepdim", lambda x, fn=fn: fn(x, (0, 2), keepdim=True), h(2, 3, 4))
    case(f"{name} dims", lambda x, fn=fn: fn(x, (2, 0)), h(2, 3, 4, t=True))
    case(f"{name} all dims keepdim", lambda x, fn=fn: fn(x, (0, 1), keepdim=True), h(3, 4))
    case(f"{name} empty dims", lambda x, fn=fn: fn(x, []), h(3, 4))
    case(f"{name} empty tensor", lambda x, fn=fn: fn(x, 1), h(0, 3))
for name in ("sum", "mean"):
    fn = getattr(torch, name)
    case(f"{name} dtype=float16", lambda x, fn=fn: fn(x, dtype=H), h(3, 4))
    case(f"{name} dim dtype=float16", lambda x, fn=fn: fn(x, 0, dtype=H), h(3, 4, t=True))
    case(f"{name} dim keepdim dtype=float16", lambda x, fn=fn: fn(x, 1, True, dtype=H), h(3, 4))
    case(f"{name} 0-d dtype=float16", lambda x, fn=fn: fn(x, dtype=H), h())
    case(f"{name} bfloat16 dim keepdim dtype=bfloat16", lambda x, fn=fn: fn(x, -1, True, dtype=B), h(3, 4, dtype=B))
    case(f"{name} dim keepdim dtype=float32", lambda x, fn=fn: fn(x, 1, True, dtype=F32), h(3, 4))
    case(f"{name} dtype=float32", lambda x, fn=fn: fn(x, dtype=F32), h(3, 4))
    case(f"{name} bfloat16 dtype=float32", lambda x, fn=fn: fn(x, 0, dtype=F32), h(3, 4, dtype=B))
    case(f"{name} float32 dtype=float16", lambda x, fn=fn: fn(x, 1, dtype=H), h(3, 4, dtype=F32), kind="float32")
    case(f"{name} backward dim keepdim", lambda x, fn=fn: fn(x, 0, keepdim=True), h(3, 4, t=True), backward=True)

# Matrix products and convolutions.
case("mm transposed", torch.mm, h(3, 4, t=True), h(4, 2, seed=1))
case("mm backward", torch.mm, h(3, 4), h(4, 2, t=True, seed=1), backward=True)
case("bmm", torch.bmm, h(2, 3, 4), h(2, 4, 5, t=True, seed=1), backward=True)
case("addmm linear", F.linear, h(3, 4), h(2, 4, seed=1), h(2, seed=2), packet="addmm")
case("addmm 1-d bias", torch.addmm, h(3), h(2, 4, seed=1), h(4, 3, t=True, seed=2))
case("baddbmm", torch.baddbmm, h(2, 3, 5), h(2, 3, 4, seed=1), h(2, 4, 5, t=True, seed=2))
case("convolution conv2d", F.conv2d, h(1, 2, 5, 5), h(3, 2, 3, 3, seed=1), h(3, seed=2), packet="convolution")
case("convolution conv1d unbatched", F.conv1d, h(2, 6), h(3, 2, 3, seed=1), packet="convolution")
case("convolution_backward", lambda x, w, b: F.conv2d(x, w, b, padding=1), h(1, 2, 4, 4), h(3, 2, 3, 3, seed=1),
     h(3, seed=2), backward=True)

# Conversions and selections.
case("_to_copy float", lambda x: x.float(), h(2, 3, t=True))
case("_to_copy 0-d float", lambda x: x.float(), h())
case("_to_copy 0-d from float32", lambda x: x.half(), lambda: torch.tensor(3.0, requires_grad=True))
case("_to_copy bfloat16", lambda x: x.to(B), h(1))
case("copy_ from float32", lambda d, s: d.copy_(s), h(2, 3, grad=False), h(2, 3, grad=False, dtype=F32, seed=1))
case("copy_ 0-d", lambda d, s: d.copy_(s), h(grad=False), lambda: torch.tensor(7.0, dtype=torch.float64))
case("masked_fill", lambda x, m: x.masked_fill(m, 1e-8), h(3, 4, t=True), mask(3, 4))
case("masked_fill 0-d", lambda x, m: x.masked_fill(m, 0.1), h(), lambda: torch.tensor(True))
case("angle", torch.angle, h(3, 4, t=True), backward=True)
case("angle 0-d", torch.angle, h(), packet="angle")
case("index_fill", lambda x: x.index_fill(1, torch.tensor([0, 2]), torch.tensor(0.1)), h(3, 4, t=True))
case("index_fill scalar", lambda x: x.index_fill(0, torch.tensor([1]), -2.5), h(3, 4), packet="index_fill")
case("nan_to_num", lambda x: torch.nan_to_num(x, posinf=1e6), h(2, 3, t=True))
case("nan_to_num 0-d", torch.nan_to_num, h())
# A Python number is made a tensor of x's dtype first (scalar_tensor, the factory route): the where is exact.
case("where scalar", lambda m, x: torch.where(m, x, 0.1), mask(3, 4), h(3, 4, t=True), kind="exact")
case("where 0-d float32", lambda m, x: torch.where(m, x, torch.tensor(0.1)), lambda: torch.tensor(False), h())
case("where same dtype", torch.where, mask(3, 4), h(3, 4, t=True), h(3, 4, seed=1), kind="exact")

# Compositions.
case("clamp", lambda x: x.clamp(-1, 1), h(3, 2, t=True))
case("clamp 0-d tensor bounds", lambda x, lo: x.clamp(lo, None), h(), h(seed=1))
case("clamp_min", lambda x: x.clamp_min(0.1), h(1))
case("clamp_max", lambda x: x.clamp_max(0.5), h())
case("hardsigmoid", F.hardsigmoid, h(2, 3, t=True))
case("hardswish", F.hardswish, h())
case("hardsigmoid_backward", F.hardsigmoid, h(2, 3, t=True), backward=True)
case("hardswish_backward", F.hardswish, h(1), backward=True)
case("pow 2", lambda x: x ** 2, h(2, 3, t=True))
case("pow 3 0-d", lambda x: x ** 3, h())
case("pow 0.5", lambda x: x ** 0.5, h(1, pos=True))
case("pow -1 backward", lambda x: x ** -1, h(3, pos=True), backward=True)
case("pow 1", lambda x: x ** 1, h(2, 3, t=True), kind="exact")
case("math: pow 1.5", lambda x: x ** 1.5, h(pos=True), kind="fused", packet="pow")  # aclnn's general kernel
# (F.dropout on the CPU is torch's bernoulli_ and mul decomposition; native_dropout is called as such.)
case("native_dropout_backward", lambda x: aten.native_dropout(x, 0.5, True), h(3, 4, t=True), backward=True,
     values=False)
case("native_dropout", lambda x: aten.native_dropout(x, 0.5, True), h(), kind="random", values=False)

# In-place and out= overloads: the functional route, the result written into the destination.
case("add_", lambda x, y: x.add_(y), h(2, 3, grad=False), h(seed=1))
case("mul_ 0-d", lambda x: x.mul_(3), h(grad=False))
case("relu_", lambda x: x.relu_(), h(2, 3, t=True, grad=False))
case("sum out keepdim", lambda x, o: torch.sum(x, 1, keepdim=True, out=o), h(3, 4, grad=False),
     lambda: torch.empty(0, dtype=H), packet="sum")
case("amax out 0-d", lambda x, o: torch.amax(x, 0, out=o), h(grad=False), lambda: torch.empty(0, dtype=H),
     packet="amax")


# --- the exact route (EXACT) ------------------------------------------------------------------

def exact(id, fn, *inputs, packet=None, **kw) -> None:
    case(id, fn, *inputs, kind="exact", packet=packet, **kw)


exact("view", lambda x: x.view(4, 3), h(3, 4))
exact("view 0-d", lambda x: x.view(1, 1), h())
exact("_unsafe_view", lambda x: aten._unsafe_view(x, [4, 3]), h(3, 4))
exact("reshape transposed", lambda x: x.reshape(12), h(3, 4, t=True), packet="_unsafe_view")
exact("reshape 0-d", lambda x: x.reshape(1), h(), packet="view")
exact("t", torch.t, h(3, 4))
exact("transpose", lambda x: x.transpose(0, 2), h(2, 3, 4))
exact("permute", lambda x: x.permute(2, 0, 1), h(2, 3, 4))
exact("expand", lambda x: x.expand(3, 4), h())
exact("squeeze", torch.squeeze, h(1, 1))
exact("unsqueeze", lambda x: x.unsqueeze(0), h())
exact("cat", lambda x, y: torch.cat([x, y]), h(2, 3, t=True), h(1, 3, seed=1))
exact("stack 0-d", lambda x, y: torch.stack([x, y]), h(), h(seed=1))
exact("slice", lambda x: x[1:], h(3, 4))
exact("select", lambda x: x[1], h(3, 4, t=True))
exact("index", lambda x, i: x[i], h(3, 4), ints(2, 0))
exact("index_select", lambda x, i: torch.index_select(x, 1, i), h(3, 4, t=True), ints(3, 1))
exact("gather", lambda x, i: torch.gather(x, 1, i), h(2, 3), lambda: torch.tensor([[0, 2], [1, 1]]))
exact("clone", torch.clone, h(3, 4, t=True))
exact("detach", lambda x: x.detach(), h())
exact("alias", aten.alias, h(2))
exact("split", lambda x: torch.split(x, 2, 1), h(3, 4))
exact("split_with_sizes", lambda x: torch.split(x, [1, 3], 1), h(3, 4, t=True))
exact("unbind", torch.unbind, h(2, 3))
exact("unsafe_split", lambda x: aten.unsafe_split(x, 2, 1), h(3, 4))
exact("unsafe_split_with_sizes", lambda x: aten.unsafe_split_with_sizes(x, [1, 3], 1), h(3, 4))
exact("select_backward", lambda x: x[1], h(3, 4), backward=True)
exact("slice_backward", lambda x: x[:, 1:], h(3, 4, t=True), backward=True)
exact("isinf", torch.isinf, h(2, 3, t=True))
exact("isnan", torch.isnan, h())
exact("isposinf", torch.isposinf, h(1))
exact("isneginf", torch.isneginf, h(2, 3))
exact("threshold_backward", torch.relu, h(2, 3, t=True), backward=True)
exact("embedding", F.embedding, lambda: torch.tensor([[0, 2], [1, 0]]), h(3, 4, grad=False))
exact("max_pool2d_with_indices", lambda x: F.max_pool2d(x, 2), h(1, 2, 4, 4))
exact("max_pool3d_with_indices", lambda x: F.max_pool3d(x, 2), h(1, 1, 2, 4, 4))
exact("adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, 2), h(1, 2, 4, 4))
exact("adaptive_max_pool3d", lambda x: F.adaptive_max_pool3d(x, 2), h(1, 1, 2, 4, 4))
exact("constant_pad_nd", lambda x: F.pad(x, (1, 2)), h(2, 3, t=True))
exact("as_strided", lambda x: x.as_strided((2, 2), (1, 2)), h(6))
exact("_pack_padded_sequence", lambda x: torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([3, 1])).data,
      h(3, 2, 4), backward=True)
exact("lift_fresh", lambda: torch.tensor([1.5, 2.0], dtype=H))
exact("lift_fresh 0-d", lambda: torch.tensor(1.5, dtype=H), packet="lift_fresh")
exact("_reshape_alias", lambda x: aten._reshape_alias(x, [4, 3], [3, 1]), h(3, 4))
exact("flip", lambda x: x.flip(0), h(3, 4, t=True))
exact("roll", lambda x: x.roll(1, 1), h(3, 4))
exact("repeat", lambda x: x.repeat(2, 3), h())
exact("tril", torch.tril, h(3, 4, t=True))
exact("triu", torch.triu, h(3, 4))
exact("sgn", torch.sgn, h())
exact("sign", torch.sign, h(2, 3, t=True))
exact("nextafter", lambda x, y: torch.nextafter(x, y), h(2, 3, t=True), h(2, 3, seed=1))
exact("nextafter_", lambda x, y: x.detach().clone().nextafter_(y), h(3), h(3, seed=1))
exact("sort", lambda x: torch.sort(x, 1), h(3, 4, t=True))
exact("topk", lambda x: torch.topk(x, 2), h(3, 4))
exact("max all", torch.max, h(3, 4, t=True))
exact("max dim keepdim", lambda x: torch.max(x, 1, keepdim=True), h(3, 4))
exact("min 0-d dim", lambda x: torch.min(x, 0), h())
exact("argmax", lambda x: torch.argmax(x, 0, keepdim=True), h(3, 4, t=True))
exact("argmin", torch.argmin, h())
exact("pixel_shuffle", lambda x: F.pixel_shuffle(x, 2), h(1, 4, 2, 3))
exact("pixel_unshuffle", lambda x: F.pixel_unshuffle(x, 2), h(1, 1, 4, 2))
exact("diagonal_backward", lambda x: x.diagonal(), h(3, 4, t=True), backward=True)
exact("masked_scatter", lambda x, m, s: x.masked_scatter(m, s), h(3, 4), mask(3, 4), h(12, seed=1))
exact("_local_scalar_dense", lambda x: x.item(), h())
exact("item one element", lambda x: x.item(), h(1, 1), packet="_local_scalar_dense")
exact("promote_types", lambda: torch.promote_types(H, F32))
exact("can_cast", lambda: torch.can_cast(F32, H))
# The exact overloads (EXACT_OVERLOADS) of packets whose other overloads round.
exact("floor", torch.floor, h(2, 3, t=True))
exact("round", torch.round, h())
exact("frac", torch.frac, h(1))
exact("scatter", lambda x, i, s: x.scatter(1, i, s), h(2, 3), lambda: torch.tensor([[0], [2]]), h(2, 1, seed=1))


# --- the fused families -----------------------------------------------------------------------

def fused(family, id, fn, *inputs, packet=None, **kw) -> None:
    case(f"{family}: {id}", fn, *inputs, kind="fused", packet=packet or id.split(" ")[0], **kw)


fused("attention", "_scaled_dot_product_flash_attention_for_cpu", F.scaled_dot_product_attention,
      h(1, 2, 3, 4), h(1, 2, 3, 4, seed=1), h(1, 2, 3, 4, seed=2), backward=True)
fused("layer_norm", "native_layer_norm", lambda x: F.layer_norm(x, (4,)), h(3, 4, t=True))
fused("layer_norm", "native_layer_norm_backward", lambda x, w: F.layer_norm(x, (4,), w), h(3, 4), h(4, seed=1),
      backward=True)
fused("rms_norm", "rms_norm", lambda x, w: F.rms_norm(x, (4,), w), h(3, 4, t=True), h(4, seed=1),
      backward=True, fused={"rms_norm": True})
fused("batch_norm", "native_batch_norm training", lambda x: F.batch_norm(
    x, torch.zeros(2, dtype=H), torch.ones(2, dtype=H), training=True), h(3, 2, 4), backward=True)
fused("batch_norm", "native_batch_norm", lambda x: F.batch_norm(
    x, torch.zeros(2, dtype=H), torch.ones(2, dtype=H)), h(3, 2))
fused("group_norm", "native_group_norm", lambda x: F.group_norm(x, 2), h(2, 4, 3), backward=True)
fused("softmax", "_softmax", lambda x: torch.softmax(x, -1), h(3, 4, t=True), backward=True)
#: sim/binary32.py's _reduce moves axis 0 of a 0-d array (torch_binary32's _axes gives (0,)): IndexError.
fused("softmax", "_softmax 0-d", lambda x: torch.softmax(x, 0), h())
fused("softmax", "_softmax dtype=float16", lambda x: torch.softmax(x, 0, dtype=H), h(3, 4))
fused("softmax", "_log_softmax", lambda x: F.log_softmax(x, 1), h(3, 4), backward=True)
fused("softmax", "_log_softmax dtype=float16", lambda x: F.log_softmax(x, 1, dtype=H), h(3, 4, t=True))
fused("gelu", "gelu", F.gelu, h(2, 3, t=True), backward=True)
fused("gelu", "gelu tanh 0-d", lambda x: F.gelu(x, approximate="tanh"), h())
fused("silu", "silu", F.silu, h(), backward=True)
fused("rnn", "gru", lambda x: (torch.manual_seed(0), torch.nn.GRU(3, 2).half()(x)[0])[1], h(2, 1, 3), backward=True)
fused("cross_entropy", "nll_loss_forward", lambda x, y: F.cross_entropy(x, y), h(3, 4, t=True), ints(0, 3, 1),
      backward=True)
fused("cross_entropy", "nll_loss_forward none", lambda x, y: F.cross_entropy(x, y, reduction="none"), h(3, 4),
      ints(0, 3, 1))
fused("cross_entropy", "nll_loss_forward sum", lambda x, y: F.nll_loss(x, y, reduction="sum"), h(3, 4), ints(0, 3, 1))
fused("cross_entropy", "nll_loss_forward unbatched", lambda x, y: F.nll_loss(x, y), h(4), lambda: torch.tensor(2))
fused("embedding_backward", "embedding_dense_backward", lambda i, w: F.embedding(i, w),
      lambda: torch.tensor([[0, 2], [2, 2]]), h(3, 4), backward=True)
fused("max_pool_backward", "max_pool2d_with_indices_backward", lambda x: F.max_pool2d(x, 2, 1), h(1, 1, 3, 3),
      backward=True)
fused("avg_pool", "avg_pool2d", lambda x: F.avg_pool2d(x, 2), h(1, 2, 4, 4), backward=True)
fused("upsample", "upsample_bilinear2d", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
      h(1, 1, 2, 3), backward=True)
fused("activation", "leaky_relu", F.leaky_relu, h(2, 3, t=True), backward=True)
fused("activation", "hardtanh 0-d", F.hardtanh, h())
for name, fn in (("var", torch.var), ("std", torch.std), ("logsumexp", torch.logsumexp), ("prod", torch.prod)):
    fused("reduction", f"{name} dim keepdim", lambda x, fn=fn: fn(x, 1, keepdim=True), h(3, 4, t=True),
          backward=True)
    fused("reduction", f"{name} dim", lambda x, fn=fn: fn(x, 0), h(3, 4))
    fused("reduction", f"{name} 0-d dim", lambda x, fn=fn: fn(x, 0), h())
for name, fn in (("var", torch.var), ("std", torch.std), ("prod", torch.prod)):
    fused("reduction", f"{name} all", fn, h(3, 4, t=True))
    fused("reduction", f"{name} one element", fn, h(1))
fused("reduction", "prod dim keepdim dtype=float16", lambda x: torch.prod(x, 1, keepdim=True, dtype=H), h(3, 4))
fused("reduction", "prod dtype=float16", lambda x: torch.prod(x, dtype=H), h(3, 4))
fused("reduction", "var_mean", lambda x: torch.var_mean(x, 1, keepdim=True), h(3, 4, t=True))
fused("reduction", "std_mean", lambda x: torch.std_mean(x), h(3, 4))
fused("reduction", "linalg_vector_norm", lambda x: x.norm(), h(3, 4, t=True), backward=True)
fused("reduction", "linalg_vector_norm dim keepdim", lambda x: torch.linalg.vector_norm(x, 2, 1, True), h(3, 4))
fused("reduction", "linalg_vector_norm 0-d", lambda x: x.norm(), h())
fused("reduction", "cumsum", lambda x: torch.cumsum(x, 1), h(3, 4, t=True), backward=True)
fused("reduction", "cumsum dtype=float16", lambda x: torch.cumsum(x, 0, dtype=H), h(3, 4))
fused("reduction", "cumsum 0-d", lambda x: torch.cumsum(x, 0), h())
fused("reduction", "cumprod", lambda x: torch.cumprod(x, 0), h(2, 3))
fused("math", "sin", torch.sin, h(2, 3, t=True), backward=True)
fused("math", "atan2 0-d", torch.atan2, h(), h(seed=1))
fused("accumulate", "index_add", lambda x, i, s: x.index_add(0, i, s), h(3, 2), ints(0, 0), h(2, 2, seed=1))
fused("pointwise", "addcmul", lambda x, a, b: torch.addcmul(x, a, b, value=0.5), h(2, 3, t=True), h(2, 3, seed=1),
      h(3, seed=2))
fused("pointwise", "lerp 0-d", torch.lerp, h(), h(seed=1), const(0.3))
fused("loss", "mse_loss", F.mse_loss, h(2, 3, t=True), h(2, 3, seed=1), backward=True)
fused("loss", "binary_cross_entropy_with_logits 0-d", F.binary_cross_entropy_with_logits, h(),
      lambda: torch.tensor(1.0, dtype=H))
fused("grid", "affine_grid_generator", lambda t: F.affine_grid(t, (1, 1, 2, 3), align_corners=False), h(1, 2, 3))
fused("grid", "grid_sampler_2d", lambda x, g: F.grid_sample(x, g, align_corners=False), h(1, 2, 3, 3),
      lambda: torch.tensor([[[[0.25, -0.5], [0.9, 0.1]]]], dtype=H), backward=True)

# The rarer functions of models (issue 33's probe): selections and copies exact, the rest fused.
exact("median", torch.median, h(3, 4, t=True))
exact("median dim keepdim", lambda x: torch.median(x, 1, keepdim=True), h(3, 4), packet="median")
exact("nanmedian dim", lambda x: torch.nanmedian(x, 0), h(3, 4), backward=True, packet="nanmedian")
exact("cummax 0-d", lambda x: torch.cummax(x, 0), h(), packet="cummax")
exact("cummin", lambda x: torch.cummin(x, 1), h(3, 4, t=True), backward=True)
exact("copysign", torch.copysign, h(3, 4, t=True), h(3, 4, seed=1), backward=True)
exact("heaviside", torch.heaviside, h(5, grad=False), h(5, seed=1, grad=False))
exact("diag_embed", torch.diag_embed, h(2, 3), backward=True)
exact("channel_shuffle", lambda x: F.channel_shuffle(x, 2), h(1, 4, 2, 2))
exact("copysign_", lambda x, y: x.copysign_(y), h(3, grad=False), h(3, seed=1))
exact("heaviside_", lambda x, y: x.heaviside_(y), h(3, grad=False), h(3, seed=1, grad=False))
exact("max_unpool3d", lambda x: F.max_unpool3d(*F.max_pool3d(x, 2, return_indices=True), 2), h(1, 1, 2, 4, 2))
exact("reflection_pad1d", lambda x: F.pad(x, (1, 2), mode="reflect"), h(1, 2, 3))
exact("reflection_pad3d", lambda x: F.pad(x, (1, 1, 1, 1, 1, 1), mode="reflect"), h(1, 1, 2, 2, 2))
exact("replication_pad2d", lambda x: F.pad(x, (1, 0, 0, 1), mode="replicate"), h(1, 1, 2, 3, t=True))
exact("replication_pad3d", lambda x: F.pad(x, (1, 1, 1, 1, 1, 1), mode="replicate"), h(1, 1, 2, 2, 2))
exact("max_unpool2d", lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2), h(1, 1, 4, 4),
      backward=True)
exact("reflection_pad2d", lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"), h(1, 1, 3, 3))
exact("replication_pad1d", lambda x: F.pad(x, (2, 1), mode="replicate"), h(1, 2, 3, t=True))
exact("im2col", lambda x: F.unfold(x, 2), h(1, 1, 3, 3))
fused("reduction", "dot", torch.dot, h(3), h(3, seed=1), backward=True)
fused("reduction", "mv", torch.mv, h(3, 4, t=True), h(4, seed=1))
fused("reduction", "addmv", torch.addmv, h(3), h(3, 4), h(4, seed=1))
fused("reduction", "addr", torch.addr, h(3, 4), h(3, seed=1), h(4, seed=2))
fused("reduction", "trace", torch.trace, h(3, 3, t=True))
fused("reduction", "nansum dim", lambda x: torch.nansum(x, 1), h(3, 4), packet="nansum")
fused("reduction", "dist", torch.dist, h(3, 4), h(3, 4, seed=1), backward=True)
fused("reduction", "renorm", lambda x: torch.renorm(x, 2, 0, 1.0), h(3, 4))
fused("math", "fmod", lambda x: torch.fmod(x, 0.75), h(3, 4, t=True), backward=True)
fused("math", "remainder", torch.remainder, h(3, 4), h(3, 4, pos=True, seed=1))
fused("math", "div rounding_mode", lambda x, y: torch.div(x, y, rounding_mode="floor"), h(3, 4),
      h(3, 4, pos=True, seed=1), packet="div")
fused("math", "xlogy", torch.xlogy, h(3, 4, pos=True), h(3, 4, pos=True, seed=1), backward=True)
fused("math", "logaddexp", torch.logaddexp, h(3, 4), h(3, 4, seed=1))
fused("math", "sinc", torch.sinc, h(3, 4, t=True), backward=True)
fused("math", "logit_backward", lambda x: torch.logit(x / 4 + 0.5), h(3, 4), backward=True)
fused("math", "hypot", torch.hypot, h(3), h(3, seed=1), backward=True)
fused("math", "deg2rad", torch.deg2rad, h(2, 2))
fused("math", "linalg_cross", torch.linalg.cross, h(2, 3), h(2, 3, seed=1), backward=True)
fused("math", "floor_divide", torch.floor_divide, h(3, grad=False), h(3, pos=True, seed=1, grad=False))
fused("pad_fold", "reflection_pad1d_backward", lambda x: F.pad(x, (2, 2), mode="reflect"), h(1, 2, 3),
      backward=True)
fused("pad_fold", "replication_pad2d_backward", lambda x: F.pad(x, (1, 2, 2, 1), mode="replicate"), h(1, 1, 2, 3),
      backward=True)
fused("pad_fold", "col2im", lambda x: F.fold(x, (3, 3), 2), h(1, 4, 4))
fused("pad_fold", "unfold_backward", lambda x: x.unfold(0, 3, 2), h(7), backward=True)
fused("reduction", "_trilinear", lambda a, b, w: F.bilinear(a, b, w), h(2, 3), h(2, 4, seed=1), h(5, 3, 4, seed=2),
      backward=True)
fused("embedding_bag", "_embedding_bag", lambda w: F.embedding_bag(torch.tensor([1, 2, 0, 1]), w,
                                                                    torch.tensor([0, 2]), mode="mean"), h(3, 4),
      backward=True)
fused("reduction", "logcumsumexp", lambda x: torch.logcumsumexp(x, 0), h(3, 4, t=True), backward=True)
fused("weight_norm", "_weight_norm_interface", lambda v, g: torch._weight_norm(v, g, 0), h(3, 4), h(3, 1, seed=1))
fused("weight_norm", "_weight_norm_interface_backward", lambda v, g: torch._weight_norm(v, g, 1), h(3, 4, t=True),
      h(1, 4, seed=1), backward=True)

# The float32 route: what no table names.
case("allclose", torch.allclose, h(3, 4, t=True), h(3, 4, t=True), kind="float32")
case("allclose differing", torch.allclose, h(3, 4, t=True), h(3, 4, seed=1), kind="float32", packet="allclose")
case("equal 0-d", torch.equal, h(), h(), kind="float32")


# --- the comparison ---------------------------------------------------------------------------

def _leaves(out) -> list:
    if isinstance(out, (tuple, list)):
        return [y for x in out for y in _leaves(x)]
    return [out]


def _run(c: Case, makers):
    xs = [m() for m in makers]
    out = c.fn(*xs)
    if c.backward:
        outs = [o for o in _leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return xs, out


def _native(c: Case):
    """torch's own result (every sample has a float16 or bfloat16 CPU kernel in torch 2.x)."""
    return _run(c, c.inputs)


def _same_form(got, want, what: str) -> None:
    assert type(got) is type(want), f"{what}: {type(got).__name__}, torch gives {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, torch's {tuple(want.shape)}"
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, torch's {want.dtype}"
        assert got.requires_grad == want.requires_grad, f"{what}: requires_grad {got.requires_grad}"


def _close(got, want, what: str) -> None:
    if isinstance(want, torch.Tensor):
        if not want.is_floating_point():
            assert torch.equal(got, want), what
            return
        torch.testing.assert_close(got.detach().double(), want.detach().double(), rtol=2e-2, atol=2e-3,
                                   equal_nan=True, msg=what)
    elif isinstance(want, float):
        assert math.isclose(got, want, rel_tol=2e-2, abs_tol=2e-3) or (math.isnan(got) and math.isnan(want)), what
    else:
        assert got == want, what


def _bits(x):
    if not isinstance(x, torch.Tensor):
        return x
    x = x.detach()
    if x.is_floating_point():
        x = x.contiguous().view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])
    return x.tolist()


def _contiguous(v):
    if not isinstance(v, torch.Tensor):
        return v
    return v.detach().contiguous().requires_grad_(v.requires_grad)


def _under_mode(c: Case, makers):
    dev = Device("atlas-a2")
    with DeviceMode(dev, fused=c.fused) as mode:
        xs, out = _run(c, makers)
    return xs, out, mode


@pytest.mark.parametrize("c", [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.xfail)]
                                            if c.xfail else []) for c in CASES])
def test_each_route_gives_torchs_shape_dtype_and_requires_grad_by_its_tables_route(c: Case) -> None:
    xs0, want = _native(c)
    xs, got, mode = _under_mode(c, c.inputs)
    assert len(_leaves(got)) == len(_leaves(want))
    for i, (g, w) in enumerate(zip(_leaves(got), _leaves(want), strict=True)):
        _same_form(g, w, f"output {i}")
        if c.values:
            _close(g, w, f"output {i}'s values")
    if isinstance(want, torch.Tensor) and any(want is x for x in xs0):  # in place or out=: the destination itself
        assert any(got is x for x in xs)
    if c.backward:
        for i, (x, x0) in enumerate(zip(xs, xs0, strict=True)):
            if isinstance(x0, torch.Tensor) and x0.grad is not None:
                _same_form(x.grad, x0.grad, f"operand {i}'s gradient")
                if c.values:
                    _close(x.grad, x0.grad, f"operand {i}'s gradient's values")
    # The route: every call of the packet counted under the sample's kind, and no other call took
    # the float32 route (unless that is the sample's).
    mine = {route for (name, route), n in mode.routes.items() if name.split(".")[1] == c.packet and n}
    assert mine == {c.kind}, f"{c.packet}: routes {mine}, the table says {c.kind}; {dict(mode.routes)}"
    if c.kind != "float32":
        assert not [n for n, route in mode.routes if route == "float32"], dict(mode.routes)
    # The result does not depend on the operands' strides: contiguous copies give the same bits.
    if any(isinstance(m(), torch.Tensor) and not m().is_contiguous() for m in c.inputs) and c.values:
        contiguous = [(lambda m=m: _contiguous(m())) for m in c.inputs]
        _, again, _ = _under_mode(c, contiguous)
        assert [_bits(o) for o in _leaves(again)] == [_bits(o) for o in _leaves(got)]


def test_the_samples_cover_every_route_of_the_tables() -> None:
    covered = {(c.kind, c.packet) for c in CASES}
    packets = {p for _, p in covered}
    missing = [str(p) for p in ROUTES if str(p).split(".")[-1] not in packets]
    assert not missing, f"ROUTES without a sample: {missing}"
    # reshape is CompositeImplicitAutograd: torch decomposes it above the mode (view, or clone and
    # _unsafe_view, sampled as "reshape transposed" and "reshape 0-d").
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::reshape", "CompositeImplicitAutograd")
    missing = [str(p) for p in EXACT if ("exact", str(p).split(".")[-1]) not in covered | {("exact", "reshape")}]
    assert not missing, f"EXACT without a sample: {missing}"
    families = {c.id.split(":")[0] for c in CASES if c.kind == "fused"}
    assert families == {f.name for f in FAMILIES}


# --- what users do with a loss (item 8) -----------------------------------------------------------

def test_reductions_refuse_dims_out_of_range_as_torch_does() -> None:
    x = torch.ones(2, 3, dtype=H)
    for fn, dim in ((torch.sum, 5), (torch.amax, -3), (torch.mean, (0, 2)), (torch.sum, 1),  # device routes
                    (torch.var, 5), (torch.std, -3), (torch.logsumexp, 5), (torch.var, 1)):  # fused
        arg = x if dim != 1 else x[0, 0]  # a 0-d tensor has dimensions 0 and -1 only
        with pytest.raises(IndexError), DeviceMode(Device("atlas-a2")):
            fn(arg, dim)


def test_losses_format_stack_cat_and_read_as_numbers_under_the_mode() -> None:
    x = torch.tensor([1.0, 2.0, 4.0], dtype=H, requires_grad=True)
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=H)
    with DeviceMode(Device("atlas-a2")) as mode:
        loss = (x * x).mean()  # 21 / 3 = 7 exactly
        other = x.sum()  # 7
        ce = F.cross_entropy(logits, torch.tensor([0, 1]))
        assert loss.shape == () and f"{loss:.4f}" == "7.0000" and f"{other}" == f"{torch.tensor(7.0)}" == "7.0"
        assert loss.item() == 7.0 and float(loss) == 7.0 and loss.tolist() == 7.0 and bool(loss)
        assert torch.stack([loss, other]).shape == (2,)
        assert torch.cat([loss.unsqueeze(0), other.unsqueeze(0)]).tolist() == [7.0, 7.0]
        assert [t.item() for t in torch.stack([loss, other]).unbind()] == [7.0, 7.0]
        # ln(e^2 + 2) - 2 and ln 3, their mean, in float64: 0.8261...
        want = (math.log(math.exp(2) + 2) - 2 + math.log(3)) / 2
        assert ce.shape == () and abs(float(ce) - want) < 2e-3 and f"{ce:.2f}" == f"{want:.2f}"
        loss.backward()
    assert x.grad.shape == (3,) and x.grad.dtype == H
    assert torch.allclose(x.grad.double(), torch.tensor([2.0, 4.0, 8.0], dtype=torch.float64) / 3, rtol=1e-3)
    assert mode.routes["aten._local_scalar_dense.default", "exact"] >= 5
    assert not [n for n, route in mode.routes if route == "float32"]


def test_clip_grad_norm_clips_under_the_mode() -> None:
    w = torch.tensor([[3.0, 0.0], [0.0, 4.0]], dtype=H, requires_grad=True)
    b = torch.tensor([0.0, 0.0], dtype=H, requires_grad=True)
    x = torch.tensor([[1.0, 1.0]], dtype=H)
    dev = Device("atlas-a2")
    with DeviceMode(dev) as mode:
        loss = F.linear(x, w, b).sum()  # gradients: w's all ones, b's ones: norm sqrt(6)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_([w, b], 1.0)
        assert norm.shape == () and norm.dtype == H and f"{norm:.3f}" == f"{math.sqrt(6):.3f}"
    coef = 1.0 / (float(np.float16(math.sqrt(6))) + 1e-6)
    for p in (w, b):
        assert p.grad.dtype == H and torch.allclose(p.grad.double(), torch.full(p.shape, coef, dtype=torch.float64),
                                                    rtol=2e-3)
    assert not dev.get_float_status().any()
    assert any(name.startswith("aten._foreach_mul_") for name, _ in mode.routes)


def test_grad_scaler_scales_a_0d_float16_loss_into_binary32_as_torchs_does() -> None:
    from lossscale.torch import GradScaler

    def loss() -> torch.Tensor:
        return torch.tensor(3.0, dtype=H, requires_grad=True)

    native = torch.amp.GradScaler("cpu", init_scale=2.0**16).scale(loss())
    assert native.shape == () and native.dtype == F32 and native.item() == 196608.0  # torch's promotion
    dev = Device("atlas-a2")
    scaler = GradScaler(dev)
    outside = scaler.scale(loss())
    with DeviceMode(dev) as mode:
        inside = scaler.scale(loss())
        listed = scaler.scale([loss(), loss()])
    for got in (outside, inside, *listed):
        assert got.shape == () and got.dtype == F32 and got.requires_grad and got.item() == 196608.0
    assert not dev.get_float_status().any(), "a 0-d float16 loss times 2**16 is binary32 196608: no overflow"
    assert mode.routes["aten.mul.Tensor", "device"] == 3
    # A dimensioned float16 loss keeps its dtype, as torch's does: 196608 overflows binary16.
    native = torch.amp.GradScaler("cpu", init_scale=2.0**16).scale(torch.tensor([3.0], dtype=H))
    with DeviceMode(dev):
        got = scaler.scale(torch.tensor([3.0], dtype=H))
    assert got.shape == native.shape == (1,) and got.dtype == native.dtype == H and math.isinf(got.item())
    assert dev.get_float_status().any()
