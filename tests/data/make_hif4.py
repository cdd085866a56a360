"""Write hif4.npz: the HiF4 blocks the published reference quantiser makes of chosen inputs.

Usage: ``python tests/data/make_hif4.py CHECKOUT`` where CHECKOUT is a checkout of
``github.com/global-computing-consortium/HiFloat4`` (commit 6d937b6 for the file kept here); it
needs torch. The reference function, ``quant_hifx`` of ``hif4_gpu/quant_cy/base/QFuncs/hifx.py``,
is loaded from the checkout as it is (with its ``QType`` given the HiF4 settings it reads:
``exp_bits`` 0, ``man_bits`` 3, as ``QType("hifx4")`` has them) and run on the CPU in binary32.
The file holds ``x`` (float32 rows of 64-value blocks: random, adversarial and hand-chosen) and
``y`` (the reference's float32 output, as uint32 bits so that zeros keep their signs).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np


def reference(checkout: Path):
    """The reference's ``quant_hifx``, loaded from its own file."""
    package = types.ModuleType("hifref")
    package.__path__ = []
    qtype = types.ModuleType("hifref.QType")

    class QType:  # the two fields quant_hifx reads, as QType("hifx4") sets them
        exp_bits, man_bits = 0, 3

    qtype.QType = QType
    funcs = types.ModuleType("hifref.QFuncs")
    funcs.__path__ = []
    sys.modules.update({"hifref": package, "hifref.QType": qtype, "hifref.QFuncs": funcs})
    path = checkout / "hif4_gpu" / "quant_cy" / "base" / "QFuncs" / "hifx.py"
    spec = importlib.util.spec_from_file_location("hifref.QFuncs.hifx", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return lambda x: module.quant_hifx(x, QType(), -1)


def inputs() -> np.ndarray:
    """Rows of 64: random normal at scales 2**-60 .. 2**30; adversarial blocks (one large value
    among small ones, every binade from 2**-20 to 2**20, amax near the scale's clip at 49152 * 7
    and beyond, near 2**-48 * 7 and below, group maxima at the micro-exponent thresholds, element
    ties at (k + 1/2) / 4); zeros of both signs; each row also negated."""
    rng = np.random.default_rng(2026)
    rows = [rng.standard_normal(64) * 2.0 ** s for s in range(-60, 31, 3) for _ in range(8)]
    for _ in range(64):
        r = rng.standard_normal(64) * 2.0 ** rng.integers(-30, 10)
        r[rng.integers(64)] *= 2.0 ** rng.integers(1, 12)
        rows.append(r)
    rows.append(np.ldexp(rng.uniform(1, 2, 64), np.arange(-20, 44)[:64] % 41 - 20))
    for amax in (49152 * 7 * 0.99, 49152 * 7, 49152 * 7 * 1.01, 1e30, 2.0**-48 * 7, 2.0**-48 * 3, 1e-30):
        r = rng.uniform(-1, 1, 64) * amax
        r[5] = amax
        rows.append(r)
    for t in (1.0, 2.0 - 2.0**-20, 2.0, 2.0 + 2.0**-20, 4.0, 4.0 - 2.0**-18):  # group maxima near thresholds
        r = np.full(64, 0.1)
        r[0] = 7 * 1.0  # the block's amax: scale 1
        r[8:16] = t
        r[20] = t / 2
        rows.append(r)
    ties = (np.arange(64) % 8 + 0.5) / 4  # element ties at scale 1 (amax 7 * 1)
    ties[63] = 7.0
    rows += [ties, np.zeros(64), -np.zeros(64), np.where(np.arange(64) % 2, -0.0, 1e-3)]
    x = np.array(rows, np.float32)
    return np.concatenate([x, -x])


def main(checkout: Path, out: Path) -> None:
    import torch

    quant = reference(checkout)
    x = inputs()
    y = quant(torch.from_numpy(x)).numpy()
    np.savez_compressed(out, x=x, y=y.view(np.uint32))
    print(f"wrote {out}: {x.shape[0]} blocks")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).with_name("hif4.npz"))
