"""What a server, a channel or a thread may change of how Muninn talks there, and what applies.

Each setting (`OPTIONS`) is set with `/settings set` in a thread, a channel or for the whole
server, and a place inherits what it does not set: a thread from its parent channel, a channel
from its server, a server from the operator's `.env`. `resolve` gives the value that applies
and where it comes from; `/settings show` prints both.

Started without Discord's Message Content intent (cogs/client.py), Muninn only reads DMs,
mentions and replies to it: the `every` answer mode then answers mentions only, and messages
it does not answer are not kept as history (`Tuning.reads_everything`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from bot.memory.options import Stored
from bot.memory.rooms import DEFAULT_MODE, MODES
from bot.settings import Settings

SERVER, CHANNEL, THREAD, ENV = "server", "channel", "thread", ".env"
MENTIONS, EVERY, NEVER = "mentions", "every", "never"
ANSWER_MODES = (MENTIONS, EVERY, NEVER)
ON, OFF = "on", "off"
PERSONA_MAX = 1000
LANGUAGE_MAX = 40
HISTORY_MAX = 100


class BadValue(ValueError):
    """A value a setting cannot take; the message says which ones it can, in one line."""


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        aliases = {"true": ON, "yes": ON, "1": ON, "false": OFF, "no": OFF, "0": OFF}
        value = aliases.get(value, value) if set(allowed) == {ON, OFF} else value
        if value not in allowed:
            raise BadValue(f"{raw.strip()[:40]!r} is not one of: {', '.join(allowed)}")
        return value
    return parse


def _text(limit: int) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = " ".join(raw.split())
        if not value:
            raise BadValue("the text is empty; use `/settings reset` to remove it")
        if len(value) > limit:
            raise BadValue(f"the text has {len(value)} characters; at most {limit} are allowed")
        return value
    return parse


def _history(raw: str) -> str:
    value = raw.strip()
    if not value.isdigit() or int(value) > HISTORY_MAX:
        raise BadValue(f"{value[:20]!r} is not a whole number of messages from 0 to {HISTORY_MAX}")
    return str(int(value))


def _env_answer(settings: Settings, channel_ids: tuple[int, ...]) -> str:
    if any(cid in settings.always_answer_channels for cid in channel_ids):
        return EVERY
    return settings.answer_mode


@dataclass(frozen=True)
class Option:
    """One setting: its key (the stored key and its name in /settings), where it can be set, how
    a typed value is checked (`parse`: the stored text, or BadValue), the `.env` value a server
    inherits (`env`, given the ids of the channel and its parent), what it does (`help`) and the
    `.env` settings it starts from (`env_name`, for the docs; "-": none)."""
    key: str
    levels: tuple[str, ...]
    parse: Callable[[str], str]
    env: Callable[[Settings, tuple[int, ...]], str]
    help: str
    env_name: str


OPTIONS: dict[str, Option] = {option.key: option for option in (
    Option("persona", (SERVER, CHANNEL, THREAD), _text(PERSONA_MAX), lambda s, c: "",
           "added to the system prompt after MUNINN_PERSONA (a role, a tone, rules of the place)", "MUNINN_PERSONA"),
    Option("answer", (SERVER, CHANNEL, THREAD), _choice(*ANSWER_MODES), _env_answer,
           "when Muninn answers: mentions (a mention or a reply to it), every message, or never (DMs "
           "are always answered)", "MUNINN_ANSWER_MODE, MUNINN_ALWAYS_ANSWER_CHANNELS"),
    Option("history", (SERVER, CHANNEL, THREAD), _history, lambda s, c: str(s.history_limit),
           "recent messages of the channel put into the prompt", "MUNINN_HISTORY_LIMIT"),
    Option("learning", (SERVER, CHANNEL, THREAD), _choice(ON, OFF), lambda s, c: ON if s.extraction else OFF,
           "whether Muninn learns facts from the conversations here", "MUNINN_EXTRACTION"),
    Option("language", (SERVER, CHANNEL, THREAD), _text(LANGUAGE_MAX), lambda s, c: s.language,
           "the language Muninn answers in when the message does not make it plain", "MUNINN_LANGUAGE"),
    Option("auto_thread", (SERVER, CHANNEL), _choice(ON, OFF), lambda s, c: ON if s.auto_thread else OFF,
           "a mention in a channel opens a thread, where Muninn then answers every message", "MUNINN_AUTO_THREAD"),
    Option("room_memory", (SERVER,), _choice(*MODES), lambda s, c: DEFAULT_MODE,
           "how Muninn learns what members teach a room: moderated, open or off (`/memory room`)", "-"),
)}


@dataclass(frozen=True)
class Value:
    """A setting's value where it applies, and the level it comes from (thread, channel, server, .env)."""
    value: str
    source: str


@dataclass(frozen=True)
class Tuning:
    """The settings that apply in one place (`resolve`), and whether Muninn reads every message
    (False: started without the Message Content intent)."""
    values: Mapping[str, Value]
    reads_everything: bool = True

    def __getitem__(self, key: str) -> str:
        return self.values[key].value

    @property
    def answer(self) -> str:
        """The answer mode in effect: without the Message Content intent, `every` answers mentions only."""
        mode = self["answer"]
        return MENTIONS if mode == EVERY and not self.reads_everything else mode

    @property
    def history(self) -> int:
        """Recent messages put into the prompt."""
        return int(self["history"])

    @property
    def learning(self) -> bool:
        """Whether facts are learned from the conversations here."""
        return self["learning"] == ON

    @property
    def auto_thread(self) -> bool:
        """Whether a mention in the channel opens a thread."""
        return self["auto_thread"] == ON

    def persona(self, base: str) -> str:
        """The operator's persona with the place's addition and language hint."""
        lines = [base.strip()]
        if self["persona"]:
            lines.append(self["persona"])
        if self["language"]:
            lines.append(f"Unless a message plainly asks for another language, answer in {self['language']}.")
        return "\n".join(lines)


def resolve(settings: Settings, stored: Stored, *, guild_id: int | None, channel_id: int,
            parent_id: int | None = None, reads_everything: bool = True) -> Tuning:
    """The settings that apply in a channel, or in a thread (`channel_id`) of `parent_id`: the
    first level that sets each of them, from the thread up to the `.env`. A DM has no server:
    only the `.env` applies there."""
    levels: list[tuple[str, Mapping[str, str]]] = []
    if guild_id is not None:
        if parent_id is not None:
            levels += [(THREAD, stored.channel(channel_id)), (CHANNEL, stored.channel(parent_id))]
        else:
            levels.append((CHANNEL, stored.channel(channel_id)))
        levels.append((SERVER, stored.guild))
    ids = (channel_id,) if parent_id is None else (channel_id, parent_id)
    values: dict[str, Value] = {}
    for key, option in OPTIONS.items():
        values[key] = next((Value(found[key], level) for level, found in levels
                            if key in found and level in option.levels), Value(option.env(settings, ids), ENV))
    return Tuning(values, reads_everything=reads_everything)


def default(settings: Settings) -> Tuning:
    """The `.env`'s settings alone (a DM, `muninn chat`)."""
    return resolve(settings, Stored(), guild_id=None, channel_id=0)
