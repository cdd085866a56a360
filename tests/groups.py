"""The test groups beside the default run (registered in pyproject.toml, run by .ci/run).

``slow`` holds the heavier repeats of what the default run already checks: the same oracle over
more rounding modes, formats or workloads, where the default run keeps a representative case.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest


def representatives(values: Iterable[Any], keep: Callable[[Any], bool], ids: Callable[[Any], str] | None = None
                    ) -> list[Any]:
    """``values`` as pytest parameters, those for which ``keep`` is false marked ``slow``: the default run
    tests the kept ones, ``pytest -m slow`` the rest, so the two runs together cover every value."""
    return [pytest.param(v, id=ids(v) if ids else None, marks=() if keep(v) else pytest.mark.slow) for v in values]
