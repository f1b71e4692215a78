"""What the command line loads to reach Discord (`bot.cli.main.DiscordAdapter`): `muninn run` and `muninn sync`."""
from __future__ import annotations

import asyncio
import functools
import signal

import discord

from bot.settings import Settings
from cogs.client import MuninnBot, invite_url
from cogs.sharding import make_bot


class StartupError(RuntimeError):
    """The bot cannot start; the message says why in one line."""


LOGIN_REJECTED = ("Discord rejected DISCORD_TOKEN: open https://discord.com/developers/applications, pick the app, "
                  "Bot > Reset Token, and put the new token in .env as DISCORD_TOKEN=...")
INTENT_REFUSED = ("Discord refused the Message Content intent: open https://discord.com/developers/applications, "
                  "pick the app, then Bot > Privileged Gateway Intents > Message Content Intent, and save "
                  "(or set MUNINN_MESSAGE_CONTENT=auto to run without it on DMs, mentions and replies).")


def _start_shutdown(bot: MuninnBot, signal_name: str) -> None:
    asyncio.get_running_loop().create_task(bot.shutdown(signal_name))


def stop_on_signals(bot: MuninnBot) -> None:
    """SIGTERM and SIGINT start a graceful shutdown instead of killing the bot mid-reply."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, functools.partial(_start_shutdown, bot, sig.name))
        except (NotImplementedError, RuntimeError):  # Windows, or not the main thread
            pass


async def run_bot(settings: Settings) -> None:
    """Run until stopped (one process of several with MUNINN_SHARD_COUNT / MUNINN_SHARD_IDS);
    StartupError when Discord turns the bot away."""
    async with make_bot(settings) as bot:
        stop_on_signals(bot)
        try:
            await bot.start(settings.discord_token.strip())
        except discord.LoginFailure:
            raise StartupError(LOGIN_REJECTED) from None
        except discord.PrivilegedIntentsRequired:
            raise StartupError(INTENT_REFUSED) from None
        finally:
            # `start` returns as soon as Discord is closed; a shutdown may still be saving facts.
            await bot.close()


async def sync_commands(settings: Settings, guild_id: int | None = None) -> list[str]:
    """Register the slash commands and message menus with Discord: globally, or in one guild
    (instant, for testing); returns their names as people find them."""
    async with MuninnBot(settings) as bot:
        try:
            await bot.login(settings.discord_token.strip())
        except discord.LoginFailure:
            raise StartupError(LOGIN_REJECTED) from None
        guild = discord.Object(id=guild_id) if guild_id is not None else None
        if guild is not None:
            bot.tree.copy_global_to(guild=guild)
        try:
            synced = await bot.tree.sync(guild=guild)
        except discord.Forbidden:
            raise StartupError(f"Discord refused to register commands in guild {guild_id}: invite the bot there "
                               f"with the applications.commands scope: {invite_url(bot.application_id)}") from None
        except discord.HTTPException as exc:
            raise StartupError(f"Discord refused the slash commands: {exc}") from None
    # as people find them: "/memory" for a slash command, "Remember this (message menu)" for a menu
    return [f"/{command.name}" if command.type is discord.AppCommandType.chat_input
            else f"{command.name} (message menu)" for command in synced]
