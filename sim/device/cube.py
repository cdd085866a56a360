"""The cube unit of a device: matmuls of binary16, bfloat16, FP8 and MX operands, and convolutions."""

from __future__ import annotations

import functools
import math
import operator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import blockfp8, conv, formats, mx, nvfp4, profiles
from .. import kernels as K
from ..checks import integer
from ..formats import BFLOAT16, Format, format_of
from ..fpu import Fpu, narrowing32, plain
from ..rounding import OverflowMode, Rounding
from .elementwise import _F16


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="sim-matmul")


#: The block formats :meth:`_Cube.quantize_blocks` makes, by name.
_SCHEMES = {"mx": mx, "nvfp4": nvfp4, "blockfp8": blockfp8}

#: Multiply-adds below which a matmul stays on one thread (threads cost more than they save).
THREADED_MATMUL = 1 << 18


_NO_TABLE = np.empty(0, np.uint16), np.empty(0, np.uint8)


def _rounding(acc_fpu: Fpu, out_fpu: Fpu, size: int) -> tuple:
    """How a matmul kernel rounds its ``size`` binary32 sums into the output: the settings, and
    for long results in a 16-bit format in a deterministic rounding the table of that conversion
    (``sim.fpu.narrowing32``: the same bits and flags, read at half the cost), else none."""
    acc, dst = acc_fpu.settings, out_fpu.settings
    table = narrowing32(size, acc_fpu.format, acc, out_fpu.format, dst)
    return (acc, dst, *table) if table is not None else (acc, dst, 0, *_NO_TABLE)


def matrix_stacks(a: np.ndarray, b: np.ndarray) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """The broadcast leading dimensions of (..., M, K) and (..., K, N) operands, and each operand
    as a flat stack of matrices over them (for matmuls that run matrix by matrix)."""
    try:
        lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: leading dimensions of {a.shape} and {b.shape} do not broadcast") from None
    count = math.prod(lead)  # not -1: ambiguous where a matrix is empty (K = 0)
    return (lead, np.broadcast_to(a, lead + a.shape[-2:]).reshape(count, *a.shape[-2:]),
            np.broadcast_to(b, lead + b.shape[-2:]).reshape(count, *b.shape[-2:]))



class _Cube:
    """The cube unit's products: matmul (binary16, bfloat16, FP8, MX operands) and convolutions."""

    # -- reductions and matmul ----------------------------------------------------
    def matmul(self, a, b, accumulate=None, out_dtype=None, bias=None, fuse_bias: bool | None = None,
               substitute: bool = True) -> np.ndarray:
        """``a @ b`` for binary16 (or bfloat16, on a profile whose cube unit takes it) matrices
        (M, K) and (K, N), or stacks of them (..., M, K) and (..., K, N) whose leading
        dimensions broadcast (one device operation for the stack).

        Products are exact; they are added along k in ascending order, each
        addition rounded to ``accumulate`` (default: the profile's, binary32;
        float32: to nearest even, as the cube unit accumulates, whatever the
        device's rounding mode; float16: the device's rounding and overflow
        mode at every step); the sum is rounded once to ``out_dtype`` (default:
        the operands' dtype) in the device's settings for that format.

        ``bias`` (broadcasting to the output) fused (``fuse_bias``; default: the
        device's ``matmul_bias``) is the sums' binary32 initial value, as the cube
        starts L0C from its bias table, and the result is rounded once; otherwise the
        rounded product and the bias are added on the device in ``out_dtype``.

        Where a substitute is set (:meth:`substitute`, as a training simulator does to run a
        model's matmuls in FP8), the call goes to ``fn(device, a, b, accumulate, out_dtype)`` instead
        (with a bias, the substitute's product and the bias are then added on the device);
        ``substitute=False`` passes it by (a substitute's own binary16 matmuls).
        """
        a, b = np.asarray(plain(a)), np.asarray(plain(b))
        if out_dtype is None:
            out_dtype = a.dtype if a.dtype == BFLOAT16.dtype else np.float16
        fused = self._fused(bias, fuse_bias)
        fn = self._substitutes.get("matmul") if substitute else None
        if fn is not None:
            out = fn(self, a, b, accumulate, out_dtype)
            return out if bias is None else self.add(out, self._bias_operand(bias, out.dtype))
        if fused:
            return self._product("matmul", a, b, accumulate, out_dtype, init=bias)
        out = self._product("matmul", a, b, accumulate, out_dtype)
        return out if bias is None else self.add(out, self._bias_operand(bias, out.dtype))

    def _fused(self, bias, fuse_bias: bool | None) -> bool:
        if bias is None:
            return False
        fused = self.matmul_bias == "fused" if fuse_bias is None else bool(fuse_bias)
        if fused and not self.profile.bias_table:
            raise ValueError(f"{self.profile.name}: its cube unit has no bias table (Mmad supports "
                             f"cmatrixSource=false only); the bias cannot enter the binary32 sum")
        return fused

    @staticmethod
    def _bias_operand(bias, dtype) -> np.ndarray:
        bias = np.asarray(bias)
        if bias.dtype != dtype:
            raise TypeError(f"a bias added after the rounding must have the output's dtype {np.dtype(dtype)}, "
                            f"got {bias.dtype}")
        return bias

    def matmul_fp8(self, a, b, a_format: Format | str | None = None, b_format: Format | str | None = None,
                   scale_inv: float = 1.0, out_dtype=np.float32) -> np.ndarray:
        """``a @ b`` for 8-bit operands (M, K) and (K, N): arrays of a signed format of
        :data:`sim.formats.EIGHT_BIT` (their ml_dtypes dtypes), or its uint8 codes named by
        ``a_format``/``b_format`` (``"hifloat8"``).

        As the cube unit computes: every 8-bit value is exact in binary16, so the operands
        widen exactly; the products are exact and are added along k in ascending order in
        binary32; the sum times ``scale_inv`` (the operands' dequantisation factor,
        1 / (scale_a * scale_b)) is rounded once in binary32, then to ``out_dtype``.
        """
        wide = [self._widen8(x, f, name) for x, f, name in ((a, a_format, "a"), (b, b_format, "b"))]
        out = self._product("matmul_fp8", wide[0], wide[1], np.float32, np.float32)
        if scale_inv != 1.0:
            out = self.mul(out, np.float32(scale_inv))
        return out if np.dtype(out_dtype) == np.float32 else self.cast(out, out_dtype)

    def matmul_mx(self, a: mx.MX, b: mx.MX, out_dtype=np.float32) -> np.ndarray:
        """``a @ b`` for MX operands (M, K) blocked along K and (K, N) blocked along K
        (:meth:`matmul_blocks` with the blocks' E8M0 scales, which are powers of two: exact unless
        binary32 overflows or underflows)."""
        if a.axis != 1 or b.axis != 0 or a.block != b.block:
            raise ValueError("matmul_mx takes a (M, K) operand blocked along axis 1 and a (K, N) operand "
                             f"blocked along axis 0 with the same block size; got axes {a.axis}, {b.axis}, "
                             f"blocks {a.block}, {b.block}")
        fa, fb = (formats.decode(q.scales, "float8_e8m0fnu").astype(np.float32) for q in (a, b))
        return self.matmul_blocks(a.elements, b.elements, fa, fb, a.block, a.format, b.format, out_dtype=out_dtype)

    def matmul_blocks(self, a, b, a_scales, b_scales, block: int, a_format: Format | str | None = None,
                      b_format: Format | str | None = None, scale_inv: float = 1.0,
                      out_dtype=np.float32) -> np.ndarray:
        """``a @ b`` for block-scaled 8-, 6- or 4-bit operands (M, K) and (K, N) (as
        :meth:`matmul_fp8` takes them), with a binary32 decode scale per ``block`` values along K:
        ``a_scales`` (M, K / block) and ``b_scales`` (K / block, N), rounded up.

        As a block-scaled GEMM computes: per block of K, the exact products added in order in
        binary32, that sum multiplied by a's block scale, then by b's (each a binary32 rounding;
        exact for powers of two), the blocks' partial sums added in order in binary32; then
        ``scale_inv`` (the operands' per-tensor decode factors, NVFP4's) as :meth:`matmul_fp8`.
        """
        a16, b16 = self._widen8(a, a_format, "a"), self._widen8(b, b_format, "b")
        block = integer("block", block, 1)
        fa, fb = np.asarray(a_scales, np.float32), np.asarray(b_scales, np.float32)
        nk = -(-a16.shape[1] // block) if a16.ndim == 2 else 0
        if (a16.ndim != 2 or b16.ndim != 2 or a16.shape[1] != b16.shape[0]
                or fa.shape != (a16.shape[0], nk) or fb.shape != (nk, b16.shape[1])):
            raise ValueError(f"matmul_blocks takes (M, K) and (K, N) operands with (M, K/{block}) and (K/{block}, N) "
                             f"scales; got {a16.shape}, {b16.shape}, scales {fa.shape}, {fb.shape}")
        total = None
        for k in range(nk):
            lo, hi = k * block, min((k + 1) * block, a16.shape[1])
            part = self._product("matmul_blocks", np.ascontiguousarray(a16[:, lo:hi]), np.ascontiguousarray(b16[lo:hi]),
                                 np.float32, np.float32)
            part = self.mul(self.mul(part, fa[:, k:k + 1]), fb[k:k + 1, :])
            total = part if total is None else self.add(total, part)
        if total is None:
            total = np.zeros((a16.shape[0], b16.shape[1]), np.float32)
        if scale_inv != 1.0:
            total = self.mul(total, np.float32(scale_inv))
        return total if np.dtype(out_dtype) == np.float32 else self.cast(total, out_dtype)

    def quantize_mx(self, x, fmt: Format | str = "float8_e4m3fn", axis: int = -1, block: int = 32,
                    rule: str = "floor", rounding: Rounding | str | None = None) -> mx.MX:
        """MX block quantisation on the device (:func:`sim.mx.quantize`), in the device's rounding
        unless ``rounding`` is given; the element casts' flags reach the register."""
        return self.quantize_blocks("mx", x, fmt, axis=axis, block=block, rule=rule, rounding=rounding)

    def quantize_blocks(self, scheme: str, x, *args, **kwargs):
        """Block quantisation on the device: ``scheme`` "mx" (:func:`sim.mx.quantize`), "nvfp4"
        (:func:`sim.nvfp4.quantize`) or "blockfp8" (:func:`sim.blockfp8.quantize`) with its
        arguments, the casts in the device's rounding unless ``rounding`` is given, by the device's
        block unit (saturating, its own random bits for stochastic rounding); the casts' flags reach
        the register."""
        if scheme not in _SCHEMES:
            raise ValueError(f"unknown block scheme {scheme!r}; valid: {', '.join(_SCHEMES)}")
        if self._mx_unit is None:
            self._mx_unit = Fpu(OverflowMode.SATURATION, self.fpu.rounding, self.fpu.tininess, seed=4 * self.seed + 3)
        unit = self._mx_unit
        unit.clear_status()
        x = plain(x)
        q = _SCHEMES[scheme].quantize(x, *args, fpu=unit, **kwargs)
        self._record(int(unit.status), f"quantize_{scheme}", np.asarray(x).size)
        return q

    @staticmethod
    def _widen8(x, fmt: Format | str | None, name: str) -> np.ndarray:
        """An 8-bit operand as the binary16 values it holds (exact for every 8-bit format)."""
        x = np.asarray(x)
        f = format_of(fmt) if fmt is not None else format_of(x.dtype) if x.dtype != np.uint8 else None
        if f is None or f.dtype.itemsize != 1 or not f.signed:  # not the unsigned E8M0 scales
            valid = ", ".join(f.name for f in formats.EIGHT_BIT if f.signed)
            raise TypeError(f"matmul_fp8: operand {name} must hold {valid} values (uint8 codes need their "
                            f"format named), got {x.dtype}")
        return formats.decode(x, f).astype(np.float16)

    def _operands(self, name: str, a: np.ndarray, b: np.ndarray) -> bool:
        """Check the cube unit takes ``a`` and ``b``; True for bfloat16 operands."""
        if a.dtype == _F16 and b.dtype == _F16:
            return False
        if a.dtype == BFLOAT16.dtype and b.dtype == BFLOAT16.dtype:
            if not self.profile.cube_bfloat16:
                raise TypeError(f"{name}: the cube unit of {self.profile.name} ({self.profile.product_en}) takes "
                                f"binary16 operands, not bfloat16; bfloat16 matmuls and convolutions need a profile "
                                f"whose cube takes them: "
                                f"{', '.join(p.name for p in profiles.PROFILES.values() if p.cube_bfloat16)}")
            return True
        raise TypeError(f"{name} takes two binary16 or two bfloat16 operands, got {a.dtype} and {b.dtype}")

    def _product(self, name: str, a, b, accumulate, out_dtype, init=None) -> np.ndarray:
        a, b = np.asarray(plain(a)), np.asarray(plain(b))
        bf16 = self._operands(name, a, b)
        if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
            raise ValueError(f"matmul needs shapes (..., M, K) and (..., K, N), got {a.shape} and {b.shape}")
        acc = self.profile.matmul_accumulate if accumulate is None else accumulate
        try:
            acc_fpu, out_fpu = self._fpus[np.dtype(acc)], self._fpus[np.dtype(out_dtype)]
        except (KeyError, TypeError):
            acc_fpu = out_fpu = None
        if acc_fpu is None or acc_fpu.format is BFLOAT16 or (out_fpu.format is BFLOAT16 and acc_fpu is self.fpu):
            raise ValueError(f"matmul accumulates in float16 or float32 and returns float16, bfloat16 or float32, "
                             f"not {acc!r} / {out_dtype!r}")
        if acc_fpu is self.fpu and (bf16 or init is not None):
            raise ValueError("bfloat16 operands and a fused bias need binary32 accumulation")
        fmt = out_fpu.format
        m, n = a.shape[-2], b.shape[-1]
        if init is not None:
            init = np.asarray(init)
            if init.dtype not in (_F16, BFLOAT16.dtype, np.dtype(np.float32)):
                raise TypeError(f"a fused bias is binary16, bfloat16 or binary32, got {init.dtype}")
            init = init.astype(np.float32)  # exact
        if a.ndim == 2 and b.ndim == 2:
            start = None if init is None else np.ascontiguousarray(np.broadcast_to(init, (m, n)))
            out, status = self._matmul(a, b, acc_fpu, out_fpu, bf16, start)
            self._record(status, name, m * n)
            return out.view(fmt.dtype).reshape(m, n)
        lead, stack_a, stack_b = matrix_stacks(a, b)
        if acc_fpu is self.fpu:  # binary16 accumulation: matrix by matrix
            out = np.empty((len(stack_a), m * n), fmt.uint)
            status = 0
            for i in range(len(stack_a)):
                out[i], s = self._matmul(stack_a[i], stack_b[i], acc_fpu, out_fpu, bf16)
                status |= s
        else:
            starts = np.zeros((len(stack_a), m, n), np.float32) if init is None else \
                np.ascontiguousarray(np.broadcast_to(init, (*lead, m, n)).reshape(-1, m, n))
            out, status = self._matmul_stack(stack_a, stack_b, starts, acc_fpu, out_fpu, bf16)
        self._record(status, name, out.size)
        return out.view(fmt.dtype).reshape(*lead, m, n)

    def _matmul_stack(self, a: np.ndarray, b: np.ndarray, init: np.ndarray, acc_fpu: Fpu, out_fpu: Fpu,
                      bf16: bool) -> tuple[np.ndarray, int]:
        """Stacks of (M, K) @ (K, N) products from binary32 ``init`` sums in one compiled call
        (blocks of the stack on worker threads where the work is large): their output bits
        (S, M*N) and flags, not yet recorded; each product as :meth:`_matmul` computes it."""
        a16, b16 = np.ascontiguousarray(a).view(np.uint16), np.ascontiguousarray(b).view(np.uint16)
        count, m, n = len(a), a.shape[1], b.shape[2]
        out = np.empty((count, m * n), out_fpu.format.uint)
        flags = np.empty((count, m * n), np.uint8)
        settings = _rounding(acc_fpu, out_fpu, out.size)
        workers = min(self.threads, count) if a.size * n >= THREADED_MATMUL else 1
        if workers > 1:
            bounds = np.linspace(0, count, workers + 1).astype(int)
            parts = list(_pool(workers).map(
                lambda lo, hi: K.matmul_stack(a16[lo:hi], b16[lo:hi], init[lo:hi], out[lo:hi], flags[lo:hi],
                                              *settings, bf16), bounds[:-1], bounds[1:]))
        else:
            parts = [K.matmul_stack(a16, b16, init, out, flags, *settings, bf16)]
        status = functools.reduce(operator.or_, (p[0] for p in parts))
        special, nonfinite = np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])
        unit = self._fpus[BFLOAT16.dtype] if bf16 else self.fpu
        for i in np.flatnonzero(special | (nonfinite & bf16)):  # INVALID (bfloat16: OVERFLOW) inside the sums
            status |= K.matmul32_flags(a16[i], b16[i], unit.settings, init[i])
        return out, status

    def _matmul(self, a: np.ndarray, b: np.ndarray, acc_fpu: Fpu, out_fpu: Fpu, bf16: bool = False,
                init: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """One (M, K) @ (K, N) product: its output bits (flat) and flags, not yet recorded."""
        a16, b16 = np.ascontiguousarray(a).view(np.uint16), np.ascontiguousarray(b).view(np.uint16)
        m, n = a.shape[0], b.shape[1]
        out = np.empty(m * n, out_fpu.format.uint)
        flags = np.empty(m * n, np.uint8)
        workers = min(self.threads, m) if a.size * n >= THREADED_MATMUL else 1
        if acc_fpu is self.fpu:
            total = np.empty(m * n, np.uint16)
            status = K.matmul16(a16, b16, total.reshape(m, n), self.fpu.settings)
            return out, status | K.convert(total, out, flags, acc_fpu.settings, out_fpu.settings)
        settings = _rounding(acc_fpu, out_fpu, out.size)
        if init is None:
            init = np.zeros((m, n), np.float32)
        if workers == 1:
            status, special, nonfinite = K.matmul_from(a16, b16, init, out, flags, *settings, bf16)
        else:
            # Blocks of output rows on worker threads (the kernel releases the GIL): each
            # output element's sum is the same whichever block computes it.
            bounds = np.linspace(0, m, workers + 1).astype(int)
            parts = list(_pool(workers).map(
                lambda lo, hi: K.matmul_from(a16[lo:hi], b16, init[lo:hi], out[lo * n:hi * n], flags[lo * n:hi * n],
                                             *settings, bf16),
                bounds[:-1], bounds[1:]))
            status = functools.reduce(operator.or_, (p[0] for p in parts))
            special = any(p[1] for p in parts)
            nonfinite = any(p[2] for p in parts)
        if special or (bf16 and nonfinite):  # INVALID (and, for bfloat16, OVERFLOW) inside the sums
            unit = self._fpus[BFLOAT16.dtype] if bf16 else self.fpu
            status |= K.matmul32_flags(a16, b16, unit.settings, init)
        return out, status

    # -- convolution: im2col, then the matmul above --------------------------------
    def conv(self, x, w, stride=1, padding=0, dilation=1, groups: int = 1, bias=None, accumulate=None,
             out_dtype=None, fuse_bias: bool | None = None) -> np.ndarray:
        """N-d cross-correlation (torch's conv1d/2d/3d) of ``x`` (N, C, *S) with ``w``
        (O, C / groups, *K): (N, O, *OS). ``stride``, ``padding`` (zeros, both sides) and
        ``dilation`` are an int or one per spatial dimension.

        As the cube unit computes it, im2col then :meth:`matmul` (one device operation):
        per group, each output is one matmul row whose exact products x * w are added in
        ascending order of the reduction index (c, k1, ..., kd) (c slowest, the kernel's
        taps row-major), each addition rounded to ``accumulate`` from +0 (or from the
        bias, fused); padded positions are +0 operands. The sum is rounded once to
        ``out_dtype`` (default: the operands' dtype). ``bias`` (O,) is placed as
        :meth:`matmul`'s is.
        """
        return self._conv("conv", x, w, stride, padding, dilation, groups, bias, accumulate, out_dtype, fuse_bias)

    def _conv(self, name: str, x, w, stride, padding, dilation, groups, bias, accumulate, out_dtype,
              fuse_bias) -> np.ndarray:
        x, w = np.asarray(x), np.asarray(w)
        if out_dtype is None:
            out_dtype = x.dtype if x.dtype == BFLOAT16.dtype else np.float16
        fused = self._fused(bias, fuse_bias)
        y = conv.forward(x, w, stride, padding, dilation, groups, self._grouped(name, accumulate, out_dtype),
                         np.asarray(bias) if fused else None, name)
        if bias is not None and not fused:
            y = self.add(y, self._bias_operand(bias, y.dtype).reshape(1, w.shape[0], *[1] * (x.ndim - 2)))
        return y

    def _grouped(self, name: str, accumulate, out_dtype) -> conv.Product:
        """The cube's product of stacks of matrices, one per group, for :mod:`sim.conv`."""
        def product(a: np.ndarray, b: np.ndarray, init: np.ndarray | None) -> np.ndarray:
            if a.shape[0] == 1 and b.shape[0] == 1:
                return self._product(name, a[0], b[0], accumulate, out_dtype,
                                     init=None if init is None else init[0])[None]
            return self._product(name, a, b, accumulate, out_dtype, init=init)
        return product

    def conv2d(self, x, w, stride: int = 1, padding: int = 0, dilation: int = 1, accumulate=None,
               out_dtype=np.float16) -> np.ndarray:
        """2-D cross-correlation (torch's conv2d, groups=1) of binary16 ``x`` (N, C, H, W) with
        ``w`` (O, C, KH, KW): (N, O, OH, OW); :meth:`conv` in two dimensions.

        Each output is one matmul row: the products x * w, exact, added in ascending order
        of the reduction index (c, kh, kw) (c slowest), each addition rounded to
        ``accumulate`` as :meth:`matmul` does, from +0; padded positions are +0 operands.
        The sum is rounded once to ``out_dtype``. One device operation.
        """
        x, w = np.asarray(plain(x)), np.asarray(plain(w))
        if x.ndim != 4 or w.ndim != 4 or x.shape[1] != w.shape[1]:
            raise ValueError(f"conv2d needs x (N, C, H, W) and w (O, C, KH, KW), got {x.shape} and {w.shape}")
        for name, v, low in (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)):
            integer(f"conv2d: {name}", v, low)
        return self._conv("conv2d", x, w, stride, padding, dilation, 1, None, accumulate, out_dtype, None)

    def conv_grad_input(self, dy, w, input_size, stride=1, padding=0, dilation=1, groups: int = 1,
                        accumulate=None, out_dtype=None, bias=None, fuse_bias: bool | None = None) -> np.ndarray:
        """The gradient of :meth:`conv` with respect to its input (N, C, *input_size), from the
        output gradient ``dy`` (N, O, *OS) and the weight ``w`` (O, C / groups, *K); also a
        transposed convolution of ``dy`` with ``w``.

        As the cube unit computes it, a direct convolution (:meth:`conv`, stride 1): ``dy``
        with stride - 1 zeros stuffed between its elements and dilation * (K - 1) - padding
        zeros around it (cropped where negative), with the weight's taps reversed and its
        O and C / groups axes swapped per group. So each input gradient is one binary32 sum,
        from +0, of the exact products dy * w in ascending order of (o, the dy position), o
        slowest, stuffed zeros being +0 operands, rounded once. ``bias`` (C,) is placed
        as :meth:`conv` places it (a transposed convolution's bias).
        """
        dy, w = np.asarray(dy), np.asarray(w)
        z, flipped, dilation = conv.grad_input_operands(dy, w, input_size, stride, padding, dilation, groups)
        return self._conv("conv_grad_input", z, flipped, 1, 0, dilation, groups, bias, accumulate, out_dtype,
                          fuse_bias)

    def conv_grad_weight(self, x, dy, kernel_size, stride=1, padding=0, dilation=1, groups: int = 1,
                         accumulate=None, out_dtype=None) -> np.ndarray:
        """The gradient of :meth:`conv` with respect to its weight (O, C / groups, *kernel_size),
        from the input ``x`` (N, C, *S) and the output gradient ``dy`` (N, O, *OS).

        As the cube unit computes it, one matmul per group of dy^T (O/g, N*OS) with x's
        im2col (N*OS, C/g*K): each weight gradient is one binary32 sum, from +0, of the exact
        products in ascending order of (n, the output position row-major), n slowest, padded
        positions being +0 operands, rounded once.
        """
        x, dy = np.asarray(x), np.asarray(dy)
        if out_dtype is None:
            out_dtype = x.dtype if x.dtype == BFLOAT16.dtype else np.float16
        return conv.grad_weight(x, dy, kernel_size, stride, padding, dilation, groups,
                                self._grouped("conv_grad_weight", accumulate, out_dtype))

    def conv_transpose(self, x, w, stride=1, padding=0, output_padding=0, dilation=1, groups: int = 1,
                       bias=None, accumulate=None, out_dtype=None, fuse_bias: bool | None = None) -> np.ndarray:
        """Transposed convolution (torch's conv_transpose1d/2d/3d) of ``x`` (N, Cin, *S) with
        ``w`` (Cin, Cout / groups, *K): :meth:`conv_grad_input` of ``x`` for an input of
        (S - 1) * stride - 2 * padding + dilation * (K - 1) + output_padding + 1, in its order;
        ``bias`` (Cout,) as :meth:`conv` places it."""
        x, w = np.asarray(x), np.asarray(w)
        size = conv.transpose_size(x.shape, w.shape, stride, padding, output_padding, dilation)
        return self.conv_grad_input(x, w, size, stride, padding, dilation, groups, accumulate, out_dtype, bias,
                                    fuse_bias)

