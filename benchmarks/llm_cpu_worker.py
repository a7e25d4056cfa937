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
        sess = Session(m)
        loaded = proc_status()
        reply(ok=True, pid=os.getpid(), load_s=t1 - t0, compile_s=sess.compile_seconds, nodes=len(sess.graph),
              base=base, loaded=loaded, threads=lm._core.num_threads() if hasattr(lm._core, "num_threads") else None)
    except Exception:
        reply(ok=False, error=traceback.format_exc())
        return

    for line in sys.stdin:
        try:
            cmd = json.loads(line)
            if cmd["cmd"] == "quit":
                reply(ok=True)
                return
            if cmd["cmd"] == "run":
                sess.reset()
                can_reset = reset_peak_rss()
                before = proc_status()
                toks = list(sess.generate(cmd["ids"], max_new_tokens=cmd["new_tokens"], temperature=0.0))
                after = proc_status()
                reply(ok=True, tokens=toks, stats=sess.stats, before=before, after=after, hwm_reset=can_reset)
        except Exception:
            reply(ok=False, error=traceback.format_exc())


if __name__ == "__main__":
    luminal_worker(int(sys.argv[1]))
