"""The console's door: no route without a login, no change without the CSRF token, safe redirects."""
from __future__ import annotations

import re

import pytest

from bot.web import auth
from tests.web.conftest import TOKEN, log_in

pytestmark = pytest.mark.usefixtures("backend")


def concrete(path: str) -> str:
    """A route's path with its placeholders filled: {id} a number, {action} a real action."""
    return path.replace("{id}", "1").replace("{action}", "forget")


async def test_every_route_refuses_without_a_login(anonymous, world):
    routes = [(r.method, r.resource.canonical) for r in anonymous.app.router.routes() if r.method != "HEAD"]
    assert len(routes) >= 15
    for method, path in routes:
        if (method, path) in auth.PUBLIC:
            continue
        answer = await anonymous.request(method, concrete(path), allow_redirects=False)
        if method == "GET":
            assert answer.status == 303, (method, path)
            assert answer.headers["Location"].startswith("/login?next="), (method, path)
        else:
            assert answer.status == 403, (method, path)
        text = await answer.text()
        assert "Game night" not in text and "cello" not in text
    assert (await world.engine.get(world.room)).text  # nothing was forgotten on the way


async def test_a_wrong_token_opens_nothing_and_too_many_pause_the_login(anonymous):
    for _ in range(auth.FAILURES_ALLOWED):
        form = await anonymous.get("/login")
        nonce = re.search(r'name="login" value="([^"]+)"', await form.text()).group(1)
        answer = await anonymous.post("/login", data={"login": nonce, "token": "not-the-token-at-all"})
        assert answer.status == 403
        assert "not the console token" in await answer.text()
    form = await anonymous.get("/login")
    nonce = re.search(r'name="login" value="([^"]+)"', await form.text()).group(1)
    answer = await anonymous.post("/login", data={"login": nonce, "token": TOKEN})
    assert answer.status == 429, "even the right token waits once the login is throttled"
    assert (await anonymous.get("/", allow_redirects=False)).status == 303


async def test_the_login_needs_its_own_form(anonymous):
    answer = await anonymous.post("/login", data={"token": TOKEN}, allow_redirects=False)
    assert answer.status == 403, "a login posted from elsewhere (no nonce) is refused"
    assert "expired" in await answer.text()


async def test_changes_need_the_sessions_csrf_token(operator, world):
    client, csrf = operator
    for data in ({}, {"csrf": "forged"}, {"csrf": csrf[:-1]}):
        answer = await client.post(f"/memories/{world.alice}/forget", data=data, allow_redirects=False)
        assert answer.status == 403
    assert (await world.engine.get(world.alice)).text == "Alice plays the cello"
    answer = await client.post(f"/memories/{world.alice}/forget", data={"csrf": csrf}, allow_redirects=False)
    assert answer.status == 303


async def test_log_out_ends_the_session(operator):
    client, csrf = operator
    assert (await client.post("/logout", data={"csrf": csrf}, allow_redirects=False)).status == 303
    assert (await client.get("/", allow_redirects=False)).status == 303


async def test_a_login_returns_to_the_page_asked_for_and_never_elsewhere(anonymous):
    answer = await anonymous.get("/people?offset=0", allow_redirects=False)
    target = answer.headers["Location"].split("next=", 1)[1]
    form = await anonymous.get(f"/login?next={target}")
    nonce = re.search(r'name="login" value="([^"]+)"', await form.text()).group(1)
    answer = await anonymous.post("/login", data={"login": nonce, "token": TOKEN, "next": "/people?offset=0"},
                                  allow_redirects=False)
    assert answer.headers["Location"] == "/people?offset=0"
    for hostile in ("//evil.example/", "https://evil.example/", "/\\evil", "", None):
        assert auth.safe_next(hostile) == "/"


async def test_every_answer_forbids_framing_scripts_and_caching(operator, anonymous):
    client, _ = operator
    for answer in (await client.get("/"), await anonymous.get("/login"), await client.get("/memories/999999")):
        assert "script-src" not in answer.headers["Content-Security-Policy"]
        assert "default-src 'none'" in answer.headers["Content-Security-Policy"]
        assert answer.headers["X-Frame-Options"] == "DENY"
        assert answer.headers["Cache-Control"] == "no-store"


async def test_a_short_token_is_refused_at_start(world):
    from bot.web.app import create_app
    with pytest.raises(ValueError, match="16 characters"):
        create_app(world.engine, token="short")


async def test_log_in_helper_works_with_the_token(anonymous):
    assert await log_in(anonymous)
