"""What applies in a place (bot/conversation/overrides.py): each setting inherited thread ->
channel -> server -> .env, where each may be set, and the values each accepts."""
from __future__ import annotations

import pytest

from bot.conversation.overrides import (
    CHANNEL,
    ENV,
    OPTIONS,
    SERVER,
    THREAD,
    BadValue,
    default,
    resolve,
)
from bot.memory.options import Stored

GUILD, GENERAL, THREAD_ID, RANDOM = 1 << 22, 2 << 22, 3 << 22, 4 << 22

# A value for each setting at each level, all different, and what the .env says.
VALUES = {
    "persona": ("Server persona.", "Channel persona.", "Thread persona."),
    "answer": ("never", "every", "mentions"),
    "history": ("3", "4", "5"),
    "learning": ("off", "on", "off"),
    "language": ("German", "French", "Norwegian"),
    "auto_thread": ("on", "off", None),          # not a thread setting
    "room_memory": ("open", None, None),         # the server's alone
}
ENV_VALUES = {"persona": "", "answer": "mentions", "history": "10", "learning": "on", "language": "",
              "auto_thread": "off", "room_memory": "moderated"}


def test_the_table_covers_every_setting():
    from bot.memory.sql.rooms import ROOM_MODE
    assert set(VALUES) == set(OPTIONS) == set(ENV_VALUES)
    assert ROOM_MODE in OPTIONS  # the room memory mode is stored under the option's own key


@pytest.mark.parametrize("key", sorted(VALUES))
def test_each_setting_is_inherited_from_the_nearest_level_that_sets_it(key, make_settings):
    settings = make_settings()
    server, channel, thread = VALUES[key]

    def at_thread(**levels):
        stored = Stored(levels.get("guild", {}), {THREAD_ID: levels.get("thread", {}),
                                                  GENERAL: levels.get("channel", {})})
        got = resolve(settings, stored, guild_id=GUILD, channel_id=THREAD_ID, parent_id=GENERAL).values[key]
        return got.value, got.source

    assert at_thread() == (ENV_VALUES[key], ENV)
    assert at_thread(guild={key: server}) == (server, SERVER)
    if channel is None:  # set on a channel, it is not read
        assert at_thread(guild={key: server}, channel={key: "x"}, thread={key: "y"}) == (server, SERVER)
        return
    assert at_thread(guild={key: server}, channel={key: channel}) == (channel, CHANNEL)
    if thread is None:
        assert at_thread(guild={key: server}, channel={key: channel}, thread={key: "y"}) == (channel, CHANNEL)
        return
    assert at_thread(guild={key: server}, channel={key: channel}, thread={key: thread}) == (thread, THREAD)
    assert at_thread(thread={key: thread}) == (thread, THREAD)
    # A channel (not a thread) reads its own settings, then its server's: never another channel's.
    stored = Stored({key: server}, {GENERAL: {key: channel}, RANDOM: {}})
    assert resolve(settings, stored, guild_id=GUILD, channel_id=RANDOM).values[key].value == server
    assert resolve(settings, stored, guild_id=GUILD, channel_id=GENERAL).values[key].value == channel


def test_a_dm_follows_the_env_alone(make_settings):
    settings = make_settings(MUNINN_HISTORY_LIMIT="7", MUNINN_LANGUAGE="Danish", MUNINN_EXTRACTION="false")
    stored = Stored({"history": "2"}, {GENERAL: {"history": "3"}})
    dm = resolve(settings, stored, guild_id=None, channel_id=GENERAL)
    assert (dm.history, dm["language"], dm.learning) == (7, "Danish", False)
    assert {v.source for v in dm.values.values()} == {ENV}


def test_the_env_defaults_of_the_answer_mode(make_settings):
    settings = make_settings(MUNINN_ANSWER_MODE="never", MUNINN_ALWAYS_ANSWER_CHANNELS=str(GENERAL),
                             MUNINN_AUTO_THREAD="true")
    assert resolve(settings, Stored(), guild_id=GUILD, channel_id=RANDOM).answer == "never"
    assert resolve(settings, Stored(), guild_id=GUILD, channel_id=GENERAL).answer == "every"
    # a thread of a channel the .env opts in answers every message too
    assert resolve(settings, Stored(), guild_id=GUILD, channel_id=THREAD_ID, parent_id=GENERAL).answer == "every"
    assert resolve(settings, Stored(), guild_id=GUILD, channel_id=GENERAL).auto_thread


def test_without_the_message_content_intent_every_answers_mentions_only(make_settings):
    stored = Stored({"answer": "every"})
    tuning = resolve(make_settings(), stored, guild_id=GUILD, channel_id=GENERAL, reads_everything=False)
    assert tuning["answer"] == "every" and tuning.answer == "mentions" and not tuning.reads_everything
    assert resolve(make_settings(), Stored({"answer": "never"}), guild_id=GUILD, channel_id=GENERAL,
                   reads_everything=False).answer == "never"


def test_the_persona_gets_the_places_addition_and_language(make_settings):
    settings = make_settings()
    stored = Stored({"persona": "You speak like a pirate."}, {GENERAL: {"language": "Norwegian"}})
    persona = resolve(settings, stored, guild_id=GUILD, channel_id=GENERAL).persona(settings.persona)
    assert persona.splitlines() == [settings.persona, "You speak like a pirate.",
                                    "Unless a message plainly asks for another language, answer in Norwegian."]
    assert default(settings).persona(settings.persona) == settings.persona


@pytest.mark.parametrize("key, raw, stored", [
    ("answer", " Every ", "every"), ("learning", "false", "off"), ("learning", "ON", "on"), ("history", "007", "7"),
    ("history", "0", "0"), ("persona", "  Be\n brief.  ", "Be brief."), ("room_memory", "open", "open"),
    ("auto_thread", "yes", "on"), ("language", "Norwegian (bokmål)", "Norwegian (bokmål)"),
])
def test_values_are_checked_and_normalised(key, raw, stored):
    assert OPTIONS[key].parse(raw) == stored


@pytest.mark.parametrize("key, raw, said", [
    ("answer", "always", "is not one of: mentions, every, never"), ("learning", "maybe", "is not one of: on, off"),
    ("history", "101", "from 0 to 100"), ("history", "-1", "from 0 to 100"), ("history", "ten", "from 0 to 100"),
    ("persona", "   ", "the text is empty"), ("persona", "x" * 1001, "at most 1000"),
    ("language", "y" * 41, "at most 40"), ("room_memory", "closed", "moderated, open, off"),
])
def test_bad_values_are_refused_in_one_line(key, raw, said):
    with pytest.raises(BadValue) as refused:
        OPTIONS[key].parse(raw)
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_the_docs_table_has_every_setting_with_its_levels_and_env():
    """docs/server-settings.md's table (copied into the README) says where each setting can be set
    and which .env setting it starts from: what OPTIONS and bot/settings.py say."""
    from pathlib import Path

    from bot.settings import SETTINGS
    table = (Path(__file__).parents[2] / "docs" / "server-settings.md").read_text().split("## Every setting", 1)[1]
    rows = {cells[0]: cells for cells in (
        [cell.strip() for cell in line.strip("|").split(" | ")] for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| Setting"))}
    envs = {spec.env for spec in SETTINGS.values()}
    for key, option in OPTIONS.items():
        _, env, server, channel, thread, who, _ = rows[f"`{key}`"]
        assert [server, channel, thread] == ["yes" if level in option.levels else "—"
                                             for level in (SERVER, CHANNEL, THREAD)], key
        named = [name.strip() for name in option.env_name.split(",") if name.strip() != "-"]
        assert all(f"`{name}`" in env and name in envs for name in named), key
        assert "Manage Server" in who and (("Manage Channels" in who) == (CHANNEL in option.levels)), key
    for env_name in ("MUNINN_ALLOW_DMS", "MUNINN_BLOCKED_USERS", "MUNINN_MESSAGE_CONTENT"):
        assert env_name in envs and any(f"`{env_name}`" in cells[1] for cells in rows.values())
