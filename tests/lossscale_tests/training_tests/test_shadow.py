"""Shadow statistics: each alternative's rows are those of a run under it on the same operands,
bit for bit, and shadows change nothing the run computes."""

from __future__ import annotations

import numpy as np
import pytest
from runs import same  # noqa: E402

from lossscale import simulate
from lossscale.training.fp8 import CurrentScaling, DelayedScaling, Fp8Matmuls, make_recipe
from lossscale.training.phases import begin_phase
from lossscale.training.shadow import alternative, alternatives
from sim import Device

#: (the run's recipe, its alternatives): recipes, formats and overflow modes.
CASES = [("current", ["nvfp4", "mxfp8", "block", "mx:rule=floor:fp8_format=float4_e2m1fn", "hifloat8", "saturation",
                      "delayed:amax_history_len=4"]),
         ("nvfp4", ["current", "inf_nan", "block:pow2=false"]),
         ("mx", ["float6_e2m3fn", "saturation", "float8_e5m2:rule=even"])]


def script(seed: int = 5) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """Two layers' forward and backward matmuls (fprop, wgrad, dgrad) with overflowing, tiny and
    NaN-free operands, as a run would feed a device: (label, phase, a, b)."""
    rng = np.random.default_rng(seed)
    h = lambda *s: (rng.standard_normal(s) * np.exp2(rng.integers(-14, 9, s))).astype(np.float16)  # noqa: E731
    x, w1, w2, dy = h(16, 64), h(64, 48), h(48, 40), h(16, 40)
    z = np.ones((16, 48), np.float16)
    return [("fc1", "forward", x, w1), ("fc2", "forward", z, w2),
            ("fc2", "backward", np.ascontiguousarray(z.T), dy), ("fc2", "backward", dy, np.ascontiguousarray(w2.T)),
            ("fc1", "backward", np.ascontiguousarray(x.T), z)]


def feed(hook: Fp8Matmuls, dev: Device, steps: int = 3) -> None:
    dev.substitute("matmul", hook)
    for step in range(steps):
        begin_phase(dev, "forward", step=step)
        for label, phase, a, b in script(step):
            if phase != dev.tags.get("phase"):
                begin_phase(dev, phase)
            with dev.label(label):
                dev.matmul(a, b)


@pytest.mark.filterwarnings("ignore:atlas-350. saturation mode is kept")
@pytest.mark.parametrize(("recipe", "shadows"), CASES)
def test_a_shadow_is_the_run_under_its_alternative_on_the_same_operands(recipe: str, shadows: list[str]) -> None:
    """Every row of every step, every column, for recipes with state (delayed scaling's history),
    stochastic rounding (NVFP4's gradients) and either overflow mode."""
    rows: list[dict] = []
    dev = Device("atlas-350")
    hook = Fp8Matmuls(make_recipe(recipe), shadows=[a.attach(dev, 0, rows.append)
                                                   for a in alternatives(shadows, make_recipe(recipe))])
    feed(hook, dev)
    for alt in alternatives(shadows, make_recipe(recipe)):
        alone = Fp8Matmuls(alt.recipe)
        feed(alone, Device("atlas-350", alt.overflow))
        mine = [{k: v for k, v in r.items() if k != "shadow"} for r in rows if r["shadow"] == alt.name]
        assert len(mine) == 3 * 10 and same(mine, alone.rows), alt.name


@pytest.mark.filterwarnings("ignore:atlas-350. saturation mode is kept")
def test_at_step_0_a_shadow_is_a_separate_run() -> None:
    """In training: the first matmul's operands (the batch and the initial weights) are a separate
    run's, so its shadow rows at step 0 are that run's fp8.csv rows."""
    run = simulate("mlp", profile="atlas-350", fp8="current", steps=2,
                   shadow=["nvfp4", "mxfp8", "block", "hifloat8", "saturation"])
    for alt in alternatives(["nvfp4", "mxfp8", "block", "hifloat8", "saturation"], CurrentScaling()):
        fp8, args = ("current", {"fp8_format": alt.recipe.fp8_format}) if alt.name == "hifloat8" \
            else ("current", None) if alt.name == "saturation" else (alt.name, None)
        alone = simulate("mlp", profile="atlas-350", fp8=fp8, fp8_args=args, steps=1,
                         overflow_mode="saturation" if alt.name == "saturation" else None)
        first = [r for r in alone.fp8 if r["tensor"].startswith("fc1.forward.0")]
        mine = [{k: v for k, v in r.items() if k != "shadow"} for r in run.shadow
                if r["shadow"] == alt.name and r["step"] == 0 and r["tensor"].startswith("fc1.forward.0")]
        assert len(first) == 2 and same(mine, first), alt.name


def test_shadows_change_nothing() -> None:
    plain = simulate("mlp", profile="atlas-350", fp8="current", steps=4)
    shadowed = simulate("mlp", profile="atlas-350", fp8="current", steps=4, shadow=["nvfp4", "mxfp8"])
    assert same(shadowed.records, plain.records) and same(shadowed.fp8, plain.fp8)
    assert {r["shadow"] for r in shadowed.shadow} == {"nvfp4", "mxfp8"}
    binary16 = simulate("mlp", profile="atlas-350", steps=4)
    alone = simulate("mlp", profile="atlas-350", steps=4, shadow=["block"])
    assert same(alone.records, binary16.records) and alone.fp8 == [] and len(alone.shadow) == 4 * 10
    assert alone.summary["fp8"] is None and alone.summary["shadow"]["block"]["recipe"] == "BlockScaling"


def test_what_an_alternative_names() -> None:
    run_recipe = make_recipe("delayed", margin=1)
    assert alternative("hifloat8", run_recipe).recipe == DelayedScaling(margin=1, fp8_format="hifloat8")
    assert alternative("hifloat8", None).recipe == CurrentScaling(fp8_format="hifloat8")
    sat = alternative("saturation", run_recipe)
    assert sat.recipe == run_recipe and sat.overflow.name == "SATURATION"
    assert alternative("nvfp4:overflow=saturation:two_level=false", None).recipe.two_level is False
    with pytest.raises(ValueError, match="unknown shadow 'e4m3x'; valid: a recipe"):
        alternative("e4m3x", None)
    with pytest.raises(ValueError, match="an overflow mode shadows the run's own recipe"):
        alternative("inf_nan", None)
    with pytest.raises(ValueError, match="KEY=VALUE after the name"):
        alternative("mx:floor", None)
    with pytest.raises(ValueError, match="shadow 'hifloat8': NVFP4's elements"):
        alternative("hifloat8", make_recipe("nvfp4"))
    with pytest.raises(ValueError, match="given twice"):
        alternatives(["mx", "mx"], None)
    with pytest.raises(ValueError, match="takes no argument margin"):
        alternative("hifloat8:margin=2", CurrentScaling())
    with pytest.raises(ValueError, match="atlas-a2 .* has no 8-bit float formats"):
        simulate("mlp", steps=1, shadow=["nvfp4"])
