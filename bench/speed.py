"""Retrieval speed at scale, against the hardware limit.

    .venv/bin/python -m bench.speed --sizes 10000,100000

For each size: build (or reuse) a database of that many memories with a realistic
shape, then, for viewers drawn at random, time the product's own `Engine.recall`
(FTS path, vector path, fusion + graph + touch, whole retrieval without the
embedding call), the numpy anchor over exactly the vectors each viewer may see,
the database size against its raw vectors + texts, writes per second through
`Engine.remember` / `remember_many` (embedding through `OllamaClient` against the
hash embed server), and the event-loop lag while a burst of recalls is served.
Prints a table and saves JSON to bench/results/.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # a fair anchor: one core, like one SQLite thread
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bot.memory import db, store, vectors
from bot.memory.engine import Engine
from bot.memory.scope import Viewer, visible_keys
from bot.settings import load_settings

from .embed_server import EmbedServerProcess

RESULTS = Path(__file__).resolve().parent / "results"
DIM = 768
EMBED_MODEL = "hash-embed"
DAY = 86400.0
NOW = 1_767_225_600.0  # 2026-01-01: a fixed clock, so every run ranks alike
FILLER = ("the a is was to and of in my i we it for on with that at this so just".split())


@dataclass
class Shape:
    """Who owns what: many users with a few personal memories each, a few hundred busy
    channels (Zipf-like activity), a small share of global memories."""
    size: int
    guilds: int = 20
    channels: int = 300
    personal_share: float = 0.60
    global_share: float = 0.01
    dm_share: float = 0.10          # personal memories learned in a DM
    personal_per_user: float = 4.0  # mean
    vocab: int = 20000


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 4), "p95": round(percentile(values, 95), 4),
            "mean": round(statistics.fmean(values), 4), "n": len(values)}


class World:
    """The synthetic population and its deterministic memories, texts and vectors."""

    def __init__(self, shape: Shape, seed: int = 7):
        self.shape = shape
        rng = np.random.default_rng(seed)
        self.rng = rng
        syll = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "si", "de", "pa", "gu", "ber", "tin", "mar", "zel", "qu"]
        words = set()
        while len(words) < shape.vocab:
            words.add("".join(rng.choice(syll, size=rng.integers(2, 5))))
        self.words = np.array(sorted(words))
        ranks = np.arange(1, shape.vocab + 1, dtype=np.float64)
        self.word_p = (1 / ranks ** 1.07) / (1 / ranks ** 1.07).sum()
        self.channel_guild = rng.integers(0, shape.guilds, size=shape.channels)
        activity = 1 / np.arange(1, shape.channels + 1) ** 0.8
        self.channel_p = activity / activity.sum()
        n_personal = int(shape.size * shape.personal_share)
        self.users = max(1, int(n_personal / shape.personal_per_user))
        self.user_guild = rng.integers(0, shape.guilds, size=self.users)

    def sentence(self, lo: int = 5, hi: int = 14) -> str:
        n = int(self.rng.integers(lo, hi))
        content = self.rng.choice(self.words, size=n, p=self.word_p)
        filler = self.rng.choice(FILLER, size=n // 2)
        return " ".join(list(content) + list(filler))

    def memories(self):
        """Yield (NewMemory, vector) in a deterministic order."""
        s, rng = self.shape, self.rng
        for _ in range(s.size):
            roll = rng.random()
            created = NOW - float(rng.random()) * 365 * DAY
            importance = float(np.round(rng.beta(2, 3), 2))
            if roll < s.global_share:
                mem = store.NewMemory(self.sentence(), "global", owner_id=1, importance=importance,
                                      created_at=created)
            elif roll < s.global_share + s.personal_share:
                user = int(rng.integers(0, self.users))
                guild = None if rng.random() < s.dm_share else int(self.user_guild[user]) + 1
                mem = store.NewMemory(self.sentence(), "personal", owner_id=user + 1000, guild_id=guild,
                                      importance=importance, created_at=created)
            else:
                ch = int(rng.choice(s.channels, p=self.channel_p))
                mem = store.NewMemory(self.sentence(), "room", owner_id=int(rng.integers(0, self.users)) + 1000,
                                      channel_id=ch + 100_000, guild_id=int(self.channel_guild[ch]) + 1,
                                      importance=importance, created_at=created)
            vec = rng.standard_normal(DIM, dtype=np.float32)
            yield mem, vec / np.linalg.norm(vec)

    def viewer(self) -> Viewer:
        """A random user speaking in a channel of their guild, busy channels more often."""
        user = int(self.rng.integers(0, self.users))
        guild = int(self.user_guild[user])
        chans = np.flatnonzero(self.channel_guild == guild)
        if len(chans) == 0:
            return Viewer(user + 1000, dm=True)
        p = self.channel_p[chans] / self.channel_p[chans].sum()
        ch = int(self.rng.choice(chans, p=p))
        return Viewer(user + 1000, channel_id=ch + 100_000, guild_id=guild + 1)

    def query(self) -> tuple[str, np.ndarray]:
        vec = self.rng.standard_normal(DIM, dtype=np.float32)
        return self.sentence(6, 10), vec / np.linalg.norm(vec)


def bench_settings(path: Path, ollama_url: str = ""):
    return load_settings({"MUNINN_DB_PATH": str(path), "OLLAMA_URL": ollama_url, "OLLAMA_EMBED_MODEL": EMBED_MODEL,
                          "OLLAMA_COOLDOWN": "0", "OLLAMA_EMBED_TIMEOUT": "30"})


async def build(path: Path, shape: Shape, buckets: int, chunk_size: int, batch: int = 2000) -> dict:
    """Bulk-build through the product's store.insert_many (memory + FTS + vec0 rows)."""
    world = World(shape)
    started = time.perf_counter()
    async with Engine(bench_settings(path)) as engine:
        await engine.write(lambda conn: vectors.create_index(conn, EMBED_MODEL, DIM, buckets=buckets,
                                                           chunk_size=chunk_size))
        info = await engine.write(vectors.index_info)
        pending: list = []

        def flush(conn, rows):
            store.insert_many(conn, [m for m, _ in rows], base_stability_days=engine.settings.base_stability_days,
                              vector_info=info, vectors_=[v.tolist() for _, v in rows], now=NOW)
        for item in world.memories():
            pending.append(item)
            if len(pending) >= batch:
                await engine.write(flush, pending)
                pending = []
        if pending:
            await engine.write(flush, pending)
        await engine.write(lambda conn: db.set_meta(conn, "bench_built", "1"))
        await engine.write(lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
    return {"build_s": round(time.perf_counter() - started, 2)}


def load_vectors(conn) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """All vectors (for the numpy anchor), grouped by visibility key."""
    ids, keys, blobs = [], [], []
    for mid, key in conn.execute("SELECT id, vis_key FROM memories WHERE archived_at IS NULL ORDER BY id"):
        ids.append(mid)
        keys.append(key)
    info = vectors.index_info(conn)
    mat = np.empty((len(ids), info.dim), dtype=np.float32)
    pos = {mid: i for i, mid in enumerate(ids)}
    for mid, blob in conn.execute("SELECT memory_id, embedding FROM vec_memories"):
        mat[pos[mid]] = np.frombuffer(blob, dtype=np.float32)
        blobs.append(mid)
    by_key: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        by_key.setdefault(key, []).append(i)
    return mat, {k: np.asarray(v) for k, v in by_key.items()}


def numpy_anchor(matrix: np.ndarray, query: np.ndarray, k: int, repeat: int = 5) -> float:
    """Best-of-`repeat` ms for X @ q + argpartition + sort of the top k (the physical floor)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        scores = matrix @ query
        if len(scores) > k:
            top = np.argpartition(-scores, k)[:k]
        else:
            top = np.arange(len(scores))
        top[np.argsort(-scores[top])]
        best = min(best, time.perf_counter() - t)
    return best * 1000


async def measure_reads(path: Path, shape: Shape, viewers: int) -> dict:
    world = World(shape, seed=99)
    async with Engine(bench_settings(path)) as engine:
        matrix, by_key = await engine.write(load_vectors)
        k = engine.settings.recall_limit * 3
        steps: dict[str, list[float]] = {s: [] for s in ("fts", "vector", "fuse_graph_touch", "total", "numpy",
                                                         "ratio", "visible")}
        for i in range(viewers + 20):
            viewer = world.viewer()
            text, qvec = world.query()
            result = await engine.recall(text, viewer, query_vector=qvec.tolist())
            keys = await engine.write(visible_keys, viewer)
            idx = np.concatenate([by_key.get(key, np.zeros(0, dtype=np.int64)) for key in keys]).astype(np.int64)
            visible = np.ascontiguousarray(matrix[idx])
            anchor = numpy_anchor(visible, qvec, k)
            if i < 20:
                continue  # warm-up
            t = result.timings_ms
            for step in ("fts", "vector", "fuse_graph_touch", "total"):
                steps[step].append(t[step])
            steps["numpy"].append(anchor)
            steps["ratio"].append(t["vector"] / anchor if anchor > 0 else float("nan"))
            steps["visible"].append(len(idx))
        raw = matrix.nbytes + await engine.write(lambda conn: db.query_value(
            conn, "SELECT sum(length(CAST(text AS BLOB))) FROM memories"))
        out = {name: summary(values) for name, values in steps.items()}
        out["raw_bytes"] = int(raw)
    return out


def db_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


async def measure_writes(path: Path, shape: Shape, url: str, singles: int = 300, batches: int = 10,
                         batch_size: int = 100) -> dict:
    """Memories stored per second through Engine.remember / remember_many, embedding included."""
    world = World(shape, seed=123)
    out = {}
    async with Engine(bench_settings(path, url)) as engine:
        gen = world.memories()
        one = [next(gen)[0] for _ in range(singles)]
        many = [[next(gen)[0] for _ in range(batch_size)] for _ in range(batches)]
        await engine.remember(store.NewMemory("warm-up", "global", owner_id=1))
        t = time.perf_counter()
        for mem in one:
            await engine.remember(mem)
        out["one_at_a_time_per_s"] = round(singles / (time.perf_counter() - t), 1)
        t = time.perf_counter()
        for group in many:
            await engine.remember_many(group)
        out[f"batch_{batch_size}_per_s"] = round(batches * batch_size / (time.perf_counter() - t), 1)
        embedded = await engine.write(lambda conn: db.query_value(
            conn, "SELECT count(*) FROM memories WHERE embedded = 0 AND archived_at IS NULL"))
        out["left_unembedded"] = embedded
    return out


async def measure_loop_lag(path: Path, shape: Shape, url: str, burst: int = 300, concurrency: int = 20,
                           embed: bool = True) -> dict:
    """Event-loop lag while `burst` recalls are served, `concurrency` at a time: with the
    embedding call through OllamaClient (embed=True) or with precomputed query vectors."""
    world = World(shape, seed=321)
    lags: list[float] = []
    stop = asyncio.Event()

    async def monitor():
        interval = 0.001
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(interval)
            lags.append((time.perf_counter() - t - interval) * 1000)

    async with Engine(bench_settings(path, url)) as engine:
        await engine.recall("warm up", world.viewer())
        mon = asyncio.create_task(monitor())
        await asyncio.sleep(0.2)
        idle = list(lags)
        lags.clear()
        sem = asyncio.Semaphore(concurrency)
        totals: list[float] = []

        async def one():
            async with sem:
                text, qvec = world.query()
                result = await engine.recall(text, world.viewer(), query_vector=None if embed else qvec.tolist())
                totals.append(result.timings_ms["total"])
        t = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(burst)))
        elapsed = time.perf_counter() - t
        stop.set()
        await mon
    return {"burst": burst, "concurrency": concurrency, "embedding_call": embed, "recalls_per_s": round(burst / elapsed, 1),
            "recall_total_ms": summary(totals), "lag_max_ms": round(max(lags), 3),
            "lag_p99_ms": round(percentile(lags, 99), 3), "lag_idle_p99_ms": round(percentile(idle, 99), 3)}


def print_table(rows: list[dict]) -> None:
    cols = ["size", "visible", "fts", "vector", "numpy", "ratio", "fuse_graph_touch", "total"]
    print("\nretrieval without the embedding call, ms (median / p95); visible = vectors the viewer may see")
    print(" | ".join(f"{c:>18}" for c in cols))
    for r in rows:
        cells = [f"{r['size']:>18}"]
        for c in cols[1:]:
            s = r["reads"][c]
            cells.append(f"{s['median']:>8.3g} / {s['p95']:<7.3g}")
        print(" | ".join(cells))
    print("\nstorage and writes")
    for r in rows:
        line = (f"size {r['size']}: db {r['db_mb']:.1f} MB, raw vectors+texts {r['raw_mb']:.1f} MB, "
                f"ratio {r['db_ratio']:.2f}")
        if "writes" in r:
            w = r["writes"]
            line += f"; writes/s one-at-a-time {w['one_at_a_time_per_s']}, batched {w['batch_100_per_s']}"
        for key, what in (("loop_lag", "with embedding"), ("loop_lag_no_embedding", "vectors given")):
            if key in r:
                lag = r[key]
                line += (f"; burst {lag['burst']}x{lag['concurrency']} {what}: {lag['recalls_per_s']} recalls/s, "
                         f"loop lag p99 {lag['lag_p99_ms']} ms, max {lag['lag_max_ms']} ms")
        print(line)


async def run(args) -> list[dict]:
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        shape = Shape(size)
        path = workdir / f"speed-{size}-b{args.buckets}-c{args.chunk_size}.db"
        row: dict = {"size": size, "buckets": args.buckets, "chunk_size": args.chunk_size}
        fresh = not path.exists() or args.rebuild
        if fresh:
            for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                p.unlink(missing_ok=True)
            row["build"] = await build(path, shape, args.buckets, args.chunk_size)
            print(f"built {path} in {row['build']['build_s']} s", flush=True)
        row["reads"] = await measure_reads(path, shape, args.viewers)
        row["db_bytes"] = db_bytes(path)
        raw = row["reads"].pop("raw_bytes")
        row["raw_bytes"] = raw
        row["db_mb"], row["raw_mb"] = row["db_bytes"] / 1e6, raw / 1e6
        row["db_ratio"] = round(row["db_bytes"] / raw, 3)
        if args.writes and size == max(int(s) for s in args.sizes.split(",")):
            with EmbedServerProcess("hash", dim=DIM) as url:
                row["loop_lag"] = await measure_loop_lag(path, shape, url)
                row["loop_lag_no_embedding"] = await measure_loop_lag(path, shape, url, embed=False)
                row["writes"] = await measure_writes(path, shape, url)
        rows.append(row)
        print_table([row])
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Muninn retrieval speed benchmark")
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--viewers", type=int, default=300)
    parser.add_argument("--buckets", type=int, default=vectors.DEFAULT_BUCKETS)
    parser.add_argument("--chunk-size", type=int, default=vectors.DEFAULT_CHUNK_SIZE)
    parser.add_argument("--workdir", default="/tmp/muninn-bench")
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--no-writes", dest="writes", action="store_false",
                        help="skip the write and loop-lag measurements (they add memories to the database)")
    parser.add_argument("--label", default="speed")
    parser.add_argument("--out", default=None, help="JSON file (default bench/results/<label>.json)")
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args))
    print("\n== summary")
    print_table(rows)
    out = Path(args.out) if args.out else RESULTS / f"{args.label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
