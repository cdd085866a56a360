"""The Python examples of the README and of the docs pages run as written (one namespace, the
README first, then the pages in the order below), and print or hold what their comments say."""

from __future__ import annotations

import importlib.util
import re

import numpy as np
from paths import ROOT  # tests/ is on the path (conftest.py)

from lossscale.app.results import load_run as lossscale_load

README = ROOT / "README.md"
#: The pages with examples, in the order they run (a page's example may use an earlier one's names:
#: devicemode's TorchWorkload trains scalers' Halving).
PAGES = [README, *(ROOT / "docs" / name for name in ("devices.md", "formats.md", "scalers.md", "devicemode.md",
                                                       "files.md"))]


def test_readme_python_examples_run(capsys) -> None:
    blocks = [(page, block) for page in PAGES for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)]
    assert len(blocks) >= 8
    ns: dict = {}
    for page, block in blocks:
        if "import torch" in block and importlib.util.find_spec("torch") is None:
            continue  # the optional extra; CI installs it
        if "to_pandas()" in block and importlib.util.find_spec("pandas") is None:
            continue
        if "PrecisionDebugger" in block:  # msprobe wraps torch's APIs for the whole process: its example runs in
            continue  # processes of its own (tests/msprobe_dumps.py, test_msprobe_live.py)
        capsys.readouterr()
        exec(compile(block, str(page), "exec"), ns)  # noqa: S102
        out = capsys.readouterr().out
        if "fpu.status" in block:  # the emulator's first example
            assert ns["y"].tolist() == [65504.0] and ns["dev"].get_float_status().tolist() == [1, 0, 0, 1, 0, 0, 0, 0]
            assert ns["z"].tolist() == [65504.0, 1.0, 4.0]
            assert ns["flags"].tolist() == [int(ns["Flag"].OVERFLOW | ns["Flag"].INEXACT), 0, 0]
            assert ns["fpu"].status == ns["Flag"].OVERFLOW | ns["Flag"].INEXACT
        if "simulate(workload=Mlp" in block:
            assert ns["run"].summary["steps_run"] == 200
            skipped, undetected, final = out.split(" ", 2)
            assert int(undetected) == 0 and "accuracy" in final
        if "TorchWorkload(model" in block:  # your model, your policy: the register misses nothing
            s = ns["run"].summary
            assert s["steps_run"] == 100 and s["undetected_overflow_steps"] == 0 and s["skipped_steps"] > 0
            assert out.split(" ", 2)[:2] == [str(s["skipped_steps"]), "0"] and s["top_labels"]
        if "matmul_fp8" not in block and "hif8 = " in block:  # the 8-bit casts, as their comments say
            nan = float("nan")
            assert np.array_equal(ns["e4m3"].astype(float), [1, 288, nan, nan], equal_nan=True)
            assert ns["sat"].astype(float).tolist() == [1, 288, 448, 0]
            assert np.array_equal(ns["formats"].decode(ns["hif8"], "hifloat8"), [1, 256, 1024, nan], equal_nan=True)
            assert ns["q"].scales.shape == (4, 2)
        if "load_run(folder)" in block:  # the run's first row and summary, read back from its files
            register, skipped = out.splitlines()[-2:]
            assert register == "(1, 1, 0, 4, 0, 0, 0, 0)" and ns["run"].rows[0].register == (1, 1, 0, 4, 0, 0, 0, 0)
            assert int(skipped) == sum(not r.applied for r in ns["run"].rows) > 0
            assert list(ns["frame"].columns)[:2] == ["step", "loss_scale"] and len(ns["frame"]) == 20
        if "GradScaler(dev" in block:  # the one-line change: the register skips saturated steps
            rows = ns["scaler"].rows
            assert out.strip() == f"{[r.applied for r in rows][:3]} {ns['scaler'].get_scale()}"
            assert 0 < sum(not r.applied for r in rows) < len(rows) and all(
                p.grad.isfinite().all() for p in ns["model"].parameters())
            assert lossscale_load(ns["folder"]).summary.skipped_steps == sum(not r.applied for r in rows)
        elif "sim.torch_npu" in block:  # torch_npu's check read the register, and cleared it
            assert not ns["dev"].get_float_status().any()
        elif "DeviceMode" in block:
            assert out.strip() == "[1 0 0 5 0 0 0 0]"
            assert all(p.grad.isfinite().all() for p in ns["model"].parameters())
