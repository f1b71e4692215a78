"""Numbered schema migrations, applied in order inside one transaction each.

`PRAGMA user_version` records the last one applied. Append new migrations to
MIGRATIONS; never edit one that has shipped. The vec0 table is not here: its
dimension comes from the embedding model (see vectors.py).
"""
from __future__ import annotations

import logging
from typing import Any

import apsw

from bot.memory.sql.transactions import write_transaction

log = logging.getLogger(__name__)

MIGRATIONS: list[str] = [
    # 1: memories, their FTS5 index (active memories only), links, key/value meta.
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);

    CREATE TABLE memories (
        id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: a "#N" a person saw stays theirs
        text TEXT NOT NULL CHECK (length(text) > 0),
        scope TEXT NOT NULL CHECK (scope IN ('personal', 'room', 'global')),
        owner_id INTEGER,            -- personal: whose memory it is; otherwise who taught it
        channel_id INTEGER,          -- channel it was learned in (room scope: the room)
        guild_id INTEGER,            -- guild it was learned in; NULL = a DM or local chat
        vis_key TEXT NOT NULL,       -- visibility key from scope.memory_key()
        importance REAL NOT NULL DEFAULT 0.5 CHECK (importance BETWEEN 0 AND 1),
        stability REAL NOT NULL,     -- Ebbinghaus stability S in days (decay.py)
        access_count INTEGER NOT NULL DEFAULT 0,
        last_accessed REAL,          -- unix seconds; NULL = never recalled
        created_at REAL NOT NULL,    -- unix seconds
        updated_at REAL NOT NULL,
        archived_at REAL,            -- NULL = active
        archive_reason TEXT,
        source_message_ids TEXT NOT NULL DEFAULT '[]',  -- JSON list of message ids
        external_id TEXT UNIQUE,     -- id in an imported data set
        embedded INTEGER NOT NULL DEFAULT 0,            -- 1 when vec_memories holds its vector
        CHECK (scope != 'personal' OR owner_id IS NOT NULL),
        CHECK (scope != 'room' OR channel_id IS NOT NULL)
    );
    CREATE INDEX memories_active_vis ON memories (vis_key, id) WHERE archived_at IS NULL;
    CREATE INDEX memories_owner ON memories (owner_id, scope);
    CREATE INDEX memories_unembedded ON memories (id) WHERE embedded = 0 AND archived_at IS NULL;

    -- External-content FTS5 holding exactly the active memories.
    CREATE VIRTUAL TABLE memories_fts USING fts5 (
        text, content = 'memories', content_rowid = 'id',
        tokenize = 'porter unicode61 remove_diacritics 2'
    );
    CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories WHEN new.archived_at IS NULL BEGIN
        INSERT INTO memories_fts (rowid, text) VALUES (new.id, new.text);
    END;
    CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories WHEN old.archived_at IS NULL BEGIN
        INSERT INTO memories_fts (memories_fts, rowid, text) VALUES ('delete', old.id, old.text);
    END;
    -- One trigger, so the old row is always removed before the new one is added.
    CREATE TRIGGER memories_fts_update AFTER UPDATE OF text, archived_at ON memories
    WHEN old.archived_at IS NULL OR new.archived_at IS NULL BEGIN
        INSERT INTO memories_fts (memories_fts, rowid, text)
            SELECT 'delete', old.id, old.text WHERE old.archived_at IS NULL;
        INSERT INTO memories_fts (rowid, text) SELECT new.id, new.text WHERE new.archived_at IS NULL;
    END;

    CREATE TABLE memory_links (
        source_id INTEGER NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
        target_id INTEGER NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
        kind TEXT NOT NULL CHECK (kind IN ('co_extracted', 'consolidated', 'semantic', 'superseded_by')),
        weight REAL NOT NULL DEFAULT 1.0,
        created_at REAL NOT NULL,
        PRIMARY KEY (source_id, target_id, kind),
        CHECK (source_id != target_id)
    ) WITHOUT ROWID;
    CREATE INDEX memory_links_target ON memory_links (target_id);
    """,
    # 2: the channel history the bot keeps for context, and per-channel options.
    """
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,      -- Discord message id (or a local id for `muninn chat`)
        channel_id INTEGER NOT NULL,
        guild_id INTEGER,            -- NULL = DM / local chat
        author_id INTEGER NOT NULL,
        author_name TEXT NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
        content TEXT NOT NULL,
        created_at REAL NOT NULL,    -- unix seconds
        edited_at REAL,
        deleted_at REAL              -- NULL = still there
    );
    CREATE INDEX messages_channel_time ON messages (channel_id, created_at);
    CREATE INDEX messages_author ON messages (author_id);

    CREATE TABLE channel_settings (
        channel_id INTEGER PRIMARY KEY,
        guild_id INTEGER,
        always_answer INTEGER NOT NULL DEFAULT 0 CHECK (always_answer IN (0, 1)),
        updated_at REAL NOT NULL
    );
    """,
    # 3: whom (and which message) a reply of Muninn answers, so forget-all takes the replies
    # too, even after history trimming dropped the message they answered.
    """
    ALTER TABLE messages ADD COLUMN reply_to INTEGER;
    ALTER TABLE messages ADD COLUMN reply_to_author INTEGER;
    CREATE INDEX messages_reply_to_author ON messages (reply_to_author) WHERE reply_to_author IS NOT NULL;
    """,
    # 4: an index from a message to the memories learned from it (the JSON list in
    # memories.source_message_ids stays the truth; triggers keep this in step, like the FTS
    # table), so a deleted message finds its memories without scanning every row.
    """
    CREATE TABLE memory_sources (
        message_id TEXT NOT NULL,
        memory_id INTEGER NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
        PRIMARY KEY (message_id, memory_id)
    ) WITHOUT ROWID;
    CREATE INDEX memory_sources_memory ON memory_sources (memory_id);
    CREATE TRIGGER memory_sources_insert AFTER INSERT ON memories BEGIN
        INSERT OR IGNORE INTO memory_sources SELECT CAST(value AS TEXT), new.id FROM json_each(new.source_message_ids);
    END;
    CREATE TRIGGER memory_sources_update AFTER UPDATE OF source_message_ids ON memories BEGIN
        DELETE FROM memory_sources WHERE memory_id = new.id;
        INSERT OR IGNORE INTO memory_sources SELECT CAST(value AS TEXT), new.id FROM json_each(new.source_message_ids);
    END;
    INSERT OR IGNORE INTO memory_sources
        SELECT CAST(j.value AS TEXT), m.id FROM memories m, json_each(m.source_message_ids) j;
    """,
    # 5: every vector stored or removed is logged, so the in-memory vector search of each
    # process (bot/memory/vectors/cache.py) applies what others wrote; pruned by maintenance.
    # And a person's personal visibility keys straight from an index (scope.personal_keys):
    # a heavy user's DM recall listed thousands of rows to find a handful of keys.
    """
    CREATE TABLE vector_changes (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        memory_id INTEGER NOT NULL
    );
    CREATE INDEX memories_owner_keys ON memories (owner_id, scope, vis_key) WHERE archived_at IS NULL;
    """,
    # 6: people who paused Muninn's memory of them (/memory pause): nothing of theirs is
    # extracted or stored until they resume; `notified` = Muninn has told them once.
    """
    CREATE TABLE memory_pauses (
        user_id INTEGER PRIMARY KEY,
        paused_at REAL NOT NULL,
        notified INTEGER NOT NULL DEFAULT 0 CHECK (notified IN (0, 1))
    );
    """,
    # 7: nothing for SQLite. PostgreSQL's migration 7 keeps vectors in their table row;
    # the numbers stay aligned so a version means the same data on both backends.
    """
    -- (no statement)
    """,
    # 8: nothing for SQLite (one writer at a time: `seq` is in commit order). PostgreSQL's
    # migration 8 logs vector changes by transaction, for its processes' vector caches.
    """
    -- (no statement)
    """,
    # 9: nothing for SQLite. PostgreSQL's migration 9 drops its HNSW index (the vector caches
    # answer; inserting into the graph was most of a fact write's server time).
    """
    -- (no statement)
    """,
    # 10: nothing for SQLite (its vectors follow their memory's key through vector_keys.py at
    # start). PostgreSQL's migration 10 makes its trigger that moves a vector to its memory's new key.
    """
    -- (no statement)
    """,
    # 11: nothing for SQLite (FTS5 walks a word's matches newest first by itself). PostgreSQL's
    # migration 11 indexes (vis_key, id) with text_search for the common-word window.
    """
    -- (no statement)
    """,
    # 12: a memory's visibility key by id,
    # much smaller than the table. The keyword path checks each FTS match here (fts.plan):
    # reading the match's row cost a page read per match once a write emptied the reader's
    # page cache (it dominated the busy channel's keyword step).
    """
    CREATE INDEX memories_id_vis ON memories (id, vis_key, archived_at);
    """,
    # 13: nothing for SQLite (FTS5 merges its segments itself). PostgreSQL's migration 13 turns
    # off its keyword index's pending list.
    """
    -- (no statement)
    """,
    # 14: nothing for SQLite. PostgreSQL's migration 14 indexes (vis_key, text_search) in one GIN
    # index and keeps word statistics of active memories (its keyword path's estimates).
    """
    -- (no statement)
    """,
    # 15: servers Muninn was removed from (bot/memory/sql/guilds.py): maintenance purges what it
    # kept of one once it has been gone MUNINN_GUILD_RETENTION_DAYS, unless it was added back
    # (the row goes). The guild indexes let that purge, and the start-up check of which servers
    # the database knows, find a server's rows without reading every memory and message.
    """
    CREATE TABLE IF NOT EXISTS guild_departures (
        guild_id INTEGER PRIMARY KEY,
        departed_at REAL NOT NULL    -- unix seconds: removed then, or found gone at a start then
    );
    CREATE INDEX IF NOT EXISTS memories_guild ON memories (guild_id) WHERE guild_id IS NOT NULL;
    CREATE INDEX IF NOT EXISTS messages_guild ON messages (guild_id) WHERE guild_id IS NOT NULL;
    """,
    # 16: what one person taught in one channel lately, by index alone: every fact write counts
    # it for MUNINN_LEARN_PER_DAY (store.taught_since), and a heavy user's memories are many.
    """
    CREATE INDEX IF NOT EXISTS memories_taught ON memories (owner_id, channel_id, created_at);
    """,
    # 17: the people a memory names besides its owner, by user id (a fact of Bob's
    # that names Dave: "Bob lent Dave 50 euros"), so that Dave finds it in his export and may
    # erase it (/memory forget, forget-all); the rows go with their memory.
    """
    CREATE TABLE IF NOT EXISTS memory_mentions (
        memory_id INTEGER NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
        user_id INTEGER NOT NULL,
        PRIMARY KEY (memory_id, user_id)
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS memory_mentions_user ON memory_mentions (user_id);
    """,
    # 18: The write policy of shared memory (bot/lifecycle/room_policy.py): per-server settings (the
    # room memory mode: moderated, open or off), who vouched for a room memory (set by a moderator,
    # or a member's claim a moderator approved), and the moderators' actions, never a memory's text.
    # A room claim waiting for approval is an archived memory (archive_reason 'pending approval'):
    # every path that surfaces memories already leaves archived ones out.
    """
    CREATE TABLE IF NOT EXISTS guild_settings (
        guild_id INTEGER NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (guild_id, key)
    );
    CREATE TABLE IF NOT EXISTS memory_approvals (
        memory_id INTEGER PRIMARY KEY REFERENCES memories (id) ON DELETE CASCADE,
        how TEXT NOT NULL CHECK (how IN ('set', 'approved')),
        moderator_id INTEGER,        -- who set or approved it; NULL once that person was forgotten
        approved_at REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS memory_approvals_moderator ON memory_approvals (moderator_id);
    CREATE TABLE IF NOT EXISTS moderation_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        guild_id INTEGER,
        channel_id INTEGER NOT NULL,
        moderator_id INTEGER NOT NULL,
        action TEXT NOT NULL CHECK (action IN ('forget', 'approve', 'reject', 'mode:moderated', 'mode:open',
                                               'mode:off')),
        memory_id INTEGER            -- no reference: the log outlives the memory
    );
    CREATE INDEX IF NOT EXISTS moderation_log_channel ON moderation_log (channel_id, id);
    CREATE INDEX IF NOT EXISTS memories_pending ON memories (vis_key, id) WHERE archive_reason = 'pending approval';
    """,
    # 19: forgetting that is complete and fair. `memory_teachers`: everyone who taught a room memory
    # (its first teacher, and each person whose same fact reinforced it since), when they first
    # did and through which of their messages, so that one teacher's forget-all or deleted
    # message leaves the memory to the others (bot/memory/sql/teachers.py); filled from each room
    # memory's owner. `reply_context`: whose messages were in the conversation each of Muninn's
    # replies answered from (the prompt's history), so that a person's forget-all finds the
    # replies that may repeat their words even after the history was pruned; filled for the
    # replies already stored from the 100 messages before each (the most MUNINN_HISTORY_LIMIT
    # allows) and the person each answered.
    """
    CREATE TABLE IF NOT EXISTS memory_teachers (
        memory_id INTEGER NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
        user_id INTEGER NOT NULL,
        first_taught_at REAL NOT NULL,                  -- unix seconds
        source_message_ids TEXT NOT NULL DEFAULT '[]',  -- JSON list: their messages it was learned from
        PRIMARY KEY (memory_id, user_id)
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS memory_teachers_user ON memory_teachers (user_id);
    INSERT OR IGNORE INTO memory_teachers (memory_id, user_id, first_taught_at, source_message_ids)
        SELECT id, owner_id, created_at, source_message_ids FROM memories WHERE scope = 'room' AND owner_id IS NOT NULL;

    CREATE TABLE IF NOT EXISTS reply_context (
        reply_id INTEGER NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
        author_id INTEGER NOT NULL,
        PRIMARY KEY (reply_id, author_id)
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS reply_context_author ON reply_context (author_id);
    INSERT OR IGNORE INTO reply_context (reply_id, author_id)
        SELECT w.id, j.value FROM (
            SELECT id, role, json_group_array(author_id) FILTER (WHERE role = 'user') OVER (
                PARTITION BY channel_id ORDER BY created_at, id ROWS BETWEEN 100 PRECEDING AND 1 PRECEDING) AS authors
            FROM messages) w, json_each(w.authors) j
        WHERE w.role = 'assistant';
    INSERT OR IGNORE INTO reply_context (reply_id, author_id)
        SELECT id, reply_to_author FROM messages WHERE role = 'assistant' AND reply_to_author IS NOT NULL;
    """,
    # 20: the operator's console (`muninn web`): what it did, when, to which memory or person; never a
    # memory's text, as the moderators' log. Its counts by channel and by person read indexes only:
    # memories_place (new) and memories_owner, widened by archived_at (a superset of the old one,
    # so every query that used it still does); its charts of what was learned per day, memories_created.
    """
    CREATE TABLE IF NOT EXISTS console_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        action TEXT NOT NULL CHECK (action IN ('forget', 'restore', 'approve', 'reject', 'export-user',
                                               'forget-user')),
        memory_id INTEGER,
        user_id INTEGER
    );
    CREATE INDEX IF NOT EXISTS memories_place ON memories (channel_id, guild_id, scope, archive_reason, archived_at);
    DROP INDEX IF EXISTS memories_owner;
    CREATE INDEX IF NOT EXISTS memories_owner ON memories (owner_id, scope, archived_at);
    CREATE INDEX IF NOT EXISTS memories_created ON memories (created_at, scope);
    """,
    # 21: Settings per channel and thread, changed from Discord (bot/memory/sql/options.py): one row per
    # channel and setting (channel_options) instead of one always-answer column (channel_settings).
    # A channel opted in to always-answer keeps answering every message ('every'); one opted out
    # answers mentions only ('mentions'). Re-runnable: once the old table is gone, an empty one
    # stands in for the copy.
    """
    CREATE TABLE IF NOT EXISTS channel_settings (
        channel_id INTEGER PRIMARY KEY,
        guild_id INTEGER,
        always_answer INTEGER NOT NULL DEFAULT 0,
        updated_at REAL NOT NULL
    );
    CREATE TABLE IF NOT EXISTS channel_options (
        channel_id INTEGER NOT NULL,
        guild_id INTEGER,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (channel_id, key)
    );
    CREATE INDEX IF NOT EXISTS channel_options_guild ON channel_options (guild_id);
    INSERT OR IGNORE INTO channel_options (channel_id, guild_id, key, value, updated_at)
        SELECT channel_id, guild_id, 'answer', CASE always_answer WHEN 1 THEN 'every' ELSE 'mentions' END, updated_at
        FROM channel_settings;
    DROP TABLE channel_settings;
    """,
    # 22: the second clock: when what a memory tells happens (bot/memory/clocks.py), as ISO 8601 text,
    # a date or an interval of dates ("2026-03-05", "2026-03-09/2026-03-15"); NULL when it names none.
    # The index holds only dated memories: recall's search for events on a date a question names.
    """
    ALTER TABLE memories ADD COLUMN happens_on TEXT;
    CREATE INDEX IF NOT EXISTS memories_happens ON memories (vis_key, happens_on)
        WHERE happens_on IS NOT NULL AND archived_at IS NULL;
    """,
    # 23: nothing for SQLite. PostgreSQL's migration 23 splits an index whose rows could not hold
    # the words of the longest memories.
    """
    SELECT 1;
    """,
    # 24: the database's instance token: a random name of its own, so a vector snapshot file
    # (bot/memory/vectors/snapshot.py) made from another database is told apart and never served
    """
    INSERT OR IGNORE INTO meta(key, value) VALUES ('instance', lower(hex(randomblob(16))));
    """,
]


def schema_version(conn: apsw.Connection) -> int:
    """The schema version the file is at (its user_version; 0: a new file)."""
    version: Any = conn.execute("PRAGMA user_version").fetchall()[0][0]
    return int(version)


def migrate(conn: apsw.Connection) -> int:
    """Apply every migration newer than the database; returns the resulting version."""
    current = schema_version(conn)
    if current > len(MIGRATIONS):
        raise RuntimeError(
            f"database schema version {current} is newer than this Muninn ({len(MIGRATIONS)}); upgrade Muninn")
    for number in range(current + 1, len(MIGRATIONS) + 1):
        with write_transaction(conn):  # one transaction per migration
            if schema_version(conn) >= number:
                continue  # another process applied it while we waited for the lock
            conn.execute(MIGRATIONS[number - 1])
            conn.execute(f"PRAGMA user_version = {number}")
    if current == 0:  # one line, not one per migration: a first start stays quiet
        log.debug("created the database schema (version %d)", len(MIGRATIONS))
    elif current < len(MIGRATIONS):
        log.info("upgraded the database schema from version %d to %d", current, len(MIGRATIONS))
    return len(MIGRATIONS)
