"""Loss-scale policies: the protocol (a frozen value with a pure ``next``, and ``Manager``, its
stateful face, with ``state_dict``/``load_state_dict`` checkpoints), the registry of named
policies, ``manager_class`` (which makes each manager class from its policy), the Ascend managers
(``ascend``) and the other frameworks' dynamic loss scalers (``frameworks``).

The bottom layer of ``lossscale``: it imports nothing else of the package.
"""

from . import ascend, frameworks
from .core import (
    MANAGERS,
    REQUIRED,
    check_scale,
    describe,
    f32,
    manager_class,
    missing_scaler_methods,
    register,
)

# Policy, Manager, PolicyManager and trajectory: public as lossscale's (one import path each).
__all__ = ["MANAGERS", "REQUIRED", "manager_class", "register", "describe", "check_scale", "f32",
           "missing_scaler_methods", "ascend", "frameworks"]
