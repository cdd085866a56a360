"""Unmodified PyTorch code on a simulated Atlas device (optional extra ``torch``).

Inside ``with DeviceMode(dev):`` every aten operation on float16 or bfloat16
tensors (and float32 ones with ``float32=True``), or asked for in one (a dtype
argument), is taken by one of the routes of ``ROUTE_KINDS``, counted in
``mode.routes``; none runs natively uncounted:

- ``device``: the operation has a device equivalent and runs on ``dev``, in its
  rounding, overflow mode and register (see ``ROUTES`` for the list). Operands
  of other dtypes are first cast on the device to the dtype torch's promotion
  gives the result; Python scalars are rounded into it there too (one cast,
  its events recorded), then the device operation rounds once more.
  ``addmm`` and biased convolutions place the bias as the device's
  ``matmul_bias`` says (default: the product rounded, then the bias added);
  sums and means accumulate in binary32 and round once to the tensor's dtype.
  ``rsub`` (``1.0 - x``) is ``sub`` with its operands swapped.
  Compositions of device operations, each documented with its order:
  ``clamp`` (maximum, then minimum), ``hardsigmoid`` and ``hardswish`` (the
  NPU kernel's order) and their backward (torch's CPU formulas), operation by
  operation in the tensor's dtype, ``tanh_backward``, ``sigmoid_backward``, and ``pow`` for the
  exponents of CANN's Pows kernel (2, 3, 0.5, -1, -2, -0.5; see ``_pow``).
  In-place (``add_``, ``relu_``...) and ``out=`` overloads take their functional
  operation's route, the result written into the destination (rounded on the
  device where its dtype differs).
- ``exact``: views, in-place views (``transpose_``, ``unsqueeze_``,
  ``as_strided_``..., applied to the tensor itself), and pure data movement and
  selection (reshape, cat, index, gather, where, splits, pooling indices, the
  gradients of a selection: ``select_backward``, ``slice_backward``), and the
  quiet classifications (``isinf``, ``isnan``), which torch computes exactly
  itself.
- ``factory``: operations that create values (``empty*``, ``new_empty*``,
  ``zeros``, ``ones``, ``*_like``, ``full``, ``fill_``, ``scalar_tensor``,
  ``arange``, ``linspace``, ``eye``): torch makes the tensor in our dtype
  directly, so uninitialised memory is never cast (it would fake overflows); a
  fill value the dtype cannot hold is rounded into it on the device, and a
  computed sequence (``arange``, ``linspace``) is computed in binary64 and each
  value rounded once on the device. What torch refuses (``full(1e6)`` in
  float16), it still refuses.
- ``random``: operations that draw from torch's generator (``bernoulli_``,
  ``normal_``, ``uniform_``, ``rand``, ``native_dropout``...): the draw is made
  in binary32 from binary64 uniforms of torch's generator (``sim.torch_binary32``),
  then converted: Bernoulli draws are 0 or 1, exact in every format; continuous
  draws are rounded once on the device into the dtype (a uniform draw toward
  -inf, so that it stays below its upper bound). ``native_dropout`` multiplies on
  the device by the exact mask and by 1/(1-p) rounded into the dtype (its
  backward is a device route, the same two multiplies).
- ``fused``: the fused operation families of ``sim.fused`` (attention, layer/RMS/batch/group
  norm, softmax and log-softmax, GELU, SiLU, cross-entropy, RNN, LSTM and GRU, and the gradient
  accumulations of embeddings and max pooling) chosen fused
  (``DeviceMode(dev, fused={"softmax": False, ...})``, the defaults those of ``sim.fused``):
  computed by torch in binary32 from the exact values of the operands, each output rounded
  once on the device, forward and backward. A family chosen unfused is its math
  decomposition in the tensor's dtype (torch-function level, above autograd), each piece on
  the device.
- ``float32``: anything else is computed by torch in binary32 from the exact
  binary32 values of its operands, and each floating result is rounded once
  on the device into the dtype torch would return, so that its overflow still
  reaches the register. ``strict=True`` raises NotImplementedError naming
  the operation instead (the other routes are deliberate and always taken).

Autograd works as usual when backward runs inside the mode (on CPU it runs in
the calling thread, so the backward operations are routed too). Modes are
made per step in a training loop: a graph made under one mode may be run
backward under a later one (a loss kept alive from the previous step keeps
its parameters' autograd nodes alive), and a model used natively, or under
another mode, before is welcome.

Modes nest, on the same device or different ones: the innermost mode that
takes an operation computes and counts it, on its device; the torch calls it
makes meanwhile pass through the outer modes unseen, so an outer mode counts
only what the inner ones do not take (with ``float32=True`` outside only, the
float32 operations).

A backward pass of operations made in a module's forward under a mode that
runs where no DeviceMode is active (after the ``with`` block, or in a thread
the mode does not cover: modes are per thread) raises RuntimeError, rather
than running natively unseen. The check sits on the autograd nodes of each
module's outputs, which a backward pass from outside the module reaches before
any node of its forward: one check a module call, not one an operation (the
difference is 4-6% of a transformer's step).

Each routed operation is labelled with the module that issued it: its path
in the outermost module called inside the mode (``encoder.layers.1.attn``;
outside any module, the label of the enclosing ``device.label`` block, or
""), found by forward hooks in the forward pass and, in the backward pass,
from the autograd node being run: the module whose forward made it, told by
the node's sequence number (torch numbers a thread's autograd nodes in the
order made; the mode notes the number at each module's entry and exit, so a
node's module is found without walking the graph). A node made outside
modules, or in a forward whose graph is gone, takes the enclosing
``device.label``; a parameter's gradient accumulation takes the module that
owns the parameter. The operation runs inside
``device.label(path)``, and ``mode.events`` counts, per label, the device
operations whose events reached the register.

The mode is a ``torch.utils._python_dispatch.TorchDispatchMode``: it sees the
operations below autograd, after torch's Python-level decompositions.

``on_host()`` runs the torch calls inside it on the host while a mode is active: an observer's own
work (a debugger's statistics and copies of the tensors it records) stays off
the device and its register.

The package's files: ``convert`` (tensors as numpy operands and back), ``routes`` (the routes
table), ``handlers`` (the device routes that compose device operations), ``mode`` (the dispatch
mode and its torch-function level), ``functions`` (the fused families above autograd), ``labels``
(module tracking), ``draws`` (random draws).
"""

from .convert import NUMPY_DTYPES, as_array, as_tensor
from .functions import ABOVE_AUTOGRAD, FUNCTIONS
from .mode import DeviceMode, on_host
from .routes import EXACT, EXACT_OVERLOADS, FACTORIES, ROUTE_KINDS, ROUTES

__all__ = ["DeviceMode", "on_host", "ROUTES", "EXACT", "EXACT_OVERLOADS", "FACTORIES", "ROUTE_KINDS", "FUNCTIONS",
           "ABOVE_AUTOGRAD", "as_array", "as_tensor", "NUMPY_DTYPES"]
