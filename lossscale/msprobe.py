"""``lossscale.msprobe``: Ascend's precision-debugger dumps (msprobe, PyPI ``mindstudio-probe``) read
back and their APIs re-executed on a simulated device: :func:`read_dump`, :func:`replay`,
:func:`compare`, :func:`verdict` (the first producer of a non-finite value, and where the device
reproduces it); :func:`collected_on_host`, to dump a simulated run with msprobe itself, and
:func:`statistics`, a statistics-only dump set against the device's
(``lossscale.app.msprobe`` says how; ``lossscale msprobe DUMP`` on the command line).
"""

from .app.msprobe.dump import Entry, read_dump
from .app.msprobe.host import collected_on_host
from .app.msprobe.metrics import METRICS, metrics
from .app.msprobe.replay import COLUMNS, MODULES, compare, replay
from .app.msprobe.statistics import STATISTICS, statistics
from .app.msprobe.verdict import verdict

__all__ = ["read_dump", "replay", "compare", "verdict", "Entry", "COLUMNS", "METRICS", "MODULES", "metrics",
           "collected_on_host", "statistics",
           "STATISTICS"]
