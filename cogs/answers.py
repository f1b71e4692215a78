"""Ephemeral answers' text: one memory's line shortened, many lines fitted into one Discord message."""
from __future__ import annotations

TEXT_PREVIEW = 160
MESSAGE_LIMIT = 2000


def shorten(text: str, limit: int = TEXT_PREVIEW) -> str:
    """`text` on one line (whitespace collapsed), cut to `limit` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def fit(lines: list[str], limit: int = MESSAGE_LIMIT) -> str:
    """Join lines, leaving out the tail (and saying so) when they would exceed one message."""
    out: list[str] = []
    used = 0
    for index, line in enumerate(lines):
        if used + len(line) + 1 > limit - 40:
            out.append(f"… and {len(lines) - index} more lines not shown")
            break
        out.append(line)
        used += len(line) + 1
    return "\n".join(out)


CHOICE_LIMIT = 100  # Discord's longest autocomplete choice name


def choice_name(memory_id: int, text: str) -> str:
    """A memory as an autocomplete choice shows it: "id: shortened text", within Discord's limit."""
    head = f"{memory_id}: "
    return head + shorten(text, CHOICE_LIMIT - len(head))
