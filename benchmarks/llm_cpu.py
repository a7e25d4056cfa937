"""CPU LLM benchmark: luminal vs Hugging Face transformers (float32) vs llama.cpp on SmolLM2-135M-Instruct (Q4_1).

All engines run the bundled GGUF (`luminal.hub.bundled_model_path()`), the same 35-token chat prompt
("Explain how photosynthesis works.") and greedy decoding of exactly --new-tokens tokens (no early stop), with the
same thread count. Runs alternate between the engines (luminal, hf, llama.cpp, luminal, hf, ...) so that machine
noise hits all of them alike; the table shows medians and the luminal/peer ratios from this one run.

A second row measures decode at a long context (--long-context, default 4096 tokens; 0 skips it): a chat prompt
padded to that many tokens is prefilled once per engine (that prefill is timed once), then each timed run decodes
--long-new-tokens tokens after it, the cache rolled back to the prompt between runs. Each decode rate comes with
its memory traffic per token (the weights plus the KV cache rows read, at the engine's cache dtype) over the time
per token, beside the machine's copy bandwidth (a numpy copy of a 256 MB array, split over the threads). The ISA
path each engine takes is printed (luminal's `_core.cpu_isa()`, llama.cpp's system info).

  * luminal runs in a subprocess of its own (llm_cpu_worker.py, small, so that compiling the harness's own code is
    not counted either; prompts in steps of at most 512 tokens, as llama.cpp's n_batch), so its resident memory is
    its own: the peak
    RSS during prefill + decode is read from VmHWM (reset through /proc/self/clear_refs before each run).
  * hf: `LlamaForCausalLM` float32 built from the same GGUF (weights dequantised by `gguf_state_dict`), prefill = one
    forward over the prompt, decode = an eager loop of single-token forwards with a DynamicCache.
  * llama.cpp (llama-cpp-python), when importable, with flash attention on and off, its context (n_ctx) sized for
    the longest prompt plus every new token (so --new-tokens 1024 works). Not installed? Then
        CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36     (builds from source, ~9 min on 2 cores)
  * unless --skip-matmul: GFLOP/s of a float32 1024x1024 @ 1024x1024 matmul in luminal, numpy and torch.

    PYTHONPATH=python python benchmarks/llm_cpu.py --threads 2 --runs 3
    PYTHONPATH=python LUMINAL_PROFILE=1 python benchmarks/llm_cpu.py --runs 1 --skip-hf   # per-op time (stderr)

The benchmark installs nothing.
"""
from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
    p.add_argument("--new-tokens", type=int, default=128, help="greedy tokens to generate (default 128)")
    p.add_argument("--long-context", type=int, default=4096,
                   help="tokens of the long-context row's prompt (default 4096; 0: no long-context row)")
    p.add_argument("--long-new-tokens", type=int, default=64,
                   help="greedy tokens decoded after the long prompt (default 64)")
    p.add_argument("--runs", type=int, default=3, help="timed runs per engine, alternating (default 3)")
    p.add_argument("--warmup-tokens", type=int, default=8,
                   help="one untimed warm-up run per engine with this many new tokens first (0: none; default 8)")
    p.add_argument("--skip-matmul", action="store_true", help="skip the 1024^3 matmul comparison")
    p.add_argument("--skip-hf", action="store_true", help="skip Hugging Face transformers")
    p.add_argument("--skip-llamacpp", action="store_true", help="skip llama.cpp even when importable")
    p.add_argument("--prompt", default="Explain how photosynthesis works.", help="the user message")
    return p.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:
    # BLAS pools read these when numpy / torch are first imported, so set them before any import of those.
    for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_v] = str(ARGS.threads)

import json  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import platform  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402

import numpy as np  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    import luminal as lm  # noqa: E402
except ImportError:  # run from a checkout without PYTHONPATH=python
    sys.path.insert(0, os.path.join(REPO, "python"))
    import luminal as lm  # noqa: E402

MB = 1e6
LLAMACPP_INSTALL = 'CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36  (builds from source, ~9 min on 2 cores)'


class LuminalEngine:
    name = "luminal"

    def __init__(self, threads):
        worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llm_cpu_worker.py")
        self.proc = subprocess.Popen([sys.executable, worker, str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
        self.info = self._read()
        if not self.info.get("ok"):
            raise RuntimeError("luminal worker failed to start:\n" + self.info.get("error", "?"))
        self.peaks = []

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            return {"ok": False, "error": f"luminal worker exited (status {rc}); see its stderr above"}
        return json.loads(line)

    def _ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        r = self._read()
        if not r.get("ok"):
            raise RuntimeError(r.get("error", "?"))
        return r

    def run(self, ids, new_tokens, resume=False):
        r = self._ask(cmd="run", ids=[int(i) for i in ids], new_tokens=new_tokens, resume=resume)
        s = r["stats"]
        self.peaks.append(dict(r, prompt_tokens=len(ids)))
        return {"tokens": r["tokens"], "prefill_tokens": s["prefill_tokens"], "prefill_s": s["prefill_s"],
                "decode_tokens": s["decode_tokens"], "decode_s": s["decode_s"]}

    def close(self):
        try:
            self._ask(cmd="quit")
        except Exception:
            pass
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()


# ---- Hugging Face transformers, float32 -------------------------------------------------------------------------------
class HFEngine:
    name = "hf float32"

    def __init__(self, gguf, cfg, threads):
        import torch
        import transformers
        from luminal.nn import gguf_state_dict

        torch.set_num_threads(threads)
        self.torch = torch
        t0 = time.perf_counter()
        hc = transformers.LlamaConfig(
            hidden_size=cfg.hidden, intermediate_size=cfg.ffn, num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
            rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_eps, vocab_size=cfg.vocab_size, tie_word_embeddings=True,
            max_position_embeddings=8192)
        rp = getattr(hc, "rope_parameters", None)  # transformers 5 keeps rope_theta in rope_parameters
        if isinstance(rp, dict) and rp.get("rope_theta") != cfg.rope_theta:
            rp["rope_theta"] = cfg.rope_theta
        sd = {k: torch.from_numpy(v) for k, v in gguf_state_dict(gguf, cfg, progress=False, quantized=False).items()}
        model = transformers.LlamaForCausalLM(hc).float().eval()
        missing, unexpected = model.load_state_dict(sd, strict=False)
        model.tie_weights()
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise RuntimeError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
        if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            model.lm_head.weight = model.model.embed_tokens.weight
        self.model = model
        self.load_s = time.perf_counter() - t0
        self.attn = getattr(model.config, "_attn_implementation", "?")
        self.prefilled = None
        self.weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied: counted once
        self.keep = {"logits_to_keep": 1}
        with torch.inference_mode():  # is logits_to_keep known? (luminal computes the last row's logits only too)
            try:
                model(input_ids=torch.tensor([[1, 2]]), **self.keep)
            except TypeError:
                self.keep = {}

    def _cache(self):
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)
        except TypeError:
            return DynamicCache()

    def run(self, ids, new_tokens, resume=False):
        torch = self.torch
        with torch.inference_mode():
            if resume:  # decode again after the prompt the last run prefilled
                if self.prefilled is None or self.prefilled[0] != list(ids):
                    raise ValueError("resume: the last run prefilled another prompt")
                _, cache, logits = self.prefilled
                extra = cache.get_seq_length() - len(ids)
                if extra > 0:
                    cache.crop(-extra)  # a negative count drops that many positions (transformers 4 and 5)
                prefill_s = 0.0
            else:
                cache = self._cache()
                x = torch.tensor([list(ids)], dtype=torch.long)
                t0 = time.perf_counter()
                out = self.model(input_ids=x, past_key_values=cache, use_cache=True, **self.keep)
                logits = out.logits[0, -1]
                prefill_s = time.perf_counter() - t0
                cache = out.past_key_values
                self.prefilled = (list(ids), cache, logits)
            toks, decode_s = [], 0.0
            for _ in range(new_tokens):
                tok = int(torch.argmax(logits))
                toks.append(tok)
                t = time.perf_counter()
                out = self.model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True, **self.keep)
                logits = out.logits[0, -1]
                decode_s += time.perf_counter() - t
                cache = out.past_key_values
        return {"tokens": toks, "prefill_tokens": 0 if resume else len(ids), "prefill_s": prefill_s,
                "decode_tokens": new_tokens, "decode_s": decode_s}

    def close(self):
        self.prefilled = None


# ---- llama.cpp (llama-cpp-python) -------------------------------------------------------------------------------------
class LlamaCppEngine:
    def __init__(self, path, threads, flash_attn: bool, n_ctx: int):
        import llama_cpp

        self.lc = llama_cpp
        self.name = f"llama.cpp FA {'on' if flash_attn else 'off'}"
        t0 = time.perf_counter()
        # n_ctx: room for the longest prompt plus every new token (past it llama_decode fails with status 1).
        kw = dict(model_path=str(path), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, verbose=False,
                  flash_attn=flash_attn)
        try:
            self.llm = llama_cpp.Llama(**kw)
        except TypeError:  # an older binding without one of these keywords
            if flash_attn:
                raise
            kw.pop("flash_attn")
            self.llm = llama_cpp.Llama(**kw)
        self.load_s = time.perf_counter() - t0
        self.n_vocab = int(self.llm.n_vocab())
        self.prefilled = None

    def _last_logits(self) -> np.ndarray:
        """Logits of the last evaluated token. Recent bindings no longer copy them into `scores` unless
        logits_all=True, so read them from the context; older ones only have `scores` / `eval_logits`."""
        llm, lc = self.llm, self.lc
        errors = []
        for get in (lambda: lc.llama_get_logits_ith(llm.ctx, -1), lambda: llm._ctx.get_logits_ith(-1)):
            try:
                ptr = get()
                if ptr:
                    return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
        try:
            return np.asarray(llm.scores[llm.n_tokens - 1], np.float32).copy()
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
        try:
            return np.asarray(llm.eval_logits[-1], np.float32)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
        raise RuntimeError("cannot read llama.cpp logits: " + "; ".join(errors))

    def run(self, ids, new_tokens, resume=False):
        llm = self.llm
        ids = [int(i) for i in ids]
        if resume:  # decode again after the prompt the last run prefilled
            if self.prefilled is None or self.prefilled[0] != ids:
                raise ValueError("resume: the last run prefilled another prompt")
            llm.n_tokens = len(ids)  # the next eval drops the KV cache beyond it
            logits, prefill_s = self.prefilled[1], 0.0
        else:
            llm.reset()  # n_tokens = 0; the next eval drops the KV cache beyond it
            t0 = time.perf_counter()
            llm.eval(ids)
            logits = self._last_logits()
            prefill_s = time.perf_counter() - t0
            self.prefilled = (ids, logits)
        toks, decode_s = [], 0.0
        for _ in range(new_tokens):
            tok = int(np.argmax(logits))
            toks.append(tok)
            t = time.perf_counter()
            llm.eval([tok])
            logits = self._last_logits()
            decode_s += time.perf_counter() - t
        return {"tokens": toks, "prefill_tokens": 0 if resume else len(ids), "prefill_s": prefill_s,
                "decode_tokens": new_tokens, "decode_s": decode_s}

    def close(self):
        try:
            self.llm.close()
        except Exception:  # noqa: BLE001
            pass


# ---- matmul -----------------------------------------------------------------------------------------------------------
def bench(fn, reps=5):
    fn(), fn()  # warm-up: two, so that the allocator has settled (a result's memory is handed back a run later)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def matmul_bench(threads, n=1024):
    rng = np.random.default_rng(0)
    A = rng.standard_normal((n, n), dtype=np.float32)
    B = rng.standard_normal((n, n), dtype=np.float32)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    flops = 2.0 * n ** 3
    rows = []

    def row(name, fn, result):
        try:
            time.sleep(0.5)  # BLAS threads busy-wait a while after their last call: let them go idle first
            s = bench(fn)
            err = float(np.max(np.abs(result() - ref)) / np.max(np.abs(ref)))
            rows.append((name, flops / s / 1e9, s * 1e3, err, ""))
        except Exception as e:  # noqa: BLE001
            rows.append((name, None, None, None, f"failed: {e!r}"))

    lm._core.set_num_threads(threads)
    graphs = []
    for bt in (False, True):
        # bt: an extra, informative row with b stored transposed (n, k) so the contraction runs along its rows.
        cx = lm.Graph()
        a = cx.tensor((n, n), name="a")
        b = cx.tensor((n, n), name="b")
        c = (a @ (b.transpose(0, 1) if bt else b)).output()
        cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
        a.set(A)
        b.set(np.ascontiguousarray(B.T) if bt else B)
        row("luminal, b given as b.T (n,k)" if bt else "luminal", cx.execute, c.numpy)
        graphs.append(cx)

    out = {}

    def np_mm():
        out["np"] = A @ B

    row("numpy", np_mm, lambda: out["np"])
    try:
        import torch

        torch.set_num_threads(threads)
        ta, tb = torch.from_numpy(A), torch.from_numpy(B)

        def t_mm():
            out["t"] = torch.mm(ta, tb)

        row("torch", t_mm, lambda: out["t"].numpy())
    except ImportError:
        rows.append(("torch", None, None, None, "not installed"))
    return rows, [g.stats() for g in graphs]


# ---- reporting --------------------------------------------------------------------------------------------------------
def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            txt = f.read()
        model = re.search(r"^model name\s*:\s*(.*)$", txt, re.M)
        flags = re.search(r"^flags\s*:\s*(.*)$", txt, re.M)
        fl = set(flags.group(1).split()) if flags else set()
        simd = [x for x in ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile") if x in fl]
        return (model.group(1).strip() if model else platform.processor() or "?"), simd
    except OSError:
        return platform.processor() or "?", []


def versions():
    v = {"python": platform.python_version(), "numpy": np.__version__, "luminal": getattr(lm, "__version__", "?")}
    try:
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]
        v["numpy BLAS"] = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # noqa: BLE001
        pass
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if rev:
            v["luminal"] += f" (git {rev}{', modified tree' if dirty else ''})"
    except Exception:  # noqa: BLE001
        pass
    for mod in ("torch", "transformers", "llama_cpp"):
        try:
            v[mod] = __import__(mod).__version__
        except ImportError:
            v[mod] = "not installed"
        except Exception as e:  # noqa: BLE001
            v[mod] = f"import failed: {e!r}"
    return v


def fmt(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def table(headers, rows, align=None):
    cols = [[str(h)] + [str(r[i]) for r in rows] for i, h in enumerate(headers)]
    w = [max(len(s) for s in c) for c in cols]
    align = align or ["<"] + [">"] * (len(headers) - 1)
    line = lambda cells: "  ".join(format(c, f"{a}{n}") for c, a, n in zip(cells, align, w))  # noqa: E731
    out = [line(headers), "  ".join("-" * n for n in w)]
    out += [line([str(c) for c in r]) for r in rows]
    return "\n".join(out)


def loadavg():
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def first_divergence(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


FILLER = ("Plants, algae and some bacteria capture the energy of sunlight and store it in sugars. In the leaves, "
          "chlorophyll absorbs red and blue light; water taken up by the roots is split, releasing oxygen, and carbon "
          "dioxide from the air is fixed into three-carbon molecules that the cell builds into glucose and starch. ")


def long_prompt(tok, question: str, n: int) -> list:
    """A chat prompt of exactly `n` tokens: the question after as much filler text as fits."""
    pre, post = tok.apply_chat_template([{"role": "user", "content": "\x00"}]).split("\x00")
    head, tail = tok.encode(pre), tok.encode("\n\n" + question + post)
    room = n - len(head) - len(tail)
    if room <= 0:
        return []
    filler = []
    while len(filler) < room:
        filler += tok.encode(FILLER * 8)
    return head + filler[:room] + tail


def luminal_isa(simd) -> str:
    isa = getattr(lm._core, "cpu_isa", None)
    if isa is not None:
        return str(isa())
    return "avx2" if "avx2" in simd and "fma" in simd else "portable (no AVX2)"


def llamacpp_isa() -> str:
    try:
        import llama_cpp

        info = llama_cpp.llama_print_system_info()
        return (info.decode() if isinstance(info, bytes) else str(info)).strip()
    except Exception as e:  # noqa: BLE001
        return f"? ({e!r})"


def copy_bandwidth(threads: int, nbytes: int = 256 << 20, reps: int = 5) -> float:
    """GB/s (bytes read + written) of a numpy copy of an `nbytes` array split over `threads` threads (numpy lets
    go of the GIL while copying); the best of `reps`."""
    from concurrent.futures import ThreadPoolExecutor

    src = np.ones(nbytes // 8)
    dst = np.zeros_like(src)
    parts = np.array_split(np.arange(src.size), threads)
    spans = [(int(p[0]), int(p[-1]) + 1) for p in parts if p.size]

    def part(span):
        np.copyto(dst[span[0]:span[1]], src[span[0]:span[1]])

    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(part, spans))  # the pages first touched
        for _ in range(reps):
            t = time.perf_counter()
            list(pool.map(part, spans))
            best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best / 1e9


def long_cache_bytes(cfg, scenario) -> float:
    _, sids, n_new, _ = scenario
    return 4 * 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * (len(sids) + n_new)


def decode_bytes(engine, cfg, gguf, position: float) -> float:
    """Bytes a decode step reads at cache `position`: every weight once (the tied embedding as the head; its
    gathered row is noise) plus the KV rows, float32 in luminal and hf, float16 in llama.cpp (its default)."""
    kv_row = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim  # K and V values per position
    if engine.name.startswith("hf"):
        return engine.weight_bytes + 4 * kv_row * position
    weights = sum(t.nbytes or 0 for t in gguf.tensors.values())
    return weights + (2 if engine.name.startswith("llama.cpp") else 4) * kv_row * position


def main(args):
    if args.threads < 1 or args.runs < 1 or args.new_tokens < 1 or args.long_new_tokens < 1 or args.long_context < 0:
        sys.exit("--threads, --runs, --new-tokens and --long-new-tokens must be >= 1, --long-context >= 0")
    from luminal.gguf import GGUFFile
    from luminal.hub import bundled_model_path
    from luminal.nn import LlamaConfig
    from luminal.tokenizer import Tokenizer

    wall0 = time.perf_counter()
    model, simd = cpu_model()
    print("== machine ==")
    print(f"nproc {os.cpu_count()} (usable {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'})"
          f", CPU: {model}, SIMD: {' '.join(simd) or 'none of avx2/avx512'}, {platform.system()} {platform.release()}")
    for k, v in versions().items():
        print(f"  {k:13s} {v}")
    print(f"threads {args.threads} everywhere (luminal set_num_threads, torch.set_num_threads, n_threads for "
          f"llama.cpp, OPENBLAS/OMP/MKL_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')} for numpy)")
    load_before = loadavg()
    print(f"load average before: {load_before}")

    path = bundled_model_path()
    gguf = GGUFFile(path)
    cfg = LlamaConfig.from_gguf(gguf)
    size = os.path.getsize(path)
    tok = Tokenizer.from_gguf(gguf)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": args.prompt}]))
    print(f"model {path} ({size / MB:.1f} MB), {cfg.n_layers} layers, hidden {cfg.hidden}, vocab {cfg.vocab_size}")
    print(f"prompt {len(ids)} tokens, {args.new_tokens} new greedy tokens (no early stop), {args.runs} timed runs "
          f"per engine alternating, after one warm-up run of {args.warmup_tokens} tokens each")
    long_ids = long_prompt(tok, args.prompt, args.long_context - args.long_new_tokens) if args.long_context > 0 else []
    if long_ids:
        print(f"long context: a prompt of {len(long_ids)} tokens (filler text, then the question), prefilled once per "
              f"engine, then {args.long_new_tokens} new tokens per timed run")
    n_ctx = max(len(ids) + max(args.new_tokens, args.warmup_tokens), len(long_ids) + args.long_new_tokens) + 16
    print(f"ISA path: luminal {luminal_isa(simd)}")
    sys.stdout.flush()

    # ---- engines
    print("\n== setup ==")
    engines, skipped = [], []
    try:
        e = LuminalEngine(args.threads)
        i = e.info
        print(f"luminal: worker pid {i['pid']}, load {i['load_s']:.2f} s, compile {i['compile_s']:.2f} s "
              f"({i['nodes']} nodes), threads {i.get('threads')}")
        engines.append(e)
    except Exception as ex:  # noqa: BLE001
        skipped.append(("luminal", f"failed: {ex}"))
        print(f"luminal: FAILED\n{ex}")
    if args.skip_hf:
        skipped.append(("hf float32", "--skip-hf"))
    else:
        try:
            e = HFEngine(gguf, cfg, args.threads)
            print(f"hf float32: built in {e.load_s:.2f} s, attention '{e.attn}', torch threads "
                  f"{e.torch.get_num_threads()}, logits for the last token only: {bool(e.keep)}")
            engines.append(e)
        except Exception:  # noqa: BLE001
            skipped.append(("hf float32", "failed (traceback above)"))
            print("hf float32: FAILED")
            traceback.print_exc(file=sys.stdout)
    if args.skip_llamacpp:
        skipped.append(("llama.cpp", "--skip-llamacpp"))
    else:
        try:
            import llama_cpp  # noqa: F401

            have = True
        except ImportError:
            have = False
            skipped.append(("llama.cpp", "llama_cpp not importable"))
            print(f"llama.cpp: SKIPPED, llama-cpp-python is not installed; to add the column:\n    {LLAMACPP_INSTALL}")
        except Exception as ex:  # noqa: BLE001
            have = False
            skipped.append(("llama.cpp", f"import failed: {ex!r}"))
            print(f"llama.cpp: SKIPPED, importing llama_cpp failed: {ex!r}")
        if have:
            print(f"ISA path: llama.cpp {llamacpp_isa()}")
            for fa in (True, False):
                try:
                    e = LlamaCppEngine(path, args.threads, fa, n_ctx)
                    print(f"{e.name}: loaded in {e.load_s:.2f} s, n_ctx {n_ctx}")
                    engines.append(e)
                except Exception:  # noqa: BLE001
                    name = f"llama.cpp FA {'on' if fa else 'off'}"
                    skipped.append((name, "failed (traceback above)"))
                    print(f"{name}: FAILED")
                    traceback.print_exc(file=sys.stdout)
    sys.stdout.flush()

    # ---- warm-up, then timed runs alternating between the engines, per scenario
    broken = {}
    if args.warmup_tokens > 0:
        for e in engines:
            try:
                t = time.perf_counter()
                e.run(ids, args.warmup_tokens)
                print(f"warm-up {e.name}: {time.perf_counter() - t:.2f} s")
            except Exception as ex:  # noqa: BLE001
                broken[e.name] = f"warm-up failed: {ex}"
                print(f"warm-up {e.name}: FAILED\n{ex}")
    scenarios = [(f"{len(ids)}+{args.new_tokens}", ids, args.new_tokens, False)]
    if long_ids:
        scenarios.append((f"{len(long_ids)}+{args.long_new_tokens}", long_ids, args.long_new_tokens, True))
    per = {}  # (scenario, engine) -> the timed runs
    for label, sids, n_new, resume in scenarios:
        print(f"\n== runs: context {label} (prompt + new tokens) ==")
        if resume:  # one prefill per engine (timed once), then the timed runs decode after it
            for e in engines:
                if e.name in broken:
                    continue
                try:
                    res = e.run(sids, n_new)
                    per[(label, e.name, "prefill")] = res
                    print(f"prefill {e.name:16s} {res['prefill_tokens']} tok {res['prefill_s']:.2f} s = "
                          f"{res['prefill_tokens'] / res['prefill_s']:.1f} tok/s (once)", flush=True)
                except Exception as ex:  # noqa: BLE001
                    broken[e.name] = f"long prefill failed: {ex}"
                    print(f"prefill {e.name}: FAILED\n{ex}")
        for r in range(args.runs):
            for e in engines:
                if e.name in broken:
                    continue
                try:
                    res = e.run(sids, n_new, resume=resume)
                except Exception as ex:  # noqa: BLE001
                    broken[e.name] = f"run failed: {ex}"
                    print(f"run {r + 1} {e.name}: FAILED\n{ex}")
                    continue
                if resume:
                    res["prefill_tokens"], res["prefill_s"] = per[(label, e.name, "prefill")]["prefill_tokens"], \
                        per[(label, e.name, "prefill")]["prefill_s"]
                res["prefill_tps"] = res["prefill_tokens"] / res["prefill_s"]
                res["decode_tps"] = res["decode_tokens"] / res["decode_s"] if res["decode_s"] > 0 else None
                per.setdefault((label, e.name), []).append(res)
                print(f"run {r + 1}  {e.name:16s} prefill {res['prefill_tokens']:4d} tok "
                      f"{res['prefill_s'] * 1e3:8.1f} ms = {res['prefill_tps']:8.1f} tok/s{' (once)' if resume else ''} | decode "
                      f"{res['decode_tokens']:3d} tok {res['decode_s']:7.2f} s = {fmt(res['decode_tps'], '7.2f')} tok/s"
                      f"   (load {os.getloadavg()[0]:.2f})", flush=True)
    results = {e.name: per.get((scenarios[0][0], e.name), []) for e in engines}

    # ---- summary
    print("\n== machine copy bandwidth ==")
    copy_gbs = copy_bandwidth(args.threads)
    print(f"numpy copy of a 256 MB array over {args.threads} threads: {copy_gbs:.1f} GB/s (read + write); "
          f"what a decode step can read at most is about this (reads only)")
    print(f"\n== results: medians over {args.runs} runs, {args.threads} threads; context = prompt + new tokens; "
          f"traffic = (weights + KV cache rows read) per token / time per token ==")
    rows, med = [], {}
    for label, sids, n_new, resume in scenarios:
        for e in engines:
            rs = per.get((label, e.name), [])
            if rs:
                med[(label, e.name)] = (statistics.median(x["prefill_tps"] for x in rs),
                                        statistics.median(x["decode_tps"] for x in rs if x["decode_tps"]))
        lum = med.get((label, "luminal"))
        for e in engines:
            if (label, e.name) not in med:
                rows.append((label, e.name, "-", "-", "-", "-", "-", "-", broken.get(e.name, "no runs")))
                continue
            p, d = med[(label, e.name)]
            rp = f"{lum[0] / p:.2f}x" if lum and e.name != "luminal" else "-"
            rd = f"{lum[1] / d:.2f}x" if lum and e.name != "luminal" else "-"
            traffic = decode_bytes(e, cfg, gguf, len(sids) + n_new / 2) * d / 1e9  # at the middle position
            rows.append((label, e.name, f"{p:.1f}", f"{d:.2f}", f"{1e3 / d:.1f}", rp, rd,
                         f"{traffic:.1f} GB/s ({traffic / copy_gbs:.0%})", broken.get(e.name, "")))
    for name, why in skipped:
        rows.append(("", name, "-", "-", "-", "-", "-", "-", f"skipped: {why}"))
    print(table(["context", "engine", "prefill tok/s", "decode tok/s", "decode ms/tok", "luminal/peer prefill",
                 "luminal/peer decode", "traffic (of copy bw)", "note"], rows,
                ["<", "<", ">", ">", ">", ">", ">", ">", "<"]))
    if len(scenarios) > 1:
        short, long_ = scenarios[0][0], scenarios[1][0]
        print(f"decode at context {long_} / at {short}: " + ", ".join(
            f"{e.name} {med[(long_, e.name)][1] / med[(short, e.name)][1]:.2f}x" for e in engines
            if (short, e.name) in med and (long_, e.name) in med) + "  (goal for luminal: >= 0.8x)")
    best = {n: (max(x["prefill_tps"] for x in rs), max(x["decode_tps"] for x in rs if x["decode_tps"]))
            for n, rs in results.items() if rs}
    if args.runs > 1 and best:
        lb = best.get("luminal")
        print(f"best run of each engine at context {scenarios[0][0]} (less sensitive to the load of a shared machine):")
        print(table(["engine", "prefill tok/s", "decode tok/s", "luminal/peer prefill", "luminal/peer decode"],
                    [(n, f"{p:.1f}", f"{d:.2f}", f"{lb[0] / p:.2f}x" if lb and n != "luminal" else "-",
                      f"{lb[1] / d:.2f}x" if lb and n != "luminal" else "-") for n, (p, d) in best.items()]))
    if any(n.startswith("llama.cpp") for n, _ in skipped) and not any(e.name.startswith("llama.cpp") for e in engines):
        print(f"(llama.cpp column skipped; install it with: {LLAMACPP_INSTALL})")

    # ---- luminal memory
    lumeng = next((e for e in engines if e.name == "luminal"), None)
    if lumeng is not None and lumeng.peaks:
        i = lumeng.info
        timed = lumeng.peaks[1:] if args.warmup_tokens > 0 and len(lumeng.peaks) > 1 else lumeng.peaks
        long_runs = [p for p in timed if long_ids and p["prompt_tokens"] == len(long_ids)]
        timed = [p for p in timed if p["prompt_tokens"] == len(ids)] or timed
        peak = max(p["after"].get("VmHWM", 0) for p in timed)
        last = timed[-1]["after"]
        base = i["base"].get("VmRSS", 0)
        print("\n== luminal memory (its own process) ==")
        rows = [
            ("after `import luminal` (python + numpy + _core)", f"{base / MB:.1f}", ""),
            ("after load + compile (RSS)", f"{i['loaded'].get('VmRSS', 0) / MB:.1f}",
             f"anon {i['loaded'].get('RssAnon', 0) / MB:.1f}, file {i['loaded'].get('RssFile', 0) / MB:.1f}"),
            ("peak while loading (VmHWM)", f"{i['loaded'].get('VmHWM', 0) / MB:.1f}", ""),
            ("peak during prefill + decode (VmHWM, max over timed runs)", f"{peak / MB:.1f}",
             "" if all(p["hwm_reset"] for p in timed) else "VmHWM could not be reset: lifetime peak"),
        ] + ([
            (f"peak at context {scenarios[1][0]} (VmHWM, its prefill included)",
             f"{max(p['after'].get('VmHWM', 0) for p in long_runs) / MB:.1f}",
             f"KV cache rows in use {long_cache_bytes(cfg, scenarios[1]) / MB:.1f} MB (float32)"),
        ] if long_runs else []) + [
            ("RSS after the last run", f"{last.get('VmRSS', 0) / MB:.1f}",
             f"anon {last.get('RssAnon', 0) / MB:.1f}, file {last.get('RssFile', 0) / MB:.1f}"),
            ("GGUF file", f"{size / MB:.1f}", ""),
        ]
        print(table(["", "MB", ""], rows, ["<", ">", "<"]))
        target = 1.5 * size
        print(f"peak during decode = {peak / size:.2f}x the GGUF size ({(peak - base) / size:.2f}x counting only what "
              f"the model adds over the interpreter); target <= 1.5x ({target / MB:.0f} MB): "
              f"{'MET' if peak <= target else 'NOT MET'}")

    # ---- greedy agreement
    print("\n== greedy tokens ==")
    first = {n: rs[0]["tokens"] for n, rs in results.items() if rs}
    if "luminal" in first:
        lt = first["luminal"]
        steady = all(rs["tokens"] == lt for rs in results["luminal"])
        print(f"luminal, first 16: {lt[:16]}  {tok.decode(lt[:16])!r}")
        print(f"luminal tokens identical across its runs: {steady}")
        for name, t in first.items():
            if name == "luminal":
                continue
            agree = t[:16] == lt[:16]
            div = first_divergence(t, lt)
            print(f"{name} vs luminal: first 16 greedy tokens {'AGREE' if agree else 'DIFFER'}; "
                  f"{'all ' + str(len(t)) + ' agree' if div is None else 'first difference at token ' + str(div)}"
                  + ("" if agree else f"\n    {name}: {t[:16]}  {tok.decode(t[:16])!r}"))
    else:
        print("no luminal run to compare against")

    for e in engines:
        e.close()

    # ---- matmul
    if not args.skip_matmul:
        print(f"\n== float32 1024x1024 @ 1024x1024 matmul, {args.threads} threads, median of 5 after two warm-ups ==")
        try:
            mrows, stats = matmul_bench(args.threads)
            lrow = next((r for r in mrows if r[0] == "luminal" and r[1]), None)
            rows = []
            for name, gf, ms, err, note in mrows:
                ratio = f"{lrow[1] / gf:.3f}x" if (lrow and gf and not name.startswith("luminal")) else "-"
                rows.append((name, fmt(gf, ".1f"), fmt(ms, ".1f"), fmt(err, ".1e"), ratio, note))
            print(table(["engine", "GFLOP/s", "ms", "max rel err", "luminal/peer", "note"], rows,
                        ["<", ">", ">", ">", ">", "<"]))
            print(f"luminal compiled graphs (a @ b; a @ b.T): {stats}")
        except Exception:  # noqa: BLE001
            print("matmul benchmark FAILED")
            traceback.print_exc(file=sys.stdout)

    print(f"\nload average before: {load_before}; after: {loadavg()}; wall time {time.perf_counter() - wall0:.0f} s")


if __name__ == "__main__":
    main(ARGS)
