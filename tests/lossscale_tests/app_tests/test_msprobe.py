"""msprobe dumps in: a dump msprobe itself made (tests/data/make_msprobe_dump.py) read back, its
forward APIs re-executed on a device and compared with what was dumped."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from paths import DATA

from lossscale.app.cli import main
from lossscale.msprobe import METRICS, compare, read_dump, replay

DUMP = DATA / "msprobe_dump"


def test_every_api_of_every_step_is_read() -> None:
    entries = read_dump(DUMP)
    assert len(entries) == 23 and {e.step for e in entries} == {0, 1} and {e.rank for e in entries} == {0}
    first = entries[0]
    assert (first.name, first.kind, first.api, first.direction) == (
        "Functional.linear.0.forward", "Functional", "linear", "forward")
    assert [m["shape"] for m in first.inputs] == [[4, 8], [16, 8], [16]] and first.outputs[0]["shape"] == [4, 16]
    assert first.source.endswith("make_msprobe_dump.py:36")  # model(x): the user's line, not torch's
    assert first.tensors is not None and (first.tensors / first.inputs[0]["data_name"]).exists()
    backward = [e for e in entries if e.direction == "backward"]
    assert len(backward) == 11 and all(e.inputs for e in backward)
    assert [e.name for e in entries if e.step == 1 and "__mul__" in e.name] == ["Tensor.__mul__.0.forward"]


def test_a_folder_that_is_not_a_dump_is_named(tmp_path) -> None:
    with pytest.raises(ValueError, match="holds no dump.json: not an msprobe dump"):
        read_dump(tmp_path)
    (tmp_path / "dump.json").write_text("{}")
    with pytest.raises(ValueError, match="is not an msprobe dump.json"):
        read_dump(tmp_path / "dump.json")


def test_the_comparison_hand_worked() -> None:
    """msprobe's metrics as its compare defines them (msprobe 26.2 ``core/compare``): relative
    errors in binary32 with its epsilon added where the bench is 0, the shares *below* 1e-3 and
    5e-3, Inf/NaN at the same places zeroed and at different places no metric at all."""
    h = np.float16
    same = np.array([1.0, -2.0, 0.0], h)
    assert compare(same, same.copy()) == {
        "identical": True, "max_ulp": 0, "cosine": 1.0, "euc_dist": 0.0, "max_abs_err": 0.0, "max_rel_err": 0.0,
        "one_thousandth_err_ratio": 1.0, "five_thousandths_err_ratio": 1.0}
    got = np.array([1.0, np.nextafter(h(-2.0), h(0)), 0.0], h)  # -2 moved 1 ulp toward 0
    want = np.array([1.0, -2.0, -0.0], h)
    c = compare(got, want)
    assert not c["identical"] and c["max_ulp"] == 1  # +0/-0 are 0 apart
    assert c["max_abs_err"] == 2.0**-10 and c["max_rel_err"] == 2.0**-11 and c["euc_dist"] == 2.0**-10
    assert c["one_thousandth_err_ratio"] == 1.0  # 2**-11 < 1e-3
    dot, norm = 1 + 2 * (2 - 2.0**-10), math.sqrt(5 * (1 + (2 - 2.0**-10) ** 2))
    assert c["cosine"] == round(float(f"{dot / norm:.12f}"), 6)
    inf = compare(np.array([np.inf, 1.0], h), np.array([np.inf, 2.0], h))  # Inf at the same place: zeroed
    assert inf["max_abs_err"] == 1.0 and inf["max_rel_err"] == 0.5 and inf["cosine"] == 1.0
    apart = compare(np.array([65504.0, 1.0], h), np.array([np.inf, 1.0], h))  # saturated against Inf
    assert apart["max_ulp"] == 1 and all(apart[k] is None for k in METRICS)
    far = compare(np.array([1.0, 1.0], h), np.array([1.0, 1.5], h))
    assert far["one_thousandth_err_ratio"] == 0.5 and far["max_ulp"] == 512
    assert far["max_rel_err"] == float(f"{float(np.float32(0.5) / np.float32(1.5)):.12f}")
    one = compare(np.array([[1.0]], h), np.array([[2.0]], h))  # squeezed to 0-d: the largest errors alone
    assert (one["max_abs_err"], one["max_rel_err"]) == (1.0, 0.5)
    assert all(one[k] is None for k in METRICS if k not in ("max_abs_err", "max_rel_err"))


@pytest.mark.filterwarnings("ignore:atlas-a2. saturation mode is kept")
def test_forward_apis_run_on_the_device_as_its_own_operations() -> None:
    """A linear layer replayed = the device's matmul of the dumped operands, then its bias added
    (the device's default: two roundings, where torch's CPU kernel rounds once: 4 to 7 ulps
    apart here); the planted overflow (80000) is 65504 with an event in saturation mode, +Inf
    with the same event in INF/NaN mode, bit-identical to the CPU's dump only there."""
    torch = pytest.importorskip("torch")
    from sim import Device
    entries = read_dump(DUMP)
    linear = entries[0]
    x, w, b = (torch.load(linear.tensors / m["data_name"]).numpy() for m in linear.inputs)
    dev = Device("atlas-a2")
    want = dev.add(dev.matmul(x, np.ascontiguousarray(w.T)), b)
    sat, inf = (replay(entries, "atlas-a2", mode) for mode in ("saturation", "inf_nan"))
    row = sat[0]
    dumped = torch.load(linear.tensors / linear.outputs[0]["data_name"]).numpy()
    assert row["status"] == "compared" and row == {**row, **compare(want, dumped)}
    assert row["tensor"] == "Functional.linear.0.forward.output.0"
    assert 4 <= row["max_ulp"] <= 7 and not row["identical"]
    [mul] = [r for r in sat if r["api"] == "Tensor.__mul__.0.forward"]
    assert (mul["identical"], mul["max_ulp"], mul["events"]) == (False, 1, 1)
    assert mul["register"] == "1 0 0 1 0 0 0 0"
    [mul] = [r for r in inf if r["api"] == "Tensor.__mul__.0.forward"]
    assert (mul["identical"], mul["events"]) == (True, 1)
    assert all(r["status"] == "compared" for r in sat)  # every call of this dump: 11 backward entries too
    assert len(sat) == sum(len([m for m in e.outputs if m]) for e in entries)


def test_a_backward_entry_is_its_autograd_node_on_the_device() -> None:
    """msprobe records a backward call as its autograd node's inputs and outputs, in the node's
    order: linear's addmm node gives (bias, input, weight transposed) gradients, the input's None
    (it needed none). Replayed: the forward re-made from the dumped tensors on the device, the node
    applied to the dumped gradient; each gradient is the device's matmul or sum of the operands."""
    torch = pytest.importorskip("torch")
    from sim import Device
    entries = read_dump(DUMP)
    [back] = [e for e in entries if e.step == 0 and e.name == "Functional.linear.0.backward"]
    assert back.outputs[1] is None and [m["shape"] for m in (back.outputs[0], back.outputs[2])] == [[16], [8, 16]]
    rows = [r for r in replay(entries, "atlas-a2") if r["api"] == back.name and r["step"] == 0]
    assert [r["tensor"] for r in rows] == [f"{back.name}.output.0", f"{back.name}.output.2"]
    [forward] = [e for e in entries if e.step == 0 and e.name == "Functional.linear.0.forward"]
    x = torch.load(forward.tensors / forward.inputs[0]["data_name"]).numpy()
    g = torch.load(back.tensors / back.inputs[0]["data_name"]).numpy()
    dev = Device("atlas-a2")
    weight_grad = dev.matmul(np.ascontiguousarray(x.T), g)  # mat2 = weight.T: its gradient x.T @ g
    dumped = torch.load(back.tensors / back.outputs[2]["data_name"]).numpy()
    assert rows[1] == {**rows[1], **compare(weight_grad, dumped)}


def test_the_command_writes_the_comparison(tmp_path, capsys) -> None:
    pytest.importorskip("torch")
    moved = tmp_path / "dump"
    shutil.copytree(DUMP, moved)  # dump.json names the folder it was made in: the tensors beside it serve
    assert main(["msprobe", str(moved), "--profile", "atlas-a2", "--overflow-mode", "inf_nan",
                 "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    # events: the planted overflow, and step 1's two linear backwards, whose Inf gradients make NaN
    assert (summary["calls"], summary["calls_replayed"], summary["calls_with_events"]) == (23, 23, 3)
    lines = (tmp_path / "out" / "msprobe.csv").read_text().splitlines()
    assert len(lines) == 1 + summary["tensors_compared"] and lines[0].startswith("step,rank,api,tensor,module")
    assert "23 calls, 2 step(s), 1 rank(s); 23 re-executed on atlas-a2" in capsys.readouterr().out


def test_the_first_producer_of_a_non_finite_value_is_named(tmp_path) -> None:
    """Step 1's planted overflow: 40000 * 2 is the first call whose inputs are finite and whose
    output is not (the input's Norm is Inf, its Max and Min are not); the additions, powers, means and
    gradients after it only carry the Inf on. Every product reproduces it: +Inf in INF/NaN mode, a
    register event in saturation mode. Step 0 has none. A call the card alone made overflow (a
    linear layer whose dumped output claims Inf) is named, and no product reproduces it."""
    pytest.importorskip("torch")
    from lossscale.msprobe import verdict
    entries = read_dump(DUMP)
    [row] = verdict(entries)
    assert (row["step"], row["rank"], row["api"]) == (1, 0, "Tensor.__mul__.0.forward")
    assert row["source"].endswith("make_msprobe_dump.py:38") and row["carried_by"] == 7
    pairs = {k: v for k, v in row.items() if "/" in k}
    assert pairs and all(pairs.values()) and {"atlas-a2/inf_nan", "atlas-training/saturation"} <= set(pairs)
    assert "atlas-training/inf_nan" not in pairs  # a product's own modes only
    assert verdict([e for e in entries if e.step == 0]) == []
    import dataclasses
    linear = entries[0]
    claimed = dataclasses.replace(linear, outputs=[{**linear.outputs[0], "Max": float("inf")}])
    [card_only] = verdict([claimed], profiles=["atlas-a2", "atlas-training"])
    assert card_only["api"] == "Functional.linear.0.forward" and card_only["carried_by"] == 0
    assert {k: v for k, v in card_only.items() if "/" in k} == {
        "atlas-a2/inf_nan": False, "atlas-a2/saturation": False, "atlas-training/saturation": False}


def test_several_ranks_are_read_and_judged_apart(tmp_path) -> None:
    """A dump of two ranks (each rank's folder as msprobe writes it): every call of each rank read,
    and the first producer named once per step and rank."""
    pytest.importorskip("torch")
    from lossscale.msprobe import verdict
    for step in ("step0", "step1"):
        for rank in ("rank0", "rank1"):
            shutil.copytree(DUMP / step / "rank0", tmp_path / step / rank)
    entries = read_dump(tmp_path)
    assert len(entries) == 2 * len(read_dump(DUMP)) and {e.rank for e in entries} == {0, 1}
    rows = verdict(entries, profiles=["atlas-a2"])
    assert [(r["step"], r["rank"], r["api"]) for r in rows] == [(1, 0, "Tensor.__mul__.0.forward"),
                                                                 (1, 1, "Tensor.__mul__.0.forward")]
