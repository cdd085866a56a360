"""Plots of scale trajectories: log2 S against step, overflow and skipped steps
marked, the loss below. Rendered with matplotlib's Agg backend to PNG bytes,
with fixed metadata so the same run gives the same file."""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .simulate import Run  # noqa: E402

__all__ = ["plot_run", "figure_run", "plot_compare", "heatmaps", "plot_events", "figure_events"]



#: Image formats the plots are written in.
FORMATS = ("png", "svg", "pdf")
_METADATA = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None},
             "pdf": {"CreationDate": None, "Creator": None, "Producer": None}}


def _png(fig, fmt: str = "png") -> bytes:
    """The figure's bytes in ``fmt``, with fixed metadata so that the same run gives the same file."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown image format {fmt!r}; valid: {', '.join(FORMATS)}")
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "lossscale"}):
        fig.savefig(buf, format=fmt, dpi=110, metadata=_METADATA[fmt])
    plt.close(fig)
    return buf.getvalue()


def _title(run: Run) -> str:
    s = run.summary
    return (f"{s['manager']['class']} on {s['profile']['name']} ({s['profile']['overflow_mode']}), "
            f"detector {s['detector']}, {s['arguments']['ranks']} rank(s)")


def draw_scale(ax, run: Run, label: str | None = None, marks: bool = True) -> None:
    steps, scale = run.column("step"), run.column("loss_scale").astype(float)
    with np.errstate(divide="ignore"):
        ax.step(steps, np.log2(scale), where="post", label=label or "log2 loss scale")
    if marks:
        over = run.column("overflow").astype(bool)
        skipped = ~run.column("applied").astype(bool)
        false = run.column("false_positive").astype(bool)
        ax.plot(steps[over], np.log2(scale[over]), "x", color="tab:red", label="register event")
        ax.plot(steps[skipped], np.log2(scale[skipped]), "o", mfc="none", color="tab:orange", label="skipped step")
        if false.any():
            ax.plot(steps[false], np.log2(scale[false]), "s", mfc="none", ms=8, color="tab:purple",
                    label="false positive (skipped, no event that feeds the update)")


def plot_run(run: Run, fmt: str = "png") -> bytes:
    """The figure of one run, as image bytes."""
    return _png(figure_run(run), fmt)


def figure_run(run: Run):
    """The figure of one run: log2 scale with overflow and skipped steps marked, the loss below."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[3, 2])
    draw_scale(top, run)
    top.set_ylabel("log2 loss scale")
    top.set_title(_title(run), fontsize=9)
    top.legend(loc="best", fontsize=8)
    top.grid(alpha=0.3)
    steps = run.column("step")
    bottom.plot(steps, run.column("loss"), label="binary16 on the device")
    bottom.plot(steps, run.column("baseline_loss"), "--", label="binary32 baseline")
    bottom.set_xlabel("step")
    bottom.set_ylabel("loss")
    bottom.set_yscale("log")
    bottom.legend(loc="best", fontsize=8)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_compare(runs: Sequence[tuple[str, Run]], fmt: str = "png") -> bytes:
    """Several managers on one figure: their scales above, their losses below."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[3, 2])
    for name, run in runs:
        draw_scale(top, run, label=name, marks=False)
        bottom.plot(run.column("step"), run.column("loss"), label=name)
    top.set_ylabel("log2 loss scale")
    top.legend(loc="best", fontsize=8)
    top.grid(alpha=0.3)
    bottom.set_xlabel("step")
    bottom.set_ylabel("loss")
    bottom.set_yscale("log")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    return _png(fig, fmt)


def heatmaps(tables: dict[str, np.ndarray], rows: Sequence[str], cols: Sequence[str], fmt: str = "png") -> bytes:
    """One heat map per metric (rows x cols), values written in the cells; NaN cells blank."""
    fig, axes = plt.subplots(1, len(tables), figsize=(4.2 * len(tables), 0.45 * len(rows) + 2.2), squeeze=False)
    for ax, (metric, grid) in zip(axes[0], tables.items(), strict=True):
        im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
        ax.set_title(f"mean {metric.replace('_', ' ')}", fontsize=9)
        for (i, j), v in np.ndenumerate(grid):
            if v == v:
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=7, color="w")
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    return _png(fig, fmt)


def plot_events(run: Run, top: int = 12, fmt: str = "png") -> bytes:
    """The event log as image bytes: see :func:`figure_events`."""
    return _png(figure_events(run, top), fmt)


def figure_events(run: Run, top: int = 12):
    """Operations with register events per label (rows, the ``top`` labels by events) and
    step (columns), summed over ranks; the first overflow named in the title."""
    events = run.events
    counts: dict[str, int] = {}
    for e in events:
        key = e["label"] or "(unlabelled)"
        counts[key] = counts.get(key, 0) + 1
    labels = sorted(counts, key=lambda k: -counts[k])[:top]
    steps = max(run.summary.get("steps_run", 0), 1 + max((e["step"] or 0 for e in events), default=0))
    grid = np.zeros((len(labels), steps))
    for e in events:
        key = e["label"] or "(unlabelled)"
        if key in labels and e["step"] is not None:
            grid[labels.index(key), e["step"]] += 1
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(labels) + 1.8))
    im = ax.imshow(np.ma.masked_equal(grid, 0), aspect="auto", interpolation="nearest", cmap="viridis",
                   extent=(-0.5, steps - 0.5, len(labels) - 0.5, -0.5))
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("step")
    first = run.summary.get("first_overflow")
    where = (f"first: step {first['step']}, {first['op']} in {first['label'] or '(unlabelled)'} ({first['phase']})"
             if first else "no events")
    ax.set_title(f"operations with register events, per label and step; {where}", fontsize=9)
    bar = fig.colorbar(im, ax=ax, shrink=0.8, label="operations")
    bar.locator = matplotlib.ticker.MaxNLocator(integer=True)
    bar.update_ticks()
    fig.tight_layout()
    return fig
