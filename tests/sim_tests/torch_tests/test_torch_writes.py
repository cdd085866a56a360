"""sim.torch.DeviceMode writes back every argument a kernel writes, as torch does natively, and a
seeded run draws the same values whatever ran before it in the process (issue 30, items 9, 10).

- BatchNorm1d/2d/3d in float16 training: the running statistics follow the momentum update of a
  float64 reference within one binary16 rounding an update (the fused route; the unfused
  decomposition within its few roundings), ``num_batches_tracked`` counts, and the model
  evaluated afterwards normalises with the updated statistics.
  InstanceNorm's running statistics too, and a TorchWorkload with BatchNorm evaluates as its
  binary32 baseline.
- Every aten overload whose schema writes an argument: the mode's write-back finds each of them;
  a curated list of kernels that write arguments besides ``self`` and ``out`` (marked or not:
  native_batch_norm, batch_norm_update_stats) called for real, each argument they write compared
  with torch's native kernel; and every such overload callable with arguments made from its
  schema (384 in torch 2.13, out= arguments of any name: grad_input, output...) run natively and under
  the mode in float16 and bfloat16, the same arguments written, with torch's values.
- rrelu_with_noise in training: its noise written, the backward reading it.
- A seeded draw under the mode is the same draw first or later in the process (the dtype probe
  draws nothing), a random out= overload writes its out with the functional draw, and two models'
  seeded steps are bit-identical in any order.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import sim.torch.mode as simmode  # noqa: E402
import sim.torch.routes as simroutes  # noqa: E402
from sim import Device  # noqa: E402
from sim.torch import DeviceMode  # noqa: E402

aten = torch.ops.aten
F16 = torch.float16
PROFILES = ["atlas-a2", "atlas-training"]


def ulp16(x: np.ndarray) -> np.ndarray:
    """The spacing of binary16 at each value (float64; subnormal spacing near zero)."""
    x = np.abs(np.asarray(x, np.float64))
    e = np.floor(np.log2(np.maximum(x, 2.0**-14)))
    return 2.0 ** (e - 10)


def within(got: torch.Tensor, ref, ulps: float) -> bool:
    """got (a binary16 tensor) within ``ulps`` binary16 spacings of the float64 reference."""
    g = got.detach().double().numpy()
    r = np.asarray(ref, np.float64)
    with np.errstate(invalid="ignore"):
        return bool(np.all((g == r) | (np.abs(g - r) <= ulps * ulp16(r))))


def bits(t: torch.Tensor) -> list[int]:
    a = t.detach().contiguous().reshape(-1)
    return a.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]).tolist()


# --- (a) BatchNorm's running statistics ---------------------------------------------------------------
BATCH_NORMS = {1: (torch.nn.BatchNorm1d, (6, 3, 5)), 2: (torch.nn.BatchNorm2d, (4, 3, 3, 4)),
               3: (torch.nn.BatchNorm3d, (3, 3, 2, 3, 2))}
STEPS = 4
MOMENTUM = 0.1


def batches(shape, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=g, dtype=torch.float64) * (1.5 + k) + (0.7 - k)).half()
            for k in range(STEPS)]


def new_bn(d: int) -> torch.nn.Module:
    torch.manual_seed(d)
    bn = BATCH_NORMS[d][0](3, momentum=MOMENTUM)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2.0)
        bn.bias.uniform_(-1.0, 1.0)
    return bn.half()


def moments64(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The batch mean and unbiased variance per channel, in float64 from the exact inputs."""
    a = x.double().numpy()
    axes = (0, *range(2, a.ndim))
    return a.mean(axes), a.var(axes, ddof=1)


def check_updates(bn: torch.nn.Module, xs: list[torch.Tensor], step, ulps: float) -> None:
    """Train ``bn`` on xs with ``step(bn, x)``; after each step its running statistics are the
    float64 momentum update of the previous ones within ``ulps`` binary16 spacings."""
    for k, x in enumerate(xs):
        mean0, var0 = bn.running_mean.double().numpy().copy(), bn.running_var.double().numpy().copy()
        step(bn, x)
        mean, var = moments64(x)
        assert bn.running_mean.dtype == bn.running_var.dtype == F16
        assert within(bn.running_mean, (1 - MOMENTUM) * mean0 + MOMENTUM * mean, ulps), (k, bn.running_mean, mean)
        assert within(bn.running_var, (1 - MOMENTUM) * var0 + MOMENTUM * var, ulps), (k, bn.running_var, var)
        assert int(bn.num_batches_tracked) == k + 1


def test_the_float64_reference_holds_for_torch_natively() -> None:
    """The reference is right: torch's own float16 kernel is within one rounding an update."""
    for d, (_, shape) in BATCH_NORMS.items():
        check_updates(new_bn(d), batches(shape, d), lambda bn, x: bn(x), 1)


@pytest.mark.parametrize("fused", [None, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("d", sorted(BATCH_NORMS))
def test_batch_norm_updates_its_running_statistics_under_the_mode(d: int, profile: str, fused) -> None:
    shape = BATCH_NORMS[d][1]
    dev = Device(profile)

    def step(bn, x):
        x = x.clone().requires_grad_()
        with DeviceMode(dev, fused=fused) as mode:
            y = bn(x)
            (y * y).sum().backward()  # training as in a loop: the backward runs too
        routes = {route for (name, route) in mode.routes if "batch_norm" in name}
        assert routes == ({"fused"} if fused is None else set()), mode.routes
        assert x.grad is not None and bool(torch.isfinite(x.grad).all())

    # The fused kernel computes the update in binary32 and rounds it once; the unfused decomposition
    # computes the batch mean, the variance and the update operation by operation in binary16 (a
    # mean, products and a sum, each rounded): a few spacings.
    bn = new_bn(d)
    check_updates(bn, batches(shape, d), step, 1 if fused is None else 6)

    # Evaluated after training (under the mode), the model normalises with the trained statistics:
    # torch's natively trained ones, to within their few roundings.
    native = new_bn(d)
    for x in batches(shape, d):
        native(x)
    bn.eval()
    x = batches(shape, 100 + d)[1]
    with DeviceMode(dev, fused=fused):
        y = bn(x)
    a = x.double().numpy()
    c = (1, 3) + (1,) * (a.ndim - 2)
    ref = ((a - native.running_mean.double().numpy().reshape(c)) / np.sqrt(native.running_var.double().numpy()
                                                                           .reshape(c) + bn.eps)
           * bn.weight.double().detach().numpy().reshape(c) + bn.bias.double().detach().numpy().reshape(c))
    got = y.detach().double().numpy()
    assert np.allclose(got, ref, rtol=1e-2, atol=2e-2), np.abs(got - ref).max()
    assert int(bn.num_batches_tracked) == STEPS


def test_a_model_trained_under_the_mode_evaluates_with_its_trained_statistics() -> None:
    """A small conv net with BatchNorm2d trained a few SGD steps under the mode (fused default)
    evaluates, under the mode, as the same net does with its statistics from native training."""
    def net():
        torch.manual_seed(7)
        return torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 3)).half()

    g = torch.Generator().manual_seed(3)
    xs = [(torch.randn(8, 2, 6, 6, generator=g) * 3 + 2).half() for _ in range(3)]
    ys = [torch.randint(0, 3, (8,), generator=g) for _ in range(3)]
    dev = Device("atlas-a2")
    ours = net()
    opt = torch.optim.SGD(ours.parameters(), lr=0.01)
    for x, y in zip(xs, ys, strict=True):
        with DeviceMode(dev):
            loss = torch.nn.functional.cross_entropy(ours(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    bn = ours[1]
    assert not torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean))
    # The statistics average the conv's outputs, which depend on the weights of each step: a float64
    # twin trained with the same steps gives them, to within the float16 training's errors.
    twin = net().double()
    opt64 = torch.optim.SGD(twin.parameters(), lr=0.01)
    for x, y in zip(xs, ys, strict=True):
        loss = torch.nn.functional.cross_entropy(twin(x.double()), y)
        opt64.zero_grad()
        loss.backward()
        opt64.step()
    ref = twin[1]
    assert np.allclose(bn.running_mean.double().numpy(), ref.running_mean.numpy(), rtol=2e-2, atol=2e-2)
    assert np.allclose(bn.running_var.double().numpy(), ref.running_var.numpy(), rtol=2e-2, atol=2e-2)
    ours.eval()
    twin.eval()
    x = (torch.randn(5, 2, 6, 6, generator=g) * 3 + 2).half()
    with DeviceMode(dev):
        out = ours(x)
    assert np.allclose(out.double().detach().numpy(), twin(x.double()).detach().numpy(), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("fused", [None, False], ids=["fused", "unfused"])
def test_instance_norm_updates_its_running_statistics_under_the_mode(fused) -> None:
    """InstanceNorm with running statistics: torch's composite runs batch norm on repeated copies
    of the statistics (native_batch_norm: the fused route, or float32 when unfused) and averages
    them back; the mode's statistics are torch's own within a rounding an update."""
    for norm, shape in ((torch.nn.InstanceNorm1d, (4, 3, 10)), (torch.nn.InstanceNorm2d, (3, 3, 4, 5))):
        ours, native = (norm(3, affine=True, track_running_stats=True).half() for _ in range(2))
        for x in batches(shape, 40):
            with DeviceMode(Device("atlas-a2"), fused=fused):
                ours(x)
            native(x)
        assert not torch.equal(native.running_mean, torch.zeros_like(native.running_mean))
        assert within(ours.running_mean, native.running_mean.double().numpy(), STEPS), (ours.running_mean,
                                                                                         native.running_mean)
        assert within(ours.running_var, native.running_var.double().numpy(), STEPS), (ours.running_var,
                                                                                       native.running_var)


class _BnNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.bn, self.fc2 = torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def test_a_torch_workload_with_batch_norm_evaluates_as_its_binary32_baseline() -> None:
    """The issue's symptom: a TorchWorkload with BatchNorm trained on the device evaluated with its
    initial statistics (loss far above the binary32 baseline's). Inputs far from zero mean."""
    from lossscale import simulate
    from lossscale.training.workloads.torch_workloads import TorchWorkload

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((512, 8)) * 3 + 5).astype(np.float32)
    y = (x[:, 0] > 5).astype(np.int64) + (x[:, 1] > 6)
    wl = TorchWorkload(_BnNet(), lambda out, t: torch.nn.functional.cross_entropy(out.float(), t), (x, y),
                       batch=64, learning_rate=0.05, momentum=0.9, name="bn")
    run = simulate(workload=wl, manager="fixed", profile="atlas-a2", steps=15)
    final, baseline = run.summary["final"], run.summary["baseline_float32"]
    assert final["loss"] == pytest.approx(baseline["loss"], rel=0.05), (final, baseline)
    assert abs(final["accuracy"] - baseline["accuracy"]) <= 0.03, (final, baseline)


# --- (b) every kernel that writes an argument -----------------------------------------------------------
def _overloads_writing():
    """Every aten overload whose schema writes an argument."""
    found = []
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        if not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            continue
        packet = getattr(aten, schema.name[len("aten::"):], None)
        if packet is None:
            continue
        func = getattr(packet, schema.overload_name or "default", None)
        if func is not None:
            found.append(func)
    return found


def _type_is(arg, *names: str) -> bool:
    return str(arg.type).rstrip("?") in names


def test_the_write_back_finds_every_argument_a_schema_writes() -> None:
    """For every aten overload with a written Tensor or Tensor[] argument that may take a fused or
    float32 route (not exact, not a factory), the mode's write-back finds each written tensor,
    passed as the dispatcher passes it (positional, keyword-only ones by keyword)."""
    checked = 0
    for func in _overloads_writing():
        if simroutes._kind(func) in ("exact", "factory"):
            continue
        args, kwargs, want = [], {}, []
        for a in func._schema.arguments:
            write = a.alias_info is not None and a.alias_info.is_write
            if _type_is(a, "Tensor"):
                v = torch.zeros(1, dtype=F16)
                if write:
                    want.append(v)
            elif _type_is(a, "Tensor[]"):
                v = [torch.zeros(1, dtype=F16), torch.zeros(2, dtype=F16)]
                if write:
                    want.extend(v)
            else:
                v = None
            if a.kwarg_only:
                kwargs[a.name] = v
            else:
                args.append(v)
        if not want:
            continue
        found = {id(t) for t in simmode._written(func, tuple(args), kwargs)}
        assert all(id(t) in found for t in want), func
        checked += 1
    assert checked > 500


def h(*shape, lo=-1.0, hi=1.0, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + sum(shape))
    return (torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).half()


def _bn_args(training=True, stats=True, seed=1):
    x = h(4, 3, 5, lo=-2, hi=3, seed=seed)
    return [x, h(3, lo=0.5, hi=2, seed=seed + 1), h(3, seed=seed + 2)] + \
        ([h(3, seed=seed + 3), h(3, lo=0.5, hi=2, seed=seed + 4)] if stats else []) + [training, 0.1, 1e-5]


def _outs(*shapes, dtype=F16):
    return [torch.full(s, float("nan"), dtype=dtype) if dtype.is_floating_point else torch.zeros(s, dtype=dtype)
            for s in shapes]


def _bn_outs() -> dict:
    return dict(zip(("out", "save_mean", "save_invstd"), _outs((4, 3, 5), (3,), (3,)), strict=True))


def _steps(n=2):
    return [torch.tensor(float(n))]


def _adam_args(amsgrad=False):
    p, g, m, v = h(7, seed=1), h(7, seed=2), h(7, seed=3), h(7, lo=0, hi=0.5, seed=4)
    return ([p], [g], [m], [v], [h(7, lo=0.5, hi=0.6, seed=5)] if amsgrad else [], _steps()), \
        dict(lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.01, eps=1e-8, amsgrad=amsgrad, maximize=False)


#: Kernels that write arguments, called for real: (overload, args, kwargs, mode options). Each
#: argument they write is compared with torch's native kernel's.
CALLS = [
    (aten.native_batch_norm.default, _bn_args(), {}, {}),
    (aten.native_batch_norm.default, _bn_args(training=False), {}, {}),
    (aten.native_batch_norm.out, _bn_args(), _bn_outs(), {}),
    (aten._native_batch_norm_legit.default, _bn_args(seed=5), {}, {}),
    (aten._native_batch_norm_legit.out, _bn_args(seed=6), _bn_outs(), {}),
    (aten._native_batch_norm_legit.no_stats, _bn_args(stats=False), {}, {}),
    (aten._batch_norm_with_update.default, _bn_args(seed=7)[:5] + [0.1, 1e-5], {}, {}),
    (aten.batch_norm_update_stats.default, [h(4, 3, 5, lo=-2, hi=3), h(3, seed=8), h(3, lo=0.5, hi=2, seed=9), 0.1],
     {}, {}),
    (aten.rrelu_with_noise.default, [h(9), h(9, lo=0.2, hi=0.3), 0.1, 0.3, False], {}, {}),
    (aten._cummax_helper.default, [h(9), *_outs((9,)), torch.zeros(9, dtype=torch.long), 0], {}, {}),
    (aten._cummin_helper.default, [h(9), *_outs((9,)), torch.zeros(9, dtype=torch.long), 0], {}, {}),
    (aten._amp_foreach_non_finite_check_and_unscale_.default,
     [[h(5), torch.tensor([1.0, float("inf")], dtype=F16)], torch.zeros(1), torch.tensor([0.25])], {}, {}),
    (aten._fused_adam_.default, *_adam_args(), {}),
    (aten._fused_adam_.default, *_adam_args(amsgrad=True), {}),
    (aten._fused_adamw_.default, *_adam_args(), {}),
    (aten._fused_sgd_.default, ([h(7, seed=1)], [h(7, seed=2)], [h(7, seed=3)]),
     dict(weight_decay=0.01, momentum=0.9, lr=0.1, dampening=0.0, nesterov=True, maximize=False,
          is_first_step=False), {}),
    (aten._fused_adagrad_.default, ([h(7, seed=1)], [h(7, seed=2)], [h(7, lo=0.1, hi=1, seed=3)], _steps()),
     dict(lr=0.1, lr_decay=0.0, weight_decay=0.0, eps=1e-10, maximize=False), {}),
    (aten._fused_moving_avg_obs_fq_helper.default,
     [h(4, 3).float(), torch.tensor([1]), torch.tensor([1]), torch.tensor([-0.5]), torch.tensor([0.5]),
      torch.tensor([0.1]), torch.tensor([3], dtype=torch.int32), 0.01, 0, 255, 0], {}, dict(float32=True)),
    # in-place and out= kernels of the float32 route, writing self or out
    (aten.index_add_.default, [h(5, 3), 0, torch.tensor([0, 2, 0]), h(3, 3, seed=4)], {}, {}),
    (aten.addcdiv_.default, [h(6), h(6, seed=1), h(6, lo=0.5, hi=1, seed=2)], dict(value=0.3), {}),
    (aten.erfinv.out, [h(6, lo=-0.9, hi=0.9)], dict(out=_outs((6,))[0]), {}),
    (aten.atan2.out, [h(6), h(6, seed=3)], dict(out=_outs((2,))[0]), {}),
]


#: Called with arguments under which torch writes nothing (evaluation): nothing written under the mode.
WRITE_NOTHING = (aten.native_batch_norm.default, aten._native_batch_norm_legit.no_stats, aten.rrelu_with_noise.default)


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(y) for y in x)
    return x


def _tensors_of(args, kwargs) -> list[torch.Tensor]:
    out = []
    for x in list(args) + list(kwargs.values()):
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out.extend(t for t in x if isinstance(t, torch.Tensor))
    return out


def _changed(before: list[torch.Tensor], after: list[torch.Tensor]) -> list[int]:
    return [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if b.shape != a.shape or bits(b) != bits(a)]


@pytest.mark.parametrize("func, args, kwargs, options", CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(CALLS)])
def test_every_written_argument_is_written_back_as_natively(func, args, kwargs, options) -> None:
    # torch natively: which arguments it writes (its schema may not say: native_batch_norm), and how
    n_args, n_kwargs = _clone(args), _clone(kwargs)
    before = [t.clone() for t in _tensors_of(args, kwargs)]
    func(*n_args, **n_kwargs)
    native = _tensors_of(n_args, n_kwargs)
    written = _changed(before, native)
    if func not in WRITE_NOTHING or func is aten.native_batch_norm.default and args[5]:
        assert written, "the call writes nothing natively: no test"

    # the mode finds each of them
    m_args, m_kwargs = _clone(args), _clone(kwargs)
    ours = _tensors_of(m_args, m_kwargs)
    found = {id(t) for t in simmode._written(func, tuple(m_args), m_kwargs)}
    assert all(id(ours[i]) in found for i in written), func

    # under the mode: the same arguments written, each within one binary16 rounding of torch's (the
    # kernels compute in binary32 and round once, as torch's float16 kernels do); integer ones exact
    with DeviceMode(Device("atlas-a2"), **options) as mode:
        func(*m_args, **m_kwargs)
    assert {route for _, route in mode.routes} <= {"fused", "float32", "random"}, mode.routes
    assert _changed(before, ours) == written
    for i in written:
        n, o = native[i], ours[i]
        assert n.dtype == o.dtype and n.shape == o.shape
        if o.dtype == F16:
            assert within(o, n.double().numpy(), 1), (i, o, n)
        elif o.is_floating_point():
            assert torch.allclose(o, n, rtol=1e-6, atol=0), (i, o, n)
        else:
            assert torch.equal(o, n), (i, o, n)


def _auto_call(func, dtype: torch.dtype):
    """A call of ``func`` made from its schema alone, or None: each Tensor a fresh 6-vector of
    ``dtype`` in [0.25, 0.75] (Tensor[]: two), numbers 0.5, ints 0, bools False, optional ones None;
    arguments with defaults (unless written) left to them, so positional ones from the first."""
    args, kwargs, defaults = [], {}, False
    for i, a in enumerate(func._schema.arguments):
        kind = str(a.type).rstrip("?")
        written = a.alias_info is not None and a.alias_info.is_write
        if not a.kwarg_only and (defaults or a.has_default_value() and not written):
            defaults = True
            continue
        if a.kwarg_only and a.has_default_value() and not written:
            continue
        if kind == "Tensor":
            v = h(6, lo=0.25, hi=0.75, seed=i).to(dtype)
        elif kind == "Tensor[]":
            v = [h(6, lo=0.25, hi=0.75, seed=i).to(dtype), h(6, lo=0.25, hi=0.75, seed=i + 10).to(dtype)]
        elif kind in ("Scalar", "float"):
            v = 0.5
        elif kind == "int":
            v = 0
        elif kind == "bool":
            v = False
        elif str(a.type).endswith("?"):
            v = None
        else:
            return None
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            args.append(v)
    return args, kwargs


#: Overloads the automatic call cannot judge, and why.
NOT_JUDGED = {
    "aten._no_grad_normal_.default": "a random draw not tagged as one: the values differ from torch's",
    "aten.resize_as.out": "torch's meta kernel of resize_as.out refuses its own out= argument",
}


@pytest.mark.parametrize("dtype", [F16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_every_kernel_writing_an_argument_writes_it_back_as_natively(dtype, recwarn) -> None:
    """Every aten overload whose schema writes an argument and that the mode does not take as exact
    or as a factory, called with arguments made from its schema: where torch runs it natively and
    writes some argument, under the mode it writes the same arguments (none left unwritten), with
    values near torch's (random draws: written, values not compared)."""
    judged = 0
    for func in _overloads_writing():
        if simroutes._kind(func) in ("exact", "factory") or str(func) in NOT_JUDGED:
            continue
        call = _auto_call(func, dtype)
        if call is None:
            continue
        args, kwargs = call
        before = [t.clone() for t in _tensors_of(args, kwargs)]
        n_args, n_kwargs = _clone(args), _clone(kwargs)
        try:
            func(*n_args, **n_kwargs)
        except Exception:  # noqa: BLE001 - arguments torch refuses: no call to judge
            continue
        native = _tensors_of(n_args, n_kwargs)
        written = _changed(before, native)
        if not written:
            continue
        m_args, m_kwargs = _clone(args), _clone(kwargs)
        with DeviceMode(Device("atlas-a2")):
            func(*m_args, **m_kwargs)
        ours = _tensors_of(m_args, m_kwargs)
        assert _changed(before, ours) == written, func
        if torch.Tag.nondeterministic_seeded not in func.tags:
            eps = torch.finfo(dtype).eps
            for i in written:
                n, o = native[i], ours[i]
                assert n.shape == o.shape and n.dtype == o.dtype, func
                assert torch.allclose(o.double(), n.double(), rtol=2e-2, atol=4 * eps, equal_nan=True), (func, o, n)
        judged += 1
    assert judged > 350


# --- (c) rrelu_with_noise in training ----------------------------------------------------------------
LOWER, UPPER = 0.125, 0.375


@pytest.mark.parametrize("profile", PROFILES)
def test_rrelu_with_noise_in_training_writes_its_noise_and_its_backward_reads_it(profile: str) -> None:
    x = h(40, lo=-3, hi=2, seed=11)
    assert bool((x < 0).any()) and bool((x > 0).any())
    g = h(40, lo=-2, hi=2, seed=12)
    noise = torch.full_like(x, float("nan"))  # unwritten memory shows as NaN
    xg = x.clone().requires_grad_()
    with DeviceMode(Device(profile)):
        y = aten.rrelu_with_noise(xg, noise, LOWER, UPPER, True)
        y.backward(g)
    n = noise.double().numpy()
    a = x.double().numpy()
    assert not np.isnan(n).any()
    assert np.all(n[a > 0] == 1.0)
    assert np.all((n[a <= 0] >= LOWER) & (n[a <= 0] <= UPPER))
    assert len(set(n[a <= 0].tolist())) > 1  # drawn, not one slope
    # y: x times the drawn slope, rounded once (the noise itself a rounding of that slope)
    assert within(y, a * n, 1.5)
    # the gradient: grad times the noise slope, one rounding (the product is exact in binary32)
    assert bits(xg.grad) == bits(torch.from_numpy(g.double().numpy() * n).half())

    # in place and out=: the noise written too
    for call in ("inplace", "out"):
        noise = torch.full_like(x, float("nan"))
        target = x.clone()
        with DeviceMode(Device(profile)):
            if call == "inplace":
                aten.rrelu_with_noise_(target, noise, LOWER, UPPER, True)
            else:
                out = torch.full_like(x, float("nan"))
                aten.rrelu_with_noise.out(x, noise, LOWER, UPPER, True, out=out)
                target = out
        n = noise.double().numpy()
        assert not np.isnan(n).any() and np.all(n[a > 0] == 1.0)
        assert np.all((n[a <= 0] >= LOWER) & (n[a <= 0] <= UPPER))
        assert within(target, a * n, 1.5), call


def test_rrelu_module_in_training_backward_is_the_slope_times_the_gradient() -> None:
    """nn.RReLU's own noise (torch.empty_like, never seen by the test): the backward gives each
    non-positive element grad times a slope in [lower, upper], agreeing with the forward's y / x."""
    x = h(64, lo=-3, hi=-0.5, seed=21).requires_grad_()
    g = torch.ones(64, dtype=F16)
    with DeviceMode(Device("atlas-a2")):
        y = torch.nn.functional.rrelu(x, LOWER, UPPER, training=True)
        y.backward(g)
    slope = x.grad.double().numpy()
    assert np.all((slope >= LOWER) & (slope <= UPPER)), slope
    ratio = y.detach().double().numpy() / x.detach().double().numpy()
    assert np.allclose(ratio, slope, rtol=2e-3, atol=0)


# --- (d) seeded draws -------------------------------------------------------------------------------------
def _draws():
    """Seeded float16 draws under the mode, each of a shape (and rank) met nowhere else."""
    return {
        "rand": lambda: torch.rand(3, 1, 5, 1, 2, 1, dtype=F16),
        "randn": lambda: torch.randn(2, 1, 3, 1, 2, 1, 1, dtype=F16),
        "rand_like": lambda: torch.rand_like(torch.zeros(7, 1, 3, dtype=F16)),
        "rand_generator": lambda: torch.rand(4, 1, 3, 1, 1, dtype=F16, generator=torch.Generator().manual_seed(9)),
        "normal": lambda: torch.normal(0.5, 2.0, (3, 1, 1, 7), dtype=F16),
        "bernoulli_": lambda: torch.empty(5, 1, 1, 1, 3, dtype=F16).bernoulli_(0.3),
        "uniform_": lambda: torch.empty(9, 1, 2, 1, dtype=F16).uniform_(-2, 2),
        "dropout": lambda: torch.nn.functional.dropout(torch.ones(4, 1, 9, 1, 1, dtype=F16), 0.4),
        "native_dropout": lambda: aten.native_dropout(torch.ones(3, 1, 11, dtype=F16), 0.4, True)[1],
    }


@pytest.mark.parametrize("name", sorted(_draws()))
def test_the_first_seeded_draw_of_a_shape_is_the_later_ones(name: str, monkeypatch) -> None:
    monkeypatch.setattr(simroutes, "_DTYPES", {})  # as in a fresh process: every signature new
    draw = _draws()[name]
    results, states = [], []
    for _ in range(3):
        torch.manual_seed(1234)
        with DeviceMode(Device("atlas-a2")):
            results.append(draw())
        states.append(torch.get_rng_state())
    assert bits(results[0]) == bits(results[1]) == bits(results[2])
    assert torch.equal(states[0], states[1]) and torch.equal(states[1], states[2])


def _floor16(u: torch.Tensor) -> torch.Tensor:
    """Binary64 values rounded toward -inf into binary16, as a uniform draw is (numpy rounds to
    nearest; one step down where that went up)."""
    a = u.numpy()
    f = a.astype(np.float16)
    up = f.astype(np.float64) > a
    f[up] = np.nextafter(f[up], np.float16(-np.inf))
    return torch.from_numpy(f)


def test_a_seeded_rand_draws_once() -> None:
    """torch.rand under the mode draws binary64 uniforms from torch's generator, once: after the
    seed, its values are the generator's first ones (rounded toward -inf), not its later ones."""
    shape = (2, 1, 1, 3, 1, 1, 1, 2)
    torch.manual_seed(99)
    first = torch.empty(shape, dtype=torch.float64).uniform_(0.0, 1.0)
    state = torch.get_rng_state()
    saved = simroutes._DTYPES
    simroutes._DTYPES = {}
    try:
        torch.manual_seed(99)
        with DeviceMode(Device("atlas-a2")):
            got = torch.rand(shape, dtype=F16)
    finally:
        simroutes._DTYPES = saved
    assert bits(got) == bits(_floor16(first))
    assert torch.equal(torch.get_rng_state(), state)


def _mean16():
    return h(7, lo=-1, hi=1, seed=31)


#: Random draws and their out= overloads: (functional draw, the same draw into out).
RANDOM_OUTS = {
    "rand": (lambda: torch.rand(7, dtype=F16), lambda o: torch.rand(7, out=o)),
    "randn": (lambda: torch.randn(7, dtype=F16), lambda o: torch.randn(7, out=o)),
    "normal.float_float": (lambda: torch.normal(0.5, 2.0, (7,), dtype=F16),
                           lambda o: torch.normal(0.5, 2.0, (7,), out=o)),
    "normal.Tensor_float": (lambda: torch.normal(_mean16(), 2.0), lambda o: torch.normal(_mean16(), 2.0, out=o)),
    "normal.Tensor_Tensor": (lambda: torch.normal(_mean16(), _mean16().abs()),
                             lambda o: torch.normal(_mean16(), _mean16().abs(), out=o)),
    "bernoulli": (lambda: torch.bernoulli(_mean16().abs()), lambda o: torch.bernoulli(_mean16().abs(), out=o)),
    "uniform": (lambda: aten.uniform(_mean16(), -2.0, 3.0), lambda o: aten.uniform.out(_mean16(), -2.0, 3.0, out=o)),
}


@pytest.mark.parametrize("name", sorted(RANDOM_OUTS))
def test_a_random_out_overload_writes_its_out_with_the_functional_draw(name: str) -> None:
    functional, into = RANDOM_OUTS[name]
    torch.manual_seed(77)
    with DeviceMode(Device("atlas-a2")):
        want = functional()
    out = torch.full((7,), float("nan"), dtype=F16)
    torch.manual_seed(77)
    with DeviceMode(Device("atlas-a2")):
        got = into(out)
    assert got is out
    assert bits(out) == bits(want)


def test_uniform_with_only_its_lower_bound_draws_up_to_one() -> None:
    """x.uniform_(-2): from -2 to torch's default 1 (binary64 uniforms u, -2 + 3u rounded toward -inf)."""
    torch.manual_seed(5)
    u = torch.empty(500, dtype=torch.float64).uniform_(0.0, 1.0)
    x = torch.zeros(500, dtype=F16)
    torch.manual_seed(5)
    with DeviceMode(Device("atlas-a2")):
        x.uniform_(-2)
    assert float(x.max()) > 0.5
    assert bits(x) == bits(_floor16(-2.0 + 3.0 * u))


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 16), torch.nn.Linear(16, 3)
        self.drop = torch.nn.Dropout(0.3)

    def forward(self, x):
        return self.b(self.drop(torch.relu(self.a(x))))


class _Conv(torch.nn.Module):
    """A conv block with batch norm, dropout and a drop-path (timm's: new_empty().bernoulli_())."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.BatchNorm2d(4)
        self.drop, self.head = torch.nn.Dropout(0.2), torch.nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        keep = y.new_empty((y.shape[0], 1, 1, 1)).bernoulli_(0.8).div_(0.8)
        y = x.repeat(1, 2, 1, 1) + y * keep
        return self.head(self.drop(y.flatten(1)))


def _seeded_steps(model: type, seed: int) -> list[list[int]]:
    """Two seeded SGD steps of a new model under the mode, its inputs drawn under the mode: the
    losses' bits."""
    torch.manual_seed(seed)
    net = model().half()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    dev = Device("atlas-a2")
    losses = []
    for _ in range(2):
        with DeviceMode(dev):
            x = torch.randn((5, 6) if model is _Mlp else (5, 2, 4, 4), dtype=F16)
            noise = torch.rand(5, 3, dtype=F16)  # the same rank in both models: one probe between them
            y = torch.randint(0, 3, (5,))
            loss = torch.nn.functional.cross_entropy(net(x) + noise, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses.append(bits(loss))
    return losses


def test_two_models_seeded_steps_are_the_same_in_any_order(monkeypatch) -> None:
    runs = {}
    for order in ((_Mlp, _Conv), (_Conv, _Mlp), (_Mlp, _Mlp)):
        monkeypatch.setattr(simroutes, "_DTYPES", {})  # each order as in a fresh process
        for model in order:
            runs.setdefault(model, []).append(_seeded_steps(model, 5))
    for model, seen in runs.items():
        assert all(s == seen[0] for s in seen), (model.__name__, seen)
