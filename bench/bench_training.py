"""Cost of one emulated training step against the same step in plain numpy float32.

The emulated step: forward and backward on a simulated device in binary16 (exact
matmul accumulation, every operation rounded and its events recorded), then
NPULossScaleOptimizer's unscale, decision and update. The plain step: the same
model's forward and backward in numpy float32 (BLAS matmuls) and the same
optimizer update. Ratio in one run (the two steps timed in turn);
lower is better. Target: at most 5x for mlp.

    python bench/bench_training.py [--workload mlp] [--repeat 200]
"""

from __future__ import annotations

import argparse
import os

from timing import best_of_each, print_steps

from lossscale import ExponentialUpdateLossScaleManager, NPULossScaleOptimizer
from lossscale.training.workloads import WORKLOADS, make_workload
from sim import Device


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="mlp", choices=list(WORKLOADS))
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--profile", default="atlas-training")
    args = ap.parse_args()
    wl = make_workload(args.workload)
    batch = wl.batches(1)[0]
    dev = Device(args.profile)
    params, params32 = wl.init_params(), wl.init_params()
    opt = NPULossScaleOptimizer(wl.optimizer(), ExponentialUpdateLossScaleManager(2**10, 1000), device=dev)
    opt32 = wl.optimizer()

    def emulated() -> None:
        dev.clear_float_status()
        with dev:
            _, grads = wl.forward_backward(dev, params, opt.get_loss_scale(), batch)
        opt.apply_gradients(opt.compute_gradients(lambda _s: grads, params))

    def plain() -> None:
        _, grads = wl.grads32(params32, batch)
        opt32.apply_gradients(list(zip(grads, params32, strict=True)))

    load = os.getloadavg()[0]
    t_emul, t_plain = best_of_each([emulated, plain], args.repeat)
    print(f"load average at start: {load:.2f} on {os.cpu_count()} cores")
    print_steps("step", (f"numpy float32 ({args.workload})", t_plain),
                [(f"emulated binary16 on {args.profile}", t_emul)])


if __name__ == "__main__":
    main()
