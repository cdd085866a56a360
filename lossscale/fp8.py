"""``lossscale.fp8`` is :mod:`lossscale.training.fp8` (the path kept for existing code)."""

import sys

from .training import fp8 as _module

sys.modules[__name__] = _module
