"""ViT-B/16 on luminal's CPU backend: random weights, one 224x224 image, latency against torch eager (transformers'
ViTModel on the same weights and the same number of threads), and the largest difference between the two.

    python examples/vit.py [--threads 2] [--runs 5] [--batch 1]
"""
import argparse
import statistics
import time

import numpy as np

import luminal as lm
from luminal.nn.vit import ViTConfig, ViTModel


def median_ms(fn, runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--no-torch", action="store_true", help="skip the torch comparison")
    args = ap.parse_args()

    config = ViTConfig()  # ViT-B/16: 12 layers, hidden 768, 12 heads, 224x224, patches of 16
    gen = np.random.default_rng(0)
    model = ViTModel(config)
    weights = {k: (0.02 * gen.standard_normal(s)).astype(np.float32) for k, s in model.state_dict_shapes().items()}
    for k in weights:
        if "layernorm" in k and k.endswith("weight"):
            weights[k] += 1
    model.load_state_dict(weights)
    image = gen.standard_normal((args.batch, 3, config.image_size, config.image_size)).astype(np.float32)

    t = time.perf_counter()
    hidden, pooled = model(model.graph.tensor(image.shape, name="pixel_values").set(image))
    hidden, pooled = hidden.output(), pooled.output()
    model.graph.compile(lm.GenericCompiler(), lm.CPUCompiler(threads=args.threads))
    print(f"ViT-B/16, batch {args.batch}: graph built and compiled in {time.perf_counter() - t:.2f} s")
    ms = median_ms(model.graph.execute, args.runs)
    print(f"luminal CPU ({args.threads} threads): {ms:.1f} ms per image batch; last_hidden_state "
          f"{hidden.numpy().shape}, pooler_output {pooled.numpy().shape}")

    if args.no_torch:
        return
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    names = {k: v for k, v in config.__dict__.items()}
    ref = transformers.ViTModel(transformers.ViTConfig(**names)).eval()
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    x = torch.from_numpy(image)
    with torch.inference_mode():
        ref_ms = median_ms(lambda: ref(x), args.runs)
        want = ref(x)
    err = np.abs(hidden.numpy() - want.last_hidden_state.numpy()).max()
    print(f"torch eager ({args.threads} threads): {ref_ms:.1f} ms; luminal is {ref_ms / ms:.2f}x torch's speed; "
          f"max |difference| of last_hidden_state {err:.2e}")


if __name__ == "__main__":
    main()
