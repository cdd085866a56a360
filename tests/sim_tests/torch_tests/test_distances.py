"""cdist's and pdist's gradients in Binary32Mode: torch's CPU kernel (DistanceOpsKernel.cpp) term by
term and in its order of addition. For p = 0, 1, 2 and infinity that kernel is IEEE operations only
(no power, no contraction), the same bits on every host, so it is the oracle, bit for bit; for
other p (correctly rounded powers here, the host's there) within one rounding of float64."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from sim import torch_binary32 as tb  # noqa: E402

aten = torch.ops.aten
INF = float("inf")


def _rows(data, n, m, seed):
    """n rows of m values, some rows repeated (zero distances) and some entries equal (zero differences)."""
    x = torch.randn(n, m, generator=torch.Generator().manual_seed(seed))
    for r in data.draw(st.lists(st.integers(1, max(n - 1, 1)), max_size=2)):
        if r < n:
            x[r] = x[r - 1]
    if data.draw(st.booleans()) and n > 1:
        x[1, 0] = x[0, 0]
    return x


@settings(max_examples=60, deadline=None)
@given(p=st.sampled_from([0.0, 1.0, 2.0, INF]), n=st.integers(1, 6), r=st.integers(1, 5), m=st.integers(1, 9),
       batch=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_cdist_and_pdist_gradients_are_the_kernels_bits(p, n, r, m, batch, seed, data) -> None:
    x1, x2 = _rows(data, n, m, seed), torch.cat([_rows(data, n, m, seed)[:1], _rows(data, r, m, seed + 1)])
    if batch:
        x1, x2 = torch.stack([x1, x1.flip(0)]), torch.stack([x2, x2 * 2])
    d = torch.cdist(x1, x2, p)
    g = torch.randn(d.shape, generator=torch.Generator().manual_seed(seed + 2))
    with tb.Binary32Mode(strict=True):
        got = aten._cdist_backward(g, x1, x2, p, d)
    assert torch.equal(got.view(torch.int32), aten._cdist_backward(g, x1, x2, p, d).view(torch.int32))
    x = _rows(data, n + 1, m, seed + 3)
    d = torch.pdist(x, p)
    g = torch.randn(d.shape, generator=torch.Generator().manual_seed(seed + 4))
    with tb.Binary32Mode(strict=True):
        got = aten._pdist_backward(g, x, p, d)
    assert torch.equal(got.view(torch.int32), aten._pdist_backward(g, x, p, d).view(torch.int32))


@pytest.mark.parametrize("p", [0.5, 1.5, 3.0])
def test_other_powers_are_within_one_rounding_of_float64(p) -> None:
    gen = torch.Generator().manual_seed(7)
    x1, x2 = torch.randn(4, 6, generator=gen), torch.randn(5, 6, generator=gen)
    x2[0] = x1[0]
    x2[1, 2] = x1[1, 2]  # a zero difference where the distance is not zero
    d = torch.cdist(x1, x2, p)
    g = torch.randn(d.shape, generator=gen)
    with tb.Binary32Mode(strict=True):
        got = aten._cdist_backward(g, x1, x2, p, d)
        got_p = aten._pdist_backward(g[0, :3], x1[:3], p, torch.pdist(x1[:3], p))
    want = aten._cdist_backward(g.double(), x1.double(), x2.double(), p, d.double())
    want_p = aten._pdist_backward(g[0, :3].double(), x1[:3].double(), p, torch.pdist(x1[:3], p).double())
    for a, w in ((got, want), (got_p, want_p)):
        assert np.allclose(a.numpy(), w.numpy(), rtol=2**-20, atol=2**-20 * float(w.abs().max()))
