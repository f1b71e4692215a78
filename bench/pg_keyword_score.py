"""PostgreSQL's keyword score (bot/memory/postgres/bm25.py) against `ts_rank_cd`, the score it
replaced, ranking the same matches: which costs more per query.

    .venv/bin/python -m bench.pg_keyword_score                 # 30,000 memories, 40 queries
    .venv/bin/python -m bench.pg_keyword_score --memories 5000 --queries 10

An embedded PostgreSQL; one key of `--memories` memories of Zipf-distributed words (8 to 120 a
memory); each query four mid-frequency words, OR'd as the keyword step does; both statements
run six times a query, the first of each discarded, the order alternating. Prints ms p50 / p95
of each and their ratio.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

from bot.memory.postgres import bm25
from bot.memory.postgres.migrations import migrate

VOCABULARY = 3000


def world(conn, memories: int, rng: random.Random) -> list[str]:
    """`memories` memories in one key; the words they use, commonest first."""
    words = [f"w{i}" for i in range(VOCABULARY)]
    weights = [1 / (i + 1) for i in range(VOCABULARY)]
    rows = [(" ".join(rng.choices(words, weights, k=rng.choice([8, 12, 20, 40, 120]))), "personal", 1, "p:1:dm",
             0.5, 7.0, 1000.0 + i, 1000.0 + i, "[]") for i in range(memories)]
    with conn.cursor() as cursor:
        cursor.executemany("INSERT INTO memories (text, scope, owner_id, vis_key, importance, stability, created_at, "
                           "updated_at, source_message_ids) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)", rows)
    conn.execute("ANALYZE memories")
    return words


def statements(conn, words: list[str], memories: int) -> dict[str, tuple[str, list]]:
    """Both scores' statements over the same matches of `words`."""
    match = " || ".join(["plainto_tsquery('muninn', %s)"] * len(words))
    counts = {w: int(conn.execute("SELECT count(*) FROM memories WHERE text_search @@ plainto_tsquery('muninn', %s)",
                                  (w,)).fetchone()[0]) for w in words}
    average = float(conn.execute("SELECT avg(length(text_search)) FROM memories").fetchone()[0])
    score, params = bm25.score_sql(words, counts, memories, average)
    head = f"SELECT h.id FROM memories h WHERE h.vis_key = 'p:1:dm' AND h.text_search @@ ({match}) ORDER BY "
    return {"ts_rank_cd": (f"{head}ts_rank_cd(h.text_search, {match}) DESC, h.id DESC LIMIT 30", [*words, *words]),
            "bm25": (f"{head}{score} DESC, h.id DESC LIMIT 30", [*words, *params])}


def measure(url: str, memories: int, queries: int, seed: int = 3) -> dict[str, dict[str, float]]:
    """ms p50 / p95 of each score over `queries` queries on a fresh world at `url`."""
    import psycopg
    rng = random.Random(seed)
    times: dict[str, list[float]] = {"ts_rank_cd": [], "bm25": []}
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        words = world(conn, memories, rng)
        for n in range(queries):
            both = statements(conn, rng.sample(words[20:400], 4), memories)
            for rep in range(6):
                for name in (("ts_rank_cd", "bm25") if (n + rep) % 2 else ("bm25", "ts_rank_cd")):
                    sql, params = both[name]
                    started = time.perf_counter()
                    conn.execute(sql.encode(), params, prepare=False).fetchall()
                    if rep:
                        times[name].append((time.perf_counter() - started) * 1000)
    return {name: {"p50": round(statistics.median(t), 2), "p95": round(sorted(t)[int(0.95 * (len(t) - 1))], 2)}
            for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=30000)
    parser.add_argument("--queries", type=int, default=40)
    args = parser.parse_args()
    from tests.postgres_server import EmbeddedPostgres
    server = EmbeddedPostgres().start()
    try:
        out = measure(server.create_database("keyword_score"), args.memories, args.queries)
    finally:
        server.stop()
    for name, t in out.items():
        print(f"{name:>10}: p50 {t['p50']:.2f} ms, p95 {t['p95']:.2f} ms")
    print(f"bm25 / ts_rank_cd: p50 {out['bm25']['p50'] / out['ts_rank_cd']['p50']:.2f}x, "
          f"p95 {out['bm25']['p95'] / out['ts_rank_cd']['p95']:.2f}x")


if __name__ == "__main__":
    main()
