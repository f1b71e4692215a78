"""vec0 chunk sizes of the per-key layout compared on one database built by bench.speed.

    .venv/bin/python -m bench.layouts --size 100000 --source bench/results/skew-100000-speed.db --layouts 8,16,32

Each chunk size re-creates `vec_memories` in a copy of the speed database with
`vectors.create_index(chunk_size=)` and the same rows `vectors.put` writes, then times the
search inside sqlite-vec (`vectors.knn_vec0`, the fallback path; recall itself searches the
numpy cache) for random viewers against the numpy anchor over exactly their visible
vectors, and reports the file size. (Round 1 compared the old hashed-bucket layouts.)
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np

from bot.memory.scope import visible_keys
from bot.memory.sql import queries
from bot.memory.sqlite import db
from bot.memory.sqlite import vec0 as vectors

from .speed import load_vectors, numpy_anchor
from .world import EMBED_MODEL, RESULTS, Shape, World, summary


def rebuild(path: Path, chunk: int) -> float:
    conn = db.connect(path)
    rows = list(conn.execute("SELECT v.memory_id, m.vis_key, m.created_at, v.embedding FROM vec_memories v "
                             "JOIN memories m ON m.id = v.memory_id"))
    info = vectors.index_info(conn)
    t = time.perf_counter()
    with conn:
        conn.execute("DROP TABLE vec_memories")
        conn.execute("DELETE FROM meta WHERE key IN ('embed_model', 'embed_dim', 'vec_buckets', 'vec_layout')")
        info = vectors.create_index(conn, EMBED_MODEL, info.dim, chunk_size=chunk)
        conn.executemany("INSERT INTO vec_memories(memory_id, vis_key, created_at, embedding) VALUES (?, ?, ?, ?)",
                         [(mid, key, float(created), blob) for mid, key, created, blob in rows])
    elapsed = time.perf_counter() - t
    conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.close()
    return elapsed


def measure(path: Path, size: int, viewers: int) -> dict:
    conn = db.connect(path)
    info = vectors.index_info(conn)
    matrix, by_key = load_vectors(conn)
    world = World(Shape(size), seed=99)
    knn_ms, numpy_ms, ratio = [], [], []
    for i in range(viewers + 20):
        viewer = world.viewer()
        _, q = world.query()
        keys = visible_keys(conn, viewer)
        t = time.perf_counter()
        vectors.knn_vec0(conn, info, q.tolist(), keys, 15)  # sqlite-vec itself, not the numpy cache
        took = (time.perf_counter() - t) * 1000
        idx = np.concatenate([by_key.get(k, np.zeros(0, dtype=np.int64)) for k in keys]).astype(np.int64)
        anchor = numpy_anchor(np.ascontiguousarray(matrix[idx]), q, 15)
        if i >= 20:
            knn_ms.append(took)
            numpy_ms.append(anchor)
            ratio.append(took / anchor)
    conn.close()
    return {"knn_ms": summary(knn_ms), "numpy_ms": summary(numpy_ms), "ratio": summary(ratio)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100000)
    parser.add_argument("--source", required=True, help="a speed database (bench/speed.py builds them)")
    parser.add_argument("--workdir", default="/tmp/muninn-bench")
    parser.add_argument("--layouts", default="8,16,32", help="vec0 chunk sizes of the per-key layout")
    parser.add_argument("--viewers", type=int, default=200)
    parser.add_argument("--label", default="layouts")
    args = parser.parse_args(argv)
    source = Path(args.source)
    if not source.exists():
        raise SystemExit(f"no database at {source}: build one with `python -m bench.speed --sizes {args.size}` first")
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    raw = None
    rows = []
    for layout in args.layouts.split(","):
        chunk = int(layout)
        path = Path(args.workdir) / f"layout-{args.size}-{layout}.db"
        shutil.copy(source, path)
        build_s = rebuild(path, chunk)
        if raw is None:
            conn = db.connect(path)
            matrix, _ = load_vectors(conn)
            raw = matrix.nbytes + queries.query_value(conn, "SELECT sum(length(CAST(text AS BLOB))) FROM memories")
            conn.close()
        row = {"layout": layout, "chunk_size": chunk, "insert_s": round(build_s, 2),
               "db_bytes": path.stat().st_size, "db_ratio": round(path.stat().st_size / raw, 3),
               **measure(path, args.size, args.viewers)}
        rows.append(row)
        path.unlink()
        print(f"{layout:>10}: knn {row['knn_ms']['median']:.3f} / {row['knn_ms']['p95']:.3f} ms, numpy "
              f"{row['numpy_ms']['median']:.3f} ms, ratio {row['ratio']['median']:.1f} (p95 {row['ratio']['p95']:.1f}), "
              f"db {row['db_bytes'] / 1e6:.0f} MB = {row['db_ratio']:.2f}x raw, bulk insert {build_s:.1f} s",
              flush=True)
    out = RESULTS / f"{args.label}-{args.size}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
