"""Loss scaling as the frameworks do it, exactly: the Ascend NPU managers and
optimizer, the other frameworks' dynamic loss scalers, and plain optimizers.

Three layers, as subpackages, each importing only those below it (``tests/test_layers.py``
checks, and that nothing imports in a circle):

- ``policy``: the protocol (a policy is a frozen value with a pure ``next``; ``Manager`` is
  its stateful face), the registry, the Ascend managers (``policy.ascend``) and the other
  frameworks' scalers (``policy.frameworks``);
- ``training``: ``simulate`` (the step loop), ``workloads`` (built in, torch, JAX, and the
  ``Workload`` protocol for your own), ``detectors`` (each framework's overflow check: where
  in the step it clears and reads the register), ``optimizers``, ``fp8`` (the FP8 and block
  scaling recipes and the substitute that runs a device's matmuls in them), ``operands`` (each
  matmul's GEMM, and the figures of a quantised operand), ``shadow`` (alternatives computed on the
  run's operands), ``phases`` (``PHASES`` and
  ``begin_phase``: the step's phases as the device's context tags);
- ``app``: ``cli``, ``files``, ``plots``, ``sweep``, ``results`` (``load_run``: an output
  folder back as typed values, exported here and imported on first use).

``replay`` stands beside ``training`` on ``policy``: it reads training logs and replays
loss-scale policies on them, and trains nothing. ``testing`` (the property kit) stands beside
them on ``policy`` and ``training``.

Each public name has one import path: the names users start from are here (``simulate``,
``RunConfig``, the Ascend managers and optimizers, the policy protocol, ``load_run``); the others
are in the ``__all__`` of the one module that holds them (``lossscale.policy.frameworks`` for the
other frameworks' scalers, ``lossscale.training.workloads``, ``lossscale.replay``...).
"""

from .policy.ascend import ExponentialUpdateLossScaleManager, FixedLossScaleManager
from .policy.core import Manager, Policy, PolicyManager, trajectory
from .training.config import RunConfig
from .training.optimizers import SGD, Adam, LossScaleOptimizer, Momentum, NPULossScaleOptimizer
from .training.phases import PHASES, begin_phase
from .training.simulate import simulate
from .version import __version__

__all__ = [
    "simulate", "RunConfig", "load_run",
    "FixedLossScaleManager", "ExponentialUpdateLossScaleManager", "LossScaleOptimizer", "NPULossScaleOptimizer",
    "SGD", "Momentum", "Adam", "Manager", "Policy", "PolicyManager", "trajectory", "__version__",
    "PHASES", "begin_phase",
]


def __getattr__(name: str):
    """``load_run`` on first use: the app layer (file reading) loads only when asked for."""
    if name == "load_run":
        from .app.results import load_run

        return load_run
    raise AttributeError(f"module 'lossscale' has no attribute {name!r}")
