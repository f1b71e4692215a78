"""`/memory`: let people see and manage what Muninn remembers; `/always-answer` for admins.

Every answer is ephemeral, and every listing goes through the engine's scope rule, so a
personal memory is only ever shown to its owner. Who may change what:
  personal memories: their owner;
  room memories:     members with Manage Messages in that memory's channel;
  global memories:   the bot owner (MUNINN_OWNER_IDS, else the application's owner).
Refusals raise `Refusal`, which the bot's one error handler shows to the caller.
"""
from __future__ import annotations

import io
import json
import logging
import math
from datetime import datetime, timezone
from typing import Literal, Optional

import discord
from discord import app_commands
from discord.ext import commands

from bot import store
from bot.scope import Viewer
from bot.store import Memory, MemoryNotFound, NewMemory

from .client import Refusal, answer_privately

log = logging.getLogger(__name__)

Scope = Literal["personal", "room", "global"]
PAGE_SIZE = 8
TEXT_PREVIEW = 160
MESSAGE_LIMIT = 2000
REMEMBERED_IMPORTANCE = 0.8  # told on purpose: worth keeping longer than a fact picked up in passing
VIEW_TIMEOUT = 600


def viewer_of(interaction: discord.Interaction) -> Viewer:
    if interaction.guild_id is None:
        return Viewer(user_id=interaction.user.id, channel_id=interaction.channel_id, dm=True)
    return Viewer(user_id=interaction.user.id, channel_id=interaction.channel_id, guild_id=interaction.guild_id)


def shorten(text: str, limit: int = TEXT_PREVIEW) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def fit(lines: list[str], limit: int = MESSAGE_LIMIT) -> str:
    """Join lines, leaving out the tail (and saying so) when they would exceed one message."""
    out: list[str] = []
    used = 0
    for index, line in enumerate(lines):
        if used + len(line) + 1 > limit - 40:
            out.append(f"… and {len(lines) - index} more lines not shown")
            break
        out.append(line)
        used += len(line) + 1
    return "\n".join(out)


class MemoryCog(commands.GroupCog, group_name="memory",
                group_description="See and manage what Muninn remembers"):
    def __init__(self, bot: commands.Bot):
        self.bot = bot
        super().__init__()

    @property
    def engine(self):
        return self.bot.engine  # type: ignore[attr-defined]

    @property
    def pipeline(self):
        return self.bot.pipeline  # type: ignore[attr-defined]

    # -- presentation ----------------------------------------------------------

    def where(self, memory: Memory) -> str:
        if memory.scope == "room":
            return f"room <#{memory.channel_id}>"
        if memory.scope == "global":
            return "global"
        if memory.guild_id is None:
            return "personal, from a DM"
        guild = self.bot.get_guild(memory.guild_id)
        return f"personal, from {guild.name if guild else 'a server'}"

    def describe(self, memory: Memory) -> str:
        return f"`#{memory.id}` ({self.where(memory)}) {discord.utils.escape_markdown(shorten(memory.text))}"

    # -- permissions -----------------------------------------------------------

    async def require_may_change(self, interaction: discord.Interaction, scope: str, *, owner_id: int | None,
                                 channel_id: int | None, what: str) -> None:
        """Refuse unless the caller may create or delete `what` (a memory of this scope)."""
        if scope == "personal":
            if owner_id != interaction.user.id:
                raise Refusal(f"{what} is someone else's personal memory: only they can change it.")
        elif scope == "room":
            if not await self.may_manage_room(interaction, channel_id, what):
                raise Refusal(f"Changing the room memories of <#{channel_id}> needs the Manage Messages "
                              "permission in that channel.")
        elif not await self.bot.is_owner(interaction.user):
            raise Refusal("Only the bot's owner can change global memories.")

    async def may_manage_room(self, interaction: discord.Interaction, channel_id: int | None, what: str) -> bool:
        if interaction.guild is None:
            raise Refusal(f"{what} belongs to a server channel: run this command in that server.")
        if channel_id == interaction.channel_id:
            return interaction.permissions.manage_messages  # computed by Discord for this channel
        channel = interaction.guild.get_channel_or_thread(channel_id) if channel_id else None
        if channel is None or not isinstance(interaction.user, discord.Member):
            raise Refusal(f"{what} belongs to a channel of another server: run this command there.")
        return channel.permissions_for(interaction.user).manage_messages

    # -- commands ----------------------------------------------------------------

    @app_commands.command(name="list", description="What Muninn remembers that you can see here")
    @app_commands.describe(scope="Only memories of this kind")
    async def list_memories(self, interaction: discord.Interaction, scope: Optional[Scope] = None) -> None:
        pages = MemoryPages(self, viewer_of(interaction), scope)
        content = await pages.render()
        if pages.pages > 1:
            await interaction.response.send_message(content, view=pages, ephemeral=True)
            pages.origin = interaction
        else:
            pages.stop()
            await interaction.response.send_message(content, ephemeral=True)

    @app_commands.command(name="search", description="What Muninn would recall here for a text, and why")
    @app_commands.describe(query="The text to recall for, as if you had written it in this channel")
    async def search(self, interaction: discord.Interaction, query: app_commands.Range[str, 1, 500]) -> None:
        await interaction.response.defer(ephemeral=True, thinking=True)  # embedding may take a moment
        result = await self.engine.recall(query, viewer_of(interaction), touch=False)
        lines = [f"Recall for “{discord.utils.escape_markdown(shorten(query, 100))}”: {result.mode} "
                 f"(vectors: {result.vector_status}), {len(result.memories)} memories. Nothing was touched."]
        for rank, recalled in enumerate(result.memories, start=1):
            lines.append(f"{rank}. {self.describe(recalled.memory)}")
            lines.append(f"    ↳ {explain(recalled.candidate.reason())}")
        if not result.memories:
            lines.append("Nothing here matches.")
        await interaction.followup.send(fit(lines), ephemeral=True)

    @app_commands.command(name="forget", description="Forget one memory")
    @app_commands.rename(memory_id="id")
    @app_commands.describe(memory_id="The memory's number, as /memory list shows it")
    async def forget(self, interaction: discord.Interaction, memory_id: app_commands.Range[int, 1]) -> None:
        try:
            memory = await self.engine.run(store.get, memory_id)
        except MemoryNotFound:
            raise Refusal(f"There is no memory #{memory_id}.") from None
        await self.require_may_change(interaction, memory.scope, owner_id=memory.owner_id,
                                      channel_id=memory.channel_id, what=f"Memory #{memory_id}")
        await self.engine.forget([memory_id])
        await interaction.response.send_message(
            f"Forgot memory #{memory_id}: {discord.utils.escape_markdown(shorten(memory.text))}", ephemeral=True)

    @app_commands.command(name="forget-all", description="Forget everything Muninn remembers about you")
    async def forget_all(self, interaction: discord.Interaction) -> None:
        count = len(await self.engine.run(store.personal_memories, interaction.user.id))
        view = ConfirmForgetAll(self, interaction.user.id)
        await interaction.response.send_message(
            f"This deletes all {count} of your personal memories, learned anywhere, and your messages in "
            "Muninn's conversation history. It cannot be undone.", view=view, ephemeral=True)

    @app_commands.command(name="remember", description="Tell Muninn something to remember")
    @app_commands.describe(text="What to remember", scope="personal (default): only you; room: this channel; "
                                                          "global: everyone (bot owner only)")
    async def remember(self, interaction: discord.Interaction, text: app_commands.Range[str, 1, store.MAX_TEXT_CHARS],
                       scope: Scope = "personal") -> None:
        if scope == "room" and interaction.guild_id is None:
            raise Refusal("A room memory belongs to a server channel; in a DM, use the personal scope.")
        await self.require_may_change(interaction, scope, owner_id=interaction.user.id,
                                      channel_id=interaction.channel_id, what="A room memory")
        try:
            memory = NewMemory(text=text, scope=scope, owner_id=interaction.user.id,
                               channel_id=interaction.channel_id, guild_id=interaction.guild_id,
                               importance=REMEMBERED_IMPORTANCE)
        except ValueError as exc:
            raise Refusal(f"Muninn cannot remember that: {exc}.") from None
        await interaction.response.defer(ephemeral=True, thinking=True)  # embedding may take a moment
        memory_id = await self.engine.remember(memory)
        audience = {"personal": "only you will see it, in DMs with Muninn"
                                + ("" if interaction.guild_id is None else " and in this server"),
                    "room": "everyone in this channel will see it",
                    "global": "everyone will see it, everywhere"}[scope]
        await interaction.followup.send(f"Remembered as memory #{memory_id} ({scope}): {audience}.", ephemeral=True)

    @app_commands.command(name="export", description="Download your personal memories as a JSON file")
    async def export(self, interaction: discord.Interaction) -> None:
        memories = await self.engine.run(store.personal_memories, interaction.user.id)
        now = datetime.now(timezone.utc)
        data = {"user_id": str(interaction.user.id), "exported_at": now.isoformat(timespec="seconds"),
                "memories": [memory.to_dict() for memory in memories]}
        payload = json.dumps(data, ensure_ascii=False, indent=2).encode("utf-8")
        file = discord.File(io.BytesIO(payload), filename=f"muninn-memories-{interaction.user.id}.json")
        await interaction.response.send_message(f"Your {len(memories)} personal memories.", file=file,
                                                ephemeral=True)


def explain(reason: dict) -> str:
    """A search result's reason() in words."""
    if reason["via"] == "link":
        link = reason["link"]
        return f"linked from #{link['from']} ({link['kind']}, weight {link['weight']})"
    parts = []
    if "fts_rank" in reason:
        parts.append(f"keyword rank {reason['fts_rank']}")
    if "vector_rank" in reason:
        parts.append(f"vector rank {reason['vector_rank']} (cosine {reason['cosine']:.3f})")
    return f"via {reason['via']}: " + ", ".join(parts) + f"; fused score {reason['fused_score']:.4f}"


class OwnerView(discord.ui.View):
    """Buttons only their owner may press; a failure answers privately instead of failing silently."""

    def __init__(self, owner_id: int):
        super().__init__(timeout=VIEW_TIMEOUT)
        self.owner_id = owner_id
        self.origin: discord.Interaction | None = None

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        if interaction.user.id != self.owner_id:
            await answer_privately(interaction, "These buttons belong to someone else.")
            return False
        return True

    async def on_error(self, interaction: discord.Interaction, error: Exception, item: discord.ui.Item) -> None:
        log.error("button %r failed for user %s", getattr(item, "label", item), interaction.user.id, exc_info=error)
        await answer_privately(interaction, "Something went wrong on my side; it has been logged.")

    async def on_timeout(self) -> None:
        if self.origin is not None:
            try:
                await self.origin.edit_original_response(view=None)
            except discord.HTTPException:
                pass  # the message is gone or the token expired: nothing left to tidy


class MemoryPages(OwnerView):
    def __init__(self, cog: MemoryCog, viewer: Viewer, scope: str | None):
        super().__init__(viewer.user_id)
        self.cog = cog
        self.viewer = viewer
        self.scope = scope
        self.page = 0
        self.pages = 1

    async def render(self) -> str:
        memories, total = await self.cog.engine.list_visible(self.viewer, scope=self.scope, limit=PAGE_SIZE,
                                                             offset=self.page * PAGE_SIZE)
        self.pages = max(1, math.ceil(total / PAGE_SIZE))
        self.previous.disabled = self.page == 0
        self.next.disabled = self.page >= self.pages - 1
        kind = f"{self.scope} memories" if self.scope else "memories"
        if not total:
            return f"Muninn has no {kind} you can see here yet."
        head = f"Your {kind} here: {total} in all, page {self.page + 1} of {self.pages}."
        return fit([head, *(self.cog.describe(memory) for memory in memories)])

    async def turn(self, interaction: discord.Interaction, step: int) -> None:
        self.page = max(0, self.page + step)
        content = await self.render()
        if self.page >= self.pages:  # memories were forgotten meanwhile
            self.page = self.pages - 1
            content = await self.render()
        await interaction.response.edit_message(content=content, view=self)

    @discord.ui.button(label="◀ Previous", style=discord.ButtonStyle.secondary)
    async def previous(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        await self.turn(interaction, -1)

    @discord.ui.button(label="Next ▶", style=discord.ButtonStyle.secondary)
    async def next(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        await self.turn(interaction, +1)


class ConfirmForgetAll(OwnerView):
    def __init__(self, cog: MemoryCog, owner_id: int):
        super().__init__(owner_id)
        self.cog = cog

    @discord.ui.button(label="Forget everything", style=discord.ButtonStyle.danger)
    async def confirm(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.stop()
        await interaction.response.edit_message(content="Forgetting…", view=None)
        memories, messages = await self.cog.pipeline.forget_person(self.owner_id)
        await interaction.edit_original_response(
            content=f"Done: Muninn forgot {memories} personal memories and {messages} messages of yours.")

    @discord.ui.button(label="Cancel", style=discord.ButtonStyle.secondary)
    async def cancel(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.stop()
        await interaction.response.edit_message(content="Nothing was forgotten.", view=None)


class ChannelOptions(commands.Cog):
    def __init__(self, bot: commands.Bot):
        self.bot = bot

    @app_commands.command(name="always-answer",
                          description="Answer every message in this channel, or only when mentioned or replied to")
    @app_commands.describe(enabled="True: answer everything here; False: only when mentioned or replied to")
    @app_commands.guild_only()
    @app_commands.default_permissions(manage_channels=True)
    @app_commands.checks.has_permissions(manage_channels=True)
    async def always_answer(self, interaction: discord.Interaction, enabled: bool) -> None:
        await self.bot.pipeline.set_always_answer(interaction.channel_id, interaction.guild_id, enabled)  # type: ignore[attr-defined]
        state = ("now answers every message in this channel" if enabled
                 else "now answers here only when mentioned or replied to")
        await interaction.response.send_message(f"Muninn {state}.", ephemeral=True)


async def setup(bot: commands.Bot) -> None:
    await bot.add_cog(MemoryCog(bot))
    await bot.add_cog(ChannelOptions(bot))
