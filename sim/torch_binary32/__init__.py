"""torch's binary32 arithmetic made a function of the operands alone: the fused and float32 routes
of :mod:`sim.torch` compute in it, and :class:`Binary32Mode` gives it to any float32 code.

torch's CPU kernels differ by CPU capability (``ATEN_CPU_CAPABILITY``: vectorised Sleef functions,
fused multiply-adds, reduction orders by vector width), by a tensor's length (the vector body
and the scalar tail), by the BLAS, and, for Bernoulli draws, by the CPU's vendor (MKL's
generator on Intel). Inside :class:`Binary32Mode` every operation on binary32 tensors is
computed by one of these means instead, each giving the same bits on every host:

- the elementwise functions of :mod:`sim.elementary` (exp, log, tanh, sigmoid, erf, the
  trigonometric and hyperbolic functions, pow, GELU, SiLU, Mish, softplus, ELU and the other
  activations, their backward formulas, addcmul, addcdiv, lerp, add with a scale): each output
  the exact value rounded once to binary32;
- reductions in fixed orders (:mod:`sim.binary32`): sum and mean in the device's pairwise tree;
  var and std in two passes (the mean, then the sum of the squared deviations, each a tree,
  divided by the count less the correction); prod, cumsum and cumprod in index order; norms as
  the tree sum of |x|**p (p = 2: x * x, then the square root); logsumexp as max + log(sum of
  exp(x - max));
- matrix products (mm, bmm, addmm, baddbmm, mv, dot, and the convolutions as im2col and a
  matmul, in the device's orders) with the products added in order along k, each addition one
  binary32 rounding (a bias or a beta term added after, alpha scaling last);
- accumulations into a tensor (index_put with accumulate, index_add, scatter_add, the gradients
  of embeddings, of max and average pooling and of upsampling) adding each source element in
  order, one binary32 rounding each;
- attention as torch's math path written with the above (scores, mask, softmax, @ v), its
  backward by autograd of that path;
- random draws from torch's generator through binary64 uniform draws (torch's ``uniform_``, which
  computes no floating-point function), transformed here: Bernoulli as u < p, normal by Box and
  Muller from two uniforms with the functions above, exponential, log-normal, Cauchy and
  geometric by inversion;
- IEEE operations (``+ - * /`` of two operands, comparisons, selections, data movement,
  conversions), which torch computes identically on every host, by torch itself; sqrt, fmod and
  remainder by numpy (torch's are not the same on every host: see :func:`_numpy_ieee`);
- anything else by torch's own decomposition (``torch._decomp``) into the above, evaluated in
  the same mode; an operation with none is computed by torch's kernel and counted in
  ``Binary32Mode.host`` (its bits may depend on the host). The decompositions of batch and layer
  normalisation, softmax, their backwards and the embedding gradient (:data:`DIRECT`) are
  evaluated directly: the same steps with the modelled ones called, not re-dispatched.

Each fused or float32 route of DeviceMode computes its operation this way (in binary32 from the
exact values of the operands) and hands the results to the device, which rounds them into
their dtypes; :func:`evaluate` also returns the events the register records (see its docstring).

The package's files: ``mode`` (``Binary32Mode``, its tables, and the events of a computation),
``common``, ``pointwise``, ``reductions``, ``products``, ``pooling``, ``gradients``, ``attention``,
``norms``, ``losses`` and ``draws`` (the models, by kind).
"""

from .draws import bernoulli_mask
from .mode import DIRECT, IMPLEMENTED, NATIVE, Binary32Mode, evaluate, judge, run

__all__ = ["Binary32Mode", "evaluate", "run", "judge", "bernoulli_mask", "IMPLEMENTED", "NATIVE", "DIRECT"]
