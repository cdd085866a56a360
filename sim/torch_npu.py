"""torch_npu's overflow API over a simulated device (optional extra ``torch``), so that code
written for torch_npu runs its overflow logic on the emulator: ``import sim.torch_npu as
torch_npu`` serves ``torch_npu.npu.utils.npu_check_overflow``, ``torch_npu.npu.get_npu_overflow_flag``,
``torch_npu.npu.clear_npu_overflow_flag``, ``torch_npu.npu.utils.is_support_inf_nan`` and the
float-status ops ``torch_npu.npu_alloc_float_status``, ``npu_get_float_status`` and
``npu_clear_float_status`` (or, after :func:`install`, ``import torch_npu`` itself). The device
is the innermost active :class:`sim.torch.DeviceMode`'s, or the one given as ``device=``.

What each does, as torch_npu's source has it (``Ascend/pytorch`` ``torch_npu/npu/utils.py``; the ops
in ``Ascend/op-plugin`` ``op_plugin/ops/aclops/FloatStatusKernelNpu.cpp``; the API pages of
op-plugin's ``docs/zh/custom_APIs``):

- ``is_support_inf_nan()``: whether the device runs in INF/NaN mode (torch_npu asks the chip, with
  ``INF_NAN_MODE_ENABLE`` / ``INF_NAN_MODE_FORCE_DISABLE``: ``sim.profiles.overflow_mode_from_env``).
- ``get_npu_overflow_flag()``: in INF/NaN mode RuntimeError ("Unsupported api when soc_version >=
  Ascend910B1, please use npu_check_overflow"); else whether the float-status register is set
  (``npu_get_float_status(...)[0] != 0``). It does not clear it.
- ``clear_npu_overflow_flag()``: in INF/NaN mode a warning ("clear_npu_overflow_flag is useless")
  and nothing else; else the register is cleared.
- ``npu_check_overflow(grad)``: ``grad`` a tensor or a float (anything else: RuntimeError
  "Unsupported type."). INF/NaN mode: the sum of the tensor in binary32 is +-Inf or NaN (so an
  Inf and a -Inf give NaN, and a sum that overflows binary32 counts too; torch_npu sums on the
  host with torch's float32 sum, here in the pairwise order of ``sim.binary32.sum``, the same on
  every machine, so a sum at the edge of binary32's range may differ from a given host's).
  Saturation mode: ``grad`` is ignored; the register is read, and cleared if it was set.
- ``npu_get_float_status(buf)``: on the Atlas training and inference series (SoCs before
  Ascend910B1: the V1 op ``NPUGetFloatStatus``) ``buf`` (float32[8]) is filled with eight 1.0 if
  the register is set, and returned; on the others (``NPUGetFloatStatusV2``) a new int32[8] whose
  element 0 is 1 if it is set (the hardware's value is documented only as non-zero), the rest 0.
- ``npu_clear_float_status(buf)``: clears the register; returns float32[8] zeros.
- ``npu_alloc_float_status(buf)``: float32[8] zeros.

The register is the device's (:meth:`sim.Device.get_float_status`): set by any OVERFLOW, INVALID
or DIVBYZERO event since the last clear, in either mode.

A torch_npu script runs unmodified with ``python -m sim.torch_npu --profile NAME SCRIPT``
(:func:`main`): ``import torch_npu`` is this face (:func:`install`), ``device="npu"``, ``.npu()``
and ``torch.npu.*`` keep everything on the CPU (:func:`on_cpu`), and the script runs inside
``DeviceMode``. Not served: the rest of torch_npu (its fused ``torch_npu.npu_*`` operators,
``torch.npu.amp``: a script using them must change to torch's own).
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from . import binary32
from .device.core import Device
from .rounding import OverflowMode
from .torch import DeviceMode

__all__ = ["is_support_inf_nan", "get_npu_overflow_flag", "clear_npu_overflow_flag", "npu_check_overflow",
           "npu_get_float_status", "npu_clear_float_status", "npu_alloc_float_status", "npu", "V1_PROFILES",
           "install"]

#: The products whose float-status ops are the V1 ones (SoCs before Ascend910B1 in torch_npu's
#: ``NpuVariables.h`` order: Ascend910A-910B and Ascend310P); the others run the V2 ops.
V1_PROFILES = frozenset({"atlas-training", "atlas-inference"})


def _device(device: Device | None) -> Device:
    if device is not None:
        return device
    modes = [m for m in _get_current_dispatch_mode_stack() if isinstance(m, DeviceMode)]
    if not modes:
        raise RuntimeError("no device: call inside a sim.torch.DeviceMode, or give device=")
    return modes[-1].device


def is_support_inf_nan(device: Device | None = None) -> bool:
    """Whether the device runs in INF/NaN mode."""
    return _device(device).overflow is OverflowMode.INF_NAN


def get_npu_overflow_flag(device: Device | None = None) -> bool:
    """Whether the float-status register is set (saturation mode only)."""
    dev = _device(device)
    if dev.overflow is OverflowMode.INF_NAN:
        raise RuntimeError("Unsupported api when soc_version >= Ascend910B1, please use npu_check_overflow")
    return bool(dev.get_float_status().any())


def clear_npu_overflow_flag(device: Device | None = None) -> None:
    """Clear the float-status register (saturation mode; in INF/NaN mode a warning only)."""
    dev = _device(device)
    if dev.overflow is OverflowMode.INF_NAN:
        warnings.warn("When soc_version >= Ascend910B1, clear_npu_overflow_flag is useless. Please remove it.",
                      stacklevel=2)
        return
    dev.clear_float_status()


def npu_check_overflow(grad, device: Device | None = None) -> bool:
    """Whether ``grad`` overflowed: its binary32 sum not finite (INF/NaN mode), or the register
    set, then cleared (saturation mode)."""
    dev = _device(device)
    if dev.overflow is OverflowMode.SATURATION:
        hit = get_npu_overflow_flag(dev)
        if hit:
            clear_npu_overflow_flag(dev)
        return hit
    if isinstance(grad, torch.Tensor):
        total = float(binary32.sum(grad.detach().float().cpu().numpy().reshape(-1)))
    elif isinstance(grad, float):
        total = grad
    else:
        raise RuntimeError(f"Unsupported type. npu_check_overflow takes a torch.Tensor or a float, got "
                           f"{type(grad).__name__}")
    return total in (float("inf"), -float("inf")) or total != total


def npu_get_float_status(buf: torch.Tensor, mode: int = 0, device: Device | None = None) -> torch.Tensor:
    """The register as torch_npu's op gives it (V1: ``buf`` filled; V2: a new int32[8])."""
    dev = _device(device)
    hit = bool(dev.get_float_status().any())
    if dev.profile.name in V1_PROFILES:
        with torch.no_grad():
            buf.fill_(1.0 if hit else 0.0)
        return buf
    out = torch.zeros(8, dtype=torch.int32)
    out[0] = int(hit)
    return out


def npu_clear_float_status(buf: torch.Tensor, mode: int = 0, device: Device | None = None) -> torch.Tensor:
    """Clear the register; float32[8] zeros."""
    _device(device).clear_float_status()
    return torch.zeros(8, dtype=torch.float32)


def npu_alloc_float_status(buf: torch.Tensor | None = None) -> torch.Tensor:
    """A float32[8] buffer of zeros."""
    return torch.zeros(8, dtype=torch.float32)


def _module(name: str, **attrs) -> ModuleType:
    module = ModuleType(name, f"sim.torch_npu's stand-in for {name} (the overflow API only)")
    module.__dict__.update(attrs)
    return module


#: ``torch_npu.npu`` (also ``torch.npu`` under :func:`on_cpu`) as far as the overflow API and a
#: script's device bookkeeping go: one device, index 0, always available.
npu = _module("torch_npu.npu", get_npu_overflow_flag=get_npu_overflow_flag,
              clear_npu_overflow_flag=clear_npu_overflow_flag, is_available=lambda: True,
              device_count=lambda: 1, current_device=lambda: 0, set_device=lambda device: None,
              synchronize=lambda device=None: None, manual_seed=torch.manual_seed,
              manual_seed_all=torch.manual_seed,
              utils=_module("torch_npu.npu.utils", npu_check_overflow=npu_check_overflow,
                            is_support_inf_nan=is_support_inf_nan, get_npu_overflow_flag=get_npu_overflow_flag,
                            clear_npu_overflow_flag=clear_npu_overflow_flag))


def install() -> None:
    """Make ``import torch_npu`` (and ``torch_npu.npu``, ``torch_npu.npu.utils``, ``from torch_npu.npu
    import clear_npu_overflow_flag``) resolve to this face, for a script written for torch_npu; a
    torch_npu already imported is refused (its own functions would stay in the script's hands)."""
    here = sys.modules[__name__]
    present = sys.modules.get("torch_npu")
    if present is not None and present is not here:
        raise RuntimeError("torch_npu is imported already (the real one): install() must come first")
    sys.modules.update({"torch_npu": here, "torch_npu.npu": npu, "torch_npu.npu.utils": npu.utils})


def _cpu(value: Any) -> Any:
    """An NPU device (``"npu"``, ``"npu:0"``, ``torch.device("npu", 0)``) as the CPU; else ``value``."""
    if isinstance(value, torch.device) and value.type == "npu":
        return torch.device("cpu")
    if isinstance(value, str) and value.split(":")[0] == "npu":
        return "cpu"
    return value


class _OnCpu(torch.overrides.TorchFunctionMode):
    """Every torch function's NPU device argument (positional or ``device=``) made the CPU's."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return func(*(_cpu(a) for a in args), **kwargs)


@contextlib.contextmanager
def on_cpu() -> Iterator[None]:
    """A torch_npu script's tensors kept on the CPU: ``device="npu"``, ``.to("npu")``,
    ``tensor.npu()``, ``module.npu()`` and ``torch.npu.*`` work and leave everything on the CPU,
    where a :class:`sim.torch.DeviceMode` computes it. torch's one custom backend is named "npu"
    for the rest of the process (``torch.utils.rename_privateuse1_backend``), so that
    ``torch.device("npu")`` parses, and ``Tensor.npu`` and ``Module.npu`` return the tensor or module
    as it is; a process whose backend already has another name is refused."""
    name = torch._C._get_privateuse1_backend_name()
    if name != "npu":
        if name != "privateuseone":
            raise RuntimeError(f"torch's custom backend is named {name!r} in this process, not 'npu'")
        torch.utils.rename_privateuse1_backend("npu")
        torch.npu = sys.modules["torch.npu"] = npu
        torch.Tensor.npu = lambda self, device=None, non_blocking=False, **kwargs: self  # on the CPU already
        torch.nn.Module.npu = lambda self, device=None: self
    with _OnCpu():
        yield


def main(argv: list[str] | None = None) -> int:
    """``python -m sim.torch_npu --profile NAME [--overflow MODE] SCRIPT [ARGS...]``: a torch_npu
    training script run unmodified on the CPU under DeviceMode: ``import torch_npu`` is this face,
    its NPU tensors stay on the CPU (:func:`on_cpu`), every float16 and bfloat16 operation runs on
    the simulated device; the device's register and its routed operations are printed at the end."""
    import argparse
    import runpy

    from .torch import DeviceMode
    p = argparse.ArgumentParser(prog="python -m sim.torch_npu", description=main.__doc__.splitlines()[0])
    p.add_argument("--profile", default="atlas-a2")
    p.add_argument("--overflow", default=None, help="inf_nan or saturation (default: the profile's)")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    install()
    device = Device(args.profile, args.overflow)
    sys.argv = [args.script, *args.args]
    with on_cpu(), DeviceMode(device) as mode:
        runpy.run_path(args.script, run_name="__main__")
    print(f"sim.torch_npu: {sum(mode.routes.values())} operations on {args.profile} "
          f"({device.overflow.name}); register {' '.join(map(str, device.get_float_status().tolist()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
