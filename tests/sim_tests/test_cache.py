"""Numba's cache checks a loop's own file only: the compiled files' caches are dropped together
when any of their sources changes, so an edit to a helper one loop inlines from another file is
never run as its stale compile."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from paths import ROOT  # tests/ is on the path (conftest.py)

from sim import kernels as K

SIM = ROOT / "sim"


def _copy(tmp_path: Path) -> Path:
    """The compiled files copied to a scratch package, each with a cached loop, and a cache of a
    file that is not compiled here."""
    for name in K.COMPILED:
        f = tmp_path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SIM / name, f)
        (f.parent / "__pycache__").mkdir(exist_ok=True)
        (f.parent / "__pycache__" / f"{f.stem}.loop-10.py311.nbi").write_text("index")
        (f.parent / "__pycache__" / f"{f.stem}.loop-10.py311.1.nbc").write_text("code")
    (tmp_path / "__pycache__" / "other.loop-1.py311.nbi").write_text("someone else's")
    return tmp_path


def _cached(root: Path) -> set[str]:
    return {p.name for p in root.rglob("*.nb[ci]")}


def test_an_edit_to_any_compiled_file_drops_every_compiled_cache(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    K._drop_stale_caches(root)  # no stamp yet: nothing says these caches match the sources
    assert _cached(root) == {"other.loop-1.py311.nbi"}
    stamp = (root / "__pycache__" / "compiled.sha256").read_text()
    (root / "__pycache__" / "kernels.loop-10.py311.nbi").write_text("index")
    (root / "elementary" / "__pycache__" / "pairs.loop-10.py311.nbi").write_text("index")
    K._drop_stale_caches(root)  # the same sources: the caches stand
    assert _cached(root) == {"other.loop-1.py311.nbi", "kernels.loop-10.py311.nbi", "pairs.loop-10.py311.nbi"}
    kernels = root / "kernels.py"
    kernels.write_text(kernels.read_text() + "\n# an edit to a helper pairs.py inlines\n")
    K._drop_stale_caches(root)
    assert _cached(root) == {"other.loop-1.py311.nbi"}
    assert (root / "__pycache__" / "compiled.sha256").read_text() != stamp


def test_every_file_with_compiled_loops_is_listed() -> None:
    uses = {p.relative_to(SIM).as_posix() for p in SIM.rglob("*.py")
            if re.search(r"^@(K\.)?(jit|inline)\b", p.read_text(), re.M)}
    assert uses == set(K.COMPILED)
