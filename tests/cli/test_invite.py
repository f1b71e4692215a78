"""`muninn invite`: the invite link from the token, with exactly the permissions Muninn uses."""
from __future__ import annotations

import base64
import json
import os
from urllib.parse import parse_qs, urlsplit

import discord
import pytest

from bot.cli import invite
from bot.cli.main import main
from cogs.client import INVITE_PERMISSIONS

APP_ID = 1234567890123456789


def token_of(user_id: int) -> str:
    head = base64.b64encode(str(user_id).encode()).decode().rstrip("=")
    return f"{head}.GhIjKl.{'x' * 38}"


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """Run `muninn ARGS...` with DISCORD_TOKEN set to `token` (None: unset); returns (code, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.startswith(("MUNINN_", "OLLAMA_", "DISCORD_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("MUNINN_DB_PATH", str(tmp_path / "unused.db"))

    def run(token: str | None, *args: str):
        if token is None:
            monkeypatch.delenv("DISCORD_TOKEN", raising=False)
        else:
            monkeypatch.setenv("DISCORD_TOKEN", token)
        code = main(["invite", *args])
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def test_the_permissions_are_exactly_those_discord_py_names_for_what_muninn_does():
    expected = discord.Permissions(view_channel=True, send_messages=True, send_messages_in_threads=True,
                                   read_message_history=True, create_public_threads=True, add_reactions=True)
    assert invite.PERMISSIONS_VALUE == expected.value == INVITE_PERMISSIONS.value
    assert not discord.Permissions(invite.PERMISSIONS_VALUE).administrator
    assert len({p.bit for p in invite.PERMISSIONS}) == len(invite.PERMISSIONS)  # each listed once


def test_the_link_carries_the_application_id_from_the_token_the_permissions_and_both_scopes(cli, tmp_path):
    code, out, err = cli(token_of(APP_ID))
    assert code == 0 and not err
    url = urlsplit(out.strip())
    assert (url.scheme, url.netloc, url.path) == ("https", "discord.com", "/oauth2/authorize")
    query = parse_qs(url.query)
    assert query == {"client_id": [str(APP_ID)], "permissions": [str(invite.PERMISSIONS_VALUE)],
                     "scope": ["bot applications.commands"]}
    theirs = urlsplit(discord.utils.oauth_url(APP_ID, permissions=INVITE_PERMISSIONS,
                                              scopes=("bot", "applications.commands")))
    assert parse_qs(theirs.query) == query  # discord.py builds the same link
    assert not (tmp_path / "unused.db").exists()  # no database is opened for it


def test_json_lists_each_permission_with_why(cli):
    code, out, _ = cli(token_of(APP_ID), "--json")
    data = json.loads(out)
    assert code == 0 and data["application_id"] == str(APP_ID)
    assert [g["name"] for g in data["granted"]] == ["View Channels", "Send Messages", "Send Messages in Threads",
                                                    "Read Message History", "Create Public Threads", "Add Reactions"]
    assert all(g["why"] for g in data["granted"]) and sum(g["value"] for g in data["granted"]) == data["permissions"]


@pytest.mark.parametrize("token", [None, "", "   ", "not-a-token", "!!!!.abc.def", token_of(0),
                                   base64.b64encode(b"hello").decode() + ".a.b"])
def test_a_missing_or_malformed_token_is_one_line(cli, token):
    code, out, err = cli(token)
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith("muninn invite: DISCORD_TOKEN ")
