"""Binary32Mode's direct evaluations of torch's decompositions (batch norm, layer norm, softmax and
their backwards: sim.torch_binary32.DIRECT) give the bits, the running-statistics writes, the
exceptions and the flags that the decomposition itself gives evaluated in the mode."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch._decomp import decomposition_table  # noqa: E402

from sim import torch_binary32 as tb  # noqa: E402
from sim.torch_binary32 import attention as tb_attention  # noqa: E402
from sim.torch_binary32 import common as tb_common  # noqa: E402
from sim.torch_binary32 import mode as tb_mode  # noqa: E402

aten = torch.ops.aten


@contextlib.contextmanager
def _decomposed():
    """Binary32Mode without its direct evaluations: each operation by its decomposition (as before)."""
    saved = tb_mode.DIRECT
    tb_mode.DIRECT = {}
    tb_mode._HOW.clear()
    try:
        yield
    finally:
        tb_mode.DIRECT = saved
        tb_mode._HOW.clear()


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone(memory_format=torch.preserve_format)
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(t) for t in x)
    return x


def _outcome(fn, args):
    """(result or exception type, the arguments after the call, flags_seen)."""
    mode = tb.Binary32Mode()
    try:
        with mode:
            result = fn(*args)
    except Exception as e:  # noqa: BLE001 (the same exception either way)
        result = type(e)
    return result, args, mode.flags_seen


def _same(a, b, where="") -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, b.dtype, a.shape, b.shape)
        if a.dtype == torch.float32:  # the bits; a NaN's payload is the CPU's (x86's default NaN is negative)
            nan = a.isnan()
            assert torch.equal(nan, b.isnan()), where
            assert torch.equal(a.masked_fill(nan, 0).view(torch.int32), b.masked_fill(nan, 0).view(torch.int32)), where
        else:
            assert torch.equal(a, b), where
        if a.numel() > 1:  # the same layout: the strides of the dimensions longer than 1 (a unit one's is moot)
            strides = [(sa, sb) for n, sa, sb in zip(a.shape, a.stride(), b.stride(), strict=True) if n > 1]
            assert all(sa == sb for sa, sb in strides), (where, a.stride(), b.stride())
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def _check(op, args) -> None:
    """op on args directly (Binary32Mode's DIRECT) against its decomposition in the mode."""
    assert op in tb.DIRECT
    with _decomposed():
        expected = _outcome(decomposition_table[op], _clone(args))
        via_mode = _outcome(op, _clone(args))  # the mode's own route without DIRECT: the same
    got = _outcome(op, _clone(args))
    for ref in (expected, via_mode):
        _same(got[0], ref[0], f"{op} result")
        _same(got[1], ref[1], f"{op} arguments after")
        assert got[2] == ref[2], (op, got[2], ref[2])


def _values(rng, shape, special: bool) -> torch.Tensor:
    scale = float(rng.choice([1e-3, 1.0, 30.0, 1e18]))
    a = np.array(rng.standard_normal(shape) * scale + rng.choice([0.0, 5.0]), dtype=np.float32)
    if special and a.size:
        flat = a.reshape(-1)
        for v in rng.choice([np.nan, np.inf, -np.inf, 3e38, -3e38, 0.0], size=int(rng.integers(1, 3))):
            flat[int(rng.integers(flat.size))] = v
    return torch.from_numpy(a)


def _layout(rng, t: torch.Tensor) -> torch.Tensor:
    """t itself, channels-last, or a non-contiguous view with t's values."""
    kind = int(rng.integers(3))
    if kind == 1 and t.dim() == 4:
        return t.contiguous(memory_format=torch.channels_last)
    if kind == 2 and t.dim() >= 2:
        return t.transpose(0, -1).contiguous().transpose(0, -1)
    return t


def _bn_case(rng):
    n = int(rng.choice([0, 1, 2, 3])) if rng.random() < 0.2 else int(rng.integers(1, 5))
    c = int(rng.choice([0, 1])) if rng.random() < 0.15 else int(rng.integers(1, 6))
    spatial = [int(rng.integers(1, 5)) for _ in range(int(rng.integers(0, 3)))]
    shape = (n, c, *spatial)
    special = rng.random() < 0.25
    x = _layout(rng, _values(rng, shape, special))
    weight = None if rng.random() < 0.25 else _values(rng, (c,), special and rng.random() < 0.3)
    bias = None if rng.random() < 0.25 else _values(rng, (c,), False)
    rm = _values(rng, (c,), False)
    rv = _values(rng, (c,), False).abs()
    eps = float(rng.choice([1e-5, 1e-3, 0.0, 0.1]))
    momentum = float(rng.choice([0.1, 0.0, 1.0, 0.3]))
    return x, weight, bias, rm, rv, eps, momentum, special


@pytest.mark.parametrize("seed", range(4))
def test_batch_norm_forward(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        x, w, b, rm, rv, eps, momentum, _special = _bn_case(rng)
        training = bool(rng.random() < 0.7)
        stats = rng.random() < 0.8 or not training
        _check(aten.native_batch_norm.default,
               (x, w, b, rm if stats else None, rv if stats else None, training, momentum, eps))
        _check(aten._native_batch_norm_legit.default, (x, w, b, rm, rv, training, momentum, eps))
        _check(aten._native_batch_norm_legit.no_stats, (x, w, b, True, momentum, eps))
        _check(aten._native_batch_norm_legit_no_training.default, (x, w, b, rm, rv, momentum, eps))
        _check(aten._native_batch_norm_legit_functional.default, (x, w, b, rm, rv, training, momentum, eps))


@pytest.mark.parametrize("seed", range(4))
def test_batch_norm_backward(seed):
    rng = np.random.default_rng(100 + seed)
    for _ in range(60):
        x, w, b, rm, rv, eps, momentum, special = _bn_case(rng)
        c = x.shape[1]
        train = bool(rng.random() < 0.7)
        grad = _layout(rng, _values(rng, x.shape, special and rng.random() < 0.5))
        save_mean, save_invstd = _values(rng, (c,), False), _values(rng, (c,), False).abs()
        if rng.random() < 0.5 and x.numel() > c:  # the forward's own statistics
            with tb.Binary32Mode():
                _, save_mean, save_invstd = aten.native_batch_norm.default(x, w, b, rm.clone(), rv.clone(), True,
                                                                           momentum, eps)
        if not train and rng.random() < 0.5:
            save_mean, save_invstd = torch.zeros(0), torch.zeros(0)
        mask = [bool(m) for m in rng.random(3) < 0.8]
        args = (grad, x, w, rm, rv, save_mean, save_invstd, train, eps, mask)
        _check(aten.native_batch_norm_backward.default, args)
        if w is not None:  # its schema's weight is not optional
            _check(aten.batch_norm_backward.default, (*args, torch.empty(0, dtype=torch.uint8)))


@pytest.mark.parametrize("seed", range(4))
def test_layer_norm(seed):
    rng = np.random.default_rng(200 + seed)
    for _ in range(60):
        lead = [int(rng.integers(0 if rng.random() < 0.1 else 1, 4)) for _ in range(int(rng.integers(0, 3)))]
        norm = [int(rng.integers(0 if rng.random() < 0.05 else 1, 6)) for _ in range(int(rng.integers(1, 3)))]
        shape = (*lead, *norm)
        special = rng.random() < 0.25
        x = _layout(rng, _values(rng, shape, special))
        w = None if rng.random() < 0.25 else _layout(rng, _values(rng, norm, special and rng.random() < 0.3))
        b = None if rng.random() < 0.25 else _values(rng, norm, False)
        eps = float(rng.choice([1e-5, 1e-12, 0.0, 0.1]))
        _check(aten.native_layer_norm.default, (x, norm, w, b, eps))
        if rng.random() < 0.1:  # a mismatched shape: the same error
            _check(aten.native_layer_norm.default, (x, [*norm, 2], w, b, eps))
        with tb.Binary32Mode():
            _, mean, rstd = aten.native_layer_norm.default(x, norm, w, b, eps)
        if rng.random() < 0.3:
            mean, rstd = _values(rng, mean.shape, special), _values(rng, rstd.shape, False)
        grad = _layout(rng, _values(rng, shape, special and rng.random() < 0.5))
        mask = [bool(m) for m in rng.random(3) < 0.8]
        _check(aten.native_layer_norm_backward.default, (grad, x, norm, mean, rstd, w, b, mask))


@pytest.mark.parametrize("seed", range(4))
def test_softmax(seed):
    rng = np.random.default_rng(300 + seed)
    for _ in range(80):
        shape = tuple(int(rng.integers(0 if rng.random() < 0.1 else 1, 6)) for _ in range(int(rng.integers(0, 4))))
        special = rng.random() < 0.3
        x = _layout(rng, _values(rng, shape, special))
        if special and x.numel() and rng.random() < 0.5:
            x = x.masked_fill(torch.from_numpy(np.array(rng.random(shape) < 0.5)), float("-inf"))
        dim = int(rng.integers(-max(x.dim(), 1), max(x.dim(), 1)))
        _check(aten._softmax.default, (x, dim, False))
        with tb.Binary32Mode():
            y = aten._softmax.default(x, dim, False)
        grad = _layout(rng, _values(rng, shape, special and rng.random() < 0.5))
        _check(aten._softmax_backward_data.default, (grad, _layout(rng, y), dim, torch.float32))


def test_other_dtypes_keep_the_decomposition():
    """Not binary32 throughout: the decomposition, as before."""
    x, w = torch.randn(2, 3, 4), torch.randn(3, dtype=torch.float64)
    _check(aten.native_batch_norm.default, (x, w, None, None, None, True, 0.1, 1e-5))
    _check(aten.native_layer_norm.default, (torch.randn(2, 4), [4], torch.randn(4, dtype=torch.float64), None, 1e-5))
    _check(aten._softmax_backward_data.default, (torch.randn(3, 4), torch.randn(3, 4), 1, torch.float16))


def test_edge_cases_and_events():
    """Zero variances with eps 0 (rsqrt of 0: DIVBYZERO), NaN and infinite statistics, rows of
    -inf in a softmax, one element a channel, empty channels: the same bits, writes and flags."""
    const = torch.full((2, 3, 2, 2), 1.5)
    const[:, 1] = torch.nan
    const[0, 2, 0, 0] = torch.inf
    rm, rv = torch.zeros(3), torch.tensor([0.0, -1.0, torch.inf])
    for training in (True, False):
        for w in (None, torch.tensor([1.0, torch.nan, -2.0])):
            _check(aten.native_batch_norm.default, (const, w, None, rm, rv, training, 0.1, 0.0))
            _check(aten.native_batch_norm_backward.default,
                   (torch.ones_like(const), const, w, rm, rv, torch.zeros(3), torch.tensor([torch.inf, 0.0, 1.0]),
                    training, 0.0, [True, True, True]))
    one = (torch.ones(1, 2), None, None, torch.zeros(2), torch.ones(2))  # one value a channel
    _check(aten.native_batch_norm.default, (*one, True, 0.1, 0.0))
    _check(aten.native_batch_norm.default, (*one, False, 0.1, 0.0))
    _check(aten.native_batch_norm.default, (torch.ones(2, 0, 3), None, None, None, None, True, 0.1, 1e-5))
    _check(aten.native_batch_norm.default, (torch.ones(0, 2, 3), None, None, torch.zeros(2), torch.ones(2), False,
                                            0.1, 1e-5))
    rows = torch.tensor([[1.0, 2.0, 3.0], [-torch.inf] * 3, [torch.inf, 1.0, 0.0], [torch.nan, 0.0, 1.0]])
    _check(aten._softmax.default, (rows, 1, False))
    _check(aten._softmax.default, (rows, 0, False))
    _check(aten._softmax.default, (torch.zeros(3, 0), 1, False))
    _check(aten._softmax.default, (torch.tensor(2.0), 0, False))
    _check(aten.native_layer_norm.default, (torch.full((2, 4), 3.0), [4], None, None, 0.0))
    _check(aten.native_layer_norm.default, (rows, [3], torch.ones(3), torch.zeros(3), 0.0))
    _check(aten.native_layer_norm_backward.default,
           (rows, rows, [3], torch.zeros(4, 1), torch.tensor([[torch.inf], [0.0], [1.0], [2.0]]), torch.ones(3), None,
            [True, True, True]))
    flags = []
    for x in (const, torch.full((2, 4), 3.0)):
        mode = tb.Binary32Mode()
        with mode:
            aten.native_batch_norm.default(x, None, None, None, None, True, 0.1, 0.0) if x.dim() == 4 else \
                aten.native_layer_norm.default(x, [4], None, None, 0.0)
        flags.append(mode.flags_seen)
    assert all(flags), flags  # the cases above do raise events


@pytest.mark.parametrize("seed", range(3))
def test_embedding_dense_backward(seed):
    rng = np.random.default_rng(400 + seed)
    for _ in range(40):
        num = int(rng.integers(0, 7))
        ishape = tuple(int(rng.integers(0 if rng.random() < 0.1 else 1, 5)) for _ in range(int(rng.integers(0, 3))))
        indices = torch.from_numpy(np.array(rng.integers(-1, num + 2, size=ishape)))
        if rng.random() < 0.3:
            indices = indices.int()
        dim = int(rng.integers(0, 4))
        grad = _layout(rng, _values(rng, (*ishape, dim), rng.random() < 0.25))
        padding = int(rng.choice([-1, 0, 2, num + 5]))
        _check(aten.embedding_dense_backward.default, (grad, indices, num, padding, bool(rng.random() < 0.2)))


def _run_before(fn, operands, elementwise=False):
    """run() as it was: every operand's and every output's finiteness looked at."""
    mode = tb.Binary32Mode()
    with mode:
        out = fn()
    if elementwise:
        return out, mode.flags_seen
    outs = [o for o in (out if isinstance(out, (tuple, list)) else [out])
            if isinstance(o, torch.Tensor) and o.is_floating_point()]
    finite = all(bool(torch.isfinite(t).all()) for t in operands)
    nan_free = not any(bool(torch.isnan(t).any()) for t in operands)
    events = 0
    for o in outs:
        if finite and bool(torch.isinf(o).any()):
            pole = mode.flags_seen & tb_common._DIVBYZERO and not mode.flags_seen & tb_common._OVERFLOW
            events |= tb_common._DIVBYZERO if pole else tb_common._OVERFLOW
        if nan_free and bool(torch.isnan(o).any()):
            events |= tb_common._INVALID
    return out, events


def test_run_events_as_before():
    """run()'s events (OVERFLOW, DIVBYZERO at poles, INVALID) with its operands' checks made lazily:
    the same as looking at every operand first."""
    rng = np.random.default_rng(7)
    fns = [
        lambda x, y: x @ y.T,
        lambda x, y: (torch.log(x.abs()) + y).sum(-1),
        lambda x, y: (x / y, x * y),
        lambda x, y: torch.exp(x) - torch.exp(y),
        lambda x, y: torch.softmax(x, -1),
        lambda x, y: (x.sum(), torch.tensor(3), (x > y)),
        lambda x, y: torch.nn.functional.layer_norm(x, x.shape[-1:], eps=0.0),
        lambda x, y: torch.sqrt(x) * 0,
    ]
    for _ in range(150):
        shape = (int(rng.integers(0, 4)), int(rng.integers(1, 5)))
        x = _values(rng, shape, rng.random() < 0.4)
        y = _values(rng, shape, rng.random() < 0.4)
        if rng.random() < 0.3 and x.numel():
            x.view(-1)[0] = 0.0
        if rng.random() < 0.2:
            y = y.to(torch.float16 if rng.random() < 0.5 else torch.bfloat16)
        for fn in fns:
            operands = [x, y] if rng.random() < 0.8 else [x.double(), y]
            f = lambda fn=fn, x=x, y=y: fn(x, y.float())  # noqa: E731
            try:
                expected = _run_before(f, operands)
            except Exception as e:  # noqa: BLE001
                with pytest.raises(type(e)):
                    tb.run(f, operands)
                continue
            got = tb.run(f, operands)
            _same(got[0], expected[0], "run outputs")
            assert got[1] == expected[1], (got[1], expected[1])


# -- attention: the numpy path against the same steps as torch operations in the mode ------------------
def _math_steps(q, k, v, mask, is_causal, scale):
    """torch's math path written as torch operations, evaluated in Binary32Mode (the reference)."""
    with tb.Binary32Mode():
        if q.shape[-3] != k.shape[-3]:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
            v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
        scores = _score_steps(q, k, mask, is_causal, scale)
        return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


def _score_steps(q, k, mask, is_causal, scale):
    """(q @ k^T) * scale and the mask, as torch operations (in the caller's mode)."""
    scores = (q @ k.transpose(-2, -1)) * float(1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if is_causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return scores


def _backward_steps(grad, q, k, v, out, lse, mask, is_causal, scale, heads):
    with tb.Binary32Mode():
        kk = k.repeat_interleave(heads, -3) if heads > 1 else k
        vv = v.repeat_interleave(heads, -3) if heads > 1 else v
        s = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
        scores = _score_steps(q, kk, mask, is_causal, scale)
        p = torch.exp(scores - lse.unsqueeze(-1))
        dv = p.transpose(-2, -1) @ grad
        ds = p * ((grad @ vv.transpose(-2, -1)) - (grad * out).sum(-1, keepdim=True))
        dq = (ds @ kk) * float(s)
        dk = (ds.transpose(-2, -1) @ q) * float(s)
        if heads > 1:
            dk = dk.unflatten(-3, (k.shape[-3], heads)).sum(-3)
            dv = dv.unflatten(-3, (v.shape[-3], heads)).sum(-3)
    return dq, dk, dv, ds


@pytest.mark.parametrize("seed", range(3))
def test_attention(seed):
    """The math path and flash attention's backward in numpy give the bits of their steps as torch
    operations in Binary32Mode (masks boolean, additive, causal; grouped heads; Inf and NaN)."""
    rng = np.random.default_rng(300 + seed)
    for _ in range(25):
        b, h, L, S, D = (int(rng.integers(1, n)) for n in (3, 4, 7, 7, 9))
        hk = h if rng.random() < 0.7 else 1
        special = rng.random() < 0.2
        q = _values(rng, (b, h, L, D), special)
        k, v = _values(rng, (b, hk, S, D), False), _values(rng, (b, hk, S, D), False)
        kind = int(rng.integers(4))
        mask = [None, None, torch.from_numpy(rng.random((L, S)) < 0.7), _values(rng, (b, 1, L, S), False)][kind]
        causal = kind == 1
        scale = None if rng.random() < 0.5 else float(rng.choice([0.1, 2.0, 1e-3]))
        out, lse = tb_attention._attention_math(q, k, v, mask, causal, scale)
        want_out, want_lse = _math_steps(q, k, v, mask, causal, scale)
        _same(out, want_out.contiguous(), "attention out")
        _same(lse, want_lse.contiguous(), "attention lse")
        grad = _values(rng, (b, h, L, D), False)
        got = tb_attention._attention_backward(None, grad, q, k, v, out, lse, mask, causal, scale, enable_gqa=hk != h)
        want = _backward_steps(grad, q, k, v, out, lse, mask, causal, scale, h // hk)
        for i, (x, y) in enumerate(zip(got, want, strict=True)):
            _same(x, y.contiguous(), f"attention backward [{i}]")


@pytest.mark.parametrize("seed", range(3))
def test_fused_attention_with_dropout_steps_and_gradients(seed):
    """DeviceMode's fused attention with dropout (sim.torch.functions._attention32): its numpy forward and its
    written-out backward give the bits of its torch operations in Binary32Mode and of autograd
    through them (masks boolean, additive, causal; Inf and NaN)."""
    import sim.torch.functions as st

    rng = np.random.default_rng(400 + seed)
    for _ in range(20):
        b, h, L, S, D = (int(rng.integers(1, n)) for n in (3, 4, 7, 7, 9))
        special = rng.random() < 0.2
        q, k, v = (_values(rng, (b, h, n, D), special and i == 0) for i, n in enumerate((L, S, S)))
        kind = int(rng.integers(4))
        bias = _values(rng, [(b, 1, L, S), (1, h, L, S), (L, S), (b, h, L, S)][int(rng.integers(4))], False)
        mask = [None, None, torch.from_numpy(rng.random((L, S)) < 0.7), bias][kind]
        causal = kind == 1
        scale = None if rng.random() < 0.5 else float(rng.choice([0.1, 2.0]))
        p = float(rng.choice([0.1, 0.5]))
        keep = torch.from_numpy((rng.random((b, h, L, S)) >= p).astype(np.float32))
        grad = _values(rng, (b, h, L, D), False)
        assert st._attention_direct(q, k, v, keep, mask, False)
        with tb.Binary32Mode():
            with torch.no_grad():
                got = st._attention32(q, k, v, keep, mask, p, causal, scale, False)
            additive = kind == 3 and rng.random() < 0.5  # a learned bias (T5's): its gradient too
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v, *([mask] if additive else []))]
            m = leaves[3] if additive else mask
            want = st._attention32(*leaves[:3], keep, m, p, causal, scale, False)  # grad on: torch's operations
            want_grads = torch.autograd.grad(want, leaves, grad)
        _same(got, want.detach().contiguous(), "fused attention forward")
        grads = st._attention32_vjp(q, k, v, keep, mask, p, causal, scale, grad, additive)
        for i, (x, y) in enumerate(zip(grads, want_grads, strict=True)):
            _same(x, y.contiguous(), f"fused attention gradient [{i}]")


def _accumulation_case(rng):
    """A destination (contiguous, transposed or a slice of a larger tensor) and the accumulations
    into it, as functions of it, by int64 or int32 indices (negative where torch takes them)."""
    rows, cols = int(rng.integers(1, 6)), int(rng.integers(1, 5))
    base = torch.from_numpy(rng.integers(-4, 5, (7, 7)).astype(np.float32))
    layout = [lambda: base[:rows, :cols].clone(), lambda: base[:cols, :rows].clone().t(),
              lambda: base[1:rows + 1, 1:cols + 1]][int(rng.integers(3))]
    n = int(rng.integers(0, 7))
    index = torch.from_numpy(rng.integers(-rows, rows, n))
    if rng.random() < 0.3:
        index = index.int()
    selected = index % rows  # index_add and index_select take no negative index
    values = torch.from_numpy(rng.integers(-3, 4, (n, cols)).astype(np.float32))
    scatter = torch.from_numpy(rng.integers(0, rows, (min(n, rows), cols)))
    calls = [lambda x: torch.index_put(x, (index,), values, accumulate=True),
             lambda x: x.index_put_((index,), values, accumulate=True),
             lambda x: x.index_add(0, selected, values), lambda x: x.index_add_(0, selected, values, alpha=2),
             lambda x: x.scatter_add(0, scatter, values[:scatter.shape[0]])]
    return layout, calls


@pytest.mark.parametrize("seed", range(3))
def test_accumulations_write_every_layout(seed):
    """index_put (accumulate), index_add and scatter_add in Binary32Mode, into contiguous, transposed
    and sliced tensors, by int64 and int32 indices (negative ones too), as torch's own kernels
    give them: the values are small integers, so every sum is exact in any order and torch's
    result is the reference. An index out of range raises torch's own error."""
    rng = np.random.default_rng(500 + seed)
    for _ in range(30):
        layout, calls = _accumulation_case(rng)
        for call in calls:
            want_x, got_x = layout(), layout()
            want = call(want_x)
            with tb.Binary32Mode():
                got = call(got_x)
            _same(got, want, "result")
            _same(got_x, want_x, "target after")
    for bad in (lambda: torch.index_put(torch.zeros(3, 2), (torch.tensor([3]),), torch.ones(1, 2), accumulate=True),
                lambda: torch.zeros(3, 2).index_add(0, torch.tensor([-1]), torch.ones(1, 2))):
        with pytest.raises((IndexError, RuntimeError)) as native:
            bad()
        with tb.Binary32Mode(), pytest.raises((IndexError, RuntimeError)) as emulated:
            bad()
        assert type(emulated.value) is type(native.value) and str(emulated.value) == str(native.value)
