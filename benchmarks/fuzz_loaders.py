"""Fuzzing luminal's model loaders with mutated real files.

Seeds (written once into a work folder): a tiny Llama GGUF (Q8_0 / Q4_1 / Q4_0 / F16 / Q4_K / Q6_K tensors, and a
tokenizer cut from the bundled SmolLM2 vocabulary), and a safetensors checkpoint (random tensors, F32 / F16 / BF16)
with its config.json. Each case mutates one of them, deterministically from its number, and loads it with
`luminal.loaders.load_llama` (then encodes and decodes a text when the file has a tokenizer):

* gguf:        truncation at every structural boundary, bit flips, special values (0, -1, 2**63, the file's
               size, ...) in counts, lengths, value types, dims, ggml types and data offsets, overlapping or
               out-of-file tensor data, invalid UTF-8 in keys, names and strings;
* gguf-meta:   the file rewritten by GGUFWriter with a key missing, a value of the wrong type, a huge or
               non-finite number, tensors missing, renamed, reshaped or of another type;
* tokenizer:   tokens and merges that do not fit (merges naming unknown tokens, malformed merges, invalid UTF-8,
               huge strings, token types and special-token ids out of range or of the wrong type);
* safetensors: truncation, bit flips, header length, and its JSON header's dtypes, shapes and data offsets;
* config:      config.json with keys missing, values of the wrong type, huge / negative / non-finite numbers,
               invalid JSON or UTF-8, deep nesting.

Each case runs in a worker process under a memory cap (RLIMIT_AS) and a time limit (the worker is killed and
replaced). A case passes if it loads, or raises a ValueError subclass whose message names the file (its folder
for a checkpoint); anything else is an escape (another exception type), a crash (the worker died), a hang (time
limit) or an unbounded allocation (MemoryError).

    python benchmarks/fuzz_loaders.py --cases 10000 --workers 2        # the full run
    python benchmarks/fuzz_loaders.py --cases 300 --kind config -v     # one kind, printing each escape
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

KINDS = {"gguf": 0.3, "gguf-meta": 0.15, "tokenizer": 0.1, "safetensors": 0.2, "config": 0.15,
         "tokenizer-json": 0.1}
HIDDEN, FFN, HEADS, KV_HEADS, LAYERS, VOCAB = 256, 256, 4, 2, 2, 400
MEMORY_CAP = 3 << 30  # bytes of address space per worker
TEXT = "Hello, world! 123 <|im_start|>user\nÀ bientôt 😀"


# ---------------------------------------------------------------------------------------------------- seed files
def _vocab():
    """(tokens, token types, merges, extra metadata): the first VOCAB tokens of SmolLM2's vocabulary and the merges
    among them, or (without the bundled model) a byte-level vocabulary with a few merges."""
    try:
        from luminal.gguf import GGUFFile
        from luminal.hub import bundled_model_path

        g = GGUFFile(bundled_model_path())
    except Exception:  # noqa: BLE001 - offline: a synthetic vocabulary
        from luminal.tokenizer import bytes_to_unicode

        byte_tokens = list(bytes_to_unicode().values())
        tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + byte_tokens
        merges = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "e r"]
        tokens += [m.replace(" ", "") for m in merges]
        tokens += [f"<extra_{i}>" for i in range(VOCAB - len(tokens))]
        types = [3, 3, 3] + [1] * (VOCAB - 3)
        return tokens[:VOCAB], types, merges, {"tokenizer.ggml.pre": "smollm"}
    md = g.metadata
    tokens = list(md["tokenizer.ggml.tokens"][:VOCAB])
    have = set(tokens)
    merges = [m for m in md["tokenizer.ggml.merges"] if m.replace(" ", "", 1) in have
              and all(p in have for p in m.split(" "))]
    extra = {k: md[k] for k in ("tokenizer.ggml.pre", "tokenizer.chat_template")}
    return tokens, list(md["tokenizer.ggml.token_type"][:VOCAB]), merges, extra


def _llama_tensors(rng) -> dict:
    """GGUF-named float32 tensors of the tiny model, with the ggml type each is stored as."""
    h, f, kv = HIDDEN, FFN, KV_HEADS * HIDDEN // HEADS
    out = {"token_embd.weight": ((VOCAB, h), "Q8_0"), "output_norm.weight": ((h,), "F32")}
    for i in range(LAYERS):
        out.update({f"blk.{i}.attn_norm.weight": ((h,), "F32"), f"blk.{i}.ffn_norm.weight": ((h,), "F32"),
                    f"blk.{i}.attn_q.weight": ((h, h), "Q4_1"), f"blk.{i}.attn_k.weight": ((kv, h), "Q4_0"),
                    f"blk.{i}.attn_v.weight": ((kv, h), "F16"), f"blk.{i}.attn_output.weight": ((h, h), "Q8_0"),
                    f"blk.{i}.ffn_gate.weight": ((f, h), "Q4_K"), f"blk.{i}.ffn_up.weight": ((f, h), "Q4_1"),
                    f"blk.{i}.ffn_down.weight": ((h, f), "Q6_K")})
    return {k: ((rng.standard_normal(s) * 0.05).astype(np.float32), t) for k, (s, t) in out.items()}


def _kquant_blocks(rng, qtype, shape):
    """Random blocks of a k-quant with finite float16 scales (gguf.quants cannot quantise k-quants)."""
    import gguf

    bs, ts = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    blocks = rng.integers(0, 256, (math.prod(shape) // bs, ts), dtype=np.uint8)
    scale_offsets = {"Q4_K": (0, 2), "Q6_K": (208,)}[qtype]
    for off in scale_offsets:
        blocks[:, off:off + 2] = (rng.standard_normal(len(blocks)) * 1e-3).astype("<f2").view(np.uint8).reshape(-1, 2)
    return blocks.reshape(shape[0], -1)


def gguf_spec(seed: int = 0) -> dict:
    """The tiny GGUF as data: {'metadata': [(key, value, GGUFValueType name, array element type name)],
    'tensors': [(name, array, ggml type name)]}; `write_gguf` writes it."""
    rng = np.random.default_rng(seed)
    tokens, types, merges, extra = _vocab()
    md = [("general.architecture", "llama", "STRING", None), ("general.name", "fuzz", "STRING", None),
          ("llama.block_count", LAYERS, "UINT32", None), ("llama.context_length", 256, "UINT32", None),
          ("llama.embedding_length", HIDDEN, "UINT32", None), ("llama.feed_forward_length", FFN, "UINT32", None),
          ("llama.attention.head_count", HEADS, "UINT32", None),
          ("llama.attention.head_count_kv", KV_HEADS, "UINT32", None),
          ("llama.rope.freq_base", 10000.0, "FLOAT32", None),
          ("llama.attention.layer_norm_rms_epsilon", 1e-5, "FLOAT32", None),
          ("llama.rope.dimension_count", HIDDEN // HEADS, "UINT32", None),
          ("tokenizer.ggml.model", "gpt2", "STRING", None),
          ("tokenizer.ggml.pre", extra["tokenizer.ggml.pre"], "STRING", None),
          ("tokenizer.ggml.tokens", tokens, "ARRAY", "STRING"),
          ("tokenizer.ggml.token_type", types, "ARRAY", "INT32"),
          ("tokenizer.ggml.merges", merges, "ARRAY", "STRING"),
          ("tokenizer.ggml.bos_token_id", 1, "UINT32", None), ("tokenizer.ggml.eos_token_id", 2, "UINT32", None),
          ("tokenizer.ggml.add_bos_token", False, "BOOL", None)]
    if extra.get("tokenizer.chat_template"):
        md.append(("tokenizer.chat_template", extra["tokenizer.chat_template"], "STRING", None))
    tensors = []
    for name, (v, qtype) in _llama_tensors(rng).items():
        tensors.append((name, v, qtype))
    return {"metadata": md, "tensors": tensors, "rng": rng}


def write_gguf(path, spec: dict) -> None:
    import gguf
    from gguf import GGMLQuantizationType as Q, GGUFValueType as V

    w = gguf.GGUFWriter(os.fspath(path), arch="llama")
    w.kv_data = [{}]  # the metadata is exactly the spec's (its architecture key may be mutated or missing)
    for key, value, vtype, sub in spec["metadata"]:
        w.add_key_value(key, value, V[vtype], sub_type=V[sub] if sub else None)
    rng = np.random.default_rng(1)
    for name, v, qtype in spec["tensors"]:
        if qtype in ("F32", "F16"):
            w.add_tensor(name, v.astype(np.float16 if qtype == "F16" else np.float32))
        elif qtype in ("Q4_K", "Q6_K"):
            w.add_tensor(name, _kquant_blocks(rng, qtype, v.shape), raw_dtype=Q[qtype])
        elif qtype == "RAW":  # random bytes of a ggml type given with the array: (array, type name)
            w.add_tensor(name, v[0], raw_dtype=Q[v[1]])
        else:
            w.add_tensor(name, gguf.quants.quantize(v, Q[qtype]), raw_dtype=Q[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hf_names(spec: dict) -> dict:
    """The tiny model's float tensors under Hugging Face names (q/k rows as the GGUF stores them: fine for
    random weights)."""
    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}
    layer = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    out = {}
    for name, v, _ in spec["tensors"]:
        p = name.split(".")
        key = f"model.layers.{p[1]}.{layer[p[2]]}.weight" if p[0] == "blk" else f"{names[p[0]]}.weight"
        out[key] = v
    return out


def hf_config() -> dict:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB,
            "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HIDDEN // HEADS,
            "hidden_act": "silu", "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "rope_scaling": None, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
            "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}


def write_safetensors(path, tensors: dict) -> None:
    """Writes `tensors` (name -> (array, safetensors dtype)) in the safetensors layout."""
    header, blobs, pos = {}, [], 0
    for name, (arr, dtype) in tensors.items():
        if dtype == "BF16":
            raw = (np.ascontiguousarray(arr, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            raw = np.ascontiguousarray(arr, {"F32": "<f4", "F16": "<f2"}[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    header["__metadata__"] = {"format": "pt"}
    write_safetensors_raw(path, json.dumps(header).encode(), b"".join(blobs))


def write_safetensors_raw(path, header: bytes, data: bytes, header_len: int | None = None) -> None:
    pad = (-len(header)) % 8
    header += b" " * pad
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header) if header_len is None else header_len) + header + data)


class Seeds:
    """The seed files of a work folder, and what the mutators need to know about them."""

    def __init__(self, work: str):
        import gguf

        self.work = work
        os.makedirs(work, exist_ok=True)
        self.gguf_spec = gguf_spec()
        self.gguf_path = os.path.join(work, "seed.gguf")
        write_gguf(self.gguf_path, self.gguf_spec)
        self.gguf_bytes = open(self.gguf_path, "rb").read()
        # Structural slots of the GGUF: every count, length, type, dim and offset (from gguf's reader on the seed).
        r = gguf.GGUFReader(self.gguf_path)
        base = r.data.ctypes.data
        self.slots, self.strings, self.bounds = [], [], {0, 4, 8, 16, 24, len(self.gguf_bytes)}
        self.slots += [(4, 4, "version"), (8, 8, "tensor count"), (16, 8, "kv count")]
        self.tensor_offsets = []
        for field in list(r.fields.values())[3:]:
            self._field_slots(field.parts, base, field.types)
        for t in r.tensors:
            parts = t.field.parts
            self._field_slots(parts, base, None)
            self.tensor_offsets.append(parts[5].ctypes.data - base)
            self.bounds |= {t.data_offset, t.data_offset + t.n_bytes}
        self.data_offset = r.data_offset
        self.bounds = sorted(self.bounds)
        rng = self.gguf_spec["rng"]
        # safetensors checkpoint
        self.st_dir = os.path.join(work, "st")
        os.makedirs(self.st_dir, exist_ok=True)
        dtypes = ["F32", "F16", "BF16"]
        self.st_tensors = {k: (v, dtypes[i % 3]) for i, (k, v) in enumerate(hf_names(self.gguf_spec).items())}
        write_safetensors(os.path.join(self.st_dir, "model.safetensors"), self.st_tensors)
        self.config = hf_config()
        with open(os.path.join(self.st_dir, "config.json"), "w") as f:
            json.dump(self.config, f)
        # a tokenizer.json (the GGUF's tokenizer, saved by `tokenizers`) and a tokenizer_config.json
        from luminal.tokenizer import Tokenizer

        self.tokenizer_json = json.loads(Tokenizer.from_gguf(self.gguf_path).backend.to_str())
        self.tokenizer_config = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>", "special": True},
                                 "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
                                 "model_max_length": 256}
        del rng

    def _field_slots(self, parts, base, types):
        for p in parts:
            off = p.ctypes.data - base
            self.bounds |= {off, off + p.nbytes}
            if p.dtype in (np.uint32, np.uint64, np.int32, np.int64) and p.size == 1:
                self.slots.append((off, p.dtype.itemsize, "number"))
            elif p.dtype == np.uint64 and p.size > 1:  # dims
                for i in range(p.size):
                    self.slots.append((off + 8 * i, 8, "dim"))
            elif p.dtype == np.uint8 and p.size:
                self.strings.append((off, p.nbytes))


# ------------------------------------------------------------------------------------------------------ mutators
def _special(rng: random.Random, width: int, old: int, size: int) -> int:
    top = (1 << (8 * width)) - 1
    return rng.choice([0, 1, 2, 3, 7, top, top - 1, top // 2, top // 2 + 1, 1 << 31, (1 << 32) - 1, size, size - 1,
                       size + 1, old + 1, old - 1, old * 2, old * 1000, rng.randrange(top + 1),
                       rng.randrange(256)]) & top


def mutate_gguf_bytes(s: Seeds, rng: random.Random) -> bytes:
    data = bytearray(s.gguf_bytes)
    op = rng.choice(["truncate", "truncate", "slot", "slot", "slot", "flip", "utf8", "offset", "type", "many"])
    if op == "truncate":
        cut = rng.choice(s.bounds) + rng.choice([-1, 0, 0, 1])
        return bytes(data[:max(cut, 0)])
    if op == "slot":
        off, width, _ = rng.choice(s.slots)
        old = int.from_bytes(data[off:off + width], "little")
        data[off:off + width] = _special(rng, width, old, len(data)).to_bytes(width, "little")
    elif op == "flip":
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(4, s.data_offset if rng.random() < 0.8 else len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif op == "utf8":
        off, n = rng.choice(s.strings)
        bad = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80", b"\xf4\x90\x80\x80"])
        i = off + rng.randrange(n)
        data[i:i + len(bad)] = bad[:max(0, min(len(bad), off + n - i))]
    elif op == "offset":  # a tensor's data moved onto another's, or out of the file
        i = rng.choice(s.tensor_offsets)
        j = rng.choice(s.tensor_offsets)
        v = rng.choice([int.from_bytes(data[j:j + 8], "little"), int.from_bytes(data[j:j + 8], "little") + 16,
                        len(data), len(data) - s.data_offset, 2 ** 63, 2 ** 64 - 32])
        data[i:i + 8] = (v % 2 ** 64).to_bytes(8, "little")
    elif op == "type":  # a tensor's ggml type
        i = rng.choice(s.tensor_offsets) - 4
        data[i:i + 4] = rng.choice([0, 1, 2, 3, 6, 8, 12, 14, 15, 16, 24, 28, 30, 39, 41, 42, 200,
                                    2 ** 32 - 1]).to_bytes(4, "little")
    else:
        for _ in range(rng.randint(2, 5)):
            off, width, _ = rng.choice(s.slots)
            old = int.from_bytes(data[off:off + width], "little")
            data[off:off + width] = _special(rng, width, old, len(data)).to_bytes(width, "little")
    return bytes(data)


_WRONG_VALUES = [("STRING", "12"), ("STRING", ""), ("STRING", b"\xff\xfe"), ("FLOAT32", float("nan")),
                 ("FLOAT32", float("inf")), ("FLOAT64", -1e300), ("FLOAT32", 2.5), ("INT32", -1), ("INT32", 0),
                 ("UINT64", 2 ** 64 - 1), ("INT64", -2 ** 63), ("UINT32", 2 ** 31), ("UINT32", 0), ("BOOL", True),
                 ("UINT8", 255), ("ARRAY", [1, 2]), ("ARRAY", ["a"]), ("UINT32", 1), ("UINT32", 3),
                 ("UINT32", 100000)]


def mutate_gguf_meta(s: Seeds, rng: random.Random, tokenizer: bool) -> dict:
    spec = {"metadata": list(s.gguf_spec["metadata"]), "tensors": list(s.gguf_spec["tensors"])}
    md, ts = spec["metadata"], spec["tensors"]
    keys = [i for i, m in enumerate(md) if m[0].startswith("tokenizer.") == tokenizer]
    for _ in range(rng.choice([1, 1, 1, 2])):
        op = rng.choice(["drop", "retype", "retype", "value"] + ([] if tokenizer else ["tensor", "tensor", "arch"])
                        + (["tokens", "tokens", "merges", "merges", "merges", "types", "ids"] if tokenizer else []))
        i = rng.choice(keys)
        fixed = md[13:18]  # tokens, types, merges, bos and eos: where the tokenizer ops write
        if md[i] is None or op in ("tokens", "merges", "types", "ids") and (
                None in fixed or not all(isinstance(m[1], list) for m in fixed[:3])):
            continue  # an earlier mutation of this case removed or retyped what this one changes
        key, value, vtype, sub = md[i]
        if op == "drop":
            md[i] = None
        elif op == "retype" or op == "value":
            t, v = rng.choice(_WRONG_VALUES)
            if op == "value" and vtype in ("UINT32", "FLOAT32"):
                t, v = vtype, rng.choice([0, 1, 3, 7, 2 ** 31 - 1, 2 ** 32 - 1] if vtype == "UINT32"
                                         else [float("nan"), float("inf"), -1.0, 0.0, 1e38, 1e-38])
            md[i] = (key, v, t, ("UINT32" if isinstance(v[0], int) else "STRING") if t == "ARRAY" else None)
        elif op == "arch":
            md[0] = ("general.architecture", rng.choice(["qwen2", "qwen3", "gemma", "", "llama ", "qwen3moe"]),
                     "STRING", None)
        elif op == "tensor":
            j = rng.randrange(len(ts))
            name, v, qtype = ts[j] or (None, None, None)
            what = rng.choice(["drop", "rename", "reshape", "retype", "extra", "transpose"])
            if name is None:
                continue
            if what == "drop":
                ts[j] = None
            elif what == "rename":
                new = rng.choice(["blk.0.attn_q.weight.x", "blk.9.attn_q.weight", "blk.x.attn_q.weight", "blk",
                                  "output.weight", "blk.0.ffn_gate_exps.weight", "é", name + "2"])
                if new not in {t[0] for t in ts if t}:
                    ts[j] = (new, v, qtype)
            elif what == "reshape":
                shape = rng.choice([(v.size,), (2, v.size // 2) if v.size % 64 == 0 else (v.size,),
                                    (1,) + v.shape, (v.shape[0] // 2,) + v.shape[1:]])
                ts[j] = (name, v.reshape(-1)[:math.prod(shape)].reshape(shape), "F32")
            elif what == "transpose" and v.ndim == 2:
                ts[j] = (name, np.ascontiguousarray(v.T), "F32")
            elif what == "retype":
                q = rng.choice(["Q5_K", "Q2_K", "IQ2_XXS", "TQ1_0", "Q8_K", "BF16", "I32", "F64", "Q5_0"])
                import gguf

                bs, tsz = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[q]]
                if v.shape[-1] % bs == 0:
                    raw = np.random.default_rng(rng.randrange(1 << 30)).integers(
                        0, 256, (v.size // v.shape[-1], v.shape[-1] // bs * tsz), dtype=np.uint8)
                    ts[j] = (name, (raw, q), "RAW")
            else:
                extra = rng.choice(["rope_freqs.weight", "blk.0.attn_q.bias", "blk.1.attn_q_norm.weight",
                                    "output.weight"])
                if extra not in {t[0] for t in ts if t}:
                    ts.append((extra, np.ones(HIDDEN, np.float32), "F32"))
        elif op == "tokens":
            tokens = list(md[13][1])
            k = rng.randrange(len(tokens))
            choice = rng.choice(["dup", "utf8", "huge", "drop", "empty", "space", "special"])
            if choice == "dup":
                tokens[k] = tokens[rng.randrange(len(tokens))]
            elif choice == "utf8":
                tokens[k] = b"\xff" + (tokens[k].encode() if isinstance(tokens[k], str) else tokens[k])
            elif choice == "huge":
                tokens[k] = "x" * rng.choice([1 << 16, 1 << 20])
            elif choice == "drop":
                tokens = tokens[:-rng.randint(1, 5)]
            elif choice == "empty":
                tokens[k] = ""
            elif choice == "space":
                tokens[k] = "a b"
            else:
                tokens[k] = "<|im_start|>"
            md[13] = (md[13][0], tokens, "ARRAY", "STRING")
        elif op == "merges":
            merges = list(md[15][1])
            k = rng.randrange(len(merges))
            merges[k] = rng.choice(["zzqq xxyy", "a", "a b c", "", " ", "a  b", "\u0100 \u0101", b"\xff \xfe",
                                    "Ġ Ġ", merges[k] + " ", "x" * 70000 + " y"])
            md[15] = (md[15][0], merges, "ARRAY", "STRING")
        elif op == "types":
            types = list(md[14][1])
            choice = rng.choice(["short", "range", "str"])
            if choice == "short":
                types = types[:-1]
            elif choice == "range":
                types[rng.randrange(len(types))] = rng.choice([-1, 0, 7, 99, 2 ** 31 - 1])
            else:
                md[14] = (md[14][0], [str(t) for t in types], "ARRAY", "STRING")
                continue
            md[14] = (md[14][0], types, "ARRAY", "INT32")
        elif op == "ids":
            j = rng.choice([16, 17])
            md[j] = (md[j][0], *rng.choice([(VOCAB, "UINT32"), (2 ** 32 - 1, "UINT32"), (-1, "INT32"), ("1", "STRING"),
                                             (1.5, "FLOAT32"), (True, "BOOL")]), None)
    spec["metadata"] = [m for m in md if m is not None]
    spec["tensors"] = [t for t in ts if t is not None]
    return spec


def mutate_safetensors(s: Seeds, rng: random.Random) -> tuple[bytes, bytes, int | None] | bytes:
    """(header JSON, data, header length to write or None) or the file's bytes."""
    path = os.path.join(s.st_dir, "model.safetensors")
    raw = open(path, "rb").read()
    n = struct.unpack_from("<Q", raw)[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    names = [k for k in header if k != "__metadata__"]
    op = rng.choice(["truncate", "flip", "hlen", "dtype", "shape", "offsets", "offsets", "drop", "rename", "json",
                     "entry", "meta"])
    if op == "truncate":
        bounds = [0, 4, 8, 8 + n // 2, 8 + n] + [8 + n + header[k]["data_offsets"][rng.randrange(2)] for k in names]
        return raw[:max(0, rng.choice(bounds) + rng.choice([-1, 0, 1]))]
    if op == "flip":
        b = bytearray(raw)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b)) if rng.random() < 0.3 else rng.randrange(min(len(b), 8 + n))
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b)
    if op == "hlen":
        return json.dumps(header).encode(), data, rng.choice([0, 1, 2, n - 1, n + 1, n + 8, len(raw), 2 ** 63,
                                                              2 ** 64 - 1, 2 ** 32])
    k = rng.choice(names)
    e = header[k]
    if op == "dtype":
        e["dtype"] = rng.choice(["F64", "I8", "U16", "F8_E4M3", "Q4", "", 12, None, "f32", "BOOL", "I64", "C64"])
    elif op == "shape":
        e["shape"] = rng.choice([[], [0], [-1], [2 ** 40], [2 ** 63], [2 ** 64], e["shape"][::-1], e["shape"] + [1],
                                 [1.5], ["4"], None, 7, [[2]], [e["shape"][0] * 2] + e["shape"][1:]])
    elif op == "offsets":
        a, b = e["data_offsets"]
        other = header[rng.choice(names)]["data_offsets"]
        e["data_offsets"] = rng.choice([[b, a], [0, 2 ** 40], [a, a], other, [a + 4, b + 4], [-8, b - a - 8],
                                        [a, len(data) + 8], [a, b, 0], [float(a), float(b)], "0-4", None,
                                        [2 ** 64, 2 ** 64 + b - a]])
    elif op == "drop":
        del header[k]
    elif op == "rename":
        header[rng.choice(["model.layers.7.mlp.up_proj.weight", "lm_head.weight", "x" * 10000, "", "\ud800"])] = \
            header.pop(k)
    elif op == "entry":
        header[k] = rng.choice([None, [], "F32", {"dtype": "F32"}, {**e, "extra": 1}, 3])
    elif op == "meta":
        header["__metadata__"] = rng.choice([{"format": 3}, [], None, {"x": "y" * 100000}, "pt"])
    else:  # raw JSON text damage
        text = json.dumps(header).encode()
        i = rng.randrange(len(text))
        text = text[:i] + rng.choice([b"\xff", b"{", b"]", b"\"", b"", b"\x00", b"\\u0000", b"NaN"]) + text[i + 1:]
        return text, data, None
    try:
        text = json.dumps(header, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError):
        text = json.dumps(header).encode()
    return text, data, None


_CONFIG_VALUES = [None, True, False, "12", "", 12.5, 0.0, [], {}, [1, 2], -1, 0, 1, 3, 2 ** 31, 2 ** 63, 2 ** 100,
                  1e308, float("nan"), float("inf"), float("-inf"), "x" * 100000, {"rope_type": "yarn"},
                  {"type": 5}, ["full_attention"]]


def mutate_config(s: Seeds, rng: random.Random) -> bytes:
    cfg = dict(s.config)
    op = rng.choice(["drop", "value", "value", "value", "several", "extra", "text", "text", "whole"])
    if op == "drop":
        del cfg[rng.choice(list(cfg))]
    elif op in ("value", "several"):
        for _ in range(1 if op == "value" else rng.randint(2, 4)):
            cfg[rng.choice(list(cfg))] = rng.choice(_CONFIG_VALUES)
    elif op == "extra":
        cfg.update(rng.choice([{"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
                               {"use_sliding_window": True, "sliding_window": -3, "model_type": "qwen2"},
                               {"model_type": "qwen3_moe", "num_experts": 4}, {"model_type": "mixtral"},
                               {"model_type": "qwen3_moe", "moe_intermediate_size": 64, "num_experts_per_tok": 2},
                               {"model_type": "mixtral", "num_local_experts": 0, "num_experts_per_tok": 2},
                               {"layer_types": ["x"]}, {"mlp_only_layers": "abc"}, {"model_type": "bert"},
                               {"num_key_value_heads": 3}, {"head_dim": 3}, {"hidden_act": "gelu"},
                               {"rope_parameters": {"rope_theta": "big"}}, {"rope_scaling": [1]}]))
    text = json.dumps(cfg, allow_nan=True).encode()
    if op == "text":
        i = rng.randrange(len(text))
        text = rng.choice([text[:i], text[:i] + b"\xff" + text[i:], text[:i] + b"\x00" + text[i + 1:],
                           b"\xef\xbb\xbf" + text, text.replace(b"256", b"2.56e2", 1), text + b"}",
                           text.replace(b": ", b": " + b"9" * 5000, 1)])
    elif op == "whole":
        text = rng.choice([b"", b"null", b"[]", b"\"llama\"", b"[" * 100000 + b"]" * 100000, b"{" * 50000,
                           b"{\"model_type\": \"llama\"}", b"\xff\xfe{\x00}\x00", b"12"])
    return text


def mutate_tokenizer_json(s: Seeds, rng: random.Random) -> tuple[bytes, bytes]:
    """(tokenizer.json, tokenizer_config.json) with one thing wrong."""
    tj, tc = json.loads(json.dumps(s.tokenizer_json)), dict(s.tokenizer_config)
    model = tj["model"]
    op = rng.choice(["vocab", "vocab", "merges", "merges", "model", "added", "pre", "normalizer", "decoder",
                     "text", "text", "config", "config", "deep"])
    if op == "vocab":
        k = rng.choice(list(model["vocab"]))
        what = rng.choice(["id", "drop", "dup", "key"])
        if what == "id":
            model["vocab"][k] = rng.choice([-1, 10 ** 12, 2 ** 32, "3", None, 1.5, len(model["vocab"])])
        elif what == "drop":
            del model["vocab"][k]
        elif what == "dup":
            model["vocab"][k] = model["vocab"][rng.choice(list(model["vocab"]))]
        else:
            model["vocab"]["\ud800" if rng.random() < 0.5 else "x" * 100000] = model["vocab"].pop(k)
    elif op == "merges":
        m = model["merges"]
        i = rng.randrange(len(m)) if m else 0
        m[i:i + 1] = [rng.choice(["zz qq", "a", ["a"], 5, None, ["zz", "qq"], "a b c", "", [1, 2]])]
    elif op == "model":
        model["type"] = rng.choice(["WordPiece", "Unigram", "WordLevel", "Nope", 5, None])
        if rng.random() < 0.5:
            model.pop("vocab")
    elif op == "added":
        tj["added_tokens"] = rng.choice([[{"id": 10 ** 9, "content": "x", "special": True}],
                                         [{"id": 0, "content": 5}], [{}], "tokens", [None],
                                         [{"id": -1, "content": "<|im_end|>", "special": True, "single_word": False,
                                           "lstrip": False, "rstrip": False, "normalized": False}]])
    elif op == "pre":
        tj["pre_tokenizer"] = rng.choice([{"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated",
                                           "invert": False}, {"type": "Nope"}, 5, {"type": "Sequence",
                                           "pretokenizers": [None]}, {"type": "ByteLevel"}])
    elif op == "normalizer":
        tj["normalizer"] = rng.choice([{"type": "Replace", "pattern": {"Regex": "["}, "content": ""},
                                       {"type": "Prepend", "prepend": 5}, {"type": "NFKC"}, [1]])
    elif op == "decoder":
        tj["decoder"] = rng.choice([{"type": "Nope"}, {"type": "Replace", "pattern": {"String": "a"}}, "x"])
    elif op == "config":
        key = rng.choice(["bos_token", "eos_token", "chat_template", "unk_token", "pad_token"])
        tc[key] = rng.choice([5, [], {"content": 5}, {"content": "x" * 100000}, None, "<|not_a_token|>", 1.5,
                              {"nested": {"content": "a"}}])
        if rng.random() < 0.2:
            return json.dumps(tj).encode(), rng.choice([b"", b"[1]", b"{", b"\xff", b"NaN", b"null"])
    elif op == "deep":
        return b"[" * 100000 + b"]" * 100000, json.dumps(tc).encode()
    text = json.dumps(tj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if op == "text":
        i = rng.randrange(len(text))
        text = rng.choice([text[:i], text[:i] + b"\xff" + text[i:], text[:i] + b"}" + text[i + 1:],
                           bytes(b ^ (1 << rng.randrange(8)) if j == i else b for j, b in enumerate(text))])
    return text, json.dumps(tc).encode()


def make_case(s: Seeds, kind: str, case: int, folder: str) -> str:
    """Writes case `case` of `kind` into `folder` (emptied first); returns the path to load."""
    rng = random.Random(f"{kind}:{case}")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    if kind == "gguf":
        path = os.path.join(folder, "model.gguf")
        with open(path, "wb") as f:
            f.write(mutate_gguf_bytes(s, rng))
        return path
    if kind in ("gguf-meta", "tokenizer"):
        path = os.path.join(folder, "model.gguf")
        write_gguf(path, mutate_gguf_meta(s, rng, kind == "tokenizer"))
        return path
    shutil.copy(os.path.join(s.st_dir, "config.json"), folder)
    st = os.path.join(folder, "model.safetensors")
    if kind == "tokenizer-json":
        shutil.copy(os.path.join(s.st_dir, "model.safetensors"), folder)
        tj, tc = mutate_tokenizer_json(s, rng)
        for name, data in (("tokenizer.json", tj), ("tokenizer_config.json", tc)):
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
    elif kind == "safetensors":
        m = mutate_safetensors(s, rng)
        if isinstance(m, bytes):
            with open(st, "wb") as f:
                f.write(m)
        else:
            write_safetensors_raw(st, *m)
    else:
        shutil.copy(os.path.join(s.st_dir, "model.safetensors"), folder)
        with open(os.path.join(folder, "config.json"), "wb") as f:
            f.write(mutate_config(s, rng))
    return folder


# ---------------------------------------------------------------------------------------------------- the worker
def _allocate(_):
    return bytearray(2 * MEMORY_CAP)


def _unnamed(_):
    raise ValueError("a message that names no file")


def _escape(folder):
    raise KeyError(folder)


# Cases that fail on purpose, each in its own way: the harness must report every one (tests/test_fuzz_loaders.py).
SELFTESTS = {"selftest-hang": lambda _: time.sleep(3600), "selftest-crash": lambda _: os.abort(),
             "selftest-memory": _allocate, "selftest-unnamed": _unnamed, "selftest-escape": _escape}


def worker(work: str) -> None:
    """Reads case lines ("kind number") on stdin, answers one JSON line per case on stdout."""
    import resource
    import warnings

    warnings.simplefilter("ignore")
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    from luminal.loaders import load_llama

    seeds = Seeds(os.path.join(work, f"seeds-{os.getpid()}"))
    folder = os.path.join(work, f"case-{os.getpid()}")
    out = sys.__stdout__
    sys.stdout = sys.stderr  # anything the loaders print must not break the protocol
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        kind, case = line.split()
        try:
            path = folder if kind in SELFTESTS else make_case(seeds, kind, int(case), folder)
        except Exception as e:  # noqa: BLE001 - a mutation the writers refuse: no case (reported, not a failure)
            out.write(json.dumps({"status": "unwritable", "type": type(e).__name__, "msg": str(e)[:300]}) + "\n")
            out.flush()
            continue
        t0 = time.perf_counter()
        try:
            if kind in SELFTESTS:
                SELFTESTS[kind](folder)
            model, tok = load_llama(path, progress=False)
            if tok is not None:
                tok.decode(tok.encode(TEXT))
            res = {"status": "ok"}
        except ValueError as e:
            res = {"status": "error" if folder in str(e) else "unnamed", "type": type(e).__name__, "msg": str(e)[:300]}
        except MemoryError as e:
            res = {"status": "memory", "type": type(e).__name__, "msg": str(e)[:300]}
        except BaseException as e:  # noqa: BLE001 - what the fuzzer is looking for
            res = {"status": "escape", "type": type(e).__name__, "msg": str(e)[:300]}
        res["time"] = time.perf_counter() - t0
        out.write(json.dumps(res) + "\n")
        out.flush()


class Worker:
    def __init__(self, work: str):
        self.work = work
        self.proc = None

    def start(self):
        env = dict(os.environ, OMP_NUM_THREADS="1", LUMINAL_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", self.work],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env)
        line = self._read(120)
        if line != "ready":
            raise RuntimeError(f"fuzz worker did not start ({line!r})")

    def _read(self, timeout: float) -> str | None:
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            return None
        line = self.proc.stdout.readline()
        return line.strip() if line else ""

    def run(self, kind: str, case: int, timeout: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.proc.stdin.write(f"{kind} {case}\n")
        self.proc.stdin.flush()
        line = self._read(timeout)
        if line:
            return json.loads(line)
        if line is None:  # no answer in time
            self.stop()
            return {"status": "hang", "msg": f"no answer in {timeout} s"}
        rc = self.proc.wait()
        self.proc = None
        return {"status": "crash", "msg": f"worker died with status {rc}"}

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def cases_for(n: int, kinds: list[str], seed: int = 0) -> list[tuple[str, int]]:
    """n cases spread over `kinds` in the KINDS proportions, numbered from `seed` * 1_000_000."""
    weights = [KINDS[k] for k in kinds]
    rng = random.Random(seed)
    return [(k, seed * 1_000_000 + i) for i, k in enumerate(rng.choices(kinds, weights, k=n))]


def fuzz(n: int, workers: int = 2, kinds: list[str] | None = None, seed: int = 0, timeout: float = 20.0,
         verbose: bool = False) -> dict:
    """Runs n cases; returns {'counts': {kind: {status: count}}, 'failures': [...], 'seconds': ...}."""
    cases = cases_for(n, kinds or list(KINDS), seed)
    work = tempfile.mkdtemp(prefix="luminal-fuzz-")
    counts = collections.defaultdict(collections.Counter)
    failures, lock, it = [], threading.Lock(), iter(cases)
    errors, examples = collections.Counter(), {}  # (kind, exception type): count, and one message
    t0 = time.perf_counter()

    def loop():
        w = Worker(work)
        try:
            while True:
                with lock:
                    nxt = next(it, None)
                if nxt is None:
                    return
                res = w.run(*nxt, timeout)
                with lock:
                    counts[nxt[0]][res["status"]] += 1
                    if res["status"] == "error":
                        errors[(nxt[0], res["type"])] += 1
                        examples.setdefault((nxt[0], res["type"]), res["msg"])
                    if res["status"] not in ("ok", "error", "unwritable"):
                        failures.append((nxt, res))
                        if verbose:
                            print(nxt, res, flush=True)
        finally:
            w.stop()

    try:
        threads = [threading.Thread(target=loop) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"counts": {k: dict(v) for k, v in counts.items()}, "failures": failures,
            "errors": {k: (c, examples[k]) for k, c in errors.items()}, "seconds": time.perf_counter() - t0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--kind", action="append", choices=list(KINDS), help="only these kinds (repeatable)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per case before it counts as a hang")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    r = fuzz(args.cases, args.workers, args.kind, args.seed, args.timeout, args.verbose)
    total = collections.Counter()
    for kind, c in sorted(r["counts"].items()):
        total.update(c)
        print(f"{kind:12s} " + "  ".join(f"{s}={v}" for s, v in sorted(c.items())))
    print(f"{'all':12s} " + "  ".join(f"{s}={v}" for s, v in sorted(total.items())) + f"   ({r['seconds']:.0f} s)")
    if args.verbose:
        for (kind, etype), (c, msg) in sorted(r["errors"].items()):
            print(f"  {c:5d} x {kind} {etype}, e.g. {msg[:150]!r}")
    by_class = collections.Counter((res["status"], res.get("type"), res.get("msg", "")[:80])
                                   for _, res in r["failures"])
    for (status, etype, msg), c in by_class.most_common(40):
        print(f"  {c:5d} x {status} {etype}: {msg}")
    return 1 if r["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
