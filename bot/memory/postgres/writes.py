"""PostgreSQL's writes: memories and their vectors, removals, touches, links, one transaction each."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import psycopg

from bot.memory import decay, records
from bot.memory.postgres import keywords
from bot.memory.postgres.connection import PgConnection, translate
from bot.memory.postgres.vector_forms import vector_binary
from bot.memory.scope import ACTIVE
from bot.memory.sql import removals, store, teachers
from bot.memory.storage import Storage
from bot.memory.vectors.index import IndexInfo, VectorSizeError


def _lock_in_order(conn: PgConnection, ids: Sequence[int]) -> None:
    """Row locks taken in id order: two processes touching or deleting overlapping sets at once
    then wait for each other instead of deadlocking (one UPDATE ... = ANY locks in scan order)."""
    conn.pg.execute("SELECT id FROM memories WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (sorted(set(ids)),))


# A recall's touch of its memories (parameters: now, growth, decay.MAX_STABILITY_DAYS).
_TOUCH_SET = ("access_count = access_count + 1, last_accessed = greatest(%s, coalesce(last_accessed, 0)), "
              "stability = least(stability * %s, %s)")
_INSERT_MEMORY = ("INSERT INTO memories (text, scope, owner_id, channel_id, guild_id, vis_key, importance, "
                  "stability, created_at, updated_at, source_message_ids, external_id, embedded, happens_on) "
                  "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")

_FIRST_TEACHER = (", t AS (INSERT INTO memory_teachers (memory_id, user_id, first_taught_at, source_message_ids) "
                  "SELECT id, owner_id, created_at, source_message_ids FROM m)")


@contextmanager
def _atomic(conn: PgConnection) -> Iterator[None]:
    """One transaction for the block: its own when none is open; inside the caller's, the
    caller's (no savepoint: two round trips each, and a failure fails the caller's transaction,
    which rolls back whole; nobody catches a failed insert halfway and carries on)."""
    if conn.pg.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
        yield
        return
    with conn.pg.transaction():
        yield


def reinforce(conn: PgConnection, memory_id: int, *, importance: float, sources: list[str],
              growth: float, now: float, teacher: tuple[int, float, str] | None = None) -> None:
    """A fact was learned again (Storage.reinforce): one UPDATE, with `teacher`'s upsert in the same
    statement, inside the caller's transaction when one is open."""
    update = ("UPDATE memories SET stability = least(stability * %s, %s), importance = greatest(importance, %s), "
              "source_message_ids = %s, last_accessed = greatest(%s, coalesce(last_accessed, 0)), updated_at = %s "
              "WHERE id = %s")
    params: tuple = (growth, decay.MAX_STABILITY_DAYS, importance, json.dumps(sources), now, now, memory_id)
    if teacher is None:
        conn.pg.execute(update, params)
        return
    conn.pg.execute(f"WITH t AS ({translate(teachers.upsert_statement())} RETURNING 1) {update}".encode(),
                    (memory_id, *teacher, *params))


def _put_vector(conn: PgConnection, info: IndexInfo, memory_id: int, vis_key: str, created_at: float,
                vector: Sequence[float]) -> None:
    """Store the vector (logged by trigger) and mark its memory embedded (a new memory's
    vector goes in with it: `insert`)."""
    if len(vector) != info.dim:
        raise VectorSizeError(f"embedding has {len(vector)} dimensions, the index has {info.dim}")
    conn.pg.execute(
        "INSERT INTO memory_vectors (memory_id, vis_key, created_at, embedding) VALUES (%s, %s, %s, %s::vector) "
        "ON CONFLICT (memory_id) DO UPDATE SET vis_key = excluded.vis_key, created_at = excluded.created_at, "
        "embedding = excluded.embedding", (memory_id, vis_key, float(created_at), vector_binary(vector)))
    conn.pg.execute("UPDATE memories SET embedded = 1 WHERE id = %s", (memory_id,))


def insert(storage: Storage[PgConnection], conn: PgConnection, memories: Sequence[records.NewMemory], *,
           base_stability_days: float, model: str, vecs: list[list[float]] | None, now: float | None,
           info: IndexInfo | None = None) -> list[int]:
    """Insert memories, each with its vector in the same statement when `vecs` fit the index (`info`
    when it matches `model` and their size, else index_for), in one transaction (the caller's, when
    one is open); returns their ids. VectorSizeError for a vector of another size than the first."""
    now = time.time() if now is None else now
    if info is None or not vecs or info.model != model or info.dim != len(vecs[0]):
        info = storage.index_for(conn, model, len(vecs[0])) if vecs else None
    ids: list[int] = []
    with _atomic(conn):
        for index, memory in enumerate(memories):
            created = memory.created_at if memory.created_at is not None else now
            vector = vecs[index] if vecs and info is not None else None
            if vector is not None and info is not None and len(vector) != info.dim:
                raise VectorSizeError(f"embedding has {len(vector)} dimensions, the index has {info.dim}")
            # `embedded` set here, not by a later UPDATE: that one wrote a second row version
            # (a new entry in every index, the GIN one included) and computed the tsvector again.
            # The memory and its vector in one statement: one round trip (the foreign key is
            # checked at the statement's end, when the memory row is there).
            values = (memory.text, memory.scope, memory.owner_id, memory.channel_id, memory.guild_id,
                      memory.vis_key, memory.importance,
                      decay.initial_stability(memory.importance, base_stability_days), created, now,
                      json.dumps([str(s) for s in memory.source_message_ids]), memory.external_id,
                      int(vector is not None), memory.happens_on)
            # A room memory's first teacher (sql/teachers.py) in the same statement.
            teacher = _FIRST_TEACHER if memory.scope == "room" and memory.owner_id is not None else ""
            if vector is None:
                row = conn.pg.execute(
                    f"WITH m AS ({_INSERT_MEMORY} RETURNING id, owner_id, created_at, source_message_ids){teacher} "
                    "SELECT id FROM m", values).fetchone()
            else:
                row = conn.pg.execute(
                    f"WITH m AS ({_INSERT_MEMORY} RETURNING id, vis_key, owner_id, created_at, source_message_ids)"
                    f"{teacher} INSERT INTO memory_vectors (memory_id, vis_key, created_at, embedding) "
                    "SELECT id, vis_key, created_at, %s::vector FROM m RETURNING memory_id",
                    (*values, vector_binary(vector))).fetchone()
            assert row is not None
            ids.append(int(row[0]))
    return ids


def store_vectors(storage: Storage[PgConnection], conn: PgConnection, model: str, ids: list[int],
                  vecs: list[list[float]]) -> int:
    """Store the backfill's vectors in one transaction, skipping memories archived or deleted
    meanwhile and vectors of another size; returns len(ids), or 0 when they do not fit the index."""
    info = storage.index_for(conn, model, len(vecs[0]))
    if info is None:
        return 0
    with conn.pg.transaction():
        for memory_id, vector in zip(ids, vecs, strict=True):
            row = conn.pg.execute("SELECT vis_key, created_at FROM memories WHERE id = %s AND " + ACTIVE
                                  + " FOR UPDATE", (memory_id,)).fetchone()
            if row is not None and len(vector) == info.dim:  # archived or deleted meanwhile: nothing to index
                _put_vector(conn, info, memory_id, row[0], row[1], vector)
    return len(ids)


def delete(conn: PgConnection, memory_ids: Sequence[int]) -> int:
    """Hard-delete memories in one transaction, rows locked in id order (their vectors, links and
    sources go by cascade); returns how many went. The keyword counts are corrected after the commit."""
    ids = list(memory_ids)
    if not ids:
        return 0
    with conn.pg.transaction():  # vectors (logged by trigger), links and source rows go by ON DELETE CASCADE
        _lock_in_order(conn, ids)
        removed = conn.pg.execute("DELETE FROM memories WHERE id = ANY(%s)", (ids,)).rowcount
    _count_removed(conn, removed)
    return removed


def _count_removed(conn: PgConnection, removed: int) -> None:
    """After the commit of the outermost transaction: this process's word counts go (a word
    counted as common may not be any more; before the commit a recall would count the removed
    rows again), and other processes' through the counter (removals.py), in a statement of its
    own (inside the transaction every removal of every process would wait for the one meta
    row until that commit: a fact write's supersede, a maintenance batch's archives)."""
    if removed <= 0:
        return

    def count_removed() -> None:
        keywords.forget_counts(conn, removed)
        removals.seen_own(keywords._database(conn), removals.add(conn, removed), removed)
    conn.after_commit(count_removed)


def archive(conn: PgConnection, memory_id: int, reason: str, now: float | None = None) -> None:
    """Archive an active memory (`reason`, at `now`) and delete its vector,
    in one transaction; an archived or missing memory stays as it is."""
    with conn.pg.transaction():
        archived = conn.pg.execute(
            "UPDATE memories SET archived_at = %s, archive_reason = %s, embedded = 0, updated_at = %s "
            "WHERE id = %s AND " + ACTIVE, (time.time() if now is None else now, reason, time.time(), memory_id)
        ).rowcount
        conn.pg.execute("DELETE FROM memory_vectors WHERE memory_id = %s", (memory_id,))  # logged by trigger
    _count_removed(conn, max(archived, 0))


def restore(conn: PgConnection, memory_id: int) -> None:
    """Bring an archived memory back in one UPDATE, counted as recalled now; its vector comes with the next backfill."""
    now = time.time()
    conn.pg.execute("UPDATE memories SET archived_at = NULL, archive_reason = NULL, last_accessed = %s, "
                    "updated_at = %s WHERE id = %s", (now, now, memory_id))


def touch_and_load(conn: PgConnection, recalls: Sequence[tuple[Sequence[int], float]],
                   wanted: Sequence[int], *, growth: float) -> dict[int, records.Memory] | None:
    """One recall's touch (touch_many's UPDATE) and the load of `wanted`, in one statement
    outside a transaction, its rows locked in id order by its subquery (BEGIN, the lock, the
    UPDATE and COMMIT were four round trips on every recall's path): the touched rows as the
    UPDATE leaves them (RETURNING), the others read beside it. None when it is not one
    recall's touch outside a transaction: touch_many, then get_many."""
    if len(recalls) != 1 or not conn.get_autocommit():
        return None
    ids, now = recalls[0]
    touched = sorted(set(ids))
    columns = translate(records.COLUMNS)
    rows = conn.pg.execute(
        (f"WITH touched AS (UPDATE memories SET {_TOUCH_SET} "
         f"WHERE id IN (SELECT id FROM memories WHERE id = ANY(%s) AND {ACTIVE} ORDER BY id FOR UPDATE) "
         f"RETURNING {columns}) "
         f"SELECT * FROM touched UNION ALL SELECT {columns} FROM memories WHERE id = ANY(%s) "
         "AND NOT id = ANY(%s)").encode(),
        (now, growth, decay.MAX_STABILITY_DAYS, touched, list(wanted), touched)).fetchall()
    return {int(row[0]): records.Memory.from_row(row) for row in rows}


def touch_many(conn: PgConnection, recalls: Sequence[tuple[Sequence[int], float]], *, growth: float) -> None:
    """Several recalls' touches in one transaction (bot/memory/recall/touches.py; one recall's alone
    is touch_and_load's), each the same UPDATE with its own time, in order: each memory ends
    as if each had been its own."""
    with conn.pg.transaction():
        _lock_in_order(conn, sorted({memory_id for ids, _ in recalls for memory_id in ids}))
        for ids, now in recalls:
            conn.pg.execute(f"UPDATE memories SET {_TOUCH_SET} WHERE id = ANY(%s) AND {ACTIVE}",
                            (now, growth, decay.MAX_STABILITY_DAYS, sorted(set(ids))))


def forget_sources(storage: Storage[PgConnection], conn: PgConnection, message_ids: Sequence[int],
                   learned_before: float | None = None) -> list[int]:
    """Take deleted messages out of the sources of the memories learned from
    them (before `learned_before`, when given) and delete those left with none,
    in one transaction, rows locked in id order; returns the deleted ids."""
    wanted = [str(m) for m in message_ids]
    if not wanted:
        return []
    with conn.pg.transaction():
        rows = conn.pg.execute(
            "SELECT m.id, m.source_message_ids FROM memories m WHERE m.id IN "
            "(SELECT memory_id FROM memory_sources WHERE message_id = ANY(%s)) "
            "AND (%s::float8 IS NULL OR m.created_at < %s) ORDER BY m.id FOR UPDATE",
            (wanted, learned_before, learned_before)).fetchall()
        emptied = store.retract(conn, [(int(memory_id), sources) for memory_id, sources in rows], wanted)
        storage.delete(conn, emptied)
    return emptied


def add_link(conn: PgConnection, source_id: int, target_id: int, kind: str, weight: float = 1.0,
             now: float | None = None) -> bool:
    """Link two memories, keeping the larger weight when the link exists; False, and no
    link, between two people's personal memories; ValueError for an unknown kind."""
    if kind not in records.LINK_KINDS:
        raise ValueError(f"unknown link kind {kind!r}")
    row = conn.pg.execute("SELECT count(*) FROM memories a, memories b WHERE a.id = %s AND b.id = %s AND "
                          "a.scope = 'personal' AND b.scope = 'personal' AND a.owner_id != b.owner_id",
                          (source_id, target_id)).fetchone()
    if row and row[0]:
        return False
    conn.pg.execute(
        "INSERT INTO memory_links (source_id, target_id, kind, weight, created_at) VALUES (%s, %s, %s, %s, %s) "
        "ON CONFLICT (source_id, target_id, kind) DO UPDATE SET weight = greatest(memory_links.weight, excluded.weight)",
        (source_id, target_id, kind, weight, time.time() if now is None else now))
    return True
