"""The luminal side of benchmarks/llm_cpu.py: a process of its own, so the resident memory it reports is luminal's.
Kept small and importing only what it uses (a script is compiled at every start, and that memory would count too).

    python benchmarks/llm_cpu_worker.py THREADS     (llm_cpu.py starts it; JSON commands on stdin, replies on stdout)
"""
import json
import os
import sys
import time
import traceback

try:
    import luminal as lm
except ImportError:  # run from a checkout without PYTHONPATH=python
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import luminal as lm


# ---- process memory ---------------------------------------------------------------------------------------------------
def proc_status() -> dict:
    """VmRSS, VmHWM, RssAnon, RssFile from /proc/self/status, in bytes (missing keys absent)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def reset_peak_rss() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0). False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# ---- luminal, in a subprocess of its own ------------------------------------------------------------------------------
def luminal_worker(threads: int) -> None:
    """Loads the model, then answers JSON commands read line by line on stdin with one JSON line each."""
    proto = os.fdopen(os.dup(1), "w")  # the protocol channel; anything else printed goes to stderr
    os.dup2(2, 1)

    def reply(**kw):
        proto.write(json.dumps(kw) + "\n")
        proto.flush()

    try:
        from luminal.gguf import GGUFFile
        from luminal.hub import bundled_model_path
        from luminal.nn import Llama, LlamaConfig, Session, gguf_state_dict

        base = proc_status()
        t0 = time.perf_counter()
        g = GGUFFile(bundled_model_path())
        cfg = LlamaConfig.from_gguf(g)
        sd = gguf_state_dict(g, cfg, progress=False, quantized=True)
        m = Llama(cfg)
        m.load_state_dict(sd)
        del sd
        lm._core.set_num_threads(threads)
        t1 = time.perf_counter()
        # Prompts go in steps of at most 512 tokens, as llama.cpp's n_batch: a long prompt's intermediates stay
        # bounded, and each step's causal attention spans only the keys before it.
        sess = Session(m, max_step_tokens=512)
        loaded = proc_status()
        reply(ok=True, pid=os.getpid(), load_s=t1 - t0, compile_s=sess.compile_seconds, nodes=len(sess.graph),
              base=base, loaded=loaded, threads=lm._core.num_threads() if hasattr(lm._core, "num_threads") else None)
    except Exception:
        reply(ok=False, error=traceback.format_exc())
        return

    prefilled = None  # (the prompt of the last full run, its first new token)
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
            if cmd["cmd"] == "quit":
                reply(ok=True)
                return
            if cmd["cmd"] == "run":
                can_reset = reset_peak_rss()
                before = proc_status()
                ids, n = cmd["ids"], cmd["new_tokens"]
                if cmd.get("resume"):
                    # Decode again after the prompt the last run prefilled: the cache keeps its rows, the new ones
                    # are written over.
                    if prefilled is None or prefilled[0] != ids:
                        raise ValueError("resume: the last run prefilled another prompt")
                    sess.length = len(ids)
                    tok, toks, t0 = prefilled[1], [], time.perf_counter()
                    for _ in range(n):
                        toks.append(tok)
                        tok = sess.next_token([tok])
                    stats = {"prefill_tokens": 0, "prefill_s": 0.0, "decode_tokens": n,
                             "decode_s": time.perf_counter() - t0}
                else:
                    sess.reset()
                    toks = list(sess.generate(ids, max_new_tokens=n, temperature=0.0))
                    stats = sess.stats
                    prefilled = (ids, toks[0]) if toks else None
                after = proc_status()
                reply(ok=True, tokens=toks, stats=stats, before=before, after=after, hwm_reset=can_reset)
        except Exception:
            reply(ok=False, error=traceback.format_exc())


if __name__ == "__main__":
    luminal_worker(int(sys.argv[1]))
