"""Elementwise functions rounded once to binary32 from their exact value: the same bits on every host.

Each function of :data:`FUNCTIONS` is the exact real function of its operands (their exact
values: binary16, bfloat16, binary32 or binary64) and of its parameters, rounded once to binary32
to nearest even, as a correctly rounded binary32 unit would: ``RN32(f(x))``. That value is a
function of the operands alone, so no host's libm, vector width or tensor length can change it.
It is what the fused kernels of ``sim.torch`` compute inside (then the device rounds it into the
output's format), and what host-independent binary32 references use (:mod:`sim.binary32`).

How: each element is first evaluated in binary64 (the host's libm, or a few binary64 steps) with a
bound on that evaluation's error, derived per function from the libm's error (at most :data:`LIBM`
relative: 16 ulps; glibc, musl, macOS and MSVC document 1 to 4 ulps for these functions) and the
roundings of the steps, scaled by the function's condition where an argument is rounded. Where
every value within the bound rounds to the same binary32 number, that is the result. Elsewhere (an
element within the bound of a binary32 rounding boundary, about one in 2**20 at random) the exact
value is computed again at 80 to 1280 bits with mpmath (a dependency of torch, so present wherever
``sim.torch`` runs; exp, log, exp2, log2 and log10, which the built-in workloads use without
torch, fall back to Python's ``decimal`` without it), or exactly with fractions for the rational
functions (``addcmul``, ``addcdiv``, ``lerp``). An exact value that is itself a rounding boundary
is found exactly (a rational function's) or, for a transcendental function at a point other than
those handled exactly (exp(0) = 1, log2 of a power of two...), taken to be one only past 1280
bits.

Flags: per element, the events the float-status register records: INVALID (a NaN from non-NaN
operands: log(-1), asin(2), inf * 0; or a signaling NaN operand), DIVBYZERO (an exact infinite
result from finite operands, a pole: log(0), atanh(1), erfinv(1), x / 0) and OVERFLOW (a finite
exact value beyond binary32's range). INEXACT and UNDERFLOW are not reported.

Zeros and infinities follow torch's CPU formulas where they define the sign or the value (elu of
±0 is scale times it, whatever alpha, as torch gives on every dtype and CPU capability; gelu and silu of
-inf are NaN, as torch's x * cdf(x) gives), so that a device route agrees with torch wherever
torch's answer is exact.

The package's files: ``compiled`` and ``pairs`` (the numba kernels of one, and of two or three
operands), ``exact`` (hard cases' exact values) and
``functions`` (the table and ``evaluate``).
"""

from .compiled import LIBM
from .exact import exact_value
from .functions import FUNCTIONS, Function, evaluate, signaling, specials

__all__ = ["Function", "FUNCTIONS", "evaluate", "exact_value", "signaling", "specials", "LIBM"]
