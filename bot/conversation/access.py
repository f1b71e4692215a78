"""Who Muninn talks to, and where: the one decision every path that answers or records asks.

A message is admitted (answered, kept as history, learned from) unless one of these says no:
  - its author is a bot or a webhook (Muninn included): never;
  - its author is on the operator's block list (MUNINN_BLOCKED_USERS): nowhere;
  - a DM, when the operator turned DMs off (MUNINN_ALLOW_DMS=false);
  - in a server, its lists (`/settings access`): the author is on the blocked users, has a
    blocked role, or writes in a blocked channel (a thread counts as its parent channel, a
    channel as its category too); when the server allows only some users or roles, the author
    is neither; when it allows only some channels, the message is in none of them.
A message that is not admitted leaves nothing behind: no history row, no memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from bot.settings import Settings

LISTS = ("allow_users", "block_users", "allow_roles", "block_roles", "allow_channels", "block_channels")


@dataclass(frozen=True)
class Author:
    """Who wrote a message: their id, their roles in the server (none in a DM), whether a bot or a webhook."""
    user_id: int
    role_ids: frozenset[int] = frozenset()
    bot: bool = False
    webhook: bool = False


@dataclass(frozen=True)
class Verdict:
    """Whether a message is admitted, and if not, why (for the log and /settings, never shown to its author)."""
    admitted: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.admitted


ADMITTED = Verdict(True)


def ids(stored: Mapping[str, str], key: str) -> frozenset[int]:
    """A stored access list as ids (the stored text is comma-separated ids)."""
    return frozenset(int(part) for part in stored.get(key, "").split(",") if part.strip().isdigit())


def join(values: frozenset[int] | set[int]) -> str:
    """An access list as it is stored."""
    return ",".join(str(value) for value in sorted(values))


def admit(settings: Settings, author: Author, *, guild_id: int | None, places: tuple[int, ...] = (),
          lists: Mapping[str, str] | None = None) -> Verdict:
    """Whether Muninn may answer and keep a message of `author` (the module docstring says when not).
    `places`: the channel's id and those it belongs to (a thread's parent, a channel's category);
    `lists`: the server's stored settings (its access lists among them)."""
    if author.bot or author.webhook:
        return Verdict(False, "its author is a bot or a webhook")
    if author.user_id in settings.blocked_users:
        return Verdict(False, "its author is on the operator's block list (MUNINN_BLOCKED_USERS)")
    if guild_id is None:
        return ADMITTED if settings.allow_dms else Verdict(False, "DMs are off (MUNINN_ALLOW_DMS=false)")
    lists = lists or {}
    if author.user_id in ids(lists, "block_users"):
        return Verdict(False, "its author is on the server's block list")
    if author.role_ids & ids(lists, "block_roles"):
        return Verdict(False, "its author has a role on the server's block list")
    if set(places) & ids(lists, "block_channels"):
        return Verdict(False, "its channel is on the server's block list")
    users, roles = ids(lists, "allow_users"), ids(lists, "allow_roles")
    if (users or roles) and author.user_id not in users and not author.role_ids & roles:
        return Verdict(False, "its author is neither on the server's allow list nor has a role on it")
    channels = ids(lists, "allow_channels")
    if channels and not set(places) & channels:
        return Verdict(False, "its channel is not on the server's allow list")
    return ADMITTED
