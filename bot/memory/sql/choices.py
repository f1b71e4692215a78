"""Reads for the native Discord controls: the autocomplete of memory ids (`/memory forget`,
`/memory why`) and the memories a message taught ("Forget what this taught you").

The autocomplete offers a person's own memories that the scope rule lets them see where they
ask, matched by their words or their number. Own: their personal memories and the room memories
they taught (alone or with others). Bounded: the newest `limit` matches among the person's newest
`SEARCHED` memories, so it answers well within Discord's three seconds for a person with tens of
thousands.
"""
from __future__ import annotations

from bot.memory.connection import Connection
from bot.memory.records import COLUMNS, Memory
from bot.memory.scope import ACTIVE, Viewer, key_filter, visible_keys

MAX_TYPED = 100  # Discord sends at most this much of what is typed into an option
SEARCHED = 5000  # a person's newest memories whose words are matched


def like_pattern(typed: str) -> str:
    """`typed` as a LIKE pattern matching it anywhere, its own % and _ taken literally."""
    escaped = typed.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def own_matching(conn: Connection, viewer: Viewer, typed: str, limit: int) -> list[Memory]:
    """Up to `limit` of the viewer's own active memories they may see here whose words hold
    `typed` (case aside) or whose number starts with it, newest first, among their newest
    SEARCHED; with nothing typed, the newest."""
    keys = visible_keys(conn, viewer)
    where, params = key_filter(keys)
    typed = " ".join(typed.split())[:MAX_TYPED]
    match = ""
    match_params: tuple[str, ...] = ()
    if typed:
        match = " AND (lower(text) LIKE lower(?) ESCAPE '\\'" + (" OR CAST(id AS TEXT) LIKE ?)" if typed.isdigit()
                                                                 else ")")
        match_params = (like_pattern(typed), *([f"{typed}%"] if typed.isdigit() else []))
    own = ("(owner_id = ? OR (scope = 'room' AND id IN "
           "(SELECT memory_id FROM memory_teachers WHERE user_id = ?)))")
    # Words are looked for among the newest SEARCHED of them only: the work stays bounded however
    # many a person has (an older one is still found by its number, or typed in full).
    # The words are matched in a derived table with its own LIMIT, which neither backend may push
    # the match into: they are read for those rows only, not for the whole table.
    newest = (f"SELECT id, text FROM memories WHERE {where} AND {ACTIVE} AND {own} "
              "ORDER BY id DESC LIMIT ?")
    rows = conn.execute(f"SELECT {COLUMNS} FROM memories WHERE id IN (SELECT id FROM ({newest}) AS newest "
                        f"WHERE 1 = 1{match} ORDER BY id DESC LIMIT ?) ORDER BY id DESC",
                        (*params, viewer.user_id, viewer.user_id, SEARCHED, *match_params, limit))
    return [Memory.from_row(row) for row in rows]


def from_message(conn: Connection, message_id: int) -> list[Memory]:
    """Every memory whose sources include the message (archived ones too), whoever's, oldest first."""
    rows = conn.execute(f"SELECT {COLUMNS} FROM memories WHERE id IN "
                        "(SELECT memory_id FROM memory_sources WHERE message_id = ?) ORDER BY id", (str(message_id),))
    return [Memory.from_row(row) for row in rows]
