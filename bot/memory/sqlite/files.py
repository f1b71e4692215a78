"""The database file itself: whose it is, who may read it, and what its errors mean.

Before SQLite opens a file read-write (which already rewrites the header to switch to
WAL), `prepare` checks that it is Muninn's: the header's `application_id`, or for a
file made before that mark existed, Muninn's tables. Another program's SQLite file, a
file of a newer Muninn and a file that is not SQLite at all are refused without one
byte changing. New files and folders are created private (0600 / 0700): the memories
of DMs are in there.
"""
from __future__ import annotations

import os
import stat
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw

from bot.memory.errors import DatabaseError
from bot.memory.sqlite.errors import explain

APPLICATION_ID = 0x4D554E4E   # "MUNN" in the header at offset 68 (PRAGMA application_id)
HEADER = b"SQLite format 3\x00"
FILE_MODE = 0o600
FOLDER_MODE = 0o700
MUNINN_TABLES = {"meta", "memories"}
# How long a file that looks truncated while it has a WAL is given to be a checkpoint mid-copy
# (one usually takes milliseconds, and stays well within this even on a loaded machine).
CHECKPOINT_WAIT_S = 2.0
# Told the path of each database file this process creates (see `announcing`).
_on_create: Callable[[Path], None] | None = None


@contextmanager
def announcing(callback: Callable[[Path], None]) -> Iterator[None]:
    """Within the block, `callback(path)` runs once for each new database file created (from
    whichever thread opens it): the command line says which file it made and which `.env` it read."""
    global _on_create
    before, _on_create = _on_create, callback
    try:
        yield
    finally:
        _on_create = before


def prepare(path: Path) -> None:
    """Create the folder and an empty file privately if missing; refuse a file that is not
    Muninn's or is newer than this code. Raises DatabaseError; changes nothing it refuses."""
    folder = path.parent
    if not folder.exists():
        try:
            folder.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseError(f"cannot create the folder {str(folder)!r}: {exc.strerror}") from exc
    if not path.exists():
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE))
        except FileExistsError:
            pass  # another process created it meanwhile: check it below
        except OSError as exc:
            raise DatabaseError(f"cannot create database {str(path)!r}: {exc.strerror}") from exc
        else:
            _make_own_folder_private(path)
            if _on_create is not None:
                _on_create(path)
    check_before_open(path)


def _make_own_folder_private(path: Path) -> None:
    """A new database in a folder that holds nothing else (made beforehand with the default mode,
    or an older checkout's data/ that git created readable by everyone around its .gitkeep): the
    folder becomes private too. A folder holding anything else is the operator's to decide
    (`muninn doctor --fix` tightens it on request)."""
    folder = path.parent
    ours = {path.name, f"{path.name}-wal", f"{path.name}-shm", f"{path.name}-journal", ".gitkeep"}
    try:
        if stat.S_IMODE(folder.stat().st_mode) & 0o077 and {entry.name for entry in folder.iterdir()} <= ours:
            folder.chmod(FOLDER_MODE)
    except OSError:  # not ours to change (another owner, a read-only mount): doctor says so
        pass


def read_header(path: Path) -> bytes:
    """The database file's first 100 bytes, its header (fewer in
    a shorter file); DatabaseError when it cannot be read."""
    try:
        with path.open("rb") as f:
            return f.read(100)
    except OSError as exc:
        raise DatabaseError(f"cannot read database {str(path)!r}: {exc.strerror}") from exc


def check_before_open(path: Path) -> None:
    """Refuse (DatabaseError) a file Muninn must not open read-write; see the module doc."""
    from bot.memory.sqlite.migrations import MIGRATIONS  # late: migrations imports transactions imports this

    header = read_header(path)
    if not header:
        return  # empty file: a new database
    if len(header) < 100 or not header.startswith(HEADER):
        raise DatabaseError(f"{str(path)!r} is not a SQLite database (nor Muninn's); "
                            "point MUNINN_DB_PATH (or --db) at another file")
    short = _short_of(path, header)
    deadline = time.monotonic() + CHECKPOINT_WAIT_S
    while short and Path(f"{path}-wal").exists() and time.monotonic() < deadline:
        # A checkpoint (another process's, or this one's loader) copies page 1, with the new size
        # in its header, before the pages that grow the file: mid-copy the file looks truncated.
        time.sleep(0.02)
        short = _short_of(path, read_header(path))
    if short:
        raise DatabaseError(f"{str(path)!r} is truncated ({short[0]} bytes, its header says "
                            f"{short[1]}): it was left unchanged; restore a backup "
                            "(or try `sqlite3 FILE .recover`)")
    app_id, version, tables = _read_only_facts(path)
    if app_id not in (0, APPLICATION_ID):
        raise DatabaseError(f"{str(path)!r} belongs to another program (application_id {app_id:#x}); "
                            "Muninn left it unchanged: point MUNINN_DB_PATH (or --db) at another file")
    if version > len(MIGRATIONS):
        raise DatabaseError(f"{str(path)!r} has schema version {version}, newer than this Muninn "
                            f"({len(MIGRATIONS)}); it was left unchanged: upgrade Muninn")
    if app_id == 0 and tables and not (MUNINN_TABLES <= tables and version >= 1):
        raise DatabaseError(f"{str(path)!r} is another program's SQLite database (tables: "
                            f"{', '.join(sorted(tables)[:5])}); Muninn left it unchanged: "
                            "point MUNINN_DB_PATH (or --db) at another file")


def _short_of(path: Path, header: bytes) -> tuple[int, int] | None:
    """(the file's size, the size its header says) when the file is shorter, else None."""
    if len(header) < 100:
        return None
    page_size = int.from_bytes(header[16:18], "big") or 65536   # 1 means 65536
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    valid_for = int.from_bytes(header[92:96], "big") == int.from_bytes(header[24:28], "big")
    size = path.stat().st_size
    return (size, pages * page_size) if valid_for and pages and size < pages * page_size else None


def _read_only_facts(path: Path) -> tuple[int, int, set[str]]:
    """(application_id, user_version, table names), read without writing (the WAL, if any,
    is read too: the header in the main file may not have been checkpointed yet)."""
    try:
        if Path(f"{path}-wal").exists():  # its WAL may hold newer pages: a normal read-only open reads them
            conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        else:  # immutable: no -wal/-shm files get created next to a file that may not be ours
            uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?immutable=1"
            conn = apsw.Connection(uri, flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    except apsw.Error as exc:
        raise DatabaseError(f"cannot open database {str(path)!r}: {explain(exc) or exc}") from exc
    try:
        conn.set_busy_timeout(5000)
        app_id = _pragma_int(conn, "application_id")
        version = _pragma_int(conn, "user_version")
        tables = {str(row[0]) for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%'")}
    except apsw.NotADBError as exc:
        raise DatabaseError(f"{str(path)!r} is not a SQLite database; point MUNINN_DB_PATH (or --db) at "
                            "another file") from exc
    except apsw.Error as exc:
        raise DatabaseError(f"{str(path)}: {explain(exc) or exc}") from exc
    finally:
        conn.close()
    return app_id, version, tables


def _pragma_int(conn: apsw.Connection, name: str) -> int:
    value = conn.execute(f"PRAGMA {name}").fetchall()[0][0]
    return value if isinstance(value, int) else 0


def mark(conn: apsw.Connection) -> None:
    """Stamp the file as Muninn's (once; a no-op afterwards)."""
    if _pragma_int(conn, "application_id") != APPLICATION_ID:
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")


def loose_modes(db_path: Path) -> list[str]:
    """Files and the folder of the database that other users can read or enter."""
    found = []
    candidates = [db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")]
    for candidate in candidates:
        if candidate.exists() and stat.S_IMODE(candidate.stat().st_mode) & 0o077:
            found.append(f"{candidate} is {stat.S_IMODE(candidate.stat().st_mode):o}")
    folder = db_path.parent
    if folder.exists() and stat.S_IMODE(folder.stat().st_mode) & 0o077 and folder.resolve() != Path.cwd().resolve():
        found.append(f"{folder} is {stat.S_IMODE(folder.stat().st_mode):o}")
    return found


def tighten_modes(db_path: Path) -> None:
    """chmod the database files 0600 and their folder 0700 (not the working directory)."""
    for candidate in (db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")):
        if candidate.exists():
            candidate.chmod(FILE_MODE)
    folder = db_path.parent
    if folder.exists() and folder.resolve() != Path.cwd().resolve():
        folder.chmod(FOLDER_MODE)
