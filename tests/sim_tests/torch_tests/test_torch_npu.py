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
