"""Whisper-tiny on luminal's CPU backend: random weights, a random 30 s log-mel input, greedy decoding from the
decoder start token through one compiled decoder graph with a KV cache. Prints the tokens and the time per step,
against torch eager (transformers' model on the same weights, its own KV cache, the same number of threads).

    python examples/whisper.py [--threads 2] [--steps 16]
"""
import argparse
import time

import numpy as np

import luminal as lm
from luminal.nn.whisper import WhisperConfig, WhisperForConditionalGeneration, WhisperSession


def random_weights(model, gen) -> dict:
    """Seeded weights of a plausible scale: unit-gain projections, norms near 1, small biases, token embeddings
    small next to the positions (else, tied to the output, they make greedy decoding repeat its last token)."""
    out = {}
    for k, shape in model.state_dict_shapes().items():
        if k.endswith("bias"):
            w = 0.05 * gen.standard_normal(shape)
        elif "norm" in k:
            w = 1 + 0.1 * gen.standard_normal(shape)
        elif "embed_tokens" in k:
            w = 0.1 * gen.standard_normal(shape)
        elif "embed_positions" in k:
            w = gen.standard_normal(shape)
        else:
            w = gen.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
        out[k] = w.astype(np.float32)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16, help="tokens to decode")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch comparison")
    args = ap.parse_args()

    config = WhisperConfig()  # whisper-tiny: d_model 384, 4 + 4 layers, 6 heads, 80 mels, vocab 51865
    config.eos_token_id = None  # random weights: decode all the steps asked for
    gen = np.random.default_rng(0)
    model = WhisperForConditionalGeneration(config)
    weights = random_weights(model, gen)
    model.load_state_dict(weights)
    mel = gen.standard_normal((1, config.num_mel_bins, config.n_frames)).astype(np.float32)

    t = time.perf_counter()
    sess = WhisperSession(model, [lm.GenericCompiler(), lm.CPUCompiler(threads=args.threads)])
    print(f"whisper-tiny: encoder and decoder-step graphs built and compiled in {time.perf_counter() - t:.2f} s")
    sess.generate(mel, 2)  # warm-up: the first run of each graph sets up its executor
    tokens = sess.generate(mel, args.steps)[0]
    st = sess.stats
    step_ms = 1e3 * st["decode_s"] / max(st["decode_steps"], 1)
    print(f"tokens: {tokens.tolist()}")
    print(f"luminal CPU ({args.threads} threads): encoder {1e3 * st['encode_s']:.1f} ms, first step "
          f"{1e3 * st['first_step_s']:.1f} ms, then {step_ms:.2f} ms per token")

    if args.no_torch:
        return
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    hc = transformers.WhisperConfig(**{k: v for k, v in config.__dict__.items()}, bos_token_id=50257)
    ref = transformers.WhisperForConditionalGeneration(hc).eval()
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=False)  # proj_out: tied
    with torch.inference_mode():
        for attempt in range(2):  # the first is a warm-up
            t0 = time.perf_counter()
            enc = ref.model.encoder(torch.from_numpy(mel)).last_hidden_state
            t1 = time.perf_counter()
            cache = transformers.EncoderDecoderCache(transformers.DynamicCache(), transformers.DynamicCache())
            ids, out, steps = torch.tensor([[config.decoder_start_token_id]]), [], []
            for _ in range(args.steps):
                t = time.perf_counter()
                h = ref.model.decoder(input_ids=ids, encoder_hidden_states=enc, cache=cache,
                                      use_cache=True).last_hidden_state
                ids = ref.proj_out(h[:, -1]).argmax(-1, keepdim=True)
                steps.append(time.perf_counter() - t)
                out.append(int(ids))
    ref_ms = 1e3 * sum(steps[1:]) / max(len(steps) - 1, 1)
    print(f"torch eager ({args.threads} threads): encoder {1e3 * (t1 - t0):.1f} ms, first step "
          f"{1e3 * steps[0]:.1f} ms, then {ref_ms:.2f} ms per token; same tokens: {out == tokens.tolist()}")


if __name__ == "__main__":
    main()
