"""The plots' content: what each panel shows, its labels and titles, markers only for what
happened, ticks at whole powers of two, the per-rank view, compare and sweep heat maps."""

from __future__ import annotations

import numpy as np
import pytest

from lossscale import simulate
from lossscale.app.plots import MARKS, figure_compare, figure_events, figure_fp8, figure_heatmaps, figure_run


def lines(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines()}


@pytest.fixture(scope="module")
def naive():
    return simulate(profile="atlas-training", detector="isfinite", steps=40)


@pytest.fixture(scope="module")
def two_ranks():
    return simulate(profile="atlas-training", detector="mindspore-all-finite", ranks=2, steps=40,
                    workload_args={"log_perplexity": True, "batch": 10})


def test_run_plot_marks_what_happened_and_only_that(naive) -> None:
    fig = figure_run(naive)
    scale, loss, under, grad = fig.axes
    assert scale.get_title().startswith("ExponentialUpdateLossScaleManager on atlas-training (SATURATION), "
                                        "detector isfinite, 1 rank(s)")
    drawn = lines(scale)
    undetected = naive.column("step")[naive.column("undetected_overflow").astype(bool)]
    assert undetected.size and np.array_equal(drawn["undetected overflow (applied with an event)"].get_xdata(),
                                              undetected)
    assert "skipped step" not in drawn and not any("false positive" in k for k in drawn)  # none happened
    assert set(t.get_text() for t in scale.get_legend().get_texts()) == set(drawn)
    assert all(float(v).is_integer() for v in scale.get_yticks())  # whole powers of two
    assert all(t.get_text().startswith("$2^{") for t in scale.get_yticklabels() if t.get_text())
    assert {"binary16 on the device", "binary32 baseline"} <= set(lines(loss))
    assert under.get_ylabel() == "underflow\nfraction" and grad.get_ylabel() == "|gradient|"
    threshold = lines(grad)["65504 / scale: the largest that fits binary16"].get_ydata()
    assert np.allclose(threshold, 65504 / naive.column("loss_scale"))
    assert fig.axes[-1].get_xlabel() == "step"


def test_run_plot_of_the_register_shows_skips_and_false_positives() -> None:
    run = simulate(profile="atlas-training", detector="tf-npu", steps=30, workload_args={"log_perplexity": True})
    drawn = lines(figure_run(run).axes[0])
    assert {"register event", "skipped step", "false positive (skipped, no event that feeds the update)"} <= set(drawn)
    assert "undetected overflow (applied with an event)" not in drawn
    assert [m[2] for m in MARKS][0] == "register event"


def test_several_ranks_get_a_panel_of_their_events_and_decisions(two_ranks) -> None:
    fig = figure_run(two_ranks)
    assert len(fig.axes) == 5
    ranks = fig.axes[4]
    assert [t.get_text() for t in ranks.get_yticklabels()] == ["rank 0", "rank 1"]
    drawn = lines(ranks)
    skipped = drawn["skipped by this rank"]
    want = sorted((r, rec["step"]) for rec in two_ranks.records
                  for r, ok in enumerate(map(int, rec["ranks_applied"].split())) if not ok)
    assert sorted(zip(skipped.get_ydata().astype(int), skipped.get_xdata().astype(int), strict=True)) == want
    assert two_ranks.summary["rank_disagreement_steps"] > 0  # the view shows ranks deciding apart
    events = drawn["register events on this rank"]
    assert set(events.get_ydata().astype(int)) == {0, 1}


def test_compare_plot_has_a_title_markers_per_manager_and_the_baseline() -> None:
    runs = [(name, simulate(manager=name, profile="atlas-training", steps=30)) for name in ("torch", "keras")]
    fig = figure_compare(runs)
    top, bottom = fig.axes
    assert top.get_title() == "atlas-training (SATURATION), detector tf-npu, workload mlp, 1 rank(s)"
    drawn = lines(top)
    assert {"torch", "keras", "torch: skipped step", "keras: skipped step", "torch: register event"} <= set(drawn)
    assert drawn["torch"].get_linestyle() != drawn["keras"].get_linestyle()
    assert drawn["torch"].get_linewidth() > drawn["keras"].get_linewidth()  # the one below shows around the other
    assert "binary32 baseline" in lines(bottom)


def test_sweep_heat_maps_over_any_two_axes() -> None:
    rows = []
    for det in ("tf-npu", "isfinite"):
        for mode in ("inf_nan", "saturation"):
            for seed in (0, 1):
                failed = det == "isfinite" and mode == "inf_nan"
                rows.append({"detector": det, "overflow_mode": mode, "seed": seed,
                             "status": "error" if failed else "ok",
                             "skipped_steps": "" if failed else str(10 + seed), "final_loss": "0.5"})
    fig = figure_heatmaps(rows, "detector", "overflow_mode")
    skipped, loss, bar0, bar1 = fig.axes  # the maps, then their colour bars
    assert skipped.get_xlabel() == "overflow_mode" and skipped.get_ylabel() == "detector"
    assert skipped.get_title() == "skipped steps\nmean per cell, min-max of up to 2 points"
    assert bar0.get_ylabel() == "mean skipped steps" and bar1.get_ylabel() == "mean final loss"
    texts = [t.get_text() for t in skipped.texts]
    assert texts.count("failed (2)") == 1 and texts.count("10.5\n10-11") == 3
    assert [t.get_text() for t in skipped.get_xticklabels()] == ["inf_nan", "saturation"]
    assert loss.get_title().startswith("final loss")


def test_importing_and_drawing_leaves_the_backend_alone() -> None:
    """In a fresh interpreter whose backend is set (as Jupyter's inline one is), importing the
    plots and drawing a run changes neither the backend nor pyplot's figures."""
    import subprocess
    import sys

    code = ("import matplotlib; matplotlib.use('svg'); import matplotlib.pyplot as plt\n"
            "from lossscale.app import plots\nfrom lossscale import simulate\n"
            "run = simulate(steps=5)\nfig = plots.figure_run(run)\n"
            "assert plots.plot_run(run).startswith(b'\\x89PNG')\n"
            "print(matplotlib.get_backend(), len(plt.get_fignums()), type(fig).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["svg", "0", "InlineFigure"]  # a Figure that shows itself inline


@pytest.fixture(scope="module")
def fp8_run():
    return simulate(profile="atlas-350", fp8="delayed", steps=25, shadow=["nvfp4", "mx:rule=floor"])


def test_fp8_plot_has_a_panel_per_tensor_group_marking_inf_amax_and_overflows(fp8_run) -> None:
    log = fp8_run.fp8
    groups = list(dict.fromkeys(r["tensor"].rsplit(".", 2)[0] for r in log))  # label.phase
    fig = figure_fp8(fp8_run)
    assert [ax.get_ylabel() for ax in fig.axes[:-1]] == groups == ["fc1.forward", "fc2.forward", "fc2.backward",
                                                                   "fc1.backward"]
    tensors = list(dict.fromkeys(r["tensor"] for r in log))
    inf_steps = {t: [r["step"] for r in log if r["tensor"] == t and not np.isfinite(r["amax"])] for t in tensors}
    over_steps = {t: [r["step"] for r in log if r["tensor"] == t and r["saturated"] > 0] for t in tensors}
    assert any(inf_steps.values()) and any(over_steps.values())  # the run has both to show
    for ax, group in zip(fig.axes, groups, strict=False):
        drawn = lines(ax)
        for tensor in (t for t in inf_steps if t.startswith(group + ".")):
            short = tensor[len(group) + 1:]
            assert {f"{short} scale", f"{short} amax"} <= set(drawn)
            inf = drawn.get(f"{short} amax Inf/NaN")
            assert (list(inf.get_xdata()) if inf else []) == inf_steps[tensor]
            over = drawn.get(f"{short}: cast overflowed")
            assert (list(over.get_xdata()) if over else []) == over_steps[tensor]
    bottom = lines(fig.axes[-1])
    steps = sorted({r["step"] for r in log})
    assert list(bottom["overflowed (saturated or NaN/Inf)"].get_ydata()) == [
        sum(r["saturated"] for r in log if r["step"] == t) for t in steps]
    assert fig.axes[-1].get_yscale() == "symlog"  # a few overflowed elements show beside thousands of NaNs


def test_the_shadow_plot_has_a_panel_per_alternative_with_its_shares(fp8_run) -> None:
    from lossscale.app.plots import figure_shadow

    fig = figure_shadow(fp8_run)
    assert [ax.get_ylabel() for ax in fig.axes] == ["nvfp4\n(NVFP4Scaling)", "mx:rule=floor\n(MXScaling)"]
    log = [r for r in fp8_run.shadow if r["shadow"] == "nvfp4"]
    steps = sorted({r["step"] for r in log})
    want = [sum(r["underflowed"] for r in log if r["step"] == t) / sum(r["elements"] for r in log if r["step"] == t)
            for t in steps]
    drawn = lines(fig.axes[0])["underflowed to zero (share)"].get_ydata()
    assert any(w > 0 for w in want)
    assert [d for d in drawn if d == d] == [w for w in want if w > 0]  # a zero share is not drawn on the log axis


def test_an_underflow_panel_with_nothing_to_show_says_so(naive) -> None:
    import dataclasses

    for fill, words in ((0.0, "no underflow: every measured fraction is 0"), (np.nan, "underflow not measured")):
        run = dataclasses.replace(naive, records=[{**r, "underflow_fraction": fill} for r in naive.records])
        under = figure_run(run).axes[2]
        assert [t.get_text() for t in under.texts] == [words] and not under.get_lines()
        assert list(under.get_yticks()) == []
    records = [{**r, "underflow_fraction": 0.25 if r["step"] == 3 else np.nan} for r in naive.records]
    under = figure_run(dataclasses.replace(naive, records=records)).axes[2]
    [line] = under.get_lines()
    assert list(line.get_xdata()) == [3] and not under.texts


def test_every_figure_function_returns_a_figure_and_events_have_a_y_title(fp8_run) -> None:
    from matplotlib.figure import Figure

    from lossscale.app import plots

    made = {"figure_run": figure_run(fp8_run), "figure_compare": figure_compare([("a", fp8_run), ("b", fp8_run)]),
            "figure_heatmaps": figure_heatmaps([{"manager": "a", "status": "ok", "skipped_steps": 1,
                                                 "final_loss": 1}], "manager", None),
            "figure_fp8": figure_fp8(fp8_run), "figure_events": figure_events(fp8_run),
            "figure_shadow": plots.figure_shadow(fp8_run),
            "figure_replay": plots.figure_replay(
                [{"step": i, "line": i + 1, "overflow": i == 1, "scale": 2.0 ** (16 - (i > 1)), "m_decision": d,
                  "m_scale_low": 2.0 ** 10, "m_scale_high": 2.0 ** 10} for i, d in enumerate(["clean", "unknown"])],
                {"managers": [{"name": "m"}], "format": "csv", "log": "x.csv",
                 "consistency": {"verdict": "no framework policy"}})}
    assert set(made) == {n for n in plots.__all__ if n.startswith("figure_")}
    assert all(isinstance(fig, Figure) for fig in made.values())
    # Jupyter shows them without pyplot's inline backend: IPython asks for _repr_png_.
    assert all(fig._repr_png_().startswith(b"\x89PNG\r\n") for fig in made.values())
    assert made["figure_events"].axes[0].get_ylabel() == "label (module or device.label)"
