"""What a memory is, as the engine takes and returns it: NewMemory to store, Memory as stored.

`Memory.from_row` reads the columns of `COLUMNS` in their order; both backends select them so.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Sequence

from bot import validate
from bot.memory import clocks, decay
from bot.memory.scope import SCOPES, is_private, memory_key

# Times Python can render (datetime covers years 1 to 9999): a stored value outside is
# shown clamped, never allowed to crash a recall or an export.
RENDERABLE_FROM = datetime(1, 1, 2, tzinfo=timezone.utc).timestamp()
RENDERABLE_UNTIL = datetime(9999, 12, 30, tzinfo=timezone.utc).timestamp()

LINK_KINDS = ("co_extracted", "consolidated", "semantic", "superseded_by")
MAX_TEXT_CHARS = 4000

# How a new room memory stands (the write policy of shared memory, bot/lifecycle/room_policy.py).
# None: a member's claim, shown as what that member said. SET: taught by a moderator (Manage
# Messages in its channel), shown as set by one. PENDING: a member's claim waiting for a moderator,
# stored archived (PENDING_REASON): never recalled or listed until a moderator approves it.
SET = "set"
PENDING = "pending"
STANDINGS = (SET, PENDING)
PENDING_REASON = "pending approval"

# Free text comes back as bytes and is decoded leniently (Memory.from_row): SQLite never checks
# that TEXT is UTF-8, and one bad byte written by another program must not break every read.
COLUMNS = ("id, CAST(text AS BLOB), scope, owner_id, channel_id, guild_id, vis_key, importance, stability, "
           "access_count, last_accessed, created_at, updated_at, archived_at, CAST(archive_reason AS BLOB), "
           "source_message_ids, CAST(external_id AS BLOB), embedded, happens_on")


class MemoryNotFound(LookupError):
    """No memory with that id (or none the caller may see)."""
    pass


@dataclass
class NewMemory:
    """A memory to store: its text, scope and who and where it belongs to; checked on creation."""
    text: str
    scope: str
    owner_id: int | None = None
    channel_id: int | None = None
    guild_id: int | None = None
    importance: float = 0.5
    created_at: float | None = None
    source_message_ids: Sequence[int | str] = ()
    external_id: str | None = None
    private: bool = False  # learned in a guild channel not everyone there can read (scope.memory_key)
    mentions: Sequence[int] = ()  # people it names besides its owner, who may export and erase it
    standing: str | None = None  # a room memory's: SET or PENDING (see STANDINGS); None: a member's claim
    happens_on: str | None = None  # when what it tells happens: an ISO date or interval (bot/memory/clocks.py)

    def __post_init__(self):
        # The last line of defence for every writer (import, CLI, slash commands, LLM output):
        # nothing that would fail to store or later fail to render gets in.
        self.text = clean_text(validate.stored_text(self.text))
        if self.scope not in SCOPES:
            raise ValueError(f"unknown scope {validate.replace_invalid(repr(self.scope))}; "
                             f"use one of {', '.join(SCOPES)}")
        self.importance = validate.number(self.importance, "importance", low=0.0, high=1.0)
        self.owner_id = validate.snowflake(self.owner_id, "owner id")
        self.channel_id = validate.snowflake(self.channel_id, "channel id")
        self.guild_id = validate.snowflake(self.guild_id, "guild id")
        if self.created_at is not None:
            self.created_at = validate.number(self.created_at, "created_at", low=0.0, high=RENDERABLE_UNTIL)
        if self.external_id is not None:
            self.external_id = validate.stored_text(self.external_id, "external_id")
        self.source_message_ids = [validate.stored_text(str(s), "source_message_ids")
                                   for s in self.source_message_ids]
        ids = (validate.snowflake(m, "mentioned user id", optional=False) for m in self.mentions)
        self.mentions = sorted({m for m in ids if m is not None})
        memory_key(self.scope, self.owner_id, self.channel_id, self.guild_id, self.private)  # validates ids
        self.happens_on = clocks.check(self.happens_on)
        if self.standing is not None and (self.standing not in STANDINGS or self.scope != "room"):
            raise ValueError("only a room memory can be set by a moderator or wait for one")

    @property
    def vis_key(self) -> str:
        """The visibility key the scope rule files this memory under (scope.memory_key)."""
        return memory_key(self.scope, self.owner_id, self.channel_id, self.guild_id, self.private)


@dataclass
class Memory:
    """A memory as stored, archived or not."""
    id: int
    text: str
    scope: str
    owner_id: int | None
    channel_id: int | None
    guild_id: int | None
    vis_key: str
    importance: float
    stability: float
    access_count: int
    last_accessed: float | None
    created_at: float
    updated_at: float
    archived_at: float | None
    archive_reason: str | None
    source_message_ids: list = field(default_factory=list)
    external_id: str | None = None
    embedded: bool = False
    happens_on: str | None = None   # when what it tells happens (bot/memory/clocks.py); None: it names no date

    @classmethod
    def from_row(cls, row) -> "Memory":
        """A memory as stored; whatever is in the file (an odd type, broken JSON), this does not raise."""
        values = list(row)
        for index in (1, 14, 16):  # text, archive_reason, external_id
            if isinstance(values[index], bytes):
                values[index] = lenient_text(values[index])
        values[15] = _id_list(values[15])
        values[17] = bool(values[17])
        if len(values) > 18:
            values[18] = cls.happens_of(values[18])
        for index in (7, 8, 10, 11, 12, 13):  # importance, stability and the times: numbers or None
            if values[index] is not None and not isinstance(values[index], (int, float)):
                values[index] = _as_float(values[index])
        if values[11] is None:
            values[11] = 0.0
        if values[12] is None:
            values[12] = values[11]
        if not isinstance(values[1], str):
            values[1] = str(values[1])
        return cls(*values)

    @staticmethod
    def happens_of(stored: object) -> str | None:
        """A stored happens_on as its ISO text; one that is not a date (another program wrote it) reads as none."""
        span = clocks.parse(stored.decode("utf-8", "replace") if isinstance(stored, bytes) else stored)
        return span.iso() if span is not None else None

    @property
    def happens(self) -> clocks.Span | None:
        """When what it tells happens, as days (None: it names no date)."""
        return clocks.parse(self.happens_on)

    @property
    def private(self) -> bool:
        """Learned in a private channel (its key names the channel): copies must keep that."""
        return is_private(self.vis_key)

    def retention(self, now: float | None = None) -> float:
        """Retention now; a stored value that makes no sense (stability 0, a NaN) gives 0.0 or 1.0."""
        try:
            value = decay.retention(now or time.time(), self.last_accessed or self.created_at, self.stability)
        except (ArithmeticError, TypeError, ValueError):
            return 0.0
        return value if math.isfinite(value) else 0.0

    def to_dict(self, now: float | None = None) -> dict:
        """The memory as JSON-ready values, times in ISO 8601, with its retention at `now`."""
        out = asdict(self)
        for key in ("last_accessed", "created_at", "updated_at", "archived_at"):
            out[key] = iso(out[key])
        out["retention"] = round(self.retention(now), 4)
        return out


def clean_text(text: str) -> str:
    """Normalise whitespace and reject what cannot be a memory, with a clear message."""
    if not isinstance(text, str):
        raise ValueError("memory text must be a string")
    text = text.replace("\x00", "").strip()
    if not text:
        raise ValueError("memory text is empty")
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"memory text is {len(text)} characters; the limit is {MAX_TEXT_CHARS}")
    return text


def iso(ts: float | None) -> str | None:
    """ISO-8601 UTC; a time Python cannot render (year < 1 or > 9999, NaN) is clamped and marked
    with a trailing "?" so that a damaged row still shows, and shows that it is damaged."""
    if ts is None:
        return None
    if isinstance(ts, (int, float)) and math.isfinite(ts) and RENDERABLE_FROM <= ts <= RENDERABLE_UNTIL:
        return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")
    if not isinstance(ts, (int, float)) or math.isnan(ts):
        return "invalid?"
    edge = RENDERABLE_FROM if ts < RENDERABLE_FROM else RENDERABLE_UNTIL
    return datetime.fromtimestamp(edge, timezone.utc).isoformat(timespec="seconds") + "?"


def lenient_text(raw: bytes) -> str:
    """Stored bytes as text; invalid UTF-8 becomes U+FFFD (`muninn doctor` reports such rows)."""
    return raw.decode("utf-8", "replace")


def _id_list(raw) -> list:
    try:
        value = json.loads(raw or "[]")
    except (ValueError, TypeError):
        return []
    return value if isinstance(value, list) else []


def _as_float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
