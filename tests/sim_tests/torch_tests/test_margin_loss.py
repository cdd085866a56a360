"""The multi-margin loss and its gradient in Binary32Mode against a loop over binary32 scalars in
the order of torch's CPU kernel (aten/src/ATen/native/LossMultiMargin.cpp): the inputs aimed at
its edges (a margin met exactly, NaN, infinities, signed zeros in the weights), bit for bit; and
the loss as DeviceMode's fused route, forward and backward."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from sim import Device  # noqa: E402
from sim import torch_binary32 as tb  # noqa: E402
from sim.torch import DeviceMode  # noqa: E402

aten = torch.ops.aten
F32, F64 = np.float32, np.float64
EDGES = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 1.5, 2.0, 1e-3, 3e38, -3e38, np.inf, -np.inf, np.nan]


def _loop(x, target, p, margin, weight, reduction, grad):
    """(loss, its input gradient) as torch's kernel computes them, one binary32 operation at a time."""
    x = np.asarray(x, F32).reshape(-1, x.shape[-1] if x.ndim else 1)
    n, c = x.shape
    margin = F32(margin)
    rows, gin = [], np.zeros((n, c), F32)
    g = F32(1.0 / (n * c)) if reduction == 1 else F32(1.0 / c)
    with np.errstate(all="ignore"):
        for i in range(n):
            t = int(target.reshape(-1)[i])
            s, gt = F32(0), F32(0)
            for d in range(c):
                z = F32(F32(margin - x[i, t]) + x[i, d])
                if d == t or not z > 0:
                    continue
                h = z if p == 1 else F32(z * z)
                hg = g if p == 1 else F32(F32(F32(2) * g) * z)
                if weight is not None:
                    h, hg = F32(h * weight[t]), F32(hg * weight[t])
                s = F32(s + h)
                gt = F32(gt - hg)
                gin[i, d] = hg
            gin[i, t] = gt
            rows.append(F32(s / F32(c)))
        total = F64(0)
        for r in rows:
            total = F64(total + F64(r))
        reduced = F32(total / n if reduction == 1 else total)
        loss = np.array(rows, F32) if reduction == 0 and target.ndim > 0 else reduced
        go = np.asarray(grad, F32).reshape(-1)
        scale = go[:1] if reduction != 0 or np.ndim(grad) == 0 else go[:, None]
        return loss, (gin * scale).astype(F32)


def _bits(a):
    a = np.asarray(a, F32)
    return np.where(np.isnan(a), F32(np.nan), a).view(np.int32).tolist()


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 4), c=st.integers(1, 20), p=st.sampled_from([1, 2]), reduction=st.sampled_from([0, 1, 2]),
       margin=st.sampled_from([1.0, 0.5, 0.0, -1.0]), weighted=st.booleans(), one_d=st.booleans(), data=st.data())
@example(n=1, c=2, p=1, reduction=1, margin=1.0, weighted=False, one_d=False, data=None)  # z == 0 exactly
def test_the_loss_and_its_gradient_are_the_kernels_loop(n, c, p, reduction, margin, weighted, one_d, data) -> None:
    values = st.sampled_from(EDGES) | st.floats(-4, 4, width=32)
    if data is None:
        x, target, weight = np.array([[0.5, -0.5]], F32), np.array([0]), None
    else:
        x = np.array(data.draw(st.lists(values, min_size=n * c, max_size=n * c)), F32).reshape(n, c)
        target = np.array(data.draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)))
        weight = np.array(data.draw(st.lists(values, min_size=c, max_size=c)), F32) if weighted else None
    if one_d:
        x, target = x[0], target[0]
    xt, tt = torch.from_numpy(x), torch.from_numpy(np.asarray(target))
    wt = None if weight is None else torch.from_numpy(weight)
    with tb.Binary32Mode(strict=True):
        loss = aten.multi_margin_loss(xt, tt, p, margin, wt, reduction)
        grad = torch.full(loss.shape, 0.75)
        gin = aten.multi_margin_loss_backward(grad, xt, tt, p, margin, wt, reduction)
    want, want_grad = _loop(x, np.asarray(target), p, margin, weight, reduction, grad.numpy())
    assert tuple(loss.shape) == np.shape(want) and tuple(gin.shape) == x.shape
    assert _bits(loss) == _bits(want)
    assert _bits(gin) == _bits(want_grad.reshape(x.shape))


def test_a_margin_met_exactly_counts_nothing() -> None:
    """z = margin - x[target] + x[d] = 0 exactly: the kernel's z > 0 counts no term and no gradient
    (autograd of a clamp would pass one)."""
    x, target = torch.tensor([[0.5, -0.5]]), torch.tensor([0])
    with tb.Binary32Mode(strict=True):
        loss = aten.multi_margin_loss(x, target, 1, 1.0, None, 1)
        gin = aten.multi_margin_loss_backward(torch.tensor(1.0), x, target, 1, 1.0, None, 1)
    assert loss.item() == 0.0 and gin.tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_device_takes_the_loss_as_a_fused_kernel(dtype) -> None:
    """F.multi_margin_loss on binary16 or bfloat16: one fused call forward and one backward, the
    binary32 model's results rounded once, the register clear."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 5, generator=g).to(dtype).requires_grad_()
    target = torch.tensor([0, 4, 2, 2])
    dev = Device("atlas-training" if dtype == torch.float16 else "atlas-a2")
    with DeviceMode(dev, strict=True) as mode:
        loss = torch.nn.functional.multi_margin_loss(x, target, p=2, margin=0.5)
        loss.backward()
    assert mode.routes["aten.multi_margin_loss.default", "fused"] == 1
    assert mode.routes["aten.multi_margin_loss_backward.default", "fused"] == 1
    with tb.Binary32Mode(strict=True):
        x32 = x.detach().float()
        want = aten.multi_margin_loss(x32, target, 2, 0.5, None, 1)
        want_grad = aten.multi_margin_loss_backward(torch.tensor(1.0), x32, target, 2, 0.5, None, 1)
    assert loss.dtype == dtype and loss.shape == () and torch.equal(loss, want.to(dtype))
    assert torch.equal(x.grad, want_grad.to(dtype)) and not dev.get_float_status().any()
