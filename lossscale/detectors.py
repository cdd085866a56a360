"""``lossscale.detectors`` is :mod:`lossscale.training.detectors` (the path kept for existing code)."""

import sys

from .training import detectors as _module

sys.modules[__name__] = _module
