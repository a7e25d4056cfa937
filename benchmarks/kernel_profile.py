"""Per-kernel GPU profile of one 8B (or 135m) prefill or decode step under Nsight Compute: each launch's duration,
DRAM and SM throughput (% of peak), registers, warps active, grid, DRAM bytes, instructions and tensor-pipe use,
labelled with the steps that launch it. Where `--profile` of llm_gpu.py says how long each kind of kernel takes,
this says whether a kernel is bound by memory, by instructions or by neither (latency).

    PYTHONPATH=python python3 benchmarks/kernel_profile.py [--mode prefill|decode] [--tokens 2048] [--layers 1]
        [--model 8b|8b-q8|135m] [--cache-dtype bfloat16] [--stalls] [--warm] [--sass KERNEL]

It starts `ncu --profile-from-start off --clock-control none` on itself (the child builds the shape with random
weights, warms up, and brackets one step with cudaProfilerStart/Stop), then prints a row per launch in order and
the sum of the durations. ncu replays each kernel for its counters: the durations are each kernel alone, without
the overlap of programmatic dependent launch. By default ncu flushes the caches before each kernel, so a small
kernel's parameter and input loads all miss; `--warm` keeps them, as a step's kernels find them. `--sass KERNEL`
(a name from the table, e.g. k64) samples that kernel's warps instead (ncu's full set, the shortest sampling
interval) and prints where they wait: the samples by stall reason, then the instructions with the most samples.
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


def parse_source(text: str) -> dict[str, list[dict]]:
    """ncu's `--page source --print-source sass --csv` -> per kernel, its instructions in order: the SASS text,
    its warp samples, how often it ran, and its samples by stall reason (the ones not issued left out); a kernel
    launched more than once, its launches' counts added."""
    kernels: dict[str, list[dict]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith('"Kernel Name"'):
            continue
        name = next(csv.reader([line]))[1]
        block = []
        for row in lines[i + 1:]:
            if row.startswith('"Kernel Name"'):
                break
            block.append(row)
        rows = list(csv.reader(block))
        head, out = rows[0], []
        num = lambda r, c: float(r[head.index(c)].replace(",", "") or 0) if c in head else 0.0
        reasons = [c for c in head if c.startswith("stall_") and not c.endswith("(Not Issued)")]
        for r in rows[1:]:
            if len(r) != len(head):
                continue
            out.append({"sass": r[head.index("Source")].strip(), "samples": num(r, "Warp Stall Sampling (All Samples)"),
                        "executed": num(r, "Instructions Executed"),
                        "stalls": {c[len("stall_"):]: num(r, c) for c in reasons if num(r, c)}})
        if name in kernels and len(kernels[name]) == len(out):
            for acc, i in zip(kernels[name], out):
                acc["samples"] += i["samples"]
                acc["executed"] += i["executed"]
                for k, v in i["stalls"].items():
                    acc["stalls"][k] = acc["stalls"].get(k, 0.0) + v
        else:
            kernels[name] = out
    return kernels


def sass_table(name: str, instrs: list[dict], top: int = 25) -> str:
    """Where a kernel's warps wait: its samples by stall reason, then the `top` instructions by samples (their
    index in the kernel, how often they ran, their stall reasons), in kernel order."""
    total = sum(i["samples"] for i in instrs)
    by: dict[str, float] = {}
    for i in instrs:
        for k, v in i["stalls"].items():
            by[k] = by.get(k, 0.0) + v
    lines = [f"{name}: {len(instrs)} instructions, {total:.0f} warp samples: " +
             ", ".join(f"{k} {100 * v / max(total, 1):.0f}%" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))]
    hot = sorted(sorted(range(len(instrs)), key=lambda j: -instrs[j]["samples"])[:top])
    for j in hot:
        i = instrs[j]
        if i["samples"]:
            why = ", ".join(f"{k} {v:.0f}" for k, v in sorted(i["stalls"].items(), key=lambda kv: -kv[1]))
            lines.append(f"{j:6d} {i['samples']:6.0f} {i['executed']:8.0f}  {i['sass'][:60]:60} {why}")
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
    p.add_argument("--warm", action="store_true", help="keep the caches between kernels (ncu --cache-control none)")
    p.add_argument("--sass", metavar="KERNEL", help="sample this kernel's warps and print where they wait, by "
                   "instruction")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.stalls:
        METRICS.update(STALLS)
    if a.child:
        return child(a)
    ncu = shutil.which("ncu")
    if not ncu:
        sys.exit("kernel_profile: ncu (Nsight Compute) not found on PATH")
    base = [ncu, "--profile-from-start", "off", "--clock-control", "none"]
    base += ["--cache-control", "none"] if a.warm else []
    kid = [sys.executable, __file__, "--child", "--mode", a.mode, "--tokens", str(a.tokens), "--layers", str(a.layers),
           "--model", a.model, "--cache-dtype", a.cache_dtype]

    def run(cmd):
        with tempfile.TemporaryFile("w+") as err:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=dict(os.environ))
            if r.returncode:
                err.seek(0)
                sys.exit(f"kernel_profile: ncu failed ({r.returncode}):\n{err.read()[-4000:]}")
        return r.stdout

    what = f"{a.model}, {a.layers} layer(s), one {a.mode} step of {a.tokens} tokens, {a.cache_dtype} cache"
    caches = "caches kept" if a.warm else "caches flushed"
    if a.sass:
        with tempfile.TemporaryDirectory() as d:
            rep = os.path.join(d, "k")
            run(base + ["--kernel-name", a.sass, "--set", "full", "--import-source", "no", "--warp-sampling-interval",
                        "0", "-o", rep] + kid)
            kernels = parse_source(run([ncu, "-i", rep + ".ncu-rep", "--page", "source", "--print-source", "sass",
                                        "--csv"]))
        if a.sass not in kernels:
            sys.exit(f"kernel_profile: ncu sampled no kernel {a.sass} (kernels: {sorted(kernels)})")
        print(f"{what} (ncu warp samples, {caches})")
        print(sass_table(a.sass, kernels[a.sass]))
        return
    rows = parse(run(base + ["--metrics", ",".join(METRICS), "--csv", "--page", "raw"] + kid))
    print(f"{what} (ncu, each kernel alone, {caches})")
    print(table(rows))


if __name__ == "__main__":
    main()
