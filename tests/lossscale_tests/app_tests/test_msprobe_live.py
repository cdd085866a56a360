"""Dumps msprobe itself writes here (tests/msprobe_dumps.py: a float16 model natively on the CPU, or
on a simulated atlas-a2 through ``lossscale.msprobe.collected_on_host``), at levels L0, L1 and mix
and tasks tensor, statistics and md5, read back, re-executed, and set beside msprobe's own compare.
Needs the ``msprobe`` extra (and torch); skipped without it. msprobe runs in processes of its own only:
imported, it leaves tensorflow's ``tf.Variable`` broken for the rest of the process."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from paths import ROOT

pytest.importorskip("torch")
if importlib.util.find_spec("msprobe") is None:  # not imported here: msprobe breaks a later tensorflow import
    pytest.skip("msprobe (the msprobe extra) is not installed", allow_module_level=True)

from lossscale.msprobe import METRICS, STATISTICS, metrics, read_dump, replay, statistics, verdict  # noqa: E402

pytestmark = pytest.mark.slow

#: name: the maker's arguments (the planted event is an overflow unless named).
DUMPS = {
    "native": ["--level", "L1"],
    "saturation": ["--level", "L1", "--profile", "atlas-a2", "--overflow", "saturation"],
    "inf_nan": ["--level", "L1", "--profile", "atlas-a2", "--overflow", "inf_nan"],
    "l0": ["--level", "L0"],
    "mix": ["--level", "mix"],
    "statistics": ["--level", "mix", "--task", "statistics"],
    "md5": ["--level", "L1", "--task", "md5"],
    "nan": ["--level", "mix", "--plant", "nan"],
    "none": ["--level", "L1", "--plant", "none"],
    "stat_native": ["--level", "L1", "--task", "statistics"],
    "stat_device": ["--level", "L1", "--task", "statistics", "--profile", "atlas-a2", "--overflow", "saturation"],
}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("msprobe")
    runs = {name: subprocess.Popen([sys.executable, str(ROOT / "tests" / "msprobe_dumps.py"), str(root / name), *a],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for name, a in DUMPS.items()}
    for name, run in runs.items():
        out, _ = run.communicate(timeout=600)
        assert run.returncode == 0, (name, out[-3000:])
    return {name: root / name for name in DUMPS}


def _msprobe_compare(target: Path, golden: Path, out: Path) -> list[dict[str, str]]:
    """msprobe's own compare of one step's dumps: its CSV's rows."""
    run = subprocess.run([sys.executable, "-m", "msprobe.msprobe", "compare", "--target_path", str(target),
                          "--golden_path", str(golden), "--output_path", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [result] = out.glob("compare_result_*.csv")
    with result.open(newline="") as f:
        return list(csv.DictReader(f))


def _tensor(dump: Path, step: int, name: str):
    import torch
    return torch.load(dump / f"step{step}" / "rank0" / "dump_tensor_data" / f"{name}.pt")


def _number(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None  # unsupported, N/A: no number
    return None if number != number else number  # msprobe's "Nan": no number either


def test_every_call_of_every_level_and_task_is_read(dumps) -> None:
    for name in ("native", "l0", "mix", "statistics", "md5"):
        entries = read_dump(dumps[name])
        data = [json.loads(f.read_text())["data"] for f in sorted(dumps[name].rglob("dump.json"))]
        assert len(entries) == sum(len(d) for d in data) and {e.step for e in entries} == {0, 1}, name
    mix = read_dump(dumps["mix"])
    [mul] = [e for e in mix if e.name == "Tensor.__mul__.0.forward"]
    assert (mul.step, mul.module, mul.kind) == (1, "planted", "Tensor")
    [linear] = [e for e in read_dump(dumps["l0"]) if e.name == "Module.first.Linear.forward.0" and e.step == 0]
    assert (linear.kind, linear.api, linear.module, sorted(linear.parameters)) == ("Module", "Linear", "first",
                                                                                   ["bias", "weight"])
    md5 = read_dump(dumps["md5"])
    assert md5[0].tensors is None and all("md5" in m for m in md5[0].inputs)
    stats = replay(read_dump(dumps["statistics"]), "atlas-a2")
    assert stats and all(r["status"].startswith("not replayed") for r in stats)


def test_l0_modules_replay_as_their_functions(dumps) -> None:
    """A level-L0 Linear is F.linear of its input and dumped parameters: the same device result
    as the level-L1 dump's Functional.linear of the same tensors."""
    l0 = {(r["step"], r["api"]): r for r in replay(read_dump(dumps["l0"]), "atlas-a2") if r["status"] == "compared"}
    l1 = {(r["step"], r["api"]): r for r in replay(read_dump(dumps["native"]), "atlas-a2")
          if r["status"] == "compared"}
    assert l0[0, "Module.first.Linear.forward.0"]["max_ulp"] == l1[0, "Functional.linear.0.forward"]["max_ulp"]
    assert l0[0, "Module.act.ReLU.forward.0"]["identical"]
    skipped = [r for r in replay(read_dump(dumps["l0"]), "atlas-a2") if r["api"].startswith("Module.planted.Planted.f")]
    assert skipped and all("module Planted: its settings are not in the dump" in r["status"] for r in skipped)


@pytest.mark.filterwarnings("ignore:atlas-a2. saturation mode is kept")
def test_our_comparisons_are_msprobes(dumps, tmp_path) -> None:
    """msprobe's compare of the simulated run (target) against the native one (bench), step by
    step: for every tensor it gives a number, the same number from lossscale.msprobe.metrics of the
    same two dumped tensors (the cosine and Euclidean distance within an ulp of their sums' order);
    and the replay of the native dump on atlas-a2 gives, for its first call (whose inputs the two
    runs share), msprobe's numbers for the simulated run's output."""
    for step in (0, 1):
        rows = _msprobe_compare(dumps["saturation"] / f"step{step}", dumps["native"] / f"step{step}",
                                tmp_path / f"step{step}")
        outputs = [r for r in rows if ".output." in r["NPU Name"]]
        assert len(outputs) >= 10
        for r in outputs:
            held = [d / f"step{step}" / "rank0" / "dump_tensor_data" / f"{name}.pt"
                    for d, name in ((dumps["saturation"], r["NPU Name"]), (dumps["native"], r["Bench Name"]))]
            if not all(f.exists() for f in held):  # a None gradient: no tensor, no number
                assert all(_number(r[c]) is None for c in METRICS.values()), r["NPU Name"]
                continue
            ours = metrics(_tensor(dumps["saturation"], step, r["NPU Name"]).detach().numpy(),
                           _tensor(dumps["native"], step, r["Bench Name"]).detach().numpy())
            for key, column in METRICS.items():
                theirs = _number(r[column])
                assert (ours[key] is None) == (theirs is None), (r["NPU Name"], key, ours[key], r[column])
                if theirs is not None:
                    assert ours[key] == pytest.approx(theirs, rel=1e-12, abs=1e-12), (r["NPU Name"], key)
    [first] = [r for r in replay(read_dump(dumps["native"]), "atlas-a2", "saturation")
               if r["tensor"] == "Functional.linear.0.forward.output.0" and r["step"] == 0]
    again = _msprobe_compare(dumps["saturation"] / "step0", dumps["native"] / "step0", tmp_path / "again")
    [theirs] = [r for r in again if r["NPU Name"] == "Functional.linear.0.forward.output.0"]
    assert first["max_abs_err"] == float(theirs["MaxAbsErr"]) > 0  # the device's matmul, then its bias
    assert first["one_thousandth_err_ratio"] == float(theirs["One Thousandth Err Ratio"])


@pytest.mark.filterwarnings("ignore:atlas-a2. saturation mode is kept")
def test_a_simulated_dump_is_what_the_device_predicts(dumps, tmp_path) -> None:
    """msprobe's compare reads the simulated dumps without error and reports what the device's
    semantics say: in saturation mode the planted 80000 is 65504 where the CPU has +Inf (no metric:
    the Inf is not at the same place), in INF/NaN mode +Inf as the CPU's (the same place: zeroed,
    equal). And every call of a simulated dump, re-executed on the same device from its own
    tensors, gives its output again bit for bit: the dump is the device's."""
    sat = {r["NPU Name"]: r for r in _msprobe_compare(dumps["saturation"] / "step1", dumps["native"] / "step1",
                                                       tmp_path / "sat")}
    planted = sat["Tensor.__mul__.0.forward.output.0"]
    assert (float(planted["NPU max"]), float(planted["Bench max"])) == (65504.0, np.inf)
    assert _number(planted["Cosine"]) is None
    inf = {r["NPU Name"]: r for r in _msprobe_compare(dumps["inf_nan"] / "step1", dumps["native"] / "step1",
                                                       tmp_path / "inf")}
    planted = inf["Tensor.__mul__.0.forward.output.0"]
    assert float(planted["NPU max"]) == np.inf and float(planted["MaxAbsErr"]) == 0.0
    for mode in ("saturation", "inf_nan"):
        rows = [r for r in replay(read_dump(dumps[mode]), "atlas-a2", mode) if r["status"] == "compared"]
        forward = [r for r in rows if ".forward." in r["tensor"]]
        assert len(forward) >= 12 and all(r["identical"] for r in forward), [
            r["tensor"] for r in forward if not r["identical"]]


def test_msprobe_leaves_the_register_to_the_model(dumps) -> None:
    """With msprobe collecting on the host, the device's register and its routed operations are
    those of the model alone: the same as a run with no debugger at all."""
    import msprobe_dumps  # tests/ is on the path (conftest.py)
    import torch

    from sim import Device
    from sim.torch import DeviceMode
    torch.manual_seed(0)
    model = msprobe_dumps.Model("overflow").half()
    device = Device("atlas-a2", "inf_nan")
    with DeviceMode(device) as mode:
        msprobe_dumps.train(model)
    seen = json.loads((dumps["inf_nan"] / "device.json").read_text())
    assert seen == {"status": int(device.status), "routes": sum(mode.routes.values())}


@pytest.mark.filterwarnings("ignore:atlas-a2. saturation mode is kept")
def test_the_verdict_names_the_planted_call_its_step_and_module(dumps) -> None:
    """The planted overflow (40000 * 2) and the planted NaN (the square root of -1, carried on by
    the addition, the linear layer, the loss and the gradients after it) are each the first
    producer at step 1 in module "planted", reproduced by every product in each of its modes; a
    run with nothing planted has none."""
    for name, api in (("mix", "Tensor.__mul__.0.forward"), ("nan", "Torch.sqrt.0.forward")):
        [row] = verdict(read_dump(dumps[name]))
        assert (row["step"], row["api"], row["module"]) == (1, api, "planted"), name
        assert row["source"].endswith("msprobe_dumps.py:" + str(_line("return h + torch.sqrt" if name == "nan"
                                                                      else "return h + torch.full_like")))
        assert row["carried_by"] >= 3
        products = {k: v for k, v in row.items() if "/" in k}
        assert products and all(products.values()), products
    assert verdict(read_dump(dumps["none"])) == []


def _line(text: str) -> int:
    lines = (ROOT / "tests" / "msprobe_dumps.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_statistics_dumps_against_the_devices_are_msprobes(dumps, tmp_path) -> None:
    """A statistics-only dump set against the device's statistics dump of the same script: every
    difference and relative difference msprobe's compare gives a number, ours gives the same; the
    planted overflow's output is 65504 on the device where the CPU has +Inf."""
    ours_all = statistics(read_dump(dumps["stat_native"]), read_dump(dumps["stat_device"]))
    checked = 0
    for step in (0, 1):
        rows = _msprobe_compare(dumps["stat_device"] / f"step{step}", dumps["stat_native"] / f"step{step}",
                                tmp_path / f"step{step}")
        ours = {r["tensor"]: r for r in ours_all if r["step"] == step}
        for r in rows:
            if r["NPU Name"] not in ours:
                continue
            mine = ours[r["NPU Name"]]
            for stat, (_, diff, rel) in STATISTICS.items():
                for value, column in ((mine[f"{stat}_diff"], diff), (mine[f"{stat}_rel_percent"], rel)):
                    theirs = _number(r[column].strip().removesuffix("%"))
                    assert (value is None) == (theirs is None), (r["NPU Name"], column, r[column], value)
                    if theirs is not None:
                        assert value == pytest.approx(theirs, rel=1e-12), (r["NPU Name"], column)
                        checked += 1
    assert checked >= 100
    [planted] = [r for r in ours_all if r["tensor"] == "Tensor.__mul__.0.forward.output.0"]
    assert (planted["device_max"], planted["dumped_max"]) == (65504.0, np.inf)
