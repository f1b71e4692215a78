"""Settings of servers, channels and threads (engine.options, sql/options.py), on both backends,
and the migration that folds the old always-answer column into the answer setting."""
from __future__ import annotations

import pytest

from bot.memory.engine import Engine
from bot.memory.options import Stored
from tests.helpers import rewind_schema

pytestmark = pytest.mark.usefixtures("backend")

GUILD, OTHER_GUILD = 7 << 22, 8 << 22
GENERAL, THREAD, RANDOM = 11 << 22, 12 << 22, 13 << 22


async def test_set_read_and_reset_a_servers_and_a_channels_settings(engine):
    options = engine.options
    assert await options.stored(GUILD, [GENERAL]) == Stored({}, {GENERAL: {}})
    await options.set_guild(GUILD, "persona", "Speak like a pirate.")
    await options.set_guild(OTHER_GUILD, "persona", "Another server's.")
    await options.set_channel(GENERAL, GUILD, "answer", "every")
    await options.set_channel(THREAD, GUILD, "history", "3")
    await options.set_channel(THREAD, GUILD, "history", "4")  # set again: the newest value stands
    stored = await options.stored(GUILD, [THREAD, GENERAL])
    assert stored.guild == {"persona": "Speak like a pirate."}
    assert stored.channels == {THREAD: {"history": "4"}, GENERAL: {"answer": "every"}}
    assert stored.channel(RANDOM) == {} and stored.channel(None) == {}

    assert await options.reset_channel(THREAD, "history") and not await options.reset_channel(THREAD, "history")
    assert await options.reset_guild(GUILD, "persona") and not await options.reset_guild(GUILD, "persona")
    stored = await options.stored(GUILD, [THREAD, GENERAL])
    assert stored.guild == {} and stored.channels == {THREAD: {}, GENERAL: {"answer": "every"}}
    assert (await options.stored(OTHER_GUILD, [])).guild == {"persona": "Another server's."}
    assert (await options.stored(None, [GENERAL])).guild == {}  # a DM has no server


async def test_channels_opted_in_or_out_of_always_answer_keep_their_choice_after_the_migration(make_settings, backend):
    settings = make_settings("")
    async with Engine(settings) as engine:
        def before(conn):  # as a database made before the migration: one always-answer column
            conn.execute("DROP TABLE channel_options")
            conn.execute("CREATE TABLE channel_settings (channel_id BIGINT PRIMARY KEY, guild_id BIGINT, "
                         "always_answer INTEGER NOT NULL DEFAULT 0, updated_at REAL NOT NULL)")
            conn.execute("INSERT INTO channel_settings VALUES (?, ?, 1, 5.0), (?, ?, 0, 6.0)",
                         (GENERAL, GUILD, RANDOM, GUILD))
            rewind_schema(conn, backend, "channel_options")
        await engine.write(before)

    async with Engine(settings) as engine:
        stored = await engine.options.stored(GUILD, [GENERAL, RANDOM, THREAD])
        assert stored.channels == {GENERAL: {"answer": "every"}, RANDOM: {"answer": "mentions"}, THREAD: {}}
        await engine.options.set_channel(GENERAL, GUILD, "persona", "Be brief.")  # the new shape takes more keys
        await engine.options.set_channel(RANDOM, GUILD, "answer", "never")

        await engine.write(rewind_schema, backend, "channel_options")  # run once more (a restore, a second process)

    async with Engine(settings) as engine:
        stored = await engine.options.stored(GUILD, [GENERAL, RANDOM])
        assert stored.channels == {GENERAL: {"answer": "every", "persona": "Be brief."}, RANDOM: {"answer": "never"}}
