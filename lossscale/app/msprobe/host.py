"""msprobe's own debugger dumping a simulated run: its collection kept off the device."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Iterator
from contextlib import contextmanager

__all__: list[str] = []  # public as lossscale.msprobe's


@contextmanager
def collected_on_host() -> Iterator[None]:
    """msprobe's ``PrecisionDebugger`` dumping a run under :class:`sim.torch.DeviceMode`: its data
    collection (the statistics, the copies of the tensors it records, its files) runs on the host,
    so the dump holds the device's results of the model's APIs, as a card's dump holds the card's,
    and the device's register sees the model's operations alone (without this, msprobe's own
    ``max``, ``mean`` and ``norm`` of the tensors it records would run on the device, and a norm of
    saturated values would raise an event of its own). The dump is msprobe's own, in its layout and
    names: ``msprobe compare`` diffs it against a card's dump of the same script. Needs msprobe (the
    ``msprobe`` extra; mindstudio-probe 26.2, once imported, leaves tensorflow's ``tf.Variable``
    broken in that process: keep TensorFlow out of a script dumped this way)."""
    from msprobe.core.dump.data_dump.data_collector import DataCollector

    from sim.torch import on_host
    originals = {name: fn for name, fn in vars(DataCollector).items()
                 if inspect.isfunction(fn) and re.search(r"collect|write_json|handle_data", name)}

    def hosted(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with on_host():
                return fn(*args, **kwargs)
        return run
    for name, fn in originals.items():
        setattr(DataCollector, name, hosted(fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(DataCollector, name, fn)
