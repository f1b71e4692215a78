"""`/memory room`: a channel's moderators look after what Muninn tells everyone there.

A subgroup of `/memory` (cogs/memory.py's MemoryCog takes these commands in as `RoomModeration`).
Every answer is ephemeral, and each command needs the Manage Messages permission in the channel
it runs in (the server's owner and administrators have it); `/memory room mode` with a mode needs
Manage Server. What they show and change is this channel's room memories only:
  mode [moderated|open|off]  the server's room memory mode (bot/lifecycle/room_policy.py);
  list, search               the room memories, who taught each and when, who vouched for it;
  pending, approve, reject   members' room claims waiting for a moderator (moderated mode);
  forget                     forget one room memory;
  log                        the latest moderator actions here.
Approving, rejecting, forgetting and changing the mode are logged (who, when, what, which
memory, where; never a memory's text).
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal, Optional

import discord
from discord import app_commands
from discord.ext import commands

from bot.memory.records import SET
from bot.memory.rooms import MODES, RoomMemory

from .answers import fit, shorten
from .client import Refusal

PAGE = 10
Mode = Literal["moderated", "open", "off"]
NEEDS_MANAGE_MESSAGES = "Moderating this channel's room memories needs the Manage Messages permission here."
NEEDS_MANAGE_GUILD = "Changing the room memory mode of this server needs the Manage Server permission."
ONLY_IN_A_SERVER = "Room memories belong to server channels: use this command in one."
MODE_MEANING = {
    "moderated": "what members who may not moderate a channel teach its room waits for a moderator's approval "
                 "(`/memory room pending`)",
    "open": "what members teach a room is kept at once, as their own attributed claim",
    "off": "Muninn learns no room memories from conversation (`/memory remember scope:room` still works)",
}


def when(ts: float) -> str:
    """A date Discord shows in each reader's own time zone."""
    return discord.utils.format_dt(datetime.fromtimestamp(ts, timezone.utc), "D")


def standing(item: RoomMemory) -> str:
    """Who taught a room memory and when, and who vouched for it."""
    memory, approval = item.memory, item.approval
    teacher = f"<@{memory.owner_id}>" if memory.owner_id is not None else "someone"
    if approval is not None and approval.how == SET:
        return f"set by moderator {teacher} on {when(memory.created_at)}"
    said = f"taught by {teacher} on {when(memory.created_at)}"
    if approval is None:
        return said
    moderator = f"<@{approval.moderator_id}>" if approval.moderator_id is not None else "a moderator"
    return f"{said}, approved by {moderator} on {when(approval.at)}"


def line(item: RoomMemory) -> str:
    """One room memory: its id, its shortened text, who stands behind it."""
    return f"`#{item.memory.id}` {discord.utils.escape_markdown(shorten(item.memory.text))} ({standing(item)})"


def moderating(interaction: discord.Interaction) -> None:
    """Refuse a caller who may not moderate this channel's room memories (or who is in a DM)."""
    if interaction.guild_id is None or interaction.channel_id is None:
        raise Refusal(ONLY_IN_A_SERVER)
    if not interaction.permissions.manage_messages:
        raise Refusal(NEEDS_MANAGE_MESSAGES)


class RoomModeration(commands.Cog):
    """The `/memory room` commands, a base of MemoryCog (a subgroup of its `/memory` group); never added alone."""

    bot: commands.Bot
    room = app_commands.Group(name="room", description="Moderate what Muninn tells everyone in this channel")

    @property
    def rooms(self):
        """The engine's room memory moderation (engine.rooms)."""
        return self.bot.engine.rooms  # type: ignore[attr-defined]

    async def _page(self, interaction: discord.Interaction, page: int, *, pending: bool) -> None:
        moderating(interaction)
        assert interaction.channel_id is not None
        lister = self.rooms.pending if pending else self.rooms.memories
        found, total = await lister(interaction.channel_id, limit=PAGE, offset=(page - 1) * PAGE)
        pages = max(1, -(-total // PAGE))
        kind = "room claims waiting for a moderator" if pending else "room memories"
        if not total:
            head = f"No {kind} in this channel."
        elif not found:
            head = f"{total} {kind} in this channel; there is no page {page} (the last is {pages})."
        else:
            head = f"{total} {kind} in this channel, page {page} of {pages}" + (
                " (`/memory room approve` or `reject` each by its number):" if pending else ":")
        await interaction.response.send_message(fit([head, *(line(item) for item in found)]), ephemeral=True)

    @room.command(name="mode", description="Show or set how Muninn learns room memories in this server")
    @app_commands.describe(mode="moderated (default), open or off; leave it out to see the current mode")
    async def room_mode(self, interaction: discord.Interaction, mode: Optional[Mode] = None) -> None:
        """/memory room mode: the server's room memory mode; with a mode, set it (Manage Server)."""
        if interaction.guild_id is None or interaction.channel_id is None:
            raise Refusal(ONLY_IN_A_SERVER)
        if mode is None:
            current = await self.rooms.mode(interaction.guild_id)
            await interaction.response.send_message(
                f"Room memory in this server is **{current}**: {MODE_MEANING[current]}.", ephemeral=True)
            return
        if not interaction.permissions.manage_guild:
            raise Refusal(NEEDS_MANAGE_GUILD)
        assert mode in MODES
        await interaction.response.defer(ephemeral=True, thinking=True)
        await self.rooms.set_mode(interaction.guild_id, mode, moderator_id=interaction.user.id,
                                  channel_id=interaction.channel_id)
        await interaction.followup.send(f"Room memory in this server is now **{mode}**: {MODE_MEANING[mode]}.",
                                        ephemeral=True)

    @room.command(name="list", description="This channel's room memories: who taught each, and when")
    @app_commands.describe(page="Which page (10 memories each, newest first)")
    async def room_list(self, interaction: discord.Interaction, page: app_commands.Range[int, 1] = 1) -> None:
        """/memory room list: the channel's room memories, newest first, a page at a time."""
        await self._page(interaction, page, pending=False)

    @room.command(name="pending", description="Members' room claims waiting for a moderator in this channel")
    @app_commands.describe(page="Which page (10 claims each, newest first)")
    async def room_pending(self, interaction: discord.Interaction, page: app_commands.Range[int, 1] = 1) -> None:
        """/memory room pending: the claims waiting for approval here, newest first."""
        await self._page(interaction, page, pending=True)

    @room.command(name="search", description="Find this channel's room memories by their words")
    @app_commands.describe(text="Words the room memories hold")
    async def room_search(self, interaction: discord.Interaction, text: app_commands.Range[str, 1, 500]) -> None:
        """/memory room search: the channel's room memories holding any of the words, best first."""
        moderating(interaction)
        assert interaction.channel_id is not None
        found = await self.rooms.search(interaction.channel_id, text)
        head = (f"{len(found)} room memories here hold these words:" if found
                else "No room memory here holds these words.")
        await interaction.response.send_message(fit([head, *(line(item) for item in found)]), ephemeral=True)

    async def _act(self, interaction: discord.Interaction, memory_id: int, action: str) -> None:
        moderating(interaction)
        assert interaction.channel_id is not None
        await interaction.response.defer(ephemeral=True, thinking=True)  # approving embeds: may take a moment
        act = {"approve": self.rooms.approve, "reject": self.rooms.reject, "forget": self.rooms.forget}[action]
        memory = await act(memory_id, channel_id=interaction.channel_id, guild_id=interaction.guild_id,
                           moderator_id=interaction.user.id)
        if memory is None:
            what = "room claim waiting for a moderator" if action != "forget" else "room memory"
            await interaction.followup.send(f"No {what} #{memory_id} in this channel.", ephemeral=True)
            return
        done = {"approve": "Approved", "reject": "Rejected and deleted", "forget": "Forgot"}[action]
        text = discord.utils.escape_markdown(shorten(memory.text))
        after = ("\nEveryone in this channel may now be told it, as its teacher's claim approved by you."
                 if action == "approve" else "")
        await interaction.followup.send(f"{done} #{memory_id}: {text}{after}", ephemeral=True)

    @room.command(name="approve", description="Approve a member's room claim waiting in this channel")
    @app_commands.rename(memory_id="id")
    @app_commands.describe(memory_id="The claim's number, as /memory room pending shows it")
    async def room_approve(self, interaction: discord.Interaction, memory_id: app_commands.Range[int, 1]) -> None:
        """/memory room approve: the claim becomes a room memory, approved by the caller (logged)."""
        await self._act(interaction, memory_id, "approve")

    @room.command(name="reject", description="Reject and delete a member's room claim waiting in this channel")
    @app_commands.rename(memory_id="id")
    @app_commands.describe(memory_id="The claim's number, as /memory room pending shows it")
    async def room_reject(self, interaction: discord.Interaction, memory_id: app_commands.Range[int, 1]) -> None:
        """/memory room reject: the claim is deleted (logged)."""
        await self._act(interaction, memory_id, "reject")

    @room.command(name="forget", description="Forget one of this channel's room memories")
    @app_commands.rename(memory_id="id")
    @app_commands.describe(memory_id="The memory's number, as /memory room list shows it")
    async def room_forget(self, interaction: discord.Interaction, memory_id: app_commands.Range[int, 1]) -> None:
        """/memory room forget: the room memory is deleted (logged)."""
        await self._act(interaction, memory_id, "forget")

    @room.command(name="log", description="The latest moderator actions on this channel's room memories")
    async def room_log(self, interaction: discord.Interaction) -> None:
        """/memory room log: who approved, rejected or forgot which memory here, and when; mode changes."""
        moderating(interaction)
        assert interaction.channel_id is not None
        entries = await self.rooms.log(interaction.channel_id)
        lines = [f"{when(e.at)} <@{e.moderator_id}> {e.action}" + (f" #{e.memory_id}" if e.memory_id else "")
                 for e in entries]
        head = "Latest moderator actions here, newest first:" if lines else "No moderator action here yet."
        await interaction.response.send_message(fit([head, *lines]), ephemeral=True)
