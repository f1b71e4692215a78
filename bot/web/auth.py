"""The console's door: a login token, sessions in a cookie, a CSRF token on every change.

Every route but the login page and the stylesheet needs a session; a page asked for without one
sends the browser to the login page, anything else gets 403. Every POST but the login itself
must carry its session's CSRF token; the login form carries one of its own (a cookie and a field
that must match), so another site cannot log a browser in either. Wrong tokens are throttled.
Sessions live in the process: restarting the console logs everyone out.
"""
from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable
from urllib.parse import quote

from aiohttp import web

from bot.web.html import h, page

COOKIE = "muninn_console"
LOGIN_COOKIE = "muninn_login"
SESSION_S = 12 * 3600          # a session unused this long ends
FAILURES_ALLOWED = 5           # wrong tokens in FAILURE_WINDOW_S before the login pauses
FAILURE_WINDOW_S = 60.0
PUBLIC = {("GET", "/login"), ("POST", "/login"), ("GET", "/style.css"), ("GET", "/favicon.ico")}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Session:
    """A logged-in browser: its CSRF token and when it was last used."""
    csrf: str
    seen: float


@dataclass
class Door:
    """The login token and the sessions it opened."""
    token: str
    sessions: dict[str, Session] = field(default_factory=dict)
    failures: list[float] = field(default_factory=list)

    def open(self, now: float | None = None) -> tuple[str, Session]:
        """A new session: its cookie value and its state."""
        sid = secrets.token_urlsafe(32)
        session = self.sessions[sid] = Session(secrets.token_urlsafe(32), time.time() if now is None else now)
        return sid, session

    def session(self, request: web.Request, now: float | None = None) -> Session | None:
        """The request's session when it has a live one (its use extends it)."""
        now = time.time() if now is None else now
        sid = request.cookies.get(COOKIE, "")
        found = self.sessions.get(sid)
        if found is None:
            return None
        if now - found.seen > SESSION_S:
            del self.sessions[sid]
            return None
        found.seen = now
        return found

    def close(self, request: web.Request) -> None:
        """End the request's session."""
        self.sessions.pop(request.cookies.get(COOKIE, ""), None)

    def throttled(self, now: float) -> bool:
        """Too many wrong tokens lately: the login waits."""
        self.failures = [t for t in self.failures if now - t < FAILURE_WINDOW_S]
        return len(self.failures) >= FAILURES_ALLOWED

    def check(self, given: str, now: float) -> bool:
        """Whether `given` is the token (compared in constant time); a wrong one is counted."""
        if hmac.compare_digest(given.encode(), self.token.encode()):
            return True
        self.failures.append(now)
        return False


DOOR = web.AppKey("door", Door)
CHANGES = web.AppKey("changes", bool)


def csrf_of(request: web.Request) -> str:
    """The CSRF token of the request's session (the guard let it through: it has one)."""
    session = request.app[DOOR].session(request)
    assert session is not None, "only routes behind the guard render forms"
    return session.csrf


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a path of this console only (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def login_page(error: str = "", target: str = "/", nonce: str = "") -> str:
    """The login form (its own CSRF field, matched against its cookie)."""
    body = (f'<form class="login" method="post" action="/login"><h1>Log in</h1>'
            f'<p class="muted">Paste the console token: <code>muninn web</code> printed it at start, or it is '
            f'<code>MUNINN_WEB_TOKEN</code> in <code>.env</code>.</p>'
            f'<input type="hidden" name="login" value="{h(nonce)}"><input type="hidden" name="next" value="{h(target)}">'
            f'<label>Token<input type="password" name="token" autocomplete="current-password" autofocus></label>'
            f'<button>Log in</button></form>')
    return page("Log in", body, csrf=None, error=error)


def login_form(request: web.Request, error: str = "", status: int = 200) -> web.Response:
    """GET /login: the form, with its login nonce in a cookie (kept while the browser has one: a
    second tab, or the browser's own requests sent here, must not expire the form already open)."""
    nonce = request.cookies.get(LOGIN_COOKIE, "")
    if len(nonce) < 32 or not nonce.replace("-", "").replace("_", "").isalnum():
        nonce = secrets.token_urlsafe(24)
    response = web.Response(text=login_page(error, safe_next(request.query.get("next")), nonce),
                            content_type="text/html", status=status)
    response.set_cookie(LOGIN_COOKIE, nonce, httponly=True, samesite="Strict", path="/login")
    return response


async def show_login(request: web.Request) -> web.Response:
    """GET /login."""
    return login_form(request)


async def login(request: web.Request) -> web.StreamResponse:
    """POST /login: a right token (and matching login nonce) opens a session."""
    door = request.app[DOOR]
    form = await request.post()
    now = time.time()
    nonce = str(form.get("login", ""))
    if not nonce or not hmac.compare_digest(nonce.encode(), request.cookies.get(LOGIN_COOKIE, "").encode()):
        return login_form(request, "The login form expired; try again.", status=403)
    if door.throttled(now):
        return login_form(request, "Too many wrong tokens; wait a minute and try again.", status=429)
    if not door.check(str(form.get("token", "")), now):
        return login_form(request, "That is not the console token.", status=403)
    sid, _ = door.open(now)
    response = web.HTTPSeeOther(safe_next(str(form.get("next", "/"))))
    response.set_cookie(COOKIE, sid, httponly=True, samesite="Strict", path="/", max_age=SESSION_S)
    response.del_cookie(LOGIN_COOKIE, path="/login")
    raise response


async def logout(request: web.Request) -> web.StreamResponse:
    """POST /logout: the session ends."""
    request.app[DOOR].close(request)
    response = web.HTTPSeeOther("/login")
    response.del_cookie(COOKIE, path="/")
    raise response


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every request: a session for all but the public routes, the CSRF token on every change,
    and the security headers on every answer (errors included)."""
    try:
        response = await _guarded(request, handler)
    except web.HTTPException as exc:
        exc.headers.update(HEADERS)
        raise
    response.headers.update(HEADERS)
    return response


async def _guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    if (request.method, request.path) in PUBLIC:
        return await handler(request)
    door = request.app[DOOR]
    session = door.session(request)
    if session is None:
        if request.method in ("GET", "HEAD"):
            raise web.HTTPSeeOther(f"/login?next={quote(request.path_qs, safe='')}")
        raise web.HTTPForbidden(text="log in first")
    if request.method not in ("GET", "HEAD"):
        form = await request.post()
        if not hmac.compare_digest(str(form.get("csrf", "")).encode(), session.csrf.encode()):
            raise web.HTTPForbidden(text="missing or wrong CSRF token: reload the page and try again")
    return await handler(request)
