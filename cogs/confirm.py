"""Asking a person in a channel before forgetting what they asked, in plain words, to forget.

In a DM the matching memories are listed in the question. In a server channel the question
is public, so it names only how many matched: the texts (which may include another private
fact that merely resembles the words) are shown by **Show**, as an answer only the asker sees.
The buttons answer only the person who asked; after a confirmation or a cancel (or the
timeout) they are removed, so the question never stays open.
"""
from __future__ import annotations

import logging

import discord

from bot.conversation.pipeline import ForgetOffer

log = logging.getLogger(__name__)

CONFIRM_TIMEOUT = 300
PREVIEW = 160


def offer_text(offer: ForgetOffer) -> str:
    count = len(offer.memories)
    if not offer.in_private:
        return (f"I found {count} {'memory' if count == 1 else 'memories'} of yours that match. "
                "**Show** lists them for your eyes only. Forget " + ("it?" if count == 1 else "them?"))
    return memory_list(offer) + "\nForget " + ("it?" if count == 1 else "them?")


def memory_list(offer: ForgetOffer) -> str:
    lines = [offer.intro]
    for memory in offer.memories[:10]:
        text = " ".join(memory.text.split())
        text = text if len(text) <= PREVIEW else text[:PREVIEW - 1] + "…"
        lines.append(f"- `#{memory.id}` {discord.utils.escape_markdown(text)}")
    if len(offer.memories) > 10:
        lines.append(f"… and {len(offer.memories) - 10} more")
    return "\n".join(lines)


class ConfirmForget(discord.ui.View):
    def __init__(self, offer: ForgetOffer):
        super().__init__(timeout=CONFIRM_TIMEOUT)
        self.offer = offer
        self.message: discord.Message | None = None
        if offer.in_private:
            self.remove_item(self.show)

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        if interaction.user.id != self.offer.author_id:
            await interaction.response.send_message("These buttons belong to someone else.", ephemeral=True)
            return False
        return True

    @discord.ui.button(label="Forget", style=discord.ButtonStyle.danger)
    async def confirm(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.stop()
        removed = await self.offer.forget()
        await interaction.response.edit_message(
            content=f"Forgotten: {removed} {'memory' if removed == 1 else 'memories'}.", view=None)

    @discord.ui.button(label="Show", style=discord.ButtonStyle.primary)
    async def show(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        await interaction.response.send_message(memory_list(self.offer), ephemeral=True,
                                                allowed_mentions=discord.AllowedMentions.none())

    @discord.ui.button(label="Keep", style=discord.ButtonStyle.secondary)
    async def keep(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.stop()
        await interaction.response.edit_message(content="Kept: nothing was forgotten.", view=None)

    async def on_error(self, interaction: discord.Interaction, error: Exception, item: discord.ui.Item) -> None:
        log.error("forget confirmation failed for user %s", interaction.user.id, exc_info=error)
        if not interaction.response.is_done():
            await interaction.response.send_message("Something went wrong on my side; it has been logged.",
                                                    ephemeral=True)

    async def on_timeout(self) -> None:
        if self.message is not None:
            try:
                await self.message.edit(content="Nothing was forgotten (no answer).", view=None)
            except discord.HTTPException:
                pass
