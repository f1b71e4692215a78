"""HTML for the console: one page frame, escaping, tables, pagers and action buttons.

Pages are built as strings on the server: no template engine, no script, no external asset
(the stylesheet is served by the console itself), so the Content-Security-Policy can forbid
everything else. Every value that comes from the database goes through `h` (escape).
"""
from __future__ import annotations

import html
from datetime import datetime, timezone
from typing import Iterable, Sequence
from urllib.parse import urlencode

from bot.memory.records import Memory

STYLE = """
:root { --ink: #1d2330; --muted: #667085; --line: #d9dee7; --bg: #f6f7fa; --accent: #3a5bd9; --warn: #b42318; }
* { box-sizing: border-box; }
body {
  margin: 0;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--ink);
  background: var(--bg);
}
header { background: #1d2330; color: #fff; padding: 10px 24px; display: flex; gap: 20px; align-items: center; }
header a { color: #d6dcf5; text-decoration: none; }
header a:hover { color: #fff; }
header .brand { font-weight: 700; color: #fff; margin-right: 12px; }
header form { margin-left: auto; }
main { max-width: 1100px; margin: 24px auto; padding: 0 24px; }
h1 { font-size: 22px; margin: 0 0 16px; }
h2 { font-size: 16px; margin: 24px 0 8px; }
table { width: 100%; border-collapse: collapse; background: #fff; border: 1px solid var(--line); }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #eef1f6; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.muted { color: var(--muted); }
.tag { display: inline-block; padding: 0 6px; border-radius: 8px; background: #e7ebf7; font-size: 12px; }
.tag.pending { background: #fff1c2; }
.tag.archived { background: #eceff3; }
.tag.room { background: #dcf3e6; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; }
.card { background: #fff; border: 1px solid var(--line); padding: 12px 16px; min-width: 140px; }
.card b { display: block; font-size: 22px; }
form.inline { display: inline; }
button { font: inherit; padding: 3px 10px; border: 1px solid var(--line); background: #fff; cursor: pointer; }
button.danger { color: var(--warn); border-color: #f1b8b2; }
input, select { font: inherit; padding: 4px 6px; }
.pager { margin: 10px 0; display: flex; gap: 12px; }
.flash { background: #e8f4ea; border: 1px solid #b7dfbf; padding: 8px 12px; margin-bottom: 16px; }
.error { background: #fdecea; border: 1px solid #f5c2bd; padding: 8px 12px; margin-bottom: 16px; }
.text { white-space: pre-wrap; word-break: break-word; }
svg { background: #fff; border: 1px solid var(--line); }
dl {
  display: grid;
  grid-template-columns: 180px 1fr;
  gap: 4px 12px;
  background: #fff;
  border: 1px solid var(--line);
  padding: 12px;
}
dt { color: var(--muted); }
dd { margin: 0; }
.login { max-width: 360px; margin: 80px auto; background: #fff; border: 1px solid var(--line); padding: 24px; }
.login input { width: 100%; margin: 8px 0 12px; }
"""


def h(value: object) -> str:
    """`value` as HTML text (quotes escaped too: safe in attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


def when(ts: float | None) -> str:
    """A time as the console shows it (UTC, to the minute)."""
    if ts is None:
        return "—"
    try:
        return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, OSError, ValueError):
        return "invalid"


def link(href: str, text: object) -> str:
    """An <a> to a console path."""
    return f'<a href="{h(href)}">{h(text)}</a>'


def query(path: str, **params: object) -> str:
    """A console path with its query string (None values left out)."""
    kept = {k: v for k, v in params.items() if v is not None and v != ""}
    return f"{path}?{urlencode(kept)}" if kept else path


def page(title: str, body: str, *, csrf: str | None, flash: str = "", error: str = "") -> str:
    """A whole page: header and navigation (with the log-out button when logged in), then `body`."""
    nav = "".join(link(href, text) for href, text in (("/", "Overview"), ("/servers", "Servers"), ("/people", "People"),
                                                      ("/search", "Search"), ("/stats", "Stats"), ("/log", "Log")))
    logout = (f'<form class="inline" method="post" action="/logout">{csrf_field(csrf)}<button>Log out</button></form>'
              if csrf else "")
    notes = (f'<div class="flash">{h(flash)}</div>' if flash else "") + (f'<div class="error">{h(error)}</div>' if error else "")
    header = f'<header><span class="brand">Muninn console</span>{nav if csrf else ""}{logout}</header>'
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{h(title)} · Muninn</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="stylesheet" href="/style.css"></head><body>{header}<main>{notes}{body}</main></body></html>')


def csrf_field(token: str | None) -> str:
    """The hidden field every form that changes something carries."""
    return f'<input type="hidden" name="csrf" value="{h(token or "")}">'


def button(action: str, label: str, csrf: str, *, danger: bool = False, confirm: str = "") -> str:
    """A one-button form posting to `action` (a state change: it carries the CSRF token)."""
    kind = ' class="danger"' if danger else ""
    extra = f'<input type="hidden" name="confirm" value="{h(confirm)}">' if confirm else ""
    return (f'<form class="inline" method="post" action="{h(action)}">{csrf_field(csrf)}{extra}'
            f'<button{kind}>{h(label)}</button></form>')


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: Sequence[int] = ()) -> str:
    """A table of already-escaped cells; `numeric` columns right-aligned."""
    head = "".join(f'<th class="num">{h(t)}</th>' if i in numeric else f"<th>{h(t)}</th>" for i, t in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body or empty_row(len(headers))}</tbody></table>"


def empty_row(columns: int) -> str:
    """The row of a table with nothing in it."""
    return f'<tr><td colspan="{columns}" class="muted">nothing here</td></tr>'


def pager(path: str, offset: int, limit: int, total: int, **params: object) -> str:
    """Previous / next links and where this page is in the whole."""
    if total <= limit:
        return f'<div class="pager muted">{total} in all</div>'
    parts = [f"{offset + 1}–{min(offset + limit, total)} of {total}"]
    if offset > 0:
        parts.insert(0, link(query(path, offset=max(0, offset - limit), **params), "← newer"))
    if offset + limit < total:
        parts.append(link(query(path, offset=offset + limit, **params), "older →"))
    return f'<div class="pager">{" ".join(parts)}</div>'


def state_of(memory: Memory) -> str:
    """A memory's state as a tag: active (its scope), waiting for a moderator, or archived."""
    from bot.memory.records import PENDING_REASON
    if memory.archived_at is None:
        return f'<span class="tag {h(memory.scope)}">{h(memory.scope)}</span>'
    if memory.archive_reason == PENDING_REASON:
        return f'<span class="tag pending">{h(memory.scope)} · waiting</span>'
    return f'<span class="tag archived">{h(memory.scope)} · archived ({h(memory.archive_reason or "?")})</span>'


def where(memory: Memory) -> str:
    """Where a memory was learned, linked to the channel's page."""
    if memory.guild_id is not None and memory.channel_id is not None:
        return link(f"/channels/{memory.channel_id}", f"server {memory.guild_id} · #{memory.channel_id}")
    if memory.channel_id is not None:
        return f"DM {h(memory.channel_id)}"
    return '<span class="muted">command line / import</span>'


def person(user_id: int | None, names: dict[int, str] | None = None) -> str:
    """A person linked to their page, with the name they last used when known."""
    if user_id is None:
        return '<span class="muted">—</span>'
    name = (names or {}).get(user_id)
    return link(f"/people/{user_id}", f"{name} ({user_id})" if name else str(user_id))


def shorten(text: str, limit: int = 160) -> str:
    """At most `limit` characters of a memory's text, escaped."""
    return h(text if len(text) <= limit else text[: limit - 1] + "…")


def memory_rows(memories: Iterable[Memory]) -> list[list[str]]:
    """Rows of the memory tables: id, text, state, owner, where, learned."""
    return [[link(f"/memories/{m.id}", f"#{m.id}"), f'<span class="text">{shorten(m.text)}</span>', state_of(m),
             person(m.owner_id), where(m), h(when(m.created_at))] for m in memories]


MEMORY_HEADERS = ("id", "text", "state", "owner / teacher", "where", "learned")
