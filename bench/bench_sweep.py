"""A 200-point sweep of the trace workload with 1 and with 2 worker processes.

    python bench/bench_sweep.py [--grid examples/sweep-trace.toml]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from lossscale.app.sweep import load_grid, points, run_sweep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", type=Path, default=Path(__file__).parent.parent / "examples" / "sweep-trace.toml")
    args = ap.parse_args()
    n = len(points(*load_grid(args.grid)))
    times = {}
    for workers in (1, 2):
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            rows = run_sweep(args.grid, Path(out), workers=workers)
            times[workers] = time.perf_counter() - t0
            assert len(rows) == n
    print(f"{'points':>7}{'workers':>9}{'seconds':>9}{'speed-up':>10}")
    for workers, t in times.items():
        print(f"{n:>7}{workers:>9}{t:>9.1f}{times[1] / t:>10.2f}")


if __name__ == "__main__":
    main()
