"""A small random Qwen3-MoE (8 experts, 2 routed per token) generating a few tokens through the KV-cache session.

    python examples/qwen_moe.py [--dense] [--cuda]

The same config loads a real checkpoint's weights: `luminal.loaders.load_llama(dir_or_gguf)` reads config.json +
*.safetensors (experts stored one by one are stacked) or a GGUF file (qwen2 / qwen3 / qwen3moe / llama).
"""
import argparse

import numpy as np

import luminal as lm
from luminal.nn import Llama, LlamaConfig, Session

parser = argparse.ArgumentParser()
parser.add_argument("--dense", action="store_true", help="run every expert on every token, weighted (see SparseMoE)")
parser.add_argument("--cuda", action="store_true", help="compile for the GPU instead of the CPU")
args = parser.parse_args()

# A Hugging Face config.json, as a dict (transformers' Qwen3MoeConfig(...).to_dict() gives the same keys).
config = LlamaConfig.from_hf({
    "model_type": "qwen3_moe", "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "norm_topk_prob": True,
    "rope_theta": 1e6, "rms_norm_eps": 1e-6})
model = Llama(config, moe_form="dense" if args.dense else "routed")

# Random weights under the model's parameter names (norms near 1, matrices small), e.g. model.layers.0.mlp.gate.weight
# (the router, (8, 128)) and model.layers.0.mlp.experts.gate_up_proj (the experts' gate and up rows, (8 * 2 * 64, 128)).
rng = np.random.default_rng(0)
weights = {name: (1 + 0.1 * rng.standard_normal(t.shape) if name.endswith("norm.weight")
                  else 0.2 * rng.standard_normal(t.shape)).astype(np.float32) for name, t in model.named_parameters()}
model.load_state_dict(weights)

compilers = [lm.GenericCompiler(), lm.CudaCompiler("float32") if args.cuda else lm.CPUCompiler()]
session = Session(model, compilers)
prompt = [1, 17, 42, 99, 3]
tokens = list(session.generate(prompt, max_new_tokens=12))
stats = session.stats
print(f"{config.num_experts} experts, {config.num_experts_per_tok} per token ({model.model.layers[0].mlp.form} form)")
print("prompt:   ", prompt)
print("generated:", tokens)
per_token = stats["decode_s"] / max(stats["decode_tokens"], 1)
print(f"prefill {stats['prefill_s'] * 1e3:.1f} ms, decode {per_token * 1e3:.2f} ms/token")
