"""`muninn import`: memories from a JSON-lines file, embedded and stored in batches.

A bad line (not UTF-8, not JSON, or a value `bot.validate` refuses) is reported with
its number and reason and skipped; every other line is imported. If the database refuses
a batch, its lines are stored one by one so only the offending line is lost, and reported.
Lines whose external_id is already in the database are skipped, so re-running an import
is safe.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable

from bot import validate
from bot.memory.engine import Engine
from bot.memory.records import NewMemory

log = logging.getLogger(__name__)

BATCH = 64
FIELDS = {"text", "scope", "user_id", "channel_id", "guild_id", "importance", "created_at", "external_id",
          "source_message_ids", "private", "happens_on"}


@dataclass
class ImportReport:
    """What an import did: the lines imported, the lines skipped because their external_id was
    already in the database or earlier in the file, and each bad line as (line number, reason)."""
    imported: int = 0
    skipped_existing: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)


def parse_time(value) -> float | None:
    """ISO-8601 text (naive = UTC) or unix seconds, from 2000 to a day ahead of now."""
    return validate.timestamp(value, "time")


def decode_line(raw: bytes | str) -> object:
    """One line as JSON; ValueError says why not (bad UTF-8 with the byte offset)."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise validate.Invalid(f"not valid UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1})") from None
    return json.loads(raw, parse_constant=validate.reject_json_constant)


def memory_from_record(record) -> NewMemory:
    """The memory one decoded line describes (personal unless the line names a scope); raises
    ValueError, mostly validate.Invalid, naming what is wrong."""
    if not isinstance(record, dict):
        raise validate.Invalid("line is not a JSON object")
    unknown = set(record) - FIELDS
    if unknown:
        raise validate.Invalid(f"unknown field(s): {validate.replace_invalid(', '.join(sorted(unknown)))}")
    if "text" not in record:
        raise validate.Invalid("missing field 'text'")
    scope = record.get("scope", "personal")
    if not isinstance(scope, str):
        raise validate.Invalid("scope must be text")
    return NewMemory(text=validate.stored_text(record["text"]), scope=scope,
                     owner_id=validate.snowflake(record.get("user_id"), "user_id"),
                     channel_id=validate.snowflake(record.get("channel_id"), "channel_id"),
                     guild_id=validate.snowflake(record.get("guild_id"), "guild_id"),
                     importance=validate.number(record.get("importance", 0.5), "importance", low=0.0, high=1.0),
                     created_at=validate.timestamp(record.get("created_at"), "created_at"),
                     source_message_ids=validate.message_ids(record.get("source_message_ids")),
                     external_id=validate.external_id(record.get("external_id")),
                     private=validate.boolean(record.get("private"), "private"),
                     happens_on=record.get("happens_on"))


def parse_lines(lines: Iterable[bytes | str], report: ImportReport) -> Iterable[tuple[int, NewMemory]]:
    """(line number, memory) for each good line; each bad one goes to `report.errors`."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, memory_from_record(decode_line(line))
        except (ValueError, TypeError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            report.errors.append((number, validate.replace_invalid(str(exc)) or type(exc).__name__))




async def import_lines(engine: Engine, lines: Iterable[bytes | str], *, batch: int = BATCH,
                       on_progress: Callable[[int], None] | None = None) -> ImportReport:
    """Import JSON lines in batches of `batch` as the module docstring says, and return the report
    (its errors sorted by line). `on_progress` gets the number of good lines each batch handled.
    A database failure other than a refused row is raised; the batches stored before it stay stored."""
    report = ImportReport()
    pending: list[tuple[int, NewMemory]] = []

    async def flush() -> None:
        external = [m.external_id for _, m in pending if m.external_id is not None]
        existing = await engine.existing_external_ids(external)
        seen: set[str] = set()
        fresh: list[tuple[int, NewMemory]] = []
        for number, memory in pending:
            if memory.external_id is not None and (memory.external_id in existing or memory.external_id in seen):
                report.skipped_existing += 1
                continue
            if memory.external_id is not None:
                seen.add(memory.external_id)
            fresh.append((number, memory))
        if fresh:
            await _store(engine, fresh, report)
        if on_progress:
            on_progress(len(pending))
        pending.clear()

    for number, memory in parse_lines(lines, report):
        pending.append((number, memory))
        if len(pending) >= batch:
            await flush()
    if pending:
        await flush()
    if report.imported:  # recall's view of the database (PostgreSQL's word statistics) includes them now
        await engine.refresh_statistics()
    report.errors.sort()
    return report


async def _store(engine: Engine, fresh: list[tuple[int, NewMemory]], report: ImportReport) -> None:
    """Store a batch in one transaction; if the database refuses a row of it (a constraint),
    store the lines one by one so that only the offending one is lost, and reported."""
    refusals: tuple[type[Exception], ...] = (*engine.storage.row_refusals, ValueError, OverflowError)
    try:
        await engine.remember_many([m for _, m in fresh])
        report.imported += len(fresh)
        return
    except refusals as exc:
        if len(fresh) == 1:
            report.errors.append((fresh[0][0], f"the database refused it: {exc}"))
            return
        log.debug("a batch was refused (%s); storing its lines one by one", exc)
    for item in fresh:
        await _store(engine, [item], report)
