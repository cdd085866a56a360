"""torch's recurrent layers in binary32, forward and backward, as one kernel: the fused recurrent
kernels' model (``nn.RNN``, ``nn.LSTM``, ``nn.GRU``; ``torch.rnn_tanh``, ``rnn_relu``, ``lstm``, ``gru``).

The arithmetic is torch's CPU decomposition of these layers (aten/src/ATen/native/RNN.cpp:
``FullLayer``, ``ReversedFullLayer``, ``BidirectionalLayer``, ``apply_layer_stack`` and the cells
``SimpleCell``, ``LSTMCell``, ``GRUCell``) with every operation in binary32 and the same bits on
every host: each layer's input gates for all steps at once (``linear_ih``: the product in order
along the input features, then the bias added), then step by step the hidden gates (``linear_hh``:
the product in order, then the bias), the gates' sigmoid and tanh each rounded once from their
exact values (``sim.elementary``), ``+ - *`` IEEE binary32 in the cells' order, a projection
(``proj_size``) a product in order; dropout between layers in training multiplies by the mask
divided by ``1 - p`` (``at::dropout``: the mask from the caller, one rounding each).

The backward is autograd's of that decomposition, in its order: each step's weight and bias
gradients (the bias's the pairwise binary32 tree over the batch) added from the last step to the
first, a GRU hidden state's three gradients added as (output + reset path) + product, the input
gates' gradients in one product for the inputs and one for ``w_ih`` in order over steps and
batch. So a layer costs its products and a few vector operations a step, against dozens of
dispatched operations a step for the decomposition.

A packed sequence (``PackedLayer``, ``ReversedPackedLayer``) runs each step's cell on the rows
still in it, the others' states kept; autograd's sums there include the +0 that a slice's
gradient holds outside its rows (a -0 becomes +0 as it does in torch's).

Arrays are numpy binary32: ``x`` (T, B, I), or (B, T, I) with ``batch_first``, or a packed
sequence's data (N, I) with its ``batch_sizes``; ``hx`` the initial states, each (layers *
directions, B, H); ``params`` torch's flat weights, for each layer and direction ``w_ih, w_hh[,
b_ih, b_hh][, w_hr]``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from . import binary32, elementary
from . import kernels as K

__all__ = ["KINDS", "Tape", "forward", "backward"]

#: The recurrent kinds, torch's function names, and the gates of each (the rows of w_ih per unit).
KINDS = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
_F32 = np.float32
_ZERO = _F32(0)


class _Flags:
    """The elementwise functions' flags, ORed (``value``, read once the pass is done); kept as
    arrays and ORed a megabyte at a time, not one small reduction per call."""

    def __init__(self) -> None:
        self._seen: list[np.ndarray] = []
        self._size = 0
        self._value = 0

    def __call__(self, name: str, *xs: np.ndarray) -> np.ndarray:
        values, flags = elementary.evaluate(name, *xs)
        self._seen.append(flags.reshape(-1))
        self._size += flags.size
        if self._size >= 1 << 20:
            self._fold()
        return values

    def _fold(self) -> None:
        if self._seen:
            self._value |= int(np.bitwise_or.reduce(np.concatenate(self._seen), axis=None))
        self._seen, self._size = [], 0

    @property
    def value(self) -> int:
        self._fold()
        return self._value


def _mm(a: np.ndarray, bt: np.ndarray) -> np.ndarray:
    """a (M, K) @ bt (K, N) in binary32, in order along K from +0 (``binary32.matmul``)."""
    out = np.zeros((a.shape[0], bt.shape[1]), _F32)
    K.matmul32(np.ascontiguousarray(a), np.ascontiguousarray(bt), out)
    return out


def _added(acc: np.ndarray | None, g: np.ndarray | None) -> np.ndarray | None:
    """acc + g, an absent gradient adding nothing (not +0, which would turn a -0 into +0)."""
    if g is None:
        return acc
    return g if acc is None else acc + g


@dataclass
class _Direction:
    """One layer's pass in one direction: its weights and what its backward reads."""

    w_ih: np.ndarray
    w_hh: np.ndarray
    b_ih: np.ndarray | None
    b_hh: np.ndarray | None
    w_hr: np.ndarray | None
    reverse: bool
    steps: list[dict] = field(default_factory=list)  # each step's saved values, in the order run


@dataclass
class Tape:
    """What :func:`backward` reads: the forward's configuration, inputs and saved values."""

    kind: str
    batch_first: bool
    layers: list[list[_Direction]]
    inputs: list[np.ndarray]  # each layer's input as the product takes it, (T * B, features)
    noise: list[np.ndarray | None]  # the dropout factor applied to each layer after the first (None: none)
    batch_sizes: np.ndarray | None = None  # a packed sequence's rows per step (None: a padded batch)


def _cell(kind: str, d: _Direction, ig: np.ndarray, h: np.ndarray, c: np.ndarray | None, f: _Flags,
          whh_t: np.ndarray, whr_t: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None, dict]:
    """One step: the new hidden state (and cell state), and the values its backward reads."""
    hg = _mm(h, whh_t)
    if d.b_hh is not None:
        hg = hg + d.b_hh
    if kind == "gru":
        n3 = ig.shape[1] // 3
        rz = f("sigmoid", hg[:, :2 * n3] + ig[:, :2 * n3])
        r, z = rz[:, :n3], rz[:, n3:]
        hn = hg[:, 2 * n3:]
        n = f("tanh", ig[:, 2 * n3:] + hn * r)
        diff = h - n
        return diff * z + n, None, {"h": h, "r": r, "z": z, "n": n, "hn": hn, "diff": diff}
    gates = hg + ig
    if kind == "lstm":
        n4 = gates.shape[1] // 4
        ifo = f("sigmoid", np.concatenate([gates[:, :2 * n4], gates[:, 3 * n4:]], axis=1))
        g = f("tanh", gates[:, 2 * n4:3 * n4])
        i, fg, o = ifo[:, :n4], ifo[:, n4:2 * n4], ifo[:, 2 * n4:]
        cy = fg * c + i * g
        tc = f("tanh", cy)
        hy = o * tc
        saved = {"h": h, "c": c, "i": i, "f": fg, "g": g, "o": o, "ifo": ifo, "tc": tc}
        if whr_t is not None:
            saved["ho"] = hy
            hy = _mm(hy, whr_t)
        return hy, cy, saved
    if kind == "rnn_tanh":
        y = f("tanh", gates)
    else:
        y = np.where(np.isnan(gates) | (gates > 0), gates, _ZERO)
    return y, None, {"h": h, "y": y}


def _setup(kind: str, params: list[np.ndarray], has_biases: bool, num_layers: int, bidirectional: bool,
           dropout: float, keep: list[np.ndarray] | None) -> tuple[list[np.ndarray | None], int, int, bool]:
    """The checks of :func:`forward`, the dropout factors of the layers after the first, the
    directions, the weights per layer and direction, and whether the LSTM projects."""
    if kind not in KINDS:
        raise ValueError(f"unknown recurrent kind {kind!r}; the kinds are {', '.join(KINDS)}")
    if not 0 <= dropout <= 1 or (0 < dropout < 1 and num_layers > 1 and (keep is None or len(keep) < num_layers - 1)):
        raise ValueError(f"dropout {dropout} needs a probability in [0, 1] and, below 1, one keep mask for "
                         f"each of the {num_layers - 1} layers after the first")
    noise: list[np.ndarray | None] = [None] * (num_layers - 1)
    if dropout and num_layers > 1:  # at::dropout: x * (mask / (1 - p)), one rounding each; p = 1: x * 0
        noise = [np.zeros(1, _F32) if dropout == 1 else k.astype(_F32) / _F32(1 - dropout)
                 for k in (keep if dropout < 1 else noise)]
    dirs = 2 if bidirectional else 1
    per = len(params) // (num_layers * dirs)
    return noise, dirs, per, kind == "lstm" and per == (5 if has_biases else 3)


def _direction(params: list[np.ndarray], slot: int, per: int, has_biases: bool, proj: bool,
               reverse: bool) -> _Direction:
    w = params[slot * per:(slot + 1) * per]
    return _Direction(w[0], w[1], w[2] if has_biases else None, w[3] if has_biases else None,
                      w[-1] if proj else None, reverse=reverse)


def _linear_ih(d: _Direction, x: np.ndarray) -> np.ndarray:
    """linear_ih: x @ w_ih^T in order along the features, then the bias added."""
    ig = _mm(x, np.ascontiguousarray(d.w_ih.T))
    return ig if d.b_ih is None else ig + d.b_ih


def forward(kind: str, x: np.ndarray, hx: list[np.ndarray], params: list[np.ndarray], *, has_biases: bool,
            num_layers: int, bidirectional: bool, batch_first: bool, dropout: float = 0.0,
            keep: list[np.ndarray] | None = None,
            batch_sizes: np.ndarray | None = None) -> tuple[list[np.ndarray], Tape, int]:
    """torch.<kind>(x, hx, params, has_biases, num_layers, dropout, train, bidirectional,
    batch_first) in binary32: its outputs (the sequence, the final hidden states, and for an LSTM
    the final cell states), the tape for :func:`backward`, and the elementwise flags raised.
    ``dropout``: the probability of dropping between layers, in training (0 outside it);
    ``keep``: for each layer after the first, its input's kept elements (bool, (T, B, features)),
    drawn with probability ``1 - dropout`` (none for a dropout of 1, which keeps nothing).
    ``batch_sizes``: a packed sequence (torch.<kind>(data, batch_sizes, hx, params, ...)): ``x`` its
    data (N, features), each step's rows the first ``batch_sizes[t]`` of the batch (non-increasing),
    the keep masks (N, features), the sequence output (N, features) (``PackedLayer`` and
    ``ReversedPackedLayer``: each step's cell on its rows only, the others' states kept)."""
    if batch_sizes is not None:
        return _forward_packed(kind, x, hx, params, has_biases, num_layers, bidirectional, dropout, keep,
                               np.asarray(batch_sizes, np.int64))
    noise, dirs, per, proj = _setup(kind, params, has_biases, num_layers, bidirectional, dropout, keep)
    f = _Flags()
    seq = np.swapaxes(x, 0, 1) if batch_first else x
    steps, batch = seq.shape[0], seq.shape[1]
    h0 = hx[0]
    c0 = hx[1] if kind == "lstm" else None
    layers, inputs = [], []
    final_h, final_c = [], []
    layer_input = seq
    for layer in range(num_layers):
        if layer and noise[layer - 1] is not None:
            layer_input = layer_input * noise[layer - 1]
        outs, directions = [], []
        flat = np.ascontiguousarray(layer_input).reshape(steps * batch, -1)
        inputs.append(flat)
        for way in range(dirs):
            d = _direction(params, layer * dirs + way, per, has_biases, proj, way == 1)
            ig = _linear_ih(d, flat).reshape(steps, batch, -1)
            whh_t = np.ascontiguousarray(d.w_hh.T)
            whr_t = np.ascontiguousarray(d.w_hr.T) if proj else None
            slot = layer * dirs + way
            h, c = h0[slot], (c0[slot] if c0 is not None else None)
            hs = [None] * steps
            for t in (range(steps - 1, -1, -1) if d.reverse else range(steps)):
                h, c, saved = _cell(kind, d, ig[t], h, c, f, whh_t, whr_t)
                d.steps.append(saved)
                hs[t] = h
            final_h.append(h)
            if c is not None:
                final_c.append(c)
            outs.append(np.stack(hs))
            directions.append(d)
        layers.append(directions)
        layer_input = outs[0] if dirs == 1 else np.concatenate(outs, axis=2)
    out = np.swapaxes(layer_input, 0, 1) if batch_first else layer_input
    results = [out, np.stack(final_h)] + ([np.stack(final_c)] if kind == "lstm" else [])
    tape = Tape(kind, batch_first, layers, inputs, noise)
    return results, tape, f.value


def _cell_backward(kind: str, d: _Direction, s: dict, gh: np.ndarray | None, gc: np.ndarray | None, f: _Flags,
                   grads: dict) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray]:
    """One step back: the gradient of the step's hidden-state input from its product (the other
    paths' parts returned separately, for the caller to add in autograd's order), the cell
    state's, the GRU's reset-path part, and the input gates' gradient."""
    if kind == "gru":
        gd = gh * s["z"]
        gz = gh * s["diff"]
        ga = f("tanh_backward", gh + -gd, s["n"])
        g_hn = ga * s["r"]
        gr = ga * s["hn"]
        grz = f("sigmoid_backward", np.concatenate([gr, gz], axis=1), np.concatenate([s["r"], s["z"]], axis=1))
        g_hg = np.concatenate([grz, g_hn], axis=1)
        g_ig = np.concatenate([grz, ga], axis=1)
        h_path = gd
        c_prev = None
    elif kind == "lstm":
        if gh is not None and d.w_hr is not None:
            grads["w_hr"] = _added(grads.get("w_hr"), _mm(gh.T, s["ho"]))
            gh = _mm(gh, d.w_hr)
        gc_total = gc
        if gh is not None:  # (else the output gate gets no gradient: autograd's chunk backward fills +0)
            go = gh * s["tc"]
            gc_total = _added(f("tanh_backward", gh * s["o"], s["tc"]), gc)
        gi, gf, gg = gc_total * s["g"], gc_total * s["c"], gc_total * s["i"]
        c_prev = gc_total * s["f"]
        n4 = gi.shape[1]
        if gh is not None:
            g_ifo = f("sigmoid_backward", np.concatenate([gi, gf, go], axis=1), s["ifo"])
            g_if, g_o = g_ifo[:, :2 * n4], g_ifo[:, 2 * n4:]
        else:
            g_if = f("sigmoid_backward", np.concatenate([gi, gf], axis=1), s["ifo"][:, :2 * n4])
            g_o = np.zeros_like(s["o"])
        g_hg = g_ig = np.concatenate([g_if, f("tanh_backward", gg, s["g"]), g_o], axis=1)
        h_path = None
    else:
        if kind == "rnn_tanh":
            g_hg = g_ig = f("tanh_backward", gh, s["y"])
        else:
            g_hg = g_ig = np.where(s["y"] <= 0, _ZERO, gh)  # threshold_backward: a NaN passes the gradient
        h_path = c_prev = None
    grads["w_hh"] = _added(grads.get("w_hh"), _mm(g_hg.T, s["h"]))
    if d.b_hh is not None:
        grads["b_hh"] = _added(grads.get("b_hh"), binary32.sum(g_hg, 0))
    return _mm(g_hg, d.w_hh), c_prev, h_path, g_ig


def _gradient_slots(tape: Tape, grads: list[np.ndarray | None]) -> tuple:
    """Whether the tape is an LSTM's, the outputs' gradients (sequence, final h, final c), the
    directions, and a slot per layer and direction for the initial states' gradients."""
    lstm = tape.kind == "lstm"
    dirs = len(tape.layers[0])
    slots = len(tape.layers) * dirs
    return lstm, grads[0], grads[1], grads[2] if lstm else None, dirs, [None] * slots, [None] * slots


def _weight_grads(d: _Direction, g_ig: np.ndarray, x: np.ndarray, wgrads: dict) -> list[np.ndarray | None]:
    """One layer and direction's weight gradients in torch's order of its flat weights: w_ih (the
    input gates' gradients of all steps in one product with the layer's input), w_hh, then b_ih (the
    pairwise tree) and b_hh, then w_hr."""
    order = [_mm(np.ascontiguousarray(g_ig.T), x), wgrads.get("w_hh")]
    if d.b_ih is not None:
        order += [binary32.sum(g_ig, 0), wgrads.get("b_hh")]
    if d.w_hr is not None:
        order.append(wgrads.get("w_hr"))
    return order


def backward(tape: Tape, grads: list[np.ndarray | None]) -> tuple[list[np.ndarray | None], int]:
    """The gradients of :func:`forward`'s inputs (x, the initial states, the flat weights in their
    order) from those of its outputs (None: an output not used), as autograd computes them on
    torch's decomposition; also the elementwise flags raised. An input no gradient reaches gets None."""
    if tape.batch_sizes is not None:
        return _backward_packed(tape, grads)
    f = _Flags()
    lstm, g_out, g_hy, g_cy, dirs, g_h0, g_c0 = _gradient_slots(tape, grads)
    kind = tape.kind
    if g_out is not None and tape.batch_first:
        g_out = np.swapaxes(g_out, 0, 1)
    g_params: list[np.ndarray | None] = []
    for layer in range(len(tape.layers) - 1, -1, -1):
        x = tape.inputs[layer]
        steps = len(tape.layers[layer][0].steps)
        batch = x.shape[0] // steps
        g_input = None
        layer_params = []
        for way, d in enumerate(tape.layers[layer]):
            width = d.w_hh.shape[1]
            slot = layer * dirs + way
            g_seq = None if g_out is None else g_out[..., way * width:(way + 1) * width]
            times = range(steps - 1, -1, -1) if d.reverse else range(steps)  # the time of the k-th step run
            gh = _added(None if g_hy is None else g_hy[slot], None if g_seq is None else g_seq[times[-1]])
            gc = None if g_cy is None else g_cy[slot]
            wgrads: dict = {}
            g_igs = [None] * steps
            for k in range(steps - 1, -1, -1):  # back through the steps in the reverse of their run
                g_mm, gc, h_path, g_ig = _cell_backward(kind, d, d.steps[k], gh, gc, f, wgrads)
                g_igs[times[k]] = g_ig
                below = None if g_seq is None or k == 0 else g_seq[times[k - 1]]
                gh = _added(_added(below, h_path), g_mm)
            g_h0[slot], g_c0[slot] = gh, gc
            g_ig = np.stack(g_igs).reshape(steps * batch, -1)
            g_x = _mm(g_ig, d.w_ih).reshape(steps, batch, -1)
            g_input = _added(g_input, g_x)
            layer_params.append(_weight_grads(d, g_ig, x, wgrads))
        g_params = [g for order in layer_params for g in order] + g_params
        if layer and tape.noise[layer - 1] is not None:
            g_input = g_input * tape.noise[layer - 1]
        g_out = g_input
    g_x = np.swapaxes(g_out, 0, 1) if tape.batch_first else g_out
    states = [np.stack(g_h0)] + ([np.stack(g_c0)] if lstm else [])
    return [g_x, *states, *g_params], f.value


# -- packed sequences (torch's PackedLayer and ReversedPackedLayer) -------------------------------

def _forward_packed(kind: str, x: np.ndarray, hx: list[np.ndarray], params: list[np.ndarray], has_biases: bool,
                    num_layers: int, bidirectional: bool, dropout: float, keep: list[np.ndarray] | None,
                    bs: np.ndarray) -> tuple[list[np.ndarray], Tape, int]:
    """:func:`forward` of a packed sequence: the input gates of all rows at once, then each step's
    cell on the first ``bs[t]`` rows of the batch, the other rows' states kept as they are (a
    finished row's in the forward direction; in the reverse one, a row not yet started still holds
    its initial state)."""
    noise, dirs, per, proj = _setup(kind, params, has_biases, num_layers, bidirectional, dropout, keep)
    f = _Flags()
    offsets = _offsets(bs)
    h0, c0 = hx[0], (hx[1] if kind == "lstm" else None)
    layers, inputs, final_h, final_c = [], [], [], []
    layer_input = x
    for layer in range(num_layers):
        if layer and noise[layer - 1] is not None:
            layer_input = layer_input * noise[layer - 1]
        flat = np.ascontiguousarray(layer_input)
        inputs.append(flat)
        outs, directions = [], []
        for way in range(dirs):
            slot = layer * dirs + way
            d = _direction(params, slot, per, has_biases, proj, way == 1)
            ig = _linear_ih(d, flat)
            whh_t = np.ascontiguousarray(d.w_hh.T)
            whr_t = np.ascontiguousarray(d.w_hr.T) if proj else None
            h, c = h0[slot], (c0[slot] if c0 is not None else None)
            out = np.empty((len(flat), h.shape[1]), _F32)
            for t in (range(len(bs) - 1, -1, -1) if d.reverse else range(len(bs))):
                n, at = bs[t], offsets[t]
                hn, cn, saved = _cell(kind, d, ig[at:at + n], h[:n], None if c is None else c[:n], f, whh_t, whr_t)
                saved["t"] = t
                d.steps.append(saved)
                h = np.concatenate([hn, h[n:]])
                c = None if c is None else np.concatenate([cn, c[n:]])
                out[at:at + n] = hn
            final_h.append(h)
            if c is not None:
                final_c.append(c)
            outs.append(out)
            directions.append(d)
        layers.append(directions)
        layer_input = outs[0] if dirs == 1 else np.concatenate(outs, axis=1)
    results = [layer_input, np.stack(final_h)] + ([np.stack(final_c)] if kind == "lstm" else [])
    return results, Tape(kind, False, layers, inputs, noise, bs), f.value


def _offsets(bs: np.ndarray) -> np.ndarray:
    """Where each step's rows begin in a packed sequence's data."""
    return np.concatenate([[0], np.cumsum(bs)[:-1]]).astype(np.int64)


def _placed(g: np.ndarray | None, rows: int, start: int) -> np.ndarray | None:
    """g in rows ``start:`` of a (rows, ...) array of +0 (a slice's gradient, as autograd makes it)."""
    if g is None:
        return None
    out = np.zeros((rows,) + g.shape[1:], _F32)
    out[start:start + len(g)] = g
    return out


def _packed_state_grads(reverse: bool, later: tuple | None, n: int, out_t, hy, cy) -> tuple:
    """The gradients reaching a packed step's hidden and cell state (n rows), in autograd's order:
    its output's, the step run after it (``later``: its cell's gradients and its rows m) through
    the slice that step took, and a finished row's final gradient (``hy``, ``cy``)."""
    if later is None:  # the last step run: the final state's gradient first, then the output's
        return _added(None if hy is None else hy[:n], out_t), None if cy is None else cy[:n]
    g_mm, c_prev, h_path, m = later
    if m == n:  # the next cell took this state as it is
        return _added(_added(out_t, h_path), g_mm), c_prev
    if not reverse:  # it took the first m rows; the rest finished here
        gh = _added(_added(out_t, _placed(_added(h_path, g_mm), n, 0)), _placed(None if hy is None else hy[m:n], n, m))
        return gh, _added(_placed(c_prev, n, 0), _placed(None if cy is None else cy[m:n], n, m))
    # it took these rows and the initial states of rows n:m (a concatenation)
    return _added(out_t, None if g_mm is None else _added(h_path, g_mm)[:n]), None if c_prev is None else c_prev[:n]


def _backward_packed(tape: Tape, grads: list[np.ndarray | None]) -> tuple[list[np.ndarray | None], int]:
    """:func:`backward` of a packed sequence, in autograd's order on torch's PackedLayer and
    ReversedPackedLayer: a step's hidden state gets its output's gradient first, then the next
    step's (through the slice that step took of it, or directly where the batch did not change),
    then a finished row's final gradient; a slice's gradient is +0 outside its rows, so a -0 there
    becomes +0 as in autograd's sums. The initial states of the reverse direction gather their
    rows' gradients from the steps where those rows joined, the latest-run first."""
    kind, f, bs = tape.kind, _Flags(), tape.batch_sizes
    lstm, g_out, g_hy, g_cy, dirs, g_h0, g_c0 = _gradient_slots(tape, grads)
    offsets = _offsets(bs)
    steps = len(bs)
    g_params: list[np.ndarray | None] = []
    for layer in range(len(tape.layers) - 1, -1, -1):
        x = tape.inputs[layer]
        g_input = None
        layer_params: list[list] = [[] for _ in range(dirs)]
        for way in sorted(range(dirs), reverse=True):  # the reverse direction's nodes are the later ones
            d = tape.layers[layer][way]
            width = d.w_hh.shape[1]
            slot = layer * dirs + way
            g_seq = None if g_out is None else g_out[:, way * width:(way + 1) * width]
            hy = None if g_hy is None else g_hy[slot]
            cy = None if g_cy is None else g_cy[slot]
            wgrads: dict = {}
            g_igs = np.empty((len(x), d.w_ih.shape[0]), _F32)
            later = None  # the step run after this one: (its cell's gradients, its rows)
            h0_parts: list = []
            c0_parts: list = []
            for k in range(steps - 1, -1, -1):  # back through the steps in the reverse of their run
                s = d.steps[k]
                t = s["t"]
                n, at = bs[t], offsets[t]
                out_t = None if g_seq is None else g_seq[at:at + n]
                gh, gc = _packed_state_grads(d.reverse, later, n, out_t, hy, cy)
                g_mm, c_prev, h_path, g_ig = _cell_backward(kind, d, s, gh, gc, f, wgrads)
                if d.reverse:  # rows start:n of this step's state were the initial state's (all, at the first)
                    start = bs[t + 1] if t + 1 < steps else 0
                    if start < n:
                        first = _added(h_path, g_mm)
                        h0_parts.append(None if first is None else _placed(first[start:], bs[0], start))
                        c0_parts.append(None if c_prev is None else _placed(c_prev[start:], bs[0], start))
                later = (g_mm, c_prev, h_path, n)
                g_igs[at:at + n] = g_ig
            g_input = _added(g_input, _mm(g_igs, d.w_ih))  # linear_ih of all steps at once, as torch's
            g_mm, c_prev, h_path, _ = later
            if d.reverse:
                g_h0[slot] = functools.reduce(_added, h0_parts, None)
                g_c0[slot] = functools.reduce(_added, c0_parts, None)
            else:
                g_h0[slot], g_c0[slot] = _added(h_path, g_mm), c_prev
            layer_params[way] = _weight_grads(d, g_igs, x, wgrads)
        g_params = [g for order in layer_params for g in order] + g_params
        if layer and tape.noise[layer - 1] is not None:
            g_input = g_input * tape.noise[layer - 1]
        g_out = g_input
    states = [np.stack(g_h0)] + ([np.stack(g_c0)] if lstm else [])
    return [g_out, *states, *g_params], f.value

