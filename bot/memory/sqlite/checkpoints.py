"""WAL checkpoints off the commit path.

SQLite's automatic checkpoint runs inside the commit that pushes the WAL past 1,000 pages, on
the writer's thread, where the longest ones take far longer than a recall, and whatever
waited for the writer (a recall's touch) waited for it too.
Here the writer stops checkpointing (`wal_autocheckpoint` off; our WAL hook takes its place)
and, once the WAL has grown another `EVERY_PAGES` pages past what the last checkpoint saw, a
PASSIVE checkpoint (it never waits for readers or the writer) is queued on the engine's
background thread, at most one at a time. A checkpoint copies committed pages into the file: a
failed one loses nothing (the pages stay in the WAL) and the next one tries again.

SQLite starts the WAL over at a write that begins once every page in it has been copied. Inside
the commit that was always so; from another thread, in a burst of writes the next write has
begun before the checkpoint ends, and the WAL grew without end (where the automatic
checkpoint kept it near 1,000 pages). So a background checkpoint that
caught up with a WAL longer than RESTART_AFTER x EVERY_PAGES asks for a RESTART checkpoint
without waiting (busy timeout 0): it takes the write lock for the few pages written meanwhile,
or, when the writer or a reader is busy, gives up at once and is tried again after the next commit.

Other processes on the same file checkpoint their own commits; a reader of any process that
still uses old pages only makes a PASSIVE checkpoint stop short of them (the next one goes on).

`MUNINN_WAL_CHECKPOINT=inline` (an A/B switch for bench/tail.py, not a setting) runs the same
checkpoint inside the commit, as SQLite's automatic checkpoint does, and records it alike.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, cast

import apsw

from bot.memory.connection import Connection
from bot.memory.sqlite.db import BUSY_TIMEOUT_MS

log = logging.getLogger(__name__)

EVERY_PAGES = 1000  # SQLite's own automatic checkpoint threshold
RESTART_AFTER = 2   # x EVERY_PAGES: a WAL this long is started over once a checkpoint has caught up (inline: near EVERY_PAGES)
# x EVERY_PAGES grown past the last checkpoint while one still waits for the background thread
# (busy with a long job, such as the start-up warm of a big database): the writer checkpoints
# itself, as SQLite would have, rather than let the WAL grow without end.
INLINE_AFTER = 4
HISTORY = 256       # checkpoints remembered for the benchmarks and tests

# Runs `job(connection)` on another thread, later (the engine's loader, Engine._load_in_background)
Background = Callable[[Callable[[Connection], object]], None]


def inline_wanted() -> bool:
    """Whether MUNINN_WAL_CHECKPOINT=inline asks for checkpoints inside the commit."""
    return os.environ.get("MUNINN_WAL_CHECKPOINT", "").strip().lower() == "inline"


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint that ran: where, when (perf_counter), and SQLite's answer."""
    thread: str
    started: float
    ended: float
    wal_pages: int     # frames in the WAL (-1: the connection was not in WAL mode)
    copied_pages: int  # of them, copied into the database file


class Checkpoints:
    """The WAL hook of one writer connection and the checkpoints it queues."""

    def __init__(self, background: Background | None, *, every_pages: int | None = None,
                 inline: bool | None = None) -> None:
        self.every_pages = EVERY_PAGES if every_pages is None else every_pages
        self.inline = inline_wanted() if inline is None else inline
        self._background = background
        self._lock = threading.Condition()
        self._asked_at = 0        # WAL pages when the last checkpoint was asked for
        self._queued = False      # one waits on the background thread
        self._running = False
        self._paused = 0          # the writer runs a checkpoint of its own (pause)
        self._closed = False
        self.history: deque[Checkpoint] = deque(maxlen=HISTORY)
        self.skipped = 0          # commits past the threshold while one was queued or running
        self.restarts = 0         # RESTART checkpoints that succeeded
        self.stale = 0            # checkpoints the writer ran itself: the queued one waited INLINE_AFTER x every_pages
        self._restart_wanted = False  # one found the writer or a reader busy: try again after the next commit

    def install(self, conn: apsw.Connection) -> None:
        """Take over the writer's checkpoints (the pragma first: setting it replaces the hook)."""
        if self._background is None and not self.inline:
            return  # nowhere to run them: SQLite's automatic checkpoint stays
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.set_wal_hook(self._committed)

    def _committed(self, conn: apsw.Connection, name: str, pages: int) -> int:
        """SQLite's WAL hook, on the writer's thread after each commit: cheap, and never raises
        (an exception here would make a commit that has happened look failed)."""
        try:
            due = self._due(pages)
            if due == "inline":
                self._run_here(conn, name)
            elif due == "queue":
                assert self._background is not None
                self._background(lambda reader: self._run_queued(cast(apsw.Connection, reader), name, restart=True))
        except Exception:  # the write is committed; a checkpoint can wait
            log.exception("could not start a WAL checkpoint; the writes are safe in the WAL")
            with self._lock:
                self._queued = False
        return apsw.SQLITE_OK

    def _due(self, pages: int) -> str | None:
        """What this commit does about the WAL: None, "queue" a background checkpoint, or run
        one "inline" (MUNINN_WAL_CHECKPOINT=inline, or the queued one waited too long)."""
        with self._lock:
            if pages < self._asked_at:
                self._asked_at = 0  # the WAL started over after a complete checkpoint
                self._restart_wanted = False
            grown = pages - self._asked_at >= self.every_pages
            if self._closed or not (grown or self._restart_wanted):
                return None
            if self._queued and not self._running and not self._paused \
                    and pages - self._asked_at >= INLINE_AFTER * self.every_pages:
                self._queued = False   # the background thread finds it gone (_run_queued)
                self._running = True
                self.stale += 1
                return "inline"
            if self._queued or self._running or self._paused:
                self.skipped += 1
                return None
            self._asked_at = pages
            if self.inline:
                self._running = True
                return "inline"
            self._queued = True
            return "queue"

    def _run_here(self, conn: apsw.Connection, name: str) -> None:
        try:
            self._run(conn, name)
        finally:
            with self._lock:
                self._running = False
                self._lock.notify_all()

    def _run_queued(self, conn: apsw.Connection, name: str, *, restart: bool = False) -> None:
        with self._lock:
            while self._paused or self._running:
                self._lock.wait()
            if not self._queued or self._closed:  # the writer's close (or a stale wait) ran it already
                return
            self._queued = False
            self._running = True
        try:
            self._run(conn, name, restart=restart)
        finally:
            with self._lock:
                self._running = False
                self._lock.notify_all()

    def _run(self, conn: apsw.Connection, name: str, *, restart: bool = False) -> None:
        started = time.perf_counter()
        try:
            wal, copied = conn.wal_checkpoint(name, apsw.SQLITE_CHECKPOINT_PASSIVE)
            if restart and copied == wal >= RESTART_AFTER * self.every_pages:
                wal, copied = self._restart(conn, name, wal, copied)
        except apsw.BusyError:  # another connection (of any process) is checkpointing right now
            log.debug("WAL checkpoint skipped: another connection is running one")
            return
        except apsw.Error as exc:
            log.warning("could not checkpoint the WAL (%s); the writes are safe in the WAL and the next "
                        "checkpoint tries again", exc)
            return
        with self._lock:  # the next one when the WAL has grown another every_pages past what this one saw
            self._asked_at = max(self._asked_at, wal)
        self.history.append(Checkpoint(threading.current_thread().name, started, time.perf_counter(), wal, copied))

    def _restart(self, conn: apsw.Connection, name: str, wal: int, copied: int) -> tuple[int, int]:
        conn.set_busy_timeout(0)
        try:
            wal, copied = conn.wal_checkpoint(name, apsw.SQLITE_CHECKPOINT_RESTART)
            self.restarts += 1
            self._restart_wanted = False
        except apsw.BusyError:  # the writer is in a transaction or a reader still reads the WAL: after the next commit
            self._restart_wanted = True
        finally:
            conn.set_busy_timeout(BUSY_TIMEOUT_MS)
        return wal, copied

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No background checkpoint runs inside the block: the writer's own TRUNCATE checkpoint
        (store.scrub) would find the checkpoint lock taken and silently leave the WAL as it is."""
        with self._lock:
            self._paused += 1
            while self._running:
                self._lock.wait()
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1
                self._lock.notify_all()

    def close(self, conn: apsw.Connection) -> None:
        """The writer closes: wait for a checkpoint that is running, run one still queued here
        (the engine's background thread skips jobs once it closes), so the file is left tidy."""
        with self._lock:
            self._closed = True
            while self._running:
                self._lock.wait()
            queued, self._queued = self._queued, False
            self._running = queued
        if queued:
            self._run_here(conn, "main")
