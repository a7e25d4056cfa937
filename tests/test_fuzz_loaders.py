"""The model loaders against corrupt files: a seeded sample of benchmarks/fuzz_loaders.py (mutated GGUF, safetensors,
config.json and tokenizer metadata; each case in a worker process under a time limit and a memory cap), and the
classes of bugs it found, one by one."""
from __future__ import annotations

import importlib.util
import json
import math
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from luminal.gguf import GGUFError, GGUFFile  # noqa: E402
from luminal.loaders import ConfigError, UnsupportedConfigError, load_llama  # noqa: E402
from luminal.nn import LlamaConfig  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "fuzz_loaders", Path(__file__).resolve().parents[1] / "benchmarks" / "fuzz_loaders.py")
fuzz_loaders = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz_loaders)


def test_fuzz_sample():
    """300 seeded cases over every kind: each loads or raises a ValueError naming the file; none escapes as another
    exception, crashes its worker, hangs or runs out of memory."""
    r = fuzz_loaders.fuzz(300, workers=2, seed=0, timeout=30)
    failures = [(case, res["status"], res.get("type"), res.get("msg")) for case, res in r["failures"]]
    assert not failures, failures[:10]
    counts = r["counts"]
    assert set(counts) == set(fuzz_loaders.KINDS)
    total = {s: sum(c.get(s, 0) for c in counts.values()) for s in ("ok", "error", "unwritable")}
    assert sum(total.values()) == 300
    # the mutations reach the loaders: most are refused, some are valid files
    assert total["error"] > 150 and total["ok"] > 10 and total["unwritable"] < 15, counts
    for kind, c in counts.items():
        assert c.get("error", 0) > 0, (kind, c)


def test_fuzz_harness_reports_every_failure():
    """Cases that hang, crash, run out of memory, raise another exception or an error naming no file are each
    reported as such, and the worker is replaced after a hang or a crash."""
    w = fuzz_loaders.Worker(tempfile.mkdtemp(prefix="luminal-fuzz-test-"))
    try:
        got = {kind: w.run(kind, 0, timeout=3)["status"] for kind in
               ("selftest-hang", "selftest-crash", "selftest-memory", "selftest-escape", "selftest-unnamed")}
        assert got == {"selftest-hang": "hang", "selftest-crash": "crash", "selftest-memory": "memory",
                       "selftest-escape": "escape", "selftest-unnamed": "unnamed"}
        assert w.run("config", 0, timeout=30)["status"] in ("ok", "error")  # a fresh worker after the crash
    finally:
        w.stop()
        shutil.rmtree(w.work, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- config.json
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The fuzzer's seed checkpoint: config.json + model.safetensors of a tiny Llama, and its GGUF."""
    return fuzz_loaders.Seeds(str(tmp_path_factory.mktemp("seeds")))


def _with_config(seeds, tmp_path, text: bytes | str) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir(exist_ok=True)
    (d / "model.safetensors").write_bytes((Path(seeds.st_dir) / "model.safetensors").read_bytes())
    (d / "config.json").write_bytes(text.encode() if isinstance(text, str) else text)
    return d


def test_checkpoint_loads(checkpoint):
    model, tok = load_llama(checkpoint.st_dir, progress=False)
    assert tok is None and model.config.n_layers == fuzz_loaders.LAYERS
    model, tok = load_llama(checkpoint.gguf_path, progress=False)
    assert tok.decode(tok.encode("Hello world")) == "Hello world"


@pytest.mark.parametrize("change,match", [
    ({"hidden_size": None}, "'hidden_size' should be an integer"),
    ({"hidden_size": 256.0}, "'hidden_size' should be an integer"),
    ({"hidden_size": "256"}, "'hidden_size'"),
    ({"num_hidden_layers": 2 ** 70}, "'num_hidden_layers' should be an integer in 1"),
    ({"num_attention_heads": -4}, "'num_attention_heads'"),
    ({"vocab_size": True}, "'vocab_size'"),
    ({"rope_theta": float("nan")}, "not a valid JSON"),  # NaN is not JSON
    ({"rope_theta": 1e400}, "not a valid JSON"),  # Infinity
    ({"rms_norm_eps": -1e-5}, "'rms_norm_eps' should be a finite positive number"),
    ({"tie_word_embeddings": "yes"}, "'tie_word_embeddings' should be true or false"),
    ({"rope_scaling": [1]}, "'rope_scaling'"),
    ({"rope_scaling": {"rope_type": 5}}, "'rope_scaling'"),
    ({"mlp_only_layers": "0"}, "'mlp_only_layers'"),
    ({"model_type": ["llama"]}, "'model_type' should be a string"),
    ({"model_type": "bert"}, "model_type 'bert' is not supported"),
    ({"model_type": "mixtral"}, "key 'num_local_experts' is missing"),
    ({"model_type": "qwen3_moe", "num_experts": 4}, "key 'moe_intermediate_size' is missing"),
    ({"model_type": "qwen3_moe", "moe_intermediate_size": 64, "num_experts_per_tok": 2},
     "key 'num_experts' or 'num_local_experts' is missing"),
    ({"num_key_value_heads": 3}, "4 attention heads cannot be grouped over 3 KV heads"),
    ({"head_dim": 3}, "head_dim 3 must be even"),
    ({"num_hidden_layers": 3}, "1 missing layer"),
    ({"vocab_size": 401}, r"model.embed_tokens.weight: expected \(401, 256\), got \(400, 256\)"),
])
def test_config_errors_name_file_and_key(checkpoint, tmp_path, change, match):
    cfg = {**checkpoint.config, **change}
    text = json.dumps(cfg).replace("1e400", "Infinity") if math.isinf(cfg.get("rope_theta", 0)) else json.dumps(cfg)
    d = _with_config(checkpoint, tmp_path, text)
    with pytest.raises(ConfigError, match=match) as ei:
        load_llama(d, progress=False)
    assert str(d) in str(ei.value)


def test_config_missing_key_and_bad_json(checkpoint, tmp_path):
    cfg = dict(checkpoint.config)
    del cfg["intermediate_size"]
    for text, match in [(json.dumps(cfg), "key 'intermediate_size' is missing"), (b"", "not a valid JSON"),
                        (b"[1, 2]", "not an object"), (b"{\"a\": \xff}", "not a valid JSON"),
                        (b"[" * 100000 + b"]" * 100000, "not a valid JSON"),
                        (b"{\"hidden_size\": " + b"9" * 5000 + b"}", "not a valid JSON")]:
        d = _with_config(checkpoint, tmp_path, text)
        with pytest.raises(ConfigError, match=match) as ei:
            load_llama(d, progress=False)
        assert str(d / "config.json") in str(ei.value)


def test_unsupported_config_is_both_value_and_not_implemented_error(checkpoint, tmp_path):
    d = _with_config(checkpoint, tmp_path, json.dumps({**checkpoint.config,
                                                        "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}))
    with pytest.raises(UnsupportedConfigError, match="rope_type 'yarn'") as ei:
        LlamaConfig.from_hf(d / "config.json")
    assert isinstance(ei.value, NotImplementedError) and isinstance(ei.value, ValueError)
    with pytest.raises(ConfigError, match="'hidden_size'") as ei:  # a dict is checked the same way
        LlamaConfig.from_hf({**checkpoint.config, "hidden_size": [256]})
    assert str(ei.value).startswith("config: ")


def test_tokenizer_json_errors_name_file(checkpoint, tmp_path):
    """tokenizer.json and tokenizer_config.json beside the weights: `tokenizers`' plain Exceptions become a
    TokenizerError naming the file."""
    from luminal.tokenizer import TokenizerError

    d = _with_config(checkpoint, tmp_path, json.dumps(checkpoint.config))
    good = json.dumps(checkpoint.tokenizer_json)
    (d / "tokenizer.json").write_text(good)
    (d / "tokenizer_config.json").write_text(json.dumps(checkpoint.tokenizer_config))
    _, tok = load_llama(d, progress=False)
    assert tok.bos_token_id == tok.token_to_id("<|im_start|>") and tok.decode(tok.encode("Hi there")) == "Hi there"
    bad_merges = json.loads(good)
    bad_merges["model"]["merges"][3] = ["zz", "qq"] if isinstance(bad_merges["model"]["merges"][3], list) else "zz qq"
    bad_regex = {**json.loads(good), "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "("},
                                                      "behavior": "Isolated", "invert": False}}
    for text, match in [(good[:100], "not a valid tokenizer.json"), (json.dumps(bad_merges), "zz"),
                        (json.dumps(bad_regex), "not a valid tokenizer.json"), ("[1]", "not a valid tokenizer.json")]:
        (d / "tokenizer.json").write_text(text)
        with pytest.raises(TokenizerError, match=match) as ei:
            load_llama(d, progress=False)
        assert str(d / "tokenizer.json") in str(ei.value)
    (d / "tokenizer.json").write_text(good)
    (d / "tokenizer_config.json").write_bytes(b"{\xff")
    with pytest.raises(TokenizerError, match="not a valid JSON") as ei:
        load_llama(d, progress=False)
    assert str(d / "tokenizer_config.json") in str(ei.value)
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": {"content": 5}, "eos_token": []}))
    assert load_llama(d, progress=False)[1].bos_token_id is None  # not a token: no id, as when absent


# ----------------------------------------------------------------------------------------------------------- GGUF
def _gguf(seeds, tmp_path, mutate) -> Path:
    spec = {"metadata": list(seeds.gguf_spec["metadata"]), "tensors": list(seeds.gguf_spec["tensors"])}
    mutate(spec)
    p = tmp_path / "m.gguf"
    fuzz_loaders.write_gguf(p, spec)
    return p


def _set(spec, key, value, vtype, sub=None):
    spec["metadata"] = [m for m in spec["metadata"] if m[0] != key] + [(key, value, vtype, sub)]


@pytest.mark.parametrize("key,value,vtype,match", [
    ("llama.feed_forward_length", 2 ** 64 - 1, "UINT64", "feed_forward_length should be an integer in 1"),
    ("llama.block_count", 10 ** 6, "UINT32", "1000000 layers"),
    ("llama.attention.head_count_kv", 3, "UINT32", "4 attention heads cannot be grouped over 3 KV heads"),
    ("llama.rope.freq_base", float("nan"), "FLOAT32", "freq_base should be a finite positive number"),
    ("llama.expert_count", 2 ** 63, "UINT64", "expert_count should be an integer"),
    ("llama.embedding_length", "256", "STRING", "embedding_length' should be a number"),
])
def test_gguf_hyperparameter_errors(checkpoint, tmp_path, key, value, vtype, match):
    p = _gguf(checkpoint, tmp_path, lambda s: _set(s, key, value, vtype))
    with pytest.raises(GGUFError, match=match) as ei:
        load_llama(p, progress=False)
    assert str(p) in str(ei.value)


@pytest.mark.parametrize("merge,match", [("zzqq xxyy", "needs token 'zzqq'"), ("a b c", "not two tokens"),
                                         ("Ġ qqq", "needs token 'qqq'")])
def test_tokenizer_merges_naming_unknown_tokens(checkpoint, tmp_path, merge, match):
    def mutate(s):
        merges = [m[1] for m in s["metadata"] if m[0] == "tokenizer.ggml.merges"][0]
        _set(s, "tokenizer.ggml.merges", merges[:5] + [merge] + merges[5:], "ARRAY", "STRING")
    p = _gguf(checkpoint, tmp_path, mutate)
    with pytest.raises(GGUFError, match=match) as ei:
        load_llama(p, progress=False)
    assert str(p) in str(ei.value) and "merge 5" in str(ei.value)


def test_tokenizer_token_type_not_an_array(checkpoint, tmp_path):
    p = _gguf(checkpoint, tmp_path, lambda s: _set(s, "tokenizer.ggml.token_type", 1, "INT32"))
    with pytest.raises(GGUFError, match="token_type' should be an array"):
        load_llama(p, progress=False)


def _info_offset(path: Path, name: str) -> int:
    """File offset of a tensor-info entry's n_dims field (right after its name)."""
    key = struct.pack("<Q", len(name)) + name.encode()
    data = path.read_bytes()
    return data.index(key) + len(key)


def test_gguf_overlapping_and_out_of_file_tensor_data(checkpoint, tmp_path):
    data = bytearray(Path(checkpoint.gguf_path).read_bytes())
    src = Path(checkpoint.gguf_path)
    g = GGUFFile(src)
    a, b = g.tensors["blk.0.attn_q.weight"], g.tensors["blk.0.attn_k.weight"]
    pos = _info_offset(src, b.name) + 4 + 8 * len(b.dims) + 4
    p = tmp_path / "bad.gguf"
    for offset, match in [(a.offset, "overlap"), (a.offset + 64, "overlap"), (len(data), "out of bounds"),
                          (2 ** 64 - 32, "out of bounds")]:
        struct.pack_into("<Q", data, pos, offset)
        p.write_bytes(bytes(data))
        with pytest.raises(GGUFError, match=match) as ei:
            GGUFFile(p)
        assert str(p) in str(ei.value) and b.name in str(ei.value)


def test_gguf_array_count_past_the_end_does_not_loop(tmp_path):
    """Upstream's reader loops `count` times over an array of scalars whose count runs past the end of the file (a
    short read is an empty array there): here the count is checked first."""
    p = tmp_path / "a.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_array("t.ints", list(range(10)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    data = bytearray(p.read_bytes())
    i = data.index(b"t.ints") + 6 + 4  # the array's element type, then its count
    struct.pack_into("<Q", data, i + 4, 2 ** 62)
    p.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="claims 4611686018427387904 elements"):
        GGUFFile(p)


def test_gguf_bad_utf8_key_and_duplicate_tensor(checkpoint, tmp_path):
    data = bytearray(Path(checkpoint.gguf_path).read_bytes())
    i = data.index(b"general.name")
    data2 = bytearray(data)
    data2[i:i + 12] = b"general.\xff\xfeme"
    p = tmp_path / "u.gguf"
    p.write_bytes(bytes(data2))
    with pytest.raises(GGUFError, match="not valid UTF-8"):
        GGUFFile(p)
    j = data.index(b"blk.0.attn_q.weight")
    data3 = bytearray(data)
    data3[j:j + 19] = b"blk.0.attn_k.weight"
    p.write_bytes(bytes(data3))
    with pytest.raises(GGUFError, match="duplicate tensor name 'blk.0.attn_k.weight'"):
        GGUFFile(p)
    assert np.isfinite(GGUFFile(checkpoint.gguf_path).dequantize("blk.0.ffn_gate.weight")).all()  # Q4_K in the seed
