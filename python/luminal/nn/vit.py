"""ViT (Dosovitskiy et al.): patch embedding, a class token and learned positions, pre-norm transformer layers.

Parameter names are those of transformers' ViTModel (`embeddings.patch_embeddings.projection.weight`,
`layers.0.attention.q_proj.weight`, ...); checkpoints saved with the older layout (`encoder.layer.0.attention.
attention.query.weight`, as on the Hub) are renamed on load.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .. import _core
from ..functional import cat
from ..graph import Graph
from ..tensor import Tensor
from . import functional as F
from .hf import activation, config_dict, dataclass_from
from .module import LayerNorm, Linear, Module


@dataclass
class ViTConfig:
    """ViT-B/16 by default (google/vit-base-patch16-224-in21k)."""

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    layer_norm_eps: float = 1e-12
    qkv_bias: bool = True
    hidden_act: str = "gelu"
    pooler_act: str = "tanh"
    pooler_output_size: int | None = None

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @classmethod
    def from_hf(cls, config) -> "ViTConfig":
        """From a transformers ViTConfig, a config.json path or a dict."""
        return dataclass_from(cls, config_dict(config))


def attention(q: Tensor, k: Tensor, v: Tensor, n_heads: int, mask: Tensor | None = None) -> Tensor:
    """Multi-head attention over (batch, tokens, hidden) projections: split heads, softmax(q k^T / sqrt(d)) v,
    merge heads. `mask` (added to the scores) broadcasts against (batch, heads, queries, keys)."""
    b, sq, hidden = q.layout.shape
    sk = k.layout.shape[1]
    d = int(hidden) // n_heads
    q = q.reshape(b, sq, n_heads, d).transpose(1, 2)  # (b, H, sq, d)
    k = k.reshape(b, sk, n_heads, d).transpose(1, 2)
    v = v.reshape(b, sk, n_heads, d).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (b, H, sq, d)
    return out.transpose(1, 2).reshape(b, sq, hidden)


class PatchProjection(Module):
    """A Conv2d whose stride equals its kernel: each output pixel sees one patch, so the convolution is a matrix
    product of the flattened patches with the flattened filters (no overlapping windows to gather)."""

    def __init__(self, in_channels: int, out_channels: int, patch: int, graph=None):
        super().__init__(graph)
        self.weight = self.param(out_channels, in_channels, patch, patch)
        self.bias = self.param(out_channels)
        self.patch = patch

    def forward(self, x: Tensor) -> Tensor:
        """(b, c, h, w) -> (b, h/p * w/p, out_channels), patches in row-major order (conv output flattened)."""
        b, c, h, w = x.layout.shape
        p = self.patch
        if not (h.is_const() and w.is_const()) or int(h) % p or int(w) % p:
            raise ValueError(f"patch embedding: image size {int(h) if h.is_const() else h} x "
                             f"{int(w) if w.is_const() else w} is not a multiple of the patch size {p}")
        gh, gw = int(h) // p, int(w) // p
        patches = x.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, int(c) * p * p)
        return patches.linear(self.weight.reshape(self.weight.shape[0], -1), self.bias)


class ViTPatchEmbeddings(Module):
    def __init__(self, c: ViTConfig, graph):
        super().__init__(graph)
        self.projection = PatchProjection(c.num_channels, c.hidden_size, c.patch_size, graph)
        self.num_channels = c.num_channels

    def forward(self, pixel_values: Tensor) -> Tensor:
        if pixel_values.ndim != 4 or pixel_values.shape[1] != self.num_channels:
            raise ValueError(f"ViT: pixel_values must be (batch, {self.num_channels}, height, width), got shape "
                             f"{tuple(pixel_values.shape)}")
        return self.projection(pixel_values)


class ViTEmbeddings(Module):
    def __init__(self, c: ViTConfig, graph):
        super().__init__(graph)
        self.cls_token = self.param(1, 1, c.hidden_size)
        self.position_embeddings = self.param(1, c.num_patches + 1, c.hidden_size)
        self.patch_embeddings = ViTPatchEmbeddings(c, graph)
        self.image_size = c.image_size

    def forward(self, pixel_values: Tensor) -> Tensor:
        h, w = pixel_values.shape[-2:]
        if (h, w) != (self.image_size, self.image_size):
            # transformers can interpolate the position table for other sizes; this model keeps the trained one.
            raise ValueError(f"ViT: the image is {h} x {w}, the model's positions are for "
                             f"{self.image_size} x {self.image_size}")
        x = self.patch_embeddings(pixel_values)  # (b, n, hidden)
        b = x.layout.shape[0]
        cls = self.cls_token.expand_to([b, _core.Expr(1), x.layout.shape[2]])
        return cat([cls, x], 1) + self.position_embeddings


class ViTAttention(Module):
    def __init__(self, c: ViTConfig, graph):
        super().__init__(graph)
        h = c.hidden_size
        self.q_proj = Linear(h, h, bias=c.qkv_bias, graph=graph)
        self.k_proj = Linear(h, h, bias=c.qkv_bias, graph=graph)
        self.v_proj = Linear(h, h, bias=c.qkv_bias, graph=graph)
        self.o_proj = Linear(h, h, bias=True, graph=graph)
        self.n_heads = c.num_attention_heads

    def forward(self, x: Tensor) -> Tensor:
        return self.o_proj(attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), self.n_heads))


class ViTMLP(Module):
    def __init__(self, c: ViTConfig, graph):
        super().__init__(graph)
        self.fc1 = Linear(c.hidden_size, c.intermediate_size, bias=True, graph=graph)
        self.fc2 = Linear(c.intermediate_size, c.hidden_size, bias=True, graph=graph)
        self.act = c.hidden_act

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(activation(self.fc1(x), self.act))


class ViTLayer(Module):
    def __init__(self, c: ViTConfig, graph):
        super().__init__(graph)
        self.attention = ViTAttention(c, graph)
        self.mlp = ViTMLP(c, graph)
        self.layernorm_before = LayerNorm(c.hidden_size, c.layer_norm_eps, graph=graph)
        self.layernorm_after = LayerNorm(c.hidden_size, c.layer_norm_eps, graph=graph)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.layernorm_before(x))
        return x + self.mlp(self.layernorm_after(x))


class ViTPooler(Module):
    def __init__(self, c: ViTConfig, graph):
        super().__init__(graph)
        self.dense = Linear(c.hidden_size, c.pooler_output_size or c.hidden_size, bias=True, graph=graph)
        self.act = c.pooler_act

    def forward(self, x: Tensor) -> Tensor:
        return activation(self.dense(x[:, 0]), self.act)


# The Hub's checkpoints (transformers before 5.0) -> ViTModel's names now.
_LEGACY = [
    (r"^vit\.", ""),
    (r"encoder\.layer\.", "layers."),
    (r"attention\.attention\.query", "attention.q_proj"),
    (r"attention\.attention\.key", "attention.k_proj"),
    (r"attention\.attention\.value", "attention.v_proj"),
    (r"attention\.output\.dense", "attention.o_proj"),
    (r"intermediate\.dense", "mlp.fc1"),
    (r"\.output\.dense", ".mlp.fc2"),
]


def vit_state_dict(weights: dict) -> dict:
    """Renames a ViT checkpoint in the Hub's older layout to ViTModel's names (other names are kept)."""
    out = {}
    for k, v in weights.items():
        if "encoder.layer." in k or k.startswith("vit."):
            for pat, rep in _LEGACY:
                k = re.sub(pat, rep, k)
        out[k] = v
    return out


class ViTModel(Module):
    """transformers' ViTModel. `forward(pixel_values)` (batch, channels, image, image) returns the last hidden state
    (batch, patches + 1, hidden) and the pooler output (batch, hidden), or None without the pooling layer."""

    def __init__(self, config: ViTConfig, graph: Graph | None = None, add_pooling_layer: bool = True):
        super().__init__(graph if graph is not None else Graph())
        c = self.config = config
        if c.hidden_size % c.num_attention_heads:
            raise ValueError(f"ViT: hidden_size {c.hidden_size} is not a multiple of num_attention_heads "
                             f"{c.num_attention_heads}")
        self.embeddings = ViTEmbeddings(c, self.graph)
        self.layers = [ViTLayer(c, self.graph) for _ in range(c.num_hidden_layers)]
        self.layernorm = LayerNorm(c.hidden_size, c.layer_norm_eps, graph=self.graph)
        self.pooler = ViTPooler(c, self.graph) if add_pooling_layer else None

    def forward(self, pixel_values: Tensor):
        x = self.embeddings(pixel_values)
        for layer in self.layers:
            x = layer(x)
        x = self.layernorm(x)
        return x, (self.pooler(x) if self.pooler is not None else None)

    def load_state_dict(self, weights: dict, *args, **kwargs):
        return super().load_state_dict(vit_state_dict(weights), *args, **kwargs)
