"""Helpers shared by the lifecycle tests (extraction, write-time rules, maintenance)."""
from __future__ import annotations

import asyncio
import json
import math
import re
import time
from typing import Awaitable, Callable, Sequence

from bot.conversation.exchange import Exchange
from bot.lifecycle import maintenance, writes
from bot.lifecycle.facts import (
    FACT_SCHEMA,
    Fact,
    by_author,
    extract_author_facts,
    usable,
)
from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.sql import store
from tests.fakes.ollama import FakeOllama

ALICE, BOB, OWNER = 101, 202, 909
GUILD, CHANNEL, DM_CHANNEL = 7, 70, 71


def exchange(text: str, *, author: int = ALICE, name: str = "Alice", channel: int = CHANNEL,
             guild: int | None = GUILD, message_id: int = 1, reply: str = "Noted!",
             recalled: tuple[str, ...] = (), created_at: float | None = None,
             participants: tuple[str, ...] = (), moderator: bool = False) -> Exchange:
    return Exchange(author_id=author, author_name=name, channel_id=channel, guild_id=guild, dm=guild is None,
                    user_message=text, user_message_id=message_id, reply=reply, reply_message_id=message_id + 1000,
                    recalled=recalled, created_at=created_at,
                    participants=participants, moderator=moderator)


class QuietSink:
    """An ExchangeSink with nothing queued: forgetting and closing have nothing to do.
    Test sinks subclass it and override `submit`."""

    def submit(self, exchange: Exchange) -> None:
        pass

    def forget(self, user_id: int) -> None:
        pass

    def forget_messages(self, message_ids) -> None:
        pass

    def mark_gone(self, message_ids) -> None:
        pass

    async def close(self) -> None:
        pass


async def extract_facts(engine: Engine, exchanges: Exchange | Sequence[Exchange]) -> list[Fact]:
    """The facts of these exchanges, author by author, as the extractor gets them (no storing)."""
    batch = usable(exchanges)
    facts: list[Fact] = []
    for own in by_author(batch).values():
        facts += await extract_author_facts(engine, own, batch)
    return facts


def fact(text: str, about: str = "Alice", scope: str = "personal", importance: float = 0.6) -> dict:
    return {"text": text, "about": about, "scope": scope, "importance": importance}


def facts_reply(*items: dict) -> str:
    return json.dumps({"facts": list(items)})


def author_of(request: dict) -> str | None:
    """The author an extraction request is about (its "Author: X." line)."""
    found = re.search(r"^Author: (.*)\.$", request["messages"][1]["content"], re.M)
    return found.group(1) if found else None


def per_author(**answers: str):
    """A scripted extraction answer that depends on whose messages are asked about (all the
    answers' facts together for a prompt that names no author)."""
    def answer(request: dict) -> str:
        author = author_of(request)
        if author is None:
            return json.dumps({"facts": [f for a in answers.values() for f in json.loads(a)["facts"]]})
        return answers.get(author, "{}")
    return answer


def schema_of(request: dict) -> dict | None:
    """The JSON schema a chat request asks its answer to follow: Ollama's `format`, or the
    OpenAI API's `response_format` (json_schema, or json_object with llama-server's `schema`)."""
    if request.get("format"):
        return request["format"]
    fmt = request.get("response_format") or {}
    return (fmt.get("json_schema") or {}).get("schema") or fmt.get("schema")


def kind_of(request: dict) -> str:
    """What a chat request asks for, by the JSON schema it sends (the structured output contract),
    so rewording a prompt never misroutes a scripted answer."""
    return SCHEMA_KINDS.get(json.dumps(schema_of(request), sort_keys=True), "other")


SCHEMA_KINDS = {json.dumps(schema, sort_keys=True): kind for schema, kind in (
    (FACT_SCHEMA, "extract"), (writes.UPDATE_SCHEMA, "update"), (maintenance.MERGE_SCHEMA, "merge"))}


class Script:
    """Scripted chat answers per kind of request (extract / update / merge), in order;
    when a kind's list is empty the answer is its `always` answer, else `{}` (no facts, no update)."""

    def __init__(self, fake: FakeOllama):
        self.queues: dict[str, list] = {"extract": [], "update": [], "merge": []}
        self.always: dict[str, object] = {}
        self.seen: dict[str, list[dict]] = {"extract": [], "update": [], "merge": [], "other": []}
        fake.default_chat_reply = self.answer

    def add(self, kind: str, *answers) -> "Script":
        self.queues[kind].extend(answers)
        return self

    def answer(self, request: dict) -> str:
        kind = kind_of(request)
        self.seen[kind].append(request)
        queue = self.queues.get(kind) or []
        item = queue.pop(0) if queue else self.always.get(kind, "{}")
        return item(request) if callable(item) else item


async def memories_of(engine: Engine, *, active_only: bool = True) -> list[records.Memory]:
    def read(conn):
        sql = f"SELECT {records.COLUMNS} FROM memories" + (" WHERE archived_at IS NULL" if active_only else "")
        return [records.Memory.from_row(r) for r in conn.execute(sql + " ORDER BY id")]
    return await engine.write(read)


async def links_of(engine: Engine) -> set[tuple[int, int, str]]:
    return set(await engine.write(lambda c: [tuple(r) for r in c.execute(
        "SELECT source_id, target_id, kind FROM memory_links")]))


DIM = 768


def axis(i: int) -> list[float]:
    v = [0.0] * DIM
    v[i] = 1.0
    return v


def blend(i: int, j: int, cos: float) -> list[float]:
    """A unit vector at exactly `cos` to axis i (the rest along axis j)."""
    v = [0.0] * DIM
    v[i], v[j] = cos, math.sqrt(1.0 - cos * cos)
    return v


async def one(engine, memory_id: int) -> records.Memory:
    return await engine.write(store.get, memory_id)


async def until(condition: Callable[[], Awaitable[bool] | bool], what: str, timeout: float = 30.0) -> None:
    """Poll `condition` until it holds: tests wait on what they need, never on a fixed time (the
    CI machine's 2 shared cores can stall any step for a while)."""
    deadline = time.monotonic() + timeout
    while True:
        held = condition()
        if not isinstance(held, bool):
            held = await held
        if held:
            return
        assert time.monotonic() < deadline, f"still not {what} after {timeout} s"
        await asyncio.sleep(0.02)


def rewind_schema(conn, backend: str, introducing: str) -> None:
    """Set the schema version back to just before the migration whose SQL holds `introducing`, so
    that the next start runs it again, and every later one: what a later migration added with ALTER
    TABLE ADD COLUMN (which SQLite cannot run twice) is taken out first."""
    from bot.memory.postgres import migrations as pg_migrations
    from bot.memory.sqlite import migrations as sqlite_migrations
    migrations = pg_migrations.MIGRATIONS if backend else sqlite_migrations.MIGRATIONS
    number = next(n for n, sql in enumerate(migrations, 1) if introducing in sql)
    conn.execute("DROP INDEX IF EXISTS memories_happens")
    conn.execute("ALTER TABLE memories DROP COLUMN happens_on")
    if backend:
        conn.execute("UPDATE schema_version SET version = ?", (number - 1,))
    else:
        conn.execute(f"PRAGMA user_version = {number - 1}")

