"""The storage interface under the engine: what the engine needs from a database, per backend.

The engine (threads, retries, embeddings), the scope rule (scope.py), the retrieval steps'
arithmetic (fusion, the neighbour loan, the graph walk's choice, ranking, the touch floor)
stay one code path above this; a backend supplies connections and the SQL. Two backends:
  SQLite      bot/memory/sqlite/backend.py  (the default; wraps the existing modules)
  PostgreSQL  bot/memory/postgres/backend.py (MUNINN_DATABASE_URL=postgresql://...)

Every operation takes the connection it runs on first: the engine keeps one writer
connection on its writer thread and a few read connections (as SQLite's WAL readers), and
a connection is only ever used by one thread at a time. Writes are one transaction each.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Protocol, Sequence, TypeVar

from bot.memory import records
from bot.memory.connection import Connection
from bot.memory.recall.retrieval import Candidate
from bot.memory.scope import Viewer
from bot.memory.vectors.index import IndexInfo

ConnT = TypeVar("ConnT")  # a backend's own connection type
SCRUBBED = ("memories", "messages")  # what a scrub cleans up after, unless told less


@dataclass
class PlanState:
    """Storage.plan_state's answer."""
    mark: Any                       # where the vector changes stand now (begin_fact_write checks it)
    info: IndexInfo | None          # current_index(model)
    personal: dict[int, list[str]]  # owner -> scope.personal_keys (the update check searches all of them)
    same_words: list[list[tuple[int, str]]]  # per probe: keyword_search(words, [vis_key], all_words=True)
    # (owner, channel) -> what they taught there since plan_state's `since` (store.taught_since; MUNINN_LEARN_PER_DAY)
    taught: dict[tuple[int, int], int] = field(default_factory=dict)


class Storage(Protocol[ConnT]):
    """What the engine needs from a database; each backend with its own connection type."""

    name: str
    row_refusals: tuple[type[Exception], ...]  # the database refused a row (a constraint, a value too big)

    # -- connections -------------------------------------------------------------
    def open_writer(self) -> ConnT:
        """A new connection for the engine's one writer thread; the schema is migrated on it first."""
    def open_reader(self) -> ConnT:
        """A new read connection (the engine keeps a few, for recalls)."""
    def close(self, conn: ConnT) -> None:
        """Close a connection this backend opened (SQLite's writer finishes its checkpoints first)."""
    def lost(self, conn: ConnT, error: BaseException) -> bool:
        """True when `error` means the connection itself is gone (a server restart, a failover,
        a dropped network): the engine then opens a new one and runs the job again."""
    def prepare(self, conn: ConnT) -> None:
        """Once at start, on the writer: schema upgrades beyond the migrations."""
    def where(self) -> str:
        """The database, for log lines and `muninn stats` (never a password)."""
    def shares_readers(self) -> bool:
        """Whether read connections see the writer's commits (False: an in-memory SQLite)."""

    # -- the vector index ----------------------------------------------------------
    def index_info(self, conn: ConnT) -> IndexInfo | None:
        """The vector index (model, dimension), or None while there is none."""
    def index_for(self, conn: ConnT, model: str, dim: int) -> IndexInfo | None:
        """The index that `dim`-dimensional vectors of `model` belong in, created with the first embedding;
        None when they do not fit (another model or size): the memory is then stored without a vector."""
    def reset_index(self, conn: ConnT, model: str, dim: int) -> None:
        """Drop every vector and start an index for `model` and `dim` (`muninn reindex`); recall
        says "partial" until the backfill has embedded every memory again (mark_reindex_done)."""
    def index_state(self, conn: ConnT) -> tuple[IndexInfo | None, bool]:
        """(index_info, reindex_pending) as of one moment: what each recall reads (PostgreSQL: one round trip)."""
    def mark_reindex_done(self, conn: ConnT) -> None:
        """Every active memory has its vector again: recall stops saying "partial"."""
    def warm(self, conn: ConnT, info: IndexInfo, stop: threading.Event) -> int:
        """Load the vector cache's keys that fit its budget, until `stop`
        is set; returns how many keys were loaded (0 without a cache)."""
    def neighbours_many(self, conn: ConnT, info: IndexInfo, items: Sequence[tuple[int, str]],
                        k: int) -> dict[int, list[tuple[int, float]]]:
        """For each (id, vis_key): its k nearest under that key, as (id, cosine)."""

    # -- what the lifecycle's write rules need (bot/lifecycle/writes.py, fact_store.py) ----
    def current_index(self, conn: ConnT, model: str) -> IndexInfo | None:
        """The vector index if it was made with `model` (else None: a reindex is pending)."""
    def knn(self, conn: ConnT, info: IndexInfo, vector: Sequence[float], keys: list[str],
            k: int) -> list[tuple[int, float]]:
        """The k nearest active memories under `keys`: [(id, L2 distance)], nearest first."""
    def similar_to_memory(self, conn: ConnT, info: IndexInfo, memory_id: int, keys: list[str],
                          k: int) -> list[tuple[int, float]]:
        """The k nearest active memories under `keys` to a stored memory's own vector,
        itself left out: [(id, L2 distance)], nearest first ([] when it has no vector)."""
    def plan_state(self, conn: ConnT, model: str, owners: Sequence[int] = (),
                   probes: Sequence[tuple[str, list[str]]] = (), same_text_limit: int = 0,
                   taught: Sequence[tuple[int, int]] = (), since: float = 0.0) -> PlanState:
        """What planning a fact write reads first, as of one moment (PostgreSQL: one round trip):
        the change mark, current_index(model), `owners`' personal keys, for each (vis_key,
        words) of `probes` its exact-text duplicate check (as begin_fact_write's), and for each
        (owner, channel) of `taught` store.taught_since(owner, channel, since)."""
    def one_log_read(self, conn: ConnT) -> ContextManager[None]:
        """Within the block, on this thread, the vector cache reads the change log once (its
        first search): the searches of one fact write's planning, whose results the write checks
        against plan_state's mark anyway, read it once instead of once each."""
    def keyword_search(self, conn: ConnT, words: list[str], keys: list[str], *, all_words: bool,
                       limit: int) -> list[tuple[int, str]]:
        """Active memories under `keys` holding every word (oldest first) or any word (most
        relevant first): [(id, text)]. `words` are recall.words.tokens, never raw user text."""
    def begin_fact_write(self, conn: ConnT, keys: Sequence[str], model: str, dim: int | None, mark: Any,
                         probes: Sequence[tuple[str, list[str]]], same_text_limit: int, searched: Sequence[int] = ()
                         ) -> tuple[IndexInfo | None, bool, list[list[tuple[int, str]]]]:
        """The start of a fact write, inside its transaction, in this order: lock `keys` (until
        the transaction ends, no other process stores facts under these visibility keys, so a
        duplicate check and the insert after it see each other's facts); index_for(model, dim)
        (None when `dim` is None); whether the searches of `keys` made when plan_state gave
        `mark` still hold, counting changes committed since by other processes in any order
        (False when `mark` is None): no vector stored or removed since (a backend may count only
        the changes under `keys` and those of the `searched` ids, what those searches found); for
        each (vis_key, words) of `probes`, keyword_search(words, [vis_key], all_words=True,
        limit=same_text_limit) ([] without words). Everything after the locks sees the facts of
        whoever held them before. PostgreSQL: one round trip."""
    def reinforce(self, conn: ConnT, memory_id: int, *, importance: float, sources: list[str],
                  growth: float, now: float, teacher: tuple[int, float, str] | None = None) -> None:
        """A fact was learned again: multiply the memory's stability by `growth`
        (capped), raise its importance to `importance` if that is higher,
        replace its sources with `sources`, and count it as recalled at `now`. `teacher`
        (user id, first taught at, their messages as a JSON list): who taught it this time
        (teachers.upsert_statement), in the same step."""

    # -- writes ------------------------------------------------------------------
    def insert(self, conn: ConnT, memories: Sequence[records.NewMemory], *, base_stability_days: float,
               model: str, vecs: list[list[float]] | None, now: float | None,
               info: IndexInfo | None = None) -> list[int]:
        """`info`: the index this transaction has already read (index_for), not read again."""
    def store_vectors(self, conn: ConnT, model: str, ids: list[int], vecs: list[list[float]]) -> int:
        """Store `model`'s vectors for existing memories (the backfill), in one
        transaction; memories archived or deleted meanwhile are skipped.
        Returns len(ids), or 0 when the vectors do not fit the index."""
    def delete(self, conn: ConnT, memory_ids: Sequence[int]) -> int:
        """Hard-delete memories with their vectors and links; returns how many
        went. Their words may stay in the database's files until a `scrub`."""
    def scrub(self, conn: ConnT, forgotten: Sequence[str] = SCRUBBED) -> None:
        """After a commit that deleted people's words: leave no recoverable trace of them in the
        database's files. `forgotten` says what went ("memories", "messages"): a backend may
        clean only those tables (PostgreSQL rewrites them: postgres/scrub.py)."""
    def finish_scrub(self, conn: ConnT) -> bool:
        """At maintenance: what earlier forgets left unscrubbed (plain forgets: all of it,
        `mark_pending`; edited and deleted messages: the history, MESSAGES_PENDING; PostgreSQL's
        vectors after any forget); True if there was any."""
    def archive(self, conn: ConnT, memory_id: int, reason: str, now: float | None = None) -> None:
        """Take a memory out of retrieval (its vector goes; the row stays, and `restore` brings it back)."""
    def restore(self, conn: ConnT, memory_id: int) -> None:
        """Bring an archived memory back, counted as recalled now; its vector comes back with the next backfill."""
    def touch_many(self, conn: ConnT, recalls: Sequence[tuple[Sequence[int], float]], *, growth: float) -> None:
        """Several recalls' touches (their ids, their time) in one transaction, in order; each
        memory ends as if each touch had been its own (bot/memory/recall/touches.py)."""
    def forget_sources(self, conn: ConnT, message_ids: Sequence[int],
                       learned_before: float | None = None) -> list[int]:
        """Messages were deleted: take them out of the sources of the memories
        learned from them (before `learned_before`, when given) and delete
        the memories learned from nothing else; returns the deleted ids."""
    def add_link(self, conn: ConnT, source_id: int, target_id: int, kind: str, weight: float = 1.0,
                 now: float | None = None) -> bool:
        """store.add_link's rule: never between two people's personal memories (False)."""

    # -- reads -------------------------------------------------------------------
    def get(self, conn: ConnT, memory_id: int) -> records.Memory:
        """A memory by id, archived or not, with no scope check; MemoryNotFound when there is none."""
    def get_many(self, conn: ConnT, memory_ids: Sequence[int]) -> dict[int, records.Memory]:
        """Those of `memory_ids` that exist, by id (archived ones included, no scope check)."""
    def get_visible(self, conn: ConnT, viewer: Viewer, memory_id: int) -> records.Memory:
        """The memory if it is active and `viewer` may see it;
        otherwise MemoryNotFound (never revealing that it exists)."""
    def list_visible(self, conn: ConnT, viewer: Viewer, *, scope: str | None, limit: int,
                     offset: int) -> tuple[list[records.Memory], int]:
        """One page of the active memories `viewer` may see (of `scope`
        only, when given), newest first, and how many there are in all."""
    def memories_of(self, conn: ConnT, user_id: int, scopes: Sequence[str]) -> list[records.Memory]:
        """A person's memories of `scopes` (personal: learned anywhere; room: the ones they
        taught), archived ones included, oldest first: what forget-all and export cover."""
    def existing_external_ids(self, conn: ConnT, ids: Sequence[str]) -> set[str]:
        """Which of these external ids (of an imported data set) are stored already."""
    def refresh_statistics(self, conn: ConnT) -> None:
        """After a bulk write (an import): the database's statistics of the memories read afresh,
        and what recall keeps of them forgotten, so that recall sees the new memories at once."""
    def unembedded(self, conn: ConnT, limit: int) -> list[tuple[int, str]]:
        """Up to `limit` active memories without a vector, as (id, text), lowest id first: the backfill's work."""
    def count_active(self, conn: ConnT) -> int:
        """How many memories are active (not archived)."""
    def stats(self, conn: ConnT) -> dict:
        """The counts `muninn stats` shows: memories (active, archived, embedded, without
        a vector), links, by scope and by kind, and the index's model and dimension."""

    # -- retrieval's SQL (the arithmetic around it is shared: retrieval.py, ranking.py) ----
    def visible_keys(self, conn: ConnT, viewer: Viewer) -> list[str]:
        """The visibility keys `viewer` may read, global first (scope.visible_keys: the one scope rule)."""
    def fts_candidates(self, conn: ConnT, query: str, keys: list[str], limit: int,
                       as_of: float | None) -> list[Candidate]:
        """The keyword path: up to `limit` active memories under `keys` matching the
        query's searched words, best first (only those stored by `as_of`, when given)."""
    def keyword_step(self, conn: ConnT, query: str, keys: list[str], limit: int,
                     as_of: float | None) -> tuple[list[Candidate], tuple[IndexInfo | None, bool]]:
        """A recall's keyword hits (fts_candidates) and the vector index's state (index_state) that
        its search step reads next: PostgreSQL reads both in one statement."""
    def searched_words(self, conn: ConnT, words: list[str]) -> list[str]:
        """Which of the query's words the keyword path searches (SQLite leaves out common ones)."""
    def vector_candidates(self, conn: ConnT, info: IndexInfo, vector: list[float], keys: list[str],
                          limit: int, as_of: float | None) -> list[Candidate]:
        """The vector path: the `limit` active memories under `keys` nearest to the
        query vector, nearest first (only those stored by `as_of`, when given)."""
    def spread_to_neighbours(self, conn: ConnT, ranked: list[Candidate], keys: list[str], share: float,
                             as_of: float | None) -> list[Candidate]:
        """retrieval.spread_to_neighbours: each hit lends part of its fused score (`share` to the
        nearest) to the candidates stored around it under its key; they come back re-ranked."""
    def final_order(self, conn: ConnT, candidates: list[Candidate], now: float, **options: Any) -> list[Candidate]:
        """ranking.final_order: re-rank by relevance x time factor x date factor (`options`: its keywords)."""
    def graph_neighbours(self, conn: ConnT, seeds: list[Candidate], keys: list[str], limit: int,
                         as_of: float | None, admit: Callable[[Candidate], bool] | None = None) -> list[Candidate]:
        """The 1-hop walk of the link graph from `seeds`: up to `limit` linked memories that are
        active and under `keys` (and that `admit` takes, when given: the fair share)."""
    def measure_similarity(self, conn: ConnT, vector: Sequence[float], chosen: list[Candidate],
                           info: IndexInfo | None) -> None:
        """Give each of `chosen` that has no cosine yet its cosine to the query `vector`,
        from its stored vector (one without a vector, or no index: left as it is)."""

    # -- privacy -------------------------------------------------------------------
    def pause(self, conn: ConnT, user_id: int) -> bool:
        """Stop keeping anything of `user_id`; False when it already
        was paused (the first pause's time and notice state stay)."""
    def resume(self, conn: ConnT, user_id: int) -> bool:
        """End a pause; False when `user_id` was not paused."""
    def paused_users(self, conn: ConnT) -> set[int]:
        """The ids of everyone whose memory is paused."""
    def take_pause_notice(self, conn: ConnT, user_id: int) -> bool:
        """True once per pause: the first time Muninn answers someone whose memory is paused."""
    def personal_from_messages(self, conn: ConnT, owner_id: int, message_ids: Sequence[int]) -> list[records.Memory]:
        """The owner's active personal memories learned from any of these messages."""
    def own_memory(self, conn: ConnT, owner_id: int, memory_id: int) -> records.Memory:
        """A memory whose owner is this person (personal, or a room memory they taught),
        archived or not; MemoryNotFound otherwise, with no hint whether the id exists."""
    def forget_personal(self, conn: ConnT, owner_id: int, memory_ids: Sequence[int]) -> int:
        """Delete those of `memory_ids` that are the owner's personal memories (scrubbed when any went); returns how many."""
    def last_message_of(self, conn: ConnT, channel_id: int, author_id: int, before: int | None) -> int | None:
        """The id of the author's latest message in the channel's history other than message `before`, or None."""
    def drop_own_message(self, conn: ConnT, author_id: int, message_id: int) -> bool:
        """Take one of the author's messages out of the conversation
        history, then scrub; False when the author has no such message."""

    # -- several processes on one database -------------------------------------------
    def take_lease(self, conn: ConnT, name: str, holder: str, seconds: float) -> bool:
        """Take the lease `name` for `seconds`, or renew it if `holder` has it; False if another holds it."""
    def release_lease(self, conn: ConnT, name: str, holder: str) -> bool:
        """Give the lease up if `holder` has it (True), so another process may take it at once."""
    def lease_holder(self, conn: ConnT, name: str) -> str | None:
        """Who holds the lease now (None: nobody, or it expired)."""
    def last_run(self, conn: ConnT, job: str) -> float | None:
        """When `job` last finished, in unix seconds, whichever process ran it (None: never)."""
    def record_run(self, conn: ConnT, job: str, at: float) -> None:
        """Record that `job` finished at `at` (unix seconds), for every process's `last_run`."""


_DEFAULT: list[Storage[Any]] = []  # the SQLite backend, registered by bot/memory/sqlite/__init__.py


def register_default(storage: Storage[Any]) -> None:
    """The backend of connections that do not name theirs (SQLite's plain apsw connections)."""
    _DEFAULT[:] = [storage]


def storage_of(conn: Connection) -> Storage[Any]:
    """The backend a connection belongs to, for the portable SQL that gets only the connection
    (a PostgreSQL connection names its backend; any other is SQLite's)."""
    found = getattr(conn, "storage", None)
    if found is not None:
        return found
    return _DEFAULT[0]
