"""The op table (sim/ops.py) drives Fpu's and Device's methods and the bridges' routes; the
device computes through the unit's documented interface, not its private names."""

from __future__ import annotations

import ast
import inspect

import numpy as np
import pytest
from paths import ROOT  # tests/ is on the path (conftest.py)

from sim import Device, Fpu, ops


@pytest.mark.parametrize("op", [op for op in ops.OPS if op.kind != ops.OTHER and op.elementwise], ids=lambda o: o.name)
def test_every_elementwise_op_has_its_methods_with_their_signatures(op: ops.Op) -> None:
    operands = list("abc"[:op.arity])
    if op.fpu:
        method = getattr(Fpu, op.name)
        params = list(inspect.signature(method).parameters)
        flags = ["signaling"] if op.kind == ops.COMPARE else []
        assert params == ["self", *operands, *flags, "return_flags"]
        assert method.__qualname__ == f"Fpu.{op.name}" and op.doc in method.__doc__
    if op.device:
        method = getattr(Device, op.name)
        assert list(inspect.signature(method).parameters) == ["self", *operands]
        assert method.__qualname__ == f"Device.{op.name}" and method.__doc__ == op.doc


def test_the_bridges_routes_come_from_the_table() -> None:
    torch = pytest.importorskip("sim.torch")
    jax = pytest.importorskip("sim.jax")
    packets = {p for op in ops.OPS if op.device for p in op.aten}
    assert {packet.__name__.split(".")[-1] for packet in torch.ROUTES} == packets
    assert set(jax.DEVICE) == {p for op in ops.OPS if op.device for p in op.jax}


def test_the_device_uses_no_private_name_of_another_module() -> None:
    """sim/device/ reaches the rest of sim through public names only (its own files share theirs)."""
    private = set()
    for path in sorted((ROOT / "sim" / "device").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level != 1:  # level 1: a file of the device
                private |= {a.name for a in node.names if a.name.startswith("_")}
            elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                  and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "K", "np"))):
                private.add(node.attr)
    assert private <= {"_label"}, private  # _Label, a class of the register's, keeps the device's label


def test_reciprocal_on_the_device_reaches_the_register() -> None:
    dev = Device("atlas-a2")
    out = dev.reciprocal(np.array([2.0, -0.0, 4.0], np.float16))
    assert out.tolist() == [0.5, -np.inf, 0.25] and dev.get_float_status()[2] == 1
    assert Fpu().reciprocal(np.float16(3.0), return_flags=True)[1] == 1  # INEXACT


def test_each_aten_packet_is_declared_once() -> None:
    """A packet is the table's (a device route) or a fused family's (sim.fused), never both."""
    from sim import fused
    table = [p for op in ops.OPS for p in op.aten]
    families = [p for f in fused.FAMILIES for p in f.aten]
    assert len(table) == len(set(table)) and len(families) == len(set(families))
    assert not set(table) & set(families)
