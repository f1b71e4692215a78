"""Where the pipeline's replies go: an outlet posts them (Discord, the terminal) and may offer
more (streaming, a busy sign, a slow-down sign, asking before forgetting), each capability a protocol of its own."""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import AsyncContextManager, Awaitable, Callable, Protocol, runtime_checkable

from bot.memory.records import Memory


@dataclass(frozen=True)
class Sent:
    """One message the outlet posted; id None when the outlet has no ids (a terminal)."""
    message_id: int | None
    created_at: float


class Outlet(Protocol):
    """Where a reply goes: shows that Muninn is working, then posts the reply."""

    def typing(self) -> AsyncContextManager:
        """A block during which the outlet shows that Muninn is
        working (no_typing() for an outlet with nothing to show)."""

    async def send(self, text: str) -> list[Sent]:
        """Post the reply; returns the messages posted, in order ([] when none
        could be), the first of which the history records as the reply."""


@runtime_checkable
class StreamingOutlet(Outlet, Protocol):
    """An outlet that can show a reply while it is written (Discord, the terminal)."""

    def stream(self) -> "ReplyStream | None":   # None: not this time (e.g. no permission to edit)
        """A stream to show this reply on while it is written (only with MUNINN_STREAM_REPLIES)."""


@runtime_checkable
class BusyOutlet(Outlet, Protocol):
    """An outlet that can show a quiet sign that Muninn is busy (too many people waiting)."""

    async def busy(self) -> None:
        """Show that this message was seen but will not be answered: its channel's queue is full."""


@runtime_checkable
class SlowDownOutlet(Outlet, Protocol):
    """An outlet that can show a person, quietly, that they write faster than Muninn answers one person."""

    async def slow_down(self) -> None:
        """Show that this message was seen but will not be answered: its author is
        over their share of answers (MUNINN_RATE_PER_MINUTE; bot/conversation/rate.py)."""


@runtime_checkable
class ConfirmingOutlet(Outlet, Protocol):
    """An outlet that can ask a person before forgetting what they asked, in plain words, to forget."""

    async def confirm_forget(self, offer: "ForgetOffer") -> list[Sent]:
        """Show `offer` to the person and call `offer.forget()` only if they confirm (on Discord
        later, from its buttons); returns the messages posted ([] when none could be)."""


class ReplyStream(Protocol):
    """A reply shown while it is written (an outlet's `stream()`)."""

    async def update(self, text: str) -> None:   # the visible reply so far (it only grows)
        """Show `text` in place of what was shown so far; an outlet may skip an update (`finish` shows the end)."""

    async def finish(self, text: str) -> list[Sent]:  # the final reply: exactly what stays posted
        """End the stream with the final reply, which may not continue what was shown (the
        fallback after a broken stream); returns the messages posted, as `Outlet.send` does."""


@dataclass(frozen=True)
class ForgetOffer:
    """Memories a person asked in plain words to forget, shown to them before anything goes."""
    author_id: int
    memories: list[Memory]
    intro: str                                  # one line saying what was found
    forget: Callable[[], Awaitable[int]]        # forgets them; returns how many went
    in_private: bool = True                     # a DM or a terminal: the texts may be listed openly


@dataclass(frozen=True)
class CommandNames:
    """How a person runs Muninn's memory commands where they talk to it: every notice names these."""
    resume: str = "/memory resume"
    forget_all: str = "/memory forget-all"
    list: str = "/memory list"


DISCORD_COMMANDS = CommandNames()


def command_names(outlet: object) -> CommandNames:
    """The command names of `outlet` (its `commands` attribute), Discord's when it has none."""
    names = getattr(outlet, "commands", None)
    return names if isinstance(names, CommandNames) else DISCORD_COMMANDS


def no_typing() -> AsyncContextManager:
    """For outlets with nothing to show while Muninn thinks."""
    return nullcontext()
