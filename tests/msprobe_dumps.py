"""Dumps that msprobe itself writes, of a small float16 model run natively on the CPU or on a
simulated device (``lossscale.msprobe.collected_on_host``): the tests' live dumps.

One dump per process (msprobe's ``PrecisionDebugger`` is one per process)::

    python tests/msprobe_dumps.py OUT --task tensor --level L1 [--profile atlas-a2 --overflow saturation]
        [--plant overflow|nan|none]

Two steps of ``Model``: a linear layer, ReLU, a ``Planted`` module and a linear layer, float16,
backward from a binary32 loss. At step 1 ``Planted`` makes a planted event inside its module path:
``overflow`` doubles 40000 (80000: past binary16's 65504), ``nan`` takes the square root of -1 (NaN,
which the later APIs carry on), ``none`` nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
from pathlib import Path

import torch


class Planted(torch.nn.Module):
    """The identity, but at the step named by ``at`` (set by the run) the planted event."""

    def __init__(self, plant: str) -> None:
        super().__init__()
        self.plant, self.at = plant, False

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.at and self.plant == "overflow":
            return h + torch.full_like(h, 40000.0) * 2
        if self.at and self.plant == "nan":
            return h + torch.sqrt(torch.full_like(h, -1.0))
        return h


class Model(torch.nn.Module):
    def __init__(self, plant: str) -> None:
        super().__init__()
        self.first, self.act = torch.nn.Linear(8, 16), torch.nn.ReLU()
        self.planted, self.last = Planted(plant), torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.planted(self.act(self.first(x))))


def train(model: Model, debugger=None) -> None:
    """Two steps, the planted event at step 1 (``debugger``: msprobe's, started for each step)."""
    torch.manual_seed(1)
    for step in range(2):
        model.planted.at = step == 1
        if debugger:
            debugger.start(model)
        x = torch.randn(4, 8).half()
        loss = (model(x).float() ** 2).mean()
        loss.backward()
        if debugger:
            debugger.stop()
            debugger.step()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--task", default="tensor", choices=["tensor", "statistics", "md5"])
    p.add_argument("--level", default="L1", choices=["L0", "L1", "mix"])
    p.add_argument("--profile")
    p.add_argument("--overflow", default=None)
    p.add_argument("--plant", default="overflow", choices=["overflow", "nan", "none"])
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = Model(args.plant).half()
    config = args.out.parent / f"{args.out.name}.config.json"
    task = {"scope": [], "list": [], "data_mode": ["all"]}
    if args.task == "md5":
        task["summary_mode"] = "md5"
    config.write_text(json.dumps({"task": "statistics" if args.task == "md5" else args.task,
                                  "dump_path": str(args.out), "rank": [], "step": [], "level": args.level,
                                  "statistics" if args.task == "md5" else args.task: task}))
    from msprobe.pytorch import PrecisionDebugger
    debugger = PrecisionDebugger(config_path=str(config))
    mode, device, routes = contextlib.nullcontext(), None, None
    if args.profile:
        import warnings

        from lossscale.msprobe import collected_on_host
        from sim import Device
        from sim.torch import DeviceMode
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a legacy saturation mode, asked for on purpose
            device = Device(args.profile, args.overflow)
        mode = contextlib.ExitStack()
        routes = mode.enter_context(DeviceMode(device)).routes
        mode.enter_context(collected_on_host())
    with mode:
        train(model, debugger)
    config.unlink()
    if device is not None:  # what the device saw: the model's operations alone, msprobe's own off it
        (args.out / "device.json").write_text(json.dumps({"status": int(device.status),
                                                         "routes": sum(routes.values())}))
    for step in args.out.glob("step*"):  # one process: its proc<pid> folder, named rank0 as a one-rank NPU dump
        for proc in step.glob("proc*"):
            shutil.move(proc, step / "rank0")


if __name__ == "__main__":
    main(sys.argv[1:])
