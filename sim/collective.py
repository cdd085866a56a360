"""A simulated interconnect: collective operations over several devices in one process.

Ranks run one after another in the simulator, so a collective cannot wait for
its peers. ``allreduce_float_status`` therefore takes a snapshot of every
device's register when the first rank of a round arrives and hands the same sum
to the others: every rank must have finished the work whose events it reports
before the first rank asks (as a real all-reduce would enforce by waiting).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .device.core import Device

__all__: list[str] = []  # Group's one public path is sim.Group


class Group:
    """Devices that act as the ranks of one data-parallel job (rank = position)."""

    def __init__(self, devices: Sequence[Device]) -> None:
        devices = list(devices)
        if not devices or not all(isinstance(d, Device) for d in devices):
            raise ValueError("Group needs a non-empty sequence of sim.Device objects")
        if len({id(d) for d in devices}) != len(devices):
            raise ValueError("Group: each device can be one rank only")
        self.devices = devices
        self._round = [0] * len(devices)
        self._snapshots: dict[int, np.ndarray] = {}
        for rank, dev in enumerate(devices):
            dev.join(self, rank)

    def __len__(self) -> int:
        return len(self.devices)

    def rank_of(self, device: Device) -> int:
        for rank, dev in enumerate(self.devices):
            if dev is device:
                return rank
        raise ValueError(f"{device!r} is not a rank of this group")

    def allreduce_float_status(self, device: Device) -> np.ndarray:
        """The sum over ranks of the float-status registers (int32[8], saturating)."""
        rank = self.rank_of(device)
        r = self._round[rank]
        self._round[rank] += 1
        if r not in self._snapshots:
            total = np.sum([d.get_float_status().astype(np.int64) for d in self.devices], axis=0)
            self._snapshots[r] = np.minimum(total, np.iinfo(np.int32).max).astype(np.int32)
        result = self._snapshots[r].copy()
        if min(self._round) > r:
            del self._snapshots[r]
        return result

    def allreduce(self, tensors: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Sum one tensor per rank, in rank order, on every device (each in its own
        mode, recording its own events); returns each rank's copy of the sum."""
        if len(tensors) != len(self.devices):
            raise ValueError(f"allreduce needs one tensor per rank ({len(self.devices)}), got {len(tensors)}")
        results = []
        for dev in self.devices:
            total = tensors[0]
            for t in tensors[1:]:
                total = dev.add(total, t)
            results.append(total)
        return results
