"""DeepSpeed's own log lines, for the replay tests and the file tests: printed by the installed
``deepspeed/runtime/fp16/loss_scaler.py`` (``DynamicLossScaler.update_scale``, its logger captured)
with ``engine.py`` ``_report_progress``'s ``step={step}, skipped={skipped_steps}, lr={lr}, mom={mom}``
after each step. Skipped where DeepSpeed is not installed."""

import io
import logging

import pytest

#: A DynamicLossScaler that backs off and grows within a few steps.
DS = dict(init_scale=2**16, scale_window=5, min_scale=1, delayed_shift=2, consecutive_hysteresis=False)


def deepspeed_log(overflows: list[bool], **kwargs) -> str:
    """The real DynamicLossScaler's own lines for the sequence, with the engine's report after each step."""
    return deepspeed_run(overflows, **kwargs)[0]


def deepspeed_run(overflows: list[bool], **kwargs) -> tuple[str, list[float]]:
    """:func:`deepspeed_log`, and the real scaler's ``cur_scale`` before each step."""
    ls = pytest.importorskip("deepspeed.runtime.fp16.loss_scaler")
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] "
                                           "%(message)s"))
    ls.logger.addHandler(handler)
    level = ls.logger.level
    ls.logger.setLevel(logging.INFO)
    scaler = ls.DynamicLossScaler(**kwargs)
    skipped, scales = 0, []
    rank, ls.dist.get_rank = ls.dist.get_rank, lambda *a: 0  # one process, no process group
    try:
        for step, overflow in enumerate(overflows, start=1):
            scales.append(float(scaler.cur_scale))
            scaler.update_scale(overflow)
            skipped += overflow
            buf.write(f"[Rank 0] step={step}, skipped={skipped}, lr=[0.001], mom=[(0.9, 0.999)]\n")
    finally:
        ls.logger.removeHandler(handler)
        ls.logger.setLevel(level)
        ls.dist.get_rank = rank
    return buf.getvalue(), scales
