"""Registers, spills and shared memory of every CUDA kernel luminal prints for a Llama-family model, read off ptxas
(`nvcc -cubin -Xptxas -v`) on a machine without a GPU: what a kernel change did to occupancy and local memory
before any device time is spent. The model is built with one layer (every layer prints the same kernels) and
generated with `CudaCompiler(device=None)`; nvcc comes from PATH or CUDA_HOME.

    python benchmarks/kernel_resources.py [--model 8b|135m] [--q8] [--dtype bfloat16] [--cache-dtype bfloat16]
        [--arch 90] [--grep flash] [--save k.cu]

--q8: the projections and the output head Q8_0 (graph inputs of GGUF blocks, dequantised, as a GGUF file or
llm_gpu.py's 8b-q8 row gives them), so that the Q8_0 decode kernels are the ones printed.

Prints a row per kernel (the steps that launch it, registers, spill stores and loads, stack frame, static shared
memory), most registers first; kernels that spill are marked.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import luminal as lm
from luminal.compiler import GenericCompiler
from luminal.nn import Llama, LlamaConfig, Session

SHAPES = {  # (as benchmarks/llm_gpu.py, one layer)
    "8b": LlamaConfig(vocab_size=128256, hidden=4096, ffn=14336, n_layers=1, n_heads=32, n_kv_heads=8, head_dim=128,
                      rope_theta=500000.0, rms_eps=1e-5),
    "135m": LlamaConfig(vocab_size=49152, hidden=576, ffn=1536, n_layers=1, n_heads=9, n_kv_heads=3, head_dim=64,
                        rope_theta=100000.0, rms_eps=1e-5, tie_word_embeddings=True),
}


def parse_ptxas(log: str) -> dict[str, dict[str, int]]:
    """ptxas -v's report: kernel name -> registers, spill_stores, spill_loads, stack, smem (bytes; 0 where absent)."""
    out: dict[str, dict[str, int]] = {}
    name = None
    for line in log.splitlines():
        m = re.search(r"(?:Compiling entry function|Function properties for) '?([A-Za-z_]\w*)'?", line)
        if m:
            name = m[1]
            out.setdefault(name, {"registers": 0, "spill_stores": 0, "spill_loads": 0, "stack": 0, "smem": 0})
            continue
        if name is None:
            continue
        r = out[name]
        if m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            r["stack"], r["spill_stores"], r["spill_loads"] = map(int, m.groups())
        if m := re.search(r"Used (\d+) registers", line):
            r["registers"] = int(m[1])
        if m := re.search(r"(\d+) bytes smem", line):
            r["smem"] = int(m[1])
    return out


def nvcc() -> str:
    for c in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if c and os.path.exists(c):
            return c
    raise SystemExit("kernel_resources: nvcc not found (PATH, CUDA_HOME): ptxas's report needs the CUDA toolkit")


def generate(model: str, dtype: str, cache: str, q8: bool = False):
    """The CUDA module of `model`'s one-layer step graph (prompt and decode share it: symbolic lengths) and
    kernel name -> the steps that launch it."""
    m = Llama(SHAPES[model])
    for name, w in list(m.named_parameters()) if q8 else []:
        if len(w.shape) == 2 and name != "model.embed_tokens.weight":
            rows, k = w.shape
            t = m.graph.tensor((rows, k // 32 * 34), lm.uint8, name=name)
            owner, attr = m._owner(name)
            setattr(owner, attr, m.graph._wrap(m.graph._g.dequant("Q8_0", t._edge(), [rows, k])))
    comp = lm.CudaCompiler(dtype, device=None)
    Session(m, [GenericCompiler(), comp], cache_dtype=cache)
    ops = comp.schedule.kernel_ops(m.graph._g)
    ops.pop("", None)  # (the cuBLASLt variant: no kernel of ours)
    return comp.schedule.source, ops


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="8b", choices=sorted(SHAPES))
    p.add_argument("--q8", action="store_true", help="Q8_0 projections and output head")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--cache-dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for the H100")
    p.add_argument("--grep", default="", help="only kernels whose steps' labels contain this")
    p.add_argument("--save", default="", help="also write the module's CUDA C here")
    a = p.parse_args()
    source, ops = generate(a.model, a.dtype, a.cache_dtype, a.q8)
    if a.save:
        Path(a.save).write_text(source)
    with tempfile.TemporaryDirectory() as d:
        cu = Path(d) / "module.cu"
        cu.write_text(source)
        r = subprocess.run([nvcc(), "-cubin", "-std=c++17", f"-arch=sm_{a.arch}", "-Xptxas", "-v", "-o",
                            str(Path(d) / "module.cubin"), str(cu)], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"kernel_resources: nvcc failed:\n{r.stderr[-4000:]}")
    res = parse_ptxas(r.stderr)
    rows = [(k, ops.get(k, "(a combine or prep kernel)"), v) for k, v in res.items() if a.grep in ops.get(k, "")]
    rows.sort(key=lambda x: -x[2]["registers"])
    print(f"{a.model}{' Q8_0' if a.q8 else ''}, compute {a.dtype}, {a.cache_dtype} cache, sm_{a.arch}: {len(rows)} kernels")
    print(f"{'kernel':>8} {'regs':>5} {'spill st':>9} {'spill ld':>9} {'stack':>6} {'smem':>6}  steps")
    for k, what, v in rows:
        mark = "  SPILLS" if v["spill_stores"] or v["spill_loads"] else ""
        print(f"{k:>8} {v['registers']:5d} {v['spill_stores']:9d} {v['spill_loads']:9d} {v['stack']:6d} "
              f"{v['smem']:6d}  {what}{mark}")


if __name__ == "__main__":
    main()
