"""How the command line prints: a result as JSON (--json), or for people: sentences, aligned
tables and colour on a terminal, the same words without colour when piped."""
from __future__ import annotations


def plural(count: int, one: str, many: str | None = None) -> str:
    """`1 memory`, `2 memories`, `0 messages`: the count with the word it agrees with."""
    return f"{count} {one if count == 1 else (many or one + 's')}"
