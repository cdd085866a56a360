"""``lossscale.torch.GradScaler``: ``torch.amp.GradScaler``'s interface on a simulated Atlas
device (optional extra ``torch``), so that a torch AMP loop run under ``sim.torch.DeviceMode``
changes one line::

    scaler = lossscale.torch.GradScaler(dev)        # was: torch.amp.GradScaler("cpu")

The device's register decides as torch_npu's scaler does (or as a named detector does), any
loss-scale policy updates the scale, and :meth:`GradScaler.write_run` writes the recorded steps
as a run folder (``lossscale plot DIR`` draws it, ``lossscale.load_run(DIR)`` reads it).
The scaler itself is :class:`lossscale.training.grad_scaler.GradScaler`; this module adds the
run folder, which is the app layer's.
"""

from __future__ import annotations

from pathlib import Path

from .training.grad_scaler import GradScaler as _GradScaler

__all__ = ["GradScaler"]


class GradScaler(_GradScaler):
    __doc__ = _GradScaler.__doc__

    def write_run(self, out: str | Path, plot: bool = True, fmt: str = "png") -> list[Path]:
        """Write the recorded steps into the run folder ``out`` (``trajectory.csv``,
        ``summary.json``, with ``plot`` ``scale.png`` in ``fmt``); the paths written."""
        from .app.files import check_path, write_run

        return write_run(self.run(), check_path(Path(out)), plot=plot, fmt=fmt)
