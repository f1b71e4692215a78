"""`muninn invite`: the link that adds Muninn to a server with exactly the permissions it uses.

The permissions are listed once, here (`PERMISSIONS`), with why Muninn needs each; the bot's
start-up log line (cogs/client.py) builds its link from the same list. The application id is read
from DISCORD_TOKEN, whose first dot-separated part is the bot's user id in base64 (a bot's user id
is its application's id), so no connection to Discord is needed. A missing or malformed token is
one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import base64
import binascii
import json
import sys
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from bot.cli.args import add_command
from bot.settings import Settings

BAD_INPUT = 2
AUTHORIZE_URL = "https://discord.com/oauth2/authorize"
SCOPES = ("bot", "applications.commands")


@dataclass(frozen=True)
class Permission:
    """One permission the invite asks for: Discord's name for it, its bit, and why Muninn needs it."""
    name: str
    bit: int
    why: str


# Discord's permission bits (https://discord.com/developers/docs/topics/permissions). Never
# Administrator: a server grants exactly these, and can see why.
PERMISSIONS = (
    Permission("View Channels", 1 << 10, "see the channels it answers in and receive their messages"),
    Permission("Send Messages", 1 << 11, "post its replies"),
    Permission("Send Messages in Threads", 1 << 38, "answer in threads too"),
    Permission("Read Message History", 1 << 16, "read the earlier message a reply points at (and its chain) "
                                                "when its own history no longer holds it"),
    Permission("Create Public Threads", 1 << 35, "open a thread for its answer where a server or channel "
                                                 "turned auto_thread on (/settings)"),
    Permission("Add Reactions", 1 << 6, "show ⏳ on a message it is too busy to answer and 🐢 on one "
                                        "over its author's share of answers"),
)
PERMISSIONS_VALUE = sum(permission.bit for permission in PERMISSIONS)


class BadToken(ValueError):
    """DISCORD_TOKEN is missing or is not a bot token; the message says what to do."""


def application_id(token: str) -> int:
    """The application id a bot token belongs to: its first dot-separated part, base64 of the bot's user id."""
    token = token.strip()
    if not token:
        raise BadToken("DISCORD_TOKEN is not set; copy the bot token from https://discord.com/developers/"
                       "applications (Bot > Reset Token) into .env")
    head = token.split(".")[0]
    try:
        decoded = base64.b64decode(head + "=" * (-len(head) % 4), altchars=b"-_", validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        decoded = ""
    if not decoded.isdigit() or not 0 < int(decoded) < 1 << 64:
        raise BadToken("DISCORD_TOKEN does not look like a bot token (its first part should be the bot's id in "
                       "base64); copy it again from the Developer Portal (Bot > Reset Token)")
    return int(decoded)


def invite_url(app_id: int) -> str:
    """The OAuth2 link that adds application `app_id` to a server with `PERMISSIONS` and its slash commands."""
    query = urlencode({"client_id": str(app_id), "permissions": str(PERMISSIONS_VALUE), "scope": " ".join(SCOPES)})
    return f"{AUTHORIZE_URL}?{query}"


async def cmd_invite(args: argparse.Namespace, settings: Settings) -> int:
    """`muninn invite`: print the invite link (with --json, also the permissions and why)."""
    try:
        app_id = application_id(settings.discord_token)
    except BadToken as exc:
        print(f"muninn invite: {exc}", file=sys.stderr)
        return BAD_INPUT
    url = invite_url(app_id)
    if getattr(args, "json", False):
        print(json.dumps({"url": url, "application_id": str(app_id), "permissions": PERMISSIONS_VALUE,
                          "scopes": list(SCOPES),
                          "granted": [{"name": p.name, "value": p.bit, "why": p.why} for p in PERMISSIONS]},
                         ensure_ascii=False))
    else:
        print(url)
    return 0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """The `invite` subcommand on the command line's parser."""
    add_command(sub, common, "invite", cmd_invite,
                "print the link that adds Muninn to a server, with the permissions it uses", "invite", "invite --json")
