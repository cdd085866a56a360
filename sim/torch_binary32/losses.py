"""Losses torch computes in one kernel: multi-margin, embedding bags and CTC, in its kernels' order."""

from __future__ import annotations

import numpy as np
import torch

from .common import _all32, _cr_np, _np, _t, aten
from .products import _accumulate_into
from .reductions import _from_zero


def _margins(x, target, p, margin, weight) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows of a multi-margin loss as torch's kernel reads them (aten/src/ATen/native/
    LossMultiMargin.cpp): the (N, C) input, the targets, ``z = (margin - x[target]) + x`` in binary32,
    the places counted (z > 0 off the target: a NaN z is not) and each row's target weight."""
    a = np.ascontiguousarray(_np(x), np.float32).reshape(-1, x.shape[-1] if x.dim() else 1)
    t = np.ascontiguousarray(target.numpy()).reshape(-1).astype(np.int64)
    rows = np.arange(len(a))
    torch._check(p in (1, 2), lambda: "only p == 1 and p == 2 supported")
    torch._check(bool(((t >= 0) & (t < a.shape[1])).all()), lambda: "target out of range")
    with np.errstate(all="ignore"):
        z = (np.float32(margin) - a[rows, t])[:, None] + a
    counted = z > 0
    counted[rows, t] = False
    w = _np(weight)[t] if weight is not None else None
    return a, t, z, counted, w


def _multi_margin_loss(mode, x, target, p=1, margin=1, weight=None, reduction=1):
    """torch's CPU kernel, whose order it keeps: each row's terms (z or z*z, times the target's
    weight) added in class order in binary32 and divided by C; the rows as they are
    (``reduction`` none), or added in binary64 in row order, divided by N for the mean, rounded
    once to binary32."""
    if not _all32(x, weight) or x.numel() == 0:
        return NotImplemented
    a, t, z, counted, w = _margins(x, target, p, margin, weight)
    with np.errstate(all="ignore"):
        h = z if p == 1 else z * z
        if w is not None:
            h = h * w[:, None]
        rows = _from_zero(np.add, np.where(counted, h, np.float32(0))) / np.float32(a.shape[1])
        if reduction == 0 and target.dim() > 0:
            return _t(rows)
        total = np.add.accumulate(rows.astype(np.float64))[-1]
        return _t(np.asarray(total / len(rows) if reduction == 1 else total, np.float32))


def _multi_margin_loss_backward(mode, grad, x, target, p, margin, weight=None, reduction=1):
    """torch's CPU kernel, whose order it keeps: g = 1/(N*C) for the mean, else 1/C (rounded once
    to binary32), each counted place's g or (2*g)*z times the target's weight, the target's the
    negated in-order sum of its row's, all times the output's gradient."""
    if not _all32(grad, x, weight) or x.numel() == 0:
        return NotImplemented
    a, t, z, counted, w = _margins(x, target, p, margin, weight)
    n, c = a.shape
    g = np.float32(1.0 / (n * c) if reduction == 1 else 1.0 / c)
    with np.errstate(all="ignore"):
        h = np.broadcast_to(g, z.shape) if p == 1 else (np.float32(2) * g) * z
        if w is not None:
            h = h * w[:, None]
        out = np.where(counted, h, np.float32(0))
        out[np.arange(n), t] = _from_zero(np.subtract, out)
        go = _np(grad)
        out = out * (go.reshape(-1)[0] if reduction != 0 or grad.dim() == 0 else go.reshape(-1, 1))
    return _t(out.reshape(x.shape))


def _bags(indices, offsets, include_last_offset: bool, padding_idx: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Each looked-up position's bag (from the offsets, as F.embedding_bag defines them), whether it
    counts (not padding_idx), and the number of bags."""
    idx, off = indices.numpy().reshape(-1).astype(np.int64), offsets.numpy().reshape(-1).astype(np.int64)
    n_bags = len(off) - 1 if include_last_offset else len(off)
    bag = np.searchsorted(off[:n_bags], np.arange(len(idx)), side="right") - 1
    return bag, (idx != padding_idx) & (bag >= 0), n_bags


def _embedding_bag(mode, weight, indices, offsets, scale_grad_by_freq=False, bag_mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """F.embedding_bag's sum and mean: each bag's rows (times their per-sample weights, one rounding
    each) added in order from 0 in binary32, a mean divided by its count (one rounding); max is a
    selection, torch's own. The index bookkeeping (offset2bag, bag sizes, argmax) is torch's."""
    if not _all32(weight, per_sample_weights):
        return NotImplemented
    native = aten._embedding_bag.default(weight, indices, offsets, scale_grad_by_freq, bag_mode, sparse,
                                         per_sample_weights, include_last_offset, padding_idx)
    if bag_mode == 2:
        return native
    bag, counted, n_bags = _bags(indices, offsets, include_last_offset, padding_idx)
    w, idx = _np(weight), indices.numpy().reshape(-1)[counted]
    rows = w[idx]
    with np.errstate(all="ignore"):
        if per_sample_weights is not None:
            rows = rows * _np(per_sample_weights).reshape(-1)[counted][:, None]
        out = np.zeros((n_bags, w.shape[1]), np.float32)
        places = bag[counted][:, None] * w.shape[1] + np.arange(w.shape[1])
        _accumulate_into(out, places, rows)
        if bag_mode == 1:
            count = np.bincount(bag[counted], minlength=n_bags).astype(np.float32)[:, None]
            out = np.where(count > 0, out / np.maximum(count, 1), out)
    return (_t(out), *native[1:])


def _embedding_bag_backward(mode, grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                            scale_grad_by_freq, bag_mode, sparse, per_sample_weights, padding_idx=-1):
    """The dense weight gradient of :func:`_embedding_bag`: each counted position's bag gradient
    (times its per-sample weight, or divided by its bag's count, one rounding) added into its row in
    position order; for max, each bag's gradient into the rows its argmax chose, in bag order."""
    if sparse or scale_grad_by_freq or not _all32(grad, per_sample_weights):
        return NotImplemented
    g = _np(grad)
    d = g.shape[1]
    out = np.zeros((num_weights, d), np.float32)
    with np.errstate(all="ignore"):
        if bag_mode == 2:
            chosen = maximum_indices.numpy().reshape(g.shape)
            valid = chosen >= 0
            _accumulate_into(out, (chosen * d + np.arange(d))[valid], g[valid])
            return _t(out)
        bag, counted, _ = _bags(indices, offsets, len(offsets) > len(g), padding_idx)
        terms = g[bag[counted]]
        if per_sample_weights is not None:
            terms = terms * _np(per_sample_weights).reshape(-1)[counted][:, None]
        elif bag_mode == 1:
            terms = terms / np.bincount(bag[counted], minlength=len(g)).astype(np.float32)[bag[counted]][:, None]
        idx = indices.numpy().reshape(-1)[counted]
        _accumulate_into(out, idx[:, None] * d + np.arange(d), terms)
    return _t(out)


def _embedding_bag_per_sample_weights_backward(mode, grad, weight, indices, offsets, offset2bag, bag_mode,
                                               padding_idx=-1):
    """Each position's per-sample-weight gradient: the dot product of its bag's gradient and its
    row, the products added in order from 0 in binary32 (0 for padding)."""
    if not _all32(grad, weight):
        return NotImplemented
    bag, counted, _ = _bags(indices, offsets, len(offsets) > len(grad), padding_idx)
    with np.errstate(all="ignore"):
        products = _np(grad)[np.maximum(bag, 0)] * _np(weight)[indices.numpy().reshape(-1)]
        dots = _from_zero(np.add, products)
    return _t(np.where(counted, dots, np.float32(0)))


def _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank):
    """CTC's operands as torch's kernel reads them (LossCTC.cpp): log-probabilities (B, T, C), the
    lengths, and each item's extended target (blank, l1, blank, l2, ..., blank)."""
    lengths = [np.asarray(v.numpy() if isinstance(v, torch.Tensor) else v, np.int64).reshape(-1)
               for v in (input_lengths, target_lengths)]
    t_in, t_len = lengths
    tg = targets.numpy().astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(t_len)[:-1]]) if tg.ndim == 1 else None
    primes = []
    for b, n in enumerate(t_len):
        labels = tg[starts[b]:starts[b] + n] if tg.ndim == 1 else tg[b, :n]
        prime = np.full(2 * n + 1, blank, np.int64)
        prime[1::2] = labels
        primes.append(prime)
    return np.moveaxis(_np(log_probs), 1, 0), t_in, t_len, primes


def _log_sum(mode, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """log(exp(a - m) + exp(b - m) [+ exp(c - m)]) + m, m the largest (first wins a tie; 0 if all
    -inf), as torch's CTC kernel adds its terms, exp and log correctly rounded in binary32."""
    m = np.where(b > a, b, a)
    if c is not None:
        m = np.where(c > m, c, m)
    m = np.where(m == -np.inf, np.float32(0), m).astype(np.float32)
    with np.errstate(all="ignore"):
        total = _cr_np(mode, "exp", a - m) + _cr_np(mode, "exp", b - m)
        if c is not None:
            total = total + _cr_np(mode, "exp", c - m)
        return _cr_np(mode, "log", total) + m


def _ctc_loss(mode, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """torch's CTC forward (LossCTC.cpp, ctc_loss_cpu_template) in binary32: the alphas step by
    step, each a log of the sum of the allowed predecessors' exponentials (``_log_sum``) plus the
    step's log-probability, the loss minus the log of the last two alphas' sum. Returns (loss,
    log_alpha); the alphas torch leaves unwritten are -inf here."""
    if not _all32(log_probs):
        return NotImplemented
    lp, t_in, t_len, primes = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    batch, steps = lp.shape[:2]
    width = 2 * (max(t_len) if len(t_len) else 0) + 1
    alpha = np.full((batch, steps, width), -np.inf, np.float32)
    nll = np.empty(batch, np.float32)
    with np.errstate(all="ignore"):
        for b in range(batch):
            n, prime = t_in[b], primes[b]
            s = len(prime)
            if n == 0:
                nll[b] = -(0.0 if t_len[b] == 0 else -np.inf)
                continue
            la = alpha[b]
            la[0, 0] = lp[b, 0, blank]
            if s > 1:
                la[0, 1] = lp[b, 0, prime[1]]
            skip = np.zeros(s, bool)
            skip[2:] = prime[:-2] != prime[2:]
            for t in range(1, n):
                prev = la[t - 1, :s]
                a2 = np.concatenate([[-np.inf], prev[:-1]]).astype(np.float32)
                a3 = np.where(skip, np.concatenate([[-np.inf, -np.inf], prev[:-2]])[:s], -np.inf).astype(np.float32)
                la[t, :s] = _log_sum(mode, prev, a2, a3) + lp[b, t, prime]
            end = la[n - 1]
            nll[b] = -(end[0] if s == 1 else _log_sum(mode, end[s - 1:s], end[s - 2:s - 1])[0])
    return _t(nll), _t(alpha)


def _ctc_loss_backward(mode, grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank,
                       zero_infinity=False):
    """torch's CTC backward (ctc_loss_backward_cpu_template) in binary32: the betas step by step as
    the alphas, each step's alpha + beta collected per character in descending order of the
    extended target's positions (``_log_sum`` of two), then exp(lp) - exp(collected + nll - lp),
    times the loss's gradient; steps past an item's length 0; an infinite loss with
    ``zero_infinity`` a zero gradient."""
    if not _all32(grad, log_probs, nll, log_alpha):
        return NotImplemented
    lp, t_in, t_len, primes = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    batch, steps, classes = lp.shape
    la_all, losses, g_out = _np(log_alpha), _np(nll), _np(grad).reshape(-1)
    out = np.zeros((batch, steps, classes), np.float32)
    with np.errstate(all="ignore"):
        for b in range(batch):
            n, prime = t_in[b], primes[b]
            s = len(prime)
            if (zero_infinity and losses[b] == np.inf) or n == 0:
                continue
            la = la_all[b]
            lb = np.full((n, s), -np.inf, np.float32)
            col = np.full((n, classes), -np.inf, np.float32)
            lb[n - 1, s - 1] = lp[b, n - 1, blank]
            col[n - 1, blank] = la[n - 1, s - 1] + lb[n - 1, s - 1]
            if s > 1:
                lb[n - 1, s - 2] = lp[b, n - 1, prime[s - 2]]
                col[n - 1, prime[s - 2]] = la[n - 1, s - 2] + lb[n - 1, s - 2]
            skip = np.zeros(s, bool)
            skip[:-2] = prime[2:] != prime[:-2]
            order = np.arange(s - 1, -1, -1)  # the positions in torch's order, descending
            rounds = _ctc_rounds(prime[order])
            for t in range(n - 2, -1, -1):
                nxt = lb[t + 1]
                b2 = np.concatenate([nxt[1:], [-np.inf]]).astype(np.float32)
                b3 = np.where(skip, np.concatenate([nxt[2:], [-np.inf, -np.inf]])[-s:], -np.inf).astype(np.float32)
                lb[t] = _log_sum(mode, nxt, b2, b3) + lp[b, t, prime]
                both = la[t, :s] + lb[t]
                for picks in rounds:  # one position per character a round, in descending order
                    pos = order[picks]
                    chars, new = prime[pos], both[pos]
                    old = col[t, chars]
                    empty = old == -np.inf
                    merged = new.copy()
                    if (~empty).any():
                        merged[~empty] = _log_sum(mode, old[~empty], new[~empty])
                    col[t, chars] = merged
            p = lp[b, :n]
            out[b, :n] = (_cr_np(mode, "exp", p) - _cr_np(mode, "exp", (col + losses[b]) - p)) * g_out[b]
    return _t(np.ascontiguousarray(np.moveaxis(out, 0, 1)))


def _ctc_rounds(chars: np.ndarray) -> list[np.ndarray]:
    """The indices of ``chars`` in rounds, each character at most once a round and each
    character's occurrences in order across the rounds."""
    seen: dict[int, int] = {}
    rounds: list[list[int]] = []
    for i, c in enumerate(chars.tolist()):
        r = seen.get(c, 0)
        seen[c] = r + 1
        if r == len(rounds):
            rounds.append([])
        rounds[r].append(i)
    return [np.asarray(r, np.int64) for r in rounds]

