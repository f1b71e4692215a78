"""`muninn backup`: a consistent copy of the SQLite database, taken while the bot runs.

Copying the file is not safe: in WAL mode the latest commits live in `-wal` until a checkpoint,
and a copy made during a write can be torn. SQLite's online backup API copies the database
page by page through a read transaction instead; done in one step, that transaction is one
snapshot: every transaction committed before it began is in the copy, none half-written, and
the bot's writers go on meanwhile (WAL readers never block them). The copy is written next to
the target under a temporary name, private (0600) from its first byte, checked
(`PRAGMA quick_check`), switched to a plain rollback journal so that it is one self-contained
file, and only then renamed to the target.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import apsw

from bot.memory.errors import DatabaseError
from bot.memory.scope import ACTIVE
from bot.memory.sql.queries import query_value
from bot.memory.sqlite.errors import explain
from bot.memory.sqlite.files import FILE_MODE

BUSY_WAIT_S = 30.0   # how long the backup waits for a lock held by a checkpoint or a recovering process


@dataclass(frozen=True)
class BackupReport:
    """What `backup_to` made: where, how many memories (all, and active) are in it, its size,
    how long it took, and SQLite's integrity verdict on the copy ("ok")."""
    path: Path
    memories: int
    active: int
    size: int
    seconds: float
    integrity: str


def timestamped(folder: Path, now: float | None = None) -> Path:
    """The file a backup into `folder` gets: muninn-YYYYmmdd-HHMMSS.db (UTC)."""
    return folder / time.strftime("muninn-%Y%m%d-%H%M%S.db", time.gmtime(now))


def backup_to(source: Path, target: Path) -> BackupReport:
    """Copy the database at `source` to `target` (a new file; a folder gets a timestamped file in
    it) while other processes may be writing it; DatabaseError with one line when it cannot."""
    started = time.monotonic()
    if not source.is_file():
        raise DatabaseError(f"no database at {str(source)!r} (MUNINN_DB_PATH or --db)")
    if target.is_dir():
        target = timestamped(target)
    if target.exists():
        raise DatabaseError(f"{str(target)!r} exists; give a new file name, or a folder for a timestamped file")
    if not target.parent.is_dir():
        raise DatabaseError(f"no folder {str(target.parent)!r} to write the backup in")
    if target.resolve() == source.resolve():
        raise DatabaseError("the backup cannot be the database itself")
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        os.close(os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE))
    except OSError as exc:
        raise DatabaseError(f"cannot write the backup in {str(target.parent)!r}: {exc.strerror}") from exc
    try:
        memories, active, integrity = _copy(source, partial)
        if integrity != "ok":
            raise DatabaseError(f"the copy failed SQLite's integrity check ({integrity}); the database itself may be "
                                "damaged: run `muninn doctor`")
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return BackupReport(target, memories, active, target.stat().st_size, time.monotonic() - started, integrity)


def _copy(source: Path, partial: Path) -> tuple[int, int, str]:
    """The online backup of `source` into the empty file `partial`; its counts and quick_check."""
    try:
        src = apsw.Connection(str(source), flags=apsw.SQLITE_OPEN_READONLY)
    except apsw.Error as exc:
        raise DatabaseError(f"cannot open {str(source)!r}: {explain(exc) or exc}") from exc
    dest = apsw.Connection(str(partial))
    try:
        src.set_busy_timeout(int(BUSY_WAIT_S * 1000))
        deadline = time.monotonic() + BUSY_WAIT_S
        with dest.backup("main", src, "main") as copy:
            while not copy.done:
                try:
                    copy.step(-1)  # every page in one step: one read transaction, one snapshot
                except (apsw.BusyError, apsw.LockedError):
                    if time.monotonic() > deadline:
                        raise DatabaseError(f"{str(source)!r} stayed locked for {BUSY_WAIT_S:.0f} s; "
                                            "try again") from None
                    time.sleep(0.05)
        # The source is in WAL mode and the header says so: make the copy one file of its own.
        dest.execute("PRAGMA journal_mode=DELETE").fetchall()
        integrity = str(dest.execute("PRAGMA quick_check").fetchall()[0][0])
        memories = int(query_value(dest, "SELECT count(*) FROM memories", default=0))
        active = int(query_value(dest, "SELECT count(*) FROM memories WHERE " + ACTIVE, default=0))
    except apsw.Error as exc:
        raise DatabaseError(f"the backup of {str(source)!r} failed: {explain(exc) or exc}") from exc
    finally:
        dest.close()
        src.close()
    with open(partial, "rb+") as written:  # on disk before the rename makes it the backup
        os.fsync(written.fileno())
    return memories, active, integrity
