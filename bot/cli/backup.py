"""`muninn backup PATH`: a consistent copy of the database while the bot runs (docs/deployment.md).

On SQLite it uses SQLite's online backup API (bot/memory/sqlite/backup.py). A PostgreSQL
database is backed up by PostgreSQL's own tool: the command says so and prints the pg_dump
command to run, without the password.
"""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from bot.cli.args import add_command
from bot.memory.errors import DatabaseError
from bot.memory.sqlite.backup import backup_to

NOT_BACKED_UP = 2   # exit status: nothing was copied (PostgreSQL: pg_dump does it)


def without_password(url: str) -> tuple[str, bool]:
    """The URL without its password (in the user part or as a `password=` parameter), and whether it had one."""
    parts = urlsplit(url)
    had = parts.password is not None
    netloc = parts.netloc
    if had:
        userinfo, _, hostinfo = netloc.rpartition("@")
        netloc = f"{userinfo.split(':', 1)[0]}@{hostinfo}"
    params = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(key, value) for key, value in params if key != "password"]
    had = had or len(kept) != len(params)
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(kept), parts.fragment)), had


def pg_dump_command(database_url: str, target: str) -> str:
    """The pg_dump command that backs up `database_url` into `target`, the password shown as ***."""
    url, had_password = without_password(database_url)
    command = f"pg_dump --format=custom --file={shlex.quote(target)} {shlex.quote(url)}"
    return f"PGPASSWORD=*** {command}" if had_password else command


async def cmd_backup(args: Any, settings: Any) -> int:
    """`muninn backup PATH`: copy the SQLite database to PATH (a new file, or a folder for a
    timestamped one) and print what was copied; on PostgreSQL print the pg_dump command instead."""
    if settings.database_url:
        print("muninn backup: the database is PostgreSQL (MUNINN_DATABASE_URL): back it up with PostgreSQL's "
              "pg_dump, which is consistent while the bot writes. Run, with the password in place of ***:\n  "
              + pg_dump_command(settings.database_url, args.path), file=sys.stderr)
        return NOT_BACKED_UP
    try:
        report = backup_to(Path(settings.db_path), Path(args.path))
    except DatabaseError as exc:
        print(f"muninn backup: {exc}", file=sys.stderr)
        return 1
    if getattr(args, "json", False):
        print(json.dumps({"path": str(report.path), "memories": report.memories, "active": report.active,
                          "bytes": report.size, "seconds": round(report.seconds, 3), "integrity": report.integrity}),
              flush=True)
    else:
        print(f"backed up {report.memories} memories ({report.active} active, {report.size / 1e6:.1f} MB) to "
              f"{report.path} in {report.seconds:.1f} s; integrity {report.integrity}", flush=True)
    return 0


def add_parser(sub: Any, common: Any) -> None:
    """The `backup` subcommand on the command line's parser."""
    p = add_command(sub, common, "backup", cmd_backup,
                    "copy the database safely while the bot runs (PostgreSQL: prints the pg_dump command)",
                    "backup /var/backups/muninn/", "backup data/before-upgrade.db")
    p.add_argument("path", metavar="PATH", help="a new file, or a folder to put muninn-YYYYmmdd-HHMMSS.db in")
