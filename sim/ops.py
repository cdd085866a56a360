"""The operations, each declared once: what they compute, their compiled kernel, and the
torch aten packets and JAX primitives that map to them.

:class:`~sim.fpu.Fpu`'s and :class:`~sim.Device`'s elementwise methods are made from
this table, and ``sim.torch``'s routes and ``sim.jax``'s mapping are read from it. Adding
an elementwise operation is its kernel (an op code in :mod:`sim.kernels`) and one entry
here. Operations of kind ``OTHER`` have hand-written methods (a composition, a cast, a
matmul); their entries say where the bridges send their aten packets and primitives.

An aten packet is declared once, here, under the operation its device route is made of
(``pow``, taken for an exponent of 2 as ``mul(x, x)``, under ``mul``; ``tanh_backward`` and
``sigmoid_backward``, compositions of ``sub`` and ``mul`` of the function's value, under the
function; ``clamp`` under ``maximum``; ``hardsigmoid``, ``hardswish`` and their backward under
their last operation; ``masked_fill``, ``index_fill``, ``nan_to_num``, ``where`` and ``angle``, selections whose
values may need rounding, under ``cast``),
or, for the packets of a fused kernel (binary32 inside, one rounding per output), in
:data:`sim.fused.FAMILIES`; ``sim.torch`` has the handlers of the packets that need more
than the device method of the same name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import kernels as K

__all__ = ["Op", "OPS", "BY_NAME", "BINARY", "ELEMENTARY", "SIGN", "FMA", "COMPARE", "REDUCTION", "OTHER"]

#: Kinds: how an operation reaches its kernel.
BINARY = "binary"  #: two operands of one format, one rounding (``K.add``, ...)
ELEMENTARY = "elementary"  #: one operand, ``K.elementary`` with the op code
SIGN = "sign"  #: a sign-bit operation (``K.sign_op``), quiet
FMA = "fma"  #: a * b + c, one rounding
COMPARE = "compare"  #: an IEEE predicate (``K.compare`` with the op code), bool results
REDUCTION = "reduction"  #: a device reduction along an axis (hand-written method)
OTHER = "other"  #: hand-written methods (compositions, casts, products)


@dataclass(frozen=True)
class Op:
    """One operation, as every layer needs it."""

    name: str  #: the method's name on Fpu and Device
    kind: str  #: one of the kinds above
    arity: int  #: operands of an elementwise call (0: not elementwise)
    doc: str  #: the methods' docstring
    code: int | None = None  #: the kernel's op code (ELEMENTARY, COMPARE)
    kernel: Callable | None = None  #: the compiled kernel (BINARY)
    exact_kernel: Callable | None = None  #: BINARY: the kernel where binary64 adds the format exactly
    aten: tuple[str, ...] = ()  #: torch aten overload packets routed to the device's method
    jax: tuple[str, ...] = ()  #: JAX primitives routed to the device's method
    fpu: bool = True  #: Fpu has the method
    device: bool = True  #: Device has the method
    signaling: bool = False  #: COMPARE: INVALID for any NaN (else only for a signaling NaN)
    swap: bool = False  #: COMPARE: the kernel's predicate on (b, a)
    negate: bool = False  #: COMPARE: the kernel's predicate negated
    inexact: bool = True  #: may raise INEXACT
    short: bool = True  #: BINARY: the device calls the kernel itself (else by the unit, whose status it sets)
    exact_at: tuple[float, ...] = ()  #: transcendentals: the finite arguments where the value is exact
    mpfr: str | None = None  #: the MPFR function of the same value, where its name differs

    @property
    def elementwise(self) -> bool:
        return self.arity > 0


def _binary(name: str, kernel: Callable, doc: str, aten=(), jax=(), exact_kernel=None, **kw) -> Op:
    return Op(name, BINARY, 2, doc, kernel=kernel, exact_kernel=exact_kernel, aten=aten, jax=jax, **kw)


def _elementary(name: str, code: int, doc: str, aten=(), jax=(), **kw) -> Op:
    return Op(name, ELEMENTARY, 1, doc, code=code, aten=aten, jax=jax, **kw)


def _compare(name: str, code: int, doc: str, signaling: bool, fpu: bool = True, **kw) -> Op:
    return Op(name, COMPARE, 2, doc, code=code, aten=(name,), jax=(name,), fpu=fpu, signaling=signaling,
              inexact=False, **kw)


OPS: tuple[Op, ...] = (
    _binary("add", K.add, "a + b, rounded once.", ("add",), ("add", "add_any"), K.add_exact),
    _binary("sub", K.sub, "a - b, rounded once.", ("sub", "rsub"), ("sub",), K.sub_exact),
    _binary("mul", K.mul, "a * b, rounded once.", ("mul", "native_dropout_backward", "pow", "hardswish",
                                                   "hardsigmoid_backward", "hardswish_backward"), ("mul",)),
    _binary("div", K.div, "a / b, rounded once.", ("div", "hardsigmoid"), ("div",)),
    _binary("maximum", K.maximum, "IEEE 754-2019 maximum: NaN if either is NaN, maximum(+0, -0) = +0.",
            ("maximum", "clamp", "clamp_min"), ("max",), inexact=False, short=False),
    _binary("minimum", K.minimum, "IEEE 754-2019 minimum: NaN if either is NaN, minimum(+0, -0) = -0.",
            ("minimum", "clamp_max"), ("min",), inexact=False, short=False),
    _elementary("sqrt", K.SQRT, "Square root, correctly rounded; sqrt(-0) is -0, sqrt(<0) is INVALID.",
                ("sqrt",), ("sqrt",)),
    _elementary("rsqrt", K.RSQRT, "1/sqrt(a), correctly rounded (one rounding); +-0 gives +-Inf with "
                "DIVBYZERO (IEEE 754 rSqrt).", ("rsqrt",), ("rsqrt",), mpfr="rec_sqrt"),
    _elementary("reciprocal", K.RECIPROCAL, "1/a, rounded once; 1/+-0 = +-Inf raises DIVBYZERO.", ("reciprocal",)),
    _elementary("erf", K.ERF, "The error function, correctly rounded.", ("erf",), ("erf",), exact_at=(0,)),
    _elementary("exp", K.EXP, "e**a, correctly rounded in every mode.", ("exp",), ("exp",), exact_at=(0,)),
    _elementary("log", K.LOG, "Natural log, correctly rounded; log(0) = -Inf raises DIVBYZERO, log(<0) is "
                "INVALID.", ("log",), ("log",), exact_at=(1,)),
    _elementary("tanh", K.TANH, "Hyperbolic tangent, correctly rounded in every mode.", ("tanh", "tanh_backward"),
                ("tanh",),
                exact_at=(0,)),
    _elementary("sigmoid", K.SIGMOID, "1 / (1 + e**-a), correctly rounded in every mode.",
                ("sigmoid", "sigmoid_backward"),
                ("logistic",), exact_at=(0,)),
    Op("neg", SIGN, 1, "-a: the sign bit flipped, NaNs included; quiet (no flags, even for a signaling NaN).",
       aten=("neg",), jax=("neg",), inexact=False),
    Op("abs", SIGN, 1, "|a|: the sign bit cleared, NaNs included; quiet.", aten=("abs",), jax=("abs",),
       inexact=False),
    Op("fma", FMA, 3, "a * b + c with a single rounding.", device=False),
    _compare("eq", K.EQ, "a == b; quiet (INVALID only for a signaling NaN); NaN equals nothing.", False),
    _compare("ne", K.EQ, "not (a == b), quiet.", False, fpu=False, negate=True),
    _compare("lt", K.LT, "a < b; signaling (INVALID for any NaN, IEEE 754 compareSignalingLess).", True),
    _compare("le", K.LE, "a <= b; signaling.", True),
    _compare("gt", K.LT, "a > b; signaling.", True, fpu=False, swap=True),
    _compare("ge", K.LE, "a >= b; signaling.", True, fpu=False, swap=True),
    Op("relu", OTHER, 1, "max(a, 0) with +0 for -0; NaN stays NaN: IEEE 754-2019 maximum(a, +0).",
       aten=("relu",), inexact=False),
    Op("rint", OTHER, 1, "Round to an integral value in the current rounding mode.", device=False),
    Op("sum", REDUCTION, 0, "Sum along an axis in a fixed pairwise tree.", aten=("sum",), jax=("reduce_sum",),
       fpu=False),
    Op("mean", REDUCTION, 0, "The sum divided by the count, rounded once.", aten=("mean",), fpu=False),
    Op("amax", REDUCTION, 0, "The IEEE 754-2019 maximum along an axis.", aten=("amax",), jax=("reduce_max",),
       fpu=False, inexact=False),
    Op("amin", REDUCTION, 0, "The IEEE 754-2019 minimum along an axis.", aten=("amin",), jax=("reduce_min",),
       fpu=False, inexact=False),
    Op("matmul", OTHER, 0, "A matrix product: exact products, in-order accumulation.",
       aten=("mm", "bmm", "addmm", "baddbmm"), jax=("dot_general",), fpu=False),
    Op("conv", OTHER, 0, "An N-d convolution (forward, transposed, and its gradients) as im2col and one matmul.",
       aten=("convolution", "convolution_backward"), fpu=False),
    Op("cast", OTHER, 1, "A conversion between formats (Fpu.convert), rounded once.",
       aten=("_to_copy", "copy_", "masked_fill", "index_fill", "nan_to_num", "where", "angle"),
       jax=("convert_element_type",), fpu=False),
)

#: The table by operation name.
BY_NAME: dict[str, Op] = {op.name: op for op in OPS}


def of_kind(kind: str, *, where: str | None = None) -> tuple[Op, ...]:
    """The operations of ``kind`` (that ``where``, "fpu" or "device", has as methods)."""
    return tuple(op for op in OPS if op.kind == kind and (where is None or getattr(op, where)))
