"""`muninn import`: memories from a JSON-lines file, embedded and stored in batches.

A bad line is reported with its number and skipped; the rest are imported. Lines
whose external_id is already in the database are skipped, so re-running an import
is safe.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Iterable

from bot.memory.engine import Engine
from bot.memory.store import NewMemory

BATCH = 64
FIELDS = {"text", "scope", "user_id", "channel_id", "guild_id", "importance", "created_at", "external_id",
          "source_message_ids", "private"}


@dataclass
class ImportReport:
    imported: int = 0
    skipped_existing: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)


def parse_time(value) -> float | None:
    """ISO-8601 text (naive = UTC) or unix seconds."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"time {value!r} is not ISO-8601 (e.g. 2026-04-05T21:14:00Z)") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp()
    raise ValueError(f"time {value!r} must be ISO-8601 text or unix seconds")


def optional_id(record: dict, key: str) -> int | None:
    value = record.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not str(value).isdigit():
        raise ValueError(f"{key} {value!r} must be a numeric id")
    return int(value)


def memory_from_record(record) -> NewMemory:
    if not isinstance(record, dict):
        raise ValueError("line is not a JSON object")
    unknown = set(record) - FIELDS
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(sorted(unknown))}")
    if "text" not in record:
        raise ValueError("missing field 'text'")
    importance = record.get("importance", 0.5)
    if isinstance(importance, bool) or not isinstance(importance, (int, float)):
        raise ValueError(f"importance {importance!r} must be a number between 0 and 1")
    external = record.get("external_id")
    return NewMemory(text=record["text"], scope=record.get("scope", "personal"),
                     owner_id=optional_id(record, "user_id"), channel_id=optional_id(record, "channel_id"),
                     guild_id=optional_id(record, "guild_id"), importance=importance,
                     created_at=parse_time(record.get("created_at")),
                     source_message_ids=record.get("source_message_ids") or (),
                     external_id=None if external is None else str(external),
                     private=record.get("private") is True)


def parse_lines(lines: Iterable[str], report: ImportReport) -> Iterable[NewMemory]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield memory_from_record(json.loads(line))
        except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
            report.errors.append((number, str(exc)))




async def import_lines(engine: Engine, lines: Iterable[str], *, batch: int = BATCH,
                       on_progress: Callable[[int], None] | None = None) -> ImportReport:
    report = ImportReport()
    pending: list[NewMemory] = []

    async def flush() -> None:
        external = [m.external_id for m in pending if m.external_id is not None]
        existing = await engine.existing_external_ids(external)
        seen: set[str] = set()
        fresh = []
        for memory in pending:
            if memory.external_id is not None and (memory.external_id in existing or memory.external_id in seen):
                report.skipped_existing += 1
                continue
            if memory.external_id is not None:
                seen.add(memory.external_id)
            fresh.append(memory)
        if fresh:
            await engine.remember_many(fresh)
            report.imported += len(fresh)
        if on_progress:
            on_progress(len(pending))
        pending.clear()

    for memory in parse_lines(lines, report):
        pending.append(memory)
        if len(pending) >= batch:
            await flush()
    if pending:
        await flush()
    return report
