"""Recall of the cache's int8 rows (MUNINN_VECTOR_FORM=int8) against exact float32, on real embeddings.

    .venv/bin/python -m bench.compact        # needs bench.quality's MiniLM cache (bench/results/embeddings-minilm.npz)

The vectors are all-MiniLM-L6-v2 embeddings of the LoCoMo turns that `bench.quality` caches
(384 dimensions): 400 of them are the queries, the rest one key. Each query goes through the
product's own pieces (`arrays.KeyVectors` in both forms, `arrays.scores_of`,
`arrays.rescore_count`): the int8 rows choose a short list, its rows are rescored with their
float32 vectors (the store's, in the product) and cut to k. Printed per k: how much of the exact
top k that keeps (recall@k), how often the order is the exact one, the largest error of an int8
score, and the bytes per row in each form. Without the rescoring, for comparison: recall@k of the
int8 scores alone, and of float16 rows (numpy widens float16 many times slower than int8, the
reason float16 is no form of the cache; `--speed` times both).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bot.memory.vectors.arrays import KeyVectors, rescore_count, scores_of

RESULTS = Path(__file__).resolve().parent / "results"
MINILM_CACHE = RESULTS / "embeddings-minilm.npz"
KS = (10, 15, 30)


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    return (matrix / np.linalg.norm(matrix, axis=1, keepdims=True)).astype(np.float32)


def recall(indexed: np.ndarray, queries: np.ndarray) -> dict[str, Any]:
    """Recall@k of int8 + rescoring (and of the int8 and float16 scores alone) against exact float32."""
    ids = np.arange(len(indexed), dtype=np.int64)
    int8 = KeyVectors(ids, np.zeros(len(ids)), indexed, form="int8")
    exact32 = KeyVectors(ids, np.zeros(len(ids)), indexed)
    _, _, codes, n, scales = int8.view()
    half = indexed.astype(np.float16).astype(np.float32)
    out: dict[str, Any] = {"rows": len(indexed), "queries": len(queries), "dim": indexed.shape[1],
                           "bytes_per_row": {"float32": exact32.nbytes // len(ids), "int8": int8.nbytes // len(ids)}}
    worst = 0.0
    for k in KS:
        kept, alone, as16, same_order = [], [], [], 0
        for q in queries:
            exact = indexed @ q
            truth = np.argsort(-exact, kind="stable")[:k]
            close = scores_of(codes[:n], q, scales[:n])
            worst = max(worst, float(np.max(np.abs(close - exact))))
            short = np.argsort(-close, kind="stable")[:rescore_count(k)]
            rescored = short[np.argsort(-exact[short], kind="stable")][:k]  # the store's float32 rows
            kept.append(len(set(rescored.tolist()) & set(truth.tolist())) / k)
            alone.append(len(set(np.argsort(-close)[:k].tolist()) & set(truth.tolist())) / k)
            as16.append(len(set(np.argsort(-(half @ q))[:k].tolist()) & set(truth.tolist())) / k)
            same_order += bool(np.array_equal(exact[rescored], exact[truth]))
        out[f"k={k}"] = {"recall_rescored": round(float(np.mean(kept)), 4),
                         "exact_order_share": round(same_order / len(queries), 4),
                         "short_list": rescore_count(k),
                         "recall_int8_alone": round(float(np.mean(alone)), 4),
                         "recall_float16_alone": round(float(np.mean(as16)), 4)}
    out["max_int8_score_error"] = round(worst, 5)
    return out


def speed(indexed: np.ndarray, queries: np.ndarray, rows: int = 32_000, dim: int = 768) -> dict[str, float]:
    """Best-of ms to score `rows` rows of `dim` in each form (the shape of a busy key), one thread."""
    rng = np.random.default_rng(2)
    matrix = unit_rows(rng.standard_normal((rows, dim), dtype=np.float32))
    q = matrix[0]
    ids = np.arange(rows, dtype=np.int64)
    int8 = KeyVectors(ids, np.zeros(rows), matrix, form="int8")
    half = matrix.astype(np.float16)
    _, _, codes, n, scales = int8.view()

    def best(run) -> float:
        times = []
        for _ in range(15):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        return round(min(times) * 1e3, 3)
    return {"rows": rows, "dim": dim, "float32_ms": best(lambda: matrix @ q),
            "int8_ms": best(lambda: scores_of(codes[:n], q, scales[:n])),
            "float16_widened_ms": best(lambda: half.astype(np.float32) @ q)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="int8 rows of the vector cache: recall against exact float32")
    parser.add_argument("--speed", action="store_true", help="also time scoring a busy key's rows in each form")
    parser.add_argument("--out", default=str(RESULTS / "compact.json"))
    args = parser.parse_args(argv)
    if not MINILM_CACHE.exists():
        raise SystemExit(f"no MiniLM vectors at {MINILM_CACHE}: run `python -m bench.quality` once (it caches them)")
    minilm = unit_rows(np.load(MINILM_CACHE)["vectors"].astype(np.float32))
    order = np.random.default_rng(0).permutation(len(minilm))
    queries, indexed = minilm[order[:400]], minilm[order[400:]]
    out: dict[str, Any] = {"minilm": recall(indexed, queries)}
    print("MiniLM", json.dumps(out["minilm"]), flush=True)
    if args.speed:
        out["speed"] = speed(indexed, queries)
        print("speed", json.dumps(out["speed"]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
