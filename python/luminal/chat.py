"""Chat with a Llama-family model: `python -m luminal.chat "Explain how photosynthesis works."`.

Loads the bundled SmolLM2-135M-Instruct by default (fetched on first use), or any GGUF file or safetensors
directory given with --model; streams the reply; prints prefill and decode tokens/s at the end.
"""
from __future__ import annotations

import argparse
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt", nargs="?", help="one message to answer (omit for an interactive chat)")
    ap.add_argument("--model", help="a .gguf file or a directory with config.json, *.safetensors, tokenizer.json")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--system", help="system prompt (default: the model's own template default)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--threads", type=int, default=0, help="CPU worker threads (0 = one per core)")
    args = ap.parse_args(argv)

    import luminal as lm
    from luminal.loaders import load_llama
    from luminal.nn import Session

    compilers = None  # Session's default: GenericCompiler + CPUCompiler
    if args.device == "cuda":
        ok, why = lm.cuda_available()
        if not ok:
            sys.exit(f"--device cuda: no usable GPU ({why.splitlines()[0]})")
        # Float weights are kept in bfloat16 on the GPU; GGUF block-quantised ones stay packed.
        compilers = [lm.GenericCompiler(), lm.CudaCompiler("bfloat16")]
    if args.threads:
        lm._core.set_num_threads(args.threads)
    path = args.model
    if path is None:
        from luminal.hub import bundled_model_path

        path = bundled_model_path()
    t0 = time.perf_counter()
    model, tok = load_llama(path)
    if tok is None:
        sys.exit(f"{path}: no tokenizer found (a safetensors directory needs tokenizer.json)")
    session = Session(model, compilers)
    print(f"[loaded {path} and compiled in {time.perf_counter() - t0:.1f}s]", file=sys.stderr)

    messages = [{"role": "system", "content": args.system}] if args.system else []
    prompts = [args.prompt] if args.prompt else None
    while True:
        if prompts is not None:
            if not prompts:
                break
            user = prompts.pop()
        else:
            try:
                user = input("> ")
            except EOFError:
                break
        messages.append({"role": "user", "content": user})
        ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))
        session.reset()  # the whole conversation is re-fed: simple, and the prompt is prefilled in one step
        stream, reply = tok.stream_decoder(skip_special_tokens=True), []
        stops = {i for i in (tok.eos_token_id,) if i is not None}
        for t in session.generate(ids, args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed,
                                  stop_ids=stops):
            reply.append(t)
            print(stream.push(t), end="", flush=True)
        print(stream.flush())
        messages.append({"role": "assistant", "content": tok.decode(reply, skip_special_tokens=True)})
        s = session.stats
        print(f"[prefill {s['prefill_tokens']} tokens at {s['prefill_tokens'] / max(s['prefill_s'], 1e-9):.1f} tok/s, "
              f"decode {s['decode_tokens']} tokens at {s['decode_tokens'] / max(s['decode_s'], 1e-9):.1f} tok/s]",
              file=sys.stderr)


if __name__ == "__main__":
    main()
