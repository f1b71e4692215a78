"""The message menus (right-click a message → Apps): "Remember this" and "Forget what this taught you".

"Remember this" keeps what the message says as a memory, attributed to its author, in the scope
the caller picks with a button (only me; this channel; everyone, for the bot's owner), under the
rules of learning (bot/lifecycle/keep_message.py): the room memory mode of the server, the
sensitive filter, never a secret. "Forget what this taught you" forgets the memories learned
from the message that the caller may change, as `/memory forget` would (their own, those that
mention them, and as a moderator the room memories of the channel, logged); the others stay
and are not named. Every answer is ephemeral.
"""
from __future__ import annotations

import logging

import discord
from discord import app_commands
from discord.ext import commands

from bot.lifecycle import keep_message
from bot.lifecycle.keep_message import Keeper, Kept, Refused, Said
from bot.memory.records import Memory

from .answers import fit, shorten
from .chat import is_private_channel, mentioned_people
from .client import Refusal
from .memory import MemoryCog, OwnerView

log = logging.getLogger(__name__)

REMEMBER_THIS = "Remember this"
FORGET_THIS = "Forget what this taught you"  # Discord allows 32 characters in a menu's name


def said_of(message: discord.Message) -> Said:
    """The message as keep_message sees it: who wrote it, where, when and its words."""
    guild_id = message.guild.id if message.guild is not None else None
    return Said(message_id=message.id, channel_id=message.channel.id, guild_id=guild_id,
                author_id=message.author.id, author_name=message.author.display_name,
                content=message.clean_content, created_at=message.created_at.timestamp(),
                private=is_private_channel(message.channel, guild_id, message.guild),
                people=tuple(name for name, _ in mentioned_people(message)))


def confirmation(kept: Kept, said: Said) -> str:
    """What the caller is told once the message is kept: the memory's number, and who will see it."""
    if kept.again:
        return f"That message is already remembered as memory #{kept.memory_id} ({kept.scope})."
    author = discord.utils.escape_markdown(said.author_name)
    audience = {
        keep_message.PERSONAL: "only you will see it, in DMs with Muninn" + (
            "" if said.guild_id is None else " and in this channel" if said.private else " and in this server"),
        keep_message.SET_BY_YOU: "everyone in this channel will see it, set by you as a moderator",
        keep_message.APPROVED_BY_YOU: f"everyone in this channel will see it, as what {author} said, approved by you",
        keep_message.CLAIM: f"everyone in this channel will see it, as what {author} said",
        keep_message.WAITING: "it waits for a moderator of this channel to approve it (`/memory room pending`)",
        keep_message.GLOBAL: "everyone will see it, everywhere",
    }[kept.standing]
    return f"Remembered as memory #{kept.memory_id} ({kept.scope}): {audience}."


class ContextMenus(commands.Cog):
    """The two message menus; added to the bot's command tree when the cog loads."""

    def __init__(self, bot: commands.Bot):
        self.bot = bot
        self.menus = (app_commands.ContextMenu(name=REMEMBER_THIS, callback=self.remember_this),
                      app_commands.ContextMenu(name=FORGET_THIS, callback=self.forget_this))

    async def cog_load(self) -> None:
        """Put the menus on the command tree (`muninn sync` registers them with Discord)."""
        for menu in self.menus:
            self.bot.tree.add_command(menu)

    async def cog_unload(self) -> None:
        """Take the menus off the command tree."""
        for menu in self.menus:
            self.bot.tree.remove_command(menu.name, type=menu.type)

    @property
    def engine(self):
        """The bot's memory engine."""
        return self.bot.engine  # type: ignore[attr-defined]

    def memory_cog(self) -> MemoryCog:
        """The /memory cog, whose rules say who may change a memory."""
        cog = next((cog for cog in self.bot.cogs.values() if isinstance(cog, MemoryCog)), None)
        if cog is None:
            raise RuntimeError("the /memory cog is not loaded")
        return cog

    async def remember_this(self, interaction: discord.Interaction, message: discord.Message) -> None:
        """"Remember this": offer the scopes the caller may choose (at once, when only one is theirs)."""
        if message.author.bot or message.webhook_id is not None:
            raise Refusal("Muninn remembers what people write, not the messages of bots.")
        said = said_of(message)
        keeper = Keeper(user_id=interaction.user.id,
                        moderator=interaction.guild_id is not None and interaction.permissions.manage_messages,
                        operator=await self.bot.is_owner(interaction.user))
        view = ChooseScope(self, said, keeper)
        if len(view.children) == 1:  # a DM, not the bot's owner: only "for me"
            view.stop()
            await interaction.response.defer(ephemeral=True, thinking=True)  # embedding may take a moment
            await interaction.followup.send(await self.keep(said, keeper, "personal"), ephemeral=True)
            return
        preview = discord.utils.escape_markdown(shorten(said.content, 200))
        await interaction.response.send_message(f"Remember “{preview}” for whom?", view=view, ephemeral=True)
        view.origin = interaction

    async def keep(self, said: Said, keeper: Keeper, scope: str) -> str:
        """Keep the message in `scope`; the answer for the caller (a refusal says why)."""
        try:
            kept = await keep_message.keep(self.engine, said, keeper, scope)
        except Refused as exc:
            return str(exc)
        log.info("user %s kept message %s as memory %s (%s)", keeper.user_id, said.message_id, kept.memory_id,
                 kept.standing)
        return confirmation(kept, said)

    async def forget_this(self, interaction: discord.Interaction, message: discord.Message) -> None:
        """"Forget what this taught you": forget the memories learned from the message that the caller may change."""
        await interaction.response.defer(ephemeral=True, thinking=True)
        rules = self.memory_cog()
        forgotten: list[str] = []
        for memory in await self.engine.from_message(message.id):
            if await rules.may_change(interaction, memory):
                forgotten.append(await self.forget(interaction, memory))
        extractor = getattr(self.bot, "extractor", None)
        if message.author.id == interaction.user.id and extractor is not None:
            extractor.forget_messages([message.id])  # still waiting to be learned from: it never will be
        if not forgotten:
            await interaction.followup.send("Muninn learned nothing from that message that is yours to forget.",
                                            ephemeral=True)
            return
        head = f"Forgot {len(forgotten)} {'memory' if len(forgotten) == 1 else 'memories'} learned from that message:"
        await interaction.followup.send(fit([head, *forgotten]), ephemeral=True)

    async def forget(self, interaction: discord.Interaction, memory: Memory) -> str:
        """Forget one memory the caller may change, as /memory forget does; its line in the answer."""
        line = f"`#{memory.id}` {discord.utils.escape_markdown(shorten(memory.text))}"
        if memory.scope == "room" and memory.owner_id != interaction.user.id:  # a moderator's deletion: logged
            assert memory.channel_id is not None
            await self.engine.rooms.forget(memory.id, channel_id=memory.channel_id, guild_id=memory.guild_id,
                                           moderator_id=interaction.user.id)
        elif memory.scope == "room" and not await self.engine.forget_taught(interaction.user.id, memory.id):
            return line + " (your part: others taught it too, so it stays theirs)"
        elif memory.scope != "room":
            await self.engine.forget([memory.id])
        return line


class ChooseScope(OwnerView):
    """The buttons of "Remember this": for me; for this channel (in a server); for everyone (the bot's owner)."""

    def __init__(self, cog: ContextMenus, said: Said, keeper: Keeper):
        super().__init__(keeper.user_id)
        self.cog, self.said, self.keeper = cog, said, keeper
        if said.guild_id is None:
            self.remove_item(self.room)
        if not keeper.operator:
            self.remove_item(self.everyone)

    async def choose(self, interaction: discord.Interaction, scope: str) -> None:
        """Keep the message in `scope`, then show what happened in place of the buttons."""
        self.stop()
        await interaction.response.edit_message(content="Remembering…", view=None)
        await interaction.edit_original_response(content=await self.cog.keep(self.said, self.keeper, scope))

    @discord.ui.button(label="Only me", style=discord.ButtonStyle.primary)
    async def personal(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        """Keep it as the caller's personal memory."""
        await self.choose(interaction, "personal")

    @discord.ui.button(label="This channel", style=discord.ButtonStyle.secondary)
    async def room(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        """Keep it as the author's room memory of this channel."""
        await self.choose(interaction, "room")

    @discord.ui.button(label="Everyone", style=discord.ButtonStyle.secondary)
    async def everyone(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        """Keep it as a global memory (the bot's owner)."""
        await self.choose(interaction, "global")


async def setup(bot: commands.Bot) -> None:
    """The extension's entry point: add the message menus."""
    await bot.add_cog(ContextMenus(bot))
