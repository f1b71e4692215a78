"""The console's pages: overview, servers and channels, people, a memory, search as a viewer, stats, log.

Each handler reads through `engine.console` (or the engine's recall, for search) and renders
with bot/web/html.py; nothing here writes. Numbers in paths and query strings are checked and a
bad one is a 400 with one line, never a traceback.
"""
from __future__ import annotations

import time

from aiohttp import web

from bot.memory import decay
from bot.memory.console import STATES, Filter
from bot.memory.engine import Engine
from bot.memory.records import PENDING_REASON, MemoryNotFound
from bot.memory.scope import Viewer
from bot.web import charts, live
from bot.web.auth import CHANGES, csrf_of
from bot.web.html import (
    MEMORY_HEADERS,
    STYLE,
    button,
    h,
    link,
    memory_rows,
    page,
    pager,
    person,
    query,
    shorten,
    state_of,
    table,
    when,
    where,
)

PAGE = 50
CURVE_DAYS = 60


ENGINE = web.AppKey("engine", Engine)


def engine_of(request: web.Request) -> Engine:
    """The engine the console reads."""
    return request.app[ENGINE]


def csrf(request: web.Request) -> str:
    """The session's CSRF token, for the forms of the page."""
    return csrf_of(request)


def changes(request: web.Request) -> bool:
    """Whether the operator enabled the console's actions."""
    return request.app[CHANGES]


def number(request: web.Request, name: str, *, default: int | None = None, source: str = "query") -> int | None:
    """A whole number from the path or query string; HTTPBadRequest names a bad one."""
    raw = request.match_info.get(name) if source == "path" else request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be a whole number, not {raw[:40]!r}") from None
    if value < 0 or value >= 2**63:
        raise web.HTTPBadRequest(text=f"{name} is out of range")
    return value


def listing(request: web.Request) -> tuple[int, str, int]:
    """A listing page's id (from the path), state tab and offset; HTTPBadRequest names a bad one."""
    found = number(request, "id", source="path")
    assert found is not None, "the route has an {id}"
    state = request.query.get("state", "active")
    if state not in STATES:
        raise web.HTTPBadRequest(text=f"state must be one of {', '.join(STATES)}")
    return found, state, number(request, "offset", default=0) or 0


def render(request: web.Request, title: str, body: str) -> web.Response:
    """A page as the response, with the flash message the last action left in the query string."""
    return web.Response(text=page(title, body, csrf=csrf(request), flash=request.query.get("done", "")[:200],
                                  error=request.query.get("failed", "")[:200]), content_type="text/html")


async def style(request: web.Request) -> web.Response:
    """GET /style.css."""
    return web.Response(text=STYLE, content_type="text/css", headers={"Cache-Control": "max-age=3600"})


async def favicon(request: web.Request) -> web.Response:
    """GET /favicon.ico: nothing (browsers ask for it on every site)."""
    return web.Response(status=204)


async def overview(request: web.Request) -> web.Response:
    """GET /: counts, and what is waiting for a moderator."""
    engine = engine_of(request)
    stats = await engine.console.overview(days=14)
    c = stats.counts
    cards = "".join(f'<div class="card"><b>{c.get(k, 0)}</b>{h(label)}</div>' for k, label in (
        ("room", "room memories"), ("personal", "personal memories"), ("global", "global memories"),
        ("pending", "waiting for a moderator"), ("archived", "archived"), ("all", "in all")))
    waiting, total = await engine.console.memories(Filter(state="pending"), limit=10)
    acting = "on: forget, restore, approve, reject, user export and forget" if changes(request) else \
        "off (read-only; start with --allow-changes to act)"
    body = (f"<h1>Overview</h1><div class='cards'>{cards}</div><p class='muted'>Changes: {h(acting)}. "
            f"Storage: {h(engine.storage.where())}.</p>"
            f"<h2>Waiting for a moderator ({total})</h2>{table(MEMORY_HEADERS, memory_rows(waiting))}"
            f"<h2>Learned in the last 14 days</h2>"
            f"{charts.stacked_bars(stats.timeline.created, stats.timeline.first_day, title='memories learned per day')}")
    return render(request, "Overview", body)


async def servers(request: web.Request) -> web.Response:
    """GET /servers: every server and channel that holds memories, DMs after them."""
    places = await engine_of(request).console.places()
    rows = []
    for p in places:
        server = h(p.guild_id) if p.guild_id is not None else '<span class="muted">DM / terminal / import</span>'
        channel = (link(f"/channels/{p.channel_id}", f"#{p.channel_id}") if p.channel_id is not None
                   else '<span class="muted">none</span>')
        rows.append([server, channel, str(p.room), str(p.personal), str(p.pending), str(p.archived)])
    body = ("<h1>Servers and channels</h1><p class='muted'>Discord does not tell Muninn's database the names of "
            "servers and channels; ids are shown.</p>"
            + table(("server", "channel", "room", "personal", "waiting", "archived"), rows, numeric=(2, 3, 4, 5)))
    return render(request, "Servers", body)


async def channel(request: web.Request) -> web.Response:
    """GET /channels/{id}: the channel's room memories, claims waiting, and personal memories learned there."""
    channel_id, state, offset = listing(request)
    engine = engine_of(request)
    waiting, _ = await engine.console.memories(Filter(channel_id=channel_id, scope="room", state="pending"), limit=PAGE)
    memories, total = await engine.console.memories(Filter(channel_id=channel_id, state=state), limit=PAGE, offset=offset)
    tabs = " · ".join(link(query(f"/channels/{channel_id}", state=s), s) if s != state else f"<b>{h(s)}</b>" for s in STATES)
    actions = ""
    if changes(request) and waiting:
        actions = table(("id", "claim", "taught by", "decide"), [
            [link(f"/memories/{m.id}", f"#{m.id}"), shorten(m.text), person(m.owner_id),
             button(f"/memories/{m.id}/approve", "Approve", csrf(request)) + " "
             + button(f"/memories/{m.id}/reject", "Reject", csrf(request), danger=True)] for m in waiting])
    body = (f"<h1>Channel #{h(channel_id)}</h1>{actions and '<h2>Waiting for a moderator</h2>' + actions}"
            f"<h2>Memories learned here</h2><p>{tabs}</p>{table(MEMORY_HEADERS, memory_rows(memories))}"
            f"{pager(f'/channels/{channel_id}', offset, PAGE, total, state=state)}")
    return render(request, f"#{channel_id}", body)


async def people(request: web.Request) -> web.Response:
    """GET /people: the people memories belong to, most first; a form to open anyone by id."""
    offset = number(request, "offset", default=0) or 0
    found, total = await engine_of(request).console.people(limit=PAGE, offset=offset)
    rows = [[person(p.user_id, {p.user_id: p.name} if p.name else None), str(p.personal), str(p.room)] for p in found]
    body = ("<h1>People</h1><form method='get' action='/people/open'><input name='id' placeholder='user id' "
            "inputmode='numeric'> <button>Open</button></form><br>"
            + table(("person", "personal", "room (taught)"), rows, numeric=(1, 2))
            + pager("/people", offset, PAGE, total))
    return render(request, "People", body)


async def open_person(request: web.Request) -> web.Response:
    """GET /people/open?id=N: the person's page."""
    user_id = number(request, "id")
    if user_id is None:
        raise web.HTTPBadRequest(text="give a user id")
    raise web.HTTPSeeOther(f"/people/{user_id}")


async def person_page(request: web.Request) -> web.Response:
    """GET /people/{id}: a person's memories (owned or taught), with export and forget-all."""
    user_id, state, offset = listing(request)
    engine = engine_of(request)
    who = await engine.console.person(user_id)
    memories, total = await engine.console.memories(Filter(owner_id=user_id, state=state), limit=PAGE, offset=offset)
    tabs = " · ".join(link(query(f"/people/{user_id}", state=s), s) if s != state else f"<b>{h(s)}</b>" for s in STATES)
    actions = ""
    if changes(request):
        actions = ("<p>" + button(f"/people/{user_id}/export", "Export their data (JSON)", csrf(request)) + " "
                   + button(f"/people/{user_id}/forget", "Forget everything about them", csrf(request), danger=True,
                            confirm="yes") + "</p>")
    name = f"{who.name} ({user_id})" if who.name else str(user_id)
    body = (f"<h1>{h(name)}</h1><p>{who.personal} personal memories, {who.room} room memories taught.</p>{actions}"
            f"<p>{tabs}</p>{table(MEMORY_HEADERS, memory_rows(memories))}"
            f"{pager(f'/people/{user_id}', offset, PAGE, total, state=state)}")
    return render(request, name, body)


async def memory_page(request: web.Request) -> web.Response:
    """GET /memories/{id}: text, provenance, links drawn as a graph, retention curve, actions."""
    memory_id = number(request, "id", source="path")
    assert memory_id is not None
    try:
        p = await engine_of(request).console.provenance(memory_id)
    except MemoryNotFound:
        raise web.HTTPNotFound(text=f"no memory #{memory_id} (forgotten, or never stored)") from None
    m = p.memory
    now = time.time()
    facts = [("state", state_of(m)), ("owner / first teacher", person(m.owner_id, p.names)), ("where", where(m)),
             ("learned", h(when(m.created_at))), ("updated", h(when(m.updated_at))),
             ("recalled", f"{m.access_count} times, last {h(when(m.last_accessed))}"),
             ("importance", f"{m.importance:.2f}"), ("stability", f"{m.stability:.1f} days"),
             ("retention now", f"{m.retention(now):.2f}"), ("embedded", "yes" if m.embedded else "not yet")]
    if m.archived_at is not None:
        facts.append(("archived", f"{h(when(m.archived_at))} ({h(m.archive_reason)})"))
    if p.teachers:
        facts.append(("taught by", ", ".join(f"{person(t, p.names)} ({h(when(at))})" for t, at in p.teachers)))
    if p.mentions:
        facts.append(("names", ", ".join(person(u, p.names) for u in p.mentions)))
    if p.approval:
        how, moderator, at = p.approval
        by = "the operator" if moderator == 0 else person(moderator, p.names)
        facts.append(("vouched", f"{h(how)} by {by} on {h(when(at))}"))
    if m.external_id:
        facts.append(("imported as", h(m.external_id)))
    sources = table(("message", "author", "said", "when"), [
        [h(s.message_id), person(s.author_id, p.names) if s.author_id else '<span class="muted">not in the history</span>',
         f'<span class="text">{shorten(s.content or "")}</span>', h(when(s.created_at))] for s in p.sources])
    graph = charts.link_graph(m.id, [(link_.other_id, link_.kind, link_.outgoing,
                                      p.others[link_.other_id].text if link_.other_id in p.others else "")
                                     for link_ in p.links])
    versions = [link_ for link_ in p.links if link_.kind == "superseded_by"]
    version_rows = [[link(f"/memories/{v.other_id}", f"#{v.other_id}"),
                     "replaced this" if v.outgoing else "was replaced by this",
                     shorten(p.others[v.other_id].text) if v.other_id in p.others else "", h(when(v.created_at))]
                    for v in versions]
    base = m.last_accessed or m.created_at
    span = max(CURVE_DAYS, (now - base) / 86400 * 1.5)
    points = [(d, decay.retention(base + d * 86400, base, m.stability)) for d in
              (span * i / 60 for i in range(61))]
    actions = ""
    if changes(request):
        actions = "<p>" + button(f"/memories/{m.id}/forget", "Forget", csrf(request), danger=True)
        if m.archived_at is not None and m.archive_reason != PENDING_REASON:
            actions += " " + button(f"/memories/{m.id}/restore", "Restore", csrf(request))
        if m.archive_reason == PENDING_REASON and m.archived_at is not None:
            actions += (" " + button(f"/memories/{m.id}/approve", "Approve", csrf(request)) + " "
                        + button(f"/memories/{m.id}/reject", "Reject", csrf(request), danger=True))
        actions += "</p>"
    body = (f"<h1>Memory #{m.id}</h1><p class='text'>{h(m.text)}</p>{actions}"
            f"<dl>{''.join(f'<dt>{h(k)}</dt><dd>{v}</dd>' for k, v in facts)}</dl>"
            f"<h2>Learned from</h2>{sources}<h2>Links</h2>{graph}"
            + (f"<h2>Versions</h2>{table(('memory', 'relation', 'text', 'when'), version_rows)}" if versions else "")
            + "<h2>Retention</h2>"
            + charts.curve(points, title="retention over time", x_label="days since last recalled",
                           mark=(now - base) / 86400))
    return render(request, f"#{m.id}", body)


async def search(request: web.Request) -> web.Response:
    """GET /search: what recall finds for a text, as a chosen viewer would (nothing is touched), and why."""
    text = request.query.get("q", "").strip()[:2000]
    user_id = number(request, "user")
    channel_id = number(request, "channel")
    guild_id = number(request, "guild")
    form = (f"<form method='get' action='/search'><input name='q' value='{h(text)}' placeholder='what to recall' size='40'> "
            f"as user <input name='user' value='{h(user_id or '')}' placeholder='user id' size='20' inputmode='numeric'> "
            f"in channel <input name='channel' value='{h(channel_id or '')}' placeholder='empty: a DM' size='20'> "
            f"of server <input name='guild' value='{h(guild_id or '')}' placeholder='server id' size='20'> "
            "<button>Recall</button></form>")
    results = ""
    if text and user_id is None:
        results = "<p class='error'>Give the user id of the viewer: recall shows what that person would be shown.</p>"
    elif text and user_id is not None:
        if (channel_id is None) != (guild_id is None):
            raise web.HTTPBadRequest(text="give both the channel and its server, or neither (a DM)")
        viewer = Viewer(user_id, channel_id, guild_id, dm=channel_id is None)
        result = await engine_of(request).recall(text, viewer, touch=False)
        rows = []
        for rank, r in enumerate(result.memories, 1):
            c = r.candidate
            via = (f"link {h(c.link.get('kind'))} from #{h(c.link.get('from'))}" if c.link else
                   f"next to #{c.neighbour_of}" if c.neighbour_of else "")
            rows.append([str(rank), link(f"/memories/{r.memory.id}", f"#{r.memory.id}"),
                         f'<span class="text">{shorten(r.memory.text)}</span>', state_of(r.memory),
                         "—" if c.fts_rank is None else f"{c.fts_rank} ({c.fts_score:.2f})",
                         "—" if c.vector_rank is None else str(c.vector_rank),
                         "—" if c.similarity is None else f"{c.similarity:.3f}", f"{c.fused:.4f}", via])
        timing = ", ".join(f"{k} {v:.1f} ms" for k, v in result.timings_ms.items())
        results = (f"<p>Mode <b>{h(result.mode)}</b>, vectors {h(result.vector_status)}. {h(timing)}</p>"
                   + table(("#", "memory", "text", "scope", "keyword rank (bm25)", "vector rank", "cosine", "fused", "via"),
                           rows, numeric=(0, 5, 6, 7)))
    body = f"<h1>Search as a viewer</h1>{form}{results}"
    return render(request, "Search", body)


async def stats(request: web.Request) -> web.Response:
    """GET /stats: memories by scope and over time, archived by decay, the console's last actions."""
    days = min(number(request, "days", default=60) or 60, 366)
    s = await engine_of(request).console.stats(days=days)
    by_scope = table(("kind", "memories"), [[h(k), str(v)] for k, v in s.counts.items()], numeric=(1,))
    archived = table(("reason", "archived"), [[h(k), str(v)] for k, v in s.archived.items()], numeric=(1,))
    body = (f"<h1>Stats</h1><h2>Memories by kind</h2>{by_scope}"
            f"<h2>Learned per day (last {days} days)</h2>"
            f"{charts.stacked_bars(s.timeline.created, s.timeline.first_day, title='memories learned per day')}"
            f"<h2>Archived per day</h2>"
            f"{charts.stacked_bars(s.timeline.archived, s.timeline.first_day, title='memories archived per day')}"
            f"<h2>Archived, by reason</h2>{archived}"
            f"<h2>The running bot</h2>{await _live(engine_of(request))}")
    return render(request, "Stats", body)


async def _live(engine: Engine) -> str:
    """Recall latency and modes, answers and extraction, from the bot's own /metrics."""
    url = live.metrics_url(engine.settings)
    if url is None:
        return ("<p class='muted'>Recall latency, recall modes and extraction outcomes come from the running bot: "
                "set MUNINN_METRICS_PORT for it (docs/deployment.md) and they show here.</p>")
    found = await live.read(url)
    if isinstance(found, str):
        return f"<p class='error'>{h(found)}</p>"

    def counts(title: str, values: dict[str, int]) -> str:
        return table((title, "count"), [[h(k), str(v)] for k, v in sorted(values.items())], numeric=(1,))
    return (charts.histogram(found.recall_buckets, title="recall latency (recalls per bucket)")
            + counts("recall mode / vector status", found.recalls)
            + charts.histogram(found.reply_buckets, title="reply latency (replies per bucket)")
            + counts("answered", found.answered) + counts("skipped", found.skipped)
            + counts("extraction", {**found.extraction, "waiting now": found.waiting}))


async def log_page(request: web.Request) -> web.Response:
    """GET /log: what the console did, newest first (never a memory's text)."""
    entries = await engine_of(request).console.log(100)
    rows = [[h(when(e.at)), h(e.action), link(f"/memories/{e.memory_id}", f"#{e.memory_id}") if e.memory_id else "",
             person(e.user_id) if e.user_id else ""] for e in entries]
    return render(request, "Log", "<h1>Console log</h1>" + table(("when", "action", "memory", "person"), rows))
