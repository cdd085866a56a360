"""Plots of runs, comparisons, sweeps and event logs: the scale on a log2 axis ticked at
whole powers of two, each kind of step marked where it occurs, the loss against the binary32
baseline. The ``figure_*`` functions return matplotlib figures made without pyplot, so they
change no backend and show inline in Jupyter; the ``plot_*`` functions render them to PNG,
SVG or PDF bytes with fixed metadata, so the same run gives the same file."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.patches
import matplotlib.ticker
import numpy as np
from matplotlib.figure import Figure

from ..training.records import Run
from . import IMAGE_FORMATS

__all__ = ["plot_run", "figure_run", "plot_compare", "figure_compare", "heatmaps", "figure_heatmaps", "plot_events",
           "figure_events", "figure_fp8", "plot_fp8", "figure_shadow", "plot_shadow", "figure_replay", "plot_replay",
           "InlineFigure", "IMAGE_FORMATS",
           "MARKS"]


_METADATA = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None},
             "pdf": {"CreationDate": None, "Creator": None, "Producer": None}}


class InlineFigure(Figure):
    """A matplotlib Figure that shows itself as a PNG in Jupyter (IPython's ``_repr_png_``) even
    where pyplot was never imported, so no inline backend registered a display for figures."""

    def _repr_png_(self) -> bytes:
        return _png(self)


def _png(fig, fmt: str = "png") -> bytes:
    """The figure's bytes in ``fmt``, with fixed metadata so that the same run gives the same file."""
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"unknown image format {fmt!r}; valid: {', '.join(IMAGE_FORMATS)}")
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "lossscale"}):
        fig.savefig(buf, format=fmt, dpi=110, metadata=_METADATA[fmt])
    return buf.getvalue()


def _title(run: Run) -> str:
    s = run.summary
    return (f"{s['manager']['class']} on {s['profile']['name']} ({s['profile']['overflow_mode']}), "
            f"detector {s['detector']}, {s['arguments']['ranks']} rank(s)")


def _powers_of_two(ax) -> None:
    """log2 values on the y axis, ticked at whole powers of two and labelled 2^k."""
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True, nbins=8))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"$2^{{{int(round(v))}}}$"))


#: The step markers of a run: (column, marker style, label); drawn only where present.
MARKS = (
    ("overflow", dict(marker="x", ls="none", color="tab:red"), "register event"),
    ("skipped", dict(marker="o", ls="none", mfc="none", color="tab:orange"), "skipped step"),
    ("undetected_overflow", dict(marker="v", ls="none", ms=7, color="black"),
     "undetected overflow (applied with an event)"),
    ("false_positive", dict(marker="s", ls="none", mfc="none", ms=8, color="tab:purple"),
     "false positive (skipped, no event that feeds the update)"),
    ("harmful", dict(marker="D", ls="none", ms=6, color="tab:red"),
     "harmful overflow (applied update off binary32's by more than 2**-4)"),
    ("harmless", dict(marker="+", ls="none", ms=9, color="tab:green"),
     "harmless overflow (applied update within 2**-4 of binary32's)"),
)


def _mask(run: Run, column: str) -> np.ndarray:
    if column == "skipped":
        return ~run.column("applied").astype(bool)
    if column in ("harmful", "harmless"):  # overflow_harm's readings (absent from older runs' files)
        return np.array([r.get("overflow_harm") == column for r in run.records], dtype=bool)
    return run.column(column).astype(bool)


def draw_scale(ax, run: Run, label: str | None = None, marks: bool = True, **line) -> None:
    """log2 of the scale per step; with ``marks``, the step markers present in the run."""
    steps, scale = run.column("step"), run.column("loss_scale").astype(float)
    with np.errstate(divide="ignore"):
        log2 = np.log2(scale)
    drawn = ax.step(steps, log2, where="post", label=label or "loss scale", **line)
    if marks:
        for column, style, text in MARKS:
            m = _mask(run, column)
            if m.any():
                ax.plot(steps[m], log2[m], label=text, **{"color": drawn[0].get_color(), **style})
    _powers_of_two(ax)


def plot_run(run: Run, fmt: str = "png") -> bytes:
    """The figure of one run, as image bytes."""
    return _png(figure_run(run), fmt)


def figure_run(run: Run) -> Figure:
    """One run: the scale with its step markers; the loss against the binary32 baseline; the
    underflow fraction; the largest gradient against what binary16 holds at the step's scale;
    and, with several ranks, each rank's events and decisions."""
    ranks = int(run.summary.get("arguments", {}).get("ranks", 1) or 1)
    heights = [3, 2, 1.4, 1.6] + ([0.35 * ranks + 0.9] if ranks > 1 else [])
    fig = InlineFigure(figsize=(8, 1.6 * sum(heights) + 0.8))
    axes = fig.subplots(len(heights), 1, sharex=True, height_ratios=heights)
    scale_ax, loss_ax, under_ax, grad_ax = axes[:4]
    steps = run.column("step")
    draw_scale(scale_ax, run, marks=True, color="tab:blue")
    scale_ax.set_ylabel("loss scale")
    scale_ax.set_title(_title(run), fontsize=9)
    scale_ax.legend(loc="best", fontsize=7)
    loss_ax.plot(steps, run.column("loss"), label="binary16 on the device")
    loss_ax.plot(steps, run.column("baseline_loss"), "--", color="black", label="binary32 baseline")
    loss_ax.set_ylabel("loss")
    loss_ax.set_yscale("log")
    loss_ax.legend(loc="best", fontsize=7)
    _draw_underflow(under_ax, steps, run.column("underflow_fraction").astype(float))
    grad = run.column("grad_max").astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        grad_ax.plot(steps, np.where(grad > 0, grad, np.nan), color="tab:brown", label="largest |gradient|")
        grad_ax.step(steps, 65504 / run.column("loss_scale").astype(float), "--", where="post", color="tab:red",
                     label="65504 / scale: the largest that fits binary16")
    grad_ax.set_yscale("log")
    grad_ax.set_ylabel("|gradient|")
    grad_ax.legend(loc="best", fontsize=7)
    if ranks > 1:
        _draw_ranks(axes[4], run, ranks)
    axes[-1].set_xlabel("step")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _draw_underflow(ax, steps: np.ndarray, fraction: np.ndarray) -> None:
    """The measured underflow fractions; when none is above zero (or none was measured), the
    panel says so in words instead of drawing a flat line on an axis of no scale."""
    measured = ~np.isnan(fraction)
    ax.set_ylabel("underflow\nfraction")
    if not (fraction[measured] > 0).any():
        words = "no underflow: every measured fraction is 0" if measured.any() else "underflow not measured"
        ax.text(0.5, 0.5, words, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="tab:green")
        ax.set_yticks([])
        return
    ax.plot(steps[measured], fraction[measured], ".-", color="tab:green", label="gradients lost to underflow")
    ax.legend(loc="best", fontsize=7)


def _draw_ranks(ax, run: Run, ranks: int) -> None:
    """Per rank: steps where its device raised register events, and steps it skipped."""
    events = sorted({(e["rank"], e["step"]) for e in run.events if e["step"] is not None})
    if events:
        r, t = np.array(events).T
        ax.plot(t, r, "x", color="tab:red", ms=4, ls="none", label="register events on this rank")
    decisions = [list(map(int, str(rec.get("ranks_applied", "")).split())) for rec in run.records]
    skipped = [(rank, rec["step"]) for rec, d in zip(run.records, decisions, strict=True)
               for rank, ok in enumerate(d) if not ok]
    if skipped:
        r, t = np.array(skipped).T
        ax.plot(t, r, "o", mfc="none", color="tab:orange", ms=6, ls="none", label="skipped by this rank")
    ax.set_yticks(range(ranks), [f"rank {k}" for k in range(ranks)], fontsize=7)
    ax.set_ylim(ranks - 0.5, -0.5)
    if events or skipped:
        ax.legend(loc="upper right", fontsize=7)


_STYLES = ("-", "--", "-.", ":")


def plot_compare(runs: Sequence[tuple[str, Run]], fmt: str = "png") -> bytes:
    """Several managers on one figure: see :func:`figure_compare`."""
    return _png(figure_compare(runs), fmt)


def figure_compare(runs: Sequence[tuple[str, Run]]) -> Figure:
    """Several managers on one figure: their scales with register events, skipped and undetected steps marked
    (line styles and widths differ, so that overlapping lines stay visible), their losses
    against the binary32 baseline below."""
    fig = InlineFigure(figsize=(8, 6))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    n = len(runs)
    for i, (name, run) in enumerate(runs):
        line = dict(ls=_STYLES[i % len(_STYLES)], lw=1 + 1.6 * (n - 1 - i) / max(n - 1, 1), color=f"C{i}")
        draw_scale(top, run, label=name, marks=False, **line)
        steps, log2 = run.column("step"), np.log2(run.column("loss_scale").astype(float))
        for column, style, text in MARKS[:3]:  # register events, skipped and undetected steps
            m = _mask(run, column)
            if m.any():
                top.plot(steps[m], log2[m], **{**style, "color": f"C{i}", "ms": 4},
                         label=f"{name}: {text.split(' (')[0]}")
        bottom.plot(steps, run.column("loss"), label=name, **line)
    first = runs[0][1]
    bottom.plot(first.column("step"), first.column("baseline_loss"), color="black", lw=0.8, label="binary32 baseline")
    s = first.summary
    top.set_title(f"{s['profile']['name']} ({s['profile']['overflow_mode']}), detector {s['detector']}, "
                  f"workload {s['arguments']['workload']}, {s['arguments']['ranks']} rank(s)", fontsize=9)
    top.set_ylabel("loss scale")
    top.legend(loc="best", fontsize=7, ncol=2)
    top.grid(alpha=0.3)
    bottom.set_xlabel("step")
    bottom.set_ylabel("loss")
    bottom.set_yscale("log")
    bottom.legend(loc="best", fontsize=7, ncol=2)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def heatmaps(rows: Sequence[dict], row_axis: str, col_axis: str | None,
             metrics: Sequence[str] = ("skipped_steps", "final_loss"), fmt: str = "png",
             over: Sequence[str] = ()) -> bytes:
    """Sweep results as heat maps, one per metric: see :func:`figure_heatmaps`."""
    return _png(figure_heatmaps(rows, row_axis, col_axis, metrics, over), fmt)


def _averaged(rows: Sequence[dict], over: Sequence[str], drawn: Sequence[str | None]) -> str:
    """The sentence naming the axes of ``over`` that vary across ``rows`` but are not drawn (each
    cell averages over them), seeds apart; "" when there are none but seeds."""
    label = lambda v: "" if v is None else str(v)  # noqa: E731
    hidden = []
    for axis in over:
        values = list(dict.fromkeys(label(r.get(axis)) for r in rows))
        if axis not in drawn and axis != "seed" and len(values) > 1:
            shown = ", ".join(values[:4]) + (f", ... ({len(values)} values)" if len(values) > 4 else "")
            hidden.append(f"{axis} ({shown})")
    if not hidden:
        return ""
    return f"each cell averages over {'; '.join(hidden)}: pick the axes with --heatmap ROW,COL"


def figure_heatmaps(rows: Sequence[dict], row_axis: str, col_axis: str | None,
                    metrics: Sequence[str] = ("skipped_steps", "final_loss"), over: Sequence[str] = ()) -> Figure:
    """One heat map per metric over two axes of a sweep (``col_axis`` None: one column): each
    cell the mean over the points that share its two values (seeds, other axes), written with
    the spread (min-max) when they differ; cells whose points all failed say so, and a cell
    with some failed points counts them. Of ``over`` (the sweep's axes), those that vary but
    are not drawn, seeds apart, are named in the figure's title: a cell never averages a
    varying setting unsaid."""
    label = lambda v: "" if v is None else str(v)  # noqa: E731
    row_values = list(dict.fromkeys(label(r.get(row_axis)) for r in rows))
    col_values = list(dict.fromkeys(label(r.get(col_axis)) for r in rows)) if col_axis else ["all"]
    cell = lambda r: (row_values.index(label(r.get(row_axis))),  # noqa: E731
                      col_values.index(label(r.get(col_axis))) if col_axis else 0)
    width = max(4.8, 1.1 * len(col_values) + 2.2)
    fig = InlineFigure(figsize=(width * len(metrics), 0.5 * len(row_values) + 2.4))
    axes = fig.subplots(1, len(metrics), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        values = [[[] for _ in col_values] for _ in row_values]
        failed = np.zeros((len(row_values), len(col_values)), int)
        for r in rows:
            i, j = cell(r)
            if r.get("status") != "ok":
                failed[i, j] += 1
            elif not np.isnan(_number(r.get(metric))):
                values[i][j].append(_number(r.get(metric)))
        mean = np.array([[np.mean(v) if v else np.nan for v in row] for row in values])
        im = ax.imshow(np.ma.masked_invalid(mean), aspect="auto", cmap="viridis")
        finite = mean[np.isfinite(mean)]
        lo, hi = (finite.min(), finite.max()) if finite.size else (0, 1)
        for (i, j), m in np.ndenumerate(mean):
            v = values[i][j]
            if not v:
                ax.add_patch(matplotlib.patches.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///",
                                                          color="0.6", lw=0))
                ax.text(j, i, f"failed ({failed[i, j]})" if failed[i, j] else "no data", ha="center", va="center",
                        fontsize=8, color="black")
                continue
            text = f"{m:.4g}" + (f"\n{min(v):.4g}-{max(v):.4g}" if min(v) != max(v) else "")
            if failed[i, j]:
                text += f"\n({failed[i, j]} failed)"
            dark = (m - lo) / (hi - lo) < 0.5 if hi > lo else True
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
        ax.set_xticks(range(len(col_values)), col_values, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(row_values)), row_values, fontsize=8)
        ax.set_xlabel(col_axis or "")
        ax.set_ylabel(row_axis)
        n = max((len(v) + f for row, frow in zip(values, failed, strict=True) for v, f in zip(row, frow, strict=True)),
                default=0)
        ax.set_title(f"{metric.replace('_', ' ')}\nmean per cell" + (f", min-max of up to {n} points" if n > 1 else ""),
                     fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8, label=f"mean {metric.replace('_', ' ')}")
    averaged = _averaged(rows, over, (row_axis, col_axis))
    if averaged:
        fig.suptitle(averaged, fontsize=9, color="firebrick")
    fig.tight_layout()
    return fig


def plot_fp8(run: Run, fmt: str = "png") -> bytes:
    """The FP8 log as image bytes: see :func:`figure_fp8`."""
    return _png(figure_fp8(run), fmt)


def _fp8_group(tensor: str) -> str:
    """A tensor's group: its label and phase (``fc2.backward`` of ``fc2.backward.1.a``)."""
    return tensor.rsplit(".", 2)[0]


def figure_fp8(run: Run, rank: int = 0) -> Figure:
    """The FP8 log of ``rank``: one panel per tensor group (label and phase) with each tensor's
    scale (solid) and amax (dotted) per step on a log2 axis, an amax of Inf or NaN marked by a
    triangle at the panel's top and a step where a tensor's cast overflowed by a cross on its
    amax; below, the elements that overflowed and that became NaN or Inf per step, summed over
    tensors, on a symmetric log axis (so that 8 shows beside 2000). The recipe in the title."""
    rows = [r for r in run.fp8 if r["rank"] == rank]
    tensors = list(dict.fromkeys(r["tensor"] for r in rows))
    groups = list(dict.fromkeys(_fp8_group(t) for t in tensors))
    fig = InlineFigure(figsize=(9, 1.9 * len(groups) + 2.6))
    axes = fig.subplots(len(groups) + 1, 1, sharex=True, squeeze=False,
                        height_ratios=[2] * len(groups) + [1.6])[:, 0]
    for ax, group in zip(axes, groups, strict=False):
        mine = [t for t in tensors if _fp8_group(t) == group]
        for i, name in enumerate(mine):
            log = [r for r in rows if r["tensor"] == name]
            steps = np.array([r["step"] for r in log])
            scale, amax = (np.array([r[k] for r in log], float) for k in ("scale", "amax"))
            over = np.array([r["saturated"] > 0 for r in log])
            short = name[len(group) + 1:]
            ax.plot(steps, scale, "-", color=f"C{i}", lw=1.2, label=f"{short} scale")
            with np.errstate(invalid="ignore"):
                shown = np.where(np.isfinite(amax) & (amax > 0), amax, np.nan)
            ax.plot(steps, shown, ":", color=f"C{i}", lw=1.4, label=f"{short} amax")
            if over.any():
                ax.plot(steps[over], np.where(np.isnan(shown[over]), np.nanmax(scale), shown[over]), "x",
                        color=f"C{i}", ms=7, label=f"{short}: cast overflowed")
            bad = ~np.isfinite(amax)
            if bad.any():
                ax.plot(steps[bad], np.full(bad.sum(), 0.96), "^", color=f"C{i}", ms=6, mec="black",
                        transform=ax.get_xaxis_transform(), clip_on=False, label=f"{short} amax Inf/NaN")
        ax.set_yscale("log", base=2)
        ax.set_ylabel(group, fontsize=8)
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=6)
        ax.grid(alpha=0.3)
    over_ax = axes[-1]
    steps = sorted({r["step"] for r in rows})
    for column, style, text in (("saturated", dict(color="tab:orange", marker="s"), "overflowed (saturated or "
                                 "NaN/Inf)"), ("nonfinite", dict(color="tab:red", marker="."), "became NaN or Inf")):
        totals = [sum(r[column] for r in rows if r["step"] == t) for t in steps]
        over_ax.plot(steps, totals, ms=4, lw=1, label=text, **style)
    over_ax.set_yscale("symlog", linthresh=1)
    over_ax.set_ylim(bottom=0)
    over_ax.set_ylabel("elements\n(all tensors)")
    over_ax.set_xlabel("step")
    over_ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    over_ax.grid(alpha=0.3)
    f = run.summary.get("fp8") or {}
    shown = ", ".join(f"{k}={v}" for k, v in (f.get("arguments") or {}).items())
    axes[0].set_title(f"FP8 matmuls: {f.get('recipe', '?')} ({shown})\n{_title(run)}\n"
                      f"one panel per tensor group (label.phase): each tensor's scale solid, its amax dotted",
                      fontsize=8)
    fig.tight_layout()
    return fig


def plot_shadow(run: Run, fmt: str = "png") -> bytes:
    """The shadow log as image bytes: see :func:`figure_shadow`."""
    return _png(figure_shadow(run), fmt)


#: What a shadow panel draws per step: (column, share of the elements, label, style).
_SHADOW_LINES = (("saturated", True, "saturated (share of elements)", dict(color="tab:orange", marker="s")),
                 ("nonfinite", True, "NaN or Inf (share)", dict(color="tab:red", marker=".")),
                 ("underflowed", True, "underflowed to zero (share)", dict(color="tab:blue", marker="v")),
                 ("rel_error", False, "relative error (median over tensors)", dict(color="black", marker="")))


def _shadow_series(rows: list[dict], steps: list[int]) -> dict[str, np.ndarray]:
    """Per step, the shares of the elements over all tensors and the median relative error."""
    out = {}
    for column, share, _, _ in _SHADOW_LINES:
        values = []
        for t in steps:
            mine = [r for r in rows if r["step"] == t]
            if share:
                total = sum(r["elements"] for r in mine)
                values.append(sum(r[column] for r in mine) / total if total else np.nan)
            else:
                values.append(float(np.median([r[column] for r in mine])) if mine else np.nan)
        with np.errstate(invalid="ignore"):
            series = np.array(values, float)
            out[column] = np.where(series > 0, series, np.nan)  # a log axis: zero is not drawn
    return out


def figure_shadow(run: Run, rank: int = 0) -> Figure:
    """The shadow log of ``rank``: one panel per alternative, with per step the share of all its
    operands' elements that would have saturated, become NaN or Inf, and underflowed to zero,
    and the median over tensors of the relative error against the binary32 operands, on a log
    axis (zero not drawn); the run's own recipe (fp8.csv) dashed beside each, where it has one."""
    rows = [r for r in run.shadow if r["rank"] == rank]
    names = list(dict.fromkeys(r["shadow"] for r in rows))
    steps = sorted({r["step"] for r in rows})
    own = _shadow_series([r for r in run.fp8 if r["rank"] == rank], steps) if run.fp8 else None
    fig = InlineFigure(figsize=(9, 2.1 * max(len(names), 1) + 1.2))
    axes = fig.subplots(max(len(names), 1), 1, sharex=True, squeeze=False)[:, 0]
    for ax, name in zip(axes, names, strict=False):
        series = _shadow_series([r for r in rows if r["shadow"] == name], steps)
        for column, _, text, style in _SHADOW_LINES:
            ax.plot(steps, series[column], ms=3, lw=1.1, label=text, **style)
            if own is not None:
                ax.plot(steps, own[column], ls="--", lw=0.9, color=style["color"], alpha=0.6)
        ax.set_yscale("log")
        a = (run.summary.get("shadow") or {}).get(name, {})
        ax.set_ylabel(f"{name}\n({a.get('recipe', '?')})", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=6)
    axes[-1].set_xlabel("step")
    f = run.summary.get("fp8") or {}
    axes[0].set_title(f"shadows on the run's operands (the run: {f.get('recipe', 'binary16 matmuls')}"
                      f"{', dashed' if own is not None else ''})\n{_title(run)}", fontsize=8)
    fig.tight_layout()
    return fig


def plot_events(run: Run, top: int = 12, fmt: str = "png") -> bytes:
    """The event log as image bytes: see :func:`figure_events`."""
    return _png(figure_events(run, top), fmt)


def figure_events(run: Run, top: int = 12) -> Figure:
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
    fig = InlineFigure(figsize=(8, 0.35 * len(labels) + 1.8))
    ax = fig.subplots()
    im = ax.imshow(np.ma.masked_equal(grid, 0), aspect="auto", interpolation="nearest", cmap="viridis",
                   extent=(-0.5, steps - 0.5, len(labels) - 0.5, -0.5))
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("label (module or device.label)")
    first = run.summary.get("first_overflow")
    where = (f"first: step {first['step']}, {first['op']} in {first['label'] or '(unlabelled)'} ({first['phase']})"
             if first else "no events")
    ax.set_title(f"operations with register events, per label and step; {where}", fontsize=9)
    bar = fig.colorbar(im, ax=ax, shrink=0.8, label="operations")
    bar.locator = matplotlib.ticker.MaxNLocator(integer=True)
    bar.update_ticks()
    fig.tight_layout()
    return fig


def plot_replay(rows: Sequence[dict], summary: dict, fmt: str = "png") -> bytes:
    """A replay as image bytes: see :func:`figure_replay`."""
    return _png(figure_replay(rows, summary), fmt)


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first and last index of each run of True in ``mask``."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1


def figure_replay(rows: Sequence[dict], summary: dict) -> Figure:
    """A replay (``replay.csv``'s rows, ``summary.json``): the scale each logged step ran at, its
    overflows marked, the log's gaps shaded grey, and each manager's scale on the log's bounds (a
    band where unknown steps left it several states), its certain overflows marked and its unknown
    steps shaded; log2 axis."""
    managers = [m["name"] for m in summary["managers"]]
    numbered = all(r["step"] is not None for r in rows)
    x = np.array([r["step"] if numbered else i for i, r in enumerate(rows)], dtype=float)
    log2 = lambda key: np.log2(np.array([np.nan if r[key] is None else r[key] for r in rows], dtype=float))  # noqa: E731
    fig = InlineFigure(figsize=(8, 4.5))
    ax = fig.subplots()
    logged = log2("scale")
    ax.step(x, logged, where="post", color="black", lw=1.6, label=f"logged ({summary['format']})")
    over = np.array([r["overflow"] for r in rows], dtype=bool)
    gap = np.array([r.get("steps", "1") not in ("1", 1, None) for r in rows], dtype=bool)
    if over.any():
        ax.plot(x[over & ~gap], logged[over & ~gap], "x", color="black", ls="none", label="logged overflow")
    if gap.any():  # steps the log does not print one by one: counted, bounded or of unknown number
        ax.broken_barh([(v - 0.5, 1.0) for v in x[gap]], (0, 1), facecolor="0.5", alpha=0.25,
                       transform=ax.get_xaxis_transform(), label="gap (steps not printed)")
    for i, name in enumerate(managers):
        color, low, high = f"C{i}", log2(f"{name}_scale_low"), log2(f"{name}_scale_high")
        ax.step(x, low, where="post", color=color, lw=1.2, ls=_STYLES[i % len(_STYLES)], label=name)
        if not np.array_equal(low, high, equal_nan=True):
            ax.fill_between(x, low, high, step="post", color=color, alpha=0.3, lw=0,
                            label=f"{name}: scales it may hold")
        decision = np.array([r[f"{name}_decision"] for r in rows])
        certain = decision == "overflow"
        if certain.any():
            ax.plot(x[certain], low[certain], "v", color=color, ms=4, ls="none", label=f"{name}: overflow")
        first, last = _runs(decision == "unknown")
        if first.size:
            ax.broken_barh(list(zip(x[first], x[last] - x[first] + 1, strict=True)), (0, 1), facecolor=color,
                           alpha=0.12, transform=ax.get_xaxis_transform(), label=f"{name}: unknown step")
    _powers_of_two(ax)
    ax.set_ylabel("loss scale")
    ax.set_xlabel("step" if numbered else "event (the log does not number every step)")
    verdict = summary["consistency"]["verdict"].splitlines()[0]
    ax.set_title(f"{Path(summary['log']).name}: {verdict}", fontsize=8, wrap=True)
    ax.legend(loc="best", fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
