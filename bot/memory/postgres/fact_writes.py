"""PostgreSQL's side of a fact write: the planning read, the key locks and the checks after them."""
from __future__ import annotations

import json
from typing import Any, Sequence

import psycopg

from bot.memory import scope
from bot.memory.postgres.connection import PgConnection
from bot.memory.postgres.index_state import INDEX_STATE_SQL, index_state_of
from bot.memory.postgres.vector_source import PostgresVectorSource
from bot.memory.storage import PlanState, Storage
from bot.memory.vectors.cache import VectorCache
from bot.memory.vectors.index import IndexInfo

FACT_KEY_LOCK = 7_277_404   # advisory locks (this, hash of a vis_key): storing facts under that key


# Whether no vector changed since a change mark (a snapshot): no log row of a transaction it did not see.
_UNCHANGED_SINCE = ("SELECT NOT EXISTS (SELECT 1 FROM vector_changes WHERE xid >= pg_snapshot_xmin(%s::pg_snapshot) "
                    "AND NOT pg_visible_in_snapshot(xid, %s::pg_snapshot))")


# Whether the k nearest under some keys, searched at a mark, still hold: no vector logged since
# (as _UNCHANGED_SINCE) of a memory now under those keys (stored, re-embedded or moved in) or among
# the ids that search found (removed or moved out); a removed memory the search did not return
# changes nothing. (When it was checked globally, four writers of their own keys re-searched each
# other's facts under the key's lock: 3 more round trips there - the log, the changed rows, their vectors.)
_UNCHANGED_UNDER = ("SELECT NOT EXISTS (SELECT 1 FROM vector_changes c LEFT JOIN memories m ON m.id = c.memory_id "
                    "WHERE c.xid >= pg_snapshot_xmin(%s::pg_snapshot) AND NOT pg_visible_in_snapshot(c.xid, %s::pg_snapshot) "
                    "AND (m.vis_key = ANY(%s::text[]) OR c.memory_id = ANY(%s::bigint[])))")


def _keyword_statement(words: list[str], keys: list[str], *, all_words: bool, limit: int) -> tuple[str, list[Any]]:
    """keyword_search's statement and parameters (the fact write's duplicate and update checks)."""
    match = (" && " if all_words else " || ").join(["plainto_tsquery('muninn', %s)"] * len(words))
    order = "m.id" if all_words else f"ts_rank_cd(m.text_search, {match}) DESC, m.id DESC"
    # As keywords.fts_candidates: the match written out (from a CTE the planner cannot see the
    # words) and never prepared (one generic plan for every key and word): that made the any-word
    # statement faster, most of all in its tail; all-words the same.
    return (f"SELECT m.id, m.text FROM memories m WHERE m.archived_at IS NULL AND m.vis_key = ANY(%s) "
            f"AND m.text_search @@ ({match}) ORDER BY {order} LIMIT %s",
            [keys, *words, *([] if all_words else words), limit])


# One person's personal keys, in key order (scope.personal_keys' statement; parameters: the owner, twice).
_PERSONAL_KEYS = f"ARRAY({scope.personal_keys_sql('%s')})"


def change_mark(conn: PgConnection) -> str:
    """The mark a fact write's planning reads: the server's current snapshot,
    as text (unchanged_since and begin_fact_write check against it)."""
    # A snapshot, not max(seq): a seq is numbered at insert, so a transaction holding a low
    # one can commit after a higher one was seen (a duplicate search would miss its fact).
    row = conn.pg.execute("SELECT pg_current_snapshot()::text").fetchone()
    assert row is not None
    return str(row[0])


def plan_state(cache: VectorCache | None, conn: PgConnection, model: str, owners: Sequence[int] = (),
               probes: Sequence[tuple[str, list[str]]] = (), same_text_limit: int = 0,
               taught: Sequence[tuple[int, int]] = (), since: float = 0.0) -> PlanState:
    """One round trip: the snapshot, the index, each owner's personal keys (scope.personal_keys'
    loose index scan, an array per owner), each probe's exact-text check (keyword_search's
    statement, its rows as JSON), what each (owner, channel) of `taught` taught there since
    `since` (store.taught_since's count) and, in a one_log_read block, the vector cache's read of the
    change log (the rows it needs: vector_source.poll_beside): these were a round trip each
    per fact. Never prepared (as keyword_search: one generic plan for every key and word
    would not do)."""
    people = list(dict.fromkeys(owners))
    columns = [f"({INDEX_STATE_SQL})", *(_PERSONAL_KEYS for _ in people)]
    params: list[Any] = [owner for owner in people for _ in range(2)]
    probed = [bool(words) for _, words in probes]
    for vis_key, words in probes:
        if words:
            query, more = _keyword_statement(words, [vis_key], all_words=True, limit=same_text_limit)
            columns.append(f"(SELECT json_agg(json_build_array(s.id, s.text) ORDER BY s.id)::text FROM ({query}) s)")
            params += more
    pairs = list(dict.fromkeys(taught))
    for owner, channel in pairs:
        columns.append("(SELECT count(*) FROM memories WHERE owner_id = %s AND channel_id = %s AND created_at >= %s)")
        params += [owner, channel, since]
    ahead = (cache.read_ahead(conn)
             if cache is not None and isinstance(cache.source, PostgresVectorSource) else None)
    if cache is not None and ahead is not None:
        polled, row = cache.source.poll_beside(conn, ahead[0], columns, params)  # type: ignore[attr-defined]
        mark = polled[2][0]  # the statement's snapshot: the plan's mark and the cache's are one
        stored, _ = index_state_of(row[0])
        if stored is not None:
            cache.take_read_ahead(conn, stored, ahead, polled)
    else:
        found = conn.pg.execute(f"SELECT pg_current_snapshot()::text, {', '.join(columns)}".encode(), params,
                                prepare=False).fetchone()
        assert found is not None
        mark, row = str(found[0]), tuple(found[1:])
        stored, _ = index_state_of(row[0])
    hits = iter(row[1 + len(people):])
    same_words = [[(int(mid), str(text)) for mid, text in json.loads(next(hits) or "[]")] if was_probed else []
                  for was_probed in probed]
    counts = {pair: int(next(hits)) for pair in pairs}
    return PlanState(mark, stored if stored is not None and stored.model == model else None,
                     {owner: [str(key) for key in keys] for owner, keys in zip(people, row[1:], strict=False)},
                     same_words, counts)


def unchanged_since(conn: PgConnection, mark: str) -> bool:
    """Whether no vector change was committed since the snapshot `mark`:
    no change-log row of a transaction it did not see (one statement)."""
    row = conn.pg.execute(_UNCHANGED_SINCE, (mark, mark)).fetchone()
    return bool(row and row[0])


def lock_keys(conn: PgConnection, keys: Sequence[str]) -> None:
    """Transaction-scoped advisory locks per visibility key, taken in sorted order (no
    deadlock between two writers): PostgreSQL runs writers side by side, so without them two
    processes storing the same fact would both find no duplicate and both insert it."""
    for key in sorted(set(keys)):
        conn.pg.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (FACT_KEY_LOCK, key))


def keyword_search(conn: PgConnection, words: list[str], keys: list[str], *, all_words: bool,
                   limit: int) -> list[tuple[int, str]]:
    """Active memories under `keys` holding every word (lowest id first) or any word (best
    ts_rank_cd first), at most `limit`: [(id, text)]; [] without words or keys. Never prepared."""
    if not words or not keys:
        return []
    query, params = _keyword_statement(words, keys, all_words=all_words, limit=limit)
    rows = conn.pg.execute(query.encode(), params, prepare=False).fetchall()
    return [(int(r[0]), str(r[1])) for r in rows]


def begin_fact_write(storage: Storage[PgConnection], conn: PgConnection, keys: Sequence[str], model: str,
                     dim: int | None, mark: Any, probes: Sequence[tuple[str, list[str]]], same_text_limit: int,
                     searched: Sequence[int] = ()) -> tuple[IndexInfo | None, bool, list[list[tuple[int, str]]]]:
    """One round trip: the statements go as one simple query (client-side binding, so no
    statement is prepared), run by the server in order, each with its own snapshot (READ
    COMMITTED): the checks after the locks see every fact committed by the lock's last holder.
    Before, the locks, two index reads, the change check and each duplicate check were a
    round trip each, all but the first with the key's lock held. The index is read after the
    locks: a writer that waited across a reset_index sees the new model and size."""
    if not conn.pg.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
        raise RuntimeError("begin_fact_write runs inside a write transaction")
    parts: list[str] = []
    params: list[Any] = []
    for key in sorted(set(keys)):  # sorted: two writers never wait for each other crosswise
        parts.append("SELECT pg_advisory_xact_lock(%s, hashtext(%s))")
        params += [FACT_KEY_LOCK, key]
    parts.append(INDEX_STATE_SQL)
    if mark is not None:
        parts.append(_UNCHANGED_UNDER)
        params += [mark, mark, sorted(set(keys)), sorted(set(searched))]
    probed = [bool(words) for _, words in probes]
    for vis_key, words in probes:
        if words:
            query, more = _keyword_statement(words, [vis_key], all_words=True, limit=same_text_limit)
            parts.append(query)
            params += more
    cursor = psycopg.ClientCursor(conn.pg)
    cursor.execute(";\n".join(parts).encode(), params)
    for _ in sorted(set(keys)):  # the locks' results, then the index's
        cursor.nextset()
    state = cursor.fetchone()
    stored, _ = index_state_of(state[0] if state else None)
    unchanged = False
    if mark is not None:
        cursor.nextset()
        row = cursor.fetchone()
        unchanged = bool(row and row[0])
    hits: list[list[tuple[int, str]]] = []
    for was_probed in probed:
        if was_probed:
            cursor.nextset()
            hits.append([(int(r[0]), str(r[1])) for r in cursor.fetchall()])
        else:
            hits.append([])
    info: IndexInfo | None = None
    if dim is not None:
        if stored is None:  # the first embedding ever: index_for creates the index (its own lock)
            info = storage.index_for(conn, model, dim)
        elif stored == IndexInfo(model, dim):
            info = stored
    return info, unchanged, hits
