"""A zoo of small real models for sim.torch.DeviceMode, built from their libraries' own
definitions with random weights (no download): torchvision, timm, transformers and torch.nn.

Each entry of ``ZOO`` names its library (``pytest.importorskip`` it before building) and its
config; ``build(name)`` returns the model in float32 (seeded) and a batch of 2 (3x32x32 images
or 16-token sequences, the second ending in padding for an entry with ``extra["padded"]``);
``loss(model, batch)`` is the cross-entropy of its logits in float32, the way a mixed-precision
loop computes it. Shared by tests/sim_tests/torch_tests/test_zoo.py and bench/bench_zoo.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

CLASSES, TOKENS, VOCAB, BATCH = 10, 16, 64, 2


@dataclass
class Batch:
    """A model's inputs (keyword arguments) and its integer targets."""

    inputs: dict[str, torch.Tensor]
    target: torch.Tensor

    def to(self, dtype: torch.dtype) -> Batch:
        """The batch with its floating inputs in ``dtype``."""
        return Batch({k: v.to(dtype) if v.is_floating_point() else v for k, v in self.inputs.items()}, self.target)


@dataclass
class Entry:
    """A zoo model: its library (the module to import), its config, and how it is made."""

    library: str
    config: str
    make: Callable[[], torch.nn.Module]
    kind: str = "image"  # image, tokens, seq2seq or sequence
    extra: dict[str, Any] = field(default_factory=dict)


def torchvision() -> types.ModuleType:
    """torchvision.models. The registry's torchvision wheel is built against CUDA torch, so beside
    the CPU torch its C++ operators fail to load and its fake-kernel registrations raise at import;
    the model definitions are pure Python and need neither, so those two modules are stood in for."""
    try:
        return importlib.import_module("torchvision.models")
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    for name in ("_meta_registrations", "_autograd_registrations"):
        sys.modules[f"torchvision.{name}"] = types.ModuleType(f"torchvision.{name}")
    return importlib.import_module("torchvision.models")


def transformers() -> types.ModuleType:
    """transformers, or the test skipped without it; it imports torchvision where that is
    installed, so torchvision's two failing modules are stood in for first (see torchvision)."""
    import pytest

    if importlib.util.find_spec("torchvision") is not None:
        torchvision()
    module = pytest.importorskip("transformers")
    module.logging.set_verbosity_error()
    return module


def _timm() -> types.ModuleType:
    torchvision()  # timm imports torchvision
    return importlib.import_module("timm")


def _resnet18() -> torch.nn.Module:
    return torchvision().resnet18(num_classes=CLASSES)


def _mobilenet_v3_small() -> torch.nn.Module:
    torchvision()
    from torchvision.models.mobilenetv3 import MobileNetV3, _mobilenet_v3_conf
    return MobileNetV3(*_mobilenet_v3_conf("mobilenet_v3_small", width_mult=0.5), num_classes=CLASSES)


def _efficientnet_b0() -> torch.nn.Module:
    torchvision()
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.5, depth_mult=0.5)
    return EfficientNet(setting, dropout=0.2, stochastic_depth_prob=0.2, num_classes=CLASSES, last_channel=last)


def _vit_tiny() -> torch.nn.Module:
    return _timm().create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=CLASSES)


def _convnext_atto() -> torch.nn.Module:
    return _timm().create_model("convnext_atto", depths=(1, 1, 2, 1), drop_path_rate=0.1, num_classes=CLASSES)


def _hf(config: str, model: str, **kw: Any) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        try:  # transformers imports torchvision where it is installed
            torchvision()
        except ImportError:
            pass
        transformers = importlib.import_module("transformers")
        return getattr(transformers, model)(getattr(transformers, config)(**kw))
    return make


class Recurrent(torch.nn.Module):
    """An embedding, a 2-layer recurrent network (batch first; ``kw`` the rest of its configuration)
    and a linear head on every step."""

    def __init__(self, rnn: type, width: int = 32, vocab: int = VOCAB, **kw: Any) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.rnn = rnn(width, width, num_layers=2, batch_first=True, **kw)
        out = kw.get("proj_size") or width
        self.head = torch.nn.Linear(out * (2 if kw.get("bidirectional") else 1), vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(input_ids))[0])


class PackedRecurrent(Recurrent):
    """:class:`Recurrent` on a packed batch: the sequences shortened by 3 tokens each from the
    second on (at least one left), packed, run and padded back (zeros after each end)."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        steps = input_ids.shape[1]
        lengths = (steps - 3 * torch.arange(input_ids.shape[0])).clamp(min=1)
        packed = pack_padded_sequence(self.embed(input_ids), lengths, batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(self.rnn(packed)[0], batch_first=True, total_length=steps)
        return self.head(out)


class EmbeddingNorm(torch.nn.Module):
    """Word embeddings (1000 words, width 64), BatchNorm1d over the features, dropout and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(1000, 64)
        self.norm = torch.nn.BatchNorm1d(64)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(64, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        e = self.norm(self.embed(input_ids).transpose(1, 2)).transpose(1, 2)
        return self.head(self.drop(e))


class ConvZoo(torch.nn.Module):
    """The convolution and normalisation kinds the other models lack: strided Conv2d, GroupNorm,
    ConvTranspose2d, InstanceNorm (affine), PReLU, a grouped Conv1d, Conv3d after average pooling,
    bilinear upsampling, ReLU6 and leaky ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.gn = torch.nn.GroupNorm(2, 8)
        self.up = torch.nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)
        self.inorm = torch.nn.InstanceNorm2d(4, affine=True)
        self.prelu = torch.nn.PReLU()
        self.conv1d = torch.nn.Conv1d(4, 4, 5, padding=2, groups=2)
        self.conv3d = torch.nn.Conv3d(1, 2, 3, padding=1)
        self.head = torch.nn.Linear(4 * 32 + 2 * 4 * 16 * 16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.prelu(self.inorm(self.up(F.relu6(self.gn(self.conv(x))))))  # (N, 4, 32, 32)
        a = F.leaky_relu(self.conv1d(y.mean(-1)), 0.1)  # (N, 4, 32)
        b = self.conv3d(F.avg_pool2d(y, 2).unsqueeze(1))  # (N, 2, 4, 16, 16)
        z = F.interpolate(x, scale_factor=2, mode="bilinear").mean((1, 2, 3))[:, None]
        return self.head(torch.cat([a.flatten(1), b.flatten(1)], 1)) + z


class RareRoutes(torch.nn.Module):
    """The rarer kernels in one image model: a spatial transformer (affine_grid, grid_sample), a
    bag of embeddings with max_norm over indices read from the image, a bilinear layer, distances
    to class prototypes (cdist) less a pdist regulariser, and a running logsumexp."""

    def __init__(self) -> None:
        super().__init__()
        self.loc = torch.nn.Linear(3 * 8 * 8, 6)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.feature = torch.nn.Linear(8 * 2 * 2, 16)
        self.bag = torch.nn.EmbeddingBag(64, 16, mode="mean", max_norm=2.0)
        self.mix = torch.nn.Bilinear(16, 16, 16)
        self.protos = torch.nn.Parameter(torch.randn(CLASSES, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = torch.tensor([1.0, 0, 0, 0, 1, 0], dtype=x.dtype)
        theta = (identity + 0.1 * self.loc(F.avg_pool2d(x, 4).flatten(1))).view(-1, 2, 3)
        x = F.grid_sample(x, F.affine_grid(theta, list(x.shape), align_corners=False), align_corners=False)
        f = self.feature(F.adaptive_avg_pool2d(F.relu(self.conv(x)), 2).flatten(1))
        words = (x[:, 0, :4, :4].flatten(1).sigmoid() * 63).long()
        z = self.mix(f, self.bag(words))
        # every running logsumexp used: its gradient's formula takes log |g|, which a zero g makes -inf
        running = torch.logcumsumexp(z, 1).mean(1, keepdim=True)
        return running - torch.cdist(z, self.protos) - 0.01 * F.pdist(self.protos).mean()


class SDPABlock(torch.nn.Module):
    """A causal pre-norm transformer layer whose attention is ``F.scaled_dot_product_attention``
    (with dropout), on token embeddings, and a linear head."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(VOCAB, width)
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))
        self.head = torch.nn.Linear(width, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        x = x + self.mlp(self.norm2(x))
        return self.head(x)


class GPT2Eager4(torch.nn.Module):
    """GPT-2 as transformers 4.x computed its eager attention: transformers' own GPT2LMHeadModel
    (``attn_implementation="eager"``) with the eager attention function swapped, during the
    forward pass only, for the 4.x formula, and the padding mask made as 4.x made it.

    Read at huggingface/transformers commit 0010f60284ab4b9d14b7df9c6525b1a2ad44e640 (a 4.x
    revision: it warns that ``parallelize`` goes in v5), src/transformers/models/gpt2/modeling_gpt2.py:
    ``GPT2Attention._attn`` divides the scores by ``sqrt(head_dim)`` (and by ``layer_idx + 1``
    with ``scale_attn_by_inverse_layer_idx``), puts ``torch.finfo(dtype).min`` where the causal
    buffer ``bias`` (a lower triangle of ones) is false, by ``torch.where``, then adds
    ``attention_mask``; ``GPT2Model.forward`` made that mask ``(1.0 - attention_mask[:, None,
    None, :]) * torch.finfo(self.dtype).min`` in the model's dtype. A key both after the query and
    padded gets min + min: in float16 -65504 + -65504, an overflow to -inf (or, saturating,
    -65504), which the softmax turns into 0 as it does any masked score. transformers 5 (5.24's
    modeling_gpt2.py, ``eager_attention_forward``) adds one mask, once, that
    ``masking_utils.create_causal_mask`` combined, so it no longer overflows there."""

    def __init__(self, **config: Any) -> None:
        super().__init__()
        hf = transformers()
        self.model = hf.GPT2LMHeadModel(hf.GPT2Config(attn_implementation="eager", **config))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Any:
        padding = None
        if attention_mask is not None:  # 4.x's GPT2Model.forward
            dtype = self.model.dtype
            padding = (1.0 - attention_mask.view(input_ids.shape[0], -1)[:, None, None, :].to(dtype)) * \
                torch.finfo(dtype).min
        from transformers.models.gpt2 import modeling_gpt2 as module

        eager, module.eager_attention_forward = module.eager_attention_forward, _attention_4x
        try:
            return self.model(input_ids=input_ids, gpt2_4x_padding=padding)
        finally:
            module.eager_attention_forward = eager


def _attention_4x(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                  gpt2_4x_padding: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers 4.x's ``GPT2Attention._attn`` (see :class:`GPT2Eager4`) in transformers 5's
    eager-function interface (output heads transposed to the sequence axis); the combined mask
    transformers 5 passes is not used: 4.x masked causally itself and added only the padding."""
    w = torch.matmul(query, key.transpose(-1, -2))
    if module.scale_attn_weights:
        w = w / torch.full([], value.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
    if module.scale_attn_by_inverse_layer_idx:
        w = w / float(module.layer_idx + 1)
    q, k = query.size(-2), key.size(-2)
    causal = torch.tril(torch.ones(k, k, dtype=torch.bool, device=w.device))[k - q:k, :k]
    w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device))
    if gpt2_4x_padding is not None:
        w = w + gpt2_4x_padding
    w = F.softmax(w, dim=-1).type(value.dtype)
    w = F.dropout(w, p=dropout, training=module.training)
    return torch.matmul(w, value).transpose(1, 2), w


_TINY = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)

ZOO: dict[str, Entry] = {
    "resnet18": Entry("torchvision", "resnet18(num_classes=10)", _resnet18),
    "mobilenet_v3_small": Entry("torchvision", "MobileNetV3 small, width_mult=0.5", _mobilenet_v3_small),
    "efficientnet_b0": Entry("torchvision", "EfficientNet-B0, width_mult=0.5, depth_mult=0.5, stochastic depth 0.2",
                             _efficientnet_b0),
    "vit_tiny": Entry("timm", "vit_tiny_patch16_224(img_size=32, patch_size=8, depth=2)", _vit_tiny),
    "convnext_atto": Entry("timm", "convnext_atto(depths=(1, 1, 2, 1), drop_path_rate=0.1)", _convnext_atto),
    "gpt2": Entry("transformers", "GPT2LMHeadModel, 2 layers, width 32, 4 heads",
                  _hf("GPT2Config", "GPT2LMHeadModel", vocab_size=VOCAB, n_positions=TOKENS, n_embd=32, n_layer=2,
                      n_head=4), "tokens"),
    "gpt2_eager4": Entry("transformers", "GPT2Eager4: GPT2LMHeadModel, 2 layers, width 32, 2 heads, transformers "
                         "4.x's eager attention; padded batch", lambda: GPT2Eager4(
                             vocab_size=VOCAB, n_positions=TOKENS, n_embd=32, n_layer=2, n_head=2), "tokens",
                         {"padded": TOKENS // 4}),
    "bert": Entry("transformers", "BertForMaskedLM, 2 layers, width 32, 4 heads",
                  _hf("BertConfig", "BertForMaskedLM", max_position_embeddings=TOKENS, **_TINY), "tokens"),
    "llama": Entry("transformers", "LlamaForCausalLM, 2 layers, width 32, 4 heads (2 key/value)",
                   _hf("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=2, max_position_embeddings=TOKENS,
                       **_TINY), "tokens"),
    "t5": Entry("transformers", "T5ForConditionalGeneration, 2+2 layers, d_model 32, 4 heads",
                _hf("T5Config", "T5ForConditionalGeneration", vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64,
                    num_layers=2, num_heads=4, decoder_start_token_id=0), "seq2seq"),
    "hf_vit": Entry("transformers", "ViTForImageClassification, 32x32 images, patch 8, 2 layers, width 32",
                    _hf("ViTConfig", "ViTForImageClassification", image_size=32, patch_size=8, num_labels=CLASSES, **{
                            k: v for k, v in _TINY.items() if k != "vocab_size"})),
    "mobilenet_v2": Entry("torchvision", "mobilenet_v2(width_mult=0.5): ReLU6", lambda: torchvision().mobilenet_v2(
        width_mult=0.5, num_classes=CLASSES)),
    "densenet": Entry("torchvision", "DenseNet(growth_rate=8, block_config=(2, 2)): average pooling",
                      lambda: torchvision().DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16,
                                                     num_classes=CLASSES)),
    "swin": Entry("torchvision", "SwinTransformer(embed_dim 16, depths (2, 2), window 4): shifted-window masks, "
                  "stochastic depth", lambda: torchvision().SwinTransformer(
                      patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
                      stochastic_depth_prob=0.1, num_classes=CLASSES)),
    "bloom": Entry("transformers", "BloomForCausalLM, 2 layers, width 32, 4 heads: ALiBi through baddbmm",
                   _hf("BloomConfig", "BloomForCausalLM", vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4),
                   "tokens"),
    "convs": Entry("torch", "ConvZoo: GroupNorm, ConvTranspose2d, InstanceNorm, PReLU, Conv1d, Conv3d, upsampling",
                   ConvZoo),
    "lstm": Entry("torch", "nn.LSTM 32-32, 2 layers, batch first, embedding and head", lambda: Recurrent(
        torch.nn.LSTM), "tokens"),
    "gru": Entry("torch", "nn.GRU 32-32, 2 layers, batch first, embedding and head", lambda: Recurrent(torch.nn.GRU),
                 "tokens"),
    "lstm_lm": Entry("torch", "nn.LSTM language model: 1000 words, width 64, 2 layers, dropout 0.1 between them",
                     lambda: Recurrent(torch.nn.LSTM, 64, 1000, dropout=0.1), "tokens"),
    "gru_lm": Entry("torch", "nn.GRU language model: 1000 words, width 64, 2 layers, dropout 0.1 between them",
                    lambda: Recurrent(torch.nn.GRU, 64, 1000, dropout=0.1), "tokens"),
    "rnn_tanh": Entry("torch", "nn.RNN (tanh) language model: 1000 words, width 64, 2 layers",
                      lambda: Recurrent(torch.nn.RNN, 64, 1000), "tokens"),
    "bilstm_proj": Entry("torch", "bidirectional nn.LSTM 32-32 with projections to 16, 2 layers, dropout 0.2",
                         lambda: Recurrent(torch.nn.LSTM, bidirectional=True, proj_size=16, dropout=0.2), "tokens"),
    "lstm_packed": Entry("torch", "bidirectional nn.LSTM 32-32 on a packed batch of unequal lengths, 2 layers, "
                         "dropout 0.2", lambda: PackedRecurrent(torch.nn.LSTM, bidirectional=True, dropout=0.2),
                         "tokens"),
    "gru_packed": Entry("torch", "nn.GRU 32-32 on a packed batch of unequal lengths, 2 layers",
                        lambda: PackedRecurrent(torch.nn.GRU), "tokens"),
    "embed_norm": Entry("torch", "embedding (1000 words, width 64), BatchNorm1d, dropout 0.1 and a head",
                        EmbeddingNorm, "tokens"),
    "sdpa": Entry("torch", "a causal transformer layer on F.scaled_dot_product_attention (dropout 0.1), width 32",
                  SDPABlock, "tokens"),
    "rare_routes": Entry("torch", "RareRoutes: spatial transformer, EmbeddingBag with max_norm, Bilinear, cdist, "
                         "pdist, logcumsumexp", RareRoutes),
}


def build(name: str, seed: int = 0, batch: int = BATCH) -> tuple[torch.nn.Module, Batch]:
    """Model ``name`` in float32 (train mode, weights seeded) and a batch of ``batch`` examples
    (float32 images, or token sequences)."""
    entry = ZOO[name]
    torch.manual_seed(seed)
    model = entry.make().train()
    g = torch.Generator().manual_seed(seed)
    if entry.kind == "image":
        x = torch.randn(batch, 3, 32, 32, generator=g)
        examples = Batch({"x": x}, torch.randint(0, CLASSES, (batch,), generator=g))
    else:
        ids = torch.randint(1, VOCAB, (batch, TOKENS), generator=g)
        inputs = {"input_ids": ids}
        if entry.kind == "seq2seq":
            inputs["decoder_input_ids"] = torch.roll(ids, 1, 1)
        target = torch.roll(ids, -1, 1)
        if "padded" in entry.extra:
            inputs["attention_mask"], target = padded(target, entry.extra["padded"])
        examples = Batch(inputs, target)
    if entry.library == "transformers" and entry.kind == "image":
        examples = Batch({"pixel_values": examples.inputs["x"]}, examples.target)
    return model, examples


def padded(target: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention mask of a batch whose every second sequence ends in ``pad`` padding tokens
    (zeros there, ones elsewhere), and ``target`` with -100 (cross-entropy's ``ignore_index``)
    at the padding, as a padded language-model batch has them."""
    mask = torch.ones_like(target)
    mask[1::2, target.shape[1] - pad:] = 0
    return mask, target.masked_fill(mask == 0, -100)


def logits(out: Any) -> torch.Tensor:
    """The logits of a model's output: a tensor, a transformers ModelOutput, or a tuple's first."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits"):
        return out.logits
    return out[0]


def loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """The float32 cross-entropy of ``model``'s logits on ``batch`` (images or next tokens)."""
    if "x" in batch.inputs:
        out = model(batch.inputs["x"])
    else:
        out = model(**batch.inputs)
    z = logits(out).float()
    return F.cross_entropy(z.reshape(-1, z.shape[-1]), batch.target.reshape(-1))
