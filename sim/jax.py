"""JAX functions on a simulated Atlas device (optional extra ``jax``).

``on_device(fn, device)`` returns a function that traces ``fn`` to its jaxpr
(``jax.make_jaxpr``) and evaluates the jaxpr equation by equation, on numpy
arrays, with the device's operations for float16 and bfloat16 values. Apply it
to what you would run: ``on_device(jax.value_and_grad(loss), dev)(params, x, y)``
evaluates the forward and the backward pass on the device (the jaxpr of a
gradient holds both). Routes, as in :mod:`sim.torch`:

- ``device``: ``add sub mul div max min neg abs exp log tanh logistic sqrt
  rsqrt erf``, comparisons, ``dot_general`` of two binary16 matrices (one
  contraction, no batch dimensions), ``reduce_sum`` (binary32 accumulation,
  one rounding to the operand's dtype), ``reduce_max``/``reduce_min`` and
  ``convert_element_type`` between float dtypes;
- ``exact``: data movement and selection (``broadcast_in_dim reshape transpose
  concatenate select_n slice gather iota ...``), evaluated by JAX itself;
- ``float32``: any other primitive on our dtypes is evaluated by JAX on the
  binary32 values of its operands and rounded once on the device into the
  output's dtype (``strict=True`` raises NotImplementedError instead).

Nested jaxprs (``jit``, ``custom_jvp_call``, ``custom_vjp_call``, ``checkpoint``)
are evaluated recursively.

Each equation runs inside ``device.label(path)``, ``path`` the module path its name stack
gives (``jax.named_scope`` blocks, and flax modules, which name their scopes): the backward
of ``encoder/dense`` (``transpose(jvp(encoder))/dense``) is labelled ``encoder.dense`` as its
forward is, as sim.torch labels a torch module's operations; outside any scope, the
enclosing ``device.label`` or "". ``.events`` counts, per path, the equations whose events
reached the register (as ``DeviceMode.events`` does). ``coverage(fn, *args)`` lists, before anything runs,
the primitives that would take the float32 route.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable
from typing import Any

import jax
import ml_dtypes
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

from . import ops
from .device.core import Device

__all__ = ["on_device", "coverage", "scope_path", "DEVICE", "EXACT"]

_OURS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_F16 = np.dtype(np.float16)


class _Unmapped(Exception):
    """These arguments have no device equivalent: take the float32 route."""


def _binary(name: str) -> Callable:
    return lambda dev, x, y, **_: getattr(dev, name)(x, y)


def _unary(name: str) -> Callable:
    return lambda dev, x, **_: getattr(dev, name)(x)


def _dot(dev: Device, x, y, dimension_numbers, preferred_element_type=None, **_):
    (lc, rc), (lb, rb) = dimension_numbers
    if lb or rb or len(lc) != 1 or x.dtype != _F16 or y.dtype != _F16 or x.ndim > 2 or y.ndim > 2:
        raise _Unmapped
    a = np.moveaxis(x, lc[0], -1).reshape(-1, x.shape[lc[0]])
    b = np.moveaxis(y, rc[0], 0).reshape(y.shape[rc[0]], -1)
    out = np.float32 if preferred_element_type == np.float32 else np.float16
    free = [d for i, d in enumerate(x.shape) if i != lc[0]] + [d for i, d in enumerate(y.shape) if i != rc[0]]
    return dev.matmul(np.ascontiguousarray(a), np.ascontiguousarray(b), out_dtype=out).reshape(free)


def _axes_first(x: np.ndarray, axes) -> np.ndarray:
    axes = tuple(axes)
    rest = [d for d in range(x.ndim) if d not in axes]
    return np.transpose(x, axes + tuple(rest)).reshape(-1, *[x.shape[d] for d in rest])


def _reduce(kind: str) -> Callable:
    def run(dev: Device, x, axes, **_):
        v = _axes_first(x, axes)
        if kind == "sum":
            return np.asarray(dev.sum(v, axis=0, accumulate=np.float32, out_dtype=x.dtype))
        return np.asarray(getattr(dev, kind)(v, axis=0))
    return run


def _convert(dev: Device, x, new_dtype, **_):
    new = np.dtype(new_dtype)
    if x.dtype.kind != "f" or new.kind != "f" or new == x.dtype:
        raise _Unmapped
    return dev.cast(x, new)


#: The primitives whose equations need more than the device method of the same operation.
_HANDLERS: dict[str, Callable] = {"dot_general": _dot, "convert_element_type": _convert}


def _handler(op: ops.Op) -> Callable:
    """The route of an equation of ``op``'s device method, by its kind."""
    if op.kind == ops.REDUCTION:
        return _reduce(op.name)
    return _binary(op.name) if op.arity == 2 else _unary(op.name)


#: Primitives with a device equivalent (from the table of sim.ops).
DEVICE: dict[str, Callable] = {prim: _HANDLERS[prim] if prim in _HANDLERS else _handler(op)
                               for op in ops.OPS if op.device for prim in op.jax}

#: Primitives that move or select values: exact as JAX evaluates them.
EXACT = frozenset({
    "broadcast_in_dim", "reshape", "transpose", "squeeze", "expand_dims", "concatenate", "select_n", "slice",
    "dynamic_slice", "dynamic_update_slice", "gather", "iota", "stop_gradient", "copy", "copy_p", "rev",
    "argmax", "argmin", "pad", "split",
})

_CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
          "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
          "checkpoint": "jaxpr", "remat": "jaxpr"}


def _sub(eqn) -> tuple[Jaxpr, list] | None:
    key = _CALLS.get(eqn.primitive.name)
    if key is None or key not in eqn.params:
        return None
    sub = eqn.params[key]
    return (sub.jaxpr, list(sub.consts)) if isinstance(sub, ClosedJaxpr) else (sub, [])


_TRANSFORM = re.compile(r"^\w+\((.*)\)$")  # jvp(encoder), transpose(jvp(encoder)): the scope inside


def scope_path(name_stack: str, outer: str = "") -> str:
    """The module path of a jaxpr equation from its name stack (``jax.named_scope`` and flax
    modules' names), as sim.torch writes module paths: ``transpose(jvp(encoder))/dense`` (the
    backward of encoder.dense) is ``encoder.dense``, forward and backward alike; within a nested
    jaxpr, the path of the equation that holds it comes first."""
    parts = []
    for part in str(name_stack).split("/"):
        while (inner := _TRANSFORM.match(part)) is not None:
            part = inner.group(1)
        if part:
            parts.append(part)
    return ".".join(p for p in (outer, *parts) if p)


class _Evaluator:
    def __init__(self, device: Device, strict: bool) -> None:
        self.device, self.strict = device, strict
        self.routes: collections.Counter[tuple[str, str]] = collections.Counter()
        self.events: collections.Counter[str] = collections.Counter()

    def run(self, jaxpr: Jaxpr, consts: list, args: list, outer: str = "") -> list:
        env: dict[Any, Any] = {}
        read = lambda v: np.asarray(v.val, v.aval.dtype) if isinstance(v, Literal) else env[v]  # noqa: E731
        for var, val in zip(jaxpr.constvars, consts, strict=True):
            env[var] = np.asarray(val)
        for var, val in zip(jaxpr.invars, args, strict=True):
            env[var] = np.asarray(val)
        dev = self.device
        for eqn in jaxpr.eqns:
            label = scope_path(eqn.source_info.name_stack, outer)
            sub = _sub(eqn)
            if sub is not None:
                outs = self.run(sub[0], sub[1], [read(v) for v in eqn.invars], label)
            else:
                where = label or dev.current_label or ""
                with dev.label(where) as block:
                    outs = self.eqn(eqn, [read(v) for v in eqn.invars])
                if block.raised:
                    self.events[where] += 1
            for var, val in zip(eqn.outvars, outs, strict=True):
                env[var] = val
        return [read(v) for v in jaxpr.outvars]

    def eqn(self, eqn, vals: list) -> list:
        name = eqn.primitive.name
        ours = any(getattr(v, "dtype", None) in _OURS for v in vals) or any(
            v.aval.dtype in _OURS for v in eqn.outvars)
        if not ours or name in EXACT:
            self.routes[name, "exact" if ours else "native"] += 1
            return self.bind(eqn, vals)
        handler = DEVICE.get(name)
        if handler is not None:
            try:
                out = handler(self.device, *vals, **eqn.params)
            except _Unmapped:
                if name == "convert_element_type":  # between integer and float, or no change: exact
                    self.routes[name, "exact"] += 1
                    return self.bind(eqn, vals)
            else:
                self.routes[name, "device"] += 1
                return [np.asarray(out)]
        if self.strict:
            raise NotImplementedError(f"{name} has no device equivalent (on_device(..., strict=True)); without "
                                      f"strict it runs in float32 and is rounded once on the device")
        self.routes[name, "float32"] += 1
        wide = [v.astype(np.float32) if getattr(v, "dtype", None) in _OURS else v for v in vals]
        params = {k: (np.float32 if isinstance(p, np.dtype) and p in _OURS else p) for k, p in eqn.params.items()}
        outs = self.bind(eqn, wide, params)
        return [self.device.cast(o, var.aval.dtype) if var.aval.dtype in _OURS and o.dtype != var.aval.dtype else o
                for o, var in zip(outs, eqn.outvars, strict=True)]

    @staticmethod
    def bind(eqn, vals: list, params: dict | None = None) -> list:
        out = eqn.primitive.bind(*vals, **(eqn.params if params is None else params))
        return [np.asarray(o) for o in out] if eqn.primitive.multiple_results else [np.asarray(out)]


def on_device(fn: Callable, device: Device, *, strict: bool = False) -> Callable:
    """``fn`` evaluated with ``device``'s operations; the returned function takes and returns
    what ``fn`` does (as numpy arrays) and keeps the last call's routes in ``.routes``, and in
    ``.events`` the count, per module path, of equations whose events reached the register."""
    if not isinstance(device, Device):
        raise TypeError(f"on_device takes a sim.Device, got {type(device).__name__}")

    def run(*args):
        closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        ev = _Evaluator(device, strict)
        out = ev.run(closed.jaxpr, list(closed.consts), jax.tree_util.tree_leaves(args))
        run.routes, run.events = ev.routes, ev.events
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), out)

    run.routes, run.events = collections.Counter(), collections.Counter()
    return run


def coverage(fn: Callable, *args) -> list[str]:
    """The primitives of ``fn``'s jaxpr (nested ones included) that have no device or exact
    route, sorted: what would run in float32 and be rounded once (some mapped primitives
    also fall back for some arguments, such as dot_general with batch dimensions)."""
    names: set[str] = set()

    def walk(jaxpr: Jaxpr) -> None:
        for eqn in jaxpr.eqns:
            sub = _sub(eqn)
            if sub is not None:
                walk(sub[0])
            elif eqn.primitive.name not in DEVICE and eqn.primitive.name not in EXACT:
                names.add(eqn.primitive.name)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return sorted(names)
