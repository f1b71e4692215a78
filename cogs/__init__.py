"""Thin discord.py adapters around the engine and pipeline in `bot/`.

`client.MuninnBot` is the `commands.Bot`; each feature is an extension loaded in its
`setup_hook`: `chat` (answering messages, keeping the history), `memory` (the
`/memory` slash commands), `context_menus` (the message menus "Remember this" and "Forget what
this taught you"), `settings` (the `/settings` of servers, channels and threads), `guilds` (the
servers Muninn leaves and rejoins, for the purge of what it kept of the ones it left) and `health`
(/healthz and /metrics, when MUNINN_METRICS_PORT is set).
"""
EXTENSIONS = ("cogs.chat", "cogs.memory", "cogs.context_menus", "cogs.settings", "cogs.guilds", "cogs.health")
