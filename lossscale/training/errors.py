"""The errors a simulation's own checks raise during a step (a manager's loss scale, a pipeline's
stage tags): errors in the run's settings, raised as they are, where an error from the workload's
code stops the run and keeps its finished steps (``simulate.StepFailed``)."""

from __future__ import annotations

__all__ = ["SettingError", "SettingValueError", "SettingTypeError"]


class SettingError(Exception):
    """A check of the run's settings failed during a step."""


class SettingValueError(SettingError, ValueError):
    """A setting's value is wrong (found during a step)."""


class SettingTypeError(SettingError, TypeError):
    """A setting's type is wrong (found during a step)."""
