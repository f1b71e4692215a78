"""How the command line prints: a result as JSON (--json), or for people: sentences and aligned
tables, in colour on a terminal and as the same words without colour or frames when piped.

Every printed text passes `redact.scrub` (never a configured secret) and
`validate.replace_invalid` (a lone surrogate in stored text must not abort the output).
"""
from __future__ import annotations

import io
import json
import shutil
import sys
from typing import Any, Iterable, Sequence

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from bot import redact, validate

PIPED_WIDTH = 100_000   # piped output is never wrapped or cut: scripts read whole lines


def plural(count: int, one: str, many: str | None = None) -> str:
    """`1 memory`, `2 memories`, `0 messages`: the count with the word it agrees with."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


def is_terminal(stream: Any = None) -> bool:
    """Whether `stream` (stdout) is a terminal: colours and frames only then."""
    stream = sys.stdout if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed, or not a real file
        return False


def render(human: RenderableType, *, terminal: bool | None = None) -> str:
    """`human` as text: with colours and at the terminal's width on a terminal, else plain and
    unwrapped (trailing spaces of table cells removed)."""
    terminal = is_terminal() if terminal is None else terminal
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=terminal, color_system="auto" if terminal else None,
                      width=shutil.get_terminal_size().columns if terminal else PIPED_WIDTH,
                      highlight=False, markup=False, emoji=False, soft_wrap=not terminal)
    console.print(human)
    text = buffer.getvalue().rstrip("\n")
    return text if terminal else "\n".join(line.rstrip() for line in text.split("\n"))


def write(text: str, *, stream: Any = None) -> None:
    """Print one finished text (a line or more) to stdout, or `stream`."""
    print(validate.replace_invalid(redact.scrub(text)), file=stream or sys.stdout, flush=True)


def emit(args: Any, data: Any, human: RenderableType) -> None:
    """Print a result: `data` as one JSON document with --json, else `human` (a sentence, a table...)."""
    write(json.dumps(data, ensure_ascii=False) if getattr(args, "json", False) else render(human))


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, styles: Sequence[str] = (),
          header: bool = True) -> Table:
    """An aligned table with bold headings on a terminal, plain columns when piped. Each cell is
    shown as its text (no markup); `styles` colours whole columns on a terminal."""
    grid = Table(box=None, show_edge=False, pad_edge=False, header_style="bold", padding=(0, 2, 0, 0),
                 show_header=header)
    for number, column in enumerate(columns):
        grid.add_column(column, style=styles[number] if number < len(styles) else "", overflow="fold")
    for row in rows:
        grid.add_row(*(cell if isinstance(cell, Text) else Text("" if cell is None else str(cell)) for cell in row))
    return grid


def lines(*parts: RenderableType) -> RenderableType:
    """Several renderables (sentences, tables) one under the other."""
    from rich.console import Group
    return Group(*parts)


def status(ok: bool) -> Text:
    """`ok` in green or `FAIL` in red (plain words when piped)."""
    return Text("ok", style="green") if ok else Text("FAIL", style="bold red")


def value(item: Any) -> str:
    """A value in words: `personal 1, room 2` for a mapping, `-` for nothing, never a Python repr."""
    if item is None:
        return "-"
    if isinstance(item, dict):
        return ", ".join(f"{key} {value(inner)}" for key, inner in item.items()) or "none"
    if isinstance(item, (list, tuple)):
        return ", ".join(value(inner) for inner in item) or "none"
    if isinstance(item, bool):
        return "yes" if item else "no"
    return str(item)


def key_values(data: dict[str, Any]) -> Table:
    """A mapping as a two-column table: `missing vectors  0`, `by scope  personal 1, room 2`."""
    return table(("", ""), ((key.replace("_", " "), value(item)) for key, item in data.items()), styles=("bold",),
                 header=False)
