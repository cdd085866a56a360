"""``lossscale.simulate`` is :mod:`lossscale.training.simulate` (the path kept for existing code)."""

import sys

from .training import simulate as _module

sys.modules[__name__] = _module
