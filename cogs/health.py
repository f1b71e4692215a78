"""/healthz and Prometheus /metrics, served by the bot itself when MUNINN_METRICS_PORT is set.

An aiohttp server on the bot's own event loop, from its first gateway connection on (so
`muninn sync`, which logs in without connecting, serves nothing), at MUNINN_METRICS_HOST
(127.0.0.1 unless told otherwise). Neither page waits for the database or Discord: /healthz reads what the last probes
found (the database is asked every PROBE_EVERY seconds in the background, the gateway's state is
in memory), and /metrics reads counters, the gateway and the LLM client as they are
(bot/metrics.py); only the memories by scope come from a periodic count (COUNT_EVERY).

/healthz answers 200 "ok" when every shard of this process is connected to the gateway and the
database answered its last probe, else 503 with one line per reason.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import discord
from aiohttp import web
from discord.ext import commands

from bot.metrics import CONTENT_TYPE, Metrics, Readings, Shard

log = logging.getLogger(__name__)

PROBE_EVERY = 5.0      # seconds between two database probes
PROBE_TIMEOUT = 5.0    # a probe that takes longer counts as no answer
COUNT_EVERY = 60.0     # seconds between two counts of the memories by scope (a full count: not per scrape)
STALE_AFTER = 3 * PROBE_EVERY + PROBE_TIMEOUT   # no answer for this long: the database is not answering


def shard_label(shard_id: int | None) -> str:
    """The `shard` label: the id, or "None" for an unsharded bot (as discord-ext-prometheus has it)."""
    return str(shard_id)


class Health(commands.Cog):
    """Serves /healthz and /metrics (see the module docstring) and counts the gateway's events."""

    def __init__(self, bot: commands.Bot, host: str, port: int):
        self.bot = bot
        self.host, self.port = host, port
        self.metrics = Metrics(Readings(shards=self.shards, guilds=lambda: len(bot.guilds)))
        self.runner: web.AppRunner | None = None
        self.tasks: list[asyncio.Task] = []
        self.answered_at: float | None = None     # time.monotonic() of the database's last answer
        self.problem: str | None = "the database has not been probed yet"
        self._count_now = asyncio.Event()

    @property
    def engine(self):
        """The bot's engine (None once it is closed)."""
        return getattr(self.bot, "engine", None)

    async def cog_load(self) -> None:
        """Hook the metrics into the pipeline; the pages are served from the first gateway connection
        on (`muninn sync` logs in but never connects: it serves nothing)."""
        readings = self.metrics.readings
        readings.extractor = getattr(self.bot, "extractor", None)
        readings.llm = self.engine.ollama if self.engine is not None else None
        pipeline = getattr(self.bot, "pipeline", None)
        if pipeline is not None:
            pipeline.watch = self.metrics

    @commands.Cog.listener()
    async def on_connect(self) -> None:
        """The first connection to the gateway starts the probes and the server."""
        if self.tasks:
            return
        self.tasks = [asyncio.create_task(self._probe_database()), asyncio.create_task(self._count_memories())]
        await self.serve()

    async def serve(self) -> None:
        """Start the server; a port that cannot be taken is logged, and the bot runs on without the pages."""
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.serve_metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError as exc:
            log.error("cannot serve /healthz and /metrics on %s:%d (%s): set MUNINN_METRICS_PORT to a free port, "
                      "or MUNINN_METRICS_HOST to an address of this machine", self.host, self.port, exc.strerror or exc)
            await runner.cleanup()
            return
        self.runner = runner
        log.info("health and metrics at http://%s:%d/healthz and /metrics", self.host, self.port)

    async def cog_unload(self) -> None:
        """Stop the probes and the server."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks = []
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    # -- what the pages read ------------------------------------------------------

    def shards(self) -> list[Shard]:
        """Each gateway connection of this process: sharded bots have one per shard."""
        shards = getattr(self.bot, "shards", None)
        if isinstance(shards, dict):  # AutoShardedBot: ShardInfo per shard id
            return [Shard(shard_label(sid), not info.is_closed(), info.latency) for sid, info in sorted(shards.items())]
        ws = self.bot.ws
        return [Shard(shard_label(self.bot.shard_id), ws is not None and ws.open and not self.bot.is_closed(),
                      self.bot.latency)]

    def problems(self) -> list[str]:
        """Why this process is not healthy, one line each (none: healthy)."""
        found = []
        if self.bot.is_closed() or getattr(self.bot, "stopping", False):
            found.append("the bot is stopping")
        elif not self.bot.is_ready():
            found.append("not connected to Discord yet")
        else:
            found += [f"shard {s.label} is disconnected from the Discord gateway" for s in self.shards() if not s.connected]
        if self.problem is not None:
            found.append(self.problem)
        elif self.answered_at is None or time.monotonic() - self.answered_at > STALE_AFTER:
            found.append("the database has not answered for more than %.0f s" % STALE_AFTER)
        return found

    async def healthz(self, request: web.Request) -> web.Response:
        """200 "ok", or 503 with the reasons."""
        problems = self.problems()
        if problems:
            return web.Response(status=503, text="\n".join(problems) + "\n")
        return web.Response(text="ok\n")

    async def serve_metrics(self, request: web.Request) -> web.Response:
        """The metrics in Prometheus' text format."""
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    # -- background ---------------------------------------------------------------

    async def _probe_database(self) -> None:
        while True:
            engine = self.engine
            try:
                if engine is None:
                    raise RuntimeError("closed")
                await asyncio.wait_for(engine.ping(), PROBE_TIMEOUT)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # whatever it is, it is the finding
                reason = "no answer within %.0f s" % PROBE_TIMEOUT if isinstance(exc, TimeoutError) else str(exc)
                if self.problem is None:
                    log.warning("/healthz: the database does not answer: %s", reason)
                self.problem = f"database: {reason or type(exc).__name__}"
                self.metrics.readings.database_up = False
            else:
                self.answered_at, self.problem = time.monotonic(), None
                self.metrics.readings.database_up = True
            await asyncio.sleep(PROBE_EVERY)

    async def _count_memories(self) -> None:
        while True:
            engine = self.engine
            if engine is not None:
                try:
                    self.metrics.readings.memories_by_scope = dict((await engine.stats())["by_scope"])
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the probe reports the database; this only waits for the next count
                    log.debug("could not count the memories by scope: %s", exc)
            self._count_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._count_now.wait(), COUNT_EVERY)

    def recount(self) -> None:
        """Count the memories by scope now rather than at the next period."""
        self._count_now.set()

    # -- gateway events -------------------------------------------------------------

    @commands.Cog.listener()
    async def on_message(self, message: discord.Message) -> None:
        """Count a message seen on the gateway."""
        self.metrics.message_seen(shard_label(message.guild.shard_id if message.guild else self.bot.shard_id))

    @commands.Cog.listener()
    async def on_interaction(self, interaction: discord.Interaction) -> None:
        """Count an interaction, with its command's name for a slash command."""
        command = interaction.command.qualified_name if interaction.command is not None else ""
        shard = interaction.guild.shard_id if interaction.guild else self.bot.shard_id
        self.metrics.interaction_seen(shard_label(shard), interaction.type.name, command)


async def setup(bot: commands.Bot) -> None:
    """Add the cog when MUNINN_METRICS_PORT is set (off by default)."""
    settings = bot.settings  # type: ignore[attr-defined]
    if settings.metrics_port is not None:
        await bot.add_cog(Health(bot, settings.metrics_host, settings.metrics_port))
