"""Recall@10 of a key held partially (bot/memory/vectors/partial.py) against the exact search.

Real embeddings: bench.quality's MiniLM cache (LoCoMo and BEAM texts), all but 200 vectors as
one key, the 200 as queries: the recall of the shipped path (the Hamming shortlist, the codes'
dot product, the best rescored exactly), and how deep in each code ranking the exact top 10 sit
(the worst rank of the ten, per query) at growing key sizes: a depth that stays put as the key
grows is what lets a fixed shortlist serve keys far bigger than the sample. Random vectors (the
speed bench's kind, which have no neighbourhoods) for comparison, and the time of the code steps
on a key of their size.

    .venv/bin/python -m bench.partial --real bench/results/embeddings-minilm.npz
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from bot.memory.vectors import codes as vector_codes
from bot.memory.vectors import partial


def unit_rows(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def recall_at_10(base: np.ndarray, queries: np.ndarray, rescore: int | None = None) -> float:
    """Recall@10 of the partial path over `base` (one key) for each query, against the exact top 10."""
    key = partial.PartialKey(np.arange(len(base), dtype=np.int64), vector_codes.pack(base))
    saved = partial.RESCORE_MIN, partial.RESCORE_PER_K
    if rescore is not None:
        partial.RESCORE_MIN, partial.RESCORE_PER_K = rescore, 0
    try:
        hits = 0
        for q in queries:
            exact = set(np.argsort(-(base @ q))[:10].tolist())
            wanted = np.asarray(partial.candidates(key.view(), q, 10, None), dtype=np.int64)
            got = wanted[np.argsort(-(base[wanted] @ q))[:10]]
            hits += len(exact & set(got.tolist()))
    finally:
        partial.RESCORE_MIN, partial.RESCORE_PER_K = saved
    return round(hits / (10 * len(queries)), 4)


def worst_ranks(base: np.ndarray, queries: np.ndarray) -> dict:
    """Per query, the deepest rank of the exact top 10 by Hamming distance and by the codes' dot
    product (ties counted against): percentiles 50 / 90 / 99."""
    codes = vector_codes.pack(base)
    by_hamming, by_codes = [], []
    for q in queries:
        exact = np.argsort(-(base @ q))[:10]
        distance = vector_codes.hamming(codes, len(base), vector_codes.pack(q[None])[:, 0]).astype(np.int64)
        estimate = vector_codes.asymmetric(codes, q)
        by_hamming.append(max(int((distance <= distance[i]).sum()) for i in exact))
        by_codes.append(max(int((estimate >= estimate[i]).sum()) for i in exact))
    return {"hamming": [int(np.percentile(by_hamming, p)) for p in (50, 90, 99)],
            "codes": [int(np.percentile(by_codes, p)) for p in (50, 90, 99)]}


def code_steps_ms(n: int, dim: int, rounds: int = 20) -> dict:
    """Median time of the code steps (no read back) on a random key of `n` vectors."""
    rng = np.random.default_rng(0)
    codes = np.empty((vector_codes.words_for(dim), n), dtype=np.uint64)
    for start in range(0, n, 16384):
        end = min(n, start + 16384)
        codes[:, start:end] = vector_codes.pack(rng.standard_normal((end - start, dim)).astype(np.float32))
    key = partial.PartialKey(np.arange(n, dtype=np.int64), codes)
    took = []
    for _ in range(rounds):
        q = unit_rows(rng.standard_normal((1, dim)))[0]
        started = time.perf_counter()
        partial.candidates(key.view(), q, 15, None)
        took.append((time.perf_counter() - started) * 1e3)
    return {"n": n, "median_ms": round(float(np.median(took)), 2), "p95_ms": round(float(np.percentile(took, 95)), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", default="bench/results/embeddings-minilm.npz", metavar="NPZ")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--sizes", default="30000,300000", help="random keys: the code steps' time")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    vectors = unit_rows(np.load(args.real)["vectors"])
    order = rng.permutation(len(vectors))
    queries, base = vectors[order[:args.queries]], vectors[order[args.queries:]]
    out: dict = {"real": {"rows": len(base), "dim": base.shape[1], "recall_at_10": recall_at_10(base, queries),
                          "recall_at_10_reading_back": {r: recall_at_10(base, queries, r) for r in (20, 40, 80)},
                          "worst_rank_by_size": {n: worst_ranks(base[:n], queries)
                                                 for n in (1000, 2000, 4000, len(base))}}}
    random_base = unit_rows(rng.standard_normal((len(base), base.shape[1])))
    random_queries = unit_rows(rng.standard_normal((args.queries, base.shape[1])))
    out["random"] = {"rows": len(random_base), "recall_at_10": recall_at_10(random_base, random_queries),
                     "worst_rank": worst_ranks(random_base, random_queries)}
    out["code_steps"] = [code_steps_ms(int(n), 768) for n in args.sizes.split(",")]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
