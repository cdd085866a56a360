"""``lossscale.torch.GradScaler`` in an unchanged torch AMP loop: against torch's own
``torch.amp.GradScaler("cpu")`` in INF/NaN mode, against the register in saturation mode, its
checkpoints, and its run folder."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lossscale  # noqa: E402
from lossscale import trajectory  # noqa: E402
from lossscale.policy.frameworks import KerasPolicy  # noqa: E402
from lossscale.torch import GradScaler  # noqa: E402
from lossscale.training.detectors import DETECTORS, TorchNpu  # noqa: E402
from sim import Device  # noqa: E402
from sim.torch import DeviceMode  # noqa: E402

from groups import representatives  # noqa: E402

F = torch.nn.functional


class Net(torch.nn.Module):
    """float32 parameters, float16 activations between the layers (autocast style). The
    matmuls stay in float32: torch's CPU float16 gemm adds in another order than the device's
    ascending binary32 sum (checked: last-bit differences with k as small as 6), while the
    float16 operations here (casts, relu, a multiply) are correctly rounded on both."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
        self.register_buffer("gate", torch.linspace(0.5, 1.5, 32).half())

    def forward(self, x):
        h = torch.relu(self.fc1(x).half()) * self.gate
        return self.fc2(h.float())


class CountingSGD(torch.optim.SGD):
    """SGD that records which steps it applied (the oracle of the skipped steps)."""

    def __init__(self, params) -> None:
        super().__init__(params, lr=0.05)
        self.applied: list[bool] = []

    def step(self, closure=None):
        self.applied[-1] = True
        return super().step(closure)


DATA = [(torch.randn(32, 16, generator=torch.Generator().manual_seed(t)) * 2,
         torch.randint(0, 4, (32,), generator=torch.Generator().manual_seed(100 + t))) for t in range(40)]


def train(scaler, dev: Device | None, steps: range, model: Net | None = None, opt: CountingSGD | None = None,
          check=None):
    """The AMP loop, as in torch's documentation; the scale each step used and the applied steps."""
    model = model or Net(0)
    opt = opt or CountingSGD(model.parameters())
    scales = []
    for t in steps:
        x, y = DATA[t % len(DATA)]
        opt.zero_grad()
        opt.applied.append(False)
        with DeviceMode(dev) if dev is not None else contextlib.nullcontext():
            loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
        if check is not None:
            check(model)
        scales.append(scaler.get_scale())
        scaler.step(opt)
        scaler.update()
    return scales, opt.applied[-len(steps):], model, opt


def test_import_lossscale_does_not_import_torch() -> None:
    code = "import sys, lossscale, lossscale.policy, lossscale.training; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bit_identical_to_torch_amp_in_inf_nan_mode() -> None:
    ours = GradScaler(Device("atlas-a2"), init_scale=2.0**24, growth_interval=4, detector="isfinite")
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_interval=4)
    s1, a1, m1, _ = train(ours, ours.device, range(40))
    s2, a2, m2, _ = train(theirs, None, range(40))
    assert 0 < a2.count(False) < 30 and max(s2) > min(s2[5:])  # the loop overflows, skips, and grows back
    assert np.array(s1, np.float32).tobytes() == np.array(s2, np.float32).tobytes()
    assert a1 == a2
    for p, q in zip(m1.parameters(), m2.parameters(), strict=True):
        assert torch.equal(p, q)
    assert [r.applied for r in ours.rows] == a2 and [r.loss_scale for r in ours.rows] == s2


def test_saturation_mode_skips_what_the_register_shows() -> None:
    dev = Device("atlas-training")
    grads_finite, registers = [], []

    def check(model):
        grads_finite.append(all(bool(torch.isfinite(p.grad).all()) for p in model.parameters()))
        registers.append(bool(dev.get_float_status().any()))

    scaler = GradScaler(dev, init_scale=2.0**24, growth_interval=4)  # torch-npu: the register
    _, applied, _, _ = train(scaler, dev, range(30), check=check)
    assert all(grads_finite)  # saturated, never Inf: torch's isfinite check would skip nothing
    assert applied.count(False) >= 3
    assert [not a for a in applied] == registers
    naive = GradScaler(Device("atlas-training"), init_scale=2.0**24, growth_interval=4, detector="isfinite")
    assert all(train(naive, naive.device, range(30))[1])  # the naive check lets the saturated steps through


def test_torch_npu_clears_at_scale_so_forward_events_do_not_skip() -> None:
    """An overflow in the forward pass before scale() (a logged float16 value) is cleared by
    torch-npu's scale(), and is kept by tf-npu, whose window runs from its last read."""
    skipped = {}
    for name in ("torch-npu", "tf-npu"):
        dev = Device("atlas-training")
        scaler = GradScaler(dev, init_scale=1.0, detector=name)
        model, opt = Net(0), None
        for t in range(3):
            x, y = DATA[t]
            with DeviceMode(dev):
                (torch.tensor([60000.0]).half() * 4).sum()  # saturates: a register event, feeding nothing
                loss = F.cross_entropy(model(x), y)
                scaler.scale(loss).backward()
            opt = opt or CountingSGD(model.parameters())
            opt.applied.append(False)
            scaler.step(opt)
            scaler.update()
        skipped[name] = [not r.applied for r in scaler.rows]
    assert skipped == {"torch-npu": [False] * 3, "tf-npu": [True] * 3}


@pytest.mark.parametrize("policy", representatives([None, "torch-npu", "keras"], lambda p: p is None, str))
def test_state_dict_round_trip_continues_bit_for_bit(policy) -> None:
    torch_args = {"init_scale": 2.0**24, "growth_interval": 4}
    args = {None: {}, "torch-npu": torch_args, "keras": {"initial_scale": 2.0**24, "dynamic_growth_steps": 4}}

    def scaler():
        return GradScaler(Device("atlas-a2"), detector="isfinite", policy=policy, policy_args=args[policy],
                          **(torch_args if policy is None else {}))

    whole = scaler()
    scales, applied, _, _ = train(whole, whole.device, range(24))
    first = scaler()
    s1, a1, model, opt = train(first, first.device, range(12))
    saved = json.loads(json.dumps(first.state_dict()))
    buf = io.BytesIO()
    torch.save(saved, buf)
    buf.seek(0)
    second = scaler()
    second.load_state_dict(torch.load(buf))
    s2, a2, _, _ = train(second, second.device, range(12, 24), model, opt)
    assert np.array(s1 + s2, np.float32).tobytes() == np.array(scales, np.float32).tobytes()
    assert a1 + a2 == applied and not all(applied)
    assert [r.step for r in second.rows] == list(range(12, 24))


def test_a_named_policy_follows_its_trajectory() -> None:
    scaler = GradScaler(Device("atlas-a2"), policy="keras", policy_args={"initial_scale": 2.0**24,
                                                                          "dynamic_growth_steps": 3})
    scales, applied, _, _ = train(scaler, scaler.device, range(20))
    expected = trajectory(KerasPolicy(initial_scale=2.0**24, dynamic_growth_steps=3), applied)
    assert scales == expected[:-1] and scaler.get_scale() == expected[-1] and not all(applied)


def test_getters_setters_and_disabled() -> None:
    scaler = GradScaler(Device("atlas-a2"), growth_factor=4.0)
    assert scaler.get_growth_factor() == 4.0 and scaler.get_backoff_factor() == 0.5
    scaler.set_growth_interval(7)
    assert scaler.get_growth_interval() == 7 and scaler.is_enabled() and scaler.get_scale() == 2.0**16
    off = GradScaler(Device("atlas-a2"), enabled=False)
    loss = torch.tensor(3.0)
    assert off.scale(loss) is loss and off.get_scale() == 1.0 and off.state_dict() == {}


def test_bad_input_is_named() -> None:
    with pytest.raises(TypeError, match="sim.Device"):
        GradScaler("cpu")
    with pytest.raises(ValueError, match="init_scale set torch's own rule"):
        GradScaler(Device("atlas-a2"), init_scale=8.0, policy="keras")
    with pytest.raises(ValueError, match="unknown manager"):
        GradScaler(Device("atlas-a2"), policy="nope")
    scaler = GradScaler(Device("atlas-a2"))
    w = torch.nn.Parameter(torch.ones(3).half())
    opt = torch.optim.SGD([w], lr=0.1)
    scaler.scale((w * w).sum()).backward()
    with pytest.raises(ValueError, match="FP16 gradients"):
        scaler.step(opt)
    with pytest.raises(AssertionError, match="No inf checks"):
        GradScaler(Device("atlas-a2")).update()


def test_the_trajectory_is_a_run_folder(tmp_path) -> None:
    from lossscale.app.cli import main

    scaler = GradScaler(Device("atlas-training"), init_scale=2.0**24, growth_interval=4)
    scales, applied, _, _ = train(scaler, scaler.device, range(12))
    scaler.write_run(tmp_path / "run", plot=False)
    run = lossscale.load_run(tmp_path / "run")
    assert [r.loss_scale for r in run.rows] == scales and [r.applied for r in run.rows] == applied
    assert run.summary.skipped_steps == applied.count(False) > 0 and run.summary.detector == "torch-npu"
    assert main(["plot", str(tmp_path / "run")]) == 0 and (tmp_path / "run" / "scale.png").stat().st_size > 0


def test_state_dicts_load_both_ways_with_torchs_scaler() -> None:
    """lossscale.torch.GradScaler and torch.amp.GradScaler load each other's state_dict through
    torch.save/torch.load and continue bit for bit: the same scale and tracker after the same
    overflow/finite steps (torch's own update kernel against the policy); a state_dict of torch's
    scaler into a scaler on another policy is refused naming both (issue 31, item 7)."""
    def saved_and_loaded(d):
        buf = io.BytesIO()
        torch.save(d, buf)
        buf.seek(0)
        return torch.load(buf)

    def torch_steps(ts, finite):
        for ok in finite:  # torch's own update: torch._amp_update_scale_, as GradScaler.update calls it
            torch._amp_update_scale_(ts._scale, ts._growth_tracker, torch.tensor([0.0 if ok else 1.0]),
                                     ts._growth_factor, ts._backoff_factor, ts._growth_interval)

    finite = [True, True, False, True, True, True, True, False, True, True]
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0**20, growth_factor=3.0, backoff_factor=0.25,
                                  growth_interval=3)
    theirs._lazy_init_scale_growth_tracker(torch.device("cpu"))
    torch_steps(theirs, finite[:4])
    ours = GradScaler(Device("atlas-a2"))
    ours.load_state_dict(saved_and_loaded(theirs.state_dict()))
    assert ours.get_scale() == theirs.get_scale() and ours.get_growth_factor() == 3.0
    assert ours.state_dict()["_growth_tracker"] == theirs.state_dict()["_growth_tracker"]
    torch_steps(theirs, finite[4:])
    for ok in finite[4:]:
        ours.manager.update_loss_scale(ok)
    assert np.float32(ours.get_scale()).tobytes() == np.float32(theirs.get_scale()).tobytes()
    back = torch.amp.GradScaler("cpu")
    back.load_state_dict(saved_and_loaded(ours.state_dict()))
    back._lazy_init_scale_growth_tracker(torch.device("cpu"))
    assert back.state_dict() == {k: ours.state_dict()[k] for k in back.state_dict()}
    torch_steps(back, finite)
    torch_steps(theirs, finite)
    assert back.state_dict() == theirs.state_dict()
    keras = GradScaler(Device("atlas-a2"), policy="keras")
    with pytest.raises(ValueError, match="torch.amp.GradScaler's .policy TorchPolicy.; this scaler runs KerasPolicy"):
        keras.load_state_dict(theirs.state_dict())


def test_grad_max_is_unscaled_on_skipped_and_applied_steps() -> None:
    """The grad_max column means one thing in every run folder (issue 31, item 8): the largest
    scaled gradient magnitude over the step's scale, also on a step torch_npu's scaler skips
    and leaves its gradients scaled (they were written scaled before)."""
    dev = Device("atlas-training")
    scaler = GradScaler(dev, init_scale=2.0**16)
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.0)
    for grads, overflow in (([3 * 2.0**16, -2.0**16], True), ([5 * 2.0**16, 1.0], False)):
        p.grad = torch.tensor(grads)
        scaler.scale(torch.tensor(1.0))
        with DeviceMode(dev):  # the stand-in for the backward pass; 60000 * 4 saturates: the register is set
            (torch.tensor([60000.0 if overflow else 1.0]).half() * 4).sum()
        scaler.step(opt)
        scaler.update()
    skipped, applied = scaler.rows
    assert not skipped.applied and skipped.grad_max == 3.0
    assert applied.applied and applied.loss_scale == 2.0**15 and applied.grad_max == 10.0  # 5 * 2**16 / 2**15


class Recording(torch.optim.SGD):
    """SGD (lr 0: the parameters stay) that records whether step() was called."""

    def __init__(self, param) -> None:
        super().__init__([param], lr=0.0)
        self.stepped = False

    def step(self, closure=None):
        self.stepped = True
        return super().step(closure)


def _event(dev: Device) -> None:
    """A register event on ``dev`` in either mode: 60000 * 4 overflows binary16."""
    dev.mul(np.float16(60000), np.float16(4))


_ACCEPTED = [name for name, cls in DETECTORS.items() if cls.clears_at in (None, "scale")]
_MODES = {"saturation": "atlas-training", "inf-nan": "atlas-a2"}


def _begin(scaler: GradScaler, grads: list[list[float]]) -> list[Recording]:
    """A step's start: scale() a loss, the stand-in backward pass (one device operation, no event)
    and each optimizer's gradients, given scaled."""
    opts = [Recording(torch.nn.Parameter(torch.zeros(len(g)))) for g in grads]
    scaler.scale(torch.tensor(1.0))
    scaler.device.add(np.float16(1), np.float16(2))
    for opt, g in zip(opts, grads, strict=True):
        opt.param_groups[0]["params"][0].grad = torch.tensor(g)
    return opts


def _reads(scaler: GradScaler) -> bool:
    return scaler.detector.reads_register(scaler.device)


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("detector", _ACCEPTED)
@pytest.mark.parametrize("order", ["unscale-both-then-step", "step-first-before-second-unscale"])
def test_register_set_between_two_unscales(detector, mode, order) -> None:
    """Issue 31, item 13: the register is set between the first and the second optimizer's
    unscale_. By torch_npu's GradScaler (each unscale_ runs the kernel, which reads the register
    and clears it if set; any found_inf sets the scaler-wide _has_overflow, which skips every later
    step): where the check reads the register, the second optimizer finds it and is skipped, and the
    first is skipped unless its step() came before; torch_npu's kernel keeps the second's gradients
    scaled; a detector that clears after a read leaves the register clear. A check of the
    gradients' values (finite here) applies both."""
    S = 2.0**10
    scaler = GradScaler(Device(_MODES[mode]), init_scale=S, detector=detector)
    a, b = _begin(scaler, [[3 * S, -S], [5 * S, S]])
    scaler.unscale_(a)
    if order == "step-first-before-second-unscale":
        scaler.step(a)
    _event(scaler.device)
    scaler.unscale_(b)
    scaler.step(b)
    if order == "unscale-both-then-step":
        scaler.step(a)
    register_after = bool(scaler.device.get_float_status().any())
    scaler.update()

    reads, kernel = _reads(scaler), isinstance(scaler.detector, TorchNpu)
    assert a.stepped == (not reads or order == "step-first-before-second-unscale")
    assert b.stepped == (not reads)
    assert scaler.get_scale() == (S / 2 if reads else S)
    assert a.param_groups[0]["params"][0].grad.tolist() == [3.0, -1.0]
    assert b.param_groups[0]["params"][0].grad.tolist() == ([5 * S, S] if reads and kernel else [5.0, 1.0])
    assert register_after == (not reads or detector == "mindspore")  # mindspore reads without clearing
    assert scaler.rows[-1].applied == (not reads) and scaler.rows[-1].overflow


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("detector", _ACCEPTED)
def test_one_overflowing_optimizer_and_the_other(detector, mode) -> None:
    """The first optimizer's gradient is Inf, no register event: a check of the values finds it.
    Then torch_npu's scaler-wide flag skips the second optimizer too (torch-npu and megatron-npu,
    whose kernel also keeps the overflowed gradients scaled), while torch's rule, per optimizer,
    applies the finite one. A register check saw nothing and applies both."""
    S = 2.0**10
    scaler = GradScaler(Device(_MODES[mode]), init_scale=S, detector=detector)
    a, b = _begin(scaler, [[np.inf, S], [2 * S, S]])
    scaler.step(a)
    scaler.step(b)
    scaler.update()
    reads, kernel = _reads(scaler), isinstance(scaler.detector, TorchNpu)
    assert a.stepped == reads and b.stepped == (reads or not kernel)
    unscaled_inf = float(np.finfo(np.float32).max) if mode == "saturation" else np.inf  # binary32 saturates too
    assert a.param_groups[0]["params"][0].grad.tolist() == ([unscaled_inf, 1.0] if reads or not kernel else [np.inf, S])
    assert b.param_groups[0]["params"][0].grad.tolist() == [2.0, 1.0]
    assert scaler.get_scale() == (S if reads else S / 2)


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("detector", _ACCEPTED)
def test_one_optimizer_event_before_and_after_unscale(detector, mode) -> None:
    """One optimizer: an event before unscale_ skips the step where the check reads the register;
    one after unscale_ does not (the decision was taken there) and is left in the register, where
    the next step sees it unless the detector clears at scale() or cleared it by reading."""
    S = 2.0**10
    scaler = GradScaler(Device(_MODES[mode]), init_scale=S, detector=detector)
    stepped = []
    for when in ("before", "after", None):
        (opt,) = _begin(scaler, [[S, 2 * S]])
        if when == "before":
            _event(scaler.device)
        scaler.unscale_(opt)
        if when == "after":
            _event(scaler.device)
        scaler.step(opt)
        scaler.update()
        stepped.append(opt.stepped)
    reads = _reads(scaler)
    carried = reads and scaler.detector.clears_at is None  # tf-npu, mindspore-all-finite, megatron-npu
    assert stepped == [not reads, True, not carried]


def test_off_device_backward_warns_and_step_needs_scale() -> None:
    """Issue 31, item 6: in saturation mode a backward pass outside DeviceMode leaves the register
    blind (its float16 gradients reach Inf on the host): the scaler warns when nothing ran on the
    device between scale() and unscale_(), whichever way scale() ran; a backward pass on the device
    does not warn. step() and unscale_() without scale() raise, as torch's scaler does."""
    for backward_on_device in (False, True):
        dev = Device("atlas-training")
        scaler = GradScaler(dev, init_scale=2.0**16)
        w = torch.nn.Parameter(torch.full((4,), 2.0))
        opt = torch.optim.SGD([w], lr=0.1)
        for scale_on_device in (True, False):
            opt.zero_grad()
            with DeviceMode(dev):
                loss = ((w.half() * 30000.0).float() ** 2).sum()
                scaled = scaler.scale(loss) if scale_on_device else None
            scaled = scaled if scaled is not None else scaler.scale(loss)
            with DeviceMode(dev) if backward_on_device else contextlib.nullcontext():
                scaled.backward()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                scaler.step(opt)
            scaler.update()
            blind = [w for w in caught if "no device operation ran between scale() and unscale_()" in str(w.message)]
            assert len(blind) == (0 if backward_on_device else 1), (backward_on_device, scale_on_device)
    opt.zero_grad()
    with pytest.raises(AssertionError, match="scale.. was not called since the last update"):
        scaler.step(opt)
    with pytest.raises(AssertionError, match="Attempted unscale_"):
        scaler.unscale_(opt)
