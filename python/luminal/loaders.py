"""Weight loaders: .safetensors files (memory-mapped) and whole Llama checkpoints (GGUF or safetensors + config).

A safetensors header is validated by the `safetensors` package itself (`safe_open`); tensors are then
memory-mapped without a copy, which the package's numpy API cannot do for bfloat16.
"""
from __future__ import annotations

import json
import math
import os
import struct

import numpy as np

from . import dtypes as dt

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "U8": np.uint8,
           "I64": np.int64, "F64": np.float64, "BOOL": np.bool_}


class SafetensorsError(ValueError):
    """A .safetensors file is missing, corrupt, truncated, or holds an unsupported dtype."""


class ConfigError(ValueError):
    """A config.json is not valid JSON, or one of its values is missing, of the wrong type or out of range."""


class UnsupportedConfigError(ConfigError, NotImplementedError):
    """A config.json asks for something luminal does not implement (both a ConfigError and a NotImplementedError)."""


MAX_COUNT = 1 << 24  # above any real model's size, layer or vocabulary count; keeps products of them in int64

# The Llama family's config.json keys that LlamaConfig.from_hf reads, and what each must be (see _valid; a "?"
# allows null).
LLAMA_CONFIG_KEYS = {
    "vocab_size": "count", "hidden_size": "count", "intermediate_size": "count", "num_hidden_layers": "count",
    "num_attention_heads": "count", "num_key_value_heads": "count?", "head_dim": "count?",
    "rope_theta": "number", "rms_norm_eps": "number", "tie_word_embeddings": "flag", "attention_bias": "flag",
    "mlp_bias": "flag", "use_sliding_window": "flag", "sliding_window": "count?", "max_window_layers": "index",
    "model_type": "text", "hidden_act": "text", "rope_scaling": "dict?", "rope_parameters": "dict?",
    "num_experts": "index", "num_local_experts": "index", "num_experts_per_tok": "count",
    "moe_intermediate_size": "count", "norm_topk_prob": "flag", "mlp_only_layers": "indices",
    "decoder_sparse_step": "count", "layer_types": "texts?",
}
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_REQUIRED_MOE = {"mixtral": ("num_local_experts", "num_experts_per_tok"),  # (a, b): a or b
                 "qwen3_moe": (("num_experts", "num_local_experts"), "moe_intermediate_size", "num_experts_per_tok")}


def _json_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def read_json(path) -> dict:
    """A JSON object from a file; every problem (unreadable, not UTF-8, not JSON, NaN/Infinity, nested too deeply,
    not an object) is a ConfigError naming the file."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
        config = json.loads(text, parse_constant=_json_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{path}: not a valid JSON file ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: the JSON is a {type(config).__name__}, not an object")
    return config


def check_config(config, keys: dict = LLAMA_CONFIG_KEYS, required=_REQUIRED) -> tuple[dict, str]:
    """(config dict, a name for it in messages) from a config.json path or a dict, after checking the `keys` it
    has: a missing required key, a value of the wrong type, a non-positive or huge count or a non-finite number is
    a ConfigError naming the file (or 'config') and the key. Keys not in `keys` are not looked at."""
    if isinstance(config, (str, os.PathLike)):
        source = os.fspath(config)
        config = read_json(source)
    else:
        source = "config"
        if not isinstance(config, dict):
            raise ConfigError(f"a config must be a dict or the path of a config.json, got {type(config).__name__}")
    if required is _REQUIRED:  # the Llama family's: and those of its mixtures of experts
        required += _REQUIRED_MOE.get(str(config.get("model_type")), ())
    for key in required:
        if not any(k in config for k in (key if isinstance(key, tuple) else (key,))):
            names = " or ".join(map(repr, key if isinstance(key, tuple) else (key,)))
            raise ConfigError(f"{source}: key {names} is missing")
    for key, kind in keys.items():
        if key in config and not _valid(config[key], kind):
            v = repr(config[key])
            raise ConfigError(f"{source}: {key!r} should be {_KIND_TEXT[kind]}, got "
                              f"{v if len(v) < 80 else v[:60] + '...'} ({type(config[key]).__name__})")
    return config, source


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _valid(v, kind: str) -> bool:
    if kind.endswith("?") and v is None:
        return True
    kind = kind.rstrip("?")
    if kind == "count":
        return _is_int(v) and 0 < v <= MAX_COUNT
    if kind == "index":
        return _is_int(v) and 0 <= v <= MAX_COUNT
    if kind == "indices":
        return v is None or isinstance(v, list) and all(_is_int(x) and 0 <= x <= MAX_COUNT for x in v)
    if kind == "number":
        return (_is_int(v) or isinstance(v, float)) and math.isfinite(v) and v > 0
    if kind == "flag":
        return v is None or isinstance(v, bool)
    if kind == "text":
        return isinstance(v, str)
    if kind == "texts":
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    if kind == "dict":  # rope_scaling / rope_parameters
        return isinstance(v, dict) and all(_valid(v[k], t) for k, t in _ROPE_KEYS.items() if k in v)
    raise AssertionError(kind)


_ROPE_KEYS = {"rope_type": "text", "type": "text", "rope_theta": "number"}
_KIND_TEXT = {"count": f"an integer in 1..{MAX_COUNT}", "count?": f"null or an integer in 1..{MAX_COUNT}",
              "index": f"an integer in 0..{MAX_COUNT}", "indices": "a list of layer indices",
              "number": "a finite positive number", "flag": "true or false", "text": "a string",
              "texts?": "a list of strings", "dict?": "null or an object whose rope_type is a string and rope_theta a "
              "finite positive number"}


def load_safetensors(path, dtype_float32: bool = True) -> dict[str, np.ndarray]:
    """{name: array}: zero-copy memory maps for float32/float16/int tensors; bfloat16 becomes float32 (a copy)
    unless `dtype_float32=False`, which leaves its raw uint16 bits."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such safetensors file")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"{path}: file too short for a safetensors header ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise SafetensorsError(f"{path}: header of {n} bytes runs past the end of the file ({size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{path}: header is not valid JSON ({e})") from None
    try:  # the package's own validation (offsets, overlaps, dtypes)
        from safetensors import safe_open

        with safe_open(path, framework="numpy"):
            pass
    except ImportError:
        pass
    except Exception as e:  # noqa: BLE001 - the package raises its own error type
        raise SafetensorsError(f"{path}: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    base = 8 + n
    mm = np.memmap(path, dtype=np.uint8, mode="r") if size > base else np.zeros(0, np.uint8)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            kind, shape, (start, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{path}: tensor '{name}' has a malformed header entry {info!r}") from None
        if kind not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor '{name}' has unsupported dtype {kind}")
        np_dtype = np.dtype(_DTYPES[kind])
        count = int(np.prod(shape, dtype=np.int64))
        if not (0 <= start <= end and base + end <= size) or end - start != count * np_dtype.itemsize:
            raise SafetensorsError(f"{path}: tensor '{name}' data [{start}, {end}) is out of bounds or does not "
                                   f"match its shape {shape} and dtype {kind} (file has {size - base} data bytes)")
        arr = mm[base + start:base + end].view(np_dtype).reshape(shape)
        if kind == "BF16" and dtype_float32:
            arr = dt.bf16_to_f32(np.asarray(arr))
        out[name] = arr
    return out


def load_llama(path, progress: bool = True, moe_form: str = "routed"):
    """(model, tokenizer or None) from a GGUF file, or a directory with config.json and *.safetensors (and
    tokenizer.json for a tokenizer). Any model of the Llama family (see `LlamaConfig.from_hf` / `from_gguf`:
    Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Mixtral); `moe_form` picks how routed experts run (`SparseMoE`).

    A file that is corrupt or does not fit the others raises a ValueError naming it: GGUFError, SafetensorsError,
    ConfigError (config.json), or the model's ValueError listing the weights that do not match the config."""
    from .gguf import GGUFError

    path = os.fspath(path)
    try:
        return _load_llama(path, progress, moe_form)
    except ValueError as e:
        if path in str(e):
            raise
        # Checks deeper down (q/k permutation, packed weights, ...) that cannot know the file: name it here.
        raise (ConfigError if os.path.isdir(path) else GGUFError)(f"{path}: {e}") from e


def _check_layers(cfg, weights: dict, source: str) -> None:
    """Before the model is built (its graph grows with the layer count): the config's layer count and embedding
    shape must be those of the weights."""
    from .gguf import GGUFError

    have = {int(k.split(".")[2]) for k in weights if k.startswith("model.layers.") and k.split(".")[2].isdigit()}
    missing, unexpected = sorted(set(range(cfg.n_layers)) - have), sorted(have - set(range(cfg.n_layers)))
    shape = tuple(getattr(weights.get("model.embed_tokens.weight"), "shape", ()))
    problems = [f"{len(v)} {what} layer(s) {v[:3]}{'...' if len(v) > 3 else ''}"
                for what, v in (("missing", missing), ("unexpected", unexpected)) if v]
    if shape != (cfg.vocab_size, cfg.hidden):
        problems.append(f"model.embed_tokens.weight: expected ({cfg.vocab_size}, {cfg.hidden}), got {shape}")
    if problems:
        raise (ConfigError if os.path.isdir(source) else GGUFError)(
            f"{source}: the weights do not match the config ({cfg.n_layers} layers): " + "; ".join(problems))


def _load_llama(path: str, progress: bool, moe_form: str):
    from .nn.llama import Llama, LlamaConfig, gguf_state_dict

    if os.path.isdir(path):
        cfg_path = os.path.join(path, "config.json")
        if not os.path.exists(cfg_path):
            raise FileNotFoundError(f"{path}: no config.json beside the safetensors weights")
        cfg = LlamaConfig.from_hf(cfg_path)
        weights = {}
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            raise FileNotFoundError(f"{path}: no .safetensors files")
        if progress:
            from tqdm.auto import tqdm

            files = tqdm(files, desc="loading safetensors", unit="file")
        for f in files:
            weights.update(load_safetensors(os.path.join(path, f)))
        _check_layers(cfg, weights, path)
        model = Llama(cfg, moe_form=moe_form).load_state_dict(weights, strict=True, source=path)
        tok = None
        if os.path.exists(os.path.join(path, "tokenizer.json")):
            from .tokenizer import Tokenizer

            tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        return model, tok
    from .gguf import GGUFFile
    from .tokenizer import Tokenizer

    g = GGUFFile(path)
    cfg = LlamaConfig.from_gguf(g)
    weights = gguf_state_dict(g, cfg, progress)
    _check_layers(cfg, weights, path)
    model = Llama(cfg, moe_form=moe_form).load_state_dict(weights, strict=True, source=path)
    # A file without a vocabulary (weights only) gives no tokenizer.
    return model, (Tokenizer.from_gguf(g) if "tokenizer.ggml.model" in g.metadata else None)
