"""`muninn web`: the operator's console in a browser (bot/web/), until Ctrl-C.

It opens the database as every command does, prints the address and, unless MUNINN_WEB_TOKEN
is set, a new login token (to stderr, once). Read-only unless `--allow-changes` or
MUNINN_WEB_CHANGES=true. Listening beyond the loopback interface needs `--host` explicitly
and says what that exposes.
"""
from __future__ import annotations

import argparse
import secrets
import sys
from typing import Any

from bot.cli.args import add_command
from bot.memory.engine import Engine
from bot.settings import Settings

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """The `web` subcommand on the command line's parser."""
    p = add_command(sub, common, "web", cmd_web, "the operator's console in a browser (read-only by default)",
                    "web", "web --port 8377 --allow-changes",
                    no_json="the console is a web page; use `muninn recall --json` or `muninn stats --json` for results")
    p.add_argument("--host", metavar="ADDRESS", help="address to listen on (default: MUNINN_WEB_HOST, 127.0.0.1)")
    p.add_argument("--port", type=_port, metavar="PORT", help="port to listen on (default: MUNINN_WEB_PORT, 8377)")
    p.add_argument("--allow-changes", action="store_true",
                   help="enable forget, restore, approve, reject and a person's export and forget (each recorded)")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0-65535)")
    return value


async def cmd_web(args: argparse.Namespace, settings: Settings) -> int:
    """Serve the console until interrupted."""
    from bot.web.app import serve  # only here: the other commands start without aiohttp's server
    host = args.host or settings.web_host
    port = settings.web_port if args.port is None else args.port
    token = settings.web_token or secrets.token_urlsafe(24)
    changes = bool(args.allow_changes or settings.web_changes)

    def ready(address: str) -> None:
        if host not in LOOPBACK:
            print(f"muninn web: listening on {host}, beyond this machine: anyone who can reach it and has the "
                  "token sees every memory; put TLS in front of it", file=sys.stderr)
        lines = [f"Muninn console at {address} ({'changes allowed' if changes else 'read-only'}); Ctrl-C stops it."]
        if not settings.web_token:
            lines.append(f"Log in with this token (new at each start; set MUNINN_WEB_TOKEN to keep one): {token}")
        print("\n".join(lines), file=sys.stderr, flush=True)

    async with Engine(settings, warm=False) as engine:
        try:
            await serve(engine, host=host, port=port, token=token, changes=changes, ready=ready)
        except OSError as exc:
            print(f"muninn web: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    return 0
