"""Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm) and mixtures of experts (Qwen3-MoE, Mixtral) on the Llama-family
model, against Hugging Face transformers with the same random weights: prefill logits, greedy generation through the
KV-cache session, safetensors checkpoints (experts stored one by one), and GGUF files (F32 and Q8_0) written with the
`gguf` package's GGUFWriter under llama.cpp's tensor names and metadata keys."""
import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

import luminal as lm
from luminal.compiler import GenericCompiler
from luminal.gguf import GGUFError, permute_qk
from luminal.loaders import load_llama
from luminal.nn import Llama, LlamaConfig, Session, SparseMoE, gguf_state_dict

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6)
# model_type -> (config class, model class, extra config). Qwen3-MoE: 3 layers, the middle one a dense MLP
# (mlp_only_layers), raw top-k weights (HF's default norm_topk_prob=False); Mixtral renormalises them always, and
# slides a 6-token window over a 9-token prompt plus generation.
ARCHS = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, num_hidden_layers=3,
                       mlp_only_layers=[1])),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, sliding_window=6)),
}
MOE = ["qwen3_moe", "mixtral"]


def hf_model(arch: str, seed: int, **extra):
    cfg_cls, model_cls, arch_extra = ARCHS[arch]
    hc = getattr(transformers, cfg_cls)(**{**COMMON, **arch_extra, **extra})
    torch.manual_seed(seed)
    m = getattr(transformers, model_cls)(hc).eval()
    m.generation_config.eos_token_id = None  # (Mixtral's is 2): greedy decoding never stops or avoids a token
    with torch.no_grad():  # weights large enough that the router's choices are clear, norms away from 1
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.2)
    return m


def ids_for(seed, n=9):
    return np.random.default_rng(seed).integers(0, COMMON["vocab_size"], n).tolist()


def reference(ref, ids, new_tokens=8):
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0].numpy()
        tokens = ref.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)[0, len(ids):].tolist()
    return logits, tokens


# ---- configs ----------------------------------------------------------------------------------------------------
def test_config_from_hf():
    q2 = LlamaConfig.from_hf(hf_model("qwen2", 0).config.to_dict())
    assert q2.attention_bias and not q2.attention_out_bias and not q2.qk_norm and q2.num_experts == 0
    q3 = LlamaConfig.from_hf(hf_model("qwen3", 0).config.to_dict())
    assert q3.qk_norm and not q3.attention_bias and q3.head_dim == 16
    moe = LlamaConfig.from_hf(hf_model("qwen3_moe", 0).config.to_dict())
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (8, 2, 32)
    assert not moe.norm_topk_prob
    assert [moe.is_moe(i) for i in range(3)] == [True, False, True] and moe.ffn == 96
    mx = LlamaConfig.from_hf(hf_model("mixtral", 0).config.to_dict())
    assert (mx.num_experts, mx.moe_intermediate_size, mx.norm_topk_prob, mx.sliding_window) == (4, 32, True, 6)
    assert all(mx.is_sliding(i) for i in range(2))
    # A hub config.json (transformers 4 spelling): num_experts, top-level rope_theta, and Qwen2's sliding window
    # only from max_window_layers on, when use_sliding_window is set.
    hub = {"model_type": "qwen3_moe", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 128, "rope_theta": 1e6, "num_experts": 16,
           "num_experts_per_tok": 4, "moe_intermediate_size": 32, "norm_topk_prob": True, "rope_scaling": None}
    c = LlamaConfig.from_hf(hub)
    assert (c.num_experts, c.num_experts_per_tok, c.rope_theta, c.norm_topk_prob) == (16, 4, 1e6, True)
    q2 = LlamaConfig.from_hf({**hub, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4,
                              "max_window_layers": 1})
    assert q2.num_experts == 0 and [q2.is_sliding(i) for i in range(2)] == [False, True]


def test_config_errors():
    hub = {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96, "num_hidden_layers": 2,
           "vocab_size": 128}
    with pytest.raises(ValueError, match="model_type 'qwen2_moe' is not supported"):
        LlamaConfig.from_hf({**hub, "model_type": "qwen2_moe"})
    with pytest.raises(NotImplementedError, match="rope_type 'llama3'"):
        LlamaConfig.from_hf({**hub, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        LlamaConfig.from_hf({**hub, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match=r"num_experts_per_tok <= 4 \(got 5\)"):
        LlamaConfig(128, 64, 96, 2, 4, 2, 16, num_experts=4, num_experts_per_tok=5, moe_intermediate_size=32)
    with pytest.raises(ValueError, match="unknown MoE form 'sparse'"):
        Llama(LlamaConfig.from_hf(hf_model("mixtral", 0).config.to_dict()), moe_form="sparse")


# ---- against transformers ----------------------------------------------------------------------------------------
CASES = [("qwen2", "routed"), ("qwen3", "routed"), ("qwen3_moe", "routed"), ("qwen3_moe", "dense"),
         ("mixtral", "routed"), ("mixtral", "dense")]


@pytest.mark.parametrize("arch,form", CASES)
def test_matches_transformers(arch, form, backend, seed):
    """Prefill logits, then 8 greedy tokens through the KV cache (one compiled graph for every step) equal
    transformers' generate(do_sample=False)."""
    ref = hf_model(arch, seed)
    model = Llama(LlamaConfig.from_hf(ref.config.to_dict()), moe_form=form).load_state_dict(ref.state_dict())
    sess = Session(model, [GenericCompiler()] + backend.compilers("float32"), last_only=False, capacity=8)
    ids = ids_for(seed)
    want_logits, want_tokens = reference(ref, ids)
    np.testing.assert_allclose(sess.step(ids), want_logits, atol=1e-4, rtol=1e-4, err_msg=f"seed {seed}")
    sess.reset()
    assert list(sess.generate(ids, 8)) == want_tokens, f"seed {seed}"


def test_sliding_window_per_layer(seed):
    """Qwen2 with use_sliding_window: layers from max_window_layers on see only the last 4 positions (a 9-token
    prompt and 8 more), the first layer everything."""
    ref = hf_model("qwen2", seed, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    cfg = LlamaConfig.from_hf(ref.config.to_dict())
    assert [cfg.is_sliding(i) for i in range(2)] == [False, True]
    ids = ids_for(seed)
    want_logits, want_tokens = reference(ref, ids)
    sess = Session(Llama(cfg).load_state_dict(ref.state_dict()), last_only=False)
    np.testing.assert_allclose(sess.step(ids), want_logits, atol=1e-4, rtol=1e-4, err_msg=f"seed {seed}")
    sess.reset()
    assert list(sess.generate(ids, 8)) == want_tokens, f"seed {seed}"


def test_moe_forms_and_step_pieces_agree(seed, monkeypatch):
    """The routed and dense expert forms compute the same logits; a prompt fed in pieces (max_step_tokens; by
    default 16 tokens for routed experts) gives the logits of one step, and so does generation afterwards."""
    ref = hf_model("qwen3_moe", seed, norm_topk_prob=True)
    cfg = LlamaConfig.from_hf(ref.config.to_dict())
    ids = ids_for(seed, 21)
    out = {}
    for form, pieces, bound in [("routed", 0, None), ("dense", None, None), ("routed", 4, 4), ("routed", None, 16)]:
        sess = Session(Llama(cfg, moe_form=form).load_state_dict(ref.state_dict()), last_only=False,
                       max_step_tokens=pieces)
        assert sess.max_step_tokens == bound
        out[form, pieces] = sess.step(ids), list(sess.generate([5], 4))
        assert sess.length == len(ids) + 1 + 4
    base_logits, base_tokens = out["routed", 0]
    assert base_logits.shape == (21, 128)
    for key, (logits, tokens) in out.items():
        np.testing.assert_allclose(logits, base_logits, atol=1e-5, rtol=1e-5, err_msg=f"{key}, seed {seed}")
        assert tokens == base_tokens, key
    with torch.no_grad():
        np.testing.assert_allclose(base_logits, ref(torch.tensor([ids])).logits[0].numpy(), atol=1e-4, rtol=1e-4)
    last = Session(Llama(cfg).load_state_dict(ref.state_dict()))  # last_only: the last piece's last row
    np.testing.assert_allclose(last.step(ids), base_logits[-1:], atol=1e-5, rtol=1e-5)
    # Greedy generation queued a step ahead (as on a GPU) feeds the prompt's pieces queued too.
    last.reset()
    want = list(last.generate(ids, 4))
    monkeypatch.setattr(lm.Graph, "queues_runs", property(lambda self: True))
    last.reset()
    assert list(last.generate(ids, 4)) == want and last.length == len(ids) + 4
    with pytest.raises(ValueError, match="max_step_tokens must be positive"):
        Session(Llama(cfg), max_step_tokens=-1)


def test_routing_is_top_k(seed):
    """SparseMoE.route: the k most probable experts, their softmax weights (renormalised with norm_topk_prob)."""
    ref = hf_model("qwen3_moe", seed, norm_topk_prob=True)
    cfg = LlamaConfig.from_hf(ref.config.to_dict())
    model = Llama(cfg).load_state_dict(ref.state_dict())
    moe = model.model.layers[0].mlp
    assert isinstance(moe, SparseMoE)
    x = np.random.default_rng(seed).standard_normal((5, 64)).astype(np.float32)
    weights, experts = moe.route(model.graph.tensor(("s", 64)).set(x))
    weights, experts = weights.output(), experts.output()
    model.graph.compile(lm.GenericCompiler(), lm.CPUCompiler())
    model.graph.execute()
    with torch.no_grad():
        _, want_w, want_e = ref.model.layers[0].mlp.gate(torch.from_numpy(x))
    np.testing.assert_array_equal(experts.numpy(), want_e.numpy())
    np.testing.assert_allclose(weights.numpy(), want_w.numpy(), atol=1e-6)


# ---- checkpoints --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["qwen2", "qwen3_moe", "mixtral"])
def test_safetensors_checkpoint(tmp_path, arch, seed):
    """save_pretrained writes experts one by one (mlp.experts.N.gate_proj.weight; Mixtral's
    block_sparse_moe.experts.N.w1.weight): load_llama stacks them."""
    ref = hf_model(arch, seed)
    ref.save_pretrained(tmp_path)
    names = json.dumps(list(safe_open(tmp_path / "model.safetensors", "np").keys()))
    if arch != "qwen2":
        assert (".experts.0.w1.weight" if arch == "mixtral" else ".experts.0.gate_proj.weight") in names
    model, tok = load_llama(tmp_path, progress=False)
    assert tok is None and model.config.model_type == arch
    ids = ids_for(seed)
    np.testing.assert_allclose(Session(model, last_only=False).step(ids), reference(ref, ids, 1)[0],
                               atol=1e-4, rtol=1e-4, err_msg=f"seed {seed}")


def test_incomplete_experts_are_reported(seed):
    ref = hf_model("mixtral", seed)
    sd = {k: v for k, v in ref.state_dict().items()}
    cfg = LlamaConfig.from_hf(ref.config.to_dict())
    sd["model.layers.0.mlp.experts.gate_up_proj"] = sd["model.layers.0.mlp.experts.gate_up_proj"][:3]
    with pytest.raises(ValueError, match=r"experts.gate_up_proj: expected \(256, 64\), got \(192, 64\)"):
        Llama(cfg).load_state_dict(sd)


# ---- GGUF ---------------------------------------------------------------------------------------------------------
GGUF_ARCH = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "mixtral": "llama"}
_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
}


def gguf_tensors(ref, arch: str) -> dict:
    """transformers' state dict under llama.cpp's GGUF names (as its converter writes them: q/k rows permuted for the
    llama architecture only, experts as (E, rows, cols) tensors with gate and up apart)."""
    c = ref.config
    out = {}
    for name, v in ref.state_dict().items():
        v = v.numpy()
        parts = name.split(".")
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = v
        elif name == "model.norm.weight":
            out["output_norm.weight"] = v
        elif name == "lm_head.weight":
            out["output.weight"] = v
        elif name.endswith("mlp.experts.gate_up_proj"):
            half = v.shape[1] // 2
            out[f"blk.{parts[2]}.ffn_gate_exps.weight"], out[f"blk.{parts[2]}.ffn_up_exps.weight"] = \
                v[:, :half], v[:, half:]
        elif name.endswith("mlp.experts.down_proj"):
            out[f"blk.{parts[2]}.ffn_down_exps.weight"] = v
        else:
            gname = f"blk.{parts[2]}.{_LAYER_NAMES['.'.join(parts[3:-1])]}.{parts[-1]}"
            if GGUF_ARCH[arch] == "llama" and parts[4] in ("q_proj", "k_proj"):
                v = permute_qk(v, c.num_attention_heads if parts[4] == "q_proj" else c.num_key_value_heads)
            out[gname] = v
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def write_gguf(path, ref, arch: str, qtype: str):
    """A GGUF of `ref` with F32 weights, or Q8_0 for every matrix but the router (as llama.cpp quantises)."""
    c, a = ref.config, GGUF_ARCH[arch]
    w = gguf.GGUFWriter(str(path), a)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(256)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if arch in MOE:
        w.add_expert_count(c.num_local_experts if arch == "mixtral" else c.num_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
    if arch == "qwen3_moe":
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    for name, v in gguf_tensors(ref, arch).items():
        if qtype == "Q8_0" and v.ndim >= 2 and "ffn_gate_inp" not in name:
            w.add_tensor(name, gguf.quants.quantize(v, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def q8_0_round(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """`x` rounded as luminal's CPU QMatMul rounds its activations at decode (src/core/cpu/simd.h quantize_q8, checked
    in test_cpu_kernels.py; llama.cpp's Q8_0 activation blocks but with a float32 scale): blocks of 32 along the last
    dim, scale d = max|x| / 127, q = x * (1 / d) rounded half to even, all in float32. Returns q * d (its products
    with the unpacked weights are the kernel's integer block products times the two scales) and the smallest distance
    of an x / d to a rounding boundary (half a step from q), in steps."""
    b = x.reshape(*x.shape[:-1], -1, 32)
    d = b.abs().amax(-1, keepdim=True) / 127
    v = b * torch.where(d != 0, 1 / d, torch.zeros_like(d))
    q = torch.round(v)
    return (q * d).reshape(x.shape), (0.5 - (v - q).abs()).min().item()


def rounded_decode(ref, ids, first=7, margin=1e-3):
    """(token, logits) of a one-token decode step after the prompt `ids` in `ref`, its inputs to every nn.Linear
    rounded by q8_0_round as luminal does over Q8_0 weights: there exactly these products (attention projections,
    dense MLPs, lm_head) are QMatMuls, and the kernel rounds activations only for at most 4 rows (the 9-token prompt
    stays float). The router (F32 in the file) and the routed experts (their rows unpacked, then float products)
    are other modules here, and keep float activations there too.

    The token: the first from `first` on whose activations all lie `margin` steps or more from a rounding boundary.
    Luminal's activations differ from these in their last float32 bits (summation order), a small fraction of
    `margin` in steps (|x / d| <= 127); one nearer a boundary could round the other way there, a whole step off,
    which moves the logits far more than DECODE_BOUND allows."""
    assert len(ids) > 4, "the prompt must take the kernel's float path (more than 4 rows)"
    closest = []

    def hook(module, args):
        x = args[0].clone()
        x[..., -1, :], dist = q8_0_round(x[..., -1, :])
        closest.append(dist)
        return (x,)

    hooks = [m.register_forward_pre_hook(hook) for m in ref.modules() if isinstance(m, torch.nn.Linear)]
    try:
        for token in range(first, ref.config.vocab_size):
            closest.clear()
            with torch.no_grad():
                logits = ref(torch.tensor([ids + [token]])).logits[0, -1].numpy()
            assert closest, "no nn.Linear in the reference"
            if min(closest) >= margin:
                return token, logits
    finally:
        for h in hooks:
            h.remove()
    raise AssertionError(f"every decode token from {first} rounds an activation within {margin} steps of a boundary")


# test_gguf's decode step against rounded_decode, as a fraction of the largest logit: with the activations rounded
# alike, only float32 summation order differs (~1e-7 of it), so a wrong weight row or routing choice fails at once.
DECODE_BOUND = 1e-5


@pytest.mark.parametrize("arch,qtype", [("qwen2", "F32"), ("qwen3", "F32"), ("qwen3_moe", "F32"),
                                        ("mixtral", "F32"), ("qwen2", "Q8_0"), ("qwen3", "Q8_0"),
                                        ("qwen3_moe", "Q8_0"), ("mixtral", "Q8_0")])
def test_gguf(tmp_path, arch, qtype, seed):
    # llama.cpp renormalises the routing weights, and its llama architecture has no sliding window.
    extra = {"qwen3_moe": {"norm_topk_prob": True}, "mixtral": {"sliding_window": None}}.get(arch, {})
    ref = hf_model(arch, seed, **extra)
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, ref, arch, qtype)
    model, tok = load_llama(path, progress=False)
    assert tok is None
    cfg = model.config
    want_cfg = LlamaConfig.from_hf(ref.config.to_dict())
    for field in ("n_layers", "hidden", "ffn", "n_heads", "n_kv_heads", "head_dim", "rope_theta", "rms_eps",
                  "tie_word_embeddings", "attention_bias", "qk_norm",
                  "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"):
        assert getattr(cfg, field) == pytest.approx(getattr(want_cfg, field), rel=1e-6), field  # (float32 in GGUF)
    assert [cfg.is_moe(i) for i in range(cfg.n_layers)] == [want_cfg.is_moe(i) for i in range(cfg.n_layers)]
    if qtype == "F32":
        ids = ids_for(seed)
        want_logits, want_tokens = reference(ref, ids, 4)
        sess = Session(model, last_only=False)
        np.testing.assert_allclose(sess.step(ids), want_logits, atol=1e-4, rtol=1e-4, err_msg=f"seed {seed}")
        sess.reset()
        assert list(sess.generate(ids, 4)) == want_tokens
        return
    # Q8_0: the weights stay packed (experts too: each routed expert's rows are gathered before unpacking); the
    # reference runs the same values unpacked.
    sess = Session(model, last_only=False)
    stats = model.graph.stats()
    assert stats.get("QMatMulQ8_0", 0) > 0, stats
    if arch in MOE:
        g, k = model.graph, cfg.num_experts_per_tok
        dequants = [g.node(i) for i in g.nodes() if g.node(i).name.startswith("Dequant")]
        assert all(n.shape[0] not in (cfg.num_experts * 2 * cfg.moe_intermediate_size, cfg.num_experts * cfg.hidden)
                   for n in dequants), "a whole expert table was unpacked"
        # Per MoE layer, the gate/up rows and the down rows of the k experts of each token: Dequant(Gather(packed)).
        rows = {lm.Expr.var("s") * (k * 2 * cfg.moe_intermediate_size), lm.Expr.var("s") * (k * cfg.hidden)}
        routed = [n for n in dequants if n.shape[0] in rows and g.node(n.inputs[0].node).op == "Gather"]
        assert len(routed) == 2 * sum(cfg.is_moe(i) for i in range(cfg.n_layers)), [n.shape for n in dequants]
    deq = gguf_state_dict(str(path), cfg, progress=False, quantized=False)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in _hf_names(deq, ref).items()})
    ids = ids_for(seed)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    got = sess.step(ids)
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3, err_msg=f"seed {seed}")
    if arch in MOE:  # the dense form over the same packed experts
        dense, _ = load_llama(path, progress=False, moe_form="dense")
        np.testing.assert_allclose(Session(dense, last_only=False).step(ids), got, atol=1e-4, rtol=1e-4)
    # Decode rounds the activations of the Q8_0 products to int8 blocks; so does the reference (against a float one
    # the rounding moved the logits by percents, and flipped router choices near a tie).
    token, want_next = rounded_decode(ref, ids)
    err = np.abs(sess.step([token])[0] - want_next).max() / np.abs(want_next).max()
    assert err < DECODE_BOUND, f"decode logits (token {token}) differ by {err:.2e} of the largest, seed {seed}"


def _hf_names(luminal_sd: dict, ref) -> dict:
    """Luminal's row-stacked experts back to transformers 5's (E, rows, cols) parameters."""
    out = {}
    shapes = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    for k, v in luminal_sd.items():
        out[k] = v.reshape(shapes[k]) if k in shapes and v.ndim == 2 and len(shapes[k]) == 3 else v
    return out


def test_gguf_errors(tmp_path):
    path = tmp_path / "old.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_expert_count(8)
    w.add_expert_used_count(2)
    w.add_tensor("blk.0.ffn_gate.3.weight", np.zeros((32, 64), np.float32) + 1)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    cfg = LlamaConfig.from_gguf(str(path))
    with pytest.raises(GGUFError, match="experts stored one by one"):
        gguf_state_dict(str(path), cfg, progress=False)
    other = tmp_path / "gemma.gguf"
    w = gguf.GGUFWriter(str(other), "gemma")
    w.add_block_count(1); w.add_embedding_length(64); w.add_feed_forward_length(96); w.add_head_count(4)
    w.add_tensor("token_embd.weight", np.ones((8, 64), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(GGUFError, match="architecture 'gemma' is not supported"):
        load_llama(other, progress=False)
