"""Write msprobe_dump/: a dump that Ascend's precision debugger itself makes of a small float16 model.

Usage: ``python tests/data/make_msprobe_dump.py`` with PyPI ``mindstudio-probe`` 26.2 and torch's
CPU build installed (msprobe's ``PrecisionDebugger`` dumps on the CPU as on an NPU). Two steps of a
float16 two-layer perceptron, task ``tensor``, level ``L1``: every API's inputs and outputs as
tensors, forward and backward. Step 1's forward also doubles an activation of 40000 (a planted
overflow: +Inf on the CPU, 65504 and a register event on a device in saturation mode). msprobe names a
CPU process's folder ``proc<pid>``; it is renamed ``rank0``, as a one-rank NPU dump names it, so
that the file kept here does not change with the process.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from msprobe.pytorch import PrecisionDebugger

OUT = Path(__file__).parent / "msprobe_dump"


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).half()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps({"task": "tensor", "dump_path": str(Path(tmp) / "dump"), "rank": [], "step": [],
                                      "level": "L1", "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}))
        debugger = PrecisionDebugger(config_path=str(config))
        for step in range(2):
            debugger.start(model)
            x = torch.randn(4, 8).half()
            h = model(x)
            if step == 1:
                h = h + torch.full_like(h, 40000.0) * 2  # 80000: past binary16's 65504
            loss = (h.float() ** 2).mean()
            loss.backward()
            debugger.stop()
            debugger.step()
        shutil.rmtree(OUT, ignore_errors=True)
        for folder in sorted((Path(tmp) / "dump").glob("step*/proc*")):
            target = OUT / folder.parent.name / "rank0"
            shutil.copytree(folder, target)


if __name__ == "__main__":
    main()
