"""Loss-scale policies: the protocol (a frozen value with a pure ``next``, and ``Manager``, its
stateful face, with ``state_dict``/``load_state_dict`` checkpoints), the registry of named
policies, ``manager_class`` (which makes each manager class from its policy), the Ascend managers
(``ascend``) and the other frameworks' dynamic loss scalers (``frameworks``).

The bottom layer of ``lossscale``: it imports nothing else of the package.
"""

from . import ascend, frameworks
from .core import *  # noqa: F403
from .core import __all__ as _core

__all__ = [*_core, "ascend", "frameworks"]
