"""Loss scaling as the frameworks do it, exactly: the Ascend NPU managers and
optimizer, the other frameworks' dynamic loss scalers, and plain optimizers."""

__version__ = "0.1.0"

from . import policies  # noqa: E402
from .managers import ExponentialUpdateLossScaleManager, FixedLossScaleManager
from .optimizers import SGD, Adam, LossScaleOptimizer, Momentum, NPULossScaleOptimizer
from .policy import Manager, Policy, PolicyManager, trajectory

__all__ = [
    "FixedLossScaleManager", "ExponentialUpdateLossScaleManager", "LossScaleOptimizer", "NPULossScaleOptimizer",
    "SGD", "Momentum", "Adam", "Manager", "Policy", "PolicyManager", "trajectory", "policies",
]
