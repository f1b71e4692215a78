"""Thin discord.py adapters around the engine and pipeline in `bot/`.

`client.MuninnBot` is the `commands.Bot`; each feature is an extension loaded in its
`setup_hook`: `chat` (answering messages, keeping the history) and `memory` (the
`/memory` slash commands and the always-answer toggle).
"""
EXTENSIONS = ("cogs.chat", "cogs.memory")
