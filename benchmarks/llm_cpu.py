"""CPU LLM benchmark: luminal vs Hugging Face transformers (float32) vs llama.cpp on SmolLM2-135M-Instruct (Q4_1).

All engines run the bundled GGUF (`luminal.hub.bundled_model_path()`), the same 35-token chat prompt
("Explain how photosynthesis works.") and greedy decoding of exactly --new-tokens tokens (no early stop), with the
same thread count. Runs alternate between the engines (luminal, hf, llama.cpp, luminal, hf, ...) so that machine
noise hits all of them alike; the table shows medians and the luminal/peer ratios from this one run.

  * luminal runs in a subprocess of its own (llm_cpu_worker.py, small, so that compiling the harness's own code is
    not counted either), so its resident memory is its own: the peak
    RSS during prefill + decode is read from VmHWM (reset through /proc/self/clear_refs before each run).
  * hf: `LlamaForCausalLM` float32 built from the same GGUF (weights dequantised by `gguf_state_dict`), prefill = one
    forward over the prompt, decode = an eager loop of single-token forwards with a DynamicCache.
  * llama.cpp (llama-cpp-python), when importable, with flash attention on and off. Not installed? Then
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

    def run(self, ids, new_tokens):
        r = self._ask(cmd="run", ids=[int(i) for i in ids], new_tokens=new_tokens)
        s = r["stats"]
        self.peaks.append(r)
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

    def run(self, ids, new_tokens):
        torch = self.torch
        with torch.inference_mode():
            cache = self._cache()
            x = torch.tensor([list(ids)], dtype=torch.long)
            t0 = time.perf_counter()
            out = self.model(input_ids=x, past_key_values=cache, use_cache=True, **self.keep)
            logits = out.logits[0, -1]
            prefill_s = time.perf_counter() - t0
            cache = out.past_key_values
            toks, decode_s = [], 0.0
            for _ in range(new_tokens):
                tok = int(torch.argmax(logits))
                toks.append(tok)
                t = time.perf_counter()
                out = self.model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True, **self.keep)
                logits = out.logits[0, -1]
                decode_s += time.perf_counter() - t
                cache = out.past_key_values
        return {"tokens": toks, "prefill_tokens": len(ids), "prefill_s": prefill_s, "decode_tokens": new_tokens,
                "decode_s": decode_s}

    def close(self):
        pass


# ---- llama.cpp (llama-cpp-python) -------------------------------------------------------------------------------------
class LlamaCppEngine:
    def __init__(self, path, threads, flash_attn: bool):
        import llama_cpp

        self.lc = llama_cpp
        self.name = f"llama.cpp FA {'on' if flash_attn else 'off'}"
        t0 = time.perf_counter()
        kw = dict(model_path=str(path), n_threads=threads, n_threads_batch=threads, n_ctx=512, verbose=False,
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

    def run(self, ids, new_tokens):
        llm = self.llm
        llm.reset()  # n_tokens = 0; the next eval drops the KV cache beyond it
        ids = [int(i) for i in ids]
        t0 = time.perf_counter()
        llm.eval(ids)
        logits = self._last_logits()
        prefill_s = time.perf_counter() - t0
        toks, decode_s = [], 0.0
        for _ in range(new_tokens):
            tok = int(np.argmax(logits))
            toks.append(tok)
            t = time.perf_counter()
            llm.eval([tok])
            logits = self._last_logits()
            decode_s += time.perf_counter() - t
        return {"tokens": toks, "prefill_tokens": len(ids), "prefill_s": prefill_s, "decode_tokens": new_tokens,
                "decode_s": decode_s}

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


def main(args):
    if args.threads < 1 or args.runs < 1 or args.new_tokens < 1:
        sys.exit("--threads, --runs and --new-tokens must be >= 1")
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
            for fa in (True, False):
                try:
                    e = LlamaCppEngine(path, args.threads, fa)
                    print(f"{e.name}: loaded in {e.load_s:.2f} s")
                    engines.append(e)
                except Exception:  # noqa: BLE001
                    name = f"llama.cpp FA {'on' if fa else 'off'}"
                    skipped.append((name, "failed (traceback above)"))
                    print(f"{name}: FAILED")
                    traceback.print_exc(file=sys.stdout)
    sys.stdout.flush()

    # ---- warm-up, then timed runs alternating between the engines
    results = {e.name: [] for e in engines}
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
    print("\n== runs ==")
    for r in range(args.runs):
        for e in engines:
            if e.name in broken:
                continue
            try:
                res = e.run(ids, args.new_tokens)
            except Exception as ex:  # noqa: BLE001
                broken[e.name] = f"run failed: {ex}"
                print(f"run {r + 1} {e.name}: FAILED\n{ex}")
                continue
            res["prefill_tps"] = res["prefill_tokens"] / res["prefill_s"]
            res["decode_tps"] = res["decode_tokens"] / res["decode_s"] if res["decode_s"] > 0 else None
            results[e.name].append(res)
            print(f"run {r + 1}  {e.name:16s} prefill {res['prefill_tokens']:3d} tok {res['prefill_s'] * 1e3:8.1f} ms "
                  f"= {res['prefill_tps']:8.1f} tok/s | decode {res['decode_tokens']:3d} tok {res['decode_s']:7.2f} s "
                  f"= {fmt(res['decode_tps'], '7.2f')} tok/s   (load {os.getloadavg()[0]:.2f})", flush=True)

    # ---- summary
    med = {}
    for name, rs in results.items():
        if rs:
            med[name] = (statistics.median(x["prefill_tps"] for x in rs),
                         statistics.median(x["decode_tps"] for x in rs if x["decode_tps"]))
    lum = med.get("luminal")
    print(f"\n== results: medians over {args.runs} runs, {args.threads} threads, prompt {len(ids)} tokens, "
          f"{args.new_tokens} new tokens ==")
    rows = []
    for e in engines:
        if e.name not in med:
            rows.append((e.name, "-", "-", "-", "-", "-", broken.get(e.name, "no runs")))
            continue
        p, d = med[e.name]
        rp = f"{lum[0] / p:.2f}x" if lum and e.name != "luminal" else "-"
        rd = f"{lum[1] / d:.2f}x" if lum and e.name != "luminal" else "-"
        rows.append((e.name, f"{p:.1f}", f"{d:.2f}", f"{1e3 / d:.1f}", rp, rd, broken.get(e.name, "")))
    for name, why in skipped:
        rows.append((name, "-", "-", "-", "-", "-", f"skipped: {why}"))
    print(table(["engine", "prefill tok/s", "decode tok/s", "decode ms/tok", "luminal/peer prefill",
                 "luminal/peer decode", "note"], rows, ["<", ">", ">", ">", ">", ">", "<"]))
    best = {n: (max(x["prefill_tps"] for x in rs), max(x["decode_tps"] for x in rs if x["decode_tps"]))
            for n, rs in results.items() if rs}
    if args.runs > 1 and best:
        lb = best.get("luminal")
        print("best run of each engine (less sensitive to the load of a shared machine):")
        print(table(["engine", "prefill tok/s", "decode tok/s", "luminal/peer prefill", "luminal/peer decode"],
                    [(n, f"{p:.1f}", f"{d:.2f}", f"{lb[0] / p:.2f}x" if lb and n != "luminal" else "-",
                      f"{lb[1] / d:.2f}x" if lb and n != "luminal" else "-") for n, (p, d) in best.items()]))
    if any(n.startswith("llama.cpp") for n, _ in skipped) and not any(e.name.startswith("llama.cpp") for e in engines):
        print(f"(llama.cpp column skipped; install it with: {LLAMACPP_INSTALL})")

    # ---- luminal memory
    lumeng = next((e for e in engines if e.name == "luminal"), None)
    if lumeng is not None and lumeng.peaks:
        i = lumeng.info
        timed = lumeng.peaks[-len(results.get("luminal", [])):] if results.get("luminal") else lumeng.peaks
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
