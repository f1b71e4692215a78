"""`/settings`: a server shapes Muninn from Discord, without a restart (docs/server-settings.md).

  show                          what applies here, and where each value comes from;
  set <setting> <value> [where] set one for this channel or thread (`here`, the default) or
                                for the whole `server`;
  reset <setting> [where]       remove it there: the place inherits again;
  access add|remove <list> ...  the server's allow and block lists of users, roles, channels.
A thread inherits its parent channel, a channel its server, a server the operator's `.env`.
Server settings and access lists need Manage Server; a channel's or thread's settings need
Manage Channels there. Discord hides the commands from members without them by default, and
server admins can change that, so the permission is checked here too. Every answer is
ephemeral; a refusal is one line.
"""
from __future__ import annotations

from typing import Literal, Optional

import discord
from discord import app_commands
from discord.ext import commands

from bot.conversation import access, overrides
from bot.conversation.overrides import CHANNEL, ENV, EVERY, OPTIONS, SERVER, THREAD, BadValue, Tuning

from .answers import fit
from .client import Refusal
from .places import place_of, reads_everything, tuning_at

Setting = Literal["persona", "answer", "history", "learning", "language", "auto_thread", "room_memory"]
Where = Literal["here", "server"]
ListKind = Literal["allow", "block"]

ONLY_IN_A_SERVER = "Settings belong to a server: in DMs the operator's .env applies."
NEEDS_MANAGE_GUILD = "Changing this server's settings needs the Manage Server permission."
NEEDS_MANAGE_CHANNELS = "Changing this channel's settings needs the Manage Channels permission here."
NO_CONTENT_INTENT = (" Muninn runs without the Message Content intent, so it answers mentions and replies only "
                     "until the operator grants it.")
FROM = {THREAD: "set for this thread", CHANNEL: "set for this channel", SERVER: "set for the server",
        ENV: "the operator's default"}


def level_of(interaction: discord.Interaction, where: str) -> str:
    """The level a command acts on: the server, or the thread or channel it runs in."""
    if where == "server":
        return SERVER
    return THREAD if isinstance(interaction.channel, discord.Thread) else CHANNEL


def allowed(interaction: discord.Interaction, level: str) -> None:
    """Refuse (one line) a caller without the permission the level needs, or outside a server."""
    if interaction.guild_id is None or interaction.channel_id is None:
        raise Refusal(ONLY_IN_A_SERVER)
    if level == SERVER and not interaction.permissions.manage_guild:
        raise Refusal(NEEDS_MANAGE_GUILD)
    if level != SERVER and not interaction.permissions.manage_channels:
        raise Refusal(NEEDS_MANAGE_CHANNELS)


def shown(key: str, value: str) -> str:
    """A value as /settings show prints it."""
    if not value:
        return "(none)"
    return f"“{discord.utils.escape_markdown(value)}”" if key in ("persona", "language") else f"**{value}**"


def listing(stored: dict[str, str], key: str, mention: str) -> str:
    """One access list, as mentions."""
    found = access.ids(stored, key)
    return ", ".join(mention.format(i) for i in sorted(found)) if found else "(none)"


@app_commands.guild_only()
@app_commands.default_permissions(manage_channels=True)
class SettingsCog(commands.GroupCog, group_name="settings",
                  group_description="How Muninn behaves in this server, channel or thread"):
    """`/settings`: show, set and reset the settings of a place; `/settings access` edits the access lists."""

    access_group = app_commands.Group(name="access", description="Who and where Muninn answers in this server")

    def __init__(self, bot: commands.Bot):
        self.bot = bot
        super().__init__()

    @property
    def engine(self):
        """The bot's memory engine."""
        return self.bot.engine  # type: ignore[attr-defined]

    async def here(self, interaction: discord.Interaction) -> tuple[Tuning, dict[str, str]]:
        """The settings that apply where the command runs, and the server's stored settings."""
        channel = interaction.channel
        assert channel is not None
        return await tuning_at(self.bot, place_of(channel, interaction.guild_id))

    @app_commands.command(name="show", description="The settings that apply here, and where each comes from")
    async def show(self, interaction: discord.Interaction) -> None:
        """/settings show: every setting that applies here, its value and its origin; the access
        lists to those who may change them."""
        if interaction.guild_id is None or interaction.channel is None:
            raise Refusal(ONLY_IN_A_SERVER)
        tuning, guild = await self.here(interaction)
        where = "thread" if isinstance(interaction.channel, discord.Thread) else "channel"
        lines = [f"Settings in this {where} (a thread inherits its channel, a channel the server, "
                 "the server the operator's .env):"]
        for key in OPTIONS:
            value = tuning.values[key]
            note = ""
            if key == "answer" and value.value == EVERY and not tuning.reads_everything:
                note = " (answers mentions only: no Message Content intent)"
            lines.append(f"- `{key}`: {shown(key, value.value)}{note}, {FROM[value.source]}")
        intent = "on" if reads_everything(self.bot) else (
            "off: Muninn answers DMs, mentions and replies to it only; no passive history, no every-message channels")
        lines.append(f"- Message Content intent: {intent}")
        if interaction.permissions.manage_guild:
            lines.append("Access lists of this server (`/settings access`):")
            for kind in ("allow", "block"):
                lines.append(f"- {kind}: users {listing(guild, f'{kind}_users', '<@{}>')}; roles "
                             f"{listing(guild, f'{kind}_roles', '<@&{}>')}; channels "
                             f"{listing(guild, f'{kind}_channels', '<#{}>')}")
        await interaction.response.send_message(fit(lines), ephemeral=True,
                                                allowed_mentions=discord.AllowedMentions.none())

    @app_commands.command(name="set", description="Change one setting here or for the whole server")
    @app_commands.describe(setting="Which setting", value="Its new value (see /settings show)",
                           where="here: this channel or thread (default); server: the whole server")
    async def set_(self, interaction: discord.Interaction, setting: Setting,
                   value: app_commands.Range[str, 1, overrides.PERSONA_MAX],
                   where: Optional[Where] = "here") -> None:
        """/settings set: check the value, then store it for the place (room_memory: the room
        memory mode, logged as a moderator's action)."""
        level = level_of(interaction, where or "here")
        allowed(interaction, level)
        option = OPTIONS[setting]
        if level not in option.levels:
            raise Refusal(f"`{setting}` is set for {' or '.join(option.levels)}, not for a {level}.")
        try:
            stored = option.parse(value)
        except BadValue as exc:
            raise Refusal(f"`{setting}` ({option.help}): {exc}.") from None
        assert interaction.guild_id is not None and interaction.channel_id is not None
        if setting == "room_memory":
            await self.engine.rooms.set_mode(interaction.guild_id, stored, moderator_id=interaction.user.id,
                                             channel_id=interaction.channel_id)
        elif level == SERVER:
            await self.engine.options.set_guild(interaction.guild_id, setting, stored)
        else:
            await self.engine.options.set_channel(interaction.channel_id, interaction.guild_id, setting, stored)
        note = NO_CONTENT_INTENT if setting == "answer" and stored == EVERY and not reads_everything(self.bot) else ""
        await interaction.response.send_message(
            f"`{setting}` is now {shown(setting, stored)} {FROM[level].removeprefix('set ')}.{note}", ephemeral=True)

    @app_commands.command(name="reset", description="Remove one setting here or for the server: it is inherited again")
    @app_commands.describe(setting="Which setting",
                           where="here: this channel or thread (default); server: the whole server")
    async def reset(self, interaction: discord.Interaction, setting: Setting, where: Optional[Where] = "here") -> None:
        """/settings reset: the place inherits the setting again (room_memory: back to moderated)."""
        level = level_of(interaction, where or "here")
        allowed(interaction, level)
        if level not in OPTIONS[setting].levels:
            raise Refusal(f"`{setting}` is set for {' or '.join(OPTIONS[setting].levels)}, not for a {level}.")
        assert interaction.guild_id is not None and interaction.channel_id is not None
        if setting == "room_memory":
            removed = setting in (await self.here(interaction))[1]  # the option's key is the stored one
            await self.engine.rooms.reset_mode(interaction.guild_id, moderator_id=interaction.user.id,
                                               channel_id=interaction.channel_id)
        elif level == SERVER:
            removed = await self.engine.options.reset_guild(interaction.guild_id, setting)
        else:
            removed = await self.engine.options.reset_channel(interaction.channel_id, setting)
        tuning, _ = await self.here(interaction)
        now = tuning.values[setting]
        head = f"`{setting}` was reset" if removed else f"`{setting}` was not set {FROM[level].removeprefix('set ')}"
        await interaction.response.send_message(
            f"{head}; here it is {shown(setting, now.value)}, {FROM[now.source]}.", ephemeral=True)

    async def _edit_list(self, interaction: discord.Interaction, kind: str, add: bool,
                         user: discord.abc.User | None, role: discord.Role | None,
                         channel: discord.abc.GuildChannel | discord.Thread | None) -> None:
        allowed(interaction, SERVER)
        assert interaction.guild_id is not None
        picked = [(f"{kind}_users", user, "<@{}>"), (f"{kind}_roles", role, "<@&{}>"),
                  (f"{kind}_channels", channel, "<#{}>")]
        picked = [(key, target, mention) for key, target, mention in picked if target is not None]
        if not picked:
            raise Refusal("Name a user, a role or a channel.")
        _, guild = await self.here(interaction)
        done = []
        for key, target, mention in picked:
            assert target is not None
            ids = set(access.ids(guild, key))
            ids = ids | {target.id} if add else ids - {target.id}
            if ids:
                await self.engine.options.set_guild(interaction.guild_id, key, access.join(ids))
            else:
                await self.engine.options.reset_guild(interaction.guild_id, key)
            done.append(mention.format(target.id))
        verb = "added to" if add else "removed from"
        await interaction.response.send_message(
            f"{', '.join(done)} {verb} this server's {kind} list.", ephemeral=True,
            allowed_mentions=discord.AllowedMentions.none())

    @access_group.command(name="add", description="Put a user, role or channel on this server's allow or block list")
    @app_commands.describe(list="allow: only those are answered; block: those are never answered nor remembered")
    async def access_add(self, interaction: discord.Interaction, list: ListKind,
                         user: Optional[discord.User] = None, role: Optional[discord.Role] = None,
                         channel: Optional[discord.abc.GuildChannel] = None) -> None:
        """/settings access add: a user, role or channel joins the server's allow or block list."""
        await self._edit_list(interaction, list, True, user, role, channel)

    @access_group.command(name="remove", description="Take a user, role or channel off this server's allow or block list")
    @app_commands.describe(list="The list to take them off")
    async def access_remove(self, interaction: discord.Interaction, list: ListKind,
                            user: Optional[discord.User] = None, role: Optional[discord.Role] = None,
                            channel: Optional[discord.abc.GuildChannel] = None) -> None:
        """/settings access remove: a user, role or channel leaves the server's allow or block list."""
        await self._edit_list(interaction, list, False, user, role, channel)


async def setup(bot: commands.Bot) -> None:
    """The extension's entry point: add the /settings cog."""
    await bot.add_cog(SettingsCog(bot))
