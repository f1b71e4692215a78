"""Asking a person in a channel before forgetting what they asked, in plain words, to forget.

In a DM the matching memories are listed in the question. In a server channel the question
is public, so it names only how many matched: the texts (which may include another private
fact that merely resembles the words) are shown by **Show**, as an answer only the asker sees.
The buttons answer only the person who asked; after a confirmation or a cancel (or the
timeout) they are removed, so the question never stays open.

The buttons survive a restart of the bot: each one is a `DynamicItem` whose custom id carries
the action, the asker and the memory ids (base 36, within Discord's 100 characters), so a
click after a restart still forgets exactly what was offered, and only the asker's own
personal memories (`Engine.forget_personal` checks). A question older than the timeout
answers that it expired. An offer too large to encode (many long ids) uses buttons that
live only in this process, as before.
"""
from __future__ import annotations

import logging
import re
from typing import Awaitable, Callable

import discord

from bot.conversation.outlets import ForgetOffer

log = logging.getLogger(__name__)

CONFIRM_TIMEOUT = 300
PREVIEW = 160


def offer_text(offer: ForgetOffer) -> str:
    """The question: in private, the memories listed; in a channel,
    only how many matched (**Show** lists them to the asker alone)."""
    count = len(offer.memories)
    if not offer.in_private:
        return (f"I found {count} {'memory' if count == 1 else 'memories'} of yours that match. "
                "**Show** lists them for your eyes only. Forget " + ("it?" if count == 1 else "them?"))
    return memory_list(offer) + "\nForget " + ("it?" if count == 1 else "them?")


def memory_list(offer: ForgetOffer) -> str:
    """The offer's intro and up to 10 of its memories (id and shortened
    text, markdown escaped), then how many more there are."""
    lines = [offer.intro]
    for memory in offer.memories[:10]:
        text = " ".join(memory.text.split())
        text = text if len(text) <= PREVIEW else text[:PREVIEW - 1] + "…"
        lines.append(f"- `#{memory.id}` {discord.utils.escape_markdown(text)}")
    if len(offer.memories) > 10:
        lines.append(f"… and {len(offer.memories) - 10} more")
    return "\n".join(lines)


CUSTOM_ID_LIMIT = 100                      # Discord's limit for a component's custom id
FORGET, SHOW, KEEP = "f", "s", "k"
TEMPLATE = r"muninn:forget:(?P<action>[fsk]):(?P<owner>[0-9a-z]+):(?P<ids>[0-9a-z]+(?:\.[0-9a-z]+)*)"
EXPIRED = "This question has expired: nothing was forgotten. Ask me again if you still want it."


def to_base36(number: int) -> str:
    """A non-negative `number` in base 36, lowercase."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        number, rest = divmod(number, 36)
        out = digits[rest] + out
        if number == 0:
            return out


def custom_id(action: str, owner_id: int, memory_ids: list[int]) -> str:
    """One button's custom id: the action, the owner and the memory ids, in base 36 (TEMPLATE)."""
    return f"muninn:forget:{action}:{to_base36(owner_id)}:" + ".".join(to_base36(i) for i in memory_ids)


def fits(offer: ForgetOffer) -> bool:
    """Whether the offer's custom ids fit CUSTOM_ID_LIMIT (if not, its buttons live only in this process)."""
    return len(custom_id(FORGET, offer.author_id, [m.id for m in offer.memories])) <= CUSTOM_ID_LIMIT


# The questions this process is waiting on, by message id: an answer (from whichever button
# object Discord's click reached) stops the question's timeout, so it never overwrites the answer.
_waiting: dict[int, "ConfirmForget"] = {}


class ForgetButton(discord.ui.DynamicItem[discord.ui.Button], template=TEMPLATE):
    """Forget / Show / Keep of one offer, rebuilt from its custom id by discord.py on every click."""

    STYLES = {FORGET: ("Forget", discord.ButtonStyle.danger), SHOW: ("Show", discord.ButtonStyle.primary),
              KEEP: ("Keep", discord.ButtonStyle.secondary)}

    def __init__(self, action: str, owner_id: int, memory_ids: list[int]):
        label, style = self.STYLES[action]
        super().__init__(discord.ui.Button(label=label, style=style,
                                           custom_id=custom_id(action, owner_id, memory_ids)))
        self.action, self.owner_id, self.memory_ids = action, owner_id, memory_ids

    @classmethod
    async def from_custom_id(cls, interaction: discord.Interaction, item: discord.ui.Item,
                             match: re.Match[str]) -> "ForgetButton":
        """The button a click's custom id describes (discord.py calls this on every click)."""
        return cls(match["action"], int(match["owner"], 36), [int(i, 36) for i in match["ids"].split(".")])

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        """Only the asker may press it; anyone else is told so, privately."""
        return await _is_askers(interaction, self.owner_id)

    async def callback(self, interaction: discord.Interaction) -> None:
        """Answer the click (Show, Forget or Keep); a failure is logged and the clicker told so."""
        await _answer_safely(interaction, self._answer(interaction))

    async def _answer(self, interaction: discord.Interaction) -> None:
        message = interaction.message
        pipeline = getattr(interaction.client, "pipeline", None)
        if pipeline is None:  # still starting up
            await interaction.response.send_message("I am just starting up; try again in a moment.", ephemeral=True)
            return
        if self.action == SHOW:
            memories = await pipeline.engine.get_many(self.memory_ids)
            mine = [memories[i] for i in self.memory_ids if i in memories
                    and memories[i].scope == "personal" and memories[i].owner_id == self.owner_id]
            offer = ForgetOffer(self.owner_id, mine, "You asked me to forget:", _nothing)
            text = memory_list(offer) if mine else "None of them is left: nothing to forget."
            await interaction.response.send_message(text, ephemeral=True,
                                                    allowed_mentions=discord.AllowedMentions.none())
            return
        live = _waiting.pop(message.id, None) if message is not None else None
        if live is not None:
            live.stop()
        elif message is not None and (interaction.created_at - message.created_at).total_seconds() > CONFIRM_TIMEOUT:
            await interaction.response.edit_message(content=EXPIRED, view=None)  # asked before a restart, long ago
            return
        await _close(interaction, self.action, lambda: pipeline.forget_memories(self.owner_id, self.memory_ids))


async def _nothing() -> int:
    return 0


async def _is_askers(interaction: discord.Interaction, owner_id: int) -> bool:
    if interaction.user.id != owner_id:
        await interaction.response.send_message("These buttons belong to someone else.", ephemeral=True)
        return False
    return True


async def _answer_safely(interaction: discord.Interaction, answer: Awaitable[None]) -> None:
    """A failed answer is logged and the clicker told so, instead of Discord's silent "interaction failed"."""
    try:
        await answer
    except Exception:
        log.exception("forget confirmation failed for user %s", interaction.user.id)
        if not interaction.response.is_done():
            await interaction.response.send_message("Something went wrong on my side; it has been logged.",
                                                    ephemeral=True)


async def _close(interaction: discord.Interaction, action: str, forget: Callable[[], Awaitable[int]]) -> None:
    """Keep or Forget: the question's message becomes the answer, without buttons."""
    if action == KEEP:
        await interaction.response.edit_message(content="Kept: nothing was forgotten.", view=None)
        return
    removed = await forget()
    await interaction.response.edit_message(
        content=f"Forgotten: {removed} {'memory' if removed == 1 else 'memories'}.", view=None)


class ConfirmForget(discord.ui.View):
    """The question's buttons; removed (the question closed) when nobody answers in time."""

    def __init__(self, offer: ForgetOffer):
        super().__init__(timeout=CONFIRM_TIMEOUT)
        self.offer = offer
        self.message: discord.Message | None = None
        ids = [m.id for m in offer.memories]
        actions = [FORGET, KEEP] if offer.in_private else [FORGET, SHOW, KEEP]
        if fits(offer):
            for action in actions:
                self.add_item(ForgetButton(action, offer.author_id, ids))
        else:
            for action in actions:
                self.add_item(_LiveButton(self, action))

    def posted(self, message: discord.Message) -> None:
        """The question was posted as `message`: a click on any of its buttons now stops this view."""
        self.message = message
        _waiting[message.id] = self

    def stop(self) -> None:
        """Stop waiting for an answer (no timeout follows)."""
        if self.message is not None:
            _waiting.pop(self.message.id, None)
        super().stop()

    async def on_timeout(self) -> None:
        """Nobody answered in time: the question, without its buttons, says that nothing was forgotten."""
        if self.message is not None:
            _waiting.pop(self.message.id, None)
            try:
                await self.message.edit(content="Nothing was forgotten (no answer).", view=None)
            except discord.HTTPException:
                pass


class _LiveButton(discord.ui.Button):
    """A button of an offer too large for custom ids: it lives only as long as this process."""

    def __init__(self, question: ConfirmForget, action: str):
        label, style = ForgetButton.STYLES[action]
        super().__init__(label=label, style=style)
        self.question, self.action = question, action

    async def callback(self, interaction: discord.Interaction) -> None:
        if await _is_askers(interaction, self.question.offer.author_id):
            await _answer_safely(interaction, self._answer(interaction))

    async def _answer(self, interaction: discord.Interaction) -> None:
        offer = self.question.offer
        if self.action == SHOW:
            await interaction.response.send_message(memory_list(offer), ephemeral=True,
                                                    allowed_mentions=discord.AllowedMentions.none())
            return
        self.question.stop()
        await _close(interaction, self.action, offer.forget)
