"""Fair share over the wire: the real discord.py client on the fake Discord gateway
(tests/fakes/discord_server.py), with the default settings. One member floods a channel with
mentions: Muninn answers a quick run of them, shows one 🐢 on a message it holds back, asks the
model nothing more, keeps every message as context, and still answers the next member at once.
"""
from __future__ import annotations

import asyncio
import json
import re

import pytest

from bot.memory.sql import history
from bot.settings import SETTINGS
from cogs.chat import SLOW_DOWN
from tests.scenarios.test_bot_wire import running

pytestmark = pytest.mark.usefixtures("backend")  # on SQLite and PostgreSQL

FLOOD = 12
BURST = int(SETTINGS["rate_burst"].default)


async def test_a_member_who_floods_a_channel_gets_a_turtle_and_no_more_answers(discord_world, fake_ollama,
                                                                               make_settings):
    from cogs.client import MuninnBot
    fake, alice, guild = discord_world
    bob = fake.add_user("bob", global_name="Bob")
    fake.add_member(guild, bob)
    general = guild["channels"][0]
    fake_ollama.default_chat_reply = lambda req: json.dumps({"facts": []}) if req.get("format") else "Sure."
    bot = MuninnBot(make_settings(fake_ollama.url, MUNINN_STREAM_REPLIES="false"), guild_ready_timeout=0.1)
    async with running(bot, fake):
        mention = fake.mention(fake.bot_user)
        flood = [await fake.send_message(general["id"], alice, f"{mention} spam number {n}", mentions=[fake.bot_user])
                 for n in range(FLOOD)]

        async def all_kept() -> bool:
            rows = await bot.engine.write(history.recent, int(general["id"]), 100)
            return sum(1 for r in rows if r.author_id == int(alice["id"])) == FLOOD
        await fake.wait_for(all_kept, timeout=15)    # every message is kept as context, answered or not
        await fake.wait_for(lambda: len([m for m in fake.sent_messages if m["channel_id"] == general["id"]]) >= BURST)
        await fake.wait_for(lambda: fake.reactions, timeout=5)
        await asyncio.sleep(0.3)                     # nothing more comes
        answered = {m["json"]["message_reference"]["message_id"] for m in fake.sent_messages
                    if m["channel_id"] == general["id"]}
        chats = len([r for r in fake_ollama.chat_requests() if not r.get("format")])

        sent = len(fake.sent_messages)
        asked = await fake.send_message(general["id"], bob, f"{mention} is anyone here?", mentions=[fake.bot_user])
        reply = await fake.wait_for_sent_message(general["id"], since=sent)
        await bot.extractor.drain()

    assert len(answered) == BURST and answered <= {int(m["id"]) for m in flood}
    assert chats == BURST                            # no model call for a message held back
    [turtle] = fake.reactions                        # one sign for the whole flood, on a message not answered
    assert turtle["emoji"] == SLOW_DOWN == "🐢" and int(turtle["message_id"]) not in answered
    assert turtle["message_id"] in {m["id"] for m in flood}
    assert reply["json"]["message_reference"]["message_id"] == int(asked["id"])  # Bob is not held back
    # only the answered messages were handed to the extractor
    extracted = json.dumps([r for r in fake_ollama.chat_requests() if r.get("format")])
    learned_from = {int(m["id"]) for n, m in enumerate(flood) if re.search(rf"spam number {n}(?!\d)", extracted)}
    assert learned_from == answered
