"""The fused recurrent kernel (sim.recurrent) against its oracle: torch's own decomposition of
nn.RNN / nn.LSTM / nn.GRU evaluated operation by operation in Binary32Mode, forward and autograd's
backward, bit for bit, with the same events; and under DeviceMode as one fused kernel."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import sim  # noqa: E402
from sim import recurrent  # noqa: E402
from sim import torch_binary32 as b32  # noqa: E402
from sim.torch import DeviceMode  # noqa: E402

nn = torch.nn


def _decomposed(kind, x, hx, params, flags, grads, seed, batch_sizes=None):
    """torch.<kind> as torch's CPU decomposition (oneDNN off: its LSTM is one host-dependent call)
    in Binary32Mode: outputs, input gradients by autograd, and the events of each pass. With
    ``batch_sizes``, x is a packed sequence's data (torch's packed overload, which has no
    batch_first)."""
    fn = getattr(torch, kind)
    leaves = [t.clone().requires_grad_(True) for t in [x, *hx, *params]]
    h, ps = leaves[1:1 + len(hx)], leaves[1 + len(hx):]
    head = (leaves[0],) if batch_sizes is None else (leaves[0], batch_sizes)
    tail = flags if batch_sizes is None else flags[:-1]
    torch.manual_seed(seed)
    with torch.enable_grad(), torch.backends.mkldnn.flags(enabled=False):
        outs, events = b32.run(lambda: list(fn(*head, tuple(h) if kind == "lstm" else h[0], ps, *tail)),
                               [x, *hx, *params])
        pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if g is not None]
        with b32.Binary32Mode() as mode:
            gs = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)
    assert not mode.host  # every operation modelled: the oracle's bits are the same on every host
    back = b32.judge([g for g in gs if g is not None], [x, *hx, *params, *[g for g in grads if g is not None]])
    return [o.detach() for o in outs], events, list(gs), back


def _fused(kind, x, hx, params, flags, grads, seed, batch_sizes=None):
    has_biases, layers, p, train, bidirectional, batch_first = flags
    keep, p = None, (p if train else 0.0)
    if 0 < p < 1 and layers > 1:
        torch.manual_seed(seed)
        width = hx[0].shape[2] * (2 if bidirectional else 1)
        rows = (x.shape[0],) if batch_sizes is not None else (
            (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1]))
        keep = [b32.bernoulli_mask((*rows, width), 1 - p).numpy() for _ in range(layers - 1)]
    outs, tape, flags_fwd = recurrent.forward(kind, x.numpy(), [h.numpy() for h in hx], [w.numpy() for w in params],
                                              has_biases=has_biases, num_layers=layers, bidirectional=bidirectional,
                                              batch_first=batch_first, dropout=p, keep=keep,
                                              batch_sizes=None if batch_sizes is None else batch_sizes.numpy())
    outs = [torch.from_numpy(o) for o in outs]
    events = b32.judge(outs, [x, *hx, *params], flags_fwd)
    gs, flags_back = recurrent.backward(tape, [None if g is None else g.numpy() for g in grads])
    gs = [None if g is None else torch.from_numpy(np.ascontiguousarray(g)) for g in gs]
    back = b32.judge([g for g in gs if g is not None], [x, *hx, *params, *[g for g in grads if g is not None]],
                     flags_back)
    return outs, events, gs, back


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same shape and bits (any NaN for a NaN: which NaN an addition propagates is the CPU's)."""
    if a.shape != b.shape:
        return False
    a, b = a.detach().contiguous().numpy(), b.detach().contiguous().numpy()
    return bool(((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))).all())


def _case(kind, layers=1, bidirectional=False, bias=True, batch_first=False, proj=0, steps=4, batch=3, size=4,
          hidden=5, p=0.0, train=False, used=(True, True, True), values=None, seed=0, lengths=None):
    """One configuration's operands; ``lengths``: a packed sequence of those lengths (any order)."""
    if lengths is not None:
        steps, batch, batch_first = max(lengths), len(lengths), False
    torch.manual_seed(seed)
    kw = dict(num_layers=layers, bidirectional=bidirectional, bias=bias, batch_first=batch_first)
    if kind.startswith("rnn"):
        module = nn.RNN(size, hidden, nonlinearity=kind[4:], **kw)
    else:
        module = (nn.LSTM if kind == "lstm" else nn.GRU)(size, hidden, **kw, **({"proj_size": proj} if proj else {}))
    params = [w.detach().half().float() for w in module._flat_weights]
    dirs, out = (2 if bidirectional else 1), proj or hidden
    x = torch.randn((batch, steps, size) if batch_first else (steps, batch, size))
    if values is not None:
        x = torch.tensor(values, dtype=torch.float32)[torch.randint(len(values), x.shape)]
    x = x.half().float()
    hx = [torch.randn(layers * dirs, batch, out)] + ([torch.randn(layers * dirs, batch, hidden)] if kind == "lstm"
                                                     else [])
    hx = [h.half().float() for h in hx]
    shapes = [(batch, steps, dirs * out) if batch_first else (steps, batch, dirs * out), (layers * dirs, batch, out),
              (layers * dirs, batch, hidden)][:3 if kind == "lstm" else 2]
    batch_sizes = None
    if lengths is not None:
        packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=False)
        x, batch_sizes = packed.data, packed.batch_sizes
        shapes[0] = (len(x), dirs * out)
    grads = [torch.randn(s).half().float() if u else None for s, u in zip(shapes, used, strict=False)]
    flags = (bias, layers, p, train, bidirectional, batch_first)
    return kind, x, hx, params, flags, grads, seed, batch_sizes


def _check(case):
    got, want = _fused(*case), _decomposed(*case)
    outs, events, grads, back = got
    r_outs, r_events, r_grads, r_back = want
    assert all(_same(a, b) for a, b in zip(outs, r_outs, strict=True))
    assert events == r_events and back == r_back
    for g, r in zip(grads, r_grads, strict=True):
        assert (g is None) == (r is None) and (g is None or _same(g, r))


GRID = list(itertools.product(recurrent.KINDS, [1, 2], [False, True], [True, False], [False, True]))


@pytest.mark.parametrize("kind,layers,bidirectional,bias,batch_first", GRID)
def test_every_configuration_is_torchs_decomposition_bit_for_bit(kind, layers, bidirectional, bias, batch_first):
    _check(_case(kind, layers, bidirectional, bias, batch_first))


@pytest.mark.parametrize("bidirectional,bias", [(False, True), (True, False)])
def test_lstm_projections_are_torchs_decomposition(bidirectional, bias):
    _check(_case("lstm", 2, bidirectional, bias, proj=3))


@pytest.mark.parametrize("kind", list(recurrent.KINDS))
def test_dropout_between_layers_draws_torchs_masks(kind):
    """Dropout between layers in training: the kernel's masks, drawn before it, are the ones the
    decomposition draws as it goes (one a layer), and its arithmetic the same."""
    _check(_case(kind, 3, True, p=0.4, train=True, seed=3))
    _check(_case(kind, 2, p=1.0, train=True))  # everything dropped: no draw, the input times 0


@pytest.mark.parametrize("kind", list(recurrent.KINDS))
@pytest.mark.parametrize("used", [(True, False, False), (False, True, False), (False, False, True)])
def test_outputs_the_loss_does_not_use_send_no_gradient(kind, used):
    """An unused output adds nothing (not +0, which would turn a -0 gradient into +0); an LSTM used
    only through its final cell state leaves its last output gate without a gradient."""
    if kind != "lstm" and used[2]:
        used = (False, True, False)
    _check(_case(kind, 2, used=used, seed=1))


SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.0 ** -24, 65504.0, -65504.0, 30000.0, float("inf"), float("-inf"), float("nan")]


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(list(recurrent.KINDS)), values=st.lists(st.sampled_from(SPECIAL), min_size=1, max_size=4),
       seed=st.integers(0, 2**16), bidirectional=st.booleans())
def test_extreme_inputs_give_the_decompositions_values_and_events(kind, values, seed, bidirectional):
    """Inputs of zeros of either sign, binary16's extremes, infinities and NaNs (saturating the gates,
    overflowing the products, NaN through the recurrence): the same values and events."""
    _check(_case(kind, 2, bidirectional, values=values, seed=seed))


LENGTHS = [[4, 2, 1], [3, 3, 3], [5, 3, 3, 1], [1, 2, 2]]


@pytest.mark.parametrize("kind,layers,bidirectional,bias", list(itertools.product(recurrent.KINDS, [1, 2],
                                                                                   [False, True], [True, False])))
def test_a_packed_sequence_is_torchs_packed_decomposition_bit_for_bit(kind, layers, bidirectional, bias):
    """PackedLayer and ReversedPackedLayer: rows leaving (forward) and joining (reverse) the batch,
    lengths equal or not, in any order (pack_padded_sequence sorts them)."""
    for lengths in LENGTHS:
        _check(_case(kind, layers, bidirectional, bias, lengths=lengths, seed=len(lengths)))


@pytest.mark.parametrize("kind", list(recurrent.KINDS))
def test_a_packed_sequence_with_dropout_unused_outputs_and_signed_zeros(kind):
    """Dropout between packed layers (masks over the data), outputs the loss does not use, and
    zeros of either sign among inputs and gradients (autograd's +0 outside a slice's rows)."""
    _check(_case(kind, 3, True, p=0.4, train=True, seed=3, lengths=[4, 2, 2, 1]))
    for used in [(True, False, False), (False, True, False), (False, False, True)]:
        if kind != "lstm" and used[2]:
            used = (False, True, True)
        _check(_case(kind, 2, True, used=used, seed=1, lengths=[3, 1, 2]))
    _check(_case(kind, 2, True, values=[0.0, -0.0, 1.0], seed=5, lengths=[4, 2, 1]))


def test_packed_lstm_projections():
    _check(_case("lstm", 2, True, proj=3, lengths=[4, 2, 1]))


def test_an_unknown_kind_or_a_dropout_without_masks_is_refused():
    x, h = np.zeros((1, 1, 1), np.float32), [np.zeros((2, 1, 1), np.float32)]
    with pytest.raises(ValueError, match="unknown recurrent kind 'lstm2'.*lstm, gru, rnn_tanh, rnn_relu"):
        recurrent.forward("lstm2", x, h, [], has_biases=False, num_layers=1, bidirectional=False, batch_first=False)
    for p, keep in ((0.5, None), (1.5, None), (-0.1, [])):
        with pytest.raises(ValueError, match=f"dropout {p} needs a probability in \\[0, 1\\].*1 layers"):
            recurrent.forward("gru", x, h, [], has_biases=False, num_layers=2, bidirectional=False,
                              batch_first=False, dropout=p, keep=keep)


@pytest.mark.parametrize("cls,kind", [(nn.LSTM, "lstm"), (nn.GRU, "gru"), (nn.RNN, "rnn_tanh")])
def test_a_recurrent_model_with_dropout_is_one_kernel_whatever_the_hosts_onednn(cls, kind):
    """Under DeviceMode nn.LSTM / GRU / RNN with dropout between layers in training are one fused
    kernel each way (strict accepts them), and oneDNN (torch's own LSTM kernel, which depends on the
    host) takes no part: the results are the same bits with it on and off."""
    results = []
    for onednn in (True, False):
        torch.manual_seed(7)
        model = cls(4, 6, num_layers=2, dropout=0.3, batch_first=True).half()
        x = torch.randn(2, 5, 4).half()
        with torch.backends.mkldnn.flags(enabled=onednn), DeviceMode(sim.Device("atlas-training"),
                                                                     strict=True) as mode:
            out = model(x)[0]
            out.float().sum().backward()
        assert mode.routes[f"aten.{kind}", "fused"] == 1 and mode.routes[f"aten.{kind}_backward", "fused"] == 1
        results.append([out, *[p.grad for p in model.parameters()]])
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(*results, strict=True))
