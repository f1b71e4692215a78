"""Retrieval speed at scale, against the hardware limit.

    .venv/bin/python -m bench.speed --sizes 10000,100000            # the realistic shape (issue 12)
    .venv/bin/python -m bench.speed --shape uniform --sizes 100000  # round 1's shape

The realistic shape (`SkewShape`): 2,000 users active by Zipf, 200 channels in 10 guilds,
one busy channel holding 30 % of all memories, 2 % global, half personal (DM-origin and
private-channel ones included). Worlds are built once and kept in bench/results/ (git-
ignored, made on demand). Per viewer class (typical, busy channel, heavy user in a DM, global-only): the
product's `Engine.recall` without the embedding call, its steps and the numpy anchor over
exactly that viewer's visible vectors, in one run; then, on a scratch copy, 20 concurrent
recalls against one at a time, the DB side of storing an extracted fact (`_plan_updates` +
`fact_writes.write_facts`), `run_maintenance` from scratch and incrementally with recall latency
while it runs; and the resident memory of a process serving recalls (`memory_probe`).

Round 1's shape (`--shape uniform`): for viewers drawn at random, time the product's own `Engine.recall`
(FTS path, vector path, fusion + graph + touch, whole retrieval without the
embedding call), the numpy anchor over exactly the vectors each viewer may see,
the database size against its raw vectors + texts, writes per second through
`Engine.remember` / `remember_many` (embedding through `OllamaClient` against the
hash embed server), and the event-loop lag while a burst of recalls is served.
Prints a table and saves JSON to bench/results/.
"""
from __future__ import annotations

import os

from bench.trees import memory_module

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # a fair anchor: one core, like one SQLite thread
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.scope import Viewer, visible_keys
from bot.memory.sql import queries, store
from bot.memory.sqlite import db
from bot.memory.sqlite import vec0 as vectors
from bot.memory.writing import facts as fact_writes
from bot.settings import load_settings

from .embed_server import EmbedServerProcess
from .world import (
    DIM,
    EMBED_MODEL,
    NOW,
    RESULTS,
    VIEWER_CLASSES,
    Shape,
    SkewShape,
    SkewWorld,
    World,
    bench_settings,
    build,
    busy_channel_message,
    make_world,
    percentile,
    query_of,
    said_in_busy_channel,
    summary,
    world_path,
)


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


_EVICT = np.zeros(0, dtype=np.uint8)


def numpy_anchor_cold(matrix: np.ndarray, query: np.ndarray, k: int) -> float:
    """ms for one X @ q + top k right after the CPU caches were evicted (a write over twice a
    32 MB L3): a recall reads its viewer's vectors from memory, not from a cache that the
    same product just filled, which is what the best-of-5 anchor measures for small sets."""
    global _EVICT
    if len(_EVICT) == 0:
        _EVICT = np.zeros(64 << 20, dtype=np.uint8)
    _EVICT += 1
    return numpy_anchor(matrix, query, k, repeat=1)


async def measure_reads(path: Path, shape: Shape, viewers: int) -> dict:
    world = make_world(shape, seed=99)
    async with Engine(bench_settings(path)) as engine:
        matrix, by_key = await engine.write(load_vectors)
        k = engine.settings.recall_limit * 3
        steps: dict[str, list[float]] = {s: [] for s in ("fts", "vector", "fuse_graph_touch", "total", "numpy",
                                                         "ratio", "visible")}
        for i in range(viewers + 20):
            viewer = world.viewer()
            text, qvec = world.query()
            result = await engine.recall(text, viewer, query_vector=qvec.tolist())
            keys = await engine.read(visible_keys, viewer)
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
        raw = matrix.nbytes + await engine.write(lambda conn: queries.query_value(
            conn, "SELECT sum(length(CAST(text AS BLOB))) FROM memories"))
        out = {name: summary(values) for name, values in steps.items()}
        out["raw_bytes"] = int(raw)
    return out


def db_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


async def measure_writes(path: Path, shape: Shape, url: str, singles: int = 300, batches: int = 10,
                         batch_size: int = 100) -> dict:
    """Memories stored per second through Engine.remember / remember_many, embedding included."""
    world = make_world(shape, seed=123)
    out = {}
    async with Engine(bench_settings(path, url)) as engine:
        gen = world.memories()
        one = [next(gen)[0] for _ in range(singles)]
        many = [[next(gen)[0] for _ in range(batch_size)] for _ in range(batches)]
        await engine.remember(records.NewMemory("warm-up", "global", owner_id=1))
        t = time.perf_counter()
        for mem in one:
            await engine.remember(mem)
        out["one_at_a_time_per_s"] = round(singles / (time.perf_counter() - t), 1)
        t = time.perf_counter()
        for group in many:
            await engine.remember_many(group)
        out[f"batch_{batch_size}_per_s"] = round(batches * batch_size / (time.perf_counter() - t), 1)
        embedded = await engine.write(lambda conn: queries.query_value(
            conn, "SELECT count(*) FROM memories WHERE embedded = 0 AND archived_at IS NULL"))
        out["left_unembedded"] = embedded
    return out


async def measure_loop_lag(path: Path, shape: Shape, url: str, burst: int = 300, concurrency: int = 20,
                           embed: bool = True) -> dict:
    """Event-loop lag while `burst` recalls are served, `concurrency` at a time: with the
    embedding call through OllamaClient (embed=True) or with precomputed query vectors."""
    world = make_world(shape, seed=321)
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


def rss_mb() -> dict:
    """Resident memory in MB: anonymous (the process's own: Python, numpy, the vector cache,
    SQLite's page cache) and file-backed (pages of the memory-mapped database, shared with the
    OS page cache and given back under pressure)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("RssAnon", "RssFile"):
            out[name.lower()] = round(int(value.split()[0]) / 1024, 1)
    return out


class StepClock:
    """Wall and thread CPU of the engine's keyword and vector searches (wrapped on its storage,
    bench-side only): the recall's `timings_ms` are wall time from the event loop, which on
    shared cores mixes the step's own cost with waiting for a core (and the GIL)."""

    # the engine's keyword step: keyword_step (hits and index state), fts_candidates before it
    STEPS = {"fts_candidates": ("keyword_step", "fts_candidates"), "vector_candidates": ("vector_candidates",)}

    def __init__(self, storage: Any) -> None:
        self.ms: dict[str, float] = {}
        for label, names in self.STEPS.items():
            name = next(name for name in names if hasattr(storage, name))
            setattr(storage, name, self._timed(label, getattr(storage, name)))

    def _timed(self, name: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ms[f"{name}_wall"] = self.ms.get(f"{name}_wall", 0.0) + (time.perf_counter() - wall) * 1000
                self.ms[f"{name}_cpu"] = self.ms.get(f"{name}_cpu", 0.0) + (time.thread_time() - cpu) * 1000
        return timed

    def take(self) -> dict[str, float]:
        out, self.ms = self.ms, {}
        return out


CLOCKED = {"fts_cpu": "fts_candidates_cpu", "fts_search": "fts_candidates_wall",
           "vector_cpu": "vector_candidates_cpu", "vector_search": "vector_candidates_wall"}


def anchors(path: Path, recalls: list[tuple[str, list[str], np.ndarray]], k: int) -> list[tuple[float, float, int]]:
    """(best-of-5 ms, from-memory ms, visible count) of the numpy anchor for each recall, in a
    pass of their own after the recalls: the anchor copies each viewer's visible vectors (983 MB
    for the busy channel at 1M) and holds all the world's vectors (3 GB at 1M), which between
    timed recalls evicted and crowded the recalls' own memory (issue 12, round 6)."""
    conn = db.connect(path, migrate_schema=False)
    try:
        matrix, by_key = load_vectors(conn)
    finally:
        conn.close()
    out = []
    for _, keys, qvec in recalls:
        idx = np.concatenate([by_key.get(key, np.zeros(0, dtype=np.int64)) for key in keys]).astype(np.int64)
        visible = np.ascontiguousarray(matrix[idx])
        out.append((numpy_anchor(visible, qvec, k), numpy_anchor_cold(visible, qvec, k), len(idx)))
        del visible
    return out


def _key_sizes(conn: Any) -> list[tuple[str, int]]:
    return [(str(key), int(n)) for key, n in conn.execute(
        "SELECT vis_key, count(*) AS n FROM memories WHERE embedded = 1 AND archived_at IS NULL "
        "GROUP BY vis_key ORDER BY n DESC")]


async def held_keys(engine: Engine) -> str:
    """Which keys the vector cache holds against its budget (MUNINN_VECTOR_CACHE_MB): the budget and
    the bytes used, and of the 5 largest keys which are held and which are searched in the database."""
    cache = engine.vector_cache
    sizes = await engine.read(_key_sizes)
    held, partly = set(cache.cached_keys()), set(cache.partial_keys())
    top = ", ".join(f"{key} {n:,} {'held' if key in held else 'partly' if key in partly else 'NOT held'}"
                    for key, n in sizes[:5])
    return (f"budget {cache.budget_bytes / 2**20:.0f} MiB ({cache.budget_bytes:,} bytes), used {cache.nbytes / 2**20:.1f} MiB; "
            f"held {len(held)} of {len(sizes)} keys ({sum(n for key, n in sizes if key in held):,} of "
            f"{sum(n for _, n in sizes):,} vectors), {len(partly)} partly ({sum(n for key, n in sizes if key in partly):,} "
            f"vectors); largest: {top}")


async def measure_classes(path: Path, shape: SkewShape, per_class: int, warm: int = 10, talk: bool = True) -> dict:
    """Per viewer class: the product's recall (query vector given, so no embedding call), its
    steps (wall, and thread CPU of the keyword and vector searches), and the numpy anchor over
    exactly that viewer's visible vectors, in one run: the recalls first, the anchors in a pass
    of their own once the engine is closed (`anchors`).
    `talk`: the busy channel stores a new memory (text and vector) before every recall, untimed,
    as a live community does: the vector cache has changes to apply, the keyword index and the
    readers' pages change (without it only the recalls' own touches write)."""
    world = SkewWorld(shape, seed=99)
    chatter = SkewWorld(shape, seed=7_777)
    timed: dict[str, list[dict[str, float]]] = {kind: [] for kind in VIEWER_CLASSES}
    recalls: list[tuple[str, list[str], np.ndarray]] = []
    async with Engine(bench_settings(path)) as engine:
        info = await engine.write(vectors.index_info)
        started = time.perf_counter()
        warm_keys = await engine.warmed()  # a running bot is warm: measure recalls after the start-up load
        print(f"  vector cache warm: {warm_keys} keys, {engine.vector_cache.nbytes / 1e6:.0f} MB, "
              f"waited {time.perf_counter() - started:.2f} s, rss {rss_mb()}", flush=True)
        print(f"  {await held_keys(engine)}", flush=True)
        clock = StepClock(engine.storage)
        k = engine.settings.recall_limit * 3
        for kind in VIEWER_CLASSES:
            for i in range(per_class + warm):
                viewer = world.viewer_of(kind)
                text, qvec = world.query()
                if talk:
                    await engine.write(said_in_busy_channel, info, chatter)
                clock.take()
                result = await engine.recall(text, viewer, query_vector=qvec.tolist())
                steps = clock.take()
                if i < warm:
                    continue
                t = result.timings_ms
                timed[kind].append({**{step: t[step] for step in ("fts", "vector", "fuse_graph_touch", "total")},
                                    **{name: steps.get(source, 0.0) for name, source in CLOCKED.items()}})
                recalls.append((kind, await engine.read(visible_keys, viewer), qvec))
            print(f"  {kind:>12} (load {os.getloadavg()[0]:.1f}): total "
                  f"{summary([r['total'] for r in timed[kind]])['median']:.2f} / "
                  f"{summary([r['total'] for r in timed[kind]])['p95']:.2f} ms", flush=True)
        rss = rss_mb()
        cache_mb = engine.vector_cache.nbytes / 2**20
        print(f"  after the recalls: {await held_keys(engine)}", flush=True)
    print(f"  rss after the recalls {rss}, vector cache {cache_mb:.1f} MB ({engine.vector_cache.form})", flush=True)
    out: dict = {}
    measured = anchors(path, recalls, k)
    for kind in VIEWER_CLASSES:
        rows = timed[kind]
        mine = [anchor for (of, _, _), anchor in zip(recalls, measured, strict=True) if of == kind]
        steps = {name: [row[name] for row in rows] for name in rows[0]}
        steps["numpy"] = [best for best, _, _ in mine]
        steps["numpy_cold"] = [cold for _, cold, _ in mine]
        steps["visible"] = [float(count) for _, _, count in mine]
        steps["ratio"] = [row["vector"] / best if best > 0 else float("nan")
                          for row, (best, _, _) in zip(rows, mine, strict=True)]
        steps["ratio_cold"] = [row["vector"] / cold if cold > 0 else float("nan")
                               for row, (_, cold, _) in zip(rows, mine, strict=True)]
        out[kind] = {name: summary(values) for name, values in steps.items()}
        print(f"  {kind:>12}: total {out[kind]['total']['median']:.2f} / {out[kind]['total']['p95']:.2f} ms, "
              f"vector {out[kind]['vector']['median']:.3f} / {out[kind]['vector']['p95']:.2f} ms (search cpu "
              f"{out[kind]['vector_cpu']['median']:.2f} / {out[kind]['vector_cpu']['p95']:.2f}) = "
              f"{out[kind]['ratio']['median']:.1f}x numpy ({out[kind]['ratio_cold']['median']:.1f}x from memory), "
              f"fts {out[kind]['fts']['median']:.2f} / {out[kind]['fts']['p95']:.2f} ms (search cpu "
              f"{out[kind]['fts_cpu']['median']:.2f} / {out[kind]['fts_cpu']['p95']:.2f}), "
              f"visible {out[kind]['visible']['median']:.0f}", flush=True)
    return out


async def measure_cold(path: Path, shape: SkewShape, per_class: int = 8) -> dict:
    """The first recalls after a restart, per class: a fresh engine (its start-up warm of the
    vector cache running beside them, as in the bot) answers `per_class` recalls of that class
    at once, one after the other. The OS page cache stays warm (a process restart)."""
    world = SkewWorld(shape, seed=4242)
    out: dict = {}
    for kind in VIEWER_CLASSES:
        totals: list[float] = []
        async with Engine(bench_settings(path)) as engine:
            for _ in range(per_class):
                text, qvec = world.query()
                result = await engine.recall(text, world.viewer_of(kind), query_vector=qvec.tolist())
                totals.append(result.timings_ms["total"])
        out[kind] = {"total": summary(totals), "first_ms": round(totals[0], 2)}
        print(f"  cold {kind:>12}: total {out[kind]['total']['median']:.2f} / {out[kind]['total']['p95']:.2f} ms, "
              f"first {out[kind]['first_ms']:.2f} ms", flush=True)
    return out


def forget_word_counts(package: str = "bot") -> None:
    """Drop the keyword step's word counts (`keywords._counts`, PostgreSQL's `keywords._counts`): they
    live in the module, keyed by database, for 600 s, so they outlive an Engine, and a measured
    run after another would reuse every count the earlier one made. `package`: bot, or an A/B's
    copy of another commit (bench.recall_cpu's bot_base)."""
    forget = getattr(memory_module(package, "fts"), "forget_counts", None)
    if forget is not None:
        forget(None)
    keywords = sys.modules.get(f"{package}.memory.postgres.keywords")   # not imported: nothing counted there
    if keywords is not None:
        keywords.forget_counts()


async def before_a_burst(engine: Engine, world: "World", chatter: "SkewWorld", count: int, messages: bool = True
                         ) -> tuple[vectors.IndexInfo, list[tuple[tuple[str, list[float]] | None, str, list[float], Viewer]]]:
    """An engine as a running bot's before a burst of recalls: warm, 20 recalls made, the word
    counts forgotten (forget_word_counts); and `count` recalls planned before the clock starts,
    each (the busy channel's message or None, query, query vector, viewer): making them is the
    benchmark's work, not the product's (~0.3 ms a recall on the event loop's thread, holding the GIL)."""
    info = await engine.write(vectors.index_info)
    await engine.warmed()
    for _ in range(20):
        text, qvec = world.query()
        await engine.recall(text, world.viewer(), query_vector=qvec.tolist())
    forget_word_counts()
    return info, [(busy_channel_message(chatter, info.dim) if messages else None, *query_of(world), world.viewer())
                  for _ in range(count)]


async def recall_in_turn(engine: Engine, gate: asyncio.Semaphore, info: vectors.IndexInfo, chatter: "SkewWorld",
                         totals: list[float], said: tuple[str, list[float]] | None, text: str, qvec: list[float],
                         viewer: Viewer) -> None:
    """One planned recall (before_a_burst) once `gate` lets it: the busy channel's message stored
    first (untimed), then the recall, its ms appended to `totals`."""
    async with gate:
        if said is not None:
            await engine.write(said_in_busy_channel, info, chatter, said)
        t = time.perf_counter()
        await engine.recall(text, viewer, query_vector=qvec)
        totals.append((time.perf_counter() - t) * 1000)


async def measure_concurrency(path: Path, shape: SkewShape, concurrency: int = 20, burst: int = 200,
                              readers: int | None = None, messages: bool = True) -> dict:
    """Recall latency (query vectors given) of the same mix of viewers one at a time and
    `concurrency` at a time, and the CPU time a recall costs (all threads of this process).
    Fair to both levels: one at a time runs before AND after the `concurrency` level (x1 pools
    both runs; `x1_p95_runs` shows each), every run has queries of its own (another seed: the
    same queries would hit what the earlier run cached) and starts with the word counts forgotten
    (`forget_word_counts`), on a fresh engine. `messages`: the busy channel stores a new memory
    before each recall (untimed, in the recall's turn: with `concurrency` in flight the writer
    works beside the other recalls, as in the bot, which records every message through it); its
    CPU counts in the CPU per recall. Queries, viewers and messages are made before the clock
    starts (since round 8: ~0.3 ms a recall on the event loop's thread, the benchmark's work).
    The floor of the p95 ratio: with `concurrency` recalls in flight on C cores, the last of
    them waits for about concurrency / C recalls' CPU time, so p95 >= concurrency x CPU per
    recall / C, however the work is scheduled; over the single recall's p95 that is the best
    ratio this machine allows."""
    out: dict = {}
    env = {"MUNINN_DB_READERS": str(readers)} if readers else {}
    chatter = SkewWorld(shape, seed=7_777)
    runs: dict[int, list[dict]] = {}
    for turn, level in enumerate((1, concurrency, 1)):
        world = make_world(shape, seed=321 + turn)
        async with Engine(bench_settings(path, **env)) as engine:
            info, planned = await before_a_burst(engine, world, chatter, burst, messages)
            gate = asyncio.Semaphore(level)
            totals: list[float] = []
            t, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(recall_in_turn(engine, gate, info, chatter, totals, *plan) for plan in planned))
            wall, used = time.perf_counter() - t, time.process_time() - cpu
            runs.setdefault(level, []).append({"totals": totals, "wall": wall, "cpu": used})
    for level, measured in runs.items():
        totals = [ms for run in measured for ms in run["totals"]]
        wall, used = sum(run["wall"] for run in measured), sum(run["cpu"] for run in measured)
        # cores_used: the process's CPU over the wall time (2 = both cores busy with this benchmark)
        out[f"x{level}"] = {"latency_ms": summary(totals), "recalls_per_s": round(len(totals) / wall, 1),
                            "cpu_ms_per_recall": round(used * 1000 / len(totals), 2), "cores_used": round(used / wall, 2)}
    out["x1_p95_runs"] = [summary(run["totals"])["p95"] for run in runs[1]]
    cores = len(os.sched_getaffinity(0))
    out["cores"], out["readers"], out["messages"] = cores, readers, messages
    out["p95_ratio"] = round(out[f"x{concurrency}"]["latency_ms"]["p95"] / out["x1"]["latency_ms"]["p95"], 2)
    out["p95_ratio_floor"] = round(concurrency * out["x1"]["cpu_ms_per_recall"] / cores
                                   / out["x1"]["latency_ms"]["p95"], 2)
    return out


async def measure_fact_writes(path: Path, shape: SkewShape, per_kind: int = 30) -> dict:
    """The DB side of storing one extracted fact (`fact_writes.plan_updates`, then
    `fact_writes.write_facts`: duplicate check, update candidates, insert, semantic links), for a room
    fact in the busy channel and a personal fact of a heavy user; alternately with the write
    reusing the planning search and searching again (`*_search_again`). Adds memories: run on a copy."""
    world = SkewWorld(shape, seed=555)
    out: dict = {}
    async with Engine(bench_settings(path)) as engine:
        # After the start-up warm of the vector cache, as the class recalls: until the busy key is
        # loaded its facts are searched in vec0 (~0.1-0.5 s each at 100k), then the loader thread
        # (thousands of keys, seconds at 100k) competes with every fact for the GIL and the cores:
        # that, not the write, was the busy room's p95 (78 ms against a 6.5 ms median, issue 12).
        await engine.warmed()
        # the same owners write every fact: a cap no run reaches keeps them inserts, with its count measured
        st = engine.settings.replace(learn_per_day=1_000_000)
        kinds = {"busy_room": lambda: records.NewMemory(world.sentence(), "room", owner_id=1001, channel_id=100_000,
                                                      guild_id=1),
                 "personal_heavy": lambda: records.NewMemory(world.sentence(), "personal", owner_id=1000, guild_id=1)}
        for kind, make in kinds.items():
            timings: dict[bool, tuple[list[float], list[float]]] = {True: ([], []), False: ([], [])}
            for i in range(2 * per_kind + 3):
                reuse = i % 2 == 0
                memory = make()
                vec = world.query()[1].tolist()
                t0 = time.perf_counter()
                planned = await engine.read(fact_writes.plan_updates, st.embed_model, [memory], [vec], st, ["someone"])
                t1 = time.perf_counter()
                if isinstance(planned, tuple):  # the planning search, reused by the write when nothing changed
                    await engine.write(fact_writes.write_facts, [memory], [vec], [None], settings=st, now=NOW,
                                       searched=planned[1] if reuse else (), searched_mark=planned[2],
                                       **({"taught": planned[3]} if len(planned) > 3 else {}))
                else:  # the code before issue 12
                    await engine.write(fact_writes.write_facts, [memory], [vec], [None], settings=st, now=NOW)
                t2 = time.perf_counter()
                if i >= 3:
                    timings[reuse][0].append((t1 - t0) * 1000)
                    timings[reuse][1].append((t2 - t1) * 1000)
            for reuse, (plan, write) in timings.items():
                name = kind if reuse else f"{kind}_search_again"
                out[name] = {"plan_ms": summary(plan), "write_ms": summary(write),
                             "total_ms": summary([a + b for a, b in zip(plan, write, strict=True)])}
                print(f"  fact {name}: plan {out[name]['plan_ms']['median']:.2f} + write "
                      f"{out[name]['write_ms']['median']:.2f} ms (median); total p95 "
                      f"{out[name]['total_ms']['p95']:.2f} ms", flush=True)
    return out


async def measure_maintenance(path: Path, shape: SkewShape, added: int = 1000) -> dict:
    """`run_maintenance` from scratch (watermarks reset; decay off so the world stays; no LLM),
    recall latency while it runs against idle, then the incremental re-run after `added` new
    memories. Changes the database: run on a copy."""
    from bot.lifecycle import maintenance
    world = SkewWorld(shape, seed=777)
    settings = load_settings({"MUNINN_DB_PATH": str(path), "OLLAMA_URL": "", "OLLAMA_EMBED_MODEL": EMBED_MODEL,
                              "MUNINN_ARCHIVE_RETENTION": "0"})
    conn = db.connect(path)
    conn.execute("DELETE FROM meta WHERE key LIKE 'maintenance.%'")
    conn.close()
    out: dict = {}
    async with Engine(settings) as engine:
        async def recall_once() -> float:
            text, qvec = world.query()
            t = time.perf_counter()
            await engine.recall(text, world.viewer(), query_vector=qvec.tolist())
            return (time.perf_counter() - t) * 1000
        # idle = a warm engine, as the recalls during maintenance meet it: measured while the
        # start-up warm still ran, idle took cold keys and shared the cores with the warm, and its
        # p95 (55 ms at 100k against ~7) made "during / idle" look better than it is (round 8)
        await engine.warmed()
        for _ in range(20):
            await recall_once()
        idle = [await recall_once() for _ in range(200)]
        task = asyncio.create_task(maintenance.run_maintenance(engine, use_llm=False))
        during: list[float] = []
        while not task.done():
            during.append(await recall_once())
            await asyncio.sleep(0.01)
        report = await task
        out["first_run_s"] = round(report.seconds, 2)
        out["recall_idle_ms"], out["recall_during_ms"] = summary(idle), summary(during or [float("nan")])
        out["during_p95_ratio"] = round(out["recall_during_ms"]["p95"] / out["recall_idle_ms"]["p95"], 2)
        info = await engine.write(vectors.index_info)
        gen = world.memories()
        rows = [next(gen) for _ in range(added)]

        def add(conn) -> None:
            store.insert_many(conn, [m for m, _ in rows], base_stability_days=7, vector_info=info,
                              vectors_=[v.tolist() for _, v in rows], now=NOW)
        await engine.write(add)
        report = await maintenance.run_maintenance(engine, use_llm=False)
        out["incremental_run_s"] = round(report.seconds, 2)
        out["incremental_added"] = added
    print(f"  maintenance: first {out['first_run_s']} s, incremental ({added} new) {out['incremental_run_s']} s, "
          f"recall p95 during {out['recall_during_ms']['p95']:.1f} ms vs idle {out['recall_idle_ms']['p95']:.1f}",
          flush=True)
    return out


def memory_rows(path: Path, processes: str) -> dict:
    """Resident memory with one process, then with each count of `processes` (e.g. "1,4") above one."""
    rows: dict = {"memory": memory_probe(path)}
    print(f"  memory: {rows['memory']}", flush=True)
    for count in [int(n) for n in processes.split(",") if n.strip() and int(n) > 1]:
        rows[f"memory_x{count}"] = probe = memory_probe(path, count)
        print(f"  memory, {count} processes: each "
              f"{[(one['all_keys_loaded'], one.get('cache_mb')) for one in probe['each']]}; total "
              f"{probe['total_all_keys_loaded']}, caches {probe['total_cache_mb']} MB; "
              f"measured together, each {[one['together'] for one in probe['each']]}, total {probe['total_together']}",
              flush=True)
    return rows


def pss_mb() -> dict:
    """Resident (RSS) and proportional (PSS) memory in MB from /proc/self/smaps_rollup: RSS counts
    every page a process maps in full, also those shared with other processes (a mapped file:
    the database, the vector snapshot); PSS counts a shared page divided by the number of
    processes that map it, so the PSS of processes adds up to the machine's memory they take."""
    out = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("Rss", "Pss", "Pss_Anon", "Pss_File"):
            out[name.lower()] = round(int(value.split()[0]) / 1024, 1)
    return out


def memory_probe(path: Path, processes: int = 1) -> dict:
    """Resident memory of a process that serves recalls from `path` the way the bot does: after
    recalls of every class, and after every key's vectors were loaded (a long-running bot).
    With `processes` > 1, that many such processes on the one file at once (shards of one bot
    on one machine): each one's figures, and their sum. Once all are loaded, all measure RSS
    and PSS at the same moment (`together`: a process that ended would change the others' PSS)."""
    import subprocess
    import sys
    code = (
        "import asyncio, json, sys\n"
        "from pathlib import Path\n"
        "from bench import speed\n"
        "asyncio.run(speed._probe(Path(sys.argv[1])))\n")
    started = [subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, cwd=Path(__file__).resolve().parent.parent) for _ in range(processes)]
    each = []
    for process in started:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            process.wait()
            raise RuntimeError(f"memory probe process failed ({process.returncode})")
        each.append(json.loads(line))
    for process in started:  # all loaded: every one measures now
        assert process.stdin is not None
        process.stdin.write("measure\n")
        process.stdin.flush()
    for one, process in zip(each, started, strict=True):
        out, _ = process.communicate()
        if process.returncode:
            raise RuntimeError(f"memory probe process failed ({process.returncode})")
        one["together"] = json.loads(out.strip().splitlines()[-1])
    if processes == 1:
        return each[0]
    loaded = [one["all_keys_loaded"] for one in each]
    together = [one["together"] for one in each]
    return {"processes": processes, "each": each,
            "total_all_keys_loaded": {name: round(sum(one[name] for one in loaded), 1) for name in loaded[0]},
            "total_together": {name: round(sum(one[name] for one in together), 1) for name in together[0]},
            "total_cache_mb": round(sum(one.get("cache_mb", 0.0) for one in each), 1)}


async def _probe(path: Path) -> None:
    """One probe process: prints its figures once every key is loaded, then waits for a line on
    stdin and prints RSS and PSS measured then (all processes at once), and exits."""
    import sys
    out: dict = {"start": rss_mb()}
    shape = SkewShape(0)
    world = SkewWorld(shape, seed=5)
    async with Engine(bench_settings(path)) as engine:
        out["engine_open"] = rss_mb()
        for kind in VIEWER_CLASSES:
            for _ in range(10):
                text, qvec = world.query()
                await engine.recall(text, world.viewer_of(kind), query_vector=qvec.tolist(), touch=False)
        out["after_class_recalls"] = rss_mb()
        cache = getattr(engine, "vector_cache", None)
        if cache is not None:
            # the start-up warm loads every key that fits, big ones too (a recall defers a big
            # key's load to the background: measured before it ends, the busy key was missing)
            out["warmed_keys"] = await engine.warmed()
            keys = await engine.write(lambda conn: [r[0] for r in conn.execute("SELECT DISTINCT vis_key FROM memories")])
            _, qvec = world.query()
            for start in range(0, len(keys), 200):
                await engine.read(lambda conn, ks=keys[start:start + 200]: vectors.knn(
                    conn, vectors.index_info(conn), qvec.tolist(), ks, 1))
            for _ in range(1200):  # big keys a recall handed to the background loader: their loads end
                if not cache._loading and not cache._sharing:
                    break
                await asyncio.sleep(0.1)
            out["all_keys_loaded"] = rss_mb()
            out["cache_mb"] = round(cache.nbytes / 2**20, 1)
            out["form"] = cache.form
            out["snapshot_generation"] = cache._mapped_generation
            out["mapped_keys"] = len(cache._from_snapshot)
        print(json.dumps(out), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        print(json.dumps(rss_mb() | pss_mb()), flush=True)


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
    if args.shape == "uniform":
        return await run_uniform(args)
    return await run_skew(args)


async def run_skew(args) -> list[dict]:
    """The realistic shape: per viewer class, fact writes, maintenance, concurrency, memory.
    Worlds are built once and kept (bench/results/*.db is git-ignored); everything that writes
    runs on a scratch copy."""
    import shutil
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        shape = SkewShape(size)
        path = world_path(args, size)
        row: dict = {"size": size, "shape": "skew"}
        if not path.exists() or args.rebuild:
            for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                p.unlink(missing_ok=True)
            row["build"] = await build(path, shape)
            print(f"built {path} in {row['build']['build_s']} s", flush=True)
        row["db_mb"] = round(db_bytes(path) / 1e6, 1)
        print(f"size {size}:", flush=True)
        if args.forms:
            row["forms"] = await measure_forms(path, shape, args)
            rows.append(row)
            continue
        if not args.concurrency_only and not args.memory_only:
            row["cold"] = await measure_cold(path, shape)
            row["classes"] = await measure_classes(path, shape, args.viewers, talk=args.talk)
        row["load"] = os.getloadavg()
        if args.classes_only:
            rows.append(row)
            continue
        if args.memory_only:
            args.concurrency_only = False
            row.update(memory_rows(path, args.processes))
            rows.append(row)
            continue
        if args.memory and not args.concurrency_only:
            row.update(memory_rows(path, args.processes))
        scratch = Path(args.workdir) / f"scratch-{size}.db"
        for p in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
            p.unlink(missing_ok=True)
        shutil.copy(path, scratch)
        load = os.getloadavg()[0]
        row["concurrency"] = c = await measure_concurrency(scratch, shape, messages=args.talk)
        c["load"] = [round(load, 2), round(os.getloadavg()[0], 2)]
        print(f"  20 concurrent: p95 {c['x20']['latency_ms']['p95']:.1f} ms vs one at a time "
              f"{c['x1']['latency_ms']['p95']:.1f} ms (runs before / after {c['x1_p95_runs'][0]:.1f} / "
              f"{c['x1_p95_runs'][1]:.1f}; {c['p95_ratio']}x; floor on "
              f"{c['cores']} cores {c['p95_ratio_floor']}x); CPU per recall {c['x1']['cpu_ms_per_recall']} / "
              f"{c['x20']['cpu_ms_per_recall']} ms, cores used {c['x1']['cores_used']} / {c['x20']['cores_used']}; "
              f"load {c['load'][0]} -> {c['load'][1]}", flush=True)
        if not args.concurrency_only:
            row["fact_writes"] = await measure_fact_writes(scratch, shape)
        if args.maintenance and not args.concurrency_only:
            row["maintenance"] = await measure_maintenance(scratch, shape)
        for p in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
            p.unlink(missing_ok=True)
        rows.append(row)
    return rows


async def measure_forms(path: Path, shape: SkewShape, args) -> dict:
    """The per-class recalls with each MUNINN_VECTOR_FORM in turn, `--rounds` times, the order
    swapped every round (a shared machine's load drifts: compare within a run); per form and
    class, the p95 of every round and of all recalls, and the cache's bytes."""
    forms = [form.strip() for form in args.forms.split(",") if form.strip()]
    variable = getattr(args, "ab_variable", "MUNINN_VECTOR_FORM")  # --snapshots: MUNINN_VECTOR_SNAPSHOT
    got: dict = {form: {"rounds": []} for form in forms}
    before = os.environ.get(variable)
    try:
        for round_ in range(args.rounds):
            for form in forms if round_ % 2 == 0 else forms[::-1]:
                os.environ[variable] = form
                print(f"  {variable} {form}, round {round_ + 1} (load {os.getloadavg()[0]:.1f})", flush=True)
                got[form]["rounds"].append(await measure_classes(path, shape, args.viewers, talk=args.talk))
    finally:
        if before is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = before
    for form in forms:
        rounds = got[form]["rounds"]
        got[form]["p95"] = {kind: [r[kind]["total"]["p95"] for r in rounds] for kind in VIEWER_CLASSES}
        got[form]["median"] = {kind: [r[kind]["total"]["median"] for r in rounds] for kind in VIEWER_CLASSES}
    return got


def print_forms(rows: list[dict]) -> None:
    """The --forms table: per class, each form's p95 per round and the ratio of the means to the first form's."""
    for r in rows:
        forms = r.get("forms")
        if not forms:
            continue
        names = list(forms)
        print(f"\n| size | class | {' | '.join(f'{name} p95 per round' for name in names)} | "
              f"{' | '.join(f'{name} / {names[0]}' for name in names[1:])} |")
        print("|---|---|" + "---|" * (2 * len(names) - 1))
        for kind in VIEWER_CLASSES:
            means = [sum(forms[name]["p95"][kind]) / len(forms[name]["p95"][kind]) for name in names]
            cells = [", ".join(f"{p:.2f}" for p in forms[name]["p95"][kind]) for name in names]
            print(f"| {r['size']:,} | {kind} | {' | '.join(cells)} | "
                  f"{' | '.join(f'{mean / means[0]:.2f}x' for mean in means[1:])} |")


def print_skew(rows: list[dict]) -> None:
    print("\nrecall without the embedding call, ms (median / p95); vector = the vector step; x numpy = its "
          "median over numpy on the viewer's visible vectors")
    print("| size | class | visible | fts | vector | x numpy (from memory) | total | cold: first recalls after a restart |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        for kind, c in r.get("classes", {}).items():
            cold = r.get("cold", {}).get(kind)
            cold_cell = f"{cold['total']['median']:.2f} / {cold['total']['p95']:.2f}" if cold else ""
            from_memory = f" ({c['ratio_cold']['median']:.1f})" if "ratio_cold" in c else ""
            print(f"| {r['size']:,} | {kind} | {c['visible']['median']:,.0f} | {c['fts']['median']:.2f} / "
                  f"{c['fts']['p95']:.2f} | {c['vector']['median']:.2f} / {c['vector']['p95']:.2f} | "
                  f"{c['ratio']['median']:.1f}{from_memory} | **{c['total']['median']:.2f} / {c['total']['p95']:.2f}** | "
                  f"{cold_cell} |")
    for r in rows:
        line = f"size {r['size']:,}: db {r['db_mb']} MB"
        if "concurrency" in r:
            c = r["concurrency"]
            line += (f"; 20 concurrent recalls p95 {c['x20']['latency_ms']['p95']:.1f} ms vs single "
                     f"{c['x1']['latency_ms']['p95']:.1f} ({c['p95_ratio']}x)")
        for kind, f in r.get("fact_writes", {}).items():
            line += f"; fact {kind} {f['total_ms']['median']:.2f} / {f['total_ms']['p95']:.2f} ms"
        if "maintenance" in r:
            m = r["maintenance"]
            line += (f"; maintain {m['first_run_s']} s, incremental {m['incremental_run_s']} s, recall p95 during "
                     f"{m['during_p95_ratio']}x idle")
        if "memory" in r:
            line += f"; RSS {r['memory']}"
        print(line)


async def run_uniform(args) -> list[dict]:
    """Round 1's shape (many users with a few memories each, uniform viewers)."""
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        shape = Shape(size)
        path = workdir / f"speed-{size}-c{args.chunk_size}.db"
        row: dict = {"size": size, "chunk_size": args.chunk_size}
        fresh = not path.exists() or args.rebuild
        if fresh:
            for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                p.unlink(missing_ok=True)
            row["build"] = await build(path, shape, args.chunk_size)
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
    parser.add_argument("--shape", choices=("skew", "uniform"), default="skew",
                        help="skew: the realistic shape of issue 12 (default); uniform: round 1's")
    parser.add_argument("--viewers", type=int, default=120,
                        help="recalls per viewer class (uniform: in all); with 40 a class, p95 moved 4-9 ms between runs")
    parser.add_argument("--chunk-size", type=int, default=vectors.DEFAULT_CHUNK_SIZE)
    parser.add_argument("--workdir", default=str(RESULTS))
    parser.add_argument("--no-maintenance", dest="maintenance", action="store_false")
    parser.add_argument("--no-memory", dest="memory", action="store_false")
    parser.add_argument("--quiet-channel", dest="talk", action="store_false",
                        help="no new memory in the busy channel before each class or concurrent recall "
                             "(rounds 1-4's protocol)")
    parser.add_argument("--classes-only", action="store_true",
                        help="skew: only the cold and per-class recalls (no concurrency, facts, maintenance, memory)")
    parser.add_argument("--concurrency-only", action="store_true",
                        help="skew: only the 20 concurrent recalls (on a scratch copy)")
    parser.add_argument("--memory-only", action="store_true",
                        help="skew: only the resident memory of serving processes (see --processes)")
    parser.add_argument("--processes", default="1,4",
                        help="skew: the memory probe with these numbers of processes on one file at once")
    parser.add_argument("--forms", default="", metavar="float32,int8",
                        help="skew: only the per-class recalls, once per MUNINN_VECTOR_FORM in turn (see --rounds)")
    parser.add_argument("--snapshots", default="", metavar="off,auto",
                        help="skew: as --forms, with each MUNINN_VECTOR_SNAPSHOT in turn (private cache vs mapped snapshot)")
    parser.add_argument("--partial", default="", metavar="0,5000",
                        help="skew: as --forms, with each MUNINN_VECTOR_PARTIAL_MIN in turn (keys too big for the cache "
                             "scanned in the database vs held partially)")
    parser.add_argument("--rounds", type=int, default=2, help="with --forms: rounds, the order swapped each round")
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--no-writes", dest="writes", action="store_false",
                        help="skip the write and loop-lag measurements (they add memories to the database)")
    parser.add_argument("--label", default="speed", help="names the JSON and the kept worlds")
    parser.add_argument("--out", default=None, help="JSON file (default bench/results/<label>.json)")
    parser.add_argument("--database-url", default="", metavar="postgresql://...",
                        help="SQLite and PostgreSQL side by side (bench/pg_speed.py): recall per class, writer processes")
    parser.add_argument("--writes-per-process", type=int, default=150, help="with --database-url: facts per writer")
    parser.add_argument("--embed-latency-ms", type=float, default=None, metavar="MS",
                        help="with --database-url: the hash embed server answers this late (default "
                             "pg_speed.EMBED_LATENCY_MS, a real model's time; 0: at once, CPU-bound)")
    args = parser.parse_args(argv)
    if args.snapshots:
        args.forms, args.ab_variable = args.snapshots, "MUNINN_VECTOR_SNAPSHOT"
    if args.partial:
        args.forms, args.ab_variable = args.partial, "MUNINN_VECTOR_PARTIAL_MIN"
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    if args.database_url:
        from .pg_speed import print_pg, run_pg
        rows = asyncio.run(run_pg(args))
        print("\n== summary")
        print_pg(rows)
    else:
        rows = asyncio.run(run(args))
        print("\n== summary")
        (print_table if args.shape == "uniform" else print_skew)(rows)
        print_forms(rows)
    out = Path(args.out) if args.out else RESULTS / f"{args.label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
