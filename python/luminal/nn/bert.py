"""BERT encoders (transformers' BertModel parameter names) and sentence embeddings (sentence-transformers' recipe:
mean pooling over the attention mask, then L2 normalisation), e.g. all-MiniLM-L6-v2.

One graph serves every batch: the batch `b` and the padded length `s` are symbolic dims, bound from the arrays
given to `set()`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .. import dtypes as dt
from ..functional import arange
from ..graph import Graph
from ..tensor import Tensor
from . import functional as F
from .hf import ACTIVATIONS, config_dict, dataclass_from
from .module import Embedding, LayerNorm, Linear, Module, _fmt_shape

_MASKED = float(np.finfo(np.float32).min)  # added to the scores of padding keys, as transformers does


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0

    @classmethod
    def from_hf(cls, config) -> "BertConfig":
        """From a Hugging Face config.json path (or a directory holding one) or its dict."""
        config = config_dict(config)
        kind = config.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise NotImplementedError(f"BertConfig: position_embedding_type {kind!r} is not supported (only "
                                      "'absolute')")
        act = config.get("hidden_act", "gelu")
        if act not in ACTIVATIONS:
            raise NotImplementedError(f"BertConfig: hidden_act {act!r} is not supported ({sorted(ACTIVATIONS)})")
        return dataclass_from(cls, config)


class BertEmbeddings(Module):
    _ignored_state = ("position_ids",)  # a non-persistent buffer some checkpoints still carry

    def __init__(self, c: BertConfig, graph):
        super().__init__(graph)
        self.word_embeddings = Embedding(c.vocab_size, c.hidden_size, graph)
        self.position_embeddings = Embedding(c.max_position_embeddings, c.hidden_size, graph)
        self.token_type_embeddings = Embedding(c.type_vocab_size, c.hidden_size, graph)
        self.LayerNorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps, graph=graph)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        s = input_ids.layout.shape[1]
        x = self.word_embeddings(input_ids) + self.position_embeddings(arange(0, s, graph=self.graph))
        if token_type_ids is None:  # all segment 0
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)


class BertSelfAttention(Module):
    def __init__(self, c: BertConfig, graph):
        super().__init__(graph)
        h = c.hidden_size
        self.num_heads, self.head_dim = c.num_attention_heads, h // c.num_attention_heads
        self.query = Linear(h, h, graph=graph)
        self.key = Linear(h, h, graph=graph)
        self.value = Linear(h, h, graph=graph)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """x: (b, s, hidden); mask: None or (b, 1, 1, s), 0 for tokens and a large negative for padding."""
        b, s, h = x.layout.shape

        def heads(t):
            return t.reshape(b, s, self.num_heads, self.head_dim).transpose(1, 2)  # (b, heads, s, d)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(b, s, h)


class BertSelfOutput(Module):
    def __init__(self, c: BertConfig, graph, inner: int):
        super().__init__(graph)
        self.dense = Linear(inner, c.hidden_size, graph=graph)
        self.LayerNorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps, graph=graph)

    def forward(self, h: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dense(h) + residual)


class BertAttention(Module):
    def __init__(self, c: BertConfig, graph):
        super().__init__(graph)
        self.self = BertSelfAttention(c, graph)
        self.output = BertSelfOutput(c, graph, c.hidden_size)

    def forward(self, x, mask):
        return self.output(self.self(x, mask), x)


class BertIntermediate(Module):
    def __init__(self, c: BertConfig, graph):
        super().__init__(graph)
        self.dense = Linear(c.hidden_size, c.intermediate_size, graph=graph)
        self.act = ACTIVATIONS[c.hidden_act]

    def forward(self, x):
        return self.act(self.dense(x))


class BertLayer(Module):
    def __init__(self, c: BertConfig, graph):
        super().__init__(graph)
        self.attention = BertAttention(c, graph)
        self.intermediate = BertIntermediate(c, graph)
        self.output = BertSelfOutput(c, graph, c.intermediate_size)

    def forward(self, x, mask):
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(Module):
    def __init__(self, c: BertConfig, graph):
        super().__init__(graph)
        self.layer = [BertLayer(c, graph) for _ in range(c.num_hidden_layers)]

    def forward(self, x, mask):
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertPooler(Module):
    """tanh(dense(first token's hidden state))."""

    def __init__(self, c: BertConfig, graph):
        super().__init__(graph)
        self.dense = Linear(c.hidden_size, c.hidden_size, graph=graph)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.dense(hidden[:, 0]).tanh()


class BertModel(Module):
    """transformers' BertModel (inference). `forward(input_ids, attention_mask, token_type_ids)` records the encoder
    and returns the last hidden state (b, s, hidden); `model.pooler(hidden)` gives the pooled output."""

    def __init__(self, config: BertConfig, graph: Graph | None = None, add_pooling_layer: bool = True):
        super().__init__(graph if graph is not None else Graph())
        self.config = config
        self.embeddings = BertEmbeddings(config, self.graph)
        self.encoder = BertEncoder(config, self.graph)
        self.pooler = BertPooler(config, self.graph) if add_pooling_layer else None

    @classmethod
    def from_pretrained(cls, path, graph: Graph | None = None, add_pooling_layer: bool = True) -> "BertModel":
        """From a directory with config.json and model.safetensors (transformers' layout). Weights saved from a
        task model (`bert.` prefixes) load too; its head's weights are not part of a BertModel."""
        from ..loaders import load_safetensors

        model = cls(BertConfig.from_hf(path), graph, add_pooling_layer)
        weights = load_safetensors(os.path.join(path, "model.safetensors"))
        if any(k.startswith("bert.") for k in weights):
            weights = {k[5:]: v for k, v in weights.items() if k.startswith("bert.")}
        if not add_pooling_layer:
            weights = {k: v for k, v in weights.items() if not k.startswith("pooler.")}
        return model.load_state_dict(weights, source=os.fspath(path))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> Tensor:
        if input_ids.ndim != 2 or input_ids.dtype.is_float:
            raise ValueError(f"BertModel: input_ids must be integer ids of shape (batch, seq), got "
                             f"{input_ids.dtype.name} {_fmt_shape(input_ids.shape)}")
        for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if t is not None and t.layout.shape != input_ids.layout.shape:
                raise ValueError(f"BertModel: {name} has shape {_fmt_shape(t.shape)}, input_ids "
                                 f"{_fmt_shape(input_ids.shape)}")
        s = input_ids.layout.shape[1]
        if s.is_const() and int(s) > self.config.max_position_embeddings:
            raise ValueError(f"BertModel: sequence length {int(s)} exceeds max_position_embeddings "
                             f"{self.config.max_position_embeddings}")
        mask = None
        if attention_mask is not None:  # 1 = token, 0 = padding: padding keys get a large negative score
            b = input_ids.layout.shape[0]
            mask = ((1 - attention_mask.to(dt.float32)) * _MASKED).reshape(b, 1, 1, s)
        x = self.embeddings(input_ids, token_type_ids)
        return self.encoder(x, mask)


def mean_pooling(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """The mean of each sequence's token states over its attention mask: (b, s, h), (b, s) -> (b, h)."""
    m = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / (m.sum(1).clamp(min=1e-9))


def normalize(x: Tensor, p: float = 2.0, dim: int = -1, eps: float = 1e-12) -> Tensor:
    """torch.nn.functional.normalize for p=2: x / max(||x||, eps)."""
    if p != 2:
        raise NotImplementedError(f"normalize: only p=2 is supported, got p={p}")
    return x / (x * x).sum(dim, keepdim=True).sqrt().clamp(min=eps)


def sentence_embeddings(model: BertModel, input_ids: Tensor, attention_mask: Tensor,
                        token_type_ids: Tensor | None = None) -> Tensor:
    """sentence-transformers' recipe (all-MiniLM-L6-v2): mean pooling over the mask, then L2 normalisation."""
    return normalize(mean_pooling(model(input_ids, attention_mask, token_type_ids), attention_mask))


class SentenceEncoder:
    """Text in, unit-length embeddings out: a tokenizer (the `tokenizers` library's tokenizer.json) and one
    compiled graph for any batch size and padded length.

        enc = SentenceEncoder(model_dir)        # config.json, model.safetensors, tokenizer.json
        vectors = enc.encode(["a sentence", "another one"])   # (2, hidden) numpy, rows of norm 1
    """

    def __init__(self, path, compilers=None, max_length: int = 256):
        import luminal as lm
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self.tokenizer.enable_truncation(max_length)
        self.graph = Graph()
        self.model = BertModel.from_pretrained(path, self.graph, add_pooling_layer=False)
        self.input_ids = self.graph.tensor(("b", "s"), dt.int32, name="input_ids")
        self.attention_mask = self.graph.tensor(("b", "s"), dt.int32, name="attention_mask")
        self.output = sentence_embeddings(self.model, self.input_ids, self.attention_mask).output()
        self.graph.compile(*(compilers if compilers is not None else [lm.GenericCompiler(), lm.CPUCompiler()]))

    def tokenize(self, sentences) -> tuple[np.ndarray, np.ndarray]:
        enc = self.tokenizer.encode_batch(list(sentences))
        ids = np.array([e.ids for e in enc], np.int32)
        mask = np.array([e.attention_mask for e in enc], np.int32)
        return ids, mask

    def run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        self.input_ids.set(ids)
        self.attention_mask.set(mask)
        self.graph.execute()
        return self.output.numpy()

    def encode(self, sentences) -> np.ndarray:
        if isinstance(sentences, str):
            sentences = [sentences]
        return self.run(*self.tokenize(sentences))
