"""Cost of a torch training step under sim.torch.DeviceMode against the same step in eager
torch float32 on the CPU (the two timed in turn, best of many). Target: at most 8x for the MLP.

    python bench/bench_torch.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
from timing import best_of_each, print_steps

from sim import Device
from sim.torch import DeviceMode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))  # noqa: E731
    m16, m32 = make().half(), make()
    x = torch.from_numpy(np.random.default_rng(0).random((64, 64), np.float32))
    y = torch.arange(64) % 10
    dev = Device("atlas-training")

    def emulated() -> None:
        m16.zero_grad()
        dev.clear_float_status()
        with DeviceMode(dev):
            loss = torch.nn.functional.cross_entropy(m16(x.half()).float(), y) * 1024.0
            loss.backward()

    def eager() -> None:
        m32.zero_grad()
        loss = torch.nn.functional.cross_entropy(m32(x), y) * 1024.0
        loss.backward()

    emulated()
    load = os.getloadavg()[0]
    t_emul, t_eager = best_of_each([emulated, eager], args.repeat)
    print(f"load average at start: {load:.2f} on {os.cpu_count()} cores; torch threads: 1")
    print_steps("step (forward + backward, mlp 64-32-10, batch 64)", ("eager torch float32", t_eager),
                [("DeviceMode, binary16 on atlas-training", t_emul)])


if __name__ == "__main__":
    main()
