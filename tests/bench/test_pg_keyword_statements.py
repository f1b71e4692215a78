"""bench/pg_keyword_statements.py on the embedded server: each statement of the keyword step is
listed with its timings, and how many statements each recall sent."""
from __future__ import annotations

from bench import pg_keyword_statements
from bench.world import SkewShape, SkewWorld
from bot.memory.engine import Engine
from bot.memory.records import NewMemory


async def test_each_statement_of_the_keyword_step_is_timed(make_settings, postgres_url):
    shape = SkewShape(400, users=20, channels=8, guilds=2, vocab=200)
    world = SkewWorld(shape, seed=99)
    async with Engine(make_settings("", MUNINN_DATABASE_URL=postgres_url)) as engine:
        await engine.remember_many([NewMemory(world.query()[0], "global") for _ in range(60)])
    report = pg_keyword_statements.measure(postgres_url, shape, 6, "busy")
    assert sum(report["statements_per_recall"].values()) == 6
    keyword = [row for name, row in report["statements"].items() if name.startswith("(SELECT h.id")]
    assert keyword and keyword[0]["n"] >= 1 and 0 < keyword[0]["median"] <= keyword[0]["p95"]
    assert 0 < report["keyword_step"]["median"] <= report["keyword_step"]["p95"]
