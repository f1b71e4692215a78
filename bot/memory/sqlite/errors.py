"""What a SQLite error means for the operator, when it hits the whole database (errors.explain asks here)."""
from __future__ import annotations

import apsw


def explain(exc: BaseException) -> str | None:
    """One line saying what to do about a failure of the whole SQLite database, or None."""
    if isinstance(exc, apsw.FullError):
        return "the disk is full (or the file hit its size limit): free some space, then run the command again"
    if isinstance(exc, (apsw.CorruptError, apsw.NotADBError)):
        return ("the database file is damaged: stop Muninn, copy the file aside, then restore a backup "
                "(or try `sqlite3 FILE .recover`); `muninn doctor` shows the integrity check")
    if isinstance(exc, apsw.BusyError):
        return "another process keeps the database locked (an import or maintain?): try again when it is done"
    if isinstance(exc, apsw.ReadOnlyError):
        return "the database file or its folder is read-only for this user: check owner and permissions"
    if isinstance(exc, (apsw.IOError, apsw.CantOpenError)):
        return f"the disk could not read or write the database ({exc}): check the disk, its space and permissions"
    return None
