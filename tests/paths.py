"""Where the tests find the repository and their data, wherever in ``tests/`` a test file sits."""

from pathlib import Path

#: The repository's root.
ROOT = Path(__file__).resolve().parent.parent
#: The tests' data files (``tests/data``).
DATA = ROOT / "tests" / "data"
