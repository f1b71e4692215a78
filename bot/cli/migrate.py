"""`muninn migrate --to postgresql://...`: copy the SQLite database into PostgreSQL.

The copy itself (read-only source, resumable batches, verification) is
bot/memory/postgres/copy.py; this is the command: its arguments, the progress bar and what
it says at the end.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bot.cli.args import add_command, positive_int
from bot.cli.progress import Progress
from bot.memory.postgres.copy import BATCH, MigrationError, Report, copy_database


async def cmd_migrate(args: Any, settings: Any) -> int:
    """`muninn migrate --to URL`: blocking on purpose (a one-shot command with nothing else on
    its event loop), so that Ctrl-C stops it between two statements and the open batch rolls back."""
    source = Path(settings.db_path)
    bar = Progress(f"copying {source.name}", None)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done)

    def step(what: str) -> None:
        bar.finish()
        print(what, file=sys.stderr, flush=True)
    try:
        report = copy_database(source, args.to, batch=args.batch, on_progress=progress, on_step=step)
    except MigrationError as exc:
        print(f"muninn migrate: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        bar.finish()
        print("muninn migrate: interrupted; the batches copied so far are kept: run the same command to continue",
              file=sys.stderr)
        return 130
    say(report, source, as_json=getattr(args, "json", False))
    return 0 if report.ok else 1


def say(report: Report, source: Path, *, as_json: bool) -> None:
    """The copy's outcome: the texts it repaired on stderr, then the report as JSON or as lines."""
    if report.repaired_texts:
        print(f"{report.repaired_texts} texts had invalid UTF-8 or NUL characters: replaced with U+FFFD",
              file=sys.stderr)
    if as_json:
        data = {"ok": report.ok, "resumed": report.resumed, "copied": report.copied,
                "counts": {name: {"source": s, "target": t} for name, (s, t) in report.counts.items()},
                "mismatched": report.mismatched, "repaired_texts": report.repaired_texts,
                "seconds": round(report.seconds, 2)}
        print(json.dumps(data), flush=True)
        return
    print(report.line(), flush=True)
    if report.ok:
        print(f"next: set MUNINN_DATABASE_URL to the target (and keep {source} as a backup)", flush=True)


def add_parser(sub: Any, common: Any) -> None:
    """The `migrate` subcommand on the command line's parser."""
    p = add_command(sub, common, "migrate", cmd_migrate, "copy the SQLite database into PostgreSQL (resumable, verified)",
                    "migrate --to postgresql://muninn@localhost/muninn",
                    "migrate --db old.db --to postgresql://muninn@db.example.org/muninn --batch 500")
    p.add_argument("--to", required=True, metavar="postgresql://...",
                   help="the target database (empty, or a copy of this source cut short)")
    p.add_argument("--batch", type=positive_int, default=BATCH, help=f"rows per transaction (default {BATCH})")
