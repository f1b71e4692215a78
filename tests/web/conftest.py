"""The console over a real engine with a few memories of every kind, and an HTTP client for it."""
from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bot.memory.engine import Engine
from bot.memory.records import PENDING, SET, NewMemory
from bot.web.app import create_app

TOKEN = "console-token-for-tests-0123456789"
GUILD, GENERAL = 500, 501
ALICE, BOB = 111, 222


@dataclass
class World:
    """What the seeded database holds, by name."""
    engine: Engine
    room: int
    pending: int
    alice: int
    bob: int
    archived: int
    hostile: int


async def seed(engine: Engine) -> World:
    """Room memories (one set, one waiting), personal ones, an archived one, a link, and a text
    that would run script if it were not escaped."""
    room = await engine.remember(NewMemory("Game night is every Friday at 8 pm", "room", owner_id=ALICE,
                                           channel_id=GENERAL, guild_id=GUILD, standing=SET))
    pending = await engine.remember(NewMemory("The channel password is swordfish", "room", owner_id=BOB,
                                              channel_id=GENERAL, guild_id=GUILD, standing=PENDING))
    alice = await engine.remember(NewMemory("Alice plays the cello", "personal", owner_id=ALICE,
                                            channel_id=GENERAL, guild_id=GUILD))
    bob = await engine.remember(NewMemory("Bob is learning Rust", "personal", owner_id=BOB))
    archived = await engine.remember(NewMemory("Alice once lived in Oslo", "personal", owner_id=ALICE))
    hostile = await engine.remember(NewMemory('<script>alert("x")</script> & "quotes"', "personal", owner_id=BOB))
    await engine.archive(archived, "decayed")
    await engine.write(lambda conn: engine.storage.add_link(conn, alice, room, "co_extracted"))
    return World(engine, room, pending, alice, bob, archived, hostile)


@pytest.fixture
async def world(fake_ollama, make_settings):
    """A seeded engine whose Ollama is the fake."""
    async with Engine(make_settings(fake_ollama.url)) as engine:
        yield await seed(engine)


async def _client(world: World, changes: bool):
    client = TestClient(TestServer(create_app(world.engine, token=TOKEN, changes=changes)))
    await client.start_server()
    return client


@pytest.fixture
async def anonymous(world):
    """A client that has not logged in (console with changes allowed)."""
    client = await _client(world, True)
    yield client
    await client.close()


async def log_in(client: TestClient, token: str = TOKEN) -> str:
    """Log `client` in; returns the CSRF token of its session (from a page's form)."""
    form = await client.get("/login")
    nonce = re.search(r'name="login" value="([^"]+)"', await form.text())
    assert nonce, "the login form has its nonce"
    answer = await client.post("/login", data={"login": nonce.group(1), "token": token, "next": "/"})
    assert answer.status == 200, await answer.text()
    page = await client.get("/")
    found = re.search(r'name="csrf" value="([^"]+)"', await page.text())
    assert found, "a logged-in page carries the CSRF token"
    return found.group(1)


@pytest.fixture
async def operator(world):
    """A logged-in client (changes allowed) and its CSRF token."""
    client = await _client(world, True)
    csrf = await log_in(client)
    yield client, csrf
    await client.close()


@pytest.fixture
async def reader(world):
    """A logged-in client of a read-only console, and its CSRF token."""
    client = await _client(world, False)
    csrf = await log_in(client)
    yield client, csrf
    await client.close()
