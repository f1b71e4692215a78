"""`muninn user export ID` and `muninn user forget ID`: an operator answers a person's access and
deletion requests with what /memory export and /memory forget-all do for the person, run in-process
on each storage backend."""
from __future__ import annotations

import asyncio
import io
import json
import os
import stat
import time

import pytest

from bot.cli.main import main
from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from bot.memory.sql import history
from bot.settings import load_settings

pytestmark = pytest.mark.usefixtures("backend")

ALICE, BOB, MUNINN = 11 << 22, 12 << 22, 13 << 22
GUILD, ROOM, ALICE_DM, BOB_DM = 21 << 22, 22 << 22, 23 << 22, 24 << 22
SECRET = "Zanzibarite Quokkaville"


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys, database_env):
    """Run `muninn ARGS...` (with `stdin` as its input) in a clean environment; returns (exit code, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.startswith(("MUNINN_", "OLLAMA_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("MUNINN_DATABASE_URL", database_env)
    monkeypatch.setenv("MUNINN_DB_PATH", str(tmp_path / "cli.db"))
    monkeypatch.setenv("OLLAMA_URL", "")

    def run(*args, stdin: str = ""):
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def said(engine: Engine, message_id: int, channel: int, guild: int | None, author: int, text: str, *,
         role: str = "user", reply_to_author: int | None = None):
    return engine.write(history.record, channel_id=channel, guild_id=guild, author_id=author,
                        author_name="Muninn" if role == "assistant" else "someone", role=role, content=text,
                        created_at=time.time() + message_id * 1e-3, message_id=message_id,
                        reply_to_author=reply_to_author)


@pytest.fixture
def people(cli) -> dict[str, int]:
    """Alice and Bob, each with memories and messages in a server and in a DM."""
    async def fill() -> dict[str, int]:
        async with Engine(load_settings(), warm=False) as engine:
            await said(engine, 1, ROOM, GUILD, ALICE, f"I live on {SECRET} street")
            await said(engine, 2, ROOM, GUILD, MUNINN, "Noted!", role="assistant", reply_to_author=ALICE)
            await said(engine, 3, ROOM, GUILD, BOB, "I like tea")
            await said(engine, 4, ALICE_DM, None, ALICE, "my cat is called Ylva")
            await said(engine, 5, ALICE_DM, None, MUNINN, "Lovely name.", role="assistant")
            await said(engine, 6, BOB_DM, None, BOB, "my dog is called Rex")
            await engine.messages.delete([4])                       # taken back: not hers any more
            ids = {"alice in the server": await engine.remember(NewMemory(
                f"Alice lives on {SECRET} street", "personal", owner_id=ALICE, channel_id=ROOM, guild_id=GUILD,
                source_message_ids=[1])),
                "alice in a DM": await engine.remember(NewMemory("Alice's cat is called Ylva", "personal",
                                                                 owner_id=ALICE, channel_id=ALICE_DM)),
                "alice taught": await engine.remember(NewMemory(f"The {SECRET} club meets on Fridays", "room",
                                                                owner_id=ALICE, channel_id=ROOM, guild_id=GUILD)),
                "bob": await engine.remember(NewMemory("Bob likes tea", "personal", owner_id=BOB, channel_id=ROOM,
                                                       guild_id=GUILD)),
                "bob taught": await engine.remember(NewMemory("The room has a kettle", "room", owner_id=BOB,
                                                              channel_id=ROOM, guild_id=GUILD))}
            for n in range(30):
                await engine.remember(NewMemory(f"filler fact {n} about boats", "personal", owner_id=BOB))
            return ids
    return asyncio.run(fill())


def test_export_gives_what_memory_export_gives_with_where_learned_and_the_history(cli, people):
    code, out, err = cli("user", "export", ALICE)
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["user_id"] == str(ALICE) and data["exported_at"]
    memories = {m["id"]: m for m in data["memories"]}
    assert set(memories) == {people["alice in the server"], people["alice in a DM"], people["alice taught"]}

    async def expected() -> list[dict]:                              # /memory export's content, memory by memory
        async with Engine(load_settings(), warm=False) as engine:
            return [m.to_dict() for m in await engine.memories_of(ALICE)]
    for memory in asyncio.run(expected()):
        exported = dict(memories[memory["id"]])
        exported.pop("learned_in")
        assert exported == dict(memory, retention=exported["retention"])
    assert memories[people["alice in the server"]]["learned_in"] == f"server {GUILD}, channel {ROOM}"
    assert memories[people["alice in a DM"]]["learned_in"] == f"a direct message (channel {ALICE_DM})"
    assert memories[people["alice taught"]]["scope"] == "room"
    assert [(m["id"], m["role"], m["content"]) for m in data["messages"]] == [
        (1, "user", f"I live on {SECRET} street"), (2, "assistant", "Noted!"), (5, "assistant", "Lovely name.")]
    assert data["messages"][0]["guild_id"] == GUILD and data["messages"][2]["guild_id"] is None


def test_export_to_a_file_readable_by_the_operator_alone(cli, people, tmp_path):
    target = tmp_path / "alice.json"
    code, out, err = cli("user", "export", ALICE, "--out", target)
    assert code == 0 and err == ""
    assert out.strip() == (f"wrote user {ALICE}'s 2 personal memories, 1 room memories they taught and "
                           f"3 messages to {target}")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert len(json.loads(target.read_text())["memories"]) == 3
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".alice")] == []   # no temporary file left
    code, out, _ = cli("user", "export", 999 << 22)                  # someone Muninn knows nothing of
    assert code == 0 and json.loads(out)["memories"] == [] and json.loads(out)["messages"] == []


def test_forget_asks_first_and_a_no_forgets_nothing(cli, people):
    code, out, err = cli("user", "forget", ALICE, stdin="n\n")
    assert code == 1 and out == ""
    assert "2 personal memories" in err and "1 room memories" in err and "3 messages" in err
    assert "not confirmed; nothing of user" in err
    code, out, _ = cli("user", "forget", ALICE)                     # no answer at all (stdin closed): no
    assert code == 1
    assert len(json.loads(cli("user", "export", ALICE)[1])["memories"]) == 3


def test_forget_is_memory_forget_all_with_its_scrub(cli, people, backend, tmp_path):
    from tests.memory.test_guilds import _words_in_files
    settings = load_settings()
    assert _words_in_files(settings, backend)
    code, out, err = cli("user", "forget", ALICE, stdin="yes\n")
    assert code == 0
    # 4 rows: the 3 exported and what is left of the one she deleted (its id, not its words)
    assert out.strip() == f"forgot user {ALICE}: 2 personal memories, 1 room memories they taught, 4 messages"
    data = json.loads(cli("user", "export", ALICE)[1])
    assert data["memories"] == [] and data["messages"] == []
    bob = json.loads(cli("user", "export", BOB)[1])
    assert {m["id"] for m in bob["memories"]} >= {people["bob"], people["bob taught"]}
    assert [m["id"] for m in bob["messages"]] == [3, 6]
    assert _words_in_files(settings, backend) == []
    code, out, _ = cli("user", "forget", ALICE, "--yes", "--json")  # again: nothing left, no question
    assert code == 0 and json.loads(out) == {"user_id": str(ALICE), "personal": 0, "taught": 0, "messages": 0}


@pytest.mark.parametrize("args, message", [
    (["user", "export", "bob"], "user id 'bob' must be a numeric id"),
    (["user", "forget", "12abc", "--yes"], "user id '12abc' must be a numeric id"),
    (["user", "export", "9" * 30], "is out of range"),
    (["user", "export", "5", "--out", "/nonexistent/folder/x.json"], "no folder '/nonexistent/folder'"),
])
def test_a_bad_id_or_file_is_one_clear_line(cli, args, message):
    code, out, err = cli(*args)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"muninn user {args[1]}: ")


def test_user_needs_an_action(cli):
    with pytest.raises(SystemExit) as exit_:
        cli("user")
    assert exit_.value.code == 2
