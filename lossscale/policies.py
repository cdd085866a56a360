"""``lossscale.policies`` is :mod:`lossscale.policy.frameworks` (the path kept for existing code)."""

import sys

from .policy import frameworks as _module

sys.modules[__name__] = _module
