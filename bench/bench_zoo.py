"""Cost of a real model's training step under sim.torch.DeviceMode against its eager float32 step.

Each model of the zoo (tests/zoo.py: torchvision, timm, transformers and torch.nn models from
small configs, batch 2 unless ``--batch`` says otherwise) runs forward and backward in float16 under a DeviceMode on
atlas-training, and the same model (same weights) in eager torch float32 on the CPU; the two
are timed in turn, best of ``--repeat``, in one run. Prints each model's ratio, then the
median and the maximum over the zoo. Models whose library is missing are left out.
``--threads N`` gives eager torch and the device N threads each (``Device(threads=N)``: large
matmuls split their rows); the default is one.
Target: median at most 5x, no model above 15x.

    python bench/bench_zoo.py [--repeat 5] [--batch 2] [--threads 1] [--models gpt2 lstm]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
from pathlib import Path

import torch
from timing import best_of_each

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import zoo  # noqa: E402

from sim import Device  # noqa: E402
from sim.torch import DeviceMode  # noqa: E402


def time_model(name: str, repeat: int, batch: int, threads: int = 1) -> tuple[float, float]:
    """(eager float32 seconds, DeviceMode float16 seconds) for one step of model ``name``."""
    m32, b32 = zoo.build(name, batch=batch)
    m16, b16 = copy.deepcopy(m32).half(), b32.to(torch.float16)
    dev = Device("atlas-training", threads=threads)

    def emulated() -> None:
        m16.zero_grad()
        dev.clear_float_status()
        with DeviceMode(dev):
            zoo.loss(m16, b16).backward()

    def eager() -> None:
        m32.zero_grad()
        zoo.loss(m32, b32).backward()

    emulated()  # warm up: first-use compilation is not a step's cost
    eager()
    t_emul, t_eager = best_of_each([emulated, eager], repeat)
    return t_eager, t_emul


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--models", nargs="*", default=list(zoo.ZOO), choices=list(zoo.ZOO))
    ap.add_argument("--batch", type=int, default=zoo.BATCH, help="examples per step (default: the tests' 2)")
    ap.add_argument("--threads", type=int, default=1, help="threads for eager torch and for the device")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    print(f"load average at start: {load:.2f} on {os.cpu_count()} cores; threads: {args.threads}; best of "
          f"{args.repeat}; batch {args.batch}")
    print(f"{'model':<20}{'library':<14}{'eager f32 ms':>14}{'DeviceMode ms':>15}{'ratio':>8}")
    ratios: dict[str, float] = {}
    for name in args.models:
        entry = zoo.ZOO[name]
        try:
            t_eager, t_emul = time_model(name, args.repeat, args.batch, args.threads)
        except ImportError as e:
            print(f"{name:<20}{entry.library:<14}  skipped: {e}")
            continue
        ratios[name] = t_emul / t_eager
        print(f"{name:<20}{entry.library:<14}{t_eager * 1e3:>14.2f}{t_emul * 1e3:>15.2f}{ratios[name]:>8.1f}",
              flush=True)
    if ratios:
        worst = max(ratios, key=ratios.__getitem__)
        print(f"median ratio over {len(ratios)} models: {statistics.median(ratios.values()):.1f}x; "
              f"max: {ratios[worst]:.1f}x ({worst}); load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
