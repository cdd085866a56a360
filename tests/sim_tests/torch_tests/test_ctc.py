"""CTC loss and its gradient in Binary32Mode (torch's CPU recurrences in binary32, exp and log
correctly rounded) against float64, over lengths, repeated labels, empty targets and alignments
that cannot exist; and under DeviceMode as one fused kernel each way, its log-space alphas' -inf
not taken for events."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from sim import Device  # noqa: E402
from sim import torch_binary32 as tb  # noqa: E402
from sim.torch import DeviceMode  # noqa: E402

aten = torch.ops.aten


def _both(lp, tg, il, tl, zero_infinity=False):
    """(loss, gradient) in Binary32Mode and natively in float64 from the same operands."""
    g = torch.linspace(0.5, 1.5, lp.shape[1])
    with tb.Binary32Mode(strict=True):
        nll, alpha = aten._ctc_loss.Tensor(lp, tg, il, tl, 0, zero_infinity)
        grad = aten._ctc_loss_backward.Tensor(g, lp, tg, il, tl, nll, alpha, 0, zero_infinity)
    nll64, alpha64 = aten._ctc_loss.Tensor(lp.double(), tg, il, tl, 0, zero_infinity)
    grad64 = aten._ctc_loss_backward.Tensor(g.double(), lp.double(), tg, il, tl, nll64, alpha64, 0, zero_infinity)
    return (nll, grad), (nll64, grad64)


def _close(a: torch.Tensor, w: torch.Tensor, spread: float = 1.0) -> None:
    """The same infinities and NaNs, the finite values within binary32's rounding of float64's;
    ``spread``: how many times that rounding a value's inputs carry into it (the gradient's
    exp((collected + loss) - lp) rounds an argument as large as the loss and the log-probabilities,
    and its exponential carries that error relative to it)."""
    assert torch.equal(a.isnan(), w.isnan()) and torch.equal(a.isinf(), w.isinf())
    assert torch.equal(a[a.isinf()], w[w.isinf()].float())
    finite = w.isfinite()
    scale = 1 + (float(w[finite].abs().max()) if finite.any() else 0.0)
    assert np.allclose(a[finite].double(), w[finite], rtol=2**-19 * spread, atol=2**-20 * scale * spread)


@settings(max_examples=80, deadline=None)
@given(steps=st.integers(1, 7), batch=st.integers(1, 3), classes=st.integers(2, 5), seed=st.integers(0, 2**16),
       flat=st.booleans(), repeats=st.booleans(), zero_infinity=st.booleans(), data=st.data())
def test_loss_and_gradient_are_within_binary32_of_float64(steps, batch, classes, seed, flat, repeats, zero_infinity,
                                                          data) -> None:
    g = torch.Generator().manual_seed(seed)
    lp = (torch.randn(steps, batch, classes, generator=g) * 3).log_softmax(2)
    il = torch.tensor(data.draw(st.lists(st.integers(0, steps), min_size=batch, max_size=batch)))
    tl = torch.tensor(data.draw(st.lists(st.integers(0, steps), min_size=batch, max_size=batch)))  # some impossible
    width = max(1, int(tl.max()))
    tg = torch.randint(1, classes, (batch, width), generator=g)
    if repeats:
        tg[:, 1::2] = tg[:, :1]
    if flat:
        tg = torch.cat([tg[b, :int(n)] for b, n in enumerate(tl)])
    (nll, grad), (nll64, grad64) = _both(lp, tg, il, tl, zero_infinity)
    _close(nll, nll64)
    losses = nll64[nll64.isfinite()]
    _close(grad, grad64, 1 + (float(losses.abs().max()) if len(losses) else 0.0) + float(lp.abs().max()))


def test_an_alignment_that_cannot_exist_is_an_infinite_loss_and_zero_infinity_a_zero_gradient() -> None:
    lp = torch.randn(2, 1, 4).log_softmax(2)
    tg, il, tl = torch.tensor([[1, 2, 3]]), torch.tensor([2]), torch.tensor([3])
    (nll, grad), _ = _both(lp, tg, il, tl, zero_infinity=True)
    assert nll.tolist() == [float("inf")] and (grad == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_device_takes_ctc_as_one_fused_kernel_each_way(dtype) -> None:
    """F.ctc_loss on binary16 or bfloat16 log-probabilities: one fused call forward and one backward,
    their results the binary32 model's rounded once, the register clear though the alphas hold
    -inf; an alignment that cannot exist makes an infinite loss from finite operands, the log of
    zero: a division by zero on the register (the loss 65504 in saturation mode)."""
    g = torch.Generator().manual_seed(2)
    lp = torch.randn(6, 2, 5, generator=g).log_softmax(2).to(dtype).requires_grad_()
    tg, il, tl = torch.tensor([[1, 2, 2], [3, 4, 1]]), torch.tensor([6, 5]), torch.tensor([3, 2])
    dev = Device("atlas-training" if dtype == torch.float16 else "atlas-a2")
    with DeviceMode(dev, strict=True) as mode:
        loss = F.ctc_loss(lp, tg, il, tl, reduction="sum")
        loss.backward()
    assert mode.routes["aten._ctc_loss.Tensor", "fused"] == 1
    assert mode.routes["aten._ctc_loss_backward.Tensor", "fused"] == 1
    assert not dev.get_float_status().any() and torch.isfinite(lp.grad).all()
    with tb.Binary32Mode(strict=True):
        want = aten._ctc_loss.Tensor(lp.detach().float(), tg, il, tl, 0, False)[0]
    assert abs(float(loss) - float(want.sum())) <= 2 * float(torch.finfo(dtype).eps) * float(want.sum())
    with DeviceMode(dev, strict=True):
        impossible = F.ctc_loss(lp.detach(), torch.tensor([[1, 2, 3, 4, 1, 2, 3]] * 2), il, torch.tensor([7, 7]),
                                reduction="none")
    assert (impossible == 65504).all() if dtype == torch.float16 else impossible.isinf().all()
    assert dev.get_float_status()[2] == 1
