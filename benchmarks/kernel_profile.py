"""Per-kernel GPU profile of one 8B (or 135m) prefill or decode step under Nsight Compute: each launch's duration,
DRAM and SM throughput (% of peak), registers, warps active, grid, DRAM bytes, instructions and tensor-pipe use,
labelled with the steps that launch it. Where `--profile` of llm_gpu.py says how long each kind of kernel takes,
this says whether a kernel is bound by memory, by instructions or by neither (latency).

    PYTHONPATH=python python3 benchmarks/kernel_profile.py [--mode prefill|decode] [--tokens 2048] [--layers 1]
        [--model 8b|8b-q8|135m] [--cache-dtype bfloat16] [--stalls]

It starts `ncu --profile-from-start off --clock-control none` on itself (the child builds the shape with random
weights, warms up, and brackets one step with cudaProfilerStart/Stop), then prints a row per launch in order and
the sum of the durations. ncu replays each kernel for its counters: the durations are each kernel alone, without
the overlap of programmatic dependent launch.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

METRICS = {  # ncu metric -> column
    "gpu__time_duration.sum": "us",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm%",
    "launch__registers_per_thread": "regs",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "warps%",
    "launch__grid_size": "grid",
    "dram__bytes.sum": "MB",
    "smsp__inst_executed.sum": "Minstr",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor%",
}
STALLS = {  # --stalls: where a latency-bound kernel's warps wait (% of their active cycles)
    "smsp__warp_issue_stalled_no_instruction_per_warp_active.pct": "noinst%",
    "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct": "memory%",
    "smsp__warp_issue_stalled_barrier_per_warp_active.pct": "barrier%",
    "smsp__warp_issue_stalled_membar_per_warp_active.pct": "membar%",
}
LABEL = "KERNEL "  # the child's lines naming a kernel's steps


def parse(text: str) -> list[dict]:
    """ncu's `--csv --page raw` output mixed with the child's `KERNEL name label` lines -> a row per launch: name,
    label, and the METRICS columns as floats (durations in us, bytes in MB, instructions in millions)."""
    labels = {}
    for line in text.splitlines():
        if line.startswith(LABEL):
            _, name, *rest = line.split()
            labels[name] = " ".join(rest)
    rows = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    if len(rows) < 2:
        return []
    head, units, out = rows[0], rows[1], []
    for r in rows[2:]:
        rec = {"name": r[head.index("Kernel Name")]}
        rec["label"] = labels.get(rec["name"], "(cuBLASLt, or a copy or combine kernel)")
        for metric, col in METRICS.items():
            if metric not in head:
                continue
            i = head.index(metric)
            v = float(r[i].replace(",", "")) if r[i] not in ("", "n/a") else float("nan")
            unit = units[i]
            if col == "us":
                # (ncu names the unit "nsecond" or "ns", by version)
                v *= {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}[unit]
            elif col == "MB":
                v *= {"byte": 1e-6, "B": 1e-6, "Kbyte": 1e-3, "KB": 1e-3, "Mbyte": 1.0, "MB": 1.0, "Gbyte": 1e3,
                      "GB": 1e3}[unit]
            elif col == "Minstr":
                v *= 1e-6
            rec[col] = v
        out.append(rec)
    return out


def table(rows: list[dict]) -> str:
    cols = list(METRICS.values())
    lines = [f"{'kernel':>14} {'steps':38}" + "".join(f"{c:>9}" for c in cols)]
    for r in rows:
        lines.append(f"{r['name'][:14]:>14} {r['label'][:38]:38}" +
                     "".join(f"{r.get(c, float('nan')):9.1f}" for c in cols))
    lines.append(f"{len(rows)} launches, {sum(r.get('us', 0.0) for r in rows):.1f} us in all")
    return "\n".join(lines)


def child(a):
    """One step of the shape under the profiler's start/stop, after warm-up runs (plans, tuning, graphs)."""
    import numpy as np
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import llm_gpu as B

    c = replace(B.SHAPES[B.Q8_MODELS.get(a.model, a.model)], n_layers=a.layers)
    hf = B.hf_model(c, 0)
    if a.model in B.Q8_MODELS:
        s, _, raws = B.q8_session(c, hf, a.tokens + 64, a.cache_dtype)
    else:
        s, _ = B.luminal_session(c, hf, "bfloat16", a.tokens + 64, cache=a.cache_dtype)
    for name, label in s.graph._runtime.schedule.kernel_ops(s.graph._g).items():
        if name:
            print(LABEL + name, label, flush=True)
    prompt = np.random.default_rng(0).integers(0, c.vocab_size, a.tokens).tolist()
    if a.mode == "prefill":
        for _ in range(3):
            s.reset()
            s.step(prompt)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        s.reset()
        s.step(prompt)
    else:
        s.reset()
        tok = s.next_token(prompt)
        for _ in range(5):
            tok = s.next_token([tok])
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        s.next_token([tok])
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", default="prefill", choices=["prefill", "decode"])
    p.add_argument("--tokens", type=int, default=2048, help="prompt length (decode: the cache length before the step)")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--model", default="8b", choices=["8b", "8b-q8", "135m"])
    p.add_argument("--cache-dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--stalls", action="store_true", help="add columns of stall reasons (no instruction, memory, "
                   "barrier, memory barrier)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.stalls:
        METRICS.update(STALLS)
    if a.child:
        return child(a)
    ncu = shutil.which("ncu")
    if not ncu:
        sys.exit("kernel_profile: ncu (Nsight Compute) not found on PATH")
    cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--metrics", ",".join(METRICS), "--csv",
           "--page", "raw", sys.executable, __file__, "--child", "--mode", a.mode, "--tokens", str(a.tokens),
           "--layers", str(a.layers), "--model", a.model, "--cache-dtype", a.cache_dtype]
    with tempfile.TemporaryFile("w+") as err:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=dict(os.environ))
        if r.returncode:
            err.seek(0)
            sys.exit(f"kernel_profile: ncu failed ({r.returncode}):\n{err.read()[-4000:]}")
    rows = parse(r.stdout)
    print(f"{a.model}, {a.layers} layer(s), one {a.mode} step of {a.tokens} tokens, {a.cache_dtype} cache (ncu, each "
          f"kernel alone)")
    print(table(rows))


if __name__ == "__main__":
    main()
