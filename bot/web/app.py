"""The console's aiohttp application: its routes, its door, and serving it.

`create_app` wires the pages (bot/web/pages.py) and actions (bot/web/actions.py) behind the
guard (bot/web/auth.py); `serve` runs it until cancelled. Binding anywhere but the loopback
interface is the operator's explicit choice (the console shows everything Muninn keeps).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from aiohttp import web

from bot.memory.engine import Engine
from bot.web import actions, auth, pages
from bot.web.html import h, page

log = logging.getLogger(__name__)


@web.middleware
async def error_pages(request: web.Request, handler: auth.Handler) -> web.StreamResponse:
    """A page asked for by a browser that fails (a bad number, a memory gone) is shown as a page
    of the console saying why in one line, with its navigation, under the same status."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if request.method != "GET" or exc.status < 400 or request.path in ("/login", "/style.css"):
            raise
        session = request.app[auth.DOOR].session(request)
        text = page(exc.reason, f"<h1>{h(exc.reason)}</h1>", csrf=session.csrf if session else None,
                    error=exc.text or exc.reason)
        return web.Response(text=text, status=exc.status, content_type="text/html")


def create_app(engine: Engine, *, token: str, changes: bool = False) -> web.Application:
    """The console over `engine`: log in with `token`; `changes` enables the actions."""
    if len(token) < 16:
        raise ValueError("the console token must be at least 16 characters")
    app = web.Application(middlewares=[auth.guard, error_pages], client_max_size=64 * 1024)
    app[pages.ENGINE] = engine
    app[auth.DOOR] = auth.Door(token)
    app[auth.CHANGES] = changes
    app.router.add_get("/login", auth.show_login)
    app.router.add_post("/login", auth.login)
    app.router.add_post("/logout", auth.logout)
    app.router.add_get("/style.css", pages.style)
    app.router.add_get("/favicon.ico", pages.favicon)
    app.router.add_get("/", pages.overview)
    app.router.add_get("/servers", pages.servers)
    app.router.add_get("/channels/{id}", pages.channel)
    app.router.add_get("/people", pages.people)
    app.router.add_get("/people/open", pages.open_person)
    app.router.add_get("/people/{id}", pages.person_page)
    app.router.add_post("/people/{id}/export", actions.export_person)
    app.router.add_post("/people/{id}/forget", actions.forget_person)
    app.router.add_get("/memories/{id}", pages.memory_page)
    app.router.add_post("/memories/{id}/{action}", actions.memory_action)
    app.router.add_get("/search", pages.search)
    app.router.add_get("/stats", pages.stats)
    app.router.add_get("/log", pages.log_page)
    return app


async def serve(engine: Engine, *, host: str, port: int, token: str, changes: bool,
                ready: Callable[[str], Awaitable[None] | None] | None = None) -> None:
    """Serve the console until cancelled; `ready` gets its address once it listens."""
    runner = web.AppRunner(create_app(engine, token=token, changes=changes), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0] if runner.addresses else (host, port)
        address = f"http://{'[' + bound[0] + ']' if ':' in str(bound[0]) else bound[0]}:{bound[1]}/"
        if ready is not None:
            waited = ready(address)
            if waited is not None:
                await waited
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
