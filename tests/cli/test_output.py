"""The command line's output: tables and colour on a terminal, plain words when piped, JSON from
every command with a result (--json), refused in one line by the others, a help text for every
argument and examples for every command, and `recall --user` alone explained."""
from __future__ import annotations

import argparse
import json
import os

import pytest

from bot.cli import output
from bot.cli.main import build_parser

pytestmark = pytest.mark.usefixtures("backend")


class FakeDiscord:
    class StartupError(Exception):
        pass

    async def run_bot(self, settings):
        raise AssertionError("not here")

    async def sync_commands(self, settings, guild_id=None):
        return ["memory", "remember"]


def test_a_table_has_colour_on_a_terminal_and_plain_aligned_columns_when_piped():
    grid = output.table(("id", "memory"), [("#1", "Oz prefers dark mode"), ("#12", "[bold]not markup[/bold]")],
                        styles=("cyan",))
    on_terminal = output.render(grid, terminal=True)
    piped = output.render(grid, terminal=False)
    assert "\x1b[" in on_terminal and "Oz prefers dark mode" in on_terminal
    assert "\x1b[" not in piped and "─" not in piped and "│" not in piped
    assert piped.splitlines() == ["id   memory", "#1   Oz prefers dark mode", "#12  [bold]not markup[/bold]"]
    assert output.render(output.status(False), terminal=True) != "FAIL" and output.render(output.status(False),
                                                                                         terminal=False) == "FAIL"


def test_values_are_words_never_python_reprs():
    assert output.value({"personal": 1, "room": 2}) == "personal 1, room 2"
    assert output.value({}) == "none" and output.value(None) == "-" and output.value(True) == "yes"
    assert [output.plural(n, "memory", "memories") for n in (0, 1, 2)] == ["0 memories", "1 memory", "2 memories"]


def test_stats_reads_as_words_and_aligns(cli):
    cli("remember", "Oz prefers dark mode", "--scope", "personal", "--user", 1)
    code, out, _ = cli("stats")
    assert code == 0 and "{" not in out and "'" not in out
    assert "by scope         personal 1" in out
    assert len({line.index(line.split()[-1]) for line in out.splitlines()[:4]}) == 1   # values in one column


def test_stats_on_a_terminal_is_coloured(cli, monkeypatch):
    monkeypatch.setattr(output, "is_terminal", lambda stream=None: True)
    code, out, _ = cli("stats")
    assert code == 0 and "\x1b[" in out and "missing vectors" in out


def test_remember_says_the_id_and_who_sees_it(cli):
    _, out, _ = cli("remember", "Oz prefers dark mode", "--scope", "personal", "--user", 42)
    assert out.startswith("Remembered #1 (personal), visible to user 42 in their DMs with Muninn only")
    _, out, _ = cli("remember", "the wiki moved", "--scope", "room", "--channel", 7, "--guild", 5, "--user", 42)
    assert out.strip() == "Remembered #2 (room), visible to everyone in channel 7."
    _, out, _ = cli("remember", "water is wet", "--scope", "global")
    assert out.strip() == "Remembered #3 (global), visible to everyone, everywhere."


def test_recall_with_only_a_user_is_their_dm_view_and_says_what_it_leaves_out(cli):
    cli("remember", "Oz prefers dark mode", "--scope", "personal", "--user", 42)
    cli("remember", "Oz said the wiki moved", "--scope", "room", "--channel", 7, "--guild", 5, "--user", 42)
    cli("remember", "Oz said the build is green", "--scope", "room", "--channel", 9, "--guild", 5, "--user", 42)
    code, out, _ = cli("recall", "dark mode", "--user", 42)
    assert code == 0 and "as user 42 in a DM with Muninn: 1 memory" in out and "Oz prefers dark mode" in out
    assert ("2 more memories of user 42 are visible only in 2 channels (7, 9): add --channel ID --guild ID "
            "to search as them there.") in out
    data = json.loads(cli("recall", "wiki", "--user", 42, "--json")[1])
    assert data["viewer"] == "dm" and all(m["scope"] != "room" for m in data["memories"])
    assert data["visible_elsewhere"] == {"count": 2, "channels": ["7", "9"], "flag": "--channel ID --guild ID"}
    data = json.loads(cli("recall", "wiki", "--user", 42, "--channel", 7, "--guild", 5, "--json")[1])
    assert [m["text"] for m in data["memories"]] == ["Oz said the wiki moved"] and "viewer" not in data


def test_every_command_with_a_result_prints_json(cli, tmp_path):
    lines = tmp_path / "import.jsonl"
    lines.write_text(json.dumps({"text": "Oz likes tea", "scope": "global"}) + "\n")
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps({"query": "tea", "user_id": 1, "dm": True}) + "\n")
    commands = [("remember", "Oz prefers dark mode", "--scope", "personal", "--user", 42),
                ("recall", "dark mode", "--user", 42), ("recall", "--batch", batch), ("import", lines), ("stats",),
                ("reindex",), ("doctor",), ("maintain",), ("maintain", "--archived"), ("user", "export", 42),
                ("user", "forget", 42, "--yes")]
    for command in commands:
        code, out, err = cli(*command, "--json")
        assert code in (0, 1), (command, err)                # doctor: 1 when a check fails
        assert json.loads(out.strip().splitlines()[-1] if "--batch" in command else out) is not None, command
    code, out, err = cli("sync", "--guild", 5, "--json", load_discord=FakeDiscord)
    assert code == 1 and "DISCORD_TOKEN" in err             # no token: one line saying how to get one
    os.environ["DISCORD_TOKEN"] = "x" * 60
    try:
        code, out, _ = cli("sync", "--guild", 5, "--json", load_discord=FakeDiscord)
    finally:
        del os.environ["DISCORD_TOKEN"]
    assert code == 0 and json.loads(out) == {"synced": ["memory", "remember"], "guild": 5}


@pytest.mark.parametrize("command", [("chat",), ("run",), ()])
def test_commands_without_a_result_refuse_json_in_one_line(cli, command):
    code, out, err = cli(*command, "--json")
    name = command[0] if command else "run"
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"muninn {name}: --json is not for this command") and f"muninn {name} --help" in err


def subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                for inner, deeper in subparsers(sub):
                    yield f"{name} {inner}", deeper


def test_every_command_and_argument_has_help_and_every_command_examples():
    parser = build_parser()
    found = dict(subparsers(parser))
    assert {"remember", "recall", "chat", "doctor", "maintain", "migrate", "user export"} <= set(found)
    for name, sub in [("", parser), *found.items()]:
        assert sub.epilog and "examples:" in sub.epilog and "muninn " in sub.epilog, name
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and action.help != argparse.SUPPRESS, (name, action.dest)
    assert "muninn recall 'where do I live' --user 42" in found["recall"].format_help()
