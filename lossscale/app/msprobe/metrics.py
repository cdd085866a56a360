"""msprobe's accuracy metrics, computed as its compare computes them, so that a number printed here
is the number ``msprobe compare`` prints for the same two tensors.

From mindstudio-probe 26.2 (``msprobe/core/compare/algorithm/builtin_algorithm/``,
``core/compare/npy_compare.py``, ``core/compare/utils.py``, ``pytorch/compare/utils.py``), with
"target" (msprobe's NPU side: here the simulated device) ``n`` and "bench" ``b``:

- a tensor is read as numpy has it (bfloat16 as binary32) and squeezed: a one-element tensor
  becomes 0-d, and of a 0-d tensor only the largest absolute error (in its own dtype) and
  relative error are computed; tensors of different shapes or no elements get no metric;
- Inf and NaN at the same places in both are set to 0 in both; at different places no metric
  is computed (msprobe prints N/A);
- cosine: n . b / (|n| |b|) in binary64 (its sums here correctly rounded, ``math.fsum``, where
  msprobe's go through the host's BLAS: the same on every host, and at most an ulp or two from
  msprobe's before its rounding to 12 decimals); 1 where both norms are at most binary64's epsilon, none
  where one is; unsupported for a 0-d, empty or one-element tensor; rounded to 12 decimals, to 6
  above 0.9999;
- Euclidean distance |n - b| in binary64; largest absolute error, rounded to 12 decimals;
- relative error |(n - b) / b| in binary32 or wider (numpy's result type of both and binary32),
  with that type's epsilon added to both where b is 0; its largest value, and the shares of
  elements below 0.001 ("One Thousandth Err Ratio", the "双千" criterion) and 0.005, each rounded
  to 12 decimals.

None stands for what msprobe prints as unsupported or N/A.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__: list[str] = []  # public as lossscale.msprobe's

#: The metrics' names here and in msprobe's compare output.
METRICS = {"cosine": "Cosine", "euc_dist": "EucDist", "max_abs_err": "MaxAbsErr",
           "max_rel_err": "MaxRelativeErr", "one_thousandth_err_ratio": "One Thousandth Err Ratio",
           "five_thousandths_err_ratio": "Five Thousandths Err Ratio"}
_NONE = dict.fromkeys(METRICS)


def _rounded(value: float) -> float:
    return float(f"{value:.12f}")


def _readable(x: np.ndarray) -> np.ndarray:
    """x as msprobe reads a dumped tensor: bfloat16 widened to binary32, squeezed."""
    x = np.asarray(x)
    return np.squeeze(x.astype(np.float32) if x.dtype.kind not in "fiub" else x)  # ml_dtypes' types


def _norm(x: np.ndarray) -> float:
    return math.sqrt(math.fsum(x * x))


def _relative(n: np.ndarray, b: np.ndarray) -> np.ndarray:
    kind = np.result_type(n, b, np.float32)
    n, b = n.astype(kind), b.astype(kind)
    zero = b == 0
    n[zero] += np.finfo(kind).eps
    b[zero] += np.finfo(kind).eps
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.abs(np.divide(n - b, b))


def metrics(target: np.ndarray, bench: np.ndarray) -> dict[str, Any]:
    """msprobe's metrics of ``target`` against ``bench`` (see the module's docstring)."""
    n, b = _readable(target), _readable(bench)
    if n.size == 0 or b.size == 0 or n.shape != b.shape:
        return dict(_NONE)
    n, b = n.copy(), b.copy()
    bad_n, bad_b = ~np.isfinite(n.astype(np.float64)), ~np.isfinite(b.astype(np.float64))
    if bad_n.any() or bad_b.any():
        if not (np.array_equal(np.isinf(n), np.isinf(b)) and np.array_equal(np.isnan(n), np.isnan(b))):
            return dict(_NONE)
        n[bad_n], b[bad_b] = 0, 0
    out: dict[str, Any] = dict(_NONE)
    rel = _relative(n, b)
    out["max_rel_err"] = _rounded(np.max(rel))
    if not n.shape:  # 0-d: the largest errors alone, the absolute one in the tensors' own dtype
        out["max_abs_err"] = _rounded(np.abs(n - b))
        return out
    wide_n, wide_b = n.reshape(-1).astype(float), b.reshape(-1).astype(float)
    norm_n, norm_b = _norm(wide_n), _norm(wide_b)  # squeezed, not 0-d: 2 elements or more
    eps = np.finfo(float).eps
    if norm_n <= eps and norm_b <= eps:
        out["cosine"] = 1.0
    elif norm_n > eps and norm_b > eps:
        cos = _rounded(math.fsum(wide_n * wide_b) / (norm_n * norm_b))
        out["cosine"] = round(cos, 6) if cos > 0.9999 else cos
    out["euc_dist"] = _norm(wide_n - wide_b)
    out["max_abs_err"] = _rounded(np.max(np.abs(wide_n - wide_b)))
    out["one_thousandth_err_ratio"] = _rounded(np.sum(rel < 0.001) / rel.size)
    out["five_thousandths_err_ratio"] = _rounded(np.sum(rel < 0.005) / rel.size)
    return out
