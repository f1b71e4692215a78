"""`MuninnBot`: the discord.py client. Opens the engine in `setup_hook`, loads the cogs,
answers every slash-command failure politely, and never syncs commands on its own
(`muninn sync` does that, once, on purpose).

SIGTERM (systemd, `docker stop`) and SIGINT (Ctrl-C) stop it gracefully (`shutdown`, hooked to
the signals by cogs/adapter.py): no new messages are taken, the replies being written get
MUNINN_SHUTDOWN_SECONDS to finish, Discord is closed, the facts waiting for extraction get as
long again to be saved, and the database is closed cleanly. A second signal skips the waiting.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

import discord
from discord import app_commands
from discord.ext import commands

from bot.cli import invite
from bot.conversation.pipeline import ExchangeSink, Pipeline
from bot.llm.errors import OllamaError
from bot.llm.servers import missing_models, server_name
from bot.memory.engine import Engine
from bot.memory.errors import explain
from bot.settings import Settings

from . import EXTENSIONS, places
from .intents import settle as settle_message_content

log = logging.getLogger(__name__)


class _NoVoice(logging.Filter):
    """Muninn uses no voice: discord.py's start-up warnings about voice libraries are noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "voice will NOT be supported" not in record.getMessage()


logging.getLogger("discord.client").addFilter(_NoVoice())

# What the bot needs in a channel, listed once with why in bot/cli/invite.py (`muninn invite`).
INVITE_PERMISSIONS = discord.Permissions(invite.PERMISSIONS_VALUE)
SOMETHING_WENT_WRONG = "Something went wrong on my side; it has been logged. Please try again later."
DATABASE_UNAVAILABLE = ("My memory is unavailable right now (busy with maintenance, or a disk problem); nothing "
                        "was changed. It has been logged. Please try again in a few minutes.")


class Refusal(app_commands.AppCommandError):
    """A slash command that cannot do what was asked; the message is shown to the caller as is."""


class MuninnTree(app_commands.CommandTree):
    """The bot's command tree: the access rule for the commands that teach Muninn
    (`interaction_check`), the one error handler of every slash command (`on_error`)."""

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        """Refuse a command that would make Muninn keep what the access lists keep out (cogs/places.py)."""
        command = interaction.command
        if command is not None and command.qualified_name in places.TEACHING \
                and not await places.admits(interaction.client, interaction):
            raise Refusal(places.NOT_KEPT)
        return True

    async def on_error(self, interaction: discord.Interaction, error: app_commands.AppCommandError) -> None:
        """The one error handler of every slash command: log, then answer the caller privately."""
        if isinstance(error, (Refusal, app_commands.CheckFailure)):
            text = str(error)
            log.debug("refused /%s for %s: %s", getattr(interaction.command, "qualified_name", "?"),
                      interaction.user.id, text)
        elif explain(getattr(error, "original", error)) is not None:  # locked, full or damaged: one line
            log.error("/%s failed for user %s: %s", getattr(interaction.command, "qualified_name", "?"),
                      interaction.user.id, explain(getattr(error, "original", error)))
            text = DATABASE_UNAVAILABLE
        else:
            original = getattr(error, "original", error)
            log.error("/%s failed for user %s", getattr(interaction.command, "qualified_name", "?"),
                      interaction.user.id, exc_info=original)
            text = SOMETHING_WENT_WRONG
        await answer_privately(interaction, text)


async def answer_privately(interaction: discord.Interaction, text: str) -> None:
    """An ephemeral answer whether or not the interaction was already responded to."""
    try:
        if interaction.response.is_done():
            await interaction.followup.send(text, ephemeral=True)
        else:
            await interaction.response.send_message(text, ephemeral=True)
    except discord.HTTPException as exc:  # the interaction expired or Discord is having a bad time
        log.warning("could not send an error answer: %s", exc)


class MuninnBot(commands.Bot):
    """The discord.py client of Muninn (see the module docstring). It reads message content (a
    privileged intent) when it may (cogs/intents.py), mentions nobody unless `options` say
    otherwise, and takes MUNINN_OWNER_IDS as its owners (the application's owner when unset);
    `extractor_factory` replaces bot.lifecycle's `Extractor`."""

    def __init__(self, settings: Settings, *,
                 extractor_factory: Callable[[Engine], ExchangeSink] | None = None, **options):
        intents = discord.Intents.default()
        # privileged: granted in the Developer Portal, or Muninn runs without it (cogs/intents.py)
        intents.message_content = settings.message_content != "off"
        options.setdefault("allowed_mentions", discord.AllowedMentions.none())
        super().__init__(command_prefix=commands.when_mentioned, help_command=None, intents=intents,
                         tree_cls=MuninnTree, owner_ids=set(settings.owner_ids) or None, **options)
        self.settings = settings
        self.extractor_factory = extractor_factory
        self.engine: Engine | None = None
        self.extractor: ExchangeSink | None = None
        self.pipeline: Pipeline | None = None
        self.asked_intents = intents                   # what IDENTIFY will ask for (cogs/intents.py)
        self.reads_everything = intents.message_content  # settled at login (cogs/intents.py)
        self.maintenance: asyncio.Task | None = None
        self._checked_models = False
        self.stopping = False
        self._hurry = asyncio.Event()   # a second stop signal: skip the waiting
        self._closing: asyncio.Future | None = None

    async def setup_hook(self) -> None:
        """Run by discord.py at login, before the gateway connects: open the engine, make the pipeline,
        load the cogs and start the periodic maintenance (unless MUNINN_MAINTENANCE_HOURS is 0). What
        it raises stops the login."""
        self.reads_everything = await settle_message_content(self, self.settings.message_content)
        self.engine = Engine(self.settings)
        await self.engine.start()
        counts = await self.engine.stats()
        log.info("database %s: %d memories (%d awaiting embeddings)", self.engine.storage.where(), counts["active"],
                 counts["missing_vectors"])
        if self.settings.extraction:
            factory = self.extractor_factory
            if factory is None:
                from bot.lifecycle.extractor import Extractor
                factory = Extractor
            self.extractor = factory(self.engine)
        assert self.user is not None  # login has happened
        self.pipeline = Pipeline(self.engine, self.extractor, assistant_id=self.user.id,
                                 assistant_name=self.user.display_name)
        for extension in EXTENSIONS:
            await self.load_extension(extension)
        if self.settings.maintenance_hours > 0:  # decay, backfill, links, consolidation
            from bot.lifecycle.maintenance import maintain_periodically
            self.maintenance = asyncio.create_task(maintain_periodically(self.engine))

    async def on_message(self, message: discord.Message) -> None:
        """Muninn has no prefix commands; cogs.chat handles conversation."""

    async def on_ready(self) -> None:
        """Log that Muninn is online, with its invite link (again after each reconnect); the first time
        only, warn about the Ollama models missing."""
        assert self.user is not None
        log.info("Muninn is online as %s (id %s) in %d servers. Invite link: %s", self.user, self.user.id,
                 len(self.guilds), invite_url(self.application_id or self.user.id))
        if not self._checked_models:
            self._checked_models = True
            await self.warn_about_missing_models()

    async def warn_about_missing_models(self) -> None:
        """Say at start-up, not at the first message, which `ollama pull` is missing."""
        assert self.engine is not None
        ollama = self.engine.ollama
        if not ollama.enabled:
            log.warning("no OLLAMA_URL configured: Muninn cannot answer messages (recall uses keywords only)")
            return
        try:
            missing = await missing_models(ollama, self.settings.chat_model, self.settings.embed_model)
            for error in missing:
                log.warning("%s", error)
            if not missing:
                log.info("%s at %s has %s and %s", server_name(ollama), ollama.where, self.settings.chat_model,
                         self.settings.embed_model)
        except OllamaError as exc:
            log.warning("cannot check the LLM servers' models: %s", exc)

    async def shutdown(self, reason: str) -> None:
        """Stop gracefully: take no new messages, let the replies in flight finish (bounded), then
        close (which saves the facts waiting for extraction, bounded too)."""
        if self.stopping:
            log.warning("%s again: stopping now, without waiting", reason)
            self._hurry.set()
            return
        self.stopping = True
        bound = self.settings.shutdown_seconds
        if self.pipeline is not None:
            self.pipeline.stop_accepting()
            in_flight = self.pipeline.replies_in_flight
            log.info("%s: stopping; %d replies in flight get up to %g s", reason, in_flight, bound)
            if in_flight and not await self._bounded(self.pipeline.wait_idle(bound), bound):
                log.warning("%d replies were not finished within %g s", self.pipeline.replies_in_flight, bound)
        else:
            log.info("%s: stopping", reason)
        await self.close()

    async def _bounded(self, work, timeout: float) -> bool:
        """Run `work` for at most `timeout` s, or until a second stop signal; True if it finished."""
        task = asyncio.ensure_future(work)
        hurry = asyncio.ensure_future(self._hurry.wait())
        try:
            done, _ = await asyncio.wait({task, hurry}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            hurry.cancel()
        if task not in done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return False
        if task.exception() is not None:
            log.error("stopping: %s failed", getattr(work, "__qualname__", work), exc_info=task.exception())
            return False
        return task.result() is not False

    async def close(self) -> None:
        """Close Discord, then the background work and the database; every caller (a shutdown,
        discord.py, the `async with` block) waits for the same one closing."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close_everything())
        await asyncio.shield(self._closing)

    async def _close_everything(self) -> None:
        # discord.py announces `ready` guild_ready_timeout after the last server arrives, in a task
        # its close leaves running: a stop within that time let it wake on the closed client and
        # fail, logged at exit as a task exception nobody retrieved. Nothing will be ready now.
        # (both names are discord.py's private ones: read with getattr, a version without them skips this)
        ready = getattr(getattr(self, "_connection", None), "_ready_task", None)
        if ready is not None and not ready.done():
            ready.cancel()
        await super().close()
        if self.maintenance is not None:
            self.maintenance.cancel()
            await asyncio.gather(self.maintenance, return_exceptions=True)
            self.maintenance = None
        if self.extractor is not None:
            extractor, self.extractor = self.extractor, None
            waiting = getattr(extractor, "waiting", 0)
            if self.stopping and waiting:
                log.info("saving the facts of %d messages waiting for extraction (up to %g s)", waiting,
                         self.settings.shutdown_seconds)
            flushed = await self._bounded(extractor.close(), self.settings.shutdown_seconds)
            if not flushed and self.stopping:
                log.warning("fact extraction was cut short; what was still waiting is lost")
        if self.engine is not None:
            engine, self.engine = self.engine, None
            await engine.close()
            if self.stopping:
                log.info("stopped cleanly")


def invite_url(application_id: int | None) -> str:
    """The link that adds the bot to a server with the permissions it needs and its slash commands;
    before login (no application id), where to make such a link by hand."""
    if application_id is None:  # not logged in yet: the generic page to add a bot
        return "https://discord.com/developers/applications (OAuth2 > URL Generator)"
    return discord.utils.oauth_url(application_id, permissions=INVITE_PERMISSIONS,
                                   scopes=("bot", "applications.commands"))
