"""repair.RULES holds each rule twice, in SQLite's SQL and in PostgreSQL's: the same bad rows,
planted on both backends, must be found and fixed alike by both dialects (and as this table
of cases says, so that they cannot agree on being wrong)."""
from __future__ import annotations

import math
import time

import psycopg

from bot.memory.decay import MAX_STABILITY_DAYS
from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from bot.memory.sql import repair
from bot.validate import EARLIEST, FUTURE_SLACK_S

INF = math.inf
NOW = time.time()
LATEST = NOW + FUTURE_SLACK_S
CREATED, UPDATED, ACCESSED, STABILITY, SOURCES = (rule.what for rule in repair.RULES)

# A value that is not a number, as each backend can hold one: SQLite keeps text in a REAL
# column (and stores NaN as NULL), PostgreSQL's typed columns hold NaN (sorting above every number).
NOT_A_NUMBER = object()

# (column -> planted value, the rules that must find the row)
CASES: list[tuple[dict[str, object], set[str]]] = [
    ({"created_at": -1e11}, {CREATED}),
    ({"created_at": EARLIEST - 1}, {CREATED}),
    ({"created_at": EARLIEST}, set()),
    ({"created_at": LATEST + 5}, {CREATED}),
    ({"created_at": INF}, {CREATED}),
    ({"created_at": -INF}, {CREATED}),
    ({"created_at": NOT_A_NUMBER}, {CREATED}),
    ({"updated_at": LATEST + 5}, {UPDATED}),
    ({"updated_at": INF}, {UPDATED}),
    ({"updated_at": NOT_A_NUMBER}, {UPDATED}),
    ({"updated_at": -5.0}, set()),
    ({"updated_at": -INF}, set()),  # in the past: the rule is about "not a number or in the future"
    ({"last_accessed": None}, set()),
    ({"last_accessed": 0.0}, set()),
    ({"last_accessed": -1.0}, {ACCESSED}),
    ({"last_accessed": LATEST + 5}, {ACCESSED}),
    ({"last_accessed": INF}, {ACCESSED}),
    ({"last_accessed": -INF}, {ACCESSED}),
    ({"last_accessed": NOT_A_NUMBER}, {ACCESSED}),
    ({"stability": 0.0}, {STABILITY}),
    ({"stability": -3.0}, {STABILITY}),
    ({"stability": 0.5}, set()),
    ({"stability": MAX_STABILITY_DAYS}, set()),
    ({"stability": MAX_STABILITY_DAYS + 1}, {STABILITY}),
    ({"stability": INF}, {STABILITY}),
    ({"stability": -INF}, {STABILITY}),
    ({"stability": NOT_A_NUMBER}, {STABILITY}),
    ({"source_message_ids": "5"}, {SOURCES}),
    ({"source_message_ids": "not json"}, {SOURCES}),
    ({"source_message_ids": '{"a": 1}'}, {SOURCES}),
    ({"source_message_ids": ""}, {SOURCES}),
    ({"source_message_ids": "[]"}, set()),
    ({"source_message_ids": '[1, "2"]'}, set()),
    ({"source_message_ids": ' ["3"] '}, set()),
    # several at once: each fix reads the others' columns as they are then (created_at's, updated_at)
    ({"created_at": -1e11, "updated_at": LATEST + 5, "last_accessed": INF, "stability": 0.0},
     {CREATED, UPDATED, ACCESSED, STABILITY}),
    ({"created_at": LATEST + 5, "updated_at": NOT_A_NUMBER}, {CREATED, UPDATED}),
    ({"created_at": NOT_A_NUMBER, "updated_at": NOT_A_NUMBER, "stability": NOT_A_NUMBER}, {CREATED, UPDATED, STABILITY}),
]
COLUMNS = ("created_at", "updated_at", "last_accessed", "stability", "source_message_ids")


async def _planted(engine: Engine, postgres_url: str | None) -> list[int]:
    ids = await engine.remember_many([NewMemory(f"case {n}", "personal", owner_id=3, created_at=NOW - 100)
                                      for n in range(len(CASES))], now=NOW - 100)
    not_a_number = math.nan if postgres_url else "oops"
    updates = [(f"UPDATE memories SET {', '.join(f'{c} = %s' for c in values)} WHERE id = %s",
                (*(not_a_number if v is NOT_A_NUMBER else v for v in values.values()), memory_id))
               for (values, _), memory_id in zip(CASES, ids, strict=True)]
    if postgres_url:  # as another program or an old copy wrote them: past the trigger that checks sources
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SET session_replication_role = replica")
            for sql, params in updates:
                admin.execute(sql.encode(), params)
    else:
        await engine.write(_plant_past_the_sources_trigger, [(sql.replace("%s", "?"), params) for sql, params in updates])
    return ids


def _plant_past_the_sources_trigger(conn, updates: list[tuple[str, tuple]]) -> None:
    """SQLite's trigger keeping memory_sources in step reads the list with json_each, which
    refuses what is not JSON: it steps aside for the planting, and comes back as it was."""
    with conn:
        [trigger] = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'memory_sources_update'").fetchall()
        conn.execute("DROP TRIGGER memory_sources_update")
        for sql, params in updates:
            conn.execute(sql, params)
        conn.execute(trigger[0])


def _rows(conn, ids: list[int]) -> list[tuple]:
    return [tuple(row) for row in conn.execute(
        f"SELECT {', '.join(COLUMNS)} FROM memories WHERE id IN ({','.join('?' * len(ids))}) ORDER BY id", ids)]


async def _found_and_fixed(engine: Engine, postgres_url: str | None) -> tuple[dict, dict, int, list[tuple]]:
    ids = await _planted(engine, postgres_url)
    position = {memory_id: n for n, memory_id in enumerate(ids)}  # ids as case numbers: the backends' ids may differ
    found = {what: [position[i] for i in rows] for what, rows in (await engine.read(repair.find_bad_rows, NOW)).items()}
    expected = {rule.what: [n for n, (_, bad) in enumerate(CASES) if rule.what in bad] for rule in repair.RULES}
    changed = await engine.write(repair.fix_bad_rows, NOW)
    assert await engine.read(repair.find_bad_rows, NOW) == {}  # each fix leaves a value its rule accepts
    return found, {what: rows for what, rows in expected.items() if rows}, changed, await engine.read(_rows, ids)


async def test_both_dialects_of_every_rule_find_and_fix_the_same_rows(make_settings, postgres_url):
    async with Engine(make_settings("")) as engine:
        sqlite = await _found_and_fixed(engine, None)
    async with Engine(make_settings("", MUNINN_DATABASE_URL=postgres_url)) as engine:
        postgres = await _found_and_fixed(engine, postgres_url)
    (sqlite_found, expected, sqlite_changed, sqlite_rows) = sqlite
    (postgres_found, _, postgres_changed, postgres_rows) = postgres
    assert sqlite_found == expected
    assert postgres_found == expected
    assert sqlite_changed == postgres_changed
    for n, (on_sqlite, on_postgres) in enumerate(zip(sqlite_rows, postgres_rows, strict=True)):
        assert on_sqlite[:4] == on_postgres[:4], (n, CASES[n][0])  # the same clamped numbers
        assert on_sqlite[4] == on_postgres[4] or (on_sqlite[4].strip() == on_postgres[4].strip()), (n, CASES[n][0])
