"""The fused operation families: which aten operations each takes, and its default model.

Each family of ``FAMILIES`` is computed by ``sim.torch.DeviceMode`` in one of two models,
chosen per family (``DeviceMode(dev, fused={"softmax": False})``):

- fused (``True``): as the NPU's fused kernel computes it: binary32 inside (torch computes the
  operation in float32 from the exact binary32 values of the operands), then each output rounded
  once on the device into its dtype, so the register sees that rounding (and a binary32 overflow
  inside, as an Inf reaching it). Counted under the route ``fused``.
- unfused (``False``): the math decomposition in the tensor's own dtype, each piece an operation
  on the device (``add``, ``mul``, ``exp``, ``sum``, ``bmm``...), its backward the pieces' own
  backward, made by autograd.

``default`` is what a torch_npu user gets; ``source`` says where that comes from (the sources
are listed in docs/semantics.md).
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
           "torch.lstm / torch.gru on the NPU: the fused DynamicRNN (aclnnLSTM) and DynamicGRUV2 kernels",
           "nn.LSTM / nn.GRU (torch.lstm, torch.gru) on a padded batch, without dropout between layers"),
    Family("cross_entropy", ("nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward"),
           True, "aclnnNLLLoss, aclnnNLLLossBackward (after the log_softmax of the softmax family)",
           "F.cross_entropy / F.nll_loss: the negative log-likelihood part"),
    Family("embedding_backward", ("embedding_dense_backward",), True,
           "aclnnEmbeddingDenseBackward (EmbeddingDenseGrad: each float16/bfloat16 gradient row cast to binary32, "
           "the rows of one index summed in binary32, the sum cast once to the output dtype), hicann/ops-nn "
           "index/embedding_dense_grad/op_kernel/arch35/embedding_dense_grad_base.h, ProcessPerGradGroup; "
           "no unfused model: chosen unfused, it takes the float32 route",
           "the weight gradient of F.embedding / nn.Embedding: a gradient accumulation"),
    Family("max_pool_backward", ("max_pool2d_with_indices_backward",), True,
           "MaxPoolGradWithArgmaxV3 (each input's gradient summed in binary32 over the overlapping windows whose "
           "argmax it is, cast once to the output dtype), hicann/ops-nn pooling/max_pool_grad_with_argmax_v3/"
           "op_kernel/arch35/max_pool_grad_with_argmax_v3_simt.h, MaxPoolGradWithArgmaxNchw; no unfused model: "
           "chosen unfused, it takes the float32 route",
           "the input gradient of F.max_pool2d / nn.MaxPool2d: overlapping windows' gradients accumulated"),
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
