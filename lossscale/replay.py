"""``lossscale.replay`` is :mod:`lossscale.training.replay` (reading training logs and replaying
loss-scale policies on them)."""

import sys

from .training import replay as _module

sys.modules[__name__] = _module
