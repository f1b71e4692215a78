"""Forgetting that is complete and fair, told over the wire: the real discord.py client against the
fake Discord gateway and REST (tests/fakes/discord_server.py), the fake Ollama, both backends.

1. Alice says five distinctive marker words; Muninn repeats them to Bob and Carol (a channel
   summary, an answer much later, an answer in another channel). After her /memory forget-all
   not one marker is left: in any table, in the next prompt, in the database files.
2. Alice and Bob both teach that game night is every Friday at 8 pm; Alice's forget-all leaves it
   to Bob and the channel.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import re

import psycopg
import pytest

from bot.memory.scope import Viewer
from cogs.client import MuninnBot
from tests.helpers import author_of, fact, facts_reply, kind_of, until
from tests.memory.postgres.test_scrub import files_holding
from tests.scenarios.test_discord_e2e import stop

pytestmark = pytest.mark.usefixtures("backend")

MARKERS = ("quokkaberry", "zorblaxian", "mirthwick", "plumbfeather", "snarvelton")
# What any copy of a marker starts with: a stemmed one too (the keyword indexes hold stems).
STEMS = tuple(marker[:7] for marker in MARKERS)
MANAGE_MESSAGES = 1 << 13


def held(text: str | bytes) -> list[str]:
    """The markers' stems in `text` (any case)."""
    low = text.lower() if isinstance(text, str) else text.lower().decode("utf-8", "ignore")
    return [stem for stem in STEMS if stem in low]


def every_text(conn) -> list[tuple[str, str]]:
    """(table, value) for every value of every table, as text (blobs decoded leniently)."""
    out: list[tuple[str, str]] = []
    if getattr(conn, "storage", None) is not None:  # PostgreSQL: each row as text, all its columns
        tables = [row[0] for row in conn.pg.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
            "AND table_type = 'BASE TABLE'").fetchall()]
        for table in tables:
            out += [(table, str(row[0])) for row in conn.pg.execute(f'SELECT t::text FROM "{table}" t'.encode())]
        return out
    tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()]
    for table in tables:
        try:
            rows = conn.execute(f'SELECT * FROM "{table}"').fetchall()
        except Exception:  # a virtual table that cannot be scanned whole: its shadow tables are read instead
            continue
        for row in rows:
            for value in row:
                if isinstance(value, bytes):
                    out.append((table, value.decode("utf-8", "ignore")))
                elif isinstance(value, str):
                    out.append((table, value))
    return out


def markers_in_tables(conn) -> list[tuple[str, str]]:
    """Every (table, stem) where a value holds a marker."""
    return [(table, stem) for table, value in every_text(conn) for stem in held(value)]


def planner_statistics(url: str) -> str:
    """PostgreSQL's statistics of our tables' columns and expressions (sample values, common
    elements: a tsvector's lexemes), as text."""
    columns = "coalesce(most_common_vals::text, '') || coalesce(histogram_bounds::text, '') || " \
              "coalesce(most_common_elems::text, '')"
    with psycopg.connect(url, autocommit=True) as conn:
        return " ".join(str(row[0]) for row in conn.execute(
            f"SELECT {columns} FROM pg_stats WHERE schemaname = current_schema() UNION ALL "
            f"SELECT {columns} FROM pg_stats_ext_exprs WHERE schemaname = current_schema()").fetchall())


def chat_prompts(fake_ollama) -> list[str]:
    """Every prompt the model was asked to answer (not extraction), whole, as JSON."""
    return [json.dumps(body["messages"]) for body in fake_ollama.chat_requests() if not body.get("format")]


class Server:
    """Alice, Bob and Carol in Asgard's #general and #random, the bot running over the wire."""

    def __init__(self, fake, bot: MuninnBot, users: dict, channels: dict):
        self.fake, self.bot, self.users, self.channels = fake, bot, users, channels

    async def say(self, who: str, where: str, text: str, *, ask: bool = False) -> str | None:
        """`who` writes in `where`; with `ask`, to Muninn (a mention), and its reply is returned."""
        channel = self.channels[where]
        sent = len(self.fake.sent_messages)
        stored = await self.count_messages()
        bot = self.fake.bot_user
        await self.fake.send_message(channel["id"], self.users[who], f"{self.fake.mention(bot)} {text}" if ask else text,
                                     mentions=[bot] if ask else [])
        if not ask:
            await until(lambda: self._more_than(stored), f"{who}'s message recorded")
            return None
        reply = await self.fake.wait_for_sent_message(channel["id"], since=sent)
        await until(lambda: self._more_than(stored + 1), "the reply recorded")
        return str(reply["json"]["content"])

    async def count_messages(self) -> int:
        return await self.bot.engine.write(lambda conn: conn.execute("SELECT count(*) FROM messages").fetchall()[0][0])

    async def _more_than(self, count: int) -> bool:
        return await self.count_messages() > count

    async def forget_all(self, who: str) -> str:
        """/memory forget-all, and "Forget everything" pressed: the answer it ends with."""
        synced = await self.bot.tree.sync()
        memory_id = next(c.id for c in synced if c.name == "memory")
        user, channel = self.users[who], self.channels["general"]
        asked = await self.fake.send_interaction("memory", user, channel["id"], command_id=memory_id,
                                                 options=[{"name": "forget-all", "type": 1, "options": []}])
        question = await self.fake.wait_for_interaction_response(asked)
        clicked = await self.fake.click(question["message"], user, "Forget everything")
        await self.fake.wait_for(lambda: next((f for f in self.fake.followups if f["token"] == clicked["token"]
                                               and f["kind"] == "edit_original"
                                               and f["json"].get("content", "").startswith("Done")), None),
                                 timeout=30)
        return str(self.fake._original_responses[clicked["token"]]["content"])


@contextlib.asynccontextmanager
async def asgard(discord_world, fake_ollama, make_settings, answer, **env):
    fake, alice, guild = discord_world
    bob, carol = fake.add_user("bob", global_name="Bob"), fake.add_user("carol", global_name="Carol")
    teachers = fake.add_role(guild, "Teachers", permissions=MANAGE_MESSAGES)  # room facts are theirs to teach
    for user in (bob, carol):
        fake.add_member(guild, user)
    for member in guild["members"]:
        if member["user"]["id"] in (alice["id"], bob["id"]):
            member["roles"].append(teachers["id"])
    random = fake.add_channel(guild, "random")
    fake_ollama.default_chat_reply = answer
    settings = make_settings(fake_ollama.url, MUNINN_STREAM_REPLIES="false", **env)
    bot = MuninnBot(settings, guild_ready_timeout=0.1)
    task = asyncio.create_task(bot.start("fake-token"))
    try:
        await fake.wait_until_ready()
        yield Server(fake, bot, {"alice": alice, "bob": bob, "carol": carol},
                     {"general": guild["channels"][0], "random": random})
    finally:
        await stop(bot, task)


# -- 1. the marker words ------------------------------------------------------------------

ALICE_SAYS = "my cat Quokkaberry only eats zorblaxian tuna, and the Mirthwick fair is on Saturday"
REPLIES = {  # what Muninn answers, by what it was asked
    "hello": "Hello Bob!",
    "Quokkaberry only eats": "Quokkaberry sounds picky!",
    "sum up": ("Summary: Alice's cat Quokkaberry only eats zorblaxian tuna; the Mirthwick fair is on Saturday, "
               "bring plumbfeather cookies; her neighbour Snarvelton plays the tuba."),
    "that fair": "It was the Mirthwick fair, with plumbfeather cookies.",
    "news from general": "A cat called Quokkaberry eats zorblaxian tuna, and Snarvelton plays the tuba.",
}


def marker_answers(request: dict) -> str:
    if request.get("format"):
        if kind_of(request) == "extract" and author_of(request) == "Alice":
            return facts_reply(fact("Alice's cat Quokkaberry only eats zorblaxian tuna", "Alice", "personal"),
                               fact("The Mirthwick fair is on Saturday", "room", "room"))
        return "{}"  # nothing learned from Bob's and Carol's messages
    asked = request["messages"][-1]["content"]
    return next((reply for key, reply in REPLIES.items() if key in asked), "Sure.")


async def test_forget_all_leaves_no_marker_word_in_the_tables_the_next_prompt_or_the_files(
        discord_world, fake_ollama, make_settings, backend):
    async with asgard(discord_world, fake_ollama, make_settings, marker_answers, MUNINN_HISTORY_LIMIT="4") as server:
        assert await server.say("bob", "general", "hello", ask=True) == "Hello Bob!"  # before Alice spoke
        await server.say("alice", "general", ALICE_SAYS, ask=True)
        await server.say("alice", "general", "bring plumbfeather cookies to it")
        await server.say("alice", "general", "my neighbour Snarvelton plays the tuba")
        summary = await server.say("bob", "general", "can you sum up what was said here?", ask=True)
        assert len(held(summary or "")) == 5  # to Bob, with her words in its conversation
        for who, text in [("bob", "nice weather"), ("carol", "indeed"), ("bob", "lunch?"), ("carol", "sure")]:
            await server.say(who, "general", text)  # her messages leave the last MUNINN_HISTORY_LIMIT
        later = await server.say("carol", "general", "what was that fair again?", ask=True)
        elsewhere = await server.say("carol", "random", "any news from general?", ask=True)
        assert held(later or "") and held(elsewhere or "")  # her messages out of their conversation: words only
        await server.bot.extractor.drain()
        engine = server.bot.engine
        alice_id = int(server.users["alice"]["id"])
        assert {m.scope for m in await engine.memories_of(alice_id)} >= {"personal"}
        assert set(held(json.dumps(await engine.write(every_text)))) == set(STEMS)
        if backend:  # the statistics autovacuum gathers hold sample values: her words among them
            with psycopg.connect(backend, autocommit=True) as conn:
                conn.execute("ANALYZE")
            assert held(planner_statistics(backend))

        done = await server.forget_all("alice")

        assert "replies to others that may have repeated your words were emptied" in done
        assert await engine.write(markers_in_tables) == []
        kept = await engine.write(lambda conn: conn.execute(
            "SELECT content FROM messages WHERE content IN ('Hello Bob!', 'nice weather', 'sure') ORDER BY content"
        ).fetchall())
        assert [row[0] for row in kept] == ["Hello Bob!", "nice weather", "sure"]  # the others' conversation stays

        # The next prompts, in both channels: nothing of hers.
        await server.say("carol", "general", "tell me everything you remember", ask=True)
        await server.say("bob", "random", "and here?", ask=True)
        assert all(held(prompt) == [] for prompt in chat_prompts(fake_ollama)[-2:])
        general = server.channels["general"]
        bob = Viewer(int(server.users["bob"]["id"]), int(general["id"]), int(general["guild_id"]))
        assert held(json.dumps((await engine.recall("cat fair tuba cookies", bob, touch=False)).texts)) == []

        # The database files, after the scrub.
        if backend:
            tables = [row[0] for row in await engine.write(lambda conn: conn.pg.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
                "AND table_type = 'BASE TABLE'").fetchall())]
            assert [table for table in tables if files_holding(backend, table, *STEMS)] == []
            assert held(planner_statistics(backend)) == []
        else:
            path = engine.settings.db_path
            files = [p for p in (path, path.with_name(path.name + "-wal")) if p.exists()]
            assert files and [p.name for p in files if held(p.read_bytes())] == []


# -- 2. a fact two people taught ----------------------------------------------------------

GAME = "Game night is every Friday at 8 pm"


def game_answers(request: dict) -> str:
    if request.get("format"):
        said = request["messages"][-1]["content"]
        if kind_of(request) == "extract" and re.search(r"game night is every friday", said, re.I):
            return facts_reply(fact(GAME, "room", "room", importance=0.7))
        return "{}"
    return "Noted." if "game night" in request["messages"][-1]["content"].lower() else "Sure."


async def test_a_fact_alice_and_bob_both_taught_stays_for_bob_and_the_channel_after_alices_forget_all(
        discord_world, fake_ollama, make_settings):
    async with asgard(discord_world, fake_ollama, make_settings, game_answers) as server:
        engine = server.bot.engine
        alice, bob, carol = (int(server.users[name]["id"]) for name in ("alice", "bob", "carol"))
        general = server.channels["general"]
        here = dict(channel_id=int(general["id"]), guild_id=int(general["guild_id"]))
        await server.say("alice", "general", "game night is every Friday at 8 pm!", ask=True)
        await server.bot.extractor.drain()
        await server.say("bob", "general", "Yes, game night is every Friday at 8 pm.", ask=True)
        await server.bot.extractor.drain()
        [memory] = await engine.memories_of(alice)
        assert memory.scope == "room" and [m.id for m in await engine.memories_of(bob)] == [memory.id]
        assert len(memory.source_message_ids) == 2

        done = await server.forget_all("alice")

        assert "1 room memories that others taught too stay theirs, without you" in done
        kept = await engine.get(memory.id)
        assert (kept.text, kept.owner_id) == (GAME, bob)
        assert len(kept.source_message_ids) == 1 and kept.source_message_ids[0] not in [
            str(m["id"]) for m in server.fake.messages[general["id"]] if m["author"]["id"] == str(alice)]
        assert await engine.memories_of(alice) == []
        for viewer in (Viewer(bob, **here), Viewer(carol, **here)):  # Bob, and anyone in the channel
            assert memory.id in (await engine.recall("when is game night?", viewer, touch=False)).ids
        await server.say("carol", "general", "when is game night?", ask=True)
        assert GAME in chat_prompts(fake_ollama)[-1]
