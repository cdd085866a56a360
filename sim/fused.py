"""The fused operation families: which aten operations each takes, and its default model.

Each family of ``FAMILIES`` is computed by ``sim.torch.DeviceMode`` in one of two models,
chosen per family (``DeviceMode(dev, fused={"softmax": False})``):

- fused (``True``): as the NPU's fused kernel computes it: binary32 inside, from the exact values
  of the operands, in ``sim.torch_binary32.Binary32Mode`` (elementwise functions correctly rounded
  to binary32, reductions and products in fixed orders: the same bits on every host), then each
  output rounded once on the device into its dtype, so the register sees that rounding and the
  binary32 events that reach an output (an overflow, an invalid, a pole). Counted under the route
  ``fused``.
- unfused (``False``): the math decomposition in the tensor's own dtype, each piece an operation
  on the device (``add``, ``mul``, ``exp``, ``sum``, ``bmm``...), its backward the pieces' own
  backward, made by autograd.

``default`` is what a torch_npu user gets; ``source`` says where that comes from (the sources
are listed in docs/semantics.md). The ``aclnn*`` names are operators of CANN's operator API (the
hiascend.com "aolapi" reference, and the operator lists of gitcode.com/cann/ops-nn and ops-math,
``docs/zh/menu_aclnn_api.md``), the kernels torch_npu calls for the aten operations of each family.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Family", "FAMILIES", "BY_NAME", "choose"]


@dataclass(frozen=True)
class Family:
    """One family of fused operations."""

    name: str
    aten: tuple[str, ...]  #: aten overload packets taken by the fused route (forward and backward)
    default: bool  #: fused by default
    source: str  #: the kernel a torch_npu user runs, or why the default is unfused
    doc: str


FAMILIES: tuple[Family, ...] = (
    Family("attention", ("_scaled_dot_product_flash_attention_for_cpu",
                         "_scaled_dot_product_flash_attention_for_cpu_backward",
                         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
                         "_scaled_dot_product_attention_math"),
           True, "torch_npu.npu_fusion_attention (FlashAttentionScore)",
           "F.scaled_dot_product_attention (masks, causal, dropout inside the kernel) and its backward"),
    Family("layer_norm", ("native_layer_norm", "native_layer_norm_backward"), True, "aclnnLayerNorm",
           "F.layer_norm / nn.LayerNorm"),
    Family("rms_norm", ("_fused_rms_norm", "_fused_rms_norm_backward"), False,
           "F.rms_norm is decomposed by torch; the fused kernel is torch_npu.npu_rms_norm, called explicitly",
           "F.rms_norm / nn.RMSNorm"),
    Family("batch_norm", ("native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
                          "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
                          "batch_norm_backward"), True, "aclnnBatchNorm, aclnnBatchNormBackward",
           "F.batch_norm / nn.BatchNorm*d (running statistics updated inside)"),
    Family("group_norm", ("native_group_norm", "native_group_norm_backward"), True,
           "aclnnGroupNorm, aclnnGroupNormBackward", "F.group_norm / nn.GroupNorm"),
    Family("softmax", ("_softmax", "_softmax_backward_data", "_log_softmax", "_log_softmax_backward_data"), True,
           "aclnnSoftmax, aclnnLogSoftmax (and their backward)", "softmax and log_softmax"),
    Family("gelu", ("gelu", "gelu_", "gelu_backward"), True, "aclnnGelu, aclnnGeluBackward",
           "F.gelu, exact (erf) and tanh"),
    Family("silu", ("silu", "silu_", "silu_backward"), True, "aclnnSilu, aclnnSiluBackward", "F.silu / nn.SiLU"),
    Family("rnn", (), True,
           "torch.lstm / torch.gru on the NPU: the fused DynamicRNN (aclnnLSTM) and DynamicGRUV2 kernels; "
           "nn.RNN (torch.rnn_tanh / rnn_relu) modelled as the same kind of kernel (this project's choice)",
           "nn.LSTM / nn.GRU / nn.RNN on a padded batch or a packed sequence: every layer count, direction, bias, "
           "batch_first, projection and dropout between layers (sim.recurrent)"),
    Family("cross_entropy", ("nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward"),
           True, "aclnnNLLLoss, aclnnNLLLossBackward (after the log_softmax of the softmax family)",
           "F.cross_entropy / F.nll_loss: the negative log-likelihood part"),
    Family("embedding_backward", ("embedding_dense_backward",), True,
           "aclnnEmbeddingDenseBackward (EmbeddingDenseGrad: each float16/bfloat16 gradient row cast to binary32, "
           "the rows of one index summed in binary32, the sum cast once to the output dtype), hicann/ops-nn "
           "index/embedding_dense_grad/op_kernel/arch35/embedding_dense_grad_base.h, ProcessPerGradGroup; "
           "no unfused model: chosen unfused, it takes the float32 route",
           "the weight gradient of F.embedding / nn.Embedding: a gradient accumulation"),
    Family("embedding_bag", ("_embedding_bag", "_embedding_bag_backward", "_embedding_bag_per_sample_weights_backward"),
           True, "aclnnEmbeddingBag (the hiascend.com aolapi reference) and its gradients: the fused model (each "
           "bag's rows, times their per-sample weights, added in order in binary32, a mean divided by its count, one "
           "rounding per output; the gradients accumulated into the rows in position order), the kernels' own order "
           "inside not modelled; max is an exact selection; no unfused model: chosen unfused, it takes the float32 "
           "route",
           "F.embedding_bag / nn.EmbeddingBag (sum, mean and max bags, per-sample weights, padding) and its dense "
           "gradients"),
    Family("max_pool_backward", ("max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward",
                                  "adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward"), True,
           "MaxPoolGradWithArgmaxV3 (each input's gradient summed in binary32 over the overlapping windows whose "
           "argmax it is, cast once to the output dtype), hicann/ops-nn pooling/max_pool_grad_with_argmax_v3/"
           "op_kernel/arch35/max_pool_grad_with_argmax_v3_simt.h, MaxPoolGradWithArgmaxNchw; the 3-d and "
           "adaptive kernels (aclnnMaxPool3dWithArgmaxBackward, aclnnAdaptiveMaxPool2dBackward) taken by the "
           "same model; no unfused model: chosen unfused, it takes the float32 route",
           "the input gradient of F.max_pool2d/3d and F.adaptive_max_pool2d/3d: overlapping windows' gradients "
           "accumulated"),
    Family("avg_pool", ("avg_pool2d", "avg_pool2d_backward", "avg_pool3d", "avg_pool3d_backward",
                        "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d",
                        "_adaptive_avg_pool3d_backward"), True,
           "aclnnAvgPool2d, aclnnAvgPool3d, aclnnAdaptiveAvgPool2d, aclnnAdaptiveAvgPool3d and their backward: "
           "the fused model (a window's sum and its division in binary32, one rounding), the kernels' own order "
           "inside not modelled; no unfused model: chosen unfused, it takes the float32 route",
           "F.avg_pool1d/2d/3d, F.adaptive_avg_pool2d/3d to more than one output (one output is a mean, on the "
           "device) and their input gradients"),
    Family("upsample", tuple(f"{kind}{suffix}" for kind in (
        "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
        "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
        "_upsample_bilinear2d_aa", "upsample_bicubic2d", "upsample_trilinear3d") for suffix in ("", "_backward")),
           True, "aclnnUpsampleNearest1d/2d/3d, aclnnUpsampleLinear1d, aclnnUpsampleBilinear2d, "
           "aclnnUpsampleBicubic2d, aclnnUpsampleTrilinear3d and their backward: the fused model (interpolation "
           "weights and sums in binary32, one rounding), the kernels' own order inside not modelled; no unfused "
           "model: chosen unfused, it takes the float32 route",
           "F.interpolate / nn.Upsample (nearest: a copy, exact either way) and their input gradients, where "
           "overlapping contributions are summed"),
    Family("activation", ("hardtanh", "hardtanh_", "hardtanh_backward", "leaky_relu", "leaky_relu_",
                          "leaky_relu_backward", "elu", "elu_", "elu_backward", "celu", "celu_", "softplus",
                          "softplus_backward", "mish", "mish_", "mish_backward", "log_sigmoid_forward",
                          "log_sigmoid_backward", "glu", "glu_backward", "_prelu_kernel", "_prelu_kernel_backward",
                          "hardshrink", "hardshrink_backward", "softshrink", "softshrink_backward",
                          "rrelu_with_noise_backward"), True,
           "aclnnHardtanh, aclnnLeakyRelu, aclnnElu, aclnnCelu, aclnnSoftplus, aclnnMish, aclnnLogSigmoid, aclnnGlu, "
           "aclnnPrelu, aclnnHardshrink, aclnnSoftshrink and their backward, and rrelu's (aclnnRReluWithNoise's "
           "gradient: the noise the forward drew times the gradient): the fused model (binary32 inside, one "
           "rounding per output); no unfused model: chosen unfused, it takes the float32 route",
           "the other activations: F.hardtanh / F.relu6 / nn.ReLU6, leaky_relu, elu / selu / celu, softplus, "
           "mish, logsigmoid, glu, prelu, hardshrink, softshrink (clamps and selections are exact either way)"),
    Family("reduction", ("var", "std", "var_mean", "std_mean", "linalg_vector_norm", "norm", "logsumexp", "prod",
                         "cumsum", "cumsum_", "cumprod", "nansum", "dot", "vdot", "mv", "addmv", "addmv_", "addr",
                         "addr_", "trace", "renorm", "renorm_", "dist", "logcumsumexp", "_cdist_forward",
                         "_cdist_backward", "_pdist_forward", "_pdist_backward", "embedding_renorm_", "_trilinear"),
           True,
           "aclnnVar, aclnnStd, aclnnVarMean, aclnnStdMeanCorrection, aclnnLinalgVectorNorm, aclnnNorm, "
           "aclnnLogSumExp, aclnnProd, aclnnCumsum, aclnnCumprod, aclnnReduceNansum, aclnnDot, aclnnMv, aclnnAddmv, "
           "aclnnAddr, aclnnTrace, aclnnRenorm, aclnnEmbeddingRenorm (nn.Embedding's max_norm: each looked-up "
           "row's norm, the rows beyond it scaled, written back rounded); dist is a vector norm of the difference, "
           "and, this project's choices: cdist and pdist those of every pair of rows, F.bilinear's _trilinear the "
           "products summed by the fixed tree, logcumsumexp (no kernel of its own there) torch's recurrence in "
           "binary32. The fused model (binary32 accumulation, one rounding per output), the kernels' own order "
           "inside not modelled; no unfused model: chosen unfused, it takes the float32 route",
           "the reductions beyond sum, mean, amax and amin (those are the device's own): var and std, vector "
           "norms (F.normalize, gradient clipping's norm), logsumexp, logcumsumexp, prod, cumsum and cumprod, "
           "nansum, the vector products (dot, mv, addmv, addr), trace, renorm, dist, cdist and pdist, F.bilinear "
           "and nn.Embedding's max_norm"),
    Family("pad_fold", ("reflection_pad1d_backward", "reflection_pad2d_backward", "reflection_pad3d_backward",
                        "replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward",
                        "col2im", "unfold_backward"), True,
           "aclnnReflectionPad1d/2d/3dBackward, aclnnReplicationPad1d/2d/3dBackward, aclnnUnfoldGrad (hicann/ops-math "
           "docs/zh/menu_aclnn_api.md) and F.fold's col2im, the inverse of aclnnIm2col: the fused model (the "
           "gradients that meet at one place summed in binary32, one rounding), the kernels' own order inside not "
           "modelled; no unfused model: chosen unfused, it takes the float32 route",
           "the input gradients of reflection and replication padding and of Tensor.unfold, and F.fold: "
           "overlapping contributions summed (the forward copies are exact)"),
    Family("weight_norm", ("_weight_norm_interface", "_weight_norm_interface_backward"), True,
           "at::_weight_norm_interface, which at::_weight_norm calls on every device for the first or last "
           "dimension (pytorch aten/src/ATen/native/WeightNorm.cpp, can_use_fused): CANN's operator lists have no "
           "kernel of its own, so it is modelled as a fused kernel (this project's choice): w = v * (g / ||v||) "
           "and its backward (torch's analytic formulas, _weight_norm_differentiable_backward) in binary32, one "
           "rounding per output, the norms kept in binary32 as torch's kernel keeps them; no unfused model: "
           "chosen unfused, it takes the float32 route",
           "torch.nn.utils.weight_norm and parametrizations.weight_norm (Wav2Vec2's, HuBERT's and WavLM's "
           "positional convolution, vocoders)"),
    Family("math", tuple(f"{name}{suffix}" for name in (
        "sin", "cos", "tan", "sinh", "cosh", "asin", "acos", "atan", "expm1", "log1p", "log2", "log10", "exp2",
        "erfinv", "atan2", "fmod", "remainder", "xlogy", "sinc", "logit", "floor_divide", "hypot", "deg2rad")
        for suffix in ("", "_")) + ("logaddexp", "logaddexp2", "logit_backward", "linalg_cross"), True,
           "aclnnSin, aclnnCos, aclnnTan, aclnnSinh, aclnnCosh, aclnnAsin, aclnnAcos, aclnnAtan, aclnnAtan2, "
           "aclnnExpm1, aclnnLog1p, aclnnLog2, aclnnLog10, aclnnExp2, aclnnErfinv, aclnnFmodScalar/Tensor, "
           "aclnnRemainderTensorScalar/TensorTensor/ScalarTensor, aclnnXLogYTensor, aclnnSinc, aclnnLogit, "
           "aclnnLogitGrad, aclnnFloorDivide, aclnnLogAddExp, aclnnLogAddExp2, aclnnLinalgCross (hicann/ops-math "
           "docs/zh/menu_aclnn_api.md), and pow's general kernels (aclnnPowTensorScalar for exponents the Pows "
           "kernel does not take, aclnnPowTensorTensor, aclnnPowScalarTensor); hypot and deg2rad, which have no "
           "kernel of their own there, modelled the same way (this project's choice): the fused model (binary32 "
           "inside, one rounding); the device's own exp, log, sqrt, rsqrt, erf, tanh and sigmoid are correctly "
           "rounded operations instead; no unfused model: chosen unfused, it takes the float32 route",
           "the elementary functions the device table does not have, remainders, xlogy, logit, logaddexp, "
           "cross products and general powers (their backward: device operations)"),
    Family("accumulate", ("index_put", "index_put_", "_index_put_impl_", "index_add", "index_add_", "scatter_add",
                          "scatter_add_"), True,
           "aclnnIndexPutImpl, aclnnIndexAdd, aclnnScatterAdd: the fused model (the values, and the destination's "
           "where they accumulate onto it, summed in binary32 in index order, one rounding per element written), "
           "the kernels' own order inside not modelled; a put without accumulation is exact either way; no "
           "unfused model: chosen unfused, it takes the float32 route",
           "tensor[index] = values, index_put_/index_add_/scatter_add_ (indexing's gradient among them)"),
    Family("grid", ("affine_grid_generator", "grid_sampler_2d", "grid_sampler_2d_backward"), True,
           "aclnnAffineGrid, aclnnGridSampler2D, aclnnGridSampler2DBackward: the fused model (torch's "
           "decompositions evaluated in binary32, a sampling's gradients autograd of its decomposition, index "
           "accumulations in order), the kernels' own order inside not modelled; affine_grid's gradient is a "
           "batched product of the device; no unfused model: chosen unfused, it takes the float32 route",
           "F.affine_grid and F.grid_sample in 2-d (spatial transformers, deformable sampling) and the "
           "gradients of grid_sample"),
    Family("pointwise", ("addcmul", "addcmul_", "addcdiv", "addcdiv_", "lerp", "lerp_"), True,
           "aclnnAddcmul, aclnnAddcdiv, aclnnLerp (and their in-place forms): the fused model (binary32 inside, one "
           "rounding); no unfused model: chosen unfused, it takes the float32 route",
           "the optimizers' fused pointwise updates (Adam's addcmul_, addcdiv_ and lerp_ on float16 or bfloat16 "
           "state) and the same functions in models"),
    Family("loss", ("mse_loss", "mse_loss_backward", "smooth_l1_loss", "smooth_l1_loss_backward", "huber_loss",
                    "huber_loss_backward", "binary_cross_entropy", "binary_cross_entropy_backward",
                    "binary_cross_entropy_with_logits", "soft_margin_loss", "soft_margin_loss_backward",
                    "multi_margin_loss", "multi_margin_loss_backward", "_ctc_loss", "_ctc_loss_backward"), True,
           "aclnnMseLoss, aclnnSmoothL1Loss, aclnnHuberLoss, aclnnBinaryCrossEntropy, "
           "aclnnBinaryCrossEntropyWithLogits, aclnnSoftMarginLoss and their backward: the fused model (binary32 "
           "inside, one rounding per output); multi_margin_loss, which has no kernel of its own there, "
           "modelled the same way (this project's choice) in the order of torch's CPU kernel "
           "(LossMultiMargin.cpp); aclnnCtcLoss and aclnnCtcLossBackward: torch's CPU recurrences (LossCTC.cpp) "
           "in binary32, exp and log correctly rounded, the loss alone judged for events (its log-space alphas "
           "are -inf by design); no unfused model: chosen unfused, it takes the float32 route",
           "losses computed in float16 or bfloat16 (a mixed-precision loop usually computes them in float32), "
           "F.multi_margin_loss and F.ctc_loss"),
)

#: The families by name.
BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}


def choose(fused: bool | Mapping[str, bool] | None = None) -> dict[str, bool]:
    """Each family's model: the defaults, all ``True``/``False`` for a bool, or the defaults
    updated by a mapping of family names (an unknown name raises ValueError)."""
    if isinstance(fused, bool):
        return {f.name: fused for f in FAMILIES}
    chosen = {f.name: f.default for f in FAMILIES}
    for name, value in (fused or {}).items():
        if name not in chosen:
            raise ValueError(f"unknown fused family {name!r}; the families are {', '.join(chosen)}")
        chosen[name] = bool(value)
    return chosen
