"""The memory engine: one object that the bot, the command line and the benchmarks share.

All writes run on one dedicated thread and connection (apsw releases the GIL), so a slow
disk or a large search never blocks the event loop; network calls to Ollama run on
the loop. Recall's searches run on a small pool of read connections beside it (WAL lets
readers work while the writer commits), so a long write such as maintenance does not hold
up replies; only recall's touch goes through the writer. All connections share one
`VectorCache` (numpy over each visibility key's vectors). `recall` is the one retrieval
function of the project.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

import apsw

from bot.llm.ollama import (
    OllamaUnavailable,
)
from bot.llm.servers import LLMClient, make_client
from bot.logs import Throttle
from bot.memory import records
from bot.memory.access import NamedAccess
from bot.memory.backends import storage_for
from bot.memory.console import Console
from bot.memory.embeddings import Embedding
from bot.memory.errors import DatabaseBusy, DatabaseError, explain
from bot.memory.guilds import Guilds
from bot.memory.messages import Messages
from bot.memory.options import Options
from bot.memory.recall import touches
from bot.memory.recalling import Recalling, waiting_once
from bot.memory.rooms import Rooms
from bot.memory.sql import store, transactions
from bot.memory.sql.marks import mark_pending
from bot.memory.sql.rooms import settle
from bot.memory.storage import Connection
from bot.memory.vectors import gc_pauses
from bot.memory.vectors import index as vectors
from bot.memory.vectors.cache import VectorCache
from bot.memory.writing.facts import FactWrites
from bot.memory.writing.upkeep import Upkeep
from bot.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

EMBED_BATCH = 32
WRITE_RETRY_DELAYS_S = (1.0, 4.0, 15.0)   # between attempts that each wait one busy timeout (5 s) for the lock


def read_threads(settings: Settings) -> int:
    """How many read connections (and threads) serve reads: MUNINN_DB_READERS, else by backend.
    One process's Python holds one GIL: on SQLite, where a read is CPU in this process, a third
    read thread mostly adds hand-offs of the GIL; PostgreSQL's reads wait on the server, and
    more connections overlap those waits. A SQLite process serving only some of the shards
    shares the machine's cores with the processes serving the others: one reader each leaves
    them to those processes rather than to hand-offs of its own GIL."""
    if settings.db_readers is not None:
        return settings.db_readers
    if settings.database_url:
        return 3
    return 1 if serves_some_shards(settings) else 2


def serves_some_shards(settings: Settings) -> bool:
    """Whether this process serves only some of the bot's shards (MUNINN_SHARD_IDS a part of
    MUNINN_SHARD_COUNT's): other processes serve the rest."""
    return bool(settings.shard_count and settings.shard_ids
                and len(set(settings.shard_ids)) < settings.shard_count)


class Engine(NamedAccess, Embedding, Recalling):
    """The memory engine: opens the database, runs every job off the event loop, recalls."""

    def __init__(self, settings: Settings, ollama: LLMClient | None = None, *, warm: bool = True):
        """`warm`: load the vector cache in the background at start (a long-running bot wants it;
        a one-shot command would only pay for loading what it never searches)."""
        self._warm_at_start = warm
        self.settings = settings
        self.ollama: LLMClient = ollama or make_client(settings)  # chat and embeddings, either kind
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="muninn-db")
        self._conn: Connection | None = None
        self._throttle = Throttle()
        self.vector_cache = VectorCache(settings.vector_cache_mb << 20, codes_min=settings.vector_codes_min,
                                        form=settings.vector_form, partial_min=settings.vector_partial_min)
        self.storage = storage_for(settings, self.vector_cache)  # SQLite, or PostgreSQL (storage.py)
        self.messages = Messages(self)  # the channel history
        self.options = Options(self)    # settings of servers, channels and threads set from Discord
        self.facts = FactWrites(self)   # planning and writing extracted facts
        self.upkeep = Upkeep(self)      # maintenance's jobs
        self.guilds = Guilds(self)      # servers Muninn left, and their purge
        self.rooms = Rooms(self)        # the room memory mode, moderation, attribution
        self.console = Console(self)    # the operator's console (bot/web/)
        # Readers need a database that other connections can open; ":memory:" is one per connection.
        self._shared_file = self.storage.shares_readers()
        self._reader_count = read_threads(settings)  # the readers' threads, and the recalls in flight that fill them
        self._readers = (ThreadPoolExecutor(max_workers=self._reader_count, thread_name_prefix="muninn-read")
                         if self._shared_file else None)
        self._reader_local = threading.local()
        self._reader_conns: list[Connection] = []
        self._reader_lock = threading.Lock()
        self.read_jobs = 0  # jobs run on the read connections (for tests and benchmarks: a recall's hand-offs)
        self._paused: set[int] | None = None  # cache of memory_pauses (this process writes it)
        self._touches = touches.TouchBatcher(self._touch_batch, self._load_untouched)  # concurrent recalls share one writer job
        self._recalls_in_flight = 0
        self._no_recall: asyncio.Event | None = None  # set while no recall is in flight (yield_to_recalls)
        self._warm_stop = threading.Event()
        self._warming: asyncio.Future | None = None
        self._frozen = gc_pauses.FrozenWhileWarm()  # full GC collections skip the warm cache
        # One thread of its own loads the vector cache (the start-up warm, then big cold keys a
        # recall met: vector_cache.INLINE_LOAD_MAX), so the readers stay free for recalls.
        self._loader = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="muninn-vecload")
                        if self._shared_file else None)
        if self._loader is not None:
            self.vector_cache.background = self._load_in_background
        # Maintenance's searches (nearest_neighbours) on a thread and read connection of their own:
        # beside the recalls, never holding a read connection a recall waits for. (A lower nice
        # value for it was tried: with the cores busy elsewhere, a local Ollama say, it would keep
        # the GIL while it waits for a core, and every thread of the bot with it.)
        self._background = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="muninn-background")
                            if self._shared_file else None)
        self.side_reads = 0  # parts of recalls run on another reader (for tests and benchmarks)
        # PostgreSQL's reads wait on the server: a recall's vector search runs on a second reader
        # beside its keyword step (recall/beside.py). SQLite's reads are this process's CPU.
        self.walk_beside = bool(settings.database_url) and self._readers is not None and self._reader_count > 1

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> "Engine":
        """Open the database (running migrations) and warn if the embedding model changed."""
        await self._run(self.storage.prepare)
        info = await self._run(self.storage.index_info)
        if info is not None and info.model != self.settings.embed_model:
            log.warning("the vectors were made with %r but OLLAMA_EMBED_MODEL is %r: vector recall is off "
                        "until you run `muninn reindex`", info.model, self.settings.embed_model)
        elif info is not None and self._loader is not None and self._warm_at_start:
            self._warming = asyncio.get_running_loop().run_in_executor(self._loader, self._warm_cache, info)
        return self

    def _warm_cache(self, info: vectors.IndexInfo) -> int:
        """On a read connection, in the background: load the vector cache (vector_cache.warm)."""
        started = time.perf_counter()
        try:
            loaded = self.storage.warm(self._reader(), info, self._warm_stop)
        except (apsw.Error, DatabaseError) as exc:  # a cold key still loads on first use: nothing is lost
            log.warning("could not warm the vector cache: %s", exc)
            return 0
        log.debug("vector cache warm: %d keys, %.1f MB in %.2f s", loaded, self.vector_cache.nbytes / 1e6,
                  time.perf_counter() - started)
        if not self._warm_stop.is_set():
            self._frozen.warm()
        return loaded

    def _load_in_background(self, job: Callable[[Connection], object]) -> None:
        """The vector cache's loader: `job(connection)` on the loader thread, later."""
        assert self._loader is not None

        def call() -> None:
            if self._warm_stop.is_set():
                return  # closing
            try:
                job(self._reader())
            except apsw.Error as exc:  # the key stays cold and loads on a later search
                log.warning("could not load vectors into the cache: %s", exc)
        self._loader.submit(call)

    async def warmed(self) -> int:
        """Wait until the start-up warm of the vector cache is over; how many keys it loaded."""
        return await self._warming if self._warming is not None else 0

    async def close(self) -> None:
        """Stop the engine: close the Ollama client and the writer connection (on the database thread),
        then, off the loop, wait for the database threads to end and close the read connections;
        the background jobs still queued are dropped. The engine is not usable afterwards."""
        try:
            await self.ollama.close()
            self._warm_stop.set()
            if self._conn is not None:
                conn, self._conn = self._conn, None
                await asyncio.get_running_loop().run_in_executor(self._executor, self.storage.close, conn)
            # off the loop: waiting for a warm or a checkpoint to end must not stall Discord's heartbeats
            await asyncio.to_thread(self._shut_down_threads)
        finally:
            self._frozen.release()  # even when a close step failed: the last engine unfreezes the collector

    def _shut_down_threads(self) -> None:
        self._executor.shutdown(wait=True)
        if self._loader is not None:
            self._loader.shutdown(wait=True, cancel_futures=True)
        if self._background is not None:
            self._background.shutdown(wait=True, cancel_futures=True)
        if self._readers is not None:
            self._readers.shutdown(wait=True)
            with self._reader_lock:
                readers, self._reader_conns = self._reader_conns, []
            for reader in readers:  # idle now: closing from this thread is safe
                self.storage.close(reader)

    async def __aenter__(self) -> "Engine":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = self.storage.open_writer()
        return self._conn

    def _reader(self) -> Connection:
        conn = getattr(self._reader_local, "conn", None)
        if conn is None:
            conn = self.storage.open_reader()
            self._reader_local.conn = conn
            with self._reader_lock:
                self._reader_conns.append(conn)
        return conn

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(conn, *args, **kwargs)` on the database thread."""
        def call() -> T:
            return self._on_live_connection(self._connection, self._drop_writer, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def _on_live_connection(self, opened: Callable[[], Connection], drop: Callable[[Connection], None],
                            fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn` on this thread's connection. When a server connection died under it (a restart,
        a failover), the job runs once more on a new one: the server rolled its transaction
        back (if the server is still down, opening raises one clear line)."""
        conn = opened()
        try:
            return fn(conn, *args, **kwargs)
        except Exception as exc:
            if not self.storage.lost(conn, exc):
                raise
            log.warning("the database connection was lost (%s); reconnecting to %s",
                        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                        self.storage.where())
            drop(conn)
            self.storage.close(conn)
        return fn(opened(), *args, **kwargs)

    def _drop_writer(self, conn: Connection) -> None:
        self._conn = None

    def _drop_reader(self, conn: Connection) -> None:
        self._reader_local.conn = None
        with self._reader_lock:
            self._reader_conns.remove(conn)

    async def _read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run the read-only `fn(conn, *args, **kwargs)` on one of the read connections (it sees
        everything committed when it starts; the writer's open transaction stays invisible)."""
        self.read_jobs += 1
        return await self._read_on(self._readers, fn, *args, **kwargs)

    @property
    def walk_beside(self) -> bool:
        """Whether a recall's reads that can overlap run on several readers at once (recall/beside.py)."""
        return self._walk_beside

    @walk_beside.setter
    def walk_beside(self, on: bool) -> None:
        self._walk_beside = on
        read_beside = getattr(self.storage, "read_beside", None)  # the server's own searches (PostgreSQL)
        if read_beside is not None:
            read_beside(self._beside if on else None)

    def _beside(self, fn: Callable[..., T], *args: Any) -> Future[T] | None:
        """`fn(conn, *args)` on another read connection, not awaited: its Future (recall/beside.py);
        None when as many recalls are in flight as there are readers: each reader is wanted by a
        recall's own job, and a part handed over would only queue behind them."""
        if self._readers is None or self._recalls_in_flight >= self._reader_count:
            return None
        try:
            future = self._readers.submit(self._on_live_connection, self._reader, self._drop_reader, fn, *args)
        except RuntimeError:  # the engine is closing: its readers take no more jobs, the caller reads itself
            return None
        self.side_reads += 1
        return future

    async def _read_on(self, threads: ThreadPoolExecutor | None, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`_read` on `threads` (each thread has its own read connection); None: on the writer."""
        if threads is None:
            return await self._run(fn, *args, **kwargs)

        def call() -> T:
            return self._on_live_connection(self._reader, self._drop_reader, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(threads, call)

    async def nearest_neighbours(self, items: Sequence[tuple[int, str]],
                                 k: int) -> dict[int, list[tuple[int, float]]] | None:
        """For each (memory id, vis_key): its k nearest memories under that key, as (id, cosine),
        computed on a read connection (maintenance's heavy part, off the writer); None when
        there is no usable vector index."""
        def find(conn: Connection) -> dict[int, list[tuple[int, float]]] | None:
            info = self.storage.current_index(conn, self.settings.embed_model)
            return None if info is None else self.storage.neighbours_many(conn, info, items, k)
        return await self._read_on(self._background, find)

    # -- jobs of the layers that keep their own tables here ---------------------
    # The conversation history (bot/memory/sql/history.py) and the lifecycle rules
    # (bot/lifecycle/) keep their SQL in their own modules and run it through these two;
    # everything else (cogs, command line) uses the named methods below.

    async def read(self, job: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a read-only `job(conn, *args, **kwargs)` off the event loop, on a read connection
        (it sees every write that has returned; it may not write)."""
        return await self._read(job, *args, **kwargs)

    async def write(self, job: Callable[..., T], *args: Any, what: str = "write to the database", **kwargs: Any) -> T:
        """Run `job(conn, *args, **kwargs)`, a write that is ONE transaction (so repeating it after
        it never began is safe): when another process keeps the lock past the busy timeout and its
        retries, wait (off the database thread) and try again; in the end log an error naming
        `what` was not written and why, and raise. Nothing a person asked for is dropped silently."""
        for attempt, delay in enumerate((*WRITE_RETRY_DELAYS_S, None), start=1):
            try:
                return await self._run(waiting_once, job, *args, **kwargs)
            except DatabaseBusy as exc:
                if delay is None:
                    log.error("could not %s after %d attempts: %s", what, attempt, exc)
                    raise
                log.warning("could not %s yet (attempt %d): %s; retrying in %.0f s", what, attempt, exc, delay)
                await asyncio.sleep(delay)
            except Exception as exc:
                message = explain(exc)
                if message is not None:  # a full disk, a damaged file: say so in one line
                    log.error("could not %s: %s", what, message)
                raise
        raise AssertionError("unreachable")

    # -- writes --------------------------------------------------------------

    async def remember(self, memory: records.NewMemory) -> int:
        """Store one memory (remember_many with one); returns its id."""
        return (await self.remember_many([memory]))[0]

    async def remember_many(self, memories: Sequence[records.NewMemory], *, now: float | None = None) -> list[int]:
        """Embed (if Ollama can) and store memories in one transaction; a failed embedding
        stores them without vectors, for the backfill to finish later."""
        vecs = await self.embed_or_none([m.text for m in memories])
        return await self.write(self._insert, list(memories), vecs, now, what=f"store {len(memories)} memories")

    def _insert(self, conn: Connection, memories: list[records.NewMemory],
                vecs: list[list[float]] | None, now: float | None) -> list[int]:
        if not any(m.standing or m.mentions for m in memories):
            return self.storage.insert(conn, memories, base_stability_days=self.settings.base_stability_days,
                                       model=self.settings.embed_model, vecs=vecs, now=now)
        now = time.time() if now is None else now
        with transactions.write_transaction(conn):  # the memories, whom they name and their standing land together
            ids = self.storage.insert(conn, memories, base_stability_days=self.settings.base_stability_days,
                                      model=self.settings.embed_model, vecs=vecs, now=now)
            for memory_id, memory in zip(ids, memories, strict=True):
                store.add_mentions(conn, memory_id, memory.mentions)
                settle(conn, memory_id, memory, now)
        return ids

    async def forget(self, memory_ids: Sequence[int], *, scrub: bool = False) -> int:
        """Hard-delete memories; with `scrub`, also rewrite the indexes and the WAL so that no
        trace of their text stays recoverable on disk (slower: for forget-all, not routine).
        Without it the next maintenance run scrubs (`Storage.finish_scrub`)."""
        removed = await self.write(self._delete_and_mark, list(memory_ids), not scrub,
                                   what=f"forget {len(memory_ids)} memories")
        if scrub:
            await self._run(self.storage.scrub, ("memories",))
        return removed

    def _delete_and_mark(self, conn: Connection, memory_ids: list[int], scrub_later: bool) -> int:
        with transactions.write_transaction(conn):  # the delete and its mark land together (a retry finds both or neither)
            removed = self.storage.delete(conn, memory_ids)
            if removed and scrub_later:
                mark_pending(conn)
        return removed

    async def finish_scrub(self) -> bool:
        """What earlier forgets left for maintenance to scrub (PostgreSQL's vectors): storage.py."""
        return await self._run(self.storage.finish_scrub)

    async def archive(self, memory_id: int, reason: str) -> None:
        """Take a memory out of retrieval with `reason` (Storage.archive), on the
        database thread, without the busy retries of `write`; it stays restorable."""
        await self._run(self.storage.archive, memory_id, reason)

    async def restore(self, memory_id: int) -> None:
        """Bring an archived memory back, re-embedding it now if Ollama can (else the backfill will)."""
        await self._run(self.storage.restore, memory_id)
        memory = await self._run(self.storage.get, memory_id)
        vecs = await self.embed_or_none([memory.text])
        if vecs is not None:
            await self._run(self._store_vectors, [memory_id], vecs)

    async def backfill(self, *, batch: int = EMBED_BATCH, progress: Callable[[int], None] | None = None) -> int:
        """Embed active memories that have no vector yet; returns how many were embedded.
        Stops quietly (returning the count so far) when Ollama is unavailable."""
        done = 0
        while True:
            pending = await self._run(self.storage.unembedded, batch)
            if not pending:
                await self._run(self.storage.mark_reindex_done)
                return done
            vecs = await self.embed_or_none([text for _, text in pending])
            if vecs is None:
                return done
            stored = await self._run(self._store_vectors, [mid for mid, _ in pending], vecs)
            if stored == 0:
                return done
            done += stored
            if progress:
                progress(stored)

    def _store_vectors(self, conn: Connection, ids: list[int], vecs: list[list[float]]) -> int:
        return self.storage.store_vectors(conn, self.settings.embed_model, ids, vecs)

    async def reindex(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        """Drop every vector and re-embed all active memories with the configured model."""
        probe = await self.ollama.embed(["muninn reindex probe"])  # fails loudly before anything is dropped
        total = await self._run(self.storage.count_active)
        await self._run(self.storage.reset_index, self.settings.embed_model, len(probe[0]))
        done = 0

        def step(n: int) -> None:
            nonlocal done
            done += n
            if progress:
                progress(done, total)
        count = await self.backfill(progress=step)
        if count < total:
            raise OllamaUnavailable(f"re-indexed {count} of {total} memories; Ollama stopped answering. "
                                    "Run `muninn reindex` again (or let maintenance backfill the rest).")
        return count
