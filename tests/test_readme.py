"""The README's Python examples run as written (one namespace, in order)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_examples_run(capsys) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102
    ns = namespace
    # What the comments of the first example say.
    assert ns["y"].tolist() == [65504.0] and ns["dev"].get_float_status().tolist() == [1, 0, 0, 1, 0, 0, 0, 0]
    assert ns["z"].tolist() == [65504.0, 1.0, 4.0]
    assert ns["flags"].tolist() == [int(ns["Flag"].OVERFLOW | ns["Flag"].INEXACT), 0, 0]
    assert ns["fpu"].status == ns["Flag"].OVERFLOW | ns["Flag"].INEXACT
    assert ns["run"].summary["steps_run"] == 200
    skipped, undetected, final = capsys.readouterr().out.split(" ", 2)
    assert int(undetected) == 0 and "accuracy" in final
