"""Rebuild ``testfloat.npz`` from the Berkeley TestFloat vector files.

Usage: ``python tests/data/make_testfloat.py DIR`` where DIR holds the
``*.txt.gz`` files that ``testfloat_gen`` writes (see tests/data/README.md). The vectors were
generated with Berkeley TestFloat 3e (``testfloat_gen``, level 1, seed 1,
tininess after rounding unless the name says ``tininessbefore``) against
SoftFloat 3e; ``f16_mulAdd_*`` hold every 61st case of the level-1 set.

Every file becomes arrays in the archive, one column per field, in the
narrowest unsigned dtype that holds it: ``<name>/<column>``. Files of one
operation in different rounding modes share their operands, which are then
stored once under ``<operation>/in<k>``, the results under
``<operation>_<mode>/out`` and ``/flags``.
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import numpy as np

MODES = ("near_even", "minMag", "min", "max", "near_maxMag", "odd")


def read(path: Path) -> list[np.ndarray]:
    rows = [line.split() for line in gzip.open(path, "rt")]
    cols = []
    for j in range(len(rows[0])):
        digits = max(len(r[j]) for r in rows)
        dtype = {1: np.uint8, 2: np.uint8, 4: np.uint16, 8: np.uint32, 16: np.uint64}[digits]
        cols.append(np.array([int(r[j], 16) for r in rows], dtype=dtype))
    return cols


def operation(stem: str) -> tuple[str, str | None]:
    for mode in MODES:
        for suffix in (f"_{mode}", f"_{mode}_tininessbefore"):
            if stem.endswith(suffix):
                return stem[: -len(suffix)], stem[len(stem) - len(suffix) + 1:]
    return stem, None


def main(src: Path, dst: Path) -> None:
    arrays: dict[str, np.ndarray] = {}
    for path in sorted(src.glob("*.txt.gz")):
        stem = path.name[: -len(".txt.gz")]
        op, mode = operation(stem)
        cols = read(path)
        *inputs, out, flags = cols
        key = op if mode else stem
        for k, col in enumerate(inputs):
            name = f"{key}/in{k}"
            if name in arrays and not np.array_equal(arrays[name], col):
                raise SystemExit(f"{path.name}: operands differ from the other modes of {op}")
            arrays[name] = col
        arrays[f"{stem}/out"] = out
        arrays[f"{stem}/flags"] = flags
    np.savez_compressed(dst, **arrays)
    print(f"wrote {dst} ({dst.stat().st_size / 1e6:.1f} MB, {len(arrays)} arrays)")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).with_name("testfloat.npz"))
