"""``lossscale.workloads`` is :mod:`lossscale.training.workloads` (the path kept for existing code)."""

import sys

from .training import workloads as _module

sys.modules[__name__] = _module
