"""torch_npu's overflow API over a device: each documented behaviour, in both modes and for the V1
and V2 float-status ops."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import sim.torch_npu as torch_npu  # noqa: E402
from sim import Device  # noqa: E402
from sim.torch import DeviceMode  # noqa: E402


def overflowed(dev: Device) -> None:
    """An fp16 40000 + 40000 on the device, as torch_npu's own float-status test does."""
    with DeviceMode(dev):
        torch.tensor([40000.0], dtype=torch.float16) + torch.tensor([40000.0], dtype=torch.float16)


def test_saturation_mode_reads_and_clears_the_register() -> None:
    dev = Device("atlas-a2", "saturation")
    with DeviceMode(dev):
        assert not torch_npu.npu.utils.is_support_inf_nan()
        assert torch_npu.npu.get_npu_overflow_flag() is False
    overflowed(dev)
    with DeviceMode(dev):
        assert torch_npu.npu.get_npu_overflow_flag() is True
        assert torch_npu.npu.get_npu_overflow_flag() is True  # reading does not clear
        grad = torch.zeros(3, dtype=torch.float16)  # ignored: the register decides
        assert torch_npu.npu.utils.npu_check_overflow(grad) is True
        assert torch_npu.npu.utils.npu_check_overflow(grad) is False  # the check cleared it
    overflowed(dev)
    torch_npu.npu.clear_npu_overflow_flag(device=dev)
    assert not dev.get_float_status().any()


def test_inf_nan_mode_checks_the_tensor_and_refuses_the_flag() -> None:
    dev = Device("atlas-a2", "inf_nan")
    overflowed(dev)
    with DeviceMode(dev):
        assert torch_npu.is_support_inf_nan()
        with pytest.raises(RuntimeError, match="please use npu_check_overflow"):
            torch_npu.get_npu_overflow_flag()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch_npu.clear_npu_overflow_flag()
        assert "useless" in str(caught[0].message) and dev.get_float_status().any()  # nothing cleared
    check = torch_npu.npu_check_overflow
    assert check(torch.tensor([1.0, 2.0]), device=dev) is False  # the register is set: not read
    assert check(torch.tensor([np.inf, 1.0]), device=dev) is True
    assert check(torch.tensor([np.inf, -np.inf]), device=dev) is True  # the sum is NaN
    assert check(torch.tensor([3e38, 3e38]), device=dev) is True  # the binary32 sum overflows
    assert check(float("nan"), device=dev) is True and check(1.0, device=dev) is False
    with pytest.raises(RuntimeError, match="Unsupported type"):
        check([torch.zeros(2)], device=dev)


@pytest.mark.parametrize(("profile", "v1"), [("atlas-training", True), ("atlas-inference", True),
                                             ("atlas-a2", False), ("atlas-200i-500-a2", False)])
def test_the_float_status_ops_fill_v1_buffers_and_return_v2_words(profile: str, v1: bool) -> None:
    dev = Device(profile, "saturation")
    buf = torch_npu.npu_alloc_float_status(torch.zeros(8))
    assert buf.dtype == torch.float32 and not buf.any()
    overflowed(dev)
    got = torch_npu.npu_get_float_status(buf, device=dev)
    if v1:  # NPUGetFloatStatus writes eight 1.0 into the buffer it is given
        assert got is buf and got.tolist() == [1.0] * 8
    else:  # NPUGetFloatStatusV2: a new int32[8], the flag in element 0
        assert got.dtype == torch.int32 and got.tolist() == [1, 0, 0, 0, 0, 0, 0, 0]
    assert torch_npu.npu_clear_float_status(buf, device=dev).tolist() == [0.0] * 8
    assert not dev.get_float_status().any()
    again = torch_npu.npu_get_float_status(torch.zeros(8), device=dev)
    assert not again.any()


def test_outside_a_mode_a_device_must_be_given() -> None:
    with pytest.raises(RuntimeError, match="inside a sim.torch.DeviceMode, or give device="):
        torch_npu.get_npu_overflow_flag()


def test_install_makes_a_torch_npu_script_import_the_face(monkeypatch) -> None:
    import sys
    for name in ("torch_npu", "torch_npu.npu", "torch_npu.npu.utils"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    torch_npu.install()
    import torch_npu as imported
    from torch_npu.npu import clear_npu_overflow_flag
    from torch_npu.npu.utils import npu_check_overflow
    assert imported is torch_npu and clear_npu_overflow_flag is torch_npu.clear_npu_overflow_flag
    dev = Device("atlas-training")
    overflowed(dev)
    with DeviceMode(dev):
        assert npu_check_overflow(None) and not imported.npu.get_npu_overflow_flag()
    monkeypatch.setitem(sys.modules, "torch_npu", object())
    with pytest.raises(RuntimeError, match="install\\(\\) must come first"):
        torch_npu.install()


SCRIPT = '''\
import sys
import torch
import torch_npu
from torch_npu.npu import utils

torch.npu.set_device(0)
device = torch.device("npu:0")
model = torch.nn.Linear(4, 4).half().npu()
x = torch.full((2, 4), 20000.0, dtype=torch.float16, device=device)
y = (x.to(device) * 4).npu()
before = utils.npu_check_overflow(y.float())
print(sys.argv[1], y.device, float(y.max()), model.weight.device, torch.npu.is_available(), before,
      utils.is_support_inf_nan())
'''


@pytest.mark.parametrize("mode, value, flag", [("saturation", 65504.0, True), ("inf_nan", float("inf"), True)])
def test_a_torch_npu_script_runs_unmodified_on_the_device(tmp_path, mode: str, value: float, flag: bool) -> None:
    """``python -m sim.torch_npu``: ``import torch_npu``, ``device="npu:0"``, ``.npu()``,
    ``.to(device)`` and ``torch.npu.*`` as written for a card; the tensors stay on the CPU and the
    float16 product runs on the device (20000 * 4: 65504 in saturation mode, +Inf in INF/NaN mode;
    npu_check_overflow sees it either way: the register, or the Inf). In a process of its own: the
    backend keeps its new name."""
    import subprocess
    import sys
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run = subprocess.run([sys.executable, "-m", "sim.torch_npu", "--profile", "atlas-a2", "--overflow", mode,
                          str(script), "hello"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    first, last = run.stdout.strip().splitlines()
    assert first == f"hello cpu {value} cpu True {flag} {mode == 'inf_nan'}"
    register = "0 0 0 0 0 0 0 0" if mode == "saturation" else "1 0 0 "  # saturation: the check cleared it
    assert last.startswith("sim.torch_npu: ") and f"on atlas-a2 ({mode.upper()}); register {register}" in last
