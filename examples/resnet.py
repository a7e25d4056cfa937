"""ResNet-50 (torchvision's architecture and names) on luminal's CPU backend: random weights, one 224x224 image,
latency against torch eager (transformers' ResNetForImageClassification, the same architecture, on the same weights
and the same number of threads), and the largest difference between the two.

    python examples/resnet.py [--threads 2] [--runs 5] [--batch 1]
"""
import argparse
import re
import statistics
import time

import numpy as np

import luminal as lm
from luminal.nn.resnet import resnet50, resnet_state_dict_from_hf


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

    model = resnet50()
    gen = np.random.default_rng(0)
    weights = {}
    for k, shape in model.state_dict_shapes().items():
        if k.endswith("running_var"):
            w = gen.uniform(0.5, 1.5, shape)
        elif re.search(r"bn\d\.weight$|downsample\.1\.weight$", k):
            w = 1 + 0.1 * gen.standard_normal(shape)
        elif len(shape) > 1:  # conv filters and fc: unit gain, so activations keep their scale through 50 layers
            w = gen.standard_normal(shape) * np.sqrt(1 / np.prod(shape[1:]))
        else:
            w = 0.1 * gen.standard_normal(shape)
        weights[k] = w.astype(np.float32)
    model.load_state_dict(weights)
    image = gen.standard_normal((args.batch, 3, 224, 224)).astype(np.float32)

    t = time.perf_counter()
    logits = model(model.graph.tensor(image.shape, name="image").set(image)).output()
    model.graph.compile(lm.GenericCompiler(), lm.CPUCompiler(threads=args.threads))
    print(f"ResNet-50, batch {args.batch}: graph built and compiled in {time.perf_counter() - t:.2f} s")
    ms = median_ms(model.graph.execute, args.runs)
    print(f"luminal CPU ({args.threads} threads): {ms:.1f} ms per image batch; logits {logits.numpy().shape}, "
          f"top class {logits.numpy().argmax(-1).tolist()}")

    if args.no_torch:
        return
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    cfg = transformers.ResNetConfig(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3],
                                    layer_type="bottleneck", num_labels=1000)
    ref = transformers.ResNetForImageClassification(cfg).eval()
    names = resnet_state_dict_from_hf({k: k for k in ref.state_dict()})  # torchvision name -> transformers'
    ref.load_state_dict({names[k]: torch.from_numpy(v) for k, v in weights.items()}, strict=False)  # (batch counts)
    x = torch.from_numpy(image)
    with torch.inference_mode():
        ref_ms = median_ms(lambda: ref(x), args.runs)
        want = ref(x).logits.numpy()
    err = np.abs(logits.numpy() - want).max()
    print(f"torch eager ({args.threads} threads): {ref_ms:.1f} ms; luminal is {ref_ms / ms:.2f}x torch's speed; "
          f"max |difference| of the logits {err:.2e} (scale {np.abs(want).max():.2f})")


if __name__ == "__main__":
    main()
