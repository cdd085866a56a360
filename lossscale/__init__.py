"""Loss scaling as the frameworks do it, exactly: the Ascend NPU managers and
optimizer, the other frameworks' dynamic loss scalers, and plain optimizers.

Three layers, each using only those above it (``tests/test_layers.py`` checks):

- core: ``policy`` (the protocol: a policy is a frozen value with a pure
  ``next``; ``Manager`` is its stateful face), ``managers`` (the Ascend ones),
  ``policies`` (the other frameworks'), ``optimizers``, ``detectors`` (each
  framework's overflow check: where in the step it clears and reads the register),
  ``fp8`` (the FP8 scaling recipes, per-tensor policies of the same kind, and the hook
  that runs a device's matmuls in FP8);
- training: ``simulate``, ``workloads`` (built in, and the ``Workload``
  protocol for your own), ``torch_workloads``, ``jax_workloads``;
- application: ``cli``, ``files``, ``plots``, ``sweep``, ``testing`` (the
  property kit).
"""

__version__ = "0.1.0"

from . import policies  # noqa: E402
from .managers import ExponentialUpdateLossScaleManager, FixedLossScaleManager
from .optimizers import SGD, Adam, LossScaleOptimizer, Momentum, NPULossScaleOptimizer
from .policy import Manager, Policy, PolicyManager, trajectory

__all__ = [
    "FixedLossScaleManager", "ExponentialUpdateLossScaleManager", "LossScaleOptimizer", "NPULossScaleOptimizer",
    "SGD", "Momentum", "Adam", "Manager", "Policy", "PolicyManager", "trajectory", "policies",
]
