"""Weight loaders: .safetensors files (memory-mapped) and whole Llama checkpoints (GGUF or safetensors + config).

A safetensors header is validated by the `safetensors` package itself (`safe_open`); tensors are then
memory-mapped without a copy, which the package's numpy API cannot do for bfloat16.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np

from . import dtypes as dt

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "U8": np.uint8,
           "I64": np.int64, "F64": np.float64, "BOOL": np.bool_}


class SafetensorsError(ValueError):
    """A .safetensors file is missing, corrupt, truncated, or holds an unsupported dtype."""


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
    Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Mixtral); `moe_form` picks how routed experts run (`SparseMoE`)."""
    from .nn.llama import Llama, LlamaConfig, gguf_state_dict

    path = os.fspath(path)
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
    model = Llama(cfg, moe_form=moe_form).load_state_dict(gguf_state_dict(g, cfg, progress), strict=True,
                                                          source=path)
    # A file without a vocabulary (weights only) gives no tokenizer.
    return model, (Tokenizer.from_gguf(g) if "tokenizer.ggml.model" in g.metadata else None)
