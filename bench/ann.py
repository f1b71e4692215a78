"""PostgreSQL's ANN indexes for the big visibility keys (bot/memory/postgres/ann.py): build time, recall@10
against the exact scan on the same queries, search latency of each, and a fact write's cost with and without.

    .venv/bin/python -m bench.ann --database-url postgresql://.../muninn_bench_100000 [--min 5000]

Runs on a database bench.speed --database-url made (its world copied in); leaves the indexes in
place (so a following bench.speed --database-url run searches through them) unless --drop.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

from bench.world import DIM, SkewShape, SkewWorld, said_in_busy_channel, summary
from bot.memory.postgres import ann, recall_sql
from bot.memory.postgres.backend import PostgresStorage
from bot.memory.vector_indexes import carried_out, planned


def timed_writes(storage: PostgresStorage, info: Any, count: int, seed: int) -> dict:
    """`count` memories stored in the busy channel through the product's insert, one transaction each: ms."""
    chatter = SkewWorld(SkewShape(1000), seed=seed)
    conn = storage.open_writer()
    took = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            said_in_busy_channel(conn, info, chatter)
            took.append((time.perf_counter() - started) * 1000)
    finally:
        storage.close(conn)
    return summary(took)


def drop_all(storage: PostgresStorage) -> int:
    conn = storage.open_reader()
    try:
        rows = ann.listed(conn)
        ann.carry_out(conn, storage.index_info(conn), ann.Plan(drop=[row.name for row in rows]))  # type: ignore[arg-type]
        return len(rows)
    finally:
        storage.close(conn)
        storage.ann.forget()


def recall_at_10(storage: PostgresStorage, queries: int) -> dict:
    """Per indexed key: recall@10 of the ANN search against the exact scan, and each one's latency."""
    conn = storage.open_reader()
    out: dict = {}
    try:
        info = storage.index_info(conn)
        assert info is not None
        sizes = dict(conn.pg.execute("SELECT vis_key, count(*) FROM memory_vectors GROUP BY vis_key").fetchall())
        valid = storage.ann.valid_names(conn)
        rng = np.random.default_rng(5)
        for key, size in sorted(sizes.items(), key=lambda item: -item[1]):
            if ann.index_name(key, info.dim) not in valid:
                continue
            hits, ann_ms, exact_ms = [], [], []
            for _ in range(queries):
                q = rng.standard_normal(DIM).astype(np.float32)
                q = (q / np.linalg.norm(q)).tolist()
                started = time.perf_counter()
                exact = recall_sql.server_knn(conn, info, q, [key], 10)
                exact_ms.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                got = storage.ann.search(conn, info, q, [key], 10, None, recall_sql.server_knn)
                ann_ms.append((time.perf_counter() - started) * 1000)
                hits.append(len({mid for mid, _ in got} & {mid for mid, _ in exact}) / max(1, len(exact)))
            out[key] = {"vectors": int(size), "recall_at_10": round(float(np.mean(hits)), 3),
                        "ann_ms": summary(ann_ms), "exact_ms": summary(exact_ms)}
            print(f"  {key} ({size:,} vectors): recall@10 {out[key]['recall_at_10']:.3f}; ANN "
                  f"{out[key]['ann_ms']['median']:.1f} / {out[key]['ann_ms']['p95']:.1f} ms, exact "
                  f"{out[key]['exact_ms']['median']:.1f} / {out[key]['exact_ms']['p95']:.1f} ms (median / p95)",
                  flush=True)
    finally:
        storage.close(conn)
    return out


def real_embeddings(server_url: str, npz: str, queries: int, candidates: list[int]) -> dict:
    """Recall@10 of the ANN path on real embeddings (bench.quality's MiniLM cache: LoCoMo and BEAM
    texts) in one key, `queries` of them held out as the queries; random vectors (the synthetic
    world's) are the worst case for any graph index, real ones cluster."""
    from bench.pg_speed import create_database
    from bot.memory import records
    data = np.load(npz, allow_pickle=True)
    vecs = np.asarray(data["vectors"], dtype=np.float32)
    rng = np.random.default_rng(3)
    order = rng.permutation(len(vecs))
    held, stored = vecs[order[:queries]], vecs[order[queries:]]
    storage = PostgresStorage(create_database(server_url, "muninn_ann_real"))
    conn = storage.open_writer()
    try:
        info = storage.index_for(conn, "minilm", vecs.shape[1])
        assert info is not None
        for start in range(0, len(stored), 1000):
            block = stored[start:start + 1000]
            storage.insert(conn, [records.NewMemory(f"memory {start + i}", "global") for i in range(len(block))],
                           base_stability_days=7.0, model="minilm", vecs=block.tolist(), now=None)
        conn.pg.execute("ANALYZE memory_vectors")
        job = planned(conn, 1000)
    finally:
        storage.close(conn)
    assert job is not None
    carried_out(job, 0)
    conn = storage.open_reader()
    out: dict = {"vectors": len(stored), "queries": queries}
    try:
        key = job.plan.create[0][0]
        exact = [{mid for mid, _ in recall_sql.server_knn(conn, info, q.tolist(), [key], 10)} for q in held]
        for cand in candidates:
            ann.EF_SEARCH = cand
            hits = [len({mid for mid, _ in storage.ann.search(conn, info, q.tolist(), [key], 10, None,
                                                              recall_sql.server_knn)} & want) / 10
                    for q, want in zip(held, exact, strict=True)]
            out[f"recall_at_10_ef{cand}"] = round(float(np.mean(hits)), 3)
            print(f"  real embeddings ({len(stored):,} MiniLM vectors in one key, {queries} held-out queries): "
                  f"recall@10 {np.mean(hits):.3f} with hnsw.ef_search {cand}", flush=True)
    finally:
        storage.close(conn)
    return out


def world_on_postgres(args: Any) -> None:
    """`--world`: bench.speed's world file copied into a new database of --database-url's server
    (skipped when done before), the ANN indexes made as maintenance would, then the class recalls on
    PostgreSQL alone (pg_speed.measure_recall; MUNINN_VECTOR_CACHE_MB from the environment)."""
    import asyncio
    from pathlib import Path
    from urllib.parse import urlparse

    from bench.pg_speed import copied, create_database, database_url, measure_recall, settings_for
    from bench.world import VIEWER_CLASSES
    from bot.memory.postgres.copy import copy_database
    path = Path(args.world)
    name = f"{urlparse(args.database_url).path.lstrip('/') or 'muninn'}_ann_{args.size}"
    url = database_url(args.database_url, name)
    if not copied(url):
        create_database(args.database_url, name)
        started = time.perf_counter()
        copy_database(path, url, batch=5000)
        print(f"copied {path} into {name} in {time.perf_counter() - started:.0f} s", flush=True)
    storage = PostgresStorage(url)
    report: dict = {"size": args.size, "min": args.min}
    if not args.classes_only:
        made, dropped, seconds = build_indexes(storage, args.min, args.build_mb)
        print(f"made {made} ANN indexes, dropped {dropped} (keys of >= {args.min:,} vectors) in {seconds:.0f} s",
              flush=True)
        report["recall_of_indexed_keys"] = recall_at_10(storage, args.queries)
    report["embed_delay_ms"] = args.embed_delay_ms
    for delay in sorted({0.0, args.embed_delay_ms}) if args.embed_delay_ms else [0.0]:
        recall = asyncio.run(measure_recall(settings_for(path, url), SkewShape(args.size), args.viewers,
                                            embed_delay_ms=delay))
        report["classes" if delay == 0 else "classes_late_vector"] = recall
        when = "vector given" if delay == 0 else f"vector {delay:g} ms late (total includes the wait; after it)"
        print(f"  postgresql, MUNINN_VECTOR_CACHE_MB={os.environ.get('MUNINN_VECTOR_CACHE_MB', 'default')}, {when}: "
              + ", ".join(f"{kind} {recall[kind]['total']['median']:.1f} / {recall[kind]['total']['p95']:.1f} ms "
                          + (f"[{recall[kind]['after_vector']['median']:.1f} / {recall[kind]['after_vector']['p95']:.1f}] "
                             if delay else "")
                          + f"(keyword {recall[kind]['fts']['median']:.1f} / {recall[kind]['fts']['p95']:.1f}, "
                          f"vector {recall[kind]['vector']['median']:.1f} / {recall[kind]['vector']['p95']:.1f})"
                          for kind in VIEWER_CLASSES) + " (median / p95)", flush=True)
    with open(args.out, "w") as out:
        json.dump(report, out, indent=1)
    print(f"saved {args.out}")


def build_indexes(storage: PostgresStorage, minimum: int, build_mb: int) -> tuple[int, int, float]:
    """Maintenance's index job for keys of at least `minimum` vectors, run now: (made, dropped, seconds)."""
    conn = storage.open_reader()
    try:
        job = planned(conn, minimum)
    finally:
        storage.close(conn)
    assert job is not None
    started = time.perf_counter()
    made, dropped = carried_out(job, build_mb)
    return made, dropped, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--min", type=int, default=5000, help="MUNINN_VECTOR_INDEX_MIN")
    parser.add_argument("--build-mb", type=int, default=0, help="MUNINN_VECTOR_INDEX_BUILD_MB")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--writes", type=int, default=100)
    parser.add_argument("--drop", action="store_true", help="drop the indexes at the end")
    parser.add_argument("--out", default="bench/results/ann.json")
    parser.add_argument("--real", default="", metavar="NPZ",
                        help="instead: recall@10 on real embeddings (bench/results/embeddings-minilm.npz), on a "
                             "new database muninn_ann_real of --database-url's server")
    parser.add_argument("--world", default="", metavar="DB",
                        help="instead: bench.speed's world (skew-SIZE-LABEL.db) on PostgreSQL with its ANN indexes, "
                             "recall@10 of its indexed keys and the class recalls")
    parser.add_argument("--size", type=int, default=100000, help="with --world: its size")
    parser.add_argument("--viewers", type=int, default=60, help="with --world: recalls per class")
    parser.add_argument("--classes-only", action="store_true",
                        help="with --world, once loaded: only the class recalls (no index build, no recall@10)")
    parser.add_argument("--embed-delay-ms", type=float, default=0.0,
                        help="with --world: also run the classes with the question's vector known only this long "
                             "after each recall starts, as the bot's embedding from Ollama (20: a local GPU host)")
    args = parser.parse_args()
    if args.world:
        world_on_postgres(args)
        return
    if args.real:
        print(json.dumps(real_embeddings(args.database_url, args.real, 200, [100, 200, 400])))
        return
    storage = PostgresStorage(args.database_url)
    report: dict = {"min": args.min}
    print(f"dropped {drop_all(storage)} ANN indexes", flush=True)
    conn = storage.open_reader()
    try:
        info = storage.index_info(conn)
    finally:
        storage.close(conn)
    report["writes_without"] = timed_writes(storage, info, args.writes, seed=1)
    made, _, seconds = build_indexes(storage, args.min, args.build_mb)
    report["build_s"] = round(seconds, 1)
    report["made"] = made
    print(f"made {made} ANN indexes (keys of >= {args.min} vectors) in {report['build_s']} s", flush=True)
    report["writes_with"] = timed_writes(storage, info, args.writes, seed=2)
    print(f"a busy-channel memory stored: {report['writes_without']['median']:.2f} / "
          f"{report['writes_without']['p95']:.2f} ms without, {report['writes_with']['median']:.2f} / "
          f"{report['writes_with']['p95']:.2f} ms with the indexes (median / p95)", flush=True)
    report["keys"] = recall_at_10(storage, args.queries)
    if args.drop:
        drop_all(storage)
    with open(args.out, "w") as out:
        json.dump(report, out, indent=1)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
