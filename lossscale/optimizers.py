"""``lossscale.optimizers`` is :mod:`lossscale.training.optimizers` (the path kept for existing code)."""

import sys

from .training import optimizers as _module

sys.modules[__name__] = _module
