"""Recall while ANOTHER PROCESS stores facts, against recall alone, on one database: what a live
bot's replies pay when extraction in a second shard, an import or a second bot writes meanwhile.

    python -m bench.overlap [--size 10000] [--rounds 4] [--recalls 40] [--database-url postgresql://...]

Per backend (one SQLite file: a scratch copy of bench/results/skew-SIZE-speed.db, built if
missing; with --database-url also one PostgreSQL database, the same world copied in once as
`<db>_overlap_<size>` and reused), two processes on the same database:
  - this one recalls as the bot does: Engine.recall with the query vector given (no embedding
    call), touching what it recalls (a write per recall, through its own writer connection);
  - a writer process stores facts as the bot stores extracted ones (fact_store.store_facts:
    the embedding from the bench's hash embed server, the duplicate/update check, the write
    with its links), one after another, but only while told to.
The two phases alternate in ONE run, `rounds` times: idle (the writer waits) and writing (it
stores facts), in alternating order, with the same viewers and queries in both phases of a
round (a seed per round). Printed: recall p50/p95 idle and while writing, their ratio, the
facts/s the writer managed meanwhile, and the load average (`uptime`) at each backend's end.
On a shared machine the ratio is the number to read, not the milliseconds.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bot.memory.engine import Engine
from bot.settings import load_settings

from .embed_server import EmbedServerProcess
from .world import EMBED_MODEL, SkewShape, SkewWorld, build, percentile

WARM_RECALLS = 10
WRITER_START_S = 60.0  # the writer opens its engine; then it is told when to write


def _env(path: Path, database_url: str, embed_url: str) -> dict[str, str]:
    # the same few people teach every fact: a learning cap no run reaches keeps them new memories (its count is measured)
    return {"MUNINN_DB_PATH": str(path), "MUNINN_DATABASE_URL": database_url, "OLLAMA_URL": embed_url,
            "OLLAMA_EMBED_MODEL": EMBED_MODEL, "OLLAMA_COOLDOWN": "0", "OLLAMA_EMBED_TIMEOUT": "30",
            "MUNINN_MAINTENANCE_HOURS": "0", "MUNINN_LEARN_PER_DAY": "1000000"}


def _writer(env: dict[str, str], seed: int, writing: Any, stop: Any, ready: Any, stored: Any) -> None:
    """The other process: its own engine; stores one new fact after another while `writing` is set."""
    from bot.lifecycle import fact_store
    from bot.lifecycle.facts import Fact

    async def run() -> None:
        world = SkewWorld(SkewShape(1000), seed=seed)
        async with Engine(load_settings(env), warm=False) as engine:
            ready.set()
            while not stop.is_set():
                if not writing.is_set():
                    await asyncio.sleep(0.005)
                    continue
                # Every other fact goes to the busy channel (SkewWorld's channel 100_000), whose
                # viewers the recalls ask as: their cache, FTS window and pages meet these writes.
                if stored.value % 2:
                    fact = Fact(world.sentence(), "someone", "personal", 0.5, owner_id=1000 + seed,
                                channel_id=100_001 + seed, guild_id=1)
                else:
                    fact = Fact(world.sentence(), "room", "room", 0.5, owner_id=1000 + seed,
                                channel_id=100_000, guild_id=1)
                await fact_store.store_facts(engine, [fact])
                with stored.get_lock():
                    stored.value += 1
    asyncio.run(run())


async def _recall_round(engine: Engine, shape: SkewShape, seed: int, count: int) -> tuple[list[float], list[float]]:
    """`count` recalls of a round's viewers and queries (the same for both phases: one seed):
    wall ms of each, and of its last step (fusion, graph and the touch: the write that meets
    the other process's)."""
    world = SkewWorld(shape, seed=seed)
    took, last_step = [], []
    for _ in range(count):
        viewer = world.viewer()
        text, vector = world.query()
        started = time.perf_counter()
        result = await engine.recall(text, viewer, query_vector=vector.tolist())
        took.append((time.perf_counter() - started) * 1000)
        last_step.append(result.timings_ms["fuse_graph_touch"])
    return took, last_step


def _wait_for_a_fact(stored: Any, before: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while stored.value == before and time.monotonic() < deadline:
        time.sleep(0.01)


async def measure(env: dict[str, str], shape: SkewShape, rounds: int, recalls: int) -> dict:
    ctx = multiprocessing.get_context("spawn")
    writing, stop, ready = ctx.Event(), ctx.Event(), ctx.Event()
    stored = ctx.Value("i", 0)
    writer = ctx.Process(target=_writer, args=(env, 77, writing, stop, ready, stored))
    writer.start()
    samples: dict[str, list[float]] = {"idle": [], "writing": []}
    touch_step: dict[str, list[float]] = {"idle": [], "writing": []}
    round_ratios: list[float] = []  # per round: p50 writing / p50 idle (a pair measured minutes apart at most)
    written, writing_s = 0, 0.0
    try:
        if not ready.wait(WRITER_START_S):
            raise RuntimeError("the writer process did not open its engine")
        async with Engine(load_settings(env)) as engine:
            await engine.warmed()
            await _recall_round(engine, shape, 1, WARM_RECALLS)
            for round_number in range(rounds):
                phases = ("idle", "writing") if round_number % 2 == 0 else ("writing", "idle")
                for phase in phases:
                    if phase == "writing":
                        before = stored.value
                        writing.set()
                        await asyncio.to_thread(_wait_for_a_fact, stored, before, 10.0)  # writing for real
                        before, started = stored.value, time.perf_counter()
                    took, last_step = await _recall_round(engine, shape, 100 + round_number, recalls)
                    samples[phase] += took
                    touch_step[phase] += last_step
                    if phase == phases[1]:
                        idle = percentile(samples["idle"][-recalls:], 50)
                        round_ratios.append(percentile(samples["writing"][-recalls:], 50) / idle)
                    if phase == "writing":
                        writing.clear()
                        written += stored.value - before
                        writing_s += time.perf_counter() - started
                        await asyncio.sleep(0.3)  # the fact in flight lands before the idle phase
    finally:
        writing.clear()
        stop.set()
        writer.join(60)
        if writer.is_alive():
            writer.terminate()
    out: dict = {phase: {"p50": round(percentile(v, 50), 2), "p95": round(percentile(v, 95), 2), "n": len(v)}
                 for phase, v in samples.items()}
    out["p95_ratio"] = round(out["writing"]["p95"] / out["idle"]["p95"], 2)
    out["p50_ratio"] = round(out["writing"]["p50"] / out["idle"]["p50"], 2)
    out["p50_ratio_by_round"] = [round(r, 2) for r in round_ratios]
    out["touch_step_p95"] = {phase: round(percentile(v, 95), 2) for phase, v in touch_step.items()}
    out["facts_per_s_while_recalling"] = round(written / writing_s, 1) if writing_s else 0.0
    out["facts_written"] = stored.value
    out["load"] = os.getloadavg()[0]
    return out


def _world(size: int, workdir: Path) -> Path:
    path = workdir / f"skew-{size}-speed.db"
    if not path.exists():
        print(f"building {path} ...", flush=True)
        asyncio.run(build(path, SkewShape(size)))
    return path


def _scratch_copy(world: Path, workdir: Path) -> Path:
    scratch = workdir / f"scratch-overlap-{world.stem}.db"
    for p in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
        p.unlink(missing_ok=True)
    shutil.copy(world, scratch)
    return scratch


def _postgres_copy(server_url: str, world: Path, size: int) -> str:
    from bot.memory.postgres.copy import copy_database

    from .pg_speed import copied, create_database, database_url
    name = f"{urlparse(server_url).path.lstrip('/') or 'muninn'}_overlap_{size}"
    url = database_url(server_url, name)
    if not copied(url):
        create_database(server_url, name)
        report = copy_database(world, url, batch=5000)
        print(f"  copied the world into {name} in {report.seconds:.1f} s", flush=True)
    return url


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.overlap", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=4, help="idle/writing pairs, alternating (default 4)")
    parser.add_argument("--recalls", type=int, default=40, help="recalls per phase and round (default 40)")
    parser.add_argument("--database-url", default="", help="also PostgreSQL: a server URL (its database is copied into)")
    parser.add_argument("--workdir", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--json", default="", help="write the results here too")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    world = _world(args.size, workdir)
    shape = SkewShape(args.size)
    results: dict = {"size": args.size, "rounds": args.rounds, "recalls_per_phase": args.recalls}
    with EmbedServerProcess("hash", dim=768) as embed_url:
        scratch = _scratch_copy(world, workdir)
        try:
            results["sqlite"] = asyncio.run(measure(_env(scratch, "", embed_url), shape, args.rounds, args.recalls))
        finally:
            for p in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
                p.unlink(missing_ok=True)
        _print_row("sqlite", results["sqlite"])
        if args.database_url:
            url = _postgres_copy(args.database_url, world, args.size)
            results["postgresql"] = asyncio.run(measure(_env(world, url, embed_url), shape, args.rounds, args.recalls))
            _print_row("postgresql", results["postgresql"])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def _print_row(backend: str, row: dict) -> None:
    print(f"| {backend} | {row['idle']['p50']} / {row['idle']['p95']} | {row['writing']['p50']} / "
          f"{row['writing']['p95']} | x{row['p50_ratio']} / x{row['p95_ratio']} | "
          f"{row['touch_step_p95']['idle']} / {row['touch_step_p95']['writing']} | "
          f"{row['facts_per_s_while_recalling']} | {row['load']:.2f} |", flush=True)


if __name__ == "__main__":
    print("| backend | recall idle ms p50 / p95 | while another process writes facts | ratio p50 / p95 "
          "| last step (touch) p95 idle / writing | facts/s meanwhile | load (1 min) |")
    print("|---|---|---|---|---|---|---|")
    main()
