"""A whole story, in simcord's Discord with the real bot, engine, extractor and fake Ollama.

Alice tells Muninn a fact in a DM; later she asks in a DM and the fact is in the prompt
Muninn sends to the LLM; asked in a server channel, the DM-learned fact stays out; after
/memory forget-all nothing of it remains in any table.

The fact extractor is the real one. simcord counts every task the bot owns as work to
wait for, and the extractor batches a channel's messages behind a debounce timer, so each
reply would wait for it; instead the bot's pipeline hands its exchanges to `Handoff` and the
test runs them through a real `Extractor` it owns, draining it when the story needs the facts.
"""
from __future__ import annotations

import json

import pytest

from bot.lifecycle.extractor import Extractor
from bot.memory.sql import store
from cogs.client import MuninnBot
from tests.helpers import QuietSink

pytestmark = pytest.mark.usefixtures("backend")  # the whole story on SQLite and on PostgreSQL

FACT = "Alice's sister is called Ylva"


class Handoff(QuietSink):
    """The bot's extractor: keeps the exchanges for the test to extract."""

    def __init__(self):
        self.exchanges = []

    def submit(self, exchange) -> None:
        self.exchanges.append(exchange)


def ollama_answers(request: dict) -> str:
    if request.get("format"):  # an extraction request: only the user's words are in it
        user_text = request["messages"][-1]["content"]
        facts = [{"text": FACT, "about": "Alice", "scope": "personal", "importance": 0.8}] if "Ylva" in user_text else []
        return json.dumps({"facts": facts})
    return "Got it."


@pytest.fixture
async def simcord_bot(fake_ollama, make_settings):
    handoff = Handoff()
    # simcord reports no application flags: the Message Content intent is granted by setting
    bot = MuninnBot(make_settings(fake_ollama.url, MUNINN_MESSAGE_CONTENT="on"), extractor_factory=lambda engine: handoff)
    bot.handoff = handoff
    yield bot
    await bot.close()


async def test_a_fact_told_in_a_dm_stays_private_and_forget_all_erases_it(simcord_env, simcord_bot, fake_ollama):
    env, bot = simcord_env, simcord_bot
    fake_ollama.default_chat_reply = ollama_answers
    guild = env.create_guild("Asgard")
    general = guild.create_text_channel("general")
    alice = guild.add_member(env.create_user("alice", global_name="Alice"))
    await bot.tree.sync()
    extractor = Extractor(bot.engine, batch_delay=0.01)
    try:
        async def extract() -> None:
            for exchange in bot.handoff.exchanges:
                extractor.submit(exchange)
            bot.handoff.exchanges.clear()
            await extractor.drain()

        # 1. Alice tells Muninn a fact in a DM; it becomes her personal memory, learned in a DM.
        await alice.user.send_dm("My sister is called Ylva.")
        await extract()
        [memory] = await bot.engine.write(store.memories_of, alice.id, ("personal",))
        assert (memory.text, memory.scope, memory.owner_id, memory.guild_id) == (FACT, "personal", alice.id, None)

        # 2. Later, in a DM, she asks: the fact is in the prompt sent to the LLM, as what she said, quoted.
        await alice.user.send_dm("Do you remember my sister's name?")
        system = fake_ollama.chat_requests()[-1]["messages"][0]["content"]
        assert f'Alice, who is writing to you now, told you: "{FACT}"' in system.split("## Relevant Memories", 1)[1]
        await extract()

        # 3. In a server channel, the DM-learned fact does not appear anywhere in the prompt.
        await alice.send(general, f"{bot.user.mention} do you remember my sister's name?")
        messages = fake_ollama.chat_requests()[-1]["messages"]
        assert messages[-1]["content"].endswith("do you remember my sister's name?")
        assert "Ylva" not in json.dumps(messages)
        await extract()

        # 4. /memory forget-all, confirmed: nothing of it remains in any table.
        asked = await alice.slash(general, "memory forget-all")
        assert asked.ephemeral and "all 1 of your personal memories" in asked.response.content
        await alice.click(asked.response, label="Forget everything")

        postgres = bot.engine.storage.name == "postgresql"
        keyword_index = (("SELECT count(*) FROM memories WHERE text_search @@ to_tsquery('muninn', 'Ylva')",)
                         if postgres else ("SELECT count(*) FROM memories_fts",
                                           "SELECT count(*) FROM memories_fts WHERE memories_fts MATCH 'Ylva'"))

        def traces(conn) -> dict:
            return {sql: conn.execute(sql).fetchall()[0][0] for sql in (
                "SELECT count(*) FROM memories",
                *keyword_index,
                f"SELECT count(*) FROM {'memory_vectors' if postgres else 'vec_memories'}",
                "SELECT count(*) FROM memory_links",
                "SELECT count(*) FROM messages WHERE content LIKE '%Ylva%'",
            )}
        assert set((await bot.engine.write(traces)).values()) == {0}

        # ...and asking again in a DM finds nothing to recall.
        await alice.user.send_dm("What is my sister called?")
        assert "Ylva" not in json.dumps(fake_ollama.chat_requests()[-1]["messages"])
    finally:
        await extractor.close()
