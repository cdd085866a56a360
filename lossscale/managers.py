"""``lossscale.managers`` is :mod:`lossscale.policy.ascend` (the path kept for existing code)."""

import sys

from .policy import ascend as _module

sys.modules[__name__] = _module
