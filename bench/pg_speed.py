"""SQLite and PostgreSQL side by side (`python -m bench.speed --database-url postgresql://...`).

Per size: the realistic world of bench/speed.py (built once as SQLite, kept in
bench/results/), copied into its own PostgreSQL database (`<db>_bench_<size>` on the
server of --database-url, kept too) with `muninn migrate`'s copy; then, in one run:
  - recall without the embedding call (query vector given) per viewer class, on the same
    viewers and queries, through the product's `Engine.recall` on each backend;
  - facts stored per second by 1 and by 4 writer PROCESSES, each with its own engine
    (`fact_store.store_facts`, as the bot stores an extracted fact: the embedding through the
    bench's hash embed server, the duplicate/update check, the write with its links), on a
    scratch copy of each world, in two modes: `own` keys (each process writes personal facts
    of its own user: writers never meet) and `shared` keys (every process writes into the
    busy channel and about the same three users, as several bot processes serving one busy
    community: the per-key fact locks and the row locks between writers are exercised).
    The embed server answers each embedding EMBED_LATENCY_MS late (`--embed-latency-ms`).
Prints a table; ratios measured in one run, no absolute asserts.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.postgres.copy import DONE_KEY, copy_database
from bot.memory.storage import storage_of
from bot.settings import load_settings

from .embed_server import EmbedServerProcess
from .world import EMBED_MODEL, VIEWER_CLASSES, SkewShape, SkewWorld, build, said_in_busy_channel, summary, world_path

WRITERS = (1, 4)
WRITER_MODES = ("own", "shared")
SHARED_USERS = (1000, 1001, 1002)  # the busy channel's busiest people (SkewWorld: user 0.. + 1000)
BUSY_CHANNEL = 100_000              # SkewWorld's busy channel (in guild 1)
# What one embedding call of a fact costs a bot on a real Ollama: nomic-embed-text answers a
# sentence in ~10-20 ms on a GPU host and 30-50 ms on a CPU one (the model's time, on its own
# host), during which a writer holds no lock and uses no CPU. The hash server answers in ~2 ms of
# this machine's CPU, so without the wait 4 writers and the server saturate 2 cores and the
# ratio measures the CPU, not the database path: 20 ms, the low end, favours the database less.
EMBED_LATENCY_MS = 20.0


def database_url(server_url: str, name: str) -> str:
    parsed = urlparse(server_url)
    return urlunparse(parsed._replace(path=f"/{name}"))


def create_database(server_url: str, name: str, template: str | None = None) -> str:
    """A new database on the server of `server_url` (dropped first when it exists)."""
    import psycopg
    from psycopg import sql

    try:
        conn = psycopg.connect(server_url, autocommit=True)
    except psycopg.OperationalError:  # the URL's own database may not exist: the server's maintenance one
        conn = psycopg.connect(database_url(server_url, "postgres"), autocommit=True)
    with conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
        conn.execute(query)
    return database_url(server_url, name)


def copied(url: str) -> bool:
    import psycopg
    try:
        with psycopg.connect(url) as conn:
            return conn.execute("SELECT count(*) FROM meta WHERE key = %s", (DONE_KEY,)).fetchone()[0] == 1
    except psycopg.Error:
        return False


def settings_for(path: Path, database_url: str = "", ollama_url: str = "") -> Any:
    # MUNINN_VECTOR_* from the environment, as bench.world's bench_settings (the cache's form, budget, codes)
    chosen = {key: value for key, value in os.environ.items() if key.startswith("MUNINN_VECTOR_")}
    return load_settings({"MUNINN_DB_PATH": str(path), "MUNINN_DATABASE_URL": database_url, "OLLAMA_URL": ollama_url,
                          "OLLAMA_EMBED_MODEL": EMBED_MODEL, "OLLAMA_COOLDOWN": "0", "OLLAMA_EMBED_TIMEOUT": "30",
                          "MUNINN_MAINTENANCE_HOURS": "0", "MUNINN_LEARN_PER_DAY": "1000000", **chosen})


async def measure_recall(settings: Any, shape: SkewShape, per_class: int, warm: int = 10,
                         embed_delay_ms: float = 0.0) -> dict:
    """Per viewer class: Engine.recall with the query vector given, touching what it recalls as
    the bot does (a write per recall: on PostgreSQL a round trip and a commit); the same viewers
    and queries for every backend (a fixed seed). The busy channel talks before every recall, as
    in bench.speed (`talk`): the vector cache applies the change log (on PostgreSQL a round trip
    of its own), the keyword index and pages change.

    `embed_delay_ms` > 0: the vector is not given up front but known only that long after the
    recall starts, as the bot's embedding arriving from Ollama (`late_embedding`): the recall
    runs its own embedding task, so the keyword step overlaps the embedding instead of the
    vector search. `total` then includes the wait; `after_vector` is the part after the vector came."""
    world, chatter = SkewWorld(shape, seed=99), SkewWorld(shape, seed=7_777)
    out: dict = {}
    async with Engine(settings) as engine:
        await engine.warmed()
        info = await engine.write(lambda conn: storage_of(conn).index_info(conn))
        pending: list[list[float]] = []
        if embed_delay_ms > 0:
            late_embedding(engine, pending, embed_delay_ms)
        for kind in VIEWER_CLASSES:
            steps: dict[str, list[float]] = {s: [] for s in ("fts", "vector", "total", "after_vector")}
            for i in range(per_class + warm):
                viewer = world.viewer_of(kind)
                text, qvec = world.query()
                await engine.write(said_in_busy_channel, info, chatter)
                if embed_delay_ms > 0:
                    pending[:] = [qvec.tolist()]
                    result = await engine.recall(text, viewer)
                else:
                    result = await engine.recall(text, viewer, query_vector=qvec.tolist())
                if i >= warm:
                    took = dict(result.timings_ms)
                    took["after_vector"] = took["total"] - embed_delay_ms
                    for step in steps:
                        steps[step].append(took[step])
            out[kind] = {name: summary(values) for name, values in steps.items()}
    return out


def late_embedding(engine: Engine, pending: list[list[float]], delay_ms: float) -> None:
    """The engine's embedding call answered `delay_ms` after it was made, with the vector in
    `pending` (the world's query vector): a local Ollama's embedding of a question, without the
    HTTP and the model's CPU on this machine (the time is the model host's, not ours)."""
    from bot.memory.recall.retrieval import VectorStatus

    async def embedded(query: str) -> tuple[list[float] | None, VectorStatus]:
        vector = pending[0]
        await asyncio.sleep(delay_ms / 1000)
        return vector, VectorStatus.OK
    engine._query_vector = embedded  # type: ignore[method-assign]


def writer_facts(mode: str, count: int, seed: int) -> list[Any]:
    """The facts one writer stores: `own`: personal facts of its own user; `shared`: alternately
    a fact of the busy channel and a personal fact of one of SHARED_USERS said there, the same
    keys for every writer (new sentences per seed: new facts, not reinforcements)."""
    from bot.lifecycle.facts import Fact

    world = SkewWorld(SkewShape(1000), seed=seed)
    if mode == "own":
        return [Fact(world.sentence(), "someone", "personal", 0.5, owner_id=1000 + seed, channel_id=100_001 + seed,
                     guild_id=1) for _ in range(count)]
    return [Fact(world.sentence(), "someone", "room", 0.5, owner_id=SHARED_USERS[i % 3], channel_id=BUSY_CHANNEL,
                 guild_id=1) if i % 2 == 0 else
            Fact(world.sentence(), "someone", "personal", 0.5, owner_id=SHARED_USERS[i // 2 % 3],
                 channel_id=BUSY_CHANNEL, guild_id=1)
            for i in range(count)]


def _writer(settings_env: dict, count: int, seed: int, ready: Any, results: Any, mode: str = "own") -> None:
    """One writer process: its own engine, warmed as the bot's is at its start (every key's
    vectors loaded: the busy channel's 30k at 100k), then `count` extracted facts
    (`writer_facts`) stored one at a time the way the bot stores them (`fact_store.store_facts`:
    embed, duplicate/update check, write, links), once every writer is ready (`ready`, a barrier).
    Without the warm each process's first fact in the busy channel loaded that key itself inside
    the timed run (1.69x for 4 shared-key writers at 100k, against 3.6x warm): a start-up cost of
    a process, not the rate of a running bot."""
    from bot.lifecycle import fact_store

    async def run() -> tuple[float, float]:
        facts = writer_facts(mode, count, seed)
        async with Engine(load_settings(settings_env)) as engine:
            await engine.warmed()
            await engine.remember(records.NewMemory("warm-up", "global", owner_id=1))
            await asyncio.to_thread(ready.wait)
            started = time.time()
            for fact in facts:
                await fact_store.store_facts(engine, [fact])
            return started, time.time()
    results.put(asyncio.run(run()))


def measure_writers(settings_env: dict, writers: int, per_writer: int, mode: str = "own") -> dict:
    """Facts stored per second by `writers` processes at once (total facts / wall time), timed
    from the moment all of them have warmed."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    ready = ctx.Barrier(writers)
    procs = [ctx.Process(target=_writer, args=(settings_env, per_writer, 10 + n, ready, results, mode))
             for n in range(writers)]
    for proc in procs:
        proc.start()
    spans = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    wall = max(end for _, end in spans) - min(start for start, _ in spans)
    return {"writers": writers, "facts": writers * per_writer, "wall_s": round(wall, 2),
            "facts_per_s": round(writers * per_writer / wall, 1)}


async def run_pg(args: Any) -> list[dict]:
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        shape = SkewShape(size)
        path = world_path(args, size)
        row: dict = {"size": size}
        if not path.exists() or args.rebuild:
            for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                p.unlink(missing_ok=True)
            row["build"] = await build(path, shape)
            print(f"built {path} in {row['build']['build_s']} s", flush=True)
        name = f"{urlparse(args.database_url).path.lstrip('/') or 'muninn'}_bench_{size}"
        url = database_url(args.database_url, name)
        if args.rebuild or not copied(url):
            create_database(args.database_url, name)
            report = copy_database(path, url, batch=5000)
            row["migrate_s"] = round(report.seconds, 1)
            print(f"  copied into {name} in {report.seconds:.1f} s: {report.line()}", flush=True)
        if getattr(args, "forms", ""):
            row["forms"] = await pg_forms(args, path, url, shape)
            rows.append(row)
            continue
        backends = {"sqlite": settings_for(path), "postgresql": settings_for(path, url)}
        row["recall"] = {}
        for backend, settings in backends.items():
            row["recall"][backend] = await measure_recall(settings, shape, args.viewers)
            print(f"  {backend:>10} recall p95 ms: " + ", ".join(
                f"{kind} {row['recall'][backend][kind]['total']['p95']:.1f}" for kind in VIEWER_CLASSES), flush=True)
        if args.writes:
            row["writes"] = measure_backend_writes(args, path, url, name, size)
        rows.append(row)
    return rows


async def pg_forms(args: Any, path: Path, url: str, shape: SkewShape) -> dict:
    """PostgreSQL's recall per class with each MUNINN_VECTOR_FORM in turn (`--forms`, `--rounds`,
    the order swapped every round): each form's p95 per round and class."""
    forms = [form.strip() for form in args.forms.split(",") if form.strip()]
    got: dict = {form: {kind: [] for kind in VIEWER_CLASSES} for form in forms}
    before = os.environ.get("MUNINN_VECTOR_FORM")
    try:
        for round_ in range(args.rounds):
            for form in forms if round_ % 2 == 0 else forms[::-1]:
                os.environ["MUNINN_VECTOR_FORM"] = form
                recall = await measure_recall(settings_for(path, url), shape, args.viewers)
                for kind in VIEWER_CLASSES:
                    got[form][kind].append(recall[kind]["total"]["p95"])
                print(f"  postgresql {form} round {round_ + 1} (load {os.getloadavg()[0]:.1f}) p95 ms: "
                      + ", ".join(f"{kind} {recall[kind]['total']['p95']:.1f}" for kind in VIEWER_CLASSES), flush=True)
    finally:
        if before is None:
            os.environ.pop("MUNINN_VECTOR_FORM", None)
        else:
            os.environ["MUNINN_VECTOR_FORM"] = before
    for kind in VIEWER_CLASSES:
        means = [sum(got[form][kind]) / len(got[form][kind]) for form in forms]
        print(f"  {kind}: " + " | ".join(f"{form} {', '.join(f'{p:.2f}' for p in got[form][kind])}" for form in forms)
              + " | " + ", ".join(f"{form}/{forms[0]} {mean / means[0]:.2f}x" for form, mean in zip(forms[1:], means[1:],
                                                                                             strict=True)), flush=True)
    return got


def measure_backend_writes(args: Any, path: Path, url: str, name: str, size: int) -> dict:
    scratch = Path(args.workdir) / f"scratch-writes-{size}.db"
    latency = EMBED_LATENCY_MS if getattr(args, "embed_latency_ms", None) is None else args.embed_latency_ms
    out: dict = {"embed_latency_ms": latency}
    with EmbedServerProcess("hash", dim=768, latency_ms=latency) as embed_url:
        for backend in ("sqlite", "postgresql"):
            out[backend] = {}
            for mode in WRITER_MODES:
                runs: dict = {}
                for writers in WRITERS:
                    for p in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
                        p.unlink(missing_ok=True)
                    shutil.copy(path, scratch)
                    target = create_database(args.database_url, f"{name}_scratch", template=name) \
                        if backend == "postgresql" else ""
                    # the same few people teach every fact: a learning cap no run reaches keeps them new
                    # memories (its count is measured)
                    env = {"MUNINN_DB_PATH": str(scratch), "MUNINN_DATABASE_URL": target, "OLLAMA_URL": embed_url,
                           "OLLAMA_EMBED_MODEL": EMBED_MODEL, "OLLAMA_COOLDOWN": "0", "OLLAMA_EMBED_TIMEOUT": "30",
                           "MUNINN_MAINTENANCE_HOURS": "0", "MUNINN_LEARN_PER_DAY": "1000000"}
                    result = measure_writers(env, writers, args.writes_per_process, mode=mode)
                    result["load"] = round(os.getloadavg()[0], 2)
                    runs[f"x{writers}"] = result
                    print(f"  {backend:>10} {mode:>6} keys, {writers} writer process(es): {result['facts_per_s']} facts/s "
                          f"(load {result['load']})", flush=True)
                runs["scaling"] = round(runs["x4"]["facts_per_s"] / runs["x1"]["facts_per_s"], 2)
                out[backend][mode] = runs
    for p in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
        p.unlink(missing_ok=True)
    return out


def print_pg(rows: list[dict]) -> None:
    print("\nrecall without the embedding call, ms (median / p95), same viewers and queries on both backends")
    print("| size | class | SQLite total | PostgreSQL total | PostgreSQL fts | PostgreSQL vector |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        for kind in VIEWER_CLASSES if "recall" in r else ():  # --forms rows printed as they ran
            s, p = r["recall"]["sqlite"][kind], r["recall"]["postgresql"][kind]
            print(f"| {r['size']:,} | {kind} | {s['total']['median']:.2f} / {s['total']['p95']:.2f} | "
                  f"**{p['total']['median']:.2f} / {p['total']['p95']:.2f}** | {p['fts']['median']:.2f} / "
                  f"{p['fts']['p95']:.2f} | {p['vector']['median']:.2f} / {p['vector']['p95']:.2f} |")
    if any("writes" in r for r in rows):
        latency = next((r["writes"].get("embed_latency_ms") for r in rows if "writes" in r), None)
        print(f"\nfacts stored per second (fact_store.store_facts, embedding by the hash server answering {latency} ms late), "
              "1 and 4 writer processes;"
              " own keys: each process its own user; shared: all in the busy channel and about the same 3 users")
        print("| size | backend | keys | 1 process | 4 processes | 4 / 1 |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            for backend, modes in r.get("writes", {}).items():
                if not isinstance(modes, dict):  # embed_latency_ms
                    continue
                for mode, w in modes.items():
                    print(f"| {r['size']:,} | {backend} | {mode} | {w['x1']['facts_per_s']} | {w['x4']['facts_per_s']} | "
                          f"**{w['scaling']}x** |")
    for r in rows:
        if "migrate_s" in r:
            print(f"size {r['size']:,}: `muninn migrate` copy {r['migrate_s']} s")
