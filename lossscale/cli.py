"""``lossscale.cli`` is :mod:`lossscale.app.cli` (the path kept for existing code and for the
``lossscale`` scripts that earlier installs wrote)."""

import sys

from .app import cli as _module

sys.modules[__name__] = _module
