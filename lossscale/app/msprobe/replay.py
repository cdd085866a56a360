"""A dump's calls re-executed on a simulated device, one at a time from the dumped tensors, and
each output compared with the dumped one."""

from __future__ import annotations

from typing import Any

import numpy as np

from .dump import Entry, Missing, value
from .metrics import METRICS, metrics

__all__: list[str] = []  # public as lossscale.msprobe's

#: The torch namespace of each API kind msprobe names.
KINDS = {"Functional": "torch.nn.functional", "Torch": "torch", "Tensor": "torch.Tensor"}
#: Modules whose forward is a function of their input and parameters alone (a level-L0 entry holds
#: no module settings: a convolution's stride, a GELU's approximation are not in the dump).
MODULES = {"Linear": "linear", "ReLU": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "SiLU": "silu",
           "Mish": "mish", "Softsign": "softsign", "Tanhshrink": "tanhshrink"}

#: ``msprobe.csv``'s columns: the call and the output tensor (msprobe's name for it), what was done,
#: the comparison (msprobe's metrics among them), the register, and whether the simulated output
#: holds Inf or NaN.
COLUMNS = ("step", "rank", "api", "tensor", "module", "source", "dtype", "shape", "status", "identical", "max_ulp",
           *METRICS, "events", "register", "nonfinite")
_RESULTS = COLUMNS[COLUMNS.index("identical"):]


def _ordered(bits: np.ndarray, width: int) -> np.ndarray:
    """Sign-magnitude bit patterns as integers in the order of the values they encode."""
    b = bits.astype(np.int64)
    sign = 1 << (width - 1)
    return np.where(b & sign, -(b & (sign - 1)), b)


def compare(got: np.ndarray, want: np.ndarray) -> dict[str, Any]:
    """The simulated output against the dumped one: identical bits; the largest distance in units
    in the last place of their dtype; and msprobe's metrics as its compare computes them, the
    simulated output as its target and the dumped one as its bench (:mod:`.metrics`)."""
    identical = got.dtype == want.dtype and got.shape == want.shape and np.array_equal(
        got.view(f"u{got.dtype.itemsize}"), want.view(f"u{want.dtype.itemsize}"))
    ulp = None
    if got.dtype == want.dtype and got.shape == want.shape:
        width = got.dtype.itemsize * 8
        ulp = int(np.abs(_ordered(got.view(f"u{got.dtype.itemsize}"), width)
                         - _ordered(want.view(f"u{want.dtype.itemsize}"), width)).max(initial=0))
    return {"identical": bool(identical), "max_ulp": ulp, **metrics(got, want)}


class _NotReplayed(Exception):
    """Why a call was not re-executed."""


def _function(e: Entry):
    """The torch function of an API or module entry."""
    import importlib

    import torch
    if e.kind == "Module":
        name = MODULES.get(e.api)
        if name is None:
            raise _NotReplayed(f"module {e.api}: its settings are not in the dump (replayed: "
                               f"{', '.join(MODULES)})")
        fn = getattr(torch.nn.functional, name)
        return lambda x, weight=None, bias=None: fn(x, weight, bias) if name == "linear" else fn(x)
    module = KINDS.get(e.kind)
    root = None if module is None else torch.Tensor if module == "torch.Tensor" else importlib.import_module(module)
    fn = getattr(root, e.api, None) if root is not None else None
    if not callable(fn):
        raise _NotReplayed(f"no torch function for {e.kind}.{e.api}")
    return fn


def _forward(e: Entry, grad: bool):
    """The entry's forward call re-made from its dumped tensors: (function, args, kwargs)."""
    try:
        args = [value(m, e.tensors, grad) for m in e.inputs]
        kwargs = {k: value(m, e.tensors, grad) for k, m in e.kwargs.items()}
        kwargs.update({k: value(m, e.tensors, grad) for k, m in e.parameters.items()})
    except Missing as why:
        raise _NotReplayed(str(why)) from None
    return _function(e), args, kwargs


def _flat(result) -> list:
    import torch
    if isinstance(result, torch.Tensor) or result is None:
        return [result]
    return [r if isinstance(r, torch.Tensor) else None for r in result] if isinstance(result, (tuple, list)) else [None]


def _run(e: Entry, forwards: dict, dev, mode) -> list:
    """The entry's outputs computed on ``dev`` (its register cleared first): a forward call's
    outputs; a backward call's, the gradients its autograd node gives the dumped gradient (msprobe
    records a backward call as that node's inputs and outputs, in the node's order)."""
    import torch
    if e.direction == "parameters_grad":
        raise _NotReplayed("a module's parameter gradients (the sum of its calls' backward)")
    if e.direction == "forward":
        fn, args, kwargs = _forward(e, grad=False)
        dev.clear_float_status()
        with mode, torch.no_grad():
            return _flat(fn(*args, **kwargs))
    if e.kind == "Module":
        raise _NotReplayed("a module's backward (its APIs' backward entries are its autograd nodes)")
    forward = forwards.get((e.step, e.rank, e.name.removesuffix("backward") + "forward"))
    if forward is None:
        raise _NotReplayed("a backward entry whose forward entry is not in the dump")
    fn, args, kwargs = _forward(forward, grad=True)
    try:
        grads = [value(m, e.tensors) for m in e.inputs]
    except Missing as why:
        raise _NotReplayed(str(why)) from None
    with mode, torch.enable_grad():
        out = next((r for r in _flat(fn(*args, **kwargs)) if r is not None and r.grad_fn is not None), None)
        if out is None:
            raise _NotReplayed("its forward output needs no gradient")
        dev.clear_float_status()  # the node's own events, not the forward's
        return _flat(out.grad_fn(*grads))


def replay(entries: list[Entry], profile: str = "atlas-a2", overflow_mode: str | None = None) -> list[dict[str, Any]]:
    """Every call of ``entries`` re-executed on a ``Device(profile, overflow_mode)`` whose register
    is cleared before each: forward APIs (``Functional.X`` is ``torch.nn.functional.X``, ``Torch.X``
    ``torch.X``, ``Tensor.X`` the method), their backward entries (the autograd node of the
    re-executed forward applied to the dumped gradient) and level-L0 modules of :data:`MODULES`.
    One row per dumped output tensor (:data:`COLUMNS`; ``status`` ``compared``), or one row saying
    why a call was not re-executed (no tensors in a statistics or md5 dump, an API, module or
    argument it cannot rebuild, the call failing)."""
    from sim import Device
    from sim.torch import DeviceMode, as_array
    dev = Device(profile, overflow_mode)
    forwards = {(e.step, e.rank, e.name): e for e in entries if e.direction == "forward"}
    rows = []
    for e in entries:
        base = {"step": e.step, "rank": e.rank, "api": e.name, "tensor": "", "module": e.module, "source": e.source,
                "dtype": "", "shape": "", **dict.fromkeys(_RESULTS)}
        try:
            results = _run(e, forwards, dev, DeviceMode(dev))
        except _NotReplayed as why:
            rows.append({**base, "status": f"not replayed: {why}"})
            continue
        except Exception as err:  # noqa: BLE001 (the user's API, any error: reported, the rest go on)
            rows.append({**base, "status": f"not replayed: the call failed ({type(err).__name__}: {err})"})
            continue
        register = dev.get_float_status()
        base.update(events=int(register[3]), register=" ".join(map(str, register.tolist())))
        wanted = [(i, m) for i, m in enumerate(e.outputs) if isinstance(m, dict) and m.get("type") == "torch.Tensor"]
        if not wanted:
            rows.append({**base, "status": "replayed: no tensor output in the dump"})
        for i, meta in wanted:
            got = results[i] if i < len(results) else None
            row = {**base, "tensor": f"{e.name}.output.{i}", "dtype": meta.get("dtype", ""),
                   "shape": "x".join(map(str, meta.get("shape", [])))}
            if got is None:
                rows.append({**row, "status": "replayed: no such output on the device"})
                continue
            out = as_array(got)
            row["nonfinite"] = bool(not np.isfinite(out.astype(np.float64)).all())
            try:
                dumped = as_array(value(meta, e.tensors))
            except Missing as why:
                rows.append({**row, "status": f"replayed, not compared: {why}"})
                continue
            rows.append({**row, "status": "compared", **compare(out, dumped)})
    return rows
