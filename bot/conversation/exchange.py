"""One exchange of a conversation: what a person said and what Muninn answered.

The pipeline builds it after replying; fact extraction consumes it. Only
`user_message` may be mined for facts; `reply` and `recalled` are there so the
extractor can leave them out (no feedback loop).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol


@dataclass(frozen=True)
class Exchange:
    """What a person said and what Muninn answered, with where and by whom: the input of fact extraction."""
    author_id: int
    author_name: str                 # display name, used to attribute facts
    channel_id: int
    guild_id: int | None             # None = a DM; the local `muninn chat` room is guild 0
    dm: bool
    user_message: str
    user_message_id: int | None
    reply: str
    reply_message_id: int | None = None
    recalled: tuple[str, ...] = ()   # memory texts that were injected into the prompt
    created_at: float | None = None  # unix seconds of the user's message
    private: bool = False            # a guild channel not everyone in the guild can read
    # Display names of the people in the conversation (recent history and the author), so
    # extraction can tell a fact about the author from one about someone else who was there.
    participants: tuple[str, ...] = ()
    # People known by id, as (display name, user id): `mentions` are the people the message
    # mentions (Discord resolved them: exact), `speakers` the channel's recent speakers. What
    # is kept that names one of them is recorded as mentioning them, so they can find and erase it.
    mentions: tuple[tuple[str, int], ...] = ()
    speakers: tuple[tuple[str, int], ...] = ()
    # The author may moderate the channel (Manage Messages there; the server's owner and
    # administrators have it): what they teach the room stands as set by a moderator.
    moderator: bool = False


class ExchangeSink(Protocol):
    """The fact extractor, as the pipeline and the bot see it (bot.lifecycle.extractor.Extractor)."""

    def submit(self, exchange: Exchange) -> None:
        """Take an exchange for extraction; never blocks, never raises."""

    def forget(self, user_id: int) -> None:
        """Drop that person's queued and in-flight work (their forget-all ran)."""

    def forget_messages(self, message_ids: Iterable[int]) -> None:
        """These messages were deleted or their words edited: drop their queued exchanges, and
        make a batch already extracting them store nothing of them."""

    def mark_gone(self, message_ids: Iterable[int]) -> None:
        """Only the second half of `forget_messages`, safe on the database thread."""

    async def close(self) -> None:
        """Finish queued work, then stop."""
