"""Real models at real size: one training step under sim.torch.DeviceMode against eager float32.

GPT-2 small (124M parameters, the default GPT2Config; sequences of 128 tokens) and ResNet-50 at
224x224, batch 2 each, weights random (no hub access). Each measurement runs in a fresh process,
so that its peak memory is its own: the model is built, one step runs as a warm-up (first-use
compilation and caches), then one step is timed. Printed, for eager float32 and for float16
under DeviceMode on atlas-training: the step's wall time, the process's peak resident memory
during it (Linux's VmHWM, reset before the step: model, caches and the step's own), and that
peak above what was resident when the step began (the step's own); and the ratios. One thread
(``--threads`` for more: eager torch and the device both use them).

    python bench/bench_real.py [--models gpt2 resnet50] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MODELS = ("gpt2", "resnet50")


def _status_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS: resident now; VmHWM: the
    peak since the last reset), in MB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def _reset_peak() -> None:
    """Start the peak (VmHWM) afresh from the resident memory now (Linux: clear_refs, 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _build(name: str):
    """The model (float32, training mode) and a step function of a model and a dtype."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    import zoo

    zoo.torchvision()  # torchvision's definitions, its C++ operators stood in for (transformers imports it)
    torch.manual_seed(0)
    if name == "gpt2":
        import transformers

        model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).train()
        ids = torch.randint(0, 50257, (2, 128), generator=torch.Generator().manual_seed(0))
        return model, lambda m, dtype: m(input_ids=ids, labels=ids).loss.float()
    model = zoo.torchvision().resnet50(num_classes=1000).train()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 3, 224, 224, generator=g), torch.randint(0, 1000, (2,), generator=g)
    return model, lambda m, dtype: F.cross_entropy(m(x.to(dtype)).float(), y)


def child(name: str, mode: str, threads: int) -> dict:
    """One measurement in this process: {seconds, peak_mb}."""
    import torch

    torch.set_num_threads(threads)
    model, loss = _build(name)
    dtype = torch.float32
    if mode == "device":
        from sim import Device
        from sim.torch import DeviceMode

        model, dtype = model.half(), torch.float16
        dev = Device("atlas-training", threads=threads)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        if mode == "device":
            dev.clear_float_status()
            with DeviceMode(dev):
                loss(model, dtype).backward()
        else:
            loss(model, dtype).backward()

    step()  # warm-up
    _reset_peak()
    resident = _status_mb("VmRSS")
    t = time.perf_counter()
    step()
    seconds = time.perf_counter() - t
    peak = _status_mb("VmHWM")
    return {"seconds": seconds, "peak_mb": peak, "step_mb": peak - resident}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.threads)))
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; threads: {args.threads}; "
          f"batch 2; one step after a warm-up step, each in its own process")
    print(f"{'model':<10}{'eager f32 s':>12}{'DeviceMode s':>14}{'ratio':>7}{'eager MB':>10}{'device MB':>11}"
          f"{'ratio':>7}{'eager step MB':>15}{'device step MB':>16}")
    for name in args.models:
        got = {}
        for mode in ("eager", "device"):
            run = subprocess.run([sys.executable, __file__, "--child", name, mode, "--threads", str(args.threads)],
                                 capture_output=True, text=True, check=False)
            if run.returncode:
                raise SystemExit(f"{name} ({mode}) failed:\n{run.stderr[-2000:]}")
            got[mode] = json.loads(run.stdout.strip().splitlines()[-1])
        e, d = got["eager"], got["device"]
        print(f"{name:<10}{e['seconds']:>12.2f}{d['seconds']:>14.2f}{d['seconds'] / e['seconds']:>7.1f}"
              f"{e['peak_mb']:>10.0f}{d['peak_mb']:>11.0f}{d['peak_mb'] / e['peak_mb']:>7.2f}{e['step_mb']:>15.0f}"
              f"{d['step_mb']:>16.0f}", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
