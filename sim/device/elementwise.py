"""A device's elementwise operations, one method per entry of the operation table (``sim.ops``)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .. import kernels as K
from .. import ops
from ..formats import BFLOAT16, Format
from ..fpu import Fpu, filled, finish, tabulated

_F16 = np.dtype(np.float16)
#: The classes the short paths take as they are (a masked array or other subclass is checked first).
_PLAIN = frozenset({np.ndarray, np.float16, np.float32, BFLOAT16.dtype.type})
#: One-operand functions and casts of at least this many binary16 or bfloat16 elements read a table
#: of the kernel's own results and flags for all 65,536 inputs (``_table``): a deterministic rounding
#: of f(x) depends on x alone, so the table gives the same bits and flags, at the cost of a read.
_TABLE_MIN = 1 << 8


def _table(key: tuple, run: Callable[[np.ndarray, np.ndarray, np.ndarray], object],
           uint: type = np.uint16) -> tuple[np.ndarray, np.ndarray]:
    """The results (``uint`` bits) and flags of a kernel ``run(inputs, out, flags)`` on every 16-bit
    input, made on first use (a few milliseconds) and shared by every device
    (``sim.fpu.tabulated``); ``key`` names the kernel and every setting it reads."""
    def make() -> tuple[np.ndarray, np.ndarray]:
        out, flags = np.empty(1 << 16, uint), np.empty(1 << 16, np.uint8)
        run(np.arange(1 << 16, dtype=np.uint16), out, flags)
        return out, flags

    return tabulated(key, make)


class _Elementwise:
    """The elementwise operations (one method per entry of ``sim.ops``) and their paths."""

    def _on(self, x) -> Fpu:
        try:
            return self._fpus[x.dtype]
        except (KeyError, AttributeError):
            if isinstance(getattr(x, "dtype", None), np.dtype) and x.dtype.newbyteorder("=") in self._fpus:
                return self._fpus[x.dtype.newbyteorder("=")]  # big-endian: the operands are converted
            got = getattr(x, "dtype", type(x).__name__)
            raise TypeError(f"{self.name}: no arithmetic on {got}; valid: numpy arrays or scalars of "
                            f"float16, float32, bfloat16") from None

    def _unit(self, dtype, what: str) -> Fpu:
        """The unit computing in ``dtype`` (for accumulation and output types)."""
        try:
            return self._fpus[np.dtype(dtype)]
        except (KeyError, TypeError):
            raise TypeError(f"{self.name}: {what} must be float16, float32 or bfloat16, not {dtype!r}") from None

    def _op(self, op: str, *args, **kw) -> np.ndarray:
        """Run one elementwise operation in the settings of its operands' format."""
        result, shape, scalar = self._on(args[0]).run(op, args, **kw)
        self._record(result.status, op, math.prod(shape))
        return finish(result, shape, scalar, False)

    def _flat(self, op: str, call, n: int, dst: Format, shape: tuple[int, ...]) -> np.ndarray:
        """The short path: ``call(out, flags)`` runs one kernel on n elements into fresh arrays
        of ``dst`` bits; its events are recorded and the result shaped."""
        out = np.empty(n, dst.uint)
        self._record(call(out, np.empty(n, np.uint8)), op, n)
        return out.view(dst.dtype).reshape(shape)

    def _tabled(self, op: str, key: tuple, run: Callable[[np.ndarray, np.ndarray, np.ndarray], object],
                bits: np.ndarray, dst: Format, shape: tuple[int, ...]) -> np.ndarray:
        """``op`` on 16-bit inputs ``bits`` read from the table of the kernel ``run``'s results and
        flags on every input (:func:`_table`, ``key`` naming the kernel and its settings): one lookup,
        one record, as the short path runs the kernel itself."""
        codes, table_flags = _table(key, run, dst.uint)
        return self._flat(op, lambda out, flags: K.lookup(bits, 0, codes, table_flags, out, flags), bits.size, dst,
                          shape)

    def _elementary(self, op: str, code: int, a) -> np.ndarray:
        """A transcendental or similar one-operand operation (``code``: its kernel's); arrays take
        the short path."""
        fpu = self._fpus.get(a.dtype) if a.__class__ is np.ndarray else None
        if fpu is None:
            return self._op(op, a)
        bits, cfg = a.reshape(-1).view(fpu.uint), fpu.settings
        if a.size >= _TABLE_MIN and a.dtype.itemsize == 2 and cfg[K.MODE] < K.STOCHASTIC:
            return self._tabled(op, ("elementary", code, cfg.tobytes()), lambda every, out, flags: K.elementary(
                code, every, out, flags, cfg, cfg), bits, fpu.format, a.shape)
        return self._flat(op, lambda out, flags: K.elementary(code, bits, out, flags, cfg, cfg), a.size,
                          fpu.format, a.shape)

    def _binary(self, op: str, a, b) -> np.ndarray:
        """A binary operation on arrays or scalars of one dtype (broadcast as numpy does): checks,
        one kernel call, one register update. Anything else (errors included) goes by ``_op``."""
        try:
            fpu = self._fpus[a.dtype]
            usual = b.dtype == a.dtype and a.__class__ in _PLAIN and b.__class__ in _PLAIN
        except (AttributeError, KeyError, TypeError):
            usual = False
        if not usual:
            return self._op(op, a, b)
        shape = a.shape
        if b.shape != shape:
            try:
                shape = np.broadcast(a, b).shape
            except ValueError:
                return self._op(op, a, b)
            a = a if a.shape == shape else filled(a, shape)
            b = b if b.shape == shape else filled(b, shape)
        uint, out = fpu.uint, np.empty(shape, a.dtype)
        self._record(fpu.kernels[op](a.ravel().view(uint), b.ravel().view(uint), out.ravel().view(uint),
                                     np.empty(out.size, np.uint8), fpu.settings), op, out.size)
        return out if shape or a.__class__ is np.ndarray or b.__class__ is np.ndarray else out[()]

    # -- elementwise: the methods of sim.ops's operations are made below the class ----------
    def _compare(self, name: str, op: int, signaling: bool, a, b) -> np.ndarray:
        fpu = self._on(a)
        flat, shape, scalar = fpu.operands("compare", (a, b), fpu.format)
        out = np.empty(flat[0].size, bool)
        self._record(K.compare(op, signaling, flat[0], flat[1], out, np.empty(out.size, np.uint8), fpu.settings),
                     name, out.size)
        return out[0] if scalar else out.reshape(shape)

    def relu(self, a) -> np.ndarray:
        """max(a, 0), with +0 for -0 and NaN kept: IEEE 754-2019 maximum(a, +0). A long array of a
        16-bit format reads a table of the maximum kernel's results and flags against +0 for
        every input (see _table): the same bits and events, without a second operand."""
        fpu = self._fpus.get(a.dtype) if a.__class__ is np.ndarray else None
        if fpu is None or a.size < _TABLE_MIN or a.dtype.itemsize != 2 or fpu.settings[K.MODE] >= K.STOCHASTIC:
            return self._binary("maximum", a, np.zeros(np.shape(a), self._on(a).format.dtype))
        cfg = fpu.settings
        return self._tabled("maximum", ("relu", cfg.tobytes()), lambda every, out, flags: fpu.kernels["maximum"](
            every, np.zeros(every.size, np.uint16), out, flags, cfg), a.reshape(-1).view(fpu.uint), fpu.format, a.shape)


def _method(op: ops.Op) -> Callable:
    """The Device method of ``op``: one call into the device's path for its kind, its signature
    and docstring as if written out by hand."""
    name, code, signaling = op.name, op.code, op.signaling
    if op.kind == ops.COMPARE and op.negate:
        def method(self, a, b) -> np.ndarray:
            return ~self._compare(name, code, signaling, a, b)
    elif op.kind == ops.COMPARE and op.swap:
        def method(self, a, b) -> np.ndarray:
            return self._compare(name, code, signaling, b, a)
    elif op.kind == ops.COMPARE:
        def method(self, a, b) -> np.ndarray:
            return self._compare(name, code, signaling, a, b)
    elif op.kind == ops.ELEMENTARY:
        def method(self, a) -> np.ndarray:
            return self._elementary(name, code, a)
    elif op.kind == ops.BINARY and op.short:
        def method(self, a, b) -> np.ndarray:
            return self._binary(name, a, b)
    elif op.arity == 1:
        def method(self, a) -> np.ndarray:
            return self._op(name, a)
    else:
        def method(self, a, b) -> np.ndarray:
            return self._op(name, a, b)
    method.__name__, method.__qualname__, method.__doc__ = name, f"Device.{name}", op.doc
    return method


for _op in ops.OPS:
    if _op.device and _op.elementwise and _op.kind != ops.OTHER:
        setattr(_Elementwise, _op.name, _method(_op))

