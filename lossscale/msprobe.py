"""``lossscale.msprobe``: Ascend's precision-debugger dumps (msprobe, PyPI ``mindstudio-probe``) read
back and their APIs re-executed on a simulated device: :func:`read_dump`, :func:`replay`,
:func:`compare`, :func:`verdict` (the first producer of a non-finite value, and where the device
reproduces it) (``lossscale.app.msprobe`` says how; ``lossscale msprobe DUMP`` on the command line).
"""

from .app.msprobe import COLUMNS, Entry, compare, read_dump, replay, verdict

__all__ = ["read_dump", "replay", "compare", "verdict", "Entry", "COLUMNS"]
