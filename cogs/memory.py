"""`/memory`: let people see and manage what Muninn remembers.

Every answer is ephemeral, and every listing goes through the engine's scope rule, so a
personal memory is only ever shown to its owner. Who may change what:
  personal memories: their owner;
  room memories:     whoever taught it (its owner_id), and members with Manage Messages
                     in that memory's channel (their deletions are logged, as are those of
                     `/memory room`, cogs/moderation.py); what they add is set by a moderator;
  global memories:   the bot owner (MUNINN_OWNER_IDS, else the application's owner).
`/memory pause` and `/memory resume` stop and restart everything being kept of the caller;
`/memory why` shows the caller where one of their own memories came from.
`/memory forget` gives one answer for a memory that does not exist, is not visible here
or is not the caller's to change, so an id reveals nothing; only for a memory the caller
can see here does a refusal name the permission it needs. Forget-all and export cover
a person's personal memories, the room memories they taught, and other people's memories
that mention them (a fact of Bob's that names Dave): Dave never sees Bob's memory in recall
or /memory list, but he can export it, see where it came from (/memory why) and erase it
(/memory forget, forget-all). /memory remember keeps no password, token or key.
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

from bot import validate
from bot.lifecycle import sensitive
from bot.memory import records
from bot.memory.records import PENDING_REASON, SET, Memory, MemoryNotFound, NewMemory
from bot.memory.scope import Viewer

from .answers import choice_name, fit, shorten
from .chat import is_private_channel
from .client import Refusal, answer_privately
from .moderation import RoomModeration

log = logging.getLogger(__name__)

Scope = Literal["personal", "room", "global"]
PAGE_SIZE = 8
REMEMBERED_IMPORTANCE = 0.8  # told on purpose: worth keeping longer than a fact picked up in passing
VIEW_TIMEOUT = 600


def viewer_of(interaction: discord.Interaction) -> Viewer:
    """Who asks, and where: the interaction's user and channel, and its guild (none: a DM)."""
    if interaction.guild_id is None:
        return Viewer(user_id=interaction.user.id, channel_id=interaction.channel_id, dm=True)
    return Viewer(user_id=interaction.user.id, channel_id=interaction.channel_id, guild_id=interaction.guild_id)


class MemoryCog(RoomModeration, commands.GroupCog, group_name="memory",
                group_description="See and manage what Muninn remembers"):
    """`/memory`: list, search, forget, forget-all, remember, pause, resume, why and export, and
    the `/memory room` moderation commands (cogs/moderation.py), each answered to the caller alone."""
    def __init__(self, bot: commands.Bot):
        self.bot = bot
        super().__init__()

    @property
    def engine(self):
        """The bot's memory engine."""
        return self.bot.engine  # type: ignore[attr-defined]

    @property
    def pipeline(self):
        """The bot's conversation pipeline."""
        return self.bot.pipeline  # type: ignore[attr-defined]

    # -- presentation ----------------------------------------------------------

    def where(self, memory: Memory) -> str:
        """Where a memory belongs, in words: its room, global, or personal and where it was learned."""
        if memory.scope == "room":
            return f"room <#{memory.channel_id}>"
        if memory.scope == "global":
            return "global"
        if memory.guild_id is None:
            return "personal, from a DM"
        guild = self.bot.get_guild(memory.guild_id)
        return f"personal, from {guild.name if guild else 'a server'}"

    def describe(self, memory: Memory) -> str:
        """One line for a memory: its id, where it belongs and its shortened text."""
        return f"`#{memory.id}` ({self.where(memory)}) {discord.utils.escape_markdown(shorten(memory.text))}"

    # -- permissions -----------------------------------------------------------

    async def may_change(self, interaction: discord.Interaction, memory: Memory) -> bool:
        """Whether the caller may change a memory: a personal one, its owner; a room one, who
        taught it or who has Manage Messages in its channel; a global one, the bot's owner; and a
        personal or room memory that mentions the caller, the caller (to erase what names them)."""
        user_id = interaction.user.id
        if memory.scope != "global" and user_id in await self.engine.mentioned(memory.id):
            return True
        if memory.scope == "personal":
            return memory.owner_id == user_id
        if memory.scope == "room":
            return memory.owner_id == user_id or self.manages_room(interaction, memory.channel_id)
        return await self.bot.is_owner(interaction.user)

    @staticmethod
    def manages_room(interaction: discord.Interaction, channel_id: int | None) -> bool:
        """Manage Messages in that channel; False for a channel outside the server the command runs in."""
        if interaction.guild is None or channel_id is None:
            return False
        if channel_id == interaction.channel_id:
            return interaction.permissions.manage_messages  # computed by Discord for this channel
        channel = interaction.guild.get_channel_or_thread(channel_id)
        if channel is None or not isinstance(interaction.user, discord.Member):
            return False
        return channel.permissions_for(interaction.user).manage_messages

    async def permission_needed(self, interaction: discord.Interaction, memory: Memory) -> str | None:
        """Why the caller may not change a memory they can see here (None: they cannot see it)."""
        try:
            await self.engine.get_visible(viewer_of(interaction), memory.id)
        except MemoryNotFound:
            return None
        if memory.scope == "room":
            return "Changing the room memories of this channel needs the Manage Messages permission here."
        if memory.scope == "global":
            return "Only the bot's owner can change global memories."
        return None

    # -- commands ----------------------------------------------------------------

    @app_commands.command(name="list", description="What Muninn remembers that you can see here")
    @app_commands.describe(scope="Only memories of this kind")
    async def list_memories(self, interaction: discord.Interaction, scope: Optional[Scope] = None) -> None:
        """/memory list: the memories the caller may see here, a page at a time."""
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
        """/memory search: what a recall of the text would find here, and why; nothing is touched."""
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
        """/memory forget: forget one memory the caller may change. Any other id gets one answer,
        unless the caller can see that memory here: then the refusal names the permission it needs."""
        try:
            memory = await self.engine.get(memory_id)
        except MemoryNotFound:
            memory = None
        if memory is None or not await self.may_change(interaction, memory):
            needed = await self.permission_needed(interaction, memory) if memory is not None else None
            raise Refusal(needed or f"No memory #{memory_id} that you can change here.")
        # Deferred: when an import or maintain holds the database, the forget waits (and retries) for
        # longer than the 3 s Discord gives a first answer.
        await interaction.response.defer(ephemeral=True, thinking=True)
        if memory.scope == "room" and memory.owner_id != interaction.user.id:  # a moderator's deletion: logged
            assert memory.channel_id is not None
            await self.engine.rooms.forget(memory_id, channel_id=memory.channel_id, guild_id=memory.guild_id,
                                           moderator_id=interaction.user.id)
        elif memory.scope == "room" and not await self.engine.forget_taught(interaction.user.id, memory_id):
            await interaction.followup.send(
                f"Forgot your part in memory #{memory_id}: others taught it too, so it stays theirs, without you.",
                ephemeral=True)
            return
        elif memory.scope != "room":
            await self.engine.forget([memory_id])
        await interaction.followup.send(
            f"Forgot memory #{memory_id}: {discord.utils.escape_markdown(shorten(memory.text))}", ephemeral=True)

    @forget.autocomplete("memory_id")
    async def own_ids(self, interaction: discord.Interaction, current: str) -> list[app_commands.Choice[int]]:
        """The caller's own memories they may see here whose words (or number) hold what they typed."""
        found = await self.engine.own_choices(viewer_of(interaction), current)
        return [app_commands.Choice(name=choice_name(m.id, m.text), value=m.id) for m in found]

    @app_commands.command(name="forget-all", description="Forget everything Muninn remembers about you")
    async def forget_all(self, interaction: discord.Interaction) -> None:
        """/memory forget-all: asks first (ConfirmForgetAll), then forgets the caller's memories and messages."""
        personal, taught, mentioning = counts(await self.engine.memories_of(interaction.user.id), interaction.user.id)
        view = ConfirmForgetAll(self, interaction.user.id)
        await interaction.response.send_message(
            f"This deletes all {personal} of your personal memories, learned anywhere, the {taught} room memories "
            f"you taught (one that others taught too stays theirs, without you), {mentioning} memories of other "
            "people that mention you, your messages in Muninn's conversation history and Muninn's replies there "
            "that may repeat your words. It cannot be undone.",
            view=view, ephemeral=True)

    @app_commands.command(name="remember", description="Tell Muninn something to remember")
    @app_commands.describe(text="What to remember", scope="personal (default): only you; room: this channel; "
                                                          "global: everyone (bot owner only)")
    async def remember(self, interaction: discord.Interaction, text: app_commands.Range[str, 1, records.MAX_TEXT_CHARS],
                       scope: Scope = "personal") -> None:
        """/memory remember: store what the caller says as a personal memory (the default),
        a room memory (Manage Messages here) or a global one (the bot's owner)."""
        if scope == "room" and interaction.guild_id is None:
            raise Refusal("A room memory belongs to a server channel; in a DM, use the personal scope.")
        if scope == "room" and not interaction.permissions.manage_messages:
            raise Refusal("Adding room memories to this channel needs the Manage Messages permission here.")
        if scope == "global" and not await self.bot.is_owner(interaction.user):
            raise Refusal("Only the bot's owner can change global memories.")
        if sensitive.secret(text):
            raise Refusal("Muninn keeps no passwords, tokens or keys, not even yours: nothing was stored.")
        try:
            memory = NewMemory(text=text, scope=scope, owner_id=interaction.user.id,
                               channel_id=interaction.channel_id, guild_id=interaction.guild_id,
                               importance=REMEMBERED_IMPORTANCE, standing=SET if scope == "room" else None,
                               private=is_private_channel(interaction.channel, interaction.guild_id,
                                                          interaction.guild))
        except ValueError as exc:
            raise Refusal(f"Muninn cannot remember that: {exc}.") from None
        await interaction.response.defer(ephemeral=True, thinking=True)  # embedding may take a moment
        memory_id = await self.engine.remember(memory)
        audience = {"personal": "only you will see it, in DMs with Muninn"
                                + ("" if interaction.guild_id is None else
                                   " and in this channel" if memory.private else " and in this server"),
                    "room": "everyone in this channel will see it",
                    "global": "everyone will see it, everywhere"}[scope]
        await interaction.followup.send(f"Remembered as memory #{memory_id} ({scope}): {audience}.", ephemeral=True)

    @app_commands.command(name="pause", description="Stop Muninn from remembering anything of yours until you resume")
    async def pause(self, interaction: discord.Interaction) -> None:
        """/memory pause: keep nothing of the caller from now on, until /memory resume."""
        changed = await self.pipeline.pause(interaction.user.id)
        await interaction.response.send_message(
            ("Paused: from now on I keep nothing of what you say (not your messages, not facts about you), "
             "everywhere, until you use `/memory resume`. What I already remember stays; `/memory list` shows it."
             if changed else "Your memory with me was already paused. `/memory resume` turns it back on."),
            ephemeral=True)

    @app_commands.command(name="resume", description="Let Muninn remember what you say again")
    async def resume(self, interaction: discord.Interaction) -> None:
        """/memory resume: end the caller's pause."""
        changed = await self.pipeline.resume(interaction.user.id)
        await interaction.response.send_message(
            "Resumed: I remember what you tell me again." if changed else "Your memory with me was not paused.",
            ephemeral=True)

    @app_commands.command(name="why", description="Where one of your memories came from")
    @app_commands.rename(memory_id="id")
    @app_commands.describe(memory_id="The memory's number, as /memory list shows it")
    @app_commands.autocomplete(memory_id=own_ids)
    async def why(self, interaction: discord.Interaction, memory_id: app_commands.Range[int, 1]) -> None:
        """/memory why: where and when one of the caller's own memories (or another's that
        mentions them) was learned."""
        try:
            memory = await self.engine.own_memory(interaction.user.id, memory_id)
        except MemoryNotFound:
            raise Refusal(f"No memory #{memory_id} of yours.") from None
        lines = self.origin_lines(memory)
        if memory.owner_id != interaction.user.id:
            lines.insert(1, f"It is another member's memory that mentions you; `/memory forget {memory.id}` erases it.")
        await interaction.response.send_message(fit(lines), ephemeral=True)

    def origin_lines(self, memory: Memory) -> list[str]:
        """Where and when a memory was learned, with links to the messages it came from."""
        lines = [f"{self.describe(memory)}",
                 f"Learned {discord.utils.format_dt(datetime.fromtimestamp(memory.created_at, timezone.utc), 'f')}"
                 + (f" in <#{memory.channel_id}>" if memory.channel_id else "") + "."]
        if memory.happens is not None:  # the second clock (bot/memory/clocks.py)
            lines.append(f"What it tells happens on {memory.happens.text()}.")
        if memory.archive_reason == PENDING_REASON:
            lines.append("It waits for a moderator of that channel to approve it; until then Muninn tells nobody.")
        elif memory.archived_at is not None:
            lines.append(f"Archived ({memory.archive_reason}); `muninn maintain --restore {memory.id}` brings it back.")
        sources = [s for s in memory.source_message_ids if str(s).isdigit()]
        if not sources:
            lines.append("It comes from no message: it was told with /memory remember, or imported.")
        else:
            place = memory.guild_id if memory.guild_id is not None else "@me"
            lines.append(f"From {len(sources)} {'message' if len(sources) == 1 else 'messages'}:")
            lines += [f"- https://discord.com/channels/{place}/{memory.channel_id}/{s}" for s in sources[:15]]
        return lines

    @app_commands.command(name="export",
                          description="Download your personal memories and the room memories you taught, as JSON")
    async def export(self, interaction: discord.Interaction) -> None:
        """/memory export: the caller's personal memories and the room memories they taught, as a JSON file."""
        user_id = interaction.user.id
        memories = await self.engine.memories_of(user_id)
        personal, taught, mentioning = counts(memories, user_id)
        now = datetime.now(timezone.utc)
        data = {"user_id": str(user_id), "exported_at": now.isoformat(timespec="seconds"),
                # each says its scope; another person's memory that names the caller says so
                "memories": [dict(memory.to_dict(), **({} if memory.owner_id == user_id else {"mentions_you": True}))
                             for memory in memories]}
        # replace_invalid: a lone surrogate stored by an older Muninn must not make the export fail
        payload = validate.replace_invalid(json.dumps(data, ensure_ascii=False, indent=2)).encode("utf-8")
        file = discord.File(io.BytesIO(payload), filename=f"muninn-memories-{interaction.user.id}.json")
        await interaction.response.send_message(
            f"Your {personal} personal memories, the {taught} room memories you taught and {mentioning} memories "
            "of other people that mention you.", file=file, ephemeral=True)


def counts(memories: list[Memory], user_id: int) -> tuple[int, int, int]:
    """A person's data in numbers: their personal memories, the room memories they taught, and
    other people's memories that mention them."""
    own = [memory for memory in memories if memory.owner_id == user_id]
    personal = sum(memory.scope == "personal" for memory in own)
    return personal, len(own) - personal, len(memories) - len(own)


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
        """Only the owner may press the buttons; anyone else is told so, privately."""
        if interaction.user.id != self.owner_id:
            await answer_privately(interaction, "These buttons belong to someone else.")
            return False
        return True

    async def on_error(self, interaction: discord.Interaction, error: Exception, item: discord.ui.Item) -> None:
        """Log a failed button and tell the presser, privately."""
        log.error("button %r failed for user %s", getattr(item, "label", item), interaction.user.id, exc_info=error)
        await answer_privately(interaction, "Something went wrong on my side; it has been logged.")

    async def on_timeout(self) -> None:
        """Take the buttons off the answer they belong to, if it is still there."""
        if self.origin is not None:
            try:
                await self.origin.edit_original_response(view=None)
            except discord.HTTPException:
                pass  # the message is gone or the token expired: nothing left to tidy


class MemoryPages(OwnerView):
    """The pages of /memory list for one viewer (of `scope` only, when given), with Previous and Next."""
    def __init__(self, cog: MemoryCog, viewer: Viewer, scope: str | None):
        super().__init__(viewer.user_id)
        self.cog = cog
        self.viewer = viewer
        self.scope = scope
        self.page = 0
        self.pages = 1

    async def render(self) -> str:
        """The current page's text; also updates the page count and which buttons work."""
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
        """Move `step` pages, within the pages there are now, and show that page."""
        self.page = max(0, self.page + step)
        content = await self.render()
        if self.page >= self.pages:  # memories were forgotten meanwhile
            self.page = self.pages - 1
            content = await self.render()
        await interaction.response.edit_message(content=content, view=self)

    @discord.ui.button(label="◀ Previous", style=discord.ButtonStyle.secondary)
    async def previous(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        """Show the previous page."""
        await self.turn(interaction, -1)

    @discord.ui.button(label="Next ▶", style=discord.ButtonStyle.secondary)
    async def next(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        """Show the next page."""
        await self.turn(interaction, +1)


class ConfirmForgetAll(OwnerView):
    """The question of /memory forget-all: Forget everything, or Cancel."""
    def __init__(self, cog: MemoryCog, owner_id: int):
        super().__init__(owner_id)
        self.cog = cog

    @discord.ui.button(label="Forget everything", style=discord.ButtonStyle.danger)
    async def confirm(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        """Forget all of the owner's memories and messages, then say how many went."""
        self.stop()
        await interaction.response.edit_message(content="Forgetting…", view=None)
        forgotten = await self.cog.pipeline.forget_person(self.owner_id)
        shared = (f" {forgotten.shared} room memories that others taught too stay theirs, without you."
                  if forgotten.shared else "")
        replies = (f" {forgotten.replies} of Muninn's replies to others that may have repeated your words were "
                   "emptied." if forgotten.replies else "")
        await interaction.edit_original_response(
            content=f"Done: Muninn forgot {forgotten.personal} personal memories, {forgotten.taught} room memories "
                    f"you taught, {forgotten.mentioning} memories of others that mentioned you and "
                    f"{forgotten.messages} messages of yours.{shared}{replies}")

    @discord.ui.button(label="Cancel", style=discord.ButtonStyle.secondary)
    async def cancel(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        """Forget nothing."""
        self.stop()
        await interaction.response.edit_message(content="Nothing was forgotten.", view=None)


async def setup(bot: commands.Bot) -> None:
    """The extension's entry point: add the /memory cog."""
    await bot.add_cog(MemoryCog(bot))
