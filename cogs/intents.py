"""Whether Muninn runs with Discord's Message Content intent, decided once at start.

MUNINN_MESSAGE_CONTENT=auto asks Discord, right after login and before the gateway connects,
whether the Developer Portal grants the intent to the application (its flags); `on` requires it
(Discord refuses the connection when it is not granted), `off` never asks for it. Without it
Discord still delivers DMs, messages that mention Muninn and replies to its messages, and that
is what Muninn then answers; passive history and every-message channels are off. One log line
names the mode.
"""
from __future__ import annotations

import logging

import discord

log = logging.getLogger(__name__)

WITH = ("Message Content intent: on (%s); Muninn reads the messages of the channels it sees, "
        "keeps them as history and can answer every message where a channel asks for it")
WITHOUT = ("Message Content intent: off (%s); Muninn answers DMs, mentions and replies to its messages only; "
           "passive history and every-message channels are off")


def granted(flags: discord.ApplicationFlags) -> bool:
    """Whether the Developer Portal grants the Message Content intent (verified apps: the full
    flag; apps in fewer than 100 servers: the limited one)."""
    return flags.gateway_message_content or flags.gateway_message_content_limited


async def settle(bot: discord.Client, setting: str) -> bool:
    """Settle the intent for this run (before the gateway connects) and log the mode; True with it."""
    if setting == "off":
        why = "MUNINN_MESSAGE_CONTENT=off"
        use = False
    elif setting == "on":
        why, use = "MUNINN_MESSAGE_CONTENT=on", True
    else:
        try:
            use = granted((await bot.application_info()).flags)
            why = ("granted in the Developer Portal" if use else
                   "not granted in the Developer Portal (Bot > Privileged Gateway Intents > Message Content)")
        except discord.HTTPException as exc:
            use, why = True, f"assumed: Discord did not say whether it is granted ({exc.status})"
    # The intents are sent when the gateway connects, which has not happened yet: discord.py keeps
    # the very Intents object the bot was made with (MuninnBot.asked_intents) until then.
    asked: discord.Intents = bot.asked_intents  # type: ignore[attr-defined]
    asked.message_content = use
    log.info(WITH if use else WITHOUT, why)
    return use
